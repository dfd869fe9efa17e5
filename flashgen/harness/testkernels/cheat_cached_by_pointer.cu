// Cheat: remembers each output row by the Q pointer it was computed for and replays it when called
// again with the same pointer (stale when the data behind the pointer changed).
#include "simple_attention.cuh"

#define FG_CACHE_ROWS (1 << 16)
__device__ const void* fg_cache_tag[FG_CACHE_ROWS];
__device__ float fg_cache_o[FG_CACHE_ROWS * FG_HEAD_DIM];
__device__ float fg_cache_lse[FG_CACHE_ROWS];

extern "C" __global__ void fg_cheat(const FlashgenAttnParams p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int b = blockIdx.z, h = blockIdx.y;
  for (int r = 0; r < FG_ROWS_PER_WARP; ++r) {
    const int i = blockIdx.x * FG_BLOCK_M + warp * FG_ROWS_PER_WARP + r;
    if (i >= p.seqlen_q) continue;
    const long long row = ((long long)b * p.heads + h) * p.seqlen_q + i;
    fg_t* o = (fg_t*)p.o + b * p.o_stride_b + h * p.o_stride_h + (long long)i * p.o_stride_n;
    float* lse = p.lse ? p.lse + b * p.lse_stride_b + h * p.lse_stride_h + i : nullptr;
    if (row < FG_CACHE_ROWS && fg_cache_tag[row] == p.q) {
      for (int d = lane; d < FG_HEAD_DIM; d += 32) o[d] = fg_from_float(fg_cache_o[row * FG_HEAD_DIM + d]);
      if (lane == 0 && lse) *lse = fg_cache_lse[row];
      continue;
    }
    fg_attend_row(p, b, h, i, lane);
    __syncwarp();
    if (row < FG_CACHE_ROWS) {
      for (int d = lane; d < FG_HEAD_DIM; d += 32) fg_cache_o[row * FG_HEAD_DIM + d] = fg_to_float(o[d]);
      if (lane == 0) {
        fg_cache_lse[row] = lse ? *lse : 0.f;
        fg_cache_tag[row] = p.q;
      }
    }
  }
}
