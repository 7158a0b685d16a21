"""Actor role: a task's producer (asyncrl.tasks: envs or a prompt stream) + a copy of the policy.
Connects to the learner (slot grants, reports) and the broadcaster (weights), fills granted slots
in the learner's shared memory when it can attach to it, and ships rollouts over TCP when it cannot.

Top to bottom: handshake -> first weights -> loop(newest weights, wait for a grant, collect,
report). Every step records the policy version that chose its action.

A session lasts from a welcome to the learner's stop. It ends early when the learner says it does
not know this actor (``rejoin``: the learner was restarted, or dropped this actor after a stall) or
is silent for ``transport.actor_timeout_s``: the actor drops the session's grants, slots and
weights, and says hello again (with its token) for up to ``transport.rejoin_timeout_s``.

The session with the learner (hello, welcome, grants, heartbeats, rejoin) is in
``asyncrl.roles.actor_session``, the weights from the broadcaster in ``asyncrl.roles.actor_weights``;
this module holds the actor itself and its collect loop.
"""

from __future__ import annotations

import logging
import math
import time

import torch

from asyncrl.core.config import Config
from asyncrl.core.lag_control import WeightHistory
from asyncrl.core.seeding import ActorSeeds
from asyncrl.core.spec import SlotSpec
from asyncrl.roles.actor_session import ActorOptions, LearnerSession, Rejoin
from asyncrl.roles.actor_weights import WeightsFromBroadcaster
from asyncrl.tasks import make_task
from asyncrl.wire import codec, protocol, rejects, sockets
from asyncrl.wire.addresses import snapshot_endpoint
from asyncrl.wire.security import Security
from asyncrl.wire.shm.ring import SlotRing

log = logging.getLogger("asyncrl.actor")


