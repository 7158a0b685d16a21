"""An actor's weights: the broadcaster's snapshots and published versions of this session's learner,
kept in the lag controls' ``WeightHistory``, and the version they pick loaded into the policy copy.

The broadcaster pings its subscribers with the version it holds every second (``weights_version``); an
actor whose queue dropped that version asks for a snapshot, naming the version it holds (the
broadcaster answers with its weights unless it holds that very version, then with a version ping).

A version above its learner's own (a forged weights message of the session's epoch, e.g. from a
hostile relay) would make every real version look stale to the actor, and the learner would refuse
each of its slots for good. The actor heals: when a version ping of its epoch names a version below
its newest (checked with the broadcaster: the snapshot it answers holds its newest, and versions
above it are dropped), or when the learner refuses one of its slots for a behaviour version above
the learner's (``slot_refused``: the versions above the learner's are dropped at once), it takes
the broadcaster's newest again, at most every SNAPSHOT_ASK_S.

``WeightsFromBroadcaster`` holds these methods of ``asyncrl.roles.actor.Actor`` (a base class of it;
they use the attributes ``Actor.__init__`` sets and ``LearnerSession``'s heartbeat and polling).
"""

from __future__ import annotations

import logging
import time

from asyncrl.core import exit_status
from asyncrl.roles.actor_session import ActorError
from asyncrl.wire import codec, protocol, sockets

log = logging.getLogger("asyncrl.actor")
SNAPSHOT_ASK_S = 1.0  # seconds between the snapshot requests a version ping makes (a hostile ping cannot flood)
# the least time between any two snapshot requests: the broadcaster's rate with a margin for the
# requests' transit, so an honest actor is never refused ("snapshot_rate")
SNAPSHOT_GAP_S = 1.5 * protocol.SNAPSHOT_INTERVAL_S


