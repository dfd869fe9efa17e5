"""compute-sanitizer's racecheck (shared-memory hazards) and synccheck (barrier misuse) over compiled kernels.

One sanitizer process per tool launches every kernel once (`python -m flashgen.harness.sanitize --launch FILE`),
on a ragged shape with more work tiles than an H200 has SMs (so a persistent CTA walks several tiles), with
NaN-poisoned outputs; the child prints how much of each output it wrote. `sanitize` parses the tools' summaries
and reports per tool. The tools slow a kernel down a hundredfold or more, hence the small shape and one process
per tool rather than per kernel.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from pydantic import BaseModel

from flashgen.abi import KernelManifest
from flashgen.errors import FlashgenError

TOOLS = ("racecheck", "synccheck")
# (B, H, N, M): N != M tails, 2 x 70 x 2 = 280 work tiles of 128 rows.
DEFAULT_SHAPE = (2, 70, 200, 333)
_RACE_SUMMARY = re.compile(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")
_ERROR_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) errors?")
_WRITTEN = re.compile(r"^launched (\S+) written (\d+) of (\d+)$", re.M)


class ToolReport(BaseModel):
    tool: str
    ok: bool
    errors: int | None = None  # None: the summary line was missing (the run did not finish)
    hazards: int | None = None  # racecheck only
    written: dict[str, tuple[int, int]] = {}  # kernel -> (output elements written, total)
    returncode: int | None = None
    log_tail: str = ""


def sanitizer_path() -> str | None:
    return shutil.which("compute-sanitizer")


def sanitize(kernels: dict[str, tuple[KernelManifest, str]], tools: tuple[str, ...] = TOOLS,
             shape: tuple[int, int, int, int] = DEFAULT_SHAPE, timeout_s: float = 600) -> dict[str, ToolReport]:
    """Run each tool over `kernels` (name -> (manifest, cubin path)); a tool's report is ok when it finished,
    found nothing and every kernel wrote all of its output."""
    exe = sanitizer_path()
    if exe is None:
        raise FlashgenError("compute-sanitizer is not on PATH (it comes with the CUDA toolkit)")
    reports = {}
    with tempfile.TemporaryDirectory(prefix="flashgen-sanitize-") as tmp:
        spec = Path(tmp) / "kernels.json"
        spec.write_text(json.dumps({"shape": list(shape), "kernels": [
            {"name": name, "manifest": manifest.model_dump(mode="json"), "cubin": str(cubin)}
            for name, (manifest, cubin) in kernels.items()]}))
        for tool in tools:
            cmd = [exe, "--tool", tool, "--error-exitcode", "1", sys.executable, "-m", "flashgen.harness.sanitize",
                   "--launch", str(spec)]
            try:
                run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
                log, rc = run.stdout + run.stderr, run.returncode
            except subprocess.TimeoutExpired as exc:
                log, rc = f"{exc.stdout or ''}{exc.stderr or ''}\ntimed out after {timeout_s:.0f} s", None
            reports[tool] = _report(tool, log, rc, set(kernels))
    return reports


def _report(tool: str, log: str, rc: int | None, names: set[str]) -> ToolReport:
    errors = hazards = None
    if m := _ERROR_SUMMARY.search(log):
        errors = int(m.group(1))
    if tool == "racecheck" and (m := _RACE_SUMMARY.search(log)):
        hazards, errors = int(m.group(1)), int(m.group(2))
    written = {m.group(1): (int(m.group(2)), int(m.group(3))) for m in _WRITTEN.finditer(log)}
    complete = set(written) == names and all(w == total for w, total in written.values())
    ok = rc == 0 and errors == 0 and (hazards in (None, 0)) and complete
    return ToolReport(tool=tool, ok=ok, errors=errors, hazards=hazards, written=written, returncode=rc,
                      log_tail=log[-3000:])


def _launch_all(spec_path: str) -> int:
    """The sanitized child: every kernel once, on fresh random inputs, outputs poisoned with NaN."""
    import cupy as cp

    from flashgen.harness.device import launch

    spec = json.loads(Path(spec_path).read_text())
    b, h, n, m = spec["shape"]
    rng = cp.random.default_rng()
    for entry in spec["kernels"]:
        manifest = KernelManifest.model_validate(entry["manifest"])
        d, kvh = manifest.head_dim, max(1, h // manifest.variant.kv_group)
        bf16 = manifest.dtype.value == "bf16"

        def rand(heads, rows, cols=d, bf16=bf16, dtype=manifest.dtype.value):
            x = rng.standard_normal((b, heads, rows, cols), dtype=cp.float32)
            if bf16:  # raw bf16 words, rounded to nearest even
                u = x.view(cp.uint32)
                return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(cp.uint16)
            return x.astype(cp.float16 if dtype == "fp16" else cp.float32)

        dv = manifest.dv  # V's and O's head dim
        q, k, v = rand(h, n), rand(kvh, m), rand(kvh, m, dv)
        nan_word = 0x7FC0  # bf16 NaN
        o = cp.full((b, h, n, dv), nan_word, dtype=cp.uint16) if bf16 else cp.full((b, h, n, dv), cp.nan, dtype=q.dtype)
        lse = cp.full((b, h, n), cp.nan, dtype=cp.float32) if manifest.variant.return_lse else None
        from flashgen.tl_spec.tensors import fill_all, sizes_of
        from flashgen.variant import Shape

        sizes = sizes_of(Shape(B=b, H=h, KVH=kvh, N=n, M=m, D=d))  # the call-time tensors, by their fill rules
        tensors = {name: cp.asarray(x) for name, x in fill_all(manifest.call_tensors, sizes, 0).items()}
        launch(manifest, entry["cubin"], q, k, v, o, lse=lse, tensors=tensors)
        cp.cuda.runtime.deviceSynchronize()
        poisoned = (o == nan_word) if bf16 else cp.isnan(o)
        written = int(o.size - int(cp.count_nonzero(poisoned)))
        print(f"launched {entry['name']} written {written} of {o.size}", flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--launch":
        sys.exit(_launch_all(sys.argv[2]))
    print("usage: python -m flashgen.harness.sanitize --launch KERNELS.json (run under compute-sanitizer)",
          file=sys.stderr)
    sys.exit(2)
