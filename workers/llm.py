"""The LLM client: OpenAI-compatible chat completions behind one shared rate limiter.

Any server that speaks ``POST {base_url}/chat/completions`` works: OpenAI, vLLM, Ollama
(``http://127.0.0.1:11434/v1``), llama.cpp's ``llama-server`` (``http://127.0.0.1:8080/v1``).

* :class:`LLMConfig` — endpoint, model, the *name* of the environment variable that holds the
  API key (the key itself is read from the environment when a request is made and is never
  stored in the config, a log line, a Parquet file or MLflow), sampling settings, retry policy
  and the limits: requests per minute, tokens per minute, calls in flight.
* :class:`RateLimiter` — two token buckets (requests/min, tokens/min) and a cap on calls in
  flight, async. In a campaign one limiter is a named Ray actor shared by every
  :class:`LLMGenerator` actor, so the limits hold for the whole campaign, not per actor.
  Estimated token costs are reconciled with the ``usage`` the server reports; a 429 pauses
  every caller (``Retry-After`` when the server sends one).
* :class:`LLMGenerator` — one chat completion with retries: 429, 408 and 5xx, timeouts and
  dropped connections are retried with exponential backoff and jitter (``Retry-After``
  honoured); 400/401/403/404 are configuration errors and raise :class:`LLMFatalError`
  (naming the setting to fix) because retrying cannot help. Anything else that goes wrong
  (a body that is not a chat completion, bytes that are not UTF-8) comes back as an
  :class:`LLMReply` with ``ok = False`` and the reason, never as a crash. A call ends within
  ``call_deadline_s`` whatever the server does (attempts, backoffs and rate-limiter waits
  included); a campaign phase whose calls get no answer for ``phase_deadline_s`` stops
  (``orchestrator.cluster.llm_pool``).
* Replies constrained to JSON by a schema where the server supports it (``response_format``:
  OpenAI's ``json_schema``, llama.cpp's ``json_object`` + ``schema``; ``auto`` steps down to the
  form the server takes, then to plain text). No endpoint at all: ``workers.local_llm`` runs one.

Nothing here imports Ray: the Ray actors are these classes wrapped by ``orchestrator.cluster.llm_pool``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from dataclasses import asdict, dataclass, field

RESPONSE_FORMATS = ("auto", "json_schema", "json_object", "text")
FORMAT_FALLBACK = {"json_schema": "json_object", "json_object": "text"}  # response_format: auto
RETRY_STATUS = (408, 409, 425, 429, 500, 502, 503, 504)
FATAL_STATUS = (400, 401, 403, 404, 422)


class LLMConfigError(ValueError):
    """The LLM settings cannot work as given (no endpoint, no model, bad limits)."""


class LLMFatalError(RuntimeError):
    """The endpoint refuses the requests in a way retrying cannot fix (key, model, URL)."""


@dataclass
class LLMConfig:
    """Where and how to call the LLM. ``base_url`` and ``model`` may also come from the
    environment variables ``DELTARL_LLM_BASE_URL`` and ``DELTARL_LLM_MODEL``."""

    base_url: str | None = None  # e.g. https://api.openai.com/v1, http://127.0.0.1:8000/v1
    model: str | None = None  # e.g. gpt-4o-mini (the LLMTester paper's model)
    api_key_env: str = "OPENAI_API_KEY"  # the NAME of the variable; the key is never stored
    temperature: float = 0.7
    max_tokens: int = 1024
    timeout_s: float = 60.0  # per attempt
    call_deadline_s: float = 180.0  # per call: every attempt, backoff and rate-limiter wait included
    # per campaign phase: the longest its calls may go without one answer (a chat completion) from the endpoint;
    # then the phase stops (exit 2, the run resumable). Counted from the first call, reset by every answer; null: none
    phase_deadline_s: float | None = 600.0
    max_retries: int = 4  # attempts after the first
    backoff_s: float = 1.0  # first retry waits ~backoff_s, then doubles (with jitter)
    backoff_max_s: float = 30.0
    requests_per_minute: float = 60.0
    tokens_per_minute: float | None = None
    max_concurrent: int = 4  # calls in flight, over all generator actors
    actors: int = 2  # LLMGenerator actors (each runs several calls concurrently)
    seed: int | None = None  # sent to servers that accept it (OpenAI, vLLM)
    max_consecutive_failures: int | None = None  # stop the campaign after N calls in a row without a usable scenario
    # how the reply is constrained to JSON: auto (OpenAI's json_schema, then llama.cpp's json_object + schema, then
    # plain text, stepping down when the server refuses one), json_schema, json_object, text (no constraint)
    response_format: str = "auto"
    reasoning: bool = True  # ask for the paper's reasoning steps (as JSON fields when the reply is JSON) before the state

    def resolved(self) -> "LLMConfig":
        """A copy with ``base_url``/``model`` filled from the environment where unset."""
        c = LLMConfig(**asdict(self))
        c.base_url = c.base_url or os.environ.get("DELTARL_LLM_BASE_URL") or None
        c.model = c.model or os.environ.get("DELTARL_LLM_MODEL") or None
        return c

    def check(self) -> "LLMConfig":
        """Resolve and validate; raise :class:`LLMConfigError` naming what to set."""
        c = self.resolved()
        missing = [n for n in ("base_url", "model") if not getattr(c, n)]
        if missing:
            raise LLMConfigError(
                f"no LLM endpoint configured ({' and '.join('llm.' + m for m in missing)} missing): give the campaign "
                f"an `llm:` section with base_url (an OpenAI-compatible endpoint such as https://api.openai.com/v1, "
                f"or http://127.0.0.1:8000/v1 for vLLM / llama.cpp / Ollama) and model (e.g. gpt-4o-mini), or set "
                f"DELTARL_LLM_BASE_URL and DELTARL_LLM_MODEL; the API key is read from the environment variable "
                f"named by llm.api_key_env (now {c.api_key_env})")
        if not str(c.base_url).startswith(("http://", "https://")):
            raise LLMConfigError(f"llm.base_url must start with http:// or https://, got {c.base_url!r}")
        checks = [("requests_per_minute", c.requests_per_minute > 0), ("max_concurrent", c.max_concurrent >= 1),
                  ("actors", c.actors >= 1), ("timeout_s", c.timeout_s > 0), ("max_retries", c.max_retries >= 0),
                  ("call_deadline_s", _positive_finite(c.call_deadline_s)),
                  ("phase_deadline_s", c.phase_deadline_s is None or _positive_finite(c.phase_deadline_s)),
                  ("max_tokens", c.max_tokens >= 1), ("backoff_s", c.backoff_s >= 0),
                  ("tokens_per_minute", c.tokens_per_minute is None or c.tokens_per_minute > 0),
                  ("max_consecutive_failures", c.max_consecutive_failures is None or c.max_consecutive_failures >= 1),
                  ("response_format", c.response_format in RESPONSE_FORMATS)]
        for name, ok in checks:
            if not ok:
                raise LLMConfigError(f"llm.{name} has an impossible value: {getattr(c, name)!r}"
                                     + (f" (one of {', '.join(RESPONSE_FORMATS)})" if name == "response_format" else ""))
        if c.api_key_env and not c.api_key_env.replace("_", "").isalnum():
            raise LLMConfigError("llm.api_key_env must be the NAME of an environment variable (like OPENAI_API_KEY), "
                                 "not the key itself")
        return c

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    def to_dict(self) -> dict:
        return asdict(self)


def _positive_finite(value) -> bool:
    try:
        return 0 < float(value) < float("inf")
    except (TypeError, ValueError):
        return False


def decode_body(raw: bytes) -> tuple[str, str]:
    """``(text, problem)``: the body as UTF-8 text, or (when it is not UTF-8) the text with the
    bad bytes replaced and what is wrong, for the error message. Never raises."""
    try:
        return raw.decode("utf-8"), ""
    except UnicodeDecodeError as exc:
        return (raw.decode("utf-8", errors="replace"),
                f"a body that is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})")


@dataclass
class LLMReply:
    """One chat completion as deltarl keeps it (the audit row; no credentials in it)."""

    request_id: str
    ok: bool
    text: str = ""
    error: str = ""
    status: int = 0  # last HTTP status (0: no response)
    attempts: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0  # first attempt sent -> reply (retries and waits included)
    waited_s: float = 0.0  # time spent waiting for the rate limiter
    started_at: float = 0.0  # unix time
    model: str = ""
    response_format: str = ""  # how the reply was constrained: json_schema, json_object or text

    def to_dict(self) -> dict:
        return asdict(self)


def redact(text: str, secret: str | None) -> str:
    """``text`` with every occurrence of ``secret`` replaced (error bodies may echo headers)."""
    if secret and len(secret) >= 4:
        text = text.replace(secret, "[REDACTED]")
    return text


def estimate_tokens(messages: list[dict], max_tokens: int) -> int:
    """A cheap upper-ish estimate of a call's tokens (4 characters per token + the reply cap)."""
    chars = sum(len(str(m.get("content", ""))) for m in messages)
    return chars // 4 + 8 * len(messages) + int(max_tokens)


