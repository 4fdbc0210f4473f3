"""Repair (Delta RQ4): fine-tune the AUT with CQL on the challenger's superior trajectories.

    aut = d3rlpy.load_learnable("experiments/zoo/CartPole-v1-ddqn/model.d3")
    data = steps_to_dataset([superior_steps], discrete=True, action_size=2)   # D_superior
    algo = cql_from_aut(aut, RepairConfig())     # DiscreteCQL, the AUT's network and weights
    history = fine_tune(algo, data, RepairConfig(), progress=True)
    algo.save("aut_improved.d3")

The paper (Sec. 5, RQ4): "retain the AUT's existing neural network architecture but switch its
training objective to one specifically designed for the offline paradigm", CQL. So the
fine-tuned agent is built from the AUT's own config (encoder, Q-function factory, number of
critics, scalers, gamma, batch size, target update interval) and starts from the AUT's weights:

* a Double DQN AUT becomes a d3rlpy ``DiscreteCQL`` whose Q-function *and* target Q-function
  are copies of the AUT's (DiscreteCQL is Double DQN plus the conservative term
  ``alpha * (logsumexp_a Q(s, a) - Q(s, a_data))``);
* a SAC AUT becomes a d3rlpy ``CQL`` with the AUT's actor, critics, target critics and
  temperature (``conservative_weight`` = ``alpha``).

:func:`cql_from_aut` checks that the new agent's greedy actions and Q-values equal the AUT's on
probe observations before any update; a mismatch raises.

Plain classes and functions, no Ray. The orchestrator side (run folders, evaluation, report
files) is :mod:`orchestrator.campaign.repair`.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from workers.datasets import TransitionSampler
from workers.training import TrainingError

DATA_CHOICES = ("superior", "union")


# Defaults that depend on the AUT's kind. Discrete (Double DQN -> DiscreteCQL): set on CartPole
# (experiments/results/repair-CartPole-v1.md). Continuous (SAC -> CQL): measured on Hopper
# (experiments/results/repair-settings-Hopper-v5.md): d3rlpy's actor step (lr / 3) costs the agent
# 600 of its return on its bug states within 20 updates; an actor learning rate 1000x below the
# critic's, the AUT's temperature kept and 1,000 updates improve the bug states and keep the rest.
DISCRETE_STEPS = 3_000
CONTINUOUS_STEPS = 1_000
CONTINUOUS_ACTOR_LR = 1e-7
CONTINUOUS_TEMP_LR = 0.0


@dataclass
class RepairConfig:
    """The fine-tuning settings. ``None`` means: the default for the AUT's kind
    (:meth:`for_aut`), or the AUT's own value where that is said."""

    steps: int | None = None  # gradient steps; None: 3,000 discrete, 1,000 continuous
    learning_rate: float = 1e-4  # Q-function (discrete) / critic (continuous); the AUT's is far higher
    actor_learning_rate: float | None = None  # continuous only; None: 1e-7
    alpha: float = 1.0  # conservative weight: DiscreteCQL alpha, CQL conservative_weight
    temp_learning_rate: float | None = None  # continuous only; None: 0, the AUT's temperature kept (SAC's
    # automatic entropy tuning is an online exploration device); > 0: tuned on, at that rate
    batch_size: int | None = None  # None: the AUT's
    target_update_interval: int | None = None  # discrete only; None: the AUT's
    data: str = "superior"  # "superior" (D_superior, the paper) or "union" (D ∪ D_superior)
    seed: int = 0
    log_every: int = 250  # steps between loss records in the history
    device: str | None = None  # None: cuda when available

    def for_aut(self, discrete: bool) -> "RepairConfig":
        """A copy with the kind-dependent defaults filled in (what repair.json records)."""
        fill = {"steps": DISCRETE_STEPS if discrete else CONTINUOUS_STEPS}
        if not discrete:
            fill.update(actor_learning_rate=CONTINUOUS_ACTOR_LR, temp_learning_rate=CONTINUOUS_TEMP_LR)
        return dataclasses.replace(self, **{k: v for k, v in fill.items() if getattr(self, k) is None}).validate()

    def validate(self) -> "RepairConfig":
        if self.data not in DATA_CHOICES:
            raise TrainingError(f"repair data must be one of {', '.join(DATA_CHOICES)}, got {self.data!r}")
        if self.steps is not None and int(self.steps) < 1:
            raise TrainingError(f"repair steps must be >= 1, got {self.steps}")
        if not self.learning_rate > 0:
            raise TrainingError(f"repair learning rate must be > 0, got {self.learning_rate}")
        if self.alpha < 0:
            raise TrainingError(f"repair alpha (conservative weight) must be >= 0, got {self.alpha}")
        if self.actor_learning_rate is not None and not self.actor_learning_rate > 0:
            raise TrainingError(f"repair actor learning rate must be > 0, got {self.actor_learning_rate}")
        if self.temp_learning_rate is not None and self.temp_learning_rate < 0:
            raise TrainingError(f"repair temperature learning rate must be >= 0 (0: the AUT's temperature kept), "
                                f"got {self.temp_learning_rate}")
        for name in ("batch_size", "target_update_interval"):
            v = getattr(self, name)
            if v is not None and int(v) < 1:
                raise TrainingError(f"repair {name} must be >= 1, got {v}")
        return self


