"""Every percentage that README.md, docs/results.md and docs/optimality.md quote from a committed
result is recomputed here from the committed data (Parquet, JSON, the markdown tables under
experiments/results/), so a figure cannot drift from its source (issue 51).

Each :class:`Claim` is a passage of a document with its figures left as ``{}`` slots and a
function that computes those figures from the data; the check formats the passage with the
computed figures and requires it, word for word (whitespace and line breaks normalised), in the
document. The sweep then requires every percentage in the covered documents to lie inside a
claim's passage or to be one of the few non-data uses listed in ``NOT_DATA`` (a confidence
level, a target), so a new figure cannot be added without its source either.

Unit tier: reads files only.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
RES = ROOT / "experiments" / "results"
RQ23 = RES / "delta-paper-cases-rq2-rq3" / "report_data" / "runs.parquet"
COVERED = ("README.md", "docs/results.md", "docs/optimality.md")


# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def runs(path: Path = RQ23) -> pd.DataFrame:
    return pd.read_parquet(path)


def mean(scenario: str, method: str, metric: str = "bugs") -> float:
    d = runs()
    v = d[(d.scenario == scenario) & (d.method == method)][metric]
    assert len(v) == 5, f"{scenario} {method}: expected 5 seeds in {RQ23}, got {len(v)}"
    return float(v.mean())


def per_seed(scenario: str, method: str, metric: str = "bugs") -> pd.Series:
    d = runs()
    return d[(d.scenario == scenario) & (d.method == method)].set_index("seed")[metric].sort_index()


def mean_rel(scenario: str, a: str, b: str, metric: str = "bugs") -> float:
    """benchmarks/paired_by_seed.py's 'mean rel.': the mean over seeds of (a - b) / b, in %."""
    x, y = per_seed(scenario, a, metric), per_seed(scenario, b, metric)
    return float(np.mean((x - y) / y) * 100)


def ratio_pct(a: float, b: float) -> float:
    """How much more a is than b, in % of b."""
    return (a / b - 1.0) * 100


def shares(scenarios, *, present: bool = True) -> np.ndarray:
    """The mean decision share per (scenario, Delta variant, term), over the terms present."""
    d = runs()
    out = []
    for sc in scenarios:
        for m, g in d[(d.scenario == sc) & d.method.str.startswith("delta")].groupby("method"):
            for term in ("diversity", "regret", "inconsistency"):
                if (f"w/o {term}" in m) != present:
                    out.append(float(g[f"decision_share_{term}"].mean()))
    return np.asarray(out)


def md_rows(path: Path) -> list[list[str]]:
    """The cells of every markdown table row in a file."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        s = line.strip()
        if s.startswith("|") and s.endswith("|") and not set(s) <= set("|-: "):
            rows.append([c.strip() for c in s.strip("|").split("|")])
    return rows


def md_row(path: Path, first: str) -> list[str]:
    hits = [r for r in md_rows(path) if r[0] == first]
    assert len(hits) == 1, f"{path}: expected one table row starting {first!r}, got {len(hits)}"
    return hits[0]


def num(cell: str) -> float:
    """The first number of a cell ('331.7 ± 41.7 (-28.8%)' -> 331.7; '−' is a minus)."""
    m = re.search(r"[-−]?\d+(?:\.\d+)?", cell.replace(",", ""))
    assert m, f"no number in {cell!r}"
    return float(m.group(0).replace("−", "-"))


def jaccards() -> np.ndarray:
    """Jaccard of each pair of challengers' bug states, from the counts in the RQ1 bug-set table."""
    out = []
    for r in md_rows(RES / "delta-paper-cases-rq1-bug-sets.md"):
        if len(r) < 5 or not r[1].isdigit():
            continue
        counts = {k: int(v) for k, v in (x.split() for x in r[2].split(", "))}
        for pair in r[3].split(", "):
            names, shared = pair.split()
            a, b = names.split("&")
            out.append(int(shared) / (counts[a] + counts[b] - int(shared)))
    assert len(out) >= 30, "the RQ1 bug-set table has 3 pairs x 5 seeds x 3 scenarios"
    return np.asarray(out)


