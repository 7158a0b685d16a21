"""Weights sync sized for large models (issue 43): payloads in float32, float16 or bfloat16 with a
checksum and an HMAC over the bytes sent; version pings instead of re-sent weights (the learner's signed
ping, the broadcaster's answer, its pings on PUB, snapshot requests that name the version held), each
under hostile values; the learner's clear error when its weights exceed the broadcaster's limit."""

from __future__ import annotations

import contextlib
import math
import time

import msgpack
import numpy as np
import pytest
from slot_examples import SMALL

from asyncrl.core import config
from asyncrl.roles.broadcaster import Broadcaster
from asyncrl.roles.learner import Learner, LearnerError
from asyncrl.run.launch import free_port_pair
from asyncrl.wire import addresses, codec, protocol, sockets
from asyncrl.wire.weights_secret import read_weights_secret

pytestmark = pytest.mark.timeout(90)

SECRET = b"s" * 64
BF16 = np.array([0x3F80, 0xBF80, 0x0000, 0x4049], np.uint16)  # 1.0, -1.0, 0.0, 3.140625


def _weights(payload, *, version=3, epoch=5, run_id="r"):
    return codec.encode_weights(
        run_id=run_id, epoch=epoch, version=version, publish_time=1.0, layout_hash="h", payload=payload
    )


def _header(frames) -> dict:
    return msgpack.unpackb(bytes(frames[1]), raw=False)


def _with_header(frames, **changes) -> list:
    """``frames`` with header keys changed (a hand-made header: the codec would refuse to pack it)."""
    return [frames[0], msgpack.packb({**_header(frames), **changes}, use_bin_type=True), *frames[2:]]


# ---- payload dtypes ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "payload, dtype",
    [
        (np.linspace(-2, 2, 6, dtype=np.float32), "float32"),
        (np.linspace(-2, 2, 6).astype(np.float16), "float16"),
        (BF16, "bfloat16"),
    ],
)
def test_each_wire_dtype_round_trips_and_its_checksum_and_signature_cover_the_bytes_sent(payload, dtype):
    frames = _weights(payload)
    header, got = codec.decode_weights(frames)
    assert header["dtype"] == dtype and header["nbytes"] == payload.nbytes and got.dtype == payload.dtype
    assert np.array_equal(got, payload) and not got.flags.writeable
    flipped = bytearray(bytes(frames[2]))
    flipped[-1] ^= 1  # one bit of the last element
    with pytest.raises(protocol.ProtocolError) as info:
        codec.decode_weights([frames[0], frames[1], bytes(flipped)])
    assert info.value.reason == "checksum"
    signed = codec.sign_weights(frames, SECRET)
    with pytest.raises(protocol.ProtocolError) as info:
        codec.verify_weights([*signed[:2], bytes(flipped), signed[3]], SECRET)
    assert info.value.reason == "not_learner"


def test_hostile_weights_headers_are_refused_by_reason():
    good = _weights(BF16)
    nan16 = np.array([0x7FC0], np.uint16)  # a bfloat16 NaN

    def late(dtype):  # a NaN (bfloat16: -inf) in the last element, past the finiteness check's first chunks
        payload = np.zeros(2 * codec._CHUNK + 3, dtype)
        payload[-1] = 0xFF80 if dtype == np.uint16 else np.nan
        return payload

    inf16 = np.array([np.float16(np.inf)], np.float16)
    cases = {
        "dtype": [_with_header(good, dtype=d) for d in ("int8", "float64", "", "x" * 300)],
        "schema": [_with_header(good, dtype=d) for d in (2, None, True)]
        + [[good[0], msgpack.packb({k: v for k, v in _header(good).items() if k != "dtype"}), good[2]]],
        "frame_size": [
            _with_header(good, nbytes=7),  # not whole elements
            [good[0], good[1], bytes(good[2])[:6]],
        ],
        "nonfinite": [
            _weights(nan16),
            _weights(inf16),
            *(_weights(late(d)) for d in (np.float32, np.float16, np.uint16)),
        ],
    }
    for reason, messages in cases.items():
        for frames in messages:
            with pytest.raises(protocol.ProtocolError) as info:
                codec.decode_weights(frames)
            assert info.value.reason == reason, (reason, _header(frames))
    for bad in (np.ones(3, np.float64), np.ones(3, np.int16), np.ones((2, 2), np.float32)):
        with pytest.raises(ValueError):
            _weights(bad)


