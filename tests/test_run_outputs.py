"""Issue 12, Records and Conventions: outputs written atomically and locked against a second writer, a corrupt store
moved aside, each reply stored once, results on stdout and progress on stderr (--json for machines), the record and
the cache under the XDG folders, click's usage errors as one line."""

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from loopback.fakes import FakeEnvironment, cuda_reply, fenced, full_tl, make_store, sketch_tl

from flashgen import paths
from flashgen.agent import outputs
from flashgen.agent.loop import LoopConfig, run_loop
from flashgen.agent.outputs import FILES, out_lock, write_outputs
from flashgen.agent.providers import ScriptedProvider, Task
from flashgen.harness.store import Store
from flashgen.targets import get_target
from flashgen.variant import DType, Variant

TASK = Task(variant=Variant(causal=True), target="a100", arch="sm_80", dtype=DType.fp16, head_dim=64)
SKETCH, FULL = fenced("tl", sketch_tl()), fenced("tl", full_tl())


def cli(*args, home, cwd=None, env_extra=None, timeout=180):
    env = {**os.environ, "FLASHGEN_HOME": str(home), **(env_extra or {})}
    if home is None:
        env.pop("FLASHGEN_HOME")
    return subprocess.run([sys.executable, "-m", "flashgen", *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=cwd or Path(home).parent)


def lines(text):
    return [line for line in text.splitlines() if line.strip()]


def finished_run(tmp_path, replies=None):
    return run_loop(LoopConfig(task=TASK), ScriptedProvider(replies or [SKETCH, FULL, cuda_reply()]),
                    env=FakeEnvironment(), store=make_store(tmp_path))


# ------------------------------------------------------------------------------------------------ outputs


def test_outputs_replace_the_folder_atomically(tmp_path, monkeypatch):
    result = finished_run(tmp_path)
    out = tmp_path / "k"
    out.mkdir()
    for name in FILES:
        (out / name).write_text(f"old {name}\n")
    calls = []

    def failing_fsync(fd):
        calls.append(fd)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(outputs.os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="No space left"):
        write_outputs(result, TASK, get_target("a100"), FakeEnvironment(), out)
    # nothing of the new outputs is visible, nothing of the old is lost, no temporary folder is left
    assert {p.name: p.read_text() for p in out.iterdir()} == {name: f"old {name}\n" for name in FILES}
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".k")) == []
    monkeypatch.undo()
    written = write_outputs(result, TASK, get_target("a100"), FakeEnvironment(), out).written
    assert sorted(written) == sorted(FILES) and "old" not in (out / "kernel.cu").read_text()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".k")) == []


def test_outputs_beside_other_files_keep_them_and_drop_stale_ones(tmp_path):
    out = tmp_path / "k"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    (out / "kernel.cu").write_text("// an older run's kernel\n")
    failed = finished_run(tmp_path, [SKETCH, "no code"] * 3)  # no kernel: only sketch, meta, report
    assert failed.best is None
    write_outputs(failed, TASK, get_target("a100"), FakeEnvironment(), out)
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "notes.txt", "report.md", "sketch.tl"]


def test_a_second_writer_to_the_same_out_is_refused_in_one_line(tmp_path):
    out = tmp_path / "k"
    with out_lock(out):
        done = cli("generate", "--gpu", "a100", "--head-dim", "64", "--out", str(out), home=tmp_path / "home")
        with pytest.raises(Exception, match="another flashgen run"):
            with out_lock(out):
                pass
    assert done.returncode == 2, done.stderr
    assert lines(done.stderr) == [f"error: --out {out}: another flashgen run (pid {os.getpid()}) is writing this "
                                  "folder; wait for it to finish or choose another --out"]
    assert not out.exists() and not list(tmp_path.glob(".k.*"))  # released and removed
    with out_lock(out):  # free again
        pass


# ------------------------------------------------------------------------------------------------ the store


