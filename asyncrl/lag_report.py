"""``asyncrl lag RUN_DIR``: the policy-lag report of a run (from lag.jsonl and metrics.jsonl).

Backward lag in versions and seconds (count, mean, p50, p90, p99, max) overall, per actor and per
host, the samples dropped by ``max_policy_lag``, and forward lag (tv_estimate and filtered / clip
fraction per optimizer step). ``--plot`` draws histograms and time series with matplotlib.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from .lag import weighted_percentiles

QS = (50, 90, 99)


class ReportError(ValueError):
    """The run directory is missing or holds no lag records."""


def _read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue                      # a line cut short by a killed process
    return rows


def _stats(values, weights) -> dict:
    n = int(sum(weights))
    if n == 0:
        return {"count": 0}
    v, w = np.asarray(values, np.float64), np.asarray(weights, np.float64)
    p50, p90, p99, pmax = weighted_percentiles(values, weights, (*QS, 100))
    return {"count": n, "mean": float((v * w).sum() / w.sum()), "p50": p50, "p90": p90, "p99": p99, "max": pmax}


def build_report(run_dir: str | Path) -> dict:
    """The report as a dict. Raises ReportError if ``run_dir`` has no lag.jsonl rows."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportError(f"no run directory {run_dir}")
    rows = _read_jsonl(run_dir / "lag.jsonl")
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
            key: {"lag_versions": _stats([r["lag_versions"] for r in rs], [r["samples"] for r in rs]),
                  "lag_seconds": _stats([r["lag_seconds"] for r in rs], [r["samples"] for r in rs])}
            for key, rs in sorted(by_key.items())}
    dropped = [r for r in rows if r.get("dropped")]
    report["dropped"] = {"samples": int(sum(r["samples"] for r in dropped)),
                         "per_actor": {a: int(sum(r["samples"] for r in dropped if r["actor"] == a))
                                       for a in sorted({r["actor"] for r in dropped})}}
    metrics = _read_jsonl(run_dir / "metrics.jsonl")
    steps = [mb for m in metrics for mb in m.get("minibatches", [])]
    if steps:
        report["forward_lag"] = {
            "optimizer_steps": len(steps),
            "tv_estimate": _stats([s[1] for s in steps], [1] * len(steps)),
            "filtered_fraction_mean": float(np.mean([s[2] for s in steps])),
            "clip_fraction_mean": float(np.mean([s[3] for s in steps])),
        }
    return report


def format_report(report: dict) -> str:
    head = f"{'':<24} {'samples':>10} {'mean':>8} {'p50':>8} {'p90':>8} {'p99':>8} {'max':>8}"

    def line(label, s, unit_fmt):
        if s["count"] == 0:
            return f"{label:<24} {0:>10}"
        return (f"{label:<24} {s['count']:>10,} " +
                " ".join(unit_fmt.format(s[k]) for k in ("mean", "p50", "p90", "p99", "max")))

    out = [f"policy lag report: {report['run_dir']}"]
    for metric, title, fmt in (("lag_versions", "backward lag, versions", "{:>8.2f}"),
                               ("lag_seconds", "backward lag, seconds", "{:>8.3f}")):
        out += ["", title, head]
        for group in ("overall", "per_actor", "per_host"):
            for key, stats in report[group].items():
                label = key if group == "overall" else f"{group[4:]} {key}"
                out.append(line(label, stats[metric], fmt))
    d = report["dropped"]
    out += ["", f"dropped by max_policy_lag: {d['samples']:,} samples"
            + (" (" + ", ".join(f"{a}: {n:,}" for a, n in d["per_actor"].items()) + ")" if d["per_actor"] else "")]
    f = report.get("forward_lag")
    if f:
        t = f["tv_estimate"]
        out += [f"forward lag over {f['optimizer_steps']:,} optimizer steps: tv_estimate mean {t['mean']:.3f} "
                f"p50 {t['p50']:.3f} p99 {t['p99']:.3f} max {t['max']:.3f}; filtered fraction mean "
                f"{f['filtered_fraction_mean']:.3f}; clip fraction mean {f['clip_fraction_mean']:.3f}"]
    return "\n".join(out)


def plot_report(run_dir: str | Path, path: str | Path) -> None:
    """PNG: lag histograms (versions, seconds), lag over time, tv_estimate and filtered fraction
    over time. Raises ImportError with install advice when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("plotting needs matplotlib: .venv/bin/pip install 'asyncrl[plot]' "
                          "(or pip install matplotlib)") from None
    run_dir = Path(run_dir)
    rows = [r for r in _read_jsonl(run_dir / "lag.jsonl") if not r.get("dropped")]
    metrics = _read_jsonl(run_dir / "metrics.jsonl")
    fig, ax = plt.subplots(2, 2, figsize=(12, 8))
    actors = sorted({r["actor"] for r in rows})
    top = max((r["lag_versions"] for r in rows), default=0)
    for a in actors:
        rs = [r for r in rows if r["actor"] == a]
        ax[0, 0].hist([r["lag_versions"] for r in rs], weights=[r["samples"] for r in rs],
                      bins=np.arange(-0.5, top + 1.5), alpha=0.6, label=a)
        secs = [max(r["lag_seconds"], 1e-4) for r in rs]
        lo = np.log10(max(min((max(r["lag_seconds"], 1e-4) for r in rows), default=1e-4), 1e-4)) - 0.1
        hi = np.log10(max((r["lag_seconds"] for r in rows), default=1.0) + 1e-4) + 0.1
        ax[0, 1].hist(secs, weights=[r["samples"] for r in rs], bins=np.logspace(lo, hi, 40), alpha=0.6, label=a)
    ax[0, 0].set(xlabel="backward lag (versions)", ylabel="samples", title="lag in versions")
    ax[0, 1].set(xscale="log", xlabel="backward lag (seconds, learner clock)", ylabel="samples", title="lag in seconds")
    by_iter = defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        acc = by_iter[r["iteration"]]
        acc[0] += r["lag_versions"] * r["samples"]
        acc[1] += r["lag_seconds"] * r["samples"]
        acc[2] += r["samples"]
    its = sorted(by_iter)
    ax[1, 0].plot(its, [by_iter[i][0] / by_iter[i][2] for i in its], label="versions (left)")
    ax2 = ax[1, 0].twinx()
    ax2.plot(its, [by_iter[i][1] / by_iter[i][2] for i in its], color="C1", label="seconds (right)")
    ax[1, 0].legend(handles=ax[1, 0].get_lines() + ax2.get_lines(), fontsize=8)
    ax[1, 0].set(xlabel="learner iteration", ylabel="mean lag (versions)", title="lag over time")
    ax2.set_ylabel("mean lag (seconds)")
    ax[1, 1].plot([m["iteration"] for m in metrics], [m.get("tv_estimate") for m in metrics], label="tv_estimate")
    ax[1, 1].plot([m["iteration"] for m in metrics], [m.get("filtered_fraction") for m in metrics],
                  label="filtered fraction")
    ax[1, 1].plot([m["iteration"] for m in metrics], [m.get("clip_fraction") for m in metrics], label="clip fraction")
    ax[1, 1].set(xlabel="learner iteration", title="forward lag (iteration means)")
    for a in (ax[0, 0], ax[0, 1], ax[1, 1]):
        a.legend(fontsize=8)
    fig.suptitle(f"policy lag: {run_dir.name}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
