"""Verification against the fp64 reference (flashgen.reference.attention), built not to be fooled.

For every check case: fresh random inputs (seed recorded), outputs poisoned with a NaN whose bit
pattern the kernel cannot produce by accident (so "never written" is told apart from "computed
NaN"), inputs compared bitwise afterwards, and a second run on the SAME device buffers with new data
(a kernel that caches by pointer replays stale results and fails). The comparison and the
location summary (`compare_outputs`) are pure numpy, so they are tested without a GPU.
Tolerances and their reasons: docs/harness.md.
"""

from __future__ import annotations

import os
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field, model_serializer

from flashgen.abi import KernelManifest
from flashgen.reference import attention, random_alibi_slopes, random_inputs, visible_mask
from flashgen.targets import TARGETS
from flashgen.variant import DType, Norm, Shape, Variant


class Tolerance(BaseModel):
    rel: float = Field(description="bound on ||out - ref||_F / ||ref||_F")
    max_elem: float = Field(description="bound on max |out - ref| / max |ref| (the largest single error)")
    lse_atol: float
    lse_rtol: float


# Why these numbers: docs/harness.md ("Tolerances").
TOLERANCES: dict[DType, Tolerance] = {
    DType.fp16: Tolerance(rel=2e-3, max_elem=1e-2, lse_atol=1e-3, lse_rtol=1e-4),
    DType.bf16: Tolerance(rel=1e-2, max_elem=5e-2, lse_atol=1e-3, lse_rtol=1e-4),
    DType.fp32: Tolerance(rel=5e-3, max_elem=2e-2, lse_atol=2e-3, lse_rtol=2e-3),
}
# fp32 goes through tf32 mma (10-bit mantissa) on Q.K: score errors grow with |score|, so the
# large-magnitude case (scores in the hundreds) gets a looser bound for fp32 only.
FP32_LARGE_MAGNITUDE = Tolerance(rel=5e-2, max_elem=2e-1, lse_atol=2e-2, lse_rtol=2e-3)

# Poison bit patterns: quiet NaNs with an unusual payload (a computed NaN is canonical 0x7E00/0x7FC0/0x7FC00000).
POISON_BITS = {DType.fp16: np.uint16(0x7D5A), DType.bf16: np.uint16(0x7FA5), DType.fp32: np.uint32(0x7FA5A5A5)}
LSE_POISON_BITS = np.uint32(0x7FA5A5A5)

Layout = Literal["bhnd", "bnhd"]
#: the ALiBi slopes a case runs with: the standard ones (a null pointer), or the caller's (random, as FlashAttention's
#: tests make them: `torch.rand(B, H) * 0.3`) of shape (H) or (B, H)
AlibiSlopes = Literal["standard", "H", "BH"]


def tolerance_for(dtype: DType, magnitude: float = 1.0) -> Tolerance:
    if dtype is DType.fp32 and magnitude > 1.0:
        return FP32_LARGE_MAGNITUDE
    return TOLERANCES[dtype]


class CheckCase(BaseModel):
    """One shape a kernel is checked on."""

    name: str
    shape: Shape
    layout: Layout = "bhnd"
    magnitude: float = Field(default=1.0, description="q and k are scaled by this: scores grow as its square")
    alibi_slopes: AlibiSlopes = Field(default="standard", description="an ALiBi kernel's slopes: the standard ones, "
                                      "or random caller slopes of shape (H) or (B, H)")

    @model_serializer(mode="wrap")
    def _standard_slopes_left_out(self, handler):  # cases without caller slopes dump as before the field existed
        data = handler(self)
        if isinstance(data, dict) and data.get("alibi_slopes") == "standard":
            del data["alibi_slopes"]
        return data

    @property
    def label(self) -> str:
        s = self.shape
        kvh = f",KVH={s.kv_heads}" if s.kv_heads != s.H else ""
        mag = f", x{self.magnitude:g} magnitude" if self.magnitude != 1.0 else ""
        slopes = {"standard": "", "H": ", caller ALiBi slopes (H)", "BH": ", caller ALiBi slopes (B, H)"}[self.alibi_slopes]
        dv = f",DV={s.DV}" if s.DV is not None else ""
        return f"{self.name} (B={s.B},H={s.H}{kvh},N={s.N},M={s.M},D={s.D}{dv}, layout {self.layout}{mag}{slopes})"


