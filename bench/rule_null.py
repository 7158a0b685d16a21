"""How often a comparison rule fails when the two arms are exchangeable: permute each env's finished
returns between arm X and arm Y of a study (the arms keep their sizes), apply the rule to every split,
and count. A rule that fails for identical methods half the time can say nothing about a change that
keeps the arithmetic (docs/decisions/learner-compile.md, "What the per-env half can tell").

    .venv/bin/python bench/rule_null.py bench/results/studies/learner-compile --x compiled --y eager

Rules measured (X the candidate, Y the reference; IQMs and CIs as asyncrl.analysis.stats computes them):
- ``per-env CI``: some env where X's IQM is below Y's 95 % percentile-bootstrap CI (also at 99 % and 99.5 %);
- ``pooled P``: P(X > Y) pooled over the envs with its 95 % CI wholly below 0.5;
- ``per-env P``: some env whose own P(X > Y) has a CI wholly below 0.5.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from scipy import stats as st

from asyncrl.analysis import stats


def returns(study: Path, x: str, y: str, condition: str | None) -> dict[str, dict[str, list[float]]]:
    """env -> arm -> final returns of the finished cells of arms ``x`` and ``y``."""
    out: dict[str, dict[str, list[float]]] = {}
    for f in sorted(study.glob("cells/*/cell.json")):
        c = json.loads(f.read_text())
        if c.get("status") != "done" and c.get("final_return") is None:
            continue
        if c["label"] in (x, y) and (condition is None or c["condition"] == condition):
            out.setdefault(c["env"], {}).setdefault(c["label"], []).append(float(c["final_return"]))
    return {e: a for e, a in out.items() if x in a and y in a}


def split(rng, arms, x, y):
    pool = np.array(arms[x] + arms[y])
    rng.shuffle(pool)
    return pool[: len(arms[x])], pool[len(arms[x]) :]


def iqm_ci_low(rng, b: np.ndarray, level: float, resamples: int) -> float:
    idx = rng.integers(0, len(b), (resamples, len(b)))
    return float(np.percentile(st.trim_mean(b[idx], 0.25, axis=1), (100 - level) / 2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("study", type=Path, help="a study's results directory (its cells/*/cell.json)")
    ap.add_argument("--x", required=True, help="the candidate arm's label")
    ap.add_argument("--y", required=True, help="the reference arm's label")
    ap.add_argument("--condition", help="only cells of this lag condition")
    ap.add_argument("--splits", type=int, default=400, help="random splits for the CI rules")
    ap.add_argument("--p-splits", type=int, default=150, help="random splits for the P rules (slower)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    data = returns(a.study, a.x, a.y, a.condition)
    if not data:
        raise SystemExit(f"rule_null: no env of {a.study} has finished cells of both {a.x!r} and {a.y!r}")
    rng = np.random.default_rng(a.seed)
    print(
        f"study {a.study}: {a.x} against {a.y}, envs "
        + ", ".join(f"{e} ({len(v[a.x])}/{len(v[a.y])})" for e, v in data.items())
    )
    for env, arms in sorted(data.items()):
        ix, iy = stats.aggregate({env: arms[a.x]}), stats.aggregate({env: arms[a.y]})
        print(
            f"  observed {env}: {a.x} IQM {ix.value:.2f} [{ix.low:.2f}, {ix.high:.2f}], "
            f"{a.y} IQM {iy.value:.2f} [{iy.low:.2f}, {iy.high:.2f}]"
        )
    for level in (95.0, 99.0, 99.5):
        fails, per_env = 0, dict.fromkeys(data, 0)
        for _ in range(a.splits):
            hit = False
            for env, arms in data.items():
                xs, ys = split(rng, arms, a.x, a.y)
                if st.trim_mean(xs, 0.25) < iqm_ci_low(rng, ys, level, 400):
                    per_env[env] += 1
                    hit = True
            fails += hit
        each = ", ".join(f"{e} {v / a.splits:.0%}" for e, v in sorted(per_env.items()))
        print(f"per-env CI rule at {level:g} %: fails in {fails / a.splits:.1%} of {a.splits} splits ({each})")
    pooled = some_env = 0
    for i in range(a.p_splits):
        xs, ys = {}, {}
        for env, arms in data.items():
            xs[env], ys[env] = (list(v) for v in split(rng, arms, a.x, a.y))
        per = [stats.probability_of_improvement({e: xs[e]}, {e: ys[e]}, resamples=500, seed=i) for e in data]
        some_env += any(p.high < 0.5 for p in per)
        pooled += stats.probability_of_improvement(xs, ys, resamples=500, seed=i).high < 0.5
    print(f"pooled P rule (CI wholly below 0.5): fails in {pooled / a.p_splits:.1%} of {a.p_splits} splits")
    print(
        f"per-env P rule (some env's CI wholly below 0.5): fails in {some_env / a.p_splits:.1%} of {a.p_splits} splits"
    )


if __name__ == "__main__":
    main()
