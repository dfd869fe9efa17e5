"""Render and compile the Hopper development kernels on a CPU machine (nvcc compiles sm_90a anywhere), so a GPU
call only loads cubins: python benchmarks/kernel_dev/hopper_build.py OUTDIR [NAME or PREFIX ...]."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jinja2

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from flashgen.abi import ABI_HEADER, Launch  # noqa: E402
from flashgen.harness.suite import MOD_SUITE, build_mask_kernel  # noqa: E402
from flashgen.targets import get_target  # noqa: E402
from flashgen.translators.backends import get_backend  # noqa: E402
from flashgen.translators.render import render  # noqa: E402
from flashgen.translators.rules import plan_for_variant  # noqa: E402
from flashgen.variant import DType, Variant  # noqa: E402

HERE = Path(__file__).resolve().parent
# The production tiles: the sm90 backend's measured table (flashgen/translators/backends/sm90/__init__.py), bf16.
TILES = {(d, order == "causal"): (t["BLOCK_M"], t["BLOCK_N"], t["STAGES"])
         for (arch, dt, d, order), t in get_backend("sm90").measured.items() if dt == "bf16"}
# 2^x without the SFU, for the E4/E2 schedules: x = n + f with n = round(x) (adding 1.5 * 2^23 leaves n in the low
# mantissa bits, so the float's bits shifted left by 23 are n << 23), 2^f on [-0.5, 0.5] by its degree-5 Taylor
# polynomial (relative error < 6e-6 over [-126, 0], g++ against exp2), n added to the exponent field; exactly 0 below -126 (and for -inf, a masked
# score), as ex2.approx.ftz gives. About 11 FMA-pipe and integer operations against one MUFU.EX2.
_EXP2_FMA = (
    "__device__ __forceinline__ float exp2_fma(float x) {\n"
    "  const float shifted = x + 12582912.0f;\n"
    "  const float f = x - (shifted - 12582912.0f);\n"
    "  float p = 1.3333558146e-3f;\n"
    "  p = fmaf(p, f, 9.6181291076e-3f);\n"
    "  p = fmaf(p, f, 5.5504108665e-2f);\n"
    "  p = fmaf(p, f, 2.4022650696e-1f);\n"
    "  p = fmaf(p, f, 6.9314718056e-1f);\n"
    "  p = fmaf(p, f, 1.0f);\n"
    "  const int bits = __float_as_int(p) + static_cast<int>(static_cast<unsigned>(__float_as_int(shifted)) << 23);\n"
    "  return x < -126.0f ? 0.0f : __int_as_float(bits);\n"
    "}\n")
_P1 = "const float p1 = fg::exp2_approx(fmaf(acc_s[j * 4 + h * 2 + 1], mult, -max_scaled));"
_P1_MIXED = ("const float p1 = {cond} ? exp2_fma(fmaf(acc_s[j * 4 + h * 2 + 1], mult, -max_scaled))\n"
             "                              : fg::exp2_approx(fmaf(acc_s[j * 4 + h * 2 + 1], mult, -max_scaled));")
_TRY_WAIT = r'mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n'
_TRY_WAIT_HINT = r'mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\n'
_WAIT_ARGS = '        : "r"(addr), "r"(phase)\n'
_WAIT_ARGS_HINT = '        : "r"(addr), "r"(phase), "r"(10000000u)\n'
# Session 4 schedules (versions/sm90-session4-schedules.cu.j2 with its flags as template globals): v1 = session 3's
# kernel (one CTA per work tile, versions/sm90-v1-grid-per-tile.cu.j2); P = persistent grid; PO = persistent + S of
# the next tile before P V (intra-warpgroup overlap); POP = PO + ping-pong; A = PO with Q double-buffered where it
# fits, Ag1 = A with GROUP_HEADS=1 (causal), Ap = A + ping-pong. "cur" is the production template.
S4 = "sm90-session4-schedules.cu.j2"
S5 = "sm90-session5-dynamic.cu.j2"
L2_BUDGET = 24 << 20  # of the H200's 60 MB L2
SCHEDULES = {"v1": dict(template="sm90-v1-grid-per-tile.cu.j2"),
             "P": dict(template=S4, flags=dict(intra_overlap=False, pingpong=False, q_buffers=1)),
             "PO": dict(template=S4, flags=dict(intra_overlap=True, pingpong=False, q_buffers=1)),
             "POP": dict(template=S4, flags=dict(intra_overlap=True, pingpong=True, q_buffers=1)),
             "A": dict(template=S4, flags=dict(intra_overlap=True, pingpong=False, q_buffers=2)),
             "Ag1": dict(template=S4, flags=dict(intra_overlap=True, pingpong=False, q_buffers=2),
                         update={"group_heads": 1}, only=lambda plan: plan.variant.causal),
             "Ap": dict(template=S4, flags=dict(intra_overlap=True, pingpong=True, q_buffers=2)),
             "cur": {},
             # Session 5: R = the production template with O stored from registers (o_via_tma off; session 4's
             # epilogue); D0/D1 = the dynamic (atomic counter) tile schedule with GROUP_HEADS 0 / 1, DL = dynamic with
             # launch-order groups sized by L2 (K/V of a group within L2_BUDGET), DLT = DL + O through TMA:
             # versions/sm90-session5-dynamic.cu.j2, measured slower than the static schedule and left out.
             "R": dict(options=dict(o_via_tma=False)),
             "D0": dict(template=S5, flags=dict(dynamic=True, l2_group_bytes=0), options=dict(o_via_tma=False),
                        update={"group_heads": 0}),
             "D1": dict(template=S5, flags=dict(dynamic=True, l2_group_bytes=0), options=dict(o_via_tma=False),
                        update={"group_heads": 1}),
             "DL": dict(template=S5, flags=dict(dynamic=True, l2_group_bytes=L2_BUDGET), options=dict(o_via_tma=False)),
             "DLT": dict(template=S5, flags=dict(dynamic=True, l2_group_bytes=L2_BUDGET)),
             # Session 6: T1 = O staged one 64-column chunk at a time (each chunk's store read before the next is
             # written), so that O leaves through TMA where the whole tile does not fit (d128 128x176, d256 128x64);
             # Tc = as many chunks at a time as fit. TA = tanh on the SFU's own tanh.approx.f32 (one MUFU op, ~2^-11
             # relative error) in place of fg::tanh_fast (EX2 + RCP), for softcap.
             "T1": dict(options=dict(o_chunked=True, o_stage_chunks=1)),
             "Tc": dict(options=dict(o_chunked=True)),
             "TA": dict(source_sub={"fg::tanh_fast(": "tanh_sfu("}, prelude=(
                 "__device__ __forceinline__ float tanh_sfu(float x) {\n  float y;\n"
                 "  asm(\"tanh.approx.f32 %0, %1;\" : \"=f\"(y) : \"f\"(x));\n  return y;\n}\n")),
             # Session 7 (measured 1-10 % slower, left out): E4 / E2 = a quarter / a half of the softmax's
             # exponentials on the FMA and integer pipes (exp2_fma below) instead of the SFU's EX2, for where the SFU
             # seemed to bound the tile: softcap (MUFU.TANH and EX2 on every score) and d64.
             "E4": dict(source_sub={_P1: _P1_MIXED.format(cond="(j & 1)")}, prelude=_EXP2_FMA),
             "E2": dict(source_sub={_P1: _P1_MIXED.format(cond="true")}, prelude=_EXP2_FMA),
             # Session 7 (measured 2-9 % slower, left out): AF = ALiBi's distance in float positions (exact below
             # 2^24): the key's per column from one I2F per tile, the row's per row, where
             # `fabsf((float)(qpos + diag - kpos))` put an I2F on every score.
             # Session 7: KC = the sm90 backend's share_key_terms switch (now the default; the schedule stays so
             # that a dev run can set it): a score function's calls on the key position alone (cos(k_idx)) once per
             # column and warp, shared by shuffles (backends.base.score_exprs). 3.7-4.6x on cos(k_idx).
             "KC": dict(options=dict(share_key_terms=True)),
             # Session 14: KN = share_key_terms off (each lane computes its 32 columns' terms itself), now that a
             # cos is 8 instructions without branches.
             "KN": dict(options=dict(share_key_terms=False)),
             # Session 8: LG = the sm90 backend's grid_groups switch: GROUP_HEADS = 0 (causal rows) walked in groups
             # of gridDim.x pairs so that a group's K/V stay in L2 across its query blocks (ncu: all pairs read
             # 1.7x cuDNN's DRAM bytes at causal d128 N = 512).
             "LG": dict(options=dict(grid_groups=True)),
             # Session 10 (measured 0-6 % slower than the shuffles, left out): KS = a score function's one key-only
             # term once per column and warpgroup (thread c computes column c while the tile's GEMMs run) through
             # shared memory, where KC's lanes compute four columns each and shuffle them to the warp. Needs
             # `git apply benchmarks/kernel_dev/versions/sm90-s10-key-terms-smem.patch` (its key_terms_via_smem).
             "KS": dict(options=dict(key_terms_via_smem=True)),
             # Session 11: SN = the sm90 backend's snake_rounds switch (now the default; NS = off): odd rounds of the
             # persistent walk take the round's tiles in reverse CTA order, so that causal rows' lengths even out
             # over a CTA's rounds.
             "SN": dict(options=dict(snake_rounds=True)),
             "NS": dict(options=dict(snake_rounds=False)),
             # Session 11: L2 = the l2_groups switch: grid_groups of as many pairs as keep their K and V within half
             # the L2 (ncu, causal d128 N = 1k: 2.1x cuDNN's DRAM bytes, L2 hit 43 % against 61 %).
             "L2": dict(options=dict(l2_groups=True)),
             # Session 12: PP = the pingpong switch: the consumer warpgroups take turns issuing their GEMMs (named
             # barriers), for the variants whose softmax phase is longer than plain's (ALiBi, softcap, cos).
             "PP": dict(options=dict(pingpong=True)),
             # VW = the production order but V's wait before the fence (as PP has it): ptxas then injects no
             # warpgroup.arrive (C7519) between the S and P V wgmmas; separates that from the turns.
             "VW": dict(source_sub={
                 "        fg::wgmma::fence();\n        issue_qk(s);\n        fg::mbar::wait(&v_full[s_prev], phase_prev);\n":
                 "        fg::mbar::wait(&v_full[s_prev], phase_prev);\n        fg::wgmma::fence();\n        issue_qk(s);\n"}),
             "AF": dict(source_sub={
                 "const int k_row0 = n_block * BLOCK_N;":
                     "const int k_row0 = n_block * BLOCK_N;\n      const float k_row0f = (float)k_row0;",
                 "const int kpos = k_row0 + (i >> 2) * 8 + 2 * t + (i & 1);":
                     "const int kpos = k_row0 + (i >> 2) * 8 + 2 * t + (i & 1);\n"
                     "          const float kposf = k_row0f + (float)((i >> 2) * 8 + 2 * t + (i & 1));\n"
                     "          const float qposf = (float)(q_row0 + row0 + ((i >> 1) & 1) * 8 + diag);",
                 "fabsf((float)(qpos + diag - kpos))": "fabsf(qposf - kposf)"}),
             # Session 14: CW = cos as the SFU's cos.approx after a Cody-Waite reduction (measured +4-6 %, now
             # production's fg::cos_approx: the dev copy it was built from is gone, CW is cur); CF = cosf, as before.
             "CW": {},
             "CF": dict(source_sub={"fg::cos_approx(": "cosf("}),
             # CWH = production with the key terms of a tile computed before the wait for its S (they read positions
             # only), so that they run under that tile's Q K^T instead of on the softmax's path (left out: +7 % at
             # N = 512, -2-3 % at 4k-16k).
             "CWH": dict(transform=lambda source: hoist_key_terms(source)),  # defined below
             # Session 15: KW = the key_terms_warp switch: a warp of the producer's warpgroup computes the key-only
             # terms of every key tile once per CTA into a ring of shared memory, and the consumers read them as
             # float4s (8 loads a tile and thread for 4 fg::cos_approx and 32 shuffles). Measured slower (session 16)
             # and retired in session 18: needs
             # `git apply benchmarks/kernel_dev/versions/sm90-s18-key-term-warp-retired.patch`.
             "KW": dict(options=dict(key_terms_warp=True)),
             # Session 16: CP = the causal_pairs switch: each CTA takes a pair's query blocks m_tiles - 1 - i and
             # i back to back (fg::block::paired_tile), which levels the CTAs' work by itself, so a round needs the
             # K/V of ctas / (m_tiles / 2) pairs, not of ctas pairs (ncu, causal d256 N = 1k: 2.5x the minimum HBM
             # bytes, DRAM 83 % busy).
             "CP": dict(options=dict(causal_pairs=True)),
             # Session 16 (measured 0-8 % slower, left out): QP = the prefetch_next_q switch: the producer prefetches its next work tile's Q into L2
             # (cp.async.bulk.prefetch.tensor) as it loads this tile's Q, for the short rows, where a Q tile (up to
             # 64 KB at d256) read from HBM at each tile boundary may be what the consumers wait for. Needs
             # `git apply benchmarks/kernel_dev/versions/sm90-s16-prefetch-next-q.patch`.
             "QP": dict(options=dict(prefetch_next_q=True)),
             # Session 17 (measured level, left out): EW = the idle_warpgroups switch: a consumer warpgroup whose
             # 64 rows all lie past seqlen_q passes the barriers on and computes nothing (192-row blocks at N = 512
             # and 1k leave one and two of the last block's three warpgroups without rows: 11 % of the tensor work
             # at plain d64). Needs `git apply benchmarks/kernel_dev/versions/sm90-s17-idle-warpgroups.patch`.
             "EW": dict(options=dict(idle_warpgroups=True)),
             # Session 17 (measured level, left out): SW = every mbarrier wait with a suspend-time hint (try_wait's
             # 4th operand, 10 ms at most: the thread sleeps until the phase completes instead of retrying); SWP =
             # only the producer's waits (the empty barriers). ncu, causal d64 N = 512: 5 M of the kernel's 65 M instructions are the producer's
             # try_wait retries (1.8 M loops on one empty barrier), on the SM sub-partition of two consumer warps.
             "SW": dict(source_sub={_TRY_WAIT: _TRY_WAIT_HINT, _WAIT_ARGS: _WAIT_ARGS_HINT}),
             "SWP": dict(transform=lambda source: producer_waits_hinted(source)),  # defined below
             # Session 18: WS = the key_terms_scratch switch: a key tile's key-only terms once per column and warp
             # as before, but each lane computes one float4 of them into the warp's slot of shared memory and reads
             # its own 32 as 8 float4s, between two __syncwarp (no shuffles); WSP = with ping-pong forced on, WSN =
             # off. Measured 3-4 % slower than the shuffles (cos), 1-6 % (two terms); not kept. Needs, on aefa9d8,
             # `git apply benchmarks/kernel_dev/versions/sm90-s18-key-terms-scratch.patch`.
             "WS": dict(options=dict(key_terms_scratch=True)),
             "WSP": dict(options=dict(key_terms_scratch=True, pingpong=True)),
             "WSN": dict(options=dict(key_terms_scratch=True, pingpong=False)),
             # Session 18: RN = production without row_key_limits (a masked tile's visibility per score from the
             # key's position and `visible`, as before; production compares each score's column with its row's
             # key limits from plan.key_range): session 18's A/B, the other way round
             "RN": dict(options=dict(row_key_limits=False)),
             # Session 19: G0 = l2_groups without its rounds condition (l2_group_rounds = 0): a grid group holds only
             # the pairs whose K and V fit half the L2 however few rounds of tiles that leaves, for the full rows at
             # 16k (B = 1: 8 / 16 pairs of 16 / 8 MB at d256 / d128 walk together, 128 MB against the H100's 50 MB
             # L2; the s18 grid read them at min 2.91 / 3.10 ms but medians 3.75 / 3.74), where the walk then takes
             # one or two pairs a round and every CTA of a round reads the same K and V.
             "G0": dict(options=dict(l2_group_rounds=0)),
             # Session 20: OT = the overlap_tiles switch: a work tile's last P V and the next work tile's first S
             # issued back to back, the epilogue (O's normalization and TMA store) under both, where the S used to
             # wait for it (short rows: N = 512 .. 2k, the document mask's 4 key tiles a row). Not with 64-key tiles
             # nor V wider than Q (kernel.schedule).
             # Session 21 measured OT 6-8 % slower than cur at N = 512 and 2k (NOTES.md); OT2, OT with two Q
             # buffers (the q_stages switch of commit 1f51e7b, removed since), level with OT.
             "OT": dict(options=dict(overlap_tiles=True)),
             # Session 21's DA (each k-step's wgmma descriptor as the first one's plus an add) is production since
             # e601a4f (fg::wgmma::desc_plus; +0.9..1.3 % in session 22's clock_watch blocks), so OT is session 22's OTDA.
             # Session 21: EX = the second of each column pair's exp2 on the FMA and integer pipes (fg::exp2_poly)
             # instead of the SFU: softcap's scores take two SFU ops each (tanh, exp2), 2048 SFU cycles a key-tile
             # pair at d128 against 2048 of tensor time; a quarter of them moved. Session 22 measured EX -11..-13 %
             # on softcap and -12..-22 % on d64, SC +2..4 %, SCEX below SC (NOTES.md).
             "EX": dict(transform=lambda source: exp2_half_on_fma(source)),  # defined below
             # Session 26: EXQ = a quarter of the softmax's exp2 on the FMA pipe (odd j's p1), with a leaner
             # polynomial than EX's (its constant term exactly 1 and x clamped to -127, so -inf gives exactly +0 with
             # no compare and select: ~8 FMA-pipe and integer operations against EX's ~11). Softcap's budget a key-tile
             # pair at d128 after the fold: tensor 2048 cycles, SFU 2048, issue ~1500; a quarter of the exp2 takes
             # the SFU to ~1790 and the issue to ~1790, under the tensor's 2048 (EX's half took the issue past it).
             "EXQ": dict(transform=lambda source: exp2_quarter_on_fma(source)),
             # Session 26: HP = the half_first_tile switch: a warpgroup whose rows see no key in the second half of
             # its work tile's first (diagonal) key tile issues that tile's S at N = BLOCK_N / 2 and its P V in half
             # the k-steps. At causal N = 512 with 128x128 tiles that is 10 % of the MMA (4 diagonal tiles of 10 a
             # row-block pair, one warpgroup's S and P V of each halved), 5.6 % at 1k. Not yet timed.
             "HP": dict(options=dict(half_first_tile=True), only=lambda plan: plan.variant.causal),
             # Session 23: SC (softcap's constants folded), AL (ALiBi's distance in float) and AL3 (AL, linear on the
             # key tiles on one side of the diagonal) were transforms of the source, measured in sessions 22-23 (NOTES.md;
             # AL -2 %, SC and AL3 taken). SC and AL3 are production's score forms since aced350 (plan.FactoredScore,
             # plan.DistanceTerm), so their anchors are gone from the source and the transforms with them.
             # Session 23: R2 = the diagonal tile's mask from a bit mask of each row's visible columns, built once a
             # tile (a few integer ops a row), each score's test one bit of it (ptxas's R2P moves seven bits into
             # predicates at once) where it was an ISETP against the row's limit and an FSEL: session 17's ncu had
             # the masked tile at 3 ops an element against cuDNN's ~1.5, at causal d64 N = 512. Measured as a
             # transform of the source; now production's bit_masks switch, which renders the same SASS loops.
             "R2": dict(options=dict(bit_masks=True), only=lambda plan: plan.variant.causal)}
RUN = ("cur",)  # the schedules built by default


_EX2_ANCHOR = '  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));\n  return y;\n}\n'
_P1_SFU = "const float p1 = fg::exp2_approx(fmaf(acc_s[j * 4 + h * 2 + 1], mult, -max_scaled));"


def exp2_p1_on_fma(source: str, helper: str, p1: str) -> str:
    """The source with `helper` (a device function of namespace fg) after fg::exp2_approx, and the softmax's p1
    computed by `p1` in place of fg::exp2_approx."""
    assert source.count(_EX2_ANCHOR) == 1 and source.count(_P1_SFU) == 1
    return source.replace(_EX2_ANCHOR, _EX2_ANCHOR + helper).replace(_P1_SFU, p1)


def exp2_half_on_fma(source: str) -> str:
    """EX: fg::exp2_poly beside fg::exp2_approx (2^x as a degree-3 polynomial of x's fraction in [-0.5, 0.5], its
    integer part added to the exponent bits: relative error 7.5e-5, fitted on the CPU; x below -126 gives 0, as
    ex2.approx gives for -inf; a NaN gives 0 where ex2 gives NaN), and the softmax's p1 (each thread's second column
    of a pair) on it: half the softmax's exp2, the FMA pipe's FADD / FFMA and an integer shift and add instead."""
    helper = """__device__ __forceinline__ float exp2_poly(float x) {
  const float xc = fmaxf(x, -127.0f);
  const float shifted = xc + 12582912.0f;  // 1.5 * 2^23: x rounded to an integer, in the low mantissa bits
  const float f = xc - (shifted - 12582912.0f);
  const float p = fmaf(fmaf(fmaf(0.05517052486538887f, f, 0.24260830879211426f), f, 0.693260908126831f), f,
                       0.9999282360076904f);
  const float r = __int_as_float(__float_as_int(p) + (__float_as_int(shifted) << 23));
  return x < -126.0f ? 0.0f : r;
}
"""
    return exp2_p1_on_fma(source, helper, _P1_SFU.replace("fg::exp2_approx(", "fg::exp2_poly("))


def exp2_quarter_on_fma(source: str) -> str:
    """EXQ: fg::exp2_poly3 beside fg::exp2_approx (2^x = 2^n 2^f, n = rint(x) by the 1.5 * 2^23 trick, 2^f on
    [-0.5, 0.5] as 1 + c1 f + c2 f^2 + c3 f^3, minimax relative error 1.0e-4 fitted on the CPU; x clamped to -127,
    where n = -127 and f = 0 make the bits 0x3f800000 - (127 << 23) = +0: -inf gives +0 as ex2.approx.ftz does; a NaN
    gives 0), and the p1 of odd j on it: a quarter of the softmax's exp2."""
    helper = """__device__ __forceinline__ float exp2_poly3(float x) {
  const float xc = fmaxf(x, -127.0f);
  const float shifted = xc + 12582912.0f;  // 1.5 * 2^23: xc rounded to an integer, in the low mantissa bits
  const float f = xc - (shifted - 12582912.0f);
  const float p = fmaf(fmaf(fmaf(0.05500906f, f, 0.24221097f), f, 0.6932829f), f, 1.0f);
  return __int_as_float(__float_as_int(p) + (__float_as_int(shifted) << 23));
}
"""
    argument = "fmaf(acc_s[j * 4 + h * 2 + 1], mult, -max_scaled)"
    return exp2_p1_on_fma(source, helper, f"const float p1 = (j & 1) ? fg::exp2_poly3({argument})\n"
                                          f"                                   : fg::exp2_approx({argument});")


