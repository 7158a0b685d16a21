"""Wire format and sockets: the only module that imports zmq.

A message is multipart: frame 0 a msgpack header (a map with str keys, at most 64 KiB; an actor's
reports more, by ``report_limits``), then raw array frames (rollouts only). Weights travel as
``[b"weights", header, payload]`` on PUB/SUB; the learner adds a fourth frame, an HMAC the
broadcaster checks (``sign_weights``).
Everything received is validated here; nothing is ever unpickled. Bad input raises
``ProtocolError`` whose ``reason`` is a short stable code for counting (see ``RejectCounter``).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import secrets
import threading
import time
import weakref
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple, get_args, get_origin

import msgpack
import numpy as np
import zmq
from zmq.utils.monitor import parse_monitor_message

from asyncrl.core.limits import (
    MAX_STR_BYTES,  # of any one string in a header (config.validate keeps the welcome's config under it)
)
from asyncrl.core.spec import RolloutSpec

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 3  # 2: welcome carries "restart"; 3: learner epoch, per-actor tokens, "rejoin", signed weights
MAX_HEADER_BYTES = 64 * 1024
GRANT_CREDITS = 2  # slot grants an actor asks for at the start (then one per report): the most it holds
WEIGHTS_TOPIC = b"weights"
DEFAULT_TIMEOUT_MS = 5000


class AddressError(OSError):
    """An endpoint that cannot be bound or connected to; the message names it and says why."""


class ProtocolError(ValueError):
    """A message that does not follow the protocol. ``reason``: a short code such as "schema",
    "run_id", "proto", "frame_count", "frame_size", "nonfinite", "checksum"."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


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
    "refuse": {"reason": str},
    "grant": {"slot": int, "grant_id": int},
    "stop": {"reason": str},
    # learner -> broadcaster -> actors (frame 1 of a weights message)
    "weights": {
        "epoch": int,
        "version": int,
        "publish_time": float,
        "nbytes": int,
        "checksum": int,
        "layout_hash": str,
    },  # newer = higher (epoch, version): see roles/learner.learner_epoch
}
# Keys a sender may leave out (older or hand-made clients); checked like the others when present.
OPTIONAL: dict[str, dict[str, object]] = {
    "hello": {"spaces": dict},  # {"observation": ..., "action": ...}: envs.describe_spaces
}
_UNPACK_LIMITS = dict(max_str_len=MAX_STR_BYTES, max_bin_len=4096, max_map_len=64, max_ext_len=0)


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


# Magnitude bounds of every number a peer sends (class fix of issue 39: a value that fits the type
# but not the run, e.g. a pid of 2**40 or an env-step count of 2**63, must never reach the code
# that acts on it). Ints are 0..MAX_INT (an int64: what numpy, torch and TensorBoard take) unless
# INT_BOUNDS says less; floats are finite with |x| <= MAX_ABS_FLOAT (so +-3e38 is refused: it
# overflows float32 arithmetic downstream). Bounds that depend on the run (slot index, env steps,
# episode counts) are checked by the role that knows the run (roles/learner.py).
MAX_INT = 2**63 - 1
MAX_ABS_FLOAT = 1e15
MAX_PID = 2**22  # Linux's largest pid_max (PID_MAX_LIMIT); pids are >= 1
INT_BOUNDS: dict[str, tuple[int, int]] = {"pid": (1, MAX_PID)}


def _valid(value, kind, key: str = "") -> bool:
    """Type check plus sanity: ints in INT_BOUNDS[key] (default 0..MAX_INT; no bools), floats
    finite with |x| <= MAX_ABS_FLOAT, dicts flat with str keys and values of those kinds."""
    if get_origin(kind) is list:
        (item,) = get_args(kind)
        return isinstance(value, list) and all(_valid(v, item, key) for v in value)
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


