"""The library job (flashgen.library, docs/batch.md) on the CPU: the spec's one-line errors, content keys and
resuming, the local engine's process pool and GPU workers (fakes: N declared GPUs, one dies mid-job), the index,
`pick` and `diff`. The Ray engine's tests are in tests/test_library_ray.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flashgen.errors import Interrupted, UsageError
from flashgen.library import build, diff, load, parse_spec
from flashgen.library.engines import LocalEngine, Stages
from flashgen.library.gpus import LocalGpu
from flashgen.library.index import COMPILED_AND_ESTIMATED, read_index

REPO = Path(__file__).resolve().parents[1]
FAKES = Stages(build="tests.library_fakes:fake_build", worker="tests.library_fakes:make_worker")
# 2 GPUs x 2 dtypes x 2 variants x 3 head dims = 24 entries
SPEC = {"gpus": ["h200", "a100"], "dtypes": ["fp16", "bf16"], "variants": ["plain", "causal"],
        "head_dims": [64, 128, 256], "tuned": "packaged"}
FAIL = "a100/bf16/causal_d128"


def gpus(n: int, target: str = "h200", name: str = "NVIDIA H200") -> list[LocalGpu]:
    return [LocalGpu(index=i, name=name, target=target, visible_id=str(i), host="fakehost") for i in range(n)]


@pytest.fixture
def fakes(monkeypatch, tmp_path):
    monkeypatch.setenv("FLASHGEN_FAKE_FAIL", FAIL)
    monkeypatch.setenv("FLASHGEN_FAKE_DIR", str(tmp_path))
    monkeypatch.setenv("FLASHGEN_HOME", str(tmp_path / "home"))
    return tmp_path


def normalized(folder: Path) -> dict:
    """The index with the GPU that ran each entry reduced to its name (which of N equal GPUs took it varies)."""
    index = json.loads((folder / "library.json").read_text())
    for entry in index["entries"]:
        if isinstance(entry["ran_on"], dict):
            entry["ran_on"] = entry["ran_on"]["name"]
    return index


def same_files(a: Path, b: Path) -> list[str]:
    names = sorted({p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file() and p.name != "library.json"}
                   | {p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file() and p.name != "library.json"})
    return [n for n in names if not (a / n).is_file() or not (b / n).is_file()
            or (a / n).read_bytes() != (b / n).read_bytes()]


# ------------------------------------------------------------------------------------------------ the spec


@pytest.mark.parametrize("data, message", [
    ({**SPEC, "gpu_list": ["h200"]}, "unknown key 'gpu_list'"),
    ({**SPEC, "gpus": ["h900"]}, "gpus: unknown GPU 'h900'"),
    ({**SPEC, "variants": ["causal", "sliding"]}, "variants: unknown variant 'sliding'"),
    ({**SPEC, "dtypes": ["fp8"]}, "dtypes:"),
    ({**SPEC, "head_dims": [64, 100]}, "head_dims: head dim 100 is not supported: head dims are multiples of 8"),
    ({**SPEC, "provider": {"name": "expert", "max_iter": 3}}, "unknown key 'provider.max_iter'"),
    ({**SPEC, "provider": {"name": "gpt"}}, "provider.name"),
    ({**SPEC, "gpu": {"min_time_s": -1}}, "gpu.min_time_s: must be greater than 0"),
    ({k: v for k, v in SPEC.items() if k != "dtypes"}, "missing key 'dtypes'"),
    ({**SPEC, "head_dims": [64, 64]}, "names one twice"),
    ({**SPEC, "head_dims": [128, [128, 128]]}, "head_dims: [128, [128, 128]] names one twice"),
    ({**SPEC, "head_dims": [[192, 100]]}, "head_dims: [192, 100]: head dim 100 is not supported"),
    ({**SPEC, "head_dims": [[192, 128, 64]]}, "each item is a head dim (128) or [D, Dv]"),
    ({**SPEC, "head_dims": [[192, 128]], "tuned": "search"}, "the parameter search does not take a V head dim"),
])
def test_a_bad_spec_is_one_line(data, message):
    with pytest.raises(UsageError) as caught:
        parse_spec(data, "lib.toml")
    text = str(caught.value)
    assert message in text and "\n" not in text and text.startswith("lib.toml: "), text


def test_a_bad_spec_file_exits_non_zero_in_one_line(tmp_path, capsys):
    from flashgen.cli import main

    bad = tmp_path / "lib.toml"
    for text, message in (('gpus = ["h200"\n', "not TOML"), ('gpus = ["h200"]\ndtypes = ["fp16"]\n'
                                                            'variants = ["plain"]\nhead_dims = [64]\ncolour = 1\n',
                                                            "unknown key 'colour'")):
        bad.write_text(text)
        with pytest.raises(SystemExit) as stop:
            main(["library", "build", str(bad), "--out", str(tmp_path / "lib")])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and message in err and err.strip().count("\n") == 0, err
    assert not (tmp_path / "lib").exists()


def test_exclude_drops_combinations_and_names_are_canonical():
    spec = parse_spec({**SPEC, "gpus": ["h200-sxm", "a100"], "exclude": [{"gpu": "a100", "head_dim": 256}]})
    assert spec.gpus == ["h200", "a100"] and len(spec.entries()) == 20
    assert "a100/fp16/plain_d256" not in {e.path for e in spec.entries()}


def test_a_v_head_dim_of_its_own_is_an_entry_built_keyed_and_picked(tmp_path, monkeypatch):
    """[D, Dv] in head_dims: its folder (..._d192v128), the kernel generate builds with head_dim_v, the index's
    head_dim_v, pick(head_dim_v=...); entries without one keep their keys (no head_dim_v in what is hashed)."""
    monkeypatch.setenv("FLASHGEN_HOME", str(tmp_path / "home"))
    spec = parse_spec({"gpus": ["h200"], "dtypes": ["bf16"], "variants": ["plain"], "head_dims": [64, [192, 128]],
                       "tuned": "packaged", "exclude": [{"head_dim": 192, "head_dim_v": 192}, {"gpu": "a100"}]})
    assert [e.path for e in spec.entries()] == ["h200/bf16/plain_d64", "h200/bf16/plain_d192v128"]
    assert "head_dim_v" not in spec.entries()[0].key_dump() and spec.entries()[1].key_dump()["head_dim_v"] == 128
    rules = spec.index_dump()["exclude"]  # an exclude rule records head_dim_v only where it has one
    assert rules[0]["head_dim_v"] == 192 and "head_dim_v" not in rules[1]
    summary = build(spec, tmp_path / "lib", only={"h200/bf16/plain_d192v128"}, gpus=[], jobs=1, store=False)
    assert summary.built == 1 and summary.failed == 0
    (entry,) = read_index(tmp_path / "lib").entries
    assert (entry.path, entry.head_dim, entry.head_dim_v, entry.status) == ("h200/bf16/plain_d192v128", 192, 128, "ok")
    text = (tmp_path / "lib" / "library.json").read_text()
    assert text.count('"head_dim_v": 128') == 1
    library = load(tmp_path / "lib")
    kernel = library.pick(gpu="h200", dtype="bf16", head_dim=192, head_dim_v=128)
    assert (kernel.manifest.head_dim, kernel.manifest.head_dim_v) == (192, 128)
    with pytest.raises(UsageError, match=r"no kernel for h200 bf16 plain d192 in .*; it holds for h200: bf16/plain_d192v128"):
        library.pick(gpu="h200", dtype="bf16", head_dim=192)


# ------------------------------------------------------------------------------------------------ local engine


def test_local_engine_schedules_onto_n_gpus_and_a_dying_worker_loses_only_its_entries(fakes, monkeypatch):
    """Three declared H200s; GPU 1 dies at its third job (the verify of its second entry) and stays dead: that entry
    and the next one it takes are redone by the other two, the batch goes on, the planted failure is recorded."""
    monkeypatch.setenv("FLASHGEN_FAKE_DIE", "1:3")
    engine = LocalEngine(jobs=2, gpus=gpus(3), stages=FAKES, max_attempts=3)
    summary = build(parse_spec(SPEC), fakes / "lib", engine=engine, store=fakes / "store")
    index = read_index(fakes / "lib")
    assert len(index.entries) == summary.entries == 24
    by = index.by_path()
    assert by[FAIL].status == "failed" and "planted failure" in by[FAIL].error
    h200 = [e for e in index.entries if e.target == "h200"]
    assert all(e.status == "ok" and isinstance(e.ran_on, dict) for e in h200)
    devices = [e.ran_on["device"] for e in h200]
    assert set(devices) <= {0, 1, 2} and devices.count(1) == 1  # it finished one entry before it died
    assert all(e.timings["time_ms"] > 0 and e.verification["ok"] for e in h200)
    assert all(e.ran_on == COMPILED_AND_ESTIMATED for e in index.entries if e.target == "a100" and e.status == "ok")
    assert summary.engine.gpu_retries == 2 and summary.engine.retired == ["fakehost:1"]
    assert summary.failed == 1 and summary.gpu_run == 12 and summary.compiled_and_estimated == 11
    meta = json.loads((fakes / "lib" / h200[0].path / "meta.json").read_text())
    assert meta["verification"]["ran"] and meta["timings"]["time_ms"] == h200[0].timings["time_ms"]
    assert "library job" in meta["generation"]["reason"]
    from flashgen.harness.store import Store

    with Store(fakes / "store") as store:
        run = store.runs(kind="library")[0]
        assert run.status == "failed" and len(store.events(run.id)) == 24 + 12


def test_an_interrupted_job_resumes_to_the_same_library(fakes):
    spec = parse_spec(SPEC)
    whole = fakes / "whole"
    build(spec, whole, engine=LocalEngine(jobs=2, gpus=gpus(2), stages=FAKES), store=False)

    class StopAfter:
        def __init__(self, n):
            self.n = n

        def start(self, totals): pass
        def add(self, stage, count): pass
        def stop(self): pass

        def advance(self, stage, ok, path):
            self.n -= 1
            if self.n == 0:
                raise KeyboardInterrupt

    part = fakes / "part"
    with pytest.raises(Interrupted, match="entries are recorded in"):
        build(spec, part, engine=LocalEngine(jobs=2, gpus=gpus(2), stages=FAKES), store=False, reporter=StopAfter(7))
    done = {e.path for e in read_index(part).entries if e.status == "ok"}
    assert 0 < len(done) < 24
    again = build(spec, part, engine=LocalEngine(jobs=2, gpus=gpus(2), stages=FAKES), store=False)
    assert {r.path for r in again.rows if r.action in ("kept", "gpu")} == done  # only the rest was built
    assert sum(r.action in ("built", "failed") for r in again.rows) == 24 - len(done)
    # library.md names the GPU that ran each entry, which of the two equal ones varies (and may happen to match)
    assert set(same_files(whole, part)) <= {"library.md"} and normalized(whole) == normalized(part)
    rerun = build(spec, part, engine=LocalEngine(jobs=2, gpus=gpus(2), stages=FAKES), store=False)
    assert rerun.kept == 23 and [r.path for r in rerun.rows if r.action == "failed"] == [FAIL]  # tried again alone


def test_a_change_redoes_only_the_entries_it_touches(fakes, monkeypatch):
    spec = parse_spec(SPEC)
    lib = fakes / "lib"
    engine = lambda: LocalEngine(jobs=2, gpus=[], stages=FAKES)  # noqa: E731
    build(spec, lib, engine=engine(), store=False)
    (lib / "a100/fp16/plain_d64/kernel.cu").write_text("// edited by hand\n")  # a file that is not the index's
    from flashgen.library import job, keys

    real = keys.source_digests
    monkeypatch.setattr(job, "source_digests", lambda backend: {**real(backend), "backend:sm90": "changed"}
                        if backend == "sm90" else real(backend))
    summary = build(spec, lib, engine=engine(), store=False)
    rebuilt = sorted(r.path for r in summary.rows if r.action in ("built", "failed"))
    assert rebuilt == sorted([e.path for e in spec.entries() if e.gpu == "h200"] + ["a100/fp16/plain_d64", FAIL])
    assert (lib / "a100/fp16/plain_d64/kernel.cu").read_text().startswith("// fake kernel")


def test_a_kernel_gpu_stage_failure_is_recorded_and_compiled_entries_get_their_gpu_stage_later(fakes, monkeypatch):
    spec = parse_spec({**SPEC, "gpus": ["h200"], "head_dims": [64]})
    lib = fakes / "lib"
    build(spec, lib, engine=LocalEngine(jobs=1, gpus=[], stages=FAKES), store=False)
    assert all(e.ran_on == COMPILED_AND_ESTIMATED for e in read_index(lib).entries)
    monkeypatch.setenv("FLASHGEN_FAKE_DIE", "0:1")  # the only GPU is dead: every entry is lost on it
    later = build(spec, lib, engine=LocalEngine(jobs=1, gpus=gpus(1), stages=FAKES), store=False)
    assert later.built == 0 and later.failed == 4
    assert all("lost on" in e.error or "no GPU worker" in e.error for e in read_index(lib).entries)
    monkeypatch.delenv("FLASHGEN_FAKE_DIE")
    healed = build(spec, lib, engine=LocalEngine(jobs=1, gpus=gpus(1), stages=FAKES), store=False)
    assert healed.failed == 0 and healed.gpu_run == 4


# ------------------------------------------------------------------------------------------------ using it


def test_pick_finds_the_kernel_and_says_why_none_fits(fakes):
    lib = fakes / "lib"
    build(parse_spec(SPEC), lib, engine=LocalEngine(jobs=2, gpus=[], stages=FAKES), store=False)
    library = load(lib)
    kernel = library.pick(gpu="h200-sxm", dtype="bf16", variant="causal", head_dim=128)
    assert kernel.manifest.name == "fg_fake_causal_bf16_d128" and kernel.out_dir == lib / "h200/bf16/causal_d128"
    assert library.pick(gpu="a100", dtype="fp16", causal=True, head_dim=64).manifest.variant.causal
    with pytest.raises(UsageError, match=r"no kernel for h200 fp16 window256 d64 in .*; it holds for h200: bf16/"):
        library.pick(gpu="h200", dtype="fp16", variant="window256", head_dim=64)
    with pytest.raises(UsageError, match="holds no kernel for t4"):
        library.pick(gpu="t4", dtype="fp16", head_dim=64)
    with pytest.raises(UsageError, match="failed to build: planted failure"):
        library.pick(gpu="a100", dtype="bf16", variant="causal", head_dim=128)
    with pytest.raises(UsageError, match="not a kernel library"):
        load(fakes)


def test_diff_lists_the_changed_entries_with_their_speed(fakes, monkeypatch):
    spec = parse_spec({**SPEC, "gpus": ["h200"], "head_dims": [64, 128]})
    old, new = fakes / "old", fakes / "new"
    build(spec, old, engine=LocalEngine(jobs=2, gpus=gpus(1), stages=FAKES), store=False)
    build(spec, new, engine=LocalEngine(jobs=2, gpus=gpus(1), stages=FAKES), store=False)
    assert all(r.change == "same" for r in diff(old, new))
    entry = "h200/fp16/plain_d64"
    index = json.loads((new / "library.json").read_text())
    for e in index["entries"]:
        if e["path"] == entry:
            e["timings"]["time_ms"] /= 2
            e["files"]["kernel.cu"] = "0" * 64
    (new / "library.json").write_text(json.dumps(index))
    rows = {r.path: r for r in diff(old, new)}
    assert rows[entry].change == "changed" and rows[entry].what == ["kernel.cu"] and rows[entry].speed == 2.0
    from typer.testing import CliRunner

    from flashgen.cli import app

    shown = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["library", "diff", str(old), str(new)])
    assert shown.exit_code == 0 and "1 of 8 entries changed" in shown.output and "2.00x" in shown.output


# ------------------------------------------------------------------------------------------------ generated/


def test_generated_is_a_library_whose_index_matches_its_folders():
    from flashgen import regenerate
    from flashgen.library.keys import file_digest

    index = read_index(REPO / "generated", missing_ok=False)
    want = {e.path for e in regenerate.spec().entries()}
    assert {e.path for e in index.entries} == want and len(want) == 40
    for entry in index.entries:
        assert entry.status == "ok" and entry.ran_on == COMPILED_AND_ESTIMATED, entry.path
        for name, digest in entry.files.items():
            assert file_digest((REPO / "generated" / entry.path / name).read_bytes()) == digest, f"{entry.path}/{name}"
    from flashgen.library.index import summary_markdown

    assert (REPO / "generated" / "library.md").read_text() == summary_markdown(index)


@pytest.mark.slow  # two real builds (TL, CPU checks, translation, nvcc): about 30 s on 2 cores
def test_the_library_job_rebuilds_committed_entries_identically(tmp_path, monkeypatch):
    from flashgen import regenerate

    monkeypatch.setenv("FLASHGEN_HOME", str(tmp_path / "home"))
    paths = {"t4/fp16/plain_d64", "h200/bf16/causal_d128"}
    summary = build(regenerate.spec(), tmp_path / "lib", only=paths, gpus=[], jobs=2, store=False)
    assert summary.built == 2 and summary.failed == 0
    from flashgen.agent.outputs import FILES

    for path in paths:
        for name in FILES:
            assert (tmp_path / "lib" / path / name).read_bytes() == (REPO / "generated" / path / name).read_bytes(), \
                f"{path}/{name} differs from the committed file: python -m flashgen.regenerate rebuilds generated/"
    committed = read_index(REPO / "generated").by_path()
    for entry in read_index(tmp_path / "lib").entries:
        assert entry.model_dump(exclude={"key"}) == committed[entry.path].model_dump(exclude={"key"}), entry.path


def test_show_and_pick_on_the_command_line_and_ray_missing_is_one_line(fakes, monkeypatch, capsys):
    import sys

    from flashgen.cli import main

    lib = fakes / "lib"
    build(parse_spec({**SPEC, "gpus": ["h200"], "head_dims": [64]}), lib,
          engine=LocalEngine(jobs=1, gpus=[], stages=FAKES), store=False)
    main(["library", "show", str(lib)])
    assert "| h200/bf16/causal_d64 | ok | fake |" in capsys.readouterr().out
    main(["library", "pick", str(lib), "--gpu", "h200", "--dtype", "bf16", "--variant", "causal", "--head-dim", "64"])
    assert capsys.readouterr().out.strip() == str(lib / "h200/bf16/causal_d64")
    with pytest.raises(SystemExit) as stop:
        main(["library", "pick", str(lib), "--gpu", "h200", "--head-dim", "256"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "no kernel for h200 fp16 plain d256" in err and err.count("\n") == 1
    monkeypatch.setitem(sys.modules, "ray", None)  # as where Ray is not installed
    spec = fakes / "lib.toml"
    spec.write_text('gpus = ["h200"]\ndtypes = ["fp16"]\nvariants = ["plain"]\nhead_dims = [64]\n')
    with pytest.raises(SystemExit) as stop:
        main(["library", "build", str(spec), "--out", str(fakes / "r"), "--engine", "ray"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "pip install 'flashgen[ray]'" in err and err.count("\n") == 1
