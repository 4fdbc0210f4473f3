"""Scenario spaces: initial states, bounds, sampling, mutation, oracles, batched simulators.

``get_scenario(name)`` returns a fresh :class:`~envs.base.Scenario`; ``SCENARIOS`` lists the
registered names. Nothing in this package imports Ray.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from envs.base import (
    ActionSpec,
    BatchSimulator,
    InvalidStateError,
    Scenario,
    ScenarioError,
    StepBatch,
)

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
    "CoopNavi": "envs.coopnavi:CoopNavi",
}
SCENARIOS = tuple(_REGISTRY)

# plug-in scenarios (an external simulator such as CARLA): register_scenario() in code, or
# DELTARL_SCENARIOS="Name=module:Class,Other=pkg.mod:Cls" in the environment of every process
_PLUGINS: dict[str, str] = {}


def register_scenario(name: str, target: str) -> None:
    """Make ``get_scenario(name)`` build ``target`` (``"module:Class"``, a :class:`Scenario`
    subclass constructible without arguments). See docs/scenarios.md, "Plugging in a simulator"."""
    if ":" not in str(target):
        raise ScenarioError(f"register_scenario({name!r}, {target!r}): give the target as 'module:Class'")
    if str(name).lower() in {k.lower() for k in _REGISTRY}:
        raise ScenarioError(f"scenario {name!r} is built in; pick another name for the plug-in")
    _PLUGINS[str(name)] = str(target)


def _registry() -> dict[str, str]:
    import os

    reg = dict(_REGISTRY)
    for item in filter(None, (x.strip() for x in os.environ.get("DELTARL_SCENARIOS", "").split(","))):
        name, sep, target = item.partition("=")
        if not sep or ":" not in target:
            raise ScenarioError(f"DELTARL_SCENARIOS entry {item!r} must read Name=module:Class")
        reg[name.strip()] = target.strip()
    reg.update(_PLUGINS)
    return reg


def get_scenario(name: str, **overrides) -> Scenario:
    """The scenario registered as ``name`` (case-insensitive); keyword overrides set fields
    such as ``mutation_scale`` or ``max_steps``. ``gym:<id>`` is any Gymnasium environment
    (:mod:`envs.gym`; a ``spec`` override gives its state spec)."""
    if str(name)[:4].lower() == "gym:":
        from envs.gym import gym_scenario

        return gym_scenario(name, **overrides)
    registry = _registry()
    key = {k.lower(): k for k in registry}.get(str(name).lower())
    if key is None:
        raise ScenarioError(f"unknown scenario {name!r}; known scenarios: {', '.join(registry)}")
    module, cls = registry[key].split(":")
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        if key in _REGISTRY:
            raise
        raise ScenarioError(f"scenario {key}: cannot import its module {module!r} ({exc}); is the plug-in "
                            f"installed in this environment (and on every Ray worker)?") from exc
    scenario = getattr(mod, cls)()
    for k, v in overrides.items():
        if not hasattr(scenario, k):
            raise ScenarioError(f"scenario {key} has no setting {k!r}")
        setattr(scenario, k, v)
    return scenario


@dataclass(frozen=True)
class ScenarioRef:
    """A scenario by name and overrides: what campaign files, run folders and Ray actors pass
    around. ``build()`` makes the :class:`Scenario` (a phase builds it once and reuses it)."""

    name: str
    overrides: tuple = ()

    @classmethod
    def of(cls, name: str, overrides: dict | None = None) -> "ScenarioRef":
        return cls(str(name), tuple(sorted((overrides or {}).items())))

    def build(self) -> Scenario:
        return get_scenario(self.name, **dict(self.overrides))


__all__ = [
    "ScenarioRef",
    "ActionSpec",
    "BatchSimulator",
    "InvalidStateError",
    "Scenario",
    "ScenarioError",
    "StepBatch",
    "SCENARIOS",
    "get_scenario",
    "register_scenario",
]
