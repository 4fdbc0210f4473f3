"""The run store on disk: whole-file writes, ``store.json``, part-file names, and :class:`StoreError`.

A reader never sees half a file: :func:`atomic_write_bytes` and :func:`atomic_write_table`
write to a hidden temporary name (``.NAME.tmp-…``: pyarrow, pandas and ``*.parquet`` globs skip
it), fsync it, move it into place with :func:`os.replace` and fsync the folder. A failed write
removes its temporary file. Also here: reading and writing ``store.json`` (:func:`read_meta`,
:func:`write_meta`), the part-file names (``part-w{slot}-{seq}.parquet``) and
:func:`check_new` (does a folder already hold a run?). :class:`StoreError` lives here, the
lowest module that raises it; :mod:`orchestrator.runs.store` re-exports it.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from orchestrator.runs.parquet import EPISODES, SCHEMA_VERSION, STEPS

STORE_FILE = "store.json"
PART_RE = re.compile(r"^part-w(\d+)-(\d+)\.parquet$")

__all__ = ["PART_RE", "STORE_FILE", "StoreError", "atomic_write_bytes", "atomic_write_table", "check_new",
           "damaged_parts", "new_run_id", "part_files", "read_meta", "unlink_quiet", "write_meta"]


class StoreError(ValueError):
    """The run folder or the data written to it is not what the store expects."""


def fsync_dir(path: Path) -> None:
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


def tmp_name(path: Path) -> Path:
    # Leading "." : pyarrow.dataset / pandas skip it; no ".parquet" suffix: globs skip it too.
    return path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:12]}")


def unlink_quiet(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole: a temporary name in the same folder, fsync, rename."""
    tmp = tmp_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        unlink_quiet(tmp)
        raise
    fsync_dir(path.parent)


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
    tmp = tmp_name(path)
    try:
        with open(tmp, "wb") as f:
            pq.write_table(
                table, f, compression="zstd", use_dictionary=strings, use_byte_stream_split=floats or False
            )
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        unlink_quiet(tmp)
        raise
    fsync_dir(path.parent)


def part_files(folder: Path) -> list[Path]:
    """The part files of ``steps/`` or ``episodes/``, sorted by name (none when it is missing)."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if PART_RE.match(p.name))


def new_run_id(prefix: str) -> str:
    """A run id that cannot collide: ``PREFIX-YYYYmmdd-HHMMSS-`` and 8 random hex digits."""
    import time

    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"


def damaged_parts(files) -> list[tuple[Path, str]]:
    """The Parquet files among ``files`` whose footer cannot be read (truncated, empty,
    foreign): ``(path, reason)`` pairs."""
    out = []
    for f in files:
        try:
            pq.read_metadata(f)
        except Exception as exc:  # noqa: BLE001 - whatever pyarrow raises for a damaged file
            out.append((Path(f), f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"))
    return out


def damaged_error(bad: list[tuple[Path, str]], what: str = "the run's record") -> StoreError:
    """One message naming every damaged part."""
    names = "; ".join(f"{p} ({why})" for p, why in bad[:5]) + (f"; and {len(bad) - 5} more" if len(bad) > 5 else "")
    return StoreError(f"{len(bad)} Parquet file(s) of {what} cannot be read, e.g. truncated by a full disk or a "
                      f"copy cut short: {names}. Restore them from a backup or start a new run")


def read_meta(root: Path) -> dict:
    """The run's ``store.json``, checked to be of this deltarl's schema version."""
    try:
        meta = json.loads((root / STORE_FILE).read_text())
    except (OSError, ValueError) as e:
        raise StoreError(f"cannot read {root / STORE_FILE}: {e}") from None
    if str(meta.get("schema_version")) != SCHEMA_VERSION:
        raise StoreError(
            f"{root} was written with store schema version {meta.get('schema_version')!r}; "
            f"this deltarl reads version {SCHEMA_VERSION!r}"
        )
    return meta


def write_meta(root: Path, meta: dict) -> None:
    atomic_write_bytes(root / STORE_FILE, (json.dumps(meta, indent=2) + "\n").encode())


def check_new(run_dir: str | os.PathLike, run_id: str | None = None) -> None:
    """Raise :class:`StoreError` if ``run_dir`` already holds a run (other than ``run_id``)."""
    root = Path(run_dir)
    if not root.exists():
        return
    if not root.is_dir():
        raise StoreError(f"{root} exists and is not a folder; choose another --out folder")
    n_steps = len(part_files(root / STEPS))
    n_eps = len(part_files(root / EPISODES))
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
