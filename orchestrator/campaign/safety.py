"""Safety testing (Delta phase 1): fuzz the AUT for failures and record every trajectory (dataset D).

    run_safety(campaign)               # a new run in campaign.output
    run_safety(campaign, resume=True)  # continue from the last generation snapshot

The phase runs in the generation loop (:mod:`orchestrator.campaign.generations`); what it adds:
the AUT alone runs from the proposed states, the fuzzer reads its episodes, the episodes go to
the run's Parquet store (phase ``sampling`` or ``fuzzing``, the fuzzer's name, the generation
as iteration), and the failures (the scenario's oracle) are counted, with the distinct ones on
the scenario's grid.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa

from orchestrator.analysis.diversity import failure_diversity
from orchestrator.campaign.confirm import Confirmer
from orchestrator.campaign.generations import LoopState, Phase, Verdict, WorkUnit, inference_alone, restore, run_phase
from orchestrator.campaign.llm_service import phase_services
from orchestrator.fuzzers import Feedback, make_fuzzer
from orchestrator.runs.files import new_run_id
from orchestrator.runs.layout import RunFolder
from orchestrator.runs.store import RunStore, StoreError
from workers.policies import shared_policy

FAILURE_COLUMNS = ("failure_id", "generation", "state_index", "gen_seed", "aut_return", "batched_aut_return",
                   "length", "episode_id", "aut_sha256", "wall_time")
FLAKY_COLUMNS = ("generation", "state_index", "gen_seed", "aut_return", "batched_aut_return",
                 "ca_return", "batched_ca_return", "p_value", "wall_time")


@dataclass
class SafetyState(LoopState):
    failures: int = 0  # confirmed: the AUT fails from the state acting alone
    failure_states: list = field(default_factory=list)  # initial states of the confirmed failures
    failure_rows: list = field(default_factory=list)  # failures.parquet
    flaky: list = field(default_factory=list)  # candidates that did not fail alone (flaky.parquet)
    confirm_seconds: float = 0.0

    @property
    def episodes(self) -> int:
        return self.done


class SafetyPhase(Phase):
    name = "safety"
    unit = "ep"
    count_name = "episodes"
    state_class = SafetyState

    def judge(self, states, result, gen_seed: int) -> Verdict:
        return Verdict(Feedback.from_result(result))

    def record(self, st: SafetyState, unit: WorkUnit, result, verdict: Verdict) -> dict:
        """The unit's episodes to the store; its candidate failures confirmed with the AUT acting
        alone (the others are flaky)."""
        states, gen_seed = unit.states, unit.gen_seed
        ids = self.store.write(result, phase=st.phase, fuzzer=self.spec.fuzzer, iteration=st.generation,
                               wall_time=st.elapsed, policy_sha256=self.policy_hashes["aut"])
        cand = np.flatnonzero(result.failure)  # one episode per state, in state order
        confirmer = Confirmer(self.scenario, self.policies, acted_alone=inference_alone(self.spec, self.scenario))
        alone, solo_returns = confirmer.failures(states, cand, gen_seed, result.returns)
        st.confirm_seconds += confirmer.seconds
        for k, i in enumerate(cand):
            row = {"generation": st.generation, "state_index": int(i), "gen_seed": gen_seed, "state": states[i].tolist(),
                   "aut_return": float(solo_returns[k]), "batched_aut_return": float(result.returns[i]),
                   "wall_time": st.elapsed}
            if alone[k]:
                st.failure_rows.append({**row, "failure_id": len(st.failure_rows), "length": int(result.lengths[i]),
                                        "episode_id": int(ids[i]), "aut_sha256": self.policy_hashes["aut"]})
            else:
                st.flaky.append(row)
        st.failures += int(alone.sum())
        st.failure_states.extend(states[cand[alone]].tolist())
        return {"failures": st.failures, "distinct_failures": self._distinct(st), "flaky": len(st.flaky),
                "mean_return": float(result.returns.mean())}

    def commit(self, st: SafetyState) -> None:
        names = list(self.scenario.state_names)
        if st.failure_rows:
            self.run.write_verdicts(self.run.failures_parquet, st.failure_rows, FAILURE_COLUMNS, names)
        if st.flaky:
            self.run.write_verdicts(self.run.flaky_parquet("safety"), st.flaky, FLAKY_COLUMNS, names)

    def _distinct(self, st: SafetyState) -> int:
        return self.scenario.count_distinct(np.asarray(st.failure_states)) if st.failure_states else 0

    def gauges(self, row: dict) -> dict:
        return {"failures": row["failures"]}

    def postfix(self, row: dict) -> dict:
        return {"failures": row["failures"], "distinct": row["distinct_failures"]}

    def summarize(self, st: SafetyState) -> dict:
        """``summary.json`` and ``timeline.parquet`` (failures over time), both written whole."""
        c = self.campaign
        summary = {
            "campaign": c.name, "scenario": self.scenario.name, "aut": c.aut, "fuzzer": self.spec.fuzzer,
            "seed": c.seed, "episodes": st.done, "sampling_episodes": st.sampling_done,
            "generations": st.generation, "wall_seconds": st.elapsed, "rollout_seconds": st.rollout_seconds,
            "failures": st.failures, "distinct_failures": self._distinct(st), "flaky_failures": len(st.flaky),
            "confirm_seconds": st.confirm_seconds, **self.executor_info,
            "grid_intervals": self.scenario.grid_intervals,
            "failure_rate": st.failures / st.done if st.done else float("nan"),
            # LLMTester's Table II: distinct entire / initial / terminal states of the failures (N = 10),
            # on the scenario's fixed observation grid when it has one (the same for every method)
            "failure_states": failure_diversity(self.run.root, intervals=10,
                                                bounds=self.scenario.diversity_bounds()),
        }
        self.run.write_json(self.run.summary_json("safety"), summary)  # strict JSON (write_json)
        self.run.write_table(self.run.timeline_parquet("safety"),
                             pa.Table.from_pandas(pd.DataFrame(st.timeline), preserve_index=False))
        return summary


def run_safety(campaign, *, resume: bool = False, progress: bool = True, scenario=None, replay: dict | None = None,
               executor=None) -> dict:
    """Run (or resume) the safety phase of ``campaign``; returns the summary. ``scenario``: the
    campaign's scenario when the caller already built it (validation returns it). ``replay``
    (``execution: async``): apply results in a recorded order
    (:func:`~orchestrator.campaign.generations.applied_order` of an earlier run). ``executor``:
    one the caller owns and closes."""
    scenario = scenario if scenario is not None else campaign.build_scenario()
    spec = campaign.safety
    run = RunFolder(campaign.output)
    aut = shared_policy(campaign.aut, scenario)  # a policy that does not load or fit: clear error, nothing written
    fuzzer = make_fuzzer(spec.fuzzer, scenario, seed=campaign.seed, **spec.params)
    if resume:
        if not run.has_campaign():
            raise StoreError(f"{run.root} holds no campaign to resume (campaign.json missing)")
        store = RunStore.open(run.root)
    else:
        store = RunStore.create(run.root, scenario, run_id=new_run_id(campaign.name))
        run.write_campaign(campaign)
    phase = SafetyPhase(campaign, spec, scenario, run, store, fuzzer, {"aut": campaign.aut}, {"aut": aut},
                        services=phase_services(fuzzer, campaign, run.root))
    st = restore(run, "safety", fuzzer, SafetyState) if resume else SafetyState()
    return run_phase(phase, st, resume=resume, progress=progress, replay=replay, executor=executor)
