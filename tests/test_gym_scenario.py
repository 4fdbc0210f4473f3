"""Any Gymnasium environment as a scenario (envs/gym): specs, setters, oracles, the trust checks,
and the generic path against the hand-written simulators (issue 49)."""

from __future__ import annotations

import pickle

import gymnasium as gym
import numpy as np
import pytest

import envs.mujoco_envs  # noqa: F401 - imports mujoco (its glfw probe runs a process) at collection, not in a test
from envs import InvalidStateError, ScenarioError, get_scenario
from envs.gym import TrustError
from workers.policies import load_policy
from workers.rollout import rollout

TOY = "gym:tests.gym_toy_envs:"
WALK_STATE = [{"name": "x", "low": -0.5, "high": 0.5, "meaning": "position"},
              {"name": "v", "low": -0.3, "high": 0.3, "meaning": "velocity"}]
WALK = {"state": WALK_STATE, "setter": {"kind": "reset-options"}, "sampler": "uniform", "failure": {"info": "fell"},
        "max_steps": 30}
CARTPOLE_WIDE = np.array([2.0, 2.0, 0.2, 2.0])  # wider than the reset region: the zoo agent fails from part of it


class _Sway:
    """A black-box agent for the toy walk: pushes towards the centre, late (it overshoots from fast starts)."""

    @staticmethod
    def decide(obs):
        obs = np.asarray(obs, dtype=np.float32).reshape(-1, 2)
        return (obs[:, 0] - 0.5 * obs[:, 1] < 0).astype(np.int64)

    def act(self, obs):
        return self.decide(obs)


sway = _Sway()


def _wide_cartpoles():
    w = CARTPOLE_WIDE
    builtin = get_scenario("CartPole-v1", low=-w, high=w)
    state = [{"name": n, "low": -float(x), "high": float(x)} for n, x in zip(builtin.state_names, w)]
    return builtin, get_scenario("gym:CartPole-v1", spec={"state": state})


def test_cartpole_generic_path_gives_the_builtin_failures():
    """Same states, same agent (zoo:CartPole-v1): the same failures, returns and observations, bit for bit."""
    builtin, generic = _wide_cartpoles()
    assert generic.name == "gym:CartPole-v1" and generic.state_names == builtin.state_names
    states = builtin.sample_uniform(np.random.default_rng(0), 60)
    rb = rollout(builtin, load_policy("zoo:CartPole-v1", builtin), states, seed=3, max_steps=200)
    rg = rollout(generic, load_policy("zoo:CartPole-v1", generic), states, seed=3, max_steps=200)
    assert 0 < rb.failure.sum() < len(states)  # the comparison covers failing and passing episodes
    np.testing.assert_array_equal(rg.failure, rb.failure)
    np.testing.assert_array_equal(rg.returns, rb.returns)
    np.testing.assert_array_equal(rg.lengths, rb.lengths)
    np.testing.assert_array_equal(rg.obs, rb.obs)
    np.testing.assert_array_equal(rg.actions, rb.actions)


def test_hopper_spec_is_the_builtin_state_space_and_dynamics():
    builtin, generic = get_scenario("Hopper-v5"), get_scenario("gym:Hopper-v5")
    assert generic.state_names == builtin.state_names
    np.testing.assert_array_equal(generic.low, builtin.low)
    np.testing.assert_array_equal(generic.high, builtin.high)
    assert generic.inference_default == "alone"
    states = builtin.sample(np.random.default_rng(1), 4)
    rb = rollout(builtin, load_policy("random:0", builtin), states, max_steps=60)
    rg = rollout(generic, load_policy("random:0", generic), states, max_steps=60)
    np.testing.assert_array_equal(rg.obs, rb.obs)  # MuJoCo state: identical
    np.testing.assert_array_equal(rg.failure, rb.failure)
    np.testing.assert_allclose(rg.returns, rb.returns, rtol=0, atol=1e-7)  # the built-in sums rewards vectorized


