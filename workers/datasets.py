"""Recorded steps -> a d3rlpy ``MDPDataset`` (the dataset D of a challenger, D_superior of a repair).

Plain functions: the run-folder store and the repair both build their datasets here, so the
end-of-episode rules live in one place.
"""

from __future__ import annotations

import gc

import numpy as np


class EpisodeIndex:
    """d3rlpy's ``InfiniteBuffer``, filled a whole dataset at a time.

    A d3rlpy buffer is a list of ``(episode, index)`` pairs, one per transition, that
    ``sample_transition_batch`` draws from. ``MDPDataset`` fills it one transition at a time
    through ``ReplayBuffer.append_episode`` (a Python call per transition, and the garbage
    collector set off by a million new tuples: 0.9 s for 956,000 steps, 2.4 s in the quick start's
    challenger job, experiments/results/fixed-costs.md); this builds the same list in one
    comprehension with the collector paused (0.1 s). It implements d3rlpy's ``BufferProtocol`` (``append``, ``episodes``,
    ``transition_count``, ``len``, indexing) exactly as ``InfiniteBuffer`` does, so a dataset on
    it samples the same transitions for the same numpy seed (tests/test_challenger.py).
    """

    def __init__(self, episodes=()) -> None:
        # as InfiniteBuffer: an episode without a transition (one step, cut by a time limit) is
        # in no pair, so it is not among the buffer's episodes either
        self._episodes = [ep for ep in episodes if ep.transition_count > 0]
        # a million new tuples set off the cyclic garbage collector again and again, each time
        # walking every object of the process (torch's many): 0.5 s of 0.6 here; tuples of an
        # episode and an int make no cycles, so it waits until the list is built
        enabled = gc.isenabled()
        gc.disable()
        try:
            self._transitions = [(ep, i) for ep in self._episodes for i in range(ep.transition_count)]
        finally:
            if enabled:
                gc.enable()

    def append(self, episode, index: int) -> None:
        self._transitions.append((episode, index))
        if not self._episodes or episode is not self._episodes[-1]:
            self._episodes.append(episode)

    @property
    def episodes(self):
        return self._episodes

    @property
    def transition_count(self) -> int:
        return len(self._transitions)

    def __len__(self) -> int:
        return len(self._transitions)

    def __getitem__(self, index: int):
        return self._transitions[index]


def steps_to_mdp_dataset(steps: dict, *, discrete: bool, action_size: int):
    """A d3rlpy dataset from steps in the form :meth:`RunStore.read_steps` returns them
    (episodes contiguous, t ascending). Every episode ends with exactly one of terminal /
    timeout: a last step with neither gets ``timeout = 1``, a step flagged both keeps only
    ``terminal``. The episodes are cut by d3rlpy's own ``EpisodeGenerator``, as ``MDPDataset``
    cuts them; the result is a ``ReplayBuffer`` on an :class:`EpisodeIndex` (what an
    ``MDPDataset`` is, filled faster)."""
    from d3rlpy.constants import ActionSpace
    from d3rlpy.dataset import EpisodeGenerator, ReplayBuffer

    n = int(np.asarray(steps["rewards"]).shape[0])
    eid = np.asarray(steps["episode_id"])
    last = np.ones(n, dtype=bool)
    last[:-1] = eid[1:] != eid[:-1]
    terminals = np.asarray(steps["terminals"], bool) & last
    timeouts = (np.asarray(steps["timeouts"], bool) | (last & ~terminals)) & ~terminals & last
    obs = np.asarray(steps["obs"])
    actions = np.asarray(steps["actions"])
    episodes = EpisodeGenerator(
        observations=np.ascontiguousarray(obs.reshape(n, -1), dtype=np.float32),
        actions=actions.astype(np.int64, copy=False) if discrete else np.ascontiguousarray(actions, dtype=np.float32),
        rewards=np.asarray(steps["rewards"]).astype(np.float32),
        terminals=terminals.astype(np.float32),
        timeouts=timeouts.astype(np.float32),
    )()
    first = episodes[0]
    return ReplayBuffer(
        EpisodeIndex(episodes),
        observation_signature=first.observation_signature,
        action_signature=first.action_signature,
        reward_signature=first.reward_signature,
        action_space=ActionSpace.DISCRETE if discrete else ActionSpace.CONTINUOUS,
        action_size=int(action_size),
    )


