"""The GPU half of tests/test_half_first_tile.py: kernels built under the sm90 half_first_tile switch (a warpgroup
that sees nothing in the second half of its first key tile issues that tile's S and P V at half the width; off by
default until measured) through the harness's whole verification: causal rows at each head dim's tiles (d64's
two, the N <= 1k one with ping-pong; d256's 64-key tiles), a causal window, a two-sided window, the LSE, and causal
rows with a call-time length."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from flashgen.variant import Variant

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

pytestmark = pytest.mark.gpu

# key -> (dtype, variant, head dim)
KERNELS = {
    ("causal", "bf16", 64): ("bf16", Variant(causal=True), 64),  # 128 x 128 to N = 1k, 192 x 128 beyond
    ("causal", "bf16", 128): ("bf16", Variant(causal=True), 128),
    ("causal_lse", "fp16", 128): ("fp16", Variant(causal=True, return_lse=True), 128),
    ("causal", "bf16", 256): ("bf16", Variant(causal=True), 256),
    ("window256", "bf16", 128): ("bf16", Variant(causal=True, window=256), 128),
    ("two_sided_64_32", "bf16", 128): ("bf16", Variant(window_left=64, window_right=32), 128),
    # a limit that reads a call-time length: min(LEN[b], q + 1)
    ("causal_lengths", "bf16", 128): ("bf16", Variant(causal=True), 128,
                                      {"mask_mod": "k_idx < LEN[b]", "tensors": {"LEN": "int32[B]:0..M"}}),
}


def gpu_kernels(items, arch):
    from tests.gpu_kernels import Build, build_under_switch

    return {key: Build(build_under_switch, ("half_first_tile", "issue_pv(s_prev, pv_half);", *KERNELS[key]))
            for key in KERNELS}


@pytest.fixture(scope="module")
def reports(prebuilt_kernels):
    from tests.gpu_kernels import verify_prebuilt

    return verify_prebuilt(prebuilt_kernels)


@pytest.mark.parametrize("key", list(KERNELS), ids=["-".join(map(str, k)) for k in KERNELS])
def test_kernels_under_the_switch_pass_the_whole_verification(prebuilt_kernels, reports, key):
    prebuilt_kernels[key]  # fails here with the build or compiler error, if any
    report = reports[key]
    assert report.ok, report.summary
    # the causal and window cases include rows whose first key tile is half seen by one warpgroup
    assert report.cases, "no verification case ran"
