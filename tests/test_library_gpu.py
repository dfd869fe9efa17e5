"""The library job's GPU stages on the GPU present (`pytest -m gpu`): an entry verified and timed on device 0 by
the local engine's GPU worker, the parameter search (tuned = "search") choosing each entry's parameters on that GPU,
and `flashgen targets detect` reading the device."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_library_job_verifies_and_times_on_the_gpu_present(tmp_path, monkeypatch):
    from flashgen.library import build, parse_spec
    from flashgen.library.gpus import local_gpus
    from flashgen.library.index import read_index

    monkeypatch.setenv("FLASHGEN_HOME", str(tmp_path / "home"))
    found = local_gpus()
    if not found or found[0].target is None:
        pytest.skip(f"GPU 0 ({found[0].name if found else 'none'}) is no target of the table")
    spec = parse_spec({"gpus": [found[0].target], "dtypes": ["fp16"], "variants": ["plain", "causal"],
                       "head_dims": [64], "gpu": {"baselines": False, "min_time_s": 0.05}})
    summary = build(spec, tmp_path / "lib", gpus=found[:1], store=False)
    assert summary.failed == 0 and summary.gpu_run == 2, summary.rows
    for entry in read_index(tmp_path / "lib").entries:
        assert entry.ran_on["device"] == 0 and entry.ran_on["name"] == found[0].name
        assert entry.verification["ran"] and entry.verification["ok"] and entry.timings["time_ms"] > 0


def test_library_job_searches_the_parameters_on_the_gpu_present(tmp_path, monkeypatch):
    """Two entries, tuned = "search" with a small budget: each searched on device 0 (its candidates compiled, verified
    and timed), built with the winner, and the built kernel passes the full verification; a rerun keeps both."""
    import json

    from flashgen.library import build, parse_spec
    from flashgen.library.gpus import local_gpus
    from flashgen.library.index import read_index

    monkeypatch.setenv("FLASHGEN_HOME", str(tmp_path / "home"))
    found = local_gpus()
    if not found or found[0].target is None:
        pytest.skip(f"GPU 0 ({found[0].name if found else 'none'}) is no target of the table")
    spec = parse_spec({"gpus": [found[0].target], "dtypes": ["fp16"], "variants": ["plain", "causal"],
                       "head_dims": [64], "tuned": "search",
                       "search": {"max_candidates": 3, "budget_s": 120, "min_time_s": 0.02, "lengths": [1024, 2048]},
                       "gpu": {"baselines": False, "min_time_s": 0.05}})
    summary = build(spec, tmp_path / "lib", gpus=found[:1], store=False)
    assert summary.failed == 0 and summary.searched == 2 and summary.gpu_run == 2, summary.rows
    for entry in read_index(tmp_path / "lib").entries:
        tuning = entry.tuning
        assert tuning["source"] == "search" and tuning["on"]["device"] == 0 and tuning["on"]["name"] == found[0].name
        timed = [c for c in tuning["candidates"] if c["status"] == "timed"]
        assert timed and all(c["geomean_ms"] > 0 and len(c["times_ms"]) == 2 for c in timed)
        assert tuning["winner"] == min(timed, key=lambda c: c["geomean_ms"])["params"]
        # built with the winner (a backend's manifest leaves out what it ignores, e.g. Q_IN_REGS on sm90) and the
        # built kernel passes the full default case set on the GPU
        shared = set(entry.parameters) & set(tuning["winner"])
        assert {"BLOCK_M", "BLOCK_N", "WARPS"} <= shared, entry.parameters
        assert all(entry.parameters[k] == tuning["winner"][k] for k in shared), (entry.parameters, tuning["winner"])
        assert entry.verification["ran"] and entry.verification["ok"] and entry.timings["time_ms"] > 0
        meta = json.loads((tmp_path / "lib" / entry.path / "meta.json").read_text())
        assert meta["parameters_source"]["source"] == "search" and meta["verification"]["ok"]
    again = build(spec, tmp_path / "lib", gpus=found[:1], store=False)
    assert again.kept == 2 and again.searched == 0 and again.failed == 0


def test_targets_detect_reads_the_gpu_present():
    from flashgen.library.gpus import match_target
    from flashgen.target_files import detected_toml, parse_target_file, read_device
    from flashgen.targets import get_target

    device = read_device(0)
    text, missing = detected_toml(device)
    assert device["sm_count"] > 0 and device["l2_bytes"] > 0 and "compute_capability" in text
    known = match_target(device["name"], (device["major"], device["minor"]), device["sm_count"])
    if known is not None:
        assert get_target(known).sm_count == device["sm_count"] and get_target(known).l2_bytes == device["l2_bytes"]
    if not missing:
        renamed = text.replace(f'marketing_name = "{device["name"]}"', 'marketing_name = "detected GPU"')
        target = parse_target_file(renamed.replace('name = "', 'name = "x', 1)).to_target()
        assert target.sm_count == device["sm_count"]
