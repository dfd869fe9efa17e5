"""nvcc → cubin, with a content-addressed cache and structured errors.

`compile_cuda(source, arch)` compiles one translation unit for one architecture with
`-cubin -O3 -std=c++17 -lineinfo -Xptxas -v`, the ABI header's folder and (when they exist) the
translators' shared include folder and each translator backend's on the include path. Fast math is OFF by default: `--use_fast_math`
turns expf/tanhf/divisions into approximate forms (ex2.approx, rcp.approx, flush-to-zero) that move
results by a few ulp and change how denormals and huge softcap arguments behave; correctness comes
first, so a translator that wants it passes `options=["--use_fast_math"]` (it is then part of the
cache key, and verification judges the result).

The nvcc used is $FLASHGEN_NVCC, else `nvcc` on PATH, else /usr/local/cuda/bin/nvcc.
The cache lives in $FLASHGEN_CACHE_DIR, else ~/.cache/flashgen/cubin. Its key is a sha256 over
everything that affects the binary: the source and its file name, arch, options, the fixed flags,
the `nvcc --version` text and the contents of every file in the project include folders.
Deterministic failures are cached too (a model that repeats itself gets the same errors at once);
timeouts and crashed tools are not.

The source is untrusted (a model may have written it). Before nvcc runs, `static_check.file_access_issues` refuses
whatever could make the preprocessor read another file (computed, absolute or '..' includes, #include_next,
#import, #embed, __has_include, pragmas outside a short list, _Pragma, token pasting, #line, .incbin/.include).
nvcc then runs in the build folder (its cwd) with a scrubbed environment (PATH, LD_LIBRARY_PATH and NVCC_CCBIN
when set; HOME and TMPDIR the build folder; LC_ALL=C), and the device pass's preprocessor writes the list of the
files it opened (`-Xcompiler -MD`): a file outside the build folder, the project's include folders, the CUDA
toolkit and the host compiler's system include folders, or an assembler file directive in the preprocessed
source's string literals, refuses the result and withholds everything nvcc printed. What comes back is scrubbed:
paths in the build folder are given relative, the project's headers by their repository path, the toolkit's as
<cuda>/..., system headers as <system>/..., any other absolute path as <path>; the log is cut to LOG_LIMIT
characters, each message to MESSAGE_LIMIT and the diagnostics kept to MAX_DIAGNOSTICS.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from pydantic import BaseModel, Field

from flashgen.abi import ABI_HEADER
from flashgen.errors import FlashgenError, UsageError, join_lines_capped
from flashgen.harness.ptxas import (
    CompileError,
    ResourceUsage,
    locate_ptx_errors,
    parse_diagnostics,
    parse_resource_report,
)
from flashgen.harness.static_check import file_access_issues
from flashgen.targets import TARGETS, gencode_flags

__all__ = ["ARCH_FLAGS", "CompileError", "CompileResult", "CompilerNotFound", "ResourceUsage", "compile_cuda",
           "default_cache_dir", "include_dirs", "nvcc_version"]

CACHE_FORMAT = 3  # 2: scrubbed logs and the file checks (entries of format 1 may hold host paths); 3: ptxas's
# serialized-wgmma info line among the warnings (entries of format 2 were parsed without it)
LOG_LIMIT = 4096
MESSAGE_LIMIT = 600
MAX_DIAGNOSTICS = 40
# the environment nvcc sees: these when set, nothing else (API keys and NVCC_PREPEND_FLAGS/NVCC_APPEND_FLAGS stay out)
PASSED_ENV = ("PATH", "LD_LIBRARY_PATH", "NVCC_CCBIN")

# The archs compile_cuda builds for (sm_90a: wgmma and setmaxnreg exist only in the arch-specific target); the flags
# are flashgen.targets.gencode_flags, which a translator backend's nvcc_flags(target) also gives.
ARCH_FLAGS: dict[str, tuple[str, ...]] = {
    arch: gencode_flags(arch) for arch in ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_90a")}
# -keep leaves the PTX in the work folder, so ptxas errors can be traced to source lines.
BASE_FLAGS: tuple[str, ...] = ("-cubin", "-O3", "-std=c++17", "-lineinfo", "-Xptxas", "-v", "-keep")

# Options that would move the output, change the arch behind the cache key's back or stop
# compilation early; the arch is `compile_cuda`'s own argument.
_FORBIDDEN_OPTIONS = ("-o", "--output-file", "-odir", "--output-directory", "-arch", "--gpu-architecture", "-code",
                      "--gpu-code", "-gencode", "--generate-code", "-ptx", "-fatbin", "-E", "-M", "-run", "-keep",
                      "--keep", "-keep-dir", "--keep-dir", "-c", "--compile", "-lib", "-link", "-dryrun", "--dryrun")

TRANSLATORS_INCLUDE = Path(__file__).resolve().parents[1] / "translators" / "include"
# the folder that holds the flashgen package (a checkout's root, or site-packages): project paths are shown from here
PROJECT_ROOT = Path(__file__).resolve().parents[2]
# each translator backend's arch headers: translators/backends/<name>/include/flashgen/*.cuh
BACKEND_INCLUDES = Path(__file__).resolve().parents[1] / "translators" / "backends"


class CompilerNotFound(FlashgenError):
    """No nvcc to run: an environment problem, not a kernel's."""


