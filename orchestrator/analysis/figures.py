"""The report's figures (matplotlib's object API: no pyplot global state). Each function returns a
``matplotlib.figure.Figure`` for :meth:`orchestrator.analysis.document.Doc.figure`."""

from __future__ import annotations

import numpy as np


def _fig(w=6.4, h=3.6, ncols=1):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h))
    axes = fig.subplots(1, ncols) if ncols > 1 else fig.subplots()
    return fig, axes


def fig_over_time(lines: dict, xlabel: str, panels: list[str], title: str):
    """One panel per quantity (e.g. bugs, distinct bugs); ``lines[label][panel] = (x, y)``, one colour per label."""
    fig, axes = _fig(9.6, 3.6, ncols=len(panels))
    axes = np.atleast_1d(axes)
    for n, (label, by_panel) in enumerate(lines.items()):
        for ax, panel in zip(axes, panels):
            if panel in by_panel:
                x, y = by_panel[panel]
                ax.plot(x, y, label=label, drawstyle="steps-post", color=f"C{n % 10}", ls=("-", "--", "-.", ":")[n % 4])
    for ax, panel in zip(axes, panels):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(panel)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    return fig


def varying_dims(scenario) -> list[int]:
    """The initial-state dimensions the scenario lets vary (MountainCar's velocity starts at 0)."""
    lo, hi = np.asarray(scenario.low, float), np.asarray(scenario.high, float)
    return [j for j in range(len(lo)) if hi[j] > lo[j]]


def fig_state_heatmap(states: np.ndarray, scenario, title: str, label: str):
    """Counts of ``states`` over the first two initial-state dimensions that vary, on the
    scenario's bounds cut into the distinct-bug grid's intervals (at most 25 per axis), cell lines
    drawn; a bar chart over the one dimension when only one varies. None when none varies."""
    dims = varying_dims(scenario)
    if not dims:
        return None
    lo, hi = np.asarray(scenario.low, float), np.asarray(scenario.high, float)
    names = list(scenario.state_names)
    nb = int(min(max(scenario.grid_intervals, 1), 25))
    if len(dims) == 1:
        j = dims[0]
        fig, ax = _fig(5.6, 3.4)
        h, edges = np.histogram(states[:, j], bins=nb, range=(lo[j], hi[j]))
        ax.bar(edges[:-1], h, width=np.diff(edges), align="edge", color="#4c72b0", edgecolor="white")
        for x0, x1, c in zip(edges[:-1], edges[1:], h):
            if c:
                ax.text((x0 + x1) / 2, c, f"{int(c)}", ha="center", va="bottom", fontsize=7)
        fixed = [f"{names[k]} = {lo[k]:g}" for k in range(len(names)) if k != j and hi[k] == lo[k]]
        ax.set_xlim(lo[j], hi[j])
        ax.set_xlabel(names[j] + (f"   ({', '.join(fixed)} in every initial state)" if fixed else ""))
        ax.set_ylabel(label)
        ax.set_title(title)
        return fig
    jx, jy = dims[:2]
    fig, ax = _fig(5.2, 4.2)
    h, xe, ye = np.histogram2d(states[:, jx], states[:, jy], bins=nb, range=[(lo[jx], hi[jx]), (lo[jy], hi[jy])])
    im = ax.imshow(h.T, origin="lower", aspect="auto", extent=(xe[0], xe[-1], ye[0], ye[-1]), cmap="viridis")
    for i in range(nb):
        for k in range(nb):
            if h[i, k]:
                ax.text((xe[i] + xe[i + 1]) / 2, (ye[k] + ye[k + 1]) / 2, f"{int(h[i, k])}", ha="center",
                        va="center", fontsize=7, color="w" if h[i, k] < h.max() / 2 else "k")
    fig.colorbar(im, ax=ax, label=label)
    ax.set_xlabel(names[jx])
    ax.set_ylabel(names[jy])
    ax.set_title(title)
    return fig


def fig_returns_scatter(aut: np.ndarray, ca: np.ndarray, bug: np.ndarray, title: str):
    fig, ax = _fig(5.2, 4.6)
    ax.scatter(aut[~bug], ca[~bug], s=9, alpha=0.5, label=f"no bug ({int((~bug).sum())})", color="#4c72b0")
    ax.scatter(aut[bug], ca[bug], s=9, alpha=0.6, label=f"bug ({int(bug.sum())})", color="#dd5555")
    lo = float(np.nanmin(np.concatenate([aut, ca])))
    hi = float(np.nanmax(np.concatenate([aut, ca])))
    pad = 0.03 * (hi - lo or 1.0)
    ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="k", lw=0.8, ls="--", label="equal return")
    ax.set_xlabel("AUT return")
    ax.set_ylabel("challenger return")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def fig_dendrogram(linkage: np.ndarray, counts: dict, d_max: float, method: str, title: str):
    """The dendrogram of a behaviour clustering, with the cuts at τ · d_max and their cluster counts."""
    from scipy.cluster.hierarchy import dendrogram

    fig, ax = _fig(8, 3.8)
    n = len(linkage) + 1
    dendrogram(linkage, ax=ax, no_labels=True, color_threshold=0.3 * d_max, above_threshold_color="#888",
               truncate_mode="lastp" if n > 200 else None, p=200)
    for t in sorted(counts):
        ax.axhline(t * d_max, ls="--", lw=0.8, color="#c44")
        ax.text(ax.get_xlim()[1], t * d_max, f" τ={t:.2f}: {counts[t]}", va="center", fontsize=8, color="#c44")
    ax.set_ylabel(f"DTW distance ({method} linkage)")
    ax.set_title(title)
    return fig


def fig_runs_by_method(values: dict, panels: list[str], title: str):
    """Every run as a dot, one column per method, its mean as a bar: ``values[panel][method] =
    [value per run]``. The method's n is under its name; no run is hidden behind a mean."""
    fig, axes = _fig(4.4 * len(panels), 3.8, ncols=len(panels))
    fig.subplots_adjust(wspace=0.3)
    axes = np.atleast_1d(axes)
    for ax, panel in zip(axes, panels):
        methods = list(values[panel])
        for i, m in enumerate(methods):
            v = np.asarray(values[panel][m], dtype=float)
            v = v[np.isfinite(v)]
            if v.size:
                jitter = (np.arange(v.size) - (v.size - 1) / 2) * 0.08
                ax.scatter(i + jitter, v, s=22, color="C0" if m == "delta" else "C1", zorder=3, alpha=0.85)
                ax.hlines(v.mean(), i - 0.3, i + 0.3, color="k", lw=1.5, zorder=4)
        ax.set_xticks(range(len(methods)))
        many = len(methods) > 4
        ax.set_xticklabels([f"{m}{' ' if many else chr(10)}(n={np.isfinite(np.asarray(values[panel][m], float)).sum()})"
                            for m in methods], fontsize=7, rotation=30 if many else 0, ha="right" if many else "center",
                           rotation_mode="anchor")
        ax.set_ylabel(panel)
        ax.set_ylim(bottom=0)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title)
    return fig
