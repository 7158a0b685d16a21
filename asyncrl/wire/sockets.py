"""ZeroMQ sockets: the factories of every socket the roles use (``router``, ``dealer``, ``pub``,
``sub``, ``push``, ``pull``) with their options, bind/connect, send and receive without blocking
forever, draining and polling, and closing. Only this module creates sockets; each one's handshakes
are watched (``handshakes``, ``handshake.HandshakeWatch``).
"""

from __future__ import annotations

import secrets
import weakref
from collections.abc import Iterable, Sequence

import zmq

from asyncrl.wire.handshake import HandshakeWatch
from asyncrl.wire.protocol import VERSION_TOPIC, WEIGHTS_TOPIC

DEFAULT_TIMEOUT_MS = 5000


class AddressError(OSError):
    """An endpoint that cannot be bound or connected to; the message names it and says why."""


# One place for socket options: LINGER 0 (close never hangs), bounded queues (HWM, in
# messages), and send/recv timeouts so no call blocks forever.


def context() -> zmq.Context:
    """A new ZeroMQ context; ``ctx.destroy(linger=0)`` closes it with all its sockets."""
    return zmq.Context()


def _socket(ctx: zmq.Context, kind: int, hwm: int, timeout_ms: int, security=None) -> zmq.Socket:
    """A socket with the options above; its handshakes are watched (``handshakes``) from before
    it binds or connects, since ZeroMQ does not retry after some failures."""
    sock = ctx.socket(kind)
    _WATCHES[sock] = HandshakeWatch(sock)
    sock.linger = 0
    sock.sndhwm = sock.rcvhwm = hwm
    sock.sndtimeo = sock.rcvtimeo = timeout_ms
    if security is not None:  # a security.Curve; must be set before bind/connect
        if security.server_key is None:
            sock.curve_server = True
        else:
            sock.curve_serverkey = security.server_key
        sock.curve_publickey, sock.curve_secretkey = security.public, security.secret
    return sock


def bind(sock: zmq.Socket, endpoint: str) -> str:
    """Bind; returns the endpoint actually bound ("tcp://host:0" or ":*" picks a free port)."""
    if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
        endpoint = endpoint[:-1] + "*"
    sock.bind(endpoint)
    return endpoint_of(sock)


def endpoint_of(sock: zmq.Socket) -> str:
    """The last endpoint ``sock`` bound, with the real port."""
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


def _bind_or_connect(sock: zmq.Socket, bind_to: str | None, connect: str | None) -> zmq.Socket:
    try:
        if (bind_to is None) == (connect is None):
            raise ValueError("give exactly one of bind= and connect=")
        if bind_to is not None:
            bind(sock, bind_to)
        else:
            sock.connect(connect)
    except (ValueError, zmq.ZMQError) as exc:  # leave no socket open behind
        close(sock)
        if isinstance(exc, zmq.ZMQError):
            raise AddressError(f"cannot {'bind' if bind_to else 'connect to'} {bind_to or connect}: {exc}") from None
        raise
    return sock


def router(
    ctx: zmq.Context,
    bind: str,
    *,
    hwm: int = 1000,
    max_message_bytes: int = -1,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
    security=None,
) -> zmq.Socket:
    """Learner side of the actor channel. Received frames: [identity, header, *arrays].
    ROUTER_HANDOVER on: a connection under an identity in use takes the route over, and the old
    connection's queued messages are read and freed. Without it libzmq 4.3.5 leaves the new
    connection's pipe unattached: it buffers up to ``hwm`` messages that are never read nor freed,
    even after the connection closes, so a peer past the handshake could grow a role's memory by
    ``hwm`` messages per connection without bound (docs/multi-host.md, trust model). A live peer's
    route cannot be guessed: ``route_identity`` holds 128 random bits and no role sends a route to
    another peer; the learner still checks every message's token against the route that said hello.

    ``security`` (every factory here): a ``security.Curve`` (CURVE server or client keys) or None
    for no encryption. Raises AddressError if the address cannot be bound (in use, not an
    address of this host) or is malformed. ``max_message_bytes`` (ZMQ_MAXMSGSIZE, set before the
    bind: ZeroMQ copies the options into the listener there): a peer that sends a larger frame is
    disconnected before the frame is buffered; -1: no limit."""
    sock = _socket(ctx, zmq.ROUTER, hwm, timeout_ms, security)
    sock.router_handover = 1
    sock.setsockopt(zmq.MAXMSGSIZE, int(max_message_bytes))
    return _bind_or_connect(sock, bind, None)


