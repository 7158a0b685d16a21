"""The ``asyncrl lag --plot`` figure (asyncrl.analysis.lag_report.plot_report): lag histograms, lag
over time, forward lag, and where the lag comes from, per actor; the shared drawing helpers are in
:mod:`asyncrl.analysis.plots`."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from asyncrl.analysis.plots import _DASHES, _MARKERS, _colours, _headroom, _legend_below, _plain_log_ticks, _pyplot


def plot_lag(
    rows: list[dict], metrics: list[dict], out_path: str | Path, *, title: str, tv_threshold: float | None = None
) -> Path:
    """The ``asyncrl lag --plot`` figure from lag.jsonl rows (consumed ones) and metrics.jsonl rows.

    Panels: lag histograms in versions (actors side by side) and in seconds (log-spaced bins,
    outlines), both with log y axes so small bins show; mean lag per learner iteration in
    versions and in seconds (one panel each); tv_estimate per iteration with the TV budget δ as
    a dashed line; no_grad_fraction (and PPO's clip_fraction_two_sided only where it is non-zero);
    where the lag comes from: the mean parts per sample of each actor (propagation, collection,
    queueing; asyncrl.core.lag_parts) in seconds and in versions, as stacked bars.
    Returns ``Path(out_path)``. Raises ImportError (no matplotlib), OSError (cannot write)."""
    plt = _pyplot()
    actors = sorted({r["actor"] for r in rows})
    colours = _colours(actors)
    fig, ax = plt.subplots(4, 2, figsize=(12, 14.5), layout="constrained")
    entries = []
    top = int(max((r["lag_versions"] for r in rows), default=0))
    width = 0.8 / max(len(actors), 1)
    for i, a in enumerate(actors):
        counts = np.zeros(top + 1)
        for r in rows:
            if r["actor"] == a:
                counts[int(r["lag_versions"])] += r["samples"]
        h = ax[0, 0].bar(np.arange(top + 1) - 0.4 + width * (i + 0.5), counts, width=width, color=colours[a])
        entries.append((h, a))
    ax[0, 0].set(yscale="log", xlabel="backward lag (versions)", ylabel="samples (log scale)", title="lag in versions")
    ax[0, 0].set_xticks(range(top + 1) if top < 20 else np.linspace(0, top, 11).round())
    secs_all = [max(r["lag_seconds"], 1e-4) for r in rows]
    if secs_all:
        edges = np.logspace(np.log10(min(secs_all)) - 0.05, np.log10(max(secs_all)) + 0.05, 40)
        for i, a in enumerate(actors):
            rs = [r for r in rows if r["actor"] == a]
            ax[0, 1].hist(
                [max(r["lag_seconds"], 1e-4) for r in rs],
                weights=[r["samples"] for r in rs],
                bins=edges,
                histtype="step",
                lw=1.8,
                color=colours[a],
                ls=_DASHES[i % len(_DASHES)],
            )
    ax[0, 1].set(
        xscale="log",
        yscale="log",
        xlabel="backward lag (s, learner clock; log scale)",
        ylabel="samples (log scale)",
        title="lag in seconds (actors: line styles)",
    )
    _plain_log_ticks(ax[0, 1].xaxis)
    by_iter: dict = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0, 0]))
    for r in rows:
        acc = by_iter[r["actor"]][r["iteration"]]
        acc[0] += r["lag_versions"] * r["samples"]
        acc[1] += r["lag_seconds"] * r["samples"]
        acc[2] += r["samples"]
    for k, a in enumerate(actors):  # hollow markers of different shapes: overlapping actors stay visible
        its = sorted(by_iter[a])
        style = dict(ls="none", marker=_MARKERS[k % len(_MARKERS)], ms=4, mfc="none", mew=1.0, color=colours[a])
        ax[1, 0].plot(its, [by_iter[a][i][0] / by_iter[a][i][2] for i in its], **style)
        ax[1, 1].plot(its, [by_iter[a][i][1] / by_iter[a][i][2] for i in its], **style)
    ax[1, 0].set(xlabel="learner iteration", ylabel="mean lag (versions)", title="lag over time, versions")
    ax[1, 1].set(xlabel="learner iteration", ylabel="mean lag (s, learner clock)", title="lag over time, seconds")
    its = [m["iteration"] for m in metrics]
    tv = [m.get("tv_estimate") for m in metrics]
    (h_tv,) = ax[2, 0].plot(its, [np.nan if v is None else v for v in tv], color="C3", lw=1.2)
    if tv_threshold is not None:
        h_d = ax[2, 0].axhline(tv_threshold, color="0.25", ls="--", lw=1.2)
        entries.append((h_d, f"TV budget δ = {tv_threshold:g}"))
        _headroom(ax[2, 0], tv_threshold)
    entries.append((h_tv, "tv_estimate (iteration mean)"))
    ax[2, 0].set(xlabel="learner iteration", ylabel="tv_estimate", title="forward lag: TV estimate per iteration")
    fracs = [
        ("no_grad_fraction", "no_grad_fraction", "C4"),
        ("clip_fraction_two_sided", "clip fraction, two-sided (ppo)", "C5"),
    ]
    for key, text, colour in fracs:
        ys = np.asarray([np.nan if m.get(key) is None else m[key] for m in metrics], np.float64)
        if ys.size and np.nanmax(np.nan_to_num(ys)) > 0:
            (h,) = ax[2, 1].plot(its, ys, color=colour, lw=1.2)
            entries.append((h, text))
    ax[2, 1].set(
        xlabel="learner iteration", ylabel="fraction of samples", title="samples without gradient per iteration"
    )
    entries += _lag_parts_bars(ax[3, 0], ax[3, 1], rows, actors)
    for a in ax.flat:
        a.grid(alpha=0.3)
    fig.suptitle(title)
    _legend_below(fig, entries, max_cols=5)
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return Path(out_path)


def _lag_parts_bars(ax_s, ax_v, rows: list[dict], actors: list[str]) -> list:
    """Stacked bars, one per actor: the mean propagation, collection and queueing per sample, in
    seconds (``ax_s``) and versions (``ax_v``). Returns legend entries (none when no row has parts)."""
    from asyncrl.analysis.lag_report import lag_parts

    parts = {a: lag_parts([r for r in rows if r["actor"] == a]) for a in actors}
    shown = [a for a in actors if parts[a]["samples"]]
    entries = []
    for axis, unit in ((ax_s, "s"), (ax_v, "versions")):
        if not shown:
            axis.text(
                0.5, 0.5, "parts not recorded (a run of before 2026-12-05)", ha="center", transform=axis.transAxes
            )
        left = np.zeros(len(shown))
        # greys and hatches: the actors' colours are the other panels' (a part is not an actor)
        for colour, hatch, name in zip(
            ("0.3", "0.6", "0.85"), ("", "//", ".."), ("propagation", "collection", "queueing")
        ):
            widths = np.asarray([parts[a][f"{name}_{unit}"] for a in shown], np.float64)
            h = axis.barh(
                np.arange(len(shown)), widths, left=left, color=colour, hatch=hatch, edgecolor="black", height=0.6
            )
            left += widths
            if unit == "s" and shown:
                entries.append((h, name))
        axis.set_yticks(np.arange(len(shown)), shown)
        axis.set(
            xlabel=f"mean per sample ({unit}{', learner clock' if unit == 's' else ''})",
            title=f"where the lag comes from, {unit}",
        )
    return entries
