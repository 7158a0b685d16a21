"""Frames of a message: a msgpack header (frame 0), then raw array frames (rollouts only).

``encode`` / ``decode`` for every message, ``encode_rollout`` / ``decode_rollout_frames`` for a
rollout's arrays, ``encode_weights`` / ``decode_weights`` for ``[b"weights", header, payload]`` on
PUB/SUB, ``encode_version`` / ``decode_version`` for a version ping ``[b"version", header]``, and
``sign_weights`` / ``verify_weights`` (``sign_version`` / ``verify_version``) for the last frame the
learner adds, an HMAC the broadcaster checks. Everything received is validated here (headers against ``protocol.py``);
nothing is ever unpickled. Bad input raises ``protocol.ProtocolError``.
"""

from __future__ import annotations

import hashlib
import hmac
import zlib
from collections.abc import Iterable, Mapping, Sequence

import msgpack
import numpy as np

from asyncrl.core.limits import (
    MAX_STR_BYTES,  # of any one string in a header (config.validate keeps the welcome's config under it)
)
from asyncrl.core.spec import RolloutSpec
from asyncrl.wire.protocol import (
    DEFAULT_LIMITS,
    MAX_HEADER_BYTES,
    PROTOCOL_VERSION,
    VERSION_TOPIC,
    WEIGHTS_DTYPES,
    WEIGHTS_TOPIC,
    HeaderLimits,
    ProtocolError,
    report_limits,
    validate_header,
)

_UNPACK_LIMITS = dict(max_str_len=MAX_STR_BYTES, max_bin_len=4096, max_map_len=64, max_ext_len=0)


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


# numpy element type of each payload dtype (bfloat16: its raw 16-bit patterns, numpy having no bfloat16)
PAYLOAD_DTYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "bfloat16": np.dtype(np.uint16)}


def payload_dtype_name(payload: np.ndarray) -> str:
    """The header ``dtype`` of a payload array: float32, float16, or bfloat16 for uint16 (raw bit
    patterns). Raises ValueError for any other element type."""
    for name, dtype in PAYLOAD_DTYPES.items():
        if payload.dtype == dtype:
            return name
    raise ValueError(f"a weights payload is float32, float16 or bfloat16 bits (uint16), not {payload.dtype}")


def encode_weights(
    *, run_id: str, version: int, publish_time: float, layout_hash: str, payload: np.ndarray, epoch: int = 0
) -> list[bytes | memoryview]:
    """``[b"weights", header, payload]``; payload is the flat [P] parameter vector, float32, float16
    or bfloat16 as raw uint16 bit patterns (header ``dtype``: :func:`payload_dtype_name`), sent
    zero-copy; the CRC32 in the header covers the bytes sent. publish_time in seconds on the learner's
    clock; epoch: the learner's (an int >= 0 that rises at every learner start). Raises ValueError
    for a payload that is not 1-D or of another element type."""
    dtype = payload_dtype_name(payload)
    if payload.ndim != 1:
        raise ValueError(f"weights payload must be 1-D, got shape {payload.shape}")
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
        "dtype": dtype,
    }
    return [WEIGHTS_TOPIC, _pack_header(header), body]


def decode_weights(
    frames: Sequence, *, run_id: str | None = None, layout_hash: str | None = None
) -> tuple[dict, np.ndarray]:
    """Validate a weights message; returns (header, read-only [P] view of the payload: float32,
    float16, or uint16 bit patterns for a ``dtype`` of bfloat16).

    Raises ProtocolError: "frame_count", "topic", header errors as in ``decode``, "dtype" (not one of
    protocol.WEIGHTS_DTYPES), "layout" (layout_hash differs when given), "frame_size" (payload
    bytes != nbytes, or not whole elements), "checksum" (crc32), "nonfinite".
    """
    header = _topic_header(frames, 3, WEIGHTS_TOPIC, "weights", "weights message", run_id)
    if header["dtype"] not in PAYLOAD_DTYPES:
        raise ProtocolError("dtype", f"weights of dtype {header['dtype']!r:.40}, not one of {WEIGHTS_DTYPES}")
    if layout_hash is not None and header["layout_hash"] != layout_hash:
        raise ProtocolError("layout", f"weights layout {header['layout_hash']!r}, this policy has {layout_hash!r}")
    dtype = PAYLOAD_DTYPES[header["dtype"]]
    body = _bytes(frames[2])
    if body.nbytes != header["nbytes"] or body.nbytes % dtype.itemsize:
        raise ProtocolError("frame_size", f"payload {body.nbytes} bytes, header says {header['nbytes']}")
    if zlib.crc32(body) != header["checksum"]:
        raise ProtocolError("checksum", f"weights version {header['version']}")
    weights = np.frombuffer(body, dtype)
    weights.flags.writeable = False
    bad = _count_nonfinite(weights, bits=header["dtype"] == "bfloat16")
    if bad:
        raise ProtocolError("nonfinite", f"weights holds {bad} NaN/inf values")
    return header, weights


