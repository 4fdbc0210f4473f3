"""``load_policy(uri, scenario, device)``: pick the format from the URI, load, check against the
scenario; ``zoo:NAME`` resolves through the agent zoo; ``rlzoo:PATH`` (and a ``.zip`` or folder
in rl-baselines3-zoo's layout) loads an rl-zoo agent.
"""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path

import numpy as np

from workers.policies.base import (
    SUPPORTED_URIS,
    TORCHSCRIPT_EXTENSIONS,
    Policy,
    PolicyError,
    _describe_action,
    _resolve_device,
    _scenario_label,
    _short,
)
from workers.policies.blackbox import PythonPolicy, RandomPolicy
from workers.policies.formats import (
    D3rlpyPolicy,
    OnnxPolicy,
    SB3Policy,
    TorchScriptPolicy,
)
from workers.policies.rlzoo import RLZooPolicy, find_agent, is_zoo_folder, stats_dir_for
from workers.resources import is_zoo_name, zoo_dir

_SUPPORTED = f"{SUPPORTED_URIS}; or rlzoo:FOLDER (an rl-baselines3-zoo agent folder)"


def _strip_file_uri(uri: str) -> str:
    if uri.startswith("file://"):
        rest = uri[len("file://"):]
        if rest.startswith("localhost/"):
            rest = rest[len("localhost"):]
        return urllib.parse.unquote(rest)
    return uri


def _as_scenario(scenario):
    if scenario is None or not isinstance(scenario, str):
        return scenario
    try:
        from envs import get_scenario
    except Exception as e:  # noqa: BLE001
        raise PolicyError(f"cannot resolve scenario name {scenario!r} ({_short(e)})") from e
    try:
        return get_scenario(scenario)
    except Exception as e:  # noqa: BLE001
        raise PolicyError(f"unknown scenario {scenario!r} ({_short(e)})") from e


def load_policy(uri: str, scenario=None, device: str | None = None) -> Policy:
    """Load the policy at ``uri`` (see the module docstring for the forms).

    ``scenario`` (a :class:`~envs.base.Scenario`, anything with ``name``/``obs_dim``/``action``,
    or a registered scenario name) sets the action conventions and enables the shape checks:
    the model's declared input/output sizes are compared with the scenario, and one ``act`` is
    run on a batch of zero observations. ``device``: None → "cuda" when available, else "cpu".
    Raises :class:`PolicyError` on any problem.
    """
    if not isinstance(uri, (str, os.PathLike)):
        raise PolicyError(f"a policy URI must be a string, got {type(uri).__name__}")
    uri = os.fspath(uri)
    scenario = _as_scenario(scenario)
    dev = _resolve_device(device)
    target = uri.strip()
    low = target.lower()

    if low.startswith("zoo:"):
        target = str(resolve_zoo_uri(target))
        low = target.lower()

    if low.startswith("random:"):
        seed_txt = target.split(":", 1)[1].strip()
        try:
            seed = int(seed_txt)
        except ValueError as e:
            raise PolicyError(f"bad random policy URI {uri!r}: the seed must be an integer, e.g. random:7") from e
        if scenario is None:
            raise PolicyError(
                f"{uri}: a random policy needs a scenario to know the action space; "
                "call load_policy(uri, scenario=...)"
            )
        policy: Policy = RandomPolicy(uri, seed, scenario, dev)
    elif low.startswith("python:"):
        policy = PythonPolicy(uri, target.split(":", 1)[1], dev)
    elif low.startswith("planted:"):  # a base agent with planted defects (workers/policies/planted.py)
        from workers.policies.planted import PlantedPolicy

        policy = PlantedPolicy(uri, target.split(":", 1)[1].strip(), scenario, dev, load_policy=load_policy)
    elif low.startswith("rlzoo:"):
        path = os.path.abspath(os.path.expanduser(_strip_file_uri(target.split(":", 1)[1].strip())))
        policy = RLZooPolicy(uri, path, dev, scenario)
    else:
        path = os.path.abspath(os.path.expanduser(_strip_file_uri(target)))
        ext = _extension(path)
        if os.path.isdir(path) and is_zoo_folder(path):
            ext = "rlzoo"
        elif ext not in (".d3", ".onnx", ".zip") + TORCHSCRIPT_EXTENSIONS:
            raise PolicyError(
                f"don't know how to load {uri!r}: unknown extension {ext or '(none)'!r}. "
                f"Supported: {_SUPPORTED}"
            )
        if not os.path.exists(path):
            raise PolicyError(
                f"policy file not found: {path}" + (f" (from {uri!r})" if path != uri else "")
                + "; check the path"
            )
        if ext != "rlzoo" and not os.path.isfile(path):
            raise PolicyError(f"policy path is not a file: {path}")
        if ext == "rlzoo" or (ext == ".zip" and stats_dir_for(path) is not None):
            policy = RLZooPolicy(uri, path, dev, scenario)  # rl-zoo's layout: <env>.zip beside <env>/config.yml
        elif ext == ".d3":
            policy = D3rlpyPolicy(uri, path, dev)
        elif ext == ".onnx":
            policy = OnnxPolicy(uri, path, dev)
        elif ext == ".zip":
            policy = SB3Policy(uri, path, dev)
        else:
            policy = TorchScriptPolicy(uri, path, dev)

    if scenario is not None:
        _check_against(policy, scenario)
    return policy


