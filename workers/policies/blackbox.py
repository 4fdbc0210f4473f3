"""Black-box agents: ``python:module:attr`` (imports and runs the module: it is code) and
``random:SEED`` (a seeded function of the observation).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from typing import Any, Callable

import numpy as np

from workers.policies.base import (
    Policy,
    PolicyError,
    _bounds,
    _describe_action,
    _sha256_text,
    _short,
)


class PythonPolicy(Policy):
    format = "python"

    def __init__(self, uri, target, device):
        module_name, sep, attr = target.rpartition(":")
        if not sep or not module_name or not attr:
            raise PolicyError(
                f"bad python: URI {uri!r}; use python:module:attr (e.g. python:my_agents:agent "
                "or python:path/to/agent.py:Agent)"
            )
        module = _import_module(uri, module_name)
        obj: Any = module
        for part in attr.split("."):
            try:
                obj = getattr(obj, part)
            except AttributeError as e:
                raise PolicyError(
                    f"python: URI {uri!r}: module {module.__name__!r} has no attribute "
                    f"{attr!r}; check the name after the last ':'"
                ) from e
        try:
            agent = _make_agent(obj)
        except PolicyError:
            raise
        except Exception as e:  # noqa: BLE001
            raise PolicyError(
                f"python: URI {uri!r}: creating the agent from {attr!r} failed ({_short(e)})"
            ) from e
        self.fn = _agent_callable(agent, uri)
        try:
            src = inspect.getsource(module)
            digest = _sha256_text(src + "\n#" + attr)
        except (OSError, TypeError):  # no source to read (a built-in or compiled module): the URI names it
            digest = _sha256_text(uri)
        super().__init__(uri, path=getattr(module, "__file__", None), device=device, sha256=digest)
        self.agent = agent

    @property
    def label(self) -> str:
        return self.uri

    def _forward(self, obs):
        return self.fn(obs)


def _import_module(uri: str, module_name: str):
    if module_name.endswith(".py") or os.sep in module_name or "/" in module_name:
        path = os.path.abspath(module_name)
        if not os.path.isfile(path):
            raise PolicyError(f"python: URI {uri!r}: file not found: {path}")
        name = "_deltarl_policy_" + hashlib.sha1(path.encode()).hexdigest()[:12]
        try:
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        except Exception as e:  # noqa: BLE001
            sys.modules.pop(name, None)
            raise PolicyError(
                f"python: URI {uri!r}: running {path} failed ({_short(e)}); fix the file"
            ) from e
        return module
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise PolicyError(
            f"python: URI {uri!r}: cannot import module {module_name!r} ({_short(e)}); make sure "
            "it is on PYTHONPATH (or give a path to a .py file: python:path/to/agent.py:attr)"
        ) from e
    except Exception as e:  # noqa: BLE001
        raise PolicyError(
            f"python: URI {uri!r}: importing module {module_name!r} failed ({_short(e)})"
        ) from e


def _required_positional(fn) -> int | None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    return sum(
        1 for p in sig.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    )


def _make_agent(obj):
    """The rule of the module docstring: class → instance; zero-arg factory → its result."""
    if inspect.isclass(obj):
        return obj()
    if hasattr(obj, "act") or hasattr(obj, "predict"):
        return obj
    if callable(obj) and _required_positional(obj) == 0:
        return obj()
    return obj


def _agent_callable(agent, uri) -> Callable[[np.ndarray], Any]:
    act = getattr(agent, "act", None)
    if callable(act):
        return act
    predict = getattr(agent, "predict", None)
    if callable(predict):
        try:
            takes_det = "deterministic" in inspect.signature(predict).parameters
        except (TypeError, ValueError):
            takes_det = False

        def _pred(obs):
            out = predict(obs, deterministic=True) if takes_det else predict(obs)
            if isinstance(out, tuple) and len(out) == 2 and (out[1] is None or isinstance(out[1], tuple)):
                out = out[0]
            return out

        return _pred
    if callable(agent):
        return agent
    raise PolicyError(
        f"python: URI {uri!r}: the target is a {type(agent).__name__} with neither act(obs) nor "
        "predict(obs) and is not callable; point it at an agent object, a function "
        "obs_batch -> actions, or a class/zero-argument factory returning an agent"
    )


class RandomPolicy(Policy):
    format = "random"

    def __init__(self, uri, seed: int, scenario, device):
        spec = scenario.action
        super().__init__(uri, device=device, obs_dim=int(scenario.obs_dim), action=spec,
                         sha256=_sha256_text(uri))
        self.seed = int(seed)
        if not spec.discrete:
            low, high = _bounds(spec)
            if low is None or not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
                raise PolicyError(
                    f"{uri}: uniform random actions need finite action bounds; the scenario's "
                    f"action space is {_describe_action(spec)}"
                )
            self.low, self.high = low.astype(np.float64), high.astype(np.float64)

    @property
    def label(self) -> str:
        return self.uri

    def _forward(self, obs):
        spec = self.action
        k = 1 if spec.discrete else int(np.prod(spec.shape))
        u = _hash_uniform(obs, self.seed, k)  # (n, k) in [0, 1)
        if spec.discrete:
            return np.minimum((u[:, 0] * spec.n).astype(np.int64), spec.n - 1)
        u = u.reshape((obs.shape[0], *tuple(spec.shape)))
        return (self.low + u * (self.high - self.low)).astype(np.float32)


_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser (uint64 arithmetic wraps)."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def _hash_uniform(obs: np.ndarray, seed: int, k: int) -> np.ndarray:
    """k uniforms in [0, 1) per row: a hash of ``seed`` and the row's float32 bits."""
    bits = np.ascontiguousarray(obs, dtype=np.float32).view(np.uint32).astype(np.uint64)
    n = bits.shape[0]
    with np.errstate(over="ignore"):
        h = _mix64(np.full(n, np.uint64(seed & 0xFFFFFFFFFFFFFFFF) + _GOLDEN, dtype=np.uint64))
        for j in range(bits.shape[1]):
            h = _mix64(h ^ (bits[:, j] + _GOLDEN * np.uint64(j + 1)))
        out = np.empty((n, k), dtype=np.float64)
        for i in range(k):
            v = _mix64(h + _GOLDEN * np.uint64(i + 101))
            out[:, i] = (v >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
    return out


