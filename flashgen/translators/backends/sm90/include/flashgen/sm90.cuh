// flashgen Hopper (sm_90a) primitives: TMA tile loads completing on mbarriers, wgmma with shared-memory
// descriptors, warpgroup register reallocation and named barriers. Ops are named by the unit that runs them:
// fg::tma (the copy engine), fg::mbar (shared-memory barriers), fg::wgmma (the warpgroup tensor cores),
// fg::warpgroup (register reallocation, named barriers). Builds only for sm_90a
// (-gencode=arch=compute_90a,code=sm_90a): wgmma and setmaxnreg do not exist in plain sm_90.
#pragma once
#include "flashgen/common.cuh"

namespace fg {

// The host builds one CUtensorMap per tensor (flashgen.harness.tensormaps, cuTensorMapEncodeTiled) with
// 128-byte swizzle and a box of 64 head-dim elements x ROWS rows; the kernel takes them by value as a
// __grid_constant__ parameter, so they live in the constant bank and the copy engine reads them from there.
// FlashgenTensorMaps itself is declared in flashgen_abi.cuh.

namespace mbar {
// Every wait is bounded by the hardware's own suspend hint; a missing arrive shows as a hang that the
// harness's job timeout turns into a recorded failure.
__device__ __forceinline__ void init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the copy engine (the async proxy) before any TMA uses them.
__device__ __forceinline__ void fence_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
// The producer announces how many bytes the copies it issues next will deliver to this barrier.
__device__ __forceinline__ void arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
// Wait until the phase of parity `phase` has completed. A fresh barrier is in phase 0, so a wait for
// parity 1 returns at once: that is how a producer passes the first round of empty-stage waits.
__device__ __forceinline__ void wait(uint64_t* bar, uint32_t phase) {
  const uint32_t addr = smem_u32(bar);
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(addr), "r"(phase)
        : "memory");
  } while (!done);
}
// A value in shared memory that another role wrote before arriving on a barrier this warp waited for, read by lane
// 0 alone and shuffled to the warp, for a warp whose lane 0 alone arrives on the barrier that frees the value: an
// arrive releases only its own thread's accesses, so the reads of lanes that do not arrive would not be ordered
// before the writer's next store (compute-sanitizer's racecheck flags them). V: 4-byte words, trivially copyable.
template <typename V>
__device__ __forceinline__ V read_in_lane0(const V* src) {
  static_assert(sizeof(V) % 4 == 0, "read_in_lane0 moves 4-byte words");
  V value;
  const bool lane0 = (threadIdx.x & 31) == 0;
#pragma unroll
  for (int i = 0; i < (int)(sizeof(V) / 4); ++i) {
    const int word = lane0 ? reinterpret_cast<const volatile int*>(src)[i] : 0;
    reinterpret_cast<int*>(&value)[i] = __shfl_sync(0xffffffffu, word, 0);
  }
  return value;
}
}  // namespace mbar

namespace tma {
__device__ __forceinline__ void prefetch_map(const void* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
// One box of a 4-D tensor map (coordinates innermost first: head-dim element, row, head, batch) into shared
// memory, completing `bar`'s transaction count. Rows past the tensor's end arrive as zeros.
__device__ __forceinline__ void load_4d(void* smem_dst, const void* map, uint64_t* bar, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];"
      ::"r"(smem_u32(smem_dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2),
      "r"(c3)
      : "memory");
}
// One box from shared memory to the tensor (rows past the end are not written), then the bulk-group bookkeeping.
__device__ __forceinline__ void store_4d(const void* map, const void* smem_src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];"
               ::"l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(smem_src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}
__device__ __forceinline__ void store_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
__device__ __forceinline__ void store_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
// The committed stores have read their shared memory (it may be written again); the global writes may still fly.
__device__ __forceinline__ void store_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
// Ordinary shared-memory stores (the epilogue's) must be ordered before the copy engine reads them.
__device__ __forceinline__ void fence_shared_for_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
}  // namespace tma

namespace wgmma {
// A shared-memory matrix descriptor for a tile written by a 128-byte-swizzled TMA box: start address, leading
// and stride byte offsets (>> 4) and the swizzle mode (bits 62-63 = 1: 128 B). Tiles start 1024-byte aligned,
// so the base-offset field stays 0; a k step inside a 128-byte row just moves the start address.
//  K-major operand (Q, K: the reduction runs along the contiguous head dim): 8-row groups 1024 B apart (SBO);
//    LBO unused for swizzled K-major layouts.
//  MN-major operand (V in P @ V: the reduction runs along keys, rows of the tile): 64-column chunks LBO apart,
//    8-row groups SBO = 1024 B apart.
__device__ __forceinline__ uint64_t desc(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4);
  d |= static_cast<uint64_t>((lbo_bytes & 0x3FFFF) >> 4) << 16;
  d |= static_cast<uint64_t>((sbo_bytes & 0x3FFFF) >> 4) << 32;
  d |= 1ull << 62;
  return d;
}
// The descriptor `offset_bytes` past d's start: one add to the start-address field (bits 0-13, the address >> 4),
// where desc() of the moved address costs a mask, a shift and an or, or a whole rebuilt descriptor where ptxas
// cannot keep the k steps' in registers (plain d128's key-tile loop 740 -> 698 instructions; on an H100 +1.3 / +0.9 %
// at N = 512 / 2k, +0.4 / +2.9 % against the cuDNN timed beside each: small, and no loss; NOTES.md, session 22).
// No carry leaves the field while the address stays under 256 KB, as every shared-memory address does.
__device__ __forceinline__ uint64_t desc_plus(uint64_t d, uint32_t offset_bytes) {
  return (d & 0xFFFFFFFF00000000ull) | (static_cast<uint32_t>(d) + (offset_bytes >> 4));
}
// Register operands written by ordinary instructions must be fenced before a wgmma reads them.
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
// Keeps the compiler from moving accumulator reads or writes across an in-flight wgmma.
template <int R> __device__ __forceinline__ void fence_regs(float (&acc)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(acc[i])::"memory");
}
}  // namespace wgmma

namespace warpgroup {
// Moves registers from the producer warpgroup to the consumers (each a whole-warpgroup instruction; takes effect
// only under a register cap at entry, which __launch_bounds__(threads, 1) gives).
template <int REGS> __device__ __forceinline__ void regs_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(REGS)); }
template <int REGS> __device__ __forceinline__ void regs_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(REGS)); }
// A barrier among `threads` threads only (ids 1..15; 0 is __syncthreads'): the consumers sync without the producer.
__device__ __forceinline__ void bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
// Counts this warp's arrival at barrier `id` without waiting (the other side of a bar_sync).
__device__ __forceinline__ void bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
}  // namespace warpgroup

namespace block {
// A persistent grid's walk: the work tile a CTA takes in its `round`-th round of gridDim.x tiles. Plain: tile
// blockIdx.x + round * gridDim.x. SNAKE: odd rounds run the CTAs in reverse, so that the CTA given one round's
// longest tile (the order puts long causal rows first) is given the next round's shortest, and the CTAs' sums of
// causal row lengths stay level where in the plain walk CTA 0 gets the longest of every round (a model of the
// static schedule: 6 % over the mean at causal d128 4k-16k, 12 % at d256; NOTES.md, session 11).
template <bool SNAKE>
__device__ __forceinline__ int round_tile(int round) {
  const int cta = SNAKE && (round & 1) ? (int)gridDim.x - 1 - (int)blockIdx.x : (int)blockIdx.x;
  return round * (int)gridDim.x + cta;
}
}  // namespace block

}  // namespace fg
