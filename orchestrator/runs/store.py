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

Nothing here imports Ray; d3rlpy is imported only by :meth:`RunStore.to_mdp_dataset`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import time
import uuid
from pathlib import Path
from typing import Any, Iterable

from workers.datasets import steps_to_mdp_dataset

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

SCHEMA_VERSION = "1"
EPISODE_ID_STRIDE = 10**12  # episode_id = writer_slot * EPISODE_ID_STRIDE + n-th episode of that writer
STORE_FILE = "store.json"
STEPS = "steps"
EPISODES = "episodes"
WRITERS = "_writers"
_PART_RE = re.compile(r"^part-w(\d+)-(\d+)\.parquet$")

__all__ = [
    "EPISODE_ID_STRIDE",
    "SCHEMA_VERSION",
    "RunStore",
    "StoreError",
]


class StoreError(ValueError):
    """The run folder or the data written to it is not what the store expects."""


# --------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------
_VERSION_CACHE: list[str] = []


def _deltarl_version() -> str:
    if _VERSION_CACHE:
        return _VERSION_CACHE[0]
    version = "unknown"
    try:
        from importlib.metadata import version as _v

        version = _v("deltarl")
    except Exception:
        try:
            import tomllib

            pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
            with open(pyproject, "rb") as f:
                version = str(tomllib.load(f)["project"]["version"])
        except Exception:
            pass
    _VERSION_CACHE.append(version)
    return version


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _tmp_name(path: Path) -> Path:
    # Leading "." : pyarrow.dataset / pandas skip it; no ".parquet" suffix: globs skip it too.
    return path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:12]}")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole: a temporary name in the same folder, fsync, rename."""
    tmp = _tmp_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _unlink_quiet(tmp)
        raise
    _fsync_dir(path.parent)


def atomic_write_table(path: Path, table: pa.Table) -> None:
    """Write ``table`` as one Parquet file, whole (temporary name, fsync, rename)."""
    # zstd; dictionaries only for the string columns; BYTE_STREAM_SPLIT (a standard Parquet
    # encoding that pyarrow, pandas and DuckDB read) for float columns: smaller, ~2x faster.
    strings = [f.name for f in table.schema if pa.types.is_string(f.type)]
    floats = []
    for f in table.schema:
        if pa.types.is_floating(f.type):
            floats.append(f.name)
        elif pa.types.is_fixed_size_list(f.type) and pa.types.is_floating(f.type.value_type):
            floats.append(f"{f.name}.list.{f.type.value_field.name}")
    tmp = _tmp_name(path)
    try:
        with open(tmp, "wb") as f:
            pq.write_table(
                table, f, compression="zstd", use_dictionary=strings, use_byte_stream_split=floats or False
            )
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _unlink_quiet(tmp)
        raise
    _fsync_dir(path.parent)


def _unlink_quiet(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _part_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if _PART_RE.match(p.name))


def _fsl(value_type: pa.DataType, width: int) -> pa.DataType:
    """fixed_size_list type; its child is named "element", as Parquet reads it back."""
    return pa.list_(pa.field("element", value_type), int(width))


def _fixed_list(values: np.ndarray, width: int, value_type: pa.DataType) -> pa.FixedSizeListArray:
    flat = pa.array(np.ascontiguousarray(values).reshape(-1), type=value_type)
    return pa.FixedSizeListArray.from_arrays(flat, type=_fsl(value_type, width))


def _fixed_list_to_numpy(col: pa.ChunkedArray | pa.Array, width: int, dtype) -> np.ndarray:
    """(n, width) array from a fixed_size_list column, without per-row Python."""
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    parts = [np.asarray(c.flatten().to_numpy(zero_copy_only=False), dtype=dtype).reshape(-1, width) for c in chunks if len(c)]
    if not parts:
        return np.zeros((0, width), dtype=dtype)
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)


