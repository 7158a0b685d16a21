"""The results of a study: one table (results.json, results.csv), aggregates (asyncrl.analysis.stats: IQM
and median with stratified bootstrap CIs, probability of improvement), report.md and PNG curves.

Scores: ``final_return`` (average return of the last 20 episodes at the budget, summary.json's
figure) and ``auc`` (mean of the return curve over its evaluation points). Across envs a score is
normalised as (score - random) / (reference - random), the random-policy return measured here and
the reference fixed in the study file (STUDY.md).
"""

from __future__ import annotations

import csv
import json
import statistics
import time
from collections import Counter, defaultdict
from pathlib import Path

from asyncrl.analysis import stats
from asyncrl.analysis.study import Study
from asyncrl.core.metrics import strict_json
from asyncrl.core.wording import count_of

CELL_DIAGNOSTICS = (
    "tv_estimate",
    "no_grad_fraction",
    "filter_fire_rate",
    "tv_budget_fraction",
    "clip_fraction_two_sided",
    "approx_kl",
)
CSV_FIELDS = (
    "study",
    "label",
    "env",
    "preset",
    "condition",
    "seed",
    "mode",
    "status",
    "final_return",
    "auc",
    "env_steps",
    "wall_time_s",
    "env_steps_per_s",
    "lag_p50",
    "lag_p95",
    "lag_seconds_p50",
    "lag_seconds_p95",
    *CELL_DIAGNOSTICS,
    "entropy_last",
    "load_start",
    "load_end",
    "commit",
    "code_fingerprint",
    "key",
    "overrides",
)


def random_returns(study: Study, out: Path) -> dict[str, float]:
    """The random-policy return of every env of the study that has a reference return (the only ones
    normalised), measured once and kept in random.json."""
    from asyncrl.tasks.control.envs import random_policy_return

    path = out / "random.json"
    known = json.loads(path.read_text()) if path.exists() else {}
    for env in sorted({c.env for c in study.cells} & set(study.reference)):  # only normalised envs need it
        if env not in known or known[env].get("episodes") != study.random_episodes:
            known[env] = {
                "return": random_policy_return(env, episodes=study.random_episodes, seed=0),
                "episodes": study.random_episodes,
                "seed": 0,
            }
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(strict_json(known, indent=1) + "\n")
    return {k: v["return"] for k, v in known.items()}


_CLIP_PRESETS = ("ppo", "grpo")  # PPO's clip: the presets whose old "clip_fraction" was two-sided


def cell_diagnostic(record: dict, key: str) -> float | None:
    """The iteration mean of diagnostic ``key`` (one of CELL_DIAGNOSTICS) of a study cell, None if
    not recorded.

    Older cells named two of them differently: their ``filtered_fraction`` is
    today's ``no_grad_fraction`` for every preset but ppo and grpo (the vaco presets' band and filter;
    0 for the presets without a rule), and ppo's and grpo's ``clip_fraction`` is today's
    ``clip_fraction_two_sided``; their one-sided no-gradient share was not recorded (None)."""
    diag = record.get("diagnostics") or {}
    if key in diag or key not in ("no_grad_fraction", "clip_fraction_two_sided"):
        return (diag.get(key) or {}).get("mean")
    clip_preset = record.get("preset") in _CLIP_PRESETS
    if key == "no_grad_fraction":
        return None if clip_preset else (diag.get("filtered_fraction") or {}).get("mean")
    return (diag.get("clip_fraction") or {}).get("mean") if clip_preset else None


def _scored(records: list[dict]) -> list[dict]:
    return [r for r in records if r.get("status") == "ok" and r.get("final_return") is not None]


def _fmt(x, nd=0) -> str:
    if x is None or x != x:
        return "n/a"
    return f"{x:,.{nd}f}"


def _interval(iv: stats.Interval, nd=0) -> str:
    ci = "" if iv.low != iv.low else f" [{_fmt(iv.low, nd)}, {_fmt(iv.high, nd)}]"
    return f"{_fmt(iv.value, nd)}{ci}"