class Actor(LearnerSession, WeightsFromBroadcaster):
    """One actor: the task's producer with its policy copy, the sockets to the learner and the
    broadcaster, and the collect loop (``run``, ``session``); the session with the learner and the
    weights are the methods of its base classes."""

    def __init__(self, cfg: Config, opts: ActorOptions):
        self.cfg, self.opts = cfg, opts
        torch.set_num_threads(1)
        self.task = make_task(cfg)
        # control: its envs, seeded at the first reset, once the welcome gave the run seed and this id's restart count
        self.producer = self.task.producer()
        self.spec: SlotSpec = self.producer.spec
        self.wire_limits = protocol.report_limits(
            self.spec.num_envs, self.spec.rollout_length
        )  # reports of E*T episodes
        self.security = opts.security or Security(f"actor {opts.actor_id}")
        sec = self.security.client
        snapshot_ep = snapshot_endpoint(opts.broadcaster)
        keys = sec(opts.learner), sec(opts.broadcaster), sec(snapshot_ep)  # SecurityError before any socket
        self.ctx = sockets.context()
        # random identities: no other peer can take over this actor's routes
        self.learner = sockets.dealer(self.ctx, opts.learner, sockets.route_identity(opts.actor_id), security=keys[0])
        # its queue holds a bounded number of bytes of weights (sockets.weights_hwm: 2 versions of a large model)
        queue = sockets.weights_hwm(self.task.weights_info().nbytes)
        self.weights_sub = sockets.sub(self.ctx, opts.broadcaster, hwm=queue, security=keys[1])
        self.snapshot = sockets.dealer(self.ctx, snapshot_ep, sockets.route_identity(opts.actor_id), security=keys[2])
        self.watches = [
            ("learner", opts.learner, sockets.handshakes(self.learner)),
            ("broadcaster", opts.broadcaster, sockets.handshakes(self.weights_sub)),
            ("broadcaster", snapshot_ep, sockets.handshakes(self.snapshot)),
        ]
        self.run_id = ""
        self.epoch = -1  # the learner epoch of this session (from its welcome)
        self.token = self.read_token()  # this id's token of an earlier welcome, if kept
        self.sessions = 0  # welcomes so far
        self.welcomed_at = time.monotonic()  # when the last welcome came (monotonic)
        self.sent = 0  # rollouts sent, all sessions
        self.ring: SlotRing | None = None
        self.local_slot = None  # TCP mode: one slot in ordinary memory
        self.grants: list[tuple[int, int]] = []
        self.policy = None  # the producer, once a welcome bound its policy copy
        self.version = -1  # the version the policy copy holds now
        self.versions_received = 0  # weight versions received, all sessions (a newer one each)
        self.versions_acted = 0  # versions its rollouts were collected with, all sessions
        self.history: WeightHistory | None = None  # made at the welcome (its seed is one of the streams)
        self.seeds: ActorSeeds | None = None
        self.last_heartbeat = 0.0
        self.last_learner_message = time.monotonic()  # the learner answers every heartbeat
        self.rejects = rejects.RejectCounter("actor")
        self.revoked = 0  # rollouts dropped because their grant was revoked mid-write
        # NaN/inf from this actor's own envs: counted and logged, never fatal
        self.bad_numbers = rejects.RejectCounter(f"actor {opts.actor_id}", log, what="non-finite numbers")
        self.step_sleep_s = cfg.actor.slowdown_s / self.spec.rollout_length
        self.stopped = ""
        self.num_params = 0
        self.num_slots = 0  # slots of the learner's ring (from its welcome)

    def tick(self) -> None:
        """Called by the producer while it collects (control: before each env step of its envs; llm:
        once before each slot's generation): a straggler (actor.slowdown_s > 0) sleeps slowdown_s / T
        per step, so its rollouts take that much longer and come back staler. The sleep is cut into
        pieces of at most transport.heartbeat_s with a heartbeat after each, so a sleep longer than
        transport.actor_timeout_s (an llm slot is one step) does not make the actor look dead."""
        if self.step_sleep_s > 0:
            pieces = math.ceil(self.step_sleep_s / max(self.cfg.transport.heartbeat_s, 1e-3))
            for _ in range(pieces):
                time.sleep(self.step_sleep_s / pieces)
                self.heartbeat()
        # Heartbeat while collecting: a rollout longer than transport.actor_timeout_s must not make
        # the learner reap a live actor (it would regrant the slot being written, then lock it out).
        self.heartbeat()

    def finite_episodes(self, stats) -> tuple[list[float], list[int]]:
        """The rollout's (episode returns, lengths) without episodes whose return is NaN or inf
        (counted and logged): the wire takes finite numbers only, and the learner must not
        average them into its return."""
        returns, lengths = [], []
        for r, n in zip(stats.episode_returns, stats.episode_lengths):
            if math.isfinite(r):
                returns.append(float(r))
                lengths.append(int(n))
            else:
                self.bad_numbers.reject("nonfinite_episode_return", "its envs")
        return returns, lengths

    def run(self) -> int:
        """Handshake, then collect until the learner says stop; a session the learner ends
        (``Rejoin``) is followed by a new hello, for up to transport.rejoin_timeout_s. Returns
        rollouts sent. Raises ActorError (refused, no learner or broadcaster in time)."""
        self.hello()
        while True:
            try:
                self.session()
                return self.sent
            except Rejoin as why:
                log.warning(
                    "actor %s: %s; dropping the work of that session and saying hello again (up to %.0f s)",
                    self.opts.actor_id,
                    why,
                    self.cfg.transport.rejoin_timeout_s,
                )
                self.end_session()
                self.hello(self.cfg.transport.rejoin_timeout_s)

    def session(self) -> None:
        """One session: first weights, then collect until stop or max_rollouts. Raises Rejoin."""
        self.first_weights()
        self.producer.reset()
        for _ in range(protocol.GRANT_CREDITS):  # two credits: fill one slot while the next is granted
            self._send("request")
        while not self.stopped and (self.opts.max_rollouts == 0 or self.sent < self.opts.max_rollouts):
            self.poll_learner(0)
            t_wait = time.perf_counter()
            grant = self.wait_for_grant()
            wait_s = time.perf_counter() - t_wait
            if grant is None:
                break
            slot_index, grant_id = grant
            self.receive_weights()
            if self.stopped:  # the learner ended the run while this actor waited for weights (after a rewind)
                break
            self.select_weights()
            slot = self.ring.views(slot_index) if self.ring is not None else self.local_slot
            guard = self.ring.guard(slot_index, grant_id) if self.ring is not None else None
            t_first = time.perf_counter()  # the rollout's first action (the parts of its lag: core/lag_parts.py)
            stats = self.producer.collect(
                slot, version=self.version, guard=guard, grant_id=grant_id, tick=self.tick, heartbeat=self.heartbeat
            )
            if stats.revoked:  # the learner reclaimed this grant (we were silent too long)
                del slot
                self.revoked += 1
                log.warning(
                    "actor %s: grant %d of slot %d was revoked while this actor held it (it was silent "
                    "longer than the learner's actor timeout); its rollout is dropped (%d so far)",
                    self.opts.actor_id,
                    grant_id,
                    slot_index,
                    self.revoked,
                )
                continue
            returns, lengths = self.finite_episodes(stats)
            try:  # a slot with NaN/inf is still reported: the learner refuses it and frees the grant
                codec.check_finite(slot)
            except protocol.ProtocolError as exc:
                self.bad_numbers.reject(exc, "its envs")
            report = dict(
                grant_id=grant_id,
                env_steps=stats.env_steps,
                episode_returns=returns,
                episode_lengths=lengths,
                timing={
                    "env_s": stats.env_s,
                    "inference_s": stats.inference_s,
                    "wait_s": wait_s,
                    "collect_s": time.perf_counter() - t_first,
                    "sent_s": time.monotonic() - self.welcomed_at,  # the learner's inbox wait: lag_parts
                },
            )
            if self.ring is not None:
                del slot
                self._send("ready", slot=slot_index, **report)
            else:
                header = {
                    "type": "rollout",
                    "proto": protocol.PROTOCOL_VERSION,
                    "run_id": self.run_id,
                    "actor_id": self.opts.actor_id,
                    "token": self.token or b"",
                    **report,
                }
                sockets.send(self.learner, codec.encode_rollout(header, slot, self.spec))
            self.sent += 1
            self.heartbeat()

    def close(self) -> None:
        try:
            if self.run_id and not self.stopped:
                sockets.send(
                    self.learner,
                    codec.encode(
                        {
                            "type": "bye",
                            "proto": protocol.PROTOCOL_VERSION,
                            "run_id": self.run_id,
                            "actor_id": self.opts.actor_id,
                            "token": self.token or b"",
                        }
                    ),
                    block=False,
                )
        finally:
            sockets.close(self.learner, self.weights_sub, self.snapshot)
            self.security.close()
            self.ctx.term()
            if self.ring is not None:
                self.ring.close()
            self.producer.close()
