import json
import math
import shutil

import pytest
from typer.testing import CliRunner

from flashgen.cli import app
from flashgen.errors import UsageError
from flashgen.harness.bench import BenchEntry, TimingStats, tflops
from flashgen.harness.suite import (
    SuiteResult,
    SuiteRow,
    build_expert_kernel,
    build_suite_kernels,
    first_round_drift,
    interpreted_counts,
    order_split,
    render_markdown,
    suite_rows,
    summarize,
    summary_lines,
    translation_target,
)
from flashgen.harness.verify import QUICK_CASES
from flashgen.variant import DType, Shape, Variant

runner = CliRunner()


def test_fa2_suite_rows():
    rows = suite_rows("fa2")
    assert len(rows) == 48
    assert all(s.B * s.N == 16384 and s.H * s.D == 2048 and s.N == s.M for _, _, s in rows)
    assert {s.N for _, _, s in rows} == {512, 1024, 2048, 4096, 8192, 16384}
    assert {(d, v.causal, s.D) for d, v, s in rows} == {(d, c, h) for d in (DType.fp16, DType.bf16)
                                                        for c in (False, True) for h in (64, 128)}
    picked = suite_rows("fa2", "bf16, causal, d128")
    assert len(picked) == 6 and all(d is DType.bf16 and v.causal and s.D == 128 for d, v, s in picked)
    assert len(suite_rows("fa2", "n4096")) == 8
    with pytest.raises(UsageError, match="matches no row"):
        suite_rows("fa2", "fp8")
    with pytest.raises(UsageError, match="unknown suite"):
        suite_rows("fa3")


def test_translation_targets_of_the_code_paths():
    assert translation_target("h200").name == "h200"
    assert translation_target("h200", "sm_90").name == "h200"  # the H200's own kernels take the sm_90 path
    assert translation_target("h200", "sm_80").arch == "sm_80"  # the mma.sync path, compiled for the GPU present
    assert translation_target("h200", "sm_75").arch == "sm_75"
    source, manifest, tl = build_expert_kernel("h200", "fp16", Variant(causal=True), 64, arch_override="sm_75")
    assert manifest.arch == "sm_75" and manifest.variant.causal and manifest.head_dim == 64
    assert "Target sm_75 dtype fp16" in tl and 'extern "C" __global__' in source


def test_unbuildable_kernels_are_recorded_not_raised():
    kernels = build_suite_kernels("h200", suite_rows("fa2", "d64,causal"), "sm_75")
    by_dtype = {k.dtype: k for k in kernels}
    assert by_dtype["fp16"].source is not None and by_dtype["fp16"].build_error is None
    bf16 = by_dtype["bf16"]
    if bf16.source is None:  # bf16 on the Turing path may not exist yet; then it is one line, kept
        assert bf16.build_error and "\n" not in bf16.build_error


def test_interpreted_counts_extrapolation_matches_interpretation():
    from flashgen.tl_spec.interpreter import interpret

    (kernel,) = build_suite_kernels("h200", suite_rows("fa2", "fp16,causal,d64,n2048"), "sm_75")
    shape = Shape(B=8, H=32, N=2048, M=2048, D=64)
    fitted = interpreted_counts(kernel.program, Variant(causal=True), shape)
    one = interpret(kernel.program, Shape(B=1, H=1, KVH=1, N=2048, M=2048, D=64), seed=0).counts
    assert math.isclose(fitted.mma_flops, one.mma_flops * 8 * 32)
    assert math.isclose(fitted.sfu_ops, one.sfu_ops * 8 * 32)
    assert fitted.bytes.keys() == one.bytes.keys()
    assert all(math.isclose(fitted.bytes[k], one.bytes[k] * 8 * 32) for k in one.bytes)


# ----------------------------------------------------------------------------- synthetic results