def group_rows(study: Study, records: list[dict]) -> list[dict]:
    """One row per (env, label, condition): counts, median, IQM with CI, modes, diagnostics."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        groups[(r["env"], r["label"], r["condition"])].append(r)
    rows = []
    for (env, label, cond), rs in groups.items():
        ok = _scored(rs)
        finals = [r["final_return"] for r in ok]
        row = {
            "env": env,
            "label": label,
            "condition": cond,
            "cells": len(rs),
            "n": len(ok),
            "failed": sum(r.get("status") == "failed" for r in rs),
            "diverged": sum(r.get("status") == "diverged" for r in rs),
            "lag_warned": sum(bool(r.get("lag_warnings")) for r in rs),
            "seeds": sorted(r["seed"] for r in ok),
            "final_returns": finals,
        }
        if finals:
            row["median"] = statistics.median(finals)
            row["iqm"] = stats.aggregate({env: finals}, "iqm")._asdict()
            row["auc_iqm"] = stats.iqm([r["auc"] for r in ok if r.get("auc") is not None] or [float("nan")])
        if env in study.modes and finals:
            split = study.modes[env]
            row["modes"] = {
                "split": split,
                "low": sum(f < split for f in finals),
                "high": sum(f >= split for f in finals),
            }
        for k in CELL_DIAGNOSTICS:
            row[k] = _avg(cell_diagnostic(r, k) for r in ok)
        row["entropy_last"] = _avg(r["diagnostics"]["entropy"]["last"] for r in ok)
        for k in ("lag_p50", "lag_p95", "lag_seconds_p50", "lag_seconds_p95", "wall_time_s", "env_steps_per_s"):
            vals = [r[k] for r in ok if r.get(k) is not None]
            row[k] = statistics.median(vals) if vals else None
        rows.append(row)
    order = {c: i for i, c in enumerate(dict.fromkeys(c.condition for c in study.cells))}
    labels = {c: i for i, c in enumerate(dict.fromkeys(c.label for c in study.cells))}
    rows.sort(key=lambda r: (r["env"], order.get(r["condition"], 99), labels.get(r["label"], 99)))
    return rows


def _avg(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def aggregates(study: Study, records: list[dict], random: dict[str, float]) -> list[dict]:
    """Across envs, per (label, condition): IQM and median of normalised final scores (CIs
    stratified by env), over the envs that have a reference return."""
    by: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in _scored(records):
        if r["env"] in study.reference and r["env"] in random:
            by[(r["label"], r["condition"])][r["env"]].append(
                stats.normalized(r["final_return"], random=random[r["env"]], reference=study.reference[r["env"]])
            )
    out = []
    for (label, cond), per_env in by.items():
        out.append(
            {
                "label": label,
                "condition": cond,
                "envs": sorted(per_env),
                "n": sum(map(len, per_env.values())),
                "iqm": stats.aggregate(per_env, "iqm")._asdict(),
                "median": stats.aggregate(per_env, "median")._asdict(),
            }
        )
    return out


def comparisons(study: Study, records: list[dict]) -> list[dict]:
    """P(X > Y) of final returns per condition, over the envs both have (within-env, so no
    normalisation is needed). Pairs from the study's ``compare``, else vaco against every label."""
    scores: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in _scored(records):
        scores[(r["label"], r["condition"])][r["env"]].append(r["final_return"])
    labels = list(dict.fromkeys(c.label for c in study.cells))
    pairs = study.compare or [("vaco", other) for other in labels if other != "vaco" and "vaco" in labels]
    out = []
    for cond in dict.fromkeys(c.condition for c in study.cells):
        for x, y in pairs:
            # "label@condition" pins a side to one condition (e.g. the main job against serial no-lag)
            (lx, cx), (ly, cy) = (_side(x, cond), _side(y, cond))
            if "@" in x + y and cond != (cx if "@" in x else cy):
                continue
            sx, sy = scores.get((lx, cx)), scores.get((ly, cy))
            if not sx or not sy or not set(sx) & set(sy):
                continue
            iv = stats.probability_of_improvement(sx, sy)
            envs = sorted(set(sx) & set(sy))
            mx = statistics.median([v for e in envs for v in sx[e]])
            my = statistics.median([v for e in envs for v in sy[e]])
            out.append(
                {
                    "condition": cond if "@" not in x + y else f"{cx} vs {cy}",
                    "x": lx,
                    "y": ly,
                    "envs": envs,
                    "n_x": sum(map(len, sx.values())),
                    "n_y": sum(map(len, sy.values())),
                    "median_x": mx,
                    "median_y": my,
                    # a ratio of returns reads as "how many times better" only when both are positive
                    "median_ratio": mx / my if mx is not None and my is not None and mx > 0 and my > 0 else None,
                    "probability_of_improvement": iv._asdict(),
                }
            )
    return out


def _side(text: str, cond: str) -> tuple[str, str]:
    label, _, c = text.partition("@")
    return label, c or cond


