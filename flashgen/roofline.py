"""Roofline estimates: the interpreter's operation and byte counts over a target's rates.

`OpCounts` is what flashgen.tl_spec's interpreter produces for one run of a TL program;
`estimate(counts, target, dtype)` turns it into a lower bound on time for that target.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from flashgen.targets import Target
    from flashgen.variant import DType, Shape, Variant


class OpCounts(BaseModel):
    """Work done by one run of a TL program, as written (tile by tile, masked work included)."""

    mma_flops: float = Field(default=0.0, description="2*m*n*k for every GEMM tile")
    vector_flops: float = Field(default=0.0, description="elementwise arithmetic (scale, mask, max, sum, rescale)")
    sfu_ops: float = Field(default=0.0, description="transcendental evaluations: exp/exp2/tanh/log/sigmoid")
    bytes: dict[str, float] = Field(
        default_factory=dict,
        description="bytes moved per (level, direction), keys like 'global_read', 'global_write' (every "
        "global access as written: L2 traffic), 'dram_read', 'dram_write' (compulsory DRAM traffic: each global "
        "tensor once), 'shared_read', 'shared_write'",
    )

    def add(self, other: OpCounts) -> OpCounts:
        merged = dict(self.bytes)
        for key, value in other.bytes.items():
            merged[key] = merged.get(key, 0.0) + value
        return OpCounts(mma_flops=self.mma_flops + other.mma_flops, vector_flops=self.vector_flops + other.vector_flops,
                        sfu_ops=self.sfu_ops + other.sfu_ops, bytes=merged)


# ---------------------------------------------------------------------------------------------
# Estimates. Assumptions (each a lower bound on time, so a kernel can only be slower):
# - tensor:  mma_flops / the target's dense tensor peak for the input dtype the mma takes. A dtype
#            the target's tensor cores do not take runs on the primitive a translator would use:
#            bf16 on sm_75 -> converted to fp16 (fp16 rate); fp32 -> tf32 mma where the target has
#            it, else converted to fp16 like bf16. `tensor_dtype` and `tensor_note` say which rate was used.
# - vector:  every counted vector flop is one FP32 instruction per lane (max, add, scale, compare
#            are not fused), so the rate is the FP32 FMA peak / 2 (the peak counts an FMA as 2).
# - sfu:     exp/exp2/tanh/log/sigmoid each take one special-function-unit result; the SFU gives
#            16 results/clock/SM on 7.5..9.0 (programming guide throughput table) at the boost clock.
# - memory:  max(dram, l2). dram: the compulsory DRAM bytes ('dram_read' + 'dram_write': each global
#            tensor once) over the DRAM bandwidth; l2: the bytes as written (keys starting with "global":
#            a K/V tile re-read by every query tile, which L2 serves) over the target's L2 bandwidth.
#            Counts without the dram keys (older producers) keep the earlier rule: the "global" bytes
#            over the DRAM bandwidth; `memory_note` says so.
# - shared:  bytes whose key starts with "shared" over 128 B/clock/SM (32 banks x 4 B) at boost clock.
# The units run concurrently, so the bound is the largest term (`time_s`); `serial_time_s` is
# their sum, what a kernel that overlaps nothing would approach.
# ---------------------------------------------------------------------------------------------

Term = Literal["tensor", "vector", "sfu", "memory", "shared"]
DRAM_KEYS = frozenset({"dram_read", "dram_write"})


class RooflineEstimate(BaseModel):
    """A lower bound on the time of one run of a program on a target, term by term."""

    target: str
    dtype: str = Field(description="the kernel's element type")
    ceiling: Literal["datasheet", "measured"] = "datasheet"
    tensor_dtype: str = Field(description="the input type whose tensor (or FMA) rate was used for mma_flops")
    tensor_note: str | None = Field(default=None, description="why tensor_dtype differs from dtype, if it does")
    tensor_tflops: float = Field(description="rate used for the tensor term")
    tensor_s: float
    vector_s: float
    sfu_s: float
    memory_s: float = Field(description="max(dram_s, l2_s), or the earlier rule (see memory_note)")
    dram_s: float = Field(description="compulsory DRAM bytes over the DRAM bandwidth")
    l2_s: float | None = Field(default=None, description="as-written global bytes over the L2 bandwidth; None when "
                               "the counts lack the DRAM keys")
    memory_note: str | None = Field(default=None, description="how memory_s was computed when not max(dram_s, l2_s)")
    shared_s: float
    time_s: float = Field(description="lower bound: the largest term (units overlap perfectly)")
    serial_time_s: float = Field(description="sum of the terms (no overlap)")
    bound: Term = Field(description="the term that sets time_s")

    def terms(self) -> dict[str, float]:
        return {"tensor": self.tensor_s, "vector": self.vector_s, "sfu": self.sfu_s, "memory": self.memory_s,
                "shared": self.shared_s}

    def tflops_at_bound(self, flops: float) -> float:
        """TFLOP/s a kernel doing `flops` (e.g. attention_flops) would show if it ran at the bound."""
        return flops / self.time_s / 1e12 if self.time_s > 0 else float("inf")


def _tensor_rate(target: Target, dtype: str, ceiling: str) -> tuple[str, float, str | None]:
    taken = set(target.tensor_dtypes)
    if dtype in taken:
        used, note = dtype, None
    elif dtype == "bf16":
        used, note = "fp16", f"{target.arch} has no bf16 mma: bf16 is converted to fp16, fp16 tensor rate"
    elif dtype == "fp32" and "tf32" in taken:
        used, note = "tf32", "fp32 inputs go through tf32 mma"
    elif dtype == "fp32":
        # what the translator does there (docs/turing-dtypes.md): fp32 tiles converted to scaled fp16
        used, note = "fp16", f"{target.arch} has no tf32 mma: fp32 is converted to fp16 tiles, fp16 tensor rate"
    else:
        raise ValueError(f"no tensor rate for dtype {dtype!r} on {target.name}")
    rate = target.peak_tflops[used]
    if ceiling == "measured":
        rate = target.measured.get(f"{used}_gemm_tflops", rate)
    return used, rate, note


def estimate(counts: OpCounts, target: Target, dtype: DType | str,
             ceiling: Literal["datasheet", "measured"] = "datasheet") -> RooflineEstimate:
    """Lower bound on the run time of `counts` on `target` for element type `dtype` (fp16/bf16/fp32).
    ceiling="measured" uses the target's measured GEMM/copy/L2 ceilings where it has them."""
    dtype_name = getattr(dtype, "value", dtype)
    if dtype_name not in ("fp16", "bf16", "fp32"):
        raise ValueError(f"unknown dtype {dtype_name!r}; expected fp16, bf16 or fp32")
    used, tensor_tflops, note = _tensor_rate(target, dtype_name, ceiling)
    clock_hz = target.boost_clock_mhz * 1e6
    vector_ops_per_s = target.peak_tflops["fp32"] * 1e12 / 2
    sfu_ops_per_s = target.sfu_ops_per_clk_per_sm * target.sm_count * clock_hz
    bandwidth_gbs = target.mem_bandwidth_gbs
    if ceiling == "measured":
        bandwidth_gbs = target.measured.get("copy_gbs", bandwidth_gbs)
    shared_bytes_per_s = target.shared_bytes_per_clk_per_sm * target.sm_count * clock_hz
    global_bytes = sum(v for k, v in counts.bytes.items() if k.startswith("global"))
    shared_bytes = sum(v for k, v in counts.bytes.items() if k.startswith("shared"))
    if DRAM_KEYS & counts.bytes.keys():
        dram_s = sum(counts.bytes.get(k, 0.0) for k in DRAM_KEYS) / (bandwidth_gbs * 1e9)
        l2_gbs = target.measured.get("l2_gbs", target.l2_bandwidth_gbs) if ceiling == "measured" \
            else target.l2_bandwidth_gbs
        l2_s: float | None = global_bytes / (l2_gbs * 1e9)
        memory_s, memory_note = max(dram_s, l2_s), None
    else:
        dram_s = memory_s = global_bytes / (bandwidth_gbs * 1e9)
        l2_s, memory_note = None, ("counts have no dram_read/dram_write: every global byte as written is "
                                   "charged to DRAM (earlier rule, an overestimate where tiles are re-read)")
    terms: dict[str, float] = {
        "tensor": counts.mma_flops / (tensor_tflops * 1e12),
        "vector": counts.vector_flops / vector_ops_per_s,
        "sfu": counts.sfu_ops / sfu_ops_per_s,
        "memory": memory_s,
        "shared": shared_bytes / shared_bytes_per_s,
    }
    bound = max(terms, key=terms.__getitem__)
    return RooflineEstimate(target=target.name, dtype=dtype_name, ceiling=ceiling, tensor_dtype=used, tensor_note=note,
                            tensor_tflops=tensor_tflops, tensor_s=terms["tensor"], vector_s=terms["vector"],
                            sfu_s=terms["sfu"], memory_s=terms["memory"], dram_s=dram_s, l2_s=l2_s,
                            memory_note=memory_note, shared_s=terms["shared"],
                            time_s=terms[bound], serial_time_s=sum(terms.values()), bound=bound)