def test_spaces_are_read_from_the_environment_and_checked_against_the_policy():
    acro = get_scenario("gym:Acrobot-v1")  # no spec file: the classic-control family, bounds from 256 resets
    assert acro.obs_dim == 6 and acro.action.discrete and acro.action.n == 3 and acro.max_steps == 500
    assert acro.describe()["bounds"] == "estimated from 256 resets"
    assert np.all(acro.low >= -0.1) and np.all(acro.high <= 0.1) and np.all(acro.high - acro.low > 0.19)
    with pytest.raises(Exception, match="obs|observation|input"):  # a CartPole agent has 4 inputs, Acrobot 6
        load_policy("zoo:CartPole-v1", acro)
    pend = get_scenario("gym:Pendulum-v1", spec={"failure": {"return_below": -1000}})
    assert not pend.action.discrete and pend.action.shape == (1,) and float(pend.action.high[0]) == 2.0


def test_reset_sampler_draws_the_environments_own_reset_distribution():
    acro = get_scenario("gym:Acrobot-v1")
    rng = np.random.default_rng(5)
    states = acro.sample(rng, 4)
    seeds = np.random.default_rng(5).integers(0, 2**31 - 1, size=4)
    env = gym.make("Acrobot-v1")
    for s, seed in zip(states, seeds):
        env.reset(seed=int(seed))
        np.testing.assert_array_equal(s, np.clip(env.unwrapped.state, acro.low, acro.high))


def test_spec_from_a_file_and_from_the_campaign(tmp_path, monkeypatch):
    (tmp_path / "tests.gym_toy_envs.Walk1D.yaml").write_text(
        "state:\n  - {name: x, low: -0.4, high: 0.4}\n  - {name: v, low: 0, high: 0}\n"
        "setter: reset-options\nsampler: uniform\nfailure: {info: fell}\nmax_steps: 20\n")
    monkeypatch.setenv("DELTARL_GYM_SPECS", str(tmp_path))
    sc = get_scenario(TOY + "Walk1D")
    assert sc.describe()["spec"].endswith("tests.gym_toy_envs.Walk1D.yaml") and sc.max_steps == 20
    assert list(sc.high) == [0.4, 0.0]
    over = get_scenario(TOY + "Walk1D", spec={"max_steps": 25}, mutation_scale=0.1)  # the campaign's keys win
    assert over.max_steps == 25 and over.mutation_scale == 0.1 and list(over.high) == [0.4, 0.0]
    assert over.version != sc.version  # the spec is part of the scenario's version (bugs store it)
    restored = pickle.loads(pickle.dumps(over))  # what Ray does to it
    r = rollout(restored, sway, restored.sample_uniform(np.random.default_rng(0), 3))
    assert r.n_episodes == 3


@pytest.mark.parametrize("spec, message", [
    ({"colour": 1}, "unknown spec key 'colour'"),
    ({"setter": "teleport"}, "teleport"),
    ({"setter": {"kind": "mujoco", "speed": 1}}, "setter mujoco has no option 'speed'"),
    ({"state": [{"name": "x", "low": 1, "high": 0}]}, "finite low <= high"),
    ({"failure": {"crashes": True}}, "failure must be"),
    ({"sampler": "reset"}, "cannot read it"),
    ({"sampler": "reset", "setter": {"function": "tests.gym_toy_envs:stale_reset_to",
                                     "state_of": "tests.gym_toy_envs:broken_state_of"}},
     "failed reading the state after the environment's own reset \\(RuntimeError: no state here\\); fix its state_of"),
])
def test_bad_specs_are_refused_with_the_reason(spec, message):
    with pytest.raises(ScenarioError, match=message):
        get_scenario(TOY + "Walk1D", spec={**WALK, **spec})


def test_an_environment_without_a_spec_or_family_asks_for_a_spec():
    with pytest.raises(ScenarioError, match="write a spec with a state and a setter"):
        get_scenario(TOY + "Walk1D")
    with pytest.raises(ScenarioError, match="gymnasium cannot make 'NoSuchEnv-v9'"):
        get_scenario("gym:NoSuchEnv-v9")
    with pytest.raises(ScenarioError, match="cannot import module 'no_such_module_49'.*PYTHONPATH"):
        get_scenario("gym:no_such_module_49:Walk1D")


