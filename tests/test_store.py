"""RunStore: Parquet steps/episodes round trip, atomic whole-file writes, episode ids, d3rlpy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from envs.base import ActionSpec
from orchestrator.runs.store import EPISODE_ID_STRIDE, RunStore, StoreError
from workers.rollout import RolloutResult

REPO = Path(__file__).resolve().parent.parent


def make_result(
    lengths,
    ends,
    *,
    obs_dim=3,
    state_dim=2,
    act_dim=None,
    n_actions=4,
    roles=None,
    seed=0,
    with_final_obs=True,
) -> RolloutResult:
    """Synthetic episodes. ``ends[i]``: "term" (terminated), "trunc" (step limit) or "cut"
    (neither flag: e.g. stopped by a budget). ``act_dim=None``: discrete actions."""
    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths, dtype=np.int64)
    E, N = len(lengths), int(lengths.sum())
    episode = np.repeat(np.arange(E), lengths)
    starts = np.cumsum(lengths) - lengths
    t = np.arange(N) - np.repeat(starts, lengths)
    last = np.cumsum(lengths) - 1
    terminated = np.array([e == "term" for e in ends], dtype=bool)
    truncated = np.array([e == "trunc" for e in ends], dtype=bool)
    terminals = np.zeros(N, dtype=bool)
    timeouts = np.zeros(N, dtype=bool)
    terminals[last[terminated]] = True
    timeouts[last[truncated]] = True
    rewards = rng.normal(size=N)
    if act_dim is None:
        actions = rng.integers(0, n_actions, size=N).astype(np.int64)
    else:
        actions = rng.uniform(-1, 1, size=(N, act_dim)).astype(np.float32)
    return RolloutResult(
        initial_states=rng.uniform(-1, 1, size=(E, state_dim)),
        state_index=np.arange(E, dtype=np.int64),
        repeat=np.zeros(E, dtype=np.int64),
        role=np.array(roles if roles is not None else ["aut"] * E, dtype=object),
        seed=rng.integers(0, 2**31, size=E).astype(np.int64),
        returns=np.bincount(episode, weights=rewards, minlength=E),
        lengths=lengths,
        terminated=terminated,
        truncated=truncated,
        failure=terminated.copy(),
        obs=rng.normal(size=(N, obs_dim)).astype(np.float32),
        actions=actions,
        rewards=rewards,
        terminals=terminals,
        timeouts=timeouts,
        episode=episode.astype(np.int64),
        t=t.astype(np.int64),
        final_obs=rng.normal(size=(E, obs_dim)).astype(np.float32) if with_final_obs else None,
    )


def scenario(obs_dim=3, state_dim=2, act_dim=None, n_actions=4, name="toy"):
    action = ActionSpec("discrete", n_actions) if act_dim is None else ActionSpec("continuous", shape=(act_dim,))
    return SimpleNamespace(
        name=name,
        version="7",
        state_names=tuple(f"s{i}" for i in range(state_dim)),
        obs_dim=obs_dim,
        action=action,
    )


def visible_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def temp_files(root: Path) -> list[str]:
    return [p.name for p in root.rglob("*") if ".tmp-" in p.name]


# --------------------------------------------------------------------------------------------
def test_round_trip_discrete(tmp_path):
    sc = scenario()
    store = RunStore.create(tmp_path / "run", sc, run_id="r1")
    lengths, ends = [5, 3, 7, 1], ["term", "trunc", "cut", "term"]
    res = make_result(lengths, ends, roles=["aut", "aut", "challenger", "aut"])
    ids = store.write(
        res,
        phase="safety",
        fuzzer="delta",
        iteration=3,
        wall_time=np.array([0.5, 1.0, 1.5, 2.0]),
        policy_sha256={"aut": "a" * 64, "challenger": "c" * 64},
        bug=np.array([True, False, False, True]),
    )
    assert ids.dtype == np.int64 and len(np.unique(ids)) == 4
    assert not temp_files(tmp_path)

    # steps: exact arrays back, sorted by (episode_id, t)
    s = RunStore.open(tmp_path / "run").read_steps()
    np.testing.assert_array_equal(s["obs"], res.obs)
    assert s["obs"].dtype == np.float32 and s["obs"].shape == (16, 3)
    np.testing.assert_array_equal(s["actions"], res.actions)
    assert s["actions"].dtype == np.int64
    np.testing.assert_array_equal(s["rewards"], res.rewards)
    np.testing.assert_array_equal(s["terminals"], res.terminals)
    np.testing.assert_array_equal(s["timeouts"], res.timeouts)
    np.testing.assert_array_equal(s["t"], res.t)
    np.testing.assert_array_equal(s["episode_id"], ids[res.episode])

    # episodes
    df = store.read_episodes()
    assert list(df.episode_id) == list(ids)
    np.testing.assert_array_equal(np.stack(df.initial_state), res.initial_states)
    np.testing.assert_array_equal(np.stack(df.final_obs), res.final_obs)
    np.testing.assert_array_equal(df["return"].to_numpy(), res.returns)
    np.testing.assert_array_equal(df.length.to_numpy(), res.lengths)
    np.testing.assert_array_equal(df.terminated.to_numpy(), res.terminated)
    np.testing.assert_array_equal(df.truncated.to_numpy(), res.truncated)
    np.testing.assert_array_equal(df.failure.to_numpy(), res.failure)
    np.testing.assert_array_equal(df.seed.to_numpy(), res.seed)
    assert list(df.bug) == [True, False, False, True]
    assert list(df.wall_time) == [0.5, 1.0, 1.5, 2.0]
    assert list(df.role) == ["aut", "aut", "challenger", "aut"]
    assert list(df.policy_sha256) == ["a" * 64, "a" * 64, "c" * 64, "a" * 64]
    assert set(df.phase) == {"safety"} and set(df.fuzzer) == {"delta"} and set(df.run_id) == {"r1"}
    assert list(df.iteration) == [3] * 4

    # filters
    assert list(store.read_episodes(role="challenger").episode_id) == [ids[2]]
    assert len(store.read_episodes(bug=True)) == 2
    assert list(store.read_episodes(role=["aut"], columns=["episode_id", "length"]).columns) == ["episode_id", "length"]
    only = store.read_steps(role="challenger")
    assert only["obs"].shape == (7, 3) and set(only["episode_id"]) == {ids[2]}
    assert store.read_steps(phase="nope")["obs"].shape == (0, 3)


def test_round_trip_continuous_without_scenario(tmp_path):
    store = RunStore.create(tmp_path, None, run_id="c1")
    res = make_result([4, 6], ["trunc", "term"], obs_dim=5, state_dim=3, act_dim=2, with_final_obs=False)
    ids = store.write(res, phase="safety")
    s = store.read_steps()
    assert s["actions"].shape == (10, 2) and s["actions"].dtype == np.float32
    np.testing.assert_array_equal(s["actions"], res.actions)
    np.testing.assert_array_equal(s["obs"], res.obs)
    np.testing.assert_array_equal(s["episode_id"], ids[res.episode])
    meta = json.loads((tmp_path / "store.json").read_text())
    assert meta["obs_shape"] == [5] and meta["action_kind"] == "continuous" and meta["action_size"] == 2
    assert meta["state_dim"] == 3
    df = store.read_episodes()
    assert np.isnan(np.stack(df.final_obs)).all() and df.policy_sha256.isna().all() and not df.bug.any()


def test_unsorted_steps_are_stored_sorted(tmp_path):
    store = RunStore.create(tmp_path, scenario(), run_id="u")
    res = make_result([3, 4], ["term", "trunc"])
    perm = np.random.default_rng(1).permutation(res.n_steps)
    shuffled = RolloutResult(
        **{
            **{k: getattr(res, k) for k in res.__dataclass_fields__},
            **{k: getattr(res, k)[perm] for k in ("obs", "actions", "rewards", "terminals", "timeouts", "episode", "t")},
        }
    )
    ids = store.write(shuffled, phase="safety")
    s = store.read_steps()
    np.testing.assert_array_equal(s["obs"], res.obs)
    np.testing.assert_array_equal(s["episode_id"], ids[res.episode])
    np.testing.assert_array_equal(s["t"], res.t)


def test_files_readable_by_pandas_and_pyarrow_with_metadata(tmp_path):
    sc = scenario(obs_dim=3, state_dim=2)
    store = RunStore.create(tmp_path, sc, run_id="m1")
    store.write(make_result([2, 3], ["term", "cut"]), phase="safety", fuzzer="random")
    store.write(make_result([4], ["trunc"], seed=1), phase="optimality", fuzzer="random")

    eps = pd.read_parquet(tmp_path / "episodes")
    steps = pd.read_parquet(tmp_path / "steps")
    assert len(eps) == 3 and len(steps) == 9
    assert {"run_id", "phase", "fuzzer", "role", "episode_id", "t", "obs", "action", "reward", "terminal", "timeout"} <= set(
        steps.columns
    )
    assert {"iteration", "initial_state", "return", "length", "bug", "wall_time", "policy_sha256", "seed", "repeat"} <= set(
        eps.columns
    )

    files = sorted((tmp_path / "steps").glob("*.parquet"))
    assert len(files) == 2 and all(f.name.startswith("part-w") for f in files)
    pf = pq.ParquetFile(files[0])
    assert pf.metadata.row_group(0).column(0).compression == "ZSTD"
    schema = pq.read_schema(files[0])
    md = {k.decode(): v.decode() for k, v in schema.metadata.items()}
    assert md["schema_version"] == "1" and md["table"] == "steps" and md["run_id"] == "m1"
    assert md["scenario"] == "toy" and md["scenario_version"] == "7"
    assert json.loads(md["obs_shape"]) == [3] and md["obs_dim"] == "3"
    assert md["action_kind"] == "discrete" and md["action_size"] == "4"
    assert json.loads(md["state_names"]) == ["s0", "s1"]
    assert md["deltarl_version"]
    assert str(schema.field("obs").type) == "fixed_size_list<element: float>[3]"
    assert str(schema.field("action").type) == "int64"
    assert str(schema.field("t").type) == "int32"
    emd = pq.read_schema(sorted((tmp_path / "episodes").glob("*.parquet"))[0]).metadata
    assert emd[b"table"] == b"episodes"
    assert str(pq.read_schema(sorted((tmp_path / "episodes").glob("*.parquet"))[0]).field("initial_state").type) == (
        "fixed_size_list<element: double>[2]"
    )


def test_episode_ids_unique_across_writers_and_reopen(tmp_path):
    RunStore.create(tmp_path, scenario(), run_id="ids")
    a, b = RunStore.open(tmp_path), RunStore.open(tmp_path)
    got = []
    for i in range(3):
        got.append(a.write(make_result([2, 2], ["term", "term"], seed=i), phase="safety"))
        got.append(b.write(make_result([1, 3, 2], ["term", "cut", "trunc"], seed=i), phase="safety"))
    assert a.writer_slot != b.writer_slot
    c = RunStore.open(tmp_path)  # re-opened later: a fresh slot, never reuses ids
    got.append(c.write(make_result([2], ["term"]), phase="safety"))
    all_ids = np.concatenate(got)
    assert len(np.unique(all_ids)) == len(all_ids) == 16
    assert set(all_ids // EPISODE_ID_STRIDE) == {a.writer_slot, b.writer_slot, c.writer_slot}
    # within one writer ids follow write order
    ida = np.concatenate(got[0:6:2])
    assert np.all(np.diff(ida) == 1)
    # a pickled copy (e.g. sent to a Ray actor) claims its own slot
    import pickle

    d = pickle.loads(pickle.dumps(a))
    got.append(d.write(make_result([1], ["term"]), phase="safety"))
    assert d.writer_slot not in (a.writer_slot, b.writer_slot, c.writer_slot)
    df = c.read_episodes()
    assert df.episode_id.is_unique and len(df) == 17
    s = c.read_steps()
    assert np.all(np.diff(s["episode_id"]) >= 0)
    assert len(np.unique(s["episode_id"])) == 17


@pytest.mark.subprocess
def test_episode_ids_unique_across_processes(tmp_path):
    RunStore.create(tmp_path, scenario(), run_id="mp")
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(REPO)!r}); sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_store import make_result
        from orchestrator.runs.store import RunStore
        store = RunStore.open({str(tmp_path)!r})
        for i in range(4):
            store.write(make_result([2, 3, 1], ["term", "trunc", "cut"], seed=i), phase="safety")
        """
    )
    procs = [subprocess.Popen([sys.executable, "-c", script], cwd=REPO) for _ in range(3)]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    df = RunStore.open(tmp_path).read_episodes()
    assert len(df) == 3 * 4 * 3 and df.episode_id.is_unique
    assert df.episode_id.floordiv(EPISODE_ID_STRIDE).nunique() == 3
    assert len(list((tmp_path / "steps").glob("part-*.parquet"))) == 12
    assert not temp_files(tmp_path)


