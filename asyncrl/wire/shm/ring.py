"""``SlotRing``: S rollout slots of one ``RolloutSpec`` in ONE POSIX shared-memory segment (its byte
layout: ``asyncrl.wire.shm.layout``; its name: ``asyncrl.wire.shm.dev_shm``), and slot integrity.

Slot integrity (``arm``, ``disarm``, ``intact``, ``WriteGuard``): a writer checks the generation
before and after writing each row of its rollout; once it is not its grant any more it stops, and
if it wrote since its last good check it records itself as the intruder. The learner trains on a
slot only if, after copying it, the generation is still the grant whose report it accepted and no
intruder is recorded. What it cannot see: a writer frozen between its last row write and its check
after it, and killed there (one row of one rollout, only after a freeze longer than the actor
timeout).

The creator owns the name (``unlink``); attached processes only map it.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import threading
import weakref
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory

import numpy as np

from asyncrl.core.spec import RolloutSpec
from asyncrl.wire.shm.dev_shm import (
    _RUN_ID,
    _create_exclusive,
    _open_untracked,
    _space_message,
    check_space,
    free_bytes,
)
from asyncrl.wire.shm.layout import (
    _HEADER,
    HEADER_NBYTES,
    MAGIC,
    TOKEN_NBYTES,
    ShmError,
    ShmSpaceError,
    _check_header,
    _hash,
    control_nbytes,
    segment_nbytes,
)

log = logging.getLogger(__package__)  # "asyncrl.wire.shm", the logger of these lines before the split


class SlotRing:
    """S rollout slots in one shared-memory segment. Build with ``create`` or ``attach``.

    Used as a context manager it closes on exit, and the creator also unlinks.
    """

    def __init__(self, shm: SharedMemory, spec: RolloutSpec, num_slots: int, token: bytes, owner: bool):
        self._shm, self.spec, self.num_slots, self.token, self.owner = shm, spec, num_slots, token, owner
        self._views: dict[int, dict[str, np.ndarray]] = {}
        self._closed = self._unlinked = False
        # [S, 2] int64: (generation, intruder) of each slot; see asyncrl.wire.shm.layout
        self._control = np.ndarray((num_slots, 2), np.int64, buffer=shm.buf, offset=HEADER_NBYTES)

    @classmethod
    def create(cls, *, run_id: str, spec: RolloutSpec, num_slots: int) -> SlotRing:
        """Create the zero-filled segment ``asyncrl-<run_id>-<os.getpid()>``, or, if that name is
        taken (a stale segment of a recycled pid, or a file anyone put there: /dev/shm is
        world-writable), ``asyncrl-<run_id>+<8 random hex>-<os.getpid()>`` (``_create_exclusive``).

        Raises ValueError for a run_id outside ``[A-Za-z0-9_.-]{1,200}`` or num_slots < 1;
        ShmError if no free name was found in a few tries; ShmSpaceError
        if /dev/shm has less free space than the segment (checked with statvfs, then reserved
        with posix_fallocate, so writing into the ring never SIGBUSes for want of space).
        """
        if not _RUN_ID.fullmatch(run_id):
            raise ValueError(f"run_id must match [A-Za-z0-9_.-]{{1,200}}, got {run_id!r}")
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        nbytes = segment_nbytes(spec, num_slots)
        check_space(nbytes, spec, num_slots)
        shm = _create_exclusive(run_id, nbytes)
        name = shm.name
        try:  # commit the pages now: a later write can then never SIGBUS for want of space
            os.posix_fallocate(shm._fd, 0, nbytes)
        except OSError as exc:
            shm.close()
            shm.unlink()
            if exc.errno in (errno.ENOSPC, errno.EFBIG):
                raise ShmSpaceError(_space_message(nbytes, free_bytes(), spec, num_slots)) from None
            if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):  # no fallocate here: unreserved
                raise ShmError(f"cannot reserve {nbytes:,} bytes for {name!r}: {exc.strerror}") from None
            shm = SharedMemory(name=name.lstrip("/"), create=True, size=nbytes)
        token = secrets.token_bytes(TOKEN_NBYTES)
        _HEADER.pack_into(shm.buf, 0, MAGIC, num_slots, spec.slot_nbytes, _hash(spec), token)
        return cls(shm, spec, num_slots, token, owner=True)

    @classmethod
    def attach(cls, *, name: str, spec: RolloutSpec, num_slots: int, token: bytes | None = None) -> SlotRing:
        """Map an existing segment (e.g. the one a learner's ``welcome`` names).

        The segment is not registered with this process's resource tracker, so this process
        exiting never removes it. Raises ShmError if it is missing (e.g. the learner runs on
        another host), or its magic, num_slots, layout hash, size or (when given) token differ.
        """
        try:
            shm = _open_untracked(name)
        except FileNotFoundError:
            raise ShmError(f"no shared-memory segment {name!r} on this host") from None
        try:
            found = _check_header(shm, spec, num_slots, token)
        except ShmError:
            shm.close()
            raise
        return cls(shm, spec, num_slots, found, owner=False)

    @property
    def name(self) -> str:
        """Segment name without the leading slash, as ``attach`` takes it."""
        return self._shm.name

    def views(self, i: int) -> dict[str, np.ndarray]:
        """Writable numpy views of slot ``i``, straight into shared memory (no copy).

        Returns {field name: array of that field's shape and dtype} (``spec.fields``, e.g. obs
        [T+1, E, obs_dim] float32). Repeated calls return the same arrays in a new dict.
        Raises IndexError unless 0 <= i < num_slots; ShmError after close().
        """
        if self._closed:
            raise ShmError(f"{self.name} is closed")
        if not 0 <= i < self.num_slots:
            raise IndexError(f"slot {i} out of range [0, {self.num_slots})")
        if i not in self._views:
            base = HEADER_NBYTES + control_nbytes(self.num_slots) + i * self.spec.slot_nbytes
            self._views[i] = self.spec.views(self._shm.buf, base)
        return dict(self._views[i])

    # ---- slot integrity (module docstring) ----
    def arm(self, i: int, grant_id: int) -> None:
        """Learner: ``grant_id`` (> 0) may write slot ``i`` from now on; clears its intruder mark."""
        if grant_id <= 0:
            raise ValueError(f"grant ids are > 0, got {grant_id}")
        self._control[i, 1] = 0
        self._control[i, 0] = grant_id

    def disarm(self, i: int) -> None:
        """Learner: nobody may write slot ``i`` (its grant was reclaimed, voided or consumed)."""
        self._control[i, 0] = 0

    def generation(self, i: int) -> int:
        """The grant id that may write slot ``i`` now (0: none)."""
        return int(self._control[i, 0])

    def intact(self, i: int, grant_id: int) -> bool:
        """Learner, after copying slot ``i`` out: True if ``grant_id`` still holds it and no revoked
        writer marked itself as an intruder, so the copy is that grant's rollout alone."""
        _fence()
        return int(self._control[i, 0]) == grant_id and int(self._control[i, 1]) == 0

    def guard(self, i: int, grant_id: int) -> WriteGuard:
        """The writer's side for one rollout into slot ``i`` under ``grant_id``."""
        return WriteGuard(self._control, i, grant_id)

    def close(self) -> None:
        """Unmap the segment in this process; idempotent, never raises BufferError.

        numpy keeps no buffer lock on the mapping, so unmapping while a view is still referenced
        would make its next access a segfault. If views are still alive, the unmap is deferred
        until the last of them is garbage-collected. Does not remove the name: see unlink().
        """
        if self._closed:
            return
        self._closed = True
        refs = [weakref.ref(a) for v in self._views.values() for a in v.values()]
        refs.append(weakref.ref(self._control))
        self._views.clear()
        self._control = None
        live = [a for r in refs if (a := r()) is not None]
        if not live:
            self._shm.close()
            return
        log.debug("%s: %d views still alive; unmapping when they are gone", self.name, len(live))
        pending = _CloseWhenUnused(self._shm, len(live))
        for a in live:
            weakref.finalize(a, pending.one_gone).atexit = False

    def unlink(self) -> None:
        """Remove the segment's name (creator only; idempotent). Mappings stay valid until closed.

        Raises ShmError if this ring was attached rather than created.
        """
        if not self.owner:
            raise ShmError(f"{self.name}: only the creating process unlinks the segment")
        if self._unlinked:
            return
        self._unlinked = True
        try:
            self._shm.unlink()
        except FileNotFoundError:  # removed by `asyncrl clean`; still drop the tracker's entry
            resource_tracker.unregister(self._shm._name, "shared_memory")

    def __enter__(self) -> SlotRing:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
        if self.owner:
            self.unlink()

    def __del__(self):
        # SharedMemory.__del__ would unmap under live views; close() defers that safely.
        if hasattr(self, "_closed"):
            self.close()

    def __repr__(self) -> str:
        return f"SlotRing({self.name!r}, num_slots={self.num_slots}, owner={self.owner}, closed={self._closed})"


def _fence() -> None:
    """A full memory barrier, so that stores to the segment before it are visible to the other
    process before loads after it (x86 may otherwise let a load pass an earlier store). Taking a
    lock is an atomic read-modify-write, which orders memory on x86 and ARM alike."""
    with _FENCE:
        pass


_FENCE = threading.Lock()


class WriteGuard:
    """The writer's half of slot integrity for one rollout (see the module docstring).

    Call ``may_write()`` before writing a row and ``wrote()`` after it; both return False once the
    grant is no longer the slot's generation, and the writer must then stop writing. ``wrote()``
    then also records this grant as the slot's intruder, since the row it just wrote may have landed
    in another grant's rollout. ``revoked``: True once either returned False."""

    def __init__(self, control: np.ndarray, slot: int, grant_id: int):
        self._control, self.slot, self.grant_id, self.revoked = control, slot, grant_id, False

    def may_write(self) -> bool:
        if not self.revoked and int(self._control[self.slot, 0]) != self.grant_id:
            self.revoked = True
        return not self.revoked

    def wrote(self) -> bool:
        _fence()
        if int(self._control[self.slot, 0]) != self.grant_id:
            self._control[self.slot, 1] = self.grant_id
            self.revoked = True
        return not self.revoked


class _CloseWhenUnused:
    """Closes a SharedMemory once ``one_gone`` was called ``n`` times (once per dead view)."""

    def __init__(self, shm: SharedMemory, n: int):
        self.shm, self.n, self.lock = shm, n, threading.Lock()

    def one_gone(self) -> None:
        with self.lock:
            self.n -= 1
            if self.n == 0:
                self.shm.close()
