"""Box2D's ``LunarLander-v3`` put into a chosen start by replaying its own reset with chosen random
draws (a setter written as a user function; the spec is experiments/gym/specs/LunarLander-v3.yaml).

gymnasium's ``LunarLander.reset`` draws, in this order, the heights of the 12 terrain chunks
(``uniform(0, H/2, size=12)``; chunks 3 to 7 are then flattened into the helipad, so 7 of them
shape the ground) and the two components of a random force pushed on the lander before its first
step (``uniform(-1000, 1000)`` twice). The state is exactly those draws::

    h0, h1, h2, h8, h9, h10, h11, force_x, force_y

``reset_to`` resets with the seed, then runs ``reset`` once more with a generator that hands out
the state's values in place of those random draws and every later draw (the engines' dispersion
in ``step``, of which ``reset`` takes one) from a generator seeded with the seed. The start is
gymnasium's own reset, value for value; the bounds are the support of its distribution, so the
``uniform`` sampler is its reset distribution.
"""

from __future__ import annotations

import numpy as np

CHUNKS = 12  # terrain heights drawn (CHUNKS + 1 in gymnasium's code, with CHUNKS = 11)
FREE = (0, 1, 2, 8, 9, 10, 11)  # the chunks the helipad does not overwrite


class _Draws:
    """Stands in for ``env.np_random`` during one ``reset``: returns the given values in order, then
    hands every later draw (the dispersion of the first step, which ``reset`` takes) to ``rest``."""

    def __init__(self, heights: np.ndarray, force: np.ndarray, rest):
        self.queue = [heights, float(force[0]), float(force[1])]
        self.rest = rest

    def uniform(self, low=0.0, high=1.0, size=None):
        if not self.queue:
            return self.rest.uniform(low, high, size)
        value = self.queue.pop(0)
        if np.shape(value) != (() if size is None else tuple(np.atleast_1d(size))):
            raise RuntimeError(f"LunarLander's reset asked for {size} values where the state holds {np.shape(value)}: "
                               f"this setter follows gymnasium 1.0's reset")
        return value

    def integers(self, *args, **kwargs):  # wind indices (enable_wind): not part of the state
        raise RuntimeError("enable_wind is not supported by this setter: its indices are not in the state")


def reset_to(env, state, seed):
    from gymnasium.utils import seeding

    from envs.gym.setters import wrapped_obs

    state = np.asarray(state, dtype=np.float64)
    u = env.unwrapped
    env.reset(seed=int(seed))  # the wrappers' own reset bookkeeping (time limit, order enforcing)
    heights = np.zeros(CHUNKS)
    heights[list(FREE)] = state[:len(FREE)]
    rest, _ = seeding.np_random(int(seed))
    u._np_random = _Draws(heights, state[len(FREE):len(FREE) + 2], rest)
    try:
        obs, _ = u.reset()  # no seed: the stand-in generator is used for the draws
    finally:
        u._np_random = rest  # the episode's later draws continue the seeded stream
    return wrapped_obs(env, obs)
