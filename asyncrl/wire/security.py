"""CURVE keys and the rule for when a socket uses them (ZeroMQ CURVE: encryption and authentication).

The rule, the same on both ends: a socket whose address is not loopback (``0.0.0.0`` included)
uses CURVE; loopback, ``ipc://`` and ``inproc://`` sockets do not. ``--insecure`` turns CURVE off
everywhere (with a warning). A role that needs keys it was not given stops with one line.

Key directories, as ``asyncrl keys generate DIR --clients N`` writes them (ZeroMQ certificate
files: ``*.key`` holds a public key, ``*.key_secret`` a key pair)::

    DIR/server/               the learner host: --keys DIR/server for the learner and broadcaster
        server.key            the server's public key
        server.key_secret     the server's key pair (secret)
        client.key(_secret)   the learner's own client key pair (it connects to the broadcaster)
        allowed/              public keys accepted: learner.key, client-1.key, ..., client-N.key
    DIR/client-K/             one per actor host: --keys DIR/client-K for its actors and relay
        server.key            the server's public key (the client checks it: no impostor server)
        client.key(_secret)   this host's client key pair (secret)

Servers read ``server.key_secret`` and ``allowed/*.key`` (at start: restart to add or revoke a
client); clients read ``server.key`` and ``client.key_secret``. Only sockets.py creates
sockets; this module hands it keys (``Curve``) and runs the ZAP authenticator that accepts only
the allowed client keys and logs every refusal. Which addresses are loopback: ``addresses.py``;
the secret that signs weights on loopback: ``weights_secret.py``.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from asyncrl.wire.addresses import is_loopback
from asyncrl.wire.handshake import HandshakeWatch
from asyncrl.wire.protocol import ProtocolError
from asyncrl.wire.rejects import RejectCounter

log = logging.getLogger("asyncrl.wire.security")

SERVER_DIR, ALLOWED_DIR = "server", "allowed"
SERVER_PUBLIC, SERVER_SECRET = "server.key", "server.key_secret"
CLIENT_PUBLIC, CLIENT_SECRET = "client.key", "client.key_secret"
LEARNER_CLIENT = "learner"


class SecurityError(RuntimeError):
    """Keys missing, unreadable or unusable for what a role was asked to do; the message names
    the role, the address and the file."""


@dataclass(frozen=True)
class Curve:
    """CURVE keys of one socket, z85-encoded (40 bytes each). ``server_key`` None: this socket
    is the CURVE server; else it is a client that only talks to the server holding that key."""

    public: bytes
    secret: bytes
    server_key: bytes | None = None


# ---------------------------------------------------------------------------------- key files


def _make_pair(directory: Path, name: str) -> None:
    public, secret = zmq.auth.create_certificates(directory, name)
    os.chmod(secret, 0o600)
    os.chmod(public, 0o644)


def generate(root: str | Path, clients: int) -> list[Path]:
    """Create (or complete) the key directory layout above under ``root``; returns the
    directories created. Existing keys are never overwritten: run it again with a larger
    ``clients`` to add client directories. Raises ValueError if clients < 1; OSError if ``root``
    cannot be written."""
    if clients < 1:
        raise ValueError(f"clients must be >= 1, got {clients}")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    server, allowed = root / SERVER_DIR, root / SERVER_DIR / ALLOWED_DIR
    created = []
    if not (server / SERVER_SECRET).exists():
        allowed.mkdir(parents=True, exist_ok=True)
        os.chmod(server, 0o700)
        _make_pair(server, "server")
        _make_pair(server, "client")
        shutil.copyfile(server / CLIENT_PUBLIC, allowed / f"{LEARNER_CLIENT}.key")
        created.append(server)
    for k in range(1, clients + 1):
        d = root / f"client-{k}"
        if (d / CLIENT_SECRET).exists():
            continue
        d.mkdir(exist_ok=True)
        os.chmod(d, 0o700)
        _make_pair(d, "client")
        shutil.copyfile(server / SERVER_PUBLIC, d / SERVER_PUBLIC)
        shutil.copyfile(d / CLIENT_PUBLIC, allowed / f"client-{k}.key")
        created.append(d)
    return created


def _load(path: Path, *, secret: bool, why: str) -> tuple[bytes, bytes | None]:
    try:
        public, secret_key = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise SecurityError(f"{why}: cannot read {path} ({exc})") from None
    if secret and not secret_key:
        raise SecurityError(f"{why}: {path} holds no secret key")
    return public, secret_key


def load_allowed(directory: Path, *, why: str) -> frozenset[bytes]:
    """Public keys (z85) of every ``*.key`` in ``directory``. Raises SecurityError if it is
    missing or holds none."""
    try:
        keys = frozenset(zmq.auth.load_certificates(directory))
    except (OSError, ValueError) as exc:
        raise SecurityError(f"{why}: cannot read allowed client keys in {directory} ({exc})") from None
    if not keys:
        raise SecurityError(f"{why}: no client public keys (*.key) in {directory}")
    return keys


# ---------------------------------------------------------------------------------- policy


class Security:
    """What one role was given (``--keys DIR``, ``--insecure``) and the keys each socket gets.

    ``server(ctx, endpoint)`` and ``client(endpoint)`` return a ``Curve`` for a non-loopback
    address (None for loopback or when insecure) and raise SecurityError when the keys it needs
    are missing. The first server socket of a context starts the ZAP authenticator there;
    ``close()`` stops it (before ``ctx.term()``, which would otherwise wait for it forever).
    """

    def __init__(self, role: str, keys: str | Path | None = None, *, insecure: bool = False):
        self.role, self.keys, self.insecure = role, Path(keys) if keys else None, insecure
        self.refused = RejectCounter(role, log, what="refused connection")  # by reason and address
        self._auth: list[ThreadAuthenticator] = []
        self._server: Curve | None = None
        self._allowed: frozenset[bytes] = frozenset()
        if insecure:
            log.warning(
                "%s: --insecure: CURVE is off; traffic to and from other hosts is neither "
                "encrypted nor authenticated, and anyone who reaches its ports can join",
                role,
            )

    def _need(self, what: str, endpoint: str) -> Path:
        if self.keys is None:
            raise SecurityError(
                f"{self.role}: {endpoint} is reachable from other hosts, so CURVE is on: give "
                f"--keys DIR with {what} (see `asyncrl keys generate`), or --insecure"
            )
        return self.keys

    def server(self, ctx: zmq.Context, endpoint: str) -> Curve | None:
        """Keys for a socket that binds ``endpoint`` (server.key_secret, allowed/*.key)."""
        if self.insecure or is_loopback(endpoint):
            return None
        if self._server is None:
            d = self._need(f"{SERVER_SECRET} and {ALLOWED_DIR}/", endpoint)
            why = f"{self.role}: binding {endpoint}"
            public, secret = _load(d / SERVER_SECRET, secret=True, why=why)
            self._allowed = load_allowed(d / ALLOWED_DIR, why=why)
            self._server = Curve(public, secret)
            log.info("%s: CURVE on; %d client keys accepted (%s)", self.role, len(self._allowed), d / ALLOWED_DIR)
        if not any(a.context is ctx for a in self._auth):
            self._auth.append(_start_authenticator(ctx, self._allowed, self))
        return self._server

    @property
    def learner_key(self) -> str | None:
        """The learner's client public key (z85, from allowed/learner.key) once a server socket
        has CURVE keys; a broadcaster takes weights from that client only. None otherwise."""
        if self._server is None or self.keys is None:
            return None
        try:
            return _load(self.keys / ALLOWED_DIR / f"{LEARNER_CLIENT}.key", secret=False, why=self.role)[0].decode()
        except SecurityError:
            return None

    def client(self, endpoint: str) -> Curve | None:
        """Keys for a socket that connects to ``endpoint`` (client.key_secret, server.key)."""
        if self.insecure or is_loopback(endpoint):
            return None
        d = self._need(f"{CLIENT_SECRET} and {SERVER_PUBLIC}", endpoint)
        why = f"{self.role}: connecting to {endpoint}"
        public, secret = _load(d / CLIENT_SECRET, secret=True, why=why)
        server_key, _ = _load(d / SERVER_PUBLIC, secret=False, why=why)
        return Curve(public, secret, server_key)

    def note_refusals(self, watch: HandshakeWatch) -> None:
        """Count and log (rate-limited) the failed handshakes on a server socket. Refused keys are
        already logged, with the peer's address and key, by the authenticator."""
        for f in watch.failures():
            if f.reason != "auth":
                self.refused.reject(
                    ProtocolError(f.reason, f"handshake on {f.endpoint} failed: {f.detail}"), f.endpoint
                )

    def describe(self, endpoint: str) -> str:
        """ "CURVE" or "no encryption (...)" for a socket at ``endpoint``, for start-up lines."""
        if self.insecure:
            return "no encryption (--insecure)"
        return "no encryption (loopback)" if is_loopback(endpoint) else "CURVE"

    def close(self) -> None:
        """Stop the authenticators; idempotent."""
        while self._auth:
            self._auth.pop().stop()


class _Authenticator(ThreadAuthenticator):
    """pyzmq's ZAP handler, remembering the peer address of the request it is deciding on so a
    refusal can name it (RFC 27: frame 3 of a ZAP request is the peer's IP address)."""

    address = "?"

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        if len(msg) > 3:
            self.address = msg[3].decode("utf-8", "backslashreplace") or "?"
        await super().handle_zap_message(msg)


class _AllowedKeys:
    """ZAP credentials provider: accept a client key only if it is in ``allowed``; log refusals
    (1st, 2nd, 4th, ... per address and key: a refused client reconnects ten times a second)."""

    def __init__(self, allowed: frozenset[bytes], security: Security, auth: _Authenticator):
        self.allowed, self.security, self.auth = allowed, security, auth

    def callback(self, domain: str, key: bytes) -> bool:
        if key in self.allowed:
            return True
        self.security.refused.reject(
            ProtocolError(
                "unknown_client_key",
                f"CURVE client key {key.decode('ascii', 'replace')} is not among the allowed keys; connection refused",
            ),
            self.auth.address,
        )
        return False


def _start_authenticator(ctx: zmq.Context, allowed: frozenset[bytes], security: Security) -> ThreadAuthenticator:
    auth = _Authenticator(ctx, log=logging.getLogger("asyncrl.wire.security.zap"))
    auth.start()
    auth.configure_curve_callback("*", _AllowedKeys(allowed, security, auth))
    return auth
