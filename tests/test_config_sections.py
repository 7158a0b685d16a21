"""The config's sections: the llm keys in [llm] (old [task] names refused, older config.json files
translated with a line), the study-only options marked, and what the config package may import."""

import ast
import dataclasses
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from asyncrl.cli import main, prepare_run_dir, write_config_json
from asyncrl.core import config, limits
from asyncrl.core.config import Config, ConfigError
from asyncrl.run.serial import run_serial
from asyncrl.wire import codec

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "asyncrl" / "config"
SMALL = [
    "env.id=asyncrl/Corridor-v0",
    "env.num_envs=2",
    "env.rollout_length=16",
    "learner.slots_per_batch=2",
    "learner.num_slots=2",
    "algo.num_minibatches=2",
    "algo.num_epochs=1",
    "run.num_actors=1",
    "run.total_env_steps=128",
]
STUDY_ONLY = {
    "actor.policy_delay",
    "actor.policy_age_buffer",
    "actor.slowdown_s",
    "actor.lag_trace",
    "run.straggler_slowdown_s",
    "algo.realign_min_lag",
    "algo.tv_filter_trigger",
    "algo.tv_filter_min_deviation",
}


def _old_layout(d: dict) -> dict:
    """``Config.to_dict()`` output as asyncrl wrote it before the llm keys had their own section (keys
    added to [llm] since were in neither section)."""
    old = {s: dict(v) for s, v in d.items() if s != "llm"}
    for key, value in d["llm"].items():
        if f"llm.{key}" in config.MOVED_KEYS.values():
            old["task"]["model" if key == "model_dir" else key] = value
    return old


# ---- [llm] and the old [task] names ----


def test_every_llm_key_moved_and_task_keeps_only_the_kind():
    assert [f.name for f in dataclasses.fields(config.TaskConfig)] == ["kind"]
    assert set(config.MOVED_KEYS.values()) < {f"llm.{f.name}" for f in dataclasses.fields(config.LLMConfig)}
    assert not any(k.startswith("task.lora_") for k in config.MOVED_KEYS)  # added after the move
    assert config.MOVED_KEYS["task.model"] == "llm.model_dir" and len(config.MOVED_KEYS) == 23


@pytest.mark.parametrize("old, new", sorted(config.MOVED_KEYS.items()))
def test_an_old_name_in_set_is_refused_naming_the_new_key(old, new):
    value = '"x"' if isinstance(getattr(Config().llm, new.split(".")[1]), str) else "1"
    with pytest.raises(ConfigError) as e:
        config.load(None, ["task.kind=llm", f"{old}={value}"])
    assert str(e.value).startswith(f"config key {old} moved to {new}") and "\n" not in str(e.value)


def test_an_old_name_in_a_file_or_a_flag_is_refused(tmp_path):
    path = tmp_path / "old.toml"
    path.write_text('[task]\nkind = "llm"\ntemperature = 0.6\n')
    with pytest.raises(ConfigError, match=r"^config key task.temperature moved to llm.temperature"):
        config.load(path)
    with pytest.raises(ConfigError, match=r"^config key task.model moved to llm.model_dir"):
        config.load(None, extra={"task": {"model": "/some/dir"}})
    p = CliRunner().invoke(main, ["config", "show", "--set", "task.group_size=4"])
    assert p.exit_code == 2 and p.stderr.strip() == (
        "Error: config key task.group_size moved to llm.group_size: the language-model task's keys are in [llm]"
    )


def test_the_new_names_load():
    cfg = config.load(None, ["task.kind=llm", "llm.model_dir=/m", "llm.temperature=0.6", "llm.group_size=4"])
    assert (cfg.llm.model_dir, cfg.llm.temperature, cfg.llm.group_size) == ("/m", 0.6, 4)
    assert cfg.batch_size == 4 * 4 * cfg.learner.slots_per_batch


