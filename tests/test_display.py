"""The Jupyter displays (issue 17) show what they must: each one's HTML is read for its content, not only rendered."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from loopback.fakes import FakeEnvironment, cuda_reply, fenced, full_tl, make_store, sketch_tl

from flashgen import explore
from flashgen.api import Kernel
from flashgen.harness.bench import BenchEntry, BenchReport, TimingStats
from flashgen.harness.suite import load_results
from flashgen.targets import TARGETS, get_target
from flashgen.tl_spec import library
from flashgen.variant import Shape, Variant

ROOT = Path(__file__).resolve().parents[1]
H200_CAUSAL = ROOT / "generated/h200/bf16/causal_d128"
SCORE_LINE = "Compute S_r = S_r - log2e * 0.5 * log(1 + abs(q_idx + M - N - k_idx))"
SCALE_LINE = "Compute S_r = S_r * (scale * log2e)"


def _kernel(**meta_changes) -> Kernel:
    files = explore.load(H200_CAUSAL)
    meta = {**files.meta, **meta_changes}
    return Kernel(tl=files.tl, sketch=files.sketch, source=files.source, manifest=files.manifest, report=files.report,
                  meta=meta, run_id="7")


# ---------------------------------------------------------------------------------------------- a kernel

def test_kernel_html_shows_its_tl_cuda_verification_and_resources():
    kernel = _kernel()
    html = kernel._repr_html_()
    assert "Sketch TL" in html and "Full TL" in html and "CUDA (" in html
    for text in ("Role", "producer", "OnlineSoftmax", "fg_attn_fwd_causal_bf16_d128_sm_90", "__global__"):
        assert text in html
    assert 'data-language="llm-tl"' in html and 'data-language="cuda"' in html
    assert "not run on a GPU" in html  # the committed kernels were made without a GPU
    usage = kernel.meta["resources"]["fg_attn_fwd_causal_bf16_d128_sm_90"]
    assert f"<td class=\"num\">{usage['registers']}</td>" in html
    assert "0 B stored, 0 B loaded" in html  # spills
    assert str(kernel.manifest.launches[0].smem_bytes) in html  # dynamic shared memory
    assert "tensor-bound" in html and "explore.trace(kernel)" in html
    assert repr(kernel) == "Kernel(fg_attn_fwd_causal_bf16_d128_sm_90, sm_90a, bf16, d=128, verified=None)"


def test_kernel_html_shows_a_failed_verification_spills_and_timings():
    name = "fg_attn_fwd_causal_bf16_d128_sm_90"
    kernel = _kernel(verification={"ran": True, "ok": False, "summary": "FAIL 1/3 cases\n  FAIL tails: rel err 0.5"},
                     resources={name: {"registers": 255, "shared_static_bytes": 0, "spill_store_bytes": 96,
                                       "spill_load_bytes": 80, "stack_frame_bytes": 96}},
                     timings={"shape": "B=4,H=16,N=4096,M=4096,D=128", "time_ms": 1.5,
                              "baselines_ms": {"sdpa_cudnn": 1.2, "sdpa_flash": 3.0}})
    html = kernel._repr_html_()
    assert "verification FAILED" in html and "FAIL tails: rel err 0.5" in html
    assert "96 B stored, 80 B loaded" in html and 'class="fg-bad"' in html
    assert "0.8x" in html and "2x" in html and "B=4,H=16,N=4096,M=4096,D=128" in html


def test_a_committed_kernel_folder_reads_back_and_compares():
    a, b = explore.load(H200_CAUSAL), explore.load(ROOT / "generated/h200/bf16/plain_d128")
    html = explore.compare(a, b)._repr_html_()
    assert a.manifest.name in html and b.manifest.name in html
    assert "Variant softmax causal" in html and "TL difference" in html
    assert "-Variant softmax causal" in html and "+Variant softmax" in html  # the diff, line by line
    with pytest.raises(Exception, match="not a generated kernel folder"):
        explore.load(ROOT / "generated")


# ---------------------------------------------------------------------------------------------- LLM-TL highlighting

def test_the_tl_lexer_takes_its_words_from_the_language(monkeypatch):
    from pygments.token import Error, Keyword, Name

    from flashgen import operators
    from flashgen.tl_spec import highlight, parser

    words = highlight.words()
    assert words["statements"] == parser.KEYWORDS
    assert set(words["functions"]) == {f.name for f in operators.FUNCTIONS.values()}
    assert {"from", "to", "shape", "dtype", "async", "stage", "rescale"} <= set(words["reserved"])
    texts = [library.load(name, form) for name in library.PROGRAMS for form in ("full", "sketch")]
    texts.append(library.render(Variant(causal=True), dtype="bf16", arch="sm_90", head_dim=128))
    for text in texts:
        tokens = list(highlight.lexer().get_tokens(text))
        assert not [v for t, v in tokens if t is Error]
        first_words = {line.split()[0] for line in text.splitlines() if line.strip()} & set(parser.KEYWORDS)
        assert first_words and first_words == {v for t, v in tokens if t is Keyword}  # every statement's keyword
    tokens = dict((v, t) for t, v in highlight.lexer().get_tokens("Compute S_r = where(k_idx < M, S_r, -inf)"))
    assert tokens["where"] is Name.Builtin and tokens["k_idx"] is Name.Constant
    # a statement the parser gains is highlighted with no second list to edit
    monkeypatch.setattr(parser, "KEYWORDS", parser.KEYWORDS + ("Prefetch",))
    highlight.words.cache_clear()
    highlight.lexer_class.cache_clear()
    try:
        assert dict((v, t) for t, v in highlight.lexer().get_tokens("Prefetch K_s"))["Prefetch"] is Keyword
    finally:
        highlight.words.cache_clear()
        highlight.lexer_class.cache_clear()


# ---------------------------------------------------------------------------------------------- benchmarks

def test_the_suite_plot_has_one_series_per_implementation_and_panel_and_the_ratios():
    path = explore.newest_result()
    result = load_results([str(path)])[0]
    html = result._repr_html_()
    panels = sorted({(r.dtype, r.variant, r.shape.D) for r in result.rows})
    assert len(panels) == 12
    impls = ("flashgen", "FLASH", "CUDNN", "EFFICIENT", "Flex")
    for i in range(len(panels)):
        for impl in impls:
            assert html.count(f'id="series-{impl}-{i}"') == 1
    assert html.count('id="series-') == len(panels) * len(impls)
    for dtype, variant, d in panels:
        assert f"{dtype} {variant} d{d}</text>" in html  # each panel's title, as SVG text
    # the ratio of each panel: the geomean of baseline time / ours over its N, as the suite's rows give it
    rows = [r for r in result.rows if (r.dtype, r.variant, r.shape.D) == ("bf16", "causal", 64)]
    cudnn = math.exp(sum(math.log(r.speedup["sdpa_cudnn"]) for r in rows) / len(rows))
    assert f"{cudnn:.2f}x</b>" in html
    assert f"CUDNN {result.summary.geomean_speedup['sdpa_cudnn']:.2f}x" in html
    assert "x CUDNN" in html and json.loads(path.read_text())["env"]["gpu"] in html  # the card it ran on
    timed = sum(r.status == "timed" for r in result.rows)
    assert repr(result) == str(result) == f"SuiteResult(hopper on h200, sm_90 path, {timed}/{len(result.rows)} shapes timed)"


def _entry(name, kind, n, ms, ok=True, error=None):
    shape = Shape(B=2, H=8, N=n, M=n, D=64)
    stats = TimingStats(median_ms=ms, q1_ms=ms, q3_ms=ms, min_ms=ms, mean_ms=ms, reps=10) if ok else None
    return BenchEntry(name=name, kind=kind, dtype="fp16", variant="causal", shape=shape, ok=ok, stats=stats,
                      tflops=1.0 / ms if ok else None, error=error)


def test_a_bench_report_plots_each_kernel_and_baseline_and_lists_failures():
    report = BenchReport(target="a100", entries=[
        _entry("fg_mine", "kernel", 512, 0.5), _entry("fg_mine", "kernel", 1024, 1.0),
        _entry("sdpa_flash", "baseline", 512, 1.0), _entry("sdpa_flash", "baseline", 1024, 1.5),
        _entry("fg_other", "kernel", 512, 1.0, ok=False, error="launch failed: too many resources")])
    html = report._repr_html_()
    assert 'id="series-fg_mine-0"' in html and 'id="series-FLASH-0"' in html
    assert f"{math.sqrt(2.0 * 1.5):.2f}x</b>" in html  # geomean of 1.0/0.5 and 1.5/1.0
    assert "1 not timed" in html and "launch failed: too many resources" in html
    assert repr(report) == "BenchReport(a100, 5 entries, kernels fg_mine, fg_other)"


# ---------------------------------------------------------------------------------------------- a parameter search

def test_the_recorded_search_is_a_heat_map_of_tflops_beside_the_model():
    sweep = explore.sweep(run=False)
    html = sweep._repr_html_()
    assert 'id="heat-tflops"' in html and 'id="heat-model"' in html
    winner = sweep.result.winner_label
    assert winner in html and "winner" in html
    best = max(t for t in (explore.hd.candidate_tflops(sweep.result, c) for c in sweep.result.candidates) if t)
    assert f">{best:.0f}</text>" in html  # the best cell's TF/s, written in it
    assert "budget</text>" in html  # cells that were not reached say why
    assert "recorded on a GPU" in html and "dropped, and why" in html


def test_the_cpu_screen_shows_the_model_and_the_drops():
    html = explore.screen("h200", "bf16", 128)._repr_html_()
    assert 'id="heat-model"' in html and 'id="heat-tflops"' not in html
    assert "passed the CPU filters" in html and "nothing compiled or timed" in html


# ---------------------------------------------------------------------------------------------- a run's trace

def test_the_trace_shows_every_step_with_its_feedback_and_cost(tmp_path):
    from flashgen.agent.loop import LoopConfig, run_loop
    from flashgen.agent.providers import ScriptedProvider, Task
    from flashgen.variant import DType

    store = make_store(tmp_path)
    task = Task(variant=Variant(causal=True), target="a100", arch="sm_80", dtype=DType.fp16, head_dim=64)
    replies = [fenced("tl", sketch_tl()), fenced("tl", full_tl()), cuda_reply("COMPILE_ERROR;"), cuda_reply()]
    result = run_loop(LoopConfig(task=task), ScriptedProvider(replies, tokens_per_reply=100, cost_per_reply=0.01),
                      env=FakeEnvironment(), store=store)
    trace = explore.trace(result.run_id, store=store)
    html = trace._repr_html_()
    assert html.count("<tr") == 1 + 4  # the header and one row per model call
    assert html.count('class="fg-bad"') == 1  # the compile error, marked
    assert "repair_compile" in html and "identifier &quot;COMPILE_ERROR&quot; is undefined" in html
    assert "feedback (repair_compile)" in html  # what was asked next: the feedback
    assert "100 in + 100 out" in html and "$0.0100" in html and "$0.0400" in html
    assert "4 steps, 1 not accepted" in html and "a100 (sm_80)" in html
    assert repr(trace) == f"Trace(run {result.run_id}, done, 4 steps)"
    with pytest.raises(Exception, match="no run in the record"):
        explore.trace(explore.load(H200_CAUSAL))


# ---------------------------------------------------------------------------------------------- targets, library

def test_a_target_shows_its_limits_and_prints_short():
    h200 = get_target("h200")
    assert repr(h200) == str(h200) == "Target(h200: NVIDIA H200 SXM 141GB, sm_90, 132 SMs)"
    html = h200._repr_html_()
    for text in ("132", "227 KiB per block", "60 MiB", "bf16 989.5", "TMA", "wgmma", "4800 GB/s"):
        assert text in html, text
    table = explore.targets()._repr_html_()
    assert all(f"<td>{name}</td>" in table for name in TARGETS)


def test_the_library_index_lists_every_kernel_and_marks_failures(tmp_path):
    committed = explore.library(ROOT / "generated")
    assert len(committed.entries) == len(list((ROOT / "generated").glob("*/*/*/meta.json")))
    html = committed._repr_html_()
    assert all(f"<td>{gpu}</td>" in html for gpu in ("t4", "rtx8000", "a100", "h100", "h200"))
    assert "compiled, not run" in html
    assert "<td>168</td>" in html  # registers, from each kernel's meta.json
    (tmp_path / "library.json").write_text(json.dumps({"entries": [  # flashgen.library.index.IndexEntry's fields
        {"path": "h200/bf16/causal_d128", "target": "h200", "dtype": "bf16", "variant": "causal", "head_dim": 128,
         "status": "ok", "backend": "sm90", "ran_on": {"name": "NVIDIA H200"}, "verification": {"ran": True, "ok": True},
         "timings": {"time_ms": 0.5, "shape": "B=4"}, "parameters": {"BLOCK_M": 128}},
        {"path": "h200/fp16/plain_d64", "target": "h200", "dtype": "fp16", "variant": "plain", "head_dim": 64,
         "status": "failed", "error": "nvcc: spills 400 B"}]}))
    html = explore.library(tmp_path)._repr_html_()
    assert "verified" in html and "on NVIDIA H200" in html and "0.5 ms at B=4" in html and "BLOCK_M=128" in html
    assert "<td>sm90</td>" in html
    assert "nvcc: spills 400 B" in html and html.count('class="fg-bad"') == 1


# ---------------------------------------------------------------------------------------------- TL on the CPU

def test_the_attention_map_matches_the_reference_and_shows_a_wrong_mask():
    causal = library.load("causal")
    shown = explore.attention_map(causal, 96, 80)
    assert shown.ok and shown.max_abs_err < 1e-12
    assert shown.tl_map.shape == (1, 1, 96, 80)
    assert abs(shown.tl_map[0, 0].sum(axis=1)[-1] - 1.0) < 1e-12 and shown.tl_map[0, 0, 0, 1] == 0.0  # causal rows
    html = shown._repr_html_()
    assert all(f'id="{gid}"' in html for gid in ("map-tl", "map-reference", "map-difference")) and "matches" in html
    wrong = causal.replace("where(k_idx <= q_idx + M - N, S_r, -inf)", "where(k_idx < M, S_r, -inf)")
    shown = explore.attention_map(wrong, 96, 80, reference=explore.dense_reference(Variant(causal=True)))
    assert not shown.ok and shown.max_abs_err > 0.01 and "DIFFERS" in shown._repr_html_()


def test_a_score_function_is_checked_end_to_end_on_the_cpu():
    import numpy as np

    base = library.render(Variant(), dtype="bf16", arch="sm_90", head_dim=128)
    tl = explore.insert_after(base, SCALE_LINE, SCORE_LINE)
    reference = explore.dense_reference(score=lambda s, q, k: s - 0.5 * np.log1p(np.abs(q - k)))
    checked = explore.check(tl, reference=reference, gpu="h200")
    stages = {stage: ok for stage, ok, _ in checked.stages}
    assert stages["check"] and stages["CPU: interpreted vs reference"] and stages["translate"]
    assert max(err for _, err in checked.cpu_errors) < 1e-12
    assert checked.manifest.reference_tl is not None and "log(1 + abs(" in checked.manifest.reference_tl
    html = checked._repr_html_()
    assert "the TL is the kernel&#x27;s reference" in html and 'id="map-tl"' in html
    if not explore.have_gpu():
        assert stages["GPU verification"] is None and "no GPU" in html
    # the same function without the log2e factor is another function: the CPU says so
    wrong = explore.check(tl.replace("S_r - log2e * 0.5 *", "S_r - 0.5 *"), reference=reference, gpu="h200")
    assert not wrong.ok and dict((s, ok) for s, ok, _ in wrong.stages)["CPU: interpreted vs reference"] is False
    broken = explore.check(base.replace("Kernel attn_fwd", "Kernel"), reference=reference)
    assert broken.stages[0][0] == "parse" and broken.stages[0][1] is False


def test_the_roofline_bounds_the_dataflow_on_every_target():
    roof = explore.roofline(explore.load(H200_CAUSAL))
    assert [e.target for e in roof.estimates] == list(TARGETS)
    html = roof._repr_html_()
    assert all(f'id="roof-{name}"' in html and f'id="bound-{name}"' in html for name in TARGETS)
    h200 = next(e for e in roof.estimates if e.target == "h200")
    assert f"{h200.time_s * 1e3:.4g}" in html and "sm_75 has no bf16 mma" in html
    assert 'id="measured-' not in html  # the committed kernel was not timed
    timed = _kernel(timings={"shape": "B=4,H=16,KVH=16,N=4096,M=4096,D=128", "time_ms": 0.53, "tflops": 514.2,
                             "baselines_ms": {}})
    html = explore.roofline(timed)._repr_html_()
    assert 'id="measured-h200"' in html and "<td>514</td>" in html  # its timing, where it ran, as a star


# ---------------------------------------------------------------------------------------------- without the extras

def test_the_package_imports_and_displays_without_the_notebook_libraries():
    code = r"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("matplotlib", "pygments", "nbformat", "nbclient", "IPython"):
            raise ImportError(f"blocked {name}")
sys.meta_path.insert(0, Block())
import flashgen, flashgen.api, flashgen.display, flashgen.explore, flashgen.harness.display
from flashgen import explore
from flashgen.tl_spec.highlight import tl_html
html = explore.benchmark()._repr_html_()
assert "the benchmark plot needs matplotlib: pip install &#x27;flashgen[notebook]&#x27;" in html, html[:2000]
assert "x CUDNN" in html  # the ratios still show
assert "<span" not in tl_html("Kernel k\nend\n")  # plain, escaped text
kernel = explore.load(explore.REPO_ROOT / "generated/h200/bf16/causal_d128")
html = kernel._repr_html_()
assert "no highlighting: pygments is not installed" in html and "OnlineSoftmax" in html
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
