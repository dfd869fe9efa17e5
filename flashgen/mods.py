"""Score and mask functions (FlexAttention's score_mod and mask_mod), written in the TL's expression language.

    flashgen generate --gpu a100 --score-mod "s + 0.25 * cos(k_idx)"
    flashgen generate --gpu h200 --causal --mask-mod "q_idx // DOC == k_idx // DOC" --param DOC=256

A score function is an expression over the score `s` (natural units: `scale * q.k`, softcapped when the variant has
a softcap, before the ALiBi bias and every mask), the query row and key position `q_idx`, `k_idx` (the TL's names:
absolute rows of Q and K, so the bottom-right alignment is `q_idx + M - N`), the batch and head indices `b`, `h`,
the sizes `B H N M D` and named scalar parameters (`--param NAME=VALUE`), whose values are written into the TL as
literals (compile-time constants). A mask function is a condition over the same names: a key is visible where it
holds (and where the variant's own mask lets it).

They become two TL lines in the expert's program (`apply`): the scale line goes to natural units and is followed by
`Compute S_r = (SCORE) * log2e` (softmax; the online softmax runs in log2 units) or `Compute S_r = SCORE`, and by
`Compute S_r = where(MASK, S_r, -inf)`. So the checker, the interpreter and every translator read them as any TL,
and the kernel's reference is its own TL's fp64 interpretation (LoopConfig.reference_tl, the manifest's
`reference_tl`).

Tile skipping: a mask of positions (q_idx, k_idx, b, h, the sizes, params, call-time tensors read at block-invariant
indices such as LEN[b]) gives the kernel a per-tile test (flashgen.translators.tiles: the mask's interval bounds over
the tile), and the key tiles it proves empty are neither loaded nor computed, on every path; a block left with none
writes O = 0 and LSE = -inf. The test is conservative: a tile is skipped only where no (row, key) of it can be
visible. For a mask of positions alone (no tensor) `tile_report` says, on the CPU, how many of the key tiles the
kernel's loop walks the mask leaves empty, how many of those the test skips, and that no tile holding a visible key
is skipped or left unwalked.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_serializer

from flashgen.abi import MAX_MOD_TENSORS, MOD_TENSOR_FORM, ModTensor
from flashgen.errors import FlashgenError, UsageError

#: the names an expression may read, besides --param names and the TL's constants (inf, log2e, ln2)
NAMES: dict[str, str] = {
    "s": "the score (scale * q.k)",
    "q_idx": "the query row",
    "k_idx": "the key position",
    "b": "the batch index",
    "h": "the head index",
    "B": "the batch size",
    "H": "the number of heads",
    "N": "the query length",
    "M": "the key length",
    "D": "the head dim",
}
#: names a parameter may not take (besides NAMES, the constants and the functions): the TL's other names and words
_RESERVED = {"and", "or", "not", "scale", "softcap", "window", "window_left", "window_right", "KVH", "KV_GROUP",
             "BLOCK_M", "BLOCK_N", "WARPS", "STAGES", "SPLITS", "alibi_slopes", "Q", "K", "V", "O", "LSE"}
#: a tensor's spec from Python (`tensors={NAME: SPEC}`): what follows NAME= in flashgen.abi.MOD_TENSOR_FORM
_TENSOR_FORM = "DTYPE[DIMS][:LO..HI][:sorted], e.g. int32[B]:0..M or int32[M]:0..3:sorted"
#: a kernel with score or mask functions is fast enough at this share of the visible-work TF/s of flashgen's own
#: kernel without them (the same variant, dtype and head dim, timed beside it): `flashgen generate` stops there,
#: and the mods benchmark (flashgen.harness.suite.bench_mods) holds its rows to it
FUNCTION_GOAL = 0.85
# the sizes an expression's sample evaluation runs at (_check_values) and a tensor's fill is tried at
_SAMPLE_SIZES = {"B": 2, "H": 4, "KVH": 4, "N": 37, "M": 53, "D": 64, "KV_GROUP": 1}
_PARAM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SCORE_TILE = "S_r"


class Mods(BaseModel):
    """A kernel's score and mask functions: the expressions in canonical TL form, and the parameters' values."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    score_mod: str | None = Field(default=None, description="an expression over s, q_idx, k_idx, b, h, the sizes "
                                  "and the params: the new score")
    mask_mod: str | None = Field(default=None, description="a condition over the same names: the key is visible "
                                 "where it holds")
    params: tuple[tuple[str, int | float], ...] = Field(default=(), description="(name, value), sorted by name")
    tensors: tuple[ModTensor, ...] = Field(default=(), description="the call-time tensors they read (`NAME[i]`), in "
                                           "declaration order: the kernel's mod_tensors slots")

    @model_serializer(mode="wrap")
    def _no_tensors_left_out(self, handler):  # functions without tensors dump (and hash: `tag`) as before
        data = handler(self)
        if isinstance(data, dict) and not data.get("tensors"):
            data.pop("tensors", None)
        return data

    @property
    def values(self) -> dict[str, int | float]:
        return dict(self.params)

    @property
    def tag(self) -> str:
        """A short name for folders: `mod` and 8 hex digits of the functions and values."""
        text = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return "mod" + hashlib.sha256(text.encode()).hexdigest()[:8]

    @property
    def mask_of_positions(self) -> bool:
        """A mask that does not read the score (so whole key tiles can be judged from positions alone)."""
        return self.mask_mod is not None and "s" not in _names(expression(self.mask_mod))

    def summary(self) -> str:
        """One line: what the functions are."""
        parts = []
        if self.score_mod is not None:
            parts.append(f"score {self.score_mod}")
        if self.mask_mod is not None:
            parts.append(f"mask {self.mask_mod}")
        if self.params:
            parts.append("with " + ", ".join(f"{k} = {_value_text(v)}" for k, v in self.params))
        if self.tensors:
            parts.append("tensors " + ", ".join(t.text for t in self.tensors))
        return "; ".join(parts)


