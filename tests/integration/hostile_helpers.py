"""Helpers of the hostile-peer tests (test_hostile_peers.py, test_hostile_stateful.py): a learner run
in the test's own process, driven by hand (``Learner.serve``), and ``Peer``, a DEALER on its port
that speaks (and bends) the actor protocol. In one process nothing needs killing; every learner is
closed (its shared-memory segment removed) when its ``live_learner`` block ends."""

from __future__ import annotations

import contextlib
import os
import time

import numpy as np
from learner_in_process import learner_in_process
from slot_examples import CORRIDOR, SMALL, SPEC, example_slot

from asyncrl.core import config
from asyncrl.roles.learner import Learner
from asyncrl.tasks.control.envs import env_spaces
from asyncrl.wire import codec, protocol, sockets

STEPS = SPEC.num_envs * SPEC.rollout_length  # env steps of one slot


@contextlib.contextmanager
def live_learner(tmp_path, *overrides: str, run_id: str = "hostile"):
    """A Learner of SMALL (+ ``overrides``) in this process (``learner_in_process``)."""
    sets = {s.split("=", 1)[0]: s for s in SMALL} | {s.split("=", 1)[0]: s for s in overrides}  # one per key
    with learner_in_process(config.load(None, list(sets.values())), tmp_path / "run", run_id) as learner:
        yield learner


class Peer:
    """One DEALER connection to a learner; it may speak for several actor ids (``ids``: id -> token).
    ``pump(learner)`` lets the learner serve and collects what came back in ``inbox``."""

    def __init__(self, ctx, endpoint: str, name: str):
        self.sock = sockets.dealer(ctx, endpoint, sockets.route_identity(name))
        self.run_id, self.ids, self.inbox = "", {}, []

    def send(self, frames) -> None:
        assert sockets.send(self.sock, frames, block=True)

    def header(self, kind: str, actor_id: str, **fields) -> dict:
        return {
            "type": kind,
            "run_id": self.run_id,
            "actor_id": actor_id,
            "token": self.ids.get(actor_id, b""),
            **fields,
        }

    def say(self, kind: str, actor_id: str, **fields) -> None:
        self.send(
            codec.encode(
                self.header(kind, actor_id, **fields), limits=protocol.report_limits(SPEC.num_envs, SPEC.rollout_length)
            )
        )

    def hello_header(self, actor_id: str, **fields) -> dict:
        return {
            "type": "hello",
            "run_id": "",
            "actor_id": actor_id,
            "host": "peerhost",
            "pid": os.getpid(),
            "env_id": CORRIDOR,
            "spec": SPEC.to_dict(),
            "shm_token": None,
            "token": None,
            "spaces": env_spaces(CORRIDOR),
            **fields,
        }

    def pump(self, learner: Learner, seconds: float = 0.3) -> list[dict]:
        """Let ``learner`` serve for ``seconds`` (or until nothing more comes); returns the replies taken."""
        got, deadline = [], time.monotonic() + seconds
        while time.monotonic() < deadline:
            learner.serve(10)
            frames = sockets.recv_multipart_timeout(self.sock, 10)
            while frames is not None:
                header, _ = codec.decode(frames)
                got.append(header)
                frames = sockets.recv_multipart_timeout(self.sock, 0)
        self.inbox += got
        return got

    def wait(self, learner: Learner, kind: str, timeout_s: float = 15.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for i, h in enumerate(self.inbox):
                if h["type"] == kind:
                    return self.inbox.pop(i)
            self.pump(learner, 0.05)
        raise AssertionError(f"no {kind} from the learner within {timeout_s:.0f} s (got {self.inbox[-5:]})")

    def join(self, learner: Learner, actor_id: str, **fields) -> dict:
        """Say hello as ``actor_id``; returns the welcome (keeps its run id and token)."""
        self.send(codec.encode(self.hello_header(actor_id, **fields)))
        welcome = self.wait(learner, "welcome")
        self.run_id, self.ids[actor_id] = welcome["run_id"], welcome["actor_token"]
        return welcome

    def grants(self) -> list[dict]:
        """The grants received so far (taken out of the inbox)."""
        out = [h for h in self.inbox if h["type"] == "grant"]
        self.inbox = [h for h in self.inbox if h["type"] != "grant"]
        return out

    def close(self) -> None:
        sockets.close(self.sock)


def valid_slot(grant_id: int, *, seed: int = 0) -> dict[str, np.ndarray]:
    """A slot of SPEC the learner trains on, every row tagged ``grant_id`` (slot_examples.example_slot)."""
    return example_slot(seed, grant_id)


def report(peer: Peer, actor_id: str, grant_id: int, arrays=None, **fields) -> list:
    """The frames of a TCP ``rollout`` report of ``arrays`` (default: a valid slot) under ``grant_id``;
    ``fields`` override the honest header (env_steps E*T, two episodes, small timings)."""
    arrays = valid_slot(grant_id) if arrays is None else arrays
    header = peer.header(
        "rollout",
        actor_id,
        grant_id=grant_id,
        env_steps=STEPS,
        episode_returns=[1.0, 2.0],
        episode_lengths=[6, 10],
        timing={"env_s": 0.01, "inference_s": 0.01, "wait_s": 0.0},
    )
    header.update(fields)
    return [
        codec.encode(header, limits=protocol.report_limits(SPEC.num_envs, SPEC.rollout_length))[0],
        *(arrays[f.name] for f in SPEC.fields),
    ]


def raw_report(peer: Peer, actor_id: str, grant_id: int, **fields) -> list:
    """Like ``report``, but the header is msgpacked by hand, so fields ``codec.encode`` would refuse
    (NaN timings, 2**64 - 1) reach the learner as a hostile peer would send them."""
    import msgpack

    arrays = valid_slot(grant_id)
    header = {
        "type": "rollout",
        "proto": protocol.PROTOCOL_VERSION,
        "run_id": peer.run_id,
        "actor_id": actor_id,
        "token": peer.ids[actor_id],
        "grant_id": grant_id,
        "env_steps": STEPS,
        "episode_returns": [1.0, 2.0],
        "episode_lengths": [6, 10],
        "timing": {"env_s": 0.01},
    }
    header.update(fields)
    return [msgpack.packb(header, use_bin_type=True), *(arrays[f.name] for f in SPEC.fields)]
