"""The cards of trained agents: TorchScript export, a 100-episode evaluation from fixed starts
(``EVAL_SEED``) and the files' sha256, written by :func:`orchestrator.runs.cards.write_card`.
A challenger's card holds the AUT's evaluation from the same starts (Table 1's columns side by
side); an AUT's card is ``deltarl train-aut``'s."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from orchestrator.analysis.evaluation import evaluate_policy
from orchestrator.runs.cards import (
    AUT_ALGORITHMS,
    EVAL_SEED,
    aut_training_seconds,
    export_torchscript,
    file_hashes,
    write_card,
)
from orchestrator.runs.layout import MODEL, TORCHSCRIPT


def challenger_card(out: Path, cfg, state: dict, scenario, *, aut_uri: str | None, eval_episodes: int,
                    dataset: dict, wall: float = 0.0) -> dict:
    """Export TorchScript, evaluate the challenger (and the AUT from the same starts), write the card."""
    import d3rlpy

    out = Path(out)
    algo = d3rlpy.load_learnable(str(out / MODEL), device="cpu:0")
    not_exported = export_torchscript(algo, out)
    files = [MODEL] + ([] if not_exported else [TORCHSCRIPT])
    ev = evaluate_policy(scenario, str(out / MODEL), eval_episodes, seed=EVAL_SEED, device="cpu")
    aut = None
    if aut_uri:
        aut_ev = evaluate_policy(scenario, aut_uri, eval_episodes, seed=EVAL_SEED, device="cpu")
        aut = {"policy": aut_uri, "evaluation": aut_ev, "training_wall_seconds": aut_training_seconds(aut_uri)}
    card = {
        "challenger": f"{scenario.name}-{cfg.algo}",
        "scenario": scenario.name,
        "algorithm": type(algo).__name__ + f" (d3rlpy {d3rlpy.__version__})",
        "config": dataclasses.asdict(cfg),
        "dataset": dataset,
        "steps": state["step"],
        "seed": cfg.seed,
        "training_wall_seconds": state["wall_seconds"],
        "wall_seconds_incl_eval": wall,
        "placement": state.get("placement"),
        "evaluation": ev,
        "aut": aut,
        "torchscript": not_exported or TORCHSCRIPT,
        "files": file_hashes(out, files),
    }
    if aut:
        a, c = aut["evaluation"]["mean_return"], ev["mean_return"]
        card["return_vs_aut"] = {"difference": c - a, "ratio": c / a if a > 0 else None}
    return write_card(out, card)


def aut_card(out: Path, cfg, state: dict, scenario, *, eval_episodes: int = 100, wall: float = 0.0) -> dict:
    """The card of an AUT trained by ``deltarl train-aut``: TorchScript export, evaluation of the
    exported policy over ``eval_episodes``."""
    import d3rlpy

    from workers.training import export_aut_policy

    out = Path(out)
    algo = d3rlpy.load_learnable(str(out / MODEL), device="cpu:0")
    shared = export_aut_policy(algo, cfg, out / TORCHSCRIPT)  # None, or what the shared per-agent policy is
    ev = evaluate_policy(scenario, str(out / TORCHSCRIPT), eval_episodes, seed=EVAL_SEED, device="cpu")
    card = {
        "agent": cfg.agent_name,
        "scenario": cfg.scenario,
        "algorithm": AUT_ALGORITHMS[cfg.algo] + (f", one policy shared by {shared['agents']} agents" if shared else "")
        + " (d3rlpy " + d3rlpy.__version__ + ")",
        "config": dataclasses.asdict(cfg),
        "steps": state["step"],
        "selected": state.get("best"),  # model.d3: the best epoch by the training-time evaluation, or the one
        # closest to the config's `select` quality (its rule is in it)
        "seed": cfg.seed,
        "training_wall_seconds": state["wall_seconds"],
        "wall_seconds_incl_eval": wall,
        "evaluation": ev,
        "files": file_hashes(out, (MODEL, TORCHSCRIPT)),
    }
    if shared:
        card["shared_agents"] = shared
    return write_card(out, card)
