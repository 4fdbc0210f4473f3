"""A campaign's progress where the Ray dashboard shows it: a named progress actor and custom
metrics (docs/watching.md). Both are aids: a failure here is logged and never stops a campaign.

* The Actors page lists ``deltarl/<campaign>/progress`` with the campaign and its current phase
  in its repr (``deltarl campaign quickstart: challenger phase``). Ray reads an actor's repr once,
  when the actor is made, so a :class:`~orchestrator.cluster.session.DriverSession` makes the
  actor again (same name, the state so far handed over) when the campaign enters another phase;
  the one of the phase before is listed DEAD with its own repr.
* Every update is an actor task named after the progress (``safety: 384/600 episodes, 12
  failures``), listed on the actor's page and the job's task list.
* The metrics (``ray_deltarl_episodes_total``, ``ray_deltarl_failures``, ``ray_deltarl_bugs``)
  are recorded by the progress actor, which records every gauge again every few seconds: Ray
  2.60 exports a gauge only while it is recorded (it left the export 10-20 s after its last
  value), and the actor lives as long as the campaign (its session), so the safety phase's
  failures stay exported through the challenger and optimality phases.
* Every update is also a Ray event (``deltarl quickstart: safety phase: 384/600 episodes, 12
  failures``): the Overview page, the dashboard's first, lists the cluster's events newest first,
  so it names the campaign, its current phase and its latest progress when it is opened.
* Any process of the cluster (a Ray Train worker training a challenger) reports with
  :func:`report_progress`.
"""

from __future__ import annotations

import logging
import sys
import threading
import time

from orchestrator.cluster import ray_compat
from orchestrator.cluster.session import DriverSession

log = logging.getLogger(__name__)

FIGURES = ("progress", "failures", "bugs")  # what a phase's state holds (the latest value of each)
REFRESH_S = 5.0  # the progress actor records its gauges again this often (Ray exports a gauge while it is recorded)


def progress_name(campaign: str) -> str:
    """The progress actor's name: ``deltarl/<campaign>/progress``."""
    return f"deltarl/{campaign}/progress"


