"""Property-based fuzz (hypothesis) of every decoder of what peers send: each either returns a
value that passed its checks or raises its one rejection error (ProtocolError, SlotError,
ShmError), never anything else, whatever the bytes. Random bytes, random msgpack, and
well-formed headers of every message type with hostile values (negative, huge, non-finite,
control characters, wrong types, missing and extra keys).

Decoders: transport.decode (every header type), decode_rollout_frames, decode_weights, peek,
validate_header, RejectCounter.reject and printable (which see the rejected input), the learner's
handshake_mismatch (a validated hello's values), slot_checks.check_slot (a slot an actor wrote in
shared memory), shm's segment-header check (a segment another process made), the ZAP key check
of security (any client key bytes) and transport.user_id."""

from __future__ import annotations

import logging
import math
import zlib

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncrl.core.slot_checks import SlotError, check_slot
from asyncrl.core.spec import RolloutSpec
from asyncrl.roles.learner_messages import handshake_mismatch
from asyncrl.wire import codec, protocol, rejects, sockets
from asyncrl.wire.shm.layout import _HEADER, HEADER_NBYTES, MAGIC, ShmError, _check_header, _hash

pytestmark = pytest.mark.timeout(300)

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=False)
SPEC = RolloutSpec(obs_dim=2, action_dim=3, discrete=True, rollout_length=3, num_envs=2)
RUN = "run-1"

# ----------------------------------------------------------------------------- strategies

hostile_ints = st.one_of(st.integers(-(2**63), 2**64 - 1), st.sampled_from([0, -1, 2**63, 2**64 - 1]))
hostile_floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([math.nan, math.inf]))
hostile_text = st.one_of(st.text(max_size=64), st.sampled_from(["", "\x1b[2J", "a\nb", "\u2028", "x" * 5000]))
scalars = st.one_of(st.none(), st.booleans(), hostile_ints, hostile_floats, hostile_text, st.binary(max_size=64))
msgpack_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6), st.dictionaries(st.one_of(hostile_text, hostile_ints), inner, max_size=6)
    ),
    max_leaves=20,
)


short_text = st.one_of(st.text(max_size=32), st.sampled_from(["", "\x1b[2J", "a\nb", "\u2028", RUN]))


def typed(kind):
    """Values of the schema type ``kind``, hostile within it (negative ints, NaN, control characters)."""
    if kind is bool:
        return st.one_of(st.booleans(), st.sampled_from([0, 1, None, "true"]))
    if kind is int:
        return hostile_ints
    if kind is float:
        return hostile_floats
    if kind is str:
        return short_text
    if kind is bytes:
        return st.binary(max_size=40)
    if kind == list[float]:
        return st.lists(hostile_floats, max_size=8)
    if kind == list[int]:
        return st.lists(hostile_ints, max_size=8)
    if kind is dict:
        return st.dictionaries(
            short_text, st.one_of(st.booleans(), hostile_ints, hostile_floats, short_text), max_size=5
        )
    return st.one_of(st.none(), st.binary(max_size=40))  # bytes | None


@st.composite
def hostile_headers(draw):
    """A header of a real message type: each key's value of its type but hostile, or of any type;
    keys dropped or added now and then."""
    kind = draw(st.sampled_from(sorted(protocol.SCHEMAS)))
    schema = {**protocol._COMMON, **protocol.SCHEMAS[kind], **protocol.OPTIONAL.get(kind, {})}
    good = {"type": kind, "proto": protocol.PROTOCOL_VERSION, "run_id": RUN}
    header = {}
    for key, expected in schema.items():
        pick = draw(st.integers(0, 19))
        if pick == 0:
            continue  # missing
        if pick == 1:
            header[key] = draw(msgpack_values)  # any type
        elif key in ("type", "proto") or (key in good and pick < 12):
            header[key] = good[key]
        else:
            header[key] = draw(typed(expected))
    if draw(st.integers(0, 9)) == 0:
        header[draw(hostile_text)] = draw(msgpack_values)  # extra key
    return header


def packed(value) -> bytes | None:
    try:
        return msgpack.packb(value, use_bin_type=True)
    except (OverflowError, ValueError, TypeError):
        return None


frames_of_bytes = st.lists(st.binary(max_size=200), max_size=5)


def decode_or_reject(fn, *args, **kwargs):
    """Call a decoder; a ProtocolError is the one allowed failure."""
    try:
        return fn(*args, **kwargs)
    except protocol.ProtocolError as exc:
        assert exc.reason and isinstance(exc.reason, str)
        return None


