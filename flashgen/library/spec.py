"""The library job's spec: a cross product of GPUs, dtypes, variants and head dims, plus the provider and its
budgets and what the GPU stages do (docs/batch.md). TOML, validated by pydantic; every bad input is one line.

    gpus = ["h200", "h100"]
    dtypes = ["fp16", "bf16"]
    variants = ["plain", "causal"]          # the names generated/ uses (flashgen.variant.Variant.name)
    head_dims = [64, 128, 256, [192, 128]]  # a head dim, or [D, Dv] for V's and O's own head dim (Dv)
    exclude = [{ gpu = "t4", head_dim = 256 }]
    tuned = "user"                          # or "packaged": the package's tuned tables alone (generated/); or
                                            # "search": chosen by the parameter search on the entry's GPU
    targets = ["my_gpu.toml"]               # target files (relative to the spec) for GPUs the table lacks
    out = "lib"                             # the library folder when --out is not given (relative to the spec)

    [provider]
    name = "expert"                         # expert | openai | anthropic | openai-compatible
    max_iters = 12                          # budgets per entry

    [gpu]
    verify = true
    bench = true

    [search]                                # with tuned = "search": flashgen tune's search, per entry
    max_candidates = 8
    budget_s = 300
"""

from __future__ import annotations

import itertools
import re
import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from flashgen.errors import InputError, UsageError, read_text_input
from flashgen.variant import DType, Norm, Variant, head_dim_problem, head_dims_tag, parse_dtype

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

PROVIDERS = ("expert", "openai", "anthropic", "openai-compatible")


class ProviderSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: Literal["expert", "openai", "anthropic", "openai-compatible"] = "expert"
    model: str | None = None
    base_url: str | None = None
    max_iters: int | None = Field(default=None, ge=1, le=1000, description="model calls per entry")
    max_tokens: int | None = Field(default=None, ge=1)
    max_cost_usd: float | None = Field(default=None, gt=0, description="per entry")
    max_wall_s: float | None = Field(default=None, gt=0, description="per entry")
    goal_speedup: float = Field(default=1.0, gt=0)


class GpuSpec(BaseModel):
    """The GPU stages, run where a GPU of the entry's target is present (else: compiled and estimated)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    verify: bool = True
    bench: bool = Field(default=True, description="time it (after verifying) beside the baselines")
    baselines: bool = True
    min_time_s: float = Field(default=0.2, gt=0, le=60)
    timeout_s: float = Field(default=300, gt=0, le=3600, description="per GPU job")
    max_attempts: int = Field(default=2, ge=1, le=16, description="GPU workers an entry may try when one dies")


class SearchSpec(BaseModel):
    """`tuned = "search"`: the parameter search (flashgen.harness.tune, as `flashgen tune`) per entry, on a GPU of
    its target: the candidates screened and compiled on the CPU, verified and timed on the GPU."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    max_candidates: int = Field(default=8, ge=1, le=1000, description="the likeliest candidates compiled, verified and "
                                "timed per entry (after the CPU filters)")
    budget_s: float = Field(default=300, gt=0, le=36000, description="seconds of verifying and timing per entry")
    min_time_s: float = Field(default=0.1, gt=0, le=60, description="seconds of timing per candidate and shape")
    lengths: list[int] = Field(default_factory=lambda: [1024, 4096, 16384], min_length=1,
                               description="N = M of the timed shapes (B*N = 16k tokens, H*D about 2048)")

    @field_validator("lengths")
    @classmethod
    def _lengths(cls, value: list[int]) -> list[int]:
        if any(n < 1 or n > 1 << 20 for n in value) or len(set(value)) != len(value):
            raise ValueError("must be distinct lengths between 1 and 1048576")
        return value


