"""Nothing lost, nothing doubled, nothing exposed (issue #22): one test (or more) per defect.

1. one writer per run folder (an OS-level lock naming the holder's PID), run ids that cannot collide;
2. crash safety from the first episode (kills before the first snapshot, between the steps/ and
   episodes/ writes, in a snapshot write, in the challenger phase, in a grid point; a damaged
   newest snapshot) — every resume gives exactly the uninterrupted record;
3. a local Ray cluster listening on 127.0.0.1 only, in both auth modes, and no orphan after the
   driver is killed;
4. a run folder belongs to one campaign and one AUT;
5. files already in --out are never overwritten or deleted;
6. loud method failures (an LLM that never gives a usable scenario; NaN actions);
7. the smaller items, each one clear message and exit 2 with nothing half-written;
and the bad-input table, docs/bad-input.md, generated here so that it cannot drift.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from orchestrator.cli import main

REPO = Path(__file__).resolve().parents[1]
BALANCER = "python:workers.examples:cartpole_balancer"
ENV = {**os.environ, "PYTHONPATH": str(REPO), "DELTARL_DASHBOARD": "0"}


class Killed(BaseException):
    """A simulated kill: like SIGKILL it is no ``Exception``, so no cleanup treats it as bad input."""


CAMPAIGN = """
name: crashy
scenario: CartPole-v1
aut: "random:3"
seed: 7
workers: 0
output: {out}
mlflow: false
safety:
  fuzzer: curefuzz
  budget: {{episodes: {safety}}}
  generation_size: 16
{more}"""

OPTIMALITY = f"""optimality:
  fuzzer: random
  challenger: "{BALANCER}"
  budget: {{episodes: 48}}
  generation_size: 16
"""


def write_campaign(path: Path, out: Path, *, safety: int = 96, more: str = OPTIMALITY) -> Path:
    path.write_text(CAMPAIGN.format(out=out, safety=safety, more=more))
    return path


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:  # argparse: usage error
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def tree_digest(root: Path) -> dict:
    """Every file under ``root`` with its sha256 (what a refused command must leave untouched)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def record(out: Path):
    """The run's record: episodes in a canonical order (episode ids differ after a resume: new
    writer slot) and the number of steps."""
    eps = pd.read_parquet(out / "episodes")
    eps = eps.sort_values(["phase", "role", "iteration", "state_index", "repeat"]).reset_index(drop=True)
    return eps, len(pd.read_parquet(out / "steps", columns=["reward"]))


def assert_same_record(a: Path, b: Path) -> None:
    ea, na = record(a)
    eb, nb = record(b)
    assert len(ea) == len(eb) and na == nb, (len(ea), len(eb), na, nb)
    for col in ("phase", "role", "iteration", "state_index", "repeat", "return", "length", "failure", "bug", "seed"):
        np.testing.assert_array_equal(ea[col].to_numpy(), eb[col].to_numpy(), err_msg=col)
    np.testing.assert_array_equal(np.stack(ea["initial_state"]), np.stack(eb["initial_state"]))
    assert ea["episode_id"].is_unique
    for name in ("failures.parquet", "bugs.parquet"):
        if (a / name).exists() or (b / name).exists():
            va, vb = pd.read_parquet(a / name), pd.read_parquet(b / name)
            cols = [c for c in va.columns if "wall" not in c and "episode_id" not in c and c != "initial_state"]
            pd.testing.assert_frame_equal(va[cols], vb[cols])
    for phase, keys in (("summary.json", ("episodes", "failures", "distinct_failures")),
                        ("optimality_summary.json", ("cases", "bugs", "distinct_bugs"))):
        if (a / phase).exists():
            sa, sb = json.loads((a / phase).read_text()), json.loads((b / phase).read_text())
            assert {k: sa[k] for k in keys} == {k: sb[k] for k in keys}


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory):
    """The uninterrupted run every crash test compares against."""
    from orchestrator.campaign.config import load_campaign
    from orchestrator.campaign.pipeline import run_campaign

    tmp = tmp_path_factory.mktemp("clean")
    run_campaign(load_campaign(write_campaign(tmp / "c.yaml", tmp / "run")), progress=False)
    return tmp / "run"


def resume(out: Path) -> dict:
    from orchestrator.campaign.config import campaign_of_run
    from orchestrator.campaign.pipeline import run_campaign

    return run_campaign(campaign_of_run(out), resume=True, progress=False)


# ------------------------------------------------------------------------------------------------
# 1. one writer per run folder
# ------------------------------------------------------------------------------------------------


