"""One optimizer step of the control learner as one compiled graph: the forward pass, the preset's
loss, its gradient (``torch.func.grad_and_value`` over the flat parameter buffer), the global-norm
clip and Adam's update, fused by ``torch.compile`` (inductor). On this CPU a step of the default
config costs about a quarter of the eager step's time, which is dominated by per-operation overhead
(docs/decisions/learner-compile.md).

The arithmetic is the eager step's (:func:`asyncrl.tasks.control.update._minibatch_loss`,
:func:`asyncrl.core.iteration.optimizer_step` with :class:`asyncrl.core.optim.FlatAdam`) up to float
rounding: the same loss, the same clip, Adam's update (:func:`asyncrl.core.optim.adam_update`), a
step with a non-finite gradient norm skipped and counted. It needs the optimizer's flat buffers
(FlatAdam) and no learner group (whose gradient average happens between backward and clip, eagerly).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable

import torch
from torch.func import functional_call, grad_and_value

from asyncrl.algo.policy_loss import PolicyLoss
from asyncrl.core.iteration import normalize_advantages, policy_loss
from asyncrl.core.optim import FlatAdam, adam_update, clip_global_norm

log = logging.getLogger("asyncrl.learner")

_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # optimizer -> {(cfg, fwd): FusedStep}


class FusedStep:
    """``step(x, actions, behavior_log_prob, target_log_prob, adv, targets, force)`` (flat minibatch
    tensors [M], x [M, D] normalised, actions [M, A]) takes one optimizer step in place on ``policy``
    (whose parameters are views of ``optimizer.flat_params``) and returns (PolicyLoss, value loss,
    entropy, gradient norm before the clip). ``critic``: the loss terms after the policy loss
    (asyncrl.tasks.control.update._with_critic). If the compile fails, a warning, and ``None`` from
    then on: the caller takes the eager step."""

    def __init__(self, policy, optimizer: FlatAdam, cfg, fwd: Callable, critic: Callable):
        self.policy, self.optimizer, self.cfg, self.fwd, self.critic = policy, optimizer, cfg, fwd, critic
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
        group = optimizer.param_groups[0]  # read here: a value read inside the graph becomes a guard
        self.betas, self.eps = tuple(group["betas"]), float(group["eps"])
        self.compiled = torch.compile(self._step, dynamic=False)
        self.broken = False

    @classmethod
    def get(cls, policy, optimizer, cfg, fwd, critic) -> FusedStep | None:
        """The fused step of (policy, optimizer, cfg, fwd), made once; None where it does not apply
        (an optimizer without flat buffers) or its compile failed."""
        if not isinstance(optimizer, FlatAdam):
            return None
        steps = _CACHE.setdefault(optimizer, {})
        key = (cfg, fwd)
        if key not in steps:
            steps[key] = cls(policy, optimizer, cfg, fwd, critic)
        step = steps[key]
        return None if step.broken else step

    def _step(self, flat, exp_avg, exp_avg_sq, count, lr, buffers, x, actions, blp, tlp, adv, targets, force):
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
                adv=normalize_advantages(adv, cfg.normalize_advantages),
                force=force,
            )
            loss, vl, entropy = self.critic(cfg, pl, out, out.values.float(), targets)
            fields = {k: v.detach() for k, v in pl._asdict().items() if v is not None}  # tensors only
            return loss, (fields, vl, entropy)

        grad, (_, (fields, vl, entropy)) = grad_and_value(loss_of, has_aux=True)(flat)
        grad, norm = clip_global_norm(grad, cfg.max_grad_norm, self.sizes)
        ok = torch.isfinite(norm)
        new_count = count + 1
        new_flat, m, v = adam_update(flat, grad, exp_avg, exp_avg_sq, new_count, lr, self.betas, self.eps)
        return (
            torch.where(ok, new_flat, flat),
            torch.where(ok, m, exp_avg),
            torch.where(ok, v, exp_avg_sq),
            torch.where(ok, new_count, count),
            fields,
            vl,
            entropy,
            norm,
            ok,
        )

    def __call__(self, x, actions, blp, tlp, adv, targets, force):
        opt = self.optimizer
        self.lr.fill_(opt.param_groups[0]["lr"])
        args = (opt.flat_params, opt.exp_avg, opt.exp_avg_sq, opt.steps, self.lr, self.buffers)
        args += (x, actions, blp, tlp, adv, targets)
        try:
            flat, m, v, count, fields, vl, entropy, norm, ok = self.compiled(*args, force)
        except Exception as exc:  # noqa: BLE001 - any compiler failure: the eager step is always correct
            self.broken = True
            log.warning(
                "learner: torch.compile of the fused minibatch step failed (%s: %s); taking eager steps "
                "(set learner.compile = false to skip the attempt)",
                type(exc).__name__,
                (str(exc).splitlines() or [""])[0][:200],
            )
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
