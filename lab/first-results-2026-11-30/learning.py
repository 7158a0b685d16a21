"""Learning benchmark: serial-mode training curves for several presets and seeds.

Runs ``asyncrl run --serial`` once per (preset, seed), ``--jobs`` at a time (one core each),
then reports the average episode return at the step budget (median over seeds) and writes the
curves (return against env steps and against wall-clock time) as JSON and, when matplotlib is
installed, as a PNG.

    .venv/bin/python lab/first-results-2026-11-30/learning.py --env HalfCheetah-v5 --presets vaco,ppo --seeds 1,2,3 \
        --total-steps 1000000 --jobs 2 --out bench/results/learning-halfcheetah
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def run_one(args, preset: str, seed: int) -> dict:
    run_dir = Path(args.out) / f"{preset}-s{seed}"
    cmd = [sys.executable, "-m", "asyncrl.cli", "run", "--serial", "--env", args.env, "--preset", preset,
           "--seed", str(seed), "--total-steps", str(args.total_steps), "--run-dir", str(run_dir),
           "--set", "run.log_every_s=60", *sum((["--set", s] for s in args.set), [])]
    t0 = time.time()
    with open(run_dir.with_suffix(".log"), "w") as log:
        subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True)
    summary = json.loads((run_dir / "summary.json").read_text())
    curve = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        curve.append([r["env_steps"], round(r["wall_time_s"], 2), r["average_return"]])
    print(f"{preset} seed {seed}: return {summary['final_average_return']:.1f} at {summary['env_steps']:,} "
          f"steps, {time.time() - t0:.0f} s", flush=True)
    return {"preset": preset, "seed": seed, "summary": summary, "curve": curve}


def plot(results, path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    colors = {}
    for r in results:
        c = colors.setdefault(r["preset"], f"C{len(colors)}")
        pts = [p for p in r["curve"] if p[2] is not None]
        label = r["preset"] if r["seed"] == min(x["seed"] for x in results if x["preset"] == r["preset"]) else None
        axes[0].plot([p[0] / 1e6 for p in pts], [p[2] for p in pts], color=c, alpha=0.8, label=label)
        axes[1].plot([p[1] / 60 for p in pts], [p[2] for p in pts], color=c, alpha=0.8, label=label)
    axes[0].set_xlabel("env steps (millions)")
    axes[1].set_xlabel("wall-clock time (minutes)")
    for ax in axes:
        ax.set_ylabel("average episode return")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"{results[0]['summary']['env_id']}, serial mode, one line per seed")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="HalfCheetah-v5")
    p.add_argument("--presets", default="vaco,ppo")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--total-steps", type=int, default=1_000_000)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--set", action="append", default=[], help="config override for every run")
    p.add_argument("--out", default="bench/results/learning")
    args = p.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    jobs = [(pr, int(s)) for pr in args.presets.split(",") for s in args.seeds.split(",")]
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda j: run_one(args, *j), jobs))
    table = {}
    for preset in args.presets.split(","):
        finals = [r["summary"]["final_average_return"] for r in results if r["preset"] == preset]
        walls = [r["summary"]["wall_time_s"] for r in results if r["preset"] == preset]
        table[preset] = {"final_returns": finals, "median_final_return": statistics.median(finals),
                         "median_wall_time_s": statistics.median(walls)}
        print(f"{preset:>16}: median return {statistics.median(finals):8.1f} at {args.total_steps:,} steps "
              f"(seeds: {', '.join(f'{f:.0f}' for f in finals)}), median wall time {statistics.median(walls) / 60:.1f} min")
    out = Path(args.out)
    (out / "results.json").write_text(json.dumps({"args": vars(args), "table": table, "runs": results}) + "\n")
    if plot(results, out / "curve.png"):
        print(f"plot: {out / 'curve.png'}")


if __name__ == "__main__":
    main()