def hold_lock(folder: Path) -> subprocess.Popen:
    """Another process holding ``folder``'s lock (as a running `deltarl run` does)."""
    code = ("import sys, time\nfrom orchestrator.runs.layout import RunFolder\n"
            "with RunFolder(sys.argv[1]).lock('deltarl run'):\n    print('LOCKED', flush=True)\n    time.sleep(300)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(folder)], cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "LOCKED"
    return proc


@pytest.mark.subprocess
def test_a_second_writer_is_refused_naming_the_holders_pid_and_a_dead_holder_frees_the_folder(
        tmp_path, capsys, clean_run):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(clean_run, out)
    before = tree_digest(out)
    holder = hold_lock(out)
    try:
        for argv in (["run", "--resume", out],
                     ["run", write_campaign(tmp_path / "again.yaml", out)],
                     ["train-challenger", "--data", out, "--algo", "bc", "--quiet"],
                     ["repair", out, "--quiet"]):
            code, _, err = run_cli(capsys, *argv)
            assert code == 2, (argv, err)
            assert f"is in use by another deltarl process (PID {holder.pid}: deltarl run since" in err, err
        after = tree_digest(out)
        assert {k: v for k, v in after.items() if k != ".deltarl.lock"} == before  # nothing written
    finally:
        holder.kill()  # SIGKILL: the kernel releases the lock with the process
        holder.wait()
    code, _, err = run_cli(capsys, "run", "--resume", out, "--quiet")
    assert code == 0, err
    assert not (out / ".deltarl.lock").exists()  # a released lock leaves no file


@pytest.mark.subprocess
def test_two_runs_started_together_write_one_record(tmp_path):
    """Two `deltarl run CAMPAIGN --out DIR` at once: one runs, the other is refused (the lock, or
    the finished run when it came late); the record holds every episode once."""
    out = tmp_path / "run"
    c = write_campaign(tmp_path / "c.yaml", out, safety=400, more="")
    cmd = [sys.executable, "-m", "orchestrator.cli", "run", str(c), "--quiet"]
    procs = [subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    assert sorted(code for code, _ in results) == [0, 2], results
    loser = next(err for code, err in results if code == 2)
    assert "in use by another deltarl process (PID" in loser or "already holds the safety phase" in loser, loser
    eps = pd.read_parquet(out / "episodes")
    assert len(eps) == json.loads((out / "summary.json").read_text())["episodes"] == 400
    assert eps["episode_id"].is_unique


def test_run_ids_cannot_collide(tmp_path):
    from orchestrator.runs.files import new_run_id

    ids = {new_run_id("same-name") for _ in range(200)}  # all within one second
    assert len(ids) == 200 and all(re.fullmatch(r"same-name-\d{8}-\d{6}-[0-9a-f]{8}", i) for i in ids)


# ------------------------------------------------------------------------------------------------
# 2. crash safety from the first episode
# ------------------------------------------------------------------------------------------------


def _die_on_write(monkeypatch, phase_of_call, n):
    from orchestrator.runs.store import RunStore

    original, calls = RunStore.write, {"n": 0}

    def write(self, *a, **kw):
        ids = original(self, *a, **kw)
        if phase_of_call(kw.get("phase")):
            calls["n"] += 1
            if calls["n"] == n:  # the generation's parts are written, its snapshot never is
                raise Killed
        return ids

    monkeypatch.setattr(RunStore, "write", write)


def _run_until_killed(monkeypatch, campaign, phase_of_call, n):
    """Run ``campaign`` until :func:`_die_on_write` kills it on its ``n``-th matching write."""
    from orchestrator.campaign.pipeline import run_campaign

    _die_on_write(monkeypatch, phase_of_call, n)
    with pytest.raises(Killed):
        run_campaign(campaign, progress=False)
    monkeypatch.undo()


def _die_between_steps_and_episodes(monkeypatch, n):
    import orchestrator.runs.store as store

    original, calls = store.atomic_write_table, {"n": 0}

    def write_table(path, table):
        if path.parent.name == "episodes":
            calls["n"] += 1
            if calls["n"] == n:  # steps/ part written, episodes/ part never
                raise Killed
        return original(path, table)

    monkeypatch.setattr(store, "atomic_write_table", write_table)


def _die_in_snapshot(monkeypatch, n):
    import orchestrator.campaign.generations as gen

    original, calls = gen.atomic_write_bytes, {"n": 0}

    def write_bytes(path, data):
        calls["n"] += 1
        if calls["n"] == n:
            raise Killed
        return original(path, data)

    monkeypatch.setattr(gen, "atomic_write_bytes", write_bytes)


CRASHES = {
    "safety, before its first snapshot": lambda mp: _die_on_write(mp, lambda p: p in ("sampling", "fuzzing"), 1),
    "safety, between the steps/ and episodes/ writes": lambda mp: _die_between_steps_and_episodes(mp, 3),
    "safety, in a snapshot write": lambda mp: _die_in_snapshot(mp, 4),
    "optimality, before its first snapshot": lambda mp: _die_on_write(mp, lambda p: p == "optimality", 1),
    "optimality, mid-phase": lambda mp: _die_on_write(mp, lambda p: p == "optimality", 2),
    # safety writes 7 generations: the 9th episodes/ part is the optimality phase's second generation
    "optimality, between the steps/ and episodes/ writes": lambda mp: _die_between_steps_and_episodes(mp, 9),
}


@pytest.mark.subprocess
@pytest.mark.parametrize("moment", list(CRASHES))
def test_a_kill_at_any_moment_resumes_to_the_uninterrupted_record(tmp_path, monkeypatch, clean_run, moment):
    from orchestrator.campaign.config import load_campaign
    from orchestrator.campaign.pipeline import run_campaign

    out = tmp_path / "run"
    c = load_campaign(write_campaign(tmp_path / "c.yaml", out))
    CRASHES[moment](monkeypatch)
    with pytest.raises(Killed):
        run_campaign(c, progress=False)
    monkeypatch.undo()
    assert not (out / "results.json").exists()
    if "before its first snapshot" in moment:  # the defect: these parts used to stay and be doubled
        phase = "gen" if moment.startswith("safety") else "opt"
        assert not list((out / "snapshots").glob(f"{phase}-*.pkl")) and list((out / "episodes").glob("*.parquet"))
    resume(out)
    assert_same_record(out, clean_run)


@pytest.mark.subprocess
def test_an_optimality_only_run_killed_before_its_first_snapshot_resumes_exactly(tmp_path, monkeypatch):
    """An optimality-only campaign (safety: null, a given challenger): no safety snapshot to fall
    back on; the killed generation's parts used to stay and be written again (1,664 rows, not 1,536)."""
    from orchestrator.campaign.config import load_campaign
    from orchestrator.campaign.pipeline import run_campaign

    text = OPT_ONLY.replace('challenger: "random:11"', f'challenger: "{BALANCER}"')
    runs = {}
    for name in ("clean", "killed"):
        p = tmp_path / f"{name}.yaml"
        p.write_text(text.format(aut="random:3", seed=7, out=tmp_path / name))
        runs[name] = load_campaign(p)
    run_campaign(runs["clean"], progress=False)
    _run_until_killed(monkeypatch, runs["killed"], lambda p: p == "optimality", 1)
    out = tmp_path / "killed"
    assert list((out / "episodes").glob("*.parquet")) and not list((out / "snapshots").glob("*.pkl"))
    resume(out)
    assert_same_record(out, tmp_path / "clean")
    assert len(pd.read_parquet(out / "episodes")) == 2 * 32


@pytest.mark.subprocess
def test_a_sigkill_before_the_first_snapshot_resumes_to_the_uninterrupted_record(tmp_path):
    """A real SIGKILL while the first generation's parts are on disk and no snapshot is."""
    def text(out):
        return CAMPAIGN.format(out=out, safety=1024, more="").replace("generation_size: 16", "generation_size: 512")

    for attempt in range(8):  # the window is one generation's commit: a fast or a loaded machine can miss it
        out = tmp_path / f"killed{attempt}"
        c = tmp_path / f"c{attempt}.yaml"
        c.write_text(text(out))
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "run", str(c), "--quiet"], cwd=REPO,
                                env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while proc.poll() is None and not list((out / "episodes").glob("*.parquet")):
            time.sleep(0.001)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        if list((out / "episodes").glob("*.parquet")) and not list((out / "snapshots").glob("*.pkl")):
            break
    else:
        pytest.fail("could not kill the run between its first part and its first snapshot in 8 tries")
    code = subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", "--resume", str(out), "--quiet"],
                          cwd=REPO, env=ENV, capture_output=True, text=True)
    assert code.returncode == 0, code.stderr[-2000:]
    clean = tmp_path / "clean"
    (tmp_path / "clean.yaml").write_text(text(clean))
    assert main(["run", str(tmp_path / "clean.yaml"), "--quiet"]) == 0
    assert_same_record(out, clean)
    assert len(pd.read_parquet(out / "episodes")) == 1024  # the defect: 1024 + the killed generation's


