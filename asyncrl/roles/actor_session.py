"""An actor's session with the learner: its options and errors, the hello and the welcome (token,
the learner's config, its shared memory or TCP), messages to the learner, grants, stop and rejoin,
heartbeats and the learner's silence, and the end of a session.

``LearnerSession`` holds these methods of ``asyncrl.roles.actor.Actor`` (a base class of it; they
use the attributes ``Actor.__init__`` sets). A session lasts from a welcome to the learner's stop;
it ends early (``Rejoin``) when the learner says it does not know this actor or is silent for
``transport.actor_timeout_s``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from dataclasses import dataclass

from asyncrl.core import exit_status
from asyncrl.core.background import run_with_heartbeats
from asyncrl.core.config import from_dict
from asyncrl.core.lag_control import WeightHistory
from asyncrl.core.seeding import actor_seeds, fingerprint
from asyncrl.wire import codec, protocol, rejects, sockets
from asyncrl.wire.security import Security
from asyncrl.wire.shm.layout import ShmError
from asyncrl.wire.shm.ring import SlotRing

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


class LearnerSession:
    """The actor's side of the learner's protocol (a base class of ``Actor``)."""

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
            "proto": protocol.PROTOCOL_VERSION,
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
                sockets.send(self.learner, codec.encode(header), block=False)
                next_hello = time.monotonic() + 1.0
            self.check_connections()
            frames = sockets.recv_multipart_timeout(self.learner, 200)
            if frames is None:
                continue
            try:
                reply, _ = codec.decode(frames)
            except protocol.ProtocolError as exc:  # counted and logged; a real answer may still come
                self.rejects.reject(exc, "learner")
                continue
            if reply["type"] == "refuse":
                raise ActorError(
                    f"actor {self.opts.actor_id}: refused by the learner: {rejects.printable(reply['reason'], 1000)}"
                )
            if reply["type"] == "welcome":
                try:
                    return self._welcome(reply)
                except ActorError:
                    raise
                except (ValueError, TypeError, KeyError, AttributeError, RuntimeError) as exc:  # the learner's config
                    # is not one this actor can build: counted, logged, and the hello goes on (until its timeout)
                    bad_welcome = rejects.printable(f"{type(exc).__name__}: {exc}")
                    self.rejects.reject(protocol.ProtocolError("bad_welcome", bad_welcome), "learner")
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
        self.welcomed_at = time.monotonic()  # reports say when they are sent, in seconds since this
        self.keep_token(reply["actor_token"])
        self.last_learner_message = time.monotonic()
        self.num_slots = reply["num_slots"]
        run_seed = self.opts.seed if self.opts.seed is not None else learner_cfg.run.seed
        self.seeds = actor_seeds(run_seed, self.opts.actor_id, reply["restart"], self.cfg.env.num_envs)
        # the policy copy, in the learner's layout; loading a language model takes tens of seconds, so
        # it loads in a worker thread while this one heartbeats (the learner knows us from this welcome)
        run_with_heartbeats(lambda _: self.producer.bind(learner_cfg, self.seeds), self.heartbeat, name="actor-bind")
        self.layout_hash, self.num_params = self.producer.layout_hash, self.producer.num_params
        self.policy = self.producer
        a = self.cfg.actor
        self.history = WeightHistory(
            policy_delay=a.policy_delay, policy_age_buffer=a.policy_age_buffer, seed=self.seeds.lag
        )
        log.info(
            "actor %s: joined run %s (restart %d); env and action streams %s from run seed %d; learner epoch %d",
            self.opts.actor_id,
            rejects.printable(self.run_id),
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
            why = rejects.printable(f"{type(exc).__name__}: {exc}")
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
        sockets.send(
            self.learner,
            codec.encode(
                {
                    "type": kind,
                    "proto": protocol.PROTOCOL_VERSION,
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
        sockets.drain_all(self.weights_sub)  # a backlog of old versions, and late snapshot replies
        sockets.drain_all(self.snapshot)

    # ---- grants and reports ----
    def poll_learner(self, timeout_ms: int) -> None:
        frames = sockets.recv_multipart_timeout(self.learner, timeout_ms)
        while frames is not None:
            try:
                header, _ = codec.decode(frames, run_id=self.run_id)
            except protocol.ProtocolError as exc:
                self.rejects.reject(exc, "learner")
            else:
                self.last_learner_message = time.monotonic()
                if header["type"] == "grant":
                    if header["slot"] >= self.num_slots or header["grant_id"] < 1:
                        self.rejects.reject(
                            protocol.ProtocolError(
                                "bad_grant", f"slot {header['slot']} of {self.num_slots}, grant {header['grant_id']}"
                            ),
                            "learner",
                        )
                    else:
                        self.grants.append((header["slot"], header["grant_id"]))
                elif header["type"] == "stop":
                    self.stopped = header["reason"]
                elif header["type"] == "slot_refused":  # actor_weights: a forged version
                    self.slot_refused(header)
                elif header["type"] == "rejoin":
                    raise Rejoin(f"the learner says: {rejects.printable(header['reason'])}")
            frames = sockets.recv_multipart_timeout(self.learner, 0)

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
