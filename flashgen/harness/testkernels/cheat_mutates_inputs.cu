// Cheat: right answer, but scribbles on Q afterwards (each warp on its own row, so race-free).
#include "simple_attention.cuh"

extern "C" __global__ void fg_cheat(const FlashgenAttnParams p) {
  fg_attend_block(p);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = 0; r < FG_ROWS_PER_WARP; ++r) {
    const int i = blockIdx.x * FG_BLOCK_M + warp * FG_ROWS_PER_WARP + r;
    if (i >= p.seqlen_q) continue;
    fg_t* q = (fg_t*)p.q + blockIdx.z * p.q_stride_b + blockIdx.y * p.q_stride_h + (long long)i * p.q_stride_n;
    for (int d = lane; d < FG_HEAD_DIM; d += 32) q[d] = fg_from_float(fg_to_float(q[d]) * 0.5f + 1.f);
  }
}
