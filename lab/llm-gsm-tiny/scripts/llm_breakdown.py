"""Error breakdown of a finished llm run's final weights on the held-out problems (lab/llm-gsm-tiny/README.md).

    .venv/bin/python lab/llm-gsm-tiny/scripts/llm_breakdown.py RUN_DIR [RUN_DIR ...] [--start]

Loads each run's ``checkpoint.pt`` policy state into its start model (summary.json's ``model``),
decodes the task's held-out problems greedily with the calculator (the evaluation of
``summary.json``) and prints one JSON line per run: accuracy, accuracy by number of steps,
gsm.error_breakdown's first-error counts and the mean completion length in tokens. ``--start``
adds a line for the first run's start model.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from asyncrl.core.config import translate_moved_keys
from asyncrl.tasks.llm import gsm, model as m
from asyncrl.tasks.llm.sampling import eval_completions


def breakdown(model_dir: str, state: dict | None, cfg: dict) -> dict:
    loaded = m.load(model_dir)
    if state is not None:
        loaded.model.load_state_dict(state)
    t = cfg["llm"]
    heldout = gsm.make_splits(seed=t["model_seed"], n_train=0, n_heldout=t["eval_size"]).heldout
    texts = eval_completions(loaded.model, loaded.tokenizer, heldout, greedy=True, max_new_tokens=t["max_new_tokens"])
    b = gsm.error_breakdown(heldout, texts)
    tokens = sum(len(loaded.tokenizer(x, add_special_tokens=False)["input_ids"]) for x in texts) / len(texts)
    return {"accuracy": b["accuracy"], "by_steps": b["by_steps"], "first_error": b["first_error"],
            "completion_tokens_mean": round(tokens, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--start", action="store_true", help="also the first run's start model")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    for i, run in enumerate(a.runs):
        cfg, _record, _lines = translate_moved_keys(json.loads((run / "config.json").read_text()), None,
                                                    where=str(run / "config.json"))   # older runs: llm keys in [task]
        start = json.loads((run / "summary.json").read_text())["model"]
        if a.start and i == 0:
            print(json.dumps({"run": "start", "model": start, **breakdown(start, None, cfg)}))
        state = torch.load(run / "checkpoint.pt", weights_only=False)["policy"]
        print(json.dumps({"run": str(run), **breakdown(start, state, cfg)}))


if __name__ == "__main__":
    main()
