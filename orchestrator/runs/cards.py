"""Model cards on disk: one writer and reader for the ``card.json`` of an AUT (``deltarl
train-aut``, the zoo) and of a challenger (Table 1's columns beside the AUT's, Fig. 4's training
times). What goes into a card (the evaluation) is made by :mod:`orchestrator.campaign.cards`.

A card holds what was trained (algorithm, config, steps, seed), how long it took, a 100-episode
evaluation from fixed starts (``EVAL_SEED``), and the sha256 of every file it describes. It is
written whole (temp name, then rename), after TorchScript export and evaluation.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

from orchestrator.runs.layout import CARD, TORCHSCRIPT
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
