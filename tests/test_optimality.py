"""Optimality testing (Delta phase 3): LSH inconsistency, RND novelty, regret, oracles, metrics,
the optimality phase (bugs, store, replay, resume), validation and the quick start."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from envs import get_scenario
from orchestrator.fuzzers import Feedback, make_fuzzer
from orchestrator.fuzzers.corpus import Corpus, pick
from orchestrator.fuzzers.delta import LSH, energy_terms, inconsistency, rank01, regret
from orchestrator.fuzzers.oracles import (
    DifferentialOracle,
    StatisticalOracle,
    bug_distance,
    bug_distance_normalized,
    make_oracle,
    min_repeats,
    smallest_p,
)
from orchestrator.fuzzers.rnd import RND

REPO = Path(__file__).resolve().parents[1]
BALANCER = "python:workers.examples:cartpole_balancer"


# -- the scores, on known values ------------------------------------------------------------------

def test_lsh_inconsistency_is_one_for_identical_trajectories_and_drops_as_they_part():
    rng = np.random.default_rng(0)
    lsh = LSH(4, k=16, seed=1)
    a = rng.standard_normal((200, 4))
    assert inconsistency(lsh.codes(a), lsh.codes(a)) == 1.0
    assert inconsistency(lsh.codes(a), lsh.codes(a[::-1])) == 1.0  # sets of codes: order does not matter
    b = 0.3 * rng.standard_normal((200, 4)) + 2.0  # a cluster on one side of the origin
    assert inconsistency(lsh.codes(b), lsh.codes(-b)) == 0.0  # mirrored through the origin: every bit flips
    # a trajectory drifting away from a shared start: the overlap falls with the drift
    drift = [np.mean([inconsistency(lsh.codes(x), lsh.codes(x + d * np.array([3.0, -2.0, 1.0, 2.0])))
                      for x in [rng.standard_normal((100, 4)) for _ in range(20)]]) for d in (0.0, 0.3, 1.0, 3.0)]
    assert drift[0] == 1.0 and drift[0] > drift[1] > drift[2] > drift[3]
    # |H_aut ∩ H_ca| / |H_aut| by hand: AUT visits {1, 2, 3, 4}, challenger {3, 4, 5}
    assert inconsistency(np.array([1, 2, 2, 3, 4]), np.array([3, 4, 5])) == 0.5


def test_rnd_novelty_falls_on_repeated_states():
    rnd = RND(4, hidden=32, out_dim=8, seed=0)
    rng = np.random.default_rng(0)
    seen = rng.standard_normal((512, 4)).astype(np.float32)
    rnd.update_normalizer(seen)
    before = rnd.novelty(seen).mean()
    rnd.train(seen, steps=300)
    after = rnd.novelty(seen).mean()
    unseen = (rng.standard_normal((512, 4)) * 4 + 6).astype(np.float32)
    assert after < 0.5 * before
    assert rnd.novelty(unseen).mean() > after  # still novel where P has not been


def test_regret_is_safe_and_keeps_its_sign():
    assert regret(10.0, 8.0) == pytest.approx(math.e ** 2)
    assert regret(8.0, 10.0) == pytest.approx(math.e ** -2) and regret(8.0, 10.0) < 1
    assert regret(5.0, 5.0) == 1.0
    big = regret(3000.0, 0.0)  # MuJoCo-sized gap: clipped exponent, finite, still > 1
    assert np.isfinite(big) and big == pytest.approx(math.exp(20.0))
    small = regret(0.0, 3000.0)
    assert 0 < small < 1
    assert regret(1.0, 0.0, clip=0.5) == pytest.approx(math.exp(0.5))


def test_differential_oracle_on_hand_made_returns():
    o = DifferentialOracle()
    bug, p = o.judge(np.array([[10.0], [10.0], [10.0]]), np.array([[11.0], [10.0], [9.0]]))
    assert bug.tolist() == [True, False, False] and np.isnan(p).all()
    bug, _ = DifferentialOracle(delta=1.5).judge(np.array([[10.0], [10.0]]), np.array([[11.0], [12.0]]))
    assert bug.tolist() == [False, True]
    with pytest.raises(ValueError, match="delta"):
        DifferentialOracle(delta=-1)


def test_statistical_oracle_p_values_match_scipy_and_exact_values():
    from scipy.stats import mannwhitneyu

    o = StatisticalOracle(repeats=5, alpha=0.05)
    aut = np.array([[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [1, 1, 1, 1, 1], [3, 1, 4, 1, 5]], float)
    ca = np.array([[5, 6, 7, 8, 9], [0, 1, 2, 3, 4], [1, 1, 1, 1, 1], [9, 2, 6, 5, 3]], float)
    bug, p = o.judge(aut, ca)
    assert p[0] == pytest.approx(1 / 252)  # exact: challenger above in every pair, 1 of C(10,5) orderings
    assert p[1] == pytest.approx(1.0)
    assert p[2] == 1.0  # identical returns: no evidence
    assert p[3] == pytest.approx(mannwhitneyu(ca[3], aut[3], alternative="greater").pvalue)
    assert bug.tolist() == [True, False, False, bool(p[3] < 0.05)]
    # the auto choice follows the scenario's stochasticity
    assert make_oracle("auto", get_scenario("Hopper-Noise")).kind == "statistical"
    assert make_oracle("auto", get_scenario("CartPole-v1")).kind == "differential"


def test_bug_distance_in_raw_units_and_normalised_by_the_bounds():
    low, high = np.array([0.0, -10.0, 5.0]), np.array([1.0, 10.0, 5.0])  # last dimension: zero width
    s = np.array([[0.0, -10.0, 5.0], [1.0, 10.0, 5.0]])
    assert bug_distance(s) == pytest.approx(math.sqrt(1 + 20 ** 2))  # raw units: the paper's scale
    assert bug_distance_normalized(s, low, high) == pytest.approx(math.sqrt(2))
    s3 = np.array([[0.0, -10.0, 5.0], [1.0, -10.0, 5.0], [0.0, 10.0, 5.0]])
    assert bug_distance(s3) == pytest.approx((1 + 20 + math.sqrt(401)) / 3)
    assert bug_distance_normalized(s3, low, high) == pytest.approx((1 + 1 + math.sqrt(2)) / 3)
    assert math.isnan(bug_distance(s[:1])) and math.isnan(bug_distance_normalized(s[:1], low, high))


def test_statistical_oracle_refuses_repeats_that_cannot_reach_alpha():
    assert smallest_p(3) == pytest.approx(1 / 20) and smallest_p(4) == pytest.approx(1 / 70)
    assert min_repeats(0.05) == 4 and min_repeats(0.01) == 5 and min_repeats(0.2) == 2
    with pytest.raises(ValueError, match=r"cannot reach alpha = 0.05 with repeats = 3.*use repeats >= 4"):
        StatisticalOracle(repeats=3, alpha=0.05)
    assert StatisticalOracle(repeats=3, alpha=0.06).repeats == 3  # 1/20 < 0.06: reachable
    # the smallest p is reached: the challenger ahead in every pair of 4 + 4 tie-free repeats
    bug, p = StatisticalOracle(repeats=4).judge(np.array([[0.0, 1.0, 2.0, 3.0]]), np.array([[4.0, 5.0, 6.0, 7.0]]))
    assert p[0] == pytest.approx(1 / 70) and bug[0]


def test_delta_needs_the_challenger_and_names_bad_ablations():
    sc = get_scenario("CartPole-v1")
    d = make_fuzzer("delta", sc, seed=0)
    p = d.propose(2)
    fb = Feedback(returns=np.zeros(2), lengths=np.ones(2, int), terminated=np.zeros(2, bool),
                  failure=np.zeros(2, bool), traj_obs=[np.zeros((2, 4), np.float32)] * 2)
    with pytest.raises(ValueError, match="delta needs the challenger's episodes"):
        d.observe(p, fb)
    with pytest.raises(ValueError, match="unknown component 'novelty'"):
        make_fuzzer("delta", sc, without=["novelty"])
    ab = make_fuzzer("delta", sc, without=["regret"])
    assert ab.beta == 0.0 and ab.alpha == 1.0 and ab.lam == 1.0


@pytest.mark.parametrize("energy", ["literal", "normalized"])
def test_delta_admits_by_dynamic_thresholds(energy):
    """A mutant joins the corpus iff D > mean D, or A > 1, or I < mean I (fuzzing phase), in
    both energy forms (the thresholds read the raw scores)."""
    sc = get_scenario("CartPole-v1")
    d = make_fuzzer("delta", sc, seed=0, rnd_updates_per_episode=0, energy=energy)
    rng = np.random.default_rng(0)
    traj = [rng.standard_normal((30, 4)).astype(np.float32) * 0.05 for _ in range(8)]
    p = d.propose(8)
    d.observe(p, Feedback(returns=np.full(8, 100.0), lengths=np.full(8, 30), terminated=np.zeros(8, bool),
                          failure=np.zeros(8, bool), traj_obs=traj, ca_returns=np.full(8, 100.0), ca_traj_obs=traj))
    assert len(d.corpus) == 8  # sampling phase: every seed joins
    d.start_phase("fuzzing")
    p = d.propose(3)
    mean_d, mean_i = d.corpus.mean("diversity"), d.corpus.mean("inconsistency")
    assert mean_i == 1.0  # both agents visited the same states in the sampling phase
    same = [traj[0], traj[0], traj[0]]
    far = [traj[0] + 5.0]  # the challenger elsewhere: low I
    d.observe(p, Feedback(returns=np.array([100.0, 50.0, 100.0]), lengths=np.full(3, 30),
                          terminated=np.zeros(3, bool), failure=np.zeros(3, bool), traj_obs=same,
                          ca_returns=np.array([100.0, 60.0, 100.0]), ca_traj_obs=[traj[0], traj[0]] + far))
    got = d.last_observed
    assert got["regret"][1] == pytest.approx(math.exp(10)) and got["added"][1]  # challenger better
    assert got["inconsistency"][2] < mean_i and got["added"][2]  # behaviours part
    # the first mutant: A = 1 and I = 1, so only its diversity can admit it
    assert got["regret"][0] == 1.0 and got["inconsistency"][0] == 1.0
    assert bool(got["added"][0]) == bool(got["diversity"][0] > mean_d)
    e, sc_ = d.corpus.energy, d.corpus.scores
    assert np.all(e > 0)
    if energy == "literal":  # e^10 outweighs everything else
        assert np.argmax(e) == int(np.argmax(sc_["regret"]))
    else:  # every term on [0, 1]; each term's top seed is its own
        assert e.max() <= 3.0 + 1e-9
        assert np.argmax(sc_["term_regret"]) == np.argmax(sc_["gap"]) and sc_["term_regret"].max() > 0.99
        assert np.argmax(sc_["term_inconsistency"]) == np.argmin(sc_["inconsistency"])
        assert sc_["term_inconsistency"].min() == 0.0 and sc_["term_diversity"].max() == 1.0


def _delta_on_fixed_corpus(seed=0, **params):
    """A Delta fuzzer in its fuzzing phase whose corpus is 6 fixed seeds with known scores."""
    sc = get_scenario("CartPole-v1")
    d = make_fuzzer("delta", sc, seed=seed, **params)
    gap = np.array([0.0, -3.0, 2.0, 0.0, -1.0, 0.0])
    d.corpus.add(sc.sample(np.random.default_rng(1), 6), energy=0.0,
                 diversity=np.array([5.0, 9.0, 6.0, 12.0, 7.0, 8.0]), gap=gap, regret=regret(gap, 0.0),
                 inconsistency=np.array([1.0, 0.9, 1.0, 0.6, 0.8, 0.95]), generation=0.0)
    d._refresh_energy()
    d.start_phase("fuzzing")
    return d


def test_selection_frequency_follows_energy_eq_8():
    """Seeds are drawn with probability E_i / Σ E_j: a seeded run of 40,000 draws against it."""
    from scipy.stats import chisquare

    d = _delta_on_fixed_corpus()
    e = d.corpus.energy.copy()
    p_sel = e / e.sum()
    assert len(set(np.round(p_sel, 6))) == 6  # six different probabilities
    parents = d.propose(40_000).tags["parent"]
    counts = np.bincount(d.corpus.index_of(parents), minlength=6)
    assert chisquare(counts, 40_000 * p_sel).pvalue > 1e-3
    np.testing.assert_allclose(counts / 40_000, p_sel, atol=0.01)
    # the corpus's inverse-CDF selection is numpy's choice with p = E / ΣE, draw for draw
    c = Corpus(2)
    c.add(np.zeros((5, 2)), energy=np.array([0.5, 3.0, 0.0, 1.0, 2.5]))
    idx, u = c.select_with_draws(np.random.default_rng(7), 1000)
    want = np.random.default_rng(7).choice(5, size=1000, p=c.energy / c.energy.sum())
    np.testing.assert_array_equal(idx, want)
    np.testing.assert_array_equal(pick(c.energy, u), idx)
    assert 2 not in idx  # zero energy: never drawn


@pytest.mark.parametrize("energy", ["normalized", "literal"])
def test_each_ablation_changes_selections_on_a_fixed_corpus(energy):
    """Same corpus, same seed (so the same uniform draws): removing any one term changes which
    seeds are drawn, and the fuzzer's decision shares say so; an ablated term decides nothing."""
    full = _delta_on_fixed_corpus(energy=energy)
    chosen = full.propose(2000).tags["parent"]
    shares = full.stats()
    for k in ("diversity", "regret", "inconsistency"):
        ab = _delta_on_fixed_corpus(energy=energy, without=[k])
        other = ab.propose(2000).tags["parent"]
        changed = float(np.mean(other != chosen))
        # literal: 1 − I ≤ 0.4 beside D of 5-12 moves only a few draws; normalised: each term many
        assert changed > (0.02 if energy == "normalized" else 0.0), (k, changed)
        # the share the full fuzzer reported for k is exactly the share the ablation changed
        assert shares["decision_share_" + k] == pytest.approx(changed)
        assert ab.stats()["decision_share_" + k] == 0.0


