"""Property-based (hypothesis, stateful) hostile peers against a live learner and a live broadcaster:
sequences of well-formed messages whose fields take extreme values (0, -1, 2**31,
2**63, 2**64 - 1, NaN, +-inf, +-3e38, empty and maximal strings and lists, wrong types), from
peers that connect and disconnect at random, while an honest actor trains. After every message:
the role is alive (nothing escaped ``serve``), a message with a value outside the schema's bounds
was rejected and counted exactly once, and no message counts more than once; a broadcaster
answers or counts every request. At the end: training went on.

Derandomised, with a fixed example budget that fits CI (about 30 s here on a loaded 2-core box)."""

from __future__ import annotations

import math
import time

import msgpack
import pytest
from hostile_helpers import SPEC, STEPS, Peer, live_learner, report, valid_slot
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from asyncrl.wire import addresses, codec, protocol, sockets

pytestmark = [pytest.mark.hostile, pytest.mark.timeout(900)]

EXTREME_INTS = [0, -1, 1, 2**31, 2**63 - 1, 2**63, 2**64 - 1]
EXTREME_FLOATS = [0.0, -0.0, math.nan, math.inf, -math.inf, 3e38, -3e38, 1e15, 1e300]
MAX_STR = codec.MAX_STR_BYTES
EXTREME_STRS = ["", "x" * MAX_STR, "x" * (MAX_STR + 1), "a\nb\x1b[2J", "\u2028"]
extreme = st.one_of(
    st.sampled_from(EXTREME_INTS),
    st.sampled_from(EXTREME_FLOATS),
    st.sampled_from(EXTREME_STRS),
    st.sampled_from([None, True, b"", b"\0" * 16, [], {}]),
    st.lists(st.sampled_from(EXTREME_FLOATS), min_size=0, max_size=3),
    st.dictionaries(
        st.sampled_from(["env_s", "wait_s", "x" * 100]), st.sampled_from(EXTREME_FLOATS + EXTREME_INTS), max_size=2
    ),
)

SESSION_KINDS = ["request", "heartbeat", "bye", "ready", "rollout"]


def _int_ok(key: str, v) -> bool:
    low, high = protocol.INT_BOUNDS.get(key, (0, protocol.MAX_INT))
    return low <= v <= high


def surely_bad(kind: str, key: str, value) -> bool:
    """True if ``value`` in field ``key`` of a ``kind`` message is outside the schema's bounds, by
    this test's own reading of the issue (not the code under test): ints 0..2**63-1 (pid
    1..2**22), floats finite with |x| <= 1e15, strings of at most MAX_STR bytes, the schema's type."""
    schema = {**protocol._COMMON, **protocol.SCHEMAS[kind], **protocol.OPTIONAL.get(kind, {})}
    if key not in schema:
        return True  # an unexpected key
    expected = schema[key]
    if expected is bool:
        return type(value) is not bool
    if expected is int:
        return not (type(value) is int and _int_ok(key, value))
    if expected is str:
        return not isinstance(value, str) or len(value.encode()) > MAX_STR
    if expected is bytes:
        return not isinstance(value, bytes)
    if expected == list[float]:
        return not isinstance(value, list) or any(
            type(v) is not float or not math.isfinite(v) or abs(v) > 1e15 for v in value
        )
    if expected == list[int]:
        return not isinstance(value, list) or any(type(v) is not int or not _int_ok(key, v) for v in value)
    if expected is dict:
        return not isinstance(value, dict) or any(
            type(v) is float and (not math.isfinite(v) or abs(v) > 1e15) or type(v) is int and not _int_ok("", v)
            for v in value.values()
        )
    return False


