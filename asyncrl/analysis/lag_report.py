"""``asyncrl lag RUN_DIR``: the policy-lag report of a run (from lag.jsonl and metrics.jsonl).

Backward lag in versions and seconds (count, mean, p50, p90, p99, max) overall, per actor and per
host, where it comes from (the mean per sample of its parts: propagation, collection, queueing, in
seconds and versions; asyncrl.core.lag_parts), the samples dropped by ``max_policy_lag``, and forward
lag (tv_estimate and filtered / clip fraction per optimizer step). ``--plot`` draws histograms, time
series and the parts with matplotlib.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from asyncrl.core.lag import PART_KEYS, weighted_percentiles
from asyncrl.core.metrics import is_event, read_jsonl

QS = (50, 90, 99)


class ReportError(ValueError):
    """The run directory is missing or holds no lag records."""


_read_jsonl = read_jsonl


def _stats(values, weights) -> dict:
    n = int(sum(weights))
    if n == 0:
        return {"count": 0}
    v, w = np.asarray(values, np.float64), np.asarray(weights, np.float64)
    p50, p90, p99, pmax = weighted_percentiles(values, weights, (*QS, 100))
    return {"count": n, "mean": float((v * w).sum() / w.sum()), "p50": p50, "p90": p90, "p99": p99, "max": pmax}


def lag_parts(rows: list[dict]) -> dict:
    """Sample-weighted means of the parts of the lag over lag.jsonl ``rows`` whose parts are known:
    {"samples", "propagation_s", "collection_s", "queueing_s", "grant_wait_s", "propagation_versions",
    "collection_versions", "queueing_versions"}; {"samples": 0} when none is (older runs)."""
    known = [r for r in rows if all(r.get(k) is not None for k in PART_KEYS)]
    n = sum(r["samples"] for r in known)
    if not n:
        return {"samples": 0}
    out = {"samples": int(n)}
    for k in (*PART_KEYS, "grant_wait_s"):
        have = [r for r in known if r.get(k) is not None]
        w = sum(r["samples"] for r in have)
        out[k] = sum(r[k] * r["samples"] for r in have) / w if w else None
    return out


def build_report(run_dir: str | Path) -> dict:
    """The report as a dict. Raises ReportError if ``run_dir`` has no lag.jsonl rows."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportError(f"no run directory {run_dir}")
    rows = [r for r in _read_jsonl(run_dir / "lag.jsonl") if not is_event(r)]  # resume records
    if not rows:
        raise ReportError(f"{run_dir}: no lag records (lag.jsonl missing, empty or unreadable)")
    fields = ("actor", "host", "samples", "lag_versions", "lag_seconds", "iteration")
    bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict) or any(k not in r for k in fields)), None)
    if bad is not None:
        raise ReportError(f"{run_dir}/lag.jsonl: record {bad + 1} lacks one of {', '.join(fields)}")
    consumed = [r for r in rows if not r.get("dropped")]
    groups = {"overall": {"all": consumed}, "per_actor": defaultdict(list), "per_host": defaultdict(list)}
    for r in consumed:
        groups["per_actor"][r["actor"]].append(r)
        groups["per_host"][r["host"]].append(r)
    report: dict = {"run_dir": str(run_dir)}
    for name, by_key in groups.items():
        report[name] = {
            key: {
                "lag_versions": _stats([r["lag_versions"] for r in rs], [r["samples"] for r in rs]),
                "lag_seconds": _stats([r["lag_seconds"] for r in rs], [r["samples"] for r in rs]),
                "parts": lag_parts(rs),
            }
            for key, rs in sorted(by_key.items())
        }
    dropped = [r for r in rows if r.get("dropped")]
    report["dropped"] = {
        "samples": int(sum(r["samples"] for r in dropped)),
        "per_actor": {
            a: int(sum(r["samples"] for r in dropped if r["actor"] == a)) for a in sorted({r["actor"] for r in dropped})
        },
    }
    metrics = _read_jsonl(run_dir / "metrics.jsonl")
    steps = [mb for m in metrics for mb in m.get("minibatches", [])]
    if steps:
        report["forward_lag"] = {
            "optimizer_steps": len(steps),
            "tv_estimate": _stats([s[1] for s in steps], [1] * len(steps)),
            # rows of older runs had 4 columns [step, tv, filtered, clip]: another definition
            "no_grad_fraction_mean": (
                float(np.mean([s[2] for s in steps if len(s) == 3])) if any(len(s) == 3 for s in steps) else None
            ),
        }
    return report


