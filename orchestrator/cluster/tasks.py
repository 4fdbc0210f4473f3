"""Functions as Ray tasks: the grid runs each campaign as one, spread over the cluster by its
resource request. Results come back as they finish; one failing task does not stop the others.

    for i, result, error in run_tasks(fn, [args0, args1, ...], num_cpus=1):
        ...
"""

from __future__ import annotations

from typing import Callable, Iterator

from orchestrator.cluster.lifecycle import start_ray


def run_tasks(fn: Callable, calls: list[tuple], *, num_cpus: float = 1, num_gpus: float = 0,
              retries: int = 3) -> Iterator[tuple[int, object, BaseException | None]]:
    """Yield ``(index, result, None)`` or ``(index, None, error)`` for ``fn(*calls[index])`` as
    each Ray task ends (a local cluster is started unless one is running). A task whose worker
    process or node dies (a node lost mid-grid, a worker killed for memory) runs again, up to
    ``retries`` times, on whatever node has room (``fn`` must resume what its first attempt left:
    the grid's campaigns do); an exception ``fn`` raises is its result, never retried."""
    import ray

    if not calls:
        return
    start_ray()
    task = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, max_retries=retries, retry_exceptions=False)(fn)
    refs = {task.remote(*args): i for i, args in enumerate(calls)}
    while refs:
        ready, _ = ray.wait(list(refs), num_returns=1)
        i = refs.pop(ready[0])
        try:
            yield i, ray.get(ready[0]), None
        except Exception as exc:  # noqa: BLE001 - the caller records it; the other tasks go on
            yield i, None, exc
