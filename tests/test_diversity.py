"""LLMTester's diversity counts (Table II): distinct entire / initial / terminal states."""

from __future__ import annotations

import numpy as np
import pytest

from envs.base import grid_index
from orchestrator.analysis.diversity import state_diversity


def test_counts_by_hand():
    # two 1-D... trajectories in 2-D, grid of 2 parts per dimension over [0, 1] x [0, 1]
    a = np.array([[0.0, 0.0], [0.4, 0.1], [1.0, 1.0]])
    b = np.array([[0.0, 0.9], [0.6, 0.6]])
    d = state_diversity([a, b], intervals=2)
    # cells: a -> (0,0), (0,0), (1,1); b -> (0,1), (1,1)  => entire {(0,0),(1,1),(0,1)} = 3
    assert d == {"episodes": 2, "entire": 3, "initial": 2, "terminal": 1, "intervals": 2, "grid": "fitted"}
    assert state_diversity([a, b], intervals=1)["entire"] == 1
    assert state_diversity([], 5)["entire"] == 0


def test_grid_edges_and_constant_dimensions():
    x = np.array([[0.0, 5.0], [1.0, 5.0], [0.5, 5.0]])
    cells = grid_index(x, np.array([0.0, 5.0]), np.array([1.0, 5.0]), 4)
    assert cells.tolist() == [[0, 0], [3, 0], [2, 0]]


@pytest.mark.campaign
def test_safety_summary_counts_failure_states(tmp_path):
    from orchestrator.campaign.config import load_campaign
    from orchestrator.campaign.safety import run_safety

    p = tmp_path / "c.yaml"
    p.write_text(f"scenario: CartPole-v1\naut: random:0\nworkers: 0\noutput: {tmp_path / 'run'}\nmlflow: false\n"
                 f"safety: {{fuzzer: random, budget: {{episodes: 40}}, generation_size: 20}}\n")
    s = run_safety(load_campaign(p), progress=False)
    fs = s["failure_states"]
    assert s["failures"] > 0 and fs["episodes"] == s["failures"]  # a random policy drops the pole
    assert 1 <= fs["initial"] <= fs["episodes"] and fs["terminal"] >= 1 and fs["entire"] >= fs["initial"]


def test_fixed_bounds_count_every_run_on_the_same_grid():
    """With a scenario's fixed bounds a trajectory's cells do not depend on what else the run
    found (a fitted grid stretches with every far-away failure); outside values go to the edges."""
    a = np.array([[0.1, 0.1], [0.3, 0.2], [0.45, 0.45]])
    far = np.array([[9.0, 9.0], [10.0, 10.0]])
    bounds = (np.zeros(2), np.ones(2))
    alone = state_diversity([a], intervals=10, bounds=bounds)
    with_far = state_diversity([a, far], intervals=10, bounds=bounds)
    assert alone["grid"] == "fixed" and (alone["entire"], alone["initial"]) == (3, 1)
    # the far trajectory adds its one (clipped) edge cell and nothing else changes
    assert (with_far["entire"], with_far["initial"], with_far["terminal"]) == (4, 2, 2)
    # on a fitted grid the far trajectory squeezes a's three cells into one
    fitted = state_diversity([a, far], intervals=10)
    assert fitted["grid"] == "fitted" and fitted["entire"] == 3
    with pytest.raises(ValueError, match="3/3 values for observations of 2"):
        state_diversity([a], bounds=(np.zeros(3), np.ones(3)))


def test_table2_scenarios_have_fixed_bounds():
    from envs import get_scenario

    for name in ("ACASXu", "BipedalWalker", "CoopNavi"):
        sc = get_scenario(name)
        lo, hi = sc.diversity_bounds()
        assert lo.shape == hi.shape == (sc.obs_dim,) and np.all(hi > lo)
    assert get_scenario("CartPole-v1").diversity_bounds() is None
