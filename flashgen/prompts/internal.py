"""What a model cannot use: the package's own names (modules, files, classes, functions), found in a prompt, and
removed from the documents a prompt quotes (the language reference, the ABI header).

A prompt speaks of the task, the language and the hardware only. `internal_names()` is built from the package's
source itself (so a new module or class is covered the day it lands): module paths (`flashgen.harness.store`,
`flashgen/abi.py`, `plan.py`, `library.render`), class names with two capitals or more (`KernelPlan`; one-word
classes such as `Environment` are English too), function names with an underscore (`choose_params`), and the docs'
file names (`docs/translators.md`, which a model cannot open). What the model does use is exempt: the TL's
keywords and functions, the ABI's struct and field names, the manifest's fields, and any identifier defined in the
code a prompt shows (the worked example's CUDA defines its own helpers)."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
DOCS_FILE = re.compile(r"\b(?:docs/)?[\w.-]+\.md\b")
PY_FILE = re.compile(r"\b[\w/.-]*\w\.py\b")
_PTX = frozenset({"wgmma", "mma", "cp", "ld", "st", "ldmatrix", "mbarrier", "bar", "cvt", "fence", "red", "atom"})
_DEFINITION = re.compile(r"^[ \t]*(class|def|async[ \t]+def)[ \t]+(\w+)", re.MULTILINE)  # faster than ast, as good here
_IDENT = re.compile(r"\b[A-Za-z_]\w*\b")
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        found.append((".".join(parts), path))
    return found


@lru_cache(maxsize=1)
def model_vocabulary() -> frozenset[str]:
    """Names a model may read and write: the TL's keywords, functions and names, the manifest's and the variant's
    fields, the ABI header's identifiers."""
    from flashgen.abi import ABI_HEADER, KernelManifest
    from flashgen.operators import FUNCTIONS
    from flashgen.tl_spec.parser import KEYWORDS

    words = set(KEYWORDS) | set(FUNCTIONS) | {"OnlineSoftmax", "GEMM", "KV_GROUP", "BLOCK_M", "BLOCK_N", "WARPS",
                                              "STAGES", "SPLITS", "Q_IN_REGS", "GROUP_HEADS"}
    schema = KernelManifest.model_json_schema()
    for node in [schema, *schema.get("$defs", {}).values()]:
        words |= set(node.get("properties", {}))
    words |= set(_IDENT.findall(_without_c_comments(ABI_HEADER.read_text())))
    return frozenset(words)


@lru_cache(maxsize=1)
def internal_names() -> frozenset[str]:
    """The package's module paths, module-qualified names, classes (two capitals or more) and functions (with an
    underscore), less the model's vocabulary."""
    names: set[str] = set()
    for dotted, path in _modules():
        if "." in dotted:  # not the bare package name: `flashgen tl check` is a command, and in the CUDA's fg_ names
            names.add(dotted)
            names.add(dotted.replace(".", "/"))
        for kind, name in _DEFINITION.findall(path.read_text()):
            if (kind == "class" and sum(c.isupper() for c in name) >= 2) or (kind != "class" and "_" in name.strip("_")):
                names.add(name)
    return frozenset(names - model_vocabulary())


@lru_cache(maxsize=1)
def _module_basenames() -> frozenset[str]:
    return frozenset(dotted.rsplit(".", 1)[-1] for dotted, _ in _modules() if "." in dotted)


@lru_cache(maxsize=1)
def _pattern() -> re.Pattern[str]:
    plain = sorted((n for n in internal_names() if "/" not in n and "." not in n), key=len, reverse=True)
    paths = sorted((n for n in internal_names() if "/" in n or "." in n), key=len, reverse=True)
    # library.render, plan.backend: a module's attribute (not a header file, sm75.cuh, or wgmma.mma_async, PTX)
    qualified = sorted(_module_basenames() - _PTX, key=len, reverse=True)
    return re.compile(
        r"(?<![\w/.])(?:" + "|".join(map(re.escape, paths)) + r")(?![\w/])"  # flashgen.harness.store, flashgen/abi
        + r"|" + PY_FILE.pattern + r"|" + DOCS_FILE.pattern
        + r"|(?<![\w.])(?:" + "|".join(map(re.escape, qualified)) + r")\.(?!(?:cuh|cu|h|tl|json)\b)[A-Za-z_]\w*"
        + r"|(?<![\w.])(?:" + "|".join(map(re.escape, plain)) + r")\b")


def _without_c_comments(code: str) -> str:
    return re.sub(r"//[^\n]*|/\*.*?\*/", " ", code, flags=re.DOTALL)


def code_identifiers(text: str) -> set[str]:
    """Identifiers of the code (comments left out) in the text's fenced blocks: what the prompt shows the model."""
    return {w for block in _FENCE.findall(text) for w in _IDENT.findall(_without_c_comments(block))}


def find_internal(text: str) -> list[str]:
    """Every internal name in `text`, with a little context each: `name` in '... context ...'."""
    shown = code_identifiers(text)
    hits = []
    for m in _pattern().finditer(text):
        if m.group(0) in shown or m.group(0).split(".")[0] in shown:
            continue
        start, end = max(0, m.start() - 50), min(len(text), m.end() + 50)
        context = " ".join(text[start:end].split())
        hits.append(f"`{m.group(0)}` in '... {context} ...'")
    return hits


# ------------------------------------------------------------------------------------------------- for_model

def _masked(text: str) -> str:
    """`text` with the inside of every `code span` blanked (same length), so that brackets, commas and full stops
    in code do not count as prose punctuation."""
    return re.sub(r"`[^`\n]*`", lambda m: "`" + "x" * (len(m.group(0)) - 2) + "`", text)