def test_the_literal_energy_lets_a_bug_seed_take_every_draw():
    """Why the normalised form is the default: under Eq. 7 on raw values a seed the challenger
    beats by 20 gets A = e^20 and is drawn every time, so D and 1 − I decide nothing; in the
    normalised form every term still decides a share of the draws."""
    gap = np.array([20.0, 0.0, -5.0, 0.0])
    terms = energy_terms("literal", [30.0, 12.0, 40.0, 25.0], gap, [1.0, 0.2, 0.9, 0.5])
    assert terms["regret"][0] == pytest.approx(math.exp(20.0))
    lit = _delta_on_fixed_corpus(energy="literal")
    lit.corpus.scores["gap"][3] = 20.0  # one bug seed
    lit.corpus.scores["regret"][3] = math.exp(20.0)
    lit._refresh_energy()
    parents = lit.propose(500).tags["parent"]
    assert set(parents.tolist()) == {int(lit.corpus.ids[3])}
    s = lit.stats()
    assert s["decision_share_diversity"] == 0.0 and s["decision_share_inconsistency"] == 0.0
    norm = _delta_on_fixed_corpus(energy="normalized")
    norm.corpus.scores["gap"][3] = 20.0
    norm._refresh_energy()
    norm.propose(500)
    s = norm.stats()
    assert min(s["decision_share_" + k] for k in ("diversity", "regret", "inconsistency")) > 0.02
    # the normalised terms: ranks on [0, 1] (ties at the lowest rank), a logistic regret
    np.testing.assert_allclose(rank01([3.0, 1.0, 3.0, 2.0]), [2 / 3, 0.0, 2 / 3, 1 / 3])
    assert rank01([1.0, 1.0]).tolist() == [0.0, 0.0]
    t = energy_terms("normalized", [1.0, 2.0], [0.0, 1e6], [1.0, 1.0])
    assert t["regret"][0] == 0.5 and t["inconsistency"].tolist() == [0.0, 0.0]
    assert t["regret"][1] == pytest.approx(1 / (1 + math.exp(-2.0)))  # gap / mean |gap| = 2
    assert energy_terms("normalized", [1.0], [3.0], [1.0], regret_scale=1.0)["regret"][0] == pytest.approx(
        1 / (1 + math.exp(-3.0)))


