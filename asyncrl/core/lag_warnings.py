"""Warnings about lag that a run should not carry in silence, each said once (log and summary.json
``warnings``; the study report flags the cells that have one).

- ``uncorrected_lag``: the preset does not correct backward lag (its advantages are not realigned to
  the learning policy: the default ``decoupled_ppo``, ``ppo``, ``ppo_kl``, ``spo``, ``vaco_no_realign``;
  llm runs without ``llm.realign``), yet the samples trained on so far have a lag p95 of at least
  ``run.lag_warning_p95`` versions.
- ``growing_lag``: the lag grows without bound. At iterations n = 2^j >= 32 the median batch lag p50
  of the latest half of the run is compared with that of the quarter before it: a lag that grows in
  proportion to the run's length (a queue that is never drained) doubles between the two, a bounded
  lag (however large) keeps their ratio near 1. It warns when the ratio is at least 1.5 and the
  latest half's median is at least 2 versions above the quarter's (small integers move by 1 at
  random). The rule compares the run with itself at doubling lengths, so it does not depend on the
  batch size, env or step budget (docs/decisions/lag-warnings.md). The lag controls' own ramp (a
  policy-age buffer or delay of K versions fills over its first K iterations, a replayed trace over
  its largest lag) is over before the compared quarter starts: checks begin at n >= 4 K.
"""

from __future__ import annotations

import logging

import numpy as np

from asyncrl.core.config.field_meta import corrects_backward_lag

log = logging.getLogger("asyncrl.core.lag")

GROWTH_RATIO = 1.5  # between "doubles" (2) and "bounded" (1)
GROWTH_MIN_VERSIONS = 2
FIRST_CHECK = 32  # the first iteration compared (its quarter holds 8 iterations)


def lag_correction(cfg) -> str:
    """'' when the run's preset corrects backward lag; else a few words saying why it does not."""
    if corrects_backward_lag(cfg):
        return ""
    if cfg.task.kind == "llm":
        return f"llm.realign = none (preset {cfg.algo.preset})"
    return f"preset {cfg.algo.preset} does not realign its advantages to the learning policy"


class LagWarnings:
    """The lag warnings of one run: ``check`` after each consumed batch; ``said`` for summary.json."""

    def __init__(self, cfg, *, ramp: int = 0):
        """``ramp``: iterations the run's lag controls take to reach their set lag (K of a policy-age
        buffer or delay; the largest lag of a replayed trace); checks of growth start at 4 x ramp."""
        self.uncorrected = lag_correction(cfg)
        # what corrects it: the llm task realigns with a baseline of pi_T; a control task takes a realigning preset
        self.remedy = (
            "llm.realign = is_baseline corrects it"
            if cfg.task.kind == "llm"
            else "presets that realign them: vaco_no_filter (the default's band with realigned advantages), "
            "vaco; measured here, neither beat the default under lag: docs/decisions/default-preset.md"
        )
        self.first_check = max(FIRST_CHECK, 4 * ramp, 4 * cfg.actor.policy_delay, 4 * cfg.actor.policy_age_buffer)
        self.threshold = cfg.run.lag_warning_p95
        self.batch_p50: list[float] = []  # per consumed batch, the whole run (one float each)
        self.said: list[dict] = []

    def check(self, iteration: int, batch_p50: float | None, run_p95: float | None) -> None:
        """``batch_p50``: this batch's lag p50 (versions); ``run_p95``: the whole run's so far."""
        if batch_p50 is not None:
            self.batch_p50.append(float(batch_p50))
        kinds = {w["kind"] for w in self.said}
        if (
            "uncorrected_lag" not in kinds
            and self.uncorrected
            and self.threshold >= 0
            and run_p95 is not None
            and run_p95 >= self.threshold
        ):
            self._say(
                "uncorrected_lag",
                iteration,
                f"lag p95 {run_p95:g} versions, and {self.uncorrected}: the advantages of stale samples are "
                f"those of older policies ({self.remedy})",
            )
        n = len(self.batch_p50)
        if "growing_lag" not in kinds and n >= self.first_check and n & (n - 1) == 0:
            recent = float(np.median(self.batch_p50[n // 2 :]))
            before = float(np.median(self.batch_p50[n // 4 : n // 2]))
            if recent >= GROWTH_MIN_VERSIONS + before and recent >= GROWTH_RATIO * before:
                self._say(
                    "growing_lag",
                    iteration,
                    f"the median batch lag grew from {before:g} to {recent:g} versions between the quarter of "
                    f"the run before its latest half and that half: it grows with the run (a learner slower than "
                    f"its actors with learner.max_policy_lag = -1?)",
                )

    def _say(self, kind: str, iteration: int, message: str) -> None:
        self.said.append({"kind": kind, "iteration": iteration, "message": message})
        log.warning("lag warning (%s, iteration %d): %s", kind, iteration, message)

    def state_dict(self) -> dict:
        return {"batch_p50": list(self.batch_p50), "said": [dict(w) for w in self.said]}

    def load_state_dict(self, d: dict) -> None:
        self.batch_p50 = [float(x) for x in d.get("batch_p50", [])]
        self.said = [dict(w) for w in d.get("said", [])]
