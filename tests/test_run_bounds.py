"""Issue 12, Bounds and Records: --max-wall bounds the whole run (a hanging model server, a stage that hangs), the
request timeout and retries are options with a total deadline, invalid JSON is transient, huge replies are refused
and not sent back, a malformed --base-url is refused at once; every run's end (provider error, budget, max-wall,
SIGINT, SIGTERM, a crash) is recorded with whether --resume can help. The model server is tests/loopback."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from loopback.fakes import FakeEnvironment, cuda_reply, fenced, full_tl, make_store, sketch_tl
from loopback.server import LoopbackServer, Scripted

from flashgen.agent import loop as loop_module
from flashgen.agent.loop import Budget, LoopConfig, resume_loop, run_loop
from flashgen.agent.messages import DeadlineExceeded
from flashgen.agent.providers import (
    ChatMessage,
    ModelRequest,
    OpenAIProvider,
    ProviderError,
    RetryPolicy,
    ScriptedProvider,
    Task,
    make_provider,
)
from flashgen.errors import UsageError
from flashgen.variant import DType, Variant

TASK = Task(variant=Variant(causal=True), target="a100", arch="sm_80", dtype=DType.fp16, head_dim=64)
SKETCH, FULL = fenced("tl", sketch_tl()), fenced("tl", full_tl())
GENERATE = ["generate", "--gpu", "a100", "--head-dim", "64", "--provider", "openai-compatible", "--model", "m"]


def cli(*args, home, timeout=60, **popen):
    env = {**os.environ, "FLASHGEN_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "flashgen", *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=home.parent, **popen)


def request():
    return ModelRequest(stage="sketch", phase="sketch", task=TASK, messages=[ChatMessage(role="user", content="hi")])


def runs_json(home):
    done = cli("runs", "list", "--json", home=home)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def lines(text):
    return [line for line in text.splitlines() if line.strip()]


# ------------------------------------------------------------------------------------------------ bounds


def test_max_wall_bounds_a_run_whose_model_server_hangs(tmp_path):
    home = tmp_path / "home"
    with LoopbackServer(Scripted(hang=True)) as server:
        started = time.monotonic()
        done = cli(*GENERATE, "--base-url", server.openai_base_url, "--max-wall", "3", "--out", str(tmp_path / "k"),
                   home=home, timeout=60)
        took = time.monotonic() - started
    # 3 s of budget + the interpreter's start; before: the 300 s request timeout, six times
    assert took < 3 + loop_module.WALL_GRACE_S + 10, took
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert lines(done.stderr)[-1].startswith("error: no kernel: wall-time budget spent (3 s, waiting for the model at "
                                             "the sketch step) (run 1; `flashgen generate --resume 1 --out "), done.stderr
    (run,) = runs_json(home)
    assert run["status"] == "budget" and "--max-wall N" in run["resume"]["how"]


class HangingCheck(FakeEnvironment):
    def check_tl(self, text, variant, target, dtype, head_dim, full):
        if full:
            time.sleep(60)  # an interpreter (or compiler) that does not return
        return super().check_tl(text, variant, target, dtype, head_dim, full)


def test_max_wall_stops_a_stage_that_hangs(tmp_path, monkeypatch):
    monkeypatch.setattr(loop_module, "WALL_GRACE_S", 0.5)
    store = make_store(tmp_path)
    started = time.monotonic()
    result = run_loop(LoopConfig(task=TASK, budget=Budget(max_wall_s=1.0)), ScriptedProvider([SKETCH, FULL]),
                      env=HangingCheck(), store=store)
    assert time.monotonic() - started < 10
    assert result.status == "budget" and "inside the params step" in result.reason
    assert store.run(result.run_id).status == "budget"


def test_request_timeout_and_retries_are_bounded_by_a_total_deadline(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-bounds-0123456789")
    with LoopbackServer(Scripted(hang=True)) as server:
        provider = OpenAIProvider("gpt-4o", base_url=server.openai_base_url,
                                  retry=RetryPolicy(max_attempts=2, base_delay_s=0, timeout_s=0.5))
        started = time.monotonic()
        with pytest.raises(ProviderError, match=r"gave up after 2 attempts \(last: APITimeoutError\)") as caught:
            provider.complete(request())
        assert caught.value.transient and time.monotonic() - started < 5 and len(server.seen) == 2
        # many attempts allowed, but the call's total deadline ends them
        provider = OpenAIProvider("gpt-4o", base_url=server.openai_base_url,
                                  retry=RetryPolicy(max_attempts=50, base_delay_s=0, timeout_s=0.5, deadline_s=1.6))
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded, match="no answer within the retry budget's 1.6 s"):
            provider.complete(request())
        assert time.monotonic() - started < 4
        # and the run's --max-wall shortens a request's own timeout
        provider = OpenAIProvider("gpt-4o", base_url=server.openai_base_url, retry=RetryPolicy(timeout_s=300))
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded, match=r"--max-wall") as caught:
            provider.complete(request().model_copy(update={"deadline": time.monotonic() + 1.0}))
        assert caught.value.wall and time.monotonic() - started < 4


@pytest.mark.parametrize("args, message", [
    (["--request-timeout", "0"], "--request-timeout 0: must be greater than 0"),
    (["--request-timeout", "5000"], "--request-timeout 5000: must be less than or equal to 3600"),
    (["--retries", "-1"], "--retries -1: must be from 0 to 99"),
])
def test_request_flags_are_checked_first(args, message, tmp_path):
    done = cli(*GENERATE, "--base-url", "http://localhost:9/v1", *args, home=tmp_path / "home")
    assert done.returncode == 2 and lines(done.stderr) == [f"error: {message}"], done.stderr
    assert not (tmp_path / "home").exists()


def test_request_flags_reach_the_provider(tmp_path):
    home = tmp_path / "home"
    with LoopbackServer(Scripted(hang=True)) as server:
        started = time.monotonic()
        done = cli(*GENERATE, "--base-url", server.openai_base_url, "--request-timeout", "1", "--retries", "1",
                   "--out", str(tmp_path / "k"), home=home)
        assert len(server.seen) == 2
    assert time.monotonic() - started < 20
    assert "gave up after 2 attempts (last: APITimeoutError)" in lines(done.stderr)[-1], done.stderr


def test_invalid_json_is_retried_as_a_transient_error(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-bounds-0123456789")
    fast = RetryPolicy(max_attempts=3, base_delay_s=0, timeout_s=10)
    with LoopbackServer() as server:
        server.push(Scripted(invalid_json=True), Scripted(text="fine"))
        provider = OpenAIProvider("gpt-4o", base_url=server.openai_base_url, retry=fast)
        reply = provider.complete(request())
        assert reply.text == "fine" and reply.attempts == 2
        server.push(*[Scripted(invalid_json=True)] * 3)
        with pytest.raises(ProviderError, match=r"gave up after 3 attempts \(last: invalid JSON in the reply\)"):
            provider.complete(request())


def test_huge_replies_are_refused_and_not_sent_back(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-bounds-0123456789")
    huge = "x" * 10_000_000
    store = make_store(tmp_path)
    with LoopbackServer() as server:
        server.push(huge, SKETCH, FULL, cuda_reply())
        provider = OpenAIProvider("gpt-4o", base_url=server.openai_base_url, retry=RetryPolicy(base_delay_s=0))
        result = run_loop(LoopConfig(task=TASK), provider, env=FakeEnvironment(), store=store)
        sent = [sum(len(m["content"]) for m in seen.body["messages"]) for seen in server.seen]
        repair = server.seen[1].body["messages"][-1]["content"]
    assert result.status == "done" and result.iterations == 4
    assert max(sent) < 100_000, sent  # the 10 MB reply never went back to the model
    assert "a reply of 10000000 characters, over the 200000-character limit, was discarded" in repair
    db = sum(p.stat().st_size for p in (tmp_path / "store").glob("flashgen.sqlite*"))
    assert db < 1_000_000, db
    (reply_event,) = [e for e in store.events(result.run_id) if e.step == "reply" and e.payload.get("refused")]
    assert reply_event.payload["chars"] == 10_000_000 and len(reply_event.payload["text"]) == 2000


@pytest.mark.parametrize("url", ["http//localhost:8000", "localhost:8000/v1", "ftp://host/v1", "http://:80/v1",
                                 "http://host:99999/v1", "http://exa mple/v1"])
def test_malformed_base_url_is_refused(url):
    with pytest.raises(UsageError, match="--base-url .*: not a usable URL"):
        make_provider("openai-compatible", "m", url)


@pytest.mark.parametrize("url", ["http//localhost:8000", "http://host:99999/v1"])
def test_malformed_base_url_is_refused_at_once_in_one_line(url, tmp_path):
    started = time.monotonic()
    done = cli(*GENERATE, "--base-url", url, home=tmp_path / "home")
    assert time.monotonic() - started < 20 and done.returncode == 2
    (line,) = lines(done.stderr)
    assert line.startswith(f"error: --base-url {url!r}: not a usable URL ("), line
    assert not (tmp_path / "home").exists()


# ------------------------------------------------------------------------------------------------ records


def test_provider_error_ends_the_run_with_the_reason_and_resume_advice(tmp_path):
    home = tmp_path / "home"
    with LoopbackServer(Scripted(status=500)) as server:
        done = cli(*GENERATE, "--base-url", server.openai_base_url, "--retries", "1", "--out", str(tmp_path / "k"),
                   home=home)
    assert done.returncode == 2
    last = lines(done.stderr)[-1]
    assert last.startswith("error: no kernel: openai-compatible (m): gave up after 2 attempts (last: HTTP 500) (run 1; "
                           f"`flashgen generate --resume 1 --out {tmp_path / 'k'}` continues it once the provider "
                           "answers again)"), last
    (run,) = runs_json(home)
    assert run["status"] == "error" and run["finished"] and run["resume"]["helps"] is True
    shown = cli("runs", "show", "1", home=home)
    assert "resume: `flashgen generate --resume 1 --out DIR` continues it once the provider answers again" in shown.stdout


def test_a_refused_request_says_resume_needs_a_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-bounds-0123456789")
    with LoopbackServer(Scripted(status=401)) as server:
        provider = OpenAIProvider("gpt-4o", base_url=server.openai_base_url)
        result = run_loop(LoopConfig(task=TASK), provider, env=FakeEnvironment(), store=make_store(tmp_path))
    assert result.status == "error" and "request refused (HTTP 401)" in result.reason
    assert "helps only once the cause (key, model name, quota) is fixed" in result.resume["how"]


def test_budget_end_says_which_flag_and_resume_takes_a_larger_budget(tmp_path):
    store = make_store(tmp_path)
    result = run_loop(LoopConfig(task=TASK, budget=Budget(max_iters=2)), ScriptedProvider([SKETCH, FULL]),
                      env=FakeEnvironment(), store=store)
    assert result.status == "budget" and "--max-iters N" in result.resume["how"]
    assert store.run(result.run_id).summary["resume"] == result.resume
    more = ScriptedProvider([cuda_reply()])
    resumed = resume_loop(result.run_id, lambda info: more, env=FakeEnvironment(), store=store, budget={"max_iters": 5})
    assert resumed.status == "done" and resumed.iterations == 3 and [r.stage for r in more.requests] == ["translate"]


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_mid_run_is_one_line_and_recorded(sig, code, tmp_path):
    home, out = tmp_path / "home", tmp_path / "k"
    env = {**os.environ, "FLASHGEN_HOME": str(home)}
    with LoopbackServer(Scripted(hang=True)) as server:
        proc = subprocess.Popen([sys.executable, "-m", "flashgen", *GENERATE, "--base-url", server.openai_base_url,
                                 "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env, cwd=tmp_path)
        deadline = time.monotonic() + 60
        while not server.seen and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert server.seen, "the request never arrived"
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=30)
    name = sig.name
    assert proc.returncode == code and stdout == "" and "Traceback" not in stderr
    assert lines(stderr) == ["[1] sketch: asking openai-compatible",
                             f"interrupted ({name}): run 1 stopped during the sketch step and was recorded; "
                             f"`flashgen generate --resume 1 --out {out}` continues it from the step it was in"]
    (run,) = runs_json(home)
    assert run["status"] == "interrupted" and run["summary"]["reason"] == f"interrupted by {name} during the sketch step"
    assert not list(tmp_path.glob(".k.*"))  # no lock or temporary folder left behind


def test_runs_show_tells_a_killed_run_from_a_live_one(tmp_path):
    from flashgen.harness.store import Store

    home = tmp_path / "home"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    store = Store(home)
    import socket

    gone = store.new_run("generate", {"loop": {}, "process": {"pid": dead.pid, "host": socket.gethostname()}})
    alive = store.new_run("generate", {"loop": {}, "process": {"pid": os.getpid(), "host": socket.gethostname()}})
    shown = cli("runs", "show", str(gone), home=home)
    assert f"resume: its process is gone: `flashgen generate --resume {gone} --out DIR` continues it" in shown.stdout
    shown = cli("runs", "show", str(alive), home=home)
    assert f"resume: still running (pid {os.getpid()}); wait for it" in shown.stdout
    assert sqlite3.connect(home / "flashgen.sqlite").execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 2
