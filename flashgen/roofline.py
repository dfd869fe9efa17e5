"""Roofline estimates: the interpreter's operation and byte counts over a target's rates.

`OpCounts` is what flashgen.tl_spec's interpreter produces for one run of a TL program;
`estimate(counts, target, dtype)` turns it into a lower bound on time for that target.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class OpCounts(BaseModel):
    """Work done by one run of a TL program, as written (tile by tile, masked work included)."""

    mma_flops: float = Field(default=0.0, description="2*m*n*k for every GEMM tile")
    vector_flops: float = Field(default=0.0, description="elementwise arithmetic (scale, mask, max, sum, rescale)")
    sfu_ops: float = Field(default=0.0, description="transcendental evaluations: exp/exp2/tanh/log/sigmoid")
    bytes: dict[str, float] = Field(
        default_factory=dict,
        description="bytes moved per (level, direction), keys like 'global_read', 'global_write', "
        "'shared_read', 'shared_write'",
    )

    def add(self, other: "OpCounts") -> "OpCounts":
        merged = dict(self.bytes)
        for key, value in other.bytes.items():
            merged[key] = merged.get(key, 0.0) + value
        return OpCounts(mma_flops=self.mma_flops + other.mma_flops, vector_flops=self.vector_flops + other.vector_flops,
                        sfu_ops=self.sfu_ops + other.sfu_ops, bytes=merged)
