"""Pulling TL or CUDA out of a model's reply: prose around it, several fenced blocks, a reply cut off
inside a fence. Blocks are chosen by language tag first, then by what they contain."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel

Kind = Literal["tl", "cuda", "json"]

TAGS: dict[str, frozenset[str]] = {
    "tl": frozenset({"tl", "llm-tl", "llmtl", "llm_tl"}),
    "cuda": frozenset({"cuda", "cu", "cuh", "cpp", "c++", "cxx", "c"}),
    "json": frozenset({"json"}),
}

# A fence opens at the start of a line with ``` or ~~~ (3 or more) and an optional info string, and
# closes with the same character repeated at least as often, alone on its line.
_OPEN = re.compile(r"^[ \t]{0,3}(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*)$", re.MULTILINE)

# the statement keywords of docs/llm-tl.md (flashgen/tl_spec/ast.py)
_TL_LINE = re.compile(r"^\s*(Target|Variant|Params|Kernel|Allocate|Copy|Compute|Reshape|Let|for|end)\b", re.MULTILINE)
_CUDA_ENTRY = re.compile(r"__global__")


class Block(BaseModel):
    tag: str
    code: str
    terminated: bool


class Extracted(BaseModel):
    code: str
    tag: str
    truncated: bool = False
    note: str = ""


def fenced_blocks(text: str) -> list[Block]:
    blocks: list[Block] = []
    pos = 0
    while (m := _OPEN.search(text, pos)) is not None:
        fence = m.group("fence")
        tag = (m.group("info").strip().split() or [""])[0].lower()
        body_start = m.end() + 1
        close = re.compile(rf"^[ \t]{{0,3}}{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", re.MULTILINE)
        c = close.search(text, body_start)
        if c is None:  # the reply was cut off inside this block
            blocks.append(Block(tag=tag, code=text[body_start:].rstrip() + "\n", terminated=False))
            break
        blocks.append(Block(tag=tag, code=text[body_start:c.start()], terminated=True))
        pos = c.end()
    return blocks


def _looks_like(kind: Kind, code: str) -> bool:
    if kind == "tl":
        return len(_TL_LINE.findall(code)) >= 2 and not _CUDA_ENTRY.search(code)
    if kind == "cuda":
        return bool(_CUDA_ENTRY.search(code))
    return code.lstrip().startswith("{")


def extract(text: str, kind: Kind) -> Extracted | None:
    """The best block of `kind` in a reply, or None when there is nothing usable.

    Preference: a block tagged for the kind whose content fits, then any block whose content fits,
    then an unfenced reply whose whole text fits. Among equals, the longest (a model often repeats
    a fragment of the program after the whole of it)."""
    blocks = fenced_blocks(text)
    tagged = [b for b in blocks if b.tag in TAGS[kind]]
    for pool in ([b for b in tagged if _looks_like(kind, b.code)],
                 [b for b in blocks if not b.tag and _looks_like(kind, b.code)],
                 [b for b in blocks if b.tag not in TAGS[kind] and _looks_like(kind, b.code)],
                 tagged if kind == "json" else []):
        if pool:
            best = max(pool, key=lambda b: (b.terminated, len(b.code)))
            note = "" if best.terminated else "the reply ended inside this code block (truncated?)"
            return Extracted(code=best.code, tag=best.tag or kind, truncated=not best.terminated, note=note)
    if not blocks and _looks_like(kind, text):
        return Extracted(code=text.strip() + "\n", tag=kind, note="no code fence: the whole reply was taken as code")
    return None
