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


def fig_state_heatmap(states: np.ndarray, scenario, title: str, label: str):
    """Counts of ``states`` over the first two initial-state dimensions, on the scenario's bounds:
    the distinct-bug grid's intervals (at most 25 per axis), cell lines drawn."""
    fig, ax = _fig(5.2, 4.2)
    lo, hi = np.asarray(scenario.low, float), np.asarray(scenario.high, float)
    names = list(scenario.state_names)
    nb = int(min(max(scenario.grid_intervals, 1), 25))
    ex = [(lo[j], hi[j]) if hi[j] > lo[j] else (lo[j] - 0.5, lo[j] + 0.5) for j in range(2)]
    h, xe, ye = np.histogram2d(states[:, 0], states[:, 1], bins=nb, range=ex)
    im = ax.imshow(h.T, origin="lower", aspect="auto", extent=(xe[0], xe[-1], ye[0], ye[-1]), cmap="viridis")
    for i in range(nb):
        for j in range(nb):
            if h[i, j]:
                ax.text((xe[i] + xe[i + 1]) / 2, (ye[j] + ye[j + 1]) / 2, f"{int(h[i, j])}", ha="center",
                        va="center", fontsize=7, color="w" if h[i, j] < h.max() / 2 else "k")
    fig.colorbar(im, ax=ax, label=label)
    ax.set_xlabel(names[0])
    ax.set_ylabel(names[1])
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


def fig_dendrogram(res, title: str):
    from scipy.cluster.hierarchy import dendrogram

    fig, ax = _fig(8, 3.8)
    dendrogram(res.linkage, ax=ax, no_labels=True, color_threshold=0.3 * res.d_max, above_threshold_color="#888",
               truncate_mode="lastp" if res.n > 200 else None, p=200)
    for t in sorted(res.counts):
        ax.axhline(t * res.d_max, ls="--", lw=0.8, color="#c44")
        ax.text(ax.get_xlim()[1], t * res.d_max, f" τ={t:.2f}: {res.counts[t]}", va="center", fontsize=8,
                color="#c44")
    ax.set_ylabel(f"DTW distance ({res.method} linkage)")
    ax.set_title(title)
    return fig
