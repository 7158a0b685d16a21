"""The outcomes of a socket's CURVE/ZMTP handshakes, read from a ZeroMQ monitor without blocking
(``HandshakeWatch``): which failed, why (``HandshakeFailure``), and when a client should give up."""

from __future__ import annotations

from typing import NamedTuple

import zmq
from zmq.utils.monitor import parse_monitor_message


class HandshakeFailure(NamedTuple):
    reason: str  # "auth", "mechanism_mismatch", "cryptographic", "protocol", "no_detail"
    endpoint: str  # the socket's own address (ZeroMQ reports no peer address here)
    detail: str  # one line for a log or an error message


_HANDSHAKE_DETAIL = {
    "auth": "the server refused the client's CURVE key (not among its allowed keys)",
    "mechanism_mismatch": "one end uses CURVE and the other does not (a role binding a non-loopback "
    "address, 0.0.0.0 included, uses CURVE: connect to it through such an address, "
    "with --keys; or give both ends --insecure)",
    "cryptographic": "CURVE decryption failed: the client holds another server's public key",
    "protocol": "ZMTP protocol error",
    "no_detail": "the peer dropped the connection during the handshake (wrong or missing keys: a "
    "client holding another server's public key, or CURVE on one end only)",
}


class HandshakeWatch:
    """The handshake outcomes of one socket, read from a ZeroMQ monitor without blocking.

    ``failures()`` returns the failed handshakes since the last call; ``succeeded`` counts the
    good ones. ``close()`` before closing the socket."""

    _EVENTS = (
        zmq.EVENT_HANDSHAKE_SUCCEEDED
        | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
        | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
        | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    )

    def __init__(self, sock: zmq.Socket):
        self.sock, self.succeeded, self._failed_in_a_row = sock, 0, 0
        self.monitor = sock.get_monitor_socket(self._EVENTS)
        self.monitor.linger = 0

    def fatal(self, tries: int = 3) -> HandshakeFailure | None:
        """For a client: the failure to give up on, if any: a refused key or CURVE on one end only
        at once (ZeroMQ does not retry after a mechanism mismatch), any other failure once
        ``tries`` handshakes in a row failed (it retries those every 0.1 s)."""
        failed = self.failures()
        refused = [f for f in failed if f.reason in ("auth", "mechanism_mismatch")]
        if refused:
            return refused[0]
        return failed[-1] if failed and self._failed_in_a_row >= tries else None

    def failures(self) -> list[HandshakeFailure]:
        out = []
        for _ in range(1000):
            try:
                event = parse_monitor_message(self.monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                break
            kind, value = event["event"], event["value"]
            if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.succeeded += 1
                self._failed_in_a_row = 0
                continue
            if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                reason = "auth"
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                reason = "no_detail"
            elif value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
                reason = "mechanism_mismatch"
            elif value == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
                reason = "cryptographic"
            else:
                reason = "protocol"
            endpoint = (
                event["endpoint"].decode("utf-8", "replace")
                if isinstance(event["endpoint"], bytes)
                else str(event["endpoint"])
            )
            out.append(HandshakeFailure(reason, endpoint, _HANDSHAKE_DETAIL[reason]))
            self._failed_in_a_row += 1
        return out

    def close(self) -> None:
        """Stop monitoring; idempotent."""
        if not self.monitor.closed:
            if not self.sock.closed:
                self.sock.disable_monitor()
            self.monitor.close(linger=0)
