"""cexpr: TL expressions compiled to C agree with the interpreter's numpy evaluation (host C++ compiled by g++, tests/host_c.py)."""

import subprocess

import numpy as np
import pytest

from flashgen.tl_spec import ast
from flashgen.tl_spec.parser import parse
from flashgen.translators.cexpr import (
    CEnv,
    CExprError,
    NameInfo,
    compile_expr,
    evaluate,
    float_literal,
    simplify,
    to_poly,
)
from tests import host_c

EXPRESSIONS = [
    "where(k_idx <= q_idx + M - N, S, -inf)",
    "30.0 * tanh(S / 30.0)",
    "S - exp2(-8.0 * (h + 1) / H) * abs(q_idx + M - N - k_idx)",
    "sigmoid(S - log(M))",
    "relu(S) / M",
    "(q_idx - k_idx) // 7",
    "(q_idx - k_idx) % 5",
    "cdiv(q_idx - k_idx, 4)",
    "cdiv(q_idx + 3, 4)",
    "max(0, (q_idx + M - N - 9 + 1) // 4)",
    "min(S, 2) + max(k_idx, 3)",
    "where(k_idx < 4 or k_idx <= q_idx, S * 2, 0)",
    "exp(S) + log2(M) + sqrt(abs(S)) + exp2(S / 4)",
    "where(not (k_idx < 3) and q_idx != k_idx, 1, 0)",
    "1 / 3 + 2 + S * (log2e * ln2)",
    "-S * 1.5 + h * 2 - (q_idx - 2 * k_idx)",
    "0.25 * cos(k_idx + 4096 * h) + sin(S)",
]


def _expr(text: str):
    return parse(f"Compute X = {text}").body[0].expr


def _env() -> CEnv:
    pos = {"ctype": "int", "nonneg": True}
    return CEnv(names={"S": NameInfo("s", "float"), "q_idx": NameInfo("qpos", **pos), "k_idx": NameInfo("kpos", **pos),
                       "M": NameInfo("seqlen_k", positive=True), "N": NameInfo("seqlen_q", positive=True),
                       "h": NameInfo("head", **pos), "H": NameInfo("heads", positive=True)}, translator="sm_80")


def _points():
    rng = np.random.default_rng(0)
    n = 64
    return {"q_idx": rng.integers(0, 12, n), "k_idx": rng.integers(0, 12, n), "h": rng.integers(0, 4, n),
            "S": np.round(rng.standard_normal(n) * 4, 3), "M": 10, "N": 7, "H": 4}


