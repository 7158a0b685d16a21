import json
from collections import Counter
from pathlib import Path


def hist(run):
    c = Counter()
    for line in open(run / "lag.jsonl"):
        r = json.loads(line)
        if not r.get("dropped"):
            c[r["lag_versions"]] += r["samples"]
    n = sum(c.values())
    return {k: round(v / n, 3) for k, v in sorted(c.items())}


def cell(study, preset, env, cond, seed):
    for d in (study / "cells").iterdir():
        c = json.loads((d / "cell.json").read_text())
        if (c["preset"], c["env"], c["condition"], c["seed"]) == (preset, env, cond, seed):
            return d / "run"


for e in ["HalfCheetah-v5", "Hopper-v5", "Walker2d-v5"]:
    real = hist(cell(Path("bench/results/studies/main-job-5env"), "vaco", e, "async-2", 301))
    rv = hist(
        cell(Path("lab/lag-visibility-2026-12-05/results/replay"), "vaco", e, "replay-" + e.split("-")[0].lower(), 302)
    )
    rp = hist(
        cell(Path("lab/lag-visibility-2026-12-05/results/replay"), "ppo", e, "replay-" + e.split("-")[0].lower(), 305)
    )
    print(e, "real vaco s301:", real, "| replayed vaco s302:", rv, "| replayed ppo s305:", rp)
