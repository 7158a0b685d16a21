"""Resources: /dev/shm too small for the ring, a SIGBUS in a role, a run
directory that fills up mid-run, and a legal config whose reports carry the most episodes.

Every process goes through the ``procs`` fixture (conftest.py): only those pids are stopped, and no
/dev/shm segment of the test's run ids may be left. The tests that need a small /dev/shm or a full
run directory run ``asyncrl run`` in a private mount namespace (``unshare -m``) with a small tmpfs
there, so they need root; they are skipped otherwise. No assertion on timing or log-line counts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mp_helpers import SMALL, read_jsonl, shm_segments, wait_for
from test_multiprocess import CORRIDOR, RUN_LINE

pytestmark = pytest.mark.integration


def _can_unshare() -> str | None:
    """Why a private mount namespace cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root for a private mount namespace (unshare -m) with a small tmpfs"
    if shutil.which("unshare") is None:
        return "needs unshare (util-linux)"
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True, timeout=10)
    return None if probe.returncode == 0 else f"unshare -m failed: {probe.stderr.decode(errors='replace').strip()}"


needs_mount_ns = pytest.mark.skipif(_can_unshare() is not None, reason=str(_can_unshare()))


def in_private_mounts(script: str, *args: str) -> list[str]:
    """A ``Procs.start`` prefix: run ``script`` (sh, with ``args`` as $1...) in a private mount
    namespace, then the role command as "$@" after them (see the scripts below)."""
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *args]


# ----------------------------------------------------------------------------- /dev/shm


@needs_mount_ns
@pytest.mark.timeout(120)
def test_dev_shm_too_small_is_one_clear_line(procs, tmp_path):
    """/dev/shm of 1 MiB, a ring of ~40 MiB: `asyncrl run` ends non-zero with one line giving the
    bytes needed and free and how to fix it; nothing dies of SIGBUS and nothing is left in /dev/shm."""
    listing = tmp_path / "shm-after.txt"
    script = (
        'listing=$1; shift; mount -t tmpfs -o size=1m tmpfs /dev/shm || exit 90; "$@"; rc=$?; '
        'ls -A /dev/shm > "$listing"; exit $rc'
    )
    procs.start(
        "run",
        [
            "run",
            "--env",
            CORRIDOR,
            "--num-actors",
            "1",
            "--total-steps",
            "100000",
            "--run-dir",
            str(tmp_path / "run"),
            *SMALL,
            "--set",
            "learner.num_slots=40",
            "--set",
            "env.num_envs=64",
            "--set",
            "env.rollout_length=256",
        ],
        expect_failure=True,
        prefix=in_private_mounts(script, str(listing)),
    )
    rc = procs.wait("run", 90)
    err = procs.err("run") + procs.out("run")
    assert rc not in (0, 90), procs.dump()
    assert "shared memory: the slot ring needs" in err and "/dev/shm has" in err, procs.dump()
    assert "free space there" in err, procs.dump()
    assert "SIGBUS" not in err and "status -7" not in err and "Traceback" not in err, procs.dump()
    assert listing.exists() and listing.read_text().strip() == "", listing.read_text() if listing.exists() else ""
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # nothing of a run: the same directory can be reused


@pytest.mark.timeout(150)
def test_sigbus_in_a_role_is_reported_as_a_shared_memory_failure(procs, tmp_path):
    """The ring's segment truncated under a running `asyncrl run` (what a /dev/shm that cannot back
    a page does): the role that touches it dies of SIGBUS, and the run's error says shared memory."""
    run_dir = tmp_path / "run"
    procs.start(
        "run",
        [
            "run",
            "--env",
            CORRIDOR,
            "--num-actors",
            "1",
            "--total-steps",
            "100000000",
            "--run-dir",
            str(run_dir),
            *SMALL,
            "--set",
            "run.max_restarts=0",
        ],  # no restart: report at once
        expect_failure=True,
    )
    run_id = wait_for(lambda: RUN_LINE.search(procs.out("run")), 60, "the run line", procs=procs).group(1)
    procs.run_ids.add(run_id)
    wait_for(lambda: len(read_jsonl(run_dir / "metrics.jsonl")) >= 1, 90, "a learner iteration", procs=procs)
    (segment,) = shm_segments(run_id)
    os.truncate(os.path.join("/dev/shm", segment), 0)
    assert procs.wait("run", 60) != 0, procs.dump()
    err = procs.err("run")
    assert "shared-memory failure (SIGBUS)" in err, procs.dump()
    assert "exited with status -7" in err, procs.dump()


