"""Which gait did a run learn? The torso's pitch over a deterministic episode of each checkpoint.

HalfCheetah's returns at 1M env steps are bimodal (a mode near 1,600, one near 4,500): this
script tells whether a run's policy runs upright or flipped onto its back. For each run directory
(or every cell of a study directory) and each checkpoint in it, one deterministic episode
(`asyncrl eval`'s policy mean, reset seed 0, the env's own time limit) is rolled out and the
torso's pitch (qpos[2], the root's rotation about y, radians) read at every step; the run is
*flipped* when cos(pitch) < 0 (torso beyond +-90 degrees) on more than half of the steps.

Planar MuJoCo envs only (HalfCheetah, Hopper, Walker2d: qpos[2] is the torso pitch); any other
env id is skipped with a line saying so.

    .venv/bin/python bench/gait.py bench/results/studies/main-job-idle [--all-checkpoints] [--json OUT]
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import click
import gymnasium as gym
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asyncrl.tasks.control.envs import make_env  # noqa: E402
from asyncrl.tasks.control.evaluate import load_checkpoint, run_episodes  # noqa: E402

PLANAR = ("HalfCheetah", "Hopper", "Walker2d")


class _PitchLog(gym.Wrapper):
    """Records the torso pitch (qpos[2], radians) after every step."""

    def __init__(self, env):
        super().__init__(env)
        self.pitch: list[float] = []

    def step(self, action):
        out = self.env.step(action)
        self.pitch.append(float(self.env.unwrapped.data.qpos[2]))
        return out


def pitch_trace(ckpt, *, seed: int = 0) -> np.ndarray:
    """[steps] torso pitch (radians) over one deterministic episode of ``ckpt``'s policy
    (evaluate.run_episodes: reset seed ``seed``, policy mean, actions clipped as in training)."""
    e = ckpt.cfg.env
    env = _PitchLog(make_env(e.id, module=e.module, max_episode_steps=e.max_episode_steps))
    run_episodes(ckpt.policy, env, episodes=1, seed=seed)
    env.close()
    return np.asarray(env.pitch)


def _checkpoint_index(p: Path) -> int:
    m = re.fullmatch(r"checkpoint(?:\.(\d+))?\.pt", p.name)
    return int(m.group(1) or 0) if m else -1


def runs_of(path: Path):
    """(label, run_dir, cell record or None) for a run directory or every cell of a study."""
    if (path / "cells").is_dir():
        from asyncrl.analysis.study_store import CellStore

        store = CellStore(path)  # a packed record (cells.tar.xz) keeps its run directory
        for cell in sorted((path / "cells").iterdir()):
            rec = store.get(cell.name)
            if rec is not None and (cell / "run").is_dir():
                yield cell.name, cell / "run", rec
    elif path.is_dir():
        yield path.name, path, None
    else:
        raise click.ClickException(f"{path}: not a run or study directory")


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--all-checkpoints", is_flag=True, help="every checkpoint*.pt, not only the final one")
@click.option("--json", "json_out", type=click.Path(path_type=Path), help="write the rows here")
def main(paths, all_checkpoints, json_out):
    rows = []
    for path in paths:
        for label, run, rec in runs_of(path):
            files = (
                sorted(run.glob("checkpoint*.pt"), key=_checkpoint_index)
                if all_checkpoints
                else [run / "checkpoint.pt"]
            )
            files = [f for f in files if f.is_file()][::-1]  # checkpoint.N.pt are older for larger N
            for f in files:
                ck = load_checkpoint(f)
                if not ck.cfg.env.id.startswith(PLANAR):
                    click.echo(f"{run}: {ck.cfg.env.id} is not a planar env this script reads; skipped")
                    break
                pitch = pitch_trace(ck)
                row = {
                    "study": path.name,
                    "cell": label,
                    "checkpoint": f.name,
                    "env": ck.cfg.env.id,
                    "env_steps": ck.env_steps,
                    "flipped_fraction": float(np.mean(np.cos(pitch) < 0)),
                    "mean_cos_pitch": float(np.mean(np.cos(pitch))),
                    "episode_steps": len(pitch),
                }
                row["flipped"] = row["flipped_fraction"] > 0.5
                if rec:
                    row.update(
                        {k: rec.get(k) for k in ("label", "preset", "condition", "mode", "seed", "final_return")}
                    )
                rows.append(row)
                fr = row.get("final_return")
                click.echo(
                    f"{row['study']:20s} {str(row.get('label', label))[:32]:32s} "
                    f"{str(row.get('condition', '')):8s} seed {str(row.get('seed', '')):>4s} "
                    f"{row['env_steps']:>8d} steps  final {'-' if fr is None else round(fr):>6} "
                    f" flipped {row['flipped_fraction']:.2f}  mean cos {row['mean_cos_pitch']:+.2f}"
                )
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(rows, indent=1))
    summary(rows)


def summary(rows: list[dict]) -> None:
    """Per study, arm and condition: runs whose final checkpoint is flipped, and runs >= 3,000."""
    final = {}
    for r in rows:
        if r["checkpoint"] == "checkpoint.pt":
            final.setdefault(
                (r["study"], r["env"], r.get("label", ""), r.get("condition", ""), r.get("mode", "")), []
            ).append(r)
    if not final:
        return
    click.echo("\nfinal checkpoints: flipped / at or above 3,000 / runs")
    for (study, env, label, cond, mode), rs in final.items():
        rs.sort(key=lambda r: r.get("seed") or 0)
        seeds = " ".join(
            f"{r.get('seed')}:{round(r['final_return']) if r.get('final_return') is not None else '-'}"
            f"{'F' if r['flipped'] else ''}"
            for r in rs
        )
        high = sum((r.get("final_return") or 0) >= 3000 for r in rs)
        click.echo(
            f"{study:22s} {env:15s} {str(label)[:30]:30s} {cond:8s} {mode[:5]:5s} "
            f"{sum(r['flipped'] for r in rs)} / {high} / {len(rs)}   {seeds}"
        )


if __name__ == "__main__":
    main()
