"""``shared_agents``: one per-agent policy trained for every agent of a scenario (CoopNavi: 3 x 14 -> 3 x 2),
shipped as a policy for the joint observation."""

from __future__ import annotations

import numpy as np
import pytest

from envs import get_scenario
from workers.training import AutTrainConfig, TrainingError, latest_checkpoint, train_aut

HIDDEN = {"type": "vector", "params": {"hidden_units": [32, 32]}}


def tiny(**kw):
    base = dict(scenario="CoopNavi", algo="sac", steps=200, steps_per_epoch=100, warmup_steps=50, buffer_size=5000,
                eval_episodes=2, device="cpu:0", episode_end="truncated", shared_agents=3,
                hyperparameters={"batch_size": 16, "actor_encoder_factory": HIDDEN, "critic_encoder_factory": HIDDEN})
    base.update(kw)
    return AutTrainConfig(**base)


def _per_agent_sac(seed=0):
    """A freshly built per-agent SAC (14 -> 2) with random weights, as shared_agents trains it."""
    import d3rlpy

    from workers.training import make_algo

    cfg = tiny()
    split = cfg.agent_split(cfg.validate())
    d3rlpy.seed(seed)
    algo = make_algo(cfg, "cpu:0")
    algo.build_with_env(split.spaces())
    return cfg, algo


def test_shipped_policy_is_the_per_agent_actor_on_each_slice(tmp_path):
    import torch

    from workers.policies import load_policy
    from workers.training import export_aut_policy

    cfg, algo = _per_agent_sac()
    assert algo.impl.observation_shape == (14,) and algo.impl.action_size == 2
    note = export_aut_policy(algo, cfg, tmp_path / "policy.pt")
    assert note["agents"] == 3 and note["observation_per_agent"] == 14 and note["action_per_agent"] == 2
    assert "model.d3 is the per-agent SAC" in note["note"]

    obs = np.random.default_rng(7).normal(scale=1.0, size=(17, 42)).astype(np.float32)
    slices = [obs[:, 14 * i:14 * (i + 1)] for i in range(3)]  # agent i's own observation

    def actor_on_slices(rows):
        """The 14 -> 2 actor on every agent slice of ``rows`` (one batch: agent 0, 1, 2 of row 0, then
        of row 1, ...), the actions put back as (u_x, u_y) of agents 0, 1, 2."""
        stacked = np.stack([rows[:, 14 * i:14 * (i + 1)] for i in range(3)], axis=1).reshape(-1, 14)
        acts = np.asarray(algo.predict(stacked)).reshape(len(rows), 3, 2)
        return np.concatenate([acts[:, i] for i in range(3)], axis=1)

    want = actor_on_slices(obs)
    assert want.shape == (17, 6)
    assert not np.allclose(want[:, 0:2], want[:, 2:4])  # the agents' actions differ: a mix-up would show

    graph = torch.jit.load(str(tmp_path / "policy.pt"))
    with torch.inference_mode():
        got = graph(torch.from_numpy(obs)).numpy()
    np.testing.assert_array_equal(got, want)
    # the actor called on each agent's slice by itself: the same actions up to the float rounding of
    # another batch shape (matrix kernels sum in another order)
    per_slice = np.concatenate([algo.predict(s.copy()) for s in slices], axis=1)
    np.testing.assert_allclose(got, per_slice, rtol=0, atol=1e-6)
    # one observation at a time (as deployed): the actor on that observation's three slices
    with torch.inference_mode():
        for j in range(len(obs)):
            np.testing.assert_array_equal(graph(torch.from_numpy(obs[j:j + 1].copy())).numpy(),
                                          actor_on_slices(obs[j:j + 1]))

    # swapping two agents' observations swaps their actions
    swapped = obs.copy()
    swapped[:, 0:14], swapped[:, 14:28] = obs[:, 14:28], obs[:, 0:14]
    with torch.inference_mode():
        got_sw = graph(torch.from_numpy(swapped)).numpy()
    np.testing.assert_array_equal(got_sw[:, 0:2], got[:, 2:4])
    np.testing.assert_array_equal(got_sw[:, 2:4], got[:, 0:2])
    np.testing.assert_array_equal(got_sw[:, 4:6], got[:, 4:6])

    # a normal deltarl policy for the 42 -> 6 scenario: declared sizes, checked at load
    pol = load_policy(str(tmp_path / "policy.pt"), get_scenario("CoopNavi"))
    assert pol.model_obs_dim == 42 and tuple(pol.model_action.shape) == (6,)
    np.testing.assert_array_equal(pol.act(obs), want)
    from workers.policies import PolicyError

    with pytest.raises(PolicyError, match="observations of size 42"):
        load_policy(str(tmp_path / "policy.pt"), get_scenario("Hopper-v5"))


