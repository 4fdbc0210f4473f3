"""Train the LunarLander-v3 agent under test: Stable-Baselines3 DQN on the plain environment
(gymnasium.make("LunarLander-v3")), rl-baselines3-zoo's LunarLander DQN settings (lr 6.3e-4, batch 128,
buffer 50,000, gamma 0.99, target update every 250 steps, train every 4 steps with as many gradient
steps, exploration over the first 12% down to 0.1) with a 128 x 128 network instead of 256 x 256,
one torch thread, seed 0. Checkpoints every 10,000 steps; --resume continues from the latest one (the
replay buffer starts empty again). Writes model.zip and train.json beside this file.

    nice -n 10 .venv/bin/python experiments/gym/agents/lunar-lander-dqn/train.py --steps 50000
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    import gymnasium as gym
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import CheckpointCallback

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=50000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    env = gym.make("LunarLander-v3")
    ckpt = HERE / "checkpoints"
    latest = sorted(ckpt.glob("dqn_*_steps.zip"), key=lambda p: int(p.stem.split("_")[1])) if args.resume else []
    done = int(latest[-1].stem.split("_")[1]) if latest else 0
    t0 = time.time()
    if latest:
        model = DQN.load(latest[-1], env=env)
    else:
        model = DQN("MlpPolicy", env, learning_rate=6.3e-4, batch_size=128, buffer_size=50000, learning_starts=0,
                    gamma=0.99, target_update_interval=250, train_freq=4, gradient_steps=-1,
                    exploration_fraction=0.12, exploration_final_eps=0.1, policy_kwargs={"net_arch": [128, 128]},
                    seed=args.seed, verbose=0, device="cpu")
    model.learn(total_timesteps=args.steps - done, reset_num_timesteps=not latest,
                callback=CheckpointCallback(save_freq=10000, save_path=str(ckpt), name_prefix="dqn"))
    model.save(HERE / "model.zip")
    (HERE / "train.json").write_text(json.dumps({"steps": args.steps, "seed": args.seed, "resumed_from": done,
                                                 "seconds": round(time.time() - t0, 1)}, indent=2) + "\n")


if __name__ == "__main__":
    main()
