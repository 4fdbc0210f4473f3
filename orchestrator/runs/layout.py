"""The run folder: the one owner of every file name in it, with typed readers and writers.

A run folder is what ``deltarl run`` (or ``rollout``, ``repair``) leaves behind::

    store.json                  the Parquet store's metadata (scenario, shapes, schema version)
    steps/ episodes/            Parquet parts, one per written batch (orchestrator.runs.store)
    campaign.json               the resolved campaign (defaults filled in)
    summary.json                safety phase summary          timeline.parquet: failures over time
    challengers/<algo>/         model.d3, policy.pt, card.json, training.json
    optimality_summary.json     optimality phase summary      optimality_timeline.parquet
    applied_order.parquet       execution: async, safety: the order results were applied (replay)
    optimality_applied_order.parquet  the same for the optimality phase
    bugs.parquet                one row per confirmed optimality bug (replayable)
    failures.parquet            one row per confirmed safety failure (replayable)
    flaky_failures.parquet      safety candidates that did not fail with the AUT acting alone
    flaky_bugs.parquet          optimality candidates that were no bug with both agents acting alone
    results.json                the pipeline's result (all phases)
    snapshots/                  gen-NNNNNN.pkl (safety), opt-NNNNNN.pkl (optimality)
    repair/                     repair.json and AUT-Improved (deltarl repair)
    llm/                        LLMTester's prompts and replies (Parquet)
    mlflow.db                   MLflow's SQLite store (unless MLFLOW_TRACKING_URI is set)
    mlartifacts/                MLflow's artifact store beside it (copies of summaries and cards: not run folders)
    .deltarl.lock               held (fcntl.flock) by the one process writing the folder; gone after

Nothing else in deltarl spells these names: code asks a :class:`RunFolder` for a path or for
the parsed content. ``campaign.json`` carries ``layout_version`` (absent in folders written
before it existed: version 1); a folder from a newer deltarl is refused with a clear message.

One writer per folder: :meth:`RunFolder.lock` holds an OS-level lock (``fcntl.flock`` on
``.deltarl.lock``) for the life of ``deltarl run`` (and ``--resume``), ``repair``,
``train-challenger`` and ``rollout``; a second process is refused with the holder's PID. A folder
belongs to one campaign and one AUT (:meth:`RunFolder.claim`): a new run needs a new or empty
folder (files already there are never overwritten or deleted), and a phase added to an existing
run must name the run's scenario, AUT and seed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from orchestrator.runs.store import EPISODES, STORE_FILE, StoreError, atomic_write_bytes, atomic_write_table

LAYOUT_VERSION = 1
LOCK_FILE = ".deltarl.lock"
PHASE_SECTIONS = ("safety", "challenger", "optimality")  # the campaign sections that are phases
IDENTITY = ("scenario", "scenario_overrides", "aut", "seed")  # what makes two campaigns one run
_HELD: dict[str, list] = {}  # lock file (absolute) -> [fd, depth]: this process's run-folder locks
SAFETY_PHASES = ("sampling", "fuzzing")  # the store phases that make up dataset D
SNAPSHOT_PREFIX = {"safety": "gen", "optimality": "opt"}


@dataclass(frozen=True)
class RunFolder:
    """Paths and typed access to one run folder (it need not exist yet)."""

    root: Path

    def __init__(self, root: str | Path):
        object.__setattr__(self, "root", Path(root))

    # -- names -----------------------------------------------------------------------------
    @property
    def store_json(self) -> Path:
        return self.root / STORE_FILE

    @property
    def campaign_json(self) -> Path:
        return self.root / "campaign.json"

    @property
    def results_json(self) -> Path:
        return self.root / "results.json"

    @property
    def snapshots(self) -> Path:
        return self.root / "snapshots"

    @property
    def lock_file(self) -> Path:
        return self.root / LOCK_FILE

    @property
    def bugs_parquet(self) -> Path:
        return self.root / "bugs.parquet"

    @property
    def episodes_dir(self) -> Path:
        return self.root / EPISODES

    @property
    def failures_parquet(self) -> Path:
        return self.root / "failures.parquet"

    def flaky_parquet(self, phase: str = "safety") -> Path:
        return self.root / ("flaky_failures.parquet" if phase == "safety" else "flaky_bugs.parquet")

    @property
    def repair_dir(self) -> Path:
        return self.root / "repair"

    def summary_json(self, phase: str = "safety") -> Path:
        return self.root / ("summary.json" if phase == "safety" else "optimality_summary.json")

    def applied_order_parquet(self, phase: str = "safety") -> Path:
        """An async phase's log: one row per applied unit, in the order applied (a replay in this
        order gives the same verdicts: ``orchestrator.campaign.generations``)."""
        return self.root / ("applied_order.parquet" if phase == "safety" else "optimality_applied_order.parquet")

    def timeline_parquet(self, phase: str = "safety") -> Path:
        return self.root / ("timeline.parquet" if phase == "safety" else "optimality_timeline.parquet")

    def challenger_dir(self, algo: str) -> Path:
        return self.root / "challengers" / algo

    def challenger_cards(self) -> list[Path]:
        return sorted((self.root / "challengers").glob("*/" + CARD))

    def snapshot_files(self, phase: str) -> list[Path]:
        return sorted(self.snapshots.glob(f"{SNAPSHOT_PREFIX[phase]}-*.pkl"))

    @staticmethod
    def challenger_algo_of(path: str | Path | None) -> str | None:
        """The algorithm of a challenger model path inside a run folder
        (``.../challengers/<algo>/model.d3``), else None."""
        m = re.search(r"challengers/([a-z]+)/", str(path or ""))
        return m.group(1) if m else None

    # -- paths stored inside the folder -------------------------------------------------------
    def stored(self, path: str | Path | None) -> str | None:
        """How a path is written into this folder's files: relative to the folder when it lies
        inside it (``challengers/bcq/model.d3``: the folder can move, be renamed or be read from
        any working directory), else absolute; a policy URI (``zoo:…``, ``python:…``) unchanged."""
        if path is None or _is_uri(path):
            return None if path is None else str(path)
        p = Path(os.path.abspath(path))  # ".." taken out: a folder on the way may be gone later
        if not _inside(p, self.root):
            return str(p)
        return Path(os.path.relpath(p.resolve(), self.root.resolve())).as_posix()

    def resolve(self, stored: str | Path | None) -> str | None:
        """A path read from this folder's files, usable from the current directory: relative
        paths are the folder's own; a path written by an older deltarl (relative to the directory
        the campaign ran in, or absolute) that no longer exists is looked up in this folder by
        its tail (``…/challengers/bcq/model.d3``), so a moved or copied folder still reads. A
        policy URI is returned unchanged; a path found nowhere comes back under the folder, so
        an error names where it was expected."""
        if stored is None or _is_uri(stored) or not str(stored):
            return None if stored is None else str(stored)
        p = Path(stored)
        if not p.is_absolute() and (self.root / p).exists():
            return str(self.root / p)
        if p.exists():  # absolute, or relative to the directory an older deltarl ran in
            return str(p)
        parts = p.parts
        for i in range(1, len(parts) - 1):  # tails of two names or more (challengers/bcq/model.d3), never a bare name
            cand = self.root.joinpath(*parts[i:])
            if cand.exists():
                return str(cand)
        return str(p if p.is_absolute() else self.root / p)

    def stored_policy(self, uri: str | None) -> str | None:
        """How a policy URI is written into ``campaign.json``: one that names a file or folder (a
        path, ``file://PATH``, ``rlzoo:PATH``) with its path as :meth:`stored` writes it (relative
        to the run folder inside it, else absolute: never relative to the directory the campaign
        ran in); ``zoo:``, ``python:``, ``random:`` unchanged."""
        named = _policy_path(uri)
        return uri if named is None else named[0] + self.stored(named[1])

    def resolved_policy(self, stored: str | None) -> str | None:
        """A policy URI read from ``campaign.json``, usable from the current directory (see
        :meth:`resolve`; shown relative to the current directory when it lies below it, as a
        campaign file usually names it)."""
        named = _policy_path(stored)
        if named is None:
            return stored
        path = Path(self.resolve(named[1]))
        try:
            shown = path.absolute().relative_to(Path.cwd()).as_posix() if path.is_absolute() else path.as_posix()
        except ValueError:  # not below the current directory
            shown = str(path)
        return named[0] + shown

    # -- what is there ---------------------------------------------------------------------
    def is_run(self) -> bool:
        return any(p.is_file() for p in (self.store_json, self.campaign_json, self.summary_json("safety"),
                                         self.summary_json("optimality"), self.results_json))

    def has_campaign(self) -> bool:
        return self.campaign_json.is_file()

    def has_phase(self, phase: str) -> bool:
        """The phase left snapshots (it ran, perhaps not to the end)."""
        return bool(self.snapshot_files(phase))

    def finished(self, phase: str) -> bool:
        """The fuzzing phase ran to the end (its summary and timeline are written last)."""
        return self.summary_json(phase).is_file() and self.timeline_parquet(phase).is_file()

    def entries(self) -> list[str]:
        """The names in the folder other than its lock file (none when it does not exist)."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.name != LOCK_FILE)

    def check_empty(self, flag: str = "--out") -> None:
        """Refuse (:class:`StoreError`) a path that is a file or a folder holding anything: a new
        run never writes into a folder with other files, so none of them is overwritten."""
        if self.root.exists() and not self.root.is_dir():
            raise StoreError(f"{flag} {self.root} exists and is not a folder; give a new or empty folder")
        names = self.entries()
        if names:
            shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
            raise StoreError(f"{flag} {self.root} is not empty ({shown}) and holds no deltarl run; deltarl never "
                             f"writes into a folder with other files: give a new or empty folder")

    # -- one writer per folder -----------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, command: str = "deltarl"):
        """Hold the folder's write lock (an exclusive ``fcntl.flock`` on ``.deltarl.lock``) for
        the ``with`` block; re-entrant within this process. Another process holding it:
        :class:`StoreError` naming its PID. The folder is created when missing (and removed again
        when the block leaves it empty)."""
        key = os.path.abspath(self.lock_file)
        if key in _HELD:
            _HELD[key][1] += 1
            try:
                yield self
            finally:
                _HELD[key][1] -= 1
            return
        if self.root.exists() and not self.root.is_dir():
            raise StoreError(f"{self.root} exists and is not a folder; give a new or empty folder")
        created = [d for d in (self.root, *self.root.parents) if not d.exists()]  # made here, removed if left empty
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the run folder {self.root} ({exc.strerror or exc})") from exc
        fd = _acquire(self.lock_file, self.root, command)
        _HELD[key] = [fd, 1]
        try:
            yield self
        finally:
            del _HELD[key]
            try:
                if os.path.samestat(os.fstat(fd), os.stat(self.lock_file)):
                    os.unlink(self.lock_file)  # still holding it: no other process can own this name now
            except OSError:
                pass
            os.close(fd)
            for d in created:  # nothing was written there: leave nothing behind
                try:
                    d.rmdir()
                except OSError:
                    break

    # -- one campaign and one AUT per folder ---------------------------------------------------
    def phase_present(self, phase: str) -> bool:
        """The folder holds (part of) ``phase``: its snapshots, its summary or a challenger."""
        if phase == "challenger":
            return any(self.root.glob("challengers/*"))
        return self.has_phase(phase) or self.summary_json(phase).is_file()

    def claim(self, campaign: dict, *, resume: bool = False) -> str:
        """Check that ``campaign`` (its ``to_dict()``) may write this folder: ``"new"`` (a new or
        empty folder), ``"resume"`` (``resume``: the folder's own campaign) or ``"add"`` (phases
        the folder does not hold yet, for the same scenario, AUT and seed; the folder's
        ``campaign.json`` gains their sections). Anything else: :class:`StoreError`."""
        if resume:
            if not self.has_campaign():
                raise StoreError(f"--resume {self.root}: not a campaign run folder (no campaign.json); nothing to "
                                 f"resume")
            self._check_identity(self.campaign_dict(), campaign)
            return "resume"
        if not self.has_campaign():
            if self.is_run():
                raise StoreError(f"{self.root} already holds a run of another command (no campaign.json); give a "
                                 f"new or empty --out folder")
            self.check_empty()
            return "new"
        have = self.campaign_dict()
        if not {"scenario", "aut"} <= set(have) or not (self.store_json.is_file() or self.snapshots.is_dir()):
            self.check_empty()  # a campaign.json of the user's own, not a run: refused, nothing touched
        self._check_identity(have, campaign)
        for phase in PHASE_SECTIONS:
            if campaign.get(phase) is not None and (have.get(phase) is not None or self.phase_present(phase)):
                raise StoreError(f"{self.root} already holds the {phase} phase of campaign {have.get('name')!r}: "
                                 f"continue it with `deltarl run --resume {self.root}`, or give another --out")
        unfinished = [p for p in ("safety", "optimality") if have.get(p) is not None and not self.finished(p)]
        if unfinished:
            raise StoreError(f"{self.root}: its {unfinished[0]} phase has not finished; finish it first with "
                             f"`deltarl run --resume {self.root}`")
        merged = dict(have)
        for key in (*PHASE_SECTIONS, "llm"):
            if campaign.get(key) is not None:
                merged[key] = campaign[key]
        self._write_campaign_dict(merged)
        return "add"

    def _check_identity(self, have: dict, want: dict) -> None:
        for key in IDENTITY:
            a, b = have.get(key), want.get(key)
            if key == "scenario_overrides":
                a, b = a or {}, b or {}
            if key == "aut" and same_policy_file(a, b):
                continue
            if a != b:
                raise StoreError(f"{self.root} belongs to campaign {have.get('name')!r} with {key} {a!r}; this "
                                 f"campaign has {key} {b!r}. A run folder holds one campaign and one AUT: give "
                                 f"another --out folder")

    def damaged_files(self) -> list[tuple[Path, str]]:
        """Every file of the folder deltarl cannot read (a truncated Parquet part, a damaged JSON
        file): ``(path, reason)`` pairs, Parquet footers and JSON parsed, nothing else read."""
        import pyarrow.parquet as pq

        out = []
        parquet = [p for d in ("steps", "episodes", "llm") for p in sorted((self.root / d).glob("*.parquet"))]
        parquet += sorted(self.root.glob("*.parquet"))
        for p in parquet:
            try:
                pq.read_metadata(p)
            except Exception as exc:  # noqa: BLE001 - truncated, empty or foreign
                out.append((p, f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"))
        for p in sorted(self.root.glob("*.json")) + self.challenger_cards():
            try:
                json.loads(p.read_bytes().decode("utf-8"))
            except (OSError, UnicodeDecodeError, ValueError) as exc:
                out.append((p, f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"))
        return out

    # -- typed readers ---------------------------------------------------------------------
    def read_json(self, path: Path) -> Any | None:
        """A JSON file of this folder, or None when it is absent."""
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise StoreError(f"{path} is damaged ({type(exc).__name__}: {exc}); restore it or start a new run") from exc

    def campaign_dict(self) -> dict:
        """``campaign.json`` (its ``layout_version`` checked and removed): the resolved campaign;
        ``orchestrator.campaign.config.run_campaign_of`` turns it into a Campaign."""
        data = self.read_json(self.campaign_json)
        if data is None:
            raise StoreError(f"{self.root} holds no campaign (campaign.json missing): is it a run folder of "
                             f"'deltarl run'?")
        if not isinstance(data, dict):
            raise StoreError(f"{self.campaign_json} is damaged (it holds a {type(data).__name__}, not a campaign); "
                             f"restore it or start a new run")
        data = dict(data)
        version = data.pop("layout_version", 1)
        if not isinstance(version, int) or version > LAYOUT_VERSION:
            raise StoreError(f"{self.root} was written by a newer deltarl (run-folder layout {version!r}; this one "
                             f"reads layouts up to {LAYOUT_VERSION}): upgrade deltarl to read it")
        if isinstance(data.get("aut"), str):
            data["aut"] = self.resolved_policy(data["aut"])
        return data

    def summary(self, phase: str = "safety") -> dict | None:
        return self.read_json(self.summary_json(phase))

    def results(self) -> dict | None:
        return self.read_json(self.results_json)

    def cards(self) -> list[dict]:
        return [c for c in (self.read_json(p) for p in self.challenger_cards()) if c]

    def bugs(self):
        """``bugs.parquet`` as a DataFrame, or None when the run has no bugs file."""
        return self._table(self.bugs_parquet)

    def failures(self):
        """``failures.parquet`` (confirmed safety failures) as a DataFrame, or None."""
        return self._table(self.failures_parquet)

    def flaky(self, phase: str = "safety"):
        """The phase's flaky candidates (verdicts that did not hold alone) as a DataFrame, or None."""
        return self._table(self.flaky_parquet(phase))

    def _table(self, path: Path):
        import pyarrow.parquet as pq

        if not path.is_file():
            return None
        try:
            return pq.read_table(path).to_pandas()
        except Exception as exc:  # noqa: BLE001 - a truncated or foreign file
            raise StoreError(f"{path} cannot be read ({type(exc).__name__}: {exc}); it is damaged") from exc

    def challenger_uri(self, campaign) -> str:
        """The challenger the optimality phase runs: the campaign's URI, else this run's first
        trained challenger (an error naming the missing phase when it is not trained yet)."""
        spec = campaign.optimality
        if spec is not None and spec.challenger:
            return self.resolve(spec.challenger)
        if campaign.challenger is None:
            raise StoreError("the campaign names no challenger (optimality.challenger) and trains none")
        algo = campaign.challenger.algos[0]
        path = self.challenger_dir(algo) / MODEL
        if not path.is_file():
            raise StoreError(f"optimality: the {algo} challenger {path} does not exist yet; run the challenger "
                             f"phase first (deltarl run --resume {self.root})")
        return str(path)

    # -- writers (whole files: temp name, then rename) ---------------------------------------
    def write_json(self, path: Path, obj) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, json.dumps(finite_or_null(obj), indent=2, default=_plain, allow_nan=False).encode())

    def write_campaign(self, campaign) -> None:
        self._write_campaign_dict(campaign.to_dict())

    def _write_campaign_dict(self, data: dict) -> None:
        """``campaign.json``: a policy file of the AUT stored as :meth:`stored_policy` writes it."""
        data = dict(data)
        if isinstance(data.get("aut"), str):
            data["aut"] = self.stored_policy(data["aut"])
        self.write_json(self.campaign_json, {**data, "layout_version": LAYOUT_VERSION})

    def write_table(self, path: Path, table) -> None:
        atomic_write_table(path, table)

    def write_verdicts(self, path: Path, rows: list[dict], columns, state_names) -> None:
        """A verdict file (bugs, failures, flaky candidates): one row per dict, the initial state as
        a fixed-size list and as one plain column per dimension (``s_<name>``) for SQL/pandas."""
        import numpy as np
        import pyarrow as pa

        d = len(state_names)
        cols = {k: [r.get(k) for r in rows] for k in columns}
        states = np.array([r["state"] for r in rows], dtype=np.float64).reshape(len(rows), d)
        table = pa.table({**cols, "initial_state": pa.array(list(states), type=pa.list_(pa.float64(), d))})
        for j, name in enumerate(state_names):
            table = table.append_column(f"s_{name}", pa.array(states[:, j]))
        atomic_write_table(path, table)


def _policy_path(uri) -> tuple[str, str] | None:
    """``(prefix, path)`` of a policy URI that names a file or folder (a path, ``file://PATH``,
    ``rlzoo:PATH``); None for the others (``zoo:``, ``python:``, ``random:``) and for no URI."""
    if not isinstance(uri, str) or not uri.strip():
        return None
    text = uri.strip()
    if text.lower().startswith("rlzoo:"):
        return "rlzoo:", text.split(":", 1)[1].strip()
    if text.lower().startswith("file://"):
        rest = text[len("file://"):]
        return "", unquote(rest[len("localhost"):] if rest.startswith("localhost/") else rest)
    return None if _is_uri(text) else ("", text)


def policy_file(uri) -> bool:
    """Whether a policy URI names a file or folder (a path, ``file://PATH``, ``rlzoo:PATH``)."""
    return _policy_path(uri) is not None


def same_policy_file(a, b) -> bool:
    """Two policy URIs that name the same file or folder from here (``runs/x/../a.pt`` and
    ``/abs/a.pt``): the AUT of a campaign file and the one a run folder stored."""
    pa, pb = _policy_path(a), _policy_path(b)
    if pa is None or pb is None or pa[0] != pb[0]:
        return False
    return os.path.realpath(pa[1]) == os.path.realpath(pb[1])


def _is_uri(path) -> bool:
    """A policy URI with a scheme (``zoo:``, ``python:``, ``random:``, ``rlzoo:``), not a file path."""
    return isinstance(path, str) and re.match(r"^[A-Za-z][A-Za-z0-9+.-]+:", path) is not None


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def _acquire(path: Path, root: Path, command: str) -> int:
    """An exclusive flock on ``path`` (an fd, not inherited by child programs), with this
    process's PID, host and command written into it; :class:`StoreError` naming the holder."""
    import fcntl

    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise StoreError(f"cannot lock the run folder {root} ({exc.strerror or exc})") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _holder(fd)
            os.close(fd)
            raise StoreError(f"{root} is in use by another deltarl process ({holder}); one process writes a run "
                             f"folder at a time: wait for it to end (or stop it), or give another --out") from None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if not same:  # the holder released and removed the file meanwhile: lock the current one
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                                 "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}).encode())
        return fd


def _holder(fd: int) -> str:
    """Who holds the lock, from what it wrote into the file (it writes right after locking)."""
    for _ in range(20):
        try:
            info = json.loads(os.pread(fd, 4096, 0) or b"null")
        except (OSError, ValueError):
            info = None
        if isinstance(info, dict) and info.get("pid"):
            host = "" if info.get("host") == socket.gethostname() else f" on {info.get('host')}"
            return f"PID {info['pid']}{host}: {info.get('command', 'deltarl')} since {info.get('since', '?')}"
        time.sleep(0.05)
    return "PID unknown"


# the files of a trained model folder (a zoo agent, a challenger)
MLFLOW_ARTIFACTS = "mlartifacts"  # MLflow's artifact store beside mlflow.db, in a run or grid folder
MODEL = "model.d3"
TORCHSCRIPT = "policy.pt"
CARD = "card.json"
TRAINING = "training.json"
MODEL_FILES = (MODEL, TORCHSCRIPT, CARD, TRAINING)


def finite_or_null(obj):
    """``obj`` with every NaN or infinity replaced by None: strict JSON (``null``) for the files
    others read; every JSON file of a run folder is written so (:meth:`RunFolder.write_json`) (Python's json writes ``NaN``, which no JSON parser accepts)."""
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {k: finite_or_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_null(v) for v in obj]
    if hasattr(obj, "item") and getattr(obj, "ndim", None) == 0:  # a numpy scalar
        return finite_or_null(obj.item())
    return obj


def _plain(x):
    """JSON for numpy scalars and paths."""
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, Path):
        return str(x)
    return float(x)
