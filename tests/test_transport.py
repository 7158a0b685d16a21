"""Wire format validation, weights messages and real sockets (loopback TCP, inproc)."""

import logging
import time
import zlib
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq

from asyncrl.core.spec import RolloutSpec
from asyncrl.wire import codec, protocol, rejects, sockets
from asyncrl.wire.protocol import ProtocolError

pytestmark = pytest.mark.timeout(30)

RUN = "run-1"
SPEC = RolloutSpec(obs_dim=3, action_dim=1, discrete=True, rollout_length=4, num_envs=2)
REPORT = dict(
    actor_id="a0",
    token=b"k" * 16,
    grant_id=7,
    env_steps=8,
    episode_returns=[1.5, -2.0],
    episode_lengths=[3, 5],
    timing={"env_s": 0.5, "inference_s": 0.1, "wait_s": 0.0},
)
HEADERS = {
    "hello": dict(
        actor_id="a0", host="h", pid=123, env_id="CartPole-v1", spec=SPEC.to_dict(), shm_token=None, token=None
    ),
    "request": dict(actor_id="a0", token=b"k" * 16),
    "ready": dict(REPORT, slot=2),
    "rollout": REPORT,
    "heartbeat": dict(actor_id="a0", token=b"k" * 16),
    "bye": dict(actor_id="a0", token=b"k" * 16),
    "welcome": dict(
        shm_name="asyncrl-run-1-42",
        num_slots=4,
        spec=SPEC.to_dict(),
        restart=0,
        token=b"t" * 16,
        config='{"env": {"id": "CartPole-v1"}}',
        epoch=2**63 - 1,
        actor_token=b"k" * 16,
    ),
    "rejoin": dict(reason="learner restarted"),
    "snapshot": dict(actor_id="a0"),
    "refuse": dict(reason="spec differs"),
    "grant": dict(slot=1, grant_id=9),
    "stop": dict(reason="done"),
}


def _header(kind: str, **changes) -> dict:
    return {"type": kind, "proto": protocol.PROTOCOL_VERSION, "run_id": RUN, **HEADERS[kind], **changes}


def _raw(header) -> list[bytes]:
    """Frames the way a buggy or hostile peer would send them: no sender-side checks."""
    return [msgpack.packb(header, use_bin_type=True)]


def _rollout_arrays(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    arrays = SPEC.allocate()
    for _name, a in arrays.items():
        a[...] = rng.integers(0, 2, a.shape) if a.dtype == np.bool_ else rng.normal(size=a.shape)
    return arrays


def _rejected(reason: str, frames, **kw):
    with pytest.raises(ProtocolError) as info:
        codec.decode(frames, **kw)
    assert info.value.reason == reason, info.value


@pytest.fixture
def ctx():
    c = sockets.context()
    yield c
    c.destroy(linger=0)


# ---------------------------------------------------------------------------- headers


@pytest.mark.parametrize("kind", sorted(HEADERS))
def test_round_trip_every_message_type(kind):
    header = {k: v for k, v in _header(kind).items() if k != "proto"}  # encode fills proto in
    arrays = [_rollout_arrays()[f.name] for f in SPEC.fields] if kind == "rollout" else []
    got, rest = codec.decode(codec.encode(header, arrays), run_id=RUN)
    assert got == _header(kind)
    assert len(rest) == len(arrays)


def test_encode_converts_numpy_scalars_and_refuses_bad_headers():
    header = dict(_header("ready"), env_steps=np.int64(8), episode_returns=[np.float32(1.5)])
    got, _ = codec.decode(codec.encode(header))
    assert type(got["env_steps"]) is int and got["episode_returns"] == [1.5]
    with pytest.raises(ProtocolError):
        codec.encode(_header("grant", slot="1"))
    with pytest.raises(ProtocolError, match="frame_count"):
        codec.encode(_header("grant"), [np.zeros(3)])


def test_random_bytes_rejected():
    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 100, 5000):
        with pytest.raises(ProtocolError):
            codec.decode([rng.bytes(n)])
    with pytest.raises(ProtocolError, match="malformed"):
        codec.decode([msgpack.packb([1, 2, 3])])
    with pytest.raises(ProtocolError, match="malformed"):
        codec.decode([msgpack.packb({1: 2})])  # non-str key
    with pytest.raises(ProtocolError, match="malformed"):  # ext types (e.g. timestamps) refused
        codec.decode([msgpack.packb({"type": msgpack.Timestamp(1)}, datetime=False)])
    _rejected("frame_count", [])


