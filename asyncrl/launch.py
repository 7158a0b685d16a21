"""``asyncrl run``: start learner, broadcaster and N actors as separate OS processes on this host,
wire their endpoints, supervise them, and stop them all at the step budget, on Ctrl-C, or when a
role fails (then exit non-zero with that role's error).

Each role is started as its own command (``python -m asyncrl.cli learner ...``), exactly as a
user starts it by hand, so the processes share nothing but the endpoints, the run directory and
the learner's shared-memory segment. No fork after ZeroMQ or torch are initialised: the children
are fresh interpreters.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from .config import Config
from .metrics import write_json_atomic
from .shm import remove_run


BROADCASTER_SUMMARY = "broadcaster-summary.json"


class RoleFailed(RuntimeError):
    """A role exited with an error; the message carries its name and the end of its log.
    ``role``: its name (learner, broadcaster, actor0, ...); ``reason``: one line, why."""

    def __init__(self, role: str, reason: str, tail: str):
        super().__init__(f"{role} {reason}:\n{tail}")
        self.role, self.reason = role, reason


def free_port_pair(host: str = "127.0.0.1") -> int:
    """A port P such that P and P+1 were both free a moment ago (the broadcaster uses both)."""
    for _ in range(100):
        with socket.socket() as a:
            a.bind((host, 0))
            port = a.getsockname()[1]
            if port >= 65535:
                continue
            with socket.socket() as b:
                try:
                    b.bind((host, port + 1))
                except OSError:
                    continue
                return port
    raise RuntimeError("no two consecutive free ports found")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Supervisor:
    def __init__(self, cfg: Config, run_dir: Path, echo):
        self.cfg, self.run_dir, self.echo = cfg, run_dir, echo
        self.run_id = f"{time.strftime('%m%d%H%M%S')}-{secrets.token_hex(3)}"
        self.logs = run_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen] = {}
        self.restarts: dict[str, int] = {}    # role name -> times it was restarted
        self.learner_ep = f"tcp://127.0.0.1:{free_port()}"
        self.broadcaster_ep = f"tcp://127.0.0.1:{free_port_pair()}"

    def start(self, name: str, args: list[str], *, stdout=None) -> None:
        cmd = [sys.executable, "-m", "asyncrl.cli", *args]
        log = open(self.logs / f"{name}.log", "w")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.procs[name] = subprocess.Popen(cmd, stdout=stdout or log, stderr=log, env=env,
                                            stdin=subprocess.DEVNULL)
        log.close()

    def start_all(self) -> None:
        cfg_file = str(self.run_dir / "config.json")
        self.start("broadcaster", ["broadcaster", "--bind", self.broadcaster_ep,
                                   "--summary", str(self.run_dir / BROADCASTER_SUMMARY)])
        tokens = self.run_dir / "tokens"      # per-actor tokens: a replacement proves its id at once
        tokens.mkdir(mode=0o700, exist_ok=True)
        self.start("learner", ["learner", "--config", cfg_file, "--run-dir", str(self.run_dir), "--run-id",
                               self.run_id, "--bind", self.learner_ep, "--broadcaster", self.broadcaster_ep],
                   stdout=sys.stdout)
        for i in range(self.cfg.run.num_actors):
            self.start(f"actor{i}", ["actor", "--config", cfg_file, "--learner", self.learner_ep,
                                     "--broadcaster", self.broadcaster_ep, "--actor-id", f"actor{i}",
                                     "--token-file", str(tokens / f"actor{i}"), *self._straggler(i)])   # seeds: from run.seed, id and restart count

    def _straggler(self, i: int) -> list[str]:
        """actor0 is the straggler of run.straggler_slowdown_s (heterogeneous hosts)."""
        s = self.cfg.run.straggler_slowdown_s
        return ["--slowdown", str(self.cfg.actor.slowdown_s + s)] if i == 0 and s > 0 else []

    def failed(self) -> tuple[str, int] | None:
        for name, p in self.procs.items():
            rc = p.poll()
            if rc not in (None, 0):
                return name, rc
        return None

    def tail(self, name: str, lines: int = 15) -> str:
        text = (self.logs / f"{name}.log").read_text(errors="replace").strip().splitlines()
        return "\n".join(text[-lines:])

    def last_line(self, name: str) -> str:
        lines = [ln for ln in (self.logs / f"{name}.log").read_text(errors="replace").splitlines() if ln.strip()]
        return lines[-1].strip() if lines else "(its log is empty)"

    def role_failed(self, name: str, rc: int) -> RoleFailed:
        return RoleFailed(name, f"exited with status {rc}: {self.last_line(name)}", self.tail(name))

    def supervise(self) -> None:
        while self.procs["learner"].poll() is None:
            bad = self.failed()
            if bad is not None:
                raise self.role_failed(*bad)
            time.sleep(0.2)
        if self.procs["learner"].returncode != 0:
            raise self.role_failed("learner", self.procs["learner"].returncode)

    def record_summary(self, failure: RoleFailed | None) -> None:
        """Add what only the supervisor knows to the learner's summary.json: a failure of any
        role (outcome "failed", the role, why), and the restarts of each role. Writes a summary
        of its own if the learner left none (it was killed)."""
        path = self.run_dir / "summary.json"
        try:
            summary = json.loads(path.read_text())
        except (OSError, ValueError):
            summary = {"outcome": None, "failure": None, "run_id": self.run_id}
        if failure is not None and summary.get("outcome") != "failed":   # keep a learner's own reason
            summary["outcome"], summary["failure"] = "failed", {"role": failure.role, "reason": failure.reason}
        summary["restarts"] = {name: self.restarts.get(name, 0) for name in self.procs}
        try:      # the broadcaster's own counts (its summary file; absent if it never started)
            counts = json.loads((self.run_dir / BROADCASTER_SUMMARY).read_text())
            summary["broadcaster"] = {k: counts.get(k) for k in ("published", "rejected_messages",
                                                                 "refused_connections")}
        except (OSError, ValueError, AttributeError):
            summary["broadcaster"] = None
        rejected = (summary["broadcaster"] or {}).get("rejected_messages")
        if rejected:
            self.echo(f"asyncrl run: the broadcaster rejected messages: {rejected}")
        try:
            write_json_atomic(path, summary)
        except OSError as exc:   # must not hide why the run ended
            self.echo(f"asyncrl run: could not update {path}: {exc}")

    def stop_all(self, grace_s: float = 5.0) -> None:
        """SIGINT to every child still running; SIGKILL to any left after ``grace_s``."""
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        deadline = time.monotonic() + grace_s
        for p in self.procs.values():
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        remove_run(self.run_id)   # a segment of a learner that had to be killed


def launch(cfg: Config, run_dir: Path, *, echo=print) -> dict:
    """Run a whole training job locally; returns the learner's summary. Raises RoleFailed."""
    sup = Supervisor(cfg, run_dir, echo)
    echo(f"run {sup.run_id}: learner {sup.learner_ep}, broadcaster {sup.broadcaster_ep}, "
         f"{cfg.run.num_actors} actors; logs in {sup.logs}")
    failure = None
    try:
        sup.start_all()
        sup.supervise()
        # the learner has told the actors to stop; give them a moment to exit on their own
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(p.poll() is None for n, p in sup.procs.items() if n != "broadcaster"):
            time.sleep(0.1)
    except RoleFailed as exc:
        failure = exc
        raise
    finally:
        sup.stop_all()
        sup.record_summary(failure)
    return json.loads((run_dir / "summary.json").read_text())
