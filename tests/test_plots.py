"""asyncrl.analysis.plots and `asyncrl plot`: the expected series, group means with a t-interval band,
legend colours matching the lines; `asyncrl lag --plot` panels."""

import json
import subprocess
import sys

import matplotlib
import numpy as np
import pytest
from click.testing import CliRunner
from scipy import stats

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from asyncrl.analysis import plots  # noqa: E402
from asyncrl.analysis.lag_report import plot_report  # noqa: E402
from asyncrl.cli import main, write_config_json  # noqa: E402
from asyncrl.core import config
from asyncrl.run.serial import run_serial  # noqa: E402

SMALL = [
    "env.num_envs=2",
    "env.rollout_length=16",
    "learner.slots_per_batch=2",
    "learner.num_slots=2",
    "algo.num_minibatches=4",
    "algo.num_epochs=2",
    "run.num_actors=2",
    "run.log_every_s=1000",
    "env.id=asyncrl/Corridor-v0",
    "env.max_episode_steps=12",
]


@pytest.fixture
def figures(monkeypatch):
    """The figures the plotting functions close, kept open for inspection."""
    kept = []
    real_close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: kept.append(fig))
    yield kept
    for f in kept:
        real_close(f)


def _series(label, group, steps, rets):
    return {
        "label": label,
        "group": group,
        "env_steps": steps,
        "wall_time_s": [s / 1000 for s in steps],
        "return": rets,
    }


def test_mean_ci_is_the_t_interval_on_a_common_grid():
    xs = [[0, 10, 20], [0, 10, 20, 30], [5, 15, 25]]
    ys = [[0, 1, 2], [0, 2, 4, 6], [1, 1, 1]]
    grid, mean, low, high = plots.mean_ci(xs, ys, points=11)
    assert grid[0] == 5 and grid[-1] == 20 and len(grid) == 11  # the range all three cover
    at = np.stack([np.interp(grid, x, y) for x, y in zip(xs, ys)])
    np.testing.assert_allclose(mean, at.mean(0))
    lo, hi = stats.t.interval(0.95, df=2, loc=at.mean(0), scale=stats.sem(at, axis=0))
    np.testing.assert_allclose(low, lo)
    np.testing.assert_allclose(high, hi)
    g1, m1, l1, h1 = plots.mean_ci([[0, 1]], [[3, 4]])
    assert l1 is None and h1 is None and list(m1) == [3, 4]  # one curve: no band
    with pytest.raises(plots.PlotError):
        plots.mean_ci([[0, 1], [5, 6]], [[0, 1], [0, 1]])  # no common x range


def test_plot_curves_draws_groups_and_singles_with_matching_legend(tmp_path, figures):
    series = [
        _series("vaco s1", "vaco", [0, 100, 200], [0, 10, 20]),
        _series("vaco s2", "vaco", [0, 100, 200], [0, 20, 40]),
        _series("ppo s1", None, [0, 100, 200], [5, 5, None]),
    ]
    out = plots.plot_curves(series, tmp_path / "c.png", title="t")
    assert out.stat().st_size > 10_000 and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fig = figures[0]
    steps_ax, wall_ax = fig.axes[:2]
    assert steps_ax.get_xlabel() == "env steps" and wall_ax.get_xlabel() == "wall-clock time (s)"
    assert steps_ax.get_ylabel() == "average return"
    texts = [t.get_text() for t in fig.legends[0].texts]
    assert texts == ["ppo s1", "vaco (mean of 2, 95% CI)"]
    lines = steps_ax.get_lines()
    single = next(ln for ln in lines if len(ln.get_xdata()) == 2)  # the None point is skipped
    assert list(single.get_ydata()) == [5, 5]
    group = next(ln for ln in lines if len(ln.get_xdata()) == plots.GRID_POINTS)
    np.testing.assert_allclose(group.get_ydata()[-1], 30)  # mean of 20 and 40
    assert len(steps_ax.collections) == 1  # one band, the group's
    for handle, line in zip(fig.legends[0].legend_handles, (single, group)):
        assert handle.get_color() == line.get_color()
    assert steps_ax.collections[0].get_facecolor()[0][:3] == pytest.approx(matplotlib.colors.to_rgb(group.get_color()))
    assert fig.legends[0].get_bbox_to_anchor() is not None


