"""Table 6 over all bugs of one challenger (issue 51): the AUT's behaviour clusters computed once
on the pooled bugs of every campaign that used the same challenger, and how many of those
clusters each method's bugs fall in.

    python benchmarks/challenger_clusters.py GRID_FOLDER... [--out FILE]

The report's Table 6 clusters each run on its own (at most ``--max-sequences`` bugs), so two
methods' counts are on different dendrograms and cannot be compared cluster by cluster. Here the
campaigns are grouped by their challenger (the sha256 of its model file: a grid's challenger cache
gives every method of a seed the same one), every bug of the group is clustered together
(orchestrator/analysis/behaviour.py: the AUT's observation sequences, z-scored, DTW, average
linkage, cut at tau x d_max), and each method's bugs are counted by the clusters they reach.
Printed per challenger and tau: the clusters of the pool, then per method its bugs, the clusters
it reaches and the clusters only it reaches. ``--out``: the same as Markdown.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def groups(roots: list[Path]) -> dict:
    """(scenario, challenger sha256) -> [(method, seed, run folder)] for every optimality run."""
    from orchestrator.analysis.run_reader import Run, find_runs
    from orchestrator.runs.layout import RunFolder

    out = defaultdict(list)
    for root in roots:
        for d in find_runs(root):
            run = Run.load(d)
            summary = RunFolder(d).summary("optimality")
            if not (run.optimality and summary and summary.get("challenger")):
                continue
            model = RunFolder(d).resolve(summary["challenger"])
            digest = hashlib.sha256(Path(model).read_bytes()).hexdigest()[:12]
            out[(run.scenario, digest)].append((run.optimality_method or "?", run.seed, Path(d)))
    return out


def clusters_by_method(members: list, taus) -> tuple[dict, list[str]]:
    """Cluster the pooled bugs of ``members`` once; per tau, the cluster labels of each method."""
    from orchestrator.analysis.behaviour import bug_trajectories, cluster

    seqs, owner = [], []
    for method, _seed, d in members:
        s, _ids, _total = bug_trajectories(d, max_sequences=None)
        seqs += s
        owner += [method] * len(s)
    res = cluster(seqs, taus, parallel=True)  # a pool of all of a challenger's bugs: ~1 M DTW pairs
    per_tau = {}
    for tau in taus:
        labels = res.labels.get(tau, [])
        by = defaultdict(set)
        for m, lab in zip(owner, labels):
            by[m].add(int(lab))
        per_tau[tau] = (res.counts.get(tau, 0), dict(by))
    return per_tau, owner


def table(roots: list[Path], taus=(0.1, 0.2, 0.3)) -> str:
    lines = []
    for (scenario, digest), members in sorted(groups(roots).items()):
        per_tau, owner = clusters_by_method(members, taus)
        seeds = sorted({s for _, s, _ in members})
        lines += [f"\n### {scenario}, challenger {digest} (seed {', '.join(map(str, seeds))}): "
                  f"{len(owner)} bugs of {len(members)} campaigns clustered together\n",
                  "| tau | clusters | method | bugs | clusters reached | reached by it alone |",
                  "|---:|---:|---|---:|---:|---:|"]
        for tau, (total, by) in per_tau.items():
            for method in sorted({m for m, _, _ in members}):
                mine = by.get(method, set())
                others = set().union(*(v for k, v in by.items() if k != method)) if len(by) > 1 else set()
                lines.append(f"| {tau:.1f} | {total} | {method} | {owner.count(method)} | {len(mine)} | "
                             f"{len(mine - others)} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", type=Path, nargs="+", help="grid folders (or run folders) of optimality campaigns")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    missing = [f for f in args.folders if not f.is_dir()]
    if missing:
        print(f"challenger_clusters: {missing[0]} is not a folder: give grid folders that deltarl grid wrote",
              file=sys.stderr)
        return 2
    text = table(args.folders)
    if not text:
        print("challenger_clusters: no optimality campaign with a challenger in "
              f"{', '.join(map(str, args.folders))}", file=sys.stderr)
        return 2
    print(text)
    if args.out:
        args.out.write_text(f"# Behaviour clusters over all bugs of one challenger (issue 51)\n\nPrinted by "
                            f"`python benchmarks/challenger_clusters.py {' '.join(f.as_posix() for f in args.folders)}"
                            f" --out {args.out.as_posix()}`.\n" + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
