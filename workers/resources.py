"""Where deltarl's shipped data lives: one function for every file that comes with the package.

The data are the folders of ``experiments/`` (the agent zoo, training and challenger presets,
LLMTester scenario texts, the papers' numbers, campaign files and grids). They are installed
with deltarl as the ``experiments`` package's data, so ``pip install .`` (not editable) finds
them as well as a checkout does::

    resource("zoo")                         # the agent zoo
    resource("challengers", "CartPole-v1.yaml")
    acasxu_dir()                            # the 45 ACAS Xu networks (not shipped: see below)

Environment variables override single resources: ``$DELTARL_ZOO`` (the zoo) and
``$DELTARL_ACASXU_DIR`` (the networks). The ACAS Xu networks are not redistributed with
deltarl; without ``$DELTARL_ACASXU_DIR`` they are looked for in ``shared/data/acasxu`` beside a
checkout (this project's layout).
"""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]  # meaningful only when running from a checkout


def data_root() -> Path:
    """The ``experiments`` data folder of the installed package (or of the checkout)."""
    try:
        root = Path(str(importlib.resources.files("experiments")))
    except ModuleNotFoundError:  # pragma: no cover - a broken install
        root = CHECKOUT / "experiments"
    return root


def resource(*parts: str) -> Path:
    """A path under the shipped data folder (it may not exist: callers say what is missing)."""
    return data_root().joinpath(*parts)


def zoo_dir() -> Path:
    """The agent zoo: ``$DELTARL_ZOO`` or the shipped ``experiments/zoo``."""
    env = os.environ.get("DELTARL_ZOO")
    return Path(env) if env else resource("zoo")


def is_zoo_name(name: str) -> bool:
    """Whether ``name`` can name a folder of the zoo: not empty, no path separator, not hidden."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name and not name.startswith(".")


def acasxu_dir() -> Path:
    """The ACAS Xu networks: ``$DELTARL_ACASXU_DIR``, else ``shared/data/acasxu`` beside the checkout."""
    env = os.environ.get("DELTARL_ACASXU_DIR")
    if env:
        return Path(env)
    shipped = resource("data", "acasxu")
    if shipped.is_dir():
        return shipped
    return CHECKOUT.parent / "shared" / "data" / "acasxu"