def test_mutated_headers_raise_only_protocol_error():
    """Whatever a corrupted header turns into, decode either accepts it or raises ProtocolError."""
    rng = np.random.default_rng(1)
    valid = [codec.encode(_header(kind))[0] for kind in sorted(HEADERS) if kind != "rollout"]
    for i in range(2000):
        frame = bytearray(valid[i % len(valid)])
        for pos in rng.integers(0, len(frame), rng.integers(1, 4)):
            frame[pos] = rng.integers(0, 256)
        try:
            codec.decode([bytes(frame)])
        except ProtocolError:
            pass


@pytest.mark.parametrize(
    "reason, header",
    [
        ("run_id", _header("request", run_id="other")),
        ("proto", _header("request", proto=protocol.PROTOCOL_VERSION + 1)),
        ("proto", _header("request", proto=True)),
        ("unknown_type", dict(_header("request"), type="shutdown_everything")),
        ("unknown_type", {k: v for k, v in _header("request").items() if k != "type"}),
        ("schema", {k: v for k, v in _header("grant").items() if k != "grant_id"}),
        ("schema", _header("grant", extra=1)),
        ("schema", _header("grant", slot="1")),
        ("schema", _header("grant", slot=True)),
        ("schema", _header("grant", slot=-1)),
        ("schema", _header("grant", slot=1.0)),
        ("schema", _header("hello", shm_token="not bytes")),
        ("schema", _header("hello", spec={"obs_dim": [1, 2]})),
        ("schema", _header("ready", episode_returns=[1.0, float("nan")])),
        ("schema", _header("ready", episode_returns=[1.0, 2])),
        ("schema", _header("ready", episode_lengths=[3, -1])),
        ("schema", _header("rollout", episode_returns="1.0")),
    ],
)
def test_bad_headers_rejected(reason, header):
    _rejected(reason, _raw(header), run_id=RUN)


def test_oversized_header_rejected():
    big = _header("refuse", reason="x" * (protocol.MAX_HEADER_BYTES + 1))
    _rejected("oversized", [msgpack.packb(big)])


def test_array_frames_only_on_rollout():
    _rejected("frame_count", _raw(_header("heartbeat")) + [b"\0" * 8])


# ---------------------------------------------------------------------------- rollout frames


def test_rollout_frames_zero_copy_read_only():
    arrays = _rollout_arrays()
    header, rest = codec.decode(codec.encode_rollout(dict(REPORT, run_id=RUN), arrays, SPEC), run_id=RUN)
    assert header["type"] == "rollout"
    got = codec.decode_rollout_frames(rest, SPEC)
    for name, a in arrays.items():
        np.testing.assert_array_equal(got[name], a)
        assert got[name].dtype == a.dtype and not got[name].flags.writeable
        assert np.shares_memory(got[name], a)  # neither encode nor decode copied
    # received as bytes (what a socket returns), the result is the same
    as_bytes = [bytes(f) for f in rest]
    np.testing.assert_array_equal(codec.decode_rollout_frames(as_bytes, SPEC)["obs"], arrays["obs"])


def test_rollout_frame_errors():
    arrays = _rollout_arrays()
    frames = [bytes(f) for f in codec.encode_rollout(dict(REPORT, run_id=RUN), arrays, SPEC)[1:]]
    names = SPEC.field_names

    def rejected(reason, bad, match=None):
        with pytest.raises(ProtocolError, match=match) as info:
            codec.decode_rollout_frames(bad, SPEC)
        assert info.value.reason == reason

    rejected("frame_count", frames[:-1])
    rejected("frame_count", frames + [b""])
    i = names.index("obs")
    rejected("frame_size", frames[:i] + [frames[i][:-4]] + frames[i + 1 :], match="obs")
    for name, value in (("rewards", np.nan), ("obs", np.inf), ("behavior_log_prob", -np.inf)):
        bad = dict(arrays)
        bad[name] = arrays[name].copy()
        bad[name].flat[1] = value
        bad_frames = [bytes(f) for f in codec.encode_rollout(dict(REPORT, run_id=RUN), bad, SPEC)[1:]]
        rejected("nonfinite", bad_frames, match=name)
    j = names.index("terminated")
    rejected("bad_bool", frames[:j] + [b"\x02" + frames[j][1:]] + frames[j + 1 :])
    with pytest.raises(ValueError):  # sender side: wrong dtype
        codec.encode_rollout(REPORT, dict(arrays, rewards=arrays["rewards"].astype(np.float64)), SPEC)


