"""What a run's record comes from, recorded at its start and checked on every resume.

A run folder's episodes are a function of the AUT (the bytes of the loaded policy, as every
episode's ``policy_sha256``), the challenger, the seed, the scenario and its overrides, each
phase's search settings and deltarl's version. ``identity.json`` (:data:`IDENTITY_FILE`) holds
them as the run started; ``deltarl run --resume`` recomputes them and refuses, before writing
anything, when one differs (a replaced AUT file, a seed or AUT edited in ``campaign.json``):
a record that mixes two agents or two seeds would be wrong without a word.

    ident = {"aut": uri, "aut_sha256": "f007…", "seed": 0, ...}   # the campaign's (pipeline.py)
    check_identity(root, ident, resume=True)   # StoreError naming what changed, or nothing
    record_identity(root, ident)               # a new run (or a phase added: its settings merged)

Budgets are not part of the identity: a resumed phase may be given a larger budget (the record
so far is the same episodes), and ``workers`` does not change a record (docs/scaling.md).
"""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.runs.layout import policy_file
from orchestrator.runs.store import StoreError, atomic_write_bytes

# the run folder's identity file (kept beside campaign.json; tests/test_layers.py's list of
# names that only the layout spells does not include it: this module is its one owner)
IDENTITY_FILE = "identity.json"
IDENTITY_VERSION = 1

# keys in the order a message names them, with the words it uses
_WORDS = {
    "deltarl_version": "deltarl's version",
    "scenario": "the scenario",
    "scenario_overrides": "the scenario overrides",
    "aut": "the AUT (campaign.json's aut)",
    "aut_sha256": "the AUT file",
    "seed": "the seed",
    "batch_size": "batch_size",
}


def identity_path(root: str | Path) -> Path:
    return Path(root) / IDENTITY_FILE


def read_identity(root: str | Path) -> dict | None:
    """The recorded identity, or None (a run from before identities were recorded)."""
    path = identity_path(root)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise StoreError(f"{path} is damaged ({type(exc).__name__}: {exc}); restore it or start a new run") from exc
    if not isinstance(data, dict):
        raise StoreError(f"{path} is damaged (it holds a {type(data).__name__}); restore it or start a new run")
    return data


def record_identity(root: str | Path, identity: dict) -> None:
    """Write ``identity`` (whole file, atomically)."""
    path = identity_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, json.dumps({**plain(identity), "identity_version": IDENTITY_VERSION}, indent=2,
                                        sort_keys=True).encode())


def _short(v) -> str:
    if isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v):
        return v[:8] + "…"
    return json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else repr(v)


def differences(have: dict, want: dict, *, phases: tuple[str, ...] | None = None) -> list[str]:
    """What changed from ``have`` (recorded) to ``want`` (now), in words; only the phases named
    in ``phases`` are compared (None: every phase of either)."""
    out = []
    # an AUT file is named from where deltarl runs (a moved run folder, another working directory):
    # its path is no part of the identity, its bytes (aut_sha256) are
    files = policy_file(have.get("aut")) and policy_file(want.get("aut"))
    for key, words in _WORDS.items():
        a, b = have.get(key), want.get(key)
        if key == "scenario_overrides":
            a, b = a or {}, b or {}
        if key == "aut" and files:
            continue
        if key == "aut_sha256" and have.get("aut") != want.get("aut") and not files:
            continue  # the URI changed: that is the message
        if key in have and a != b:
            how = f"sha256 {_short(a)} → {_short(b)}" if key == "aut_sha256" else f"{_short(a)} → {_short(b)}"
            out.append(f"{words} changed since this run started ({how})")
    hp, wp = have.get("phases") or {}, want.get("phases") or {}
    for phase in phases if phases is not None else sorted(set(hp) | set(wp)):
        a, b = hp.get(phase), wp.get(phase)
        if a is None or b is None:
            continue
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                what = "file" if k.endswith("sha256") else "setting"
                how = f"sha256 {_short(a.get(k))} → {_short(b.get(k))}" if k.endswith("sha256") \
                    else f"{_short(a.get(k))} → {_short(b.get(k))}"
                name = f"the {phase} challenger {what}" if k == "challenger_sha256" else f"{phase}.{k}"
                out.append(f"{name} changed since this run started ({how})")
    return out


def plain(identity: dict) -> dict:
    """``identity`` as JSON gives it back (tuples as lists, numpy scalars as numbers): what is
    compared with the recorded one."""
    return json.loads(json.dumps(identity, sort_keys=True, default=lambda x: x.item() if hasattr(x, "item") else str(x)))


def check_identity(root: str | Path, identity: dict, *, resume: bool) -> dict:
    """Refuse (:class:`StoreError`, one message naming the first change) a run whose recorded
    identity differs from ``identity``. ``resume``: every phase must match; else (a phase added
    to the run) the phases both hold must match and the new ones are merged in. Returns the
    identity to record (None recorded: ``identity`` itself)."""
    identity = plain(identity)
    have = read_identity(root)
    if have is None:
        return identity
    have.pop("identity_version", None)
    changed = differences(have, identity, phases=None)
    if changed:
        more = f" (and {len(changed) - 1} more change{'s' if len(changed) > 2 else ''})" if len(changed) > 1 else ""
        how = "--resume" if resume else "adding a phase to"
        raise StoreError(f"{how} {Path(root)}: {changed[0]}{more}. A run's record comes from one AUT, seed and "
                         f"setup: restore what changed, or start a new run in another folder")
    if resume:
        missing = sorted(set(identity.get("phases") or {}) - set(have.get("phases") or {}))
        if not missing:
            return have
    merged = dict(have)
    merged["phases"] = {**(have.get("phases") or {}), **(identity.get("phases") or {})}
    return merged
