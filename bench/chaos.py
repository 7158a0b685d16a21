"""Chaos benchmark: the main job keeps training while its roles are killed and frozen.

    .venv/bin/python bench/chaos.py                       # about 25 minutes on the 2-core machine
    .venv/bin/python bench/chaos.py --clean-minutes 2     # a shorter look

1. Calibrate (unless ``--total-steps``): a short clean `asyncrl run` gives env steps/s (over its
   second half, start-up left out); the budget is what a clean run does in ``--clean-minutes``
   (10), rounded to 100k steps.
2. Clean run: `asyncrl run` (default config, HalfCheetah-v5) with that budget.
3. Chaos run: the same command; every ``--interval-s`` (20) a random role kind (actor,
   broadcaster or learner; a random actor of the actors) is SIGKILLed, or SIGSTOPped for
   ``transport.actor_timeout_s`` + 2 s (longer than the timeout after which its peers give it up)
   and then SIGCONTinued. An actor is stopped only while it runs (state R, so almost always
   inside collect(), writing a slot) after a random delay: freezes land at random rows mid-write.
   The supervisor restarts what died, with the default restart budget.

Checks (exit 1 if one fails): the chaos run exits 0 with outcome "finished" and its whole budget;
0 slots trained on with data of a revoked writer, by the learner's row-tag audit, which is
independent of the generation check that guards slots (summary.json ``slot_audit``:
``passed_generation_foreign_rows`` counts slots that check passed although a row was tagged with
another grant); no shared-memory segment of either run left in /dev/shm; no role process left.
Results: wall time and final average return of both runs, the faults, restarts, resumes, rejoins
and rejected slots, in ``--out``/results.json.

The audit counts come from the final learner's summary, which carries its checkpoint's counts
forward: slots consumed after the last checkpoint of a learner that was then killed are not in
them, but neither are those slots in the final weights (the replacement resumes from the
checkpoint before them).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ASYNCRL = [sys.executable, "-m", "asyncrl.cli"]


def run_cmd(run_dir: Path, total_steps: int, env_id: str, seed: int) -> list[str]:
    return [
        *ASYNCRL,
        "run",
        "--env",
        env_id,
        "--total-steps",
        str(total_steps),
        "--run-dir",
        str(run_dir),
        "--seed",
        str(seed),
        "--restart",
        "refuse",
    ]


def children(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc/*/stat ppid)."""
    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            parent[int(d)] = int(stat.rsplit(")", 1)[1].split()[1])
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def role_of(pid: int) -> str | None:
    """'learner', 'broadcaster' or the actor id of an asyncrl role process, else None."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    if "asyncrl.cli" not in argv:
        return None
    rest = argv[argv.index("asyncrl.cli") + 1 :]
    if not rest:
        return None
    if rest[0] == "actor" and "--actor-id" in rest:
        return rest[rest.index("--actor-id") + 1]
    return rest[0] if rest[0] in ("learner", "broadcaster") else None


def roles(sup_pid: int) -> dict[str, int]:
    return {r: p for p in children(sup_pid) if (r := role_of(p)) is not None}


def state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def segments(run_id: str | None) -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith("asyncrl-") and (run_id is None or run_id in n))


def end_run(sup: subprocess.Popen, log, seen_pids) -> list[int]:
    """After a run: SIGKILL the supervisor's process group if it still lives, close its log, and
    SIGKILL any role process seen during the run that outlived it (ours: seen as the supervisor's
    children); returns those pids, which the checks report."""
    if sup.poll() is None:
        os.killpg(sup.pid, signal.SIGKILL)
        sup.wait()
    log.close()
    time.sleep(1.0)
    left = [p for p in seen_pids if state(p) not in (None, "Z")]
    for p in left:
        os.kill(p, signal.SIGKILL)
    return left


def read_summary(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


def steady_rate(run_dir: Path) -> float:
    """Env steps/s over the second half of a finished run (metrics.jsonl), leaving out the
    start-up that the summary's average includes (a 300k-step run's average was 7,532 steps/s
    when the clean 4.5M-step run that followed did 8,970); 0.0 if it cannot be read."""
    try:
        recs = [
            r
            for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if "env_steps" in r and "wall_time_s" in r
        ]
    except (OSError, ValueError):
        return 0.0
    if len(recs) < 4:
        return 0.0
    mid, last = recs[len(recs) // 2], recs[-1]
    dt = last["wall_time_s"] - mid["wall_time_s"]
    return (last["env_steps"] - mid["env_steps"]) / dt if dt > 0 else 0.0


def one_run(run_dir: Path, total_steps: int, args, *, chaos: bool, rng: random.Random) -> dict:
    """One `asyncrl run`; with ``chaos``, faults every args.interval_s. Returns what happened."""
    cmd = run_cmd(run_dir, total_steps, args.env, args.seed)
    log = open(run_dir.parent / f"{run_dir.name}.out", "w")
    t0 = time.monotonic()
    sup = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    events: list[dict] = []
    stop_s = args.actor_timeout_s + 2.0
    deadline = t0 + args.timeout_s
    seen_pids: set[int] = set()
    next_fault = t0 + args.interval_s
    try:
        while sup.poll() is None and time.monotonic() < deadline:
            live = roles(sup.pid)
            seen_pids.update(live.values())
            if chaos and time.monotonic() >= next_fault and live:
                next_fault += args.interval_s
                kind = rng.choice(["actor", "broadcaster", "learner"])
                names = [n for n in live if (n.startswith("actor") if kind == "actor" else n == kind)]
                if not names:
                    continue
                name = rng.choice(sorted(names))
                pid, how = live[name], rng.choice(["kill", "stop"])
                ev = {"t_s": round(time.monotonic() - t0, 1), "role": name, "pid": pid, "fault": how}
                if how == "kill":
                    os.kill(pid, signal.SIGKILL)
                else:
                    if kind == "actor":  # land inside collect(): wait for it to run, then a random delay
                        until = time.monotonic() + 2.0
                        while state(pid) not in ("R", None) and time.monotonic() < until:
                            time.sleep(0.001)
                        time.sleep(rng.uniform(0.0, 0.02))
                    ev["state_at_stop"] = state(pid)
                    try:
                        os.kill(pid, signal.SIGSTOP)
                        time.sleep(stop_s)
                        os.kill(pid, signal.SIGCONT)
                        ev["stopped_s"] = stop_s
                    except ProcessLookupError:  # the supervisor replaced it meanwhile
                        ev["gone"] = True
                events.append(ev)
                print(f"  chaos t={ev['t_s']:.0f}s: {how} {name}", flush=True)
            time.sleep(0.2)
        timed_out = sup.poll() is None
        if timed_out:
            os.killpg(sup.pid, signal.SIGKILL)
        rc = sup.wait()
    finally:
        wall = time.monotonic() - t0
        left = end_run(sup, log, seen_pids)
    summary = read_summary(run_dir)
    run_id = summary.get("run_id")
    leaked = segments(run_id) if run_id else ["(no run id: summary.json missing)"]
    return {
        "rc": rc,
        "timed_out": timed_out,
        "wall_s": round(wall, 1),
        "events": events,
        "leftover_pids": left,
        "leaked_segments": leaked,
        "summary": {
            k: summary.get(k)
            for k in (
                "outcome",
                "failure",
                "env_steps",
                "final_average_return",
                "restarts",
                "resumes",
                "actor_rejoins",
                "rejected_slots",
                "slot_audit",
                "dropped_samples",
                "env_steps_per_s",
                "learner_epoch",
            )
        },
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="HalfCheetah-v5")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--clean-minutes", type=float, default=10.0)
    ap.add_argument("--total-steps", type=int, default=0, help="skip the calibration and use this budget")
    ap.add_argument("--interval-s", type=float, default=20.0)
    ap.add_argument(
        "--actor-timeout-s",
        type=float,
        default=10.0,
        help="the run's transport.actor_timeout_s (default config: 10); freezes last 2 s longer",
    )
    ap.add_argument("--fault-seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "chaos")
    args = ap.parse_args()
    rng = random.Random(args.fault_seed)
    work = Path(tempfile.mkdtemp(prefix="asyncrl-chaos-"))
    before = set(segments(None))
    load = os.getloadavg()
    total = args.total_steps
    calibration = None
    if not total:
        args.timeout_s = 600
        cal = one_run(work / "calibrate", 400_000, args, chaos=False, rng=rng)
        rate = steady_rate(work / "calibrate")
        if cal["rc"] != 0 or not rate:
            print(f"calibration run failed: {cal}", file=sys.stderr)
            return 1
        total = max(100_000, int(round(rate * args.clean_minutes * 60 / 100_000)) * 100_000)
        calibration = {"env_steps_per_s": rate, "total_steps": total}
        print(f"calibration: {rate:,.0f} env steps/s -> budget {total:,} env steps", flush=True)
    args.timeout_s = max(1800.0, args.clean_minutes * 60 * 6)
    print("clean run ...", flush=True)
    clean = one_run(work / "clean", total, args, chaos=False, rng=rng)
    print(f"  rc {clean['rc']}, {clean['wall_s']:.0f} s, return {clean['summary']['final_average_return']}", flush=True)
    print(f"chaos run (a fault every {args.interval_s:g} s) ...", flush=True)
    chaos = one_run(work / "chaos", total, args, chaos=True, rng=rng)
    s = chaos["summary"]
    audit = s.get("slot_audit") or {}
    checks = {
        "exit 0": chaos["rc"] == 0,
        "outcome finished": s.get("outcome") == "finished",
        "whole budget": (s.get("env_steps") or 0) >= total,
        "0 slots passed with foreign rows": audit.get("passed_generation_foreign_rows", 0) == 0
        and audit.get("copied", 0) > 0,
        "0 leaked segments": not chaos["leaked_segments"]
        and not clean["leaked_segments"]
        and set(segments(None)) <= before,
        "0 leftover processes": not chaos["leftover_pids"] and not clean["leftover_pids"],
    }
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "load_at_start": load,
        "cpus": os.cpu_count(),
        "command": " ".join(["bench/chaos.py", *sys.argv[1:]]),
        "env": args.env,
        "seed": args.seed,
        "interval_s": args.interval_s,
        "stop_s": args.actor_timeout_s + 2,
        "calibration": calibration,
        "total_steps": total,
        "clean": clean,
        "chaos": chaos,
        "checks": checks,
        "passed": all(checks.values()),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    kinds = {}
    for e in chaos["events"]:
        kinds[e["fault"]] = kinds.get(e["fault"], 0) + 1
    print(
        f"\nbudget {total:,} env steps; clean {clean['wall_s']:.0f} s, return "
        f"{clean['summary']['final_average_return']}; chaos {chaos['wall_s']:.0f} s, return "
        f"{s.get('final_average_return')}; faults {kinds}; restarts {s.get('restarts')}; resumes "
        f"{s.get('resumes')}; rejected slots {s.get('rejected_slots')}; slot audit {audit}"
    )
    for name, ok in checks.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    print(f"results: {args.out / 'results.json'}; run directories in {work}")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