def test_plot_curves_refuses_empty_input(tmp_path):
    with pytest.raises(plots.PlotError):
        plots.plot_curves([], tmp_path / "x.png")
    with pytest.raises(plots.PlotError):
        plots.plot_curves([_series("a", None, [1], [None])], tmp_path / "x.png")


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    dirs = []
    for seed in (1, 2):  # vaco: its TV budget adds the δ line the default (decoupled_ppo, no budget) lacks
        res = config.load_resolved(None, SMALL + ["algo.preset=vaco", f"run.seed={seed}", "run.eval_every=128"])
        cfg = res.config
        d = root / f"s{seed}"
        d.mkdir()
        write_config_json(d, res)
        run_serial(cfg, d, max_iterations=4, echo=lambda *_: None)
        dirs.append(d)
    return dirs


def test_plot_command_groups_runs_by_config_key(two_runs, tmp_path, figures):
    out = tmp_path / "p.png"
    res = CliRunner().invoke(main, ["plot", *map(str, two_runs), "--out", str(out), "--group-by", "algo.preset"])
    assert res.exit_code == 0, res.output
    assert out.exists() and "plot of 2 runs" in res.stdout
    fig = figures[0]
    assert [t.get_text() for t in fig.legends[0].texts] == ["algo.preset=vaco (mean of 2, 95% CI)"]
    titles = [a.get_title() for a in fig.axes]
    assert titles == [
        "return vs env steps",
        "return vs wall-clock time",
        "forward lag: TV estimate",
        "samples without gradient (no_grad_fraction)",
        "backward lag in versions",
        "backward lag in seconds",
    ]
    assert fig.axes[0].get_ylabel() == "evaluation return (mean action)"  # eval returns where recorded
    deltas = [ln for ln in fig.axes[2].get_lines() if list(ln.get_ydata()) == [0.1, 0.1]]
    assert len(deltas) == 1  # the TV budget line


def test_plot_command_labels_and_train_returns(two_runs, tmp_path, figures):
    out = tmp_path / "p.png"
    res = CliRunner().invoke(
        main, ["plot", *map(str, two_runs), "--out", str(out), "--label", "a", "--label", "b", "--returns", "train"]
    )
    assert res.exit_code == 0, res.output
    fig = figures[0]
    assert [t.get_text() for t in fig.legends[0].texts] == ["a", "b"]
    assert fig.axes[0].get_ylabel() == "average training return (last 20 episodes)"
    rows = [json.loads(x) for x in (two_runs[0] / "metrics.jsonl").read_text().splitlines()]
    line = fig.axes[0].get_lines()[0]
    expect = [(r["env_steps"], r["average_return"]) for r in rows if r["average_return"] is not None]
    assert list(zip(line.get_xdata(), line.get_ydata())) == expect


@pytest.mark.parametrize(
    "args, words",
    [
        (["/nonexistent/run"], "no run directory /nonexistent/run"),
        (["{run}", "--label", "a", "--label", "b"], "--label given 2 times for 1 run directories"),
        (["{run}", "--group-by", "preset"], "--group-by expects section.key"),
        (["{run}", "--group-by", "algo.nope"], "has no such key in its config.json"),
        (["{empty}"], "no metrics"),
    ],
)
def test_plot_bad_input_one_line(two_runs, tmp_path, args, words):
    args = [a.format(run=two_runs[0], empty=tmp_path) for a in args]
    p = subprocess.run(
        [sys.executable, "-m", "asyncrl", "plot", *args, "--out", str(tmp_path / "x.png")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in p.stderr, p.stderr


def test_lag_plot_panels(two_runs, tmp_path, figures):
    out = tmp_path / "lag.png"
    plot_report(two_runs[0], out)
    assert out.exists()
    fig = figures[0]
    hist_v, hist_s, over_v, over_s, tv, frac, parts_s, parts_v = fig.axes
    assert hist_v.get_yscale() == "log" and hist_s.get_yscale() == "log" and hist_s.get_xscale() == "log"
    assert [len(over_v.get_lines()), len(over_s.get_lines())] == [2, 2]  # one per actor, own panels
    texts = [t.get_text() for t in fig.legends[0].texts]
    assert texts[:2] == ["actor0", "actor1"] and "TV budget δ = 0.1" in texts
    assert not any("two-sided" in t for t in texts)  # vaco has no PPO clip: not drawn
    # bars of the two actors sit side by side, in the legend's colours
    bars0, bars1 = hist_v.containers
    assert bars0[0].get_x() < bars1[0].get_x()
    assert bars0[0].get_facecolor() == fig.legends[0].legend_handles[0].get_facecolor()
    # where the lag comes from: one stacked bar per actor, three parts, in seconds and in versions
    assert [t.get_text() for t in parts_s.get_yticklabels()] == ["actor0", "actor1"]
    assert len(parts_s.containers) == len(parts_v.containers) == 3
    assert {"propagation", "collection", "queueing"} <= set(texts)
