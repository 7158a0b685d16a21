"""Pool repeated runs of one study (e.g. the main job measured on several days) and judge the
main-job goals per study run and over all of them.

    .venv/bin/python bench/pool_studies.py bench/results/studies/main-job-forward \
        bench/results/studies/main-job-lag-restored bench/results/studies/main-job-speed

Reads every finished cell (``cells/*/cell.json`` and the packed ``cells.tar.xz``) of the given study
directories. Multi-process cells are not reproducible, so each study run is a fresh draw of every seed;
serial cells are (on one CPU model), so a serial cell whose final return repeats one already read is counted once.

Per study run: each label's median final return, and whether the three main-job criteria hold
(``--x`` median >= ``--split``, >= ``--fraction`` of ``--serial``'s median, >= ``--y``'s median).
Pooled: each label's median and IQM with a 95 % bootstrap CI that resamples *seeds* (all runs of a
resampled seed go in together: runs of one seed share its initial weights and env seeds, so they
are not independent draws), runs below / at or above the split, P(X > Y) over all runs (the
Mann-Whitney statistic, as :func:`asyncrl.analysis.stats.probability_of_improvement`) with the same seed
bootstrap, and per seed the mean of X's runs against the mean of Y's (wins, and the Wilcoxon
signed-rank test from scipy).
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import numpy as np
from scipy import stats as st

from asyncrl.analysis.stats import _poi, iqm  # _poi: P(X > Y) + 0.5 P(X = Y), the Mann-Whitney statistic
from asyncrl.analysis.study_store import CellStore

RESAMPLES = 2000


def read(studies: list[Path]) -> dict[str, dict[str, dict[int, list[float]]]]:
    """study name -> label -> seed -> final returns (serial repeats across studies dropped)."""
    out: dict = {}
    seen_serial: set = set()
    for study in studies:
        runs: dict = defaultdict(lambda: defaultdict(list))
        for _, d in sorted(CellStore(study).records().items()):  # record files and cells.tar.xz
            if d.get("final_return") is None or d.get("status") not in (None, "done", "finished", "ok"):
                continue
            if d.get("mode") == "serial":
                k = (d["label"], d["seed"], d["final_return"])
                if k in seen_serial:
                    continue
                seen_serial.add(k)
            runs[d["label"]][int(d["seed"])].append(float(d["final_return"]))
        out[study.name] = runs
    return out


def pooled(data, label) -> dict[int, list[float]]:
    seeds: dict = defaultdict(list)
    for runs in data.values():
        for seed, xs in runs.get(label, {}).items():
            seeds[seed] += xs
    return dict(seeds)


def _flat(by_seed, seeds) -> np.ndarray:
    return np.array([x for s in seeds for x in by_seed.get(s, [])], np.float64)


def seed_bootstrap(fn, seeds: list[int], seed: int = 0) -> tuple[float, float, float]:
    """fn(list of seeds) -> float, with a 95 % percentile CI over seeds resampled with replacement."""
    idx = np.arange(len(seeds))
    value = fn(seeds)
    if len(seeds) < 2:
        return value, float("nan"), float("nan")
    res = st.bootstrap(
        (idx,),
        lambda i: fn([seeds[j] for j in i]),
        vectorized=False,
        n_resamples=RESAMPLES,
        method="percentile",
        random_state=np.random.default_rng(seed),
    )
    return value, float(res.confidence_interval.low), float(res.confidence_interval.high)


def fmt(v) -> str:
    return "n/a" if v is None or v != v else f"{v:,.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("studies", nargs="+", type=Path)
    ap.add_argument("--x", default="vaco")
    ap.add_argument("--y", default="ppo")
    ap.add_argument("--serial", default="vaco serial")
    ap.add_argument("--split", type=float, default=3000.0)
    ap.add_argument("--fraction", type=float, default=0.9)
    args = ap.parse_args()
    data = read(args.studies)
    x, y, s = args.x, args.y, args.serial
    serial_all = _flat(pooled(data, s), sorted(pooled(data, s)))
    serial_median = float(np.median(serial_all)) if serial_all.size else float("nan")

    print(
        f"| study | {x} median | {y} median | {s} median | {x} >= {args.split:,.0f} | {x} / serial | {x} >= {y} |"
        " P(X > Y) | all three |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    passes = 0
    for name, runs in data.items():
        xs, ys = _flat(runs.get(x, {}), runs.get(x, {})), _flat(runs.get(y, {}), runs.get(y, {}))
        ss = _flat(runs.get(s, {}), runs.get(s, {}))
        if not xs.size or not ys.size:
            continue
        mx, my = float(np.median(xs)), float(np.median(ys))
        ms = float(np.median(ss)) if ss.size else serial_median  # serial cells repeat: the pooled ones
        ok = [mx >= args.split, mx >= args.fraction * ms, mx >= my]
        passes += all(ok)
        print(
            f"| {name} | {fmt(mx)} | {fmt(my)} | {fmt(ms)} | {'yes' if ok[0] else 'no'} | {mx / ms:.2f} "
            f"({'yes' if ok[1] else 'no'}) | {'yes' if ok[2] else 'no'} | {_poi(xs, ys):.2f} | "
            f"{'yes' if all(ok) else 'no'} |"
        )
    print(f"\nstudy runs meeting all three: {passes} of {len(data)}\n")

    print(
        "| pooled | runs | seeds | median [95% CI over seeds] | IQM [95% CI over seeds] | below / at or above split |"
    )
    print("|---|---|---|---|---|---|")
    for label in (x, y, s):
        by = pooled(data, label)
        seeds = sorted(by)
        if not seeds:
            continue
        med = seed_bootstrap(lambda ss, by=by: float(np.median(_flat(by, ss))), seeds)
        iq = seed_bootstrap(lambda ss, by=by: iqm(_flat(by, ss)), seeds)
        allx = _flat(by, seeds)
        print(
            f"| {label} | {allx.size} | {len(seeds)} | {fmt(med[0])} [{fmt(med[1])}, {fmt(med[2])}] | "
            f"{fmt(iq[0])} [{fmt(iq[1])}, {fmt(iq[2])}] | {(allx < args.split).sum()} / {(allx >= args.split).sum()} |"
        )

    bx, by_ = pooled(data, x), pooled(data, y)
    common = sorted(set(bx) & set(by_))
    if common:
        p = seed_bootstrap(lambda ss: _poi(_flat(bx, ss), _flat(by_, ss)), common)
        print(f"\nP({x} > {y}) over all runs: {p[0]:.2f} [{p[1]:.2f}, {p[2]:.2f}] (CI: seeds resampled)")
        mx = np.array([np.mean(bx[k]) for k in common])
        my = np.array([np.mean(by_[k]) for k in common])
        w = st.wilcoxon(mx, my) if len(common) > 1 and np.any(mx != my) else None
        print(
            f"per seed, mean of {x}'s runs > mean of {y}'s: {(mx > my).sum()} of {len(common)} seeds; "
            f"median difference {np.median(mx - my):+,.0f}; Wilcoxon signed-rank p = "
            f"{'n/a' if w is None else f'{w.pvalue:.3f}'}"
        )
        for k, a, b in zip(common, mx, my):
            print(
                f"  seed {k}: {x} {', '.join(fmt(v) for v in bx[k])} (mean {fmt(a)}); "
                f"{y} {', '.join(fmt(v) for v in by_[k])} (mean {fmt(b)})"
            )


if __name__ == "__main__":
    main()
