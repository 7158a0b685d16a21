import json
from pathlib import Path

from asyncrl.analysis import stats

R = Path("lab/lag-visibility-2026-12-05/results")


def finals(study, envs_conds, seeds):
    cells = {}
    for d in (study / "cells").iterdir():
        c = json.loads((d / "cell.json").read_text())
        if c.get("final_return") is None:
            continue
        cells[(c["preset"], c["env"], c["condition"], c["seed"])] = c["final_return"]
    return {(p, e): [cells[(p, e, cond, s)] for s in seeds] for p in ("vaco", "ppo") for e, cond in envs_conds}


envs = ["HalfCheetah-v5", "Hopper-v5", "Walker2d-v5"]
seeds = [301, 302, 303, 304, 305]


def main() -> None:
    real = finals(Path("bench/results/studies/main-job-5env"), [(e, "async-2") for e in envs], seeds)
    rep = finals(R / "replay", [(e, "replay-" + e.split("-")[0].lower()) for e in envs], seeds)
    narrower = 0
    print("| env | preset | real IQM [95% CI] (width) | replayed IQM [95% CI] (width) |")
    print("|---|---|---|---|")
    for e in envs:
        for p in ("vaco", "ppo"):
            a, b = stats.aggregate({e: real[(p, e)]}), stats.aggregate({e: rep[(p, e)]})
            wa, wb = a.high - a.low, b.high - b.low
            narrower += wb < wa
            print(
                f"| {e} | {p} | {a.value:,.0f} [{a.low:,.0f}, {a.high:,.0f}] ({wa:,.0f}) | {b.value:,.0f} [{b.low:,.0f}, {b.high:,.0f}] ({wb:,.0f}) |"
            )
    pa = stats.probability_of_improvement({e: real[("vaco", e)] for e in envs}, {e: real[("ppo", e)] for e in envs})
    pb = stats.probability_of_improvement({e: rep[("vaco", e)] for e in envs}, {e: rep[("ppo", e)] for e in envs})
    narrower += (pb.high - pb.low) < (pa.high - pa.low)
    print(
        f"| 3 envs | P(vaco > ppo) | {pa.value:.2f} [{pa.low:.2f}, {pa.high:.2f}] ({pa.high - pa.low:.2f}) | {pb.value:.2f} [{pb.low:.2f}, {pb.high:.2f}] ({pb.high - pb.low:.2f}) |"
    )
    print("narrower:", narrower, "of 7")


if __name__ == "__main__":
    main()
