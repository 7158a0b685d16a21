"""asyncrl.wire.security and asyncrl.wire.addresses: the loopback rule, key files, and CURVE sockets that
accept only listed clients."""

from __future__ import annotations

import logging
import stat
import time

import pytest
import zmq

from asyncrl.wire import addresses, handshake, protocol, sockets
from asyncrl.wire import security as sec
from asyncrl.wire.security import Curve, Security, SecurityError

LAN = "tcp://192.0.2.1:5555"  # never bound or connected to: only selects CURVE


@pytest.fixture
def keys(tmp_path):
    sec.generate(tmp_path / "keys", clients=2)
    return tmp_path / "keys"


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


@pytest.mark.parametrize(
    "endpoint, loopback",
    [
        ("tcp://127.0.0.1:5555", True),
        ("tcp://127.3.4.5:1", True),
        ("tcp://localhost:5555", True),
        ("tcp://[::1]:5555", True),
        ("ipc:///tmp/x", True),
        ("inproc://x", True),
        ("tcp://0.0.0.0:5555", False),
        ("tcp://*:5555", False),
        ("tcp://[::]:5555", False),
        ("tcp://10.77.0.1:5555", False),
        ("tcp://learner.lan:5555", False),
    ],
)
def test_loopback_rule(endpoint, loopback):
    assert addresses.is_loopback(endpoint) is loopback


def test_endpoints_and_advertised_address():
    assert addresses.normalize_endpoint("10.0.0.5:5555") == "tcp://10.0.0.5:5555"
    assert addresses.normalize_endpoint("tcp://0.0.0.0:0") == "tcp://0.0.0.0:0"
    for bad in ("10.0.0.5", "tcp://host:port", "udp://x:1"):
        with pytest.raises(ValueError):
            addresses.normalize_endpoint(bad)
    assert addresses.advertised("tcp://10.0.0.5:6000") == "tcp://10.0.0.5:6000"
    assert addresses.advertised("tcp://0.0.0.0:6000", "gpu-box") == "tcp://gpu-box:6000"
    assert addresses.advertised("tcp://0.0.0.0:6000", "gpu-box:7000") == "tcp://gpu-box:7000"
    assert addresses.advertised("tcp://0.0.0.0:6000").endswith(":6000")
    assert "0.0.0.0" not in addresses.advertised("tcp://0.0.0.0:6000")


def test_generate_writes_the_documented_layout(keys):
    server, allowed = keys / "server", keys / "server" / "allowed"
    assert {p.name for p in allowed.iterdir()} == {"learner.key", "client-1.key", "client-2.key"}
    server_public, server_secret = zmq.auth.load_certificate(server / "server.key_secret")
    assert server_secret and zmq.auth.load_certificate(server / "server.key") == (server_public, None)
    for d in ("server", "client-1", "client-2"):
        public, secret = zmq.auth.load_certificate(keys / d / "client.key_secret")
        assert secret
        name = "learner" if d == "server" else d
        assert zmq.auth.load_certificate(allowed / f"{name}.key")[0] == public
        assert stat.S_IMODE((keys / d / "client.key_secret").stat().st_mode) == 0o600
        assert stat.S_IMODE((keys / d).stat().st_mode) == 0o700
        if d != "server":
            assert zmq.auth.load_certificate(keys / d / "server.key")[0] == server_public
            assert not (keys / d / "server.key_secret").exists()
    assert stat.S_IMODE((server / "server.key_secret").stat().st_mode) == 0o600


def test_generate_again_adds_clients_and_overwrites_nothing(keys):
    before = {p: p.read_bytes() for p in keys.rglob("*") if p.is_file()}
    created = sec.generate(keys, clients=3)
    assert created == [keys / "client-3"]
    for p, content in before.items():
        assert p.read_bytes() == content, p
    assert (keys / "server" / "allowed" / "client-3.key").exists()
    assert sec.generate(keys, clients=3) == []
    with pytest.raises(ValueError):
        sec.generate(keys, clients=0)


def test_security_picks_keys_by_address(keys, ctx):
    plain = Security("learner")
    assert plain.server(ctx, "tcp://127.0.0.1:5555") is None and plain.client("tcp://127.0.0.1:5556") is None
    with pytest.raises(SecurityError, match=r"learner: tcp://0.0.0.0:5555 is reachable from other hosts.*--keys"):
        plain.server(ctx, "tcp://0.0.0.0:5555")
    with pytest.raises(SecurityError, match="--insecure"):
        plain.client(LAN)
    loose = Security("actor a0", insecure=True)
    assert loose.server(ctx, LAN) is None and loose.client(LAN) is None

    server = Security("learner", keys / "server")
    try:
        curve = server.server(ctx, LAN)
        assert curve.server_key is None and len(curve.public) == len(curve.secret) == 40
        as_client = server.client(LAN)  # the learner connecting to its broadcaster
        assert as_client.server_key == curve.public
    finally:
        server.close()
    client = Security("actor a0", keys / "client-1")
    assert client.client(LAN).server_key == curve.public
    with pytest.raises(SecurityError, match=r"server\.key_secret"):
        client.server(ctx, LAN)  # an actor host holds no server secret


def test_missing_allowed_keys_is_an_error(keys, ctx):
    for p in (keys / "server" / "allowed").iterdir():
        p.unlink()
    with pytest.raises(SecurityError, match="no client public keys"):
        Security("broadcaster", keys / "server").server(ctx, LAN)


