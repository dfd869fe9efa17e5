"""The record: every run (an attempt, a bench, an agent session) in sqlite (WAL) plus artifact files.

Generic on purpose: a run has a kind, a status and JSON meta; its events are numbered steps with a
JSON payload and named artifact files. Each add_event writes its files, then commits its row,
before returning, so a crash loses nothing already added. Secrets never reach the disk: anything
that looks like an API key or bearer token is redacted from payloads and text artifacts.

Location: $FLASHGEN_HOME, else ./.flashgen
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import sqlite3
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from flashgen.errors import FlashgenError

REDACTED = "[REDACTED]"
_SECRET_PATTERNS = [
    re.compile(r"sk-ant-[A-Za-z0-9_\-]{8,}"),
    re.compile(r"sk-[A-Za-z0-9_\-]{16,}"),
    re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/\-]{8,}=*"),
    re.compile(r"(?i)\b(api[_-]?key|x-api-key|authorization)(['\"]?\s*[:=]\s*)(['\"]?)[^\s'\",]{8,}"),
]
_SECRET_KEYS = re.compile(r"(?i)^(api[_-]?key|x-api-key|authorization|token|secret|password)$")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  kind TEXT NOT NULL,
  status TEXT NOT NULL,
  created TEXT NOT NULL,
  finished TEXT,
  meta TEXT NOT NULL,
  summary TEXT
);
CREATE TABLE IF NOT EXISTS events (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  run_id INTEGER NOT NULL REFERENCES runs(id),
  seq INTEGER NOT NULL,
  step TEXT NOT NULL,
  created TEXT NOT NULL,
  payload TEXT NOT NULL,
  artifacts TEXT NOT NULL,
  UNIQUE (run_id, seq)
);
"""


class StoreError(FlashgenError):
    """The record cannot be opened or read (bad path, unknown run)."""


class RunRecord(BaseModel):
    id: int
    kind: str
    status: str
    created: str
    finished: str | None = None
    meta: dict[str, Any]
    summary: Any = None


class EventRecord(BaseModel):
    id: int
    run_id: int
    seq: int
    step: str
    created: str
    payload: Any
    artifacts: dict[str, str]  # name -> path


def redact_text(text: str) -> str:
    for pattern in _SECRET_PATTERNS:
        if pattern.groups >= 2:
            text = pattern.sub(lambda m: m.group(1) + m.group(2) + m.group(3) + REDACTED, text)
        else:
            text = pattern.sub(REDACTED, text)
    return text


def redact(value: Any) -> Any:
    """A copy of a JSON-like value with secrets replaced (by pattern, and by key name)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {k: (REDACTED if isinstance(k, str) and _SECRET_KEYS.match(k) and v else redact(v))
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    if isinstance(value, BaseModel):
        return redact(value.model_dump(mode="json"))
    return value


def default_home() -> Path:
    env = os.environ.get("FLASHGEN_HOME")
    return Path(env).expanduser() if env else Path.cwd() / ".flashgen"


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def _safe_name(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._")
    if not cleaned:
        raise ValueError(f"bad artifact name {name!r}")
    return cleaned[:100]


class Store:
    """sqlite (WAL) + artifact folder. One per process is enough; cheap to open."""

    def __init__(self, home: str | Path | None = None):
        self.home = Path(home) if home is not None else default_home()
        try:
            self.home.mkdir(parents=True, exist_ok=True)
            (self.home / "artifacts").mkdir(exist_ok=True)
            self.db_path = self.home / "flashgen.sqlite"
            self._db = sqlite3.connect(self.db_path, timeout=30, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open the flashgen record at {self.home}: {exc}") from None

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def new_run(self, kind: str, meta: dict[str, Any] | None = None) -> int:
        cur = self._db.execute("INSERT INTO runs (kind, status, created, meta) VALUES (?, 'running', ?, ?)",
                               (kind, _now(), json.dumps(redact(meta or {}), default=str)))
        return int(cur.lastrowid)

    def add_event(self, run_id: int, step: str, payload: Any = None,
                  artifacts: dict[str, str | bytes] | None = None) -> int:
        """Write the artifacts, then the event row (committed); returns the event's sequence number."""
        self._require_run(run_id)
        seq = int(self._db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE run_id = ?",
                                   (run_id,)).fetchone()[0])
        folder = self.home / "artifacts" / str(run_id) / f"{seq:04d}-{_safe_name(step)}"
        paths: dict[str, str] = {}
        if artifacts:
            folder.mkdir(parents=True, exist_ok=True)
            for name, content in artifacts.items():
                path = folder / _safe_name(name)
                data = redact_text(content).encode() if isinstance(content, str) else _redact_bytes(content)
                tmp = path.with_suffix(path.suffix + ".tmp")
                with open(tmp, "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(tmp, path)
                paths[name] = str(path)
        self._db.execute("INSERT INTO events (run_id, seq, step, created, payload, artifacts) VALUES (?, ?, ?, ?, ?, ?)",
                         (run_id, seq, step, _now(), json.dumps(redact(payload), default=str), json.dumps(paths)))
        return seq

    def finish_run(self, run_id: int, status: str, summary: Any = None) -> None:
        self._require_run(run_id)
        self._db.execute("UPDATE runs SET status = ?, finished = ?, summary = ? WHERE id = ?",
                         (status, _now(), json.dumps(redact(summary), default=str), run_id))

    def runs(self, kind: str | None = None, limit: int = 100) -> list[RunRecord]:
        sql = "SELECT id, kind, status, created, finished, meta, summary FROM runs"
        args: tuple = ()
        if kind:
            sql += " WHERE kind = ?"
            args = (kind,)
        sql += " ORDER BY id DESC LIMIT ?"
        return [self._run_record(row) for row in self._db.execute(sql, (*args, limit))]

    def run(self, run_id: int) -> RunRecord:
        row = self._db.execute("SELECT id, kind, status, created, finished, meta, summary FROM runs WHERE id = ?",
                               (run_id,)).fetchone()
        if row is None:
            raise StoreError(f"no run {run_id} in {self.db_path}")
        return self._run_record(row)

    def events(self, run_id: int) -> list[EventRecord]:
        self._require_run(run_id)
        rows = self._db.execute("SELECT id, run_id, seq, step, created, payload, artifacts FROM events "
                                "WHERE run_id = ? ORDER BY seq", (run_id,))
        return [EventRecord(id=r[0], run_id=r[1], seq=r[2], step=r[3], created=r[4], payload=json.loads(r[5]),
                            artifacts=json.loads(r[6])) for r in rows]

    def _require_run(self, run_id: int) -> None:
        if self._db.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is None:
            raise StoreError(f"no run {run_id} in {self.db_path}")

    @staticmethod
    def _run_record(row) -> RunRecord:
        return RunRecord(id=row[0], kind=row[1], status=row[2], created=row[3], finished=row[4],
                         meta=json.loads(row[5]), summary=json.loads(row[6]) if row[6] else None)


def _redact_bytes(data: bytes) -> bytes:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return data  # binary artifacts (cubins) carry no text secrets
    return redact_text(text).encode()
