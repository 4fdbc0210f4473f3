#!/usr/bin/env bash
# The GPU path, ready to measure (issue #20): on a CUDA machine
#   1. make torch a CUDA build (the CPU wheel `make` installs on CPU-only machines is swapped for
#      the PyPI wheel of the same version; skipped when torch already sees a GPU),
#   2. run the test suite's GPU-marked tests (pytest -m gpu),
#   3. measure batched policy inference on CUDA inside rollouts (the in-process executor, CPU vs
#      CUDA policy, CartPole zoo agent and a 256x256 MLP on Hopper, B = 256 and 2048),
#   4. measure challenger training steps/s (BCQ on CartPole, CQL on Hopper; d3rlpy; CPU, CUDA,
#      and CUDA with d3rlpy's compile_graph, which applies on CUDA only),
# and write one Markdown table to OUT/gpu_check.md. Under 10 minutes on one GPU (the install,
# when needed, is capped at 4 minutes; every measurement is sized to seconds).
#
# On a machine without CUDA it is a dry run: the install and every CUDA measurement are skipped
# with a message saying so, the GPU tests are collected (and skip), and the CPU rows are measured
# with small sizes, so that the script itself is checked end to end.
#
#   benchmarks/gpu_check.sh                 # OUT = runs/gpu-check
#   OUT=/tmp/gpu benchmarks/gpu_check.sh    # (the device machine: OUT=$OUT)
#   PYTHON=python3 benchmarks/gpu_check.sh  # default: .venv/bin/python, else python3
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
OUT="${OUT:-runs/gpu-check}"
mkdir -p "$OUT"
T0=$(date +%s)
log() { echo "[gpu_check $(( $(date +%s) - T0 ))s] $*" >&2; }

CUDA=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  CUDA=1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt" || true
  log "GPU: $(head -1 "$OUT/gpu.txt")"
else
  log "DRY RUN: no CUDA device here (nvidia-smi finds none). The CUDA install and every CUDA"
  log "measurement are skipped; the CPU rows run with small sizes to check the script."
fi

# 1. a CUDA build of torch
INSTALL="not needed"
if [ "$CUDA" = 1 ]; then
  if "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    INSTALL="torch already sees the GPU"
  else
    VER=$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')
    log "installing the CUDA wheel torch==$VER (was: $("$PY" -c 'import torch; print(torch.__version__)'))"
    if timeout 240 "$PY" -m pip install -q --force-reinstall --no-deps "torch==$VER" \
         --index-url "${TORCH_INDEX_URL:-https://pypi.org/simple}" > "$OUT/pip.log" 2>&1 \
       && "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
      INSTALL="installed torch==$VER (CUDA wheel)"
    else
      INSTALL="FAILED (see pip.log): CUDA rows skipped"
      CUDA=0
      log "the CUDA wheel could not be installed (no network? set TORCH_INDEX_URL or pre-install); CUDA rows skipped"
    fi
  fi
else
  INSTALL="skipped (dry run: no CUDA device)"
fi
log "torch: $INSTALL"

# 2. the GPU-marked tests (they skip without CUDA)
log "pytest -m gpu"
set +e
timeout 240 "$PY" -m pytest -q -m gpu tests -p no:cacheprovider > "$OUT/pytest_gpu.log" 2>&1
TEST_RC=$?
set -e
TESTS=$(grep -E "passed|skipped|failed|error|no tests ran" "$OUT/pytest_gpu.log" | tail -1 || true)
log "gpu tests: ${TESTS:-see pytest_gpu.log} (exit $TEST_RC)"

# 3-4. the measurements, one table
log "measuring (CUDA=$CUDA)"
CUDA="$CUDA" INSTALL="$INSTALL" TESTS="$TESTS (exit $TEST_RC)" OUT="$OUT" timeout 420 "$PY" - <<'PYEOF'
import json, os, sys, tempfile, time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, os.getcwd())
from envs import get_scenario
from orchestrator.cluster.executor import Executor
from workers.policies import export_mlp_torchscript, load_policy

CUDA = os.environ["CUDA"] == "1" and torch.cuda.is_available()
DRY = not CUDA
OUT = Path(os.environ["OUT"])
torch.set_num_threads(1)
rows, notes = [], []
tmp = Path(tempfile.mkdtemp(prefix="gpu-check-"))


