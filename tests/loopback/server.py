"""A loopback HTTP server that speaks the OpenAI chat-completions and Anthropic messages wire formats
and replays a script: replies (text), or statuses (429 with Retry-After, 500, ...), or a fault: `hang`
(read the request, never answer), `invalid_json` (200 with a body that is not JSON); a huge reply is a
long `text`. `default` is what it answers once the script is empty (HTTP 500 unless set; `Scripted(hang=True)`
makes a server that never answers). The real SDKs are pointed at it, so the tests drive the same HTTP code
paths as production. Usable from another process too (`python -m tests.loopback.server MODE` prints its port)."""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Scripted:
    text: str | Callable[[dict[str, Any]], str] = ""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    input_tokens: int = 11
    output_tokens: int = 7
    hang: bool = False  # never answer (until the server stops; at most HANG_S)
    invalid_json: bool = False  # HTTP 200, content-type JSON, a body that is not JSON


HANG_S = 600.0


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class LoopbackServer:
    def __init__(self, default: Scripted | None = None) -> None:
        self.script: deque[Scripted] = deque()
        self.default = default or Scripted(status=500, text="script empty")
        self._stopping = threading.Event()
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with server._lock:
                    server.seen.append(Seen(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                    entry = server.script.popleft() if server.script else server.default
                if entry.hang:
                    server._stopping.wait(HANG_S)
                    self.close_connection = True
                    return
                if entry.invalid_json:
                    data = b'{"id": "chatcmpl-loopback", "choices": [ {"message": '  # cut off: not JSON
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                if self.path.endswith("/chat/completions"):
                    payload = _openai(entry, body)
                elif self.path.endswith("/messages"):
                    payload = _anthropic(entry, body)
                else:
                    entry, payload = Scripted(status=404), {"error": {"message": f"no route {self.path}"}}
                if entry.status != 200:
                    payload = {"error": {"type": "scripted", "message": f"scripted status {entry.status}"}}
                data = json.dumps(payload).encode()
                self.send_response(entry.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for key, value in entry.headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def push(self, *entries: Scripted | str) -> None:
        for entry in entries:
            self.script.append(entry if isinstance(entry, Scripted) else Scripted(text=entry))

    @property
    def openai_base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LoopbackServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()


def _text(entry: Scripted, body: dict[str, Any]) -> str:
    return entry.text(body) if callable(entry.text) else entry.text


def _openai(entry: Scripted, body: dict[str, Any]) -> dict[str, Any]:
    return {"id": "chatcmpl-loopback", "object": "chat.completion", "created": 0, "model": body.get("model", "m"),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": _text(entry, body) if entry.status == 200 else ""}}],
            "usage": {"prompt_tokens": entry.input_tokens, "completion_tokens": entry.output_tokens,
                      "total_tokens": entry.input_tokens + entry.output_tokens}}


def _anthropic(entry: Scripted, body: dict[str, Any]) -> dict[str, Any]:
    return {"id": "msg_loopback", "type": "message", "role": "assistant", "model": body.get("model", "m"),
            "content": [{"type": "text", "text": _text(entry, body) if entry.status == 200 else ""}],
            "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": entry.input_tokens, "output_tokens": entry.output_tokens}}


if __name__ == "__main__":  # a server for another process: python -m tests.loopback.server hang|500|invalid-json
    import sys
    import time

    mode = sys.argv[1] if len(sys.argv) > 1 else "hang"
    default = {"hang": Scripted(hang=True), "500": Scripted(status=500),
               "invalid-json": Scripted(invalid_json=True)}[mode]
    with LoopbackServer(default) as running:
        print(running.port, flush=True)
        time.sleep(HANG_S)