# ----------------------------------------------------------------------------- transport


@FUZZ
@given(frames_of_bytes)
def test_decode_random_bytes(frames):
    out = decode_or_reject(codec.decode, frames)
    if out is not None:
        protocol.validate_header(out[0])


@FUZZ
@given(hostile_headers(), st.lists(st.binary(max_size=32), max_size=3), st.booleans())
def test_decode_hostile_headers(header, extra, report_limits):
    raw = packed(header)
    if raw is None:
        return
    limits = protocol.report_limits(SPEC.num_envs, SPEC.rollout_length) if report_limits else protocol.DEFAULT_LIMITS
    out = decode_or_reject(codec.decode, [raw, *extra], run_id=RUN if report_limits else None, limits=limits)
    if out is not None:
        h, rest = out
        assert h["type"] in protocol.SCHEMAS and h["proto"] == protocol.PROTOCOL_VERSION
        assert not rest or h["type"] == "rollout"
        if h["type"] == "hello":  # the learner compares a validated hello's values next
            assert isinstance(
                handshake_mismatch(
                    h, run_id=RUN, env_id="E", spec=SPEC.to_dict(), spaces={"observation": "o", "action": "a"}
                ),
                str,
            )


@FUZZ
@given(msgpack_values)
def test_decode_random_msgpack_and_peek(value):
    raw = packed(value)
    if raw is None:
        return
    decode_or_reject(codec.decode, [raw])
    peeked = codec.peek(raw)
    assert isinstance(peeked, dict)
    decode_or_reject(protocol.validate_header, value, run_id=RUN)


@FUZZ
@given(frames_of_bytes)
def test_peek_random_bytes(frames):
    for f in frames:
        assert isinstance(codec.peek(f), dict)


def _rollout_frame_sizes():
    return [int(np.prod(f.shape)) * f.dtype.itemsize for f in SPEC.fields]


@FUZZ
@given(st.data())
def test_decode_rollout_frames(data):
    sizes = _rollout_frame_sizes()
    if data.draw(st.booleans()):  # frames of the right sizes, random contents (NaN, bad bools, ...)
        frames = [data.draw(st.binary(min_size=n, max_size=n)) for n in sizes]
    else:
        frames = data.draw(st.lists(st.binary(max_size=max(sizes) + 8), max_size=len(sizes) + 2))
    out = decode_or_reject(codec.decode_rollout_frames, frames, SPEC)
    if out is not None:
        assert set(out) == set(SPEC.field_names)
        for f in SPEC.fields:
            assert out[f.name].shape == f.shape and out[f.name].dtype == f.dtype
            if f.dtype.kind == "f":
                assert np.isfinite(out[f.name]).all()
        try:  # what the learner checks next, for a slot it will train on
            check_slot({k: np.array(v) for k, v in out.items()}, SPEC, version=5)
        except SlotError as exc:
            assert exc.reason


@FUZZ
@given(st.data())
def test_decode_weights(data):
    body = data.draw(st.binary(max_size=64))
    header = {
        "type": "weights",
        "proto": protocol.PROTOCOL_VERSION,
        "run_id": RUN,
        "epoch": data.draw(st.one_of(st.integers(0, 2**63 - 1), hostile_ints)),
        "version": data.draw(st.one_of(st.integers(0, 2**63 - 1), hostile_ints)),
        "publish_time": data.draw(hostile_floats),
        "nbytes": len(body),
        "checksum": zlib.crc32(body),
        "layout_hash": "abc",
        "dtype": data.draw(st.one_of(st.sampled_from(protocol.WEIGHTS_DTYPES), st.sampled_from(["int8", "uint16"]))),
    }
    for key in data.draw(st.lists(st.sampled_from(sorted(header)), max_size=3)):
        header[key] = data.draw(msgpack_values)
    raw = packed(header)
    topic = data.draw(st.one_of(st.just(protocol.WEIGHTS_TOPIC), st.sampled_from([b"", b"weight", b"weightsX"])))
    frames = data.draw(st.one_of(st.just([topic, raw or b"", body]), frames_of_bytes))
    out = decode_or_reject(
        codec.decode_weights,
        frames,
        run_id=data.draw(st.sampled_from([None, RUN])),
        layout_hash=data.draw(st.sampled_from([None, "abc"])),
    )
    if out is not None:  # a payload of the header's dtype and size, every value finite
        h, weights = out
        assert weights.dtype == codec.PAYLOAD_DTYPES[h["dtype"]] and h["nbytes"] == weights.nbytes == len(body)
        values = weights.astype(np.uint32) << 16 if h["dtype"] == "bfloat16" else weights
        assert np.isfinite(values.view(np.float32) if h["dtype"] == "bfloat16" else values).all()


