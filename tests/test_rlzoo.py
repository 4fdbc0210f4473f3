"""rl-baselines3-zoo agents as published (``rlzoo:PATH``, a bare ``.zip`` in a zoo folder, the zoo
entries), their scores on deltarl's scenarios, bad folders, and no gym banner on stderr.

The three agents are the rl-trained-agents files in ``../shared/data/rlzoo`` (their README has the
reference figures, 100 episodes, seed 2024); the zoo ships copies of two of them.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from envs import get_scenario
from workers.policies import PolicyError, load_policy, resolve_zoo_uri
from workers.policies.formats import old_gym_spaces
from workers.policies.rlzoo import RLZooPolicy, read_normalizer
from workers.rollout import rollout

REPO = Path(__file__).resolve().parents[1]
RLZOO = REPO.parent / "shared" / "data" / "rlzoo"
WALKER = RLZOO / "sac" / "Walker2d-v3_1"
HOPPER = RLZOO / "sac" / "Hopper-v3_1"
BIPEDAL = RLZOO / "ppo" / "BipedalWalkerHardcore-v3_1"
SEED = 2024
BANNER = "Gym has been unmaintained"


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py


def _returns(uri: str, scenario: str, episodes: int):
    sc = get_scenario(scenario)
    policy = load_policy(uri, sc, device="cpu")
    states = sc.sample(np.random.default_rng(SEED), episodes)
    res = rollout(sc, policy, states, seed=SEED)
    return policy, np.asarray(res.returns, dtype=float), np.asarray(res.failure, dtype=bool)


def _within_noise(returns: np.ndarray, reference: float, ref_margin: float) -> float:
    """|mean - reference| must stay within 3 standard errors of the difference (ours from the
    sample, the reference's from its 95% margin)."""
    se = math.sqrt(returns.var(ddof=1) / len(returns) + (ref_margin / 1.96) ** 2)
    return 3 * se


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / src.parent.name / src.name
    shutil.copytree(src, dst)
    for p in dst.rglob("*"):
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    os.chmod(dst, 0o755)
    return dst


def _edit_yaml(path: Path, **changes) -> None:
    """Rewrite an rl-zoo YAML file as a plain mapping with ``changes`` applied (None deletes)."""
    from workers.policies.rlzoo import _read_yaml

    data = _read_yaml(path)
    for k, v in changes.items():
        if v is None:
            data.pop(k, None)
        else:
            data[k] = v
    path.write_text(yaml.safe_dump(data))


def _error(uri, scenario=None) -> str:
    with pytest.raises(PolicyError) as ei:
        load_policy(uri, scenario, device="cpu")
    msg = str(ei.value)
    assert "Traceback" not in msg
    return msg


# ---------------------------------------------------------------------------------------------
# the three agents, scored on deltarl's scenarios
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_walker2d_sac_scores_like_the_papers_aut():
    policy, ret, fail = _returns(f"rlzoo:{WALKER}", "Walker2d-v5", 5)
    assert isinstance(policy, RLZooPolicy) and policy.algo == "SAC" and policy.env == "Walker2d-v3"
    assert policy.normalizer is None
    assert abs(ret.mean() - 3906.5) <= _within_noise(ret, 3906.5, 10.3), ret
    assert not fail.any()


@pytest.mark.slow
def test_hopper_sac_bare_zip_in_its_folder():
    policy, ret, _ = _returns(str(HOPPER / "Hopper-v3.zip"), "Hopper-v5", 10)
    assert policy.format == "rlzoo" and policy.algo == "SAC"
    assert abs(ret.mean() - 1207.9) <= _within_noise(ret, 1207.9, 98.1), ret


@pytest.mark.slow
def test_bipedal_ppo_walks_with_its_normaliser_and_falls_without(tmp_path):
    policy, ret, fail = _returns(f"rlzoo:{BIPEDAL}", "BipedalWalker", 10)
    assert policy.algo == "PPO" and policy.normalizer is not None
    assert policy.normalizer.clip_obs == 10.0 and policy.normalizer.size == 24
    assert abs(ret.mean() - 77.6) <= _within_noise(ret, 77.6, 25.2), ret
    assert (~fail).mean() >= 0.5  # 80% success over 30 episodes in the reference

    raw = _copy(BIPEDAL, tmp_path)
    _edit_yaml(raw / "BipedalWalkerHardcore-v3" / "config.yml", normalize=False)
    policy, ret, fail = _returns(f"rlzoo:{raw}", "BipedalWalker", 5)
    assert policy.normalizer is None
    assert fail.all(), ret  # it always falls
    assert ret.mean() < -90, ret  # -126.7 in the reference


def test_normaliser_is_vecnormalize_at_test_time():
    """Our reading of vecnormalize.pkl (no code run) normalises as SB3's VecNormalize does."""
    import pickle

    path = BIPEDAL / "BipedalWalkerHardcore-v3" / "vecnormalize.pkl"
    ours = read_normalizer(path)
    with open(path, "rb") as f:
        vn = pickle.load(f)  # SB3's own object (the file is the project's shipped data)
    obs = np.random.default_rng(0).normal(scale=3.0, size=(64, 24)).astype(np.float32)
    obs[0, :] = 1e6  # clipped
    np.testing.assert_allclose(ours(obs), vn.normalize_obs(obs), rtol=1e-6, atol=1e-6)
    assert ours.epsilon == vn.epsilon and ours.clip_obs == vn.clip_obs


def test_old_gym_spaces_come_from_the_file():
    data = json.loads(zipfile.ZipFile(WALKER / "Walker2d-v3.zip").read("data"))
    assert "gym.spaces" in data["action_space"][":type:"]
    spaces = old_gym_spaces(data)
    import gymnasium

    assert isinstance(spaces["observation_space"], gymnasium.spaces.Box)
    assert spaces["observation_space"].shape == (17,)
    act = spaces["action_space"]
    assert act.shape == (6,) and np.all(act.low == -1) and np.all(act.high == 1)


def test_batched_and_deterministic():
    sc = get_scenario("Walker2d-v5")
    policy = load_policy(str(WALKER), sc, device="cpu")  # a bare agent folder
    obs = np.random.default_rng(1).normal(size=(33, 17)).astype(np.float32)
    a = policy.act(obs)
    assert a.shape == (33, 6) and a.dtype == np.float32
    np.testing.assert_array_equal(a, policy.act(obs.copy()))
    np.testing.assert_allclose(a[:5], policy.act(obs[:5]), atol=1e-6)
    assert policy.act(obs[:0]).shape == (0, 6)
    expected, _ = policy.model.predict(obs, deterministic=True)
    np.testing.assert_allclose(a, np.clip(expected, -1, 1), atol=1e-6)
    info = policy.info()
    assert info["format"] == "rlzoo" and info["rlzoo"]["algo"] == "SAC"


# ---------------------------------------------------------------------------------------------
# the zoo entries
# ---------------------------------------------------------------------------------------------
def test_zoo_names_resolve_to_the_third_party_agents():
    walker = resolve_zoo_uri("zoo:Walker2d-v5")
    assert walker.parent.name == "Walker2d-v5-rlzoo" and walker.suffix == ".zip"
    bipedal = resolve_zoo_uri("zoo:BipedalWalker")
    assert bipedal.parent.name == "BipedalWalker-rlzoo"
    ours = resolve_zoo_uri("zoo:Walker2d-v5-sac-deltarl")
    assert ours.name == "policy.pt"
    for name in ("Walker2d-v5-rlzoo", "BipedalWalker-rlzoo"):
        card = json.loads((REPO / "experiments" / "zoo" / name / "card.json").read_text())
        assert card["licence"].startswith("MIT") and card["trained_by"] and card["source"]
        assert (REPO / "experiments" / "zoo" / name / "LICENSE").is_file()
    p = load_policy("zoo:BipedalWalker", "BipedalWalker", device="cpu")
    assert p.format == "rlzoo" and p.normalizer is not None  # the shipped copy has its normaliser


# ---------------------------------------------------------------------------------------------
# sb3-contrib algorithms (the rlzoo extra), in rl-zoo's layout
# ---------------------------------------------------------------------------------------------
class _SpacesOnly:
    """A gymnasium env with a scenario's spaces: enough to build (not train) an SB3 model."""

    def __new__(cls, scenario):
        import gymnasium

        class Env(gymnasium.Env):
            def __init__(self):
                self.observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (scenario.obs_dim,), np.float32)
                act = scenario.action
                if act.discrete:
                    self.action_space = gymnasium.spaces.Discrete(act.n)
                else:
                    self.action_space = gymnasium.spaces.Box(np.asarray(act.low, np.float32),
                                                             np.asarray(act.high, np.float32), tuple(act.shape),
                                                             np.float32)

            def reset(self, *, seed=None, options=None):
                return np.zeros(scenario.obs_dim, np.float32), {}

            def step(self, action):
                return np.zeros(scenario.obs_dim, np.float32), 0.0, True, False, {}

        return Env()


