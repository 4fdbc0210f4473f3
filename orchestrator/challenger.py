"""The challenger phase: train BC/BCQ/CQL on a safety run's record D and card the result.

    card = train_run_challenger("runs/cartpole-curefuzz", "bcq")   # -> runs/…/challengers/bcq/

D is every AUT step of the run's safety phases (``sampling`` and ``fuzzing``, paper Sec. 5).
Training goes through the Ray Train path of AUT training (``workers.challenger``), logged to the
run's MLflow (experiment ``challenger-training``). The challenger folder then holds
``model.d3`` (d3rlpy; ``deltarl evaluate --policy …/model.d3`` loads it), ``policy.pt``
(TorchScript, where d3rlpy can trace the algorithm's action selection), ``training.json``
(per-epoch metrics) and ``card.json``: Table 1's columns for the challenger and for the AUT
evaluated from the same 100 starts, and the training times of both (Fig. 4).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

from orchestrator.safety import SAFETY_PHASES

EVAL_SEED = 2024  # the zoo cards' evaluation seed: challenger and AUT start from the same states


def challenger_dir(run_dir: str | Path, algo: str) -> Path:
    return Path(run_dir) / "challengers" / algo


def _campaign_of(run_dir: Path) -> dict:
    p = run_dir / "campaign.json"
    return json.loads(p.read_text()) if p.is_file() else {}


def _aut_training_seconds(aut_uri: str | None) -> float | None:
    """The AUT's training wall time when its card says (zoo agents and train-aut outputs)."""
    if not aut_uri:
        return None
    from workers.policies import PolicyError, resolve_zoo_uri

    try:
        path = resolve_zoo_uri(aut_uri) if aut_uri.startswith("zoo:") else Path(aut_uri)
    except PolicyError:
        return None
    card = Path(path).parent / "card.json"
    if card.is_file():
        return json.loads(card.read_text()).get("training_wall_seconds")
    return None


def train_run_challenger(
    run_dir: str | Path,
    algo: str,
    *,
    preset: str | None = None,
    steps: int | None = None,
    seed: int | None = None,
    out: str | Path | None = None,
    resume: bool = False,
    eval_episodes: int = 100,
    phases=SAFETY_PHASES,
    mlflow: bool = True,
    progress: bool = True,
) -> dict:
    """Train the ``algo`` challenger on D of the run in ``run_dir``; returns its card."""
    import dataclasses

    from envs import get_scenario
    from orchestrator import tracking
    from orchestrator.driver import start_ray
    from orchestrator.store import RunStore, StoreError
    from workers.challenger import challenger_config, train_challenger_job
    from workers.training import TrainingError, latest_checkpoint

    run_dir = Path(run_dir)
    store = RunStore.open(run_dir)
    campaign = _campaign_of(run_dir)
    scenario = get_scenario(store.meta["scenario"], **campaign.get("scenario_overrides", {}))
    eps = store.read_episodes(phase=list(phases), role="aut")
    if len(eps) == 0:
        raise StoreError(f"run {store.run_id!r} in {run_dir} has no AUT episodes in phases {list(phases)}: "
                         f"run the safety phase first (deltarl run CAMPAIGN.yaml)")
    cfg = challenger_config(scenario.name, algo, preset, steps=steps,
                            seed=seed if seed is not None else campaign.get("seed"))
    out = Path(out) if out else challenger_dir(run_dir, algo)
    if resume and latest_checkpoint(out) is None:
        raise TrainingError(f"--resume: {out} holds no challenger checkpoint to resume from")
    if not resume and latest_checkpoint(out) is not None:
        raise TrainingError(f"{out} already holds a {algo} challenger; add --resume to continue it or choose another --out")

    cache = challenger_cache_dir()
    key = lock = None
    if cache is not None and not resume:
        key = challenger_cache_key(store, phases, cfg, eval_episodes)
        hit = cache / key
        lock = _claim_or_wait(cache, key)  # None: another campaign trained it meanwhile
        if lock is None and (hit / "card.json").is_file():
            return _from_cache(hit, out, run_dir, store)

    try:
        start_ray()
        run = None
        if mlflow:
            run = tracking.start_run(run_dir, "challenger-training", f"{scenario.name}-{algo}-s{cfg.seed}",
                                     params={"config": dataclasses.asdict(cfg), "dataset": {
                                         "run_id": store.run_id, "phases": list(phases), "episodes": len(eps)}},
                                     tags={"deltarl.kind": "challenger-training", "scenario": scenario.name,
                                           "algo": algo})
        t0 = time.perf_counter()
        try:
            state = train_challenger_job(cfg, run_dir, out, phases=phases, resume=resume, tracking=run,
                                         progress=progress)
            card = write_challenger_card(out, cfg, state, scenario, aut_uri=campaign.get("aut"),
                                         eval_episodes=eval_episodes, dataset={
                                             "run_dir": str(run_dir), "run_id": store.run_id, "phases": list(phases),
                                             "episodes": state["episodes"], "transitions": state["transitions"]},
                                         wall=time.perf_counter() - t0)
        except BaseException:
            if run:
                tracking.end_run(run, "FAILED")
            raise
        if run:
            ev = card["evaluation"]
            tracking.log_metrics(run, {"final_mean_return": ev["mean_return"], "final_success_rate": ev["success_rate"],
                                       "training_wall_seconds": card["training_wall_seconds"]}, step=state["step"])
            tracking.log_artifact(run, out / "card.json")
            tracking.end_run(run)
        if key is not None:
            _to_cache(out, cache / key)
    finally:
        if lock is not None:
            lock.unlink(missing_ok=True)
    return card


