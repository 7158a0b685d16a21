"""Policy-lag accounting at the learner (all times on the learner's clock, so actors on other
machines need no clock synchronisation).

Backward lag of a sample, in versions: learner version at consumption minus the behaviour version
recorded for that step; in seconds: consumption time minus the publish time of the behaviour
version; both split into propagation, collection and queueing (:mod:`asyncrl.core.lag_parts`).
Outputs in the run directory:
- ``lag.jsonl``: one row per consumed (or dropped) slot and behaviour version: iteration, actor,
  host, version, behavior_version, samples, lag_versions, lag_seconds, dropped, the parts
  (propagation_s, collection_s, queueing_s, grant_wait_s, propagation_versions,
  collection_versions, queueing_versions; null where unknown) and, for consumed slots, the forward
  lag of the iteration that trained on them (forward_steps, forward_tv, forward_s);
- ``lag_histograms.jsonl``: one row per time window (``window_s``) with the histogram of lag in
  versions and in seconds of the samples consumed in it (and TensorBoard histograms under
  ``tb/`` when the ``tensorboard`` package is installed).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from pathlib import Path

import numpy as np

from asyncrl.core.lag_parts import PARTS, SlotTiming, VersionClock, backward_parts
from asyncrl.core.metrics import JsonlWriter, percentiles, tensorboard_kept

PART_KEYS = tuple(f"{p}_{u}" for u in ("s", "versions") for p in PARTS)  # summed for means

# Lag-in-seconds histogram bin edges: 0, then log-spaced 1 ms .. 1000 s.
SECONDS_EDGES = [0.0, *np.logspace(-3, 3, 25).round(6).tolist()]


def seconds_histogram(values, weights) -> list[int]:
    counts, _ = np.histogram(
        np.asarray(values, np.float64), bins=SECONDS_EDGES + [np.inf], weights=np.asarray(weights, np.float64)
    )
    return [int(c) for c in counts]


class LagTracker:
    def __init__(
        self,
        path: str | Path | None,
        *,
        window_s: float = 10.0,
        histogram_path: str | Path | None = None,
        recent: int = 4096,
        tb=None,
    ):
        """``tb``: a TensorBoard SummaryWriter to share (closed by its owner); default: one of its own
        under ``tb/`` beside ``histogram_path`` when tensorboard is installed."""
        self.publish_time: dict[int, float] = {}
        self.clock = VersionClock()  # which version was the newest when (the parts in versions)
        self.part_sums: Counter[str] = Counter()  # whole run: sample-weighted sum of each part
        self.part_samples = 0  # samples whose parts are known
        self.rows = JsonlWriter(path) if path else None
        self.hist_rows = JsonlWriter(histogram_path) if histogram_path else None
        self._own_tb = tb is None
        self.tb = tb if tb is not None else _tensorboard(Path(histogram_path).parent / "tb") if histogram_path else None
        self.version_counts: Counter[int] = Counter()  # whole run: lag in versions -> samples
        self.seconds_ms_counts: Counter[int] = Counter()  # whole run: lag in whole ms -> samples
        self.recent_versions: deque[int] = deque(maxlen=recent)
        self.recent_seconds: deque[float] = deque(maxlen=recent)
        self.dropped_samples = 0
        self.window_s, self.window_start = window_s, time.time()
        self.window_versions: Counter[int] = Counter()
        self.window_seconds: list[tuple[float, int]] = []
        self.windows = 0

    def published(self, version: int, t: float) -> None:
        self.publish_time[version] = t
        self.clock.published(version, t)

    def _rows(self, version, now, actor, host, behavior_version, iteration, dropped, timing=None, forward=None):
        versions, counts = np.unique(behavior_version, return_counts=True)
        for bv, n in zip(versions.tolist(), counts.tolist()):
            published = self.publish_time.get(bv)
            lag_s = now - (now if published is None else published)
            parts = backward_parts(
                behavior_version=bv,
                version=version,
                published_at=published,
                consumed_at=now,
                timing=timing,
                clock=self.clock,
            )
            if self.rows is not None:
                self.rows.write(
                    {
                        "iteration": iteration,
                        "actor": actor,
                        "host": host,
                        "version": version,
                        "behavior_version": bv,
                        "samples": n,
                        "lag_versions": version - bv,
                        "lag_seconds": round(lag_s, 6),
                        "dropped": dropped,
                        **{k: _rounded(v) for k, v in parts.items()},
                        **({} if forward is None else {k: _rounded(v) for k, v in forward.items()}),
                    }
                )
            yield version - bv, lag_s, n, parts

    def dropped(
        self,
        version: int,
        now: float,
        actor: str,
        host: str,
        behavior_version,
        *,
        iteration: int,
        timing: SlotTiming | None = None,
    ) -> int:
        """Record a slot dropped for being over max_policy_lag; returns its sample count."""
        rows = self._rows(version, now, actor, host, behavior_version, iteration, True, timing)
        n = sum(row[2] for row in rows)
        self.dropped_samples += n
        return n

    def consumed(self, version: int, now: float, slots, *, iteration: int, forward: dict | None = None) -> dict:
        """Account one batch consumed at ``now`` by the learner at ``version``. ``slots``: (actor id,
        host, behavior_version [T, E], SlotTiming or None) per slot; ``forward``: the iteration's
        forward lag (:func:`asyncrl.core.lag_parts.forward_lag`), written with each row.
        Returns batch percentiles {lag_versions_p50, _p95, _max, lag_seconds_p50, _p95} and the
        batch's sample-weighted mean of each part (lag_propagation_s_mean, ...; None when unknown)."""
        vals_v, vals_s, weights = [], [], []
        sums, known = Counter(), 0
        for actor, host, behavior_version, timing in slots:
            rows = self._rows(version, now, actor, host, behavior_version, iteration, False, timing, forward)
            for lag_v, lag_s, n, parts in rows:
                if all(parts[k] is not None for k in PART_KEYS):
                    known += n
                    for k in PART_KEYS:
                        sums[k] += parts[k] * n
                vals_v.append(lag_v)
                vals_s.append(lag_s)
                weights.append(n)
                self.version_counts[lag_v] += n
                self.window_versions[lag_v] += n
                self.window_seconds.append((lag_s, n))
                self.seconds_ms_counts[_whole_ms(lag_s)] += n
        for v, s, n in zip(vals_v, vals_s, weights):  # a bounded, sample-weighted recent window
            k = max(1, n // 64)
            self.recent_versions.extend([v] * k)
            self.recent_seconds.extend([s] * k)
        self._maybe_close_window(now)
        self.part_sums.update(sums)
        self.part_samples += known
        v50, v95, vmax = weighted_percentiles(vals_v, weights, (50, 95, 100))
        s50, s95 = weighted_percentiles(vals_s, weights, (50, 95))
        return {
            "lag_versions_p50": v50,
            "lag_versions_p95": v95,
            "lag_versions_max": vmax,
            "lag_seconds_p50": s50,
            "lag_seconds_p95": s95,
            **{f"lag_{k}_mean": (sums[k] / known if known else None) for k in PART_KEYS},
        }

    def _maybe_close_window(self, now: float, force: bool = False) -> None:
        if not self.window_versions or (not force and now - self.window_start < self.window_s):
            return
        secs = [s for s, _ in self.window_seconds]
        w = [n for _, n in self.window_seconds]
        row = {
            "window": self.windows,
            "start": self.window_start,
            "end": now,
            "samples": sum(self.window_versions.values()),
            "lag_versions": {str(k): v for k, v in sorted(self.window_versions.items())},
            "lag_seconds_edges": SECONDS_EDGES,
            "lag_seconds_counts": seconds_histogram(secs, w),
        }
        if self.hist_rows is not None:
            self.hist_rows.write(row)
        tb = self.tb
        if tb is not None:
            expanded = np.repeat(list(self.window_versions), list(self.window_versions.values()))

            def histograms():
                tb.add_histogram("lag/versions", expanded, self.windows)
                tb.add_histogram("lag/seconds", np.repeat(secs, w), self.windows)

            if not tensorboard_kept(histograms):
                self.tb = None
        self.windows += 1
        self.window_start, self.window_versions, self.window_seconds = now, Counter(), []

    def state_dict(self) -> dict:
        """The whole-run accounting (histograms, seconds, dropped samples, window count, recent
        publish times) as plain values, for a checkpoint; the current window is not kept."""
        recent = sorted(self.publish_time)[-256:]
        return {
            "version_counts": {int(k): int(v) for k, v in self.version_counts.items()},
            "seconds_ms_counts": {int(k): int(v) for k, v in self.seconds_ms_counts.items()},
            "recent_versions": list(self.recent_versions),
            "recent_seconds": list(self.recent_seconds),
            "dropped_samples": self.dropped_samples,
            "windows": self.windows,
            "publish_time": {v: self.publish_time[v] for v in recent},
            "part_sums": {k: float(v) for k, v in self.part_sums.items()},
            "part_samples": self.part_samples,
        }

    def load_state_dict(self, d: dict) -> None:
        self.version_counts = Counter({int(k): int(v) for k, v in d["version_counts"].items()})
        if "seconds_ms_counts" in d:
            self.seconds_ms_counts = Counter({int(k): int(v) for k, v in d["seconds_ms_counts"].items()})
        else:  # a checkpoint of before 2026-12-01 kept one value per (slot, version)
            self.seconds_ms_counts = Counter()
            for s, n in zip(d["seconds_values"], d["seconds_weights"]):
                self.seconds_ms_counts[_whole_ms(float(s))] += int(n)
        self.recent_versions.extend(d["recent_versions"])
        self.recent_seconds.extend(d["recent_seconds"])
        self.dropped_samples, self.windows = int(d["dropped_samples"]), int(d["windows"])
        self.publish_time.update({int(k): float(v) for k, v in d["publish_time"].items()})
        for v in sorted(self.publish_time):
            self.clock.published(v, self.publish_time[v])
        self.part_sums = Counter({k: float(v) for k, v in d.get("part_sums", {}).items()})
        self.part_samples = int(d.get("part_samples", 0))  # a checkpoint of before 2026-12-05 kept none

    def recent_percentiles(self) -> tuple:
        """(versions p50, p95, seconds p50, p95) over the recent window."""
        return (*percentiles(self.recent_versions), *percentiles(self.recent_seconds))

    def run_versions_p95(self) -> float | None:
        """The whole run's lag p95 in versions so far (None before any sample): cheap, a few keys."""
        values = sorted(self.version_counts)
        return weighted_percentiles(values, [self.version_counts[v] for v in values], (95,))[0]

    def summary(self) -> dict:
        """Whole-run lag: p50 / p95 in versions and in seconds (the seconds at 1 ms resolution: they
        are kept as counts per whole millisecond, so memory and checkpoints do not grow with the run's
        length), the histogram in versions {lag: samples}, and ``lag_parts_mean``: the sample-weighted
        mean of each part of the lag (propagation_s, ..., queueing_versions; {} when none is known)."""
        values = sorted(self.version_counts)
        weights = [self.version_counts[v] for v in values]
        v50, v95 = weighted_percentiles(values, weights, (50, 95))
        ms = sorted(self.seconds_ms_counts)
        s50, s95 = (
            None if v is None else v / 1000.0
            for v in weighted_percentiles(ms, [self.seconds_ms_counts[m] for m in ms], (50, 95))
        )
        return {
            "lag_p50": v50,
            "lag_p95": v95,
            "lag_seconds_p50": s50,
            "lag_seconds_p95": s95,
            "lag_histogram": {str(v): w for v, w in zip(values, weights)},
            "lag_parts_mean": (
                {k: round(self.part_sums[k] / self.part_samples, 6) for k in PART_KEYS} if self.part_samples else {}
            ),
        }

    def close(self) -> None:
        self._maybe_close_window(time.time(), force=True)
        for w in (self.rows, self.hist_rows):
            if w is not None:
                w.close()
        if self.tb is not None and self._own_tb:
            self.tb.close()


def _rounded(value):
    """Seconds and fractions to 6 decimals for lag.jsonl (integers and None as they are)."""
    return round(value, 6) if isinstance(value, float) else value


def _whole_ms(seconds: float) -> int:
    return int(round(seconds * 1000.0))


def weighted_percentiles(values, weights, qs) -> list[float | None]:
    """Percentiles (0..100) of ``values`` where value i occurs ``weights[i]`` times (inverted CDF)."""
    if len(values) == 0 or sum(weights) == 0:
        return [None for _ in qs]
    order = np.argsort(values, kind="stable")
    v = np.asarray(values, np.float64)[order]
    cdf = np.cumsum(np.asarray(weights, np.float64)[order])
    cdf /= cdf[-1]
    return [float(v[min(np.searchsorted(cdf, q / 100.0 - 1e-12), len(v) - 1)]) for q in qs]


def _tensorboard(logdir: Path):
    """A TensorBoard SummaryWriter when tensorboard is installed, else None."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(logdir))
