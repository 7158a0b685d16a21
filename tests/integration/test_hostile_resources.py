"""Resource attacks on a live learner and a live broadcaster, each in its own process
(hostile_role.py), its RSS read from /proc/PID/status.

For each attack: (a) the role's extra RSS (above its RSS before the attack, once started and warmed up
by an honest peer) stays under ``resource_bounds.memory_bound_bytes`` computed from the config, the socket caps
and the role's file-descriptor limit; (b) the attack runs in rounds, measured in
three segments, and the RSS does not grow by more than GROWTH_TOLERANCE (8 MiB, or a quarter of the
first segment's extra RSS if more) in each of the second and third segments: a leak grows in every
segment, while allocator noise does not (glibc keeps freed chunks in its arenas, libzmq's pipes grow
and shrink in 16 KiB chunks); (c) the role is alive and serves an honest peer afterwards. No timing is asserted.
Attackers speak raw ZMTP over TCP sockets (``Zmtp``), so nothing they send is buffered by a ZeroMQ
socket of this process, and they can do what pyzmq would not (a message of frames that never ends,
a connection that never reads).

The roles run with RLIMIT_NOFILE = NOFILE, so the connection flood goes past the fd limit cheaply
(the roles must survive accept failing with EMFILE and serve honest peers once the flood ends).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq
from hostile_helpers import CORRIDOR, SPEC

from asyncrl.roles.broadcaster import ROUTER_HWM as BROADCASTER_ROUTER_HWM
from asyncrl.roles.broadcaster import weights_frame_limit
from asyncrl.roles.learner_peers import ROUTER_HWM as LEARNER_ROUTER_HWM
from asyncrl.roles.resource_bounds import learner_max_frame, memory_bound_bytes
from asyncrl.wire import codec, sockets

pytestmark = [pytest.mark.hostile, pytest.mark.timeout(180)]

HERE = Path(__file__).resolve().parent
NOFILE = 160  # the roles' RLIMIT_NOFILE: the connection flood goes past it
NUM_SLOTS = 6  # hostile_role.SMALL
WEIGHTS_BYTES = 4 << 20  # the broadcaster's weights (1M float32 parameters)
GROWTH_TOLERANCE = 8 << 20  # bytes: allocator noise between two identical halves of an attack (or a
# quarter of the first half's extra RSS, if more); measured: under 5 MiB


# ---------------------------------------------------------------------------- a raw ZMTP 3.0 peer


def _greeting() -> bytes:
    return b"\xff" + b"\0" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\0") + b"\0" + b"\0" * 31


def _command(name: bytes, props: dict[bytes, bytes]) -> bytes:
    body = (
        bytes([len(name)])
        + name
        + b"".join(bytes([len(k)]) + k + struct.pack(">I", len(v)) + v for k, v in props.items())
    )
    return bytes([0x04, len(body)]) + body


def frame(data: bytes, more: bool = False) -> bytes:
    """One ZMTP 3.0 frame (MORE flag set if ``more``)."""
    flags = 0x01 if more else 0
    if len(data) < 256:
        return bytes([flags, len(data)]) + data
    return bytes([flags | 0x02]) + struct.pack(">Q", len(data)) + data


def message(frames) -> bytes:
    frames = list(frames)
    return b"".join(frame(bytes(f), i < len(frames) - 1) for i, f in enumerate(frames))


class Zmtp:
    """A DEALER peer written by hand (NULL mechanism, no CURVE): ``send_raw`` writes ZMTP bytes as
    given, so it can send what no ZeroMQ socket would; it reads only when asked to."""

    def __init__(self, endpoint: str, identity: bytes = b"", *, handshake: bool = True):
        host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.sock.sendall(_greeting())
        self.identity = identity
        if handshake:
            self.finish_handshake()

    def finish_handshake(self) -> None:
        got = b""
        while len(got) < 64:
            more = self.sock.recv(64 - len(got))
            if not more:
                raise ConnectionError("the role closed the connection during the greeting")
            got += more
        self.sock.sendall(_command(b"READY", {b"Socket-Type": b"DEALER", b"Identity": self.identity}))

    def send_raw(self, data: bytes) -> bool:
        """False once the role dropped the connection."""
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            return False

    def close(self) -> None:
        self.sock.close()


# ---------------------------------------------------------------------------- the role processes


def rss(pid: int) -> int:
    """VmRSS of ``pid`` in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


