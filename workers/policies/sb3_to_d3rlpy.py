"""A Stable-Baselines3 SAC as the equivalent d3rlpy ``SAC`` (so that repair can fine-tune it).

    algo = sac_from_sb3_file("experiments/zoo/Walker2d-v5-rlzoo")   # rl-zoo folder / .zip, or an SB3 .zip
    algo = sac_from_sb3(sb3_model)                                   # an SB3 SAC already loaded
    algo.save("aut_from_sb3.d3")

The d3rlpy SAC is built with the SB3 model's networks and holds copies of its weights:

* ``actor.latent_pi`` (Linear, activation, ...) -> ``policy._encoder._layers`` (d3rlpy's
  ``NormalPolicy`` over a ``VectorEncoder``); ``actor.mu`` / ``actor.log_std`` -> ``policy._mu`` /
  ``policy._logstd``;
* ``critic.qf{i}`` (Linear, activation, ..., Linear) -> ``q_funcs[i]._encoder._layers`` and
  ``q_funcs[i]._fc`` (a ``ContinuousMeanQFunction`` over a ``VectorEncoderWithAction``, which
  takes ``cat([obs, action])``, the order of SB3's ``ContinuousCritic``); ``critic_target.qf{i}``
  -> ``targ_q_funcs[i]``;
* ``log_ent_coef`` (or the log of a fixed ``ent_coef``, then with temperature learning rate 0)
  -> ``log_temp``: d3rlpy's temperature is ``log_temp.exp()``, a log as SB3's.

Both act greedily with ``tanh(mean)`` (SB3's squashed Gaussian ``mode``; d3rlpy's
``squashed_mu``) and clip the log-std to [-20, 2] for sampling. SB3 policies output in [-1, 1]
and ``predict`` rescales to the action space's bounds; the d3rlpy model does the same with a
``MinMaxActionScaler`` of those bounds (none when they are [-1, 1]), and its critics see
[-1, 1] actions as SB3's do. Settings taken from the SB3 model: gamma, tau, batch size, the
learning rates (from its optimisers), the number of critics, the hidden sizes and activation.

Every conversion is checked (:func:`check_sac_matches_sb3`) on seeded probe observations: greedy
actions equal to SB3's ``predict(obs, deterministic=True)`` within 1e-5 (times the action range
when it is wider than 2), the critics' and target critics' Q-values equal to SB3's ``critic`` /
``critic_target`` within 1e-4, d3rlpy's ``predict_value`` (the critics' mean, of actions in the
environment's bounds) within 1e-4 + 1e-6 |Q| (float32 sums of Q-values in the thousands round
apart), the mean and log-std of the Gaussian and the temperature; a mismatch raises
:class:`SB3ConversionError`.

Refused, with a message (:class:`SB3ConversionError`): anything but an SB3 ``SAC`` (TD3, DDPG,
sb3-contrib's TQC / CrossQ...), gSDE (``use_sde``), a features extractor other than
``FlattenExtractor`` of a 1-D Box (CNN / Dict / custom extractors), an empty ``net_arch``, an
activation d3rlpy lacks (ELU, LeakyReLU...), infinite action bounds, and rl-zoo agents trained on
normalised observations (``normalize`` in ``config.yml``: the d3rlpy model would see raw
observations and act differently). Training-only settings d3rlpy's SAC has no field for are not
carried over: SB3's ``target_entropy`` (d3rlpy uses ``-action_size``, SB3's ``"auto"`` default
too), ``target_update_interval`` and ``gradient_steps``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import torch

from workers.policies.base import PolicyError

GREEDY_ATOL = 1e-5  # actions in [-1, 1]; scaled by half the range of wider bounds
Q_ATOL = 1e-4  # each critic against SB3's on the same inputs (the same operations: 0 in practice)
VALUE_RTOL = 1e-6  # d3rlpy's predict_value (mean of the critics, actions through the scaler) vs SB3's mean
N_PROBES = 64

# torch activation class name -> d3rlpy's VectorEncoderFactory activation
_ACTIVATIONS = {"ReLU": "relu", "Tanh": "tanh", "GELU": "gelu", "SiLU": "swish"}


class SB3ConversionError(PolicyError):
    """The SB3 model cannot be converted, or the converted model does not act like it."""


# ---------------------------------------------------------------------------------------------
# the SB3 networks
# ---------------------------------------------------------------------------------------------
def _mlp(seq: torch.nn.Sequential, what: str, *, last_linear: bool) -> tuple[list, list[int], str | None]:
    """The Linear layers of an SB3 ``create_mlp`` stack, their hidden sizes and the activation.

    ``last_linear``: the stack ends with an output Linear (critics) rather than an activation
    (the actor's ``latent_pi``)."""
    layers = list(seq)
    linears = [m for m in layers if isinstance(m, torch.nn.Linear)]
    acts = [m for m in layers if not isinstance(m, torch.nn.Linear)]
    names = {type(a).__name__ for a in acts}
    hidden = linears[:-1] if last_linear else linears
    if not hidden:
        raise SB3ConversionError(f"{what} has no hidden layer (an empty net_arch); d3rlpy's vector encoders need "
                                 f"at least one hidden layer")
    # Linear, act, Linear, act, ... [Linear]: the layout d3rlpy's VectorEncoder builds
    expect = [torch.nn.Linear, None] * len(hidden) + ([torch.nn.Linear] if last_linear else [])
    ok = len(layers) == len(expect) and all(
        isinstance(m, torch.nn.Linear) if e is torch.nn.Linear else not isinstance(m, torch.nn.Linear)
        for m, e in zip(layers, expect))
    if not ok or len(names) != 1:
        raise SB3ConversionError(f"{what} is not a plain MLP (Linear and one activation alternating): {seq}")
    name = names.pop()
    if name not in _ACTIVATIONS:
        raise SB3ConversionError(f"{what} uses the activation {name}, which d3rlpy's encoders do not have "
                                 f"(they have {', '.join(sorted(_ACTIVATIONS))})")
    return linears, [int(m.out_features) for m in hidden], _ACTIVATIONS[name]


def _refuse_unsupported(model) -> None:
    try:
        import stable_baselines3 as sb3
    except ImportError as e:  # pragma: no cover - an SB3 model was given
        raise SB3ConversionError("converting an SB3 model needs stable-baselines3") from e
    from gymnasium import spaces

    if not isinstance(model, sb3.SAC):
        raise SB3ConversionError(f"only a Stable-Baselines3 SAC converts to a d3rlpy SAC; this agent is a "
                                 f"{type(model).__module__}.{type(model).__name__}")
    policy = model.policy
    if getattr(model, "use_sde", False) or getattr(policy.actor, "use_sde", False):
        raise SB3ConversionError("the SAC uses gSDE (use_sde: true): its exploration noise and log-std "
                                 "parameters have no counterpart in d3rlpy's SAC")
    if not isinstance(model.action_space, spaces.Box) or len(model.action_space.shape) != 1:
        raise SB3ConversionError(f"the SAC's action space is {model.action_space}; expected a 1-D Box")
    if not isinstance(model.observation_space, spaces.Box) or len(model.observation_space.shape) != 1:
        raise SB3ConversionError(f"the SAC observes {model.observation_space}; only flat (1-D Box) observations "
                                 f"convert (d3rlpy's vector encoders)")
    for part in (policy.actor, policy.critic, policy.critic_target):
        fe = getattr(part, "features_extractor", None)
        if type(fe).__name__ != "FlattenExtractor":
            raise SB3ConversionError(f"the SAC's {type(part).__name__} has the features extractor "
                                     f"{type(fe).__name__}; only MlpPolicy's FlattenExtractor converts")
    low, high = np.asarray(model.action_space.low, np.float64), np.asarray(model.action_space.high, np.float64)
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high)) and np.all(high > low)):
        raise SB3ConversionError(f"the SAC's action bounds [{low}, {high}] are not finite and increasing; "
                                 f"SB3 rescales tanh outputs to them, d3rlpy cannot")


