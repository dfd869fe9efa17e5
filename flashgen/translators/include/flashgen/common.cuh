// flashgen primitive library: element types, register packing, shared-memory tile layouts.
// Naming follows ThunderKittens: st_* = shared tile, rt_* = register fragments, ops grouped by the unit
// that runs them (fg::warp::*, fg::block::*). Headers per arch (sm80.cuh, sm75.cuh) add the loads and MMAs.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <type_traits>

namespace fg {

using f16 = __half;
using bf16 = __nv_bfloat16;
using f32 = float;

// Two fp32 values -> one 32-bit register holding the pair in T (low half = first value).
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<f16>(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}
template <> __device__ __forceinline__ uint32_t pack2<bf16>(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ f16 from_f32<f16>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ f32 from_f32<f32>(float x) { return x; }

// 2^x on the SFU (ex2.approx: 2 ulp, -inf -> +0): the online softmax's only transcendental.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// tanh(x) on the SFU's own MUFU.TANH (tanh.approx.f32, sm_75 and later): one SFU operation per score where
// 1 - 2 / (2^(2x log2 e) + 1) took two (EX2, RCP) and tanhf a polynomial with branches. Softcap runs it on every
// score beside the softmax's EX2, and the SFU bounded it: +32-37 % on the H200 (NOTES.md, session 6). Maximum
// relative error ~1.1e-5 (about 16.5 bits, measured over all floats by N. Juffa, NVIDIA developer forums): a
// softcap of 30 moves a score by at most ~3.3e-4, below half an fp16 ulp of the output; +-inf give +-1.
__device__ __forceinline__ float tanh_fast(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// cos(x) and sin(x) on the SFU's MUFU.COS / MUFU.SIN (cos.approx / sin.approx, absolute error 2^-21.4 on [-pi, pi])
// after a two-constant Cody-Waite reduction: k = rint(x / 2pi), r = x - k hi - k lo (2pi = hi + lo, each product
// exact in its FMA). Branch-free, where cosf / sinf wrap every call in a divergent region around the Payne-Hanek
// slow path (local memory), which nothing can be scheduled across: `s + 0.25 * cos(k_idx)` ran 4-6 % faster on the
// H200 (NOTES.md, session 14). Absolute error < 5e-7 for |x| < 2^24 and < 1e-5 for |x| < 2^31 (the reduction
// emulated exactly against fp64, tests/test_lower_cexpr.py); beyond 2^31 the reduction loses the phase, as __cosf.
__device__ __forceinline__ float reduce_2pi(float x) {
  const float k = rintf(x * 0.15915494309189535f);
  return fmaf(-k, -1.7484555314695172e-7f, fmaf(-k, 6.28318548202514648f, x));
}
__device__ __forceinline__ float cos_approx(float x) { return __cosf(reduce_2pi(x)); }
__device__ __forceinline__ float sin_approx(float x) { return __sinf(reduce_2pi(x)); }

__device__ __forceinline__ uint32_t smem_u32(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// Shared tile layout, ROWS x COLS elements of ELEM_BYTES, addressed in 16-byte chunks.
// When a row holds a multiple of 8 chunks (128 bytes), chunk c of row r lives at c ^ (r & 7): the 8 rows an
// ldmatrix phase reads (same logical chunk) land in 8 distinct bank groups. Otherwise (D = 96, or a tile padded
// to 48, 80, 112, ... columns in 16-bit) the row is padded by one chunk: every head dim's row is an even number of
// chunks (D_PAD a multiple of 16 in 16-bit, D of 8 in fp32), so the chunk stride is odd, conflict-free for the same
// reason.
template <int ROWS, int COLS, int ELEM_BYTES>
struct st_layout {
  static constexpr int CHUNK_ELEMS = 16 / ELEM_BYTES;
  static constexpr int CHUNKS = COLS / CHUNK_ELEMS;
  static constexpr bool XOR = CHUNKS % 8 == 0;
  static constexpr int ROW_ELEMS = XOR ? COLS : COLS + CHUNK_ELEMS;
  static constexpr int ELEMS = ROWS * ROW_ELEMS;
  static constexpr int BYTES = ELEMS * ELEM_BYTES;
  static_assert(COLS % CHUNK_ELEMS == 0, "tile width must be whole 16-byte chunks");
  __device__ __forceinline__ static int chunk_offset(int row, int chunk) {
    return row * ROW_ELEMS + (XOR ? (chunk ^ (row & 7)) : chunk) * CHUNK_ELEMS;
  }
  __device__ __forceinline__ static int offset(int row, int col) {
    return chunk_offset(row, col / CHUNK_ELEMS) + col % CHUNK_ELEMS;
  }
};

namespace block {
// Launch order -> (head, batch, query block) for a (m tiles, H, B) grid: the query blocks of GROUP_HEADS (batch,
// head) pairs (0: all of them) launch together, query block outermost, longest causal rows first when REVERSE.
// Few pairs: the CTAs resident at once share those heads' K and V and read them from L2, not HBM. All pairs:
// the longest causal blocks start first everywhere and the launch ends on short ones.
// tile_coords takes the order's linear index `tile` (a persistent grid walks its tiles with it);
// launch_coords reads it from the block index.
template <int GROUP_HEADS, bool REVERSE>
__device__ __forceinline__ void tile_coords(int tile, int m_tiles, int heads, int pairs, int& head, int& b,
                                            int& m_block) {
  const int per_group = GROUP_HEADS > 0 ? GROUP_HEADS : pairs;
  const int group = tile / (per_group * m_tiles);
  const int in_group = tile - group * per_group * m_tiles;
  const int group_size = min(per_group, pairs - group * per_group);
  const int pair = group * per_group + in_group % group_size;
  const int m_index = in_group / group_size;
  head = pair % heads;
  b = pair / heads;
  m_block = REVERSE ? m_tiles - 1 - m_index : m_index;
}
// The indices are read with volatile moves so that a second call (the epilogue's) recomputes them instead of
// keeping the first call's results live through the key loop.
template <int GROUP_HEADS, bool REVERSE>
__device__ __forceinline__ void launch_coords(int& head, int& b, int& m_block) {
  unsigned cx, cy, cz, nx, ny, nz;
  asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(cx));
  asm volatile("mov.u32 %0, %%ctaid.y;" : "=r"(cy));
  asm volatile("mov.u32 %0, %%ctaid.z;" : "=r"(cz));
  asm volatile("mov.u32 %0, %%nctaid.x;" : "=r"(nx));
  asm volatile("mov.u32 %0, %%nctaid.y;" : "=r"(ny));
  asm volatile("mov.u32 %0, %%nctaid.z;" : "=r"(nz));
  tile_coords<GROUP_HEADS, REVERSE>(cx + nx * (cy + ny * cz), nx, ny, ny * nz, head, b, m_block);
}
}  // namespace block

namespace warp {
// Sum / max across the 4 threads of a quad (the threads sharing one accumulator row).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
}  // namespace warp

}  // namespace fg
