"""Side by side with the peer tool: the PyPI ``mdpfuzz`` package's MDPFuzz vs deltarl's MDPFuzz on
the same Stable-Baselines3 DQN CartPole agent, the same budget of executions and the same failure
oracle (the pole falls or the cart leaves the track before 500 steps).

    pip install mdpfuzz                      # the peer tool; this script installs nothing
    python benchmarks/peer_mdpfuzz.py        # trains the DQN agent first when --agent is missing
    python benchmarks/peer_mdpfuzz.py --budget 300 --agent runs/peer-mdpfuzz/dqn-cartpole.zip

Each tool runs as its own process, timed from outside (interpreter start-up, imports, loading the
agent and the fuzzing: what a user waits for):

* the peer: ``mdpfuzz.Fuzzer(seed, k, tau, gamma, executor).fuzzing(n, policy, test_budget=budget)``
  with an ``Executor`` written here the way the package's README asks for one: a gymnasium
  CartPole-v1 reset, then its state set to the test input, then the agent's ``predict`` step by
  step (one observation per call, as the package runs every use case) up to 500 steps;
* deltarl: ``deltarl run`` on a campaign file (``aut:`` the same ``.zip``, ``workers: auto``,
  MLflow on, the defaults a user gets), ``safety.fuzzer: mdpfuzz``, ``budget: {episodes: budget}``.

Both use K = 10 Gaussian components, τ = 0.01, γ = 0.01, initial states U(-0.05, 0.05)^4 and the
same mutation (a Gaussian step of 0.05 × the bounds' width per dimension, clipped to the
bounds). The peer's ``n`` initial inputs each cost two executions (input and perturbed twin), so
deltarl's sampling fraction is set to ``2n / budget``. Faults: executions on which the oracle
fired (the peer: counted in the executor; deltarl: confirmed failures plus flaky candidates, all
episodes including twins), and how many distinct cells of deltarl's CartPole grid (5 intervals per
dimension) their initial states fall in.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOW, HIGH, MUTATION_SCALE, MAX_STEPS = -0.05, 0.05, 0.05, 500

PEER = r'''
import json, sys, time
import numpy as np
import gymnasium as gym
from mdpfuzz.executor import Executor
from mdpfuzz.mdpfuzz import Fuzzer
from stable_baselines3 import DQN

LOW, HIGH, SCALE, MAX_STEPS = {low}, {high}, {scale}, {max_steps}
failing = []
executions = [0]

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
        executions[0] += 1
        if oracle:
            failing.append(np.asarray(input, dtype=float).tolist())
        return total, oracle, np.array(seq), time.time() - t0

executor = CartPoleExecutor()
policy = executor.load_policy({agent!r})
fuzzer = Fuzzer(random_seed={seed}, k=10, tau=0.01, gamma=0.01, executor=executor)
t0 = time.perf_counter()
fuzzer.fuzzing(n={n_init}, policy=policy, test_budget={budget})
print("PEER " + json.dumps({{"executions": executions[0], "failing_states": failing,
                             "fuzz_seconds": time.perf_counter() - t0}}))
'''


def train_agent(path: Path, steps: int, seed: int) -> None:
    """An SB3 DQN CartPole agent (rl-baselines3-zoo's CartPole-v1 hyperparameters, fewer steps)."""
    from stable_baselines3 import DQN

    model = DQN("MlpPolicy", "CartPole-v1", learning_rate=2.3e-3, batch_size=64, buffer_size=100_000,
                learning_starts=1000, gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128,
                exploration_fraction=0.16, exploration_final_eps=0.04, policy_kwargs={"net_arch": [256, 256]},
                seed=seed, device="cpu", verbose=0)
    model.learn(total_timesteps=steps)
    path.parent.mkdir(parents=True, exist_ok=True)
    model.save(str(path))


def run_peer(agent: Path, budget: int, n_init: int, seed: int, tmp: Path) -> dict:
    script = tmp / "peer_run.py"
    script.write_text(PEER.format(low=LOW, high=HIGH, scale=MUTATION_SCALE, max_steps=MAX_STEPS, agent=str(agent),
                                  seed=seed, n_init=n_init, budget=budget))
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, str(script)], cwd=tmp, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    line = next((x for x in p.stdout.splitlines() if x.startswith("PEER ")), None)
    if p.returncode != 0 or line is None:
        raise RuntimeError(f"the mdpfuzz run failed ({p.returncode}):\n{p.stderr[-3000:]}")
    out = json.loads(line[5:])
    return {"wall": wall, "executions": out["executions"], "failing_states": out["failing_states"],
            "fuzz_seconds": out["fuzz_seconds"]}


