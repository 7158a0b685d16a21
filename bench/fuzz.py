"""Bounded fuzz benchmark of each port a peer can reach: N messages of each kind that
reach the application after ZeroMQ's framing, on loopback and through CURVE with an allowed
client key; prints what became of them and fails (exit 1) if a role ended, stopped answering, or
a message went uncounted.

    nice -n 19 .venv/bin/python bench/fuzz.py --messages 10000

Ports: the learner's ROUTER (actors' hello, request, ready, rollout, heartbeat, bye) and the
broadcaster's request ROUTER (snapshot requests, and the learner's weights). The broadcaster's PUB
port takes only subscriptions, which ZeroMQ consumes itself: nothing a peer sends there reaches
the application, so it gets random subscription frames and the liveness check only.

Kinds: random bytes (1 to 4 frames of 0 to 2,000 random bytes), and well-formed messages (real
msgpack headers of every message type, and weights messages) with hostile values: negative, huge
and non-finite numbers, control characters, wrong types, missing and extra keys, other run ids,
frames of wrong sizes; now and then a hello that matches the run, so reports and requests from a
known actor id are exercised too.

Each role runs in this process (its own ZeroMQ context, the same sockets, keys and serve loop as
``asyncrl learner`` and ``asyncrl broadcaster``); a sender thread sends while the main thread serves.
Every message that reaches ``handle`` is counted as rejected (the role's RejectCounter, by
reason), refused (a hello answered with ``refuse``) or accepted; their sum must equal the number
sent. Afterwards a fresh client must still get an answer (a welcome or refusal from the learner, a
snapshot answer from the broadcaster).

Resource cases (skip with --no-resources): big frames, many frames, snapshot floods, many
identities, many connections up to ``ulimit -n``, each printed with the bound
``asyncrl.roles.resource_bounds.memory_bound_bytes`` computes for it before it runs; and, reported but
not judged, an endless multipart message from a peer past the handshake (``endless_multipart``),
which libzmq buffers without limit (docs/multi-host.md, trust model).
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import math
import random
import resource
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import zmq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from asyncrl.core.config import load as load_config  # noqa: E402
from asyncrl.roles.resource_bounds import memory_bound_bytes  # noqa: E402
from asyncrl.run.launch import free_port, free_port_pair  # noqa: E402
from asyncrl.wire import codec, protocol, sockets  # noqa: E402
from asyncrl.wire.security import Security, generate  # noqa: E402

ENV = "asyncrl/Corridor-v0"

INTS = [0, 1, 2, 7, -1, -(2**63), 2**63, 2**64 - 1, True]
FLOATS = [0.0, 1.5, -1e308, 1e308, math.inf, -math.inf, math.nan, 5e-324]
TEXTS = ["", "a0", "fuzz", "\x1b[2J\x1b[H", "a\nb\r\n", "\u2028\u202e", "x" * 4000, "é" * 100, "%s%n{}"]


class Hostile:
    """Well-formed messages with hostile values, for a role of run ``run_id`` (seeded)."""

    def __init__(self, rng: random.Random, run_id: str, spec, identity: str, token: bytes | None = None):
        """``token``: the actor token a welcome gave ``identity`` (protocol 3), used in most
        messages so that the paths of a known actor are reached too; None: none known."""
        self.rng, self.run_id, self.spec, self.identity, self.token = rng, run_id, spec, identity, token

    def value(self, kind):
        r = self.rng
        if r.random() < 0.08:  # another type altogether
            return r.choice([None, [1, "a"], {"k": [1]}, b"\x00" * 8, r.choice(TEXTS), r.choice(FLOATS)])
        if kind is bool:
            return r.choice([True, False, 0, 1])
        if kind is int:
            return r.choice(INTS) if r.random() < 0.6 else r.randrange(0, 64)
        if kind is float:
            return r.choice(FLOATS)
        if kind is str:
            return r.choice(TEXTS + [self.run_id, self.identity])
        if kind is bytes:
            return r.randbytes(r.choice([0, 16, 40, 4096]))
        if kind == list[float]:
            return [r.choice(FLOATS) for _ in range(r.choice([0, 1, 5, 3000]))]
        if kind == list[int]:
            return [r.choice(INTS) for _ in range(r.choice([0, 1, 5, 3000]))]
        if kind is dict:
            return {r.choice(TEXTS): r.choice(INTS + FLOATS + TEXTS) for _ in range(r.choice([0, 2, 70]))}
        return r.choice([None, r.randbytes(16)])  # bytes | None

    def header(self, kind: str) -> dict:
        r = self.rng
        schema = {**protocol._COMMON, **protocol.SCHEMAS[kind], **protocol.OPTIONAL.get(kind, {})}
        h = {
            "type": kind,
            "proto": protocol.PROTOCOL_VERSION if r.random() < 0.9 else r.choice(INTS),
            "run_id": self.run_id if r.random() < 0.7 else r.choice(TEXTS),
        }
        for key, expected in schema.items():
            if key in h:
                continue
            if key == "actor_id" and r.random() < 0.7:
                h[key] = self.identity
            elif key == "token" and self.token is not None and r.random() < 0.7:
                h[key] = self.token
            elif r.random() > 0.03:  # else: missing
                h[key] = self.value(expected)
        if r.random() < 0.05:
            h[r.choice(TEXTS)] = self.value(int)  # an extra key
        return h

    def good_hello(self) -> dict:
        return {
            "type": "hello",
            "proto": protocol.PROTOCOL_VERSION,
            "run_id": "",
            "actor_id": self.identity,
            "host": "fuzz",
            "pid": self.rng.randrange(1, 5),
            "env_id": ENV,
            "spec": self.spec.to_dict(),
            "shm_token": None,
            "token": self.token,
        }

    def frames(self) -> list[bytes]:
        r = self.rng
        if r.random() < 0.03:
            h = self.good_hello()
        else:
            h = self.header(r.choice(sorted(protocol.SCHEMAS)))
        try:
            packed = _pack(h)
        except (OverflowError, ValueError, TypeError):
            packed = _pack({**h, **{k: 0 for k, v in h.items() if isinstance(v, int) and not 0 <= v < 2**64}})
        if h["type"] == "weights" or r.random() < 0.05:  # [topic, header, payload]
            body = r.randbytes(r.choice([0, 4, 16, 1001]))
            return [r.choice([protocol.WEIGHTS_TOPIC, b"weights\x00", b""]), packed, body]
        if h["type"] == "rollout" or r.random() < 0.02:
            sizes = [int(np.prod(f.shape)) * f.dtype.itemsize for f in self.spec.fields]
            n = len(sizes) + r.choice([0, 0, 0, -1, 1])
            return [
                packed,
                *(r.randbytes(max(0, sizes[i % len(sizes)] + r.choice([0, 0, 0, 1, -1]))) for i in range(max(0, n))),
            ]
        return [packed]


def _pack(h: dict) -> bytes:
    import msgpack

    return msgpack.packb(h, use_bin_type=True)


def random_frames(rng: random.Random) -> list[bytes]:
    return [rng.randbytes(rng.choice([0, 1, 7, 64, 2000, rng.randrange(0, 2000)])) for _ in range(rng.randint(1, 4))]


def client(ctx: zmq.Context, endpoint: str, identity: str, curve, sndhwm: int = 1000) -> zmq.Socket:
    """A hostile DEALER; ``curve``: (public, secret, server_key) of an allowed client, or None;
    ``sndhwm``: its own send queue (small for the resource cases: the attacker's queue lives in this
    process too, and its RSS is what they measure)."""
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.identity = identity.encode()
    sock.sndtimeo = 30_000
    sock.sndhwm = sndhwm
    sock.rcvhwm = 10
    if curve is not None:
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = curve
    sock.connect(endpoint)
    return sock


def send_all(sock: zmq.Socket, messages: list[list[bytes]], sent: list[int]) -> None:
    for frames in messages:
        sock.send_multipart(frames)
        sent[0] += 1


class Counted:
    """Wraps a role's ``handle`` (and the learner's ``reply``) to count what reaches it and what
    became of each message: "rejected" (its RejectCounter went up), "refused" (a hello answered
    with refuse), "accepted", or "raised" (an exception left handle: the role would end)."""

    def __init__(self, role):
        self.role, self.handled, self.refused = role, 0, 0
        self.outcomes: Counter[str] = Counter()
        self.raised: list[str] = []
        handle = role.handle

        def counted(frames):
            self.handled += 1
            rejects, refused = role.rejects.total, self.refused
            try:
                handle(frames)
            except Exception as exc:  # noqa: BLE001 - what the benchmark looks for
                self.outcomes["raised"] += 1
                self.raised.append(f"{type(exc).__name__}: {exc}"[:300])
                return
            self.outcomes[
                "rejected" if role.rejects.total > rejects else "refused" if self.refused > refused else "accepted"
            ] += 1

        role.handle = counted
        if hasattr(role, "reply"):
            reply = role.reply

            def counting_reply(identity, header):
                if header.get("type") == "refuse":
                    self.refused += 1
                reply(identity, header)

            role.reply = counting_reply


def fuzz_port(name, role, endpoint, curve, n, seed, spec, run_id) -> dict:
    counted = Counted(role)
    ctx = zmq.Context()
    rng = random.Random(seed)
    results = {}
    try:
        for kind in ("random bytes", "hostile values"):
            sock = client(ctx, endpoint, "fuzz" if kind == "hostile values" else f"fuzz-{kind[0]}", curve)
            token = welcome_token(role, sock, run_id, spec) if kind == "hostile values" and spec is not None else None
            make = Hostile(rng, run_id, spec, "fuzz", token)
            messages = [random_frames(rng) if kind == "random bytes" else make.frames() for _ in range(n)]
            # a frame over the socket's ZMQ_MAXMSGSIZE never reaches the role (ZeroMQ drops it and its
            # connection): those are set aside here and sent by resource_cases instead
            limit = sockets.max_message_size(role.router)
            if limit > 0:
                kept = [m for m in messages if max(map(len, m), default=0) <= limit]
                set_aside = len(messages) - len(kept)
                messages = (kept * (n // max(len(kept), 1) + 1))[:n]
            else:
                set_aside = 0
            before, outcomes_before = counted.handled, Counter(counted.outcomes)
            sent = [0]
            t0 = time.perf_counter()
            sender = threading.Thread(target=send_all, args=(sock, messages, sent), daemon=True)
            sender.start()
            last, idle_since = -1, time.monotonic()
            while counted.handled - before < n:
                role.serve(20)
                if counted.handled != last:
                    last, idle_since = counted.handled, time.monotonic()
                elif time.monotonic() - idle_since > 60:
                    break
            wall = time.perf_counter() - t0
            sender.join(30)
            sock.close()
            handled = counted.handled - before
            out = counted.outcomes - outcomes_before
            results[kind] = {
                "sent": sent[0],
                "reached_role": handled,
                "rejected": out["rejected"],
                "refused_hello": out["refused"],
                "accepted": out["accepted"],
                "raised": out["raised"],
                "wall_s": round(wall, 2),
                "msgs_per_s": round(handled / max(wall, 1e-9)),
                "over_maxmsgsize_set_aside": set_aside,
            }
    finally:
        ctx.destroy(linger=0)
    results["rejects_by_reason"] = role.rejects.by_reason()
    results["raised_examples"] = counted.raised[:5]
    return results


def welcome_token(role, sock, run_id, spec) -> bytes | None:
    """Say hello as "fuzz" on ``sock`` to a learner ``role`` (served here) and return the actor
    token of its welcome, or None (not a learner, or no welcome)."""
    if not hasattr(role, "on_hello"):
        return None
    sock.send_multipart(codec.encode(Hostile(random.Random(1), run_id, spec, "fuzz").good_hello()))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        role.serve(20)
        if sock.poll(0):
            header, _ = codec.decode(sock.recv_multipart())
            if header["type"] == "welcome":
                return header["actor_token"]
    return None


def alive_learner(role, endpoint, curve, spec) -> bool:
    ctx = zmq.Context()
    try:
        sock = client(ctx, endpoint, "probe", curve)
        h = Hostile(random.Random(0), role.run_id, spec, "probe").good_hello()
        sock.send_multipart(codec.encode(h))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            role.serve(20)
            if sock.poll(0):
                header, _ = codec.decode(sock.recv_multipart())
                return header["type"] in ("welcome", "refuse")
        return False
    finally:
        ctx.destroy(linger=0)


def alive_broadcaster(role, endpoint, curve) -> bool:
    ctx = zmq.Context()
    try:
        sock = client(ctx, endpoint, "probe", curve)
        sock.send_multipart(codec.encode({"type": "snapshot", "run_id": "", "actor_id": "probe"}))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            role.serve(20)
            if sock.poll(0):
                return bool(sock.recv_multipart())
        return False
    finally:
        ctx.destroy(linger=0)


def fuzz_pub(role, endpoint, curve, n, seed) -> dict:
    """Random subscription frames from an XSUB: ZeroMQ consumes them; the role must go on."""
    rng = random.Random(seed)
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.XSUB)
        sock.linger = 0
        if curve is not None:
            sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = curve
        sock.connect(endpoint)
        t0 = time.perf_counter()
        for _ in range(n):
            sock.send(bytes([rng.choice([0, 1, 2, 255])]) + rng.randbytes(rng.randrange(0, 200)))
            if rng.random() < 0.01:
                role.serve(0)
        for _ in range(20):
            role.serve(10)
        return {"sent": n, "reached_role": 0, "wall_s": round(time.perf_counter() - t0, 2)}
    finally:
        ctx.destroy(linger=0)


# ----------------------------------------------------------------------------- resource cases


def rss_bytes() -> int:
    """Resident set size of this process (the roles run in it), from /proc/self/status."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _halves(role, attack, n: int) -> dict:
    """Run ``attack(i)`` for i in 0..n-1 while serving ``role``; RSS before, after the first half and
    after the second (the role served in between until it is quiet)."""

    def serve_quiet(seconds=1.0):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            role.serve(10)

    out = {"rss_before": rss_bytes()}
    t0 = time.perf_counter()
    for half in ("first", "second"):
        for i in range(n // 2) if half == "first" else range(n // 2, n):
            attack(i)
            if i % 50 == 0:
                role.serve(0)
        serve_quiet()
        out[f"rss_after_{half}_half"] = rss_bytes()
    out["wall_s"] = round(time.perf_counter() - t0, 2)
    out["growth_second_half"] = out["rss_after_second_half"] - out["rss_after_first_half"]
    return out


WEIGHTS_BYTES = 16 << 20  # the broadcaster's weights in the resource cases (4M float32 parameters)


def bound_of(role, learner: bool, cfg, **attack):
    """resource_bounds.memory_bound_bytes of ``role`` for an attack (connections=, frames_per_message=, ...)."""
    if learner:
        return memory_bound_bytes("learner", spec=role.spec, num_slots=cfg.learner.num_slots, **attack)
    return memory_bound_bytes("broadcaster", weights_bytes=WEIGHTS_BYTES, **attack)


def resource_cases(role, endpoint: str, curve, *, learner: bool, spec, run_id: str, n: int, cfg) -> dict:
    """Big frames, many frames, many identities, many connections, connection after connection under
    one identity in use (both ROUTERs), and a snapshot flood from a peer that never reads
    (broadcaster, holding weights of 16 MiB). Each runs in two
    halves; the role must stay alive and the RSS of this process (roles and attackers alike) must
    not grow in the second half by more than max(32 MiB, 10 %), plus 256 KiB per connection opened
    in it (connections up to the fd limit are the attack), and its growth over the case must stay
    under the bound computed before (``resource_bounds.memory_bound_bytes``; the attackers' own
    sockets live in this process too, so this is the stricter test)."""
    ctx = zmq.Context()
    results, socks = {}, []
    limit = sockets.max_message_size(role.router)
    big = (limit + 1) if limit > 0 else (8 << 20)
    try:

        def send_serving(sock, frames) -> None:
            """Send without blocking the role (it is served here while the attacker's queue is full)."""
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    sock.send_multipart(frames, zmq.NOBLOCK)
                    return
                except zmq.Again:
                    role.serve(5)

        one = client(ctx, endpoint, "big", curve, sndhwm=2)
        results["big frames"] = _halves(role, lambda i: send_serving(one, [b"\0" * big]), min(n, 200))
        results["big frames"]["frame_bytes"] = big
        results["big frames"]["bound"] = bound_of(role, learner, cfg, connections=1)
        many = client(ctx, endpoint, "frames", curve, sndhwm=2)
        results["many frames"] = _halves(role, lambda i: send_serving(many, [b"x"] * 5000), min(n, 400))
        results["many frames"]["bound"] = bound_of(
            role, learner, cfg, connections=1, frames_per_message=5000, frame_bytes=1
        )
        owner = client(ctx, endpoint, "taken", curve)  # holds the identity the next case reuses
        owner.send_multipart([b"\0"])
        role.serve(50)
        hwm = role.router.rcvhwm
        frame_bytes = limit if limit > 0 else 1 << 20

        def takeover(i):
            """A new connection under the identity in use sends the role's HWM + 1 of the largest frames."""
            s = client(ctx, endpoint, "taken", curve, sndhwm=hwm + 1)
            for _ in range(hwm + 1):
                send_serving(s, [b"\0" * frame_bytes])
            role.serve(50)
            s.close()

        results["connections under one identity"] = _halves(role, takeover, min(n, 40))
        results["connections under one identity"]["bound"] = bound_of(role, learner, cfg, connections=2)
        owner.close()
        ulimit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        conns = max(100, min(4000, (ulimit - 1000) // 2))  # each connection is two fds of this process

        contexts = []

        def connect(i):
            if i % 900 == 0:  # a ZeroMQ context holds at most 1,023 sockets
                contexts.append(zmq.Context())
            s = client(contexts[-1], endpoint, f"conn{i}", curve)
            socks.append(s)
            if learner:  # a hello as a new id from each: the learner's per-id records
                s.send_multipart(codec.encode(Hostile(random.Random(i), run_id, spec, f"id{i}").good_hello()))
            else:
                s.send_multipart(codec.encode({"type": "snapshot", "run_id": "", "actor_id": f"id{i}"}))

        results["many connections and identities"] = _halves(role, connect, conns)
        results["many connections and identities"]["connections"] = conns
        results["many connections and identities"]["bound"] = bound_of(role, learner, cfg, connections=conns)
        if learner:
            results["many connections and identities"]["actor_records"] = len(role.actors)
            results["many connections and identities"]["join_records"] = len(role.state.actor_joins)
        for s in socks:
            s.close()
        socks.clear()
        for c in contexts:
            c.term()
        if not learner:
            role.take(
                codec.encode_weights(
                    run_id=run_id,
                    epoch=2**62,
                    version=1,
                    publish_time=0.0,
                    layout_hash="h",
                    payload=np.ones(WEIGHTS_BYTES // 4, np.float32),
                )
            )
            flood = client(ctx, endpoint, "flood", curve)
            flood.rcvhwm = 1000
            ask = codec.encode({"type": "snapshot", "run_id": "", "actor_id": "flood"})
            results["snapshot flood (16 MiB weights, never read)"] = _halves(
                role, lambda i: flood.send_multipart(ask), n
            )
            results["snapshot flood (16 MiB weights, never read)"]["bound"] = bound_of(
                role, learner, cfg, connections=1
            )
    finally:
        ctx.destroy(linger=0)
    for r in results.values():
        # each half of the connections case opens conns/2 connections (both ends live in this
        # process): they may cost up to 256 KiB each; no other case may grow in its second half
        allowance = r.get("connections", 0) // 2 * (256 << 10)
        r["grew_by"] = max(r["rss_after_first_half"], r["rss_after_second_half"]) - r["rss_before"]
        r["within_bound"] = r["grew_by"] <= r["bound"].total
        r["bound"] = r["bound"].total
        r["bounded"] = (
            r["growth_second_half"] <= max(32 << 20, r["rss_after_first_half"] // 10) + allowance and r["within_bound"]
        )
    return results


_ENDLESS_ROLE = """
import sys
from asyncrl.wire import sockets
from asyncrl.roles.learner_peers import ROUTER_HWM
ctx = sockets.context()
sock = sockets.router(ctx, "tcp://127.0.0.1:0", hwm=ROUTER_HWM, max_message_bytes=65536)
print(sockets.endpoint_of(sock), flush=True)
while True:
    for frames in sockets.drain_all(sock, max_messages=256):
        pass
    sockets.poll([sock], 100)
"""


def endless_multipart(frames: int = 4_000_000, steps: int = 4) -> dict:
    """The experiment behind docs/multi-host.md's trust model: a ROUTER with the learner's options
    (ZMQ_MAXMSGSIZE 64 KiB, its HWM), read as the learner reads it, in a process of its own; a peer
    past the handshake (raw ZMTP 3.0, NULL mechanism) sends one-byte frames with MORE set and never a
    last one. Returns the ROUTER process's RSS after each step, and after the peer closed."""
    import socket
    import struct
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", _ENDLESS_ROLE], stdout=subprocess.PIPE, text=True, cwd=str(REPO))
    try:
        host, port = proc.stdout.readline().strip().removeprefix("tcp://").rsplit(":", 1)

        def rss_of() -> int:
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
            return 0

        time.sleep(0.5)
        out = {"frames": frames, "rss_before": rss_of(), "rss_steps": []}
        s = socket.create_connection((host, int(port)), timeout=30)
        s.sendall(b"\xff" + b"\0" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\0") + b"\0" * 32)
        s.recv(64)
        body = b"\x05READY\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
        s.sendall(bytes([0x04, len(body)]) + body)
        chunk = b"\x01\x01x" * 100_000  # 100,000 frames of one byte, MORE set
        t0 = time.perf_counter()
        for _ in range(steps):
            for _ in range(frames // steps // 100_000):
                s.sendall(chunk)
            time.sleep(0.5)
            out["rss_steps"].append(rss_of())
        out["wall_s"] = round(time.perf_counter() - t0, 2)
        s.close()
        time.sleep(1.0)
        out["rss_after_close"] = rss_of()
        out["alive_after"] = proc.poll() is None
        out["bytes_per_frame"] = round((out["rss_steps"][-1] - out["rss_before"]) / frames, 1)
        return out
    finally:
        proc.kill()
        proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=10_000, help="messages of each kind, per port and transport")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument(
        "--no-resources",
        action="store_true",
        help="skip the resource cases (big messages, many frames, connections, identities, snapshot flood)",
    )
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the roles' rate-limited reject lines are not the point here
    from asyncrl.roles.broadcaster import Broadcaster
    from asyncrl.roles.learner import Learner

    tmp = Path(tempfile.mkdtemp(prefix="asyncrl-fuzz-"))
    atexit.register(shutil.rmtree, tmp, True)  # its keys (secret ones too) and run directories
    generate(tmp / "keys", 1)
    from asyncrl.wire.security import _load

    cpub, csec = _load(tmp / "keys" / "client-1" / "client.key_secret", secret=True, why="fuzz")
    spub, _ = _load(tmp / "keys" / "client-1" / "server.key", secret=False, why="fuzz")
    cfg = load_config(
        None,
        [
            "env.num_envs=2",
            "env.rollout_length=16",
            "learner.slots_per_batch=2",
            "learner.num_slots=6",
            "algo.num_minibatches=4",
            "algo.num_epochs=1",
            f"env.id={ENV}",
            "run.total_env_steps=1000000000",
            "run.log_every_s=1000",
        ],
    )
    report, ok = {}, True
    for transport in ("loopback", "curve"):
        host = "127.0.0.1" if transport == "loopback" else "0.0.0.0"
        curve = None if transport == "loopback" else (cpub, csec, spub)
        sec = (
            (lambda role: Security(role))
            if transport == "loopback"
            else (lambda role: Security(role, tmp / "keys" / "server"))
        )
        lport, bport = free_port(), free_port_pair()
        run_id = f"fuzz-{transport}-{random.Random(args.seed).randrange(10**6)}"
        bc = Broadcaster(
            f"tcp://{host}:{bport}", security=sec("broadcaster"), echo=lambda *a: None, max_weights_bytes=WEIGHTS_BYTES
        )
        learner = Learner(
            cfg,
            tmp / f"run-{transport}",
            run_id=run_id,
            bind=f"tcp://{host}:{lport}",
            broadcaster=f"tcp://127.0.0.1:{free_port_pair()}",
            echo=lambda *a: None,
            security=sec("learner"),
        )
        try:
            connect = "127.0.0.1"
            t = {
                "learner ROUTER": fuzz_port(
                    "learner",
                    learner,
                    f"tcp://{connect}:{lport}",
                    curve,
                    args.messages,
                    args.seed,
                    learner.spec,
                    run_id,
                ),
                "broadcaster ROUTER": fuzz_port(
                    "broadcaster",
                    bc,
                    f"tcp://{connect}:{bport + 1}",
                    curve,
                    args.messages,
                    args.seed + 1,
                    learner.spec,
                    run_id,
                ),
                "broadcaster PUB": fuzz_pub(bc, f"tcp://{connect}:{bport}", curve, args.messages, args.seed + 2),
            }
            if not args.no_resources:
                t["learner ROUTER"]["resources"] = resource_cases(
                    learner,
                    f"tcp://{connect}:{lport}",
                    curve,
                    learner=True,
                    spec=learner.spec,
                    run_id=run_id,
                    n=args.messages,
                    cfg=cfg,
                )
                t["broadcaster ROUTER"]["resources"] = resource_cases(
                    bc,
                    f"tcp://{connect}:{bport + 1}",
                    curve,
                    learner=False,
                    spec=learner.spec,
                    run_id=run_id,
                    n=args.messages,
                    cfg=cfg,
                )
            t["learner ROUTER"]["alive_after"] = alive_learner(learner, f"tcp://{connect}:{lport}", curve, learner.spec)
            t["broadcaster ROUTER"]["alive_after"] = alive_broadcaster(bc, f"tcp://{connect}:{bport + 1}", curve)
            t["broadcaster PUB"]["alive_after"] = t["broadcaster ROUTER"]["alive_after"]
        finally:
            learner.close()
            bc.close()
        report[transport] = t
        for r in t.values():
            ok &= r["alive_after"] and all(c["bounded"] for c in r.get("resources", {}).values() if "bounded" in c)
            for kind in ("random bytes", "hostile values"):
                if kind in r:
                    k = r[kind]
                    counted = k["rejected"] + k["refused_hello"] + k["accepted"]
                    ok &= k["sent"] == k["reached_role"] == counted == args.messages and k["raised"] == 0
    endless = None if args.no_resources else endless_multipart()
    for transport, t in report.items():
        for port, r in t.items():
            print(f"{transport:8} {port:19} alive after: {r['alive_after']}")
            for kind in ("random bytes", "hostile values"):
                if kind in r:
                    k = r[kind]
                    print(
                        f"    {kind:14} sent {k['sent']:>6}  reached {k['reached_role']:>6}  rejected "
                        f"{k['rejected']:>6}"
                        f"  refused hello {k['refused_hello']:>5}  accepted {k['accepted']:>5}  raised {k['raised']}"
                        f"  {k['wall_s']:6.1f} s ({k['msgs_per_s']:,}/s)"
                    )
            for case, c in r.get("resources", {}).items():
                mib = 1 << 20
                extra = "".join(
                    f", {k} {c[k]:,}" for k in ("frame_bytes", "connections", "actor_records", "join_records") if k in c
                )
                print(
                    f"    resources: {case:45} RSS {c['rss_before'] / mib:7.1f} -> "
                    f"{c['rss_after_first_half'] / mib:7.1f}"
                    f" -> {c['rss_after_second_half'] / mib:7.1f} MiB (second half "
                    f"{c['growth_second_half'] / mib:+.1f});"
                    f" {'bounded' if c['bounded'] else 'GREW'}; grew {c['grew_by'] / mib:.1f} MiB, bound"
                    f" {c['bound'] / mib:.1f} MiB{extra}; {c['wall_s']} s"
                )
            if "rejects_by_reason" in r:
                print(f"    rejects by reason: {dict(sorted(r['rejects_by_reason'].items()))}")
                for line in r["raised_examples"]:
                    print(f"    RAISED: {line}")
            if "random bytes" not in r:
                print(f"    subscription frames sent {r['sent']}, reached the role {r['reached_role']}")
    if endless is not None:
        mib = 1 << 20
        print(
            f"endless multipart from a peer past the handshake (not bounded by libzmq; reported, not judged): "
            f"{endless['frames']:,} one-byte frames, ROUTER process RSS {endless['rss_before'] / mib:.1f} -> "
            + " -> ".join(f"{r / mib:.1f}" for r in endless["rss_steps"])
            + f" MiB ({endless['bytes_per_frame']} bytes per frame), {endless['rss_after_close'] / mib:.1f} MiB after "
            f"the peer closed; alive after: {endless['alive_after']}"
        )
        report["endless multipart"] = endless
    print(
        "PASS: no role ended, every message that reached a role was counted, RSS bounded under the resource cases"
        if ok
        else "FAIL"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
