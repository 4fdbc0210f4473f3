"""The maps of the results stay complete: experiments/results/README.md lists every entry at the top
of experiments/results/ (and every path it names exists), benchmarks/README.md lists every script
in benchmarks/, the data folder holds no script, and every experiments/results path the code and
docs name exists (so a moved result cannot leave a dangling reference behind)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "experiments" / "results"
BENCHMARKS = REPO / "benchmarks"

LINK = re.compile(r"\]\(([^)\s]+)\)")
# a repository path in prose or in a command: benchmarks/x.py, experiments/delta/y.yaml, ...
REPO_PATH = re.compile(r"(?<![\w./-])((?:benchmarks|experiments|docs|tests|orchestrator|workers|envs)/[\w./*<>{}$-]*[\w*/>}])")
PLACEHOLDER = re.compile(r"\b(?!README\b)[A-Z][A-Z_]{2,}\b")  # SCENARIO, RUN_DIR, FOLDER: a pattern, not a path
SCRIPT = re.compile(r"`([\w.-]+\.(?:py|sh))`")


def _links(text: str) -> list[str]:
    out = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        out.append(target.split("#", 1)[0])
    return out


def _exists(repo: Path, token: str) -> bool:
    """A path exists; one with a wildcard matches at least one path."""
    if "*" in token:
        return any(repo.glob(token.rstrip("/")))
    return (repo / token).exists()


def _named_paths(text: str) -> list[str]:
    """The repository paths a page names (placeholders and folder globs like runs/... left out)."""
    return [t for t in REPO_PATH.findall(text) if not PLACEHOLDER.search(t) and not re.search(r"[<>{}$]", t)]


def results_problems(results: Path = RESULTS, repo: Path = REPO) -> list[str]:
    """What makes experiments/results/README.md incomplete or wrong (empty: nothing)."""
    readme = results / "README.md"
    if not readme.is_file():
        return ["experiments/results/README.md is missing"]
    text = readme.read_text()
    links = _links(text)
    problems = [f"README.md links {t}, which does not exist" for t in links if not (results / t).exists()]
    problems += [f"README.md names {t}, which does not exist" for t in _named_paths(text) if not _exists(repo, t)]
    listed = {Path(t).parts[0] for t in links if t and not t.startswith("..")}
    for entry in sorted(results.iterdir()):
        if entry.name == "README.md" or entry.name.startswith("."):
            continue
        if entry.name not in listed:
            problems.append(f"{entry.name}: not listed (as a link) in experiments/results/README.md")
    for script in sorted(results.rglob("*.py")):
        problems.append(f"{script.relative_to(results)}: a script in the data folder (scripts live in benchmarks/)")
    return problems


def benchmarks_problems(bench: Path = BENCHMARKS, repo: Path = REPO) -> list[str]:
    """What makes benchmarks/README.md incomplete or wrong (empty: nothing)."""
    readme = bench / "README.md"
    if not readme.is_file():
        return ["benchmarks/README.md is missing"]
    text = readme.read_text()
    listed = set(SCRIPT.findall(text))
    problems = [f"{p.name}: not listed in benchmarks/README.md" for p in sorted(bench.iterdir())
                if p.suffix in (".py", ".sh") and p.name not in listed]
    problems += [f"README.md lists {name}, which is not in benchmarks/" for name in sorted(listed)
                 if not (bench / name).is_file()]
    problems += [f"README.md names {t}, which does not exist" for t in _named_paths(text) if not _exists(repo, t)]
    problems += [f"README.md links {t}, which does not exist" for t in _links(text) if not (bench / t).exists()]
    return problems


def dangling_references(repo: Path = REPO) -> list[str]:
    """experiments/results paths named by the docs, the code and the grid files that do not exist,
    and relative links of the results' own pages that lead nowhere. Left out: the archive (it
    quotes the commands of runs made before it moved) and generated reports (their source line
    records where they were made)."""
    files = [repo / "README.md", *repo.glob("docs/*.md"), *repo.glob("tests/*.py"), *repo.glob("benchmarks/*"),
             *repo.glob("orchestrator/**/*.py"), *repo.glob("workers/**/*.py"), *repo.glob("envs/**/*.py"),
             *repo.glob("experiments/**/*.yaml")]
    results = repo / "experiments" / "results"
    pages = [p for p in results.rglob("*.md") if p.name != "report.md"]
    files += [p for p in pages if "archive" not in p.relative_to(results).parts]
    token = re.compile(r"(?:\.\./)*(experiments/results/[\w./*<>{}$-]*[\w*/>}])")
    bad = []
    for f in files:
        if not f.is_file() or f.name == Path(__file__).name:  # this file plants dangling paths on purpose
            continue
        for i, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            for t in token.findall(line):
                if not re.search(r"[<>{}$]", t) and not PLACEHOLDER.search(t) and not _exists(repo, t):
                    bad.append(f"{f.relative_to(repo)}:{i}: {t}")
    for page in pages:
        for t in _links(page.read_text()):
            if t and not (page.parent / t).exists():
                bad.append(f"{page.relative_to(repo)}: link {t}")
    return bad


def test_the_results_map_lists_every_entry_and_names_only_what_exists():
    assert results_problems() == []


def test_the_benchmarks_map_lists_every_script():
    assert benchmarks_problems() == []


def test_no_moved_result_leaves_a_dangling_reference():
    assert dangling_references() == []


def _mirror(src: Path, dst: Path, *, leave_out: tuple[str, ...] = ()) -> None:
    """dst holds src's README and a symbolic link to each of its other entries."""
    dst.mkdir(parents=True)
    shutil.copy(src / "README.md", dst / "README.md")
    for entry in src.iterdir():
        if entry.name not in ("README.md", *leave_out):
            (dst / entry.name).symlink_to(entry)