# ----------------------------------------------------------------------------- run directory

FILL = """
import os, sys
path = sys.argv[1]
with open(path, "wb", buffering=0) as f:
    for chunk in (1 << 20, 1 << 16, 1 << 12, 1 << 8, 1):
        try:
            while True:
                f.write(b"\\0" * chunk)
        except OSError:
            pass
"""


@needs_mount_ns
@pytest.mark.timeout(180)
def test_run_dir_full_mid_run(procs, tmp_path):
    """The run directory (a 16 MiB tmpfs) filled up while `asyncrl run` trains, checkpointing every
    iteration: the run ends with one line naming the file and "No space left on device", no
    traceback; the last good checkpoint loads and every JSONL line parses."""
    run_dir, saved = tmp_path / "run", tmp_path / "saved"
    run_dir.mkdir()
    saved.mkdir()
    # the logs get a tmpfs of their own, so the roles' error lines survive the full run directory
    script = (
        'd=$1; out=$2; shift 2; mount -t tmpfs -o size=16m tmpfs "$d" && mkdir "$d/logs" && '
        'mount -t tmpfs -o size=4m tmpfs "$d/logs" || exit 90; "$@"; rc=$?; '
        "for f in checkpoint.pt metrics.jsonl lag.jsonl lag_histograms.jsonl summary.json; do "
        '[ -e "$d/$f" ] && cp "$d/$f" "$out/"; done; cp -r "$d/logs" "$out/"; exit $rc'
    )
    procs.start(
        "run",
        [
            "run",
            "--env",
            CORRIDOR,
            "--num-actors",
            "1",
            "--total-steps",
            "100000000",
            "--run-dir",
            str(run_dir),
            *SMALL,
            "--set",
            "learner.checkpoint_every=1",
        ],
        expect_failure=True,
        prefix=in_private_mounts(script, str(run_dir), str(saved)),
    )
    sh_pid = procs.popen["run"].pid
    inside = Path(f"/proc/{sh_pid}/root") / str(run_dir).lstrip("/")  # the run dir as the run sees it
    wait_for(
        lambda: (inside / "checkpoint.pt").exists() and len(read_jsonl(inside / "metrics.jsonl")) >= 2,
        90,
        "two iterations and a checkpoint",
        procs=procs,
    )
    subprocess.run([sys.executable, "-c", FILL, str(inside / "filler")], timeout=60, check=True)
    rc = procs.wait("run", 90)
    assert rc not in (0, 90), procs.dump()
    out = procs.out("run") + procs.err("run")
    assert "cannot write" in out and "No space left on device" in out, procs.dump()
    logs = "".join(p.read_text(errors="replace") for p in (saved / "logs").glob("*.log"))
    assert "Traceback" not in logs and "Traceback" not in out, logs[-3000:]
    state = torch.load(saved / "checkpoint.pt", weights_only=True)  # the last good one: whole
    assert state["iteration"] >= 1
    for name in ("metrics.jsonl", "lag.jsonl"):
        text = (saved / name).read_text()
        assert text.endswith("\n"), f"{name} ends in half a line"
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]  # every line parses
        assert rows, name


# ----------------------------------------------------------------------------- message limits


@pytest.mark.timeout(180)
def test_a_report_of_4096_episodes_fits(procs, tmp_path):
    """64 envs of 1-step episodes, 64-step rollouts: each report carries 4,096 episode returns and
    lengths (over 64 KiB of header). `asyncrl run` trains to its budget, as serial mode does."""
    run_dir = tmp_path / "run"
    total = 64 * 64 * 2 * 2
    procs.start(
        "run",
        [
            "run",
            "--env",
            "asyncrl/OneStep-v0",
            "--num-actors",
            "1",
            "--total-steps",
            str(total),
            "--run-dir",
            str(run_dir),
            *SMALL,
            "--set",
            "env.num_envs=64",
            "--set",
            "env.rollout_length=64",
        ],
    )
    run_id = wait_for(lambda: RUN_LINE.search(procs.out("run")), 60, "the run line", procs=procs).group(1)
    procs.run_ids.add(run_id)
    assert procs.wait("run", 150) == 0, procs.dump()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "finished" and summary["env_steps"] >= total, summary
    assert not summary.get("rejected_messages"), summary
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert rows and len(rows[0]["episode_returns"]) == 64 * 64 * 2, len(rows[0]["episode_returns"]) if rows else rows