class RunCheck(BaseModel):
    """The comparison of one run's outputs with the reference."""

    seed: int
    run: int = 1
    ok: bool
    rel_err: float
    max_abs_err: float
    max_err_at: list[int] | None = None
    tol: Tolerance
    bad_elements: int = 0
    unwritten_o: int = 0
    nonfinite_o: int = Field(default=0, description="NaN/inf the kernel wrote (poison excluded)")
    unwritten_lse: int = 0
    bad_lse: int = 0
    lse_max_err: float = 0.0
    empty_rows_wrong: int = 0
    inputs_modified: dict[str, int] = Field(default_factory=dict)
    detail: str = ""


class CaseResult(BaseModel):
    case: CheckCase
    ok: bool
    runs: list[RunCheck] = Field(default_factory=list)
    error: str | None = None


class VerifyReport(BaseModel):
    ok: bool
    kernel: str
    dtype: str | None = None
    variant: str | None = None
    seed: int | None = Field(default=None, description="base seed; each case/run seed is listed in its result")
    cases: list[CaseResult] = Field(default_factory=list)
    error: str | None = Field(default=None, description="a crash, hang or compile failure that stopped verification")
    summary: str = ""

    @classmethod
    def failed(cls, kernel: str, error: str, seed: int | None = None) -> VerifyReport:
        return cls(ok=False, kernel=kernel, seed=seed, error=error, summary=f"FAIL {kernel}: {error}")


# ---------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------

#: the default cases a benchmark or the tuner verifies a kernel on before timing it (`generate` and the GPU tests run
#: them all): ragged tails, rows that see no key, scores in the hundreds, and a persistent grid's walk over more work
#: tiles than CTAs (the benchmarks' shapes all walk several)
QUICK_CASES = ("tails", "n_gt_m", "large_magnitude", "persistent_walk")


def quick_cases(manifest: KernelManifest) -> list[CheckCase]:
    """The kernel's default cases named in QUICK_CASES (persistent_walk only where its grid is persistent)."""
    return [case for case in default_cases(manifest) if case.name in QUICK_CASES]


