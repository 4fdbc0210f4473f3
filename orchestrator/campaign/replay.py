"""Replay a verdict: re-run a confirmed bug or failure from its recorded initial state and episode
seeds, every policy acting alone (one observation per call), exactly as the campaign confirmed it.

    replay_bug("runs/quickstart", 0)        # AUT and challenger again, both returns
    replay_failure("runs/quickstart", 0)    # the AUT again: does it still fail?
    bug_video("runs/quickstart", 0)         # runs/quickstart/videos/bug-0.gif: AUT | challenger

The record holds the state, the generation's seed and the state's index in it (so stochastic
scenarios meet the same noise), and the policies' sha256: a policy file that changed since is
refused with a clear message.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from orchestrator.campaign.config import campaign_of_run
from orchestrator.campaign.confirm import by_state, solo_rollout
from orchestrator.runs.layout import RunFolder
from orchestrator.runs.store import StoreError
from workers.policies import load_policy
from workers.render import render_episodes, write_side_by_side
from workers.rollout import episode_seeds


def _row(table, key: str, ident: int, path: Path, what: str):
    _check_folder(path.parent)
    if table is None:
        raise StoreError(f"{path.parent} holds no {path.name}: {what}")
    row = table[table[key] == int(ident)]
    if row.empty:
        raise StoreError(f"no {key.split('_')[0]} {ident} in {path} ({key}s 0..{len(table) - 1})")
    return row.iloc[0]


def _bug_row(run: RunFolder, bug_id: int):
    """Bug ``bug_id``'s row of bugs.parquet. Without the file, the message says why: the
    optimality phase found no bug (its summary is read only then), or it never ran."""
    bugs = run.bugs()
    why = "run an optimality phase first"
    done = run.summary("optimality") if bugs is None and run.root.is_dir() else None
    if done:
        why = (f"its optimality phase found no bug in {done.get('cases', '?')} test cases (nothing to replay; "
               f"a larger optimality budget or another challenger may find some)")
    return _row(bugs, "bug_id", bug_id, run.bugs_parquet, why)


def _check_folder(root: Path) -> None:
    """A clear message for a path that is no run folder (before "holds no bugs.parquet")."""
    run = RunFolder(root)
    if not root.exists():
        raise StoreError(f"{root} does not exist (from {Path.cwd()}): give the run folder a campaign wrote "
                         f"(`make run` and `deltarl run` print it)")
    if not root.is_dir() or not run.has_campaign():
        raise StoreError(f"{root} is not a campaign run folder (no campaign.json): give the folder of a "
                         f"`deltarl run`")


def _policy(uri: str, scenario, recorded: str, role: str):
    pol = load_policy(uri, scenario)
    pol.per_row_loop()  # the reference: one model call per observation, nothing batched (docs/verdicts.md)
    have = getattr(pol, "sha256", "")
    if recorded and have and have != recorded:
        raise StoreError(f"the {role} policy changed since the verdict was recorded (sha256 {have[:12]} != "
                         f"{recorded[:12]}); replay needs the same policy files")
    return pol


def replay_bug(run_dir: str | Path, bug_id: int) -> dict:
    """Re-run bug ``bug_id`` of the run in ``run_dir`` with both agents acting alone."""
    run = RunFolder(run_dir)
    row = _bug_row(run, bug_id)
    campaign = campaign_of_run(run.root)
    summary = run.summary("optimality") or {}
    scenario = campaign.build_scenario()
    pols = {"aut": _policy(campaign.aut, scenario, row["aut_sha256"], "aut"),
            "challenger": _policy(run.resolve(summary.get("challenger")) or run.challenger_uri(campaign), scenario,
                                  row["ca_sha256"], "challenger")}
    repeats = int(summary.get("repeats") or 1)
    state = np.asarray(row["initial_state"], dtype=np.float64)[None]
    index = np.array([int(row["state_index"])])
    m = by_state(solo_rollout(scenario, pols, state, index, int(row["gen_seed"]), repeats), index, repeats)
    aut, ca = float(m["aut"].mean()), float(m["challenger"].mean())
    return {"kind": "bug", "id": int(bug_id), "initial_state": state[0].tolist(),
            "state_names": list(scenario.state_names), "aut_return": aut, "ca_return": ca,
            "recorded_aut_return": float(row["aut_return"]), "recorded_ca_return": float(row["ca_return"]),
            "reproduced": bool(aut == float(row["aut_return"]) and ca == float(row["ca_return"]))}


def replay_failure(run_dir: str | Path, failure_id: int) -> dict:
    """Re-run safety failure ``failure_id`` of the run in ``run_dir`` with the AUT acting alone."""
    run = RunFolder(run_dir)
    row = _row(run.failures(), "failure_id", failure_id, run.failures_parquet, "its safety phase found no failure")
    campaign = campaign_of_run(run.root)
    scenario = campaign.build_scenario()
    aut = _policy(campaign.aut, scenario, row["aut_sha256"], "aut")
    state = np.asarray(row["initial_state"], dtype=np.float64)[None]
    index = np.array([int(row["state_index"])])
    res = solo_rollout(scenario, {"aut": aut}, state, index, int(row["gen_seed"]))
    ret, failed = float(res.returns[0]), bool(res.failure[0])
    return {"kind": "failure", "id": int(failure_id), "initial_state": state[0].tolist(),
            "state_names": list(scenario.state_names), "aut_return": ret, "failure": failed,
            "recorded_aut_return": float(row["aut_return"]),
            "reproduced": bool(failed and ret == float(row["aut_return"]))}


def replay(run_dir: str | Path, bug_id: int) -> dict:
    """Backwards-compatible name: :func:`replay_bug` with ``bug_id`` as the ``bug_id`` key."""
    out = replay_bug(run_dir, bug_id)
    out["bug_id"] = out["id"]
    return out


def _episode_seed(row) -> int:
    """The recorded episode's seed (repeat 0 of the state in its generation)."""
    return int(episode_seeds(int(row["gen_seed"]), np.array([int(row["state_index"])]), np.array([0]))[0])