# ------------------------------------------------------------------------------------------------ validation

def make_mods(score_mod: str | None = None, mask_mod: str | None = None, params: dict[str, Any] | None = None,
              tensors: dict[str, Any] | None = None, *, cli: bool = False) -> Mods | None:
    """Mods from a caller's expressions, params and call-time tensors, or None when none is given. A bad one raises
    UsageError, one line naming the option (`--score-mod` on the command line, `score_mod=` from Python): a syntax
    error (with its column), an unknown name, tensor or function, a mask that is not a condition, a score that is one,
    an operator on the wrong type (`//` on the score), NaN on finite scores, a parameter that is reserved, not a number,
    or unused; a tensor (`tensors={NAME: "int32[B]:0..M"}`, `--tensor NAME=int32[B]:0..M`) that is reserved, not of
    that form, indexed with the wrong number of indices, or unused."""
    # each option as the caller wrote it, ready to take its value: `--score-mod 's'`, `score_mod='s'`
    flag = ({"score": "--score-mod ", "mask": "--mask-mod ", "param": "--param ", "tensor": "--tensor "} if cli else
            {"score": "score_mod=", "mask": "mask_mod=", "param": "params ", "tensor": "tensors "})
    named = {k: v.strip().rstrip("=") for k, v in flag.items()}
    params = dict(params or {})
    if tensors is not None and not isinstance(tensors, dict):
        raise UsageError(f"{flag['tensor']}{tensors!r}: a dict of name -> {_TENSOR_FORM}")
    tensors = dict(tensors or {})
    if score_mod is None and mask_mod is None:
        if params or tensors:
            what, given = ("param", params) if params else ("tensor", tensors)
            raise UsageError(f"{flag[what]}{', '.join(map(str, given))}: {'parameters' if params else 'tensors'} "
                             f"need {named['score']} or {named['mask']}")
        return None
    values: dict[str, int | float] = {}
    for name, value in params.items():
        values[name] = _check_param(name, value, flag["param"])
    if len(tensors) > MAX_MOD_TENSORS:
        raise UsageError(f"{flag['tensor']}{', '.join(tensors)}: at most {MAX_MOD_TENSORS} tensors (a kernel's "
                         "call-time tensor slots)")
    specs: dict[str, ModTensor] = {}
    for name, spec in tensors.items():
        if name in values:
            raise UsageError(f"{flag['tensor']}{name}: also a parameter ({flag['param'].strip()} {name}); give "
                             "each name once")
        specs[name] = _check_tensor(name, spec, flag["tensor"])
    canonical: dict[str, str | None] = {"score": None, "mask": None}
    used: set[str] = set()
    for kind, text in (("score", score_mod), ("mask", mask_mod)):
        if text is None:
            continue
        expr = _parse_user(text, flag[kind])
        names = _names(expr)
        _check_names(expr, names, values, flag[kind], text, specs)
        _check_types(kind, expr, values, flag[kind], text, specs)
        _check_values(kind, expr, values, flag[kind], text, specs)
        used |= names | set(_tensors_read(expr))
        from flashgen.tl_spec.printer import format_expr

        canonical[kind] = format_expr(expr)
    unused = sorted(set(values) - used)
    users = " or ".join(named[k] for k in ("score", "mask") if canonical[k] is not None)
    if unused:
        raise UsageError(f"{flag['param']}{unused[0]}={_value_text(values[unused[0]])}: not used by {users}")
    idle = [name for name in specs if name not in used]
    if idle:
        raise UsageError(f"{flag['tensor']}{specs[idle[0]].text}: not used by {users} (read it as {idle[0]}[...])")
    return Mods(score_mod=canonical["score"], mask_mod=canonical["mask"], params=tuple(sorted(values.items())),
                tensors=tuple(specs.values()))


def parse_tensor_option(text: str) -> tuple[str, str]:
    """`--tensor NAME=SPEC` -> (NAME, SPEC); SPEC is checked by make_mods."""
    name, sep, spec = text.partition("=")
    name, spec = name.strip(), spec.strip()
    if not sep or not name or not spec:
        raise UsageError(f"--tensor {text!r}: expected {MOD_TENSOR_FORM}")
    return name, spec


def tensors_from_options(texts: list[str] | None) -> dict[str, str]:
    return _named_options(texts, parse_tensor_option, "--tensor")


