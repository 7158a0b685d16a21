"""A thin re-export, nothing computed here: the names ``roles/actor.py`` and ``roles/learner.py`` reach
as ``tp.NAME`` (about 110 uses; those modules are being split in parallel). The code lives in
``protocol.py`` (version, schemas, limits, header validation), ``codec.py`` (frames, weights and
their signature), ``rejects.py`` (counting and logging refused input), ``sockets.py`` (ZeroMQ
sockets) and ``addresses.py`` (the snapshot endpoint). New code imports those modules; once the
roles do, this module goes.
"""

from __future__ import annotations

from asyncrl.wire.addresses import snapshot_endpoint
from asyncrl.wire.codec import (
    check_finite,
    decode,
    decode_rollout_frames,
    decode_weights,
    encode,
    encode_rollout,
    encode_weights,
    peek,
    sign_weights,
)
from asyncrl.wire.protocol import (
    GRANT_CREDITS,
    MAX_HEADER_BYTES,
    MAX_PID,
    PROTOCOL_VERSION,
    ProtocolError,
    report_limits,
)
from asyncrl.wire.rejects import LogBudget, RejectCounter, printable
from asyncrl.wire.sockets import (
    close,
    context,
    dealer,
    drain_all,
    endpoint_of,
    handshakes,
    recv_multipart_timeout,
    route_identity,
    router,
    send,
    sub,
)

__all__ = [
    "GRANT_CREDITS",
    "MAX_HEADER_BYTES",
    "MAX_PID",
    "PROTOCOL_VERSION",
    "LogBudget",
    "ProtocolError",
    "RejectCounter",
    "check_finite",
    "close",
    "context",
    "dealer",
    "decode",
    "decode_rollout_frames",
    "decode_weights",
    "drain_all",
    "encode",
    "encode_rollout",
    "encode_weights",
    "endpoint_of",
    "handshakes",
    "peek",
    "printable",
    "recv_multipart_timeout",
    "report_limits",
    "route_identity",
    "router",
    "send",
    "sign_weights",
    "snapshot_endpoint",
    "sub",
]
