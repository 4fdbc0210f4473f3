"""Any Gymnasium environment as a scenario: ``get_scenario("gym:CartPole-v1")``.

``gym:<id>`` (or ``gym:module:Class``) builds a :class:`~envs.gym.scenario.GymScenario` from a
state spec (data: :mod:`envs.gym.spec`), with a setter (:mod:`envs.gym.setters`) and a failure
oracle, runs the trust checks (:mod:`envs.gym.trust`) once per process, and simulates with one
environment copy per episode stepped in lockstep (:mod:`envs.gym.simulator`). See
docs/scenarios.md, "Test your own environment".
"""

from __future__ import annotations

from envs.base import ScenarioError
from envs.gym.scenario import GymScenario
from envs.gym.trust import TrustError

PREFIX = "gym:"


def is_gym_name(name) -> bool:
    return isinstance(name, str) and name[: len(PREFIX)].lower() == PREFIX


def gym_scenario(name: str, **overrides) -> GymScenario:
    """The scenario ``gym:<id>``; ``spec`` (a mapping or a spec file path) replaces keys of the
    found spec, other keyword overrides set fields (``max_steps``, ``mutation_scale``, ...)."""
    from envs.gym import trust

    key = str(name)[len(PREFIX):].strip()
    if not key:
        raise ScenarioError(f"{name!r}: name the environment after gym:, e.g. gym:CartPole-v1")
    given = overrides.pop("spec", None)
    scenario = GymScenario.build(key, given)
    for k, v in overrides.items():
        if k in ("spec", "key", "spec_source") or not hasattr(scenario, k):
            raise ScenarioError(f"scenario {scenario.name} has no setting {k!r}")
        setattr(scenario, k, v)
    trust.check(scenario)
    return scenario


__all__ = ["GymScenario", "TrustError", "gym_scenario", "is_gym_name", "PREFIX"]
