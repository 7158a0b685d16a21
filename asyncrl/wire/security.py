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
client); clients read ``server.key`` and ``client.key_secret``. Only transport.py creates
sockets; this module hands it keys (``Curve``) and runs the ZAP authenticator that accepts only
the allowed client keys and logs every refusal.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from asyncrl.wire import transport as tp

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


# ---------------------------------------------------------------------------------- addresses


def endpoint_host(endpoint: str) -> str:
    """``tcp://HOST:PORT`` -> HOST (brackets of an IPv6 literal removed). Raises ValueError for an
    endpoint that is not ``tcp://HOST:PORT``, ``ipc://...`` or ``inproc://...``."""
    if endpoint.startswith(("ipc://", "inproc://")):
        return ""
    if not endpoint.startswith("tcp://") or ":" not in endpoint[6:]:
        raise ValueError(f"expected tcp://HOST:PORT, got {endpoint!r}")
    host = endpoint[6:].rsplit(":", 1)[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def is_loopback(endpoint: str) -> bool:
    """True if only this host can reach ``endpoint``: 127.0.0.0/8, ::1, localhost, ipc://,
    inproc://. Wildcards (0.0.0.0, *, ::) and every other name or address are not loopback.
    Raises ValueError as ``endpoint_host``."""
    host = endpoint_host(endpoint)
    if endpoint.startswith(("ipc://", "inproc://")) or host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name or "*": reachable from elsewhere
        return False


_WILDCARDS = ("0.0.0.0", "*", "::", "")


def normalize_endpoint(text: str) -> str:
    """``HOST:PORT`` or ``tcp://HOST:PORT`` -> ``tcp://HOST:PORT`` (ipc:// and inproc:// as they
    are). Raises ValueError for anything else, e.g. a missing port."""
    if text.startswith(("ipc://", "inproc://")):
        return text
    if "://" in text and not text.startswith("tcp://"):
        raise ValueError(f"expected HOST:PORT or tcp://HOST:PORT, got {text!r}")
    full = text if text.startswith("tcp://") else f"tcp://{text}"
    if ":" not in full[6:] or not (full.rsplit(":", 1)[1] == "*" or full.rsplit(":", 1)[1].isdigit()):
        raise ValueError(f"expected HOST:PORT or tcp://HOST:PORT, got {text!r}")
    port = full.rsplit(":", 1)[1]
    if port.isdigit() and int(port) > 65535:
        raise ValueError(f"port {port} in {text!r} is out of range (0-65535)")
    return full


def advertised(bound: str, advertise: str | None = None) -> str:
    """The address other hosts should use for a socket bound at ``bound`` (with its real port):
    ``advertise`` (HOST, HOST:PORT or tcp://HOST:PORT; the bound port when none is given), else
    the bound host, or, when bound to a wildcard such as 0.0.0.0, this host's name if it does not
    resolve to a loopback address, else its outbound IP address (:func:`wildcard_host`); never
    ``localhost``. Raises ValueError for an ``advertise`` that is not an address."""
    return advertised_with_source(bound, advertise)[0]


def advertised_with_source(bound: str, advertise: str | None = None) -> tuple[str, str]:
    """(:func:`advertised` address, where it came from: "--advertise", "the bound address",
    "this host's name ..." or "this host's outbound address ...") for the start-up lines."""
    port = bound.rsplit(":", 1)[1]
    if advertise:
        if advertise.startswith("tcp://") or advertise.rsplit(":", 1)[-1].isdigit() and ":" in advertise:
            return normalize_endpoint(advertise), "--advertise"
        return normalize_endpoint(f"{advertise}:{port}"), "--advertise"
    host = endpoint_host(bound)
    if host not in _WILDCARDS:
        return f"tcp://{host}:{port}", "the bound address"
    host, source = wildcard_host()
    return f"tcp://{host}:{port}", source


def _resolves_to_loopback(name: str) -> bool:
    try:
        infos = socket.getaddrinfo(name, None)
    except (socket.gaierror, UnicodeError):
        return True  # unresolvable: no use to other hosts either
    return all(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback for i in infos)


def outbound_address() -> str | None:
    """This host's IP address on the interface of its default route (a UDP socket is connected
    to a documentation address; no packet is sent), or None without a route."""
    for family, probe in ((socket.AF_INET, "192.0.2.1"), (socket.AF_INET6, "2001:db8::1")):
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect((probe, 9))
                addr = s.getsockname()[0]
        except OSError:
            continue
        if not ipaddress.ip_address(addr).is_loopback:
            return addr
    return None


def wildcard_host() -> tuple[str, str]:
    """The host other machines should use for a socket bound to a wildcard, and where it came
    from: this host's name when it resolves to a non-loopback address (many machines map their
    name to 127.0.1.1 or call themselves localhost), else the outbound IP address, else the name
    with a warning to give --advertise."""
    for name in dict.fromkeys((socket.getfqdn(), socket.gethostname())):
        if name and name != "localhost" and not _resolves_to_loopback(name):
            return name, f"this host's name {name}; --advertise to choose another"
    addr = outbound_address()
    if addr is not None:
        return addr, (
            f"this host's outbound address {addr} (its name resolves only to loopback); --advertise to choose another"
        )
    name = socket.gethostname()
    return name, (
        f"this host's name {name}, which other hosts may not resolve: no non-loopback address "
        "was found; give --advertise"
    )


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


# ---------------------------------------------------------------------------------- weights secret
# On loopback no CURVE key tells the learner from any other local process, so a broadcaster writes
# a random secret into a file only its user can read, named by its PUB port; the learner of this
# host reads it and signs every weights message with it (transport.sign_weights). Another user's
# process cannot read it; a process of the same user can (as it could ptrace either role).


def _secrets_dir() -> Path:
    """``$TMPDIR/asyncrl-<uid>``: this user's directory of broadcaster weights secrets."""
    return Path(tempfile.gettempdir()) / f"asyncrl-{os.getuid()}"


def weights_secret_path(endpoint: str) -> Path:
    """Where the broadcaster whose PUB socket is at ``endpoint`` keeps its weights secret:
    ``$TMPDIR/asyncrl-<uid>/broadcaster-<port>.secret``, or for ``ipc://PATH`` beside the socket
    (``PATH.secret``, in the socket's own private directory)."""
    if endpoint.startswith("ipc://"):
        return Path(endpoint[len("ipc://") :] + ".secret")
    port = endpoint.rsplit(":", 1)[1]
    return _secrets_dir() / f"broadcaster-{port}.secret"


def create_weights_secret(endpoint: str) -> tuple[Path, bytes]:
    """A new random secret for the broadcaster at ``endpoint``, written (mode 0600, in a 0700
    directory of this user) where ``read_weights_secret`` finds it. Raises SecurityError if the
    directory belongs to another user or others can enter it, OSError if it cannot be written."""
    path = weights_secret_path(endpoint)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    st = path.parent.lstat()
    if not path.parent.is_dir() or path.parent.is_symlink() or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise SecurityError(
            f"broadcaster: {path.parent} must be a directory of this user that no one else can enter (mode 0700)"
        )
    secret = secrets.token_hex(32).encode()
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secret)
    os.replace(tmp, path)
    return path, secret