def test_integer_dimensions_stay_integers():
    spec = {**WALK, "state": [{"name": "x", "low": -1, "high": 1, "integer": True}, WALK_STATE[1]]}
    sc = get_scenario(TOY + "Walk1D", spec=spec)
    rng = np.random.default_rng(0)
    for states in (sc.sample(rng, 50), sc.mutate(sc.sample(rng, 50), rng, scale=0.5),
                   sc.project(np.array([[0.4, 0.0], [-0.7, 0.1]]))):
        assert np.all(states[:, 0] == np.round(states[:, 0]))
    assert set(sc.sample(rng, 200)[:, 0]) == {-1.0, 0.0, 1.0}
    with pytest.raises(InvalidStateError, match="'x' = 0.5; it must be an integer"):
        sc.validate(np.array([[0.5, 0.0]]))


def _plain_walk(state, seed, max_steps):
    """The toy env alone, outside deltarl, the agent acting: per-step (obs, reward, terminated, truncated, info)."""
    from tests.gym_toy_envs import Walk1D

    env = Walk1D(max_steps=max_steps)
    obs, _ = env.reset(seed=int(seed), options={"state": state})
    out = []
    for _ in range(max_steps):
        step = env.step(int(_Sway.decide(obs)[0]))
        obs = step[0]
        out.append(step)
        if step[2] or step[3]:
            break
    return out


@pytest.mark.parametrize("failure", ["terminated", {"info": "fell"}, {"reward_below": -0.7},
                                     {"return_below": -11.0}, {"function": "tests.gym_toy_envs:far_out"}])
def test_failure_oracles_as_data(failure):
    sc = get_scenario(TOY + "Walk1D", spec={**WALK, "failure": failure})
    states = sc.sample_uniform(np.random.default_rng(2), 24)
    res = rollout(sc, sway, states, seed=9)
    for i, s in enumerate(states):
        steps = _plain_walk(s, res.seed[i], sc.max_steps)
        obs = [st[0] for st in steps]
        rew = [st[1] for st in steps]
        if failure == "terminated":  # terminated and not truncated (at the step limit both can hold)
            want_len, want = len(steps), bool(steps[-1][2] and not steps[-1][3])
        elif "info" in failure:
            want_len, want = len(steps), bool(steps[-1][4]["fell"])
        elif "return_below" in failure:
            want_len, want = len(steps), sum(rew) < -11.0
        else:
            hit = [k for k, (o, r) in enumerate(zip(obs, rew))
                   if (r < -0.7 if "reward_below" in failure else abs(o[0]) > 0.8)]
            want_len, want = (hit[0] + 1, True) if hit else (len(steps), False)
        assert (res.lengths[i], bool(res.failure[i])) == (want_len, want), (i, s)
        assert res.returns[i] == pytest.approx(sum(rew[:want_len]), abs=1e-12)
    assert 0 < res.failure.sum() < len(states)


# -- trust checks ---------------------------------------------------------------------------------


def test_a_state_that_cannot_be_set_is_refused():
    spec = {**WALK, "setter": "classic-control"}  # writes unwrapped.state, which Unsettable never reads
    with pytest.raises(TrustError, match="cannot be set: .*the episode is the same .*Fix: choose the setter"):
        get_scenario(TOY + "Unsettable", spec=spec)


def test_a_setter_that_returns_a_stale_observation_is_refused():
    spec = {**WALK, "setter": {"function": "tests.gym_toy_envs:stale_reset_to", "observe": "tests.gym_toy_envs:observe",
                               "state_of": "tests.gym_toy_envs:state_of"}}
    with pytest.raises(TrustError, match="not the environment's own observation"):
        get_scenario(TOY + "Walk1D", spec=spec)


def test_a_nondeterministic_environment_is_refused():
    with pytest.raises(TrustError, match="is not deterministic: .*same actions.*Fix: draw all randomness from the reset"):
        get_scenario(TOY + "Noisy", spec=WALK)


def test_copies_that_share_state_are_refused():
    with pytest.raises(TrustError, match="run in lockstep with others does not replay alone .*share state.*Fix"):
        get_scenario(TOY + "SharedState", spec=WALK)