# -- the optimality phase -------------------------------------------------------------------------

def campaign_file(tmp_path, *, aut="random:0", challenger=BALANCER, budget=96, fuzzer="delta", extra="",
                  scenario="CartPole-v1", name="opt"):
    p = tmp_path / f"{name}.yaml"
    p.write_text(f"""
name: {name}
scenario: {scenario}
aut: "{aut}"
workers: 0
output: {tmp_path / name}
mlflow: false
safety: null
optimality:
  fuzzer: {fuzzer}
  challenger: "{challenger}"
  budget: {{episodes: {budget}}}
  generation_size: 16
{extra}""")
    return p


@pytest.mark.campaign
def test_optimality_phase_records_bugs_that_replay(tmp_path):
    from orchestrator.campaign.config import load_campaign
    from orchestrator.campaign.pipeline import run_campaign
    from orchestrator.cli import main
    from orchestrator.runs.store import RunStore

    c = load_campaign(campaign_file(tmp_path))
    res = run_campaign(c, progress=False)["optimality"]
    out = Path(c.output)
    bugs = pd.read_parquet(out / "bugs.parquet")
    assert res["cases"] == 96 and res["bugs"] == len(bugs) > 10
    assert (bugs["ca_return"] > bugs["aut_return"]).all()
    assert res["distinct_bugs"] == get_scenario("CartPole-v1").count_distinct(np.stack(bugs["initial_state"]))
    store = RunStore.open(out)
    eps = store.read_episodes(phase="optimality")
    assert len(eps) == 2 * 96 and set(eps["role"]) == {"aut", "challenger"}
    flagged = eps[eps["bug"]]
    assert set(bugs["aut_episode_id"]) | set(bugs["ca_episode_id"]) <= set(flagged["episode_id"])
    row = eps.set_index("episode_id").loc[bugs["ca_episode_id"].iloc[0]]
    assert row["return"] == bugs["batched_ca_return"].iloc[0]  # the store keeps the batched search's episode
    timeline = pd.read_parquet(out / "optimality_timeline.parquet")
    assert timeline["cases"].iloc[-1] == 96 and timeline["bugs"].iloc[-1] == len(bugs)
    # replay re-runs a bug with its seeds (CLI exit 0 when reproduced)
    assert main(["replay", str(out), "3"]) == 0
    assert main(["replay", str(out), "99999"]) == 2


