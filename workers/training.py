"""AUT training: d3rlpy online algorithms (Double DQN, SAC), one readable loop.

    cfg = AutTrainConfig.from_file("experiments/aut/CartPole-v1-ddqn.yaml", steps=50_000)
    train_aut(cfg, "runs/aut-cartpole")            # plain, in this process
    # the same loop as a Ray Train job: orchestrator.campaign.train_jobs.train_aut_job

The loop (CleanRL style, top to bottom): act (random during warm-up, then the explorer or the
stochastic policy), step the scenario's reference gymnasium env, store the transition in a d3rlpy
replay buffer, update every ``update_interval`` steps, and at the end of every epoch evaluate
the greedy policy with the batched engine (the best epoch so far is kept as ``best.d3``) and
write a checkpoint: ``model.d3`` (weights,
optimizer state and config), ``buffer.h5`` (the replay buffer) and ``state.json`` (step counters,
returns, metrics), written into a temporary folder and renamed, so a checkpoint is whole or
absent. At the end ``final.d3`` is the last policy and ``model.d3`` the best one by evaluation
(what the zoo ships). ``resume=True`` continues from the newest checkpoint (the episode in progress at the
checkpoint is dropped: a resumed run starts a fresh episode). ``shared_agents: K`` trains one per-agent
policy for the K agents of a scenario (:mod:`workers.shared_agents`): the same loop, with one transition
per agent per step, and ``policy.pt`` (:func:`export_aut_policy`) the joint policy for the scenario.

d3rlpy's own ``fit_online`` is not used: it would write ``d3rlpy_logs/`` into the working
directory and cannot resume. Metrics go to the ``report`` callback (and from the Ray Train job
to MLflow).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from workers.shared_agents import AgentSplit, agent_split, shared_actions
from workers.yamlfile import load_yaml

log = logging.getLogger(__name__)

ALGOS = ("ddqn", "sac")
EPISODE_ENDS = ("env", "truncated")


class TrainingError(ValueError):
    """Bad training input: unknown algorithm, scenario/algorithm mismatch, unreadable config."""


@dataclass
class AutTrainConfig:
    """Everything that defines an AUT training run (saved with every checkpoint)."""

    scenario: str
    algo: str  # "ddqn" (discrete scenarios) or "sac" (continuous)
    steps: int = 100_000
    steps_per_epoch: int = 10_000
    seed: int = 0
    hyperparameters: dict = field(default_factory=dict)  # kwargs of d3rlpy's DoubleDQNConfig/SACConfig
    buffer_size: int = 1_000_000
    warmup_steps: int = 1_000  # uniformly random actions, no updates
    update_interval: int = 1  # env steps per update round
    n_updates: int = 1  # gradient steps per update round
    epsilon: dict = field(default_factory=lambda: {"start": 1.0, "end": 0.05, "duration": 10_000})  # ddqn
    eval_episodes: int = 20
    # how an episode's end enters the replay buffer: "env" as the env says (terminated: no future,
    # truncated: bootstrap); "truncated": every end is a time limit (bootstrap), for scenarios whose
    # fixed-length episodes end "terminated" by their failure oracle while the observation carries
    # no time (CoopNavi: a failed episode ends at step 25 like a passed one)
    episode_end: str = "env"
    # start from another run's weights (a d3rlpy model.d3 of the same algorithm and spaces; in a YAML
    # file a relative path is relative to that file), e.g. a calm-air Hopper fine-tuned in wind; its
    # warm-up steps then act with that policy, not at random
    init_from: str | None = None
    # which epoch's policy the run ships (model.d3): None keeps the best by the training-time
    # evaluation; {return: R, success: S} keeps the epoch closest to that quality, e.g. the paper's
    # AUT (distance |return - R| / max(|R|, 1) + |success rate - S|; evaluate on >= 100 episodes)
    select: dict | None = None
    # the agent's name in the zoo (its folder); None: SCENARIO-ALGO
    name: str | None = None
    # one policy shared by K agents (parameter sharing, workers/shared_agents.py): the scenario's
    # observation and action are K equal per-agent slices (CoopNavi: 42 = 3 x 14, 6 = 3 x 2); the
    # d3rlpy algorithm (model.d3) is built for one slice, every env step stores one transition per
    # agent (its slices, the shared reward), and policy.pt applies the greedy actor to each slice and
    # concatenates the actions. None: one policy for the whole observation
    shared_agents: int | None = None
    device: str | None = None  # None: cuda when available

    @classmethod
    def from_file(cls, path: str | os.PathLike, **overrides) -> "AutTrainConfig":
        p = Path(path)
        data = load_yaml(p, "training config", TrainingError, fix="see experiments/aut/ for the presets",
                         allow_empty=True)
        data.pop("source", None)  # provenance notes, not a setting
        if data.get("init_from") and not Path(data["init_from"]).is_absolute():
            data["init_from"] = str((p.parent / data["init_from"]).resolve())  # relative to the YAML file
        data.update({k: v for k, v in overrides.items() if v is not None})
        unknown = set(data) - {f for f in cls.__dataclass_fields__}
        if unknown:
            raise TrainingError(f"training config {p}: unknown settings {sorted(unknown)}")
        return cls(**data)

    def validate(self):
        from envs import get_scenario
        from workers.resources import is_zoo_name

        if self.algo not in ALGOS:
            raise TrainingError(f"unknown algorithm {self.algo!r}; choose one of {', '.join(ALGOS)}")
        scenario = get_scenario(self.scenario)
        if scenario.action.discrete != (self.algo == "ddqn"):
            kind = "discrete" if scenario.action.discrete else "continuous"
            want = "ddqn" if scenario.action.discrete else "sac"
            raise TrainingError(f"{self.scenario} has {kind} actions: train it with --algo {want}, not {self.algo}")
        if self.episode_end not in EPISODE_ENDS:
            raise TrainingError(f"episode_end must be one of {', '.join(EPISODE_ENDS)}, got {self.episode_end!r}")
        for name in ("steps", "steps_per_epoch", "update_interval", "n_updates", "eval_episodes"):
            if int(getattr(self, name)) < 1:
                raise TrainingError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.select is not None:
            if not isinstance(self.select, dict) or set(self.select) != {"return", "success"}:
                raise TrainingError(f"select must be {{return: R, success: S}} (the quality to keep), got {self.select!r}")
            r, sr = self.select["return"], self.select["success"]
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (r, sr)) or not 0 <= sr <= 1:
                raise TrainingError(f"select: return is a number and success a rate in [0, 1], got {self.select!r}")
        if self.name is not None and not is_zoo_name(self.name):
            raise TrainingError(f"name {self.name!r} is not a folder name for the zoo (e.g. CartPole-v1-ddqn-paper)")
        self.agent_split(scenario)
        return scenario

    def agent_split(self, scenario) -> AgentSplit | None:
        """How ``shared_agents`` splits ``scenario`` (None: one policy for the whole observation)."""
        k = self.shared_agents
        if k is None:
            return None
        if not isinstance(k, int) or isinstance(k, bool) or k < 2:
            raise TrainingError(f"shared_agents must be a whole number >= 2 (how many agents share one policy, e.g. 3 "
                                f"for CoopNavi), got {k!r}; remove it to train one policy for the whole observation")
        try:
            return agent_split(scenario, k)
        except ValueError as exc:
            raise TrainingError(str(exc)) from None

    @property
    def agent_name(self) -> str:
        return self.name or f"{self.scenario}-{self.algo}"


def selection_distance(metrics: dict, select: dict) -> float:
    """How far an epoch's evaluation is from the quality ``select`` asks for: |return - R| / max(|R|, 1)
    + |success rate - S| (a 1% return gap weighs as one point of success rate)."""
    target = float(select["return"])
    success = 1.0 - float(metrics["eval_failure_rate"])
    return abs(float(metrics["eval_return"]) - target) / max(abs(target), 1.0) + abs(success - float(select["success"]))


def d3rlpy_config(config_cls, hyperparameters: dict, where: str):
    """``config_cls`` (a d3rlpy ``*Config``) from plain data, checked: unknown settings and
    unknown factory types raise :class:`TrainingError` naming ``where``. Factories (encoders,
    Q-functions, optimizers, scalers) are written as d3rlpy serializes them, e.g.
    ``encoder_factory: {type: vector, params: {hidden_units: [30, 30]}}``."""
    base = config_cls().serialize_to_dict()
    hp = dict(hyperparameters or {})
    unknown = sorted(set(hp) - set(base))
    if unknown:
        raise TrainingError(f"{where}: unknown {config_cls.__name__} setting {unknown[0]!r}; "
                            f"allowed: {', '.join(sorted(base))}")
    for k, v in hp.items():
        if isinstance(base[k], dict) and "type" in base[k]:  # a factory
            if not (isinstance(v, dict) and "type" in v):
                raise TrainingError(f"{where}: {k} must be written as {{type: ..., params: {{...}}}}, got {v!r}")
            hp[k] = {"type": v["type"], "params": dict(v.get("params") or {})}
    try:
        return config_cls.deserialize_from_dict({**base, **hp})
    except KeyError as exc:
        raise TrainingError(f"{where}: unknown factory type {exc.args[0]!r} in {config_cls.__name__}") from exc
    except (TypeError, ValueError) as exc:
        raise TrainingError(f"{where}: {config_cls.__name__} rejects these settings: {exc}") from exc


def make_algo(cfg: AutTrainConfig, device: str):
    import d3rlpy

    cls = d3rlpy.algos.DoubleDQNConfig if cfg.algo == "ddqn" else d3rlpy.algos.SACConfig
    return d3rlpy_config(cls, cfg.hyperparameters, f"{cfg.scenario}-{cfg.algo} hyperparameters").create(device=device)


class _AlgoPolicy:
    """The greedy policy of a d3rlpy algorithm, for the batched engine: d3rlpy's TorchScript graph of
    it (what ``save_policy`` exports, traced in memory) where it traces, else ``algo.predict``."""

    def __init__(self, algo, discrete: bool, split: AgentSplit | None = None):
        self.algo, self.discrete, self.split = algo, discrete, split
        self.graph = traced_greedy(algo, split)

    def act(self, obs):
        x = np.asarray(obs, dtype=np.float32)
        if self.graph is not None:
            import torch

            with torch.inference_mode():
                a = self.graph(torch.from_numpy(x)).numpy()
        elif self.split is not None:
            a = shared_actions(self.algo.predict, self.split)(x)
        else:
            a = self.algo.predict(x)
        return a.astype(np.int64) if self.discrete else a.astype(np.float32)


def traced_greedy(algo, split: AgentSplit | None = None):
    """The graph ``algo.save_policy("policy.pt")`` would write (observation scaler, greedy action,
    action scaler), traced in memory from the current weights; None where d3rlpy's policy does not
    trace or the observation is a tuple. With ``split`` (a per-agent algorithm of ``shared_agents``)
    the graph takes the joint observation and applies the per-agent greedy policy to every agent's
    slice (:func:`workers.shared_agents.shared_actions`). On this CPU a call of it costs a third of ``algo.predict``
    for the quick start's BCQ (170 vs 600 us: torch's per-operation cost outside the graph executor
    dominates small networks), which is most of a per-epoch evaluation. Tracing needs the weights
    out of autograd for a moment (as ``save_policy`` does) and runs on a zero input, not a random one."""
    import warnings

    import torch

    impl, cfg = getattr(algo, "impl", None), algo.config
    shape = getattr(impl, "observation_shape", None)
    if impl is None or not shape or not all(isinstance(d, int) for d in shape):
        return None

    def greedy(x):
        if cfg.observation_scaler:
            x = cfg.observation_scaler.transform(x)
        a = impl.predict_best_action(x)
        if cfg.action_scaler:
            a = cfg.action_scaler.reverse_transform(a)
        return a

    fn, example = greedy, torch.zeros(1, *shape)
    if split is not None:
        fn, example = shared_actions(greedy, split), torch.zeros(1, split.agents * split.obs_dim)
    try:
        with _out_of_autograd(algo), warnings.catch_warnings():  # the tracer's notes
            warnings.simplefilter("ignore")
            return torch.jit.trace(fn, example, check_trace=False)
    except Exception as exc:  # noqa: BLE001 - not every algorithm's action selection traces: predict then
        log.debug("greedy action selection not traced (%s: %s): predict() is used", type(exc).__name__, exc)
        return None


@contextlib.contextmanager
def _out_of_autograd(algo):
    """The algorithm's weights with ``requires_grad`` off for the block (a traced or saved
    TorchScript constant cannot require grad, as in d3rlpy's ``save_policy``); each flag is put
    back as it was."""
    import torch

    impl = algo.impl
    modules = [getattr(impl.modules, f.name) for f in dataclasses.fields(impl.modules)]
    flags = [(p, p.requires_grad) for m in modules if isinstance(m, torch.nn.Module) for p in m.parameters()]
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def evaluate_algo(algo, scenario, episodes: int, seed: int, split: AgentSplit | None = None) -> dict:
    """Greedy returns over ``episodes`` starts from the reset distribution (batched engine). Torch's
    random stream is left as it was (a stochastic action selection, e.g. continuous BCQ's, draws
    from it), so watching a training does not change the training. ``split``: ``algo`` is the
    per-agent policy of ``shared_agents``, acting for every agent."""
    import torch

    from workers.rollout import rollout

    states = scenario.sample(np.random.default_rng(seed), episodes)
    with torch.random.fork_rng(devices=[]):
        res = rollout(scenario, _AlgoPolicy(algo, scenario.action.discrete, split), states, seed=seed)
    s = res.summary()
    return {"eval_return": s["mean_return"], "eval_return_std": s["std_return"], "eval_failure_rate": s["failure_rate"]}


def latest_checkpoint(out_dir: str | os.PathLike) -> Path | None:
    ckpts = sorted(Path(out_dir, "checkpoints").glob("epoch-[0-9][0-9][0-9][0-9][0-9]"))
    return ckpts[-1] if ckpts else None


def _write_checkpoint(out_dir: Path, epoch: int, algo, buffer, state: dict, keep: int = 2) -> Path:
    ckdir = out_dir / "checkpoints"
    final = ckdir / f"epoch-{epoch:05d}"
    tmp = ckdir / f".tmp-epoch-{epoch:05d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    algo.save(str(tmp / "model.d3"))
    if buffer is not None:  # offline training checkpoints carry no buffer (the dataset is the run's)
        with open(tmp / "buffer.h5", "w+b") as f:  # h5py reads back while writing
            buffer.dump(f)
    (tmp / "state.json").write_text(json.dumps(state, indent=2))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in sorted(ckdir.glob("epoch-[0-9]*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(out: Path, cfg, resume: bool, device: str, what: str = "run"):
    """(state, algo) of the newest checkpoint in ``out`` when resuming (its scenario and
    algorithm checked against ``cfg``), (None, None) for a fresh run; refuses to resume from
    nothing or to start over a run that exists."""
    ckpt = latest_checkpoint(out) if resume else None
    if ckpt is None:
        if resume:
            raise TrainingError(f"nothing to resume in {out}: no checkpoints/epoch-* folder")
        if latest_checkpoint(out) is not None:
            raise TrainingError(f"{out} already holds a {what}; add --resume to continue it or choose another --out")
        return None, None, None
    import d3rlpy

    state = json.loads((ckpt / "state.json").read_text())
    if state["config"]["scenario"] != cfg.scenario or state["config"]["algo"] != cfg.algo:
        raise TrainingError(f"{out} holds a {state['config']['scenario']} {state['config']['algo']} {what}; "
                            f"resume it with the same scenario and algorithm or choose another --out")
    was, now = state["config"].get("shared_agents"), getattr(cfg, "shared_agents", None)
    if was != now:
        raise TrainingError(f"{out} holds a {what} with shared_agents {was}, this config has {now}: the networks' "
                            f"input sizes differ; resume it with shared_agents: {was} or choose another --out")
    algo = d3rlpy.load_learnable(str(ckpt / "model.d3"), device=device)
    algo._grad_step = int(state["grad_steps"])  # d3rlpy does not save it; target updates depend on it
    return state, algo, ckpt


def train_aut(
    cfg: AutTrainConfig,
    out_dir: str | os.PathLike,
    *,
    resume: bool = False,
    report: Callable[[dict, Path], None] | None = None,
    progress: bool = False,
) -> dict:
    """Train the AUT; returns the final state (metrics of every epoch included)."""
    import d3rlpy
    import torch
    from tqdm import tqdm

    scenario = cfg.validate()
    quiet_d3rlpy()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    device = cfg.device or ("cuda:0" if torch.cuda.is_available() else "cpu:0")
    env = scenario.reference_env()
    split = cfg.agent_split(scenario)  # None: one policy for the whole observation
    state, algo, buffer, min_fill = _start_or_resume(cfg, out, env, resume, device, split)

    d3rlpy.seed(cfg.seed + state["epoch"])
    rng = np.random.default_rng([cfg.seed, state["epoch"]])
    env.action_space.seed(int(rng.integers(2**31)))
    explorer = None
    if cfg.algo == "ddqn":
        e = cfg.epsilon
        explorer = d3rlpy.algos.LinearDecayEpsilonGreedy(e["start"], e["end"], int(e["duration"]))

    obs, _ = env.reset(seed=int(rng.integers(2**31)))
    ep_return, recent_returns, losses = 0.0, [], {}
    joint = ([], [], [])  # shared_agents: the episode's joint observations, actions, rewards until it ends
    step = state["step"]
    bar = tqdm(total=cfg.steps, initial=step, unit="step", desc=f"{cfg.algo} {cfg.scenario}", disable=not progress)
    t_epoch = time.perf_counter()
    while step < cfg.steps:
        step += 1
        action = _act(cfg, env, algo, explorer, obs, step, state["epoch"], split)
        next_obs, reward, terminated, truncated, _ = env.step(action)
        if split is None:
            buffer.append(obs, action, float(reward))
        else:
            for seq, v in zip(joint, (obs, action, float(reward))):
                seq.append(v)
        ep_return += float(reward)
        if terminated or truncated:
            if split is None:
                buffer.clip_episode(bool(terminated) and cfg.episode_end == "env")
            else:
                _append_agent_episodes(buffer, split, joint, next_obs, bool(terminated) and cfg.episode_end == "env")
                joint = ([], [], [])
            recent_returns.append(ep_return)
            state["episodes"] += 1
            ep_return = 0.0
            obs, _ = env.reset()
        else:
            obs = next_obs
        if (step > cfg.warmup_steps and step % cfg.update_interval == 0
                and buffer.transition_count > max(algo.batch_size, min_fill)):
            _update(algo, buffer, cfg.n_updates, losses)
        bar.update(1)

        if step % cfg.steps_per_epoch == 0 or step == cfg.steps:
            dt = time.perf_counter() - t_epoch
            metrics, ck = _end_epoch(cfg, out, scenario, algo, buffer, state, step, dt, recent_returns, losses)
            if report:
                report(metrics, ck)
            bar.set_postfix(eval=f"{metrics['eval_return']:.1f}")
            recent_returns, losses = [], {}
            t_epoch = time.perf_counter()
    bar.close()
    _finish(out, algo, state)
    return state


def _start_or_resume(cfg: AutTrainConfig, out: Path, env, resume: bool, device: str, split: AgentSplit | None = None):
    """(state, algo, replay buffer, min_fill) of a fresh run or of the newest checkpoint.
    ``min_fill``: transitions the buffer must hold before updates (more when refilled on resume).
    With ``split`` the algorithm and the buffer are one agent's (its slice of the spaces)."""
    import d3rlpy

    state, algo, ckpt = load_checkpoint(out, cfg, resume, device, "training run")
    spaces = env if split is None else split.spaces()
    min_fill = 0
    if ckpt is not None:
        if (ckpt / "buffer.h5").is_file():
            with open(ckpt / "buffer.h5", "rb") as f:
                buffer = d3rlpy.dataset.ReplayBuffer.load(f, d3rlpy.dataset.FIFOBuffer(cfg.buffer_size))
        else:  # a checkpoint shipped without its buffer (e.g. committed): refill it with the policy
            buffer = d3rlpy.dataset.create_fifo_replay_buffer(limit=cfg.buffer_size, env=spaces)
            min_fill = max(cfg.warmup_steps, algo.batch_size)
    else:
        state = {"config": asdict(cfg), "step": 0, "epoch": 0, "grad_steps": 0, "episodes": 0,
                 "wall_seconds": 0.0, "history": []}
        d3rlpy.seed(cfg.seed)  # the networks' initial weights come from torch's global generator
        algo = make_algo(cfg, device)
        algo.build_with_env(spaces)
        if cfg.init_from:
            _load_weights(algo, cfg.init_from, device)
        buffer = d3rlpy.dataset.create_fifo_replay_buffer(limit=cfg.buffer_size, env=spaces)
    return state, algo, buffer, min_fill


