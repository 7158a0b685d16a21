"""Learner role: owns the policy, the optimizer and the shared-memory slot ring; grants slots to
actors (credits = backpressure), gathers B full slots into a batch, runs one learner iteration of
the task (asyncrl.tasks: control or llm), publishes the new weights through the broadcaster, and
accounts for policy lag.

Top to bottom: serve messages -> consume a batch when B slots are full -> publish -> repeat
until the env-step budget; then stop the actors, checkpoint, summarise, remove the segment.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import secrets
import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from asyncrl.core.config import Config, EnvConfig
from asyncrl.core.consume import Consumer, SlotData, SlotError, check_slot, own_rows
from asyncrl.tasks import make_task
from asyncrl.wire import transport as tp
from asyncrl.wire.addresses import advertised_with_source, endpoint_host, is_loopback, snapshot_endpoint
from asyncrl.wire.security import Security
from asyncrl.wire.shm.dev_shm import check_space, cleanup_stale
from asyncrl.wire.shm.layout import segment_nbytes
from asyncrl.wire.shm.ledger import SlotLedger
from asyncrl.wire.shm.ring import SlotRing
from asyncrl.wire.weights_secret import read_weights_secret

log = logging.getLogger("asyncrl.learner")

# Actor messages that a learner which does not know the sender answers with "rejoin".
_SESSION_TYPES = ("request", "ready", "rollout", "heartbeat")
# Seconds without a publish after which the learner publishes its current weights again (cheap):
# a broadcaster that lost them (restarted) must not wait for an iteration that waits for it.
REPUBLISH_S = 2.0
# Per-peer bounds (issue 39): an actor asks for tp.GRANT_CREDITS slots and one more per report, so
# an honest actor never holds more; a peer asking for more (to hoard the ring) is held to it, per
# actor id and per connection (one connection may speak for several ids).
MAX_IDS_PER_CONNECTION = 4
ROUTER_HWM = 64  # messages queued per actor connection, each way
MAX_MESSAGES_PER_SERVE = 256  # serve() returns after this many: a flood cannot keep it from training
LEASE_TIMEOUTS = 6  # derived lease: this many actor timeouts ...
LEASE_SLOT_TIMES = 4  # ... or this many of the slowest report interval seen, whichever is longer
MAX_UNDELIVERED_IDS = 1024  # join records kept for ids that never delivered a trained slot


class LearnerError(RuntimeError):
    """The learner cannot go on (e.g. the broadcaster refuses its connection)."""


def learner_epoch(previous: int = 0) -> int:
    """The epoch of a learner starting now: wall-clock nanoseconds (``time.time_ns``), or
    ``previous + 1`` if the clock reads no later than ``previous`` (e.g. the epoch saved in the
    checkpoint a resumed learner continues). So every start is newer than the last one, without
    a checkpoint, as long as the clock does not go back by more than the time between starts.
    Weights carry it; a broadcaster takes only a higher (epoch, version) than it holds."""
    return max(time.time_ns(), int(previous) + 1)


@dataclass
class ActorInfo:
    host: str
    pid: int
    last_seen: float
    route: bytes = b""  # its DEALER identity: where replies go
    token: bytes = b""  # its per-actor token: every message must carry it
    pending: int = 0  # grants asked for and not yet given
    mode: str = "shm"
    meta: dict = field(default_factory=dict)
    joined: float = 0.0  # monotonic time of its welcome
    lease_from: float = 0.0  # monotonic: its welcome, last accepted report, or first grant since


class Learner:
    write_error: OSError | None = None  # the run-directory failure that ended the run, if one did

    def __init__(
        self,
        cfg: Config,
        run_dir: str | Path,
        *,
        run_id: str,
        bind: str,
        broadcaster: str,
        echo=print,
        security: Security | None = None,
        advertise: str | None = None,
        resume: bool = False,
        epoch: int | None = None,
    ):
        """``security``: the keys and CURVE rule for its sockets (default: loopback only, no keys);
        ``advertise``: the address actors on other hosts use, when not the bound one; ``resume``:
        go on from the run directory's newest checkpoint (asyncrl.core.consume.Consumer); ``epoch``:
        this learner's epoch (default: ``learner_epoch(epoch of the checkpoint resumed)``, newer at
        every start, resumed or not; saved in every checkpoint).

        Raises SecurityError (keys missing for a non-loopback address), transport.AddressError
        (address in use, not of this host), ShmError, EnvError."""
        self.cfg, self.run_dir, self.run_id, self.echo = cfg, Path(run_dir), run_id, echo
        self.security, self.advertise, self.broadcaster = security or Security("learner"), advertise, broadcaster
        # The task first (no file, no segment): the router's frame limit comes from its slot layout.
        torch.set_num_threads(cfg.learner.torch_threads)
        self.task = make_task(cfg)
        self.spec = self.task.spec
        self.spaces = self.task.spaces
        self.wire_limits = tp.report_limits(self.spec.num_envs, self.spec.rollout_length)  # reports of E*T episodes
        # no frame larger than a report's header or one field of a slot is ever buffered
        max_frame = max(
            self.wire_limits.max_bytes, *(int(np.prod(f.shape)) * f.dtype.itemsize for f in self.spec.fields)
        )
        # Sockets next: a refused key or a busy port must not leave a shared-memory segment behind.
        self.ctx = tp.context()
        try:
            weights_ep = snapshot_endpoint(broadcaster)
            # a small queue per actor connection: an honest actor has a few messages in flight
            self.router = tp.router(
                self.ctx,
                bind,
                hwm=ROUTER_HWM,
                max_message_bytes=max_frame,
                security=self.security.server(self.ctx, bind),
            )
            self.weights_curve = self.security.client(weights_ep)
            # immediate: nothing queued for a broadcaster not there (signed with a secret it may not
            # hold any more); it gets the weights when it (re)connects, see check_connections
            # it receives nothing (the broadcaster answers snapshot requests only): any frame is small
            self.weights_out = tp.dealer(
                self.ctx,
                weights_ep,
                tp.route_identity(f"learner-{run_id}"),
                security=self.weights_curve,
                immediate=True,
                max_message_bytes=tp.MAX_HEADER_BYTES,
            )
        except BaseException:
            self.security.close()
            self.ctx.destroy(linger=0)
            raise
        self.endpoint = tp.endpoint_of(self.router)
        self.actor_watch, self.broadcaster_watch = tp.handshakes(self.router), tp.handshakes(self.weights_out)
        self.next_check = self.next_reap = 0.0
        self.by_route: dict[bytes, set[str]] = {}  # connection -> the actor ids it speaks for
        self.broadcaster_handshakes = 0  # seen so far: a new one means a (re)connected broadcaster
        self.last_publish = 0.0
        self.warned_unsigned = False
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # /dev/shm too small: one line before any file of the run exists (it can be rerun in the same directory)
        check_space(segment_nbytes(self.spec, cfg.learner.num_slots), self.spec, cfg.learner.num_slots)
        self.consumer = Consumer(cfg, self.spec, self.run_dir, resume=resume, task=self.task)
        self.state = self.consumer.state
        # newer than the epoch the checkpoint it resumes was written under, even after a clock step back
        self.epoch = learner_epoch(self.consumer.learner_epoch) if epoch is None else int(epoch)
        self.consumer.learner_epoch = self.epoch
        for name in cleanup_stale():
            log.warning("learner: removed shared-memory segment %s left by a dead run", name)
        self.ring = SlotRing.create(run_id=run_id, spec=self.spec, num_slots=cfg.learner.num_slots)
        self.ledger = SlotLedger(cfg.learner.num_slots)
        self.actors: dict[str, ActorInfo] = {}
        self.full_meta: dict[int, tuple[str, dict]] = {}
        self.copied: list[SlotData] = []  # slots copied out of the ring, not yet trained on
        self.rejects = tp.RejectCounter("learner")
        self.session_log = tp.LogBudget(per_window=50, window_s=10.0)  # joins, leaves, refusals (peer_log)
        self.undelivered: dict[
            str, None
        ] = {}  # ids joined in this life that delivered no trained slot yet, oldest first
        self.slowest_report_s = 0.0  # longest time an actor held grants before an accepted report
        self.timing: Counter[str] = Counter()  # seconds: where the time goes
        self.rollouts_by_transport: Counter[str] = Counter()  # "shm" / "tcp"
        self.publish()

    # ---- weights ----
    def publish(self) -> None:
        """Send the current weights to the broadcaster (publish time: the Consumer's record),
        signed with the secret the broadcaster wrote on this host (security.read_weights_secret;
        read at each publish, so a restarted broadcaster's new secret is used at once)."""
        now = self.consumer.lag.publish_time[self.state.version]
        frames = tp.encode_weights(
            run_id=self.run_id,
            epoch=self.epoch,
            version=self.state.version,
            publish_time=now,
            layout_hash=self.state.layout_hash,
            payload=self.state.flat_weights(),
        )
        self.last_publish = time.monotonic()
        secret = read_weights_secret(self.broadcaster)
        if secret is None and self.weights_curve is None:  # it would refuse them
            if not self.warned_unsigned:
                self.warned_unsigned = True
                log.warning(
                    "learner: no weights secret of the broadcaster at %s on this host (not started yet, or "
                    "run by another user); weights are held back until there is one",
                    self.broadcaster,
                )
            return
        tp.send(self.weights_out, tp.sign_weights(frames, secret), block=False)

    # ---- messages ----
    def serve(self, timeout_ms: int) -> None:
        """Handle the messages that come within ``timeout_ms`` (at most MAX_MESSAGES_PER_SERVE, so a
        flood cannot keep the learner from training), then reap silent actors and expired leases,
        grant, and check connections."""
        frames = tp.recv_multipart_timeout(self.router, timeout_ms, copy=False)
        handled = 0
        while frames is not None:
            self.handle(frames)
            handled += 1
            if handled >= MAX_MESSAGES_PER_SERVE:
                break
            frames = tp.recv_multipart_timeout(self.router, 0, copy=False)
        now = time.monotonic()
        if now >= self.next_reap:  # each scans every actor: at most 10 times a second
            self.next_reap = now + 0.1
            self.reap_silent_actors()
            self.reclaim_expired_leases()
        self.grant_pending()
        self.check_connections()

    def check_connections(self) -> None:
        """Log refused actor connections; raise LearnerError if the broadcaster refuses ours
        (weights would never reach anyone). At most every 0.25 s."""
        now = time.monotonic()
        if now < self.next_check:
            return
        self.next_check = now + 0.25
        self.security.note_refusals(self.actor_watch)
        bad = self.broadcaster_watch.fatal()
        if bad is not None:
            raise LearnerError(
                f"learner: the broadcaster at {snapshot_endpoint(self.broadcaster)} refused the "
                f"connection: {bad.detail}"
            )
        if self.broadcaster_watch.succeeded != self.broadcaster_handshakes or now - self.last_publish > REPUBLISH_S:
            # a broadcaster (re)connected, or no publish for a while: it may hold no weights
            # (restarted), and actors waiting for their first weights would wait for ever, since the
            # next publish needs their rollouts. It ignores a version it holds.
            self.broadcaster_handshakes = self.broadcaster_watch.succeeded
            self.publish()

    def handle(self, frames) -> None:
        identity = frames[0].bytes if hasattr(frames[0], "bytes") else bytes(frames[0])
        sender = identity.decode(errors="replace")
        try:
            header, arrays = tp.decode(frames[1:], limits=self.wire_limits)
            kind = header["type"]
            if kind == "hello":
                return self.on_hello(identity, header)
            if header["run_id"] != self.run_id:
                self.ask_rejoin(identity, kind, f"this learner runs {self.run_id}")
                raise tp.ProtocolError("run_id", f"{kind}: run {header['run_id']!r}, this run is {self.run_id!r}")
            actor = self.actors.get(header.get("actor_id", ""))
            if actor is None:
                self.ask_rejoin(identity, kind, "this learner does not know this actor (restarted, or it dropped it)")
                raise tp.ProtocolError("unknown_actor", f"{kind} from an actor that did not say hello")
            if identity != actor.route or not hmac.compare_digest(header.get("token", b""), actor.token):
                raise tp.ProtocolError(
                    "bad_token", f"{kind} for actor {header['actor_id']!r} from another connection or without its token"
                )
            actor.last_seen = time.monotonic()
            if kind == "request":
                if (
                    self.outstanding(actor_id=header["actor_id"]) >= tp.GRANT_CREDITS
                    or self.outstanding(route=identity) >= tp.GRANT_CREDITS
                ):
                    raise tp.ProtocolError(
                        "over_credit",
                        f"request beyond the {tp.GRANT_CREDITS} outstanding grants "
                        f"an actor (and a connection) may hold",
                    )
                actor.pending += 1
            elif kind in ("ready", "rollout"):
                self.on_report(header["actor_id"], header, arrays)
                actor.pending += 1  # every report of a slot it held asks for the next one
            elif kind == "bye":
                self.forget(header["actor_id"], "said bye")
            elif kind == "heartbeat":  # answered, so an actor can tell a dead learner
                self.reply(identity, {"type": "heartbeat", "actor_id": header["actor_id"], "token": actor.token})
            else:
                raise tp.ProtocolError("unexpected_type", kind)
        except tp.ProtocolError as exc:
            self.rejects.reject(exc, sender)
            raw = tp.peek(frames[1]) if exc.reason == "proto" and len(frames) > 1 else {}
            if raw.get("type") == "hello":  # tell an actor of another version why it gets nothing
                reason = tp.printable(
                    f"proto: actor has protocol {raw.get('proto')!r}, learner has {tp.PROTOCOL_VERSION}", 1000
                )
                self.peer_log(logging.WARNING, "learner: refused actor %s: %s", tp.printable(sender), reason)
                self.reply(identity, {"type": "refuse", "reason": reason})
        except Exception as exc:  # noqa: BLE001 - peer input must never end the learner: counted, logged, refused
            self.rejects.reject(tp.ProtocolError(f"handler_error:{type(exc).__name__}", f"{exc!r}"[:300]), sender)
            if self.rejects.budget.allow()[0]:
                log.warning("learner: a message from %s raised in its handler", tp.printable(sender), exc_info=True)

    def ask_rejoin(self, identity: bytes, kind: str, why: str) -> None:
        """Tell the sender of a session message this learner cannot place (an actor of a learner
        that was restarted, or one it dropped) to say hello again."""
        if kind in _SESSION_TYPES:
            self.reply(identity, {"type": "rejoin", "reason": why})

    def on_hello(self, identity: bytes, h: dict) -> None:
        """Welcome an actor whose hello fits this run. Its id is free, or held by an actor silent
        for ``actor_timeout_s``, or the hello carries that id's token (a restarted actor proving
        it is that actor: it takes over at once); any other claim on a live id is refused."""
        actor_id = h["actor_id"]
        mismatch = tp.printable(self.mismatch(h), 1000)  # it quotes the actor's values: keep it sendable
        if mismatch:
            self.peer_log(
                logging.WARNING,
                "learner: refused actor %s from %s: %s",
                tp.printable(actor_id),
                tp.printable(h["host"]),
                mismatch,
            )
            self.reply(identity, {"type": "refuse", "reason": mismatch})
            return
        old = self.actors.get(actor_id)
        if old is not None and old.route == identity:
            return  # a repeated hello from the same connection
        if len(self.by_route.get(identity, ())) >= MAX_IDS_PER_CONNECTION:
            reason = f"this connection already speaks for {MAX_IDS_PER_CONNECTION} actor ids"
            self.reply(identity, {"type": "refuse", "reason": reason})
            raise tp.ProtocolError("ids_per_connection", f"hello as {tp.printable(actor_id, 64)}: {reason}")
        proved = old is not None and h["token"] is not None and hmac.compare_digest(h["token"], old.token)
        if old is not None and not proved and _gone_here(old):  # it died on this host (e.g. restarted by asyncrl run)
            self.forget(actor_id, f"its process {old.pid} is gone")
            old = None
        if old is not None and not proved and time.monotonic() - old.last_seen < self.cfg.transport.actor_timeout_s:
            reason = tp.printable(
                f"actor_id: {actor_id!r} is in use by pid {old.pid} on {old.host}; pick another --actor-id", 1000
            )
            self.peer_log(
                logging.WARNING,
                "learner: refused a second actor %s from %s: %s",
                tp.printable(actor_id),
                tp.printable(h["host"]),
                reason,
            )
            self.reply(identity, {"type": "refuse", "reason": reason})
            return
        if old is not None:
            self.forget(actor_id, "came back with its token" if proved else "restarted")
        self.state.reward_scaler.reset(actor_id)  # a new incarnation: its envs start afresh
        restart = self.state.actor_joins.get(actor_id, 0)  # a seed input: a rejoin draws new streams
        self.state.actor_joins[actor_id] = restart + 1
        self.note_undelivered(actor_id, restart)
        token = old.token if proved else secrets.token_bytes(16)
        now = time.monotonic()
        self.actors[actor_id] = ActorInfo(
            h["host"], h["pid"], now, route=identity, token=token, joined=now, lease_from=now
        )
        self.by_route.setdefault(identity, set()).add(actor_id)
        self.peer_log(
            logging.INFO,
            "learner: actor %s joined from %s (pid %d)%s",
            tp.printable(actor_id),
            tp.printable(h["host"]),
            h["pid"],
            f", restart {restart}" if restart else "",
        )
        self.reply(
            identity,
            {
                "type": "welcome",
                "shm_name": self.ring.name,
                "num_slots": self.cfg.learner.num_slots,
                "spec": self.spec.to_dict(),
                "token": self.ring.token,
                "config": json.dumps(self.cfg.to_dict()),
                "restart": restart,
                "epoch": self.epoch,
                "actor_token": token,
            },
        )

    def peer_log(self, level: int, msg: str, *args) -> None:
        """A log line caused by a peer (joins, leaves, refusals): at most ``session_log``'s budget a
        window, with a count of the lines held back, so that peers cannot fill the disk."""
        allowed, held = self.session_log.allow()
        if allowed:
            log.log(level, msg + (f" ({held} similar lines suppressed)" if held else ""), *args)

    def note_undelivered(self, actor_id: str, restart: int) -> None:
        """Keep the join records (``state.actor_joins``, checkpointed) of at most MAX_UNDELIVERED_IDS
        ids that joined in this learner's life and never delivered a trained slot: the oldest such
        record not in use goes. Its restart count may then start again at 0, which is harmless: no
        sample of its streams was ever trained on. Ids that delivered, or come from the checkpoint,
        keep their monotonic count (seeding needs it)."""
        if restart == 0:  # a new id (ids of the checkpoint or that delivered have joined before)
            self.undelivered[actor_id] = None
        while len(self.undelivered) > MAX_UNDELIVERED_IDS:
            victim = next((a for a in self.undelivered if a not in self.actors and a != actor_id), None)
            if victim is None:
                return
            del self.undelivered[victim]
            self.state.actor_joins.pop(victim, None)

    def outstanding(self, *, actor_id: str | None = None, route: bytes | None = None) -> int:
        """Grants held plus asked for, by ``actor_id``, or by every actor on connection ``route``."""
        ids = [actor_id] if actor_id is not None else self.by_route.get(route, ())
        return sum(len(self.ledger.granted_to(a)) + self.actors[a].pending for a in ids if a in self.actors)

    def mismatch(self, h: dict) -> str:
        """'' if the actor's run id (when it names one), env, rollout shape and spaces match this
        run; else one line naming the field."""
        return handshake_mismatch(
            h, run_id=self.run_id, env_id=self.task.id, spec=self.spec.to_dict(), spaces=self.spaces
        )

    def reply(self, identity: bytes, header: dict) -> None:
        """Send ``header`` to ``identity``; never raises: a reply that cannot be encoded (e.g. a
        string over the wire's limits) is counted as "unsendable_reply" and logged instead."""
        try:
            frames = tp.encode({"run_id": self.run_id, **header})
        except (tp.ProtocolError, ValueError, TypeError) as exc:
            self.rejects.reject(tp.ProtocolError("unsendable_reply", f"{header.get('type')}: {exc}"), identity)
            return
        tp.send(self.router, [identity, *frames], block=False)

    def on_report(self, actor_id: str, h: dict, arrays) -> None:
        """A slot is full: checked, then queued for the next batch. A rejected report frees
        its slot again, so nothing of it is ever consumed."""
        if h["type"] == "ready":
            slot = h["slot"]
            held = any(g == (slot, h["grant_id"]) for g in self.ledger.granted_to(actor_id))
        else:
            slot = next((g.slot for g in self.ledger.granted_to(actor_id) if g.grant_id == h["grant_id"]), None)
            held = slot is not None
        if not held:
            raise tp.ProtocolError(
                "stale_grant", f"{h['type']} for slot {slot} grant {h['grant_id']} not held by {actor_id}"
            )
        info = self.actors[actor_id]
        try:
            env_steps = self.check_report(info, h)
            if h["type"] == "rollout":
                received = tp.decode_rollout_frames(arrays, self.spec)
                self.validate_slot(received, h["grant_id"])
                episode_returns = self.check_episodes(received, h)
                views = self.ring.views(slot)
                for name, a in received.items():
                    views[name][...] = a
                del views
                info.mode = "tcp"
                self.rollouts_by_transport["tcp"] += 1
            else:
                views = self.ring.views(slot)
                self.validate_slot(views, h["grant_id"])
                episode_returns = self.check_episodes(views, h)
                del views
                self.rollouts_by_transport["shm"] += 1
        except tp.ProtocolError:
            if self.ledger.void(actor_id, slot, h["grant_id"]):
                self.ring.disarm(slot)
            info.pending += 1  # the grant it held is void: it may ask again
            self.state.reward_scaler.reset(actor_id)  # the stream has a gap now
            raise
        self.ledger.complete(actor_id, slot, h["grant_id"])
        now = time.monotonic()
        self.slowest_report_s = max(self.slowest_report_s, now - info.lease_from)
        info.lease_from = now
        self.full_meta[slot] = (
            actor_id,
            {"host": info.host, "env_steps": env_steps, "episode_returns": episode_returns, "grant_id": h["grant_id"]},
        )
        for key in ("env_s", "inference_s", "wait_s"):
            self.timing["actors_" + key] += float(h["timing"].get(key, 0.0))

    def check_report(self, info: ActorInfo, h: dict) -> int:
        """The env steps a report's slot holds, E * T of the slot's shape (what the learner knows;
        llm: completions). Raises ProtocolError "env_steps" if the report says another number,
        "timing" unless each of its timing values is a number of seconds in 0..(seconds since the
        actor's welcome + 1)."""
        steps = self.spec.num_envs * self.spec.rollout_length
        if h["env_steps"] != steps:
            raise tp.ProtocolError("env_steps", f"report of {h['env_steps']} env steps, a slot holds {steps}")
        limit = time.monotonic() - info.joined + 1.0
        for key, value in h["timing"].items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= limit:
                raise tp.ProtocolError(
                    "timing",
                    f"timing {tp.printable(key, 40)} = {tp.printable(repr(value), 40)}: not seconds in 0..{limit:.0f}",
                )
        return steps

    def check_episodes(self, views: dict, h: dict) -> list[float]:
        """The episode returns to record for a report: raise ProtocolError "episodes" unless the
        report's returns and lengths can be those of the slot (``spec.episode_mismatch``: control:
        counts against the slot's episode ends, episodes inside the slot recomputed from its rewards;
        llm: the returns are the slot's rewards); then ``spec.episode_statistics`` (what the slot
        shows, when the report left episodes out)."""
        bad = self.spec.episode_mismatch(views, h["episode_returns"], h["episode_lengths"])
        if bad is not None:
            raise tp.ProtocolError("episodes", bad)
        return self.spec.episode_statistics(views, h["episode_returns"], h["episode_lengths"])[0]

    def validate_slot(self, views: dict, grant_id: int) -> None:
        """Raise ProtocolError (reason of ``consume.check_slot``) unless the slot, written under
        ``grant_id``, can be trained on."""
        try:
            check_slot(views, self.spec, version=self.state.version, grant_id=grant_id)
        except SlotError as exc:
            raise tp.ProtocolError(exc.reason, str(exc).split(": ", 1)[1]) from None

    def forget(self, actor_id: str, why: str) -> None:
        freed = self.ledger.reclaim(actor_id)
        for s in freed:
            self.ring.disarm(s)  # the old writer must stop writing these
        info = self.actors.pop(actor_id, None)
        if info is not None:
            ids = self.by_route.get(info.route, set())
            ids.discard(actor_id)
            if not ids:
                self.by_route.pop(info.route, None)
        self.peer_log(
            logging.INFO, "learner: actor %s left (%s); %d granted slots freed", tp.printable(actor_id), why, len(freed)
        )

    def lease_s(self) -> float:
        """Seconds an actor may hold grants without an accepted report: transport.grant_lease_s, or
        (0) the longer of LEASE_TIMEOUTS actor timeouts and LEASE_SLOT_TIMES x the longest time an
        actor held grants before an accepted report so far (an llm slot can take minutes)."""
        t = self.cfg.transport
        if t.grant_lease_s > 0:
            return t.grant_lease_s
        return max(LEASE_TIMEOUTS * t.actor_timeout_s, LEASE_SLOT_TIMES * self.slowest_report_s)

    def reclaim_expired_leases(self) -> None:
        """Take back the grants of actors that hold some and delivered no accepted report for
        ``lease_s`` (a peer that only heartbeats): the slots' generations change, so a late writer
        can never land in them once they are granted again; the actor gets its credits back."""
        now, lease = time.monotonic(), self.lease_s()
        for actor_id, info in self.actors.items():
            if now - info.lease_from <= lease:
                continue
            info.lease_from = now  # the next lease starts now
            freed = self.ledger.reclaim(actor_id)
            if not freed:
                continue
            for s in freed:
                self.ring.disarm(s)
            self.ledger.counters["lease_expired"] += len(freed)
            info.pending += len(freed)
            self.state.reward_scaler.reset(actor_id)  # its stream has a gap now
            if self.rejects.budget.allow()[0]:
                log.warning(
                    "learner: actor %s held %d granted slots for %.0f s without a report (lease); taken back",
                    tp.printable(actor_id),
                    len(freed),
                    lease,
                )

    def reap_silent_actors(self) -> None:
        now = time.monotonic()
        for actor_id in [a for a, i in self.actors.items() if now - i.last_seen > self.cfg.transport.actor_timeout_s]:
            self.forget(actor_id, f"silent for {self.cfg.transport.actor_timeout_s:.0f} s")

    def grant_pending(self) -> None:
        """Grant free slots to the actors that asked, one at a time, longest-unserved first: an
        actor just served goes to the back of ``self.actors``. With fewer slots than requests
        (many actors, e.g. across hosts), the first actors to join would otherwise take every
        freed slot and starve the rest."""
        while True:
            actor_id = next((a for a, info in self.actors.items() if info.pending > 0), None)
            if actor_id is None:
                return
            g = self.ledger.grant(actor_id)
            if g is None:
                return
            info = self.actors.pop(actor_id)
            info.pending -= 1
            if len(self.ledger.granted_to(actor_id)) == 1:  # it held none: its lease starts now
                info.lease_from = time.monotonic()
            self.actors[actor_id] = info
            self.ring.arm(g.slot, g.grant_id)  # before the actor can know of the grant
            self.reply(info.route, {"type": "grant", "slot": g.slot, "grant_id": g.grant_id})

    # ---- learning ----
    def collect_full(self, limit: int) -> None:
        """Copy up to ``limit`` of the oldest full slots out and free them. A copy is kept only if
        the grant whose report was accepted still held the slot during the copy and no revoked
        writer touched it (slot integrity, shm.py), and if it passes the report's checks again (the
        memory could change after the report); else it is dropped and counted, and its stream
        restarts."""
        for s in self.ledger.pop_full(min(limit, self.ledger.num_full)):
            actor_id, meta = self.full_meta.pop(s)
            views = self.ring.views(s)
            arrays = {k: v.copy() for k, v in views.items()}
            del views
            intact = self.ring.intact(s, meta["grant_id"])
            self.ledger.release(s)
            self.ring.disarm(s)
            own = own_rows(arrays, meta["grant_id"])
            self.audit(intact, own)
            try:
                if not intact:
                    raise SlotError(
                        "revoked_writer",
                        f"slot {s} of grant {meta['grant_id']} was written into by a "
                        f"writer whose grant had been revoked",
                    )
                # the tags were read once above: check_slot's own tag check only where they are foreign
                check_slot(arrays, self.spec, version=self.state.version, grant_id=None if own else meta["grant_id"])
            except SlotError as exc:
                self.consumer.reject_slot(actor_id, exc.reason)
                n = self.consumer.rejected_slots[exc.reason]
                if n & (n - 1) == 0:
                    log.warning("learner: dropped a slot of actor %s: %s (%d so far)", actor_id, exc, n)
                continue
            self.copied.append(SlotData(actor_id, meta["host"], arrays, meta["env_steps"], meta["episode_returns"]))

    def audit(self, intact: bool, own: bool) -> None:
        """Count one copied slot in the row-tag audit (summary.json ``slot_audit``), independent of
        the generation check: ``passed_generation_foreign_rows`` counts slots that check passed
        although a row is tagged with another grant (they are dropped too, as ``foreign_rows``)."""
        self.consumer.slot_audit["copied"] += 1
        key = ("passed_generation" if intact else "revoked_writer") + ("_own_rows" if own else "_foreign_rows")
        self.consumer.slot_audit[key] += 1

    def consume(self) -> bool:
        """Copy full slots out (no more than the next batch needs) and free them; once B good
        copies are there, run one learner iteration on them and publish.

        Only what the next batch needs leaves the ring: the ring of learner.num_slots is the one
        queue between actors and learner, so actors faster than the learner wait for a free slot
        and the lag stays bounded (at most num_slots / B iterations of queueing). Copying every
        full slot out, as this did until 2026-12-01, freed slots as fast as actors filled them:
        with actors faster than the learner (actor hosts over TCP, toy envs) the copies piled up,
        memory grew and the lag grew without bound (42 versions after 125 iterations, measured)."""
        B = self.cfg.learner.slots_per_batch
        if self.ledger.num_full and len(self.copied) < B:
            self.collect_full(B - len(self.copied))
            self.grant_pending()  # actors go on while the learner learns
        if len(self.copied) < B:
            return False
        batch, self.copied = self.copied[:B], self.copied[B:]
        trained = self.consumer.consume(batch) is not None
        for sd in batch:  # these ids' join records are now kept for good (seeding)
            self.undelivered.pop(sd.actor, None)
        # The snapshot (and every learner.checkpoint_every iterations the checkpoint) is taken before
        # the weights go out, not after: after the publish, its 0.5-1 ms delayed the next grants just
        # long enough for the new weights (one hop longer, through the broadcaster) to reach the actors
        # first. That made the main job more synchronous than designed: lag-2 samples fell from 7-9 % to
        # 0.3-1 % (lag p95 2 -> 1 version), measured 2026-12-03 (docs/results/throughput.md).
        self.consumer.end_iteration()
        if trained:
            self.publish()
        return True

    def announce(self) -> None:
        """Where actors connect; for a non-loopback address, the exact actor command to use."""
        security = self.security.describe(self.endpoint)
        if is_loopback(self.endpoint):
            return
        adv, source = advertised_with_source(self.endpoint, self.advertise)
        b = self.broadcaster
        if is_loopback(b):  # same host as the learner: other hosts use the learner's name
            b = f"tcp://{endpoint_host(adv)}:{b.rsplit(':', 1)[1]}"
        env, default = self.cfg.env, EnvConfig()
        flags = [f"--env {env.id}"] + ([f"--env-module {env.module}"] if env.module else [])
        if env.num_envs != default.num_envs:
            flags.append(f"--num-envs {env.num_envs}")
        for key in ("rollout_length", "max_episode_steps"):
            if getattr(env, key) != getattr(default, key):
                flags.append(f"--set env.{key}={getattr(env, key)}")
        flags.append("--insecure" if self.security.insecure else "--keys KEYS/client-K")
        self.echo(
            f"learner: run {self.run_id}, actors connect to {adv} ({security}), address from {source}; "
            f"on each actor host run:\n"
            f"  asyncrl actor --learner {adv} --broadcaster {b} {' '.join(flags)} "
            f"--run-id {self.run_id} --actor-id NAME"
        )

    def run(self) -> dict:
        self.announce()
        log.info("learner: run %s listening on %s, shared memory %s", self.run_id, self.endpoint, self.ring.name)
        while not self.consumer.done:
            t0 = time.perf_counter()
            self.serve(5)
            t1 = time.perf_counter()
            if not self.consume():
                self.timing["learner_wait_s"] += t1 - t0
            self.consumer.progress(self.echo)
        return self.finish()

    def finish(self, *, outcome: str = "finished", reason: str | None = None) -> dict:
        """Stop the actors, write the final checkpoint and summary.json (``outcome`` as in
        ``Consumer.finish``; a failure is the learner's, for ``reason``); returns the summary."""
        why = {
            "finished": "step budget reached",
            "interrupted": "the learner was interrupted",
            "failed": "the learner failed",
        }.get(outcome, outcome)
        for info in list(self.actors.values()):
            self.reply(info.route, {"type": "stop", "reason": why})
        self.timing["learner_update_s"] = self.consumer.update_s
        return self.consumer.finish(
            outcome=outcome,
            failed_role="learner" if outcome == "failed" else None,
            reason=reason,
            mode="async",
            run_id=self.run_id,
            rejected_messages=self.rejects.by_reason(),
            time_breakdown_s=dict(self.timing),
            slot_counters=dict(self.ledger.counters),
            refused_connections=self.security.refused.by_reason(),
            learner_epoch=self.epoch,
            rollouts_by_transport=dict(self.rollouts_by_transport),
        )

    def record_failure(self, exc: BaseException) -> None:
        """summary.json of a run this learner cannot go on with: outcome "failed", role learner,
        reason ``exc``. Never raises: a failure to write it (e.g. the run directory is the cause)
        is logged, and the caller reports ``exc`` itself."""
        reason = str(exc) if isinstance(exc, LearnerError) else f"{type(exc).__name__}: {exc}"
        if isinstance(exc, OSError):
            self.write_error = exc
        try:
            self.finish(outcome="failed", reason=reason)
        except Exception as inner:  # noqa: BLE001 - logged; the original error goes on
            same = isinstance(exc, OSError) and isinstance(inner, OSError) and inner.errno == exc.errno
            # the run directory's own failure (disk full): the caller's one line says it all
            log.log(
                logging.DEBUG if same else logging.ERROR,
                "learner: could not write the summary of the failed run: %s",
                inner,
            )

    def close(self) -> None:
        """Idempotent; always removes the shared-memory segment."""
        try:
            try:
                self.consumer.close()
            except OSError as exc:  # disk full at its last rows: what was written stays readable
                if self.write_error is None:
                    log.warning("learner: %s", exc)
            tp.close(self.router, self.weights_out)
            self.security.close()
            self.ctx.term()
        finally:
            self.ring.close()
            self.ring.unlink()


def _gone_here(actor: ActorInfo) -> bool:
    """True if ``actor`` said it runs on this host and no process of its pid exists here."""
    if actor.host != socket.gethostname() or not 1 <= actor.pid <= tp.MAX_PID:  # declared: not trusted as a pid
        return False
    try:
        os.kill(actor.pid, 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError, ValueError):  # it exists (another user's), or no pid: not ours to judge
        return False
    return False


def handshake_mismatch(h: dict, *, run_id: str, env_id: str, spec: dict, spaces: dict) -> str:
    """'' if a ``hello`` header fits this run; else one line naming the first field that differs
    and both values: run_id (only when the actor names one), env_id (the task's id), the fields of
    the learner's ``spec`` dict (control: obs_dim, action_dim, discrete, rollout_length, num_envs),
    then the observation and action spaces (only when the actor describes them)."""
    if h["run_id"] and h["run_id"] != run_id:
        return f"run_id: actor has {h['run_id']!r}, learner has {run_id!r}"
    if h["env_id"] != env_id:
        return f"env_id: actor has {h['env_id']!r}, learner has {env_id!r}"
    for key in spec:
        if h["spec"].get(key) != spec[key]:
            return f"{key}: actor has {h['spec'].get(key)!r}, learner has {spec[key]!r}"
    theirs = h.get("spaces")
    for key in ("observation", "action") if theirs is not None else ():
        if theirs.get(key) != spaces[key]:
            return f"{key} space: actor has {theirs.get(key)}, learner has {spaces[key]}"
    return ""
