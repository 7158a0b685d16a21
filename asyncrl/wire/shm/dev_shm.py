"""/dev/shm: its free space, the names of asyncrl's segments and their clean-up.

A ring's segment is named ``asyncrl-<run_id>-<pid of creator>`` (the name alone tells
``cleanup_stale`` whether its creator still lives), or ``asyncrl-<run_id>+<8 hex>-<pid>`` when that
name is taken (``_create_exclusive``). ``_open_untracked`` attaches to a segment without this
process's resource tracker, so that exiting never removes it. ``cleanup_stale`` removes segments of
dead creators, ``remove_run`` every segment of one run.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import stat
import sys
import threading
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory

from asyncrl.core.spec import RolloutSpec
from asyncrl.wire.shm.layout import ShmError, ShmSpaceError

log = logging.getLogger(__package__)  # "asyncrl.wire.shm", the logger of these lines before the split

PREFIX = "asyncrl-"
SHM_DIR = "/dev/shm"  # where Linux lists POSIX shared memory; cleanup scans it
_RUN_ID = re.compile(r"[A-Za-z0-9_.-]{1,200}")


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


def _unlink_names(names: list[str], *, dry_run: bool = False) -> list[str]:
    """Unlink each of ``names`` in SHM_DIR that is ours (``_ours``); returns those removed (with
    ``dry_run``: those it would remove, removing nothing). A name that cannot be removed (gone, not
    permitted) is logged and skipped, never raised."""
    removed = []
    for name in names:
        if not _ours(name):
            continue
        if dry_run:
            removed.append(name)
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


def cleanup_stale(prefix: str = PREFIX, *, dry_run: bool = False) -> list[str]:
    """Unlink segments ``<prefix>...-<pid>`` in /dev/shm whose creator pid is no longer alive:
    regular files of this user only, whatever else the folder holds (never raises for a name).

    Returns the names removed (``dry_run``: the names it would remove; nothing is removed).
    Assumes the creators ran in this pid namespace (a pid reused by
    an unrelated live process keeps its segment: safe, merely not cleaned).
    """
    stale = [n for n in _listing() if (pid := _creator_pid(n, prefix)) is not None and not _alive(pid)]
    return _unlink_names(stale, dry_run=dry_run)


def run_segment_pattern(run_id: str) -> re.Pattern:
    """The names of ``run_id``'s segments: ``asyncrl-<run_id>-<pid>`` or, when that name was taken,
    ``asyncrl-<run_id>+<8 hex>-<pid>`` (``SlotRing.create``)."""
    return re.compile(re.escape(f"{PREFIX}{run_id}") + r"(\+[0-9a-f]{8})?-[0-9]+")


def remove_run(run_id: str, *, dry_run: bool = False) -> list[str]:
    """Unlink every segment of ``run_id`` (``run_segment_pattern``) of this user, live creator or not.

    Returns the names removed (``dry_run``: the names it would remove; nothing is removed).
    Processes that mapped them keep their mappings until they close.
    """
    exact = run_segment_pattern(run_id)
    return _unlink_names([n for n in _listing() if exact.fullmatch(n)], dry_run=dry_run)
