"""LLMTester's prompt template (paper Sec. III-B, Figs. 3-4) and the parser of its replies.

A prompt has the paper's four parts:

* **Instruction** (system message): the role ("test scenario generator") and the task (mutate
  the seed scenario's initial state so that the policy under test fails).
* **Scenario information**: overview, entities, state description and constraints. They are
  data, one YAML file per scenario in ``experiments/llmtester/scenarios/<name>.yaml``; a
  scenario without a file gets a generic description built from its state names, meanings
  and bounds (so every deltarl scenario works, less well described), led by the scenario's
  own ``description`` where it has one (a ``gym:`` scenario's spec, e.g. highway-v0's traffic
  scene: the CARLA stand-in of issue 49). Integer state dimensions (a lane) are said to be
  integers, shown and asked for as integers.
* **Input**: the seed scenario (its state as JSON, and the return the policy got from it),
  the testing feedback F (recent bad cases) and the expert experience E.
* **Output**: the chain of thought the paper asks for — scenario analysis, evolution
  prediction, challenge analysis, plan, plan execution, explanation — ending in one
  machine-readable line ``NEW_STATE: {"name": value, ...}``; or, when the server constrains the
  reply to JSON (:func:`reply_schema`), the same steps as string fields and ``new_state``, or the
  JSON state alone (small models).

:func:`parse_reply` extracts and validates that state, tolerantly (fences, prose, near-JSON); a
:class:`ReplyError` says what was wrong in words that go back into later prompts as feedback.
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
        described = " ".join(str(getattr(scenario, "description", "") or "").split())
        return cls(
            name=scenario.name,
            system_under_test=f"a reinforcement-learning agent in the {scenario.env_id or scenario.name} environment",
            overview=(f"{described + ' ' if described else ''}"
                      f"The agent acts in {scenario.name} for at most {scenario.max_steps} steps. "
                      f"A test fails when: {scenario.failure_rule or 'the agent does not complete its task'}."),
            entities=[f"the agent (actions: {scenario.action.describe()})"],
            constraints=[])


def integer_dims(scenario) -> np.ndarray:
    """Which state values are integers: all of an integer-valued scenario's, or those a ``gym:``
    scenario's spec marks (``integer: true``, e.g. highway-v0's lanes)."""
    mask = np.asarray(getattr(scenario, "integer", ()), dtype=bool).reshape(-1)
    if mask.size != scenario.state_dim:
        mask = np.zeros(scenario.state_dim, dtype=bool)
    return mask | bool(scenario.integer_states)


def state_lines(scenario) -> list[str]:
    ints = integer_dims(scenario)
    return [f"- {n}: {m}{', an integer' if i and hi > lo else ''} (valid range [{lo:.6g}, {hi:.6g}])" if hi > lo
            else f"- {n}: {m} (fixed at {lo:.6g})"
            for n, m, lo, hi, i in zip(scenario.state_names, scenario.state_meaning, scenario.low, scenario.high, ints)]


def state_json(scenario, state: np.ndarray, digits: int = 6) -> str:
    """The state as JSON; integer values as 2, not 2.0 (what the schema asks for)."""
    ints = integer_dims(scenario)
    return json.dumps({n: int(round(float(v))) if i else float(f"{float(v):.{digits}g}")
                       for n, v, i in zip(scenario.state_names, state, ints)})


STEPS = (("scenario_analysis", "Scenario Analysis",
          "describe the seed scenario's initial state and the relations between the entities."),
         ("evolution_prediction", "Evolution Prediction", "predict how the scenario will evolve under the policy."),
         ("challenge_analysis", "Challenge Analysis", "identify how the policy could be made to fail, and the idea to get there."),
         ("plan", "Plan", "a step-by-step plan to modify the seed scenario."),
         ("plan_execution", "Plan Execution", "carry out the plan value by value."),
         ("explanation", "Explanation", "explain why the new scenario is more challenging and still valid."))
STATE_KEY = "new_state"  # the state's key in a JSON reply with reasoning fields


ENUM_MOST = 32  # integer states with at most this many valid values get them listed in the schema


def _value_schema(scenario, j: int) -> dict:
    """One state value: a number, or for integer states an integer (listed when the valid range is
    small: a schema-constrained model can then only write a valid kind, in one token)."""
    if not integer_dims(scenario)[j]:
        return {"type": "number"}
    lo, hi = float(scenario.low[j]), float(scenario.high[j])
    if np.isfinite(lo) and np.isfinite(hi) and hi - lo < ENUM_MOST:
        return {"type": "integer", "enum": list(range(int(np.ceil(lo)), int(np.floor(hi)) + 1))}
    return {"type": "integer"}


def state_schema(scenario) -> dict:
    """JSON schema of a state: an object with every state name as a number (an integer, from a
    listed set where it is small, for integer states), nothing else."""
    names = list(scenario.state_names)
    return {"type": "object", "properties": {n: _value_schema(scenario, j) for j, n in enumerate(names)},
            "required": names, "additionalProperties": False}


def reply_schema(scenario, reasoning: bool = True) -> dict:
    """JSON schema of a reply (for the server's ``response_format``): the state alone, or with
    ``reasoning`` the six steps of the paper's output as strings, then ``new_state``."""
    if not reasoning:
        return state_schema(scenario)
    props = {k: {"type": "string"} for k, _, _ in STEPS}
    props[STATE_KEY] = state_schema(scenario)
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def _output_section(seed: str, output: str) -> str:
    if output == "json":  # the JSON state alone (small models, schema-constrained)
        return ("Reply with the new state only: one JSON object with exactly the same keys as the seed, "
                f"each value a number, and nothing else:\n{seed}")
    if output == "json_reasoning":
        fields = "\n".join(f'- "{k}": {what}' for k, _, what in STEPS)
        return (f"Reply with one JSON object and nothing else. Its keys, in this order, are your reasoning steps "
                f"(short strings):\n{fields}\nand last \"{STATE_KEY}\": the new state as a JSON object with exactly "
                f"the same keys as the seed, each value a number:\n{seed}")
    steps = "\n".join(f"{i}. {title}: {what}" for i, (_, title, what) in enumerate(STEPS, 1))
    return (f"Answer in these steps, each under its own heading:\n{steps}\nFinish with one last line holding the new "
            f"state as a JSON object with exactly the same keys as the seed:\nNEW_STATE: {seed}")


PROMPT_LAYOUTS = ("paper", "shared_first")


def build_messages(scenario, info: ScenarioInfo, seed_state: np.ndarray, seed_return: float | None,
                   feedback: list[str], expert: list[str], output: str = "text", layout: str = "paper") -> list[dict]:
    """The chat messages for one generation request (Fig. 4's template). ``output``: ``text`` (the
    paper's reasoning steps under headings, then ``NEW_STATE: {...}``), ``json_reasoning`` (the same
    steps as the fields of one JSON object, :func:`reply_schema`) or ``json`` (the JSON state alone).
    ``layout``: ``paper`` orders the Input as Fig. 4 does (Seed Scenario, Testing Feedback, Expert
    Experience); ``shared_first`` puts the seed last (Testing Feedback, Expert Experience, Seed
    Scenario), so that the requests of one generation, which differ only in their seed, share
    everything before it and a server's prefix cache evaluates only the seed and the Output."""
    if output not in ("text", "json", "json_reasoning"):
        raise ValueError(f"build_messages: output must be text, json or json_reasoning, got {output!r}")
    if layout not in PROMPT_LAYOUTS:
        raise ValueError(f"build_messages: layout must be one of {', '.join(PROMPT_LAYOUTS)}, got {layout!r}")
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
    seed_part = f"### Seed Scenario\n{seed}{ret}"
    shared_part = (f"### Testing Feedback (bad cases of earlier generated scenarios; avoid repeating them)\n{fb}\n"
                   f"### Expert Experience\n{ex}")
    inputs = f"{seed_part}\n{shared_part}" if layout == "paper" else f"{shared_part}\n{seed_part}"
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
{inputs}

## Output
{_output_section(seed, output)}"""
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


_STATE_KEYS = re.compile(r"^new[_ ]?state$", re.IGNORECASE)
_FENCE = re.compile(r"```[a-zA-Z]*")
_TRAILING_COMMA = re.compile(r",\s*([}\]])")


def _repaired(text: str) -> str:
    """Common near-JSON of small models made JSON: code fences, trailing commas, single quotes,
    Python's True/False/None."""
    t = _FENCE.sub("", text)
    t = _TRAILING_COMMA.sub(r"\1", t)
    if '"' not in t:
        t = t.replace("'", '"')
    return re.sub(r"\bTrue\b", "true", re.sub(r"\bFalse\b", "false", re.sub(r"\bNone\b", "null", t)))


def _unwrap(obj, names: set, depth: int = 0):
    """The state inside a reply object: the object itself when it has every state name, else the
    value of a ``new_state`` / ``NEW_STATE`` key, else the last nested object with every name."""
    if not isinstance(obj, dict) or depth > 4:
        return None
    if names <= set(obj) or names <= {str(k).lower() for k in obj}:
        return obj
    for k, v in obj.items():
        if _STATE_KEYS.match(str(k)) and isinstance(v, dict):
            return v
    found = None
    for v in obj.values():
        found = _unwrap(v, names, depth + 1) or found
    return found


def _candidate(text: str, names: list[str]):
    """The state object of a reply (or the best partial one, for the error message), or None."""
    want = set(names)
    marks = list(_NEW_STATE.finditer(text))
    if marks:
        after = list(_json_objects(text[marks[-1].end():]))[:1]
        if after:
            return _unwrap(after[0], want) or after[0]
    objs = list(_json_objects(text))
    full = [u for u in (_unwrap(o, want) for o in objs) if u is not None]
    if full:
        return full[-1]
    # partial: the object sharing most names with the state (its error says what it lacked)
    scored = [(len(want & set(o)), i, o) for i, o in enumerate(objs)]
    scored = [t for t in scored if t[0] > 0]
    return max(scored)[2] if scored else None


def parse_reply(text: str, scenario) -> np.ndarray:
    """The new state in ``text``, tolerantly: the JSON object after the last ``NEW_STATE:`` marker,
    else the last JSON object in the reply that has all the state's names (at its top or under a
    ``new_state`` key: the JSON replies of :func:`reply_schema`), also inside code fences or prose,
    with trailing commas, single quotes or numbers written as strings. Validated against the
    scenario (finite, inside the bounds); raises :class:`ReplyError` saying what was wrong (and
    nothing else, whatever the reply holds)."""
    if not isinstance(text, str) or not text.strip():
        raise ReplyError("the reply was empty")
    names = list(scenario.state_names)
    obj = _candidate(text, names)
    if obj is None or not (set(names) & set(obj)):
        repaired = _repaired(text)
        if repaired != text:
            obj = _candidate(repaired, names) or obj
    if obj is None:
        raise ReplyError("the reply had no machine-readable state: end with a line "
                         "'NEW_STATE: {...}' holding a JSON object with keys " + ", ".join(names))
    if not set(names) <= set(obj):  # keys written in another case: "Theta" for theta
        lower = {str(k).lower(): k for k in obj}
        if set(n.lower() for n in names) <= set(lower) and len(lower) == len(obj):
            obj = {n: obj[lower[n.lower()]] for n in names} | {k: v for k, v in obj.items()
                                                               if str(k).lower() not in {n.lower() for n in names}}
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
        if isinstance(v, str):
            try:
                v = float(v.strip())
            except ValueError:
                raise ReplyError(f"'{n}' must be a number, got {obj[n]!r}") from None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ReplyError(f"'{n}' must be a number, got {str(v)[:40]!r}")
        try:
            values.append(float(v))
        except OverflowError:
            raise ReplyError(f"invalid scenario: '{n}' is too large ({str(v)[:20]}...)") from None
    from envs.base import InvalidStateError

    try:
        return scenario.validate(np.asarray(values, dtype=np.float64)[None, :])[0]
    except InvalidStateError as exc:
        msg = str(exc).replace("initial state #0 has ", "").replace("; see `deltarl scenarios` for the bounds", "")
        raise ReplyError(f"invalid scenario: {msg}") from exc
