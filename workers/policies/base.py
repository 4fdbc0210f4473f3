"""The policy base class: batched ``act`` with the output conventions of every format, and the
helpers the formats share (errors, hashes, devices, action specs).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch

from envs.base import ActionSpec

TORCHSCRIPT_EXTENSIONS = (".pt", ".ts", ".torchscript")
SUPPORTED_URIS = (
    "a d3rlpy file (.d3), TorchScript (.pt/.ts/.torchscript), ONNX (.onnx), "
    "Stable-Baselines3 (.zip), an rl-baselines3-zoo folder (rlzoo:PATH), python:module:attr, random:SEED, or zoo:NAME"
)
_META_NAME = "deltarl.json"  # TorchScript extra file / ONNX metadata key written by the exporters


class PolicyError(ValueError):
    """A policy that cannot be loaded or does not fit the scenario (one clear message)."""


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def _short(exc: BaseException, limit: int = 240) -> str:
    """``ExcType: first line of the message`` (never a traceback), truncated."""
    msg = str(exc).strip().splitlines()
    first = msg[0].strip() if msg else ""
    if len(first) > limit:
        first = first[: limit - 3] + "..."
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _resolve_device(device: str | None) -> str:
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    dev = str(device).strip().lower()
    if dev.startswith("cuda") and not torch.cuda.is_available():
        raise PolicyError(
            f"device {device!r} was requested but CUDA is not available on this machine "
            "(torch.cuda.is_available() is False); use device='cpu' or leave it unset"
        )
    try:
        torch.device(dev)
    except Exception as e:  # noqa: BLE001
        raise PolicyError(f"unknown device {device!r}; use 'cpu', 'cuda' or 'cuda:N'") from e
    return dev


def _describe_action(spec: ActionSpec | None) -> str:
    if spec is None:
        return "unknown action space"
    if spec.discrete:
        return f"Discrete({spec.n})"
    if spec.low is None or spec.high is None:
        return f"Box{tuple(spec.shape)}"
    return spec.describe()


def _scenario_label(scenario) -> str:
    if scenario is None:
        return "the scenario"
    name = getattr(scenario, "name", "") or "the scenario"
    return f"{name} (obs {scenario.obs_dim}, {_describe_action(scenario.action)})"


def _bounds(spec: ActionSpec):
    if spec.low is None or spec.high is None:
        return None, None
    shape = tuple(spec.shape)
    low = np.broadcast_to(np.asarray(spec.low, dtype=np.float32), shape)
    high = np.broadcast_to(np.asarray(spec.high, dtype=np.float32), shape)
    return low, high


def _spec_from_meta(meta: dict | None) -> tuple[int | None, ActionSpec | None]:
    if not meta:
        return None, None
    obs_dim = meta.get("obs_dim")
    obs_dim = int(obs_dim) if obs_dim is not None else None
    kind = meta.get("kind")
    if kind == "discrete":
        return obs_dim, ActionSpec("discrete", n=int(meta["n"]))
    if kind == "continuous":
        shape = tuple(int(s) for s in meta["shape"])
        low = np.asarray(meta["low"], dtype=np.float32) if meta.get("low") is not None else None
        high = np.asarray(meta["high"], dtype=np.float32) if meta.get("high") is not None else None
        return obs_dim, ActionSpec("continuous", shape=shape, low=low, high=high)
    return obs_dim, None


def _gym_action_spec(space) -> ActionSpec | None:
    """An ActionSpec from a gymnasium (or gym) space; None when it is neither Discrete nor Box."""
    name = type(space).__name__
    if name == "Discrete":
        return ActionSpec("discrete", n=int(space.n))
    if name == "Box":
        return ActionSpec(
            "continuous",
            shape=tuple(int(s) for s in space.shape),
            low=np.asarray(space.low, dtype=np.float32),
            high=np.asarray(space.high, dtype=np.float32),
        )
    return None


def stackable_rows(rows: list, kind) -> bool:
    """Whether per-row outputs (``kind``: ``np.ndarray`` or ``torch.Tensor``) are each one row of
    the same dtype and shape, so stacking them gives the batch's output array."""
    return all(isinstance(r, kind) and r.ndim >= 1 and r.shape[0] == 1 for r in rows) \
        and len({(r.dtype, tuple(r.shape[1:])) for r in rows}) == 1