_CHUNK = 1 << 18  # elements per step of the finiteness check: temporaries stay in cache, none of payload size


def _count_nonfinite(weights: np.ndarray, *, bits: bool) -> int:
    """NaN and inf values of a flat payload, a chunk at a time (a whole-array check allocates
    temporaries of the payload's size: 8x slower on a 269 MB bfloat16 payload, measured). ``bits``:
    bfloat16 bit patterns, whose exponent bits are all ones for NaN and inf."""
    bad, scratch = 0, np.empty(min(_CHUNK, weights.size), np.uint16) if bits else None
    for start in range(0, weights.size, _CHUNK):
        chunk = weights[start : start + _CHUNK]
        if bits:
            part = scratch[: chunk.size]
            np.bitwise_and(chunk, 0x7F80, out=part)
            bad += int(np.count_nonzero(part == 0x7F80))
        else:
            bad += chunk.size - int(np.count_nonzero(np.isfinite(chunk)))
    return bad


def encode_version(*, run_id: str, epoch: int, version: int, nbytes: int) -> list[bytes]:
    """A version ping ``[b"version", header]``: the (learner epoch, version) of the newest weights and
    the bytes of their payload, without them (the broadcaster's PUB ping; ``sign_version`` makes the
    learner's)."""
    header = {"type": "weights_version", "run_id": run_id, "epoch": int(epoch), "version": int(version)}
    header["nbytes"] = int(nbytes)
    return [VERSION_TOPIC, _pack_header(header)]


def decode_version(frames: Sequence, *, run_id: str | None = None) -> dict:
    """The header of a version ping ``[b"version", header]``. Raises ProtocolError ("frame_count",
    "topic", "unknown_type", header errors as in ``decode``)."""
    return _topic_header(frames, 2, VERSION_TOPIC, "weights_version", "version ping", run_id)


def _topic_header(frames: Sequence, count: int, topic: bytes, kind: str, what: str, run_id: str | None) -> dict:
    """The header of a broadcaster message ``[topic, header, ...]`` of ``count`` frames whose header type
    is ``kind``. Raises ProtocolError ("frame_count", "topic", "unknown_type", header errors)."""
    if len(frames) != count:
        raise ProtocolError("frame_count", f"{what} of {len(frames)} frames, expected {count}")
    first = _bytes(frames[0])
    if first.nbytes != len(topic) or first.tobytes() != topic:
        raise ProtocolError("topic", f"first frame is not {topic!r}")
    header = _unpack_header(frames[1], run_id)
    if header["type"] != kind:
        raise ProtocolError("unknown_type", f"{header['type']} on the {topic.decode()} topic")
    return header


def sign_weights(frames: Sequence, secret: bytes | None) -> list:
    """The learner's weights message for the broadcaster: ``frames`` of ``encode_weights`` plus a
    fourth frame, HMAC-SHA256 of header and payload under ``secret`` (b"" without a secret)."""
    mac = b"" if not secret else _mac(frames[1:], secret)
    return [*frames, mac]


def verify_weights(frames: Sequence, secret: bytes | None) -> list:
    """The three frames of a signed weights message (``sign_weights``) whose HMAC holds under
    ``secret``. Raises ProtocolError("not_learner") for a missing or wrong HMAC (or no secret)."""
    return _verify(frames, secret, 4, "weights message")


def sign_version(frames: Sequence, secret: bytes | None) -> list:
    """The learner's version ping for the broadcaster: ``frames`` of ``encode_version`` plus a third
    frame, HMAC-SHA256 of the header under ``secret`` (b"" without a secret). The header names its
    type, so no weights message's HMAC holds for a ping, nor a ping's for weights."""
    mac = b"" if not secret else _mac(frames[1:], secret)
    return [*frames, mac]


def verify_version(frames: Sequence, secret: bytes | None) -> list:
    """The two frames of a signed version ping (``sign_version``) whose HMAC holds under ``secret``.
    Raises ProtocolError("not_learner") for a missing or wrong HMAC (or no secret)."""
    return _verify(frames, secret, 3, "version ping")


def _verify(frames: Sequence, secret: bytes | None, count: int, what: str) -> list:
    if len(frames) != count:
        raise ProtocolError("not_learner", f"{what} of {len(frames)} frames carries no learner signature")
    if not secret or not hmac.compare_digest(bytes(_bytes(frames[-1])), _mac(frames[1:-1], secret)):
        raise ProtocolError(
            "not_learner",
            f"{what} whose signature is not the learner's (secret of the broadcaster's weights-secret file)",
        )
    return list(frames[:-1])


def _mac(parts: Sequence, secret: bytes) -> bytes:
    """HMAC-SHA256 of a header (length-prefixed) and the frames after it (a payload, or none)."""
    mac = hmac.new(secret, digestmod=hashlib.sha256)
    header = _bytes(parts[0])
    mac.update(len(header).to_bytes(8, "little"))
    mac.update(header)
    for part in parts[1:]:
        mac.update(_bytes(part))
    return mac.digest()
