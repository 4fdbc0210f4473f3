"""AUT and challenger training: the same training loops as :mod:`workers.training` and
:mod:`workers.challenger`, as Ray Train jobs when Ray pays, reporting every epoch to MLflow.

    train_aut_job(cfg, "runs/aut-cartpole")
    train_challenger_job(cfg, "runs/cartpole-curefuzz", "runs/cartpole-curefuzz/challengers/bcq")

Where a job runs (:func:`training_placement`): as a Ray Train job (``TorchTrainer``: in-process,
``num_workers=0``, on a CPU cluster; one GPU worker when the cluster has GPUs) when a Ray cluster
is there to use — Ray already initialised in this process (a Ray Job, a grid task, a campaign
with rollout actors), ``RAY_ADDRESS``, or a running local head (``deltarl ray up``,
``ray start --head``) — or when a GPU worker is asked for; otherwise the same loop runs in this
process without Ray (on CUDA when torch sees a GPU), which saves starting a cluster for nothing.

With :mod:`orchestrator.cluster`, the only module that imports Ray.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import asdict
from pathlib import Path

import numpy as np

from envs import get_scenario
from orchestrator.campaign.cards import aut_card
from orchestrator.campaign.config import set_values
from orchestrator.cluster.progress import report_progress
from orchestrator.runs import tracking
from orchestrator.runs import tracking as tracking_mod
from orchestrator.runs.layout import CARD
from orchestrator.runs.store import RunStore
from workers.challenger import ChallengerConfig, train_challenger
from workers.training import AutTrainConfig, quiet_d3rlpy, train_aut


def _mlflow_reporter(tracking):
    """A report callback that logs epoch metrics to an existing MLflow run (or nothing):
    ``tracking`` = ``{"tracking_uri", "run_id"}`` (logged from here) or an
    :class:`~orchestrator.runs.tracking.AsyncRun` (queued to its writer; in-process jobs only)."""
    if not tracking:
        return lambda metrics, ckpt: None
    if isinstance(tracking, tracking_mod.AsyncRun):
        return lambda metrics, ckpt: tracking.log_metrics(metrics, step=int(metrics["step"]))
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=tracking["tracking_uri"])
    run_id = tracking["run_id"]

    def report(metrics: dict, ckpt: Path) -> None:
        step = int(metrics["step"])
        ts = int(time.time() * 1000)
        batch = [mlflow.entities.Metric(k, float(v), ts, step) for k, v in metrics.items()
                 if isinstance(v, (int, float)) and np.isfinite(v)]
        client.log_batch(run_id, metrics=batch)

    return report


def _reporter(config: dict):
    """Each epoch's report: to MLflow, to the campaign's progress actor on the dashboard (a
    challenger of a campaign: ``config["campaign"]``), and to Ray Train when the loop runs as a Ray
    Train job."""
    to_mlflow = _mlflow_reporter(config.get("tracking"))
    campaign, label, steps = config.get("campaign"), config.get("label", "training"), config.get("steps")

    def to_dashboard(metrics: dict) -> None:
        if campaign:  # nothing without Ray or without the campaign's progress actor
            report_progress(campaign, "challenger", f"{label}: {metrics.get('step')}/{steps} steps")

    if not config.get("ray", True):
        def local(metrics: dict, ckpt: Path) -> None:
            to_mlflow(metrics, ckpt)
            to_dashboard(metrics)

        return local
    import ray.train

    def report(metrics: dict, ckpt: Path) -> None:
        to_mlflow(metrics, ckpt)
        to_dashboard(metrics)
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(str(ckpt)))

    return report


def _train_loop_per_worker(config: dict) -> None:
    """The Ray Train function (also run in this process without Ray): the same loop, reporting
    to Ray Train and MLflow."""
    cfg = AutTrainConfig(**config["cfg"])
    if cfg.device is None:
        cfg.device = "cuda:0" if config.get("use_gpu") else "cpu:0"
    train_aut(cfg, config["out_dir"], resume=config["resume"], report=_reporter(config),
              progress=config.get("progress", False))


def train_aut_job(
    cfg: AutTrainConfig,
    out_dir: str | os.PathLike,
    *,
    resume: bool = False,
    use_gpu: bool | None = None,
    tracking: dict | None = None,
    progress: bool = False,
) -> dict:
    """Run :func:`train_aut` as a Ray Train job: in-process (``num_workers=0``) on a CPU
    machine, on one GPU worker when the cluster has GPUs. One code path; returns the final
    training state read back from ``out_dir``.

    ``tracking`` = ``{"tracking_uri": ..., "run_id": ...}`` logs every epoch to that MLflow run.
    """
    cfg.validate()
    out = Path(out_dir).resolve()
    where = run_training(_train_loop_per_worker, {"cfg": asdict(cfg), "out_dir": str(out), "resume": resume,
                                                  "tracking": tracking, "progress": progress},
                         out, name=f"aut-{cfg.scenario}-{cfg.algo}", use_gpu=use_gpu)
    return {**json.loads((out / "training.json").read_text()), "placement": where}


def training_placement(use_gpu: bool | None = None) -> tuple[bool, str]:
    """``(as a Ray Train job?, why)``: see the module docstring."""
    import sys

    if use_gpu:
        return True, "Ray Train: a GPU worker was asked for"
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        return True, "Ray Train: Ray is running in this process"
    from orchestrator.cluster.lifecycle import running_cluster

    found = running_cluster()
    if found:
        return True, f"Ray Train: joined the running cluster ({found['source']}, {found['address']})"
    return False, "in this process: no Ray cluster running, none started for one training"


def run_training(loop_fn, loop_config: dict, out_dir: Path, *, name: str, use_gpu: bool | None = None) -> str:
    """``loop_fn(loop_config)`` where :func:`training_placement` says: as a Ray Train job
    (:func:`run_train_job`) or in this process. Returns where it ran."""
    on_ray, why = training_placement(use_gpu)
    if on_ray:
        from orchestrator.cluster.lifecycle import start_ray

        start_ray()
        run_train_job(loop_fn, loop_config, out_dir, name=name, use_gpu=use_gpu)
        return why
    import torch

    Path(out_dir).mkdir(parents=True, exist_ok=True)
    gpu = bool(torch.cuda.is_available()) if use_gpu is None else False
    loop_fn({**loop_config, "use_gpu": gpu, "ray": False})
    return why + (" (on CUDA)" if gpu else "")


def run_train_job(loop_fn, loop_config: dict, out_dir: Path, *, name: str, use_gpu: bool | None = None) -> None:
    """Run ``loop_fn(loop_config)`` as a Ray Train job: in-process (``num_workers=0``) on a CPU
    machine, one GPU worker when the cluster has GPUs (``loop_config["use_gpu"]`` tells it which).
    AUT and challenger training share this path."""

    import ray
    import ray.train
    from ray.train.torch import TorchTrainer

    if use_gpu is None:
        use_gpu = ray.is_initialized() and ray.cluster_resources().get("GPU", 0) > 0
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    config = {**loop_config, "use_gpu": bool(use_gpu)}
    if isinstance(config.get("tracking"), tracking_mod.AsyncRun):  # the job logs to the run itself
        config["tracking"] = config["tracking"].info()
    trainer = TorchTrainer(
        loop_fn,
        train_loop_config=config,
        scaling_config=ray.train.ScalingConfig(num_workers=1 if use_gpu else 0, use_gpu=bool(use_gpu)),
        # a fresh name per call: Ray Train auto-resumes a reused (storage_path, name); our own
        # checkpoints under out_dir/checkpoints carry the resume state instead
        run_config=ray.train.RunConfig(name=f"{name}-{uuid.uuid4().hex[:8]}", storage_path=str(out / "ray_train")),
    )
    trainer.fit()


def _challenger_loop_per_worker(config: dict) -> None:
    """The Ray Train function (also run in this process without Ray): read D from the run's
    store, train, report."""
    quiet_d3rlpy()
    cfg = ChallengerConfig(**config["cfg"])
    if cfg.device is None:
        cfg.device = "cuda:0" if config.get("use_gpu") else "cpu:0"
    dataset = RunStore.open(config["run_dir"]).to_mdp_dataset(phase=list(config["phases"]), role="aut")
    train_challenger(cfg, dataset, config["out_dir"], resume=config["resume"], report=_reporter(config),
                     progress=config.get("progress", False))


def train_challenger_job(
    cfg: ChallengerConfig,
    run_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    phases=("sampling", "fuzzing"),
    resume: bool = False,
    use_gpu: bool | None = None,
    tracking: dict | None = None,
    progress: bool = False,
    campaign: str | None = None,
) -> dict:
    """:func:`train_challenger` on the AUT steps of ``phases`` of the run in ``run_dir``, placed
    like AUT training (:func:`training_placement`); ``campaign``: whose progress actor shows the
    training's epochs on the dashboard."""
    cfg.validate()
    out = Path(out_dir).resolve()
    where = run_training(_challenger_loop_per_worker,
                         {"cfg": asdict(cfg), "run_dir": str(Path(run_dir).resolve()), "phases": list(phases),
                          "out_dir": str(out), "resume": resume, "tracking": tracking, "progress": progress,
                          "campaign": campaign, "label": cfg.algo, "steps": cfg.steps},
                         out, name=f"challenger-{cfg.scenario}-{cfg.algo}", use_gpu=use_gpu)
    return {**json.loads((out / "training.json").read_text()), "placement": where}