def _lr(optimizer, fallback) -> float:
    try:
        lr = float(optimizer.param_groups[0]["lr"])
    except (AttributeError, IndexError, KeyError, TypeError, ValueError):
        lr = 0.0
    if lr > 0:
        return lr
    return float(fallback) if isinstance(fallback, (int, float)) and fallback > 0 else 3e-4


def _log_temperature(model) -> float:
    log_ent = getattr(model, "log_ent_coef", None)
    if log_ent is not None:  # learned ("auto")
        return float(log_ent.detach().reshape(-1)[0].cpu())
    fixed = getattr(model, "ent_coef_tensor", None)
    value = float(fixed.detach().reshape(-1)[0].cpu()) if fixed is not None else float(model.ent_coef)
    if not value > 0:
        raise SB3ConversionError(f"the SAC's entropy coefficient is {value}; d3rlpy's temperature is exp(log), > 0")
    return math.log(value)


# ---------------------------------------------------------------------------------------------
# the conversion
# ---------------------------------------------------------------------------------------------
def sac_from_sb3(model, *, device: str = "cpu:0", probe_obs: np.ndarray | None = None,
                 n_probes: int = N_PROBES, seed: int = 0):
    """A built d3rlpy ``SAC`` equivalent to the SB3 SAC ``model`` (module docstring), checked on
    ``probe_obs`` (default: ``n_probes`` seeded random observations) by :func:`check_sac_matches_sb3`.

    The model is fed the observations as they are: for an rl-zoo agent trained with VecNormalize
    use :func:`sac_from_sb3_file`, which refuses it."""
    return _convert(model, device, probe_obs, n_probes, seed)[0]


