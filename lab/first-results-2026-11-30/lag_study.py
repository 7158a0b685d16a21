"""Lag study: final return at the step budget for presets x policy-age-buffer K x seeds, with the
measured lag distribution of each cell (serial mode with the actors' ``policy_age_buffer``: each
rollout acts with a version drawn uniformly from the last K, VACO's simulated asynchrony).

    .venv/bin/python lab/first-results-2026-11-30/lag_study.py --presets vaco,ppo --ks 1,8,32 --seeds 1,2,3 --jobs 2 \
        --out bench/results/lag-study-halfcheetah

``--k1-from RESULTS.json`` takes the K=1 cells from a lab/first-results-2026-11-30/learning.py run with the same config
instead of training them again (K=1 is the default: act with the newest weights).
"""
from __future__ import annotations

import argparse
import json
import statistics
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from learning import run_one


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="HalfCheetah-v5")
    p.add_argument("--presets", default="vaco,ppo")
    p.add_argument("--ks", default="1,8,32")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--total-steps", type=int, default=1_000_000)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--k1-from", default=None)
    p.add_argument("--out", default="bench/results/lag-study")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    presets, ks, seeds = args.presets.split(","), [int(k) for k in args.ks.split(",")], [int(s) for s in args.seeds.split(",")]
    results = []
    if args.k1_from:
        for r in json.loads(Path(args.k1_from).read_text())["runs"]:
            if r["preset"] in presets and r["seed"] in seeds:
                results.append({**r, "k": 1})
        ks = [k for k in ks if k != 1]
    jobs = [(pr, k, s) for k in ks for pr in presets for s in seeds]

    def job(j):
        preset, k, seed = j
        sub = argparse.Namespace(**{**vars(args), "out": str(out / f"k{k}"),
                                    "set": [*args.set, f"actor.policy_age_buffer={k}"]})
        Path(sub.out).mkdir(parents=True, exist_ok=True)
        return {**run_one(sub, preset, seed), "k": k}

    with ThreadPoolExecutor(args.jobs) as pool:
        results += list(pool.map(job, jobs))
    table = []
    print(f"{'preset':>8} {'K':>3}  {'median return':>13}  {'seeds':<24} {'lag p50':>7} {'lag p95':>7} {'lag max':>7}")
    for k in sorted({r["k"] for r in results}):
        for preset in presets:
            cell = [r for r in results if r["k"] == k and r["preset"] == preset]
            if not cell:
                continue
            finals = [r["summary"]["final_average_return"] for r in cell]
            hist: dict[int, int] = {}
            for r in cell:
                for lag, n in r["summary"].get("lag_histogram", {}).items():
                    hist[int(lag)] = hist.get(int(lag), 0) + n
            total = sum(hist.values())
            cum, p50, p95 = 0, None, None
            for lag in sorted(hist):
                cum += hist[lag]
                if p50 is None and cum >= 0.5 * total:
                    p50 = lag
                if p95 is None and cum >= 0.95 * total:
                    p95 = lag
            row = {"preset": preset, "k": k, "final_returns": finals, "median_final_return": statistics.median(finals),
                   "lag_p50": p50, "lag_p95": p95, "lag_max": max(hist) if hist else None, "lag_histogram": hist}
            table.append(row)
            print(f"{preset:>8} {k:>3}  {row['median_final_return']:>13.1f}  "
                  f"{', '.join(f'{f:.0f}' for f in finals):<24} {p50!s:>7} {p95!s:>7} {row['lag_max']!s:>7}")
    (out / "results.json").write_text(json.dumps({"args": vars(args), "table": table}, indent=1) + "\n")


if __name__ == "__main__":
    main()
