"""A library folder: GPU/DTYPE/VARIANT_dHEAD/ per kernel (VARIANT_dHEADvHEADV where V has a head dim of its own) (the files `flashgen generate` writes), `library.json`
(the index: every entry, its key, status, error, target, variant, parameters, which GPU verified and timed it or
"compiled and estimated", verification, timings, the digests of its files; with tuned = "search" also `tuning`: the
parameter search on the entry's GPU, its candidates and their times, or why the parameters are the fallback's) and
`library.md` (the same, readable).

The index holds nothing of the run itself (no dates, no wall times, no machine paths): the same inputs give the
same index, so generated/ can be such a library and its regeneration compared byte for byte.

    lib = flashgen.library.load("generated")
    kernel = lib.pick(gpu="h200", dtype="bf16", variant="causal", head_dim=128)   # a flashgen.api.Kernel
    kernel = lib.pick(gpu="h200", dtype="bf16", head_dim=192, head_dim_v=128)     # V's and O's own head dim
    o = kernel(q, k, v)
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from flashgen.errors import UsageError

INDEX = "library.json"
SUMMARY = "library.md"
FORMAT = 1
COMPILED_AND_ESTIMATED = "compiled and estimated"


class IndexEntry(BaseModel):
    path: str
    target: str
    gpu: str = Field(description="the target's marketing name")
    arch: str
    dtype: str
    variant: str
    variant_fields: dict[str, Any] = Field(default_factory=dict)
    head_dim: int
    head_dim_v: int | None = Field(default=None, description="V's and O's own head dim (none: D's)")
    key: str
    status: Literal["ok", "failed"]
    error: str | None = None
    backend: str | None = None
    parameters: dict[str, Any] = Field(default_factory=dict)
    tuning: dict[str, Any] | None = Field(default=None, description='tuned = "search": source "search" (on: the GPU '
                                          "that searched; shapes, candidates with their times or why each was "
                                          "dropped, winner) or \"fallback\" (note: why; parameters_from: the table "
                                          "they came from); search_key: the search's inputs' key")
    ran_on: dict[str, Any] | str | None = Field(default=None, description="the GPU that verified and timed it "
                                                "(device, name, host), or 'compiled and estimated'")
    verification: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    roofline_ms: float | None = None
    files: dict[str, str] = Field(default_factory=dict, description="file name -> sha256")

    @property
    def time_ms(self) -> float | None:
        return (self.timings or {}).get("time_ms")

    @property
    def speedup(self) -> float | None:
        timings = self.timings or {}
        base = timings.get("baselines_ms") or {}
        return min(base.values()) / timings["time_ms"] if base and timings.get("time_ms") else None


class Index(BaseModel):
    format: int = FORMAT
    spec: dict[str, Any] = Field(default_factory=dict)
    entries: list[IndexEntry] = Field(default_factory=list)

    def by_path(self) -> dict[str, IndexEntry]:
        return {e.path: e for e in self.entries}


def read_index(folder: str | Path, missing_ok: bool = True) -> Index | None:
    path = Path(folder) / INDEX
    if not path.is_file():
        if missing_ok:
            return None
        raise UsageError(f"{folder}: not a kernel library (no {INDEX}; `flashgen library build SPEC --out "
                         f"{folder}` makes one)")
    try:
        return Index.model_validate_json(path.read_text())
    except (ValidationError, ValueError, OSError) as exc:
        first = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc).splitlines()[0]
        raise UsageError(f"{path}: not a library index ({first})") from None


def index_text(index: Index) -> str:
    data = index.model_dump(mode="json")
    data["entries"] = sorted(data["entries"], key=lambda e: e["path"])
    for entry in data["entries"]:  # no `tuning` key where no search was asked for, no `head_dim_v` where V's head
        for key in ("tuning", "head_dim_v"):  # dim is D's (the indexes from before them read the same)
            if entry.get(key) is None:
                entry.pop(key, None)
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def write_index(folder: Path, index: Index) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    _atomic_write(folder / INDEX, index_text(index))


def _ran_on_text(entry: IndexEntry) -> str:
    if isinstance(entry.ran_on, dict):
        where = entry.ran_on.get("host")
        return f"GPU {entry.ran_on.get('device')} ({entry.ran_on.get('name')}{', ' + where if where else ''})"
    return entry.ran_on or "-"


def tuning_text(entry: IndexEntry) -> str:
    """Where a tuned = "search" entry's parameters came from, in a few words ('' for the other modes)."""
    tuning = entry.tuning or {}
    if tuning.get("source") == "search":
        on = tuning.get("on") or {}
        timed = sum("geomean_ms" in c for c in tuning.get("candidates", []))
        return f"search on GPU {on.get('device')} ({on.get('name')}): {timed} of {len(tuning.get('candidates', []))} " \
               "candidates timed"
    if tuning.get("source") == "fallback":
        return f"fallback ({tuning.get('note', '')})"
    return ""


def summary_markdown(index: Index) -> str:
    entries = sorted(index.entries, key=lambda e: e.path)
    ok = sum(e.status == "ok" for e in entries)
    timed = sum(e.time_ms is not None for e in entries)
    lines = ["# Kernel library", "",
             f"{len(entries)} entries: {ok} built, {len(entries) - ok} failed; {timed} verified and timed on their GPU, "
             f"the others compiled and estimated (the roofline bound at B=4, H=16, N=M=4096). Written by "
             "`flashgen library build`; the index is library.json.", "",
             "| entry | status | code path | parameters | ran on | time ms | x best baseline | roofline ms |",
             "|---|---|---|---|---|---|---|---|"]
    for e in entries:
        params = " ".join(f"{k}={v}" for k, v in sorted(e.parameters.items())) or "-"
        if tuning_text(e):
            params += f" ({tuning_text(e)})"
        time = f"{e.time_ms:.4g}" if e.time_ms is not None else "-"
        speed = f"{e.speedup:.2f}" if e.speedup is not None else "-"
        roof = f"{e.roofline_ms:.3g}" if e.roofline_ms is not None else "-"
        status = e.status if e.status == "ok" else f"failed: {(e.error or '').splitlines()[0][:120]}"
        lines.append(f"| {e.path} | {status} | {e.backend or '-'} | {params} | {_ran_on_text(e)} | {time} | {speed} "
                     f"| {roof} |")
    return "\n".join(lines) + "\n"


