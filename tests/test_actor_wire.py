"""An actor survives undecodable messages from the learner's and the broadcaster's sockets, and
catches up with the newest weights after a stall."""

import contextlib
import threading
import time

import numpy as np
import pytest

from asyncrl.core import config
from asyncrl.core.lag_control import WeightHistory
from asyncrl.roles.actor import Actor
from asyncrl.roles.actor_session import ActorOptions
from asyncrl.roles.broadcaster import Broadcaster
from asyncrl.run.launch import free_port_pair
from asyncrl.wire import addresses, codec, rejects, sockets
from asyncrl.wire.weights_secret import read_weights_secret


@contextlib.contextmanager
def _actor_beside_a_broadcaster(history: WeightHistory):
    """A serving Broadcaster on loopback, an Actor subscribed to it (session of run "r", epoch 10,
    8 parameters, ``history``) and ``publish(version, value)``, which sends the broadcaster signed
    weights of that version as its learner would."""
    b = Broadcaster(f"tcp://127.0.0.1:{free_port_pair()}", echo=lambda *_: None)
    stop = threading.Event()
    serving = threading.Thread(target=lambda: [b.serve(20) for _ in iter(stop.is_set, True)])
    cfg = config.load(None, ["env.id=asyncrl/Corridor-v0", "env.num_envs=2"])
    actor = Actor(cfg, ActorOptions(learner="tcp://127.0.0.1:9", broadcaster=b.endpoint, actor_id="t"))
    ctx = sockets.context()
    learner = sockets.dealer(ctx, addresses.snapshot_endpoint(b.endpoint), sockets.route_identity("learner"))
    secret = read_weights_secret(b.endpoint)

    def publish(version: int, value: float = 1.0) -> None:
        sockets.send(learner, codec.sign_weights(_weights(version, value), secret))

    try:
        serving.start()
        actor.run_id, actor.layout_hash, actor.epoch, actor.num_params = "r", "h", 10, 8
        actor.history = history
        yield b, actor, publish
    finally:
        stop.set()
        serving.join(10)
        sockets.close(learner)
        ctx.term()
        actor.close()
        b.close()


def _weights(version: int, value: float = 1.0) -> list:
    return codec.encode_weights(
        run_id="r", epoch=10, version=version, publish_time=1.0, layout_hash="h", payload=np.full(8, value, np.float32)
    )


def test_bad_weights_and_escaped_printing_never_raise():
    cfg = config.load(None, ["env.id=asyncrl/Corridor-v0", "env.num_envs=2"])
    actor = Actor(cfg, ActorOptions(learner="tcp://127.0.0.1:9", broadcaster="tcp://127.0.0.1:11", actor_id="t"))
    try:
        actor.run_id, actor.layout_hash, actor.history, actor.epoch = "r", "h", WeightHistory(), 0
        actor.num_params = 4
        good = codec.encode_weights(
            run_id="r", version=3, publish_time=1.0, layout_hash="h", payload=np.ones(4, np.float32)
        )
        for bad in (
            [b"weights", b"\xc1junk", b"x"],
            [b"weights", good[1], b"\0" * 3],
            codec.encode_weights(
                run_id="other", version=9, publish_time=1.0, layout_hash="h", payload=np.ones(4, np.float32)
            ),
            # the right layout hash but another size: policy.load would raise on it
            codec.encode_weights(
                run_id="r", version=9, publish_time=1.0, layout_hash="h", payload=np.ones(5, np.float32)
            ),
        ):
            actor._receive(bad)
        assert actor.rejects.by_reason() == {"malformed": 1, "frame_size": 2, "run_id": 1}
        # weights of another learner epoch (an old or a newer learner) are not this session's
        actor._receive(
            codec.encode_weights(
                run_id="r", epoch=7, version=5, publish_time=1.0, layout_hash="h", payload=np.ones(4, np.float32)
            )
        )
        assert actor.history.newest == -1
        actor._receive([bytes(f) for f in good])
        assert actor.history.newest == 3
    finally:
        actor.close()
    assert rejects.printable("a\nb\x1b[31m\u2028") == "a\\nb\\x1b[31m\\u2028"
    assert rejects.printable(b"\xff\n") == "\\\\xff\\n" and rejects.printable("x" * 500, 10) == "x" * 10 + "..."