@pytest.mark.parametrize("env, setter, message", [
    ("Noisy", "reset-options", "gym:tests.gym_toy_envs:Noisy is not deterministic"),
    ("Unsettable", "classic-control", "gym:tests.gym_toy_envs:Unsettable cannot be set"),
])
def test_refusals_exit_2_with_one_line(capsys, tmp_path, monkeypatch, env, setter, message):
    """An environment that is not deterministic, or whose state the setter cannot set: `deltarl rollout`
    prints one line naming the check and the fix, exits 2 and writes nothing."""
    _refused(capsys, tmp_path, monkeypatch, env, setter, message,
             ["rollout", "--scenario", TOY + env, "--policy", "random:0", "--episodes", "3", "--workers", "0",
              "--out", str(tmp_path / "run"), "--quiet"])


@pytest.mark.subprocess  # deltarl run starts MLflow's writer process early
@pytest.mark.parametrize("env, setter, message", [
    ("Noisy", "reset-options", "gym:tests.gym_toy_envs:Noisy is not deterministic"),
    ("Unsettable", "classic-control", "gym:tests.gym_toy_envs:Unsettable cannot be set"),
])
def test_a_campaign_on_a_refused_environment_exits_2_with_one_line(capsys, tmp_path, monkeypatch, env, setter,
                                                                   message):
    (tmp_path / "c.yaml").write_text(f"scenario: {TOY}{env}\naut: random:0\nworkers: 0\nmlflow: false\n"
                                     f"output: {tmp_path / 'run'}\nsafety: {{budget: {{episodes: 8}}}}\n")
    _refused(capsys, tmp_path, monkeypatch, env, setter, message, ["run", str(tmp_path / "c.yaml"), "--quiet"])


def _refused(capsys, tmp_path, monkeypatch, env, setter, message, argv):
    from orchestrator.cli import main

    (tmp_path / f"tests.gym_toy_envs.{env}.yaml").write_text(
        f"state: [{{name: x, low: -0.5, high: 0.5}}, {{name: v, low: 0, high: 0}}]\nsetter: {setter}\n"
        f"sampler: uniform\nmax_steps: 30\n")
    monkeypatch.setenv("DELTARL_GYM_SPECS", str(tmp_path))
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert message in err and "Fix:" in err, err
    assert not (tmp_path / "run").exists()


# -- whole campaigns ------------------------------------------------------------------------------


def _safety(tmp_path, scenario: str, name: str) -> tuple[dict, "object"]:
    import pandas as pd

    from orchestrator.campaign.config import load_campaign
    from orchestrator.campaign.safety import run_safety

    p = tmp_path / f"{name}.yaml"
    p.write_text(f"scenario: {scenario}\naut: zoo:CartPole-v1-ddqn-paper\nworkers: 0\nmlflow: false\nseed: 4\n"
                 f"output: {tmp_path / name}\n"
                 f"safety: {{fuzzer: mdpfuzz, budget: {{episodes: 120}}, generation_size: 40}}\n")
    summary = run_safety(load_campaign(p), progress=False)
    return summary, pd.read_parquet(tmp_path / name / "failures.parquet")


@pytest.mark.campaign
def test_a_safety_campaign_on_the_generic_cartpole_finds_the_builtin_failures(tmp_path):
    """The same campaign (fuzzer, seed, budget, agent) on CartPole-v1 and gym:CartPole-v1: the same failures."""
    sb, fb = _safety(tmp_path, "CartPole-v1", "builtin")
    sg, fg = _safety(tmp_path, "gym:CartPole-v1", "generic")
    assert sb["episodes"] == sg["episodes"] == 120
    assert sb["failures"] == sg["failures"] > 0
    np.testing.assert_array_equal(np.stack(fg["initial_state"]), np.stack(fb["initial_state"]))
    np.testing.assert_array_equal(fg["aut_return"].to_numpy(), fb["aut_return"].to_numpy())
    np.testing.assert_array_equal(fg["length"].to_numpy(), fb["length"].to_numpy())


def test_rollout_on_ray_actors_equals_in_process(tmp_path, capsys, ray_cluster):
    """Ray rollout actors each build gym:CartPole-v1 (and its trust checks) from its name: same episodes."""
    import pandas as pd

    from orchestrator.cli import main

    args = ["rollout", "--scenario", "gym:CartPole-v1", "--policy", "python:workers.examples:cartpole_balancer",
            "--episodes", "40", "--seed", "3", "--batch-size", "8", "--quiet"]
    for workers in ("0", "2"):
        assert main([*args, "--workers", workers, "--out", str(tmp_path / workers)]) == 0, capsys.readouterr().err
    a, b = (pd.read_parquet(tmp_path / w / "episodes").sort_values("initial_state", key=lambda s: s.map(tuple))
            for w in ("0", "2"))
    assert len(a) == len(b) == 40
    np.testing.assert_array_equal(a["return"].to_numpy(), b["return"].to_numpy())
    np.testing.assert_array_equal(a["length"].to_numpy(), b["length"].to_numpy())


