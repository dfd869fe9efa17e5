"""Score and mask functions (issue 15 item 2, FlexAttention's score_mod and mask_mod): `flashgen generate --score-mod
EXPR --mask-mod EXPR --param NAME=VALUE` and `flashgen.generate(score_mod=, mask_mod=, params=)` write them into the
expert's TL (flashgen.mods), so the checker, the interpreter and every backend take them as any TL, and the kernel's
reference is its own TL's fp64 interpretation (the manifest's reference_tl)."""

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from flashgen import operators
from flashgen.agent.messages import Task
from flashgen.agent.outputs import FILES
from flashgen.errors import UsageError
from flashgen.harness.environment import Environment
from flashgen.mods import Mods, make_mods, tile_report
from flashgen.tl_spec import library, parse
from flashgen.tl_spec.interpreter import interpret
from flashgen.translators import translate
from flashgen.translators.cexpr import CEnv, NameInfo, compile_expr, evaluate
from flashgen.variant import DType, Norm, Shape, Variant
from tests.cli_cases import assert_one_line_exit_2

SCORE = "s + 0.25 * cos(k_idx)"
DOC_MASK = "(q_idx // DOC) == (k_idx // DOC)"
GPUS = [("a100", "fp16", "sm_80"), ("h200", "bf16", "sm_90"), ("t4", "fp16", "sm_75")]


def _has_gpu() -> bool:
    from flashgen.harness.worker import have_gpu

    return bool(have_gpu())