@pytest.mark.campaign
def test_optimality_resume_continues_exactly(tmp_path, monkeypatch):
    from orchestrator import fuzzers
    from orchestrator.campaign.config import load_campaign
    from orchestrator.campaign.optimality import run_optimality

    full = load_campaign(campaign_file(tmp_path, name="full"))
    want = run_optimality(full, progress=False)
    cut = load_campaign(campaign_file(tmp_path, name="cut"))
    real = fuzzers.Feedback.from_differential.__func__
    calls = {"n": 0}

    def crash_on_fourth(cls, *a, **k):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return real(cls, *a, **k)

    monkeypatch.setattr(fuzzers.Feedback, "from_differential", classmethod(crash_on_fourth))
    with pytest.raises(KeyboardInterrupt):
        run_optimality(cut, progress=False)
    monkeypatch.undo()
    got = run_optimality(cut, resume=True, progress=False)
    assert (got["bugs"], got["distinct_bugs"], got["cases"]) == (want["bugs"], want["distinct_bugs"], want["cases"])
    a = pd.read_parquet(Path(full.output) / "bugs.parquet")
    b = pd.read_parquet(Path(cut.output) / "bugs.parquet")
    np.testing.assert_array_equal(np.stack(a["initial_state"]), np.stack(b["initial_state"]))
    from orchestrator.runs.store import RunStore

    assert len(RunStore.open(cut.output).read_episodes(phase="optimality")) == 2 * 96


