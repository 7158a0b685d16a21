"""Bytes per published version of real model shapes, and the cost of a version on the wire (issue 43, part 4).

Sizes: the models are built on torch's meta device from their published config values (no weights are
read or downloaded), through the task's own weights_info (full, bfloat16, LoRA rank 16 on all-linear).
Wire: encode (CRC32), sign (HMAC-SHA256), verify and decode (CRC32, finiteness) of one bfloat16 payload of
SmolLM2-135M's size, and the learner's flat_weights of a model of that shape; median of 3, this machine.

    nice -n 19 .venv/bin/python lab/llm-weights-2026-12-06/measure.py [MODEL_DIR]

With MODEL_DIR (the run used runs/llm/tiny-qwen2-s0-warm-s0-n1600-b8, gsm-tiny's start model): the
log-prob difference bfloat16 weights make on the model's own samples.
"""

from __future__ import annotations

import contextlib
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from asyncrl.core import config
from asyncrl.tasks import make_task
from asyncrl.wire import codec

# The published config values of each model (their config.json on the Hugging Face hub).
SHAPES = {
    "SmolLM2-135M": dict(
        model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True,
    ),
    "Qwen2.5-0.5B": dict(
        model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
    ),
    "Qwen2.5-1.5B": dict(
        model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
    ),
}  # fmt: skip


def sizes(tmp: Path) -> dict:
    out = {}
    for name, shape in SHAPES.items():
        d = tmp / name
        d.mkdir()
        AutoConfig.for_model(**shape).save_pretrained(d)
        row = {}
        for label, extra in (
            ("float32", []),
            ("bfloat16", ["learner.weights_dtype=bfloat16"]),
            ("lora16_float32", ["llm.lora_rank=16"]),
            ("lora16_bfloat16", ["llm.lora_rank=16", "learner.weights_dtype=bfloat16"]),
        ):
            cfg = config.load(None, ["task.kind=llm", f"llm.model_dir={d}", "llm.warmup_steps=0", *extra])
            info = make_task(cfg).weights_info()
            row[label] = {"parameters": info.parameters, "bytes": info.nbytes}
        row["full_float32_over_lora16_float32"] = round(row["float32"]["bytes"] / row["lora16_float32"]["bytes"], 1)
        row["full_bfloat16_over_lora16_bfloat16"] = round(row["bfloat16"]["bytes"] / row["lora16_bfloat16"]["bytes"], 1)
        out[name] = row
    return out


def median_s(fn, n=3) -> dict:
    """Median wall and CPU seconds of ``n`` calls (CPU time: less moved by other processes on the cores)."""
    wall, cpu = [], []
    for _ in range(n):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {"wall_s": round(statistics.median(wall), 3), "cpu_s": round(statistics.median(cpu), 3)}


def wire(tmp: Path) -> dict:
    d = tmp / "smol"
    d.mkdir()
    AutoConfig.for_model(**SHAPES["SmolLM2-135M"]).save_pretrained(d)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(d))  # random weights, real shapes
    from asyncrl.tasks.llm.weights import flat_weights

    payload = flat_weights(model, "bfloat16")
    secret = b"s" * 64
    frames = codec.encode_weights(run_id="r", version=1, publish_time=0.0, layout_hash="h", payload=payload)
    signed = codec.sign_weights(frames, secret)
    ping = codec.sign_version(
        codec.encode_version(run_id="0101010101-abcdef", epoch=time.time_ns(), version=1, nbytes=payload.nbytes), secret
    )
    return {
        "payload_bytes": payload.nbytes,
        "flat_weights_bfloat16": median_s(lambda: flat_weights(model, "bfloat16")),
        "flat_weights_float32": median_s(lambda: flat_weights(model, "float32")),
        "encode_crc32": median_s(
            lambda: codec.encode_weights(run_id="r", version=1, publish_time=0.0, layout_hash="h", payload=payload)
        ),
        "sign_hmac": median_s(lambda: codec.sign_weights(frames, secret)),
        "verify_and_decode": median_s(lambda: codec.decode_weights(codec.verify_weights(signed, secret))),
        "version_ping_bytes": sum(len(bytes(f)) for f in ping),
    }


def bf16_mismatch(model_dir: Path) -> dict:
    """Differences of log π(token) on the warmed-up tiny model's own samples (the policy tokens of 64
    prompts x 8 completions at T = 0.6, gsm-tiny's setting) between: float32 weights and the same weights
    rounded to bfloat16 (a generator's copy when the learner keeps float32 and sends bfloat16); a bf16
    learner (float32 weights, autocast forward) and a generator with float32 or bfloat16 weights."""
    from asyncrl.tasks.llm import gsm_problems, sampling
    from asyncrl.tasks.llm import model as m
    from asyncrl.tasks.llm.weights import flat_weights, load_flat

    loaded = m.load(model_dir)
    model, tok = loaded.model, loaded.tokenizer
    rounded = m.load(model_dir).model
    load_flat(rounded, flat_weights(model, "bfloat16"))
    problems = gsm_problems.make_splits(seed=0, n_train=64, n_heldout=0).train
    prompts = [gsm_problems.format_prompt(p) for p in problems]
    out = sampling.generate_group(
        model, tok, prompts, 8, temperature=0.6, max_new_tokens=160, generator=torch.Generator().manual_seed(1)
    )
    lp = {}
    for name, net, context in (
        ("float32", model, contextlib.nullcontext),
        ("bfloat16", rounded, contextlib.nullcontext),
        # a learner with learner.precision = bf16: float32 weights, the forward under bf16 autocast
        ("autocast", model, lambda: torch.autocast("cpu", dtype=torch.bfloat16)),
    ):
        with torch.no_grad(), context():
            lp[name] = sampling.completion_log_probs(
                net, out.input_ids, out.attention_mask, out.completion_mask, temperature=0.6
            )
    diff = (lp["float32"] - lp["bfloat16"]).abs()[out.policy_mask]

    def mean_abs(a, b):
        return float((lp[a] - lp[b]).abs()[out.policy_mask].mean())

    return {
        "bf16_learner_vs_float32_generator_mean": mean_abs("autocast", "float32"),
        "bf16_learner_vs_bfloat16_generator_mean": mean_abs("autocast", "bfloat16"),
        "model": str(model_dir),
        "policy_tokens": int(out.policy_mask.sum()),
        "mean_abs_log_prob_difference": float(diff.mean()),
        "p99_abs_log_prob_difference": float(diff.quantile(0.99)),
        "max_abs_log_prob_difference": float(diff.max()),
        "sampler_vs_float32_mean": float((out.behavior_log_prob - lp["float32"]).abs()[out.policy_mask].mean()),
    }


def main() -> None:
    torch.set_num_threads(1)
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model_name = next((ln.split(":", 1)[1].strip() for ln in cpu.splitlines() if ln.startswith("Model name")), "?")
    with tempfile.TemporaryDirectory() as t:
        result = {"cpu": model_name, "python": platform.python_version(), "torch": torch.__version__}
        result["load_average"] = Path("/proc/loadavg").read_text().split()[:3]
        result["sizes"] = sizes(Path(t))
        result["wire"] = wire(Path(t))
        if len(sys.argv) > 1:  # a model directory, e.g. gsm-tiny's warmed-up start model
            result["bf16_mismatch"] = bf16_mismatch(Path(sys.argv[1]))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
