"""Remote actors, in one process: a rollout shipped over TCP lands in the learner's slot exactly as
one written through shared memory, and the handshake names the first field that does not fit."""

from __future__ import annotations

import contextlib
import os
import time

import numpy as np
import pytest
from slot_examples import CORRIDOR, SMALL, SPEC, example_slot

from asyncrl.core import config
from asyncrl.roles.learner import Learner
from asyncrl.roles.learner_messages import handshake_mismatch
from asyncrl.run.launch import free_port
from asyncrl.tasks.control.envs import env_spaces
from asyncrl.wire import codec, sockets
from asyncrl.wire.shm.ring import SlotRing


class Client:
    def __init__(self, ctx, endpoint: str, actor_id: str):
        self.sock, self.actor_id = sockets.dealer(ctx, endpoint, actor_id), actor_id
        self.run_id, self.token = "", None

    def send(self, kind: str, arrays=None, **fields) -> None:
        header = {"type": kind, "run_id": self.run_id, "actor_id": self.actor_id, "token": self.token, **fields}
        frames = codec.encode_rollout(header, arrays, SPEC) if arrays is not None else codec.encode(header)
        assert sockets.send(self.sock, frames)

    def wait(self, learner: Learner, kind: str) -> dict:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            learner.serve(20)
            frames = sockets.recv_multipart_timeout(self.sock, 20)
            if frames is not None:
                header, _ = codec.decode(frames)
                if header["type"] == kind:
                    return header
        pytest.fail(f"{self.actor_id}: no {kind} from the learner")


@pytest.mark.timeout(60)
def test_tcp_rollout_fills_the_slot_like_shared_memory(tmp_path):
    cfg = config.load(None, SMALL)
    learner = Learner(
        cfg,
        tmp_path / "run",
        run_id="utest-remote",
        bind="tcp://127.0.0.1:0",
        broadcaster=f"tcp://127.0.0.1:{free_port()}",
        echo=lambda *_: None,
    )
    ctx = sockets.context()
    clients = {name: Client(ctx, learner.endpoint, name) for name in ("local", "remote")}
    ring = None
    try:
        hello = dict(
            host="h", pid=os.getpid(), env_id=CORRIDOR, spec=SPEC.to_dict(), shm_token=None, spaces=env_spaces(CORRIDOR)
        )
        grants = {}
        for name, c in clients.items():
            c.send("hello", **hello)
            welcome = c.wait(learner, "welcome")
            c.run_id, c.token = welcome["run_id"], welcome["actor_token"]
            c.send("request")
            grants[name] = c.wait(learner, "grant")
        ring = SlotRing.attach(
            name=welcome["shm_name"], spec=SPEC, num_slots=welcome["num_slots"], token=welcome["token"]
        )
        arrays = example_slot(seed=4)
        tagged = {
            name: {**arrays, "grant_id": np.full_like(arrays["grant_id"], g["grant_id"])} for name, g in grants.items()
        }  # each writer tags its rows with its grant
        report = dict(env_steps=32, episode_returns=[], episode_lengths=[], timing={})

        views = ring.views(grants["local"]["slot"])  # the local actor writes in place
        for k, a in tagged["local"].items():
            views[k][...] = a
        del views
        clients["local"].send("ready", slot=grants["local"]["slot"], grant_id=grants["local"]["grant_id"], **report)
        stale = ring.views(grants["remote"]["slot"])  # old data in the remote actor's slot
        for a in stale.values():
            a[...] = 7
        del stale
        clients["remote"].send("rollout", arrays=tagged["remote"], grant_id=grants["remote"]["grant_id"], **report)

        deadline = time.monotonic() + 10
        while learner.ledger.num_full < 2 and time.monotonic() < deadline:
            learner.serve(20)
        assert learner.rejects.total == 0, learner.rejects.counts
        assert sorted(learner.ledger.full()) == sorted(g["slot"] for g in grants.values())
        assert dict(learner.rollouts_by_transport) == {"shm": 1, "tcp": 1}
        for name, g in grants.items():
            views = ring.views(g["slot"])
            for k, a in tagged[name].items():
                np.testing.assert_array_equal(views[k], a, err_msg=f"{name} {k}")
            del views
        # and the learner consumes both as one batch
        assert learner.consume()
        assert learner.state.iteration == 1
        assert dict(learner.consumer.slot_audit) == {"copied": 2, "passed_generation_own_rows": 2}
    finally:
        if ring is not None:
            ring.close()
        sockets.close(*(c.sock for c in clients.values()))
        ctx.term()
        learner.close()


