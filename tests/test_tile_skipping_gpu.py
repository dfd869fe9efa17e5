"""The GPU half of tests/test_tile_skipping.py: kernels that skip the key tiles a mask of positions leaves empty, on the
sm80 path (the A100 target, compiled for the GPU present) and the sm90 path (the H200 target).

- The whole verification (flashgen.harness.verify: every default case, two seeds each) plus ragged sizes where whole
  key tiles are skipped: a document mask (documents of 96 keys: tiles skipped inside the loop's range and at both
  ends, across tails) and the length mask `k_idx < LEN[b]` (a call-time tensor, filled per case and seed: the tiles
  past a batch's length skipped, a batch of length 0 with no tile at all), with the causal variant too. That the cases
  do skip tiles is asserted on the CPU first (flashgen.mods.tile_report, the kernel's own test in numpy).
- Kernel.__call__ with given lengths (0, mid-tile, all): O = 0 and LSE = -inf for the batch with none.
The speed (the document mask of 512 keys beside the plain kernel, the goal within 15 % of plain) is a benchmark's,
not a test's: benchmarks/mods_bench.py (flashgen.harness.suite.bench_mods).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from flashgen.variant import Shape, Variant

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

pytestmark = pytest.mark.gpu

DOCUMENTS = {"mask_mod": "q_idx // DOC == k_idx // DOC", "params": {"DOC": 96}}
LENGTHS = {"mask_mod": "k_idx < LEN[b]", "tensors": {"LEN": "int32[B]:0..M"}}
# key -> (gpu, dtype, variant, mods keywords, head dim)
KERNELS = {
    **{("documents", gpu, "bf16"): (gpu, "bf16", Variant(return_lse=True), DOCUMENTS, 64) for gpu in ("a100", "h200")},
    **{("documents_causal", gpu, "fp16"): (gpu, "fp16", Variant(causal=True, return_lse=True), DOCUMENTS, 64)
       for gpu in ("a100", "h200")},
    ("documents_d128", "h200", "bf16"): ("h200", "bf16", Variant(return_lse=True), DOCUMENTS, 128),
    **{("lengths", gpu, "bf16"): (gpu, "bf16", Variant(return_lse=True), LENGTHS, 64) for gpu in ("a100", "h200")},
    **{("lengths_causal", gpu, "fp16"): (gpu, "fp16", Variant(causal=True, return_lse=True), LENGTHS, 64)
       for gpu in ("a100", "h200")},
}
# ragged sizes beside the default cases: tails in both directions, several documents and tiles per row block
RAGGED = [("ragged_n_lt_m", dict(B=2, H=2, N=700, M=901), "bhnd"), ("ragged_long_keys", dict(B=3, H=2, N=333, M=1200),
          "bnhd"), ("ragged_n_gt_m", dict(B=2, H=2, N=1000, M=517), "bhnd")]


def build(gpu: str, dtype: str, variant: Variant, mods: dict, head_dim: int):
    from flashgen.harness.suite import build_mask_kernel

    return build_mask_kernel(gpu, dtype, variant, head_dim, mods)


def gpu_kernels(items, arch):
    """The selected tests' kernels (tests/gpu_kernels.py: built and compiled once, before the tests run)."""
    from tests.gpu_kernels import Build, param_keys

    return {key: Build(build, KERNELS[key]) for key in param_keys(items)}


def _cases(manifest):
    from flashgen.harness.verify import CheckCase, default_cases

    d = manifest.head_dim
    return default_cases(manifest) + [CheckCase(name=name, shape=Shape(**dims, D=d), layout=layout)
                                      for name, dims, layout in RAGGED]


@pytest.mark.parametrize("key", list(KERNELS), ids=["-".join(k) for k in KERNELS])
def test_kernels_that_skip_tiles_pass_the_whole_verification(prebuilt_kernels, key):
    from flashgen.harness.worker import GpuWorker, KernelInput
    from flashgen.mods import make_mods, tile_report

    source, manifest = prebuilt_kernels[key]
    assert "fg::iv::" in source and manifest.reference_tl is not None
    mods = make_mods(**KERNELS[key][3])
    if mods.mask_of_positions and not mods.tensors:  # the ragged cases skip whole tiles (the kernel's own test)
        for _, dims, _ in RAGGED:
            tiles = tile_report(mods, manifest.reference_tl, n=dims["N"], m=dims["M"])
            assert tiles["skipped"] > 0 and tiles["missed"] == 0, (key, dims, tiles)
    with GpuWorker(job_timeout_s=600) as worker:
        report = worker.verify(KernelInput(manifest=manifest, source=source), cases=_cases(manifest))
    assert report.ok, report.summary
    assert {name for name, _, _ in RAGGED} <= {case.case.name for case in report.cases}
    assert all(len(case.runs) == 2 for case in report.cases), report.summary  # two seeds: two fills of LEN


@pytest.mark.parametrize("key", [("lengths", "a100", "bf16"), ("lengths", "h200", "bf16"),
                                 ("lengths_causal", "h200", "fp16")], ids=lambda k: "-".join(k))
def test_a_batch_without_keys_writes_zero_and_minus_infinity(prebuilt_kernels, key):
    torch = pytest.importorskip("torch")
    import numpy as np

    from flashgen.api import Kernel
    from flashgen.harness.verify import from_dtype_bits, reference_outputs, to_dtype_bits, tolerance_for
    from flashgen.reference import random_inputs
    from flashgen.variant import DType

    source, manifest = prebuilt_kernels[key]
    kernel = Kernel(tl="", sketch="", source=source, manifest=manifest, report="", meta={})
    shape = Shape(B=4, H=2, N=300, M=1111, D=64)
    lengths = np.array([0, 77, 1111, 640], dtype=np.int32)  # none, mid-tile, all, a tile edge (of 64 and 128)
    dtype = manifest.dtype
    host = [from_dtype_bits(to_dtype_bits(x, dtype), dtype) for x in random_inputs(shape, 3)]
    torch_dtype = {DType.fp16: torch.float16, DType.bf16: torch.bfloat16}[dtype]
    q, k, v = (torch.tensor(x, dtype=torch.float32).to(torch_dtype).cuda() for x in host)
    o, lse = kernel(q, k, v, tensors={"LEN": torch.tensor(lengths).cuda()})
    torch.cuda.synchronize()
    want_o, want_lse = reference_outputs(manifest, *host, call_time={"LEN": lengths})
    got_o = o.float().cpu().numpy().astype(np.float64)
    got_lse = lse.cpu().numpy().astype(np.float64)
    assert (got_o[0] == 0).all() and np.isneginf(got_lse[0]).all()
    assert np.abs(got_o - want_o).max() <= tolerance_for(dtype).max_elem * np.abs(want_o).max()
    assert np.array_equal(np.isneginf(got_lse), np.isneginf(want_lse))
    finite = ~np.isneginf(want_lse)
    assert np.abs(got_lse[finite] - want_lse[finite]).max() < 2e-2
