"""Repair (Delta RQ4): AUT-Improved from the optimality bugs of a run folder, and Table 5.

    report = repair_run("runs/quickstart")            # -> runs/quickstart/repair/
    report = repair_run(RUN, RepairConfig(data="union"), fuzz_budget=2000)

1. **D_superior**: the challenger's trajectories from the bug states, i.e. every challenger
   episode of the optimality phase flagged ``bug`` (all repeats, for the statistical oracle).
   They are read from the run's ``steps/``; where they are not stored, the challenger is run
   again from the bug states (``bugs.parquet``) and its new trajectories are used.
2. **Fine-tuning** (:mod:`workers.repair`): CQL on the AUT's own network, starting from its
   weights. ``data="superior"`` (default) trains on D_superior alone, as the paper does
   ("the original AUTs are further trained using this new dataset", Sec. 5 RQ4);
   ``data="union"`` trains on D ∪ D_superior (D = the dataset the challenger was trained on,
   named by its card), an ablation.
3. **Evaluation**, AUT vs AUT-Improved (the challenger beside them where it helps):
   mean return ± 95% CI over 100 starts from the reset distribution (seed 2024, as the cards);
   failures on the known failure-inducing states (AUT episodes with ``failure`` in the safety
   phases of D's run folder); returns and remaining bugs on the bug states (the run's oracle
   judges AUT-Improved against the challenger); optionally (``fuzz_budget``) a new safety
   campaign (CureFuzz by default) against each, same seed and budget.
4. **Files** (``RUN/repair/``): ``aut_improved.d3`` (d3rlpy; a policy URI for ``deltarl
   evaluate``, ``rollout`` and campaigns), ``policy.pt`` (TorchScript), ``repair.json`` (every
   figure, the settings, the training record), ``repair.md`` (Table 5's layout). A Stable-Baselines3
   SAC AUT (the rl-zoo Walker2d agent) is fine-tuned from ``aut_from_sb3.d3``, its d3rlpy twin
   (:mod:`workers.policies.sb3_to_d3rlpy`, checked to act and value as the AUT does).

No Ray: fine-tuning and rollouts run in this process; a ``fuzz_budget`` campaign uses the run's
``fuzz_workers`` Ray rollout actors (0 by default: in this process).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
import warnings
from pathlib import Path

import d3rlpy
import numpy as np
import pandas as pd

from orchestrator.analysis.evaluation import evaluate_policy
from orchestrator.analysis.stats import mean_ci
from orchestrator.campaign.config import Budget, SafetySpec, campaign_of_run
from orchestrator.campaign.generations import inference_alone
from orchestrator.campaign.safety import run_safety
from orchestrator.fuzzers.oracles import make_oracle
from orchestrator.runs.cards import EVAL_SEED, read_card
from orchestrator.runs.layout import MODEL, SAFETY_PHASES, TORCHSCRIPT, RunFolder
from orchestrator.runs.store import RunStore, StoreError, atomic_write_bytes
from workers.policies import PolicyError, load_policy, resolve_zoo_uri
from workers.policies.sb3_to_d3rlpy import save_sac_from_sb3
from workers.repair import (
    RepairConfig,
    action_agreement,
    cql_from_aut,
    fine_tune,
    rollout_steps,
    steps_to_dataset,
)
from workers.resources import CHECKOUT
from workers.rollout import RolloutResult, rollout
from workers.training import TrainingError, quiet_d3rlpy

EVAL_EPISODES = 100
SB3_AUT = "aut_from_sb3.d3"  # the d3rlpy SAC converted from a Stable-Baselines3 (rl-zoo) SAC AUT, in repair/


class RepairInputs:
    """What a run folder says about its optimality phase: scenario, AUT, challenger, bugs, D."""

    def __init__(self, run_dir: str | Path):


        self.run = run = RunFolder(run_dir)
        self.run_dir = run_dir = run.root
        if not run.has_campaign() or not run.store_json.is_file():
            raise StoreError(f"{run_dir} is not a campaign run folder (no campaign.json / store.json); give the "
                             f"folder of a `deltarl run` with an optimality: section")
        self.campaign = campaign_of_run(run.root)
        self.scenario = self.campaign.build_scenario()
        self.store = RunStore.open(run_dir)
        self.summary = run.summary("optimality") or {}
        bugs_file = run.bugs_parquet
        bugs = run.bugs()
        self.bugs = bugs if bugs is not None else pd.DataFrame()
        if self.bugs.empty:
            raise StoreError(f"{run_dir} has no optimality bugs ({bugs_file} is "
                             f"{'empty' if bugs_file.is_file() else 'missing'}): repair learns from the states "
                             f"where the challenger beat the AUT. Run an optimality phase that finds bugs first "
                             f"(deltarl run CAMPAIGN.yaml with an optimality: section, e.g. experiments/quickstart.yaml)")
        self.aut_uri = self.campaign.aut
        self.challenger_uri = self._challenger()
        try:
            self.aut_weights, self.aut_sb3 = aut_weights_path(self.aut_uri), None
        except TrainingError:
            # a Stable-Baselines3 (rl-zoo) AUT: repair converts it to a d3rlpy SAC (aut_weights, set then)
            self.aut_sb3 = sb3_aut_path(self.aut_uri)
            if self.aut_sb3 is None:
                raise
            self.aut_weights = None
        self.d_run_dir, self.d_phases = self._dataset_source()

    def _challenger(self) -> str:
        uri = self.run.resolve(self.summary.get("challenger") or (self.campaign.optimality.challenger
                                                                   if self.campaign.optimality else None))
        if not uri and self.campaign.challenger is not None:
            uri = str(self.run.challenger_dir(self.campaign.challenger.algos[0]) / MODEL)
        fix = (f"train one (deltarl train-challenger --data {self.run_dir} --algo bcq) and run the optimality "
               f"phase with it")
        if not uri:
            raise StoreError(f"{self.run_dir} names no challenger (optimality_summary.json and campaign.json have "
                             f"none): repair needs the challenger that found the bugs; {fix}")
        p = _existing_path(uri)
        if ":" not in uri and p is None:
            raise StoreError(f"the challenger {uri} of {self.run_dir} does not exist: repair needs it to rebuild "
                             f"D_superior and to judge the bug states; restore it or {fix}")
        return str(p) if p is not None else uri

    def _dataset_source(self) -> tuple[Path | None, list[str]]:
        """D's run folder and phases: the challenger card's dataset, else this run's safety phases."""

        card = read_card(Path(self.challenger_uri).parent)
        if card is not None:
            ds = card.get("dataset") or {}
            p = _existing_path(ds.get("run_dir") or "")
            if p is not None and RunFolder(p).store_json.is_file():
                return p, list(ds.get("phases") or SAFETY_PHASES)
        if len(RunStore.open(self.run_dir).read_episodes(phase=list(SAFETY_PHASES), role="aut",
                                                          columns=["episode_id"])):
            return self.run_dir, list(SAFETY_PHASES)
        return None, list(SAFETY_PHASES)

    @property
    def bug_states(self) -> np.ndarray:
        return np.stack(self.bugs["initial_state"].to_numpy()).astype(np.float64)

    @property
    def optimality_alone(self) -> bool:
        """Whether the optimality phase acted on each observation alone (its ``inference``): its bug
        states are re-run the same way, so a verdict found acting alone is judged acting alone."""
        return inference_alone(self.campaign.optimality, self.scenario)

    @property
    def safety_alone(self) -> bool:
        """The same for the safety phase that found the known failure states."""
        return inference_alone(self.campaign.safety, self.scenario)

    def known_failures(self) -> tuple[int, np.ndarray] | None:
        """The AUT's failing episodes in D's safety phases: how many, and their distinct initial
        states; None when no run folder holds D."""
        if self.d_run_dir is None:
            return None
        feps = RunStore.open(self.d_run_dir).read_episodes(phase=self.d_phases, role="aut", failure=True,
                                                           columns=["initial_state"])
        if not len(feps):
            return 0, np.zeros((0, self.scenario.state_dim))
        return len(feps), np.unique(np.stack(feps["initial_state"].to_numpy()).astype(np.float64), axis=0)

    def oracle(self):

        spec = self.campaign.optimality
        return make_oracle(spec.oracle if spec else "auto", self.scenario, delta=spec.delta if spec else 0.0,
                           repeats=self.summary.get("repeats") or (spec.repeats if spec else None),
                           alpha=spec.alpha if spec else 0.05)


