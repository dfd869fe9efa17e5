"""Issue 15 item 2: key tiles a mask of positions leaves empty are skipped inside the kernel, by a conservative test.

- Soundness against every element: each mask below goes through the real pipeline (the library's TL with the mask
  written in, translated for sm_80), and the plan's `skip_tile` and `mask_tile` C, with flashgen/interval.cuh, are
  compiled by g++ and run over every (batch, head, query tile, key tile) of random sizes and tile shapes. A skipped
  tile must hold no visible (row, key) of the numpy brute force of the TL's mask (the interpreter's evaluation, not the
  kernel's C); a full key tile the plan does not mask must hold no invisible one. The share of empty tiles caught is
  printed (`pytest -s`); for the document, length, prefix-LM and banded masks it is all of them (their bounds are
  exact), for a mask that never empties a tile ((q + k) % 2 == 0) no tile is skipped.
- The numpy evaluation of the same analysis (flashgen.translators.tiles, what flashgen.mods.tile_report counts with)
  gives the C's answer on every tile.
- What is not analysed: a mask of the score, tensor reads at the tile's positions (DOC[q_idx]).
- Translation: kernels with such masks translate and compile with nvcc for sm_75, sm_80 (both K/V pipelines, split-KV)
  and sm_90a; kernels without mask functions carry no tile test (byte-identical sources: tests/test_kernel_hashes.py).
The GPU half is tests/test_tile_skipping_gpu.py.
"""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from flashgen.harness.environment import Environment
from flashgen.mods import make_mods, reference_program, tile_report
from flashgen.reference import visible_mask
from flashgen.tl_spec import ast, library, parse
from flashgen.translators import tiles, translate
from flashgen.translators.cexpr import evaluate
from flashgen.variant import DType, Variant
from tests import host_c

PLAIN = Variant(return_lse=True)
CAUSAL = Variant(causal=True, return_lse=True)
TWO_SIDED = Variant(window_left=100, window_right=20, return_lse=True)
LEN = {"LEN": "int32[B]:0..M"}
DOC_T = {"DOC": "int32[M]:0..3:sorted"}
# (label, mask, params, tensors, variant, exact): exact = every empty tile is caught (the bounds are exact)
MASKS = [
    ("document", "q_idx // DOC == k_idx // DOC", {"DOC": 96}, None, PLAIN, True),
    ("document_aligned", "q_idx // DOC == k_idx // DOC", {"DOC": 128}, None, PLAIN, True),
    ("length", "k_idx < LEN[b]", {}, LEN, PLAIN, True),
    ("prefix_lm", "k_idx < P or k_idx <= q_idx", {"P": 100}, None, PLAIN, True),
    ("banded", "abs(q_idx - k_idx) <= W", {"W": 50}, None, PLAIN, True),
    ("parity", "(q_idx + k_idx) % 2 == 0", {}, None, PLAIN, True),
    ("causal_document", "q_idx // DOC == k_idx // DOC", {"DOC": 80}, None, CAUSAL, False),
    ("two_sided_document", "q_idx // DOC == k_idx // DOC", {"DOC": 150}, None, TWO_SIDED, False),
    ("length_document", "k_idx < LEN[b] and q_idx // DOC == k_idx // DOC", {"DOC": 70}, LEN, PLAIN, False),
    ("where", "where(q_idx < N // 2, q_idx + 7 - k_idx, k_idx + 40 - M) > 0", {}, None, PLAIN, False),
    ("min_max_mod", "max(q_idx, 30) - min(k_idx, 50) >= cdiv(M, 3) - q_idx % 17", {}, None, PLAIN, False),
    ("not_period", "not (k_idx // 32 % 3 == 1) and (q_idx - k_idx) * 3 >= -200", {}, None, PLAIN, False),
    ("conditions_equal", "(k_idx < 100) == (q_idx < 60)", {}, None, PLAIN, False),
    ("heads_batches", "h * 64 <= k_idx and k_idx < (h + 1) * 64 + b * 10", {}, None, PLAIN, False),
    ("negative_floor", "-k_idx // 7 > -q_idx // 5 - 3", {}, None, PLAIN, False),
    ("negative_mod", "(q_idx - 3 * k_idx) % 11 != 4", {}, None, PLAIN, False),
    ("documents_tensor_and_length", "DOC[q_idx] == DOC[k_idx] and k_idx < LEN[b]", {}, {**DOC_T, **LEN}, PLAIN, False),
]
B, H = 2, 2
TILE_SHAPES = [(64, 64), (128, 64), (128, 128), (16, 32), (64, 16), (48, 80)]


