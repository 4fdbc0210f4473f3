"""rl-baselines3-zoo agents as they are published: ``rlzoo:PATH``.

rl-baselines3-zoo (and its trained-agents repository, and the same files on model hubs) lays an
agent out as::

    <algo>/<env>_1/<env>.zip                 the Stable-Baselines3 model
    <algo>/<env>_1/<env>/config.yml          the hyperparameters (``normalize``, ``env_wrapper``...)
    <algo>/<env>_1/<env>/args.yml            the command line it was trained with (``algo``, ``env``, ``seed``)
    <algo>/<env>_1/<env>/vecnormalize.pkl    observation statistics, when ``normalize`` is set

``rlzoo:PATH`` takes the agent folder (``<algo>/<env>_1``), its ``.zip`` (e.g. ``best_model.zip``
instead of ``<env>.zip``), or a model-hub download (``config.yml`` and ``vec_normalize.pkl``
beside the ``.zip``). A bare ``.zip`` path is loaded this way too when its folder has
``<env>/config.yml``, and so is a bare agent folder. The agent is loaded as the zoo's own
``enjoy.py`` loads it:

* the algorithm comes from ``args.yml`` (``algo``), else from the folder name (``sac/...``),
  else from the model file. sb3-contrib's TQC, QR-DQN, TRPO, ARS and CrossQ load when
  ``sb3_contrib`` is importable (the ``rlzoo`` extra, which ``make install`` installs).
  Recurrent (``ppo_lstm``) and action-masked (``ppo_mask``) agents need per-episode state that
  deltarl's stateless ``act`` does not pass, and are refused.
* ``custom_objects`` replace the pickled schedules (learning rate, clip range, exploration...)
  with constants: they only matter for training, and pickles of old Python functions do not load
  on current Pythons ("code expected at least 16 arguments").
* old ``gym`` spaces (every agent saved before SB3 2.0) are rebuilt as gymnasium spaces of the
  same class from their pickled state (shape, dtype, bounds; ``formats.old_gym_spaces``, which
  the plain ``.zip`` loader uses too). Not shimmy, and not spaces rebuilt from the scenario. Why:
  the spaces still come from the file, so the shape and bound checks against the scenario compare
  two independent sources (spaces taken from the scenario would pass them by construction, and an
  agent trained with other action bounds would be rescaled silently); Box and Discrete (what
  deltarl's scenarios have) take a few lines, not a dependency; and with shimmy installed d3rlpy
  logs "Register Shimmy environments." in every process that imports it, the kind of noise the
  gym banner fix removes (``workers/__init__.py``).
* with ``normalize`` in ``config.yml`` (``true`` or a dict string with ``norm_obs``) observations
  go through ``vecnormalize.pkl`` as ``VecNormalize`` does at test time:
  ``clip((obs - mean) / sqrt(var + epsilon), -clip_obs, clip_obs)`` with the file's mean, var,
  epsilon and clip (reward normalisation does not affect acting and is ignored). A ``normalize``
  without the file, or a file whose statistics do not have the model's/scenario's observation
  size, is an error, never silently skipped.
* ``env_wrapper`` and ``frame_stack`` in ``config.yml`` change what the agent observes; deltarl
  feeds the scenario's observations as they are, so such agents are refused with a message.

Acting is batched and deterministic (``model.predict(obs, deterministic=True)``); the model's
spaces are checked against the scenario by ``load_policy`` as for every format.

Security: loading an agent unpickles its ``.zip`` (cloudpickled objects inside; a model file
from someone else is code). ``config.yml``/``args.yml`` are read with a safe YAML loader that
only knows the zoo's ``OrderedDict`` tag, and ``vecnormalize.pkl`` with an unpickler that accepts
only the classes such a file holds (VecNormalize, RunningMeanStd, spaces, numpy arrays) and
builds inert stand-ins for them.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import io
import json
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import yaml

from workers.policies.base import (
    Policy,
    PolicyError,
    _gym_action_spec,
    _scenario_label,
    _sha256_file,
    _short,
)
from workers.policies.formats import Inert, InertUnpickler, _sb3_candidates, old_gym_spaces, sb3_custom_objects

# rl_zoo3's ALGOS (utils.py): name in args.yml / the folder -> (package, class)
SB3_ALGOS = {"a2c": "A2C", "ddpg": "DDPG", "dqn": "DQN", "ppo": "PPO", "sac": "SAC", "td3": "TD3"}
CONTRIB_ALGOS = {"ars": "ARS", "qrdqn": "QRDQN", "tqc": "TQC", "trpo": "TRPO", "crossq": "CrossQ"}
STATEFUL_ALGOS = {"ppo_lstm": "RecurrentPPO", "ppo_mask": "MaskablePPO", "her": "HER"}
STATS_FILES = ("vecnormalize.pkl", "vec_normalize.pkl")  # the zoo's name, the model hubs' name


# ---------------------------------------------------------------------------------------------
# the folder
# ---------------------------------------------------------------------------------------------
@dataclass
class ZooAgent:
    """What an rl-zoo agent folder holds (paths resolved, YAML read)."""

    folder: Path
    model: Path
    stats_dir: Path | None
    config: dict = field(default_factory=dict)
    args: dict = field(default_factory=dict)

    @property
    def env(self) -> str:
        return str(self.args.get("env") or (self.stats_dir.name if self.stats_dir and self.stats_dir != self.folder
                                            else self.model.stem))

    @property
    def stats_file(self) -> Path | None:
        if self.stats_dir is None:
            return None
        for name in STATS_FILES:
            if (self.stats_dir / name).is_file():
                return self.stats_dir / name
        return None


def stats_dir_for(zip_path: str | os.PathLike) -> Path | None:
    """The ``<env>/`` folder with ``config.yml`` beside a ``.zip`` (rl-zoo's layout), or None.

    ``<stem>/config.yml`` first (``Walker2d-v3.zip`` -> ``Walker2d-v3/``), else the only
    subfolder that has a ``config.yml`` (``best_model.zip``, checkpoints)."""
    p = Path(zip_path)
    folder = p.parent
    if (folder / p.stem / "config.yml").is_file():
        return folder / p.stem
    try:
        subs = [d for d in folder.iterdir() if d.is_dir() and (d / "config.yml").is_file()]
    except OSError:
        return None
    return subs[0] if len(subs) == 1 else None


def is_zoo_folder(path: str | os.PathLike) -> bool:
    """A folder laid out by rl-zoo: a ``.zip`` with ``<env>/config.yml`` beside it."""
    p = Path(path)
    if not p.is_dir():
        return False
    return any(stats_dir_for(z) is not None for z in sorted(p.glob("*.zip")))


def find_agent(path: str | os.PathLike) -> ZooAgent:
    """Resolve ``rlzoo:PATH`` (an agent folder or a ``.zip`` in one) to its files."""
    p = Path(os.path.abspath(os.path.expanduser(os.fspath(path))))
    if not p.exists():
        raise PolicyError(f"rl-zoo agent not found: {p}; give the agent folder (<algo>/<env>_1) or its .zip")
    if p.is_file():
        if p.suffix.lower() != ".zip":
            raise PolicyError(f"{p}: an rl-zoo agent is a folder (<algo>/<env>_1) or a .zip model in one; "
                              f"got a {p.suffix or 'extension-less'} file")
        model = p
        folder = p.parent
        stats = stats_dir_for(p)
    else:
        folder = p
        zips = sorted(folder.glob("*.zip"))
        subs = sorted(d for d in folder.iterdir() if d.is_dir() and (d / "config.yml").is_file())
        if not zips:
            raise PolicyError(
                f"{folder}: no model in this rl-zoo agent folder (no .zip file); expected "
                f"<env>.zip beside <env>/config.yml (rl-baselines3-zoo's layout <algo>/<env>_1/)"
            )
        named = [z for z in zips if (folder / z.stem / "config.yml").is_file()]
        if len(named) == 1:
            model = named[0]
        elif len(zips) == 1:
            model = zips[0]
        else:
            raise PolicyError(
                f"{folder}: several models and none named after the environment "
                f"({', '.join(z.name for z in zips)}); name one, e.g. rlzoo:{zips[0]}"
            )
        stats = stats_dir_for(model) if subs else None
    if stats is None and (folder / "config.yml").is_file():
        stats = folder  # a model-hub download: config.yml and vec_normalize.pkl beside the zip
    config = _read_yaml(stats / "config.yml") if stats is not None else {}
    args = _read_yaml(stats / "args.yml") if stats is not None and (stats / "args.yml").is_file() else {}
    return ZooAgent(folder=folder, model=model, stats_dir=stats, config=config, args=args)


class _ZooYamlLoader(yaml.SafeLoader):
    """A safe loader that also reads the two Python tags rl-zoo's YAML files hold, as data."""


def _ordered_dict(loader, node):
    # !!python/object/apply:collections.OrderedDict [[[key, value], ...]]
    if isinstance(node, yaml.MappingNode):
        args = loader.construct_mapping(node, deep=True).get("args", [])
    else:
        args = loader.construct_sequence(node, deep=True)
    pairs = args[0] if args else []
    return {k: v for k, v in pairs}


_ZooYamlLoader.add_constructor("tag:yaml.org,2002:python/object/apply:collections.OrderedDict", _ordered_dict)
_ZooYamlLoader.add_constructor("tag:yaml.org,2002:python/tuple",
                               lambda loader, node: tuple(loader.construct_sequence(node, deep=True)))


def _read_yaml(path: Path) -> dict:
    try:
        data = yaml.load(path.read_text(), Loader=_ZooYamlLoader)  # noqa: S506 - a SafeLoader subclass
    except (OSError, UnicodeDecodeError, yaml.YAMLError, TypeError, ValueError) as e:
        raise PolicyError(f"could not read {path} ({_short(e)}); rl-zoo writes it as a YAML mapping "
                          "(plain or !!python/object/apply:collections.OrderedDict)") from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise PolicyError(f"{path}: expected a YAML mapping of hyperparameters, got {type(data).__name__}")
    return data


# ---------------------------------------------------------------------------------------------
# the algorithm
# ---------------------------------------------------------------------------------------------
def read_data(model: Path) -> dict:
    """The JSON ``data`` entry of an SB3 zip (PolicyError when it is not one)."""
    try:
        with zipfile.ZipFile(model) as z:
            data = json.loads(z.read("data"))
    except Exception as e:  # noqa: BLE001
        raise PolicyError(f"could not read {model} as a Stable-Baselines3 model ({_short(e)}); the file is "
                          "corrupt or not an SB3 archive (a zip with a 'data' entry)") from e
    if not isinstance(data, dict):
        raise PolicyError(f"{model}: the SB3 archive's data is not a JSON object")
    return data


def algo_name(agent: ZooAgent, data: dict) -> str:
    """``args.yml``'s ``algo``, else the folder above the agent folder (``sac/Walker2d-v3_1``),
    else the package of the saved policy class (``data``: the zip's JSON)."""
    name = agent.args.get("algo")
    if name:
        return str(name).strip().lower()
    parent = agent.folder.parent.name.lower()
    if parent in SB3_ALGOS or parent in CONTRIB_ALGOS or parent in STATEFUL_ALGOS:
        return parent
    first = _sb3_candidates(data)[0]
    return first.split(":", 1)[1].lower() if ":" in first else first.lower()


def algo_class(name: str, where: str):
    """The SB3 / sb3-contrib class for an rl-zoo algorithm name (PolicyError when unknown)."""
    key = name.strip().lower()
    if key in SB3_ALGOS:
        import stable_baselines3

        return getattr(stable_baselines3, SB3_ALGOS[key])
    if key in CONTRIB_ALGOS:
        try:
            contrib = importlib.import_module("sb3_contrib")
        except ImportError as e:
            raise PolicyError(
                f"{where}: the agent is {CONTRIB_ALGOS[key]}, an sb3-contrib algorithm, and sb3-contrib is "
                "not installed; install it with `pip install 'deltarl[rlzoo]'` (or `pip install sb3-contrib`)"
            ) from e
        cls = getattr(contrib, CONTRIB_ALGOS[key], None)
        if cls is None:
            raise PolicyError(f"{where}: this sb3-contrib ({getattr(contrib, '__version__', '?')}) has no "
                              f"{CONTRIB_ALGOS[key]}; upgrade it (pip install -U sb3-contrib)")
        return cls
    if key in STATEFUL_ALGOS:
        raise PolicyError(
            f"{where}: the agent is {STATEFUL_ALGOS[key]} ({key}), which needs per-episode state (LSTM "
            "states, action masks or goals) that deltarl's stateless batched act() does not pass; "
            "it cannot be tested as it is"
        )
    known = ", ".join(sorted(SB3_ALGOS) + sorted(CONTRIB_ALGOS))
    raise PolicyError(f"{where}: unknown algorithm {name!r}; rl-zoo agents deltarl loads: {known}")


# ---------------------------------------------------------------------------------------------
# the observation normaliser (vecnormalize.pkl), read without running its pickle's code
# ---------------------------------------------------------------------------------------------
@dataclass
class ObsNormalizer:
    """``VecNormalize.normalize_obs`` at test time."""

    mean: np.ndarray
    var: np.ndarray
    epsilon: float
    clip_obs: float
    path: str = ""
    sha256: str = ""

    @property
    def size(self) -> int:
        return int(self.mean.shape[0])

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        x = (obs.astype(np.float64) - self.mean) / np.sqrt(self.var + self.epsilon)
        return np.clip(x, -self.clip_obs, self.clip_obs).astype(np.float32)


def read_normalizer(path: str | os.PathLike) -> ObsNormalizer | None:
    """The observation statistics of a ``vecnormalize.pkl``; None when it does not normalise
    observations (``norm_obs`` false)."""
    path = str(path)
    raw = Path(path).read_bytes()
    try:
        vn = InertUnpickler(io.BytesIO(raw)).load()
    except Exception as e:  # noqa: BLE001
        raise PolicyError(
            f"could not read {path} as rl-zoo's saved VecNormalize ({_short(e)}); it should be the "
            "file VecNormalize.save() writes"
        ) from e
    state = getattr(vn, "__dict__", {}) if isinstance(vn, Inert) else {}
    if not state.get("norm_obs", True):
        return None
    rms = state.get("obs_rms")
    if isinstance(rms, dict):
        raise PolicyError(f"{path}: per-key statistics of a Dict observation space; deltarl's scenarios "
                          "have flat observations")
    mean = getattr(rms, "mean", None)
    var = getattr(rms, "var", None)
    if not isinstance(mean, np.ndarray) or not isinstance(var, np.ndarray):
        raise PolicyError(f"{path}: no observation statistics (obs_rms.mean / obs_rms.var) in the file")
    if mean.ndim != 1 or var.shape != mean.shape:
        raise PolicyError(f"{path}: observation statistics of shape {mean.shape} / {var.shape}; "
                          "expected two vectors of the observation size")
    try:
        epsilon = float(state.get("epsilon", 1e-8))
        clip = float(state.get("clip_obs", 10.0))
    except (TypeError, ValueError) as e:
        raise PolicyError(f"{path}: epsilon / clip_obs are not numbers ({_short(e)})") from e
    return ObsNormalizer(mean=mean.astype(np.float64), var=var.astype(np.float64), epsilon=epsilon,
                         clip_obs=clip, path=path, sha256=hashlib.sha256(raw).hexdigest())


def _normalize_setting(config: dict) -> bool:
    """Whether ``config.yml``'s ``normalize`` asks for observation normalisation."""
    value = config.get("normalize", False)
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            lowered = value.strip().lower()
            if lowered in ("true", "false"):
                return lowered == "true"
            # e.g. "dict(norm_obs=True, norm_reward=False)": the saved file's norm_obs decides
            return "norm_obs=false" not in lowered.replace(" ", "")
    if isinstance(value, dict):
        return bool(value.get("norm_obs", True))
    return bool(value)


# ---------------------------------------------------------------------------------------------
# the policy
# ---------------------------------------------------------------------------------------------
class RLZooPolicy(Policy):
    """An rl-baselines3-zoo agent (module docstring). ``algo``, ``env`` (what it was trained on),
    ``normalizer`` (an :class:`ObsNormalizer` or None) describe it; ``sha256`` hashes the model
    file, and the normaliser's file with it when one is applied."""

    format = "rlzoo"

    def __init__(self, uri: str, path: str, device: str, scenario=None):
        try:
            import stable_baselines3 as sb3
        except ImportError as e:
            raise PolicyError(
                f"{path}: rl-zoo agents need stable-baselines3, which is not installed; install it "
                "with `pip install 'deltarl[rlzoo]'`"
            ) from e
        agent = find_agent(path)
        where = str(agent.folder)
        for key in ("env_wrapper", "frame_stack"):
            if agent.config.get(key):
                raise PolicyError(
                    f"{where}: config.yml sets {key}: {agent.config[key]!r}, so the agent was trained on "
                    "wrapped observations; deltarl feeds the scenario's observations as they are, so it "
                    "cannot test this agent faithfully"
                )
        data = read_data(agent.model)
        cls = algo_class(algo_name(agent, data), where)
        try:
            custom = {**sb3_custom_objects(), **old_gym_spaces(data)}
            model = cls.load(str(agent.model), device=device, custom_objects=custom)
        except Exception as e:  # noqa: BLE001
            raise PolicyError(
                f"could not load {agent.model} as an rl-zoo {cls.__name__} agent ({_short(e)}); "
                f"stable-baselines3 {sb3.__version__}"
            ) from e
        normalizer = None
        if _normalize_setting(agent.config):
            stats = agent.stats_file
            if stats is None:
                raise PolicyError(
                    f"{where}: config.yml sets normalize but there is no vecnormalize.pkl in "
                    f"{agent.stats_dir}; without the saved statistics the agent sees unnormalised "
                    "observations (and fails). Copy the file from where the agent came from"
                )
            normalizer = read_normalizer(stats)
        super().__init__(uri, path=str(agent.model), device=device, sha256=_sha256_file(str(agent.model)))
        if normalizer is not None:
            self.sha256 = hashlib.sha256(f"{self.sha256}+{normalizer.sha256}".encode()).hexdigest()
        self.model = model
        self.agent = agent
        self.algo = type(model).__name__
        self.env = agent.env
        self.normalizer = normalizer
        obs_shape = tuple(getattr(model.observation_space, "shape", None) or ())
        if len(obs_shape) != 1:
            raise PolicyError(f"{where}: the agent observes {model.observation_space}; deltarl's scenarios "
                              "have flat observation vectors")
        self.model_obs_dim = int(obs_shape[0])
        self.model_action = _gym_action_spec(model.action_space)
        if normalizer is not None and normalizer.size != self.model_obs_dim:
            raise PolicyError(
                f"{normalizer.path}: the normaliser's statistics are for observations of size "
                f"{normalizer.size}, but the model takes observations of size {self.model_obs_dim}; "
                "the file belongs to another agent"
            )
        if normalizer is not None and scenario is not None and normalizer.size != int(scenario.obs_dim):
            raise PolicyError(
                f"{normalizer.path}: the normaliser's statistics are for observations of size "
                f"{normalizer.size}, but scenario {_scenario_label(scenario)} has observations of size "
                f"{scenario.obs_dim}. Fix: use an agent trained for this scenario, or choose the "
                "scenario it was trained for"
            )
        self.obs_dim = self.model_obs_dim
        self.action = self.model_action
        self._rowwise_later = device == "cpu"

    def _make_rowwise(self, obs_dim: int):
        from workers.policies.formats import sb3_rowwise

        return sb3_rowwise(self.model, obs_dim)

    def info(self) -> dict:
        out = super().info()
        out["rlzoo"] = {
            "algo": self.algo,
            "trained_on": self.env,
            "model_sha256": _sha256_file(self.path) if self.path else "",
            "normalizer": self.normalizer.path if self.normalizer else None,
            "normalizer_sha256": self.normalizer.sha256 if self.normalizer else None,
        }
        return out

    def _forward(self, obs):
        if self.normalizer is not None:
            obs = self.normalizer(obs)
        with torch.inference_mode():
            actions, _ = self.model.predict(obs, deterministic=True)
        return np.asarray(actions)

    def _forward_alone(self, obs):
        # the normaliser is element-wise (the same values for a row alone or in the batch)
        from workers.policies.formats import sb3_predict_rows

        return sb3_predict_rows(self.model, self.normalizer(obs) if self.normalizer is not None else obs,
                                self.rowwise)
