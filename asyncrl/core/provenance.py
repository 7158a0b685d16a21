"""Where a run came from: the code commit, the versions of the main packages and the machine.
Recorded under ``"provenance"`` in a run's config.json and summary.json, so every figure can be
traced to the code and the load it was measured under."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

# The packages whose versions change results or speed.
PACKAGES = ("asyncrl", "torch", "numpy", "gymnasium", "mujoco", "pyzmq", "msgpack", "click")


def code_commit() -> dict:
    """{"commit": 40 hex digits or None, "dirty": bool or None} of the git checkout holding this
    package (None where it is not a git checkout, or git is missing)."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if commit.returncode != 0:
            return {"commit": None, "dirty": None}
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {"commit": None, "dirty": None}
    return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip()) if status.returncode == 0 else None}


def package_versions() -> dict[str, str | None]:
    """Installed version of each of :data:`PACKAGES` (None when not installed)."""
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def cpu_model() -> str | None:
    """The CPU's model name from /proc/cpuinfo (Linux), else platform.processor(), else None. Serial
    runs are bit-reproducible on one CPU model but not across models (float reductions differ)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def machine() -> dict:
    """Host name, platform, CPU model, Python, CPU cores (all, and usable by this process) and the
    1/5/15-minute load averages at the time of the call."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count()
    load = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "usable_cores": usable,
        "load_average_1_5_15": load,
    }


def provenance() -> dict:
    """{"code": code_commit(), "packages": package_versions(), "machine": machine()}."""
    return {"code": code_commit(), "packages": package_versions(), "machine": machine()}