class CampaignProgress:
    """A campaign's progress as a named actor (``deltarl/<campaign>/progress``, no CPU):
    ``report(phase, ...)`` keeps each phase's latest figures and records the metrics,
    ``state()`` returns them, ``repr`` names the campaign and the phase it was made for."""

    def __init__(self, campaign: str, phase: str | None = None, phases: dict | None = None,
                 refresh_s: float = REFRESH_S):
        self.campaign = campaign
        self.phase = phase
        self.phases: dict = {k: dict(v) for k, v in (phases or {}).items()}
        self._lock = threading.Lock()
        self._metrics = None
        self._refresh_s = float(refresh_s)
        self._refresher = None
        self._events = None  # Ray's event logger, once the first update came (False: none can be written)
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized() and any(
                v.get("failures") is not None or v.get("bugs") is not None for v in self.phases.values()):
            self._keep_exported()  # as an actor: the phases before this one's keep their gauges exported

    def report(self, phase: str, progress: str | None = None, failures: int | None = None, bugs: int | None = None,
               episodes: int = 0) -> bool:
        """The phase's latest figures (a figure given as None keeps its last value) and the metrics."""
        with self._lock:
            self.phase = phase
            now = self.phases.setdefault(phase, dict.fromkeys(FIGURES))
            for key, value in (("progress", progress), ("failures", failures), ("bugs", bugs)):
                if value is not None:
                    now[key] = value
        if self._events is not False:
            self._event(phase)
        metrics = self._instruments()
        if metrics is not None:
            tags = {"campaign": self.campaign, "phase": phase}
            if episodes:
                metrics["episodes"].inc(episodes, tags=tags)
            self._record_gauges(metrics, {phase: {"failures": failures, "bugs": bugs}})
            self._keep_exported()
        return True

    def state(self) -> dict:
        with self._lock:
            return {"campaign": self.campaign, "phase": self.phase, "phases": {k: dict(v) for k, v in self.phases.items()}}

    def event_message(self, phase: str) -> str:
        """The line the Overview page's Events list shows for the phase's latest figures:
        ``deltarl quickstart: safety phase: 384/600 episodes, 12 failures``."""
        with self._lock:
            now = dict(self.phases.get(phase) or {})
        return f"deltarl {self.campaign}: " + _task_name(f"{phase} phase", now.get("progress"), now)

    def _event(self, phase: str) -> None:
        """Write the phase's latest figures as a Ray event (as an actor only): the dashboard's
        Overview page lists the cluster's events newest first, so its first page names the
        campaign, its current phase and its latest progress (read when the page is opened)."""
        ray = sys.modules.get("ray")
        if ray is None or not ray.is_initialized():
            return
        try:
            if self._events is None:
                self._events = ray_compat.dashboard_event_logger() or False
            if self._events is False:
                return
            self._events.info(self.event_message(phase), campaign=self.campaign, phase=phase,
                              job_id=ray.get_runtime_context().get_job_id())
        except Exception as exc:  # noqa: BLE001 - an aid (a private Ray API): the metrics and task names remain
            log.debug("no dashboard event for %s: %s: %s", self.campaign, type(exc).__name__, exc)
            self._events = False

    def __repr__(self) -> str:
        return f"deltarl campaign {self.campaign}" + (f": {self.phase} phase" if self.phase else "")

    # -- the metrics, recorded in this actor's process -------------------------------------------
    def _instruments(self) -> dict | None:
        if self._metrics is None:
            try:
                from ray.util.metrics import Counter, Gauge

                keys = ("campaign", "phase")
                self._metrics = {
                    "episodes": Counter("deltarl_episodes", description="episodes run", tag_keys=keys),
                    "failures": Gauge("deltarl_failures", description="safety failures so far", tag_keys=keys),
                    "bugs": Gauge("deltarl_bugs", description="optimality bugs so far", tag_keys=keys)}
            except Exception as exc:  # noqa: BLE001 - metrics are an aid, never a reason to stop a campaign
                log.warning("Ray metrics of %s are off: %s: %s", self.campaign, type(exc).__name__, exc)
                self._metrics = {}
        return self._metrics or None

    def _record_gauges(self, metrics: dict, phases: dict) -> None:
        for phase, figures in phases.items():
            for key in ("failures", "bugs"):
                if figures.get(key) is not None:
                    metrics[key].set(figures[key], tags={"campaign": self.campaign, "phase": phase})

    def _keep_exported(self) -> None:
        """Record every phase's gauges again every ``refresh_s`` for as long as this actor lives."""
        if self._refresher is not None:
            return

        def refresh():
            while True:
                time.sleep(self._refresh_s)
                metrics = self._instruments()
                if metrics is None:
                    return
                with self._lock:
                    phases = {k: dict(v) for k, v in self.phases.items()}
                try:
                    self._record_gauges(metrics, phases)
                except Exception as exc:  # noqa: BLE001 - an aid: stop refreshing, keep the campaign
                    log.warning("the gauges of %s are no longer refreshed: %s: %s", self.campaign,
                                type(exc).__name__, exc)
                    return

        self._refresher = threading.Thread(target=refresh, name="deltarl-gauges", daemon=True)
        self._refresher.start()


def progress_actor(campaign: str, phase: str | None = None):
    """The campaign's :class:`CampaignProgress` actor, or None when it cannot be made. Inside a
    :class:`~orchestrator.cluster.session.DriverSession` it is held by the session (alive until
    the session ends, so that the dashboard shows the final state) and made again, with the state
    so far, when ``phase`` is another than the one it was made for (its repr names the phase);
    outside one the caller's handle is all that keeps it alive (Ray ends a named actor once no
    handle to it is left)."""
    import ray

    session = DriverSession.current()
    held = session.progress.get(campaign) if session is not None else None
    if held is not None and (phase is None or session.progress_phase.get(campaign) == phase):
        return held
    phases = None
    if held is not None:  # another phase: its successor takes the state over
        phases = _retire(held, progress_name(campaign))
    from orchestrator.cluster.pool import on_this_node

    cls = ray.remote(num_cpus=0, scheduling_strategy=on_this_node())(CampaignProgress)
    actor = cls.options(name=progress_name(campaign), get_if_exists=True).remote(campaign, phase, phases)
    if session is not None:
        session.progress[campaign] = actor
        session.progress_phase[campaign] = phase
    return actor


def _retire(actor, name: str, wait_s: float = 30.0) -> dict | None:
    """End a phase's progress actor and return its phases' state (None when it cannot be read),
    once its name is free for the next one."""
    import ray

    try:
        phases = ray.get(actor.state.remote(), timeout=wait_s)["phases"]
    except Exception as exc:  # noqa: BLE001 - an aid: the next actor starts without the state so far
        log.debug("could not read the progress of %s: %s: %s", name, type(exc).__name__, exc)
        phases = None
    ray.kill(actor)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name)
        except ValueError:
            break
        time.sleep(0.1)
    return phases


