"""What a process holds while it drives campaigns on Ray, owned by the code that runs them.

``deltarl run`` opens a :class:`DriverSession` around its campaign::

    with DriverSession(dashboard=True):
        run_campaign(campaign)        # a cluster started in here comes with the dashboard
        keep_dashboard(seconds)       # the campaign's progress actor is still up

The session says whether a local cluster started inside it gets the dashboard
(:func:`~orchestrator.cluster.lifecycle.start_ray`), and it holds the campaigns' progress actors
(:mod:`orchestrator.cluster.progress`) until it ends, so that the dashboard shows a campaign's
final state. Outside a session a started cluster has no dashboard unless asked, and a phase's
progress actor lives as long as that phase's metrics. The session is found through a context
variable that only its ``with`` block sets (and puts back): no module holds it.
"""

from __future__ import annotations

import contextvars

# the innermost open session of this context (a DriverSession or None), set and put back by `with`
_CURRENT: contextvars.ContextVar = contextvars.ContextVar("deltarl_driver_session", default=None)


class DriverSession:
    """``dashboard``: a local cluster started inside the session comes with the Ray dashboard
    (and says where it is). ``name``: the campaign the session drives, the name of the Ray job
    its cluster connection makes (``deltarl <name>`` on the dashboard's Jobs page). ``progress``:
    campaign name -> its progress actor, held until the session ends."""

    def __init__(self, dashboard: bool = False, name: str | None = None):
        self.dashboard = bool(dashboard)
        self.name = name  # the campaign it drives: the Ray job's name on the dashboard's Jobs page
        self.progress: dict = {}
        self.progress_phase: dict = {}  # campaign name -> the phase its progress actor was made for
        self._tokens: list = []

    def __enter__(self) -> DriverSession:
        self._tokens.append(_CURRENT.set(self))
        return self

    def __exit__(self, *exc) -> None:
        _CURRENT.reset(self._tokens.pop())
        if not self._tokens:
            self.progress.clear()  # the handles go: Ray ends the actors they kept alive
            self.progress_phase.clear()

    @staticmethod
    def current() -> DriverSession | None:
        """The innermost session open in this context, or None."""
        return _CURRENT.get()
