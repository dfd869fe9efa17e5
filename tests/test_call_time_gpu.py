"""The GPU half of tests/test_call_time_tensors.py: kernels that take call-time inputs besides Q, K and V, through the
harness's whole verification (flashgen.harness.verify: every default case, two seeds each, the same buffers twice),
on the sm80 path (the A100 target) and the sm90 path (the H200 target), each compiled for the GPU present.

- ALiBi with the caller's slopes: default_cases adds `alibi_slopes_h` and `alibi_slopes_bh` (random slopes of
  FlashAttention's shapes (H) and (B, H)) to the cases run with the standard slopes; a kernel whose TL writes the
  slopes as a formula must fail exactly those cases (the verification can tell).
- Score and mask functions: `s + 0.25 * cos(k_idx)`, the per-batch length mask `k_idx < LEN[b]` (a call-time int32
  tensor filled per case and seed, its reference the TL interpreted with the same tensor), a document mask; on the
  sm90 path also with the switch that shares key-only calls in the warp off (share_key_terms, on by default).
- Kernel.__call__ with torch tensors: the slopes and a length table given by the caller, against the fp64 reference.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from flashgen.variant import DType, Variant

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

pytestmark = pytest.mark.gpu

ALIBI = Variant(alibi=True, return_lse=True)
SCORE = {"score_mod": "s + 0.25 * cos(k_idx)"}
LENGTHS = {"mask_mod": "k_idx < LEN[b]", "tensors": {"LEN": "int32[B]:0..M"}}
DOCUMENTS = {"mask_mod": "DOC[q_idx] == DOC[k_idx]", "tensors": {"DOC": "int32[M]:0..3:sorted"}}
TWO_TERMS = {"score_mod": "s + cos(k_idx + h) + exp(-k_idx / M)"}
# sm90 schedule switches (flashgen.translators.backends.sm90.kernel.schedule_overrides) a kernel is built under
UNSHARED = {"share_key_terms": False}
TARGETS = [("a100", "fp16"), ("a100", "bf16"), ("h200", "fp16"), ("h200", "bf16")]  # the sm80 path, the sm90 path
# key -> (gpu, dtype, variant, mods keywords or None, fixed ALiBi formula)
KERNELS = {
    **{("alibi", gpu, dtype): (gpu, dtype, ALIBI, None, False) for gpu, dtype in TARGETS},
    **{("alibi_causal_gqa", gpu, "bf16"): (gpu, "bf16", Variant(causal=True, alibi=True, kv_group=2, return_lse=True),
                                           None, False) for gpu in ("a100", "h200")},
    ("alibi_splitkv", "h200", "fp16"): ("h200", "fp16", Variant(alibi=True, split_kv=True, return_lse=True), None, False),
    **{("alibi_fixed_formula", gpu, "bf16"): (gpu, "bf16", ALIBI, None, True) for gpu in ("a100", "h200")},
    **{("score_cos", gpu, dtype): (gpu, dtype, Variant(return_lse=True), SCORE, False) for gpu, dtype in TARGETS},
    # the skeleton's key-term sharing on the Turing path too (fp16 as is, bf16 through its scaled fp16 tiles)
    **{("score_cos", "t4", dtype): ("t4", dtype, Variant(return_lse=True), SCORE, False) for dtype in ("fp16", "bf16")},
    **{("lengths", gpu, dtype): (gpu, dtype, Variant(return_lse=True), LENGTHS, False) for gpu, dtype in TARGETS},
    **{("lengths_causal_score", gpu, "bf16"): (gpu, "bf16", Variant(causal=True, return_lse=True),
                                               {**LENGTHS, **SCORE}, False) for gpu in ("a100", "h200")},
    **{("documents_causal", gpu, "bf16"): (gpu, "bf16", Variant(causal=True, return_lse=True), DOCUMENTS, False)
       for gpu in ("a100", "h200")},
    # the sm90 backend shares key-only calls in the warp (share_key_terms, on by default); also without it
    **{("score_cos_unshared", "h200", dtype): ("h200", dtype, Variant(return_lse=True), SCORE, False, 64, UNSHARED)
       for dtype in ("fp16", "bf16")},
    ("lengths_causal_two_terms", "h200", "bf16"): (
        "h200", "bf16", Variant(causal=True, return_lse=True), {**LENGTHS, **TWO_TERMS}, False, 128),
}


def build(gpu: str, dtype: str, variant: Variant, mods: dict | None, fixed_formula: bool, head_dim: int = 64,
          schedule: dict | None = None):
    """(source, manifest) the way `flashgen generate` builds it: the library's TL (with the functions written in),
    checked and translated for `gpu`; `fixed_formula`: the ALiBi slopes written as 2^(-8 (h + 1) / H) instead of read
    from the caller (a kernel that ignores them); `schedule`: sm90 schedule switches to build under (UNSHARED: each
    thread evaluates the key-only calls for its own columns), each checked to have taken effect in the source."""
    if schedule:
        from flashgen.translators.backends.sm90 import kernel

        with kernel.schedule_overrides(**schedule):
            source, manifest = build(gpu, dtype, variant, mods, fixed_formula, head_dim)
        assert "__shfl_sync(0xffffffffu, mine" not in source and "cos_approx" in source
        return source, manifest
    from flashgen.harness.environment import Environment
    from flashgen.mods import make_mods, reference_program
    from flashgen.translators.params import choose_params

    env = Environment()
    target = env.target(gpu)
    if mods is not None:
        tl = reference_program(make_mods(**mods), variant, target, DType(dtype), head_dim, env)
    else:
        params = dict(choose_params(variant, target.name, DType(dtype), head_dim))
        tl = env.library_tl(variant, target, DType(dtype), head_dim, form="full", params=params)
    if fixed_formula:
        assert "alibi_slopes[b, h]" in tl
        tl = tl.replace("alibi_slopes[b, h]", "exp2(-8.0 * (h + 1) / H)")
    return env.translate(tl, target)


VERIFIED = [key for key in KERNELS if key[0] != "alibi_fixed_formula"]
CALLED = [("alibi", "h200", "bf16"), ("alibi", "a100", "fp16"), ("lengths", "h200", "bf16"), ("lengths", "a100", "fp16")]


def gpu_kernels(items, arch):
    """The selected tests' kernels (tests/gpu_kernels.py: built and compiled once, before the tests run)."""
    from tests.gpu_kernels import Build, param_keys

    keys = param_keys(items)
    if any(item.name.startswith("test_kernel_call") for item in items):
        keys.update(CALLED)
    return {key: Build(build, KERNELS[key]) for key in keys}


