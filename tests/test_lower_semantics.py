"""The plan's C pieces, run as host C++ (g++, tests/host_c.py), compute what the TL says.

For every library program, and for custom TL programs, the lowered plan's prologue, score mods,
visibility, p expression, key-tile range and mask_tile are emulated element by element over small
shapes the way the kernel template applies them, and compared with flashgen.reference (library) or with
the TL's own expressions evaluated by numpy (custom programs):
- every score / p of a visible key matches; visibility matches;
- no tile outside [kv_tile_begin, kv_tile_end) holds a visible key of a valid row;
- a full tile with mask_tile false has no invisible key for a valid row.
"""

import math
import subprocess

import numpy as np
import pytest

from flashgen.reference import scores as ref_scores
from flashgen.reference import visible_mask
from flashgen.tl_spec import library
from flashgen.tl_spec.parser import parse
from flashgen.translators import lower
from flashgen.variant import Norm
from tests import host_c

pytestmark = pytest.mark.skipif(host_c.CXX is None, reason="needs g++")

SHAPES = [(70, 150), (150, 70), (3, 130)]
HEADS = 2
SCALE = 0.125


def _raw(n: int, m: int) -> np.ndarray:
    q, k = np.meshgrid(np.arange(n), np.arange(m), indexing="ij")
    return np.sin(0.37 * q + 0.11 * k) * 4.0


def _c_function(i: int, plan) -> str:
    softmax = plan.norm.kind.value == "softmax"
    mods = "\n".join(f"          s = {m.expr};" for m in plan.score_mods)
    prologue = "\n".join(f"    const {p.ctype} {p.name} = {p.expr}; (void){p.name};" for p in plan.prologue)
    out = "s" if softmax else f"(vis ? ({plan.norm.p_expr}) : 0.0f)"
    return f"""
#undef BLOCK_M
#undef BLOCK_N
#define BLOCK_M {plan.block_m}
#define BLOCK_N {plan.block_n}
static void run_{i}(int seqlen_q, int seqlen_k, FILE* f) {{
  const int heads = {HEADS}, batch = 1, diag = seqlen_k - seqlen_q, b = 0;
  (void)batch; (void)diag; (void)b;
  for (int head = 0; head < heads; ++head) {{
    const int kv_head = head; (void)kv_head;
{prologue}
    for (int m_block = 0; m_block < (seqlen_q + BLOCK_M - 1) / BLOCK_M; ++m_block) {{
      const int n_begin = {plan.kv_tile_begin};
      const int n_end = {plan.kv_tile_end};
      fprintf(f, "R %d %d %d %d\\n", head, m_block, n_begin, n_end);
      for (int n_block = 0; n_block < (seqlen_k + BLOCK_N - 1) / BLOCK_N; ++n_block) {{
        fprintf(f, "T %d %d %d %d\\n", head, m_block, n_block, ({plan.mask_tile}) ? 1 : 0);
        for (int qpos = m_block * BLOCK_M; qpos < (m_block + 1) * BLOCK_M && qpos < seqlen_q; ++qpos)
        for (int kpos = n_block * BLOCK_N; kpos < (n_block + 1) * BLOCK_N && kpos < seqlen_k; ++kpos) {{
          float s = (float)(sin(0.37 * qpos + 0.11 * kpos) * 4.0) * {SCALE}f;
{mods}
          const int vis = {plan.visible or 1};
          fprintf(f, "E %d %d %d %d %a\\n", head, qpos, kpos, vis, (double){out});
        }}
      }}
    }}
  }}
}}
"""


