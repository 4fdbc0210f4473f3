"""What a report is made of: a few small tables, collected from run folders (or a grid's
``results.parquet``) and saved as Parquet in ``report_data/`` beside ``report.md``, so that a
committed results folder is reported again from the repository alone (``deltarl report
experiments/results/<folder>``) after its run folders are gone.

Tables (each optional but ``runs``):

* ``runs``: one row per campaign: scenario, AUT, seed, the safety run (fuzzer, episodes,
  failures) and its ``safety_key``, the optimality run (method, challenger, oracle, test cases,
  bugs, distinct bugs, distance);
* ``agents``: the AUT's and each challenger's evaluation (mean return, CI, success rate,
  episodes, training time) with a ``key`` naming the *unit*: one AUT evaluation, one trained
  challenger;
* ``timelines``: failures and bugs over the episodes / test cases of every run;
* ``bug_list`` and ``failure_list``: the initial states (and returns) of the confirmed bugs and
  failures;
* ``cases``: the AUT's and the challenger's return on every optimality test case;
* ``behaviour`` and ``dendrograms``: behaviour-cluster counts per run and τ, and the linkage
  drawn for each scenario;
* ``videos``: the bug GIFs of the report (the files are in ``report_files/``).

Independent units. The campaigns of a grid often share work: every method of one environment
and seed runs *the same* safety campaign (same scenario, AUT, seed and settings: the same
failures, the same dataset D) and trains one challenger on it (the grid's challenger cache).
Those copies are one observation, not seven: ``safety_key`` (and an agent's ``key``) name the
unit, and statistics over safety runs or challengers count each unit once.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from orchestrator.analysis.run_reader import Run, find_runs, is_run, optimality_cases, read_parquet, timeline
from orchestrator.runs.layout import SAFETY_PHASES, RunFolder
from orchestrator.runs.store import RunStore, atomic_write_bytes, atomic_write_table

log = logging.getLogger(__name__)

DATA_DIR = "report_data"
META = "meta.json"
TABLES = ("runs", "agents", "timelines", "bug_list", "failure_list", "cases", "behaviour", "dendrograms", "videos")
GRID_RESULTS = "results.parquet"  # what deltarl grid writes into a grid folder
GRID_JSON = "grid.json"


class ReportError(ValueError):
    """A folder that holds nothing to report on."""


@dataclass
class ReportData:
    kind: str  # "run" | "grid" | "collection"
    title: str
    source: str  # the folder the data came from
    tables: dict = field(default_factory=dict)  # name -> DataFrame
    notes: list = field(default_factory=list)  # what this data cannot show, and why
    run_dirs: dict = field(default_factory=dict)  # campaign -> run folder (only when collected from runs)
    saved: bool = False  # made from a saved report_data/ (with run folders --add-ed to it or not)

    @property
    def from_runs(self) -> bool:
        """Collected from run folders alone: what is missing is missing from the runs. False for
        saved data, also with run folders added to it (the report then reads as the saved folder's
        own report will, so that the folder alone makes it again)."""
        return bool(self.run_dirs) and not self.saved

    def __getitem__(self, name: str) -> pd.DataFrame:
        t = self.tables.get(name)
        return t if t is not None else pd.DataFrame()

    def has(self, name: str) -> bool:
        t = self.tables.get(name)
        return t is not None and not t.empty

    # -- files ---------------------------------------------------------------------------------
    def save(self, folder: str | Path) -> Path:
        d = Path(folder) / DATA_DIR
        d.mkdir(parents=True, exist_ok=True)
        import pyarrow as pa

        for name in TABLES:
            t = self.tables.get(name)
            path = d / f"{name}.parquet"
            if t is None:
                path.unlink(missing_ok=True)
                continue
            atomic_write_table(path, pa.Table.from_pandas(t.reset_index(drop=True), preserve_index=False))
        meta = {"kind": self.kind, "title": self.title, "source": self.source, "notes": self.notes}
        atomic_write_bytes(d / META, json.dumps(meta, indent=2).encode())
        return d

    @classmethod
    def load(cls, folder: str | Path) -> "ReportData":
        d = Path(folder) / DATA_DIR
        meta = json.loads((d / META).read_text())
        tables = {name: read_parquet(d / f"{name}.parquet") for name in TABLES}
        tables = {k: v for k, v in tables.items() if v is not None}
        if "runs" not in tables:
            raise ReportError(f"{d} holds no runs.parquet")
        return cls(meta["kind"], meta["title"], meta.get("source", str(folder)), tables, list(meta.get("notes") or []),
                   saved=True)


def has_saved_data(folder: str | Path) -> bool:
    d = Path(folder) / DATA_DIR
    return (d / META).is_file() and (d / "runs.parquet").is_file()


# Delta's energy terms, as orchestrator.fuzzers.delta.COMPONENTS names them (not imported from there:
# it loads torch, which a report does not need)
ENERGY_TERMS = ("diversity", "regret", "inconsistency")


# -- collecting from run folders ---------------------------------------------------------------
def _key(*parts) -> str:
    return json.dumps(parts, sort_keys=True, default=str)


def safety_key(r: Run) -> str | None:
    """What makes two safety runs the same run: scenario (and overrides), AUT, seed and the
    safety section of the campaign (its fuzzer, budget, settings)."""
    if not r.safety:
        return None
    c = r.campaign or {}
    if c.get("safety") is not None:
        return _key(r.scenario, c.get("scenario_overrides"), r.aut, r.seed, c.get("safety"))
    s = r.safety
    return _key(r.scenario, r.aut, r.seed, s.get("fuzzer"), s.get("episodes"), s.get("failures"))


def run_row(r: Run) -> dict:
    s, o = r.safety or {}, r.optimality or {}
    ca = None
    if r.challenger_algo:
        ca = next((c["evaluation"]["mean_return"] for c in r.challengers
                   if c.get("config", {}).get("algo") == r.challenger_algo and c.get("evaluation")), None)
    return {"campaign": r.name, "scenario": r.scenario, "aut": r.aut, "seed": r.seed, "status": "done", "error": "",
            "safety_fuzzer": s.get("fuzzer"), "safety_episodes": s.get("episodes"), "failures": s.get("failures"),
            "distinct_failures": s.get("distinct_failures"), "flaky_failures": s.get("flaky_failures"),
            "safety_key": safety_key(r),
            "method": r.optimality_method, "challenger_algo": r.challenger_algo, "challenger_return": ca,
            "oracle": o.get("oracle"), "cases": o.get("cases"), "bugs": o.get("bugs"),
            "distinct_bugs": o.get("distinct_bugs"), "distance": o.get("distance"), "flaky_bugs": o.get("flaky_bugs"),
            # Delta's energy: how often each term decided a seed selection (issue #17; None for the baselines)
            **{f"decision_share_{t}": o.get(f"decision_share_{t}") for t in ENERGY_TERMS},
            **safety_search_row(r)}



def safety_search_row(r: Run) -> dict:
    """What LLMTester's Table II reads from a safety run: the method (``llmtester w/o ms`` for
    ``multi_scale: false``), the distinct failure states (entire / initial / terminal, on a
    ``fixed`` or ``fitted`` grid), the LLM's calls, tokens and invalid replies, the wall time."""
    s = r.safety or {}
    if not s:
        return {}
    fs = s.get("failure_states") or {}
    method = r.safety_method
    tokens = [s.get("llm_prompt_tokens"), s.get("llm_completion_tokens")]
    tl = timeline(r, "safety") if s.get("llm_calls") is not None else None
    alpha = float(tl["alpha"].iloc[-1]) if tl is not None and "alpha" in tl and len(tl) else None
    return {"safety_method": method, "states_entire": fs.get("entire"), "states_initial": fs.get("initial"),
            "states_terminal": fs.get("terminal"), "states_grid": fs.get("grid"),
            "states_intervals": fs.get("intervals"), "llm_calls": s.get("llm_calls"),
            "llm_tokens": sum(tokens) if all(t is not None for t in tokens) else None,
            "llm_invalid_share": s.get("llm_invalid_share"), "llm_usable": s.get("llm_usable"),
            "llm_unchanged": s.get("llm_unchanged"), "llm_alpha_final": alpha,
            # the operators' tests and failures (recorded since 2026-12-03; None in older runs)
            "llm_scenarios": s.get("llm_usable") if "llm_scenario_failures" in s else None,
            "llm_scenario_failures": s.get("llm_scenario_failures"),
            "random_mutations": s.get("random_mutations") if "random_mutation_failures" in s else None,
            "random_mutation_failures": s.get("random_mutation_failures"),
            "llm_fallbacks": s.get("llm_fallbacks") if "llm_fallback_failures" in s else None,
            "llm_fallback_failures": s.get("llm_fallback_failures"),
            "safety_wall_seconds": s.get("wall_seconds")}


