"""The one summary `flashgen generate` ends with: the kernel, whether it was verified and on what GPU (or that it was
compiled and estimated, without a GPU), our time beside each baseline's with the ratio, the roofline estimate, the
candidate kept and why, where the files are.

Built once per run (`summarize`, in flashgen.api.generate) as data: `Kernel.summary`, and the "summary" field of
`flashgen generate --json`; printed by the CLI as plain lines (`summary_lines`): rich Text pieces, never markup, so
a path, a GPU name or a reason prints exactly as it is; one line per fact, never wrapped by rich, so a log keeps
each whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field
from rich.text import Text

NO_GPU = "compiled and estimated, no GPU"
RATIO_MEANING = "baseline time / ours: above 1, ours is faster"
LABEL_WIDTH = 10  # the labels' column: "verified  ", "timing    ", ...


class BaselineTime(BaseModel):
    name: str = Field(description="as the benchmark names it: sdpa_flash, sdpa_cudnn, flex, ...")
    label: str = Field(description="as the reports name it: FLASH, CUDNN, Flex, ...")
    time_ms: float
    ratio: float | None = Field(default=None, description=RATIO_MEANING)


#: a kernel with score or mask functions is timed beside libraries that compute the variant alone
OTHER_FUNCTION_NOTE = ("the baselines compute the variant's attention without this kernel's own functions: "
                       "a reference point, not the same work")
#: the kernel a run with functions is held to (Environment.bench times it beside ours)
PLAIN_TWIN = "flashgen's kernel without the functions"


def visible_words(share: float) -> str:
    """What a mask function's TF/s counts (the summary's and report.md's words)."""
    return f"over the {share:.0%} of the pairs its mask leaves"


class GenerateSummary(BaseModel):
    run_id: int
    status: str
    reason: str
    provider: str
    model_calls: int
    kernel: str
    target: str = Field(description="the GPU the kernel was written for, and its arch")
    verified: bool | None = Field(description="None: verification did not run (no GPU)")
    verified_on: str = Field(description=f"the GPU it ran on, or '{NO_GPU}'")
    verification: str = Field(description="the verification's first line, or what was checked instead")
    shape: str | None = Field(default=None, description="the shape the timings are at")
    time_ms: float | None = None
    tflops: float | None = None
    visible_share: float | None = Field(default=None, description="a mask function's kernel: the share of the pairs "
                                        "it leaves, which `tflops` counts")
    baselines: list[BaselineTime] = Field(default_factory=list)
    baselines_note: str | None = Field(default=None, description="what the baselines do not compute that the kernel "
                                       "does (its own score or mask functions), where that is so")
    plain_ms: float | None = Field(default=None, description="a kernel with functions: flashgen's own kernel without "
                                   "them, timed beside it")
    plain_ratio: float | None = Field(default=None, description="our TF/s over that kernel's (the run's goal for a "
                                      "kernel with functions)")
    estimate: str | None = Field(default=None, description="the roofline lower bound, one line")
    kept: str = Field(description="which candidate is kept and why")
    candidates_compiled: int
    candidates_verified: int
    out_dir: str | None = None
    files: list[str] = Field(default_factory=list)


def summarize(result, meta: dict[str, Any], out_dir: Path | None, written: list[str],
              gpu_name: str | None = None) -> GenerateSummary:
    """The summary of a run that made a kernel (`result.best`); `gpu_name`: the GPU verification ran on."""
    best, target = result.best, meta["target"]
    timing = best.timing
    ran = best.verification.ran
    # a run recorded before the counts were kept still has its best: at least one candidate compiled
    compiled = max(result.candidates_compiled, 1)
    return GenerateSummary(
        run_id=result.run_id, status=result.status, reason=result.reason, provider=_provider(result.provider),
        model_calls=result.iterations, kernel=best.manifest.name, target=f"{target['gpu']} ({target['arch']})",
        verified=best.verification.ok if ran else None,
        verified_on=(gpu_name or "a GPU") if ran else NO_GPU,
        verification=_first_line(best.verification.summary) if ran else
        "the TL was checked on the CPU against the fp64 reference; the kernel has not run",
        shape=timing.shape if timing is not None else None,
        time_ms=timing.time_ms if timing is not None else None,
        tflops=timing.tflops if timing is not None else None,
        visible_share=timing.visible_share if timing is not None else None,
        baselines=_baselines(timing),
        baselines_note=OTHER_FUNCTION_NOTE if meta.get("mods") is not None else None,
        plain_ms=timing.plain_ms if timing is not None else None,
        plain_ratio=timing.plain_ratio if timing is not None else None,
        estimate=_estimate(meta.get("roofline")),
        kept=kept_reason(best, compiled, result.candidates_verified),
        candidates_compiled=compiled, candidates_verified=result.candidates_verified,
        out_dir=str(out_dir) if out_dir is not None else None, files=list(written))


