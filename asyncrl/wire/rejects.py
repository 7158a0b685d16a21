"""What a role does with input it refused: count it by (reason, sender) (``RejectCounter``), log it
at a rate peers cannot drive (``LogBudget``), with wire text made safe for one log line
(``printable``)."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter

log = logging.getLogger("asyncrl.wire.transport")  # the logger name reject lines have always carried


def printable(text, limit: int = 300) -> str:
    """``text`` (str or bytes from the wire) safe for one log line: control characters, newlines,
    backslashes and non-ASCII escaped (``\\n``, ``\\x1b``, ``\\u2028``), cut to ``limit`` characters."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        text = bytes(text).decode("utf-8", "backslashreplace")
    out = str(text).encode("unicode_escape").decode("ascii")
    return out if len(out) <= limit else out[:limit] + "..."


class LogBudget:
    """A rate limit for log lines caused by peers: at most ``per_window`` lines per ``window_s``
    seconds, whatever the number of peers (a peer that makes up a new sender name per message
    must not fill the disk). ``allow()`` says whether one more line may go out now; ``suppressed``
    counts the lines held back since the last allowed one. Thread-safe."""

    def __init__(self, per_window: int = 20, window_s: float = 10.0):
        self.per_window, self.window_s = per_window, window_s
        self.window_start, self.used, self.suppressed = -math.inf, 0, 0
        self._lock = threading.Lock()

    def allow(self) -> tuple[bool, int]:
        """(may log now, lines suppressed before this one); the count restarts after an allowed line."""
        now = time.monotonic()
        with self._lock:
            if now - self.window_start >= self.window_s:
                self.window_start, self.used = now, 0
            if self.used >= self.per_window:
                self.suppressed += 1
                return False, 0
            self.used += 1
            held, self.suppressed = self.suppressed, 0
            return True, held


class RejectCounter:
    """Counts rejected messages by (reason, sender) and logs them; never raises; thread-safe (the
    CURVE authenticator's thread counts refused connections while the role's thread reads them).

    Logs the 1st, 2nd, 4th, 8th, ... reject of each (reason, sender), and at most ``LogBudget``
    lines a window over all senders, so misbehaving peers cannot flood the log. Keeps at most
    ``max_keys`` (reason, sender) pairs: further senders are counted under sender "(others)".
    ``counts``: Counter of (reason, sender) -> rejects (read it through ``snapshot()`` from another
    thread).
    """

    def __init__(
        self,
        role: str,
        logger: logging.Logger | None = None,
        *,
        what: str = "rejected message",
        max_keys: int = 4096,
        budget: LogBudget | None = None,
    ):
        self.role, self.log, self.what, self.max_keys = role, logger or log, what, max_keys
        self.counts: Counter[tuple[str, str]] = Counter()
        self.budget = budget or LogBudget()
        self._lock = threading.Lock()

    def reject(self, error: Exception | str, sender: bytes | str | None = None) -> None:
        if isinstance(error, Exception):
            reason = getattr(error, "reason", None) or type(error).__name__
        else:
            reason = str(error)
        key = (printable(reason, 64), printable(sender or "?", 64))
        with self._lock:
            if key not in self.counts and len(self.counts) >= self.max_keys:
                key = (key[0], "(others)")
            self.counts[key] += 1
            n = self.counts[key]
        if n & (n - 1) == 0:
            allowed, held = self.budget.allow()
            if allowed:
                more = f"; {held} similar lines suppressed" if held else ""
                self.log.warning(
                    "%s: %s from %s: %s (%d so far%s)", self.role, self.what, key[1], printable(error), n, more
                )

    def snapshot(self) -> Counter:
        """A copy of ``counts``, taken under the lock."""
        with self._lock:
            return Counter(self.counts)

    @property
    def total(self) -> int:
        return sum(self.snapshot().values())

    def by_reason(self) -> dict[str, int]:
        out: Counter[str] = Counter()
        for (reason, _), n in self.snapshot().items():
            out[reason] += n
        return dict(out)
