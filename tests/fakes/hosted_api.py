"""A fake hosted chat API on 127.0.0.1: Anthropic's POST /v1/messages and OpenAI's POST /v1/chat/completions.

It checks the key (x-api-key, or Authorization: Bearer), answers in the API's shape with a text unique to each
request ("answer #<n> to: <question>"), and records every request (path, headers, body, start and end times) for
the tests. Faults: `script` maps a request's arrival index to a (status, headers, body) answered instead, and
`outage_after` answers every request after that many answers HTTP 400 (a spent credit balance). A wrong key gets
HTTP 401 whose message quotes the key it got, to prove the client redacts it.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: dict
    status: int = 0
    start: float = 0.0
    end: float = 0.0


@dataclass
class FakeChatAPI:
    key: str
    delay_s: float = 0.0
    script: dict[int, tuple[int, dict, dict]] = field(default_factory=dict)
    outage_after: int | None = None
    requests: list[Seen] = field(default_factory=list)
    answered: int = 0
    in_flight: int = 0
    max_in_flight: int = 0

    def __post_init__(self):
        self._lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                seen = Seen(self.path, {k.lower(): v for k, v in self.headers.items()}, body, start=time.monotonic())
                status, headers, reply = api._answer(seen)
                seen.status, seen.end = status, time.monotonic()
                data = json.dumps(reply).encode()
                self.send_response(status)
                for k, v in {"content-type": "application/json", **headers}.items():
                    self.send_header(k, v)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeChatAPI:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _answer(self, seen: Seen) -> tuple[int, dict, dict]:
        with self._lock:
            index = len(self.requests)
            self.requests.append(seen)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            time.sleep(self.delay_s)
            return self._reply(seen, index)
        finally:
            with self._lock:
                self.in_flight -= 1

    def _reply(self, seen: Seen, index: int) -> tuple[int, dict, dict]:
        anthropic = seen.path == "/v1/messages"
        if not anthropic and seen.path != "/v1/chat/completions":
            return 404, {}, {"error": {"message": f"no route {seen.path}"}}
        got = seen.headers.get("x-api-key") if anthropic else seen.headers.get("authorization", "").removeprefix("Bearer ")
        if got != self.key:
            return 401, {}, {"type": "error", "error": {"type": "authentication_error", "message": f"invalid key {got}"}}
        if index in self.script:
            return self.script[index]
        with self._lock:
            if self.outage_after is not None and self.answered >= self.outage_after:
                return 400, {}, {"type": "error", "error": {"type": "invalid_request_error",
                                                            "message": "Your credit balance is too low"}}
            self.answered += 1
            n = self.answered
        user = next(m["content"] for m in seen.body["messages"] if m["role"] == "user")
        text = f"answer #{n} to: {user}"
        if anthropic:
            return 200, {}, {"type": "message", "role": "assistant", "model": seen.body["model"],
                             "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
                             "usage": {"input_tokens": 10, "output_tokens": 5}}
        return 200, {}, {"object": "chat.completion", "model": seen.body["model"],
                         "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                      "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 10, "completion_tokens": 5}}

    def answers(self) -> list[Seen]:
        return [r for r in self.requests if r.status == 200]
