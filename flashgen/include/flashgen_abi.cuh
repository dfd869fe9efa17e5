// The contract between a generated kernel and the harness that runs it (flashgen/abi.py).
// Every entry point is `extern "C" __global__ void NAME(const FlashgenAttnParams p)`.
// Strides are in elements; the last (head-dim) axis of every tensor is contiguous.
#pragma once

// At most this many call-time tensors (FlashgenAttnParams.mod_tensors) of at most this many dims each
// (flashgen.abi.MAX_MOD_TENSORS, MAX_MOD_RANK).
#define FLASHGEN_MAX_MOD_TENSORS 4
#define FLASHGEN_MAX_MOD_RANK 4

struct FlashgenAttnParams {
  const void* q;   // (B, H, N, D)   element type = the kernel's dtype
  const void* k;   // (B, KVH, M, D)
  const void* v;   // (B, KVH, M, D)
  void* o;         // (B, H, N, D)
  float* lse;      // (B, H, N) fp32, natural log; null when the variant has no LSE output
  float* workspace;  // split-KV partials (manifest.workspace_floats); null otherwise
  long long q_stride_b, q_stride_h, q_stride_n;
  long long k_stride_b, k_stride_h, k_stride_m;
  long long v_stride_b, v_stride_h, v_stride_m;
  long long o_stride_b, o_stride_h, o_stride_n;
  long long lse_stride_b, lse_stride_h;  // lse row stride is 1
  int batch, heads, kv_heads, seqlen_q, seqlen_k;
  int num_splits;  // split-KV decode: KV chunks per (b, h); 1 otherwise
  float scale;     // multiplies q.k (1/sqrt(D) by default)
  // ALiBi slopes given by the caller (FlashAttention's alibi_slopes, fp32 (H) or (B, H)): the slope of batch b, head h
  // is alibi_slopes[b * alibi_stride_b + h] (stride 0 for (H), the head axis contiguous). Null: the standard slopes
  // 2^(-8 (h + 1) / H). Read only by ALiBi kernels.
  const float* alibi_slopes;
  long long alibi_stride_b;
  // The call-time tensors of a kernel's score and mask functions (the TL's `Tensor` lines, manifest.mod_tensors), in
  // declaration order: element type int32 or fp32 as declared; mod_strides[i][a] is tensor i's stride (elements) along
  // its axis a. Unused slots are null / 0.
  const void* mod_tensors[FLASHGEN_MAX_MOD_TENSORS];
  long long mod_strides[FLASHGEN_MAX_MOD_TENSORS][FLASHGEN_MAX_MOD_RANK];
};

// Hopper kernels (the sm90 backend) take a second parameter: the TMA tensor maps of Q, K, V and O, encoded by the
// harness (flashgen.harness.tensormaps, cuTensorMapEncodeTiled) as the manifest's `tensor_maps` ask, and passed
// by value as `const __grid_constant__ FlashgenTensorMaps`. Each is the driver's 128-byte, 64-byte-aligned
// CUtensorMap, opaque here; a map the manifest does not ask for is zeros.
struct alignas(64) FlashgenTensorMap {
  unsigned long long opaque[16];
};
struct FlashgenTensorMaps {
  FlashgenTensorMap q, k, v, o;
};
