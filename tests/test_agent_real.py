"""The agent on the real layers: TL parse/check/interpret on the CPU, the reference translator, the
static check and nvcc. Without a GPU, verification does not run and the outputs say so; the GPU
tests (pytest -m gpu) verify and time on the device."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from loopback.fakes import make_store
from loopback.server import LoopbackServer

from flashgen.agent.environment import Environment
from flashgen.agent.loop import LoopConfig, run_loop
from flashgen.agent.providers import OpenAIProvider, RetryPolicy, ScriptedProvider, Task
from flashgen.variant import DType, Variant

CAUSAL = Variant(causal=True)
MASK = "k_idx <= q_idx + M - N"


def _texts(target_name="a100", dtype=DType.fp16, head_dim=64):
    env = Environment()
    target = env.target(target_name)
    params = env.choose_params(CAUSAL, target, dtype, head_dim)[0]
    sketch = env.library_tl(CAUSAL, target, dtype, head_dim, form="sketch")
    full = env.library_tl(CAUSAL, target, dtype, head_dim, form="full", params=params)
    return env, target, sketch, full


def test_real_tl_errors_are_repaired_before_any_cuda(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-real-0123456789")
    env, target, sketch, full = _texts()
    assert MASK in full
    broken_syntax = full.replace("Compute GEMM", "Compute GEMMM", 1)
    wrong_mask = full.replace(MASK, "k_idx < q_idx + M - N")  # drops the diagonal: the interpreter sees it
    source, manifest = env.translate(full, target)
    cuda_reply = f"```cuda\n{source}```\n```json\n{manifest.model_dump_json()}\n```"
    task = Task(variant=CAUSAL, target="a100", arch="sm_80", dtype=DType.fp16, head_dim=64)
    with LoopbackServer() as server:
        server.push(f"```tl\n{sketch}```", f"```tl\n{broken_syntax}```", f"```tl\n{wrong_mask}```",
                    f"```tl\n{full}```", cuda_reply)
        provider = OpenAIProvider("gpt-4o", base_url=server.openai_base_url, retry=RetryPolicy(base_delay_s=0))
        result = run_loop(LoopConfig(task=task), provider, env=env, store=make_store(tmp_path))
        prompts = [seen.body["messages"][-1]["content"] for seen in server.seen]
    assert result.status == "done", result.reason
    assert "does not parse" in prompts[2] and "kernel.tl:" in prompts[2]
    assert "compared with the fp64 reference" in prompts[3] and "rows" in prompts[3]
    assert "## The program to translate" in prompts[4] and MASK in prompts[4]
    assert result.best.resources and not result.best.verification.ran


def test_expert_generate_without_gpu_writes_everything_and_says_verification_did_not_run(tmp_path):
    from flashgen.api import generate

    kernel = generate(gpu="a100", dtype="fp16", head_dim=64, causal=True, out=tmp_path / "k", store=make_store(tmp_path))
    files = sorted(p.name for p in (tmp_path / "k").iterdir())
    assert files == sorted(["sketch.tl", "kernel.tl", "kernel.cu", "manifest.json", "meta.json", "report.md"])
    meta = json.loads((tmp_path / "k" / "meta.json").read_text())
    assert meta["verification"]["ran"] is False and meta["timings"] is None
    assert meta["roofline"]["time_s"] > 0 and meta["parameters"]["BLOCK_M"] > 0
    assert "Verification did not run" in kernel.report and kernel.verified is None
    assert 'extern "C" __global__' in kernel.source and kernel.tl.startswith("# LLM-TL full program")


def test_committed_kernels_regenerate_identically(tmp_path):
    from flashgen import regenerate
    from flashgen.agent.outputs import FILES

    for entry in [("t4", "fp16", "plain", 64), ("h200", "bf16", "causal", 128)]:
        rel = regenerate.relative_dir(*entry)
        committed = regenerate.ROOT / rel
        if not committed.exists():
            pytest.fail(f"{committed} is missing: run python -m flashgen.regenerate")
        regenerate.regenerate(*entry, out=tmp_path / rel, store_home=tmp_path / "store")
        for name in FILES:
            assert (tmp_path / rel / name).read_text() == (committed / name).read_text(), f"{rel}/{name} differs"


@pytest.mark.gpu
def test_gpu_expert_kernel_is_verified_and_timed(tmp_path):
    from flashgen.api import generate

    kernel = generate(gpu="h200", dtype="bf16", head_dim=128, causal=True, out=tmp_path / "k", store=make_store(tmp_path))
    assert kernel.meta["verification"]["ran"] and kernel.verified, kernel.meta["verification"]
    assert kernel.meta["timings"]["time_ms"] > 0


@pytest.mark.gpu
def test_gpu_wrong_mask_in_cuda_repaired_after_the_verifier(tmp_path):
    env, target, sketch, full = _texts("h200", DType.bf16, 128)
    source, manifest = env.translate(full, target)
    # the causal limit of each of the thread's two rows (sm90's row_key_limits); the planted bug drops the diagonal key
    assert source.count(") + diag + 1) - k_row0") == 2
    wrong = source.replace(") + diag + 1) - k_row0", ") + diag) - k_row0")
    reply = lambda src: f"```cuda\n{src}```\n```json\n{manifest.model_dump_json()}\n```"
    provider = ScriptedProvider([f"```tl\n{sketch}```", f"```tl\n{full}```", reply(wrong), reply(source)])
    task = Task(variant=CAUSAL, target="h200", arch="sm_90", dtype=DType.bf16, head_dim=128)
    result = run_loop(LoopConfig(task=task, goal_speedup=0.01), provider, env=env, store=make_store(tmp_path))
    assert [r.stage for r in provider.requests][3] == "repair_wrong"
    assert result.status == "done" and result.best.verification.ok


@pytest.mark.gpu
def test_gpu_kernel_call_on_torch_tensors(tmp_path):
    import torch

    from flashgen.api import generate

    kernel = generate(gpu="h200", dtype="fp16", head_dim=64, causal=True, lse=True, store=make_store(tmp_path))
    q, k, v = (torch.randn(2, 4, 200, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    o, lse = kernel(q, k, v)
    want = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert lse.shape == (2, 4, 200) and torch.allclose(o.float(), want, atol=1e-2, rtol=1e-2)


def test_a_mask_functions_timing_counts_the_pairs_it_leaves_over_the_tensors_the_timing_passed():
    """`flashgen generate --mask-mod 'k_idx < LEN[b]'`: TF/s over the visible pairs (as `flashgen bench` counts a
    variant's mask), the LEN values filled as the timing fills them; the summary says which share that is."""
    import numpy as np

    from flashgen.agent.summary import OTHER_FUNCTION_NOTE, BaselineTime, GenerateSummary, summary_text
    from flashgen.harness.bench import BENCH_SEED, BenchEntry, BenchReport, timing_stats
    from flashgen.harness.environment import _mask_share, _timing_from
    from flashgen.mods import make_mods, reference_program
    from flashgen.roofline import pair_flops
    from flashgen.tl_spec.tensors import fill_all, sizes_of
    from flashgen.variant import Shape

    env = Environment()
    target = env.target("h200")
    mods = make_mods(mask_mod="k_idx < LEN[b]", tensors={"LEN": "int32[B]:0..M"})
    _source, manifest = env.translate(reference_program(mods, Variant(), target, DType.bf16, 64, env), target)
    shape = Shape(B=4, H=2, N=256, M=320, D=64)
    lengths = fill_all(manifest.call_tensors, sizes_of(shape), BENCH_SEED)["LEN"]
    want = float(np.minimum(lengths, shape.M).sum()) * shape.H * shape.N / (shape.B * shape.H * shape.N * shape.M)
    assert 0 < want < 1 and _mask_share(mods, manifest, shape) == pytest.approx(want)
    assert _mask_share(make_mods(score_mod="s + 0.25 * cos(k_idx)"), manifest, shape) is None  # no mask: None
    report = BenchReport(entries=[BenchEntry(name=manifest.name, kind="kernel", ok=True, dtype="bf16",
                                             variant=manifest.variant.name, shape=shape,
                                             stats=timing_stats([0.5, 0.5, 0.5]))])
    timing = _timing_from(report, shape, manifest, want)
    assert timing.visible_share == want and timing.plain_ms is None and timing.plain_ratio is None
    # the plain twin, timed after ours under the same kernel name: our visible-work TF/s over its all-pairs TF/s
    report.entries.append(BenchEntry(name=manifest.name, kind="kernel", ok=True, dtype="bf16",
                                     variant=manifest.variant.name, shape=shape, stats=timing_stats([0.8] * 3)))
    with_plain = _timing_from(report, shape, manifest, want)
    assert with_plain.time_ms == 0.5 and with_plain.plain_ms == 0.8
    assert with_plain.plain_ratio == pytest.approx(want * 0.8 / 0.5)
    # the twin Environment.bench times beside it: the library's kernel of the variant, without the function
    twin = env._plain_twin(manifest, target)
    assert twin.manifest.variant == manifest.variant and twin.manifest.reference_tl is None
    assert twin.manifest.mod_tensors == [] and "LEN" not in twin.source and manifest.mod_tensors
    assert timing.tflops == pytest.approx(4 * shape.B * shape.H * shape.D * shape.N * shape.M * want / 0.5e-3 / 1e12)
    assert timing.tflops == pytest.approx(pair_flops(shape, want * shape.N * shape.M) / 0.5e-3 / 1e12)
    summary = GenerateSummary(run_id=1, status="done", reason="", provider="expert", model_calls=3, kernel="k",
                              target="h200 (sm_90)", verified=True, verified_on="NVIDIA H200", verification="PASS",
                              shape=timing.shape, time_ms=0.5, tflops=timing.tflops, visible_share=want,
                              kept="the one", candidates_compiled=1, candidates_verified=1,
                              baselines=[BaselineTime(name="sdpa_cudnn", label="CUDNN", time_ms=0.4, ratio=0.8)],
                              baselines_note=OTHER_FUNCTION_NOTE)
    text = " ".join(summary_text(summary).split())
    assert f"TFLOP/s over the {want:.0%} of the pairs its mask leaves" in text
    assert "(the baselines compute the variant's attention without this kernel's own functions" in text


def test_bench_report_becomes_timing_with_ours_beside_the_baselines():
    from flashgen.agent.environment import _timing_from
    from flashgen.harness.bench import BenchEntry, BenchReport, timing_stats
    from flashgen.harness.suite import build_expert_kernel
    from flashgen.variant import Shape, Variant

    _source, manifest, _tl = build_expert_kernel("h200", "fp16", Variant(causal=True), 64)
    shape = Shape(B=2, H=4, N=1024, M=1024, D=64)
    common = dict(dtype="fp16", variant=manifest.variant.name, shape=shape)
    report = BenchReport(entries=[
        BenchEntry(name=manifest.name, kind="kernel", ok=True, stats=timing_stats([0.5, 0.5, 0.5]), **common),
        BenchEntry(name="sdpa_flash", kind="baseline", ok=True, stats=timing_stats([0.4, 0.4, 0.4]), **common),
        BenchEntry(name="flex", kind="baseline", ok=False, skipped="not here", **common),
    ])
    timing = _timing_from(report, shape, manifest)
    assert timing.ran and timing.time_ms == 0.5 and timing.baselines_ms == {"sdpa_flash": 0.4}
    assert abs(timing.tflops - shape.flops(True) / 0.5e-3 / 1e12) < 1e-9
