"""Broadcaster role: republishes the learner's newest weights to every actor.

Sockets: PUB on ``bind`` (actors SUB and keep only the newest message) and a ROUTER on port + 1
that takes weights from the learner and answers ``snapshot`` requests from joining actors, since
PUB/SUB drops whatever was published before a subscriber connected.

A relay (``upstream``: another broadcaster's PUB address) takes its weights from that broadcaster
instead (SUB, plus a snapshot request until it has a first version) and republishes every newer
version on its own sockets, so weights cross the network once per host, not once per actor.
"""
from __future__ import annotations

import logging
import os
import socket
import time

from .. import transport as tp
from ..transport import snapshot_endpoint
from ..security import Security, advertised_with_source, is_loopback

log = logging.getLogger("asyncrl.broadcaster")


class BroadcasterError(RuntimeError):
    """The broadcaster cannot go on (a relay whose upstream refuses its connection)."""


class Broadcaster:
    def __init__(self, bind: str, *, upstream: str | None = None, security: Security | None = None,
                 advertise: str | None = None, echo=print):
        """Raises SecurityError (keys missing for a non-loopback address), transport.AddressError
        (address in use, not of this host)."""
        self.security, self.upstream, self.advertise, self.echo = \
            security or Security("broadcaster"), upstream, advertise, echo
        self.ctx = tp.context()
        try:
            self.pub = tp.pub(self.ctx, bind, security=self.security.server(self.ctx, bind))
            self.endpoint = tp.endpoint_of(self.pub)
            request_ep = snapshot_endpoint(self.endpoint)
            self.router = tp.router(self.ctx, request_ep, security=self.security.server(self.ctx, request_ep))
            self.watches = [tp.handshakes(self.pub), tp.handshakes(self.router)]
            self.up_watches: list[tuple[str, tp.HandshakeWatch]] = []
            if upstream:
                up_request = snapshot_endpoint(upstream)
                self.up_sub = tp.sub(self.ctx, upstream, security=self.security.client(upstream))
                self.up_req = tp.dealer(self.ctx, up_request, f"relay-{socket.gethostname()}-{os.getpid()}",
                                        security=self.security.client(up_request))
                self.up_watches = [(upstream, tp.handshakes(self.up_sub)),
                                   (up_request, tp.handshakes(self.up_req))]
        except BaseException:
            self.security.close()
            self.ctx.destroy(linger=0)
            raise
        self.latest = None                   # frames [topic, header, payload] of the newest weights
        self.version, self.run_id = -1, None
        # With CURVE, weights come from the learner's key only: an actor host's key must not be
        # able to hand every actor weights of its own.
        self.learner_key = self.security.learner_key
        self.rejects = tp.RejectCounter("broadcaster")
        self.published = 0
        self.next_check = self.next_ask = 0.0

    def take(self, frames) -> bool:
        """Publish a weights message if it is newer than the last one, or of another run (a new
        learner restarts at version 0). Raises ProtocolError for an invalid message."""
        header, _ = tp.decode_weights(frames)
        if header["run_id"] == self.run_id and header["version"] <= self.version:
            return False
        if self.run_id is not None and header["run_id"] != self.run_id:
            log.info("broadcaster: weights of run %s replace those of run %s", tp.printable(header["run_id"]),
                     tp.printable(self.run_id))
        self.latest = [bytes(f) for f in frames]
        self.version, self.run_id = header["version"], header["run_id"]
        tp.send(self.pub, self.latest, block=False)
        self.published += 1
        return True

    def handle(self, frames) -> None:
        identity, body = frames[0], frames[1:]
        sender = bytes(identity).decode(errors="replace")
        try:
            if len(body) == 3 and bytes(body[0]) == tp.WEIGHTS_TOPIC:
                if self.upstream:
                    raise tp.ProtocolError("unexpected_type", "weights sent to a relay (it takes them from "
                                                              f"{self.upstream} only)")
                if self.learner_key is not None and tp.user_id(body[0]) != self.learner_key:
                    raise tp.ProtocolError("not_learner", f"weights from client key {tp.user_id(body[0])}, "
                                                          "not the learner's (allowed/learner.key)")
                self.take(body)
                return
            header, _ = tp.decode(body)
            if header["type"] != "snapshot":
                raise tp.ProtocolError("unexpected_type", header["type"])
            if self.latest is not None:
                tp.send(self.router, [identity, *self.latest], block=False)
            else:
                tp.send(self.router, [identity, *tp.encode({"type": "refuse", "run_id": header["run_id"],
                                                            "reason": "no weights yet"})], block=False)
        except tp.ProtocolError as exc:
            self.rejects.reject(exc, sender)

    def serve(self, timeout_ms: int = 200) -> None:
        socks = [self.router, self.up_sub, self.up_req] if self.upstream else [self.router]
        ready = tp.poll(socks, timeout_ms)
        frames = tp.recv_multipart_timeout(self.router, 0, copy=False) if self.router in ready else None
        while frames is not None:
            self.handle(frames)
            frames = tp.recv_multipart_timeout(self.router, 0, copy=False)
        if self.upstream:
            self.relay()
        self.check_connections()

    def relay(self) -> None:
        """Take every version pending from upstream, in order (the actors' lag controls may want
        older ones); ask upstream for a snapshot every second until there is a first version."""
        replies = [f for f in tp.drain_all(self.up_req) if len(f) == 3]   # others: "no weights yet"
        for frames in replies + tp.drain_all(self.up_sub):
            try:
                self.take(frames)
            except tp.ProtocolError as exc:
                self.rejects.reject(exc, self.upstream)
        now = time.monotonic()
        if self.latest is None and now >= self.next_ask:
            self.next_ask = now + 1.0
            tp.send(self.up_req, tp.encode({"type": "snapshot", "run_id": "", "actor_id": "relay"}), block=False)

    def check_connections(self) -> None:
        """Log refused connections; raise BroadcasterError if upstream refuses this relay. At most
        every 0.25 s."""
        now = time.monotonic()
        if now < self.next_check:
            return
        self.next_check = now + 0.25
        for watch in self.watches:
            self.security.note_refusals(watch)
        for endpoint, watch in self.up_watches:
            bad = watch.fatal()
            if bad is not None:
                raise BroadcasterError(f"broadcaster: the upstream broadcaster at {endpoint} refused the "
                                       f"connection: {bad.detail}")

    def announce(self) -> None:
        """Where actors (and relays) connect; the exact commands for a non-loopback address."""
        adv, source = advertised_with_source(self.endpoint, self.advertise)
        security = self.security.describe(self.endpoint)
        if self.upstream:
            self.echo(f"broadcaster: relaying weights from {self.upstream}; actors on this host use "
                      f"--broadcaster {adv} ({security}), address from {source}")
        elif not is_loopback(self.endpoint):
            keys = "--insecure" if self.security.insecure else "--keys KEYS/client-K"
            self.echo(f"broadcaster: actors use --broadcaster {adv} ({security}), address from {source}; "
                      f"a relay on each actor host:\n"
                      f"  asyncrl broadcaster --upstream {adv} --bind tcp://127.0.0.1:{adv.rsplit(':', 1)[1]} {keys}")

    def run(self, stop_after_s: float | None = None) -> None:
        deadline = None if stop_after_s is None else time.monotonic() + stop_after_s
        log.info("broadcaster: PUB %s, requests %s%s", self.endpoint, snapshot_endpoint(self.endpoint),
                 f", upstream {self.upstream}" if self.upstream else "")
        self.announce()
        while deadline is None or time.monotonic() < deadline:
            self.serve()

    def close(self) -> None:
        tp.close(self.pub, self.router, *((self.up_sub, self.up_req) if self.upstream else ()))
        self.security.close()
        self.ctx.term()
