"""Run-directory outputs: metrics JSONL, episode statistics, summary, console progress line.

Every JSON and JSONL file a run writes (metrics.jsonl, lag.jsonl, lag_trace.jsonl, lag_histograms.jsonl,
summary.json, config.json, the broadcaster's counts, study cell records and results, eval outputs) is made by
:func:`strict_json`, so a strict parser (RFC 8259: no NaN or Infinity literals; e.g.
``json.loads(text, parse_constant=raise)``) reads it. Non-finite floats are written as ``null``: a
NaN statistic (an llm iteration that took no optimizer step, a split with no stale sample) and an
infinite one alike. config.json is the exception that must round-trip: there ``inf`` and ``-inf``
(e.g. ``algo.behavior_band = inf``, "off") are written as the strings "inf" and "-inf", which
asyncrl.core.config reads back as floats.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np


class RunDirError(OSError):
    """A run-directory file could not be written (disk full, read-only, removed); the message is
    one line, ``cannot write PATH: REASON``. Whatever was written before stays readable."""

    def __init__(self, path: str | Path, exc: OSError):
        super().__init__(exc.errno, exc.strerror or str(exc), str(path))

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}"


class JsonlWriter:
    """Append one JSON object per line, each with one write to the file (a crash loses nothing).
    A write that fails (disk full) is undone, so the file never ends in half a line."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            raise RunDirError(self.path, exc) from None

    def write(self, record: dict[str, Any]) -> None:
        """Append ``record`` as one line. Raises RunDirError, leaving the file as it was."""
        data = (strict_json(record) + "\n").encode()
        start = None
        try:
            start = os.fstat(self._fd).st_size
            done = os.write(self._fd, data)
            while done < len(data):  # a short write: the disk filled up mid-line
                done += os.write(self._fd, data[done:])
        except OSError as exc:
            if start is not None:
                try:
                    os.ftruncate(self._fd, start)
                except OSError:
                    pass
            raise RunDirError(self.path, exc) from None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _jsonable(x):
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def strict_json(value: Any, *, indent: int | None = None, inf_as_text: bool = False, sort_keys: bool = False) -> str:
    """``value`` as strict JSON text: the one encoder of every file a run writes (module docstring).

    NaN becomes ``null``; +-inf becomes ``null``, or the strings "inf" / "-inf" with ``inf_as_text``
    (config.json, whose infinities mean "off" and must load back). numpy scalars and arrays become
    numbers and lists, tuples lists. Raises TypeError for a value JSON cannot hold."""
    return json.dumps(
        _finite_only(value, inf_as_text), indent=indent, allow_nan=False, default=_jsonable, sort_keys=sort_keys
    )


def _finite_only(x: Any, inf_as_text: bool) -> Any:
    if isinstance(x, float):  # numpy's float64 too
        if x == x and abs(x) != float("inf"):
            return float(x)
        if x != x or not inf_as_text:
            return None
        return "inf" if x > 0 else "-inf"
    if isinstance(x, np.generic):
        return _finite_only(x.item(), inf_as_text)
    if isinstance(x, np.ndarray):
        return _finite_only(x.tolist(), inf_as_text)
    if isinstance(x, dict):
        return {k: _finite_only(v, inf_as_text) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite_only(v, inf_as_text) for v in x]
    return x


def _refuse_constant(name: str):
    raise ValueError(f"not strict JSON: {name}")


def loads_strict(text: str) -> Any:
    """Parse JSON text as a strict reader does: NaN, Infinity and -Infinity literals raise ValueError
    (json.JSONDecodeError is one too), as does any other syntax error."""
    return json.loads(text, parse_constant=_refuse_constant)


