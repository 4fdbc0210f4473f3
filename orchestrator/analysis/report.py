"""Reports: ``deltarl report RUN_OR_GRID_DIR [--out DIR]`` → ``report.md`` and one self-contained
``report.html`` (CSS inline, figures inlined as base64 PNG, no external URL).

What it reads (every part optional; a missing part is reported as "not in this run"):

* a **run folder** (``store.json``, ``campaign.json``, ``summary.json``, ``timeline.parquet``,
  ``challengers/*/card.json``, ``optimality_summary.json``, ``optimality_timeline.parquet``,
  ``bugs.parquet``, ``episodes/``, ``steps/``);
* a **grid folder** (``results.parquet`` from ``deltarl grid``): its table as is, then the
  campaigns' run folders aggregated as below;
* any other **folder of run folders** (e.g. ``benchmarks/optimality_comparison.py``'s output):
  the run folders found beneath it (up to three levels), aggregated.

Aggregated runs are grouped by scenario and method (the fuzzer, with Delta's ablations as
``delta w/o regret``); each cell is the mean ± 95% CI margin over the runs (seeds), as the
papers print them. Tables follow the Delta paper's layout (Table 1: AUT and challengers; Table
2: challengers as the oracle; Tables 3–4: Delta against the baselines and its ablations, with
the improvement over the best baseline and a two-sided Mann–Whitney U test and Cohen's d of
Delta against it; Table 6: behaviour clusters), with the paper's numbers
(``experiments/papers/delta.yaml``) beside ours. Plots: failures and bugs over time, bugs and
failures over the initial-state grid (the first two state dimensions), AUT vs challenger returns
per test case, and the behaviour dendrogram (:mod:`orchestrator.analysis.behaviour`).
"""

from __future__ import annotations

import base64
import html
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from orchestrator.analysis import stats
from workers.resources import resource

PAPER_FILE = resource("papers", "delta.yaml")
NOT_IN_RUN = "not in this run"
BASELINES = ("mdpfuzz", "curefuzz", "gmt", "random")
METRICS = (("bugs", "bugs"), ("distinct_bugs", "distinct bugs"), ("distance", "distance"))


class ReportError(ValueError):
    """A folder that holds nothing to report on."""


# ---------------------------------------------------------------------------------------------
# the document: blocks rendered to Markdown and to self-contained HTML
# ---------------------------------------------------------------------------------------------


@dataclass
class Doc:
    title: str
    blocks: list = field(default_factory=list)

    def h(self, text: str, level: int = 2):
        self.blocks.append(("h", level, text))

    def p(self, text: str):
        self.blocks.append(("p", text))

    def table(self, headers: list[str], rows: list[list], caption: str | None = None, align: str | None = None):
        """``align``: one character per column, ``l`` or ``r`` (default: first l, the rest r)."""
        align = align or "l" + "r" * (len(headers) - 1)
        self.blocks.append(("table", headers, [[str(c) for c in r] for r in rows], caption, align))

    def figure(self, name: str, fig, caption: str):
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
        taken = {n for n, _ in self.images()}
        base, i = name, 2
        while name in taken:
            name, i = f"{base}-{i}", i + 1
        self.blocks.append(("img", name, buf.getvalue(), caption))

    def images(self) -> list[tuple[str, bytes]]:
        return [(b[1], b[2]) for b in self.blocks if b[0] == "img"]

    def markdown(self, fig_dir: str) -> str:
        out = [f"# {self.title}", ""]
        for b in self.blocks:
            if b[0] == "h":
                out += ["#" * b[1] + " " + b[2], ""]
            elif b[0] == "p":
                out += [b[1], ""]
            elif b[0] == "table":
                _, headers, rows, caption, align = b
                if caption:
                    out += [f"*{caption}*", ""]
                out.append("| " + " | ".join(headers) + " |")
                out.append("|" + "|".join("---:" if a == "r" else "---" for a in align) + "|")
                out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
                out.append("")
            elif b[0] == "img":
                out += [f"![{b[3]}]({fig_dir}/{b[1]}.png)", "", f"*{b[3]}*", ""]
        return "\n".join(out)

    def html(self) -> str:
        body = [f"<h1>{_inline(self.title)}</h1>"]
        for b in self.blocks:
            if b[0] == "h":
                body.append(f"<h{b[1]}>{_inline(b[2])}</h{b[1]}>")
            elif b[0] == "p":
                body.append(f"<p>{_inline(b[1])}</p>")
            elif b[0] == "table":
                _, headers, rows, caption, align = b
                cap = f"<caption>{_inline(caption)}</caption>" if caption else ""
                th = "".join(f'<th class="{a}">{_inline(h)}</th>' for h, a in zip(headers, align))
                trs = "".join("<tr>" + "".join(f'<td class="{a}">{_inline(c)}</td>' for c, a in zip(r, align)) + "</tr>"
                              for r in rows)
                body.append(f'<div class="wide"><table>{cap}<thead><tr>{th}</tr></thead>'
                            f'<tbody>{trs}</tbody></table></div>')
            elif b[0] == "img":
                data = base64.b64encode(b[2]).decode()
                body.append(f'<figure><img alt="{html.escape(b[3])}" data-name="{b[1]}" '
                            f'src="data:image/png;base64,{data}"><figcaption>{_inline(b[3])}</figcaption></figure>')
        return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(self.title)}</title>'
                f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;max-width:1280px;margin:2em auto;padding:0 1em;
