// Ampere+ block-level loads: global -> shared with cp.async (16 bytes, L2-only .cg), zero-filling rows
// past the tensor's end. issue() commits one group; land() waits for all of this thread's groups (the
// caller's __syncthreads makes them visible block-wide).
#pragma once
#define FG_ARCH 80
#include "flashgen/common.cuh"

namespace fg {
namespace block {

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }

// ROWS x COLS tile of T (row stride in elements, last dim contiguous) into an st_layout tile.
template <int ROWS, int COLS, typename T, int THREADS>
struct tile_loader {
  using L = st_layout<ROWS, COLS, sizeof(T)>;
  static constexpr int TOTAL = ROWS * L::CHUNKS;
  static constexpr int ITERS = (TOTAL + THREADS - 1) / THREADS;

  __device__ __forceinline__ void issue(T* smem, const T* gmem, long long row_stride, int rows_valid, int tid) {
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      const int idx = tid + i * THREADS;
      if (TOTAL % THREADS == 0 || idx < TOTAL) {
        const int row = idx / L::CHUNKS, chunk = idx % L::CHUNKS;
        const bool valid = row < rows_valid;
        const T* src = gmem + (valid ? row * row_stride + chunk * L::CHUNK_ELEMS : 0);
        cp_async_16(smem + L::chunk_offset(row, chunk), src, valid);
      }
    }
    cp_async_commit();
  }
  __device__ __forceinline__ void land(T*, int) { cp_async_wait_all(); }
};

}  // namespace block
}  // namespace fg
#include "flashgen/mma.cuh"
