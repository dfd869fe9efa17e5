// The sm90 walk of causal rows in couples (the causal_pairs switch).
#pragma once

namespace fg {
namespace block {

// Work tile `tile` (= round * ctas + CTA) as (pair, m_block): CTA c takes blocks m_tiles - 1 - i and i of a pair in
// rounds 2R and 2R + 1 (m_tiles + 1 key tiles together, whatever i); after the whole rounds, the couples left (long
// blocks, then short), then each pair's middle block where m_tiles is odd.
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
