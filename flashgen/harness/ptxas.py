"""Parsers for what nvcc prints: the ptxas resource report (`-Xptxas -v`) and diagnostics.

Formats handled (nvcc 11..13):
- front end:  `FILE(LINE): error: MSG`, `FILE(LINE): warning #177-D: MSG`, `FILE(LINE:COL): ...`,
              `FILE(LINE): catastrophic error: MSG`, `At end of source: error: MSG`, each followed by
              optional continuation lines, the source line and a caret line under the column;
- host compiler style `FILE:LINE:COL: error: MSG`;
- ptxas:      `ptxas FILE.ptx, line N; error   : MSG`, `ptxas fatal   : MSG`, `ptxas warning : MSG`;
- ptxas info lines that say wgmma is serialized, e.g. `ptxas info    : (C7520) Potential Performance Loss:
              wgmma.mma_async instructions are serialized due to ... in the function 'NAME'` (C7510..C7520):
              a warning with the line's code (the kernel runs 20-30 % slower). Every other info line is ignored:
              the resource report (parse_resource_report reads it), `(C7519) warpgroup.arrive is injected ...`
              (every sm_90a wgmma kernel has it), compile times;
- nvlink:     `nvlink error   : MSG`, `nvlink fatal   : MSG`;
- the driver: `nvcc fatal   : MSG`, `nvcc error   : MSG`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Literal

from pydantic import BaseModel, Field


class ResourceUsage(BaseModel):
    """What ptxas reports for one function."""

    name: str = Field(description="the symbol (what cuModuleGetFunction takes)")
    demangled: str | None = Field(default=None, description="C++ name for a mangled symbol; the symbol for extern \"C\"")
    arch: str | None = None
    is_entry: bool = True
    registers: int = 0
    barriers: int = 0
    shared_static_bytes: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    stack_frame_bytes: int = 0
    cumulative_stack_bytes: int = 0
    const_bytes: int = Field(default=0, description="sum over constant banks (cmem[0] holds the parameters)")

    @property
    def spills(self) -> bool:
        return self.spill_store_bytes > 0 or self.spill_load_bytes > 0


Severity = Literal["error", "warning", "catastrophic error", "fatal", "timeout"]


class CompileError(BaseModel):
    """One diagnostic, located in the source where the tool says where."""

    tool: Literal["nvcc", "ptxas", "nvlink", "host", "harness"] = "nvcc"
    file: str | None = None
    line: int | None = None
    column: int | None = None
    severity: Severity = "error"
    code: str | None = Field(default=None, description="diagnostic number, e.g. 177-D or C7515")
    message: str
    excerpt: str = Field(default="", description="up to 3 source lines around `line`, the line itself marked with '>'")

    def location(self) -> str:
        where = self.file or self.tool
        if self.line is not None:
            where += f":{self.line}" + (f":{self.column}" if self.column is not None else "")
        return where

    def __str__(self) -> str:
        code = f" [{self.code}]" if self.code else ""
        return f"{self.location()}: {self.severity}{code}: {self.message}"


# ------------------------------------------------------------------------------------------ ptxas -v

_ENTRY = re.compile(r"^ptxas info\s*: Compiling entry function '([^']+)' for '(\w+)'")
_PROPS = re.compile(r"^ptxas info\s*: Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"^ptxas info\s*: Used (\d+) registers(.*)$")


def parse_resource_report(text: str) -> dict[str, ResourceUsage]:
    """Every function ptxas describes in `text`, keyed by symbol. Entry kernels have is_entry=True."""
    found: dict[str, dict] = {}
    entries: set[str] = set()
    current: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if m := _ENTRY.match(line):
            current = m.group(1)
            entries.add(current)
            found.setdefault(current, {"name": current})["arch"] = m.group(2)
        elif m := _PROPS.match(line):
            current = m.group(1)
            found.setdefault(current, {"name": current})
        elif (m := _FRAME.search(line)) and current is not None:
            found[current].update(stack_frame_bytes=int(m.group(1)), spill_store_bytes=int(m.group(2)),
                                  spill_load_bytes=int(m.group(3)))
        elif (m := _USED.match(line)) and current is not None:
            rest = m.group(2)
            info = found[current]
            info["registers"] = int(m.group(1))
            if b := re.search(r"used (\d+) barriers", rest):
                info["barriers"] = int(b.group(1))
            if s := re.search(r"(\d+) bytes smem", rest):
                info["shared_static_bytes"] = int(s.group(1))
            if c := re.search(r"(\d+) bytes cumulative stack size", rest):
                info["cumulative_stack_bytes"] = int(c.group(1))
            info["const_bytes"] = sum(int(v) for v in re.findall(r"(\d+) bytes cmem\[\d+\]", rest))
    usages = {name: ResourceUsage(is_entry=name in entries, **info) for name, info in found.items()}
    demangled = demangle([n for n in usages if n.startswith("_Z")])
    for name, usage in usages.items():
        usage.demangled = demangled.get(name, name)
    return usages


def demangle(symbols: list[str]) -> dict[str, str]:
    """C++ names for mangled symbols, through c++filt (or CUDA's cu++filt); {} when neither exists."""
    if not symbols:
        return {}
    tool = shutil.which("cu++filt") or shutil.which("c++filt")
    if tool is None:
        return {}
    try:
        done = subprocess.run([tool], check=False, input="\n".join(symbols) + "\n", capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return {}
    names = done.stdout.splitlines()
    return dict(zip(symbols, names)) if done.returncode == 0 and len(names) == len(symbols) else {}


# ---------------------------------------------------------------------------------------- diagnostics

_FRONTEND = re.compile(r"^(?P<file>[^\s(][^(]*?)\((?P<line>\d+)(?::(?P<col>\d+))?\): "
                       r"(?P<sev>catastrophic error|error|warning|remark)(?: #(?P<code>[\w-]+))?: (?P<msg>.*)$")
_END_OF_SOURCE = re.compile(r"^At end of source: (?P<sev>error|warning|catastrophic error)(?: #(?P<code>[\w-]+))?: "
                            r"(?P<msg>.*)$")
_HOST = re.compile(r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?P<col>\d+): (?P<sev>fatal error|error|warning): (?P<msg>.*)$")
_TOOL = re.compile(r"^(?P<tool>ptxas|nvlink|nvcc)(?: (?P<file>[^,]+), line (?P<line>\d+);)? ?"
                   r"(?P<sev>error|fatal|warning)\s*: (?P<msg>.*)$")
_PTXAS_CODE = re.compile(r"^\((?P<code>C\d+)\)\s*(?P<msg>.*)$")
_PTXAS_INFO = re.compile(r"^ptxas(?: (?P<file>[^,]+), line (?P<line>\d+);)? ?info\s*: (?P<msg>.*)$")
_CARET = re.compile(r"^\s*\^\s*$")


def parse_diagnostics(log: str, sources: dict[str, str] | None = None) -> list[CompileError]:
    """Errors and warnings in an nvcc log, in order. `sources` maps a file name as nvcc prints it to
    its text, to attach excerpts and to check the caret column against the real line."""
    sources = sources or {}
    lines = log.splitlines()
    out: list[CompileError] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        m = _FRONTEND.match(line) or _END_OF_SOURCE.match(line)
        if m:
            block: list[str] = []
            j = i + 1
            while j < len(lines) and lines[j].strip() and not _starts_diagnostic(lines[j]):
                block.append(lines[j])
                j += 1
            fields = m.groupdict()
            severity = fields["sev"]
            if severity != "remark":
                out.append(_frontend_error(fields, block, sources))
            i = j
            continue
        if m := _HOST.match(line):
            sev = "error" if "error" in m["sev"] else "warning"
            out.append(_located("host", m["file"], int(m["line"]), int(m["col"]), sev, None, m["msg"], sources))
        elif (m := _TOOL.match(line)) or (m := _PTXAS_INFO.match(line)):
            tool = m.groupdict().get("tool", "ptxas")
            sev = m.groupdict().get("sev", "info")
            msg, code = m["msg"].strip(), None
            if c := _PTXAS_CODE.match(msg):
                code, msg = c["code"], c["msg"]
            if sev == "info":
                if not serialized_wgmma(msg):
                    i += 1  # resource report, injected warpgroup.arrive, compile time: not a diagnostic
                    continue
                sev = "warning"  # a silent 20-30 % slowdown: reported like a ptxas warning
            if tool == "ptxas" and sev == "fatal" and msg.startswith("Ptx assembly aborted"):
                i += 1  # a summary of the errors above it
                continue
            file = m["file"]
            if file is not None:
                file = file.rsplit("/", 1)[-1]
            out.append(CompileError(tool=tool, file=file, line=int(m["line"]) if m["line"] else None,
                                    severity=sev, code=code, message=msg))
        i += 1
    return out


def serialized_wgmma(message: str) -> bool:
    """Whether a ptxas info message says the kernel's wgmma are serialized (the one kind of info line reported;
    its wording and code vary: C7510..C7520, "wgmma.mma_async instructions are serialized due to ...")."""
    text = message.lower()
    return "wgmma" in text and "serializ" in text


def _starts_diagnostic(line: str) -> bool:
    return bool(_FRONTEND.match(line) or _END_OF_SOURCE.match(line) or _HOST.match(line) or _TOOL.match(line)
                or _PTXAS_INFO.match(line)
                or line.startswith("Remark: ") or re.match(r"^\d+ errors? detected", line))


def _frontend_error(fields: dict, block: list[str], sources: dict[str, str]) -> CompileError:
    message = fields["msg"].strip()
    column = int(fields["col"]) if fields.get("col") else None
    shown: str | None = None
    if len(block) >= 2 and _CARET.match(block[-1]):
        shown, caret = block[-2], block[-1]
        block = block[:-2]
        if column is None:
            column = caret.index("^") - 1  # nvcc indents the echoed line by 2; columns are 1-based
    extra = " ".join(b.strip() for b in block if b.strip())
    if extra:
        message = f"{message} ({extra})"
    file = fields.get("file")
    line_no = int(fields["line"]) if fields.get("line") else None
    err = _located("nvcc", file, line_no, column, fields["sev"], fields.get("code"), message, sources)
    # The echoed line is after macro expansion (e.g. __global__ -> __attribute__((global))): a caret
    # column is only trusted when the echo is the source line itself.
    if shown is not None and fields.get("col") is None and err.column is not None:
        real = _source_line(sources, file, line_no)
        if real is None or shown[2:].rstrip() != real.rstrip():
            err.column = None
    return err


def _source_line(sources: dict[str, str], file: str | None, line_no: int | None) -> str | None:
    text = sources.get(file or "")
    if text is None or line_no is None:
        return None
    rows = text.splitlines()
    return rows[line_no - 1] if 1 <= line_no <= len(rows) else None


def _located(tool: str, file: str | None, line_no: int | None, column: int | None, severity: str, code: str | None,
             message: str, sources: dict[str, str]) -> CompileError:
    return CompileError(tool=tool, file=file, line=line_no, column=column, severity=severity, code=code,
                        message=message, excerpt=excerpt(sources.get(file or ""), line_no))


def excerpt(text: str | None, line_no: int | None, context: int = 1) -> str:
    """Lines line_no-context .. line_no+context of `text`, numbered, the line itself marked with '>'."""
    if text is None or line_no is None:
        return ""
    rows = text.splitlines()
    if not 1 <= line_no <= len(rows):
        return ""
    lo, hi = max(1, line_no - context), min(len(rows), line_no + context)
    width = len(str(hi))
    return "\n".join(f"{'>' if n == line_no else ' '} {n:>{width}} | {rows[n - 1]}" for n in range(lo, hi + 1))


_LOC = re.compile(r"^\s*\.loc\s+(\d+)\s+(\d+)\s+(\d+)")
_FILE = re.compile(r'^\s*\.file\s+(\d+)\s+"([^"]+)"')


def locate_ptx_errors(errors: list[CompileError], ptx: str, sources: dict[str, str]) -> None:
    """Point ptxas errors (which name a PTX line) at the source line of the nearest preceding `.loc`
    (present with -lineinfo), keeping the PTX line's text in the message. Edits `errors` in place."""
    rows = ptx.splitlines()
    files: dict[str, str] = {}
    for row in rows:
        if m := _FILE.match(row):
            files[m.group(1)] = m.group(2)
    for err in errors:
        if err.tool != "ptxas" or err.line is None or not 1 <= err.line <= len(rows):
            continue
        ptx_line = err.line
        err.message += f' (PTX line {ptx_line}: "{rows[ptx_line - 1].strip()}")'
        for n in range(ptx_line - 1, 0, -1):
            if m := _LOC.match(rows[n - 1]):
                path = files.get(m.group(1), "")
                name = next((key for key in sources if path == key or path.endswith("/" + key)), None)
                if name is not None and int(m.group(2)) > 0:
                    err.file, err.line = name, int(m.group(2))
                    err.column = int(m.group(3)) or None
                    err.excerpt = excerpt(sources[name], err.line)
                break