@pytest.mark.skipif(host_c.CXX is None, reason="needs g++")
def test_compiled_c_matches_numpy_evaluation(tmp_path):
    pts = _points()
    n = len(pts["S"])
    env = _env()
    compiled = [compile_expr(_expr(t), env) for t in EXPRESSIONS]
    lines = [host_c.PRELUDE,
             f"static const int Q[{n}] = {{{', '.join(map(str, pts['q_idx']))}}};",
             f"static const int K[{n}] = {{{', '.join(map(str, pts['k_idx']))}}};",
             f"static const int HH[{n}] = {{{', '.join(map(str, pts['h']))}}};",
             f"static const float SV[{n}] = {{{', '.join(f'{float(v)!r}f' for v in pts['S'])}}};",
             "int main(void) {", "  const int seqlen_k = 10, seqlen_q = 7, heads = 4;",
             f"  for (int i = 0; i < {n}; ++i) {{",
             "    const int qpos = Q[i], kpos = K[i], head = HH[i]; const float s = SV[i];",
             "    (void)qpos; (void)kpos; (void)head; (void)s;"]
    for c in compiled:
        lines.append(f'    printf("%.9g ", (double)({c}));')
    lines += ['    printf("\\n");', "  }", "  return 0;", "}"]
    src = tmp_path / "exprs.cpp"
    src.write_text("\n".join(lines))
    exe = tmp_path / "exprs"
    subprocess.run([*host_c.COMPILE, "-o", str(exe), str(src), "-lm"], check=True, capture_output=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split("\n")
    got = np.array([[float(x) for x in line.split()] for line in out if line.strip()])
    assert got.shape == (n, len(EXPRESSIONS))
    for j, text in enumerate(EXPRESSIONS):
        want = np.broadcast_to(np.asarray(evaluate(_expr(text), pts), dtype=np.float64), (n,))
        both_inf = np.isinf(want) & (want == got[:, j])
        # tanh lowers to fg::tanh_fast (the device's tanh.approx.f32, relative error ~1.1e-5; tanhf on the host)
        atol = 30 * 2e-7 if "tanh" in text else 2e-6
        ok = both_inf | np.isclose(got[:, j], want, rtol=2e-6, atol=atol)
        assert ok.all(), f"{text} -> {compiled[j]}: C {got[~ok, j][:3]} vs numpy {want[~ok][:3]}"


@pytest.mark.skipif(host_c.CXX is None, reason="needs g++")
def test_the_range_reduction_of_cos_and_sin_keeps_the_phase(tmp_path):
    """fg::cos_approx / fg::sin_approx reduce x by 2 pi in two FMAs (common.cuh's reduce_2pi, compiled here as it
    is) before the SFU's cos.approx: the reduced argument's cos and sin, in fp64, stay within 3e-7 of x's below
    2^24 (MUFU.COS adds its own 2^-21.4 on [-pi, pi]) and within 1e-5 below 2^31."""
    rng = np.random.default_rng(1)
    xs = np.concatenate([np.arange(0, 70000, 7), rng.uniform(-1e4, 1e4, 2000), rng.uniform(-2.0**24, 2.0**24, 2000),
                         rng.uniform(-2.0**31, 2.0**31, 2000), [2.0**24 - 1, -3.0e6, 1.0e-3]]).astype(np.float32)
    src = tmp_path / "reduce.cpp"
    src.write_text(host_c.PRELUDE + "\nint main(void) {\n  float x;\n"
                   '  while (scanf("%a", &x) == 1) printf("%a\\n", fg::reduce_2pi(x));\n  return 0;\n}\n')
    exe = tmp_path / "reduce"
    subprocess.run([*host_c.COMPILE, "-o", str(exe), str(src), "-lm"], check=True, capture_output=True)
    run = subprocess.run([str(exe)], input="\n".join(float(x).hex() for x in xs), check=True, capture_output=True,
                         text=True)
    reduced = np.array([float.fromhex(line) for line in run.stdout.split()])
    x64 = xs.astype(np.float64)
    assert len(reduced) == len(xs) and np.abs(reduced).max() < 200  # a few turns at most, which MUFU.COS takes
    for bound, tol in ((2.0**24, 3e-7), (2.0**31, 1e-5)):
        near = np.abs(x64) < bound
        for f in (np.cos, np.sin):
            err = np.abs(f(reduced[near]) - f(x64[near]))
            assert err.max() < tol, (f.__name__, bound, err.max(), x64[near][err.argmax()])


def test_simplify_keeps_the_value():
    pts = _points()
    for text in EXPRESSIONS:
        e = _expr(text)
        a = np.asarray(evaluate(e, pts), dtype=np.float64)
        b = np.asarray(evaluate(simplify(e), pts), dtype=np.float64)
        assert np.allclose(a, b, rtol=1e-12, equal_nan=True) or np.array_equal(a, b), text


def test_c_forms():
    env = _env()
    c = lambda t: compile_expr(_expr(t), env)
    assert c("where(k_idx <= q_idx + M - N, S, -inf)") == "kpos <= qpos + seqlen_k - seqlen_q ? s : -INFINITY"
    assert c("exp2(-8.0 * 1 / 4)") == "0.25f"  # folded
    assert c("q_idx // 4") == "qpos / 4"  # non-negative: plain C division
    assert "?" in c("(q_idx - k_idx) // 4")  # possibly negative: floor form
    assert c("relu(S)") == "s > 0.0f ? s : 0.0f"  # a select: cexpr says why
    assert c("S * H") == "s * (float)heads"
    assert c("q_idx < 3 and not (k_idx == 2)") == "qpos < 3 && !(kpos == 2)"
    fast = CEnv(names=env.names, fast_math=True)
    assert compile_expr(_expr("exp(S)"), fast) == "__expf(s)"
    assert float_literal(1 / 30) == "0.033333335f" and float_literal(-float("inf")) == "-INFINITY"


@pytest.mark.parametrize("text,needle", [
    ("atan(S)", "'atan'"),
    ("rowmax(S)", "rowmax"),
    ("S // 2", "integer"),
    ("q_idx // (k_idx - 3)", "positive"),
    ("S + undefined_thing", "undefined_thing"),
    ("(k_idx < 3) * S", "condition"),
])
def test_unsupported_names_the_construct(text, needle):
    with pytest.raises(CExprError) as info:
        compile_expr(_expr(text), _env())
    assert needle in str(info.value)
    assert info.value.line == 1


def test_poly_cancels_units():
    # S*scale*log2e with S = s/scale, divided by log2e -> s
    from flashgen.translators.cexpr import Poly

    s_poly = Poly({(("s", 1), ("scale", -1)): 1}, {"s": ast.Name(id="s"), "scale": ast.Name(id="scale")})
    p = to_poly(_expr("S * (scale * log2e)"), {"S": s_poly}).scale_by(1 / ast.CONSTANTS["log2e"])
    assert p.terms == {(("s", 1),): 1.0}
