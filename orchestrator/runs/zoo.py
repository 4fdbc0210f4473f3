"""The agent zoo: trained AUTs shipped with the repository (``experiments/zoo/<scenario>-<algo>/``).

Each agent folder holds ``model.d3`` (d3rlpy), ``policy.pt`` (TorchScript) and ``card.json``
(algorithm, hyperparameters, steps, seed, wall time, evaluation over 100 episodes, sha256).
A third-party agent keeps the files it was published with instead (an rl-baselines3-zoo agent:
``<env>.zip`` and ``<env>/config.yml``, loaded by :mod:`workers.policies.rlzoo`), and its card
says who trained it (``trained_by``), under which licence (``licence``) and where it came from
(``source``); its ``training_wall_seconds`` is null (unknown).
``experiments/zoo/README.md`` has one line per agent, regenerated from the cards.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from workers.policies import zoo_dir

FILES = ("model.d3", "policy.pt", "card.json")


def add_to_zoo(training_dir: str | Path, zoo: str | Path | None = None) -> Path:
    """Copy a finished training run's shippable files into the zoo; returns the agent folder."""
    src = Path(training_dir)
    missing = [f for f in FILES if not (src / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{src} lacks {', '.join(missing)}: finish the training (deltarl train-aut) first")
    card = json.loads((src / "card.json").read_text())
    dest = Path(zoo or zoo_dir()) / card["agent"]
    dest.mkdir(parents=True, exist_ok=True)
    for f in FILES:
        shutil.copyfile(src / f, dest / f)
    write_index(dest.parent)
    return dest


def write_index(zoo: str | Path | None = None) -> Path:
    """Regenerate ``README.md``: one line per agent, from its card."""
    root = Path(zoo or zoo_dir())
    lines = [
        "# The AUT zoo",
        "",
        "Agents under test shipped with deltarl; `zoo:<scenario>` resolves to them (`deltarl evaluate "
        "--policy zoo:CartPole-v1 --scenario CartPole-v1` reproduces a card). Generated from the cards.",
        "`zoo:NAME` names the folder `NAME`, else the one folder `NAME-SUFFIX` (so `zoo:Walker2d-v5` is "
        "`Walker2d-v5-rlzoo`, and `Walker2d-v5-sac-deltarl` answers only to its full name). Third-party "
        "agents keep their licence (`LICENSE`) and the files they were published with; their cards say "
        "who trained them and where they came from.",
        "",
        "| agent | algorithm | trained by | steps | seed | training wall time | mean return ± 95% CI (100 ep.) "
        "| success rate | target (paper's AUT) |",
        "|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for card_path in sorted(root.glob("*/card.json")):
        c = json.loads(card_path.read_text())
        ev = c["evaluation"]
        target = TARGETS.get(c["scenario"], ("", ""))
        wall = c.get("training_wall_seconds")
        by = c.get("trained_by") or ("deltarl" if c["steps"] > 0 else "—")
        lines.append(
            f"| {c['agent']} | {c['algorithm']} | {by.split(' (')[0]} | {c['steps']} | {c['seed']} "
            f"| {f'{wall / 60:.0f} min' if wall is not None else 'unknown'} "
            f"| {ev['mean_return']:.1f} ± {ev['ci95_margin']:.1f} | {100 * ev['success_rate']:.0f}% "
            f"| {f'≥ {target[0]} ({target[1]})' if target[0] != '' else '—'} |"
        )
    out = root / "README.md"
    out.write_text("\n".join(lines) + "\n")
    return out


# issue #3's targets (Hopper-Noise: issue #18) and, in parentheses, the Delta paper's AUT (Table 1)
TARGETS = {
    "CartPole-v1": (475, 495.7),
    "Acrobot-v1": (-100, -81.3),
    "MountainCar-v0": (-150, -129.8),
    "Hopper-v5": (2500, 3162),
    "Walker2d-v5": (2500, 3925),
    "Hopper-Noise": (2500, 3087),  # Table 7's AUT (3086.9 on Hopper-Noise)
}
