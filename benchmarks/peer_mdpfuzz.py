"""Side by side with the peer tool: the PyPI ``mdpfuzz`` package's MDPFuzz vs deltarl's MDPFuzz on
the same Stable-Baselines3 DQN CartPole agent, the same budget of executions, the same failure
oracle (the pole falls or the cart leaves the track before 500 steps), over several seeds.

    .venv/bin/pip install mdpfuzz==0.0.3            # the peer tool; this script installs nothing
    python benchmarks/peer_mdpfuzz.py                # seeds 0 1 2, 1,000 executions each, both tools
    python benchmarks/peer_mdpfuzz.py --seeds 0 1 2 3 4 --budget 500
    python benchmarks/peer_mdpfuzz.py --lockstep     # replay the peer's seed-0 run into deltarl, step by step

The agent (default ``benchmarks/agents/sb3-dqn-cartpole-weak/model.zip``, see its ``card.json``) is
a small SB3 DQN that fails from about a fifth of CartPole's initial states, so both tools find
faults; ``--train-agent DIR`` retrains it with the card's recipe.

Each tool runs as its own process, timed from outside, one run at a time. Every run's result is
written to ``--out``/results/ as JSON as soon as it ends and reused when the script is run again
with the same agent, budget, ``--init`` and seed (``--fresh`` reruns): a long series survives an
interruption.

* the peer: ``mdpfuzz.Fuzzer(seed, k, tau, gamma, executor).fuzzing(n, policy, test_budget=budget)``
  with an ``Executor`` written here the way the package's README asks for one: a gymnasium
  CartPole-v1 reset, its state set to the test input, the agent's ``predict`` one observation per
  call up to 500 steps. The package's ``test_budget`` counts its ``n`` initial inputs twice (input
  and perturbed twin), the executions that initialise its GMMs and one per fuzzing iteration; the
  perturbed twin a kept mutant's sensitivity needs (``local_sensitivity=False``, the package's
  default) is an execution it does not count, so it may run a few more executions than the budget:
  the executor counts every execution, and faults per execution divide by that count.
  The peer's run is instrumented from outside (wrappers around its pool's ``select``/``add`` and its
  coverage model's ``sequence_freshness``, which record what they return): which pool entry each
  iteration mutated, each execution's input, return and verdict, each sequence's density.
* deltarl: ``deltarl run`` on a campaign file (``aut:`` the same ``.zip``, ``workers: auto``),
  ``safety.fuzzer: mdpfuzz``, ``budget: {episodes: budget}``, ``inference: alone`` (the agent acts
  on one observation per call, as in the peer's executor; ``--batched`` adds a row with the
  CartPole default, ``batched``), sampling fraction ``2n / budget``.

Both use K = 10 Gaussian components, τ = 0.01, γ = 0.01, initial states U(-0.05, 0.05)^4 and the
same mutation (a Gaussian step of 0.05 × the bounds' width per dimension, clipped to the bounds).
Faults: executions on which the oracle fired (twins included, for both tools); distinct cells:
how many cells of deltarl's CartPole grid (5 intervals per dimension) the failing initial states
fall in. The summary gives mean ± standard deviation over the seeds, the ratio of the means and a
two-sided Mann-Whitney U p-value per metric.

``--lockstep``: replays the peer's run of the first seed into deltarl's ``MDPFuzz`` (generations of
one, the serial algorithm): deltarl's fuzzer is handed the peer's initial inputs, perturbations,
mutants and pool choices in the peer's order, its GMMs are initialised from the peer's first
execution, and every execution runs on deltarl's simulator. It prints where the two agree or
first differ: returns and verdicts of the same inputs, sensitivities, which mutants are kept,
which sequences count as fresh, the corpus.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import inspect
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
AGENT = REPO / "benchmarks" / "agents" / "sb3-dqn-cartpole-weak" / "model.zip"
LOW, HIGH, MUTATION_SCALE, MAX_STEPS = -0.05, 0.05, 0.05, 500
K, TAU, GAMMA = 10, 0.01, 0.01

PEER = r'''
import json, sys, time
import numpy as np
import gymnasium as gym
from mdpfuzz.executor import Executor
from mdpfuzz.gmm import CoverageModel
from mdpfuzz.mdpfuzz import Fuzzer
from mdpfuzz.pool import IndexedPool
from stable_baselines3 import DQN

cfg = json.loads(sys.argv[1])
LOW, HIGH, SCALE, MAX_STEPS = cfg["low"], cfg["high"], cfg["scale"], cfg["max_steps"]
execs = []      # [input, return, oracle, episode length] per execution, in order
selected = []   # [pool index, executions before the iteration] per fuzzing iteration
added = []      # [executions so far, sensitivity] per pool.add (initial inputs and kept mutants)
densities = []  # [executions so far, density] per scored sequence


class CartPoleExecutor(Executor):
    def __init__(self):
        super().__init__(sim_steps=MAX_STEPS, env_seed=0)
        self.env = gym.make("CartPole-v1")

    def generate_input(self, rng):
        return rng.uniform(LOW, HIGH, size=4)

    def generate_inputs(self, rng, n):
        return rng.uniform(LOW, HIGH, size=(n, 4))

    def mutate(self, input, rng, **kwargs):
        return np.clip(input + rng.normal(size=4) * SCALE * (HIGH - LOW), LOW, HIGH)

    def load_policy(self, path):
        return DQN.load(path, device="cpu")

    def execute_policy(self, input, policy):
        t0 = time.time()
        self.env.reset(seed=self.env_seed)
        self.env.unwrapped.state = np.asarray(input, dtype=np.float64).copy()
        obs = np.array(self.env.unwrapped.state, dtype=np.float32)
        total, seq, oracle = 0.0, [obs], False
        for t in range(MAX_STEPS):
            action, _ = policy.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, _ = self.env.step(int(action))
            total += reward
            seq.append(obs)
            if terminated:
                oracle = t + 1 < MAX_STEPS
                break
            if truncated:
                break
        execs.append([np.asarray(input, dtype=float).tolist(), float(total), bool(oracle), len(seq)])
        return total, oracle, np.array(seq), time.time() - t0


# instrumentation: wrap (not change) the package's methods to record what they decide
_select, _add, _fresh = IndexedPool.select, IndexedPool.add, CoverageModel.sequence_freshness


def select(self, rng):
    before = list(self.selected)
    out = _select(self, rng)
    selected.append([next(i for i, (a, b) in enumerate(zip(before, self.selected)) if a != b), len(execs)])
    return out


def add(self, input, acc_reward, coverage, sensitivity, oracle):
    added.append([len(execs), None if sensitivity is None else float(sensitivity)])
    return _add(self, input, acc_reward, coverage, sensitivity, oracle)


def fresh(self, states, states_cond, tau=None):
    d = _fresh(self, states, states_cond, tau=tau)
    densities.append([len(execs), float(d)])
    return d


IndexedPool.select, IndexedPool.add, CoverageModel.sequence_freshness = select, add, fresh
executor = CartPoleExecutor()
policy = executor.load_policy(cfg["agent"])
fuzzer = Fuzzer(random_seed=cfg["seed"], k=cfg["k"], tau=cfg["tau"], gamma=cfg["gamma"], executor=executor)
kwargs = {"test_budget": cfg["budget"]}
if cfg["local_sensitivity"]:
    kwargs["local_sensitivity"] = True
t0 = time.perf_counter()
fuzzer.fuzzing(n=cfg["n_init"], policy=policy, **kwargs)
print("PEER " + json.dumps({"executions": len(execs), "faults": int(sum(e[2] for e in execs)),
                            "fuzz_seconds": time.perf_counter() - t0, "execs": execs, "selected": selected,
                            "added": added, "densities": densities, "n_init": cfg["n_init"],
                            "num_initial_executions": fuzzer.config["num_initial_executions"]}))
'''


# -- the agent -----------------------------------------------------------------------------------
def train_agent(out: Path, seed: int = 0, total: int = 30_000, keep: int = 16_000) -> Path:
    """The card's recipe: SB3 DQN, rl-baselines3-zoo's CartPole-v1 hyperparameters with a 64-64
    network, ``total`` steps (the exploration schedule spans them), the checkpoint at ``keep``."""
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import CheckpointCallback

    torch.set_num_threads(1)
    model = DQN("MlpPolicy", "CartPole-v1", learning_rate=2.3e-3, batch_size=64, buffer_size=100_000,
                learning_starts=1000, gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128,
                exploration_fraction=0.16, exploration_final_eps=0.04, policy_kwargs={"net_arch": [64, 64]},
                seed=seed, device="cpu", verbose=0)
    out.mkdir(parents=True, exist_ok=True)
    model.learn(total_timesteps=total, callback=CheckpointCallback(save_freq=2000, save_path=str(out), name_prefix="dqn"))
    return out / f"dqn_{keep}_steps.zip"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- one run of each tool --------------------------------------------------------------------------
def run_peer(agent: Path, budget: int, n_init: int, seed: int, tmp: Path, local_sensitivity: bool = False) -> dict:
    script = tmp / "peer_run.py"
    script.write_text(PEER)
    cfg = {"low": LOW, "high": HIGH, "scale": MUTATION_SCALE, "max_steps": MAX_STEPS, "agent": str(agent),
           "seed": seed, "n_init": n_init, "budget": budget, "k": K, "tau": TAU, "gamma": GAMMA,
           "local_sensitivity": local_sensitivity}
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, str(script), json.dumps(cfg)], cwd=tmp, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    line = next((x for x in p.stdout.splitlines() if x.startswith("PEER ")), None)
    if p.returncode != 0 or line is None:
        raise RuntimeError(f"the mdpfuzz run failed ({p.returncode}):\n{p.stderr[-3000:]}")
    out = json.loads(line[5:])
    out["failing_states"] = [e[0] for e in out["execs"] if e[2]]
    out["wall"] = wall
    return out


def run_deltarl(agent: Path, budget: int, n_init: int, seed: int, tmp: Path, inference: str = "alone",
                params: dict | None = None) -> dict:
    import pandas as pd

    out = tmp / f"deltarl-run-{seed}-{inference}"
    camp = tmp / "peer.yaml"
    p = {"gmm_k": K, "tau": TAU, "gamma": GAMMA, "mutation_scale": MUTATION_SCALE, **(params or {})}
    camp.write_text(f"""name: peer-mdpfuzz
