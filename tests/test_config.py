import tomllib
from pathlib import Path

import pytest

from asyncrl.core import config
from asyncrl.core.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def test_default_toml_matches_dataclass_defaults():
    data = tomllib.loads((ROOT / "configs/default.toml").read_text())
    # the file lists the keys no preset or task kind sets; the others come from the layers, as for a user's file
    assert config.from_dict(data) == config.load(None)


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.toml")), ids=lambda p: p.name)
def test_shipped_configs_load(path):
    config.load(path)


def test_overrides_parse_types_and_bare_strings():
    cfg = config.load(
        None,
        [
            "algo.lr=1e-4",
            "env.id=Hopper-v5",
            "policy.hidden_sizes=[32, 32]",
            "algo.normalize_advantages=false",
            "algo.gamma=1",
        ],
    )
    assert cfg.algo.lr == 1e-4 and cfg.env.id == "Hopper-v5"
    assert cfg.policy.hidden_sizes == (32, 32) and cfg.algo.normalize_advantages is False
    assert cfg.algo.gamma == 1.0 and isinstance(cfg.algo.gamma, float)


@pytest.mark.parametrize(
    "override, words",
    [
        ("algo.lrr=1", "unknown config key algo.lrr"),
        ("algoo.lr=1", "unknown config section [algoo]"),
        ("algo.lr=fast", "algo.lr: expected a number"),
        ("algo.num_epochs=2.5", "algo.num_epochs: expected an integer"),
        ("algo.normalize_advantages=1", "expected true/false"),
        ("algo.preset=trpo", "unknown preset algo.preset='trpo'"),
        ("algo.ratio_anchor=pi", "algo.ratio_anchor must be one of"),
        ("algo.num_minibatches=7", "not divisible"),
        ("lr=1", "--set expects section.key=value"),
    ],
)
def test_bad_input_names_the_problem(override, words):
    with pytest.raises(ConfigError, match=None) as info:
        config.load(None, [override])
    assert words in str(info.value)


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        config.load(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[algo\nlr = 1")
    with pytest.raises(ConfigError, match="invalid TOML"):
        config.load(bad)


@pytest.mark.parametrize(
    "preset,traces",
    [("vaco", "uncorrected"), ("vaco_no_filter", "uncorrected"), ("vaco_paper", "vtrace"), ("impala", "vtrace")],
)
def test_presets_pin_their_traces_unless_the_config_names_them(preset, traces):
    assert config.load(overrides=[f"algo.preset={preset}"]).algo.traces == traces
    assert config.load(overrides=[f"algo.preset={preset}", "algo.traces=vtrace"]).algo.traces == "vtrace"


def test_a_removed_key_is_refused_with_why(tmp_path):
    """algo.realign_from_version (a learner version before which nothing was realigned) no longer
    exists: a --set, a config file or a run's config.json naming it is refused, and the line says why."""
    with pytest.raises(ConfigError, match="algo.realign_from_version was removed: the realignment no longer waits"):
        config.load(None, ["algo.realign_from_version=125"])
    path = tmp_path / "c.toml"
    path.write_text("[algo]\nrealign_from_version = 0\n")
    with pytest.raises(ConfigError, match="was removed"):
        config.load(path)


def test_the_default_is_decoupled_ppo_and_the_filter_is_vacos():
    """docs/decisions/default-preset.md: the default is decoupled PPO (the band of 0.2 on pi_theta/pi_T,
    learning anchor, weight min(1, pi_T/beta)); vaco keeps the TV filter without a band, vaco_no_filter
    is the default's band with realigned advantages."""
    a = config.load(None).algo
    assert (a.preset, a.behavior_band, a.behavior_band_ratio, a.ratio_anchor, a.surrogate_rho_bar) == (
        "decoupled_ppo",
        0.2,
        "forward",
        "learning",
        1.0,
    )
    v = config.load(None, ["algo.preset=vaco"]).algo
    assert (v.tv_rule, v.tv_threshold, v.behavior_band, v.tv_filter_ratio_cap) == ("filter", 0.1, float("inf"), 1.0)
    assert config.load(None, ["algo.preset=vaco_paper"]).algo.tv_rule == "filter"
    # vaco without the TV budget falls back to decoupled PPO's band, not an unconstrained surrogate
    assert config.load(None, ["algo.preset=vaco_no_filter"]).algo.behavior_band == 0.2
    assert config.load(None, ["algo.preset=vaco_no_filter", "algo.behavior_band=0.3"]).algo.behavior_band == 0.3
    assert config.load(None, ["algo.behavior_band=0.3"]).algo.behavior_band == 0.3
    with pytest.raises(ConfigError, match="tv_rule = shrink narrows the band"):
        config.load(None, ["algo.preset=vaco", "algo.tv_rule=shrink"])
    assert config.load(None, ["algo.preset=vaco", "algo.behavior_band=0.2", "algo.tv_rule=shrink"]).algo.behavior_band
    with pytest.raises(ConfigError, match="algo.tv_rule must be one of"):
        config.load(None, ["algo.preset=vaco", "algo.tv_rule=sometimes"])


def test_unknown_traces_name_the_key():
    with pytest.raises(ConfigError, match="algo.traces"):
        config.load(overrides=["algo.traces=retrace"])
