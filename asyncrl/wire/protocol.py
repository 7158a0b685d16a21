"""The wire protocol's rules: its version, the header schema of every message type (``SCHEMAS``,
``OPTIONAL``), how large a header may be (``HeaderLimits``, ``report_limits``), the magnitude
bounds of every number a peer sends, and the check of a decoded header (``validate_header``).

Bad input raises ``ProtocolError`` whose ``reason`` is a short stable code for counting (see
``rejects.RejectCounter``). How headers and arrays become frames: ``codec.py``.
"""

from __future__ import annotations

import math
from typing import NamedTuple, get_args, get_origin

from asyncrl.core.spec import MAX_ABS_FLOAT as _MAX_ABS_FLOAT

# 2: welcome carries "restart"; 3: learner epoch, per-actor tokens, "rejoin", signed weights; 4: weights
# dtype, version pings ("weights_version"), the broadcaster's "weights_status", snapshot requests saying what
# the asker holds
PROTOCOL_VERSION = 4
MAX_HEADER_BYTES = 64 * 1024
GRANT_CREDITS = 2  # slot grants an actor asks for at the start (then one per report): the most it holds
SNAPSHOT_INTERVAL_S = 0.2  # a broadcaster answers one snapshot request per connection per this many seconds
WEIGHTS_TOPIC = b"weights"
VERSION_TOPIC = b"version"  # a version ping: [topic, header] on PUB, [topic, header, HMAC] from the learner
# Element types of a weights payload (header "dtype"): numpy has no bfloat16, so a bfloat16 payload is
# carried as its raw 16-bit patterns (uint16), the upper half of each float32.
WEIGHTS_DTYPES = ("float32", "float16", "bfloat16")


class ProtocolError(ValueError):
    """A message that does not follow the protocol. ``reason``: a short code such as "schema",
    "run_id", "proto", "frame_count", "frame_size", "nonfinite", "checksum". ``ahead``: for a slot
    refused for a behaviour version above the learner's (reason "version"), that version, which the
    learner tells the actor in ``slot_refused``; None otherwise."""

    def __init__(self, reason: str, detail: str = "", *, ahead: int | None = None):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.ahead = ahead


# ---------------------------------------------------------------------------- header schemas

_COMMON = {"type": str, "proto": int, "run_id": str}
_REPORT = {
    "actor_id": str,
    "grant_id": int,
    "env_steps": int,
    "episode_returns": list[float],
    "episode_lengths": list[int],
    "timing": dict,
}  # actor seconds since its last report: env_s, inference_s, wait_s

# Every actor message after the hello carries "token", the per-actor token of its welcome: an
# actor id is bound to it (a peer that merely knows the id can neither speak nor say bye for it).
_ACTOR = {"actor_id": str, "token": bytes}
_REPORT = {**_ACTOR, **{k: v for k, v in _REPORT.items() if k != "actor_id"}}

SCHEMAS: dict[str, dict[str, object]] = {
    # actor -> learner
    "hello": {
        "actor_id": str,
        "host": str,
        "pid": int,
        "env_id": str,
        "spec": dict,
        "shm_token": bytes | None,
        "token": bytes | None,
    },  # the token of an earlier welcome: proves a restart is that actor
    "request": _ACTOR,  # ask for one slot grant
    "ready": {**_REPORT, "slot": int},  # the granted slot was written through shared memory
    "rollout": _REPORT,  # followed by one raw frame per spec field, in spec order
    "heartbeat": _ACTOR,  # (also the learner's answer, echoing the token)
    "bye": _ACTOR,
    # learner -> actor
    "welcome": {
        "shm_name": str,
        "num_slots": int,
        "spec": dict,
        "token": bytes,
        "config": str,  # the learner's resolved config, JSON: actors build the same policy
        "restart": int,  # times this actor id joined the run before: a seed input (seeding.py)
        "epoch": int,  # the learner's epoch (weights of other epochs are not this learner's)
        "actor_token": bytes,
    },  # this actor's token: sent with every message, kept for a restart
    # learner -> actor: "I do not know you (any more)": a restarted learner, or one that dropped
    # this actor; the actor drops the work of its old session and says hello again
    "rejoin": {"reason": str},
    # actor -> broadcaster: send me the newest weights now (PUB/SUB drops what came before)
    "snapshot": {"actor_id": str},
    # the (learner epoch, policy version) of the newest weights, without them: the learner's signed ping
    # while it has no new version; the broadcaster's ping on PUB (every second while it holds weights); and
    # its answer to a snapshot request from a peer that holds them already ("you have the newest")
    "weights_version": {"epoch": int, "version": int, "nbytes": int},  # nbytes: that version's payload
    # broadcaster -> learner, the answer to its ping: whether it wants the full weights (it holds an older
    # version, or none) and the largest payload it takes (bytes, ZMQ_MAXMSGSIZE of its sockets)
    "weights_status": {"wanted": bool, "max_bytes": int},
    "refuse": {"reason": str},
    "grant": {"slot": int, "grant_id": int},
    # learner -> actor: its report was refused for the slot's one behaviour version ``behavior_version``,
    # above the learner's own ``version`` (the actor drops the versions from it up: a forged weights
    # message; asyncrl.roles.actor_weights); older actors ignore it
    "slot_refused": {"grant_id": int, "reason": str, "version": int, "behavior_version": int},
    "stop": {"reason": str},
    # learner -> broadcaster -> actors (frame 1 of a weights message)
    "weights": {
        "epoch": int,
        "version": int,
        "publish_time": float,
        "nbytes": int,
        "checksum": int,
        "layout_hash": str,
        "dtype": str,  # one of WEIGHTS_DTYPES
    },  # newer = higher (epoch, version): see roles/learner.learner_epoch
}
# Keys a sender may leave out (older or hand-made clients); checked like the others when present.
OPTIONAL: dict[str, dict[str, object]] = {
    "hello": {"spaces": dict},  # {"observation": ..., "action": ...}: envs.describe_spaces
    "snapshot": {"epoch": int, "version": int},  # the newest weights the asker holds (answered by a version ping)
}