@pytest.mark.training
def test_shared_training_writes_checkpoints_resumes_and_ships(tmp_path):
    import d3rlpy

    from orchestrator.campaign.cards import aut_card

    out = tmp_path / "shared"
    state = train_aut(tiny(), out)
    assert state["step"] == 200 and state["epoch"] == 2 and len(state["history"]) == 2
    assert state["grad_steps"] == 200 - 50  # one update per env step after the warm-up
    assert all(np.isfinite(m["eval_return"]) for m in state["history"])
    ck = latest_checkpoint(out)
    assert ck.name == "epoch-00002" and {p.name for p in ck.iterdir()} == {"model.d3", "buffer.h5", "state.json"}
    assert tuple(d3rlpy.load_learnable(str(out / "model.d3")).impl.observation_shape) == (14,)

    # the buffer: one episode per agent per joint episode (8 of 25 steps), every step a transition
    with open(ck / "buffer.h5", "rb") as f:
        buffer = d3rlpy.dataset.ReplayBuffer.load(f, d3rlpy.dataset.FIFOBuffer(5000))
    eps = buffer.episodes
    assert len(eps) == 3 * 8 and buffer.transition_count == 3 * 8 * 25
    assert not any(ep.terminated for ep in eps)  # episode_end: truncated
    for k in range(8):
        a, b, c = eps[3 * k:3 * k + 3]
        assert a.observations.shape == (26, 14) and a.actions.shape == (26, 2)  # + the final observation
        np.testing.assert_array_equal(a.rewards, b.rewards)  # the shared reward
        np.testing.assert_array_equal(a.rewards, c.rewards)
        # each is its agent's own view: agent 0 sees agent 1 at (p1 - p0), agent 1 sees agent 0 at (p0 - p1)
        p0, p1 = a.observations[:, 2:4], b.observations[:, 2:4]
        np.testing.assert_allclose(a.observations[:, 10:12], p1 - p0, atol=1e-5)
        np.testing.assert_allclose(b.observations[:, 10:12], p0 - p1, atol=1e-5)
        assert not np.allclose(a.actions[:25], b.actions[:25])

    # resume: counters and history continue from the checkpoint
    state2 = train_aut(tiny(steps=300), out, resume=True)
    assert state2["step"] == 300 and state2["epoch"] == 3 and state2["grad_steps"] == 250
    assert state2["history"][:2] == state["history"]
    assert latest_checkpoint(out).name == "epoch-00003"

    # a resume with another split is refused (the networks' input sizes differ)
    with pytest.raises(TrainingError, match="shared_agents 3, this config has None"):
        train_aut(tiny(steps=400, shared_agents=None), out, resume=True)

    # the card: policy.pt is the joint 42 -> 6 policy, evaluated on the scenario
    card = aut_card(out, tiny(steps=300), state2, get_scenario("CoopNavi"), eval_episodes=5)
    assert card["shared_agents"]["agents"] == 3 and "shared by 3 agents" in card["algorithm"]
    assert card["evaluation"]["episodes"] == 5 and np.isfinite(card["evaluation"]["mean_return"])
    assert set(card["files"]) == {"model.d3", "policy.pt"}


def test_a_bad_split_is_refused_with_the_fix():
    with pytest.raises(TrainingError, match=r"4 agents do not split CoopNavi's observation \(42\) and action \(6\) "
                                            r"into equal slices; set shared_agents to a number that divides both "
                                            r"\(2, 3, 6\)"):
        tiny(shared_agents=4).validate()
    with pytest.raises(TrainingError, match="no number of agents divides both"):
        tiny(scenario="Hopper-v5", shared_agents=3).validate()  # 11 and 3
    with pytest.raises(TrainingError, match="discrete actions .* remove shared_agents"):
        tiny(scenario="CartPole-v1", algo="ddqn", shared_agents=2).validate()
    for bad in (1, 0, True, 2.5, "3"):
        with pytest.raises(TrainingError, match="shared_agents must be a whole number >= 2"):
            tiny(shared_agents=bad).validate()
    tiny(shared_agents=None).validate()  # one policy for the whole observation