@FUZZ
@given(st.data())
def test_decode_version(data):
    header = {
        "type": data.draw(st.sampled_from(["weights_version", "weights", "weights_status"])),
        "proto": protocol.PROTOCOL_VERSION,
        "run_id": data.draw(st.sampled_from([RUN, "other"])),
        "epoch": data.draw(st.one_of(st.integers(0, 2**63 - 1), hostile_ints)),
        "version": data.draw(st.one_of(st.integers(0, 2**63 - 1), hostile_ints)),
        "nbytes": data.draw(st.one_of(st.integers(0, 2**63 - 1), hostile_ints)),
    }
    for key in data.draw(st.lists(st.sampled_from(sorted(header)), max_size=2)):
        header[key] = data.draw(msgpack_values)
    topic = data.draw(st.sampled_from([protocol.VERSION_TOPIC, protocol.WEIGHTS_TOPIC, b"versionX"]))
    frames = data.draw(st.one_of(st.just([topic, packed(header) or b""]), frames_of_bytes))
    out = decode_or_reject(codec.decode_version, frames, run_id=data.draw(st.sampled_from([None, RUN])))
    numbers = ("epoch", "version", "nbytes")
    if out is not None:  # the numbers a role acts on are ints in 0..2**63 - 1
        assert out["type"] == "weights_version" and set(out) == {"type", "proto", "run_id", *numbers}
        assert all(type(out[k]) is int and 0 <= out[k] < 2**63 for k in numbers)


@FUZZ
@given(st.one_of(st.text(), st.binary()), st.one_of(st.none(), st.text(), st.binary()), hostile_text)
def test_reject_counter_and_printable_never_raise(text, sender, reason):
    counter = rejects.RejectCounter("fuzz", logging.getLogger("fuzz.quiet"))
    counter.reject(protocol.ProtocolError(reason or "r", text if isinstance(text, str) else repr(text)), sender)
    counter.reject(reason, sender)
    assert counter.total == 2
    line = rejects.printable(text)
    assert line.isascii() and "\n" not in line and len(line) <= 303


@FUZZ
@given(st.one_of(st.binary(max_size=64), st.text(max_size=64), st.none(), st.integers()))
def test_user_id_of_anything(frame):
    assert sockets.user_id(frame) is None


# ----------------------------------------------------------------------------- shared memory, security


class _FakeSegment:
    """What _check_header reads of a SharedMemory: name, size, buf."""

    def __init__(self, buf: bytes):
        self.name, self.size, self.buf = "fuzz", len(buf), memoryview(bytearray(buf))


@FUZZ
@given(st.data())
def test_segment_header_check(data):
    """A segment another process made (an actor attaching): random bytes, or a header of random
    field values, is either this ring's or refused with ShmError."""
    if data.draw(st.booleans()):
        buf = data.draw(st.binary(max_size=HEADER_NBYTES + 64))
    else:
        fields = (
            data.draw(st.sampled_from([MAGIC, b"ASYNCRL1", bytes(8)])),
            data.draw(st.integers(0, 2**64 - 1)),
            data.draw(st.sampled_from([SPEC.slot_nbytes, 0, 2**64 - 1])),
            data.draw(st.sampled_from([_hash(SPEC), b"x" * 16])),
            data.draw(st.binary(min_size=16, max_size=16)),
        )
        buf = _HEADER.pack(*fields) + data.draw(st.binary(max_size=256))
    token = data.draw(st.one_of(st.none(), st.binary(min_size=16, max_size=16)))
    try:
        found = _check_header(_FakeSegment(buf), SPEC, 2, token)
    except ShmError:
        return
    assert len(found) == 16


@FUZZ
@given(st.binary(max_size=80), hostile_text)
def test_zap_key_check_of_any_key(key, address):
    from asyncrl.wire.security import Security, _AllowedKeys

    class _Auth:
        pass

    auth = _Auth()
    auth.address = address
    sec = Security("fuzz")
    sec.refused.log = logging.getLogger("fuzz.quiet")
    allowed = frozenset({b"A" * 40})
    assert _AllowedKeys(allowed, sec, auth).callback("*", key) is (key in allowed)
