"""Shared-memory slot ring and the learner's slot ledger.

``SlotRing``: S slots of one ``RolloutSpec`` in ONE POSIX shared-memory segment named
``asyncrl-<run_id>-<pid of creator>`` (the name alone tells ``cleanup_stale`` whether its creator
still lives). Byte layout: a 64-byte header, a control block of 16 bytes per slot (padded to a
multiple of 64), then slot i at ``64 + control_nbytes + i * spec.slot_nbytes``::

    offset size  header field
    0      8     magic b"ASYNCRL2"
    8      8     num_slots            (uint64, little-endian)
    16     8     spec.slot_nbytes     (uint64)
    24     16    spec.layout_hash     (ASCII)
    40     16    token                (random; proves a client mapped this very segment)
    56     8     reserved, zero

    control block, slot i at 64 + 16 * i:
    0      8     generation: the grant id that may write the slot now, 0 for none (int64; the
                 learner writes it: at a grant, and 0 when the grant is reclaimed, voided or consumed)
    8      8     intruder: 0, or the grant id of a revoked writer that may have written into the
                 slot since the learner armed it (int64; written by that writer)

Slot integrity (``arm``, ``disarm``, ``intact``, ``WriteGuard``): a writer checks the generation
before and after writing each row of its rollout; once it is not its grant any more it stops, and
if it wrote since its last good check it records itself as the intruder. The learner trains on a
slot only if, after copying it, the generation is still the grant whose report it accepted and no
intruder is recorded. What it cannot see: a writer frozen between its last row write and its check
after it, and killed there (one row of one rollout, only after a freeze longer than the actor
timeout).

The creator owns the name (``unlink``); attached processes only map it.

``SlotLedger``: pure bookkeeping of which slot is free, granted to an actor, full, or being
consumed (monobeast's free/full queues, with grant ids so late or foreign reports are refused).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import secrets
import stat
import struct
import sys
import threading
import weakref
from collections import Counter, deque
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory
from typing import NamedTuple

import numpy as np

from asyncrl.core.spec import RolloutSpec

log = logging.getLogger(__name__)

PREFIX = "asyncrl-"
SHM_DIR = "/dev/shm"  # where Linux lists POSIX shared memory; cleanup scans it
HEADER_NBYTES = 64
TOKEN_NBYTES = 16
MAGIC = b"ASYNCRL2"  # 2: a control block (slot generations) follows the header
_HEADER = struct.Struct("<8sQQ16s16s8x")
assert _HEADER.size == HEADER_NBYTES
_RUN_ID = re.compile(r"[A-Za-z0-9_.-]{1,200}")


def control_nbytes(num_slots: int) -> int:
    """Bytes of the per-slot control block (16 per slot, padded to a multiple of 64)."""
    return (16 * num_slots + 63) // 64 * 64


def segment_nbytes(spec: RolloutSpec, num_slots: int) -> int:
    """Size of a ring's whole segment: header, control block, slots."""
    return HEADER_NBYTES + control_nbytes(num_slots) + num_slots * spec.slot_nbytes


class ShmError(RuntimeError):
    """A shared-memory segment is missing, of another layout, or not the one expected."""


class ShmSpaceError(ShmError):
    """/dev/shm has too little free space for a ring; the message gives both sizes and the fix."""


def free_bytes(directory: str = SHM_DIR) -> int:
    """Bytes an unprivileged process may still allocate in ``directory``'s filesystem."""
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def _space_message(nbytes: int, free: int, spec: RolloutSpec, num_slots: int) -> str:
    return (
        f"shared memory: the slot ring needs {nbytes:,} bytes ({num_slots} slots of {spec.slot_nbytes:,}) "
        f"but {SHM_DIR} has {free:,} free; free space there (`asyncrl clean`; in Docker: --shm-size), "
        f"or lower learner.num_slots, env.num_envs or env.rollout_length"
    )


