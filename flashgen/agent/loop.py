"""The generate loop: sketch -> full TL -> CPU check (parse, check, interpret vs fp64) -> CUDA ->
static check + compile -> verify -> benchmark -> feedback, until the kernel is correct and fast enough
or a budget runs out. One linear conversation per phase; every step is persisted before the next."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from flashgen import prompts
from flashgen.abi import KernelManifest, fields_outline, validation_error_lines
from flashgen.agent.extract import extract
from flashgen.agent.messages import ChatMessage, ModelRequest, Provider, Task
from flashgen.agent.trace import RunTrace
from flashgen.harness.environment import Environment, Timing, Verification, manifest_from_json
from flashgen.variant import __doc__ as VARIANT_CONVENTIONS

Phase = Literal["sketch", "params", "translate"]
KEEP_EXCHANGES = 2  # repair rounds kept in a conversation besides its opening prompt
# the conventions list of flashgen/variant.py, the one statement of what every variant computes
_SEMANTICS = VARIANT_CONVENTIONS[VARIANT_CONVENTIONS.index("- Q is"):].strip()


class Budget(BaseModel):
    max_iters: int = Field(default=12, ge=1, description="model calls")
    max_tokens: int | None = Field(default=None, ge=1)
    max_cost_usd: float | None = Field(default=None, gt=0)
    max_wall_s: float | None = Field(default=None, gt=0)


class LoopConfig(BaseModel):
    task: Task
    budget: Budget = Field(default_factory=Budget)
    goal_speedup: float = Field(default=1.0, gt=0, description="stop once best-baseline time / ours reaches this")
    max_no_code: int = Field(default=3, ge=1, description="replies without usable code tolerated in a row")


class Candidate(BaseModel):
    iteration: int
    sketch: str
    tl: str
    cuda: str
    manifest: KernelManifest
    resources: dict[str, Any] = Field(default_factory=dict)
    toolchain: str = ""
    counts: dict[str, Any] | None = None
    verification: Verification
    timing: Timing | None = None


class LoopState(BaseModel):
    phase: Phase = "sketch"
    conversations: dict[str, list[ChatMessage]] = Field(default_factory=dict)
    next_stage: dict[str, str] = Field(default_factory=dict)
    sketch: str | None = None
    tl: str | None = None
    counts: dict[str, Any] | None = None
    iterations: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    cost_unknown: bool = False
    elapsed_s: float = 0.0
    no_code: int = 0
    last_code: dict[str, str] = Field(default_factory=dict, description="the last code extracted per phase")
    last_also: dict[str, str] = Field(default_factory=dict, description="the rest the last reply gave per phase "
                                      "(translate: its ```json manifest)")
    repeats: int = Field(default=0, description="replies in a row that repeated the previous one after a repair prompt")
    best: Candidate | None = None
    status: Literal["running", "done", "budget", "failed"] = "running"
    reason: str = ""


class LoopResult(BaseModel):
    run_id: int
    task: Task
    provider: dict[str, Any]
    status: str
    reason: str
    best: Candidate | None
    sketch: str | None
    tl: str | None
    iterations: int
    tokens: int
    cost_usd: float | None


class Loop:
    def __init__(self, config: LoopConfig, provider: Provider, env: Environment, trace: RunTrace,
                 state: LoopState | None = None, progress: Callable[[str], None] = lambda _: None):
        self.config, self.provider, self.env, self.trace, self.progress = config, provider, env, trace, progress
        self.state = state or LoopState()
        self.task = config.task
        self.target = env.target(self.task.target)

    # ------------------------------------------------------------------------------ driving

    def run(self) -> LoopResult:
        s, started = self.state, time.monotonic()
        base_elapsed = s.elapsed_s
        while s.status == "running":
            s.elapsed_s = base_elapsed + time.monotonic() - started
            if (exhausted := self._exhausted()) is not None:
                self._stop("budget", exhausted)
                break
            self._step()
            s.elapsed_s = base_elapsed + time.monotonic() - started
            self.trace.event("state", s.model_dump(mode="json"))
        cost = None if s.cost_unknown else s.cost_usd
        result = LoopResult(run_id=self.trace.run_id, task=self.task,
                            provider={"name": self.provider.name, "model": self.provider.model}, status=s.status, reason=s.reason, best=s.best, sketch=s.sketch,
                            tl=s.tl, iterations=s.iterations, tokens=s.input_tokens + s.output_tokens, cost_usd=cost)
        self.trace.finish(s.status, {"reason": s.reason, "iterations": s.iterations, "tokens": result.tokens,
                                     "cost_usd": cost, "has_kernel": s.best is not None})
        return result

    def _exhausted(self) -> str | None:
        s, b = self.state, self.config.budget
        if s.iterations >= b.max_iters:
            return f"iteration budget spent ({s.iterations} model calls)"
        if b.max_tokens is not None and s.input_tokens + s.output_tokens >= b.max_tokens:
            return f"token budget spent ({s.input_tokens + s.output_tokens} >= {b.max_tokens})"
        if b.max_cost_usd is not None and s.cost_usd >= b.max_cost_usd:
            return f"cost budget spent (${s.cost_usd:.4f} >= ${b.max_cost_usd:g})"
        if b.max_wall_s is not None and s.elapsed_s >= b.max_wall_s:
            return f"wall-time budget spent ({s.elapsed_s:.0f} s)"
        return None

    def _stop(self, status: str, reason: str) -> None:
        kept = " (keeping the best kernel so far)" if self.state.best is not None and status != "done" else ""
        self.state.status, self.state.reason = status, reason + kept  # type: ignore[assignment]
        self.progress(f"{status}: {reason}{kept}")

    def _step(self) -> None:
        s, phase = self.state, self.state.phase
        conversation = s.conversations.setdefault(phase, [])
        if not conversation:
            self._say(phase, [ChatMessage(role="system", content=prompts.render("system")),
                              ChatMessage(role="user", content=self._opening_prompt(phase))], phase)
        stage = s.next_stage.get(phase, phase)
        messages = conversation[:2] + conversation[2:][-2 * KEEP_EXCHANGES:]
        request = ModelRequest(stage=stage, messages=messages, task=self.task, phase=phase)
        s.iterations += 1
        self.progress(f"[{s.iterations}] {stage}: asking {self.provider.name}")
        reply = self.provider.complete(request)
        s.input_tokens += reply.usage.input_tokens
        s.output_tokens += reply.usage.output_tokens
        if reply.cost_usd is None:
            s.cost_unknown = True
        else:
            s.cost_usd += reply.cost_usd
        conversation.append(ChatMessage(role="assistant", content=reply.text))
        self.trace.event("reply", {"phase": phase, "stage": stage, "iteration": s.iterations, "text": reply.text,
                                   "model": reply.model, "usage": reply.usage.model_dump(), "cost_usd": reply.cost_usd,
                                   "attempts": reply.attempts, "note": reply.note})
        getattr(self, f"_evaluate_{phase}")(reply.text)

    def _say(self, phase: str, messages: list[ChatMessage], stage: str) -> None:
        self.state.conversations.setdefault(phase, []).extend(messages)
        self.state.next_stage[phase] = stage
        self.trace.event("prompt", {"phase": phase, "stage": stage, "messages": [m.model_dump() for m in messages]})

    def _repair(self, phase: str, stage: str, **context) -> None:
        self.progress(f"    -> {stage}")
        self.trace.event("result", {"phase": phase, "ok": False, "repair": stage, **context})
        self._say(phase, [ChatMessage(role="user", content=prompts.render(stage, target=self.target, **context))], stage)

    def _repeat(self, phase: str, stage: str, what: str) -> None:
        """Ask the last repair prompt once more, saying that the reply repeated the previous one."""
        conversation = self.state.conversations.get(phase, [])
        asked = next((m.content for m in reversed(conversation) if m.role == "user"), "")
        self.progress(f"    -> {stage} again (the reply repeated the previous one)")
        self.trace.event("result", {"phase": phase, "ok": False, "repair": stage, "repeated": True})
        self._say(phase, [ChatMessage(role="user", content=prompts.render("repeated", what=what, previous=asked))], stage)

    def _code(self, phase: str, text: str, kind: str, also: str = "", what: str = "") -> str | None:
        """The reply's `kind` code, or None (after a repair prompt or a stop). `also`: the rest of what the step
        asked for (the translate step's manifest); only a reply identical in the code and in `also` repeats the
        last one, and a repeat after a repair prompt is asked once more, saying so, before the run stops."""
        s = self.state
        found = extract(text, kind)  # type: ignore[arg-type]
        if found is not None and not found.truncated:
            s.no_code = 0
            stage = s.next_stage.get(phase, phase)
            repeated = (found.code.split() == s.last_code.get(phase, "").split()
                        and also.split() == s.last_also.get(phase, "").split())
            s.last_code[phase], s.last_also[phase] = found.code, also
            if not (repeated and stage.startswith("repair_") and stage not in ("repair_no_code", "repair_slow")):
                s.repeats = 0
                return found.code
            what = what or ("LLM-TL" if kind == "tl" else "CUDA")
            s.repeats += 1
            if s.repeats > 1:
                self._stop("failed", f"the {self.provider.name} provider answered the {stage} feedback twice with the "
                                     f"same {what} as before")
                return None
            self._repeat(phase, stage, what)
            return None
        s.no_code += 1
        if s.no_code > self.config.max_no_code:
            self._stop("failed", f"{s.no_code} replies in a row had no usable {kind} code")
            return None
        note = found.note if found is not None else ""
        self._repair(phase, "repair_no_code", what="LLM-TL" if kind == "tl" else "CUDA", tag=kind, note=note)
        return None

    # ------------------------------------------------------------------------------ phases

    def _evaluate_sketch(self, text: str) -> None:
        if (tl := self._code("sketch", text, "tl")) is None:
            return
        t = self.task
        check = self.env.check_tl(tl, t.variant, self.target, t.dtype, t.head_dim, full=False)
        if not check.ok:
            return self._repair("sketch", check.repair or "repair_syntax", diagnostics=check.diagnostics,
                                excerpt=check.excerpt)
        self.state.sketch, self.state.phase = tl, "params"
        self.trace.event("result", {"phase": "sketch", "ok": True})

    def _evaluate_params(self, text: str) -> None:
        s, t = self.state, self.task
        if (tl := self._code("params", text, "tl")) is None:
            return
        if s.next_stage.get("params") == "repair_slow" and tl.split() == (s.tl or "").split():
            return self._stop("done", "no faster program proposed after the timing feedback")
        check = self.env.check_tl(tl, t.variant, self.target, t.dtype, t.head_dim, full=True)
        if not check.ok:
            return self._repair("params", check.repair or "repair_check", diagnostics=check.diagnostics,
                                excerpt=check.excerpt, summary=check.summary, shape=check.shape)
        s.tl, s.counts, s.phase = tl, check.counts, "translate"
        s.conversations["translate"] = []  # a new program: a new translation conversation
        self.trace.event("result", {"phase": "params", "ok": True, "counts": check.counts})

    def _evaluate_translate(self, text: str) -> None:
        s = self.state
        manifest_block = extract(text, "json")
        # the step asks for the CUDA and the manifest: a reply that changes either is a new attempt
        manifest_text = manifest_block.code if manifest_block is not None else ""
        if (cuda := self._code("translate", text, "cuda", also=manifest_text, what="CUDA and manifest")) is None:
            return
        try:
            manifest = (manifest_from_json(manifest_block.code) if manifest_block is not None
                        else self.env.manifest_for(s.tl, self.target))
        except (ValueError, ValidationError) as exc:
            errors = validation_error_lines(exc, KernelManifest)
            return self._repair("translate", "repair_compile", feedback="the manifest is invalid", ask_manifest=True,
                                manifest_errors=errors)
        build = self.env.build(cuda, manifest, self.target)
        if not build.ok:
            return self._repair("translate", "repair_compile", feedback=build.feedback, ask_manifest=False,
                                manifest_errors=[])
        self.trace.event("candidate", {"iteration": s.iterations, "resources": build.resources},
                         artifacts={"kernel.tl": s.tl or "", "kernel.cu": cuda, "manifest.json": manifest.model_dump_json()})
        candidate = Candidate(iteration=s.iterations, sketch=s.sketch or "", tl=s.tl or "", cuda=cuda,
                              manifest=manifest, resources=build.resources, toolchain=build.toolchain,
                              counts=s.counts, verification=Verification(ran=False))
        if not self.env.gpu_available():
            candidate.verification.summary = "no GPU here: verification and timing did not run"
            s.best = candidate
            self.trace.event("result", {"phase": "translate", "ok": True, "compiled": True, "verified": None})
            return self._stop("done", "compiled; no GPU, so the kernel was neither verified nor timed")
        candidate.verification = self.env.verify(cuda, manifest, build)
        if not candidate.verification.ok:
            return self._repair("translate", "repair_wrong", summary=candidate.verification.summary)
        candidate.timing = timing = self.env.bench(cuda, manifest, build, self.target)
        if s.best is None or not s.best.verification.ok or _faster(candidate, s.best):
            s.best = candidate
        self.trace.event("result", {"phase": "translate", "ok": True, "verified": True, "timing": timing.model_dump()})
        speedup = timing.speedup
        if speedup is None or speedup >= self.config.goal_speedup:
            return self._stop("done", "correct" + ("" if speedup is None else f", {speedup:.2f}x the best baseline"))
        s.phase = "params"
        best = timing.best_baseline
        self._repair("params", "repair_slow", goal_ratio=self.config.goal_speedup,
                     timings=f"{timing.time_ms:.4g} ms ({timing.tflops or 0:.1f} TFLOP/s) at {timing.shape}",
                     roofline=("n/a" if timing.roofline_percent is None else f"{timing.roofline_percent:.0f}% of the bound"),
                     resources=build.resources, baseline=f"{best[0]} {best[1]:.4g} ms" if best else "none")

    def _opening_prompt(self, phase: str) -> str:
        t, target = self.task, self.target
        common = dict(target=target, dtype=t.dtype.value, head_dim=t.head_dim, variant_name=t.variant.name,
                      variant_lines=_variant_lines(t.variant), semantics=_SEMANTICS)
        if phase == "sketch":
            return prompts.render("sketch", tl_reference=self.env.tl_reference(), **common)
        if phase == "params":
            return prompts.render("params", tl_reference=self.env.tl_reference(), sketch=self.state.sketch,
                                  hardware=self.env.hardware_facts(target), **common)
        example_tl, example_cuda, example_manifest = self.env.worked_example(target, t.dtype, t.head_dim)
        return prompts.render("translate", tl=self.state.tl, abi_header=self.env.abi_header(),
                              primitives=self.env.primitives_doc(target, t.dtype), example_tl=example_tl,
                              example_cuda=example_cuda, manifest_fields=fields_outline(KernelManifest),
                              example_manifest=json.dumps(example_manifest.model_dump(mode="json"), indent=1),
                              **common)


def _faster(a: Candidate, b: Candidate) -> bool:
    ta = a.timing.time_ms if a.timing else None
    tb = b.timing.time_ms if b.timing else None
    return ta is not None and (tb is None or ta < tb)


def _variant_lines(variant) -> list[str]:
    fields = variant.model_dump(mode="json")
    return [f"{k} = {v}" for k, v in fields.items()]


def run_loop(config: LoopConfig, provider: Provider, env: Environment | None = None, store=None,
             provider_info: dict[str, Any] | None = None, progress: Callable[[str], None] = lambda _: None) -> LoopResult:
    """Start a run. `provider_info` (name, model, base_url) is recorded so that a resume can rebuild it."""
    env = env or Environment()
    store = store if store is not None else env.open_store()
    trace = RunTrace.start(store, {"loop": config.model_dump(mode="json"), "provider": provider_info or
                                   {"name": provider.name, "model": provider.model}})
    return Loop(config, provider, env, trace, progress=progress).run()


def resume_loop(run_id: str | int, provider_factory: Callable[[dict[str, Any]], Provider], env: Environment | None = None,
                store=None, progress: Callable[[str], None] = lambda _: None) -> LoopResult:
    """Continue run `run_id` from its last persisted state (the step after the last completed one)."""
    env = env or Environment()
    store = store if store is not None else env.open_store()
    trace, config, snapshot = RunTrace.reopen(store, run_id)
    loop_config = LoopConfig.model_validate(config["loop"])
    state = LoopState.model_validate(snapshot) if snapshot else LoopState()
    if state.status != "running":
        progress(f"run {run_id} had already ended ({state.status}: {state.reason})")
    trace.event("resume", {"from_iteration": state.iterations})
    return Loop(loop_config, provider_factory(config["provider"]), env, trace, state, progress).run()
