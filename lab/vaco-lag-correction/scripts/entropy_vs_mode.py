"""Entropy of the policy early in a run against where the run ends (issue 8's diagnosis).

    .venv/bin/python lab/vaco-lag-correction/scripts/entropy_vs_mode.py bench/results/studies/main-job lab/vaco-lag-correction/results/diagnose-band

For every finished cell of the given study directories: its label, condition, seed, the mean
entropy (nats, metrics.jsonl ``entropy``, the Gaussian's over the action dims) at the iteration
nearest each of ``--at`` env steps, and its final average return; then, per label, the rank
correlation (Spearman, scipy) between the entropy at the first ``--at`` point after 100k and the
final return, over every cell given.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from scipy.stats import spearmanr

from asyncrl.analysis.study_store import CellStore


def cells(study: Path):
    for key, d in sorted(CellStore(study).records().items()):   # record files and cells.tar.xz
        metrics = study / "cells" / key / "run" / "metrics.jsonl"
        if not metrics.exists() or d.get("final_return") is None:
            continue
        recs = [r for r in map(json.loads, metrics.read_text().splitlines()) if "entropy" in r and "env_steps" in r]
        if recs:
            yield d, recs


def entropy_at(recs: list[dict], steps: int) -> float:
    """The entropy (nats) of the metrics record nearest ``steps`` env steps."""
    return min(recs, key=lambda r: abs(r["env_steps"] - steps))["entropy"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("studies", nargs="+", type=Path)
    ap.add_argument("--at", default="100000,200000,400000", help="env steps, comma-separated")
    args = ap.parse_args()
    at = [int(x) for x in args.at.split(",")]
    rows = []
    for study in args.studies:
        for d, recs in cells(study):
            ent = [entropy_at(recs, s) for s in at]
            rows.append((study.name, d["label"], d["condition"], d["seed"], (d.get("commit") or "")[:7], ent,
                         d["final_return"]))
    print("| study | label | condition | seed | commit | " + " | ".join(f"entropy @{s // 1000}k" for s in at)
          + " | final return |")
    print("|---|---|---|---|---|" + "---|" * len(at) + "---|")
    for r in sorted(rows, key=lambda r: (r[0], r[1], r[2], r[4], r[3])):
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | " + " | ".join(f"{e:.2f}" for e in r[5])
              + f" | {r[6]:,.0f} |")
    k = next((i for i, s in enumerate(at) if s > 100_000), len(at) - 1)
    print(f"\nSpearman rank correlation, entropy @{at[k] // 1000}k vs final return:")
    for label in sorted({r[1] for r in rows}) + ["(all)"]:
        sel = [r for r in rows if label in ("(all)", r[1])]
        if len(sel) >= 4:
            rho, p = spearmanr([r[5][k] for r in sel], [r[6] for r in sel])
            print(f"  {label}: rho {rho:+.2f} (p {p:.3g}, {len(sel)} cells)")


if __name__ == "__main__":
    main()