def check_space(nbytes: int, spec: RolloutSpec, num_slots: int) -> None:
    """Raise ShmSpaceError unless ``SHM_DIR`` has ``nbytes`` free (the ring's segment_nbytes)."""
    try:
        free = free_bytes()
    except OSError:  # no /dev/shm to ask: creating the segment says what is wrong
        return
    if nbytes > free:
        raise ShmSpaceError(_space_message(nbytes, free, spec, num_slots))


class SlotRing:
    """S rollout slots in one shared-memory segment. Build with ``create`` or ``attach``.

    Used as a context manager it closes on exit, and the creator also unlinks.
    """

    def __init__(self, shm: SharedMemory, spec: RolloutSpec, num_slots: int, token: bytes, owner: bool):
        self._shm, self.spec, self.num_slots, self.token, self.owner = shm, spec, num_slots, token, owner
        self._views: dict[int, dict[str, np.ndarray]] = {}
        self._closed = self._unlinked = False
        # [S, 2] int64: (generation, intruder) of each slot; see the module docstring
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


def _hash(spec: RolloutSpec) -> bytes:
    return spec.layout_hash.encode("ascii")[:16]


def _check_header(shm: SharedMemory, spec: RolloutSpec, num_slots: int, token: bytes | None) -> bytes:
    """Validate the header against what the caller expects; return the segment's token."""
    if shm.size < HEADER_NBYTES:
        raise ShmError(f"{shm.name}: {shm.size} bytes, too small for an asyncrl header")
    (
        magic,
        n,
        slot_nbytes,
        layout,
        found,
    ) = _HEADER.unpack_from(shm.buf, 0)
    if magic != MAGIC:
        raise ShmError(f"{shm.name}: not an asyncrl slot ring (magic {magic!r})")
    if n != num_slots:
        raise ShmError(f"{shm.name}: has {n} slots, expected {num_slots}")
    if layout != _hash(spec) or slot_nbytes != spec.slot_nbytes:
        raise ShmError(
            f"{shm.name}: rollout layout {layout!r} differs from this process's {_hash(spec)!r} (different RolloutSpec)"
        )
    if shm.size < segment_nbytes(spec, n):
        raise ShmError(f"{shm.name}: {shm.size} bytes, expected {segment_nbytes(spec, n)}")
    if token is not None and token != found:
        raise ShmError(f"{shm.name}: token differs: another segment of the same name")
    return found


_register_lock = threading.Lock()


def _open_untracked(name: str) -> SharedMemory:
    """Attach without registering the segment with this process's resource tracker."""
    if sys.version_info >= (3, 13):
        return SharedMemory(name=name, track=False)
    # Python 3.11/3.12 register every attach, and the tracker unlinks registered segments when
    # this process exits (cpython#82300): the learner's ring would vanish with the first actor
    # that quits. Unregistering after the fact is the usual fix, but a multiprocessing child
    # shares its parent's tracker, so that would also erase the creator's entry (and make the
    # creator's unlink print a KeyError from the tracker). So skip just this one registration.
    register = resource_tracker.register

    def register_others(rname: str, rtype: str) -> None:
        if rtype != "shared_memory" or rname.lstrip("/") != name.lstrip("/"):
            register(rname, rtype)

    with _register_lock:
        resource_tracker.register = register_others
        try:
            return SharedMemory(name=name)
        finally:
            resource_tracker.register = register


def _create_exclusive(run_id: str, nbytes: int, tries: int = 8) -> SharedMemory:
    """A new segment (O_CREAT | O_EXCL: never one that exists, nor a symlink) of ``nbytes`` for
    ``run_id``: the plain name first, then names with a random part ("+" is outside the run id's
    characters, so ``remove_run`` cannot confuse runs). Raises ShmError after ``tries`` names."""
    pid = os.getpid()
    names = [f"{PREFIX}{run_id}-{pid}"] + [f"{PREFIX}{run_id}+{secrets.token_hex(4)}-{pid}" for _ in range(tries - 1)]
    for name in names:
        try:
            return SharedMemory(name=name, create=True, size=nbytes)
        except FileExistsError:
            log.warning(
                "shared-memory name %s is taken (a stale segment, or a file another process put in %s); trying another",
                name,
                SHM_DIR,
            )
    raise ShmError(f"no free shared-memory name for run {run_id!r} after {tries} tries (last {names[-1]!r})")


