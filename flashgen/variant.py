"""What an attention kernel computes, independent of how: the contract shared by the TL library,
the reference, the translators, the harness and the agent.

Conventions (docs/variants.md says the same in prose):
- Q is (B, H, N, D); K and V are (B, KVH, M, D) with H % KVH == 0; query head h reads kv head h // (H // KVH).
- Scores s = scale * q.k with scale = 1/sqrt(D) unless given.
- Positions are bottom-right aligned when N != M (as FlashAttention >= 2.1): query row i sits at key
  position i + (M - N). Causal: key j visible iff j <= i + M - N.
- Sliding window W (implies causal): key j visible iff 0 <= (i + M - N) - j < W.
- Softcap C: s = C * tanh(s / C), applied after scaling and before bias and mask.
- ALiBi: s += -slope_h * |i + M - N - j| with slope_h = 2^(-8 (h + 1) / H).
- softmax: P = softmax over visible keys; LSE = log(sum exp(s)) over visible keys (natural log).
- relu: P = relu(s) / M over visible keys (ReLU attention, scaled by key length).
- sigmoid: P = sigmoid(s - log(M)) over visible keys (sigmoid attention with bias -log M).
- A row that sees no key returns O = 0 and, for softmax, LSE = -inf.
"""

from __future__ import annotations

import math
from enum import Enum

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from flashgen.errors import UsageError


class Norm(str, Enum):
    softmax = "softmax"
    relu = "relu"
    sigmoid = "sigmoid"


class DType(str, Enum):
    fp16 = "fp16"
    bf16 = "bf16"
    fp32 = "fp32"

    @property
    def itemsize(self) -> int:
        return 4 if self is DType.fp32 else 2


class Variant(BaseModel):
    """The function an attention kernel computes. Runtime sizes (B, H, N, M) are not part of it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    causal: bool = False
    window: int | None = Field(default=None, ge=1, description="sliding window in keys; implies causal")
    alibi: bool = False
    softcap: float | None = Field(default=None, gt=0)
    norm: Norm = Norm.softmax
    kv_group: int = Field(default=1, ge=1, description="query heads per kv head: 1 = MHA, H = MQA")
    return_lse: bool = False
    split_kv: bool = False

    @field_validator("softcap", mode="before")
    @classmethod
    def _finite_softcap(cls, value):
        # C * tanh(s / C): C = inf or nan would give a NaN reference that "passes"
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not (math.isfinite(value) and value > 0):
            raise ValueError("must be a finite number greater than 0")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Variant:
        if self.window is not None and not self.causal:
            raise ValueError("a sliding window implies causal=True")
        if self.return_lse and self.norm is not Norm.softmax:
            raise ValueError("the log-sum-exp output exists only for softmax")
        if self.split_kv and self.norm is not Norm.softmax:
            raise ValueError("split-KV combine needs softmax's log-sum-exp")
        return self

    @property
    def name(self) -> str:
        """A stable short name, used for file names and cache keys."""
        parts: list[str] = []
        if self.split_kv:
            parts.append("decode_splitkv")
        if self.window is not None:
            parts.append(f"window{self.window}")
        elif self.causal:
            parts.append("causal")
        if self.alibi:
            parts.append("alibi")
        if self.softcap is not None:
            parts.append(f"softcap{self.softcap:g}")
        if self.kv_group > 1:
            parts.append(f"gqa{self.kv_group}")
        if self.norm is not Norm.softmax:
            parts.append(self.norm.value)
        if self.return_lse and not self.split_kv:
            parts.append("lse")
        return "_".join(parts) or "plain"


class Shape(BaseModel):
    """Runtime sizes of one attention call."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    B: int = Field(ge=1)
    H: int = Field(ge=1)
    N: int = Field(ge=1, description="query length")
    M: int = Field(ge=1, description="key/value length")
    D: int = Field(ge=1, description="head dim")
    KVH: int | None = Field(default=None, ge=1, description="kv heads; None means H")

    @property
    def kv_heads(self) -> int:
        return self.H if self.KVH is None else self.KVH

    @model_validator(mode="after")
    def _heads_divide(self) -> Shape:
        if self.H % self.kv_heads:
            raise ValueError(f"H={self.H} is not a multiple of KVH={self.kv_heads}")
        return self

    @classmethod
    def parse(cls, text: str) -> Shape:
        """Parse 'B=2,H=4,N=200,M=333,D=64[,KVH=2]' (the CLI's --shape)."""
        fields: dict[str, int] = {}
        for item in filter(None, (p.strip() for p in text.split(","))):
            key, sep, value = item.partition("=")
            if not sep or not value.strip().lstrip("-").isdigit():
                raise ValueError(f"bad shape item {item!r}: expected NAME=INTEGER, e.g. B=2,H=4,N=200,M=333,D=64")
            fields[key.strip()] = int(value)
        unknown = set(fields) - set(cls.model_fields)
        if unknown:
            raise ValueError(f"unknown shape field(s) {sorted(unknown)}; known: B, H, N, M, D, KVH")
        return cls(**fields)

    def flops(self, causal: bool = False) -> float:
        """FlashAttention's count: 4*B*H*N*M*D, halved for causal."""
        f = 4.0 * self.B * self.H * self.N * self.M * self.D
        return f / 2 if causal else f


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)


def alibi_slope(head: int, heads: int) -> float:
    return 2.0 ** (-8.0 * (head + 1) / heads)


# From the words a user types (CLI flags, flashgen.generate's arguments); a bad one is a UsageError (one line)

def make_variant(*, causal: bool = False, window: int | None = None, alibi: bool = False,
                 softcap: float | None = None, norm: str = "softmax", lse: bool = False, kv_group: int = 1,
                 names: dict[str, str] | None = None) -> Variant:
    """A Variant from the CLI's flags; an impossible combination is a UsageError (one line), a refused field
    named by `names` (field -> flag, e.g. softcap -> --softcap) with the value given and its allowed range."""
    from flashgen.errors import pydantic_message, shown

    try:
        norm_value = Norm(norm)
    except ValueError:
        raise UsageError(f"unknown norm {norm!r}; choose softmax, relu or sigmoid") from None
    try:
        return Variant(causal=causal, window=window, alibi=alibi, softcap=softcap, norm=norm_value,
                       return_lse=lse, kv_group=kv_group)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = [str(x) for x in first.get("loc", ()) if x]
        if len(loc) == 1:  # one field's value: name it as given
            where = (names or {}).get(loc[0], loc[0])
            raise UsageError(f"{where} {shown(first.get('input'))}: {pydantic_message(first)}") from None
        raise UsageError(f"unsupported variant: {pydantic_message(first)}") from None


def parse_dtype(dtype: str | DType) -> DType:
    try:
        return DType(getattr(dtype, "value", dtype))
    except ValueError:
        raise UsageError(f"unknown dtype {dtype!r}; choose fp16, bf16 or fp32") from None