# ---------------------------------------------------------------------------------------------
# the policy base class
# ---------------------------------------------------------------------------------------------
class Policy:
    """A loaded policy. Subclasses implement :meth:`_forward` (raw model output).

    Attributes: ``uri`` (as given), ``path`` (the file, or None), ``format`` ("d3rlpy",
    "torchscript", "onnx", "sb3", "python", "random"), ``device``, ``obs_dim`` (None when
    unknown), ``action`` (an :class:`ActionSpec`, None when unknown), ``sha256`` (hash of the
    file, of the module source for ``python:``, of the URI for ``random:``).

    ``rowwise``: where the model is a traced torch graph that passed the check of
    :func:`workers.policies.rowwise.rowwise_or_none`, the graph that computes many rows at once
    with each row exactly as alone (``act_alone`` uses it); None: ``act_alone`` calls the model
    once per row. A format that can have one sets ``_rowwise_later`` and implements
    :meth:`_make_rowwise`; the graph is made and checked on the first ``act_alone`` of two rows or
    more, so a process that only acts in batches never pays for it. :meth:`per_row_loop` (``deltarl
    replay``) keeps the plain loop.
    """

    format = "policy"
    rowwise = None
    _rowwise_later = False  # a rowwise graph to make on the first act_alone (see the class docstring)

    def per_row_loop(self) -> None:
        """From now on ``act_alone`` calls the model once per row (no rowwise graph): the
        reference that ``deltarl replay`` checks verdicts against."""
        self.rowwise, self._rowwise_later = None, False

    def _make_rowwise(self, obs_dim: int):  # pragma: no cover - formats with a torch graph override it
        """The checked rowwise graph for observations of ``obs_dim`` values, or None."""
        return None

    def __init__(self, uri: str, *, path: str | None = None, device: str = "cpu",
                 obs_dim: int | None = None, action: ActionSpec | None = None, sha256: str = ""):
        self.uri = uri
        self.path = path
        self.device = device
        self.obs_dim = obs_dim
        self.action = action
        self.sha256 = sha256
        self.model_obs_dim: int | None = None  # what the model itself declares, if anything
        self.model_action: ActionSpec | None = None
        self._scenario = None  # set by load_policy when a scenario is given

    # -- public ---------------------------------------------------------------------------
    @property
    def label(self) -> str:
        return self.path or self.uri

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Actions for a batch of observations ``(n, obs_dim)`` (a 1-D obs is one row)."""
        obs = self._prepare(obs)
        n = obs.shape[0]
        if n == 0:
            return self._empty()
        return self._postprocess(self._forward(obs), n)

    def act_alone(self, obs: np.ndarray) -> np.ndarray:
        """The actions of ``act(obs[j:j+1])`` for every row ``j``: each row goes through the model
        as a batch of one (the agent as deployed, whose actions cannot depend on the rest of the
        batch), while the input is checked and the outputs converted once for all rows. Output
        conversion is element-wise (argmax per row, clipping), so converting the stacked rows
        gives what converting each row gives; a subclass that overrides :meth:`act` gets the
        plain per-row loop."""
        if type(self).act is not Policy.act:
            return np.concatenate([np.asarray(self.act(obs[j:j + 1])) for j in range(len(obs))])
        obs = self._prepare(obs)
        n = obs.shape[0]
        if n <= 1:
            return self._empty() if n == 0 else self._postprocess(self._forward(obs), 1)
        if self._rowwise_later:
            self._rowwise_later = False
            self.rowwise = self._make_rowwise(int(obs.shape[1]))
        raws = self._forward_alone(obs)
        if isinstance(raws, np.ndarray):  # already one array of n rows
            return self._postprocess(raws, n)
        rows = [r.detach().cpu().numpy() if isinstance(r, torch.Tensor) else r for r in raws]
        if stackable_rows(rows, np.ndarray):
            return self._postprocess(np.concatenate(rows), n)
        return np.concatenate([self._postprocess(r, 1) for r in raws])

    def _prepare(self, obs: np.ndarray) -> np.ndarray:
        """A checked, contiguous float32 batch ``(n, obs_dim)``."""
        obs = np.asarray(obs)
        if obs.ndim == 1:
            obs = obs.reshape(1, -1)
        if obs.ndim != 2:
            raise PolicyError(
                f"{self.label}: act() takes a batch of observations of shape (n, obs_dim); "
                f"got an array of shape {obs.shape}"
            )
        if self.obs_dim is not None and obs.shape[1] != self.obs_dim:
            raise PolicyError(
                f"{self.label}: expected observations of size {self.obs_dim}, got a batch of "
                f"shape {obs.shape}"
            )
        return np.ascontiguousarray(obs, dtype=np.float32)

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        return self.act(obs)

    def info(self) -> dict:
        """What a bug report stores to replay this policy."""
        return {
            "uri": self.uri,
            "format": self.format,
            "sha256": self.sha256,
            "device": self.device,
            "obs_dim": self.obs_dim,
            "action": _describe_action(self.action),
        }

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(uri={self.uri!r}, device={self.device!r}, "
                f"obs_dim={self.obs_dim}, action={_describe_action(self.action)})")

    # -- to implement ---------------------------------------------------------------------
    def _forward(self, obs: np.ndarray) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def _forward_alone(self, obs: np.ndarray) -> list | np.ndarray:
        """Raw outputs of :meth:`_forward` on each row as a batch of one (a fresh array, as when
        deployed): a list of per-row outputs, or one array of the rows stacked. A subclass may make
        the loop leaner; each row must still be one model call on one observation
        (tests/test_policies.py checks every format bit for bit)."""
        return [self._forward(obs[j:j + 1].copy()) for j in range(obs.shape[0])]

    # -- output conventions ---------------------------------------------------------------
    def _empty(self) -> np.ndarray:
        spec = self.action
        if spec is None:
            return np.zeros((0,), dtype=np.float32)
        if spec.discrete:
            return np.zeros((0,), dtype=np.int64)
        return np.zeros((0, *tuple(spec.shape)), dtype=np.float32)

    def _postprocess(self, raw: Any, n: int) -> np.ndarray:
        if isinstance(raw, tuple) and raw and isinstance(raw[0], (np.ndarray, torch.Tensor)):
            raw = raw[0]  # (actions, state) as returned by SB3-style predict, or (out, extra)
        if isinstance(raw, torch.Tensor):
            raw = raw.detach().cpu().numpy()
        try:
            y = np.asarray(raw)
        except Exception as e:  # noqa: BLE001
            raise PolicyError(f"{self.label}: the policy returned {type(raw).__name__}, not an array") from e
        if y.dtype == object or not (np.issubdtype(y.dtype, np.number) or y.dtype == bool):
            raise PolicyError(
                f"{self.label}: the policy returned values of dtype {y.dtype}; expected numbers"
            )
        if y.ndim == 0 or y.shape[0] != n:
            raise PolicyError(
                f"{self.label}: for a batch of {n} observations the policy returned an output of "
                f"shape {y.shape}; expected one row per observation (batch dimension first)"
            )
        spec = self.action
        if spec is None:
            if np.issubdtype(y.dtype, np.integer) or y.dtype == bool:
                if y.ndim == 2 and y.shape[1] == 1:
                    y = y[:, 0]
                return np.ascontiguousarray(y, dtype=np.int64)
            return np.ascontiguousarray(y, dtype=np.float32)
        if spec.discrete:
            return self._discrete(y, n, spec)
        return self._continuous(y, n, spec)

    def _discrete(self, y: np.ndarray, n: int, spec: ActionSpec) -> np.ndarray:
        k = spec.n
        if y.ndim == 2 and y.shape[1] > 1:
            if y.shape[1] != k:
                raise PolicyError(
                    f"{self.label}: expected {k} Q-values/logits per observation "
                    f"({self._expect()}), got an output of shape {tuple(y.shape)} "
                    f"({y.shape[1]} actions). Fix: use a policy trained for this scenario "
                    f"(output layer of width {k}), or choose the scenario it was trained for"
                )
            if np.issubdtype(y.dtype, np.floating) and np.isnan(y).any():
                raise PolicyError(f"{self.label}: the policy returned NaN Q-values/logits")
            return np.ascontiguousarray(np.argmax(y, axis=1), dtype=np.int64)
        if y.ndim == 2 and y.shape[1] == 1:
            y = y[:, 0]
        if y.ndim != 1:
            raise PolicyError(
                f"{self.label}: expected Q-values/logits of shape (n, {k}) or action indices of "
                f"shape (n,) ({self._expect()}), got an output of shape {tuple(y.shape)}"
            )
        if np.issubdtype(y.dtype, np.floating):
            r = np.rint(y)
            if not np.all(np.isfinite(y)) or np.any(np.abs(r - y) > 1e-6):
                raise PolicyError(
                    f"{self.label}: expected integer action indices of shape (n,) or "
                    f"Q-values/logits of shape (n, {k}) ({self._expect()}), got non-integer "
                    f"values of shape {tuple(y.shape)} (a continuous-action policy?)"
                )
            y = r
        a = y.astype(np.int64)
        bad = (a < 0) | (a >= k)
        if bad.any():
            raise PolicyError(
                f"{self.label}: the policy returned action {int(a[bad][0])}, outside "
                f"[0, {k - 1}] ({self._expect()}); use a policy trained for this scenario"
            )
        return np.ascontiguousarray(a)

    def _continuous(self, y: np.ndarray, n: int, spec: ActionSpec) -> np.ndarray:
        shape = tuple(spec.shape)
        want = (n, *shape)
        if tuple(y.shape) != want:
            if y.size == n * int(np.prod(shape)) and int(np.prod(shape)) == 1:
                y = y.reshape(want)
            else:
                want_txt = "(n, " + ", ".join(str(d) for d in shape) + ")"
                raise PolicyError(
                    f"{self.label}: expected actions of shape {want_txt} ({self._expect()}), got "
                    f"an output of shape {tuple(y.shape)} for a batch of n={n}. Fix: use a policy "
                    f"trained for this scenario (action shape {shape}), or choose the scenario "
                    f"it was trained for"
                )
        a = np.asarray(y, dtype=np.float32)
        low, high = _bounds(spec)
        if low is not None:
            a = np.clip(a, low, high)
        return np.ascontiguousarray(a, dtype=np.float32)

    def _expect(self) -> str:
        scen = getattr(self, "_scenario", None)
        if scen is not None:
            return f"scenario {_scenario_label(scen)}"
        return f"action space {_describe_action(self.action)}"


