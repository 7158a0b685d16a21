"""Config precedence (built-in < task kind < preset < user), values without effect, and the
classification of every field by the presets and task kinds that use it."""

import dataclasses
import json
import math
import re
import tomllib
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from asyncrl.cli import main
from asyncrl.core import config
from asyncrl.core.config import LLM_PRESETS, PRESETS, Config, ConfigError

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TOML = ROOT / "configs" / "default.toml"
LAYERED_KEYS = {("algo", k) for p in config.PRESET_SETTINGS.values() for k in p} | {
    (s, k) for kind in config.TASK_KIND_SETTINGS.values() for s, kv in kind.items() for k in kv
}
ALL_CASES = [("control", p) for p in PRESETS] + [("llm", p) for p in LLM_PRESETS]


def _kind_sets(kind):
    return [] if kind == "control" else ["task.kind=llm"]


@pytest.mark.parametrize("kind,preset", ALL_CASES)
def test_shipped_default_config_keeps_every_preset_its_pins(kind, preset):
    alone = config.load(None, [*_kind_sets(kind), f"algo.preset={preset}"])
    with_file = config.load_resolved(DEFAULT_TOML, [*_kind_sets(kind), f"algo.preset={preset}"])
    assert with_file.config == alone
    assert with_file.notes() == []


@pytest.mark.parametrize("kind,preset", ALL_CASES)
def test_config_show_with_the_default_file_prints_the_preset_alone(kind, preset):
    runner = CliRunner()
    sets = [a for s in _kind_sets(kind) for a in ("--set", s)]
    alone = runner.invoke(main, ["config", "show", "--preset", preset, *sets])
    with_file = runner.invoke(main, ["config", "show", "--config", str(DEFAULT_TOML), "--preset", preset, *sets])
    assert alone.exit_code == 0, alone.output
    assert with_file.output == alone.output


def test_config_show_prints_the_papers_pins_through_the_default_file():
    out = CliRunner().invoke(main, ["config", "show", "--config", str(DEFAULT_TOML), "--set", "algo.preset=vaco_paper"])
    shown = tomllib.loads(out.output)["algo"]
    assert (shown["traces"], shown["ratio_anchor"], shown["behavior_band"], shown["tv_rule"]) == (
        "vtrace",
        "behavior",
        math.inf,
        "filter",
    )
    assert "set by preset vaco_paper" in out.output


def test_study_base_config_resolves_each_cell_as_its_preset_alone(tmp_path):
    from asyncrl.analysis.study import load_study

    text = (
        'name = "p"\ntotal_env_steps = 4096\nseeds = [1]\nenvs = ["HalfCheetah-v5"]\n{}'
        '[[arm]]\nname = "all"\npresets = [{}]\nconditions = ["none"]\n'
    )
    presets = ", ".join(f'"{p}"' for p in PRESETS)
    (tmp_path / "with.toml").write_text(text.format(f'config = "{DEFAULT_TOML}"\n', presets))
    (tmp_path / "without.toml").write_text(text.format("", presets))
    with_file = {c.preset: c.resolved_config() for c in load_study(tmp_path / "with.toml").cells}
    without = {c.preset: c.resolved_config() for c in load_study(tmp_path / "without.toml").cells}
    assert set(with_file) == set(PRESETS) and with_file == without


def test_default_toml_lists_every_unlayered_default_and_comments_the_layered_ones():
    text = DEFAULT_TOML.read_text()
    data = tomllib.loads(text)
    defaults = Config().to_dict()
    named = {(s, k) for s, kv in data.items() for k in kv}
    assert named == {(s, k) for s, kv in defaults.items() for k in kv} - LAYERED_KEYS
    for s, k in named:
        assert config.from_dict({s: {k: data[s][k]}}) == config.load(None), f"{s}.{k} differs from the built-in default"
    commented = tomllib.loads("\n".join(m.group(1) for m in re.finditer(r"^# (\w+ = .+)$", text, re.M)))
    default = config.load(None).algo  # the comments give the default preset's values, pins included
    assert {("algo", k) for k in commented} == {x for x in LAYERED_KEYS if x[0] == "algo"}
    assert {k: getattr(default, k) for k in commented} == commented