def _translate(mask, params, tensors, variant, gpu="a100", dtype="fp16", head_dim=64):
    """(mods, TL, Translation) as `flashgen generate` makes them: the library's program with the mask written in and
    the tile parameters chosen for the target (flashgen.mods.reference_program)."""
    env = Environment()
    mods = make_mods(mask_mod=mask, params=params, tensors=tensors)
    tl = reference_program(mods, variant, env.target(gpu), DType(dtype), head_dim, env)
    return mods, tl, translate(parse(tl), gpu)


def _configs(seed: int) -> list[dict]:
    """Sizes and tile shapes: random ones, and some aligned to the tiles and the masks' constants."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(14):
        bm, bn = TILE_SHAPES[i % len(TILE_SHAPES)]
        if i < 4:  # aligned: whole tiles, whole documents
            n, m = bm * int(rng.integers(2, 6)) * 3, bn * int(rng.integers(2, 9)) * 3
        else:
            n, m = int(rng.integers(1, 700)), int(rng.integers(1, 700))
        lengths = rng.integers(0, m + 1, B)
        lengths[0] = [0, m, (m // bn) * bn, int(rng.integers(0, m + 1))][i % 4]  # none, all, a tile edge, any
        doc = np.sort(rng.integers(0, 4, m))
        out.append({"n": n, "m": m, "bm": bm, "bn": bn, "LEN": lengths.astype(np.int32), "DOC": doc.astype(np.int32)})
    return out


def _c_function(i: int, plan, tensor_names: list[str]) -> str:
    prologue = "\n".join(f"    const {c.ctype} {c.name} = {c.expr}; (void){c.name};" for c in plan.prologue)
    slots = "\n".join(f"  p.mod_tensors[{s}] = {name}; p.mod_strides[{s}][0] = 1;"
                      for s, name in enumerate(tensor_names))
    args = "".join(f", const int* {name}" for name in tensor_names)
    return f"""