@pytest.mark.parametrize("fail_on", [1, 2])
def test_crash_before_rename_leaves_no_partial_file(tmp_path, monkeypatch, fail_on):
    store = RunStore.create(tmp_path, scenario(), run_id="crash")
    store.write(make_result([2, 2], ["term", "trunc"]), phase="safety")
    before = visible_files(tmp_path)

    real_replace = os.replace
    calls = []

    def flaky_replace(src, dst):
        calls.append(dst)
        if len(calls) == fail_on:
            raise OSError("simulated crash")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", flaky_replace)
    with pytest.raises(OSError, match="simulated crash"):
        store.write(make_result([3, 1], ["cut", "term"], seed=5), phase="safety")
    monkeypatch.setattr(os, "replace", real_replace)

    assert not temp_files(tmp_path)
    after = visible_files(tmp_path)
    new = sorted(set(after) - set(before))
    if fail_on == 1:  # steps rename failed: nothing new at all
        assert new == []
    else:  # episodes rename failed: whole steps file, no episodes file (never the reverse)
        assert len(new) == 1 and new[0].startswith("steps/")
    assert len(store.read_episodes()) == 2
    assert len(pd.read_parquet(tmp_path / "episodes")) == 2


def test_stale_temp_file_of_killed_writer_is_ignored(tmp_path):
    store = RunStore.create(tmp_path, scenario(), run_id="kill")
    store.write(make_result([2, 2], ["term", "trunc"]), phase="safety")
    # a writer killed mid-write leaves a truncated hidden temp file behind
    good = next((tmp_path / "steps").glob("part-*.parquet"))
    (tmp_path / "steps" / f".{good.name}.tmp-deadbeef").write_bytes(good.read_bytes()[:100])
    (tmp_path / "episodes" / ".part-w000099-000000.parquet.tmp-deadbeef").write_bytes(b"PAR1garbage")
    assert store.read_steps()["obs"].shape == (4, 3)
    assert len(store.read_episodes()) == 2
    assert len(pd.read_parquet(tmp_path / "steps")) == 4
    assert len(pd.read_parquet(tmp_path / "episodes")) == 2