def _append_agent_episodes(buffer, split: AgentSplit, joint: tuple, last_obs, terminal: bool) -> None:
    """A finished joint episode into the buffer as one episode per agent (``shared_agents``): agent
    i's slices of the observations and actions, the shared rewards. A terminal episode ends in a
    transition with no future; otherwise the final observation is stored too, so that every step,
    the last one included, is a transition that bootstraps from the next observation."""
    observations, actions, rewards = joint
    if not actions:
        return
    obs = np.stack(observations if terminal else [*observations, last_obs])
    for episode in split.episodes(obs, np.stack(actions), np.asarray(rewards), terminal):
        buffer.append_episode(episode)


def _load_weights(algo, path: str, device: str) -> None:
    """Copy a saved d3rlpy model's weights and optimizer states into ``algo`` (``init_from``).
    d3rlpy's ``.d3`` files are pickles: load only models you trust."""
    import d3rlpy

    if not Path(path).is_file():
        raise TrainingError(f"init_from: no model file {path}; give a d3rlpy model.d3 of the same algorithm")
    src = d3rlpy.load_learnable(str(path), device=device)
    if type(src) is not type(algo):
        raise TrainingError(f"init_from: {path} is a {type(src).__name__}, this run trains a {type(algo).__name__}")
    import io

    buf = io.BytesIO()
    src.impl.save_model(buf)  # networks and optimizer states
    buf.seek(0)
    try:
        algo.impl.load_model(buf)  # shapes checked by torch
    except RuntimeError as exc:
        raise TrainingError(f"init_from: {path} does not fit this run's networks ({str(exc).splitlines()[0]})") from exc


