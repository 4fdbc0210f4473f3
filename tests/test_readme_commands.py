"""README's "Using it" commands, walked in order on a fresh clone (issue 48, item 4): each one
parses, and every folder or file it reads is in the repository or written by a command above it.
A command whose prerequisite is missing fails with a message naming the command that makes it.
The ``rollout --states`` CSV reads the header ``deltarl scenarios`` prints."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np
import pytest
import yaml

from orchestrator.cli.common import UsageError

REPO = Path(__file__).resolve().parents[1]


def _using_it() -> list[str]:
    """The shell lines of README's "Using it" block, continuations joined, comments dropped."""
    text = (REPO / "README.md").read_text()
    block = re.search(r"^## Using it\n+```bash\n(.*?)^```", text, re.S | re.M).group(1)
    lines = block.replace("\\\n", " ").splitlines()
    return [re.sub(r"\s+#\s.*$", "", ln).strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def _yaml_output(path: str) -> str:
    return yaml.safe_load((REPO / path).read_text())["output"]


def _opt(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def _needs_and_makes(argv: list[str]) -> tuple[list[str], list[str]]:
    """The paths a deltarl command reads and the folders it writes (relative to the clone)."""
    cmd, rest = argv[0], argv[1:]
    out = _opt(rest, "--out")
    needs, makes = [], []
    if cmd == "run":
        if _opt(rest, "--resume"):
            needs.append(_opt(rest, "--resume"))
        else:
            needs.append(rest[0])
            makes.append(out or _yaml_output(rest[0]))
    elif cmd == "grid":
        needs.append(rest[0])
        profile = _opt(rest, "--profile")
        makes.append(out or str(Path(_yaml_output(rest[0])) / profile) if profile else out or _yaml_output(rest[0]))
    elif cmd in ("replay", "repair", "zoo-add", "report"):
        needs.append(rest[0])
        makes.append(out or rest[0])
    elif cmd == "train-challenger":
        needs.append(_opt(rest, "--data"))
        makes.append(f"{_opt(rest, '--data')}/challengers/{_opt(rest, '--algo')}")
    elif cmd in ("rollout", "train-aut", "submit"):
        if _opt(rest, "--states"):
            needs.append(_opt(rest, "--states"))
        if "--resume" in rest:
            needs.append(out)
        if out:
            makes.append(out)
    return [n for n in needs if n], [m for m in makes if m]


def test_readme_using_it_commands_parse_and_find_their_inputs_in_order():
    from orchestrator.cli import build_parser

    lines = _using_it()
    assert sum(ln.startswith("deltarl ") or " deltarl " in ln for ln in lines) >= 20
    made: list[Path] = []
    for line in lines:
        words = shlex.split(line)
        redirect = re.search(r">\s*(\S+)$", line)
        if words[0] == "printf" and redirect:
            made.append(Path(redirect.group(1)))
            continue
        while words and re.match(r"^[A-Z_]+=", words[0]):  # environment variables before the command
            words = words[1:]
        if not words or words[0] != "deltarl":
            continue
        argv = words[1:]
        if "--help" in argv:
            continue
        try:
            build_parser().parse_args(argv)
        except SystemExit as exc:  # argparse refused it
            pytest.fail(f"README command does not parse (exit {exc.code}): {line}")
        needs, makes = _needs_and_makes(argv)
        for n in needs:
            p = Path(n)
            ok = (REPO / p).exists() or any(p == m or m in p.parents for m in made)
            assert ok, f"README: `{line}` reads {n}, which is neither in a fresh clone nor written above it"
        made += [Path(m) for m in makes]


# -- the same commands run, in README order, in a fresh clone with small budgets ----------------------

SMALL = {  # campaign files of the clone, at laptop-test budgets (the commands stay as README gives them)
    "experiments/campaigns/cartpole-curefuzz.yaml": {"workers": 0, "safety.budget": {"episodes": 128}},
    # the quick start as shipped but for the card's evaluation: README replays its bug 0, and at 128
    # test cases a near-flawless AUT leaves no bug to replay (a run that finds none cannot test it)
    "experiments/quickstart.yaml": {"challenger.eval_episodes": 5},
    "experiments/campaigns/acrobot-llmtester.yaml": {"workers": 0, "safety.budget": {"episodes": 32},
                                                     "llm.max_retries": 0},
}


def _shrink(clone: Path) -> None:
    for rel, changes in SMALL.items():
        data = yaml.safe_load((clone / rel).read_text())
        for key, value in changes.items():
            *parents, last = key.split(".")
            node = data
            for k in parents:
                node = node[k]
            node[last] = value
        (clone / rel).write_text(yaml.safe_dump(data, sort_keys=False))


def _small_argv(argv: list[str], tmp: Path, free_url: str) -> tuple[list[str], str | None]:
    """README's command with small budgets, and the words its output must hold when it is
    expected to fail for want of a prerequisite the README names (None: it must succeed)."""
    cmd = argv[0]
    argv = list(argv)

    def setopt(flag, value):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv.extend([flag, value])

    if cmd in ("rollout", "evaluate") and "--episodes" in argv:
        setopt("--episodes", "4" if cmd == "rollout" else "10")
    elif cmd == "train-aut":
        setopt("--steps", "1000" if "--resume" in argv else "500")
        argv += ["--eval-episodes", "2", "--quiet"]
    elif cmd == "train-challenger":
        argv += ["--steps", "100", "--eval-episodes", "3", "--quiet"]
    elif cmd == "repair":
        argv += ["--steps", "5", "--eval-episodes", "3", "--quiet"]
    elif cmd == "grid":  # minutes to days of campaigns each (the `run` lines above run one): expanded, not run
        argv.append("--dry-run")
    elif cmd == "report" and "runs/grids/" in argv[1]:
        return argv, "deltarl grid experiments/delta/rq2-rq3-methods.yaml --profile local"  # never ran (dry-run)
    elif cmd == "report":
        setopt("--out", str(tmp / "rq2-rq3"))
    elif cmd == "run" and "llmtester" in argv[1]:  # its endpoint, swapped for a local port with no server
        return argv + ["--quiet"], f"cannot reach the LLM endpoint {free_url}/v1"
    elif cmd == "submit":
        setopt("--address", free_url)
        return argv, free_url  # no head there: the message names the address it tried
    if cmd in ("run",):
        argv.append("--quiet")
    return argv, None


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.subprocess
@pytest.mark.campaign
@pytest.mark.training
@pytest.mark.ray
@pytest.mark.slow
def test_readme_using_it_commands_run_in_order_in_a_fresh_clone(tmp_path):
    """``git clone`` of the repository; every line of README's "Using it" block run in order in it,
    as written, with small budgets (the campaign files at 128 episodes, fewer steps and episodes
    on the command line); the grids listed (``--dry-run``), so the report of a grid that never ran
    names the grid to run; the LLM and ``submit`` lines, whose prerequisites are an LLM endpoint
    and a cluster, fail naming them (both swapped for a free port on 127.0.0.1: no network). Each must exit 0 otherwise."""
    import os
    import subprocess
    import sys
    import tempfile
    import time

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--shared", str(REPO), str(clone)], check=True, timeout=120)
    _shrink(clone)
    short = Path(tempfile.mkdtemp(prefix="drr", dir="/tmp"))  # a Ray of its own (socket paths stay short)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "OPENAI_API_KEY", "MLFLOW_TRACKING_URI")}
    env.update(PYTHONPATH=str(clone), RAY_TMPDIR=str(short), RAY_USAGE_STATS_ENABLED="0", DELTARL_DASHBOARD="0")
    free_url = f"http://127.0.0.1:{_free_port()}"
    walked = []
    try:
        for line in _using_it():
            words = shlex.split(line)
            if words[0] == "." or words[0] == "mlflow":  # the venv (this interpreter); a server (below)
                if words[0] == "mlflow":
                    assert (clone / words[words.index("--backend-store-uri") + 1][len("sqlite:///"):]).is_file()
                continue
            if words[0] == "printf":
                subprocess.run(line, shell=True, cwd=clone, check=True, timeout=30)
                continue
            cmd_env = dict(env)
            while re.match(r"^[A-Z_]+=", words[0]):
                k, v = words.pop(0).split("=", 1)
                cmd_env[k] = f"{free_url}/v1" if k == "DELTARL_LLM_BASE_URL" else v
            assert words[0] == "deltarl", line
            argv, must_fail = _small_argv(words[1:], tmp_path, free_url)
            t0 = time.monotonic()
            r = subprocess.run([sys.executable, "-m", "orchestrator.cli", *argv], cwd=clone, env=cmd_env,
                               capture_output=True, text=True, timeout=600)
            walked.append((round(time.monotonic() - t0, 1), r.returncode, " ".join(argv)))
            out = r.stdout + r.stderr
            if must_fail is None:
                assert r.returncode == 0, f"README: `{line}` ran as `{' '.join(argv)}`: exit {r.returncode}\n{out[-3000:]}"
                assert "Traceback" not in out, out[-3000:]
            else:
                assert r.returncode != 0 and must_fail in out and "Traceback" not in out, \
                    f"README: `{line}` should fail naming {must_fail!r}: exit {r.returncode}\n{out[-3000:]}"
        if any(w[2].startswith("ray up") for w in walked):
            r = subprocess.run([sys.executable, "-m", "orchestrator.cli", "ray", "down"], cwd=clone, env=env,
                               capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stdout + r.stderr
    finally:
        print("\n".join(f"{s:7.1f} s  exit {rc}  deltarl {a}" for s, rc, a in walked))
        subprocess.run([sys.executable, "-m", "orchestrator.cli", "ray", "down"], cwd=clone, env=env,
                       capture_output=True, timeout=120)
        subprocess.run(["rm", "-rf", str(short)], check=False)
    ran = [a for _, _, a in walked]
    assert len(ran) >= 20 and ran[-1].startswith("ray up"), ran
    # what the commands left where README says
    assert (clone / "runs/quickstart/videos/bug-0.gif").is_file()
    assert (clone / "runs/cartpole-curefuzz/challengers/bcq/card.json").is_file()
    assert (clone / "runs/quickstart/repair/repair.json").is_file()
    assert (tmp_path / "rq2-rq3" / "report.md").is_file()


def test_report_of_a_grid_that_never_ran_names_the_grid_to_run(tmp_path, monkeypatch):
    from orchestrator.analysis.report_data import ReportError, collect

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ReportError) as err:
        collect("runs/grids/delta-rq2-rq3/local")
    msg = str(err.value)
    assert "does not exist" in msg
    assert "deltarl grid experiments/delta/rq2-rq3-methods.yaml --profile local" in msg
    assert "experiments/results/delta-local-rq2-rq3" in msg and (REPO / "experiments/results/delta-local-rq2-rq3").is_dir()


# -- rollout --states: the CSV format ----------------------------------------------------------------

def _printed_names(capsys, scenario: str) -> list[str]:
    """The state names `deltarl scenarios` prints for ``scenario``."""
    from orchestrator.cli import main

    assert main(["scenarios"]) == 0
    out = capsys.readouterr().out
    block = out.split(f"{scenario}  (", 1)[1].split("\n\n", 1)[0]
    return [ln.split()[0] for ln in block.splitlines()[2:] if ln.startswith("    ")]


def test_states_csv_reads_the_header_deltarl_scenarios_prints(tmp_path, capsys):
    from envs import get_scenario
    from orchestrator.cli.engine import _load_states

    sc = get_scenario("CartPole-v1")
    names = _printed_names(capsys, "CartPole-v1")
    assert names == list(sc.state_names) == ["x", "x_dot", "theta", "theta_dot"]
    want = np.array([[0.01, 0.0, 0.02, 0.0], [-0.02, 0.01, 0.0, 0.03]])
    f = tmp_path / "s.csv"
    f.write_text(",".join(names) + "\n" + "\n".join(",".join(map(str, r)) for r in want) + "\n")
    np.testing.assert_array_equal(_load_states(str(f), sc), want)
    # any column order, s_<name> as in failures.parquet, comments and blank lines
    f.write_text("# picked by hand\ntheta_dot,s_theta,x,x_dot\n\n0,0.02,0.01,0\n0.03,0,-0.02,0.01\n")
    np.testing.assert_array_equal(_load_states(str(f), sc), want)
    # numbers only, as before
    f.write_text("0.01,0,0.02,0\n-0.02,0.01,0,0.03\n")
    np.testing.assert_array_equal(_load_states(str(f), sc), want)


def test_states_csv_with_a_foreign_header_names_the_expected_one(tmp_path):
    from envs import get_scenario
    from orchestrator.cli.engine import _load_states

    f = tmp_path / "s.csv"
    f.write_text("a,b,c,d\n1,2,3,4\n")
    with pytest.raises(UsageError, match="x,x_dot,theta,theta_dot"):
        _load_states(str(f), get_scenario("CartPole-v1"))
    f.write_text("x,x_dot,theta,theta_dot\n0.01,zero,0,0\n")
    with pytest.raises(UsageError, match="could not read it"):
        _load_states(str(f), get_scenario("CartPole-v1"))


def test_rollout_help_documents_the_states_csv(capsys):
    from orchestrator.cli import main

    with pytest.raises(SystemExit):
        main(["rollout", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "header of the state names `deltarl scenarios` prints" in text and ".npy" in text


# -- the committed reports README points at: the seed is the unit, the answer first ----------------

@pytest.mark.slow
def test_rq1_report_opens_with_its_answer_and_counts_seeds_not_campaigns(tmp_path):
    """delta-paper-cases-rq1: 5 seeds x 3 challengers on one safety run per seed. The answer
    leads; Table 6 and the over-time lines are per challenger, n=5 each (not 15 pooled)."""
    from orchestrator.analysis.report import write_report

    md = Path(write_report(REPO / "experiments/results/delta-paper-cases-rq1", tmp_path)["markdown"]).read_text()
    heads = [ln for ln in md.splitlines() if ln.startswith("## ")]
    assert heads[0].startswith("## The answer: does Delta find optimality bugs")
    answer = md.split(heads[0], 1)[1].split("\n## ", 1)[0]
    assert "| CartPole-v1 | yes | BC " in answer and "(n=5)" in answer and "(n=15)" not in answer
    table6 = md.split("Behaviour clustering (Delta Sec. 6.1, Table 6)", 1)[1].split("\n### ", 1)[0]
    assert "| τ | ours, BC challenger | ours, BCQ challenger | ours, CQL challenger | paper (Delta) |" in table6
    assert "(n=15)" not in table6 and table6.count("(n=5)") == 9
    assert "one line per challenger: n in the legend counts seeds" in md
