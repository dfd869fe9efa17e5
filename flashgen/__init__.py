"""flashgen: FlashAttention kernels written as LLM-TL, translated to CUDA, verified and benchmarked."""

__version__ = "0.1.0"


def __getattr__(name: str):
    # `import flashgen` stays light; the API (and the layers behind it) load on first use.
    if name in ("generate", "build", "Kernel"):
        from flashgen import api

        return getattr(api, name)
    raise AttributeError(f"module 'flashgen' has no attribute {name!r}")
