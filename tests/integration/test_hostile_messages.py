"""Hostile input on the learner's port while it trains: random bytes, foreign run ids, unknown
types, another protocol version, oversized frames, reports with wrong shapes or non-finite
numbers. Each is rejected and counted by reason (summary.json ``rejected_messages``), but
oversized frames, which ZeroMQ drops with their connection before the learner sees them
(ZMQ_MAXMSGSIZE); training goes on to the end."""

from __future__ import annotations

import json
import os
import signal

import msgpack
import numpy as np
import pytest
import zmq
from mp_helpers import (
    CORRIDOR,
    SMALL,
    free_port,
    free_port_pair,
    learner_cmd,
    new_run_id,
    read_jsonl,
    shm_segments,
    wait_for,
)

from asyncrl.core.spec import RolloutSpec
from asyncrl.wire import codec, protocol

pytestmark = pytest.mark.integration

SPEC = RolloutSpec(obs_dim=2, action_dim=1, discrete=False, rollout_length=16, num_envs=2)  # = SMALL


class Spy:
    """A hand-driven DEALER on the learner's port, speaking (and breaking) the actor protocol."""

    def __init__(self, endpoint: str, actor_id: str = "spy"):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.identity = actor_id.encode()
        self.sock.connect(endpoint)
        self.actor_id, self.run_id, self.token = actor_id, "", b""

    def send(self, frames) -> None:
        self.sock.send_multipart(frames)

    def recv(self, timeout_s: float = 20.0) -> dict:
        if not self.sock.poll(int(timeout_s * 1000)):
            pytest.fail(f"no reply from the learner within {timeout_s:.0f} s")
        header, _ = codec.decode(self.sock.recv_multipart())
        return header

    def hello(self, env_id: str = CORRIDOR, token: bytes | None = None) -> dict:
        self.send(
            codec.encode(
                {
                    "type": "hello",
                    "run_id": "",
                    "actor_id": self.actor_id,
                    "host": "spyhost",
                    "pid": os.getpid(),
                    "env_id": env_id,
                    "spec": SPEC.to_dict(),
                    "shm_token": None,
                    "token": token,
                }
            )
        )
        reply = self.next_of("welcome", "refuse")
        if reply["type"] == "welcome":
            self.run_id, self.token = reply["run_id"], reply["actor_token"]
        return reply

    def next_of(self, *kinds: str) -> dict:
        """The next reply of one of ``kinds``, skipping grants and requests to rejoin."""
        while True:
            reply = self.recv()
            if reply["type"] in kinds:
                return reply
            assert reply["type"] in ("grant", "rejoin"), reply

    def header(self, kind: str, **fields) -> dict:
        return {"type": kind, "run_id": self.run_id, "actor_id": self.actor_id, "token": self.token, **fields}

    def report(self, grant_id: int, **extra) -> dict:
        return self.header(
            "rollout",
            grant_id=grant_id,
            env_steps=SPEC.rollout_length * SPEC.num_envs,
            episode_returns=[],
            episode_lengths=[],
            timing={},
            **extra,
        )

    def grant(self) -> int:
        """The next grant's id (the learner answers every report and request with one)."""
        while True:
            reply = self.recv()
            if reply["type"] == "grant":
                return reply["grant_id"]
            # ("rejoin" answers the heartbeat of another run id above)
            assert reply["type"] != "stop", "training ended while the spy was still at work"

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


def valid_slot() -> dict[str, np.ndarray]:
    a = SPEC.allocate()
    a["obs"][:, :, 1] = np.arange(SPEC.rollout_length + 1)[:, None]
    return a


