// Turing block-level loads: no cp.async, so a tile is staged through registers. issue() starts the
// 16-byte global loads into registers (the caller then computes on the previous tile while they fly);
// land() writes them into the swizzled shared tile. Rows past the tensor's end are zero.
#pragma once
#define FG_ARCH 75
#include "flashgen/common.cuh"

namespace fg {
namespace block {

template <int ROWS, int COLS, typename T, int THREADS>
struct tile_loader {
  using L = st_layout<ROWS, COLS, sizeof(T)>;
  static constexpr int TOTAL = ROWS * L::CHUNKS;
  static constexpr int ITERS = (TOTAL + THREADS - 1) / THREADS;
  uint4 staged[ITERS];

  __device__ __forceinline__ void issue(T*, const T* gmem, long long row_stride, int rows_valid, int tid) {
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      const int idx = tid + i * THREADS;
      const int row = idx / L::CHUNKS, chunk = idx % L::CHUNKS;
      staged[i] = make_uint4(0u, 0u, 0u, 0u);
      if ((TOTAL % THREADS == 0 || idx < TOTAL) && row < rows_valid)
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

}  // namespace block
}  // namespace fg
#include "flashgen/mma.cuh"