def agent_rows(r: Run) -> list[dict]:
    """The AUT's and the challengers' evaluations on the run's cards; ``key`` names the unit."""
    rows = []
    sk = safety_key(r) or _key(r.name)
    for c in r.challengers:
        ev = c.get("evaluation") or {}
        aut = c.get("aut") or {}
        aev = aut.get("evaluation") or {}
        if aev:
            rows.append({"scenario": r.scenario, "role": "aut", "algo": "aut", "campaign": r.name,
                         "key": _key(r.scenario, r.aut, aev.get("episodes"), aev.get("seed"), aev.get("mean_return")),
                         "mean_return": aev.get("mean_return"), "ci95_margin": aev.get("ci95_margin"),
                         "success_rate": aev.get("success_rate"), "episodes": aev.get("episodes"),
                         "training_wall_seconds": aut.get("training_wall_seconds")})
        if ev:
            cfg = c.get("config") or {}
            rows.append({"scenario": r.scenario, "role": "challenger", "algo": cfg.get("algo"), "campaign": r.name,
                         "key": _key(sk, cfg), "mean_return": ev.get("mean_return"),
                         "ci95_margin": ev.get("ci95_margin"), "success_rate": ev.get("success_rate"),
                         "episodes": ev.get("episodes"), "training_wall_seconds": c.get("training_wall_seconds")})
    return rows


