"""Shared set-up of the Delta loop benchmarks (``delta_loop.py``, ``delta_energy_terms.py``,
``delta_rerun_estimate.py``): a BCQ challenger trained on the AUT's own safety record, as in
Delta's pipeline, cached in a run folder so that each script trains it once; and optimality-only
campaigns against it, in this process (``workers: 0``), without MLflow.

The loop settings compared (``LOOPS``):

* ``old``: the loop before issue #17: literal Eq. 7, one RND Adam step per 8 test cases on the
  generation's pooled states (thinned to 32 per trajectory), generations of 64 test cases, 10 %
  of the budget on the initial corpus;
* ``new``: today's defaults: normalised energy, RND steps on every evaluated trajectory, D on up
  to 64 states per trajectory, generations of 8, 25 % sampling;
* ``new-gen64``: today's defaults in generations of 64 (what the generation size alone costs).
"""

from __future__ import annotations

import time
from pathlib import Path

from orchestrator.campaign.config import campaign_from_dict
from orchestrator.campaign.optimality import run_optimality
from orchestrator.campaign.pipeline import run_campaign
from orchestrator.runs.layout import RunFolder

OLD_PARAMS = {"energy": "literal", "rnd_update": "generation", "rnd_updates_per_episode": 0.125,
              "rnd_states_per_episode": 32}
LOOPS = {
    "old": {"params": OLD_PARAMS, "generation_size": 64, "sampling_fraction": 0.1},
    "new": {"params": {}, "generation_size": 8, "sampling_fraction": 0.25},
    "new-gen64": {"params": {}, "generation_size": 64, "sampling_fraction": 0.25},
}


def ensure_challenger(scenario: str, aut: str, root: Path, *, safety_episodes: int = 600, steps: int = 4000,
                      seed: int = 0) -> tuple[str, dict]:
    """A BCQ challenger on D of a CureFuzz safety campaign of ``aut`` (trained once, then reused
    from ``root``); returns its URI and the campaign's results (safety and challenger)."""
    out = Path(root) / f"{scenario}-d{safety_episodes}-bcq{steps}-s{seed}"
    run = RunFolder(out)
    model = run.challenger_dir("bcq") / "model.d3"
    c = campaign_from_dict({
        "name": out.name, "scenario": scenario, "aut": aut, "seed": seed, "workers": 0, "mlflow": False,
        "output": str(out),
        "safety": {"fuzzer": "curefuzz", "budget": {"episodes": safety_episodes}, "sampling_fraction": 0.25,
                   "generation_size": 64},
        "challenger": {"algos": ["bcq"], "steps": steps, "eval_episodes": 20},
    }, where="benchmark challenger campaign")
    t0 = time.perf_counter()
    results = run_campaign(c, resume=run.has_campaign(), progress=False)
    results["prepare_seconds"] = time.perf_counter() - t0
    if not model.is_file():
        raise RuntimeError(f"no challenger at {model}")
    return str(model), results


def optimality_campaign(scenario: str, aut: str, challenger: str, out: Path, *, fuzzer: str = "delta",
                        params: dict | None = None, budget: int = 1000, generation_size: int | None = None,
                        sampling_fraction: float | None = None, seed: int = 0):
    opt = {"fuzzer": fuzzer, "challenger": challenger, "budget": {"episodes": int(budget)},
           "params": dict(params or {})}
    if generation_size is not None:
        opt["generation_size"] = int(generation_size)
    if sampling_fraction is not None:
        opt["sampling_fraction"] = float(sampling_fraction)
    return campaign_from_dict({"name": Path(out).name, "scenario": scenario, "aut": aut, "seed": seed, "workers": 0,
                               "mlflow": False, "output": str(out), "safety": None, "optimality": opt},
                              where="benchmark optimality campaign")


def run_fresh(campaign, scenario=None) -> dict:
    """Run the campaign's optimality phase in a fresh folder (an earlier one is removed)."""
    import shutil

    if Path(campaign.output).exists():
        shutil.rmtree(campaign.output)
    return run_optimality(campaign, progress=False, scenario=scenario)