def flashgen(*args, tmp_path: Path, timeout: int = 600):
    env = {**os.environ, "FLASHGEN_HOME": str(tmp_path / "home")}
    return subprocess.run([sys.executable, "-m", "flashgen.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=tmp_path)


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHGEN_HOME", str(tmp_path / "home"))


# ------------------------------------------------------------------------------------------ an independent meaning

def numpy_attention(q, k, v, variant: Variant, scale: float, score=None, mask=None):
    """What the TL with the functions must compute, written here without flashgen: per (b, h) the dense scores,
    softcap, the score function, ALiBi, the variant's mask and the mask function, then the normalization."""
    batch, heads, n, _ = q.shape
    kv_heads, m = k.shape[1], k.shape[2]
    qi, kj = np.arange(n)[:, None], np.arange(m)[None, :]
    o, lse = np.zeros(q.shape), np.full((batch, heads, n), -np.inf)
    for b in range(batch):
        for h in range(heads):
            kh = h // (heads // kv_heads)
            s = scale * q[b, h] @ k[b, kh].T
            if variant.softcap is not None:
                s = variant.softcap * np.tanh(s / variant.softcap)
            if score is not None:
                s = np.broadcast_to(score(s, qi, kj, b, h), (n, m))
            if variant.alibi:
                s = s - 2.0 ** (-8.0 * (h + 1) / heads) * np.abs(qi + m - n - kj)
            visible = np.ones((n, m), dtype=bool)
            if variant.causal:
                visible &= kj <= qi + m - n
            if variant.window is not None:
                visible &= (qi + m - n) - kj < variant.window
            if mask is not None:
                visible &= np.broadcast_to(mask(qi, kj, b, h), (n, m))
            if variant.norm is Norm.softmax:
                s = np.where(visible, s, -np.inf)
                top = s.max(axis=1, keepdims=True)
                top = np.where(np.isfinite(top), top, 0.0)
                p = np.exp(s - top)
                total = p.sum(axis=1, keepdims=True)
                o[b, h] = np.where(total > 0, (p @ v[b, kh]) / np.where(total > 0, total, 1), 0.0)
                lse[b, h] = np.where(total[:, 0] > 0, np.log(np.where(total[:, 0] > 0, total[:, 0], 1)) + top[:, 0],
                                     -np.inf)
            else:
                g = np.maximum(s, 0.0) / m if variant.norm is Norm.relu else 1.0 / (1.0 + np.exp(-(s - np.log(m))))
                o[b, h] = np.where(visible, g, 0.0) @ v[b, kh]
    return o, lse


def _check_tl_against_numpy(tl: str, variant: Variant, score, mask, shapes) -> None:
    program = parse(tl)
    for seed, shape in enumerate(shapes):
        result = interpret(program, shape, seed=seed)
        q, k, v = (result.inputs[x] for x in ("Q", "K", "V"))
        want_o, want_lse = numpy_attention(q, k, v, variant, result.scale, score, mask)
        got = np.asarray(result.outputs["O"], dtype=np.float64)
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, want_o, rtol=1e-9, atol=1e-11)
        if variant.return_lse:
            np.testing.assert_allclose(np.asarray(result.outputs["LSE"], dtype=np.float64), want_lse, rtol=1e-9,
                                       atol=1e-11)


SMALL = [Shape(B=2, H=2, KVH=2, N=77, M=133, D=64), Shape(B=1, H=2, KVH=2, N=70, M=45, D=64)]


# ------------------------------------------------------------------------------------------ the one table

def test_cos_and_sin_are_in_the_one_table_and_every_layer_reads_them_from_it():
    for name, fn in (("cos", math.cos), ("sin", math.sin)):
        f = operators.FUNCTIONS[name]
        assert f.arity == 1 and f.sfu and f.c_float == (f"fg::{name}_approx", f"__{name}f")
        assert f.scalar(0.7) == fn(0.7) and np.allclose(f.array(np.array([0.7, 2.0])), [fn(0.7), fn(2.0)])
        expr = parse(f"Compute X = {name}(k_idx) * 0.5").body[0].expr
        env = CEnv(names={"k_idx": NameInfo("kpos", ctype="int", nonneg=True)})
        assert compile_expr(expr, env) == f"fg::{name}_approx((float)kpos) * 0.5f"
        assert np.allclose(evaluate(expr, {"k_idx": np.arange(4)}), 0.5 * np.array([fn(i) for i in range(4)]))


# ------------------------------------------------------------------------------------------ the CLI

def _common_checks(done, out: Path, arch: str) -> tuple[str, str, dict, dict]:
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stdout + done.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)
    tl, cuda = (out / "kernel.tl").read_text(), (out / "kernel.cu").read_text()
    manifest, meta = json.loads((out / "manifest.json").read_text()), json.loads((out / "meta.json").read_text())
    assert manifest["arch"].startswith(arch)
    # not a variant's function: the kernel's reference is its own TL, interpreted in fp64
    assert manifest["reference_tl"] is not None and parse(manifest["reference_tl"]) == parse(tl)
    assert meta["generation"]["provider"] == "expert" and meta["generation"]["status"] == "done"
    assert all(usage["registers"] > 0 for usage in meta["resources"].values())  # nvcc (ptxas) built it
    if _has_gpu():
        assert meta["verification"]["ran"] and meta["verification"]["ok"], meta["verification"]
    else:
        assert not meta["verification"]["ran"]
        assert any(line.startswith("verified  no: compiled and estimated") for line in done.stdout.splitlines())
    return tl, cuda, manifest, meta


@pytest.mark.parametrize("gpu,dtype,arch", GPUS)
def test_cli_score_mod_generates_checks_and_compiles(gpu, dtype, arch, tmp_path):
    out = tmp_path / "out"
    done = flashgen("generate", "--gpu", gpu, "--dtype", dtype, "--head-dim", "64", "--score-mod", SCORE, "--out",
                    str(out), tmp_path=tmp_path)
    tl, cuda, _, meta = _common_checks(done, out, arch)
    # the TL says the function and applies it in the softmax's log2 units, after the scale line in natural units
    assert f"# score function: s -> {SCORE} (s: the scaled score, natural units)" in tl
    assert "Compute S_r = S_r * scale\n" in tl and "Compute S_r = (S_r + 0.25 * cos(k_idx)) * log2e" in tl
    assert "(scale * log2e)" not in tl
    # its lowering: the fp32 score line of the kernel, with the TL line it came from; every path computes
    # 0.25 * cos(k_idx), a function of the key alone, once per column and warp (by shuffles) and adds the shared
    # value per score, at its accumulator loop's slot (sm90: i over a wgmma fragment; mma.sync: nt and c)
    slot = "(i >> 2) * 2 + (i & 1)" if arch == "sm_90" else "nt * 2 + (c & 1)"
    assert f"s = s + kt0[{slot}];" in cuda
    assert cuda.count("= (0.25f * fg::cos_approx((float)kpos));") == 1 and "mine[jj * 2 + c] = (0.25f * fg::cos_approx((float)kpos));" in cuda
    assert "s *= 1.4426950408889634f" not in cuda  # log2 e goes into the exponent's FFMA (mult)
    assert "cos(k_idx)" in cuda
    assert meta["mods"] == {"score_mod": SCORE, "mask_mod": None, "params": [], "tiles": None}
    assert "score/mask functions: score s + 0.25 * cos(k_idx)" in done.stderr
    # what the TL computes is what the function means (numpy, written above without flashgen)
    _check_tl_against_numpy(tl, Variant(), lambda s, q, k, b, h: s + 0.25 * np.cos(k), None, SMALL[:1])


