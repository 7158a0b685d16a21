"""`vaco_no_realign` at the age buffer K = 32 against the quick profile's `vaco` and `ppo` (issue 8,
lab/vaco-lag-correction/README.md section 20).

    .venv/bin/python lab/vaco-lag-correction/scripts/age32_no_realign.py [--condition age-8]

Reads the serial age-32 cells of ``lab/vaco-lag-correction/results/diagnose-no-realign-age32`` (vaco_no_realign)
and ``bench/results/studies/quick`` (vaco, ppo), and, where it exists, of
``lab/vaco-lag-correction/results/diagnose-realign-min-lag-age32`` (vaco with algo.realign_min_lag = 2, docs
section 24), and ``diagnose-realign-warmup-age`` (vaco with algo.realign_from_version = 125,
section 26). The quick study holds cells of several training-code
versions; serial cells are bit-reproducible, so a cell of another version is used only where its
arithmetic is today's: vaco's from fingerprint 1dd1b88b3c4266c3 (the default since 2cbeb42; its
HalfCheetah seed 101 cell was re-run with today's code and gave the same return to the last digit),
ppo's from any version, after checking that every version gave the same return. Prints per env each
arm's IQM with its 95 % bootstrap CI and P(X > Y) (asyncrl.analysis.stats), then P(X > Y) over the three envs.

``--condition age-8``: the same for the age buffer K = 8, with the default's cells from
``quick-delta``'s ``vaco_no_filter`` arm (at δ 0.2 the default to the last digit on the Intel Xeon
machine it ran on, README), ``vaco_no_realign`` and ``ppo`` from ``quick``, and
``diagnose-realign-min-lag-age8``. Serial cells repeat bit for bit on one CPU model only, so arms
run on different machines are independent draws, not paired runs.
"""
from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from asyncrl.analysis import stats
from asyncrl.analysis.study_store import CellStore

STUDIES = Path("bench/results/studies")
ENVS = ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5")
VACO_FINGERPRINT = "1dd1b88b3c4266c3"
MIN_LAG = "vaco realign_min_lag 2"
WARMUP = "vaco realign from version 125"
# condition -> arm -> (study, label, fingerprint or None)
SOURCES = {
    "age-32": {"vaco": ("quick", "vaco", VACO_FINGERPRINT), "ppo": ("quick", "ppo", None),
               "vaco_no_realign": ("diagnose-no-realign-age32", "vaco_no_realign", None),
               MIN_LAG: ("diagnose-realign-min-lag-age32", MIN_LAG, None),
               WARMUP: ("diagnose-realign-warmup-age", WARMUP, None)},
    "age-8": {"vaco": ("quick-delta", "vaco_no_filter", None), "ppo": ("quick", "ppo", None),
              "vaco_no_realign": ("quick", "vaco_no_realign", None),
              MIN_LAG: ("diagnose-realign-min-lag-age8", MIN_LAG, None),
              WARMUP: ("diagnose-realign-warmup-age", WARMUP, None)},
}


def returns(study: str, label: str, fingerprint: str | None = None,
            condition: str = "age-32") -> dict[str, dict[int, float]]:
    """env -> seed -> final return of the finished ``condition`` cells of ``label`` in ``study``."""
    out: dict[str, dict[int, float]] = defaultdict(dict)
    for _, c in sorted(CellStore(STUDIES / study).records().items()):   # record files and cells.tar.xz
        if (c["label"] != label or c["condition"] != condition or c.get("final_return") is None
                or (fingerprint and c["code_fingerprint"] != fingerprint)):
            continue
        seen = out[c["env"]].setdefault(c["seed"], c["final_return"])
        if seen != c["final_return"]:
            raise SystemExit(f"{study}: {label} {c['env']} seed {c['seed']} differs between code versions")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--condition", choices=sorted(SOURCES), default="age-32")
    condition = ap.parse_args().condition
    arms = {name: returns(study, label, fp, condition) for name, (study, label, fp) in SOURCES[condition].items()
            if (STUDIES / study).is_dir()}
    pairs = [(MIN_LAG, "ppo"), (MIN_LAG, "vaco"), (MIN_LAG, "vaco_no_realign")] if MIN_LAG in arms else []
    pairs += [(WARMUP, "ppo"), (WARMUP, "vaco"), (WARMUP, "vaco_no_realign")] if WARMUP in arms else []
    pairs += [("vaco_no_realign", "ppo"), ("vaco_no_realign", "vaco"), ("vaco", "ppo")]
    def runs_of(name: str, env: str) -> list[float]:
        return [arms[name][env][s] for s in sorted(arms[name][env])]

    for env in ENVS:
        for name in arms:
            runs = runs_of(name, env)
            if not runs:
                continue                              # a study still running: none of its cells yet
            iv = stats.aggregate({env: runs})
            print(f"{env:15s} {name:16s} IQM {iv.value:6.0f} [{iv.low:.0f}, {iv.high:.0f}]  "
                  + " ".join(f"{r:.0f}" for r in runs))
        for x, y in [(x, y) for x, y in pairs if runs_of(x, env) and runs_of(y, env)]:
            p = stats.probability_of_improvement({env: runs_of(x, env)}, {env: runs_of(y, env)})
            print(f"   P({x} > {y}) = {p.value:.2f} [{p.low:.2f}, {p.high:.2f}]")
    for x, y in [pair for pair in pairs if pair[1] != "ppo" or pair[0] != "vaco"]:
        if any(len(arms[x][e]) != len(arms[y][e]) for e in ENVS):
            continue                                  # a study still running: per-env lines only
        p = stats.probability_of_improvement({e: runs_of(x, e) for e in ENVS}, {e: runs_of(y, e) for e in ENVS})
        print(f"all envs P({x} > {y}) = {p.value:.2f} [{p.low:.2f}, {p.high:.2f}]")


if __name__ == "__main__":
    main()
