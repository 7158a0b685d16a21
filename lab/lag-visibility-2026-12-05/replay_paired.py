"""Post hoc (2026-12-07, after the result above): the 95 % bootstrap CI of the mean per-seed
difference vaco - ppo (same seed paired), real against replayed, per env; and the correlation of
the two presets' returns over seeds. Run from the repository root."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from replay_widths import R, envs, finals, seeds  # noqa: E402

real = finals(Path("bench/results/studies/main-job-5env"), [(e, "async-2") for e in envs], seeds)
rep = finals(R / "replay", [(e, "replay-" + e.split("-")[0].lower()) for e in envs], seeds)
rng = np.random.default_rng(0)
for e in envs:
    out = []
    for name, d in (("real", real), ("replay", rep)):
        diff = np.asarray(d[("vaco", e)]) - np.asarray(d[("ppo", e)])
        idx = rng.integers(0, 5, size=(20000, 5))
        boots = diff[idx].mean(1)
        lo, hi = np.percentile(boots, [2.5, 97.5])
        r = np.corrcoef(d[("vaco", e)], d[("ppo", e)])[0, 1]
        out.append(f"{name}: mean diff {diff.mean():,.0f} [{lo:,.0f}, {hi:,.0f}] width {hi - lo:,.0f}, corr {r:.2f}")
    print(e, " | ".join(out))
