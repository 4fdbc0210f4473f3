"""LLM calls for a campaign: rate-limited generator actors on Ray, or one in this process.

    pool = make_llm_pool(config, run_dir, use_ray=True)
    replies = pool.generate([{"request_id": "g0-r0", "messages": [...]}, ...])   # in order

On Ray: one named, detached ``RateLimiter`` actor per endpoint, model and limits
(``llm_rate_limiter-<hash>`` in namespace ``deltarl``, ``num_cpus=0``, async), shared by the
``config.actors`` async ``LLMGenerator`` actors of every campaign on the cluster that calls that
endpoint (a grid's campaigns share one budget); requests are
dealt round-robin and awaited together, so up to ``max_concurrent`` calls are in flight while
the limiter holds requests/min and tokens/min for all of them. Without Ray (``workers: 0``
campaigns, tests) the same classes run on an event loop in a background thread.

Every request and reply is kept for audit: ``<run>/llm/calls-NNNNNN.parquet`` (one file per
batch, written whole): request id, prompt messages (JSON), reply text, ok, error, HTTP status,
attempts, tokens, latency, waits. The API key is read from the environment by whoever makes the
call and handed to Ray actors through a method call; it is in no file, log line or parameter.

No endpoint configured: the pool starts the local model (``workers.local_llm``: SmolLM2-135M-Instruct
under llama-cpp-python's server on a free port of 127.0.0.1) and stops it when it is closed, which
the campaign loop does in a ``finally`` (an error or Ctrl-C included).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from pathlib import Path

from workers.llm import LLMConfig, LLMFatalError, LLMGenerator, RateLimiter

log = logging.getLogger(__name__)


class AuditLog:
    """Parquet files of every prompt and reply under ``directory`` (one file per batch)."""

    def __init__(self, directory: Path | None):
        self.directory = None if directory is None else Path(directory)
        existing = sorted(self.directory.glob("calls-*.parquet")) if self.directory and self.directory.is_dir() else []
        self.batch = int(existing[-1].stem.split("-")[1]) + 1 if existing else 0

    def write(self, requests: list[dict], replies: list[dict]) -> None:
        if self.directory is None or not requests:
            return
        import pyarrow as pa

        from orchestrator.runs.store import atomic_write_table

        self.directory.mkdir(parents=True, exist_ok=True)
        rows = []
        for req, rep in zip(requests, replies):
            row = {k: rep.get(k) for k in ("request_id", "ok", "text", "error", "status", "attempts", "prompt_tokens",
                                            "completion_tokens", "latency_s", "waited_s", "started_at", "model",
                                            "response_format")}
            row["batch"] = self.batch
            row["messages"] = json.dumps(req["messages"])
            rows.append(row)
        atomic_write_table(self.directory / f"calls-{self.batch:06d}.parquet", pa.Table.from_pylist(rows))
        self.batch += 1


class _PoolBase:
    server = None  # the local model's server when this pool started it (stopped by close())

    def __init__(self, config: LLMConfig, audit_dir: Path | None):
        self.config = config.check()
        self.audit = AuditLog(audit_dir)
        self.run_dir = None if audit_dir is None else Path(audit_dir).parent
        self.ever_ok = False  # the endpoint answered at least once (for telling a wrong URL from an outage)
        self.silent_since: float | None = None  # monotonic time of the first call since the last answer

    def stop_server(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.stop()

    def generate(self, requests: list[dict]) -> list[dict]:
        """The replies to ``requests``, in order. Each call ends within ``llm.call_deadline_s``, cut
        to the time left to the phase: once the pool's calls have had no answer for
        ``llm.phase_deadline_s`` (counted from the first call after the last answer) the phase
        stops with :class:`LLMFatalError` (exit 2; the run keeps what it committed)."""
        if not requests:
            return []
        now = time.monotonic()
        if self.silent_since is None:
            self.silent_since = now
        limit = self.config.phase_deadline_s
        left = None if limit is None else max(0.0, float(limit) - (now - self.silent_since))
        replies = self._generate(requests, left)
        self.audit.write(requests, replies)
        if any(r["ok"] for r in replies):
            self.ever_ok = True
            self.silent_since = None
            return replies
        if not self.ever_ok and all(r["error"].startswith("connection error") for r in replies):
            # never reached it once, and every attempt of this batch was refused: a wrong
            # base_url or a server that is not running, not a transient failure
            raise LLMFatalError(f"cannot reach the LLM endpoint {self.config.base_url}: {replies[0]['error']}; "
                                f"check llm.base_url and that the server is running; {self._what_is_kept()}")
        silent = time.monotonic() - self.silent_since
        if limit is not None and silent >= float(limit) - 1e-3:
            sent = max(replies, key=lambda r: r["attempts"])  # a call that reached the server says most
            raise LLMFatalError(
                f"the LLM endpoint {self.config.base_url} gave no answer in {float(limit):g} s, the longest a phase "
                f"waits (llm.phase_deadline_s; last: {sent['error'][:200]}); the phase stopped. "
                f"Check the server; {self._what_is_kept()}")
        return replies

    def _what_is_kept(self) -> str:
        """What the person can do with the run after the pool stopped the phase."""
        from orchestrator.runs.layout import RunFolder

        run = None if self.run_dir is None else RunFolder(self.run_dir)
        if run is not None and any(run.has_phase(p) for p in ("safety", "optimality")):
            return f"the run keeps what it committed: continue it with: deltarl run --resume {run.root}"
        return "nothing was committed yet: run the campaign again once the server answers"


class LocalLLMPool(_PoolBase):
    """One generator and its limiter on an event loop in a background thread (no Ray)."""

    def __init__(self, config: LLMConfig, audit_dir: Path | None = None):
        super().__init__(config, audit_dir)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="deltarl-llm", daemon=True)
        self._thread.start()
        self.limiter = RateLimiter(self.config.requests_per_minute, self.config.tokens_per_minute,
                                   self.config.max_concurrent)
        self.generator = LLMGenerator(self.config, self.limiter)

    def _generate(self, requests, deadline_s: float | None = None):
        async def run_all():
            return await asyncio.gather(*(self.generator.chat(r["messages"], r["request_id"], r.get("schema"),
                                                              deadline_s) for r in requests))

        return asyncio.run_coroutine_threadsafe(run_all(), self._loop).result()

    def close(self) -> None:
        try:
            if self._loop.is_running():
                asyncio.run_coroutine_threadsafe(self.generator.close(), self._loop).result(timeout=10)
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(timeout=10)
        finally:
            self.stop_server()


def limiter_name(config: LLMConfig) -> str:
    """One limiter per endpoint, model and limits: campaigns of a grid that call the same
    endpoint with the same key share it, so its limits hold for all of them together."""
    import hashlib

    key = f"{config.base_url}|{config.model}|{config.requests_per_minute}|{config.tokens_per_minute}|" \
          f"{config.max_concurrent}"
    return "llm_rate_limiter-" + hashlib.sha1(key.encode()).hexdigest()[:12]


def rate_limiter_actor(config: LLMConfig, name: str | None = None, namespace: str = "deltarl"):
    """The shared limiter actor: named, detached (it outlives the campaign that created it, so
    concurrent campaigns never lose it), created once per cluster; later calls get the same one."""
    import ray

    cls = ray.remote(num_cpus=0, max_concurrency=1000)(RateLimiter)
    return cls.options(name=name or limiter_name(config), namespace=namespace, get_if_exists=True,
                       lifetime="detached").remote(config.requests_per_minute, config.tokens_per_minute,
                                                   config.max_concurrent)


def generator_actors(config: LLMConfig, limiter, n: int | None = None) -> list:
    """``n`` async LLMGenerator actors sharing ``limiter``; the API key handed over by a method call."""
    import ray

    cls = ray.remote(num_cpus=0, max_concurrency=max(16, 4 * config.max_concurrent))(LLMGenerator)
    actors = [cls.remote(config.to_dict(), limiter, seed=i) for i in range(n or config.actors)]
    key = config.api_key()
    ray.get([a.set_api_key.remote(key) for a in actors])
    return actors


class RayLLMPool(_PoolBase):
    """``config.actors`` generator actors behind one named rate-limiter actor."""

    def __init__(self, config: LLMConfig, audit_dir: Path | None = None):
        super().__init__(config, audit_dir)
        import ray

        from orchestrator.cluster.lifecycle import start_ray

        start_ray()
        self._ray = ray
        self.limiter = rate_limiter_actor(self.config)
        self.actors = generator_actors(self.config, self.limiter)

    def _generate(self, requests, deadline_s: float | None = None):
        refs = [self.actors[i % len(self.actors)].chat.remote(r["messages"], r["request_id"], r.get("schema"),
                                                              deadline_s)
                for i, r in enumerate(requests)]
        try:
            return self._ray.get(refs)
        except self._ray.exceptions.RayTaskError as exc:
            cause = exc.as_instanceof_cause() if hasattr(exc, "as_instanceof_cause") else exc
            if isinstance(cause, LLMFatalError) or "LLMFatalError" in str(type(cause)):
                raise LLMFatalError(str(getattr(cause, "args", [cause])[0]).splitlines()[-1]) from None
            raise

    def limiter_stats(self) -> dict:
        return self._ray.get(self.limiter.stats.remote())

    def close(self) -> None:
        try:
            for a in self.actors:
                try:
                    self._ray.get(a.close.remote(), timeout=10)
                except self._ray.exceptions.RayError as exc:  # a dead actor, a timeout: it is killed next
                    log.debug("LLM generator actor did not close cleanly: %s: %s", type(exc).__name__, exc)
                self._ray.kill(a)
            self.actors = []  # the limiter stays: other campaigns on this cluster may share it
        finally:
            self.stop_server()


def make_llm_pool(config: LLMConfig | dict | None, run_dir: Path | None, *, use_ray: bool):
    """The pool a campaign uses (audit files under ``run_dir/llm`` when ``run_dir`` is given).
    Without an endpoint (``workers.local_llm.uses_local_model``) it starts the local model's server
    on 127.0.0.1 first (its log in ``run_dir/llm/_server.log``, a name Parquet readers of the folder skip); ``pool.close()`` stops it."""
    from workers import local_llm

    cfg = config if isinstance(config, LLMConfig) else LLMConfig(**(config or {}))
    audit = None if run_dir is None else Path(run_dir) / "llm"
    server = None
    if local_llm.uses_local_model(cfg):
        server = local_llm.LocalLLMServer(log_path=None if audit is None else audit / "_server.log")
        server.start()
        cfg = local_llm.local_config(cfg, server)
    elif cfg.resolved().model == local_llm.MODEL_ALIAS:  # the local model under `deltarl llm serve`
        cfg = local_llm.local_config(cfg, None)
    try:
        pool = RayLLMPool(cfg, audit) if use_ray else LocalLLMPool(cfg, audit)
    except BaseException:
        if server is not None:
            server.stop()
        raise
    pool.server = server
    return pool


def attach_llm(fuzzer, campaign, run_dir: Path, *, use_ray: bool | None = None):
    """Give ``fuzzer`` the campaign's LLM when it needs one; returns the pool (or None).
    ``use_ray``: generator actors on Ray (default: when the campaign sets Ray rollout actors)."""
    if not fuzzer.needs_llm:
        return None
    if use_ray is None:
        use_ray = isinstance(campaign.workers, int) and campaign.workers > 0
    pool = make_llm_pool(campaign.llm or LLMConfig(), run_dir, use_ray=use_ray)
    try:
        fuzzer.attach_llm(pool.generate, max_consecutive_failures=pool.config.max_consecutive_failures,
                          structured=pool.config.response_format != "text", reasoning=pool.config.reasoning)
    except BaseException:
        pool.close()
        raise
    return pool


def llm_metrics(fuzzer) -> dict:
    """Per-generation LLM figures of an LLM-guided fuzzer (empty for the others): calls, tokens,
    random mutations (the calls the multi-scale strategy saved), fallbacks, the threshold α."""
    if not fuzzer.needs_llm:
        return {}
    s = fuzzer.stats()
    return {"llm_calls": s["llm_calls"], "llm_tokens": s["llm_prompt_tokens"] + s["llm_completion_tokens"],
            "llm_failed": s["llm_failed"], "llm_fallbacks": s["llm_fallbacks"], "random_mutations": s["random_mutations"],
            "llm_bad_cases": s["llm_unparseable"] + s["llm_invalid"] + s["llm_excessive"] + s["llm_insufficient"],
            "fuzz_tests": s["fuzz_tests"], "alpha": s["alpha"]}
