"""Shared fixtures: one local Ray cluster for the whole test session, a non-editable install."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

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


@pytest.fixture
def installed_deltarl(tmp_path) -> Path:
    """A fresh venv (``tmp_path/fresh``) with deltarl installed from a wheel, not editable, as a
    user's ``pip install`` leaves it: its own ``bin/python`` and ``bin/deltarl`` import that copy
    and cannot import the checkout. The wheel is built from a copy of the package's files, so the
    checkout gets no build folder; third-party packages come from this environment (a plain path
    line, so its editable install's .pth files are not run)."""
    checkout = Path(__file__).resolve().parents[1]
    src, wheels, env_dir = tmp_path / "src", tmp_path / "wheels", tmp_path / "fresh"
    for part in ("envs", "workers", "orchestrator", "experiments"):
        shutil.copytree(checkout / part, src / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "results"))
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(checkout / f, src / f)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
                    str(src)], check=True, cwd=tmp_path, capture_output=True, timeout=600)
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # this environment's pip installs into the fresh one (its scripts, e.g. bin/deltarl, point at it)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q",
                    str(next(wheels.glob("deltarl-*.whl")))], check=True, capture_output=True, timeout=600)
    return env_dir


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
