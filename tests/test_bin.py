"""bin/ wrappers: help, argument errors (one line, exit 2), and the commands they run (--dry-run)."""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(__file__).resolve().parents[1] / "bin"
ENV = {**os.environ, "ASYNCRL": f"{sys.executable} -m asyncrl"}


def _run(name, *args):
    return subprocess.run([str(BIN / name), *args], capture_output=True, text=True, timeout=60, env=ENV)


@pytest.mark.parametrize("name", ["learner-host", "actor-host", "study-quick"])
def test_help(name):
    p = _run(name, "--help")
    assert p.returncode == 0 and p.stdout.startswith(f"Usage: {name} ") and "--dry-run" in p.stdout


@pytest.mark.parametrize(
    "name, args, words",
    [
        ("learner-host", [], "--address HOST is required"),
        ("learner-host", ["--address", "10.0.0.5", "--bogus"], "unknown option '--bogus'"),
        ("learner-host", ["--address", "10.0.0.5", "--port", "70000"], "--port must be an integer 1-65533"),
        ("learner-host", ["--address"], "--address needs a value"),
        ("learner-host", ["--address", "h", "--actor-hosts", "0"], "--actor-hosts must be a positive integer"),
        ("actor-host", [], "--learner HOST is required"),
        ("actor-host", ["--learner", "h", "--num-actors", "two"], "--num-actors must be a positive integer"),
        ("actor-host", ["--learner", "h", "--keys", "/nonexistent"], "--keys /nonexistent: no such directory"),
        ("actor-host", ["--learner", "h", "--seed", "-1"], "--seed must be a non-negative integer, got '-1'"),
        ("study-quick", ["--jobs", "0"], "--jobs must be a positive integer, got '0'"),
        ("study-quick", ["--what"], "unknown option '--what'"),
        ("study-quick", ["--out"], "--out needs a value"),
    ],
)
def test_argument_errors_one_line(name, args, words):
    p = _run(name, *args)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{name}: ") and words in lines[0], p.stderr


def test_learner_host_commands(tmp_path):
    p = _run(
        "learner-host",
        "--address",
        "10.0.0.5",
        "--keys",
        str(tmp_path / "k"),
        "--actor-hosts",
        "3",
        "--env",
        "Hopper-v5",
        "--run-dir",
        "runs/lan",
        "--max-weights-mb",
        "943",
        "--dry-run",
        "--",
        "--total-steps",
        "5000",
    )
    assert p.returncode == 0, p.stderr
    keygen, bc, ln = [shlex.split(x.rstrip("&")) for x in p.stdout.strip().splitlines()]
    asy = shlex.split(ENV["ASYNCRL"])
    assert keygen == asy + ["keys", "generate", str(tmp_path / "k"), "--clients", "3"]
    assert bc == asy + [
        "broadcaster",
        "--bind",
        "10.0.0.5:5556",
        "--keys",
        str(tmp_path / "k/server"),
        "--max-weights-mb",
        "943",
    ]
    assert ln == asy + [
        "learner",
        "--bind",
        "10.0.0.5:5555",
        "--broadcaster",
        "10.0.0.5:5556",
        "--keys",
        str(tmp_path / "k/server"),
        "--env",
        "Hopper-v5",
        "--run-dir",
        "runs/lan",
        "--total-steps",
        "5000",
    ]
    assert not (tmp_path / "k").exists()  # a dry run makes nothing


def test_actor_host_commands():
    p = _run(
        "actor-host",
        "--learner",
        "tcp://10.0.0.5:6000",
        "--num-actors",
        "2",
        "--insecure",
        "--seed",
        "7",
        "--host-label",
        "boxB",
        "--max-weights-mb",
        "35",
        "--dry-run",
        "--",
        "--slowdown",
        "0.5",
    )
    assert p.returncode == 0, p.stderr
    mkdir, relay, a0, a1 = [shlex.split(x.rstrip("&")) for x in p.stdout.strip().splitlines()]
    asy = shlex.split(ENV["ASYNCRL"])
    # the relay's sockets: ipc:// in a directory of this user's only (a loopback port is open to all users)
    assert mkdir[:3] == ["mkdir", "-m", "700"] and "/asyncrl-relay-" in mkdir[3]
    local = f"ipc://{mkdir[3]}/weights"
    assert relay == asy + [
        "broadcaster",
        "--upstream",
        "10.0.0.5:6001",
        "--bind",
        local,
        "--insecure",
        "--max-weights-mb",
        "35",
    ]
    assert a0 == asy + [
        "actor",
        "--learner",
        "10.0.0.5:6000",
        "--broadcaster",
        local,
        "--insecure",
        "--actor-id",
        "boxB-a0",
        "--seed",
        "7",
        "--host-label",
        "boxB",
        "--slowdown",
        "0.5",
    ]
    assert a1[a1.index("--actor-id") + 1] == "boxB-a1" and a1[a1.index("--seed") + 1] == "8"
    p = _run("actor-host", "--learner", "10.0.0.5", "--insecure", "--local-port", "5556", "--dry-run")
    relay, a0, _ = [shlex.split(x.rstrip("&")) for x in p.stdout.strip().splitlines()]
    assert relay[relay.index("--bind") + 1] == a0[a0.index("--broadcaster") + 1] == "127.0.0.1:5556"


def test_wrapped_commands_parse():
    """The options the wrappers pass exist: asyncrl accepts them (each stops at --help)."""
    for role in ("learner", "broadcaster", "actor"):
        p = subprocess.run([*shlex.split(ENV["ASYNCRL"]), role, "--help"], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0
        for opt in {
            "learner": ["--bind", "--broadcaster", "--keys", "--advertise", "--env", "--run-dir"],
            "broadcaster": ["--bind", "--upstream", "--keys", "--advertise", "--insecure"],
            "actor": ["--learner", "--broadcaster", "--keys", "--actor-id", "--seed", "--host-label"],
        }[role]:
            assert opt in p.stdout, (role, opt)


def test_study_quick_lists_the_quick_profile(tmp_path):
    p = _run("study-quick", "--dry-run", "--out", str(tmp_path / "q"))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    # 3 presets x 4 conditions x 3 envs x 5 seeds (configs/studies/quick.toml)
    assert len(lines) == 180 and all(line.startswith("pending") for line in lines)
    assert any("vaco_no_filter | Walker2d-v5 | straggler | seed 315" in line for line in lines)