# -- third-party environments: setters and agents ------------------------------------------------


def test_lunar_lander_setter_replays_gymnasiums_own_reset():
    """The state is the reset's random draws: given the draws of seed s, reset_to starts where reset(seed=s) does."""
    from gymnasium.utils import seeding

    from envs.gym.lunar_lander import FREE, reset_to

    sc = get_scenario("gym:LunarLander-v3")
    assert sc.state_dim == 9 and sc.action.n == 4 and sc.obs_dim == 8 and sc.max_steps == 1000
    for seed in (0, 7, 123):
        plain = gym.make("LunarLander-v3")
        want, _ = plain.reset(seed=seed)
        g, _ = seeding.np_random(seed)
        heights = g.uniform(0, 400 / 30 / 2, size=(12,))
        state = np.r_[heights[list(FREE)], g.uniform(-1000, 1000), g.uniform(-1000, 1000)]
        sc.validate(state)  # inside the spec's bounds: the support of the reset's draws
        np.testing.assert_array_equal(reset_to(gym.make("LunarLander-v3"), state, seed), want)


def test_minigrid_setter_places_the_balls():
    from envs.gym.minigrid import reset_to

    sc = get_scenario("gym:MiniGrid-Dynamic-Obstacles-6x6-v0")
    assert sc.obs_dim == 147 and sc.action.n == 3 and sc.integer_states
    env = sc.make_env()

    def balls():
        return sorted(tuple(int(v) for v in b.cur_pos) for b in env.unwrapped.obstacles)

    reset_to(env, [3, 1, 2, 4, 4, 2], seed=5)
    assert balls() == [(2, 4), (3, 1), (4, 2)]
    grid = env.unwrapped.grid
    assert sum(grid.get(x, y) is not None and grid.get(x, y).type == "ball" for x in range(6) for y in range(6)) == 3
    ref = sc.reference_env()  # what rendering steps: the policies' flat observations
    assert sc.reference_reset_to(ref, [3, 1, 2, 4, 4, 2], seed=5).shape == (147,)
    assert ref.step(2)[0].shape == (147,)
    reset_to(env, [1, 1, 1, 1, 4, 4], seed=5)  # the agent's cell, twice, the goal: the next free cells
    assert balls() == [(2, 1), (3, 1), (4, 1)]  # (4, 4) is the goal: reading order wraps to the top row


# -- campaigns on third-party environments: every failure replays in plain Gymnasium ---------------

THIRD_PARTY = {  # campaign file, SB3 class, the failure as plain Gymnasium shows it (last reward, last info),
    # the campaign's episodes and generation size (deterministic: seed 1 finds failures with these)
    "highway-v0": ("experiments/gym/highway-v0.yaml", "DQN", lambda r, info: bool(info["crashed"]), 40, 10),
    "MiniGrid-Dynamic-Obstacles-6x6-v0": ("experiments/gym/minigrid-dynamic-obstacles.yaml", "PPO",
                                          lambda r, info: r == -1.0, 100, 50),  # fails from 1.4% of random starts
    "LunarLander-v3": ("experiments/gym/lunar-lander.yaml", "DQN", lambda r, info: r == -100.0, 60, 20),
}


def _plain_episode(spec: dict, act, state, seed: int):
    """The environment from gymnasium.make (with the spec's imports, make arguments and observation
    wrappers, as the agent was trained), put into ``state`` by the spec's setter function, the agent
    (``act``: one observation -> one action) acting alone on each observation: (return, length, last
    reward, last info)."""
    import importlib

    from envs.gym.spec import import_target

    for m in spec.get("imports") or ():
        importlib.import_module(m)
    env = gym.make(spec["env"], **(spec.get("make") or {}))
    for w in spec.get("wrappers") or ():
        env = import_target(w, "wrapper")(env)
    setter = spec["setter"]
    obs = import_target(setter["function"] if isinstance(setter, dict) else setter, "setter")(
        env, np.asarray(state, dtype=np.float64), int(seed))
    total, length = 0.0, 0
    while True:
        obs, r, terminated, truncated, info = env.step(act(obs))
        total += float(r)
        length += 1
        if terminated or truncated:
            return total, length, float(r), info


