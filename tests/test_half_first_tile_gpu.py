"""The GPU half of tests/test_half_first_tile.py: kernels built under the sm90 half_first_tile switch (a warpgroup
that sees nothing in the second half of its first key tile issues that tile's S and P V at half the width; off by
default until measured) through the harness's whole verification: causal rows at each head dim's tiles (d64's
two, the N <= 1k one with ping-pong; d256's 64-key tiles), a causal window, a two-sided window, and the LSE."""

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
}


def build(dtype: str, variant: Variant, head_dim: int):
    """(source, manifest) built for the H200 target under the switch, checked to have taken effect."""
    from flashgen.harness.suite import build_expert_kernel
    from flashgen.translators.backends.sm90 import kernel

    with kernel.schedule_overrides(half_first_tile=True):
        source, manifest, _ = build_expert_kernel("h200", dtype, variant, head_dim)
    assert "issue_pv(s_prev, pv_half);" in source, "half_first_tile did not take effect"
    return source, manifest


def gpu_kernels(items, arch):
    from tests.gpu_kernels import Build

    return {key: Build(build, KERNELS[key]) for key in KERNELS}


@pytest.fixture(scope="module")
def reports(prebuilt_kernels):
    from flashgen.harness.worker import KernelInput
    from tests.gpu_kernels import verify_many

    return verify_many({key: KernelInput(manifest=manifest, source=source)
                        for key, (source, manifest) in prebuilt_kernels.ready().items()})


@pytest.mark.parametrize("key", list(KERNELS), ids=["-".join(map(str, k)) for k in KERNELS])
def test_kernels_under_the_switch_pass_the_whole_verification(prebuilt_kernels, reports, key):
    prebuilt_kernels[key]  # fails here with the build or compiler error, if any
    report = reports[key]
    assert report.ok, report.summary
    # the causal and window cases include rows whose first key tile is half seen by one warpgroup
    assert report.cases, "no verification case ran"