@pytest.mark.campaign
@pytest.mark.parametrize("fuzzer", ["random", "curefuzz"])
def test_safety_fuzzers_run_as_baselines_under_the_same_oracle(tmp_path, fuzzer):
    from orchestrator.campaign.config import load_campaign
    from orchestrator.campaign.optimality import run_optimality

    s = run_optimality(load_campaign(campaign_file(tmp_path, fuzzer=fuzzer, budget=48)), progress=False)
    assert s["fuzzer"] == fuzzer and s["cases"] == 48 and s["bugs"] > 0


@pytest.mark.campaign
def test_statistical_oracle_on_hopper_noise(tmp_path):
    from orchestrator.campaign.config import load_campaign
    from orchestrator.campaign.optimality import run_optimality

    # a random AUT against the zoo's SAC agent as the challenger: the challenger is ahead from
    # every start, and 4 repeats per agent can reach p = 1/C(8, 4) = 1/70 < 0.05
    p = campaign_file(tmp_path, scenario="Hopper-Noise", aut="random:0", challenger="zoo:Hopper-v5", budget=8,
                      extra="  repeats: 4\n")
    s = run_optimality(load_campaign(p), progress=False)
    assert s["oracle"] == "statistical" and s["repeats"] == 4
    from orchestrator.runs.store import RunStore

    eps = RunStore.open(tmp_path / "opt").read_episodes(phase="optimality")
    assert len(eps) == 8 * 2 * 4
    assert s["bugs"] >= 4  # the branch the old 3-repeat test could never reach
    bugs = pd.read_parquet(tmp_path / "opt" / "bugs.parquet")
    assert len(bugs) == s["bugs"]
    assert (bugs["p_value"] < 0.05).all() and (bugs["p_value"] >= smallest_p(4) - 1e-12).all()
    assert (bugs["ca_return"] > bugs["aut_return"]).all()
    # every bug replays: both agents alone, 4 repeats each, the recorded episode seeds (the wind)
    from orchestrator.campaign.replay import replay_bug

    for bug_id in bugs["bug_id"]:
        r = replay_bug(tmp_path / "opt", int(bug_id))
        assert r["reproduced"], r
    # the campaign refuses a repeat count that cannot reach alpha, naming the minimum
    from orchestrator.campaign.config import CampaignError

    bad = campaign_file(tmp_path, scenario="Hopper-Noise", aut="random:0", challenger="random:1", budget=12,
                        extra="  repeats: 3\n", name="bad")
    with pytest.raises(CampaignError, match=r"optimality: the statistical oracle cannot reach alpha = 0.05 with "
                                            r"repeats = 3.*use repeats >= 4"):
        load_campaign(bad)


