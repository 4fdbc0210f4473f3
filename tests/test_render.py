"""Bugs you can see: ``deltarl replay RUN BUG_ID --video`` renders the AUT's and the challenger's
episodes from a confirmed bug's state side by side, in the scenario's reference gymnasium
environment, for CartPole, Acrobot, MountainCar, Hopper (MuJoCo offscreen) and BipedalWalker
(Box2D); the episodes drawn are the recorded ones (same returns)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from orchestrator.campaign.config import load_campaign
from orchestrator.campaign.pipeline import run_campaign

# a challenger that beats the AUT somewhere: random vs random on CartPole, Hopper and
# BipedalWalker; the zoo agent against a random AUT on Acrobot and MountainCar (random never
# reaches their goal, so random vs random gives no bug)
CASES = {  # scenario: (challenger, test cases)
    "CartPole-v1": ("random:1", 16),
    "Acrobot-v1": ("zoo:Acrobot-v1", 8),
    "MountainCar-v0": ("zoo:MountainCar-v0", 8),
    "Hopper-v5": ("random:1", 16),
    "BipedalWalker": ("random:1", 8),
}


def _campaign(tmp: Path, scenario: str, challenger: str, budget: int = 16) -> Path:
    """A small optimality campaign; the differential oracle (one rollout per agent and state) on
    the stochastic BipedalWalker too, to keep it short (the video shows repeat 0 either way)."""
    p = tmp / f"{scenario}.yaml"
    p.write_text(f"""
name: video-{scenario}
scenario: {scenario}
aut: "random:0"
workers: 0
seed: 0
output: {tmp / scenario}
mlflow: false
safety: null
optimality: {{fuzzer: random, challenger: "{challenger}", oracle: differential, budget: {{episodes: {budget}}},
             generation_size: {budget}}}
""")
    return p


@pytest.mark.slow
@pytest.mark.parametrize("scenario", list(CASES))
def test_replay_video_of_a_bug(scenario, tmp_path, capsys):
    from orchestrator.cli import main
    from orchestrator.runs.layout import RunFolder

    res = run_campaign(load_campaign(_campaign(tmp_path, scenario, *CASES[scenario])), progress=False)
    assert res["optimality"]["bugs"] > 0, "the campaign must find a bug to render"
    bugs = RunFolder(tmp_path / scenario).bugs()
    bug = bugs.iloc[int(np.argmax(bugs["ca_return"] - bugs["aut_return"]))]
    bug_id = int(bug["bug_id"])
    assert main(["replay", str(tmp_path / scenario), str(bug_id), "--video"]) == 0
    out = capsys.readouterr().out
    gif = tmp_path / scenario / "videos" / f"bug-{bug_id}.gif"
    assert f"video   {gif}" in out and gif.is_file()
    im = Image.open(gif)
    assert im.format == "GIF" and im.n_frames >= 2
    assert im.width > 2 * 150 and im.height > 150  # two panels side by side
    # frames differ: the episodes move
    im.seek(0)
    first = np.asarray(im.convert("RGB"), dtype=float)
    im.seek(im.n_frames - 1)
    last = np.asarray(im.convert("RGB"), dtype=float)
    assert np.abs(first - last).mean() > 0.5
    # the drawn episodes are the recorded ones (repeat 0; recorded returns are means over repeats)
    from orchestrator.campaign.replay import bug_video

    v = bug_video(tmp_path / scenario, bug_id, tmp_path / "again.gif", max_frames=8)
    if v["repeats"] == 1:
        assert v["same_as_recorded"], (v["returns"], v["recorded"])
    assert v["returns"]["challenger"] > v["returns"]["AUT"] or v["repeats"] > 1
    assert Image.open(tmp_path / "again.gif").n_frames <= 10


def test_side_by_side_clock_and_failure_marks():
    """Two episodes of different lengths share one clock; the shorter holds its last frame."""
    from workers.render import Episode, side_by_side_frames

    def ep(n, failure):
        e = Episode(actions=[0] * n, cumulative=list(np.arange(1, n + 1, dtype=float)), total=float(n), length=n,
                    terminated=failure, failure=failure)
        e.frames = {t: np.full((40, 60, 3), 10 * t % 255, np.uint8) for t in range(0, n + 1, 2)} | {
            n: np.full((40, 60, 3), 200, np.uint8)}
        return e

    frames = side_by_side_frames([("AUT", ep(5, True)), ("challenger", ep(9, False))], title="t")
    assert len(frames) == len({0, 2, 4, 5, 6, 8, 9})
    assert frames[0].size == (60 + 6 + 60, 40 + 34)


def test_highway_frames_are_drawn():
    """gym:highway-v0 (pygame drawing, highway-env): the rendered frames show the road and the vehicles,
    not a uniform (black) image, and they change as the vehicles move; a renderer that draws blank frames
    is refused by name rather than making a black video."""
    import os

    from envs import get_scenario
    from workers.policies import load_policy
    from workers.render import PANEL_HEIGHT, RenderError, _frame, render_episodes

    sc = get_scenario("gym:highway-v0")
    state = sc.sample(np.random.default_rng(0), 1)[0]
    (label, ep), = render_episodes(sc, {"AUT": load_policy("experiments/gym/agents/highway-v0-dqn/model.zip", sc)},
                                   state, seed=3, max_frames=4)
    frames = [ep.frames[t] for t in sorted(ep.frames)]
    assert len(frames) >= 2 and frames[0].shape[0] == PANEL_HEIGHT
    for f in frames:
        assert f.std() > 5 and len(np.unique(f.reshape(-1, 3), axis=0)) > 10  # road, lane marks, vehicles
    assert np.abs(frames[0].astype(float) - frames[-1].astype(float)).mean() > 0.5

    class Blank:
        def render(self):
            return np.zeros((150, 600, 3), np.uint8)

    with pytest.raises(RenderError, match="one colour.*SDL_VIDEODRIVER"):
        _frame(Blank(), sc, 150)
    assert os.environ.get("SDL_VIDEODRIVER") != "dummy"
