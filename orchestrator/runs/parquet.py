"""The store's Arrow side: the ``steps`` / ``episodes`` schemas, their metadata, and column helpers.

Schemas are plain pyarrow (no extension types); observations, actions, initial states and final
observations are ``fixed_size_list`` columns whose child is named ``element`` (as Parquet reads
it back). :func:`steps_table` and :func:`episodes_table` turn a checked rollout result
(:class:`orchestrator.runs.batch.RolloutBatch`) into the two tables; :func:`steps_to_numpy`
reads steps back. Also the readers' filters (:func:`match`, :func:`and_`).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:  # pyarrow.dataset imports pandas (0.3 s): only the readers that scan need it
    import pyarrow.dataset as ds

    from orchestrator.runs.batch import RolloutBatch

SCHEMA_VERSION = "1"
STEPS = "steps"
EPISODES = "episodes"

# --------------------------------------------------------------------------------------------
# column helpers
# --------------------------------------------------------------------------------------------
@functools.cache
def deltarl_version() -> str:
    """The installed package's version, else ``pyproject.toml``'s (a source checkout), else "unknown"."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("deltarl")
    except PackageNotFoundError:
        pass  # not installed: the checkout's pyproject.toml says
    try:
        import tomllib  # Python >= 3.11

        with open(Path(__file__).resolve().parents[2] / "pyproject.toml", "rb") as f:  # the checkout's root
            return str(tomllib.load(f)["project"]["version"])
    except (ImportError, OSError, KeyError, ValueError):  # ValueError: tomllib.TOMLDecodeError
        return "unknown"


def fsl(value_type: pa.DataType, width: int) -> pa.DataType:
    """fixed_size_list type; its child is named "element", as Parquet reads it back."""
    return pa.list_(pa.field("element", value_type), int(width))


def fixed_list(values: np.ndarray, width: int, value_type: pa.DataType) -> pa.FixedSizeListArray:
    flat = pa.array(np.ascontiguousarray(values).reshape(-1), type=value_type)
    return pa.FixedSizeListArray.from_arrays(flat, type=fsl(value_type, width))


def fixed_list_to_numpy(col: pa.ChunkedArray | pa.Array, width: int, dtype) -> np.ndarray:
    """(n, width) array from a fixed_size_list column, without per-row Python."""
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    parts = [np.asarray(c.flatten().to_numpy(zero_copy_only=False), dtype=dtype).reshape(-1, width) for c in chunks if len(c)]
    if not parts:
        return np.zeros((0, width), dtype=dtype)
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)


def match(field: str, value) -> ds.Expression | None:
    """Filter ``field == value`` (``isin`` for a collection); None for ``value`` None (any)."""
    if value is None:
        return None
    if isinstance(value, (list, tuple, set, frozenset, np.ndarray)):
        return pc.field(field).isin(list(np.asarray(list(value)).tolist()))
    return pc.field(field) == value


def and_(exprs: Iterable[ds.Expression | None]) -> ds.Expression | None:
    """The conjunction of the filters that are not None (None when there are none)."""
    out = None
    for e in exprs:
        if e is None:
            continue
        out = e if out is None else (out & e)
    return out


# --------------------------------------------------------------------------------------------
# schemas (from the run's store.json metadata)
# --------------------------------------------------------------------------------------------
def obs_shape_of(meta: dict) -> tuple[int, ...] | None:
    s = meta.get("obs_shape")
    return None if s is None else tuple(int(x) for x in s)


def obs_dim_of(meta: dict) -> int | None:
    s = obs_shape_of(meta)
    return None if s is None else int(np.prod(s))


def _action_type(meta: dict) -> pa.DataType:
    if meta.get("action_kind") == "discrete":
        return pa.int64()
    return fsl(pa.float32(), int(meta["action_size"]))


def schema_metadata(meta: dict, table: str) -> dict[str, str]:
    m = meta
    return {
        "schema_version": SCHEMA_VERSION,
        "table": table,
        "run_id": str(m["run_id"]),
        "scenario": str(m.get("scenario") or ""),
        "scenario_version": str(m.get("scenario_version") or ""),
        "obs_shape": json.dumps(list(obs_shape_of(m) or ())),
        "obs_dim": str(obs_dim_of(m) or ""),
        "action_kind": str(m.get("action_kind") or ""),
        "action_size": "" if m.get("action_size") is None else str(int(m["action_size"])),
        "state_names": json.dumps(m.get("state_names") or []),
        "deltarl_version": str(m.get("deltarl_version") or deltarl_version()),
    }


def steps_schema(meta: dict) -> pa.Schema:
    return pa.schema(
        [
            ("run_id", pa.string()),
            ("phase", pa.string()),
            ("fuzzer", pa.string()),
            ("role", pa.string()),
            ("episode_id", pa.int64()),
            ("t", pa.int32()),
            ("obs", fsl(pa.float32(), obs_dim_of(meta))),
            ("action", _action_type(meta)),
            ("reward", pa.float64()),
            ("terminal", pa.bool_()),
            ("timeout", pa.bool_()),
        ],
        metadata=schema_metadata(meta, STEPS),
    )