@pytest.mark.campaign
@pytest.mark.slow
@pytest.mark.parametrize("env_id", list(THIRD_PARTY))
def test_failures_on_third_party_environments_replay_in_plain_gymnasium(tmp_path, env_id):
    """A small safety campaign with the scenario and agent of the environment's campaign file; every failure
    it reports replays in plain gymnasium.make(...) with the agent acting alone: the same failure, return
    and length."""
    import pandas as pd
    import stable_baselines3
    import yaml

    from envs.gym.spec import find_spec_file, read_spec_file
    from orchestrator.campaign.config import load_campaign
    from orchestrator.campaign.safety import run_safety
    from workers.rollout import episode_seeds

    campaign_file, algo, failed, episodes, generation = THIRD_PARTY[env_id]
    full = yaml.safe_load(open(campaign_file))
    p = tmp_path / "c.yaml"
    p.write_text(f"scenario: {full['scenario']}\naut: {full['aut']}\nworkers: 0\nmlflow: false\nseed: 1\n"
                 f"output: {tmp_path / 'run'}\n"
                 f"safety: {{fuzzer: mdpfuzz, budget: {{episodes: {episodes}}}, generation_size: {generation}}}\n")
    summary = run_safety(load_campaign(p), progress=False)
    failures = pd.read_parquet(tmp_path / "run" / "failures.parquet")
    assert summary["episodes"] == episodes and summary["failures"] == len(failures) > 0
    spec = read_spec_file(find_spec_file(env_id))
    agent = _plain_sb3_agent(getattr(stable_baselines3, algo).load(full["aut"], device="cpu"))
    for row in failures.itertuples():
        seed = episode_seeds(int(row.gen_seed), np.array([int(row.state_index)]), np.array([0]))[0]
        ret, length, last, info = _plain_episode(spec, agent, row.initial_state, seed)
        assert failed(last, info), (env_id, row.failure_id)
        assert length == row.length and ret == pytest.approx(row.aut_return, abs=1e-9), (env_id, row.failure_id)


def _plain_d3rlpy_agent(path):
    """A challenger (d3rlpy model file) acting alone on one observation: d3rlpy's own predict."""
    import d3rlpy

    algo = d3rlpy.load_learnable(str(path), device="cpu:0")
    return lambda obs: int(algo.predict(np.asarray(obs, dtype=np.float32).reshape(1, -1))[0])


def _plain_sb3_agent(model):
    return lambda obs: int(model.predict(np.asarray(obs, dtype=np.float32).reshape(-1), deterministic=True)[0])


