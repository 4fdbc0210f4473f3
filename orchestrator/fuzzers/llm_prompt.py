"""LLMTester's prompt template (paper Sec. III-B, Figs. 3-4) and the parser of its replies.

A prompt has the paper's four parts:

* **Instruction** (system message): the role ("test scenario generator") and the task (mutate
  the seed scenario's initial state so that the policy under test fails).
* **Scenario information**: overview, entities, state description and constraints. They are
  data, one YAML file per scenario in ``experiments/llmtester/scenarios/<name>.yaml``; a
  scenario without a file gets a generic description built from its state names, meanings
  and bounds (so every deltarl scenario works, less well described).
* **Input**: the seed scenario (its state as JSON, and the return the policy got from it),
  the testing feedback F (recent bad cases) and the expert experience E.
* **Output**: the chain of thought the paper asks for — scenario analysis, evolution
  prediction, challenge analysis, plan, plan execution, explanation — ending in one
  machine-readable line ``NEW_STATE: {"name": value, ...}``.

:func:`parse_reply` extracts and validates that state; a :class:`ReplyError` says what was
wrong in words that go back into later prompts as feedback.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from workers.resources import resource

INFO_DIR = resource("llmtester", "scenarios")
_INFO_KEYS = ("overview", "entities", "state_description", "constraints", "expert", "system_under_test")


class ReplyError(ValueError):
    """A reply without a usable state; the message is fed back to the LLM."""


@dataclass
class ScenarioInfo:
    """The constant part of the prompt for one scenario."""

    name: str
    system_under_test: str = "a decision-making policy"
    overview: str = ""
    entities: list = field(default_factory=list)
    state_description: str = ""
    constraints: list = field(default_factory=list)
    expert: list = field(default_factory=list)  # default expert experience E

    @classmethod
    def load(cls, scenario, directory: Path | None = None) -> "ScenarioInfo":
        """The scenario's YAML file if there is one, else a generic description."""
        import yaml

        path = Path(directory or INFO_DIR) / f"{scenario.name}.yaml"
        info = cls.generic(scenario)
        if path.is_file():
            data = yaml.safe_load(path.read_text()) or {}
            unknown = sorted(set(data) - set(_INFO_KEYS))
            if unknown:
                raise ValueError(f"{path}: unknown key {unknown[0]!r}; allowed: {', '.join(_INFO_KEYS)}")
            for k, v in data.items():
                setattr(info, k, v)
        return info

    @classmethod
    def generic(cls, scenario) -> "ScenarioInfo":
        return cls(
            name=scenario.name,
            system_under_test=f"a reinforcement-learning agent in the {scenario.env_id or scenario.name} environment",
            overview=(f"The agent acts in {scenario.name} for at most {scenario.max_steps} steps. "
                      f"A test fails when: {scenario.failure_rule or 'the agent does not complete its task'}."),
            entities=[f"the agent (actions: {scenario.action.describe()})"],
            constraints=[])


def state_lines(scenario) -> list[str]:
    return [f"- {n}: {m} (valid range [{lo:.6g}, {hi:.6g}])" if hi > lo else f"- {n}: {m} (fixed at {lo:.6g})"
            for n, m, lo, hi in zip(scenario.state_names, scenario.state_meaning, scenario.low, scenario.high)]


def state_json(scenario, state: np.ndarray, digits: int = 6) -> str:
    return json.dumps({n: float(f"{float(v):.{digits}g}") for n, v in zip(scenario.state_names, state)})


