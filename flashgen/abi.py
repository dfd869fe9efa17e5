"""The kernel contract between translators (and models) and the harness.

A translated kernel is CUDA source plus a KernelManifest. The source defines each entry point as
`extern "C" __global__ void NAME(const FlashgenAttnParams p)` (flashgen/include/flashgen_abi.cuh);
the manifest says how to launch them, in order. Grid sizes are small integer expressions over the
runtime sizes, evaluated by `eval_size` (no Python eval).
"""

from __future__ import annotations

import ctypes
import json
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer

from flashgen.operators import BINARY, COMPARISONS, SIZE_BINARY, SIZE_FUNCTIONS, UNARY
from flashgen.variant import DType, Variant, head_dim_v_problem

ABI_HEADER = Path(__file__).parent / "include" / "flashgen_abi.cuh"
ABI_INCLUDE = "flashgen_abi.cuh"
_LAUNCH_BOUNDS = r"(?:__launch_bounds__\([^)]*\)\s+)?"
# CUDA accepts __launch_bounds__ either before or after the return type.
ENTRY_SIGNATURE = re.compile(
    r'extern\s+"C"\s+__global__\s+' + _LAUNCH_BOUNDS + r"void\s+" + _LAUNCH_BOUNDS
    + r"(\w+)\s*\(\s*const\s+FlashgenAttnParams\s+\w+"
    + r"(?:\s*,\s*const\s+__grid_constant__\s+FlashgenTensorMaps\s+\w+)?\s*\)"
)
TENSOR_MAP_BYTES = 128  # sizeof(CUtensorMap)

# SMS: the streaming multiprocessors of the GPU the kernel runs on (a persistent grid sizes itself by it).
SIZE_NAMES = ("B", "H", "KVH", "N", "M", "D", "SPLITS", "SMS")

#: call-time tensors of score and mask functions (FlashgenAttnParams.mod_tensors): at most this many, of at most
#: MAX_MOD_RANK dims each (FLASHGEN_MAX_MOD_TENSORS and FLASHGEN_MAX_MOD_RANK in flashgen_abi.cuh say the same)
MAX_MOD_TENSORS = 4
MAX_MOD_RANK = 4
#: the sizes a call-time tensor's dims may name (or a positive integer)
MOD_TENSOR_SIZES = ("B", "H", "KVH", "N", "M", "D")
#: a declaration without a fill rule fills uniformly over these bounds (TL expressions over the sizes)
DEFAULT_FILL = {"int32": ("0", "M"), "fp32": ("0", "1")}