def test_inconsistent_write_raises(tmp_path):
    store = RunStore.create(tmp_path, None, run_id="x")
    store.write(make_result([2], ["term"], obs_dim=3), phase="safety")
    with pytest.raises(StoreError, match=r"observations of shape \(4,\).*\(3,\)"):
        store.write(make_result([2], ["term"], obs_dim=4), phase="safety")
    with pytest.raises(StoreError, match="discrete actions"):
        store.write(make_result([2], ["term"], act_dim=2), phase="safety")
    with pytest.raises(StoreError, match="initial states of 5 values"):
        RunStore.open(tmp_path).write(make_result([2], ["term"], state_dim=5), phase="safety")
    # scenario fixes shapes up front
    s2 = RunStore.create(tmp_path / "b", scenario(obs_dim=6, act_dim=2), run_id="y")
    with pytest.raises(StoreError, match="observations of shape"):
        s2.write(make_result([2], ["term"], obs_dim=3, act_dim=2), phase="safety")
    s3 = RunStore.create(tmp_path / "c", scenario(n_actions=4), run_id="z")
    bad = make_result([2], ["term"])
    bad.actions[:] = 4
    with pytest.raises(StoreError, match="discrete action 4 out of range"):
        s3.write(bad, phase="safety")
    res = make_result([2, 3], ["term", "term"])
    res.lengths[0] = 3
    with pytest.raises(StoreError, match="lengths do not match"):
        store.write(res, phase="safety")
    assert not temp_files(tmp_path)
    assert len(store.read_episodes()) == 1


