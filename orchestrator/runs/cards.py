"""Model cards: one writer for the ``card.json`` of an AUT (``deltarl train-aut``, the zoo) and
of a challenger (Table 1's columns beside the AUT's, Fig. 4's training times).

A card holds what was trained (algorithm, config, steps, seed), how long it took, a 100-episode
evaluation from fixed starts (``EVAL_SEED``), and the sha256 of every file it describes. It is
written whole (temp name, then rename), after TorchScript export and evaluation.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import warnings
from pathlib import Path

from orchestrator.analysis.evaluation import evaluate_policy
from orchestrator.runs.layout import CARD, MODEL, TORCHSCRIPT
from orchestrator.runs.store import atomic_write_bytes
from workers.policies import PolicyError, resolve_zoo_uri

EVAL_SEED = 2024  # every card's evaluation seed: AUT and challengers start from the same states
AUT_ALGORITHMS = {"ddqn": "DoubleDQN", "sac": "SAC"}


def write_card(out: Path, card: dict) -> dict:
    atomic_write_bytes(Path(out) / CARD, json.dumps(card, indent=2, default=float).encode())
    return card


def read_card(folder: Path) -> dict | None:
    p = Path(folder) / CARD
    return json.loads(p.read_text()) if p.is_file() else None


def file_hashes(out: Path, files) -> dict:
    return {f: hashlib.sha256((Path(out) / f).read_bytes()).hexdigest() for f in files}


def export_torchscript(algo, out: Path) -> str | None:
    """``policy.pt`` beside the d3rlpy model; None when d3rlpy cannot trace the algorithm."""
    try:
        with warnings.catch_warnings():  # torch.jit.trace's deprecation and tracer notes
            warnings.simplefilter("ignore")
            algo.save_policy(str(Path(out) / TORCHSCRIPT))
        return None
    except Exception as exc:  # noqa: BLE001 - d3rlpy cannot trace every algorithm's action selection
        return f"not exported: {type(exc).__name__}: {str(exc)[:200]}"


def _aut_training_seconds(aut_uri: str | None) -> float | None:
    """The AUT's training wall time when its card says (zoo agents and train-aut outputs)."""
    if not aut_uri:
        return None
    from workers.policies import PolicyError, resolve_zoo_uri

    try:
        path = resolve_zoo_uri(aut_uri) if aut_uri.startswith("zoo:") else Path(aut_uri)
    except PolicyError:
        return None
    card = Path(path).parent / "card.json"
    if card.is_file():
        return json.loads(card.read_text()).get("training_wall_seconds")
    return None


def aut_training_seconds(aut_uri: str | None) -> float | None:
    """The AUT's training wall time when its card says (zoo agents and train-aut outputs)."""
    if not aut_uri:
        return None
    try:
        path = resolve_zoo_uri(aut_uri) if aut_uri.startswith("zoo:") else Path(aut_uri)
    except PolicyError:
        return None
    card = read_card(Path(path).parent)
    return card.get("training_wall_seconds") if card else None


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