def _np_scalar(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot encode {type(obj).__name__} in a header")


def _unpack_header(frame, run_id: str | None, limits: HeaderLimits = DEFAULT_LIMITS) -> dict:
    buf = _bytes(frame)
    if buf.nbytes > limits.max_bytes:
        raise ProtocolError("oversized", f"header frame of {buf.nbytes} bytes > {limits.max_bytes}")
    try:
        header = msgpack.unpackb(
            buf, raw=False, strict_map_key=True, max_array_len=limits.max_array_len, **_UNPACK_LIMITS
        )
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise ProtocolError("malformed", f"header is not valid msgpack ({e})") from None
    return validate_header(header, run_id=run_id)


def peek(frame) -> dict:
    """The raw map of a header frame, unvalidated (e.g. the ``type`` and ``proto`` of a message
    ``decode`` refused, to answer a hello of another protocol version); {} if unreadable."""
    try:
        buf = _bytes(frame)
        if buf.nbytes > MAX_HEADER_BYTES:
            return {}
        header = msgpack.unpackb(
            buf, raw=False, strict_map_key=True, max_array_len=DEFAULT_LIMITS.max_array_len, **_UNPACK_LIMITS
        )
    except (ValueError, TypeError, msgpack.UnpackException):  # ProtocolError is a ValueError
        return {}
    return header if isinstance(header, dict) else {}


def _pack_header(header: dict, limits: HeaderLimits = DEFAULT_LIMITS) -> bytes:
    """msgpack a header; numpy scalars become Python numbers. Refuses (ProtocolError) whatever
    the receiving side (taking ``limits``) would refuse, so bugs show up at the sender."""
    packed = msgpack.packb({"proto": PROTOCOL_VERSION, **header}, use_bin_type=True, default=_np_scalar)
    _unpack_header(packed, None, limits)
    return packed


def _bytes(frame) -> memoryview:
    """A flat byte view of a received or outgoing frame (bytes, zmq.Frame, memoryview, ...)."""
    try:
        return memoryview(frame).cast("B")
    except TypeError as e:
        raise ProtocolError("malformed", f"frame is not a contiguous buffer ({e})") from None


def _frame(array: np.ndarray) -> memoryview:
    return memoryview(np.ascontiguousarray(array)).cast("B")


# ---------------------------------------------------------------------------- messages


def encode(
    header: dict, arrays: Sequence[np.ndarray] = (), *, limits: HeaderLimits = DEFAULT_LIMITS
) -> list[bytes | memoryview]:
    """Frames ``[msgpack header, *array buffers]``. ``proto`` is filled in unless given;
    ``limits``: the receiver's (``report_limits`` for an actor's reports).

    Array frames are zero-copy views of the arrays (see ``send`` for when ZeroMQ copies them).
    Raises ProtocolError for a header that ``decode`` would reject, or arrays on a type other
    than ``rollout``.
    """
    packed = _pack_header(header, limits)
    if arrays and header.get("type") != "rollout":
        raise ProtocolError("frame_count", f"{header.get('type')} carries no array frames")
    return [packed, *(_frame(a) for a in arrays)]


def encode_rollout(header: dict, arrays: Mapping[str, np.ndarray], spec: RolloutSpec) -> list:
    """``encode`` a ``rollout`` message: the header, then one frame per spec field in spec order.

    arrays: {field name: array of that field's shape and dtype}, e.g. ``SlotRing.views(i)``.
    Raises ValueError if a field is missing or has another shape or dtype.
    """
    for f in spec.fields:
        a = arrays[f.name]
        if a.shape != f.shape or a.dtype != f.dtype:
            raise ValueError(f"{f.name}: {a.shape} {a.dtype}, spec says {f.shape} {f.dtype}")
    return encode(
        {**header, "type": "rollout"},
        [arrays[f.name] for f in spec.fields],
        limits=report_limits(spec.num_envs, spec.rollout_length),
    )


def decode(frames: Sequence, *, run_id: str | None = None, limits: HeaderLimits = DEFAULT_LIMITS) -> tuple[dict, list]:
    """Validate a message (ROUTER: strip the identity frame first); returns (header, frames[1:]).

    Raises ProtocolError on an empty message, an oversized (> ``limits``: 64 KiB, lists of at most
    16384 items by default; the learner takes ``report_limits``) or non-msgpack header,
    an unknown ``type``, another protocol version or run id (when ``run_id`` is given), missing,
    unexpected or ill-typed keys, or array frames on any type but ``rollout`` (whose frames
    ``decode_rollout_frames`` checks).
    """
    if not frames:
        raise ProtocolError("frame_count", "empty message")
    header = _unpack_header(frames[0], run_id, limits)
    rest = list(frames[1:])
    if rest and header["type"] != "rollout":
        raise ProtocolError("frame_count", f"{header['type']} with {len(rest)} extra frames")
    return header, rest


def check_finite(arrays: Mapping[str, np.ndarray], names: Iterable[str] | None = None) -> None:
    """Raise ProtocolError("nonfinite") naming the first of ``names`` (default: every
    floating-point array) that holds NaN or +-inf. Also for shared-memory slots."""
    if names is None:
        names = [k for k, a in arrays.items() if a.dtype.kind == "f"]
    for name in names:
        if not np.isfinite(arrays[name]).all():
            bad = int(np.size(arrays[name]) - np.count_nonzero(np.isfinite(arrays[name])))
            raise ProtocolError("nonfinite", f"{name} holds {bad} NaN/inf values")


def decode_rollout_frames(frames: Sequence, spec: RolloutSpec) -> dict[str, np.ndarray]:
    """Read-only numpy views (no copy) of a rollout's array frames: {field name: array of the
    field's shape and dtype}, e.g. obs [T+1, E, obs_dim] float32.

    Raises ProtocolError: "frame_count" unless one frame per spec field, "frame_size" if a
    frame's byte size differs from shape * itemsize, "bad_bool" for bool bytes other than 0/1,
    "nonfinite" (naming the field) for NaN/inf in a float field.
    """
    if len(frames) != len(spec.fields):
        raise ProtocolError("frame_count", f"{len(frames)} array frames, spec has {len(spec.fields)} fields")
    out = {}
    for f, frame in zip(spec.fields, frames):
        buf = _bytes(frame)
        expected = int(np.prod(f.shape)) * f.dtype.itemsize
        if buf.nbytes != expected:
            raise ProtocolError(
                "frame_size", f"{f.name}: {buf.nbytes} bytes, expected {expected} for {f.shape} {f.dtype}"
            )
        if f.dtype == np.bool_ and np.frombuffer(buf, np.uint8).max(initial=0) > 1:
            raise ProtocolError("bad_bool", f"{f.name} holds bytes other than 0/1")
        arr = np.frombuffer(buf, f.dtype).reshape(f.shape)
        arr.flags.writeable = False
        out[f.name] = arr
    check_finite(out)
    return out


def encode_weights(
    *, run_id: str, version: int, publish_time: float, layout_hash: str, payload: np.ndarray, epoch: int = 0
) -> list[bytes | memoryview]:
    """``[b"weights", header, payload]``; payload is the flat float32 [P] parameter vector,
    sent zero-copy; publish_time in seconds on the learner's clock; epoch: the learner's
    (an int >= 0 that rises at every learner start). Raises ValueError for a payload that is
    not 1-D float32."""
    if payload.dtype != np.float32 or payload.ndim != 1:
        raise ValueError(f"weights payload must be 1-D float32, got {payload.dtype} {payload.shape}")
    body = _frame(payload)
    header = {
        "type": "weights",
        "run_id": run_id,
        "epoch": int(epoch),
        "version": int(version),
        "publish_time": float(publish_time),
        "nbytes": body.nbytes,
        "checksum": zlib.crc32(body),
        "layout_hash": layout_hash,
    }
    return [WEIGHTS_TOPIC, _pack_header(header), body]


def decode_weights(
    frames: Sequence, *, run_id: str | None = None, layout_hash: str | None = None
) -> tuple[dict, np.ndarray]:
    """Validate a weights message; returns (header, read-only float32 [P] view of the payload).

    Raises ProtocolError: "frame_count", "topic", header errors as in ``decode``, "layout"
    (layout_hash differs when given), "frame_size" (payload bytes != nbytes), "checksum"
    (crc32), "nonfinite".
    """
    if len(frames) != 3:
        raise ProtocolError("frame_count", f"weights message of {len(frames)} frames, expected 3")
    topic = _bytes(frames[0])
    if topic.nbytes != len(WEIGHTS_TOPIC) or topic.tobytes() != WEIGHTS_TOPIC:
        raise ProtocolError("topic", "first frame is not b'weights'")
    header = _unpack_header(frames[1], run_id)
    if header["type"] != "weights":
        raise ProtocolError("unknown_type", f"{header['type']} on the weights topic")
    if layout_hash is not None and header["layout_hash"] != layout_hash:
        raise ProtocolError("layout", f"weights layout {header['layout_hash']!r}, this policy has {layout_hash!r}")
    body = _bytes(frames[2])
    if body.nbytes != header["nbytes"] or body.nbytes % 4:
        raise ProtocolError("frame_size", f"payload {body.nbytes} bytes, header says {header['nbytes']}")
    if zlib.crc32(body) != header["checksum"]:
        raise ProtocolError("checksum", f"weights version {header['version']}")
    weights = np.frombuffer(body, np.float32)
    weights.flags.writeable = False
    check_finite({"weights": weights})
    return header, weights


def sign_weights(frames: Sequence, secret: bytes | None) -> list:
    """The learner's weights message for the broadcaster: ``frames`` of ``encode_weights`` plus a
    fourth frame, HMAC-SHA256 of header and payload under ``secret`` (b"" without a secret)."""
    mac = b"" if not secret else _weights_mac(frames, secret)
    return [*frames, mac]


def verify_weights(frames: Sequence, secret: bytes | None) -> list:
    """The three frames of a signed weights message (``sign_weights``) whose HMAC holds under
    ``secret``. Raises ProtocolError("not_learner") for a missing or wrong HMAC (or no secret)."""
    if len(frames) != 4:
        raise ProtocolError("not_learner", f"weights message of {len(frames)} frames carries no learner signature")
    if not secret or not hmac.compare_digest(bytes(_bytes(frames[3])), _weights_mac(frames, secret)):
        raise ProtocolError(
            "not_learner",
            "weights whose signature is not the learner's (secret of the broadcaster's weights-secret file)",
        )
    return list(frames[:3])


def _weights_mac(frames: Sequence, secret: bytes) -> bytes:
    mac = hmac.new(secret, digestmod=hashlib.sha256)
    header = _bytes(frames[1])
    mac.update(len(header).to_bytes(8, "little"))
    mac.update(header)
    mac.update(_bytes(frames[2]))
    return mac.digest()


# ---------------------------------------------------------------------------- rejects


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


# ---------------------------------------------------------------------------- sockets
# One place for socket options: LINGER 0 (close never hangs), bounded queues (HWM, in
# messages), and send/recv timeouts so no call blocks forever.


def snapshot_endpoint(broadcaster: str) -> str:
    """The broadcaster's request socket: one port above its PUB socket (tcp://HOST:PORT), or
    beside it (ipc://PATH -> ipc://PATH.snapshot)."""
    if broadcaster.startswith("ipc://"):
        return f"{broadcaster}.snapshot"
    host, port = broadcaster.rsplit(":", 1)
    return f"{host}:{int(port) + 1}"


def context() -> zmq.Context:
    """A new ZeroMQ context; ``ctx.destroy(linger=0)`` closes it with all its sockets."""
    return zmq.Context()


def _socket(ctx: zmq.Context, kind: int, hwm: int, timeout_ms: int, security=None) -> zmq.Socket:
    """A socket with the options above; its handshakes are watched (``handshakes``) from before
    it binds or connects, since ZeroMQ does not retry after some failures."""
    sock = ctx.socket(kind)
    _WATCHES[sock] = HandshakeWatch(sock)
    sock.linger = 0
    sock.sndhwm = sock.rcvhwm = hwm
    sock.sndtimeo = sock.rcvtimeo = timeout_ms
    if security is not None:  # a security.Curve; must be set before bind/connect
        if security.server_key is None:
            sock.curve_server = True
        else:
            sock.curve_serverkey = security.server_key
        sock.curve_publickey, sock.curve_secretkey = security.public, security.secret
    return sock


def bind(sock: zmq.Socket, endpoint: str) -> str:
    """Bind; returns the endpoint actually bound ("tcp://host:0" or ":*" picks a free port)."""
    if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
        endpoint = endpoint[:-1] + "*"
    sock.bind(endpoint)
    return endpoint_of(sock)


def endpoint_of(sock: zmq.Socket) -> str:
    """The last endpoint ``sock`` bound, with the real port."""
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


def _bind_or_connect(sock: zmq.Socket, bind_to: str | None, connect: str | None) -> zmq.Socket:
    try:
        if (bind_to is None) == (connect is None):
            raise ValueError("give exactly one of bind= and connect=")
        if bind_to is not None:
            bind(sock, bind_to)
        else:
            sock.connect(connect)
    except (ValueError, zmq.ZMQError) as exc:  # leave no socket open behind
        close(sock)
        if isinstance(exc, zmq.ZMQError):
            raise AddressError(f"cannot {'bind' if bind_to else 'connect to'} {bind_to or connect}: {exc}") from None
        raise
    return sock


def router(
    ctx: zmq.Context,
    bind: str,
    *,
    hwm: int = 1000,
    max_message_bytes: int = -1,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
    security=None,
) -> zmq.Socket:
    """Learner side of the actor channel. Received frames: [identity, header, *arrays].
    No ROUTER_HANDOVER: a second connection under an identity in use is refused by ZeroMQ, so no
    peer can take over a live actor's route (each actor process picks a random identity).

    ``security`` (every factory here): a ``security.Curve`` (CURVE server or client keys) or None
    for no encryption. Raises AddressError if the address cannot be bound (in use, not an
    address of this host) or is malformed. ``max_message_bytes`` (ZMQ_MAXMSGSIZE, set before the
    bind: ZeroMQ copies the options into the listener there): a peer that sends a larger frame is
    disconnected before the frame is buffered; -1: no limit."""
    sock = _socket(ctx, zmq.ROUTER, hwm, timeout_ms, security)
    sock.router_handover = 0
    sock.setsockopt(zmq.MAXMSGSIZE, int(max_message_bytes))
    return _bind_or_connect(sock, bind, None)


def max_message_size(sock: zmq.Socket) -> int:
    """The socket's ZMQ_MAXMSGSIZE (-1: no limit)."""
    return sock.getsockopt(zmq.MAXMSGSIZE)


def route_identity(name: str) -> str:
    """A DEALER identity for one process: ``name`` (cut to 200 characters) plus a random suffix,
    so no other peer can guess it, and a restarted process never collides with its old route."""
    return f"{name[:200]}#{secrets.token_hex(4)}"


def dealer(
    ctx: zmq.Context,
    connect: str,
    identity: str | bytes,
    *,
    hwm: int = 1000,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
    security=None,
    immediate: bool = False,
    max_message_bytes: int = -1,
) -> zmq.Socket:
    """Actor side of the actor channel; ``identity`` (1..255 bytes) is how the learner routes.
    ``immediate``: queue messages only while connected (ZMQ_IMMEDIATE), none for a peer to come.
    ``max_message_bytes``: ZMQ_MAXMSGSIZE (bytes per received frame; -1: no limit), as ``router``."""
    sock = _socket(ctx, zmq.DEALER, hwm, timeout_ms, security)
    sock.setsockopt(zmq.MAXMSGSIZE, int(max_message_bytes))
    sock.identity = identity.encode() if isinstance(identity, str) else identity
    sock.immediate = int(immediate)
    return _bind_or_connect(sock, None, connect)


# ZMQ_MAXMSGSIZE of a PUB socket: it receives subscriptions only (1 + topic bytes), but the limit also
# applies to the handshake's commands (CURVE's INITIATE: about 300 bytes with its metadata)
MAX_SUBSCRIPTION_BYTES = 4096


def pub(
    ctx: zmq.Context, bind: str, *, hwm: int = 8, timeout_ms: int = DEFAULT_TIMEOUT_MS, security=None
) -> zmq.Socket:
    """Broadcaster's weights publisher. A small HWM: only the newest weights matter. It receives
    only subscription frames (1 + topic bytes) after the handshake: a frame larger than
    MAX_SUBSCRIPTION_BYTES (ZMQ_MAXMSGSIZE) disconnects its peer."""
    sock = _socket(ctx, zmq.PUB, hwm, timeout_ms, security)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_SUBSCRIPTION_BYTES)
    return _bind_or_connect(sock, bind, None)