def test_an_older_config_json_is_read_under_the_new_names_and_says_so(tmp_path):
    res = config.load_resolved(None, ["task.kind=llm", "llm.model_dir=/m", "llm.temperature=0.6"])
    path = tmp_path / "config.json"
    record = res.record()
    record["user"]["task"] = {**record["user"]["task"], "model": "/m", "temperature": 0.6}
    del record["user"]["llm"]
    path.write_text(json.dumps({**_old_layout(res.config.to_dict()), "resolution": record}))
    back = config.load_resolved(path)
    assert back.config == res.config
    assert back.translated == (
        f"{path} was written by an older asyncrl: its {len(config.MOVED_KEYS)} language-model keys under [task] "
        f"are read from [llm] (task.model as llm.model_dir, the others under the same name)",
    )
    assert back.notes()[0] == back.translated[0]
    assert back.record()["user"]["llm"] == {"model_dir": "/m", "temperature": 0.6}
    assert config.from_dict(_old_layout(res.config.to_dict())) == res.config  # a checkpoint's copy


def test_a_config_json_with_both_names_is_refused(tmp_path):
    d = Config().to_dict()
    d["task"]["temperature"] = 0.5
    path = tmp_path / "config.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ConfigError, match="names both task.temperature and its new name llm.temperature"):
        config.load(path)


def test_a_new_config_json_is_not_translated(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(Config().to_dict()))
    assert config.load_resolved(path).translated == ()


def test_an_older_run_directory_resumes_with_a_line(tmp_path, capsys):
    res = config.load_resolved(None, SMALL)
    out, resume = prepare_run_dir(tmp_path / "r", res.config)
    write_config_json(out, res)
    run_serial(res.config, out, max_iterations=1, echo=lambda *_: None)
    (out / "summary.json").write_text(json.dumps({"outcome": "interrupted"}))
    saved = json.loads((out / "config.json").read_text())
    old = _old_layout({s: v for s, v in saved.items() if s not in config.RUN_RECORD_KEYS})
    (out / "config.json").write_text(json.dumps({**old, "resolution": saved["resolution"]}))
    capsys.readouterr()
    assert prepare_run_dir(out, res.config) == (out, True)
    err = capsys.readouterr().err
    assert err.startswith(f"config: {out / 'config.json'} was written by an older asyncrl") and err.count("\n") == 1
    run_serial(res.config, out, resume=True, echo=lambda *_: None)
    assert json.loads((out / "summary.json").read_text())["outcome"] == "finished"


def test_plot_reads_an_older_config_json_under_the_new_names(tmp_path):
    from asyncrl.analysis import plots

    (tmp_path / "metrics.jsonl").write_text(
        json.dumps({"env_steps": 1, "wall_time_s": 1.0, "average_return": 0.0}) + "\n"
    )
    (tmp_path / "config.json").write_text(json.dumps(_old_layout(config.load(None, ["llm.temperature=0.6"]).to_dict())))
    assert plots.read_run(tmp_path)["config"]["llm"]["temperature"] == 0.6


# ---- study-only options ----


def test_the_study_only_options_are_marked():
    marked = {f"{k.section}.{k.key}" for k in config.describe() if k.study_only}
    assert marked == STUDY_ONLY


def test_config_show_lists_study_only_options_last_in_their_section_under_a_heading():
    text = CliRunner().invoke(main, ["config", "show"]).stdout
    for section in ("actor", "run", "algo"):
        body = text.split(f"[{section}]\n", 1)[1].split("\n[", 1)[0]
        head, _, tail = body.partition(f"# --- {config.STUDY_ONLY_HEADING} ---\n")
        keys = lambda part: {  # noqa: E731
            line.split(" = ")[0]
            for line in part.splitlines()
            if " = " in line  # noqa: E731
            and not line.startswith("#")
        }
        assert keys(tail) == {k.split(".")[1] for k in STUDY_ONLY if k.startswith(section + ".")}
        assert not keys(head) & keys(tail) and "[study-only]" not in head
        assert tail.count("# [study-only] ") == len(keys(tail))


