// The sm90 masked tiles' visibility as bit masks (the bit_masks switch).
#pragma once

namespace fg {
namespace rows {

// A thread's columns of a row of the wgmma accumulator, in the order 2j + c for column 8j + 2t + c of the tile,
// whose first k (counted from the thread's first column, 2t) are visible: the bits below
// 2 floor(k / 8) + min(k % 8, 2), the prefix of that order before column k. 32 bits: key tiles of up to 128.
// (__host__ too: tests/test_bit_masks.py runs it on the CPU against the rule it encodes.)
__host__ __device__ __forceinline__ uint32_t visible_prefix(int k) {
  const int n = k <= 0 ? 0 : (k >> 3) * 2 + min(k & 7, 2);
  return n >= 32 ? 0xffffffffu : (1u << n) - 1u;
}

}  // namespace rows
}  // namespace fg