def _existing_path(p: str) -> Path | None:
    if not p or p.startswith(("zoo:", "python:", "random:")):
        return None
    for cand in (Path(p), CHECKOUT / p):
        if cand.exists():
            return cand
    return None


def aut_weights_path(aut_uri: str) -> Path:
    """The AUT's d3rlpy model file: the zoo agent's ``model.d3``, a ``.d3`` path, or the
    ``model.d3`` beside a TorchScript/ONNX export."""

    path = resolve_zoo_uri(aut_uri) if aut_uri.startswith("zoo:") else _existing_path(aut_uri)
    if path is not None:
        path = Path(path)
        if path.suffix == ".d3" and path.is_file():
            return path
        if (path.parent / "model.d3").is_file():
            return path.parent / "model.d3"
    raise TrainingError(f"repair fine-tunes the AUT's weights, so it needs its d3rlpy model (.d3); the AUT "
                        f"{aut_uri!r} has none (give the campaign a .d3 AUT, a zoo agent, or put model.d3 "
                        f"beside its policy file)")


def sb3_aut_path(aut_uri: str) -> Path | None:
    """The AUT's Stable-Baselines3 model when it is one (an rl-zoo agent folder or ``.zip``, a
    plain SB3 ``.zip``), else None. Repair converts it to a d3rlpy SAC
    (:mod:`workers.policies.sb3_to_d3rlpy`), which refuses every SB3 model but an MlpPolicy SAC."""

    if aut_uri.startswith("rlzoo:"):
        path = _existing_path(aut_uri.split(":", 1)[1].strip())
    else:
        path = resolve_zoo_uri(aut_uri) if aut_uri.startswith("zoo:") else _existing_path(aut_uri)
    if path is None:
        return None
    path = Path(path)
    if (path.is_file() and path.suffix.lower() == ".zip") or (path.is_dir() and any(path.glob("*.zip"))):
        return path
    return None


