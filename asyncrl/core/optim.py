"""The learner's optimizer: Adam that never takes a non-finite step; and its flat form, whose
parameters, gradients and moments each live in one contiguous buffer, so that zeroing, clipping and
stepping cost a handful of tensor operations however many parameter tensors the network has."""

from __future__ import annotations

import torch


class GuardedAdam(torch.optim.Adam):
    """Adam that skips a step whose gradients are not all finite (a NaN or inf loss, an overflow),
    leaving parameters and moments untouched; ``skipped`` counts skipped steps, ``consecutive``
    the current run of them (reset by the next good step).

    ``step(grad_norm=n)`` takes the gradients' global norm when the caller has it already (as
    :func:`asyncrl.core.iteration.optimizer_step` has from gradient clipping, before the clip): the step is
    skipped when ``n`` is not finite. Without it the norm is computed here."""

    def __init__(self, params, **kwargs):
        super().__init__(params, **kwargs)
        self.skipped = self.consecutive = 0

    def _finite(self, grad_norm: torch.Tensor | None) -> bool:
        if grad_norm is None:
            grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
            grad_norm = torch.nn.utils.get_total_norm(grads) if grads else None
        if grad_norm is not None and not bool(torch.isfinite(grad_norm)):
            self.skipped += 1
            self.consecutive += 1
            return False
        self.consecutive = 0
        return True

    def step(self, closure=None, *, grad_norm: torch.Tensor | None = None):
        if not self._finite(grad_norm):
            return None
        return super().step(closure)


class FlatAdam(GuardedAdam):
    """:class:`GuardedAdam` whose parameters become views of one flat buffer (``flat_params``), as do
    their gradients (``flat_grad``, kept across steps: :meth:`zero_grad` zeroes it in place) and
    Adam's two moments. The update is Adam's (Kingma & Ba 2014, arXiv:1412.6980) as
    ``torch.optim.Adam`` computes it without ``fused``/``foreach``: m ← β₁m + (1-β₁)g,
    v ← β₂v + (1-β₂)g², θ ← θ - (lr / (1-β₁ᵗ)) m / (√v / √(1-β₂ᵗ) + ε), on the whole buffer at once.
    ``state_dict`` has ``torch.optim.Adam``'s layout (per-parameter step, exp_avg, exp_avg_sq), so
    checkpoints move between the two; :meth:`load_state_dict` copies them back into the buffers.

    Needs one parameter group of dense parameters of one dtype and device, without weight decay,
    amsgrad or maximize (ValueError otherwise). Moving the parameters afterwards (``.to``) breaks the
    views: build it on the parameters' final device."""

    def __init__(self, params, *, lr: float, eps: float, betas=(0.9, 0.999)):
        params = list(params)
        super().__init__(params, lr=lr, eps=eps, betas=betas)
        if len(self.param_groups) != 1 or not params:
            raise ValueError("FlatAdam takes one group of parameters")
        ps = self.param_groups[0]["params"]
        if len({(p.dtype, p.device) for p in ps}) != 1 or any(p.is_sparse for p in ps):
            raise ValueError("FlatAdam needs dense parameters of one dtype and device")
        self.flat_params = torch.cat([p.detach().reshape(-1) for p in ps])
        self.flat_grad = torch.zeros_like(self.flat_params)
        self.exp_avg, self.exp_avg_sq = torch.zeros_like(self.flat_params), torch.zeros_like(self.flat_params)
        self.steps = torch.zeros((), dtype=torch.float32)  # Adam's t, shared by every parameter
        offset = 0
        for p in ps:
            n = p.numel()
            p.data = self.flat_params[offset : offset + n].view_as(p)
            p.grad = self.flat_grad[offset : offset + n].view_as(p)
            self.state[p] = {
                "step": self.steps,
                "exp_avg": self.exp_avg[offset : offset + n].view_as(p),
                "exp_avg_sq": self.exp_avg_sq[offset : offset + n].view_as(p),
            }
            offset += n
        self._views = {id(p): p.grad for p in ps}
        self.sizes = [p.numel() for p in ps]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the flat gradient in place (``set_to_none`` is ignored: the gradients stay views of it;
        one that was replaced or set to None is pointed back at its view)."""
        for p in self.param_groups[0]["params"]:
            if p.grad is not self._views[id(p)]:
                p.grad = self._views[id(p)]
        self.flat_grad.zero_()

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` on the flat gradient: the norm before clipping (0-dim)."""
        clipped, norm = clip_global_norm(self.flat_grad, max_norm, self.sizes)
        self.flat_grad.copy_(clipped)
        return norm

    def step(self, closure=None, *, grad_norm: torch.Tensor | None = None):
        if closure is not None:
            raise ValueError("FlatAdam.step takes no closure")
        return self.update(grad_norm)

    @torch.no_grad()
    def update(self, grad_norm: torch.Tensor | None = None) -> None:
        """:meth:`step` without ``torch.optim.Optimizer``'s per-call hooks and profiling wrapper
        (0.1 ms a step here, on a 2 ms step): what the learner calls."""
        g = self.param_groups[0]
        if g["weight_decay"] or g["amsgrad"] or g["maximize"]:
            raise ValueError("FlatAdam: weight decay, amsgrad and maximize are not supported")
        if grad_norm is None:
            grad_norm = torch.linalg.vector_norm(self.flat_grad)
        if not self._finite(grad_norm):
            return None
        self.steps += 1
        p, m, v = adam_update(
            self.flat_params,
            self.flat_grad,
            self.exp_avg,
            self.exp_avg_sq,
            float(self.steps),
            g["lr"],
            g["betas"],
            g["eps"],
        )
        self.flat_params.copy_(p)
        self.exp_avg.copy_(m)
        self.exp_avg_sq.copy_(v)

    def state_dict(self) -> dict:
        """``torch.optim.Adam``'s layout; each parameter's step a tensor of its own (torch's Adam
        increments them one by one), the moments views of the live buffers (as torch's are live)."""
        sd = super().state_dict()  # its per-parameter dicts are the live ones: new dicts, not edits
        sd["state"] = {i: {**s, "step": s["step"].clone()} for i, s in sd["state"].items()}
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        """Adam's state (this class's or ``torch.optim.Adam``'s), copied into the flat buffers."""
        super().load_state_dict(state_dict)
        ps = self.param_groups[0]["params"]
        offset = 0
        steps = 0.0
        for p in ps:
            n, s = p.numel(), self.state.get(p, {})
            for key, buf in (("exp_avg", self.exp_avg), ("exp_avg_sq", self.exp_avg_sq)):
                view = buf[offset : offset + n].view_as(p)
                if key in s:
                    view.copy_(s[key])
                else:
                    view.zero_()
            steps = max(steps, float(s.get("step", 0.0)))
            self.state[p] = {
                "step": self.steps,
                "exp_avg": self.exp_avg[offset : offset + n].view_as(p),
                "exp_avg_sq": self.exp_avg_sq[offset : offset + n].view_as(p),
            }
            offset += n
        self.steps.fill_(steps)