class CompileResult(BaseModel):
    ok: bool
    arch: str
    cubin_path: str | None = None
    cubin_sha256: str | None = None
    kernels: dict[str, ResourceUsage] = Field(default_factory=dict, description="entry kernels by symbol")
    device_functions: dict[str, ResourceUsage] = Field(default_factory=dict,
                                                       description="non-inlined device functions ptxas reported")
    errors: list[CompileError] = Field(default_factory=list)
    warnings: list[CompileError] = Field(default_factory=list)
    log: str = Field(default="", description=f"nvcc's output, cut to about {LOG_LIMIT} characters")
    nvcc_version: str = ""
    command: list[str] = Field(default_factory=list)
    seconds: float = 0.0
    timed_out: bool = False
    cache_key: str = ""
    cache_hit: bool = False

    def read_cubin(self) -> bytes:
        if not self.cubin_path:
            raise FlashgenError(f"compile for {self.arch} failed: no cubin")
        return Path(self.cubin_path).read_bytes()

    @property
    def ptxas_warnings(self) -> list[str]:
        """ptxas's warnings (a serialized wgmma among them), one line each: what a model is shown of a build."""
        return [str(w) for w in self.warnings if w.tool == "ptxas"]

    def feedback_text(self, max_chars: int = 2000) -> str:
        """The errors (or, when it compiled, the resource summary) compactly, for a model to act on."""
        if self.timed_out:
            return self.errors[0].message if self.errors else "nvcc timed out"
        parts: list[str] = []
        if not self.ok:
            for err in self.errors or [CompileError(tool="nvcc", message="nvcc failed without a diagnostic; log:\n"
                                                    + self.log[-800:])]:
                parts.append(str(err) + ("\n" + err.excerpt if err.excerpt else ""))
        else:
            for name, usage in self.kernels.items():
                spill = (f", SPILLS {usage.spill_store_bytes} B stores / {usage.spill_load_bytes} B loads"
                         if usage.spills else "")
                parts.append(f"{name} ({self.arch}): {usage.registers} registers, {usage.shared_static_bytes} B static "
                             f"smem, {usage.stack_frame_bytes} B stack{spill}")
            parts += self.ptxas_warnings
        return join_lines_capped(parts, max_chars)


def default_cache_dir() -> Path:
    from flashgen.paths import cubin_cache_dir

    return cubin_cache_dir()


def include_dirs() -> list[Path]:
    dirs = [ABI_HEADER.parent.resolve()]
    if TRANSLATORS_INCLUDE.is_dir():
        dirs.append(TRANSLATORS_INCLUDE)
    dirs += sorted(p for p in BACKEND_INCLUDES.glob("*/include") if p.is_dir())
    return dirs


FALLBACK_NVCC = "/usr/local/cuda/bin/nvcc"


def find_nvcc() -> str:
    chosen = os.environ.get("FLASHGEN_NVCC")
    if chosen:
        if not os.access(chosen, os.X_OK):
            raise CompilerNotFound(f"FLASHGEN_NVCC={chosen} is not an executable file")
        return chosen
    for candidate in (shutil.which("nvcc"), FALLBACK_NVCC):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise CompilerNotFound("nvcc not found: install the CUDA toolkit, put nvcc on PATH or set FLASHGEN_NVCC")


def scrubbed_env(work: str) -> dict[str, str]:
    """The environment nvcc runs in: PASSED_ENV from ours, HOME and TMPDIR the build folder (nvcc's intermediates
    land there and go with it), the C locale."""
    env = {name: os.environ[name] for name in PASSED_ENV if os.environ.get(name)}
    env.setdefault("PATH", os.defpath)
    env.update(HOME=work, TMPDIR=work, LC_ALL="C", LANG="C")
    return env