# ---------------------------------------------------------------------------------------------
# How much attention work a variant's mask leaves, for a shape: the one place that decides it (the
# benchmark's TFLOP/s, its roofline counts, the report's "TFLOP/s at the bound" and the suite's figures all
# read it). Positions follow flashgen/variant.py: bottom-right aligned, so query row i sits at key position
# i + M - N; causal: key j visible iff j <= i + M - N; a window W also needs (i + M - N) - j < W.
# ---------------------------------------------------------------------------------------------

class VisibleWork(BaseModel):
    """What a variant's mask lets through for one (batch, head) at N query rows and M keys."""

    pairs: int = Field(description="(query row, key) pairs that are visible: exact")
    rows: int = Field(description="query rows that see at least one key (the others only write O = 0)")
    keys: int = Field(description="keys that some row sees (the only ones a kernel must read)")
    counted_pairs: float = Field(description="the pairs FLOP counts take: FlashAttention's N*M/2 for causal "
                                             "with N = M and no window (within 1/N of exact), else `pairs`")


def _clamped_sum(first: int, count: int, top: int) -> int:
    """sum(min(max(first + i, 0), top) for i in range(count)) in closed form."""
    if count <= 0 or top <= 0:
        return 0
    last = first + count - 1
    lo, hi = max(first, 1), min(last, top - 1)  # the terms strictly between 0 and top are themselves
    middle = (lo + hi) * (hi - lo + 1) // 2 if hi >= lo else 0
    at_top = max(0, last - max(first, top) + 1)  # terms clamped to top
    return middle + at_top * top