class TensorMapSpec(BaseModel):
    """One TMA tensor map a Hopper kernel takes (FlashgenTensorMaps in flashgen_abi.cuh). The harness encodes it
    over the tensor's (D, rows, heads, batch) axes with the tensor's own strides: boxes of `box_cols` head-dim
    elements by `box_rows` rows, swizzled `swizzle_bytes`; rows past the end load as zeros and are not stored."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    tensor: Literal["q", "k", "v", "o"]
    box_rows: int = Field(ge=1, le=256)
    box_cols: int = Field(default=64, ge=8, le=256, description="elements; box_cols * itemsize <= swizzle_bytes")
    swizzle_bytes: Literal[128] = 128


class Launch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kernel: str = Field(description="entry symbol, extern \"C\"")
    grid: tuple[str, str, str] = Field(description="expressions over B,H,KVH,N,M,D,SPLITS,SMS; cdiv(a,b), min, max allowed")
    threads: int = Field(ge=32, le=1024)
    smem_bytes: int = Field(default=0, ge=0, description="dynamic shared memory")
    when: str | None = Field(default=None, description="run only where this holds, e.g. 'N <= 1024'; null: always")
    tensor_maps: list[TensorMapSpec] | None = Field(default=None, description="its own tensor maps; null: the manifest's")

    @field_validator("when")
    @classmethod
    def _condition(cls, text: str | None) -> str | None:
        if text is not None:
            condition_parts(text)  # ValueError, one line, for one that does not parse
        return text

    def runs_at(self, sizes: dict[str, int]) -> bool:
        """Whether this launch runs at these sizes (`when` holds, or there is none)."""
        return self.when is None or eval_condition(self.when, sizes)

    def persistent(self) -> bool:
        """Whether its grid names SMS: a persistent grid, whose CTAs each walk several work tiles once there are more
        tiles than the GPU has SMs (and only then)."""
        return any(re.search(r"\bSMS\b", dim) for dim in self.grid)

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler):
        # launches that run at every size with the manifest's maps serialize exactly as before the fields existed
        data = handler(self)
        if isinstance(data, dict):
            for key in ("when", "tensor_maps"):
                if data.get(key) is None:
                    data.pop(key, None)
        return data


_MOD_TENSOR_TEXT = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(\w+)\s*\[([^\]]*)\]\s*"
                              r"(?::\s*([^:]*?)\s*\.\.\s*([^:]*?)\s*)?(?::\s*(sorted)\s*)?$")
MOD_TENSOR_FORM = "NAME=DTYPE[DIMS][:LO..HI][:sorted], e.g. LEN=int32[B]:0..M or DOC=int32[M]:0..3:sorted"


class ModTensor(BaseModel):
    """A call-time tensor of a kernel's score or mask function (the TL's `Tensor NAME shape [..] dtype .. fill LO to HI
    [sorted]` line; docs/variants.md): what the caller passes (`tensors={NAME: array}`) and how the harness fills one
    for verification and timing. Slot i of FlashgenAttnParams.mod_tensors is the manifest's i-th. Written as text
    (`text`, `parse`): NAME=DTYPE[DIMS]:LO..HI[:sorted], the CLI's --tensor and the manifest's form."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    dtype: Literal["int32", "fp32"]
    shape: tuple[str | int, ...] = Field(description="size names or positive ints")
    low: str = Field(description="fill: lowest value (over the sizes)")
    high: str = Field(description="fill: highest (int32) or bound (fp32)")
    sorted: bool = Field(default=False, description="fill: ascending along the last axis")

    @field_validator("shape")
    @classmethod
    def _dims(cls, shape: tuple) -> tuple:
        if not 1 <= len(shape) <= MAX_MOD_RANK:
            raise ValueError(f"a call-time tensor has 1 to {MAX_MOD_RANK} dims, not {len(shape)}")
        for dim in shape:
            if isinstance(dim, str) and dim not in MOD_TENSOR_SIZES or isinstance(dim, int) and dim < 1:
                raise ValueError(f"dim {dim!r}: a size ({', '.join(MOD_TENSOR_SIZES)}) or a positive integer")
        return shape

    def dims(self, sizes: dict[str, int]) -> tuple[int, ...]:
        """The dims at these sizes (B, H, KVH, N, M, D)."""
        return tuple(int(sizes[d]) if isinstance(d, str) else int(d) for d in self.shape)

    @property
    def text(self) -> str:
        """The CLI's form: NAME=DTYPE[DIMS]:LO..HI[:sorted]."""
        return (f"{self.name}={self.dtype}[{', '.join(map(str, self.shape))}]:{self.low}..{self.high}"
                + (":sorted" if self.sorted else ""))

    @classmethod
    def parse(cls, text: str) -> ModTensor:
        """NAME=DTYPE[DIMS][:LO..HI][:sorted] -> ModTensor (no fill: DEFAULT_FILL). ValueError, one line, otherwise;
        the bounds are kept as text (their meaning is the TL's: flashgen.tl_spec.tensors)."""
        from pydantic import ValidationError

        match = _MOD_TENSOR_TEXT.match(text) if isinstance(text, str) else None
        if match is None:
            raise ValueError(f"expected {MOD_TENSOR_FORM}")
        name, dtype, dims_text, low, high, is_sorted = match.groups()
        if dtype not in DEFAULT_FILL:
            raise ValueError(f"dtype {dtype!r}: a call-time tensor is {' or '.join(DEFAULT_FILL)}")
        dims = [int(d) if d.isdigit() else d for d in (d.strip() for d in dims_text.split(","))]
        if low is None:
            low, high = DEFAULT_FILL[dtype]
        try:
            return cls(name=name, dtype=dtype, shape=tuple(dims), low=low, high=high, sorted=is_sorted is not None)
        except ValidationError as exc:
            raise ValueError(exc.errors()[0]["msg"].removeprefix("Value error, ")) from None