@pytest.mark.parametrize(
    "text, message",
    [
        ("safety: {fuzzer: delta}\n", "safety.fuzzer: delta tests optimality"),
        ("safety: null\noptimality: {fuzzer: delta}\n", "optimality.challenger: give a challenger policy URI"),
        ("safety: null\noptimality: {challenger: random:0, oracle: bayes}\n", "optimality.oracle: unknown oracle 'bayes'"),
        ("safety: null\noptimality: {challenger: random:0, fuzzer: afl}\n", "optimality.fuzzer: unknown fuzzer 'afl'"),
        ("safety: null\n", "the campaign has no phase"),
    ],
)
def test_bad_optimality_sections(tmp_path, text, message):
    from orchestrator.campaign.config import CampaignError, load_campaign

    p = tmp_path / "c.yaml"
    p.write_text(f"scenario: CartPole-v1\naut: {BALANCER}\noutput: {tmp_path / 'o'}\n" + text)
    with pytest.raises(CampaignError) as e:
        load_campaign(p)
    assert message in str(e.value)


@pytest.mark.slow
def test_quickstart_pipeline_short_profile(tmp_path, ray_cluster, capsys):
    """experiments/quickstart.yaml end to end (safety -> BCQ -> Delta) with CI-sized budgets."""
    import yaml

    from orchestrator.cli import main

    q = yaml.safe_load((REPO / "experiments" / "quickstart.yaml").read_text())
    assert q["challenger"]["algos"] == ["bcq"] and q["optimality"]["fuzzer"] == "delta"
    q["output"] = str(tmp_path / "qs")
    q["safety"]["budget"] = {"episodes": 192}
    q["challenger"].update(steps=500, eval_episodes=20)
    q["optimality"]["budget"] = {"episodes": 192}
    p = tmp_path / "quickstart.yaml"
    p.write_text(yaml.safe_dump(q))
    assert main(["run", str(p), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "| safety | curefuzz, 192 episodes" in out and "| challenger bcq | 500 steps" in out
    assert "| optimality | delta (differential oracle), 192 test cases" in out
    results = json.loads((tmp_path / "qs" / "results.json").read_text())
    assert results["optimality"]["cases"] == 192 and results["safety"]["episodes"] == 192
    assert (tmp_path / "qs" / "mlflow.db").is_file()
