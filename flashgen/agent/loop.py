"""The generate loop: sketch -> full TL -> CPU check (parse, check, interpret vs fp64) -> CUDA ->
static check + compile -> verify -> benchmark -> feedback, until the kernel is correct and fast enough
or a budget runs out. One linear conversation per phase; every step is persisted before the next.

However a run ends (done, budget, failed, a provider error, a crash of a stage, SIGINT or SIGTERM) it is marked
ended in the store with the reason and whether `--resume` can help. `--max-wall` bounds the whole run: the model
call gets the time left as its deadline, and a watchdog (SIGALRM, in the main thread) stops any step that outlives
it by more than WALL_GRACE_S."""

from __future__ import annotations

import hashlib
import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal, get_args

from pydantic import BaseModel, Field, ValidationError

from flashgen import prompts
from flashgen.abi import SIZE_NAMES, KernelManifest, fields_outline, validation_error_lines
from flashgen.agent.extract import extract
from flashgen.agent.messages import (
    ChatMessage,
    DeadlineExceeded,
    ModelRequest,
    NoFurtherReply,
    Provider,
    ProviderError,
    Task,
)
from flashgen.agent.summary import PLAIN_TWIN
from flashgen.agent.trace import RunTrace
from flashgen.errors import Interrupted, UsageError
from flashgen.harness.environment import Environment, Timing, Verification, manifest_from_json
from flashgen.mods import FUNCTION_GOAL
from flashgen.operators import SIZE_FUNCTIONS
from flashgen.prompts.internal import for_model, for_model_code
from flashgen.prompts.rules import reference_for, rules_for
from flashgen.targets import writes_role_dataflow
from flashgen.variant import __doc__ as VARIANT_CONVENTIONS

Phase = Literal["sketch", "params", "translate"]
# every phase needs one accepted reply before the first kernel exists: the fewest model calls that can make one
MIN_MODEL_CALLS = len(get_args(Phase))
KEEP_EXCHANGES = 2  # repair rounds kept in a conversation besides its opening prompt
WALL_GRACE_S = 5.0  # how long a step may outlive --max-wall before the watchdog stops it
REPLY_HEAD_CHARS = 2000  # what the record keeps of a reply refused for its size
# the conventions list of flashgen/variant.py, the one statement of what every variant computes
_SEMANTICS = VARIANT_CONVENTIONS[VARIANT_CONVENTIONS.index("- Q is"):VARIANT_CONVENTIONS.index("\nTwo-sided")].strip()
# its two-sided window line, told only to a task that has one (the other prompts stay as they were), and its line of
# V's own head dim likewise
_TWO_SIDED = VARIANT_CONVENTIONS[VARIANT_CONVENTIONS.index("- Two-sided window"):
                                 VARIANT_CONVENTIONS.index("\nV's own head dim")].strip()
_OWN_DV = VARIANT_CONVENTIONS[VARIANT_CONVENTIONS.index("- V's own head dim"):].strip()


class Budget(BaseModel):
    # at least 1 here: a resume may go on one step at a time; a new run needs MIN_MODEL_CALLS (check_makes_a_kernel)
    max_iters: int = Field(default=12, ge=1, description="model calls")
    max_tokens: int | None = Field(default=None, ge=1)
    max_cost_usd: float | None = Field(default=None, gt=0)
    max_wall_s: float | None = Field(default=None, gt=0)


def check_makes_a_kernel(max_iters: int, flag: str | None = None) -> None:
    """Refuse, before any model call, an iteration budget too small to make a kernel (a run that could only end in
    'no kernel'), as one line naming the minimum and `flag` (the CLI's '--max-iters'; else the API's max_iters)."""
    if max_iters < MIN_MODEL_CALLS:
        given = f"{flag} {max_iters}" if flag else f"max_iters={max_iters}"
        raise UsageError(f"{given}: too small to make a kernel, which takes at least {MIN_MODEL_CALLS} model calls "
                         f"(one per phase: {', '.join(get_args(Phase))}); give {MIN_MODEL_CALLS} or more")


