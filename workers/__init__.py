"""The engine's worker side: policies, lockstep rollouts, the rollout actor, training jobs.

Importing this package first drops the old ``gym`` package's import banner (see
:func:`quiet_gym_notice`); every process that runs deltarl code, the driver and each Ray worker,
imports it before d3rlpy or stable-baselines3 (which import ``gym``).
"""

from __future__ import annotations

import sys

GYM_NOTICE_START = "Gym has been unmaintained since 2022"


def quiet_gym_notice() -> None:
    """Keep gym 0.26's "Gym has been unmaintained since 2022 ..." banner off stderr.

    d3rlpy requires the old ``gym`` package (stable-baselines3 imports it too when present), and
    ``gym/__init__.py`` prints ``gym_notices.notices.notices[gym.__version__]`` to stderr at import:
    a plain print, not a warning, with no switch to turn it off. This removes the entries of that
    table that are this banner (they start with :data:`GYM_NOTICE_START`) before gym is imported;
    other notices, and every warning, are left alone. Safe to call more than once; without
    gym_notices it does nothing.
    """
    if "gym" in sys.modules:  # too late, and nothing left to print
        return
    try:
        from gym_notices import notices
    except Exception:  # noqa: BLE001 - not installed, or not the package we know
        return
    table = getattr(notices, "notices", None)
    if isinstance(table, dict):
        for version in [v for v, text in table.items() if isinstance(text, str) and text.startswith(GYM_NOTICE_START)]:
            del table[version]


quiet_gym_notice()
