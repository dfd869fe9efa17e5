// Cheat: computes only the first row tile of every head.
#include "simple_attention.cuh"

extern "C" __global__ void fg_cheat(const FlashgenAttnParams p) {
  if (blockIdx.x != 0) return;
  fg_attend_block(p);
}
