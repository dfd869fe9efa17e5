// Cheat: returns at once, leaving O and LSE as they were.
#include "simple_attention.cuh"

extern "C" __global__ void fg_cheat(const FlashgenAttnParams p) {}