def _span_around(masked: str, start: int, end: int) -> tuple[int, int]:
    """The code span holding [start, end), or the hit itself."""
    left = masked.rfind("`", 0, start + 1)
    if left != -1 and masked.count("`", 0, left) % 2 == 0:
        right = masked.find("`", left + 1)
        if right != -1 and right >= end - 1:
            return left, right + 1
    return start, end


def _enclosing_paren(masked: str, start: int, end: int) -> tuple[int, int] | None:
    """The parenthesis (inside one paragraph) that holds [start, end), as (open, close + 1)."""
    depth, i = 0, start - 1
    while i >= 0 and masked[i:i + 2] != "\n\n":
        if masked[i] == ")":
            depth += 1
        elif masked[i] == "(":
            if depth == 0:
                break
            depth -= 1
        i -= 1
    if i < 0 or masked[i] != "(":
        return None
    depth, j = 0, end
    while j < len(masked) and masked[j:j + 2] != "\n\n":
        if masked[j] == "(":
            depth += 1
        elif masked[j] == ")":
            if depth == 0:
                return i, j + 1
            depth -= 1
        j += 1
    return None


def _split_top(masked: str, lo: int, hi: int, sep: str) -> list[tuple[int, int]]:
    """[lo, hi) cut at `sep` (';' or ',' and the white space after it, a line break too) outside brackets: the
    pieces' bounds, separators left out."""
    pieces, depth, begin, i = [], 0, lo, lo
    while i < hi:
        c = masked[i]
        depth += (c in "([") - (c in ")]")
        if depth == 0 and c == sep and i + 1 < hi and masked[i + 1].isspace():
            pieces.append((begin, i))
            i += 1
            while i < hi and masked[i].isspace():
                i += 1
            begin = i
            continue
        i += 1
    pieces.append((begin, hi))
    return pieces


def _drop_pieces(masked: str, lo: int, hi: int, hit: int, seps: str = ";,:") -> tuple[int, int] | None:
    """Within [lo, hi), the innermost ';', ',' or ':' piece holding the hit, as the bounds to remove (with one
    separator); None when the hit's piece is all of [lo, hi)."""
    for n, sep in enumerate(seps):
        pieces = _split_top(masked, lo, hi, sep)
        if len(pieces) < 2:
            continue
        k = next(i for i, (a, b) in enumerate(pieces) if a <= hit <= b)
        a, b = pieces[k]
        if (inner := _drop_pieces(masked, a, b, hit, seps[n + 1:])) is not None:
            return inner
        return (pieces[k - 1][1], b) if k == len(pieces) - 1 else (a, pieces[k + 1][0])
    return None


def for_model(text: str) -> str:
    """A document as a model may read it: every internal name removed with the words that carry it (the piece of
    a parenthesis that names it, else the whole parenthesis; outside one, the trailing clause, else the sentence).
    The rest, code blocks included, is left as written."""
    for _ in range(50):
        masked = _masked(text)
        hit = next((m for m in _pattern().finditer(text) if _outside_fences(text, m.start())), None)
        if hit is None:
            return text
        start, end = _span_around(masked, hit.start(), hit.end())
        paren = _enclosing_paren(masked, start, end)
        if paren is not None:
            cut = _drop_pieces(masked, paren[0] + 1, paren[1] - 1, start)
            if cut is None:  # the whole parenthesis, with the space before it
                cut = (paren[0] - (text[paren[0] - 1:paren[0]] == " "), paren[1])
        else:  # the sentence: from the last full stop, paragraph or table cell before the hit to the next stop
            lo = max([0] + [at + 2 for at in (masked.rfind(mark, 0, start) for mark in (". ", "\n\n", "| "))
                            if at != -1])
            stop = min(x for x in (masked.find(". ", end), masked.find(".\n", end), masked.find("\n\n", end),
                                   len(text)) if x != -1)
            cut = _drop_pieces(masked, lo, stop, start)
            if cut is None or cut[0] == lo:  # the hit is in the sentence's main clause: the whole sentence
                cut = (lo, stop + 1 if text[stop:stop + 1] == "." else stop)
        text = text[:cut[0]] + text[cut[1]:]
    raise RuntimeError("for_model: internal names left after 50 removals")


def _outside_fences(text: str, offset: int) -> bool:
    return text.count("\n```", 0, offset) % 2 == 0 and not text.startswith("```")


_LINE_COMMENT = re.compile(r"^([ \t]*//[ \t]?)(.*)$")


def for_model_code(source: str) -> str:
    """C/CUDA source as a model may read it: each paragraph of `//` comment lines that names an internal name is
    cleaned as prose (for_model), line by line as it was written (a line left empty goes). Code and the other
    comments stay as written."""
    lines, out, i = source.split("\n"), [], 0
    while i < len(lines):
        m = _LINE_COMMENT.match(lines[i])
        if m is None:
            out.append(lines[i])
            i += 1
            continue
        prefix, j = m.group(1), i
        while j < len(lines) and (n := _LINE_COMMENT.match(lines[j])) and n.group(1) == prefix:
            j += 1
        block = lines[i:j]
        prose = "\n".join(_LINE_COMMENT.match(line).group(2) for line in block)
        if _pattern().search(prose):
            kept = [" ".join(line.split()) for line in for_model(prose).split("\n")]
            block = [prefix + line for line in kept if line]
        out.extend(block)
        i = j
    return "\n".join(out)
