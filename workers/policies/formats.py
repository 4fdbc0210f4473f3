"""Policies from model files: d3rlpy ``.d3``, TorchScript, ONNX and Stable-Baselines3 ``.zip``.

Loading a ``.d3`` or SB3 ``.zip`` file unpickles it: a model file from someone else is code.
SB3 models saved with old ``gym`` spaces load without ``shimmy``: their spaces are rebuilt as
gymnasium spaces from the pickled state (:func:`old_gym_spaces`), and the training-only
schedules are replaced by constants (:func:`sb3_custom_objects`), as rl-zoo's ``enjoy.py`` does.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import importlib.util
import io
import json
import logging
import pickle
import warnings
import zipfile

import numpy as np
import torch

from envs.base import ActionSpec
from workers.policies.base import (
    _META_NAME,
    Policy,
    PolicyError,
    _gym_action_spec,
    _sha256_file,
    _short,
    _spec_from_meta,
    stackable_rows,
)

log = logging.getLogger(__name__)


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
        except Exception as exc:  # noqa: BLE001 - an algorithm without an action type: not checked
            log.debug("%s: no action type (%s: %s)", path, type(exc).__name__, exc)
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
        self.graph = self._greedy_graph(algo)
        self._rowwise_later = self.graph is not None and device == "cpu"

    def _make_rowwise(self, obs_dim: int):
        from workers.policies.rowwise import rowwise_or_none

        return rowwise_or_none(self.graph.inlined_graph, self.graph, (obs_dim,))

    @staticmethod
    def _greedy_graph(algo):
        """d3rlpy's greedy-policy graph (what ``save_policy`` exports) traced in memory, when it
        gives ``predict``'s actions bit for bit on a probe batch and on each probe row alone; else
        None and ``predict`` acts. The graph runs the same operations without d3rlpy's and
        torch.nn's per-call Python (600 -> 170 us per call for the quick start's BCQ here,
        workers/training.py). Not for algorithms that sample when they act (STOCHASTIC_PREDICT)."""
        if type(algo).__name__ in STOCHASTIC_PREDICT:
            return None
        from workers.training import traced_greedy

        graph = traced_greedy(algo)
        shape = getattr(getattr(algo, "impl", None), "observation_shape", None)
        if graph is None or not shape:
            return None
        probe = np.random.default_rng(0).normal(scale=2.0, size=(16, *shape)).astype(np.float32)
        try:
            with torch.inference_mode():
                ok = np.array_equal(graph(torch.from_numpy(probe)).numpy(), np.asarray(algo.predict(probe))) and all(
                    np.array_equal(graph(torch.from_numpy(probe[j:j + 1].copy())).numpy(),
                                   np.asarray(algo.predict(probe[j:j + 1].copy()))) for j in range(4))
        except Exception as exc:  # noqa: BLE001 - a graph that does not run is not used
            log.debug("the traced graph does not run (%s: %s): predict() is used", type(exc).__name__, exc)
            return None
        return graph if ok else None

    def _forward(self, obs):
        if self.graph is not None:
            with torch.inference_mode():
                return self.graph(torch.from_numpy(np.ascontiguousarray(obs, dtype=np.float32))).numpy()
        if type(self.algo).__name__ in STOCHASTIC_PREDICT:
            # these algorithms sample candidate actions when they act (BCQ: 100 from its VAE): seed
            # the sampling from the observations, so that acting is a function of the input (a
            # replay in another process gives the same actions) and the global stream is untouched
            with torch.random.fork_rng(devices=[]), torch.inference_mode():
                torch.manual_seed(_obs_seed(obs))
                return np.asarray(self.algo.predict(obs))
        with torch.inference_mode():
            return np.asarray(self.algo.predict(obs))

    def _forward_alone(self, obs):
        if self.graph is None:
            return super()._forward_alone(obs)
        with torch.inference_mode():  # one context for all rows; each row a fresh batch of one
            if self.rowwise is not None:  # each row as alone, many per call (workers/policies/rowwise.py)
                return self.rowwise(torch.from_numpy(np.ascontiguousarray(obs, dtype=np.float32))).numpy()
            ys = [self.graph(torch.from_numpy(obs[j:j + 1].astype(np.float32))) for j in range(obs.shape[0])]
            return torch.cat(ys).numpy() if stackable_rows(ys, torch.Tensor) else [y.numpy() for y in ys]


# d3rlpy algorithms whose predict() draws random numbers (continuous BCQ, BEAR, PLAS sample actions)
STOCHASTIC_PREDICT = frozenset({"BCQ", "BEAR", "PLAS", "PLASWithPerturbation"})


def _obs_seed(obs: np.ndarray) -> int:
    """A 63-bit seed from the bytes of a batch of observations."""
    return int.from_bytes(hashlib.blake2b(np.ascontiguousarray(obs).tobytes(), digest_size=8).digest(), "little") >> 1


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
            except ValueError:  # not JSON: a file without deltarl's metadata
                meta = None
        self.model_obs_dim, self.model_action = _spec_from_meta(meta)
        self.obs_dim = self.model_obs_dim
        self.action = self.model_action
        self.first_layer_in = None  # a hint for error messages only
        for p in module.parameters():
            if p.ndim == 2:
                self.first_layer_in = int(p.shape[1])
                break
        self._rowwise_later = device == "cpu"

    def _make_rowwise(self, obs_dim: int):
        from workers.policies.rowwise import rowwise_or_none

        return rowwise_or_none(self.module.inlined_graph, self.module, (obs_dim,), owner=self.module,
                               dtype=self.in_dtype)

    def _forward(self, obs):
        with torch.inference_mode():
            return self._output(self.module(self._tensor(obs)))

    def _forward_alone(self, obs):
        # the lean loop of act_alone: one inference-mode context for all rows (entering it per call
        # cost more than the model itself: 133 vs 44 us per Hopper row, benchmarks/act_alone.py); each
        # row is a fresh array, as an observation from a deployed environment is
        with torch.inference_mode():
            if self.rowwise is not None:  # each row as alone, many per call (workers/policies/rowwise.py)
                return self._output(self.rowwise(self._tensor(obs)))
            ys = [self.module(self._tensor(obs[j:j + 1].copy())) for j in range(obs.shape[0])]
            if stackable_rows(ys, torch.Tensor):
                return self._output(torch.cat(ys))  # one conversion for all rows (a copy: the same values)
            return [self._output(y) for y in ys]

    def _tensor(self, obs):
        x = torch.from_numpy(obs)
        if self.in_dtype != torch.float32:
            x = x.to(self.in_dtype)
        return x if self.device == "cpu" else x.to(self.device)

    @staticmethod
    def _output(y):
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
    except Exception as exc:  # noqa: BLE001 - OSError, BadZipFile or whatever a damaged zip raises
        log.debug("%s is not a readable zip (%s: %s)", path, type(exc).__name__, exc)
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
        except Exception as exc:  # noqa: BLE001 - no usable metadata: the graph's own shapes decide
            log.debug("%s: no deltarl metadata (%s: %s)", path, type(exc).__name__, exc)
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


# ---------------------------------------------------------------------------------------------
# reading the data of old SB3 / rl-zoo files without running their pickles' code
# ---------------------------------------------------------------------------------------------
class Inert:
    """Stand-in for a pickled space, VecNormalize or RunningMeanStd: keeps the state, runs nothing."""

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) == 2:  # (dict state, slot state)
            merged = {}
            for part in state:
                if isinstance(part, dict):
                    merged.update(part)
            state = merged
        if isinstance(state, dict):
            self.__dict__.update(state)


def _inert_factory(*args, **kwargs):
    return Inert()


_INERT_CLASSES = {
    ("stable_baselines3.common.vec_env.vec_normalize", "VecNormalize"),
    ("stable_baselines3.common.running_mean_std", "RunningMeanStd"),
}
_SPACE_MODULES = ("gym.spaces.", "gymnasium.spaces.")
_NUMPY = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
}
_RNG = {"__randomstate_ctor", "__bit_generator_ctor", "__generator_ctor"}
_BUILTINS = {("collections", "OrderedDict"), ("collections", "deque"), ("builtins", "set"),
             ("builtins", "frozenset"), ("builtins", "tuple"), ("builtins", "list"), ("builtins", "dict"),
             ("builtins", "object"), ("copyreg", "_reconstructor")}


class InertUnpickler(pickle.Unpickler):
    """Unpickles spaces (gym or gymnasium), VecNormalize and RunningMeanStd as :class:`Inert`
    stand-ins, numpy arrays as arrays, and refuses every other global."""

    def find_class(self, module, name):
        if (module, name) in _INERT_CLASSES or module.startswith(_SPACE_MODULES):
            return Inert
        if module == "numpy.random._pickle" and name in _RNG:
            return _inert_factory
        if (module, name) in _NUMPY:
            if module.startswith("numpy.core") or module.startswith("numpy._core"):
                for mod in ("numpy._core.multiarray", "numpy.core.multiarray"):
                    try:
                        return getattr(importlib.import_module(mod), name)
                    except (ImportError, AttributeError):
                        continue
            return getattr(np, name)
        if (module, name) in _BUILTINS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"unexpected object {module}.{name}")


def old_gym_spaces(data: dict) -> dict:
    """gymnasium spaces for the old ``gym`` spaces of an SB3 zip's ``data`` (for ``custom_objects``).

    Models saved before SB3 2.0 pickled ``gym.spaces`` objects, which SB3 only converts when
    ``shimmy`` is installed. Their state (shape, dtype, bounds, n) is read with
    :class:`InertUnpickler` and rebuilt as the gymnasium space of the same class, as shimmy's
    conversion does, for Box, Discrete, MultiDiscrete and MultiBinary; other spaces are left to SB3.
    """
    import gymnasium

    out = {}
    for key in ("observation_space", "action_space"):
        item = data.get(key)
        if not isinstance(item, dict) or ":serialized:" not in item:
            continue
        kind = str(item.get(":type:", ""))
        if "gym.spaces" not in kind or "gymnasium" in kind:
            continue
        try:
            obj = InertUnpickler(io.BytesIO(base64.b64decode(item[":serialized:"]))).load()
            st = obj.__dict__ if isinstance(obj, Inert) else {}
            name = kind.rsplit(".", 1)[-1].rstrip("'>")
            if name == "Box":
                low, high = np.asarray(st["low"]), np.asarray(st["high"])
                dtype = np.dtype(st.get("dtype", low.dtype))
                shape = tuple(int(d) for d in (st.get("_shape") or st.get("shape") or low.shape))
                out[key] = gymnasium.spaces.Box(low=low.astype(dtype), high=high.astype(dtype), shape=shape,
                                                dtype=dtype)
            elif name == "Discrete":
                out[key] = gymnasium.spaces.Discrete(int(st["n"]), start=int(st.get("start", 0)))
            elif name == "MultiDiscrete":
                out[key] = gymnasium.spaces.MultiDiscrete(np.asarray(st["nvec"]))
            elif name == "MultiBinary":
                n = st["n"]
                out[key] = gymnasium.spaces.MultiBinary(int(n) if np.ndim(n) == 0 else list(np.asarray(n)))
        except Exception as exc:  # noqa: BLE001 - leave this space to SB3 (and its shimmy path)
            log.debug("space %s not rebuilt (%s: %s): left to SB3", key, type(exc).__name__, exc)
            continue
    return out


_SB3_ALGOS = ("DQN", "PPO", "A2C", "SAC", "TD3", "DDPG")


class _Constant:
    """A picklable constant schedule (``lambda _: 0.0`` does not pickle)."""

    def __init__(self, value: float):
        self.value = value

    def __call__(self, _progress) -> float:
        return self.value


def sb3_custom_objects() -> dict:
    """``custom_objects`` for ``load`` as rl-zoo's ``enjoy.py`` passes them: the training-only
    schedules (learning rate, clip range, DQN/QR-DQN exploration, ARS noise) as constants, so
    pickles of old Python functions ("code expected at least 16 arguments") are never needed."""
    const = _Constant(0.0)
    return {
        "learning_rate": 0.0,
        "lr_schedule": const,
        "clip_range": const,
        "clip_range_vf": None,
        "exploration_schedule": const,
        "delta_std_schedule": const,
    }


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
        custom = {**sb3_custom_objects(), **old_gym_spaces(data)}
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
        self._rowwise_later = device == "cpu"

    def _make_rowwise(self, obs_dim: int):
        return sb3_rowwise(self.model, obs_dim)

    def _forward(self, obs):
        with torch.inference_mode():
            actions, _ = self.model.predict(obs, deterministic=True)
        return np.asarray(actions)

    def _forward_alone(self, obs):
        return sb3_predict_rows(self.model, obs, self.rowwise)


def sb3_rowwise(model, obs_dim: int):
    """The SB3 policy's greedy action (``policy._predict``) traced in memory and accepted by
    :func:`workers.policies.rowwise.rowwise_or_none` against ``_predict`` on each row alone; or
    None (the per-row loop). The trace is used only for ``act_alone``; ``act`` is SB3's predict."""
    import warnings

    from workers.policies.rowwise import rowwise_or_none

    policy = model.policy
    policy.set_training_mode(False)

    class _Predict(torch.nn.Module):
        def __init__(self, p):
            super().__init__()
            self.p = p

        def forward(self, x):
            return self.p._predict(x, deterministic=True)

    def alone(x):
        return policy._predict(x, deterministic=True)

    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(_Predict(policy), torch.zeros(1, obs_dim), check_trace=False)
    except Exception as exc:  # noqa: BLE001 - a policy that does not trace keeps the per-row loop
        log.debug("SB3 policy not traced (%s: %s): the per-row loop", type(exc).__name__, exc)
        return None
    return rowwise_or_none(traced.inlined_graph, alone, (obs_dim,), owner=traced)