def resolve_zoo_uri(uri: str) -> Path:
    """``zoo:CartPole-v1`` (or ``zoo:CartPole-v1-ddqn``) -> the agent's TorchScript file
    (``policy.pt``), else its d3rlpy model (``model.d3``), else, for a third-party agent kept in
    rl-baselines3-zoo's layout, its ``.zip`` (which :func:`load_policy` loads as an rl-zoo agent).

    ``zoo:NAME`` names the folder ``NAME``, else the one folder ``NAME-SUFFIX`` whose name less
    its last ``-SUFFIX`` is ``NAME`` (so ``Walker2d-v5-rlzoo`` answers ``zoo:Walker2d-v5``, and
    ``Walker2d-v5-sac-deltarl`` only its full name)."""
    name = uri.split(":", 1)[1].strip()
    if not is_zoo_name(name):
        raise PolicyError(f"zoo:{name} is not a zoo agent name: zoo:NAME names a folder of the zoo (e.g. "
                          f"zoo:CartPole-v1), never a path; give a path to a policy file without the zoo: prefix")
    root = zoo_dir()
    candidates = [root / name] if (root / name).is_dir() else sorted(
        p for p in root.glob(f"{name}-*") if p.is_dir() and p.name.rsplit("-", 1)[0].lower() == name.lower()
    )
    known = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    if not candidates:
        raise PolicyError(f"no zoo agent {name!r} in {root}; known agents: {', '.join(known) or 'none'}")
    if len(candidates) > 1:
        raise PolicyError(f"zoo:{name} is ambiguous ({', '.join(p.name for p in candidates)}); name one of them")
    for f in ("policy.pt", "model.d3"):
        if (candidates[0] / f).is_file():
            return candidates[0] / f
    if is_zoo_folder(candidates[0]):
        return find_agent(candidates[0]).model
    raise PolicyError(f"zoo agent {candidates[0].name} has neither policy.pt nor model.d3 (nor an rl-zoo "
                      f"model: <env>.zip beside <env>/config.yml) in {candidates[0]}")


def _extension(path: str) -> str:
    base = os.path.basename(path).lower()
    if base.endswith(".torchscript"):
        return ".torchscript"
    return os.path.splitext(base)[1]


