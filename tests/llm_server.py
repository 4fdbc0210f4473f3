"""A local OpenAI-compatible chat-completions server for tests (the LLM endpoint's test double).

It listens on 127.0.0.1 (a free port), speaks ``POST /v1/chat/completions`` as OpenAI does
(JSON body in, ``choices[0].message.content`` and ``usage`` out) and plays a script: each
incoming request takes the next action of ``script`` (then ``default``):

* ``ok``            — a well-formed answer in LLMTester's format: the six reasoning steps, then
  ``NEW_STATE: {...}``: the seed state read from the prompt, each value moved by a pseudo-random
  fraction (a hash of the prompt, so the same prompt gets the same answer) of ``step`` × its
  valid range, clipped to the range (integer-valued seeds stay integers);
* ``far``           — like ok but the state jumps far from the seed (excessive modification);
* ``malformed``     — prose without a machine-readable state;
* ``out_of_bounds`` — a state whose first value lies outside its range;
* ``429``           — HTTP 429 with ``Retry-After: 0.2``;  ``500`` — HTTP 500;
* ``hang``          — accepts the request and answers nothing for ``hang_s`` seconds;
* ``bad_body``      — HTTP 200 whose body is not a chat completion;
* ``not_utf8``      — HTTP 200, a chat completion whose bytes are not UTF-8 (Latin-1 ``é``, a
  stray ``0xff``), as a misconfigured proxy or a broken server sends;
* ``401``           — HTTP 401 (a wrong key);
* ``fenced``        — prose, then the state in a fenced ```json block with a trailing comma;
* ``json``          — the bare JSON state (what a schema-constrained reply looks like);
* ``nested``        — a JSON object with reasoning fields and the state under ``new_state``;
* ``garbage``       — prose with braces that are not JSON, and a JSON object of other keys.

``reject_formats``: ``response_format`` types answered with HTTP 500 and a validation message
naming ``response_format``, as llama-cpp-python's server answers OpenAI's ``json_schema``.

``requests`` records every request: arrival time (time.monotonic and time.time), the action
played, whether an ``Authorization`` header came and whether it matched ``expected_key``.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_RANGE = re.compile(r"^- (\S+): .*\(valid range \[([^,]+), ([^\]]+)\]\)\s*$", re.M)
_FIXED = re.compile(r"^- (\S+): .*\(fixed at ([^)]+)\)\s*$", re.M)


def seed_and_bounds(prompt: str):
    """The seed state (dict) and the bounds (name -> (lo, hi)) written in a LLMTester prompt."""
    bounds = {m.group(1): (float(m.group(2)), float(m.group(3))) for m in _RANGE.finditer(prompt)}
    bounds.update({m.group(1): (float(m.group(2)), float(m.group(2))) for m in _FIXED.finditer(prompt)})
    start = prompt.index("### Seed Scenario")
    seed, _ = json.JSONDecoder().raw_decode(prompt, prompt.index("{", start))
    return seed, bounds


def scripted_state(prompt: str, step: float) -> dict:
    seed, bounds = seed_and_bounds(prompt)
    digest = hashlib.sha256(prompt.encode()).digest()
    out = {}
    for k, (name, value) in enumerate(seed.items()):
        lo, hi = bounds[name]
        u = digest[k % len(digest)] / 255.0 * 2.0 - 1.0
        v = min(hi, max(lo, value + u * step * (hi - lo)))
        out[name] = float(round(v)) if float(value).is_integer() and lo.is_integer() else round(v, 6)
    return out


def answer(state: dict) -> str:
    return ("1. Scenario Analysis: the seed places the agent near the edge of its safe region.\n"
            "2. Evolution Prediction: the policy corrects slowly.\n"
            "3. Challenge Analysis: pushing the state further should overwhelm the controller.\n"
            "4. Plan: move each value a little towards its limit.\n"
            "5. Plan Execution: done value by value.\n"
            "6. Explanation: the new state is still valid but harder.\n"
            f"NEW_STATE: {json.dumps(state)}")


class LLMStubServer:
    def __init__(self, script=(), default: str = "ok", step: float = 0.1, hang_s: float = 5.0,
                 expected_key: str | None = None, reject_formats=()):
        self.reject_formats = set(reject_formats)
        self.script = list(script)
        self.default = default
        self.step = step
        self.hang_s = hang_s
        self.expected_key = expected_key
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output clean
                pass

            def _send(self, code: int, body: dict | str | bytes, headers: dict | None = None):
                raw = body if isinstance(body, bytes) else (body if isinstance(body, str) else json.dumps(body)).encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(raw)))
                    for k, v in (headers or {}).items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(raw)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_POST(self):
                t_mono, t_wall = time.monotonic(), time.time()
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                auth = self.headers.get("Authorization")
                fmt = (body.get("response_format") or {}).get("type", "text")
                if fmt in stub.reject_formats:  # refused before the script advances
                    with stub._lock:
                        stub.requests.append({"t": t_mono, "time": t_wall, "action": "rejected", "path": self.path,
                                              "model": body.get("model"), "has_auth": auth is not None,
                                              "key_ok": False, "format": fmt})
                    return self._send(500, {"error": {"message": "1 validation error: ('body', 'response_format', "
                                                                 "'type') Input should be 'text' or 'json_object'"}})
                with stub._lock:
                    action = stub.script.pop(0) if stub.script else stub.default
                    stub.requests.append({"t": t_mono, "time": t_wall, "action": action, "path": self.path,
                                          "model": body.get("model"), "has_auth": auth is not None,
                                          "key_ok": stub.expected_key is not None
                                          and auth == f"Bearer {stub.expected_key}", "format": fmt})
                if self.path.rstrip("/") != "/v1/chat/completions":
                    return self._send(404, {"error": {"message": f"no route {self.path}"}})
                prompt = "\n".join(str(m.get("content", "")) for m in body.get("messages", []))
                if action == "429":
                    return self._send(429, {"error": {"message": "rate limited"}}, {"Retry-After": "0.2"})
                if action == "500":
                    return self._send(500, {"error": {"message": "internal error"}})
                if action == "401":
                    return self._send(401, {"error": {"message": "invalid api key"}})
                if action == "hang":
                    time.sleep(stub.hang_s)
                    return self._send(500, {"error": {"message": "too late"}})
                if action == "bad_body":
                    return self._send(200, "<html>gateway</html>")
                if action == "not_utf8":
                    return self._send(200, b'{"choices": [{"index": 0, "message": {"role": "assistant", "content": '
                                           b'"Caf\xe9 NEW_STATE: \xff{}"}}]}')
                if action == "malformed":
                    text = "I think the agent will fail if the pole starts tilted. Good luck!"
                elif action == "garbage":
                    text = 'Here {is} my {"idea": "tilt it"} and {state: maybe} {"a": 1}'
                elif action in ("fenced", "json", "nested"):
                    state = scripted_state(prompt, stub.step)
                    if action == "json":
                        text = json.dumps(state)
                    elif action == "nested":
                        text = json.dumps({"scenario_analysis": "near the edge", "plan": "push it", "new_state": state})
                    else:
                        text = ("Sure! Here is a harder scenario:\n```json\n" + json.dumps(state, indent=1)[:-1]
                                + ",\n}\n```\nIt should make the policy fail.")
                else:
                    state = scripted_state(prompt, stub.step if action == "ok" else 0.0)
                    if action == "far":
                        _, bounds = seed_and_bounds(prompt)
                        state = {k: (hi if state[k] < (lo + hi) / 2 else lo) for k, (lo, hi) in
                                 ((k, bounds[k]) for k in state)}
                    elif action == "out_of_bounds":
                        first = next(iter(state))
                        state[first] = seed_and_bounds(prompt)[1][first][1] + 1e6
                    text = answer(state)
                return self._send(200, {
                    "id": f"chatcmpl-{len(stub.requests)}", "object": "chat.completion", "model": body.get("model"),
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": text}}],
                    "usage": {"prompt_tokens": len(prompt) // 4, "completion_tokens": len(text) // 4,
                              "total_tokens": len(prompt) // 4 + len(text) // 4}})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    def actions(self) -> list[str]:
        with self._lock:
            return [r["action"] for r in self.requests]
