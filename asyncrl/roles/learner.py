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

import torch

from .. import transport as tp
from ..transport import snapshot_endpoint
from ..config import Config, EnvConfig
from ..security import Security, advertised_with_source, endpoint_host, is_loopback, read_weights_secret
from ..consume import Consumer, SlotData, SlotError, check_slot, own_rows
from ..shm import SlotLedger, SlotRing, check_space, cleanup_stale, segment_nbytes
from ..tasks import make_task

log = logging.getLogger("asyncrl.learner")

# Actor messages that a learner which does not know the sender answers with "rejoin".
_SESSION_TYPES = ("request", "ready", "rollout", "heartbeat")
# Seconds without a publish after which the learner publishes its current weights again (cheap):
# a broadcaster that lost them (restarted) must not wait for an iteration that waits for it.
REPUBLISH_S = 2.0


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
    route: bytes = b""                     # its DEALER identity: where replies go
    token: bytes = b""                     # its per-actor token: every message must carry it
    pending: int = 0                       # grants asked for and not yet given
    mode: str = "shm"
    meta: dict = field(default_factory=dict)


class Learner:
    write_error: OSError | None = None     # the run-directory failure that ended the run, if one did

    def __init__(self, cfg: Config, run_dir: str | Path, *, run_id: str, bind: str, broadcaster: str,
                 echo=print, security: Security | None = None, advertise: str | None = None,
                 resume: bool = False, epoch: int | None = None):
        """``security``: the keys and CURVE rule for its sockets (default: loopback only, no keys);
        ``advertise``: the address actors on other hosts use, when not the bound one; ``resume``:
        go on from the run directory's newest checkpoint (asyncrl.consume.Consumer); ``epoch``:
        this learner's epoch (default: ``learner_epoch()``, newer at every start, resumed or not).

        Raises SecurityError (keys missing for a non-loopback address), transport.AddressError
        (address in use, not of this host), ShmError, EnvError."""
        self.cfg, self.run_dir, self.run_id, self.echo = cfg, Path(run_dir), run_id, echo
        self.security, self.advertise, self.broadcaster = security or Security("learner"), advertise, broadcaster
        self.epoch = learner_epoch() if epoch is None else int(epoch)
        # Sockets first: a refused key or a busy port must not leave a shared-memory segment behind.
        self.ctx = tp.context()
        try:
            weights_ep = snapshot_endpoint(broadcaster)
            self.router = tp.router(self.ctx, bind, security=self.security.server(self.ctx, bind))
            self.weights_curve = self.security.client(weights_ep)
            # immediate: nothing queued for a broadcaster not there (signed with a secret it may not
            # hold any more); it gets the weights when it (re)connects, see check_connections
            self.weights_out = tp.dealer(self.ctx, weights_ep, tp.route_identity(f"learner-{run_id}"),
                                         security=self.weights_curve, immediate=True)
        except BaseException:
            self.security.close()
            self.ctx.destroy(linger=0)
            raise
        self.endpoint = tp.endpoint_of(self.router)
        self.actor_watch, self.broadcaster_watch = tp.handshakes(self.router), tp.handshakes(self.weights_out)
        self.next_check = 0.0
        self.broadcaster_handshakes = 0          # seen so far: a new one means a (re)connected broadcaster
        self.last_publish = 0.0
        self.warned_unsigned = False
        self.run_dir.mkdir(parents=True, exist_ok=True)
        torch.set_num_threads(cfg.learner.torch_threads)
        self.task = make_task(cfg)
        self.spec = self.task.spec
        self.spaces = self.task.spaces
        self.wire_limits = tp.report_limits(self.spec.num_envs, self.spec.rollout_length)   # reports of E*T episodes
        # /dev/shm too small: one line before any file of the run exists (it can be rerun in the same directory)
        check_space(segment_nbytes(self.spec, cfg.learner.num_slots), self.spec, cfg.learner.num_slots)
        self.consumer = Consumer(cfg, self.spec, self.run_dir, resume=resume, task=self.task)
        self.state = self.consumer.state
        for name in cleanup_stale():
            log.warning("learner: removed shared-memory segment %s left by a dead run", name)
        self.ring = SlotRing.create(run_id=run_id, spec=self.spec, num_slots=cfg.learner.num_slots)
        self.ledger = SlotLedger(cfg.learner.num_slots)
        self.actors: dict[str, ActorInfo] = {}
        self.full_meta: dict[int, tuple[str, dict]] = {}
        self.copied: list[SlotData] = []         # slots copied out of the ring, not yet trained on
        self.rejects = tp.RejectCounter("learner")
        self.timing: Counter[str] = Counter()   # seconds: where the time goes
        self.rollouts_by_transport: Counter[str] = Counter()   # "shm" / "tcp"
        self.publish()

    # ---- weights ----
    def publish(self) -> None:
        """Send the current weights to the broadcaster (publish time: the Consumer's record),
        signed with the secret the broadcaster wrote on this host (security.read_weights_secret;
        read at each publish, so a restarted broadcaster's new secret is used at once)."""
        now = self.consumer.lag.publish_time[self.state.version]
        frames = tp.encode_weights(run_id=self.run_id, epoch=self.epoch, version=self.state.version,
                                   publish_time=now, layout_hash=self.state.layout_hash,
                                   payload=self.state.flat_weights())
        self.last_publish = time.monotonic()
        secret = read_weights_secret(self.broadcaster)
        if secret is None and self.weights_curve is None:    # it would refuse them
            if not self.warned_unsigned:
                self.warned_unsigned = True
                log.warning("learner: no weights secret of the broadcaster at %s on this host (not started yet, or "
                            "run by another user); weights are held back until there is one", self.broadcaster)
            return
        tp.send(self.weights_out, tp.sign_weights(frames, secret), block=False)

    # ---- messages ----
    def serve(self, timeout_ms: int) -> None:
        frames = tp.recv_multipart_timeout(self.router, timeout_ms, copy=False)
        while frames is not None:
            self.handle(frames)
            frames = tp.recv_multipart_timeout(self.router, 0, copy=False)
        self.reap_silent_actors()
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
            raise LearnerError(f"learner: the broadcaster at {snapshot_endpoint(self.broadcaster)} refused the "
                               f"connection: {bad.detail}")
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
                raise tp.ProtocolError("bad_token", f"{kind} for actor {header['actor_id']!r} from another "
                                                    f"connection or without its token")
            actor.last_seen = time.monotonic()
            if kind == "request":
                actor.pending += 1
            elif kind in ("ready", "rollout"):
                self.on_report(header["actor_id"], header, arrays)
                actor.pending += 1            # every report of a slot it held asks for the next one
            elif kind == "bye":
                self.forget(header["actor_id"], "said bye")
            elif kind == "heartbeat":             # answered, so an actor can tell a dead learner
                self.reply(identity, {"type": "heartbeat", "actor_id": header["actor_id"], "token": actor.token})
            else:
                raise tp.ProtocolError("unexpected_type", kind)
        except tp.ProtocolError as exc:
            self.rejects.reject(exc, sender)
            raw = tp.peek(frames[1]) if exc.reason == "proto" and len(frames) > 1 else {}
            if raw.get("type") == "hello":    # tell an actor of another version why it gets nothing
                reason = tp.printable(f"proto: actor has protocol {raw.get('proto')!r}, learner has "
                                      f"{tp.PROTOCOL_VERSION}", 1000)
                log.warning("learner: refused actor %s: %s", tp.printable(sender), reason)
                self.reply(identity, {"type": "refuse", "reason": reason})

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
        mismatch = tp.printable(self.mismatch(h), 1000)   # it quotes the actor's values: keep it sendable
        if mismatch:
            log.warning("learner: refused actor %s from %s: %s", tp.printable(actor_id), tp.printable(h["host"]),
                        mismatch)
            self.reply(identity, {"type": "refuse", "reason": mismatch})
            return
        old = self.actors.get(actor_id)
        if old is not None and old.route == identity:
            return                             # a repeated hello from the same connection
        proved = old is not None and h["token"] is not None and hmac.compare_digest(h["token"], old.token)
        if old is not None and not proved and _gone_here(old):   # it died on this host (e.g. restarted by asyncrl run)
            self.forget(actor_id, f"its process {old.pid} is gone")
            old = None
        if old is not None and not proved and time.monotonic() - old.last_seen < self.cfg.transport.actor_timeout_s:
            reason = tp.printable(f"actor_id: {actor_id!r} is in use by pid {old.pid} on {old.host}; pick another "
                                  f"--actor-id", 1000)
            log.warning("learner: refused a second actor %s from %s: %s", tp.printable(actor_id),
                        tp.printable(h["host"]), reason)
            self.reply(identity, {"type": "refuse", "reason": reason})
            return
        if old is not None:
            self.forget(actor_id, "came back with its token" if proved else "restarted")
        self.state.reward_scaler.reset(actor_id)   # a new incarnation: its envs start afresh
        restart = self.state.actor_joins.get(actor_id, 0)    # a seed input: a rejoin draws new streams
        self.state.actor_joins[actor_id] = restart + 1
        token = old.token if proved else secrets.token_bytes(16)
        self.actors[actor_id] = ActorInfo(h["host"], h["pid"], time.monotonic(), route=identity, token=token)
        log.info("learner: actor %s joined from %s (pid %d)%s", tp.printable(actor_id), tp.printable(h["host"]), h["pid"],
                 f", restart {restart}" if restart else "")
        self.reply(identity, {"type": "welcome", "shm_name": self.ring.name, "num_slots": self.cfg.learner.num_slots,
                              "spec": self.spec.to_dict(), "token": self.ring.token,
                              "config": json.dumps(self.cfg.to_dict()), "restart": restart,
                              "epoch": self.epoch, "actor_token": token})

    def mismatch(self, h: dict) -> str:
        """'' if the actor's run id (when it names one), env, rollout shape and spaces match this
        run; else one line naming the field."""
        return handshake_mismatch(h, run_id=self.run_id, env_id=self.task.id, spec=self.spec.to_dict(),
                                  spaces=self.spaces)

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
            raise tp.ProtocolError("stale_grant", f"{h['type']} for slot {slot} grant {h['grant_id']} "
                                                  f"not held by {actor_id}")
        try:
            if h["type"] == "rollout":
                received = tp.decode_rollout_frames(arrays, self.spec)
                self.validate_slot(received, h["grant_id"])
                views = self.ring.views(slot)
                for name, a in received.items():
                    views[name][...] = a
                del views
                self.actors[actor_id].mode = "tcp"
                self.rollouts_by_transport["tcp"] += 1
            else:
                self.rollouts_by_transport["shm"] += 1
                self.validate_slot(self.ring.views(slot), h["grant_id"])
        except tp.ProtocolError:
            if self.ledger.void(actor_id, slot, h["grant_id"]):
                self.ring.disarm(slot)
            self.actors[actor_id].pending += 1     # the grant it held is void: it may ask again
            self.state.reward_scaler.reset(actor_id)   # the stream has a gap now
            raise
        self.ledger.complete(actor_id, slot, h["grant_id"])
        self.full_meta[slot] = (actor_id, {"host": self.actors[actor_id].host, "env_steps": h["env_steps"],
                                           "episode_returns": h["episode_returns"], "grant_id": h["grant_id"]})
        for key in ("env_s", "inference_s", "wait_s"):
            value = h["timing"].get(key, 0.0)
            if isinstance(value, (int, float)):
                self.timing["actors_" + key] += float(value)

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
            self.ring.disarm(s)                    # the old writer must stop writing these
        self.actors.pop(actor_id, None)
        log.info("learner: actor %s left (%s); %d granted slots freed", tp.printable(actor_id), why, len(freed))

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
            self.actors[actor_id] = info
            self.ring.arm(g.slot, g.grant_id)      # before the actor can know of the grant
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
                    raise SlotError("revoked_writer", f"slot {s} of grant {meta['grant_id']} was written into by a "
                                                      f"writer whose grant had been revoked")
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
            self.grant_pending()               # actors go on while the learner learns
        if len(self.copied) < B:
            return False
        batch, self.copied = self.copied[:B], self.copied[B:]
        trained = self.consumer.consume(batch) is not None
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
        if is_loopback(b):                  # same host as the learner: other hosts use the learner's name
            b = f"tcp://{endpoint_host(adv)}:{b.rsplit(':', 1)[1]}"
        env, default = self.cfg.env, EnvConfig()
        flags = [f"--env {env.id}"] + ([f"--env-module {env.module}"] if env.module else [])
        if env.num_envs != default.num_envs:
            flags.append(f"--num-envs {env.num_envs}")
        for key in ("rollout_length", "max_episode_steps"):
            if getattr(env, key) != getattr(default, key):
                flags.append(f"--set env.{key}={getattr(env, key)}")
        flags.append("--insecure" if self.security.insecure else "--keys KEYS/client-K")
        self.echo(f"learner: run {self.run_id}, actors connect to {adv} ({security}), address from {source}; "
                  f"on each actor host run:\n"
                  f"  asyncrl actor --learner {adv} --broadcaster {b} {' '.join(flags)} "
                  f"--run-id {self.run_id} --actor-id NAME")

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
        why = {"finished": "step budget reached", "interrupted": "the learner was interrupted",
               "failed": "the learner failed"}.get(outcome, outcome)
        for info in list(self.actors.values()):
            self.reply(info.route, {"type": "stop", "reason": why})
        self.timing["learner_update_s"] = self.consumer.update_s
        return self.consumer.finish(outcome=outcome, failed_role="learner" if outcome == "failed" else None,
                                    reason=reason, mode="async", run_id=self.run_id,
                                    rejected_messages=self.rejects.by_reason(),
                                    time_breakdown_s=dict(self.timing), slot_counters=dict(self.ledger.counters),
                                    refused_connections=self.security.refused.by_reason(), learner_epoch=self.epoch,
                                    rollouts_by_transport=dict(self.rollouts_by_transport))

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
            log.log(logging.DEBUG if same else logging.ERROR,
                    "learner: could not write the summary of the failed run: %s", inner)

    def close(self) -> None:
        """Idempotent; always removes the shared-memory segment."""
        try:
            try:
                self.consumer.close()
            except OSError as exc:   # disk full at its last rows: what was written stays readable
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
    if actor.host != socket.gethostname():
        return False
    try:
        os.kill(actor.pid, 0)
    except ProcessLookupError:
        return True
    except OSError:   # it exists (another user's): not ours to judge
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