def write_summary(folder: Path, index: Index) -> None:
    _atomic_write(folder / SUMMARY, summary_markdown(index))


# ------------------------------------------------------------------------------------------------ using one


class Library:
    """A library folder, read: `pick` the kernel for a call."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.index = read_index(self.folder, missing_ok=False)
        self.entries = self.index.by_path()

    def __repr__(self) -> str:
        return f"Library({str(self.folder)!r}, {len(self.entries)} entries)"

    def pick(self, gpu: str | None = None, dtype: str = "fp16", head_dim: int = 128, variant: str | None = None,
             *, causal: bool | None = None, head_dim_v: int | None = None):
        """The library's kernel (a flashgen.api.Kernel) for a call on `gpu` (default: the GPU present, CUDA device 0)
        in `dtype`, `variant` (a generated/ name: plain, causal, ...; or causal=True), head dim and V's head dim
        (`head_dim_v`, None: the head dim's). A UsageError says what the library holds for that GPU when nothing
        fits, or why the entry that would fit failed."""
        from flashgen.targets import get_target
        from flashgen.variant import head_dims_tag, parse_dtype

        if gpu is None:
            from flashgen.library.gpus import local_gpus

            found = local_gpus()
            if not found:
                raise UsageError("no GPU here to pick a kernel for: name one (pick(gpu='h200', ...))")
            if found[0].target is None:
                raise UsageError(f"GPU 0 is a {found[0].name}, which is no target of the table "
                                 "(`flashgen targets detect` writes its file)")
            gpu = found[0].target
        target = get_target(gpu).name
        variant = variant or ("causal" if causal else "plain")
        dtype = parse_dtype(dtype).value
        dims = head_dims_tag(head_dim, head_dim_v)
        path = f"{target}/{dtype}/{variant}_{dims}"
        entry = self.entries.get(path)
        if entry is None:
            have = sorted(p.split("/", 1)[1] for p in self.entries if p.startswith(target + "/"))
            held = f"it holds for {target}: {', '.join(have)}" if have else \
                f"it holds no kernel for {target} (GPUs: {', '.join(sorted({p.split('/')[0] for p in self.entries}))})"
            raise UsageError(f"no kernel for {target} {dtype} {variant} {dims} in {self.folder}; {held}")
        if entry.status != "ok":
            raise UsageError(f"{self.folder}/{path}: this entry failed to build: {entry.error}")
        return load_kernel(self.folder / path)


def load_kernel(folder: Path):
    from flashgen.abi import KernelManifest
    from flashgen.api import Kernel

    read = lambda name: (folder / name).read_text()  # noqa: E731
    return Kernel(tl=read("kernel.tl"), sketch=read("sketch.tl"), source=read("kernel.cu"),
                  manifest=KernelManifest.model_validate_json(read("manifest.json")), report=read("report.md"),
                  meta=json.loads(read("meta.json")), out_dir=folder)


def load(folder: str | Path) -> Library:
    return Library(folder)


# ------------------------------------------------------------------------------------------------ diff


class DiffRow(BaseModel):
    path: str
    change: Literal["added", "removed", "changed", "same"]
    what: list[str] = Field(default_factory=list)
    old_ms: float | None = None
    new_ms: float | None = None

    @property
    def speed(self) -> float | None:
        """old time / new time: above 1, the new kernel is faster."""
        return self.old_ms / self.new_ms if self.old_ms and self.new_ms else None


def diff(old: str | Path, new: str | Path) -> list[DiffRow]:
    """Entry by entry, what changed between two libraries (files, status, parameters, where it ran) and the speed
    of each changed kernel where both were timed."""
    a, b = read_index(old, missing_ok=False).by_path(), read_index(new, missing_ok=False).by_path()
    rows = []
    for path in sorted(a.keys() | b.keys()):
        x, y = a.get(path), b.get(path)
        if x is None or y is None:
            e = x or y
            rows.append(DiffRow(path=path, change="added" if x is None else "removed",
                                old_ms=x.time_ms if x else None, new_ms=y.time_ms if y else None,
                                what=[e.status] if e.status != "ok" else []))
            continue
        what = [f"{name}" for name in sorted(x.files.keys() | y.files.keys()) if x.files.get(name) != y.files.get(name)]
        if x.status != y.status:
            what.insert(0, f"status {x.status} -> {y.status}")
        if x.parameters != y.parameters:
            what.append("parameters " + " ".join(f"{k}={v}" for k, v in sorted(y.parameters.items())))
        if (x.tuning or {}).get("source") != (y.tuning or {}).get("source"):
            what.append(f"parameters from {(y.tuning or {}).get('source') or 'the tables'}")
        if (x.time_ms is None) != (y.time_ms is None):
            what.append("timed" if y.time_ms is not None else "no longer timed")
        rows.append(DiffRow(path=path, change="changed" if what else "same", what=what, old_ms=x.time_ms,
                            new_ms=y.time_ms))
    return rows