def test_version_pings_decode_and_no_signature_holds_across_message_kinds():
    ping = codec.encode_version(run_id="r", epoch=5, version=9, nbytes=8)
    assert codec.decode_version(ping, run_id="r") == {
        "type": "weights_version",
        "proto": protocol.PROTOCOL_VERSION,
        "run_id": "r",
        "epoch": 5,
        "version": 9,
        "nbytes": 8,
    }
    signed = codec.sign_version(ping, SECRET)
    assert [bytes(f) for f in codec.verify_version(signed, SECRET)] == [bytes(f) for f in ping]
    weights = codec.sign_weights(_weights(BF16), SECRET)
    for bad in (
        ping,  # unsigned
        [*ping, weights[3]],  # a weights message's HMAC
        [*ping, b""],
        codec.sign_version(ping, b"guess"),
        [ping[0], _with_header(ping, version=10)[1], signed[2]],  # the header changed after signing
    ):
        with pytest.raises(protocol.ProtocolError) as info:
            codec.verify_version(bad, SECRET)
        assert info.value.reason == "not_learner"
    with pytest.raises(protocol.ProtocolError):
        codec.verify_weights([*weights[:3], signed[2]], SECRET)  # a ping's HMAC on weights
    for frames, reason in (
        ([b"weights", ping[1]], "topic"),
        ([ping[0]], "frame_count"),
        ([*ping, b""], "frame_count"),
        (_with_header(ping, version=-1), "schema"),
        (_with_header(ping, epoch=True), "schema"),
        (_with_header(ping, version=2**64 - 1), "schema"),
        (_with_header(ping, extra=1), "schema"),
        (_with_header(ping, type="weights"), "schema"),
        (_with_header(ping, proto=3), "proto"),
    ):
        with pytest.raises(protocol.ProtocolError) as info:
            codec.decode_version(frames)
        assert info.value.reason == reason, frames


def test_weights_queues_hold_a_bounded_number_of_bytes():
    assert sockets.weights_hwm(4 << 20) == 8  # the tiny model, every control policy: every version
    assert sockets.weights_hwm(494_032_768 * 2) == 2  # Qwen2.5-0.5B as bfloat16
    assert sockets.weights_hwm(1_543_714_304 * 4) == 2  # a 1.5B model as float32
    assert sockets.weights_hwm(256 << 20) == 4


# ---- the broadcaster's answers ---------------------------------------------------------------------


@contextlib.contextmanager
def _broadcaster(tmp_path, **kwargs):
    b = Broadcaster(f"tcp://127.0.0.1:{free_port_pair()}", summary=tmp_path / "b.json", echo=lambda *_: None, **kwargs)
    ctx = sockets.context()
    ep = addresses.snapshot_endpoint(b.endpoint)
    peers = {name: sockets.dealer(ctx, ep, sockets.route_identity(name)) for name in ("learner", "actor", "spy")}
    try:
        yield b, peers, read_weights_secret(b.endpoint)
    finally:
        sockets.close(*peers.values())
        ctx.term()
        b.close()


def _answer(b, sock, deadline_s=10.0):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        b.serve(20)
        frames = sockets.recv_multipart_timeout(sock, 20)
        if frames is not None:
            return frames
    return None


def _serve_until(b, pred, deadline_s=10.0):
    deadline = time.monotonic() + deadline_s
    while not pred() and time.monotonic() < deadline:
        b.serve(20)
    assert pred()