def _timeline_rows(r: Run) -> list[pd.DataFrame]:
    out = []
    for phase, xcol in (("safety", "episodes"), ("optimality", "cases")):
        tl = read_parquet(r.folder.timeline_parquet(phase))
        if tl is None or tl.empty or xcol not in tl:
            continue
        cols = ("failures", "distinct_failures") if phase == "safety" else ("bugs", "distinct_bugs")
        df = pd.DataFrame({"campaign": r.name, "phase": phase, "x": tl[xcol].to_numpy(dtype=float)})
        for c in cols:
            df[c] = tl[c].to_numpy(dtype=float) if c in tl else np.nan
        out.append(df)
    return out


def _bug_rows(r: Run) -> pd.DataFrame | None:
    bugs = read_parquet(r.folder.bugs_parquet)
    if bugs is None or bugs.empty:
        return None
    return pd.DataFrame({"campaign": r.name, "bug_id": bugs["bug_id"].astype(int),
                         "aut_return": bugs["aut_return"].astype(float), "ca_return": bugs["ca_return"].astype(float),
                         "initial_state": [list(map(float, s)) for s in bugs["initial_state"]]})


def _failure_rows(r: Run) -> pd.DataFrame | None:
    """Confirmed failures (failures.parquet), else the failing safety episodes of the store."""
    f = read_parquet(r.folder.failures_parquet)
    if f is not None and not f.empty:
        states = f["initial_state"]
    elif r.folder.episodes_dir.is_dir():
        try:
            eps = RunStore.open(r.dir).read_episodes(phase=list(SAFETY_PHASES), role="aut", failure=True,
                                                     columns=["initial_state"])
        except Exception as exc:  # noqa: BLE001 - a store that cannot be read: no failure states
            log.debug("%s: failure states not read (%s: %s)", r.dir, type(exc).__name__, exc)
            return None
        states = eps["initial_state"] if len(eps) else None
    else:
        states = None
    if states is None or not len(states):
        return None
    return pd.DataFrame({"safety_key": safety_key(r), "campaign": r.name,
                         "initial_state": [list(map(float, s)) for s in states]})