def sub(
    ctx: zmq.Context,
    connect: str,
    *,
    topic: bytes = WEIGHTS_TOPIC,
    hwm: int = 8,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
    security=None,
    max_message_bytes: int = -1,
) -> zmq.Socket:
    """Actor's weights subscriber; read it with ``drain_latest``. ``max_message_bytes``:
    ZMQ_MAXMSGSIZE (bytes per received frame; -1: no limit), as ``router``."""
    sock = _socket(ctx, zmq.SUB, hwm, timeout_ms, security)
    sock.setsockopt(zmq.MAXMSGSIZE, int(max_message_bytes))
    sock.subscribe(topic)
    return _bind_or_connect(sock, None, connect)


def push(
    ctx: zmq.Context,
    *,
    bind: str | None = None,
    connect: str | None = None,
    hwm: int = 8,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
    security=None,
) -> zmq.Socket:
    """PUSH end of a pipeline (learner -> broadcaster weights); exactly one of bind/connect."""
    return _bind_or_connect(_socket(ctx, zmq.PUSH, hwm, timeout_ms, security), bind, connect)


def pull(
    ctx: zmq.Context,
    *,
    bind: str | None = None,
    connect: str | None = None,
    hwm: int = 8,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
    security=None,
) -> zmq.Socket:
    """PULL end of a pipeline; exactly one of bind/connect."""
    return _bind_or_connect(_socket(ctx, zmq.PULL, hwm, timeout_ms, security), bind, connect)


