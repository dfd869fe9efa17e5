#include "simple_attention.cuh"

extern "C" __global__ void __launch_bounds__(128) fg_simple_attention(const FlashgenAttnParams p) {
  fg_attend_block(p);
}
