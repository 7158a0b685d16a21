"""One role's process on one Ray node (``asyncrl run --launcher ray``): ``RoleHost``, the Ray actor
that writes the role's keys and config into its private 0700 directory on the node
(``node_workdir``), starts ``python -m asyncrl ROLE ...`` as its child (dying with it, so Ray
restarts both; a learner Ray restarted resumes), and stops it, reads its files and cleans up; and
``pick_ports``, the Ray task that finds a node's IP and free ports.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from asyncrl.run.launch import free_port, free_port_pair
from asyncrl.run.pdeathsig import die_with_parent


def node_workdir(run_id: str, name: str) -> Path:
    """The private directory of role ``name`` of run ``run_id`` on its node (0700): its keys, config
    copy, token file and log. The same path after a restart, so a restarted actor keeps its token."""
    root = Path(tempfile.gettempdir()) / f"asyncrl-ray-{run_id}"
    root.mkdir(mode=0o700, exist_ok=True)
    d = root / name
    d.mkdir(mode=0o700, exist_ok=True)
    return d


class RoleHost:
    """One role's process on one node; a Ray actor (made with ``ray.remote`` in :func:`launch_ray`).

    ``argv``: the role's ``asyncrl`` arguments, where ``{dir}`` stands for this role's private
    directory. ``files``: {path relative to that directory: bytes} written there first (mode 0600).
    ``run_files``: {absolute path: bytes} written only where missing (the learner's config.json on
    its node). A learner started again by Ray resumes (``--restart resume``)."""

    def __init__(
        self,
        name: str,
        run_id: str,
        argv: list[str],
        files: dict[str, bytes],
        run_files: dict[str, bytes] | None = None,
    ):
        import ray

        self.name, self.dir = name, node_workdir(run_id, name)
        for rel, data in files.items():
            path = self.dir / rel
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        for path, data in (run_files or {}).items():
            p = Path(path)
            if not p.exists():
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(data)
        argv = [a.replace("{dir}", str(self.dir)) for a in argv]
        counter = self.dir / "starts"  # on this node's disk: how often Ray started this role
        self.starts = (int(counter.read_text()) if counter.exists() else 0) + 1
        counter.write_text(str(self.starts))
        if (
            ray.get_runtime_context().was_current_actor_reconstructed and "--restart" in argv
        ):  # Ray restarted the learner: go on from its checkpoint
            argv[argv.index("--restart") + 1] = "resume"
        self.stopping = False
        log = open(self.dir / "role.log", "a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "asyncrl", *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
            preexec_fn=die_with_parent(),
        )
        log.close()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> int:
        rc = self.proc.wait()
        if rc != 0 and not self.stopping:
            os._exit(1)  # the Ray actor dies with its role, so Ray restarts both
        return rc

    def wait(self) -> int:
        """The role's exit status once it exits: 0, or any status after :meth:`stop`. A role that
        dies on its own never returns one: its Ray actor exits first (the call fails)."""
        return self._watch()

    def restarts(self) -> int:
        """How often Ray started this role again (the count lives on this node's disk)."""
        return self.starts - 1

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGINT to the role (it writes its summary and checkpoint), SIGKILL after ``grace_s``."""
        self.stopping = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()

    def read(self, path: str) -> bytes | None:
        """A file of this node (relative paths: in the role's directory); None if it cannot be read."""
        p = Path(path) if os.path.isabs(path) else self.dir / path
        try:
            return p.read_bytes()
        except OSError:
            return None

    def cleanup(self) -> None:
        """Remove this role's private directory (its keys among it), and the run's once empty."""
        shutil.rmtree(self.dir, ignore_errors=True)
        try:
            self.dir.parent.rmdir()
        except OSError:
            pass


def pick_ports() -> dict:
    """On the node it runs on (a Ray task): its IP, a free port (a learner's) and a free pair (a
    broadcaster's)."""
    import ray

    return {"ip": ray.util.get_node_ip_address(), "port": free_port("0.0.0.0"), "pair": free_port_pair("0.0.0.0")}