def send(sock: zmq.Socket, frames: Sequence, *, block: bool = True, copy: bool = True) -> bool:
    """Send a multipart message. Returns False instead of raising when it would block
    (block=False) or its send timeout expires (HWM reached, no peer).

    copy=False hands large array buffers to ZeroMQ without copying; ZeroMQ reads them after
    this returns, so only use it for arrays nobody modifies afterwards (not a reused rollout
    buffer).
    """
    try:
        sock.send_multipart(frames, flags=0 if block else zmq.NOBLOCK, copy=copy)
    except zmq.Again:
        return False
    return True


def recv_multipart_timeout(sock: zmq.Socket, timeout_ms: int, *, copy: bool = True) -> list | None:
    """The next multipart message, or None if none arrives within ``timeout_ms``.

    copy=False returns zmq.Frame objects (buffer protocol; no copy of large arrays), which
    every decode function here accepts; ROUTER identities then need ``frames[0].bytes``.
    """
    if not sock.poll(timeout_ms, zmq.POLLIN):
        return None
    try:
        return sock.recv_multipart(zmq.NOBLOCK, copy=copy)
    except zmq.Again:  # another reader took it
        return None


def user_id(frame) -> str | None:
    """The CURVE public key (z85) the authenticator vouched for as the sender of a received
    zmq.Frame, or None (no CURVE, or not a zmq.Frame)."""
    try:
        return frame.get("User-Id")
    except (AttributeError, zmq.ZMQError):
        return None


