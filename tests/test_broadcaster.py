"""The broadcaster in one process: weights only from its learner (signed with its secret), newer
only by (learner epoch, version), rejects counted by reason in its summary file."""

import json
import os
import socket
import stat
import tempfile
import time

import numpy as np
import pytest

from asyncrl.roles.broadcaster import Broadcaster
from asyncrl.run.launch import free_port_pair
from asyncrl.wire import addresses, codec, protocol, sockets
from asyncrl.wire.weights_secret import read_weights_secret, remove_stale_weights_secrets, weights_secret_path

pytestmark = pytest.mark.timeout(60)


def _weights(epoch: int, version: int, run_id: str = "r1") -> list:
    return codec.encode_weights(
        run_id=run_id,
        epoch=epoch,
        version=version,
        publish_time=1.0,
        layout_hash="h",
        payload=np.full(8, version, np.float32),
    )


def test_sign_and_verify_weights():
    frames = _weights(5, 3)
    signed = codec.sign_weights(frames, b"s" * 64)
    assert [bytes(f) for f in codec.verify_weights(signed, b"s" * 64)] == [bytes(f) for f in frames]
    tampered = [signed[0], signed[1], np.full(8, 99, np.float32).tobytes(), signed[3]]
    for bad, secret in (
        (frames, b"s" * 64),
        (signed, b"other"),
        (signed, None),
        (tampered, b"s" * 64),
        (codec.sign_weights(frames, None), b"s" * 64),
    ):
        with pytest.raises(protocol.ProtocolError) as info:
            codec.verify_weights(bad, secret)
        assert info.value.reason == "not_learner"
    header, _ = codec.decode_weights(frames)
    assert header["epoch"] == 5 and header["version"] == 3


def test_broadcaster_takes_only_its_learners_newer_weights(tmp_path):
    port = free_port_pair()
    summary = tmp_path / "bcast.json"
    b = Broadcaster(f"tcp://127.0.0.1:{port}", summary=summary, echo=lambda *_: None)
    ctx = sockets.context()
    learner = spy = None
    try:
        secret = read_weights_secret(b.endpoint)
        path = weights_secret_path(b.endpoint)
        assert secret and stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700 and path.stat().st_uid == os.getuid()
        request_ep = addresses.snapshot_endpoint(b.endpoint)
        learner = sockets.dealer(ctx, request_ep, sockets.route_identity("learner"))
        spy = sockets.dealer(ctx, request_ep, sockets.route_identity("spy"))

        def serve_until(pred):
            deadline = time.monotonic() + 10
            while not pred() and time.monotonic() < deadline:
                b.serve(20)
            assert pred()

        sockets.send(learner, codec.sign_weights(_weights(10, 2), secret))
        serve_until(lambda: b.newest == (10, 2))
        # a forger: unsigned, signed with a wrong secret, a huge version, a later epoch
        sockets.send(spy, _weights(10, 10**12))
        sockets.send(spy, codec.sign_weights(_weights(2**62, 0), b"guess"))
        serve_until(lambda: b.rejects.total == 2)
        assert b.newest == (10, 2)
        sockets.send(learner, codec.sign_weights(_weights(10, 1), secret))  # older: ignored
        sockets.send(learner, codec.sign_weights(_weights(10, 3), secret))
        serve_until(lambda: b.newest == (10, 3))
        # a restarted learner: higher epoch, version 0, another run id: it replaces the old weights
        sockets.send(learner, codec.sign_weights(_weights(11, 0, run_id="r2"), secret))
        serve_until(lambda: b.newest == (11, 0))
        assert b.run_id == "r2" and b.published == 3
        assert b.rejects.by_reason() == {"not_learner": 2}
    finally:
        sockets.close(*(s for s in (learner, spy) if s is not None))
        ctx.term()
        b.close()
    counts = json.loads(summary.read_text())
    assert counts["rejected_messages"] == {"not_learner": 2} and counts["published"] == 3, counts
    assert counts["epoch"] == 11 and counts["version"] == 0
    assert not path.exists(), "the broadcaster left its secret file behind"