def producer_waits_hinted(source: str) -> str:
    """SWP: a copy of fg::mbar::wait with SW's suspend-time hint, wait_hint, beside it, and the producer's waits
    (the empty barriers of Q, K and V) on it."""
    start = source.index("__device__ __forceinline__ void wait(uint64_t* bar, uint32_t phase) {")
    end = source.index("\n}\n", start) + 3
    hinted = source[start:end].replace("void wait(", "void wait_hint(")
    for old, new in ((_TRY_WAIT, _TRY_WAIT_HINT), (_WAIT_ARGS, _WAIT_ARGS_HINT)):
        assert old in hinted, old
        hinted = hinted.replace(old, new)
    source = source[:end] + hinted + source[end:]
    for bar in ("q_empty,", "&k_empty[s],", "&v_empty[s],"):
        assert f"fg::mbar::wait({bar}" in source, bar
        source = source.replace(f"fg::mbar::wait({bar}", f"fg::mbar::wait_hint({bar}")
    return source


def hoist_key_terms(source: str) -> str:
    """CWH: the key-terms block of scores_to_p as a lambda of its own (key_terms), called right before each wait
    for a tile's S, its result in kt0 at the consumer's scope."""
    start = source.index("      float kt0[BLOCK_N / 4];\n")
    end = source.index("\n      auto elementwise")
    block = source[start:end]
    source = source[:start] + source[end:]
    head = "    auto scores_to_p = [&](int n_block) {\n"
    hoisted = ("    float kt0[BLOCK_N / 4];\n    auto key_terms = [&](int n_block) {\n"
               "      const int k_row0 = n_block * BLOCK_N;\n"
               + block.replace("      float kt0[BLOCK_N / 4];\n", "") + "\n    };\n")
    assert source.count(head) == 1
    source = source.replace(head, hoisted + head)
    first = "      issue_qk(s);\n      fg::wgmma::wait<0>();\n"
    loop = "        fg::wgmma::wait<1>();  // S landed; P V may still run\n"
    assert source.count(first) == 1 and source.count(loop) == 1
    source = source.replace(first, "      issue_qk(s);\n      key_terms(n_end - 1);\n      fg::wgmma::wait<0>();\n")
    return source.replace(loop, "        key_terms(n_block);\n" + loop)