def _act(cfg: AutTrainConfig, env, algo, explorer, obs, step: int, epoch: int, split: AgentSplit | None = None):
    """Uniformly random during the first run's warm-up (the loaded policy's actions with
    ``init_from``), then the explorer (ddqn) or the stochastic policy (sac); with ``split``, the
    per-agent policy samples every agent's action in one call."""
    x = obs[None].astype(np.float32)
    if step <= cfg.warmup_steps and epoch == 0 and not cfg.init_from:
        return env.action_space.sample()
    if explorer is not None:
        return explorer.sample(algo, x, step)[0]
    if split is not None:
        return shared_actions(algo.sample_action, split)(x)[0]
    return algo.sample_action(x)[0]


def _update(algo, buffer, n_updates: int, losses: dict) -> None:
    """``n_updates`` gradient steps on minibatches of the buffer; their losses go to ``losses``."""
    for _ in range(n_updates):
        for k, v in algo.update(buffer.sample_transition_batch(algo.batch_size)).items():
            losses.setdefault(k, []).append(float(v))


def _end_epoch(cfg: AutTrainConfig, out: Path, scenario, algo, buffer, state: dict, step: int, dt: float,
               recent_returns: list, losses: dict) -> tuple[dict, Path]:
    """Count the epoch in ``state``, evaluate the greedy policy, keep it as ``best.d3`` when it is
    the best so far, write the checkpoint; returns the epoch's metrics and the checkpoint."""
    state["epoch"] += 1
    state["step"] = step
    state["grad_steps"] = int(algo.grad_step)
    state["wall_seconds"] += dt
    metrics = {
        "epoch": state["epoch"],
        "step": step,
        "train_return": float(np.mean(recent_returns)) if recent_returns else float("nan"),
        "episodes": state["episodes"],
        "steps_per_second": (step - state["history"][-1]["step"] if state["history"] else step) / max(dt, 1e-9),
        **{k: float(np.mean(v)) for k, v in losses.items()},
        **evaluate_algo(algo, scenario, cfg.eval_episodes, seed=10_000 + cfg.seed, split=cfg.agent_split(scenario)),
    }
    state["history"].append(metrics)
    best = state.get("best")
    if cfg.select is not None:
        # keep the epoch closest to the asked-for quality (e.g. the paper's AUT, not the strongest)
        d = selection_distance(metrics, cfg.select)
        keep = best is None or d < best.get("distance", float("inf"))  # (a resumed run that had no select)
        chosen = {"epoch": state["epoch"], "step": step, "eval_return": metrics["eval_return"],
                  "eval_success_rate": 1.0 - metrics["eval_failure_rate"], "distance": d,
                  "rule": f"closest to return {cfg.select['return']}, success {cfg.select['success']}"}
    else:
        # keep the best greedy policy seen so far (DQN's return can swing between epochs)
        keep = best is None or metrics["eval_return"] > best["eval_return"]
        chosen = {"epoch": state["epoch"], "step": step, "eval_return": metrics["eval_return"]}
    if keep:
        state["best"] = chosen
        tmp = out / f".best.d3.tmp-{os.getpid()}"
        algo.save(str(tmp))
        os.replace(tmp, out / "best.d3")
    return metrics, _write_checkpoint(out, state["epoch"], algo, buffer, state)


