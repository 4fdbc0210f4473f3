"""The run folder: the one owner of every file name in it, with typed readers and writers.

A run folder is what ``deltarl run`` (or ``rollout``, ``repair``) leaves behind::

    store.json                  the Parquet store's metadata (scenario, shapes, schema version)
    steps/ episodes/            Parquet parts, one per written batch (orchestrator.runs.store)
    campaign.json               the resolved campaign (defaults filled in)
    summary.json                safety phase summary          timeline.parquet: failures over time
    challengers/<algo>/         model.d3, policy.pt, card.json, training.json
    optimality_summary.json     optimality phase summary      optimality_timeline.parquet
    bugs.parquet                one row per confirmed optimality bug (replayable)
    failures.parquet            one row per confirmed safety failure (replayable)
    flaky_failures.parquet      safety candidates that did not fail with the AUT acting alone
    flaky_bugs.parquet          optimality candidates that were no bug with both agents acting alone
    results.json                the pipeline's result (all phases)
    snapshots/                  gen-NNNNNN.pkl (safety), opt-NNNNNN.pkl (optimality)
    repair/                     repair.json and AUT-Improved (deltarl repair)
    llm/                        LLMTester's prompts and replies (Parquet)
    mlflow.db                   MLflow's SQLite store (unless MLFLOW_TRACKING_URI is set)

Nothing else in deltarl spells these names: code asks a :class:`RunFolder` for a path or for
the parsed content. ``campaign.json`` carries ``layout_version`` (absent in folders written
before it existed: version 1); a folder from a newer deltarl is refused with a clear message.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.runs.store import EPISODES, STORE_FILE, StoreError, atomic_write_bytes, atomic_write_table

LAYOUT_VERSION = 1
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

    @property
    def llm_dir(self) -> Path:
        return self.root / "llm"

    def summary_json(self, phase: str = "safety") -> Path:
        return self.root / ("summary.json" if phase == "safety" else "optimality_summary.json")

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

    # -- what is there ---------------------------------------------------------------------
    def is_run(self) -> bool:
        return any(p.is_file() for p in (self.store_json, self.campaign_json, self.summary_json("safety"),
                                         self.summary_json("optimality"), self.results_json))

    def has_campaign(self) -> bool:
        return self.campaign_json.is_file()

    def has_phase(self, phase: str) -> bool:
        """The phase left snapshots (it ran, perhaps not to the end)."""
        return bool(self.snapshot_files(phase))

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
        data = dict(data)
        version = data.pop("layout_version", 1)
        if not isinstance(version, int) or version > LAYOUT_VERSION:
            raise StoreError(f"{self.root} was written by a newer deltarl (run-folder layout {version!r}; this one "
                             f"reads layouts up to {LAYOUT_VERSION}): upgrade deltarl to read it")
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
            return spec.challenger
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
        atomic_write_bytes(path, json.dumps(obj, indent=2, default=_plain).encode())

    def write_campaign(self, campaign) -> None:
        self.write_json(self.campaign_json, {**campaign.to_dict(), "layout_version": LAYOUT_VERSION})

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


# the files of a trained model folder (a zoo agent, a challenger)
MODEL = "model.d3"
TORCHSCRIPT = "policy.pt"
CARD = "card.json"
TRAINING = "training.json"
MODEL_FILES = (MODEL, TORCHSCRIPT, CARD, TRAINING)


def _plain(x):
    """JSON for numpy scalars and paths."""
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, Path):
        return str(x)
    return float(x)