class LoopConfig(BaseModel):
    task: Task
    budget: Budget = Field(default_factory=Budget)
    goal_speedup: float = Field(default=1.0, gt=0, description="stop once best-baseline time / ours reaches this")
    function_goal: float = Field(default=FUNCTION_GOAL, gt=0, description="a kernel with score or mask functions: "
                                 "stop once its TF/s over that of flashgen's kernel without them reaches this")
    max_no_code: int = Field(default=3, ge=1, description="replies without usable code tolerated in a row")
    max_reply_chars: int = Field(default=200_000, ge=1000, description="a longer reply is refused: recorded by its "
                                 "head and hash only, never sent back in a prompt")
    reference_tl: str | None = Field(default=None, description="a full TL program whose fp64 interpretation the CPU "
                                     "check and the GPU verification compare with (flashgen build: the user's program, "
                                     "when it computes something its Variant does not describe); None: the variant's")
    softmax_scale: float | None = Field(default=None, gt=0, allow_inf_nan=False, description="the softmax scale the "
                                        "CPU check, the GPU verification and the timing run with (the kernel takes it "
                                        "at run time, FlashgenAttnParams.scale); None: 1/sqrt(D)")
    num_splits: int | None = Field(default=None, ge=1, le=256, description="split-KV decode: this many splits, "
                                   "whatever the sizes (the manifest's num_splits); None: the translator's expression "
                                   "chooses by the sizes")


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
    candidates_compiled: int = Field(default=0, description="candidates that compiled (the summary's 'of K')")
    candidates_verified: int = Field(default=0, description="candidates that passed verification on a GPU")
    status: Literal["running", "done", "budget", "failed", "error", "interrupted"] = "running"
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
    candidates_compiled: int = 0
    candidates_verified: int = 0
    softmax_scale: float | None = Field(default=None, description="the caller's softmax scale (LoopConfig's)")
    num_splits: int | None = Field(default=None, description="the caller's split-KV split count (LoopConfig's)")
    resume: dict[str, Any] = Field(default_factory=dict, description="helps (bool) and how: whether --resume can help")


class WallTimeExceeded(BaseException):
    """Raised by the watchdog inside a step that outlives --max-wall (a BaseException, so that no stage's
    `except Exception` swallows it)."""


@contextmanager
def _watchdog(deadline: float | None, grace_s: float) -> Iterator[None]:
    """SIGALRM at `deadline` + grace raises WallTimeExceeded wherever the step is (a socket read, nvcc's wait, the
    interpreter). Only in the main thread and when no other interval timer is set; elsewhere the step relies on its
    own bounds (the model call's deadline, the worker's and the compiler's timeouts)."""
    if (deadline is None or not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread()
            or signal.getitimer(signal.ITIMER_REAL)[0] > 0):
        yield
        return
    left = deadline + grace_s - time.monotonic()
    if left <= 0:
        raise WallTimeExceeded()

    def on_alarm(_signum, _frame):
        raise WallTimeExceeded()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, left)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# the budget a stop names -> the flag that raises it on --resume