# ---------------------------------------------------------------------------------- cleanup

# /dev/shm is world-writable: any local user can put any name there (a 20-digit "pid", a
# directory, a symlink, a file of its own). Clean-up acts only on regular files of this user whose
# name ends in a pid this kernel could have given (1..MAX_PID), and never raises for a name.
MAX_PID = 2**22  # Linux's PID_MAX_LIMIT


def _creator_pid(name: str, prefix: str) -> int | None:
    """pid at the end of ``<prefix>...-<pid>`` (1..MAX_PID), or None if the name is not of that form."""
    if not name.startswith(prefix):
        return None
    tail = name.rpartition("-")[2]
    if not re.fullmatch(r"[1-9][0-9]{0,6}", tail):
        return None
    return int(tail) if int(tail) <= MAX_PID else None


def _alive(pid: int) -> bool:
    """True unless no process of ``pid`` exists here (a pid it cannot judge counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError, ValueError):  # another user's (EPERM), or not a pid: not ours to judge
        return True
    return True


def _ours(name: str) -> bool:
    """True if ``SHM_DIR/name`` is a regular file (not a symlink, not a directory) of this user."""
    try:
        st = os.lstat(os.path.join(SHM_DIR, name))
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()


def _unlink_names(names: list[str]) -> list[str]:
    """Unlink each of ``names`` in SHM_DIR that is ours (``_ours``); returns those removed. A name
    that cannot be removed (gone, not permitted) is logged and skipped, never raised."""
    removed = []
    for name in names:
        if not _ours(name):
            continue
        try:
            os.unlink(os.path.join(SHM_DIR, name))
        except FileNotFoundError:  # someone else cleaned it first
            continue
        except OSError as exc:
            log.warning(
                "could not remove shared-memory segment %s: %s", name.encode("unicode_escape").decode(), exc.strerror
            )
            continue
        removed.append(name)
        log.info("removed shared-memory segment %s", name)
    return removed


def _listing() -> list[str]:
    try:
        return sorted(os.listdir(SHM_DIR))
    except OSError:  # no /dev/shm here (or not readable): nothing to clean
        return []


def cleanup_stale(prefix: str = PREFIX) -> list[str]:
    """Unlink segments ``<prefix>...-<pid>`` in /dev/shm whose creator pid is no longer alive:
    regular files of this user only, whatever else the folder holds (never raises for a name).

    Returns the names removed. Assumes the creators ran in this pid namespace (a pid reused by
    an unrelated live process keeps its segment: safe, merely not cleaned).
    """
    stale = [n for n in _listing() if (pid := _creator_pid(n, prefix)) is not None and not _alive(pid)]
    return _unlink_names(stale)


def run_segment_pattern(run_id: str) -> re.Pattern:
    """The names of ``run_id``'s segments: ``asyncrl-<run_id>-<pid>`` or, when that name was taken,
    ``asyncrl-<run_id>+<8 hex>-<pid>`` (``SlotRing.create``)."""
    return re.compile(re.escape(f"{PREFIX}{run_id}") + r"(\+[0-9a-f]{8})?-[0-9]+")


def remove_run(run_id: str) -> list[str]:
    """Unlink every segment of ``run_id`` (``run_segment_pattern``) of this user, live creator or not.

    Returns the names removed. Processes that mapped them keep their mappings until they close.
    """
    exact = run_segment_pattern(run_id)
    return _unlink_names([n for n in _listing() if exact.fullmatch(n)])


# ---------------------------------------------------------------------------------- ledger


class Grant(NamedTuple):
    slot: int
    grant_id: int


class SlotLedger:
    """The learner's record of every slot's state. Pure Python, no shared memory.

    free --grant--> granted --complete--> full --pop_full--> consuming --release--> free,
    and granted --reclaim--> free when the actor died. Every transition checks the current state,
    so a slot is never consumed twice nor while an actor may still be writing it. grant_ids are
    never reused, so a completion for a reclaimed grant is refused even once the slot is granted
    again. Slots an actor completed before dying stay full: their data is valid.
    ``counters`` counts grants, backpressure (grant found no free slot), completed, refused,
    reclaimed, consumed and released.
    """

    def __init__(self, num_slots: int):
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.num_slots = num_slots
        self._free: deque[int] = deque(range(num_slots))
        self._granted: dict[int, tuple[str, int]] = {}  # slot -> (actor_id, grant_id)
        self._full: deque[int] = deque()  # completion order
        self._consuming: set[int] = set()
        self._next_grant_id = 1
        self.counters: Counter[str] = Counter()

    def grant(self, actor_id: str) -> Grant | None:
        """Grant the longest-free slot to ``actor_id``; None when no slot is free (backpressure)."""
        if not self._free:
            self.counters["backpressure"] += 1
            return None
        slot, grant_id = self._free.popleft(), self._next_grant_id
        self._next_grant_id += 1
        self._granted[slot] = (actor_id, grant_id)
        self.counters["grants"] += 1
        return Grant(slot, grant_id)

    def complete(self, actor_id: str, slot: int, grant_id: int) -> bool:
        """Mark ``slot`` full. True only if it is currently granted to ``actor_id`` under
        ``grant_id``; a duplicate, stale or foreign completion returns False and changes nothing."""
        if self._granted.get(slot) != (actor_id, grant_id):
            self.counters["refused"] += 1
            return False
        del self._granted[slot]
        self._full.append(slot)
        self.counters["completed"] += 1
        return True

    def void(self, actor_id: str, slot: int, grant_id: int) -> bool:
        """Return a granted slot to the free queue without consuming it (its report was rejected).
        True only if it is currently granted to ``actor_id`` under ``grant_id``."""
        if self._granted.get(slot) != (actor_id, grant_id):
            return False
        del self._granted[slot]
        self._free.append(slot)
        self.counters["voided"] += 1
        return True

    def full(self) -> tuple[int, ...]:
        """Completed slots not yet taken, oldest completion first."""
        return tuple(self._full)

    def pop_full(self, n: int) -> list[int]:
        """Take the ``n`` oldest full slots for consumption; ``release`` each after copying it out.

        Raises ValueError if fewer than ``n`` are full (a batch is never silently short).
        """
        if not 0 <= n <= len(self._full):
            raise ValueError(f"asked for {n} full slots, {len(self._full)} are full")
        slots = [self._full.popleft() for _ in range(n)]
        self._consuming.update(slots)
        self.counters["consumed"] += n
        return slots

    def release(self, slot: int) -> None:
        """Return a consumed slot to the free queue; ValueError if it is not being consumed."""
        if slot not in self._consuming:
            raise ValueError(f"slot {slot} is not being consumed; cannot release it")
        self._consuming.remove(slot)
        self._free.append(slot)
        self.counters["released"] += 1

    def reclaim(self, actor_id: str) -> list[int]:
        """Free every slot granted to ``actor_id`` (it died); returns them. Its grants are void."""
        slots = [s for s, (a, _) in self._granted.items() if a == actor_id]
        for s in slots:
            del self._granted[s]
            self._free.append(s)
        self.counters["reclaimed"] += len(slots)
        return slots

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_granted(self) -> int:
        return len(self._granted)

    @property
    def num_full(self) -> int:
        return len(self._full)

    @property
    def num_consuming(self) -> int:
        return len(self._consuming)

    def granted_to(self, actor_id: str) -> list[Grant]:
        """The grants ``actor_id`` currently holds."""
        return [Grant(s, g) for s, (a, g) in self._granted.items() if a == actor_id]
