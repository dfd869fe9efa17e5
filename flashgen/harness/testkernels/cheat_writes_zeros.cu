// Cheat: writes zeros everywhere (every element written, all wrong).
#include "simple_attention.cuh"

extern "C" __global__ void fg_cheat(const FlashgenAttnParams p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = 0; r < FG_ROWS_PER_WARP; ++r) {
    const int i = blockIdx.x * FG_BLOCK_M + warp * FG_ROWS_PER_WARP + r;
    if (i >= p.seqlen_q) continue;
    fg_t* o = (fg_t*)p.o + blockIdx.z * p.o_stride_b + blockIdx.y * p.o_stride_h + (long long)i * p.o_stride_n;
    for (int d = lane; d < FG_HEAD_DIM; d += 32) o[d] = fg_from_float(0.f);
    if (lane == 0 && p.lse != nullptr) p.lse[blockIdx.z * p.lse_stride_b + blockIdx.y * p.lse_stride_h + i] = 0.f;
  }
}
