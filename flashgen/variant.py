"""What an attention kernel computes, independent of how: the contract shared by the TL library,
the reference, the translators, the harness and the agent.

Conventions (docs/variants.md says the same in prose):
- Q is (B, H, N, D); K and V are (B, KVH, M, D) with H % KVH == 0; query head h reads kv head h // (H // KVH).
- Scores s = scale * q.k with scale = 1/sqrt(D) unless given.
- Positions are bottom-right aligned when N != M (as FlashAttention >= 2.1): query row i sits at key
  position i + (M - N). Causal: key j visible iff j <= i + M - N.
- Sliding window W (implies causal): key j visible iff 0 <= (i + M - N) - j < W.
- Softcap C: s = C * tanh(s / C), applied after scaling and before bias and mask.
- ALiBi: s += -slope * |i + M - N - j|, slope = the caller's slopes[b, h] (FlashAttention's alibi_slopes, fp32 (H)
  or (B, H)), without them 2^(-8 (h + 1) / H).
- softmax: P = softmax over visible keys; LSE = log(sum exp(s)) over visible keys (natural log).
- relu: P = relu(s) / M over visible keys (ReLU attention, scaled by key length).
- sigmoid: P = sigmoid(s - log(M)) over visible keys (sigmoid attention with bias -log M).
- A row that sees no key returns O = 0 and, for softmax, LSE = -inf.

Two-sided windows (the prompts add this line only for a task that has one):
- Two-sided window (window_left L, window_right R; a side not given is unbounded; FlashAttention's window
  size (L, R), -1 for unbounded): key j visible iff i + M - N - L <= j <= i + M - N + R (and j < M).
  Not causal: the causal forms are the sliding window W, which is (W - 1, 0), and causal alone, (-1, 0).

V's own head dim (the prompts add this line only for a task that has one):
- V's own head dim Dv (DeepSeek-style prefill: D = 192, Dv = 128): V is (B, KVH, M, Dv) and O (B, H, N, Dv);
  Q K^T runs over D (scale = 1/sqrt(D)), P V yields Dv columns. Dv is D unless given.
"""

from __future__ import annotations

import math
from enum import Enum

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_serializer, model_validator

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
    # FlashAttention's window_size=(left, right) where it is not causal: keys i + M - N - left .. i + M - N + right
    # (None: that side unbounded). Left out of every dump while unset, so that the manifests, meta.json and records
    # of the other variants keep their bytes.
    window_left: int | None = Field(default=None, ge=0, description="two-sided window (not causal): keys visible "
                                    "before the row's own position; null: unbounded")
    window_right: int | None = Field(default=None, ge=0, description="two-sided window (not causal): keys visible "
                                     "after the row's own position; null: unbounded")

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
        if self.two_sided:
            if self.window is not None:
                raise ValueError("give window=W (the causal window) or window_left/window_right, not both")
            if self.causal:
                raise ValueError("window_left/window_right are the non-causal window: with causal, give window=W "
                                 "(FlashAttention's window size (W - 1, 0))")
            if self.window_right == 0:
                raise ValueError("window_right=0 is causal: give causal and window=W with W = window_left + 1 "
                                 "(no window_left: causal alone)")
            if self.split_kv:
                raise ValueError("split-KV decode takes no window")
        return self

    @model_serializer(mode="wrap")
    def _unset_windows_left_out(self, handler):
        data = handler(self)
        if isinstance(data, dict):
            for key in ("window_left", "window_right"):
                if data.get(key, 0) is None:
                    del data[key]
        return data

    def __repr_args__(self):  # the repr too (test ids, kernel-hash keys) shows the two-sided fields only when set
        return [(k, v) for k, v in super().__repr_args__() if not (k in ("window_left", "window_right") and v is None)]

    @property
    def two_sided(self) -> bool:
        """A window bounded by window_left and/or window_right (FlashAttention's window_size, not causal)."""
        return self.window_left is not None or self.window_right is not None

    @property
    def window_size(self) -> tuple[int, int] | None:
        """FlashAttention's window_size=(left, right), -1 for an unbounded side; None without a window (plain, or
        causal alone: FlashAttention's (-1, 0) with causal=True)."""
        if self.window is not None:
            return (self.window - 1, 0)
        if self.two_sided:
            return (-1 if self.window_left is None else self.window_left,
                    -1 if self.window_right is None else self.window_right)
        return None

    @property
    def name(self) -> str:
        """A stable short name, used for file names and cache keys."""
        parts: list[str] = []
        if self.split_kv:
            parts.append("decode_splitkv")
        if self.window is not None:
            parts.append(f"window{self.window}")
        elif self.two_sided:  # window64l32r: 64 keys left, 32 right; window128l: 128 left, the right unbounded
            parts.append("window" + "".join(f"{n}{side}" for n, side in ((self.window_left, "l"),
                                                                          (self.window_right, "r")) if n is not None))
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
    # Left out of every dump and repr while unset, so that the records and test ids of D = Dv shapes keep their bytes.
    DV: int | None = Field(default=None, ge=1, description="V's and O's head dim (Dv); None means D")

    @property
    def kv_heads(self) -> int:
        return self.H if self.KVH is None else self.KVH

    @property
    def dv(self) -> int:
        """V's and O's head dim: DV, or D where it is not given."""
        return self.D if self.DV is None else self.DV

    @property
    def sizes(self) -> dict[str, int]:
        """The sizes by the names size expressions and conditions use (B, H, KVH, N, M, D)."""
        return {"B": self.B, "H": self.H, "KVH": self.kv_heads, "N": self.N, "M": self.M, "D": self.D}

    @model_serializer(mode="wrap")
    def _unset_dv_left_out(self, handler):
        data = handler(self)
        if isinstance(data, dict) and data.get("DV", 0) is None:
            del data["DV"]
        return data

    def __repr_args__(self):
        return [(k, v) for k, v in super().__repr_args__() if not (k == "DV" and v is None)]

    @model_validator(mode="after")
    def _heads_divide(self) -> Shape:
        if self.H % self.kv_heads:
            raise ValueError(f"H={self.H} is not a multiple of KVH={self.kv_heads}")
        return self

    @classmethod
    def parse(cls, text: str) -> Shape:
        """Parse 'B=2,H=4,N=200,M=333,D=64[,KVH=2][,DV=128]' (the CLI's --shape)."""
        fields: dict[str, int] = {}
        for item in filter(None, (p.strip() for p in text.split(","))):
            key, sep, value = item.partition("=")
            if not sep or not value.strip().lstrip("-").isdigit():
                raise ValueError(f"bad shape item {item!r}: expected NAME=INTEGER, e.g. B=2,H=4,N=200,M=333,D=64")
            fields[key.strip()] = int(value)
        unknown = set(fields) - set(cls.model_fields)
        if unknown:
            raise ValueError(f"unknown shape field(s) {sorted(unknown)}; known: B, H, N, M, D, KVH, DV")
        return cls(**fields)

    def flops(self, causal: bool = False) -> float:
        """FlashAttention's count: 4*B*H*N*M*D (2*B*H*N*M*(D + Dv) where V has a head dim of its own: Q K^T over
        D, P V over Dv), halved for causal."""
        if self.DV is None:
            f = 4.0 * self.B * self.H * self.N * self.M * self.D
        else:
            f = 2.0 * self.B * self.H * self.N * self.M * (self.D + self.DV)
        return f / 2 if causal else f


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)


