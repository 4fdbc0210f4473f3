"""Shared fixtures: one local Ray cluster for the whole test session."""

from __future__ import annotations

import contextlib
import os
import sys

import pytest

# keep Ray's token auth out of the loopback-only test cluster, and keep tests single-threaded
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("DELTARL_DASHBOARD", "0")  # `deltarl run` starts the dashboard by default; not in tests
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture
def one_torch_thread():
    """Torch on one thread for the test, the count put back after: tests whose references were made
    with one thread (chaotic dynamics amplify float differences between thread counts) or whose
    tiny networks only wait on threads of a busy machine. Use: ``pytestmark =
    pytest.mark.usefixtures("one_torch_thread")``."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def ray_cluster():
    """A real local Ray cluster (``ray.init(address="local")``), started once per session."""
    import ray

    from orchestrator.cluster.lifecycle import start_ray

    resources = start_ray(num_cpus=2, dashboard=False, object_store_bytes=512 * 1024 * 1024)
    yield resources
    ray.shutdown()


# -- the test tiers ------------------------------------------------------------------------------
# The unit tier (`make test-fast`, `pytest -m "not integration"`) starts no Ray, trains no network,
# runs no campaign and spawns no process. A test that does one of these carries the matching marker
# (pyproject.toml); each of them makes the test `integration`. The guard below enforces it: an
# unmarked test that does one of the four fails with the marker to add (tests/test_tiers.py shows it
# can fail).
TIER_MARKERS = {
    "ray": "starts or joins a Ray cluster",
    "training": "trains a network (d3rlpy, SB3)",
    "campaign": "runs a campaign phase (safety, optimality, repair)",
    "subprocess": "runs another process (the CLI, a server, a browser)",
    "slow": "long-running",
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if "ray_cluster" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("ray"):
            item.add_marker(pytest.mark.ray)
        if any(item.get_closest_marker(m) for m in TIER_MARKERS):
            item.add_marker(pytest.mark.integration)


class TierError(AssertionError):
    """An unmarked test did what only the integration tier may do."""


def _refuse(marker: str, what: str):
    def refuse(*args, **kwargs):
        m, w = marker, what
        if marker == "subprocess" and _called_from_ray():
            m, w = "ray", "starts Ray"
        raise TierError(f"this test {w} but is not marked: add @pytest.mark.{m} "
                        f"(it then runs in the integration tier, not in `make test-fast`)")
    return refuse


def _called_from_ray() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if f"{os.sep}ray{os.sep}" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def _tier_guard(item):
    """Fail an unmarked test that starts Ray, trains, runs a campaign phase or spawns a process,
    in its fixtures' setup as in its body."""
    if item.get_closest_marker("integration") or item.get_closest_marker("tier_guard_off"):
        yield
        return
    import subprocess

    import mujoco  # noqa: F401 - its glfw import runs a version-check process once: not the test's doing
    from d3rlpy.algos.qlearning.base import QLearningAlgoBase

    from orchestrator.campaign.generations import Phase

    patches = [(subprocess.Popen, "__init__", _refuse("subprocess", "spawns a process")),
               (QLearningAlgoBase, "update", _refuse("training", "trains a d3rlpy network")),
               (Phase, "__init__", _refuse("campaign", "runs a campaign phase"))]
    saved = [(owner, name, owner.__dict__[name]) for owner, name, _ in patches]
    ray = sys.modules.get("ray")
    before = bool(ray and ray.is_initialized())
    for owner, name, fn in patches:
        setattr(owner, name, fn)
    try:
        yield
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized() and not before:
        ray.shutdown()
        raise TierError("this test started Ray but is not marked: add @pytest.mark.ray "
                        "(or take the ray_cluster fixture)")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with _tier_guard(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _tier_guard(item):
        return (yield)