def max_message_size(sock: zmq.Socket) -> int:
    """The socket's ZMQ_MAXMSGSIZE (-1: no limit)."""
    return sock.getsockopt(zmq.MAXMSGSIZE)


def route_identity(name: str) -> str:
    """A DEALER identity for one process: ``name`` (cut to 200 characters) plus 128 random bits
    (32 hex digits), so no other peer can guess it and take its route over (``router`` hands a
    route to its newest connection), and a restarted process never collides with its old route.
    At most 233 bytes: ZMTP carries an identity of up to 255."""
    return f"{name[:200]}#{secrets.token_hex(16)}"


def dealer(
    ctx: zmq.Context,
    connect: str,
    identity: str | bytes,
    *,
    hwm: int = 1000,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
    security=None,
    immediate: bool = False,
    max_message_bytes: int = -1,
) -> zmq.Socket:
    """Actor side of the actor channel; ``identity`` (1..255 bytes) is how the learner routes.
    ``immediate``: queue messages only while connected (ZMQ_IMMEDIATE), none for a peer to come.
    ``max_message_bytes``: ZMQ_MAXMSGSIZE (bytes per received frame; -1: no limit), as ``router``."""
    sock = _socket(ctx, zmq.DEALER, hwm, timeout_ms, security)
    sock.setsockopt(zmq.MAXMSGSIZE, int(max_message_bytes))
    sock.identity = identity.encode() if isinstance(identity, str) else identity
    sock.immediate = int(immediate)
    return _bind_or_connect(sock, None, connect)


# ZMQ_MAXMSGSIZE of a PUB socket: it receives subscriptions only (1 + topic bytes), but the limit also
# applies to the handshake's commands (CURVE's INITIATE: about 300 bytes with its metadata)
MAX_SUBSCRIPTION_BYTES = 4096


def pub(
    ctx: zmq.Context, bind: str, *, hwm: int = 8, timeout_ms: int = DEFAULT_TIMEOUT_MS, security=None
) -> zmq.Socket:
    """Broadcaster's weights publisher. A small HWM: only the newest weights matter. It receives
    only subscription frames (1 + topic bytes) after the handshake: a frame larger than
    MAX_SUBSCRIPTION_BYTES (ZMQ_MAXMSGSIZE) disconnects its peer."""
    sock = _socket(ctx, zmq.PUB, hwm, timeout_ms, security)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_SUBSCRIPTION_BYTES)
    return _bind_or_connect(sock, bind, None)


def sub(
    ctx: zmq.Context,
    connect: str,
    *,
    topics: tuple[bytes, ...] = (WEIGHTS_TOPIC, VERSION_TOPIC),
    hwm: int = 8,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
    security=None,
    max_message_bytes: int = -1,
) -> zmq.Socket:
    """Actor's weights subscriber (weights and version pings); read it with ``drain_all``.
    ``max_message_bytes``: ZMQ_MAXMSGSIZE (bytes per received frame; -1: no limit), as ``router``."""
    sock = _socket(ctx, zmq.SUB, hwm, timeout_ms, security)
    sock.setsockopt(zmq.MAXMSGSIZE, int(max_message_bytes))
    for topic in topics:
        sock.subscribe(topic)
    return _bind_or_connect(sock, None, connect)


# Bytes of weights messages a subscriber's queue may hold (ZeroMQ's high-water marks count messages): a
# reader that stalls keeps at most this many bytes of old versions alive on each side of the connection.
WEIGHTS_QUEUE_BYTES = 1 << 30


