"""Every numeric config key has a range, and a value outside it is refused at load with one line
naming the key (asyncrl/core/config/ranges.py): the class behind a negative gradient clip, a reward
clip of 0 or a group of one completion training to the end without a word."""

from __future__ import annotations

import math

import pytest

from asyncrl.core import config
from asyncrl.core.config import Config, ConfigError
from asyncrl.core.config.ranges import RANGES, Range, numeric_keys


def test_every_numeric_key_has_a_range_and_its_default_holds():
    keys = numeric_keys(Config())
    assert sorted(keys) == sorted(RANGES), "ranges.py and the config's numeric keys differ"
    for key, value in keys.items():
        assert RANGES[key].holds(value), f"{key}'s default {value} is outside its own range"


def _outside(key: str, r: Range, value: float) -> list:
    """Values just outside ``r``, of the key's type."""
    step = 1 if isinstance(value, int) else 0.5
    out = []
    if r.low > -math.inf:
        out.append(r.low if r.low_open else r.low - step)
    if r.high < math.inf:
        out.append(r.high if r.high_open else r.high + step)
    if isinstance(value, float) and not r.inf_ok:
        out.append(math.inf)
    if isinstance(value, float):
        out.append(-math.inf)
    return [type(value)(v) if math.isfinite(v) else v for v in out]


@pytest.mark.parametrize("key", sorted(RANGES))
def test_a_value_outside_a_keys_range_is_refused_naming_it(key):
    value = numeric_keys(Config())[key]
    bad_values = _outside(key, RANGES[key], value)
    assert bad_values, key
    for bad in bad_values:
        with pytest.raises(ConfigError, match=rf"^{key.replace('.', '[.]')} must be .*, got "):
            config.load(None, [f"{key}={bad}"])


def test_range_words_and_edges():
    assert Range(0, low_open=True, inf_ok=True).text() == "> 0 or inf"
    assert Range(0, 1, high_open=True).text() == "in [0, 1)"
    assert Range(1).text() == ">= 1"
    r = Range(0, 1, low_open=True)
    assert not r.holds(0.0) and r.holds(1e-12) and r.holds(1.0) and not r.holds(1.0 + 1e-12)
    assert not r.holds(math.nan) and not Range(inf_ok=True).holds(-math.inf) and Range(inf_ok=True).holds(math.inf)


@pytest.mark.parametrize(
    "setting, words",
    [
        ("algo.max_grad_norm=-1", "algo.max_grad_norm must be > 0 or inf, got -1.0"),  # turned the gradient around
        ("learner.reward_clip=0", "learner.reward_clip must be > 0 or inf, got 0.0"),  # zeroed every reward
        ("policy.obs_clip=0", "policy.obs_clip must be > 0 or inf, got 0.0"),  # all-zero observations
        ("learner.torch_threads=0", "learner.torch_threads must be >= 1, got 0"),  # raised in torch, late
        ("transport.heartbeat_s=0", "transport.heartbeat_s must be > 0, got 0.0"),
        ("run.log_every_s=-5", "run.log_every_s must be >= 0, got -5.0"),
    ],
)
def test_the_values_that_used_to_train_silently_are_refused(setting, words):
    with pytest.raises(ConfigError) as err:
        config.load(None, [setting])
    assert str(err.value) == words


def test_a_group_of_one_completion_is_refused():
    with pytest.raises(ConfigError, match=r"^llm.group_size must be >= 2, got 1$"):
        config.load(None, ["task.kind=llm", "llm.group_size=1"])


def test_an_actor_timeout_within_two_heartbeats_is_refused():
    with pytest.raises(ConfigError, match=r"transport.actor_timeout_s \(1.5\) must be at least twice"):
        config.load(None, ["transport.heartbeat_s=1", "transport.actor_timeout_s=1.5"])
    assert config.load(None, ["transport.heartbeat_s=0.5", "transport.actor_timeout_s=1"]).transport.heartbeat_s == 0.5


def test_inf_means_off_where_the_range_allows_it():
    cfg = config.load(None, ["algo.max_grad_norm=inf", "learner.reward_clip=inf"])
    assert cfg.algo.max_grad_norm == math.inf and cfg.learner.reward_clip == math.inf
