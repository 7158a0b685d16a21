"""What a study keeps of a finished cell (:func:`cell_record`: scores, curve, lag, diagnostics) and
where it ran (:func:`machine_info`)."""

from __future__ import annotations

import functools
import json
import os
import platform
from pathlib import Path

from asyncrl.analysis.study_file import Cell
from asyncrl.core import provenance

CURVE_POINTS = 200
DIAGNOSTICS = (
    "tv_estimate",
    "no_grad_fraction",
    "clip_fraction_two_sided",
    "approx_kl",
    "entropy",
    "rho_mean",
    "filter_fire_rate",
    "tv_budget_fraction",
    "no_grad_fraction_stale",
    "no_grad_fraction_fresh",
    "explained_variance",
)


def _downsample(points: list, n: int = CURVE_POINTS) -> list:
    if len(points) <= n:
        return points
    idx = sorted({round(i * (len(points) - 1) / (n - 1)) for i in range(n)})
    return [points[i] for i in idx]


def _mean(xs) -> float | None:
    xs = [x for x in xs if x is not None and x == x]
    return sum(xs) / len(xs) if xs else None


LLM_FIELDS = (
    "initial_accuracy",
    "accuracy_difference",
    "accuracy_difference_ci95_paired",
    "eval_problems",
    "eval_mode",
)


def cell_record(cell: Cell, run_dir: Path) -> dict:
    """What the results table keeps of a finished run: scores, curve, lag, diagnostics.

    The score (``final_return``) is summary.json's final average return, or for a language-model
    cell (task.kind = llm) its ``final_accuracy`` on the held-out problems (``score_kind``
    "accuracy"; the accuracy before RL and the paired difference are kept beside it)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    curve = [[r["env_steps"], round(r["wall_time_s"], 2), r.get("average_return")] for r in rows]
    returns = [p[2] for p in curve if p[2] is not None]
    evals = [r["eval_return"] for r in rows if r.get("eval_return") is not None]
    tail = rows[-max(1, len(rows) // 10) :]
    diag = {k: {"mean": _mean(r.get(k) for r in rows), "last": _mean(r.get(k) for r in tail)} for k in DIAGNOSTICS}
    final = summary.get("final_average_return")
    llm = summary.get("task") == "llm"
    if llm:  # the score of a language-model cell is its held-out accuracy after RL (the curve stays mean reward)
        final = summary.get("final_accuracy")
    return {
        "final_return": final,
        "score_kind": "accuracy" if llm else "return",
        **({k: summary.get(k) for k in LLM_FIELDS} if llm else {}),
        "auc": _mean(evals) if evals else _mean(returns),
        "auc_source": "eval_return" if evals else "average_return",
        "env_steps": summary.get("env_steps"),
        "wall_time_s": summary.get("wall_time_s"),
        "env_steps_per_s": summary.get("env_steps_per_s"),
        "learner_iterations": summary.get("learner_iterations"),
        "lag_p50": summary.get("lag_p50"),
        "lag_p95": summary.get("lag_p95"),
        "lag_seconds_p50": summary.get("lag_seconds_p50"),
        "lag_seconds_p95": summary.get("lag_seconds_p95"),
        # the run's lag warnings (asyncrl.core.lag_warnings), by kind; the report flags such cells
        "lag_warnings": sorted({w.get("kind", "?") for w in summary.get("warnings") or [] if isinstance(w, dict)}),
        "diagnostics": diag,
        "curve": _downsample(curve),
        # no finished episode (final None) is not divergence: a NaN score, or a NaN loss of an
        # iteration that stepped the optimizer, is (an llm iteration whose groups were all silent
        # takes no step and reports a NaN loss: llm.silent_groups). metrics.jsonl writes NaN as
        # null (asyncrl.core.metrics.strict_json): a policy_loss key holding null is a NaN loss.
        "diverged": (final is not None and final != final)
        or any(
            "policy_loss" in r and _not_a_number(r["policy_loss"]) and r.get("optimizer_steps", 1) > 0 for r in rows
        ),
    }


def _not_a_number(x) -> bool:
    """True for NaN, and for the null strict JSON writes in its place."""
    return x is None or x != x


def machine_info() -> dict:
    """Where a cell ran: host name, CPU model and count, the CPU kernels torch picks, Python and the
    versions of the packages that matter (serial cells repeat bit for bit on one CPU model and kernel
    set, not across them)."""
    return {
        "host": platform.node(),
        "cpu_model": provenance.cpu_model(),
        "cpu_kernels": cpu_kernels(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "packages": _versions(),
    }


@functools.cache
def cpu_kernels() -> str | None:
    """The vector kernels torch's CPU ops use here ("AVX512", "AVX2", "DEFAULT", ...): the CPU's best,
    or the one the ATEN_CPU_CAPABILITY environment variable names (the cells inherit it). Each gives
    other float rounding, so a serial cell repeats bit for bit only under the same kernels. None when
    torch cannot say."""
    try:
        import torch

        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # noqa: BLE001 - provenance only; never fails a study
        return None


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for pkg in ("torch", "numpy", "gymnasium", "mujoco", "pyzmq"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out
