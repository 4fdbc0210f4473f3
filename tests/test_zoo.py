"""Every zoo agent loads, fits its scenario, and `deltarl evaluate` reproduces its card."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from orchestrator.analysis.evaluation import evaluate_policy
from orchestrator.runs.zoo import FILES, TARGETS, write_index

ZOO = Path(__file__).resolve().parents[1] / "experiments" / "zoo"
CARDS = sorted(ZOO.glob("*/card.json"))


def test_the_zoo_ships_agents():
    assert CARDS, "experiments/zoo holds no agent"
    names = {p.parent.name for p in CARDS}
    assert {"CartPole-v1-ddqn", "Acrobot-v1-ddqn", "MountainCar-v0-ddqn"} <= names
    # third-party agents (rl-baselines3-zoo) answer zoo:Walker2d-v5 and zoo:BipedalWalker
    assert {"Walker2d-v5-rlzoo", "BipedalWalker-rlzoo", "Walker2d-v5-sac-deltarl"} <= names


def test_third_party_cards_are_honest():
    for card_path in CARDS:
        card = json.loads(card_path.read_text())
        by = card.get("trained_by", "deltarl")
        if not by.startswith("deltarl") and card["steps"] > 0:  # trained elsewhere
            for key in ("licence", "source", "trained_on"):
                assert card.get(key), f"{card_path.parent.name}: the card lacks {key}"
            assert (card_path.parent / "LICENSE").is_file()
            assert "not trained by deltarl" in card["algorithm"]
            assert card["training_wall_seconds"] is None  # unknown, not invented


@pytest.mark.slow
@pytest.mark.parametrize("card_path", CARDS, ids=[p.parent.name for p in CARDS])
def test_evaluate_reproduces_the_card(card_path):
    from envs import get_scenario

    card = json.loads(card_path.read_text())
    agent = card_path.parent
    if card["steps"] > 0 and card.get("trained_by", "deltarl").startswith("deltarl"):  # trained by deltarl
        for f in FILES:
            assert (agent / f).is_file()
    assert card["files"], f"{agent.name}: the card lists no files"
    for f, digest in card["files"].items():
        assert hashlib.sha256((agent / f).read_bytes()).hexdigest() == digest, f"{agent.name}/{f} changed"
    ev = card["evaluation"]
    got = evaluate_policy(get_scenario(card["scenario"]), f"zoo:{agent.name}", ev["episodes"], ev["seed"], device="cpu")
    # same seed, same states, deterministic policy: equal up to float differences between CPUs,
    # which chaotic dynamics can amplify; the card's own 95% CI margin bounds what we accept
    assert abs(got["mean_return"] - ev["mean_return"]) <= max(ev["ci95_margin"], 1e-9)
    assert abs(got["success_rate"] - ev["success_rate"]) <= 0.05


def test_index_lists_every_agent(tmp_path):
    import shutil

    for card_path in CARDS:
        (tmp_path / card_path.parent.name).mkdir()
        shutil.copyfile(card_path, tmp_path / card_path.parent.name / "card.json")
    text = write_index(tmp_path).read_text()
    for card_path in CARDS:
        card = json.loads(card_path.read_text())
        assert f"| {card['agent']} |" in text
        target = TARGETS.get(card["scenario"])
        if target:
            assert str(target[0]) in text
