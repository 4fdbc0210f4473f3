"""Campaign files: one YAML file says what to test, how, with what budget, and where results go.

    name: cartpole-curefuzz
    scenario: CartPole-v1
    aut: zoo:CartPole-v1           # any policy URI
    seed: 0
    workers: auto                  # auto (default): in this process unless Ray pays (see below); N = N Ray
                                   # rollout actors; 0 = in this process, no Ray
    output: runs/cartpole-curefuzz
    safety:
      fuzzer: curefuzz             # random | mdpfuzz | curefuzz | gmt
      params: {}                   # the fuzzer's own parameters
      budget: {episodes: 2000}     # or {seconds: 600}
      sampling_fraction: 0.25      # share of the budget that builds the initial corpus
      generation_size: 64          # proposals per generation (1 = the serial algorithm)
      execution: sync              # sync (default: generations with a barrier, reproducible) | async
                                   # (steady state: each rollout actor gets a new proposal as soon as it
                                   # is free; the order results were applied is recorded for replay)
      corpus: driver               # driver (default) | actor (async with Ray workers: the fuzzer lives in
                                   # a Ray actor, restored from the last snapshot if it dies)
      inference: auto              # auto (default: the scenario's choice: alone for MuJoCo and Box2D,
                                   # batched for the others) | batched (the search runs each step's
                                   # observations as one batch; candidate failures/bugs are re-run with
                                   # every agent acting alone before they count) | alone (every observation
                                   # acted on as if alone: verdicts need no re-run)
    challenger:                    # optional: offline RL on the safety phase's record D
      algos: [bcq]                 # any of bc, bcq, cql
      preset: null                 # null = the scenario's preset in experiments/challengers/
      steps: null                  # gradient steps (null = the preset's)
      eval_episodes: 100           # Table 1 evaluation of challenger and AUT
      torch_threads: null          # torch threads while training (null = the preset's, 2); 1 in a grid
                                   # whose campaigns share the cores (docs/scaling.md)
    optimality:                    # optional: differential fuzzing, AUT vs challenger (Delta phase 3)
      fuzzer: delta                # or any safety fuzzer as a baseline under the same oracle
      params: {}                   # e.g. {without: [regret]} for an ablation
      challenger: null             # a policy URI; null = this run's challengers/<first algo>/model.d3
      oracle: auto                 # differential | statistical | auto (statistical when stochastic)
      delta: 0.0                   # bug when R_ca > R_aut + delta
      repeats: null                # rollouts per agent and state (statistical oracle: 5; it
                                   # refuses a count whose smallest p cannot reach alpha)
      alpha: 0.05                  # statistical oracle: one-sided Mann-Whitney U at alpha
      budget: {episodes: 1000}     # test cases (initial states, each run by both agents)
      sampling_fraction: 0.25     # as safety testing (the paper's "same setup")
      generation_size: null        # null = the fuzzer's default: 8 for delta (energies refreshed
                                   # every 8 test cases), 64 for the safety fuzzers
    llm:                           # only for LLM-guided fuzzers (llmtester); see workers/llm.py
      base_url: https://api.openai.com/v1   # any OpenAI-compatible server (vLLM, Ollama, llama.cpp)
      model: gpt-4o-mini
      api_key_env: OPENAI_API_KEY  # the NAME of the variable holding the key; never the key
      requests_per_minute: 60      # shared by all generator actors (one rate-limiter actor)
      tokens_per_minute: null
      max_concurrent: 4            # calls in flight
      actors: 2                    # async LLMGenerator actors
      max_consecutive_failures: null  # N: stop the campaign after N LLM calls in a row without a usable
                                   # scenario (a run whose LLM gave none exits 1 and says so)

``workers: auto`` decides per phase, by one stated rule
(:func:`orchestrator.cluster.executor.plan_workers`): in this process on a machine with fewer
than 4 CPUs, or when the phase's work is too small to pay for Ray's start-up (under ~40 s of
in-process rollouts, ~10 s when a Ray cluster is already running to join: ``deltarl ray up``);
otherwise on CPUs − 1 rollout actors. Each phase's summary says which executor ran and why.

The ``safety`` section may be ``null`` to skip safety testing (e.g. an optimality-only campaign
with an existing challenger).

Validation happens before any Ray work: an unknown key, a wrong type, an unknown fuzzer or
scenario, a negative budget each give one :class:`CampaignError` naming the field and what is
allowed. Every number is bounded: budgets by :data:`MAX_EPISODES` episodes and
:data:`MAX_SECONDS` seconds, sizes by :data:`MAX_SIZE`; a number YAML 1.1 reads as text
(``seconds: 1e3``) is read as the number. ``output`` expands ``~`` and environment variables
(``$HOME/runs/x``), and so do ``aut`` and ``optimality.challenger`` when they begin with ``~`` or
``$``; an unset variable is refused. ``scenario_overrides`` are checked against the
scenario's own settings (same kind of value, finite, ``max_steps`` >= 1, identity fields such as
``name`` not settable). ``workers: N`` is checked against the CPUs when the campaign starts
(:func:`orchestrator.cluster.executor.check_workers`: the machine, or the cluster it joins).
The resolved campaign (defaults filled in) is saved beside the results.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs import ScenarioError, ScenarioRef
from orchestrator.fuzzers import FUZZERS, fuzzer_class, fuzzer_params
from workers.llm import LLMConfig, LLMConfigError
from workers.yamlfile import load_yaml

MAX_SEED = 2**31 - 1
MAX_EPISODES = 10**9  # a budget's episodes (test cases): a billion, ~90 days of CartPole on 128 cores
MAX_SECONDS = 366 * 24 * 3600.0  # a budget's seconds: one year
MAX_SIZE = 10**6  # generation_size, batch_size, eval_episodes, repeats
MAX_STEPS = 10**9  # challenger gradient steps
# scenario fields that name what the scenario is: an override would make it another scenario
FIXED_SCENARIO_FIELDS = ("name", "version", "env_id", "obs_dim", "state_dim", "state_names", "state_meaning",
                         "action")
_NUMBER_TEXT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
# how a fuzzing phase runs its rollouts (orchestrator.campaign.generations): generations with a
# barrier (sync, the reproducible default) or steady state (async, docs/scaling.md)
EXECUTION_MODES = ("sync", "async")  # seeds are 0 .. 2^31 - 1 (numpy refuses negative ones)
CORPUS_PLACES = ("driver", "actor")  # where an async phase keeps its fuzzer (actor: a Ray actor)
# how policies see observations during a phase: one batch per step, candidates re-run alone
# (batched), or one observation per call throughout (alone); docs/verdicts.md
INFERENCE_MODES = ("auto", "batched", "alone")


class CampaignError(ValueError):
    """A campaign file that cannot be run as written."""


@dataclass
class Budget:
    episodes: int | None = None
    seconds: float | None = None


@dataclass
class SafetySpec:
    fuzzer: str = "curefuzz"
    params: dict = field(default_factory=dict)
    budget: Budget = field(default_factory=lambda: Budget(episodes=1000))
    sampling_fraction: float = 0.25
    generation_size: int = 64
    execution: str = "sync"  # "sync" | "async" (EXECUTION_MODES)
    corpus: str = "driver"  # "driver" | "actor" (CORPUS_PLACES; actor: async with Ray workers only)
    inference: str = "auto"  # "auto" | "batched" | "alone" (INFERENCE_MODES; docs/verdicts.md)


@dataclass
class ChallengerSpec:
    algos: list = field(default_factory=lambda: ["bcq"])
    preset: str | None = None
    steps: int | None = None
    eval_episodes: int = 100
    torch_threads: int | None = None


@dataclass
class OptimalitySpec:
    fuzzer: str = "delta"
    params: dict = field(default_factory=dict)
    challenger: str | None = None
    oracle: str = "auto"
    delta: float = 0.0
    repeats: int | None = None
    alpha: float = 0.05
    budget: Budget = field(default_factory=lambda: Budget(episodes=1000))
    sampling_fraction: float = 0.25
    generation_size: int | None = None  # None: the fuzzer's default_generation_size (delta 8, others 64)
    execution: str = "sync"  # "sync" | "async" (EXECUTION_MODES)
    corpus: str = "driver"  # "driver" | "actor" (CORPUS_PLACES; actor: async with Ray workers only)
    inference: str = "auto"  # "auto" | "batched" | "alone" (INFERENCE_MODES; docs/verdicts.md)

    def __post_init__(self):
        if self.generation_size is None and str(self.fuzzer).lower() in FUZZERS:
            self.generation_size = int(fuzzer_class(self.fuzzer).default_generation_size)


@dataclass
class Campaign:
    scenario: str
    aut: str
    output: str
    name: str = ""
    seed: int = 0
    workers: int | str = "auto"  # "auto" or the number of Ray rollout actors (0: in this process)
    batch_size: int = 256
    scenario_overrides: dict = field(default_factory=dict)
    mlflow: bool = True
    safety: SafetySpec | None = field(default_factory=SafetySpec)
    challenger: ChallengerSpec | None = None
    optimality: OptimalitySpec | None = None
    llm: LLMConfig | None = None  # the LLM endpoint of LLM-guided fuzzers (llmtester)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def scenario_ref(self) -> ScenarioRef:
        return ScenarioRef.of(self.scenario, self.scenario_overrides)

    def build_scenario(self):
        """The campaign's scenario, built once (validation builds it, the phases reuse it)."""
        ref = self.scenario_ref
        cached = self.__dict__.get("_built")
        if cached is None or cached[0] != ref:
            self.__dict__["_built"] = (ref, ref.build())
        return self.__dict__["_built"][1]