@pytest.mark.campaign
def test_a_damaged_newest_snapshot_falls_back_to_the_previous_one(tmp_path, monkeypatch, capsys, clean_run):
    from orchestrator.campaign.config import load_campaign

    out = tmp_path / "run"
    c = load_campaign(write_campaign(tmp_path / "c.yaml", out))
    _run_until_killed(monkeypatch, c, lambda p: p in ("sampling", "fuzzing"), 5)
    newest = sorted((out / "snapshots").glob("gen-*.pkl"))[-1]
    newest.write_bytes(newest.read_bytes()[: len(newest.read_bytes()) // 2])  # truncated, e.g. a full disk
    capsys.readouterr()
    code, _, err = run_cli(capsys, "run", "--resume", out, "--quiet")
    assert code == 0, err
    assert f"snapshot {newest} cannot be read" in err and "resuming from the previous snapshot gen-000003.pkl" in err
    assert_same_record(out, clean_run)


@pytest.mark.campaign
def test_all_snapshots_damaged_is_one_clear_error(tmp_path, monkeypatch, capsys):
    from orchestrator.campaign.config import load_campaign

    out = tmp_path / "run"
    c = load_campaign(write_campaign(tmp_path / "c.yaml", out))
    _run_until_killed(monkeypatch, c, lambda p: p in ("sampling", "fuzzing"), 4)
    for snap in (out / "snapshots").glob("*.pkl"):
        snap.write_bytes(b"\x80\x04")
    before = tree_digest(out)
    code, _, err = run_cli(capsys, "run", "--resume", out, "--quiet")
    assert code == 2 and "no snapshot of the safety phase" in err and "cannot be resumed" in err, err
    assert "Traceback" not in err and tree_digest(out) == before


CHALLENGER = OPTIMALITY.replace(f'  challenger: "{BALANCER}"\n', "").replace(
    "optimality:", "challenger:\n  algos: [bc]\n  steps: 20\n  eval_episodes: 2\noptimality:")


@pytest.mark.subprocess
def test_a_kill_during_the_challenger_phase_resumes_to_the_uninterrupted_record(tmp_path, monkeypatch):
    import orchestrator.campaign.challenger as challenger
    from orchestrator.campaign.config import load_campaign
    from orchestrator.campaign.pipeline import run_campaign

    clean = tmp_path / "clean"
    run_campaign(load_campaign(write_campaign(tmp_path / "a.yaml", clean, more=CHALLENGER)), progress=False)
    out = tmp_path / "run"
    c = load_campaign(write_campaign(tmp_path / "b.yaml", out, more=CHALLENGER))

    def die(*a, **kw):
        raise Killed  # trained and checkpointed, the card never written

    monkeypatch.setattr(challenger, "challenger_card", die)
    with pytest.raises(Killed):
        run_campaign(c, progress=False)
    monkeypatch.undo()
    assert not (out / "challengers" / "bc" / "card.json").exists()
    resume(out)
    assert_same_record(out, clean)
    assert (out / "challengers" / "bc" / "card.json").is_file()


@pytest.mark.campaign
def test_a_killed_grid_point_resumes_to_the_uninterrupted_record(tmp_path, monkeypatch, clean_run):
    """A grid runs each point as `run_campaign(resume=<the folder holds its campaign>)` in a Ray
    task (orchestrator.campaign.grid._run_one); here the task body runs in this process."""
    from orchestrator.campaign.config import load_campaign
    from orchestrator.campaign.grid import _run_one

    out = tmp_path / "grid" / "crashy-000"
    c = load_campaign(write_campaign(tmp_path / "c.yaml", out))
    _run_until_killed(monkeypatch, c, lambda p: p == "optimality", 2)
    monkeypatch.setenv("DELTARL_CHALLENGER_CACHE", str(tmp_path / "cache"))
    _run_one(c.to_dict(), f"sqlite:///{tmp_path / 'grid' / 'mlflow.db'}", "crashy")
    assert_same_record(out, clean_run)


# ------------------------------------------------------------------------------------------------
# 3. a loopback-only Ray, no orphans
# ------------------------------------------------------------------------------------------------


def _tree(root: int) -> set[int]:
    parent = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            parent[int(name)] = int(stat[stat.rfind(")") + 2:].split()[1])
    found, grew = {root}, True
    while grew:
        grew = False
        for pid, ppid in parent.items():
            if ppid in found and pid not in found:
                found.add(pid)
                grew = True
    return found


def _listening(pids: set[int]) -> list[tuple[int, str]]:
    """(pid, local address) of every TCP socket in LISTEN state owned by ``pids`` (from /proc)."""
    owner = {}
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    owner[link[8:-1]] = pid
        except OSError:
            continue
    out = []
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in owner:  # 0A: LISTEN
                hexip, port = f[1].split(":")
                raw = bytes.fromhex(hexip)
                if v6:
                    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                    import ipaddress

                    ip = ipaddress.IPv6Address(words)
                    ip = str(ip.ipv4_mapped) if ip.ipv4_mapped else str(ip)
                else:
                    ip = ".".join(str(b) for b in raw[::-1])
                out.append((owner[f[9]], f"{ip}:{int(port, 16)}"))
    return out


DRIVER = """
import os, signal, sys, time
from orchestrator.cluster.lifecycle import start_ray
import ray
def mine(signum, frame):  # deltarl's SIGTERM-as-Ctrl-C stands here: ray.init must not replace it
    raise KeyboardInterrupt
signal.signal(signal.SIGTERM, mine)
start_ray(num_cpus=1, dashboard=sys.argv[1] == "dashboard", object_store_bytes=1 << 28)

@ray.remote
def pid():
    return os.getpid()

print("READY", ray.get(pid.remote()), "sigterm-kept" if signal.getsignal(signal.SIGTERM) is mine else "sigterm-lost",
      flush=True)
time.sleep(600)
"""


@pytest.mark.subprocess
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("mode", ["no auth, no dashboard", "token auth, dashboard"])
def test_a_local_cluster_listens_on_loopback_only_and_dies_with_its_driver(mode):
    env = {**ENV}
    if mode.startswith("no auth"):
        env["RAY_AUTH_MODE"] = "disabled"  # `deltarl rollout`, `deltarl run --no-dashboard`
    else:
        env.pop("RAY_AUTH_MODE", None)  # Ray's default for a local cluster: token auth
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, "dashboard" if "dashboard," in mode else "-"], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("READY"), line
        assert line.split()[-1] == "sigterm-kept", line  # the driver's own SIGTERM handler survives ray.init
        tree = _tree(proc.pid)
        sockets = _listening(tree)
        names = {pid: Path(f"/proc/{pid}/comm").read_text().strip() for pid, _ in sockets}
        assert len({names[p] for p, _ in sockets} & {"gcs_server", "raylet"}) == 2, sockets  # we see the cluster
        exposed = [(names[p], a) for p, a in sockets if not a.startswith(("127.0.0.1:", "::1:"))]
        assert not exposed, f"listening beyond loopback: {exposed}"
    finally:
        proc.kill()  # SIGKILL: no atexit, no ray.shutdown()
        proc.wait()
    t0 = time.monotonic()
    alive = tree - {proc.pid}
    while time.monotonic() - t0 < 15:
        alive = {p for p in alive if Path(f"/proc/{p}").exists() and "zombie" not in _state(p)}
        if not alive:
            break
        time.sleep(0.25)
    assert not alive, f"Ray processes outlived their driver by 15 s: {alive}"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0].lower()
    except (OSError, IndexError):
        return "zombie"


# ------------------------------------------------------------------------------------------------
# 4. one campaign and one AUT per folder; 5. files already in --out stay untouched
# ------------------------------------------------------------------------------------------------

OPT_ONLY = """
name: opt-only
scenario: CartPole-v1
aut: "{aut}"
seed: {seed}
workers: 0
output: {out}
mlflow: false
safety: null
optimality:
  fuzzer: random
  challenger: "random:11"
  budget: {{episodes: 32}}
  generation_size: 16
"""


@pytest.mark.subprocess
def test_a_phase_for_another_agent_is_refused_and_a_matching_one_is_added(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", str(write_campaign(tmp_path / "s.yaml", out, more="")), "--quiet"]) == 0
    capsys.readouterr()
    before = tree_digest(out)
    for aut, seed, message in ((BALANCER, 7, "with aut 'random:3'; this campaign has aut"),
                               ("random:3", 8, "with seed 7; this campaign has seed 8")):
        p = tmp_path / "o.yaml"
        p.write_text(OPT_ONLY.format(aut=aut, seed=seed, out=out))
        code, _, err = run_cli(capsys, "run", p, "--quiet")
        assert code == 2 and message in err and "A run folder holds one campaign and one AUT" in err, err
        assert tree_digest(out) == before  # nothing appended, results.json kept
    code, _, err = run_cli(capsys, "run", write_campaign(tmp_path / "s2.yaml", out, more=""), "--quiet")
    assert code == 2 and "already holds the safety phase" in err and tree_digest(out) == before

    p.write_text(OPT_ONLY.format(aut="random:3", seed=7, out=out))  # the run's own AUT: added
    code, _, err = run_cli(capsys, "run", p, "--quiet")
    assert code == 0, err
    results = json.loads((out / "results.json").read_text())
    assert results["safety"]["episodes"] == 96 and results["optimality"]["cases"] == 32  # both phases kept
    saved = json.loads((out / "campaign.json").read_text())
    assert saved["name"] == "crashy" and saved["safety"] and saved["optimality"]["challenger"] == "random:11"
    assert run_cli(capsys, "run", "--resume", out, "--quiet")[0] == 0


@pytest.mark.subprocess
def test_files_already_in_out_are_never_overwritten_or_deleted(tmp_path, capsys):
    out = tmp_path / "mine"
    (out / "snapshots").mkdir(parents=True)
    for name in ("summary.json", "results.json", "campaign.json"):
        (out / name).write_text('{"mine": true}')
    (out / "timeline.parquet").write_bytes(b"my own bytes")
    (out / "snapshots" / "gen-000001.pkl").write_bytes(b"my pickle")
    before = tree_digest(out)
    for argv in (["run", write_campaign(tmp_path / "c.yaml", out), "--quiet"],
                 ["run", write_campaign(tmp_path / "d.yaml", tmp_path / "x"), "--out", out, "--quiet"],
                 ["rollout", "--scenario", "CartPole-v1", "--policy", BALANCER, "--episodes", "4", "--workers", "0",
                  "--out", out, "--quiet"]):
        code, _, err = run_cli(capsys, *argv)
        assert code == 2 and "deltarl never writes into a folder with other files" in err, err
        assert tree_digest(out) == before and not (out / ".deltarl.lock").exists()
    assert not (tmp_path / "x").exists()


@pytest.mark.subprocess
def test_an_empty_output_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    c = write_campaign(tmp_path / "c.yaml", "''", more="")
    code, _, err = run_cli(capsys, "run", c, "--quiet")
    assert code == 2 and "output must be a folder path, got ''" in err
    code, _, err = run_cli(capsys, "run", write_campaign(tmp_path / "d.yaml", tmp_path / "r"), "--out", "", "--quiet")
    assert code == 2 and "--out: must be a folder path, got an empty string" in err
    code, _, err = run_cli(capsys, "rollout", "--scenario", "CartPole-v1", "--policy", BALANCER, "--episodes", "3",
                           "--out", "")
    assert code == 2 and "--out: must be a folder path" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml", "d.yaml"]


# ------------------------------------------------------------------------------------------------
# 6. loud method failures
# ------------------------------------------------------------------------------------------------

LLM_CAMPAIGN = """
scenario: CartPole-v1
aut: "{aut}"
workers: 0
output: {out}
mlflow: false
safety:
  fuzzer: llmtester
  budget: {{episodes: 64}}
  generation_size: 16
llm: {{base_url: "{url}", model: stub, requests_per_minute: 6000, timeout_s: 2, max_retries: 0, backoff_s: 0.01{more}}}
"""


@pytest.mark.subprocess
@pytest.mark.parametrize("junk", ["malformed", "bad_body"])
def test_an_llm_that_gives_no_usable_scenario_fails_the_run_loudly(tmp_path, capsys, junk):
    from tests.llm_server import LLMStubServer

    with LLMStubServer(default=junk) as srv:
        p = tmp_path / "c.yaml"
        p.write_text(LLM_CAMPAIGN.format(aut=BALANCER, out=tmp_path / "run", url=srv.base_url, more=""))
        code, out, err = run_cli(capsys, "run", p, "--quiet")
    assert code == 1, err
    assert "the LLM gave no usable scenario in" in err and "fell back to random mutation" in err
    assert "usable scenarios (NONE" in out
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["llm_calls"] > 0 and s["llm_usable"] == 0 and s["llm_no_usable_scenario"] is True


@pytest.mark.subprocess
def test_max_consecutive_failures_stops_the_campaign(tmp_path, capsys):
    from tests.llm_server import LLMStubServer

    with LLMStubServer(default="malformed") as srv:
        p = tmp_path / "c.yaml"
        p.write_text(LLM_CAMPAIGN.format(aut=BALANCER, out=tmp_path / "run", url=srv.base_url,
                                         more=", max_consecutive_failures: 3"))
        code, _, err = run_cli(capsys, "run", p, "--quiet")
        calls = len(srv.requests)
    assert code == 2, err
    assert "3 LLM calls in a row gave no usable scenario" in err and "llm.max_consecutive_failures: 3" in err
    assert "--resume" in err and calls < 31
    assert not (tmp_path / "run" / "summary.json").exists()


@pytest.mark.subprocess
def test_a_usable_llm_passes(tmp_path, capsys):
    from tests.llm_server import LLMStubServer

    with LLMStubServer(default="ok", step=0.3) as srv:
        p = tmp_path / "c.yaml"
        p.write_text(LLM_CAMPAIGN.format(aut=BALANCER, out=tmp_path / "run", url=srv.base_url,
                                         more=", max_consecutive_failures: 3"))
        code, out, err = run_cli(capsys, "run", p, "--quiet")
    assert code == 0, err
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["llm_usable"] == s["llm_calls"] > 0 and not s["llm_no_usable_scenario"]


NAN_AGENT = """
import numpy as np

def agent(obs):
    obs = np.asarray(obs, dtype=np.float64)
    a = np.zeros((obs.shape[0], 3))
    a[np.abs(obs).sum(axis=1) > 0] = np.nan  # finite on the all-zero probe, NaN on real observations
    return a
"""


def test_non_finite_actions_name_the_policy_and_the_step(tmp_path, capsys):
    pytest.importorskip("mujoco")
    agent = tmp_path / "nan_agent.py"
    agent.write_text(NAN_AGENT)
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "rollout", "--scenario", "Hopper-v5", "--policy", f"python:{agent}:agent",
                           "--episodes", "4", "--workers", "0", "--out", out, "--quiet")
    assert code == 2, err
    assert f"the aut policy python:{agent}:agent returned a non-finite action" in err
    assert "at step 0 of the episode from initial state [" in err and "Traceback" not in err
    assert not out.exists()  # nothing half-written