def read_weights_secret(endpoint: str) -> bytes | None:
    """The secret of the broadcaster at ``endpoint`` on this host, or None (none there, unreadable)."""
    try:
        return weights_secret_path(endpoint).read_bytes().strip() or None
    except OSError:
        return None


def remove_weights_secret(path: Path, secret: bytes) -> None:
    """Remove ``path`` if it still holds ``secret`` (not a newer broadcaster's); never raises."""
    try:
        if path.read_bytes().strip() == secret:
            path.unlink()
    except OSError:
        pass


def listening_tcp_ports() -> set[int] | None:
    """TCP ports with a socket in LISTEN state on this host (IPv4 and IPv6), read from
    /proc/net/tcp and /proc/net/tcp6 (Linux); None where neither can be read."""
    ports, read_any = set(), False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        read_any = True
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "0A":  # st 0A: TCP_LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports if read_any else None


def remove_stale_weights_secrets() -> list[str] | None:
    """Remove this user's ``broadcaster-<port>.secret`` files whose port no socket listens on: those
    of broadcasters that were killed (SIGKILL) before they could remove their own. A live
    broadcaster keeps its PUB socket bound for as long as its secret exists, so its file stays.

    Returns the file names removed, or None where the listening ports cannot be read (no
    /proc/net/tcp: nothing is removed). Never raises for a file it cannot remove (skipped)."""
    listening = listening_tcp_ports()
    if listening is None:
        return None
    removed = []
    for path in sorted(_secrets_dir().glob("broadcaster-*.secret")):
        port = path.name[len("broadcaster-") : -len(".secret")]
        if port.isdigit() and int(port) not in listening:
            try:
                path.unlink()
                removed.append(path.name)
            except OSError:
                pass
    return removed


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
        self.refused = tp.RejectCounter(role, log, what="refused connection")  # by reason and address
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

    def note_refusals(self, watch: tp.HandshakeWatch) -> None:
        """Count and log (rate-limited) the failed handshakes on a server socket. Refused keys are
        already logged, with the peer's address and key, by the authenticator."""
        for f in watch.failures():
            if f.reason != "auth":
                self.refused.reject(
                    tp.ProtocolError(f.reason, f"handshake on {f.endpoint} failed: {f.detail}"), f.endpoint
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
            tp.ProtocolError(
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
