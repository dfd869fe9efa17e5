"""The GPU half of tests/test_bit_masks.py: kernels built under the sm90 bit_masks switch (a masked tile's row
limits as a bit mask a row, each score one bit; off by default until measured) through the harness's whole
verification: causal rows at each head dim's tile (64 keys a tile at d256: half the bits), a causal window (a
lower limit too), a two-sided window, a length mask from a call-time tensor, with the LSE in one of them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from flashgen.variant import Variant

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

pytestmark = pytest.mark.gpu

LENGTHS = {"mask_mod": "k_idx < LEN[b]", "tensors": {"LEN": "int32[B]:0..M"}}
# key -> (dtype, variant, head dim, mods keywords or None)
KERNELS = {
    ("causal", "bf16", 64): ("bf16", Variant(causal=True), 64, None),  # three consumer warpgroups
    ("causal", "bf16", 128): ("bf16", Variant(causal=True), 128, None),
    ("causal_lse", "fp16", 128): ("fp16", Variant(causal=True, return_lse=True), 128, None),
    ("causal", "bf16", 256): ("bf16", Variant(causal=True), 256, None),
    ("window256", "bf16", 128): ("bf16", Variant(causal=True, window=256), 128, None),
    ("two_sided_64_32", "bf16", 128): ("bf16", Variant(window_left=64, window_right=32), 128, None),
    ("lengths", "bf16", 128): ("bf16", Variant(), 128, LENGTHS),
}


def gpu_kernels(items, arch):
    from tests.gpu_kernels import Build, build_under_switch

    return {key: Build(build_under_switch, ("bit_masks", "fg::rows::visible_prefix(key_hi0)", *KERNELS[key]))
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