def superior_steps(inp: RepairInputs) -> tuple[dict, str]:
    """D_superior's steps (``RunStore.read_steps`` form) and where they came from."""

    eps = inp.store.read_episodes(phase="optimality", role="challenger", bug=True,
                                  columns=["episode_id", "length"])
    if len(eps):
        steps = inp.store.read_steps(phase="optimality", role="challenger", episode_ids=eps["episode_id"].to_numpy())
        if steps["rewards"].shape[0] == int(eps["length"].sum()) and len(eps) >= len(inp.bugs):
            return steps, "stored"
    # not stored: run the challenger again from the bug states with the recorded seeds
    repeats = int(inp.summary.get("repeats") or 1)
    policy = load_policy(inp.challenger_uri, inp.scenario)
    states = inp.bug_states
    if inp.scenario.stochastic:  # each bug with its own generation seed and index
        res = RolloutResult.concat([
            rollout(inp.scenario, {"challenger": policy}, states[i:i + 1], repeats=repeats,
                    seed=int(row.gen_seed), state_offset=int(row.state_index))
            for i, row in enumerate(inp.bugs.itertuples())])
    else:
        res = rollout(inp.scenario, {"challenger": policy}, states, alone=inp.optimality_alone)
    return rollout_steps(res), "re-run"