def _convert(model, device, probe_obs, n_probes, seed):
    import d3rlpy

    _refuse_unsupported(model)
    policy = model.policy
    actor, critic, target = policy.actor, policy.critic, policy.critic_target
    pi_linears, pi_hidden, pi_act = _mlp(actor.latent_pi, "the actor's latent_pi", last_linear=False)
    nets = list(critic.q_networks)
    tnets = list(target.q_networks)
    if not nets or len(tnets) != len(nets):
        raise SB3ConversionError(f"the SAC has {len(nets)} critics and {len(tnets)} target critics")
    q_layouts = [_mlp(q, f"critic qf{i}", last_linear=True) for i, q in enumerate(nets)]
    tq_layouts = [_mlp(q, f"target critic qf{i}", last_linear=True) for i, q in enumerate(tnets)]
    q_hidden, q_act = q_layouts[0][1], q_layouts[0][2]
    if any((h, a) != (q_hidden, q_act) for _, h, a in q_layouts + tq_layouts):
        raise SB3ConversionError("the SAC's critics differ in shape or activation; d3rlpy's critics share one layout")

    obs_dim = int(model.observation_space.shape[0])
    act_dim = int(model.action_space.shape[0])
    low = np.asarray(model.action_space.low, np.float32)
    high = np.asarray(model.action_space.high, np.float32)
    scaler = None
    if not (np.all(low == -1.0) and np.all(high == 1.0)):
        scaler = d3rlpy.preprocessing.MinMaxActionScaler(minimum=low.copy(), maximum=high.copy())
    log_temp = _log_temperature(model)
    lr_actor = _lr(getattr(actor, "optimizer", None), getattr(model, "learning_rate", None))
    lr_critic = _lr(getattr(critic, "optimizer", None), lr_actor)
    learned_temp = getattr(model, "ent_coef_optimizer", None) is not None
    lr_temp = _lr(model.ent_coef_optimizer, lr_actor) if learned_temp else 0.0  # 0: d3rlpy keeps it fixed
    config = d3rlpy.algos.SACConfig(
        actor_encoder_factory=d3rlpy.models.VectorEncoderFactory(hidden_units=pi_hidden, activation=pi_act),
        critic_encoder_factory=d3rlpy.models.VectorEncoderFactory(hidden_units=q_hidden, activation=q_act),
        n_critics=len(nets), gamma=float(model.gamma), tau=float(model.tau), batch_size=int(model.batch_size),
        actor_learning_rate=lr_actor, critic_learning_rate=lr_critic, temp_learning_rate=lr_temp,
        initial_temperature=math.exp(log_temp), action_scaler=scaler,
    )
    algo = config.create(device=device)
    algo.create_impl((obs_dim,), act_dim)
    mods = algo.impl._modules

    def copy_linear(dst: torch.nn.Linear, src: torch.nn.Linear) -> None:
        if dst.weight.shape != src.weight.shape:
            raise SB3ConversionError(f"layer shapes differ: d3rlpy {tuple(dst.weight.shape)}, "
                                     f"SB3 {tuple(src.weight.shape)}")
        dst.weight.copy_(src.weight.detach())
        dst.bias.copy_(src.bias.detach())

    def copy_q(dst, layout) -> None:
        linears = layout[0]
        enc = [m for m in dst._encoder._layers if isinstance(m, torch.nn.Linear)]
        if len(enc) != len(linears) - 1:
            raise SB3ConversionError(f"d3rlpy built {len(enc)} critic layers for SB3's {len(linears) - 1}")
        for d, s in zip(enc + [dst._fc], linears):
            copy_linear(d, s)

    with torch.no_grad():
        enc = [m for m in mods.policy._encoder._layers if isinstance(m, torch.nn.Linear)]
        if len(enc) != len(pi_linears):
            raise SB3ConversionError(f"d3rlpy built {len(enc)} actor layers for SB3's {len(pi_linears)}")
        for d, s in zip(enc, pi_linears):
            copy_linear(d, s)
        copy_linear(mods.policy._mu, actor.mu)
        if not isinstance(actor.log_std, torch.nn.Linear) or not isinstance(mods.policy._logstd, torch.nn.Linear):
            raise SB3ConversionError("the actor's log-std is not a Linear head (state-independent std)")
        copy_linear(mods.policy._logstd, actor.log_std)
        for q, layout in zip(mods.q_funcs, q_layouts):
            copy_q(q, layout)
        for q, layout in zip(mods.targ_q_funcs, tq_layouts):
            copy_q(q, layout)
        next(mods.log_temp.parameters()).fill_(log_temp)
    return algo, check_sac_matches_sb3(model, algo, probe_obs, n_probes=n_probes, seed=seed)


