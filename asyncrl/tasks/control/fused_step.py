"""One optimizer step of the control learner as one compiled graph: the forward pass, the preset's
loss, its gradient (``torch.func.grad_and_value`` over the flat parameter buffer), the global-norm
clip and Adam's update, fused by ``torch.compile`` (inductor). On this CPU a step of the default
config costs about a quarter of the eager step's time, which is dominated by per-operation overhead
(docs/decisions/learner-compile.md).

The arithmetic is the eager step's (:func:`asyncrl.tasks.control.update._minibatch_loss`,
:func:`asyncrl.core.iteration.optimizer_step` with :class:`asyncrl.core.optim.FlatAdam`) up to float
rounding: the same loss, the same clip, Adam's update (:func:`asyncrl.core.optim.adam_update`), a
step with a non-finite gradient norm skipped and counted. It needs the optimizer's flat buffers
(FlatAdam). A learner group's member takes two graphs with its collectives between them, eager: the
advantages normalised over the group's union, the gradient, its average over the group, then the
clip and the update; a preset whose TV filter decides on the group's estimate mid-loss (vaco,
vaco_paper, vaco_no_realign) takes the eager step in a group.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable

import torch
from torch.func import functional_call, grad_and_value

from asyncrl.algo.policy_loss import PolicyLoss
from asyncrl.core.config.field_meta import TV_FILTERED
from asyncrl.core.iteration import normalize_advantages, policy_loss
from asyncrl.core.learner_group import GroupError
from asyncrl.core.optim import FlatAdam, adam_update, clip_global_norm

log = logging.getLogger("asyncrl.learner")

_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # optimizer -> {(cfg, fwd): FusedStep}
_THREAD = threading.local()  # inductor's config is per thread (torch 2.13): set once in each that compiles


def _compile_in_process() -> None:
    """Kernels compiled in this process: no pool of compile-worker processes beside each learner (the
    graphs are small; a pool costs a process per core and outlives nothing it helps). Inductor's config
    is thread-local, so this runs in every thread that may compile (the warm-up's, the learner's)."""
    if "TORCHINDUCTOR_COMPILE_THREADS" in os.environ or getattr(_THREAD, "done", False):
        return
    import torch._inductor.config as inductor_config

    inductor_config.compile_threads = 1
    _THREAD.done = True


class FusedStep:
    """``step(x, actions, behavior_log_prob, target_log_prob, adv, targets, force)`` (flat minibatch
    tensors [M], x [M, D] normalised, actions [M, A]) takes one optimizer step in place on ``policy``
    (whose parameters are views of ``optimizer.flat_params``) and returns (PolicyLoss, value loss,
    entropy, gradient norm before the clip). ``critic``: the loss terms after the policy loss
    (asyncrl.tasks.control.update._with_critic). If the compile fails, a warning, and ``None`` from
    then on: the caller takes the eager step."""

    def __init__(self, policy, optimizer: FlatAdam, cfg, fwd: Callable, critic: Callable, group=None):
        self.policy, self.optimizer, self.cfg, self.fwd, self.critic = policy, optimizer, cfg, fwd, critic
        self.group = group
        by_id = {id(p): name for name, p in policy.named_parameters()}
        params = optimizer.param_groups[0]["params"]
        if any(id(p) not in by_id for p in params):
            raise ValueError("FusedStep: the optimizer holds a tensor that is not a parameter of the policy")
        self.names = [by_id[id(p)] for p in params]
        self.shapes = [p.shape for p in params]
        self.sizes = [p.numel() for p in params]
        # the live buffers (observation statistics, updated in place between iterations) and the
        # learning rate as a tensor (annealed between iterations: a new value, not a new graph)
        self.buffers = dict(policy.named_buffers())
        self.lr = torch.zeros((), dtype=optimizer.flat_params.dtype)
        group_ = optimizer.param_groups[0]  # read here: a value read inside the graph becomes a guard
        self.betas, self.eps = tuple(group_["betas"]), float(group_["eps"])
        if group is None:  # one graph
            self.compiled = torch.compile(self._step, dynamic=False)
        else:  # a group member: the gradient, then (eagerly) its average over the group, then the update
            self.grad_compiled = torch.compile(self._grad, dynamic=False)
            self.update_compiled = torch.compile(self._update, dynamic=False)
        self.broken = False

    @classmethod
    def get(cls, policy, optimizer, cfg, fwd, critic, group=None) -> FusedStep | None:
        """The fused step of (policy, optimizer, cfg, fwd, group), made once; None where it does not
        apply (an optimizer without flat buffers; in a group, a preset whose TV filter decides on the
        group's estimate mid-loss) or its compile failed."""
        if not isinstance(optimizer, FlatAdam) or (group is not None and cfg.preset in TV_FILTERED):
            return None
        steps = _CACHE.setdefault(optimizer, {})
        key = (cfg, fwd, id(group))
        if key not in steps:
            steps[key] = cls(policy, optimizer, cfg, fwd, critic, group)
        step = steps[key]
        return None if step.broken else step

    def _grad(self, flat, buffers, x, actions, blp, tlp, adv, targets, force, normalize: bool):
        """(gradient of the minibatch's loss w.r.t. the flat parameters, the PolicyLoss's tensors,
        value loss, entropy); ``normalize``: the advantages are normalised here (else they come so)."""
        cfg = self.cfg

        def loss_of(flat):
            params = {n: c.view(s) for n, c, s in zip(self.names, flat.split(self.sizes), self.shapes)}
            with self.fwd():
                out = functional_call(self.policy, {**params, **buffers}, (x,), {"normalized": True})
                log_prob = out.dist.log_prob(actions)
            pl = policy_loss(
                cfg,
                log_prob=log_prob.float(),
                behavior_log_prob=blp,
                target_log_prob=tlp,
                adv=normalize_advantages(adv, cfg.normalize_advantages) if normalize else adv,
                force=force,
            )
            loss, vl, entropy = self.critic(cfg, pl, out, out.values.float(), targets)
            fields = {k: v.detach() for k, v in pl._asdict().items() if v is not None}  # tensors only
            return loss, (fields, vl, entropy)

        grad, (_, (fields, vl, entropy)) = grad_and_value(loss_of, has_aux=True)(flat)
        return grad, fields, vl, entropy

    def _update(self, flat, grad, exp_avg, exp_avg_sq, count, lr):
        """The clip, the skip of a non-finite step and Adam's update: (flat, m, v, count, norm, ok)."""
        grad, norm = clip_global_norm(grad, self.cfg.max_grad_norm, self.sizes)
        ok = torch.isfinite(norm)
        new_count = count + 1
        new_flat, m, v = adam_update(flat, grad, exp_avg, exp_avg_sq, new_count, lr, self.betas, self.eps)
        return (
            torch.where(ok, new_flat, flat),
            torch.where(ok, m, exp_avg),
            torch.where(ok, v, exp_avg_sq),
            torch.where(ok, new_count, count),
            norm,
            ok,
        )

    def _step(self, flat, exp_avg, exp_avg_sq, count, lr, buffers, x, actions, blp, tlp, adv, targets, force):
        grad, fields, vl, entropy = self._grad(flat, buffers, x, actions, blp, tlp, adv, targets, force, True)
        return (*self._update(flat, grad, exp_avg, exp_avg_sq, count, lr), fields, vl, entropy)

    def _run(self, opt, x, actions, blp, tlp, adv, targets, force):
        state = (opt.flat_params, opt.exp_avg, opt.exp_avg_sq, opt.steps, self.lr)
        if self.group is None:
            return self.compiled(*state, self.buffers, x, actions, blp, tlp, adv, targets, force)
        adv = normalize_advantages(adv, self.cfg.normalize_advantages, self.group)  # over the group's union
        grad, fields, vl, entropy = self.grad_compiled(
            opt.flat_params, self.buffers, x, actions, blp, tlp, adv, targets, force, False
        )
        self.group.average_gradients([], flat=grad)
        return (*self.update_compiled(*state[:1], grad, *state[1:]), fields, vl, entropy)

    def _failed(self, exc: Exception) -> None:
        self.broken = True
        log.warning(
            "learner: torch.compile of the fused minibatch step failed (%s: %s); taking eager steps "
            "(set learner.compile = false to skip the attempt)",
            type(exc).__name__,
            (str(exc).splitlines() or [""])[0][:200],
        )

    def warm_up(self, rows: int, obs_dim: int, action_tail: tuple[int, ...], action_dtype, force) -> bool:
        """Compile the graph(s) of a minibatch of ``rows`` samples (observations [rows, obs_dim],
        actions [rows, *action_tail] of ``action_dtype``; ``force`` as the iteration passes it) on
        placeholder data, before the first iteration, so that it takes no compile. The graphs are pure:
        the optimizer's buffers, the policy and the learning rate are read, never written, and the
        results are dropped (a group member's collectives do not run). True when the graphs are ready;
        False (a warning, eager steps from then on) when the compile failed."""
        _compile_in_process()
        opt, dev = self.optimizer, self.optimizer.flat_params.device
        x = torch.zeros(rows, obs_dim, device=dev)
        actions = torch.zeros(rows, *action_tail, dtype=action_dtype, device=dev)
        blp, tlp, adv, targets = (torch.zeros(rows, device=dev) for _ in range(4))  # four tensors: no aliasing
        state = (opt.flat_params, opt.exp_avg, opt.exp_avg_sq, opt.steps, self.lr)
        try:
            if self.group is None:
                self.compiled(*state, self.buffers, x, actions, blp, tlp, adv, targets, force)
            else:
                grad = self.grad_compiled(state[0], self.buffers, x, actions, blp, tlp, adv, targets, force, False)[0]
                self.update_compiled(state[0], grad, *state[1:])
        except Exception as exc:  # noqa: BLE001 - any compiler failure: the eager step is always correct
            self._failed(exc)
            return False
        return True

    def __call__(self, x, actions, blp, tlp, adv, targets, force):
        opt = self.optimizer
        _compile_in_process()
        self.lr.fill_(opt.param_groups[0]["lr"])
        try:
            flat, m, v, count, norm, ok, fields, vl, entropy = self._run(opt, x, actions, blp, tlp, adv, targets, force)
        except GroupError:
            raise
        except Exception as exc:  # noqa: BLE001 - any compiler failure: the eager step is always correct
            self._failed(exc)
            return None
        with torch.no_grad():
            opt.flat_params.copy_(flat)
            opt.exp_avg.copy_(m)
            opt.exp_avg_sq.copy_(v)
            opt.steps.copy_(count)
        if bool(ok):
            opt.consecutive = 0
        else:
            opt.skipped += 1
            opt.consecutive += 1
        return PolicyLoss(**fields), vl, entropy, norm