@functools.cache
def _nvcc_version_of(nvcc: str, mtime_ns: int) -> str:
    try:
        done = subprocess.run([nvcc, "--version"], check=False, capture_output=True, text=True, timeout=60,
                              env=scrubbed_env(tempfile.gettempdir()), stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        raise CompilerNotFound(f"{nvcc} --version failed: {exc}") from None
    if done.returncode != 0:
        raise CompilerNotFound(f"{nvcc} --version exited {done.returncode}: {done.stderr.strip()[:200]}")
    return done.stdout.strip()


def nvcc_version(nvcc: str | None = None) -> str:
    """`nvcc --version` text, run once per process per nvcc binary."""
    path = nvcc or find_nvcc()
    return _nvcc_version_of(path, os.stat(path).st_mtime_ns)


def _headers_digest() -> dict[str, str]:
    digest: dict[str, str] = {}
    for root in include_dirs():
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            digest[f"{root.name}/{path.relative_to(root)}"] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digest


def _cache_key(source: str, filename: str, arch: str, options: Sequence[str], version: str) -> str:
    material = {"format": CACHE_FORMAT, "source": source, "filename": filename, "arch": arch,
                "arch_flags": ARCH_FLAGS[arch], "base_flags": BASE_FLAGS, "options": list(options), "nvcc": version,
                "headers": _headers_digest()}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def _check_options(options: Sequence[str]) -> list[str]:
    if isinstance(options, str):
        raise UsageError("compile options must be a list of strings, not one string")
    opts = [str(o) for o in options]
    for opt in opts:
        flag = opt.split("=", 1)[0]
        if flag in _FORBIDDEN_OPTIONS:
            raise UsageError(f"compile option {opt!r} is not allowed: the harness sets output, arch and mode itself")
    return opts


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _load_cached(entry: Path, cubin: Path) -> CompileResult | None:
    try:
        result = CompileResult.model_validate_json(entry.read_text())
    except (OSError, ValueError):
        return None
    if result.ok:
        try:
            data = cubin.read_bytes()
        except OSError:
            return None
        if hashlib.sha256(data).hexdigest() != result.cubin_sha256:
            return None
        result.cubin_path = str(cubin)
    result.cache_hit = True
    return result


def _truncate(log: str, limit: int = LOG_LIMIT) -> str:
    if len(log) <= limit:
        return log
    head = limit * 3 // 4
    return f"{log[:head]}\n... [{len(log) - limit} characters cut] ...\n{log[-(limit - head):]}"


def _run(cmd: list[str], cwd: str, timeout_s: float) -> tuple[int | None, str]:
    """Run nvcc in its own process group, in `cwd` with the scrubbed environment; on timeout kill the whole group
    (cicc, ptxas too). Returns (returncode or None on timeout, combined output)."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=scrubbed_env(cwd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        return proc.returncode, out.decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            out, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            out = b""
        return None, (out or b"").decode("utf-8", "replace")


# ---------------------------------------------------------------------------------------------
# What nvcc may read, and what of its output may leave (the source is untrusted)
# ---------------------------------------------------------------------------------------------

SYSTEM_FALLBACK = ("/usr/include", "/usr/local/include", "/usr/lib/gcc")


@functools.cache
def system_include_dirs(compiler: str | None = None) -> tuple[str, ...]:
    """The host compiler's own #include <...> search folders (what nvcc's preprocessor searches after ours)."""
    cc = compiler or os.environ.get("NVCC_CCBIN") or shutil.which("gcc") or shutil.which("c++")
    if cc and os.path.isdir(cc):  # NVCC_CCBIN may name the folder
        cc = os.path.join(cc, "gcc")
    try:
        done = subprocess.run([cc, "-x", "c++", "-E", "-v", "-"], input="", capture_output=True, text=True,
                              timeout=60, env=scrubbed_env(tempfile.gettempdir())) if cc else None
    except (OSError, subprocess.SubprocessError):
        done = None
    text = done.stderr if done is not None else ""
    found = re.search(r"#include <\.\.\.> search starts here:\n(.*?)\nEnd of search list", text, re.S)
    dirs = [line.strip() for line in found.group(1).splitlines() if line.strip()] if found else []
    return tuple(os.path.normpath(d) for d in dirs) or SYSTEM_FALLBACK


class ToolkitLayout(NamedTuple):
    root: str  # the toolkit's top folder (nvcc's TOP)
    include_dirs: tuple[str, ...]  # the folders nvcc adds to the include path itself


@functools.cache
def _layout_of(nvcc: str, mtime_ns: int) -> ToolkitLayout:
    top, dirs = os.path.normpath(str(Path(nvcc).resolve().parents[1])), []
    try:  # nvcc may be a wrapper script: its dry run names the real toolkit
        done = subprocess.run([nvcc, "-dryrun", "-cubin", "-arch=sm_80", "flashgen-layout.cu"], capture_output=True,
                              text=True, timeout=60, env=scrubbed_env(tempfile.gettempdir()),
                              cwd=tempfile.gettempdir(), stdin=subprocess.DEVNULL)
        text = done.stdout + done.stderr
    except (OSError, subprocess.SubprocessError):
        text = ""
    if m := re.search(r"^#\$ TOP=(.*)$", text, re.M):
        top = os.path.normpath(m.group(1).strip())
    for m in re.finditer(r'^#\$ (?:SYSTEM_)?INCLUDES=(.*)$', text, re.M):
        for arg in re.findall(r'"([^"]*)"|(\S+)', m.group(1)):
            value = arg[0] or arg[1]
            value = value[2:] if value.startswith("-I") else value
            if value and not value.startswith("-"):
                dirs.append(os.path.normpath(value))
    return ToolkitLayout(top, tuple(dirs) or (os.path.join(top, "include"),))


def toolkit_layout(nvcc: str) -> ToolkitLayout:
    """Where nvcc's toolkit lives and which include folders it adds (asked once per nvcc binary)."""
    return _layout_of(nvcc, os.stat(nvcc).st_mtime_ns)