def test_clean_removes_only_the_secrets_of_ports_no_one_listens_on(tmp_path, monkeypatch):
    """A SIGKILLed broadcaster leaves its secret file; `asyncrl clean` removes it, and keeps the
    secret of a live broadcaster and of any port a socket still listens on."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    b = Broadcaster(f"tcp://127.0.0.1:{free_port_pair()}", echo=lambda *_: None)
    try:
        live, held = (
            weights_secret_path(b.endpoint),
            tmp_path / f"asyncrl-{os.getuid()}" / f"broadcaster-{listener.getsockname()[1]}.secret",
        )
        held.write_text("x" * 64)
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]
        probe.close()  # bound once, no one listens on it now
        dead = held.with_name(f"broadcaster-{dead_port}.secret")
        dead.write_text("y" * 64)
        other = held.with_name("notes.txt")
        other.write_text("not a secret")
        from click.testing import CliRunner

        from asyncrl.cli import main

        result = CliRunner().invoke(main, ["clean", "--dry-run"])  # lists it, removes nothing
        assert result.exit_code == 0, result.output
        assert f"would remove 1 stale weights secret(s): {dead.name}" in result.output
        assert dead.exists()
        result = CliRunner().invoke(main, ["clean"])
        assert result.exit_code == 0, result.output
        assert "removed 1 stale weights secret(s)" in result.output
        assert not dead.exists() and live.exists() and held.exists() and other.exists()
        assert remove_stale_weights_secrets() == []
    finally:
        b.close()
        listener.close()


def test_cli_max_weights_mb_sets_the_frame_limit(monkeypatch):
    """``asyncrl broadcaster --max-weights-mb M`` makes a Broadcaster that takes weights of M MiB
    (ZMQ_MAXMSGSIZE of its sockets); 0 and negative sizes are a usage error."""
    from click.testing import CliRunner

    from asyncrl.cli import main
    from asyncrl.roles import broadcaster as broadcaster_module

    made = {}

    def fake(*args, **kwargs):
        made.update(kwargs)
        raise ValueError("stop here")

    monkeypatch.setattr(broadcaster_module, "Broadcaster", fake)
    result = CliRunner().invoke(main, ["broadcaster", "--max-weights-mb", "0.5"])
    assert made["max_weights_bytes"] == 512 * 1024, result.output
    result = CliRunner().invoke(main, ["broadcaster"])
    assert made["max_weights_bytes"] is None  # the Broadcaster's default (1 GiB)
    for bad in ("0", "-1", "x"):
        result = CliRunner().invoke(main, ["broadcaster", "--max-weights-mb", bad])
        assert result.exit_code == 2 and "--max-weights-mb" in result.output


def test_the_relay_command_binds_a_private_ipc_socket_and_a_relay_on_one_announces_it(tmp_path):
    """The relay command a broadcaster prints bound tcp://127.0.0.1:PORT, open to every user of the
    actor host (docs/multi-host.md, trust model). It binds ipc:// in a new private directory now,
    and a relay bound there says that address to its actors (it printed tcp://HOST:///PATH)."""
    from asyncrl.wire.security import Security

    lines: list[str] = []
    b = Broadcaster(
        f"tcp://0.0.0.0:{free_port_pair()}", security=Security("broadcaster", insecure=True), echo=lines.append
    )
    relay = None
    try:
        b.announce()
        assert "D=$(mktemp -d) && asyncrl broadcaster --upstream" in lines[-1], lines
        assert "--bind ipc://$D/weights --insecure" in lines[-1] and "127.0.0.1" not in lines[-1], lines
        private = tmp_path / "relay"
        private.mkdir(mode=0o700)
        relay = Broadcaster(
            f"ipc://{private}/weights", upstream=b.endpoint.replace("0.0.0.0", "127.0.0.1"), echo=lines.append
        )
        relay.announce()
        assert f"actors on this host use --broadcaster ipc://{private}/weights (" in lines[-1], lines
    finally:
        if relay is not None:
            relay.close()
        b.close()