# Session 4 run 3: tiles for the persistent, overlapped kernel, mostly the causal rows at small N.
# Session 7: BLOCK_M = 64, one consumer warpgroup, two CTAs per SM (kernel.ctas_per_sm), for the short key loops of
# small N: d64 with 128-key tiles, d128 with 64 (what fits twice in an SM's shared memory).
SWEEP = {(64, True): ((128, 128, 2), (192, 64, 2), (64, 128, 2), (128, 128, 3)),
         (64, False): ((128, 128, 2), (64, 128, 2), (128, 128, 3)),
         (128, True): ((128, 96, 2), (128, 176, 2), (64, 64, 2)), (128, False): ((128, 128, 2), (64, 64, 2)),
         (256, True): ((128, 64, 2), (128, 80, 2)), (256, False): ((128, 64, 2),)}
# Session 10: causal d256 at 128x80 (O from registers: no chunk fits) against the table's 128x64 (two chunks through
# TMA), for a choice by N (session 6: 128x64 +34 % at N = 512, -9 % at 16k).
# Session 6: the variants suite's kernels (bf16 d128), at the tiles the production rules give them (None).
VARIANTS = {"softcap30": Variant(softcap=30.0), "alibi": Variant(alibi=True), "window256": Variant(causal=True, window=256)}
# Session 12: ALiBi at the other head dims (d64's three consumer warpgroups, d256's 64-key tiles) and causal, for PP.
VARIANT_DIMS = {"alibi": (64, 128, 256), "causal_alibi": (64, 128, 256)}
VARIANTS["causal_alibi"] = Variant(causal=True, alibi=True)
# Session 7: the mods suite's kernels (flashgen.harness.suite.MOD_SUITE, as `flashgen generate` builds them: the
# library's TL with the functions written in), bf16 d128 at the production tiles, named SCHED_NAME_bf16_d128; those
# without call-time tensors (hopper_dev.py and ncu_dev.py pass none).
# Session 14: two_terms, a score function with two key-only terms (a product and a sum: kt0 and kt1, 64 registers
# of shared terms), where the branch-free cos left ptxas 48-60 bytes of spills that cosf's did not.
DEV_MODS = {**MOD_SUITE, "two_terms": {"score_mod": "s * cos(k_idx + h) + exp(-k_idx / M)"}}
MODS = tuple(name for name, keywords in DEV_MODS.items() if "tensors" not in keywords)


