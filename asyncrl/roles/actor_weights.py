"""An actor's weights: the broadcaster's snapshots and published versions of this session's learner,
kept in the lag controls' ``WeightHistory``, and the version they pick loaded into the policy copy.

The broadcaster pings its subscribers with the version it holds every second (``weights_version``); an
actor whose queue dropped that version asks for a snapshot, naming the version it holds (the
broadcaster answers with its weights unless it holds that very version, then with a version ping).

A version above its learner's own (a forged weights message of the session's epoch, e.g. from a
hostile relay) would make every real version look stale to the actor, and the learner would refuse
each of its slots for good. The actor heals on the learner's word only (the learner is
authenticated, a weights source may not be): when the learner refuses one of its slots for a
behaviour version above the learner's (``slot_refused``, naming both), the versions held from the
refused one up are dropped, and the actor asks the broadcaster for its newest. A source that keeps
forging costs the actor a slot per forgery (docs/faults.md): it is the actor's weights source, and
what it sends is trusted as the learner's weights are.

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
    refetch = False  # versions were dropped (rewind): ask the broadcaster for its newest
    rewinds = 0  # times versions were dropped on the learner's slot_refused, all sessions

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
                self._receive(frames)
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
        broadcaster for its newest (at most every SNAPSHOT_ASK_S for a ping, and after a rewind)."""
        pending = sockets.drain_all(self.weights_sub)
        announced = -1  # the newest version of this session's epoch that a ping named
        for frames in pending:
            if len(frames) == 2:  # [b"version", header]
                announced = max(announced, self._announced(frames))
            else:
                self._receive(frames)
        if not catch_up:
            return
        if self.refetch and (time.monotonic() >= self.next_ask or self.history.newest < 0):
            self.fetch_after_rewind()
        elif len(pending) >= max(2, self.weights_sub.rcvhwm // 2):
            self.ask_snapshot()
            self.read_snapshots(1000)
        elif announced > self.history.newest and time.monotonic() >= self.next_ask:
            self.next_ask = time.monotonic() + SNAPSHOT_ASK_S
            self.ask_snapshot()
            self.read_snapshots(1000)

    def fetch_after_rewind(self) -> None:
        """Ask the broadcaster for its newest weights after a rewind (it answers with its weights
        unless it holds the version named); wait for weights when the rewind left none (returns
        without any only when the learner stopped the run)."""
        self.next_ask = time.monotonic() + SNAPSHOT_ASK_S
        self.refetch = False
        self.ask_snapshot()
        self.read_snapshots(1000)
        if self.history.newest < 0:
            self.first_weights()

    def slot_refused(self, header: dict) -> None:
        """The learner refused a slot of this actor (``slot_refused``) for its behaviour version
        (``behavior_version``) above the learner's own (``version``): the versions held from the
        refused one up cannot be the learner's (forged) and are dropped; a real version newer than
        the refusal that arrived meanwhile is below the forged one and stays. Then the broadcaster's
        newest is asked for at the next receive_weights."""
        forged, learner = header["behavior_version"], header["version"]
        if self.history is None or forged <= learner:
            return  # not a version above the learner's: nothing of ours to drop
        newest = self.history.newest
        dropped = self.history.drop_above(forged - 1)
        if not dropped:
            return
        self.rewinds += 1
        self.refetch = True
        if self.rewinds <= 3 or self.rewinds % 100 == 0:  # a source that keeps forging: a line per 100
            log.warning(
                "actor %s: the learner (version %d) refused a slot acted with version %d: dropped the %d "
                "versions held from %d up to %d (forged by the weights source?) and asks the broadcaster for "
                "its newest (%d such drops so far)",
                self.opts.actor_id,
                learner,
                forged,
                dropped,
                forged,
                newest,
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

    def _receive(self, frames) -> None:
        """Keep a weights message of this session's learner (its run id and epoch); one that does
        not decode, or of another element type or size than the policy copy takes, is counted and
        logged, never fatal; another epoch's is dropped."""
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