def _check_tensor(name: Any, spec: Any, flag: str) -> ModTensor:
    """One call-time tensor: its name (as a parameter's) and its spec, DTYPE[DIMS][:LO..HI][:sorted] (ModTensor.parse),
    with bounds that are TL expressions over the sizes and a fill that is not empty at sample sizes."""
    from flashgen.tl_spec.tensors import fill_all

    _check_name(name, f"{flag}{name!r}" if not isinstance(name, str) else f"{flag}{name}", "tensor")
    given = f"{flag}{name}={spec}"
    if isinstance(spec, ModTensor):
        spec = spec.text.partition("=")[2]
    try:
        parsed = ModTensor.parse(f"{name}={spec}" if isinstance(spec, str) else None)
        tensor = parsed.model_copy(update={"low": _canonical_bound(parsed.low), "high": _canonical_bound(parsed.high)})
        fill_all([tensor], _SAMPLE_SIZES, 0)
    except ValueError as exc:
        message = " ".join(str(exc).split()).removeprefix(f"{name}: ")
        raise UsageError(f"{given}: {message}") from None
    return tensor


def _canonical_bound(text: str) -> str:
    """A fill bound in the TL's canonical form (ValueError when it is not an expression)."""
    from flashgen.tl_spec.diagnostics import TLSyntaxError
    from flashgen.tl_spec.printer import format_expr

    try:
        return format_expr(expression(text))
    except TLSyntaxError as exc:
        raise ValueError(f"fill bound {text!r}: {exc.diagnostics[0].message}") from None


def parse_param_option(text: str) -> tuple[str, int | float]:
    """`--param NAME=VALUE` -> (NAME, VALUE): an int when VALUE is written as one, else a float."""
    name, sep, value = text.partition("=")
    name, value = name.strip(), value.strip()
    if not sep or not name or not value:
        raise UsageError(f"--param {text!r}: expected NAME=VALUE, e.g. --param DOC=256")
    try:
        number: int | float = int(value) if re.fullmatch(r"[-+]?[0-9]+", value) else float(value)
    except ValueError:
        raise UsageError(f"--param {text}: {value!r} is not a number") from None
    return name, number


def params_from_options(texts: list[str] | None) -> dict[str, int | float]:
    return _named_options(texts, parse_param_option, "--param")


def _named_options(texts: list[str] | None, parse, flag: str) -> dict:
    """A repeated NAME=... option's values by name, each name once."""
    out: dict = {}
    for text in texts or []:
        name, value = parse(text)
        if name in out:
            raise UsageError(f"{flag} {name}: given twice")
        out[name] = value
    return out


def _check_name(name: Any, given: str, what: str) -> None:
    from flashgen.operators import FUNCTIONS
    from flashgen.tl_spec.ast import CONSTANTS

    if not isinstance(name, str) or not _PARAM_NAME.fullmatch(name):
        raise UsageError(f"{given}: a {what}'s name is a TL name (letters, digits, _; not first a digit)")
    if name in NAMES or name in CONSTANTS or name in FUNCTIONS or name in _RESERVED or name in _keywords():
        raise UsageError(f"{given}: a name the expressions already have (reserved: "
                         f"{', '.join([*NAMES, *CONSTANTS])}, the functions, the TL's keywords, sizes and params)")


def _check_param(name: Any, value: Any, flag: str) -> int | float:
    if not isinstance(name, str) or not _PARAM_NAME.fullmatch(name):
        raise UsageError(f"{flag}{name!r}: a parameter's name is a TL name (letters, digits, _; not first a digit)")
    _check_name(name, f"{flag}{name}", "parameter")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"{flag}{name}={value!r}: a parameter is a number (int or float)")
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"{flag}{name}={value!r}: must be finite")
    if isinstance(value, int) and not -(2 ** 31) <= value < 2 ** 31:
        raise UsageError(f"{flag}{name}={value}: does not fit in 32 bits")
    return value


def _keywords() -> set[str]:
    """The words of the TL's grammar (`end`, `sum`, `shape`, ...): not names in an expression."""
    from flashgen.tl_spec.parser import GRAMMAR

    return set(re.findall(r'"([A-Za-z_][A-Za-z0-9_]*)"', GRAMMAR))


def _parse_user(text: Any, flag: str):
    from flashgen.tl_spec.diagnostics import TLSyntaxError

    if not isinstance(text, str) or not text.strip():
        raise UsageError(f"{flag}{text!r}: empty: give an expression (docs/variants.md)")
    if "#" in text or "\n" in text or "\r" in text:
        raise UsageError(f"{flag}{text!r}: one expression on one line, without '#'")
    try:
        return expression(text)
    except TLSyntaxError as exc:
        d = exc.diagnostics[0]
        column = max(1, d.col - len(_PREFIX))
        raise UsageError(f"{flag}{text!r}: syntax error at column {column}: {d.message}") from None


_PREFIX = "Compute X = "


def expression(text: str):
    """The TL expression of `text` (flashgen.tl_spec.ast); TLSyntaxError when it is none."""
    from flashgen.tl_spec import ast
    from flashgen.tl_spec.diagnostics import Diagnostic, TLSyntaxError
    from flashgen.tl_spec.parser import parse

    program = parse(f"Target sm_80 dtype fp16 head_dim 64\n{_PREFIX}{text}", "<expression>")
    stmts = [s for s in program.body if not isinstance(s, ast.Comment)]
    if len(stmts) != 1 or not isinstance(stmts[0], ast.ComputeAssign):
        raise TLSyntaxError([Diagnostic(file="<expression>", line=2, col=len(_PREFIX) + 1,
                                        message="not one expression")])
    return stmts[0].expr


