"""Train the MiniGrid-Dynamic-Obstacles-6x6-v0 agent under test: Stable-Baselines3 PPO on the plain
environment (gymnasium.make + minigrid's ImgObsWrapper, the 7 x 7 x 3 view flattened to 147 values, as
experiments/gym/specs/MiniGrid-Dynamic-Obstacles-6x6-v0.yaml has it), rl-baselines3-zoo's MiniGrid PPO
settings (8 environments, n_steps 128, batch 64, 10 epochs, lr 2.5e-4, gamma 0.99, GAE 0.95), a 64 x 64
network, one torch thread, seed 0. Checkpoints every 20,000 steps; --resume continues from the latest
one. Writes model.zip and train.json beside this file.

    nice -n 10 .venv/bin/python experiments/gym/agents/minigrid-dynamic-obstacles-ppo/train.py --steps 150000
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ENV_ID = "MiniGrid-Dynamic-Obstacles-6x6-v0"


def make_env():
    import gymnasium as gym
    import minigrid  # noqa: F401 - registers the MiniGrid environments
    from gymnasium.wrappers import FlattenObservation
    from minigrid.wrappers import ImgObsWrapper

    return FlattenObservation(ImgObsWrapper(gym.make(ENV_ID)))


def main() -> None:
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import CheckpointCallback
    from stable_baselines3.common.env_util import make_vec_env

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=150000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    env = make_vec_env(make_env, n_envs=8, seed=args.seed)
    ckpt = HERE / "checkpoints"
    latest = sorted(ckpt.glob("ppo_*_steps.zip"), key=lambda p: int(p.stem.split("_")[1])) if args.resume else []
    done = int(latest[-1].stem.split("_")[1]) if latest else 0
    t0 = time.time()
    if latest:
        model = PPO.load(latest[-1], env=env)
    else:
        model = PPO("MlpPolicy", env, n_steps=128, batch_size=64, n_epochs=10, learning_rate=2.5e-4, gamma=0.99,
                    gae_lambda=0.95, clip_range=0.2, ent_coef=0.0, policy_kwargs={"net_arch": [64, 64]},
                    seed=args.seed, verbose=0, device="cpu")
    model.learn(total_timesteps=args.steps - done, reset_num_timesteps=not latest,
                callback=CheckpointCallback(save_freq=20000 // 8, save_path=str(ckpt), name_prefix="ppo"))
    model.save(HERE / "model.zip")
    (HERE / "train.json").write_text(json.dumps({"steps": args.steps, "seed": args.seed, "resumed_from": done,
                                                 "seconds": round(time.time() - t0, 1)}, indent=2) + "\n")


if __name__ == "__main__":
    main()
