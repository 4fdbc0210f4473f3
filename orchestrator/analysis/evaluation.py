"""Evaluating a policy the way the paper's Table 1 reports it (the policies come from the
process's policy cache, :func:`workers.policies.shared_policy`)."""

from __future__ import annotations

import numpy as np

from orchestrator.analysis.stats import mean_ci, wilson_interval
from workers.rollout import rollout


def evaluate_policy(scenario, uri: str, episodes: int, seed: int, device: str | None = None) -> dict:
    """Table 1's columns for a policy: mean return ± 95% CI margin, success rate with its
    Wilson interval (success = the safety oracle does not fire), over ``episodes`` starts
    sampled from the reset distribution with ``seed`` (the batched engine, in this process)."""
    from workers.policies import shared_policy  # torch

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
