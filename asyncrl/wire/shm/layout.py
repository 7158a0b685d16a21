"""The byte layout of a slot ring's shared-memory segment, and the check of a segment's header.

A 64-byte header, a control block of 16 bytes per slot (padded to a multiple of 64), then slot i at
``64 + control_nbytes + i * spec.slot_nbytes``::

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

``asyncrl.wire.shm.ring`` reads and writes the control block (slot integrity).
"""

from __future__ import annotations

import struct
from multiprocessing.shared_memory import SharedMemory

from asyncrl.core.spec import RolloutSpec

HEADER_NBYTES = 64
TOKEN_NBYTES = 16
MAGIC = b"ASYNCRL2"  # 2: a control block (slot generations) follows the header
_HEADER = struct.Struct("<8sQQ16s16s8x")
assert _HEADER.size == HEADER_NBYTES


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