@pytest.mark.timeout(150)
def test_hostile_messages_are_counted_and_training_goes_on(procs, tmp_path):
    run_id, run_dir, total = new_run_id(), tmp_path / "run", 30_000
    procs.run_ids.add(run_id)
    learner_ep = f"tcp://127.0.0.1:{free_port()}"
    broadcaster_ep = f"tcp://127.0.0.1:{free_port_pair()}"
    procs.start("broadcaster", ["broadcaster", "--bind", broadcaster_ep])
    procs.start(
        "learner",
        learner_cmd(learner_ep, broadcaster_ep, *SMALL, run_id=run_id, run_dir=run_dir, total=total),
    )
    procs.start(
        "good",
        [
            "actor",
            "--learner",
            learner_ep,
            "--broadcaster",
            broadcaster_ep,
            "--actor-id",
            "good",
            "--env",
            CORRIDOR,
            *SMALL,
        ],
    )
    wait_for(lambda: len(read_jsonl(run_dir / "metrics.jsonl")) >= 2, 60, "2 learner iterations", procs=procs)

    spy, big = Spy(learner_ep), None
    expected: dict[str, int] = {}

    def hostile(frames, reason: str) -> None:
        spy.send(frames)
        expected[reason] = expected.get(reason, 0) + 1

    try:
        welcome = spy.hello()
        assert welcome["type"] == "welcome", welcome
        spy.run_id = welcome["run_id"]
        rng = np.random.default_rng(0)
        # random bytes: whatever the learner's decoder calls them (msgpack garbage: "malformed")
        junk = rng.bytes(200)
        with pytest.raises(protocol.ProtocolError) as info:
            codec.decode([junk])
        hostile([junk], info.value.reason)
        # a well-formed message of another run
        hostile(codec.encode({**spy.header("heartbeat"), "run_id": "some-other-run"}), "run_id")
        # a header of an unknown type, and one of another protocol version (msgpack by hand:
        # codec.encode refuses to build them)
        hostile(
            [
                msgpack.packb(
                    {
                        "type": "launch_missiles",
                        "proto": protocol.PROTOCOL_VERSION,
                        "run_id": spy.run_id,
                        "actor_id": "spy",
                    }
                )
            ],
            "unknown_type",
        )
        hostile([msgpack.packb({"type": "heartbeat", "proto": 99, "run_id": spy.run_id, "actor_id": "spy"})], "proto")
        # oversized frames: a 100 KiB header, and 8 MiB of junk. Larger than any frame of this run
        # (a report's header, one slot field), so ZeroMQ drops each with its connection
        # (ZMQ_MAXMSGSIZE) before the learner buffers it: nothing to count. From a connection of
        # their own, so the spy's own messages are not lost with it.
        big = Spy(learner_ep, actor_id="big")  # (closed after the barrier below: linger 0 drops unsent frames)
        big.send([msgpack.packb({"type": "heartbeat", "pad": "x" * 100_000})])
        big.send([rng.bytes(8 << 20)])
        # a `ready` with array frames, and one for a slot the spy was never granted
        hostile(
            codec.encode(
                spy.header("ready", slot=0, grant_id=1, env_steps=32, episode_returns=[], episode_lengths=[], timing={})
            )
            + [b"\0" * 64],
            "frame_count",
        )
        hostile(
            codec.encode(
                spy.header(
                    "ready", slot=0, grant_id=10**9, env_steps=32, episode_returns=[], episode_lengths=[], timing={}
                )
            ),
            "stale_grant",
        )

        # rollouts over TCP for slots the spy really holds: each rejected one frees its slot and
        # earns the next grant
        spy.send(codec.encode(spy.header("request")))
        g = spy.grant()
        good = valid_slot()
        wrong = {**good, "obs": np.zeros((SPEC.rollout_length, 2, 3), np.float32)}  # [T, E, 3], not [T+1, E, 2]
        hostile(codec.encode(spy.report(g), [wrong[f.name] for f in SPEC.fields]), "frame_size")
        g = spy.grant()
        hostile(codec.encode(spy.report(g), [good[f.name] for f in SPEC.fields][:-1]), "frame_count")
        g = spy.grant()
        nan = {**good, "rewards": np.full((SPEC.rollout_length, 2), np.nan, np.float32)}
        hostile(codec.encode(spy.report(g), [nan[f.name] for f in SPEC.fields]), "nonfinite")
        g = spy.grant()
        future = {**good, "behavior_version": np.full((SPEC.rollout_length, 2), 10**6, np.int64)}
        hostile(codec.encode(spy.report(g), [future[f.name] for f in SPEC.fields]), "version")
        g = spy.grant()
        hostile(codec.encode(spy.report(g), [good[f.name] for f in SPEC.fields]), "foreign_rows")  # rows not tagged g
        # a hello whose refusal would quote 4,090 characters of the actor's own: the learner must
        # still answer it (a reply over the wire's limits used to raise inside its handler)
        long = spy.hello(env_id="x" * 4090)
        assert long["type"] == "refuse" and long["reason"].startswith("env_id: actor has 'xxx"), long
        # the same through the refusal of another protocol version, sent from the error handler
        hostile([msgpack.packb({"type": "hello", "proto": "p" * 4090, "run_id": "", "actor_id": "spy"})], "proto")
        assert spy.next_of("refuse")["reason"].startswith("proto: actor has protocol 'ppp")
        # a socket identity with a newline must not forge a log line; its junk is still counted
        evil = Spy(learner_ep, actor_id="evil\nFORGED learner: all actors left")
        try:
            evil.send([rng.bytes(50)])
            expected["malformed"] = expected.get("malformed", 0) + 1
            assert evil.hello(env_id="asyncrl/Constant-v0")["type"] == "refuse"  # barrier for evil's socket
        finally:
            evil.close()
        # barrier: a hello it must refuse. One DEALER's messages are handled in order, so once the
        # refusal is back, everything above was handled. (A refused hello is not a rejected message.)
        refusal = spy.hello(env_id="asyncrl/Constant-v0")
        assert refusal["type"] == "refuse" and "env_id" in refusal["reason"], refusal
        seen_at = len(read_jsonl(run_dir / "metrics.jsonl"))
        spy.send(codec.encode(spy.header("bye")))  # give back the grant it holds
    finally:
        spy.close()
        if big is not None:
            big.close()

    assert procs.wait("learner", 120) == 0, procs.dump()
    assert procs.wait("good", 20) == 0, procs.dump()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rejected_messages"] == expected, (summary["rejected_messages"], expected)
    assert summary["env_steps"] >= total
    assert summary["learner_iterations"] > seen_at, "training did not go on after the hostile messages"
    rows = read_jsonl(run_dir / "lag.jsonl")
    assert {r["actor"] for r in rows} == {"good"}, "something the spy sent was consumed"
    log = procs.err("learner")
    assert "rejected message from spy" in log
    assert "evil\\nFORGED" in log and not any(ln.startswith("FORGED") for ln in log.splitlines()), log
    assert not shm_segments(run_id)
    procs.popen["broadcaster"].send_signal(signal.SIGINT)
    procs.shutdown()
