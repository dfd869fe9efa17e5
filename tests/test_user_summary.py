"""Issue 15, item 5 (what the user sees): `flashgen generate` ends with one summary (verified on what, each baseline's
time with the ratio, the candidate kept and why, where the files are), --json stays one JSON object; a budget too
small to make a kernel is refused before any model call; `flashgen bench`'s table fits an 80-column terminal or a
log."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

sys.path.insert(0, str(Path(__file__).parent))
from loopback.fakes import make_store

import flashgen
from flashgen.agent.environment import Environment, Timing, Verification
from flashgen.agent.loop import MIN_MODEL_CALLS
from flashgen.agent.outputs import FILES
from flashgen.agent.summary import NO_GPU, summary_text
from flashgen.errors import UsageError
from flashgen.harness.bench import BenchEntry, BenchReport, TimingStats
from flashgen.harness.bench_tables import print_bench, print_compiled
from flashgen.harness.suite import SuiteKernel
from flashgen.variant import Shape

GENERATE = ("generate", "--gpu", "a100", "--head-dim", "64", "--causal")


def cli(*args, home):
    # CUDA_VISIBLE_DEVICES="": the run takes the no-GPU path on any machine (compiled and estimated)
    env = {**os.environ, "FLASHGEN_HOME": str(home), "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, "-m", "flashgen", *args], capture_output=True, text=True, timeout=300,
                          env=env, cwd=Path(home).parent)


# ------------------------------------------------------------------------------------------------ the summary


def test_a_real_expert_run_ends_in_one_summary_compiled_and_estimated(tmp_path):
    home, out = tmp_path / "home", tmp_path / "[bold]k[/]"  # user text: printed as it is, never read as markup
    # the smallest budget that makes a kernel is enough, and the default provider (expert) is used
    done = cli(*GENERATE, "--max-iters", str(MIN_MODEL_CALLS), "--out", str(out), home=home)
    assert done.returncode == 0, done.stderr
    meta = json.loads((out / "meta.json").read_text())
    lines = done.stdout.splitlines()
    assert lines[0] == f"flashgen generate: done ({meta['generation']['reason']})"
    by_label = {line.split()[0]: line for line in lines[1:]}
    assert list(by_label) == ["run", "kernel", "verified", "timing", "estimate", "kept", "files"], done.stdout
    assert by_label["run"].endswith(f"1: {MIN_MODEL_CALLS} model calls to expert (expert-rules)")
    assert f"{meta['kernel']} for NVIDIA A100 SXM4 80GB (sm_80)" in by_label["kernel"]
    assert by_label["verified"].split(None, 1)[1].startswith(f"no: {NO_GPU} (")
    assert "not measured" in by_label["timing"] and "(no GPU)" in by_label["timing"]
    roof = meta["roofline"]
    assert f"{roof['time_s'] * 1e3:.3g} ms at {roof['shape']} ({roof['bound']}-bound" in by_label["estimate"]
    assert f"from model call {MIN_MODEL_CALLS}" in by_label["kept"] and "first candidate that compiled" in by_label["kept"]
    assert by_label["files"].split(None, 1)[1] == f"{out}/  " + ", ".join(FILES)
    assert all((out / name).is_file() for name in FILES)
    # one summary, on stdout: none of the old end lines, nothing of it among the progress on stderr
    assert "wrote" not in done.stdout and "verification did not run" not in done.stdout
    assert "flashgen generate:" not in done.stderr and "[1] sketch: asking expert" in done.stderr


def test_json_stays_one_object_with_the_summary_as_a_field(tmp_path):
    home, out = tmp_path / "home", tmp_path / "k"
    done = cli(*GENERATE, "--out", str(out), "--json", home=home)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)  # the whole of stdout is the one JSON object
    assert {"run_id", "out", "kernel", "verified", "meta", "summary"} <= set(result)
    summary = result["summary"]
    assert summary["verified"] is None and summary["verified_on"] == NO_GPU and summary["baselines"] == []
    assert summary["out_dir"] == str(out) and summary["files"] == list(FILES) and summary["kernel"] == result["kernel"]
    assert summary["candidates_compiled"] == 1 and summary["model_calls"] == result["meta"]["generation"]["model_calls"]
    assert "flashgen generate:" not in done.stderr and "{" not in done.stderr


class TimedOnAGpu(Environment):
    """The real layers (TL checks, translator, nvcc) with the GPU stages answered: every kernel verifies, the first
    times at 0.90 ms and the next at 0.70 ms, beside FLASH at 1.40 ms and CUDNN at 0.805 ms."""

    TIMES_MS = [0.90, 0.70]
    BASELINES_MS = {"sdpa_flash": 1.40, "sdpa_cudnn": 0.805}

    def __init__(self):
        self.timed = 0

    def gpu_available(self) -> bool:
        return True

    def gpu_name(self) -> str | None:
        return "NVIDIA H200"

    def verify(self, source, manifest, build) -> Verification:
        return Verification(ran=True, ok=True, summary=f"PASS {manifest.name} (fp16, causal): 12/12 cases pass\n  ok ...")

    def bench(self, source, manifest, build, target) -> Timing:
        ms = self.TIMES_MS[min(self.timed, len(self.TIMES_MS) - 1)]
        self.timed += 1
        return Timing(ran=True, shape="B=4,H=16,N=4096,M=4096,D=64", time_ms=ms, tflops=100.0 / ms,
                      baselines_ms=dict(self.BASELINES_MS))


def test_a_gpu_run_shows_each_baseline_with_its_ratio_and_why_the_candidate_was_kept(tmp_path):
    out = tmp_path / "k"
    env = TimedOnAGpu()
    # the expert's first program is slower than CUDNN (0.805 / 0.90 = 0.89x), so it writes a second: 1.15x, done
    kernel = flashgen.generate(gpu="a100", dtype="fp16", head_dim=64, causal=True, out=out, env=env,
                               store=make_store(tmp_path))
    s = kernel.summary
    assert env.timed == 2 and s.candidates_compiled == 2 and s.candidates_verified == 2
    assert s.verified is True and s.verified_on == "NVIDIA H200" and s.time_ms == 0.70
    assert [(b.label, b.time_ms, round(b.ratio, 4)) for b in s.baselines] == [("FLASH", 1.40, 2.0), ("CUDNN", 0.805, 1.15)]
    text = summary_text(s)
    words = [" ".join(line.split()) for line in text.splitlines()]
    assert "verified  yes, on NVIDIA H200: PASS fg_attn_fwd_causal_fp16_d64_sm_80 (fp16, causal): 12/12 cases pass" in text
    assert "ours 0.7 ms at B=4,H=16,N=4096,M=4096,D=64, 142.9 TFLOP/s" in text
    assert "FLASH 1.4 ms 2.00x" in words and "CUDNN 0.805 ms 1.15x" in words
    assert "baseline time / ours: above 1, ours is faster" in text
    assert f"kept      the fastest of 2 verified candidates (2 compiled), from model call {s.model_calls}" in text
    assert f"files     {out}/  " + ", ".join(FILES) in text
    assert json.loads(kernel.summary.model_dump_json())["baselines"][1]["ratio"] == pytest.approx(0.805 / 0.70)


class FunctionsTimedOnAGpu(TimedOnAGpu):
    """As TimedOnAGpu, but the timing goes through the real BenchReport -> Timing step with the run's functions
    (flashgen.harness.environment): ours OURS_MS in turn, CUDNN 0.6 ms, and the plain twin (the second kernel entry,
    under the same name) timed so that our TF/s is OURS_OVER_PLAIN[i] of its."""

    OURS_MS = [0.5]
    OURS_OVER_PLAIN = [0.9]

    def bench(self, source, manifest, build, target, mods=None) -> Timing:
        from flashgen.harness.bench import timing_stats
        from flashgen.harness.environment import _mask_share, _timing_from

        assert mods is not None  # a run with functions hands them to the timing
        i = min(self.timed, len(self.OURS_MS) - 1)
        self.timed += 1
        shape = Shape(B=4, H=16, N=4096, M=4096, D=manifest.head_dim)
        share = _mask_share(mods, manifest, shape)
        ours = self.OURS_MS[i]
        plain = ours * self.OURS_OVER_PLAIN[i] / (1.0 if share is None else share)  # its TF/s: all the pairs
        common = dict(dtype=manifest.dtype.value, variant=manifest.variant.name, shape=shape)
        report = BenchReport(entries=[
            BenchEntry(name=manifest.name, kind="kernel", ok=True, stats=timing_stats([ours] * 3), **common),
            BenchEntry(name="sdpa_cudnn", kind="baseline", ok=True, stats=timing_stats([0.6] * 3), **common),
            BenchEntry(name=manifest.name, kind="kernel", ok=True, stats=timing_stats([plain] * 3), **common)])
        return _timing_from(report, shape, manifest, share)


def test_a_mask_functions_run_reports_visible_work_and_that_the_baselines_compute_other_work(tmp_path):
    out = tmp_path / "k"
    kernel = flashgen.generate(gpu="a100", dtype="fp16", head_dim=64, mask_mod="k_idx < LEN[b]",
                               tensors={"LEN": "int32[B]:0..M"}, out=out, env=FunctionsTimedOnAGpu(),
                               store=make_store(tmp_path))
    s = kernel.summary
    assert s.visible_share is not None and 0 < s.visible_share < 1
    assert s.tflops == pytest.approx(4 * 4 * 16 * 64 * 4096 * 4096 * s.visible_share / 0.5e-3 / 1e12)
    # at 0.9x the plain kernel's TF/s (goal 0.85x) the run is done with its first kernel, though CUDNN's time,
    # for all the pairs, is not what it is held to
    assert s.plain_ratio == pytest.approx(0.9) and s.model_calls == MIN_MODEL_CALLS
    assert s.reason == "correct, 0.90x the TF/s of flashgen's kernel without the functions"
    text = " ".join(summary_text(s).split())
    assert f"TFLOP/s over the {s.visible_share:.0%} of the pairs its mask leaves" in text
    assert "baselines compute the variant's attention without this kernel's own functions" in text
    assert f"flashgen's kernel without the functions {s.plain_ms:.4g} ms: ours at 0.90x its TF/s" in text
    report = (out / "report.md").read_text()
    assert "of the pairs its mask leaves; baselines: sdpa_cudnn 0.6 ms (the baselines compute" in report
    assert "Beside flashgen's kernel without the functions: " in report and "ours at 0.90x its TF/s" in report


class SlowScoreFirst(FunctionsTimedOnAGpu):
    OURS_MS = [0.8, 0.55]
    OURS_OVER_PLAIN = [0.6, 0.91]


def test_a_score_functions_run_asks_for_speed_against_the_plain_kernel_until_it_reaches_the_goal(tmp_path):
    env, store = SlowScoreFirst(), make_store(tmp_path)
    kernel = flashgen.generate(gpu="a100", dtype="fp16", head_dim=64, score_mod="s + 0.25 * cos(k_idx)",
                               out=tmp_path / "k", env=env, store=store)
    s = kernel.summary
    # 0.60x the plain kernel's TF/s is below the goal (CUDNN's 0.6 ms against ours 0.8 would be too): one repair
    assert env.timed == 2 and s.candidates_verified == 2 and s.plain_ratio == pytest.approx(0.91)
    assert s.reason == "correct, 0.91x the TF/s of flashgen's kernel without the functions"
    assert s.visible_share is None  # a score function leaves every pair
    # the speed repair's prompt names the goal and the plain kernel's time, beside CUDNN's and what it computes
    recorded = " ".join(json.dumps([event.payload for event in store.events(s.run_id)]).split())
    assert "slower than the goal (0.85x the TF/s of flashgen's kernel without the functions)" in recorded
    assert "sdpa_cudnn 0.6 ms (computes the variant without your functions); flashgen's kernel without" in recorded


# ------------------------------------------------------------------------------------------------ the budget


@pytest.mark.parametrize("iters", range(1, MIN_MODEL_CALLS))
def test_a_budget_too_small_to_make_a_kernel_is_refused_up_front(iters, tmp_path):
    home, out = tmp_path / "home", tmp_path / "k"
    done = cli(*GENERATE, "--max-iters", str(iters), "--out", str(out), home=home)
    assert done.returncode == 2 and done.stdout == ""
    (line,) = [line for line in done.stderr.splitlines() if line.strip()]
    assert line == (f"error: --max-iters {iters}: too small to make a kernel, which takes at least {MIN_MODEL_CALLS} "
                    f"model calls (one per phase: sketch, params, translate); give {MIN_MODEL_CALLS} or more")
    assert not out.exists()
    listed = cli("runs", "list", "--json", home=home)
    assert json.loads(listed.stdout) == []  # no run started, so no model was asked


def test_the_api_refuses_the_same_budget_before_any_model_call(tmp_path, monkeypatch):
    from flashgen.agent.expert import ExpertProvider

    asked = []
    monkeypatch.setattr(ExpertProvider, "complete", lambda self, request: asked.append(request.stage))
    store = make_store(tmp_path)
    with pytest.raises(UsageError) as refused:
        flashgen.generate(gpu="a100", head_dim=64, max_iters=MIN_MODEL_CALLS - 1, out=tmp_path / "k", store=store)
    assert str(refused.value).startswith(f"max_iters={MIN_MODEL_CALLS - 1}: too small to make a kernel, which takes "
                                         f"at least {MIN_MODEL_CALLS} model calls")
    assert asked == [] and store.runs() == [] and not (tmp_path / "k").exists()


# ------------------------------------------------------------------------------------------------ the bench table

KERNEL = "fg_attn_fwd_causal_window256_alibi_softcap30_lse_fp16_d128_sm_90"  # a long name: wider than its column
SHAPES = [Shape(B=4, H=16, N=n, M=n, D=128) for n in (512, 1024, 2048, 4096, 8192, 16384)]


def _stats(ms: float, undertimed: bool = False) -> TimingStats:
    return TimingStats(median_ms=ms, q1_ms=ms * 0.98, q3_ms=ms * 1.03, min_ms=ms * 0.97, mean_ms=ms, reps=40,
                       undertimed=undertimed, note="host time per call far above the events' median" if undertimed else "")


def _report() -> BenchReport:
    entries = []
    for i, shape in enumerate(SHAPES):
        ours = 0.1 * 2 ** i
        common = dict(dtype="fp16", variant="causal_window256", shape=shape)
        entries += [
            BenchEntry(name=KERNEL, kind="kernel", ok=True, stats=_stats(ours), tflops=400.0, roofline_pct=55.0, **common),
            BenchEntry(name="sdpa_cudnn", kind="baseline", ok=True, stats=_stats(ours * 0.9), tflops=444.4, **common),
            BenchEntry(name="flex", kind="baseline", ok=True, stats=_stats(ours * 1.7, undertimed=i == 0), tflops=235.3,
                       **common),
            BenchEntry(name="sdpa_flash", kind="baseline", ok=False, **common,
                       skipped="FlashAttention-2 in torch SDPA supports neither ALiBi nor a softcap, so it is not timed"),
        ]
    return BenchReport(env={"gpu": "NVIDIA H200"}, target="h200", entries=entries)


def _rendered(print_table, what, width: int, terminal: bool) -> str:
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, force_terminal=terminal, markup=False, highlight=False, soft_wrap=True)
    print_table(what, console)
    return buffer.getvalue()


def test_the_bench_table_fits_80_columns_with_every_shape_and_ratio():
    report = _report()
    text = _rendered(print_bench, report, 80, terminal=False)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, "\n".join(line for line in lines if len(line) > 80)
    for shape in SHAPES:
        assert f"fp16 causal_window256 B=4,H=16,N={shape.N},M={shape.N},D=128" in lines
    rows = [line.split() for line in lines]
    assert sum(row[0] == "sdpa_cudnn" and row[-1] == "0.90" for row in rows if row) == len(SHAPES)
    assert sum(row[0] == "flex" and row[-1] == "1.70" for row in rows if row) == len(SHAPES)
    assert text.count(KERNEL) == len(SHAPES) and text.count("sdpa_flash") == len(SHAPES)
    assert "FlashAttention-2 in torch SDPA supports neither ALiBi nor a softcap" in " ".join(text.split())
    assert "UNDERTIMED: host time per call far above the events' median" in text
    assert "× = this row's time / ours (> 1: ours is faster)" in text
    assert "┃" not in text and "\x1b" not in text  # no box, no colour codes in a log


def test_the_bench_table_keeps_every_column_where_a_terminal_is_wide_enough():
    report = _report()
    narrow = _rendered(print_bench, report, 80, terminal=True)
    assert "┃" not in narrow and "fp16 causal_window256 B=4,H=16,N=512,M=512,D=128" in narrow
    wide = _rendered(print_bench, report, 400, terminal=True)
    assert "┃" in wide and "IQR ms" in wide and KERNEL in wide


def test_the_compile_only_table_fits_80_columns():
    kernels = [SuiteKernel(dtype="bf16", variant=variant, causal=variant == "causal", head_dim=d, arch="sm_90",
                           compile={"arch": "sm_90a", "seconds": 12.5, "resources": {"k": {
                               "registers": 168, "shared_static_bytes": 0, "spill_store_bytes": 0,
                               "spill_load_bytes": 0}}})
               for variant in ("plain", "causal") for d in (64, 128, 256)]
    kernels.append(SuiteKernel(dtype="fp16", variant="causal", causal=True, head_dim=256, arch="sm_80",
                               build_error="the translator's sm80 path does not fit head dim 256 in shared memory "
                                           "with BLOCK_M=128, BLOCK_N=128 and two stages"))
    text = _rendered(print_compiled, kernels, 80, terminal=False)
    assert max(len(line) for line in text.splitlines()) <= 80
    assert text.count("168 regs") == 6 and "fp16 causal d256" in text and "does not fit head dim 256" in text