def build_messages(scenario, info: ScenarioInfo, seed_state: np.ndarray, seed_return: float | None,
                   feedback: list[str], expert: list[str]) -> list[dict]:
    """The chat messages for one generation request (Fig. 4's template)."""
    system = (f"You are a test scenario generator for {info.system_under_test}. Your task is to mutate the "
              f"initial state of a given scenario so that the policy under test fails, while the scenario stays "
              f"valid. You reason step by step and you always end with the new state in the requested format.")
    ents = "\n".join(f"- {e}" for e in info.entities) or "- (none listed)"
    cons = ["Every value must stay inside its valid range; fixed values must not change.",
            f"Output exactly the {scenario.state_dim} values named in the state description, as numbers."]
    cons += [str(c) for c in info.constraints]
    seed = state_json(scenario, seed_state)
    ret = "" if seed_return is None or not math.isfinite(seed_return) else (
        f"\nThe policy under test obtained a cumulative reward of {seed_return:.4g} from this seed scenario "
        f"(lower means closer to failure).")
    fb = "\n".join(f"- {f}" for f in feedback) if feedback else "- none yet"
    ex = "\n".join(f"- {e}" for e in expert) if expert else "- none"
    user = f"""## Scenario Information
### Overview
{info.overview.strip()}
### Entity Information
{ents}
### State Description
{info.state_description.strip() + chr(10) if info.state_description else ''}The initial state has {scenario.state_dim} values:
{chr(10).join(state_lines(scenario))}
### Constraints
{chr(10).join('- ' + c for c in cons)}

## Input
### Seed Scenario
{seed}{ret}
### Testing Feedback (bad cases of earlier generated scenarios; avoid repeating them)
{fb}
### Expert Experience
{ex}

## Output
Answer in these steps, each under its own heading:
1. Scenario Analysis: describe the seed scenario's initial state and the relations between the entities.
2. Evolution Prediction: predict how the scenario will evolve under the policy.
3. Challenge Analysis: identify how the policy could be made to fail, and the idea to get there.
4. Plan: a step-by-step plan to modify the seed scenario.
5. Plan Execution: carry out the plan value by value.
6. Explanation: explain why the new scenario is more challenging and still valid.
Finish with one last line holding the new state as a JSON object with exactly the same keys as the seed:
NEW_STATE: {seed}"""
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


_NEW_STATE = re.compile(r"NEW_STATE\s*:?\s*", re.IGNORECASE)


def _json_objects(text: str):
    """Every top-level ``{...}`` that parses as JSON, in order of appearance."""
    dec = json.JSONDecoder()
    i = 0
    while True:
        i = text.find("{", i)
        if i < 0:
            return
        try:
            obj, end = dec.raw_decode(text, i)
        except ValueError:
            i += 1
            continue
        if isinstance(obj, dict):
            yield obj
        i = end


def parse_reply(text: str, scenario) -> np.ndarray:
    """The new state in ``text``: the JSON object after the last ``NEW_STATE:`` marker, else
    the last JSON object in the reply with all the state's names. Validated against the
    scenario (finite, inside the bounds); raises :class:`ReplyError` saying what was wrong."""
    if not isinstance(text, str) or not text.strip():
        raise ReplyError("the reply was empty")
    names = list(scenario.state_names)
    marks = list(_NEW_STATE.finditer(text))
    candidates = []
    if marks:
        candidates = list(_json_objects(text[marks[-1].end():]))[:1]
    if not candidates:
        candidates = [o for o in _json_objects(text) if set(names) <= set(o)][-1:]
    if not candidates:
        raise ReplyError("the reply had no machine-readable state: end with a line "
                         "'NEW_STATE: {...}' holding a JSON object with keys " + ", ".join(names))
    obj = candidates[0]
    missing = [n for n in names if n not in obj]
    if missing:
        raise ReplyError(f"the new state lacked {', '.join(missing)}; give all {len(names)} values")
    extra = [k for k in obj if k not in names]
    if extra:
        raise ReplyError(f"the new state had unknown keys {', '.join(map(str, extra))}; use exactly "
                         f"{', '.join(names)}")
    values = []
    for n in names:
        v = obj[n]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ReplyError(f"'{n}' must be a number, got {v!r}")
        values.append(float(v))
    from envs.base import InvalidStateError

    try:
        return scenario.validate(np.asarray(values, dtype=np.float64)[None, :])[0]
    except InvalidStateError as exc:
        msg = str(exc).replace("initial state #0 has ", "").replace("; see `deltarl scenarios` for the bounds", "")
        raise ReplyError(f"invalid scenario: {msg}") from exc
