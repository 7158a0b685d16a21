"""Learner-iteration speed on one device (``bench/gpu_check.sh`` runs it; see docs/gpu-check.md).

Times the learner iteration alone (no envs, no generation, no sockets) on a synthetic batch of the
shape a run would consume, the way :meth:`asyncrl.core.state.LearnerState.iterate` runs it: the CPU batch
moved to the device (:func:`asyncrl.core.device.to_device`), then the task's iteration under the
``learner.precision`` forward context, with the learner's optimizer (fused GuardedAdam).

  control  the default config's batch (HalfCheetah-v5 shapes, T x B*E = 64 x 32 = 2048 env steps,
           10 epochs x 8 minibatches): reports env steps (samples) per second.
  llm      configs/gsm-tiny.toml's batch with the tiny model of ``asyncrl llm prepare`` (64 rows of
           96 prompt + 160 completion positions; 1 epoch x 4 minibatches): reports token positions
           per second (rows x 256 per iteration) and completions per second.

It imports only torch, numpy, transformers and tokenizers (what a lent GPU machine has): the
config files are read without asyncrl.core.config.load (whose checks import pyzmq), and the control
shapes are HalfCheetah-v5's, written below (tests/test_device.py checks them against gymnasium).

    python bench/learner_speed.py --task control --device cpu --repeats 5 --out results.jsonl
    python bench/learner_speed.py --report results.jsonl --cpu-figures bench/gpu_check_cpu.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from asyncrl.core import config as config_mod  # noqa: E402
from asyncrl.core.config import Config  # noqa: E402
from asyncrl.core.device import check_device, forward_context, to_device  # noqa: E402

HALFCHEETAH_OBS_DIM, HALFCHEETAH_ACTION_DIM = 17, 6  # HalfCheetah-v5's observation and action sizes
FORBIDDEN = ("zmq", "gymnasium", "mujoco")  # not on a lent GPU machine


def read_config(path: str | Path | None) -> Config:
    """A config file's Config as :func:`asyncrl.core.config.load` resolves it, without its checks (they
    import pyzmq). For the files this benchmark reads (tests/test_device.py compares the two)."""
    raw = tomllib.loads(Path(path).read_text()) if path else {}
    return config_mod.resolve(raw, check=False).config


def control_case(cfg: Config, device, fwd, seed: int = 0):
    """(one-iteration callable, samples per iteration) for the control learner on ``cfg``'s batch."""
    from asyncrl.core.optim import make_optimizer
    from asyncrl.core.spec import RolloutSpec
    from asyncrl.tasks.control.policy import build_policy
    from asyncrl.tasks.control.update import learner_iteration

    torch.manual_seed(seed)
    policy = build_policy(cfg.policy, HALFCHEETAH_OBS_DIM, HALFCHEETAH_ACTION_DIM, discrete=False).to(device)
    opt = make_optimizer(policy.parameters(), lr=cfg.algo.lr, eps=cfg.algo.adam_eps)
    spec = RolloutSpec(
        obs_dim=HALFCHEETAH_OBS_DIM,
        action_dim=HALFCHEETAH_ACTION_DIM,
        discrete=False,
        rollout_length=cfg.env.rollout_length,
        num_envs=cfg.env.num_envs * cfg.learner.slots_per_batch,
    )
    rng = np.random.default_rng(seed)
    arrays = spec.allocate()
    T, N = arrays["rewards"].shape
    arrays["obs"][:] = rng.standard_normal(arrays["obs"].shape, dtype=np.float32)
    arrays["final_obs"][:] = rng.standard_normal(arrays["final_obs"].shape, dtype=np.float32)
    arrays["actions"][:] = rng.standard_normal(arrays["actions"].shape, dtype=np.float32)
    arrays["rewards"][:] = rng.standard_normal((T, N), dtype=np.float32)
    arrays["truncated"][T - 1, ::4] = True  # some episode ends, as in HalfCheetah's 1000-step limit
    batch = {k: torch.from_numpy(arrays[k]) for k in spec.batch_field_names}
    with torch.no_grad():  # behaviour log-probs of the same weights: a zero-lag batch
        x = policy.normalize(batch["obs"][:-1].reshape(T * N, -1).to(device))
        lp = policy.distribution(x).log_prob(batch["actions"].reshape(T * N, -1).to(device))
    batch["behavior_log_prob"] = lp.view(T, N).cpu() + 0.01 * torch.randn(T, N)
    gen = torch.Generator().manual_seed(seed)

    def step():
        return learner_iteration(
            policy,
            opt,
            to_device(batch, device),
            cfg=cfg.algo,
            generator=gen,
            version=0,
            forward_context=fwd,
            compile_loss=cfg.learner.compile,
        )

    return step, {"samples": T * N}


