"""Policy-lag accounting at the learner (all times on the learner's clock, so actors on other
machines need no clock synchronisation).

Backward lag of a sample, in versions: learner version at consumption minus the behaviour version
recorded for that step; in seconds: consumption time minus the publish time of the behaviour
version. One JSONL row per consumed slot keeps the whole distribution per actor and host.
"""
from __future__ import annotations

from collections import Counter, deque
from pathlib import Path

import numpy as np

from .metrics import JsonlWriter, percentiles


class LagTracker:
    def __init__(self, path: str | Path, recent: int = 4096):
        self.publish_time: dict[int, float] = {}
        self.rows = JsonlWriter(path)
        self.version_counts: Counter[int] = Counter()        # whole run: lag in versions -> samples
        self.recent_versions: deque[int] = deque(maxlen=recent)
        self.recent_seconds: deque[float] = deque(maxlen=recent)
        self.all_seconds: list[float] = []

    def published(self, version: int, t: float) -> None:
        self.publish_time[version] = t

    def consumed(self, version: int, now: float, slots, *, iteration: int) -> dict:
        """Account one batch. ``slots``: (actor id, host, behavior_version [T, E]) per slot.
        Returns batch percentiles {lag_versions_p50, _p95, _max, lag_seconds_p50, _p95}."""
        batch_v, batch_s = [], []
        for actor_id, host, behavior_version in slots:
            versions, counts = np.unique(behavior_version, return_counts=True)
            for bv, n in zip(versions.tolist(), counts.tolist()):
                lag_v = version - bv
                lag_s = now - self.publish_time.get(bv, now)
                self.version_counts[lag_v] += n
                batch_v += [lag_v] * n
                batch_s += [lag_s] * n
                self.rows.write({"iteration": iteration, "actor": actor_id, "host": host, "version": version,
                                 "behavior_version": bv, "samples": n, "lag_versions": lag_v,
                                 "lag_seconds": round(lag_s, 6)})
        # one representative per slot keeps the recent window cheap and unbiased across slots
        self.recent_versions.extend(batch_v[:: max(1, len(batch_v) // 256)])
        self.recent_seconds.extend(batch_s[:: max(1, len(batch_s) // 256)])
        self.all_seconds.extend(batch_s[:: max(1, len(batch_s) // 64)])
        v50, v95, vmax = percentiles(batch_v, (50, 95, 100))
        s50, s95 = percentiles(batch_s, (50, 95))
        return {"lag_versions_p50": v50, "lag_versions_p95": v95, "lag_versions_max": vmax,
                "lag_seconds_p50": s50, "lag_seconds_p95": s95}

    def recent_percentiles(self) -> tuple:
        """(versions p50, p95, seconds p50, p95) over the recent window."""
        return (*percentiles(self.recent_versions), *percentiles(self.recent_seconds))

    def summary(self) -> dict:
        values = np.array(sorted(self.version_counts), np.float64)
        weights = np.array([self.version_counts[int(v)] for v in values], np.float64)
        if weights.sum() == 0:
            return {"lag_p50": None, "lag_p95": None, "lag_seconds_p50": None, "lag_seconds_p95": None}
        cdf = np.cumsum(weights) / weights.sum()
        q = lambda p: float(values[np.searchsorted(cdf, p)])  # noqa: E731
        s50, s95 = percentiles(self.all_seconds, (50, 95))
        return {"lag_p50": q(0.5), "lag_p95": q(0.95), "lag_seconds_p50": s50, "lag_seconds_p95": s95,
                "lag_histogram": {str(int(v)): int(w) for v, w in zip(values, weights)}}

    def close(self) -> None:
        self.rows.close()
