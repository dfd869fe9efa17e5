"""KernelPlan -> CUDA source + KernelManifest for the Hopper path (sm_90a: TMA, wgmma, warp specialization).

The kernel's shape is fixed by the hardware more than the sm80 path's: a producer warpgroup and CONSUMERS
consumer warpgroups of 64 query rows each (BLOCK_M = 64 * CONSUMERS), K/V in a ring of STAGES 128-byte-swizzled
TMA stages, S and O in wgmma accumulators. The variant pieces (score mods, visibility, tile ranges, prologue,
normalization) are the plan's C expressions, as on every path.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import cache
from pathlib import Path

import jinja2

from flashgen.abi import KernelManifest, Launch, TensorMapSpec
from flashgen.errors import UsageError
from flashgen.translators.backends.base import SHARED_TEMPLATES, positions_per_score, score_exprs, score_units
from flashgen.translators.backends.headers import inline_headers
from flashgen.translators.backends.sm90.wgmma import wrappers
from flashgen.translators.plan import KernelPlan, NormKind, padded_head_dim, substitute_name
from flashgen.variant import DType, head_dims_tag

HERE = Path(__file__).parent
TEMPLATES = HERE / "templates"
INCLUDE_DIRS = (HERE / "include", HERE.parents[1] / "include")
_CTYPE = {DType.fp16: "fg::f16", DType.bf16: "fg::bf16"}
# Registers per thread after setmaxnreg: the producer keeps what address arithmetic needs; the consumers take
# the rest (128 * (24 + 2 * 240) = 64512 of the SM's 65536). One consumer warpgroup (BLOCK_M = 64): two CTAs share
# an SM (2 * 128 * (24 + 232) = 65536), so that one's fill and drain (the first S and its softmax, the last P V and
# O's store, which nothing inside a CTA overlaps) can run beside the other's steady state.
PRODUCER_REGS = 24
CONSUMER_REGS = {1: 232, 2: 240, 3: 160}
CONSUMERS_MAX = 3
# Causal rows of up to this many query blocks walk in complementary couples (the causal_pairs switch): measured
# faster at N <= 4k (32 blocks of 128 rows), slower at 16k, not timed between (NOTES.md, session 16).
PAIRED_M_TILES = 32
# shared memory the hardware reserves per resident block (cudaDevAttrReservedSharedMemoryPerBlock on sm_90)
RESERVED_SMEM_PER_BLOCK = 1024
NOTES = ("Hopper path (sm_90a): persistent grid, TMA loads on mbarriers, wgmma, one producer and {consumers} "
         "consumer warpgroups")


def consumers(plan: KernelPlan) -> int:
    return plan.block_m // 64


def ctas_per_sm(plan: KernelPlan) -> int:
    """CTAs resident on one SM: two with one consumer warpgroup (their register split fits twice), else one."""
    return 2 if consumers(plan) == 1 else 1


def cta_smem_limit(plan: KernelPlan) -> int:
    """The shared memory one CTA may take: the per-block maximum, or with two CTAs per SM half of the SM's less
    what the hardware reserves for each block."""
    n = ctas_per_sm(plan)
    if n == 1:
        return plan.target.smem_per_block_bytes
    return min(plan.target.smem_per_block_bytes, plan.target.smem_per_sm_bytes // n - RESERVED_SMEM_PER_BLOCK)


def chunks(head_dim: int) -> int:
    """64-element column chunks (one 128-byte TMA box each) per row; a partial last chunk is zero-filled."""
    return -(-head_dim // 64)


def smem_bytes(plan: KernelPlan, o_stage_chunks: int | None = None, overlap_tiles: bool | None = None) -> int:
    """Q, STAGES x (K, V), O's staging tile when O leaves through TMA (`o_stage_chunks` of its 64-column chunks at
    a time, 0: stored from registers), the dummy operand tile of overlap_tiles (1024 bytes), the barriers (Q full
    and empty; per stage K and V full and empty), and slack to align the tiles to 1024 bytes (None: as the plan
    renders). Q's and K's rows are chunks(D) wide, V's and O's chunks(Dv)."""
    if o_stage_chunks is None or overlap_tiles is None:
        options = schedule(plan)
        o_stage_chunks = options["o_stage_chunks"] if o_stage_chunks is None else o_stage_chunks
        overlap_tiles = options["overlap_tiles"] if overlap_tiles is None else overlap_tiles
    chunk = 64 * plan.dtype.itemsize  # bytes of one row's 64-column chunk
    qk_rows, v_rows = plan.block_m + plan.stages * plan.block_n, plan.stages * plan.block_n
    return ((qk_rows * chunks(plan.head_dim) + v_rows * chunks(plan.dv)) * chunk + plan.block_m * o_stage_chunks * chunk
            + 8 * (2 + 4 * plan.stages) + tile_notes_bytes(plan) + 1024 * overlap_tiles + 1024)


def tile_notes_bytes(plan: KernelPlan) -> int:
    """Shared memory of the producer's notes to the consumers where the kernel tests its key tiles (the
    tiles_from_producer switch): the work tile (WorkTile: six ints and the tile test's per-block constants, 8 bytes
    each at most) and one int a stage (the key tile it holds, and whether it is the work tile's last)."""
    if not plan.skips_tiles:
        return 0
    return 8 * (6 + len(plan.skip_prologue)) + 4 * plan.stages


def key_limits(plan: KernelPlan) -> dict[str, str]:
    """The C of plan.key_range at the thread's two rows (q_row0 + row0 and 8 below it): key_hi0 / key_hi1, capped by
    seqlen_k, and key_lo0 / key_lo1 where there is a lower bound (the template subtracts the thread's first column)."""
    rows = {"0": "q_row0 + row0", "1": "q_row0 + row0 + 8"}
    hi, lo = plan.key_range.hi, plan.key_range.lo
    limits = {f"key_hi{r}": f"min(seqlen_k, {substitute_name(hi, 'qpos', row)})" if hi else "seqlen_k"
              for r, row in rows.items()}
    if lo:
        limits.update({f"key_lo{r}": f"({substitute_name(lo, 'qpos', row)})" for r, row in rows.items()})
    return limits


def schedule(plan: KernelPlan) -> dict:
    """The template's switches. o_via_tma: O is staged in shared memory (laid out as Q's chunks) and written by TMA
    stores, `o_stage_chunks` 64-column chunks at a time: all of them where they fit beside Q and the stages, else
    as many as fit (o_chunked; each group's store has read the staging tile before the next group is written);
    where not even one fits (d256 128x80), the consumers store O from registers. Measured on the H200 (NOTES.md):
    session 5, +18 % at causal d128 N = 512, +11 % at 1k, +2-4 % at d64, within noise at 16k; session 6, causal
    d256 128x64 two chunks at a time +28 % at N = 512 over the same tile from registers."""
    options = dict(o_via_tma=True, o_stage_chunks=chunks(plan.dv), o_chunked=True,  # O's chunks: Dv's
                   share_key_terms=True,  # score functions' key-only calls once per column and warp: cos(k_idx)
                   # a masked tile's visibility as one or two compares a score against the row's key limits, where
                   # the plan has them (plan.key_range: causal, windows, masks linear in the key), in place of the
                   # key's position and `visible` per score: H100, bf16, window 256 d128 +1..3 % at N = 512 .. 16k,
                   # causal d64 192x128 +1..2 % at N <= 1k, causal d64 128x128 and d128 level (NOTES.md, session 18)
                   row_key_limits=True,
                   # those limits as a bit mask a row (fg::rows::visible_prefix), each score one bit, tested in
                   # order after the scores so that ptxas moves them to predicates seven at once (R2P): the masked
                   # loop's ISETP a score (two with a window) gone; causal bf16 d64 / d128 +1.5 % at N = 512 on an
                   # H100, at 4k -5 / +1 / -5 % with the kernel listed first reading faster each time (NOTES.md,
                   # session 23). Off: measured with --settle in both orders (H100, session 25), causal d64 / d128
                   # +1.5..2 / +1 % at N = 512 but -2..4 / -1..2 % at 4k, window 256 d128 level (+-1.5 %, the first
                   # listed faster at 16k) against the +5..8 % predicted: the ISETP it removes do not bind there.
                   # Its GPU tests pass (tests/test_bit_masks_gpu.py, session 25).
                   bit_masks=False,
                   # odd rounds of the persistent walk in reverse CTA order (fg::block::round_tile): causal bf16
                   # d256 +7 / +8 / +9 % at N = 2k / 4k / 16k, d128 +6 % at 16k, d64 +1.5 %, plain and window 256
                   # level (NOTES.md, session 11)
                   snake_rounds=True,
                   # grid_groups of fewer pairs where their K and V would not fit half the L2 and the group still
                   # holds 3 rounds of tiles: causal bf16 d128 +7 / +17 / +5 % at N = 1k / 2k / 4k (NOTES.md, s11)
                   l2_groups=True,
                   # ... where the group still holds this many rounds of work tiles (the snake rounds even out
                   # causal rows' lengths over a group's rounds; groups of fewer lost up to 30 %: NOTES.md, s11)
                   l2_group_rounds=3,
                   # causal rows of up to PAIRED_M_TILES query blocks: a CTA takes a pair's blocks m_tiles - 1 - i
                   # and i back to back (fg::block::paired_tile) in place of grid_groups' order and the snake walk:
                   # causal bf16 d256 +32 / +51 / +19 / +6 % at N = 512 / 1k / 2k / 4k, d128 +9 / +10 / +9 / +4 %
                   # on an H100; at 16k 3-5 % slower (NOTES.md, session 16). Not for windows: their rows are level.
                   causal_pairs=True,
                   # where the kernel tests its key tiles (plan.skip_tile: mask functions), only the producer does:
                   # it hands each work tile and each key tile it loads to the consumers in shared memory, and the
                   # consumers run no tile tests of their own (no call-time tensor read, no ballots) before a tile's
                   # first S
                   tiles_from_producer=True,
                   # a work tile's last P V and the next work tile's first S issued back to back, this tile's
                   # epilogue under both (short rows' fill and drain; not with 64-key tiles nor V wider than Q,
                   # below). Off: correct on the GPU, but 6-8 % slower at N = 512 and 2k on an H100 (session 21: with
                   # an S in flight over the epilogue, ptxas no longer keeps Q's descriptors in registers and rebuilds
                   # them in every key tile's S, 44 more instructions a key tile; a second Q buffer changed nothing)
                   overlap_tiles=False,
                   pingpong=None,  # None: the rule below
                   # a warpgroup whose rows see no key in the second half of its work tile's first key tile (the
                   # diagonal's, where plan.key_range.hi rises with the row: causal, windows) issues that tile's
                   # S at N = BLOCK_N / 2 and its P V in half the k-steps: at causal N = 512 with 128x128 tiles
                   # 10 % of the MMA, 5.6 % at 1k. Not yet measured (session 26 found no machine to time it).
                   half_first_tile=False,
                   grid_groups=True)  # GROUP_HEADS = 0 in groups of gridDim.x pairs, so K/V stay in L2: causal
    # bf16 N = 512 d128 +13 %, d256 +8 %, d64 +2 %, d128 1k +7 %, window 256 +7-8 % (NOTES.md, session 8)
    # 85-131 -> 394-484 TF/s at N = 512..16k on the H200 (NOTES.md, session 7)
    options.update(_SCHEDULE_OVERRIDES)
    shared_terms = len(score_exprs(plan, "0")["key_terms"]) if options["share_key_terms"] else 0
    # not beside two shared key terms (64 registers of them): ptxas then spills 88 bytes, not 48 (causal bf16 d128
    # with a length mask, session 18); every other causal, window and ALiBi / softcap / GQA kernel keeps its count
    options["row_key_limits"] = options["row_key_limits"] and plan.key_range is not None and shared_terms < 2
    # 32 bits a row (key tiles of up to 128), and a masked score -inf (softmax's; the other normalizations store p)
    options["bit_masks"] = (options["bit_masks"] and options["row_key_limits"] and plan.block_n <= 128
                            and plan.norm.kind is NormKind.softmax)
    fits = [c for c in range(options["o_stage_chunks"], 0, -1)
            if (c == chunks(plan.dv) or options["o_chunked"])
            and smem_bytes(plan, c, options["overlap_tiles"]) <= cta_smem_limit(plan)]
    if not options["o_via_tma"] or not fits:
        options.update(o_via_tma=False, o_stage_chunks=0)
    else:
        options["o_stage_chunks"] = fits[0]
    del options["o_chunked"]
    options["grid_groups"] = options["grid_groups"] and plan.group_heads == 0
    options["tiles_from_producer"] = options["tiles_from_producer"] and plan.skips_tiles
    # not with 64-key tiles, nor where V's head dim is wider than Q's: there the next tile's barrier waits between
    # the last P V and the next S make ptxas serialize every wgmma (C7520, "compiler-inserted WG.AR in divergent
    # path"; nvcc 13.0, session 20: d64, d128, d256 at BLOCK_N = 64, and d64 / dv128; every production tile of head
    # dims 32 .. 128, both dtypes, and the d64 / d128 variants compile asynchronous: tests/test_overlap_tiles.py)
    options["overlap_tiles"] = options["overlap_tiles"] and plan.block_n > 64 and plan.dv <= plan.head_dim
    options["causal_pairs"] = (options["causal_pairs"] and plan.variant.causal and not plan.variant.window
                               and plan.group_heads == 0)
    if options["pingpong"] is None:
        # The consumer warpgroups take turns at the tensor cores where the tile's GEMMs per score are D + Dv <= 256
        # wide and either a score function computes on positions per score (ALiBi: bf16 d128 +5..8 % at N = 512 ..
        # 4k, causal d128 +2..7 %, d64 with three warpgroups +4..8 %; NOTES.md, session 12) or shares one key-only
        # term (cos(k_idx), with session 14's cos: +8 / +4 / +2 / 0 / 0 % at N = 512 .. 16k; session 17), or the
        # rows are causal at d64 in two warpgroups (the N <= 1k tile: +1..4 % in two calls; session 17; windows
        # not measured there). Not d256 (-1..-3 %: its GEMMs already cover the softmax), plain d128 (+1..2 % to 4k,
        # -3..-4 % beyond), causal d128 (-3..+2 %), softcap (SFU-bound, level).
        # one term shared by shuffles, as measured: with two (64 registers of terms) the turns spill 132 bytes, not 60
        key_terms = shared_terms == 1
        causal_d64 = (plan.variant.causal and not plan.variant.window and plan.head_dim + plan.dv <= 128
                      and consumers(plan) == 2)
        options["pingpong"] = (plan.head_dim + plan.dv <= 256
                               and (positions_per_score(plan, options["share_key_terms"]) or key_terms or causal_d64))
    options["pingpong"] = options["pingpong"] and consumers(plan) > 1  # turns need two warpgroups
    # a wgmma of N = BLOCK_N / 2 (a multiple of 8) and half the P V's k-steps of 16 keys; not beside overlap_tiles,
    # whose drain issues the next work tile's first S
    options["half_first_tile"] = (options["half_first_tile"] and plan.key_range is not None and plan.key_range.hi_rises
                                and plan.block_n % 32 == 0 and not options["overlap_tiles"])
    return options


# Development builds (benchmarks/kernel_dev/hopper_build.py) set these to try a schedule; empty in production.
_SCHEDULE_OVERRIDES: dict = {}


@contextmanager
def schedule_overrides(**options):
    """Render with these schedule switches (schedule()'s keys: o_via_tma, o_stage_chunks, o_chunked,
    share_key_terms, row_key_limits, bit_masks, grid_groups, snake_rounds, l2_groups, l2_group_rounds, causal_pairs,
    tiles_from_producer, overlap_tiles, pingpong, half_first_tile) in place of the
    defaults, as development builds and the tests of an unmeasured switch do."""
    unknown = set(options) - {"o_via_tma", "o_stage_chunks", "o_chunked", "share_key_terms", "row_key_limits",
                              "bit_masks", "grid_groups", "snake_rounds", "l2_groups", "l2_group_rounds", "causal_pairs",
                              "tiles_from_producer", "overlap_tiles", "pingpong", "half_first_tile"}
    if unknown:
        raise ValueError(f"unknown schedule switches: {sorted(unknown)}")
    saved = dict(_SCHEDULE_OVERRIDES)
    _SCHEDULE_OVERRIDES.update(options)
    try:
        yield
    finally:
        _SCHEDULE_OVERRIDES.clear()
        _SCHEDULE_OVERRIDES.update(saved)


def v_names(plan: KernelPlan) -> dict:
    """The names V's and O's width goes by in the template: D's own (D, CHUNKS, K's stage size) where V has no head
    dim of its own, so that those kernels render as they always have; else DV, V_CHUNKS, V_TILE_ELEMS and
    V_TILE_BYTES, which the template defines then."""
    own = plan.head_dim_v is not None
    return dict(own_dv=own, dims_tag=head_dims_tag(plan.head_dim, plan.head_dim_v), v_chunks_count=chunks(plan.dv),
                v_dim="DV" if own else "D", v_chunks="V_CHUNKS" if own else "CHUNKS",
                v_tile="V_TILE_ELEMS" if own else "KV_TILE_ELEMS", v_tile_bytes="V_TILE_BYTES" if own else "KV_TILE_BYTES")


def threads(plan: KernelPlan) -> int:
    return 128 * (consumers(plan) + 1)


def grid_x(plan: KernelPlan) -> str:
    """A persistent grid: as many CTAs as the running GPU's SMs (SMS) hold at once (ctas_per_sm each), or one per
    work tile when there are fewer."""
    n = ctas_per_sm(plan)
    return f"min(cdiv(N, {plan.block_m}) * H * B, {f'{n} * SMS' if n > 1 else 'SMS'})"


def validate(plan: KernelPlan) -> None:
    """What only this path asks of a plan (flashgen.translators.render.validate_plan checks the expressions, the
    stages and the shared memory against the Target for every backend)."""
    if plan.dtype not in _CTYPE:
        raise UsageError(f"{plan.name}: the sm90 path runs fp16 and bf16 (fp32 goes to the sm80 path)")
    if plan.block_m % 64 or not 1 <= consumers(plan) <= CONSUMERS_MAX:
        raise UsageError(f"{plan.name}: BLOCK_M={plan.block_m}: the sm90 path takes 64 rows per consumer "
                         f"warpgroup, 1..{CONSUMERS_MAX} of them")
    if ctas_per_sm(plan) > 1 and smem_bytes(plan) > cta_smem_limit(plan):
        raise UsageError(f"{plan.name}: tiles need {smem_bytes(plan)} bytes of shared memory, over the "
                         f"{cta_smem_limit(plan)} each of the {ctas_per_sm(plan)} CTAs that share an SM at "
                         f"BLOCK_M={plan.block_m} may take; lower block_n")
    if plan.block_n % 16 or not 16 <= plan.block_n <= 256:
        raise UsageError(f"{plan.name}: BLOCK_N={plan.block_n}: a multiple of 16 in 16..256 (wgmma N)")
    # Every supported head dim (KernelPlan checks it: a multiple of 8) works here: P V is one wgmma with N = D, which
    # takes any multiple of 8 up to 256, and Q K^T's k-steps of 16 run on over the zero columns TMA fills past D
    # (the tensor maps' inner dimension is D).
    if plan.variant.split_kv:
        raise UsageError(f"{plan.name}: split-KV decode runs on the sm80 path")


@cache
def _environment() -> jinja2.Environment:
    # this path's templates, then the shared ones it imports macros from (key_terms.cu.j2)
    loader = jinja2.FileSystemLoader([str(TEMPLATES), str(SHARED_TEMPLATES)])
    return jinja2.Environment(loader=loader, undefined=jinja2.StrictUndefined,
                              trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


def render(plan: KernelPlan) -> tuple[str, KernelManifest]:
    """CUDA source and manifest of the Hopper kernel for a plan that flashgen.translators.render.validate_plan
    (and so `validate`) accepted: call it through flashgen.translators.render.render."""
    n_consumers = consumers(plan)
    options = schedule(plan)
    # the score loop's i: column 8 (i >> 2) + 2t + (i & 1)
    shared_terms = score_exprs(plan, "(i >> 2) * 2 + (i & 1)", options.pop("share_key_terms"))
    context = dict(
        **options, plan=plan, ns=f"{plan.name}_cfg", ctype=_CTYPE[plan.dtype], consumers=n_consumers,
        chunks=chunks(plan.head_dim), d_pad=padded_head_dim(plan.head_dim, plan.dtype.itemsize),
        producer_regs=PRODUCER_REGS, consumer_regs=CONSUMER_REGS[n_consumers], ctas_per_sm=ctas_per_sm(plan),
        paired_m_tiles=PAIRED_M_TILES,
        reverse_m=plan.variant.causal, **score_units(plan, distance_terms=True), l2_group_bytes=plan.target.l2_bytes // 2,
        wgmma_wrappers=wrappers(plan.dtype.value,  # P V's N: Dv
                                ss_n=(plan.block_n, *([plan.block_n // 2] if options["half_first_tile"] else [])),
                                rs_n=(plan.dv,)),
        **v_names(plan), **shared_terms, key_limits=key_limits(plan) if options["row_key_limits"] else {},
        # the warpgroup's last row's key limit (its largest: hi rises), for half_first_tile
        wg_key_hi=(substitute_name(plan.key_range.hi, "qpos", "q_row0 + cw * 64 + 63")
                   if options["half_first_tile"] else None),
    )
    source = inline_headers(_environment().get_template("attention_fwd.cu.j2").render(**context), INCLUDE_DIRS)
    manifest = KernelManifest(
        name=plan.name, arch=plan.target.feature_arch or "sm_90a", dtype=plan.dtype, head_dim=plan.head_dim, variant=plan.variant,
        head_dim_v=plan.head_dim_v,
        launches=[Launch(kernel=plan.name, grid=(grid_x(plan), "1", "1"), threads=threads(plan),
                         smem_bytes=smem_bytes(plan, options["o_stage_chunks"], options["overlap_tiles"]))],
        # every tile parameter of the plan, as the other paths record them: Q_IN_REGS is the tile table's 1, which
        # this path ignores (wgmma reads Q from shared memory), recorded so that the record matches the table's
        # choice and meta.json can say where the parameters came from
        params={"BLOCK_M": plan.block_m, "BLOCK_N": plan.block_n, "WARPS": plan.warps,
                "STAGES": plan.stages, "Q_IN_REGS": int(plan.q_in_regs), "GROUP_HEADS": plan.group_heads},
        tensor_maps=[TensorMapSpec(tensor="q", box_rows=plan.block_m), TensorMapSpec(tensor="k", box_rows=plan.block_n),
                     TensorMapSpec(tensor="v", box_rows=plan.block_n),
                     *([TensorMapSpec(tensor="o", box_rows=64)] if options["o_via_tma"] else [])],
        notes=NOTES.format(consumers=n_consumers),
    )
    return source, manifest
