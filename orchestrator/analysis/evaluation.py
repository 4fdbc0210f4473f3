"""Evaluating a policy the way the paper's Table 1 reports it, and the process's loaded policies."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from orchestrator.analysis.stats import mean_ci, wilson_interval
from workers.rollout import rollout

_LOADED: dict = {}  # (file, its mtime and size, scenario, device) -> Policy


def shared_policy(uri: str, scenario, device: str | None = None):
    """``load_policy(uri, scenario, device)``, loaded once per process: a campaign's phases, the
    challenger's card and repair all get the same object for the same model file (a file that
    changed on disk is loaded again). ``random:`` and ``python:`` policies, which may hold state,
    are loaded fresh every time."""
    from workers.policies import load_policy  # torch
    from workers.policies.base import _resolve_device

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
            from workers.policies import resolve_zoo_uri

            path = Path(resolve_zoo_uri(text))
        elif low.startswith("rlzoo:"):
            path = Path(text.split(":", 1)[1].strip())
        else:
            path = Path(text[len("file://"):] if low.startswith("file://") else text)
        path = path.expanduser().resolve()
        st = path.stat()
    except Exception:  # noqa: BLE001 - load_policy reports what is wrong with the URI
        return None
    return (str(path), st.st_mtime_ns, st.st_size)


def evaluate_policy(scenario, uri: str, episodes: int, seed: int, device: str | None = None) -> dict:
    """Table 1's columns for a policy: mean return ± 95% CI margin, success rate with its
    Wilson interval (success = the safety oracle does not fire), over ``episodes`` starts
    sampled from the reset distribution with ``seed`` (the batched engine, in this process)."""
    policy = shared_policy(uri, scenario, device=device)
    states = scenario.sample(np.random.default_rng(seed), episodes)
    res = rollout(scenario, policy, states, seed=seed)
    mean, margin = mean_ci(res.returns)
    successes = int(episodes - res.failure.sum())
    lo, hi = wilson_interval(successes, episodes)
    return {
        "scenario": scenario.name,
        "policy": uri,
        "policy_sha256": getattr(policy, "sha256", ""),
        "episodes": episodes,
        "seed": seed,
        "mean_return": mean,
        "ci95_margin": margin,
        "success_rate": successes / episodes,
        "success_wilson95": [lo, hi],
        "mean_length": float(res.lengths.mean()),
    }
