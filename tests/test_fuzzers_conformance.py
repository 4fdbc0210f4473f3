"""The one conformance test every fuzzer passes.

On CartPole (discrete, 4-d) and MountainCar (a zero-width dimension) with a black-box AUT and a
random challenger from the same states (the optimality phase's feedback; safety fuzzers read the
AUT's part, Delta both):
- proposals are valid initial states (right shape, finite, inside the bounds) in both phases;
- the same seed gives the same campaign (proposals and internal state), another seed differs;
- ``state_dict`` taken mid-campaign and loaded into a fresh fuzzer gives the identical
  continuation (what campaign snapshots and ``deltarl run --resume`` rely on);
- unknown parameters are refused.

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


def campaign(fuzzer, scenario, policy, generations, n, start=0):
    """Run ``generations`` generations; returns the proposals' states."""
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


@pytest.mark.parametrize("scenario_name", list(AUTS))
@pytest.mark.parametrize("name", FUZZERS)
def test_fuzzer_conformance(name, scenario_name, make):
    sc = get_scenario(scenario_name)
    pol = {"aut": load_policy(AUTS[scenario_name], sc), "challenger": load_policy("random:1", sc)}
    n = 8

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