class Exclude(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    gpu: str | None = None
    dtype: str | None = None
    variant: str | None = None
    head_dim: int | None = None
    head_dim_v: int | None = Field(default=None, description="V's head dim (an entry without one has D's)")

    def matches(self, entry: EntrySpec) -> bool:
        return all(want is None or want == have for want, have in
                   ((self.gpu, entry.gpu), (self.dtype, entry.dtype), (self.variant, entry.variant),
                    (self.head_dim, entry.head_dim), (self.head_dim_v, entry.head_dim_v or entry.head_dim)))


class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    gpus: list[str] = Field(min_length=1)
    dtypes: list[str] = Field(min_length=1)
    variants: list[str] = Field(min_length=1)
    head_dims: list[int | tuple[int, int]] = Field(min_length=1, description="head dims: D, or [D, Dv] where V and O "
                                                   "have a head dim of their own")
    provider: ProviderSpec = Field(default_factory=ProviderSpec)
    gpu: GpuSpec = Field(default_factory=GpuSpec)
    tuned: Literal["user", "packaged", "search"] = "user"
    search: SearchSpec | None = Field(default=None, description="with tuned = \"search\" (default settings when "
                                      "absent)")
    exclude: list[Exclude] = Field(default_factory=list)
    targets: list[str] = Field(default_factory=list, description="target files, relative to the spec file")
    out: str | None = Field(default=None, description="the library folder when --out is not given (relative to the "
                            "spec file)")

    @field_validator("head_dims", mode="before")
    @classmethod
    def _head_dim_items(cls, items):
        """Each item an integer or a pair of them, said in one line (pydantic's union error names neither)."""
        for item in items if isinstance(items, list) else ():
            pair = isinstance(item, list) and len(item) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                                     for x in item)
            if not pair and (not isinstance(item, int) or isinstance(item, bool)):
                raise ValueError(f"{item!r}: each item is a head dim (128) or [D, Dv] ([192, 128]: V's and O's "
                                 "own head dim)")
        return items

    @property
    def search_settings(self) -> SearchSpec:
        return self.search or SearchSpec()

    def index_dump(self) -> dict:
        """The spec as the index records it (no `search` key where the spec has none, no `head_dim_v` in an exclude
        rule without one: older indexes stay as they were)."""
        data = self.model_dump(mode="json", exclude={"search"} if self.search is None else None)
        for rule in data["exclude"]:
            if rule.get("head_dim_v") is None:
                rule.pop("head_dim_v", None)
        return data

    def head_dim_pairs(self) -> list[tuple[int, int | None]]:
        """Each head_dims item as (D, Dv), Dv None where V's head dim is D's ([128, 128] is 128)."""
        pairs = []
        for item in self.head_dims:
            d, dv = (item, None) if isinstance(item, int) else item
            pairs.append((d, None if dv == d else dv))
        return pairs

    def entries(self) -> list[EntrySpec]:
        out = []
        for gpu, dtype, variant, (head_dim, head_dim_v) in itertools.product(self.gpus, self.dtypes, self.variants,
                                                                              self.head_dim_pairs()):
            entry = EntrySpec(gpu=gpu, dtype=dtype, variant=variant, head_dim=head_dim, head_dim_v=head_dim_v)
            if not any(rule.matches(entry) for rule in self.exclude):
                out.append(entry)
        return out


class EntrySpec(BaseModel):
    """One kernel of the library: its folder is GPU/DTYPE/VARIANT_dHEAD (as generated/), VARIANT_dHEADvHEADV where V
    has a head dim of its own (flashgen.variant.head_dims_tag)."""

    model_config = ConfigDict(frozen=True)
    gpu: str
    dtype: str
    variant: str
    head_dim: int
    head_dim_v: int | None = None

    @property
    def path(self) -> str:
        return f"{self.gpu}/{self.dtype}/{self.variant}_{head_dims_tag(self.head_dim, self.head_dim_v)}"

    def key_dump(self) -> dict:
        """The entry as its key reads it: no head_dim_v where V's head dim is D's (the keys from before it stay)."""
        return self.model_dump(exclude={"head_dim_v"} if self.head_dim_v is None else None)


_TOKEN = re.compile(r"^(?:(causal)|window(\d+)|(alibi)|softcap(\d+(?:\.\d+)?)|gqa(\d+)|(lse)|(relu|sigmoid)"
                    r"|(decode_splitkv))$")


def parse_variant_name(name: str) -> Variant:
    """The Variant whose `name` is `name` (plain, causal, window256, causal_alibi, softcap30, gqa4, causal_lse, ...);
    UsageError naming the name otherwise."""
    fields: dict = {}
    text = name.replace("decode_splitkv", "decode-splitkv")
    tokens = [] if text == "plain" else text.split("_")
    for token in tokens:
        m = _TOKEN.match(token.replace("decode-splitkv", "decode_splitkv"))
        if m is None:
            break
        causal, window, alibi, softcap, gqa, lse, norm, split = m.groups()
        if causal:
            fields["causal"] = True
        elif window:
            fields.update(causal=True, window=int(window))
        elif alibi:
            fields["alibi"] = True
        elif softcap:
            fields["softcap"] = float(softcap)
        elif gqa:
            fields["kv_group"] = int(gqa)
        elif lse:
            fields["return_lse"] = True
        elif norm:
            fields["norm"] = Norm(norm)
        elif split:
            fields["split_kv"] = True
    else:
        try:
            variant = Variant(**fields)
        except ValidationError:
            variant = None
        if variant is not None and variant.name == name:
            return variant
    raise UsageError(f"unknown variant {name!r}: the names generated/ uses, e.g. plain, causal, window256, "
                     "causal_alibi, softcap30, causal_gqa4, causal_lse")


