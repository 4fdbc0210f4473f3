"""Episodes you can see: run policies from an initial state in the scenario's *reference*
gymnasium environment with ``render_mode="rgb_array"`` and put their episodes side by side in
an animated GIF (Pillow, which matplotlib already needs).

    eps = render_episodes(scenario, {"AUT": aut, "challenger": ca}, state, seed)
    write_side_by_side("bug-3.gif", eps, title="CartPole-v1 bug 3")

The episodes are the verdict's episodes: the reference environment is put into the recorded
initial state (``scenario.reference_reset_to``) with the recorded episode seed, and each policy
acts on one observation at a time, as ``deltarl replay`` and the confirmation run it (the
batched simulators equal the reference environments step for step, ``docs/scenarios.md``).

Two passes per episode: the first runs the policy without drawing and records its actions; the
second replays those actions from the same state and seed and draws only the frames the GIF
shows (at most ``max_frames``, on a clock common to all episodes), so a 1,000-step MuJoCo
episode costs ~120 renders, not 1,000. The second pass must reach the same return (checked).

MuJoCo scenarios (Hopper, Walker2d) render offscreen through OpenGL: without a display,
``MUJOCO_GL=egl`` (set here when unset; needs ``libegl1`` and Mesa's ``libegl-mesa0`` and
``libgl1-mesa-dri`` for software rendering) or ``MUJOCO_GL=osmesa`` (``libosmesa6``).
Classic control and Box2D scenarios draw with pygame, which needs no display for ``rgb_array``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

PANEL_HEIGHT = 200  # pixels of one episode's panel in a GIF
MAX_FRAMES = 120  # frames of a GIF (long episodes are shown at evenly spaced steps)


class RenderError(RuntimeError):
    """A scenario whose reference environment cannot draw frames here."""


@dataclass
class Episode:
    actions: list = field(default_factory=list)  # the action of every step (replayed to draw)
    cumulative: list = field(default_factory=list)  # return after each step (index t - 1)
    total: float = 0.0  # the episode's return
    length: int = 0
    terminated: bool = False
    failure: bool = False
    frames: dict = field(default_factory=dict)  # step -> (H, W, 3) uint8, drawn in the second pass

    def return_at(self, t: int) -> float:
        return 0.0 if t <= 0 else float(self.cumulative[min(t, self.length) - 1])


def _offscreen_gl() -> None:
    """MuJoCo's offscreen renderer needs an OpenGL platform; EGL works without a display."""
    if not os.environ.get("DISPLAY"):
        os.environ.setdefault("MUJOCO_GL", "egl")
        # pygame without a window: SDL's offscreen driver. Not "dummy": under it a pygame.Surface made
        # without a pixel format (highway-env's drawing surface) comes out black (pygame 2.6.1)
        os.environ.setdefault("SDL_VIDEODRIVER", "offscreen")
    if os.environ.get("MUJOCO_GL") in ("egl", "osmesa"):
        os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])


def reference_render_env(scenario, height: int = PANEL_HEIGHT):
    """The scenario's reference environment drawing ``rgb_array`` frames, or :class:`RenderError`."""
    _offscreen_gl()
    try:
        try:  # MuJoCo draws at the size asked (its default 480 x 480 costs six times as much)
            env = scenario.reference_env(render_mode="rgb_array", width=height, height=height)
        except TypeError:  # classic control, Box2D: a fixed size
            env = scenario.reference_env(render_mode="rgb_array")
    except Exception as exc:  # noqa: BLE001 - a scenario without a renderer says so by name
        raise RenderError(f"{scenario.name}: its reference environment cannot render rgb_array frames "
                          f"({type(exc).__name__}: {exc})") from exc
    modes = (getattr(env, "metadata", None) or {}).get("render_modes") or []
    if "rgb_array" not in modes:
        env.close()
        raise RenderError(f"{scenario.name}: its reference environment has no rgb_array rendering "
                          f"(render modes: {', '.join(modes) or 'none'})")
    _plain_mujoco_scene(env)
    return env