def test_the_broadcaster_answers_signed_version_pings_only(tmp_path):
    with _broadcaster(tmp_path, max_weights_bytes=1 << 20) as (b, peers, secret):
        learner, spy = peers["learner"], peers["spy"]

        def ping(version, sock=learner, key=secret, epoch=7):
            sockets.send(
                sock, codec.sign_version(codec.encode_version(run_id="r", epoch=epoch, version=version, nbytes=8), key)
            )
            reply = _answer(b, sock)
            return None if reply is None else codec.decode(reply, run_id="r")[0]

        status = ping(0)  # holds nothing: it wants the weights, and says how large they may be
        assert status["type"] == "weights_status" and status["wanted"] is True and status["max_bytes"] == 1 << 20
        sockets.send(learner, codec.sign_weights(_weights(BF16, epoch=7, version=0), secret))
        _serve_until(b, lambda: b.newest == (7, 0))
        assert ping(0)["wanted"] is False  # holds it: nothing re-sent
        assert ping(1)["wanted"] is True  # a newer version
        # forged pings: unsigned, a guessed secret, the learner's HMAC of another header; no answer, each counted
        sockets.send(spy, codec.encode_version(run_id="r", epoch=7, version=5, nbytes=8))
        sockets.send(spy, codec.sign_version(codec.encode_version(run_id="r", epoch=8, version=0, nbytes=8), b"guess"))
        good = codec.sign_version(codec.encode_version(run_id="r", epoch=7, version=2, nbytes=8), secret)
        sockets.send(spy, [good[0], codec.encode_version(run_id="r", epoch=9, version=0, nbytes=8)[1], good[2]])
        _serve_until(b, lambda: b.rejects.by_reason().get("not_learner") == 3)
        assert sockets.recv_multipart_timeout(spy, 100) is None
        assert b.newest == (7, 0) and b.pings["learner"] == 3
    assert b.counts()["version_pings"]["learner"] == 3


def test_hostile_values_in_snapshot_requests_and_pings_never_stall_the_broadcaster(tmp_path):
    """A snapshot request naming the version held gets a version ping, not the weights; hostile
    values of the new keys are refused (counted), and the broadcaster goes on answering."""
    with _broadcaster(tmp_path) as (b, peers, secret):
        learner, actor, spy = peers["learner"], peers["actor"], peers["spy"]
        payload = np.arange(64, dtype=np.float32)
        sockets.send(learner, codec.sign_weights(_weights(payload, epoch=7, version=4), secret))
        _serve_until(b, lambda: b.newest == (7, 4))

        def snapshot(sock=actor, **have):
            time.sleep(0.25)  # one snapshot answer per connection per 0.2 s
            sockets.send(sock, codec.encode({"type": "snapshot", "run_id": "r", "actor_id": "a", **have}))
            return _answer(b, sock)

        reply = snapshot(epoch=7, version=4)
        assert len(reply) == 1 and codec.decode(reply)[0] == {
            "type": "weights_version",
            "proto": protocol.PROTOCOL_VERSION,
            "run_id": "r",
            "epoch": 7,
            "version": 4,
            "nbytes": 256,
        }
        for have in ({"epoch": 7, "version": 3}, {"epoch": 6, "version": 4}, {"epoch": 7, "version": 2**63 - 1}, {}):
            reply = snapshot(**have)  # anything but the held version: the weights
            assert len(reply) == 3 and np.array_equal(codec.decode_weights(reply)[1], payload)
        rejected = b.rejects.total
        hostile = [
            {"epoch": -1, "version": 4},
            {"epoch": 7, "version": True},
            {"epoch": 7.0, "version": 4},
            {"epoch": "7", "version": "4"},
            {"epoch": [7], "version": None},
            {"version": 2**64 - 1},
        ]
        header = {"type": "snapshot", "proto": protocol.PROTOCOL_VERSION, "run_id": "r", "actor_id": "x"}
        for have in hostile:
            sockets.send(spy, [msgpack.packb({**header, **have}, use_bin_type=True)])
        # hostile version pings and statuses sent to the broadcaster: no learner signature or not a request
        sockets.send(spy, [protocol.VERSION_TOPIC, b"\xc1", b""])
        sockets.send(spy, [protocol.VERSION_TOPIC])
        sockets.send(spy, codec.encode({"type": "weights_status", "run_id": "r", "wanted": True, "max_bytes": 1}))
        ping = {"type": "weights_version", "run_id": "r", "epoch": 2**62, "version": 0, "nbytes": 1}
        sockets.send(spy, codec.encode(ping))
        _serve_until(b, lambda: b.rejects.total == rejected + len(hostile) + 4)
        reasons = b.rejects.by_reason()
        assert reasons.get("schema", 0) >= 5 and reasons.get("not_learner", 0) >= 1, reasons
        assert len(snapshot(epoch=7, version=4)) == 1 and b.newest == (7, 4)


