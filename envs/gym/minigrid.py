"""MiniGrid's ``MiniGrid-Dynamic-Obstacles-*`` put into a chosen start: the cells of the moving
obstacles (a setter written as a user function for a third-party grid world; the spec is
experiments/gym/specs/MiniGrid-Dynamic-Obstacles-6x6-v0.yaml).

The state is ``x_1, y_1, ..., x_K, y_K``: the cell of each obstacle (ball), integers inside the
walls. ``reset_to`` resets with the seed (the obstacles' random moves come from it), takes the
balls off the grid and puts ball i on its cell; a cell that is not free (the agent's start, the
goal, a ball placed before) sends the ball to the next free cell in reading order (left to right,
then down), so every state in the bounds is a valid scene and the same state is always the same
scene. No ``state_of``: a moved ball would not read back as the state (the spec samples uniformly).
"""

from __future__ import annotations

import numpy as np


def _free(u, x: int, y: int) -> bool:
    return u.grid.get(x, y) is None and (x, y) != tuple(int(v) for v in u.agent_pos)


def reset_to(env, state, seed):
    from envs.gym.setters import wrapped_obs

    env.reset(seed=int(seed))
    u = env.unwrapped
    for ball in u.obstacles:
        if ball.cur_pos is not None:
            u.grid.set(int(ball.cur_pos[0]), int(ball.cur_pos[1]), None)
    cells = [(x, y) for y in range(1, u.height - 1) for x in range(1, u.width - 1)]
    state = np.asarray(state, dtype=np.float64)
    for i, ball in enumerate(u.obstacles):
        want = (round(state[2 * i]), round(state[2 * i + 1]))
        start = cells.index(want)
        x, y = next(c for c in cells[start:] + cells[:start] if _free(u, *c))
        u.grid.set(x, y, ball)
        ball.init_pos = ball.cur_pos = np.array((x, y))
    return wrapped_obs(env, u.gen_obs())


def observe(env):
    from envs.gym.setters import wrapped_obs

    return wrapped_obs(env, env.unwrapped.gen_obs())
