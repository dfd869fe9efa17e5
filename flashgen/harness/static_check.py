"""Static checks on a kernel source, run before nvcc: is it a self-contained device-only kernel that
keeps the ABI contract?

Comments and string literals are blanked first (a comment that mentions cudaMalloc is fine);
offsets and line numbers are kept. The rules (the `rule` of each StaticIssue):

- include:        only these includes: the ABI header (flashgen_abi.cuh), the translators' own
                  primitive headers ("flashgen/..."), and the whitelist ALLOWED_HEADERS / the
                  libcu++ prefix "cuda/" (cuda/std/..., cuda/barrier, cuda/pipeline, cuda/ptx).
                  Never an absolute path or a ".." component, never a computed include (a macro
                  operand), no #include_next, #import or #embed. Directives are found as the
                  preprocessor finds them (splices, comments, digraphs, trigraphs: see
                  preprocessor_directives).
- preprocessor:   nothing else that makes the preprocessor look at files or hides names from these
                  checks: __has_include, _Pragma, pragmas outside ALLOWED_PRAGMAS (GCC dependency),
                  token pasting (##), #line and line markers, unknown directives.
- asm:            no assembler directive that reads a file (.incbin, .include), in asm statements or
                  anywhere else (adjacent string literals joined).
  These three are also what compile_cuda refuses before nvcc runs (file_access_issues).
- library:        no cuBLAS, cuDNN, CUTLASS/CuTe, torch/ATen/c10, thrust or CUB: the point is to write
                  the computation, not call it.
- host-api:       no CUDA runtime or driver API calls (cudaMalloc, cudaMemcpy, cudaDeviceSynchronize,
                  cudaStream*, cudaLaunch*, cuLaunchKernel, ...): the harness owns memory and launches.
- allocation:     no malloc/calloc/realloc/free/new/delete: buffers come in through the params.
- io:             no printf and friends (device printf serialises the kernel and floods the log), no
                  files, no system()/exit().
- host-function:  every function is __device__ (or __host__ __device__) or an entry; no main().
- launch:         no kernel launches (<<<...>>>) inside the source; the manifest lists the launches.
- entry-signature: every __global__ function is `extern "C" __global__ void NAME(const FlashgenAttnParams p)`
                  (flashgen.abi.ENTRY_SIGNATURE; __launch_bounds__ may come before or after `void`).
- abi:            FlashgenAttnParams comes from flashgen_abi.cuh, not a local definition.
- manifest:       every kernel the manifest launches is defined as an entry; a literal
                  __launch_bounds__(N) is at least the manifest's threads for it.
"""

from __future__ import annotations

import bisect
import re

from pydantic import BaseModel

from flashgen.abi import ABI_INCLUDE, ENTRY_SIGNATURE, KernelManifest
from flashgen.errors import join_lines_capped

ALLOWED_HEADERS = frozenset({
    ABI_INCLUDE,
    "cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h",  # element types and their intrinsics
    "cuda_pipeline.h", "cuda_pipeline_primitives.h", "cuda_awbarrier.h", "cuda_awbarrier_primitives.h",  # cp.async
    "mma.h",  # nvcuda::wmma: a tensor-core primitive, not a library
    "cooperative_groups.h", "cooperative_groups/memcpy_async.h", "cooperative_groups/reduce.h",
    "cuda_runtime.h", "device_launch_parameters.h",  # habitual and implied by nvcc; calls are checked separately
    "math_constants.h", "stdint.h", "cstdint", "stddef.h", "cstddef", "float.h", "cfloat", "limits.h", "climits",
    "math.h", "cmath", "type_traits",
})
ALLOWED_PREFIXES = ("flashgen/", "cuda/")

_LIBRARY_INCLUDE = re.compile(r"^(?:(?:cublas|cudnn|cusparse|cufft|curand)\w*|(?:cutlass|cute|torch|ATen|c10|thrust|cub)"
                              r"(?:/|\.h|\.cuh|\.hpp|$))", re.IGNORECASE)
_LIBRARY_NAME = re.compile(r"\b(?:(cublas|cudnn|cutlass|cute|torch|at|c10|thrust|cub)\s*::|(cublas[A-Z]\w*|"
                           r"cudnn[A-Z]\w*))")
