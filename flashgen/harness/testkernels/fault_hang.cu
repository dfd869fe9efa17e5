// Fault: never returns.
#include "simple_attention.cuh"

extern "C" __global__ void fg_fault(const FlashgenAttnParams p) {
  for (;;) {
    if (clock64() < 0) break;  // clock64 is volatile, so the loop cannot be optimised away
  }
}