_TYPES = {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "a mapping",
          list: "a list"}


def _build(cls, data: Any, where: str):
    """Build dataclass ``cls`` from ``data`` checking keys and types; ``where`` names the field."""
    if not isinstance(data, dict):
        raise CampaignError(f"{where or 'the campaign'} must be a mapping of settings, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise CampaignError(f"unknown key {where + '.' if where else ''}{unknown[0]}; allowed keys: {', '.join(fields)}")
    kwargs = {}
    hints = {f.name: f.type for f in dataclasses.fields(cls)}
    for name, value in data.items():
        path = f"{where}.{name}" if where else name
        sub = {"Budget": Budget, "SafetySpec": SafetySpec, "ChallengerSpec": ChallengerSpec,
               "OptimalitySpec": OptimalitySpec, "LLMConfig": LLMConfig}.get(str(hints[name]).split(" |")[0])
        if sub is not None and value is not None:
            kwargs[name] = _build(sub, value, path)
            continue
        if cls is Campaign and name == "workers":
            kwargs[name] = _check_workers(value)
            continue
        kwargs[name] = _check_type(value, str(hints[name]), path)
    missing = [n for n, f in fields.items()
               if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and n not in kwargs]
    if missing:
        raise CampaignError(f"missing required key {where + '.' if where else ''}{missing[0]}")
    return cls(**kwargs)


def _check_workers(value):
    """``workers``: ``auto`` or an integer >= 0."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CampaignError(f"workers must be auto or an integer >= 0 (0 runs in this process), got {value!r}")
    return value


def _check_type(value, hint: str, path: str):
    optional = "None" in hint
    if value is None:
        if optional:
            return None
        raise CampaignError(f"{path} must be set (got null)")
    for py, label in ((bool, "bool"), (int, "int"), (float, "float"), (str, "str"), (dict, "dict"), (list, "list")):
        if hint.startswith(label) or hint.startswith(f"{label} |"):
            ok = isinstance(value, py) and not (py in (int, float) and isinstance(value, bool))
            if py is float and isinstance(value, int) and not isinstance(value, bool):
                ok, value = True, _as_float(value, path)
            if py is int and isinstance(value, str) and _NUMBER_TEXT.fullmatch(value.strip()):
                ok, value = _integral(value)  # YAML 1.1 reads 1e3 as text; 1e3 episodes mean 1000
            if py is float and isinstance(value, str) and _NUMBER_TEXT.fullmatch(value.strip()):
                ok, value = True, _as_float(value, path)  # YAML 1.1 reads 1e3 (no dot) as text
            if not ok:
                raise CampaignError(f"{path} must be {_TYPES[py]}, got {value!r}")
            if py is float and not math.isfinite(value):  # YAML's .nan / .inf: an endless or undefined budget
                raise CampaignError(f"{path} must be a finite number, got {value!r}")
            return value
    return value


def _integral(text: str):
    """``(True, n)`` for number text that is a whole number (``1e3``: 1000), else ``(False, text)``."""
    from decimal import Decimal, InvalidOperation

    try:
        d = Decimal(text.strip())
    except InvalidOperation:
        return False, text
    if d != d.to_integral_value() or abs(d.adjusted()) > 100:
        return False, text
    return True, int(d)


def _as_float(value, path: str) -> float:
    try:
        return float(value)
    except OverflowError:  # an integer beyond a float's range
        raise CampaignError(f"{path} must be a finite number, got {value!r}") from None


def expand_path(text: str, what: str = "output") -> str:
    """``~`` and environment variables expanded, as a shell would; an unset variable refused
    (it would leave a literal ``$NAME`` folder)."""
    out = os.path.expandvars(os.path.expanduser(text))
    left = re.search(r"\$(\w+|\{\w+\})", out)
    if left and left.group(0) in text:
        raise CampaignError(f"{what}: environment variable {left.group(1).strip('{}')} is not set (in {text!r})")
    if out.startswith("~"):
        raise CampaignError(f"{what}: cannot expand {text.split('/')[0]!r} (no such user); give the folder's full path")
    return out


def load_campaign(path: str | Path, **overrides) -> Campaign:
    """Read and validate a campaign file (``overrides`` replace top-level keys, e.g. output)."""
    p = Path(path)
    data = load_yaml(p, "campaign file", CampaignError, fix="examples are in experiments/campaigns/")
    data.update({k: v for k, v in overrides.items() if v is not None})
    campaign = _build(Campaign, data, "")
    if not campaign.name:
        campaign.name = p.stem
    validate_campaign(campaign)
    return campaign


def campaign_from_dict(data: dict, where: str = "the resolved campaign") -> Campaign:
    """A campaign from its resolved form (``campaign.json`` of a run folder, which also says its
    run-folder layout version)."""
    data = {k: v for k, v in data.items() if k != "layout_version"}  # RunFolder.campaign_dict checks it
    try:
        c = _build(Campaign, data, "")
    except CampaignError as exc:
        raise CampaignError(f"{where}: {exc}") from exc
    validate_campaign(c)
    return c


def campaign_of_run(run_dir) -> Campaign:
    """The campaign of a run folder, validated, its ``output`` pointing at the folder."""
    from orchestrator.runs.layout import RunFolder

    run = RunFolder(run_dir)
    c = campaign_from_dict(run.campaign_dict(), str(run.campaign_json))
    c.output = str(run.root)
    return c


def _validate_output_and_seed(c: Campaign) -> None:
    if not isinstance(c.output, str) or not c.output.strip():
        raise CampaignError(f"output must be a folder path, got {c.output!r} (an empty path would write the run "
                            f"into the current folder): set output or give --out DIR")
    c.output = expand_path(c.output)
    if isinstance(c.aut, str) and c.aut.startswith(("~", "$")):  # a policy file under ~ or $VAR
        c.aut = expand_path(c.aut, "aut")
    o = c.optimality
    if o is not None and isinstance(o.challenger, str) and o.challenger.startswith(("~", "$")):
        o.challenger = expand_path(o.challenger, "optimality.challenger")
    if not 0 <= c.seed <= MAX_SEED:
        raise CampaignError(f"seed must be an integer from 0 to {MAX_SEED}, got {c.seed}")


def validate_campaign(c: Campaign):
    """Semantic checks: known scenario and fuzzer, sane budgets and sizes. Returns the scenario it
    built (the phases reuse it through ``c.build_scenario()``)."""
    _validate_output_and_seed(c)
    _validate_overrides(c)
    try:
        scenario = c.build_scenario()
    except ScenarioError as exc:
        raise CampaignError(f"scenario: {exc}") from exc
    except (TypeError, ValueError, KeyError, AttributeError) as exc:  # an override the scenario cannot take
        raise CampaignError(f"scenario_overrides: {c.scenario} cannot take {c.scenario_overrides!r} "
                            f"({type(exc).__name__}: {exc})") from None
    if c.safety is not None:
        _validate_search(c.safety, "safety")
        if fuzzer_class(c.safety.fuzzer).needs_challenger:
            raise CampaignError(f"safety.fuzzer: {c.safety.fuzzer} tests optimality (it needs the challenger); "
                                f"use it under optimality.fuzzer")
    for where, spec in (("safety", c.safety), ("optimality", c.optimality)):
        if spec is not None and spec.fuzzer.lower() in FUZZERS:
            _validate_fuzzer(c, spec, where)
    _validate_llm_section(c)
    if c.safety is None and c.challenger is None and c.optimality is None:
        raise CampaignError("the campaign has no phase: give a safety, challenger or optimality section")
    c.workers = _check_workers(c.workers)
    if not 1 <= c.batch_size <= MAX_SIZE:
        raise CampaignError(f"batch_size must be from 1 to {MAX_SIZE:,}, got {c.batch_size}")
    if c.challenger is not None:
        _validate_challenger(c)
    if c.optimality is not None:
        _validate_optimality(c, scenario)
    return scenario


def _validate_overrides(c: Campaign) -> None:
    """Each override against the scenario's own setting: a known field that may be set, with a
    value of the same kind (a finite number, an integer for an integer, a list of the same
    length for an array); ``max_steps`` >= 1. Gymnasium scenarios check their own (``spec``)."""
    if not isinstance(c.scenario_overrides, dict) or not c.scenario_overrides or str(c.scenario)[:4].lower() == "gym:":
        return
    from envs import get_scenario

    try:
        default = get_scenario(c.scenario)
    except ScenarioError as exc:
        raise CampaignError(f"scenario: {exc}") from exc
    for key, value in c.scenario_overrides.items():
        where = f"scenario_overrides.{key}"
        if key in FIXED_SCENARIO_FIELDS:
            raise CampaignError(f"{where}: {key} says which scenario this is and cannot be overridden; choose "
                                f"another scenario with scenario: instead")
        if not hasattr(default, key):
            raise CampaignError(f"scenario: scenario {default.name} has no setting {key!r}")
        _check_override(where, getattr(default, key), value)


def _check_override(where: str, have, value) -> None:
    import numpy as np

    def number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    if isinstance(have, bool):
        ok, want = isinstance(value, bool), "true or false"
    elif isinstance(have, int):
        ok, want = isinstance(value, int) and not isinstance(value, bool) and value >= (1 if have >= 1 else 0), \
            f"an integer >= {1 if have >= 1 else 0}"
    elif isinstance(have, float):
        ok, want = number(value), "a finite number"
    elif isinstance(have, np.ndarray) or (isinstance(have, (list, tuple)) and all(number(v) for v in have)):
        n = int(np.size(have))
        ok = isinstance(value, list) and len(value) == n and all(number(v) for v in value)
        want = f"a list of {n} finite numbers"
    elif isinstance(have, str):
        ok, want = isinstance(value, str), "a string"
    else:
        return  # a structured setting: the scenario checks it when it builds
    if not ok:
        raise CampaignError(f"{where} must be {want} (the scenario's default: {_shown(have)}), got {value!r}")


def _shown(v) -> str:
    return repr(v.tolist()) if hasattr(v, "tolist") else repr(v)


def _validate_fuzzer(c: Campaign, spec, where: str) -> None:
    """A known fuzzer's parameters, and the LLM of an LLM-guided one."""
    unknown = sorted(set(spec.params) - set(fuzzer_params(spec.fuzzer)))
    if unknown:
        raise CampaignError(f"{where}.params: {spec.fuzzer} has no parameter {unknown[0]!r}; its parameters: "
                            f"{', '.join(fuzzer_params(spec.fuzzer)) or 'none'} (docs/fuzzers.md)")
    if not fuzzer_class(spec.fuzzer).needs_llm:
        return
    from workers import local_llm

    try:
        if local_llm.uses_local_model(c.llm):  # no endpoint: the local model, started by the campaign
            local_llm.check_installed()
            LLMConfig(**{**(c.llm or LLMConfig()).to_dict(), "base_url": "http://127.0.0.1/v1",
                         "model": local_llm.MODEL_ALIAS}).check()
        else:
            (c.llm or LLMConfig()).check()
    except LLMConfigError as exc:
        raise CampaignError(f"{where}.fuzzer: {spec.fuzzer} asks an LLM for new scenarios, but {exc}") from exc


def _validate_llm_section(c: Campaign) -> None:
    """An llm section with an endpoint must be usable even when no fuzzer of this campaign asks
    for it (a grid may switch the fuzzer); without an endpoint it is checked with the fuzzer."""
    if c.llm is not None and c.llm.resolved().base_url and c.llm.resolved().model:
        try:
            c.llm.check()
        except LLMConfigError as exc:
            raise CampaignError(f"llm: {exc}") from exc


def _validate_challenger(c: Campaign) -> None:
    from workers.challenger import ALGOS, challenger_config
    from workers.training import TrainingError

    ch = c.challenger
    if not ch.algos:
        raise CampaignError(f"challenger.algos: list at least one of {', '.join(ALGOS)}")
    for algo in ch.algos:
        if algo not in ALGOS:
            raise CampaignError(f"challenger.algos: unknown algorithm {algo!r}; allowed: {', '.join(ALGOS)}")
        try:  # the preset exists, covers the scenario and its settings are valid d3rlpy settings
            challenger_config(c.scenario, algo, ch.preset, steps=ch.steps, torch_threads=ch.torch_threads).validate()
        except TrainingError as exc:
            raise CampaignError(f"challenger: {exc}") from exc
    if ch.steps is not None and not 1 <= ch.steps <= MAX_STEPS:
        raise CampaignError(f"challenger.steps must be from 1 to {MAX_STEPS:,}, got {ch.steps}")
    if ch.torch_threads is not None and (not isinstance(ch.torch_threads, int) or ch.torch_threads < 1):
        raise CampaignError(f"challenger.torch_threads must be an integer >= 1 (or null: the preset's), "
                            f"got {ch.torch_threads!r}")
    if not 1 <= ch.eval_episodes <= MAX_SIZE:
        raise CampaignError(f"challenger.eval_episodes must be from 1 to {MAX_SIZE:,}, got {ch.eval_episodes}")
    if c.safety is None:
        raise CampaignError("challenger: it trains on the safety phase's record D; add a safety section")


def _validate_optimality(c: Campaign, scenario) -> None:
    from orchestrator.fuzzers.oracles import ORACLES, make_oracle

    o = c.optimality
    _validate_search(o, "optimality")
    if o.challenger is None and c.challenger is None:
        raise CampaignError("optimality.challenger: give a challenger policy URI, or a challenger section "
                            "that trains one")
    if o.oracle not in ORACLES:
        raise CampaignError(f"optimality.oracle: unknown oracle {o.oracle!r}; allowed: {', '.join(ORACLES)}")
    if o.delta < 0:
        raise CampaignError(f"optimality.delta must be >= 0, got {o.delta}")
    if o.repeats is not None and not 1 <= o.repeats <= MAX_SIZE:
        raise CampaignError(f"optimality.repeats must be from 1 to {MAX_SIZE:,}, got {o.repeats}")
    if not 0 < o.alpha < 1:
        raise CampaignError(f"optimality.alpha must be in (0, 1), got {o.alpha}")
    try:  # e.g. a statistical oracle whose repeats cannot reach its alpha
        make_oracle(o.oracle, scenario, delta=o.delta, repeats=o.repeats, alpha=o.alpha)
    except ValueError as exc:
        raise CampaignError(f"optimality: {exc}") from exc


def _validate_budget(b: Budget, where: str) -> None:
    if b.episodes is None and b.seconds is None:
        raise CampaignError(f"{where}.budget: give episodes or seconds (e.g. {{episodes: 2000}})")
    if b.episodes is not None and b.episodes <= 0:
        raise CampaignError(f"{where}.budget.episodes must be a positive integer, got {b.episodes}")
    if b.episodes is not None and b.episodes > MAX_EPISODES:
        raise CampaignError(f"{where}.budget.episodes must be at most {MAX_EPISODES:,}, got {b.episodes:,}")
    if b.seconds is not None and b.seconds <= 0:
        raise CampaignError(f"{where}.budget.seconds must be a positive number, got {b.seconds}")
    if b.seconds is not None and b.seconds > MAX_SECONDS:
        raise CampaignError(f"{where}.budget.seconds must be at most {MAX_SECONDS:,.0f} (one year), got {b.seconds:g}")


def _validate_search(spec, where: str) -> None:
    """Checks shared by the safety and optimality sections."""

    if spec.fuzzer.lower() not in FUZZERS:
        raise CampaignError(f"{where}.fuzzer: unknown fuzzer {spec.fuzzer!r}; allowed: {', '.join(FUZZERS)}")
    _validate_budget(spec.budget, where)
    if not 0.0 < spec.sampling_fraction < 1.0:
        raise CampaignError(f"{where}.sampling_fraction must be between 0 and 1 (exclusive), got {spec.sampling_fraction}")
    if spec.generation_size < 1:
        raise CampaignError(f"{where}.generation_size must be >= 1, got {spec.generation_size}")
    if spec.generation_size > MAX_SIZE:
        raise CampaignError(f"{where}.generation_size must be at most {MAX_SIZE:,}, got {spec.generation_size:,}")
    if spec.execution not in EXECUTION_MODES:
        raise CampaignError(f"{where}.execution must be one of {', '.join(EXECUTION_MODES)} (sync: generations with "
                            f"a barrier, the reproducible default; async: steady state, every rollout actor kept "
                            f"busy), got {spec.execution!r}")
    if spec.inference not in INFERENCE_MODES:
        raise CampaignError(f"{where}.inference must be one of {', '.join(INFERENCE_MODES)} (auto: the scenario's "
                            f"choice, the default; batched: the search acts in batches and re-runs candidates alone; "
                            f"alone: every observation is acted on as if alone), got {spec.inference!r}")
    if spec.corpus not in CORPUS_PLACES:
        raise CampaignError(f"{where}.corpus must be one of {', '.join(CORPUS_PLACES)} (driver: the fuzzer lives in "
                            f"the driver, the default; actor: in a Ray actor, with execution: async), got {spec.corpus!r}")
    if spec.corpus == "actor" and spec.execution != "async":
        raise CampaignError(f"{where}.corpus: actor needs {where}.execution: async (a sync phase keeps its corpus in "
                            f"the driver); set execution: async or drop corpus: actor")
    if spec.corpus == "actor" and fuzzer_class(spec.fuzzer).needs_llm:
        raise CampaignError(f"{where}.corpus: actor is not available for {spec.fuzzer} (an LLM-guided fuzzer calls the "
                            f"driver's LLM pool); drop corpus: actor")


def set_values(d: dict) -> dict:
    """``d`` without its unset entries (None, and sections left empty by that), recursively: what
    MLflow gets as parameters (an unset option is no parameter, not the string "None")."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            v = set_values(v)
            if not v:
                continue
        if v is None:
            continue
        out[k] = v
    return out
