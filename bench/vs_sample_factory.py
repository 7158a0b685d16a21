"""Return against wall-clock time: the main job (`asyncrl run`, default config, HalfCheetah-v5)
against Sample Factory 2.1.1 APPO (HalfCheetah-v4: its MuJoCo example pins gymnasium 0.29 /
mujoco 2.3), alternated seed by seed in one benchmark run on this machine.

For each seed: asyncrl trains to --total-steps; then Sample Factory trains for the same wall time
(`--train_for_seconds`, docs/benchmarks.md's command: 2 workers x 8 envs, CPU learner). Reported
per seed: the time each takes to reach --target (or "not reached"), asyncrl's final return, and
Sample Factory's return at asyncrl's finishing time. Sample Factory's curve is read from its console
("Avg episode reward", a mean over its last 100 episodes), timed by this script as lines arrive;
asyncrl's from metrics.jsonl (mean of the last 20 episodes), both counted from the command's launch
(metrics.jsonl counts from the learner's start, a few seconds later: shifted by that).

    .venv/bin/python bench/vs_sample_factory.py --peer-sf /tmp/sf/bin/python --seeds 101,102,103,104,105 \\
        --out bench/results/vs-sample-factory

The moonshot (issue 44): each asyncrl run stopped at a wall-clock budget instead of a step count,
both sides compared at that time, with HalfCheetah's mode counts (returns at or above --mode are the
fast upright gait; the cheetah on its back stays near 1,600):

    .venv/bin/python bench/vs_sample_factory.py --peer-sf /tmp/sf/bin/python --seeds 501,502,503,504,505 \\
        --wall-budget 600 --total-steps 11000000 --target 6000 --mode 3000 --out bench/results/moonshot

With a budget, --total-steps is the learning-rate schedule's length and a second stop: set it to
about what asyncrl reaches in the budget (11M in about 540 s on the 2-core Intel Xeon, 2026-12-07). Sample Factory
trains for the whole budget and is read both at asyncrl's end and at the budget.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from asyncrl.run.pdeathsig import sigint_as_in_a_terminal

REWARD = re.compile(r"Avg episode reward: \[\(0, '([-0-9.eE+]+)'\)\]")
FRAMES = re.compile(r"Total num frames: (\d+)")


def asyncrl_run(args, seed: int, out: Path) -> dict:
    """The main job to --total-steps, or stopped by SIGINT at --wall-budget seconds if that comes first
    (its summary says interrupted; its curve is what it logged until then). --total-steps is also the
    length of the learning-rate schedule (anneal_lr), so with a budget it should be about what the
    budget reaches: a horizon far past it would leave the lr near its start for the whole run."""
    run_dir = out / f"asyncrl-s{seed}"
    budget = args.wall_budget
    cmd = [
        sys.executable,
        "-m",
        "asyncrl.cli",
        "run",
        "--env",
        "HalfCheetah-v5",
        "--seed",
        str(seed),
        "--total-steps",
        str(args.total_steps),
        "--run-dir",
        str(run_dir),
        "--set",
        "run.log_every_s=60",
        *(["--config", args.config] if args.config else []),
        *[x for kv in args.set for x in ("--set", kv)],
    ]
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # the same clock as Sample Factory's curve: metrics.jsonl times count from the learner's start, a few
    # seconds after the command; its clock's zero is when the last row was written less that row's time
    try:
        proc.wait(timeout=budget or None)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # the budget: the learner writes its summary and checkpoint
        proc.wait(timeout=120)
    if proc.returncode not in (0, 130) or (proc.returncode == 130 and not budget):
        raise RuntimeError(f"asyncrl run exited with status {proc.returncode}; see {run_dir}/logs")
    wall = min(time.time() - t0, budget) if budget else time.time() - t0
    metrics = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    start_s = max(0.0, metrics.stat().st_mtime - rows[-1]["wall_time_s"] - t0) if rows else 0.0
    curve = [
        [start_s + r["wall_time_s"], r["env_steps"], r["average_return"]]
        for r in rows
        if r.get("average_return") is not None
    ]
    s = json.loads((run_dir / "summary.json").read_text())
    return {
        "seed": seed,
        "wall_s": wall,
        "curve": curve,
        "final_return": value_at(curve, wall) if budget else s["final_average_return"],
        "env_steps_per_s": s["env_steps_per_s"],
        "lag_p50": s["lag_p50"],
        "lag_p95": s["lag_p95"],
        "learner_start_s": start_s,
    }


def sample_factory_run(args, seed: int, seconds: float, out: Path) -> dict:
    cmd = [
        args.peer_sf,
        "-m",
        "sf_examples.mujoco.train_mujoco",
        "--env=mujoco_halfcheetah",
        f"--experiment=hc-s{seed}",
        f"--train_dir={out / 'sf-runs'}",
        "--device=cpu",
        "--num_workers=2",
        "--num_envs_per_worker=8",
        f"--seed={seed}",
        f"--train_for_seconds={int(seconds) + 1}",
        "--train_for_env_steps=100000000",
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    t0 = time.time()
    # its own session: its spawned workers outlive a killed parent and must die with the group
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=out,
        env=env,
        start_new_session=True,
        preexec_fn=sigint_as_in_a_terminal,
    )
    curve, frames = [], 0
    log = open(out / f"sf-s{seed}.log", "w")
    # --train_for_seconds does not stop Sample Factory 2.1.1 here (seen: still training after 6 min of
    # a 100 s budget), so this script ends it at the same wall time as asyncrl's run, startup included
    stop = threading.Timer(seconds, lambda: _signal_group(proc, signal.SIGINT))
    kill = threading.Timer(seconds + 15, lambda: _signal_group(proc, signal.SIGKILL))
    stop.start(), kill.start()
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            log.write(line)
            if m := FRAMES.search(line):
                frames = int(m.group(1))
            if m := REWARD.search(line):
                curve.append([time.time() - t0, frames, float(m.group(1))])
        proc.wait()
    finally:
        stop.cancel(), kill.cancel()
        log.close()
        _signal_group(proc, signal.SIGKILL)
    if not curve:
        raise RuntimeError(f"Sample Factory printed no reward line (exit {proc.returncode}); see {log.name}")
    return {"seed": seed, "curve": curve, "wall_s": time.time() - t0}


def _signal_group(proc, sig) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def first_time(curve, target):
    return next((t for t, _, r in curve if r >= target), None)


def value_at(curve, t):
    before = [r for s, _, r in curve if s <= t]
    return before[-1] if before else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--peer-sf", required=True, metavar="PYTHON", help="python of a venv with sample-factory[mujoco]==2.1.1"
    )
    p.add_argument("--seeds", default="101,102,103,104,105")
    p.add_argument(
        "--total-steps",
        type=int,
        default=1_000_000,
        help="asyncrl's env steps, and its learning-rate schedule's length (with --wall-budget: about what it reaches)",
    )
    p.add_argument("--target", type=float, default=3000.0)
    p.add_argument(
        "--wall-budget", type=float, default=0.0, help="seconds: stop each asyncrl run then (0: at --total-steps)"
    )
    p.add_argument(
        "--mode", type=float, default=3000.0, help="HalfCheetah: returns at or above this are the upright mode"
    )
    p.add_argument("--config", help="an asyncrl config file for its runs (e.g. configs/halfcheetah-fast.toml)")
    p.add_argument("--set", action="append", default=[], help="KEY=VALUE for asyncrl's runs (repeatable)")
    p.add_argument("--out", default="bench/results/vs-sample-factory")
    p.add_argument(
        "--overwrite", action="store_true", help="delete this benchmark's earlier runs of these seeds in --out first"
    )
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks: no orphaned workers
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    earlier = [d for s in seeds for d in (out / f"asyncrl-s{s}", out / "sf-runs" / f"hc-s{s}") if d.exists()]
    if earlier and not args.overwrite:  # `asyncrl run` refuses a used run dir; say so before an hour of runs
        sys.exit(
            f"vs_sample_factory: {out} already holds runs of these seeds ({', '.join(d.name for d in earlier)}); "
            "pass --overwrite to delete them, or another --out"
        )
    for d in earlier:
        shutil.rmtree(d)
    rows = []
    for seed in seeds:  # alternate: drift hits both alike
        a = asyncrl_run(args, seed, out)
        # with a budget, Sample Factory trains for all of it even where asyncrl ended earlier by its steps
        sf = sample_factory_run(args, seed, args.wall_budget or a["wall_s"], out)
        row = {
            "seed": seed,
            "asyncrl": a,
            "sample_factory": sf,
            "load_after": os.getloadavg()[0],
            "asyncrl_time_to_target_s": first_time(a["curve"], args.target),
            "sf_time_to_target_s": first_time(sf["curve"], args.target),
            "sf_return_at_asyncrl_end": value_at(sf["curve"], a["wall_s"]),
            "sf_return_at_budget": value_at(sf["curve"], args.wall_budget) if args.wall_budget else None,
        }
        rows.append(row)
        fmt = lambda x: "not reached" if x is None else f"{x:.0f} s"  # noqa: E731
        print(
            f"seed {seed}: asyncrl {a['final_return'] or float('nan'):,.0f} after {a['wall_s']:.0f} s "
            f"(reached {args.target:,.0f}: {fmt(row['asyncrl_time_to_target_s'])}); Sample Factory "
            f"{row['sf_return_at_asyncrl_end'] or float('nan'):,.0f} at the same wall time "
            f"(reached {args.target:,.0f}: {fmt(row['sf_time_to_target_s'])})",
            flush=True,
        )
        (out / "results.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1) + "\n")
    finals = [r["asyncrl"]["final_return"] for r in rows if r["asyncrl"]["final_return"] is not None]
    sf_same = [r["sf_return_at_asyncrl_end"] for r in rows if r["sf_return_at_asyncrl_end"] is not None]
    high = lambda xs: sum(x >= args.mode for x in xs)  # noqa: E731
    print(
        f"median: asyncrl {statistics.median(finals) if finals else float('nan'):,.0f} "
        f"({high(finals)} of {len(finals)} at or above {args.mode:,.0f}); Sample Factory at the same wall time "
        f"{statistics.median(sf_same) if sf_same else float('nan'):,.0f} ({high(sf_same)} of {len(sf_same)})"
    )
    if args.wall_budget:
        sf_budget = [r["sf_return_at_budget"] for r in rows if r["sf_return_at_budget"] is not None]
        sf_median = statistics.median(sf_budget) if sf_budget else float("nan")
        print(
            f"Sample Factory at the budget ({args.wall_budget:.0f} s): median "
            f"{sf_median:,.0f} ({high(sf_budget)} of {len(sf_budget)}); "
            f"runs at or above --target {args.target:,.0f} by then: asyncrl "
            f"{sum(r['asyncrl_time_to_target_s'] is not None for r in rows)} of {len(rows)}, Sample Factory "
            f"{sum(r['sf_time_to_target_s'] is not None for r in rows)} of {len(rows)}"
        )
    (out / "results.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1) + "\n")
    try:
        from asyncrl.analysis.plots import plot_curves
    except ImportError:
        return
    series = []
    for r in rows:
        for name, run in (
            ("asyncrl (HalfCheetah-v5)", r["asyncrl"]),
            ("Sample Factory 2.1.1 (HalfCheetah-v4)", r["sample_factory"]),
        ):
            series.append(
                {
                    "label": f"{name} seed {r['seed']}",
                    "group": name,
                    "wall_time_s": [c[0] for c in run["curve"]],
                    "env_steps": [c[1] for c in run["curve"]],
                    "return": [c[2] for c in run["curve"]],
                }
            )
    print(
        "plot:",
        plot_curves(series, out / "return-vs-time.png", title="main job vs Sample Factory, same machine, alternated"),
    )


if __name__ == "__main__":
    main()