def test_a_copied_default_file_with_a_pinned_key_set_says_it_overrides(tmp_path):
    copy = tmp_path / "mine.toml"
    copy.write_text(DEFAULT_TOML.read_text().replace("# behavior_band = 0.2", "behavior_band = 0.3"))
    res = config.load_resolved(copy, ["algo.preset=vaco_paper"])
    assert res.config.algo.behavior_band == 0.3 and res.config.algo.traces == "vtrace"
    assert res.overridden == ["algo.behavior_band = 0.3 overrides preset vaco_paper's inf"]
    assert res.record()["overridden"] == res.overridden and res.record()["user"]["algo"]["behavior_band"] == 0.3
    out = CliRunner().invoke(main, ["config", "show", "--config", str(copy), "--preset", "vaco_paper"])
    assert "# algo.behavior_band = 0.3 overrides preset vaco_paper's inf" in out.stdout


def test_an_explicit_value_equal_to_the_pin_is_quiet():
    res = config.load_resolved(None, ["algo.preset=impala", "algo.traces=vtrace"])
    assert res.config.algo.traces == "vtrace" and res.notes() == []


def test_resolved_config_json_is_kept_exactly(tmp_path):
    """A run's config.json (what a resumed run and every role load) is taken as it is: no preset or
    task-kind value is re-applied over a key it has, not even one the user once overrode."""
    res = config.load_resolved(None, ["algo.preset=vaco_paper", "algo.traces=uncorrected"])
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**res.config.to_dict(), "resolution": res.record(), "provenance": {"x": 1}}))
    again = config.load_resolved(path, ["run.total_env_steps=99"])
    assert again.config == dataclasses.replace(res.config, run=dataclasses.replace(res.config.run, total_env_steps=99))
    # what is set on it is said against it, and the file's own record is kept
    assert again.notes() == ["run.total_env_steps = 99 overrides the resolved config (config.json)'s 1000000"]
    assert again.record()["overridden"] == res.overridden
    assert again.record()["user"]["run"] == {"total_env_steps": 99}
    assert config.from_dict(res.config.to_dict()) == res.config
    with pytest.raises(ConfigError, match="cannot change on a resolved config"):
        config.load(path, ["algo.preset=ppo"])


def test_a_run_says_each_note_once_and_records_it_in_config_json(tmp_path):
    out = CliRunner().invoke(
        main,
        [
            "run",
            "--serial",
            "--env",
            "asyncrl/Corridor-v0",
            "--total-steps",
            "512",
            "--run-dir",
            str(tmp_path / "r"),
            "--set",
            "env.num_envs=4",
            "--set",
            "env.rollout_length=16",
            "--set",
            "learner.slots_per_batch=2",
            "--set",
            "algo.num_minibatches=2",
            "--set",
            "algo.clip_eps=0.3",
            "--set",
            "algo.preset=impala",
            "--set",
            "algo.traces=uncorrected",
        ],
    )
    assert out.exit_code == 0, out.output
    lines = [line for line in out.stderr.splitlines() if line.startswith("config: ")]
    assert lines == [
        'config: algo.traces = "uncorrected" overrides preset impala\'s "vtrace"',
        "config: algo.clip_eps = 0.3 has no effect: preset impala does not use it (used by: ppo)",
    ]
    saved = json.loads((tmp_path / "r" / "config.json").read_text())
    assert saved["resolution"]["overridden"] == [lines[0][len("config: ") :]]
    assert saved["resolution"]["unused"] == [lines[1][len("config: ") :]]
    assert saved["resolution"]["user"]["algo"] == {
        "num_minibatches": 2,
        "clip_eps": 0.3,
        "preset": "impala",
        "traces": "uncorrected",
    }
    assert config.load(tmp_path / "r" / "config.json").algo.traces == "uncorrected"


# ---- values without effect ----

