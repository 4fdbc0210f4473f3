"""Whether two run folders hold the same verdicts: failures.parquet and bugs.parquet (and the flaky
ones) compared row for row, every column but the wall-clock ones, with a content hash of each.

    python benchmarks/same_verdicts.py RUN_A RUN_B

Used for issue 46 (the same quick start before and after the refactor,
experiments/results/same-verdicts-issue46.md). BCQ training is not bit-reproducible across
processes, so an optimality comparison shares the challenger: run B with DELTARL_CHALLENGER_CACHE
holding run A's challenger under the key of run A's D (the key is the same when D is).
"""
import hashlib
import sys
from pathlib import Path

import pandas as pd


def digest(d):
    d = d.map(lambda v: tuple(v) if hasattr(v, "__len__") and not isinstance(v, str) else v)
    return hashlib.sha256(pd.util.hash_pandas_object(d, index=True).values.tobytes()).hexdigest()[:16]


a, b = Path(sys.argv[1]), Path(sys.argv[2])
for name in ("failures.parquet", "bugs.parquet", "flaky_failures.parquet", "flaky_bugs.parquet"):
    if not (a / name).exists() and not (b / name).exists():
        continue
    da, db = pd.read_parquet(a / name), pd.read_parquet(b / name)
    drop = [c for c in da.columns if any(k in c for k in ("time", "wall", "run_id", "seconds"))]
    ea, eb = da.drop(columns=drop, errors="ignore"), db.drop(columns=drop, errors="ignore")
    same = list(ea.columns) == list(eb.columns) and digest(ea) == digest(eb)
    print(f"{name}: {len(da)} vs {len(db)} rows, {len(ea.columns)} columns compared (left out: {drop or 'none'}), "
          f"identical: {same} (content sha256 {digest(ea)} vs {digest(eb)})")
