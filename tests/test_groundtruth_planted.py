"""Planted-defect agents (issue 51, workers/policies/planted.py, experiments/groundtruth/*.yaml):
each fails, or is needlessly bad without failing, exactly from the initial states in its regions,
acts as its base everywhere else, and gives the same episodes however it is batched (verdicts
replay). Rollouts of the zoo agents: seconds each, so the tier is slow."""

from __future__ import annotations

import numpy as np
import pytest

from workers.policies import PolicyError, load_policy
from workers.policies.planted import initial_observations, load_spec, state_from_obs
from workers.rollout import rollout

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

# spec, rollout steps (enough for the planted failure; the outside comparison is step by step)
SPECS = {
    "cartpole": ("experiments/groundtruth/cartpole.yaml", 80),
    "mountaincar": ("experiments/groundtruth/mountaincar.yaml", 200),
    "acrobot": ("experiments/groundtruth/acrobot.yaml", 150),
    "hopper": ("experiments/groundtruth/hopper.yaml", 40),
}


def states_in(spec, region: int, n: int, rng) -> np.ndarray:
    """``n`` initial states whose ground truth is ``region`` (-1: outside every region)."""
    out = []
    while sum(len(x) for x in out) < n:
        c = spec.scenario.sample_uniform(rng, 4000)
        out.append(c[spec.region_of_initial(c) == region])
    return np.concatenate(out)[:n]


@pytest.mark.parametrize("name", list(SPECS))
def test_planted_agent_is_defective_exactly_in_its_regions(name):
    path, steps = SPECS[name]
    spec = load_spec(path)
    sc = spec.scenario
    rng = np.random.default_rng(51)
    per_region = 3 if name == "hopper" else 4
    parts = [states_in(spec, i, per_region, rng) for i in range(len(spec.regions))]
    parts.append(states_in(spec, -1, 8 if name == "hopper" else 12, rng))
    states = np.concatenate(parts)
    truth = spec.region_of_initial(states)
    base = load_policy(spec.base, sc, device="cpu")
    planted = load_policy(f"planted:{path}", sc, device="cpu")
    rb = rollout(sc, base, states, max_steps=steps)
    rp = rollout(sc, planted, states, max_steps=steps)
    outside = np.flatnonzero(truth < 0)
    assert outside.size >= 8
    for e in outside:  # the base's episode, step for step
        sb, sp = rb.episode == e, rp.episode == e
        assert rb.lengths[e] == rp.lengths[e] and rb.returns[e] == rp.returns[e]
        assert np.array_equal(rb.actions[sb], rp.actions[sp])
    for i, r in enumerate(spec.regions):
        inside = np.flatnonzero(truth == i)
        assert inside.size == per_region
        if r.kind == "fail":
            assert rp.failure[inside].all(), (r.name, rp.returns[inside])
        else:  # slow: a lower return, and no failure where the base does not fail
            assert (rp.returns[inside] < rb.returns[inside]).all(), (r.name, rp.returns[inside], rb.returns[inside])
            assert not (rp.failure[inside] & ~rb.failure[inside]).any(), r.name
    # the base itself does not fail from most of the fail regions' states (the defect is planted)
    fail_rows = np.isin(truth, [i for i, r in enumerate(spec.regions) if r.kind == "fail"])
    if name != "hopper":  # the Hopper base falls from most starts by itself (hopper.yaml)
        assert rb.failure[fail_rows].mean() < 0.5


def test_mountaincar_has_both_kinds():
    kinds = {r.kind for r in load_spec("experiments/groundtruth/mountaincar.yaml").regions}
    assert kinds == {"fail", "slow"}