def _option_include_dirs(options: Sequence[str]) -> list[str]:
    dirs, take = [], False
    for opt in options:
        if take:
            dirs.append(opt)
            take = False
        elif opt in ("-I", "--include-path", "-isystem", "--system-include"):
            take = True
        elif opt.startswith("-I") or opt.startswith(("--include-path=", "--system-include=")):
            dirs.append(opt.split("=", 1)[1] if opt.startswith("--") else opt[2:])
    return dirs


def _roots(paths) -> list[str]:
    out: set[str] = set()
    for p in paths:
        out.add(os.path.normpath(str(p)))
        out.add(os.path.realpath(str(p)))
    return sorted(out, key=len, reverse=True)


def _under(path: str, roots: Sequence[str]) -> str | None:
    for root in roots:
        if path == root or path.startswith(root.rstrip(os.sep) + os.sep):
            return root
    return None


def read_deps(path: Path) -> list[str] | None:
    """The files of a make-style dependency list (what gcc -MD writes), or None without one."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    files: list[str] = []
    for rule in text.replace("\\\n", " ").splitlines():
        if ":" not in rule:
            continue
        for token in re.findall(r"(?:\\.|[^\s\\])+", rule.split(":", 1)[1]):
            files.append(re.sub(r"\\(.)", r"\1", token).replace("$$", "$"))
    return files


def outside_files(deps: Sequence[str], work: str, allowed: Sequence[str]) -> list[str]:
    """The files of `deps` that are neither in the build folder nor under an allowed root."""
    roots = _roots([work, *allowed])
    bad = []
    for dep in deps:
        full = os.path.normpath(dep if os.path.isabs(dep) else os.path.join(work, dep))
        if _under(full, roots) is None and _under(os.path.realpath(full), roots) is None:
            bad.append(dep)
    return bad


_STRING_RUN = re.compile(r'(?:"(?:\\.|[^"\\\n])*"\s*)+')
_LINE_MARKER = re.compile(r"^#.*$", re.M)


def asm_file_directives(preprocessed: str) -> bool:
    """Whether a string literal (adjacent ones joined, as the compiler joins them) of the preprocessed source holds an
    assembler directive that reads a file."""
    from flashgen.harness.static_check import ASM_FILE_DIRECTIVE

    text = _LINE_MARKER.sub("", preprocessed)
    return any(ASM_FILE_DIRECTIVE.search(re.sub(r'"\s*"', "", m.group(0))) for m in _STRING_RUN.finditer(text))


_ABS_PATH = re.compile(r"(?<![\w.~/-])/(?:[\w.+@-]+/)+[\w.+@-]*")


class PathScrubber:
    """Absolute paths in compiler output, as they may be shown: relative in the build folder, by repository path
    for the project's headers, <cuda>/... and <system>/... for the toolkit's and the host compiler's, else <path>."""

    def __init__(self, work: str, nvcc: str | None, system: Sequence[str] = ()):
        self.places: list[tuple[str, str]] = [(r, "") for r in _roots([work])]
        self.places += [(r, "") for r in _roots([PROJECT_ROOT])]
        if nvcc:
            self.places += [(r, "<cuda>/") for r in _roots([toolkit_layout(nvcc).root])]
        self.places += [(r, "<system>/") for r in _roots(system)]
        self.places.sort(key=lambda place: len(place[0]), reverse=True)

    def path(self, text: str) -> str:
        full = os.path.normpath(text)
        for candidate in (full, os.path.realpath(full)):
            for root, label in self.places:
                if candidate == root:
                    return label.rstrip("/") or "."
                if candidate.startswith(root.rstrip(os.sep) + os.sep):
                    return label + candidate[len(root.rstrip(os.sep)) + 1:]
        return "<path>"

    def __call__(self, text: str) -> str:
        return _ABS_PATH.sub(lambda m: self.path(m.group(0)), text)