def test_a_corrupt_store_is_moved_aside_and_a_new_one_started(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    garbage = b"this is not a database\n" * 100
    (home / "flashgen.sqlite").write_bytes(garbage)
    (home / "artifacts" / "1" / "0001-candidate").mkdir(parents=True)
    (home / "artifacts" / "1" / "0001-candidate" / "kernel.cu").write_text("// old\n")
    done = cli("runs", "list", "--json", home=home)
    assert done.returncode == 0 and json.loads(done.stdout) == [], done.stderr
    (notice,) = lines(done.stderr)
    assert notice.startswith(f"notice: the record {home / 'flashgen.sqlite'} could not be read (file is not a "
                             "database); moved it to flashgen.sqlite.corrupt-"), notice
    (moved,) = home.glob("flashgen.sqlite.corrupt-*[0-9]Z")
    assert moved.read_bytes() == garbage  # nothing deleted
    (old_artifacts,) = home.glob("artifacts.corrupt-*")
    assert (old_artifacts / "1" / "0001-candidate" / "kernel.cu").read_text() == "// old\n"
    store = Store(home)
    assert store.run(store.new_run("generate", {})).status == "running"


def test_a_damaged_page_found_later_is_one_line_and_moved_aside_by_the_next_open(tmp_path):
    import shutil

    from flashgen.harness.store import StoreError

    store = Store(tmp_path / "good")
    run = store.new_run("x", {})
    for i in range(300):
        store.add_event(run, "e", {"i": i, "t": "short" * 30})
    store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    pages = (tmp_path / "good" / "flashgen.sqlite").stat().st_size // 4096
    for page in range(pages // 2, pages):  # a leaf of the events table: opening works, reading the events does not
        home = tmp_path / f"page{page}"
        shutil.copytree(tmp_path / "good", home)
        with open(home / "flashgen.sqlite", "r+b") as handle:
            handle.seek(page * 4096)
            handle.write(b"\xab" * 4096)
        notices = []
        damaged = Store(home, notice=notices.append)
        if notices:
            continue
        with pytest.raises(StoreError, match="is damaged .*: the next flashgen command moves it aside"):
            damaged.events(run)
        damaged.close()
        Store(home, notice=notices.append)
        assert len(notices) == 1 and "moved it to flashgen.sqlite.corrupt-" in notices[0]
        assert list(home.glob("flashgen.sqlite.corrupt-*"))
        return
    pytest.fail("no page found whose damage shows only when read")


def test_each_reply_is_stored_once(tmp_path):
    marker = "unique-prose-" + "m" * 4000
    result = finished_run(tmp_path, [f"{marker}\n{SKETCH}", FULL, cuda_reply()])
    assert result.status == "done"
    db = sqlite3.connect(tmp_path / "store" / "flashgen.sqlite")
    texts = [row[0] for row in db.execute("SELECT payload FROM events")] + \
            [row[0] for row in db.execute("SELECT text FROM blobs")]
    assert sum(text.count(marker) for text in texts) == 1  # before: the reply event and every state snapshot
    store = Store(tmp_path / "store")
    events = store.events(result.run_id)
    (reply,) = [e for e in events if e.step == "reply" and e.payload["iteration"] == 1]
    assert reply.payload["text"].startswith(marker)
    last_state = [e for e in events if e.step == "state"][-1].payload
    assert last_state["conversations"]["sketch"][2]["content"].startswith(marker)  # snapshots read back whole
    # rows written before blobs existed (strings inline) read as they are
    db.execute("INSERT INTO events (run_id, seq, step, created, payload, artifacts) VALUES (?, 999, 'old', 'x', ?, '{}')",
               (result.run_id, json.dumps({"text": "inline " * 100})))
    db.commit()
    assert store.events(result.run_id)[-1].payload == {"text": "inline " * 100}


# ------------------------------------------------------------------------------------------------ conventions


def test_the_record_and_the_cache_follow_xdg(tmp_path, monkeypatch):
    monkeypatch.delenv("FLASHGEN_HOME", raising=False)
    monkeypatch.delenv("FLASHGEN_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert paths.state_dir() == tmp_path / "user" / ".local" / "state" / "flashgen"
    assert paths.cache_dir() == tmp_path / "user" / ".cache" / "flashgen"
    assert paths.cubin_cache_dir() == tmp_path / "user" / ".cache" / "flashgen" / "cubin"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/is/ignored")
    assert paths.state_dir() == tmp_path / "state" / "flashgen" and Store().home == tmp_path / "state" / "flashgen"
    assert paths.cache_dir() == tmp_path / "user" / ".cache" / "flashgen"
    monkeypatch.setenv("FLASHGEN_HOME", str(tmp_path / "fh"))  # still wins
    assert paths.state_dir() == tmp_path / "fh" and paths.cache_dir() == tmp_path / "fh" / "cache"
    # the compile cache is content-addressed and shared by every home (flashgen.harness.compile uses it)
    assert paths.cubin_cache_dir() == tmp_path / "user" / ".cache" / "flashgen" / "cubin"
    from flashgen.harness.compile import default_cache_dir

    assert default_cache_dir() == paths.cubin_cache_dir()
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(tmp_path / "cubins"))
    assert paths.cubin_cache_dir() == tmp_path / "cubins"


def test_no_record_in_the_working_folder(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    done = cli("runs", "list", home=None, cwd=work, env_extra={"XDG_STATE_HOME": str(tmp_path / "state")})
    assert done.returncode == 0, done.stderr
    assert list(work.iterdir()) == [] and (tmp_path / "state" / "flashgen" / "flashgen.sqlite").is_file()


def test_results_on_stdout_progress_on_stderr_and_json(tmp_path):
    home, out = tmp_path / "home", tmp_path / "k"
    done = cli("generate", "--gpu", "a100", "--head-dim", "64", "--causal", "--out", str(out), "--json", home=home)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)  # stdout is the one JSON object
    assert result["run_id"] == 1 and result["out"] == str(out) and result["meta"]["variant"] == "causal"
    assert "[1] sketch: asking expert" in done.stderr and "{" not in done.stderr
    again = cli("generate", "--resume", "1", "--out", str(out), home=home)  # a done run: rewrites its outputs
    assert again.returncode == 0 and again.stdout.startswith("flashgen generate: done ("), again.stdout
    assert f"{out}/  sketch.tl" in again.stdout and "run       1: 3 model calls" in again.stdout, again.stdout
    assert "run 1 had already ended (done: " in again.stderr and "flashgen generate:" not in again.stderr
    listed = json.loads(cli("runs", "list", "--json", home=home).stdout)
    assert [(r["id"], r["status"], r["resume"]["helps"]) for r in listed] == [(1, "done", False)]
    shown = json.loads(cli("runs", "show", "1", "--json", home=home).stdout)
    assert shown["id"] == 1 and [e["step"] for e in shown["events"]][:2] == ["prompt", "reply"]
    assert json.loads(cli("targets", "--json", home=home).stdout)["a100"]["arch"] == "sm_80"


@pytest.mark.parametrize("args, message", [
    (["generate", "--bogus"], "error: flashgen generate: No such option: --bogus"),
    (["runs", "show"], "error: flashgen runs show: Missing argument 'run_id'."),
    (["generate", "--head-dim", "x"], "error: flashgen generate: Invalid value for '--head-dim': "),
    (["nosuch"], "error: flashgen: No such command 'nosuch'."),
])
def test_usage_errors_are_one_line_and_exit_2(args, message, tmp_path):
    done = cli(*args, home=tmp_path / "home")
    assert done.returncode == 2 and done.stdout == ""
    (line,) = lines(done.stderr)
    assert line.startswith(message) and line.endswith("--help)") and "╭" not in line, done.stderr
