import sqlite3

import pytest

from flashgen.harness.store import REDACTED, Store, StoreError, redact


def test_store_is_wal_and_events_visible_from_a_second_connection(tmp_path):
    store = Store(tmp_path)
    assert store._db.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"
    run = store.new_run("attempt", {"variant": "causal"})
    seq = store.add_event(run, "compile", {"ok": True, "registers": 96}, {"kernel.cu": "__global__ void f(){}",
                                                                          "kernel.cubin": b"\x7fELF\x00\x01"})
    # a separate connection (another process would be the same) sees the committed row at once
    other = sqlite3.connect(tmp_path / "flashgen.sqlite")
    row = other.execute("SELECT step, payload, artifacts FROM events WHERE run_id = ? AND seq = ?", (run, seq)).fetchone()
    assert row[0] == "compile" and '"registers": 96' in row[1]
    events = Store(tmp_path).events(run)
    assert [e.step for e in events] == ["compile"]
    assert open(events[0].artifacts["kernel.cubin"], "rb").read() == b"\x7fELF\x00\x01"
    store.finish_run(run, "ok", {"tflops": 1.5})
    assert Store(tmp_path).run(run).status == "ok" and Store(tmp_path).runs()[0].summary == {"tflops": 1.5}


def test_store_sequence_and_unknown_run(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHGEN_HOME", str(tmp_path / "home"))
    store = Store()
    assert store.home == tmp_path / "home"
    run = store.new_run("agent", {})
    assert [store.add_event(run, "msg", {"i": i}) for i in range(3)] == [1, 2, 3]
    with pytest.raises(StoreError):
        store.add_event(run + 100, "x", {})
    with pytest.raises(StoreError):
        store.run(run + 100)


def test_secrets_are_redacted_in_payloads_meta_and_artifacts(tmp_path):
    key = "sk-ant-api03-" + "A" * 40
    store = Store(tmp_path)
    run = store.new_run("agent", {"api_key": "abcdefgh12345678", "model": "x"})
    store.add_event(run, "request", {"headers": {"Authorization": "Bearer abcdef0123456789xyz"}, "text": f"key={key}",
                                     "note": "sk-proj-" + "b" * 30},
                    {"prompt.txt": f"use {key} please", "raw.json": b'{"x-api-key": "0123456789abcdef"}'})
    db_text = (tmp_path / "flashgen.sqlite").read_bytes() + b"".join(
        p.read_bytes() for p in (tmp_path / "artifacts").rglob("*") if p.is_file())
    for secret in (key.encode(), b"abcdefgh12345678", b"abcdef0123456789xyz", b"0123456789abcdef", b"b" * 30):
        assert secret not in db_text
    assert store.run(run).meta["api_key"] == REDACTED and store.run(run).meta["model"] == "x"
    assert redact({"list": ["Bearer tok_123456789"]}) == {"list": [REDACTED]}