class KernelManifest(BaseModel):
    """Everything the harness needs to run and check a kernel, besides its source."""

    model_config = ConfigDict(extra="forbid")

    name: str
    arch: str = Field(description="compute capability it was written for, e.g. sm_80")
    dtype: DType
    head_dim: int
    # v (B, KVH, M, Dv) and o (B, H, N, Dv); the description is short: the translate prompt shows every field's
    head_dim_v: int | None = Field(default=None, description="Dv, V's and O's head dim; null: D")
    variant: Variant
    launches: list[Launch]
    workspace_floats: str = Field(default="0", description="fp32 workspace size, an expression like the grid's")
    num_splits: str = Field(default="1", description="split-KV chunk count, an expression over the sizes")
    params: dict[str, int | str] = Field(default_factory=dict, description="tile parameters, for the record")
    reference_tl: str | None = Field(
        default=None,
        description="a full TL program whose fp64 interpretation is the reference (a custom mask or score function "
        "`variant` does not describe); null: `variant`'s fp64 reference",
    )
    tensor_maps: list[TensorMapSpec] = Field(
        default_factory=list,
        description="TMA maps the kernel takes as its second parameter (const __grid_constant__ FlashgenTensorMaps); "
        "empty: none",
    )
    mod_tensors: list[str] = Field(
        default_factory=list, max_length=MAX_MOD_TENSORS,
        description="call-time tensors, NAME=DTYPE[DIMS]:LO..HI[:sorted]: the TL's Tensor lines, in "
        "FlashgenAttnParams.mod_tensors order",
    )
    notes: str = ""

    @field_validator("mod_tensors")
    @classmethod
    def _tensor_texts(cls, texts: list[str]) -> list[str]:
        return [ModTensor.parse(text).text for text in texts]  # canonical text; ValueError for a bad one

    @field_validator("head_dim_v")
    @classmethod
    def _head_dim_v(cls, value: int | None) -> int | None:
        if value is not None and (problem := head_dim_v_problem(value)) is not None:
            raise ValueError(problem)
        return value

    @property
    def dv(self) -> int:
        """V's and O's head dim: head_dim_v, or head_dim where V has none of its own."""
        return self.head_dim if self.head_dim_v is None else self.head_dim_v

    def launches_at(self, sizes: dict[str, int]) -> list[Launch]:
        """The launches that run at these sizes (Launch.when), in order."""
        return [launch for launch in self.launches if launch.runs_at(sizes)]

    def maps_of(self, launch: Launch) -> list[TensorMapSpec]:
        """The tensor maps `launch` takes: its own, else the manifest's."""
        return self.tensor_maps if launch.tensor_maps is None else launch.tensor_maps

    @property
    def size_bounds(self) -> dict[str, set[int]]:
        """Where launches change with the sizes: for each comparison of a size name with an integer in a `when`
        (`N <= 1024`), that name -> the integer and its two neighbours (1023, 1024, 1025), so that verification
        can run each side."""
        bounds: dict[str, set[int]] = {}
        for launch in self.launches:
            for left, _op, right in condition_parts(launch.when) if launch.when else ():
                for name, other in ((left, right), (right, left)):
                    if name in SIZE_NAMES and other.isdigit():
                        bounds.setdefault(name, set()).update(range(int(other) - 1, int(other) + 2))
        return bounds

    @property
    def call_tensors(self) -> list[ModTensor]:
        """The call-time tensors (`mod_tensors` parsed), in slot order."""
        return [ModTensor.parse(text) for text in self.mod_tensors]

    @model_serializer(mode="wrap")
    def _omit_absent_tensor_maps(self, handler):
        # Kernels without TMA (every pre-Hopper one), call-time tensors or a V head dim of its own serialize exactly as
        # before the fields existed.
        data = handler(self)
        if isinstance(data, dict):
            for key in ("tensor_maps", "mod_tensors", "head_dim_v"):
                if not data.get(key):
                    data.pop(key, None)
        return data