def test_create_refuses_another_run(tmp_path):
    RunStore.check_new(tmp_path / "missing")  # does not exist: fine
    (tmp_path / "empty").mkdir()
    RunStore.check_new(tmp_path / "empty")
    store = RunStore.create(tmp_path / "run", scenario(), run_id="first")
    store.write(make_result([2], ["term"]), phase="safety")

    with pytest.raises(StoreError, match="already holds run 'first'.*choose another --out folder"):
        RunStore.create(tmp_path / "run", scenario(), run_id="second")
    with pytest.raises(StoreError, match="choose another --out folder"):
        RunStore.check_new(tmp_path / "run")
    # same run id: resume
    again = RunStore.create(tmp_path / "run", scenario(), run_id="first")
    assert len(again.read_episodes()) == 1
    with pytest.raises(StoreError, match="scenario"):
        RunStore.create(tmp_path / "run", scenario(name="other"), run_id="first")
    # data files without store.json
    (tmp_path / "orphan" / "steps").mkdir(parents=True)
    (tmp_path / "orphan" / "steps" / "part-w000000-000000.parquet").write_bytes(b"x")
    with pytest.raises(StoreError, match="another run.*choose another --out folder"):
        RunStore.create(tmp_path / "orphan", scenario(), run_id="new")
    # overwrite replaces the old run
    fresh = RunStore.create(tmp_path / "run", scenario(), run_id="second", overwrite=True)
    assert fresh.run_id == "second" and len(fresh.read_episodes()) == 0
    with pytest.raises(StoreError, match="no run store"):
        RunStore.open(tmp_path / "empty")