static void run_{i}(int seqlen_q, int seqlen_k, int BLOCK_M, int BLOCK_N{args}, FILE* f) {{
  const int heads = {H}, batch = {B}, diag = seqlen_k - seqlen_q;
  (void)heads; (void)batch; (void)diag;
  FlashgenAttnParams p = {{}};
{slots}
  for (int b = 0; b < batch; ++b)
  for (int head = 0; head < heads; ++head) {{
    const int kv_head = head; (void)kv_head;
{prologue}
    for (int m_block = 0; m_block < (seqlen_q + BLOCK_M - 1) / BLOCK_M; ++m_block) {{
      fprintf(f, "%d %d ", (int)({plan.kv_tile_begin}), (int)({plan.kv_tile_end}));
      for (int n_block = 0; n_block < (seqlen_k + BLOCK_N - 1) / BLOCK_N; ++n_block) {{
        const int skip = ({plan.skip_tile}) ? 1 : 0;
        const int mask = ({plan.mask_tile}) ? 1 : 0;
        fputc('0' + skip + 2 * mask, f);
      }}
      fputc('\\n', f);
    }}
  }}
}}
"""


def _int_array(name: str, values) -> str:
    return f"static const int {name}[{len(values)}] = {{{', '.join(map(str, values))}}};"


def _run_tile_tests(cases, configs, tmp_path) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """One g++ program for every mask and config: per (mask, config) the tests' bits and the tiles the key loop walks
    (kv_tile_begin <= n < kv_tile_end), both [B, H, m tiles, n tiles]."""
    parts = [host_c.PRELUDE, host_c.INTERVALS]
    calls = []
    for i, (mods, plan) in enumerate(cases):
        names = [t.name for t in mods.tensors]
        parts.append(_c_function(i, plan, names))
        for j, cfg in enumerate(configs):
            for name in names:
                parts.append(_int_array(f"{name}_{i}_{j}", cfg[name]))
            args = "".join(f", {name}_{i}_{j}" for name in names)
            calls.append(f'  {{ FILE* f = fopen("out_{i}_{j}.txt", "w"); '
                         f'run_{i}({cfg["n"]}, {cfg["m"]}, {cfg["bm"]}, {cfg["bn"]}{args}, f); fclose(f); }}')
    parts.append("int main(void) {\n" + "\n".join(calls) + "\n  return 0;\n}")
    (tmp_path / "tiles.cpp").write_text("\n".join(parts))
    built = subprocess.run([*host_c.COMPILE, *host_c.INCLUDE, "-o", "tiles", "tiles.cpp", "-lm"],
                           cwd=tmp_path, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[:3000]
    subprocess.run(["./tiles"], cwd=tmp_path, check=True)
    out = []
    for i in range(len(cases)):
        per = []
        for j, cfg in enumerate(configs):
            rows = [line.split() for line in (tmp_path / f"out_{i}_{j}.txt").read_text().splitlines()]
            m_tiles, n_tiles = -(-cfg["n"] // cfg["bm"]), -(-cfg["m"] // cfg["bn"])
            bits = np.array([[int(c) for c in row[2]] for row in rows]).reshape(B, H, m_tiles, n_tiles)
            n = np.arange(n_tiles)
            walked = np.array([(int(row[0]) <= n) & (n < int(row[1])) for row in rows]).reshape(bits.shape)
            per.append((bits, walked))
        out.append(per)
    return out


def _visible(mods, variant, cfg) -> np.ndarray:
    """[B, H, N, M]: the brute force, the TL's meaning of the variant's mask and the mask function (numpy)."""
    from flashgen.mods import tl_expression

    n, m = cfg["n"], cfg["m"]
    q, k = np.meshgrid(np.arange(n), np.arange(m), indexing="ij")
    cond = tl_expression(mods.mask_mod, mods)
    out = np.zeros((B, H, n, m), dtype=bool)
    for b in range(B):
        for h in range(H):
            values = {"q_idx": q, "k_idx": k, "b": b, "h": h, "B": B, "H": H, "N": n, "M": m, "D": 64,
                      "LEN": cfg["LEN"], "DOC": cfg["DOC"]}
            out[b, h] = np.broadcast_to(np.asarray(evaluate(cond, values), dtype=bool), (n, m))
    return out & visible_mask(n, m, variant)


def _per_tile(vis: np.ndarray, bm: int, bn: int) -> tuple[np.ndarray, np.ndarray]:
    """(any visible, all visible) per tile over the valid rows and keys (padding: no key, and rows that do not
    count)."""
    b, h, n, m = vis.shape
    mt, nt = -(-n // bm), -(-m // bn)
    any_pad = np.zeros((b, h, mt * bm, nt * bn), dtype=bool)
    any_pad[:, :, :n, :m] = vis
    all_pad = np.ones((b, h, mt * bm, nt * bn), dtype=bool)
    all_pad[:, :, :n, :m] = vis
    shape = (b, h, mt, bm, nt, bn)
    return any_pad.reshape(shape).any(axis=(3, 5)), all_pad.reshape(shape).all(axis=(3, 5))


def _python_test(mods, cfg):
    """The analysis of the mask function evaluated in numpy (flashgen.translators.tiles: tile_report's rules):
    [B, H, m tiles, n tiles], whether the mask may hold in the tile."""
    from flashgen.mods import tl_expression

    n, m, bm, bn = cfg["n"], cfg["m"], cfg["bm"], cfg["bn"]
    sizes = {"B": B, "H": H, "N": n, "M": m, "D": 64}

    def leaf(e):
        if isinstance(e, ast.Subscript):
            return tiles.Leaf(c="", expr=e) if set(ast.expr_names(e)) <= {"b", "h"} else None
        return tiles.Leaf(c=e.id, expr=e, positive=e.id in sizes, nonneg=True) if e.id in (*sizes, "b", "h") else None

    test = tiles.analyse(tl_expression(mods.mask_mod, mods), leaf)
    mt, nt = np.meshgrid(np.arange(-(-n // bm)), np.arange(-(-m // bn)), indexing="ij")
    out = np.zeros((B, H, *mt.shape), dtype=bool)
    for b in range(B):
        for h in range(H):
            values = {**sizes, "b": b, "h": h, "LEN": cfg["LEN"], "DOC": cfg["DOC"]}
            out[b, h] = np.broadcast_to(test.evaluate(tiles.tile_env(mt, nt, bm, bn, n, m, values))[0], mt.shape)
    return out


@pytest.mark.skipif(host_c.CXX is None, reason="needs g++")
def test_skipped_tiles_hold_no_visible_key_and_unmasked_tiles_no_invisible_one(tmp_path):
    cases, labels = [], []
    for label, mask, params, tensors, variant, _ in MASKS:
        mods, _, tr = _translate(mask, params, tensors, variant)
        assert tr.plan.skips_tiles, label  # every mask here has something to test
        cases.append((mods, tr.plan))
        labels.append(label)
    configs = _configs(seed=15)
    results = _run_tile_tests(cases, configs, tmp_path)
    lines = []
    for (label, mask, _, _, variant, exact), (mods, _), per in zip(MASKS, cases, results):
        empty = caught = 0
        for cfg, (bits, walked) in zip(configs, per):
            skip, masked = (bits & 1).astype(bool), (bits & 2).astype(bool)
            any_vis, all_vis = _per_tile(_visible(mods, variant, cfg), cfg["bm"], cfg["bn"])
            where = f"{label} ({mask}) at N={cfg['n']} M={cfg['m']} tiles {cfg['bm']}x{cfg['bn']}"
            bad = skip & any_vis
            assert not bad.any(), f"{where}: tiles {np.argwhere(bad)[:4].tolist()} skipped with a visible key"
            assert not (~walked & any_vis).any(), f"{where}: the key loop's range leaves out a visible key"
            full_keys = (np.arange(skip.shape[-1]) + 1) * cfg["bn"] <= cfg["m"]  # the kernel masks a tail tile
            bad = ~masked & full_keys & ~all_vis
            assert not bad.any(), f"{where}: tiles {np.argwhere(bad)[:4].tolist()} unmasked with an invisible key"
            # the numpy rules of tile_report give the kernel's C answer on every tile
            assert np.array_equal(skip, ~_python_test(mods, cfg)), where
            # of the tiles the key loop walks, the empty ones the test catches
            empty += int((walked & ~any_vis).sum())
            caught += int((walked & skip & ~any_vis).sum())
        share = caught / empty if empty else 1.0
        lines.append(f"{label:28s} {mask:58s} skips {caught:5d} of the {empty:5d} empty tiles walked ({share:.1%})")
        if exact:
            assert caught == empty, lines[-1]
        if label == "parity":
            assert empty == 0 and caught == 0
    print("\n" + "\n".join(lines))


def test_masks_that_cannot_be_bounded_are_not_analysed():
    for mask, tensors in (("s > 0.5", None), ("s > 0 or k_idx < 10", None), ("DOC[q_idx] == DOC[k_idx]", DOC_T),
                          ("k_idx < 0.5 * M", None), ("k_idx * 1.0 / M < 0.25", None)):
        for gpu, dtype in (("a100", "fp16"), ("h200", "bf16")):
            _, _, tr = _translate(mask, {}, tensors, PLAIN, gpu, dtype)
            assert tr.plan.skip_tile == "false" and "skip" not in tr.source, (mask, gpu)
            assert ("interval.cuh" in tr.source) == ("fg::iv::" in tr.plan.mask_tile), (mask, gpu)


def test_the_variants_own_masks_are_left_to_the_key_loop():
    env = Environment()
    variants = [PLAIN, CAUSAL, Variant(causal=True, window=96), TWO_SIDED, Variant(window_left=64),
                Variant(split_kv=True, causal=True, return_lse=True), Variant(norm="relu"), Variant(alibi=True, causal=True),
                Variant(kv_group=2, causal=True)]
    for gpu, dtype in (("a100", "fp16"), ("a100", "fp32"), ("h200", "bf16"), ("t4", "bf16")):
        for variant in variants:
            target = env.target(gpu)
            try:
                tl = env.library_tl(variant, target, DType(dtype), 64, form="full")
            except Exception:
                continue
            tr = translate(parse(tl), gpu)
            assert tr.plan.skip_tile == "false" and not tr.plan.uses_intervals, (gpu, variant.name)
            assert "fg::iv" not in tr.source and "skip_" not in tr.source and "n_next" not in tr.source
    # with a mask function, only the function is tested: the causal diagonal stays the key loop's bound
    _, _, tr = _translate("q_idx // DOC == k_idx // DOC", {"DOC": 80}, None, CAUSAL)
    assert tr.plan.skip_tile.count("fg::iv::eq") == 1 and "diag" not in tr.plan.skip_tile
    # a mask function that is itself a causal mask is tested: the plain variant's loop walks every tile
    _, _, tr = _translate("k_idx <= q_idx", {}, None, PLAIN)
    assert tr.plan.skip_tile.startswith("!fg::iv::le(") and tr.plan.kv_tile_end == "(seqlen_k + BLOCK_N - 1) / BLOCK_N"


def test_bounds_are_exact_on_single_points_and_conservative_past_2_to_the_62():
    def leaf(e):
        return tiles.Leaf(c=e.id, expr=e, positive=True) if e.id == "M" else None

    def run(text, q, k, m=1000):
        test = tiles.analyse(parse(f"Compute X = {text}").body[0].expr, leaf)
        env = tiles.tile_env(0, 0, 1, 1, 1, 1, {"M": m})
        env["q"], env["k"] = (np.int64(q[0]), np.int64(q[1])), (np.int64(k[0]), np.int64(k[1]))
        t, f = test.evaluate(env)
        return bool(t), bool(f), test

    # a box of one (row, key) is decided exactly
    for q in range(-3, 8):
        for k in range(0, 9):
            for text in ("(q_idx - 3 * k_idx) % 4 == 1", "-q_idx // 3 >= k_idx - 5", "abs(q_idx - k_idx) < 3",
                         "cdiv(q_idx, 2) != k_idx // 3"):
                t, f, _ = run(text, (q, q), (k, k))
                want = bool(evaluate(parse(f"Compute X = {text}").body[0].expr, {"q_idx": q, "k_idx": k}))
                assert (t, f) == (want, not want), (text, q, k)
    # a product past 2^62 is unknown: never a skip
    _, _, test = run("q_idx * k_idx * M * M > 5", (0, 1), (0, 1))
    assert test.t_always and test.never_c() is None
    _, _, test = run("q_idx * k_idx < 5", (0, 1), (0, 1))
    assert not test.t_always and test.never_c().startswith("!fg::iv::lt(fg::iv::mul(")


def test_tile_report_counts_what_the_kernel_skips():
    mods = make_mods(mask_mod="q_idx // DOC == k_idx // DOC", params={"DOC": 100})
    for variant in (PLAIN, CAUSAL):
        tl = library.render(variant, params={"BLOCK_M": 64, "BLOCK_N": 32, "WARPS": 4, "STAGES": 2})
        from flashgen.mods import apply

        report = tile_report(mods, apply(tl, mods, variant), n=700, m=500)
        assert report["missed"] == 0 and report["skipped"] == report["visited_empty"] > 0
        assert report["computed_empty"] == 0
    parity = make_mods(mask_mod="(q_idx + k_idx) % 2 == 0")
    tl = library.render(PLAIN, params={"BLOCK_M": 64, "BLOCK_N": 32, "WARPS": 4, "STAGES": 2})
    from flashgen.mods import apply

    report = tile_report(parity, apply(tl, parity, PLAIN), n=300, m=300)
    assert report["skipped"] == report["visited_empty"] == report["missed"] == 0


def _nvcc():
    from flashgen.harness.compile import find_nvcc

    try:
        return find_nvcc()
    except Exception:
        return None


# (gpu, dtype, head dim, variant, arch, path, K/V stages): the sm75 path, both sm80 pipelines, split-KV, sm90
COMPILED = [
    ("t4", "bf16", 64, PLAIN, "sm_75", "sm75", 1),
    ("a100", "fp16", 64, CAUSAL, "sm_80", "sm80", 2),
    ("a100", "bf16", 128, PLAIN, "sm_80", "sm80", 1),
    ("a100", "fp16", 64, Variant(split_kv=True, return_lse=True), "sm_80", "sm80", 2),
    ("h200", "bf16", 128, CAUSAL, "sm_90", "sm90", 2),
    ("h200", "fp16", 64, PLAIN, "sm_90", "sm90", 2),
]


@pytest.mark.skipif(_nvcc() is None, reason="needs nvcc")
@pytest.mark.parametrize("gpu,dtype,head_dim,variant,arch,path,stages", COMPILED,
                         ids=[f"{c[0]}-{c[1]}-d{c[2]}-{c[3].name}" for c in COMPILED])
@pytest.mark.parametrize("kind", ["document", "length"])
def test_kernels_with_tile_tests_translate_and_compile(gpu, dtype, head_dim, variant, arch, path, stages, kind):
    from flashgen.harness.compile import compile_cuda
    from flashgen.harness.static_check import static_check

    if kind == "document":
        mask, params, tensors = "q_idx // DOC == k_idx // DOC", {"DOC": 512}, None
    else:
        mask, params, tensors = "k_idx < LEN[b]", {}, LEN
    _, _, tr = _translate(mask, params, tensors, variant, gpu, dtype, head_dim)
    plan = tr.plan
    assert (plan.backend, plan.stages) == (path, stages) and plan.skips_tiles
    assert '// ---- flashgen/interval.cuh ----' in tr.source
    if path == "sm90":  # the producer alone tests the tiles (tiles_from_producer); the consumers read its notes
        assert tr.source.count("next_kv(w, n_block)") == 1 and "last_kv(w, w.n_begin, w.n_end)" in tr.source
        assert "w = fg::mbar::read_in_lane0(tile_note);" in tr.source
        assert "note = fg::mbar::read_in_lane0(&kv_note[s]);" in tr.source
    else:
        assert "last_kept(n_begin, n_end)" in tr.source and "n_block = n_next" in tr.source
        assert ("kv_slot ^= 1" in tr.source) == (stages == 2)
    if kind == "length":  # the test reads the block's prologue constant, as the element mask does
        (const,) = [c for c in plan.prologue if "mod_tensors" in c.expr]
        assert f"fg::iv::pt({const.name})" in plan.skip_tile
        assert plan.skip_prologue == [const] and (path != "sm90" or f"w.{const.name}" in tr.source)
    assert not static_check(tr.source, tr.manifest), static_check(tr.source, tr.manifest)  # as generate checks it
    built = compile_cuda(tr.source, arch)
    assert built.ok, built.feedback_text()
    assert not any(u.spills for u in built.kernels.values()) or path == "sm75", built.feedback_text()


@pytest.mark.skipif(_nvcc() is None, reason="needs nvcc")
def test_sm90_consumers_test_their_own_tiles_with_tiles_from_producer_off():
    """The switch off (a development A/B's other side): the consumers compute the work tile and step over skipped
    tiles themselves, as the producer does; no notes in shared memory; the kernel compiles without spills."""
    from flashgen.harness.compile import compile_cuda
    from flashgen.translators.backends.sm90.kernel import schedule_overrides, smem_bytes, tile_notes_bytes

    with schedule_overrides(tiles_from_producer=False):
        _, _, off = _translate("k_idx < LEN[b]", {}, LEN, PLAIN, "h200", "bf16", 128)
    _, _, on = _translate("k_idx < LEN[b]", {}, LEN, PLAIN, "h200", "bf16", 128)
    assert off.source.count("next_kv(w, n_block)") == 2 and "tile_note" not in off.source
    assert "tile_note" in on.source and on.source != off.source
    # the notes' room is kept either way (the launch's shared memory does not move with the switch)
    assert tile_notes_bytes(on.plan) == 8 * (6 + 1) + 4 * on.plan.stages
    assert on.manifest.launches[0].smem_bytes == off.manifest.launches[0].smem_bytes == smem_bytes(on.plan)
    built = compile_cuda(off.source, "sm_90a")
    assert built.ok, built.feedback_text()
    assert not any(u.spills for u in built.kernels.values()), built.feedback_text()


def test_the_mods_benchmark_counts_visible_pairs_and_builds_what_generate_builds():
    from flashgen.harness.suite import MOD_SEED, MOD_SUITE, MOD_SUITE_SHAPE, build_mask_kernel, mods_suite
    from flashgen.mods import visible_pairs
    from flashgen.tl_spec.tensors import fill_all, sizes_of

    rows = mods_suite()
    assert [r[3] for r in rows] == ["document512", "lengths", "score_cos"]
    assert all(r[2] == MOD_SUITE_SHAPE and r[1] == Variant() for r in rows)
    s = MOD_SUITE_SHAPE
    doc = make_mods(**MOD_SUITE["document512"])
    assert visible_pairs(doc, Variant(), s.N, s.M, batch=s.B, heads=s.H) * 8 == s.B * s.H * s.N * s.M
    heads = make_mods(mask_mod="h * 64 <= k_idx and k_idx < 64 * (h + b + 2)")
    q, k = np.meshgrid(np.arange(300), np.arange(250), indexing="ij")
    want = sum(int(((h * 64 <= k) & (k < 64 * (h + b + 2)) & (k <= q - 50)).sum()) for b in range(2) for h in range(3))
    assert visible_pairs(heads, CAUSAL, 300, 250, batch=2, heads=3) == want
    # a mask reading a call-time tensor counts with the values the call passes, and only with them
    lengths = make_mods(**MOD_SUITE["lengths"])
    assert visible_pairs(lengths, PLAIN, 10, 10) is None
    assert visible_pairs(lengths, PLAIN, 10, 10, batch=3, heads=2, tensors={"LEN": np.array([0, 4, 99])}) == 2 * 10 * 14
    assert visible_pairs(lengths, CAUSAL, 10, 10, batch=1, tensors={"LEN": np.array([4])}) == 1 + 2 + 3 + 7 * 4  # rows 0, 1, 2, then 4 keys each
    assert visible_pairs(make_mods(**MOD_SUITE["score_cos"]), CAUSAL, 8, 8, batch=2) == 2 * 36  # no mask: the variant's
    for gpu, arch in (("h200", "sm_90a"), ("a100", "sm_80")):  # the sm90 path and the sm80 path
        source, manifest = build_mask_kernel(gpu, "bf16", Variant(), s.D, MOD_SUITE["document512"])
        assert (manifest.head_dim, manifest.arch) == (s.D, arch) and "fg::iv::floor_div" in source
        # the verification compares with the mask's meaning, not the plain variant's (as the generate loop records)
        assert "q_idx // 512 == k_idx // 512" in manifest.reference_tl
        source, manifest = build_mask_kernel(gpu, "bf16", Variant(), s.D, MOD_SUITE["lengths"])
        tensors = fill_all(manifest.call_tensors, sizes_of(s), MOD_SEED)
        assert set(tensors) == {"LEN"} and tensors["LEN"].shape == (s.B,) and "mod_tensors[0]" in source
        share = visible_pairs(lengths, Variant(), s.N, s.M, batch=s.B, heads=s.H, tensors=tensors) / (s.B * s.H * s.N * s.M)
        assert share == pytest.approx(tensors["LEN"].clip(0, s.M).sum() / (s.B * s.M))
