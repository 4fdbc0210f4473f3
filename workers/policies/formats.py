"""Policies from model files: d3rlpy ``.d3``, TorchScript, ONNX and Stable-Baselines3 ``.zip``.

Loading a ``.d3`` or SB3 ``.zip`` file unpickles it: a model file from someone else is code.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
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
)


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


