"""Train the highway-v0 agent under test: Stable-Baselines3 DQN on the plain environment
(gymnasium.make("highway-v0", config=...) with the config of experiments/gym/specs/highway-v0.yaml,
observations flattened to 25 values), highway-env's documented DQN settings with a smaller network,
one torch thread, seed 0. Checkpoints every 2,000 steps; --resume continues from the latest one
(the replay buffer starts empty again). Writes model.zip and train.json beside this file.

    nice -n 10 .venv/bin/python experiments/gym/agents/highway-v0-dqn/train.py --steps 15000
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SPEC = HERE.parents[1] / "specs" / "highway-v0.yaml"


def make_env():
    import gymnasium as gym
    import highway_env  # noqa: F401 - registers highway-v0
    import yaml
    from gymnasium.wrappers import FlattenObservation

    config = yaml.safe_load(SPEC.read_text())["make"]["config"]
    return FlattenObservation(gym.make("highway-v0", config=config))


def main() -> None:
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import CheckpointCallback

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=15000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    env = make_env()
    ckpt = HERE / "checkpoints"
    done = 0
    latest = sorted(ckpt.glob("dqn_*_steps.zip"), key=lambda p: int(p.stem.split("_")[1])) if args.resume else []
    t0 = time.time()
    if latest:
        model = DQN.load(latest[-1], env=env)
        done = int(latest[-1].stem.split("_")[1])
    else:
        model = DQN("MlpPolicy", env, policy_kwargs={"net_arch": [128, 128]}, learning_rate=5e-4, buffer_size=15000,
                    learning_starts=200, batch_size=32, gamma=0.8, train_freq=1, gradient_steps=1,
                    target_update_interval=50, exploration_fraction=0.7, seed=args.seed, verbose=0, device="cpu")
    model.learn(total_timesteps=args.steps - done, reset_num_timesteps=not latest,
                callback=CheckpointCallback(save_freq=2000, save_path=str(ckpt), name_prefix="dqn"))
    model.save(HERE / "model.zip")
    (HERE / "train.json").write_text(json.dumps({"steps": args.steps, "seed": args.seed, "resumed_from": done,
                                                 "seconds": round(time.time() - t0, 1)}, indent=2) + "\n")


if __name__ == "__main__":
    main()