_BUDGET_FLAGS = {"iteration": "--max-iters", "token": "--max-tokens", "cost": "--max-cost", "wall-time": "--max-wall"}


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
        wall = self.config.budget.max_wall_s
        self._deadline = None if wall is None else started + wall - base_elapsed
        self._stage, self._end_kind = s.next_stage.get(s.phase, s.phase), ""

        def tick() -> None:
            s.elapsed_s = base_elapsed + time.monotonic() - started

        try:
            while s.status == "running":
                tick()
                if (exhausted := self._exhausted()) is not None:
                    self._end_kind = exhausted[1]
                    self._stop("budget", exhausted[0])
                    break
                try:
                    with _watchdog(self._deadline, WALL_GRACE_S):
                        self._step()
                except WallTimeExceeded:
                    tick()
                    self._end_kind = "wall-time"
                    self._stop("budget", f"wall-time budget spent ({s.elapsed_s:.0f} s, inside the {self._stage} step)")
                    break
                except ProviderError as exc:
                    tick()
                    if isinstance(exc, NoFurtherReply):  # nothing asked of a model: no model call counted
                        s.iterations -= 1
                        self._stop("failed", str(exc))
                    elif isinstance(exc, DeadlineExceeded) and exc.wall:
                        self._end_kind = "wall-time"
                        self._stop("budget", f"wall-time budget spent ({s.elapsed_s:.0f} s, waiting for the model at "
                                             f"the {self._stage} step)")
                    else:
                        self._end_kind = "provider-transient" if exc.transient else "provider"
                        self._stop("error", str(exc))
                    break
                tick()
                self.trace.event("state", s.model_dump(mode="json"))
        except KeyboardInterrupt as exc:  # SIGINT, or SIGTERM turned into Interrupted by the CLI
            tick()
            name = exc.signal_name if isinstance(exc, Interrupted) else "SIGINT"
            self._end_kind = "interrupted"
            self._stop("interrupted", f"interrupted by {name} during the {self._stage} step")
            result = self._finish()
            raise Interrupted(f"interrupted ({name}): run {result.run_id} stopped during the {self._stage} step and "
                              f"was recorded; {result.resume['how']}", name) from None
        except (Exception, SystemExit) as exc:  # a crash of a stage: recorded, then reported as the bug it is
            tick()
            self._end_kind = "crash"
            self._stop("error", f"the {self._stage} step crashed: {type(exc).__name__}: {exc}")
            self._finish()
            raise
        return self._finish()

    def _finish(self) -> LoopResult:
        s = self.state
        cost = None if s.cost_unknown else s.cost_usd
        resume = self._resume_hint()
        result = LoopResult(run_id=self.trace.run_id, task=self.task,
                            provider={"name": self.provider.name, "model": self.provider.model}, status=s.status,
                            reason=s.reason, best=s.best, sketch=s.sketch, tl=s.tl, iterations=s.iterations,
                            tokens=s.input_tokens + s.output_tokens, cost_usd=cost,
                            candidates_compiled=s.candidates_compiled, candidates_verified=s.candidates_verified,
                            softmax_scale=self.config.softmax_scale, num_splits=self.config.num_splits,
                            resume=resume)
        self.trace.finish(s.status, {"reason": s.reason, "iterations": s.iterations, "tokens": result.tokens,
                                     "cost_usd": cost, "has_kernel": s.best is not None, "resume": resume})
        return result

    def _resume_hint(self) -> dict[str, Any]:
        """Whether `flashgen generate --resume RUN --out DIR` can help, and how (what `runs show` prints)."""
        s, run = self.state, self.trace.run_id
        cmd = f"flashgen generate --resume {run} --out DIR"
        kind = self._end_kind
        if s.status == "done":
            return {"helps": False, "how": "nothing to resume: the run is done"}
        if s.status == "failed":
            return {"helps": True, "how": f"`{cmd} --provider P --model M` asks another model the request that ended "
                                          "it (the same model would repeat its replies)"}
        if s.status == "budget":
            flag = _BUDGET_FLAGS.get(kind, "--max-iters")
            return {"helps": True, "how": f"`{cmd} {flag} N` continues it with a larger budget (N counts the whole "
                                          "run)"}
        if s.status == "interrupted":
            return {"helps": True, "how": f"`{cmd}` continues it from the step it was in"}
        if kind == "provider-transient":
            return {"helps": True, "how": f"`{cmd}` continues it once the provider answers again"}
        if kind == "provider":
            return {"helps": True, "how": f"`{cmd}` repeats the refused request: it helps only once the cause (key, "
                                          "model name, quota) is fixed, or with `--provider P --model M` (another "
                                          "model)"}
        return {"helps": True, "how": f"`{cmd}` repeats the step that crashed: it helps only once the cause is fixed "
                                      "(a crash is a flashgen bug: please report it)"}

    def _exhausted(self) -> tuple[str, str] | None:
        """(why, which budget) once a budget is spent."""
        s, b = self.state, self.config.budget
        if s.iterations >= b.max_iters:
            return f"iteration budget spent ({s.iterations} model calls)", "iteration"
        if b.max_tokens is not None and s.input_tokens + s.output_tokens >= b.max_tokens:
            return f"token budget spent ({s.input_tokens + s.output_tokens} >= {b.max_tokens})", "token"
        if b.max_cost_usd is not None and s.cost_usd >= b.max_cost_usd:
            return f"cost budget spent (${s.cost_usd:.4f} >= ${b.max_cost_usd:g})", "cost"
        if b.max_wall_s is not None and s.elapsed_s >= b.max_wall_s:
            return f"wall-time budget spent ({s.elapsed_s:.0f} s)", "wall-time"
        return None

    def _stop(self, status: str, reason: str) -> None:
        kept = " (keeping the best kernel so far)" if self.state.best is not None and status != "done" else ""
        self.state.status, self.state.reason = status, reason + kept  # type: ignore[assignment]
        if status not in ("error", "interrupted"):  # those are said once, by the error that ends the command
            self.progress(f"{status}: {reason}{kept}")

    def _step(self) -> None:
        s, phase = self.state, self.state.phase
        conversation = s.conversations.setdefault(phase, [])
        if not conversation:
            self._say(phase, [ChatMessage(role="system", content=prompts.render("system")),
                              ChatMessage(role="user", content=self._opening_prompt(phase))], phase)
        stage = self._stage = s.next_stage.get(phase, phase)
        messages = conversation[:2] + conversation[2:][-2 * KEEP_EXCHANGES:]
        request = ModelRequest(stage=stage, messages=messages, task=self.task, phase=phase, deadline=self._deadline)
        s.iterations += 1
        self.progress(f"[{s.iterations}] {stage}: asking {self.provider.name}")
        reply = self.provider.complete(request)
        s.input_tokens += reply.usage.input_tokens
        s.output_tokens += reply.usage.output_tokens
        if reply.cost_usd is None:
            s.cost_unknown = True
        else:
            s.cost_usd += reply.cost_usd
        if len(reply.text) > self.config.max_reply_chars:
            return self._oversized(phase, stage, reply)
        conversation.append(ChatMessage(role="assistant", content=reply.text))
        self.trace.event("reply", {"phase": phase, "stage": stage, "iteration": s.iterations, "text": reply.text,
                                   "model": reply.model, "usage": reply.usage.model_dump(), "cost_usd": reply.cost_usd,
                                   "attempts": reply.attempts, "note": reply.note})
        getattr(self, f"_evaluate_{phase}")(reply.text)

    def _oversized(self, phase: str, stage: str, reply) -> None:
        """A reply over max_reply_chars: only its head and hash are recorded, the conversation gets a one-line
        stand-in (so the next prompt does not carry it), and it counts as a reply without usable code."""
        s, cap, size = self.state, self.config.max_reply_chars, len(reply.text)
        digest = hashlib.sha256(reply.text.encode("utf-8", "surrogatepass")).hexdigest()
        refused = f"a reply of {size} characters, over the {cap}-character limit, was discarded"
        s.conversations[phase].append(ChatMessage(role="assistant", content=f"[{refused}]"))
        self.trace.event("reply", {"phase": phase, "stage": stage, "iteration": s.iterations,
                                   "text": reply.text[:REPLY_HEAD_CHARS], "refused": refused, "chars": size,
                                   "sha256": digest, "model": reply.model, "usage": reply.usage.model_dump(),
                                   "cost_usd": reply.cost_usd, "attempts": reply.attempts, "note": reply.note})
        self.progress(f"    {refused}")
        kind = "cuda" if phase == "translate" else "tl"
        s.no_code += 1
        if s.no_code > self.config.max_no_code:
            return self._stop("failed", f"{s.no_code} replies in a row had no usable {kind} code (the last: {refused})")
        self._repair(phase, "repair_no_code", what="LLM-TL" if kind == "tl" else "CUDA", tag=kind,
                     note=f"{refused}; answer with the code alone, well under {cap} characters")

    def _say(self, phase: str, messages: list[ChatMessage], stage: str) -> None:
        self.state.conversations.setdefault(phase, []).extend(messages)
        self.state.next_stage[phase] = stage
        self.trace.event("prompt", {"phase": phase, "stage": stage, "messages": [m.model_dump() for m in messages]})

    def _repair(self, phase: str, stage: str, **context) -> None:
        self.progress(f"    -> {stage}")
        self.trace.event("result", {"phase": phase, "ok": False, "repair": stage, **context})
        t = self.task
        content = prompts.render(stage, target=self.target, rules=rules_for(stage, self.target, t.dtype, t.variant),
                                 **context)
        self._say(phase, [ChatMessage(role="user", content=content)], stage)

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
        reference = {"reference_tl": self.config.reference_tl} if self.config.reference_tl else {}
        check = self.env.check_tl(tl, t.variant, self.target, t.dtype, t.head_dim, full=True, **reference,
                                  **self._scale(), **t.dims)
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
            return self._repair("translate", "repair_compile", feedback="the manifest is invalid",
                                manifest_errors=errors)
        if self.config.reference_tl and manifest.reference_tl is None:  # a model's manifest: the checked TL is it
            manifest = manifest.model_copy(update={"reference_tl": s.tl})
        if (tensors := _call_tensors(s.tl or "")) != manifest.mod_tensors:  # the checked TL's Tensor lines, in order
            manifest = manifest.model_copy(update={"mod_tensors": tensors})
        if self.config.num_splits is not None and manifest.variant.split_kv:  # the caller's split count, fixed
            manifest = manifest.model_copy(update={"num_splits": str(self.config.num_splits)})
        build = self.env.build(cuda, manifest, self.target)
        if not build.ok:
            return self._repair("translate", "repair_compile", feedback=build.feedback, manifest_errors=[])
        s.candidates_compiled += 1
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
        candidate.verification = self.env.verify(cuda, manifest, build, **self._scale())
        if not candidate.verification.ok:
            return self._repair("translate", "repair_wrong", summary=candidate.verification.summary)
        s.candidates_verified += 1
        # a kernel with functions is timed beside flashgen's plain kernel and counts the pairs its mask leaves (the
        # task's functions; environments of runs without functions are not handed any)
        mods = {"mods": self.task.mods} if self.task.mods is not None else {}
        candidate.timing = timing = self.env.bench(cuda, manifest, build, self.target, **self._scale(), **mods)
        if s.best is None or not s.best.verification.ok or _faster(candidate, s.best):
            s.best = candidate
        self.trace.event("result", {"phase": "translate", "ok": True, "verified": True, "timing": timing.model_dump()})
        best = timing.best_baseline
        baseline = f"{best[0]} {best[1]:.4g} ms" if best else "none"
        if timing.plain_ratio is not None:
            # score or mask functions: the libraries compute the variant alone, so the goal is flashgen's own
            # kernel without the functions, timed beside this one
            ratio, goal = timing.plain_ratio, self.config.function_goal
            reached = f"{ratio:.2f}x the TF/s of {PLAIN_TWIN}"
            goal_text = f"{goal}x the TF/s of {PLAIN_TWIN}"
            baseline += f" (computes the variant without your functions); {PLAIN_TWIN} {timing.plain_ms:.4g} ms"
        else:
            ratio, goal = timing.speedup, self.config.goal_speedup
            reached = None if ratio is None else f"{ratio:.2f}x the best baseline"
            goal_text = f"{goal}x the best baseline"
        if ratio is None or ratio >= goal:
            return self._stop("done", "correct" + ("" if reached is None else f", {reached}"))
        s.phase = "params"
        self._repair("params", "repair_slow", goal=goal_text,
                     timings=f"{timing.time_ms:.4g} ms ({timing.tflops or 0:.1f} TFLOP/s) at {timing.shape}",
                     roofline=("n/a" if timing.roofline_percent is None else f"{timing.roofline_percent:.0f}% of the bound"),
                     resources=build.resources, warnings=build.warnings, baseline=baseline)

    def _scale(self) -> dict[str, float]:
        """The caller's softmax scale for the CPU check, verification and timing (nothing: they use 1/sqrt(D))."""
        return {} if self.config.softmax_scale is None else {"scale": self.config.softmax_scale}

    def _opening_prompt(self, phase: str) -> str:
        """The step's first prompt: the task, and what the step needs of the language, the hardware and the
        harness (flashgen.prompts.rules decides which of the target's rules each step gets), free of the
        package's internal names (flashgen.prompts.internal)."""
        t, target = self.task, self.target
        common = dict(target=target, dtype=t.dtype.value, head_dim=t.head_dim, head_dim_v=t.head_dim_v,
                      variant_name=t.variant.name,
                      variant_lines=_variant_lines(t.variant),
                      semantics=_SEMANTICS + ("\n" + _TWO_SIDED if t.variant.two_sided else "")
                      + ("\n" + _OWN_DV if t.head_dim_v is not None else ""),
                      rules=rules_for(phase, target, t.dtype, t.variant))
        if t.mods is not None:  # the score and mask functions, told with the task (the other prompts stay as they were)
            from flashgen.mods import prompt_lines

            common["mod_lines"] = prompt_lines(t.mods, t.variant)
        if phase in ("sketch", "params"):
            reference = reference_for(self.env.tl_reference(), target, t.dtype, t.variant)
            if phase == "sketch":
                return prompts.render("sketch", tl_reference=reference, **common)
            return prompts.render("params", tl_reference=reference, sketch=self.state.sketch,
                                  hardware=self.env.hardware_facts(target), **common)
        example_tl, example_cuda, example_manifest = self.env.worked_example(target, t.dtype, t.head_dim, **t.dims)
        shown = example_manifest.model_dump(mode="json")
        shown["notes"] = for_model(shown.get("notes") or "")
        return prompts.render("translate", tl=self.state.tl, abi_header=for_model_code(self.env.abi_header()),
                              example_tl=example_tl, example_cuda=for_model_code(example_cuda),
                              example_entry=example_manifest.launches[0].kernel,
                              manifest_fields=fields_outline(KernelManifest), example_manifest=json.dumps(shown, indent=1),
                              size_names=", ".join(SIZE_NAMES),
                              size_functions=", ".join(f"`{f}(a, b)`" for f in SIZE_FUNCTIONS),
                              roles=writes_role_dataflow(target.arch, t.dtype, t.variant.split_kv), **common)


