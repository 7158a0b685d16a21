"""Ray-launched against hand-launched (root only): env steps/s the learner consumes when
`asyncrl run --launcher ray` places the roles on a three-node Ray cluster, against the same roles
started by hand in the same network namespaces; same machine, same benchmark run, runs alternated
(ray, hand, hand, ray, ...) so background load hits both alike. Also Ray's own CPU use in each Ray
run: the CPU seconds of every process of the three Ray nodes that is not a role (GCS, raylets, the
idle Ray workers that hold the roles, the object store, agents) plus the driver.

    sudo .venv/bin/python bench/ray_vs_hand.py --pairs 3 --steps 300000

Three namespaces as in tests/integration/test_netns.py (L 10.77.0.1: learner and broadcaster; A
10.77.0.2 and B 10.77.0.3: a relay broadcaster and two actors each, each node with a private, empty
/dev/shm, so rollouts from A and B come over TCP with CURVE in both cases). The Ray cluster is
started before and stopped after each Ray run (a hand run has no Ray running). Steady rate: env
steps/s over the second half of the run (metrics.jsonl), so start-up (Ray's placement, imports)
is left out; the whole-run rate is printed beside it. Namespaces and processes are removed at the
end; nothing is left in /dev/shm (each node's is a private tmpfs).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))
from ray_nodes import RayNode, ray_unavailable  # noqa: E402
from tcp_vs_shm import start, stop  # noqa: E402  (bench/ is the script's directory)
from test_netns import Lan, _unavailable  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
PRIVATE_SHM = 'mount -t tmpfs tmpfs /dev/shm && exec "$@"'


def rates(run_dir: Path) -> dict:
    """Steady and whole-run env steps/s and lag of a finished run (summary.json, metrics.jsonl)."""
    s = json.loads((run_dir / "summary.json").read_text())
    rows = [
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if line.strip() and "env_steps" in line
    ]
    rows = [r for r in rows if "wall_time_s" in r]
    a, b = rows[len(rows) // 2], rows[-1]
    steady = (b["env_steps"] - a["env_steps"]) / max(b["wall_time_s"] - a["wall_time_s"], 1e-9)
    return {
        "steady": steady,
        "whole": s["env_steps_per_s"],
        "lag_p50": s.get("lag_p50"),
        "lag_p95": s.get("lag_p95"),
        "transport": s.get("rollouts_by_transport"),
        "return": s.get("final_average_return"),
    }


class CpuMeter:
    """CPU seconds of the processes under some roots, except role processes (``asyncrl.cli`` roles)
    and their children: sampled every 0.5 s; each pid counts from its first sample to its last."""

    ROLES = (b" learner ", b" actor ", b" broadcaster ")

    def __init__(self, roots: list[int]):
        self.roots, self.first, self.last = roots, {}, {}

    @staticmethod
    def _children() -> dict[int, list[int]]:
        kids: dict[int, list[int]] = {}
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    continue
                kids.setdefault(ppid, []).append(int(d.name))
        return kids

    def sample(self) -> None:
        kids, todo = self._children(), list(self.roots)
        while todo:
            pid = todo.pop()
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if b"asyncrl.cli" in cmd and any(r in cmd for r in self.ROLES):
                continue  # a role: not Ray's; its children neither
            t = (int(fields[11]) + int(fields[12])) / TICKS
            self.first.setdefault(pid, t)
            self.last[pid] = t
            todo.extend(kids.get(pid, []))

    def seconds(self) -> float:
        return sum(self.last[p] - self.first[p] for p in self.last)


def ray_run(args, lan: Lan, out: Path, i: int) -> dict:
    tag = secrets.token_hex(3)
    private = Path(f"/tmp/arl-rb-{tag}")
    logs = out / f"ray{i}"
    logs.mkdir()
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    nodes: dict[str, RayNode] = {}
    driver = None
    try:
        nodes["L"] = RayNode(lan, "L", private, None, logs, auth)
        wait(lambda: b"Ray runtime started" in (logs / "ray-L.log").read_bytes(), 180, "the Ray head")
        for r in ("A", "B"):
            nodes[r] = RayNode(lan, r, private, lan.ip["L"], logs, auth)
        for r in ("A", "B"):
            wait(lambda r=r: b"Ray runtime started" in (logs / f"ray-{r}.log").read_bytes(), 180, f"Ray node {r}")
        time.sleep(3)
        run_dir = private / "run"  # on the head's private tmpfs
        sets = sum((["--set", s] for s in args.set), [])
        meter = CpuMeter([n.proc.pid for n in nodes.values()])
        driver = start(
            [
                *nodes["L"].enter(),
                sys.executable,
                "-m",
                "asyncrl.cli",
                "run",
                "--launcher",
                "ray",
                "--address",
                f"{lan.ip['L']}:6379",
                "--env",
                args.env,
                "--num-actors",
                "4",
                "--total-steps",
                str(args.steps),
                "--run-dir",
                str(run_dir),
                "--set",
                "run.log_every_s=1000",
                *sets,
            ],
            logs / "driver.log",
            env={**auth, "RAY_USAGE_STATS_ENABLED": "0"},
        )
        meter.roots.append(driver.pid)
        t0 = time.monotonic()
        while driver.poll() is None:
            meter.sample()
            if time.monotonic() - t0 > args.timeout:
                raise RuntimeError(f"ray run {i}: no end within {args.timeout} s")
            time.sleep(0.5)
        if driver.returncode != 0:
            raise RuntimeError(f"ray run {i} failed:\n{(logs / 'driver.log').read_text()[-3000:]}")
        wall = time.monotonic() - t0
        local = logs / "run"
        subprocess.run([*nodes["L"].enter(), "cp", "-r", str(run_dir), str(local)], check=True, timeout=60)
        r = rates(local)
        r.update(ray_cpu_s=meter.seconds(), wall_s=wall)
        return r
    finally:
        if driver is not None and driver.poll() is None:
            driver.kill()
            driver.wait()
        for node in reversed(list(nodes.values())):
            node.stop()
        shutil.rmtree(private, ignore_errors=True)


def hand_run(args, lan: Lan, keys: Path, out: Path, i: int) -> dict:
    run_dir = out / f"hand{i}"
    run_dir.mkdir()
    py = [sys.executable, "-m", "asyncrl.cli"]
    learner_ep, bcast_ep = f"tcp://{lan.ip['L']}:5555", f"tcp://{lan.ip['L']}:5556"
    sets = sum((["--set", s] for s in args.set), [])
    procs = []
    try:
        for role, client in (("A", "client-1"), ("B", "client-2")):
            at = ["ip", "netns", "exec", lan.ns[role], "unshare", "--mount", "sh", "-c", PRIVATE_SHM, "sh"]
            procs.append(
                start(
                    [
                        *at,
                        *py,
                        "broadcaster",
                        "--upstream",
                        bcast_ep,
                        "--bind",
                        "tcp://127.0.0.1:5556",
                        "--keys",
                        str(keys / client),
                    ],
                    run_dir / f"relay{role}.log",
                )
            )
            for k in range(2):
                name = f"actor{role}{k}"
                procs.append(
                    start(
                        [
                            *at,
                            *py,
                            "actor",
                            "--learner",
                            learner_ep,
                            "--broadcaster",
                            "tcp://127.0.0.1:5556",
                            "--keys",
                            str(keys / client),
                            "--actor-id",
                            name,
                            "--host-label",
                            lan.ip[role],
                            "--env",
                            args.env,
                            *sets,
                        ],
                        run_dir / f"{name}.log",
                    )
                )
        at_l = ["ip", "netns", "exec", lan.ns["L"]]
        procs.append(
            start(
                [*at_l, *py, "broadcaster", "--bind", bcast_ep, "--keys", str(keys / "server")],
                run_dir / "broadcaster.log",
            )
        )
        learner = start(
            [
                *at_l,
                *py,
                "learner",
                "--bind",
                learner_ep,
                "--broadcaster",
                bcast_ep,
                "--keys",
                str(keys / "server"),
                "--env",
                args.env,
                "--total-steps",
                str(args.steps),
                "--run-dir",
                str(run_dir),
                "--set",
                "run.log_every_s=1000",
                *sets,
            ],
            run_dir / "learner.log",
        )
        procs.append(learner)
        t0 = time.monotonic()
        if learner.wait(args.timeout) != 0:
            raise RuntimeError(f"hand run {i}: learner failed:\n{(run_dir / 'learner.log').read_text()[-2000:]}")
        r = rates(run_dir)
        r.update(ray_cpu_s=0.0, wall_s=time.monotonic() - t0)
        return r
    finally:
        stop(procs)


def wait(cond, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.5)
    raise RuntimeError(f"timed out waiting for {what}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=3, help="Ray runs and hand runs, alternated (default 3 each).")
    ap.add_argument("--steps", type=int, default=300_000, help="Env steps per run.")
    ap.add_argument("--env", default="HalfCheetah-v5")
    ap.add_argument("--set", action="append", default=[], help="Config overrides for every role of every run.")
    ap.add_argument("--timeout", type=float, default=900.0, help="Seconds per run before it counts as failed.")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "ray_vs_hand")
    args = ap.parse_args()
    reason = _unavailable() or ray_unavailable() or (None if shutil.which("nsenter") else "nsenter is missing")
    if reason:
        sys.exit(f"bench/ray_vs_hand.py: {reason}")
    out = args.out / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True)
    keys = out / "keys"
    subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "keys", "generate", str(keys), "--clients", "2"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    lan = Lan()
    results: dict[str, list[dict]] = {"ray": [], "hand": []}
    load0 = os.getloadavg()[0]
    try:
        lan.up()
        for i in range(args.pairs):
            for kind in ("ray", "hand") if i % 2 == 0 else ("hand", "ray"):
                r = ray_run(args, lan, out, i) if kind == "ray" else hand_run(args, lan, keys, out, i)
                results[kind].append(r)
                print(
                    f"{kind} run {i}: {r['steady']:,.0f} env steps/s after start-up ({r['whole']:,.0f} whole run, "
                    f"{r['wall_s']:.0f} s); lag p50/p95 {r['lag_p50']}/{r['lag_p95']} versions; rollouts "
                    f"{r['transport']}; Ray CPU {r['ray_cpu_s']:.1f} s",
                    flush=True,
                )
    finally:
        lan.close()
        shutil.rmtree(keys, ignore_errors=True)
    med = {k: statistics.median(r["steady"] for r in v) for k, v in results.items()}
    ratios = [a["steady"] / b["steady"] for a, b in zip(results["ray"], results["hand"])]
    cpu = [r["ray_cpu_s"] / r["wall_s"] for r in results["ray"]]
    summary = {
        "pairs": args.pairs,
        "steps": args.steps,
        "env": args.env,
        "set": args.set,
        "median_steady_env_steps_per_s": med,
        "ratio_ray_over_hand_per_pair": ratios,
        "median_ratio": statistics.median(ratios),
        "ray_cpu_cores_median": statistics.median(cpu),
        "runs": results,
        "load_start": load0,
        "load_end": os.getloadavg()[0],
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (args.out / "results.json").write_text(json.dumps(summary, indent=1) + "\n")  # the latest run's, kept in git
    print(
        f"median env steps/s after start-up: ray {med['ray']:,.0f}, hand {med['hand']:,.0f}; ray/hand per pair "
        f"{', '.join(f'{x:.3f}' for x in ratios)} (median {summary['median_ratio']:.3f}); Ray's own CPU "
        f"{statistics.median(cpu):.2f} cores (median over Ray runs; CPU s / wall s); load {load0:.1f} -> "
        f"{summary['load_end']:.1f}; {out / 'summary.json'}"
    )


if __name__ == "__main__":
    main()
