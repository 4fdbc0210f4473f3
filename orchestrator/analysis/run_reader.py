"""What a report reads from run folders, leniently: every part is optional, and a damaged or
unreadable file counts as missing (the report says "not in this run" instead of failing).

All file names come from :class:`orchestrator.runs.layout.RunFolder`; this module adds the
report's view of a run (its name, scenario, methods) and the arrays its figures draw.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from envs import get_scenario
from orchestrator.runs.layout import MLFLOW_ARTIFACTS, SAFETY_PHASES, RunFolder
from orchestrator.runs.store import RunStore, StoreError

log = logging.getLogger(__name__)


def _lenient(read, *args):
    """``read(*args)`` (a RunFolder JSON reader), or None when the file is damaged."""
    try:
        return read(*args)
    except StoreError:
        return None


def read_parquet(path: Path) -> pd.DataFrame | None:
    """A Parquet file or folder as a DataFrame; None when absent or unreadable."""
    try:
        return pd.read_parquet(path) if path.exists() else None
    except Exception as exc:  # noqa: BLE001 - an unreadable part is reported as missing
        log.debug("%s not read (%s: %s): reported as missing", path, type(exc).__name__, exc)
        return None


def is_run(path: Path) -> bool:
    return RunFolder(path).is_run()


@dataclass
class Run:
    dir: Path
    campaign: dict | None
    safety: dict | None
    optimality: dict | None
    challengers: list  # card.json dicts
    results: dict | None
    alias: str | None = None  # the report's name for a run whose campaign name another run shares

    @classmethod
    def load(cls, d: Path) -> "Run":
        f = RunFolder(d)
        results = _lenient(f.results)
        cards = [c for c in (_lenient(f.read_json, p) for p in f.challenger_cards()) if c]
        if not cards and results:
            cards = list(results.get("challengers") or [])
        return cls(d, _lenient(f.campaign_dict), _lenient(f.summary, "safety") or (results or {}).get("safety"),
                   _lenient(f.summary, "optimality") or (results or {}).get("optimality"), cards, results)

    @property
    def folder(self) -> RunFolder:
        return RunFolder(self.dir)

    @property
    def name(self) -> str:
        if self.alias:
            return self.alias
        for src, key in ((self.campaign, "name"), (self.optimality, "campaign"), (self.safety, "campaign")):
            if src and src.get(key):
                return str(src[key])
        return self.dir.name

    @property
    def scenario(self) -> str | None:
        for src in (self.campaign, self.optimality, self.safety):
            if src and src.get("scenario"):
                return src["scenario"]
        meta = _lenient(self.folder.read_json, self.folder.store_json) or {}
        sc = meta.get("scenario")
        return sc if isinstance(sc, str) else (sc or {}).get("name")

    @property
    def aut(self) -> str | None:
        for src in (self.campaign, self.optimality, self.safety):
            if src and src.get("aut"):
                return src["aut"]
        return None

    @property
    def seed(self):
        for src in (self.campaign, self.optimality, self.safety):
            if src and "seed" in src:
                return src["seed"]
        return None

    def scenario_obj(self):
        try:
            return get_scenario(self.scenario, **((self.campaign or {}).get("scenario_overrides") or {}))
        except Exception as exc:  # noqa: BLE001 - a scenario not available here: the run is read without it
            log.debug("%s: scenario %s unavailable (%s: %s)", self.dir, self.scenario, type(exc).__name__, exc)
            return None

    @property
    def safety_method(self) -> str | None:
        """The safety fuzzer, ``llmtester w/o ms`` for LLMTester with ``multi_scale: false`` (the
        paper's ablation: every mutation asks the LLM)."""
        if not self.safety:
            return None
        params = ((self.campaign or {}).get("safety") or {}).get("params") or {}
        method = self.safety.get("fuzzer")
        return "llmtester w/o ms" if method == "llmtester" and params.get("multi_scale") is False else method

    @property
    def optimality_method(self) -> str | None:
        return method_label(self.optimality) if self.optimality else None

    @property
    def challenger_algo(self) -> str | None:
        """The oracle's challenger algorithm (bc/bcq/cql) when the path or card tells."""
        if not self.optimality:
            return None
        return RunFolder.challenger_algo_of(self.optimality.get("challenger"))


def method_label(opt: dict) -> str:
    without = list((opt.get("params") or {}).get("without") or [])
    return opt["fuzzer"] + (" w/o " + ", ".join(without) if without else "")


def find_runs(root: Path, depth: int = 3) -> list[Path]:
    """Run folders at or below ``root`` (a run folder's own subfolders are not searched, nor MLflow's
    artifact store, whose copies of summaries and cards are not run folders)."""
    if is_run(root):
        return [root]
    if depth == 0:
        return []
    out = []
    for sub in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))
                      and p.name != MLFLOW_ARTIFACTS):
        out += find_runs(sub, depth - 1)
    return out


# ---------------------------------------------------------------------------------------------
# what the figures draw
# ---------------------------------------------------------------------------------------------


def timeline(run: Run, phase: str) -> pd.DataFrame | None:
    """The failures (``safety``) or bugs (``optimality``) over time of a run; None when absent."""
    return read_parquet(run.folder.timeline_parquet(phase))


def optimality_cases(run: Run):
    """AUT and challenger (mean) returns per optimality test case, and the bug flag."""
    if not run.optimality or not run.folder.episodes_dir.is_dir():
        return None
    try:
        eps = RunStore.open(run.dir).read_episodes(phase="optimality", columns=["role", "iteration", "state_index",
                                                                                 "return", "bug"])
    except Exception as exc:  # noqa: BLE001 - StoreError or whatever a damaged part raises: no cases
        log.debug("%s: optimality episodes not read (%s: %s)", run.dir, type(exc).__name__, exc)
        return None
    if eps.empty:
        return None
    g = eps.groupby(["iteration", "state_index", "role"])["return"].mean().unstack("role")
    if not {"aut", "challenger"} <= set(g.columns):
        return None
    bug = eps.groupby(["iteration", "state_index"])["bug"].any().reindex(g.index)
    return g["aut"].to_numpy(), g["challenger"].to_numpy(), bug.to_numpy(dtype=bool)


def bug_states(run: Run) -> np.ndarray | None:
    """The initial states of a run's optimality bugs; None when it recorded none."""
    bugs = read_parquet(run.folder.bugs_parquet)
    if bugs is None or bugs.empty:
        return None
    return np.stack(bugs["initial_state"].to_numpy()).astype(float)


def failure_states(run: Run) -> np.ndarray | None:
    """The initial states of the AUT's safety failures (dataset D's failing episodes)."""
    if not run.safety or not run.folder.episodes_dir.is_dir():
        return None
    try:
        eps = RunStore.open(run.dir).read_episodes(phase=list(SAFETY_PHASES), role="aut", failure=True,
                                                   columns=["initial_state"])
    except Exception as exc:  # noqa: BLE001 - StoreError or whatever a damaged part raises: no states
        log.debug("%s: failure states not read (%s: %s)", run.dir, type(exc).__name__, exc)
        return None
    return np.stack(eps["initial_state"].to_numpy()).astype(float) if len(eps) else None
