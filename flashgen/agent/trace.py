"""The run's trace: every prompt, reply, result and loop-state snapshot, written to the harness Store
as it happens (so that `--resume RUN_ID` continues after a crash), with secrets redacted on the
way in. This is the only module that talks to the Store."""

from __future__ import annotations

from typing import Any

from flashgen.agent.providers import redact
from flashgen.errors import FlashgenError, UsageError

RUN_KIND = "generate"


def _clean(value: Any) -> Any:
    """A JSON-safe copy with every string redacted."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if hasattr(value, "model_dump"):
        return _clean(value.model_dump(mode="json"))
    return redact(str(value))


class RunTrace:
    def __init__(self, store, run_id: int):
        self.store, self.run_id = store, run_id

    @classmethod
    def start(cls, store, config: dict[str, Any]) -> RunTrace:
        """A new run; its meta also names the process (pid, host), so that `runs show` can tell a run whose process
        was killed from one still going."""
        import os
        import socket

        process = {"pid": os.getpid(), "host": socket.gethostname()}
        return cls(store, store.new_run(RUN_KIND, _clean({**config, "process": process})))

    @classmethod
    def reopen(cls, store, run_id: str | int) -> tuple[RunTrace, dict[str, Any], dict[str, Any] | None]:
        """(trace, the run's config, the last loop-state snapshot or None). The config's provider is the one the run
        last went on with: a resume with `--provider`/`--model` records its own, which later resumes keep."""
        try:
            key = int(run_id)
        except (TypeError, ValueError):
            raise UsageError(f"bad run id {run_id!r}: run ids are the integers `flashgen generate` prints") from None
        try:
            run = store.run(key)
        except FlashgenError:
            raise UsageError(f"no run {key} in the store") from None
        if run.kind != RUN_KIND or "loop" not in (run.meta or {}):
            raise UsageError(f"run {key} is a {run.kind!r} run, not one of `flashgen generate`")
        snapshot, config = None, dict(run.meta)
        for event in store.events(key):
            if event.step == "state":
                snapshot = event.payload
            elif event.step == "resume" and isinstance(event.payload, dict) and event.payload.get("provider"):
                config["provider"] = event.payload["provider"]  # a resume that changed the provider: it goes on
        return cls(store, key), config, snapshot

    def event(self, kind: str, payload: dict[str, Any], artifacts: dict[str, str] | None = None) -> None:
        self.store.add_event(self.run_id, kind, _clean(payload),
                             artifacts={k: redact(v) for k, v in artifacts.items()} if artifacts else None)

    def finish(self, status: str, summary: dict[str, Any]) -> None:
        self.store.finish_run(self.run_id, status, _clean(summary))
