"""Issue 15 item 4, FlashAttention's interface: two-sided and non-causal windows (`window_size=(left, right)`, -1
unbounded; `--window LEFT,RIGHT`), the softmax scale (`--softmax-scale`, `softmax_scale=`) and split-KV decode from
`generate` (`--split-kv`, `--num-splits`). docs/variants.md holds the conventions beside FlashAttention's.

Every window is checked against a mask written here from FlashAttention's own words (key j is visible to query i
iff i + M - N - left <= j <= i + M - N + right, -1 unbounded): the fp64 reference, the TL library's programs in the
interpreter, the translators' C pieces (run as host C with gcc: visibility, key-tile range, mask_tile) and the CUDA
that `flashgen generate` writes and compiles on this machine (no GPU: compiled and estimated)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from flashgen.errors import UsageError
from flashgen.variant import Shape, Variant, make_variant

# ragged shapes, N != M both ways (rows that see no key when N > M and the right side is bounded)
RAGGED = [(77, 133), (133, 77), (200, 333), (333, 200), (1, 77), (70, 45)]
WINDOWS = [(64, 32), (128, -1), (-1, 32), (0, 5), (3, 300)]


def fa_mask(n: int, m: int, left: int, right: int) -> np.ndarray:
    """FlashAttention's window_size rule as its docs say it (not flashgen's code): query i, at key position
    i + M - N, sees keys [i + M - N - left, i + M - N + right], inclusive; -1 leaves a side unbounded."""
    pos = np.arange(n)[:, None] + (m - n)
    j = np.arange(m)[None, :]
    return ((left == -1) | (j >= pos - left)) & ((right == -1) | (j <= pos + right))


def brute_attention(q, k, v, mask: np.ndarray, scale: float):
    """Softmax attention of one head, row by row; a row that sees no key: O = 0, LSE = -inf."""
    n, m = mask.shape
    o, lse = np.zeros((n, v.shape[-1])), np.full(n, -np.inf)
    for i in range(n):
        keys = np.nonzero(mask[i])[0]
        if keys.size == 0:
            continue
        s = scale * (k[keys] @ q[i])
        w = np.exp(s - s.max())
        o[i] = w @ v[keys] / w.sum()
        lse[i] = s.max() + np.log(w.sum())
    return o, lse


def variant_of(left: int, right: int, **fields) -> Variant:
    return make_variant(window_size=(left, right), lse=True, **fields)


# ------------------------------------------------------------------------------------------------ the Variant

def test_window_size_becomes_one_canonical_variant_and_name():
    assert variant_of(64, 32) == Variant(window_left=64, window_right=32, return_lse=True)
    assert variant_of(64, 32).name == "window64l32r_lse" and variant_of(64, 32).window_size == (64, 32)
    assert variant_of(128, -1).name == "window128l_lse" and variant_of(-1, 32).name == "window32r_lse"
    # FlashAttention's window_size=(W - 1, 0) is window=W (causal), with or without causal; (-1, 0) is causal
    for w in (1, 100, 256):
        assert variant_of(w - 1, 0) == Variant(causal=True, window=w, return_lse=True)
        assert variant_of(w - 1, 0).window_size == (w - 1, 0)
    assert make_variant(window_size=(255, 0)).name == "window256"
    assert make_variant(window_size=(-1, 0)) == Variant(causal=True)
    # causal makes the right side 0, as FlashAttention does
    assert make_variant(causal=True, window_size=(63, 17)) == Variant(causal=True, window=64)
    assert make_variant(causal=True, window_size=(-1, 5)) == Variant(causal=True)
    # the manifests of the other variants keep their bytes: unset sides are left out of every dump
    assert "window_left" not in Variant(causal=True).model_dump_json()
    assert "window_left" not in repr(Variant(causal=True, window=256))
    assert json.loads(variant_of(128, -1).model_dump_json())["window_left"] == 128
    assert Variant.model_validate(variant_of(64, 32).model_dump(mode="json")) == variant_of(64, 32)


@pytest.mark.parametrize("fields, message", [
    (dict(window_left=-1), "greater than or equal to 0"),
    (dict(window_left=3, causal=True), "with causal, give window=W"),
    (dict(window_right=0, window_left=4), "window_right=0 is causal"),
    (dict(window_left=3, window=4, causal=True), "not both"),
    (dict(window_left=1.5), "integer"),
    (dict(window_left=8, split_kv=True, return_lse=True), "split-KV decode takes no window"),
])
def test_the_variant_refuses_the_non_canonical_windows(fields, message):
    with pytest.raises(ValueError, match=message):
        Variant(**fields)


@pytest.mark.parametrize("window_size, message", [
    ((-2, 5), "window_size (-2, 5): left -2: must be greater than or equal to -1"),
    ((5, -3), "window_size (5, -3): right -3: must be greater than or equal to -1"),
    ((-1, -1), "both sides unbounded is no window"),
    ((1.5, 3), "window_size (1.5, 3): left 1.5: must be a valid integer"),
    ((True, 3), "must be a valid integer"),
    ((4,), "expected (left, right)"),
    ("4,x", "expected LEFT,RIGHT"),
])
def test_make_variant_refuses_bad_windows_in_one_line(window_size, message):
    with pytest.raises(UsageError) as info:
        make_variant(window_size=window_size, causal=window_size == (-1, -1))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_split_kv_returns_the_lse_and_takes_no_window():
    assert make_variant(split_kv=True) == Variant(split_kv=True, return_lse=True)
    with pytest.raises(UsageError, match="split-KV decode takes no causal mask or window"):
        make_variant(split_kv=True, window_size=(8, 8))


# ------------------------------------------------------------------------------------------------ fp64 reference

@pytest.mark.parametrize("left, right", WINDOWS)
def test_reference_matches_a_brute_force_mask_on_ragged_shapes(left, right):
    from flashgen.reference import attention, random_inputs, visible_mask

    variant = variant_of(left, right)
    for n, m in RAGGED:
        mask = fa_mask(n, m, left, right)
        assert np.array_equal(visible_mask(n, m, variant), mask), (n, m)
        shape = Shape(B=1, H=2, N=n, M=m, D=16)
        q, k, v = random_inputs(shape, seed=n + m)
        o, lse = attention(q, k, v, variant)
        for h in range(2):
            want_o, want_lse = brute_attention(q[0, h], k[0, h], v[0, h], mask, 0.25)
            np.testing.assert_allclose(o[0, h], want_o, rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(lse[0, h], want_lse, rtol=1e-10)
        empty = ~mask.any(axis=1)
        if right != -1 and n > m + right:  # the first rows sit before the first key's window
            assert empty[: n - m - right].all() and not empty[n - m - right:].any()
        assert np.all(o[:, :, empty] == 0) and np.all(np.isneginf(lse[:, :, empty]))


def test_visible_work_counts_what_the_mask_leaves():
    from flashgen.harness.verify import empty_rows
    from flashgen.roofline import visible_work

    for left, right in WINDOWS:
        variant = variant_of(left, right)
        for n, m in RAGGED + [(4096, 4096), (1, 1)]:
            mask = fa_mask(n, m, left, right) if n * m < 200_000 else None
            work = visible_work(variant, n, m)
            if mask is not None:
                assert (work.pairs, work.rows, work.keys) == (mask.sum(), mask.any(1).sum(), mask.any(0).sum())
                assert list(empty_rows(n, m, variant)) == list(np.nonzero(~mask.any(1))[0])
    # N = M = 4096, (64, 32): each row sees at most 97 keys
    assert visible_work(variant_of(64, 32), 4096, 4096).pairs == sum(
        min(4095, i + 32) - max(0, i - 64) + 1 for i in range(4096))


# ------------------------------------------------------------------------------------------------ the TL library

@pytest.mark.parametrize("arch, dtype", [("sm_80", "fp16"), ("sm_75", "bf16"), ("sm_90", "bf16")])
@pytest.mark.parametrize("left, right", [(64, 32), (128, -1), (-1, 32)])
def test_library_program_interprets_to_the_reference(arch, dtype, left, right):
    from flashgen.reference import attention
    from flashgen.targets import resolve_target
    from flashgen.tl_spec import library
    from flashgen.tl_spec.checker import check
    from flashgen.tl_spec.diagnostics import errors_only
    from flashgen.tl_spec.interpreter import interpret
    from flashgen.tl_spec.parser import parse

    variant = variant_of(left, right, kv_group=2)
    text = library.render(variant, arch=arch, dtype=dtype)
    assert f"Variant softmax{f' window_left={left}' if left != -1 else ''}" in text
    if left != -1:
        assert "Let n_start = max(0, (q0 + M - N - window_left) // BLOCK_N)" in text
    if right != -1:
        assert "Let n_end = min(cdiv(M, BLOCK_N), cdiv(q0 + BLOCK_M + M - N + window_right, BLOCK_N))" in text
    program = parse(text)
    assert errors_only(check(program, resolve_target(arch))) == []
    if arch == "sm_90":
        assert "Role producer" in text  # the Hopper dataflow, both rings walking the same range
    for n, m in [(77, 133), (133, 77), (1, 77)]:
        result = interpret(program, Shape(B=1, H=4, KVH=2, N=n, M=m, D=64), seed=n)
        q, k, v = (result.inputs[x] for x in "QKV")
        want_o, want_lse = attention(q, k, v, variant, result.scale)
        np.testing.assert_allclose(result.outputs["O"], want_o, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(result.outputs["LSE"], want_lse, rtol=1e-9)
        mask = fa_mask(n, m, left, right)
        assert np.array_equal(np.isneginf(result.outputs["LSE"][0, 0]), ~mask.any(1))


def test_the_key_loop_skips_tiles_on_both_sides():
    """The interpreter runs the loop bounds as written, and its GEMM work counts them: at N = M = 1024 in tiles of
    64, each query tile runs exactly the key tiles that hold a key one of its rows sees (a (64, 32) window: 46 of
    the 256 tile pairs; the full program runs all 256)."""
    from flashgen.tl_spec import library
    from flashgen.tl_spec.interpreter import interpret
    from flashgen.tl_spec.parser import parse

    shape = Shape(B=1, H=1, N=1024, M=1024, D=64)
    full = interpret(parse(library.render(Variant(return_lse=True))), shape).counts.mma_flops
    for left, right in ((64, 32), (128, -1), (-1, 32)):
        mask = fa_mask(1024, 1024, left, right)
        needed = sum(len({j // 64 for j in np.nonzero(mask[t * 64:(t + 1) * 64].any(axis=0))[0]}) for t in range(16))
        flops = interpret(parse(library.render(variant_of(left, right))), shape).counts.mma_flops
        assert flops / full * 256 == pytest.approx(needed, rel=1e-12), (left, right)
        assert needed == {(64, 32): 46, (128, -1): 165, (-1, 32): 151}[left, right]


# ------------------------------------------------------------------------------------------------ translators

def _emulate(plans, shapes, tmp_path) -> list[dict]:
    """Each plan's key-tile range, mask_tile and visibility, run as host C over `shapes` the way the kernel uses
    them (diag = M - N; keys past M are the kernel's own mask)."""
    parts = ["#include <stdio.h>", "static inline int max(int a, int b) { return a > b ? a : b; }",
             "static inline int min(int a, int b) { return a < b ? a : b; }"]
    for i, plan in enumerate(plans):
        prologue = "\n".join(f"  const {p.ctype} {p.name} = {p.expr}; (void){p.name};" for p in plan.prologue)
        parts.append(f"""
#undef BLOCK_M
#undef BLOCK_N
#define BLOCK_M {plan.block_m}
#define BLOCK_N {plan.block_n}
static void run_{i}(int seqlen_q, int seqlen_k, FILE* f) {{
  const int heads = 1, head = 0, batch = 1, diag = seqlen_k - seqlen_q; (void)heads; (void)head; (void)batch;
{prologue}
  for (int m_block = 0; m_block < (seqlen_q + BLOCK_M - 1) / BLOCK_M; ++m_block) {{
    fprintf(f, "R %d %d %d\\n", m_block, {plan.kv_tile_begin}, {plan.kv_tile_end});
    for (int n_block = 0; n_block < (seqlen_k + BLOCK_N - 1) / BLOCK_N; ++n_block)
      fprintf(f, "T %d %d %d\\n", m_block, n_block, ({plan.mask_tile}) ? 1 : 0);
  }}
  for (int qpos = 0; qpos < seqlen_q; ++qpos)
    for (int kpos = 0; kpos < seqlen_k; ++kpos) fprintf(f, "%d", ({plan.visible or 1}) ? 1 : 0);
}}""")
    calls = [f'  {{ FILE* f = fopen("out_{i}_{j}.txt", "w"); run_{i}({n}, {m}, f); fclose(f); }}'
             for i in range(len(plans)) for j, (n, m) in enumerate(shapes)]
    parts.append("int main(void) {\n" + "\n".join(calls) + "\n  return 0;\n}")
    (tmp_path / "emu.c").write_text("\n".join(parts))
    built = subprocess.run(["gcc", "-O1", "-std=c99", "-w", "-o", "emu", "emu.c"], cwd=tmp_path, capture_output=True,
                           text=True)
    assert built.returncode == 0, built.stderr[:3000]
    subprocess.run(["./emu"], cwd=tmp_path, check=True)
    results = []
    for i in range(len(plans)):
        for j, (n, m) in enumerate(shapes):
            ranges, tiles, bits = {}, {}, ""
            for line in (tmp_path / f"out_{i}_{j}.txt").read_text().splitlines():
                if line.startswith("R "):
                    mb, b, e = map(int, line.split()[1:])
                    ranges[mb] = (b, e)
                elif line.startswith("T "):
                    mb, nb, t = map(int, line.split()[1:])
                    tiles[mb, nb] = bool(t)
                else:
                    bits += line
            vis = np.array([c == "1" for c in bits], dtype=bool).reshape(n, m)
            results.append({"plan": plans[i], "n": n, "m": m, "ranges": ranges, "tiles": tiles, "visible": vis})
    return results


def check_tiles(res: dict, left: int, right: int) -> int:
    """The emulated plan against FlashAttention's mask; returns how many query tiles skip tiles on both sides."""
    plan, n, m = res["plan"], res["n"], res["m"]
    mask = fa_mask(n, m, left, right)
    assert np.array_equal(res["visible"], mask), (plan.name, n, m)
    bm, bn = plan.block_m, plan.block_n
    tiles = -(-m // bn)
    both = 0
    for mb, (begin, end) in res["ranges"].items():
        rows = mask[mb * bm:(mb + 1) * bm]
        seen = np.nonzero(rows.any(axis=0))[0]
        if seen.size:  # every visible key lies in [begin, end) tiles
            assert begin <= seen[0] // bn and end >= seen[-1] // bn + 1, (plan.name, n, m, mb, begin, end)
            full = (mb + 1) * bm <= n and rows.any(axis=1).all()
            if full:  # tight: the first and last tiles of the range hold a visible key
                assert (begin, end) == (seen[0] // bn, seen[-1] // bn + 1), (plan.name, n, m, mb, begin, end)
            both += begin > 0 and end < tiles
        for nb in range(tiles):  # a full tile with mask_tile false has no invisible key
            block = rows[:, nb * bn:(nb + 1) * bn]
            if not res["tiles"][mb, nb] and nb * bn + bn <= m and block.shape[0] == bm:
                assert block.all(), (plan.name, n, m, mb, nb)
    return both


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_translators_lower_the_windows_on_sm75_sm80_sm90(tmp_path):
    from flashgen.tl_spec import library
    from flashgen.tl_spec.parser import parse
    from flashgen.translators import lower
    from flashgen.translators.rules import plan_for_variant
    from flashgen.variant import DType

    cases, plans = [], []
    for left, right in [(64, 32), (128, -1), (-1, 32), (0, 5)]:
        variant = variant_of(left, right)
        for gpu, arch, dtype, backend in [("t4", "sm_75", "fp16", "sm75"), ("t4", "sm_75", "bf16", "sm75"),
                                          ("a100", "sm_80", "fp16", "sm80"), ("h200", "sm_90", "bf16", "sm90"),
                                          ("h200", "sm_90", "fp32", "sm80")]:
            plan, _ = lower(parse(library.render(variant, arch=arch, dtype=dtype)), gpu)
            assert plan.backend == backend and plan.variant == variant
            plans.append(plan)
            cases.append((left, right))
        plans.append(plan_for_variant(variant, "a100", DType.fp16, 128))  # the rule-based plan says the same
        cases.append((left, right))
    shapes = [(256, 256), (70, 150), (150, 70), (3, 130), (600, 600)]
    results = _emulate(plans, shapes, tmp_path)
    for k, (left, right) in enumerate(cases):
        both = sum(check_tiles(res, left, right) for res in results[k * len(shapes):(k + 1) * len(shapes)])
        if left != -1 and right != -1 and left + right < 128:
            assert both > 0, plans[k].name  # some query tiles skip key tiles before and after their window


# ------------------------------------------------------------------------------------------------ generate (CLI)

def _generate(args: list[str], tmp_path, monkeypatch) -> tuple[object, dict]:
    from typer.testing import CliRunner

    from flashgen.cli import app

    monkeypatch.setenv("FLASHGEN_HOME", str(tmp_path / "home"))
    out = tmp_path / "out"
    done = CliRunner().invoke(app, ["generate", "--head-dim", "64", "--out", str(out), *args])
    assert done.exit_code == 0, (done.output, done.exception)
    assert "compiled and estimated" in done.output and "estimate  roofline lower bound" in done.output, done.output
    meta = json.loads((out / "meta.json").read_text())
    assert meta["verification"]["ran"] is False and meta["roofline"]["time_s"] > 0
    return out, meta


@pytest.mark.parametrize("gpu, arch", [("a100", "sm_80"), ("h200", "sm_90"), ("t4", "sm_75")])
@pytest.mark.parametrize("window, left, right", [("64,32", 64, 32), ("128,-1", 128, -1)])
def test_generate_window_from_the_cli_compiles_with_the_window_in_its_cuda(gpu, arch, window, left, right, tmp_path,
                                                                           monkeypatch):
    from flashgen.tl_spec.parser import parse
    from flashgen.translators import lower

    out, meta = _generate(["--gpu", gpu, "--dtype", "fp16", "--window", window], tmp_path, monkeypatch)
    variant = variant_of(left, right).model_copy(update={"return_lse": False})
    assert meta["variant"] == variant.name and meta["target"]["arch"] == arch
    assert meta["variant_fields"]["window_left"] == left and ("window_right" in meta["variant_fields"]) == (right != -1)
    cuda = (out / "kernel.cu").read_text()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["variant"]["window_left"] == left and manifest["variant"]["causal"] is False
    tl = (out / "kernel.tl").read_text()
    assert "Let n_start = max(0, (q0 + M - N - window_left) // BLOCK_N)" in tl
    plan, _ = lower(parse(tl), gpu)
    # the two-sided visibility, and the key-tile range from both ends, as the kernel computes them
    want = [f"qpos + diag - kpos <= {left}"] + ([f"kpos <= qpos + diag + {right}"] if right != -1 else [])
    assert all(w in plan.visible for w in want), plan.visible
    if arch == "sm_90":  # the masked tiles against the rows' key limits (plan.key_range), not `visible` per score
        assert plan.key_range.lo == f"qpos + diag - {left}" and f"(q_row0 + row0) + diag - {left}" in cuda
        assert (plan.key_range.hi is None) == (right == -1)
        assert ("min(seqlen_k, (q_row0 + row0)" in cuda) == (right != -1)
    else:
        assert f"visible = kpos < seqlen_k && ({plan.visible})" in cuda
    assert plan.kv_tile_begin in cuda and f"diag - {left}" in plan.kv_tile_begin
    assert plan.kv_tile_end in cuda
    if right != -1:
        assert f"diag + {right}" in plan.kv_tile_end
    else:
        assert plan.kv_tile_end == "(seqlen_k + BLOCK_N - 1) / BLOCK_N"
    assert plan.mask_tile in cuda
    if shutil.which("gcc"):
        results = _emulate([plan], [(1024, 1024), (300, 1000), (1000, 300)], tmp_path)
        both = sum(check_tiles(res, left, right) for res in results)
        assert both > 0 if right != -1 else both == 0


def test_softmax_scale_is_recorded_and_used_by_the_cpu_check(tmp_path, monkeypatch):
    from flashgen.tl_spec import interpreter

    real, scales = interpreter.interpret, []

    def recording(program, shape, *args, **kwargs):
        scales.append((shape.N, shape.M, kwargs.get("scale")))
        return real(program, shape, *args, **kwargs)

    monkeypatch.setattr(interpreter, "interpret", recording)
    out, meta = _generate(["--gpu", "a100", "--window", "64,32", "--softmax-scale", "0.1"], tmp_path, monkeypatch)
    assert meta["softmax_scale"] == 0.1
    assert "Softmax scale: 0.1 (given" in (out / "report.md").read_text()
    checked = [s for n, m, s in scales if (n, m) in ((77, 133), (70, 45))]  # the CPU check's shapes
    assert checked == [0.1, 0.1], scales


def test_the_cpu_check_compares_at_the_given_scale():
    """A program that hard-codes 1/sqrt(64) = 0.125 for `scale` passes at the default and fails at 0.1; the library
    program passes at both."""
    from flashgen.harness.environment import Environment
    from flashgen.tl_spec import library
    from flashgen.variant import DType

    env = Environment()
    target = env.target("a100")
    variant = variant_of(64, 32)
    text = library.render(variant)
    for scale in (None, 0.1):
        assert env.check_tl(text, variant, target, DType.fp16, 64, full=True, scale=scale).ok
    fixed = text.replace("S_r * (scale * log2e)", "S_r * (0.125 * log2e)")
    assert fixed != text
    assert env.check_tl(fixed, variant, target, DType.fp16, 64, full=True).ok
    wrong = env.check_tl(fixed, variant, target, DType.fp16, 64, full=True, scale=0.1)
    assert not wrong.ok and wrong.repair == "repair_interpret" and "O elements off" in wrong.summary, wrong.summary


def test_the_scale_reaches_verification_timing_and_the_kernel(tmp_path, monkeypatch):
    """With a GPU (stood in for here), generate's softmax_scale goes to verify and bench, the reference of the
    verification is taken at it, and the returned Kernel calls with it by default."""
    from flashgen.abi import KernelManifest
    from flashgen.api import generate
    from flashgen.harness.environment import Build, Environment, Timing, Verification
    from flashgen.harness.verify import reference_outputs
    from flashgen.reference import attention, random_inputs

    seen = {}

    class OneGpu(Environment):
        def gpu_available(self):
            return True

        def build(self, source, manifest, target):
            return Build(ok=True, toolchain="nvcc (not run)")

        def verify(self, source, manifest, build, scale=None):
            seen["verify"] = scale
            return Verification(ran=True, ok=True, summary="PASS (stood in)")

        def bench(self, source, manifest, build, target, scale=None):
            seen["bench"] = scale
            return Timing(ran=True, shape="B=4,H=16,KVH=16,N=4096,M=4096,D=64", time_ms=1.0,
                          baselines_ms={"flex": 2.0})

    monkeypatch.setenv("FLASHGEN_HOME", str(tmp_path / "home"))
    kernel = generate(gpu="a100", head_dim=64, window_size=(64, 32), softmax_scale=0.1, env=OneGpu(),
                      out=tmp_path / "out")
    assert seen == {"verify": 0.1, "bench": 0.1}
    assert kernel.softmax_scale == 0.1 and kernel.meta["softmax_scale"] == 0.1
    assert kernel.manifest.variant == Variant(window_left=64, window_right=32)
    manifest = KernelManifest.model_validate(json.loads((tmp_path / "out" / "manifest.json").read_text()))
    q, k, v = random_inputs(Shape(B=1, H=2, N=70, M=45, D=64), seed=3)
    o, _ = reference_outputs(manifest, q, k, v, scale=0.1)
    np.testing.assert_allclose(o, attention(q, k, v, manifest.variant, 0.1)[0])
    assert not np.allclose(o, reference_outputs(manifest, q, k, v)[0])
    with pytest.raises(UsageError, match="softmax_scale"):
        generate(gpu="a100", softmax_scale=0.1, resume="1", out=tmp_path / "o2")
    with pytest.raises(UsageError, match="softmax_scale=0.0"):
        generate(gpu="a100", head_dim=64, softmax_scale=0.0, env=OneGpu())


@pytest.mark.parametrize("gpu, num_splits", [("a100", "7"), ("h200", None)])
def test_generate_split_kv_from_the_cli(gpu, num_splits, tmp_path, monkeypatch):
    args = ["--gpu", gpu, "--split-kv"] + (["--num-splits", num_splits] if num_splits else [])
    out, meta = _generate(args, tmp_path, monkeypatch)
    manifest = json.loads((out / "manifest.json").read_text())
    assert meta["variant"] == "decode_splitkv" and manifest["variant"]["split_kv"] is True
    assert [launch["kernel"].endswith("_combine") for launch in manifest["launches"]] == [False, True]
    assert manifest["workspace_floats"] == "B*H*SPLITS*N*(D+1)"
    if num_splits:
        assert manifest["num_splits"] == num_splits and meta["num_splits"] == int(num_splits)
    else:  # chosen at each launch from the sizes
        assert manifest["num_splits"].startswith("max(1, min(32,") and "num_splits" not in meta
    if gpu == "h200":  # the Hopper path does not take split-KV: the sm80 path does, and says so
        assert meta["code_path"]["backend"] == "sm80" and "split-KV" in " ".join(meta["code_path"]["why"])
    from flashgen.abi import eval_size

    sizes = {"B": 1, "H": 8, "KVH": 8, "N": 1, "M": 8192, "D": 64, "SPLITS": 1, "SMS": 132}
    assert eval_size(manifest["num_splits"], sizes) == (7 if num_splits else 32)


# ------------------------------------------------------------------------------------------------ CLI errors

def _cli(*args, tmp_path):
    env = {**os.environ, "FLASHGEN_HOME": str(tmp_path / "home")}
    code = "import sys; sys.argv = ['flashgen', *sys.argv[1:]]; from flashgen.cli import main; main()"
    return subprocess.run([sys.executable, "-c", code, "generate", *args], capture_output=True, text=True,
                          timeout=120, env=env, cwd=tmp_path)


@pytest.mark.parametrize("args, message", [
    (["--window=-2,5"], "error: --window -2,5: left -2: must be greater than or equal to -1"),
    (["--window", "5,-3"], "error: --window 5,-3: right -3: must be greater than or equal to -1"),
    (["--window=-1,-1", "--causal"], "error: --window -1,-1: both sides unbounded is no window"),
    (["--window", "1.5,3"], "error: --window 1.5,3: expected LEFT,RIGHT, two integers"),
    (["--window", "64,32,1"], "error: --window 64,32,1: expected LEFT,RIGHT"),
    (["--window", "wide"], "error: --window wide: expected W (an integer"),
    (["--window", "64"], "error: unsupported variant: a sliding window implies causal=True"),
    (["--split-kv", "--causal"], "error: --split-kv: split-KV decode takes no causal mask or window"),
    (["--num-splits", "4"], "error: --num-splits 4: only with --split-kv"),
    (["--split-kv", "--num-splits", "0"], "error: --num-splits 0: must be greater than or equal to 1"),
    (["--softmax-scale", "0"], "error: --softmax-scale 0: must be greater than 0"),
    (["--softmax-scale", "inf"], "error: --softmax-scale inf: must be a finite number"),
])
def test_bad_window_scale_and_split_options_are_one_line_exit_2(args, message, tmp_path):
    done = _cli(*args, "--out", str(tmp_path / "o"), tmp_path=tmp_path)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, (done.returncode, done.stderr)
    assert lines[0].startswith(message), lines[0]
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------------------------------------ prompts

def test_a_window_task_is_told_the_two_sided_rule_and_no_internal_names(monkeypatch, tmp_path):
    from flashgen.agent.loop import Loop, LoopConfig
    from flashgen.agent.providers import ScriptedProvider, Task
    from flashgen.harness.environment import Environment
    from flashgen.prompts.internal import find_internal
    from flashgen.variant import DType

    monkeypatch.setenv("FLASHGEN_HOME", str(tmp_path / "home"))
    env = Environment()
    texts = {}
    for variant in (variant_of(64, 32), Variant(causal=True)):
        task = Task(variant=variant, target="a100", arch="sm_80", dtype=DType.fp16, head_dim=64)
        loop = Loop(LoopConfig(task=task), ScriptedProvider([]), env, trace=None)
        texts[variant.name] = loop._opening_prompt("sketch")
    window = texts["window64l32r_lse"]
    assert "- window_left = 64" in window and "- window_right = 32" in window
    assert "key j visible iff i + M - N - L <= j <= i + M - N + R" in window
    assert "Two-sided window" not in texts["causal"]
    assert find_internal(window) == []