def card(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def table7_cards(algo: str) -> list[dict]:
    folder = RES / "delta-table7-hopper-noise-summaries"
    cards = [card(p)["evaluation"] for p in sorted(folder.glob(f"*.challenger-{algo}.card.json"))]
    assert cards, f"no {algo} cards in {folder}"
    return cards


# ---------------------------------------------------------------------------------------------
# formatting
# ---------------------------------------------------------------------------------------------
def f1(x: float) -> str:
    return f"{x:.1f}"


def f0(x: float) -> str:
    return f"{x:.0f}"


def rng1(xs) -> str:
    """'lo–hi' with one decimal (an en dash, as the documents write ranges)."""
    return f"{min(xs):.1f}–{max(xs):.1f}"


def rng0(xs) -> str:
    return f"{min(xs):.0f}–{max(xs):.0f}"


def row_text(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


# ---------------------------------------------------------------------------------------------
# the claims
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Claim:
    doc: str
    passage: str  # the document's words, with each computed figure as {}
    figures: Callable[[], tuple]
    source: str  # the file the figures come from, for the failure message

    def text(self) -> str:
        return self.passage.format(*self.figures())


A, M, C = "Acrobot-v1", "MountainCar-v0", "CartPole-v1"
PAIRED = "experiments/results/delta-paper-cases-rq2-rq3/report_data/runs.parquet (paired by seed)"
PARQ = "experiments/results/delta-paper-cases-rq2-rq3/report_data/runs.parquet"


def _delta_over(sc, other):
    return ratio_pct(mean(sc, "delta"), mean(sc, other))


def _cartpole_mdpfuzz():
    d, m = mean(C, "delta"), mean(C, "mdpfuzz")
    return f1(ratio_pct(m, d)), f1(m), f1(d), f1(-ratio_pct(d, m))


def _within_3():
    d = mean(C, "delta", "distinct_bugs")
    worst = max(abs(ratio_pct(d, mean(C, m, "distinct_bugs"))) for m in ("curefuzz", "gmt"))
    return (f0(np.ceil(worst)),)


def _regret_cost():  # Delta's lead over w/o regret, mean of the per-seed relative differences
    return (rng1([mean_rel(sc, "delta", "delta w/o regret") for sc in (A, M)]),)


def _diversity_gain():  # w/o diversity's lead over Delta (paired_by_seed's mean rel., negated)
    return (rng1([-mean_rel(sc, "delta", "delta w/o diversity") for sc in (A, M)]),)


def _table5_hopper():
    r = md_row(RES / "delta-table5" / "table5.md", "Hopper-v5")
    return (f1(ratio_pct(num(r[5]), num(r[4]))),)


def _jaccard():
    return (rng0(100 * jaccards()),)


def _table7_aut():
    e = card(ROOT / "experiments" / "zoo" / "Hopper-Noise-sac" / "card.json")["evaluation"]
    return f1(e["mean_return"]), f0(100 * e["success_rate"])


def _table7_bcq():
    cs = table7_cards("bcq")
    return rng1([c["mean_return"] for c in cs]), rng0([100 * c["success_rate"] for c in cs])


def _challenger_row(scenario: str, first: str):
    """A row of the archived challenger table, its '% of AUT' recomputed from the mean returns."""
    path = RES / "archive" / f"challengers-{scenario}.md"
    rows = md_rows(path)
    aut = next(r for r in rows if r[0].startswith("AUT"))
    r = md_row(path, first)
    if not r[0].startswith("AUT") and num(aut[1]) > 0:
        assert r[3] == f1(100 * num(r[1]) / num(aut[1])), f"{path}: '% of AUT' of {first} is not mean / AUT's mean"
    return (row_text(r),)


def _pct_of_aut(scenario: str, first: str):
    path = RES / "archive" / f"challengers-{scenario}.md"
    aut = next(r for r in md_rows(path) if r[0].startswith("AUT"))
    return (f1(100 * num(md_row(path, first)[1]) / num(aut[1])),)


def _cql_pct():
    (p,) = _pct_of_aut("CartPole-v1", "CQL (DiscreteCQL (d3rlpy 2.8.1))")
    return (f0(float(p)),)


def _energy_terms():
    r = md_row(RES / "delta-energy-terms-Acrobot-v1.md", "normalized, new loop")
    vals = [100 * num(x) for x in r[6:9]]
    return (rng0(vals),)


def _thinned_d():
    """The relative error of D on a thinned trajectory, from the benchmark's printed lines."""
    text = (RES / "delta-energy-terms-Acrobot-v1.md").read_text(encoding="utf-8")
    pairs = [(float(a), float(b)) for a, b in re.findall(r"32 states ([\d.]+)%, 64 states ([\d.]+)%", text)]
    assert len(pairs) == 3, pairs
    return rng1([a for a, _ in pairs]), rng1([b for _, b in pairs])


def _paper_table3() -> dict:
    import yaml

    return yaml.safe_load((ROOT / "experiments" / "papers" / "delta.yaml").read_text(encoding="utf-8"))["table3"]


def _paper_gain(env: str) -> float:
    bugs = _paper_table3()[env]["bugs"]
    return ratio_pct(bugs["delta"][0], max(v[0] for k, v in bugs.items() if k != "delta"))


def _acrobot_1000():
    t = card(RES / "archive" / "optimality-Acrobot-v1.json")["table"]
    best = max(t[m]["bugs"]["mean"] for m in ("mdpfuzz", "curefuzz", "gmt", "random"))
    envs = ("CartPole-v1", "MountainCar-v0", "Acrobot-v1", "Hopper-v5", "Walker2d-v5")
    return (f"+{ratio_pct(t['delta']['bugs']['mean'], best):.1f} %", f"+{_paper_gain('Acrobot-v1'):.1f}",
            f"+{np.mean([_paper_gain(e) for e in envs]):.1f}")


def _shares(scenarios):
    return lambda: (rng0(100 * shares(scenarios)),)



# the ground-truth section (issue 51): experiments/results/groundtruth-*/ (runs.parquet per method and seed)
GT = RES


def gt_runs(report: str) -> pd.DataFrame:
    return pd.read_parquet(GT / report / "runs.parquet")


def gt_mean(report: str, method: str, metric: str = "recall", scenario: str | None = None) -> float:
    d = gt_runs(report)
    if scenario:
        d = d[d.scenario == scenario]
    v = d[d.method == method][metric]
    assert len(v) == 5, f"{report} {method}: expected 5 seeds, got {len(v)}"
    return float(v.mean())


def f2(x: float) -> str:
    return f"{x:.2f}"


def _gt_bug_recalls():
    return tuple(f2(gt_mean("groundtruth-bugs", m)) for m in ("mdpfuzz", "random", "delta", "gmt", "curefuzz"))


def _gt_rerefinds():
    r = "groundtruth-failures"
    return (f1(gt_mean(r, "mdpfuzz", "flagged", C)), f1(gt_mean(r, "curefuzz", "flagged", C)),
            f2(gt_mean(r, "mdpfuzz", "recall", C)))


def _gt_ablations():
    r, broken = "groundtruth-ablations", "delta w/o diversity, regret, inconsistency"
    c = pd.read_parquet(GT / r / "comparisons.parquet")
    row = c[(c.method == broken) & (c.metric == "recall_narrow")].iloc[0]
    return (f2(gt_mean(r, "delta")), f2(gt_mean(r, "delta", "recall_narrow")),
            f2(gt_mean(r, broken, "recall_narrow")), f2(gt_mean(r, "delta", "recall_narrow")), f"{row.p:.3f}",
            f"{row.p_holm:.3f}")


def _gt_acrobot():
    r, A_ = "groundtruth-failures", "Acrobot-v1"
    c = pd.read_parquet(GT / r / "comparisons.parquet")
    p = c[(c.scenario == A_) & (c.method == "mdpfuzz") & (c.metric == "recall")].p.iloc[0]
    return (*(f2(gt_mean(r, m, "recall", A_)) for m in ("random", "curefuzz", "gmt", "mdpfuzz")), f"{p:.3f}",
            f1(gt_mean(r, "mdpfuzz", "inside", A_)), f1(gt_mean(r, "random", "inside", A_)),
            f"{c.p_holm.min():.3f}")


GT_SRC = "experiments/results/groundtruth-{bugs,failures,ablations}/runs.parquet"

CHALLENGER_ROWS = [
    ("CartPole-v1", "AUT (zoo:CartPole-v1)"),
    ("CartPole-v1", "BC (DiscreteBC (d3rlpy 2.8.1))"),
    ("CartPole-v1", "BCQ (DiscreteBCQ (d3rlpy 2.8.1))"),
    ("CartPole-v1", "CQL (DiscreteCQL (d3rlpy 2.8.1))"),
    ("Acrobot-v1", "AUT (zoo:Acrobot-v1)"),
    ("Acrobot-v1", "BCQ (DiscreteBCQ (d3rlpy 2.8.1))"),
]

CLAIMS: list[Claim] = [
    # docs/results.md, issue #17's re-run (RQ2-RQ3)
    Claim("docs/results.md", "Delta finds the most bugs on Acrobot (+{}% over MDPFuzz",
          lambda: (f1(_delta_over(A, "mdpfuzz")),), PARQ),
    Claim("docs/results.md", "MountainCar (+{}% over MDPFuzz, 3 of 5)",
          lambda: (f1(_delta_over(M, "mdpfuzz")),), PARQ),
    Claim("docs/results.md", "MDPFuzz finds {}% more ({} against Delta's {} bugs, Delta {}% fewer)",
          _cartpole_mdpfuzz, PARQ),
    Claim("docs/results.md", "is level with CureFuzz and GMT on CartPole (within {}%)", _within_3, PARQ),
    Claim("docs/results.md", "Removing regret costs {}% of the bugs", _regret_cost, PAIRED),
    Claim("docs/results.md", "removing diversity finds {}% *more* there", _diversity_gain, PAIRED),
    Claim("docs/results.md", "known failure states {}%, with the SAC repair settings", _table5_hopper,
          "experiments/results/delta-table5/table5.md"),
    Claim("docs/results.md", "the three challengers of one seed share only {}% of their bug states (Jaccard)",
          _jaccard, "experiments/results/delta-paper-cases-rq1-bug-sets.md"),
    Claim("docs/results.md", "(Hopper-Noise, wind-trained AUT {}, {}% success)", _table7_aut,
          "experiments/zoo/Hopper-Noise-sac/card.json"),
    Claim("docs/results.md", "Delta finds none with the BCQ ({}, {}% success)", _table7_bcq,
          "experiments/results/delta-table7-hopper-noise-summaries/*.challenger-bcq.card.json"),
    *[Claim("docs/results.md", "{}", functools.partial(_challenger_row, sc, first),
            f"experiments/results/archive/challengers-{sc}.md") for sc, first in CHALLENGER_ROWS],
    Claim("docs/results.md", "BCQ reaches {}% of the AUT's mean return on CartPole",
          lambda: _pct_of_aut("CartPole-v1", "BCQ (DiscreteBCQ (d3rlpy 2.8.1))"),
          "experiments/results/archive/challengers-CartPole-v1.md"),
    Claim("docs/results.md", "well below the AUT on CartPole ({}%)", _cql_pct,
          "experiments/results/archive/challengers-CartPole-v1.md"),
    Claim("docs/results.md", "each term decides {}% of the draws of that run", _energy_terms,
          "experiments/results/delta-energy-terms-Acrobot-v1.md"),
    # docs/optimality.md, the same re-run
    Claim("docs/optimality.md", "each present term decided {}% of the draws", _shares((M, A)), PARQ),
    Claim("docs/optimality.md", "removing regret cost {}% of the bugs in all 10 seed-environment pairs",
          _regret_cost, PAIRED),
    Claim("docs/optimality.md", "removing diversity *gained* {}% in 8 of 10", _diversity_gain, PAIRED),
    Claim("docs/optimality.md", "the terms decided {}% of the draws too", _shares((C,)), PARQ),
    Claim("docs/optimality.md", "MDPFuzz found {}% more bugs than Delta ({} against {})",
          lambda: _cartpole_mdpfuzz()[:3], PARQ),
    Claim("docs/optimality.md", "Normalised, each term decides {} % of the draws", _energy_terms,
          "experiments/results/delta-energy-terms-Acrobot-v1.md"),
    Claim("docs/optimality.md", "D on 32 evenly spaced states was {} % from D on every state, on 64 states {} %",
          _thinned_d, "experiments/results/delta-energy-terms-Acrobot-v1.md"),
    # docs/results.md, the earlier 1000-case optimality comparison (archived JSON) and the paper
    Claim("docs/results.md", "{} over the best baseline. The paper's Acrobot figure is {} % ({} % is its average "
          "over five environments)", _acrobot_1000, "experiments/results/archive/optimality-Acrobot-v1.json, "
          "experiments/papers/delta.yaml"),
    # docs/results.md, "Ground truth (issue 51)": figures, not percentages, traced all the same
    Claim("docs/results.md", "MDPFuzz reports the most bugs per run ({}) and has the lowest recall ({}); Random has "
          "the highest ({}), Delta {}, GMT {}, CureFuzz {}.",
          lambda: (f1(gt_mean("groundtruth-bugs", "mdpfuzz", "flagged")), *_gt_bug_recalls()), GT_SRC),
    Claim("docs/results.md", "on CartPole MDPFuzz reports {} failures per run and CureFuzz {}, at the same recall ({}).",
          _gt_rerefinds, GT_SRC),
    Claim("docs/results.md", "every ablation has Delta's mean recall ({}) and narrow-region recall ({}). Even Delta "
          "with all three terms off (uniform seed selection, no corpus growth) finds the narrow regions less often "
          "only in the mean ({} against {}; it misses the narrow fail region in seeds 2 and 4, where Delta found it "
          "during the search), with p = {} (Holm {}).", _gt_ablations, GT_SRC),
    Claim("docs/results.md", "and Acrobot, where the gap is widest, {} against CureFuzz {}, GMT {} and MDPFuzz {} "
          "(p = {} uncorrected), while MDPFuzz reports the most failures inside the regions ({} per run against "
          "Random's {}): the guided fuzzers spend their budget re-finding what their sampling phase found. No "
          "difference passes Holm's correction (smallest corrected p {}).", _gt_acrobot, GT_SRC),
]

# percentages that are not results: a confidence level, a target, the format of a cell
NOT_DATA = [
    r"95% CI",
    r"95% confidence",
    r"\(generations of 64, 10 % sampling\)",  # a setting of the earlier loop
    r"the target was at least 90%",
    r"\(n=5, \+46\.7%\)`",  # docs/results.md: an example of format_cell's output, not a claim
]

PCT = re.compile(r"[+\-−]?\d+(?:[.,]\d+)?(?:\s?[–-]\s?\d+(?:\.\d+)?)?\s?%")


def normalised(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def doc_text(doc: str) -> str:
    return normalised((ROOT / doc).read_text(encoding="utf-8"))


def claim_problem(claim: Claim, text: str) -> str | None:
    """None when ``text`` (a normalised document) holds the claim's passage with the computed
    figures; else what the document should say."""
    want = normalised(claim.text())
    if want in text:
        return None
    # name what the document says instead, to make the fix obvious
    lead = normalised(claim.passage.split("{}")[0])
    at = text.find(lead) if lead.strip() else -1
    says = text[at:at + len(want) + 20] if at >= 0 else "(passage not found)"
    return f"{claim.doc}: expected {want!r} (from {claim.source}); the document says {says!r}"


def unsourced(doc: str, text: str, claims: list[Claim]) -> list[str]:
    """Percentages in ``text`` neither inside a claim's passage nor a NOT_DATA use."""
    spans = []
    for c in claims:
        if c.doc != doc:
            continue
        want = normalised(c.text())
        for m in re.finditer(re.escape(want), text):
            spans.append((m.start(), m.end()))
    for pat in NOT_DATA:
        for m in re.finditer(pat, text):
            spans.append((m.start(), m.end()))
    out = []
    for m in PCT.finditer(text):
        if not any(lo <= m.start() and m.end() <= hi for lo, hi in spans):
            out.append(f"{doc}: {text[max(0, m.start() - 60):m.end() + 20]!r}")
    return out


@pytest.mark.parametrize("claim", CLAIMS, ids=lambda c: f"{c.doc}:{c.passage[:40]}")
def test_quoted_figure_matches_its_data(claim):
    problem = claim_problem(claim, doc_text(claim.doc))
    assert problem is None, problem


@pytest.mark.parametrize("doc", COVERED)
def test_every_percentage_has_a_source(doc):
    bad = unsourced(doc, doc_text(doc), CLAIMS)
    assert not bad, ("percentages with no claim in tests/test_doc_percentages.py (add one that computes "
                     "them from the committed data, or list a non-data use in NOT_DATA):\n" + "\n".join(bad))


def test_a_planted_wrong_figure_fails():
    """The check is not vacuous: each claim's figure, changed by one in its last digit, fails;
    and a new, unsourced percentage is caught by the sweep."""
    text = doc_text("docs/results.md")
    claims = [c for c in CLAIMS if c.doc == "docs/results.md"]
    for c in claims[:6]:
        right = normalised(c.text())
        m = list(re.finditer(r"\d(?=\D*$)|\d(?=%)", right))
        assert m, right
        i = m[0].start()
        wrong = right[:i] + str((int(right[i]) + 1) % 10) + right[i + 1:]
        planted = text.replace(right, wrong)
        assert planted != text
        assert claim_problem(c, planted) is not None
    # the issue's own example: 21.4% quoted as MDPFuzz's lead
    planted = text.replace("MDPFuzz finds 27.3% more", "MDPFuzz finds 21.4% more")
    assert claim_problem(claims[2], planted) is not None
    assert unsourced("docs/results.md", text + " Delta finds 12.5% more bugs.", claims)
