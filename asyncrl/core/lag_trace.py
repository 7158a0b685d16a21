"""Lag traces: the backward lag of every rollout a run's learner took, in order, and their replay.

Every run writes ``lag_trace.jsonl`` in its run directory: one line per batch handed to the learner,
``{"iteration": k, "version": v, "lags": [l_1, ..., l_B]}``, where l_i is the lag in versions of the
batch's i-th slot (the learner's version v at consumption minus the slot's behaviour version; slots
dropped by ``learner.max_policy_lag`` included). A 1M-step main job writes about 500 such lines.

``asyncrl run --serial --lag-trace RUN`` (config ``actor.lag_trace``) replays one: in serial mode
the i-th rollout acts with the weights ``l_i`` versions behind the learner's newest (the oldest
kept while fewer exist), so a method comparison under a real run's lag carries no scheduling noise
and repeats bit for bit. A replay longer than its trace starts the trace again from its first line
(and says so once in the log).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

TRACE_FILE = "lag_trace.jsonl"
DIGEST_MARK = "#sha256="  # "PATH#sha256=HEX": a trace whose content must have this digest (studies)


class LagTraceError(ValueError):
    """A lag trace is missing, unreadable, or not a trace; the message names the file."""


def trace_path(where: str | Path) -> Path:
    """The trace file of ``where``: a run directory (its lag_trace.jsonl) or the file itself."""
    p = Path(where)
    return p / TRACE_FILE if p.is_dir() else p


def split_digest(spec: str) -> tuple[str, str | None]:
    """("PATH", "HEX" or None) of a trace spec "PATH" or "PATH#sha256=HEX"."""
    path, mark, digest = spec.partition(DIGEST_MARK)
    return path, (digest if mark else None)


def trace_digest(where: str | Path) -> str:
    """sha256 (16 hex digits) of a trace file's bytes. Raises LagTraceError when it cannot be read."""
    path = trace_path(where)
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except OSError as exc:
        raise LagTraceError(f"lag trace {path}: {exc.strerror or exc}") from None


def read_lag_trace(spec: str | Path) -> np.ndarray:
    """The lags of a trace, in the order the learner took the slots: int64 [N], N >= 1.

    ``spec``: a run directory, a lag_trace.jsonl, either followed by "#sha256=HEX" (the first 16 hex
    digits of the file's sha256, which must match). Lines that are events (``{"event": ...}``, a
    resume) are skipped.

    Raises:
        LagTraceError: no such file, unreadable, a line that is not a trace line (iteration, version
            and lags: integers >= 0), no lags at all, or a digest that does not match.
    """
    where, digest = split_digest(str(spec))
    path = trace_path(where)
    if digest is not None and trace_digest(path) != digest:
        raise LagTraceError(f"lag trace {path} changed: its sha256 starts {trace_digest(path)}, not {digest}")
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise LagTraceError(
            f"lag trace {path}: {exc.strerror or exc} (a run directory written by asyncrl holds {TRACE_FILE})"
        ) from None
    except UnicodeDecodeError:
        raise LagTraceError(f"lag trace {path}: not a text file") from None
    lags: list[int] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise LagTraceError(f"lag trace {path}, line {n}: not JSON") from None
        if isinstance(row, dict) and "event" in row:
            continue
        if not (
            isinstance(row, dict)
            and isinstance(row.get("lags"), list)
            and all(type(x) is int and x >= 0 for x in row["lags"])
        ):
            raise LagTraceError(
                f"lag trace {path}, line {n}: not a trace line {{iteration, version, lags: [int >= 0]}}"
            )
        lags += row["lags"]
    if not lags:
        raise LagTraceError(f"lag trace {path}: no lags (an empty trace, or a run that consumed no batch)")
    return np.asarray(lags, np.int64)


class LagReplay:
    """The lags of a trace handed out one rollout at a time (cycling past its end)."""

    def __init__(self, lags: np.ndarray, *, source: str = "", log=None):
        self.lags = np.asarray(lags, np.int64)
        if self.lags.ndim != 1 or not self.lags.size or (self.lags < 0).any():
            raise LagTraceError("a lag replay needs a non-empty list of lags >= 0")
        self.position = 0  # rollouts handed a lag so far (checkpointed)
        self.source, self.log = source, log

    @property
    def depth(self) -> int:
        """Versions a weight history must keep to replay every lag: the largest lag + 1."""
        return int(self.lags.max()) + 1

    def next_lag(self) -> int:
        i = self.position % self.lags.size
        if self.position == self.lags.size and self.log is not None:  # the first time round only
            self.log.warning(
                "lag replay: the trace %s ended after %d rollouts; it starts again", self.source, self.lags.size
            )
        self.position += 1
        return int(self.lags[i])
