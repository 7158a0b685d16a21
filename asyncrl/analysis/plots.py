"""The plotting and aggregation module (matplotlib, Agg backend): learning curves of ``asyncrl
plot`` and the study's plots, and the drawing helpers the policy-lag figure of ``asyncrl lag --plot``
shares (:mod:`asyncrl.analysis.lag_plot`).

House rules for every figure here: axes labelled with units, the legend outside the data area
(below the panels), one colour per series or group, the same in every panel and in the legend,
and a group drawn as its mean with a 95 % confidence band across its members.

Series (the input of :func:`plot_curves`): a dict
``{"label": str, "group": str | None, "env_steps": [int], "wall_time_s": [float],
"return": [float]}`` (the three lists of equal length, ``None`` entries in "return" skipped).
Series sharing a ``group`` are aggregated: each is linearly interpolated onto a common grid of
200 x values spanning the range all of them cover, and the band is Student's t 95 % interval of
their mean (``scipy.stats.t``), so it is drawn only where a group has two or more members.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from asyncrl.core.config import ConfigError, translate_moved_keys
from asyncrl.core.metrics import read_jsonl

GRID_POINTS = 200
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_DASHES = ("-", "--", ":", "-.")
# Presets whose policy loss applies the TV filter with budget δ = algo.tv_threshold.
TV_FILTER_PRESETS = ("vaco", "vaco_paper", "vaco_no_realign")


class PlotError(ValueError):
    """Nothing to plot (no run, no rows, empty series); the message names what is missing."""


def _pyplot():
    """matplotlib.pyplot on the Agg backend. Raises ImportError with the install command."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError(
            "plotting needs matplotlib: .venv/bin/pip install 'asyncrl[plot]' (or pip install matplotlib)"
        ) from None
    return plt


# ---------------------------------------------------------------------------- aggregation