#: the head dims every kernel takes: multiples of HEAD_DIM_STEP up to 256. Q, K, V and O rows move in 16-byte
#: chunks (8 elements of 16 bits), so a row is whole chunks exactly when D is a multiple of 8; where the tensor
#: cores' k-step is longer (16), the kernel pads its shared tiles with zero columns (docs/variants.md, "Head dims").
HEAD_DIM_STEP = 8
SUPPORTED_HEAD_DIMS: tuple[int, ...] = tuple(range(HEAD_DIM_STEP, 256 + 1, HEAD_DIM_STEP))
_HEAD_DIM_RULE = (f"head dims are multiples of {HEAD_DIM_STEP} from {SUPPORTED_HEAD_DIMS[0]} to "
                  f"{SUPPORTED_HEAD_DIMS[-1]} (rows move in 16-byte chunks, {HEAD_DIM_STEP} elements of 16 bits; "
                  "pad the tensors' last axis to the next multiple yourself)")


def head_dim_problem(head_dim: int) -> str | None:
    """Why `head_dim` is not a head dim the kernels take (one sentence), or None when it is."""
    return None if head_dim in SUPPORTED_HEAD_DIMS else f"head dim {head_dim} is not supported: {_HEAD_DIM_RULE}"


def check_head_dim(head_dim: int, flag: str | None = None) -> int:
    """`head_dim` itself when the kernels take it, else UsageError (one line; prefixed by the flag a user typed)."""
    problem = head_dim_problem(head_dim)
    if problem is not None:
        raise UsageError(f"{flag} {head_dim}: {_HEAD_DIM_RULE}" if flag else problem)
    return head_dim


def head_dim_v_problem(head_dim_v: int) -> str | None:
    """Why `head_dim_v` (V's and O's head dim, Dv) is not one the kernels take (one sentence), or None: the rule of D."""
    return None if head_dim_v in SUPPORTED_HEAD_DIMS else f"V head dim {head_dim_v} is not supported: {_HEAD_DIM_RULE}"


def check_head_dim_v(head_dim_v: int | None, head_dim: int, flag: str | None = None) -> int | None:
    """V's head dim as the contract carries it: None for none given or one equal to `head_dim` (the kernel of one
    head dim), else `head_dim_v` itself when the kernels take it (the rule of D); UsageError otherwise (one line;
    prefixed by the flag a user typed)."""
    if head_dim_v is None:
        return None
    import numbers

    if isinstance(head_dim_v, bool) or not isinstance(head_dim_v, numbers.Integral):
        raise UsageError(f"{flag or 'head_dim_v'} {head_dim_v!r}: expected an integer head dim")
    head_dim_v = int(head_dim_v)
    problem = head_dim_v_problem(head_dim_v)
    if problem is not None:
        raise UsageError(f"{flag} {head_dim_v}: {_HEAD_DIM_RULE}" if flag else problem)
    return None if head_dim_v == head_dim else head_dim_v