def _call_tensors(tl: str) -> list[str]:
    """The call-time tensors of a checked TL (its `Tensor` lines, as the manifest writes them): what the kernel's
    FlashgenAttnParams.mod_tensors slots hold, whatever a model's manifest says."""
    from flashgen.tl_spec.parser import parse
    from flashgen.tl_spec.tensors import spec_of

    return [spec_of(decl).text for decl in parse(tl, "kernel.tl").tensor_decls] if "Tensor" in tl else []


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
                store=None, progress: Callable[[str], None] = lambda _: None,
                budget: dict[str, Any] | None = None, provider: dict[str, Any] | None = None) -> LoopResult:
    """Continue run `run_id` from its last persisted state (the step after the last completed one). `budget`: Budget
    fields that replace the recorded ones (a run that ended on its budget continues with a larger one). `provider`:
    name, model and base_url to go on with instead of the provider the run last used (a name alone: that
    provider's default model); recorded with the resume, so that a later resume keeps it. A run that failed on its
    model's replies (the same reply twice, no code) goes on only with another provider or model: the request that
    ended it is asked again, of the new one. What the resume will do is said first (`progress`) and recorded."""
    env = env or Environment()
    store = store if store is not None else env.open_store()
    trace, config, snapshot = RunTrace.reopen(store, run_id)
    loop_config = LoopConfig.model_validate(config["loop"])
    if budget:
        loop_config.budget = Budget.model_validate({**loop_config.budget.model_dump(), **budget})
    state = LoopState.model_validate(snapshot) if snapshot else LoopState()
    before = dict(config["provider"])
    info = _provider_after(before, provider)
    changed = _provider_label(info) != _provider_label(before)
    if state.status == "failed" and changed:
        _reopen_failed(state)
    going_on = provider_factory(info)  # a provider that cannot be made (no model, no key) fails before the record
    plan = _resume_plan(run_id, state, info, before, changed)
    progress(plan)
    trace.event("resume", {"from_iteration": state.iterations, "budget": loop_config.budget.model_dump(),
                           "provider": info, "previous_provider": before, "plan": plan})
    return Loop(loop_config, going_on, env, trace, state, progress).run()