class FlashgenAttnParams(ctypes.Structure):
    """Host mirror of the C struct, field for field (a test compiles the header and compares offsets)."""

    _fields_ = [
        ("q", ctypes.c_void_p),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("o", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p),
        *[(f"{t}_stride_{a}", ctypes.c_longlong) for t, axes in (("q", "bhn"), ("k", "bhm"), ("v", "bhm"), ("o", "bhn")) for a in axes],
        ("lse_stride_b", ctypes.c_longlong),
        ("lse_stride_h", ctypes.c_longlong),
        ("batch", ctypes.c_int),
        ("heads", ctypes.c_int),
        ("kv_heads", ctypes.c_int),
        ("seqlen_q", ctypes.c_int),
        ("seqlen_k", ctypes.c_int),
        ("num_splits", ctypes.c_int),
        ("scale", ctypes.c_float),
        ("alibi_slopes", ctypes.c_void_p),
        ("alibi_stride_b", ctypes.c_longlong),
        ("mod_tensors", ctypes.c_void_p * MAX_MOD_TENSORS),
        ("mod_strides", (ctypes.c_longlong * MAX_MOD_RANK) * MAX_MOD_TENSORS),
    ]


_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_]\w*)|(.))")
# the levels of the size operators, loosest first (flashgen.operators.SIZE_BINARY: + - * / %, with / flooring)
_SIZE_LEVELS = sorted({op.precedence for op in SIZE_BINARY.values()})


def eval_size(expr: str, sizes: dict[str, int]) -> int:
    """Evaluate an integer size expression: + - * / (floor) % parentheses, names from `sizes`,
    and cdiv(a, b) / max(a, b) / min(a, b), each as flashgen.operators defines it. Raises ValueError on
    anything else."""
    tokens: list[tuple[str, str]] = []
    for num, name, op in _TOKEN.findall(expr):
        if num:
            tokens.append(("num", num))
        elif name:
            tokens.append(("name", name))
        elif op.strip():
            if op not in SIZE_BINARY and op not in "(),":
                raise ValueError(f"size expression {expr!r}: unexpected {op!r}")
            tokens.append(("op", op))
    pos = 0

    def peek() -> tuple[str, str] | None:
        return tokens[pos] if pos < len(tokens) else None

    def take(value: str | None = None) -> tuple[str, str]:
        nonlocal pos
        tok = peek()
        if tok is None or (value is not None and tok[1] != value):
            raise ValueError(f"size expression {expr!r}: expected {value or 'a term'}")
        pos += 1
        return tok

    def atom() -> int:
        kind, text = take()
        if kind == "num":
            return int(text)
        if kind == "op" and text == "(":
            value = add()
            take(")")
            return value
        if kind == "op" and text == "-":
            return UNARY["-"].scalar(atom())
        if kind == "name" and text in SIZE_FUNCTIONS:
            func = SIZE_FUNCTIONS[text]
            take("(")
            args = [add()]
            for _ in range(func.arity - 1):
                take(",")
                args.append(add())
            take(")")
            return func.scalar(*args)
        if kind == "name" and text in sizes:
            return int(sizes[text])
        raise ValueError(f"size expression {expr!r}: unknown name {text!r}")

    def level(i: int) -> int:
        if i == len(_SIZE_LEVELS):
            return atom()
        value = level(i + 1)
        while (tok := peek()) and tok[0] == "op" and tok[1] in SIZE_BINARY \
                and SIZE_BINARY[tok[1]].precedence == _SIZE_LEVELS[i]:
            take()
            value = SIZE_BINARY[tok[1]].scalar(value, level(i + 1))
        return value

    def add() -> int:
        return level(0)

    result = add()
    if peek() is not None:
        raise ValueError(f"size expression {expr!r}: trailing {peek()[1]!r}")
    return result