@pytest.mark.parametrize("gpu,dtype,arch", GPUS)
def test_cli_document_mask_with_a_param(gpu, dtype, arch, tmp_path):
    out = tmp_path / "out"
    causal = gpu == "h200"  # one of them on top of the causal mask
    done = flashgen("generate", "--gpu", gpu, "--dtype", dtype, "--head-dim", "64", *(["--causal"] if causal else []),
                    "--mask-mod", DOC_MASK, "--param", "DOC=48", "--out", str(out), tmp_path=tmp_path)
    tl, cuda, _, meta = _common_checks(done, out, arch)
    assert "# mask function: a key is visible where q_idx // DOC == k_idx // DOC, with DOC = 48" in tl
    assert "Compute S_r = where(q_idx // 48 == k_idx // 48, S_r, -inf)" in tl
    assert "(scale * log2e)" in tl  # no score function: the scale line is the library's
    visible = next(line for line in cuda.splitlines() if "visible = kpos < seqlen_k" in line)
    assert "qpos / 48 == kpos / 48" in visible  # positions are never negative: C's / is the floor division
    assert meta["mods"]["mask_mod"] == "q_idx // DOC == k_idx // DOC" and meta["mods"]["params"] == [["DOC", 48]]
    tiles = meta["mods"]["tiles"]
    assert tiles["missed"] == 0 and 0 < tiles["visited_empty"] < tiles["visited"] <= tiles["tiles"]
    assert f"the mask leaves {tiles['visited_empty']} of the {tiles['visited']} key tiles" in done.stderr
    variant = Variant(causal=causal)
    _check_tl_against_numpy(tl, variant, None, lambda q, k, b, h: q // 48 == k // 48, SMALL)


def test_cli_default_out_is_the_variants_folder_with_the_functions_tag(tmp_path):
    mods = make_mods(SCORE)
    assert mods.tag.startswith("mod") and len(mods.tag) == 11 and make_mods(SCORE).tag == mods.tag
    assert make_mods("s + 0.5 * cos(k_idx)").tag != mods.tag
    from flashgen.api import default_out_dir

    assert default_out_dir("a100", DType.fp16, Variant(causal=True), 64, mods=mods) == Path(
        f"generated/a100/fp16/causal_{mods.tag}_d64")
    assert default_out_dir("a100", DType.fp16, Variant(causal=True), 64) == Path("generated/a100/fp16/causal_d64")


BAD = [
    (["--score-mod", "s + foo(k_idx)"], "error: --score-mod 's + foo(k_idx)': unknown function 'foo' (functions: "),
    (["--score-mod", "s + (k_idx"], "error: --score-mod 's + (k_idx': syntax error at column 11: line ends too early"),
    (["--score-mod", "s * +* 2"], "error: --score-mod 's * +* 2': syntax error at column 6: unexpected '*'"),
    (["--score-mod", "s + x"], "error: --score-mod 's + x': unknown name 'x' (names: s, q_idx, k_idx, b, h,"),
    (["--mask-mod", "q_idx - k_idx"], "error: --mask-mod 'q_idx - k_idx': a number, not a condition"),
    (["--score-mod", "s < 1"], "error: --score-mod 's < 1': a condition, not a score"),
    (["--score-mod", "s // 2"], "error: --score-mod 's // 2': `//` on a float operand"),
    (["--score-mod", "sqrt(s)"], "error: --score-mod 'sqrt(s)': gives nan at q_idx="),
    (["--mask-mod", DOC_MASK], f"error: --mask-mod '{DOC_MASK}': unknown name 'DOC'"),
    (["--mask-mod", DOC_MASK, "--param", "DOC=abc"], "error: --param DOC=abc: 'abc' is not a number"),
    (["--mask-mod", DOC_MASK, "--param", "DOC"], "error: --param 'DOC': expected NAME=VALUE"),
    (["--mask-mod", "k_idx < 5", "--param", "X=1"], "error: --param X=1: not used by --mask-mod"),
    (["--param", "X=1"], "error: --param X: parameters need --score-mod or --mask-mod"),
    (["--score-mod", "s", "--param", "h=1"], "error: --param h: a name the expressions already have"),
    (["--score-mod", ""], "error: --score-mod '': empty"),
]


def test_bad_expressions_exit_2_with_one_line_before_any_model_call(tmp_path):
    # one process runs every case through flashgen.cli.main, as `flashgen generate ...` does; no model is asked
    # and no run recorded
    assert_one_line_exit_2(BAD, tmp_path)


def test_the_api_takes_the_keywords_and_refuses_bad_ones_as_usage_errors(tmp_path):
    import flashgen

    with pytest.raises(UsageError, match=r"^mask_mod='q_idx': a number, not a condition"):
        flashgen.generate(gpu="a100", mask_mod="q_idx")
    with pytest.raises(UsageError, match=r"^params DOC=1.5: not used by score_mod$"):
        flashgen.generate(gpu="a100", score_mod="s", params={"DOC": 1.5})
    with pytest.raises(UsageError, match=r"^params 'x y': a parameter's name"):
        flashgen.generate(gpu="a100", mask_mod="k_idx < 3", params={"x y": 1})
    with pytest.raises(UsageError, match=r"^params W=True: a parameter is a number"):
        flashgen.generate(gpu="a100", score_mod="s * W", params={"W": True})
    with pytest.raises(UsageError, match="a resume keeps the run's own functions"):
        flashgen.generate(resume="1", out=tmp_path / "o", score_mod="s")
    kernel = flashgen.generate(gpu="a100", dtype="fp16", head_dim=64, causal=True, score_mod="s - ALPHA * sin(h)",
                               mask_mod="k_idx % STRIDE != 1", params={"ALPHA": -0.5, "STRIDE": 3},
                               out=tmp_path / "k")
    assert kernel.meta["mods"]["params"] == [["ALPHA", -0.5], ["STRIDE", 3]]
    assert "Compute S_r = (S_r - -0.5 * sin(h)) * log2e" in kernel.tl
    assert "Compute S_r = where(k_idx % 3 != 1, S_r, -inf)" in kernel.tl
    assert "fg::sin_approx((float)head)" in kernel.source and "kpos % 3 != 1" in kernel.source
    assert kernel.manifest.reference_tl is not None
    _check_tl_against_numpy(kernel.tl, Variant(causal=True), lambda s, q, k, b, h: s + 0.5 * np.sin(h),
                            lambda q, k, b, h: k % 3 != 1, SMALL)


# ------------------------------------------------------------------------------------------ the TL, every form

MODS = make_mods("s + 0.25 * cos(k_idx) - 0.1 * sin(q_idx * (h + 1)) + 0.05 * b",
                 "q_idx // DOC == k_idx // DOC or k_idx % 5 == 0", {"DOC": 24})


def _score(s, q, k, b, h):
    return s + 0.25 * np.cos(k) - 0.1 * np.sin(q * (h + 1)) + 0.05 * b


def _mask(q, k, b, h):
    return (q // 24 == k // 24) | (k % 5 == 0)


@pytest.mark.parametrize("variant", [Variant(causal=True, return_lse=True), Variant(softcap=30.0, alibi=True),
                                     Variant(norm=Norm.relu), Variant(norm=Norm.sigmoid, causal=True, window=20),
                                     Variant(kv_group=2, return_lse=True), Variant(split_kv=True, return_lse=True)],
                         ids=lambda v: v.name)
@pytest.mark.parametrize("gpu,dtype", [("a100", "fp16"), ("t4", "bf16"), ("h200", "bf16")])
def test_the_interpreter_computes_the_functions_as_numpy_does(variant, gpu, dtype):
    env = Environment()
    target = env.target(gpu)
    if variant.split_kv and target.arch == "sm_90":
        pytest.skip("split-KV has no Hopper dataflow form (the sm_80 form is the a100 case)")
    tl = env.library_tl(variant, target, DType(dtype), 64, form="full", mods=MODS)
    sketch = env.library_tl(variant, target, DType(dtype), 64, form="sketch", mods=MODS)
    assert "q_idx // 24 == k_idx // 24 or k_idx % 5 == 0" in tl and "cos(k_idx)" in sketch
    group = variant.kv_group
    shapes = [Shape(B=2, H=2 * group, KVH=2, N=77, M=133, D=64), Shape(B=1, H=2 * group, KVH=2, N=70, M=45, D=64)]
    _check_tl_against_numpy(tl, variant, _score, _mask, shapes)
    translation = translate(parse(tl), target)  # and every backend takes it
    assert translation.manifest.reference_tl is not None and "fg::cos_approx((float)kpos)" in translation.source


def test_the_roofline_counts_a_call_on_the_key_alone_once_a_column_and_any_other_once_a_score():
    from flashgen.mods import reference_program

    env = Environment()
    target = env.target("h200")

    def sfu(score_mod):
        tl = (reference_program(make_mods(score_mod=score_mod), Variant(), target, DType.bf16, 128, env) if score_mod
              else env.library_tl(Variant(), target, DType.bf16, 128, form="full"))
        return env._roofline_counts(env.parse(tl), Variant(), 128)["sfu_ops"]

    plain, per_key, per_pair = sfu(None), sfu("s + 0.25 * cos(k_idx)"), sfu("s + 0.25 * cos(q_idx - k_idx)")
    pairs = 4 * 16 * 4096 * 4096  # the roofline shape's (B=4, H=16, N=M=4096)
    assert per_pair - plain == pytest.approx(pairs, rel=1e-6)  # one cos a score
    assert 0 < per_key - plain < pairs / 64  # one a key column of each query block (BLOCK_M rows share it)


def test_without_functions_nothing_changes():
    env = Environment()
    target = env.target("a100")
    v = Variant(causal=True)
    assert env.library_tl(v, target, DType.fp16, 64, form="full") == library.render(v, dtype="fp16", arch="sm_80")
    task = Task(variant=v, target="a100", arch="sm_80", dtype=DType.fp16, head_dim=64)
    assert "mods" not in task.model_dump(mode="json") and "mods" not in task.model_dump_json()
    with_mods = task.model_copy(update={"mods": MODS})
    assert Task.model_validate_json(with_mods.model_dump_json()) == with_mods  # recorded and resumed as given
    from flashgen.agent.loop import LoopConfig

    config = LoopConfig(task=with_mods, reference_tl="Target ...")
    again = LoopConfig.model_validate(json.loads(json.dumps(config.model_dump(mode="json"))))  # as the store does
    assert again.task.mods == MODS and again.reference_tl == "Target ..."


def test_the_prompt_tells_a_model_the_functions_without_internal_names(tmp_path):
    from flashgen.agent.loop import Loop, LoopConfig
    from flashgen.agent.providers import ScriptedProvider
    from flashgen.prompts.internal import find_internal

    env = Environment()
    v = Variant(causal=True)
    task = Task(variant=v, target="a100", arch="sm_80", dtype=DType.fp16, head_dim=64, mods=MODS)
    loop = Loop(LoopConfig(task=task), ScriptedProvider([]), env, trace=None)
    loop.state.sketch = env.library_tl(v, env.target("a100"), DType.fp16, 64, form="sketch", mods=MODS)
    for phase in ("sketch", "params"):
        prompt = loop._opening_prompt(phase)
        assert "Score and mask functions of this task, on top of the variant:" in prompt
        assert f"s is replaced by `{MODS.score_mod}`" in prompt and f"only where `{MODS.mask_mod}` holds" in prompt
        assert "DOC = 24" in prompt and find_internal(prompt) == []
    plain = Loop(LoopConfig(task=task.model_copy(update={"mods": None})), ScriptedProvider([]), env, trace=None)
    assert "Score and mask functions" not in plain._opening_prompt("sketch")


# ------------------------------------------------------------------------------------------ the tiles

def _brute_force_tiles(variant: Variant, mask, n: int, m: int, bm: int, bn: int, walked) -> dict[str, int]:
    """Every element of every (query tile, key tile), in numpy; `walked(m_blk)` the key tiles the kernel's loop
    walks for that query tile (its bounds, as the library writes them)."""
    q, k = np.meshgrid(np.arange(n), np.arange(m), indexing="ij")
    visible = mask(q, k, 0, 0)
    if variant.causal:
        visible &= k <= q + m - n
    counts = {"tiles": 0, "visited": 0, "visited_empty": 0, "missed": 0}
    for mt in range(-(-n // bm)):
        for nt in range(-(-m // bn)):
            any_visible = bool(visible[mt * bm:(mt + 1) * bm, nt * bn:(nt + 1) * bn].any())
            visited = nt in walked(mt)
            counts["tiles"] += 1
            counts["visited"] += visited
            counts["visited_empty"] += visited and not any_visible
            counts["missed"] += any_visible and not visited
    return counts


@pytest.mark.parametrize("n,m", [(512, 512), (300, 700), (700, 300)])
@pytest.mark.parametrize("causal", [False, True])
def test_the_per_tile_check_agrees_with_every_element(n, m, causal):
    mods = make_mods(mask_mod=DOC_MASK, params={"DOC": 100})
    variant = Variant(causal=causal)
    bm, bn = 64, 32
    tl = library.render(variant, params={"BLOCK_M": bm, "BLOCK_N": bn, "WARPS": 4, "STAGES": 2})
    from flashgen.mods import apply

    report = tile_report(mods, apply(tl, mods, variant), n=n, m=m)

    def walked(mt):  # the causal key loop stops at the diagonal; the plain one walks every tile
        stop = min(-(-m // bn), -(-(mt * bm + bm + m - n) // bn)) if causal else -(-m // bn)
        return set(range(max(stop, 0)))

    want = _brute_force_tiles(variant, lambda q, k, b, h: q // 100 == k // 100, n, m, bm, bn, walked)
    assert {key: report[key] for key in want} == want
    assert report["missed"] == 0 and report["visited_empty"] > 0 and report["block"] == [bm, bn]


def test_the_per_tile_check_needs_a_mask_of_positions():
    assert tile_report(make_mods(SCORE), library.render(Variant())) is None
    score_mask = make_mods(mask_mod="s > -3 or k_idx < 10")
    assert not score_mask.mask_of_positions
    assert tile_report(score_mask, library.render(Variant())) is None
    assert Mods(mask_mod="k_idx < 10").mask_of_positions


@pytest.mark.parametrize("score_mod, terms", [
    # the key-only addends as one term, parenthesized (one FFMA a score for the whole sum)
    ("s + 0.25 * cos(k_idx)", ("(0.25f * fg::cos_approx((float)kpos))",)),
    ("s * cos(k_idx)", ("fg::cos_approx((float)kpos)",)),
    ("s + cos(k_idx) + cos(k_idx)", ("(2.0f * fg::cos_approx((float)kpos))",)),
    ("s + cos(k_idx + h) + exp(-k_idx / M)", ("(fg::cos_approx((float)(kpos + head)) + expf(-((float)kpos * tl_c0)))",)),
    ("s * cos(k_idx) + cos(k_idx)", ("(fg::cos_approx((float)kpos))", "fg::cos_approx((float)kpos)")),
    ("s + cos(q_idx)", ()),            # the row's: not a column's value
    ("s + cos(k_idx - q_idx)", ()),    # both positions
    ("s + abs(k_idx)", ()),            # no SFU function: nothing worth sharing
    ("s + cos(s) * cos(k_idx)", ("fg::cos_approx((float)kpos)",)),
])
def test_calls_on_the_key_position_alone_are_found_as_they_appear_in_the_c(score_mod, terms):
    """ScoreMod.key_terms: the sum of the score's addends that read k_idx and block constants only and call an SFU
    function, as one parenthesized term at the end of the score's C, then every SFU call on k_idx and block
    constants alone in the rest, as its C appears there (what share_key_terms computes once per column)."""
    from flashgen.mods import reference_program
    from flashgen.translators.lower import lower

    env = Environment()
    target = env.target("h200")
    program = parse(reference_program(make_mods(score_mod=score_mod), Variant(), target, DType.bf16, 128, env))
    plan, _notes = lower(program, target)
    (mod,) = [m for m in plan.score_mods if m.uses_positions or "cos_approx" in m.expr]
    assert mod.key_terms == terms and all(term in mod.expr for term in terms), (mod.expr, mod.key_terms)
    if terms and terms[0].startswith("("):
        assert mod.expr.endswith(f" + {terms[0]}")


@pytest.mark.skipif(not shutil.which("nvcc"), reason="nvcc not on PATH")
def test_shared_key_terms_render_once_per_column_and_warp_and_compile():
    """share_key_terms (on by default: cos(k_idx) 3.7-4.6x faster on the H200, NOTES.md session 7): the sm90 kernel
    evaluates each key-only term (the sum of the key-only addends, then each key-only call in the rest) for 2 * KT_J
    columns per lane and shuffles, the per-score expression reads kt<n>; with the switch off the kernel is as
    lowered. The shared build compiles for sm_90a with at most 64 bytes of spills: its two terms hold 64 registers
    beside S, P and O, and with fg::cos_approx's branch-free calls ptxas spills 48-60 bytes where cosf's did not;
    measured on the H200 that build is level or 1-3 % faster than cosf's without spills (NOTES.md, session 14), so
    the bound guards against more, not against any."""
    from flashgen.harness.compile import compile_cuda
    from flashgen.harness.suite import build_mask_kernel
    from flashgen.translators.backends.sm90 import kernel

    keywords = {"score_mod": "s * cos(k_idx + h) + exp(-k_idx / M)", "mask_mod": "k_idx < LEN[b]",
                "tensors": {"LEN": "int32[B]:0..M"}}
    with kernel.schedule_overrides(share_key_terms=False):
        plain_source, _ = build_mask_kernel("h200", "bf16", Variant(causal=True), 128, keywords)
    source, manifest = build_mask_kernel("h200", "bf16", Variant(causal=True), 128, keywords)
    assert "fg::cos_approx((float)(kpos + head))" in plain_source and "kt0" not in plain_source
    assert source.count("__shfl_sync(0xffffffffu, mine") == 2 and "float kt1[BLOCK_N / 4];" in source
    assert "mine[jj * 2 + c] = (expf(" in source and "mine[jj * 2 + c] = fg::cos_approx((float)(kpos + head));" in source
    line = next(x for x in source.splitlines() if x.strip().startswith("s = s * kt1["))
    assert "cos_approx" not in line and "expf" not in line and line.strip().startswith(
        "s = s * kt1[(i >> 2) * 2 + (i & 1)] + kt0[(i >> 2) * 2 + (i & 1)];"), line
    with pytest.raises(ValueError, match="unknown schedule switches"):
        with kernel.schedule_overrides(share_keys=True):
            pass
    built = compile_cuda(source, "sm_90a", filename="shared_key_terms.cu")
    assert built.ok and built.kernels, built.feedback_text()
    assert all(u.spill_store_bytes <= 64 and u.spill_load_bytes <= 64 for u in built.kernels.values()), \
        built.feedback_text()