@pytest.mark.timeout(60)
def test_after_a_stall_the_actor_takes_the_newest_weights_not_the_backlog():
    """Versions published while an actor did not read pile up in its queue (and the publisher
    drops newer ones once it is full): the next drain finds the queue full and fetches the
    broadcaster's newest instead."""
    with _actor_beside_a_broadcaster(WeightHistory()) as (b, actor, publish):
        version, deadline = 0, time.monotonic() + 30
        while actor.history.newest < 0:  # until the actor's SUB socket is subscribed
            assert time.monotonic() < deadline, "the actor never got weights"
            publish(version, version)
            version += 1
            time.sleep(0.05)
            actor.receive_weights(catch_up=False)
        first = actor.history.newest
        for v in range(version, version + 300):  # the actor "stalls": it reads nothing meanwhile
            publish(v, v)
        newest = version + 299
        while b.newest != (10, newest):
            assert time.monotonic() < deadline, "the broadcaster never got the last version"
            time.sleep(0.05)
        time.sleep(1.0)  # let the backlog reach the actor's queue
        actor.receive_weights()
        assert first < actor.history.newest == newest


@pytest.mark.timeout(60)
def test_an_actor_heals_from_a_forged_far_future_version_on_the_learners_word():
    """One weights message of the session's epoch with version 2**62 (e.g. from a hostile relay) made
    it the actor's newest: every real version after it was dropped as stale, for good, and the learner
    refused every slot. Now the learner's ``slot_refused`` (its version, and the refused slot's) makes
    the actor drop the versions from the forged one up and take the broadcaster's newest; a late
    refusal drops nothing newer than the learner's that is real. A
    version ping naming less than the actor's newest drops nothing (a stale snapshot answer or ping
    could say so of a real version)."""

    def refused(learner_version, behavior_version):
        return {
            "grant_id": 1,
            "reason": "version: ...",
            "version": learner_version,
            "behavior_version": behavior_version,
        }

    with _actor_beside_a_broadcaster(WeightHistory(replay_depth=4)) as (_, actor, publish):  # keeps 4 versions
        deadline = time.monotonic() + 30
        publish(3)
        while actor.history.newest < 3:
            assert time.monotonic() < deadline, "the actor never got weights"
            actor.receive_weights()
            time.sleep(0.05)
        actor._receive([bytes(f) for f in _weights(2**62)])  # the forged message
        actor._receive([bytes(f) for f in _weights(2**62 + 1)])
        time.sleep(1.5)  # the broadcaster pings version 3, below the actor's newest: nothing is dropped
        actor.receive_weights()
        assert actor.rewinds == 0 and actor.history.newest == 2**62 + 1
        actor.slot_refused(refused(3, 3))  # not above the learner's: not ours to drop
        assert actor.rewinds == 0
        actor.slot_refused(refused(3, 2**62))
        assert actor.rewinds == 1 and list(actor.history.versions) == [3], actor.history.versions
        actor._receive([bytes(f) for f in _weights(4)])  # a real version, newer than the refusal
        actor.slot_refused(refused(3, 2**62 + 1))  # a late refusal of the other forged slot: 4 stays
        assert actor.rewinds == 1 and list(actor.history.versions) == [3, 4], actor.history.versions
        for v in (5, 6):
            publish(v)
        while actor.history.newest != 6:
            assert time.monotonic() < deadline, f"the actor's newest stayed {actor.history.newest}"
            actor.receive_weights()
            time.sleep(0.05)
        assert actor.history.choose()[0] == 6
        actor.slot_refused(refused(5, 2**62))  # late: the forged versions are gone already
        assert actor.rewinds == 1 and actor.history.newest == 6
