"""A Stable-Baselines3 SAC as a d3rlpy SAC (workers/policies/sb3_to_d3rlpy.py): the real rl-zoo
Walker2d agent converts and acts and values as SB3 does, a broken copy is caught, CQL repair
accepts the converted model, and what cannot be converted faithfully is refused."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from workers.policies.sb3_to_d3rlpy import (
    GREEDY_ATOL,
    Q_ATOL,
    SB3ConversionError,
    check_sac_matches_sb3,
    load_sb3_model,
    probe_observations,
    sac_from_sb3,
    save_sac_from_sb3,
)

REPO = Path(__file__).resolve().parents[1]
WALKER = REPO / "experiments" / "zoo" / "Walker2d-v5-rlzoo"


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py


@pytest.fixture(scope="module")
def walker():
    """The zoo's Walker2d AUT as deltarl loads it (``zoo:Walker2d-v5``), and its d3rlpy SAC."""
    from workers.policies import load_policy
    from workers.training import quiet_d3rlpy

    quiet_d3rlpy()
    policy = load_policy("zoo:Walker2d-v5", device="cpu")
    assert type(policy).__name__ == "RLZooPolicy" and policy.normalizer is None
    return policy.model, sac_from_sb3(policy.model)


def _greedy_and_q(model, algo, x):
    """SB3's and d3rlpy's greedy actions, and each critic's Q-values of SB3's greedy actions."""
    a_sb3, _ = model.predict(x, deterministic=True)
    a_d3 = algo.predict(x)
    with torch.no_grad():
        scaled = torch.as_tensor(model.policy.scale_action(a_sb3))
        q_sb3 = [q.numpy() for q in model.critic(torch.as_tensor(x), scaled)]
        q_d3 = [q(torch.as_tensor(x), scaled).q_value.numpy() for q in algo.impl._modules.q_funcs]
    return a_sb3, a_d3, q_sb3, q_d3


def test_the_walker2d_agent_converts_to_an_equivalent_d3rlpy_sac(walker):
    import d3rlpy

    model, algo = walker
    assert isinstance(algo, d3rlpy.algos.SAC)
    c = algo.config
    assert c.actor_encoder_factory.hidden_units == [256, 256] == c.critic_encoder_factory.hidden_units
    assert c.actor_encoder_factory.activation == "relu" and c.n_critics == 2
    assert (c.gamma, c.tau, c.batch_size) == (model.gamma, model.tau, model.batch_size) == (0.99, 0.005, 256)
    assert c.actor_learning_rate == c.critic_learning_rate == pytest.approx(3e-4)
    assert c.action_scaler is None  # Walker2d's bounds are [-1, 1]: nothing to rescale
    # the temperature: d3rlpy keeps its log, as SB3 does
    log_temp = float(next(algo.impl._modules.log_temp.parameters()).item())
    assert log_temp == pytest.approx(float(model.log_ent_coef.item()), abs=1e-7)
    # greedy actions and both critics on seeded random observations (not the converter's own probes)
    x = np.random.default_rng(123).normal(scale=3.0, size=(256, 17)).astype(np.float32)
    a_sb3, a_d3, q_sb3, q_d3 = _greedy_and_q(model, algo, x)
    assert a_d3.shape == a_sb3.shape == (256, 6)
    assert np.max(np.abs(a_d3 - a_sb3)) <= GREEDY_ATOL
    assert len(q_d3) == len(q_sb3) == 2
    for qs, qd in zip(q_sb3, q_d3):
        assert qd.shape == qs.shape == (256, 1) and np.max(np.abs(qd - qs)) <= Q_ATOL
    assert not np.allclose(q_sb3[0], q_sb3[1])  # two different critics, each matched to its own
    # d3rlpy's public value: the mean of the critics
    # (Q-values of these far-out observations reach -4000, where float32's spacing is 5e-4: relative 1e-6)
    np.testing.assert_allclose(algo.predict_value(x, a_d3), np.mean(q_sb3, axis=0).ravel(), atol=Q_ATOL, rtol=1e-6)
    # the check reports its differences, all within tolerance on its own probes too
    diffs = check_sac_matches_sb3(model, algo, n_probes=256, seed=7)
    assert diffs["action"] <= GREEDY_ATOL and diffs["q"] <= Q_ATOL and diffs["target_q"] <= Q_ATOL


@pytest.mark.parametrize("where", ["actor", "critic", "target_critic", "temperature"])
def test_a_broken_conversion_fails_the_check(walker, where):
    import copy

    model, algo = walker
    broken = copy.deepcopy(algo)
    mods = broken.impl._modules
    with torch.no_grad():
        if where == "actor":
            mods.policy._mu.weight[2, 5] += 0.05
        elif where == "critic":
            mods.q_funcs[1]._encoder._layers[2].bias[0] += 0.5
        elif where == "target_critic":
            mods.targ_q_funcs[0]._fc.bias += 1e-3
        else:
            next(mods.log_temp.parameters()).add_(0.01)
    expected = {"actor": "mean differs", "critic": "q differs", "target_critic": "target_q differs",
                "temperature": "temperature differs"}[where]
    with pytest.raises(SB3ConversionError, match=expected):
        check_sac_matches_sb3(model, broken, probe_observations(model))
    check_sac_matches_sb3(model, algo)  # the original still passes


