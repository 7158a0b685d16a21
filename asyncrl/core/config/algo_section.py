"""The ``[algo]`` config section: the preset (advantage estimator and policy loss, arXiv:2603.01365 for
VACO), returns, V-trace, the TV filter and VACO's options, the PPO-family coefficients, optimisation;
each field with its default and metadata (:mod:`.field_meta`), the conditions of the V-trace keys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from asyncrl.core.config.field_meta import (
    CONTROL,
    LLM_PRESETS,
    NOT_IMPALA,
    PRESETS,
    REALIGNING,
    TV_FILTERED,
    VACO_FAMILY,
    VTRACE_PRESETS,
    _f,
)

if TYPE_CHECKING:
    from asyncrl.core.config.root import Config


def _computes_vtrace(c: Config) -> bool:
    return c.task.kind == "control" and (c.algo.preset in VTRACE_PRESETS or c.algo.value_targets == "vtrace")


def _filter_rule(c: Config) -> bool:
    return c.algo.tv_rule == "filter"


def _uses_rho_bar(c: Config) -> bool:
    return _computes_vtrace(c) or (c.task.kind == "llm" and c.llm.realign != "none")


@dataclass(frozen=True)
class AlgoConfig:
    # Preset: which advantage estimator and policy loss (arXiv:2603.01365; docs/vaco-paper.md,
    # "Baselines and ablations").
    preset: str = _f(
        "decoupled_ppo",
        "advantage estimator and policy loss: " + ", ".join(PRESETS) + "; llm tasks: " + ", ".join(LLM_PRESETS),
    )
    gamma: float = _f(0.99, "discount factor", kinds=CONTROL)
    gae_lambda: float = _f(0.95, "lambda of GAE / V-trace traces", kinds=CONTROL)
    rho_bar: float = _f(
        1.0,
        "V-trace clip of the importance weight in the value targets",
        when=(
            "V-trace is computed (vtrace presets or value_targets = vtrace), or llm.realign = is_baseline",
            _uses_rho_bar,
        ),
    )
    c_bar: float = _f(
        1.0,
        "V-trace clip of the trace coefficients: of the critic's V-trace targets, and of the realigned advantages "
        "under traces = vtrace",
        kinds=CONTROL,
        when=(
            "V-trace is computed with traces = vtrace, or for the critic's targets",
            lambda c: _computes_vtrace(c) and (c.algo.traces == "vtrace" or c.algo.value_targets != "lambda_returns"),
        ),
    )
    traces: str = _f(
        "uncorrected",
        "trace coefficients of the realigned advantages: vtrace (c_t = lambda min(c_bar, rho_t)) or uncorrected (c_t "
        "= lambda; the TD errors keep their rho_bar-clipped weights); the critic's V-trace targets always use "
        "V-trace's (docs/decisions/traces.md)",
        kinds=CONTROL,
        when=("V-trace is computed (vtrace presets or value_targets = vtrace)", _computes_vtrace),
    )
    value_targets: str = _f(
        "auto",
        "critic regression target: auto (the preset's: V-trace's vs where the advantages are realigned, GAE's "
        "lambda-returns otherwise), vtrace or lambda_returns (any preset but impala); docs/decisions/value-targets.md",
        kinds=CONTROL,
        presets=NOT_IMPALA,
    )
    realign_min_lag: int = _f(
        0,
        "realigning presets, control task: realign only the samples at least this many versions behind the learner; "
        "the others get GAE on beta's data (and lambda-return targets under value_targets auto), as vaco_no_realign; "
        "0: every sample (docs/decisions/realign-min-lag.md)",
        kinds=CONTROL,
        presets=REALIGNING,
        study_only=True,
    )
    tv_threshold: float = _f(
        0.1,
        "delta, the TV budget of a minibatch: the estimate of TV(pi_theta, anchor), importance-weighted by "
        "pi_T/beta for the learning anchor, that tv_rule spends (docs/decisions/tv-budget.md)",
        presets=TV_FILTERED,
    )
    tv_rule: str = _f(
        "filter",
        "how the TV budget acts: filter (the paper's: the sign rule once tv > delta) or shrink (the band's "
        "half-width is behavior_band (1 - tv/delta)_+: closed, the sign rule on every sample, at tv >= delta); "
        "docs/decisions/tv-budget.md",
        presets=TV_FILTERED,
    )
    ratio_anchor: str = _f(
        "learning",
        "policy-ratio anchor of vaco's surrogate, its band and TV filter: learning (pi_T, the default), behavior "
        "(beta, the paper's reading) or previous (per sample the newer of beta and pi_{T-1}, the policy one version "
        "before pi_T: PPO's clip at lag 0-1, decoupled PPO centred one version back at older lag; control only); "
        "docs/decisions/learning-anchor.md",
        presets=VACO_FAMILY,
    )
    surrogate_rho_bar: float = _f(
        1.0,
        "bound on the importance weight anchor/beta in the surrogate (learning or previous anchor); inf: none",
        presets=VACO_FAMILY,
        when=("ratio_anchor = learning or previous", lambda c: c.algo.ratio_anchor != "behavior"),
    )
    tv_filter_trigger: str = _f(
        "minibatch",
        "when the TV filter acts: minibatch (each minibatch over delta) or iteration (from the first one on)",
        presets=TV_FILTERED,
        when=("tv_rule = filter", _filter_rule),
        study_only=True,
    )
    tv_filter_min_deviation: float = _f(
        0.0,
        "the TV filter's sign rule applies only to samples with |r - 1| above this",
        presets=TV_FILTERED,
        when=("tv_rule = filter", _filter_rule),
        study_only=True,
    )
    behavior_band: float = _f(
        float("inf"),
        "vaco's surrogate: detach samples whose ratio (behavior_band_ratio) left [1-band, 1+band] in the direction of "
        "their advantage "
        "(PPO-clip's mask, per sample); inf: off; decoupled_ppo (the default) and vaco_no_filter pin 0.2: "
        "docs/decisions/behavior-band.md",
        presets=VACO_FAMILY,
    )
    behavior_band_ratio: str = _f(
        "forward",
        "which ratio behavior_band bounds: forward (pi_theta/anchor: pi_theta/pi_T with the learning anchor, "
        "decoupled PPO's clip), full (pi_theta/beta, PPO's clip) or backward (pi_T/beta, fixed per iteration; "
        "learning anchor only)",
        presets=VACO_FAMILY,
        when=("behavior_band < inf", lambda c: c.algo.behavior_band < float("inf")),
    )
    tv_filter_ratio_cap: float = _f(
        1.0,
        "the sign rule also applies, whatever the TV estimate, to samples with |r - 1| above this (1: a sample "
        "may at most double its probability before it loses its gradient); inf: never",
        presets=TV_FILTERED,
        when=("tv_rule = filter", _filter_rule),
    )
    clip_eps: float = _f(0.2, "ppo: ratio clip epsilon", presets=("ppo", "grpo"))
    kl_coef: float = _f(1.0, "ppo_kl: KL penalty coefficient", presets=("ppo_kl",))
    spo_eps: float = _f(0.2, "spo: ratio epsilon", presets=("spo",))
    value_coef: float = _f(0.5, "value-loss weight", kinds=CONTROL)
    entropy_coef: float = _f(0.0, "entropy-bonus weight (docs/decisions/entropy-coef.md)", kinds=CONTROL)
    normalize_advantages: bool = _f(True, "normalise advantages per minibatch", kinds=CONTROL, presets=NOT_IMPALA)
    num_epochs: int = _f(10, "epochs over each batch", presets=NOT_IMPALA)
    num_minibatches: int = _f(8, "minibatches per epoch (8 of 256: docs/decisions/minibatches.md)")
    lr: float = _f(3e-4, "Adam learning rate")
    anneal_lr: bool = _f(True, "anneal the learning rate linearly to 0 over run.total_env_steps")
    adam_eps: float = _f(1e-5, "Adam epsilon")
    max_grad_norm: float = _f(0.5, "clip the gradient norm to this")
