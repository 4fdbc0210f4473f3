"""Load the agent under test (and challengers) from a URI and run it on batches of observations.

``load_policy(uri, scenario=None, device=None)`` returns a :class:`Policy` whose
``act(obs)`` maps a batch of observations ``(n, obs_dim)`` to a batch of actions:

* discrete scenarios: ``int64`` array of shape ``(n,)``;
* continuous scenarios: ``float32`` array of shape ``(n, *action.shape)``, clipped to the
  action bounds when they are known.

``act`` is deterministic (the same observations give the same actions) and a batch of 0
observations gives an empty array of the right dtype and shape.

URI forms (a ``file://`` prefix is accepted for every path form):

``path/to/model.d3``
    A d3rlpy learnable saved with ``algo.save(path)``; loaded with
    ``d3rlpy.load_learnable(path, device=...)``, acts with ``algo.predict``.
``path/to/model.pt`` | ``.ts`` | ``.torchscript``
    A TorchScript module (``torch.jit.save``) taking a float tensor ``(n, obs_dim)``.
``path/to/model.onnx``
    An ONNX model run with onnxruntime (CUDAExecutionProvider when the device is CUDA and
    onnxruntime has it). Its first input takes ``(n, obs_dim)`` floats; the first output is used.
``path/to/model.zip``
    A Stable-Baselines3 model (needs ``stable-baselines3``). The algorithm is read from the
    zip (the module of the saved policy class) and otherwise DQN/PPO/A2C/SAC/TD3/DDPG are
    tried in turn; acts with ``predict(obs, deterministic=True)``. Models saved with old
    ``gym`` spaces load too (no shimmy needed). A ``.zip`` whose folder has ``<env>/config.yml``
    is an rl-baselines3-zoo agent and loads as ``rlzoo:`` below.
``rlzoo:path/to/<algo>/<env>_1`` (or the ``.zip`` in it; a bare agent folder path also works)
    An rl-baselines3-zoo agent as published (its trained-agents repository, model hubs): the
    algorithm from ``args.yml`` (sb3-contrib's TQC, QR-DQN, TRPO, ARS, CrossQ with the ``rlzoo``
    extra), loaded as rl-zoo's ``enjoy.py`` does, observations normalised with
    ``vecnormalize.pkl`` when ``config.yml`` sets ``normalize``. See :mod:`workers.policies.rlzoo`.
``python:module:attr`` (``attr`` may be dotted; ``module`` may also be a path to a ``.py`` file)
    A black-box agent. ``attr`` is resolved and turned into an agent by this rule:

    1. a class is instantiated with no arguments;
    2. otherwise, a plain function (or other callable) without ``act``/``predict``
       methods whose signature requires no positional argument is a *factory*: it is
       called with no arguments;
    3. the result (or ``attr`` itself when 1-2 do not apply) is then used as:
       ``agent.act(obs)`` if it has ``act``; else ``agent.predict(obs)`` (with
       ``deterministic=True`` when ``predict`` accepts it; a returned ``(actions, state)``
       tuple, as in SB3, is unpacked); else ``agent(obs)`` if it is callable.

    The agent receives a float32 ``(n, obs_dim)`` array and may return any array-like
    following the output conventions below.
``random:SEED``
    Uniformly random actions from the scenario's action space (needs a scenario). The
    actions are a seeded pseudo-random *function of the observation* (a hash of SEED and
    the observation's bits), so they are reproducible and independent of how episodes
    are batched.

``zoo:NAME``
    An agent shipped in ``experiments/zoo`` (``$DELTARL_ZOO``): the folder ``NAME``, else the one
    folder ``NAME-SUFFIX`` (``zoo:Walker2d-v5`` is the rl-zoo SAC agent ``Walker2d-v5-rlzoo``);
    its ``policy.pt``, else ``model.d3``, else its rl-zoo ``.zip``.

Output conventions of TorchScript / ONNX / python: models (the raw output ``y``):

* discrete: ``y`` of shape ``(n, k)`` with ``k > 1`` holds Q-values or logits, the action
  is ``argmax`` over the last axis and ``k`` must equal the scenario's number of actions;
  ``y`` of shape ``(n,)`` or ``(n, 1)`` holds the action indices themselves (integers, or
  integer-valued floats). Indices outside ``[0, n_actions)`` are an error.
* continuous: ``y`` of shape ``(n, *action.shape)`` (or ``(n,)`` for a 1-D action) is the
  action, clipped to the bounds.
* a tuple output whose first element is an array/tensor uses that first element
  (e.g. ``(actions, state)`` or ``(out, value)``).
* without a scenario (and without metadata written by :func:`export_mlp_torchscript` /
  :func:`export_mlp_onnx`) the action space is unknown: integer outputs are returned as
  int64 actions, float outputs as float32 (no argmax, no clipping). Pass a scenario.

Errors (missing/corrupt file, unknown extension, unimportable ``python:`` target, a model
that does not fit the scenario) raise :class:`PolicyError` (a ``ValueError``) with one
message saying what was expected, what was found and how to fix it.

Thread counts are left to the caller (``torch.set_num_threads``); onnxruntime sessions use
``torch.get_num_threads()`` intra-op threads so one knob controls both.
"""

from workers.policies.base import (
    SUPPORTED_URIS,
    TORCHSCRIPT_EXTENSIONS,
    Policy,
    PolicyError,
)
from workers.policies.export import export_mlp_onnx, export_mlp_torchscript
from workers.policies.load import load_policy, resolve_zoo_uri, shared_policy, zoo_dir

__all__ = [
    "Policy",
    "PolicyError",
    "load_policy",
    "shared_policy",
    "resolve_zoo_uri",
    "zoo_dir",
    "export_mlp_torchscript",
    "export_mlp_onnx",
    "TORCHSCRIPT_EXTENSIONS",
    "SUPPORTED_URIS",
]
