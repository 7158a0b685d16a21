"""The checks a slot passes before the learner trains on it (an actor's, received over shared memory
or TCP, and serial mode's own): finite and bounded floats, one behaviour version within the
learner's, the task's value ranges and, for a granted slot, every row tagged with its grant."""

from __future__ import annotations

import math

import numpy as np

from asyncrl.core.spec import MAX_ABS_FLOAT, SlotSpec

# log(probability) <= 0; float32 rounding of an honest log-softmax stays far below this
MAX_LOG_PROBABILITY = 1e-4


class SlotError(ValueError):
    """A slot's contents must not be trained on. ``reason``: a short code for counting
    ("nonfinite", "magnitude", "log_prob", "version", "action", "revoked_writer", "foreign_rows")."""

    def __init__(self, reason: str, detail: str, *, ahead: int | None = None):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.ahead = ahead  # "version": the slot's one behaviour version when it is above the learner's


def check_slot(arrays: dict[str, np.ndarray], spec: SlotSpec, *, version: int, grant_id: int | None = None) -> None:
    """Raise SlotError unless one slot's arrays (fields of ``spec``) can be trained on: every float
    field finite (obs, rewards, log-probs, final_obs, continuous actions; "nonfinite") and within
    +-``MAX_ABS_FLOAT`` ("magnitude": 1e15, the bound of every float in a header), one behaviour version in
    0..``version`` for the whole slot, the task's value ranges (``spec.invalid_values``: discrete
    actions within 0..action_dim-1, token ids within the vocabulary), and (when
    ``grant_id`` is given) every row tagged with that grant (``foreign_rows``; spec.py). Behaviour
    log-probabilities (discrete actions, tokens: ``spec.log_probabilities``) above
    MAX_LOG_PROBABILITY are refused ("log_prob"); a continuous action's log-density may be positive."""
    for f in spec.fields:
        if f.dtype.kind == "f" and arrays[f.name].size:
            a = arrays[f.name]
            low, high = float(a.min()), float(a.max())  # NaN anywhere makes both NaN
            peak = max(-low, high)
            if not math.isfinite(peak):
                bad = int(a.size - np.count_nonzero(np.isfinite(a)))
                raise SlotError("nonfinite", f"{f.name} holds {bad} NaN/inf values")
            if peak > MAX_ABS_FLOAT:
                big = int(np.count_nonzero(np.abs(a) > MAX_ABS_FLOAT))
                raise SlotError("magnitude", f"{f.name} holds {big} values beyond +-{MAX_ABS_FLOAT:g}")
            if f.name == "behavior_log_prob" and high > MAX_LOG_PROBABILITY and spec.log_probabilities:
                raise SlotError("log_prob", f"behaviour log-probabilities up to {high:g}: a probability above 1")
    v = arrays["behavior_version"]
    if v.min() < 0 or v.max() > version:
        ahead = int(v.max()) if v.min() == v.max() > version else None
        raise SlotError("version", f"behaviour versions {v.min()}..{v.max()} outside 0..{version}", ahead=ahead)
    if v.min() != v.max():  # one rollout, one policy version: what makes max_policy_lag exact
        raise SlotError("version", f"a slot mixes behaviour versions {v.min()}..{v.max()}")
    bad = spec.invalid_values(arrays)  # the task's own ranges (control: discrete action indices)
    if bad is not None:
        raise SlotError(*bad)
    if grant_id is not None and not own_rows(arrays, grant_id):
        n = int(np.count_nonzero(arrays["grant_id"] != grant_id))
        raise SlotError("foreign_rows", f"{n} entries of the rollout are tagged with another grant than {grant_id}")


def own_rows(arrays: dict[str, np.ndarray], grant_id: int) -> bool:
    """True if every row of the slot is tagged with ``grant_id`` (``arrays["grant_id"]`` [T, E])."""
    return bool((arrays["grant_id"] == grant_id).all())
