"""The CUDA path (``pytest -m gpu``; benchmarks/gpu_check.sh runs these on a GPU machine). Without a
CUDA device every test here skips."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from envs import get_scenario

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def hopper_mlp(tmp_path_factory):
    from workers.policies import export_mlp_torchscript

    sc = get_scenario("Hopper-v5")
    path = tmp_path_factory.mktemp("gpu") / "hopper.pt"
    export_mlp_torchscript(path, sc.obs_dim, sc.action.size, hidden=(256, 256), seed=0, discrete=False,
                           action_low=0.1 * sc.action.low, action_high=0.1 * sc.action.high)
    return str(path)


def test_policies_act_on_cuda_as_on_the_cpu(hopper_mlp):
    from workers.policies import load_policy

    for name, uri in (("CartPole-v1", "zoo:CartPole-v1"), ("Hopper-v5", hopper_mlp)):
        sc = get_scenario(name)
        obs = sc.sample(np.random.default_rng(0), 512).astype(np.float32)
        if sc.obs_dim != obs.shape[1]:
            obs = np.random.default_rng(0).normal(size=(512, sc.obs_dim)).astype(np.float32)
        cpu, gpu = load_policy(uri, sc, device="cpu"), load_policy(uri, sc, device="cuda")
        a, b = cpu.act(obs), gpu.act(obs)
        if sc.action.discrete:
            assert (a == b).mean() > 0.99  # argmax ties may break differently in float32 on the GPU
        else:
            np.testing.assert_allclose(a, b, atol=1e-4)


def test_rollouts_with_a_cuda_policy_match_the_cpu(hopper_mlp):
    from orchestrator.cluster.executor import Executor
    from workers.policies import load_policy

    sc = get_scenario("Hopper-v5")
    states = sc.sample(np.random.default_rng(1), 64)
    out = {}
    for device in ("cpu", "cuda"):
        pol = load_policy(hopper_mlp, sc, device=device)
        with Executor(sc, {"aut": hopper_mlp}, workers=0, batch_size=32, policies={"aut": pol}) as ex:
            out[device] = ex.run(states, seed=0)
    np.testing.assert_allclose(out["cpu"].returns, out["cuda"].returns, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("compile_graph", [False, True])
def test_a_challenger_trains_on_cuda(tmp_path, compile_graph):
    import d3rlpy

    from workers.challenger import challenger_config, train_challenger

    sc = get_scenario("CartPole-v1")
    rng = np.random.default_rng(0)
    n = 2000
    term = np.zeros(n)
    term[99::100] = 1.0
    data = d3rlpy.dataset.MDPDataset(rng.normal(size=(n, 4)).astype(np.float32), rng.integers(0, 2, size=n),
                                     rng.normal(size=n).astype(np.float32), term)
    cfg = challenger_config("CartPole-v1", "bcq", steps=50)
    cfg.steps_per_epoch, cfg.eval_episodes, cfg.device = 50, 0, "cuda:0"
    if compile_graph:
        cfg.hyperparameters = {**cfg.hyperparameters, "compile_graph": True}
    state = train_challenger(cfg, data, tmp_path / "bcq")
    assert state["step"] == 50 and (tmp_path / "bcq" / "model.d3").is_file()
    from workers.policies import load_policy

    pol = load_policy(str(tmp_path / "bcq" / "model.d3"), sc, device="cuda")
    assert pol.act(np.zeros((8, 4), np.float32)).shape == (8,)
