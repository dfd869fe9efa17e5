// Fault: writes far outside every buffer (an illegal memory access).
#include "simple_attention.cuh"

extern "C" __global__ void fg_fault(const FlashgenAttnParams p) {
  if (threadIdx.x == 0 && blockIdx.x == 0) ((volatile float*)p.o)[1LL << 40] = 1.f;
}