color:#222;line-height:1.45}
h1{border-bottom:2px solid #444}h2{border-bottom:1px solid #bbb;margin-top:2em}
table{border-collapse:collapse;margin:1em 0;font-size:0.88em}
caption{caption-side:top;text-align:left;font-style:italic;padding-bottom:0.3em;color:#444}
th,td{border:1px solid #ccc;padding:0.25em 0.6em}th{background:#f0f0f0}
td.r,th.r{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}td.l,th.l{text-align:left}
tbody tr:nth-child(even){background:#fafafa}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #ddd}figcaption{font-size:0.9em;color:#555}
code{background:#f3f3f3;padding:0 0.2em}.wide{overflow-x:auto}
"""


def _inline(text: str) -> str:
    """HTML-escape, then `code` and **bold**."""
    t = html.escape(str(text))
    t = re.sub(r"`([^`]+)`", r"<code>\1</code>", t)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", t)


# ---------------------------------------------------------------------------------------------
# reading runs
# ---------------------------------------------------------------------------------------------


def _json(path: Path):
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None


def _parquet(path: Path):
    import pandas as pd

    try:
        return pd.read_parquet(path) if path.exists() else None
    except Exception:  # noqa: BLE001 - an unreadable part is reported as missing
        return None


def is_run(path: Path) -> bool:
    return any((path / f).is_file() for f in ("store.json", "campaign.json", "summary.json",
                                               "optimality_summary.json", "results.json"))


@dataclass
class Run:
    dir: Path
    campaign: dict | None
    safety: dict | None
    optimality: dict | None
    challengers: list  # card.json dicts
    results: dict | None

    @classmethod
    def load(cls, d: Path) -> "Run":
        results = _json(d / "results.json")
        cards = [c for c in (_json(p) for p in sorted((d / "challengers").glob("*/card.json"))) if c]
        if not cards and results:
            cards = list(results.get("challengers") or [])
        return cls(d, _json(d / "campaign.json"), _json(d / "summary.json") or (results or {}).get("safety"),
                   _json(d / "optimality_summary.json") or (results or {}).get("optimality"), cards, results)

    @property
    def name(self) -> str:
        for src, key in ((self.campaign, "name"), (self.optimality, "campaign"), (self.safety, "campaign")):
            if src and src.get(key):
                return str(src[key])
        return self.dir.name

    @property
    def scenario(self) -> str | None:
        for src in (self.campaign, self.optimality, self.safety):
            if src and src.get("scenario"):
                return src["scenario"]
        meta = _json(self.dir / "store.json") or {}
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
        from envs import get_scenario

        try:
            return get_scenario(self.scenario, **((self.campaign or {}).get("scenario_overrides") or {}))
        except Exception:  # noqa: BLE001
            return None

    @property
    def safety_method(self) -> str | None:
        return self.safety.get("fuzzer") if self.safety else None

    @property
    def optimality_method(self) -> str | None:
        return method_label(self.optimality) if self.optimality else None

    @property
    def challenger_algo(self) -> str | None:
        """The oracle's challenger algorithm (bc/bcq/cql) when the path or card tells."""
        if not self.optimality:
            return None
        m = re.search(r"challengers/([a-z]+)/", str(self.optimality.get("challenger") or ""))
        return m.group(1) if m else None


def method_label(opt: dict) -> str:
    without = list((opt.get("params") or {}).get("without") or [])
    return opt["fuzzer"] + (" w/o " + ", ".join(without) if without else "")


def find_runs(root: Path, depth: int = 3) -> list[Path]:
    """Run folders at or below ``root`` (a run folder's own subfolders are not searched)."""
    if is_run(root):
        return [root]
    if depth == 0:
        return []
    out = []
    for sub in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
        out += find_runs(sub, depth - 1)
    return out


def load_paper() -> dict:
    import yaml

    return yaml.safe_load(PAPER_FILE.read_text()) if PAPER_FILE.is_file() else {}


def _paper_cell(v) -> str:
    if not v:
        return ""
    return stats.format_cell(float(v[0]), float(v[1]))


# ---------------------------------------------------------------------------------------------
# figures (matplotlib's object API: no pyplot global state)
# ---------------------------------------------------------------------------------------------


def _fig(w=6.4, h=3.6, ncols=1):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h))
    axes = fig.subplots(1, ncols) if ncols > 1 else fig.subplots()
    return fig, axes


def fig_over_time(lines: dict, xlabel: str, panels: list[str], title: str):
    """One panel per quantity (e.g. bugs, distinct bugs); ``lines[label][panel] = (x, y)``, one colour per label."""
    fig, axes = _fig(9.6, 3.6, ncols=len(panels))
    axes = np.atleast_1d(axes)
    for n, (label, by_panel) in enumerate(lines.items()):
        for ax, panel in zip(axes, panels):
            if panel in by_panel:
                x, y = by_panel[panel]
                ax.plot(x, y, label=label, drawstyle="steps-post", color=f"C{n % 10}", ls=("-", "--", "-.", ":")[n % 4])
    for ax, panel in zip(axes, panels):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(panel)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    return fig


def fig_state_heatmap(states: np.ndarray, scenario, title: str, label: str):
    """Counts of ``states`` over the first two initial-state dimensions, on the scenario's bounds:
    the distinct-bug grid's intervals (at most 25 per axis), cell lines drawn."""
    fig, ax = _fig(5.2, 4.2)
    lo, hi = np.asarray(scenario.low, float), np.asarray(scenario.high, float)
    names = list(scenario.state_names)
    nb = int(min(max(scenario.grid_intervals, 1), 25))
    ex = [(lo[j], hi[j]) if hi[j] > lo[j] else (lo[j] - 0.5, lo[j] + 0.5) for j in range(2)]
    h, xe, ye = np.histogram2d(states[:, 0], states[:, 1], bins=nb, range=ex)
    im = ax.imshow(h.T, origin="lower", aspect="auto", extent=(xe[0], xe[-1], ye[0], ye[-1]), cmap="viridis")
    for i in range(nb):
        for j in range(nb):
            if h[i, j]:
                ax.text((xe[i] + xe[i + 1]) / 2, (ye[j] + ye[j + 1]) / 2, f"{int(h[i, j])}", ha="center",
                        va="center", fontsize=7, color="w" if h[i, j] < h.max() / 2 else "k")
    fig.colorbar(im, ax=ax, label=label)
    ax.set_xlabel(names[0])
    ax.set_ylabel(names[1])
    ax.set_title(title)
    return fig


def fig_returns_scatter(aut: np.ndarray, ca: np.ndarray, bug: np.ndarray, title: str):
    fig, ax = _fig(5.2, 4.6)
    ax.scatter(aut[~bug], ca[~bug], s=9, alpha=0.5, label=f"no bug ({int((~bug).sum())})", color="#4c72b0")
    ax.scatter(aut[bug], ca[bug], s=9, alpha=0.6, label=f"bug ({int(bug.sum())})", color="#dd5555")
    lo = float(np.nanmin(np.concatenate([aut, ca])))
    hi = float(np.nanmax(np.concatenate([aut, ca])))
    pad = 0.03 * (hi - lo or 1.0)
    ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="k", lw=0.8, ls="--", label="equal return")
    ax.set_xlabel("AUT return")
    ax.set_ylabel("challenger return")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def fig_dendrogram(res, title: str):
    from scipy.cluster.hierarchy import dendrogram

    fig, ax = _fig(8, 3.8)
    dendrogram(res.linkage, ax=ax, no_labels=True, color_threshold=0.3 * res.d_max, above_threshold_color="#888",
               truncate_mode="lastp" if res.n > 200 else None, p=200)
    for t in sorted(res.counts):
        ax.axhline(t * res.d_max, ls="--", lw=0.8, color="#c44")
        ax.text(ax.get_xlim()[1], t * res.d_max, f" τ={t:.2f}: {res.counts[t]}", va="center", fontsize=8,
                color="#c44")
    ax.set_ylabel(f"DTW distance ({res.method} linkage)")
    ax.set_title(title)
    return fig


# ---------------------------------------------------------------------------------------------
# the parts of a report
# ---------------------------------------------------------------------------------------------


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-")[:80] or "fig"


def _mean_ci(values) -> tuple[float, float]:
    v = [float(x) for x in values if x is not None and x == x]
    return stats.mean_ci(v) if v else (float("nan"), float("nan"))


def _cell(values, digits=None) -> str:
    """Mean ± 95% CI margin over runs; a single integral value prints as the integer it is."""
    v = [float(x) for x in values if x is not None and x == x]
    if len(v) == 1 and v[0].is_integer() and digits is None:
        return str(int(v[0]))
    m, c = _mean_ci(v)
    return stats.format_cell(m, c, digits=digits)


def _num(v, digits=None) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "n/a"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    return stats.format_cell(float(v), digits=digits)


def _optimality_cases(run: Run):
    """AUT and challenger (mean) returns per optimality test case, and the bug flag."""
    from orchestrator.runs.store import RunStore

    if not run.optimality or not (run.dir / "episodes").is_dir():
        return None
    try:
        eps = RunStore.open(run.dir).read_episodes(phase="optimality", columns=["role", "iteration", "state_index",
                                                                                 "return", "bug"])
    except Exception:  # noqa: BLE001
        return None
    if eps.empty:
        return None
    g = eps.groupby(["iteration", "state_index", "role"])["return"].mean().unstack("role")
    if not {"aut", "challenger"} <= set(g.columns):
        return None
    bug = eps.groupby(["iteration", "state_index"])["bug"].any().reindex(g.index)
    return g["aut"].to_numpy(), g["challenger"].to_numpy(), bug.to_numpy(dtype=bool)


def _bug_states(run: Run) -> np.ndarray | None:
    bugs = _parquet(run.dir / "bugs.parquet")
    if bugs is None or bugs.empty:
        return None
    return np.stack(bugs["initial_state"].to_numpy()).astype(float)


def _failure_states(run: Run) -> np.ndarray | None:
    from orchestrator.runs.store import RunStore

    if not run.safety or not (run.dir / "episodes").is_dir():
        return None
    try:
        eps = RunStore.open(run.dir).read_episodes(phase=["sampling", "fuzzing"], role="aut", failure=True,
                                                   columns=["initial_state"])
    except Exception:  # noqa: BLE001
        return None
    return np.stack(eps["initial_state"].to_numpy()).astype(float) if len(eps) else None


def section_table1(doc: Doc, runs: list[Run], scenario: str, paper: dict):
    """AUT and challengers (Table 1): mean return ± CI, AUT success rate, safety failures."""
    doc.h("AUT and challengers (Delta Table 1)", 3)
    p1 = (paper.get("table1") or {}).get(scenario) or {}
    cards = [c for r in runs for c in r.challengers if c.get("evaluation")]
    safety = [r.safety for r in runs if r.safety]
    if not cards and not safety:
        doc.p(f"Challengers and safety testing: {NOT_IN_RUN}.")
        return
    rows = []
    multi = len({str(r.dir) for r in runs if r.challengers}) > 1
    note = "over datasets (runs)" if multi else "over 100 evaluation episodes"
    auts = [c["aut"]["evaluation"] for c in cards if (c.get("aut") or {}).get("evaluation")]
    if auts:
        if multi:
            ret = _cell([a["mean_return"] for a in auts])
        else:
            ret = stats.format_cell(auts[0]["mean_return"], auts[0].get("ci95_margin"))
        succ = sum(round(a["success_rate"] * a["episodes"]) for a in auts)
        n = sum(a["episodes"] for a in auts)
        ps = p1.get("aut_success")
        rows.append([f"AUT ({runs[0].aut})", ret, _paper_cell(p1.get("aut")), stats.format_rate(succ, n),
                     f"{ps[0]:.1f} [{ps[1]:.1f}, {ps[2]:.1f}]" if ps else ""])
    by_algo: dict[str, list] = {}
    for c in cards:
        by_algo.setdefault(c["config"]["algo"], []).append(c["evaluation"])
    for algo, evs in sorted(by_algo.items()):
        ret = _cell([e["mean_return"] for e in evs]) if multi else stats.format_cell(evs[0]["mean_return"],
                                                                                      evs[0].get("ci95_margin"))
        succ = sum(round(e["success_rate"] * e["episodes"]) for e in evs)
        rows.append([algo.upper(), ret, _paper_cell(p1.get(algo)),
                     stats.format_rate(succ, sum(e["episodes"] for e in evs)), ""])
    if rows:
        doc.table(["agent", f"mean return ± 95% CI ({note})", "paper", "success rate % [Wilson 95%]", "paper"], rows,
                  caption=f"{scenario}: returns of the AUT and the offline challengers trained on its test record D")
    else:
        doc.p(f"Challengers: {NOT_IN_RUN}.")
    section_training_time(doc, cards, scenario, runs[0].aut)
    if safety:
        by = {}
        for s in safety:
            by.setdefault(s["fuzzer"], []).append(s)
        srows = []
        for fz, ss in sorted(by.items()):
            srows.append([fz, str(len(ss)), f"{ss[0]['episodes']}", _cell([s["failures"] for s in ss]),
                          _cell([s["distinct_failures"] for s in ss]),
                          _paper_cell(p1.get("safety_failures")) if fz == "curefuzz" else ""])
        doc.table(["safety fuzzer", "runs", "episodes per run", "failures", "distinct failures",
                   "paper failures (CureFuzz, 2 h)"], srows,
                  caption=f"{scenario}: safety failures of the AUT (mean ± 95% CI over runs)")


def section_training_time(doc: Doc, cards: list, scenario: str, aut: str):
    """Fig. 4: training time of the AUT (its zoo card) and the median of each challenger algorithm."""
    aut_s = next((c["aut"].get("training_wall_seconds") for c in cards
                  if (c.get("aut") or {}).get("training_wall_seconds")), None)
    by_algo: dict[str, list] = {}
    for c in cards:
        if c.get("training_wall_seconds"):
            by_algo.setdefault(c["config"]["algo"], []).append(float(c["training_wall_seconds"]))
    if not by_algo:
        return
    rows = [[f"AUT ({aut})", "1", f"{aut_s:.0f}" if aut_s else "not recorded", ""]]
    for algo, secs in sorted(by_algo.items()):
        med = float(np.median(secs))
        rows.append([algo.upper(), str(len(secs)), f"{med:.0f}",
                     f"{100 * med / aut_s:.1f}%" if aut_s else ""])
    doc.table(["agent", "trainings", "wall seconds (median)", "of the AUT's"], rows, align="lrrr",
              caption=f"{scenario}: training time of the AUT and of the challengers (Delta Fig. 4; wall time on "
                      f"the machine that trained each, shared cores included)")


def _opt_table(doc: Doc, runs: list[Run], scenario: str, methods: list[str], paper_tab: dict, caption: str,
               compare: list[str], percentages: bool = True):
    """Tables 3/4: rows = methods, columns = each metric and the paper's value; Delta against the
    best of ``compare`` (improvement, Mann–Whitney p, Cohen's d)."""
    vals = {m: {k: [r.optimality.get(k) for r in runs if r.optimality_method == m] for k, _ in METRICS}
            for m in methods}
    nruns = {m: sum(1 for r in runs if r.optimality_method == m) for m in methods}
    best = {}
    for k, _ in METRICS:
        means = {m: _mean_ci(vals[m][k])[0] for m in compare if m in vals}
        best[k] = stats.best_baseline(means)
    rows = []
    for m in methods:
        row = [m, str(nruns[m])]
        for k, _ in METRICS:
            mean, ci = _mean_ci(vals[m][k])
            imp = pimp = None
            if percentages and m == "delta" and best[k][0] and mean > best[k][1]:
                imp = stats.improvement(mean, best[k][1])  # printed only where Delta is best, as the paper does
            pv = (paper_tab.get(k) or {}).get(m)
            if percentages and m == "delta" and pv:
                pbest = stats.best_baseline({b: v[0] for b, v in (paper_tab.get(k) or {}).items() if b != "delta"})
                if pbest[0] and pv[0] > pbest[1]:
                    pimp = stats.improvement(pv[0], pbest[1])
            pcell = stats.format_cell(pv[0], pv[1], improvement_pct=pimp) if pv else ""
            cell = stats.format_cell(mean, ci, improvement_pct=imp)
            if len(vals[m][k]) == 1 and imp is None:
                cell = _cell(vals[m][k])  # one run: its value as recorded (an integer count stays one)
            row += [cell, pcell]
        rows.append(row)
    headers = ["method", "runs"]
    for _, label in METRICS:
        headers += [label, "paper"]
    doc.table(headers, rows, caption=caption)
    if "delta" not in methods or not any(best[k][0] for k, _ in METRICS):
        return
    crows = []
    for k, label in METRICS:
        name = best[k][0]
        if not name:
            continue
        a = [v for v in vals["delta"][k] if v == v]
        b = [v for v in vals[name][k] if v == v]
        u, p = stats.mann_whitney(a, b)
        crows.append([label, name, _num(_mean_ci(a)[0]), _num(best[k][1]),
                      f"{stats.improvement(_mean_ci(a)[0], best[k][1]):+.1f}%", _num(u, 1),
                      "n/a" if p != p else "<0.001" if p < 0.001 else f"{p:.3f}", _num(stats.cohens_d(a, b), 2)])
    doc.table(["metric", "best other method", "Delta", "best other", "Delta vs best other", "Mann–Whitney U of Delta",
               "p (two-sided)", "Cohen's d"], crows, align="llrrrrrr",
              caption=f"{scenario}: Delta against the best of the others on each metric (runs as samples)")


def section_optimality(doc: Doc, runs: list[Run], scenario: str, paper: dict):
    opt = [r for r in runs if r.optimality]
    doc.h("Optimality testing (Delta Tables 2–4)", 3)
    if not opt:
        doc.p(f"Optimality testing: {NOT_IN_RUN}.")
        return
    methods = sorted({r.optimality_method for r in opt}, key=lambda m: (m != "delta", "w/o" in m, m))
    main = [m for m in methods if "w/o" not in m]
    ablations = [m for m in methods if m == "delta" or "w/o" in m]
    p3 = (paper.get("table3") or {}).get(scenario) or {}
    p4 = (paper.get("table4") or {}).get(scenario) or {}
    cases = sorted({r.optimality.get("cases") for r in opt})
    oracles = sorted({str(r.optimality.get("oracle")) for r in opt})
    doc.p(f"{len(opt)} optimality run(s); test cases per run: {', '.join(map(str, cases))}; oracle: "
          f"{', '.join(oracles)}. Mean ± 95% CI margin over runs; the paper's runs had a two-hour budget each, "
          f"so its counts are on another scale.")
    _opt_table(doc, opt, scenario, main, p3,
               f"{scenario}: Delta against the baselines (Table 3 layout; percentage: improvement over the best "
               f"baseline where Delta is best)", [m for m in main if m != "delta"])
    if len(ablations) > 1:
        _opt_table(doc, opt, scenario, ablations, p4, f"{scenario}: Delta against its ablations (Table 4 layout)",
                   [m for m in ablations if m != "delta"], percentages=False)
    algos = sorted({r.challenger_algo for r in opt if r.optimality_method == "delta" and r.challenger_algo})
    if len(algos) > 1:
        p2 = (paper.get("table2") or {}).get(scenario) or {}
        rows = []
        for a in algos:
            rs = [r for r in opt if r.optimality_method == "delta" and r.challenger_algo == a]
            row = [a.upper(), str(len(rs))]
            for k, _ in METRICS:
                row += [_cell([r.optimality.get(k) for r in rs]), _paper_cell((p2.get(k) or {}).get(a))]
            rows.append(row)
        headers = ["challenger", "runs"] + [h for _, lab in METRICS for h in (lab, "paper")]
        doc.table(headers, rows, caption=f"{scenario}: Delta's bugs by challenger algorithm (Table 2 layout)")


def section_behaviour(doc: Doc, runs: list[Run], scenario: str, paper: dict, max_sequences: int, figs: bool = True):
    from orchestrator.analysis.behaviour import TAUS, cluster_run

    doc.h("Behaviour clustering (Delta Sec. 6.1, Table 6)", 3)
    with_bugs = [r for r in runs if r.optimality and (r.dir / "bugs.parquet").is_file()]
    delta_runs = [r for r in with_bugs if r.optimality_method == "delta"]
    if not delta_runs:
        delta_runs = with_bugs  # no Delta run: the methods that found bugs
    if not delta_runs:
        doc.p(f"Behaviour clustering: {NOT_IN_RUN} (no bugs.parquet: no optimality bugs were found or recorded).")
        return
    results = []
    for r in delta_runs:
        try:
            results.append((r, cluster_run(r.dir, max_sequences=max_sequences, seed=0)))
        except Exception as exc:  # noqa: BLE001 - a run without its steps/ store
            doc.p(f"Behaviour clustering of {r.name}: {NOT_IN_RUN} ({type(exc).__name__}: {exc}).")
    results = [(r, c) for r, c in results if c.n > 0]
    if not results:
        return
    p6 = (paper.get("table6") or {}).get(scenario) or {}
    rows = []
    for t in TAUS:
        rows.append([f"{t:.2f}", _cell([c.counts[t] for _, c in results]), _paper_cell(p6.get(f"{t:.2f}"))])
    sampled = sum(c.n for _, c in results)
    total = sum(c.total for _, c in results)
    method = results[0][1].method
    doc.p(f"The AUT's trajectories from the bug-triggering initial states of {len(results)} run(s) "
          f"({', '.join(sorted({r.optimality_method for r, _ in results}))}): {sampled} trajectories"
          + (f" (a seeded sample of {total} bugs, at most {max_sequences} per run)" if sampled < total else "")
          + f", states z-scored per dimension, multivariate DTW, {method}-linkage agglomerative clustering; "
          f"clusters counted at τ · d_max.")
    doc.table(["τ", "behaviour clusters (ours, mean ± 95% CI over runs)", "paper (Delta)"], rows,
              caption=f"{scenario}: behavioural patterns of the AUT on bug-triggering states (Table 6 layout)")
    r0, c0 = results[0]
    if figs and c0.linkage is not None:
        doc.figure(_safe(f"dendrogram-{scenario}-{r0.name}"),
                   fig_dendrogram(c0, f"{r0.name}: {c0.n} AUT trajectories on bugs"),
                   f"Dendrogram of the AUT's trajectories on the bugs of {r0.name} (d_max = {c0.d_max:.2f}; "
                   f"dashed: cuts at τ · d_max)")


def section_figures(doc: Doc, runs: list[Run], scenario: str):
    """Failures and bugs over time, bugs/failures over the initial-state grid, AUT vs challenger returns."""
    doc.h("Figures", 3)
    said = []
    # over time: one line per method (mean over runs, on the union of x values, step-interpolated)
    for kind, fname, xcol, ycols, xlabel in (
            ("safety", "timeline.parquet", "episodes", ("failures", "distinct_failures"), "episodes"),
            ("optimality", "optimality_timeline.parquet", "cases", ("bugs", "distinct_bugs"), "test cases")):
        series = []
        for r in runs:
            tl = _parquet(r.dir / fname)
            if tl is None or tl.empty:
                continue
            label = r.safety_method if kind == "safety" else r.optimality_method
            series.append((label, tl[xcol].to_numpy(), {c: tl[c].to_numpy() for c in ycols if c in tl}))
        if not series:
            said.append(f"{kind} timeline: {NOT_IN_RUN}")
            continue
        lines = {}
        labels = sorted({s[0] for s in series}, key=lambda m: (m != "delta", m))
        for label in labels:
            group = [s for s in series if s[0] == label]
            x = np.unique(np.concatenate([g[1] for g in group]))
            name = label + (f" (mean of {len(group)} runs)" if len(group) > 1 else "")
            lines[name] = {}
            for c in ycols:
                ys = []
                for _, gx, gy in group:
                    if c not in gy:
                        continue
                    idx = np.searchsorted(gx, x, side="right") - 1
                    y = np.where(idx >= 0, gy[c][np.clip(idx, 0, None)], 0).astype(float)
                    y[x > gx[-1]] = np.nan  # a shorter run does not count past its end
                    ys.append(y)
                if ys:
                    lines[name][c.replace("_", " ")] = (x, np.nanmean(np.vstack(ys), axis=0))
        what = "failures" if kind == "safety" else "bugs"
        doc.figure(_safe(f"{kind}-over-time-{scenario}"),
                   fig_over_time(lines, xlabel, [c.replace("_", " ") for c in ycols], f"{scenario}: {what} over time"),
                   f"{scenario}: {what} and distinct {what} over the {xlabel} of the {kind} phase")
    sc = next((r.scenario_obj() for r in runs if r.scenario_obj() is not None), None)
    opt_runs = [r for r in runs if r.optimality]
    focus = [r for r in opt_runs if r.optimality_method == "delta"] or opt_runs
    states = [s for s in (_bug_states(r) for r in focus) if s is not None]
    if sc is not None and states:
        st = np.concatenate(states)
        who = ", ".join(sorted({r.optimality_method for r in focus}))
        doc.figure(_safe(f"bugs-grid-{scenario}"),
                   fig_state_heatmap(st, sc, f"{scenario}: {len(st)} bugs ({who})", "bugs"),
                   f"{scenario}: bug initial states over the first two state dimensions ({sc.state_names[0]}, "
                   f"{sc.state_names[1]}), on the distinct-bug grid, {len(focus)} run(s) of {who}")
    else:
        said.append(f"bugs over the initial-state grid: {NOT_IN_RUN}" + (" (no bugs)" if opt_runs else ""))
    fails = [s for s in (_failure_states(r) for r in runs if r.safety) if s is not None]
    if sc is not None and fails:
        st = np.concatenate(fails)
        doc.figure(_safe(f"failures-grid-{scenario}"),
                   fig_state_heatmap(st, sc, f"{scenario}: {len(st)} safety failures", "failures"),
                   f"{scenario}: initial states of the AUT's safety failures over the first two state dimensions")
    cases = [c for c in (_optimality_cases(r) for r in focus) if c is not None]
    if cases:
        aut = np.concatenate([c[0] for c in cases])
        ca = np.concatenate([c[1] for c in cases])
        bug = np.concatenate([c[2] for c in cases])
        doc.figure(_safe(f"returns-{scenario}"),
                   fig_returns_scatter(aut, ca, bug, f"{scenario}: AUT vs challenger per test case"),
                   f"{scenario}: AUT and challenger returns from the same initial states ({len(aut)} test cases; "
                   f"above the dashed line the challenger did better)")
    elif opt_runs:
        said.append(f"AUT vs challenger returns: {NOT_IN_RUN} (no optimality episodes in the store)")
    if said:
        doc.p("; ".join(said) + ".")


def section_single(doc: Doc, run: Run):
    """The headline table of one run (the phases it ran)."""
    rows = []
    s = run.safety
    if s:
        rows.append(["safety", f"{s['fuzzer']}, {s['episodes']} episodes, {s.get('wall_seconds', 0):.0f} s",
                     f"{s['failures']} failures in {s['distinct_failures']} distinct cells "
                     f"(failure rate {100 * s['failures'] / max(s['episodes'], 1):.1f}%)"])
    else:
        rows.append(["safety", NOT_IN_RUN, ""])
    for c in run.challengers:
        ev = c.get("evaluation") or {}
        rows.append([f"challenger {c['config']['algo']}", f"{c.get('steps')} steps on "
                     f"{(c.get('dataset') or {}).get('transitions')} transitions, "
                     f"{c.get('training_wall_seconds', 0):.0f} s",
                     f"return {stats.format_cell(ev.get('mean_return', float('nan')), ev.get('ci95_margin'))} "
                     f"({ev.get('episodes')} episodes)"])
    if not run.challengers:
        rows.append(["challenger", NOT_IN_RUN, ""])
    o = run.optimality
    if o:
        rows.append(["optimality", f"{run.optimality_method} ({o.get('oracle')} oracle), {o['cases']} test cases, "
                     f"{o.get('wall_seconds', 0):.0f} s",
                     f"{o['bugs']} bugs in {o['distinct_bugs']} distinct cells, distance {_num(o.get('distance'))}, "
                     f"bug rate {100 * o['bugs'] / max(o['cases'], 1):.1f}%"])
    else:
        rows.append(["optimality", NOT_IN_RUN, ""])
    doc.table(["phase", "work", "result"], rows, caption="The run's phases", align="lll")


def build(path: str | Path, *, max_sequences: int = 300) -> Doc:
    """The report of a run folder, a grid folder or a folder of run folders."""
    import pandas as pd

    root = Path(path)
    if not root.is_dir():
        raise ReportError(f"{root} is not a folder")
    paper = load_paper()
    grid_df = _parquet(root / "results.parquet")
    single = grid_df is None and is_run(root)
    run_dirs = [root] if single else find_runs(root)
    if grid_df is not None:
        named = [root / str(c) for c in grid_df.get("campaign", [])]
        run_dirs = [d for d in named if d.is_dir() and is_run(d)] or run_dirs
    runs = [Run.load(d) for d in run_dirs]
    if not runs and grid_df is None:
        raise ReportError(f"{root} holds no run folder (store.json, campaign.json, summary.json, "
                          f"optimality_summary.json or results.json) and no grid results.parquet")
    kind = "run" if single else "grid" if grid_df is not None else "collection"
    title = f"deltarl report: {runs[0].name if single else root.name}"
    doc = Doc(title)
    doc.p(f"Folder `{root}` ({'a run folder' if single else 'a grid' if kind == 'grid' else 'a folder of runs'}"
          f"{'' if single else f', {len(runs)} run folders'}), made by `deltarl report`. Cells are mean ± 95% CI "
          f"margin; \"paper\" columns are the Delta paper's published numbers ({paper.get('source', 'n/a')}, "
          f"`experiments/papers/delta.yaml`).")
    if single:
        r = runs[0]
        doc.p(f"Scenario **{r.scenario}**, AUT `{r.aut}`, seed {r.seed}.")
        section_single(doc, r)
    if grid_df is not None:
        doc.h("Grid results (results.parquet)", 2)
        from orchestrator.campaign.grid import markdown_table

        lines = markdown_table(grid_df).strip().splitlines()
        headers = [h.strip() for h in lines[0].strip("|").split("|")]
        rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:]]
        doc.table(headers, rows, caption=f"{len(grid_df)} campaigns", align="l" * len(headers))
        failed = grid_df[grid_df.get("status", pd.Series(dtype=str)) == "failed"] if "status" in grid_df else []
        if len(failed):
            doc.p(f"{len(failed)} campaign(s) failed: their rows carry the error.")
    scenarios = sorted({r.scenario for r in runs if r.scenario})
    for sc in scenarios:
        group = [r for r in runs if r.scenario == sc]
        doc.h(sc if not single else f"{sc}: tables and figures", 2)
        section_table1(doc, group, sc, paper)
        section_optimality(doc, group, sc, paper)
        section_behaviour(doc, group, sc, paper, max_sequences)
        section_figures(doc, group, sc)
    return doc


def write_report(path: str | Path, out: str | Path | None = None, *, max_sequences: int = 300) -> dict:
    """Build the report of ``path`` and write ``report.md`` (figures in ``report_files/``) and the
    self-contained ``report.html`` into ``out`` (default: ``path``)."""
    from orchestrator.runs.store import atomic_write_bytes

    doc = build(path, max_sequences=max_sequences)
    out = Path(out) if out is not None else Path(path)
    out.mkdir(parents=True, exist_ok=True)
    fig_dir = out / "report_files"
    images = doc.images()
    if images:
        fig_dir.mkdir(exist_ok=True)
        for name, png in images:
            atomic_write_bytes(fig_dir / f"{name}.png", png)
    atomic_write_bytes(out / "report.md", doc.markdown("report_files").encode())
    atomic_write_bytes(out / "report.html", doc.html().encode())
    return {"markdown": str(out / "report.md"), "html": str(out / "report.html"), "figures": len(images),
            "tables": sum(1 for b in doc.blocks if b[0] == "table")}