def _entry(name: str, kind: str, shape: Shape, causal: bool, ms: float) -> BenchEntry:
    stats = TimingStats(median_ms=ms, q1_ms=ms * 0.99, q3_ms=ms * 1.01, min_ms=ms * 0.98, mean_ms=ms, reps=10)
    return BenchEntry(name=name, kind=kind, dtype="fp16", variant="causal" if causal else "plain", shape=shape, ok=True,
                      stats=stats, tflops=tflops(shape, causal, ms), roofline_pct=50.0)


def _result(path: str, ours_ms: dict[int, float]) -> SuiteResult:
    rows = []
    for n, ms in ours_ms.items():
        shape = Shape(B=16384 // n, H=32, N=n, M=n, D=64)
        row = SuiteRow(dtype="fp16", variant="plain", causal=False, shape=shape, kernel="fg_k", status="timed",
                       ours=_entry("fg_k", "kernel", shape, False, ms))
        row.baselines = {"sdpa_flash": _entry("sdpa_flash", "baseline", shape, False, 2.0),
                         "sdpa_cudnn": _entry("sdpa_cudnn", "baseline", shape, False, 1.0)}
        row.fill_speedups()
        rows.append(row)
    rows.append(SuiteRow(dtype="bf16", variant="plain", causal=False, shape=Shape(B=1, H=32, N=16384, M=16384, D=64),
                         status="not built: bf16 on sm_75 is not implemented yet"))
    result = SuiteResult(gpu="h200", arch_path=path, kernel_arch="sm_90" if path == "sm_80" else "sm_75",
                         translation_target="h200" if path == "sm_80" else "t4", compile_arch="sm_90", rows=rows,
                         env={"gpu": "NVIDIA H200", "arch": "sm_90", "nvidia_driver": "580.1", "cuda_runtime": "13.0",
                              "nvcc": "13.0.48", "torch": "2.11.0", "cupy": "14.0", "git_commit": "abc123def4567890",
                              "date": "2026-01-02T00:00:00+00:00"},
                         settings={"min_time_s": 0.1, "flex": "off", "verify_cases": ["tails"]})
    result.summarize()
    return result


def test_speedups_and_summary():
    result = _result("sm_80", {512: 1.0, 1024: 4.0})
    rows = [r for r in result.rows if r.status == "timed"]
    assert rows[0].speedup == {"sdpa_flash": 2.0, "sdpa_cudnn": 1.0}  # baseline time / ours
    assert rows[1].speedup == {"sdpa_flash": 0.5, "sdpa_cudnn": 0.25}
    s = summarize(result.rows)
    assert s.rows == 3 and s.timed == 2
    assert math.isclose(s.geomean_speedup["sdpa_flash"], 1.0) and math.isclose(s.geomean_speedup["sdpa_cudnn"], 0.5)
    assert s.min_speedup["sdpa_cudnn"].value == 0.25 and "N=1024" in s.min_speedup["sdpa_cudnn"].shape
    assert s.compared == {"sdpa_flash": 2, "sdpa_cudnn": 2}


def test_first_round_drift_reads_each_kernels_first_round_against_its_later_ones():
    """Ours' first round 4 % slower than its later rounds on both shapes, cuDNN's level: the drift names ours alone
    (the card's clock at the start of a shape), and rows without round medians (older results) are left out."""
    result = _result("sm_80", {512: 1.0, 1024: 4.0})
    timed = [r for r in result.rows if r.status == "timed"]
    for row in timed:
        ms = row.ours.stats.median_ms
        row.ours.stats.round_medians_ms = [ms * 1.04, ms, ms * 0.99, ms * 1.01]
        row.baselines["sdpa_cudnn"].stats.round_medians_ms = [1.0, 1.0, 1.0, 1.0]
    drift = first_round_drift(result.rows)
    assert set(drift) == {"ours", "sdpa_cudnn"}  # FLASH has no round medians here
    assert math.isclose(drift["ours"], 1.04) and math.isclose(drift["sdpa_cudnn"], 1.0)
    assert "  first round / later rounds (geomean, > 1: the first slower): ours 1.040, CUDNN 1.000" in summary_lines(result)
    assert first_round_drift(_result("sm_80", {512: 1.0}).rows) == {}
    assert not any("first round" in line for line in summary_lines(_result("sm_80", {512: 1.0})))


def test_order_split_finds_the_row_whose_speedup_hangs_on_the_order_in_a_round():
    """Session 26's 16k case: cuDNN's speedup 0.95x in the rounds where ours ran first and 1.25x where it ran last
    on one row, level on the other: the split (0.95 / 1.25) names that row; FLASH, level on both rows, reads 1."""
    result = _result("sm_80", {512: 1.0, 1024: 4.0})
    short, long_row = [r for r in result.rows if r.status == "timed"]
    for row, cudnn_speedups in ((short, [1.0, 1.0, 1.0, 1.0]), (long_row, [0.95, 1.25, 0.95, 1.25])):
        ours = [3.0, 3.1, 3.2, 3.3]
        row.ours.stats.round_medians_ms = ours
        row.baselines["sdpa_cudnn"].stats.round_medians_ms = [o * x for o, x in zip(ours, cudnn_speedups)]
        row.baselines["sdpa_flash"].stats.round_medians_ms = [o * 2 for o in ours]
    split = order_split(result.rows)
    assert math.isclose(split["sdpa_cudnn"][0], 0.95 / 1.25) and "N=1024" in split["sdpa_cudnn"][1]
    assert math.isclose(split["sdpa_flash"][0], 1.0)
    line = next(x for x in summary_lines(result) if "ours first / last" in x)
    assert "CUDNN 0.760 at" in line and "N=1024" in line.partition("CUDNN")[2]
    assert order_split(_result("sm_80", {512: 1.0}).rows) == {}  # no round medians: nothing to read
    assert not any("ours first / last" in x for x in summary_lines(_result("sm_80", {512: 1.0})))


def test_report_renders_tables_summaries_and_the_path_ratio(tmp_path):
    a, b = tmp_path / "sm80.json", tmp_path / "sm75.json"
    a.write_text(_result("sm_80", {512: 1.0, 1024: 4.0}).model_dump_json())
    b.write_text(_result("sm_75", {512: 2.0, 1024: 8.0}).model_dump_json())
    doc = tmp_path / "docs" / "performance.md"
    done = runner.invoke(app, ["bench", "report", str(a), str(b), "--doc", str(doc)])
    assert done.exit_code == 0, done.output
    text = doc.read_text()
    assert "| × FLASH | × CUDNN |" in text and "ours TFLOP/s" in text
    assert "× X = X's time / ours" in text
    assert "| FLASH | 1.000 | 0.500 |" in text  # geomean and min vs FLASH on the sm_80 path
    assert "not built: bf16 on sm_75" in text
    assert "NVIDIA H200" in text and "driver 580.1" in text and "nvcc 13.0.48" in text and "commit abc123def456" in text
    assert "sm_75 path beside the sm_80 path" in text and "Geomean ratio over 2 shapes: 0.500" in text
    assert "geomean 1.000" in done.output  # the terminal summary
    one = render_markdown([SuiteResult.model_validate_json(a.read_text())])
    assert one.count("| fp16 | 64 | plain |") == 2 and "path beside" not in one  # one row per timed shape


def test_report_of_a_file_that_is_not_a_suite_result(tmp_path):
    bad = tmp_path / "bench.json"
    bad.write_text(json.dumps({"entries": []}))
    done = runner.invoke(app, ["bench", "report", str(bad)])
    assert done.exit_code != 0 and "not a suite result" in str(done.exception)
    done = runner.invoke(app, ["bench", "report"])
    assert done.exit_code != 0 and "give suite result files" in str(done.exception)


def test_suite_without_a_gpu_is_one_line(tmp_path):
    import subprocess
    import sys

    from flashgen.harness.worker import have_gpu

    if have_gpu():
        pytest.skip("a GPU is present")
    proc = subprocess.run([sys.executable, "-c", "from flashgen.cli import main; main()", "bench", "--suite", "fa2",
                           "--gpu", "h200", "--out", str(tmp_path / "r.json")], capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "no CUDA GPU" in proc.stderr and "--compile-only" in proc.stderr


@pytest.mark.skipif(shutil.which("nvcc") is None and not __import__("os").path.exists("/usr/local/cuda/bin/nvcc"),
                    reason="needs nvcc")
def test_compile_only_builds_and_compiles_two_kernels(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(tmp_path / "cache"))
    done = runner.invoke(app, ["bench", "--suite", "fa2", "--gpu", "h200", "--compile-only", "--select", "fp16,d64",
                               "--jobs", "2"])
    assert done.exit_code == 0, done.output
    assert done.output.count("sm_90") >= 2 and "plain" in done.output and "causal" in done.output
    assert len(list((tmp_path / "cache").rglob("*.cubin"))) == 2
    bad = runner.invoke(app, ["bench", "--suite", "fa2", "--compile-only", "--select", "fp16,d64"])
    assert bad.exit_code != 0 and "--gpu" in str(bad.exception)


def test_run_suite_orchestration_with_a_fake_worker(tmp_path, monkeypatch):
    """The GPU steps replaced by a fake worker: verify on the small case set, one bench call per kernel
    with its shapes and the flex mode, rows filled, speedups and the JSON written."""
    from flashgen.harness import suite as suite_mod
    from flashgen.harness import worker as worker_mod
    from flashgen.harness.bench import BenchReport
    from flashgen.harness.verify import VerifyReport

    calls = []

    class FakeWorker:
        def __init__(self, job_timeout_s=None):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def verify(self, kernel, cases=None, seed=None, timeout_s=None):
            calls.append(("verify", kernel.manifest.name, [c.name for c in cases]))
            return VerifyReport(ok=True, kernel=kernel.manifest.name, seed=7, summary="PASS")

        def call(self, target, timeout_s=None, **kwargs):
            calls.append(("call", target, kwargs))
            if target.endswith("environment_info"):
                return worker_mod.JobResult(ok=True, kind="call", value={"gpu": "NVIDIA H200", "arch": "sm_90"})
            entries = []
            for shape in kwargs["shapes"]:
                man = kwargs["kernels"][0].manifest
                entries.append(_entry(man.name, "kernel", shape, True, 1.0).model_copy(update={"dtype": "fp16"}))
                entries.append(_entry("sdpa_flash", "baseline", shape, True, 1.5))
            return worker_mod.JobResult(ok=True, kind="call", value=BenchReport(entries=entries, target="h200"))

    def fake_compile(kernels, arch, jobs=None):
        for k in kernels:
            if k.source is not None:
                k.compile = {"arch": arch, "ok": True, "resources": {}, "spills": False}

    monkeypatch.setattr(worker_mod, "have_gpu", lambda: True)
    monkeypatch.setattr(worker_mod, "device_arch", lambda device=None: "sm_90")
    monkeypatch.setattr(worker_mod, "GpuWorker", FakeWorker)
    monkeypatch.setattr(suite_mod, "compile_suite_kernels", fake_compile)
    out = tmp_path / "r.json"
    result = suite_mod.run_suite("h200", arch_path="sm_75", select="fp16,causal,d64", flex="off", out=out)
    assert [c[0] for c in calls] == ["call", "verify", "call"]
    # the quick cases this kernel has (the sm_75 path's grid is one CTA a tile: no persistent_walk)
    assert calls[1][2] == ["tails", "n_gt_m", "large_magnitude"]
    assert calls[2][2]["flex"] == "off" and len(calls[2][2]["shapes"]) == 6
    assert result.arch_path == "sm_75" and result.kernel_arch == "sm_75" and result.compile_arch == "sm_90"
    assert all(r.status == "timed" and math.isclose(r.speedup["sdpa_flash"], 1.5) for r in result.rows)
    assert all(set(r.roofline_other) == {"t4", "rtx8000"} and r.roofline_other["t4"]["tflops"] > 0 for r in result.rows)
    assert math.isclose(result.summary.geomean_speedup["sdpa_flash"], 1.5) and result.summary.timed == 6
    saved = SuiteResult.model_validate_json(out.read_text())
    assert saved.summary == result.summary and saved.settings["verify_cases"] == list(QUICK_CASES)
    assert saved.kernels[0].verify["ok"] and saved.env["gpu"] == "NVIDIA H200" and "nvcc" in saved.env
    assert "| t4 roof TFLOP/s | rtx8000 roof TFLOP/s |" in render_markdown([saved])


def test_git_commit_prefers_the_commit_it_is_told(monkeypatch):
    # a copied tree (a lent GPU) can carry a stale .git: the caller's FLASHGEN_GIT_COMMIT names what runs
    from flashgen.harness.suite import git_commit

    monkeypatch.setenv("FLASHGEN_GIT_COMMIT", "857e8f5")
    assert git_commit() == "857e8f5"
    monkeypatch.delenv("FLASHGEN_GIT_COMMIT")
    found = git_commit()
    assert found is None or found.split("+")[0].isalnum()


def test_the_mods_benchmark_times_in_rounds_with_the_plain_kernel_first_then_last(monkeypatch):
    """bench_mods: MOD_ROUNDS rounds, each timing every kernel once, the plain kernel first in one round and last
    in the next; a kernel's ratio is the median of the rounds' ratios against the plain kernel of the same round.
    The fake card times its first kernel of a call 10 % fast (a clock that drops once the card warms up): timed
    first every round, the plain kernel would make every ratio 10 % low; alternated, the median is the true one."""
    from types import SimpleNamespace

    from flashgen.harness import suite as suite_mod
    from flashgen.harness import worker as worker_mod

    true_ms = {"plain": 1.0, "score_cos": 1.25}
    calls: list[list[str]] = []

    def label(kernel):
        return "score_cos" if "0.25f * fg::cos_approx" in kernel.source else "plain"

    class FakeWorker:
        def __init__(self, **_kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def verify(self, kernel, timeout_s):
            return SimpleNamespace(ok=True, summary="PASS (fake)")

        def call(self, _fn, timeout_s, kernels, **_kwargs):
            names = [label(k) for k in kernels]
            calls.append(names)
            entries = [SimpleNamespace(kind="kernel", ok=True, error=None,
                                       stats=SimpleNamespace(median_ms=true_ms[n] * (0.9 if i == 0 else 1.0)))
                       for i, n in enumerate(names)]
            return SimpleNamespace(ok=True, error=None, value=SimpleNamespace(entries=entries))

    monkeypatch.setattr(worker_mod, "GpuWorker", FakeWorker)
    (row,) = suite_mod.bench_mods("h200", names=["score_cos"])
    assert row.ok and row.verified == "PASS (fake)", row.error
    assert calls == [["plain", "score_cos"], ["score_cos", "plain"]] * (suite_mod.MOD_ROUNDS // 2)
    assert len(row.round_ratios) == suite_mod.MOD_ROUNDS
    assert sorted({round(r, 4) for r in row.round_ratios}) == [round(0.8 * 0.9, 4), round(0.8 / 0.9, 4)]
    assert math.isclose(row.ratio, (0.8 * 0.9 + 0.8 / 0.9) / 2) and abs(row.ratio - 0.8) < 0.01
    assert math.isclose(row.ms, (1.25 * 0.9 + 1.25) / 2) and math.isclose(row.plain_ms, (0.9 + 1.0) / 2)
