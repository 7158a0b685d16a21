"""Upper bounds on the memory a peer can make a role hold, computed before a run from the config,
the slot layout, the weights size and the socket caps.

``memory_bound_bytes`` gives the extra resident memory (RSS, bytes) the learner or the broadcaster
may reach under attack, above what it holds once started: each term is one thing a peer can make
the role buffer or remember, at its cap. ``bench/fuzz.py`` prints it beside the RSS it measures;
``tests/integration/test_hostile_resources.py`` asserts that the measured RSS stays under it.

What the bound does not cover (see docs/multi-host.md, trust model): libzmq hands a multipart
message to the application only once its last frame arrived, and its ZMQ_MAXMSGSIZE limits each
frame, not their number, so a peer that sends frames with the MORE flag for ever makes the
receiving socket buffer them without limit (about 64 bytes of RSS per 3-byte frame on the wire,
measured with libzmq 4.3.5). No socket option of libzmq bounds it. The bound therefore takes the
frames of one message an attacker sends as an input, ``frames_per_message`` (default: the most a
legal message of the protocol has); only peers past the handshake (an allowed CURVE key, or a
process of the same user on an ipc endpoint) can send frames at all.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from asyncrl.wire import codec, protocol, sockets

MSG_OVERHEAD = 64  # bytes libzmq keeps per frame besides its data (one zmq_msg_t)
PER_CONNECTION = 256 * 1024  # bytes per accepted connection: session, engine, pipes, 8 KiB I/O
# buffers, CURVE state (measured: under 100 KiB on libzmq 4.3.5)
ALLOCATOR_SLACK = 48 * 1024 * 1024  # glibc arenas of the I/O and main threads: freed memory is not
# always given back, so RSS keeps a high-water mark of ~this
RECORD_BYTES = 2 * codec.MAX_STR_BYTES + 1024  # one per-actor-id record: id and host strings (<= 4 KiB
# each on the wire) plus the dict entries and objects
REJECT_KEY_BYTES = 2 * 64 * 4 + 256  # one (reason, sender) key of a RejectCounter (64
# characters each, escaped) plus its Counter entry
REJECT_KEYS = 4096  # RejectCounter.max_keys (rejects.py)


class Bound(NamedTuple):
    """``total``: bytes; ``terms``: {name: bytes}, what each cap contributes (they sum to total)."""

    total: int
    terms: dict[str, int]

    def describe(self) -> str:
        """One line: the total and each term in MiB."""
        mib = 1 << 20
        return f"{self.total / mib:.1f} MiB = " + " + ".join(f"{k} {v / mib:.1f}" for k, v in self.terms.items())


def _message_term(hwm: int, frames_per_message: int, max_frame: int, frame_bytes: int | None) -> int:
    """Bytes one connection's receive side holds: ``hwm`` complete messages in the pipe, plus one
    being decoded and one held by the engine once the pipe is full, of ``frames_per_message``
    frames of at most ``frame_bytes`` (if given, else ``max_frame``: ZMQ_MAXMSGSIZE) bytes each."""
    size = max_frame if frame_bytes is None else min(int(frame_bytes), max_frame)
    return (hwm + 2) * frames_per_message * (size + MSG_OVERHEAD)


def learner_max_frame(spec) -> int:
    """The learner ROUTER's ZMQ_MAXMSGSIZE (bytes): a report's header limit or one slot field."""
    limits = protocol.report_limits(spec.num_envs, spec.rollout_length)
    return max(limits.max_bytes, *(int(np.prod(f.shape)) * f.dtype.itemsize for f in spec.fields))


def memory_bound_bytes(
    role: str,
    *,
    spec=None,
    num_slots: int = 0,
    weights_bytes: int = 0,
    connections: int,
    frames_per_message: int | None = None,
    frame_bytes: int | None = None,
) -> Bound:
    """The most extra RSS (bytes) a ``role`` ("learner" or "broadcaster") may reach under attack.

    Args:
        role: "learner" (needs ``spec``, its slot layout, and ``num_slots``, config
            learner.num_slots) or "broadcaster" (needs ``weights_bytes``: the payload of one weights
            message, parameters x bytes per element of the wire dtype, ``Task.weights_info().nbytes``,
            e.g. 0.99 GB for a 0.5B model in bfloat16; also the broadcaster's per-frame limit).
        connections: the most connections peers hold open at once. The role's RLIMIT_NOFILE caps it
            (one file descriptor each); nothing else does.
        frames_per_message: the most frames of one message a peer sends. libzmq does not cap it
            (module docstring); default: the protocol's largest legal message (a rollout: header
            plus one frame per slot field for the learner; a signed weights message, 4 frames, for
            the broadcaster).
        frame_bytes: the largest frame of those messages, if less than the socket's ZMQ_MAXMSGSIZE
            (e.g. 1 for a message of many one-byte frames); default: ZMQ_MAXMSGSIZE.

    Terms (bytes), learner:
        ring: num_slots x slot bytes (the shared-memory segment, resident once written).
        copies: num_slots x slot bytes (slots copied out of the ring, not yet trained on).
        receive: connections x (ROUTER_HWM + 2) x frames x (frame bytes + 64); frame bytes at most
            ZMQ_MAXMSGSIZE (``learner_max_frame``).
        send: connections x ROUTER_HWM x 64 KiB (replies are headers of at most 64 KiB).
        connections: connections x 256 KiB (libzmq's per-connection objects).
        records: (connections x MAX_IDS_PER_CONNECTION + MAX_UNDELIVERED_IDS + MAX_DEPARTED_IDS) x 9 KiB
            (per-actor-id records of live ids, of ids that never delivered and of ids that left).
        rejects: 4096 keys x 768 B (the reject counter and the refused-connection counter each).
        allocator: 48 MiB of allocator high-water slack.
    Broadcaster:
        weights: 2 x weights_bytes (the held weights and the next ones while they are taken).
        replies: connections x ROUTER_HWM x weights_bytes (snapshot replies share the held buffer, but
            a reply queued before newer weights arrive keeps the older buffer alive).
        subscribers: connections x weights_hwm(weights_bytes) x weights_bytes (versions published
            while a subscriber does not read stay alive in its PUB queue, 2 to 8 messages:
            ``sockets.weights_hwm``; the queues share each version's one buffer).
        receive: connections x (ROUTER_HWM + 2) x frames x (frame bytes + 64); frame bytes at most
            max(weights_bytes, 64 KiB) (``broadcaster.weights_frame_limit``).
        connections, rejects, allocator: as for the learner.

    Raises ValueError for another role, a learner bound without ``spec``, or negative counts.
    """
    if connections < 0 or num_slots < 0 or weights_bytes < 0:
        raise ValueError("connections, num_slots and weights_bytes must be >= 0")
    terms: dict[str, int] = {}
    if role == "learner":
        from asyncrl.roles.learner_peers import (
            MAX_DEPARTED_IDS,
            MAX_IDS_PER_CONNECTION,
            MAX_UNDELIVERED_IDS,
            ROUTER_HWM,
        )

        if spec is None:
            raise ValueError("a learner bound needs the slot layout (spec)")
        frames = frames_per_message or 1 + len(spec.fields)
        terms["ring"] = num_slots * spec.slot_nbytes
        terms["copies"] = num_slots * spec.slot_nbytes
        terms["receive"] = connections * _message_term(ROUTER_HWM, frames, learner_max_frame(spec), frame_bytes)
        terms["send"] = connections * ROUTER_HWM * protocol.MAX_HEADER_BYTES
        terms["records"] = (
            connections * MAX_IDS_PER_CONNECTION + MAX_UNDELIVERED_IDS + MAX_DEPARTED_IDS
        ) * RECORD_BYTES
    elif role == "broadcaster":
        from asyncrl.roles.broadcaster import ROUTER_HWM, weights_frame_limit

        frames = frames_per_message or 4
        terms["weights"] = 2 * weights_bytes
        terms["replies"] = connections * ROUTER_HWM * weights_bytes
        terms["subscribers"] = connections * sockets.weights_hwm(weights_bytes) * weights_bytes
        terms["receive"] = connections * _message_term(
            ROUTER_HWM, frames, weights_frame_limit(weights_bytes), frame_bytes
        )
    else:
        raise ValueError(f"role must be 'learner' or 'broadcaster', not {role!r}")
    terms["connections"] = connections * PER_CONNECTION
    terms["rejects"] = 2 * REJECT_KEYS * REJECT_KEY_BYTES
    terms["allocator"] = ALLOCATOR_SLACK
    return Bound(sum(terms.values()), terms)
