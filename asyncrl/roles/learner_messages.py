"""The learner's message handlers: one message from an actor decoded and dispatched (hello,
request, ready / rollout, heartbeat, bye), with the checks every session message passes (run id,
known actor, its connection and token, credit); the hello handshake (``handshake_mismatch``, who
may take an actor id: ``_gone_here``); and the replies sent back.

Methods of :class:`asyncrl.roles.learner.Learner` (mixed in); the state they use is made in its
``__init__``.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import secrets
import socket
import time

from asyncrl.roles.learner_peers import MAX_IDS_PER_CONNECTION, ActorInfo
from asyncrl.wire import codec, protocol, rejects, sockets

log = logging.getLogger("asyncrl.learner")

# Actor messages that a learner which does not know the sender answers with "rejoin".
_SESSION_TYPES = ("request", "ready", "rollout", "heartbeat")


class LearnerMessages:
    """The learner's message handlers (a mixin of Learner)."""

    def handle(self, frames) -> None:
        identity = frames[0].bytes if hasattr(frames[0], "bytes") else bytes(frames[0])
        sender = identity.decode(errors="replace")
        try:
            header, arrays = codec.decode(frames[1:], limits=self.wire_limits)
            kind = header["type"]
            if kind == "hello":
                return self.on_hello(identity, header)
            if header["run_id"] != self.run_id:
                self.ask_rejoin(identity, kind, f"this learner runs {self.run_id}")
                raise protocol.ProtocolError("run_id", f"{kind}: run {header['run_id']!r}, this run is {self.run_id!r}")
            actor = self.actors.get(header.get("actor_id", ""))
            if actor is None:
                self.ask_rejoin(identity, kind, "this learner does not know this actor (restarted, or it dropped it)")
                raise protocol.ProtocolError("unknown_actor", f"{kind} from an actor that did not say hello")
            if identity != actor.route or not hmac.compare_digest(header.get("token", b""), actor.token):
                raise protocol.ProtocolError(
                    "bad_token", f"{kind} for actor {header['actor_id']!r} from another connection or without its token"
                )
            actor.last_seen = time.monotonic()
            if kind == "request":
                if (
                    self.outstanding(actor_id=header["actor_id"]) >= protocol.GRANT_CREDITS
                    or self.outstanding(route=identity) >= protocol.GRANT_CREDITS
                ):
                    raise protocol.ProtocolError(
                        "over_credit",
                        f"request beyond the {protocol.GRANT_CREDITS} outstanding grants "
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
                raise protocol.ProtocolError("unexpected_type", kind)
        except protocol.ProtocolError as exc:
            self.rejects.reject(exc, sender)
            raw = codec.peek(frames[1]) if exc.reason == "proto" and len(frames) > 1 else {}
            if raw.get("type") == "hello":  # tell an actor of another version why it gets nothing
                reason = rejects.printable(
                    f"proto: actor has protocol {raw.get('proto')!r}, learner has {protocol.PROTOCOL_VERSION}", 1000
                )
                self.peer_log(logging.WARNING, "learner: refused actor %s: %s", rejects.printable(sender), reason)
                self.reply(identity, {"type": "refuse", "reason": reason})
        except Exception as exc:  # noqa: BLE001 - peer input must never end the learner: counted, logged, refused
            self.rejects.reject(protocol.ProtocolError(f"handler_error:{type(exc).__name__}", f"{exc!r}"[:300]), sender)
            if self.rejects.budget.allow()[0]:
                log.warning(
                    "learner: a message from %s raised in its handler", rejects.printable(sender), exc_info=True
                )

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
        mismatch = rejects.printable(self.mismatch(h), 1000)  # it quotes the actor's values: keep it sendable
        if mismatch:
            self.peer_log(
                logging.WARNING,
                "learner: refused actor %s from %s: %s",
                rejects.printable(actor_id),
                rejects.printable(h["host"]),
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
            raise protocol.ProtocolError("ids_per_connection", f"hello as {rejects.printable(actor_id, 64)}: {reason}")
        proved = old is not None and h["token"] is not None and hmac.compare_digest(h["token"], old.token)
        if old is not None and not proved and _gone_here(old):  # it died on this host (e.g. restarted by asyncrl run)
            self.forget(actor_id, f"its process {old.pid} is gone")
            old = None
        if old is not None and not proved and time.monotonic() - old.last_seen < self.cfg.transport.actor_timeout_s:
            reason = rejects.printable(
                f"actor_id: {actor_id!r} is in use by pid {old.pid} on {old.host}; pick another --actor-id", 1000
            )
            self.peer_log(
                logging.WARNING,
                "learner: refused a second actor %s from %s: %s",
                rejects.printable(actor_id),
                rejects.printable(h["host"]),
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
            rejects.printable(actor_id),
            rejects.printable(h["host"]),
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
            frames = codec.encode({"run_id": self.run_id, **header})
        except (protocol.ProtocolError, ValueError, TypeError) as exc:
            self.rejects.reject(protocol.ProtocolError("unsendable_reply", f"{header.get('type')}: {exc}"), identity)
            return
        sockets.send(self.router, [identity, *frames], block=False)


def _gone_here(actor: ActorInfo) -> bool:
    """True if ``actor`` said it runs on this host and no process of its pid exists here."""
    if actor.host != socket.gethostname() or not 1 <= actor.pid <= protocol.MAX_PID:  # declared: not trusted as a pid
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
