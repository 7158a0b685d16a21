"""Helpers for the multi-process integration tests (the ``procs`` fixture lives in conftest.py).

Every process a test starts goes through the ``procs`` fixture, which records its pid (and the pids
of its descendants, e.g. the roles ``asyncrl run`` starts, with their start times so a recycled pid
is never signalled). At teardown it stops ONLY those pids (SIGTERM, then SIGKILL after a grace
period), waits for them, and asserts that none is alive and that no shared-memory segment of the
test's run ids is left in /dev/shm. Nothing is ever killed by name.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from asyncrl.run.launch import free_port, free_port_pair  # noqa: F401  (used by the tests)
from asyncrl.run.pdeathsig import sigint_as_in_a_terminal
from asyncrl.wire.shm.dev_shm import run_segment_pattern

REPO = Path(__file__).resolve().parents[2]
SHM_DIR = "/dev/shm"
CORRIDOR = "asyncrl/Corridor-v0"  # a toy env of asyncrl.tasks.control.toy_envs: fast, deterministic

# A small, fast configuration shared by the tests (2 busy cores).
SMALL = [
    "--set",
    "env.num_envs=2",
    "--set",
    "env.rollout_length=16",
    "--set",
    "learner.slots_per_batch=2",
    "--set",
    "learner.num_slots=6",
    "--set",
    "algo.num_minibatches=4",
    "--set",
    "algo.num_epochs=2",
]


def new_run_id() -> str:
    return f"itest-{uuid.uuid4().hex[:12]}"


def shm_segments(run_id: str) -> list[str]:
    """Names in /dev/shm that belong to ``run_id`` (``asyncrl-<run id>-<pid>``, or the fallback name
    ``asyncrl-<run id>+<hex>-<pid>`` when that was taken: shm.run_segment_pattern)."""
    pattern = run_segment_pattern(run_id)
    try:
        return sorted(n for n in os.listdir(SHM_DIR) if pattern.fullmatch(n))
    except FileNotFoundError:
        return []


# ----------------------------------------------------------------------------- /proc parsing


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, starttime) of ``pid`` from /proc, or None if it does not exist."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    rest = raw.rsplit(")", 1)[1].split()  # the command name may hold spaces and parentheses
    return rest[0], int(rest[1]), int(rest[19])


def alive(pid: int, starttime: int | None = None) -> bool:
    """True if ``pid`` exists, is not a zombie and (when given) started at ``starttime``."""
    st = proc_stat(pid)
    if st is None or st[0] in ("Z", "X"):
        return False
    return starttime is None or st[2] == starttime


def descendants(root: int) -> dict[int, int]:
    """{pid: starttime} of every live descendant of ``root`` (children, grandchildren, ...)."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        st = proc_stat(int(entry))
        if st is not None and st[0] not in ("Z", "X"):
            children.setdefault(st[1], []).append((int(entry), st[2]))
    out, todo = {}, [root]
    while todo:
        for pid, start in children.get(todo.pop(), []):
            if pid not in out:
                out[pid] = start
                todo.append(pid)
    return out


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1, procs=None):
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` after ``timeout``.
    With ``procs``, fail early (with their output) if one of its processes has exited non-zero."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if procs is not None:
            procs.check_no_failure()
        if time.monotonic() > deadline:
            extra = procs.dump() if procs is not None else ""
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n{extra}")
        time.sleep(interval)


def read_jsonl(path: Path) -> list[dict]:
    """Complete lines of a JSONL file that may still be being written."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written right now
            break
    return rows


# ----------------------------------------------------------------------------- the fixture


class Procs:
    """The processes of one test. ``start`` them; ``shutdown`` (also run at teardown) stops them."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.logs = workdir / "proc-logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.popen: dict[str, subprocess.Popen] = {}
        self.others: dict[int, int] = {}  # descendants we adopted: pid -> starttime
        self.run_ids: set[str] = set()
        self.expect_failure: set[str] = set()  # names allowed to exit non-zero
        self.done = False

    def env(self) -> dict:
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        return env

    def start(
        self, name: str, args: list[str], *, expect_failure: bool = False, prefix: list[str] = ()
    ) -> subprocess.Popen:
        """Run ``python -m asyncrl.cli *args`` in its own session (so its process group is its own),
        stdout/stderr to files under proc-logs/. ``prefix``: a command that execs the rest in place
        (e.g. ``ip netns exec NS``), so the recorded pid is still the role's."""
        assert name not in self.popen, name
        if expect_failure:
            self.expect_failure.add(name)
        out = open(self.logs / f"{name}.out", "w")
        err = open(self.logs / f"{name}.err", "w")
        try:
            p = subprocess.Popen(
                [*prefix, sys.executable, "-m", "asyncrl.cli", *args],
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                cwd=self.workdir,
                env=self.env(),
                start_new_session=True,
                preexec_fn=sigint_as_in_a_terminal,
            )
        finally:
            out.close()
            err.close()
        self.popen[name] = p
        return p

    def out(self, name: str) -> str:
        return (self.logs / f"{name}.out").read_text(errors="replace")

    def err(self, name: str) -> str:
        return (self.logs / f"{name}.err").read_text(errors="replace")

    def dump(self) -> str:
        parts = []
        for name, p in self.popen.items():
            parts.append(
                f"--- {name} (pid {p.pid}, rc {p.poll()})\nstdout:\n{self.out(name)[-3000:]}\n"
                f"stderr:\n{self.err(name)[-3000:]}"
            )
        return "\n".join(parts)

    def check_no_failure(self) -> None:
        for name, p in self.popen.items():
            rc = p.poll()
            if rc not in (None, 0) and name not in self.expect_failure:
                pytest.fail(f"{name} exited with status {rc}\n{self.dump()}")

    def adopt_descendants(self) -> dict[int, int]:
        """Record every live descendant of our processes (e.g. roles started by ``asyncrl run``)."""
        for p in self.popen.values():
            if p.poll() is None:
                self.others.update(descendants(p.pid))
        return dict(self.others)

    def wait(self, name: str, timeout: float) -> int:
        try:
            return self.popen[name].wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name} did not exit within {timeout:.0f} s\n{self.dump()}")

    def live_pids(self) -> list[int]:
        pids = [p.pid for p in self.popen.values() if p.poll() is None]
        return pids + [pid for pid, start in self.others.items() if alive(pid, start)]

    def _signal_all(self, sig: int) -> None:
        for p in self.popen.values():
            if p.poll() is None:
                try:
                    p.send_signal(sig)
                except ProcessLookupError:
                    pass
        for pid, start in self.others.items():
            if alive(pid, start):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass

    def _remove_endpoint_dirs(self) -> None:
        """The private ipc:// directories of the `asyncrl run`s this test started (a run killed by
        SIGKILL cannot remove its own), named in their "run ...: learner ipc://DIR/learner" line."""
        for f in self.logs.glob("*.out"):
            for d in re.findall(r"learner ipc://(/\S+)/learner\b", f.read_text(errors="replace")):
                if Path(d).name.startswith("asyncrl-ep-"):
                    shutil.rmtree(d, ignore_errors=True)

    def shutdown(self, grace_s: float = 5.0) -> None:
        """Stop our processes (SIGTERM, SIGKILL after ``grace_s``), reap them, then assert that none
        is alive and that no segment of this test's run ids remains in /dev/shm."""
        if self.done:
            return
        self.done = True
        self.adopt_descendants()
        self._signal_all(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while self.live_pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        self._signal_all(signal.SIGKILL)
        for p in self.popen.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 5
        while self.live_pids() and time.monotonic() < deadline:  # adopted ones: not our children
            time.sleep(0.05)
        still = self.live_pids()
        # a SIGKILLed learner's segment is unlinked by its resource tracker shortly after
        deadline = time.monotonic() + 3
        while any(shm_segments(r) for r in self.run_ids) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [n for r in sorted(self.run_ids) for n in shm_segments(r)]
        self._remove_endpoint_dirs()
        for name in left:  # never leak into the next test, but still fail
            try:
                os.unlink(os.path.join(SHM_DIR, name))
            except FileNotFoundError:
                pass
        assert not still, f"processes still alive after SIGKILL: {still}"
        assert not left, f"shared-memory segments left behind: {left}"


OUTCOME_HEADS = ("done:", "interrupted:", "failed:", "Error:")  # asyncrl.core.exit_status


def outcome_lines(text: str) -> list[str]:
    """The lines of a command's output that say how it ended (asyncrl.core.exit_status: exactly one)."""
    return [ln for ln in text.splitlines() if ln.startswith(OUTCOME_HEADS)]


def assert_strict_json_files(run_dir: Path) -> list[Path]:
    """Parse every .json and .jsonl file under ``run_dir`` with a strict parser (no NaN / Infinity
    literals); returns them."""
    from asyncrl.core.metrics import loads_strict

    files = sorted(p for p in run_dir.rglob("*") if p.is_file() and p.suffix in (".json", ".jsonl"))
    for p in files:
        text = p.read_text()
        for i, line in enumerate(text.splitlines() if p.suffix == ".jsonl" else [text]):
            try:
                loads_strict(line)
            except ValueError as exc:
                pytest.fail(f"{p} (line {i + 1}) is not strict JSON: {exc}: {line[:200]}")
    return files


def learner_cmd(learner_ep, broadcaster_ep, *extra, run_id, run_dir, total, env=CORRIDOR) -> list[str]:
    """``asyncrl learner`` arguments (for ``Procs.start``): bound at ``learner_ep``, publishing to the
    broadcaster at ``broadcaster_ep``, ``run_id`` in ``run_dir``, ``total`` env steps of ``env``; then
    ``extra`` (flags and --set pairs)."""
    return [
        "learner",
        "--bind",
        learner_ep,
        "--broadcaster",
        broadcaster_ep,
        "--env",
        env,
        "--run-id",
        run_id,
        "--run-dir",
        str(run_dir),
        "--total-steps",
        str(total),
        *extra,
    ]