def _names(expr) -> set[str]:
    from flashgen.tl_spec import ast

    return set(ast.expr_names(expr))


def _tensors_read(expr) -> list[str]:
    from flashgen.tl_spec import ast

    return ast.tensors_read(expr)


def _check_names(expr, names: set[str], values: dict[str, Any], flag: str, text: str,
                 tensors: dict[str, ModTensor] | None = None) -> None:
    from flashgen.operators import FUNCTIONS
    from flashgen.tl_spec import ast

    tensors = tensors or {}
    functions = [name for name, f in FUNCTIONS.items() if not f.reduction]
    for node in ast.walk_expr(expr):
        if isinstance(node, ast.Call) and node.func not in functions:
            raise UsageError(f"{flag}{text!r}: unknown function '{node.func}' (functions: {', '.join(functions)})")
        if isinstance(node, ast.Subscript):
            name = node.tensor
            if name not in tensors:
                what = "a parameter (a number), not a tensor" if name in values else "an unknown tensor"
                raise UsageError(f"{flag}{text!r}: '{name}' is {what} (a tensor of your own is declared with "
                                 f"--tensor {name}=int32[B]:0..M, tensors={{{name!r}: 'int32[B]:0..M'}})")
            if len(node.indices) != len(tensors[name].shape):
                raise UsageError(f"{flag}{text!r}: {name}[...] takes {len(tensors[name].shape)} "
                                 f"{'index' if len(tensors[name].shape) == 1 else 'indices'} ({tensors[name].text}), "
                                 f"got {len(node.indices)}")
    known = set(NAMES) | set(ast.CONSTANTS) | set(values)
    for name in ast.expr_names(expr):
        if name in tensors:
            raise UsageError(f"{flag}{text!r}: '{name}' is a tensor: read an element, "
                             f"{name}[{', '.join(['i'] * len(tensors[name].shape))}]")
        if name not in known:
            extra = f"; parameters: {', '.join(values)}" if values else ""
            extra += f"; tensors: {', '.join(tensors)}" if tensors else ""
            raise UsageError(f"{flag}{text!r}: unknown name '{name}' (names: {', '.join(NAMES)}, "
                             f"{', '.join(ast.CONSTANTS)}{extra}; a constant of your own is a parameter: "
                             f"--param {name}=VALUE, params={{{name!r}: VALUE}})")


def _c_env(values: dict[str, Any], tensors: dict[str, ModTensor] | None = None):
    from flashgen.translators.cexpr import CEnv, NameInfo, TensorInfo

    pos: dict[str, Any] = {"ctype": "int", "nonneg": True}
    names = {"s": NameInfo("s", "float"), "q_idx": NameInfo("qpos", **pos), "k_idx": NameInfo("kpos", **pos),
             "b": NameInfo("b", **pos), "h": NameInfo("head", **pos)}
    names.update({n: NameInfo(n.lower(), positive=True) for n in ("B", "H", "N", "M", "D")})
    for name, value in values.items():
        names[name] = NameInfo(value=value, ctype="int" if isinstance(value, int) else "float", nonneg=value >= 0,
                               positive=value > 0)
    cells = {name: TensorInfo("int" if t.dtype == "int32" else "float", tuple(str(d) for d in t.shape),
                              lambda idx, name=name: f"{name}[{']['.join(idx)}]") for name, t in (tensors or {}).items()}
    return CEnv(names=names, tensors=cells, translator="CUDA")


def _check_types(kind: str, expr, values: dict[str, Any], flag: str, text: str,
                 tensors: dict[str, ModTensor] | None = None) -> None:
    """What the translators will make of it (their C-expression compiler, flashgen.translators.cexpr)."""
    from flashgen.translators.cexpr import CExprError, infer_ctype

    try:
        ctype = infer_ctype(expr, _c_env(values, tensors))
    except CExprError as exc:
        raise UsageError(f"{flag}{text!r}: {exc.message}") from None
    if kind == "mask" and ctype != "bool":
        raise UsageError(f"{flag}{text!r}: a number, not a condition: a mask is a comparison (== != < <= > >=), "
                         "combined with and, or, not")
    if kind == "score" and ctype == "bool":
        raise UsageError(f"{flag}{text!r}: a condition, not a score: a score function gives a number (a mask "
                         "is a mask function, or write where(COND, s, -inf))")