def _role_stats(res, role: str, n: int, repeats: int) -> dict:

    r = res.by_role(role)
    mean, margin = mean_ci(r.returns)
    per_state = np.zeros((n, repeats))
    per_state[r.state_index, r.repeat] = r.returns
    fails = np.zeros(n, dtype=bool)
    np.logical_or.at(fails, r.state_index, r.failure)
    return {"mean_return": mean, "ci95_margin": margin, "failures": int(r.failure.sum()),
            "failing_states": int(fails.sum()), "episodes": int(r.n_episodes), "_returns": per_state}


def evaluate_on_states(scenario, policies: dict, states: np.ndarray, repeats: int = 1, alone: bool = False) -> dict:
    """Every policy from every state (``repeats`` times, common random numbers): per role mean
    return ± 95% CI, failures (episodes and states) and the (states, repeats) return matrix.
    ``alone``: every observation acted on as if alone, as the phase that found the states did
    (its ``inference``), so a verdict found acting alone is re-run acting alone."""

    res = rollout(scenario, policies, states, repeats=repeats, seed=EVAL_SEED, alone=alone)
    return {role: _role_stats(res, role, len(states), repeats) for role in policies}


def _public(d: dict) -> dict:
    return {k: v for k, v in d.items() if not k.startswith("_")}


def _reduction(before: float, after: float) -> float | None:
    return None if not before else (after - before) / before


def fuzz_compare(inp: RepairInputs, improved_uri: str, budget: int, out: Path, fuzzer: str = "curefuzz",
                 workers: int = 0, progress: bool = False) -> dict:
    """A new safety campaign against AUT-Improved and one against the AUT: same fuzzer, seed and
    budget (episodes), in ``out/fuzz-aut`` and ``out/fuzz-aut_improved``. Failures and distinct
    failures of each. ``workers`` = 0 runs them in this process (no Ray)."""
    base = inp.campaign
    spec = base.safety or SafetySpec()
    res = {}
    for role, uri in (("aut", inp.aut_uri), ("aut_improved", improved_uri)):
        folder = out / f"fuzz-{role}"
        if folder.exists():
            shutil.rmtree(folder)
        # the same safety phase as the run's (fuzzer, seed, generation sizes), against another agent
        campaign = dataclasses.replace(
            base, name=f"{base.name}-repair-fuzz-{role}", aut=uri, output=str(folder), workers=int(workers),
            mlflow=False, challenger=None, optimality=None,
            safety=dataclasses.replace(spec, fuzzer=fuzzer, params=spec.params if spec.fuzzer == fuzzer else {},
                                       budget=Budget(episodes=int(budget))))
        s = run_safety(campaign, progress=progress, scenario=inp.scenario)
        res[role] = {"failures": s["failures"], "distinct_failures": s["distinct_failures"], "episodes": s["episodes"],
                     "wall_seconds": s["wall_seconds"], "run_dir": str(folder)}
    res.update(fuzzer=fuzzer, budget=int(budget), seed=inp.campaign.seed, workers=int(workers),
               failure_reduction=_reduction(res["aut"]["failures"], res["aut_improved"]["failures"]))
    return res


def repair_run(run_dir: str | Path, cfg=None, **kwargs) -> dict:
    """Repair the AUT of the run in ``run_dir`` (holding the run folder's lock: one writer per
    folder); writes ``repair/`` and returns ``repair.json``'s content. Keywords: :func:`_repair_run`."""
    with RunFolder(run_dir).lock("deltarl repair"):
        return _repair_run(run_dir, cfg, **kwargs)


