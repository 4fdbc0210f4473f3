"""Scenario spaces: initial states, bounds, sampling, mutation, oracles, batched simulators.

``get_scenario(name)`` returns a fresh :class:`~envs.base.Scenario`; ``SCENARIOS`` lists the
registered names. Nothing in this package imports Ray.
"""

from __future__ import annotations

import importlib

from envs.base import ActionSpec, BatchSimulator, InvalidStateError, Scenario, ScenarioError, StepBatch


# name -> "module:class"; modules are imported on first use (MuJoCo only when needed)
_REGISTRY = {
    "CartPole-v1": "envs.classic:CartPole",
    "MountainCar-v0": "envs.classic:MountainCar",
    "Acrobot-v1": "envs.classic:Acrobot",
    "Hopper-v5": "envs.mujoco_envs:Hopper",
    "Walker2d-v5": "envs.mujoco_envs:Walker2d",
    "Hopper-Noise": "envs.mujoco_envs:HopperNoise",
    "ACASXu": "envs.acasxu:AcasXu",
    "BipedalWalker": "envs.bipedal:BipedalWalker",
}
SCENARIOS = tuple(_REGISTRY)


def get_scenario(name: str, **overrides) -> Scenario:
    """The scenario registered as ``name`` (case-insensitive); keyword overrides set fields
    such as ``mutation_scale`` or ``max_steps``."""
    key = {k.lower(): k for k in _REGISTRY}.get(str(name).lower())
    if key is None:
        raise ScenarioError(f"unknown scenario {name!r}; known scenarios: {', '.join(SCENARIOS)}")
    module, cls = _REGISTRY[key].split(":")
    scenario = getattr(importlib.import_module(module), cls)()
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
