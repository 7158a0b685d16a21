"""Post hoc (2026-12-07, after the result above): the 95 % bootstrap CI of the mean per-seed
difference vaco - ppo (same seed paired), real against replayed, per env; and the correlation of
the two presets' returns over seeds. Run from the repository root."""

import json
from pathlib import Path

import numpy as np

R = Path("lab/lag-visibility-2026-12-05/results")


def finals(study, envs_conds, seeds):
    cells = {}
    for d in (study / "cells").iterdir():
        c = json.loads((d / "cell.json").read_text())
        if c.get("final_return") is None:
            continue
        cells[(c["preset"], c["env"], c["condition"], c["seed"])] = c["final_return"]
    return {
        (p, e): np.array([cells[(p, e, cond, s)] for s in seeds]) for p in ("vaco", "ppo") for e, cond in envs_conds
    }


envs = ["HalfCheetah-v5", "Hopper-v5", "Walker2d-v5"]
seeds = [301, 302, 303, 304, 305]
real = finals(Path("bench/results/studies/main-job-5env"), [(e, "async-2") for e in envs], seeds)
rep = finals(R / "replay", [(e, "replay-" + e.split("-")[0].lower()) for e in envs], seeds)
rng = np.random.default_rng(0)
for e in envs:
    out = []
    for name, d in (("real", real), ("replay", rep)):
        diff = d[("vaco", e)] - d[("ppo", e)]
        idx = rng.integers(0, 5, size=(20000, 5))
        boots = diff[idx].mean(1)
        lo, hi = np.percentile(boots, [2.5, 97.5])
        r = np.corrcoef(d[("vaco", e)], d[("ppo", e)])[0, 1]
        out.append(f"{name}: mean diff {diff.mean():,.0f} [{lo:,.0f}, {hi:,.0f}] width {hi - lo:,.0f}, corr {r:.2f}")
    print(e, " | ".join(out))
