"""One policy shared by several agents (``shared_agents: K`` in an AUT training config).

A scenario whose observation and action are K equal per-agent slices (CoopNavi: observation
42 = 3 x 14, agent i's own MPE observation is ``obs[14 i : 14 (i + 1)]``; action 6 = 3 x 2,
agent i's force ``act[2 i : 2 (i + 1)]``) can be trained as one per-agent policy applied to each
agent (parameter sharing, as MADDPG's actors see only their own observation): the d3rlpy
algorithm is built for one slice, every environment step gives one transition per agent (its
slice of the observation, its actions, the shared reward, its slice of the next observation),
and the joint action is the per-agent actions concatenated.

    joint = shared_actions(per_agent_act, agents=3, obs_dim=14, act_dim=2)
    joint(obs)            # obs (n, 42) -> actions (n, 6); numpy arrays or torch tensors

The split is a reshape: row r of an (n, K*d) batch becomes rows K*r .. K*r + K - 1 of an
(n*K, d) batch (agent 0 first), so one call of the per-agent policy acts for every agent.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AgentSplit:
    """How a joint observation/action splits into ``agents`` equal per-agent slices."""

    agents: int
    obs_dim: int  # per agent
    act_dim: int  # per agent

    def split_obs(self, obs):
        """(n, K*obs_dim) or (K*obs_dim,) -> (n*K, obs_dim) (or (K, obs_dim)): agent i of row r is row K*r + i."""
        return obs.reshape(-1, self.obs_dim)

    def join_actions(self, actions):
        """(n*K, act_dim) -> (n, K*act_dim): the inverse of the split, for actions."""
        return actions.reshape(-1, self.agents * self.act_dim)

    def spaces(self):
        """A stand-in environment with one agent's spaces (gymnasium Boxes in [-1, 1]), for
        d3rlpy's ``build_with_env`` and ``create_fifo_replay_buffer``."""
        import types

        import gymnasium as gym

        return types.SimpleNamespace(
            observation_space=gym.spaces.Box(-np.inf, np.inf, (self.obs_dim,), np.float32),
            action_space=gym.spaces.Box(-1.0, 1.0, (self.act_dim,), np.float32),
        )

    def episodes(self, observations: np.ndarray, actions: np.ndarray, rewards: np.ndarray, terminated: bool):
        """One d3rlpy ``Episode`` per agent from a joint episode: ``observations`` (T or T+1, K*obs_dim)
        (T+1 when the final observation is there to bootstrap from), ``actions`` (T, K*act_dim),
        ``rewards`` (T,) shared by every agent. A final observation gets a zero action and reward
        row beside it (d3rlpy counts an episode's length by its actions; the row is never a
        transition's own action or reward: a non-terminal episode of T+1 rows holds T transitions)."""
        from d3rlpy.dataset import Episode

        obs = np.asarray(observations, dtype=np.float32)
        act = np.asarray(actions, dtype=np.float32)
        rew = np.asarray(rewards, dtype=np.float32).reshape(-1, 1)
        if len(obs) == len(act) + 1:
            act = np.concatenate([act, np.zeros((1, act.shape[1]), np.float32)])
            rew = np.concatenate([rew, np.zeros((1, 1), np.float32)])
        assert len(obs) == len(act) == len(rew), (obs.shape, act.shape, rew.shape)
        return [
            Episode(
                observations=np.ascontiguousarray(obs[:, i * self.obs_dim:(i + 1) * self.obs_dim]),
                actions=np.ascontiguousarray(act[:, i * self.act_dim:(i + 1) * self.act_dim]),
                rewards=rew.copy(),
                terminated=bool(terminated),
            )
            for i in range(self.agents)
        ]


def agent_split(scenario, agents: int) -> AgentSplit:
    """The split of ``scenario`` into ``agents`` slices; ``ValueError`` naming the fix when the sizes
    do not divide or the per-agent action bounds differ (the caller wraps it in its own error)."""
    obs_dim, spec = int(scenario.obs_dim), scenario.action
    if spec.discrete:
        raise ValueError(f"{scenario.name} has discrete actions (one index for the whole scenario), which do not "
                         f"split per agent: remove shared_agents")
    act_dim = int(np.prod(spec.shape))
    if obs_dim % agents or act_dim % agents:
        divisors = [k for k in range(2, min(obs_dim, act_dim) + 1) if obs_dim % k == 0 and act_dim % k == 0]
        hint = (f"set shared_agents to a number that divides both ({', '.join(map(str, divisors))}) or remove it"
                if divisors else "remove shared_agents (no number of agents divides both)")
        raise ValueError(f"shared_agents: {agents} agents do not split {scenario.name}'s observation ({obs_dim}) and "
                         f"action ({act_dim}) into equal slices; {hint}")
    split = AgentSplit(agents, obs_dim // agents, act_dim // agents)
    for bound in (spec.low, spec.high):
        if bound is not None and not np.all(np.asarray(bound).reshape(agents, -1) == np.asarray(bound).reshape(agents, -1)[0]):
            raise ValueError(f"shared_agents: the per-agent action slices of {scenario.name} have different bounds "
                             f"({np.asarray(bound).tolist()}), so one policy cannot act for every agent; remove shared_agents")
    return split


def shared_actions(act, split: AgentSplit):
    """The joint policy: ``act`` (per-agent observations (m, obs_dim) -> actions (m, act_dim)) applied
    to every agent's slice of (n, K*obs_dim) in one call, the actions concatenated in agent order.
    Written with reshapes only, so it traces to TorchScript with a free batch size."""

    def joint(x):
        return split.join_actions(act(split.split_obs(x)))

    return joint