# ---------------------------------------------------------------------------------------------
# The rate limiter
# ---------------------------------------------------------------------------------------------


@dataclass
class _Bucket:
    rate: float  # units per second
    capacity: float
    level: float
    stamp: float = field(default_factory=time.monotonic)

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    def wait_for(self, amount: float) -> float:
        """Seconds until ``amount`` is available (0 when it is)."""
        need = min(amount, self.capacity) - self.level
        return 0.0 if need <= 1e-12 else need / self.rate


class RateLimiter:
    """Requests/min and tokens/min buckets plus a cap on calls in flight (async, FIFO).

    ``burst`` is the request bucket's capacity: 1 (the default) spaces every request by at
    least ``60 / requests_per_minute`` seconds; a larger burst allows short bursts at the same
    average rate. The tokens bucket holds one minute's worth. ``acquire(est_tokens)`` waits
    for a concurrency slot, then for both buckets, and returns a ticket; ``release(ticket,
    tokens, status, retry_after)`` frees the slot, charges the difference between actual and
    estimated tokens, and on a 429 pauses every caller for ``retry_after`` seconds (or the
    time one request's worth of budget takes to refill).
    """

    def __init__(self, requests_per_minute: float, tokens_per_minute: float | None = None,
                 max_concurrent: int = 4, burst: float = 1.0):
        if requests_per_minute <= 0 or max_concurrent < 1 or burst < 1:
            raise ValueError("RateLimiter: requests_per_minute > 0, max_concurrent >= 1 and burst >= 1 are needed")
        self.rpm = float(requests_per_minute)
        self.tpm = None if tokens_per_minute is None else float(tokens_per_minute)
        self.max_concurrent = int(max_concurrent)
        self.requests = _Bucket(self.rpm / 60.0, float(burst), float(burst))
        self.tokens = None if self.tpm is None else _Bucket(self.tpm / 60.0, self.tpm, self.tpm)
        self._lock: asyncio.Lock | None = None
        self._sem: asyncio.Semaphore | None = None
        self._pause_until = 0.0
        self._tickets: dict[int, float] = {}
        self._next = 0
        self.granted = 0
        self.in_flight = 0
        self.max_in_flight_seen = 0
        self.throttled = 0  # 429s reported
        self.waited_s = 0.0
        self.tokens_charged = 0.0
        self.grant_times: list[float] = []  # unix times of grants (the last 10,000)

    def _primitives(self):
        if self._lock is None:  # created in the event loop that uses them
            self._lock = asyncio.Lock()
            self._sem = asyncio.Semaphore(self.max_concurrent)
        return self._lock, self._sem

    async def acquire(self, est_tokens: float = 0.0) -> int:
        lock, sem = self._primitives()
        t0 = time.monotonic()
        await sem.acquire()
        try:
            async with lock:
                while True:
                    now = time.monotonic()
                    self.requests.refill(now)
                    wait = max(self._pause_until - now, self.requests.wait_for(1.0))
                    if self.tokens is not None:
                        self.tokens.refill(now)
                        wait = max(wait, self.tokens.wait_for(est_tokens))
                    if wait <= 0:
                        break
                    await asyncio.sleep(wait)
                self.requests.level -= 1.0
                if self.tokens is not None:
                    self.tokens.level -= min(float(est_tokens), self.tokens.capacity)
        except BaseException:
            sem.release()
            raise
        self._next += 1
        self._tickets[self._next] = float(est_tokens)
        self.granted += 1
        self.in_flight += 1
        self.max_in_flight_seen = max(self.max_in_flight_seen, self.in_flight)
        self.waited_s += time.monotonic() - t0
        self.grant_times.append(time.time())
        del self.grant_times[:-10_000]
        return self._next

    async def release(self, ticket: int, tokens: float | None = None, status: int = 0,
                      retry_after: float | None = None) -> None:
        _, sem = self._primitives()
        est = self._tickets.pop(int(ticket), None)
        if est is None:
            return  # unknown or already released
        self.in_flight -= 1
        sem.release()
        if tokens is not None:
            self.tokens_charged += float(tokens)
            if self.tokens is not None:
                self.tokens.level -= float(tokens) - min(est, self.tokens.capacity)
        elif self.tokens is not None:
            self.tokens_charged += est
        if status == 429:
            self.throttled += 1
            pause = retry_after if retry_after is not None and retry_after >= 0 else 1.0 / self.requests.rate
            self._pause_until = max(self._pause_until, time.monotonic() + min(float(pause), 120.0))
            self.requests.level = min(self.requests.level, 0.0)

    def stats(self) -> dict:
        return {"granted": self.granted, "in_flight": self.in_flight, "max_in_flight": self.max_in_flight_seen,
                "throttled": self.throttled, "waited_s": self.waited_s, "tokens_charged": self.tokens_charged,
                "requests_per_minute": self.rpm, "tokens_per_minute": self.tpm, "max_concurrent": self.max_concurrent}

    def recent_grants(self) -> list[float]:
        return list(self.grant_times)