# the two-character comparisons first, so that `<=` is not read as `<` and `=...`
_COMPARISON = re.compile(r"^(.*?)\s*(" + "|".join(sorted(COMPARISONS, key=len, reverse=True)) + r")\s*(.*)$")


def condition_parts(text: str) -> list[tuple[str, str, str]]:
    """A launch condition ('N <= 1024 and M > 64') as (left, operator, right) per comparison; ValueError, one line,
    where a part is not one comparison of two size expressions."""
    parts = []
    for part in text.split(" and "):
        match = _COMPARISON.match(part.strip())
        if match is None or not match.group(1) or not match.group(3) or _COMPARISON.match(match.group(3)):
            raise ValueError(f"launch condition {text!r}: {part.strip()!r} is not one comparison "
                             "(<=, >=, ==, !=, <, >) of two size expressions")
        left, op, right = (g.strip() for g in match.groups())
        for side in (left, right):
            eval_size(side, {name: 1 for name in SIZE_NAMES})  # a size expression, or ValueError
        parts.append((left, op, right))
    return parts


def eval_condition(text: str, sizes: dict[str, int]) -> bool:
    """Whether a launch condition holds at these sizes (each comparison's sides by eval_size)."""
    return all(BINARY[op].scalar(eval_size(left, sizes), eval_size(right, sizes))
               for left, op, right in condition_parts(text))


# ------------------------------------------------------------------ the manifest in words, for a model
# Both are generated from the pydantic models themselves (model_json_schema, model_fields), so the
# prompt's definition of the manifest and the feedback on a wrong one cannot drift from the contract.

def _schema_type(schema: dict, defs: dict) -> str:
    if "$ref" in schema:
        target = defs[schema["$ref"].rsplit("/", 1)[-1]]
        return _schema_type(target, defs) if "enum" in target or "const" in target else "object"
    if "anyOf" in schema:
        return " or ".join(_schema_type(s, defs) for s in schema["anyOf"])
    if "const" in schema:
        return json.dumps(schema["const"])
    if "enum" in schema:
        return " | ".join(json.dumps(v) for v in schema["enum"])
    kind = schema.get("type")
    if kind == "array":
        if "prefixItems" in schema:
            return f"[{', '.join(_schema_type(s, defs) for s in schema['prefixItems'])}]"
        return f"list of {_schema_type(schema.get('items', {}), defs)}"
    if kind == "object" and "additionalProperties" in schema and isinstance(schema["additionalProperties"], dict):
        return f"object of name -> {_schema_type(schema['additionalProperties'], defs)}"
    text = {"null": "null", "boolean": "bool", "integer": "int", "number": "number", "string": "string"}.get(kind, kind or "any")
    if "minimum" in schema and "maximum" in schema:
        return f"{text} {schema['minimum']}..{schema['maximum']}"
    bounds = [f">= {schema['minimum']}" if "minimum" in schema else "", f"> {schema['exclusiveMinimum']}"
              if "exclusiveMinimum" in schema else "", f"<= {schema['maximum']}" if "maximum" in schema else ""]
    return " ".join([text, *(b for b in bounds if b)])


def _nested(schema: dict, defs: dict) -> dict | None:
    for s in (schema, schema.get("items", {}), *schema.get("anyOf", [])):
        if "$ref" in s and "properties" in defs[s["$ref"].rsplit("/", 1)[-1]]:
            return defs[s["$ref"].rsplit("/", 1)[-1]]
        if "items" in s and s is not schema:
            return _nested(s, defs)
    return None