def _provider_after(before: dict[str, Any], given: dict[str, Any] | None) -> dict[str, Any]:
    """The provider a resume goes on with: the recorded one, with what was given instead (another provider's name
    drops the recorded model and base URL, which were the old provider's)."""
    given = {k: v for k, v in (given or {}).items() if v is not None}
    if not given:
        return before
    if given.get("name") not in (None, before.get("name")):
        keep = {k: v for k, v in before.items() if k not in ("name", "model", "base_url")}
        return {**keep, "model": None, "base_url": None, **given}
    return {**before, **given}


def _provider_label(info: dict[str, Any]) -> str:
    model = info.get("model")
    return f"{info.get('name')}" + (f" ({model})" if model else "") + (f" at {info['base_url']}" if info.get("base_url")
                                                                       else "")


def _reopen_failed(state: LoopState) -> None:
    """A run that failed on its model's replies, going on with another model: running again from the request that
    ended it (the conversation loses the reply that ended it, so that it ends on that request)."""
    conversation = state.conversations.get(state.phase, [])
    while conversation and conversation[-1].role == "assistant":
        conversation.pop()
    state.status, state.reason, state.repeats, state.no_code = "running", "", 0, 0
    state.last_code.pop(state.phase, None)
    state.last_also.pop(state.phase, None)


def _resume_plan(run_id: str | int, state: LoopState, info: dict[str, Any], before: dict[str, Any],
                 changed: bool) -> str:
    """One line: what resuming this run does."""
    who = _provider_label(info) + (f" (instead of {_provider_label(before)})" if changed else "")
    if state.status == "failed":
        return (f"run {run_id} failed ({state.reason}); resuming with the same provider would repeat its replies: "
                "nothing to do (give --provider or --model to ask another)")
    if state.status != "running":
        return f"run {run_id} had already ended ({state.status}: {state.reason}); nothing to ask"
    stage = state.next_stage.get(state.phase, state.phase)
    conversation = state.conversations.get(state.phase, [])
    pending = bool(conversation) and conversation[-1].role == "user"
    what = "the request the run stopped at" if pending else f"the opening {state.phase} prompt"
    return f"resuming run {run_id} at iteration {state.iterations + 1}: the {stage} step sends {what} to {who}"
