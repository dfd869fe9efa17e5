"""The command-line options that say which attention variant to build, shared by every command that takes
one (`flashgen generate`, `flashgen tune`), and the one place they become a Variant."""

from __future__ import annotations

from typing import Annotated

import typer

from flashgen.errors import UsageError
from flashgen.variant import Variant, make_variant

Causal = Annotated[bool, typer.Option("--causal", help="causal mask (bottom-right aligned)")]
Window = Annotated[int | None, typer.Option("--window", help="sliding window in keys (needs --causal)")]
Alibi = Annotated[bool, typer.Option("--alibi", help="ALiBi bias")]
Softcap = Annotated[float | None, typer.Option("--softcap", help="logit softcap C")]
KvHeads = Annotated[int | None, typer.Option("--kv-heads", help="KV heads (GQA/MQA; with --heads)")]
Heads = Annotated[int | None, typer.Option("--heads", help="query heads, to turn --kv-heads into a group")]
KvGroup = Annotated[int | None, typer.Option("--kv-group", help="query heads per KV head (GQA)")]
NormName = Annotated[str, typer.Option("--norm", help="softmax | relu | sigmoid")]
Lse = Annotated[bool, typer.Option("--lse", help="also return the log-sum-exp")]


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


def variant_from_options(*, causal: bool, window: int | None, alibi: bool, softcap: float | None,
                         kv_heads: int | None, heads: int | None, kv_group: int | None, norm: str,
                         lse: bool) -> Variant:
    return make_variant(causal=causal, window=window, alibi=alibi, softcap=softcap, norm=norm, lse=lse,
                        kv_group=kv_group_from(kv_heads, heads, kv_group), names=FLAGS)


# the flag of each Variant field, so that a refused value is named as the user typed it
FLAGS = {"causal": "--causal", "window": "--window", "alibi": "--alibi", "softcap": "--softcap", "norm": "--norm",
         "kv_group": "--kv-group", "return_lse": "--lse"}
