"""How every command ends: one exit-status convention and one outcome line, for `asyncrl run` (serial,
local processes, Ray) and for each role started by hand (learner, actor, broadcaster).

Exit status:
    0    finished: the step budget was reached (an actor or broadcaster: its learner told it to stop)
    1    failed while running (a role died past its restarts, non-finite numbers, a full disk)
    2    refused to start: bad usage or config, a missing device, an actor its learner refuses
    130  interrupted by SIGINT (Ctrl-C); 143 by SIGTERM (``kill``, ``timeout``): 128 + the signal's
         number, the shell's convention. Only the first of them counts (later ones are ignored, so
         the role can write its summary and checkpoint).

Outcome line: the last line a command prints, one per command, starting with ``done:`` or
``interrupted:`` (on stdout), or click's ``Error:`` line for a failure (on stderr). A learner that
`asyncrl run` started writes its own to its log (``--supervised``); the launcher prints the run's.
"""

from __future__ import annotations

import signal

FINISHED, FAILED, REFUSED = 0, 1, 2

_stopped_by: int | None = None  # the signal that interrupted this process
_deferred = False  # start-up: a stop is recorded, raised by arm()


def install_stop_handlers(*, defer: bool = False) -> None:
    """SIGTERM unwinds like Ctrl-C (KeyboardInterrupt), so every role cleans up (sockets, shared
    memory) and :func:`interrupted_status` says which signal it was.

    Only the first SIGINT/SIGTERM interrupts; later ones are ignored (SIGKILL still works): a
    terminal's Ctrl-C reaches every process of `asyncrl run`, which then signals each role again,
    and a second KeyboardInterrupt would cut the cleanup short (no summary, no checkpoint). A process
    started with SIGINT ignored (a background job of a non-interactive shell) keeps it ignored.

    ``defer``: while the command still imports its libraries, a stop is only recorded and
    :func:`arm` raises it afterwards. An exception raised inside an import can leave a library
    half-initialised or be lost in its C++ code (torch then aborts, or the interrupt vanishes and
    the command goes on)."""
    global _deferred
    _deferred = defer

    def handler(signum, frame):
        global _stopped_by
        _stopped_by = signum
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if not _deferred:
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, handler)


def arm() -> None:
    """End the start-up's deferral: a stop recorded meanwhile raises KeyboardInterrupt now, and
    later ones raise when they arrive."""
    global _deferred
    _deferred = False
    if _stopped_by is not None:
        raise KeyboardInterrupt


def check_stop() -> None:
    """Raise KeyboardInterrupt when a stop signal has arrived: called where a role waits (e.g. for
    its learner), so an interrupt that a library swallowed still ends it."""
    if _stopped_by is not None:
        raise KeyboardInterrupt


def interrupted_status() -> int:
    """The exit status of an interrupted command: 128 + the signal that interrupted it (SIGINT when
    a KeyboardInterrupt came without one of our handlers)."""
    return 128 + (_stopped_by or signal.SIGINT)
