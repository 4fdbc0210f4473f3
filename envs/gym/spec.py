"""The state spec of a generic Gymnasium scenario: what makes ``gym:<id>`` a space of initial states.

A spec is data, one mapping (a YAML file, or ``scenario_overrides: {spec: {...}}`` in a campaign)::

    env: CartPole-v1            # gymnasium id, or module:Class (default: the name after "gym:")
    imports: []                 # modules imported first (they register their environments)
    make: {}                    # keyword arguments of gymnasium.make (or of the class)
    wrappers: []                # module:Class wrappers, innermost first (e.g. minigrid's ImgObsWrapper)
    state:                      # the initial-state vector, in order ("auto": read it from the setter)
      - {name: x, low: -0.05, high: 0.05, meaning: cart position [m]}
      - {name: lane, low: 0, high: 2, integer: true}
    setter: classic-control     # classic-control | mujoco | reset-options | module:reset_to
    sampler: reset              # reset (the env's own reset distribution, read back) | uniform | module:fn
    failure: terminated         # terminated | not_terminated | {info: KEY} | {reward_below: X} | {return_below: X} | {function: m:f}
    max_steps: 500              # default: the environment's max_episode_steps
    grid_intervals: 5
    mutation_scale: 0.05
    stochastic: false           # the env draws noise from its reset seed: repeats + statistical oracle
    inference: batched          # what `inference: auto` picks (alone where an env step is costly)
    description: ""             # a paragraph for people and LLM prompts
    trust_steps: 40             # horizon of the trust checks (envs/gym/trust.py)

Where a spec is found for ``gym:NAME`` (:func:`find_spec_file`): ``NAME.yaml`` in the folders of
``$DELTARL_GYM_SPECS`` (``:``-separated), then in the shipped ``experiments/gym/specs/``. Without
one, the environment's family gives the spec (``state: auto``): classic control (``unwrapped.state``)
and MuJoCo (``qpos``/``qvel``); any other environment needs a spec file.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from envs.base import ScenarioError

KEYS = ("env", "imports", "make", "wrappers", "state", "setter", "sampler", "failure", "failure_rule", "max_steps",
        "grid_intervals", "mutation_scale", "stochastic", "inference", "description", "trust_steps")
FAILURE_KINDS = ("info", "reward_below", "return_below", "function")
DIM_KEYS = ("name", "low", "high", "integer", "meaning")
FIX = "see docs/scenarios.md, 'Test your own environment'"


def specs_dirs() -> list[Path]:
    """Where spec files are looked for: ``$DELTARL_GYM_SPECS`` folders, then the shipped ones."""
    dirs = [Path(p) for p in os.environ.get("DELTARL_GYM_SPECS", "").split(os.pathsep) if p.strip()]
    try:
        import importlib.resources

        dirs.append(Path(str(importlib.resources.files("experiments"))) / "gym" / "specs")
    except ModuleNotFoundError:  # pragma: no cover - a broken install
        dirs.append(Path(__file__).resolve().parents[2] / "experiments" / "gym" / "specs")
    return dirs


def spec_file_name(key: str) -> str:
    """The file a spec for ``gym:KEY`` is read from (``:`` and ``/`` cannot be in a file name)."""
    return key.replace(":", ".").replace("/", ".") + ".yaml"


def find_spec_file(key: str) -> Path | None:
    for d in specs_dirs():
        p = d / spec_file_name(key)
        if p.is_file():
            return p
    return None


def spec_files() -> list[tuple[str, Path]]:
    """``[(name, spec file)]`` of every ``gym:NAME`` a spec file is found for (``$DELTARL_GYM_SPECS``
    first, then the shipped ones; a name in two folders: the one :func:`find_spec_file` reads)."""
    out: dict[str, Path] = {}
    for d in specs_dirs():
        for p in sorted(d.glob("*.yaml")) if d.is_dir() else ():
            out.setdefault(f"gym:{p.stem}", p)
    return sorted(out.items(), key=lambda kv: kv[0].lower())


def summarize_spec_file(name: str, path) -> dict:
    """What ``deltarl scenarios`` shows of a spec without building the scenario (no import of the
    environment's package, no trust checks): the spec's own data, or the reason it cannot be read."""
    try:
        spec = read_spec_file(path)
    except ScenarioError as exc:
        return {"name": name, "kind": "gym", "spec": str(path), "error": str(exc)}
    env = str(spec.get("env", ""))
    if ":" in env and spec_file_name(env) == Path(path).name:  # module.Class.yaml is the spec of gym:module:Class
        name = f"gym:{env}"
    state = spec.get("state", "auto")
    dims = [{"name": str(d.get("name")), "low": d.get("low"), "high": d.get("high"), "integer": bool(d.get("integer")),
             "meaning": str(d.get("meaning", d.get("name")))} for d in state if isinstance(d, dict)] \
        if isinstance(state, list) else []
    setter = spec.get("setter") or "by the environment's family"
    if isinstance(setter, dict):
        setter = setter.get("function") or setter.get("kind") or str(setter)
    failure = spec.get("failure_rule") or spec.get("failure") or "terminated"
    return {"name": name, "kind": "gym", "spec": str(path), "env_id": str(spec.get("env", name[len("gym:"):])),
            "imports": list(spec.get("imports") or []), "setter": str(setter), "sampler": str(spec.get("sampler", "reset")),
            "failure": str(failure), "max_steps": spec.get("max_steps"), "state": dims,
            "state_auto": state == "auto", "description": " ".join(str(spec.get("description", "")).split())}


def read_spec_file(path) -> dict:
    import yaml

    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ScenarioError(f"state spec {p}: cannot read it ({type(exc).__name__}: {exc})") from exc
    if not isinstance(data, dict):
        raise ScenarioError(f"state spec {p}: must be a mapping of settings ({FIX})")
    return data


def load_spec(key: str, given=None) -> tuple[dict, str]:
    """The spec of ``gym:KEY``: ``(spec, where it came from)``. ``given`` (a campaign's
    ``scenario_overrides.spec``): a mapping whose keys replace the file's (or the automatic spec's),
    or a path to a spec file."""
    path = find_spec_file(key)
    spec, source = (read_spec_file(path), str(path)) if path is not None else ({}, "automatic")
    if given is not None:
        if isinstance(given, (str, os.PathLike)):
            spec, source = read_spec_file(given), str(given)
        elif isinstance(given, dict):
            spec, source = {**spec, **given}, ("campaign" if source == "automatic" else f"{source} + campaign")
        else:
            raise ScenarioError(f"gym:{key}: spec must be a mapping or a spec file path, got {type(given).__name__}")
    unknown = sorted(set(spec) - set(KEYS))
    if unknown:
        raise ScenarioError(f"gym:{key}: unknown spec key {unknown[0]!r}; allowed keys: {', '.join(KEYS)} ({FIX})")
    spec.setdefault("env", key)
    return spec, source


def spec_hash(spec: dict) -> str:
    """Twelve hex digits naming the spec's content: the scenario's version (bugs store it)."""
    text = json.dumps(spec, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def import_target(target: str, what: str):
    """``module:attr`` (``attr`` may be dotted) -> the object."""
    import importlib

    module, sep, attr = str(target).rpartition(":")
    if not sep or not module or not attr:
        raise ScenarioError(f"{what}: give it as 'module:name', got {target!r} ({FIX})")
    try:
        obj = importlib.import_module(module)
    except ImportError as exc:
        raise ScenarioError(f"{what}: cannot import module {module!r} ({exc}); is it installed here and on every "
                            f"Ray worker?") from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ScenarioError(f"{what}: module {module!r} has no {attr!r}")
        obj = getattr(obj, part)
    return obj


def state_dims(spec_state, key: str) -> tuple[tuple, tuple, np.ndarray, np.ndarray, np.ndarray]:
    """``(names, meanings, low, high, integer mask)`` of an explicit ``state:`` list."""
    if not isinstance(spec_state, list) or not spec_state:
        raise ScenarioError(f"gym:{key}: state must be a non-empty list of dimensions "
                            f"({{name, low, high, integer, meaning}}) or 'auto' ({FIX})")
    names, meanings, low, high, integer = [], [], [], [], []
    for i, dim in enumerate(spec_state):
        if not isinstance(dim, dict) or "name" not in dim:
            raise ScenarioError(f"gym:{key}: state dimension #{i} must be a mapping with a name, low and high")
        unknown = sorted(set(dim) - set(DIM_KEYS))
        if unknown:
            raise ScenarioError(f"gym:{key}: state dimension {dim['name']!r} has unknown key {unknown[0]!r}; "
                                f"allowed: {', '.join(DIM_KEYS)}")
        try:
            lo, hi = float(dim["low"]), float(dim["high"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ScenarioError(f"gym:{key}: state dimension {dim['name']!r} needs numbers low and high") from exc
        if not (np.isfinite(lo) and np.isfinite(hi) and lo <= hi):
            raise ScenarioError(f"gym:{key}: state dimension {dim['name']!r} needs finite low <= high, got "
                                f"[{lo}, {hi}]")
        is_int = bool(dim.get("integer", False))
        if is_int and (lo != round(lo) or hi != round(hi)):
            raise ScenarioError(f"gym:{key}: integer state dimension {dim['name']!r} needs integer bounds, got "
                                f"[{lo}, {hi}]")
        names.append(str(dim["name"]))
        meanings.append(str(dim.get("meaning", dim["name"])))
        low.append(lo)
        high.append(hi)
        integer.append(is_int)
    if len(set(names)) != len(names):
        raise ScenarioError(f"gym:{key}: state dimension names must be unique")
    return tuple(names), tuple(meanings), np.array(low), np.array(high), np.array(integer, dtype=bool)


def failure_kind(failure, key: str) -> tuple[str, object]:
    """``(kind, argument)`` of a failure oracle given as data."""
    if failure in (None, "terminated", "not_terminated"):
        return failure or "terminated", None
    if isinstance(failure, dict) and len(failure) == 1:
        (kind, arg), = failure.items()
        if kind in FAILURE_KINDS:
            if kind in ("reward_below", "return_below"):
                try:
                    arg = float(arg)
                except (TypeError, ValueError) as exc:
                    raise ScenarioError(f"gym:{key}: failure {kind} needs a number, got {arg!r}") from exc
            elif kind == "function":
                arg = import_target(arg, f"gym:{key}: failure function")
            else:
                arg = str(arg)
            return kind, arg
    raise ScenarioError(f"gym:{key}: failure must be 'terminated', 'not_terminated' or one of {{info: KEY}}, {{reward_below: X}}, "
                        f"{{return_below: X}}, {{function: module:fn}}; got {failure!r} ({FIX})")


def describe_failure(kind: str, arg, max_steps: int) -> str:
    if kind == "terminated":
        return f"the environment terminates the episode before {max_steps} steps"
    if kind == "not_terminated":
        return f"the environment does not terminate the episode (its goal) within {max_steps} steps"
    if kind == "info":
        return f"info[{arg!r}] is true at a step"
    if kind in ("reward_below", "return_below"):
        return f"{'a step' if kind == 'reward_below' else 'the episode'}'s {kind.split('_')[0]} is below {arg:g}"
    return f"{getattr(arg, '__module__', '?')}:{getattr(arg, '__qualname__', '?')} says so at a step"