@pytest.fixture(scope="module")
def reports(prebuilt_kernels):
    """Every selected kernel that must pass, through the harness's whole verification, on several GPU workers."""
    from flashgen.harness.worker import KernelInput
    from tests.gpu_kernels import verify_many

    return verify_many({key: KernelInput(manifest=manifest, source=source)
                        for key, (source, manifest) in prebuilt_kernels.ready().items() if key in VERIFIED})


@pytest.mark.parametrize("key", VERIFIED, ids=["-".join(k) for k in VERIFIED])
def test_kernels_with_call_time_inputs_pass_the_whole_verification(prebuilt_kernels, reports, key):
    _, manifest = prebuilt_kernels[key]
    report = reports[key]
    assert report.ok, report.summary
    names = {case.case.name for case in report.cases}
    if manifest.variant.alibi:  # the caller's slopes of both shapes ran, beside the standard ones
        assert {"alibi_slopes_h", "alibi_slopes_bh"} <= names and len(names) > 2, report.summary
    if manifest.mod_tensors:
        assert manifest.reference_tl is not None and all(len(case.runs) == 2 for case in report.cases)


@pytest.mark.parametrize("key", [k for k in KERNELS if k[0] == "alibi_fixed_formula"], ids=lambda k: k[1])
def test_a_kernel_ignoring_the_callers_slopes_fails_only_their_cases(prebuilt_kernels, key):
    from flashgen.harness.verify import default_cases
    from flashgen.harness.worker import GpuWorker, KernelInput

    source, manifest = prebuilt_kernels[key]
    kernel = KernelInput(manifest=manifest, source=source)
    cases = default_cases(manifest)
    with GpuWorker(job_timeout_s=240) as worker:
        standard = worker.verify(kernel, cases=[c for c in cases if c.alibi_slopes == "standard"][:3])
        given = worker.verify(kernel, cases=[c for c in cases if c.alibi_slopes != "standard"])
    assert standard.ok, standard.summary
    assert not given.ok and not any(case.ok for case in given.cases), given.summary


def test_kernel_call_takes_the_callers_slopes_and_tensors(prebuilt_kernels):
    torch = pytest.importorskip("torch")
    import numpy as np

    from flashgen.api import Kernel
    from flashgen.harness.verify import from_dtype_bits, reference_outputs, to_dtype_bits, tolerance_for
    from flashgen.reference import random_alibi_slopes, random_inputs
    from flashgen.variant import Shape

    for key, slopes_shape, tensors in ((("alibi", "h200", "bf16"), "BH", None), (("alibi", "a100", "fp16"), "H", None),
                                       (("lengths", "h200", "bf16"), None, [0, 77, 200]),
                                       (("lengths", "a100", "fp16"), None, [5, 0, 130])):
        source, manifest = prebuilt_kernels[key]
        kernel = Kernel(tl="", sketch="", source=source, manifest=manifest, report="", meta={})
        shape = Shape(B=3, H=4, N=150, M=200, D=64)
        dtype = manifest.dtype
        host = [from_dtype_bits(to_dtype_bits(x, dtype), dtype) for x in random_inputs(shape, 1)]
        torch_dtype = {DType.fp16: torch.float16, DType.bf16: torch.bfloat16}[dtype]
        q, k, v = (torch.tensor(x, dtype=torch.float32).to(torch_dtype).cuda() for x in host)
        call_time, kwargs = {}, {}
        if slopes_shape is not None:
            slopes = random_alibi_slopes(3, 4, 2, per_batch=slopes_shape == "BH")
            call_time["alibi_slopes"], kwargs["alibi_slopes"] = slopes, torch.tensor(slopes).cuda()
        if tensors is not None:
            lengths = np.array(tensors, dtype=np.int32)
            call_time["LEN"], kwargs["tensors"] = lengths, {"LEN": torch.tensor(lengths).cuda()}
        o, lse = kernel(q, k, v, **kwargs)
        torch.cuda.synchronize()
        want_o, want_lse = reference_outputs(manifest, *host, call_time=call_time)
        got_o = o.float().cpu().numpy().astype(np.float64)
        assert np.abs(got_o - want_o).max() <= tolerance_for(dtype).max_elem * np.abs(want_o).max(), key
        got_lse = lse.cpu().numpy().astype(np.float64)
        assert np.array_equal(np.isneginf(got_lse), np.isneginf(want_lse)), key
        finite = ~np.isneginf(want_lse)
        assert np.abs(got_lse[finite] - want_lse[finite]).max() < 2e-2, key
        if tensors is not None:  # a batch of length 0 sees no key: O = 0, LSE = -inf
            empty = [b for b, n in enumerate(tensors) if n == 0]
            assert all((got_o[b] == 0).all() and np.isneginf(got_lse[b]).all() for b in empty), key