# ---------------------------------------------------------------------------------------------
# datasets
# ---------------------------------------------------------------------------------------------

def rollout_steps(result) -> dict:
    """A :class:`~workers.rollout.RolloutResult`'s steps in the form of ``RunStore.read_steps``."""
    return {"obs": result.obs, "actions": result.actions, "rewards": result.rewards,
            "terminals": result.terminals, "timeouts": result.timeouts,
            "episode_id": result.episode.astype(np.int64), "t": result.t}


def steps_to_dataset(parts: list[dict], *, discrete: bool, action_size: int):
    """One d3rlpy ``MDPDataset`` from several step tables (each as ``RunStore.read_steps``
    returns them: episodes contiguous, t ascending). Episodes never merge across parts; every
    episode ends with exactly one of terminal / timeout (``workers.datasets.steps_to_mdp_dataset``)."""
    from workers.datasets import steps_to_mdp_dataset

    parts = [s for s in parts if int(np.asarray(s["rewards"]).shape[0])]
    if not parts:
        raise TrainingError("repair: the fine-tuning dataset is empty (no superior trajectories)")
    keys = ("obs", "actions", "rewards", "terminals", "timeouts")
    merged = {k: np.concatenate([np.asarray(s[k]).reshape(len(s["rewards"]), -1) if k == "obs" else np.asarray(s[k])
                                 for s in parts]) for k in keys}
    # episode ids renumbered part by part, so that two parts' ids never join two episodes
    ids, base = [], 0
    for s in parts:
        eid = np.asarray(s["episode_id"])
        new = base + np.concatenate([[0], np.cumsum(eid[1:] != eid[:-1])])
        ids.append(new)
        base = int(new[-1]) + 1
    merged["episode_id"] = np.concatenate(ids)
    return steps_to_mdp_dataset(merged, discrete=discrete, action_size=action_size)


# ---------------------------------------------------------------------------------------------
# the AUT's network under the CQL objective
# ---------------------------------------------------------------------------------------------

def _is_discrete_aut(aut) -> bool:
    import d3rlpy

    if isinstance(aut, (d3rlpy.algos.DQN, d3rlpy.algos.DoubleDQN)):
        return True
    if isinstance(aut, d3rlpy.algos.SAC):
        return False
    raise TrainingError(f"repair fine-tunes a Double DQN / DQN or SAC AUT; this AUT is a {type(aut).__name__}")


def _shared_settings(src_config, dst_cls) -> dict:
    import dataclasses

    dst = {f.name for f in dataclasses.fields(dst_cls)}
    return {f.name: getattr(src_config, f.name) for f in dataclasses.fields(src_config) if f.name in dst}


