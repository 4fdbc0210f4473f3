"""Challenger training (Delta phase 2): offline RL on the AUT's own test record D.

    cfg = challenger_config("CartPole-v1", "bcq")             # the scenario's preset
    data = RunStore.open("runs/cartpole-curefuzz").to_mdp_dataset(phase=SAFETY_PHASES)
    train_challenger(cfg, data, "runs/cartpole-curefuzz/challengers/bcq")       # in this process
    # as a Ray Train job: orchestrator.campaign.train_jobs.train_challenger_job

BC, BCQ and CQL (d3rlpy's discrete variants for discrete actions, the continuous ones for
MuJoCo). The loop is d3rlpy's ``fit`` written out (scalers fitted on D, models built from D,
then ``update`` on sampled transition batches) so that it checkpoints every epoch
(``checkpoints/epoch-NNNNN/{model.d3,state.json}``, whole or absent), resumes, reports
metrics to a callback (MLflow, Ray Train) and writes nothing into the working directory. The
shipped model is the last one: an offline learner does not get to pick its epoch by playing
the environment. The per-epoch engine evaluation (``eval_episodes``, 0 turns it off) is there
to watch training, not to select.

Presets are data: ``experiments/challengers/<family>.yaml`` lists, per scenario it covers, the
settings of each algorithm and where each value comes from (Scope-RL for classic control,
D4RL/d3rlpy reproductions for MuJoCo, as the Delta paper states).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from workers.datasets import TransitionSampler
from workers.resources import resource
from workers.training import (
    TrainingError,
    _write_checkpoint,
    d3rlpy_config,
    evaluate_algo,
    load_checkpoint,
    quiet_d3rlpy,
)
from workers.yamlfile import load_yaml

ALGOS = ("bc", "bcq", "cql")
# (algo, discrete) -> d3rlpy config class name
_CONFIG_CLASSES = {
    ("bc", True): "DiscreteBCConfig", ("bc", False): "BCConfig",
    ("bcq", True): "DiscreteBCQConfig", ("bcq", False): "BCQConfig",
    ("cql", True): "DiscreteCQLConfig", ("cql", False): "CQLConfig",
}
PRESET_DIR = resource("challengers")


@dataclass
class ChallengerConfig:
    """Everything that defines a challenger training run (saved with every checkpoint)."""

    scenario: str
    algo: str  # bc | bcq | cql
    steps: int = 10_000  # gradient steps
    steps_per_epoch: int = 1_000
    seed: int = 0
    hyperparameters: dict = field(default_factory=dict)  # d3rlpy *Config settings
    eval_episodes: int = 10  # per-epoch engine evaluation, for watching only (0 = none)
    preset: str = ""  # the preset file these settings came from
    device: str | None = None  # None: cuda when available
    # torch threads while training: fixed, so that training in-process and in a Ray Train worker
    # sum floats in the same order (the same seed then gives the same weights on one machine)
    torch_threads: int = 2
    # the no-grad forward passes (BCQ's target over batch x sampled actions, greedy actions) through
    # oneDNN's fused linear+ReLU instead of torch's addmm + relu (:func:`fuse_no_grad_forward`): the
    # same mathematics, not the same bits (another float32 summation order); off: d3rlpy as it is
    onednn_no_grad: bool = False

    def config_class(self, discrete: bool):
        import d3rlpy

        return getattr(d3rlpy.algos, _CONFIG_CLASSES[(self.algo, discrete)])

    def validate(self):
        from envs import get_scenario

        if self.algo not in ALGOS:
            raise TrainingError(f"unknown challenger algorithm {self.algo!r}; choose one of {', '.join(ALGOS)}")
        for name in ("steps", "steps_per_epoch"):
            if int(getattr(self, name)) < 1:
                raise TrainingError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.eval_episodes < 0:
            raise TrainingError(f"eval_episodes must be >= 0, got {self.eval_episodes}")
        scenario = get_scenario(self.scenario)
        d3rlpy_config(self.config_class(scenario.action.discrete), self.hyperparameters,
                      f"{self.preset or 'challenger'} {self.algo}")
        return scenario


def list_presets(defaults_only: bool = False) -> dict[str, list[str]]:
    """Preset file stem -> the scenarios it covers. ``defaults_only``: leave out the presets marked
    ``default: false`` (variants such as ``mujoco-local``, used only when named)."""
    out = {}
    for p in sorted(PRESET_DIR.glob("*.yaml")):
        data = load_yaml(p, "challenger preset", TrainingError, allow_empty=True)
        if defaults_only and data.get("default", True) is False:
            continue
        out[p.stem] = list(data.get("scenarios", {}))
    return out


def challenger_config(scenario: str, algo: str, preset: str | os.PathLike | None = None, **overrides) -> ChallengerConfig:
    """The preset settings of ``algo`` for ``scenario``. ``preset`` is a preset name
    (``classic-control``, ``mujoco``), a YAML file, or None for the preset covering ``scenario``;
    ``overrides`` (steps, seed, …) replace preset values when not None."""
    if algo not in ALGOS:
        raise TrainingError(f"unknown challenger algorithm {algo!r}; choose one of {', '.join(ALGOS)}")
    if preset is None:
        owners = [name for name, scens in list_presets(defaults_only=True).items() if scenario in scens]
        if not owners:
            raise TrainingError(f"no challenger preset covers {scenario}; presets: "
                                f"{json.dumps(list_presets())}; pass --preset FILE with your own settings")
        path = PRESET_DIR / f"{owners[0]}.yaml"
    else:
        path = Path(preset)
        if not path.is_file():
            path = PRESET_DIR / f"{preset}.yaml"
        if not path.is_file():
            raise TrainingError(f"challenger preset {preset!r} not found: give a YAML file or one of "
                                f"{', '.join(list_presets())}")
    data = load_yaml(path, "challenger preset", TrainingError, allow_empty=True)
    scens = data.get("scenarios") or {}
    if scenario not in scens:
        raise TrainingError(f"challenger preset {path} has no settings for {scenario} "
                            f"(it covers {', '.join(scens) or 'nothing'})")
    entry = (scens[scenario] or {}).get(algo)
    if entry is None:
        raise TrainingError(f"challenger preset {path} has no {algo} settings for {scenario}")
    settings = {**(data.get("defaults") or {}), **{k: v for k, v in entry.items() if k != "source"}}
    settings.update({k: v for k, v in overrides.items() if v is not None})
    unknown = set(settings) - set(ChallengerConfig.__dataclass_fields__) - {"scenario", "algo", "preset"}
    if unknown:
        raise TrainingError(f"challenger preset {path} ({scenario} {algo}): unknown settings {sorted(unknown)}")
    settings.update(scenario=scenario, algo=algo, preset=str(path))
    return ChallengerConfig(**settings)


def _check_dataset(dataset, scenario) -> None:
    obs_dim = int(dataset.sample_transition().observation_signature.shape[0][0])
    if obs_dim != scenario.obs_dim:
        raise TrainingError(f"dataset observations have {obs_dim} dimensions, {scenario.name} has {scenario.obs_dim}")
    discrete = dataset.dataset_info.action_space.name == "DISCRETE"
    if discrete != scenario.action.discrete:
        raise TrainingError(f"dataset actions are {'discrete' if discrete else 'continuous'}, "
                            f"{scenario.name}'s are not")


def train_challenger(
    cfg: ChallengerConfig,
    dataset,
    out_dir: str | os.PathLike,
    *,
    resume: bool = False,
    report: Callable[[dict, Path], None] | None = None,
    progress: bool = False,
) -> dict:
    """Train a challenger on ``dataset`` (a d3rlpy ``MDPDataset``); returns the final state."""
    import torch

    scenario = cfg.validate()
    _check_dataset(dataset, scenario)
    quiet_d3rlpy()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    device = cfg.device or ("cuda:0" if torch.cuda.is_available() else "cpu:0")
    threads_before = torch.get_num_threads()
    torch.set_num_threads(int(cfg.torch_threads))
    try:
        return _train(cfg, dataset, out, scenario, device, resume=resume, report=report, progress=progress)
    finally:
        torch.set_num_threads(threads_before)


def fit_standard_observation_scaler(algo, dataset) -> bool:
    """Fit ``algo``'s ``StandardObservationScaler`` on ``dataset`` as d3rlpy's
    ``fit_with_transition_picker`` does with the ``BasicTransitionPicker``, bit for bit, without
    its Python loop over every transition (twice; a fixed cost of every training that grows with D,
    docs/performance.md): the observations of each episode's transitions, in the same
    order, summed as d3rlpy sums them, one after the other from a float64 zero (``np.cumsum`` is
    sequential by definition; tests/test_challenger.py compares both fits bit for bit). Returns
    False, leaving the scaler to d3rlpy, for any other scaler, picker or observation type."""
    from d3rlpy.dataset import BasicTransitionPicker
    from d3rlpy.preprocessing import StandardObservationScaler

    scaler = algo.observation_scaler
    if type(scaler) is not StandardObservationScaler or scaler.built \
            or type(dataset.transition_picker) is not BasicTransitionPicker:
        return False
    episodes = dataset.episodes
    if not episodes or not all(isinstance(ep.observations, np.ndarray) and ep.observations.ndim == 2
                               for ep in episodes):
        return False
    dim = episodes[0].observations.shape[1]
    x = np.concatenate([np.zeros((1, dim))] + [ep.observations[:ep.transition_count] for ep in episodes])
    x = x.astype(np.float64)
    count = x.shape[0] - 1
    mean = np.cumsum(x, axis=0)[-1] / count
    sq = np.zeros_like(x)
    sq[1:] = (x[1:] - mean) ** 2
    scaler.mean = mean
    scaler.std = np.sqrt(np.cumsum(sq, axis=0)[-1] / count)
    return True


def _fused_sequential_class():
    """``_NoGradFusedSequential``, defined on first use (importing this module does not import torch)."""
    global _NoGradFusedSequential
    if _NoGradFusedSequential is not None:
        return _NoGradFusedSequential
    import torch

    class NoGradFusedSequential(torch.nn.Sequential):
        """An ``nn.Sequential`` of d3rlpy's vector encoders whose forward without autograd runs each
        ``Linear`` (+ the ``ReLU`` after it) as one oneDNN call; with autograd on, or off the CPU, it
        is ``nn.Sequential``'s forward. The same modules and parameters (``state_dict`` unchanged)."""

        def forward(self, x):
            if torch.is_grad_enabled() or x.device.type != "cpu" or x.dtype != torch.float32 or x.dim() != 2:
                return super().forward(x)
            layers, i = list(self), 0
            while i < len(layers):
                m = layers[i]
                if type(m) is torch.nn.Linear:
                    relu = i + 1 < len(layers) and type(layers[i + 1]) is torch.nn.ReLU
                    x = torch.ops.mkldnn._linear_pointwise(x.contiguous(), m.weight, m.bias,
                                                           "relu" if relu else "none", [], "")
                    i += 2 if relu else 1
                else:
                    x = m(x)
                    i += 1
            return x

    NoGradFusedSequential.__name__ = NoGradFusedSequential.__qualname__ = "_NoGradFusedSequential"
    _NoGradFusedSequential = NoGradFusedSequential  # pickle finds it by name
    return NoGradFusedSequential


