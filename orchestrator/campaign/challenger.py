"""The challenger phase: train BC/BCQ/CQL on a safety run's record D and card the result.

    card = train_run_challenger("runs/cartpole-curefuzz", "bcq")   # -> runs/…/challengers/bcq/

D is every AUT step of the run's safety phases (``sampling`` and ``fuzzing``, paper Sec. 5).
Training takes the path of AUT training (``workers.challenger``: a Ray Train job when a Ray
cluster is there to use, else in this process; ``train_jobs.training_placement``), logged to the
run's MLflow (experiment ``challenger-training``); the card says where it ran (``placement``).
The challenger folder then holds ``model.d3`` (d3rlpy; ``deltarl evaluate --policy …/model.d3`` loads it), ``policy.pt``
(TorchScript, where d3rlpy can trace the algorithm's action selection), ``training.json``
(per-epoch metrics) and ``card.json``: Table 1's columns for the challenger and for the AUT
evaluated from the same 100 starts, and the training times of both (Fig. 4).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import socket
import sys
import threading
import time
from pathlib import Path

import numpy as np

from envs import get_scenario
from orchestrator.campaign.cards import challenger_card
from orchestrator.campaign.config import set_values
from orchestrator.campaign.train_jobs import train_challenger_job
from orchestrator.cluster.lifecycle import ray_node_alive, ray_node_id
from orchestrator.cluster.progress import CampaignMetrics
from orchestrator.runs import tracking
from orchestrator.runs.cards import read_card, write_card
from orchestrator.runs.layout import CARD, MODEL_FILES, SAFETY_PHASES, RunFolder
from orchestrator.runs.progress_lines import LineProgress, is_terminal
from orchestrator.runs.store import RunStore, StoreError
from workers.challenger import challenger_config
from workers.training import TrainingError, latest_checkpoint


def challenger_dir(run_dir: str | Path, algo: str) -> Path:
    return RunFolder(run_dir).challenger_dir(algo)


def train_run_challenger(run_dir: str | Path, algo: str, **kwargs) -> dict:
    """Train the ``algo`` challenger on D of the run in ``run_dir`` (holding the run folder's
    lock: one writer per folder); returns its card. Keywords: :func:`_train_run_challenger`."""
    with RunFolder(run_dir).lock("deltarl train-challenger"):
        return _train_run_challenger(run_dir, algo, **kwargs)


def _train_run_challenger(
    run_dir: str | Path,
    algo: str,
    *,
    preset: str | None = None,
    steps: int | None = None,
    seed: int | None = None,
    torch_threads: int | None = None,
    out: str | Path | None = None,
    resume: bool = False,
    eval_episodes: int = 100,
    phases=SAFETY_PHASES,
    mlflow: bool = True,
    progress: bool = True,
) -> dict:
    """Train the ``algo`` challenger on D of the run in ``run_dir``; returns its card."""
    run_dir = Path(run_dir)
    store = RunStore.open(run_dir)
    run = RunFolder(run_dir)
    campaign = run.read_json(run.campaign_json) or {}
    scenario = get_scenario(store.meta["scenario"], **campaign.get("scenario_overrides", {}))
    eps = store.read_episodes(phase=list(phases), role="aut")
    if len(eps) == 0:
        raise StoreError(f"run {store.run_id!r} in {run_dir} has no AUT episodes in phases {list(phases)}: "
                         f"run the safety phase first (deltarl run CAMPAIGN.yaml)")
    cfg = challenger_config(scenario.name, algo, preset, steps=steps, torch_threads=torch_threads,
                            seed=seed if seed is not None else campaign.get("seed"))
    out = Path(out) if out else challenger_dir(run_dir, algo)
    if resume and latest_checkpoint(out) is None:
        raise TrainingError(f"--resume: {out} holds no challenger checkpoint to resume from")
    if not resume and latest_checkpoint(out) is not None:
        if read_card(out) is not None:
            raise TrainingError(f"{out} already holds a {algo} challenger, trained (card.json); add --resume to "
                                f"train it further (more --steps) or choose another --out")
        # an interrupted training (checkpoints, no card): the same command continues it
        print(f"deltarl: {out} holds an interrupted {algo} training (checkpoint {latest_checkpoint(out).name}, no "
              f"card.json yet): continuing it", file=sys.stderr)
        resume = True

    cache = challenger_cache_dir()
    key = lock = None
    if cache is not None and not resume:
        key = challenger_cache_key(store, phases, cfg, eval_episodes)
        hit = cache / key
        lock = _claim_or_wait(cache, key)  # None: another campaign trained it meanwhile
        if lock is None and (hit / CARD).is_file():
            return _from_cache(hit, out, run_dir, store)

    try:
        card = _train_and_card(run, store, scenario, campaign, cfg, out, phases, len(eps), resume=resume,
                               eval_episodes=eval_episodes, mlflow=mlflow, progress=progress)
        if key is not None:
            _to_cache(out, cache / key)
    finally:
        if lock is not None:
            lock.unlink(missing_ok=True)
    return card


def _train_and_card(run: RunFolder, store, scenario, campaign: dict, cfg, out: Path, phases, episodes: int, *,
                    resume: bool, eval_episodes: int, mlflow: bool, progress: bool) -> dict:
    """The training job (:func:`~orchestrator.campaign.train_jobs.training_placement`: a Ray Train
    job when a cluster is there to use, else in this process), then the card; both in the run's
    MLflow (experiment challenger-training), written by a separate process."""
    mlrun = None
    if mlflow:
        mlrun = tracking.AsyncRun(run.root, "challenger-training", f"{scenario.name}-{cfg.algo}-s{cfg.seed}",
                                  params=set_values({"config": dataclasses.asdict(cfg), "dataset": {
                                      "run_id": store.run_id, "phases": list(phases), "episodes": episodes}}),
                                  tags={"deltarl.kind": "challenger-training", "scenario": scenario.name,
                                        "algo": cfg.algo})
    t0 = time.perf_counter()
    lines = _CheckpointLines(out, cfg) if progress and not is_terminal(sys.stderr) else None
    try:
        try:  # in a log, lines from the checkpoints instead of the job's bar
            state = train_challenger_job(cfg, run.root, out, phases=phases, resume=resume, tracking=mlrun,
                                         progress=progress and lines is None, campaign=campaign.get("name"))
        finally:
            if lines is not None:
                lines.stop()
        card = challenger_card(out, cfg, state, scenario, aut_uri=campaign.get("aut"), eval_episodes=eval_episodes,
                               dataset={"run_dir": str(run.root), "run_id": store.run_id, "phases": list(phases),
                                        "episodes": state["episodes"], "transitions": state["transitions"]},
                               wall=time.perf_counter() - t0)
    except BaseException:
        if mlrun:
            mlrun.end("FAILED")
        raise
    if mlrun:
        ev = card["evaluation"]
        mlrun.log_metrics({"final_mean_return": ev["mean_return"], "final_success_rate": ev["success_rate"],
                           "training_wall_seconds": card["training_wall_seconds"]}, step=state["step"])
        mlrun.log_artifact(out / CARD)
        mlrun.end()  # waits until MLflow has everything (a failed MLflow only warns)
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



def challenger_cache_dir() -> Path | None:
    d = os.environ.get("DELTARL_CHALLENGER_CACHE")
    return Path(d) if d else None


def challenger_cache_key(store, phases, cfg, eval_episodes: int) -> str:
    steps = store.read_steps(phase=list(phases), role="aut")
    h = hashlib.sha256()
    for k in ("obs", "actions", "rewards", "terminals", "timeouts", "episode_id"):
        arr = np.ascontiguousarray(steps[k] if k != "episode_id" else np.diff(steps[k]) != 0)
        h.update(k.encode())
        h.update(arr.tobytes())
    config = dataclasses.asdict(cfg)
    if config.get("preset") and Path(config["preset"]).is_file():  # the preset's text, not where the checkout lives
        config["preset"] = hashlib.sha256(Path(config["preset"]).read_bytes()).hexdigest()
    h.update(json.dumps(config, sort_keys=True, default=str).encode())
    h.update(str(int(eval_episodes)).encode())
    return h.hexdigest()[:24]


def _claim_or_wait(cache: Path, key: str, timeout_s: float = 6 * 3600.0, poll_s: float = 2.0):
    """Claim the right to train entry ``key`` (returns the lock file), or wait while another
    campaign trains it and return None once its entry exists. A lock whose owner died is taken
    over: at once when the owner ran on this machine (its pid is gone: a grid killed at the end of
    a working day resumes without waiting) or on a Ray node the cluster has lost (a campaign of a
    grid rerun after its node died), else when the lock is older than ``timeout_s``."""
    cache.mkdir(parents=True, exist_ok=True)
    lock = cache / f".{key}.lock"
    t0 = time.monotonic()
    while True:
        if (cache / key / CARD).is_file():
            return None
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            node = ray_node_id()
            os.write(fd, (f"{socket.gethostname()}:{os.getpid()}" + (f"\nray-node:{node}" if node else "")).encode())
            os.close(fd)
            return lock
        except FileExistsError:
            try:
                stale = time.time() - lock.stat().st_mtime > timeout_s or _owner_died(lock)
            except FileNotFoundError:
                continue
            if stale or time.monotonic() - t0 > timeout_s:
                lock.unlink(missing_ok=True)
                continue
            time.sleep(poll_s)


def _owner_died(lock: Path) -> bool:
    """True when the lock's owner is known dead: it ran on this machine and its process no longer
    exists, or it ran on a Ray node that the cluster no longer counts alive. The lock holds
    ``host:pid`` and, in a Ray cluster, a line ``ray-node:<id>`` (``pid`` alone in locks written
    before 2026-12-05: this machine's). An owner on another machine whose node is alive (or not
    known) cannot be checked from here: False."""
    lines = lock.read_text().strip().splitlines() or [""]
    node = next((ln.split(":", 1)[1] for ln in lines[1:] if ln.startswith("ray-node:")), None)
    if node and node != ray_node_id() and ray_node_alive(node) is False:
        return True
    host, _, pid = lines[0].rpartition(":")
    if not pid.isdigit() or (host and host != socket.gethostname()):
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def _to_cache(out: Path, dest: Path) -> None:

    if dest.is_dir():
        return
    tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    for f in MODEL_FILES:
        if (out / f).is_file():
            shutil.copy2(out / f, tmp / f)
    try:
        os.replace(tmp, dest)
    except OSError:  # another campaign stored it first
        shutil.rmtree(tmp, ignore_errors=True)


class _CheckpointLines:
    """The challenger's progress when stderr is no terminal: a thread reads the newest checkpoint's
    step (and evaluation return) and writes :class:`LineProgress` lines, a few per training."""

    def __init__(self, out: Path, cfg, poll: float = 1.0):
        ck = latest_checkpoint(out)
        self.out, self.poll, self.done = out, poll, threading.Event()
        self.bar = LineProgress(cfg.steps, initial=_checkpoint_step(ck) if ck else 0, unit="steps",
                                desc=f"challenger {cfg.algo} on D ({cfg.scenario})")
        self.thread = threading.Thread(target=self._watch, name="challenger-progress", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        ck = latest_checkpoint(self.out)
        step = _checkpoint_step(ck) if ck is not None else None
        if step is not None and step > self.bar.n:
            hist = (_checkpoint_state(ck) or {}).get("history") or [{}]
            if "eval_return" in hist[-1]:
                self.bar.set_postfix(eval=f"{hist[-1]['eval_return']:.1f}")
            self.bar.update(step - self.bar.n)

    def _watch(self) -> None:
        while not self.done.wait(self.poll):
            self._read()

    def stop(self) -> None:
        self.done.set()
        self.thread.join()
        self._read()
        self.bar.close()


def _checkpoint_state(ck: Path) -> dict | None:
    try:
        return json.loads((ck / "state.json").read_text())
    except (OSError, ValueError):  # being written: the next poll reads it
        return None


def _checkpoint_step(ck: Path) -> int | None:
    st = _checkpoint_state(ck)
    return int(st["step"]) if st and "step" in st else None


def _from_cache(hit: Path, out: Path, run_dir: Path, store) -> dict:

    out.mkdir(parents=True, exist_ok=True)
    for f in MODEL_FILES:
        if (hit / f).is_file() and f != CARD:
            shutil.copy2(hit / f, out / f)
    card = read_card(hit)
    card.setdefault("dataset", {}).update(run_dir=str(run_dir), run_id=store.run_id)
    card["from_cache"] = str(hit)
    return write_card(out, card)


def run_challenger_phase(campaign, *, resume: bool = False, progress: bool = True) -> list[dict]:
    """The campaign's ``challenger`` phase: one challenger per listed algorithm on the run's D.
    Finished challengers (a ``card.json``) are kept on resume; interrupted ones continue."""

    spec = campaign.challenger
    cards = []
    for algo in spec.algos:
        out = challenger_dir(campaign.output, algo)
        if resume and read_card(out) is not None:
            cards.append(read_card(out))
            continue
        # the dashboard's Actors page names the phase (a no-op until Ray runs); the training's epochs
        # report to the same actor from wherever they run (train_jobs._reporter)
        CampaignMetrics(campaign.name, "challenger").update(progress=f"{algo}: training")
        cards.append(train_run_challenger(
            campaign.output, algo, preset=spec.preset, steps=spec.steps, seed=campaign.seed,
            torch_threads=spec.torch_threads, resume=resume and latest_checkpoint(out) is not None, eval_episodes=spec.eval_episodes,
            mlflow=campaign.mlflow, progress=progress))
    return cards
