"""CPU tests of the sm90 bit_masks switch (flashgen.translators.backends.sm90.kernel.schedule): a masked tile's
row limits as one bit mask a row (fg::rows::visible_prefix), each score's visibility one bit, tested in order after
the scores (ptxas: R2P). Off by default: measured with --settle, it did not pay (kernel.schedule says why); these check the
bit rule itself on the CPU, what the switch renders, where it applies, and that ptxas keeps the kernels' wgmma
asynchronous. The GPU half: tests/test_bit_masks_gpu.py."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from flashgen.translators.backends.sm90 import kernel
from flashgen.translators.backends.sm90.kernel import INCLUDE_DIRS
from flashgen.translators.render import render
from flashgen.variant import Norm, Variant
from tests.gpu_kernels import assert_compiles_asynchronous, sm90_plan

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")


def _plan(variant: Variant, head_dim: int = 128, **tiles):
    return sm90_plan(variant, head_dim, f"bm_{head_dim}", **tiles)


@needs_nvcc
def test_visible_prefix_sets_exactly_the_columns_before_the_limit(tmp_path):
    """Bit 2j + c stands for the thread's column 8j + c (past its first): set iff 8j + c < k, for every limit a row
    can have (below the tile, inside it, past it)."""
    (tmp_path / "check.cu").write_text("""#include <cstdint>
#include <cstdio>
#include "flashgen/row_masks.cuh"
int main() {
  int bad = 0;
  for (int k = -20; k <= 200; ++k) {
    const uint32_t bits = fg::rows::visible_prefix(k);
    for (int j = 0; j < 16; ++j)
      for (int c = 0; c < 2; ++c)
        bad += ((bits >> (2 * j + c)) & 1u) != (8 * j + c < k ? 1u : 0u);
  }
  std::printf("%d\\n", bad);
  return bad != 0;
}
""")
    includes = [f"-I{d}" for d in INCLUDE_DIRS]
    subprocess.run(["nvcc", "-O2", *includes, "check.cu", "-o", "check"], cwd=tmp_path, check=True,
                   capture_output=True, timeout=300)
    run = subprocess.run([str(tmp_path / "check")], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "0", run.stdout


def test_off_by_default_and_production_renders_without_it():
    for variant in (Variant(causal=True), Variant(causal=True, window=256)):
        plan = _plan(variant)
        assert kernel.schedule(plan)["bit_masks"] is False
        assert "visible_prefix" not in render(plan)[0]


@pytest.mark.parametrize("variant, head_dim, tiles, applies", [
    (Variant(causal=True), 64, {}, True),  # 192 x 128, three consumer warpgroups
    (Variant(causal=True), 256, {}, True),  # 64-key tiles: 16 of the 32 bits
    (Variant(causal=True, window=256), 128, {}, True),  # a lower limit too
    (Variant(window_left=64, window_right=32), 128, {}, True),  # two-sided
    (Variant(), 128, {}, False),  # no key limits: nothing masked but the tail, as before
    (Variant(causal=True, norm=Norm.relu), 128, {}, False),  # a masked score is p = 0 there, not -inf
    (Variant(causal=True), 128, {"block_n": 160}, False),  # more than 32 columns a row for a thread
])
def test_where_the_switch_applies(variant, head_dim, tiles, applies):
    plan = _plan(variant, head_dim, **tiles)
    with kernel.schedule_overrides(bit_masks=True):
        source = render(plan)[0]
        assert kernel.schedule(plan)["bit_masks"] is applies
    assert ("fg::rows::visible_prefix(key_hi0)" in source) is applies
    assert ("& ~fg::rows::visible_prefix(key_lo0)" in source) is (applies and plan.key_range.lo is not None)
    if applies:  # the rows' limits are no longer compared score by score
        assert "(i >> 2) * 8 + (i & 1) < ((i & 2) ? key_hi1 : key_hi0)" not in source


@needs_nvcc
def test_kernels_under_the_switch_compile_with_asynchronous_wgmma():
    assert_compiles_asynchronous("bit_masks", [_plan(Variant(causal=True), 64),
                                               _plan(Variant(causal=True, window=256), 128)])
