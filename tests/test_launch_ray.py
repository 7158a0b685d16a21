"""The Ray launcher's pure parts (placement, keys, the missing extra); the cluster run itself is
tests/integration/test_ray_multinode.py."""

import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from asyncrl.cli import main
from asyncrl.core import config
from asyncrl.run.launch_ray import choose_member_nodes, choose_nodes, key_files
from asyncrl.run.ray_cluster import RAY_MISSING, LauncherError, import_ray


def _node(i, ip, *, head=False, learner=False, alive=True):
    res = {"CPU": 2.0, **({"node:__internal_head__": 1.0} if head else {}), **({"learner": 1.0} if learner else {})}
    return {"NodeID": f"n{i}", "NodeManagerAddress": ip, "Alive": alive, "Resources": res}


def test_learner_on_the_head_actors_round_robin_over_the_other_nodes():
    nodes = [
        _node(1, "10.0.0.3"),
        _node(0, "10.0.0.1", head=True),
        _node(2, "10.0.0.2"),
        _node(3, "10.0.0.9", alive=False),
    ]
    learner, actors = choose_nodes(nodes, 5)
    assert learner["NodeID"] == "n0"
    assert [a["NodeManagerAddress"] for a in actors] == ["10.0.0.2", "10.0.0.3", "10.0.0.2", "10.0.0.3", "10.0.0.2"]


def test_learner_resource_wins_over_the_head_and_a_lone_node_takes_everything():
    nodes = [_node(0, "10.0.0.1", head=True), _node(1, "10.0.0.2", learner=True)]
    learner, actors = choose_nodes(nodes, 2)
    assert learner["NodeID"] == "n1" and [a["NodeID"] for a in actors] == ["n0", "n0"]
    learner, actors = choose_nodes([_node(0, "10.0.0.1", head=True)], 3)
    assert learner["NodeID"] == "n0" and {a["NodeID"] for a in actors} == {"n0"}
    with pytest.raises(LauncherError, match="no alive node"):
        choose_nodes([_node(0, "10.0.0.1", alive=False)], 1)


def test_group_members_go_to_the_other_learner_nodes_else_beside_the_learner():
    nodes = [_node(0, "10.0.0.1", head=True), _node(1, "10.0.0.3", learner=True), _node(2, "10.0.0.2", learner=True)]
    learner, _ = choose_nodes(nodes, 1)  # the first node with a learner resource
    members = choose_member_nodes(nodes, learner, 3)
    assert learner["NodeID"] == "n1" and [m["NodeID"] for m in members] == ["n2", "n2", "n2"]
    lone = [_node(0, "10.0.0.1", head=True)]
    assert [m["NodeID"] for m in choose_member_nodes(lone, lone[0], 2)] == ["n0", "n0"]
    assert choose_member_nodes(nodes, learner, 0) == []


def test_a_group_over_tcp_binds_gloo_to_the_interface_towards_the_store():
    from asyncrl.core.learner_group import interface_towards

    assert interface_towards("127.0.0.1") == "lo"
    assert interface_towards("no-such-host.invalid") is None


def test_key_files_are_read_into_memory_and_leave_nothing_on_disk():
    before = set(Path(tempfile.gettempdir()).glob("asyncrl-keys-*"))
    server, clients = key_files(2)
    assert {"server.key_secret", "server.key", "client.key_secret"} <= set(server)
    assert len([k for k in server if k.startswith("allowed/")]) == 3  # the learner's own + 2 nodes
    assert len(clients) == 2 and all({"client.key_secret", "server.key"} <= set(c) for c in clients)
    assert (
        clients[0]["server.key"] == server["server.key"]
        and clients[0]["client.key_secret"] != clients[1]["client.key_secret"]
    )
    assert set(Path(tempfile.gettempdir()).glob("asyncrl-keys-*")) == before


