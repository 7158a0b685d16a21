"""Every source of a config value is heard: a value set on a run's config.json is reported like one set
on the layers, a key an older config.json lacks comes from the layers (preset pins included), one key
given by a flag and by --set is refused, a TOML file cannot carry a run's records, serial mode refuses
what it cannot honour, and the no-effect notes say only what is true."""

from __future__ import annotations

import json

import pytest

from asyncrl.core import config
from asyncrl.core.config import ConfigError


def _config_json(tmp_path, *sets, drop=()):
    d = config.load(None, list(sets)).to_dict()
    for dotted in drop:
        section, key = dotted.split(".")
        del d[section][key]
    p = tmp_path / "config.json"
    p.write_text(json.dumps(d, default=str))
    return p


def test_a_value_set_on_a_config_json_is_reported_like_one_set_on_the_layers(tmp_path):
    base = _config_json(tmp_path, "algo.preset=vaco_paper", "env.num_envs=4")
    res = config.load_resolved(base, ["algo.behavior_band=0.3", "algo.clip_eps=0.5", "env.num_envs=2"])
    notes = res.notes()
    assert "algo.behavior_band = 0.3 overrides preset vaco_paper's inf" in notes  # the pin, not the file
    assert "env.num_envs = 2 overrides the resolved config (config.json)'s 4" in notes
    assert any(n.startswith("algo.clip_eps = 0.5 has no effect: preset vaco_paper does not use it") for n in notes)
    assert res.config.algo.behavior_band == 0.3 and res.config.env.num_envs == 2
    assert config.load_resolved(base).notes() == []  # the file alone: nothing to say


def test_a_key_an_older_config_json_lacks_takes_the_presets_pin(tmp_path):
    old = _config_json(tmp_path, drop=["algo.behavior_band"])  # the default, decoupled_ppo, pins 0.2
    assert config.load(old).algo.behavior_band == 0.2
    assert config.load(_config_json(tmp_path, "algo.preset=ppo", drop=["algo.behavior_band"])).algo.behavior_band == (
        float("inf")
    )


def test_one_key_given_twice_on_a_command_line_is_refused():
    with pytest.raises(
        ConfigError, match=r'^algo.preset is given twice on one command line, "ppo" by a flag and "vaco"'
    ):
        config.load(None, ["algo.preset=vaco"], {"algo": {"preset": "ppo"}})
    # among --sets the later wins, in code and on the command line (scripts append to a base command)
    assert config.load(None, ["algo.lr=1e-3", "algo.lr=3e-4"]).algo.lr == 3e-4
    from click.testing import CliRunner

    from asyncrl.cli import main

    res = CliRunner().invoke(main, ["config", "show", "--set", "algo.lr=1e-3", "--set", "algo.lr=3e-4"])
    assert res.exit_code == 0 and "lr = 0.0003" in res.output, res.output
    # the same value twice says nothing new: accepted
    assert config.load(None, ["algo.preset=ppo"], {"algo": {"preset": "ppo"}}).algo.preset == "ppo"


@pytest.mark.parametrize("table", ["resolution", "provenance"])
def test_a_toml_config_cannot_carry_a_runs_records(tmp_path, table):
    p = tmp_path / "c.toml"
    p.write_text(f"[algo]\nlr = 1e-4\n[{table}]\nuser = {{}}\n")
    with pytest.raises(ConfigError, match=rf"\[{table}\] is what a run records in its config.json"):
        config.load(p)


@pytest.mark.parametrize(
    "setting",
    [
        "run.launcher=ray",
        "run.ray_address=10.0.0.1:6379",
        "actor.slowdown_s=2.0",
        "run.straggler_slowdown_s=2.0",
        "actor.rollout_transport=shm",
    ],
)
def test_serial_mode_refuses_what_it_cannot_honour(setting):
    cfg = config.load(None, [setting])
    with pytest.raises(ConfigError, match=rf"^{setting.split('=')[0]} = .* has no effect in serial mode"):
        config.validate_serial(cfg)
    config.validate_serial(config.load(None, []))  # the defaults run serially


def test_no_effect_notes_say_only_what_is_true():
    llm = ["task.kind=llm", "llm.train_file=/data/train.jsonl"]
    notes = config.load_resolved(None, [*llm, "llm.train_problems=5000"]).notes()
    assert any("llm.train_problems" in n and "no effect" in n for n in notes)
    # the supervised warm-up draws its train and validation problems from them, train_file or not
    notes = config.load_resolved(None, [*llm, "llm.warmup_steps=100", "llm.train_problems=5000"]).notes()
    assert not any("llm.train_problems" in n for n in notes)
    # the lag warning is for runs that do not correct backward lag
    assert config.load_resolved(None, ["run.lag_warning_p95=3"]).notes() == []
    (line,) = config.load_resolved(None, ["algo.preset=vaco", "run.lag_warning_p95=3"]).notes()
    assert line.startswith("run.lag_warning_p95 = 3 has no effect: used only when the run does not correct")
