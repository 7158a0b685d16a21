"""bin/learner-host as a user runs it: it ends when its learner ends, and takes its broadcaster with
it (a background job of a script starts with SIGINT ignored, so the wrapper stops it with SIGTERM);
a broadcaster that cannot start ends the wrapper instead of leaving a learner waiting for ever."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from mp_helpers import SMALL

from asyncrl.run.launch import free_port

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _children_of(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == pid:
                out.append(int(d.name))
    return out


def _free_triple() -> int:
    """A port P with P+1 and P+2 free too (the learner's and the broadcaster's)."""
    for _ in range(200):
        p = free_port()
        if p + 2 < 65535 and all(_free(p + k) for k in (1, 2)):
            return p
    raise RuntimeError("no three free ports in a row")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _wrapper(tmp_path, port, steps):
    cmd = [
        str(REPO / "bin" / "learner-host"),
        "--address",
        "127.0.0.1",
        "--port",
        str(port),
        "--insecure",
        "--env",
        "asyncrl/Corridor-v0",
        "--run-dir",
        str(tmp_path / "run"),
        "--",
        "--total-steps",
        str(steps),
        *SMALL,
    ]
    env = dict(os.environ, ASYNCRL=f"{sys.executable} -m asyncrl")
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=tmp_path,
        start_new_session=True,
    )


def test_learner_host_ends_with_its_learner_and_stops_its_broadcaster(tmp_path):
    port = _free_triple()
    wrapper = _wrapper(tmp_path, port, 2048)
    actor = None
    try:
        actor = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "asyncrl",
                "actor",
                "--learner",
                f"tcp://127.0.0.1:{port}",
                "--broadcaster",
                f"tcp://127.0.0.1:{port + 1}",
                "--env",
                "asyncrl/Corridor-v0",
                "--actor-id",
                "a0",
                *SMALL,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            cwd=tmp_path,
        )
        text, _ = wrapper.communicate(timeout=240)
        assert wrapper.returncode == 0, text
        assert "done:" in text, text
        assert _children_of(wrapper.pid) == []  # no broadcaster left behind
        assert actor.wait(60) == 0
    finally:
        for p in (wrapper, actor):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL) if p is wrapper else p.kill()
                p.wait(10)


def test_learner_host_ends_when_its_broadcaster_cannot_start(tmp_path):
    port = _free_triple()
    with socket.socket() as taken:  # the broadcaster's port is taken
        taken.bind(("127.0.0.1", port + 1))
        taken.listen()
        wrapper = _wrapper(tmp_path, port, 10**9)
        try:
            text, _ = wrapper.communicate(timeout=240)
        finally:
            if wrapper.poll() is None:
                os.killpg(wrapper.pid, signal.SIGKILL)
                wrapper.wait(10)
    assert wrapper.returncode != 0, text
    assert "the broadcaster ended" in text, text