def visible_work(variant: Variant, n: int, m: int) -> VisibleWork:
    if n <= 0 or m <= 0:
        return VisibleWork(pairs=0, rows=0, keys=0, counted_pairs=0.0)
    if variant.two_sided:
        return _two_sided_work(variant, n, m)
    if not variant.causal:
        return VisibleWork(pairs=n * m, rows=n, keys=m, counted_pairs=float(n * m))
    offset = m - n
    # row i sees the keys j < i + offset + 1 (at most m of them) less those below i + offset + 1 - W
    pairs = _clamped_sum(offset + 1, n, m)
    if variant.window is not None:
        pairs -= _clamped_sum(offset + 1 - variant.window, n, m)
    rows = min(n, max(0, n + offset))
    first_key = 0 if variant.window is None else max(0, max(offset, 0) - variant.window + 1)
    keys = m - first_key if rows else 0
    counted = n * m / 2 if n == m and variant.window is None else float(pairs)
    return VisibleWork(pairs=pairs, rows=rows, keys=keys, counted_pairs=counted)


def _two_sided_work(variant: Variant, n: int, m: int) -> VisibleWork:
    """FlashAttention's window size (left, right): row i (at key position p = i + M - N) sees the keys
    max(0, p - left) .. min(M - 1, p + right), none when p + right < 0; an unbounded side reaches past every key."""
    offset = m - n
    left = n + m if variant.window_left is None else variant.window_left
    right = n + m if variant.window_right is None else variant.window_right
    # keys below min(max(p + right + 1, 0), M), less those below min(max(p - left, 0), M)
    pairs = _clamped_sum(offset + right + 1, n, m) - _clamped_sum(offset - left, n, m)
    first_row = min(n, max(0, -offset - right))  # the rows before it see no key
    rows = n - first_row
    keys = m - max(0, first_row + offset - left) if rows else 0  # every row's window ends at or past its own key
    return VisibleWork(pairs=pairs, rows=rows, keys=keys, counted_pairs=float(pairs))


def attention_flops(shape: Shape, causal: bool | Variant = False) -> float:
    """The FLOPs TFLOP/s figures are reported by: 4*B*H*D (2*B*H*(D + Dv) where V has a head dim of its own) per
    counted (query, key) pair of `visible_work` (a
    Variant: its mask; 2 GEMMs of 2 FLOPs per multiply-add). A bare bool is FlashAttention's nominal formula
    (Shape.flops: 4*B*H*N*M*D, halved for causal), which is right for N = M without a window only."""
    if isinstance(causal, bool):
        return shape.flops(causal)
    return pair_flops(shape, visible_work(causal, shape.N, shape.M).counted_pairs)


def pair_flops(shape: Shape, pairs_per_head: float) -> float:
    """The FLOPs of `pairs_per_head` (query, key) pairs in each of B*H (batch, head)s: 4*D per pair (2*(D + Dv)
    where V has a head dim of its own), as attention_flops counts them."""
    if shape.DV is not None:  # V's own head dim: 2 FLOPs per multiply-add over D (Q K^T) and over Dv (P V)
        return 2.0 * shape.B * shape.H * (shape.D + shape.DV) * pairs_per_head
    return 4.0 * shape.B * shape.H * shape.D * pairs_per_head


def percent_of_roofline(measured_time_s: float, est: RooflineEstimate) -> float:
    """How close a measured time is to the bound, in percent (100 = at the roofline)."""
    if not measured_time_s > 0:
        raise ValueError(f"measured time must be positive, got {measured_time_s!r}")
    return 100.0 * est.time_s / measured_time_s