def probe_observations(model, n: int = N_PROBES, seed: int = 0) -> np.ndarray:
    """``n`` seeded observations: uniform in the observation space's finite bounds, else standard
    normal scaled by 2 (the spread of MuJoCo joint positions and velocities)."""
    rng = np.random.default_rng(seed)
    shape = (n, *model.observation_space.shape)
    low = np.asarray(model.observation_space.low, np.float64)
    high = np.asarray(model.observation_space.high, np.float64)
    x = rng.normal(scale=2.0, size=shape)
    finite = np.isfinite(low) & np.isfinite(high)
    if finite.any():
        u = rng.uniform(np.where(finite, low, 0.0), np.where(finite, high, 1.0), size=shape)
        x = np.where(finite, u, x)
    return x.astype(np.float32)


def check_sac_matches_sb3(model, algo, probe_obs: np.ndarray | None = None, *, n_probes: int = N_PROBES,
                          seed: int = 0) -> dict:
    """Raise :class:`SB3ConversionError` unless the d3rlpy ``algo`` acts and values like the SB3 SAC
    ``model`` on the probes; returns the largest absolute differences found."""
    x = probe_observations(model, n_probes, seed) if probe_obs is None else np.asarray(probe_obs, np.float32)
    x = x.reshape(len(x), -1)
    policy = model.policy
    policy.set_training_mode(False)
    sb3_dev = policy.device
    low = np.asarray(model.action_space.low, np.float64)
    high = np.asarray(model.action_space.high, np.float64)
    act_tol = GREEDY_ATOL * max(1.0, float(np.max(high - low)) / 2.0)
    mods = algo.impl._modules
    d3_dev = next(mods.policy.parameters()).device
    with torch.no_grad():
        a_sb3, _ = model.predict(x, deterministic=True)
        a_d3 = np.asarray(algo.predict(x))
        obs_sb3 = torch.as_tensor(x, device=sb3_dev)
        obs_d3 = torch.as_tensor(x, device=d3_dev)
        mean, log_std, _ = policy.actor.get_action_dist_params(obs_sb3)
        out = mods.policy(obs_d3)
        # critics on actions in [-1, 1] (what SB3's critics and d3rlpy's q_funcs see), greedy and random
        rng = np.random.default_rng(seed + 1)
        scaled = np.concatenate([np.tanh(mean.cpu().numpy()),
                                 rng.uniform(-1, 1, (len(x), int(model.action_space.shape[0])))]).astype(np.float32)
        xx = np.concatenate([x, x])
        q_sb3 = [q.cpu().numpy() for q in policy.critic(torch.as_tensor(xx, device=sb3_dev),
                                                        torch.as_tensor(scaled, device=sb3_dev))]
        tq_sb3 = [q.cpu().numpy() for q in policy.critic_target(torch.as_tensor(xx, device=sb3_dev),
                                                                torch.as_tensor(scaled, device=sb3_dev))]
        xt, at = torch.as_tensor(xx, device=d3_dev), torch.as_tensor(scaled, device=d3_dev)
        q_d3 = [q(xt, at).q_value.cpu().numpy() for q in mods.q_funcs]
        tq_d3 = [q(xt, at).q_value.cpu().numpy() for q in mods.targ_q_funcs]
        # d3rlpy's public value (mean of the critics) of actions in the environment's bounds
        env_actions = (low + 0.5 * (scaled.astype(np.float64) + 1.0) * (high - low)).astype(np.float32)
        v_d3 = np.asarray(algo.predict_value(xx, env_actions))
        temp_d3 = float(next(mods.log_temp.parameters()).exp().reshape(-1)[0].cpu())
    temp_sb3 = math.exp(_log_temperature(model))

    def gap(a, b) -> float:
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        return float(np.max(np.abs(a - b))) if a.shape == b.shape else float("inf")

    def gaps(xs, ys) -> float:
        return max(gap(a, b) for a, b in zip(xs, ys)) if len(xs) == len(ys) else float("inf")

    v_sb3 = np.mean(q_sb3, axis=0).reshape(-1)
    diffs = {
        "action": gap(a_sb3, a_d3), "mean": gap(mean.cpu(), out.mu.cpu()), "log_std": gap(log_std.cpu(), out.logstd.cpu()),
        "q": gaps(q_sb3, q_d3), "target_q": gaps(tq_sb3, tq_d3), "value": gap(v_sb3, v_d3),
        "temperature": abs(temp_sb3 - temp_d3), "probes": int(len(x)),
    }
    limits = {"action": act_tol, "mean": GREEDY_ATOL, "log_std": GREEDY_ATOL, "q": Q_ATOL, "target_q": Q_ATOL,
              "temperature": 1e-6 * max(1.0, temp_sb3)}
    bad = [f"{k} differs by {diffs[k]:.3g} (> {v:.0e})" for k, v in limits.items() if not diffs[k] <= v]
    # the mean of the critics through d3rlpy's predict_value: float32 sums of large Q-values round apart
    if not (v_d3.shape == v_sb3.shape and np.all(np.abs(v_d3 - v_sb3) <= Q_ATOL + VALUE_RTOL * np.abs(v_sb3))):
        bad.append(f"value (predict_value) differs by {diffs['value']:.3g} (> {Q_ATOL:.0e} + {VALUE_RTOL:.0e} * |Q|)")
    if bad:
        raise SB3ConversionError(
            f"the d3rlpy SAC converted from the SB3 SAC does not reproduce it on {len(x)} probe observations: "
            f"{'; '.join(bad)}. The conversion is wrong for this model (its network differs from the "
            f"MlpPolicy layout the converter maps)")
    return diffs