@contextlib.contextmanager
def _joined_learner(cfg, tmp_path, run_id: str):
    """(learner, client, ring): a learner on a free loopback port, a Client ("local") that said
    hello and kept the welcome's run id and token, and the learner's ring attached; all closed after."""
    learner = Learner(
        cfg,
        tmp_path / "run",
        run_id=run_id,
        bind="tcp://127.0.0.1:0",
        broadcaster=f"tcp://127.0.0.1:{free_port()}",
        echo=lambda *_: None,
    )
    ctx = sockets.context()
    c = Client(ctx, learner.endpoint, "local")
    ring = None
    try:
        c.send(
            "hello",
            host="h",
            pid=os.getpid(),
            env_id=CORRIDOR,
            spec=SPEC.to_dict(),
            shm_token=None,
            spaces=env_spaces(CORRIDOR),
        )
        welcome = c.wait(learner, "welcome")
        c.run_id, c.token = welcome["run_id"], welcome["actor_token"]
        ring = SlotRing.attach(
            name=welcome["shm_name"], spec=SPEC, num_slots=welcome["num_slots"], token=welcome["token"]
        )
        yield learner, c, ring
    finally:
        if ring is not None:
            ring.close()
        sockets.close(c.sock)
        ctx.term()
        learner.close()


def _fill_granted_slot(c: Client, learner: Learner, ring: SlotRing, arrays: dict) -> dict:
    """Ask for a slot, write ``arrays`` into the granted one with its grant id on every row; the grant."""
    c.send("request")
    g = c.wait(learner, "grant")
    views = ring.views(g["slot"])
    for k, a in arrays.items():
        views[k][...] = a
    views["grant_id"][...] = g["grant_id"]
    del views
    return g


@pytest.mark.timeout(60)
def test_row_audit_drops_a_slot_the_generation_check_passed(tmp_path):
    """The row-tag audit is independent of the generation check: a row tagged with another grant
    (what a revoked writer killed between its row and its check after it would leave) in a slot
    whose generation is intact is counted as passed_generation_foreign_rows and not trained on.
    A tag mismatch at report time is refused as foreign_rows."""
    cfg = config.load(None, SMALL)
    with _joined_learner(cfg, tmp_path, "utest-audit") as (learner, c, ring):
        report = dict(env_steps=32, episode_returns=[], episode_lengths=[], timing={})
        arrays = example_slot(seed=5)

        def write_and_report(foreign_row: int | None, tamper_after_report: bool) -> None:
            g = _fill_granted_slot(c, learner, ring, arrays)
            if foreign_row is not None and not tamper_after_report:
                views = ring.views(g["slot"])
                views["grant_id"][foreign_row] = g["grant_id"] + 1000
                del views
            rejected = learner.rejects.total
            c.send("ready", slot=g["slot"], grant_id=g["grant_id"], **report)
            deadline = time.monotonic() + 10
            while learner.ledger.num_full == 0 and learner.rejects.total == rejected and time.monotonic() < deadline:
                learner.serve(20)
            if tamper_after_report:
                views = ring.views(g["slot"])
                views["grant_id"][foreign_row] = g["grant_id"] + 1000
                del views

        write_and_report(3, tamper_after_report=False)  # refused when it reports
        assert learner.rejects.by_reason().get("foreign_rows") == 1, learner.rejects.by_reason()
        assert learner.ledger.num_full == 0
        write_and_report(3, tamper_after_report=True)  # accepted, then a late foreign row
        assert learner.ledger.num_full == 1
        learner.collect_full(1)
        assert learner.copied == []
        assert learner.consumer.rejected_slots["foreign_rows"] == 1
        assert dict(learner.consumer.slot_audit) == {"copied": 1, "passed_generation_foreign_rows": 1}
        write_and_report(None, tamper_after_report=False)  # a clean slot passes both
        learner.collect_full(1)
        assert len(learner.copied) == 1
        assert learner.consumer.slot_audit["passed_generation_own_rows"] == 1


