"""Long work in a worker thread while the calling thread keeps answering a liveness check.

An actor's sockets belong to its own thread (ZeroMQ sockets are not thread-safe), and the learner
gives an actor up after ``transport.actor_timeout_s`` of silence. Work that takes longer than that in
one piece (loading a language model, generating a slot of completions on a CPU: minutes) therefore
runs in a worker thread while the actor's thread goes on heartbeating (:func:`run_with_heartbeats`).
torch releases the GIL inside its operators, so the heartbeats come on time, and the work computes
exactly what it would compute in the calling thread (the same operators on the same tensors).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
HEARTBEAT_POLL_S = 0.1  # how often the waiting thread calls its heartbeat (the actor's rate-limits itself)
CANCEL_WAIT_S = 30.0  # how long cancelled work may take to reach its next step


class Cancelled(RuntimeError):
    """Raised by ``on_step`` inside work whose caller stopped waiting for it."""


def run_with_heartbeats(
    work: Callable[[Callable[[], None]], T],
    heartbeat: Callable[[], None],
    *,
    poll_s: float = HEARTBEAT_POLL_S,
    name: str = "asyncrl-worker",
) -> T:
    """``work(on_step)`` in a worker thread (``name``) while this thread calls ``heartbeat()`` every
    ``poll_s`` seconds until the work returns, however long it takes.

    ``on_step``, for work made of steps (the sampler calls it between decoding steps), raises
    :class:`Cancelled` once this thread stopped waiting, so the worker ends at its next step instead
    of working on for nobody.

    Returns:
        What ``work`` returned.

    Raises:
        What ``work`` raised, or what ``heartbeat`` raised (e.g. the actor's ActorError) or an
        interrupt that came while waiting: the work is then cancelled and waited for up to
        CANCEL_WAIT_S seconds (it is a daemon thread: it never keeps the process alive).
    """
    cancel = threading.Event()
    box: dict[str, Any] = {}

    def on_step() -> None:
        if cancel.is_set():
            raise Cancelled("the caller stopped waiting for this work")

    def run() -> None:
        try:
            box["result"] = work(on_step)
        except BaseException as exc:  # handed to the waiting thread, which raises it
            box["error"] = exc

    worker = threading.Thread(target=run, name=name, daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            heartbeat()
            worker.join(poll_s)
    except BaseException:
        cancel.set()
        worker.join(CANCEL_WAIT_S)
        raise
    if "error" in box:
        raise box["error"]
    return box["result"]


class Warmup:
    """``work()`` started in a daemon thread now (the learner's compile before its first iteration,
    :meth:`asyncrl.tasks.base.Task.warm_up`), while the caller goes on serving its peers and asks
    :attr:`ready` before the work's result is needed, or :meth:`wait` s for it. An exception in the
    work is logged (one warning) and counts as ready: what it prepares is an optimisation, whose
    absence costs time, never a result."""

    def __init__(self, work: Callable[[], Any], *, name: str = "asyncrl-warm-up", log=None):
        self.seconds: float | None = None  # how long the work took, once it ended
        self.result: Any = None  # what it returned (None after an exception)
        self._log = log
        self._thread = threading.Thread(target=self._run, args=(work,), name=name, daemon=True)
        self._thread.start()

    def _run(self, work: Callable[[], Any]) -> None:
        t0 = time.perf_counter()
        try:
            self.result = work()
        except Exception as exc:  # noqa: BLE001 - logged; the caller's own path is always correct
            if self._log is not None:
                self._log.warning("warm-up failed (%s: %s); going on without it", type(exc).__name__, exc)
        self.seconds = time.perf_counter() - t0

    @property
    def ready(self) -> bool:
        return not self._thread.is_alive()

    def wait(self) -> None:
        self._thread.join()