def _case_rows(r: Run) -> pd.DataFrame | None:
    cases = optimality_cases(r)
    if cases is None:
        return None
    aut, ca, bug = cases
    return pd.DataFrame({"campaign": r.name, "aut_return": aut, "ca_return": ca, "bug": bug})


def _behaviour(runs: list[Run], max_sequences: int) -> tuple[pd.DataFrame | None, pd.DataFrame | None, list[str]]:
    """Behaviour clusters of the AUT on the bugs of each scenario's Delta runs (or, without a
    Delta run, of the runs that found bugs); the linkage of the first one per scenario."""
    from orchestrator.analysis.behaviour import cluster_run

    rows, links, said = [], [], []
    for sc in sorted({r.scenario for r in runs if r.scenario}):
        with_bugs = [r for r in runs if r.scenario == sc and r.optimality and r.folder.bugs_parquet.is_file()]
        chosen = [r for r in with_bugs if r.optimality_method == "delta"] or with_bugs
        first = True
        for r in chosen:
            try:
                c = cluster_run(r.dir, max_sequences=max_sequences, seed=0)
            except Exception as exc:  # noqa: BLE001 - a run without its steps/ store
                said.append(f"behaviour clustering of {r.name}: not possible ({type(exc).__name__}: {exc})")
                continue
            if c.n == 0:
                continue
            merges = c.linkage[:, 2] if c.linkage is not None else np.zeros(0)
            for t, k in c.counts.items():
                rows.append({"campaign": r.name, "scenario": sc, "method": r.optimality_method, "tau": float(t),
                             "clusters": int(k), "n": c.n, "total": c.total, "d_max": c.d_max,
                             "min_merge": float(merges.min()) if merges.size else float("nan"), "linkage": c.method})
            if first and c.linkage is not None:
                z = np.asarray(c.linkage, dtype=float)
                links.append(pd.DataFrame({"campaign": r.name, "scenario": sc, "a": z[:, 0], "b": z[:, 1],
                                           "dist": z[:, 2], "count": z[:, 3]}))
                first = False
    return (pd.DataFrame(rows) if rows else None, pd.concat(links, ignore_index=True) if links else None, said)


