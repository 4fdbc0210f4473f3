"""The Ray edge trusts nothing (issues #47 and #48): what deltarl finds in Ray's temporary folder
(``/tmp/ray``, writable by every user) and what it writes there.

1. a campaign joins a ``deltarl ray up`` head only when the head file is this user's, carries
   deltarl's marker and names the live head process (command line and start time), and a ``ray
   start --head`` file only when it is this user's; otherwise it starts its own cluster;
2. ``deltarl ray down`` signals the head file's PID only while it is that head: a stale file
   naming an unrelated process (a real ``sleep``) leaves it alive;
3. token files are written 0600;
4. ``deltarl ray up --dashboard`` (token auth) then ``deltarl run``: the campaign joins with the
   head's token, exits 0, and prints no line of Ray's own (``InvalidAuthToken``, the token WARNING).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from orchestrator.cli import main

REPO = Path(__file__).resolve().parents[1]
OTHER_UID = 4242  # a user that is not this one


@pytest.fixture
def ray_tmp(monkeypatch):
    """An empty Ray temporary folder of this test (``$RAY_TMPDIR``; short: Ray's socket paths)."""
    short = Path(tempfile.mkdtemp(prefix="dre", dir="/tmp"))
    monkeypatch.setenv("RAY_TMPDIR", str(short))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    (short / "ray").mkdir()
    yield short / "ray"
    shutil.rmtree(short, ignore_errors=True)


@pytest.fixture
def listening():
    """An address on 127.0.0.1 whose port answers, as a running head's does."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        yield f"127.0.0.1:{srv.getsockname()[1]}"


def another_users(path: Path, monkeypatch) -> None:
    """Make ``path`` belong to another user: chown it (root may), else let this process believe
    it is another user (what is compared is the file's owner against this process's user)."""
    if os.geteuid() == 0:
        os.chown(path, OTHER_UID, OTHER_UID)
    else:
        from orchestrator.cluster import lifecycle

        monkeypatch.setattr(lifecycle.os, "geteuid", lambda: OTHER_UID)


def test_a_head_file_is_joined_only_when_it_is_this_users_deltarl_head(ray_tmp, listening, monkeypatch):
    from orchestrator.cluster import lifecycle

    path = ray_tmp / lifecycle.HEAD_FILE
    good = lifecycle.head_record(listening, num_cpus=8, auth="disabled")  # this process stands in for the head
    path.write_text(json.dumps(good))
    found = lifecycle.running_cluster()
    assert found["source"] == "deltarl ray up" and found["address"] == listening and found["num_cpus"] == 8

    for name, head in (("no marker", {k: v for k, v in good.items() if k != "written_by"}),
                       ("another writer", {**good, "written_by": "someone"}),
                       ("a reused PID", {**good, "process": {**good["process"], "cmdline": ["python", "serve_head"]}}),
                       ("another start", {**good, "process": {**good["process"], "started": 1}}),
                       ("no identity", {k: v for k, v in good.items() if k != "process"}),
                       ("a dead PID", {**good, "pid": 2**22 + 17}),
                       ("not a mapping", ["x"])):
        path.write_text(json.dumps(head))
        assert lifecycle.running_cluster() is None, name
        assert lifecycle.trusted_head(path)[0] is None, name

    path.write_text(json.dumps(good))
    with monkeypatch.context() as m:
        another_users(path, m)
        assert lifecycle.running_cluster() is None  # a complete, live head file, but not this user's
        head, why = lifecycle.trusted_head(path)
        assert head is None and "belongs to another user" in why
    path.unlink()

    current = ray_tmp / "ray_current_cluster"  # `ray start --head`'s own file
    current.write_text(listening)
    assert lifecycle.running_cluster() == {"address": listening, "source": "ray start --head"}
    with monkeypatch.context() as m:
        another_users(current, m)
        assert lifecycle.running_cluster() is None


def test_a_head_of_another_user_is_not_joined_by_start_ray(ray_tmp, listening, monkeypatch):
    """start_ray starts its own cluster (``ray.init(address="local")``) instead of joining
    another user's head, even one that answers on its port."""
    import types

    from orchestrator.cluster import lifecycle

    path = ray_tmp / lifecycle.HEAD_FILE
    path.write_text(json.dumps(lifecycle.head_record(listening, num_cpus=8, auth="disabled")))
    another_users(path, monkeypatch)
    calls = []
    fake_ray = types.SimpleNamespace(is_initialized=lambda: False, cluster_resources=lambda: {"CPU": 1.0},
                                     init=lambda **kw: calls.append(kw))
    monkeypatch.setitem(sys.modules, "ray", fake_ray)
    monkeypatch.setattr(lifecycle, "supervise_local_cluster", lambda: None)
    monkeypatch.setattr(lifecycle.ray_compat, "reload_auth_mode", lambda: None)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    lifecycle.start_ray(num_cpus=1, dashboard=False)
    assert [c["address"] for c in calls] == ["local"]  # its own cluster, not the other user's head


def test_token_files_are_written_for_this_user_only(tmp_path, monkeypatch):
    from orchestrator.cluster import lifecycle

    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"):
        monkeypatch.delenv(var, raising=False)
    reloads = []
    monkeypatch.setattr(lifecycle.ray_compat, "reload_auth_mode", lambda: reloads.append(os.environ["RAY_AUTH_MODE"]))

    assert lifecycle.local_auth(dashboard=True) == "token" and os.environ["RAY_AUTH_MODE"] == "token"
    token = tmp_path / ".ray" / "auth_token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert len(token.read_text()) == 64 and int(token.read_text(), 16) >= 0  # 256 random bits, hex, as Ray's
    assert reloads == ["token"]  # Ray in this process reads the mode again

    first = token.read_text()
    token.chmod(0o644)  # written by Ray itself before (its umask), or by hand
    assert lifecycle.ensure_private_token() == token
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and token.read_text() == first  # narrowed, kept

    own = tmp_path / "tokens" / "cluster"
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(own))
    assert lifecycle.ensure_private_token() == own and stat.S_IMODE(own.stat().st_mode) == 0o600

    monkeypatch.setenv("RAY_AUTH_TOKEN", "abc")  # the token itself in the environment: no file
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "never"))
    assert lifecycle.ensure_private_token() is None and not (tmp_path / "never").exists()

    monkeypatch.delenv("RAY_AUTH_MODE")
    assert lifecycle.local_auth(dashboard=False) == "disabled"  # loopback only, no dashboard: no token


