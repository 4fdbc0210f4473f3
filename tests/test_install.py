"""A non-editable install works without the checkout: ``pip install .`` into a fresh virtual
environment, then ``deltarl run <path>/quickstart.yaml`` from an empty folder finds the zoo agent,
the challenger presets and everything else through the installed package data.

The fresh environment gets deltarl from a wheel built here; its third-party dependencies come
from this test's own environment (a path line in a ``.pth`` file: the editable install's finder
there is not activated), so the test needs no network and checks deltarl's packaging alone.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def _clean_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DELTARL_ZOO", "VIRTUAL_ENV")}
    env.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", DELTARL_DASHBOARD="0")
    return env


@pytest.mark.slow
def test_non_editable_install_runs_the_quick_start_from_an_empty_folder(tmp_path, installed_deltarl):
    env_dir = installed_deltarl
    py, deltarl = env_dir / "bin" / "python", env_dir / "bin" / "deltarl"
    work = tmp_path / "empty"
    work.mkdir()
    env = _clean_env()
    # the code and its data come from the installed package, not from the checkout
    where = subprocess.run([str(py), "-c", "import orchestrator, workers.resources as r; "
                            "print(orchestrator.__file__); print(r.data_root())"],
                           cwd=work, env=env, check=True, capture_output=True, text=True).stdout.split()
    assert all(str(env_dir) in w for w in where), where
    quickstart = tmp_path / "quickstart.yaml"  # the user's copy, outside the checkout
    quickstart.write_text((REPO / "experiments" / "quickstart.yaml").read_text())
    out = work / "qs"
    res = subprocess.run([str(deltarl), "run", str(quickstart), "--out", str(out), "--quiet"],
                         cwd=work, env=env, capture_output=True, text=True, timeout=1500)
    assert res.returncode == 0, res.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    shipped = yaml.safe_load(quickstart.read_text())  # the budgets as shipped, all spent
    assert results["safety"]["episodes"] == shipped["safety"]["budget"]["episodes"]
    assert results["optimality"]["cases"] == shipped["optimality"]["budget"]["episodes"]
    assert results["challengers"][0]["evaluation"]["episodes"] == shipped["challenger"]["eval_episodes"]
    assert "| safety |" in res.stdout and "bugs" in res.stdout
