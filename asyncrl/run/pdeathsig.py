"""Child-process set-up between fork and exec: children that die with their parent (Linux
prctl(PR_SET_PDEATHSIG)), and children that take Ctrl-C as in a terminal."""

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
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def sigint_as_in_a_terminal() -> None:
    """A ``preexec_fn``: SIGINT back to its default in the child. A process started in the
    background by a non-interactive shell (``cmd &``, a CI job, an agent's tool) inherits SIGINT as
    ignored, and `asyncrl run` and every role keep it so (as a shell's background job should), so
    a SIGINT that a benchmark or test sends them to stop a run would do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
