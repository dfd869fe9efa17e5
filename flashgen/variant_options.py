"""The command-line options that say which attention variant to build, shared by every command that takes
one (`flashgen generate`, `flashgen tune`), and the one place they become a Variant."""

from __future__ import annotations

from typing import Annotated

import typer

from flashgen.errors import UsageError
from flashgen.variant import Variant, make_variant

Causal = Annotated[bool, typer.Option("--causal", help="causal mask (bottom-right aligned)")]
Window = Annotated[str | None, typer.Option("--window", help="W: the causal sliding window of W keys (needs --causal); "
                                            "LEFT,RIGHT: FlashAttention's window_size, -1 for an unbounded side, "
                                            "e.g. 128,-1 or 64,64 (with --causal the right side is 0)")]
Alibi = Annotated[bool, typer.Option("--alibi", help="ALiBi bias")]
Softcap = Annotated[float | None, typer.Option("--softcap", help="logit softcap C")]
KvHeads = Annotated[int | None, typer.Option("--kv-heads", help="KV heads (GQA/MQA; with --heads)")]
Heads = Annotated[int | None, typer.Option("--heads", help="query heads, to turn --kv-heads into a group")]
KvGroup = Annotated[int | None, typer.Option("--kv-group", help="query heads per KV head (GQA)")]
NormName = Annotated[str, typer.Option("--norm", help="softmax | relu | sigmoid")]
Lse = Annotated[bool, typer.Option("--lse", help="also return the log-sum-exp")]
SplitKv = Annotated[bool, typer.Option("--split-kv", help="split-KV decode: the keys split into chunks computed in "
                                       "parallel, then combined (returns the LSE; no --causal or --window)")]


def kv_group_from(kv_heads: int | None, heads: int | None, kv_group: int | None) -> int:
    """Query heads per KV head, from --kv-heads with --heads, or --kv-group; a bad combination is one line."""
    if kv_heads is None:
        if heads is not None:
            raise UsageError("--heads only matters with --kv-heads")
        return 1 if kv_group is None else kv_group
    if kv_group is not None:
        raise UsageError("give --kv-heads (with --heads) or --kv-group, not both")
    if heads is None:
        raise UsageError("--kv-heads K needs --heads H (the kernel is built for the group size H / K)")
    if heads < 1:
        raise UsageError(f"--heads {heads}: must be at least 1")
    if kv_heads < 1:
        raise UsageError(f"--kv-heads {kv_heads}: must be at least 1")
    if heads % kv_heads:
        raise UsageError(f"--heads {heads} is not a multiple of --kv-heads {kv_heads}")
    return heads // kv_heads


def window_from_option(window: str | int | None) -> tuple[int | None, str | None]:
    """--window's value -> (W, None) for a bare W (the causal sliding window, today's meaning) or (None, 'LEFT,RIGHT')
    for FlashAttention's window_size (flashgen.variant.parse_window_size reads it); anything else is one line."""
    if window is None or isinstance(window, int):
        return window, None
    text = window.strip()
    if "," in text:
        return None, text
    if not text.lstrip("-").isdigit():
        raise UsageError(f"--window {window}: expected W (an integer: the causal window of W keys) or LEFT,RIGHT "
                         "(two integers, -1 for an unbounded side, e.g. 128,-1)")
    return int(text), None


def variant_from_options(*, causal: bool, window: str | int | None, alibi: bool, softcap: float | None,
                         kv_heads: int | None, heads: int | None, kv_group: int | None, norm: str,
                         lse: bool, split_kv: bool = False) -> Variant:
    width, window_size = window_from_option(window)
    return make_variant(causal=causal, window=width, alibi=alibi, softcap=softcap, norm=norm, lse=lse,
                        kv_group=kv_group_from(kv_heads, heads, kv_group), names=FLAGS, window_size=window_size,
                        split_kv=split_kv)


# the flag of each Variant field, so that a refused value is named as the user typed it
FLAGS = {"causal": "--causal", "window": "--window", "alibi": "--alibi", "softcap": "--softcap", "norm": "--norm",
         "kv_group": "--kv-group", "return_lse": "--lse", "window_size": "--window", "split_kv": "--split-kv"}