def mean_ci(
    xs: Sequence[Sequence[float]], ys: Sequence[Sequence[float]], *, points: int = GRID_POINTS, confidence: float = 0.95
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Mean of several curves and a t-interval across them.

    Args:
        xs, ys: one increasing x sequence and its y values per curve (NaN ys are dropped).
        points: size of the common grid (the x range every curve covers).
    Returns:
        (grid [G], mean [G], low [G] or None, high [G] or None): None bands for a single curve.
    Raises:
        PlotError: no curve has two points, or the curves share no x range.
    """
    curves = []
    for x, y in zip(xs, ys):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        keep = np.isfinite(x) & np.isfinite(y)
        if keep.sum() >= 1:
            curves.append((x[keep], y[keep]))
    if not curves:
        raise PlotError("no curve has a finite point")
    lo, hi = max(c[0][0] for c in curves), min(c[0][-1] for c in curves)
    if len(curves) == 1 or hi <= lo:
        if len(curves) > 1:
            raise PlotError("the curves of a group share no x range")
        return curves[0][0], curves[0][1], None, None
    grid = np.linspace(lo, hi, points)
    stack = np.stack([np.interp(grid, x, y) for x, y in curves])  # [n, G]
    mean = stack.mean(0)
    n = stack.shape[0]
    from scipy import stats

    sem = stack.std(0, ddof=1) / np.sqrt(n)
    half = stats.t.ppf(0.5 + confidence / 2, df=n - 1) * sem
    return grid, mean, mean - half, mean + half


def _colours(keys: Iterable[str]) -> dict[str, Any]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    return {k: cmap(i % 10) for i, k in enumerate(dict.fromkeys(keys))}


def _draw(ax, series: list[dict], xkey: str, ykey: str, colours: dict, *, style: str = "-") -> list:
    """Draw ``series`` on ``ax``: ungrouped ones as lines, groups as mean + band. Returns the
    legend entries drawn [(handle, text)]."""
    entries = []
    groups: dict[str, list[dict]] = defaultdict(list)
    for s in series:
        if s.get("group"):
            groups[s["group"]].append(s)
        else:
            x, y = _finite(s[xkey], s[ykey])
            if len(x):
                (h,) = ax.plot(x, y, style, color=colours[s["label"]], lw=1.6)
                entries.append((h, s["label"]))
    for g, members in groups.items():
        pairs = [_finite(m[xkey], m[ykey]) for m in members]
        pairs = [p for p in pairs if len(p[0])]
        if not pairs:
            continue
        try:
            grid, mean, low, high = mean_ci([p[0] for p in pairs], [p[1] for p in pairs])
        except PlotError:
            continue
        (h,) = ax.plot(grid, mean, style, color=colours[g], lw=1.8)
        if low is not None:
            ax.fill_between(grid, low, high, color=colours[g], alpha=0.22, lw=0)
        n = len(pairs)
        entries.append((h, f"{g} (mean of {n}, 95% CI)" if n > 1 else g))
    return entries


def _finite(x, y) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray([np.nan if v is None else v for v in x], np.float64)
    y = np.asarray([np.nan if v is None else v for v in y], np.float64)
    keep = np.isfinite(x) & np.isfinite(y)
    return x[keep], y[keep]


def _finish(fig, axes, title, entries, out_path, *, dpi: int) -> Path:
    """Grid, title, the legend below the panels; write the PNG and close the figure."""
    import matplotlib.pyplot as plt

    for a in axes:
        a.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    _legend_below(fig, entries)
    fig.savefig(out_path, dpi=dpi)
    plt.close(fig)
    return Path(out_path)


def _legend_below(fig, entries: list, *, max_cols: int = 4) -> None:
    seen, handles, texts = set(), [], []
    for h, t in entries:
        if t not in seen:
            seen.add(t)
            handles.append(h)
            texts.append(t)
    if handles:
        # as many columns as fit the figure's width (about 9 characters an inch at this font size)
        fit = max(1, int(fig.get_figwidth() * 9) // (max(len(t) for t in texts) + 6))
        fig.legend(handles, texts, loc="outside lower center", ncols=min(max_cols, len(handles), fit), frameon=False)


def tv_budget(cfg: dict) -> float | None:
    """δ of a run's config.json dict when its preset filters by it (TV_FILTER_PRESETS), else None."""
    algo = cfg.get("algo", {}) if isinstance(cfg, dict) else {}
    if algo.get("preset", "vaco") in TV_FILTER_PRESETS and isinstance(algo.get("tv_threshold"), (int, float)):
        return float(algo["tv_threshold"])
    return None


def _headroom(ax, y: float) -> None:
    """Make sure the horizontal line at ``y`` lies inside ``ax``, not on its top edge."""
    low, high = ax.get_ylim()
    if high < y * 1.15:
        ax.set_ylim(low, y * 1.15)


def _plain_log_ticks(axis) -> None:
    """Tick labels of a log axis as plain numbers (0.3, 1, 2), not 3x10^-1."""
    from matplotlib import ticker

    axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    # label the minor ticks at 2 and 5 x 10^k too, so a range within one decade has labels
    axis.set_minor_formatter(
        ticker.FuncFormatter(
            lambda v, _: f"{v:g}" if v > 0 and round(v / 10 ** np.floor(np.log10(v)), 6) in (2.0, 5.0) else ""
        )
    )


def _key(s: dict) -> str:
    return s.get("group") or s["label"]


# ---------------------------------------------------------------------------- learning curves


def plot_curves(
    series: list[dict], out_path: str | Path, *, title: str | None = None, return_label: str = "average return"
) -> Path:
    """Two panels: return against env steps, and against wall-clock seconds.

    Args:
        series: dicts as described in the module docstring; series sharing a "group" are drawn as
            the group's mean with a 95 % t-interval band across them, the others one line each.
        out_path: PNG file to write (its folder must exist).
        title: figure title; return_label: the y-axis label (e.g. "evaluation return").
    Returns:
        ``Path(out_path)``.
    Raises:
        PlotError: ``series`` is empty or holds no finite point; ImportError: no matplotlib;
        OSError: the file cannot be written.
    """
    if not series or not any(len(_finite(s["env_steps"], s["return"])[0]) for s in series):
        raise PlotError("no series with a finite return to plot")
    plt = _pyplot()
    colours = _colours(_key(s) for s in series)
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.6), layout="constrained")
    entries = _draw(ax[0], series, "env_steps", "return", colours)
    _draw(ax[1], series, "wall_time_s", "return", colours)
    ax[0].set(xlabel="env steps", ylabel=return_label, title=f"{return_label} vs env steps")
    ax[1].set(xlabel="wall-clock time (s)", ylabel=return_label, title=f"{return_label} vs wall-clock time")
    return _finish(fig, ax.flat, title, entries, out_path, dpi=110)