MINE = dict(run_id="run-1", env_id=CORRIDOR, spec=SPEC.to_dict(), spaces=env_spaces(CORRIDOR))


def _hello(**changes) -> dict:
    h = {"run_id": "", "env_id": CORRIDOR, "spec": SPEC.to_dict(), "spaces": env_spaces(CORRIDOR)}
    return {**h, **changes}


@pytest.mark.parametrize(
    "hello, words",
    [
        (_hello(), ""),
        (_hello(run_id="run-1"), ""),
        ({k: v for k, v in _hello().items() if k != "spaces"}, ""),  # a client that does not describe them
        (_hello(run_id="run-0"), "run_id: actor has 'run-0', learner has 'run-1'"),
        (
            _hello(env_id="asyncrl/Constant-v0"),
            "env_id: actor has 'asyncrl/Constant-v0', learner has 'asyncrl/Corridor-v0'",
        ),
        (_hello(spec={**SPEC.to_dict(), "rollout_length": 32}), "rollout_length: actor has 32, learner has 16"),
        (_hello(spec={**SPEC.to_dict(), "obs_dim": 3}), "obs_dim: actor has 3, learner has 2"),
        (
            _hello(spaces={**env_spaces(CORRIDOR), "action": "Box(shape=(1,), dtype=float32, low=-2.0, high=2.0)"}),
            "action space: actor has Box(shape=(1,), dtype=float32, low=-2.0, high=2.0), learner has "
            "Box(shape=(1,), dtype=float32, low=-1.0, high=1.0)",
        ),
        (
            _hello(
                spaces={**env_spaces(CORRIDOR), "observation": "Box(shape=(2,), dtype=float64, low=-inf, high=inf)"}
            ),
            "observation space: actor has Box(shape=(2,), dtype=float64",
        ),
    ],
)
def test_handshake_mismatch_names_the_field_and_both_values(hello, words):
    got = handshake_mismatch(hello, **MINE)
    assert (words in got) if words else got == "", got


@pytest.mark.timeout(60)
def test_full_slots_beyond_the_next_batch_stay_in_the_ring(tmp_path):
    """The ring is the one queue between actors and learner: a learner copies out only what its
    next batch needs, so full slots beyond it keep their ring slots and actors faster than the
    learner wait for a free one (bounded lag and memory). Until 2026-12-01 every full slot was
    copied out and freed, and with fast actors the copies piled up without bound."""
    cfg = config.load(None, SMALL)  # 2 slots per batch, 6 slots
    with _joined_learner(cfg, tmp_path, "utest-queue") as (learner, c, ring):
        arrays = example_slot(seed=7)
        for _ in range(5):  # five rollouts ready before the learner trains once
            g = _fill_granted_slot(c, learner, ring, arrays)
            c.send(
                "ready",
                slot=g["slot"],
                grant_id=g["grant_id"],
                env_steps=32,
                episode_returns=[],
                episode_lengths=[],
                timing={},
            )
            full = learner.ledger.num_full
            deadline = time.monotonic() + 10
            while learner.ledger.num_full == full and time.monotonic() < deadline:
                learner.serve(20)
        assert learner.ledger.num_full == 5
        assert learner.consume() and learner.state.iteration == 1
        assert learner.copied == [] and learner.ledger.num_full == 3  # 2 trained on, 3 still queued in the ring
        assert learner.consume() and learner.ledger.num_full == 1
        assert not learner.consume() and len(learner.copied) == 1 and learner.ledger.num_full == 0