scenario: CartPole-v1
aut: {agent}
seed: {seed}
workers: auto
output: {out}
safety:
  fuzzer: mdpfuzz
  params: {json.dumps(p)}
  budget: {{episodes: {budget}}}
  sampling_fraction: {2 * n_init / budget}
  inference: {inference}
""")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", "import sys; from orchestrator.cli import main; sys.exit(main())",
                        "run", str(camp), "--quiet"], cwd=REPO, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"deltarl run failed ({r.returncode}):\n{r.stderr[-3000:]}")
    s = json.loads((out / "summary.json").read_text())
    eps = pd.read_parquet(out / "episodes", columns=["role", "phase", "failure", "initial_state"])
    aut = eps[eps["role"] == "aut"]
    fail = aut[aut["failure"]]
    states = np.stack(fail["initial_state"].to_numpy()).tolist() if len(fail) else []
    init = aut["phase"] == "sampling"  # the initial inputs and their twins
    snaps = sorted((out / "snapshots").glob("*.pkl"))  # the last generation's fuzzer state: its counters
    counters = pickle.loads(snaps[-1].read_bytes())["fuzzer"]["counters"] if snaps else {}
    return {"wall": wall, "executions": int(len(aut)), "faults": len(states), "failing_states": states,
            "init_executions": int(init.sum()), "init_faults": int((init & aut["failure"]).sum()),
            "kept": counters.get("accepted"), "fresh_trajectories": counters.get("fresh_trajectories"),
            "fuzz_seconds": s["wall_seconds"], "confirmed": s.get("failures"), "flaky": s.get("flaky_failures"),
            "executor": f"{s.get('executor')} ({s.get('executor_reason')})"}


# -- the series ------------------------------------------------------------------------------------
def tools(args) -> dict:
    """Row name -> a function (seed, tmp) -> result."""
    out = {"mdpfuzz 0.0.3 (PyPI)": lambda seed, tmp: run_peer(args.agent, args.budget, args.init, seed, tmp,
                                                                args.peer_local_sensitivity)}
    params = json.loads(args.deltarl_params)
    out["deltarl mdpfuzz"] = lambda seed, tmp: run_deltarl(args.agent, args.budget, args.init, seed, tmp, "alone", params)
    if args.batched:
        out["deltarl mdpfuzz (inference: batched)"] = lambda seed, tmp: run_deltarl(
            args.agent, args.budget, args.init, seed, tmp, "batched", params)
    return out


def result_path(args, tool: str, seed: int) -> Path:
    slug = "".join(c if c.isalnum() else "-" for c in tool.lower()).strip("-")
    extra = ""
    if tool.startswith("mdpfuzz") and args.peer_local_sensitivity:
        extra = "-local"
    if tool.startswith("deltarl"):  # keyed by what makes the result: the fuzzer's source, the function
        #   that writes the campaign and runs it, and the parameters (not the tables printed from it)
        code = ((REPO / "orchestrator" / "fuzzers" / "mdpfuzz.py").read_bytes()
                + inspect.getsource(run_deltarl).encode())
        extra = "-" + hashlib.sha256(code + args.deltarl_params.encode()).hexdigest()[:8]
    return (Path(args.out) / "results" /
            f"{slug}{extra}-seed{seed}-b{args.budget}-n{args.init}-{args.agent_sha[:12]}.json")


def run_series(args) -> dict:
    results: dict[str, dict[int, dict]] = {}
    with tempfile.TemporaryDirectory(prefix="peer-mdpfuzz-") as tmp:
        for seed in args.seeds:
            for tool, fn in tools(args).items():
                path = result_path(args, tool, seed)
                if path.is_file() and not args.fresh:
                    r = json.loads(path.read_text())
                    print(f"{tool}, seed {seed}: from {path}", file=sys.stderr)
                else:
                    print(f"{tool}, seed {seed}: running ...", file=sys.stderr, flush=True)
                    r = fn(seed, Path(tmp))
                    r["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
                    r["load_average"] = os.getloadavg()[0]
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(json.dumps(r))
                    print(f"  {r['faults']} faults in {r['executions']} executions, {r['wall']:.0f} s -> {path}",
                          file=sys.stderr, flush=True)
                results.setdefault(tool, {})[seed] = r
    return results


def mann_whitney(a, b) -> float:
    from scipy.stats import mannwhitneyu

    if len(a) < 1 or len(b) < 1 or (len(set(a)) == 1 and set(a) == set(b)):
        return 1.0
    return float(mannwhitneyu(a, b, alternative="two-sided").pvalue)


def print_tables(args, results: dict) -> None:
    from envs import get_scenario

    sc = get_scenario("CartPole-v1")

    def cells(r):
        return sc.count_distinct(np.asarray(r["failing_states"])) if r["failing_states"] else 0

    print(f"### MDPFuzz: PyPI mdpfuzz 0.0.3 vs deltarl, SB3 DQN CartPole-v1 ({args.agent_label}), "
          f"{args.budget} executions, {2 * args.init} of them initial inputs and their twins, seeds "
          f"{', '.join(map(str, args.seeds))}\n")
    print("| tool | seed | executions | faults | faults / execution | distinct fault cells | wall (s) | finished |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    per = {}
    for tool, by_seed in results.items():
        for seed in args.seeds:
            r = by_seed[seed]
            rate, c = r["faults"] / r["executions"], cells(r)
            per.setdefault(tool, []).append((rate, c))
            print(f"| {tool} | {seed} | {r['executions']} | {r['faults']} | {rate:.3f} | {c} | {r['wall']:.0f} | "
                  f"{r.get('finished', '')} (load {r.get('load_average', float('nan')):.1f}) |")
    peer_name = next(iter(results))
    peer = per[peer_name]
    print("\n| tool | faults / execution, mean ± sd | min – max | distinct cells, mean ± sd | ratio of mean rates "
          "(tool / PyPI) | Mann-Whitney p (rates) | Mann-Whitney p (cells) | mean rate within the PyPI seeds' "
          "range |\n|---|---:|---:|---:|---:|---:|---:|---|")
    lo, hi = min(x[0] for x in peer), max(x[0] for x in peer)
    for tool, vals in per.items():
        rates, cs = [v[0] for v in vals], [v[1] for v in vals]
        m = float(np.mean(rates))
        ratio = m / float(np.mean([v[0] for v in peer])) if np.mean([v[0] for v in peer]) else float("nan")
        sd = float(np.std(rates, ddof=1)) if len(rates) > 1 else 0.0
        csd = float(np.std(cs, ddof=1)) if len(cs) > 1 else 0.0
        same = tool == peer_name
        print(f"| {tool} | {m:.3f} ± {sd:.3f} | {min(rates):.3f} – {max(rates):.3f} | {np.mean(cs):.1f} ± {csd:.1f} | "
              f"{ratio:.2f} | {'—' if same else f'{mann_whitney(rates, [v[0] for v in peer]):.2f}'} | "
              f"{'—' if same else f'{mann_whitney(cs, [v[1] for v in peer]):.2f}'} | "
              f"{'—' if same else ('yes' if lo <= m <= hi else 'no')} |")
    print_speed(results)
    print("\nWhere the faults are: the initial inputs with their twins (the peer: also its GMM-initialising "
          "execution) and the fuzzing loop (mutants, and the twins of kept mutants).\n")
    print("| tool | seed | initial: executions | initial: faults | loop: executions | loop: faults | "
          "loop: faults / execution | mutants kept |\n|---|---:|---:|---:|---:|---:|---:|---:|")
    for tool, by_seed in results.items():
        for seed in args.seeds:
            split = phase_split(by_seed[seed])
            if split is None:
                continue
            (ie, iff), (le, lf), kept = split
            print(f"| {tool} | {seed} | {ie} | {iff} | {le} | {lf} | {lf / le if le else float('nan'):.3f} | "
                  f"{'—' if kept is None else kept} |")
    print(f"\n{os.cpu_count()} CPUs; each run's load average when it finished is in the first table.")


IDLE_LOAD = 1.5  # a run whose 1-minute load average at its end is above this shared the machine


def print_speed(results: dict) -> None:
    """Wall time and faults found per second, each tool against the PyPI tool, over the runs that had
    the machine to themselves (load average at the end <= IDLE_LOAD; the others' walls are inflated)."""
    print(f"\nSpeed, over the runs that ended with a load average <= {IDLE_LOAD} (the machine to themselves): "
          "whole-process wall time and faults found per second of it.\n")
    print("| tool | runs (seeds) | wall (s), mean ± sd | faults / s, mean ± sd | wall ratio (PyPI / tool) | "
          "faults-per-second ratio (tool / PyPI) |\n|---|---|---:|---:|---:|---:|")
    rows = {}
    for tool, by_seed in results.items():
        idle = {s: r for s, r in by_seed.items() if r.get("load_average", 0.0) <= IDLE_LOAD}
        walls = [r["wall"] for r in idle.values()]
        fps = [r["faults"] / r["wall"] for r in idle.values()]
        rows[tool] = (sorted(idle), walls, fps)
    _, peer_walls, peer_fps = next(iter(rows.values()))
    for tool, (seeds, walls, fps) in rows.items():
        if not walls:
            print(f"| {tool} | 0 | — | — | — | — |")
            continue
        sd = (lambda v: float(np.std(v, ddof=1)) if len(v) > 1 else 0.0)  # noqa: E731
        wr = np.mean(peer_walls) / np.mean(walls) if peer_walls else float("nan")
        fr = np.mean(fps) / np.mean(peer_fps) if peer_fps and np.mean(peer_fps) else float("nan")
        print(f"| {tool} | {len(seeds)} ({', '.join(map(str, seeds))}) | {np.mean(walls):.1f} ± {sd(walls):.1f} | "
              f"{np.mean(fps):.2f} ± {sd(fps):.2f} | {wr:.1f}x | {fr:.1f}x |")


def phase_split(r: dict):
    """((initial executions, faults), (loop executions, faults), mutants kept or None) of one run."""
    if "execs" in r:  # the peer
        m = int(r["num_initial_executions"]) + 2 * int(r["n_init"])
        fails = [bool(e[2]) for e in r["execs"]]
        return (m, sum(fails[:m])), (len(fails) - m, sum(fails[m:])), len(r["added"]) - int(r["n_init"])
    if "init_executions" in r:
        ie, iff = r["init_executions"], r["init_faults"]
        return (ie, iff), (r["executions"] - ie, r["faults"] - iff), r.get("kept")
    return None


# -- lockstep ----------------------------------------------------------------------------------------
class _Replayed:
    """The CartPole scenario, except that ``sample`` and ``mutate`` hand out the peer's inputs in the
    peer's order (its initial inputs; then its twins and mutants) instead of drawing new ones."""

    def __init__(self, base, seeds: np.ndarray, perturbed: np.ndarray):
        self._base, self._seeds, self._perturbed = base, seeds, perturbed
        self.i_seed = self.i_pert = 0

    def __getattr__(self, name):
        return getattr(self._base, name)

    def sample(self, rng, n):
        out = self._seeds[self.i_seed:self.i_seed + n]
        self.i_seed += n
        return out.copy()

    def mutate(self, states, rng, scale=None):
        n = np.atleast_2d(states).shape[0]
        out = self._perturbed[self.i_pert:self.i_pert + n]
        self.i_pert += n
        if out.shape[0] != n:
            raise RuntimeError("lockstep: deltarl asked for more perturbations than the peer made")
        return out.copy()


def lockstep(args, peer: dict) -> None:
    """Replay the peer's run into deltarl's MDPFuzz (see the module docstring) and print the comparison."""
    from envs import get_scenario
    from orchestrator.fuzzers.base import Feedback
    from orchestrator.fuzzers.mdpfuzz import MDPFuzz
    from workers.policies import load_policy
    from workers.rollout import rollout

    sc = get_scenario("CartPole-v1")
    policy = load_policy(str(args.agent), scenario=sc, device="cpu")
    execs = peer["execs"]
    g, n = int(peer["num_initial_executions"]), int(peer["n_init"])
    x = np.array([e[0] for e in execs], dtype=np.float64)
    peer_ret = np.array([e[1] for e in execs])
    peer_fail = np.array([e[2] for e in execs], dtype=bool)
    seed_rows = np.arange(g, g + 2 * n, 2)
    pert_rows = np.setdiff1d(np.arange(g, len(execs)), seed_rows)  # twins and mutants, in execution order
    replay = _Replayed(sc, x[seed_rows], x[pert_rows])
    params = {"gmm_k": K, "tau": TAU, "gamma": GAMMA, "mutation_scale": MUTATION_SCALE,
              **json.loads(args.deltarl_params)}
    fz = MDPFuzz(replay, seed=0, **params)
    # the peer initialises its GMMs from the first K states of its first execution(s); so does deltarl here
    init = rollout(sc, policy, x[:g], seed=0, alone=True)
    fz._init_gmms(Feedback.from_result(init).traj_obs[-1:])
    sel = {int(at): int(idx) for idx, at in peer["selected"]}  # executions before the iteration -> pool index
    peer_density = {int(at): d for at, d in peer["densities"]}
    peer_sens = {int(at): s for at, s in peer["added"]}

    rows = []  # per execution: peer row, kind, deltarl return, fail, fresh?
    ret_diff = fail_diff = 0
    done = g
    fz.start_phase("sampling")
    orig_select = fz.corpus.select
    while done < len(execs):
        if done == g + 2 * n:
            fz.start_phase("fuzzing")
        if fz.phase == "fuzzing" and not fz._queue:
            idx = sel.get(done)
            if idx is None:
                break
            fz.corpus.select = lambda rng, k, _i=idx: np.array([_i] * k, dtype=np.int64)
        p = fz.propose(1)
        fz.corpus.select = orig_select
        if not np.array_equal(p.states[0], x[done]):
            print(f"lockstep: execution {done}: deltarl proposed {p.states[0]}, the peer ran {x[done]}: the "
                  f"replay lost step ({p.tags['kind'][0]})")
            break
        res = rollout(sc, policy, p.states, seed=done, alone=True)
        fb = Feedback.from_result(res)
        before = (len(fz.corpus), fz._counters["fresh_trajectories"], fz._counters["accepted"])
        fz.observe(p, fb)
        kind = str(p.tags["kind"][0])
        ret_diff += int(fb.returns[0] != peer_ret[done])
        fail_diff += int(bool(fb.failure[0]) != peer_fail[done])
        rows.append({"row": done, "kind": kind, "ret": float(fb.returns[0]), "peer_ret": float(peer_ret[done]),
                     "fresh": fz._counters["fresh_trajectories"] > before[1],
                     "accepted": fz._counters["accepted"] > before[2], "corpus": len(fz.corpus)})
        done += 1
    # the peer's view of the same executions
    peer_fresh = {at - (2 if at <= g + 2 * n else 1): d < TAU for at, d in peer_density.items()}
    scored = [r for r in rows if r["kind"] != "twin"]
    agree_fresh = sum(peer_fresh.get(r["row"]) == r["fresh"] for r in scored)
    differ = [f"{r['row']} ({r['kind']}: peer {'fresh' if peer_fresh.get(r['row']) else 'not fresh'})"
              for r in scored if peer_fresh.get(r["row"]) != r["fresh"]]
    kept_peer = [at for at, s in peer["added"] if at > g + 2 * n]
    kept_deltarl = sum(r["accepted"] for r in rows)
    sens_d = fz.corpus.scores["sensitivity"][:n]
    sens_p = np.array([s for at, s in peer["added"][:n]], dtype=float)
    ok = np.isfinite(sens_p) & (sens_p > 0)
    ratio = sens_d[ok] / sens_p[ok] if ok.any() else np.array([np.nan])
    print(f"### Lockstep: the peer's seed-{args.seeds[0]} run ({len(execs)} executions) replayed into deltarl's "
          f"MDPFuzz\n")
    print("| check | result |\n|---|---|")
    print(f"| executions replayed | {len(rows)} of {len(execs) - g} (the peer's {g} GMM-initialisation execution(s) "
          f"initialise deltarl's GMMs) |")
    print(f"| same return on the same input | {len(rows) - ret_diff} of {len(rows)} |")
    print(f"| same verdict on the same input | {len(rows) - fail_diff} of {len(rows)} |")
    print(f"| initial inputs' sensitivity, deltarl / peer | {np.nanmin(ratio):.4f} – {np.nanmax(ratio):.4f} over "
          f"{int(ok.sum())} inputs with a positive one (deltarl measures ‖δ‖ in units of the bounds' width 0.1: "
          f"expected 0.1000); zero for both: {int(((sens_d == 0) & (sens_p == 0)).sum())} |")
    print(f"| sequences scored | {len(scored)}; fresh for the peer {sum(bool(v) for v in peer_fresh.values())}, "
          f"for deltarl {sum(r['fresh'] for r in scored)}; same decision {agree_fresh}"
          f"{'; not on execution ' + ', '.join(differ[:5]) if differ else ''} |")
    print(f"| mutants kept | peer {len(kept_peer)}, deltarl {kept_deltarl} |")
    print(f"| corpus at the end | deltarl {len(fz.corpus)}, peer {len(peer['added'])} pool entries |")
    fails = [r for r in rows if r["kind"] == "mutant"]
    print(f"| failing mutants | deltarl {sum(r['ret'] < MAX_STEPS for r in fails)}, peer "
          f"{int(sum(peer_fail[r['row']] for r in fails))} of {len(fails)} |")
    print(f"| peer's sensitivities of kept mutants | {[peer_sens[a] for a in kept_peer][:10]} |")


# -- main --------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agent", default=str(AGENT), help="an SB3 DQN CartPole-v1 .zip (default: the shipped weak agent)")
    ap.add_argument("--train-agent", metavar="DIR", help="retrain the default agent with its card's recipe into DIR "
                    "(checkpoints every 2,000 steps), print the kept checkpoint's sha256 and exit")
    ap.add_argument("--budget", type=int, default=1000, help="executions (episodes) per tool and seed")
    ap.add_argument("--init", type=int, default=125, help="the peer's initial inputs n (2n executions)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default=str(REPO / "runs" / "peer-mdpfuzz"), help="results folder (per-run JSON)")
    ap.add_argument("--fresh", action="store_true", help="rerun runs whose results are already in --out")
    ap.add_argument("--batched", action="store_true", help="add deltarl with inference: batched")
    ap.add_argument("--deltarl-params", default="{}", help="extra MDPFuzz parameters for deltarl, as JSON")
    ap.add_argument("--peer-local-sensitivity", action="store_true",
                    help="call the peer with local_sensitivity=True (the replication study's setting)")
    ap.add_argument("--lockstep", action="store_true", help="replay the first seed's peer run into deltarl")
    args = ap.parse_args(argv)
    if args.train_agent:
        path = train_agent(Path(args.train_agent))
        print(f"{path}  sha256 {sha256(path)}")
        return 0
    if importlib.util.find_spec("mdpfuzz") is None:
        print("The peer tool is not importable: `.venv/bin/pip install mdpfuzz==0.0.3` (this script installs "
              "nothing).", file=sys.stderr)
        return 2
    args.agent = Path(args.agent).resolve()  # both tools run in a temporary folder
    if not args.agent.is_file():
        print(f"no agent at {args.agent} (--train-agent DIR makes one)", file=sys.stderr)
        return 2
    if args.budget <= 2 * args.init + 1 or args.init < 1:
        print(f"--budget ({args.budget}) must exceed 2 × --init ({args.init}) + 1", file=sys.stderr)
        return 2
    try:
        json.loads(args.deltarl_params)
    except json.JSONDecodeError as e:
        print(f"--deltarl-params is not JSON: {e}", file=sys.stderr)
        return 2
    args.agent_sha = sha256(args.agent)
    args.agent_label = (args.agent.parent.name if args.agent == AGENT.resolve() else args.agent.name)
    if args.lockstep:
        args.seeds = args.seeds[:1]
        path = result_path(args, "mdpfuzz 0.0.3 (PyPI)", args.seeds[0])
        if path.is_file() and not args.fresh:
            peer = json.loads(path.read_text())
        else:
            with tempfile.TemporaryDirectory(prefix="peer-mdpfuzz-") as tmp:
                peer = run_peer(args.agent, args.budget, args.init, args.seeds[0], Path(tmp), args.peer_local_sensitivity)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(peer))
        lockstep(args, peer)
        return 0
    print_tables(args, run_series(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
