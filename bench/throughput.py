"""Throughput benchmark (``make bench``): env steps per second consumed by the learner while it
trains HalfCheetah-v5 with learner, broadcaster and actors as separate processes.

Runs ``asyncrl run`` --runs times with a step budget of --seconds x --expected-rate (so each run
lasts at least about that long), and prints the median rate and where the time went:
actors' env stepping, policy inference and waiting for a slot grant, and the learner's update and
idle time (all in seconds summed over processes, and as a share of the run's wall time).

    .venv/bin/python bench/throughput.py --runs 3 --seconds 60
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def one_run(args, i: int, out: Path) -> dict:
    run_dir = out / f"run{i}"
    budget = int(args.seconds * args.expected_rate)
    cmd = [
        sys.executable,
        "-m",
        "asyncrl.cli",
        "run",
        "--env",
        args.env,
        "--num-actors",
        str(args.num_actors),
        "--total-steps",
        str(budget),
        "--run-dir",
        str(run_dir),
        "--set",
        "run.log_every_s=1000",
        *sum((["--set", s] for s in args.set), []),
    ]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    s = json.loads((run_dir / "summary.json").read_text())
    wall = s["wall_time_s"]
    t = s.get("time_breakdown_s", {})
    row = {
        "env_steps_per_s": s["env_steps_per_s"],
        "wall_time_s": wall,
        "env_steps": s["env_steps"],
        "lag_p50": s["lag_p50"],
        "lag_p95": s["lag_p95"],
        "share_of_wall": {k: v / wall for k, v in t.items()},
    }
    print(
        f"run {i}: {s['env_steps_per_s']:,.0f} env steps/s over {wall:.0f} s; "
        + ", ".join(f"{k} {v / wall:.2f}" for k, v in sorted(t.items())),
        flush=True,
    )
    return row


FPS_LINE = re.compile(r"Fps is \(10 sec: ([0-9.nan]+), 60 sec: ([0-9.nan]+)")


def sample_factory_run(args, i: int, out: Path) -> float:
    """Sample Factory 2.1.1 APPO on HalfCheetah with the command of docs/benchmarks.md (2 workers x 8 envs,
    CPU learner), in its own virtualenv; returns the last 60-second FPS it printed (learning on). Its
    step budget comes from its own expected rate (--peer-expected-rate): sized from ours, each of its
    runs lasted about five minutes for one 60-second window."""
    budget = int(max(args.seconds, 60.0) * args.peer_expected_rate * 1.3)
    cmd = [
        args.peer_sf,
        "-m",
        "sf_examples.mujoco.train_mujoco",
        "--env=mujoco_halfcheetah",
        f"--experiment=bench{i}",
        f"--train_dir={out / 'sf-runs'}",
        "--device=cpu",
        "--num_workers=2",
        "--num_envs_per_worker=8",
        f"--train_for_env_steps={budget}",
    ]
    if args.sf_async:
        cmd.append("--async_rl=True")
    # its own session, so that an interrupted benchmark kills its worker processes too (they are
    # spawned children that outlive a killed parent and would load the machine for later runs)
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=out, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate()
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    rates = [float(m.group(2)) for m in FPS_LINE.finditer(stdout + stderr) if m.group(2) != "nan"]
    if not rates:
        raise RuntimeError(f"Sample Factory printed no FPS line (exit {proc.returncode}):\n{stderr[-2000:]}")
    print(f"sample factory run {i}: {rates[-1]:,.0f} env steps/s (60-second window)", flush=True)
    return rates[-1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="HalfCheetah-v5")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seconds", type=float, default=60.0, help="minimum length of each run")
    p.add_argument(
        "--expected-rate",
        type=float,
        default=11000.0,
        help="env steps/s used to size the budget (a faster run would end before --seconds)",
    )
    p.add_argument("--num-actors", type=int, default=2)
    p.add_argument("--set", action="append", default=[], help="config override for every run")
    p.add_argument("--out", default=None, help="directory for the runs (default: a temporary one)")
    p.add_argument(
        "--peer-sf",
        default=None,
        metavar="PYTHON",
        help="python of a virtualenv with sample-factory[mujoco]: alternate its runs with ours",
    )
    p.add_argument(
        "--peer-expected-rate",
        type=float,
        default=6000.0,
        help="Sample Factory's env steps/s used to size its budget (its 60-second FPS window needs a run "
        "longer than a minute; 5,300-5,800 on the 2-core test machine)",
    )
    p.add_argument("--sf-async", action="store_true", help="Sample Factory with --async_rl=True")
    args = p.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="asyncrl-bench-"))
    rows, peer = [], []
    for i in range(args.runs):  # alternate, so drift on a shared machine hits both alike
        rows.append(one_run(args, i, out))
        if args.peer_sf:
            peer.append(sample_factory_run(args, i, out))
    rates = [r["env_steps_per_s"] for r in rows]
    keys = sorted({k for r in rows for k in r["share_of_wall"]})
    median_share = {k: statistics.median(r["share_of_wall"].get(k, 0.0) for r in rows) for k in keys}
    med = statistics.median(rates)
    print(f"median {med:,.0f} env steps/s (runs: {', '.join(f'{x:,.0f}' for x in rates)})")
    if peer:
        print(
            f"Sample Factory 2.1.1 APPO, same benchmark run: median {statistics.median(peer):,.0f} env steps/s "
            f"(runs: {', '.join(f'{x:,.0f}' for x in peer)}); ratio asyncrl / SF = {med / statistics.median(peer):.2f}"
        )
    else:
        print("(no same-run ratio: give --peer-sf PYTHON to run Sample Factory alternately; docs/benchmarks.md)")
    print("median share of wall time (process-seconds per second; actors summed):")
    for k, v in median_share.items():
        print(f"  {k:<22} {v:5.2f}")
    (out / "throughput.json").write_text(
        json.dumps(
            {
                "args": vars(args),
                "runs": rows,
                "sample_factory": peer,
                "median_env_steps_per_s": statistics.median(rates),
                "median_share_of_wall": median_share,
            },
            indent=2,
        )
    )
    print(f"details: {out / 'throughput.json'}")


if __name__ == "__main__":
    main()