def test_the_reference_page_has_the_study_only_options_and_the_moved_keys():
    spec = importlib.util.spec_from_file_location("reference_hook", ROOT / "docs" / "hooks" / "reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    page = mod.config_page()
    assert "### Study-only options of `[actor]`" in page and "## `[llm]`" in page
    study_part = page.split("### Study-only options of `[actor]`", 1)[1].split("\n## ", 1)[0]
    assert "`actor.policy_delay`" in study_part and "`actor.rollout_transport`" not in study_part
    assert "| `task.model` | `llm.model_dir` |" in page
    # the committed pages under docs/reference/ are what the code generates now (`make reference`)
    assert mod.stale_pages() == []


# ---- what the config package imports, and its size ----


def test_config_imports_no_wire_no_task_no_heavy_library():
    code = (
        "import sys, asyncrl.core.config; print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('zmq', 'gymnasium', 'torch', 'msgpack', 'transformers') or m.startswith(('asyncrl.wire', "
        "'asyncrl.tasks'))))"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert p.stdout.strip() == "[]"


def test_config_sources_import_only_the_standard_library_limits_and_each_other():
    """Every import statement, inside functions too."""
    allowed_asyncrl = {"asyncrl.core.limits"} | {f"asyncrl.core.config.{p.stem}" for p in PACKAGE.glob("*.py")}
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = "asyncrl.core.config" if node.level == 1 else "asyncrl"
                names = [f"{base}.{node.module}" if node.module else f"{base}.{a.name}" for a in node.names]
                assert all(n in allowed_asyncrl for n in names), (path.name, names)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                assert all(n.split(".")[0] in sys.stdlib_module_names or n == "__future__" for n in names), (
                    path.name,
                    names,
                )


def test_config_modules_stay_small():
    assert all(len(p.read_text().splitlines()) <= 400 for p in PACKAGE.glob("*.py"))


def test_the_welcome_limit_is_one_constant():
    assert codec.MAX_STR_BYTES is limits.MAX_STR_BYTES
    with pytest.raises(ConfigError, match=f"over the {limits.MAX_STR_BYTES:,} a welcome"):
        config.load(None, ["llm.cache_dir=" + "d" * limits.MAX_STR_BYTES])


def test_the_llm_warmup_cli_defaults_are_the_config_defaults():
    from asyncrl.tasks.llm import defaults

    llm = Config().llm
    assert (defaults.DEFAULT_BATCH_SIZE, defaults.DEFAULT_THREADS) == (llm.warmup_batch_size, llm.warmup_threads)
    # a run warms up only when asked (a pretrained model takes none); the warm-up command has steps to take
    assert llm.warmup_steps == 0 and defaults.DEFAULT_STEPS > 0


def test_the_llm_task_kind_layer_suits_a_pretrained_model_and_the_tiny_config_keeps_its_own():
    llm = config.load_resolved(None, ["task.kind=llm"])
    a = llm.config.algo
    assert (a.lr, a.num_epochs, a.num_minibatches, a.anneal_lr, a.max_grad_norm) == (1e-6, 1, 1, False, 1.0)
    assert llm.config.llm.warmup_steps == 0 and llm.source["algo.lr"] == "task kind llm"
    assert llm.config.transport.actor_timeout_s == 120.0 and config.load(None, []).transport.actor_timeout_s == 10.0
    control = config.load(None, []).algo
    assert (control.lr, control.num_epochs, control.num_minibatches) == (3e-4, 10, 8)
    tiny = config.load_resolved(ROOT / "configs" / "gsm-tiny.toml")
    assert (tiny.config.algo.lr, tiny.config.llm.warmup_steps, tiny.config.llm.warmup_target) == (3e-5, 6000, 0.25)
    assert tiny.overridden == ["algo.lr = 3e-05 overrides task kind llm's 1e-06"]


def test_warmup_keys_without_a_warmup_have_no_effect():
    res = config.load_resolved(None, ["task.kind=llm", "llm.warmup_batch_size=8"])
    assert res.unused == ["llm.warmup_batch_size = 8 has no effect: used only when llm.warmup_steps > 0"]
    assert config.load_resolved(None, ["task.kind=llm", "llm.warmup_steps=10", "llm.warmup_batch_size=8"]).unused == []