def read_jsonl(path: str | Path) -> list:
    """The JSON values of a JSONL file, one per line; [] for a missing file. A line that does not
    parse (cut short by a killed process) is skipped."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def rewrite_jsonl(path: str | Path, keep) -> int:
    """Rewrite a JSONL file atomically with only the values ``keep(value)`` is true of (lines that
    do not parse are dropped); returns how many were left out. A missing file stays missing."""
    path = Path(path)
    if not path.exists():
        return 0
    rows = read_jsonl(path)
    kept = [r for r in rows if keep(r)]
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(strict_json(r) + "\n" for r in kept))
    os.replace(tmp, path)
    return len(rows) - len(kept)


def is_event(record) -> bool:
    """True for a JSONL record that marks an event of the run (``{"event": "resume", ...}``)
    rather than an iteration, a lag row or a window: readers of the curves skip them."""
    return isinstance(record, dict) and "event" in record


def write_json_atomic(path: str | Path, data: dict[str, Any], *, indent: int = 2, inf_as_text: bool = False) -> None:
    """Write ``data`` as strict JSON (:func:`strict_json`) to ``path`` atomically (see write_atomic).
    Raises RunDirError (TypeError for a value JSON cannot hold)."""
    write_atomic(path, (strict_json(data, indent=indent, inf_as_text=inf_as_text) + "\n").encode())


def write_atomic(path: str | Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, fsync it, then rename it over ``path``:
    ``path`` is always either the old file or the whole new one. Raises RunDirError (the
    temporary file removed, ``path`` untouched)."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise RunDirError(exc.filename if exc.filename and exc.filename != str(tmp) else path, exc) from None


class EpisodeTracker:
    """Recent episode returns (window of the last ``window`` episodes) and all of them, logged
    with the env step at which they ended: the learning curve."""

    def __init__(self, window: int = 20):
        self.recent: deque[float] = deque(maxlen=window)
        self.count = 0

    def add(self, returns, lengths=()) -> None:
        for r in returns:
            self.recent.append(float(r))
            self.count += 1

    @property
    def average_return(self) -> float | None:
        return float(np.mean(self.recent)) if self.recent else None

    def state_dict(self) -> dict:
        return {"recent": list(self.recent), "count": self.count}

    def load_state_dict(self, d: dict) -> None:
        self.recent.extend(float(r) for r in d["recent"])
        self.count = int(d["count"])


def percentiles(values, qs=(50, 95)) -> list[float | None]:
    if len(values) == 0:
        return [None for _ in qs]
    return [float(v) for v in np.percentile(np.asarray(values, np.float64), qs)]


def progress_line(
    *,
    env_steps: int,
    total: int,
    steps_per_s: float,
    avg_return: float | None,
    lag: tuple | None = None,
    tv: float | None = None,
    no_grad: float | None = None,
) -> str:
    """One console line. tv / no_grad (no_grad_fraction, asyncrl.algo.policy_loss): None or NaN (an LLM
    iteration whose groups were all silent took no optimizer step) print nothing."""
    parts = [
        f"steps {env_steps:>9,}/{total:,}",
        f"{steps_per_s:7,.0f} steps/s",
        f"return {avg_return:8.1f}" if avg_return is not None else "return      n/a",
    ]
    if lag is not None and lag[0] is not None:
        parts.append(f"lag p50/p95 {lag[0]:.0f}/{lag[1]:.0f} v")
        if len(lag) > 2 and lag[2] is not None:
            parts.append(f"{lag[2]:.2f}/{lag[3]:.2f} s")
    elif lag is not None:
        parts.append("lag p50/p95 n/a (no batch trained yet)")
    if tv is not None and tv == tv:
        parts.append(f"tv {tv:.3f}")
    if no_grad is not None and no_grad == no_grad:
        parts.append(f"no grad {no_grad:.2f}")
    return " | ".join(parts)


class Clock:
    """Wall-clock since start, and a rate limiter for console lines."""

    def __init__(self, every_s: float, elapsed_s: float = 0.0):
        """``elapsed_s``: seconds already run (a resumed run's clock goes on from there)."""
        self.start = time.monotonic() - elapsed_s
        self.every_s, self._last = every_s, 0.0

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def due(self) -> bool:
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            return True
        return False


# Columns of each row of a metrics record's "minibatches" list (asyncrl.tasks.control.update).
MINIBATCH_COLUMNS = ("step", "tv_estimate", "no_grad_fraction")


def tensorboard_writer(logdir: str | Path):
    """A TensorBoard SummaryWriter on ``logdir`` when tensorboard is installed, else None.

    A write error in its background thread (disk full) is not printed there: the writer raises it
    again at its next call in the caller's thread, which reports it as one line."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    _quiet_tensorboard_thread()
    return SummaryWriter(str(logdir), flush_secs=10)


def tensorboard_kept(write) -> bool:
    """Run ``write()`` (calls on a SummaryWriter); False if it failed for want of file descriptors
    (EMFILE / ENFILE: TensorBoard opens its event file for every write, and peers' connections can
    hold every descriptor): the caller then drops its writer, with one warning here, and the run goes
    on (metrics.jsonl keeps every record; a writer that failed once raises again at every call).
    Any other OSError (disk full, read-only) propagates."""
    try:
        write()
        return True
    except OSError as exc:
        if exc.errno not in (errno.EMFILE, errno.ENFILE):
            raise
        logging.getLogger("asyncrl.core.metrics").warning(
            "TensorBoard output stopped: %s (no free file descriptor); metrics.jsonl has every record", exc
        )
        return False


def _quiet_tensorboard_thread() -> None:
    previous = threading.excepthook
    if getattr(previous, "asyncrl_quiet_tb", False):
        return

    def hook(args):
        if isinstance(args.exc_value, OSError) and type(args.thread).__name__ == "_AsyncWriterThread":
            return
        previous(args)

    hook.asyncrl_quiet_tb = True
    threading.excepthook = hook


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """Every scalar of a metrics.jsonl record, flattened for TensorBoard: numbers as they are
    (booleans and None left out), a list of numbers as ``KEY/mean`` and ``KEY/max`` (e.g.
    episode_returns), and the per-minibatch rows as ``minibatches/COLUMN/mean`` and ``/max`` for
    each column of :data:`MINIBATCH_COLUMNS` but the step index. Non-finite values are left out."""
    out: dict[str, float] = {}

    def put(key, value):
        value = float(value)
        if np.isfinite(value):
            out[key] = value

    for key, value in record.items():
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, (int, float, np.integer, np.floating)):
            put(key, value)
        elif key == "minibatches" and value and isinstance(value[0], (list, tuple)):
            table = np.asarray(value, np.float64)
            for j, name in enumerate(MINIBATCH_COLUMNS[1 : table.shape[1]], start=1):
                put(f"minibatches/{name}/mean", table[:, j].mean())
                put(f"minibatches/{name}/max", table[:, j].max())
        elif (
            isinstance(value, (list, tuple))
            and value
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        ):
            put(f"{key}/mean", np.mean(value))
            put(f"{key}/max", np.max(value))
    return out


def write_scalars(writer, record: dict[str, Any], *, step_key: str = "env_steps") -> None:
    """Add every :func:`scalars` of ``record`` to a SummaryWriter at global step record[step_key]."""
    step = int(record[step_key])
    for key, value in scalars(record).items():
        writer.add_scalar(key, value, global_step=step)
