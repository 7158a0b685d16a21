"""The forward-lag verdict (issue 41; rule in configs/studies/forward-lag.toml, written before the
first cell): for each (epochs, minibatches) setting of a forward-lag study, pooled over every
(env, condition) task, P(filter arm > band arm) with its 95 % CI (asyncrl.analysis.stats, as
bench/study_pairs.py pools tasks): "helps" above 0.5, "hurts" below, "ties" otherwise; beside it
the filter's fire rate (share of minibatches in which the TV budget removed a gradient) and the
share of samples it removed, means over the filter arm's cells; and P(each arm > ppo), reported
without a rule.

    .venv/bin/python bench/forward_lag.py bench/results/studies/forward-lag
    .venv/bin/python bench/forward_lag.py bench/results/studies/forward-lag-lr1e-3

Reads the study's results.json as `asyncrl study` last wrote it; a setting whose cells are not all
finished is reported with the number it has. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

from asyncrl.analysis import stats

SETTING_KEYS = ("algo.num_epochs", "algo.num_minibatches")


def setting_of(cell: dict) -> tuple[int, int] | None:
    """(epochs, minibatches) from a cell's --set overrides; None if the cell has neither."""
    found = {}
    for kv in cell.get("overrides", []):
        key, _, value = kv.partition("=")
        if key in SETTING_KEYS:
            found[key] = int(value)
    return (found[SETTING_KEYS[0]], found[SETTING_KEYS[1]]) if len(found) == 2 else None


def _mean(values: list[float]) -> str:
    return f"{statistics.fmean(values):.3f}" if values else "n/a"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("study", type=Path, help="a forward-lag study's results directory (results.json)")
    ap.add_argument("--x", default="vaco_no_realign", help="the filter arm's preset")
    ap.add_argument("--y", default="decoupled_ppo", help="the band arm's preset")
    ap.add_argument("--baseline", default="ppo")
    args = ap.parse_args()
    cells = json.loads((args.study / "results.json").read_text())["cells"]
    # (setting, preset) -> task (env, condition) -> final returns over seeds
    returns: dict = defaultdict(lambda: defaultdict(list))
    fires: dict = defaultdict(list)
    for c in cells:
        setting = setting_of(c)
        if setting is None or c.get("final_return") is None:
            continue
        returns[(setting, c["preset"])][(c["env"], c["condition"])].append(c["final_return"])
        if c["preset"] == args.x:
            d = c.get("diagnostics", {})
            fires[setting].append(
                ((d.get("filter_fire_rate") or {}).get("mean"), (d.get("tv_budget_fraction") or {}).get("mean"))
            )
    print(
        f"| epochs x minibatches | cells | P({args.x} > {args.y}) [95 % CI] | verdict | fires | removed "
        f"| P({args.x} > {args.baseline}) | P({args.y} > {args.baseline}) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for setting in sorted({s for s, _ in returns}):
        x, y, b = (returns[(setting, p)] for p in (args.x, args.y, args.baseline))
        tasks = sorted(set(x) & set(y) & set(b))
        if not tasks:
            continue
        n = sum(len(x[t]) + len(y[t]) + len(b[t]) for t in tasks)

        pxy, pxb, pyb = (
            stats.probability_of_improvement({t: p[t] for t in tasks}, {t: q[t] for t in tasks})
            for p, q in ((x, y), (x, b), (y, b))
        )
        verdict = "helps" if pxy.low > 0.5 else "hurts" if pxy.high < 0.5 else "ties"
        f = [a for a, _ in fires[setting] if a is not None]
        r = [a for _, a in fires[setting] if a is not None]
        print(
            f"| {setting[0]} x {setting[1]} | {n} | {pxy.value:.2f} [{pxy.low:.2f}, {pxy.high:.2f}] | {verdict} "
            f"| {_mean(f)} | {_mean(r)} | {pxb.value:.2f} [{pxb.low:.2f}, {pxb.high:.2f}] "
            f"| {pyb.value:.2f} [{pyb.low:.2f}, {pyb.high:.2f}] |"
        )


if __name__ == "__main__":
    main()
