"""Remote actors against local ones (root only): env steps/s consumed by the learner with 2 actors in
another network namespace, shipping their rollouts over TCP, against 2 actors on the learner's
host writing into its shared memory; same machine, same benchmark run, runs interleaved (shm,
tcp, shm, tcp, ...) so background load hits both alike. Prints the median of each and their ratio.

    sudo .venv/bin/python bench/tcp_vs_shm.py --runs 3 --steps 30000

Two namespaces joined by a veth pair, 10.77.0.1 (learner host: learner, broadcaster, and the local
actors) and 10.77.0.2 (the remote actors, each with an empty private /dev/shm, so the learner's
segment is out of reach as on another machine). Every socket is on a 10.77.0.x address, so CURVE
is on in both cases (control messages, weights, and for the remote actors the rollouts); only
where the rollouts travel differs. Namespaces and processes are removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from asyncrl.run.pdeathsig import sigint_as_in_a_terminal

LEARNER_IP, REMOTE_IP = "10.77.0.1", "10.77.0.2"
EMPTY_SHM = ["unshare", "--mount", "sh", "-c", 'mount -t tmpfs tmpfs /dev/shm && exec "$@"', "sh"]


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


class Namespaces:
    def __init__(self):
        tag = secrets.token_hex(3)
        self.host, self.remote = f"arl-bench-{tag}-l", f"arl-bench-{tag}-r"

    def __enter__(self):
        ip("netns", "add", self.host)
        try:
            ip("netns", "add", self.remote)
            for ns in (self.host, self.remote):
                ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", self.host, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", self.remote)
            for ns, addr in ((self.host, LEARNER_IP), (self.remote, REMOTE_IP)):
                ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
                ip("-n", ns, "link", "set", "eth0", "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        for ns in (self.remote, self.host):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)


def start(cmd: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    """A role process logging to ``log`` (also bench/ray_vs_hand.py's); ``env`` adds variables."""
    with open(log, "w") as f:
        return subprocess.Popen(
            cmd,
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **(env or {})),
            preexec_fn=sigint_as_in_a_terminal,
        )


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 10
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def one_run(args, ns: Namespaces, keys: Path, out: Path, mode: str, i: int) -> tuple[float, float]:
    """One training run; returns the learner's env steps/s over the whole run (summary.json) and
    after its first two learner iterations (start-up excluded, from metrics.jsonl). mode: "shm"
    (actors on the learner's host) or "tcp" (actors in the other namespace)."""
    run_dir = out / f"{mode}{i}"
    run_dir.mkdir()
    py = [sys.executable, "-m", "asyncrl"]
    at_host = ["ip", "netns", "exec", ns.host]
    learner_ep, broadcaster_ep = f"tcp://{LEARNER_IP}:5555", f"tcp://{LEARNER_IP}:5556"
    sets = sum((["--set", s] for s in args.set), [])
    procs = []
    try:
        actor_prefix = at_host if mode == "shm" else ["ip", "netns", "exec", ns.remote, *EMPTY_SHM]
        for k in range(2):
            procs.append(
                start(
                    [
                        *actor_prefix,
                        *py,
                        "actor",
                        "--learner",
                        learner_ep,
                        "--broadcaster",
                        broadcaster_ep,
                        "--keys",
                        str(keys / "client-1"),
                        "--actor-id",
                        f"{mode}{k}",
                        "--seed",
                        str(k + 1),
                        "--env",
                        args.env,
                        *sets,
                    ],
                    run_dir / f"actor{k}.log",
                )
            )
        procs.append(
            start(
                [*at_host, *py, "broadcaster", "--bind", broadcaster_ep, "--keys", str(keys / "server")],
                run_dir / "broadcaster.log",
            )
        )
        learner = start(
            [
                *at_host,
                *py,
                "learner",
                "--bind",
                learner_ep,
                "--broadcaster",
                broadcaster_ep,
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
        if learner.wait(args.timeout) != 0:
            raise RuntimeError(f"{mode} run {i}: learner failed:\n{(run_dir / 'learner.log').read_text()[-2000:]}")
    finally:
        stop(procs)
    s = json.loads((run_dir / "summary.json").read_text())
    transport = s.get("rollouts_by_transport", {})
    if set(transport) != {mode}:
        raise RuntimeError(f"{mode} run {i}: rollouts arrived by {transport}, expected {mode} only")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    a, b = rows[min(2, len(rows) - 2)], rows[-1]
    steady = (b["env_steps"] - a["env_steps"]) / max(b["wall_time_s"] - a["wall_time_s"], 1e-9)
    share = s["time_breakdown_s"].get("learner_update_s", 0.0) / s["wall_time_s"]
    print(
        f"{mode} run {i}: {s['env_steps_per_s']:,.0f} env steps/s ({s['env_steps']:,} steps in "
        f"{s['wall_time_s']:.1f} s); after start-up {steady:,.0f}/s; learner updating {share:.0%} of the time",
        flush=True,
    )
    return s["env_steps_per_s"], steady


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="HalfCheetah-v5")
    p.add_argument("--runs", type=int, default=3, help="runs of each kind")
    p.add_argument("--steps", type=int, default=30_000, help="env-step budget of each run")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds one run may take")
    p.add_argument("--set", action="append", default=[], help="config override for every role of every run")
    p.add_argument("--out", default=None, help="directory for the runs (default: a temporary one)")
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/tcp_vs_shm.py needs root (it creates network namespaces)")
    out = Path(args.out or tempfile.mkdtemp(prefix="asyncrl-tcp-vs-shm-"))
    out.mkdir(parents=True, exist_ok=True)
    keys = out / "keys"
    subprocess.run([sys.executable, "-m", "asyncrl", "keys", "generate", str(keys)], check=True, capture_output=True)
    rates: dict[str, list[tuple[float, float]]] = {"shm": [], "tcp": []}
    with Namespaces() as ns:
        for i in range(args.runs):
            for mode in ("shm", "tcp"):
                rates[mode].append(one_run(args, ns, keys, out, mode, i))
    print(
        f"{args.env}, 2 actors, {args.runs} runs each of {args.steps:,} env steps (outputs in {out}); "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs:"
    )
    for k, what in ((0, "whole run"), (1, "after start-up")):
        med = {m: statistics.median(r[k] for r in rs) for m, rs in rates.items()}
        for m, label in (("shm", "local actors, shared memory"), ("tcp", "remote actors, TCP + CURVE")):
            print(
                f"  {what:<15} {label:<30} median {med[m]:>8,.0f} env steps/s  (runs: "
                f"{', '.join(f'{r[k]:,.0f}' for r in rates[m])})"
            )
        print(f"  {what:<15} ratio tcp / shm: {med['tcp'] / med['shm']:.3f}")


if __name__ == "__main__":
    main()
