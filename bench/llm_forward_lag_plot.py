"""The forward-lag study's figure and table (VACO's LLM experiment, arXiv:2603.01365, Fig. 5
at CPU scale): held-out accuracy after RL against the minibatches per batch N, and the share of tokens
each preset leaves without gradient (grpo: clipped; vaco: band and filter), and the training reward against
completions, from a study's results.json. (Held-out accuracy is measured before and after RL only.)

    .venv/bin/python bench/llm_forward_lag_plot.py bench/results/studies/llm-forward-lag

Writes DIR/plots/forward-lag.png and prints a markdown table: per (preset, N) the seeds' held-out
accuracies, their IQM with the 95 % bootstrap CI (asyncrl.analysis.stats, as the study report), the mean
paired gain over the start model, P(vaco > grpo) at each N, and the diagnostics' means over
learner iterations. Cells of other conditions (async-2) appear as one more column, "async-2".

A study that sweeps ``algo.lr`` (configs/studies/llm-forward-lag-lr.toml) gets one table and one figure
per learning rate (DIR/plots/forward-lag-lr{LR}.png), each with the verdict its file's header wrote
before the first cell: P(vaco > grpo) pooled over N = 8 and N = 32 as two tasks (the probability of
improvement averaged over the tasks, as bench/study_pairs.py pools tasks), 95 % CI above 0.5 "the filter
helps", below "it hurts", else "ties".
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

from asyncrl.analysis import stats
from asyncrl.analysis.plots import _pyplot
from asyncrl.analysis.study_report import cell_diagnostic

PRESETS = ("grpo", "vaco")
SMOOTH = 10  # iterations of the training reward's running mean


def _n(cell: dict) -> str:
    """The column of a cell: its algo.num_minibatches, or its lag condition when not "none"."""
    if cell["condition"] != "none":
        return cell["condition"]
    for o in cell["overrides"]:
        if o.startswith("algo.num_minibatches="):
            return o.split("=", 1)[1]
    return "1"


def _lr(cell: dict) -> str | None:
    """The cell's algo.lr override as written in the study file's sweep, or None (the config's)."""
    return next((o.split("=", 1)[1] for o in cell["overrides"] if o.startswith("algo.lr=")), None)


def collect(results: dict) -> dict:
    """{learning rate: {(preset, column): [cell, ...]}} over the scored cells, seeds ascending (the
    learning rate None: cells that take the config's)."""
    by: dict = defaultdict(lambda: defaultdict(list))
    for c in sorted(results["cells"], key=lambda c: c["seed"]):
        if c.get("status") == "ok" and c.get("final_return") is not None and c["preset"] in PRESETS:
            by[_lr(c)][(c["preset"], _n(c))].append(c)
    return by


VERDICT_COLUMNS = ("8", "32")  # the columns the verdict pools (the study file's rule)


def verdict(by: dict) -> str:
    """The rule's reading at one learning rate: P(vaco > grpo) over N = 8 and 32 as two tasks, paired by
    seed, and what it says; names the cells missing when a column lacks either preset."""
    tasks = {col: [by.get(("vaco", col), []), by.get(("grpo", col), [])] for col in VERDICT_COLUMNS}
    missing = [col for col, (v, g) in tasks.items() if not v or not g]
    if missing:
        return f"verdict: not yet (no cells of both presets at N = {', '.join(missing)})"
    unpaired = [col for col, (v, g) in tasks.items() if sorted(c["seed"] for c in v) != sorted(c["seed"] for c in g)]
    if unpaired:
        return f"verdict: not yet (the presets have different seeds at N = {', '.join(unpaired)})"
    x = {f"N={col}": [c["final_return"] for c in v] for col, (v, g) in tasks.items()}
    y = {f"N={col}": [c["final_return"] for c in g] for col, (v, g) in tasks.items()}
    poi = stats.probability_of_improvement(x, y)
    if not (poi.low == poi.low and poi.high == poi.high):  # NaN: too few seeds for an interval
        return f"verdict: not yet (P(vaco > grpo) {poi.value:.2f} without an interval: too few seeds)"
    word = "the filter helps" if poi.low > 0.5 else "it hurts" if poi.high < 0.5 else "ties"
    seeds = ", ".join(f"N={col} {len(v)}/{len(g)}" for col, (v, g) in tasks.items())
    return f"verdict: P(vaco > grpo) {poi.value:.2f} [{poi.low:.2f}, {poi.high:.2f}]: {word} (seeds vaco/grpo: {seeds})"


def _columns(by: dict) -> list[str]:
    cols = {k[1] for k in by}
    return sorted((c for c in cols if c.isdigit()), key=int) + sorted(c for c in cols if not c.isdigit())


def _diag(cells: list, key: str) -> float | None:
    """Mean over cells of a diagnostic (asyncrl.analysis.study_report.cell_diagnostic: older cells
    have no one-sided no_grad_fraction for grpo, n/a here)."""
    xs = [x for x in (cell_diagnostic(c, key) for c in cells) if x is not None]
    return statistics.mean(xs) if xs else None


def table(by: dict) -> str:
    cols = _columns(by)
    lines = [
        "| N (or condition) | grpo IQM [95% CI] | vaco IQM [95% CI] | P(vaco > grpo) [95% CI] | gain over start, "
        "grpo / vaco "
        "(points, mean) | tokens without gradient (no_grad_fraction) grpo / vaco | vaco minibatches over δ | "
        "grpo clip fraction, two-sided | TV estimate grpo / vaco | "
        "RL wall s (median) | seeds: grpo / vaco |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    pct = lambda x: "n/a" if x is None or x != x else f"{100 * x:.1f}"  # noqa: E731
    frac = lambda x: "n/a" if x is None else f"{x:.4f}"  # noqa: E731
    for col in cols:
        g, v = by.get(("grpo", col), []), by.get(("vaco", col), [])
        iv = {}
        for name, cells in (("grpo", g), ("vaco", v)):
            iv[name] = stats.aggregate({"gsm": [c["final_return"] for c in cells]}, "iqm") if cells else None
        poi = (
            stats.probability_of_improvement(
                {"gsm": [c["final_return"] for c in v]}, {"gsm": [c["final_return"] for c in g]}
            )
            if g and v
            else None
        )
        gain = [statistics.mean(c["accuracy_difference"] for c in cells) if cells else None for cells in (g, v)]
        cells_iv = [f"{pct(i.value)} [{pct(i.low)}, {pct(i.high)}]" if i else "n/a" for i in (iv["grpo"], iv["vaco"])]
        walls = [c["wall_time_s"] for c in g + v]
        lines.append(
            f"| {col} | {cells_iv[0]} | {cells_iv[1]} | "
            f"{f'{poi.value:.2f} [{poi.low:.2f}, {poi.high:.2f}]' if poi else 'n/a'} | "
            f"{pct(gain[0])} / {pct(gain[1])} | "
            f"{frac(_diag(g, 'no_grad_fraction'))} / {frac(_diag(v, 'no_grad_fraction'))} | "
            f"{frac(_diag(v, 'filter_fire_rate'))} | {frac(_diag(g, 'clip_fraction_two_sided'))} | "
            f"{frac(_diag(g, 'tv_estimate'))} / {frac(_diag(v, 'tv_estimate'))} | "
            f"{statistics.median(walls):.0f} | "
            f"{' '.join(pct(c['final_return']) for c in g)} / {' '.join(pct(c['final_return']) for c in v)} |"
        )
    return "\n".join(lines) + "\n"


def plot(by: dict, out_path: Path) -> Path:
    plt = _pyplot()
    cols = _columns(by)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4))
    starts = [c["initial_accuracy"] for cells in by.values() for c in cells if c.get("initial_accuracy") is not None]
    for k, preset in enumerate(PRESETS):
        xs, ys, lo, hi = [], [], [], []
        for i, col in enumerate(cols):
            cells = by.get((preset, col), [])
            if not cells:
                continue
            acc = [100 * c["final_return"] for c in cells]
            x = i + (k - 0.5) * 0.18
            axes[0].scatter([x] * len(acc), acc, s=12, alpha=0.45, color=f"C{k}")
            iv = stats.aggregate({"gsm": acc}, "iqm")
            xs.append(x), ys.append(iv.value)
            (
                lo.append(iv.value - iv.low if iv.low == iv.low else 0),
                hi.append(iv.high - iv.value if iv.high == iv.high else 0),
            )
        axes[0].errorbar(xs, ys, yerr=[lo, hi], fmt="o", color=f"C{k}", capsize=3, label=f"{preset}: IQM, 95% CI")
        what = "tokens without gradient (" + ("clip mask)" if preset == "grpo" else "band + TV filter)")
        pts = [(i, _diag(by[(preset, col)], "no_grad_fraction")) for i, col in enumerate(cols) if by.get((preset, col))]
        pts = [(i, y) for i, y in pts if y is not None]
        if not pts:  # older cells have no one-sided share for grpo
            what += ": not recorded in these cells"
        axes[1].plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=f"C{k}", label=f"{preset}: {what}")
    for i, col in enumerate(cols):  # the training reward: one batch's mean, smoothed, averaged over seeds
        for preset in PRESETS:
            curves = [[p[2] for p in c["curve"] if p[2] is not None] for c in by.get((preset, col), [])]
            steps = [[p[0] for p in c["curve"] if p[2] is not None] for c in by.get((preset, col), [])]
            if not curves or len({len(x) for x in curves}) != 1:
                continue
            mean = [statistics.mean(v) for v in zip(*curves)]
            w = SMOOTH
            smooth = [statistics.mean(mean[max(0, j - w + 1) : j + 1]) for j in range(len(mean))]
            axes[2].plot(
                steps[0],
                smooth,
                ls="-" if preset == "grpo" else "--",
                color=f"C{i + 2}",
                label=f"{preset} {col if not col.isdigit() else 'N=' + col}",
            )
    axes[2].set_xlabel("completions (env steps)")
    axes[2].set_ylabel(f"training reward (batch mean, {SMOOTH}-iteration running mean)")
    axes[2].set_title("reward on the train prompts, mean over seeds")
    if starts:
        axes[0].axhline(100 * statistics.median(starts), ls="--", color="grey", lw=1, label="start model (before RL)")
    for ax in axes[:2]:
        ax.set_xticks(range(len(cols)), [c if not c.isdigit() else f"N={c}" for c in cols])
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("held-out accuracy after RL (%)")
    axes[0].set_title("accuracy after 3,840 completions")
    axes[1].set_ylabel("share of tokens without gradient (mean over iterations)")
    axes[1].set_yscale("symlog", linthresh=1e-4)
    axes[1].set_ylim(bottom=0)
    axes[1].set_title("tokens without gradient (no_grad_fraction), grpo and vaco")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.suptitle("gsm-tiny forward-lag study: N minibatches per batch of 64 completions (serial), and async-2")
    fig.tight_layout()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, dpi=110)
    plt.close(fig)
    return out_path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("study_dir", type=Path, help="the study's --out folder (holds results.json)")
    args = ap.parse_args()
    results = json.loads((args.study_dir / "results.json").read_text())
    by_lr = collect(results)
    if not by_lr:
        raise SystemExit(f"no scored grpo or vaco cells in {args.study_dir / 'results.json'}")
    for lr, by in sorted(by_lr.items(), key=lambda kv: float(kv[0] or 0)):
        if lr is not None:
            print(f"### learning rate {lr}\n")
        print(table(by))
        print(verdict(by) + "\n")
        name = "forward-lag.png" if lr is None else f"forward-lag-lr{lr}.png"
        print(f"figure: {plot(by, args.study_dir / 'plots' / name)}\n")


if __name__ == "__main__":
    main()