def configs():
    """(name, variant, dtype, head dim, (BLOCK_M, BLOCK_N, STAGES), schedule): every schedule x production tile,
    the production template over SWEEP, then every schedule x the variants at their production tiles (named
    SCHED_VARIANT_bf16_d128)."""
    def entry(sched, d, causal, tiles):
        kind = "causal" if causal else "plain"
        bm, bn, st = tiles
        return f"{sched}_{kind}_bf16_d{d}_{bm}x{bn}s{st}", Variant(causal=causal), DType.bf16, d, tiles, sched

    for sched in SCHEDULES:
        for kind, variant in VARIANTS.items():
            for d in VARIANT_DIMS.get(kind, (128,)):
                yield f"{sched}_{kind}_bf16_d{d}", variant, DType.bf16, d, None, sched
        for mod in MODS:
            yield f"{sched}_{mod}_bf16_d128", mod, DType.bf16, 128, None, sched

    for sched in SCHEDULES:
        for (d, causal), tiles in TILES.items():
            yield entry(sched, d, causal, tiles)
    for (d, causal), sweep in SWEEP.items():
        for tiles in sweep:
            for sched in ("cur", "T1", "Tc", "SN", "L2", "QP", "CP", "EW", "PP", "SW", "SWP", "RN", "G0", "OT", "HP"):
                yield entry(sched, d, causal, tiles)


