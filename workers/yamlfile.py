"""The one YAML loader of deltarl's files (campaigns, grids, AUT training presets, challenger
presets), with one error format: ``<what> <path>: <problem>; <fix>``, raised as the caller's
error type so each command keeps its exit code and message style.

    data = load_yaml(path, "campaign file", CampaignError, fix="examples are in experiments/campaigns/")

It refuses what ``yaml.safe_load`` lets through silently: duplicate keys (the later one would
win unseen), and reports invalid YAML with its line and column, a file that is not UTF-8, an
empty file, and a document that is not a mapping when ``mapping=True``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    seen = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            mark = key_node.start_mark
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (line {mark.line + 1}, column {mark.column + 1}; first at line "
                            f"{seen[key] + 1})", mark)
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_yaml(text: str) -> Any:
    """``text`` parsed strictly (duplicate keys refused); raises ``yaml.YAMLError``."""
    return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass


def _where(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is not None and "line" not in str(problem):
        return f"{problem} (line {mark.line + 1}, column {mark.column + 1})"
    return str(problem)


def load_yaml(path: str | Path, what: str, error: type[Exception] = ValueError, *, fix: str = "",
              mapping: bool = True, allow_empty: bool = False) -> Any:
    """The parsed content of the YAML file ``path`` (a ``what``, e.g. "campaign file").

    Every problem raises ``error`` with one message naming the file, the problem and ``fix``."""
    p = Path(path)
    tail = f"; {fix}" if fix else ""
    if not p.is_file():
        raise error(f"{what} {p} not found{tail}")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{what} {p} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from exc
    except OSError as exc:
        raise error(f"{what} {p} cannot be read ({exc.strerror or exc})") from exc
    try:
        data = parse_yaml(text)
    except yaml.YAMLError as exc:
        raise error(f"{what} {p} is not valid YAML: {_where(exc)}") from exc
    if data is None:
        if allow_empty:
            return {}
        raise error(f"{what} {p} is empty{tail}")
    if mapping and not isinstance(data, dict):
        raise error(f"{what} {p} must hold a mapping of settings (key: value), not {type(data).__name__}{tail}")
    return data