def default_cases(manifest: KernelManifest) -> list[CheckCase]:
    """Tails, N != M both ways, B and H > 1, GQA, both layouts, large magnitude, a persistent grid's walk and the
    variant's edges."""
    v, d = manifest.variant, manifest.head_dim
    g = v.kv_group
    heads = 2 * g
    kvh = heads // g if g > 1 else None

    def shape(b: int, n: int, m: int, h: int = heads) -> Shape:
        return Shape(B=b, H=h, N=n, M=m, D=d, KVH=(h // g if g > 1 else None), DV=manifest.head_dim_v)

    if v.split_kv:  # decode: few query rows, long keys
        cases = [CheckCase(name="decode", shape=shape(2, 1, 1000)),
                 CheckCase(name="decode_tail", shape=shape(1, 1, 333), layout="bnhd"),
                 CheckCase(name="decode_rows", shape=shape(2, 3, 517))]
    else:
        cases = [
            CheckCase(name="tails", shape=shape(2, 197, 197)),
            CheckCase(name="n_lt_m", shape=shape(1, 67, 301), layout="bnhd"),
            CheckCase(name="n_gt_m", shape=shape(2, 253, 130)),
            CheckCase(name="aligned", shape=shape(1, 256, 256), layout="bnhd"),
            CheckCase(name="large_magnitude", shape=shape(1, 128, 200), magnitude=8.0),
            CheckCase(name="single_row", shape=shape(1, 1, 77)),
        ]
        if any(launch.persistent() for launch in manifest.launches):
            # a persistent grid's CTAs walk several work tiles only where there are more tiles than CTAs (and what
            # one tile leaves to the next: the loads in flight, the shared memory's notes and barriers' phases, a
            # next tile's GEMMs begun under this one's epilogue). 2 H ceil(400 / rows) tiles, H a quarter of the
            # most SMs a known target has: 6 H of 192 rows (one CTA an SM) and 14 H of 64 (two) outnumber the CTAs
            # (132 SMs: H = 33, 198 and 462 tiles; H rounded up to the KV group); ragged; causal rows 0..299 see no key
            # (tiles without keys amid the walk)
            heads = max(target.sm_count for target in TARGETS.values()) // 4
            cases.append(CheckCase(name="persistent_walk", shape=shape(2, 400, 100, h=g * -(-heads // g))))
        if v.window is not None:
            w = v.window
            cases.append(CheckCase(name="window_edges", shape=shape(1, min(2 * w + 37, 1500), min(2 * w + 61, 1500)),
                                   layout="bnhd"))
        elif v.two_sided:  # both edges inside the keys, some rows (N > M) before the first key's window
            w = (v.window_left or 0) + (v.window_right or 0) + 1
            cases.append(CheckCase(name="window_edges", shape=shape(1, min(2 * w + 37, 1500), min(2 * w + 61, 1500)),
                                   layout="bnhd"))
    if kvh is None and g == 1:
        cases.append(CheckCase(name="many_heads", shape=shape(1, 40, 50, h=6)))
    if v.alibi:  # FlashAttention's alibi_slopes given by the caller, both shapes (the cases above: the standard ones)
        rows = (1, 3) if v.split_kv else (131, 77)
        cases += [CheckCase(name="alibi_slopes_h", shape=shape(2, rows[0], 190), alibi_slopes="H"),
                  CheckCase(name="alibi_slopes_bh", shape=shape(3, rows[1], 129), layout="bnhd", alibi_slopes="BH")]
    # A kernel whose launches change with the sizes (tiles per sequence length, Launch.when) runs at each bound and
    # on either side of it, so that every launch is verified (M = N + 37 at even N: N != M on one side or the other)
    for name, values in sorted(manifest.size_bounds.items()):
        for value in sorted(v for v in values if v >= 1):
            if name == "N":
                cases.append(CheckCase(name=f"bound_N{value}", shape=shape(1, value, value if value % 2 else value + 37)))
            elif name == "M":
                cases.append(CheckCase(name=f"bound_M{value}", shape=shape(1, min(value, 129), value)))
    return cases


# ---------------------------------------------------------------------------------------------
# Host-side dtype handling (bf16 as raw 16-bit words)
# ---------------------------------------------------------------------------------------------

def to_dtype_bits(x: np.ndarray, dtype: DType) -> np.ndarray:
    """float64 -> the kernel's storage (float16, uint16 bf16 words, float32), rounded to nearest even."""
    if dtype is DType.fp16:
        return x.astype(np.float16)
    if dtype is DType.fp32:
        return x.astype(np.float32)
    u = np.ascontiguousarray(x.astype(np.float32)).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def from_dtype_bits(x: np.ndarray, dtype: DType) -> np.ndarray:
    """The kernel's storage -> float64 (exactly). An output the kernel left unwritten holds the poison, a signalling
    NaN, whose widening raises the FPU's invalid flag: expected here, so numpy is told not to warn of it."""
    with np.errstate(invalid="ignore"):
        if dtype is DType.bf16:
            return (np.ascontiguousarray(x).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        return x.astype(np.float64)


def _raw_view(x: np.ndarray) -> np.ndarray:
    return x.view(np.uint16) if x.dtype.itemsize == 2 else x.view(np.uint32)


# ---------------------------------------------------------------------------------------------
# Comparison (pure numpy)
# ---------------------------------------------------------------------------------------------

def _ranges(values: np.ndarray, limit: int = 4) -> str:
    """Sorted ints as compact ranges: '0-15, 32-47, 60'."""
    values = np.unique(values)
    if values.size == 0:
        return "none"
    parts, start, prev = [], values[0], values[0]
    for x in values[1:]:
        if x != prev + 1:
            parts.append(f"{start}-{prev}" if prev != start else f"{start}")
            start = x
        prev = x
    parts.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ", ".join(parts[:limit]) + (f", ... ({len(parts) - limit} more ranges)" if len(parts) > limit else "")


def _heads_text(bh: np.ndarray, b: int, h: int) -> str:
    pairs = sorted({(int(x), int(y)) for x, y in bh})
    if len(pairs) == b * h:
        return f"all {b * h} (b, h) heads"
    shown = ", ".join(f"({x},{y})" for x, y in pairs[:6])
    return f"heads (b,h) {shown}" + (f" and {len(pairs) - 6} more" if len(pairs) > 6 else "") + f" of {b * h}"


def empty_rows(n: int, m: int, variant: Variant) -> np.ndarray:
    """Indices of query rows that see no key (O must be 0, LSE -inf)."""
    if not variant.causal and not variant.two_sided:
        return np.zeros(0, dtype=int)
    return np.nonzero(~visible_mask(n, m, variant).any(axis=1))[0]


def compare_outputs(o: np.ndarray, o_ref: np.ndarray, dtype: DType, variant: Variant, m: int, *,
                    o_unwritten: np.ndarray | None = None, lse: np.ndarray | None = None,
                    lse_ref: np.ndarray | None = None, lse_unwritten: np.ndarray | None = None,
                    inputs_modified: dict[str, int] | None = None, seed: int = 0, run: int = 1,
                    magnitude: float = 1.0, block_m: int | None = None, block_n: int | None = None) -> RunCheck:
    """Compare one run's O (B,H,N,D float64, NaN where unwritten) and LSE with the fp64 reference and
    describe what is wrong compactly: where (heads, rows, columns, first bad tile), how much, why."""
    tol = tolerance_for(dtype, magnitude)
    b, h, n, d = o_ref.shape
    o_unwritten = np.zeros(o.shape, bool) if o_unwritten is None else o_unwritten
    finite = np.isfinite(o)
    nonfinite_written = int((~finite & ~o_unwritten).sum())
    err = np.where(finite, np.abs(o - o_ref), np.inf)
    ref_scale = max(float(np.abs(o_ref).max(initial=0.0)), 1e-6)
    bad = err > tol.max_elem * ref_scale
    ref_norm = float(np.linalg.norm(o_ref))
    if finite.all():
        rel_err = float(np.linalg.norm(o - o_ref) / max(ref_norm, 1e-30)) if ref_norm > 0 else float(np.abs(o).max(initial=0))
    else:
        rel_err = float("inf")
    finite_err = np.where(finite, err, -1.0)
    max_at = np.unravel_index(int(np.argmax(finite_err)), err.shape) if finite.any() else None
    max_abs = float(err.max(initial=0.0))

    # Rows that see no key: O exactly 0 and LSE -inf, by the convention in flashgen.variant.
    empty_wrong = 0
    empty_idx = empty_rows(n, m, variant)
    if len(empty_idx):
        row_bad = ~(o[:, :, empty_idx, :] == 0).all(axis=-1)
        if lse is not None:
            row_bad |= ~np.isneginf(lse[:, :, empty_idx])
        empty_wrong = int(row_bad.sum())

    lse_bad = lse_unwritten_count = 0
    lse_max_err = 0.0
    lse_text = ""
    if lse_ref is not None and lse is not None:
        lse_unw = np.zeros(lse.shape, bool) if lse_unwritten is None else lse_unwritten
        lse_unwritten_count = int(lse_unw.sum())
        both_inf = np.isneginf(lse) & np.isneginf(lse_ref)
        with np.errstate(invalid="ignore"):
            lerr = np.where(both_inf, 0.0, np.abs(lse - lse_ref))
        lerr = np.where(np.isnan(lerr), np.inf, lerr)
        lse_bad_mask = lerr > tol.lse_atol + tol.lse_rtol * np.where(np.isfinite(lse_ref), np.abs(lse_ref), 0.0)
        lse_bad = int(lse_bad_mask.sum())
        if lerr.size:
            at = np.unravel_index(int(np.argmax(lerr)), lerr.shape)
            lse_max_err = float(lerr[at])
            if lse_bad:
                lse_text = (f"LSE: {lse_bad} rows off ({lse_unwritten_count} never written), rows "
                            f"{_ranges(np.nonzero(lse_bad_mask)[2])}; max error {lse_max_err:.3g} at (b,h,i)="
                            f"{tuple(int(x) for x in at)}: got {lse[at]:.6g}, expected {lse_ref[at]:.6g}")

    inputs_modified = {k: v for k, v in (inputs_modified or {}).items() if v}
    ok = (rel_err <= tol.rel and not bad.any() and not o_unwritten.any() and lse_bad == 0
          and empty_wrong == 0 and not inputs_modified)
    lines: list[str] = []
    if not ok:
        if rel_err > tol.rel:
            lines.append(f"relative error {rel_err:.3g} > {tol.rel:g} ({dtype.value})")
        if bad.any():
            idx = np.nonzero(bad)
            lines.append(f"{int(bad.sum())} of {bad.size} O elements off by more than {tol.max_elem:g}*max|ref| "
                         f"in {_heads_text(np.stack(idx[:2], 1), b, h)}; rows {_ranges(idx[2])}; columns {_ranges(idx[3])}")
            first = tuple(int(a[0]) for a in idx)
            if block_m:
                tiles = np.unique(idx[2] // block_m)
                lines.append(f"first bad tile: row tile {first[2] // block_m} (BLOCK_M={block_m}: rows "
                             f"{first[2] // block_m * block_m}-{min(n, (first[2] // block_m + 1) * block_m) - 1}) of head "
                             f"({first[0]},{first[1]}); bad row tiles {_ranges(tiles)} of {-(-n // block_m)}"
                             + (f"; N % BLOCK_M = {n % block_m} (a partial last tile)" if n % block_m else ""))
            else:
                lines.append(f"first bad element at (b,h,i,d)={first}")
            if block_n and block_n > 1 and m % block_n:
                lines.append(f"M={m} is not a multiple of BLOCK_N={block_n}: check the last key tile's masking")
        if o_unwritten.any():
            idx = np.nonzero(o_unwritten)
            lines.append(f"O never written: {int(o_unwritten.sum())} elements in {_heads_text(np.stack(idx[:2], 1), b, h)}; "
                         f"rows {_ranges(idx[2])}; columns {_ranges(idx[3])}"
                         + (f" (row tiles {_ranges(np.unique(idx[2] // block_m))} of BLOCK_M={block_m})" if block_m else ""))
        if nonfinite_written:
            lines.append(f"{nonfinite_written} NaN/inf values written to O")
        if max_at is not None:
            lines.append(f"max error among written values {float(err[max_at]):.3g} at (b,h,i,d)={tuple(int(x) for x in max_at)}: got {o[max_at]:.6g}, "
                         f"expected {o_ref[max_at]:.6g}")
        if lse_text:
            lines.append(lse_text)
        if empty_wrong:
            lines.append(f"{empty_wrong} rows that see no key are wrong: they must give O = 0"
                         + (" and LSE = -inf" if lse is not None else ""))
        if inputs_modified:
            lines.append("inputs modified by the kernel: " + ", ".join(f"{k} ({v} elements)" for k, v in inputs_modified.items()))
    return RunCheck(seed=seed, run=run, ok=ok, rel_err=rel_err, max_abs_err=max_abs,
                    max_err_at=[int(x) for x in max_at] if max_at is not None else None, tol=tol,
                    bad_elements=int(bad.sum()), unwritten_o=int(o_unwritten.sum()), nonfinite_o=nonfinite_written,
                    unwritten_lse=lse_unwritten_count, bad_lse=lse_bad, lse_max_err=lse_max_err,
                    empty_rows_wrong=empty_wrong, inputs_modified=inputs_modified, detail="; ".join(lines))


# ---------------------------------------------------------------------------------------------
# Running the checks on the GPU (inside the worker process)
# ---------------------------------------------------------------------------------------------

_PERM = {"bhnd": (0, 1, 2, 3), "bnhd": (0, 2, 1, 3)}  # logical (B,H,N,D) -> physical axes


def new_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


class _DeviceCase:
    """Device buffers of one case, kept across its runs (same pointers, new data): Q, K, V, O, LSE, and the call's
    ALiBi slopes and call-time tensors where the kernel takes them."""

    def __init__(self, cp, case: CheckCase, dtype: DType, with_lse: bool, manifest: KernelManifest | None = None):
        s = case.shape
        perm = _PERM[case.layout]
        self.cp, self.case, self.dtype, self.perm = cp, case, dtype, perm
        storage = {DType.fp16: cp.float16, DType.bf16: cp.uint16, DType.fp32: cp.float32}[dtype]

        def alloc(logical: tuple[int, ...]):
            physical = cp.empty(tuple(logical[i] for i in perm), dtype=storage)
            return physical, physical.transpose(perm)  # the logical view shares the pointer

        self.q_phys, self.q = alloc((s.B, s.H, s.N, s.D))
        self.k_phys, self.k = alloc((s.B, s.kv_heads, s.M, s.D))
        self.v_phys, self.v = alloc((s.B, s.kv_heads, s.M, s.dv))
        self.o_phys, self.o = alloc((s.B, s.H, s.N, s.dv))
        self.lse = cp.empty((s.B, s.H, s.N), dtype=cp.float32) if with_lse else None
        slopes = {"H": (s.H,), "BH": (s.B, s.H)}.get(case.alibi_slopes) if manifest and manifest.variant.alibi else None
        self.slopes = cp.empty(slopes, dtype=cp.float32) if slopes else None
        self.specs = manifest.call_tensors if manifest else []
        from flashgen.tl_spec.tensors import sizes_of

        self.tensors = {spec.name: cp.empty(spec.dims(sizes_of(s)), dtype=cp.int32 if spec.dtype == "int32"
                                            else cp.float32) for spec in self.specs}

    def call_time_inputs(self, seed: int) -> dict[str, np.ndarray]:
        """This run's caller slopes and call-time tensors (from `seed`), uploaded; returned as the host values (by
        name, the slopes as `alibi_slopes`) the reference reads."""
        from flashgen.tl_spec.tensors import fill_all, sizes_of

        s = self.case.shape
        host = fill_all(self.specs, sizes_of(s), seed)
        for name, values in host.items():
            self.tensors[name].set(values)
        if self.slopes is not None:
            host["alibi_slopes"] = random_alibi_slopes(s.B, s.H, seed, per_batch=self.slopes.ndim == 2)
            self.slopes.set(host["alibi_slopes"])
        return host

    def upload(self, q_bits, k_bits, v_bits) -> dict[str, np.ndarray]:
        sent = {}
        for name, bits, phys in (("q", q_bits, self.q_phys), ("k", k_bits, self.k_phys), ("v", v_bits, self.v_phys)):
            host = np.ascontiguousarray(bits.transpose(self.perm))
            phys.set(host)
            sent[name] = host
        return sent

    def poison(self) -> None:
        self.o_phys.view(self.cp.uint16 if self.o_phys.itemsize == 2 else self.cp.uint32).fill(POISON_BITS[self.dtype])
        if self.lse is not None:
            self.lse.view(self.cp.uint32).fill(LSE_POISON_BITS)

    def modified_inputs(self, sent: dict[str, np.ndarray]) -> dict[str, int]:
        changed = {}
        for name, phys in (("q", self.q_phys), ("k", self.k_phys), ("v", self.v_phys)):
            now = _raw_view(phys.get())
            changed[name] = int((now != _raw_view(sent[name])).sum())
        buffers = {**self.tensors, **({"alibi_slopes": self.slopes} if self.slopes is not None else {})}
        for name, buf in buffers.items():
            if name in sent:
                changed[name] = int((buf.get() != sent[name]).sum())
        return changed

    def outputs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
        o_bits = self.o_phys.get().transpose(np.argsort(self.perm))
        unwritten = _raw_view(np.ascontiguousarray(o_bits)) == POISON_BITS[self.dtype]
        o = from_dtype_bits(o_bits, self.dtype)
        if self.lse is None:
            return o, unwritten, None, None
        lse_host = self.lse.get()
        return o, unwritten, lse_host.astype(np.float64), lse_host.view(np.uint32) == LSE_POISON_BITS


def verify_kernel(kernel, cases: list[CheckCase] | None = None, seed: int | None = None, runs_per_case: int = 2,
                  stop_after_failures: int = 3, scale: float | None = None) -> VerifyReport:
    """Compile (if needed), load and check `kernel` (a device.KernelInput) on every case; needs a GPU.
    A CUDA error raises KernelRunError naming the kernel and case (the worker turns it into a failed result).
    `scale`: the softmax scale the kernel and the reference run with (None: 1/sqrt(D))."""
    from flashgen.harness.device import (
        CompileFailed,
        KernelRunError,
        _cupy,
        ensure_compiled,
        launch,
        load_kernel,
        runnable_arch,
    )

    cp = _cupy()
    manifest: KernelManifest = kernel.manifest
    variant, dtype = manifest.variant, manifest.dtype
    base_seed = new_seed() if seed is None else int(seed)
    cases = [c if isinstance(c, CheckCase) else CheckCase.model_validate(c) for c in (cases or default_cases(manifest))]
    try:
        _, cubin = ensure_compiled(kernel, runnable_arch(manifest))
    except CompileFailed as exc:
        return VerifyReport.failed(manifest.name, str(exc), seed=base_seed)
    loaded = load_kernel(cubin, manifest)
    block_m = _int_param(manifest, "BLOCK_M")
    block_n = _int_param(manifest, "BLOCK_N")
    with_lse = variant.return_lse or (variant.norm is Norm.softmax and variant.split_kv)
    results: list[CaseResult] = []
    failures = 0
    stream = cp.cuda.Stream(non_blocking=True)
    for case_no, case in enumerate(cases):
        if failures >= stop_after_failures:
            break
        if case.shape.D != manifest.head_dim or case.shape.DV != manifest.head_dim_v:  # the kernel's head dims
            case = case.model_copy(update={"shape": case.shape.model_copy(update={"D": manifest.head_dim,
                                                                                  "DV": manifest.head_dim_v})})
        dev = _DeviceCase(cp, case, dtype, with_lse, manifest)
        result = CaseResult(case=case, ok=True)
        for run in range(1, runs_per_case + 1):
            run_seed = (base_seed + 1000 * case_no + run) % (2 ** 32)
            q64, k64, v64 = random_inputs(case.shape, run_seed, scale_mag=case.magnitude)
            q_bits, k_bits, v_bits = (to_dtype_bits(x, dtype) for x in (q64, k64, v64))
            sent = dev.upload(q_bits, k_bits, v_bits)
            extra = dev.call_time_inputs(run_seed)
            sent.update(extra)
            dev.poison()
            cp.cuda.runtime.deviceSynchronize()
            step = f"verify case {case.label}, seed {run_seed}, run {run}"
            with stream:
                launch(manifest, loaded, dev.q, dev.k, dev.v, dev.o, lse=dev.lse, scale=scale, stream=stream, step=step,
                       alibi_slopes=dev.slopes, tensors=dev.tensors)
            try:
                cp.cuda.runtime.deviceSynchronize()  # the whole device: work left on other streams counts too
            except Exception as exc:
                names = ", ".join(lc.kernel for lc in manifest.launches)
                raise KernelRunError(f"CUDA error: {exc} in kernel {names} during {step}") from None
            o, o_unw, lse, lse_unw = dev.outputs()
            o_ref, lse_ref = reference_outputs(manifest, *(from_dtype_bits(x, dtype) for x in (q_bits, k_bits, v_bits)),
                                               scale=scale, call_time=extra)
            check = compare_outputs(o, o_ref, dtype, variant, case.shape.M, o_unwritten=o_unw,
                                    lse=lse if variant.return_lse else None,
                                    lse_ref=lse_ref if variant.return_lse else None,
                                    lse_unwritten=lse_unw if variant.return_lse else None,
                                    inputs_modified=dev.modified_inputs(sent), seed=run_seed, run=run,
                                    magnitude=case.magnitude, block_m=block_m, block_n=block_n)
            result.runs.append(check)
            if not check.ok:
                result.ok = False
                if run > 1 and all(r.ok for r in result.runs[:-1]):
                    check.detail = ("passes on fresh buffers but fails when the same buffers get new data "
                                    "(results cached by pointer or state kept between calls?); " + check.detail)
                break
        failures += not result.ok
        results.append(result)
        del dev
    report = VerifyReport(ok=all(r.ok for r in results) and len(results) == len(cases), kernel=manifest.name,
                          dtype=dtype.value, variant=variant.name, seed=base_seed, cases=results)
    report.summary = summarize(report, skipped=len(cases) - len(results))
    return report


def reference_outputs(manifest: KernelManifest, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                      scale: float | None = None, call_time: dict[str, np.ndarray] | None = None):
    """The fp64 (O, LSE) a kernel must match: flashgen.reference for its Variant or, for a kernel whose
    manifest carries the TL it was translated from (a custom mask or score function), that TL's own
    fp64 interpretation on the same inputs; at softmax scale `scale` (None: 1/sqrt(D)). `call_time`: the call's
    ALiBi slopes (`alibi_slopes`, (H) or (B, H); absent: the standard ones) and call-time tensors, by name."""
    call_time = dict(call_time or {})
    if manifest.reference_tl is None:
        if manifest.mod_tensors:
            raise ValueError(f"{manifest.name} reads call-time tensors but carries no reference TL that says how")
        return attention(q, k, v, manifest.variant, scale, alibi_slopes=call_time.get("alibi_slopes"))
    from flashgen.tl_spec import interpret, parse

    program = parse(manifest.reference_tl, filename=f"<{manifest.name} reference TL>")
    b, h, n, d = q.shape
    shape = Shape(B=b, H=h, N=n, M=k.shape[2], D=d, KVH=k.shape[1], DV=v.shape[-1] if v.shape[-1] != d else None)
    outputs = interpret(program, shape, inputs={"Q": q, "K": k, "V": v, **call_time}, scale=scale).outputs
    return outputs["O"], outputs.get("LSE")


def _int_param(manifest: KernelManifest, name: str) -> int | None:
    value = manifest.params.get(name)
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def summarize(report: VerifyReport, skipped: int = 0, max_chars: int = 3000) -> str:
    """Compact text a model can act on: one line per case, the failing ones with their detail."""
    head = (f"{'PASS' if report.ok else 'FAIL'} {report.kernel} ({report.dtype}, {report.variant}), base seed "
            f"{report.seed}: {sum(r.ok for r in report.cases)}/{len(report.cases) + skipped} cases pass")
    lines = [head]
    if report.error:
        lines.append(report.error)
    for result in report.cases:
        last = result.runs[-1] if result.runs else None
        if result.ok:
            worst = max((r.rel_err for r in result.runs), default=0.0)
            lines.append(f"  ok   {result.case.label}: rel err {worst:.2g}")
        else:
            where = f"seed {last.seed}, run {last.run} of the same buffers" if last else ""
            lines.append(f"  FAIL {result.case.label} [{where}]: {last.detail if last else result.error}")
    if skipped:
        lines.append(f"  ({skipped} more cases not run after {len(report.cases)} failures)")
    text = "\n".join(lines)
    return text if len(text) <= max_chars else text[: max_chars - 20] + "\n  ... (cut)"