def cql_from_aut(aut, cfg: RepairConfig, probe_obs: np.ndarray | None = None):
    """A d3rlpy (Discrete)CQL with the AUT's network, built from the AUT's config and holding a
    copy of its weights (Q-functions and targets; for SAC also the actor and the temperature).
    ``probe_obs``: observations on which the copy is checked (greedy actions and Q-values equal
    to the AUT's); random ones around 0 when None."""
    import d3rlpy
    import torch

    if aut.impl is None:
        raise TrainingError("repair: the AUT model is not built (load it with d3rlpy.load_learnable)")
    device = cfg.device or ("cuda:0" if torch.cuda.is_available() else "cpu:0")
    discrete = _is_discrete_aut(aut)
    cfg = cfg.for_aut(discrete)
    if discrete:
        settings = _shared_settings(aut.config, d3rlpy.algos.DiscreteCQLConfig)
        settings.update(learning_rate=float(cfg.learning_rate), alpha=float(cfg.alpha))
        if cfg.target_update_interval is not None:
            settings["target_update_interval"] = int(cfg.target_update_interval)
        conf_cls = d3rlpy.algos.DiscreteCQLConfig
    else:
        settings = _shared_settings(aut.config, d3rlpy.algos.CQLConfig)
        settings.update(critic_learning_rate=float(cfg.learning_rate),
                        actor_learning_rate=float(cfg.actor_learning_rate),
                        temp_learning_rate=float(cfg.temp_learning_rate), conservative_weight=float(cfg.alpha))
        conf_cls = d3rlpy.algos.CQLConfig
    if cfg.batch_size is not None:
        settings["batch_size"] = int(cfg.batch_size)
    algo = conf_cls(**settings).create(device=device)
    algo.create_impl(aut.impl.observation_shape, aut.impl.action_size)
    src, dst = aut.impl._modules, algo.impl._modules
    names = ["q_funcs", "targ_q_funcs"] + ([] if discrete else ["policy", "log_temp"])
    with torch.no_grad():
        for name in names:
            getattr(dst, name).load_state_dict(getattr(src, name).state_dict())
    check_same_predictions(aut, algo, probe_obs)
    return algo


def check_same_predictions(aut, algo, probe_obs: np.ndarray | None = None) -> None:
    """Raise unless ``algo`` acts like ``aut`` (and has the same Q-values) on the probes."""
    if probe_obs is None:
        rng = np.random.default_rng(0)
        probe_obs = rng.standard_normal((256, *aut.impl.observation_shape)).astype(np.float32)
    x = np.asarray(probe_obs, np.float32)
    a0, a1 = aut.predict(x), algo.predict(x)
    q0, q1 = aut.predict_value(x, a0), algo.predict_value(x, a0)
    if not (np.array_equal(a0, a1) and np.allclose(q0, q1, rtol=1e-6, atol=1e-6)):
        raise TrainingError("repair: the CQL agent built from the AUT's weights does not reproduce the AUT's "
                            "actions and Q-values; its network differs from the AUT's")


def fine_tune(algo, dataset, cfg: RepairConfig, *, progress: bool = False,
              report: Callable[[dict], None] | None = None) -> dict:
    """``cfg.steps`` CQL updates of ``algo`` on ``dataset`` (seeded); returns the training
    record: loss means every ``log_every`` steps, wall time, transitions."""
    import d3rlpy
    from tqdm import tqdm

    cfg = cfg.for_aut(isinstance(algo, d3rlpy.algos.DiscreteCQL))

    d3rlpy.seed(cfg.seed)  # batch sampling draws from numpy's global stream
    batch_size = algo.config.batch_size
    sample = TransitionSampler.for_algo(dataset, algo)  # d3rlpy's minibatches, vectorised
    history, losses = [], {}
    bar = tqdm(total=cfg.steps, unit="step", desc=f"CQL fine-tuning ({cfg.data})", disable=not progress)
    t0 = time.perf_counter()
    for step in range(1, cfg.steps + 1):
        for k, v in algo.update(sample(batch_size)).items():
            losses.setdefault(k, []).append(float(v))
        bar.update(1)
        if step % cfg.log_every == 0 or step == cfg.steps:
            row = {"step": step, **{k: float(np.mean(v)) for k, v in losses.items()}}
            history.append(row)
            if report:
                report(row)
            bar.set_postfix(loss=f"{row.get('loss', row.get('critic_loss', float('nan'))):.3f}")
            losses = {}
    bar.close()
    return {"steps": cfg.steps, "grad_steps": int(algo.grad_step), "wall_seconds": time.perf_counter() - t0,
            "transitions": int(dataset.transition_count), "episodes": len(dataset.episodes), "history": history}


def action_agreement(algo, observations: np.ndarray, actions: np.ndarray, discrete: bool) -> float:
    """Share of ``observations`` where ``algo``'s greedy action equals ``actions`` (discrete), or
    minus the mean L2 distance to them (continuous)."""
    pred = algo.predict(np.asarray(observations, np.float32))
    if discrete:
        return float(np.mean(pred == np.asarray(actions)))
    return -float(np.mean(np.linalg.norm(pred - np.asarray(actions), axis=-1)))