def test_cql_repair_accepts_the_converted_sac(walker):
    import d3rlpy

    from workers.repair import RepairConfig, cql_from_aut

    model, algo = walker
    x = probe_observations(model, 128, seed=3)
    cql = cql_from_aut(algo, RepairConfig(device="cpu:0", alpha=2.0), probe_obs=x)  # its own probe check
    assert isinstance(cql, d3rlpy.algos.CQL) and cql.config.conservative_weight == 2.0
    assert cql.config.critic_encoder_factory.hidden_units == [256, 256] and cql.config.n_critics == 2
    # still the rl-zoo agent: SB3's greedy actions and Q-values
    a_sb3, a_cql, q_sb3, q_cql = _greedy_and_q(model, cql, x)
    assert np.max(np.abs(a_cql - a_sb3)) <= GREEDY_ATOL
    for qs, qc in zip(q_sb3, q_cql):
        assert np.max(np.abs(qc - qs)) <= Q_ATOL


@pytest.mark.slow
def test_repair_converts_an_rlzoo_aut_and_saves_it(tmp_path):
    """The hook of ``deltarl repair``: the zoo's Walker2d AUT has no model.d3, so it is found as an
    SB3 model and saved as a loadable d3rlpy SAC that acts like it."""
    import d3rlpy

    from orchestrator.campaign.repair import SB3_AUT, aut_weights_path, sb3_aut_path
    from workers.training import TrainingError

    with pytest.raises(TrainingError, match="needs its d3rlpy model"):
        aut_weights_path("zoo:Walker2d-v5")
    src = sb3_aut_path("zoo:Walker2d-v5")
    assert src == WALKER / "Walker2d-v3.zip"
    assert sb3_aut_path(f"rlzoo:{WALKER}") == WALKER
    assert sb3_aut_path("python:workers.examples:cartpole_balancer") is None
    info = save_sac_from_sb3(src, tmp_path / "repair" / SB3_AUT)
    assert info["d3rlpy_model"] == str(tmp_path / "repair" / SB3_AUT) and (tmp_path / "repair" / SB3_AUT).is_file()
    assert info["max_abs_diff"]["action"] <= GREEDY_ATOL and info["max_abs_diff"]["q"] <= Q_ATOL
    loaded = d3rlpy.load_learnable(info["d3rlpy_model"], device="cpu:0")
    model = load_sb3_model(src)
    check_sac_matches_sb3(model, loaded, n_probes=128, seed=11)


def test_a_normalising_rlzoo_agent_is_refused(tmp_path):
    """VecNormalize: the converted networks would see raw observations, so no conversion."""
    agent = tmp_path / "sac" / "Walker2d-v3_1"
    shutil.copytree(WALKER, agent)
    cfg = agent / "Walker2d-v3" / "config.yml"
    cfg.write_text(cfg.read_text() + "  - - normalize\n    - true\n")  # a pair of the OrderedDict's list
    with pytest.raises(SB3ConversionError, match="normalises its observations"):
        load_sb3_model(agent)
    with pytest.raises(SB3ConversionError, match="normalises its observations"):
        load_sb3_model(agent / "Walker2d-v3.zip")


def test_other_layouts_convert_or_are_refused():
    """Action bounds other than [-1, 1] (a MinMaxActionScaler), a fixed entropy coefficient, three
    critics, other hidden sizes and tanh convert; gSDE, TD3 and an ELU network are refused."""
    import d3rlpy
    import gymnasium as gym
    import stable_baselines3 as sb3

    from workers.training import quiet_d3rlpy

    quiet_d3rlpy()
    env = gym.make("Pendulum-v1")  # actions in [-2, 2]
    model = sb3.SAC("MlpPolicy", env, ent_coef=0.2, gamma=0.95, tau=0.01, batch_size=64, learning_rate=1e-3,
                    policy_kwargs=dict(net_arch=dict(pi=[32], qf=[16, 16]), activation_fn=torch.nn.Tanh,
                                       n_critics=3), device="cpu", seed=0)
    with torch.no_grad():
        model.actor.mu.bias.fill_(1.0)  # greedy actions near 2 * tanh(1) = 1.5: outside [-1, 1] once rescaled
    algo = sac_from_sb3(model)
    c = algo.config
    assert isinstance(c.action_scaler, d3rlpy.preprocessing.MinMaxActionScaler)
    np.testing.assert_array_equal(c.action_scaler.minimum, [-2.0])
    np.testing.assert_array_equal(c.action_scaler.maximum, [2.0])
    assert c.actor_encoder_factory.hidden_units == [32] and c.critic_encoder_factory.hidden_units == [16, 16]
    assert c.n_critics == 3 and c.temp_learning_rate == 0.0 and c.actor_encoder_factory.activation == "tanh"
    assert (c.gamma, c.tau, c.batch_size, c.actor_learning_rate) == (0.95, 0.01, 64, 1e-3)
    x = probe_observations(model, 64, seed=5)
    a_sb3, _ = model.predict(x, deterministic=True)
    a_d3 = algo.predict(x)
    assert np.abs(a_sb3).max() > 1.0  # rescaled to [-2, 2], by both
    assert np.max(np.abs(a_d3 - a_sb3)) <= 2 * GREEDY_ATOL
    for kwargs, match in ((dict(use_sde=True), "gSDE"), (dict(policy_kwargs=dict(activation_fn=torch.nn.ELU)), "ELU")):
        with pytest.raises(SB3ConversionError, match=match):
            sac_from_sb3(sb3.SAC("MlpPolicy", env, device="cpu", **kwargs))
    with pytest.raises(SB3ConversionError, match="only a Stable-Baselines3 SAC"):
        sac_from_sb3(sb3.TD3("MlpPolicy", env, device="cpu"))