# ---------------------------------------------------------------------------------------------
# The generator: one chat completion with retries
# ---------------------------------------------------------------------------------------------


def _count(value) -> int:
    """A token count from a reply's ``usage`` (0 when it is missing or not a number)."""
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError, OverflowError):
        return 0


def _retry_after(headers) -> float | None:
    value = headers.get("Retry-After") if headers is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: fall back to our own backoff


class LLMGenerator:
    """Calls the endpoint for chat messages; every call passes the shared ``limiter`` first.

    ``limiter`` is a :class:`RateLimiter` in this process or a Ray actor handle of one (its
    methods are then awaited through ``.remote``). The API key is read from the environment
    (``config.api_key_env``) of the process that makes the request, or handed over once with
    :meth:`set_api_key` (never as a constructor argument, which Ray would keep in the actor's
    creation spec).
    """

    def __init__(self, config: dict | LLMConfig, limiter=None, seed: int = 0):
        self.config = config if isinstance(config, LLMConfig) else LLMConfig(**config)
        self.config = self.config.check()
        self.limiter = limiter if limiter is not None else RateLimiter(
            self.config.requests_per_minute, self.config.tokens_per_minute, self.config.max_concurrent)
        self._key: str | None = None
        self._session = None
        self._late: set = set()  # rate-limiter requests still pending after their call's deadline
        self._rng = random.Random(seed)
        self._auto = self.config.response_format == "auto"
        self._format = "json_schema" if self._auto else self.config.response_format

    def set_api_key(self, key: str | None) -> bool:
        self._key = key or None
        return self._key is not None

    def _api_key(self) -> str | None:
        return self._key or self.config.api_key()

    async def _limiter(self, method: str, *args):
        fn = getattr(self.limiter, method)
        if hasattr(fn, "remote"):  # a Ray actor handle
            return await fn.remote(*args)
        return await fn(*args)

    async def _http(self):
        import aiohttp

        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.config.backoff_max_s)
        base = self.config.backoff_s * (2 ** (attempt - 1))
        return min(self.config.backoff_max_s, base) * (0.5 + self._rng.random())

    def response_format(self, schema: dict | None) -> dict | None:
        """The request's ``response_format`` for ``schema`` in the current mode (None: unconstrained)."""
        if schema is None or self._format == "text":
            return None
        if self._format == "json_schema":  # OpenAI, vLLM, Ollama, llama.cpp's llama-server
            return {"type": "json_schema", "json_schema": {"name": "new_scenario", "schema": schema, "strict": True}}
        return {"type": "json_object", "schema": schema}  # llama-cpp-python's server

    def _step_down(self, status: int, body: str, used: str) -> bool:
        """``response_format: auto``: the server refused the JSON constraint ``used``; the next
        requests use the next form (once, even when several calls in flight were refused)."""
        if not self._auto or used == "text" or status not in (400, 422, 500):
            return False
        low = body.lower()
        if not any(w in low for w in ("response_format", "json_schema", "json_object", "schema")):
            return False
        if self._format == used:
            self._format = FORMAT_FALLBACK[used]
        return True

    async def chat(self, messages: list[dict], request_id: str = "", schema: dict | None = None,
                   deadline_s: float | None = None) -> dict:
        """One completion; returns :meth:`LLMReply.to_dict` (``ok`` False with the reason when
        every attempt failed, or when the call's deadline came first). Raises
        :class:`LLMFatalError` on 400/401/403/404/422. ``schema``: the JSON schema the reply should
        follow (sent as ``response_format`` unless the mode is text). ``deadline_s``: this call's
        deadline when shorter than ``llm.call_deadline_s`` (the time left to a phase)."""
        cfg = self.config
        key = self._api_key()
        url = cfg.base_url.rstrip("/") + "/chat/completions"
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        payload = {"model": cfg.model, "messages": messages, "temperature": cfg.temperature,
                   "max_tokens": cfg.max_tokens}
        if cfg.seed is not None:
            payload["seed"] = int(cfg.seed)
        est = estimate_tokens(messages, cfg.max_tokens)
        reply = LLMReply(request_id=request_id, ok=False, started_at=time.time(), model=str(cfg.model))
        t0 = time.monotonic()
        deadline = float(cfg.call_deadline_s) if deadline_s is None else min(float(cfg.call_deadline_s), deadline_s)
        end = t0 + deadline
        session = await self._http()
        last_error, late = "", False
        retries = 0
        while True:
            if time.monotonic() >= end:
                late = True
                break
            reply.attempts += 1
            fmt = self.response_format(schema)
            payload.pop("response_format", None)
            if fmt is not None:
                payload["response_format"] = fmt
            reply.response_format = "text" if fmt is None else self._format
            tw = time.monotonic()
            ticket = await self._acquire(est, end)
            reply.waited_s += time.monotonic() - tw
            if ticket is None:  # the rate limiter held the call past its deadline
                reply.attempts -= 1
                last_error = last_error or ("it waited for the rate limiter (llm.max_concurrent calls in flight, "
                                            "llm.requests_per_minute) and was never sent")
                late = True
                break
            outcome = await self._attempt(session, url, payload, headers, fmt, ticket, reply, key, end)
            if outcome == "ok":
                break
            last_error = outcome["error"]
            if outcome.get("stepped"):
                continue  # not a failure: the same request again in the next form, at once
            retries += 1
            if retries > cfg.max_retries:
                break
            wait = self._backoff(retries, outcome.get("retry_after"))
            if time.monotonic() + wait >= end:  # no time left for another attempt
                late = True
                break
            await asyncio.sleep(wait)
        if not reply.ok:
            if late:
                last_error = (f"{last_error + '; ' if last_error else ''}no answer within the call's deadline "
                              f"(llm.call_deadline_s = {cfg.call_deadline_s:g} s"
                              + (f", cut to the {deadline:.3g} s left to the phase" if deadline < cfg.call_deadline_s
                                 else "") + ")")
            reply.error = f"{last_error} (after {reply.attempts} attempts)"
        reply.latency_s = time.monotonic() - t0
        return reply.to_dict()

    async def _acquire(self, est: float, end: float):
        """A rate-limiter ticket, or None when the limiter would hold the call past ``end``; a
        ticket granted after that is released as soon as it comes (no slot is lost)."""
        pending = asyncio.ensure_future(self._limiter("acquire", est))
        try:
            return await asyncio.wait_for(asyncio.shield(pending), timeout=max(0.0, end - time.monotonic()))
        except asyncio.TimeoutError:
            def give_back(done):
                self._late.discard(done)
                if not done.cancelled() and done.exception() is None:
                    self._late.add(asyncio.ensure_future(self._limiter("release", done.result(), None, 0, None)))

            self._late.add(pending)
            pending.add_done_callback(give_back)
            return None

    async def _attempt(self, session, url: str, payload: dict, headers: dict, fmt, ticket, reply: LLMReply,
                       key: str | None, end: float):
        """One HTTP attempt within the call's deadline ``end``: ``"ok"`` (``reply`` filled), or
        ``{"error", "retry_after", "stepped"}``. Raises :class:`LLMFatalError` on a fatal status."""
        import aiohttp

        cfg = self.config
        status, used, retry_after = 0, None, None
        limit = min(cfg.timeout_s, max(0.001, end - time.monotonic()))
        try:
            async with session.post(url, json=payload, headers=headers,
                                    timeout=aiohttp.ClientTimeout(total=limit)) as resp:
                status = resp.status
                reply.status = status
                retry_after = _retry_after(resp.headers)
                body, not_text = decode_body(await resp.read())
            if status == 200:
                if not_text:
                    return {"error": f"the endpoint answered 200 with {not_text}"}
                try:
                    data = json.loads(body)
                    text = data["choices"][0]["message"]["content"]
                    if not isinstance(text, str):
                        raise TypeError("content is not a string")
                    text.encode("utf-8")  # lone surrogates (\ud800 escapes) are no text either
                except (ValueError, KeyError, IndexError, TypeError) as exc:
                    return {"error": f"the endpoint answered 200 with a body that is not a chat completion "
                                     f"({type(exc).__name__}: {str(exc)[:120]})"}
                usage = data.get("usage") or {}
                usage = usage if isinstance(usage, dict) else {}
                reply.prompt_tokens = _count(usage.get("prompt_tokens"))
                reply.completion_tokens = _count(usage.get("completion_tokens"))
                used = reply.prompt_tokens + reply.completion_tokens if usage else None
                reply.ok, reply.text, reply.error = True, text, ""
                return "ok"
            if fmt is not None and self._step_down(status, body, reply.response_format):
                return {"error": f"HTTP {status}: the server refused response_format {fmt['type']}", "stepped": True}
            if status in FATAL_STATUS:
                hint = {401: f"check the API key in the environment variable {cfg.api_key_env}",
                        403: f"the key in {cfg.api_key_env} lacks access to model {cfg.model!r}",
                        404: f"check llm.base_url ({cfg.base_url}) and llm.model ({cfg.model})"}.get(
                    status, "the request was refused; check llm.model, llm.response_format and the endpoint's limits")
                raise LLMFatalError(f"the LLM endpoint answered HTTP {status}: {hint}. "
                                    f"Reply: {redact(body[:300], key)}")
            return {"error": f"HTTP {status}: {redact(body[:200], key)}",
                    "retry_after": retry_after if status == 429 else None}
        except asyncio.TimeoutError:
            if limit < cfg.timeout_s:
                return {"error": f"no reply within the {limit:.3g} s left to the call"}
            return {"error": f"no reply within llm.timeout_s = {cfg.timeout_s:g} s"}
        except aiohttp.ClientError as exc:
            return {"error": f"connection error ({type(exc).__name__}: {redact(str(exc)[:200], key)})"}
        finally:
            await self._limiter("release", ticket, used, status, retry_after)

    async def close(self, wait_s: float = 5.0) -> None:
        """Close the HTTP session; first let the tickets granted after their call's deadline be
        given back (``wait_s`` at most: the slots they wait for are freed by attempts that end at
        their own deadlines), so a shared limiter loses no slot, and no task is left pending."""
        late = [f for f in self._late if not f.done()]
        if late:
            await asyncio.wait(late, timeout=wait_s)
            for f in late:
                f.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        releases = [f for f in self._late if not f.done()]
        if releases:
            await asyncio.gather(*releases, return_exceptions=True)
        if self._session is not None and not self._session.closed:
            await self._session.close()
