"""The library job's parameter search (`tuned = "search"`, docs/batch.md) on the CPU: the search's GPU half (the real
stage, flashgen.library.stages.tune_entry, with flashgen.harness.tune's GpuTimer) on fake GPU workers declared as
H200s, its CPU half and the builds faked (tests/library_fakes.py); then the real CPU half and the real build, slow.

What is checked: each entry whose GPU is present is searched, and its index entry records the parameters chosen, the
candidates tried with their times (or why each was dropped) and the GPU that searched; the build takes the chosen
parameters; a rerun keeps every entry without searching again; a search run again that chooses the same keeps the
entries, one that chooses other parameters rebuilds them; without a GPU of the target an entry takes the packaged or
default parameters and says so, and is searched and rebuilt once a GPU is there."""

from __future__ import annotations

import json

import pytest

from flashgen.errors import UsageError
from flashgen.library import build, parse_spec
from flashgen.library.engines import LocalEngine, Stages
from flashgen.library.index import COMPILED_AND_ESTIMATED, read_index
from tests.library_fakes import CANDIDATES
from tests.test_library import gpus

FAKES = Stages(build="tests.library_fakes:fake_build", worker="tests.library_fakes:make_worker",
               candidates="tests.library_fakes:fake_candidates")
# 2 GPUs x 2 dtypes x 2 variants x 1 head dim = 8 entries; the H200s are declared, no A100 is
SPEC = {"gpus": ["h200", "a100"], "dtypes": ["fp16", "bf16"], "variants": ["plain", "causal"], "head_dims": [64],
        "tuned": "search", "search": {"max_candidates": 3, "lengths": [1024, 4096]}}