def _concat(frames) -> pd.DataFrame | None:
    frames = [f for f in frames if f is not None and not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else None


def _no_folder(root: Path) -> str:
    """What to do about a report path that is not a folder: name the command that makes it."""
    if root.exists():
        return f"{root} is not a folder: give a run folder, a grid folder or a folder of runs"
    grid = next((p for p in (root, *root.parents) if p.parent.name == "grids"), None)
    hint = "a run folder appears when `deltarl run` writes it; "
    if grid is not None:
        files = sorted(Path(__file__).resolve().parents[2].glob("experiments/*/*.yaml"))
        named = [f for f in files if f"output: {grid.as_posix()}\n" in f.read_text(errors="replace")]
        cmd = f"deltarl grid {named[0].relative_to(named[0].parents[2]) if named else 'GRID.yaml'}"
        profile = f" --profile {root.name}" if root != grid else ""
        hint = f"a grid's folder appears when the grid runs ({cmd}{profile}); "
    return (f"{root} does not exist (from {Path.cwd()}): {hint}the committed results are reported again from "
            f"their folders, e.g. deltarl report experiments/results/delta-local-rq2-rq3 --out /tmp/rq2-rq3")


def collect(root: str | Path, *, max_sequences: int = 300) -> ReportData:
    """The report's data for ``root``: a run folder, a grid folder (``results.parquet`` and its
    campaigns' run folders), a folder of run folders, or a results folder holding only the
    saved ``report_data/`` (or only a grid's ``results.parquet``)."""
    root = Path(root)
    if not root.is_dir():
        raise ReportError(_no_folder(root))
    grid_df = read_parquet(root / GRID_RESULTS)
    single = grid_df is None and is_run(root)
    if single:
        dirs = [root]
    else:
        named = [root / str(c) for c in (grid_df.get("campaign", []) if grid_df is not None else [])]
        dirs = [d for d in named if d.is_dir() and is_run(d)] or find_runs(root)
    if not dirs:
        if has_saved_data(root):
            return ReportData.load(root)
        if grid_df is not None:
            return from_grid_table(grid_df, root)
        raise ReportError(f"{root} holds no run folder (store.json, campaign.json, summary.json, "
                          f"optimality_summary.json or results.json), no grid {GRID_RESULTS} and no saved "
                          f"{DATA_DIR}/ of an earlier report")
    runs = [Run.load(d) for d in dirs]
    names = Counter(r.name for r in runs)
    for r in runs:  # two runs of one campaign file (another seed) keep apart: named by their folder
        if names[r.name] > 1:
            r.alias = f"{r.name}@{r.dir.relative_to(root) if r.dir != root else r.dir.name}"
    tables, said = _tables(runs, max_sequences)
    said = _unreadable(runs, root) + said
    if grid_df is not None and "status" in grid_df:  # failed campaigns have no run folder worth reading
        failed = grid_df[grid_df["status"] != "done"]
        if len(failed):
            table = tables["runs"]
            extra = from_grid_table(failed, root)["runs"]
            tables["runs"] = pd.concat([table, extra[~extra["campaign"].isin(table["campaign"])]], ignore_index=True)
    kind = "run" if single else "grid" if grid_df is not None else "collection"
    title = runs[0].name if single else root.name
    data = ReportData(kind, title, str(root), {k: v for k, v in tables.items() if v is not None}, said,
                      {r.name: r.dir for r in runs})
    return data


def _unreadable(runs: list[Run], root: Path) -> list[str]:
    """One note per file of the runs that could not be read (a truncated Parquet part, a damaged
    JSON file): what the report left out, said in its "What this report cannot show"."""
    notes = []
    for r in runs:
        for path, why in RunFolder(r.dir).damaged_files():
            where = path.relative_to(root) if path.is_relative_to(root) else path
            notes.append(f"`{where}` could not be read ({why}): what it holds is left out of this report")
    return notes


def _tables(runs: list[Run], max_sequences: int) -> tuple[dict, list[str]]:
    """The report's tables (None where a table has no rows) of these runs, and what could not be read."""
    behaviour, dendrograms, said = _behaviour(runs, max_sequences)
    return {
        "runs": pd.DataFrame([run_row(r) for r in runs]),
        "agents": _concat([pd.DataFrame(agent_rows(r)) for r in runs]),
        "timelines": _concat([df for r in runs for df in _timeline_rows(r)]),
        "bug_list": _concat([_bug_rows(r) for r in runs]),
        "failure_list": _dedupe_failures(_concat([_failure_rows(r) for r in runs])),
        "cases": _concat([_case_rows(r) for r in runs]),
        "behaviour": behaviour,
        "dendrograms": dendrograms,
    }, said


def add_runs(base: ReportData, dirs, *, max_sequences: int = 300) -> ReportData:
    """``base`` (typically a results folder's saved ``report_data/``, whose run folders are gone)
    with the run folders ``dirs`` added: a results folder grows as its campaigns finish, in other
    sessions or on other machines (``deltarl report FOLDER --add RUN_DIR``).

    An added run is named by its campaign name, or ``name@folder`` where that name is shared (by
    another added run, or by a saved campaign of another seed). An added run whose name (or
    ``name@folder``) is already saved *replaces* it, so adding a resumed or repeated run again
    changes nothing twice. The saved bug videos and dendrograms are kept; the added runs get
    them only for scenarios that had none."""
    dirs = [Path(d) for d in dirs]
    for d in dirs:
        if not d.is_dir() or not is_run(d):
            raise ReportError(f"--add {d}: not a run folder (no store.json, campaign.json or summary.json there); "
                              f"give the folder a campaign wrote (its output:, or deltarl run --out)")
    runs = [Run.load(d) for d in dirs]
    saved_runs = base["runs"]
    saved = set(saved_runs["campaign"]) if not saved_runs.empty else set()
    names = Counter(r.name for r in runs)
    for r in runs:
        n, at = r.name, f"{r.name}@{r.dir.name}"
        if names[n] > 1 or at in saved:
            r.alias = at
        elif n in saved and not (saved_runs.loc[saved_runs["campaign"] == n, "seed"] == r.seed).all():
            r.alias = at  # the saved one is another seed: keep both
        elif n not in saved and any(str(c).startswith(f"{n}@") for c in saved):
            r.alias = at
    if len({r.name for r in runs}) < len(runs):
        dup = Counter(r.name for r in runs).most_common(1)[0][0]
        raise ReportError(f"--add: two run folders would both be reported as {dup}; give each its own folder name")
    new, said = _tables(runs, max_sequences)
    replaced = {r.name for r in runs}
    order = {c: i for i, c in enumerate(saved_runs["campaign"])} if saved else {}
    tables = {}
    for name in set(base.tables) | set(new):
        old = base.tables.get(name)
        if old is not None and "campaign" in old:
            old = old[~old["campaign"].isin(replaced)]
        add = new.get(name)
        if name == "dendrograms" and old is not None and add is not None and "scenario" in add:
            add = add[~add["scenario"].isin(set(old["scenario"]))]
        merged = _concat([old, add]) if name != "failure_list" else _dedupe_failures(_concat([old, add]))
        if merged is not None and "campaign" in merged:  # a replaced campaign keeps its place
            at = merged["campaign"].map(order).fillna(len(order))
            merged = merged.iloc[np.argsort(at.to_numpy(), kind="stable")].reset_index(drop=True)
        if merged is not None:
            tables[name] = merged
    kind = "collection" if base.kind == "run" else base.kind
    run_dirs = {**{c: d for c, d in base.run_dirs.items() if c not in replaced}, **{r.name: r.dir for r in runs}}
    return ReportData(kind, base.title, base.source, tables, list(base.notes) + said, run_dirs,
                      saved=not base.from_runs)


def _dedupe_failures(f: pd.DataFrame | None) -> pd.DataFrame | None:
    """One copy of each safety run's failures (campaigns sharing a safety run list them once)."""
    if f is None:
        return None
    first = f.groupby("safety_key")["campaign"].transform("first")
    return f[f["campaign"] == first].reset_index(drop=True)


# -- a grid's results table alone (its run folders gone) ---------------------------------------
def _point(value) -> dict:
    """A grid axis value: a JSON mapping (several settings together) or a plain value."""
    if isinstance(value, str) and value.startswith("{"):
        try:
            return json.loads(value)
        except ValueError:
            return {}
    return {}


def from_grid_table(grid_df: pd.DataFrame, root: Path) -> ReportData:
    """The report's data from a grid's ``results.parquet`` alone: one row per campaign with the
    axis values and each phase's headline figures. The grid's base campaign (``grid.json``,
    written by ``deltarl grid``) fills in what no axis set. Timelines, bug and failure states,
    per-case returns, behaviour clusters and the agents' cards are not in that table."""
    base = {}
    gj = root / GRID_JSON
    if gj.is_file():
        try:
            base = json.loads(gj.read_text()).get("base") or {}
        except ValueError:
            base = {}
    axis_cols = [c for c in grid_df.columns if c not in RESULT_COLUMNS and not str(c).endswith("_return")]
    rows = []
    for _, g in grid_df.iterrows():
        setting = {}  # dotted key -> value, from the base and then the axes
        for k, v in _flatten(base).items():
            setting[k] = v
        for c in axis_cols:
            v = g[c]
            mapping = _point(v)
            if mapping:
                setting.update(_flatten(mapping))
            else:
                setting[c] = v.item() if hasattr(v, "item") else v
        fuzzer = setting.get("optimality.fuzzer")
        without = setting.get("optimality.params.without") or []
        if hasattr(without, "tolist"):
            without = without.tolist()
        method = None
        if fuzzer and not _missing(g.get("cases")):
            method = fuzzer + (" w/o " + ", ".join(without) if len(without) else "")
        algos = setting.get("challenger.algos")
        if hasattr(algos, "tolist"):
            algos = algos.tolist()
        rets = {str(c)[:-len("_return")]: g[c] for c in grid_df.columns if str(c).endswith("_return")
                and not _missing(g[c])}
        algo = (list(algos)[0] if algos else None) or (next(iter(rets)) if len(rets) == 1 else None)
        scenario = setting.get("scenario")
        seed = setting.get("seed")
        sk = None
        if not _missing(g.get("safety_episodes")):
            sk = _key(scenario, setting.get("scenario_overrides"), setting.get("aut"), seed,
                      {k: v for k, v in setting.items() if k.startswith("safety.")})
        rows.append({"campaign": g["campaign"], "scenario": scenario, "aut": setting.get("aut"),
                     "seed": None if _missing(seed) else int(seed), "status": g.get("status", "done"),
                     "error": g.get("error") or "",
                     "safety_fuzzer": setting.get("safety.fuzzer") if sk else None,
                     "safety_episodes": _num(g.get("safety_episodes")), "failures": _num(g.get("failures")),
                     "distinct_failures": _num(g.get("distinct_failures")), "flaky_failures": None,
                     "safety_key": sk, "method": method, "challenger_algo": algo,
                     "challenger_return": _num(rets.get(algo)) if algo else None,
                     "oracle": _oracle(setting.get("optimality.oracle"), scenario) if method else None,
                     "cases": _num(g.get("cases")),
                     "bugs": _num(g.get("bugs")), "distinct_bugs": _num(g.get("distinct_bugs")),
                     "distance": _num(g.get("distance")), "flaky_bugs": None})
    runs = pd.DataFrame(rows)
    agents = []
    for _, r in runs.iterrows():
        if r["challenger_algo"] and not _missing(r["challenger_return"]):
            agents.append({"scenario": r["scenario"], "role": "challenger", "algo": r["challenger_algo"],
                           "campaign": r["campaign"], "key": _key(r["safety_key"], r["challenger_algo"]),
                           "mean_return": r["challenger_return"], "ci95_margin": None, "success_rate": None,
                           "episodes": None, "training_wall_seconds": None})
    notes = ["made from the grid's results table alone (its run folders are not here): failures and bugs over "
             "time, the bug and failure states, the per-case returns, the behaviour clusters and the agents' "
             "cards (AUT evaluation, challenger success rates, training times) are not in it"]
    tables = {"runs": runs}
    if agents:
        tables["agents"] = pd.DataFrame(agents)
    return ReportData("grid", root.name, str(root), tables, notes)


def _oracle(oracle, scenario) -> str | None:
    """The campaign's oracle; ``auto`` (the default) is statistical on a stochastic scenario."""
    if oracle not in (None, "auto"):
        return str(oracle)
    try:
        from envs import get_scenario

        return "statistical" if get_scenario(scenario).stochastic else "differential"
    except Exception as exc:  # noqa: BLE001 - a plug-in scenario not installed here
        log.debug("scenario %s unavailable here (%s: %s): oracle unknown", scenario, type(exc).__name__, exc)
        return None


RESULT_COLUMNS = ("campaign", "status", "error", "safety_episodes", "failures", "distinct_failures", "cases", "bugs",
                  "distinct_bugs", "distance")


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in (d or {}).items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _missing(v) -> bool:
    if v is None:
        return True
    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


def _num(v):
    return None if _missing(v) else (int(v) if float(v).is_integer() else float(v))
