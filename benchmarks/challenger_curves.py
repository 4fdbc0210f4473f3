"""Learning curves of the challengers (return vs gradient steps on D), for choosing a local
profile's challenger budget (issue #18). Resumable: run it again to extend every curve.

    python benchmarks/challenger_curves.py [--scenario Hopper-v5] [--minutes bc=8,cql=20,bcq=20]
    python benchmarks/challenger_curves.py --variant bcq10:bcq:n_action_samples=10 --minutes bcq10=12

1. D: a CureFuzz safety campaign on the scenario's zoo agent (``--episodes``, 600 as the local
   profile of experiments/delta/rq1-challengers.yaml), once, in ``--out``/D.
2. Each algorithm trains with its preset (experiments/challengers/mujoco.yaml or classic-control.yaml)
   except ``steps_per_epoch`` (``--epoch``: one evaluation point per that many steps) through
   ``deltarl train-challenger``, for at most its minutes this call (stopped with SIGINT; every epoch is
   a checkpoint), resuming where the last call stopped.
3. From each run's newest checkpoint: the per-epoch watch's mean return over ``eval_episodes`` starts
   (the preset's; 5 for MuJoCo) and the training wall time at each epoch, beside the AUT's card.
   Writes ``experiments/results/challenger-curves-<scenario>.md`` and ``.png``.

The watch is few episodes (5 on MuJoCo): a curve to see where returns stop rising, not Table 1.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def deltarl(*args: str, timeout: float | None = None) -> int:
    cmd = [sys.executable, "-m", "orchestrator.cli", *args]
    # the child gets SIGINT as Ctrl-C delivers it even when this script runs in the background of a
    # non-interactive shell (which starts it with SIGINT ignored, an ignorance children would inherit)
    p = subprocess.Popen(cmd, cwd=REPO, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        return p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGINT)  # Ctrl-C: the training stops; its checkpoints stay
        try:
            return p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            return p.wait()


def preset_file(scenario: str, epoch: int, out: Path, variant: tuple[str, str, dict] | None = None) -> Path:
    """The scenario's preset with ``steps_per_epoch`` = ``epoch``; with ``variant`` (name, algo,
    hyperparameters) that algorithm's hyperparameters changed as given (a measured deviation)."""
    import yaml

    from workers.challenger import challenger_config

    src = Path(challenger_config(scenario, "bc").preset)
    data = yaml.safe_load(src.read_text())
    data.setdefault("defaults", {})["steps_per_epoch"] = int(epoch)
    note = f"steps_per_epoch {epoch}"
    name = f"preset-epoch{epoch}.yaml"
    if variant is not None:
        vname, algo, hp = variant
        data["scenarios"][scenario][algo]["hyperparameters"].update(hp)
        note += f", {algo} with {hp}"
        name = f"preset-epoch{epoch}-{vname}.yaml"
    dst = out / name
    dst.write_text(f"# {src.name} with {note} (benchmarks/challenger_curves.py)\n"
                   + yaml.safe_dump(data, sort_keys=False))
    return dst


def parse_variant(text: str) -> tuple[str, str, dict]:
    """``NAME:ALGO:KEY=VALUE[,KEY=VALUE]`` (values read as YAML), e.g. ``bcq10:bcq:n_action_samples=10``."""
    import yaml

    name, algo, pairs = text.split(":", 2)
    return name, algo, {k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in pairs.split(",") if kv)}