class Role:
    """A role process of hostile_role.py; ``stop()`` ends it (SIGTERM, then SIGKILL) and removes its
    segment if it could not."""

    def __init__(self, role: str, run_dir: Path, *args: str):
        self.role = role
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "hostile_role.py"),
                role,
                "--run-dir",
                str(run_dir),
                "--nofile",
                str(NOFILE),
                "--weights-bytes",
                str(WEIGHTS_BYTES),
                *args,
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            ready, _, _ = select.select([self.proc.stdout], [], [], 90)
            line = self.proc.stdout.readline() if ready else ""
            info = json.loads(line)
        except (ValueError, OSError):
            self.stop()
            raise AssertionError(f"{role} did not start (exit status {self.proc.poll()})") from None
        self.endpoint, self.pid, self.shm = info["endpoint"], info["pid"], info["shm"]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss(self) -> int:
        return rss(self.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if getattr(self, "shm", None) and os.path.exists(f"/dev/shm/{self.shm}"):
            os.unlink(f"/dev/shm/{self.shm}")


def _honest_dealer(ctx, endpoint: str, curve):
    """A DEALER as an honest actor's, connected to ``endpoint`` (CURVE keys ``curve`` or none)."""
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.identity = sockets.route_identity("honest").encode()
    if curve is not None:
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = curve
    sock.connect(endpoint)
    return sock


def honest_learner_peer(endpoint: str, curve=None, timeout_s: float = 30.0) -> bool:
    """A pyzmq actor says hello, gets a welcome, asks for a slot and gets a grant, says bye."""
    ctx = zmq.Context()
    try:
        sock = _honest_dealer(ctx, endpoint, curve)
        hello = {
            "type": "hello",
            "run_id": "",
            "actor_id": f"honest{time.monotonic_ns()}",
            "host": "h",
            "pid": 1,
            "env_id": CORRIDOR,
            "spec": SPEC.to_dict(),
            "shm_token": None,
            "token": None,
        }
        sock.send_multipart(codec.encode(hello))
        deadline = time.monotonic() + timeout_s
        welcome = None
        while time.monotonic() < deadline:
            if sock.poll(200):
                header, _ = codec.decode(sock.recv_multipart())
                if welcome is None and header["type"] == "welcome":
                    welcome = header
                    sock.send_multipart(
                        codec.encode(
                            {
                                "type": "request",
                                "run_id": header["run_id"],
                                "actor_id": hello["actor_id"],
                                "token": header["actor_token"],
                            }
                        )
                    )
                elif welcome is not None and header["type"] == "grant":
                    sock.send_multipart(
                        codec.encode(
                            {
                                "type": "bye",
                                "run_id": welcome["run_id"],
                                "actor_id": hello["actor_id"],
                                "token": welcome["actor_token"],
                            }
                        )
                    )
                    return True
        return False
    finally:
        ctx.destroy(linger=0)


def honest_snapshot(endpoint: str, curve=None, timeout_s: float = 30.0) -> bool:
    """A pyzmq actor asks the broadcaster for a snapshot and gets valid weights."""
    ctx = zmq.Context()
    try:
        sock = _honest_dealer(ctx, endpoint, curve)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            sock.send_multipart(codec.encode({"type": "snapshot", "run_id": "", "actor_id": "honest"}))
            if sock.poll(1000):
                header, weights = codec.decode_weights(sock.recv_multipart())
                return weights.nbytes == WEIGHTS_BYTES
        return False
    finally:
        ctx.destroy(linger=0)


def honest(role: Role) -> bool:
    return honest_learner_peer(role.endpoint) if role.role == "learner" else honest_snapshot(role.endpoint)


def bound(role: Role, connections: int, **attack):
    """The role's bound (resource_bounds.memory_bound_bytes) for ``connections`` peers."""
    if role.role == "learner":
        return memory_bound_bytes("learner", spec=SPEC, num_slots=NUM_SLOTS, connections=connections, **attack)
    return memory_bound_bytes("broadcaster", weights_bytes=WEIGHTS_BYTES, connections=connections, **attack)


def settle(role: Role, seconds: float = 0.5, *, steady_bytes: int = 256 << 10, limit_s: float = 30.0) -> int:
    """The role's RSS once it has taken what is queued: after ``seconds``, read every 0.25 s until two
    reads in a row differ by less than ``steady_bytes`` (at most ``limit_s``). On a loaded machine the
    role may still be working through the attack's backlog after a fixed wait, and a backlog that is
    larger after each segment looks like a leak (b); waiting for the RSS to stop moving takes the
    load out of the measure."""
    time.sleep(seconds)
    last, steady, deadline = role.rss(), 0, time.monotonic() + limit_s
    while steady < 2 and time.monotonic() < deadline:
        time.sleep(0.25)
        now = role.rss()
        steady = steady + 1 if abs(now - last) < steady_bytes else 0
        last = now
    return last


@pytest.fixture(scope="module", params=["learner", "broadcaster"])
def role(request, tmp_path_factory):
    r = Role(request.param, tmp_path_factory.mktemp(request.param))
    try:
        assert honest(r)  # warmed up: its first reply paths have run
        r.base = settle(r)
        yield r
    finally:
        r.stop()


def run_segments(role: Role, attack, rounds: int, segments: int = 3) -> list[int]:
    """``attack(i)`` for ``rounds`` rounds after a quarter as many not measured (the allocator's pools
    and libzmq's pipes reach their working size there); the role's RSS after each of ``segments``
    equal parts of the measured rounds. ``role.base`` becomes its RSS before this attack: the role
    serves every attack of the module, and what an earlier one left in the allocator's pools (freed,
    not returned) is not this attack's."""
    role.base = settle(role)
    for i in range(rounds // 4):
        attack(rounds + i)
    out = []
    for k in range(segments):
        for i in range(k * rounds // segments, (k + 1) * rounds // segments):
            attack(i)
        out.append(settle(role))
    return out


def check(role: Role, rss: list[int], limit) -> None:
    """(a), (b) and (c) of the module docstring: ``rss`` is the role's RSS after each segment."""
    assert role.alive()
    extra = max(rss) - role.base
    assert extra <= limit.total, f"{role.role}: extra RSS {extra / 2**20:.1f} MiB > bound {limit.describe()}"
    tolerance = max(GROWTH_TOLERANCE, (rss[0] - role.base) // 4)
    growth = [b - a for a, b in zip(rss, rss[1:])]
    assert min(growth) <= tolerance, (
        f"{role.role}: RSS grew in every segment of the attack: "
        + ", ".join(f"{g / 2**20:.1f}" for g in growth)
        + " MiB"
    )
    assert honest(role), f"{role.role} does not serve an honest peer after the attack"


def max_frame(role: Role) -> int:
    return learner_max_frame(SPEC) if role.role == "learner" else weights_frame_limit(WEIGHTS_BYTES)


# ---------------------------------------------------------------------------- the attacks


def test_big_messages(role):
    """Messages of the protocol's most frames, each frame as large as the socket takes, and now and
    then a frame one byte over ZMQ_MAXMSGSIZE (its connection is dropped before it is buffered)."""
    size = max_frame(role)
    frames = 1 + len(SPEC.fields) if role.role == "learner" else 4
    big = message([b"\0" * size] * frames)
    state = {"peer": Zmtp(role.endpoint, b"big")}
    over_limit_dropped = []

    def attack(i):
        if i % 10 == 9:  # one byte over the limit: the role drops the connection
            state["peer"].send_raw(frame(b"\0" * (size + 1)))
            deadline = time.monotonic() + 60  # a loaded machine: the role may take a while to read it
            while time.monotonic() < deadline and state["peer"].send_raw(frame(b"\0" * 4096, more=True)):
                time.sleep(0.01)
            over_limit_dropped.append(time.monotonic() < deadline)
            state["peer"].close()
            state["peer"] = Zmtp(role.endpoint, b"big")
        else:
            state["peer"].send_raw(big)

    try:
        rss = run_segments(role, attack, 40)
    finally:
        state["peer"].close()
    assert all(over_limit_dropped) and over_limit_dropped
    check(role, rss, bound(role, connections=1))


def test_connections_under_an_identity_in_use(role):
    """Connection after connection under one identity, each sending its socket's HWM of the largest
    messages and closing: the newest connection takes the identity over (ROUTER_HANDOVER) and the
    old one's queue is read and freed. Without handover libzmq 4.3.5 leaves each new connection's
    pipe unattached and never frees what it buffered, even once closed (the HWM of messages per
    connection: 64 MiB a round for the broadcaster here, 42 MiB for the learner)."""
    size = max_frame(role)
    frames = 1 + len(SPEC.fields) if role.role == "learner" else 4
    big = message([b"\0" * size] * frames)
    hwm = LEARNER_ROUTER_HWM if role.role == "learner" else BROADCASTER_ROUTER_HWM
    owner = Zmtp(role.endpoint, b"taken")  # the identity is in use from here on
    owner.send_raw(message([b"\x00"]))  # one message, so the route is attached before the attack

    def attack(i):
        peer = Zmtp(role.endpoint, b"taken")
        peer.sock.settimeout(2.0)  # a role that stops reading this connection fails the send fast
        try:
            for _ in range(hwm + 1):
                if not peer.send_raw(big):
                    break
        finally:
            peer.close()

    try:
        rss = run_segments(role, attack, 12)
    finally:
        owner.close()
    check(role, rss, bound(role, connections=2))


def test_many_frames_per_message(role):
    """Messages of 5,000 one-byte frames (ZeroMQ delivers them whole; the role rejects each)."""
    peer = Zmtp(role.endpoint, b"frames")
    many = message([b"x"] * 5000)
    try:
        rss = run_segments(role, lambda i: peer.send_raw(many), 100)
    finally:
        peer.close()
    check(role, rss, bound(role, connections=1, frames_per_message=5000, frame_bytes=1))


def test_flood_from_a_peer_that_never_reads(role):
    """Snapshot requests (broadcaster: each answered with the weights) or hellos (learner: each
    answered with a welcome or a refusal) as fast as the socket takes them, never reading a reply."""
    if role.role == "learner":

        def ask(i):
            return codec.encode(
                {
                    "type": "hello",
                    "run_id": "",
                    "actor_id": f"flood{i % 3}",
                    "host": "h",
                    "pid": 1,
                    "env_id": CORRIDOR,
                    "spec": SPEC.to_dict(),
                    "shm_token": None,
                    "token": None,
                }
            )
    else:

        def ask(i):
            return codec.encode({"type": "snapshot", "run_id": "", "actor_id": "flood"})

    peer = Zmtp(role.endpoint, b"flood")
    try:
        rss = run_segments(role, lambda i: peer.send_raw(message(ask(i)) * 50), 400)
    finally:
        peer.close()
    check(role, rss, bound(role, connections=1))


def test_many_identities_on_one_connection(role):
    """One connection speaks for 4,000 actor ids (hellos to the learner, snapshot requests to the
    broadcaster): the per-id records stay capped."""
    peer = Zmtp(role.endpoint, b"ids")

    def attack(i):
        ids = range(i * 100, (i + 1) * 100)
        if role.role == "learner":
            msgs = [
                codec.encode(
                    {
                        "type": "hello",
                        "run_id": "",
                        "actor_id": f"id{n}",
                        "host": "h",
                        "pid": 1,
                        "env_id": CORRIDOR,
                        "spec": SPEC.to_dict(),
                        "shm_token": None,
                        "token": None,
                    }
                )
                for n in ids
            ]
        else:
            msgs = [codec.encode({"type": "snapshot", "run_id": "", "actor_id": f"id{n}"}) for n in ids]
        peer.send_raw(b"".join(message(m) for m in msgs))

    try:
        rss = run_segments(role, attack, 40)
    finally:
        peer.close()
    check(role, rss, bound(role, connections=1))


def test_connection_flood_past_the_fd_limit(role):
    """Rounds of NOFILE + 40 connections held open at once (each says something once the role
    accepted it), then closed: past the role's RLIMIT_NOFILE its accept fails (EMFILE); it must
    survive and serve honest peers once the flood ends."""
    count = NOFILE + 20
    accepted = []

    def attack(i):
        peers = []
        try:
            for n in range(count):
                peers.append(Zmtp(role.endpoint, f"conn{i}-{n}".encode(), handshake=False))
            greeted, poller = set(), select.poll()  # the connections the role accepted sent a greeting
            for p in peers:
                poller.register(p.sock, select.POLLIN)
            quiet_since = time.monotonic()
            while time.monotonic() - quiet_since < 0.3 and len(greeted) < count:
                new = {fd for fd, _ in poller.poll(50)} - greeted
                if new:
                    greeted |= new
                    quiet_since = time.monotonic()
            taken = 0
            for n, p in enumerate(peers):
                if p.sock.fileno() not in greeted:
                    continue  # not accepted (EMFILE): the kernel holds it in the listen backlog
                try:
                    p.finish_handshake()
                except OSError:
                    continue
                taken += 1
                if role.role == "learner":
                    p.send_raw(
                        message(
                            codec.encode(
                                {
                                    "type": "hello",
                                    "run_id": "",
                                    "actor_id": f"c{n}",
                                    "host": "h",
                                    "pid": 1,
                                    "env_id": CORRIDOR,
                                    "spec": SPEC.to_dict(),
                                    "shm_token": None,
                                    "token": None,
                                }
                            )
                        )
                    )
                else:
                    p.send_raw(message(codec.encode({"type": "snapshot", "run_id": "", "actor_id": f"c{n}"})))
            accepted.append(taken)
            time.sleep(0.1)
            assert role.alive()
        finally:
            for p in peers:
                p.close()

    rss = run_segments(role, attack, 3)
    assert max(accepted) < count, "the flood never reached the role's fd limit"
    check(role, rss, bound(role, connections=NOFILE))


# ---------------------------------------------------------------------------- endless multipart


def test_endless_multipart_from_a_peer_past_the_handshake_is_buffered_by_libzmq(tmp_path):
    """The experiment behind docs/multi-host.md's trust model: libzmq delivers a multipart message
    only once complete and ZMQ_MAXMSGSIZE limits each frame, so frames with MORE set that never end
    are buffered without limit by a peer past the handshake (here: loopback, no CURVE). If this
    fails, a libzmq release bounds it: update the trust model and resource_bounds. The memory is
    the connection's: the role survives and serves honest peers once it is closed."""
    role = Role("learner", tmp_path)
    try:
        assert honest(role)
        base = settle(role)
        peer = Zmtp(role.endpoint, b"endless")
        frames = 600_000
        chunk = frame(b"x", more=True) * 10_000
        assert all(peer.send_raw(chunk) for _ in range(frames // 10_000))
        deadline = time.monotonic() + 60  # a loaded machine's role may take a while to read them all
        grown = settle(role) - base
        while grown <= frames * 16 and time.monotonic() < deadline:
            grown = settle(role) - base
        assert grown > frames * 16, f"{frames:,} frames buffered in {grown / 2**20:.1f} MiB: bounded now?"
        peer.close()
        time.sleep(0.5)
        assert role.alive() and honest(role)
    finally:
        role.stop()


def test_an_unauthenticated_peer_cannot_send_frames(tmp_path):
    """With CURVE (a non-loopback bind), a peer without an allowed key never gets past the handshake:
    raw frames after a NULL greeting, and messages of many frames from a CURVE client whose key is
    not allowed, never reach the learner and its RSS does not grow; an allowed client is served."""
    from asyncrl.wire.security import _load, generate

    generate(tmp_path / "keys", 1)
    cpub, csec = _load(tmp_path / "keys" / "client-1" / "client.key_secret", secret=True, why="test")
    spub, _ = _load(tmp_path / "keys" / "client-1" / "server.key", secret=False, why="test")
    role = Role("learner", tmp_path / "run", "--keys", str(tmp_path / "keys" / "server"))
    ctx = zmq.Context()
    try:
        assert honest_learner_peer(role.endpoint, (cpub, csec, spub))
        base = settle(role)
        raw = Zmtp(role.endpoint, b"raw", handshake=False)  # a NULL greeting to a CURVE server
        chunk = frame(b"x", more=True) * 10_000
        sent = 0
        while sent < 600 and raw.send_raw(chunk):
            sent += 1
        raw.close()
        assert sent < 600, "the CURVE learner took 6,000,000 frames from a peer that never authenticated"
        stranger = ctx.socket(zmq.DEALER)  # CURVE, with a key the learner does not allow
        stranger.linger, stranger.sndtimeo = 0, 0
        stranger.curve_publickey, stranger.curve_secretkey = zmq.curve_keypair()
        stranger.curve_serverkey = spub
        stranger.connect(role.endpoint)
        for _ in range(200):
            try:
                stranger.send_multipart([b"x"] * 1000)
            except zmq.Again:
                break
        time.sleep(1.0)
        assert role.rss() - base <= GROWTH_TOLERANCE
        assert role.alive() and honest_learner_peer(role.endpoint, (cpub, csec, spub))
    finally:
        ctx.destroy(linger=0)
        role.stop()
