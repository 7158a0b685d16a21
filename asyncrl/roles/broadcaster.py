"""Broadcaster role: republishes the learner's newest weights to every actor.

Sockets: PUB on ``bind`` (actors SUB and keep only the newest message) and a ROUTER on port + 1
that takes weights from the learner and answers ``snapshot`` requests from joining actors, since
PUB/SUB drops whatever was published before a subscriber connected.

Unchanged weights are never sent again. While the learner has no new version it sends a signed version
ping (``weights_version``: 129 bytes with its HMAC) every 2 s instead of its weights; the broadcaster
answers ``weights_status``: whether it wants them (it holds an older version, or none: restarted) and
the largest payload it takes. Every second it pings its PUB subscribers with the version it holds, so an
actor whose queue dropped the newest weights asks for them; a snapshot request that names the version
the asker holds already is answered by a version ping, not the weights.

A relay (``upstream``: another broadcaster's PUB address) takes its weights from that broadcaster
instead (SUB, plus a snapshot request until it has a first version) and republishes every newer
version on its own sockets, so weights cross the network once per host, not once per actor.

Only the learner's weights are taken: with CURVE, from the learner's client key; else signed with
the secret this broadcaster writes at start (weights_secret.create_weights_secret). Newer means a higher
(learner epoch, version), so a restarted learner (a higher epoch) replaces the old one's weights.
Rejects are counted by reason in ``--summary FILE`` (JSON, rewritten every 2 s and at exit).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from pathlib import Path

from asyncrl.core.metrics import write_json_atomic
from asyncrl.wire import codec, handshake, protocol, rejects, sockets
from asyncrl.wire.addresses import advertised_with_source, is_loopback, snapshot_endpoint
from asyncrl.wire.security import Security
from asyncrl.wire.weights_secret import create_weights_secret, remove_weights_secret

log = logging.getLogger("asyncrl.broadcaster")
ROUTER_HWM = 4  # messages queued per connection on the request ROUTER, each way (weights:
# only the newest matter; an actor has one snapshot request out at a time)
SNAPSHOT_INTERVAL_S = protocol.SNAPSHOT_INTERVAL_S  # one snapshot reply per connection per this many seconds
MAX_SNAPSHOT_PEERS = 4096  # connections remembered for that rate limit
MAX_MESSAGES_PER_SERVE = 256  # serve() returns after this many (a flood cannot keep it from relaying)
STALE_EPOCH_S = 10.0  # a learner pings every 2 s while idle: silent this long, its epoch gives way to any
VERSION_PING_S = 1.0  # seconds between the version pings on PUB while weights are held
# The largest weights payload a broadcaster takes when not told the run's (``max_weights_bytes``):
# 1 GiB, 268M float32 parameters (the tiny llm model and every control policy are far smaller).
DEFAULT_MAX_WEIGHTS_BYTES = 1 << 30


def weights_frame_limit(weights_bytes: int) -> int:
    """ZMQ_MAXMSGSIZE (bytes per frame) of the sockets that receive weights of ``weights_bytes``
    (a weights message's largest frame is its payload; its header, like a snapshot request, is at
    most protocol.MAX_HEADER_BYTES)."""
    return max(int(weights_bytes), protocol.MAX_HEADER_BYTES)


class BroadcasterError(RuntimeError):
    """The broadcaster cannot go on (a relay whose upstream refuses its connection)."""


class Broadcaster:
    def __init__(
        self,
        bind: str,
        *,
        upstream: str | None = None,
        security: Security | None = None,
        advertise: str | None = None,
        echo=print,
        summary: str | Path | None = None,
        max_weights_bytes: int | None = None,
    ):
        """``summary``: a JSON file for this role's counts (rejects by reason, refused connections,
        weights published). ``max_weights_bytes``: the run's weights payload (parameters x bytes per
        element of the wire dtype, ``Task.weights_info().nbytes``; default DEFAULT_MAX_WEIGHTS_BYTES): every
        socket that takes weights refuses a larger frame (ZMQ_MAXMSGSIZE, ``weights_frame_limit``; its
        peer is disconnected before the frame is buffered), the learner is told it (``weights_status``),
        the queues of weights messages are sized by it (``sockets.weights_hwm``), and the PUB socket
        takes subscription frames only. Raises SecurityError (keys missing
        for a non-loopback address, an unsafe secret directory), sockets.AddressError (address in
        use, not of this host)."""
        self.security, self.upstream, self.advertise, self.echo = (
            security or Security("broadcaster"),
            upstream,
            advertise,
            echo,
        )
        self.summary_path = Path(summary) if summary else None
        self.secret_file, self.secret = None, None
        self.max_weights_bytes = DEFAULT_MAX_WEIGHTS_BYTES if max_weights_bytes is None else int(max_weights_bytes)
        frame_limit = weights_frame_limit(self.max_weights_bytes)
        self.queue = sockets.weights_hwm(self.max_weights_bytes)  # weights messages per subscriber queue
        self.ctx = sockets.context()
        try:
            self.pub = sockets.pub(self.ctx, bind, hwm=self.queue, security=self.security.server(self.ctx, bind))
            self.endpoint = sockets.endpoint_of(self.pub)
            if not upstream:  # before the socket that takes weights exists
                self.secret_file, self.secret = create_weights_secret(self.endpoint)
            request_ep = snapshot_endpoint(self.endpoint)
            # a short queue per connection: it takes weights (the learner) and snapshot requests, one at a time
            self.router = sockets.router(
                self.ctx,
                request_ep,
                hwm=ROUTER_HWM,
                max_message_bytes=frame_limit,
                security=self.security.server(self.ctx, request_ep),
            )
            self.watches = [sockets.handshakes(self.pub), sockets.handshakes(self.router)]
            self.up_watches: list[tuple[str, handshake.HandshakeWatch]] = []
            if upstream:
                up_request = snapshot_endpoint(upstream)
                self.up_sub = sockets.sub(
                    self.ctx,
                    upstream,
                    hwm=self.queue,
                    security=self.security.client(upstream),
                    max_message_bytes=frame_limit,
                )
                self.up_req = sockets.dealer(
                    self.ctx,
                    up_request,
                    sockets.route_identity(f"relay-{socket.gethostname()}-{os.getpid()}"),
                    security=self.security.client(up_request),
                    hwm=ROUTER_HWM,
                    max_message_bytes=frame_limit,
                )
                self.up_watches = [
                    (upstream, sockets.handshakes(self.up_sub)),
                    (up_request, sockets.handshakes(self.up_req)),
                ]
        except BaseException:
            if self.secret_file is not None:
                remove_weights_secret(self.secret_file, self.secret)
            self.security.close()
            self.ctx.destroy(linger=0)
            raise
        self.latest = None  # frames [topic, header, payload] of the newest weights (held: shared, not copied)
        self.newest, self.run_id = (-1, -1), None  # (learner epoch, version) of self.latest
        self.epoch_heard = 0.0  # monotonic time of the last weights of the held epoch
        # With CURVE, weights come from the learner's key only: an actor host's key must not be
        # able to hand every actor weights of its own.
        self.learner_key = self.security.learner_key
        self.rejects = rejects.RejectCounter("broadcaster")
        self.published = 0
        # messages that spared a payload: version pings on PUB, learner pings answered, snapshot requests of
        # peers that held the newest already
        self.pings = {"pub": 0, "learner": 0, "snapshot_current": 0}
        self.next_check = self.next_ask = self.next_ping = 0.0
        self.next_summary, self.summary_written = 0.0, None
        self.last_snapshot: dict[bytes, float] = {}  # connection -> monotonic time of its last snapshot reply

    @property
    def version(self) -> int:
        return self.newest[1]

    def newer(self, key: tuple[int, int], now: float) -> bool:
        """Whether weights of ``key`` = (learner epoch, version), from the learner, replace the held
        ones: a higher key (a restarted learner has a higher epoch and starts again at version 0,
        whatever its run id), or another epoch while the held epoch's learner has been silent for
        STALE_EPOCH_S (a learner started after the wall clock went back has a lower epoch). Hearing
        of the held epoch marks its learner alive."""
        if key[0] == self.newest[0]:
            self.epoch_heard = now  # the learner of the held epoch is alive (it pings)
        if key > self.newest:
            return True
        if key[0] == self.newest[0] or now - self.epoch_heard <= STALE_EPOCH_S:
            return False
        # a lower epoch, from the learner (only its messages get here), while the learner of the held
        # epoch is silent: a new learner started after the wall clock stepped back
        log.warning(
            "broadcaster: learner epoch %d is silent for %.0f s; taking epoch %d (a lower one: the clock went back)",
            self.newest[0],
            now - self.epoch_heard,
            key[0],
        )
        return True

    def take(self, frames) -> bool:
        """Publish a weights message if it is newer (:meth:`newer`) than the held one. Only for
        weights known to come from the learner. Raises ProtocolError for an invalid message."""
        header, _ = codec.decode_weights(frames)
        key, now = (header["epoch"], header["version"]), time.monotonic()
        if not self.newer(key, now):
            return False
        if key[0] != self.newest[0] and self.run_id is not None:
            log.info(
                "broadcaster: weights of learner epoch %d (run %s) replace those of epoch %d (run %s)",
                key[0],
                rejects.printable(header["run_id"]),
                self.newest[0],
                rejects.printable(self.run_id),
            )
        self.latest = sockets.held(frames)
        self.newest, self.run_id, self.epoch_heard = key, header["run_id"], now
        sockets.send(self.pub, self.latest, block=False, copy=False)
        self.published += 1
        self.next_ping = now + VERSION_PING_S  # the weights just sent say the version
        return True

    def learner_ping(self, identity, header: dict) -> None:
        """Answer the learner's version ping (its signature checked by the caller): ``weights_status``,
        wanted when the held weights are older than the ping's (or none), and this broadcaster's
        largest payload."""
        self.pings["learner"] += 1
        wanted = self.newer((header["epoch"], header["version"]), time.monotonic())
        status = {"type": "weights_status", "run_id": header["run_id"], "wanted": wanted}
        status["max_bytes"] = self.max_weights_bytes
        sockets.send(self.router, [identity, *codec.encode(status)], block=False)

    def handle(self, frames) -> None:
        identity, body = frames[0], frames[1:]
        sender = bytes(identity).decode(errors="replace")
        try:
            topic = bytes(body[0]) if len(body) in (2, 3, 4) else b""
            if topic == protocol.WEIGHTS_TOPIC:
                self.check_learner(body, "weights")
                self.take(body[:3] if self.learner_key is not None else codec.verify_weights(body, self.secret))
                return
            if topic == protocol.VERSION_TOPIC:
                self.check_learner(body, "a version ping")
                frames = body[:2] if self.learner_key is not None else codec.verify_version(body, self.secret)
                self.learner_ping(identity, codec.decode_version(frames))
                return
            header, _ = codec.decode(body)
            if header["type"] != "snapshot":
                raise protocol.ProtocolError("unexpected_type", header["type"])
            self.answer_snapshot(identity, header)
        except protocol.ProtocolError as exc:
            self.rejects.reject(exc, sender)
        except Exception as exc:  # noqa: BLE001 - peer input must never end the broadcaster: counted, logged
            self.rejects.reject(protocol.ProtocolError(f"handler_error:{type(exc).__name__}", f"{exc!r}"[:300]), sender)
            if self.rejects.budget.allow()[0]:
                log.warning(
                    "broadcaster: a message from %s raised in its handler", rejects.printable(sender), exc_info=True
                )

    def check_learner(self, body, what: str) -> None:
        """Raise ProtocolError unless this broadcaster takes ``what`` from this sender: not a relay
        (it takes weights from upstream only), and with CURVE, the learner's client key (without
        CURVE the caller checks the HMAC)."""
        if self.upstream:
            raise protocol.ProtocolError(
                "unexpected_type", f"{what} sent to a relay (it takes weights from {self.upstream} only)"
            )
        if self.learner_key is not None and sockets.user_id(body[0]) != self.learner_key:
            # CURVE: the authenticator vouches for the key
            raise protocol.ProtocolError(
                "not_learner",
                f"{what} from client key {sockets.user_id(body[0])}, not the learner's (allowed/learner.key)",
            )

    def answer_snapshot(self, identity, header: dict) -> None:
        """Send the newest weights (zero-copy: every reply shares the one buffer of ``self.latest``),
        a version ping if the request names the version held (the asker has the newest), or "no
        weights yet" to ``identity``, at most once per SNAPSHOT_INTERVAL_S per connection (an actor
        asks every 0.5 s while it waits); more often is refused ("snapshot_rate")."""
        key, now = bytes(identity), time.monotonic()
        if now - self.last_snapshot.get(key, -math.inf) < SNAPSHOT_INTERVAL_S:
            raise protocol.ProtocolError("snapshot_rate", f"more than one snapshot request per {SNAPSHOT_INTERVAL_S} s")
        if len(self.last_snapshot) >= MAX_SNAPSHOT_PEERS:  # forget peers not heard of for a while
            self.last_snapshot = {k: t for k, t in self.last_snapshot.items() if now - t < SNAPSHOT_INTERVAL_S}
        self.last_snapshot[key] = now
        if self.latest is not None and (header.get("epoch"), header.get("version")) == self.newest:
            self.pings["snapshot_current"] += 1
            sockets.send(self.router, [identity, self.version_ping()[1]], block=False)
        elif self.latest is not None:
            sockets.send(self.router, [identity, *self.latest], block=False, copy=False)
        else:
            sockets.send(
                self.router,
                [identity, *codec.encode({"type": "refuse", "run_id": header["run_id"], "reason": "no weights yet"})],
                block=False,
            )

    def serve(self, timeout_ms: int = 200) -> None:
        socks = [self.router, self.up_sub, self.up_req] if self.upstream else [self.router]
        ready = sockets.poll(socks, timeout_ms)
        for _ in range(MAX_MESSAGES_PER_SERVE if self.router in ready else 0):
            frames = sockets.recv_multipart_timeout(self.router, 0, copy=False)
            if frames is None:
                break
            self.handle(frames)
        if self.upstream:
            self.relay()
        self.ping_subscribers()
        self.check_connections()
        self.write_summary()

    def version_ping(self) -> list[bytes]:
        """The version ping of the held weights (their epoch, version and payload bytes)."""
        nbytes = len(self.latest[2])
        return codec.encode_version(run_id=self.run_id, epoch=self.newest[0], version=self.newest[1], nbytes=nbytes)

    def ping_subscribers(self) -> None:
        """Every VERSION_PING_S while weights are held, the held (epoch, version) on PUB: a
        subscriber whose queue dropped the newest weights learns that it lacks them."""
        now = time.monotonic()
        if self.latest is None or now < self.next_ping:
            return
        self.next_ping = now + VERSION_PING_S
        sockets.send(self.pub, self.version_ping(), block=False)
        self.pings["pub"] += 1

    def counts(self) -> dict:
        """What ``--summary`` holds: role, address, weights taken, newest (epoch, version),
        ``version_pings`` (messages that spared a payload: pings on PUB, learner pings answered,
        snapshot requests of peers that held the newest), ``rejected_messages`` and
        ``refused_connections`` by reason."""
        return {
            "role": "relay" if self.upstream else "broadcaster",
            "endpoint": self.endpoint,
            "upstream": self.upstream,
            "published": self.published,
            "version_pings": dict(self.pings),
            "run_id": self.run_id,
            "epoch": self.newest[0],
            "version": self.newest[1],
            "rejected_messages": self.rejects.by_reason(),
            "refused_connections": self.security.refused.by_reason(),
        }

    def write_summary(self, *, force: bool = False) -> None:
        """Rewrite the summary file when its counts changed, at most every 2 s (or now, with
        ``force``); a failed write is logged, never raised."""
        now = time.monotonic()
        if self.summary_path is None or (not force and now < self.next_summary):
            return
        self.next_summary = now + 2.0
        counts = self.counts()
        if counts == self.summary_written:
            return
        try:
            write_json_atomic(self.summary_path, counts)
            self.summary_written = counts
        except OSError as exc:
            log.warning("broadcaster: could not write %s: %s", self.summary_path, exc)

    def relay(self) -> None:
        """Take every version pending from upstream, in order (the actors' lag controls may want
        older ones); ask upstream for a snapshot every second until there is a first version, and
        when upstream's version ping names a newer one than this relay holds (its queue dropped it)."""
        replies, announced, largest = [], (-1, -1), 0  # the newest (epoch, version) and payload pings named
        for frames in sockets.drain_all(self.up_req, max_messages=MAX_MESSAGES_PER_SERVE):
            if len(frames) == 3:
                replies.append(frames)
                continue
            try:  # else a "no weights yet" refusal, or a version ping: this relay has the newest
                codec.decode(frames)
            except protocol.ProtocolError as exc:
                self.rejects.reject(exc, self.upstream)
        for frames in replies + sockets.drain_all(self.up_sub, max_messages=MAX_MESSAGES_PER_SERVE):
            try:
                if len(frames) == 2:  # upstream's version ping: ask for what it holds and this relay lacks
                    header = codec.decode_version(frames)
                    announced = max(announced, (header["epoch"], header["version"]))
                    largest = max(largest, header["nbytes"])
                    continue
                self.take(frames)
            except protocol.ProtocolError as exc:
                self.rejects.reject(exc, self.upstream)
            except Exception as exc:  # noqa: BLE001 - upstream input must never end a relay: counted, logged
                self.rejects.reject(
                    protocol.ProtocolError(f"handler_error:{type(exc).__name__}", f"{exc!r}"[:300]), self.upstream
                )
        self.check_size(largest)
        now = time.monotonic()
        if (self.latest is None or announced > self.newest) and now >= self.next_ask:
            self.next_ask = now + 1.0
            have = {"epoch": self.newest[0], "version": self.newest[1]} if self.latest is not None else {}
            request = {"type": "snapshot", "run_id": "", "actor_id": "relay", **have}
            sockets.send(self.up_req, codec.encode(request), block=False)

    def check_size(self, nbytes: int) -> None:
        """Raise BroadcasterError if upstream's weights (``nbytes``, from its version ping) are larger
        than this relay takes: its sockets would drop every version, and its actors would wait for ever."""
        if nbytes > self.max_weights_bytes:
            raise BroadcasterError(
                f"relay: the weights of {self.upstream} are {nbytes / (1 << 20):.2f} MiB, over this relay's "
                f"{self.max_weights_bytes / (1 << 20):.2f} MiB; start it with --max-weights-mb "
                f"{math.ceil(nbytes * 100 / (1 << 20)) / 100:.2f} or more"
            )

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
                raise BroadcasterError(
                    f"broadcaster: the upstream broadcaster at {endpoint} refused the connection: {bad.detail}"
                )

    def announce(self) -> None:
        """Where actors (and relays) connect; the exact commands for a non-loopback address."""
        if self.endpoint.startswith("ipc://"):
            adv, source = self.endpoint, "the bound address"
        else:
            adv, source = advertised_with_source(self.endpoint, self.advertise)
        security = self.security.describe(self.endpoint)
        if self.upstream:
            self.echo(
                f"broadcaster: relaying weights from {self.upstream}; actors on this host use "
                f"--broadcaster {adv} ({security}), address from {source}"
            )
        elif not is_loopback(self.endpoint):
            keys = "--insecure" if self.security.insecure else "--keys KEYS/client-K"
            # the relay's sockets in a directory only its user can enter (a loopback port is open to
            # every local user), as `asyncrl run` puts a one-host run's
            self.echo(
                f"broadcaster: actors use --broadcaster {adv} ({security}), address from {source}; "
                f"a relay on each actor host, its actors then use --broadcaster ipc://$D/weights:\n"
                f"  D=$(mktemp -d) && asyncrl broadcaster --upstream {adv} --bind ipc://$D/weights {keys}"
            )

    def run(self, stop_after_s: float | None = None) -> None:
        deadline = None if stop_after_s is None else time.monotonic() + stop_after_s
        log.info(
            "broadcaster: PUB %s, requests %s%s",
            self.endpoint,
            snapshot_endpoint(self.endpoint),
            f", upstream {self.upstream}" if self.upstream else "",
        )
        self.announce()
        while deadline is None or time.monotonic() < deadline:
            self.serve()

    def close(self) -> None:
        self.write_summary(force=True)
        if self.secret_file is not None:
            remove_weights_secret(self.secret_file, self.secret)
        sockets.close(self.pub, self.router, *((self.up_sub, self.up_req) if self.upstream else ()))
        self.security.close()
        self.ctx.term()
