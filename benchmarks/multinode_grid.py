"""A grid of campaigns on 3 worker nodes vs 1 worker node with the same CPUs in total.

    sudo .venv/bin/python benchmarks/multinode_grid.py [--campaigns 6] [--episodes 300] [--cpus 3]

Both layouts are real Ray clusters on this machine (:class:`orchestrator.cluster.multinode.NodeCluster`):
a head (``num-cpus 0``) plus either one worker node with ``--cpus`` logical CPUs or ``--cpus``
worker nodes with one each, every node in its own mount namespace (it sees the shared folder,
not the checkout). The same grid (CureFuzz safety campaigns on the zoo CartPole agent, one seed
per campaign; each campaign a Ray task of one CPU, its rollouts in that task, as ``deltarl grid``
runs them) is submitted as a Ray Job (``deltarl submit``'s path: the code and inputs travel in
the job's runtime_env) and timed from submission to SUCCEEDED. The table gives the wall time (and
its ratio to the one-node layout), the campaigns each node ran (from the head's state API), and
the bytes each layout moved between nodes through the object store (Ray's
``ray_object_manager_bytes{Type="Received"}``, summed over the nodes). Both layouts must find the
same failures (same seeds): the script checks it and says so. Linux, root (mount namespaces).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GRID = """
name: bench
output: {output}
base:
  scenario: CartPole-v1
  aut: zoo:CartPole-v1
  safety: {{fuzzer: curefuzz, budget: {{episodes: {episodes}}}, generation_size: 32}}
axes:
  seed: {seeds}
resources: {{num_cpus: 1}}
"""


def failures_digest(out: Path) -> tuple[str, int]:
    """A digest of every campaign's failures (episode ids and wall time aside) and how many there are."""
    h, n = hashlib.sha256(), 0
    for run in sorted(p for p in out.iterdir() if p.is_dir() and p.name.startswith("bench-")):
        f = run / "failures.parquet"
        if f.is_file():
            df = pd.read_parquet(f)  # an episode id names the process slot that wrote it: left out
            df = df.drop(columns=["wall_time", *[c for c in df.columns if c.endswith("episode_id")]], errors="ignore")
            rows = sorted(df.to_json(orient="records", lines=True, double_precision=15).splitlines())  # arrays too
            h.update(run.name.encode() + "\n".join(rows).encode())
            n += len(df)
    return h.hexdigest()[:12], n


def run_layout(label: str, workers: list[dict], args) -> dict:
    from orchestrator.campaign.grid import load_grid
    from orchestrator.cluster import jobs, ray_compat
    from orchestrator.cluster.multinode import NodeCluster

    root = Path(f"/var/tmp/deltarl-mnbench-{os.getpid()}-{len(workers)}")
    shutil.rmtree(root, ignore_errors=True)
    cluster = NodeCluster(root, workers)
    load_start = os.getloadavg()[0]
    t_start = time.perf_counter()
    cluster.start()
    started = time.perf_counter() - t_start
    try:
        os.environ.update(cluster.client_env())
        ray_compat.reload_auth_mode()
        grid_path = root / "grid.yaml"
        grid_path.write_text(GRID.format(output=cluster.shared / "grid", episodes=args.episodes,
                                         seeds=list(range(args.campaigns))))
        t0 = time.perf_counter()
        job = jobs.submit_grid(load_grid(grid_path), address=cluster.dashboard_url)
        status = jobs.wait(job, cluster.dashboard_url, timeout=3600, poll=0.5)
        wall = time.perf_counter() - t0
        load_end = os.getloadavg()[0]
        if status != "SUCCEEDED":
            raise SystemExit(f"{label}: the grid job ended {status}:\n{jobs.logs(job, cluster.dashboard_url)[-3000:]}")
        names = cluster.node_names()
        ray_job = cluster.job(job)["job_id"]
        per_node: dict[str, int] = {}
        for t in cluster.state("tasks", job_id=ray_job):
            if t.get("name", "").endswith("_run_one") and t.get("state") == "FINISHED":
                per_node[names.get(t.get("node_id"), "?")] = per_node.get(names.get(t.get("node_id"), "?"), 0) + 1
        time.sleep(12)  # Ray's metrics agents export every few seconds
        moved = sum(n.metric("ray_object_manager_bytes", Type="Received") for n in cluster.nodes)
        digest = failures_digest(cluster.shared / "grid")
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    return {"layout": label, "cluster_start_s": started, "grid_wall_s": wall,
            "campaigns_per_node": ", ".join(f"{k} {v}" for k, v in sorted(per_node.items())),
            "object_store_bytes_between_nodes": moved, "failures_digest": digest,
            "load": f"{load_start:.1f} -> {load_end:.1f}"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--campaigns", type=int, default=6)
    ap.add_argument("--episodes", type=int, default=300)
    ap.add_argument("--cpus", type=int, default=3, help="logical CPUs in total, either layout")
    ap.add_argument("--one-layout", choices=["1", "n"], help=argparse.SUPPRESS)  # a layout in this process
    args = ap.parse_args(argv)
    if os.geteuid() != 0 or not sys.platform.startswith("linux"):
        print("needs Linux and root: every node is a mount namespace (unshare -m)", file=sys.stderr)
        return 2
    if args.one_layout:
        label, workers = (("1 worker node", [{"num_cpus": args.cpus}]) if args.one_layout == "1"
                          else (f"{args.cpus} worker nodes", [{"num_cpus": 1}] * args.cpus))
        print("LAYOUT " + json.dumps(run_layout(label, workers, args)))
        return 0
    rows = []
    for layout in ("1", "n"):  # each layout in a fresh process: Ray's client keeps the first cluster's token
        cmd = [sys.executable, __file__, "--one-layout", layout, "--campaigns", str(args.campaigns),
               "--episodes", str(args.episodes), "--cpus", str(args.cpus)]
        out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        if out.returncode != 0:
            print(out.stdout[-3000:], file=sys.stderr)
            return out.returncode
        rows.append(json.loads(next(ln for ln in out.stdout.splitlines() if ln.startswith("LAYOUT "))[len("LAYOUT "):]))
    base = rows[0]["grid_wall_s"]
    print(f"\n{args.campaigns} CureFuzz campaigns x {args.episodes} CartPole episodes, {args.cpus} logical CPUs "
          f"in total (host: {os.cpu_count()} cores)\n")
    print("| layout | cluster start (s) | grid wall (s) | vs 1 node | campaigns per node | object-store bytes between nodes "
          "| host load, 1 min (start -> end) |")
    print("|---|---:|---:|---:|---|---:|---|")
    for r in rows:
        print(f"| {r['layout']} | {r['cluster_start_s']:.1f} | {r['grid_wall_s']:.1f} | {r['grid_wall_s'] / base:.2f} | "
              f"{r['campaigns_per_node']} | {r['object_store_bytes_between_nodes']:,.0f} | {r['load']} |")
    same = len({tuple(r["failures_digest"]) for r in rows}) == 1
    found = "; ".join(f"{r['layout']}: {r['failures_digest'][1]} failures, digest {r['failures_digest'][0]}" for r in rows)
    print(f"\nsame failures in both layouts: {'yes' if same else 'NO'} ({found})")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