def kept_reason(best, compiled: int, verified: int) -> str:
    """Which candidate the run kept, and why: the loop keeps the fastest verified one, or without a GPU the first
    that compiled (it stops there, having nothing to compare)."""
    where = f"from model call {best.iteration}"
    if not best.verification.ran:
        return f"the first candidate that compiled, {where} (without a GPU the run stops there)"
    if verified <= 1:
        return f"the one verified candidate of {compiled} compiled, {where}"
    return f"the fastest of {verified} verified candidates ({compiled} compiled), {where}"


def _provider(info: dict[str, Any]) -> str:
    model = info.get("model")
    return f"{info.get('name')}" + (f" ({model})" if model else "")


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _baselines(timing) -> list[BaselineTime]:
    if timing is None:
        return []
    from flashgen.harness.bench import BASELINE_LABELS

    ours = timing.time_ms
    return [BaselineTime(name=name, label=BASELINE_LABELS.get(name, name), time_ms=ms,
                         ratio=ms / ours if ours else None)
            for name, ms in timing.baselines_ms.items()]


def _estimate(roof: dict[str, Any] | None) -> str | None:
    if roof is None:
        return None
    return (f"roofline lower bound {roof['time_s'] * 1e3:.3g} ms at {roof['shape']} ({roof['bound']}-bound, "
            f"{roof.get('tflops_at_bound', 0):.0f} TFLOP/s)")


# ------------------------------------------------------------------------------------------------ the terminal


def summary_lines(s: GenerateSummary, command: str = "generate") -> list[Text]:
    """The summary as the lines the CLI prints (plain text with styles; no markup read); `command`: the flashgen
    command whose end it is (generate, build)."""
    lines = [Text.assemble((f"flashgen {command}: {s.status}", "bold"), f" ({s.reason})"),
             _line("run", f"{s.run_id}: {s.model_calls} model calls to {s.provider}"),
             _line("kernel", f"{s.kernel} for {s.target}"),
             _line("verified", *_verified(s))]
    lines += _timing_lines(s)
    if s.estimate is not None:
        lines.append(_line("estimate", s.estimate))
    lines.append(_line("kept", s.kept))
    where = f"{s.out_dir}/" if s.out_dir is not None else "not written (no out folder given)"
    lines.append(_line("files", (where, "bold"), ("  " + ", ".join(s.files)) if s.files else ""))
    return lines


def summary_text(s: GenerateSummary, command: str = "generate") -> str:
    """The summary as plain text (what a log of the CLI shows)."""
    return "\n".join(line.plain for line in summary_lines(s, command))


def _line(label: str, *parts: str | tuple[str, str]) -> Text:
    return Text.assemble((label.ljust(LABEL_WIDTH), "dim"), *parts)


def summary_row(label: str, text: str) -> Text:
    """One more line in the summary's layout (a command's own, after summary_lines)."""
    return _line(label, text)


def _verified(s: GenerateSummary) -> list[str | tuple[str, str]]:
    if s.verified is None:
        return [("no", "yellow"), ": ", (s.verified_on, "yellow"), f" ({s.verification})"]
    word = ("yes", "bold green") if s.verified else ("FAILED", "bold red")
    return [word, f", on {s.verified_on}: {s.verification}"]


def _timing_lines(s: GenerateSummary) -> list[Text]:
    if s.time_ms is None:
        why = "no GPU" if s.verified is None else "the benchmark did not run"
        return [_line("timing", f"not measured, nor the baselines ({why})")]
    speed = f", {s.tflops:.1f} TFLOP/s" if s.tflops else ""
    if s.tflops and s.visible_share is not None:  # the baselines compute every pair; the kernel, what its mask leaves
        speed += " " + visible_words(s.visible_share)
    lines = [_line("timing", f"ours {s.time_ms:.4g} ms at {s.shape}{speed}")]
    if not s.baselines:
        return lines + [_line("", "no baseline ran beside it")]
    width = max(len(b.label) for b in s.baselines)
    for b in s.baselines:
        ratio = "" if b.ratio is None else f"{b.ratio:.2f}x"
        style = "green" if b.ratio is not None and b.ratio >= 1 else "yellow"
        lines.append(_line("", f"{b.label.ljust(width)}  {b.time_ms:>7.4g} ms  ", (ratio, style)))
    lines.append(_line("", (f"(x = {RATIO_MEANING})", "dim")))
    if s.baselines_note:
        lines.append(_line("", (f"({s.baselines_note})", "dim")))
    if s.plain_ms is not None and s.plain_ratio is not None:
        style = "green" if s.plain_ratio >= 1 else "yellow"
        lines.append(_line("", f"{PLAIN_TWIN} {s.plain_ms:.4g} ms: ours at ", (f"{s.plain_ratio:.2f}x", style),
                           " its TF/s"))
    return lines