def train_aut_run(cfg: AutTrainConfig, out: Path, *, resume: bool = False, eval_episodes: int = 100,
                  progress: bool = True) -> tuple[dict, dict, str]:
    """``deltarl train-aut``: the training job logged to MLflow (experiment ``aut-training``), then the
    AUT's card. Returns (final training state, card, MLflow tracking URI)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    run = tracking.start_run(out, "aut-training", f"{cfg.scenario}-{cfg.algo}-s{cfg.seed}",
                             params=set_values({"config": asdict(cfg), "resume": resume}),
                             tags={"deltarl.kind": "aut-training", "scenario": cfg.scenario})
    t0 = time.perf_counter()
    try:
        state = train_aut_job(cfg, out, resume=resume, tracking=run, progress=progress)
    except BaseException:
        tracking.end_run(run, "FAILED")
        raise
    card = aut_card(out, cfg, state, get_scenario(cfg.scenario), eval_episodes=eval_episodes,
                    wall=time.perf_counter() - t0)
    tracking.log_metrics(run, {"final_mean_return": card["evaluation"]["mean_return"],
                               "final_success_rate": card["evaluation"]["success_rate"]}, step=state["step"])
    tracking.log_artifact(run, out / CARD)
    tracking.end_run(run)
    return state, card, run["tracking_uri"]
