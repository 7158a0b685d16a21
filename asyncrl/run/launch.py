"""``asyncrl run``: start learner, broadcaster and N actors as separate OS processes on this host,
wire their endpoints, supervise them (a dead role is restarted, a dead learner resumes from its
checkpoint), and stop them all at the step budget, on Ctrl-C, or when a role died more often than
``run.max_restarts`` (then exit non-zero with that role's error).

Each role is started as its own command (``python -m asyncrl learner ...``), exactly as a
user starts it by hand, so the processes share nothing but the endpoints, the run directory and
the learner's shared-memory segment. No fork after ZeroMQ or torch are initialised: the children
are fresh interpreters.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from asyncrl.core.config import Config
from asyncrl.core.metrics import write_json_atomic
from asyncrl.core.wording import count_of
from asyncrl.run.pdeathsig import die_with_parent
from asyncrl.tasks import make_task
from asyncrl.tasks.base import WeightsInfo
from asyncrl.wire.shm.dev_shm import SHM_DIR, remove_run

BROADCASTER_SUMMARY = "broadcaster-summary.json"


class RoleFailed(RuntimeError):
    """A role exited with an error; the message carries its name and the end of its log.
    ``role``: its name (learner, broadcaster, actor0, ...); ``reason``: one line, why."""

    def __init__(self, role: str, reason: str, tail: str):
        super().__init__(f"{role} {reason}:\n{tail}")
        self.role, self.reason = role, reason


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LISTEN_PORTS = range(20000, 32768)  # below Linux's default ephemeral range (32768-60999)


def listen_port_candidates(count: int = 200, span: int = 1) -> list[int]:
    """Random ports (P, P+span-1 all inside it) of a range that the kernel never hands out as a
    connect()'s local port. A port from bind(('', 0)) is an ephemeral one: an actor's ZeroMQ
    socket, reconnecting every 100 ms to a learner not yet listening there, can be given that same
    port as its own source port and so connect to itself (TCP simultaneous open), holding the
    port the learner then cannot bind ("Address already in use", on every restart). Falls back to
    the ports above the ephemeral range when the one below is empty.
    ``count``: how many candidates; ``span``: consecutive ports each needs."""
    lo, hi = 32768, 60999
    try:
        lo, hi = (int(x) for x in EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        pass
    ports = (
        [p for p in LISTEN_PORTS if p + span - 1 < lo]
        or list(range(hi + 1, 65536 - span + 1))
        or list(range(1024, 65536 - span + 1))
    )  # no room outside it: any unprivileged port
    rng = random.SystemRandom()
    return [rng.choice(ports) for _ in range(count)]


def _bindable(host: str, ports) -> bool:
    socks = []
    try:
        for port in ports:
            s = socket.socket()
            socks.append(s)
            s.bind((host, port))
        return True
    except OSError:
        return False
    finally:
        for s in socks:
            s.close()


def _free_ports(host: str, span: int) -> int:
    for port in listen_port_candidates(span=span):
        if _bindable(host, range(port, port + span)):
            return port
    raise RuntimeError(f"no {span} consecutive free port(s) found outside the ephemeral range")


def free_port_pair(host: str = "127.0.0.1") -> int:
    """A port P such that P and P+1 were both free a moment ago (the broadcaster uses both), outside
    the ephemeral range (see listen_port_candidates). Raises RuntimeError when none is found."""
    return _free_ports(host, 2)


def free_port(host: str = "127.0.0.1") -> int:
    """A port free a moment ago, outside the ephemeral range (see listen_port_candidates).
    Raises RuntimeError when none is found."""
    return _free_ports(host, 1)


IPC_PATH_MAX = 100  # bytes of an ipc:// socket path (sun_path holds 108 with its NUL; room for ".snapshot")


def private_endpoint_dir() -> Path:
    """A new directory (mode 0700, this user's) for the ipc:// sockets of one local run: no other
    user can connect to its roles, and no other process can take a role's endpoint while the
    role restarts (a loopback TCP port is anyone's to connect to, and free for anyone to bind
    during a restart's backoff). Under $TMPDIR, or /tmp when that path would be too long for a
    socket name. Raises OSError when neither can be made."""
    base = tempfile.gettempdir()
    if len(base) + len("/asyncrl-ep-xxxxxxxx/weights.snapshot") > IPC_PATH_MAX:
        base = "/tmp"
    return Path(tempfile.mkdtemp(prefix=ENDPOINT_DIR_PREFIX, dir=base))


ENDPOINT_DIR_PREFIX = "asyncrl-ep-"


def remove_stale_endpoint_dirs(min_age_s: float = 60.0, *, dry_run: bool = False) -> list[str]:
    """Remove this user's private endpoint directories (:func:`private_endpoint_dir`) that no run
    uses any more: older than ``min_age_s`` (a run that is starting may not have bound yet) and
    without a socket that accepts a connection (those of a supervisor killed by SIGKILL). Returns
    the directories removed (``dry_run``: those it would remove, removing nothing); never raises
    for one it cannot read or remove (skipped)."""
    removed = []
    now = time.time()
    for base in sorted({tempfile.gettempdir(), "/tmp"}):
        for d in sorted(Path(base).glob(f"{ENDPOINT_DIR_PREFIX}*")):
            try:
                st = d.lstat()
                if not d.is_dir() or d.is_symlink() or st.st_uid != os.getuid() or now - st.st_mtime < min_age_s:
                    continue
                if any(_accepts(p) for p in d.iterdir()):
                    continue
                if not dry_run:
                    shutil.rmtree(d)
                removed.append(str(d))
            except OSError:
                continue
    return removed


def _accepts(path: Path) -> bool:
    """True if ``path`` is a Unix socket that a process listens on."""
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(str(path))
            return True
        except OSError:
            return False


def max_weights_args(weights: WeightsInfo) -> list[str]:
    """``asyncrl broadcaster`` flags for a run whose versions carry ``weights``: its largest payload
    (the frame limit, the queues and the memory bound follow from it), in MiB, exact."""
    return ["--max-weights-mb", repr(weights.nbytes / (1 << 20))]


def new_run_id() -> str:
    """A run id: the start time (MMDDhhmmss) and 6 random hex digits."""
    return f"{time.strftime('%m%d%H%M%S')}-{secrets.token_hex(3)}"


class Supervisor:
    """Starts the roles, restarts the ones that die (after ``run.restart_backoff_s`` doubled per
    restart of that role in the last ``run.restart_window_s``; a death after ``run.max_restarts``
    restarts within that window fails the run), and stops them all. A dead actor or
    broadcaster is restarted alone; a dead learner is restarted with ``--restart resume`` (it
    goes on from its newest checkpoint), and the broadcaster and actors are restarted with it
    (their weights and grants belong to the learner that died; these restarts are not counted).
    With learner.num_learners > 1 the learner and its group's members are one unit: the death of
    any of them restarts them all, the learner from its checkpoint.
    Every role gets SIGTERM if the supervisor dies (PR_SET_PDEATHSIG)."""

    def __init__(self, cfg: Config, run_dir: Path, echo, *, resume: bool = False):
        self.cfg, self.run_dir, self.echo, self.resume = cfg, run_dir, echo, resume
        self.run_id = new_run_id()
        self.logs = run_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen] = {}
        self.restarts: dict[str, int] = {}  # role name -> times it was restarted (the whole run)
        self.restarted_at: dict[str, list[float]] = {}  # role name -> monotonic times of its restarts
        self.due: dict[str, float] = {}  # role name -> monotonic time of its pending restart
        self.endpoint_dir = private_endpoint_dir()
        self.learner_ep = f"ipc://{self.endpoint_dir}/learner"
        self.broadcaster_ep = f"ipc://{self.endpoint_dir}/weights"
        self.weights = make_task(cfg).weights_info()  # the broadcaster's limits are sized by it
        # a learner group (learner.num_learners > 1) meets in a fresh file store at each (re)start
        self.members = [f"learner-member{r}" for r in range(1, cfg.learner.num_learners)]
        self.group_starts = 0

    def group_init(self) -> str:
        return f"file://{self.endpoint_dir}/group-{self.group_starts}"

    def role_args(self, name: str) -> list[str]:
        cfg_file = str(self.run_dir / "config.json")
        if name == "broadcaster":
            summary = str(self.run_dir / BROADCASTER_SUMMARY)
            return ["broadcaster", "--bind", self.broadcaster_ep, "--summary", summary, *max_weights_args(self.weights)]
        if name in self.members:
            return [
                "learner-member",
                "--config",
                cfg_file,
                "--rank",
                name[len("learner-member") :],
                "--group",
                self.group_init(),
            ]
        if name == "learner":  # a restarted learner, or the first of a resumed run, resumes
            restart = "resume" if self.resume or self.restarts.get("learner") or self.group_starts else "refuse"
            group = ["--group", self.group_init()] if self.members else []
            return [
                "learner",
                "--config",
                cfg_file,
                "--run-dir",
                str(self.run_dir),
                "--run-id",
                self.run_id,
                "--bind",
                self.learner_ep,
                "--broadcaster",
                self.broadcaster_ep,
                "--restart",
                restart,
                *group,
                "--supervised",
            ]  # its outcome line to its log: `asyncrl run` prints the run's
        i = int(name[len("actor") :])
        return [
            "actor",
            "--config",
            cfg_file,
            "--learner",
            self.learner_ep,
            "--broadcaster",
            self.broadcaster_ep,
            "--actor-id",
            name,
            "--token-file",
            str(self.run_dir / "tokens" / name),
            *self._straggler(i),
        ]  # seeds: from run.seed, id and restart count

    def start(self, name: str) -> None:
        cmd = [sys.executable, "-m", "asyncrl", *self.role_args(name)]
        log = open(self.logs / f"{name}.log", "a" if name in self.procs else "w")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.procs[name] = subprocess.Popen(
            cmd,
            stdout=sys.stdout if name == "learner" else log,
            stderr=log,
            env=env,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent(),
        )
        log.close()

    def names(self) -> list[str]:
        return ["broadcaster", "learner", *self.members, *(f"actor{i}" for i in range(self.cfg.run.num_actors))]

    def start_all(self) -> None:
        tokens = self.run_dir / "tokens"  # per-actor tokens: a replacement proves its id at once
        tokens.mkdir(mode=0o700, exist_ok=True)
        for name in self.names():
            self.start(name)

    def _straggler(self, i: int) -> list[str]:
        """actor0 is the straggler of run.straggler_slowdown_s (heterogeneous hosts)."""
        s = self.cfg.run.straggler_slowdown_s
        return ["--slowdown", str(self.cfg.actor.slowdown_s + s)] if i == 0 and s > 0 else []

    def failed(self) -> tuple[str, int] | None:
        """A role that died: (name, exit status). An actor or learner-group member that exits 0 was told to stop."""
        for name, p in self.procs.items():
            rc = p.poll()
            if name in self.due or rc is None or (rc == 0 and name.startswith(("actor", "learner-member"))):
                continue
            if name == "learner" and rc == 0:
                continue
            return name, rc
        return None

    def tail(self, name: str, lines: int = 15) -> str:
        text = (self.logs / f"{name}.log").read_text(errors="replace").strip().splitlines()
        return "\n".join(text[-lines:])

    def last_line(self, name: str) -> str:
        lines = [ln for ln in (self.logs / f"{name}.log").read_text(errors="replace").splitlines() if ln.strip()]
        return lines[-1].strip() if lines else "(its log is empty)"

    def recent_restarts(self, name: str) -> int:
        """Restarts of ``name`` that count against its budget: those of the last run.restart_window_s
        (all of them when it is 0)."""
        window, now = self.cfg.run.restart_window_s, time.monotonic()
        times = self.restarted_at.get(name, [])
        if window > 0:
            times = self.restarted_at[name] = [t for t in times if now - t < window]
        return len(times)

    def role_failed(self, name: str, rc: int) -> RoleFailed:
        n, limit, window = self.recent_restarts(name), self.cfg.run.max_restarts, self.cfg.run.restart_window_s
        within = f" in the last {window:g} s" if window > 0 else ""
        budget = f" (restarted {count_of(n, 'time')}{within}, run.max_restarts = {limit})" if n or limit else ""
        if rc == -signal.SIGBUS:  # a page of the shared-memory ring could not be backed
            why = (
                f"exited with status {rc}{budget}: shared-memory failure (SIGBUS): {SHM_DIR} full, or the "
                f"segment removed or truncated under it (see `df {SHM_DIR}`)"
            )
            return RoleFailed(name, why, self.tail(name))
        return RoleFailed(name, f"exited with status {rc}{budget}: {self.last_line(name)}", self.tail(name))

    def schedule_restart(self, name: str, rc: int) -> None:
        """Restart ``name`` after its backoff; raise RoleFailed once its restarts are spent."""
        n = self.recent_restarts(name)
        if n >= self.cfg.run.max_restarts:
            raise self.role_failed(name, rc)
        delay = self.cfg.run.restart_backoff_s * 2**n
        self.restarts[name] = self.restarts.get(name, 0) + 1
        self.restarted_at.setdefault(name, []).append(time.monotonic())
        window = self.cfg.run.restart_window_s
        within = f" within {window:g} s," if window > 0 else ""
        self.echo(
            f"asyncrl run: {name} exited with status {rc} ({self.last_line(name)}); restart {n + 1} of "
            f"{self.cfg.run.max_restarts}{within} in {delay:.1f} s"
        )
        if name == "learner" or name in self.members:
            # the others worked for the learner (group) that died: they start again with it, the group in a
            # fresh store, the learner from its checkpoint
            others = [other for other in self.procs if other != name]
            self.stop(others)
            self.due.update({other: time.monotonic() + delay for other in others})
            self.group_starts += 1
        self.due[name] = time.monotonic() + delay

    def start_due(self) -> None:
        now = time.monotonic()
        for name in [n for n in self.names() if n in self.due and self.due[n] <= now]:
            del self.due[name]
            self.start(name)

    def supervise(self) -> None:
        """Until the learner exits 0: restart dead roles. Raises RoleFailed past a role's budget."""
        while self.procs["learner"].poll() != 0 or "learner" in self.due:
            bad = self.failed()
            if bad is not None:
                self.schedule_restart(*bad)
            self.start_due()
            time.sleep(0.2)

    def record_summary(self, failure: RoleFailed | None) -> None:
        """Add what only the supervisor knows to the learner's summary.json: a failure of any
        role (outcome "failed", the role, why), and the restarts of each role. Writes a summary
        of its own if the learner left none (it was killed)."""
        path = self.run_dir / "summary.json"
        try:
            summary = json.loads(path.read_text())
        except (OSError, ValueError):
            summary = {"outcome": None, "failure": None, "run_id": self.run_id}
        if failure is not None and summary.get("outcome") != "failed":  # keep a learner's own reason
            summary["outcome"], summary["failure"] = "failed", {"role": failure.role, "reason": failure.reason}
        summary["restarts"] = {name: self.restarts.get(name, 0) for name in self.names()}
        try:  # the broadcaster's own counts (its summary file; absent if it never started)
            counts = json.loads((self.run_dir / BROADCASTER_SUMMARY).read_text())
            summary["broadcaster"] = {
                k: counts.get(k) for k in ("published", "version_pings", "rejected_messages", "refused_connections")
            }
        except (OSError, ValueError, AttributeError):
            summary["broadcaster"] = None
        rejected = (summary["broadcaster"] or {}).get("rejected_messages")
        if rejected:
            self.echo(f"asyncrl run: the broadcaster rejected messages: {rejected}")
        try:
            write_json_atomic(path, summary)
        except OSError as exc:  # must not hide why the run ended
            self.echo(
                f"asyncrl run: {exc}" if str(path) in str(exc) else f"asyncrl run: could not update {path}: {exc}"
            )

    def stop(self, names=None, grace_s: float = 5.0) -> None:
        """SIGINT to the roles ``names`` (default: all) still running; SIGKILL to any left after ``grace_s``."""
        procs = [self.procs[n] for n in (self.procs if names is None else list(names))]
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        deadline = time.monotonic() + grace_s
        for p in procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def stop_all(self, grace_s: float = 5.0) -> None:
        """Stop every role (as :meth:`stop`), then remove the run's shared memory and its private
        endpoint directory. A SIGINT / SIGTERM that arrives meanwhile (e.g. a study stopping just as the
        run ends) kills the roles still running, and the segment and directory are removed all the same."""
        try:
            self.stop(grace_s=grace_s)
        except KeyboardInterrupt:
            for p in self.procs.values():
                if p.poll() is None:
                    p.kill()
                    p.wait()
            raise
        finally:
            remove_run(self.run_id)  # a segment of a learner that had to be killed
            shutil.rmtree(self.endpoint_dir, ignore_errors=True)


def launch(cfg: Config, run_dir: Path, *, echo=print, resume: bool = False) -> dict:
    """Run a whole training job locally; returns the learner's summary. ``resume``: the learner
    goes on from the run directory's checkpoint. Raises RoleFailed (a role died more often than
    run.max_restarts)."""
    sup = Supervisor(cfg, run_dir, echo, resume=resume)
    echo(
        f"run {sup.run_id}: learner {sup.learner_ep}, broadcaster {sup.broadcaster_ep}, "
        f"{count_of(cfg.run.num_actors, 'actor')}; logs in {sup.logs}"
    )
    echo(f"weights: {sup.weights.nbytes / (1 << 20):.2f} MiB per version ({sup.weights.describe()})")
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
        try:
            sup.stop_all()
        finally:
            sup.record_summary(failure)
    return json.loads((run_dir / "summary.json").read_text())