@pytest.fixture
def fakes(monkeypatch, tmp_path):
    monkeypatch.setenv("FLASHGEN_FAKE_DIR", str(tmp_path))
    monkeypatch.setenv("FLASHGEN_HOME", str(tmp_path / "home"))
    for name in ("FLASHGEN_FAKE_FAIL", "FLASHGEN_FAKE_WRONG", "FLASHGEN_FAKE_FASTEST", "FLASHGEN_FAKE_DIE"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def engine(n_gpus: int = 2) -> LocalEngine:
    return LocalEngine(jobs=2, gpus=gpus(n_gpus), stages=FAKES)


def packaged_params(path: str) -> dict:
    from flashgen.library.keys import tuned_mode
    from flashgen.library.spec import parse_variant_name
    from flashgen.translators.params import choose_params
    from flashgen.variant import DType

    gpu, dtype, rest = path.split("/")
    variant, head_dim = rest.rsplit("_d", 1)
    with tuned_mode("packaged"):
        return dict(choose_params(parse_variant_name(variant), gpu, DType(dtype), int(head_dim)))


def test_the_search_runs_per_entry_on_its_gpu_and_the_index_records_what_it_chose(fakes, monkeypatch):
    monkeypatch.setenv("FLASHGEN_FAKE_WRONG", "64x64 w4 s1 q1 g1")  # the second candidate fails verification
    lib = fakes / "lib"
    summary = build(parse_spec(SPEC), lib, engine=engine(), store=fakes / "store")
    assert summary.failed == 0 and summary.searched == 4 and summary.fallback == 4 and summary.search_gpu_s > 0
    by = read_index(lib).by_path()
    h200 = [e for e in by.values() if e.target == "h200"]
    assert len(h200) == 4
    for e in h200:
        tuning = e.tuning
        assert tuning["source"] == "search" and tuning["on"]["name"] == "NVIDIA H200"
        assert tuning["on"]["device"] in (0, 1)
        assert tuning["shapes"] == ["B=16,H=32,N=1024,M=1024,D=64", "B=4,H=32,N=4096,M=4096,D=64"]
        tried = {c["label"]: c for c in tuning["candidates"]}
        assert len(tried) == 3 and tried["64x64 w4 s1 q1 g1"]["status"].startswith("verify: fake: O differs")
        timed = [c for c in tuning["candidates"] if c["status"] == "timed"]
        assert len(timed) == 2 and all(set(c["times_ms"]) == set(tuning["shapes"]) for c in timed)
        best = min(timed, key=lambda c: c["geomean_ms"])
        assert tuning["winner"] == best["params"] and tuning["winner_label"] == best["label"]
        assert e.parameters == tuning["winner"] and tuning["search_key"] and tuning["passed_cpu_filters"] == 4
        assert isinstance(e.ran_on, dict) and e.verification["ok"] and e.timings["time_ms"] > 0  # built, then timed
        meta = json.loads((lib / e.path / "meta.json").read_text())
        assert meta["parameters"] == e.parameters and meta["parameters_source"]["source"] == "search"
    for e in (e for e in by.values() if e.target == "a100"):  # no A100 here: the packaged or default parameters
        assert e.tuning["source"] == "fallback" and e.tuning["note"] == "no GPU of a100 here to search on"
        assert e.parameters == {"BLOCK_M": 64} and e.ran_on == COMPILED_AND_ESTIMATED  # fake_build's own choice
        assert e.tuning["parameters_from"].startswith(("tuned", "measured", "defaults", "model"))
    assert {r.params_from for r in summary.rows} == {"search (this run)", "fallback"}
    shown = (lib / "library.md").read_text()
    assert "(search on GPU " in shown and "2 of 3 candidates timed" in shown and "(fallback (no GPU of a100" in shown
    from flashgen.harness.store import Store

    with Store(fakes / "store") as store:
        steps = [e.step for e in store.events(store.runs(kind="library")[0].id)]
    assert steps.count("candidates") == steps.count("tune") == 4 and steps.count("build") == 8

    rerun = build(parse_spec(SPEC), lib, engine=engine(), store=False)  # nothing changed: nothing searched or built
    assert rerun.kept == 8 and rerun.searched == 0 and rerun.search_gpu_s == 0
    assert {r.params_from for r in rerun.rows} == {"search (recorded)", "fallback"}
    assert read_index(lib).by_path() == by


def test_a_search_that_chooses_again_keeps_and_one_that_chooses_otherwise_rebuilds(fakes, monkeypatch):
    spec = parse_spec({**SPEC, "gpus": ["h200"]})
    lib = fakes / "lib"
    build(spec, lib, engine=engine(), store=False)
    first = read_index(lib).by_path()
    same = build(spec, lib, engine=engine(), store=False, retune=True)  # searched again, the same winners
    assert same.searched == 4 and same.kept == 4 and same.built == 0
    assert {p: e.key for p, e in read_index(lib).by_path().items()} == {p: e.key for p, e in first.items()}
    # now the third candidate is the fastest on every GPU: every winner changes, so every key and build does
    slow = [p for p, e in first.items() if e.tuning["winner_label"] != "128x128 w8 s2 q0 g1"]
    assert slow, "the fake timings already make the third candidate win everywhere"
    monkeypatch.setenv("FLASHGEN_FAKE_FASTEST", "128x128 w8 s2 q0 g1")
    other = build(spec, lib, engine=engine(), store=False, retune=True)
    assert other.searched == 4 and sorted(r.path for r in other.rows if r.action == "built") == sorted(slow)
    after = read_index(lib).by_path()
    assert all(after[p].parameters == CANDIDATES[2] and after[p].key != first[p].key for p in slow)
    assert all(after[p].tuning["winner_geomean_ms"] == 0.5 for p in after)


def test_without_a_gpu_of_the_target_the_fallback_is_recorded_and_a_gpu_later_searches_and_rebuilds(fakes):
    spec = parse_spec({**SPEC, "gpus": ["h200"], "dtypes": ["bf16"]})
    lib = fakes / "lib"
    summary = build(spec, lib, engine=LocalEngine(jobs=2, gpus=[], stages=FAKES), store=False)
    assert summary.fallback == 2 and summary.searched == 0 and summary.built == 2
    for e in read_index(lib).entries:
        assert e.tuning["source"] == "fallback" and e.tuning["note"] == "no GPU of h200 here to search on"
        assert e.ran_on == COMPILED_AND_ESTIMATED
    from flashgen.library import plan

    planned = {p.entry.path: p for p in plan(spec)}
    assert all(planned[e.path].parameters == packaged_params(e.path) for e in read_index(lib).entries)
    assert all(planned[e.path].key == e.key for e in read_index(lib).entries)  # the fallback's key is stable
    later = build(spec, lib, engine=engine(1), store=False)  # a GPU now: searched, rebuilt with the winner, timed
    assert later.searched == 2 and later.built == 2 and later.gpu_run == 2
    for e in read_index(lib).entries:
        assert e.tuning["source"] == "search" and e.tuning["on"]["device"] == 0 and e.parameters == e.tuning["winner"]
    gone = build(spec, lib, engine=LocalEngine(jobs=2, gpus=[], stages=FAKES), store=False)  # the GPU gone again:
    assert gone.kept == 2 and gone.fallback == 0  # the recorded search still holds for these inputs


def test_a_search_that_verifies_nothing_falls_back_and_says_why(fakes, monkeypatch):
    monkeypatch.setenv("FLASHGEN_FAKE_WRONG", "all")
    spec = parse_spec({**SPEC, "gpus": ["h200"], "dtypes": ["fp16"], "variants": ["causal"]})
    summary = build(spec, fakes / "lib", engine=engine(1), store=False)
    (e,) = read_index(fakes / "lib").entries
    assert summary.searched == 0 and summary.fallback == 1 and e.status == "ok" and isinstance(e.ran_on, dict)
    assert e.tuning["source"] == "fallback" and "timed no verified candidate of 3 (verify)" in e.tuning["note"]
    assert all(c["status"].startswith("verify:") for c in e.tuning["search"]["candidates"])
    assert e.parameters == {"BLOCK_M": 64}


@pytest.mark.parametrize("data, message", [
    ({**SPEC, "tuned": "packaged"}, "[search] is for tuned = \"search\" (tuned is 'packaged')"),
    ({**SPEC, "search": {"max_candidates": 0}}, "search.max_candidates: must be greater than or equal to 1"),
    ({**SPEC, "search": {"budget": 10}}, "unknown key 'search.budget' (keys of [search]: max_candidates, budget_s"),
    ({**SPEC, "search": {"lengths": [1024, 1024]}}, "search.lengths: must be distinct lengths"),
    ({**SPEC, "tuned": "searched"}, "tuned: must be 'user', 'packaged' or 'search'"),
])
def test_a_bad_search_spec_is_one_line(data, message):
    with pytest.raises(UsageError) as caught:
        parse_spec(data, "lib.toml")
    text = str(caught.value)
    assert message in text and "\n" not in text and text.startswith("lib.toml: "), text


def test_the_search_settings_are_part_of_the_search_key_not_of_the_entry_key():
    from flashgen.library import plan

    a = {p.entry.path: p for p in plan(parse_spec({**SPEC, "gpus": ["h200"]}), gpu_targets={"h200"})}
    b = {p.entry.path: p for p in plan(parse_spec({**SPEC, "gpus": ["h200"], "search": {"max_candidates": 5}}),
                                       gpu_targets={"h200"})}
    assert all(a[k].searches and a[k].search_key != b[k].search_key and a[k].key == b[k].key for k in a)
    packaged = {p.entry.path: p for p in plan(parse_spec({**SPEC, "gpus": ["h200"], "tuned": "packaged",
                                                          "search": None}))}
    assert all(packaged[k].key != a[k].key and packaged[k].parameters == a[k].parameters for k in a)


# ------------------------------------------------------------------------------------------------ the real halves


@pytest.mark.slow  # the real CPU half (screen, nvcc of 2 candidates) and one real build: about 30 s on 2 cores
def test_the_real_candidates_are_timed_on_the_fake_gpu_and_the_real_build_takes_the_winner(fakes):
    from flashgen.library.stages import BuildTask, Chosen, build_entry

    spec = parse_spec({"gpus": ["h200"], "dtypes": ["fp16"], "variants": ["plain"], "head_dims": [64],
                       "tuned": "search", "search": {"max_candidates": 2, "lengths": [1024]}})
    real_search = Stages(build="tests.library_fakes:fake_build", worker="tests.library_fakes:make_worker")
    summary = build(spec, fakes / "lib", engine=LocalEngine(jobs=2, gpus=gpus(1), stages=real_search), store=False)
    (e,) = read_index(fakes / "lib").entries
    # the 2 likeliest and the packaged choice (9th in the search's order), which the search can then only beat
    assert summary.searched == 1 and e.tuning["source"] == "search" and len(e.tuning["candidates"]) == 3
    (fallback,) = [c for c in e.tuning["candidates"] if c.get("fallback")]
    assert fallback["params"] == packaged_params(e.path) and fallback is e.tuning["candidates"][2]
    assert all(c["registers"] > 0 for c in e.tuning["candidates"])  # compiled by nvcc for sm_90a
    assert e.tuning["passed_cpu_filters"] > 2 and e.tuning["screened"] >= e.tuning["passed_cpu_filters"]
    # the real build with a winner that is not the packaged choice: the expert writes it, meta says where from
    default = packaged_params(e.path)
    other = e.tuning["candidates"][0]["params"]
    assert other != default
    from flashgen.library.job import plan

    (p,) = plan(spec)
    result = build_entry(BuildTask(entry=p.entry, key="k", target=p.target, tuned="search",
                                   chosen=Chosen(params=other, label="chosen", geomean_ms=1.0, gpu="NVIDIA H200")))
    assert result.ok, result.error
    built = result.meta["parameters"]  # the sm90 path's manifest leaves out Q_IN_REGS, which it ignores
    assert built and all(other[k] == v for k, v in built.items()) and set(other) - set(built) <= {"Q_IN_REGS"}
    assert result.meta["parameters_source"]["source"] == "search"
    assert "Parameters from: search (chosen by the library job's parameter search" in result.files["report.md"]
    assert json.loads(result.files["meta.json"]) == json.loads(json.dumps(result.meta))
    assert "flashgen-packaged-" not in result.files["meta.json"] + result.files["report.md"]  # no scratch path