def _check_values(kind: str, expr, values: dict[str, Any], flag: str, text: str,
                  tensors: dict[str, ModTensor] | None = None) -> None:
    """The expression on sample positions, finite scores and filled tensors: a score that is NaN or +inf there (sqrt
    of a negative score, 0/0) would make every kernel's output NaN; said now rather than by the CPU check."""
    import numpy as np

    from flashgen.tl_spec.tensors import fill_all
    from flashgen.translators.cexpr import evaluate

    rng = np.random.default_rng(0)
    n, m = _SAMPLE_SIZES["N"], _SAMPLE_SIZES["M"]
    q, k = np.meshgrid(np.arange(n), np.arange(m), indexing="ij")
    cells = fill_all(list((tensors or {}).values()), _SAMPLE_SIZES, 0)
    sample = {"s": rng.standard_normal((n, m)) * 3, "q_idx": q, "k_idx": k, "b": 1, "h": 1, "B": 2, "H": 4, "N": n,
              "M": m, "D": 64, **values, **cells}
    with np.errstate(all="ignore"):
        try:
            got = np.broadcast_to(np.asarray(evaluate(expr, sample)), (n, m))
        except (ArithmeticError, ValueError, TypeError) as exc:
            raise UsageError(f"{flag}{text!r}: cannot be evaluated ({exc})") from None
    if kind == "score":
        bad = np.isnan(got) | (np.isposinf(got))
        if bad.any():
            i, j = (int(x[0]) for x in np.nonzero(bad))
            raise UsageError(f"{flag}{text!r}: gives {got[i, j]} at q_idx={i}, k_idx={j} for the finite score "
                             f"s={sample['s'][i, j]:.3g}: every kernel's output would be NaN")


def _value_text(value: int | float) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))


# ------------------------------------------------------------------------------------------------ into the TL

def tl_expression(text: str, mods: Mods, score: str = _SCORE_TILE):
    """The TL expression of one of `mods`' functions for a program: `s` is the score tile `score`, each parameter
    its value (a literal)."""
    from flashgen.tl_spec import ast

    mapping: dict[str, Any] = {"s": ast.Name(id=score)}
    for name, value in mods.params:
        number = ast.Num(value=abs(value) if value < 0 else value)
        mapping[name] = ast.Unary(op="-", operand=number) if value < 0 else number
    return ast.substitute(expression(text), mapping)


def apply(tl_text: str, mods: Mods, variant) -> str:
    """`tl_text` (a library program, full or sketch, for `variant`) with the functions in it: its scale line in
    natural units, then the score function (times log2e for softmax, whose scores are in log2 units) and the mask,
    each after a comment saying it; canonical form. Raises FlashgenError when the program has no scale line where
    the library puts it (the first Compute on the score tile after Q K^T)."""
    from flashgen.tl_spec import ast
    from flashgen.tl_spec.parser import parse
    from flashgen.tl_spec.printer import format_program
    from flashgen.variant import Norm

    program = parse(tl_text, "<library>")
    found = _scale_line(program.body)
    if found is None:
        raise FlashgenError("the program has no scale line after Q K^T to put the score and mask functions after")
    body, index = found
    scale_stmt = body[index]
    score = scale_stmt.target
    softmax = variant.norm is Norm.softmax
    S, scale = ast.Name(id=score), ast.Name(id="scale")
    new: list[Any] = []
    if mods.score_mod is not None:
        if variant.softcap is not None:  # natural units: softcap * tanh(S * (scale / softcap))
            softcap = ast.Name(id="softcap")
            natural = ast.Binary(op="*", left=softcap, right=ast.Call(func="tanh", args=[ast.Binary(
                op="*", left=S, right=ast.Binary(op="/", left=scale, right=softcap))]))
        else:
            natural = ast.Binary(op="*", left=S, right=scale)
        body[index] = ast.ComputeAssign(target=score, expr=natural, loc=scale_stmt.loc)
        value = tl_expression(mods.score_mod, mods, score)
        if softmax:  # back to the log2 units the online softmax works in
            value = ast.Binary(op="*", left=value, right=ast.Name(id="log2e"))
        what = "scaled and softcapped" if variant.softcap is not None else "scaled"
        new += [ast.Comment(text=f"score function: s -> {mods.score_mod}{_with(mods, mods.score_mod)} (s: the "
                                 f"{what} score, natural units)"),
                ast.ComputeAssign(target=score, expr=value)]
    if mods.mask_mod is not None:
        cond = tl_expression(mods.mask_mod, mods, score)
        neg_inf = ast.Unary(op="-", operand=ast.Name(id="inf"))
        new += [ast.Comment(text=f"mask function: a key is visible where {mods.mask_mod}{_with(mods, mods.mask_mod)}"),
                ast.ComputeAssign(target=score, expr=ast.Call(func="where", args=[cond, S, neg_inf]))]
    body[index + 1:index + 1] = new
    _declare_tensors(program, mods)
    return format_program(program)


def _declare_tensors(program, mods: Mods) -> None:
    """The `Tensor` lines of the functions' call-time tensors: after the global Allocates (a sketch: first)."""
    from flashgen.tl_spec import ast

    if not mods.tensors:
        return
    lines: list[Any] = [ast.Comment(text="call-time tensors of the score/mask functions (the caller passes them)")]
    lines += [_tensor_decl(t) for t in mods.tensors]
    body = program.body
    at = max((i + 1 for i, s in enumerate(body) if isinstance(s, ast.Allocate)), default=None)
    if at is None:
        at = next((i for i, s in enumerate(body) if not isinstance(s, ast.Comment)), len(body))
    body[at:at] = lines


def _with(mods: Mods, text: str) -> str:
    used = _names(expression(text))
    shown = [f"{k} = {_value_text(v)}" for k, v in mods.params if k in used]
    return f", with {', '.join(shown)}" if shown else ""