def _refused(result: CompileResult, message: str) -> CompileResult:
    result.ok, result.log, result.kernels, result.device_functions, result.warnings = False, "", {}, {}, []
    result.errors = [CompileError(tool="harness", message=message)]
    return result


# Instructions that exist only in an arch-specific target (wgmma, setmaxnreg: sm_90a). A source that uses them is
# built for that target where the plain arch is asked for (the GPU is the same; the plain target rejects them).
FEATURE_ARCH: dict[str, str] = {t.arch: t.feature_arch for t in TARGETS.values() if t.feature_arch}
_FEATURE_INSTRUCTIONS = re.compile(r"\b(?:wgmma|setmaxnreg)\b")


def build_arch(source: str, arch: str) -> str:
    """The nvcc target `source` is built for when `arch` is asked for: arch's feature target where the source uses
    its instructions, else arch."""
    feature = FEATURE_ARCH.get(arch)
    return feature if feature and _FEATURE_INSTRUCTIONS.search(source) else arch


def compile_cuda(source: str, arch: str, *, options: Sequence[str] = (), timeout_s: float = 180,
                 cache_dir: Path | None = None, filename: str = "kernel.cu") -> CompileResult:
    """Compile `source` for `arch` (sm_75, sm_80, sm_86, sm_89, sm_90, sm_90a) to a cubin.

    Never raises for a bad kernel: errors, timeouts and ptxas failures come back in the result.
    Raises UsageError for an unknown arch or a forbidden option, CompilerNotFound without nvcc."""
    if arch not in ARCH_FLAGS:
        raise UsageError(f"unknown arch {arch!r}; expected one of {', '.join(ARCH_FLAGS)}")
    if not isinstance(source, str) or not source.strip():
        raise UsageError("empty CUDA source")
    arch = build_arch(source, arch)
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.]*\.cu", filename):
        raise UsageError(f"source file name {filename!r} must be a plain NAME.cu")
    opts = _check_options(options)
    nvcc = find_nvcc()
    version = nvcc_version(nvcc)
    key = _cache_key(source, filename, arch, opts, version)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    entry, cubin_cache = root / key[:2] / f"{key}.json", root / key[:2] / f"{key}.cubin"
    if entry.exists() and (cached := _load_cached(entry, cubin_cache)) is not None:
        return cached

    refused = file_access_issues(source)
    if refused:  # nvcc never sees it: nothing it could open, nothing it could print
        result = CompileResult(ok=False, arch=arch, nvcc_version=version, cache_key=key)
        result.errors = [CompileError(tool="harness", file=filename, line=issue.line,
                                      message=f"{issue.message} [{issue.rule}]") for issue in refused[:MAX_DIAGNOSTICS]]
        return result

    dirs = include_dirs()
    includes = [arg for d in dirs for arg in ("-I", str(d))]
    stem = Path(filename).stem
    output = f"{stem}.cubin"
    deps_name = f"{stem}.deps"
    # the device pass's preprocessor lists every file it opened (nvcc's own -MD runs a host pass instead)
    deps_flags = ["-Xcompiler", f"-MD,-MF,{deps_name}"]
    cmd = [nvcc, *ARCH_FLAGS[arch], *BASE_FLAGS, *includes, *opts, *deps_flags, filename, "-o", output]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="flashgen-nvcc-") as work:
        Path(work, filename).write_text(source, encoding="utf-8")
        returncode, log = _run(cmd, work, timeout_s)
        seconds = time.monotonic() - started
        cubin_bytes = Path(work, output).read_bytes() if returncode == 0 and Path(work, output).exists() else None
        ptx_path = Path(work, f"{stem}.ptx")
        ptx = ptx_path.read_text(errors="replace") if ptx_path.exists() else ""
        deps = read_deps(Path(work, deps_name))
        preprocessed = Path(work, f"{stem}.cpp1.ii")
        asm_reads = preprocessed.is_file() and asm_file_directives(preprocessed.read_text(errors="replace"))

    result = CompileResult(ok=False, arch=arch, nvcc_version=version, command=cmd, seconds=round(seconds, 3),
                           cache_key=key)
    if returncode is None:
        result.timed_out = True
        result.errors = [CompileError(tool="harness", severity="timeout",
                                      message=f"nvcc timed out after {timeout_s:g} s and was killed (a smaller "
                                              "kernel, less unrolling or fewer template instances compile faster)")]
        return result
    allowed = [*map(str, dirs), *toolkit_layout(nvcc).include_dirs, *system_include_dirs(), *_option_include_dirs(opts)]
    outside = outside_files(deps, work, allowed) if deps is not None else []
    if outside:
        return _refused(result, f"the preprocessor opened {len(outside)} file(s) outside the build folder, the "
                                "project's include folders, the CUDA toolkit and the system headers (a computed or "
                                "disguised #include): refused, and nvcc's output withheld")
    if asm_reads:
        return _refused(result, "the preprocessed source holds an assembler directive that reads a file (.incbin, "
                                ".include): refused, and nvcc's output withheld")
    if deps is None and returncode == 0:
        return _refused(result, "the preprocessor wrote no list of the files it opened, so the build cannot be "
                                "checked: refused")

    scrub = PathScrubber(work, nvcc, system_include_dirs())
    log = scrub(log)
    result.log = _truncate(log)
    sources = {filename: source, **{scrub(str(p)): p.read_text(errors="replace")
                                    for d in dirs for p in Path(d).rglob("*") if p.is_file()}}
    diagnostics = parse_diagnostics(log, sources)
    if ptx:
        locate_ptx_errors(diagnostics, ptx, sources)
    for diag in diagnostics:  # PTX lines quoted into ptxas errors are scrubbed too
        diag.message = _truncate(scrub(diag.message), MESSAGE_LIMIT)
    result.errors = [d for d in diagnostics if d.severity != "warning"][:MAX_DIAGNOSTICS]
    result.warnings = [d for d in diagnostics if d.severity == "warning"][:MAX_DIAGNOSTICS]
    usages = parse_resource_report(log)
    result.kernels = {n: u for n, u in usages.items() if u.is_entry}
    result.device_functions = {n: u for n, u in usages.items() if not u.is_entry}
    if returncode == 0 and cubin_bytes is not None:
        result.ok = True
        result.errors = []
        result.cubin_sha256 = hashlib.sha256(cubin_bytes).hexdigest()
    elif not result.errors:
        result.errors = [CompileError(tool="nvcc", message=f"nvcc exited {returncode} without a diagnostic")]

    cacheable = result.ok or any(e.line is not None or e.tool == "ptxas" for e in result.errors)
    if "died due to signal" in log or returncode < 0:
        cacheable = False
    if result.ok:
        try:
            _atomic_write(cubin_cache, cubin_bytes)
            result.cubin_path = str(cubin_cache)
        except OSError as exc:  # an unwritable cache still gives a usable cubin
            fd, path = tempfile.mkstemp(prefix="flashgen-", suffix=".cubin")
            with os.fdopen(fd, "wb") as handle:
                handle.write(cubin_bytes)
            result.cubin_path = path
            result.log += f"\n[flashgen] cache not written ({exc.strerror or exc}); cubin kept at {path}"
            cacheable = False
    if cacheable:
        try:
            _atomic_write(entry, result.model_dump_json().encode())
        except OSError:
            pass
    return result



def compile_many(sources: Sequence[str], arch: str, *, jobs: int | None = None,
                 options: Sequence[str] = ()) -> list[CompileResult]:
    """compile_cuda over many sources at once (nvcc runs as a subprocess, so threads suffice). The
    cubins land in the cache, where a later compile_cuda (e.g. the GPU worker's) finds them."""
    from concurrent.futures import ThreadPoolExecutor

    if not sources:
        return []
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(sources)))
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(lambda source: compile_cuda(source, arch, options=options), sources))