# ------------------------------------------------------------------------------------------------
# 7. the smaller items: one clear message, exit 2, nothing half-written
# ------------------------------------------------------------------------------------------------


@pytest.mark.subprocess
def test_a_nan_seconds_budget_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    c = write_campaign(tmp_path / "c.yaml", out, more="")
    c.write_text(c.read_text().replace("episodes: 96", "seconds: .nan"))
    code, _, err = run_cli(capsys, "run", c, "--quiet")
    assert code == 2 and "safety.budget.seconds must be a finite number, got nan" in err and not out.exists()


@pytest.mark.subprocess
def test_negative_seeds_are_refused(tmp_path, capsys):
    out = tmp_path / "run"
    c = write_campaign(tmp_path / "c.yaml", out, more="")
    c.write_text(c.read_text().replace("seed: 7", "seed: -1"))
    code, _, err = run_cli(capsys, "run", c, "--quiet")
    assert code == 2 and "seed must be an integer from 0 to 2147483647, got -1" in err and not out.exists()
    code, _, err = run_cli(capsys, "rollout", "--scenario", "CartPole-v1", "--policy", BALANCER, "--episodes", "3",
                           "--workers", "0", "--seed", "-1", "--out", out)
    assert code == 2 and "argument --seed: must be an integer from 0" in err and not out.exists()


def test_batch_size_zero_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "rollout", "--scenario", "CartPole-v1", "--policy", BALANCER, "--episodes", "3",
                           "--workers", "0", "--batch-size", "0", "--out", out)
    assert code == 2 and "argument --batch-size: must be an integer >= 1, got 0" in err and not out.exists()


@pytest.mark.subprocess
def test_non_utf8_campaign_and_corrupt_campaign_json(tmp_path, capsys, clean_run):
    import shutil

    c = tmp_path / "c.yaml"
    c.write_bytes(b"scenario: CartPole-v1\nname: caf\xe9\n")
    code, _, err = run_cli(capsys, "run", c)
    assert code == 2 and "is not UTF-8 text (byte" in err
    out = tmp_path / "run"
    shutil.copytree(clean_run, out)
    for damage in (b"{\"name\": \"trunc", b"\xff\xfe\x00", b"[1, 2]"):
        (out / "campaign.json").write_bytes(damage)
        before = tree_digest(out)
        code, _, err = run_cli(capsys, "run", "--resume", out)
        assert code == 2 and "campaign.json" in err and "Traceback" not in err, err
        assert tree_digest(out) == before


@pytest.mark.subprocess
def test_invalid_yaml_has_its_line_and_column_and_duplicate_keys_are_refused(tmp_path, capsys):
    c = tmp_path / "c.yaml"
    c.write_text("scenario: CartPole-v1\naut: [unclosed\noutput: x\n")
    code, _, err = run_cli(capsys, "run", c)
    assert code == 2 and "is not valid YAML" in err and re.search(r"line \d+, column \d+", err)
    c.write_text("scenario: CartPole-v1\nseed: 1\nseed: 2\n")
    code, _, err = run_cli(capsys, "run", c)
    assert code == 2 and "duplicate key 'seed' (line 3, column 1; first at line 2)" in err


@pytest.mark.subprocess
def test_truncated_parquet_parts(tmp_path, capsys, clean_run):
    """report: a warning for every unreadable file (exit 1), and report.md says what it left out;
    resume and replay: one clear error."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(clean_run, out)
    parts = sorted((out / "episodes").glob("*.parquet"))
    for p in (parts[0], parts[-1], out / "bugs.parquet"):
        p.write_bytes(p.read_bytes()[:100])
    code, _, err = run_cli(capsys, "report", out, "--out", tmp_path / "report")
    assert code == 1, err
    text = (tmp_path / "report" / "report.md").read_text()
    for p in (parts[0], parts[-1], out / "bugs.parquet"):
        assert f"deltarl: warning: could not read {p}:" in err
        assert f"`{p.relative_to(out)}` could not be read" in text, text[-1500:]
    code, _, err = run_cli(capsys, "replay", out, "0")
    assert code == 2 and f"{out / 'bugs.parquet'} cannot be read" in err and "Traceback" not in err
    (out / "optimality_summary.json").unlink()  # an interrupted optimality phase, to resume
    before = tree_digest(out)
    code, _, err = run_cli(capsys, "run", "--resume", out, "--quiet")
    assert code == 2 and "Parquet file(s) of run" in err and str(parts[0]) in err and "Traceback" not in err, err
    assert tree_digest(out) == before


STOPS = {signal.SIGINT: (130, "interrupted"), signal.SIGTERM: (143, "terminated (SIGTERM)"),
         signal.SIGHUP: (129, "hung up (SIGHUP)")}  # docs/trust.md: exit 128 + the signal's number


def _default_signals():
    # SIGINT and SIGHUP as a terminal delivers them: a suite started in the background of a
    # non-interactive shell (`make test &`) inherits SIGINT ignored, one under nohup SIGHUP, and
    # Python keeps an ignored signal ignored in its children (deltarl too: measured, the campaign
    # then runs on and the test times out)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _stop_a_campaign(tmp_path, sig, *, group: bool, workers: int = 0) -> tuple[Path, int, str]:
    """Start ``deltarl run`` (a long safety phase) in a session of its own, wait for its first
    snapshot, send ``sig`` to the process or to its whole process group (a terminal's Ctrl-C, a
    closed terminal, ``kill -TERM -PGID``, systemd's and Kubernetes' stop: Ray's processes get it
    too), and return the run folder, the exit code and stderr."""
    out = tmp_path / "run"
    c = write_campaign(tmp_path / "c.yaml", out, safety=20000, more="")
    if workers:
        c.write_text(c.read_text().replace("workers: 0", f"workers: {workers}"))
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "run", str(c), "--quiet"], cwd=REPO,
                            env={**ENV, "PYTHONFAULTHANDLER": "1"}, preexec_fn=_default_signals,
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while time.time() < deadline and not list((out / "snapshots").glob("gen-*.pkl")) and proc.poll() is None:
        time.sleep(0.05)
    snapshot_seen = bool(list((out / "snapshots").glob("gen-*.pkl")))
    if group:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:  # say where it hangs: faulthandler prints every thread's stack on SIGABRT
        proc.send_signal(signal.SIGABRT)
        _, err = proc.communicate(timeout=30)
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"deltarl did not exit within 90 s of {sig.name} (a snapshot was seen: {snapshot_seen}); "
                    f"its threads:\n{err[-8000:]}")
    return out, proc.returncode, err


def _assert_clean_stop(out: Path, sig, code: int, err: str) -> None:
    want, words = STOPS[sig]
    assert code == want, f"{sig.name}: exit {code}, expected {want}\n{err[-3000:]}"
    assert "Traceback" not in err and "KeyboardInterrupt" not in err and "Terminated" not in err, err[-3000:]
    assert f"deltarl: {words}; continue it with: deltarl run --resume {out}" in err, err[-3000:]


STOP_CASES = [(signal.SIGINT, True, "SIGINT to the process group (Ctrl-C in its terminal)"),
              (signal.SIGTERM, False, "SIGTERM to the process (kill, timeout, systemd)"),
              (signal.SIGTERM, True, "SIGTERM to the process group (kill -TERM -PGID, Kubernetes)"),
              (signal.SIGHUP, True, "SIGHUP to the process group (its terminal closed)")]

LLM_STOP = """scenario: CartPole-v1
aut: "{aut}"
workers: 0
seed: 3
output: {out}
mlflow: false
safety:
  fuzzer: llmtester
  params: {{multi_scale: false}}
  budget: {{episodes: 64}}
  sampling_fraction: 0.25
  generation_size: 8
