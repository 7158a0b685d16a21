"""Soak benchmark: memory of each role over a long `asyncrl run`.

    .venv/bin/python bench/soak.py                      # 30 minutes
    .venv/bin/python bench/soak.py --minutes 5          # a shorter look

Starts `asyncrl run` (default config, HalfCheetah-v5, a budget it cannot reach), samples the
resident set size (VmRSS, /proc/PID/status) of every role every ``--every-s`` (30) seconds, and
stops the run with SIGINT after ``--minutes``. A role replaced meanwhile (it should not be: no
faults are injected) is reported and its series restarts. Passes (exit 0) if every role's RSS at
the end is less than 5 % above its RSS at minute 2 (``--from-minute``), the run ended
"interrupted" by the SIGINT, and no process or /dev/shm segment of it is left. Results in
``--out``/results.json: every sample, the growth of each role, the run's env steps and return.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from asyncrl.run.pdeathsig import sigint_as_in_a_terminal

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chaos import ASYNCRL, REPO, end_run, read_summary, roles, segments  # noqa: E402


def rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="HalfCheetah-v5")
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--every-s", type=float, default=30.0)
    ap.add_argument("--from-minute", type=float, default=2.0)
    ap.add_argument("--limit-pct", type=float, default=5.0)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "soak")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="asyncrl-soak-"))
    run_dir = work / "run"
    load = os.getloadavg()
    cmd = [*ASYNCRL, "run", "--env", args.env, "--total-steps", str(10**12), "--run-dir", str(run_dir)]
    log = open(work / "run.out", "w")
    t0 = time.monotonic()
    sup = subprocess.Popen(
        cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=sigint_as_in_a_terminal
    )
    samples: list[dict] = []
    pids: dict[str, int] = {}
    replaced: list[dict] = []
    seen: set[int] = set()
    try:
        next_at = t0
        while sup.poll() is None and time.monotonic() - t0 < args.minutes * 60:
            if time.monotonic() >= next_at:
                next_at += args.every_s
                now = roles(sup.pid)
                seen.update(now.values())
                for name, pid in now.items():
                    if name in pids and pids[name] != pid:
                        replaced.append({"role": name, "old": pids[name], "new": pid})
                    pids[name] = pid
                row = {"t_s": round(time.monotonic() - t0, 1), "rss_kib": {n: rss_kib(p) for n, p in now.items()}}
                samples.append(row)
                print(
                    f"t={row['t_s']:6.0f}s "
                    + " ".join(f"{n}={v / 1024:.0f}MiB" for n, v in sorted(row["rss_kib"].items()) if v),
                    flush=True,
                )
            time.sleep(0.5)
        ended_early = sup.poll() is not None
        if not ended_early:
            sup.send_signal(signal.SIGINT)
        try:
            rc = sup.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(sup.pid, signal.SIGKILL)
            rc = sup.wait()
    finally:
        left = end_run(sup, log, seen)
    summary = read_summary(run_dir)
    start = next((s for s in samples if s["t_s"] >= args.from_minute * 60), None)
    growth = {}
    if start is not None and samples:
        end = samples[-1]
        for name, v0 in start["rss_kib"].items():
            v1 = end["rss_kib"].get(name)
            if v0 and v1:
                growth[name] = {
                    "start_kib": v0,
                    "end_kib": v1,
                    "growth_pct": round(100.0 * (v1 - v0) / v0, 2),
                    "max_kib": max(s["rss_kib"].get(name) or 0 for s in samples if s["t_s"] >= start["t_s"]),
                }
    leaked = segments(summary.get("run_id")) if summary.get("run_id") else ["(no run id)"]
    checks = {
        "ran the whole time": not ended_early and start is not None,
        f"RSS growth < {args.limit_pct:g} % for every role": bool(growth)
        and all(g["growth_pct"] < args.limit_pct for g in growth.values()),
        "no role replaced": not replaced,
        "ended interrupted": summary.get("outcome") == "interrupted",
        "0 leaked segments, 0 leftover processes": not leaked and not left,
    }
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "load_at_start": load,
        "cpus": os.cpu_count(),
        "command": " ".join(["bench/soak.py", *sys.argv[1:]]),
        "minutes": args.minutes,
        "rc": rc,
        "growth": growth,
        "replaced": replaced,
        "samples": samples,
        "checks": checks,
        "passed": all(checks.values()),
        "summary": {
            k: summary.get(k)
            for k in ("outcome", "env_steps", "final_average_return", "env_steps_per_s", "wall_time_s")
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    for name, g in sorted(growth.items()):
        print(
            f"{name}: {g['start_kib'] / 1024:.1f} MiB at {args.from_minute:g} min -> {g['end_kib'] / 1024:.1f} MiB "
            f"at the end ({g['growth_pct']:+.2f} %), max {g['max_kib'] / 1024:.1f} MiB"
        )
    for name, ok in checks.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    print(
        f"env steps {summary.get('env_steps')}, return {summary.get('final_average_return')}; "
        f"results: {args.out / 'results.json'}"
    )
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