def _plain_mujoco_scene(env) -> None:
    """MuJoCo without shadows and reflections: Mesa's software renderer draws a frame ~4x faster
    (0.1 s -> 0.03 s at 200 x 200 here), and the agent's motion is what a bug video shows."""
    renderer = getattr(env.unwrapped, "mujoco_renderer", None)
    if renderer is None:
        return
    try:
        import mujoco

        viewer = renderer._get_viewer(render_mode="rgb_array")
        for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION):
            viewer.scn.flags[flag] = 0
    except Exception as exc:  # noqa: BLE001 - another gymnasium: the default scene, only slower
        log.debug("MuJoCo scene flags left as they are (%s: %s)", type(exc).__name__, exc)


def _frame(env, scenario, height: int) -> np.ndarray:
    from PIL import Image

    try:
        img = env.render()
    except Exception as exc:  # noqa: BLE001 - e.g. no OpenGL platform for MuJoCo
        gl = os.environ.get("MUJOCO_GL", "unset")
        raise RenderError(f"{scenario.name}: rendering failed ({type(exc).__name__}: {exc}); MuJoCo renders "
                          f"offscreen with MUJOCO_GL=egl (apt-get install libegl1 libegl-mesa0 libgl1-mesa-dri) "
                          f"or MUJOCO_GL=osmesa (libosmesa6); MUJOCO_GL is {gl}") from exc
    if img is None:
        raise RenderError(f"{scenario.name}: render() returned no frame")
    if np.ptp(np.asarray(img)) == 0:
        raise RenderError(f"{scenario.name}: render() drew a frame of one colour (nothing drawn); a pygame renderer "
                          f"draws blank frames under SDL_VIDEODRIVER=dummy: unset it, or set it to offscreen (it is "
                          f"{os.environ.get('SDL_VIDEODRIVER', 'unset')})")
    im = Image.fromarray(np.ascontiguousarray(np.asarray(img, dtype=np.uint8)[..., :3]))
    if im.height != height:
        im = im.resize((max(1, round(im.width * height / im.height)), height), Image.BILINEAR)
    return np.asarray(im)


def _to_env(action, scenario):
    return int(action) if scenario.action.discrete else np.asarray(action, dtype=np.float64)


def run_episode(scenario, policy, state, seed: int, *, max_steps: int | None = None) -> Episode:
    """First pass: the episode of ``policy`` from ``state`` with episode seed ``seed`` in the
    reference environment (no drawing), one observation per policy call."""
    env = scenario.reference_env()
    limit = int(max_steps or scenario.max_steps)
    ep = Episode()
    try:
        obs = scenario.reference_reset_to(env, np.asarray(state, dtype=np.float64), seed=int(seed))
        total, terminated = 0.0, False
        while ep.length < limit:
            a = np.asarray(policy.act(np.asarray(obs, dtype=np.float32)[None])[0])
            obs, r, terminated, truncated, _ = env.step(_to_env(a, scenario))
            total += float(r)
            ep.length += 1
            ep.actions.append(a)
            ep.cumulative.append(total)
            if terminated or truncated:
                break
    finally:
        env.close()
    ep.total, ep.terminated = total, bool(terminated)
    ep.failure = bool(scenario.is_failure(np.array([total]), np.array([ep.length]), np.array([terminated]))[0])
    return ep


def clock(episodes, max_frames: int = MAX_FRAMES) -> list[int]:
    """The steps a GIF shows: evenly spaced from 0 to the longest episode, each episode's last step included."""
    longest = max(e.length for e in episodes)
    steps = set(np.linspace(0, longest, min(max_frames, longest + 1)).round().astype(int).tolist())
    return sorted(steps | {e.length for e in episodes})