llm: {{base_url: "{url}", model: stub, requests_per_minute: 6000, timeout_s: 30, max_retries: {retries},
      backoff_s: 0.01, call_deadline_s: 60, phase_deadline_s: 3{more}}}
"""


def _stop_rows(t: Path, capsys) -> list[tuple]:
    """The rows of docs/bad-input.md's second table: a campaign stopped by each signal, and LLM
    servers that stop answering or answer bytes that are not UTF-8 (issue #47). Each row:
    ``(group, case, command, exit, message)`` with the exit code docs/trust.md gives."""
    from tests.llm_server import LLMStubServer

    rows = []
    for k, (sig, group, what) in enumerate(STOP_CASES):
        (t / "stops" / f"s{k}").mkdir(parents=True)
        out, code, err = _stop_a_campaign(t / "stops" / f"s{k}", sig, group=group)
        _assert_clean_stop(out, sig, code, err)
        rows.append(("signal", what, "run CAMPAIGN.yaml", code, err.strip().splitlines()[-1].replace(str(t), "$T")))
    for k, (what, script, default, retries, more, want) in enumerate((
            ("LLM server that accepts and never answers", ["json"] * 8, "hang", 3, "", 2),
            ("LLM server that answers bytes that are not UTF-8", [], "not_utf8", 0,
             ", max_consecutive_failures: 3", 2))):
        with LLMStubServer(script=script, default=default, hang_s=30.0, step=0.05) as srv:
            c = t / "stops" / f"llm{k}.yaml"
            c.write_text(LLM_STOP.format(aut=BALANCER, out=t / "stops" / f"llm{k}", url=srv.base_url, retries=retries,
                                         more=more))
            code, _, err = run_cli(capsys, "run", c, "--quiet")
        lines = [ln for ln in err.strip().splitlines() if ln.strip()]
        assert code == want and "Traceback" not in err and lines[-1].startswith("deltarl: error:"), err[-2000:]
        message = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", lines[-1].replace(str(t), "$T"))
        rows.append(("LLM server", what, "run CAMPAIGN.yaml", code, message))
    return rows


@pytest.mark.subprocess
@pytest.mark.parametrize("target", ["process", "group"])
@pytest.mark.parametrize("sig", list(STOPS), ids=lambda s: s.name)
def test_every_stopping_signal_prints_the_resume_hint_with_its_exit_code(tmp_path, sig, target):
    """Ctrl-C (SIGINT), SIGTERM (``kill``, ``timeout``, Kubernetes) and SIGHUP (a closed terminal),
    sent to the process or to its process group, stop the campaign the same clean way: exit 128 +
    the signal's number and how to continue (that a resume gives the uninterrupted record: the
    kill tests above)."""
    out, code, err = _stop_a_campaign(tmp_path, sig, group=target == "group")
    _assert_clean_stop(out, sig, code, err)


@pytest.mark.subprocess
@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("sig", list(STOPS), ids=lambda s: s.name)
def test_a_ray_campaign_stopped_through_its_process_group_says_so_and_how_to_resume(tmp_path, sig):
    """The same for a campaign on its own Ray cluster (``workers: 1``), the signal sent to the whole
    process group, which holds the cluster's processes too (issue #47: SIGTERM exited 130, SIGHUP
    ended it without the resume hint)."""
    out, code, err = _stop_a_campaign(tmp_path, sig, group=True, workers=1)
    _assert_clean_stop(out, sig, code, err)


@pytest.mark.parametrize("sig", list(STOPS), ids=lambda s: s.name)
def test_the_first_signal_names_the_stop_whatever_exception_reaches_the_top(sig):
    """In this process: the signal raises (``Terminated`` for SIGTERM/SIGHUP), a layer turns it into
    a plain ``KeyboardInterrupt`` (as ``ray.get`` does), and ``stopped`` still names the signal; the
    handlers are put back afterwards."""
    from orchestrator.cli.common import Terminated, sigterm_as_interrupt, stopped

    before = {s: signal.getsignal(s) for s in STOPS}
    with pytest.raises(KeyboardInterrupt) as caught, sigterm_as_interrupt():
        try:
            os.kill(os.getpid(), sig)
            time.sleep(5)  # the handler runs at the next bytecode; never reached
        except KeyboardInterrupt as exc:
            assert isinstance(exc, Terminated) == (sig != signal.SIGINT)
            raise KeyboardInterrupt from None
    assert type(caught.value) is KeyboardInterrupt
    assert stopped(caught.value)[::-1] == STOPS[sig]
    assert {s: signal.getsignal(s) for s in STOPS} == before


RAY_GET_STOP = """
import os, signal, sys, threading, time
from orchestrator.cli.common import sigterm_as_interrupt, stopped
from orchestrator.cluster.lifecycle import start_ray
import ray
with sigterm_as_interrupt():
    start_ray(num_cpus=1, dashboard=False, object_store_bytes=1 << 28)
    ref = ray.remote(lambda: time.sleep(120)).remote()
    threading.Timer(3.0, os.kill, (os.getpid(), int(sys.argv[1]))).start()
    try:
        ray.get(ref)
    except KeyboardInterrupt as exc:
        print(type(exc).__name__, *stopped(exc), sep="|", flush=True)
"""


@pytest.mark.subprocess
@pytest.mark.ray
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_that_arrives_inside_ray_get_keeps_its_name_and_code(sig):
    """Ray's ``ray.get`` replaces the exception a signal handler raises while it waits by a plain
    ``KeyboardInterrupt`` (what made a SIGTERMed Ray campaign exit 130): the stop is named by the
    signal that came, not by the exception that reached the top."""
    proc = subprocess.run([sys.executable, "-c", RAY_GET_STOP, str(int(sig))], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=180, preexec_fn=_default_signals)
    caught, words, code = proc.stdout.strip().splitlines()[-1].split("|")
    assert caught == "KeyboardInterrupt", proc.stdout  # Ray's own exception, not ours
    assert (int(code), words) == STOPS[sig], proc.stdout


@pytest.mark.subprocess
def test_resume_with_a_campaign_file_or_out_is_refused(tmp_path, capsys, clean_run):
    c = write_campaign(tmp_path / "c.yaml", tmp_path / "x")
    for argv in (["run", c, "--resume", clean_run], ["run", "--resume", clean_run, "--out", tmp_path / "y"]):
        code, _, err = run_cli(capsys, *argv)
        assert code == 2 and "give no campaign file and no --out with it" in err
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_stop_with_an_address_without_scheme_is_refused(capsys):
    code, _, err = run_cli(capsys, "stop", "raysubmit_1", "--address", "127.0.0.1:1")
    assert code == 2 and "give the job API's URL with its scheme, e.g. http://127.0.0.1:1" in err


def test_a_zoo_uri_is_a_name_never_a_path(tmp_path, capsys):
    code, _, err = run_cli(capsys, "evaluate", "--policy", "zoo:../../x", "--scenario", "CartPole-v1")
    assert code == 2 and "zoo:../../x is not a zoo agent name" in err


# ------------------------------------------------------------------------------------------------
# the bad-input table: docs/bad-input.md, generated here
# ------------------------------------------------------------------------------------------------

GOOD = f"""scenario: CartPole-v1
aut: {BALANCER}
workers: 0
output: OUT
mlflow: false
safety:
  fuzzer: random
  budget: {{episodes: 32}}
  generation_size: 16