def drain_all(sock: zmq.Socket, *, max_messages: int = 10_000) -> list[list]:
    """Every message pending on ``sock`` (oldest first) without blocking; lists of zmq.Frame."""
    out = []
    for _ in range(max_messages):
        try:
            out.append(sock.recv_multipart(zmq.NOBLOCK, copy=False))
        except zmq.Again:
            break
    return out


def drain_latest(sock: zmq.Socket, *, max_messages: int = 10_000) -> list | None:
    """Read every message pending on ``sock`` without blocking; return only the newest complete
    multipart message (a list of zmq.Frame), or None if none was pending.

    Done by hand because ZMQ_CONFLATE breaks multipart messages. ZeroMQ delivers a message's
    frames atomically, so once the first frame is there the rest are too. Stops after
    ``max_messages`` so a flooding publisher cannot keep it looping.
    """
    latest = None
    for _ in range(max_messages):
        try:
            latest = sock.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            break
    return latest


_WATCHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # socket -> HandshakeWatch


class HandshakeFailure(NamedTuple):
    reason: str  # "auth", "mechanism_mismatch", "cryptographic", "protocol", "no_detail"
    endpoint: str  # the socket's own address (ZeroMQ reports no peer address here)
    detail: str  # one line for a log or an error message


_HANDSHAKE_DETAIL = {
    "auth": "the server refused the client's CURVE key (not among its allowed keys)",
    "mechanism_mismatch": "one end uses CURVE and the other does not (a role binding a non-loopback "
    "address, 0.0.0.0 included, uses CURVE: connect to it through such an address, "
    "with --keys; or give both ends --insecure)",
    "cryptographic": "CURVE decryption failed: the client holds another server's public key",
    "protocol": "ZMTP protocol error",
    "no_detail": "the peer dropped the connection during the handshake (wrong or missing keys: a "
    "client holding another server's public key, or CURVE on one end only)",
}


