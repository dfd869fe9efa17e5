"""The record: every run (an attempt, a bench, an agent session) in sqlite (WAL) plus artifact files.

Generic on purpose: a run has a kind, a status and JSON meta; its events are numbered steps with a
JSON payload and named artifact files. Each add_event writes its files, then commits its row,
before returning, so a crash loses nothing already added. Secrets never reach the disk: anything
that looks like an API key or bearer token is redacted from payloads and text artifacts.

Each long string of a payload (a prompt, a reply, a program) is stored once, by content hash, in the blobs
table; the payload keeps a reference, so the loop's state snapshots (which repeat the conversations) cost a
few hashes each. Rows written before (strings inline) read as they are.

A record that sqlite cannot read (not a database, malformed) is moved aside with its artifacts
(`flashgen.sqlite.corrupt-<UTC time>`, `artifacts.corrupt-<UTC time>`), one line says so on stderr, and a new
one is started: nothing is deleted.

Location: flashgen.paths.state_dir() ($FLASHGEN_HOME, else $XDG_STATE_HOME/flashgen, else ~/.local/state/flashgen)
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import sqlite3
from collections.abc import Callable
from contextlib import contextmanager
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
CREATE TABLE IF NOT EXISTS blobs (
  hash TEXT PRIMARY KEY,
  text TEXT NOT NULL
);
"""
BLOB_MIN_CHARS = 256  # strings at least this long are stored once, by hash
_BLOB_KEY = "__flashgen_blob__"
# sqlite's result codes for a file that is not a database or is damaged (not "busy" or "locked": those wait)
_CORRUPT_CODES = {getattr(sqlite3, "SQLITE_CORRUPT", 11), getattr(sqlite3, "SQLITE_NOTADB", 26)}


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
    from flashgen.paths import state_dir

    return state_dir()


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def _safe_name(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._")
    if not cleaned:
        raise ValueError(f"bad artifact name {name!r}")
    return cleaned[:100]


def _is_corrupt(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in _CORRUPT_CODES
    text = str(exc).lower()
    return "not a database" in text or "malformed" in text


def _guarded(method):
    """A sqlite error inside a Store method becomes a one-line StoreError; a damaged file is marked so that the next
    open moves it aside."""
    import functools

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except sqlite3.Error as exc:
            if isinstance(exc, sqlite3.DatabaseError) and _is_corrupt(exc):
                try:
                    self._damaged_marker.touch()
                except OSError:
                    pass
                raise StoreError(f"the record {self.db_path} is damaged ({exc}): the next flashgen command moves it "
                                 "aside and starts a new one") from None
            raise StoreError(f"the record {self.db_path}: {exc}") from None

    return wrapper


def _notice(message: str) -> None:
    from flashgen.console import err

    err.print(f"notice: {message}")


class Store:
    """sqlite (WAL) + artifact folder. One per process is enough; cheap to open. `notice` receives the one line
    said when a damaged record is moved aside (default: stderr)."""

    def __init__(self, home: str | Path | None = None, notice: Callable[[str], None] | None = None):
        self.home = Path(home) if home is not None else default_home()
        self.db_path = self.home / "flashgen.sqlite"
        self._damaged_marker = self.home / "flashgen.sqlite.damaged"
        self._notice = notice or _notice
        try:
            self.home.mkdir(parents=True, exist_ok=True)
            (self.home / "artifacts").mkdir(exist_ok=True)
            if self._damaged_marker.exists() and self.db_path.exists():
                self._move_aside("a damaged page was found by an earlier command")
            self._damaged_marker.unlink(missing_ok=True)
            try:
                self._db = self._open()
            except sqlite3.DatabaseError as exc:
                if not _is_corrupt(exc):
                    raise
                self._move_aside(exc)
                self._db = self._open()
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open the flashgen record at {self.home}: {exc}") from None

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.db_path, timeout=30, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(_SCHEMA)
            # reads the tables' pages: a damaged file fails here rather than in the middle of a run
            db.execute("SELECT MAX(id) FROM runs").fetchone()
            db.execute("SELECT MAX(id) FROM events").fetchone()
        except sqlite3.Error:
            db.close()
            raise
        return db

    def _move_aside(self, exc: sqlite3.Error | str) -> None:
        """Rename the damaged database (and its -wal/-shm files and the artifacts, whose run numbers the new record
        would reuse) with a UTC timestamp; say so in one line. Nothing is deleted."""
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        moved = self.db_path.with_name(f"{self.db_path.name}.corrupt-{stamp}")
        for suffix in ("", "-wal", "-shm"):
            source = Path(f"{self.db_path}{suffix}")
            if source.exists():
                try:
                    os.replace(source, f"{moved}{suffix}")
                except FileNotFoundError:  # another process moved it first
                    pass
        artifacts = self.home / "artifacts"
        if artifacts.is_dir() and any(artifacts.iterdir()):
            os.replace(artifacts, self.home / f"artifacts.corrupt-{stamp}")
        artifacts.mkdir(exist_ok=True)
        self._notice(f"the record {self.db_path} could not be read ({exc}); moved it to {moved.name} beside it "
                     "and started a new one")

    @contextmanager
    def _transaction(self):
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _pack(self, value: Any) -> Any:
        """The payload with every long string replaced by a reference to its row in blobs (inserted once)."""
        if isinstance(value, str):
            if len(value) < BLOB_MIN_CHARS:
                return value
            digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()
            self._db.execute("INSERT OR IGNORE INTO blobs (hash, text) VALUES (?, ?)", (digest, value))
            return {_BLOB_KEY: digest}
        if isinstance(value, dict):
            return {k: self._pack(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._pack(v) for v in value]
        return value

    def _unpack(self, value: Any, cache: dict[str, str]) -> Any:
        if isinstance(value, dict):
            if len(value) == 1 and _BLOB_KEY in value:
                digest = value[_BLOB_KEY]
                if digest not in cache:
                    row = self._db.execute("SELECT text FROM blobs WHERE hash = ?", (digest,)).fetchone()
                    cache[digest] = row[0] if row is not None else f"(missing blob {digest})"
                return cache[digest]
            return {k: self._unpack(v, cache) for k, v in value.items()}
        if isinstance(value, list):
            return [self._unpack(v, cache) for v in value]
        return value

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @_guarded
    def new_run(self, kind: str, meta: dict[str, Any] | None = None) -> int:
        cur = self._db.execute("INSERT INTO runs (kind, status, created, meta) VALUES (?, 'running', ?, ?)",
                               (kind, _now(), json.dumps(redact(meta or {}), default=str)))
        return int(cur.lastrowid)

    @_guarded
    def add_event(self, run_id: int, step: str, payload: Any = None,
                  artifacts: dict[str, str | bytes] | None = None) -> int:
        """Write the artifacts, then the event row (committed); returns the event's sequence number."""
        self._require_run(run_id)
        with self._transaction():
            return self._add_event(run_id, step, payload, artifacts)

    def _add_event(self, run_id: int, step: str, payload: Any, artifacts: dict[str, str | bytes] | None) -> int:
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
        packed = self._pack(json.loads(json.dumps(redact(payload), default=str)))
        self._db.execute("INSERT INTO events (run_id, seq, step, created, payload, artifacts) VALUES (?, ?, ?, ?, ?, ?)",
                         (run_id, seq, step, _now(), json.dumps(packed), json.dumps(paths)))
        return seq

    @_guarded
    def finish_run(self, run_id: int, status: str, summary: Any = None) -> None:
        self._require_run(run_id)
        self._db.execute("UPDATE runs SET status = ?, finished = ?, summary = ? WHERE id = ?",
                         (status, _now(), json.dumps(redact(summary), default=str), run_id))

    @_guarded
    def runs(self, kind: str | None = None, limit: int = 100) -> list[RunRecord]:
        sql = "SELECT id, kind, status, created, finished, meta, summary FROM runs"
        args: tuple = ()
        if kind:
            sql += " WHERE kind = ?"
            args = (kind,)
        sql += " ORDER BY id DESC LIMIT ?"
        return [self._run_record(row) for row in self._db.execute(sql, (*args, limit))]

    @_guarded
    def run(self, run_id: int) -> RunRecord:
        row = self._db.execute("SELECT id, kind, status, created, finished, meta, summary FROM runs WHERE id = ?",
                               (run_id,)).fetchone()
        if row is None:
            raise StoreError(f"no run {run_id} in {self.db_path}")
        return self._run_record(row)

    @_guarded
    def events(self, run_id: int) -> list[EventRecord]:
        self._require_run(run_id)
        rows = self._db.execute("SELECT id, run_id, seq, step, created, payload, artifacts FROM events "
                                "WHERE run_id = ? ORDER BY seq", (run_id,)).fetchall()
        cache: dict[str, str] = {}
        return [EventRecord(id=r[0], run_id=r[1], seq=r[2], step=r[3], created=r[4],
                            payload=self._unpack(json.loads(r[5]), cache), artifacts=json.loads(r[6])) for r in rows]

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
