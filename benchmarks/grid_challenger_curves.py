"""The challengers' learning curves of a grid, from their training records copied into a folder.

Every challenger training watches its policy for a few episodes at the end of each epoch
(``history`` in ``training.json``: step, eval_return over ``eval_episodes``). A grid's local profile
trains each seed's BC, BCQ and CQL once, so these records are the learning curves on that
scenario at the profile's budget (experiments/challengers/mujoco-local.yaml says Walker2d-v5's
curve is read here). Reads ``<campaign>.challenger-<algo>.training.json`` and prints, per
algorithm, the watch return at each epoch for every seed, then each challenger's card
(``<campaign>.challenger-<algo>.card.json``: its evaluation's mean), training seconds and steps/s.

    .venv/bin/python benchmarks/grid_challenger_curves.py experiments/results/delta-mujoco-local-summaries \\
        --scenario Walker2d-v5

Nothing is re-run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--scenario", required=True)
    args = ap.parse_args(argv)
    folder = Path(args.folder)
    curves: dict = {}
    for f in sorted(folder.glob("*.challenger-*.training.json")):
        t = json.loads(f.read_text())
        cfg = t["config"]
        if cfg["scenario"] != args.scenario:
            continue
        card = json.loads(f.with_name(f.name.replace(".training.json", ".card.json")).read_text())
        curves.setdefault(cfg["algo"], {})[cfg["seed"]] = (t, card)
    print(f"### {args.scenario}: the challengers' per-epoch watch return "
          f"(`python benchmarks/grid_challenger_curves.py {args.folder} --scenario {args.scenario}`)\n")
    for algo, by_seed in sorted(curves.items()):
        seeds = sorted(by_seed)
        steps = [h["step"] for h in by_seed[seeds[0]][0]["history"]]
        n_eval = by_seed[seeds[0]][0]["config"]["eval_episodes"]
        print(f"**{algo.upper()}** ({n_eval} watch episodes per epoch; steps/s: the mean of the epochs)\n")
        print("| step | " + " | ".join(f"seed {s}" for s in seeds) + " |")
        print("|---:|" + "---:|" * len(seeds))
        for i, step in enumerate(steps):
            cells = []
            for s in seeds:
                h = by_seed[s][0]["history"]
                cells.append(f"{h[i]['eval_return']:.1f}" if i < len(h) and h[i].get("eval_return") is not None else "")
            print(f"| {step} | " + " | ".join(cells) + " |")
        fin, n_card = [], {by_seed[s][1]["evaluation"]["episodes"] for s in seeds}
        for s in seeds:
            t, card = by_seed[s]
            mean = card["evaluation"]["mean_return"]
            ups = [h["updates_per_second"] for h in t["history"] if h.get("updates_per_second")]
            fin.append(f"{mean:.1f}, {t['wall_seconds']:.0f} s, {sum(ups) / len(ups):.1f} steps/s")
        print(f"| card ({'/'.join(map(str, sorted(n_card)))} episodes), training | " + " | ".join(fin) + " |\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
