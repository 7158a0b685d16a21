"""The broadcaster's weights secret: on loopback no CURVE key tells the learner from any other local
process, so a broadcaster writes a random secret into a file only its user can read, named by its
PUB port; the learner of this host reads it and signs every weights message with it
(``codec.sign_weights``). Another user's process cannot read it; a process of the same user can (as
it could ptrace either role). This module computes where the file is, writes, reads and removes it,
and removes the files of broadcasters that were killed."""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path

from asyncrl.wire.security import SecurityError


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


def remove_stale_weights_secrets(*, dry_run: bool = False) -> list[str] | None:
    """Remove this user's ``broadcaster-<port>.secret`` files whose port no socket listens on: those
    of broadcasters that were killed (SIGKILL) before they could remove their own. A live
    broadcaster keeps its PUB socket bound for as long as its secret exists, so its file stays.

    Returns the file names removed (``dry_run``: those it would remove, removing nothing),
    or None where the listening ports cannot be read (no
    /proc/net/tcp: nothing is removed). Never raises for a file it cannot remove (skipped)."""
    listening = listening_tcp_ports()
    if listening is None:
        return None
    removed = []
    for path in sorted(_secrets_dir().glob("broadcaster-*.secret")):
        port = path.name[len("broadcaster-") : -len(".secret")]
        if port.isdigit() and int(port) not in listening:
            try:
                if not dry_run:
                    path.unlink()
                removed.append(path.name)
            except OSError:
                pass
    return removed
