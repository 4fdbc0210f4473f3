"""What a person sees, checked in headless Chromium (``tests/browser.py``): the Ray dashboard of a
running campaign, logged into with its token, lists the campaign's actors by name and shows its
progress; its first page (Overview) names the campaign, its current phase and its latest progress
while it runs, for the safety, challenger and optimality phases; the MLflow UI, opened at the address ``deltarl run`` prints, shows the experiment's run
and its findings first. (The report's pages are checked in ``tests/test_report.py``.)

Both start real servers on 127.0.0.1 (a Ray cluster with its dashboard in a ``deltarl run``
subprocess; ``mlflow ui``) and wait for them with bounded timeouts.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from browser import Browser

REPO = Path(__file__).resolve().parents[1]


def _wait_for_line(path: Path, pattern: str, proc: subprocess.Popen, timeout: float) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(pattern, path.read_text(errors="replace")) if path.exists() else None
        if m:
            return m
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    raise AssertionError(f"no {pattern!r} within {timeout:.0f} s (exit {proc.poll()}); stderr ends: "
                         f"{path.read_text(errors='replace')[-3000:] if path.exists() else ''}")


def _stop(proc: subprocess.Popen, session_dir: Path) -> None:
    """End the campaign kept up with --keep-dashboard and remove its short Ray session folder."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # --keep-dashboard ends on Ctrl-C; Ray shuts down with the driver
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
    for _ in range(3):  # Ray's last processes may still be leaving their session folder
        shutil.rmtree(session_dir, ignore_errors=True)
        if not session_dir.exists():
            break
        time.sleep(2)


@pytest.mark.slow
def test_dashboard_lists_the_campaign_actors_after_logging_in_with_the_token(tmp_path):
    """``deltarl run --keep-dashboard`` on a campaign with two rollout actors: it prints the
    address Ray bound and how to log in; the dashboard asks for the token; with it, the Actors
    page lists ``NAME/safety/rollout-0`` and ``-1`` and the campaign's progress actor, whose task
    history holds the progress."""
    token = secrets.token_hex(16)
    short = Path(tempfile.mkdtemp(prefix="drd", dir="/tmp"))  # a Ray of its own (socket paths stay short)
    name = f"dash-{secrets.token_hex(3)}"
    camp = tmp_path / "c.yaml"
    camp.write_text(f"name: {name}\nscenario: CartPole-v1\naut: random:0\nworkers: 2\nseed: 0\nmlflow: false\n"
                    f"output: {tmp_path / 'run'}\n"
                    "safety: {fuzzer: curefuzz, budget: {episodes: 128}, generation_size: 32}\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_TMPDIR": str(short), "DELTARL_DASHBOARD": "1",
           "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    err = tmp_path / "stderr.log"
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "run", str(camp), "--quiet",
                             "--keep-dashboard", "300"], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=open(err, "wb"), start_new_session=True)
    try:
        url = _wait_for_line(err, r"Ray dashboard: (http://127\.0\.0\.1:\d+)", proc, 240).group(1)
        assert "RAY_AUTH_TOKEN" in err.read_text()  # how to log in is printed beside the address
        _wait_for_line(err, r"kept up at " + re.escape(url), proc, 240)
        with Browser(tmp_path) as b:
            page = b.page(url + "/")
            # the token dialog over the dashboard, as a person sees it; paste the token, submit
            page.wait_for("document.body.innerText.includes('Authentication Token Required')", timeout=60)
            page.wait_for("!!document.querySelector('input[type=password]')", timeout=30)
            page.type_into("input[type=password]", token)
            page.wait_for("!!Array.from(document.querySelectorAll('button')).find(b => /submit/i.test(b.innerText) "
                          "&& !b.disabled)", timeout=10)
            page.eval("Array.from(document.querySelectorAll('button')).find(b => /submit/i.test(b.innerText)).click()")
            page.wait_for("!document.querySelector('input[type=password]')", timeout=30)
            page.goto(url + "/#/actors")
            text = page.wait_for(f"document.body.innerText.includes('{name}/safety/rollout-1') && "
                                 "document.body.innerText", timeout=60)
            for expected in (f"{name}/safety/rollout-0", f"{name}/safety/rollout-1", "RolloutWorker",
                             f"deltarl/{name}/progress", "CampaignProgress", f"deltarl campaign {name}"):
                assert expected in text, expected
            # the progress actor's page: its task history names the progress of every generation
            href = page.eval(f"""Array.from(document.querySelectorAll('tr')).filter(r => r.innerText.includes(
                'deltarl/{name}/progress')).map(r => Array.from(r.querySelectorAll('a')).map(a => a.href)
                .find(h => h.includes('/actors/'))).pop()""")
            page.goto(href)
            page.wait_for("document.body.innerText.includes('Tasks History')", timeout=30)
            xy = page.eval("""(() => { const e = Array.from(document.querySelectorAll('*')).filter(e =>
                (e.textContent || '').trim() === 'Tasks History').pop(); e.scrollIntoView();
                const r = e.getBoundingClientRect(); return [r.x + 5, r.y + r.height / 2]; })()""")
            page.click_at(*xy)
            page.wait_for("document.body.innerText.includes('safety: 128/128 episodes')", timeout=60)
        assert proc.poll() is None  # still up: --keep-dashboard
    finally:
        _stop(proc, short)