def _zoo_layout(tmp_path: Path, algo: str, env: str, model, config: dict | None = None) -> Path:
    folder = tmp_path / algo / f"{env}_1"
    (folder / env).mkdir(parents=True)
    model.save(str(folder / f"{env}.zip"))
    (folder / env / "config.yml").write_text(yaml.safe_dump(config or {"policy": "MlpPolicy"}))
    (folder / env / "args.yml").write_text(yaml.safe_dump({"algo": algo, "env": env, "seed": 0}))
    return folder


@pytest.mark.parametrize("algo,scenario", [("tqc", "Hopper-v5"), ("qrdqn", "CartPole-v1"),
                                           ("trpo", "Hopper-v5"), ("ars", "CartPole-v1")])
def test_contrib_algorithms(tmp_path, algo, scenario):
    import sb3_contrib

    sc = get_scenario(scenario)
    env = _SpacesOnly(sc)
    small = {"net_arch": [8]}
    model = {
        "tqc": lambda: sb3_contrib.TQC("MlpPolicy", env, buffer_size=10, policy_kwargs=small, seed=0, device="cpu"),
        "qrdqn": lambda: sb3_contrib.QRDQN("MlpPolicy", env, buffer_size=10, policy_kwargs=small, seed=0,
                                           device="cpu"),
        "trpo": lambda: sb3_contrib.TRPO("MlpPolicy", env, n_steps=8, batch_size=8, policy_kwargs=small, seed=0,
                                         device="cpu"),
        "ars": lambda: sb3_contrib.ARS("LinearPolicy", env, n_delta=2, seed=0, device="cpu"),
    }[algo]()
    folder = _zoo_layout(tmp_path, algo, scenario, model)
    policy = load_policy(f"rlzoo:{folder}", sc, device="cpu")
    assert policy.algo == type(model).__name__
    obs = np.random.default_rng(2).normal(size=(16, sc.obs_dim)).astype(np.float32)
    a = policy.act(obs)
    expected, _ = model.predict(obs, deterministic=True)
    if sc.action.discrete:
        assert a.dtype == np.int64 and a.shape == (16,)
        np.testing.assert_array_equal(a, expected)
    else:
        assert a.shape == (16, *sc.action.shape)
        np.testing.assert_allclose(a, np.clip(expected, -1, 1), atol=1e-5)


