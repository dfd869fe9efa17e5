"""The TL library: full and sketch LLM-TL programs for each variant, rendered from one jinja2 template.

`render(variant, dtype=..., arch=..., params=..., form=...)` renders any variant (on an arch whose tensor
cores do not take the dtype, bf16/fp32 on sm_75, Q/K/V are loaded `as scaled fp16`); the named programs in
`PROGRAMS` are also committed as files (`<name>.full.tl`, `<name>.sketch.tl`) so that a model, a
reviewer or the translator's tests can read them. `python -m flashgen.tl_spec.library` (or
`flashgen tl library --write`) re-renders the files; a test asserts that they equal the rendering.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

import jinja2

from flashgen.errors import UsageError
from flashgen.variant import DType, Norm, Variant

LIBRARY_DIR = Path(__file__).parent
TEMPLATE_DIR = LIBRARY_DIR / "templates"

Form = Literal["full", "sketch"]

#: default tile parameters of the committed programs (sm_80, fp16, head dim 64)
DEFAULT_PARAMS: dict[str, int] = {"BLOCK_M": 64, "BLOCK_N": 64, "WARPS": 4, "STAGES": 2}
DECODE_PARAMS: dict[str, int] = {"BLOCK_M": 16, "BLOCK_N": 64, "WARPS": 1, "STAGES": 2, "SPLITS": 4}
#: the Hopper dataflow's defaults (sm_90): two consumer warpgroups of 64 query rows, a ring of two K/V stages
HOPPER_PARAMS: dict[str, int] = {"BLOCK_M": 128, "BLOCK_N": 128, "WARPS": 8, "STAGES": 2}
DEFAULT_HEAD_DIM = 64

#: the committed programs: name -> variant
PROGRAMS: dict[str, Variant] = {
    "plain": Variant(return_lse=True),
    "causal": Variant(causal=True, return_lse=True),
    "window": Variant(causal=True, window=100, return_lse=True),
    "alibi": Variant(alibi=True, return_lse=True),
    "softcap": Variant(softcap=30.0, return_lse=True),
    "gqa": Variant(kv_group=2, return_lse=True),
    "mqa": Variant(kv_group=4, return_lse=True),
    "relu": Variant(norm=Norm.relu),
    "sigmoid": Variant(norm=Norm.sigmoid),
    "decode_splitkv": Variant(split_kv=True, return_lse=True),
}


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATE_DIR), undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True, autoescape=False)


def default_params(variant: Variant) -> dict[str, int]:
    return dict(DECODE_PARAMS if variant.split_kv else DEFAULT_PARAMS)


def render(variant: Variant, *, dtype: DType | str = DType.fp16, arch: str = "sm_80",
           params: dict[str, int] | None = None, form: Form = "full", head_dim: int = DEFAULT_HEAD_DIM,
           name: str | None = None, explicit_softmax: bool = False, roles: bool | None = None,
           head_dim_v: int | None = None, size_params: list | None = None) -> str:
    """LLM-TL text computing `variant`, in canonical form (parsed and re-printed).

    `params` must hold BLOCK_M and BLOCK_N (split-KV also SPLITS, 4 when absent); other entries (WARPS,
    STAGES, ...) are carried into the Params line. `explicit_softmax` writes the online softmax as explicit steps
    instead of the OnlineSoftmax composite. `roles`: the Hopper dataflow (Role blocks, staged async copies,
    docs/llm-tl.md); by default where the arch's warp-specialized kernel takes the dtype and variant
    (flashgen.targets.writes_role_dataflow: sm_90 fp16/bf16 without split-KV), else the plain form. `head_dim_v`:
    V's and O's own head dim (the Target line's `head_dim_v`, V and O declared over DV); None, or `head_dim`
    itself, writes the program of one head dim. `size_params` (flashgen.tl_spec.ast.SizeParams): tiles for ranges of
    sizes, written as `Params when` lines after the Params line (full form only)."""
    from flashgen.targets import ROLE_DATAFLOW, role_dataflow, tensor_cores_take, writes_role_dataflow
    from flashgen.tl_spec.parser import parse
    from flashgen.tl_spec.printer import format_program, format_variant

    if form not in ("full", "sketch"):
        raise UsageError(f"unknown TL form {form!r}: expected 'full' or 'sketch'")
    dtype = DType(dtype)
    hopper = writes_role_dataflow(arch, dtype, variant.split_kv) if roles is None else roles
    params = (dict(HOPPER_PARAMS) if hopper else default_params(variant)) if params is None else dict(params)
    if variant.split_kv:
        params.setdefault("SPLITS", DECODE_PARAMS["SPLITS"])
    needed = {"BLOCK_M", "BLOCK_N"}
    if missing := sorted(needed - set(params)):
        raise UsageError(f"params lack {', '.join(missing)} (needed by the {variant.name} template)")
    softmax = variant.norm is Norm.softmax
    flow = role_dataflow(arch)
    if hopper and (flow is None or variant.split_kv):
        raise UsageError(f"the Hopper dataflow (Role blocks) is written for {', '.join(ROLE_DATAFLOW)} without "
                         f"split-KV; not for {arch}{' split-KV' if variant.split_kv else ''}")
    text = _env().get_template("attention.tl.j2").render(
        v=variant, dtype=dtype.value, arch=arch, head_dim=head_dim, params=params, full=form == "full",
        head_dim_v=None if head_dim_v == head_dim else head_dim_v,
        dv="D" if head_dim_v in (None, head_dim) else "DV",
        kv="h // KV_GROUP" if variant.kv_group > 1 else "h", lse=variant.return_lse, softmax=softmax,
        variant_line=format_variant(variant), name=name or variant.name, explicit_softmax=explicit_softmax,
        scaled=not tensor_cores_take(arch, dtype), hopper=hopper, producer_warps=flow.producer_warps if flow else 0)
    program = parse(text, filename=f"<{name or variant.name}.{form}.tl>")
    if size_params and form == "full":
        program.size_params = list(size_params)
    return format_program(program)


def list_programs() -> list[str]:
    """Names of the committed library programs."""
    return list(PROGRAMS)


def program_path(name: str, form: Form = "full") -> Path:
    return LIBRARY_DIR / f"{name}.{form}.tl"


def load(name: str, form: Form = "full") -> str:
    """The committed text of library program `name` in `form`."""
    if name not in PROGRAMS:
        raise UsageError(f"no library program {name!r}; known: {', '.join(PROGRAMS)}")
    return program_path(name, form).read_text()


def render_named(name: str, form: Form = "full") -> str:
    return render(PROGRAMS[name], form=form, name=name)


def write_all() -> list[Path]:
    """Re-render every committed program file; returns the paths written."""
    written = []
    for name in PROGRAMS:
        for form in ("full", "sketch"):
            path = program_path(name, form)  # type: ignore[arg-type]
            path.write_text(render_named(name, form))  # type: ignore[arg-type]
            written.append(path)
    return written
