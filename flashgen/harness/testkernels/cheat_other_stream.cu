// Cheat: a one-block entry that launches the real work from the device into a fire-and-forget
// stream, hoping the host's events stop before the work does. Needs -rdc=true and cudadevrt.
#include "simple_attention.cuh"

__global__ void fg_hidden_work(const FlashgenAttnParams p) { fg_attend_block(p); }

extern "C" __global__ void fg_cheat(const FlashgenAttnParams p) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    dim3 grid((p.seqlen_q + FG_BLOCK_M - 1) / FG_BLOCK_M, p.heads, p.batch);
    fg_hidden_work<<<grid, 128, 0, cudaStreamFireAndForget>>>(p);
  }
}
