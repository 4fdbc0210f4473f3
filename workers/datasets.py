"""Recorded steps -> a d3rlpy ``MDPDataset`` (the dataset D of a challenger, D_superior of a repair).

Plain functions: the run-folder store and the repair both build their datasets here, so the
end-of-episode rules live in one place.
"""

from __future__ import annotations

import numpy as np


def steps_to_mdp_dataset(steps: dict, *, discrete: bool, action_size: int):
    """A d3rlpy ``MDPDataset`` from steps in the form :meth:`RunStore.read_steps` returns them
    (episodes contiguous, t ascending). Every episode ends with exactly one of terminal /
    timeout: a last step with neither gets ``timeout = 1``, a step flagged both keeps only
    ``terminal``."""
    from d3rlpy.constants import ActionSpace
    from d3rlpy.dataset import MDPDataset

    n = int(np.asarray(steps["rewards"]).shape[0])
    eid = np.asarray(steps["episode_id"])
    last = np.ones(n, dtype=bool)
    last[:-1] = eid[1:] != eid[:-1]
    terminals = np.asarray(steps["terminals"], bool) & last
    timeouts = (np.asarray(steps["timeouts"], bool) | (last & ~terminals)) & ~terminals & last
    obs = np.asarray(steps["obs"])
    actions = np.asarray(steps["actions"])
    return MDPDataset(
        observations=np.ascontiguousarray(obs.reshape(n, -1), dtype=np.float32),
        actions=actions.astype(np.int64, copy=False) if discrete else np.ascontiguousarray(actions, dtype=np.float32),
        rewards=np.asarray(steps["rewards"]).astype(np.float32),
        terminals=terminals.astype(np.float32),
        timeouts=timeouts.astype(np.float32),
        action_space=ActionSpace.DISCRETE if discrete else ActionSpace.CONTINUOUS,
        action_size=int(action_size),
    )