def markdown(study: Study, records: list[dict], rows, aggs, comps, random) -> str:
    ok = _scored(records)
    accuracy = bool(ok) and all(r.get("score_kind") == "accuracy" for r in ok)
    nd = 3 if accuracy else 0
    modes = ", ".join(sorted({str(r.get("eval_mode") or "greedy") for r in ok}))
    score = (
        f"exact-match accuracy on the held-out problems after RL (llm cells; evaluation: {modes})"
        if accuracy
        else "average return of the last 20 episodes at the step budget"
    )
    loads = [r["load_start"] for r in records if r.get("load_start") is not None]
    cpus = Counter(_cpu(r.get("machine") or {}) for r in records)
    lines = [
        f"# Study `{study.name}`",
        "",
        f"Written {time.strftime('%Y-%m-%d %H:%M %Z')} by `asyncrl study {study.path}`. "
        f"{len(records)} of {count_of(len(study.cells), 'cell')} finished ({len(ok)} scored, "
        f"{sum(r.get('status') == 'failed' for r in records)} failed, "
        f"{sum(r.get('status') == 'diverged' for r in records)} diverged). "
        f"Code fingerprints: {', '.join(sorted({r['code_fingerprint'] for r in records})) or 'n/a'}; "
        f"commits: {', '.join(sorted({r['commit'] for r in records})) or 'n/a'}; "
        f"machine load at cell start (1-min average): {_fmt(min(loads), 1) if loads else 'n/a'} "
        f"to {_fmt(max(loads), 1) if loads else 'n/a'}. CPU models (cells): "
        f"{'; '.join(f'{m} ({n})' for m, n in cpus.most_common()) or 'n/a'}; serial cells repeat bit for bit "
        "on one CPU model and kernel set, not across them.",
        "",
        f"Score: {score}; IQM with its 95 % "
        "percentile bootstrap CI over seeds (2,000 resamples). Modes: seeds below / at or above the "
        "study's split. Diagnostics are means over learner iterations (entropy: last 10 %). 'no grad' "
        "(no_grad_fraction) is the share of samples whose gradient the preset's rule removed, one definition "
        "for every preset: PPO's clip mask (A (r - 1) > 0 and |r - 1| > ε), VACO's per-sample band and TV "
        "filter together; 0 for presets without such a rule (ppo_kl, spo, impala); n/a for ppo cells "
        "recorded before it was measured. 'fires': the share of minibatches in which VACO's TV budget δ "
        "removed a gradient the fixed band would have kept (the filter over δ, or the band it narrowed); "
        "'budget': the share of samples it removed so. 'clip 2-sided': PPO's usual clip fraction, |r - 1| > ε "
        "in either direction (half "
        "of those samples keep their gradient: not comparable with 'no grad').",
        "",
        "| env | arm | condition | n | median | IQM [95% CI] | low/high mode | tv | no grad | fires | budget | "
        "clip 2-sided | KL | "
        "entropy | lag p50/p95 (versions) | lag p50/p95 (s) | seeds: final returns |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        iqm = _interval(stats.Interval(**r["iqm"]), nd) if "iqm" in r else "n/a"
        modes = f"{r['modes']['low']}/{r['modes']['high']}" if "modes" in r else ""
        bad = (
            (f" ({r['failed']} failed)" if r["failed"] else "")
            + (f" ({r['diverged']} diverged)" if r["diverged"] else "")
            + (f" ({r['lag_warned']} lag-warned)" if r.get("lag_warned") else "")
        )
        lines.append(
            f"| {r['env']} | {r['label']} | {r['condition']} | {r['n']}{bad} | {_fmt(r.get('median'), nd)} | {iqm} | "
            f"{modes} | "
            f"{_fmt(r['tv_estimate'], 3)} | {_fmt(r['no_grad_fraction'], 3)} | {_fmt(r['filter_fire_rate'], 3)} | "
            f"{_fmt(r['tv_budget_fraction'], 3)} | {_fmt(r['clip_fraction_two_sided'], 3)} | "
            f"{_fmt(r['approx_kl'], 3)} | {_fmt(r['entropy_last'], 2)} | {_fmt(r['lag_p50'])}/{_fmt(r['lag_p95'])} | "
            f"{_fmt(r['lag_seconds_p50'], 2)}/{_fmt(r['lag_seconds_p95'], 2)} | "
            f"{', '.join(f'{s}: {_fmt(f, nd)}' for s, f in zip(r['seeds'], r['final_returns']))} |"
        )
    warned = [r for r in records if r.get("lag_warnings")]
    if warned:
        lines += [
            "",
            "## Cells with lag warnings",
            "",
            "A run says once when its preset does not correct the backward lag it measured (uncorrected_lag), "
            "or when its lag grows with the run (growing_lag); see summary.json `warnings` of each run "
            "(asyncrl/core/lag_warnings.py).",
            "",
        ]
        for k, n in sorted(Counter(kind for r in warned for kind in r["lag_warnings"]).items()):
            cells = sorted({f"{r['label']} / {r['env']} / {r['condition']}" for r in warned if k in r["lag_warnings"]})
            lines.append(f"- {k}: {count_of(n, 'cell')} ({'; '.join(cells)})")
    if aggs:
        lines += [
            "",
            "## Across envs: normalised score (score - random) / (reference - random)",
            "",
            "Random-policy returns (measured): "
            + ", ".join(f"{k} {_fmt(v, 1)}" for k, v in sorted(random.items()))
            + "; references (fixed in the study file): "
            + ", ".join(f"{k} {_fmt(v)}" for k, v in sorted(study.reference.items()))
            + ".",
            "",
            "| arm | condition | envs | runs | IQM [95% CI, stratified by env] | median [95% CI] |",
            "|---|---|---|---|---|---|",
        ]
        for a in aggs:
            lines.append(
                f"| {a['label']} | {a['condition']} | {len(a['envs'])} | {a['n']} | "
                f"{_interval(stats.Interval(**a['iqm']), 2)} | {_interval(stats.Interval(**a['median']), 2)} |"
            )
    if comps:
        lines += [
            "",
            f"## Probability of improvement P(X > Y) of final {'accuracies' if accuracy else 'returns'} "
            "(averaged over envs)",
            "",
            "| condition | X | Y | envs | runs X/Y | median X / median Y | P(X > Y) [95% CI] |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in comps:
            ratio = f"{_fmt(c['median_x'], nd)} / {_fmt(c['median_y'], nd)} = {_fmt(c['median_ratio'], 2)}"
            lines.append(
                f"| {c['condition']} | {c['x']} | {c['y']} | {len(c['envs'])} | {c['n_x']}/{c['n_y']} | "
                f"{ratio} | {_interval(stats.Interval(**c['probability_of_improvement']), 2)} |"
            )
    return "\n".join(lines) + "\n"


def plot_study(study: Study, records: list[dict], out: Path) -> list[Path]:
    """One PNG per (env, condition): return curves per arm (mean and 95 % CI band over seeds)."""
    try:
        from asyncrl.analysis.plots import plot_curves
    except ImportError:
        return []
    paths = []
    by: dict[tuple, list[dict]] = defaultdict(list)
    for r in _scored(records):
        by[(r["env"], r["condition"])].append(r)
    for (env, cond), rs in sorted(by.items()):
        series = [
            {
                "label": f"{r['label']} seed {r['seed']}",
                "group": r["label"],
                "env_steps": [p[0] for p in r["curve"] if p[2] is not None],
                "wall_time_s": [p[1] for p in r["curve"] if p[2] is not None],
                "return": [p[2] for p in r["curve"] if p[2] is not None],
            }
            for r in rs
        ]
        path = out / "plots" / f"{env}-{cond}.png".replace("/", "_")
        path.parent.mkdir(parents=True, exist_ok=True)
        paths.append(plot_curves(series, path, title=f"{env}, {cond}: mean and 95% CI over seeds"))
    return paths


def write_report(study: Study, records: list[dict], out: Path) -> dict:
    """Write results.json, results.csv, report.md and plots/ under ``out``; returns the results."""
    random = random_returns(study, out)
    rows, aggs, comps = group_rows(study, records), aggregates(study, records, random), comparisons(study, records)
    results = {
        "study": study.name,
        "study_file": str(study.path),
        "cells_total": len(study.cells),
        "random_returns": random,
        "reference_returns": study.reference,
        "modes": study.modes,
        "groups": rows,
        "aggregates": aggs,
        "comparisons": comps,
        "cells": records,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(strict_json(results, indent=1) + "\n")
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in records:
            d = dict(r)
            for k in CELL_DIAGNOSTICS:
                d[k] = cell_diagnostic(r, k)
            d["entropy_last"] = (r.get("diagnostics") or {}).get("entropy", {}).get("last")
            d["overrides"] = " ".join(r.get("overrides", []))
            w.writerow(d)
    (out / "report.md").write_text(markdown(study, records, rows, aggs, comps, random))
    results["plots"] = [str(p) for p in plot_study(study, records, out)]
    return results


def _cpu(machine: dict) -> str:
    """ "AMD EPYC, AVX512 kernels" (the kernels only where the record has them)."""
    model = machine.get("cpu_model") or "not recorded"
    return f"{model}, {machine['cpu_kernels']} kernels" if machine.get("cpu_kernels") else model