def _scale_line(stmts: list[Any]) -> tuple[list[Any], int] | None:
    """(the statement list, the index) of the first Compute on a GEMM's result right after the GEMM that makes it
    (`Compute GEMM Q, K^T and get S`), searched depth first."""
    from flashgen.tl_spec import ast

    for i, stmt in enumerate(stmts):
        if isinstance(stmt, ast.ComputeGemm) and not stmt.accumulate:
            for j in range(i + 1, len(stmts)):
                nxt = stmts[j]
                if isinstance(nxt, ast.ComputeAssign) and nxt.target == stmt.out:
                    return stmts, j
                if not isinstance(nxt, (ast.Comment, ast.Release, ast.Wait)):
                    break
        body = getattr(stmt, "body", None)
        if isinstance(body, list) and (found := _scale_line(body)) is not None:
            return found
    return None


def prompt_lines(mods: Mods, variant) -> list[str]:
    """What a model is told of the functions (the task's semantics; no package names)."""
    from flashgen.variant import Norm

    lines = []
    where = "after scaling" + (" and the softcap" if variant.softcap is not None else "") + (
        ", before the ALiBi bias" if variant.alibi else "") + " and before every mask"
    softmax = variant.norm is Norm.softmax
    if mods.score_mod is not None:
        lines.append(f"- Score function: s is replaced by `{mods.score_mod}`, {where}; s is the scaled score in "
                     "natural units, q_idx the query row and k_idx the key position (rows of Q and K: the bottom-right "
                     "alignment is q_idx + M - N), b and h the batch and head index. In LLM-TL: "
                     + ("`Compute S_r = S_r * scale` then `Compute S_r = (SCORE) * log2e`, SCORE with S_r for s (the "
                        "online softmax works on log2 units)" if softmax else "`Compute S_r = SCORE` after the scale "
                                                                              "line, SCORE with S_r for s") + ".")
    if mods.mask_mod is not None:
        lines.append(f"- Mask function: key k_idx is visible to row q_idx only where `{mods.mask_mod}` holds (and "
                     "where the variant's own mask lets it); a row that sees no key returns O = 0 (LSE = -inf). In LLM-TL: "
                     "`Compute S_r = where(MASK, S_r, -inf)` after the score function.")
    if mods.params:
        lines.append("- Its constants: " + ", ".join(f"{k} = {_value_text(v)}" for k, v in mods.params)
                     + " (write their values as numbers).")
    if mods.tensors:
        decls = "; ".join(f"`{_tensor_line(t)}`" for t in mods.tensors)
        lines.append(f"- Its tensors, given by the caller at each call: {', '.join(t.text for t in mods.tensors)}. In "
                     f"LLM-TL each is declared at program level, beside the global Allocates ({decls}) and read "
                     "in a Compute as NAME[i, ...], one integer index per dim (clamped into the dim).")
    lines.append("- The fp64 reference of this task computes exactly that (its own LLM-TL program, interpreted).")
    return lines


def _tensor_decl(t: ModTensor):
    """The TL's `Tensor` line of a call-time tensor."""
    from flashgen.tl_spec import ast

    dims = [ast.Num(value=d) if isinstance(d, int) else ast.Name(id=d) for d in t.shape]
    return ast.TensorDecl(name=t.name, shape=dims, dtype=t.dtype, low=expression(t.low), high=expression(t.high),
                          sorted=t.sorted)


def _tensor_line(t: ModTensor) -> str:
    from flashgen.tl_spec.printer import format_statement

    return format_statement(_tensor_decl(t))[0]


# ------------------------------------------------------------------------------------------------ the tiles

