// flashgen Hopper persistent walk for causal rows in couples of complementary query blocks (the sm90 backend's
// causal_pairs switch); included only by the kernels that take it.
#pragma once

namespace fg {
namespace block {

// Causal rows in complementary pairs: work tile `tile` of a persistent grid of `ctas` CTAs walking round by round
// (tile = round * ctas + CTA) as (pair, m_block). A pair's query blocks m_tiles - 1 - i and i cost m_tiles + 1 key
// tiles together, whatever i, so the order gives each CTA the long block of one such couple in an even round and its
// short block in the next: every CTA's work is level without rounds of equal lengths, and a round needs only
// ctas / (m_tiles / 2) pairs' K and V, not ctas pairs' (which outgrow the L2 at d256: ncu, causal d256 N = 1k, 2.5x
// the bytes of Q, K, V and O read from HBM; NOTES.md, session 16). Couples left over from the last whole round
// follow (long blocks, then short), then the middle block of each pair where m_tiles is odd.
__device__ __forceinline__ void paired_tile(int tile, int m_tiles, int pairs, int ctas, int& pair, int& m_block) {
  const int per_pair = m_tiles / 2;
  const int couples = pairs * per_pair, whole_rounds = couples / ctas, in_couples = 2 * whole_rounds * ctas;
  if (tile < in_couples) {
    const int couple = tile / (2 * ctas) * ctas + tile % ctas, i = couple % per_pair;
    pair = couple / per_pair;
    m_block = (tile / ctas) & 1 ? i : m_tiles - 1 - i;
  } else {
    const int rest = tile - in_couples, left = couples - whole_rounds * ctas;
    if (rest < 2 * left) {
      const int couple = whole_rounds * ctas + rest % left, i = couple % per_pair;
      pair = couple / per_pair;
      m_block = rest < left ? m_tiles - 1 - i : i;
    } else {
      pair = rest - 2 * left;
      m_block = m_tiles / 2;
    }
  }
}
}  // namespace block
}  // namespace fg