@pytest.mark.subprocess
def test_ray_down_leaves_an_unrelated_process_of_a_stale_head_file_alive(ray_tmp, monkeypatch, capsys):
    """The head file names a PID that now belongs to an unrelated process (a real ``sleep``):
    ``deltarl ray down`` signals nothing, says why, and removes the stale file (its own); a
    foreign file, or another user's naming the process as it is, is not touched either."""
    from orchestrator.cluster import lifecycle
    from orchestrator.cluster.head import head_down

    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        path = ray_tmp / lifecycle.HEAD_FILE
        head = lifecycle.head_record("127.0.0.1:1", num_cpus=2, auth="disabled")
        stale = {**head, "pid": sleeper.pid}  # the head that was: this process's identity, the sleep's PID
        path.write_text(json.dumps(stale))
        code = main(["ray", "down"])
        out = capsys.readouterr().out
        assert code == 0 and f"names PID {sleeper.pid}, which is no longer the head" in out and "signalled nothing" in out
        assert not path.exists()  # this user's stale deltarl file: removed

        path.write_text(json.dumps({"address": "127.0.0.1:1", "pid": sleeper.pid}))  # not deltarl's
        stopped, what = head_down()
        assert not stopped and "was not written by your `deltarl ray up`" in what and path.exists()

        # another user's head file naming the sleep exactly as it is (command line, start time)
        sleeping = {**head, "pid": sleeper.pid, "process": lifecycle.process_identity(sleeper.pid)}
        path.write_text(json.dumps(sleeping))
        with monkeypatch.context() as m:
            another_users(path, m)
            stopped, what = head_down()
        assert not stopped and "belongs to another user" in what and path.exists()

        with pytest.raises(subprocess.TimeoutExpired):
            sleeper.wait(timeout=1.0)  # never signalled: still sleeping
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.subprocess
@pytest.mark.ray
@pytest.mark.slow
def test_ray_up_with_the_dashboard_then_a_campaign_joins_with_its_token(tmp_path):
    """``deltarl ray up --dashboard`` (Ray's token auth) prints the dashboard's address and how to
    log in, writes the token 0600; ``deltarl run`` joins it with that token (it used to fail with
    ``InvalidAuthToken``, exit 1) and exits 0 with no line of Ray's own in its output."""
    short = Path(tempfile.mkdtemp(prefix="drd", dir="/tmp"))
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_TMPDIR": str(short), "HOME": str(home),
           "DELTARL_DASHBOARD": "1", "DELTARL_CACHE": str(tmp_path / "cache")}
    for var in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        env.pop(var, None)  # as a user's shell has them: Ray's defaults

    def deltarl(*args, timeout=600):
        return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=timeout)

    try:
        up = deltarl("ray", "up", "--dashboard", "--num-cpus", "2")
        assert up.returncode == 0 and "Ray head started" in up.stdout, up.stdout + up.stderr[-3000:]
        assert "Ray dashboard: http://127.0.0.1:" in up.stdout
        assert "it asks for a token: paste the token that `ray get-auth-token` prints" in up.stdout
        token = home / ".ray" / "auth_token"
        assert stat.S_IMODE(token.stat().st_mode) == 0o600
        sessions = sorted(p.name for p in (short / "ray").glob("session_2*"))
        camp = tmp_path / "c.yaml"
        camp.write_text(f"scenario: CartPole-v1\naut: random:1\nworkers: 1\nmlflow: false\noutput: {tmp_path / 'run'}\n"
                        "safety: {fuzzer: random, budget: {episodes: 8}, generation_size: 4}\n")
        run = deltarl("run", str(camp), "--quiet")
        text = run.stdout + run.stderr
        assert run.returncode == 0, text[-4000:]
        assert json.loads((tmp_path / "run" / "summary.json").read_text())["executor"] == "ray x1"
        assert sorted(p.name for p in (short / "ray").glob("session_2*")) == sessions  # joined, started none
        assert "Ray dashboard: http://127.0.0.1:" in run.stderr and "it asks for a token" in run.stderr
        for noise in ("WARNING", "InvalidAuthToken", "gcs_client", "Traceback", "Token authentication"):
            assert noise not in text, f"{noise!r} in the campaign's output:\n{text[-4000:]}"
    finally:
        down = deltarl("ray", "down")
        shutil.rmtree(short, ignore_errors=True)
    assert down.stdout.startswith("Ray head stopped"), down.stdout + down.stderr
