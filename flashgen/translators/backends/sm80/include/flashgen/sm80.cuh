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
// Wait until at most PENDING of this thread's most recent groups are still in flight.
template <int PENDING>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING)); }

// ROWS x COLS tile of T (row stride in elements, last dim contiguous) into an st_layout tile TILE_COLS wide: the
// chunks past column COLS (the tensor cores' k-step padding, flashgen.translators.plan.padded_head_dim) are
// zero-filled like rows past the end, and nothing past column COLS - 1 is read.
template <int ROWS, int COLS, int TILE_COLS, typename T, int THREADS>
struct tile_loader {
  using L = st_layout<ROWS, TILE_COLS, sizeof(T)>;
  static constexpr int TOTAL = ROWS * L::CHUNKS;
  static constexpr int ITERS = (TOTAL + THREADS - 1) / THREADS;
  static_assert(COLS % L::CHUNK_ELEMS == 0 && COLS <= TILE_COLS, "whole 16-byte chunks, inside the tile");
  // the chunks of a row read from global (the rest are zeros); constant true where the tile is not padded
  __device__ __forceinline__ static bool data_chunk(int chunk) { return COLS == TILE_COLS || chunk < COLS / L::CHUNK_ELEMS; }

  // A thread copies chunk (tid % CHUNKS) of rows tid / CHUNKS + i * ROW_STEP: one base address and one
  // row step per thread, so the addresses of a tile cost two registers however many chunks a thread moves.
  static constexpr bool REGULAR = THREADS % L::CHUNKS == 0 && TOTAL % THREADS == 0;
  static constexpr int ROW_STEP = THREADS / L::CHUNKS;

  __device__ __forceinline__ void issue(T* smem, const T* gmem, long long row_stride, int rows_valid, int tid) {
    if constexpr (REGULAR) {
      const int row0 = tid / L::CHUNKS, chunk = tid % L::CHUNKS;
      const bool data = data_chunk(chunk);
      const T* src = gmem + row0 * row_stride + chunk * L::CHUNK_ELEMS;
      const long long step = ROW_STEP * row_stride;
#pragma unroll
      for (int i = 0; i < ITERS; ++i) {
        const int row = row0 + i * ROW_STEP;
        // a row past the end or a padding chunk reads nothing (source size 0: zero-filled), whatever its address
        cp_async_16(smem + L::chunk_offset(row, chunk), src + i * step, data && row < rows_valid);
      }
    } else {
#pragma unroll
      for (int i = 0; i < ITERS; ++i) {
        const int idx = tid + i * THREADS;
        if (TOTAL % THREADS == 0 || idx < TOTAL) {
          const int row = idx / L::CHUNKS, chunk = idx % L::CHUNKS;
          const bool valid = row < rows_valid && data_chunk(chunk);
          const T* src = gmem + (valid ? row * row_stride + chunk * L::CHUNK_ELEMS : 0);
          cp_async_16(smem + L::chunk_offset(row, chunk), src, valid);
        }
      }
    }
    cp_async_commit();
  }
  __device__ __forceinline__ void land(T*, int) { cp_async_wait_all(); }
};

}  // namespace block
}  // namespace fg
#include "flashgen/mma.cuh"