def head_dims_tag(head_dim: int, head_dim_v: int | None) -> str:
    """The head dims in names (kernels, folders, keys): d128, or d192v128 where V has a head dim of its own."""
    return f"d{head_dim}" + (f"v{head_dim_v}" if head_dim_v is not None and head_dim_v != head_dim else "")


def alibi_slope(head: int, heads: int) -> float:
    return 2.0 ** (-8.0 * (head + 1) / heads)


# From the words a user types (CLI flags, flashgen.generate's arguments); a bad one is a UsageError (one line)

class WindowSize(BaseModel):
    """FlashAttention's window_size=(left, right) as a caller gives it: integers, -1 for an unbounded side."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    left: int = Field(ge=-1, description="keys visible before the row's own position; -1: unbounded")
    right: int = Field(ge=-1, description="keys visible after the row's own position; -1: unbounded")

    @model_validator(mode="after")
    def _a_window(self) -> WindowSize:
        if self.left == -1 and self.right == -1:
            raise ValueError("both sides unbounded is no window: leave it out (causal alone for the causal mask)")
        return self

    def fields(self, causal: bool) -> dict:
        """The Variant fields of this window (with `causal` as given): FlashAttention's rules, in canonical form.
        Causal bounds the right side at the row's own position, so it makes the right side 0; a right side of 0
        is the causal window W = left + 1 (causal alone when left is unbounded); else the two-sided form."""
        right = 0 if causal else self.right
        if right == 0:
            return {"causal": True, "window": None if self.left == -1 else self.left + 1}
        return {"causal": False, "window_left": None if self.left == -1 else self.left,
                "window_right": None if right == -1 else right}


def parse_window_size(value, flag: str = "window_size") -> WindowSize:
    """(left, right) (a pair of ints, -1 unbounded) or the CLI's text 'LEFT,RIGHT' -> WindowSize; anything else is
    a UsageError naming `flag`, in one line."""
    from flashgen.errors import pydantic_message, shown

    given = value if isinstance(value, str) else shown(value)
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",")]
        if len(parts) != 2 or not all(p.lstrip("-").isdigit() for p in parts):
            raise UsageError(f"{flag} {value}: expected LEFT,RIGHT, two integers with -1 for an unbounded side "
                             "(e.g. 128,-1 or 64,64), or a single W for the causal window")
        value = tuple(int(p) for p in parts)
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise UsageError(f"{flag} {given}: expected (left, right), two integers with -1 for an unbounded side")
    import numbers

    left, right = (int(x) if isinstance(x, numbers.Integral) and not isinstance(x, bool) else x for x in value)
    try:
        return WindowSize(left=left, right=right)
    except ValidationError as exc:
        first = exc.errors()[0]
        side = "".join(str(x) for x in first.get("loc", ()))
        where = f"{side} {shown(first.get('input'))}" if side else ""
        raise UsageError(f"{flag} {given}: {where + ': ' if where else ''}{pydantic_message(first)}") from None


def make_variant(*, causal: bool = False, window: int | None = None, alibi: bool = False,
                 softcap: float | None = None, norm: str = "softmax", lse: bool = False, kv_group: int = 1,
                 names: dict[str, str] | None = None, window_size=None, split_kv: bool = False) -> Variant:
    """A Variant from the CLI's flags; an impossible combination is a UsageError (one line), a refused field
    named by `names` (field -> flag, e.g. softcap -> --softcap) with the value given and its allowed range.
    `window_size`: FlashAttention's (left, right), -1 unbounded (WindowSize.fields says what it becomes; with
    `window` too it is refused). `split_kv`: split-KV decode, which returns the LSE (its combine needs it)."""
    from flashgen.errors import pydantic_message, shown

    try:
        norm_value = Norm(norm)
    except ValueError:
        raise UsageError(f"unknown norm {norm!r}; choose softmax, relu or sigmoid") from None
    fields = {"causal": causal, "window": window}
    if window_size is not None:
        flag = (names or {}).get("window_size", "window_size")
        if window is not None:
            raise UsageError(f"give {(names or {}).get('window', 'window')} W or {flag} (left, right), not both")
        fields = parse_window_size(window_size, flag).fields(causal)
    if split_kv:
        if fields.get("causal") or fields.get("window") is not None or fields.get("window_left") is not None \
                or fields.get("window_right") is not None:
            raise UsageError(f"{(names or {}).get('split_kv', 'split_kv')}: split-KV decode takes no causal mask or "
                             "window (its program walks every key of its share)")
        lse = True
    try:
        return Variant(**fields, alibi=alibi, softcap=softcap, norm=norm_value, return_lse=lse, kv_group=kv_group,
                       split_kv=split_kv)
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
