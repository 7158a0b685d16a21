"""Broadcaster role: republishes the learner's newest weights to every actor.

Sockets: PUB on ``bind`` (actors SUB and keep only the newest message) and a ROUTER on port + 1
that takes weights from the learner and answers ``snapshot`` requests from joining actors, since
PUB/SUB drops whatever was published before a subscriber connected.
"""
from __future__ import annotations

import logging
import time

from .. import transport as tp
from .actor import snapshot_endpoint

log = logging.getLogger("asyncrl.broadcaster")


class Broadcaster:
    def __init__(self, bind: str):
        self.ctx = tp.context()
        self.pub = tp.pub(self.ctx, bind)
        self.endpoint = tp.endpoint_of(self.pub)
        self.router = tp.router(self.ctx, snapshot_endpoint(self.endpoint))
        self.latest = None                   # frames [topic, header, payload] of the newest weights
        self.version = -1
        self.rejects = tp.RejectCounter("broadcaster")
        self.published = 0

    def handle(self, frames) -> None:
        identity, body = frames[0], frames[1:]
        sender = bytes(identity).decode(errors="replace")
        try:
            if len(body) == 3 and bytes(body[0]) == tp.WEIGHTS_TOPIC:
                header, _ = tp.decode_weights(body)
                if header["version"] > self.version:
                    self.latest, self.version = [bytes(f) for f in body], header["version"]
                    tp.send(self.pub, self.latest, block=False)
                    self.published += 1
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
        frames = tp.recv_multipart_timeout(self.router, timeout_ms, copy=False)
        while frames is not None:
            self.handle(frames)
            frames = tp.recv_multipart_timeout(self.router, 0, copy=False)

    def run(self, stop_after_s: float | None = None) -> None:
        deadline = None if stop_after_s is None else time.monotonic() + stop_after_s
        log.info("broadcaster: PUB %s, requests %s", self.endpoint, snapshot_endpoint(self.endpoint))
        while deadline is None or time.monotonic() < deadline:
            self.serve()

    def close(self) -> None:
        tp.close(self.pub, self.router)
        self.ctx.term()