def test_pickled_schedules_that_do_not_load_are_not_needed(tmp_path):
    """rl-zoo's old DQN files fail on their pickled exploration schedule; custom_objects skip it."""
    import stable_baselines3 as sb3

    sc = get_scenario("CartPole-v1")
    model = sb3.DQN("MlpPolicy", _SpacesOnly(sc), buffer_size=10, policy_kwargs={"net_arch": [8]}, seed=0,
                    device="cpu")
    folder = _zoo_layout(tmp_path, "dqn", "CartPole-v1", model)
    zpath = folder / "CartPole-v1.zip"
    with zipfile.ZipFile(zpath) as z:
        entries = {n: z.read(n) for n in z.namelist()}
    data = json.loads(entries["data"])
    for key in ("exploration_schedule", "lr_schedule"):
        data[key][":serialized:"] = "bm90IGEgcGlja2xl"  # "not a pickle"
    entries["data"] = json.dumps(data).encode()
    with zipfile.ZipFile(zpath, "w") as z:
        for n, b in entries.items():
            z.writestr(n, b)
    for uri in (f"rlzoo:{folder}", str(zpath)):
        p = load_policy(uri, sc, device="cpu")
        assert p.act(np.zeros((3, 4), np.float32)).shape == (3,)


# ---------------------------------------------------------------------------------------------
# bad input: one PolicyError that says what is wrong
# ---------------------------------------------------------------------------------------------
def test_folder_without_a_model(tmp_path):
    folder = _copy(WALKER, tmp_path)
    (folder / "Walker2d-v3.zip").unlink()
    msg = _error(f"rlzoo:{folder}", "Walker2d-v5")
    assert "no model" in msg and str(folder) in msg


def test_missing_folder(tmp_path):
    msg = _error(f"rlzoo:{tmp_path / 'nowhere'}")
    assert "not found" in msg


def test_unknown_algorithm(tmp_path):
    folder = _copy(WALKER, tmp_path)
    _edit_yaml(folder / "Walker2d-v3" / "args.yml", algo="sac9000")
    msg = _error(f"rlzoo:{folder}", "Walker2d-v5")
    assert "unknown algorithm 'sac9000'" in msg and "tqc" in msg


def test_stateful_algorithm_is_refused(tmp_path):
    folder = _copy(WALKER, tmp_path)
    _edit_yaml(folder / "Walker2d-v3" / "args.yml", algo="ppo_lstm")
    assert "RecurrentPPO" in _error(f"rlzoo:{folder}", "Walker2d-v5")


def test_contrib_algorithm_without_sb3_contrib(tmp_path, monkeypatch):
    folder = _copy(WALKER, tmp_path)
    _edit_yaml(folder / "Walker2d-v3" / "args.yml", algo="tqc")
    monkeypatch.setitem(sys.modules, "sb3_contrib", None)  # import now fails
    msg = _error(f"rlzoo:{folder}", "Walker2d-v5")
    assert "sb3-contrib" in msg and "deltarl[rlzoo]" in msg