def test_check_finite_names():
    arrays = {"a": np.array([1.0, np.nan]), "b": np.array([1.0])}
    codec.check_finite(arrays, ["b"])
    with pytest.raises(ProtocolError, match="a holds 1"):
        codec.check_finite(arrays)


# ---------------------------------------------------------------------------- weights


def _weights(version=3, payload=None, **kw):
    payload = np.linspace(-1, 1, 1000, dtype=np.float32) if payload is None else payload
    args = dict(run_id=RUN, version=version, publish_time=12.5, layout_hash="abc", payload=payload)
    return codec.encode_weights(**{**args, **kw})


def test_weights_round_trip():
    payload = np.linspace(-1, 1, 1000, dtype=np.float32)
    header, got = codec.decode_weights(_weights(payload=payload), run_id=RUN, layout_hash="abc")
    np.testing.assert_array_equal(got, payload)
    assert not got.flags.writeable
    assert header["version"] == 3 and header["publish_time"] == 12.5
    assert header["nbytes"] == 4000 and header["checksum"] == zlib.crc32(payload.tobytes())


def test_weights_rejections():
    def rejected(reason, frames, **kw):
        with pytest.raises(ProtocolError) as info:
            codec.decode_weights(frames, **kw)
        assert info.value.reason == reason, info.value

    topic, header, body = [bytes(f) for f in _weights()]
    flipped = bytearray(body)
    flipped[10] ^= 0xFF
    rejected("checksum", [topic, header, bytes(flipped)])
    rejected("layout", [topic, header, body], layout_hash="other")
    rejected("run_id", [topic, header, body], run_id="other")
    rejected("frame_size", [topic, header, body[:-4]])
    rejected("frame_count", [topic, header])
    rejected("topic", [b"weightz", header, body])
    rejected("unknown_type", [topic, _raw(_header("stop"))[0], body])
    nan = np.ones(4, np.float32)
    nan[2] = np.nan
    rejected("nonfinite", [bytes(f) for f in _weights(payload=nan)])
    with pytest.raises(ValueError):
        _weights(payload=np.ones(4, np.float64))


# ---------------------------------------------------------------------------- rejects


def test_reject_counter_counts_and_logs_without_raising(caplog):
    counter = rejects.RejectCounter("learner")
    with caplog.at_level(logging.WARNING, logger="asyncrl.wire.transport"):
        for _ in range(5):
            try:
                codec.decode([b"garbage"])
            except ProtocolError as e:
                counter.reject(e, sender=b"actor-1")
        counter.reject("heartbeat_timeout")
    assert counter.counts[("malformed", "actor-1")] == 5
    assert counter.by_reason() == {"malformed": 5, "heartbeat_timeout": 1}
    assert counter.total == 6
    assert len(caplog.records) == 4  # 1st, 2nd, 4th of one kind + 1st of the other
    assert "actor-1" in caplog.records[0].getMessage()


# ---------------------------------------------------------------------------- sockets


def test_router_dealer_round_trip_over_tcp(ctx):
    server = sockets.router(ctx, "tcp://127.0.0.1:0")
    endpoint = sockets.endpoint_of(server)
    assert endpoint.startswith("tcp://127.0.0.1:") and not endpoint.endswith((":0", ":*"))
    client = sockets.dealer(ctx, endpoint, identity="actor-7")
    try:
        assert sockets.send(client, codec.encode(_header("hello")))
        frames = sockets.recv_multipart_timeout(server, 5000)
        assert frames is not None and frames[0] == b"actor-7"
        header, _ = codec.decode(frames[1:], run_id=RUN)
        assert header["type"] == "hello" and header["spec"] == SPEC.to_dict()

        assert sockets.send(server, [frames[0], *codec.encode(_header("grant"))])
        reply = sockets.recv_multipart_timeout(client, 5000)
        assert codec.decode(reply, run_id=RUN)[0]["slot"] == 1

        arrays = _rollout_arrays(seed=3)
        assert sockets.send(client, codec.encode_rollout(dict(REPORT, run_id=RUN), arrays, SPEC))
        frames = sockets.recv_multipart_timeout(server, 5000, copy=False)
        assert frames[0].bytes == b"actor-7"
        header, rest = codec.decode(frames[1:], run_id=RUN)
        got = codec.decode_rollout_frames(rest, SPEC)
        for name, a in arrays.items():
            np.testing.assert_array_equal(got[name], a)
        assert sockets.recv_multipart_timeout(server, 20) is None
    finally:
        sockets.close(client, server)