LIVE_CAMPAIGN = """
name: {name}
scenario: CartPole-v1
aut: zoo:CartPole-v1-ddqn-paper
workers: 1
seed: 0
mlflow: false
output: {out}
safety:
  fuzzer: curefuzz
  budget: {{seconds: 10}}
  generation_size: 32
challenger:
  algos: [bc]
  steps: 300
  eval_episodes: 3
optimality:
  fuzzer: delta
  budget: {{seconds: 10}}
  generation_size: 16
"""

PHASES = ("safety", "challenger", "optimality")


def _newest_event(url: str, name: str) -> str | None:
    """The newest of the campaign's events, as the dashboard's ``/events`` serves them."""
    import json
    import urllib.request

    try:
        body = json.loads(urllib.request.urlopen(url + "/events", timeout=5).read())
    except OSError:
        return None
    ours = [(int(e["timestamp"]), e["message"]) for events in body["data"]["events"].values() for e in events
            if e["message"].startswith(f"deltarl {name}: ")]
    return max(ours)[1] if ours else None


@pytest.mark.subprocess
@pytest.mark.ray
@pytest.mark.campaign
@pytest.mark.training
@pytest.mark.slow
def test_the_overview_page_shows_the_campaign_phase_and_progress_while_it_runs(tmp_path):
    """``deltarl run`` of a small real campaign (safety 10 s, a BC challenger of 300 steps,
    optimality 10 s) on its local Ray cluster with the dashboard: while it runs, the dashboard's
    first page (Overview, its Events list, newest first) names the campaign, the phase it is in
    and its latest progress, for each of the three phases (a screenshot each in the test's tmp
    folder, ``overview-<phase>.png``); the Jobs page names the job after the campaign."""
    short = Path(tempfile.mkdtemp(prefix="drl", dir="/tmp"))  # a Ray of its own (socket paths stay short)
    name = f"live-{secrets.token_hex(3)}"
    camp = tmp_path / "c.yaml"
    camp.write_text(LIVE_CAMPAIGN.format(name=name, out=tmp_path / "run"))
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_TMPDIR": str(short), "DELTARL_DASHBOARD": "1",
           "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}  # the token dialog: the test above
    env.pop("RAY_ADDRESS", None)
    err = tmp_path / "stderr.log"
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "run", str(camp), "--quiet",
                             "--keep-dashboard", "120"], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=open(err, "wb"), start_new_session=True)
    seen: dict[str, str] = {}  # phase -> the Overview's newest line of the campaign while in that phase
    try:
        url = _wait_for_line(err, r"Ray dashboard: (http://127\.0\.0\.1:\d+)", proc, 240).group(1)
        with Browser(tmp_path, height=1400) as b:
            page = b.page(url + "/#/overview")
            page.wait_for("document.body.innerText.includes('Recent jobs')", timeout=60)
            deadline = time.monotonic() + 400
            while len(seen) < len(PHASES) and time.monotonic() < deadline and "kept up at" not in err.read_text():
                newest = _newest_event(url, name)
                phase = next((p for p in PHASES if newest and newest.startswith(f"deltarl {name}: {p} phase: ")), None)
                if phase is None or phase in seen:
                    time.sleep(1)
                    continue
                page.call("Page.reload")  # the Events list is read when the page opens
                page.wait_for("document.readyState === 'complete'", timeout=60)
                first = f"Array.from(document.querySelectorAll('pre')).find(e => e.innerText.startsWith('deltarl {name}: '))"
                shown = page.wait_for(f"({first} || {{}}).innerText", timeout=60)  # events newest first
                page.eval(f"{first}.scrollIntoView({{block: 'start'}}); window.scrollBy(0, -300)")  # with the heading
                page.screenshot(tmp_path / f"overview-{phase}.png")
                seen[phase] = shown
            page.goto(url + "/#/jobs")
            jobs = page.wait_for(f"document.body.innerText.includes('deltarl {name}') && document.body.innerText",
                                 timeout=60)
            page.screenshot(tmp_path / "jobs.png")
        _wait_for_line(err, r"kept up at " + re.escape(url), proc, 300)
    finally:
        _stop(proc, short)
    assert set(seen) == set(PHASES), (seen, err.read_text()[-3000:])
    # the newest line on the page is the phase the campaign was in, with its progress
    assert re.fullmatch(rf"deltarl {name}: safety phase: \d+/10 s, \d+ failures", seen["safety"]), seen
    assert re.fullmatch(rf"deltarl {name}: challenger phase: bc: (training|\d+/300 steps)", seen["challenger"]), seen
    assert re.fullmatch(rf"deltarl {name}: optimality phase: \d+/10 s, \d+ bugs", seen["optimality"]), seen
    assert f"deltarl {name}" in jobs  # the Jobs page's Name column
    for phase in PHASES:
        assert (tmp_path / f"overview-{phase}.png").stat().st_size > 10_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_mlflow_ui_opens_the_experiment_on_its_runs_and_findings(tmp_path):
    """A campaign with MLflow; ``mlflow ui`` on its database; the address ``deltarl run`` prints
    opens the experiment's runs (not MLflow 3's GenAI view), with the ``findings/`` charts
    (failures over the episodes) first; no parameter is the string "None"."""
    import mlflow

    from orchestrator.campaign.config import load_campaign
    from orchestrator.campaign.pipeline import run_campaign, summary_table

    camp = tmp_path / "c.yaml"
    camp.write_text(f"name: ml-ui\nscenario: CartPole-v1\naut: random:0\nworkers: 0\nseed: 0\nmlflow: true\n"
                    f"output: {tmp_path / 'run'}\n"
                    "safety: {fuzzer: curefuzz, budget: {episodes: 48}, generation_size: 16}\n")
    results = run_campaign(load_campaign(camp), progress=False)
    printed = summary_table(results)
    db = tmp_path / "run" / "mlflow.db"
    assert f"mlflow ui --backend-store-uri sqlite:///{db.resolve()}" in printed
    address = re.search(r"safety: (http://127\.0\.0\.1:5000/\S+)", printed).group(1)
    assert "workflowType=machine_learning" in address
    client = mlflow.MlflowClient(f"sqlite:///{db}")
    exp = client.get_experiment_by_name("safety")
    assert exp.tags.get("mlflow.experimentKind") == "custom_model_development"
    run = client.search_runs([exp.experiment_id])[0]
    assert run.data.params and not [k for k, v in run.data.params.items() if v == "None"]
    assert [m.value for m in client.get_metric_history(run.info.run_id, "findings/failures")]

    port = _free_port()
    log = tmp_path / "mlflow-ui.log"
    # the UI `mlflow ui` serves, with one server process (`mlflow ui` starts four: minutes on 2 busy cores)
    ui = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{db}",
                           "--host", "127.0.0.1", "--port", str(port), "--workers", "1"], cwd=tmp_path,
                          env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},  # no job runner process
                          stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        import urllib.request

        deadline = time.monotonic() + 180
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                assert ui.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(1)
        with Browser(tmp_path) as b:
            page = b.page(address.replace(":5000/", f":{port}/"))
            text = page.wait_for("document.body.innerText.includes('ml-ui-curefuzz') && "
                                 "document.body.innerText.includes('failures') && document.body.innerText", timeout=90)
            # the runs view, not the GenAI overview (Observability, Usage, Quality, Tool calls)
            assert "/runs" in page.eval("location.href") and "1 matching run" in text
            assert "Observability" not in text and "Tool calls" not in text
            # the findings section (failures, distinct failures) before the other metrics
            assert "findings" in text and text.index("findings") < text.index("Model metrics"), text[:2000]
            page.screenshot(tmp_path / "mlflow.png")
    finally:
        os.killpg(ui.pid, signal.SIGTERM)
        try:
            ui.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(ui.pid, signal.SIGKILL)
            ui.wait(timeout=30)