_HOST_API = re.compile(r"\b(cuda[A-Z]\w*|cu(?:Mem|Launch|Ctx|Module|Stream|Event|Init|Device|Graph|Func|Link|"
                       r"Occupancy|Library|Kernel)\w*)\s*\(")
_ALLOCATION = re.compile(r"\b(?:(malloc|calloc|realloc|free)\s*\(|(new|delete)\b)")
_IO = re.compile(r"\b(printf|fprintf|sprintf|snprintf|vprintf|puts|fputs|putchar|fopen|fclose|fread|fwrite|fflush|"
                 r"system|popen|fork|exit|_exit|getenv)\s*\(|\bstd\s*::\s*(cout|cerr|printf|ofstream|ifstream)\b")
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]*)[>"]', re.MULTILINE)
_GLOBAL = re.compile(r"\b__global__\b")
_LAUNCH_BOUNDS = re.compile(r"__launch_bounds__\s*\((?:[^()]|\([^()]*\))*\)")
_NAME_BEFORE_PAREN = re.compile(r"(\w+)\s*\($")


class StaticIssue(BaseModel):
    line: int | None
    message: str
    rule: str

    def __str__(self) -> str:
        where = f"line {self.line}" if self.line is not None else "source"
        return f"{where}: {self.message} [{self.rule}]"


def format_issues(issues: list[StaticIssue], max_chars: int = 2000) -> str:
    """The issues one per line, for a model; cut at max_chars with a count of what was left out."""
    return join_lines_capped([str(issue) for issue in issues], max_chars)


def blank_comments_and_strings(source: str) -> tuple[str, str]:
    """(source without comments, source without comments or string/char contents). Blanked
    characters become spaces and newlines stay, so offsets and line numbers are the source's.
    The literal "C" (of extern "C") is kept."""
    no_comments: list[str] = []
    code: list[str] = []
    i, n = 0, len(source)

    def blank(text: str) -> str:
        return "".join(ch if ch == "\n" else " " for ch in text)

    while i < n:
        ch = source[i]
        two = source[i:i + 2]
        if two == "//":
            end = source.find("\n", i)
            end = n if end < 0 else end
            piece = blank(source[i:end])
            no_comments.append(piece)
            code.append(piece)
            i = end
        elif two == "/*":
            end = source.find("*/", i + 2)
            end = n if end < 0 else end + 2
            piece = blank(source[i:end])
            no_comments.append(piece)
            code.append(piece)
            i = end
        elif ch == "R" and source[i + 1:i + 2] == '"' and (i == 0 or not (source[i - 1].isalnum() or source[i - 1] == "_")):
            m = re.match(r'R"([^()\\\s]{0,16})\(', source[i:])
            if m is None:
                no_comments.append(ch)
                code.append(ch)
                i += 1
                continue
            close = source.find(")" + m.group(1) + '"', i + m.end())
            end = n if close < 0 else close + len(m.group(1)) + 2
            no_comments.append(source[i:end])
            code.append('R"' + blank(source[i + 2:end - 1]) + '"')
            i = end
        elif ch == '"' or (ch == "'" and not (i > 0 and source[i - 1].isalnum())):  # 1'000 is a digit separator
            j = i + 1
            while j < n and source[j] != ch and source[j] != "\n":
                j += 2 if source[j] == "\\" else 1
            end = min(j + 1, n)
            literal = source[i:end]
            no_comments.append(literal)
            code.append(literal if literal == '"C"' else ch + blank(literal[1:-1]) + literal[-1:] if len(literal) > 1
                        else literal)
            i = end
        else:
            no_comments.append(ch)
            code.append(ch)
            i += 1
    return "".join(no_comments), "".join(code)


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _blank_preprocessor(code: str) -> str:
    rows = code.split("\n")
    out: list[str] = []
    continued = False
    for row in rows:
        if continued or row.lstrip().startswith("#"):
            continued = row.rstrip().endswith("\\")
            out.append(" " * len(row))
        else:
            out.append(row)
    return "\n".join(out)


def _check_includes(headers: list[tuple[int, str]]) -> list[StaticIssue]:
    """The allowed-header rule over the literal #includes (absolute and '..' paths: file_access_issues)."""
    issues: list[StaticIssue] = []
    for line, path in headers:
        parts = path.replace("\\", "/").split("/")
        if path.startswith(("/", "\\", "~")) or re.match(r"^[A-Za-z]:", path) or ".." in parts:
            continue
        if _LIBRARY_INCLUDE.match(path):
            issues.append(StaticIssue(line=line, rule="library",
                                      message=f"#include {path!r}: libraries (cuBLAS, cuDNN, CUTLASS, torch, thrust, "
                                              "CUB) are not allowed; write the computation"))
        elif path not in ALLOWED_HEADERS and not path.startswith(ALLOWED_PREFIXES):
            issues.append(StaticIssue(line=line, rule="include",
                                      message=f"#include {path!r} is not allowed; allowed: {ABI_INCLUDE}, flashgen/..., "
                                              "cuda_fp16.h, cuda_bf16.h, cuda_pipeline.h, mma.h, cuda/..., stdint.h "
                                              "and a few C headers"))
    return issues


def _scan_patterns(code: str) -> list[StaticIssue]:
    issues: list[StaticIssue] = []
    for m in _LIBRARY_NAME.finditer(code):
        name = m.group(1) or m.group(2)
        issues.append(StaticIssue(line=_line_of(code, m.start()), rule="library",
                                  message=f"{name}: libraries are not allowed in a kernel; write the computation"))
    for m in _HOST_API.finditer(code):
        issues.append(StaticIssue(line=_line_of(code, m.start()), rule="host-api",
                                  message=f"{m.group(1)}(): no CUDA runtime/driver API calls; the harness allocates, "
                                          "copies and launches"))
    for m in _ALLOCATION.finditer(code):
        issues.append(StaticIssue(line=_line_of(code, m.start()), rule="allocation",
                                  message=f"{m.group(1) or m.group(2)}: no dynamic allocation; buffers come in "
                                          "through FlashgenAttnParams (and the manifest's workspace)"))
    for m in _IO.finditer(code):
        name = m.group(1) or f"std::{m.group(2)}"
        issues.append(StaticIssue(line=_line_of(code, m.start()), rule="io",
                                  message=f"{name}: no printing, files or process calls in a kernel"))
    for m in re.finditer(r"<<<", code):
        issues.append(StaticIssue(line=_line_of(code, m.start()), rule="launch",
                                  message="<<<...>>>: kernels must not launch kernels; the manifest lists the launches"))
    return issues


def _check_functions(code: str) -> list[StaticIssue]:
    """Namespace-scope function definitions without __device__/__global__, and __host__-only ones."""
    issues: list[StaticIssue] = []
    code = _blank_preprocessor(code)
    stack: list[str] = []  # kinds of the open blocks: scope (namespace, extern "C"), function, type, other
    head_start = 0
    for i, ch in enumerate(code):
        if ch == ";":
            head_start = i + 1
        elif ch == "}":
            if stack:
                stack.pop()
            head_start = i + 1
        elif ch == "{":
            head = code[head_start:i]
            flat = " ".join(head.split())
            at_namespace_scope = all(kind == "scope" for kind in stack)
            if re.search(r'\bnamespace\b|^extern\s+"C"$', flat):
                kind = "scope"
            elif re.search(r"\b(struct|class|union|enum)\b", flat) and "(" not in flat.split("{")[0].split(":")[0]:
                kind = "type"
            elif re.search(r"\)\s*(const|noexcept|override|final|mutable|\s)*(->\s*[\w:<>,\s*&]+)?$", flat) and \
                    "=" not in flat.split("(")[0] and not re.match(r"^(if|for|while|switch|do|else)\b", flat):
                kind = "function"
                if at_namespace_scope:
                    issues += _function_issue(flat, _line_of(code, head_start + len(head) - len(head.lstrip())))
            else:
                kind = "other"
            stack.append(kind)
            head_start = i + 1
    return issues


def _function_issue(head: str, line: int) -> list[StaticIssue]:
    name_part = head.split("(")[0] + "("
    m = _NAME_BEFORE_PAREN.search(name_part)
    name = m.group(1) if m else "?"
    if name == "main":
        return [StaticIssue(line=line, rule="host-function", message="main(): a kernel source has no host program")]
    words = set(re.findall(r"\w+", head.split("(")[0]))
    if "__global__" in words or "__device__" in words:
        return []
    if "__host__" in words:
        return [StaticIssue(line=line, rule="host-function",
                            message=f"{name}: __host__-only function; helpers must be __device__ (or __host__ "
                                    "__device__)")]
    return [StaticIssue(line=line, rule="host-function",
                        message=f"{name}: function without __device__ is host code; mark helpers __device__ "
                                "(or __host__ __device__)")]


def _global_functions(code: str) -> list[tuple[str, int]]:
    """(name, line) of every __global__ function declared or defined."""
    found: list[tuple[str, int]] = []
    for m in _GLOBAL.finditer(code):
        rest = _LAUNCH_BOUNDS.sub(lambda lb: " " * len(lb.group(0)), code[m.end():m.end() + 2000])
        paren = rest.find("(")
        if paren < 0:
            continue
        name = _NAME_BEFORE_PAREN.search(rest[:paren + 1])
        if name:
            found.append((name.group(1), _line_of(code, m.start())))
    return found


_BOUNDS_AFTER_VOID = re.compile(r"(\bvoid\s+)(__launch_bounds__\s*\((?:[^()]|\([^()]*\))*\)\s*)")


def _check_entries(code: str, no_comments: str, manifest: KernelManifest | None) -> list[StaticIssue]:
    issues: list[StaticIssue] = []
    conforming: dict[str, str] = {}
    # CUDA takes __launch_bounds__ before or after the return type; ENTRY_SIGNATURE spells only the
    # first, so the second is swapped into it (same length: offsets stay).
    swapped = _BOUNDS_AFTER_VOID.sub(lambda m: m.group(2) + m.group(1), code)
    for m in ENTRY_SIGNATURE.finditer(swapped):
        conforming.setdefault(m.group(1), m.group(0))
    defined = _global_functions(code)
    for name, line in defined:
        if name not in conforming:
            issues.append(StaticIssue(line=line, rule="entry-signature",
                                      message=f'kernel {name}: entry points must be exactly extern "C" __global__ '
                                              f"void {name}(const FlashgenAttnParams p), Hopper TMA kernels "
                                              "(const FlashgenAttnParams p, const __grid_constant__ FlashgenTensorMaps "
                                              "maps) (__launch_bounds__(...) may come before or after void)"))
    if re.search(r"\bstruct\s+FlashgenAttnParams\s*\{", code):
        m = re.search(r"\bstruct\s+FlashgenAttnParams\s*\{", code)
        issues.append(StaticIssue(line=_line_of(code, m.start()), rule="abi",
                                  message=f"FlashgenAttnParams is defined here; include {ABI_INCLUDE} instead"))
    elif "FlashgenAttnParams" in code:
        includes = [m.group(2).strip() for m in _INCLUDE.finditer(no_comments)]
        if ABI_INCLUDE not in includes and not any(i.startswith("flashgen/") for i in includes):
            issues.append(StaticIssue(line=None, rule="abi",
                                      message=f'FlashgenAttnParams is used but "{ABI_INCLUDE}" is not included'))
    if manifest is not None:
        defined_names = {name for name, _ in defined}
        for launch in manifest.launches:
            if launch.kernel not in defined_names:
                issues.append(StaticIssue(line=None, rule="manifest",
                                          message=f"the manifest launches {launch.kernel!r} but the source defines no "
                                                  f"__global__ {launch.kernel}"))
                continue
            signature = conforming.get(launch.kernel)
            takes_maps = bool(signature and "FlashgenTensorMaps" in signature)
            maps = manifest.maps_of(launch)
            if signature and takes_maps != bool(maps):
                issues.append(StaticIssue(line=None, rule="manifest",
                                          message=f"kernel {launch.kernel}: the manifest lists "
                                                  f"{len(maps)} tensor maps for it but the entry "
                                                  f"{'takes' if takes_maps else 'does not take'} a "
                                                  "FlashgenTensorMaps parameter; both or neither"))
            bounds = re.search(r"__launch_bounds__\(\s*(\d+)\s*[,)]", signature or "")
            if bounds and int(bounds.group(1)) < launch.threads:
                issues.append(StaticIssue(line=None, rule="manifest",
                                          message=f"{launch.kernel}: __launch_bounds__({bounds.group(1)}) is below the "
                                                  f"{launch.threads} threads the manifest launches it with"))
    return issues


def static_check(source: str, manifest: KernelManifest | None = None) -> list[StaticIssue]:
    """Every rule broken by `source` (and its manifest, when given), ordered by line. [] means clean."""
    no_comments, code = blank_comments_and_strings(source)
    issues, headers = _file_access(source)
    issues += _check_includes(headers)
    issues += _scan_patterns(_blank_preprocessor(code))
    issues += _check_functions(code)
    issues += _check_entries(code, no_comments, manifest)
    return _unique(issues)


# ---------------------------------------------------------------------------------------------
# The preprocessor's view: what can make nvcc open a file
# ---------------------------------------------------------------------------------------------
# The include rule above is only as good as our reading of the directives, so they are found the way the
# preprocessor finds them: trigraphs (phase 1, when a mode turns them on), backslash-newline splices (phase 2; gcc
# also splices a backslash followed by blanks), comments replaced by one space (phase 3: a comment may sit between
# '#' and the directive's name, and a block comment may join two lines), '%:' for '#'. Where a reading depends on
# the compiler's mode (trigraphs on or off, blanks after the backslash), every reading is checked and every issue
# kept; the physical lines are checked as well, without comment removal, so a comment the lexer here reads
# differently from the compiler cannot hide a directive. An #include must name its file literally: a macro operand
# is resolved by the preprocessor, not by this check, and is refused. The compile step checks the preprocessor's own
# list of the files it opened besides (flashgen.harness.compile).

_STRICT_SPLICE = re.compile(r"\\\n")
_LENIENT_SPLICE = re.compile(r"\\[ \t\f\v]*\n")
_TRIGRAPHS = {"=": "#", "/": "\\", "'": "^", "(": "[", ")": "]", "!": "|", "<": "{", ">": "}", "-": "~"}
_DIRECTIVE = re.compile(r"^[ \t\f\v]*(?:#|%:)[ \t\f\v]*(\w*)(.*)$")
_RAW_DIRECTIVE = re.compile(r"^(?:[ \t\f\v]|/\*.*?\*/)*(?:#|%:)(?:[ \t\f\v]|/\*.*?\*/)*(\w*)(.*)$")
_HARMLESS_DIRECTIVES = frozenset({"define", "undef", "if", "ifdef", "ifndef", "elif", "elifdef", "elifndef", "else",
                                  "endif", "error", "warning"})
_READING_DIRECTIVES = frozenset({"include_next", "import", "embed"})
ALLOWED_PRAGMAS = ("unroll", "nounroll", "once", "pack", "push_macro", "pop_macro", "message", "nv_diag_*", "diag_*",
                   "nv_exec_check_disable", "hd_warning_disable", "STDC", "GCC diagnostic", "clang diagnostic")
_PRAGMA_OK = re.compile(r"^(?:unroll|nounroll|once|pack|push_macro|pop_macro|message|nv_diag_\w+|diag_\w+|"
                        r"nv_exec_check_disable|hd_warning_disable|STDC|(?:GCC|clang)\s+diagnostic)\b")
# operators the preprocessor evaluates by looking at files, and the pragma operator (any pragma, from a macro)
_FILE_OPERATORS = re.compile(r"\b(__has_include_next|__has_include|__has_embed|_Pragma|__pragma)\b")
# assembler directives that read a file (GNU as); nvcc -cubin runs no host assembler, but asm text is refused anyway
ASM_FILE_DIRECTIVE = re.compile(r"(?i)\bincbin\b|\.\s*include\s*(?:\\?[\"'<])")
_ADJACENT_STRINGS = re.compile(r'(?:"(?:\\.|[^"\\\n])*"\s*){2,}')
_LITERAL_HEADER = re.compile(r'^[ \t]*(<[^>\n]*>|"[^"\n]*")')
_TRAILING_COMMENT = re.compile(r"//.*$|/\*.*?\*/")


def _phase1(source: str, trigraphs: bool) -> str:
    if not trigraphs:
        return source
    return re.sub(r"\?\?([=/'()!<>\-])", lambda m: _TRIGRAPHS[m.group(1)], source)


def _spliced(text: str, lenient: bool) -> tuple[str, list[int]]:
    """Phase 2: backslash-newline removed (lenient: with blanks between, as gcc does). Returns the text and the
    offsets in it where a splice was (each one a newline fewer)."""
    splice = _LENIENT_SPLICE if lenient else _STRICT_SPLICE
    pieces: list[str] = []
    at: list[int] = []
    pos = size = 0
    for m in splice.finditer(text):
        pieces.append(text[pos:m.start()])
        size += m.start() - pos
        at.append(size)
        pos = m.end()
    pieces.append(text[pos:])
    return "".join(pieces), at


class _Lines:
    """Physical source lines of offsets into the spliced text."""

    def __init__(self, text: str, splices: list[int]):
        self.newlines = [m.start() for m in re.finditer("\n", text)]
        self.splices = splices

    def __call__(self, offset: int) -> int:
        return 1 + bisect.bisect_left(self.newlines, offset) + bisect.bisect_right(self.splices, offset)


def _pp_number_before(text: str, i: int) -> bool:
    """Whether text[i] (a quote) continues a pp-number (a C++14 digit separator, 1'000) rather than opening a
    character literal (u'x', L'x' and x'y' open one: only a run that starts with a digit is a number)."""
    j = i
    while j > 0 and (text[j - 1].isalnum() or text[j - 1] in "_.'"):
        j -= 1
    run = text[j:i]
    return bool(run) and (run[0].isdigit() or (run[0] == "." and len(run) > 1 and run[1].isdigit()))


_RAW_PREFIXES = frozenset({"R", "u8R", "uR", "UR", "LR"})
_PLAIN = re.compile(r"[^/\"']+")


def _identifier_before(text: str, i: int) -> str:
    j = i
    while j > 0 and (text[j - 1].isalnum() or text[j - 1] == "_"):
        j -= 1
    return text[j:i]


def _without_comments(text: str) -> tuple[str, list[int], list[int]]:
    """Phase 3: every comment becomes one space (a block comment's newlines go with it, so it joins lines);
    string, character and raw string literals are kept as they are. Returns the text and its pieces as
    (start here, start in `text`) in two lists."""
    out: list[str] = []
    starts: list[int] = []
    origins: list[int] = []
    size = i = 0
    n = len(text)

    def put(piece: str, origin: int) -> None:
        nonlocal size
        out.append(piece)
        starts.append(size)
        origins.append(origin)
        size += len(piece)

    while i < n:
        if m := _PLAIN.match(text, i):
            put(m.group(0), i)
            i = m.end()
            continue
        ch, two = text[i], text[i:i + 2]
        if two == "//":
            end = text.find("\n", i)
            end = n if end < 0 else end
            put(" ", i)
        elif two == "/*":
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            put(" ", i)
        elif ch == '"' or (ch == "'" and not _pp_number_before(text, i)):
            raw = ch == '"' and _identifier_before(text, i) in _RAW_PREFIXES
            m = re.match(r'"([^()\\\s]{0,16})\(', text[i:i + 20]) if raw else None
            if m is not None:
                close = text.find(")" + m.group(1) + '"', i + m.end())
                end = n if close < 0 else close + len(m.group(1)) + 2
            else:
                j = i + 1
                while j < n and text[j] != ch and text[j] != "\n":
                    j += 2 if text[j] == "\\" else 1
                end = min(j + 1, n)
            put(text[i:end], i)
        else:
            end = i + 1
            put(ch, i)
        i = end
    return "".join(out), starts, origins


def _rows(text: str, line_of) -> list[tuple[int, str]]:
    found, start = [], 0
    for row in text.split("\n"):
        found.append((line_of(start), row))
        start += len(row) + 1
    return found


def _directive_issues(name: str, rest: str, line: int, raw: bool) -> tuple[list[StaticIssue], str | None]:
    """Issues of one directive, and the header it names literally (an #include's), if any."""
    if raw:
        rest = _TRAILING_COMMENT.sub(" ", rest)
    if name == "":
        return [], None
    if name == "include":
        literal = _LITERAL_HEADER.match(rest)
        if literal is None:
            return [StaticIssue(line=line, rule="include",
                                message=f"#include {' '.join(rest.split())[:60]}: a computed include (a macro or "
                                        "anything but a literal <name> or \"name\") is not allowed; name the header")], \
                None
        return [], literal.group(1)[1:-1]
    if name in _READING_DIRECTIVES:
        return [StaticIssue(line=line, rule="include",
                            message=f"#{name} is not allowed: it reads a file; include the allowed headers by name "
                                    "with #include")], None
    if name == "pragma":
        words = " ".join(rest.split())
        if not _PRAGMA_OK.match(words):
            return [StaticIssue(line=line, rule="preprocessor",
                                message=f"#pragma {words[:40]} is not allowed; allowed: {', '.join(ALLOWED_PRAGMAS)}")], \
                None
        return [], None
    if name == "define":
        if "##" in rest or "%:%:" in rest:
            return [StaticIssue(line=line, rule="preprocessor",
                                message="token pasting (##) is not allowed: it builds names the static check cannot "
                                        "see; write the names out")], None
        return [], None
    if name in _HARMLESS_DIRECTIVES:
        return [], None
    if name.isdigit() or name == "line":
        return [StaticIssue(line=line, rule="preprocessor",
                            message="#line and line markers are not allowed: the compiler's messages must name the "
                                    "real file and line")], None
    return [StaticIssue(line=line, rule="preprocessor",
                        message=f"#{name[:30]} is not allowed; directives a kernel may use: #include, #define, #undef, "
                                "#if/#ifdef/#ifndef/#elif/#else/#endif, #pragma, #error, #warning")], None


def preprocessor_directives(source: str) -> tuple[list[StaticIssue], list[tuple[int, str]]]:
    """(issues, [(line, header)] of the literal #includes) over every reading of `source`'s directives."""
    issues: list[StaticIssue] = []
    headers: dict[tuple[int, str], None] = {}
    seen: set[str] = set()
    for trigraphs in ([False, True] if "??" in source else [False]):
        for lenient in (False, True):
            text, splices = _spliced(_phase1(source, trigraphs), lenient)
            if text in seen:
                continue
            seen.add(text)
            line_of = _Lines(text, splices)
            stripped, starts, origins = _without_comments(text)

            def stripped_line(offset: int, starts=starts, origins=origins, line_of=line_of) -> int:
                if not starts:
                    return 1
                k = max(0, bisect.bisect_right(starts, offset) - 1)  # a piece: copied, or one space for a comment
                return line_of(origins[k] + offset - starts[k])

            for pattern, rows, raw in ((_DIRECTIVE, _rows(stripped, stripped_line), False),
                                       (_RAW_DIRECTIVE, _rows(text, line_of), True)):
                for line, row in rows:
                    if "#" not in row and "%:" not in row:
                        continue
                    m = pattern.match(row)
                    if m is None:
                        continue
                    found, header = _directive_issues(m.group(1), m.group(2), line, raw)
                    issues += found
                    if header is not None:
                        headers[(line, header.strip())] = None
            for m in _FILE_OPERATORS.finditer(text):
                issues.append(StaticIssue(line=line_of(m.start()), rule="preprocessor",
                                          message=f"{m.group(1)} is not allowed: it makes the preprocessor look at files "
                                                  "or run a pragma built from a macro"))
            # in the text as written, and in adjacent string literals joined as the compiler joins them
            lines = [line_of(m.start()) for m in ASM_FILE_DIRECTIVE.finditer(text)]
            lines += [stripped_line(m.start()) for m in _ADJACENT_STRINGS.finditer(stripped)
                      if ASM_FILE_DIRECTIVE.search(re.sub(r'"\s*"', "", m.group(0)))]
            for line in lines:
                issues.append(StaticIssue(line=line, rule="asm",
                                          message="assembler directives that read files (.incbin, .include) are "
                                                  "not allowed, in asm statements or anywhere else"))
    return issues, list(headers)


def file_access_issues(source: str) -> list[StaticIssue]:
    """What in `source` could make the compiler read a file other than the allowed headers (what compile_cuda
    refuses before it runs nvcc): computed includes, absolute or '..' include paths, #include_next/#import/#embed,
    __has_include, pragmas outside the allowed list, _Pragma, token pasting, #line, .incbin/.include."""
    return _file_access(source)[0]


def _file_access(source: str) -> tuple[list[StaticIssue], list[tuple[int, str]]]:
    issues, headers = preprocessor_directives(source)
    for line, path in headers:
        parts = path.replace("\\", "/").split("/")
        if path.startswith(("/", "\\", "~")) or re.match(r"^[A-Za-z]:", path) or ".." in parts:
            issues.append(StaticIssue(line=line, rule="include",
                                      message=f"#include {path!r}: no absolute paths or '..'; include by name"))
    return _unique(issues), headers


def _unique(issues: list[StaticIssue]) -> list[StaticIssue]:
    unique = {(i.line, i.rule, i.message): i for i in issues}
    return sorted(unique.values(), key=lambda i: (i.line if i.line is not None else 0, i.rule))