def _per_episode(value, n: int, dtype, name: str) -> np.ndarray:
    arr = np.asarray(value, dtype=dtype)
    if arr.ndim == 0:
        return np.full(n, arr, dtype=dtype)
    if arr.shape != (n,):
        raise StoreError(f"{name} must be a scalar or one value per episode ({n}); got shape {arr.shape}")
    return arr


def _match(field: str, value) -> ds.Expression | None:
    if value is None:
        return None
    if isinstance(value, (list, tuple, set, frozenset, np.ndarray)):
        return pc.field(field).isin(list(np.asarray(list(value)).tolist()))
    return pc.field(field) == value


def _and(exprs: Iterable[ds.Expression | None]) -> ds.Expression | None:
    out = None
    for e in exprs:
        if e is None:
            continue
        out = e if out is None else (out & e)
    return out


# --------------------------------------------------------------------------------------------
# the store
# --------------------------------------------------------------------------------------------
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
        self._reset_writer()

    def _reset_writer(self) -> None:
        self._slot: int | None = None
        self._slot_pid: int | None = None
        self._seq = 0
        self._next_local = 0

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()  # a copy must not share this writer's slot
        state.update(_slot=None, _slot_pid=None, _seq=0, _next_local=0)
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
        root = Path(run_dir)
        if not root.exists():
            return
        if not root.is_dir():
            raise StoreError(f"{root} exists and is not a folder; choose another --out folder")
        n_steps = len(_part_files(root / STEPS))
        n_eps = len(_part_files(root / EPISODES))
        meta_path = root / STORE_FILE
        if meta_path.is_file():
            try:
                other = json.loads(meta_path.read_text()).get("run_id")
            except (OSError, ValueError):
                other = None
            if run_id is not None and other == run_id:
                return
            raise StoreError(
                f"{root} already holds run {other!r} ({n_steps} steps files, {n_eps} episodes files); "
                f"choose another --out folder"
            )
        if n_steps or n_eps:
            raise StoreError(
                f"{root} already holds trajectory data of another run ({n_steps} steps files, "
                f"{n_eps} episodes files, no {STORE_FILE}); choose another --out folder"
            )

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
            _unlink_quiet(root / STORE_FILE)
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
            "deltarl_version": _deltarl_version(),
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        if scenario is not None:
            meta.update(cls._scenario_meta(scenario))
        atomic_write_bytes(root / STORE_FILE, (json.dumps(meta, indent=2) + "\n").encode())
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
        try:
            meta = json.loads((self.root / STORE_FILE).read_text())
        except (OSError, ValueError) as e:
            raise StoreError(f"cannot read {self.root / STORE_FILE}: {e}") from None
        if str(meta.get("schema_version")) != SCHEMA_VERSION:
            raise StoreError(
                f"{self.root} was written with store schema version {meta.get('schema_version')!r}; "
                f"this deltarl reads version {SCHEMA_VERSION!r}"
            )
        return meta

    # -- properties --------------------------------------------------------------------------
    @property
    def run_id(self) -> str:
        return self.meta["run_id"]

    @property
    def obs_shape(self) -> tuple[int, ...] | None:
        s = self.meta.get("obs_shape")
        return None if s is None else tuple(int(x) for x in s)

    @property
    def obs_dim(self) -> int | None:
        s = self.obs_shape
        return None if s is None else int(np.prod(s))

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
    def _action_type(self) -> pa.DataType:
        if self.action_kind == "discrete":
            return pa.int64()
        return _fsl(pa.float32(), int(self.meta["action_size"]))

    def _schema_metadata(self, table: str) -> dict[str, str]:
        m = self.meta
        return {
            "schema_version": SCHEMA_VERSION,
            "table": table,
            "run_id": str(m["run_id"]),
            "scenario": str(m.get("scenario") or ""),
            "scenario_version": str(m.get("scenario_version") or ""),
            "obs_shape": json.dumps(list(self.obs_shape or ())),
            "obs_dim": str(self.obs_dim or ""),
            "action_kind": str(self.action_kind or ""),
            "action_size": "" if m.get("action_size") is None else str(int(m["action_size"])),
            "state_names": json.dumps(m.get("state_names") or []),
            "deltarl_version": str(m.get("deltarl_version") or _deltarl_version()),
        }

    def steps_schema(self) -> pa.Schema:
        return pa.schema(
            [
                ("run_id", pa.string()),
                ("phase", pa.string()),
                ("fuzzer", pa.string()),
                ("role", pa.string()),
                ("episode_id", pa.int64()),
                ("t", pa.int32()),
                ("obs", _fsl(pa.float32(), self.obs_dim)),
                ("action", self._action_type()),
                ("reward", pa.float64()),
                ("terminal", pa.bool_()),
                ("timeout", pa.bool_()),
            ],
            metadata=self._schema_metadata(STEPS),
        )

    def episodes_schema(self) -> pa.Schema:
        return pa.schema(
            [
                ("run_id", pa.string()),
                ("phase", pa.string()),
                ("fuzzer", pa.string()),
                ("role", pa.string()),
                ("episode_id", pa.int64()),
                ("iteration", pa.int64()),
                ("initial_state", _fsl(pa.float64(), int(self.meta["state_dim"]))),
                ("state_index", pa.int64()),
                ("return", pa.float64()),
                ("length", pa.int64()),
                ("terminated", pa.bool_()),
                ("truncated", pa.bool_()),
                ("failure", pa.bool_()),
                ("bug", pa.bool_()),
                ("repeat", pa.int64()),
                ("seed", pa.int64()),
                ("wall_time", pa.float64()),
                ("policy_sha256", pa.string()),
                ("final_obs", _fsl(pa.float32(), self.obs_dim)),  # NaN when not recorded
            ],
            metadata=self._schema_metadata(EPISODES),
        )

    def _complete(self) -> bool:
        return self.obs_shape is not None and self.action_kind is not None and self.meta.get("state_dim") is not None and (
            self.action_kind == "discrete" or self.meta.get("action_size") is not None
        )

    # -- consistency on write ----------------------------------------------------------------
    def _reconcile(self, obs_shape: tuple[int, ...], action_kind: str, act_dim: int | None, state_dim: int) -> None:
        """Check the result against the recorded shapes; record them on first write."""
        # Another process may have recorded them meanwhile: re-read before deciding.
        if not self._complete():
            self.meta = self._load_meta()
        m = self.meta
        problems = []
        if m.get("obs_shape") is not None and tuple(m["obs_shape"]) != tuple(obs_shape):
            problems.append(f"observations of shape {tuple(obs_shape)}, but the run holds shape {tuple(m['obs_shape'])}")
        if m.get("action_kind") is not None and m["action_kind"] != action_kind:
            problems.append(f"{action_kind} actions, but the run holds {m['action_kind']} actions")
        elif action_kind == "continuous" and m.get("action_size") is not None and int(m["action_size"]) != act_dim:
            problems.append(f"actions of dimension {act_dim}, but the run holds dimension {m['action_size']}")
        if m.get("state_dim") is not None and int(m["state_dim"]) != state_dim:
            problems.append(f"initial states of {state_dim} values, but the run holds {m['state_dim']} values")
        if problems:
            raise StoreError(
                f"cannot write to run {m['run_id']!r} in {self.root}: this result has " + "; ".join(problems)
            )
        changed = False
        if m.get("obs_shape") is None:
            m["obs_shape"] = [int(x) for x in obs_shape]
            changed = True
        if m.get("action_kind") is None:
            m["action_kind"] = action_kind
            changed = True
        if action_kind == "continuous" and m.get("action_size") is None:
            m["action_size"] = int(act_dim)
            changed = True
        if m.get("state_dim") is None:
            m["state_dim"] = int(state_dim)
            changed = True
        if changed:
            atomic_write_bytes(self.root / STORE_FILE, (json.dumps(m, indent=2) + "\n").encode())

    # -- writer slots ------------------------------------------------------------------------
    def _claim_slot(self) -> int:
        wdir = self.root / WRITERS
        wdir.mkdir(exist_ok=True)
        used = [-1]
        for p in wdir.iterdir():
            if p.name.startswith("w") and p.name[1:].isdigit():
                used.append(int(p.name[1:]))
        for sub in (STEPS, EPISODES):
            for p in _part_files(self.root / sub):
                used.append(int(_PART_RE.match(p.name).group(1)))
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

        # ---- validate and normalise the result (vectorised) ----
        obs = np.asarray(result.obs)
        if obs.ndim < 2 or obs.shape[0] != N:
            raise StoreError(f"obs must have shape (n_steps={N}, obs_dim); got {obs.shape}")
        obs_shape = tuple(int(x) for x in obs.shape[1:])
        obs_dim = int(np.prod(obs_shape))
        obs = np.ascontiguousarray(obs, dtype=np.float32).reshape(N, obs_dim)

        actions = np.asarray(result.actions)
        if actions.shape[:1] != (N,):
            raise StoreError(f"actions must have {N} rows (one per step); got shape {actions.shape}")
        recorded_kind = self.meta.get("action_kind")
        if recorded_kind is not None:
            kind = recorded_kind
        else:
            kind = "discrete" if (np.issubdtype(actions.dtype, np.integer) and actions.ndim == 1) else "continuous"
        if kind == "discrete":
            if not np.issubdtype(actions.dtype, np.integer) or actions.ndim != 1:
                raise StoreError(
                    f"cannot write to run {self.run_id!r} in {self.root}: it holds discrete actions, "
                    f"this result has {actions.dtype} actions of shape {actions.shape}"
                )
            actions = actions.astype(np.int64, copy=False)
            act_dim = None
        else:
            if actions.ndim == 1:
                act_dim = 1
            else:
                act_dim = int(np.prod(actions.shape[1:]))
            actions = np.ascontiguousarray(actions, dtype=np.float32).reshape(N, act_dim)

        init = np.asarray(result.initial_states, dtype=np.float64)
        if init.ndim != 2 or init.shape[0] != E:
            raise StoreError(f"initial_states must have shape (n_episodes={E}, d); got {init.shape}")
        state_dim = int(init.shape[1])

        lengths = np.asarray(result.lengths, dtype=np.int64)
        episode = np.asarray(result.episode, dtype=np.int64)
        t = np.asarray(result.t, dtype=np.int64)
        if episode.shape != (N,) or t.shape != (N,):
            raise StoreError(f"episode and t must have shape ({N},); got {episode.shape} and {t.shape}")
        if N and (episode.min() < 0 or episode.max() >= E):
            raise StoreError(f"episode indices must lie in [0, {E}); got [{episode.min()}, {episode.max()}]")
        counts = np.bincount(episode, minlength=E) if N else np.zeros(E, dtype=np.int64)
        if lengths.shape != (E,) or not np.array_equal(counts, lengths):
            bad = int(np.flatnonzero(counts != lengths)[0]) if lengths.shape == (E,) else 0
            raise StoreError(
                f"episode lengths do not match the steps: episode #{bad} has length "
                f"{lengths[bad] if lengths.shape == (E,) else lengths.shape} but {counts[bad]} steps"
            )
        if N and t.max() > np.iinfo(np.int32).max:
            raise StoreError(f"step index t={t.max()} does not fit in int32")
        if kind == "discrete" and N and actions.min() < 0:
            raise StoreError(f"discrete actions must be >= 0; got {actions.min()}")
        size = self.meta.get("action_size")
        if kind == "discrete" and size is not None and N and actions.max() >= int(size):
            raise StoreError(f"discrete action {actions.max()} out of range for {size} actions")

        self._reconcile(obs_shape, kind, act_dim, state_dim)

        rewards = np.asarray(result.rewards, dtype=np.float64)
        terminals = np.asarray(result.terminals, dtype=bool)
        timeouts = np.asarray(result.timeouts, dtype=bool)

        # steps sorted by (episode, t) — already so for rollout() output
        if N > 1:
            de = np.diff(episode)
            ordered = bool(np.all(de >= 0) and np.all(np.diff(t)[de == 0] > 0))
            if not ordered:
                order = np.lexsort((t, episode))
                obs, actions, rewards = obs[order], actions[order], rewards[order]
                terminals, timeouts, episode, t = terminals[order], timeouts[order], episode[order], t[order]

        # ---- per-episode extras ----
        roles = np.asarray(result.role).astype(str)
        iteration = _per_episode(iteration, E, np.int64, "iteration")
        wall_time = _per_episode(wall_time, E, np.float64, "wall_time")
        bug = np.zeros(E, dtype=bool) if bug is None else _per_episode(bug, E, bool, "bug")
        if policy_sha256 is None:
            sha = pa.nulls(E, pa.string())
        elif isinstance(policy_sha256, str):
            sha = pa.repeat(pa.scalar(policy_sha256, pa.string()), E)
        elif isinstance(policy_sha256, dict):
            sha = pa.array([policy_sha256.get(r) for r in roles], type=pa.string())
        else:
            raise StoreError(f"policy_sha256 must be a str, a dict role -> hash or None; got {type(policy_sha256).__name__}")

        # ---- allocate ids and file names ----
        if self._slot is None or self._slot_pid != os.getpid():  # first write, or a forked copy
            self._reset_writer()
            self._slot = self._claim_slot()
            self._slot_pid = os.getpid()
        ids = self._slot * EPISODE_ID_STRIDE + self._next_local + np.arange(E, dtype=np.int64)
        name = f"part-w{self._slot:06d}-{self._seq:06d}.parquet"

        run_id = pa.scalar(self.run_id, pa.string())
        role_arr = pa.array(roles, type=pa.string())

        steps = pa.Table.from_arrays(
            [
                pa.repeat(run_id, N),
                pa.repeat(pa.scalar(phase, pa.string()), N),
                pa.repeat(pa.scalar(str(fuzzer), pa.string()), N),
                role_arr.take(pa.array(episode)),
                pa.array(ids[episode], type=pa.int64()),
                pa.array(t.astype(np.int32), type=pa.int32()),
                _fixed_list(obs, obs_dim, pa.float32()),
                pa.array(actions, type=pa.int64()) if kind == "discrete" else _fixed_list(actions, act_dim, pa.float32()),
                pa.array(rewards, type=pa.float64()),
                pa.array(terminals, type=pa.bool_()),
                pa.array(timeouts, type=pa.bool_()),
            ],
            schema=self.steps_schema(),
        )

        final_obs = getattr(result, "final_obs", None)
        if final_obs is None:
            # NaN, not null: pyarrow cannot read back null fixed_size_list values from Parquet
            fo = _fixed_list(np.full((E, obs_dim), np.nan, dtype=np.float32), obs_dim, pa.float32())
        else:
            fo = np.ascontiguousarray(np.asarray(final_obs, dtype=np.float32)).reshape(E, -1)
            if fo.shape[1] != obs_dim:
                raise StoreError(f"final_obs must have shape ({E}, {obs_dim}); got {np.shape(final_obs)}")
            fo = _fixed_list(fo, obs_dim, pa.float32())

        episodes = pa.Table.from_arrays(
            [
                pa.repeat(run_id, E),
                pa.repeat(pa.scalar(phase, pa.string()), E),
                pa.repeat(pa.scalar(str(fuzzer), pa.string()), E),
                role_arr,
                pa.array(ids, type=pa.int64()),
                pa.array(iteration, type=pa.int64()),
                _fixed_list(init, state_dim, pa.float64()),
                pa.array(np.asarray(result.state_index, dtype=np.int64)),
                pa.array(np.asarray(result.returns, dtype=np.float64)),
                pa.array(lengths),
                pa.array(np.asarray(result.terminated, dtype=bool)),
                pa.array(np.asarray(result.truncated, dtype=bool)),
                pa.array(np.asarray(result.failure, dtype=bool)),
                pa.array(bug),
                pa.array(np.asarray(result.repeat, dtype=np.int64)),
                pa.array(np.asarray(result.seed, dtype=np.int64)),
                pa.array(wall_time),
                sha,
                fo,
            ],
            schema=self.episodes_schema(),
        )

        # steps first: a crash in between leaves steps without episode rows, never the reverse
        atomic_write_table(self.steps_dir / name, steps)
        atomic_write_table(self.episodes_dir / name, episodes)
        self._seq += 1
        self._next_local += E
        return ids

    # -- read --------------------------------------------------------------------------------
    def _dataset(self, table: str) -> ds.Dataset | None:
        folder = self.root / table
        files = _part_files(folder)
        if not files:
            return None
        if self._complete():
            schema = self.steps_schema() if table == STEPS else self.episodes_schema()
        else:
            self.meta = self._load_meta()
            schema = (self.steps_schema() if table == STEPS else self.episodes_schema()) if self._complete() else None
        return ds.dataset([str(f) for f in files], schema=schema, format="parquet")

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
        expr = _and(
            [
                _match("phase", phase),
                _match("role", role),
                _match("fuzzer", fuzzer),
                _match("iteration", iteration),
                None if failure is None else (pc.field("failure") == bool(failure)),
                None if bug is None else (pc.field("bug") == bool(bug)),
                _match("episode_id", None if episode_ids is None else np.asarray(episode_ids, dtype=np.int64)),
            ]
        )
        tbl = d.to_table(columns=cols, filter=expr)
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
        expr = _and(
            [
                _match("phase", phase),
                _match("role", role),
                _match("fuzzer", fuzzer),
                _match("episode_id", None if episode_ids is None else np.asarray(episode_ids, dtype=np.int64)),
            ]
        )
        obs_shape = self.obs_shape or (0,)
        obs_dim = int(np.prod(obs_shape))
        discrete = self.action_kind != "continuous"
        act_dim = int(self.meta.get("action_size") or 0)
        if d is None:
            return {
                "obs": np.zeros((0, *obs_shape), dtype=np.float32),
                "actions": np.zeros(0, dtype=np.int64) if discrete else np.zeros((0, act_dim), dtype=np.float32),
                "rewards": np.zeros(0, dtype=np.float64),
                "terminals": np.zeros(0, dtype=bool),
                "timeouts": np.zeros(0, dtype=bool),
                "episode_id": np.zeros(0, dtype=np.int64),
                "t": np.zeros(0, dtype=np.int64),
            }
        tbl = d.to_table(columns=cols, filter=expr)
        eid = tbl["episode_id"].to_numpy()
        t = tbl["t"].to_numpy().astype(np.int64)
        order = None
        if eid.size > 1:
            de = np.diff(eid)
            if not (np.all(de >= 0) and np.all(np.diff(t)[de == 0] > 0)):
                order = np.lexsort((t, eid))
        obs = _fixed_list_to_numpy(tbl["obs"], obs_dim, np.float32)
        if discrete:
            actions = tbl["action"].to_numpy().astype(np.int64, copy=False)
        else:
            actions = _fixed_list_to_numpy(tbl["action"], act_dim, np.float32)
        out = {
            "obs": obs,
            "actions": actions,
            "rewards": tbl["reward"].to_numpy().astype(np.float64, copy=False),
            "terminals": tbl["terminal"].to_numpy(zero_copy_only=False).astype(bool, copy=False),
            "timeouts": tbl["timeout"].to_numpy(zero_copy_only=False).astype(bool, copy=False),
            "episode_id": eid,
            "t": t,
        }
        if order is not None:
            out = {k: v[order] for k, v in out.items()}
        out["obs"] = out["obs"].reshape(-1, *obs_shape)
        return out

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


