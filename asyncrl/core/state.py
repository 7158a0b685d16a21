"""The learner's state: policy, optimizer, normalisers, version and counters; batch assembly
from slots and the learner iteration through the task (asyncrl.tasks.base: control runs
:func:`asyncrl.tasks.control.update.learner_iteration`), and atomic checkpoints. Used by the learner role and
by serial mode alike, for every task kind."""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asyncrl.algo.running_stats import RunningMeanStd
from asyncrl.core import group_sync
from asyncrl.core.config import Config
from asyncrl.core.device import check_device, forward_context, to_device
from asyncrl.core.metrics import RunDirError, write_atomic
from asyncrl.core.optim import make_optimizer
from asyncrl.core.previous_policy import PreviousPolicy
from asyncrl.core.spec import SlotSpec


class NonFiniteError(RuntimeError):
    """The learner's numbers went non-finite: too many optimizer steps in a row skipped for a
    non-finite loss or gradient, or weights / statistics that would be published or checkpointed."""


def nonfinite_entries(tree: Any, prefix: str = "") -> list[tuple[str, int]]:
    """(dotted name, count) of every float tensor or array in a nested dict/list that holds NaN or
    inf values; [] when all are finite."""
    out: list[tuple[str, int]] = []
    if isinstance(tree, dict):
        for k, v in tree.items():
            out += nonfinite_entries(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            out += nonfinite_entries(v, f"{prefix}.{i}")
    elif isinstance(tree, torch.Tensor) and tree.is_floating_point():
        bad = int((~torch.isfinite(tree)).sum())
        if bad:
            out.append((prefix, bad))
    elif isinstance(tree, np.ndarray) and tree.dtype.kind == "f":
        bad = int((~np.isfinite(tree)).sum())
        if bad:
            out.append((prefix, bad))
    elif isinstance(tree, float) and not np.isfinite(tree):
        out.append((prefix, 1))
    return out


class RewardScaler:
    """Scale rewards by the running std of the discounted return, per env stream.

    Each stream (actor id, env index) keeps its own discounted return, reset at episode ends;
    one RunningMeanStd over all streams' returns gives the scale (the "reward scaling" of
    Engstrom et al. 2020, arXiv:2005.12729, as PPO implementations apply it).
    """

    def __init__(self, *, gamma: float, clip: float):
        self.gamma, self.clip = gamma, clip
        self.rms = RunningMeanStd(())
        self.returns: dict[str, np.ndarray] = {}

    def __call__(self, stream: str, rewards: np.ndarray, episode_end: np.ndarray) -> np.ndarray:
        """rewards, episode_end [T, E] -> scaled rewards [T, E] float32."""
        T, E = rewards.shape
        ret = self.returns.setdefault(stream, np.zeros(E, np.float64))
        seen = np.empty((T, E), np.float64)
        for t in range(T):
            ret = ret * self.gamma + rewards[t]
            seen[t] = ret
            ret = np.where(episode_end[t], 0.0, ret)
        self.returns[stream] = ret
        self.rms.update(seen.reshape(-1))
        scaled = rewards / np.sqrt(self.rms.var + 1e-8)
        return np.clip(scaled, -self.clip, self.clip).astype(np.float32)

    def reset(self, stream: str) -> None:
        """Forget ``stream``'s running returns: its next slot starts them at 0, as after an episode
        start. For a gap in the stream (a dropped or rejected slot, a restarted actor), whose
        running return would otherwise carry over steps the scaler never saw."""
        self.returns.pop(stream, None)

    def state_dict(self) -> dict:
        return {"rms": self.rms.state_dict(), "returns": {k: v.tolist() for k, v in self.returns.items()}}

    def load_state_dict(self, d: dict) -> None:
        self.rms.load_state_dict(d["rms"])
        self.returns = {k: np.asarray(v, np.float64) for k, v in d["returns"].items()}


class LearnerState:
    """Everything the learner owns. ``version`` is the policy version the weights carry.
    ``task``: the task interface (:func:`asyncrl.tasks.make_task`). The policy and optimizer
    live on ``learner.device``; batches are made on the CPU and moved there by :meth:`iterate`.
    Raises ConfigError when this machine lacks that device (asyncrl.core.device.check_device)."""

    def __init__(self, cfg: Config, spec: SlotSpec, task):
        self.cfg, self.spec = cfg, spec
        self.task = task
        # ConfigError before anything is built when this machine lacks the device
        self.device = check_device(cfg.learner.device, cfg.learner.precision)
        self.forward_context = forward_context(self.device, cfg.learner.precision)  # bf16 autocast or none
        torch.manual_seed(cfg.run.seed)
        self.policy = self.task.build_policy().to(self.device)  # CPU: the same module, untouched
        # fused: one kernel for all parameters; the per-tensor loop cost ~0.6 ms of a ~3 ms optimizer step here
        # GuardedAdam: a step with a non-finite loss or gradient is skipped and counted, never taken
        # the trainable parameters only (all of them, but for a LoRA adapter on a frozen language model)
        trainable = [p for p in self.policy.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(trainable, lr=cfg.algo.lr, eps=cfg.algo.adam_eps)
        self.generator = torch.Generator().manual_seed(cfg.run.seed)
        self.obs_rms = RunningMeanStd(self.task.obs_shape)
        self.reward_scaler = RewardScaler(gamma=cfg.algo.gamma, clip=cfg.learner.reward_clip)
        self.version = 0
        self.env_steps = 0
        self.iteration = 0
        self.actor_joins: dict[str, int] = {}  # actor id -> times it joined (its next restart count)
        self.resumes = 0  # times this run was resumed from a checkpoint
        self.layout_hash = self.task.layout_hash(self.policy)
        # π_{T-1} for algo.ratio_anchor = previous (asyncrl.core.previous_policy); None for any other anchor
        self.previous = (
            PreviousPolicy(lambda: self.task.build_policy().to(self.device))
            if cfg.algo.ratio_anchor == "previous"
            else None
        )
        # a learner group's leader (rank 0): each iteration's shares go to the other members
        # (asyncrl.core.group_sync); None: one learner
        self.group = None

    def flat_weights(self) -> np.ndarray:
        return self.task.flat_weights(self.policy)

    def make_batch(
        self, slots: Sequence[tuple[str, dict[str, np.ndarray]]], gaps: Sequence[bool] | None = None
    ) -> dict[str, torch.Tensor]:
        """One batch from B slots (stream key, field arrays), copied, so the slots can be freed as
        soon as this returns; ``gaps[i]``: slot i does not follow its stream's previous slot (one
        in between was dropped). Control: [T(+1), B*E, ...] tensors, rewards scaled per stream."""
        return self.task.make_batch(self, slots, gaps)

    def iterate(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        """One learner iteration (the task's) on ``batch`` (as :meth:`make_batch` gives it, moved to
        learner.device here); then the task's other statistics (control: the observation statistics,
        from the CPU batch) are updated and the version advances."""
        a = self.cfg.algo
        if a.anneal_lr:
            frac = max(0.0, 1.0 - self.env_steps / self.cfg.run.total_env_steps)
            for g in self.optimizer.param_groups:
                g["lr"] = a.lr * frac
        skipped_before = self.optimizer.skipped
        own = batch
        if self.group is not None:  # every member gets its share; this one trains on the first
            own = group_sync.send_iteration(
                self.group, batch, lr=self.optimizer.param_groups[0]["lr"], version=self.version
            )
        stats = self.task.learner_iteration(self, to_device(own, self.device))
        stats["skipped_steps"] = self.optimizer.skipped - skipped_before
        limit = self.cfg.learner.max_consecutive_skips
        if self.optimizer.consecutive > limit:
            raise NonFiniteError(
                f"learner: {self.optimizer.consecutive} optimizer steps in a row skipped for a "
                f"non-finite loss or gradient (learner.max_consecutive_skips = {limit}), at "
                f"iteration {self.iteration + 1}"
            )
        self.task.after_iteration(self, batch)  # control: observation statistics
        if self.group is not None:  # the statistics of the whole batch to every member; weights agree
            group_sync.after_iteration(self.group, self.policy)
        bad = nonfinite_entries({"policy": self.policy.state_dict()})
        if bad:  # never published nor checkpointed
            raise NonFiniteError(
                f"learner: non-finite weights after iteration {self.iteration + 1}: "
                + ", ".join(f"{name} ({n})" for name, n in bad[:3])
            )
        self.iteration += 1
        self.version += 1
        stats["lr"] = self.optimizer.param_groups[0]["lr"]
        return stats

    # ---- checkpoints ----
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed learner needs, as tensors and plain Python values (so that
        ``torch.load(weights_only=True)`` reads it back). The tensors are the live ones: copy
        the dict (``copy.deepcopy``) to keep it past the next iteration."""
        return {
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "optimizer_skipped": self.optimizer.skipped,
            "obs_rms": self.obs_rms.state_dict(),
            "reward_scaler": self.reward_scaler.state_dict(),
            "version": self.version,
            "env_steps": self.env_steps,
            "iteration": self.iteration,
            "generator": self.generator.get_state(),
            "config": self.cfg.to_dict(),
            "actor_joins": dict(self.actor_joins),
            "resumes": self.resumes,
            "spec": self.spec.to_dict(),
            "layout_hash": self.layout_hash,
            **({} if self.previous is None else {"previous_policy": self.previous.state_dict()}),
        }

    def save(self, path: str | Path) -> None:
        """Atomic: write to a temporary file in the same directory, then rename.

        Raises NonFiniteError, writing nothing, if any weight, optimizer moment, normaliser or
        reward-scaler statistic is NaN or inf, and metrics.RunDirError if the file cannot be
        written (disk full, read-only); in both cases the previous checkpoint stays."""
        write_checkpoint(path, self.state_dict(), keep=1)

    def load(self, path: str | Path) -> None:
        """Take the state of the checkpoint file ``path``. Raises ValueError for another policy layout."""
        self.load_state_dict(torch.load(path, weights_only=True, map_location=self.device), str(path))

    def load_state_dict(self, d: dict, where: str = "checkpoint") -> None:
        """Inverse of :meth:`state_dict`. Raises ValueError for another policy layout."""
        if d["layout_hash"] != self.layout_hash:
            raise ValueError(f"{where} has layout {d['layout_hash']}, this policy {self.layout_hash}")
        self.policy.load_state_dict(d["policy"])
        self.optimizer.load_state_dict(d["optimizer"])
        self.optimizer.skipped = int(d.get("optimizer_skipped", 0))
        self.obs_rms.load_state_dict(d["obs_rms"])
        self.reward_scaler.load_state_dict(d["reward_scaler"])
        self.generator.set_state(d["generator"])
        self.version, self.env_steps, self.iteration = d["version"], d["env_steps"], d["iteration"]
        self.actor_joins = dict(d.get("actor_joins", {}))
        self.resumes = int(d.get("resumes", 0))
        if self.previous is not None:  # a checkpoint without π_{T-1}: the anchor uses π_T until the next iteration
            self.previous.load_state_dict(d.get("previous_policy"))


CHECKPOINT = "checkpoint.pt"


def checkpoint_files(run_dir: str | Path) -> list[Path]:
    """The checkpoints of a run directory, newest first: checkpoint.pt, checkpoint.1.pt, ..."""
    run_dir = Path(run_dir)
    older = sorted(
        (p for p in run_dir.glob("checkpoint.*.pt") if p.name.split(".")[1].isdigit()),
        key=lambda p: int(p.name.split(".")[1]),
    )
    return ([run_dir / CHECKPOINT] if (run_dir / CHECKPOINT).exists() else []) + older


def write_checkpoint(path: str | Path, state: dict, *, keep: int) -> None:
    """Write ``state`` (a :meth:`LearnerState.state_dict`, perhaps with more keys) to ``path``
    atomically (a temporary file, flushed to disk, then renamed), first shifting the ``keep - 1``
    previous ones to path.1, path.2, ... (``checkpoint.1.pt``); at every moment one complete
    checkpoint exists.

    Raises NonFiniteError, writing nothing, if any weight, optimizer moment, normaliser or
    reward-scaler statistic is NaN or inf, and metrics.RunDirError if it cannot be written (the
    previous checkpoints stay in both cases)."""
    path = Path(path)
    bad = nonfinite_entries({k: state[k] for k in ("policy", "optimizer", "obs_rms", "reward_scaler")})
    if bad:
        raise NonFiniteError(
            "learner: checkpoint not written, non-finite values in " + ", ".join(f"{name} ({n})" for name, n in bad[:3])
        )
    buf = io.BytesIO()
    torch.save(state, buf)
    new = path.with_suffix(path.suffix + ".new")
    try:
        write_atomic(new, buf.getbuffer())  # disk full, read-only: nothing older touched
    except RunDirError as exc:
        raise RunDirError(path, exc) from None
    stem, suffix = path.name[: -len(path.suffix)] if path.suffix else path.name, path.suffix
    older = [path.with_name(f"{stem}.{i}{suffix}") for i in range(1, keep)]
    try:
        for i in range(len(older) - 1, -1, -1):  # .k-1 -> .k, ..., path -> .1
            src = older[i - 1] if i else path
            if src.exists():
                os.replace(src, older[i])
        os.replace(new, path)
    except OSError as exc:
        raise RunDirError(path, exc) from None


def read_checkpoint(run_dir: str | Path) -> tuple[dict, Path, list[str]] | None:
    """The newest checkpoint of ``run_dir`` that reads back whole (``torch.load`` with
    ``weights_only=True``: nothing is unpickled), with its path and one line for each newer one
    skipped (corrupt, cut short, not a learner checkpoint); None if there is none."""
    skipped = []
    for p in checkpoint_files(run_dir):
        try:
            d = torch.load(p, weights_only=True, map_location="cpu")
        except Exception as exc:  # noqa: BLE001 - torch raises many kinds for a damaged file
            skipped.append(f"{p.name}: unreadable ({type(exc).__name__})")
            continue
        if not isinstance(d, dict) or not {"policy", "optimizer", "iteration", "layout_hash"} <= set(d):
            skipped.append(f"{p.name}: not a learner checkpoint")
            continue
        return d, p, skipped
    return None


def checkpoint_record(file: str, snapshot: dict) -> dict:
    """What summary.json says of a checkpoint: its file name (in the run directory), env steps,
    policy version and learner iterations."""
    return {
        "file": file,
        "env_steps": int(snapshot["env_steps"]),
        "version": int(snapshot["version"]),
        "learner_iterations": int(snapshot["iteration"]),
    }


def copied_tree(tree):
    """A copy of a nested dict / list / tuple of tensors, arrays and immutable values (tensors
    cloned): what a snapshot keeps past the next iteration. copy.deepcopy does the same 50x slower."""
    if isinstance(tree, dict):
        return {k: copied_tree(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(copied_tree(v) for v in tree)
    if isinstance(tree, torch.Tensor):
        return tree.detach().clone()
    if isinstance(tree, np.ndarray):
        return tree.copy()
    return tree