class HandshakeWatch:
    """The handshake outcomes of one socket, read from a ZeroMQ monitor without blocking.

    ``failures()`` returns the failed handshakes since the last call; ``succeeded`` counts the
    good ones. ``close()`` before closing the socket."""

    _EVENTS = (
        zmq.EVENT_HANDSHAKE_SUCCEEDED
        | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
        | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
        | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    )

    def __init__(self, sock: zmq.Socket):
        self.sock, self.succeeded, self._failed_in_a_row = sock, 0, 0
        self.monitor = sock.get_monitor_socket(self._EVENTS)
        self.monitor.linger = 0

    def fatal(self, tries: int = 3) -> HandshakeFailure | None:
        """For a client: the failure to give up on, if any: a refused key or CURVE on one end only
        at once (ZeroMQ does not retry after a mechanism mismatch), any other failure once
        ``tries`` handshakes in a row failed (it retries those every 0.1 s)."""
        failed = self.failures()
        refused = [f for f in failed if f.reason in ("auth", "mechanism_mismatch")]
        if refused:
            return refused[0]
        return failed[-1] if failed and self._failed_in_a_row >= tries else None

    def failures(self) -> list[HandshakeFailure]:
        out = []
        for _ in range(1000):
            try:
                event = parse_monitor_message(self.monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                break
            kind, value = event["event"], event["value"]
            if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.succeeded += 1
                self._failed_in_a_row = 0
                continue
            if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                reason = "auth"
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                reason = "no_detail"
            elif value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
                reason = "mechanism_mismatch"
            elif value == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
                reason = "cryptographic"
            else:
                reason = "protocol"
            endpoint = (
                event["endpoint"].decode("utf-8", "replace")
                if isinstance(event["endpoint"], bytes)
                else str(event["endpoint"])
            )
            out.append(HandshakeFailure(reason, endpoint, _HANDSHAKE_DETAIL[reason]))
            self._failed_in_a_row += 1
        return out

    def close(self) -> None:
        """Stop monitoring; idempotent."""
        if not self.monitor.closed:
            if not self.sock.closed:
                self.sock.disable_monitor()
            self.monitor.close(linger=0)


def poll(socks: Iterable[zmq.Socket], timeout_ms: int) -> set[zmq.Socket]:
    """The sockets among ``socks`` with a message to read, waiting at most ``timeout_ms``."""
    poller = zmq.Poller()
    for s in socks:
        poller.register(s, zmq.POLLIN)
    return {s for s, _ in poller.poll(timeout_ms)}


def handshakes(sock: zmq.Socket) -> HandshakeWatch:
    """The HandshakeWatch of a socket made by this module. Raises KeyError for any other."""
    return _WATCHES[sock]


def close(*socks: zmq.Socket) -> None:
    """Close sockets at once, dropping unsent messages (linger 0), and their handshake monitors."""
    for s in socks:
        watch = _WATCHES.pop(s, None)
        if watch is not None:
            watch.close()
        s.close(linger=0)
