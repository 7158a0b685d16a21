"""Time and peak memory of the learner's completion log-probs (forward and backward) against
``llm.logprob_chunk_tokens``, and of the plain full-logits computation they replaced.

A random-weight Qwen2 of a real model's output shape (hidden size and vocabulary; one decoder layer,
since the chunking changes only the output head and the log-softmax) scores ROWS completions of
COMPLETION tokens after PROMPT tokens. Peak memory: on cuda, torch.cuda.max_memory_allocated; on the
CPU, the most bytes the allocator held beyond the start (torch profiler memory events; see
tests/llm/test_llm_learner_memory.py). Prints one JSON line per setting.

    python bench/llm_logprob_chunks.py                       # SmolLM2-135M's shape: H 576, V 49152
    python bench/llm_logprob_chunks.py --hidden 896 --vocab 151936 --rows 64 --device cuda   # Qwen2.5-0.5B's
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def cpu_peak(fn) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as d:
        prof.export_chrome_trace(os.path.join(d, "t.json"))
        events = json.loads(Path(d, "t.json").read_text())["traceEvents"]
    mem = sorted(
        (e["args"]["Ev Idx"], e["args"]["Total Allocated"], e["args"]["Bytes"])
        for e in events
        if e.get("name") == "[memory]"
    )
    return max(t for _, t, _ in mem) - (mem[0][1] - mem[0][2])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--completion", type=int, default=256)
    ap.add_argument("--chunks", default="128,256,512,1024,2048,full")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from asyncrl.tasks.llm.token_log_probs import completion_log_probs, position_ids

    torch.manual_seed(0)
    h, v, dev = args.hidden, args.vocab, torch.device(args.device)
    cfg = Qwen2Config(
        vocab_size=v,
        hidden_size=h,
        intermediate_size=4 * h,
        num_hidden_layers=1,
        num_attention_heads=max(1, h // 64),
        num_key_value_heads=1,
        tie_word_embeddings=True,
    )
    lm = Qwen2ForCausalLM(cfg).to(dev)
    s, length = args.prompt + args.completion, args.completion
    ids = torch.randint(0, v, (args.rows, s), device=dev)
    mask = torch.ones_like(ids)
    comp = torch.ones(args.rows, length, dtype=torch.bool, device=dev)
    n = args.rows * length

    def plain():  # the full-logits computation these chunks replaced
        logits = lm(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).logits
        lp = torch.log_softmax(logits[:, s - length - 1 : s - 1].float(), -1).gather(-1, ids[:, s - length :, None])
        lp.sum().backward()

    settings = [("plain", None)] + [("chunked", n if c == "full" else int(c)) for c in args.chunks.split(",")]
    for kind, chunk in settings:

        def fn(kind=kind, chunk=chunk):
            if kind == "plain":
                plain()
            else:
                completion_log_probs(lm, ids, mask, comp, chunk_tokens=chunk).sum().backward()
            lm.zero_grad(set_to_none=True)

        fn()  # warm-up
        times = []
        for _ in range(args.repeats):
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            fn()
            peak = torch.cuda.max_memory_allocated() - base
        else:
            peak = cpu_peak(fn)
        print(
            json.dumps(
                {
                    "kind": kind,
                    "chunk_tokens": chunk,
                    "tokens": n,
                    "hidden": h,
                    "vocab": v,
                    "device": args.device,
                    "threads": torch.get_num_threads(),
                    "seconds_min": round(min(times), 3),
                    "peak_mib": round(peak / 2**20, 1),
                    "one_chunk_of_logits_mib": round(min(chunk or n, n) * v * 4 / 2**20, 1),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