# ---------------------------------------------------------------------------------------------
# from a file
# ---------------------------------------------------------------------------------------------
def load_sb3_model(path: str | os.PathLike):
    """The SB3 model of an rl-zoo agent (folder or ``.zip`` in rl-zoo's layout) or of a plain SB3
    ``.zip``, loaded on the CPU as deltarl loads it to test it. An rl-zoo agent trained on
    normalised observations (``normalize`` in its ``config.yml``) is refused."""
    from workers.policies.formats import SB3Policy
    from workers.policies.rlzoo import RLZooPolicy, _normalize_setting, find_agent, is_zoo_folder, stats_dir_for

    p = Path(os.path.abspath(os.path.expanduser(os.fspath(path))))
    if p.is_dir() or (p.suffix.lower() == ".zip" and stats_dir_for(p) is not None):
        if p.is_dir() and not is_zoo_folder(p):
            raise SB3ConversionError(f"{p}: not an rl-zoo agent folder (<env>.zip beside <env>/config.yml)")
        agent = find_agent(p)
        if _normalize_setting(agent.config):
            raise SB3ConversionError(
                f"{agent.folder}: the rl-zoo agent normalises its observations (normalize: "
                f"{agent.config.get('normalize')!r} in {agent.stats_dir}/config.yml, VecNormalize statistics in "
                f"{agent.stats_file or 'vecnormalize.pkl'}); a d3rlpy SAC converted from its networks would see raw "
                f"observations and act differently, so it is not converted")
        return RLZooPolicy(str(p), str(p), "cpu").model
    if p.suffix.lower() == ".zip" and p.is_file():
        return SB3Policy(str(p), str(p), "cpu").model
    raise SB3ConversionError(f"{p}: not a Stable-Baselines3 model (.zip) nor an rl-zoo agent folder")


def sac_from_sb3_file(path: str | os.PathLike, *, device: str = "cpu:0", probe_obs: np.ndarray | None = None):
    """:func:`sac_from_sb3` of the SB3 SAC at ``path`` (:func:`load_sb3_model`)."""
    return sac_from_sb3(load_sb3_model(path), device=device, probe_obs=probe_obs)


def save_sac_from_sb3(path: str | os.PathLike, dest: str | os.PathLike, *, device: str = "cpu:0") -> dict:
    """Convert the SB3 SAC at ``path`` and save the d3rlpy model to ``dest`` (``algo.save``,
    written to a temporary file first). Returns what was done: source, destination, the check's
    largest differences."""
    model = load_sb3_model(path)
    algo, diffs = _convert(model, device, None, N_PROBES, 0)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp")
    algo.save(str(tmp))
    tmp.replace(dest)
    return {"source": str(path), "d3rlpy_model": str(dest), "max_abs_diff": diffs}