def test_env_wrapper_is_refused(tmp_path):
    folder = _copy(WALKER, tmp_path)
    _edit_yaml(folder / "Walker2d-v3" / "config.yml", env_wrapper="sb3_contrib.common.wrappers.TimeFeatureWrapper")
    msg = _error(f"rlzoo:{folder}", "Walker2d-v5")
    assert "env_wrapper" in msg and "TimeFeatureWrapper" in msg


def test_normalize_without_its_file(tmp_path):
    folder = _copy(BIPEDAL, tmp_path)
    (folder / "BipedalWalkerHardcore-v3" / "vecnormalize.pkl").unlink()
    msg = _error(f"rlzoo:{folder}", "BipedalWalker")
    assert "normalize" in msg and "vecnormalize.pkl" in msg


def test_normaliser_of_the_wrong_size(tmp_path):
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    folder = _copy(BIPEDAL, tmp_path)
    other = VecNormalize(DummyVecEnv([lambda: _SpacesOnly(get_scenario("Walker2d-v5"))]))
    other.save(str(folder / "BipedalWalkerHardcore-v3" / "vecnormalize.pkl"))
    msg = _error(f"rlzoo:{folder}", "BipedalWalker")
    assert "size 17" in msg and "24" in msg


def test_agent_for_another_scenario(tmp_path):
    msg = _error(f"rlzoo:{WALKER}", "Hopper-v5")
    assert "Hopper-v5" in msg and "17" in msg and "11" in msg


def test_not_a_vecnormalize_file(tmp_path):
    import pickle

    folder = _copy(BIPEDAL, tmp_path)
    (folder / "BipedalWalkerHardcore-v3" / "vecnormalize.pkl").write_bytes(pickle.dumps(os.system))
    msg = _error(f"rlzoo:{folder}", "BipedalWalker")
    assert "VecNormalize" in msg and "system" in msg


# ---------------------------------------------------------------------------------------------
# no gym banner, real warnings kept
# ---------------------------------------------------------------------------------------------
def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.mark.subprocess
def test_no_gym_banner_and_real_warnings_stay():
    res = _run("import workers, d3rlpy, stable_baselines3, gym, warnings, sys\n"
               "warnings.warn('a real warning')\nprint('a real message', file=sys.stderr)")
    assert res.returncode == 0, res.stderr
    assert BANNER not in res.stderr
    assert "a real warning" in res.stderr and "a real message" in res.stderr


@pytest.mark.subprocess
def test_only_the_banner_is_dropped():
    res = _run("import workers, gym_notices.notices as n, workers\n"
               "import importlib.util, json\n"
               "spec = importlib.util.find_spec('gym_notices.notices')\n"
               "fresh = importlib.util.module_from_spec(spec); spec.loader.exec_module(fresh)\n"
               "print(json.dumps([sorted(fresh.notices), sorted(n.notices)]))")
    assert res.returncode == 0, res.stderr
    before, after = json.loads(res.stdout)
    import importlib.util

    spec = importlib.util.find_spec("gym_notices.notices")
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    kept = sorted(v for v, text in fresh.notices.items() if not text.startswith(BANNER))
    assert after == kept and len(before) == len(fresh.notices)


@pytest.mark.slow
def test_no_gym_banner_from_the_cli_and_ray_workers(tmp_path):
    """``deltarl rollout`` of a d3rlpy agent on one Ray worker: the worker imports d3rlpy (gym)."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "DELTARL_DASHBOARD": "0"}
    res = subprocess.run(
        [str(Path(sys.executable).parent / "deltarl"), "rollout", "--scenario", "CartPole-v1", "--policy",
         str(REPO / "experiments" / "zoo" / "CartPole-v1-ddqn" / "model.d3"), "--episodes", "8", "--workers", "1",
         "--out", str(tmp_path / "out"), "--quiet"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert BANNER not in res.stderr and BANNER not in res.stdout


def test_plain_sb3_zip_with_old_gym_spaces_loads_without_shimmy(tmp_path):
    """Outside rl-zoo's layout the same file is a plain SB3 model; its old gym spaces still load."""
    zpath = tmp_path / "walker.zip"
    shutil.copyfile(WALKER / "Walker2d-v3.zip", zpath)
    p = load_policy(str(zpath), "Walker2d-v5", device="cpu")
    assert p.format == "sb3" and p.algo_name == "SAC"
    q = load_policy(f"rlzoo:{WALKER}", "Walker2d-v5", device="cpu")
    obs = np.random.default_rng(3).normal(size=(8, 17)).astype(np.float32)
    np.testing.assert_array_equal(p.act(obs), q.act(obs))