class HeaderLimits(NamedTuple):
    """How large a header one channel takes: bytes of its frame, items of any one list."""

    max_bytes: int = MAX_HEADER_BYTES
    max_array_len: int = 16384


DEFAULT_LIMITS = HeaderLimits()
_BYTES_PER_EPISODE = 18  # a report's msgpack float64 return (9 bytes) and int length (<= 9 bytes)


def report_limits(num_envs: int, rollout_length: int) -> HeaderLimits:
    """Limits of the actor -> learner channel for rollouts of E = ``num_envs`` envs x T =
    ``rollout_length`` steps. A rollout ends at most E * T episodes, each a return and a length in
    its report, so the 64 KiB of the other headers grow by 18 bytes per possible episode: no legal
    config can make a report the learner refuses (e.g. 64 envs of 1-step episodes)."""
    episodes = num_envs * rollout_length
    return HeaderLimits(MAX_HEADER_BYTES + _BYTES_PER_EPISODE * episodes, max(DEFAULT_LIMITS.max_array_len, episodes))


# Magnitude bounds of every number a peer sends (a value that fits the type
# but not the run, e.g. a pid of 2**40 or an env-step count of 2**63, must never reach the code
# that acts on it). Ints are 0..MAX_INT (an int64: what numpy, torch and TensorBoard take) unless
# INT_BOUNDS says less; floats are finite with |x| <= MAX_ABS_FLOAT (so +-3e38 is refused: it
# overflows float32 arithmetic downstream). Bounds that depend on the run (slot index, env steps,
# episode counts) are checked by the role that knows the run (roles/learner.py).
MAX_INT = 2**63 - 1
MAX_ABS_FLOAT = _MAX_ABS_FLOAT  # slots are held to the same bound (asyncrl.core.slot_checks.check_slot)
MAX_PID = 2**22  # Linux's largest pid_max (PID_MAX_LIMIT); pids are >= 1
INT_BOUNDS: dict[str, tuple[int, int]] = {"pid": (1, MAX_PID)}


def _valid(value, kind, key: str = "") -> bool:
    """Type check plus sanity: bools only where the schema says bool; ints in INT_BOUNDS[key] (default
    0..MAX_INT; no bools), floats finite with |x| <= MAX_ABS_FLOAT, dicts flat with str keys and values of
    those kinds."""
    if get_origin(kind) is list:
        (item,) = get_args(kind)
        return isinstance(value, list) and all(_valid(v, item, key) for v in value)
    if kind is bool:
        return isinstance(value, bool)
    if isinstance(value, bool) or not isinstance(value, kind):
        return False
    if isinstance(value, int):
        low, high = INT_BOUNDS.get(key, (0, MAX_INT))
        return low <= value <= high
    if isinstance(value, float):
        return math.isfinite(value) and abs(value) <= MAX_ABS_FLOAT
    if isinstance(value, dict):
        return all(
            isinstance(k, str) and (isinstance(v, (bool, str)) or type(v) in (int, float) and _valid(v, type(v)))
            for k, v in value.items()
        )
    return True


def validate_header(header, *, run_id: str | None = None) -> dict:
    """Check a decoded header against its schema; returns it. Raises ProtocolError."""
    if not isinstance(header, dict):
        raise ProtocolError("malformed", f"header is a {type(header).__name__}, not a map")
    kind = header.get("type")
    if not isinstance(kind, str) or kind not in SCHEMAS:
        raise ProtocolError("unknown_type", f"{kind!r}")
    proto = header.get("proto")
    if type(proto) is not int or proto != PROTOCOL_VERSION:
        raise ProtocolError("proto", f"{kind}: protocol {proto!r}, this side speaks {PROTOCOL_VERSION}")
    if run_id is not None and header.get("run_id") != run_id:
        raise ProtocolError("run_id", f"{kind}: run {header.get('run_id')!r}, expected {run_id!r}")
    schema = {**_COMMON, **SCHEMAS[kind]}
    if missing := schema.keys() - header.keys():
        raise ProtocolError("schema", f"{kind}: missing {sorted(missing)}")
    optional = OPTIONAL.get(kind, {})
    if extra := header.keys() - schema.keys() - optional.keys():
        raise ProtocolError("schema", f"{kind}: unexpected keys {sorted(map(repr, extra))}")
    schema.update({k: v for k, v in optional.items() if k in header})
    for key, expected in schema.items():
        if not _valid(header[key], expected, key):
            name = expected.__name__ if isinstance(expected, type) else str(expected)
            raise ProtocolError("schema", f"{kind}.{key}: {header[key]!r:.80} is not a valid {name}")
    return header