"""

OPT = """optimality:
  fuzzer: delta
  challenger: "random:1"
  budget: {episodes: 32}
"""


def _edit(*pairs, append: str = ""):
    text = GOOD
    for a, b in pairs:
        assert a in text, a
        text = text.replace(a, b)
    return text + append


def _cases() -> list[tuple[str, str, list]]:
    """(group, what was tried, argv with $C = the campaign text written to a file, $T = the tmp folder)."""
    C = "$C"
    roll = ["rollout", "--scenario", "CartPole-v1", "--policy", BALANCER, "--workers", "0"]
    out = ["--out", "$T/r"]
    c = []

    def camp(what, text, *extra):
        c.append(("campaign file", what, ["run", C, *extra], text))

    camp("unknown top-level key", _edit(("workers: 0", "workerz: 0")))
    camp("unknown key in a section", _edit(("  generation_size: 16", "  generation_size: 16\n  budgett: 3")))
    camp("missing required key", _edit((f"aut: {BALANCER}\n", "")))
    camp("unknown scenario", _edit(("CartPole-v1", "Pong-v5")))
    camp("unknown fuzzer", _edit(("fuzzer: random", "fuzzer: afl")))
    camp("a parameter the fuzzer does not have", _edit(("fuzzer: random", "fuzzer: mdpfuzz\n  params: {alpha: 25}")))
    camp("a parameter value the fuzzer refuses", _edit(("fuzzer: random", "fuzzer: mdpfuzz\n  params: {gmm_k: 0}")))
    camp("optimality fuzzer as safety fuzzer", _edit(("fuzzer: random", "fuzzer: delta")))
    camp("wrong type (string for integer)", _edit(("generation_size: 16", "generation_size: many")))
    camp("wrong type (list for mapping)", _edit(("budget: {episodes: 32}", "budget: [32]")))
    camp("boolean for a number", _edit(("generation_size: 16", "generation_size: true")))
    camp("empty budget", _edit(("budget: {episodes: 32}", "budget: {}")))
    camp("zero episodes", _edit(("episodes: 32", "episodes: 0")))
    camp("negative episodes", _edit(("episodes: 32", "episodes: -5")))
    camp("negative seconds", _edit(("episodes: 32", "seconds: -1")))
    camp("NaN seconds", _edit(("episodes: 32", "seconds: .nan")))
    camp("infinite seconds", _edit(("episodes: 32", "seconds: .inf")))
    camp("sampling_fraction 0", _edit(("  generation_size: 16", "  generation_size: 16\n  sampling_fraction: 0")))
    camp("sampling_fraction NaN", _edit(("  generation_size: 16", "  generation_size: 16\n  sampling_fraction: .nan")))
    camp("generation_size 0", _edit(("generation_size: 16", "generation_size: 0")))
    camp("negative workers", _edit(("workers: 0", "workers: -1")))
    camp("workers not a number", _edit(("workers: 0", "workers: many")))
    camp("batch_size 0", _edit(("workers: 0", "workers: 0\nbatch_size: 0")))
    camp("negative seed", _edit(("workers: 0", "workers: 0\nseed: -1")))
    camp("huge seed", _edit(("workers: 0", "workers: 0\nseed: 99999999999")))
    camp("empty output", _edit(("output: OUT", "output: ''")))
    camp("no phase", _edit(("safety:\n  fuzzer: random\n  budget: {episodes: 32}\n  generation_size: 16\n",
                            "safety: null\n")))
    camp("challenger without safety", _edit(("safety:\n  fuzzer: random\n  budget: {episodes: 32}\n"
                                             "  generation_size: 16\n", "safety: null\nchallenger: {algos: [bc]}\n")))
    camp("unknown challenger algorithm", _edit(append="challenger: {algos: [ppo]}\n"))
    camp("challenger steps 0", _edit(append="challenger: {algos: [bc], steps: 0}\n"))
    camp("optimality without a challenger", _edit(append=OPT.replace('  challenger: "random:1"\n', "")))
    camp("unknown oracle", _edit(append=OPT + "  oracle: majority\n"))
    camp("negative delta", _edit(append=OPT + "  delta: -1\n"))
    camp("NaN delta", _edit(append=OPT + "  delta: .nan\n"))
    camp("alpha 1", _edit(append=OPT + "  alpha: 1\n"))
    camp("repeats 0", _edit(append=OPT + "  repeats: 0\n"))
    # no endpoint: the local model runs; here it is not installed ($DELTARL_LOCAL_LLM_MODEL names no file)
    camp("llmtester, no endpoint and no local model", _edit(("fuzzer: random", "fuzzer: llmtester")))
    camp("llm base_url without scheme", _edit(append="llm: {base_url: 127.0.0.1:9/v1, model: m}\n"))
    camp("llm api_key_env holding a key", _edit(append="llm: {base_url: 'http://127.0.0.1:9/v1', model: m, "
                                                "api_key_env: 'sk-abc.def'}\n"))
    camp("llm max_consecutive_failures 0", _edit(append="llm: {base_url: 'http://127.0.0.1:9/v1', model: m, "
                                                 "max_consecutive_failures: 0}\n"))
    camp("llm call_deadline_s 0", _edit(append="llm: {base_url: 'http://127.0.0.1:9/v1', model: m, "
                                        "call_deadline_s: 0}\n"))
    camp("llm phase_deadline_s NaN", _edit(append="llm: {base_url: 'http://127.0.0.1:9/v1', model: m, "
                                           "phase_deadline_s: .nan}\n"))
    camp("unknown scenario override", _edit(append="scenario_overrides: {gravity_typo: 3}\n"))
    # issue #47: values bounded, overrides checked by the scenario, files checked before any work
    camp("workers beyond the usable CPUs", _edit(("workers: 0", "workers: 100000")))
    camp("episodes 1e23", _edit(("episodes: 32", "episodes: 1e23")))
    camp("episodes beyond the bound", _edit(("episodes: 32", "episodes: 99999999999999999999999")))
    camp("seconds beyond the bound", _edit(("episodes: 32", "seconds: 1.0e+300")))
    camp("generation_size beyond the bound", _edit(("generation_size: 16", "generation_size: 10000000")))
    camp("output with an unset variable", _edit(("output: OUT", "output: $DELTARL_UNSET_VARIABLE/x")))
    camp("override max_steps NaN", _edit(append="scenario_overrides: {max_steps: .nan}\n"))
    camp("override max_steps -1", _edit(append="scenario_overrides: {max_steps: -1}\n"))
    camp("override max_steps not a number", _edit(append="scenario_overrides: {max_steps: abc}\n"))
    camp("override low of the wrong length", _edit(append="scenario_overrides: {low: [1, 2]}\n"))
    camp("override of the scenario's name", _edit(append="scenario_overrides: {name: Other}\n"))
    camp("optimality challenger file missing", _edit(append=OPT.replace('"random:1"', '"$T/nope.pt"')))
    camp("optimality challenger for another scenario", _edit(append=OPT.replace('"random:1"', '"$T/hopper.pt"')))
    camp("disk full while writing (ENOSPC, simulated)", _edit(("output: OUT", "output: $T/enospc")))
    camp("policy file missing", _edit((BALANCER, "$T/nope.pt")))
    camp("python: module missing", _edit((BALANCER, "python:no_such_module_xyz:agent")))
    camp("zoo: path instead of a name", _edit((BALANCER, "zoo:../../x")))
    camp("unknown zoo agent", _edit((BALANCER, "zoo:Pong-v5")))
    camp("policy for another scenario", _edit((BALANCER, "$T/hopper.pt")))
    camp("not a mapping", "- a\n- b\n")
    camp("empty file", "")
    camp("invalid YAML", "scenario: CartPole-v1\naut: [unclosed\n")
    camp("tab indentation", "safety:\n\tfuzzer: random\n")
    camp("duplicate key", _edit(("workers: 0", "workers: 0\nworkers: 1")))
    camp("--out empty", GOOD, "--out", "")
    camp("--resume with a campaign file", GOOD, "--resume", "$T/run")
    camp("--out: a folder with other files", GOOD, "--out", "$T/userfiles")
    camp("--out: a file", GOOD, "--out", "$T/afile")
    camp("--out: a run of another AUT", _edit((BALANCER, "random:3")), "--out", "$T/run")
    camp("--out: a run that has this phase", GOOD, "--out", "$T/run")
    c += [
        ("campaign file", "not UTF-8", ["run", "$T/latin1.yaml"], None),
        ("campaign file", "no such file", ["run", "$T/missing.yaml"], None),
        ("run", "no campaign and no --resume", ["run"], None),
        ("run", "--resume of a folder without campaign.json", ["run", "--resume", "$T/userfiles"], None),
        ("run", "--resume with a corrupt campaign.json", ["run", "--resume", "$T/corrupt"], None),
        ("run", "--resume with --out", ["run", "--resume", "$T/run", "--out", "$T/else"], None),
        ("run", "--campaign-env holding a list", ["run", "--campaign-env", "DELTARL_LIST_CAMPAIGN"], None),
        ("run", "--resume after campaign.json's seed was edited", ["run", "--resume", "$T/seed-edited"], None),
        ("run", "--resume after campaign.json's aut was edited", ["run", "--resume", "$T/aut-edited"], None),
        ("run", "--resume after the AUT file was replaced", ["run", "--resume", "$T/aut-swapped"], None),
        ("rollout", "unknown scenario", ["rollout", "--scenario", "Pong-v5", "--policy", BALANCER, "--episodes", "3",
                                         *out], None),
        ("rollout", "no --episodes and no --states", [*roll, *out], None),
        ("rollout", "--episodes 0", [*roll, "--episodes", "0", *out], None),
        ("rollout", "negative --seed", [*roll, "--episodes", "3", "--seed", "-1", *out], None),
        ("rollout", "--batch-size 0", [*roll, "--episodes", "3", "--batch-size", "0", *out], None),
        ("rollout", "negative --workers", [*roll[:-2], "--workers", "-1", "--episodes", "3", *out], None),
        ("rollout", "--workers beyond the usable CPUs", [*roll[:-2], "--workers", "100000", "--episodes", "3", *out],
         None),
        ("rollout", "--max-steps 0", [*roll, "--episodes", "3", "--max-steps", "0", *out], None),
        ("rollout", "--out empty", [*roll, "--episodes", "3", "--out", ""], None),
        ("rollout", "--out: a folder with other files", [*roll, "--episodes", "3", "--out", "$T/userfiles"], None),
        ("rollout", "--out: a folder holding a run", [*roll, "--episodes", "3", "--out", "$T/run"], None),
        ("rollout", "--states file missing", [*roll, "--states", "$T/none.csv", *out], None),
        ("rollout", "--states with NaN", [*roll, "--states", "$T/nan.csv", *out], None),
        ("rollout", "--states out of bounds", [*roll, "--states", "$T/oob.csv", *out], None),
        ("rollout", "--states not numbers", [*roll, "--states", "$T/words.csv", *out], None),
        ("rollout", "--states with the wrong width", [*roll, "--states", "$T/wide.csv", *out], None),
        ("rollout", "--states .npy holding no state (shape (0, 4))", [*roll, "--states", "$T/empty.npy", *out], None),
        ("rollout", "garbage policy file", ["rollout", "--scenario", "CartPole-v1", "--policy", "$T/garbage.pt",
                                            "--episodes", "3", *out], None),
        ("rollout", "policy for another scenario", ["rollout", "--scenario", "CartPole-v1", "--policy", "$T/hopper.pt",
                                                    "--episodes", "3", *out], None),
        ("rollout", "malformed python: URI", ["rollout", "--scenario", "CartPole-v1", "--policy", "python:oops",
                                              "--episodes", "3", *out], None),
        ("rollout", "random: without a seed", ["rollout", "--scenario", "CartPole-v1", "--policy", "random:x",
                                               "--episodes", "3", *out], None),
        ("evaluate", "--episodes 0", ["evaluate", "--policy", BALANCER, "--scenario", "CartPole-v1",
                                      "--episodes", "0"], None),
        ("evaluate", "negative --seed", ["evaluate", "--policy", BALANCER, "--scenario", "CartPole-v1",
                                         "--seed", "-3"], None),
        ("evaluate", "zoo: path", ["evaluate", "--policy", "zoo:../../x", "--scenario", "CartPole-v1"], None),
        ("train-challenger", "--data not a run", ["train-challenger", "--data", "$T/none", "--algo", "bc"], None),
        ("train-challenger", "unknown --algo", ["train-challenger", "--data", "$T/run", "--algo", "ppo"], None),
        ("train-challenger", "--eval-episodes 0", ["train-challenger", "--data", "$T/run", "--algo", "bc",
                                                   "--eval-episodes", "0"], None),
        ("train-aut", "--resume without a checkpoint", ["train-aut", "--scenario", "CartPole-v1", "--algo", "ddqn",
                                                        "--out", "$T/aut", "--resume"], None),
        ("train-aut", "--config missing", ["train-aut", "--scenario", "CartPole-v1", "--algo", "ddqn", "--config",
                                           "$T/none.yaml", "--out", "$T/aut"], None),
        ("replay", "not a run folder", ["replay", "$T/none", "0"], None),
        ("replay", "--failure of a run without failures", ["replay", "$T/run", "999", "--failure"], None),
        ("replay", "a run without an optimality phase", ["replay", "$T/run", "0"], None),
        ("repair", "a run without bugs", ["repair", "$T/run", "--quiet"], None),
        ("repair", "--batch-size 0", ["repair", "$T/run", "--batch-size", "0"], None),
        ("repair", "--actor-lr 0", ["repair", "$T/run", "--actor-lr", "0"], None),
        ("repair", "--temp-lr -1", ["repair", "$T/run", "--temp-lr", "-1"], None),
        ("report", "no such folder", ["report", "$T/none"], None),
        ("report", "--out empty", ["report", "$T/run", "--out", ""], None),
        ("grid", "no such file", ["grid", "$T/none.yaml"], None),
        ("grid", "unknown profile", ["grid", "$T/grid.yaml", "--profile", "huge", "--dry-run"], None),
        ("grid", "an axis with no values", ["grid", "$T/grid-empty.yaml", "--dry-run"], None),
        ("stop", "--address without scheme", ["stop", "raysubmit_1", "--address", "127.0.0.1:1"], None),
        ("logs", "--address without scheme", ["logs", "raysubmit_1", "--address", "HEAD:8265"], None),
        ("submit", "--address without scheme", ["submit", C, "--address", "127.0.0.1:8265"], GOOD),
    ]
    return c


def _setup(t: Path) -> None:
    """The files the cases point at."""
    from orchestrator.campaign.config import load_campaign
    from orchestrator.campaign.pipeline import run_campaign
    from workers.policies import export_mlp_torchscript

    (t / "run.yaml").write_text(GOOD.replace("OUT", str(t / "run")))
    run_campaign(load_campaign(t / "run.yaml"), progress=False)
    (t / "userfiles").mkdir()
    (t / "userfiles" / "notes.txt").write_text("mine")
    (t / "afile").write_text("a file")
    (t / "latin1.yaml").write_bytes(b"name: caf\xe9\n")
    (t / "corrupt").mkdir()
    (t / "corrupt" / "campaign.json").write_text('{"name": "trunc')
    (t / "nan.csv").write_text("0.0,0.01,nan,0.0\n")
    (t / "oob.csv").write_text("0.0,0.0,0.3,0.0\n")
    (t / "words.csv").write_text("a,b,c,d\n")
    (t / "wide.csv").write_text("0,0,0,0,0\n")
    np.save(t / "empty.npy", np.zeros((0, 4), dtype=np.float32))
    (t / "garbage.pt").write_bytes(b"\x00not a model" * 10)
    export_mlp_torchscript(str(t / "hopper.pt"), 11, 3, hidden=(8,), discrete=False, action_low=-np.ones(3),
                           action_high=np.ones(3))
    (t / "grid.yaml").write_text(f"name: g\noutput: {t}/g\nbase: {t}/run.yaml\naxes: {{seed: [0, 1]}}\n"
                                 "profiles: {local: {set: {}}}\n")
    (t / "grid-empty.yaml").write_text(f"name: g\noutput: {t}/g\nbase: {t}/run.yaml\naxes: {{seed: []}}\n")
    _edited_runs(t)


def _edited_runs(t: Path) -> None:
    """Runs whose identity changed since they started (issue #47): campaign.json's seed or aut
    edited, the AUT file replaced by another agent."""
    import shutil

    from orchestrator.campaign.config import load_campaign
    from orchestrator.campaign.pipeline import run_campaign
    from workers.policies import export_mlp_torchscript

    for name, key, value in (("seed-edited", "seed", 1), ("aut-edited", "aut", "random:5")):
        shutil.copytree(t / "run", t / name)
        data = json.loads((t / name / "campaign.json").read_text())
        data[key] = value
        (t / name / "campaign.json").write_text(json.dumps(data))
    export_mlp_torchscript(str(t / "aut.pt"), 4, 2, hidden=(8,), seed=0)
    (t / "swap.yaml").write_text(GOOD.replace("OUT", str(t / "aut-swapped")).replace(BALANCER, str(t / "aut.pt")))
    run_campaign(load_campaign(t / "swap.yaml"), progress=False)
    export_mlp_torchscript(str(t / "aut.pt"), 4, 2, hidden=(8,), seed=1)


def _disk_full(monkeypatch) -> None:
    """Every Parquet part write fails as on a full disk (OSError ENOSPC)."""
    import errno

    from orchestrator.runs.store import RunStore

    def write(self, *a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device", str(self.root / "steps"))

    monkeypatch.setattr(RunStore, "write", write)


def _normalise(text: str, t: Path) -> str:
    text = text.replace(str(t), "$T").replace(str(REPO), "<repo>")
    text = re.sub(r"PID \d+", "PID N", text)
    text = re.sub(r"\d{8}-\d{6}-[0-9a-f]{6,8}", "RUN-ID", text)
    text = re.sub(r"0x[0-9a-f]{6,}", "0x…", text)
    text = re.sub(r"sha256 [0-9a-f]{8}… → [0-9a-f]{8}…", "sha256 SHA-A… → SHA-B…", text)  # TorchScript files differ per save
    return text


@pytest.mark.campaign
@pytest.mark.subprocess
def test_bad_input_table_is_generated_and_current(tmp_path, capsys, monkeypatch):
    """Run every bad input through `deltarl` and write docs/bad-input.md: the case, the exit code
    and the message. Fails (after rewriting the file) when the committed table differs."""
    monkeypatch.setenv("DELTARL_LLM_BASE_URL", "")
    monkeypatch.setenv("DELTARL_LLM_MODEL", "")
    monkeypatch.setenv("DELTARL_LOCAL_LLM_MODEL", str(tmp_path / "no-model.gguf"))
    monkeypatch.setenv("DELTARL_LIST_CAMPAIGN", "[1, 2]")
    monkeypatch.delenv("DELTARL_UNSET_VARIABLE", raising=False)
    monkeypatch.chdir(tmp_path)
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        # The table is what a user's fresh `deltarl` process says. The test session's shared Ray
        # cluster (conftest's ray_cluster, up when an earlier test took it) is not the user's: seen
        # from here, `workers: 4` would be checked against "this process's Ray cluster" instead of
        # "this machine (usable cores)" (CI, 2026-12-07). No case gets as far as starting Ray.
        monkeypatch.setattr(sys.modules["ray"], "is_initialized", lambda: False)
    _setup(tmp_path)
    capsys.readouterr()
    rows, seen = [], set()
    for i, (group, what, argv, text) in enumerate(_cases()):
        if text is not None:
            c = tmp_path / f"case{i:03d}.yaml"
            c.write_text(text.replace("OUT", str(tmp_path / f"out{i:03d}")).replace("$T", str(tmp_path)))
            argv = [str(c) if a == "$C" else a for a in argv]
        argv = [a.replace("$T", str(tmp_path)) for a in argv]
        before = tree_digest(tmp_path)
        with monkeypatch.context() as m:
            if what.startswith("disk full"):
                _disk_full(m)
            code, _, err = run_cli(capsys, *argv)
        lines = [ln for ln in err.strip().splitlines() if ln.strip()]
        message = lines[-1] if lines else "(nothing on stderr)"
        assert code == 2, f"{group} / {what}: exit {code}, {err[-600:]}"
        assert "Traceback" not in err, f"{group} / {what}: {err[-2000:]}"
        assert message.startswith(("deltarl: error:", "deltarl ")), f"{group} / {what}: {message}"
        after = tree_digest(tmp_path)  # nothing half-written (the campaign file of the case aside)
        assert set(after) - set(before) <= set() and all(after[k] == v for k, v in before.items()), \
            f"{group} / {what} left files: {sorted(set(after) - set(before))}"
        shown = " ".join("''" if a == "" else a for a in argv).replace(str(tmp_path), "$T")
        shown = re.sub(r"\$T/case\d{3}\.yaml", "CAMPAIGN.yaml", shown)
        rows.append((group, what, shown, code, _normalise(message, tmp_path)))
        seen.add((group, what))
    assert len(rows) == len(seen) >= 60
    stops = _stop_rows(tmp_path, capsys)  # signals and LLM servers: docs/trust.md's exit codes
    esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
    table = "\n".join(f"| {esc(g)} | {esc(w)} | `{esc(cmd)}` | {code} | {esc(m)} |" for g, w, cmd, code, m in rows)
    stop_table = "\n".join(f"| {esc(g)} | {esc(w)} | `{esc(cmd)}` | {code} | {esc(m)} |"
                           for g, w, cmd, code, m in stops)
    doc = ("# Bad input: what deltarl says\n\n"
           "Every row is a case `tests/test_robustness.py::test_bad_input_table_is_generated_and_current` runs "
           "through `deltarl`; the test writes this file and fails when it differs from what is committed, so the "
           "table cannot drift. Each case exits with code 2 and one message on stderr, without a traceback, and "
           "leaves no file behind. `CAMPAIGN.yaml` is a small valid campaign with the one change the case names; "
           "`$T` is the test's temporary folder, which holds a finished run (`$T/run`), a folder of the user's "
           "own files (`$T/userfiles`) and the input files the cases name.\n\n"
           f"{len(rows)} cases.\n\n"
           "| group | case | command | exit | message |\n|---|---|---|---|---|\n" + table + "\n\n"
           "## Stops and services\n\n"
           "Not bad input, but the same promise: one line, no traceback, and what to do next. A campaign (a long "
           "safety phase, in process) stopped by a signal after its first snapshot exits 128 + the signal's number "
           "and says how to resume; an LLM-guided campaign (`$T/stops/llmK.yaml`: LLMTester against the test's local "
           "OpenAI-compatible server, `tests/llm_server.py`) whose server stops answering after the first "
           "generation ends at `llm.phase_deadline_s` (3 s here) with exit 2 and the resume command; one whose "
           "server answers bytes that are not UTF-8 counts each as a failed call and stops at "
           "`llm.max_consecutive_failures` (3 here).\n\n"
           "| group | case | command | exit | message |\n|---|---|---|---|---|\n" + stop_table + "\n")
    path = REPO / "docs" / "bad-input.md"
    old = path.read_text() if path.is_file() else ""
    if old != doc:
        path.write_text(doc)
    assert old == doc, "docs/bad-input.md was out of date and has been regenerated: review and commit it"


@pytest.mark.subprocess
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_supervisor_leaves_no_child_behind_of_a_process_that_keeps_starting_them():
    """The race behind a dashboard process that outlived its driver: a child started after the
    supervisor's last look is orphaned when its parent is killed. Here the parent starts a child
    every 10 ms and ignores SIGTERM; when the driver's pipe closes, none of it may survive."""
    from orchestrator.cluster import watchdog

    marker = f"{os.getpid()}.{time.monotonic_ns() % 10**6}"
    code = ("import signal, subprocess, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            f"while True:\n    subprocess.Popen(['sleep', '{marker}']); time.sleep(0.01)\n")
    parent = subprocess.Popen([sys.executable, "-c", code])
    sup = watchdog.supervise([parent.pid])
    assert sup is not None
    time.sleep(1.5)  # the supervisor is watching a tree that grows every 10 ms

    def sleepers():
        out = set()
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    cmd = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if cmd[:2] == [b"sleep", marker.encode()] and "zombie" not in _state(int(name)):
                    out.add(int(name))
        return out

    assert sleepers(), "the test's parent started no children"
    os.close(sup._deltarl_pipe)  # what the driver's death does
    try:
        sup.wait(timeout=60)
        parent.wait(timeout=10)
    finally:
        parent.kill()
    time.sleep(0.5)
    left = sleepers()
    for pid in left:  # do not leave them to the next test
        os.kill(pid, 9)
    assert not left, f"{len(left)} children outlived the supervisor"
