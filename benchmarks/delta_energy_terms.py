"""What decides Delta's seed selection (issue #17): the range of the diversity D, and each energy
term's share of selection decisions, under the literal Eq. 7 and the normalised energy, on a
short run (Acrobot by default: the zoo AUT, a BCQ challenger trained on its own safety record).

    python benchmarks/delta_energy_terms.py [--scenario Acrobot-v1] [--budget 400] [--seed 0] [--challenger URI]

Runs (one optimality phase each, same AUT, challenger, seed and budget):

* ``literal, old loop``: Eq. 7 on raw values with the loop before #17 (generations of 64, one RND
  step per 8 test cases, D on 32 states per trajectory, 10 % sampling);
* ``literal, new loop``: Eq. 7 on raw values in the new loop (generations of 8, RND steps on every
  trajectory, D on up to 64 states, 25 % sampling);
* ``normalized, new loop``: the default.

A term *decides* a draw when the energy without it (same uniform draw, inverse-CDF selection)
would have chosen another seed (``Delta.stats()["decision_share_*"]``). Also printed: the
corpus's D over the run (min and max over all generations, and at the end), the share of draws
whose parent was a seed the challenger beats (R_ca > R_aut), and how far D on a thinned
trajectory (32 or 64 evenly spaced states) is from D on every state (mean relative error, from
the run's own trajectories, before P learns them).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.delta_setup import OLD_PARAMS, ensure_challenger, optimality_campaign, run_fresh  # noqa: E402

RUNS = {
    "literal, old loop": {"params": OLD_PARAMS, "generation_size": 64, "sampling_fraction": 0.1},
    "literal, new loop": {"params": {"energy": "literal"}, "generation_size": 8, "sampling_fraction": 0.25},
    "normalized, new loop": {"params": {}, "generation_size": 8, "sampling_fraction": 0.25},
}


class Probe:
    """Wraps a Delta fuzzer's propose/observe to record what the summary does not hold."""

    def __init__(self, fuzzer):
        from orchestrator.fuzzers.rnd import evenly_spaced

        self.f, self.thin = fuzzer, evenly_spaced
        self.d_min, self.d_max, self.trace = np.inf, -np.inf, []
        self.draws = self.on_bug_seeds = 0
        self.rel_err = {32: [], 64: []}
        propose, observe = fuzzer.propose, fuzzer.observe

        def probed_propose(n):
            p = propose(n)
            if p.tags["kind"][0] == "mutant" if n else False:
                c = self.f.corpus
                gap = c.scores["gap"][c.index_of(p.tags["parent"])]
                self.draws += n
                self.on_bug_seeds += int(np.sum(gap > 0))
            return p

        def probed_observe(p, fb):
            rnd = self.f.rnd
            if rnd.count:
                full = [np.asarray(t, np.float32) for t in fb.traj_obs]
                exact = rnd.trajectory_novelty(full)
                for k in self.rel_err:
                    approx = rnd.trajectory_novelty(self.thin(full, k))
                    self.rel_err[k].extend(np.abs(approx - exact) / np.maximum(exact, 1e-12))
            observe(p, fb)
            d = self.f.corpus.scores.get("diversity")
            if d is not None and len(d):
                self.d_min, self.d_max = min(self.d_min, float(np.nanmin(d))), max(self.d_max, float(np.nanmax(d)))
                self.trace.append((self.f.counters["episodes"], float(np.nanmin(d)), float(np.nanmax(d))))

        fuzzer.propose, fuzzer.observe = probed_propose, probed_observe


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="Acrobot-v1")
    ap.add_argument("--aut", default=None)
    ap.add_argument("--challenger", default=None)
    ap.add_argument("--budget", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", default="runs/bench-delta")
    args = ap.parse_args(argv)

    import torch

    import orchestrator.campaign.optimality as opt_mod

    torch.set_num_threads(1)
    aut = args.aut or f"zoo:{args.scenario}"
    root = Path(args.runs)
    challenger = args.challenger or ensure_challenger(args.scenario, aut, root)[0]
    real_make = opt_mod.make_fuzzer
    out = {}
    for label, spec in RUNS.items():
        probes = []

        def make(*a, _probes=probes, **k):  # this run's probes, bound now
            f = real_make(*a, **k)
            _probes.append(Probe(f))
            return f

        opt_mod.make_fuzzer = make
        try:
            c = optimality_campaign(args.scenario, aut, challenger,
                                    root / f"terms-{args.scenario}-{label.replace(', ', '-').replace(' ', '-')}",
                                    params=spec["params"], budget=args.budget, seed=args.seed,
                                    generation_size=spec["generation_size"], sampling_fraction=spec["sampling_fraction"])
            s = run_fresh(c)
        finally:
            opt_mod.make_fuzzer = real_make
        out[label] = (s, probes[0])
        print(f"{label}: {s['cases']} cases, {s['bugs']} bugs, {s['wall_seconds']:.0f} s", file=sys.stderr)

    print(f"\n{args.scenario}, AUT `{aut}`, challenger `{challenger}`, {args.budget} test cases, seed {args.seed}\n")
    print("| energy, loop | bugs | distinct bugs | corpus D over the run (min – max) | D at the end (min – max) | "
          "draws | share decided by D | by A | by 1−I | draws on seeds the challenger beats |")
    print("|---|---:|---:|---|---|---:|---:|---:|---:|---:|")
    for label, (s, pr) in out.items():
        end = pr.trace[-1]
        print(f"| {label} | {s['bugs']} | {s['distinct_bugs']} | {pr.d_min:.3g} – {pr.d_max:.3g} | "
              f"{end[1]:.3g} – {end[2]:.3g} | {pr.draws} | {s['decision_share_diversity']:.3f} | "
              f"{s['decision_share_regret']:.3f} | {s['decision_share_inconsistency']:.3f} | "
              f"{pr.on_bug_seeds / max(pr.draws, 1):.3f} |")
    print("\nCorpus D (min – max) after each generation, literal energy, old loop:")
    tr = out["literal, old loop"][1].trace
    print("  " + "; ".join(f"{n} cases: {a:.3g} – {b:.3g}" for n, a, b in tr))
    print("\nD on a thinned trajectory vs on every state (mean relative error over the run's trajectories):")
    for label, (_, pr) in out.items():
        print(f"  {label}: " + ", ".join(f"{k} states {np.mean(v):.3%}" for k, v in pr.rel_err.items() if v))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