def test_to_mdp_dataset_discrete(tmp_path):
    from d3rlpy.constants import ActionSpace

    store = RunStore.create(tmp_path, scenario(n_actions=4), run_id="d")
    lengths, ends = [5, 3, 7, 2], ["term", "trunc", "cut", "term"]
    res = make_result(lengths, ends)
    store.write(res, phase="safety", fuzzer="delta")
    # noise that must not be selected: other phase, other role
    store.write(make_result([4], ["term"], seed=3), phase="optimality")
    store.write(make_result([4], ["term"], roles=["challenger"], seed=4), phase="safety")

    d = store.to_mdp_dataset(phase="safety", role="aut")
    assert d.dataset_info.action_space == ActionSpace.DISCRETE
    assert d.dataset_info.action_size == 4
    assert len(d.episodes) == 4
    assert [e.size() for e in d.episodes] == lengths
    assert [e.terminated for e in d.episodes] == [True, False, False, True]
    # terminated episodes keep every transition, the others lose their last (no next obs)
    assert d.transition_count == 5 + 2 + 6 + 2
    np.testing.assert_array_equal(np.concatenate([e.observations for e in d.episodes]), res.obs)
    np.testing.assert_array_equal(np.concatenate([e.actions for e in d.episodes]).ravel(), res.actions)
    # the flags the store gives d3rlpy: terminal and timeout apart, cut episode closed by timeout
    s = store.read_steps(phase="safety", role="aut")
    assert s["terminals"].sum() == 2 and s["timeouts"].sum() == 1  # stored as written (cut has neither)
    with pytest.raises(StoreError, match="no steps for phase='train'"):
        store.to_mdp_dataset(phase="train")


def test_to_mdp_dataset_continuous(tmp_path):
    from d3rlpy.constants import ActionSpace

    store = RunStore.create(tmp_path, None, run_id="c")
    res = make_result([3, 4, 2], ["cut", "term", "trunc"], obs_dim=4, act_dim=3)
    store.write(res, phase="safety")
    d = store.to_mdp_dataset()
    assert d.dataset_info.action_space == ActionSpace.CONTINUOUS
    assert d.dataset_info.action_size == 3
    assert [e.size() for e in d.episodes] == [3, 4, 2]
    assert [e.terminated for e in d.episodes] == [False, True, False]
    assert d.transition_count == 2 + 4 + 1
    np.testing.assert_array_equal(np.concatenate([e.actions for e in d.episodes]), res.actions)


def test_empty_store_reads(tmp_path):
    store = RunStore.create(tmp_path, scenario(), run_id="e")
    assert len(store.read_episodes()) == 0
    s = store.read_steps()
    assert s["obs"].shape == (0, 3) and s["actions"].shape == (0,)
    assert store.write(make_result([], []), phase="safety").shape == (0,)