class HostilePeers(RuleBasedStateMachine):
    """One live learner (grant lease 1 s) and one live broadcaster; an honest actor; up to two
    hostile connections at a time, opened and closed at random."""

    def __init__(self):
        super().__init__()
        self.stack = _Stack()
        self.learner = self.stack.enter(live_learner(_tmp_path(), "transport.grant_lease_s=1.0"))
        self.ctx = sockets.context()
        self.honest = Peer(self.ctx, self.learner.endpoint, "honest")
        self.honest.join(self.learner, "honest")
        self.hostile: list[Peer] = []
        self.made = 0
        self.barriers = 0
        self.honest_reports = 0
        self.sent = 0  # hostile messages sent to the learner
        self.weights_sent = 0
        self.start_iteration = self.learner.state.iteration
        from asyncrl.roles.broadcaster import Broadcaster
        from asyncrl.run.launch import free_port_pair

        self.broadcaster = Broadcaster(f"tcp://127.0.0.1:{free_port_pair()}", echo=lambda *_: None)
        self.snap = sockets.dealer(
            self.ctx, addresses.snapshot_endpoint(self.broadcaster.endpoint), sockets.route_identity("snap")
        )

    # One rule draws the action, weighted toward hostile messages (hypothesis picks among rules
    # evenly, and a derandomised run then spends most steps on the cheapest one).
    @rule(
        action=st.sampled_from(["hostile"] * 6 + ["connect", "disconnect", "honest", "snapshot", "weights", "ping"]),
        data=st.data(),
    )
    def step(self, action, data):
        if action == "connect" or action == "hostile" and not self.hostile:
            self.connect(data.draw(st.booleans(), label="joins"))
        if action == "disconnect" and self.hostile:
            self.hostile.pop(data.draw(st.integers(0, len(self.hostile) - 1), label="which")).close()
        elif action == "hostile":
            self.hostile_message(data)
        elif action == "honest":
            self.honest_round()
        elif action == "weights":
            self.weights_message(
                data.draw(
                    st.sampled_from(
                        [
                            "epoch",
                            "version",
                            "publish_time",
                            "nbytes",
                            "checksum",
                            "layout_hash",
                            "dtype",
                            "run_id",
                            "unexpected",
                        ]
                    ),
                    label="wkey",
                ),
                data.draw(extreme, label="wvalue"),
                data.draw(st.booleans(), label="signed"),
            )
        elif action == "snapshot":
            self.snapshot_request(
                data.draw(
                    st.sampled_from(["run_id", "actor_id", "type", "epoch", "version", "unexpected"]), label="key"
                ),
                data.draw(extreme, label="value"),
            )
        elif action == "ping":
            self.version_ping(
                data.draw(
                    st.sampled_from(["epoch", "version", "nbytes", "run_id", "type", "unexpected"]), label="pkey"
                ),
                data.draw(extreme, label="pvalue"),
                data.draw(st.booleans(), label="psigned"),
            )

    # ---- connection churn
    def connect(self, joins: bool) -> None:
        if len(self.hostile) >= 2:  # two hostile connections hold at most 4 of the 6 slots: 2 stay the honest's
            self.hostile.pop(0).close()
        peer = Peer(self.ctx, self.learner.endpoint, f"hostile{self.made}")
        self.made += 1
        if joins:
            peer.join(self.learner, f"h{self.made}")
        self.hostile.append(peer)

    # ---- hostile messages to the learner
    def hostile_message(self, data) -> None:
        peer = self.hostile[data.draw(st.integers(0, len(self.hostile) - 1), label="peer")]
        kind = data.draw(st.sampled_from(["hello", *SESSION_KINDS]), label="kind")
        value = data.draw(extreme, label="value")
        actor_id = next(iter(peer.ids), "nobody")
        if kind == "hello":
            header = {"proto": protocol.PROTOCOL_VERSION, **peer.hello_header(f"x{self.made}")}
        else:
            header = {"proto": protocol.PROTOCOL_VERSION, **peer.header(kind, actor_id)}
            if kind in ("ready", "rollout"):
                header.update(grant_id=1, env_steps=STEPS, episode_returns=[], episode_lengths=[], timing={})
            if kind == "ready":
                header["slot"] = 0
        key = data.draw(st.sampled_from(sorted(header) + ["unexpected"]), label="key")
        header[key] = value
        frames = [msgpack.packb(header, use_bin_type=True)]
        if kind == "rollout":
            arrays = valid_slot(1)
            frames += [arrays[f.name] for f in SPEC.fields]
        bad = key != "type" and key != "proto" and surely_bad(kind, key, value)
        before = self.learner.rejects.total
        peer.send(frames)
        self.barrier(peer)
        delta = self.learner.rejects.total - before
        self.sent += 1
        assert delta in (0, 1), (kind, key, value, self.learner.rejects.counts)
        if bad:
            assert delta == 1, f"{kind}.{key} = {value!r:.60} was not rejected and counted"

    def barrier(self, peer: Peer) -> None:
        """Send a hello the learner refuses without counting (an env of its own, named once per
        barrier); once that refusal is back, everything the peer sent before was handled (one
        connection is served in order). The name is unique so that a refusal of a hostile hello,
        which quotes its env id too, is never taken for the barrier's."""
        self.barriers += 1
        env_id = f"asyncrl/Barrier{self.barriers}-v0"
        peer.send(codec.encode({**peer.hello_header("barrier"), "env_id": env_id}))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            for i, h in enumerate(peer.inbox):
                if h["type"] == "refuse" and f"{env_id!r}" in h["reason"]:
                    del peer.inbox[i]
                    return
            peer.pump(self.learner, 0.02)
        raise AssertionError(f"the learner did not answer the barrier hello within 20 s (got {peer.inbox[-3:]})")

    # ---- the honest actor trains
    def honest_round(self) -> None:
        """Ask for a slot, report a valid one; every two reports make one learner iteration."""
        self.honest.say("request", "honest")
        grant = self.honest.wait(self.learner, "grant", timeout_s=20)
        self.honest.send(report(self.honest, "honest", grant["grant_id"]))
        self.barrier(self.honest)
        self.honest_reports += 1
        self.learner.consume()

    # ---- hostile requests to the broadcaster
    def snapshot_request(self, key: str, value) -> None:
        header = {"proto": protocol.PROTOCOL_VERSION, "type": "snapshot", "run_id": "", "actor_id": "a", key: value}
        before = self.broadcaster.rejects.total
        sockets.send(self.snap, [msgpack.packb(header, use_bin_type=True)])
        deadline, answered = time.monotonic() + 20, 0
        while time.monotonic() < deadline and not answered and self.broadcaster.rejects.total == before:
            self.broadcaster.serve(10)
            while sockets.recv_multipart_timeout(self.snap, 0) is not None:
                answered += 1
        assert answered + self.broadcaster.rejects.total - before == 1, (
            "a snapshot request neither answered nor counted"
        )

    def weights_message(self, key: str, value, signed: bool) -> None:
        """Weights whose header holds one extreme value, signed with the broadcaster's secret (what its
        learner would send) or not: each is published or rejected and counted, exactly once."""
        import zlib

        import numpy as np

        from asyncrl.wire.weights_secret import read_weights_secret

        payload = np.ones(4, np.float32)
        self.weights_sent += 1
        header = {
            "proto": protocol.PROTOCOL_VERSION,
            "type": "weights",
            "run_id": "r",
            "epoch": 1,
            "version": self.weights_sent,
            "publish_time": 0.0,
            "nbytes": payload.nbytes,
            "checksum": zlib.crc32(payload.tobytes()),
            "layout_hash": "h",
            "dtype": "float32",
            key: value,
        }
        frames = [protocol.WEIGHTS_TOPIC, msgpack.packb(header, use_bin_type=True), payload.tobytes()]
        b = self.broadcaster
        rejected, published = b.rejects.total, b.published
        sockets.send(self.snap, codec.sign_weights(frames, read_weights_secret(b.endpoint) if signed else None))
        # barrier: a snapshot request is answered (or counted) after the weights were handled
        time.sleep(0.2)  # (the snapshot rate limit: one answer per 0.2 s per connection)
        sockets.send(self.snap, codec.encode({"type": "snapshot", "run_id": "", "actor_id": "barrier"}))
        deadline, answered = time.monotonic() + 20, 0
        while time.monotonic() < deadline and not answered:
            b.serve(10)
            while sockets.recv_multipart_timeout(self.snap, 0) is not None:
                answered += 1
        assert answered, "the broadcaster did not answer the barrier snapshot request"
        assert (b.rejects.total - rejected) + (b.published - published) <= 1, (key, value, signed)
        if not signed or surely_bad("weights", key, value):  # (a good older version is ignored, not counted)
            assert (b.rejects.total - rejected, b.published - published) == (1, 0), (key, value, signed)

    def version_ping(self, key: str, value, signed: bool) -> None:
        """A learner's version ping with one extreme value, signed with the broadcaster's secret or not:
        answered (weights_status) or rejected and counted, exactly once; never answered unsigned or bad."""
        from asyncrl.wire.weights_secret import read_weights_secret

        b = self.broadcaster
        header = {"proto": protocol.PROTOCOL_VERSION, "type": "weights_version", "run_id": "r", "epoch": 1}
        header.update(version=0, nbytes=4)
        header[key] = value
        frames = [protocol.VERSION_TOPIC, msgpack.packb(header, use_bin_type=True)]
        before = b.rejects.total
        sockets.send(self.snap, codec.sign_version(frames, read_weights_secret(b.endpoint) if signed else None))
        deadline, answered = time.monotonic() + 20, 0
        while time.monotonic() < deadline and not answered and b.rejects.total == before:
            b.serve(10)
            while sockets.recv_multipart_timeout(self.snap, 0) is not None:
                answered += 1
        assert answered + b.rejects.total - before == 1, (key, value, signed)
        if not signed or surely_bad("weights_version", key, value):
            assert answered == 0, (key, value, signed)

    @invariant()
    def alive(self):
        assert not self.learner.router.closed and not self.broadcaster.router.closed

    def teardown(self):
        try:
            if self.honest_reports >= 4:  # two batches' worth: at least one iteration trained
                assert self.learner.state.iteration > self.start_iteration, "training did not go on"
        finally:
            for p in [*self.hostile, self.honest]:
                p.close()
            sockets.close(self.snap)
            self.broadcaster.close()
            self.ctx.term()
            self.stack.close()


class _Stack:
    def __init__(self):
        import contextlib

        self.stack = contextlib.ExitStack()

    def enter(self, cm):
        return self.stack.enter_context(cm)

    def close(self):
        self.stack.close()


_TMP = []


def _tmp_path():
    return _TMP[-1]


def test_hostile_peers_stateful(tmp_path):
    _TMP.append(tmp_path)
    run_state_machine_as_test(
        HostilePeers,
        settings=settings(
            max_examples=8,
            stateful_step_count=40,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
