"""Children that die with their parent: Linux prctl(PR_SET_PDEATHSIG), set between fork and exec."""
from __future__ import annotations

import os
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM):
    """A ``preexec_fn`` for subprocess.Popen: the child gets ``sig`` when the process that
    started it dies, even by SIGKILL (the setting survives exec). A child whose parent is
    already gone by then exits at once (status 1). Where prctl is missing (not Linux) it
    does nothing."""
    parent = os.getpid()

    def preexec() -> None:
        try:
            import ctypes
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        except (OSError, AttributeError):
            return
        if os.getppid() != parent:   # the parent died before prctl took effect
            os._exit(1)

    return preexec
