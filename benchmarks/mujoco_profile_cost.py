"""What a MuJoCo grid profile cost, part by part, from the campaigns' files copied into a folder.

Reads ``<campaign>.summary.json`` (safety), ``<campaign>.optimality_summary.json`` and
``<campaign>.challenger-<algo>.card.json`` (a challenger reused from the grid's challenger cache
has ``from_cache`` set and costs nothing again), sums each part's wall seconds over the campaigns
and prints a table: every campaign ran on one core (one torch thread, one campaign per core), so
the sum of wall seconds is core-seconds.

    .venv/bin/python benchmarks/mujoco_profile_cost.py experiments/results/delta-mujoco-local-summaries \
        --scenario Hopper-v5

Every number it prints comes from the files in the folder; nothing is re-run.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--scenario", default=None, help="only the campaigns of this scenario")
    args = ap.parse_args(argv)
    folder = Path(args.folder)
    parts: dict = defaultdict(lambda: [0, 0.0])  # part -> [count, seconds]
    n = 0
    for f in sorted(folder.glob("*.optimality_summary.json")):
        name = f.name.split(".")[0]
        opt = json.loads(f.read_text())
        if args.scenario and opt["scenario"] != args.scenario:
            continue
        n += 1
        safety = json.loads((folder / f"{name}.summary.json").read_text())
        parts["safety (CureFuzz)"][0] += 1
        parts["safety (CureFuzz)"][1] += safety["wall_seconds"]
        for card_file in folder.glob(f"{name}.challenger-*.card.json"):
            card = json.loads(card_file.read_text())
            if card.get("from_cache"):
                continue
            algo = card["config"]["algo"].upper()
            key = f"challenger {algo} ({card['config']['steps']} steps, with its 100-episode card)"
            parts[key][0] += 1
            # wall_seconds_incl_eval covers the last piece of a resumed training only; training_wall_seconds
            # is the whole training's (the card's evaluation, 7-13 s here, then left out)
            parts[key][1] += max(card.get("wall_seconds_incl_eval") or 0.0, card["training_wall_seconds"])
        key = f"optimality: {opt['fuzzer']} ({opt['cases']} cases)"
        parts[key][0] += 1
        parts[key][1] += opt["wall_seconds"]
    total = sum(s for _, s in parts.values())
    print(f"### Cost of {n} campaigns ({folder}{', ' + args.scenario if args.scenario else ''})\n")
    print("| part | runs | core-seconds | share |")
    print("|---|---:|---:|---:|")
    for part, (k, s) in sorted(parts.items(), key=lambda kv: -kv[1][1]):
        print(f"| {part} | {k} | {s:,.0f} | {s / total:.1%} |")
    print(f"| **total** | | **{total:,.0f}** ({total / 3600:.2f} core-hours; {total / 7200:.2f} h of wall time on 2 cores "
          f"if both are busy) | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