def _repair_run(run_dir: str | Path, cfg=None, *, out: str | Path | None = None, fuzz_budget: int | None = None,
                fuzz_fuzzer: str = "curefuzz", fuzz_workers: int = 0, eval_episodes: int = EVAL_EPISODES,
                force: bool = False, progress: bool = True) -> dict:
    cfg = (cfg or RepairConfig()).validate()
    if eval_episodes < 1:
        raise TrainingError(f"eval_episodes must be >= 1, got {eval_episodes}")
    if fuzz_budget is not None and fuzz_budget < 1:
        raise TrainingError(f"--fuzz-budget must be >= 1 episodes, got {fuzz_budget}")
    inp = RepairInputs(run_dir)
    cfg = cfg.for_aut(inp.scenario.action.discrete)  # the defaults of the AUT's kind, as repair.json records them
    out = Path(out) if out else inp.run.repair_dir
    if (out / "repair.json").is_file() and not force:
        raise TrainingError(f"{out} already holds a repair; add --force to replace it or choose another --out")
    if cfg.data == "union" and inp.d_run_dir is None:
        raise TrainingError(f"--data union needs the challenger's dataset D, but neither the challenger's card nor "
                            f"{inp.run_dir} names a run folder holding it; use --data superior")
    quiet_d3rlpy()
    aut_policy = load_policy(inp.aut_uri, inp.scenario, device="cpu")
    rec = set(inp.bugs["aut_sha256"].dropna()) - {""}
    have = getattr(aut_policy, "sha256", "")
    if rec and have and have not in rec:
        raise StoreError(f"the AUT {inp.aut_uri} changed since the bugs of {inp.run_dir} were found (sha256 "
                         f"{have[:12]} not among {sorted(r[:12] for r in rec)}); repair needs the AUT they were found in")
    conversion = None
    if inp.aut_sb3 is not None:  # an SB3 SAC AUT: its d3rlpy twin (checked on probes), the weights to fine-tune
        try:
            conversion = save_sac_from_sb3(inp.aut_sb3, out / SB3_AUT)
        except PolicyError as e:
            raise TrainingError(f"repair fine-tunes the AUT's weights as a d3rlpy model; the AUT {inp.aut_uri!r} is a "
                                f"Stable-Baselines3 model that does not convert to one: {e}") from e
        inp.aut_weights = out / SB3_AUT
    t0 = time.perf_counter()
    sup, source, d_info, dataset = _repair_dataset(inp, cfg)
    algo, aut, training, agreement = _fine_tune_aut(inp, cfg, sup, dataset, progress)
    out.mkdir(parents=True, exist_ok=True)
    model = out / "aut_improved.d3"
    tmp = out / ".aut_improved.d3.tmp"
    algo.save(str(tmp))
    tmp.replace(model)
    torchscript = _export_torchscript(algo, out / TORCHSCRIPT)
    improved_uri = str(model)
    pols = {"aut": aut_policy, "aut_improved": load_policy(improved_uri, inp.scenario, device="cpu"),
            "challenger": load_policy(inp.challenger_uri, inp.scenario, device="cpu")}
    ev = {"aut": evaluate_policy(inp.scenario, inp.aut_uri, eval_episodes, seed=EVAL_SEED, device="cpu"),
          "aut_improved": evaluate_policy(inp.scenario, improved_uri, eval_episodes, seed=EVAL_SEED, device="cpu")}
    fuzz = fuzz_compare(inp, improved_uri, fuzz_budget, out, fuzz_fuzzer, fuzz_workers, progress) if fuzz_budget else None
    sc = inp.scenario
    report = {
        "run_dir": str(inp.run_dir), "scenario": sc.name, "aut": inp.aut_uri, "aut_weights": str(inp.aut_weights),
        "aut_conversion": conversion,
        "challenger": inp.challenger_uri, "aut_improved": improved_uri,
        "algorithm": f"{type(algo).__name__} (d3rlpy {d3rlpy.__version__}) from {type(aut).__name__} weights",
        "config": dataclasses.asdict(cfg),
        "data": {"choice": cfg.data, "superior_source": source,
                 "superior_episodes": int(len(np.unique(sup["episode_id"]))),
                 "superior_steps": int(sup["rewards"].shape[0]), "d": d_info,
                 "transitions": training["transitions"]},
        "training": training,
        "agreement_with_challenger_on_superior": agreement,
        "evaluation": {**ev, "episodes": eval_episodes, "seed": EVAL_SEED},
        "bug_states": _bug_state_evaluation(inp, pols), "failure_states": _failure_state_evaluation(inp, pols),
        "fuzz": fuzz, "torchscript": torchscript, "wall_seconds": time.perf_counter() - t0,
        "evaluate_with": f"deltarl evaluate --policy {improved_uri} --scenario {sc.name}",
    }
    atomic_write_bytes(out / "repair.json", json.dumps(report, indent=2, default=float).encode())
    atomic_write_bytes(out / "repair.md", markdown_table(report).encode())
    return report


