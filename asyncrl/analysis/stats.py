"""Aggregate learning results as asyncrl's STUDY.md asks: IQM and median with stratified bootstrap
confidence intervals, and the probability of improvement, after Agarwal et al. 2021 ("Deep RL at
the Edge of the Statistical Precipice", NeurIPS; arXiv:2108.13264, the rliable library).

The resampling is scipy's (:func:`scipy.stats.bootstrap`, percentile method, as rliable's default):
given one sample per task (env), scipy resamples each sample independently, which is exactly the
bootstrap stratified by task. Scores are plain floats (returns, or normalised scores).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
from scipy import stats as _st

CONFIDENCE = 0.95
RESAMPLES = 2000


class Interval(NamedTuple):
    """A point estimate and its confidence interval (NaN bounds when there is too little data)."""

    value: float
    low: float
    high: float


def iqm(x) -> float:
    """Interquartile mean: the mean of the middle 50 % of ``x`` (1-D, any length >= 1), as
    rliable's ``metrics.aggregate_iqm`` (scipy.stats.trim_mean with 25 % cut at each end).

    Raises:
        ValueError: ``x`` is empty.
    """
    x = np.asarray(x, np.float64).reshape(-1)
    if x.size == 0:
        raise ValueError("iqm of no scores")
    return float(_st.trim_mean(x, 0.25))


STATISTICS = {"iqm": iqm, "median": lambda x: float(np.median(x)), "mean": lambda x: float(np.mean(x))}


def _samples(scores_by_task: Mapping[str, Sequence[float]]) -> list[np.ndarray]:
    out = [np.asarray(v, np.float64).reshape(-1) for _, v in sorted(scores_by_task.items())]
    if not out or any(s.size == 0 for s in out):
        raise ValueError("every task needs at least one score")
    return out


def aggregate(
    scores_by_task: Mapping[str, Sequence[float]],
    statistic: str = "iqm",
    *,
    resamples: int = RESAMPLES,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> Interval:
    """``statistic`` ("iqm", "median" or "mean") of all runs pooled over tasks, with a
    ``confidence`` stratified-bootstrap percentile interval (runs resampled within each task).

    Args:
        scores_by_task: task name -> scores of its runs (one per seed).
    Returns:
        :class:`Interval`; low/high are NaN when some task has fewer than 2 runs.
    Raises:
        ValueError: no tasks, a task without scores, or an unknown statistic.
    """
    if statistic not in STATISTICS:
        raise ValueError(f"unknown statistic {statistic!r}; one of {sorted(STATISTICS)}")
    fn = STATISTICS[statistic]
    samples = _samples(scores_by_task)
    value = fn(np.concatenate(samples))
    if min(s.size for s in samples) < 2:
        return Interval(value, float("nan"), float("nan"))
    res = _st.bootstrap(
        tuple(samples),
        lambda *xs: fn(np.concatenate(xs)),
        paired=False,
        vectorized=False,
        n_resamples=resamples,
        confidence_level=confidence,
        method="percentile",
        random_state=np.random.default_rng(seed),
    )
    return Interval(value, float(res.confidence_interval.low), float(res.confidence_interval.high))


def _poi(*pairs: np.ndarray) -> float:
    """Mean over tasks of P(X > Y) + 0.5 P(X = Y); ``pairs`` is (x_1, y_1, x_2, y_2, ...)."""
    out = []
    for x, y in zip(pairs[0::2], pairs[1::2]):
        gt = (x[:, None] > y[None, :]).mean()
        eq = (x[:, None] == y[None, :]).mean()
        out.append(gt + 0.5 * eq)
    return float(np.mean(out))


def probability_of_improvement(
    x_by_task: Mapping[str, Sequence[float]],
    y_by_task: Mapping[str, Sequence[float]],
    *,
    resamples: int = RESAMPLES,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> Interval:
    """P(X > Y): the probability that a run of method X scores above a run of method Y on the same
    task, averaged over the tasks both have (rliable's ``probability_of_improvement``, the
    Mann-Whitney U statistic over n*m), with a stratified-bootstrap percentile interval.

    Raises:
        ValueError: the two share no task, or a shared task lacks scores.
    """
    tasks = sorted(set(x_by_task) & set(y_by_task))
    if not tasks:
        raise ValueError("the two methods share no task")
    pairs: list[np.ndarray] = []
    for t in tasks:
        pairs += _samples({"x": x_by_task[t]}) + _samples({"y": y_by_task[t]})
    value = _poi(*pairs)
    if min(p.size for p in pairs) < 2:
        return Interval(value, float("nan"), float("nan"))
    res = _st.bootstrap(
        tuple(pairs),
        _poi,
        paired=False,
        vectorized=False,
        n_resamples=resamples,
        confidence_level=confidence,
        method="percentile",
        random_state=np.random.default_rng(seed),
    )
    return Interval(value, float(res.confidence_interval.low), float(res.confidence_interval.high))


def normalized(score: float, *, random: float, reference: float) -> float:
    """(score - random) / (reference - random). Raises ValueError when reference == random."""
    if reference == random:
        raise ValueError(f"reference and random returns are equal ({reference})")
    return (score - random) / (reference - random)
