"""`flashgen runs show ID --transcript`: a generate run's conversation as a person reads it, from the record.

Step by step, in the order they happened: each prompt (the system message and the opening prompt of a phase, a
repair prompt with its feedback), each reply (with the model, tokens and cost), each outcome (the TL accepted, the
CUDA compiled, verified, timed), each resume (with the provider it went on with) and the run's end. Text prints as
it was sent (through flashgen.console: no markup read); a message longer than `max_chars` shows its head and tail
around one line saying how much was left out, so a huge reply cannot flood the terminal."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from flashgen.console import styled

DEFAULT_MAX_CHARS = 6000
TAIL_SHARE = 0.25  # of a bounded message, the part kept from its end (where a cut-off reply shows it)


def bounded(text: str, max_chars: int) -> str:
    """`text`, or its head and tail with the number of characters left out between them (max_chars 0: all)."""
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    tail = int(max_chars * TAIL_SHARE)
    head = max_chars - tail
    left = len(text) - head - tail
    return f"{text[:head]}\n[... {left:,} characters left out of {len(text):,}; --max-chars 0 shows all ...]\n" \
           f"{text[len(text) - tail:]}"


def _rule(title: str) -> Any:
    return styled(("── " + title + " ", "bold cyan"))


def transcript(run, events, max_chars: int = DEFAULT_MAX_CHARS) -> Iterator[Any]:
    """The lines (plain strings and styled headers) of run `run`'s transcript."""
    meta = run.meta or {}
    provider = meta.get("provider") or {}
    yield styled((f"run {run.id}", "bold"), f" {run.kind} [{run.status}], provider {_label(provider)}")
    task = (meta.get("loop") or {}).get("task") or {}
    if task:
        yield (f"task: {task.get('target')} ({task.get('arch')}), {task.get('dtype')}, head dim {task.get('head_dim')}, "
               f"variant {_variant_name(task.get('variant'))}")
    iteration, system = 0, None
    for event in events:
        p = event.payload if isinstance(event.payload, dict) else {}
        if event.step == "prompt":
            for message in p.get("messages") or []:
                content = message.get("content", "")
                if message.get("role") == "system":
                    if content == system:
                        yield _rule(f"{p.get('phase')} · system: the same as before")
                        continue
                    system, what = content, "system"
                else:
                    what = (f"prompt ({p.get('stage')})" if p.get("stage") in ("sketch", "params", "translate")
                            else f"feedback ({p.get('stage')})")
                yield _rule(f"{p.get('phase')} · {what} · {len(content):,} characters")
                yield bounded(content, max_chars)
        elif event.step == "reply":
            iteration = p.get("iteration", iteration)
            usage = p.get("usage") or {}
            cost = p.get("cost_usd")
            facts = [f"model {p.get('model')}", f"{usage.get('input_tokens', 0)} in + {usage.get('output_tokens', 0)} out "
                     "tokens", "cost unknown" if cost is None else f"${cost:.4f}"]
            if p.get("attempts", 1) > 1:
                facts.append(f"{p['attempts']} attempts")
            yield _rule(f"[{iteration}] {p.get('phase')} · reply ({p.get('stage')}) · " + ", ".join(facts))
            if p.get("refused"):
                yield styled((p["refused"], "yellow"), f"; its first {len(p.get('text', '')):,} characters:")
            yield bounded(p.get("text", ""), max_chars)
        elif event.step == "result":
            yield _outcome(p)
        elif event.step == "resume":
            yield _rule("resume")
            yield p.get("plan") or f"resumed from iteration {p.get('from_iteration')}"
    summary = run.summary if isinstance(run.summary, dict) else {}
    yield _rule(f"end: {run.status}")
    if summary.get("reason"):
        yield str(summary["reason"])
    resume = summary.get("resume")
    if isinstance(resume, dict) and resume.get("how"):
        yield f"resume: {resume['how']}"


def _outcome(p: dict[str, Any]) -> Any:
    phase = p.get("phase")
    if p.get("ok"):
        if phase == "translate":
            if p.get("verified") is None:
                return styled(("→ ", "green"), "compiled; no GPU here, so not verified or timed")
            timing = p.get("timing") or {}
            ms = timing.get("time_ms")
            return styled(("→ ", "green"), "compiled, verified" + (f", {ms:.4g} ms at {timing.get('shape')}" if ms else ""))
        return styled(("→ ", "green"), f"the {phase} TL was accepted" + (" (checked and run on the CPU)"
                                                                          if phase == "params" else ""))
    if p.get("repeated"):
        return styled(("→ ", "yellow"), f"the reply repeated the previous one: {p.get('repair')} asked once more")
    return styled(("→ ", "yellow"), f"not accepted: {p.get('repair')} (the feedback follows)")


def _variant_name(fields: Any) -> str:
    from flashgen.variant import Variant

    try:
        return Variant.model_validate(fields).name
    except Exception:  # a record from another version: as it was stored
        return json.dumps(fields, sort_keys=True)


def _label(info: dict[str, Any]) -> str:
    model = info.get("model")
    return f"{info.get('name', '?')}" + (f" ({model})" if model else "")