def test_subscribers_get_version_pings_while_weights_are_held(tmp_path):
    with _broadcaster(tmp_path) as (b, peers, secret):
        ctx = sockets.context()
        sub = sockets.sub(ctx, b.endpoint)
        try:
            sockets.send(peers["learner"], codec.sign_weights(_weights(BF16, epoch=7, version=2), secret))
            _serve_until(b, lambda: b.newest == (7, 2))
            pings = []
            deadline = time.monotonic() + 20
            while not pings and time.monotonic() < deadline:
                b.serve(50)
                pings = [f for f in sockets.drain_all(sub) if len(f) == 2]
            assert pings, "no version ping reached the subscriber"
            header = codec.decode_version(pings[0], run_id="r")
            assert (header["epoch"], header["version"]) == (7, 2)
        finally:
            sockets.close(sub)
            ctx.term()


# ---- the learner: no re-send, and its limit ---------------------------------------------------------


@contextlib.contextmanager
def _learner_and_broadcaster(tmp_path, **kwargs):
    b = Broadcaster(f"tcp://127.0.0.1:{free_port_pair()}", echo=lambda *_: None, **kwargs)
    learner = None
    try:
        learner = Learner(
            config.load(None, SMALL),
            tmp_path / "run",
            run_id="sync",
            bind="tcp://127.0.0.1:0",
            broadcaster=b.endpoint,
            echo=lambda *_: None,
        )
        yield learner, b
    finally:
        if learner is not None:
            learner.close()
        b.close()


def test_an_idle_learner_pings_and_never_sends_its_weights_again(tmp_path):
    """Versions reach the broadcaster once; while no new version is made the learner sends pings of
    its version (a header each), which keep its epoch alive at the broadcaster."""
    with _learner_and_broadcaster(tmp_path) as (learner, b):
        deadline = time.monotonic() + 30
        while learner.weights_traffic["pings_sent"] < 3 and time.monotonic() < deadline:
            learner.serve(20)
            b.serve(20)
        assert learner.weights_traffic["pings_sent"] >= 3, dict(learner.weights_traffic)
        assert b.newest == (learner.epoch, 0) and b.published == 1
        assert learner.weights_traffic["versions_sent"] == 1
        assert learner.weights_traffic["bytes_sent"] == learner.weights.nbytes == learner.state.flat_weights().nbytes
        summary = learner.weights_summary()
        assert summary["bytes_per_version"] == learner.weights.nbytes and summary["dtype"] == "float32"
        assert summary["holds"] == "every parameter and buffer"


def test_weights_over_the_broadcasters_limit_stop_the_learner_with_one_line(tmp_path):
    with _learner_and_broadcaster(tmp_path, max_weights_bytes=1024) as (learner, b):
        assert learner.weights.nbytes > 1024
        deadline = time.monotonic() + 30
        with pytest.raises(LearnerError, match=r"takes weights of at most 0\.00 MiB.*--max-weights-mb") as info:
            while time.monotonic() < deadline:
                learner.serve(20)
                b.serve(20)
        assert "\n" not in str(info.value)
        assert b.published == 0  # nothing over the limit was sent
        assert math.isclose(learner.weights.mib, math.ceil(learner.weights.nbytes * 100 / 2**20) / 100)