def read_run(run_dir: str | Path, *, returns: str = "auto") -> dict:
    """One run directory as a plot series with every per-iteration column :func:`plot_runs` uses.

    ``returns``: "train" (average_return: the mean of the last 20 finished training episodes),
    "eval" (eval_return_mean of ``run.eval_every``), or "auto" (eval when the run has any).
    Raises PlotError: no such directory, or no metrics.jsonl rows."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise PlotError(f"no run directory {run_dir}")
    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if isinstance(r, dict) and "env_steps" in r]
    if not rows:
        raise PlotError(f"{run_dir}: no metrics (metrics.jsonl missing, empty or unreadable)")
    cfg = {}
    try:
        cfg = json.loads((run_dir / "config.json").read_text())
        if isinstance(cfg, dict):  # an older run's llm keys under [task]: --group-by names their new names
            cfg, _record, _lines = translate_moved_keys(cfg, None, where=str(run_dir / "config.json"))
    except (OSError, json.JSONDecodeError, ConfigError):
        pass
    evals = [r for r in rows if r.get("eval_return_mean") is not None]
    use_eval = returns == "eval" or (returns == "auto" and evals)
    if use_eval and not evals:
        raise PlotError(f"{run_dir}: no evaluation returns (the run had run.eval_every = 0)")
    src = evals if use_eval else rows
    col = lambda rs, k: [r.get(k) for r in rs]  # noqa: E731
    return {
        "label": run_dir.name,
        "group": None,
        "config": cfg,
        "returns_kind": "eval" if use_eval else "train",
        "env_steps": col(src, "env_steps"),
        "wall_time_s": col(src, "wall_time_s"),
        "return": col(src, "eval_return_mean" if use_eval else "average_return"),
        "iter_env_steps": col(rows, "env_steps"),
        "tv_estimate": col(rows, "tv_estimate"),
        "no_grad_fraction": [_no_grad(r, ((cfg or {}).get("algo") or {}).get("preset")) for r in rows],
        "lag_versions_p50": col(rows, "lag_versions_p50"),
        "lag_seconds_p50": col(rows, "lag_seconds_p50"),
    }


def _no_grad(record: dict, preset: str | None) -> float | None:
    """A metrics.jsonl record's no_grad_fraction (asyncrl.algo.policy_loss: one definition for every
    preset). Runs written before it was named: their ``filtered_fraction`` for every preset
    but ppo and grpo (the same share), None for those two (their ``clip_fraction`` counted both
    directions) or an unknown preset."""
    if "no_grad_fraction" in record:
        return record["no_grad_fraction"]
    return None if preset in (None, "ppo", "grpo") else record.get("filtered_fraction")


def plot_runs(series: list[dict], out_path: str | Path, *, title: str | None = None) -> Path:
    """The ``asyncrl plot`` figure: six panels over env steps (and one over wall-clock time):
    return vs env steps, return vs wall-clock seconds, tv_estimate (with each run's δ), the
    share of samples without gradient (no_grad_fraction), and the policy lag (versions and seconds, batch p50).

    Args:
        series: :func:`read_run` dicts (label / group set by the caller).
    Returns ``Path(out_path)``. Raises PlotError (nothing to plot), ImportError, OSError."""
    if not series:
        raise PlotError("no runs to plot")
    plt = _pyplot()
    kinds = {s["returns_kind"] for s in series}
    ret_label = (
        "evaluation return (mean action)"
        if kinds == {"eval"}
        else "average training return (last 20 episodes)"
        if kinds == {"train"}
        else "return (evaluation where recorded, else training)"
    )
    colours = _colours(_key(s) for s in series)
    fig, ax = plt.subplots(3, 2, figsize=(12, 11), layout="constrained")
    entries = _draw(ax[0, 0], series, "env_steps", "return", colours)
    _draw(ax[0, 1], series, "wall_time_s", "return", colours)
    ax[0, 0].set(xlabel="env steps", ylabel=ret_label, title="return vs env steps")
    ax[0, 1].set(xlabel="wall-clock time (s)", ylabel=ret_label, title="return vs wall-clock time")
    per_iter = [{**s, "env_steps": s["iter_env_steps"]} for s in series]
    _draw(ax[1, 0], [{**s, "y": s["tv_estimate"]} for s in per_iter], "env_steps", "y", colours)
    deltas = sorted({tv_budget(s["config"]) for s in series} - {None})
    for d in deltas:
        ax[1, 0].axhline(d, color="0.3", ls="--", lw=1)
        ax[1, 0].annotate(
            f"TV budget δ = {d:g}",
            (0.01, d),
            xycoords=("axes fraction", "data"),
            xytext=(0, 3),
            textcoords="offset points",
            fontsize=8,
            color="0.3",
        )
    if deltas:
        _headroom(ax[1, 0], max(deltas))
    ax[1, 0].set(xlabel="env steps", ylabel="tv_estimate (iteration mean)", title="forward lag: TV estimate")
    _draw(ax[1, 1], [{**s, "y": s["no_grad_fraction"]} for s in per_iter], "env_steps", "y", colours)
    ax[1, 1].set(
        xlabel="env steps",
        ylabel="no_grad_fraction of samples (clip, band, filter)",
        title="samples without gradient (no_grad_fraction)",
    )
    _draw(ax[2, 0], [{**s, "y": s["lag_versions_p50"]} for s in per_iter], "env_steps", "y", colours)
    ax[2, 0].set(xlabel="env steps", ylabel="policy lag, batch p50 (versions)", title="backward lag in versions")
    _draw(ax[2, 1], [{**s, "y": s["lag_seconds_p50"]} for s in per_iter], "env_steps", "y", colours)
    ax[2, 1].set(xlabel="env steps", ylabel="policy lag, batch p50 (s, learner clock)", title="backward lag in seconds")
    return _finish(fig, ax.flat, title, entries, out_path, dpi=100)