def format_report(report: dict) -> str:
    head = f"{'':<24} {'samples':>10} {'mean':>8} {'p50':>8} {'p90':>8} {'p99':>8} {'max':>8}"

    def line(label, s, unit_fmt):
        if s["count"] == 0:
            return f"{label:<24} {0:>10}"
        return f"{label:<24} {s['count']:>10,} " + " ".join(
            unit_fmt.format(s[k]) for k in ("mean", "p50", "p90", "p99", "max")
        )

    out = [f"policy lag report: {report['run_dir']}"]
    for metric, title, fmt in (
        ("lag_versions", "backward lag, versions", "{:>8.2f}"),
        ("lag_seconds", "backward lag, seconds", "{:>8.3f}"),
    ):
        out += ["", title, head]
        for group in ("overall", "per_actor", "per_host"):
            for key, stats in report[group].items():
                label = key if group == "overall" else f"{group[4:]} {key}"
                out.append(line(label, stats[metric], fmt))
    out += ["", "where the lag comes from: mean per sample, seconds (versions)"]
    out.append(f"{'':<24} {'samples':>10} {'propagation':>17} {'collection':>17} {'queueing':>17} {'grant wait':>11}")
    for group in ("overall", "per_actor", "per_host"):
        for key, stats in report[group].items():
            p = stats.get("parts", {"samples": 0})
            label = key if group == "overall" else f"{group[4:]} {key}"
            if not p["samples"]:
                out.append(f"{label:<24} {'not recorded':>10}")
                continue
            cells = [
                f"{p[f'{k}_s']:>8.3f} ({p[f'{k}_versions']:>5.2f})" for k in ("propagation", "collection", "queueing")
            ]
            wait = "" if p["grant_wait_s"] is None else f"{p['grant_wait_s']:>11.3f}"
            out.append(f"{label:<24} {p['samples']:>10,} " + " ".join(f"{c:>17}" for c in cells) + f" {wait}")
    d = report["dropped"]
    out += [
        "",
        f"dropped by max_policy_lag: {d['samples']:,} samples"
        + (" (" + ", ".join(f"{a}: {n:,}" for a, n in d["per_actor"].items()) + ")" if d["per_actor"] else ""),
    ]
    f = report.get("forward_lag")
    if f:
        t = f["tv_estimate"]
        out += [
            f"forward lag over {f['optimizer_steps']:,} optimizer steps: tv_estimate mean {t['mean']:.3f} "
            f"p50 {t['p50']:.3f} p99 {t['p99']:.3f} max {t['max']:.3f}; no_grad_fraction mean "
            + ("n/a" if f["no_grad_fraction_mean"] is None else f"{f['no_grad_fraction_mean']:.3f}")
        ]
    return "\n".join(out)


def plot_report(run_dir: str | Path, path: str | Path) -> None:
    """PNG (asyncrl.analysis.lag_plot.plot_lag): lag histograms in versions and seconds, lag over time, the
    tv_estimate against the TV budget δ, and no_grad_fraction. Raises ImportError with
    install advice when matplotlib is missing, OSError when ``path`` cannot be written."""
    from asyncrl.analysis.lag_plot import plot_lag
    from asyncrl.analysis.plots import tv_budget

    run_dir = Path(run_dir)
    rows = [
        r
        for r in _read_jsonl(run_dir / "lag.jsonl")
        if isinstance(r, dict) and not r.get("dropped") and not is_event(r)
    ]
    metrics = [m for m in _read_jsonl(run_dir / "metrics.jsonl") if isinstance(m, dict) and "iteration" in m]
    delta = None
    try:
        cfg = json.loads((run_dir / "config.json").read_text())
        delta = tv_budget(cfg)
    except (OSError, json.JSONDecodeError, AttributeError):
        pass
    plot_lag(rows, metrics, path, title=f"policy lag: {run_dir.name}", tv_threshold=delta)