def run_deltarl(agent: Path, budget: int, n_init: int, seed: int, tmp: Path) -> dict:
    out = tmp / "deltarl-run"
    camp = tmp / "peer.yaml"
    camp.write_text(f"""name: peer-mdpfuzz
scenario: CartPole-v1
aut: {agent}
seed: {seed}
workers: auto
output: {out}
safety:
  fuzzer: mdpfuzz
  params: {{gmm_k: 10, tau: 0.01, gamma: 0.01, mutation_scale: {MUTATION_SCALE}}}
  budget: {{episodes: {budget}}}
  sampling_fraction: {2 * n_init / budget}
""")
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", "import sys; from orchestrator.cli import main; sys.exit(main())",
                        "run", str(camp), "--quiet"], cwd=REPO, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"deltarl run failed ({p.returncode}):\n{p.stderr[-3000:]}")
    s = json.loads((out / "summary.json").read_text())
    import numpy as np
    import pandas as pd

    eps = pd.read_parquet(out / "episodes", columns=["role", "failure", "initial_state"])
    fail = eps[(eps["role"] == "aut") & eps["failure"]]
    states = np.stack(fail["initial_state"].to_numpy()).tolist() if len(fail) else []
    return {"wall": wall, "executions": s["episodes"], "failures": len(states),
            "failing_states": states, "fuzz_seconds": s["wall_seconds"],
            "executor": f"{s.get('executor')} ({s.get('executor_reason')})"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agent", default=str(REPO / "runs" / "peer-mdpfuzz" / "dqn-cartpole.zip"),
                    help="an SB3 DQN CartPole-v1 .zip; trained here when missing")
    ap.add_argument("--train-steps", type=int, default=30_000, help="DQN steps when training the agent")
    ap.add_argument("--budget", type=int, default=1000, help="executions (episodes) per tool")
    ap.add_argument("--init", type=int, default=125, help="the peer's initial inputs n (2n executions)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if importlib.util.find_spec("mdpfuzz") is None:
        print("The peer tool is not importable: `pip install mdpfuzz` (this script installs nothing), or put a "
              "copy on PYTHONPATH (`pip install --no-deps --target DIR mdpfuzz`).", file=sys.stderr)
        return 2
    agent = Path(args.agent).resolve()  # both tools run in a temporary folder
    if not agent.is_file():
        print(f"training the DQN agent ({args.train_steps} steps) -> {agent}", file=sys.stderr)
        train_agent(agent, args.train_steps, args.seed)
    from envs import get_scenario

    sc = get_scenario("CartPole-v1")
    with tempfile.TemporaryDirectory(prefix="peer-mdpfuzz-") as tmp:
        tmp = Path(tmp)
        d = run_deltarl(agent, args.budget, args.init, args.seed, tmp)
        peer = run_peer(agent, args.budget, args.init, args.seed, tmp)
    import numpy as np

    def distinct(states):
        return sc.count_distinct(np.asarray(states)) if states else 0

    rows = [("mdpfuzz (PyPI)", peer, len(peer["failing_states"]), distinct(peer["failing_states"])),
            ("deltarl mdpfuzz", d, d["failures"], distinct(d["failing_states"]))]
    print(f"### MDPFuzz: PyPI mdpfuzz vs deltarl, SB3 DQN CartPole-v1 ({agent.name}), {args.budget} executions, "
          f"seed {args.seed}\n")
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the end; deltarl ran "
          f"{d['executor']}\n")
    print("| tool | wall time, whole process (s) | fuzzing loop (s) | executions | executions/s (whole process) "
          "| faults (failing executions) | distinct fault cells |\n|---|---:|---:|---:|---:|---:|---:|")
    for name, r, faults, cells in rows:
        print(f"| {name} | {r['wall']:.1f} | {r['fuzz_seconds']:.1f} | {r['executions']} | "
              f"{r['executions'] / r['wall']:.1f} | {faults} | {cells} |")
    print(f"\nratio (PyPI mdpfuzz wall / deltarl wall): **{peer['wall'] / d['wall']:.1f}x**")
    return 0


if __name__ == "__main__":
    sys.exit(main())