def _one_line(where: str, exc: ValidationError) -> str:
    error = exc.errors()[0]
    loc = ".".join(str(p) for p in error.get("loc", ()))
    kind = error.get("type", "")
    if kind == "extra_forbidden":
        section = loc.rsplit(".", 1)[0] if "." in loc else ""
        model = {"provider": ProviderSpec, "gpu": GpuSpec, "search": SearchSpec}.get(section.split(".")[0], Spec)
        if section.startswith("exclude"):
            model = Exclude
        return f"{where}: unknown key {loc!r} (keys{' of [' + section + ']' if section else ''}: " \
               f"{', '.join(model.model_fields)})"
    if kind == "missing":
        return f"{where}: missing key {loc!r}"
    msg = str(error.get("msg", "invalid")).removeprefix("Value error, ").replace("Input should be", "must be", 1)
    return f"{where}: {loc}: {msg} (got {error.get('input')!r})"


def parse_spec(data: dict, where: str = "spec", base: Path | None = None) -> Spec:
    """A spec from its TOML table: validated, its target files registered, every name and combination checked
    (unknown GPU, dtype or variant, a head dim the translator cannot build): UsageError, one line."""
    try:
        spec = Spec.model_validate(data)
    except ValidationError as exc:
        raise UsageError(_one_line(where, exc)) from None
    if spec.search is not None and spec.tuned != "search":
        raise UsageError(f"{where}: [search] is for tuned = \"search\" (tuned is {spec.tuned!r})")
    from flashgen.target_files import register_target_file
    from flashgen.targets import get_target

    for name in spec.targets:
        path = (base / name) if base is not None and not Path(name).is_absolute() else Path(name)
        try:
            register_target_file(path)
        except UsageError as exc:
            raise UsageError(f"{where}: targets: {exc}") from None
    gpus = []
    for gpu in spec.gpus:
        try:
            gpus.append(get_target(gpu).name)
        except UsageError as exc:
            raise UsageError(f"{where}: gpus: {exc}") from None
    for dtype in spec.dtypes:
        try:
            parse_dtype(dtype)
        except UsageError as exc:
            raise UsageError(f"{where}: dtypes: {exc}") from None
    for variant in spec.variants:
        try:
            parse_variant_name(variant)
        except UsageError as exc:
            raise UsageError(f"{where}: variants: {exc}") from None
    for head_dim, head_dim_v in spec.head_dim_pairs():
        for dim in (head_dim, head_dim_v):
            if dim is not None and (problem := head_dim_problem(dim)) is not None:
                pair = f"[{head_dim}, {head_dim_v}]: " if head_dim_v is not None else ""
                raise UsageError(f"{where}: head_dims: {pair}{problem}")
        if head_dim_v is not None and spec.tuned == "search":
            raise UsageError(f"{where}: head_dims: [{head_dim}, {head_dim_v}]: the parameter search does not take a "
                             "V head dim of its own yet (tuned = \"search\"); use tuned = \"user\" or \"packaged\" "
                             "(the tables read at the larger of the two)")
    for field, values in (("gpus", spec.gpus), ("dtypes", spec.dtypes), ("variants", spec.variants),
                          ("head_dims", spec.head_dim_pairs())):
        if len(set(values)) != len(values):
            shown = [list(v) if isinstance(v, tuple) else v for v in spec.head_dims] if field == "head_dims" else values
            raise UsageError(f"{where}: {field}: {shown} names one twice")
    if spec.out is not None and base is not None and not Path(spec.out).is_absolute():
        spec = spec.model_copy(update={"out": str(base / spec.out)})
    spec = spec.model_copy(update={"gpus": gpus})  # canonical names (h100-sxm -> h100): the folders' names
    if not spec.entries():
        raise UsageError(f"{where}: exclude leaves no entry")
    check_supported(spec, where)
    return spec


def check_supported(spec: Spec, where: str = "spec") -> None:
    """Every entry is a combination the translator builds; else one line naming it and how to exclude it."""
    from flashgen.harness.environment import Environment
    from flashgen.targets import get_target

    env = Environment()
    for entry in spec.entries():
        try:
            env.check_supported(parse_variant_name(entry.variant), get_target(entry.gpu), DType(parse_dtype(entry.dtype)),
                                entry.head_dim, head_dim_v=entry.head_dim_v)
        except UsageError as exc:
            dv = f", head_dim_v = {entry.head_dim_v}" if entry.head_dim_v is not None else ""
            raise UsageError(f"{where}: {entry.path}: {exc} (drop it with exclude = [{{ gpu = \"{entry.gpu}\", "
                             f"head_dim = {entry.head_dim}{dv} }}])") from None


def load_spec(path: str | Path) -> Spec:
    """Read and validate a spec file (TOML); UsageError (one line) for anything wrong."""
    try:
        text = read_text_input(str(path))
    except InputError as exc:
        raise UsageError(str(exc)) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not TOML: {exc}") from None
    return parse_spec(data, str(path), Path(path).parent)
