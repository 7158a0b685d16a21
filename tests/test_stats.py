"""asyncrl.analysis.stats against hand computations and against scipy called directly (STUDY.md)."""

import math

import numpy as np
import pytest
from scipy import stats as st

from asyncrl.analysis import stats


def test_iqm_of_a_hand_made_input():
    # 8 scores: trim 2 at each end
    x = [100.0, 1.0, 6.0, 3.0, -50.0, 5.0, 4.0, 2.0]  # sorted: -50 1 2 3 4 5 6 100
    assert stats.iqm(x) == pytest.approx((2 + 3 + 4 + 5) / 4, abs=0)
    assert stats.iqm([7.0]) == 7.0
    with pytest.raises(ValueError, match="no scores"):
        stats.iqm([])


def test_aggregate_equals_scipy_bootstrap_called_directly():
    rng = np.random.default_rng(3)
    per_task = {"a": rng.normal(0, 1, 7), "b": rng.normal(5, 2, 6)}
    got = stats.aggregate(per_task, "iqm", resamples=2000, seed=11)
    samples = (per_task["a"], per_task["b"])
    ref = st.bootstrap(
        samples,
        lambda *xs: st.trim_mean(np.concatenate(xs), 0.25),
        paired=False,
        vectorized=False,
        n_resamples=2000,
        confidence_level=0.95,
        method="percentile",
        random_state=np.random.default_rng(11),
    )
    assert got.value == pytest.approx(st.trim_mean(np.concatenate(samples), 0.25), rel=1e-12)
    assert (got.low, got.high) == (ref.confidence_interval.low, ref.confidence_interval.high)
    assert got.low < got.value < got.high


def test_stratified_resampling_keeps_each_task_size():
    # a statistic that counts the resample's members from task "b" is constant under stratification
    per_task = {"a": [0.0, 0.0, 0.0], "b": [1.0, 1.0]}
    assert stats.aggregate(per_task, "mean", resamples=500) == (0.4, 0.4, 0.4)


def test_probability_of_improvement_hand_computed_and_against_scipy():
    x = {"e1": [3.0, 5.0], "e2": [1.0, 1.0, 2.0]}
    y = {"e1": [4.0, 1.0, 5.0], "e2": [1.0, 0.0]}
    # e1: pairs (3>4 no, 3>1 yes, 3=5 no | 5>4 yes, 5>1 yes, 5=5 tie) -> (3 + 0.5) / 6
    # e2: (1=1 tie, 1>0) x2, (2>1, 2>0) -> (1+0.5 + 1+0.5 + 2) / 6
    want = ((3 + 0.5) / 6 + (5 / 6)) / 2
    got = stats.probability_of_improvement(x, y, resamples=1000, seed=2)
    assert got.value == pytest.approx(want, abs=1e-12)
    # each task's P(X > Y) is scipy's Mann-Whitney U / (n m)
    u1 = st.mannwhitneyu(x["e1"], y["e1"]).statistic / 6
    u2 = st.mannwhitneyu(x["e2"], y["e2"]).statistic / 6
    assert got.value == pytest.approx((u1 + u2) / 2, abs=1e-12)
    assert 0.0 <= got.low <= got.value <= got.high <= 1.0


def test_too_few_runs_give_nan_bounds_and_bad_input_raises():
    iv = stats.aggregate({"a": [1.0], "b": [2.0, 3.0]}, "median")
    assert iv.value == 2.0 and math.isnan(iv.low) and math.isnan(iv.high)
    with pytest.raises(ValueError, match="unknown statistic"):
        stats.aggregate({"a": [1.0, 2.0]}, "mode")
    with pytest.raises(ValueError, match="share no task"):
        stats.probability_of_improvement({"a": [1.0]}, {"b": [1.0]})
    with pytest.raises(ValueError, match="equal"):
        stats.normalized(1.0, random=2.0, reference=2.0)
    assert stats.normalized(3.0, random=1.0, reference=5.0) == 0.5