# -- content-addressed cache of trained challengers ---------------------------------------------
#
# A grid that runs the same safety campaign (same seed: the same dataset D, bit for bit) under
# several optimality fuzzers would train the same challenger once per campaign. With
# DELTARL_CHALLENGER_CACHE set (grids set it to <grid output>/challenger-cache), a challenger is
# stored under sha256(D's transitions, the training config, the evaluation size) and reused.
# Campaigns that need the same entry at the same time wait for the one that trains it (a lock
# file), so every campaign of one D compares against the same challenger (BCQ training is not
# bit-reproducible across processes: two trainings of one seed differ).

_CACHED_FILES = ("model.d3", "policy.pt", "card.json", "training.json")


def challenger_cache_dir() -> Path | None:
    d = os.environ.get("DELTARL_CHALLENGER_CACHE")
    return Path(d) if d else None


def challenger_cache_key(store, phases, cfg, eval_episodes: int) -> str:
    import dataclasses
    import hashlib

    steps = store.read_steps(phase=list(phases), role="aut")
    h = hashlib.sha256()
    for k in ("obs", "actions", "rewards", "terminals", "timeouts", "episode_id"):
        arr = np.ascontiguousarray(steps[k] if k != "episode_id" else np.diff(steps[k]) != 0)
        h.update(k.encode())
        h.update(arr.tobytes())
    h.update(json.dumps(dataclasses.asdict(cfg), sort_keys=True, default=str).encode())
    h.update(str(int(eval_episodes)).encode())
    return h.hexdigest()[:24]


def _claim_or_wait(cache: Path, key: str, timeout_s: float = 6 * 3600.0, poll_s: float = 2.0):
    """Claim the right to train entry ``key`` (returns the lock file), or wait while another
    campaign trains it and return None once its entry exists. A lock whose owner died (the
    entry never appears and the lock is older than ``timeout_s``) is taken over."""
    cache.mkdir(parents=True, exist_ok=True)
    lock = cache / f".{key}.lock"
    t0 = time.monotonic()
    while True:
        if (cache / key / "card.json").is_file():
            return None
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            return lock
        except FileExistsError:
            try:
                stale = time.time() - lock.stat().st_mtime > timeout_s
            except FileNotFoundError:
                continue
            if stale or time.monotonic() - t0 > timeout_s:
                lock.unlink(missing_ok=True)
                continue
            time.sleep(poll_s)


def _to_cache(out: Path, dest: Path) -> None:
    import shutil

    if dest.is_dir():
        return
    tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    for f in _CACHED_FILES:
        if (out / f).is_file():
            shutil.copy2(out / f, tmp / f)
    try:
        os.replace(tmp, dest)
    except OSError:  # another campaign stored it first
        shutil.rmtree(tmp, ignore_errors=True)


