"""How the learner's throughput grows with work, and the lag it costs: `asyncrl run` on a cheap toy
env (asyncrl/Corridor-v0: no physics, so the learner is the bottleneck) for each combination of
batch size (learner.slots_per_batch), number of actors and number of learner processes
(learner.num_learners; docs/learner-group.md), each run for a fixed wall time and stopped with
SIGINT. Per run, over the window after ``--warmup`` seconds of training (start-up and the first
iteration's compile excluded): samples trained per second, learner iterations per second, the
learner's busy share, and the lag (versions and seconds, medians of the per-iteration p50 / p95).

    .venv/bin/python bench/learner_scaling.py --seconds 40 --out bench/results/learner-scaling/cpu.jsonl
    .venv/bin/python bench/learner_scaling.py --report bench/results/learner-scaling/cpu.jsonl --plot scaling.png

On this 2-core machine it shows the shape (actors and learners share two cores); on a GPU machine
(``bench/gpu_check.sh``, ``--device cuda``) it gives the absolute figures. Runs are alternated
(``--repeats`` passes over the grid) and every run is one JSON line.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from asyncrl.run.pdeathsig import sigint_as_in_a_terminal

ROOT = Path(__file__).resolve().parents[1]
ENV = "asyncrl/Corridor-v0"


def run_one(
    *, slots: int, actors: int, learners: int, seconds: float, warmup: float, device: str, extra: list[str]
) -> dict:
    """One `asyncrl run` of ``seconds`` (SIGINT then), measured over [warmup, end] of its training."""
    with tempfile.TemporaryDirectory(prefix="asyncrl-scaling-") as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [
            sys.executable, "-m", "asyncrl", "run", "--env", ENV, "--num-actors", str(actors),
            "--learners", str(learners), "--run-dir", str(run_dir), "--total-steps", "1000000000",
            "--set", f"learner.slots_per_batch={slots}", "--set", f"learner.num_slots={max(12, 3 * slots)}",
            "--set", f"learner.device={device}", "--set", "run.log_every_s=1000", "--set", "learner.checkpoint_every=0",
            *extra,
        ]  # fmt: skip
        started = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its roles too, if it must be killed
            preexec_fn=sigint_as_in_a_terminal,  # else SIGINT is ignored when this benchmark runs in the background
        )
        try:
            proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        err = proc.stderr.read() if proc.stderr else ""
        rows = []
        metrics = run_dir / "metrics.jsonl"
        if metrics.exists():
            rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip() and '"event"' not in x]
        summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    if len(rows) < 3:
        raise SystemExit(f"learner_scaling: a run produced {len(rows)} iterations; its stderr:\n{err[-2000:]}")
    t0 = rows[0]["wall_time_s"] + warmup
    window = [r for r in rows if r["wall_time_s"] >= t0] or rows[-2:]
    first, last = window[0], window[-1]
    span = max(last["wall_time_s"] - first["wall_time_s"], 1e-9)
    busy = summary.get("time_breakdown_s", {}).get("learner_update_s")
    return {
        "slots_per_batch": slots,
        "batch_samples": slots * 8 * 64,  # env.num_envs x env.rollout_length of the default config
        "actors": actors,
        "learners": learners,
        "device": device,
        "samples_per_s": (last["env_steps"] - first["env_steps"]) / span,
        "iterations_per_s": (last["iteration"] - first["iteration"]) / span,
        "learner_busy_share": None if busy is None else busy / max(summary.get("wall_time_s", 0.0), 1e-9),
        "lag_versions_p50": statistics.median(r["lag_versions_p50"] for r in window),
        "lag_versions_p95": statistics.median(r["lag_versions_p95"] for r in window),
        "lag_seconds_p50": statistics.median(r["lag_seconds_p50"] for r in window),
        "lag_seconds_p95": statistics.median(r["lag_seconds_p95"] for r in window),
        "window_iterations": len(window),
        "wall_s": time.monotonic() - started,
        "load_average": os.getloadavg(),
        "cpu": platform.processor() or platform.machine(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def report(paths: list[str], plot: str | None) -> str:
    rows = [json.loads(x) for p in paths for x in Path(p).read_text().splitlines() if x.strip()]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["device"], r["learners"], r["actors"], r["slots_per_batch"]), []).append(r)
    lines = [
        "| device | learners | actors | batch (samples) | samples/s (median) | iterations/s | learner busy | "
        "lag p50 / p95 (versions) | lag p50 / p95 (s) | runs |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key in sorted(groups):
        g = groups[key]

        def med(k, g=g):
            vals = [r[k] for r in g if r[k] is not None]
            return statistics.median(vals) if vals else float("nan")

        lines.append(
            f"| {key[0]} | {key[1]} | {key[2]} | {g[0]['batch_samples']:,} | {med('samples_per_s'):,.0f} | "
            f"{med('iterations_per_s'):.2f} | {med('learner_busy_share'):.2f} | {med('lag_versions_p50'):g} / "
            f"{med('lag_versions_p95'):g} | {med('lag_seconds_p50'):.2f} / {med('lag_seconds_p95'):.2f} | {len(g)} |"
        )
    if plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
        for (device, learners, actors), marker in zip(sorted({k[:3] for k in groups}), itertools.cycle("osd^v<>")):
            keys = sorted(k for k in groups if k[:3] == (device, learners, actors))
            xs = [groups[k][0]["batch_samples"] for k in keys]
            label = f"{learners} learner(s), {actors} actor(s), {device}"
            for ax, key in ((ax1, "samples_per_s"), (ax2, "lag_seconds_p95")):
                ax.plot(xs, [statistics.median(r[key] for r in groups[k]) for k in keys], marker=marker, label=label)
        ax1.set(xlabel="batch (samples)", ylabel="samples trained / s", xscale="log", title="learner throughput")
        ax2.set(xlabel="batch (samples)", ylabel="lag p95 (s)", xscale="log", title="the lag it costs")
        ax1.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(plot, dpi=120)
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slots", default="2,4,8", help="learner.slots_per_batch values (x 512 samples each)")
    ap.add_argument("--actors", default="1,2,4")
    ap.add_argument("--learners", default="1,2")
    ap.add_argument("--seconds", type=float, default=40.0, help="wall time of each run")
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds of training left out of the window")
    ap.add_argument("--repeats", type=int, default=1, help="passes over the grid (alternated)")
    ap.add_argument("--device", default="cpu", help="learner.device")
    ap.add_argument("--set", dest="extra", action="append", default=[], help="more --set KEY=VALUE for every run")
    ap.add_argument("--out", help="append each run as one JSON line")
    ap.add_argument("--report", nargs="*", help="print a table of these result files instead of measuring")
    ap.add_argument("--plot", help="with --report: write the figure here")
    a = ap.parse_args()
    if a.report:
        print(report(a.report, a.plot))
        return
    extra = [x for kv in a.extra for x in ("--set", kv)]
    grid = list(itertools.product(_ints(a.learners), _ints(a.actors), _ints(a.slots)))
    for rep in range(a.repeats):
        for learners, actors, slots in grid if rep % 2 == 0 else reversed(grid):
            row = run_one(
                slots=slots,
                actors=actors,
                learners=learners,
                seconds=a.seconds,
                warmup=a.warmup,
                device=a.device,
                extra=extra,
            )
            line = json.dumps(row)
            print(line, flush=True)
            if a.out:
                Path(a.out).parent.mkdir(parents=True, exist_ok=True)
                with open(a.out, "a") as f:
                    f.write(line + "\n")


if __name__ == "__main__":
    main()