def test_the_held_epochs_pings_keep_a_lower_epoch_out(tmp_path, monkeypatch):
    """A learner that pings instead of re-sending its weights is alive to the broadcaster: a lower epoch
    (a learner started after the clock went back) is taken only once the pings stop for STALE_EPOCH_S."""
    from asyncrl.roles import broadcaster as bmod

    monkeypatch.setattr(bmod, "STALE_EPOCH_S", 2.0)
    with _broadcaster(tmp_path) as (b, peers, secret):
        learner = peers["learner"]
        sockets.send(learner, codec.sign_weights(_weights(BF16, epoch=1000, version=5), secret))
        _serve_until(b, lambda: b.newest == (1000, 5))
        for _ in range(8):  # 4 s of pings, twice STALE_EPOCH_S
            sockets.send(
                learner, codec.sign_version(codec.encode_version(run_id="r", epoch=1000, version=5, nbytes=8), secret)
            )
            assert _answer(b, learner) is not None
            time.sleep(0.5)
        sockets.send(learner, codec.sign_weights(_weights(BF16, epoch=10, version=0), secret))
        for _ in range(10):  # the held epoch's learner pinged 0.5 s ago
            b.serve(20)
        assert b.newest == (1000, 5) and b.rejects.total == 0
        time.sleep(2.2)  # silent now
        sockets.send(learner, codec.sign_weights(_weights(BF16, epoch=10, version=1), secret))
        _serve_until(b, lambda: b.newest == (10, 1))


def test_the_broadcasters_memory_bound_follows_the_models_size_and_dtype():
    from asyncrl.roles.resource_bounds import memory_bound_bytes
    from asyncrl.tasks.base import WeightsInfo

    qwen_05b = WeightsInfo(494_032_768, "bfloat16", "every parameter")
    assert qwen_05b.nbytes == 988_065_536 and qwen_05b.mib == 942.3  # rounded up
    bound = memory_bound_bytes("broadcaster", weights_bytes=qwen_05b.nbytes, connections=4)
    assert bound.terms["weights"] == 2 * qwen_05b.nbytes
    assert bound.terms["subscribers"] == 4 * 2 * qwen_05b.nbytes  # two messages per subscriber queue
    lora = WeightsInfo(8_798_208, "float32", "the LoRA adapter (rank 16)")  # Qwen2.5-0.5B, all-linear
    small = memory_bound_bytes("broadcaster", weights_bytes=lora.nbytes, connections=4)
    assert small.terms["subscribers"] == 4 * 8 * lora.nbytes and small.total < bound.total / 20


def test_a_relay_smaller_than_its_upstreams_weights_stops_with_one_line(tmp_path):
    """The upstream's version pings carry the payload's size: a relay whose frame limit would drop every
    version says so and ends (its actors would otherwise wait for weights for ever)."""
    from asyncrl.roles.broadcaster import BroadcasterError

    with _broadcaster(tmp_path) as (b, peers, secret):
        sockets.send(peers["learner"], codec.sign_weights(_weights(np.ones(1 << 16, np.float32), epoch=7), secret))
        _serve_until(b, lambda: b.newest == (7, 3))
        relay = Broadcaster(
            f"tcp://127.0.0.1:{free_port_pair()}", upstream=b.endpoint, echo=lambda *_: None, max_weights_bytes=1 << 16
        )
        try:
            deadline = time.monotonic() + 30
            with pytest.raises(
                BroadcasterError, match=r"are 0\.25 MiB, over this relay's 0\.06 MiB.*--max-weights-mb 0\.25"
            ) as info:
                while time.monotonic() < deadline:
                    b.serve(20)
                    relay.serve(20)
            assert "\n" not in str(info.value) and relay.published == 0
        finally:
            relay.close()


def test_an_actor_never_asks_for_snapshots_faster_than_the_broadcaster_answers(monkeypatch):
    """Every `asyncrl run` used to end with "the broadcaster rejected messages: {'snapshot_rate': 2}":
    an actor asked for its first weights, then at once again for the newer version a ping named, and
    the broadcaster refuses requests closer than protocol.SNAPSHOT_INTERVAL_S. The actor now spaces
    its requests by at least that (a lower bound on the gaps: load only widens them)."""
    from asyncrl.roles import actor_weights

    sent: list[float] = []
    monkeypatch.setattr(actor_weights.sockets, "send", lambda *a, **k: sent.append(time.monotonic()) or True)

    class Opts:
        actor_id = "a0"

    class Asker(actor_weights.WeightsFromBroadcaster):
        run_id, opts, history, snapshot, epoch = "r", Opts(), None, object(), 1

    asker = Asker()
    for _ in range(4):
        asker.ask_snapshot()
    gaps = [b - a for a, b in zip(sent, sent[1:])]
    assert len(sent) == 4 and min(gaps) >= protocol.SNAPSHOT_INTERVAL_S, gaps
