"""Per env, X against Y in one study's results table: each arm's IQM with its 95 % bootstrap CI and
P(X > Y) with its CI (asyncrl.analysis.stats), for the conditions named; then P(X > Y) over the envs,
and with two or more conditions P(X > Y) pooled over every (env, condition) task.

    .venv/bin/python bench/study_pairs.py bench/results/studies/quick --x vaco --y ppo --conditions age-8,age-32
    .venv/bin/python bench/study_pairs.py bench/results/studies/quick --x vaco --y vaco_paper --conditions none

Reads ``results.json`` as `asyncrl study` (or `--report-only --any-code`) last wrote it, so the cells
are the ones that report holds. The quick profile's per-env comparisons
(docs/results/quick-profile.md) are made this way.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from asyncrl.analysis import stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("study", type=Path, help="a study's results directory (with results.json)")
    ap.add_argument("--x", required=True, help="arm label")
    ap.add_argument("--y", required=True, help="arm label")
    ap.add_argument("--conditions", required=True, help="comma-separated lag conditions")
    a = ap.parse_args()
    groups = json.loads((a.study / "results.json").read_text())["groups"]
    finals = {(g["label"], g["env"], g["condition"]): g["final_returns"] for g in groups}
    print(f"| condition | env | {a.x} IQM [95% CI] | {a.y} IQM [95% CI] | P({a.x} > {a.y}) [95% CI] |")
    print("|---|---|---|---|---|")
    pooled_x, pooled_y = {}, {}
    for cond in a.conditions.split(","):
        xs, ys = {}, {}
        for (label, env, c), f in sorted(finals.items()):
            if c == cond and label == a.x and (a.y, env, c) in finals:
                xs[env], ys[env] = f, finals[(a.y, env, c)]
        for env in sorted(xs):
            ix, iy = stats.aggregate({env: xs[env]}), stats.aggregate({env: ys[env]})
            p = stats.probability_of_improvement({env: xs[env]}, {env: ys[env]})
            print(
                f"| {cond} | {env} | {ix.value:,.0f} [{ix.low:,.0f}, {ix.high:,.0f}] | "
                f"{iy.value:,.0f} [{iy.low:,.0f}, {iy.high:,.0f}] | {p.value:.2f} [{p.low:.2f}, {p.high:.2f}] |"
            )
        if xs:
            p = stats.probability_of_improvement(xs, ys)
            print(f"| {cond} | over {len(xs)} envs | | | {p.value:.2f} [{p.low:.2f}, {p.high:.2f}] |")
        pooled_x |= {(env, cond): v for env, v in xs.items()}
        pooled_y |= {(env, cond): v for env, v in ys.items()}
    if len({c for _, c in pooled_x}) > 1:  # every (env, condition) a task of its own, stratified
        p = stats.probability_of_improvement(pooled_x, pooled_y)
        print(f"| pooled | {len(pooled_x)} env x condition tasks | | | {p.value:.2f} [{p.low:.2f}, {p.high:.2f}] |")


if __name__ == "__main__":
    main()
