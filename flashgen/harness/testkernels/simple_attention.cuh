// A plain, obviously-correct attention kernel for the harness's own tests: one warp per query row,
// keys one at a time, fp32 online softmax. Slow on purpose; it only has to be right.
// Configured by defines the loader (flashgen/harness/testkernels/__init__.py) prepends:
//   FG_DTYPE 0 fp32 | 1 fp16 | 2 bf16, FG_HEAD_DIM, FG_CAUSAL, FG_WINDOW (0 = none), FG_SOFTCAP (0 = none),
//   FG_ALIBI, FG_NORM 0 softmax | 1 relu | 2 sigmoid.
// Cheating kernels reuse it through FG_SCORE_HOOK / FG_P_HOOK (precision cheats).
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "flashgen_abi.cuh"

#if FG_DTYPE == 1
typedef __half fg_t;
__device__ __forceinline__ float fg_to_float(fg_t x) { return __half2float(x); }
__device__ __forceinline__ fg_t fg_from_float(float x) { return __float2half_rn(x); }
#elif FG_DTYPE == 2
typedef __nv_bfloat16 fg_t;
__device__ __forceinline__ float fg_to_float(fg_t x) { return __bfloat162float(x); }
__device__ __forceinline__ fg_t fg_from_float(float x) { return __float2bfloat16_rn(x); }
#else
typedef float fg_t;
__device__ __forceinline__ float fg_to_float(fg_t x) { return x; }
__device__ __forceinline__ fg_t fg_from_float(float x) { return x; }
#endif

#define FG_ROWS_PER_WARP 4
#define FG_WARPS 4
#define FG_BLOCK_M (FG_ROWS_PER_WARP * FG_WARPS)
#define FG_PER_LANE ((FG_HEAD_DIM + 31) / 32)

// Keep `bits` mantissa bits (round to nearest): what an fp8-like format would hold.
__device__ __forceinline__ float fg_round_mantissa(float x, int bits) {
  unsigned int u = __float_as_uint(x);
  const unsigned int drop = 23 - bits;
  u = (u + (1u << (drop - 1))) & ~((1u << drop) - 1u);
  return __uint_as_float(u);
}

#ifndef FG_SCORE_HOOK
#define FG_SCORE_HOOK(s) (s)
#endif
#ifndef FG_P_HOOK
#define FG_P_HOOK(x) (x)
#endif

__device__ __forceinline__ float fg_warp_sum(float x) {
  for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

// Computes query row i of head (b, h) with the 32 lanes of one warp and writes O (and LSE).
__device__ void fg_attend_row(const FlashgenAttnParams& p, int b, int h, int i, int lane) {
  const int n = p.seqlen_q, m = p.seqlen_k;
  const int kv_head = h / (p.heads / p.kv_heads);
  const fg_t* q = (const fg_t*)p.q + b * p.q_stride_b + h * p.q_stride_h + (long long)i * p.q_stride_n;
  const fg_t* k = (const fg_t*)p.k + b * p.k_stride_b + kv_head * p.k_stride_h;
  const fg_t* v = (const fg_t*)p.v + b * p.v_stride_b + kv_head * p.v_stride_h;
  fg_t* o = (fg_t*)p.o + b * p.o_stride_b + h * p.o_stride_h + (long long)i * p.o_stride_n;

  float qr[FG_PER_LANE], acc[FG_PER_LANE];
#pragma unroll
  for (int t = 0; t < FG_PER_LANE; ++t) {
    const int d = lane + 32 * t;
    qr[t] = d < FG_HEAD_DIM ? fg_to_float(q[d]) : 0.f;
    acc[t] = 0.f;
  }
  const long long qpos = (long long)i + (m - n);  // bottom-right alignment
  long long j_begin = 0, j_end = m;
#if FG_CAUSAL
  j_end = qpos + 1 < m ? qpos + 1 : m;
  if (j_end < 0) j_end = 0;
#endif
#if FG_WINDOW > 0
  j_begin = qpos - FG_WINDOW + 1 > 0 ? qpos - FG_WINDOW + 1 : 0;
#endif
  float row_max = -INFINITY, row_sum = 0.f;
  for (long long j = j_begin; j < j_end; ++j) {
    float dot = 0.f;
#pragma unroll
    for (int t = 0; t < FG_PER_LANE; ++t) {
      const int d = lane + 32 * t;
      if (d < FG_HEAD_DIM) dot += qr[t] * fg_to_float(k[j * p.k_stride_m + d]);
    }
    float s = fg_warp_sum(dot) * p.scale;
#if FG_SOFTCAP_ON
    s = FG_SOFTCAP * tanhf(s / FG_SOFTCAP);
#endif
#if FG_ALIBI
    s -= (p.alibi_slopes ? p.alibi_slopes[b * p.alibi_stride_b + h] : exp2f(-8.f * (h + 1) / p.heads))
         * fabsf((float)(qpos - j));
#endif
    s = FG_SCORE_HOOK(s);
#if FG_NORM == 0
    const float new_max = fmaxf(row_max, s);
    const float correction = expf(row_max - new_max);
    const float pj = FG_P_HOOK(expf(s - new_max));
    row_sum = row_sum * correction + pj;
    row_max = new_max;
#elif FG_NORM == 1
    const float correction = 1.f;
    const float pj = FG_P_HOOK(fmaxf(s, 0.f) / m);
#else
    const float correction = 1.f;
    const float pj = FG_P_HOOK(1.f / (1.f + expf(-(s - logf((float)m)))));
#endif
#pragma unroll
    for (int t = 0; t < FG_PER_LANE; ++t) {
      const int d = lane + 32 * t;
      if (d < FG_HEAD_DIM) acc[t] = acc[t] * correction + pj * fg_to_float(v[j * p.v_stride_m + d]);
    }
  }
#if FG_NORM == 0
  const float inv = row_sum > 0.f ? 1.f / row_sum : 0.f;
#else
  const float inv = 1.f;
#endif
#pragma unroll
  for (int t = 0; t < FG_PER_LANE; ++t) {
    const int d = lane + 32 * t;
    if (d < FG_HEAD_DIM) o[d] = fg_from_float(acc[t] * inv);
  }
#if FG_NORM == 0
  if (lane == 0 && p.lse != nullptr)
    p.lse[b * p.lse_stride_b + h * p.lse_stride_h + i] = row_sum > 0.f ? row_max + logf(row_sum) : -INFINITY;
#endif
}

// The honest grid: (cdiv(N, FG_BLOCK_M), H, B) blocks of 128 threads.
__device__ __forceinline__ void fg_attend_block(const FlashgenAttnParams& p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = 0; r < FG_ROWS_PER_WARP; ++r) {
    const int i = blockIdx.x * FG_BLOCK_M + warp * FG_ROWS_PER_WARP + r;
    if (i < p.seqlen_q) fg_attend_row(p, blockIdx.z, blockIdx.y, i, lane);
  }
}
