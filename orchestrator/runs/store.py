"""The run folder's trajectory store: Parquet tables ``steps/`` and ``episodes/``.

Layout of a run folder::

    run_dir/
      store.json                          run id, scenario, observation/action shapes (atomic)
      steps/part-w000000-000000.parquet   one row per environment step
      episodes/part-w000000-000000.parquet one row per episode
      _writers/w000000                    one empty-ish file per writer that ever wrote

Both tables use a plain pyarrow schema (no extension types), zstd compression, and are readable
directly by pandas (``pd.read_parquet(run_dir / "episodes")``), ``pyarrow.dataset`` and DuckDB
(``read_parquet('run_dir/steps/*.parquet')``). Every Parquet file carries schema metadata:
``schema_version``, ``table``, ``run_id``, ``scenario``, ``scenario_version``, ``obs_shape``
(JSON), ``obs_dim``, ``action_kind`` (``discrete``/``continuous``), ``action_size``,
``state_names`` (JSON) and ``deltarl_version``.

Writes are whole files: each :meth:`RunStore.write` call writes one ``steps`` file and then one
``episodes`` file, each first to a hidden temporary name in the same folder (``.part-….tmp-…``,
ignored by pyarrow/pandas, which skip names starting with ``.`` or ``_``, and by ``*.parquet``
globs) and then moved into place with :func:`os.replace`. A crash never leaves a half file
visible to readers; a crash between the two renames can leave steps whose episode row is missing
(never the other way round).

Episode ids
-----------
Each :class:`RunStore` object that writes claims a *writer slot* ``k`` the first time it
writes: it creates ``_writers/w{k:06d}`` with ``O_CREAT | O_EXCL``, so two processes (or two
store objects, or a re-opened store) never get the same slot, with no lock and without reading
any data. Slots start after the highest slot already present in ``_writers/`` or in the
part-file names. A copy of a store (pickled to a Ray actor, or inherited through ``fork``)
claims its own slot on its first write. The writer then numbers its episodes ``k * 10**12 + 0, 1, 2, …`` and its files
``part-w{k:06d}-{seq:06d}.parquet``. Hence episode ids are unique within the run across any
number of writer processes and re-opened stores, increase in write order within one writer, and
``episode_id // 10**12`` tells the writer (``EPISODE_ID_STRIDE``). Up to 10**12 episodes per
writer and about 9.2 million writers fit in int64.

Besides the columns named in ``DESIGN.md``, ``episodes`` has ``state_index`` (index into the
initial states given to the rollout) and ``final_obs`` (observation after the last step; NaN when
the result has none: pyarrow cannot read back null fixed-size lists from Parquet).

Nothing here imports Ray; d3rlpy is imported only by :meth:`RunStore.to_mdp_dataset`. The
pieces: :mod:`orchestrator.runs.files` (whole-file writes, ``store.json``, part-file names,
:class:`StoreError`), :mod:`orchestrator.runs.parquet` (schemas, Arrow columns, numpy
conversion), :mod:`orchestrator.runs.batch` (a rollout result checked and laid out as columns)
and this module (:class:`RunStore`: creating and opening runs, writer slots, writing, reading).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    import pyarrow.dataset as ds

from orchestrator.runs.batch import RolloutBatch, final_obs_column, per_episode, policy_sha_column
from orchestrator.runs.files import (
    PART_RE,
    STORE_FILE,
    StoreError,
    atomic_write_bytes,
    atomic_write_table,
    check_new,
    damaged_error,
    damaged_parts,
    part_files,
    read_meta,
    unlink_quiet,
    write_meta,
)
from orchestrator.runs.parquet import (
    EPISODES,
    SCHEMA_VERSION,
    STEPS,
    and_,
    deltarl_version,
    empty_steps,
    episodes_schema,
    episodes_table,
    match,
    obs_dim_of,
    obs_shape_of,
    steps_schema,
    steps_table,
    steps_to_numpy,
)
from workers.datasets import steps_to_mdp_dataset

EPISODE_ID_STRIDE = 10**12  # episode_id = writer_slot * EPISODE_ID_STRIDE + n-th episode of that writer
WRITERS = "_writers"

# StoreError, STORE_FILE and the atomic writes are imported from here by the rest of deltarl
__all__ = ["EPISODE_ID_STRIDE", "SCHEMA_VERSION", "STORE_FILE", "RunStore", "StoreError", "atomic_write_bytes",
           "atomic_write_table", "committed_parts", "drop_uncommitted"]


# -- the part files a snapshot commits (orchestrator.campaign.generations) ----------------------
def committed_parts(run_dir: str | os.PathLike) -> list[str]:
    """The store's part files in ``run_dir`` (``steps/*.parquet``, ``episodes/*.parquet``) as
    sorted paths relative to it: what a generation snapshot commits."""
    root = Path(run_dir)
    return sorted(str(p.relative_to(root)) for d in (STEPS, EPISODES) for p in (root / d).glob("*.parquet"))


def drop_uncommitted(run_dir: str | os.PathLike, keep: set) -> None:
    """Delete the part files of ``run_dir`` not in ``keep`` (paths as :func:`committed_parts`
    gives them): those of a generation that never got its snapshot."""
    root = Path(run_dir)
    for d in (STEPS, EPISODES):
        for p in (root / d).glob("*.parquet"):
            if str(p.relative_to(root)) not in keep:
                p.unlink()


class RunStore:
    """Parquet ``steps/`` and ``episodes/`` of one run folder (see the module docstring).

    Make one with :meth:`create` (new run; refuses a folder holding another run) or
    :meth:`open` (existing run, e.g. in a worker process). ``RunStore(run_dir)`` is ``open``.
    """

    def __init__(self, run_dir: str | os.PathLike):
        self.root = Path(run_dir)
        path = self.root / STORE_FILE
        if not path.is_file():
            raise StoreError(
                f"{self.root} holds no run store ({STORE_FILE} is missing); "
                f"make one with RunStore.create(run_dir, scenario, run_id)"
            )
        self.meta = self._load_meta()
        self._held: list | None = None  # hold(): tables written on flush()
        self._reset_writer()

    def _reset_writer(self) -> None:
        self._slot: int | None = None
        self._slot_pid: int | None = None
        self._seq = 0
        self._next_local = 0

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()  # a copy must not share this writer's slot
        state.update(_slot=None, _slot_pid=None, _seq=0, _next_local=0, _held=None)
        return state

    # -- creation / opening ------------------------------------------------------------------
    @classmethod
    def open(cls, run_dir: str | os.PathLike) -> "RunStore":
        """The store of an existing run folder."""
        return cls(run_dir)

    @staticmethod
    def check_new(run_dir: str | os.PathLike, run_id: str | None = None) -> None:
        """Raise :class:`StoreError` if ``run_dir`` already holds a run (other than ``run_id``).

        A folder that does not exist, is empty, or holds only unrelated files is new. A folder
        whose ``store.json`` names ``run_id`` is the same run (resuming), hence accepted.
        """
        check_new(run_dir, run_id)

    @classmethod
    def create(
        cls,
        run_dir: str | os.PathLike,
        scenario: Any = None,
        run_id: str | None = None,
        overwrite: bool = False,
    ) -> "RunStore":
        """Start the store of a new run in ``run_dir`` (created if needed).

        ``scenario`` (an ``envs.base.Scenario``, or None) fixes the scenario name and version,
        state names, observation size and action kind/size up front; without it they are taken
        from the first write. Refuses (:class:`StoreError`) a folder that already holds another
        run, unless ``overwrite`` (which deletes only ``steps/``, ``episodes/``, ``_writers/``
        and ``store.json``). Calling it again with the same ``run_id`` opens that run.
        """
        root = Path(run_dir)
        if run_id is None:
            run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]
        run_id = str(run_id)
        if overwrite:
            for name in (STEPS, EPISODES, WRITERS):
                if (root / name).is_dir():
                    shutil.rmtree(root / name)
            unlink_quiet(root / STORE_FILE)
        else:
            cls.check_new(root, run_id)
        if (root / STORE_FILE).is_file():  # same run id: resume
            store = cls(root)
            if scenario is not None:
                store._check_scenario(scenario)
            return store
        root.mkdir(parents=True, exist_ok=True)
        (root / STEPS).mkdir(exist_ok=True)
        (root / EPISODES).mkdir(exist_ok=True)
        meta = {
            "schema_version": SCHEMA_VERSION,
            "run_id": run_id,
            "scenario": "",
            "scenario_version": "",
            "state_names": None,
            "state_dim": None,
            "obs_shape": None,
            "action_kind": None,
            "action_size": None,
            "deltarl_version": deltarl_version(),
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        if scenario is not None:
            meta.update(cls._scenario_meta(scenario))
        write_meta(root, meta)
        return cls(root)

    @staticmethod
    def _scenario_meta(scenario: Any) -> dict:
        action = getattr(scenario, "action", None)
        out = {
            "scenario": str(getattr(scenario, "name", "") or ""),
            "scenario_version": str(getattr(scenario, "version", "") or ""),
        }
        names = getattr(scenario, "state_names", None)
        if names:
            out["state_names"] = [str(n) for n in names]
            out["state_dim"] = len(names)
        obs_dim = int(getattr(scenario, "obs_dim", 0) or 0)
        if obs_dim:
            out["obs_shape"] = [obs_dim]
        if action is not None:
            out["action_kind"] = "discrete" if action.kind == "discrete" else "continuous"
            out["action_size"] = int(action.size)
        return out

    def _check_scenario(self, scenario: Any) -> None:
        want = self._scenario_meta(scenario)
        for key, value in want.items():
            have = self.meta.get(key)
            if have not in (None, "", []) and have != value:
                raise StoreError(
                    f"{self.root} holds run {self.meta['run_id']!r} with {key}={have!r}, "
                    f"not {value!r}; choose another --out folder"
                )

    def _load_meta(self) -> dict:
        return read_meta(self.root)

    # -- properties --------------------------------------------------------------------------
    @property
    def run_id(self) -> str:
        return self.meta["run_id"]

    @property
    def obs_shape(self) -> tuple[int, ...] | None:
        return obs_shape_of(self.meta)

    @property
    def obs_dim(self) -> int | None:
        return obs_dim_of(self.meta)

    @property
    def action_kind(self) -> str | None:
        return self.meta.get("action_kind")

    @property
    def steps_dir(self) -> Path:
        return self.root / STEPS

    @property
    def episodes_dir(self) -> Path:
        return self.root / EPISODES

    def __repr__(self) -> str:
        return (
            f"RunStore({str(self.root)!r}, run_id={self.run_id!r}, scenario={self.meta.get('scenario')!r}, "
            f"obs_shape={self.obs_shape}, action={self.action_kind}:{self.meta.get('action_size')})"
        )

    # -- schema ------------------------------------------------------------------------------
    def steps_schema(self) -> pa.Schema:
        return steps_schema(self.meta)

    def episodes_schema(self) -> pa.Schema:
        return episodes_schema(self.meta)

    def _complete(self) -> bool:
        return self.obs_shape is not None and self.action_kind is not None and self.meta.get("state_dim") is not None and (
            self.action_kind == "discrete" or self.meta.get("action_size") is not None
        )

    # -- consistency on write ----------------------------------------------------------------
    def _reconcile(self, batch: RolloutBatch) -> None:
        """Check the result against the recorded shapes; record them on first write."""
        # Another process may have recorded them meanwhile: re-read before deciding.
        if not self._complete():
            self.meta = self._load_meta()
        batch.check_against(self.meta, self.root)
        if batch.record_shapes(self.meta):
            write_meta(self.root, self.meta)

    # -- writer slots ------------------------------------------------------------------------
    def _claim_slot(self) -> int:
        wdir = self.root / WRITERS
        wdir.mkdir(exist_ok=True)
        used = [-1]
        for p in wdir.iterdir():
            if p.name.startswith("w") and p.name[1:].isdigit():
                used.append(int(p.name[1:]))
        for sub in (STEPS, EPISODES):
            for p in part_files(self.root / sub):
                used.append(int(PART_RE.match(p.name).group(1)))
        k = max(used) + 1
        info = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "time": time.time()}).encode()
        while True:
            if k * EPISODE_ID_STRIDE > np.iinfo(np.int64).max - EPISODE_ID_STRIDE:
                raise StoreError(f"{self.root}: no writer slot left")
            try:
                fd = os.open(wdir / f"w{k:06d}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                k += 1
                continue
            try:
                os.write(fd, info)
            finally:
                os.close(fd)
            return k

    @property
    def writer_slot(self) -> int | None:
        """This object's writer slot (None until its first write)."""
        return self._slot

    # -- write -------------------------------------------------------------------------------
    def write(
        self,
        result,
        *,
        phase: str,
        fuzzer: str = "",
        iteration=0,
        wall_time=0.0,
        policy_sha256: dict[str, str] | str | None = None,
        bug=None,
    ) -> np.ndarray:
        """Append a :class:`workers.rollout.RolloutResult`: one steps file and one episodes file.

        ``iteration``, ``wall_time`` and ``bug`` are scalars or one value per episode;
        ``policy_sha256`` is a hash for all episodes or a dict role -> hash (missing roles get
        null). Returns the assigned episode ids, shape (E,) int64, in the result's episode order.
        """
        E, N = int(result.n_episodes), int(result.n_steps)
        if E == 0:
            return np.zeros(0, dtype=np.int64)
        if not phase or not isinstance(phase, str):
            raise StoreError(f"phase must be a non-empty string, got {phase!r}")
        batch = self._checked_batch(result, E, N)

        # per-episode extras
        roles = np.asarray(result.role).astype(str)
        iteration = per_episode(iteration, E, np.int64, "iteration")
        wall_time = per_episode(wall_time, E, np.float64, "wall_time")
        bug = np.zeros(E, dtype=bool) if bug is None else per_episode(bug, E, bool, "bug")
        sha = policy_sha_column(policy_sha256, roles, E)

        ids, name = self._next_ids(E)
        common = dict(run_id=pa.scalar(self.run_id, pa.string()), phase=phase, fuzzer=fuzzer,
                      roles=pa.array(roles, type=pa.string()), ids=ids)
        steps = steps_table(self.meta, batch, **common)
        final_obs = final_obs_column(result, E, batch.obs_dim)
        episodes = episodes_table(self.meta, batch, result, iteration=iteration, wall_time=wall_time, bug=bug,
                                  sha=sha, final_obs=final_obs, **common)

        self._next_local += E
        if self._held is not None:  # hold(): one part per flush()
            self._held.append((steps, episodes))
            return ids
        # steps first: a crash in between leaves steps without episode rows, never the reverse
        atomic_write_table(self.steps_dir / name, steps)
        atomic_write_table(self.episodes_dir / name, episodes)
        self._seq += 1
        return ids

    def hold(self) -> None:
        """From now on :meth:`write` assigns episode ids at once but writes its rows with the next
        :meth:`flush`, as one part (an async campaign writes many small units between two
        snapshots: one part per snapshot instead of one per unit). Rows held when the process
        dies are lost, as a part written after the last snapshot would be deleted on resume."""
        if self._held is None:
            self._held = []

    def flush(self) -> None:
        """Write the rows held since the last flush as one part (nothing when none)."""
        if not self._held:
            return
        _, name = self._next_ids(0)
        steps = pa.concat_tables([t for t, _ in self._held])
        episodes = pa.concat_tables([t for _, t in self._held])
        atomic_write_table(self.steps_dir / name, steps)
        atomic_write_table(self.episodes_dir / name, episodes)
        self._seq += 1
        self._held = []

    def _checked_batch(self, result, E: int, N: int) -> RolloutBatch:
        """The result checked against itself and the run (whose shapes a first write records),
        normalised, steps sorted by (episode, t)."""
        batch = RolloutBatch.from_result(result, E, N, self.meta, self.run_id, self.root)
        self._reconcile(batch)
        batch.add_step_values(result)
        return batch

    def _next_ids(self, E: int) -> tuple[np.ndarray, str]:
        """Episode ids for the next E episodes of this writer and the name of its next part file."""
        if self._slot is None or self._slot_pid != os.getpid():  # first write, or a forked copy
            self._reset_writer()
            self._slot = self._claim_slot()
            self._slot_pid = os.getpid()
        ids = self._slot * EPISODE_ID_STRIDE + self._next_local + np.arange(E, dtype=np.int64)
        name = f"part-w{self._slot:06d}-{self._seq:06d}.parquet"
        return ids, name

    # -- read --------------------------------------------------------------------------------
    def _dataset(self, table: str) -> ds.Dataset | None:
        folder = self.root / table
        files = part_files(folder)
        if not files:
            return None
        if self._complete():
            schema = self.steps_schema() if table == STEPS else self.episodes_schema()
        else:
            self.meta = self._load_meta()
            schema = (self.steps_schema() if table == STEPS else self.episodes_schema()) if self._complete() else None
        try:
            import pyarrow.dataset as ds  # here, not at the top: it imports pandas (0.3 s a process)

            return ds.dataset([str(f) for f in files], schema=schema, format="parquet")
        except (pa.ArrowException, OSError):
            self._raise_if_damaged(table)
            raise

    def _read(self, d: ds.Dataset, table: str, **kw) -> pa.Table:
        """``d.to_table(**kw)``; a damaged part file: :class:`StoreError` naming every one."""
        try:
            return d.to_table(**kw)
        except (pa.ArrowException, OSError):
            self._raise_if_damaged(table)
            raise

    def _raise_if_damaged(self, table: str) -> None:
        bad = damaged_parts(part_files(self.root / table))
        if bad:
            raise damaged_error(bad, f"run {self.root}") from None

    def read_episodes(
        self,
        phase=None,
        role=None,
        fuzzer=None,
        iteration=None,
        *,
        failure: bool | None = None,
        bug: bool | None = None,
        episode_ids=None,
        columns: list[str] | None = None,
    ):
        """Episodes as a pandas DataFrame sorted by ``episode_id``.

        Each filter is None (any), a value, or a list of values. ``initial_state`` and
        ``final_obs`` come as object columns of numpy arrays (``np.stack(df.initial_state)``).
        """
        import pandas as pd

        d = self._dataset(EPISODES)
        if d is None:
            schema = self.episodes_schema() if self._complete() else None
            if schema is None:
                return pd.DataFrame(columns=columns or [])
            empty = schema.empty_table()
            return (empty.select(columns) if columns else empty).to_pandas()
        cols = None
        if columns is not None:
            cols = list(columns)
            if "episode_id" not in cols:
                cols = cols + ["episode_id"]
        expr = and_(
            [
                match("phase", phase),
                match("role", role),
                match("fuzzer", fuzzer),
                match("iteration", iteration),
                None if failure is None else (pc.field("failure") == bool(failure)),
                None if bug is None else (pc.field("bug") == bool(bug)),
                match("episode_id", None if episode_ids is None else np.asarray(episode_ids, dtype=np.int64)),
            ]
        )
        tbl = self._read(d, EPISODES, columns=cols, filter=expr)
        tbl = tbl.sort_by("episode_id")
        df = tbl.to_pandas()
        if columns is not None:
            df = df[list(columns)]
        return df.reset_index(drop=True)

    def read_steps(self, phase=None, role=None, fuzzer=None, *, episode_ids=None) -> dict[str, np.ndarray]:
        """Steps as numpy arrays sorted by (episode_id, t).

        Keys: ``obs`` (N, *obs_shape) float32, ``actions`` (N,) int64 or (N, act_dim) float32,
        ``rewards`` (N,) float64, ``terminals`` / ``timeouts`` (N,) bool, ``episode_id`` (N,)
        int64, ``t`` (N,) int64.
        """
        d = self._dataset(STEPS)
        cols = ["episode_id", "t", "obs", "action", "reward", "terminal", "timeout"]
        expr = and_(
            [
                match("phase", phase),
                match("role", role),
                match("fuzzer", fuzzer),
                match("episode_id", None if episode_ids is None else np.asarray(episode_ids, dtype=np.int64)),
            ]
        )
        obs_shape = self.obs_shape or (0,)
        discrete = self.action_kind != "continuous"
        act_dim = int(self.meta.get("action_size") or 0)
        if d is None:
            return empty_steps(obs_shape, discrete, act_dim)
        return steps_to_numpy(self._read(d, STEPS, columns=cols, filter=expr), obs_shape, discrete, act_dim)

    def to_mdp_dataset(self, phase="safety", role="aut", fuzzer=None, *, episode_ids=None, action_size: int | None = None):
        """The selected steps as a d3rlpy ``MDPDataset`` (terminal and timeout kept apart).

        d3rlpy needs every episode to end with exactly one of terminal / timeout: an episode
        whose last step has neither (cut by a budget) gets ``timeout = 1`` there, and a step
        flagged both keeps only ``terminal``. ``action_space`` and ``action_size`` come from the
        run's metadata (for discrete runs without a recorded size: max action + 1, or
        ``action_size``). d3rlpy drops the last step of non-terminated episodes from the
        transitions (no next observation), as for any d3rlpy dataset.
        """
        s = self.read_steps(phase=phase, role=role, fuzzer=fuzzer, episode_ids=episode_ids)
        if s["rewards"].shape[0] == 0:
            raise StoreError(
                f"run {self.run_id!r} in {self.root} has no steps for phase={phase!r}, role={role!r}"
                + ("" if fuzzer is None else f", fuzzer={fuzzer!r}")
                + "; nothing to build a dataset from"
            )
        discrete = self.action_kind == "discrete"
        if action_size is None:
            action_size = self.meta.get("action_size")
        if action_size is None:
            action_size = int(s["actions"].max()) + 1 if discrete else int(s["actions"].shape[1])
        return steps_to_mdp_dataset(s, discrete=discrete, action_size=int(action_size))