def _repair_dataset(inp: RepairInputs, cfg):
    """1. D_superior (and D for the union ablation) as one d3rlpy dataset."""
    sc = inp.scenario
    sup, source = superior_steps(inp)
    discrete = sc.action.discrete
    action_size = int(inp.store.meta.get("action_size") or (sc.action.n if discrete else int(np.prod(sc.action.shape))))
    parts = [sup]
    d_info = None
    if cfg.data == "union":
        d_steps = RunStore.open(inp.d_run_dir).read_steps(phase=inp.d_phases, role="aut")
        parts.append(d_steps)
        d_info = {"run_dir": str(inp.d_run_dir), "phases": inp.d_phases, "steps": int(d_steps["rewards"].shape[0])}
    return sup, source, d_info, steps_to_dataset(parts, discrete=discrete, action_size=action_size)


def _fine_tune_aut(inp: RepairInputs, cfg, sup: dict, dataset, progress: bool):
    """2. CQL from the AUT's weights; how often it agrees with the challenger before and after."""
    discrete = inp.scenario.action.discrete
    aut = d3rlpy.load_learnable(str(inp.aut_weights), device=cfg.device or "cpu:0")
    algo = cql_from_aut(aut, cfg, probe_obs=sup["obs"][:: max(1, len(sup["obs"]) // 512)])
    before = action_agreement(algo, sup["obs"], sup["actions"], discrete)
    training = fine_tune(algo, dataset, cfg, progress=progress)
    after = action_agreement(algo, sup["obs"], sup["actions"], discrete)
    return algo, aut, training, {"before": before, "after": after}


def _bug_state_evaluation(inp: RepairInputs, pols: dict) -> dict:
    """3a. Returns and remaining bugs on the bug states (the run's oracle against the challenger)."""
    oracle = inp.oracle()
    on_bugs = evaluate_on_states(inp.scenario, pols, inp.bug_states, repeats=oracle.repeats,
                                 alone=inp.optimality_alone)
    still_aut, _ = oracle.judge(on_bugs["aut"]["_returns"], on_bugs["challenger"]["_returns"])
    still_imp, _ = oracle.judge(on_bugs["aut_improved"]["_returns"], on_bugs["challenger"]["_returns"])
    imp, aut = on_bugs["aut_improved"]["_returns"].mean(1), on_bugs["aut"]["_returns"].mean(1)
    return {"states": int(len(inp.bugs)), "repeats": oracle.repeats, "oracle": oracle.kind,
            **{role: _public(v) for role, v in on_bugs.items()},
            "bugs_reproduced_aut": int(still_aut.sum()), "bugs_remaining_aut_improved": int(still_imp.sum()),
            "improved_beats_aut_states": int((imp > aut).sum()), "improved_worse_than_aut_states": int((imp < aut).sum())}


def _failure_state_evaluation(inp: RepairInputs, pols: dict) -> dict | None:
    """3b. Failures of AUT and AUT-Improved on the known failure states of D's safety phases."""
    known = inp.known_failures()
    if known is None:
        return None
    n, fstates = known
    out = {"run_dir": str(inp.d_run_dir), "phases": inp.d_phases, "known_failures": int(n)}
    if n:
        on_f = evaluate_on_states(inp.scenario, {k: pols[k] for k in ("aut", "aut_improved")}, fstates,
                                  repeats=inp.oracle().repeats, alone=inp.safety_alone)
        out.update(states=int(len(fstates)), **{role: _public(v) for role, v in on_f.items()},
                   failure_reduction=_reduction(on_f["aut"]["failures"], on_f["aut_improved"]["failures"]))
    return out


def _export_torchscript(algo, path: Path) -> str:

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            algo.save_policy(str(path))
        return path.name
    except Exception as exc:  # noqa: BLE001 - d3rlpy cannot trace every algorithm's action selection
        return f"not exported: {type(exc).__name__}: {str(exc)[:200]}"


def _pm(d: dict | None, key="mean_return", margin="ci95_margin", fmt=".1f") -> str:
    if not d:
        return "n/a"
    m = d.get(margin)
    return f"{d[key]:{fmt}} ± {m:{fmt}}" if m == m and m is not None else f"{d[key]:{fmt}}"


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}%"


def markdown_table(r: dict) -> str:
    """``repair.md``: Table 5's columns for one run, then the bug states and the settings."""
    ev, b, f, z = r["evaluation"], r["bug_states"], r["failure_states"], r["fuzz"]
    fa = f"{f['aut']['failures']}" if f and "aut" in f else ("0 known" if f else "n/a (no D)")
    fi = (f"{f['aut_improved']['failures']} ({_pct(f['failure_reduction'])})" if f and "aut_improved" in f
          else "n/a")
    fz = (f"{z['aut_improved']['failures']} (AUT: {z['aut']['failures']}, {_pct(z['failure_reduction'])})"
          if z else "not run (--fuzz-budget N)")
    c = r["config"]
    lines = [
        f"# Repair of {r['aut']} on {r['scenario']}",
        "",
        f"Run `{r['run_dir']}`, challenger `{r['challenger']}`. AUT-Improved = {r['algorithm']}, fine-tuned "
        f"{c['steps']} steps (lr {c['learning_rate']}"
        + (f", actor lr {c['actor_learning_rate']}, temperature lr {c['temp_learning_rate']}"
           if c.get("actor_learning_rate") is not None else "")
        + f", alpha {c['alpha']}) on "
        f"{'D_superior' if c['data'] == 'superior' else 'D ∪ D_superior'} "
        f"({r['data']['superior_episodes']} superior episodes, {r['data']['transitions']} transitions).",
        "",
        "| mean reward (AUT) | mean reward (AUT-Improved) | safety failures of AUT (known failure states) "
        "| safety failures of AUT-Improved (after repair) | fuzz re-evaluation of AUT-Improved |",
        "|---:|---:|---:|---:|---:|",
        f"| {_pm(ev['aut'])} | {_pm(ev['aut_improved'])} | {fa} | {fi} | {fz} |",
        "",
        f"Mean reward: {ev['episodes']} starts from the reset distribution (seed {ev['seed']}), ± the 95% CI margin.",
    ]
    if f and "aut" in f:
        lines.append(f"Known failure states: {f['states']} distinct initial states of the {f['known_failures']} AUT "
                     f"failures in the safety phases of `{f['run_dir']}`, each run again by both agents.")
    if z:
        lines.append(f"Fuzz re-evaluation: {z['fuzzer']}, {z['budget']} episodes, seed {z['seed']}, against each agent.")
    lines += [
        "",
        f"## On the {b['states']} bug states ({b['oracle']} oracle, {b['repeats']} rollout(s) per agent)",
        "",
        "| agent | mean return ± 95% CI | failing episodes |",
        "|---|---:|---:|",
    ]
    for role, name in (("aut", "AUT"), ("aut_improved", "AUT-Improved"), ("challenger", "challenger")):
        lines.append(f"| {name} | {_pm(b[role])} | {b[role]['failures']} / {b[role]['episodes']} |")
    lines += [
        "",
        f"Bugs (challenger beats the agent): AUT {b['bugs_reproduced_aut']} / {b['states']}, AUT-Improved "
        f"{b['bugs_remaining_aut_improved']} / {b['states']}. AUT-Improved better than the AUT on "
        f"{b['improved_beats_aut_states']} states, worse on {b['improved_worse_than_aut_states']}.",
        "",
        f"Evaluate it: `{r['evaluate_with']}`",
        "",
    ]
    return "\n".join(lines)
