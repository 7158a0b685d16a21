"""CLI conventions: --version, python -m asyncrl, whole help lines, `config show` (every key with
its meaning, checked against configs/default.toml), run provenance, custom env ids."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from asyncrl import __version__
from asyncrl.cli import main
from asyncrl.core import config

ROOT = Path(__file__).resolve().parents[1]
TOY = [
    "--env",
    "asyncrl/Corridor-v0",
    "--set",
    "env.max_episode_steps=12",
    "--set",
    "env.num_envs=2",
    "--set",
    "env.rollout_length=16",
    "--set",
    "learner.slots_per_batch=2",
    "--set",
    "learner.num_slots=2",
    "--set",
    "algo.num_minibatches=4",
    "--set",
    "algo.num_epochs=1",
    "--set",
    "run.num_actors=1",
]


def _asyncrl(*args, cwd=None, env=None, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "asyncrl", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env
    )


def test_version_and_python_dash_m():
    p = _asyncrl("--version")
    assert p.returncode == 0 and p.stdout.strip() == f"asyncrl {__version__}"
    p = _asyncrl("--help")
    assert p.returncode == 0 and p.stdout.startswith("Usage: asyncrl ")


def test_command_list_shows_whole_help_lines():
    out = CliRunner().invoke(main, ["--help"], terminal_width=80).stdout
    out = out[out.index("Commands:") :]
    assert "..." not in out
    for cmd in ("run", "learner", "actor", "broadcaster", "eval", "plot", "lag", "config", "keys", "clean"):
        assert f"\n  {cmd} " in out, cmd
    assert "fills\n" in out or "fills slots for the learner" in " ".join(out.split())


def test_every_key_has_help():
    assert all(k.help for k in config.describe())


def test_config_show_lists_every_key_and_reads_back(tmp_path):
    res = CliRunner().invoke(main, ["config", "show", "--set", "algo.lr=1e-4", "--set", "env.id=Hopper-v5"])
    assert res.exit_code == 0, res.output
    text = res.stdout
    for k in config.describe():
        assert f"\n{k.key} = " in text or text.startswith(f"{k.key} = "), k
        assert f"# {'[study-only] ' if k.study_only else ''}{k.help} (default " in text, k
    assert "# Adam learning rate (default 0.0003; CHANGED)\nlr = 0.0001" in text
    (tmp_path / "shown.toml").write_text(text)
    assert config.load(tmp_path / "shown.toml") == config.load(None, ["algo.lr=1e-4", "env.id=Hopper-v5"])


def test_config_show_bad_key_one_line():
    p = _asyncrl("config", "show", "--set", "algo.nope=1")
    assert p.returncode == 2 and p.stderr.strip().startswith("Error: unknown config key algo.nope")


def test_run_records_commit_packages_and_machine(tmp_path):
    p = _asyncrl("run", "--serial", *TOY, "--total-steps", "64", "--run-dir", str(tmp_path / "r"))
    assert p.returncode == 0, p.stderr
    cfg = json.loads((tmp_path / "r/config.json").read_text())
    summary = json.loads((tmp_path / "r/summary.json").read_text())
    for prov in (cfg["provenance"], summary["provenance"]):
        assert set(prov) == {"code", "packages", "machine"}
        assert prov["packages"]["torch"] and prov["packages"]["numpy"] and prov["packages"]["gymnasium"]
        assert prov["machine"]["cpu_count"] >= 1 and len(prov["machine"]["load_average_1_5_15"]) == 3
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    assert summary["provenance"]["code"]["commit"] == (commit or None)
    # a run directory's config.json still loads as a config (eval, the launcher's children)
    assert config.load(tmp_path / "r/config.json").env.id == "asyncrl/Corridor-v0"


USER_ENV = '''
import gymnasium as gym
import numpy as np

class Tiny(gym.Env):
    """obs [x], reward -|action|, ends after 8 steps."""
    def __init__(self, render_mode=None):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.t = 0
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}
    def step(self, action):
        self.t += 1
        return np.zeros(1, np.float32), -abs(float(action[0])), self.t >= 8, False, {}

gym.register(id="UserTiny-v0", entry_point=Tiny)
'''


@pytest.mark.parametrize(
    "env_args",
    [["--env", "usermod:Tiny"], ["--env", "usermod:UserTiny-v0"], ["--env", "UserTiny-v0", "--env-module", "usermod"]],
    ids=["module:callable", "module:EnvId", "--env-module"],
)
def test_custom_env_trains_and_evaluates(tmp_path, env_args):
    (tmp_path / "usermod.py").write_text(USER_ENV)
    p = _asyncrl("run", "--serial", *TOY, *env_args, "--total-steps", "128", "--run-dir", "r", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads((tmp_path / "r/summary.json").read_text())["env_steps"] == 128
    p = _asyncrl("eval", "r", "--episodes", "2", "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["lengths"] == [8, 8]


@pytest.mark.parametrize(
    "env_args, words",
    [
        (["--env", "nosuchmodule:Env"], "cannot import module 'nosuchmodule'"),
        (["--env", "usermod:Nothing"], "module 'usermod' has neither a registered env id 'Nothing' nor a callable"),
        (["--env", "X-v0", "--env-module", "nosuchmodule"], "env.module: cannot import module 'nosuchmodule'"),
    ],
)
def test_custom_env_errors_one_line(tmp_path, env_args, words):
    (tmp_path / "usermod.py").write_text(USER_ENV)
    p = _asyncrl("run", "--serial", *env_args, "--run-dir", "r", cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in p.stderr, p.stderr