def _outline(schema: dict, defs: dict, indent: str, lines: list[str], seen: dict | None = None,
             path: str = "") -> None:
    # seen: nested model title -> the field path that outlined it first (a second field of that type refers to it)
    seen = {} if seen is None else seen
    required = set(schema.get("required", []))
    for name, prop in schema.get("properties", {}).items():
        merged = {**defs.get(prop.get("$ref", "").rsplit("/", 1)[-1], {}), **prop} if "$ref" in prop else prop
        given = ("required" if name in required else f"default {json.dumps(prop['default'])}" if "default" in prop
                 else "optional")
        described = (prop.get("description") or "").split("\n")[0]
        line = f"{indent}- `{name}`: {_schema_type(prop, defs)}, {given}" + (f"; {described}" if described else "")
        inner = _nested(merged, defs)
        title = inner.get("title") if inner is not None else None
        if title in seen:
            lines.append(f"{line} (fields as in `{seen[title]}`)")
            continue
        lines.append(line)
        if inner is not None:
            seen[title] = f"{path}{name}"
            _outline(inner, defs, indent + "  ", lines, seen, f"{path}{name}.")


def fields_outline(model: type[BaseModel]) -> str:
    """Every field of `model` (nested models indented under theirs): type, required or default, description."""
    schema = model.model_json_schema()
    lines: list[str] = []
    _outline(schema, schema.get("$defs", {}), "", lines)
    return "\n".join(lines)


def _field_at(model: type[BaseModel], loc: tuple) -> tuple[str, str]:
    """(type, description) of the field at `loc`, from the JSON schema; ("", "") where the path leaves it."""
    schema = model.model_json_schema()
    defs, node = schema.get("$defs", {}), schema
    for part in loc:
        if "$ref" in node:
            node = defs[node["$ref"].rsplit("/", 1)[-1]]
        if isinstance(part, int) and "prefixItems" in node:
            node = node["prefixItems"][min(part, len(node["prefixItems"]) - 1)]
        elif isinstance(part, int) and "items" in node:
            node = node["items"]
        elif isinstance(part, str) and part in node.get("properties", {}):
            node = node["properties"][part]
        else:
            return "", ""
    if node is schema:
        return "", ""
    kind, description = _schema_type(node, defs), (node.get("description") or "").split("\n")[0]
    if (inner := _nested(node, defs)) is not None:
        kind += f" with the fields {', '.join(inner['properties'])}"
    return kind, description


def validation_error_lines(exc: Exception, model: type[BaseModel] = None) -> list[str]:  # type: ignore[assignment]
    """A ValidationError (or a JSON decode error) as one line per problem: which field, what was given, what is
    expected; no URLs."""
    from pydantic import ValidationError

    model = model or KernelManifest
    if isinstance(exc, json.JSONDecodeError):
        return [f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"]
    if not isinstance(exc, ValidationError):
        return [" ".join(str(exc).split())]
    lines = []
    for err in exc.errors(include_url=False):
        loc = tuple(err.get("loc", ()))
        where = ".".join(str(p) for p in loc) or "(the whole object)"
        given = json.dumps(err.get("input"), default=str)
        given = given if len(given) <= 120 else given[:117] + "..."
        kind, description = _field_at(model, loc)
        if err.get("type") == "extra_forbidden":
            lines.append(f"`{where}`: no such field (given {given}); the fields are listed in the manifest schema")
            continue
        if err.get("type") == "missing":
            lines.append(f"`{where}`: missing; expected {kind or 'a value'}" + (f" ({description})" if description else ""))
            continue
        expected = f"; expected {kind}" + (f" ({description})" if description else "") if kind else ""
        message = re.sub(r" or instance of \w+", "", err.get("msg", ""))  # pydantic's class names mean nothing to a model
        lines.append(f"`{where}`: {message}; given {given}{expected}")
    return lines