class TransitionSampler:
    """d3rlpy's ``sample_transition_batch``, vectorised: the same minibatches, several times faster.

    ``ReplayBuffer.sample_transition_batch`` draws each of the batch's transitions with its own
    ``np.random.randint`` call, builds a ``Transition`` object for it through the transition picker
    (copying its rewards-to-go), then stacks the fields: about half of a discrete BCQ update's time
    on CartPole here (benchmarks/challenger_speed.py). This lays the transitions out once as flat
    arrays in the buffer's order (next observation and next action zero after a terminal step, as
    ``BasicTransitionPicker`` makes them) and answers a batch with one ``np.random.randint(n,
    size=B)`` (the same numbers, in order, as B single draws from numpy's global stream) and fancy
    indexing, with d3rlpy's dtypes and shapes. The minibatch's ``transitions`` list is left empty:
    d3rlpy reads it only for returns-to-go (``algo.need_returns_to_go``, CalQL), and
    :meth:`for_algo` keeps d3rlpy's own sampler there, for other transition pickers, and for
    tuple observations.
    """

    def __init__(self, dataset) -> None:
        if isinstance(dataset.buffer, EpisodeIndex):  # its order: each episode's transitions in turn
            episodes = list(dataset.buffer.episodes)
            picks = [np.arange(ep.transition_count) for ep in episodes]
        else:  # any buffer: its (episode, index) pairs in its order
            episodes, picks = [], []
            for j in range(dataset.transition_count):
                ep, i = dataset.buffer[j]
                if not episodes or episodes[-1] is not ep:
                    episodes.append(ep)
                    picks.append([])
                picks[-1].append(i)
        obs, act, rew, nobs, nact, term = [], [], [], [], [], []
        for ep, idx in zip(episodes, picks):
            idx = np.asarray(idx)
            o, a = np.asarray(ep.observations), np.asarray(ep.actions)
            last = bool(ep.terminated) & (idx == ep.size() - 1)
            nxt = np.minimum(idx + 1, ep.size() - 1)
            obs.append(o[idx])
            act.append(a[idx])
            rew.append(np.asarray(ep.rewards)[idx])
            nobs.append(np.where(last[:, None], 0, o[nxt]).astype(o.dtype))
            nact.append(np.where(last.reshape((-1,) + (1,) * (a.ndim - 1)), 0, a[nxt]).astype(a.dtype))
            term.append(last.astype(np.float32))
        self.n = int(dataset.transition_count)
        self.observations = np.concatenate(obs).astype(np.float32)
        self.actions = np.concatenate(act).astype(np.float32)
        self.rewards = np.concatenate(rew).astype(np.float32)
        self.next_observations = np.concatenate(nobs).astype(np.float32)
        self.next_actions = np.concatenate(nact).astype(np.float32)
        self.terminals = np.concatenate(term).reshape(-1, 1)
        self.intervals = np.ones((self.n, 1), dtype=np.float32)

    @classmethod
    def for_algo(cls, dataset, algo):
        """The sample function for training ``algo`` on ``dataset``: this sampler's, or d3rlpy's
        own where this one would differ (see the class)."""
        from d3rlpy.dataset import BasicTransitionPicker

        shape = dataset.dataset_info.observation_signature.shape
        if getattr(algo, "need_returns_to_go", False) or type(dataset.transition_picker) is not BasicTransitionPicker \
                or len(shape) != 1 or dataset.transition_count == 0:
            return dataset.sample_transition_batch
        return cls(dataset).sample

    def sample(self, batch_size: int):
        from d3rlpy.dataset import TransitionMiniBatch

        j = np.random.randint(self.n, size=batch_size)
        return TransitionMiniBatch(
            observations=self.observations[j], actions=self.actions[j], rewards=self.rewards[j],
            next_observations=self.next_observations[j], next_actions=self.next_actions[j],
            terminals=self.terminals[j], intervals=self.intervals[j], transitions=[])