def _exchange(ctx, endpoint, curve: Curve | None, identity: str) -> tuple[bool, handshake.HandshakeFailure | None]:
    """Connect a DEALER with ``curve``, send one hello-sized message: (delivered?, client's verdict)."""
    client = sockets.dealer(ctx, endpoint, identity, security=curve)
    watch = sockets.handshakes(client)
    try:
        sockets.send(client, [b"ping"], block=False)
        verdict, deadline = None, time.monotonic() + 5
        while verdict is None and time.monotonic() < deadline and watch.succeeded == 0:
            time.sleep(0.05)
            verdict = watch.fatal()
        return watch.succeeded > 0, verdict
    finally:
        sockets.close(client)


def test_curve_router_accepts_listed_client_and_refuses_the_others(keys, tmp_path, ctx, caplog):
    caplog.set_level(logging.WARNING, logger="asyncrl.wire.security")
    server_sec = Security("learner", keys / "server")
    router = sockets.router(ctx, "tcp://127.0.0.1:0", security=server_sec.server(ctx, LAN))
    endpoint = sockets.endpoint_of(router)
    server_watch = sockets.handshakes(router)
    sec.generate(tmp_path / "other", clients=1)  # keys of another deployment
    listed = Security("actor good", keys / "client-1").client(LAN)
    unlisted = Security("actor stranger", tmp_path / "other" / "client-1").client(LAN)
    impostor = Curve(listed.public, listed.secret, unlisted.server_key)  # trusts another server
    try:
        ok, verdict = _exchange(ctx, endpoint, listed, "good")
        assert ok and verdict is None
        frames = sockets.recv_multipart_timeout(router, 5000)
        assert frames == [b"good", b"ping"]

        ok, verdict = _exchange(ctx, endpoint, Curve(unlisted.public, unlisted.secret, listed.server_key), "stranger")
        assert not ok and verdict.reason == "auth"
        ok, verdict = _exchange(ctx, endpoint, None, "keyless")
        assert not ok and verdict.reason == "mechanism_mismatch"
        ok, verdict = _exchange(ctx, endpoint, impostor, "impostor")
        assert not ok and verdict is not None
        assert sockets.recv_multipart_timeout(router, 300) is None  # nothing of theirs arrived

        # the server logged and counted them: the refused key by the authenticator (with the
        # peer's address), the other failed handshakes through its monitor
        server_sec.note_refusals(server_watch)
        refused = server_sec.refused.by_reason()
        assert refused.get("unknown_client_key", 0) >= 1 and refused.get("mechanism_mismatch", 0) >= 1, refused
        stranger_key = unlisted.public.decode()
        assert any(stranger_key in r.getMessage() and "127.0.0.1" in r.getMessage() for r in caplog.records)
    finally:
        sockets.close(router)
        server_sec.close()


def test_curve_pub_sub(keys, ctx):
    """Weights over CURVE PUB/SUB reach a listed subscriber."""
    server_sec = Security("broadcaster", keys / "server")
    pub = sockets.pub(ctx, "tcp://127.0.0.1:0", security=server_sec.server(ctx, LAN))
    sub = sockets.sub(ctx, sockets.endpoint_of(pub), security=Security("actor a", keys / "client-2").client(LAN))
    try:
        deadline = time.monotonic() + 5
        got = None
        while got is None and time.monotonic() < deadline:
            sockets.send(pub, [protocol.WEIGHTS_TOPIC, b"h", b"p"], block=False)
            got = sockets.recv_multipart_timeout(sub, 100)
        assert got == [protocol.WEIGHTS_TOPIC, b"h", b"p"]
    finally:
        sockets.close(pub, sub)
        server_sec.close()


def test_wildcard_bind_never_advertises_loopback(monkeypatch):
    """A host that calls itself localhost (or maps its name to 127.0.1.1): the outbound address."""
    monkeypatch.setattr(addresses.socket, "getfqdn", lambda: "localhost")
    monkeypatch.setattr(addresses.socket, "gethostname", lambda: "box")
    real = addresses.socket.getaddrinfo
    monkeypatch.setattr(
        addresses.socket,
        "getaddrinfo",
        lambda name, *a, **k: [(2, 1, 6, "", ("127.0.1.1", 0))] if name == "box" else real(name, *a, **k),
    )
    monkeypatch.setattr(addresses, "outbound_address", lambda: "10.1.2.3")
    addr, source = addresses.advertised_with_source("tcp://0.0.0.0:5555")
    assert addr == "tcp://10.1.2.3:5555" and "outbound address 10.1.2.3" in source and "--advertise" in source
    # a name that resolves to a real address is kept, and said so
    monkeypatch.setattr(addresses.socket, "getaddrinfo", lambda name, *a, **k: [(2, 1, 6, "", ("10.9.9.9", 0))])
    addr, source = addresses.advertised_with_source("tcp://0.0.0.0:5555")
    assert addr == "tcp://box:5555" and source.startswith("this host's name box")
    # --advertise wins; a bound address is its own
    assert addresses.advertised_with_source("tcp://0.0.0.0:5555", "gpu-box") == ("tcp://gpu-box:5555", "--advertise")
    assert addresses.advertised_with_source("tcp://10.0.0.5:5555") == ("tcp://10.0.0.5:5555", "the bound address")
