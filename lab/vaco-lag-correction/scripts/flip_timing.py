"""When a HalfCheetah run goes over onto its back, against when its entropy falls (issue 8).

    .venv/bin/python bench/gait.py --all-checkpoints --json STUDY/gait-all.json STUDY
    .venv/bin/python lab/vaco-lag-correction/scripts/flip_timing.py STUDY [--until 420000]

Reads the per-checkpoint gait rows that ``bench/gait.py --all-checkpoints --json`` wrote into
``STUDY/gait-all.json`` and each cell's metrics.jsonl. For every run: at each checkpoint up to
``--until`` env steps, the mean cos(pitch) of the torso over one deterministic episode (below 0:
on its back) and the policy's entropy (nats) at the learner iteration nearest that checkpoint; then
the first checkpoint on its back and the entropy there, against the upright runs' entropy at the
same step.
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from entropy_vs_mode import cells, entropy_at


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("study", type=Path)
    ap.add_argument("--until", type=int, default=420_000, help="last env step shown per run")
    args = ap.parse_args()
    gait = json.loads((args.study / "gait-all.json").read_text())
    checkpoints = defaultdict(list)
    for row in gait:
        checkpoints[row["cell"]].append(row)
    runs = []
    for d, recs in cells(args.study):
        rows = sorted(checkpoints.get(d["key"], []), key=lambda r: r["env_steps"])
        if rows:
            runs.append((d, recs, rows))
    runs.sort(key=lambda run: run[0]["seed"])
    print("per checkpoint: env steps (k): mean cos(pitch) / entropy (nats)")
    first_over = {}
    for d, recs, rows in runs:
        shown = [r for r in rows if r["env_steps"] <= args.until]
        print(f"seed {d['seed']:>4} final {d['final_return']:>6,.0f}  " + " ".join(
            f"{r['env_steps'] // 1000}k:{r['mean_cos_pitch']:+.2f}/{entropy_at(recs, r['env_steps']):.2f}" for r in shown))
        if rows[-1]["flipped"]:
            over = next(r for r in rows if r["mean_cos_pitch"] < 0)
            first_over[d["seed"]] = (over["env_steps"], entropy_at(recs, over["env_steps"]))
    upright = [(d, recs) for d, recs, rows in runs if not rows[-1]["flipped"]]
    print("\nruns that end on their back: first checkpoint with mean cos(pitch) < 0, entropy there, "
          "and the upright runs' entropy at the same step (min / median / max)")
    for seed, (steps, ent) in sorted(first_over.items()):
        others = [entropy_at(recs, steps) for _, recs in upright]
        print(f"seed {seed:>4}: over at {steps:>7,} env steps with {ent:.2f} nats; upright runs "
              f"{min(others):.2f} / {np.median(others):.2f} / {max(others):.2f}" if others else
              f"seed {seed:>4}: over at {steps:>7,} env steps with {ent:.2f} nats")


if __name__ == "__main__":
    main()