def rollouts(scenario, uri, device, batch, n):
    pol = load_policy(uri, scenario, device=device)
    states = scenario.sample(np.random.default_rng(0), n)
    with Executor(scenario, {"aut": uri}, workers=0, batch_size=batch, policies={"aut": pol}) as ex:
        ex.run(states[: min(n, batch)], seed=1)  # warm-up (CUDA context, kernels)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        res = ex.run(states, seed=0)
        wall = time.perf_counter() - t0
    return n / wall, float(res.lengths.sum()) / wall


# 3. batched policy inference on CUDA inside rollouts
cases = [("CartPole-v1", "zoo:CartPole-v1", 2048 if not DRY else 256),
         ("Hopper-v5", None, 2048 if not DRY else 64)]
for name, uri, n in cases:
    sc = get_scenario(name)
    if uri is None:
        uri = str(tmp / "hopper-mlp.pt")
        export_mlp_torchscript(uri, sc.obs_dim, sc.action.size, hidden=(256, 256), seed=0, discrete=False,
                               action_low=0.1 * sc.action.low, action_high=0.1 * sc.action.high)
    for batch in ((256, 2048) if not DRY else (64,)):
        base = None
        for device in ("cpu", "cuda"):
            label = f"rollouts {name}, B={batch}, policy on {device}"
            if device == "cuda" and not CUDA:
                rows.append((label, "skipped (no CUDA)", "", ""))
                continue
            eps, sps = rollouts(sc, uri, device, batch, max(n, batch))
            base = base or sps
            rows.append((label, f"{eps:,.1f} episodes/s", f"{sps:,.0f} steps/s", f"{sps / base:.2f}x"))


# 4. challenger training steps/s
def dataset(scenario, n=20_000, length=100):
    import d3rlpy

    rng = np.random.default_rng(0)
    obs = rng.normal(size=(n, scenario.obs_dim)).astype(np.float32)
    if scenario.action.discrete:
        act = rng.integers(0, scenario.action.n, size=n)
    else:
        act = rng.uniform(-1, 1, size=(n, scenario.action.size)).astype(np.float32)
    term = np.zeros(n)
    term[length - 1::length] = 1.0
    return d3rlpy.dataset.MDPDataset(obs, act, rng.normal(size=n).astype(np.float32), term)


from workers.challenger import challenger_config, train_challenger  # noqa: E402

for name, algo, steps_gpu, steps_cpu in (("CartPole-v1", "bcq", 3000, 300), ("Hopper-v5", "cql", 2000, 100)):
    sc = get_scenario(name)
    data = dataset(sc)
    base = None
    for device, compiled in (("cpu:0", False), ("cuda:0", False), ("cuda:0", True)):
        label = f"challenger {algo} on {name}, {device}" + (" + compile_graph" if compiled else "")
        if device.startswith("cuda") and not CUDA:
            rows.append((label, "skipped (no CUDA)", "", ""))
            continue
        steps = steps_cpu if device == "cpu:0" or DRY else steps_gpu
        cfg = challenger_config(name, algo, steps=steps)
        cfg.steps_per_epoch, cfg.eval_episodes, cfg.device = steps, 0, device
        if compiled:
            cfg.hyperparameters = {**cfg.hyperparameters, "compile_graph": True}
        try:
            state = train_challenger(cfg, data, tmp / f"{name}-{algo}-{device[:4]}-{int(compiled)}")
        except Exception as exc:  # noqa: BLE001 - one row says what failed; the others still run
            rows.append((label, f"failed: {type(exc).__name__}: {str(exc)[:120]}", "", ""))
            continue
        sps = state["step"] / state["wall_seconds"]
        base = base or sps
        rows.append((label, f"{sps:,.1f} steps/s", f"{state['step']} steps, batch "
                     f"{cfg.hyperparameters.get('batch_size', 'preset')}", f"{sps / base:.2f}x"))

gpu = (OUT / "gpu.txt").read_text().strip() if (OUT / "gpu.txt").is_file() else "none (dry run)"
lines = [f"### GPU check ({'CUDA' if CUDA else 'DRY RUN: no CUDA, CUDA rows skipped, CPU rows at small sizes'})", "",
         f"- GPU: {gpu}; torch {torch.__version__}; CPUs {os.cpu_count()}",
         f"- CUDA torch: {os.environ['INSTALL']}",
         f"- GPU-marked tests: {os.environ['TESTS']}", "",
         "| measurement | result | detail | vs the CPU row above |", "|---|---|---|---:|"]
lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
(OUT / "gpu_check.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PYEOF
log "done: $OUT/gpu_check.md"