def test_the_checks_fail_on_a_planted_entry_a_script_and_a_missing_path(tmp_path):
    """The checks above can fail: against the real maps, an unlisted result, a script in the data
    folder, a listed folder that is gone, an unlisted benchmark and a listed one that is gone are
    each reported, and a dangling reference in a doc is found."""
    bench = tmp_path / "benchmarks"
    _mirror(BENCHMARKS, bench, leave_out=("act_alone.py",))
    (tmp_path / "docs").symlink_to(REPO / "docs")  # the results map links docs/results.md
    results = tmp_path / "experiments" / "results"
    _mirror(RESULTS, results, leave_out=("delta-table5",))
    (results / "planted.md").write_text("a result nobody listed\n")
    (results / "helper.py").write_text("print(1)\n")
    problems = results_problems(results, REPO)
    assert "planted.md: not listed (as a link) in experiments/results/README.md" in problems
    assert "helper.py: not listed (as a link) in experiments/results/README.md" in problems
    assert "helper.py: a script in the data folder (scripts live in benchmarks/)" in problems
    assert "README.md links delta-table5/README.md, which does not exist" in problems
    assert "README.md links delta-table5/table5.md, which does not exist" in problems
    assert len(problems) == 5, problems  # and nothing else

    (bench / "new_bench.py").write_text("print(1)\n")
    (bench / "run_me.sh").write_text("echo 1\n")
    assert benchmarks_problems(bench, REPO) == ["new_bench.py: not listed in benchmarks/README.md",
                                                "run_me.sh: not listed in benchmarks/README.md",
                                                "README.md lists act_alone.py, which is not in benchmarks/"]

    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    (repo / "docs" / "x.md").write_text("see experiments/results/moved-away.md, experiments/results/<folder>\n")
    (repo / "experiments" / "results" / "kept").mkdir(parents=True)
    (repo / "experiments" / "results" / "kept" / "README.md").write_text("[up](../gone.md) [here](README.md)\n")
    (repo / "README.md").write_text("experiments/results/kept/README.md and ../experiments/results/kept\n")
    assert dangling_references(repo) == ["docs/x.md:1: experiments/results/moved-away.md",
                                         "experiments/results/kept/README.md: link ../gone.md"]