def tile_report(mods: Mods, tl_text: str, *, n: int = 2048, m: int = 2048) -> dict[str, Any] | None:
    """For a mask of positions alone, on the CPU: every (query tile, key tile) of the program at N=n, M=m judged
    element by element (numpy over the variant's visibility and the mask) and compared with the tiles the program's
    key loop visits (its bounds evaluated per query tile, as the kernel evaluates them) and with the tiles of those
    the kernel's tile test skips (the mask's interval bounds, flashgen.translators.tiles, by the rules of its C).
    Returns the counts (`tiles`, `visited`, `visited_empty`: visited tiles the mask leaves without a visible key;
    `skipped`: visited tiles the kernel skips, all of them empty; `computed_empty`: the empty visited tiles the
    conservative test leaves, computed and masked; `missed`: tiles with a visible key that the loop does not visit
    or the test skips, which must be 0) or None when the mask reads the score or a call-time tensor, or the
    program's loop bounds cannot be evaluated. B and H are 2 when the mask reads b or h, else 1."""
    import numpy as np

    from flashgen.reference import visible_mask
    from flashgen.tl_spec.parser import parse
    from flashgen.translators import tiles as tile_tests

    if not mods.mask_of_positions or _tensors_read(expression(mods.mask_mod)):
        return None  # a mask reading the score, or call-time tensors: its tiles depend on the call's values
    program = parse(tl_text, "<kernel.tl>")
    if program.variant is None or program.target is None:
        return None
    bm, bn = program.params.get("BLOCK_M"), program.params.get("BLOCK_N")
    if not bm or not bn:
        return None
    uses = _names(expression(mods.mask_mod))
    batch = heads = 2 if uses & {"b", "h"} else 1
    group = program.variant.kv_group
    heads *= group
    sizes = {"B": batch, "H": heads, "KVH": heads // group, "N": n, "M": m, "D": program.target.head_dim,
             "KV_GROUP": group, **program.params}
    for name in ("softcap", "window", "window_left", "window_right"):
        if getattr(program.variant, name, None) is not None:
            sizes[name] = getattr(program.variant, name)
    visited = _visited_tiles(program, sizes)
    if visited is None:
        return None
    m_tiles, n_tiles = -(-n // bm), -(-m // bn)
    base = visible_mask(n, m, program.variant)
    q, k = np.meshgrid(np.arange(n), np.arange(m), indexing="ij")
    counts = {"tiles": 0, "visited": 0, "visited_empty": 0, "skipped": 0, "computed_empty": 0, "missed": 0}
    cond = tl_expression(mods.mask_mod, mods)
    test = tile_tests.analyse(cond, lambda e: _tile_leaf(e, sizes))
    mt_grid, nt_grid = np.meshgrid(np.arange(m_tiles), np.arange(n_tiles), indexing="ij")
    for b in range(batch):
        for h in range(heads):
            mask = _mask_grid(cond, {**sizes, "q_idx": q, "k_idx": k, "b": b, "h": h}, n, m)
            seen = np.zeros((m_tiles * bm, n_tiles * bn), dtype=bool)
            seen[:n, :m] = base & mask
            occupied = seen.reshape(m_tiles, bm, n_tiles, bn).any(axis=(1, 3))
            walked = np.zeros((m_tiles, n_tiles), dtype=bool)
            for (bb, hh, mt), tiles in visited.items():
                if bb == b and hh == h and 0 <= mt < m_tiles:
                    walked[mt, [t for t in tiles if 0 <= t < n_tiles]] = True
            may_hold, _ = test.evaluate(tile_tests.tile_env(mt_grid, nt_grid, bm, bn, n, m,
                                                            {**sizes, "b": b, "h": h}))
            skipped = walked & ~np.broadcast_to(may_hold, walked.shape)
            counts["tiles"] += m_tiles * n_tiles
            counts["visited"] += int(walked.sum())
            counts["visited_empty"] += int((walked & ~occupied).sum())
            counts["skipped"] += int(skipped.sum())
            counts["computed_empty"] += int((walked & ~skipped & ~occupied).sum())
            counts["missed"] += int(((~walked | skipped) & occupied).sum())
    return {"shape": f"B={batch},H={heads},N={n},M={m}", "block": [bm, bn], **counts,
            "note": "the kernel skips the visited tiles its per-tile test of the mask proves empty (skipped: neither "
                    "loaded nor computed); computed_empty tiles are empty too but not provably so by the test's "
                    "interval bounds: computed, masked, giving nothing"}


def _mask_grid(cond, values: dict[str, Any], n: int, m: int):
    """The mask's (n, m) booleans in numpy (the interpreter's evaluation) over `values` (positions, sizes, b, h)."""
    import numpy as np

    from flashgen.translators.cexpr import evaluate

    with np.errstate(all="ignore"):
        return np.broadcast_to(np.asarray(evaluate(cond, values), dtype=bool), (n, m))


def visible_pairs(mods: Mods, variant, n: int, m: int, *, batch: int = 1, heads: int = 1,
                  head_dim: int | None = None, tensors: dict[str, Any] | None = None) -> int | None:
    """The (query, key) pairs a mask of positions and the variant's own mask leave visible at N=n, M=m, summed over
    `batch` x `heads` (b, h): the work a kernel with the mask must do (flashgen.harness.bench's visible-work TF/s).
    Without a mask function, the variant's own pairs. A mask that reads call-time tensors counts with `tensors` (name
    -> the values the call passes, e.g. flashgen.tl_spec.tensors.fill_all's); None for one that reads the score, or
    reads a tensor not given, or D without `head_dim`."""
    import numpy as np

    from flashgen.reference import visible_mask

    base = visible_mask(n, m, variant)
    if mods.mask_mod is None:
        return int(base.sum()) * batch * heads
    read = _tensors_read(expression(mods.mask_mod))
    if not mods.mask_of_positions or not set(read) <= set(tensors or {}):
        return None
    q, k = np.meshgrid(np.arange(n), np.arange(m), indexing="ij")
    cond = tl_expression(mods.mask_mod, mods)
    sizes = {"B": batch, "H": heads, "N": n, "M": m, **({"D": head_dim} if head_dim is not None else {})}
    sizes |= {name: np.asarray(tensors[name]) for name in read}
    uses = _names(expression(mods.mask_mod))
    if "D" in uses and head_dim is None:
        return None
    per = [(b, h) for b in range(batch if "b" in uses else 1) for h in range(heads if "h" in uses else 1)]
    total = sum(int((base & _mask_grid(cond, {**sizes, "q_idx": q, "k_idx": k, "b": b, "h": h}, n, m)).sum())
                for b, h in per)
    return total * (batch * heads // len(per))


def visible_share(mods: Mods, variant, call_tensors, shape, seed: int) -> float | None:
    """The share of a call's (query, key) pairs at `shape` that the mask function and the variant's mask leave, with
    the call-time tensors (`call_tensors`: the manifest's ModTensors) filled from `seed` by their rules, as a timing
    run fills them (flashgen.harness.bench); None where visible_pairs cannot count it."""
    from flashgen.tl_spec.tensors import fill_all, sizes_of

    tensors = fill_all(call_tensors, sizes_of(shape), seed)
    pairs = visible_pairs(mods, variant, shape.N, shape.M, batch=shape.B, heads=shape.H, head_dim=shape.D,
                          tensors=tensors)
    return None if pairs is None else pairs / (shape.B * shape.H * shape.N * shape.M)


def _tile_leaf(e, sizes: dict[str, Any]):
    """A name of a mask as tile_report's tile test reads it (flashgen.translators.tiles.Leaf): a size, b, h."""
    from flashgen.tl_spec import ast
    from flashgen.translators.tiles import Leaf

    if not isinstance(e, ast.Name) or not (e.id in ("b", "h") or isinstance(sizes.get(e.id), int)):
        return None
    return Leaf(c=e.id, expr=e, positive=e.id in NAMES and e.id not in ("b", "h"), nonneg=True)


def _visited_tiles(program, sizes: dict[str, Any]) -> dict[tuple[int, int, int], set[int]] | None:
    """(b, h, query tile) -> the key tiles the program's key loop walks, from its own loop bounds and Lets."""
    from flashgen.tl_spec import ast
    from flashgen.translators.cexpr import evaluate

    kernel = next((s for s in program.body if isinstance(s, ast.Kernel) and _has_qk_gemm(s.body)), None)
    if kernel is None:
        return None
    out: dict[tuple[int, int, int], set[int]] = {}
    grid: dict[str, str] = {}

    def value(expr, env):
        v = evaluate(expr, env)
        return int(v.item() if hasattr(v, "item") else v)

    def walk(stmts, env) -> None:
        env = dict(env)
        for st in stmts:
            if isinstance(st, ast.Let):
                env[st.name] = value(st.value, env)
            elif isinstance(st, ast.ForLoop) and st.parallel:
                names = _names(st.stop)
                role = "b" if names == {"B"} else "h" if names == {"H"} else "m" if "N" in names else "other"
                grid[role] = st.var
                for i in range(value(st.start, env), value(st.stop, env)):
                    walk(st.body, {**env, st.var: i})
            elif isinstance(st, ast.ForLoop):
                if _has_qk_gemm(st.body):
                    key = (env.get(grid.get("b", ""), 0), env.get(grid.get("h", ""), 0), env.get(grid.get("m", ""), 0))
                    out.setdefault(key, set()).update(range(value(st.start, env), value(st.stop, env)))
            elif isinstance(st, ast.Role) and st.role == "consumer":  # the producer walks the same tiles
                walk(st.body, env)

    try:
        walk(kernel.body, sizes)
    except (KeyError, TypeError, ValueError, ArithmeticError):
        return None
    return out


def _has_qk_gemm(stmts: list[Any]) -> bool:
    from flashgen.tl_spec import ast

    for st in stmts:
        if isinstance(st, ast.ComputeGemm) and not st.accumulate:
            return True
        body = getattr(st, "body", None)
        if isinstance(body, list) and _has_qk_gemm(body):
            return True
    return False


# ------------------------------------------------------------------------------------------------ a run's reference

def reference_program(mods: Mods, variant, target, dtype, head_dim: int, env, head_dim_v: int | None = None) -> str:
    """The program the expert writes first for this task, with the functions: the run's fp64 reference
    (LoopConfig.reference_tl). Checked for `target` and translated here, so that an expression the checker or the
    translators refuse is one line (UsageError) before any model call."""
    from flashgen.tl_spec.diagnostics import errors_only
    from flashgen.translators.params import choose_params

    dims = {"head_dim_v": head_dim_v} if head_dim_v is not None else {}  # V's own head dim, where it has one
    params = dict(choose_params(variant, target, dtype, head_dim, **dims))
    text = env.library_tl(variant, target, dtype, head_dim, form="full", params=params, mods=mods, **dims)
    from flashgen.tl_spec.checker import check

    errors = errors_only(check(env.parse(text, "kernel.tl"), target))
    if errors:
        raise UsageError(f"the score/mask functions ({mods.summary()}): the TL checker refuses the program they make: "
                         f"{errors[0]}")
    try:
        env.translate(text, target)
    except FlashgenError as exc:
        raise UsageError(f"the score/mask functions ({mods.summary()}): the {target.arch} translator refuses them: "
                         f"{' '.join(str(exc).split())}") from None
    return text


def announce(mods: Mods, tl_text: str, progress) -> dict[str, Any] | None:
    """Say what the run computes, and for a mask of positions alone what its tiles are (`tile_report`)."""
    progress(f"score/mask functions: {mods.summary()}; the kernel's fp64 reference is its own TL's interpretation")
    report = tile_report(mods, tl_text)
    if report is not None:
        share = report["visited_empty"] / report["visited"] if report["visited"] else 0.0
        progress(f"the mask leaves {report['visited_empty']} of the {report['visited']} key tiles the kernel walks at "
                 f"{report['shape']} (tiles {report['block'][0]}x{report['block'][1]}) without a visible key "
                 f"({share:.0%}); the kernel skips {report['skipped']} of them (its per-tile test of the mask) and "
                 f"computes and masks {report['computed_empty']}")
    return report