def _run_plans(plans, tmp_path) -> list[dict]:
    """Compile one host program for all plans and shapes; returns per (plan, shape) parsed results."""
    parts = [host_c.PRELUDE]
    parts += [_c_function(i, p) for i, p in enumerate(plans)]
    calls = []
    for i in range(len(plans)):
        for j, (n, m) in enumerate(SHAPES):
            calls.append(f'  {{ FILE* f = fopen("out_{i}_{j}.txt", "w"); run_{i}({n}, {m}, f); fclose(f); }}')
    parts.append("int main(void) {\n" + "\n".join(calls) + "\n  return 0;\n}")
    (tmp_path / "emu.cpp").write_text("\n".join(parts))
    r = subprocess.run([*host_c.COMPILE, "-o", "emu", "emu.cpp", "-lm"], check=False, cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[:3000]
    subprocess.run(["./emu"], cwd=tmp_path, check=True)
    results = []
    for i in range(len(plans)):
        for j, (n, m) in enumerate(SHAPES):
            vis = np.zeros((HEADS, n, m), dtype=bool)
            val = np.full((HEADS, n, m), np.nan)
            ranges, tiles = {}, {}
            for line in (tmp_path / f"out_{i}_{j}.txt").read_text().splitlines():
                kind, *f = line.split()
                if kind == "E":
                    h, q, k, v = map(int, f[:4])
                    vis[h, q, k] = bool(v)
                    val[h, q, k] = float.fromhex(f[4])
                elif kind == "R":
                    h, mb, b, e = map(int, f)
                    ranges[h, mb] = (b, e)
                else:
                    h, mb, nb, t = map(int, f)
                    tiles[h, mb, nb] = bool(t)
            results.append({"plan": plans[i], "n": n, "m": m, "vis": vis, "val": val, "ranges": ranges, "tiles": tiles})
    return results


def _check_tiles(res, want_vis: np.ndarray, label: str) -> None:
    plan = res["plan"]
    bm, bn, n, m = plan.block_m, plan.block_n, res["n"], res["m"]
    for (h, mb), (b, e) in res["ranges"].items():
        rows = slice(mb * bm, min(n, (mb + 1) * bm))
        for nb in range(-(-m // bn)):
            keys = slice(nb * bn, min(m, (nb + 1) * bn))
            block = want_vis[h, rows, keys]
            if not b <= nb < e:
                assert not block.any(), f"{label}: tile ({mb}, {nb}) skipped by range [{b}, {e}) holds visible keys"
            elif not res["tiles"][h, mb, nb] and (nb + 1) * bn <= m:
                assert block.all(), f"{label}: tile ({mb}, {nb}) has mask_tile false but invisible keys"


def _library_expectation(variant, n, m):
    raw = _raw(n, m)
    vis = np.broadcast_to(visible_mask(n, m, variant), (HEADS, n, m))
    s = np.stack([ref_scores(raw, np.eye(m), variant, h, HEADS, SCALE) for h in range(HEADS)])
    if variant.norm is Norm.relu:
        s = np.where(vis, np.maximum(s, 0) / m, 0.0)
    elif variant.norm is Norm.sigmoid:
        s = np.where(vis, 1 / (1 + np.exp(-(s - math.log(m)))), 0.0)
    return vis, s


def test_library_plans_compute_the_reference(tmp_path):
    names = list(library.PROGRAMS)
    plans = [lower(parse(library.load(name)), "sm_80")[0] for name in names]
    for res in _run_plans(plans, tmp_path):
        variant, n, m = res["plan"].variant, res["n"], res["m"]
        label = f"{res['plan'].name} N={n} M={m}"
        want_vis, want = _library_expectation(variant, n, m)
        assert np.array_equal(res["vis"], want_vis), label
        got = res["val"]
        sel = want_vis if variant.norm is Norm.softmax else np.ones_like(want_vis)
        assert np.allclose(got[sel], want[sel], rtol=2e-5, atol=2e-5), label
        _check_tiles(res, want_vis, label)


# --- custom programs: the expectation is the TL itself, evaluated with numpy

def _custom(base: str, replace: dict[str, str]) -> str:
    text = library.load(base)
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


PREFIX_LM = _custom("plain", {"Compute S_r = where(k_idx < M, S_r, -inf)":
                              "Compute S_r = where(k_idx < 40 or k_idx <= q_idx + M - N, S_r, -inf)"})
BUCKET_BIAS = _custom("plain", {"Compute S_r = where(k_idx < M, S_r, -inf)":
                                "Compute S_r = S_r + log2e * where(q_idx + M - N - k_idx < 8, 0.5, -0.5)\n"
                                "Compute S_r = where(k_idx < M, S_r, -inf)"})
# the scale applied after a score function that is homogeneous: relu of the raw score, squared later
RELU_SQUARED = _custom("relu", {"Compute S_r = where(k_idx < M, relu(S_r) / M, 0)":
                                "Compute S_r = where(k_idx <= q_idx + M - N, relu(S_r) * relu(S_r) / M, 0)"})


def _custom_expectation(text: str, n: int, m: int):
    q, k = np.meshgrid(np.arange(n), np.arange(m), indexing="ij")
    s = _raw(n, m) * SCALE
    d = m - n
    if text is PREFIX_LM:
        vis = (k < 40) | (k <= q + d)
        val = s
    elif text is BUCKET_BIAS:
        vis = np.ones((n, m), dtype=bool)
        val = s + np.where(q + d - k < 8, 0.5, -0.5)
    else:
        vis = k <= q + d
        val = np.where(vis, np.maximum(s, 0) ** 2 / m, 0.0)
    return np.broadcast_to(vis, (HEADS, n, m)), np.broadcast_to(val, (HEADS, n, m))


def test_custom_programs_compute_what_the_tl_says(tmp_path):
    texts = [PREFIX_LM, BUCKET_BIAS, RELU_SQUARED]
    plans = [lower(parse(t), "sm_80")[0] for t in texts]
    results = _run_plans(plans, tmp_path)
    for idx, res in enumerate(results):
        text = texts[idx // len(SHAPES)]
        n, m = res["n"], res["m"]
        want_vis, want = _custom_expectation(text, n, m)
        label = f"custom {idx // len(SHAPES)} N={n} M={m}"
        assert np.array_equal(res["vis"], want_vis), label
        sel = want_vis if res["plan"].norm.kind.value == "softmax" else np.ones_like(want_vis)
        assert np.allclose(res["val"][sel], want[sel], rtol=2e-5, atol=2e-5), label
        _check_tiles(res, want_vis, label)
