"""Which operator made LLMTester's failing tests, for run folders that predate the record of it.

Since 2026-12-03 an LLMTester run's ``summary.json`` counts its failing fuzzing tests by the
operator that made them (``llm_scenario_failures``, ``random_mutation_failures``,
``llm_fallback_failures``; ``deltarl report`` shows them). For older runs this script finds the
LLM's scenarios after the fact: every reply in the run's LLM audit (``llm/``) is parsed as the
fuzzer parsed it, and a fuzzing-phase episode whose initial state equals a parsed reply (to 4
decimals) is counted as the LLM's. Where a run has the counters, both are printed, so the
matching can be checked against the exact record.

    python benchmarks/llm_attribution.py RUN_DIR [RUN_DIR ...]

Prints one Markdown table row per run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def attribute(run: Path) -> dict:
    from envs import get_scenario
    from orchestrator.fuzzers.llm_prompt import parse_reply

    campaign = json.loads((run / "campaign.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    sc = get_scenario(campaign["scenario"], **(campaign.get("scenario_overrides") or {}))
    audit = pd.read_parquet(run / "llm") if any((run / "llm").glob("*.parquet")) else pd.DataFrame()
    proposed = set()
    for ok, text in zip(audit.get("ok", ()), audit.get("text", ())):  # no calls: no audit (alpha at 100)
        if not ok or text is None:
            continue
        try:
            proposed.add(tuple(np.round(parse_reply(text, sc), 4)))
        except Exception:  # noqa: BLE001 - an unusable reply: the fuzzer fell back to a random mutation
            continue
    ep = pd.read_parquet(run / "episodes")
    ep = ep[(ep["phase"] == "fuzzing") & (ep["role"] == "aut")]
    by_llm = ep["initial_state"].map(lambda s: tuple(np.round(np.asarray(s, dtype=np.float64), 4)) in proposed)
    return {"run": run.name, "seed": campaign.get("seed"), "failures": int(summary["failures"]),
            "llm_calls": int(summary.get("llm_calls", 0)), "usable": int(summary.get("llm_usable", 0)),
            "matched": int(by_llm.sum()), "matched_failures": int(ep.loc[by_llm, "failure"].sum()),
            "other": int((~by_llm).sum()), "other_failures": int(ep.loc[~by_llm, "failure"].sum()),
            "counted_failures": summary.get("llm_scenario_failures")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    args = ap.parse_args(argv)
    print("| run | seed | failures | LLM calls | usable replies | LLM's scenarios run | their failures | rate | "
          "other fuzzing tests | their failures | rate | LLM failures as recorded |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for run in args.runs:
        r = attribute(run)

        def rate(k, n):
            return f"{100.0 * k / n:.1f}%" if n else "–"

        rec = "not recorded" if r["counted_failures"] is None else str(r["counted_failures"])
        print(f"| {r['run']} | {r['seed']} | {r['failures']} | {r['llm_calls']} | {r['usable']} | {r['matched']} | "
              f"{r['matched_failures']} | {rate(r['matched_failures'], r['matched'])} | {r['other']} | "
              f"{r['other_failures']} | {rate(r['other_failures'], r['other'])} | {rec} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
