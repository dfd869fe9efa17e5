"""The provider of `flashgen build`: the user's own TL program, through the generate loop.

Its first answers are the user's program (as the sketch and as the full program); the translation is the reference
translator's (as the offline expert gives it). Every later request is feedback on the program (a checker or CPU
failure, CUDA that does not build, a wrong result, a slow kernel): it goes to the model given with `--provider`
(`then`), which repairs the program or speeds it up from there; without one the run ends, failed, on that feedback
in one line (NoFurtherReply), except a slow but correct kernel, which is what the user wrote: the same program again
ends the run as done. So checks, translation, compile, verification, benchmark and record are the generate path.
"""

from __future__ import annotations

import re

from flashgen.agent.messages import ModelReply, ModelRequest, NoFurtherReply, Provider
from flashgen.errors import FlashgenError
from flashgen.harness.environment import Environment

USER = "user"  # the provider's name in the record (meta.json's generation.provider, `flashgen runs show`)
FEEDBACK_CHARS = 600  # the most a failure's one line quotes of the feedback


class UserProgramProvider:
    model = "user-tl"

    def __init__(self, text: str, label: str = "<tl>", *, env: Environment | None = None, then: Provider | None = None,
                 custom: bool = False):
        self.text, self.label, self.env, self.then, self.custom = text, label, env or Environment(), then, custom
        self.name = USER if then is None else f"{USER}+{then.name}"
        if then is not None:
            self.model = then.model

    def complete(self, request: ModelRequest) -> ModelReply:
        if request.stage in ("sketch", "params"):  # the opening requests: the user's program, as written
            return self._program()
        if request.stage == "translate":
            return self._translate(request)
        if self.then is not None:
            return self.then.complete(request)
        if request.stage == "repair_slow":  # correct, slower than the goal: the user's program stands
            return self._program()
        raise NoFurtherReply(f"{self.label} needs repair and no --provider was given to repair it: "
                             f"{feedback_line(_last_prompt(request)).replace('kernel.tl:', f'{self.label}:')}")

    def _program(self) -> ModelReply:
        note = (" (what it computes is not a Variant: its fp64 interpretation is the reference; a rewrite must compute "
                "the same)" if self.custom else "")
        return ModelReply(text=f"The user's program {self.label}{note}:\n\n```tl\n{self.text.rstrip()}\n```\n",
                          model="user-tl", cost_usd=0.0)

    def _translate(self, request: ModelRequest) -> ModelReply:
        """The reference translator's CUDA and manifest for the program of the translate prompt; where it cannot
        translate the program, the model writes the CUDA (as in `flashgen generate`), or without one the run ends."""
        from flashgen.agent.expert import ExpertProvider

        try:
            return ExpertProvider(self.env).complete(request)
        except FlashgenError as exc:
            if self.then is not None:
                return self.then.complete(request)
            raise NoFurtherReply(f"the translator cannot build {self.label} for {request.task.arch}: "
                                 f"{' '.join(str(exc).split())}") from None


def _last_prompt(request: ModelRequest) -> str:
    return next((m.content for m in reversed(request.messages) if m.role == "user"), "")


# a repair prompt's closing request (flashgen/prompts/repair_*.j2), left out of the one-line feedback
_CLOSING = ("Fix ", "Find ", "Answer ", "Propose ", "The LLM-TL program it translates", "The manifest's fields")


def feedback_line(prompt: str) -> str:
    """A repair prompt's feedback as one line: what failed and its first details (the checker's or compiler's errors
    first), without the target's rules and the closing request it asks of a model."""
    body = prompt.split("\nKeep to the target's rules:")[0]
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", body) if p.strip() and not p.strip().startswith(_CLOSING)]
    lines = [line.strip().removeprefix("- ").strip() for p in paragraphs for line in p.splitlines()]
    lines = [line for line in lines if line and not line.startswith("```")]
    if not lines:
        return "(no feedback)"
    head = re.sub(r"^Your (LLM-TL|CUDA)", lambda m: "the program" if m.group(1) == "LLM-TL" else "its CUDA", lines[0])
    rest = lines[1:]
    errors = [line for line in rest if re.search(r"\berror\b", line, re.I)]
    details = errors or rest
    text = " ".join(f"{head} {'; '.join(details[:3])}".split())
    return text if len(text) <= FEEDBACK_CHARS else text[:FEEDBACK_CHARS - 3] + "..."