ALTERNATIVES = {  # a valid value other than the default, per field (bool: negated, str choices: another one)
    "gamma": 0.9,
    "gae_lambda": 0.8,
    "rho_bar": 0.5,
    "c_bar": 0.5,
    "value_targets": "vtrace",
    "realign_min_lag": 2,
    "tv_rule": "filter",
    "tv_threshold": 0.01,
    "surrogate_rho_bar": 0.5,
    "tv_filter_min_deviation": 0.05,
    "tv_filter_ratio_cap": 0.1,
    "behavior_band": 0.05,
    "clip_eps": 0.05,
    "kl_coef": 3.0,
    "spo_eps": 0.05,
    "value_coef": 2.0,
    "entropy_coef": 0.05,
    "num_epochs": 2,
    "num_minibatches": 4,
    "lr": 1e-2,
    "adam_eps": 1e-3,
    "max_grad_norm": 0.05,
    "tv_filter_trigger": "iteration",
    "ratio_anchor": "behavior",
    "traces": "vtrace",
    "behavior_band_ratio": "full",
}


def _alternative(cfg, key):
    v = getattr(cfg.algo, key)
    if isinstance(v, bool):
        return not v
    alt = ALTERNATIVES[key]
    if alt == v:  # the preset's own value is the alternative: take another
        alt = {
            "traces": "uncorrected",
            "ratio_anchor": "learning",
            "behavior_band_ratio": "forward",
            "tv_rule": "shrink",
            "value_targets": "lambda_returns",
        }.get(key, v * 2)
    return alt


def test_every_field_is_classified():
    known_presets = set(PRESETS) | set(LLM_PRESETS)
    for section in dataclasses.fields(Config):
        for f in dataclasses.fields(section.default_factory):
            md = f.metadata
            assert {"help", "presets", "kinds", "when"} <= set(md), f"{section.name}.{f.name}"
            assert md["kinds"] and set(md["kinds"]) <= set(config.TASK_KINDS), f"{section.name}.{f.name}"
            assert md["presets"] is None or set(md["presets"]) <= known_presets, f"{section.name}.{f.name}"
    assert set(ALTERNATIVES) | {"preset", "anneal_lr", "normalize_advantages"} == {
        f.name for f in dataclasses.fields(config.AlgoConfig)
    }


@pytest.mark.parametrize("preset", PRESETS)
def test_each_unused_value_is_said_once_and_defaults_stay_quiet(preset):
    base = config.load(None, [f"algo.preset={preset}"])
    assert config.load_resolved(None, [f"algo.preset={preset}", f"algo.gamma={base.algo.gamma}"]).notes() == []
    for f in dataclasses.fields(config.AlgoConfig):
        if f.name == "preset" or not config.unused_reason(base, "algo", f.name):
            continue
        value = _alternative(base, f.name)
        try:
            res = config.load_resolved(None, [f"algo.preset={preset}", f"algo.{f.name}={config.toml_value(value)}"])
        except ConfigError:
            continue  # refused outright: not ignored either
        assert len(res.unused) == 1 and res.unused[0].startswith(f"algo.{f.name} = "), (f.name, res.notes())


def test_llm_values_the_task_does_not_use_are_said():
    res = config.load_resolved(
        None,
        [
            "task.kind=llm",
            "algo.preset=grpo",
            "algo.entropy_coef=0.1",
            "learner.reward_scaling=false",
            "env.num_envs=3",
            "algo.clip_eps=0.1",
        ],
    )
    said = {line.split(" =")[0] for line in res.unused}
    assert said == {"algo.entropy_coef", "learner.reward_scaling", "env.num_envs"}


def test_control_run_says_llm_keys_have_no_effect():
    res = config.load_resolved(None, ["llm.group_size=4"])
    assert res.unused == [
        "llm.group_size = 4 has no effect: task.kind = control does not use it (used by task kinds: llm)"
    ]


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.toml")), ids=lambda p: p.name)
def test_shipped_configs_say_nothing_but_their_task_kind_overrides(path):
    """A shipped config never overrides a preset's pin and sets nothing without effect; a model's config
    may replace the task kind's defaults (the tiny model's larger lr than a pretrained model's), and
    then the run says so at start."""
    res = config.load_resolved(path)
    assert res.unused == [] and res.translated == ()
    assert all(" overrides task kind " in line for line in res.overridden), res.overridden