def _check_against(policy: Policy, scenario) -> None:
    """Compare declared sizes with the scenario, then probe one act on zero observations."""
    want_obs = int(scenario.obs_dim)
    want = scenario.action
    where = f"scenario {_scenario_label(scenario)}"
    fix = (f"Fix: use a policy trained for {getattr(scenario, 'name', '') or 'this scenario'}, "
           "or choose the scenario the policy was trained for")
    label = policy.label
    if policy.model_obs_dim is not None and policy.model_obs_dim != want_obs:
        raise PolicyError(
            f"{label}: expected a policy for observations of size {want_obs} ({where}), but the "
            f"model takes observations of size {policy.model_obs_dim}. {fix}"
        )
    got = policy.model_action
    if got is not None:
        if got.discrete != want.discrete:
            raise PolicyError(
                f"{label}: expected a {'discrete' if want.discrete else 'continuous'}-action policy "
                f"({where}), but the model has a {'discrete' if got.discrete else 'continuous'} "
                f"action space {_describe_action(got)}. {fix}"
            )
        if want.discrete and got.n != want.n:
            raise PolicyError(
                f"{label}: expected {want.n} discrete actions ({where}), but the model has "
                f"{got.n} actions ({_describe_action(got)}). {fix}"
            )
        if not want.discrete and tuple(got.shape) != tuple(want.shape):
            raise PolicyError(
                f"{label}: expected continuous actions of shape {tuple(want.shape)} ({where}), but "
                f"the model's actions have shape {tuple(got.shape)}. {fix}"
            )
    # the scenario decides the conventions from here on
    policy.obs_dim = want_obs
    if got is not None and not got.discrete and want.low is None and got.low is not None:
        policy.action = got
    else:
        policy.action = want
    policy._scenario = scenario
    probe = np.zeros((2, want_obs), dtype=np.float32)
    try:
        out = policy.act(probe)
    except PolicyError:
        raise
    except Exception as e:  # noqa: BLE001
        hint = ""
        first_in = getattr(policy, "first_layer_in", None)
        if first_in is not None and first_in != want_obs:
            hint = f"; its first layer takes {first_in} inputs"
        raise PolicyError(
            f"{label}: running the policy on a batch of observations of size {want_obs} "
            f"({where}) failed ({_short(e)}){hint}. The policy probably expects a different "
            f"observation size. {fix}"
        ) from e
    expect_shape = (2,) if want.discrete else (2, *tuple(want.shape))
    if out.shape != expect_shape:  # pragma: no cover - _postprocess already enforces this
        raise PolicyError(f"{label}: expected actions of shape {expect_shape} ({where}), got {out.shape}")


# The process's policy cache (its one owner): (file, its mtime and size, scenario, device) -> Policy
_LOADED: dict = {}


def shared_policy(uri: str, scenario, device: str | None = None):
    """``load_policy(uri, scenario, device)``, loaded once per process: a campaign's phases, the
    challenger's card and repair all get the same object for the same model file (a file that
    changed on disk is loaded again). ``random:`` and ``python:`` policies, which may hold state,
    are loaded fresh every time."""
    key = _file_key(uri)
    if key is None:
        return load_policy(uri, scenario, device=device)
    action = getattr(scenario, "action", None)
    key += (getattr(scenario, "name", None), getattr(scenario, "obs_dim", None), repr(action), _resolve_device(device))
    if key not in _LOADED:
        _LOADED[key] = load_policy(uri, scenario, device=device)
    return _LOADED[key]


def _file_key(uri) -> tuple | None:
    """(path, mtime, size) of a file or zoo policy URI; None for the others."""
    if not isinstance(uri, (str, os.PathLike)):
        return None
    text = os.fspath(uri).strip()
    low = text.lower()
    if low.startswith(("random:", "python:")):
        return None
    try:
        if low.startswith("zoo:"):
            path = Path(resolve_zoo_uri(text))
        elif low.startswith("rlzoo:"):
            path = Path(text.split(":", 1)[1].strip())
        else:
            path = Path(text[len("file://"):] if low.startswith("file://") else text)
        path = path.expanduser().resolve()
        st = path.stat()
    except (OSError, ValueError):  # no such file, a bad zoo name (PolicyError): load_policy says what is wrong
        return None
    return (str(path), st.st_mtime_ns, st.st_size)