def history(run: Path) -> list[dict]:
    ckpts = sorted((run / "checkpoints").glob("epoch-[0-9]*"))
    if not ckpts:
        return []
    return json.loads((ckpts[-1] / "state.json").read_text())["history"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="Hopper-v5")
    ap.add_argument("--episodes", type=int, default=600, help="CureFuzz episodes for D")
    ap.add_argument("--epoch", type=int, default=1000, help="gradient steps between evaluation points")
    ap.add_argument("--minutes", default="bc=8,cql=20,bcq=20", help="ALGO=MINUTES,... this call")
    ap.add_argument("--out", default=None, help="working folder (default runs/curves/<scenario>)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:ALGO:KEY=VALUE[,...]",
                    help="a curve of ALGO with changed hyperparameters, trained as NAME "
                         "(e.g. bcq10:bcq:n_action_samples=10; give NAME in --minutes)")
    args = ap.parse_args(argv)
    variants = {v[0]: v for v in map(parse_variant, args.variant)}
    out = Path(args.out or REPO / "runs" / "curves" / args.scenario).resolve()
    out.mkdir(parents=True, exist_ok=True)
    data = out / "D"
    if not (data / "summary.json").is_file():
        camp = out / "safety.yaml"
        camp.write_text(f"name: curves-{args.scenario}\nscenario: {args.scenario}\naut: zoo:{args.scenario}\nseed: 0\n"
                        f"workers: 0\noutput: {data}\nsafety:\n  fuzzer: curefuzz\n"
                        f"  budget: {{episodes: {args.episodes}}}\n  sampling_fraction: 0.25\n  generation_size: 64\n")
        if deltarl("run", str(camp), "--no-dashboard", "--quiet") != 0:
            return 1
    preset = preset_file(args.scenario, args.epoch, out)
    plan = [(a, float(m)) for a, m in (kv.split("=") for kv in args.minutes.split(",") if kv)]
    for algo, minutes in plan:
        run = out / algo
        resume = ["--resume"] if (run / "checkpoints").is_dir() and any((run / "checkpoints").iterdir()) else []
        if (run / "model.d3").is_file() or minutes <= 0:
            continue  # finished (the preset's steps) or not this call
        print(f"{algo}: training for at most {minutes:g} min", flush=True)
        variant = variants.get(algo)
        deltarl("train-challenger", "--data", str(data), "--algo", variant[1] if variant else algo,
                "--preset", str(preset_file(args.scenario, args.epoch, out, variant) if variant else preset),
                "--out", str(run), "--quiet", *resume, timeout=60 * minutes)
        if variant and run.is_dir():
            (run / "variant.json").write_text(json.dumps(list(variant)))
    done = [p.name for p in sorted(out.iterdir()) if (p / "checkpoints").is_dir()]  # every curve so far
    for name in done:  # variants trained by an earlier call keep their description
        if name not in variants and (out / name / "variant.json").is_file():
            variants[name] = tuple(json.loads((out / name / "variant.json").read_text()))
    write_results(args.scenario, out, sorted(set(done) | {a for a, _ in plan}, key=lambda a: (a not in
                  ("bc", "cql", "bcq"), a)), variants)
    return 0


def write_results(scenario: str, out: Path, algos: list[str], variants: dict | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from workers.policies import resolve_zoo_uri

    card = json.loads((resolve_zoo_uri(f"zoo:{scenario}").parent / "card.json").read_text())
    aut = card["evaluation"]["mean_return"]
    d = json.loads((out / "D" / "summary.json").read_text())
    lines = [f"# Challenger learning curves on {scenario} (issue #18)", "",
             f"Printed by `python benchmarks/challenger_curves.py --scenario {scenario}` (resumable; this file is "
             f"rewritten by each call). D: CureFuzz on zoo:{scenario}, {d['episodes']} episodes "
             f"({d['failures']} failures), seed 0. The AUT's card: {aut:.1f} over "
             f"{card['evaluation'].get('episodes', 100)} episodes. Each point: the per-epoch watch, the "
             f"preset's evaluation episodes from the reset distribution (few: a trend, not Table 1); "
             f"wall = training clock (updates only), {os.cpu_count()} CPUs.", "",
             "| algorithm | steps so far | wall (min) | steps/s | best watch return (step) | last watch return |"
             " last / AUT |", "|---|---:|---:|---:|---:|---:|---:|"]
    notes = [f"- {name}: {algo} with {hp} (the preset's other settings)" for name, algo, hp in (variants or {}).values()
             if name in algos]
    if notes:
        lines[4:4] = ["Variants:", "", *notes, ""]
    fig, ax = plt.subplots(figsize=(7, 4))
    curves = {}
    for algo in algos:
        h = [r for r in history(out / algo) if "eval_return" in r]
        if not h:
            lines.append(f"| {algo} | 0 | | | | | |")
            continue
        state = json.loads(sorted((out / algo / "checkpoints").glob("epoch-[0-9]*"))[-1].joinpath("state.json")
                           .read_text())
        steps, rets = [r["step"] for r in h], [r["eval_return"] for r in h]
        best = max(range(len(h)), key=lambda i: rets[i])
        wall = state["wall_seconds"]
        lines.append(f"| {algo} | {steps[-1]} | {wall / 60:.1f} | {steps[-1] / max(wall, 1e-9):.1f} | "
                     f"{rets[best]:.1f} ({steps[best]}) | {rets[-1]:.1f} | {rets[-1] / aut:.2f} |")
        curves[algo] = (steps, rets)
        ax.plot(steps, rets, marker="o", ms=2, label=algo)
    ax.axhline(aut, color="k", ls="--", lw=1, label=f"AUT (card) {aut:.0f}")
    ax.set_xlabel("gradient steps on D")
    ax.set_ylabel("watch return (mean over the preset's episodes)")
    ax.set_title(f"Challengers on {scenario}: return vs gradient steps")
    ax.legend()
    fig.tight_layout()
    res = REPO / "experiments" / "results"
    fig.savefig(res / f"challenger-curves-{scenario}.png", dpi=110)
    lines += ["", "Every point, step: return", ""]
    for algo, (steps, rets) in curves.items():
        lines.append(f"- {algo}: " + ", ".join(f"{s}: {r:.0f}" for s, r in zip(steps, rets)))
    (res / f"challenger-curves-{scenario}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
