"""asyncrl study: the study file, the grid, cell keys, and the report on hand-made records."""

import json
import shutil
from pathlib import Path

import pytest

from asyncrl.analysis import study as study_mod
from asyncrl.analysis import study_code, study_record
from asyncrl.analysis.study import StudyError, cell_key, condition_settings, load_study
from asyncrl.analysis.study_report import comparisons, group_rows
from asyncrl.core.lag_trace import trace_digest

SMALL = [
    "env.num_envs=2",
    "env.rollout_length=16",
    "learner.slots_per_batch=2",
    "learner.num_slots=4",
    "algo.num_minibatches=2",
    "algo.num_epochs=2",
    "env.max_episode_steps=20",
]


def write(tmp_path, text, name="s.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


GRID = f"""
name = "g"
total_env_steps = 2048
seeds = [1, 2]
envs = ["asyncrl/Corridor-v0"]
set = {json.dumps(SMALL)}
[[arm]]
presets = ["vaco", "ppo"]
conditions = ["none", "age-4", "async-2"]
[[arm]]
name = "delta"
presets = ["vaco"]
conditions = ["delay-2"]
sweep = {{"algo.tv_threshold" = [0.05, 0.1]}}
"""


def test_grid_expands_every_axis_seed_major(tmp_path):
    st = load_study(write(tmp_path, GRID))
    assert len(st.cells) == (2 * 3 + 2) * 2
    assert [c.seed for c in st.cells[:8]] == [1] * 8  # every arm's first seed comes first
    labels = {c.label for c in st.cells}
    assert labels == {"vaco", "ppo", "delta tv_threshold=0.05", "delta tv_threshold=0.1"}
    c = next(c for c in st.cells if c.label == "delta tv_threshold=0.1" and c.seed == 2)
    assert c.mode == "serial" and "algo.tv_threshold=0.1" in c.overrides and "actor.policy_delay=2" in c.overrides
    assert c.resolved_config()["algo"]["tv_threshold"] == 0.1
    assert {c.mode for c in st.cells if c.condition == "async-2"} == {"multiprocess"}
    small = load_study(write(tmp_path, GRID), seeds=[5], total_env_steps=512)
    assert {c.seed for c in small.cells} == {5} and {c.total_env_steps for c in small.cells} == {512}


def test_an_arm_may_name_its_own_envs_and_seeds(tmp_path):
    """One study, ten seeds on one env and five on two others (the main job's reporting run)."""
    text = (
        'seeds = [1, 2, 3]\nenvs = ["CartPole-v1"]\n'
        '[[arm]]\npresets = ["vaco", "ppo"]\nseeds = [4, 5, 6, 7]\n'
        '[[arm]]\npresets = ["vaco", "ppo"]\nenvs = ["Acrobot-v1", "Pendulum-v1"]\n'
    )
    st = load_study(write(tmp_path, text))
    seeds: dict = {}
    for cell in st.cells:
        seeds.setdefault((cell.env, cell.preset), []).append(cell.seed)
    assert sorted(seeds[("CartPole-v1", "vaco")]) == [4, 5, 6, 7] and sorted(seeds[("Acrobot-v1", "ppo")]) == [1, 2, 3]
    assert [cell.seed for cell in st.cells[:4]] == [1] * 4  # seed-major over every arm
    with pytest.raises(StudyError, match="seeds"):
        load_study(write(tmp_path, text.replace("seeds = [4, 5, 6, 7]", 'seeds = ["x"]')))


@pytest.mark.parametrize(
    "name, mode, overrides",
    [
        ("none", "serial", []),
        ("age-8", "serial", ["actor.policy_age_buffer=8"]),
        ("delay-1", "serial", ["actor.policy_delay=1"]),
        ("async-4", "multiprocess", ["run.num_actors=4"]),
        ("straggler", "multiprocess", ["run.num_actors=2", "run.straggler_slowdown_s=0.2"]),
        ("straggler-3-0.5", "multiprocess", ["run.num_actors=3", "run.straggler_slowdown_s=0.5"]),
    ],
)
def test_conditions(name, mode, overrides):
    assert condition_settings(name) == (mode, overrides)


@pytest.mark.parametrize(
    "text, match",
    [
        ('bogus = 1\n[[arm]]\npresets=["vaco"]', "unknown study key 'bogus'"),
        ('name = "x"', "at least one"),
        ('[[arm]]\npresets=["vaco"]\nconditions=["age-x"]', "unknown lag condition 'age-x'"),
        ('[[arm]]\npresets=["vaco"]\nwhat=1', "unknown key 'what'"),
        ('[[arm]]\npresets=["trpo"]', "unknown preset"),
        ('[[arm]]\npresets=["vaco"]\nset=["algo.nope=1"]', "unknown config key algo.nope"),
        ('seeds = []\n[[arm]]\npresets=["vaco"]', "seeds must be a non-empty list"),
        ('total_env_steps = -3\n[[arm]]\npresets=["vaco"]', "total_env_steps"),
        ("[[arm", "invalid TOML"),
        # a set or sweep may not run another cell than the one recorded
        (
            'set=["run.seed=7"]\n[[arm]]\npresets=["vaco"]',
            "set names run.seed, which each cell takes from the study's seeds",
        ),
        ('[[arm]]\npresets=["ppo"]\nsweep={"algo.preset"=["vaco"]}', "sweep names algo.preset"),
        ('set=["env.id=Hopper-v5"]\n[[arm]]\npresets=["vaco"]', "set names env.id"),
        ('[[arm]]\npresets=["vaco"]\nset=["actor.policy_age_buffer=8"]', "set names actor.policy_age_buffer"),
        ('[[arm]]\npresets=["vaco"]\nsweep={"run.total_env_steps"=[4096]}', "sweep names run.total_env_steps"),
        ('set=["algo.lr=1e-4"]\n[[arm]]\npresets=["vaco"]\nsweep={"algo.lr"=[3e-4]}', "algo.lr is given twice"),
        # a sweep whose key the cell does not use: its cells would be one run
        (
            '[[arm]]\npresets=["decoupled_ppo"]\nsweep={"algo.tv_threshold"=[0.05, 0.1]}',
            "the sweep of algo.tv_threshold has no effect",
        ),
        # the report's keys, at load rather than after the cells
        (
            'reference={"Hopper-v5"=1.0}\n[[arm]]\npresets=["vaco"]',
            "reference names 'Hopper-v5', not an env of the study",
        ),
        ('reference={"HalfCheetah-v5"="x"}\n[[arm]]\npresets=["vaco"]', "reference must be a table of env = number"),
        ('modes={"HalfCheetah-v5"=true}\n[[arm]]\npresets=["vaco"]', "modes must be a table of env = number"),
        ('compare=[["vaco","nope"]]\n[[arm]]\npresets=["vaco"]', "compare names 'nope'"),
        ('compare=[["vaco@age-8","vaco"]]\n[[arm]]\npresets=["vaco"]', "compare names 'vaco@age-8'"),
        ('compare=[["vaco"]]\n[[arm]]\npresets=["vaco"]', "compare entries must be"),
        ('random_episodes=2.9\n[[arm]]\npresets=["vaco"]', "random_episodes must be an integer >= 1"),
    ],
)
def test_bad_study_files_name_the_problem(tmp_path, text, match):
    with pytest.raises(StudyError, match=match):
        load_study(write(tmp_path, text))


def test_a_replay_condition_keys_its_cells_on_the_trace_content(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"iteration": 1, "version": 0, "lags": [0, 2]}\n')
    text = '[traces]\nmain = "t.jsonl"\n[[arm]]\npresets=["vaco"]\nconditions=["replay-main"]'
    study = load_study(write(tmp_path, text))
    (cell,) = study.cells
    assert cell.mode == "serial" and cell.condition == "replay-main"
    (override,) = cell.overrides
    assert override == f"actor.lag_trace={trace}#sha256={trace_digest(trace)}"  # the study file's folder
    command = cell.command(tmp_path / "cell")
    assert "--serial" in command and f"actor.lag_trace={trace}#sha256={trace_digest(trace)}" in command
    key = cell_key(study, cell, "code")
    trace.write_text('{"iteration": 1, "version": 0, "lags": [0, 1]}\n')
    assert cell_key(load_study(write(tmp_path, text)), load_study(write(tmp_path, text)).cells[0], "code") != key
    for bad, match in (
        ('[[arm]]\npresets=["vaco"]\nconditions=["replay-other"]', "names no trace 'other'"),
        ('[traces]\nx = "nope.jsonl"\n[[arm]]\npresets=["vaco"]\nconditions=["replay-x"]', "No such file"),
        ('traces = 3\n[[arm]]\npresets=["vaco"]', "traces must be a table"),
    ):
        with pytest.raises(StudyError, match=match):
            load_study(write(tmp_path, bad))


def test_missing_study_file(tmp_path):
    with pytest.raises(StudyError, match="not found"):
        load_study(tmp_path / "nope.toml")


def test_key_follows_config_and_training_code_not_reporting_code(tmp_path):
    st = load_study(write(tmp_path, GRID))
    a, b = st.cells[0], st.cells[1]
    fp = study_mod.training_code_fingerprint()
    assert cell_key(st, a, fp) != cell_key(st, b, fp)
    assert cell_key(st, a, fp) == cell_key(load_study(write(tmp_path, GRID, "t.toml")), a, fp)  # same name "g"
    assert cell_key(st, a, fp) != cell_key(st, a, "0" * 16)
    # the fingerprint covers training modules, not the reporting ones
    pkg = tmp_path / "pkg"
    shutil.copytree(study_mod.PACKAGE, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    assert study_code.training_code_fingerprint(pkg) == fp  # the path of the package does not count
    report = pkg / "analysis" / "study_report.py"
    report.write_text(report.read_text() + "\n# reporting only\n")
    assert study_code.training_code_fingerprint(pkg) == fp
    (pkg / "algo" / "vaco_loss.py").write_text((pkg / "algo" / "vaco_loss.py").read_text() + "\n# changes runs\n")
    assert study_code.training_code_fingerprint(pkg) != fp


def _rec(label, env, cond, seed, final, status="ok"):
    diag = {k: {"mean": 0.1, "last": 0.1} for k in study_record.DIAGNOSTICS}
    return {
        "label": label,
        "env": env,
        "condition": cond,
        "seed": seed,
        "final_return": final,
        "auc": final,
        "status": status,
        "diagnostics": diag,
        "lag_p50": 1,
        "lag_p95": 2,
        "lag_seconds_p50": 0.1,
        "lag_seconds_p95": 0.2,
        "wall_time_s": 1.0,
        "env_steps_per_s": 1.0,
    }


def test_report_rows_count_modes_and_failed_cells(tmp_path):
    st = load_study(write(tmp_path, """envs = ["E"]\nmodes = {"E" = 3000.0}\n[[arm]]\npresets=["vaco", "ppo"]"""))
    recs = [_rec("vaco", "E", "none", s, f) for s, f in ((1, 1600.0), (2, 4500.0), (3, 4400.0))]
    recs += [_rec("ppo", "E", "none", 1, 2000.0), _rec("ppo", "E", "none", 2, None, status="failed")]
    rows = {r["label"]: r for r in group_rows(st, recs)}
    assert rows["vaco"]["modes"] == {"split": 3000.0, "low": 1, "high": 2}
    assert rows["vaco"]["median"] == 4400.0 and rows["vaco"]["n"] == 3
    assert rows["ppo"]["n"] == 1 and rows["ppo"]["failed"] == 1
    comp = comparisons(st, recs)
    assert comp[0]["x"] == "vaco" and comp[0]["y"] == "ppo"
    assert comp[0]["probability_of_improvement"]["value"] == pytest.approx(2 / 3)


def test_report_flags_the_cells_with_lag_warnings(tmp_path):
    from asyncrl.analysis.study_report import markdown

    st = load_study(write(tmp_path, """[[arm]]\npresets=["vaco", "ppo"]"""))
    recs = [
        {**_rec(p, "E", "none", s, 100.0), "code_fingerprint": "f", "commit": "c", "lag_warnings": w}
        for p, s, w in (("vaco", 1, []), ("ppo", 1, ["uncorrected_lag"]), ("ppo", 2, []))
    ]
    rows = group_rows(st, recs)
    assert {r["label"]: r["lag_warned"] for r in rows} == {"vaco": 0, "ppo": 1}
    text = markdown(st, recs, rows, [], [], {})
    assert "| E | ppo | none | 2 (1 lag-warned) |" in text
    assert "## Cells with lag warnings" in text and "- uncorrected_lag: 1 cell (ppo / E / none)" in text
    assert "lag-warned" not in markdown(st, recs[:1], group_rows(st, recs[:1]), [], [], {})


def test_comparison_across_conditions_with_at_syntax(tmp_path):
    st = load_study(
        write(
            tmp_path,
            """compare = [["vaco@async-2", "vaco serial@none"]]
[[arm]]
presets = ["vaco"]
conditions = ["async-2"]
[[arm]]
name = "vaco serial"
presets = ["vaco"]""",
        )
    )
    recs = [_rec("vaco", "E", "async-2", s, f) for s, f in ((1, 3000.0), (2, 4000.0), (3, 1000.0))]
    recs += [_rec("vaco serial", "E", "none", s, f) for s, f in ((1, 3500.0), (2, 4000.0))]
    (comp,) = comparisons(st, recs)
    assert comp["condition"] == "async-2 vs none" and comp["x"] == "vaco" and comp["y"] == "vaco serial"
    assert comp["median_ratio"] == pytest.approx(3000.0 / 3750.0)
    # P(X > Y): 3000 beats none, 4000 beats 3500 and ties 4000, 1000 beats none -> 1.5 / 6
    assert comp["probability_of_improvement"]["value"] == pytest.approx(1.5 / 6)
    # negative returns: no ratio (-208 / -188 = 1.11 would read as X better although it is worse)
    neg = [{**r, "final_return": -abs(r["final_return"]) / 10} for r in recs]
    (comp,) = comparisons(st, neg)
    assert comp["median_ratio"] is None


def test_report_can_take_records_of_other_training_code(tmp_path):
    from asyncrl.analysis.study import Runner

    st = load_study(write(tmp_path, GRID))
    runner = Runner(st, tmp_path / "out", echo=lambda *_: None)
    cell = st.cells[0]
    old = {
        "label": cell.label,
        "env": cell.env,
        "preset": cell.preset,
        "condition": cell.condition,
        "seed": cell.seed,
        "overrides": list(cell.overrides),
        "total_env_steps": cell.total_env_steps,
        "mode": cell.mode,
        "status": "ok",
        "final_return": 1.0,
        "code_fingerprint": "0123456789abcdef",
        "started": "2026-12-01T09:00",
    }
    (tmp_path / "out" / "cells" / "oldkey").mkdir(parents=True)
    (tmp_path / "out" / "cells" / "oldkey" / "cell.json").write_text(json.dumps(old))
    assert runner.finished_records() == [] and len(runner.pending()) == len(st.cells)
    assert runner.finished_records(any_code=True) == [old]


# δ = 0.2 is the default: the delta arm's first cell is the plain arm's run
SHARED_RUN = """[[arm]]
presets = ["vaco"]
conditions = ["none"]
[[arm]]
name = "delta"
presets = ["vaco"]
conditions = ["none"]
sweep = {"algo.tv_threshold" = [0.2, 0.1]}"""


def test_a_run_shared_by_two_arms_counts_once_in_each(tmp_path):
    """A sweep value equal to the default resolves to the plain arm's run (one key): the report lists
    it under each arm's label, not twice under the arm that ran it."""
    from asyncrl.analysis.study import Runner

    st = load_study(write(tmp_path, SHARED_RUN))
    runner = Runner(st, tmp_path / "out", echo=lambda *_: None)
    plain = next(c for c in st.cells if c.label == "vaco")
    same = [c for c in st.cells if runner.keys[c] == runner.keys[plain]]
    assert len(same) == 2
    # the shared run is pending once, not once per arm (it would run twice, into one directory)
    todo = [runner.keys[c] for c in runner.pending()]
    assert len(todo) == len(set(todo)) == len(set(runner.keys.values())) < len(st.cells)
    path = runner.record_path(plain)
    path.parent.mkdir(parents=True)
    path.write_text(
        json.dumps({"label": "vaco", "env": plain.env, "seed": plain.seed, "status": "ok", "final_return": 1.0})
    )
    labels = sorted(r["label"] for r in runner.finished_records() if r["seed"] == plain.seed)
    assert labels == sorted(c.label for c in same) and len(set(labels)) == 2


def test_the_start_line_counts_a_shared_run_once(tmp_path):
    """A run shared by two arms is neither 'already finished' before it ran nor counted twice."""
    from asyncrl.analysis.study import Runner

    st = load_study(write(tmp_path, SHARED_RUN))
    lines = []
    runner = Runner(st, tmp_path / "out", echo=lines.append)
    runs = len(set(runner.keys.values()))
    assert runs < len(st.cells)
    for c in st.cells:  # every run finished: nothing to do
        path = runner.record_path(c)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            json.dumps({"label": c.label, "env": c.env, "seed": c.seed, "status": "ok", "final_return": 1.0})
        )
    assert runner.run() == 0
    assert (
        f"{len(st.cells)} cells ({runs} runs: 1 shares another arm's run), {runs} already finished, 0 to run"
        in lines[0]
    )


def test_llm_study_scores_held_out_accuracy(tmp_path):
    """A language-model cell's score is summary.json's final_accuracy; the report prints accuracies."""
    from asyncrl.analysis.study_report import markdown

    st = load_study("configs/studies/llm-forward-lag.toml")
    assert {c.preset for c in st.cells} == {"grpo", "vaco"} and {c.env for c in st.cells} == {"gsm-tiny"}
    assert {c.resolved_config()["task"]["kind"] for c in st.cells} == {"llm"}
    assert len(st.cells) == 2 * 4 * 5 + 2 * 5
    cmd = st.cells[0].command(tmp_path / "cell")  # cells run in their own directory: one shared cache
    assert cmd[-2:] == ["--set", f"llm.cache_dir={Path('runs/llm').resolve()}"]
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(
        json.dumps(
            {
                "task": "llm",
                "final_average_return": 0.4,
                "initial_accuracy": 0.12,
                "final_accuracy": 0.18,
                "accuracy_difference": 0.06,
                "accuracy_difference_ci95_paired": [0.03, 0.09],
                "eval_problems": 500,
            }
        )
    )
    (run / "metrics.jsonl").write_text(json.dumps({"env_steps": 64, "wall_time_s": 1.0, "average_return": 0.4}) + "\n")
    rec = study_record.cell_record(st.cells[0], run)
    assert rec["final_return"] == 0.18 and rec["score_kind"] == "accuracy" and rec["initial_accuracy"] == 0.12
    assert not rec["diverged"]
    silent = {"env_steps": 128, "wall_time_s": 2.0, "average_return": 0.0, "policy_loss": float("nan")}
    with open(run / "metrics.jsonl", "a") as f:  # every group silent: no optimizer step, NaN loss
        f.write(json.dumps({**silent, "optimizer_steps": 0}) + "\n")
    assert not study_record.cell_record(st.cells[0], run)["diverged"]
    with open(run / "metrics.jsonl", "a") as f:  # a NaN loss that stepped the optimizer
        f.write(json.dumps({**silent, "optimizer_steps": 1}) + "\n")
    assert study_record.cell_record(st.cells[0], run)["diverged"]
    from asyncrl.core.metrics import strict_json  # as a run writes it: the NaN loss is null

    good = json.dumps({"env_steps": 64, "wall_time_s": 1.0, "average_return": 0.4}) + "\n"
    (run / "metrics.jsonl").write_text(good + strict_json({**silent, "optimizer_steps": 0}) + "\n")
    assert not study_record.cell_record(st.cells[0], run)["diverged"]
    (run / "metrics.jsonl").write_text(good + strict_json({**silent, "optimizer_steps": 1}) + "\n")
    assert '"policy_loss": null' in (run / "metrics.jsonl").read_text()
    assert study_record.cell_record(st.cells[0], run)["diverged"]
    (run / "metrics.jsonl").write_text(json.dumps({"env_steps": 64, "wall_time_s": 1.0, "average_return": 0.4}) + "\n")
    rec = study_record.cell_record(st.cells[0], run)
    assert rec["accuracy_difference_ci95_paired"] == [0.03, 0.09] and rec["curve"] == [[64, 1.0, 0.4]]
    recs = [
        {
            **_rec(c.label, c.env, c.condition, c.seed, 0.1 + c.seed / 1000),
            "score_kind": "accuracy",
            "code_fingerprint": "f",
            "commit": "c",
        }
        for c in st.cells[:4]
    ]
    text = markdown(st, recs, group_rows(st, recs), [], [], {})
    assert "exact-match accuracy on the held-out problems" in text and "101: 0.201" in text


def test_progress_line_prints_an_llm_cell_as_accuracy():
    import threading
    from types import SimpleNamespace

    lines = []
    fake = SimpleNamespace(_lock=threading.Lock(), echo=lines.append)
    rec = {"label": "vaco", "env": "gsm-tiny", "condition": "none", "seed": 101, "cell_wall_s": 175.0}
    study_mod.Runner._announce(fake, {**rec, "final_return": 0.254, "score_kind": "accuracy"}, 1, 2)
    study_mod.Runner._announce(fake, {**rec, "final_return": 3783.2}, 2, 2)
    assert lines[0].endswith("seed 101: accuracy 25.4 % (175 s)") and lines[1].endswith("seed 101: 3,783 (175 s)")


def test_cells_record_the_cpu_kernels_and_the_report_names_them():
    """Serial cells repeat bit for bit only under one CPU model and kernel set (ATEN_CPU_CAPABILITY
    gives other rounding): the record keeps the kernels torch picks, the report's CPU line names them."""
    import torch

    from asyncrl.analysis.study import machine_info
    from asyncrl.analysis.study_report import _cpu

    info = machine_info()
    assert info["cpu_kernels"] == torch.backends.cpu.get_cpu_capability()
    assert _cpu({"cpu_model": "AMD EPYC", "cpu_kernels": "AVX2"}) == "AMD EPYC, AVX2 kernels"
    assert _cpu({"cpu_model": "AMD EPYC"}) == "AMD EPYC" and _cpu({}) == "not recorded"


def test_report_puts_one_no_grad_definition_side_by_side(tmp_path):
    """'no grad' is no_grad_fraction for every preset; a cell recorded before it existed
    keeps its vaco share (the same definition) and has none for ppo, whose old clip_fraction counted
    both directions and is shown only as 'clip 2-sided'."""
    from asyncrl.analysis.study_report import cell_diagnostic, markdown

    st = load_study(write(tmp_path, """[[arm]]\npresets=["vaco", "ppo"]"""))
    new_ppo = _rec("ppo", "E", "none", 1, 10.0)
    new_ppo["preset"] = "ppo"
    new_ppo["diagnostics"].update(no_grad_fraction={"mean": 0.04}, clip_fraction_two_sided={"mean": 0.09})
    old = {"filtered_fraction": {"mean": 0.03}, "clip_fraction": {"mean": 0.08}, "entropy": {"mean": 1.0, "last": 1.0}}
    old_ppo = dict(_rec("ppo", "E", "none", 2, 11.0), preset="ppo", diagnostics=dict(old))
    old_vaco = dict(_rec("vaco", "E", "none", 1, 12.0), preset="vaco", diagnostics=dict(old))
    assert cell_diagnostic(new_ppo, "no_grad_fraction") == 0.04
    assert cell_diagnostic(old_ppo, "no_grad_fraction") is None
    assert cell_diagnostic(old_ppo, "clip_fraction_two_sided") == 0.08
    assert cell_diagnostic(old_vaco, "no_grad_fraction") == 0.03
    assert cell_diagnostic(old_vaco, "clip_fraction_two_sided") is None
    recs = [new_ppo, old_ppo, old_vaco]
    for r in recs:
        r.update(code_fingerprint="f", commit="c")
    rows = {r["label"]: r for r in group_rows(st, recs)}
    assert rows["ppo"]["no_grad_fraction"] == 0.04  # the old ppo cell is left out, not mixed in
    assert rows["ppo"]["clip_fraction_two_sided"] == pytest.approx(0.085)
    text = markdown(st, recs, list(rows.values()), [], [], {})
    assert "| no grad | fires | budget | clip 2-sided |" in text and "one definition for every preset" in text


@pytest.mark.parametrize("path", sorted(Path("configs/studies").glob("*.toml")), ids=lambda p: p.name)
def test_shipped_study_files_resolve(path):
    """Every study file in configs/studies loads and every one of its cells resolves to a valid config
    (a preset, key or value a cell would be refused with fails here, not hours into a study)."""
    st = load_study(path)
    assert st.cells
    for c in st.cells:
        assert c.resolved_config()["algo"]["preset"] == c.preset


def test_forward_lag_grid_pairs_the_default_with_the_filter():
    """The forward-lag grid: the two learning rates in two files (the second cut first), the same cells
    otherwise; the default and the filter-primary candidate differ only in the trust region."""
    lo, hi = load_study("configs/studies/forward-lag.toml"), load_study("configs/studies/forward-lag-lr1e-3.toml")
    assert len(lo.cells) == len(hi.cells) == 3 * 2 * 2 * 2 * 2 * 3
    assert {c.resolved_config()["algo"]["lr"] for c in lo.cells} == {3e-4}
    assert {c.resolved_config()["algo"]["lr"] for c in hi.cells} == {1e-3}
    by = {(c.preset, c.env, c.condition, c.seed, c.overrides): c.resolved_config()["algo"] for c in lo.cells}
    for (preset, *rest), algo in by.items():
        if preset == "vaco_no_realign":
            default = by[("decoupled_ppo", *rest)]
            assert {k for k in algo if algo[k] != default[k]} == {"preset", "behavior_band"}
            assert algo["behavior_band"] == float("inf") and default["behavior_band"] == 0.2