def llm_case(cfg: Config, device, fwd, model_dir: Path, seed: int = 0):
    """(one-iteration callable, counts per iteration) for the llm learner on ``cfg``'s batch."""
    from asyncrl.core.optim import make_optimizer
    from asyncrl.tasks.llm import model as m
    from asyncrl.tasks.llm.learn import _token_log_probs, llm_iteration

    llm = cfg.llm
    model = m.load(model_dir).model.to(device)
    model.train()
    opt = make_optimizer(model.parameters(), lr=cfg.algo.lr, eps=cfg.algo.adam_eps)
    rows, S, L = (
        llm.prompts_per_slot * llm.group_size * cfg.learner.slots_per_batch,
        llm.max_prompt_tokens,
        llm.max_new_tokens,
    )
    vocab = model.config.vocab_size
    rng = np.random.default_rng(seed)
    prompt_len = np.repeat(rng.integers(40, 73, rows // llm.group_size), llm.group_size)  # prompts <= 72 tokens
    comp_len = rng.integers(20, 138, rows)  # solutions <= 137
    pos = np.arange(S)
    batch = {
        "prompt_ids": torch.from_numpy(rng.integers(1, vocab, (rows, S))),
        "prompt_mask": torch.from_numpy(pos[None, :] >= S - prompt_len[:, None]),
        "completion_ids": torch.from_numpy(rng.integers(1, vocab, (rows, L))),
        "completion_mask": torch.from_numpy(np.arange(L)[None, :] < comp_len[:, None]),
        "policy_mask": torch.from_numpy(np.arange(L)[None, :] < comp_len[:, None]),  # no calculator tokens
        "behavior_version": torch.zeros(rows, dtype=torch.int64),
        "rewards": torch.from_numpy((np.arange(rows) % 2).astype(np.float32)),
    }
    with torch.no_grad():  # behaviour log-probs of the same weights: a zero-lag batch
        dev_batch = to_device(batch, device)
        lp = _token_log_probs(model, dev_batch, torch.arange(rows, device=device), llm=llm)
    batch["behavior_log_prob"] = lp.cpu()
    gen = torch.Generator().manual_seed(seed)

    def step():
        return llm_iteration(
            model, opt, to_device(batch, device), algo=cfg.algo, llm=llm, generator=gen, version=0, forward_context=fwd
        )

    return step, {"samples": rows, "tokens": rows * (S + L), "completion_tokens": int(comp_len.sum())}


def measure(step, device, *, warmup: int, repeats: int) -> tuple[list[float], list[float]]:
    """(wall-clock seconds, this process's CPU seconds) of each of ``repeats`` iterations after
    ``warmup`` untimed ones, the device synchronised around each. On a shared CPU the wall clock
    counts the time other processes held the cores; the CPU time does not."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        step()
    sync()
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        sync()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return wall, cpu


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_case(args) -> dict:
    device = check_device(args.device, args.precision)
    fwd = forward_context(device, args.precision)
    if args.task == "control":
        cfg = read_config(None)
        if args.compile:  # learner.compile = true: one compiled graph per optimizer step
            cfg = dataclasses.replace(cfg, learner=dataclasses.replace(cfg.learner, compile=True))
        step, counts = control_case(cfg, device, fwd)
    else:
        cfg = read_config(ROOT / "configs" / "gsm-tiny.toml")
        step, counts = llm_case(cfg, device, fwd, Path(args.model_dir))
    torch.set_num_threads(args.threads or cfg.learner.torch_threads)
    times, cpu_times = measure(step, device, warmup=args.warmup, repeats=args.repeats)
    med, cpu_med = statistics.median(times), statistics.median(cpu_times)
    row = {
        "task": args.task,
        "device": args.device,
        "precision": args.precision,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "compile": bool(getattr(cfg.learner, "compile", False)),
        "warmup": args.warmup,
        "repeats": args.repeats,
        "seconds_median": med,
        "seconds_min": min(times),
        "seconds_max": max(times),
        "cpu_seconds_median": cpu_med,
        **{f"{k}_per_iteration": v for k, v in counts.items()},
        **{f"{k}_per_s": v / med for k, v in counts.items()},
        **{f"{k}_per_cpu_s": v / cpu_med for k, v in counts.items()},
        "load_average": os.getloadavg(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    leaked = [name for name in FORBIDDEN if name in sys.modules]
    if leaked:
        raise SystemExit(f"learner_speed: imported {', '.join(leaked)}, which a lent GPU machine lacks")
    return row


def report(paths: list[str], cpu_figures: str | None) -> str:
    """A markdown table of every row in ``paths`` (and the CPU figures file, marked as measured elsewhere)."""
    rows = []
    for p in [*paths, *([cpu_figures] if cpu_figures else [])]:
        where = "CPU file" if p == cpu_figures else "this run"
        for line in Path(p).read_text().splitlines():
            if line.strip():
                rows.append({**json.loads(line), "from": where})
    out = [
        "| task | device | precision | wall s / iteration: median (min-max) | samples/s | tokens/s "
        "| CPU s / iteration | samples/s by CPU time | tokens/s by CPU time | repeats | load avg | from |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        tokens = f"{r['tokens_per_s']:,.0f}" if "tokens_per_s" in r else "-"
        cpu_tokens = f"{r['tokens_per_cpu_s']:,.0f}" if "tokens_per_cpu_s" in r else "-"
        out.append(
            f"| {r['task']} | {r['device']} ({r['device_name']}, {r['torch_threads']} thr) | {r['precision']} | "
            f"{r['seconds_median']:.4f} ({r['seconds_min']:.4f}-{r['seconds_max']:.4f}) | "
            f"{r['samples_per_s']:,.1f} | {tokens} | {r['cpu_seconds_median']:.4f} | "
            f"{r['samples_per_cpu_s']:,.1f} | {cpu_tokens} | {r['repeats']} | "
            f"{r['load_average'][0]:.2f} | {r['from']} |"
        )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", choices=["control", "llm"])
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--model-dir", help="llm: the tiny model directory (asyncrl llm prepare; gpu_check.sh makes it)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed iterations first")
    ap.add_argument("--repeats", type=int, default=5, help="timed iterations (the median is reported)")
    ap.add_argument(
        "--threads", type=int, default=0, help="torch threads (default: the config's learner.torch_threads)"
    )
    ap.add_argument("--compile", action="store_true", help="control: learner.compile = true (default: the config's)")
    ap.add_argument("--out", help="append the result as one JSON line to this file")
    ap.add_argument("--report", nargs="*", help="print a table of these result files instead of measuring")
    ap.add_argument("--cpu-figures", help="with --report: a result file of CPU figures measured elsewhere")
    args = ap.parse_args()
    if args.report is not None:
        print(report(args.report, args.cpu_figures))
        return
    if args.task is None or args.task == "llm" and not args.model_dir:
        ap.error("give --task (and --model-dir for llm), or --report")
    try:
        row = run_case(args)
    except config_mod.ConfigError as exc:
        raise SystemExit(f"learner_speed: {exc}") from None
    print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "a") as fh:
            fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
