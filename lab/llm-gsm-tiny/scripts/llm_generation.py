"""Generation speed of the LLM sampler with and without compaction (finished rows leave the batch).

    .venv/bin/python lab/llm-gsm-tiny/scripts/llm_generation.py --model runs/llm/tiny-qwen2-s0-warm-s0-n1000

Samples one completion per held-out problem (calculator on, as the evaluation and the generators do)
with ``compact=False`` and ``compact=True`` alternately, ``--repeats`` times each, and prints the
median seconds of each and their ratio (alternation keeps a shared machine's load out of the ratio),
plus whether the two produced the same tokens. A warmed-up model gives realistic completion lengths.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from asyncrl.tasks.llm import gsm, model as m, sampling


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a prepared (ideally warmed-up) model directory")
    ap.add_argument("--problems", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    loaded = m.load(a.model)
    lm, tok = loaded.model, loaded.tokenizer
    problems = gsm.make_splits(seed=0, n_train=0, n_heldout=a.problems).heldout
    calc = sampling.calculator_for(tok)

    def run(compact: bool) -> tuple[float, list[torch.Tensor], int]:
        gen, outs, t0 = torch.Generator().manual_seed(0), [], time.perf_counter()
        for i in range(0, len(problems), a.batch_size):
            ids, mask = sampling.encode_prompts(tok, [gsm.format_prompt(p) for p in problems[i:i + a.batch_size]])
            outs.append(sampling.sample(lm, ids, mask, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                                        max_new_tokens=a.max_new_tokens, temperature=a.temperature, generator=gen,
                                        calculator=calc, compact=compact).input_ids)
        return time.perf_counter() - t0, outs, sum(int((o != tok.pad_token_id).sum()) for o in outs)

    times: dict[bool, list[float]] = {False: [], True: []}
    outs = {}
    for _ in range(a.repeats):
        for compact in (False, True):
            dt, outs[compact], _ = run(compact)
            times[compact].append(dt)
    full, part = statistics.median(times[False]), statistics.median(times[True])
    same = all(torch.equal(x, y) for x, y in zip(outs[False], outs[True]))
    print(json.dumps({"problems": a.problems, "batch_size": a.batch_size, "threads": a.threads,
                      "full_s": [round(t, 2) for t in times[False]], "compact_s": [round(t, 2) for t in times[True]],
                      "median_full_s": round(full, 2), "median_compact_s": round(part, 2),
                      "speedup": round(full / part, 2), "same_tokens": same}))


if __name__ == "__main__":
    main()