_NoGradFusedSequential = None


def fuse_no_grad_forward(algo) -> int:
    """Route the no-grad forward passes of ``algo``'s vector encoders through oneDNN's fused
    linear+ReLU (``torch.ops.mkldnn._linear_pointwise``, what ``torch.compile`` calls for a frozen
    CPU linear): BCQ's target (decoder, perturbation and target critics over batch x sampled
    actions, ~85% of its step's FLOPs) runs ~1.2-1.3x faster per CPU-second on this AMD CPU than
    through torch's MKL addmm (benchmarks/challenger_limit.py). Gradients, and every pass with
    autograd on, are untouched. The results are the same functions in float32 with another
    summation order: not bit-identical to d3rlpy's, deterministic for a fixed thread count
    (tests/test_training.py). Returns how many encoders were switched (0: no oneDNN here)."""
    import torch

    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return 0
    cls, n = _fused_sequential_class(), 0
    for f in dataclasses.fields(algo.impl.modules):
        m = getattr(algo.impl.modules, f.name)
        if not isinstance(m, torch.nn.Module):
            continue
        for sub in m.modules():
            if type(sub) is torch.nn.Sequential and all(type(c) in (torch.nn.Linear, torch.nn.ReLU) for c in sub):
                sub.__class__ = cls
                n += 1
    return n