@pytest.mark.campaign
@pytest.mark.training
@pytest.mark.slow
def test_highway_campaign_from_deltarl_run_replays_in_plain_gymnasium(tmp_path, capsys):
    """Issue 49's first 'Done when': experiments/gym/highway-v0.yaml (gym:highway-v0 with its state spec, the
    shipped SB3 DQN agent) with small budgets, safety, challenger and Delta, run by `deltarl run`; every
    failure and every bug it reports replays in plain gymnasium.make("highway-v0", config=...) with each
    agent acting alone (the AUT through SB3's predict, the challenger through d3rlpy's): the collision,
    the recorded returns and lengths, the challenger beating the AUT."""
    import pandas as pd
    import stable_baselines3
    import yaml

    from envs.gym.spec import find_spec_file, read_spec_file
    from orchestrator.cli import main
    from workers.rollout import episode_seeds

    full = yaml.safe_load(open("experiments/gym/highway-v0.yaml"))
    assert full["scenario"] == "gym:highway-v0" and {"safety", "challenger", "optimality"} <= set(full)
    small = {**full, "seed": 1, "workers": 0, "mlflow": False, "output": str(tmp_path / "run"),
             "safety": {**full["safety"], "budget": {"episodes": 20}, "generation_size": 10},
             "challenger": {**full["challenger"], "steps": 300, "eval_episodes": 2},
             "optimality": {**full["optimality"], "budget": {"episodes": 16}}}  # seed 1: 10 failures, 5 bugs
    p = tmp_path / "highway.yaml"
    p.write_text(yaml.safe_dump(small))
    assert main(["run", str(p), "--quiet", "--no-dashboard"]) == 0, capsys.readouterr().err
    run = tmp_path / "run"
    failures, bugs = pd.read_parquet(run / "failures.parquet"), pd.read_parquet(run / "bugs.parquet")
    summary = yaml.safe_load((run / "optimality_summary.json").read_text())
    assert len(failures) > 0 and len(bugs) == summary["bugs"] > 0 and summary["oracle"] == "differential"

    spec = read_spec_file(find_spec_file("highway-v0"))
    aut = _plain_sb3_agent(stable_baselines3.DQN.load(full["aut"], device="cpu"))
    challenger = _plain_d3rlpy_agent(run / summary["challenger"])

    def plain(agent, row):
        seed = episode_seeds(int(row.gen_seed), np.array([int(row.state_index)]), np.array([0]))[0]
        return _plain_episode(spec, agent, row.initial_state, seed)

    for row in failures.itertuples():
        ret, length, _, info = plain(aut, row)
        assert info["crashed"] and length == row.length, row.failure_id
        assert ret == pytest.approx(row.aut_return, abs=1e-9), row.failure_id
    for row in bugs.itertuples():
        (aut_ret, *_), (ca_ret, *_) = plain(aut, row), plain(challenger, row)
        assert aut_ret == pytest.approx(row.aut_return, abs=1e-9), row.bug_id
        assert ca_ret == pytest.approx(row.ca_return, abs=1e-6), row.bug_id
        assert ca_ret > aut_ret, row.bug_id  # the differential oracle's bug, seen in plain Gymnasium


def test_deltarl_scenarios_lists_the_gym_specs(capsys, tmp_path, monkeypatch):
    """`deltarl scenarios` lists every gym:<id> a spec file is found for (the shipped ones and those of
    $DELTARL_GYM_SPECS), from the spec's data: nothing imported or built; a broken spec is named, not fatal."""
    import json

    from orchestrator.cli import main

    (tmp_path / "tests.gym_toy_envs.Walk1D.yaml").write_text(
        "env: tests.gym_toy_envs:Walk1D\nstate:\n  - {name: x, low: -0.4, high: 0.4, meaning: where the point is}\n  - {name: v, low: 0, high: 0}\n"
        "setter: reset-options\nfailure: {info: fell}\ndescription: A point on a line.\n")
    (tmp_path / "Broken-v0.yaml").write_text("- not a mapping\n")
    monkeypatch.setenv("DELTARL_GYM_SPECS", str(tmp_path))
    assert main(["scenarios"]) == 0
    out = capsys.readouterr().out
    for name in ("gym:highway-v0", "gym:LunarLander-v3", "gym:MiniGrid-Dynamic-Obstacles-6x6-v0", "gym:CartPole-v1",
                 "gym:Hopper-v5", "gym:tests.gym_toy_envs:Walk1D"):
        assert f"\n{name}  (" in out, name
    assert "the ego vehicle collides with another vehicle within 20 s" in out and "needs highway_env" in out
    assert "ego_speed        [+20, +30]" in out and "A point on a line." in out and "where the point is" in out
    assert "gym:Broken-v0  (spec" in out and "must be a mapping" in out
    assert main(["scenarios", "--json"]) == 0
    infos = {i["name"]: i for i in json.loads(capsys.readouterr().out)}
    assert "CartPole-v1" in infos and infos["gym:highway-v0"]["kind"] == "gym"
    assert [d["name"] for d in infos["gym:highway-v0"]["state"]][:2] == ["ego_lane", "ego_speed"]
    assert infos["gym:highway-v0"]["state"][0]["integer"] and infos["gym:Hopper-v5"]["state_auto"]
    assert main(["scenarios", "--markdown"]) == 0
    assert "### gym:highway-v0" in capsys.readouterr().out


# -- LLMTester on the driving scenario (the CARLA stand-in) ----------------------------------------