@pytest.mark.parametrize("name", ["cartpole", "acrobot"])
def test_verdicts_replay_whatever_the_batching(name):
    """The same episodes batched together, each acting alone, one per rollout, and mixed with
    other episodes in another order: the planted decision depends on the episode's start only."""
    path, _ = SPECS[name]
    spec = load_spec(path)
    sc = spec.scenario
    rng = np.random.default_rng(7)
    states = np.concatenate([states_in(spec, i, 2, rng) for i in range(len(spec.regions))]
                            + [states_in(spec, -1, 4, rng)])
    steps = 40

    def run(states, **kw):
        pol = load_policy(f"planted:{path}", sc, device="cpu")
        return rollout(sc, pol, states, max_steps=steps, **kw)

    ref = run(states, batch_size=64)
    alone = run(states, batch_size=64, alone=True)
    assert np.array_equal(ref.actions, alone.actions) and np.array_equal(ref.returns, alone.returns)
    one_policy = load_policy(f"planted:{path}", sc, device="cpu")  # one agent, episodes one after another
    for e in range(len(states)):
        solo = rollout(sc, one_policy, states[e:e + 1], max_steps=steps)
        assert np.array_equal(solo.actions, ref.actions[ref.episode == e])
    others = sc.sample(np.random.default_rng(8), 6)
    mixed_states = np.concatenate([others[:3], states[::-1], others[3:]])
    mixed = run(mixed_states, batch_size=5)  # batches that cut across the episodes
    for e in range(len(states)):
        m = 3 + len(states) - 1 - e
        assert np.array_equal(mixed.actions[mixed.episode == m], ref.actions[ref.episode == e])


def test_the_wrapper_follows_every_episode_step():
    """Its own record of each row's step equals the rollout's step (CartPole: exact prediction)."""
    path, _ = SPECS["cartpole"]
    spec = load_spec(path)
    sc = spec.scenario
    states = sc.sample(np.random.default_rng(3), 24)
    pol = load_policy(f"planted:{path}", sc, device="cpu")
    pol.trace = []
    res = rollout(sc, pol, states, max_steps=60)
    truth = spec.region_of_initial(states)
    assert len(pol.trace) == 60
    for t, (region, step) in enumerate(pol.trace):
        live = np.flatnonzero(res.lengths > t)
        assert np.array_equal(step, np.full(live.size, t)) and np.array_equal(region, truth[live])


def test_ground_truth_is_decided_on_the_first_observation():
    """Acrobot: the region is decided on the state the first observation shows (angles from
    float32 cosines and sines), and agrees with the raw state away from the borders."""
    spec = load_spec(SPECS["acrobot"][0])
    states = spec.scenario.sample(np.random.default_rng(0), 2000)
    back = state_from_obs(spec.scenario, initial_observations(spec.scenario, states))
    assert np.abs(back - states).max() < 1e-6
    assert np.mean(spec.region_of(states) == spec.region_of_initial(states)) > 0.999


@pytest.mark.parametrize("text, needle", [
    ("scenario: CartPole-v1\nbase: zoo:CartPole-v1\nregions: []\n", "regions must be a non-empty list"),
    ("scenario: CartPole-v1\nbase: zoo:CartPole-v1\nregions:\n - {kind: fail, low: {tilt: 0}, action: 0}\n",
     "unknown state dimension 'tilt'"),
    ("scenario: CartPole-v1\nbase: zoo:CartPole-v1\nregions:\n - {kind: broken, low: {x: 0}, action: 0}\n",
     "kind must be one of fail, slow"),
    ("scenario: CartPole-v1\nbase: zoo:CartPole-v1\nregions:\n - {kind: fail, low: {x: 0}}\n",
     "give the planted action"),
    ("scenario: CartPole-v1\nbase: zoo:CartPole-v1\nregions:\n - {kind: fail, low: {x: 0}, action: 5}\n",
     "action must be one integer in 0..1"),
    ("scenario: Hopper-Noise\nbase: zoo:Hopper-Noise\nregions:\n - {kind: fail, low: {rootz: 0}, action: [0, 0, 0]}\n",
     "needs a deterministic scenario"),
    ("scenario: CartPole-v1\nregions: []\n", "missing 'base'"),
])
def test_bad_specs_say_what_to_fix(tmp_path, text, needle):
    p = tmp_path / "spec.yaml"
    p.write_text(text)
    with pytest.raises(PolicyError, match=needle.replace("(", r"\(").replace(".", r"\.")):
        load_policy(f"planted:{p}", None, device="cpu")


def test_wrong_scenario_and_missing_file():
    from envs import get_scenario

    with pytest.raises(PolicyError, match="is for CartPole-v1, not MountainCar-v0"):
        load_policy(f"planted:{SPECS['cartpole'][0]}", get_scenario("MountainCar-v0"), device="cpu")
    with pytest.raises(PolicyError, match="planted agent spec not found"):
        load_policy("planted:experiments/groundtruth/nope.yaml", None, device="cpu")
