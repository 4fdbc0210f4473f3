"""The one conformance test every fuzzer passes.

On CartPole (discrete, 4-d) and MountainCar (a zero-width dimension) with a black-box AUT and a
random challenger from the same states (the optimality phase's feedback; safety fuzzers read the
AUT's part, Delta both):
- proposals are valid initial states (right shape, finite, inside the bounds) in both phases;
- the same seed gives the same campaign (proposals and internal state), another seed differs;
- ``state_dict`` taken mid-campaign and loaded into a fresh fuzzer gives the identical
  continuation (what campaign snapshots and ``deltarl run --resume`` rely on);
- unknown parameters are refused.

Each check runs in both execution modes of a campaign: ``sync`` (generations with a barrier)
and ``async`` (steady state: several smaller proposals in flight at once, observed in another
order than proposed, new proposals made between observations; the campaign loop itself in async
mode is tested in test_async_execution.py).

LLM-guided fuzzers get a real local OpenAI-compatible server (tests/llm_server.py) whose replies
are a function of the prompt, so their campaigns are reproducible too.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from envs import get_scenario
from orchestrator.fuzzers import FUZZERS, Feedback, FuzzerError, make_fuzzer
from workers.policies import load_policy
from workers.rollout import rollout


@pytest.fixture(scope="module")
def make():
    from orchestrator.cluster.llm_pool import LocalLLMPool
    from tests.llm_server import LLMStubServer
    from workers.llm import LLMConfig

    with LLMStubServer(step=0.2) as srv:
        pool = LocalLLMPool(LLMConfig(base_url=srv.base_url, model="stub", requests_per_minute=60000,
                                      max_concurrent=8, timeout_s=5))

        def build(name, sc, seed):
            f = make_fuzzer(name, sc, seed=seed)
            if getattr(f, "needs_llm", False):
                f.attach_llm(pool.generate)
            return f

        yield build
        pool.close()


AUTS = {"CartPole-v1": "python:workers.examples:cartpole_balancer",
        "MountainCar-v0": "python:workers.examples:mountaincar_energy"}


def campaign(fuzzer, scenario, policy, generations, n, start=0, mode="sync"):
    """Run ``generations`` generations; returns the proposals' states."""
    if mode == "async":
        return async_campaign(fuzzer, scenario, policy, generations, n, start)
    seen = []
    for g in range(start, start + generations):
        if g == 2:
            fuzzer.start_phase("fuzzing")
        p = fuzzer.propose(n)
        assert p.states.shape == (n, scenario.state_dim)
        seen.append(p.states.copy())
        res = rollout(scenario, policy, p.states, seed=g, max_steps=150)
        fuzzer.observe(p, Feedback.from_differential(res, n))
    return seen


def async_campaign(fuzzer, scenario, policy, generations, n, start=0, window=3):
    """As an async campaign drives a fuzzer: units of n/2 proposals, ``window`` of them in flight,
    each observed when it "finishes" (a fixed shuffle stands for the actors' timing) and the
    freed slot refilled at once from the corpus as it stands; fuzzing starts once every sampling
    result is in. Everything proposed is observed before returning."""
    unit = max(1, n // 2)
    total, switch = generations * n, (2 - start) * n  # proposals in all; proposals before the fuzzing phase
    finish = np.random.default_rng(1000 + start)  # which unit in flight finishes first
    seen, flying, issued, uid = [], [], 0, 2 * start
    while issued < total or flying:
        while issued < total and len(flying) < window:
            if fuzzer.phase == "sampling" and issued == switch:
                if flying:
                    break  # the sampling barrier
                fuzzer.start_phase("fuzzing")
            k = min(unit, total - issued, switch - issued if issued < switch else unit)
            p = fuzzer.propose(k)
            assert p.states.shape == (k, scenario.state_dim)
            seen.append(p.states.copy())
            flying.append((uid, p))
            uid, issued = uid + 1, issued + k
        g, p = flying.pop(int(finish.integers(len(flying))))
        res = rollout(scenario, policy, p.states, seed=g, max_steps=150)
        fuzzer.observe(p, Feedback.from_differential(res, len(p)))
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("scenario_name", list(AUTS))
@pytest.mark.parametrize("name", FUZZERS)
def test_fuzzer_conformance(name, scenario_name, mode, make):
    sc = get_scenario(scenario_name)
    pol = {"aut": load_policy(AUTS[scenario_name], sc), "challenger": load_policy("random:1", sc)}
    n = 8

    def campaign(*a, **k):
        return globals()["campaign"](*a, **k, mode=mode)

    a = make(name, sc, seed=3)
    states_a = campaign(a, sc, pol, 4, n)
    for s in states_a:
        assert np.all(np.isfinite(s))
        assert np.all(s >= sc.low - 1e-12) and np.all(s <= sc.high + 1e-12)
        sc.validate(s)

    b = make(name, sc, seed=3)
    states_b = campaign(b, sc, pol, 4, n)
    for x, y in zip(states_a, states_b):
        np.testing.assert_array_equal(x, y)

    c = make(name, sc, seed=4)
    states_c = campaign(c, sc, pol, 1, n)
    assert not np.array_equal(states_a[0], states_c[0])

    # snapshot after 4 generations (through pickle, as campaign snapshots do), resume in a fresh fuzzer
    snap = pickle.loads(pickle.dumps(a.state_dict()))
    cont_a = campaign(a, sc, pol, 2, n, start=4)
    d = make(name, sc, seed=999)  # the seed must not matter once the state is loaded
    d.load_state_dict(snap)
    d.start_phase("fuzzing")
    cont_d = campaign(d, sc, pol, 2, n, start=4)
    for x, y in zip(cont_a, cont_d):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("name", FUZZERS)
def test_unknown_parameters_are_refused(name):
    with pytest.raises(FuzzerError, match="unknown parameters"):
        make_fuzzer(name, get_scenario("CartPole-v1"), seed=0, no_such_knob=1)


def test_unknown_fuzzer():
    with pytest.raises(FuzzerError, match="unknown fuzzer 'afl'; known fuzzers: random, mdpfuzz, curefuzz, gmt"):
        make_fuzzer("afl", get_scenario("CartPole-v1"))