class WeightsFromBroadcaster:
    """The actor's side of the broadcaster (a base class of ``Actor``)."""

    next_ask = 0.0  # monotonic time before which a version ping asks for no snapshot
    last_ask = -float("inf")  # monotonic time of the last snapshot request
    recheck = False  # versions were dropped, or may be forged: take the broadcaster's newest (check_newest)
    checking = False  # a snapshot read now tells the broadcaster's newest: versions above it are dropped
    rewinds = 0  # times versions above the broadcaster's or the learner's were dropped, all sessions

    def ask_snapshot(self) -> None:
        """Ask the broadcaster for its newest weights, naming the version held (if any): it
        answers with a version ping when that is the newest. Waits first (at most SNAPSHOT_GAP_S)
        when the previous request was more recent than that: the broadcaster refuses requests
        closer than protocol.SNAPSHOT_INTERVAL_S (e.g. the first weights' request, then at once a
        version ping's, as every run's start used to show)."""
        wait = self.last_ask + SNAPSHOT_GAP_S - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        self.last_ask = time.monotonic()
        header = {
            "type": "snapshot",
            "proto": protocol.PROTOCOL_VERSION,
            "run_id": self.run_id,
            "actor_id": self.opts.actor_id,
        }
        if self.history is not None and self.history.newest >= 0:
            header.update(epoch=self.epoch, version=self.history.newest)
        sockets.send(self.snapshot, codec.encode(header), block=False)

    def read_snapshots(self, timeout_ms: int) -> bool:
        """Take the broadcaster's snapshot replies that come within ``timeout_ms`` (and any
        pending after the first that holds weights); True once one held weights (an older "no
        weights yet" refusal may come first) or said that this actor has the newest."""
        got = False
        frames = sockets.recv_multipart_timeout(self.snapshot, timeout_ms)
        while frames is not None:
            if len(frames) == 3:  # [topic, header, payload]
                self._receive(frames, newest=self.checking)
                got = True
            else:
                try:  # else a refusal ("no weights yet"), or a version ping: the newest is held already
                    reply, _ = codec.decode(frames)
                    got = got or reply["type"] == "weights_version"
                except protocol.ProtocolError as exc:
                    self.rejects.reject(exc, "broadcaster")
            frames = sockets.recv_multipart_timeout(self.snapshot, 0 if got else timeout_ms)
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
        queue is full; ZeroMQ hands over about HWM - 1), or a version ping named a newer version of
        this session's learner than the newest held (its weights were dropped), also ask the
        broadcaster for its newest (at most every SNAPSHOT_ASK_S for a ping); if a ping named an
        older version than the newest held, or versions were dropped (``recheck``), check_newest."""
        pending = sockets.drain_all(self.weights_sub)
        announced = -1  # the newest version of this session's epoch that a ping named
        for frames in pending:
            if len(frames) == 2:  # [b"version", header]
                pinged = self._announced(frames)
                announced = max(announced, pinged)
                # in order on PUB, the broadcaster's ping never names less than the weights it sent
                # before; a snapshot may have brought newer ones (check_newest tells)
                self.recheck = self.recheck or 0 <= pinged < self.history.newest
            else:
                self._receive(frames)
        if not catch_up:
            return
        if self.recheck and (time.monotonic() >= self.next_ask or self.history.newest < 0):
            self.check_newest()
        elif len(pending) >= max(2, self.weights_sub.rcvhwm // 2):
            self.ask_snapshot()
            self.read_snapshots(1000)
        elif announced > self.history.newest and time.monotonic() >= self.next_ask:
            self.next_ask = time.monotonic() + SNAPSHOT_ASK_S
            self.ask_snapshot()
            self.read_snapshots(1000)

    def check_newest(self) -> None:
        """Take the broadcaster's newest weights, dropping the versions held above them (a forged
        version): ask for a snapshot naming the newest held; the broadcaster answers with its own
        weights unless it holds that very version. Waits for weights when none are left."""
        self.next_ask = time.monotonic() + SNAPSHOT_ASK_S
        self.recheck, self.checking = False, True
        try:
            self.ask_snapshot()
            self.read_snapshots(1000)
        finally:
            self.checking = False
        if self.history.newest < 0:  # the learner's refusal dropped every version held
            self.first_weights()

    def slot_refused(self, header: dict) -> None:
        """The learner refused a slot of this actor for its behaviour version (``slot_refused``,
        naming the learner's version): versions held above the learner's cannot be its (forged);
        they are dropped, and the broadcaster's newest is taken at the next receive_weights."""
        if self.history is not None and header["version"] < self.history.newest:
            self.rewind(header["version"], f"the learner's version is {header['version']}")

    def rewind(self, version: int, why: str) -> None:
        """Drop the weight versions held above ``version`` (logged, counted in ``rewinds``)."""
        newest = self.history.newest
        dropped = self.history.drop_above(version)
        if not dropped:
            return
        self.rewinds += 1
        self.recheck = True
        log.warning(
            "actor %s: held weights up to version %d, but %s: dropped the %d versions above it (forged?) "
            "and takes the broadcaster's newest (%d such drops so far)",
            self.opts.actor_id,
            newest,
            why,
            dropped,
            self.rewinds,
        )

    def _announced(self, frames) -> int:
        """The version a ping names if it is of this session's learner (its run id and epoch); -1
        for another's. One that does not decode is counted and logged, never fatal."""
        try:
            header = codec.decode_version(frames, run_id=self.run_id)
        except protocol.ProtocolError as exc:
            self.rejects.reject(exc, "broadcaster")
            return -1
        return header["version"] if header["epoch"] == self.epoch else -1

    def _receive(self, frames, *, newest: bool = False) -> None:
        """Keep a weights message of this session's learner (its run id and epoch); one that does
        not decode, or of another element type or size than the policy copy takes, is counted and
        logged, never fatal; another epoch's is dropped. ``newest``: the broadcaster's answer to
        check_newest, so versions held above it are dropped first."""
        try:
            header, flat = codec.decode_weights(frames, run_id=self.run_id, layout_hash=self.layout_hash)
            if header["dtype"] != self.producer.weights_dtype:
                raise protocol.ProtocolError(
                    "dtype", f"weights of dtype {header['dtype']}, the policy copy takes {self.producer.weights_dtype}"
                )
            if self.num_params and flat.size != self.num_params:
                raise protocol.ProtocolError(
                    "frame_size", f"weights of {flat.size} parameters, the policy has {self.num_params}"
                )
        except protocol.ProtocolError as exc:
            self.rejects.reject(exc, "broadcaster")
            return
        if header["epoch"] == self.epoch:  # another epoch: an old learner's, or a newer one's
            if newest and header["version"] < self.history.newest:
                self.rewind(header["version"], f"the broadcaster's newest is version {header['version']}")
                self.recheck = False  # this is the broadcaster's newest
            if header["version"] > self.history.newest:
                self.versions_received += 1
            self.history.add(header["version"], flat)

    def select_weights(self) -> None:
        """Load the version the lag controls pick (the newest, by default) into the policy copy."""
        version, flat = self.history.choose()
        if version != self.version:
            self.policy.load(flat)
            self.version = version
            self.versions_acted += 1