def episodes_schema(meta: dict) -> pa.Schema:
    return pa.schema(
        [
            ("run_id", pa.string()),
            ("phase", pa.string()),
            ("fuzzer", pa.string()),
            ("role", pa.string()),
            ("episode_id", pa.int64()),
            ("iteration", pa.int64()),
            ("initial_state", fsl(pa.float64(), int(meta["state_dim"]))),
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
            ("final_obs", fsl(pa.float32(), obs_dim_of(meta))),  # NaN when not recorded
        ],
        metadata=schema_metadata(meta, EPISODES),
    )


# --------------------------------------------------------------------------------------------
# a rollout result as the two tables
# --------------------------------------------------------------------------------------------
def steps_table(meta: dict, b: RolloutBatch, *, run_id: pa.Scalar, phase: str, fuzzer,
                roles: pa.Array, ids: np.ndarray) -> pa.Table:
    """One row per step; ``ids`` are the episodes' ids, ``roles`` their roles."""
    N = b.obs.shape[0]
    return pa.Table.from_arrays(
        [
            pa.repeat(run_id, N),
            pa.repeat(pa.scalar(phase, pa.string()), N),
            pa.repeat(pa.scalar(str(fuzzer), pa.string()), N),
            roles.take(pa.array(b.episode)),
            pa.array(ids[b.episode], type=pa.int64()),
            pa.array(b.t.astype(np.int32), type=pa.int32()),
            fixed_list(b.obs, b.obs_dim, pa.float32()),
            pa.array(b.actions, type=pa.int64()) if b.kind == "discrete" else fixed_list(b.actions, b.act_dim, pa.float32()),
            pa.array(b.rewards, type=pa.float64()),
            pa.array(b.terminals, type=pa.bool_()),
            pa.array(b.timeouts, type=pa.bool_()),
        ],
        schema=steps_schema(meta),
    )


def episodes_table(meta: dict, b: RolloutBatch, result, *, run_id: pa.Scalar, phase: str, fuzzer,
                   roles: pa.Array, ids: np.ndarray, iteration: np.ndarray, wall_time: np.ndarray,
                   bug: np.ndarray, sha: pa.Array, final_obs: pa.Array) -> pa.Table:
    """One row per episode of ``result`` (its per-episode fields as they are)."""
    E = len(ids)
    return pa.Table.from_arrays(
        [
            pa.repeat(run_id, E),
            pa.repeat(pa.scalar(phase, pa.string()), E),
            pa.repeat(pa.scalar(str(fuzzer), pa.string()), E),
            roles,
            pa.array(ids, type=pa.int64()),
            pa.array(iteration, type=pa.int64()),
            fixed_list(b.init, b.state_dim, pa.float64()),
            pa.array(np.asarray(result.state_index, dtype=np.int64)),
            pa.array(np.asarray(result.returns, dtype=np.float64)),
            pa.array(b.lengths),
            pa.array(np.asarray(result.terminated, dtype=bool)),
            pa.array(np.asarray(result.truncated, dtype=bool)),
            pa.array(np.asarray(result.failure, dtype=bool)),
            pa.array(bug),
            pa.array(np.asarray(result.repeat, dtype=np.int64)),
            pa.array(np.asarray(result.seed, dtype=np.int64)),
            pa.array(wall_time),
            sha,
            final_obs,
        ],
        schema=episodes_schema(meta),
    )


# --------------------------------------------------------------------------------------------
# reading steps back
# --------------------------------------------------------------------------------------------
def empty_steps(obs_shape: tuple[int, ...], discrete: bool, act_dim: int) -> dict[str, np.ndarray]:
    """What :meth:`RunStore.read_steps` returns for a run without steps."""
    return {
        "obs": np.zeros((0, *obs_shape), dtype=np.float32),
        "actions": np.zeros(0, dtype=np.int64) if discrete else np.zeros((0, act_dim), dtype=np.float32),
        "rewards": np.zeros(0, dtype=np.float64),
        "terminals": np.zeros(0, dtype=bool),
        "timeouts": np.zeros(0, dtype=bool),
        "episode_id": np.zeros(0, dtype=np.int64),
        "t": np.zeros(0, dtype=np.int64),
    }


def steps_to_numpy(tbl: pa.Table, obs_shape: tuple[int, ...], discrete: bool, act_dim: int) -> dict[str, np.ndarray]:
    """The steps table's columns as numpy arrays, sorted by (episode_id, t)."""
    obs_dim = int(np.prod(obs_shape))
    eid = tbl["episode_id"].to_numpy()
    t = tbl["t"].to_numpy().astype(np.int64)
    order = None
    if eid.size > 1:
        de = np.diff(eid)
        if not (np.all(de >= 0) and np.all(np.diff(t)[de == 0] > 0)):
            order = np.lexsort((t, eid))
    obs = fixed_list_to_numpy(tbl["obs"], obs_dim, np.float32)
    if discrete:
        actions = tbl["action"].to_numpy().astype(np.int64, copy=False)
    else:
        actions = fixed_list_to_numpy(tbl["action"], act_dim, np.float32)
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