def _train(cfg: ChallengerConfig, dataset, out: Path, scenario, device: str, *, resume: bool, report, progress: bool):
    import d3rlpy
    from d3rlpy.algos.utility import build_scalers_with_transition_picker
    from tqdm import tqdm

    state, algo, _ = load_checkpoint(out, cfg, resume, device, f"{cfg.algo} challenger")
    if state is None:
        # the networks' initial weights come from torch's global generator: seed it before they
        # are built, or two trainings of one seed start from different weights
        d3rlpy.seed(cfg.seed * 1_000)
        state = {"config": asdict(cfg), "step": 0, "epoch": 0, "grad_steps": 0, "wall_seconds": 0.0,
                 "transitions": int(dataset.transition_count), "episodes": len(dataset.episodes), "history": []}
        algo = d3rlpy_config(cfg.config_class(scenario.action.discrete), cfg.hyperparameters,
                             f"{cfg.preset} {cfg.algo}").create(device=device)
        fit_standard_observation_scaler(algo, dataset)  # vectorised; the same bits as d3rlpy's fit
        build_scalers_with_transition_picker(algo, dataset)  # whatever is left unbuilt
        algo.build_with_dataset(dataset)
    if cfg.onednn_no_grad:
        fuse_no_grad_forward(algo)

    d3rlpy.seed(cfg.seed * 1_000 + state["epoch"])  # batch sampling uses numpy's global stream
    batch_size = algo.config.batch_size
    sample = TransitionSampler.for_algo(dataset, algo)  # d3rlpy's minibatches, vectorised
    step, losses = state["step"], {}
    bar = tqdm(total=cfg.steps, initial=step, unit="step", desc=f"{cfg.algo} on D ({cfg.scenario})",
               disable=not progress)
    t_epoch = time.perf_counter()
    while step < cfg.steps:
        step += 1
        for k, v in algo.update(sample(batch_size)).items():
            losses.setdefault(k, []).append(float(v))
        bar.update(1)
        if step % cfg.steps_per_epoch == 0 or step == cfg.steps:
            dt = time.perf_counter() - t_epoch
            prev = state["history"][-1]["step"] if state["history"] else 0
            state.update(epoch=state["epoch"] + 1, step=step, grad_steps=int(algo.grad_step),
                         wall_seconds=state["wall_seconds"] + dt)
            metrics = {"epoch": state["epoch"], "step": step, "updates_per_second": (step - prev) / max(dt, 1e-9),
                       **{k: float(np.mean(v)) for k, v in losses.items()}}
            if cfg.eval_episodes:
                metrics.update(evaluate_algo(algo, scenario, cfg.eval_episodes, seed=10_000 + cfg.seed))
            state["history"].append(metrics)
            ck = _write_checkpoint(out, state["epoch"], algo, None, state)
            if report:
                report(metrics, ck)
            if "eval_return" in metrics:
                bar.set_postfix(eval=f"{metrics['eval_return']:.1f}")
            losses = {}
            t_epoch = time.perf_counter()
    bar.close()
    tmp = out / f".model.d3.tmp-{os.getpid()}"
    algo.save(str(tmp))
    os.replace(tmp, out / "model.d3")
    (out / "training.json").write_text(json.dumps(state, indent=2))
    return state


