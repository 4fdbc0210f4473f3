"""Shared fixtures: one local Ray cluster for the whole test session."""

from __future__ import annotations

import os

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

    from orchestrator.cluster.driver import start_ray

    resources = start_ray(num_cpus=2, dashboard=False, object_store_bytes=512 * 1024 * 1024)
    yield resources
    ray.shutdown()