def report_progress(campaign: str, phase: str, progress: str, **figures) -> bool:
    """Report ``progress`` (e.g. ``"bcq: 3000/10000 steps"``) to the campaign's progress actor
    from any process of its cluster (the driver, a Ray Train worker): one named task on the actor,
    as the phases' own updates. False (and nothing else) without Ray or without the actor.
    ``figures``: ``failures``, ``bugs``, ``episodes``."""
    if "ray" not in sys.modules:
        return False
    import ray

    if not ray.is_initialized():
        return False
    try:
        actor = ray.get_actor(progress_name(campaign))
        actor.report.options(name=_task_name(phase, progress, figures)).remote(phase, progress=progress, **figures)
    except ValueError:  # no such actor: nobody shows this campaign's progress
        return False
    except Exception as exc:  # noqa: BLE001 - an aid, never a reason to stop a campaign
        log.debug("could not report the progress of %s: %s: %s", campaign, type(exc).__name__, exc)
        return False
    return True


def _task_name(phase: str, progress: str | None, figures: dict) -> str:
    found = "".join(f", {figures[k]} {k}" for k in ("failures", "bugs") if figures.get(k) is not None)
    return f"{phase}: {progress or 'metrics'}{found}"[:200]


def release_progress(campaign: str) -> bool:
    """End the campaign's progress actor, if it is still up. A grid's worker runs one campaign
    after another and would otherwise keep one idle actor process per finished campaign
    (measured in a 45-campaign grid: ~140 MB each, 2.2 GB after 16 campaigns); the campaign's
    final state is in its run folder and the grid's results table. True when one was ended."""
    if "ray" not in sys.modules:
        return False
    import ray

    session = DriverSession.current()
    actor = session.progress.pop(campaign, None) if session is not None else None
    if session is not None:
        session.progress_phase.pop(campaign, None)
    if not ray.is_initialized():
        return False
    try:
        ray.kill(actor if actor is not None else ray.get_actor(progress_name(campaign)))
    except ValueError:  # no such actor (never made, or already ended with its last handle)
        return False
    except Exception as exc:  # noqa: BLE001 - an aid, never a reason to fail a campaign
        log.debug("could not end the progress actor of %s: %s: %s", campaign, type(exc).__name__, exc)
        return False
    return True


class CampaignMetrics:
    """A phase's progress where the Ray dashboard shows it, a no-op when Ray is not running
    (in-process campaigns): each :meth:`update` goes to the campaign's :class:`CampaignProgress`
    actor (:func:`progress_actor`, made for this phase), which names a task after it and records
    the custom metrics (``ray.util.metrics``), tagged with the campaign and the phase, exported in
    Prometheus format as ``ray_deltarl_episodes_total`` (counter), ``ray_deltarl_failures`` and
    ``ray_deltarl_bugs`` (gauges) — Ray prefixes ``ray_`` and a counter gets ``_total``; the
    dashboard's Metrics page draws them once Prometheus and Grafana run (docs/deployment.md).

    The challenger phase makes one too (``CampaignMetrics(name, "challenger")`` in the driver:
    the Actors page then says "challenger phase"), and its training reports from wherever it runs
    with :func:`report_progress`."""

    def __init__(self, campaign: str, phase: str):
        self.tags = {"campaign": campaign, "phase": phase}
        self.on = False
        self.progress = None
        if "ray" not in sys.modules:  # in-process campaigns never import Ray for this
            return
        try:
            import ray

            if ray.is_initialized():
                self.progress = progress_actor(campaign, phase)
                self.on = self.progress is not None
        except Exception as exc:  # noqa: BLE001 - metrics are an aid, never a reason to stop a campaign
            log.warning("Ray progress of %s/%s is off: %s: %s", campaign, phase, type(exc).__name__, exc)
            self.on = False

    def update(self, episodes: int = 0, failures: int | None = None, bugs: int | None = None,
               progress: str | None = None) -> None:
        """``progress``: e.g. ``"384/600 episodes"`` (the task name the dashboard shows)."""
        if not self.on:
            return
        figures = {"failures": failures, "bugs": bugs}
        try:
            self.progress.report.options(name=_task_name(self.tags["phase"], progress, figures)).remote(
                self.tags["phase"], progress=progress, failures=failures, bugs=bugs, episodes=int(episodes or 0))
        except Exception as exc:  # noqa: BLE001 - an aid, never a reason to stop a campaign
            log.warning("the progress actor of %s stopped taking updates: %s: %s", self.tags["campaign"],
                        type(exc).__name__, exc)
            self.on = False
