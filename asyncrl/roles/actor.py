"""Actor role: a task's producer (asyncrl.tasks: envs or a prompt stream) + a copy of the policy.
Connects to the learner (slot grants, reports) and the broadcaster (weights), fills granted slots
in the learner's shared memory when it can attach to it, and ships rollouts over TCP when it cannot.

Top to bottom: handshake -> first weights -> loop(newest weights, wait for a grant, collect,
report). Every step records the policy version that chose its action.

A session lasts from a welcome to the learner's stop. It ends early when the learner says it does
not know this actor (``rejoin``: the learner was restarted, or dropped this actor after a stall) or
is silent for ``transport.actor_timeout_s``: the actor drops the session's grants, slots and
weights, and says hello again (with its token) for up to ``transport.rejoin_timeout_s``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import time
from dataclasses import dataclass

import torch

from asyncrl.core import exit_status
from asyncrl.core.config import Config, from_dict
from asyncrl.core.lag_control import WeightHistory
from asyncrl.core.seeding import ActorSeeds, actor_seeds, fingerprint
from asyncrl.core.spec import SlotSpec
from asyncrl.tasks import make_task
from asyncrl.wire import transport as tp
from asyncrl.wire.security import Security
from asyncrl.wire.shm.layout import ShmError
from asyncrl.wire.shm.ring import SlotRing
from asyncrl.wire.transport import snapshot_endpoint

log = logging.getLogger("asyncrl.actor")


MAX_SLOTS = 1 << 16  # the most slots a welcome may name (a ring is one segment of S slots)


class ActorError(RuntimeError):
    """The actor cannot go on (refused by the learner, no learner, mismatched config)."""


@dataclass
class ActorOptions:
    learner: str  # tcp://host:port of the learner's ROUTER
    broadcaster: str  # tcp://host:port of the broadcaster's PUB; its ROUTER is port + 1
    actor_id: str
    seed: int | None = None  # run seed the actor's streams derive from (None: the learner's run.seed)
    connect_timeout_s: float = 60.0
    max_rollouts: int = 0  # 0: until the learner says stop
    run_id: str = ""  # refuse to join any other run ("": any)
    host_label: str = ""  # the host this actor reports (lag report per host); "": hostname
    security: Security | None = None  # keys for non-loopback addresses (default: none)
    token_file: str | None = None  # keeps the learner's token for this id, so a restart proves it at once


class Rejoin(Exception):
    """The session with the learner is over (it does not know this actor, or fell silent): say
    hello again. Internal to the actor loop."""


class Actor:
    def __init__(self, cfg: Config, opts: ActorOptions):
        self.cfg, self.opts = cfg, opts
        torch.set_num_threads(1)
        self.task = make_task(cfg)
        # control: its envs, seeded at the first reset, once the welcome gave the run seed and this id's restart count
        self.producer = self.task.producer()
        self.spec: SlotSpec = self.producer.spec
        self.wire_limits = tp.report_limits(self.spec.num_envs, self.spec.rollout_length)  # reports of E*T episodes
        self.security = opts.security or Security(f"actor {opts.actor_id}")
        sec = self.security.client
        snapshot_ep = snapshot_endpoint(opts.broadcaster)
        keys = sec(opts.learner), sec(opts.broadcaster), sec(snapshot_ep)  # SecurityError before any socket
        self.ctx = tp.context()
        # random identities: no other peer can take over this actor's routes
        self.learner = tp.dealer(self.ctx, opts.learner, tp.route_identity(opts.actor_id), security=keys[0])
        self.weights_sub = tp.sub(self.ctx, opts.broadcaster, security=keys[1])
        self.snapshot = tp.dealer(self.ctx, snapshot_ep, tp.route_identity(opts.actor_id), security=keys[2])
        self.watches = [
            ("learner", opts.learner, tp.handshakes(self.learner)),
            ("broadcaster", opts.broadcaster, tp.handshakes(self.weights_sub)),
            ("broadcaster", snapshot_ep, tp.handshakes(self.snapshot)),
        ]
        self.run_id = ""
        self.epoch = -1  # the learner epoch of this session (from its welcome)
        self.token = self.read_token()  # this id's token of an earlier welcome, if kept
        self.sessions = 0  # welcomes so far
        self.sent = 0  # rollouts sent, all sessions
        self.ring: SlotRing | None = None
        self.local_slot = None  # TCP mode: one slot in ordinary memory
        self.grants: list[tuple[int, int]] = []
        self.policy = None  # the producer, once a welcome bound its policy copy
        self.version = -1  # the version the policy copy holds now
        self.history: WeightHistory | None = None  # made at the welcome (its seed is one of the streams)
        self.seeds: ActorSeeds | None = None
        self.last_heartbeat = 0.0
        self.last_learner_message = time.monotonic()  # the learner answers every heartbeat
        self.rejects = tp.RejectCounter("actor")
        self.revoked = 0  # rollouts dropped because their grant was revoked mid-write
        # NaN/inf from this actor's own envs: counted and logged, never fatal
        self.bad_numbers = tp.RejectCounter(f"actor {opts.actor_id}", log, what="non-finite numbers")
        self.step_sleep_s = cfg.actor.slowdown_s / self.spec.rollout_length
        self.stopped = ""
        self.num_params = 0
        self.num_slots = 0  # slots of the learner's ring (from its welcome)

    # ---- token ----
    def read_token(self) -> bytes | None:
        """The token kept in ``token_file`` (hex), or None (no file, unreadable, not a token)."""
        if not self.opts.token_file:
            return None
        try:
            return bytes.fromhex(open(self.opts.token_file).read().strip()) or None
        except (OSError, ValueError):
            return None

    def keep_token(self, token: bytes) -> None:
        """Write the learner's token for this id to ``token_file`` (mode 0600); logged, never raised."""
        self.token = token
        if not self.opts.token_file:
            return
        try:
            fd = os.open(self.opts.token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(token.hex() + "\n")
        except OSError as exc:
            log.warning("actor %s: could not keep its token in %s: %s", self.opts.actor_id, self.opts.token_file, exc)

    # ---- handshake ----
    def hello(self, timeout_s: float | None = None) -> None:
        """Say hello until the learner answers (it may start later), for up to ``timeout_s``
        (default connect_timeout_s). Raises ActorError when the learner refuses (another run id,
        env, rollout shape, spaces or protocol version, an id in use), refuses the connection
        (keys), or does not answer in time."""
        timeout_s = self.opts.connect_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        header = {
            "type": "hello",
            "proto": tp.PROTOCOL_VERSION,
            "run_id": self.opts.run_id,
            "actor_id": self.opts.actor_id,
            "host": self.opts.host_label or socket.gethostname(),
            "pid": os.getpid(),
            "env_id": self.task.id,
            "spec": self.spec.to_dict(),
            "shm_token": None,
            "token": self.token,
            "spaces": self.producer.spaces,
        }
        next_hello, said_waiting, bad_welcome = 0.0, False, ""
        while time.monotonic() < deadline:
            exit_status.check_stop()  # an interrupt a library swallowed during start-up
            if not said_waiting and deadline - time.monotonic() < timeout_s - 3:
                said_waiting = True  # only once the learner is clearly not there yet
                log.info(
                    "actor %s: waiting for the learner at %s (up to %.0f s)",
                    self.opts.actor_id,
                    self.opts.learner,
                    timeout_s,
                )
            if time.monotonic() >= next_hello:
                tp.send(self.learner, tp.encode(header), block=False)
                next_hello = time.monotonic() + 1.0
            self.check_connections()
            frames = tp.recv_multipart_timeout(self.learner, 200)
            if frames is None:
                continue
            try:
                reply, _ = tp.decode(frames)
            except tp.ProtocolError as exc:  # counted and logged; a real answer may still come
                self.rejects.reject(exc, "learner")
                continue
            if reply["type"] == "refuse":
                raise ActorError(
                    f"actor {self.opts.actor_id}: refused by the learner: {tp.printable(reply['reason'], 1000)}"
                )
            if reply["type"] == "welcome":
                try:
                    return self._welcome(reply)
                except ActorError:
                    raise
                except (ValueError, TypeError, KeyError, AttributeError, RuntimeError) as exc:  # the learner's config
                    # is not one this actor can build: counted, logged, and the hello goes on (until its timeout)
                    bad_welcome = tp.printable(f"{type(exc).__name__}: {exc}")
                    self.rejects.reject(tp.ProtocolError("bad_welcome", bad_welcome), "learner")
                    self.run_id, self.epoch, self.policy = "", -1, None
                    continue
            # anything else (a "rejoin" or heartbeat answer of the session before): not for this hello
        if bad_welcome:
            raise ActorError(
                f"actor {self.opts.actor_id}: the learner at {self.opts.learner} sent a welcome this "
                f"actor cannot use: {bad_welcome}"
            )
        raise ActorError(
            f"actor {self.opts.actor_id}: no learner answered at {self.opts.learner} within {timeout_s:.0f} s"
        )

    def _welcome(self, reply: dict) -> None:
        learner_cfg = from_dict(json.loads(reply["config"]))  # ValueError etc. before anything changes
        if not 1 <= reply["num_slots"] <= MAX_SLOTS:
            raise ValueError(f"welcome names {reply['num_slots']} slots, outside 1..{MAX_SLOTS}")
        self.run_id, self.epoch = reply["run_id"], reply["epoch"]
        self.sessions += 1
        self.keep_token(reply["actor_token"])
        self.last_learner_message = time.monotonic()
        self.num_slots = reply["num_slots"]
        run_seed = self.opts.seed if self.opts.seed is not None else learner_cfg.run.seed
        self.seeds = actor_seeds(run_seed, self.opts.actor_id, reply["restart"], self.cfg.env.num_envs)
        self.producer.bind(learner_cfg, self.seeds)  # the policy copy, in the learner's layout
        self.layout_hash, self.num_params = self.producer.layout_hash, self.producer.num_params
        self.policy = self.producer
        a = self.cfg.actor
        self.history = WeightHistory(
            policy_delay=a.policy_delay, policy_age_buffer=a.policy_age_buffer, seed=self.seeds.lag
        )
        log.info(
            "actor %s: joined run %s (restart %d); env and action streams %s from run seed %d; learner epoch %d",
            self.opts.actor_id,
            tp.printable(self.run_id),
            reply["restart"],
            fingerprint(self.seeds),
            run_seed,
            self.epoch,
        )
        mode = self.cfg.actor.rollout_transport
        if mode == "tcp":
            log.info("actor %s: shipping rollouts over TCP (actor.rollout_transport = tcp)", self.opts.actor_id)
            self.local_slot = self.spec.allocate()
            return
        try:
            self.ring = SlotRing.attach(
                name=reply["shm_name"], spec=self.spec, num_slots=reply["num_slots"], token=reply["token"]
            )
            log.info("actor %s: attached to shared memory %s", self.opts.actor_id, reply["shm_name"])
        except (
            ShmError,
            OSError,
            ValueError,
        ) as exc:  # any attach error: missing, EACCES (another user's), EINVAL, ...
            why = tp.printable(f"{type(exc).__name__}: {exc}")
            if mode == "shm":
                raise ActorError(
                    f"actor {self.opts.actor_id}: actor.rollout_transport is shm, but the learner's "
                    f"shared memory is not reachable from here: {why}"
                ) from None
            log.info(
                "actor %s: learner's shared memory not reachable (%s); shipping rollouts over TCP",
                self.opts.actor_id,
                why,
            )
            self.local_slot = self.spec.allocate()

    def check_connections(self) -> None:
        """Raise ActorError once the learner or the broadcaster refuses this actor's handshake
        (a key it does not accept, another server key, CURVE on one end only)."""
        for what, endpoint, watch in self.watches:
            bad = watch.fatal()
            if bad is not None:
                raise ActorError(
                    f"actor {self.opts.actor_id}: the {what} at {endpoint} refused the connection: {bad.detail}"
                )

    def _send(self, kind: str, **fields) -> None:
        tp.send(
            self.learner,
            tp.encode(
                {
                    "type": kind,
                    "proto": tp.PROTOCOL_VERSION,
                    "run_id": self.run_id,
                    "actor_id": self.opts.actor_id,
                    "token": self.token or b"",
                    **fields,
                },
                limits=self.wire_limits,
            ),
        )

    def end_session(self) -> None:
        """Drop everything of the session with the learner: grants, its shared memory, the weights
        of its epoch and the policy copy (the next welcome makes them again)."""
        self.grants.clear()
        if self.ring is not None:
            self.ring.close()
            self.ring = None
        self.local_slot = None
        self.policy, self.history, self.version, self.epoch = None, None, -1, -1
        tp.drain_all(self.weights_sub)  # a backlog of old versions, and late snapshot replies
        tp.drain_all(self.snapshot)

    # ---- weights ----
    def ask_snapshot(self) -> None:
        tp.send(
            self.snapshot,
            tp.encode(
                {
                    "type": "snapshot",
                    "proto": tp.PROTOCOL_VERSION,
                    "run_id": self.run_id,
                    "actor_id": self.opts.actor_id,
                }
            ),
            block=False,
        )

    def read_snapshots(self, timeout_ms: int) -> bool:
        """Take the broadcaster's snapshot replies that come within ``timeout_ms`` (and any
        pending after the first that holds weights); True once one held weights (an older "no
        weights yet" refusal may come first)."""
        got = False
        frames = tp.recv_multipart_timeout(self.snapshot, timeout_ms)
        while frames is not None:
            if len(frames) == 3:  # [topic, header, payload]
                self._receive(frames)
                got = True
            else:
                try:  # else a refusal: "no weights yet"
                    tp.decode(frames)
                except tp.ProtocolError as exc:
                    self.rejects.reject(exc, "broadcaster")
            frames = tp.recv_multipart_timeout(self.snapshot, 0 if got else timeout_ms)
        return got

    def first_weights(self) -> None:
        """Ask the broadcaster for the newest weights until it has some, heartbeating meanwhile
        (the learner must not drop an actor that waits). Raises ActorError after connect_timeout_s,
        Rejoin if the learner ends the session."""
        deadline = time.monotonic() + self.opts.connect_timeout_s
        while self.history.newest < 0 and not self.stopped:
            exit_status.check_stop()
            if time.monotonic() > deadline:
                raise ActorError(
                    f"actor {self.opts.actor_id}: no weights from the broadcaster at {self.opts.broadcaster}"
                )
            self.ask_snapshot()
            self.check_connections()
            # snapshots only: what waits on the SUB socket may be a backlog of old versions (after a
            # stall); the session's loop drains it once the newest is in, and drops what is older
            self.read_snapshots(500)
            self.heartbeat()
            self.poll_learner(0)
            self.check_learner_silence()

    def receive_weights(self, *, catch_up: bool = True) -> None:
        """Take every weights message pending (older versions matter to the lag controls). With
        ``catch_up``: if the queue was at least half full (a stall: what waits is a backlog of old
        versions, more wait in the kernel's buffers, and the publisher drops newer ones while the
        queue is full; ZeroMQ hands over about HWM - 1), also ask the broadcaster for its newest."""
        pending = tp.drain_all(self.weights_sub)
        for frames in pending:
            self._receive(frames)
        if catch_up and len(pending) >= max(2, self.weights_sub.rcvhwm // 2):
            self.ask_snapshot()
            self.read_snapshots(1000)

    def _receive(self, frames) -> None:
        """Keep a weights message of this session's learner (its run id and epoch); one that does
        not decode is counted and logged, never fatal; another epoch's is dropped."""
        try:
            header, flat = tp.decode_weights(frames, run_id=self.run_id, layout_hash=self.layout_hash)
            if self.num_params and flat.size != self.num_params:
                raise tp.ProtocolError(
                    "frame_size", f"weights of {flat.size} parameters, the policy has {self.num_params}"
                )
        except tp.ProtocolError as exc:
            self.rejects.reject(exc, "broadcaster")
            return
        if header["epoch"] == self.epoch:  # another epoch: an old learner's, or a newer one's
            self.history.add(header["version"], flat)

    def select_weights(self) -> None:
        """Load the version the lag controls pick (the newest, by default) into the policy copy."""
        version, flat = self.history.choose()
        if version != self.version:
            self.policy.load(flat)
            self.version = version

    # ---- grants and reports ----
    def poll_learner(self, timeout_ms: int) -> None:
        frames = tp.recv_multipart_timeout(self.learner, timeout_ms)
        while frames is not None:
            try:
                header, _ = tp.decode(frames, run_id=self.run_id)
            except tp.ProtocolError as exc:
                self.rejects.reject(exc, "learner")
            else:
                self.last_learner_message = time.monotonic()
                if header["type"] == "grant":
                    if header["slot"] >= self.num_slots or header["grant_id"] < 1:
                        self.rejects.reject(
                            tp.ProtocolError(
                                "bad_grant", f"slot {header['slot']} of {self.num_slots}, grant {header['grant_id']}"
                            ),
                            "learner",
                        )
                    else:
                        self.grants.append((header["slot"], header["grant_id"]))
                elif header["type"] == "stop":
                    self.stopped = header["reason"]
                elif header["type"] == "rejoin":
                    raise Rejoin(f"the learner says: {tp.printable(header['reason'])}")
            frames = tp.recv_multipart_timeout(self.learner, 0)

    def check_learner_silence(self) -> None:
        """Raise Rejoin once the learner has said nothing for actor_timeout_s (it answers every
        heartbeat: it is gone, restarting, or this actor was stalled)."""
        silent = time.monotonic() - self.last_learner_message
        if silent > self.cfg.transport.actor_timeout_s:
            raise Rejoin(f"no word from the learner at {self.opts.learner} for {silent:.0f} s")

    def heartbeat(self) -> None:
        now = time.monotonic()
        if now - self.last_heartbeat >= self.cfg.transport.heartbeat_s:
            self._send("heartbeat")
            self.last_heartbeat = now
            self.check_connections()

    def wait_for_grant(self) -> tuple[int, int] | None:
        """The next grant, or None once the learner said stop. Raises Rejoin."""
        while not self.grants and not self.stopped:
            exit_status.check_stop()
            self.heartbeat()
            self.poll_learner(100)
            self.check_learner_silence()
        return self.grants.pop(0) if self.grants and not self.stopped else None

    def tick(self) -> None:
        """Called by the producer while it collects (control: before each env step of its envs): a
        straggler (actor.slowdown_s > 0) sleeps slowdown_s / T per step, so its rollouts take that
        much longer and come back staler."""
        if self.step_sleep_s > 0:
            time.sleep(self.step_sleep_s)
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
        for _ in range(tp.GRANT_CREDITS):  # two credits: fill one slot while the next is granted
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
            self.select_weights()
            slot = self.ring.views(slot_index) if self.ring is not None else self.local_slot
            guard = self.ring.guard(slot_index, grant_id) if self.ring is not None else None
            stats = self.producer.collect(slot, version=self.version, guard=guard, grant_id=grant_id, tick=self.tick)
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
                tp.check_finite(slot)
            except tp.ProtocolError as exc:
                self.bad_numbers.reject(exc, "its envs")
            report = dict(
                grant_id=grant_id,
                env_steps=stats.env_steps,
                episode_returns=returns,
                episode_lengths=lengths,
                timing={"env_s": stats.env_s, "inference_s": stats.inference_s, "wait_s": wait_s},
            )
            if self.ring is not None:
                del slot
                self._send("ready", slot=slot_index, **report)
            else:
                header = {
                    "type": "rollout",
                    "proto": tp.PROTOCOL_VERSION,
                    "run_id": self.run_id,
                    "actor_id": self.opts.actor_id,
                    "token": self.token or b"",
                    **report,
                }
                tp.send(self.learner, tp.encode_rollout(header, slot, self.spec))
            self.sent += 1
            self.heartbeat()

    def close(self) -> None:
        try:
            if self.run_id and not self.stopped:
                tp.send(
                    self.learner,
                    tp.encode(
                        {
                            "type": "bye",
                            "proto": tp.PROTOCOL_VERSION,
                            "run_id": self.run_id,
                            "actor_id": self.opts.actor_id,
                            "token": self.token or b"",
                        }
                    ),
                    block=False,
                )
        finally:
            tp.close(self.learner, self.weights_sub, self.snapshot)
            self.security.close()
            self.ctx.term()
            if self.ring is not None:
                self.ring.close()
            self.producer.close()
