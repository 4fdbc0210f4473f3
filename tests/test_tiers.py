"""The test tiers hold: an unmarked test that starts Ray, trains, runs a campaign phase or spawns a
process fails with the marker to add (tests/conftest.py's guard), and a marked one runs. Each case
runs the suite's own conftest on a planted test file in a pytest process of its own (pytester),
so these tests are themselves `subprocess` (the integration tier)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.subprocess

CONFTEST = (Path(__file__).parent / "conftest.py").read_text()

PLANTED = {
    "subprocess": "import subprocess\n\ndef test_x():\n    subprocess.run(['true'], check=True)\n",
    "campaign": "from orchestrator.campaign.generations import Phase\n\n"
                "class P(Phase):\n    pass\n\nP.__abstractmethods__ = frozenset()  # whatever the loop asks of a phase\n\n"
                "def test_x():\n    P(None, None, None, None, None, None, {}, {})\n",
    "training": "from d3rlpy.algos.qlearning.base import QLearningAlgoBase\n\n"
                "def test_x():\n    QLearningAlgoBase.update(object(), None)\n",
}


def _run(pytester, body: str, marker: str | None):
    pytester.makeconftest(CONFTEST)
    head = "import pytest\n\n" + (f"pytestmark = pytest.mark.{marker}\n\n" if marker else "")
    pytester.makepyfile(test_planted=head + body)
    return pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", timeout=240)


@pytest.mark.parametrize("marker", sorted(PLANTED))
def test_an_unmarked_test_that_does_integration_work_fails_naming_its_marker(pytester, marker):
    result = _run(pytester, PLANTED[marker], None)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*TierError*add @pytest.mark.{marker}*"])


def test_the_subprocess_marker_lets_it_run(pytester):
    """The guard is off under the marker (the same planted test passes)."""
    _run(pytester, PLANTED["subprocess"], "subprocess").assert_outcomes(passed=1)


def test_a_marked_test_is_deselected_from_the_unit_tier(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_planted="import pytest\n\n@pytest.mark.training\ndef test_t():\n    pass\n\n"
                                     "def test_u():\n    pass\n\ndef test_fixture(ray_cluster):\n    pass\n")
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", "-m", "not integration", timeout=240)
    result.assert_outcomes(passed=1, deselected=2)  # the ray_cluster user is `ray`, hence integration


@pytest.mark.ray
def test_an_unmarked_test_that_starts_ray_fails(pytester):
    """Ray for real, in a pytest process of its own: the unmarked test fails and Ray is shut down."""
    body = ("import ray\n\ndef test_x():\n"
            "    ray.init(num_cpus=1, include_dashboard=False, address='local')\n"
            "\ndef test_after():\n    import ray\n    assert not ray.is_initialized()\n")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_planted="import pytest\n\n" + body)
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", timeout=240)
    result.assert_outcomes(failed=1, passed=1)  # Ray's first process is refused; nothing is left running
    result.stdout.fnmatch_lines(["*TierError*starts Ray*add @pytest.mark.ray*"])
