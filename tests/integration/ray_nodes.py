"""A Ray node in a network namespace of test_netns.Lan, with a private /dev/shm and a private
temporary directory (one tmpfs of its own, mounted at the same path on every node): used by
test_ray_multinode.py and bench/ray_vs_hand.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from test_netns import Lan

PRIVATE = 'mount -t tmpfs tmpfs /dev/shm && mount -t tmpfs tmpfs "$ARL_TMP" && mkdir -p "$ARL_TMP/tmp" && exec "$@"'


def ray_unavailable() -> str | None:
    try:
        import ray  # noqa: F401
    except ImportError:
        return "Ray is not installed (pip install -e '.[ray]')"
    return None


class RayNode:
    """One Ray node (``ray start --block``) in a namespace of ``lan``, with its private mounts."""

    def __init__(self, lan: Lan, role: str, tmp: Path, head: str | None, logs: Path, auth: dict):
        self.role, self.tmp = role, tmp
        tmp.mkdir(parents=True, exist_ok=True)
        ray_bin = str(Path(sys.executable).with_name("ray"))
        args = [
            ray_bin,
            "start",
            "--block",
            "--disable-usage-stats",
            "--node-ip-address",
            lan.ip[role],
            "--num-cpus",
            "2",
            "--object-store-memory",
            str(80 * 2**20),
        ]
        # the head's --temp-dir is every node's: the same path, on each node its own private tmpfs
        args += (
            ["--head", "--port", "6379", "--include-dashboard=false", "--temp-dir", str(tmp / "ray")]
            if head is None
            else ["--address", f"{head}:6379"]
        )
        env = dict(
            os.environ,
            **auth,
            ARL_TMP=str(tmp),
            TMPDIR=str(tmp / "tmp"),
            RAY_USAGE_STATS_ENABLED="0",
            OMP_NUM_THREADS="1",
            PYTHONUNBUFFERED="1",
        )
        self.log = open(logs / f"ray-{role}.log", "w")
        self.proc = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                lan.ns[role],
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                PRIVATE,
                "sh",
                *args,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )

    def enter(self) -> list[str]:
        """A prefix that runs a command in this node's network and mount namespaces."""
        return ["nsenter", "-t", str(self.proc.pid), "-n", "-m"]

    def stop(self) -> None:
        """SIGTERM to `ray start --block` (it stops the node's Ray processes), SIGKILL to its group after 20 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()