def sb3_predict_rows(model, obs: np.ndarray, rowwise=None) -> np.ndarray:
    """What ``model.predict(obs[j:j + 1], deterministic=True)`` returns for every row ``j``,
    stacked: each row goes through SB3's own ``obs_to_tensor`` and the policy's ``_predict`` as a
    batch of one (the call a deployed agent makes), while what ``predict`` does around it per call
    is done once: the switch to eval mode (a walk over every module) and the output conversion
    (reshape, then ``unscale_action`` or the clip to the action bounds: element-wise, so once for
    the stacked rows gives what each row gives; tests/test_policies.py checks it bit for bit).
    ``rowwise`` (from :func:`sb3_rowwise`): the rows go through it many at a time instead, each
    still computed as alone."""
    from gymnasium import spaces

    policy = model.policy
    policy.set_training_mode(False)
    with torch.inference_mode():
        if rowwise is not None:
            tensor, _ = policy.obs_to_tensor(obs)  # per row the same conversion (a copy, a reshape)
            out = rowwise(tensor)
        else:
            ys = []
            for j in range(obs.shape[0]):
                tensor, _ = policy.obs_to_tensor(obs[j:j + 1].copy())
                ys.append(policy._predict(tensor, deterministic=True))
            out = torch.cat(ys)
        actions = out.cpu().numpy().reshape((-1, *policy.action_space.shape))
    if isinstance(policy.action_space, spaces.Box):
        if policy.squash_output:
            actions = policy.unscale_action(actions)
        else:
            actions = np.clip(actions, policy.action_space.low, policy.action_space.high)
    return actions


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


