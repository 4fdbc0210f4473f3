"""Load the agent under test (and challengers) from a URI and run it on batches of observations.

``load_policy(uri, scenario=None, device=None)`` returns a :class:`Policy` whose
``act(obs)`` maps a batch of observations ``(n, obs_dim)`` to a batch of actions:

* discrete scenarios: ``int64`` array of shape ``(n,)``;
* continuous scenarios: ``float32`` array of shape ``(n, *action.shape)``, clipped to the
  action bounds when they are known.

``act`` is deterministic (the same observations give the same actions) and a batch of 0
observations gives an empty array of the right dtype and shape.

URI forms (a ``file://`` prefix is accepted for every path form):

``path/to/model.d3``
    A d3rlpy learnable saved with ``algo.save(path)``; loaded with
    ``d3rlpy.load_learnable(path, device=...)``, acts with ``algo.predict``.
``path/to/model.pt`` | ``.ts`` | ``.torchscript``
    A TorchScript module (``torch.jit.save``) taking a float tensor ``(n, obs_dim)``.
``path/to/model.onnx``
    An ONNX model run with onnxruntime (CUDAExecutionProvider when the device is CUDA and
    onnxruntime has it). Its first input takes ``(n, obs_dim)`` floats; the first output is used.
``path/to/model.zip``
    A Stable-Baselines3 model (needs ``stable-baselines3``). The algorithm is read from the
    zip (the module of the saved policy class) and otherwise DQN/PPO/A2C/SAC/TD3/DDPG are
    tried in turn; acts with ``predict(obs, deterministic=True)``.
``python:module:attr`` (``attr`` may be dotted; ``module`` may also be a path to a ``.py`` file)
    A black-box agent. ``attr`` is resolved and turned into an agent by this rule:

    1. a class is instantiated with no arguments;
    2. otherwise, a plain function (or other callable) without ``act``/``predict``
       methods whose signature requires no positional argument is a *factory*: it is
       called with no arguments;
    3. the result (or ``attr`` itself when 1-2 do not apply) is then used as:
       ``agent.act(obs)`` if it has ``act``; else ``agent.predict(obs)`` (with
       ``deterministic=True`` when ``predict`` accepts it; a returned ``(actions, state)``
       tuple, as in SB3, is unpacked); else ``agent(obs)`` if it is callable.

    The agent receives a float32 ``(n, obs_dim)`` array and may return any array-like
    following the output conventions below.
``random:SEED``
    Uniformly random actions from the scenario's action space (needs a scenario). The
    actions are a seeded pseudo-random *function of the observation* (a hash of SEED and
    the observation's bits), so they are reproducible and independent of how episodes
    are batched.

Output conventions of TorchScript / ONNX / python: models (the raw output ``y``):

* discrete: ``y`` of shape ``(n, k)`` with ``k > 1`` holds Q-values or logits, the action
  is ``argmax`` over the last axis and ``k`` must equal the scenario's number of actions;
  ``y`` of shape ``(n,)`` or ``(n, 1)`` holds the action indices themselves (integers, or
  integer-valued floats). Indices outside ``[0, n_actions)`` are an error.
* continuous: ``y`` of shape ``(n, *action.shape)`` (or ``(n,)`` for a 1-D action) is the
  action, clipped to the bounds.
* a tuple output whose first element is an array/tensor uses that first element
  (e.g. ``(actions, state)`` or ``(out, value)``).
* without a scenario (and without metadata written by :func:`export_mlp_torchscript` /
  :func:`export_mlp_onnx`) the action space is unknown: integer outputs are returned as
  int64 actions, float outputs as float32 (no argmax, no clipping). Pass a scenario.

Errors (missing/corrupt file, unknown extension, unimportable ``python:`` target, a model
that does not fit the scenario) raise :class:`PolicyError` (a ``ValueError``) with one
message saying what was expected, what was found and how to fix it.

Thread counts are left to the caller (``torch.set_num_threads``); onnxruntime sessions use
``torch.get_num_threads()`` intra-op threads so one knob controls both.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import sys
import urllib.parse
import warnings
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from envs.base import ActionSpec

__all__ = [
    "Policy",
    "PolicyError",
    "load_policy",
    "export_mlp_torchscript",
    "export_mlp_onnx",
    "TORCHSCRIPT_EXTENSIONS",
    "SUPPORTED_URIS",
]

TORCHSCRIPT_EXTENSIONS = (".pt", ".ts", ".torchscript")
SUPPORTED_URIS = (
    "a d3rlpy file (.d3), TorchScript (.pt/.ts/.torchscript), ONNX (.onnx), "
    "Stable-Baselines3 (.zip), python:module:attr, random:SEED, or zoo:NAME"
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


# ---------------------------------------------------------------------------------------------
# the policy base class
# ---------------------------------------------------------------------------------------------
class Policy:
    """A loaded policy. Subclasses implement :meth:`_forward` (raw model output).

    Attributes: ``uri`` (as given), ``path`` (the file, or None), ``format`` ("d3rlpy",
    "torchscript", "onnx", "sb3", "python", "random"), ``device``, ``obs_dim`` (None when
    unknown), ``action`` (an :class:`ActionSpec`, None when unknown), ``sha256`` (hash of the
    file, of the module source for ``python:``, of the URI for ``random:``).
    """

    format = "policy"

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
        obs = np.ascontiguousarray(obs, dtype=np.float32)
        n = obs.shape[0]
        if n == 0:
            return self._empty()
        return self._postprocess(self._forward(obs), n)

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


# ---------------------------------------------------------------------------------------------
# formats
# ---------------------------------------------------------------------------------------------
class D3rlpyPolicy(Policy):
    format = "d3rlpy"

    def __init__(self, uri, path, device):
        try:
            import d3rlpy
        except ImportError as e:  # pragma: no cover - d3rlpy is a dependency
            raise PolicyError(f"{path}: loading .d3 files needs d3rlpy (pip install d3rlpy)") from e
        try:
            algo = d3rlpy.load_learnable(path, device=device)
        except Exception as e:  # noqa: BLE001
            raise PolicyError(
                f"could not load {path} as a d3rlpy model ({_short(e)}). The file is corrupt or "
                "not a d3rlpy learnable; save one with algo.save('model.d3') (not save_model) "
                f"with d3rlpy {d3rlpy.__version__}"
            ) from e
        super().__init__(uri, path=path, device=device, sha256=_sha256_file(path))
        self.algo = algo
        obs_shape = tuple(getattr(algo, "observation_shape", None) or ())
        if len(obs_shape) == 1:
            self.model_obs_dim = int(obs_shape[0])
        try:
            discrete = algo.get_action_type().name == "DISCRETE"
        except Exception:  # noqa: BLE001
            discrete = None
        size = getattr(algo, "action_size", None)
        if discrete is not None and size is not None:
            if discrete:
                self.model_action = ActionSpec("discrete", n=int(size))
            else:
                # d3rlpy's deterministic actors live in [-1, 1] unless an action scaler is set
                self.model_action = ActionSpec("continuous", shape=(int(size),))
        self.obs_dim = self.model_obs_dim
        self.action = self.model_action

    def _forward(self, obs):
        with torch.inference_mode():
            return np.asarray(self.algo.predict(obs))


class TorchScriptPolicy(Policy):
    format = "torchscript"

    def __init__(self, uri, path, device):
        extra = {_META_NAME: ""}
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*torch.jit")
                module = torch.jit.load(path, map_location=device, _extra_files=extra)
        except Exception as e:  # noqa: BLE001
            raise PolicyError(
                f"could not load {path} as a TorchScript model ({_short(e)}). "
                f"{_torchscript_hint(path)}"
            ) from e
        super().__init__(uri, path=path, device=device, sha256=_sha256_file(path))
        module.eval()
        self.module = module
        self.in_dtype = torch.float32
        for p in module.parameters():
            if p.dtype.is_floating_point:
                self.in_dtype = p.dtype
                break
        meta = None
        if extra.get(_META_NAME):
            try:
                meta = json.loads(extra[_META_NAME])
            except Exception:  # noqa: BLE001
                meta = None
        self.model_obs_dim, self.model_action = _spec_from_meta(meta)
        self.obs_dim = self.model_obs_dim
        self.action = self.model_action
        self.first_layer_in = None  # a hint for error messages only
        for p in module.parameters():
            if p.ndim == 2:
                self.first_layer_in = int(p.shape[1])
                break

    def _forward(self, obs):
        x = torch.from_numpy(obs)
        if self.in_dtype != torch.float32:
            x = x.to(self.in_dtype)
        x = x.to(self.device)
        with torch.inference_mode():
            y = self.module(x)
        if isinstance(y, (tuple, list)):
            y = y[0]
        if isinstance(y, torch.Tensor):
            if y.dtype in (torch.float16, torch.bfloat16, torch.float64):
                y = y.float()
            return y.cpu().numpy()
        return y


def _torchscript_hint(path: str) -> str:
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except Exception:  # noqa: BLE001
        return ("The file is corrupt or not a TorchScript archive; export the policy with "
                "torch.jit.script(model).save(path) or torch.jit.trace(model, example).save(path)")
    if not any("/code/" in n or n.startswith("code/") for n in names):
        return ("It looks like a torch.save() checkpoint (weights/pickled module), not TorchScript; "
                "export it with torch.jit.script(model).save(path) or torch.jit.trace(model, example)"
                ".save(path) (a d3rlpy model: algo.save('model.d3'); or algo.save_policy('policy.pt'))")
    return ("The TorchScript archive could not be read by this torch version "
            f"({torch.__version__}); re-export it with torch.jit.save")


class OnnxPolicy(Policy):
    format = "onnx"

    def __init__(self, uri, path, device):
        try:
            import onnxruntime as ort
        except ImportError as e:  # pragma: no cover - onnxruntime is a dependency
            raise PolicyError(f"{path}: loading .onnx files needs onnxruntime (pip install onnxruntime)") from e
        providers = ["CPUExecutionProvider"]
        actual = "cpu"
        if device.startswith("cuda") and "CUDAExecutionProvider" in ort.get_available_providers():
            idx = device.split(":", 1)[1] if ":" in device else "0"
            providers = [("CUDAExecutionProvider", {"device_id": int(idx)}), "CPUExecutionProvider"]
            actual = device
        so = ort.SessionOptions()
        so.intra_op_num_threads = max(1, torch.get_num_threads())
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        try:
            sess = ort.InferenceSession(path, sess_options=so, providers=providers)
        except Exception as e:  # noqa: BLE001
            raise PolicyError(
                f"could not load {path} as an ONNX model ({_short(e)}). The file is corrupt or not "
                "an ONNX model; export the policy with torch.onnx.export (or export_mlp_onnx)"
            ) from e
        super().__init__(uri, path=path, device=actual, sha256=_sha256_file(path))
        self.session = sess
        inp = sess.get_inputs()[0]
        self.input_name = inp.name
        self.in_dtype = np.float64 if inp.type == "tensor(double)" else (
            np.float16 if inp.type == "tensor(float16)" else np.float32)
        shape = list(inp.shape or [])
        self.fixed_batch_one = len(shape) >= 1 and shape[0] == 1
        self.output_name = sess.get_outputs()[0].name
        meta = None
        try:
            raw = sess.get_modelmeta().custom_metadata_map.get(_META_NAME)
            meta = json.loads(raw) if raw else None
        except Exception:  # noqa: BLE001
            meta = None
        self.model_obs_dim, self.model_action = _spec_from_meta(meta)
        if len(shape) == 2 and isinstance(shape[1], int) and shape[1] > 0:
            self.model_obs_dim = int(shape[1])
        self.obs_dim = self.model_obs_dim
        self.action = self.model_action

    def _forward(self, obs):
        x = obs if self.in_dtype == np.float32 else obs.astype(self.in_dtype)
        if self.fixed_batch_one and x.shape[0] != 1:
            outs = [self.session.run([self.output_name], {self.input_name: x[i:i + 1]})[0]
                    for i in range(x.shape[0])]
            y = np.concatenate(outs, axis=0)
        else:
            y = self.session.run([self.output_name], {self.input_name: x})[0]
        if np.issubdtype(y.dtype, np.floating) and y.dtype != np.float32:
            y = y.astype(np.float32)
        return y


_SB3_ALGOS = ("DQN", "PPO", "A2C", "SAC", "TD3", "DDPG")


class SB3Policy(Policy):
    format = "sb3"

    def __init__(self, uri, path, device):
        try:
            import stable_baselines3 as sb3
        except ImportError as e:
            raise PolicyError(
                f"{path}: loading Stable-Baselines3 .zip models needs stable-baselines3, which is "
                "not installed; install it with `pip install 'deltarl[sb3]'` "
                "(or `pip install stable-baselines3`)"
            ) from e
        try:
            with zipfile.ZipFile(path) as z:
                data = json.loads(z.read("data"))
        except Exception as e:  # noqa: BLE001
            raise PolicyError(
                f"could not load {path} as a Stable-Baselines3 model ({_short(e)}). The file is "
                "corrupt or not an SB3 archive (a zip with a 'data' entry); save one with "
                "model.save(path)"
            ) from e
        candidates = _sb3_candidates(data)
        custom = {"learning_rate": 0.0, "lr_schedule": lambda _: 0.0, "clip_range": lambda _: 0.0}
        errors = []
        model = None
        for name in candidates:
            cls = _sb3_class(name)
            if cls is None:
                continue
            try:
                model = cls.load(path, device=device, custom_objects=custom)
                break
            except Exception as e:  # noqa: BLE001
                errors.append((name, e))
        if model is None:
            tried = ", ".join(n for n, _ in errors) or ", ".join(candidates)
            last = errors[-1][1] if errors else None
            raise PolicyError(
                f"could not load {path} as a Stable-Baselines3 model (tried {tried}"
                + (f"; last error {_short(last)}" if last is not None else "")
                + f"). Save it with model.save(path) using stable-baselines3 {sb3.__version__}"
            ) from last
        super().__init__(uri, path=path, device=device, sha256=_sha256_file(path))
        self.model = model
        self.algo_name = type(model).__name__
        obs_shape = tuple(getattr(model.observation_space, "shape", None) or ())
        if len(obs_shape) == 1:
            self.model_obs_dim = int(obs_shape[0])
        self.model_action = _gym_action_spec(model.action_space)
        self.obs_dim = self.model_obs_dim
        self.action = self.model_action

    def _forward(self, obs):
        with torch.inference_mode():
            actions, _ = self.model.predict(obs, deterministic=True)
        return np.asarray(actions)


def _sb3_candidates(data: dict) -> list[str]:
    module = ""
    pc = data.get("policy_class")
    if isinstance(pc, dict):
        module = str(pc.get("__module__", ""))
    first: list[str] = []
    parts = module.split(".")
    if len(parts) >= 3 and parts[0] in ("stable_baselines3", "sb3_contrib") and parts[1] != "common":
        first.append(f"{parts[0]}:{parts[1]}")
    elif module.startswith("stable_baselines3.common"):
        first += ["PPO", "A2C"] if "clip_range" in data or "n_epochs" in data else ["A2C", "PPO"]
    out = []
    for n in first + list(_SB3_ALGOS):
        if n not in out:
            out.append(n)
    return out


def _sb3_class(name: str):
    """``"DQN"`` → stable_baselines3.DQN; ``"pkg:subpackage"`` → the algorithm of that subpackage."""
    if ":" in name:
        pkg, sub = name.split(":", 1)
        try:
            mod = importlib.import_module(pkg)
        except ImportError:
            return None
        for attr in dir(mod):
            if attr.lower() == sub.lower():
                return getattr(mod, attr)
        return None
    import stable_baselines3 as sb3

    return getattr(sb3, name, None)


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
        except Exception:  # noqa: BLE001
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


# ---------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------
def _strip_file_uri(uri: str) -> str:
    if uri.startswith("file://"):
        rest = uri[len("file://"):]
        if rest.startswith("localhost/"):
            rest = rest[len("localhost"):]
        return urllib.parse.unquote(rest)
    return uri


def _as_scenario(scenario):
    if scenario is None or not isinstance(scenario, str):
        return scenario
    try:
        from envs import get_scenario
    except Exception as e:  # noqa: BLE001
        raise PolicyError(f"cannot resolve scenario name {scenario!r} ({_short(e)})") from e
    try:
        return get_scenario(scenario)
    except Exception as e:  # noqa: BLE001
        raise PolicyError(f"unknown scenario {scenario!r} ({_short(e)})") from e


def load_policy(uri: str, scenario=None, device: str | None = None) -> Policy:
    """Load the policy at ``uri`` (see the module docstring for the forms).

    ``scenario`` (a :class:`~envs.base.Scenario`, anything with ``name``/``obs_dim``/``action``,
    or a registered scenario name) sets the action conventions and enables the shape checks:
    the model's declared input/output sizes are compared with the scenario, and one ``act`` is
    run on a batch of zero observations. ``device``: None → "cuda" when available, else "cpu".
    Raises :class:`PolicyError` on any problem.
    """
    if not isinstance(uri, (str, os.PathLike)):
        raise PolicyError(f"a policy URI must be a string, got {type(uri).__name__}")
    uri = os.fspath(uri)
    scenario = _as_scenario(scenario)
    dev = _resolve_device(device)
    target = uri.strip()
    low = target.lower()

    if low.startswith("zoo:"):
        target = str(resolve_zoo_uri(target))
        low = target.lower()

    if low.startswith("random:"):
        seed_txt = target.split(":", 1)[1].strip()
        try:
            seed = int(seed_txt)
        except ValueError as e:
            raise PolicyError(f"bad random policy URI {uri!r}: the seed must be an integer, e.g. random:7") from e
        if scenario is None:
            raise PolicyError(
                f"{uri}: a random policy needs a scenario to know the action space; "
                "call load_policy(uri, scenario=...)"
            )
        policy: Policy = RandomPolicy(uri, seed, scenario, dev)
    elif low.startswith("python:"):
        policy = PythonPolicy(uri, target.split(":", 1)[1], dev)
    else:
        path = os.path.abspath(os.path.expanduser(_strip_file_uri(target)))
        ext = _extension(path)
        if ext not in (".d3", ".onnx", ".zip") + TORCHSCRIPT_EXTENSIONS:
            raise PolicyError(
                f"don't know how to load {uri!r}: unknown extension {ext or '(none)'!r}. "
                f"Supported: {SUPPORTED_URIS}"
            )
        if not os.path.exists(path):
            raise PolicyError(
                f"policy file not found: {path}" + (f" (from {uri!r})" if path != uri else "")
                + "; check the path"
            )
        if not os.path.isfile(path):
            raise PolicyError(f"policy path is not a file: {path}")
        if ext == ".d3":
            policy = D3rlpyPolicy(uri, path, dev)
        elif ext == ".onnx":
            policy = OnnxPolicy(uri, path, dev)
        elif ext == ".zip":
            policy = SB3Policy(uri, path, dev)
        else:
            policy = TorchScriptPolicy(uri, path, dev)

    if scenario is not None:
        _check_against(policy, scenario)
    return policy


def zoo_dir() -> Path:
    """The agent zoo: ``$DELTARL_ZOO`` or ``experiments/zoo`` of this checkout."""
    env = os.environ.get("DELTARL_ZOO")
    return Path(env) if env else Path(__file__).resolve().parents[1] / "experiments" / "zoo"


def resolve_zoo_uri(uri: str) -> Path:
    """``zoo:CartPole-v1`` (or ``zoo:CartPole-v1-ddqn``) -> the agent's TorchScript file
    (``policy.pt``), else its d3rlpy model (``model.d3``)."""
    name = uri.split(":", 1)[1].strip()
    root = zoo_dir()
    candidates = [root / name] if (root / name).is_dir() else sorted(
        p for p in root.glob(f"{name}-*") if p.is_dir() and p.name.rsplit("-", 1)[0].lower() == name.lower()
    )
    known = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    if not candidates:
        raise PolicyError(f"no zoo agent {name!r} in {root}; known agents: {', '.join(known) or 'none'}")
    if len(candidates) > 1:
        raise PolicyError(f"zoo:{name} is ambiguous ({', '.join(p.name for p in candidates)}); name one of them")
    for f in ("policy.pt", "model.d3"):
        if (candidates[0] / f).is_file():
            return candidates[0] / f
    raise PolicyError(f"zoo agent {candidates[0].name} has neither policy.pt nor model.d3 in {candidates[0]}")


def _extension(path: str) -> str:
    base = os.path.basename(path).lower()
    if base.endswith(".torchscript"):
        return ".torchscript"
    return os.path.splitext(base)[1]


def _check_against(policy: Policy, scenario) -> None:
    """Compare declared sizes with the scenario, then probe one act on zero observations."""
    want_obs = int(scenario.obs_dim)
    want = scenario.action
    where = f"scenario {_scenario_label(scenario)}"
    fix = (f"Fix: use a policy trained for {getattr(scenario, 'name', '') or 'this scenario'}, "
           "or choose the scenario the policy was trained for")
    label = policy.label
    if policy.model_obs_dim is not None and policy.model_obs_dim != want_obs:
        raise PolicyError(
            f"{label}: expected a policy for observations of size {want_obs} ({where}), but the "
            f"model takes observations of size {policy.model_obs_dim}. {fix}"
        )
    got = policy.model_action
    if got is not None:
        if got.discrete != want.discrete:
            raise PolicyError(
                f"{label}: expected a {'discrete' if want.discrete else 'continuous'}-action policy "
                f"({where}), but the model has a {'discrete' if got.discrete else 'continuous'} "
                f"action space {_describe_action(got)}. {fix}"
            )
        if want.discrete and got.n != want.n:
            raise PolicyError(
                f"{label}: expected {want.n} discrete actions ({where}), but the model has "
                f"{got.n} actions ({_describe_action(got)}). {fix}"
            )
        if not want.discrete and tuple(got.shape) != tuple(want.shape):
            raise PolicyError(
                f"{label}: expected continuous actions of shape {tuple(want.shape)} ({where}), but "
                f"the model's actions have shape {tuple(got.shape)}. {fix}"
            )
    # the scenario decides the conventions from here on
    policy.obs_dim = want_obs
    if got is not None and not got.discrete and want.low is None and got.low is not None:
        policy.action = got
    else:
        policy.action = want
    policy._scenario = scenario
    probe = np.zeros((2, want_obs), dtype=np.float32)
    try:
        out = policy.act(probe)
    except PolicyError:
        raise
    except Exception as e:  # noqa: BLE001
        hint = ""
        first_in = getattr(policy, "first_layer_in", None)
        if first_in is not None and first_in != want_obs:
            hint = f"; its first layer takes {first_in} inputs"
        raise PolicyError(
            f"{label}: running the policy on a batch of observations of size {want_obs} "
            f"({where}) failed ({_short(e)}){hint}. The policy probably expects a different "
            f"observation size. {fix}"
        ) from e
    expect_shape = (2,) if want.discrete else (2, *tuple(want.shape))
    if out.shape != expect_shape:  # pragma: no cover - _postprocess already enforces this
        raise PolicyError(f"{label}: expected actions of shape {expect_shape} ({where}), got {out.shape}")


# ---------------------------------------------------------------------------------------------
# random MLP exporters (benchmarks and tests)
# ---------------------------------------------------------------------------------------------
def _mlp_weights(obs_dim: int, out_dim: int, hidden, seed: int):
    """[(W (out, in) float32, b (out,) float32), ...] from ``numpy.random.default_rng(seed)``.

    Hidden layers: He-normal weights (std sqrt(2 / fan_in)); output layer: std 1 / sqrt(fan_in),
    so the outputs are O(1) and vary with the observation (a random Q-network uses every
    action instead of one dominated by the biases). Biases are small, U(-0.05, 0.05).
    """
    rng = np.random.default_rng(seed)
    sizes = [int(obs_dim), *[int(h) for h in hidden], int(out_dim)]
    layers = []
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        gain = 1.0 if i == len(sizes) - 2 else 2.0
        w = (rng.standard_normal(size=(fan_out, fan_in)) * np.sqrt(gain / fan_in)).astype(np.float32)
        b = rng.uniform(-0.05, 0.05, size=(fan_out,)).astype(np.float32)
        layers.append((w, b))
    return layers


def _squash_params(out_dim, discrete, action_low, action_high):
    """(scale, offset) float32 arrays so that action = offset + scale * tanh(y); None if discrete."""
    if discrete:
        return None
    low = -1.0 if action_low is None else action_low
    high = 1.0 if action_high is None else action_high
    low = np.broadcast_to(np.asarray(low, dtype=np.float32), (out_dim,))
    high = np.broadcast_to(np.asarray(high, dtype=np.float32), (out_dim,))
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high)) and np.all(high >= low)):
        raise ValueError("action_low/action_high must be finite with high >= low")
    scale = ((high - low) / 2.0).astype(np.float32)
    offset = ((high + low) / 2.0).astype(np.float32)
    return scale, offset, low, high


def _meta_json(obs_dim, out_dim, discrete, sq) -> str:
    if discrete:
        meta = {"kind": "discrete", "obs_dim": int(obs_dim), "n": int(out_dim)}
    else:
        meta = {"kind": "continuous", "obs_dim": int(obs_dim), "shape": [int(out_dim)],
                "low": [float(v) for v in sq[2]], "high": [float(v) for v in sq[3]]}
    return json.dumps(meta)


class _MLP(torch.nn.Module):
    def __init__(self, layers, squash):
        super().__init__()
        self.net = torch.nn.Sequential()
        for i, (w, b) in enumerate(layers):
            lin = torch.nn.Linear(w.shape[1], w.shape[0])
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(w))
                lin.bias.copy_(torch.from_numpy(b))
            self.net.append(lin)
            if i < len(layers) - 1:
                self.net.append(torch.nn.ReLU())
        self.squash = squash is not None
        scale, offset = (squash[0], squash[1]) if squash is not None else (np.ones(1, np.float32), np.zeros(1, np.float32))
        self.register_buffer("scale", torch.from_numpy(np.array(scale, dtype=np.float32)))
        self.register_buffer("offset", torch.from_numpy(np.array(offset, dtype=np.float32)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.net(x)
        if self.squash:
            y = self.offset + self.scale * torch.tanh(y)
        return y


def _build_mlp(obs_dim, out_dim, hidden, seed, discrete, action_low, action_high):
    layers = _mlp_weights(obs_dim, out_dim, hidden, seed)
    sq = _squash_params(int(out_dim), discrete, action_low, action_high)
    model = _MLP(layers, sq).eval()
    return model, layers, sq


def export_mlp_torchscript(path, obs_dim: int, out_dim: int, hidden=(256, 256), seed: int = 0,
                           discrete: bool = True, action_low=None, action_high=None) -> str:
    """Write a TorchScript MLP with seeded random weights to ``path``; return the path.

    Hidden layers use ReLU. Discrete: the output is ``out_dim`` Q-values (argmax = action).
    Continuous: ``offset + scale * tanh(y)``, i.e. actions inside ``[action_low, action_high]``
    (default ``[-1, 1]``). The action space is stored as metadata, so the file also loads
    without a scenario.
    """
    model, _, sq = _build_mlp(obs_dim, out_dim, hidden, seed, discrete, action_low, action_high)
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*torch.jit")
        scripted = torch.jit.script(model)
        torch.jit.save(scripted, path, _extra_files={_META_NAME: _meta_json(obs_dim, out_dim, discrete, sq)})
    return path


def export_mlp_onnx(path, obs_dim: int, out_dim: int, hidden=(256, 256), seed: int = 0,
                    discrete: bool = True, action_low=None, action_high=None) -> str:
    """The same network as :func:`export_mlp_torchscript` (same seed → same weights) as ONNX.

    Uses ``torch.onnx.export`` when ``onnxscript`` (needed by torch's exporter) is installed;
    otherwise builds the graph (Gemm/Relu[/Tanh/Mul/Add]) with ``onnx.helper`` from the same
    weights. Input ``obs`` (batch, obs_dim) float32, output ``out`` (batch, out_dim).
    """
    import onnx

    model, layers, sq = _build_mlp(obs_dim, out_dim, hidden, seed, discrete, action_low, action_high)
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    meta = _meta_json(obs_dim, out_dim, discrete, sq)
    proto = None
    if importlib.util.find_spec("onnxscript") is not None:
        try:
            prog = torch.onnx.export(
                model, (torch.zeros(2, int(obs_dim)),), input_names=["obs"], output_names=["out"],
                dynamic_shapes=({0: torch.export.Dim("batch")},), dynamo=True, external_data=False,
            )
            proto = prog.model_proto
        except Exception:  # noqa: BLE001 - fall back to the hand-built graph
            proto = None
    if proto is None:
        proto = _onnx_graph(layers, sq, int(obs_dim), int(out_dim))
    entry = proto.metadata_props.add()
    entry.key, entry.value = _META_NAME, meta
    onnx.checker.check_model(proto)
    onnx.save(proto, path)
    return path


def _onnx_graph(layers, sq, obs_dim, out_dim):
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits = [], []
    cur = "obs"
    for i, (w, b) in enumerate(layers):
        inits += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(b, f"b{i}")]
        last = i == len(layers) - 1
        out = "out" if (last and sq is None) else f"h{i}"
        nodes.append(helper.make_node("Gemm", [cur, f"W{i}", f"b{i}"], [out], transB=1))
        cur = out
        if not last:
            nodes.append(helper.make_node("Relu", [cur], [f"r{i}"]))
            cur = f"r{i}"
    if sq is not None:
        inits += [numpy_helper.from_array(np.asarray(sq[0], np.float32), "scale"),
                  numpy_helper.from_array(np.asarray(sq[1], np.float32), "offset")]
        nodes += [helper.make_node("Tanh", [cur], ["t"]),
                  helper.make_node("Mul", ["t", "scale"], ["ts"]),
                  helper.make_node("Add", ["ts", "offset"], ["out"])]
    graph = helper.make_graph(
        nodes, "deltarl_mlp",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", obs_dim])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", out_dim])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="deltarl")
    model.ir_version = 8
    return model