def test_drain_latest_keeps_newest_complete_multipart(ctx):
    a = ctx.socket(zmq.PAIR)
    b = ctx.socket(zmq.PAIR)
    try:
        a.bind("inproc://drain")
        b.connect("inproc://drain")
        assert sockets.drain_latest(b) is None
        for v in (1, 2, 3):
            a.send_multipart([b"weights", b"v%d" % v, b"payload%d" % v])
        deadline = time.monotonic() + 5
        while not b.poll(0) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [f.bytes for f in sockets.drain_latest(b)] == [b"weights", b"v3", b"payload3"]
        assert sockets.drain_latest(b) is None
    finally:
        sockets.close(a, b)


def test_pub_sub_latest_weights_only(ctx):
    publisher = sockets.pub(ctx, "tcp://127.0.0.1:*")
    subscriber = sockets.sub(ctx, sockets.endpoint_of(publisher))
    try:
        # slow joiner: the subscription takes a moment to reach the publisher
        deadline = time.monotonic() + 5
        while sockets.drain_latest(subscriber) is None:
            assert time.monotonic() < deadline, "subscriber never connected"
            sockets.send(publisher, _weights(version=0), block=False)
            time.sleep(0.02)
        time.sleep(0.05)
        sockets.drain_latest(subscriber)  # flush probes still in flight

        for v in range(1, 6):
            assert sockets.send(publisher, _weights(version=v))
        versions = []
        deadline = time.monotonic() + 5
        while not versions or versions[-1] != 5:
            assert time.monotonic() < deadline, f"never saw version 5: {versions}"
            time.sleep(0.05)
            if (frames := sockets.drain_latest(subscriber)) is not None:
                header, _ = codec.decode_weights(frames, run_id=RUN, layout_hash="abc")
                versions.append(header["version"])
        assert versions == sorted(versions) and len(versions) < 5  # older ones were skipped
        assert sockets.drain_latest(subscriber) is None
    finally:
        sockets.close(subscriber, publisher)


def test_push_pull_and_timeouts(ctx):
    with pytest.raises(ValueError):
        sockets.push(ctx)
    sink = sockets.pull(ctx, bind="tcp://127.0.0.1:*")
    source = sockets.push(ctx, connect=sockets.endpoint_of(sink))
    try:
        assert sockets.recv_multipart_timeout(sink, 20) is None
        assert sockets.send(source, _weights(version=1))
        frames = sockets.recv_multipart_timeout(sink, 5000)
        assert codec.decode_weights(frames)[0]["version"] == 1
        assert sockets.poll([sink], 20) == set()
    finally:
        sockets.close(source, sink)


def test_free_ports_lie_outside_the_ephemeral_range(tmp_path, monkeypatch):
    """A listening port the supervisor picks is never one the kernel can give a connect() as its
    source port, so an actor reconnecting to a learner not yet bound cannot connect to itself."""
    from asyncrl.run import launch

    lo, hi = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    for _ in range(20):
        p, q = launch.free_port(), launch.free_port_pair()
        assert not lo <= p <= hi and not lo <= q <= hi and not lo <= q + 1 <= hi
    rng = tmp_path / "range"
    rng.write_text("1024\t64000\n")  # nothing free below it: the ports above it are used
    monkeypatch.setattr(launch, "EPHEMERAL_RANGE_FILE", rng)
    assert all(64000 < p < 65535 for p in launch.listen_port_candidates(count=50, span=2))
    rng.write_text("1024\t65535\n")  # no room at all: any unprivileged port
    assert all(1024 <= p <= 65535 for p in launch.listen_port_candidates(count=50))
