"""`asyncrl run` on one host: its roles talk over ipc:// sockets in a private (0700) directory, so
another local user cannot connect to any of them, nor take a role's endpoint while it restarts."""

from __future__ import annotations

import os
import re
import shutil
import socket
import stat
from pathlib import Path

import pytest
from mp_helpers import CORRIDOR, SMALL, wait_for

from asyncrl.run.launch import private_endpoint_dir
from asyncrl.wire import addresses
from asyncrl.wire.weights_secret import weights_secret_path

pytestmark = pytest.mark.integration
NOBODY = 65534


def test_private_endpoint_dir_is_this_users_and_short_enough_for_socket_names():
    d = private_endpoint_dir()
    try:
        st = d.stat()
        assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()
        assert len(str(d / "weights.snapshot")) < 108
        assert addresses.snapshot_endpoint(f"ipc://{d}/weights") == f"ipc://{d}/weights.snapshot"
        assert weights_secret_path(f"ipc://{d}/weights") == d / "weights.secret"
    finally:
        d.rmdir()


def _as_user(uid: int, path: str, action: str = "connect") -> str:
    """Try an AF_UNIX ``action`` (connect or bind) on ``path`` as user ``uid`` in a forked child;
    its outcome's name."""
    outcomes = {0: "done", 1: "PermissionError", 2: "other error"}
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 2
        try:
            os.setgid(uid)
            os.setuid(uid)
            with socket.socket(socket.AF_UNIX) as s:
                getattr(s, action)(path)
            code = 0
        except PermissionError:
            code = 1
        except BaseException:  # noqa: BLE001 - reported as "other error"
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return outcomes.get(os.waitstatus_to_exitcode(status), "other error")


@pytest.mark.timeout(150)
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_another_local_user_cannot_reach_a_runs_roles(procs, tmp_path):
    run_dir = tmp_path / "run"
    procs.start(
        "run",
        ["run", "--env", CORRIDOR, "--num-actors", "1", "--total-steps", "20000", "--run-dir", str(run_dir), *SMALL],
    )
    m = wait_for(
        lambda: re.search(r"^run (\S+): learner (\S+), broadcaster (\S+),", procs.out("run"), re.M),
        60,
        "the run line",
        procs=procs,
    )
    procs.run_ids.add(m.group(1))
    learner, broadcaster = m.group(2), m.group(3)
    assert learner.startswith("ipc://") and broadcaster.startswith("ipc://")
    path = Path(learner[len("ipc://") :])
    wait_for(path.exists, 60, "the learner's socket", procs=procs)
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    for ep in (learner, broadcaster, addresses.snapshot_endpoint(broadcaster)):
        wait_for(Path(ep[len("ipc://") :]).exists, 60, f"socket {ep}", procs=procs)
        assert _as_user(NOBODY, ep[len("ipc://") :]) == "PermissionError", ep
    # nor bind a socket of its own where a restarting role's endpoint would be
    assert _as_user(NOBODY, str(path.parent / "learner.new"), "bind") == "PermissionError"
    with socket.socket(socket.AF_UNIX) as s:  # this user (the run's) can
        s.connect(str(path))
    assert procs.wait("run", 120) == 0, procs.dump()
    assert not path.parent.exists()  # removed with the run


def test_clean_removes_endpoint_dirs_of_killed_runs_only():
    """`asyncrl clean`: a directory whose sockets no one listens on (a supervisor killed by SIGKILL)
    goes; one with a listening socket, or one just made (a run starting), stays."""
    from asyncrl.run.launch import remove_stale_endpoint_dirs

    dead, live, young = private_endpoint_dir(), private_endpoint_dir(), private_endpoint_dir()
    listener = socket.socket(socket.AF_UNIX)
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(dead / "learner"))  # closed: the file stays, no one listens
        listener.bind(str(live / "learner"))
        listener.listen(1)
        for d in (dead, live):
            os.utime(d, (0, 0))
        assert str(dead) in remove_stale_endpoint_dirs(dry_run=True) and dead.exists()  # listed, kept
        removed = remove_stale_endpoint_dirs()
        assert str(dead) in removed and not dead.exists()
        assert live.exists() and young.exists() and str(live) not in removed and str(young) not in removed
    finally:
        listener.close()
        for d in (dead, live, young):
            shutil.rmtree(d, ignore_errors=True)