def make_optimizer(params, *, lr: float, eps: float, flat: bool = True) -> GuardedAdam:
    """The learner's optimizer over ``params`` (an iterable of tensors): :class:`FlatAdam` where the
    parameters allow it (``flat``: one dtype and device), else the fused :class:`GuardedAdam`."""
    params = [p for p in params if p.requires_grad]
    if flat and len({(p.dtype, p.device) for p in params}) == 1:
        return FlatAdam(params, lr=lr, eps=eps)
    return GuardedAdam(params, lr=lr, eps=eps, fused=True)


def clip_global_norm(grad: torch.Tensor, max_norm: float, sizes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(``grad`` scaled to a global L2 norm of at most ``max_norm``, its norm before: 0-dim), as
    ``torch.nn.utils.clip_grad_norm_`` computes it on the parameters whose gradients are the
    consecutive chunks of ``sizes`` elements (the norm of their norms; factor
    min(1, max_norm / (norm + 1e-6))), to the bit; ``grad`` is a flat tensor and is not modified."""
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(list(grad.split(sizes)))))
    return grad * torch.clamp(max_norm / (norm + 1e-6), max=1.0), norm


def adam_update(
    params: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    step: float | torch.Tensor,
    lr: float | torch.Tensor,
    betas: tuple[float, float],
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One Adam step (Kingma & Ba 2014, arXiv:1412.6980) in ``torch.optim.Adam``'s arithmetic, out of
    place: (new params, new first moment, new second moment) for the step count ``step`` (1 for
    the first step, after this step's increment). Every tensor is flat and of one shape; ``step``
    and ``lr`` may be 0-dim tensors (in a compiled graph)."""
    b1, b2 = betas
    m = torch.lerp(exp_avg, grad, 1 - b1)
    v = torch.addcmul(exp_avg_sq * b2, grad, grad, value=1 - b2)
    denom = v.sqrt() / (1 - b2**step) ** 0.5 + eps
    step_size = lr / (1 - b1**step)
    if isinstance(step_size, torch.Tensor):  # a tensor step count (a compiled graph): addcdiv takes a number
        return params - step_size * (m / denom), m, v
    return torch.addcdiv(params, m, denom, value=-step_size), m, v