def _from_cache(hit: Path, out: Path, run_dir: Path, store) -> dict:
    import shutil

    out.mkdir(parents=True, exist_ok=True)
    for f in _CACHED_FILES:
        if (hit / f).is_file() and f != "card.json":
            shutil.copy2(hit / f, out / f)
    card = json.loads((hit / "card.json").read_text())
    card.setdefault("dataset", {}).update(run_dir=str(run_dir), run_id=store.run_id)
    card["from_cache"] = str(hit)
    from orchestrator.store import atomic_write_bytes

    atomic_write_bytes(out / "card.json", json.dumps(card, indent=2).encode())
    return card


def write_challenger_card(out: Path, cfg, state: dict, scenario, *, aut_uri: str | None, eval_episodes: int,
                          dataset: dict, wall: float = 0.0) -> dict:
    """Export TorchScript, evaluate the challenger (and the AUT from the same starts), write
    ``card.json`` whole."""
    import dataclasses
    import hashlib

    import d3rlpy

    from orchestrator.evaluation import evaluate_policy
    from orchestrator.store import atomic_write_bytes

    algo = d3rlpy.load_learnable(str(out / "model.d3"), device="cpu:0")
    files = ["model.d3"]
    import warnings

    try:
        with warnings.catch_warnings():  # torch.jit.trace's deprecation and tracer notes
            warnings.simplefilter("ignore")
            algo.save_policy(str(out / "policy.pt"))
        files.append("policy.pt")
        torchscript = "policy.pt"
    except Exception as exc:  # noqa: BLE001 - d3rlpy cannot trace every algorithm's action selection
        torchscript = f"not exported: {type(exc).__name__}: {str(exc)[:200]}"
    ev = evaluate_policy(scenario, str(out / "model.d3"), eval_episodes, seed=EVAL_SEED, device="cpu")
    aut = None
    if aut_uri:
        aut_ev = evaluate_policy(scenario, aut_uri, eval_episodes, seed=EVAL_SEED, device="cpu")
        aut = {"policy": aut_uri, "evaluation": aut_ev, "training_wall_seconds": _aut_training_seconds(aut_uri)}
    card = {
        "challenger": f"{scenario.name}-{cfg.algo}",
        "scenario": scenario.name,
        "algorithm": type(algo).__name__ + f" (d3rlpy {d3rlpy.__version__})",
        "config": dataclasses.asdict(cfg),
        "dataset": dataset,
        "steps": state["step"],
        "seed": cfg.seed,
        "training_wall_seconds": state["wall_seconds"],
        "wall_seconds_incl_eval": wall,
        "evaluation": ev,
        "aut": aut,
        "torchscript": torchscript,
        "files": {f: hashlib.sha256((out / f).read_bytes()).hexdigest() for f in files},
    }
    if aut:
        a, c = aut["evaluation"]["mean_return"], ev["mean_return"]
        card["return_vs_aut"] = {"difference": c - a, "ratio": c / a if a > 0 else None}
    atomic_write_bytes(out / "card.json", json.dumps(card, indent=2, default=float).encode())
    return card


def run_challenger_phase(campaign, *, resume: bool = False, progress: bool = True) -> list[dict]:
    """The campaign's ``challenger`` phase: one challenger per listed algorithm on the run's D.
    Finished challengers (a ``card.json``) are kept on resume; interrupted ones continue."""
    from workers.training import latest_checkpoint

    spec = campaign.challenger
    cards = []
    for algo in spec.algos:
        out = challenger_dir(campaign.output, algo)
        if resume and (out / "card.json").is_file():
            cards.append(json.loads((out / "card.json").read_text()))
            continue
        cards.append(train_run_challenger(
            campaign.output, algo, preset=spec.preset, steps=spec.steps, seed=campaign.seed,
            resume=resume and latest_checkpoint(out) is not None, eval_episodes=spec.eval_episodes,
            mlflow=campaign.mlflow, progress=progress))
    return cards
