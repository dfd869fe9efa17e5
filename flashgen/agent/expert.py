"""The offline rule-based provider: what a perfect model would answer, written by rules.

Stage 1a renders the library's sketch for the variant, stage 1b the library's full program with
parameters from `choose_params` (after any feedback on an earlier program, the next candidate after the one
it last wrote, in the search's order; the loop's budget bounds the exploration), stage 2 runs the
reference translator on the program the prompt holds. Replies are prose plus fenced blocks, so they
go through the same extraction, checks and feedback as any model's.
"""

from __future__ import annotations

from flashgen.agent.extract import fenced_blocks
from flashgen.agent.messages import ModelReply, ModelRequest, ProviderError
from flashgen.errors import FlashgenError
from flashgen.harness.environment import Environment


class ExpertProvider:
    name = "expert"
    model = "expert-rules"

    def __init__(self, env: Environment | None = None):
        self.env = env or Environment()

    def complete(self, request: ModelRequest) -> ModelReply:
        task = request.task
        target = self.env.target(task.target)
        mods = {"mods": task.mods} if task.mods is not None else {}  # score and mask functions, written into the TL
        if request.phase == "sketch":
            tl = self.env.library_tl(task.variant, target, task.dtype, task.head_dim, form="sketch", **mods,
                                     **task.dims)
            text = f"The dataflow of {task.variant.name} attention, as a sketch:\n\n```tl\n{tl.rstrip()}\n```\n"
        elif request.phase == "params":
            candidates = self.env.choose_params(task.variant, target, task.dtype, task.head_dim, **task.dims)
            first = candidates[0]
            if task.mods is not None:
                candidates = self._fitting(candidates, task, target, mods)
            params = self._next_params(candidates, request)
            # the first choice comes with its tiles for ranges of sizes (`Params when` lines); the search's later
            # candidates are timed as one tile at every size
            by_size = self.env.size_params(task.variant, target, task.dtype, task.head_dim, **task.dims) \
                if params is first else None
            tl = self.env.library_tl(task.variant, target, task.dtype, task.head_dim, form="full", params=params,
                                     **mods, **task.dims, size_params=by_size)
            chosen = ", ".join(f"{k}={v}" for k, v in params.items())
            text = f"Full program for {target.marketing_name} with {chosen}:\n\n```tl\n{tl.rstrip()}\n```\n"
        else:
            tl = self._program_to_translate(request)
            source, manifest = self.env.translate(tl, target)
            text = (f"The translation for {target.arch} / {task.dtype.value}:\n\n```cuda\n{source.rstrip()}\n```\n\n"
                    f"Launches:\n\n```json\n{manifest.model_dump_json(indent=2)}\n```\n")
        return ModelReply(text=text, model=self.model, cost_usd=0.0)

    def _fitting(self, candidates: list[dict[str, int]], task, target, mods: dict) -> list[dict[str, int]]:
        """The candidates the translator takes with the task's score and mask functions written in: the search
        screens its space on the variant's own program, and a function may need what that program does not (shared
        memory, registers); all of them where none fits, so that the loop reports the translator's reason."""
        fitting = [c for c in candidates
                   if self.env.translation_problem(self.env.library_tl(task.variant, target, task.dtype, task.head_dim,
                                                                       form="full", params=c, **mods, **task.dims),
                                                   target) is None]
        return fitting or candidates

    def _next_params(self, candidates: list[dict[str, int]], request: ModelRequest) -> dict[str, int]:
        """The first candidate, or after feedback on a program it wrote, the next one after it not written
        yet; the last written when none is left (the loop then stops: no faster program proposed). Read
        from the conversation alone, so a resumed run continues where it was."""
        written = []
        for message in request.messages:
            if message.role != "assistant":
                continue
            for block in (b for b in fenced_blocks(message.content) if b.tag == "tl"):
                try:
                    written.append(dict(self.env.parse(block.code).params))
                except FlashgenError:  # not a program: nothing to learn from it
                    continue
        if not written:
            return candidates[0]
        same = lambda p, c: all(p.get(k) == v for k, v in c.items())  # noqa: E731
        last = next((i for i, c in enumerate(candidates) if same(written[-1], c)), -1)
        for candidate in candidates[last + 1:]:
            if not any(same(p, candidate) for p in written):
                return candidate
        return candidates[last] if last >= 0 else candidates[0]

    @staticmethod
    def _program_to_translate(request: ModelRequest) -> str:
        # The stage-2 prompt is the first user message of the translate conversation; the program
        # is its last ```tl block (the worked example comes before it).
        first_user = next((m.content for m in request.messages if m.role == "user"), "")
        blocks = [b for b in fenced_blocks(first_user) if b.tag == "tl"]
        if not blocks:
            raise ProviderError("expert: the translation prompt holds no ```tl program")
        return blocks[-1].code