def bug_video(run_dir: str | Path, bug_id: int, out: str | Path | None = None, *, failure: bool = False,
              fps: float = 15.0, max_frames: int = 120) -> dict:
    """Render bug ``bug_id`` (or with ``failure`` safety failure ``bug_id``): the AUT's and the
    challenger's episodes from the recorded state, side by side, in the scenario's reference
    gymnasium environment (``rgb_array``; MuJoCo offscreen), each agent acting alone with the
    recorded episode seed. Writes a GIF (default ``RUN/videos/bug-ID.gif``, ``failure-ID.gif``)
    and returns its path, both episodes' returns and lengths, and the recorded returns (with
    ``repeats`` > 1 those are means over the repeats; the video shows repeat 0)."""
    run = RunFolder(run_dir)
    _check_folder(run.root)
    campaign = campaign_of_run(run.root)
    scenario = campaign.build_scenario()
    repeats = 1
    if failure:
        row = _row(run.failures(), "failure_id", bug_id, run.failures_parquet, "its safety phase found no failure")
        roles = {"AUT": _policy(campaign.aut, scenario, row["aut_sha256"], "aut")}
    else:
        row = _bug_row(run, bug_id)
        summary = run.summary("optimality") or {}
        repeats = int(summary.get("repeats") or 1)
        roles = {"AUT": _policy(campaign.aut, scenario, row["aut_sha256"], "aut"),
                 "challenger": _policy(run.resolve(summary.get("challenger")) or run.challenger_uri(campaign), scenario,
                                       row["ca_sha256"], "challenger")}
    kind = "failure" if failure else "bug"
    state = np.asarray(row["initial_state"], dtype=np.float64)
    episodes = render_episodes(scenario, roles, state, _episode_seed(row), max_frames=max_frames)
    path = Path(out) if out is not None else run.root / "videos" / f"{kind}-{int(bug_id)}.gif"
    title = f"{scenario.name} {kind} {int(bug_id)}: " + ", ".join(
        f"{n}={v:.3g}" for n, v in zip(scenario.state_names, state))
    write_side_by_side(path, episodes, title=title[:100], fps=fps)
    recorded = {"AUT": float(row["aut_return"]), **({} if failure else {"challenger": float(row["ca_return"])})}
    returns = {label: e.total for label, e in episodes}
    return {"kind": kind, "id": int(bug_id), "path": str(path), "scenario": scenario.name, "repeats": repeats,
            "returns": returns, "lengths": {label: e.length for label, e in episodes},
            "failed": {label: e.failure for label, e in episodes}, "recorded": recorded,
            "same_as_recorded": repeats == 1 and returns == recorded}
