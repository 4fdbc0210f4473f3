"""The engine's worker side: policies, lockstep rollouts, the rollout actor, training jobs.

Importing this package first drops the old ``gym`` package's import banner (see
:func:`quiet_gym_notice`) and takes scikit-learn out of d3rlpy's import (see
:func:`defer_sklearn_in_d3rlpy`); every process that runs deltarl code, the driver and each Ray
worker, imports it before d3rlpy or stable-baselines3 (which import ``gym``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

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
    except ImportError:  # not installed
        return
    table = getattr(notices, "notices", None)
    if isinstance(table, dict):
        for version in [v for v, text in table.items() if isinstance(text, str) and text.startswith(GYM_NOTICE_START)]:
            del table[version]


quiet_gym_notice()


# -- d3rlpy without scikit-learn at import -----------------------------------------------------------
class _DeferredNearestNeighbors:
    """Stands in for ``sklearn.neighbors.NearestNeighbors`` in d3rlpy's PRDC modules (``PRDC``
    makes one as a class attribute): the first use of an attribute imports scikit-learn, makes the
    real estimator with the same arguments and hands it the call."""

    def __init__(self, *args, **kwargs):
        self._deferred_args = (args, kwargs)
        self._real = None

    def __getattr__(self, name):  # only for attributes this object does not have
        if name.startswith("__"):
            raise AttributeError(name)
        if self._real is None:
            from sklearn.neighbors import NearestNeighbors

            args, kwargs = self._deferred_args
            self._real = NearestNeighbors(*args, **kwargs)
        return getattr(self._real, name)


class _D3rlpyLoader(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        shims = {}
        if "sklearn" not in sys.modules:
            pkg = types.ModuleType("sklearn", "deltarl's stand-in while d3rlpy imports (workers/__init__.py)")
            pkg.__path__ = []
            neighbors = types.ModuleType("sklearn.neighbors", pkg.__doc__)
            neighbors.NearestNeighbors = _DeferredNearestNeighbors
            pkg.neighbors = neighbors
            shims = {"sklearn": pkg, "sklearn.neighbors": neighbors}
            sys.modules.update(shims)
        try:
            self.inner.exec_module(module)
        finally:
            for name, shim in shims.items():
                if sys.modules.get(name) is shim:
                    del sys.modules[name]


class _D3rlpyFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != "d3rlpy":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # once: d3rlpy is imported once per process
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _D3rlpyLoader(spec.loader)
        return spec


def defer_sklearn_in_d3rlpy() -> None:
    """Import d3rlpy without scikit-learn: about 2 s of every process that trains a challenger.

    d3rlpy 2.8's ``d3rlpy/__init__.py`` imports every algorithm, and PRDC's two modules import
    ``sklearn.neighbors.NearestNeighbors`` at the top, which loads scikit-learn, SciPy's statistics
    and pandas (2.0 s of d3rlpy's 4.9 s import here, torch's 2.2 s included). While d3rlpy's own
    package imports, ``sklearn`` and ``sklearn.neighbors`` are stand-in modules whose
    ``NearestNeighbors`` imports the real class when PRDC makes one; they leave ``sys.modules``
    as soon as d3rlpy is in, so any later ``import sklearn`` gets the real package. Nothing changes
    when scikit-learn is already imported, or d3rlpy is. Safe to call more than once.
    """
    if "d3rlpy" in sys.modules or any(isinstance(f, _D3rlpyFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _D3rlpyFinder())


defer_sklearn_in_d3rlpy()
