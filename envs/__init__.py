"""Scenario spaces: initial states, bounds, sampling, mutation, oracles, batched simulators.

``get_scenario(name)`` returns a fresh :class:`~envs.base.Scenario`; ``SCENARIOS`` lists the
registered names. Nothing in this package imports Ray.
"""

from __future__ import annotations

from envs.base import ActionSpec, BatchSimulator, InvalidStateError, Scenario, ScenarioError, StepBatch


def _registry() -> dict:
    from envs import classic, mujoco_envs

    return {
        "CartPole-v1": classic.CartPole,
        "MountainCar-v0": classic.MountainCar,
        "Acrobot-v1": classic.Acrobot,
        "Hopper-v5": mujoco_envs.Hopper,
        "Walker2d-v5": mujoco_envs.Walker2d,
        "Hopper-Noise": mujoco_envs.HopperNoise,
    }


SCENARIOS = ("CartPole-v1", "MountainCar-v0", "Acrobot-v1", "Hopper-v5", "Walker2d-v5", "Hopper-Noise")


def get_scenario(name: str, **overrides) -> Scenario:
    """The scenario registered as ``name`` (case-insensitive); keyword overrides set fields
    such as ``mutation_scale`` or ``max_steps``."""
    reg = _registry()
    key = {k.lower(): k for k in reg}.get(str(name).lower())
    if key is None:
        raise ScenarioError(f"unknown scenario {name!r}; known scenarios: {', '.join(SCENARIOS)}")
    scenario = reg[key]()
    for k, v in overrides.items():
        if not hasattr(scenario, k):
            raise ScenarioError(f"scenario {key} has no setting {k!r}")
        setattr(scenario, k, v)
    return scenario


__all__ = [
    "ActionSpec",
    "BatchSimulator",
    "InvalidStateError",
    "Scenario",
    "ScenarioError",
    "StepBatch",
    "SCENARIOS",
    "get_scenario",
]
