"""LLMTester's diversity counts (Table II): distinct entire / initial / terminal states."""

from __future__ import annotations

import numpy as np

from envs.base import grid_index
from orchestrator.analysis.diversity import state_diversity


def test_counts_by_hand():
    # two 1-D... trajectories in 2-D, grid of 2 parts per dimension over [0, 1] x [0, 1]
    a = np.array([[0.0, 0.0], [0.4, 0.1], [1.0, 1.0]])
    b = np.array([[0.0, 0.9], [0.6, 0.6]])
    d = state_diversity([a, b], intervals=2)
    # cells: a -> (0,0), (0,0), (1,1); b -> (0,1), (1,1)  => entire {(0,0),(1,1),(0,1)} = 3
    assert d == {"episodes": 2, "entire": 3, "initial": 2, "terminal": 1, "intervals": 2}
    assert state_diversity([a, b], intervals=1)["entire"] == 1
    assert state_diversity([], 5)["entire"] == 0


def test_grid_edges_and_constant_dimensions():
    x = np.array([[0.0, 5.0], [1.0, 5.0], [0.5, 5.0]])
    cells = grid_index(x, np.array([0.0, 5.0]), np.array([1.0, 5.0]), 4)
    assert cells.tolist() == [[0, 0], [3, 0], [2, 0]]


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
