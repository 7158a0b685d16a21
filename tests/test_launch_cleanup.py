"""asyncrl run's supervisor removes the run's shared memory and private endpoint directory even when a
SIGINT / SIGTERM (KeyboardInterrupt) arrives while it stops the roles: a study stopping just as its cell's
run ended left both behind once."""

from __future__ import annotations

import subprocess
import sys
import uuid
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory

import pytest

from asyncrl.run.launch import Supervisor, private_endpoint_dir


def test_an_interrupt_during_stop_still_kills_the_roles_and_removes_segment_and_endpoint_dir():
    run_id = f"test-{uuid.uuid4().hex[:8]}"
    seg = SharedMemory(name=f"asyncrl-{run_id}-1", create=True, size=64)
    seg.close()
    resource_tracker.unregister(seg._name, "shared_memory")  # remove_run unlinks it, not this process
    role = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    sup = object.__new__(Supervisor)  # the state stop_all reads, without starting a run
    sup.run_id, sup.endpoint_dir, sup.procs = run_id, private_endpoint_dir(), {"learner": role}
    (sup.endpoint_dir / "learner").write_text("")

    def interrupted_stop(names=None, grace_s=5.0):
        raise KeyboardInterrupt  # the signal lands while the roles are being stopped

    sup.stop = interrupted_stop
    try:
        with pytest.raises(KeyboardInterrupt):
            sup.stop_all()
        assert role.poll() is not None  # killed, not left running
        assert not sup.endpoint_dir.exists()
        with pytest.raises(FileNotFoundError):
            SharedMemory(name=f"asyncrl-{run_id}-1")
    finally:
        if role.poll() is None:
            role.kill()
            role.wait()