def draw_episode(scenario, ep: Episode, state, seed: int, steps, *, height: int = PANEL_HEIGHT) -> None:
    """Second pass: replay ``ep``'s actions from ``state`` and draw the frames at ``steps``
    (those beyond its end are not drawn: it holds its last frame)."""
    want = {int(t) for t in steps if t <= ep.length}
    env = reference_render_env(scenario, height)
    try:
        scenario.reference_reset_to(env, np.asarray(state, dtype=np.float64), seed=int(seed))
        if 0 in want:
            ep.frames[0] = _frame(env, scenario, height)
        total = 0.0
        for t, a in enumerate(ep.actions, 1):
            _, r, *_ = env.step(_to_env(a, scenario))
            total += float(r)
            if t in want:
                ep.frames[t] = _frame(env, scenario, height)
    finally:
        env.close()
    if total != ep.total:
        raise RenderError(f"{scenario.name}: replaying the recorded actions gave return {total} instead of "
                          f"{ep.total}; the reference environment is not deterministic given its seed")


def render_episodes(scenario, policies: dict, state, seed: int, *, max_frames: int = MAX_FRAMES,
                    height: int = PANEL_HEIGHT) -> list[tuple[str, Episode]]:
    """``[(label, Episode)]`` of every policy of ``{label: policy}`` from ``state``, drawn on a common clock."""
    eps = [(label, run_episode(scenario, pol, state, seed)) for label, pol in policies.items()]
    steps = clock([e for _, e in eps], max_frames)
    for _, e in eps:
        draw_episode(scenario, e, state, seed, steps, height=height)
    return eps


def side_by_side_frames(episodes: list[tuple[str, Episode]], *, title: str = ""):
    """The composed frames (Pillow images), one panel per episode, at the steps drawn: a caption
    above each panel with its step and return so far; an episode that has ended holds its last
    frame, greyed, marked "ended" ("FAILED", in red, when the scenario's safety oracle says so)."""
    from PIL import Image, ImageDraw

    steps = sorted({t for _, e in episodes for t in e.frames})
    height = max(next(iter(e.frames.values())).shape[0] for _, e in episodes)
    widths = [next(iter(e.frames.values())).shape[1] for _, e in episodes]
    head = 34 if title else 20
    gap = 6
    W = sum(widths) + gap * (len(episodes) - 1)
    out = []
    for t in steps:
        canvas = Image.new("RGB", (W, height + head), "white")
        draw = ImageDraw.Draw(canvas)
        if title:
            draw.text((4, 2), title, fill=(0, 0, 0))
        x = 0
        for (label, e), w in zip(episodes, widths):
            shown = max(s for s in e.frames if s <= t)
            panel = Image.fromarray(e.frames[shown])
            if t > e.length:
                panel = Image.blend(panel, Image.new("RGB", panel.size, "white"), 0.45)
            canvas.paste(panel, (x, head))
            ended = t >= e.length
            note = (" FAILED" if e.failure else " (ended)") if ended else ""
            draw.text((x + 4, head - 14), f"{label}  t={shown}  return {e.return_at(shown):.1f}{note}",
                      fill=(200, 0, 0) if ended and e.failure else (0, 0, 0))
            x += w + gap
        out.append(canvas)
    return out


def gif_bytes(frames, fps: float = 15.0) -> bytes:
    """An animated GIF (looping) of Pillow images; the last frame is held for two seconds."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    frames = [f.convert("P", palette=Image.Palette.ADAPTIVE, colors=128) for f in frames]
    ms = int(round(1000 / fps))
    durations = [ms] * (len(frames) - 1) + [2000]
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:], duration=durations, loop=0,
                   optimize=False, disposal=1)
    return buf.getvalue()


def write_side_by_side(path: str | os.PathLike, episodes: list[tuple[str, Episode]], *, title: str = "",
                       fps: float = 15.0) -> Path:
    """Write the side-by-side GIF of ``episodes`` (drawn by :func:`render_episodes`) to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = gif_bytes(side_by_side_frames(episodes, title=title), fps=fps)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path