def render_one(out: Path, name, variant, dtype, d, tiles, sched) -> Path | None:
    """Render one kernel into out/name (serially: the schedule options are module state of the sm90 backend)."""
    from flashgen.translators.backends.sm90 import kernel

    target = get_target("h200")
    spec = SCHEDULES[sched]
    mods = variant if isinstance(variant, str) else None  # a MOD_SUITE name: built as generate builds it
    plan = plan_for_variant(Variant() if mods else variant, target, dtype, d)
    bm, bn, stages = tiles or (plan.block_m, plan.block_n, plan.stages)
    plan = plan.model_copy(update=dict(
        block_m=bm, block_n=bn, warps=bm // 16, stages=stages, backend="sm90", name=f"fg_{name}_sm90",
        **spec.get("update", {})))
    if "only" in spec and not spec["only"](plan):
        return None
    saved_env = kernel._environment
    with kernel.schedule_overrides(**spec.get("options", {})):
        try:
            if "template" in spec:  # an older template from versions/, under the production name
                env = jinja2.Environment(
                    loader=jinja2.FileSystemLoader([str(HERE / "versions"), str(kernel.TEMPLATES)]),
                    undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
                env.globals.update(spec.get("flags", {}))
                env.get_template = lambda _name, _t=spec["template"], _g=env.get_template: _g(_t)
                kernel._environment = lambda: env
            if mods:
                source, manifest = build_mask_kernel("h200", dtype, Variant(), d, DEV_MODS[mods])
            else:
                source, manifest = render(plan)
        finally:
            kernel._environment = saved_env
    if "transform" in spec:
        source = spec["transform"](source)
    for old, new in spec.get("source_sub", {}).items():
        assert old in source, (name, old)
        source = source.replace(old, new)
    if "prelude" in spec:  # after the includes: the first line that opens the kernel's namespace
        head, sep, rest = source.partition("\nnamespace ")
        source = head + "\n" + spec["prelude"] + sep + rest
    q_buffers = spec.get("flags", {}).get("q_buffers", 1)
    if q_buffers == 2:  # the second Q buffer is only used where it fits, as the session-4 template had it
        extra = plan.block_m * kernel.chunks(d) * 64 * dtype.itemsize + 16
        if manifest.launches[0].smem_bytes + extra <= target.smem_per_block_bytes:
            manifest.launches[0].smem_bytes += extra
        else:
            source = source.replace("constexpr int Q_BUFFERS = 2;", "constexpr int Q_BUFFERS = 1;")
    if spec.get("flags", {}).get("dynamic"):  # the dynamic schedule's counter: a reset launch and the workspace
        manifest.launches.insert(0, Launch(kernel=f"{plan.name}_reset", grid=("1", "1", "1"), threads=32))
        manifest.workspace_floats = "1"
    if sched == "v1":  # one CTA per work tile
        manifest.launches[0].grid = (f"cdiv(N, {bm})", "H", "B")
    kdir = out / name
    kdir.mkdir(parents=True, exist_ok=True)
    (kdir / "kernel.cu").write_text(source)
    (kdir / "manifest.json").write_text(manifest.model_dump_json(indent=1))
    return kdir


def compile_one(kdir: Path) -> str:
    name = kdir.name
    cmd = ["nvcc", "-gencode=arch=compute_90a,code=sm_90a", "-cubin", "-O3", "-std=c++17", "-lineinfo", "-Xptxas", "-v",
           "-I", str(ABI_HEADER.parent), "kernel.cu", "-o", "kernel.cubin"]
    run = subprocess.run(cmd, cwd=kdir, capture_output=True, text=True)
    (kdir / "ptxas.txt").write_text(run.stdout + run.stderr)
    tail = [line for line in (run.stdout + run.stderr).splitlines() if "registers" in line or "spill" in line
            or "warning" in line.lower() or "error" in line.lower() or "serialized" in line]
    return f"{name}: rc={run.returncode} " + " | ".join(t.strip() for t in tail)[:400]


if __name__ == "__main__":
    out = Path(sys.argv[1])
    wanted = set(sys.argv[2:])
    # names, or schedule prefixes ("D0_" builds every D0 kernel); none: the schedules in RUN at the production tiles
    todo = [c for c in configs() if (any(c[0] == w or c[0].startswith(w) for w in wanted) if wanted
                                     else c[5] in RUN and c[4] is not None and c[4] == TILES[(c[3], c[1].causal)])]
    todo = list({c[0]: c for c in todo}.values())  # a tile both in TILES and in SWEEP: one build
    kdirs = [k for k in (render_one(out, *c) for c in todo) if k is not None]
    with ThreadPoolExecutor(2) as ex:
        for line in ex.map(compile_one, kdirs):
            print(line, flush=True)