def test_llmtester_prompt_carries_the_highway_scene():
    """LLMTester's prompt for gym:highway-v0 leads with the spec's scenario description, says which values
    are integers (lanes) and asks for them as integers; the test double's answer parses into a valid scene."""
    import json

    from orchestrator.fuzzers.llm_prompt import ScenarioInfo, build_messages, parse_reply, reply_schema, state_json
    from tests.llm_server import answer, scripted_state

    sc = get_scenario("gym:highway-v0")
    info = ScenarioInfo.load(sc)
    assert info.overview.startswith("A three-lane one-way highway. The ego vehicle (the agent under test)")
    assert "A test fails when: the ego vehicle collides with another vehicle within 20 s" in info.overview
    seed = sc.sample(np.random.default_rng(0), 1)[0]
    prompt = build_messages(sc, info, seed, 12.0, [], info.expert)[1]["content"]
    assert "### Overview\nA three-lane one-way highway." in prompt
    assert "- ego_lane: the ego vehicle's lane (0 = leftmost), an integer (valid range [0, 2])" in prompt
    assert "- gap_1: vehicle 1's distance ahead of the ego vehicle [m] (valid range [10, 40])" in prompt
    props = reply_schema(sc, reasoning=False)["properties"]
    assert props["lane_3"] == {"type": "integer", "enum": [0, 1, 2]} and props["speed_3"] == {"type": "number"}
    shown = json.loads(state_json(sc, seed))
    assert isinstance(shown["lane_1"], int) and isinstance(shown["gap_1"], float)
    new = parse_reply(answer(scripted_state(prompt, 0.4)), sc)
    assert np.all(new[sc.integer] == np.round(new[sc.integer])) and np.any(new != seed)
    cp = ScenarioInfo.generic(get_scenario("CartPole-v1"))  # a scenario without a description: as before
    assert cp.overview.startswith("The agent acts in CartPole-v1")


@pytest.mark.campaign
@pytest.mark.slow
def test_llmtester_safety_campaign_on_highway_replays_in_plain_gymnasium(tmp_path):
    """LLMTester fuzzes gym:highway-v0 (the driving stand-in for its CARLA use case) against the local
    OpenAI-compatible test double: the LLM's scenes are tested, and every failure found replays in plain
    gymnasium.make("highway-v0") with the agent acting alone."""
    import pandas as pd
    import stable_baselines3

    from envs.gym.spec import find_spec_file, read_spec_file
    from orchestrator.campaign.config import load_campaign
    from orchestrator.campaign.pipeline import run_campaign
    from tests.llm_server import LLMStubServer
    from workers.rollout import episode_seeds

    aut = "experiments/gym/agents/highway-v0-dqn/model.zip"
    with LLMStubServer(step=0.3) as srv:
        p = tmp_path / "llm.yaml"
        p.write_text(f"scenario: gym:highway-v0\naut: {aut}\nworkers: 0\nseed: 2\nmlflow: false\n"
                     f"output: {tmp_path / 'run'}\n"
                     f"safety: {{fuzzer: llmtester, budget: {{episodes: 32}}, generation_size: 8}}\n"
                     f"llm: {{base_url: '{srv.base_url}', model: stub, requests_per_minute: 6000, timeout_s: 5}}\n")
        out = run_campaign(load_campaign(p), progress=False)
    timeline = pd.read_parquet(tmp_path / "run" / "timeline.parquet")
    assert out["safety"]["episodes"] == 32 and timeline["llm_calls"].iloc[-1] > 0
    last = timeline.iloc[-1]
    assert last["llm_failed"] == last["llm_fallbacks"] == 0  # every reply was a valid scene (integer lanes)
    failures = pd.read_parquet(tmp_path / "run" / "failures.parquet")
    assert len(failures) == out["safety"]["failures"] > 0
    spec = read_spec_file(find_spec_file("highway-v0"))
    agent = _plain_sb3_agent(stable_baselines3.DQN.load(aut, device="cpu"))
    for row in failures.itertuples():
        seed = episode_seeds(int(row.gen_seed), np.array([int(row.state_index)]), np.array([0]))[0]
        ret, length, _, info = _plain_episode(spec, agent, row.initial_state, seed)
        assert info["crashed"] and length == row.length and ret == pytest.approx(row.aut_return, abs=1e-9)