def export_aut_policy(algo, cfg: AutTrainConfig, path: str | os.PathLike) -> dict | None:
    """Write the deployable TorchScript policy of a trained AUT (``policy.pt``): d3rlpy's
    ``save_policy`` graph, or with ``shared_agents`` the joint graph that applies the per-agent
    greedy actor to each agent's slice and concatenates the actions (the scenario's observation
    and action sizes declared in its ``deltarl.json`` extra file). Returns None for a plain agent,
    else what the card should say about the shared policy."""
    scenario = cfg.validate()
    split = cfg.agent_split(scenario)
    if split is None:
        algo.save_policy(str(path))
        return None
    import warnings

    import torch

    from workers.policies.base import _META_NAME

    spec = scenario.action
    meta = {"kind": "continuous", "obs_dim": int(scenario.obs_dim), "shape": [int(d) for d in spec.shape],
            "low": None if spec.low is None else np.asarray(spec.low, dtype=float).ravel().tolist(),
            "high": None if spec.high is None else np.asarray(spec.high, dtype=float).ravel().tolist()}
    # the graph's constants are the weights themselves: they must be out of autograd while it is
    # traced and saved (TorchScript cannot load a constant that requires grad), as in save_policy
    with _out_of_autograd(algo):
        graph = traced_greedy(algo, split)
        if graph is None:
            raise TrainingError(f"{type(algo).__name__}'s greedy policy does not trace to TorchScript: shared_agents "
                                f"needs one (train it with algo sac)")
        with warnings.catch_warnings():  # torch.jit.save's deprecation note
            warnings.simplefilter("ignore")
            torch.jit.save(graph, str(path), _extra_files={_META_NAME: json.dumps(meta)})
    return {
        "agents": split.agents, "observation_per_agent": split.obs_dim, "action_per_agent": split.act_dim,
        "note": (f"parameter sharing: model.d3 is the per-agent {type(algo).__name__} ({split.obs_dim} -> "
                 f"{split.act_dim}, agent i's slice of the observation); policy.pt applies its greedy actor to each "
                 f"of the {split.agents} agents' slices and concatenates the actions "
                 f"({split.agents * split.obs_dim} -> {split.agents * split.act_dim}): deploy and test policy.pt"),
    }


def _finish(out: Path, algo, state: dict) -> None:
    """``final.d3`` (the last policy), ``model.d3`` (the best epoch by evaluation, the final one
    if it is the best: the policy to ship) and ``training.json``."""
    algo.save(str(out / "final.d3"))
    shutil.copyfile(out / "best.d3" if (out / "best.d3").is_file() else out / "final.d3", out / "model.d3")
    (out / "training.json").write_text(json.dumps(state, indent=2))


def quiet_d3rlpy() -> None:
    """d3rlpy logs every model build at INFO through structlog; keep warnings only."""
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


