"""The sm90 persistent walk's order for causal rows in couples (fg::block::paired_tile, the causal_pairs switch),
compiled from the header with the host compiler: every work tile exactly once, and in every whole round of couples
each CTA takes a pair's blocks m_tiles - 1 - i and i in consecutive rounds, so the CTAs' work is level."""

from __future__ import annotations

import subprocess

import pytest

from flashgen.targets import get_target
from flashgen.translators.backends.sm90 import kernel
from flashgen.translators.rules import plan_for_variant
from flashgen.variant import DType, Variant
from tests import host_c

PAIRED_WALK = kernel.HERE / "include" / "flashgen" / "paired_walk.cuh"

PROGRAM = """#include <stdio.h>
#include <vector>
""" + "{function}" + """
int main() {
  long errors = 0;
  const int grids[] = {1, 3, 7, 132, 264};
  for (int m_tiles = 1; m_tiles <= 40; ++m_tiles)
    for (int pairs = 1; pairs <= 300; pairs += pairs < 20 ? 1 : 37)
      for (int ctas : grids) {
        const int tiles = m_tiles * pairs;
        std::vector<int> seen(tiles, 0);
        for (int t = 0; t < tiles; ++t) {
          int pair = -1, m = -1;
          paired_tile(t, m_tiles, pairs, ctas, pair, m);
          if (pair < 0 || pair >= pairs || m < 0 || m >= m_tiles) { ++errors; continue; }
          ++seen[pair * m_tiles + m];
        }
        for (int i = 0; i < tiles; ++i) errors += seen[i] != 1;
        // whole rounds of couples: CTA c's tiles in rounds 2R and 2R + 1 are one pair's m and m_tiles - 1 - m
        const int whole = m_tiles / 2 ? pairs * (m_tiles / 2) / ctas : 0;
        for (int r = 0; r < whole; ++r)
          for (int c = 0; c < ctas; ++c) {
            int p0, m0, p1, m1;
            paired_tile(2 * r * ctas + c, m_tiles, pairs, ctas, p0, m0);
            paired_tile((2 * r + 1) * ctas + c, m_tiles, pairs, ctas, p1, m1);
            errors += p0 != p1 || m0 + m1 != m_tiles - 1 || m0 < m1;
          }
      }
  printf("%ld\\n", errors);
  return 0;
}
"""


@pytest.mark.skipif(host_c.CXX is None, reason="needs g++")
def test_paired_tile_walks_every_tile_once_in_complementary_couples(tmp_path):
    source = tmp_path / "walk.cpp"
    source.write_text(PROGRAM.replace("{function}", host_c.device_function("paired_tile", PAIRED_WALK)))
    subprocess.run([*host_c.COMPILE, str(source), "-o", str(tmp_path / "walk")], check=True)
    errors = subprocess.run([str(tmp_path / "walk")], capture_output=True, text=True, check=True).stdout
    assert int(errors) == 0


@pytest.mark.parametrize("variant, walks_in_couples", [
    (Variant(causal=True), True),
    (Variant(causal=True, alibi=True), True),
    (Variant(causal=True, window=256), False),  # a window's rows are level already
    (Variant(), False),
])
def test_causal_rows_walk_in_couples_up_to_the_measured_length(variant, walks_in_couples):
    plan = plan_for_variant(variant, get_target("h200"), DType.bf16, 128)
    assert kernel.schedule(plan)["causal_pairs"] is walks_in_couples
    source, _ = kernel.render(plan)
    assert ("const bool paired = m_tiles <= PAIRED_M_TILES;" in source) is walks_in_couples
    if walks_in_couples:
        assert f"constexpr int PAIRED_M_TILES = {kernel.PAIRED_M_TILES};" in source
        assert source.count("paired ? fg::block::round_tile<false>(round) : fg::block::round_tile<SNAKE_ROUNDS>") == 2
