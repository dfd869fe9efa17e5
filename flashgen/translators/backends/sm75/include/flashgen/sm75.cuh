// Turing block-level loads: no cp.async, so a tile is staged through registers. issue() starts the
// 16-byte global loads into registers (the caller then computes on the previous tile while they fly);
// land() writes them into the swizzled shared tile. Rows past the tensor's end are zero, and so are the chunks
// of a TILE_COLS-wide tile past column COLS (the tensor cores' k-step padding): nothing past column COLS - 1 is read.
#pragma once
#define FG_ARCH 75
#include "flashgen/common.cuh"

namespace fg {

// 2^e exactly (subnormal, 0 or inf outside fp32's normal range): scale factors are powers of two so that
// applying and undoing them never rounds.
__device__ __forceinline__ float exp2i(int e) { return ldexpf(1.0f, e); }

namespace block {

template <int ROWS, int COLS, int TILE_COLS, typename T, int THREADS>
struct tile_loader {
  using L = st_layout<ROWS, TILE_COLS, sizeof(T)>;
  static constexpr int TOTAL = ROWS * L::CHUNKS;
  static constexpr int ITERS = (TOTAL + THREADS - 1) / THREADS;
  static_assert(COLS % L::CHUNK_ELEMS == 0 && COLS <= TILE_COLS, "whole 16-byte chunks, inside the tile");
  // the chunks of a row read from global (the rest are zeros); constant true where the tile is not padded
  __device__ __forceinline__ static bool data_chunk(int chunk) { return COLS == TILE_COLS || chunk < COLS / L::CHUNK_ELEMS; }
  uint4 staged[ITERS];

  __device__ __forceinline__ void issue(T*, const T* gmem, long long row_stride, int rows_valid, int tid) {
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      const int idx = tid + i * THREADS;
      const int row = idx / L::CHUNKS, chunk = idx % L::CHUNKS;
      staged[i] = make_uint4(0u, 0u, 0u, 0u);
      if ((TOTAL % THREADS == 0 || idx < TOTAL) && row < rows_valid && data_chunk(chunk))
        staged[i] = __ldg(reinterpret_cast<const uint4*>(gmem + row * row_stride + chunk * L::CHUNK_ELEMS));
    }
  }
  __device__ __forceinline__ void land(T* smem, int tid) {
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      const int idx = tid + i * THREADS;
      if (TOTAL % THREADS == 0 || idx < TOTAL)
        *reinterpret_cast<uint4*>(smem + L::chunk_offset(idx / L::CHUNKS, idx % L::CHUNKS)) = staged[i];
    }
  }
};

// ---- bf16 / fp32 inputs on fp16-only tensor cores (docs/turing-dtypes.md) ----

