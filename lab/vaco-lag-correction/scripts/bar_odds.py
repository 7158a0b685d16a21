"""How often one ten-seed study meets issue 8's main-job bars, estimated from every run measured so far.

    .venv/bin/python lab/vaco-lag-correction/scripts/bar_odds.py --main bench/results/studies/main-job-{forward,lag-restored,...} \
        --serial bench/results/studies/main-job-repeat lab/vaco-lag-correction/results/main-job-serial-threads

Issue 8's first acceptance point judges *one* study: the median over seeds 101-110 of one main-job run
per seed, against 3,000, against 0.9 x the serial no-lag median of the same config on the same seeds
(one bit-reproducible draw), and against ppo's median in the same run. Multi-process runs are not
reproducible, and a serial run is reproducible only up to the order of its float sums (a second
learner thread, another CPU, another code version that rounds differently give another run), so each
study is one draw from a distribution that the pooled runs estimate.

A study is simulated by drawing, for each seed, one of that seed's measured runs (uniformly, with
replacement); its median is the study's. Over ``--draws`` simulated studies this gives the
distribution of a study's median for each label, the probability that it clears each bar, and, where
two labels are drawn in the same simulated study, the probability that the first's median is at least
the second's. Runs of one seed share initial weights and env seeds, so resampling within seeds keeps
the seed effects; the estimate is only as good as the number of runs per seed (8 for the main job).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from asyncrl.analysis.stats import _poi   # P(X > Y) + 0.5 P(X = Y), the Mann-Whitney statistic

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))   # pool_studies stays a product tool
from pool_studies import _flat, fmt, pooled, read, seed_bootstrap  # noqa: E402


def study_medians(by_seed: dict[int, list[float]], seeds: list[int], draws: int, rng) -> np.ndarray:
    """[draws] medians of simulated studies: one run per seed, drawn uniformly from that seed's runs."""
    cols = [np.asarray(by_seed[s])[rng.integers(0, len(by_seed[s]), draws)] for s in seeds]
    return np.median(np.stack(cols, axis=1), axis=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--main", nargs="+", type=Path, required=True, help="main-job study directories")
    ap.add_argument("--serial", nargs="*", type=Path, default=[], help="directories with serial no-lag draws")
    ap.add_argument("--labels", default="vaco,ppo", help="main-job labels; the first is judged against the others")
    ap.add_argument("--serial-label", action="append", dest="serial_labels",
                    help="label of serial no-lag draws of the default config (repeat for several; default: "
                         "'vaco serial' and 'vaco serial, two learner threads')")
    ap.add_argument("--reference", type=float, default=4097.0,
                    help="the serial no-lag median the acceptance names (one bit-reproducible draw)")
    ap.add_argument("--fraction", type=float, default=0.9)
    ap.add_argument("--floor", type=float, default=3000.0)
    ap.add_argument("--draws", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    rng = np.random.default_rng(a.seed)
    main_data = read(a.main)
    labels = a.labels.split(",")
    by_label = {lab: pooled(main_data, lab) for lab in labels}
    serial_labels = a.serial_labels or ["vaco serial", "vaco serial, two learner threads"]
    serial_data = read(a.serial) if a.serial else {}
    serial = {}
    for lab in serial_labels:
        for seed, xs in pooled(serial_data, lab).items():
            serial.setdefault(seed, []).extend(xs)
    seeds = sorted(set.intersection(*(set(by_label[lab]) for lab in labels)))
    bar = a.fraction * a.reference
    print(f"seeds {seeds[0]}-{seeds[-1]} ({len(seeds)}); {a.draws:,} simulated studies, one run per seed drawn "
          f"from that seed's measured runs; bars: median >= {a.floor:,.0f}, >= {a.fraction:g} x {a.reference:,.0f} "
          f"= {bar:,.0f}\n")
    print("| runs | per seed | study median: 5 % / 50 % / 95 % | P(>= floor) | P(>= bar) |")
    print("|---|---|---|---|---|")
    meds = {}
    rows = [(lab, by_label[lab]) for lab in labels]
    if serial:
        rows.append(("serial no lag, default config (" + " + ".join(serial_labels) + ")", serial))
    for lab, data in rows:
        m = study_medians(data, seeds, a.draws, rng)
        meds[lab] = m
        n = sorted({len(data[s]) for s in seeds})
        q = np.percentile(m, [5, 50, 95])
        print(f"| {lab} | {n[0]}-{n[-1]} | {q[0]:,.0f} / {q[1]:,.0f} / {q[2]:,.0f} | {np.mean(m >= a.floor):.2f} | "
              f"{np.mean(m >= bar):.2f} |")
    x = meds[labels[0]]
    print()
    for lab in labels[1:]:
        y = meds[lab]
        print(f"P({labels[0]} study median >= {lab}'s, drawn independently) = {np.mean(x >= y):.2f}")
        both = (x >= a.floor) & (x >= bar) & (x >= y)
        print(f"P(all three main-job bars in one study, {labels[0]} against {lab}) = {np.mean(both):.2f}")
    if serial:
        s = meds[rows[-1][0]]
        print(f"P({labels[0]} study median >= {a.fraction:g} x a serial draw's median, both drawn) = "
              f"{np.mean(x >= a.fraction * s):.2f}")
        print("\nover all runs, seeds resampled (95 % CI):")
        for lab in labels:
            v, lo, hi = seed_bootstrap(lambda ss, lab=lab: _poi(_flat(by_label[lab], ss), _flat(serial, ss)), seeds)
            r, rlo, rhi = seed_bootstrap(lambda ss, lab=lab: float(np.median(_flat(by_label[lab], ss))
                                                                  / np.median(_flat(serial, ss))), seeds)
            print(f"  {lab}: median {fmt(np.median(_flat(by_label[lab], seeds)))} over {len(_flat(by_label[lab], seeds))} "
                  f"runs = {r:.2f} [{rlo:.2f}, {rhi:.2f}] of the serial runs' {fmt(np.median(_flat(serial, seeds)))} "
                  f"({len(_flat(serial, seeds))} runs); P({lab} > serial) = {v:.2f} [{lo:.2f}, {hi:.2f}]")


if __name__ == "__main__":
    main()