# ---- the llm task's defaults ----


def test_llm_task_defaults_to_no_minibatch_advantage_normalisation_and_refuses_it():
    llm = config.load(None, ["task.kind=llm", "algo.preset=grpo"])
    assert llm.algo.normalize_advantages is False
    assert config.load(None).algo.normalize_advantages is True
    with pytest.raises(ConfigError, match="normalize_advantages = true"):
        config.load(None, ["task.kind=llm", "algo.preset=grpo", "algo.normalize_advantages=true"])


# ---- a value marked unused changes nothing: one learner iteration, bit for bit ----


def _iteration_weights(overrides):
    """The weights after two learner iterations on one batch of another policy's data (ratios away
    from 1) of a tiny control config, at learner version 200 (past any realignment warm-up)."""
    from asyncrl.core.state import LearnerState
    from asyncrl.tasks import make_task
    from asyncrl.tasks.control.envs import VecEnv
    from asyncrl.tasks.control.policy import InferencePolicy
    from asyncrl.tasks.control.rollout import collect

    cfg = config.load(
        None,
        [
            "env.id=asyncrl/Corridor-v0",
            "env.num_envs=4",
            "env.rollout_length=16",
            "env.max_episode_steps=12",
            "learner.slots_per_batch=2",
            "learner.num_slots=2",
            "algo.num_epochs=2",
            "algo.num_minibatches=2",
            "algo.lr=3e-3",
            "policy.hidden_sizes=[16]",
            *overrides,
        ],
    )
    torch.manual_seed(0)
    env = VecEnv(cfg.env.id, cfg.env.num_envs, seed=0, max_episode_steps=12)
    env.reset()
    spec = env.spec(cfg.env.rollout_length)
    state = LearnerState(cfg, spec, make_task(cfg, spec=spec))
    state.version = 200
    cfg7 = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, seed=7))
    other = LearnerState(cfg7, spec, make_task(cfg7, spec=spec))
    actor = InferencePolicy(other.policy, activation="tanh", seed=0)  # β far from π_T: ratios away from 1
    slots = []
    for i in range(2):
        arrays = state.spec.allocate()
        collect(env, actor.act, arrays, version=199 - i)
        slots.append((f"a{i}", arrays))
    batch = state.make_batch(slots)
    state.iterate(batch)
    state.iterate(batch)
    env.close()
    return [p.detach().clone() for p in state.policy.parameters()]


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("preset", PRESETS)
def test_a_value_marked_unused_leaves_the_iteration_bit_identical(preset):
    base_cfg = config.load(None, [f"algo.preset={preset}"])
    reference = _iteration_weights([f"algo.preset={preset}"])
    checked = 0
    for f in dataclasses.fields(config.AlgoConfig):
        if f.name == "preset" or not config.unused_reason(base_cfg, "algo", f.name):
            continue
        value = config.toml_value(_alternative(base_cfg, f.name))
        try:
            config.load(None, [f"algo.preset={preset}", f"algo.{f.name}={value}"])
        except ConfigError:
            continue
        assert _same(_iteration_weights([f"algo.preset={preset}", f"algo.{f.name}={value}"]), reference), f.name
        checked += 1
    assert checked > 0


@pytest.mark.parametrize(
    "preset,key",
    [
        ("ppo", "clip_eps"),
        ("vaco", "behavior_band"),
        ("vaco", "traces"),
        ("impala", "rho_bar"),
        ("vaco_paper", "tv_threshold"),
    ],
)
def test_a_value_marked_used_does_change_the_iteration(preset, key):
    """The bit-identity test above can fail: these used values do move the weights."""
    base_cfg = config.load(None, [f"algo.preset={preset}"])
    assert not config.unused_reason(base_cfg, "algo", key)
    value = config.toml_value(_alternative(base_cfg, key))
    assert not _same(
        _iteration_weights([f"algo.preset={preset}", f"algo.{key}={value}"]),
        _iteration_weights([f"algo.preset={preset}"]),
    )
