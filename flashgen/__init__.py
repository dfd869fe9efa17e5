"""flashgen: FlashAttention kernels written as LLM-TL, translated to CUDA, verified and benchmarked."""

__version__ = "0.1.0"