def weights_hwm(weights_bytes: int) -> int:
    """The high-water mark (messages) of the sockets that queue weights messages of ``weights_bytes``
    (the broadcaster's PUB, an actor's or a relay's SUB): WEIGHTS_QUEUE_BYTES of them, between 2 (a
    version ping and one weights message) and 8 (small policies: the lag controls keep every version)."""
    return max(2, min(8, WEIGHTS_QUEUE_BYTES // max(int(weights_bytes), 1)))


def push(
    ctx: zmq.Context,
    *,
    bind: str | None = None,
    connect: str | None = None,
    hwm: int = 8,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
    security=None,
) -> zmq.Socket:
    """PUSH end of a pipeline (learner -> broadcaster weights); exactly one of bind/connect."""
    return _bind_or_connect(_socket(ctx, zmq.PUSH, hwm, timeout_ms, security), bind, connect)


def pull(
    ctx: zmq.Context,
    *,
    bind: str | None = None,
    connect: str | None = None,
    hwm: int = 8,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
    security=None,
) -> zmq.Socket:
    """PULL end of a pipeline; exactly one of bind/connect."""
    return _bind_or_connect(_socket(ctx, zmq.PULL, hwm, timeout_ms, security), bind, connect)


def send(sock: zmq.Socket, frames: Sequence, *, block: bool = True, copy: bool = True) -> bool:
    """Send a multipart message. Returns False instead of raising when it would block
    (block=False) or its send timeout expires (HWM reached, no peer).

    copy=False hands large array buffers to ZeroMQ without copying; ZeroMQ reads them after
    this returns, so only use it for arrays nobody modifies afterwards (not a reused rollout
    buffer).
    """
    try:
        sock.send_multipart(frames, flags=0 if block else zmq.NOBLOCK, copy=copy)
    except zmq.Again:
        return False
    return True


def recv_multipart_timeout(sock: zmq.Socket, timeout_ms: int, *, copy: bool = True) -> list | None:
    """The next multipart message, or None if none arrives within ``timeout_ms``.

    copy=False returns zmq.Frame objects (buffer protocol; no copy of large arrays), which
    every decode function here accepts; ROUTER identities then need ``frames[0].bytes``.
    """
    if not sock.poll(timeout_ms, zmq.POLLIN):
        return None
    try:
        return sock.recv_multipart(zmq.NOBLOCK, copy=copy)
    except zmq.Again:  # another reader took it
        return None


def held(frames: Sequence) -> list:
    """Frames safe to keep and send again: a received zmq.Frame as it is (immutable; sending it shares
    its buffer, no copy), anything else (a caller's buffer) copied to bytes."""
    return [f if isinstance(f, zmq.Frame) else bytes(f) for f in frames]


def user_id(frame) -> str | None:
    """The CURVE public key (z85) the authenticator vouched for as the sender of a received
    zmq.Frame, or None (no CURVE, or not a zmq.Frame)."""
    try:
        return frame.get("User-Id")
    except (AttributeError, zmq.ZMQError):
        return None


def drain_all(sock: zmq.Socket, *, max_messages: int = 10_000) -> list[list]:
    """Every message pending on ``sock`` (oldest first) without blocking; lists of zmq.Frame."""
    out = []
    for _ in range(max_messages):
        try:
            out.append(sock.recv_multipart(zmq.NOBLOCK, copy=False))
        except zmq.Again:
            break
    return out


def drain_latest(sock: zmq.Socket, *, max_messages: int = 10_000) -> list | None:
    """Read every message pending on ``sock`` without blocking; return only the newest complete
    multipart message (a list of zmq.Frame), or None if none was pending.

    Done by hand because ZMQ_CONFLATE breaks multipart messages. ZeroMQ delivers a message's
    frames atomically, so once the first frame is there the rest are too. Stops after
    ``max_messages`` so a flooding publisher cannot keep it looping.
    """
    latest = None
    for _ in range(max_messages):
        try:
            latest = sock.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            break
    return latest


_WATCHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # socket -> HandshakeWatch


def poll(socks: Iterable[zmq.Socket], timeout_ms: int) -> set[zmq.Socket]:
    """The sockets among ``socks`` with a message to read, waiting at most ``timeout_ms``."""
    poller = zmq.Poller()
    for s in socks:
        poller.register(s, zmq.POLLIN)
    return {s for s, _ in poller.poll(timeout_ms)}


def handshakes(sock: zmq.Socket) -> HandshakeWatch:
    """The HandshakeWatch of a socket made by this module. Raises KeyError for any other."""
    return _WATCHES[sock]


def close(*socks: zmq.Socket) -> None:
    """Close sockets at once, dropping unsent messages (linger 0), and their handshake monitors."""
    for s in socks:
        watch = _WATCHES.pop(s, None)
        if watch is not None:
            watch.close()
        s.close(linger=0)