// Eight consecutive elements of one 16-byte fp16 chunk, read as 8 bf16 (one uint4) or 8 fp32 (two).
__device__ __forceinline__ void unpack8(float (&x)[8], const uint4 (&w)[1]) {  // bf16: exact widening
  const uint32_t words[4] = {w[0].x, w[0].y, w[0].z, w[0].w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    x[2 * i] = __uint_as_float(words[i] << 16);
    x[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ void unpack8(float (&x)[8], const uint4 (&w)[2]) {  // fp32
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    x[4 * j] = __uint_as_float(w[j].x);
    x[4 * j + 1] = __uint_as_float(w[j].y);
    x[4 * j + 2] = __uint_as_float(w[j].z);
    x[4 * j + 3] = __uint_as_float(w[j].w);
  }
}

// Max over the block through THREADS/32 shared slots (in the dynamic allocation: static shared memory would
// push a 48 KB tile set past the no-opt-in limit). The caller guarantees a __syncthreads between two calls on
// the same slots (the attention loop has one between any two lands of one tile kind).
template <int THREADS>
__device__ __forceinline__ float block_max(float x, float* partial) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = x;
  __syncthreads();
  float m = partial[0];
#pragma unroll
  for (int w = 1; w < THREADS / 32; ++w) m = fmaxf(m, partial[w]);
  return m;
}

// The exponent e with max|x| * 2^-e in [2^14, 2^15): the tile's largest value gets fp16's full mantissa, a
// binade of headroom keeps fp32 values that round up below 65504, and scaled products (< 2^30 each) and
// P.V sums stay far inside fp32. Clamped so that 2^-e is a normal float (tiles below 2^-113 keep less range).
__device__ __forceinline__ int tile_exponent(float amax) {
  if (!(amax > 0.0f)) return 0;  // an all-zero (or all-padding) tile
  const int e = int((__float_as_uint(amax) >> 23) & 0xffu) - 127 - 14;
  return max(-127, min(113, e));
}

// A ROWS x COLS tile of TG (bf16 or fp32) in global memory -> fp16 x * 2^-exp in an st_layout<.., 2> tile TILE_COLS
// wide (zero chunks past column COLS, as tile_loader's; a zero does not move the tile's max).
// Like tile_loader, issue() only starts the loads; land() (all threads, block-uniform) finds the tile's max
// |x|, picks exp and converts. NaN is ignored by the max and stays NaN; inf stays inf.
// At most MAX_EARLY 16-byte words per thread are in flight between issue() and land() (registers held across
// the caller's GEMMs); the rest of the tile is loaded inside land(), where it costs latency, not registers.
template <int ROWS, int COLS, int TILE_COLS, typename TG, int THREADS, int MAX_EARLY = 1 << 20>
struct scaled_tile_loader {
  using L = st_layout<ROWS, TILE_COLS, 2>;
  static_assert(COLS % 8 == 0 && COLS <= TILE_COLS, "whole 8-element chunks, inside the tile");
  // the chunks of a row read from global (the rest are zeros); constant true where the tile is not padded
  __device__ __forceinline__ static bool data_chunk(int chunk) { return COLS == TILE_COLS || chunk < COLS / 8; }
  static constexpr int TOTAL = ROWS * L::CHUNKS;
  static constexpr int ITERS = (TOTAL + THREADS - 1) / THREADS;
  static constexpr int WORDS = 8 * sizeof(TG) / 16;  // 16-byte global words per 8-element chunk
  static constexpr int EARLY = ITERS < MAX_EARLY / WORDS ? ITERS : MAX_EARLY / WORDS;  // chunks issued early
  static_assert(sizeof(TG) == 2 || sizeof(TG) == 4, "bf16 or fp32 inputs");
  uint4 staged[EARLY > 0 ? EARLY : 1][WORDS];
  int exp = 0;  // the shared tile holds x * 2^-exp
  float* amax_slots = nullptr;  // THREADS/32 floats of shared memory owned by this loader
  const TG* late_src = nullptr;  // where land() finds the chunks not issued early
  int late_stride = 0;  // a row stride (elements); the attention kernel's are far below 2^31
  int late_rows = 0;

  __device__ __forceinline__ void load(uint4 (&dst)[WORDS], int i, const TG* gmem, long long row_stride,
                                       int rows_valid, int tid) const {
    const int idx = tid + i * THREADS;
    const int row = idx / L::CHUNKS, chunk = idx % L::CHUNKS;
#pragma unroll
    for (int w = 0; w < WORDS; ++w) dst[w] = make_uint4(0u, 0u, 0u, 0u);
    if ((TOTAL % THREADS == 0 || idx < TOTAL) && row < rows_valid && data_chunk(chunk)) {
      const uint4* src = reinterpret_cast<const uint4*>(gmem + row * row_stride + chunk * 8);
#pragma unroll
      for (int w = 0; w < WORDS; ++w) dst[w] = __ldg(src + w);
    }
  }
  __device__ __forceinline__ static float chunk_amax(const uint4 (&words)[WORDS], float amax) {
    float x[8];
    unpack8(x, words);
#pragma unroll
    for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(x[j]));
    return amax;
  }
  __device__ __forceinline__ static void store_chunk(f16* smem, const uint4 (&words)[WORDS], float scale, int i,
                                                     int tid) {
    const int idx = tid + i * THREADS;
    if (TOTAL % THREADS == 0 || idx < TOTAL) {
      float x[8];
      unpack8(x, words);
      const uint4 h = make_uint4(pack2<f16>(x[0] * scale, x[1] * scale), pack2<f16>(x[2] * scale, x[3] * scale),
                                 pack2<f16>(x[4] * scale, x[5] * scale), pack2<f16>(x[6] * scale, x[7] * scale));
      *reinterpret_cast<uint4*>(smem + L::chunk_offset(idx / L::CHUNKS, idx % L::CHUNKS)) = h;
    }
  }

  __device__ __forceinline__ void issue(f16*, const TG* gmem, long long row_stride, int rows_valid, int tid) {
#pragma unroll
    for (int i = 0; i < EARLY; ++i) load(staged[i], i, gmem, row_stride, rows_valid, tid);
    if constexpr (EARLY < ITERS) {
      late_src = gmem;
      late_stride = int(row_stride);
      late_rows = rows_valid;
    }
  }
  // Late chunks are read twice (max, then convert; the second read hits L1/L2) so that no more than one of
  // them is held in registers at a time.
  __device__ __forceinline__ void land(f16* smem, int tid) {
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < EARLY; ++i) amax = chunk_amax(staged[i], amax);
#pragma unroll
    for (int i = EARLY; i < ITERS; ++i) {
      uint4 words[WORDS];
      load(words, i, late_src, late_stride, late_rows, tid);
      amax = chunk_amax(words, amax);
    }
    exp = tile_exponent(block_max<THREADS>(amax, amax_slots));
    const float scale = exp2i(-exp);
#pragma unroll
    for (int i = 0; i < EARLY; ++i) store_chunk(smem, staged[i], scale, i, tid);
#pragma unroll
    for (int i = EARLY; i < ITERS; ++i) {
      uint4 words[WORDS];
      load(words, i, late_src, late_stride, late_rows, tid);
      store_chunk(smem, words, scale, i, tid);
    }
  }
};

// Two adjacent output elements (columns 2t, 2t+1 of an accumulator row) straight from registers.
__device__ __forceinline__ void store2(bf16* dst, float a, float b) {
  *reinterpret_cast<uint32_t*>(dst) = pack2<bf16>(a, b);
}
__device__ __forceinline__ void store2(f32* dst, float a, float b) { *reinterpret_cast<float2*>(dst) = make_float2(a, b); }

}  // namespace block

namespace warp {
// Multiply a warp's accumulator fragments by one (power-of-two) factor.
template <int A, int B>
__device__ __forceinline__ void scale_frags(float (&x)[A][B][4], float factor) {
#pragma unroll
  for (int a = 0; a < A; ++a)
#pragma unroll
    for (int b = 0; b < B; ++b)
#pragma unroll
      for (int c = 0; c < 4; ++c) x[a][b][c] *= factor;
}
}  // namespace warp

}  // namespace fg
#include "flashgen/mma.cuh"