def test_without_ray_the_launcher_stops_with_one_line_naming_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(LauncherError, match=r"\.\[ray\]"):
        import_ray()
    r = CliRunner().invoke(
        main, ["run", "--launcher", "ray", "--env", "asyncrl/Corridor-v0", "--run-dir", str(tmp_path / "run")]
    )
    assert r.exit_code == 2 and RAY_MISSING in r.output, r.output
    assert not (tmp_path / "run").exists()  # nothing was made before the refusal


def test_run_launcher_must_be_local_or_ray():
    assert config.load(None, ["run.launcher=ray"]).run.launcher == "ray"
    with pytest.raises(config.ConfigError, match="run.launcher"):
        config.load(None, ["run.launcher=slurm"])


def test_a_study_cell_on_a_node_with_other_training_code_does_not_run(tmp_path):
    """asyncrl study --launcher ray: a node whose asyncrl differs from the driver's (fingerprint)
    runs nothing for the cell and says why (the function is what the Ray task runs on the node)."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]')")
    from asyncrl.analysis.study_ray import run_cell_on_node

    out = run_cell_on_node(["run", "--serial", "--run-dir", "{run_dir}"], "0000000000000000")
    assert out["rc"] is None and out["files"] == {}
    assert b"runs other asyncrl training code" in out["log"] and b"0000000000000000" in out["log"]


def test_a_study_cell_on_a_node_sends_back_its_run_directory(tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]')")
    from asyncrl.analysis.study import training_code_fingerprint
    from asyncrl.analysis.study_ray import run_cell_on_node

    argv = [
        "run",
        "--serial",
        "--env",
        "asyncrl/Corridor-v0",
        "--total-steps",
        "256",
        "--run-dir",
        "{run_dir}",
        "--set",
        "env.num_envs=2",
        "--set",
        "env.rollout_length=16",
        "--set",
        "learner.slots_per_batch=2",
        "--set",
        "algo.num_minibatches=2",
        "--set",
        "algo.num_epochs=1",
    ]
    before = set(Path(tempfile.gettempdir()).glob("asyncrl-cell-*"))
    out = run_cell_on_node(argv, training_code_fingerprint())
    assert out["rc"] == 0, out["log"].decode(errors="replace")[-2000:]
    assert {"summary.json", "metrics.jsonl", "config.json"} <= set(out["files"])
    assert out["machine"]["node_ip"] and out["load_start"] is not None
    assert set(Path(tempfile.gettempdir()).glob("asyncrl-cell-*")) <= before, "the node's cell directory was left"


def test_ray_token_authentication_is_turned_on_or_the_launch_refused(monkeypatch, tmp_path):
    from asyncrl.run.ray_cluster import require_token_auth

    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ray/auth_token
    env = {}
    require_token_auth(None, env)  # a local cluster: Ray makes its own token
    assert env == {"RAY_AUTH_MODE": "token"}
    with pytest.raises(LauncherError, match="RAY_AUTH_MODE=disabled"):
        require_token_auth(None, {"RAY_AUTH_MODE": "disabled"})
    with pytest.raises(LauncherError, match="no Ray token on this host to join 10.0.0.1:6379"):
        require_token_auth("10.0.0.1:6379", {})
    env = {"RAY_AUTH_TOKEN": "x" * 32}
    require_token_auth("10.0.0.1:6379", env)
    assert env["RAY_AUTH_MODE"] == "token"
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("y" * 32)
    env = {}
    require_token_auth("10.0.0.1:6379", env)
    assert env["RAY_AUTH_MODE"] == "token"


def test_files_from_a_remote_node_land_inside_the_run_directory_only(tmp_path):
    from asyncrl.analysis.study_ray import inside

    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (run / "link").symlink_to(tmp_path / "elsewhere")
    assert inside(run, "metrics.jsonl") == (run / "metrics.jsonl").resolve()
    assert inside(run, "tb/events.x") == (run / "tb" / "events.x").resolve()
    for bad in ("../x", "a/../../x", "/etc/passwd", "", ".", "link/x", "a\x00b", b"x", None, 3):
        assert inside(run, bad) is None, bad
