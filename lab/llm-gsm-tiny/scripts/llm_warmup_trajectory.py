"""Supervised warm-up trajectory of the tiny GSM model (lab/llm-gsm-tiny/README.md, session 15): greedy accuracy on --nval
validation problems generated after the 20,000 train problems (in neither train nor held-out) every --every steps
from --from_ on; CPU seconds of training (checks excluded) beside each check. JSON to OUT/NAME.json.

Run from the repo root, e.g.:
  .venv/bin/python lab/llm-gsm-tiny/scripts/llm_warmup_trajectory.py b8 --bs 8 --steps 1600 --every 200 --from_ 1000 --threads 1
"""
import argparse, json, os, sys, time, torch
os.environ["HF_HUB_OFFLINE"] = "1"; os.environ["TOKENIZERS_PARALLELISM"] = "false"
from asyncrl.tasks.llm import gsm, model as m, sampling, warmup as w
ap = argparse.ArgumentParser()
ap.add_argument("name"); ap.add_argument("--seed", type=int, default=0); ap.add_argument("--steps", type=int, default=1000)
ap.add_argument("--bs", type=int, default=32); ap.add_argument("--lr", type=float, default=3e-3)
ap.add_argument("--wsteps", type=int, default=30); ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--every", type=int, default=100); ap.add_argument("--from_", type=int, default=300)
ap.add_argument("--nval", type=int, default=200); ap.add_argument("--out", default="runs/exp/warmup-trajectories")
a = ap.parse_args()
torch.set_num_threads(a.threads)
base = f"runs/llm/tiny-qwen2-s{a.seed}"
m.prepare(base, seed=a.seed)
L = m.load(base)
probs = gsm.make_splits(seed=a.seed, n_train=20000 + a.nval, n_heldout=0).train
train, val = probs[:20000], probs[20000:]
checks = []; t0 = time.perf_counter(); c0 = time.process_time(); evs = [0.0]
def stop(s):
    if s < a.from_: return False
    e0 = time.process_time(); L.model.eval()
    acc = sampling.evaluate(L.model, L.tokenizer, val, greedy=True, max_new_tokens=160, batch_size=200)
    L.model.train(); evs[0] += time.process_time() - e0
    checks.append((s, acc, round(time.process_time() - c0 - evs[0], 1)))
    print(a.name, s, acc, checks[-1][2], flush=True)
    return False
r = w.warmup(L.model, L.tokenizer, train, steps=a.steps, seed=a.seed, batch_size=a.bs, lr=a.lr, warmup_steps=a.wsteps,
             calculator_mask=True, stop=stop, check_every=a.every)
stop(a.steps)
os.makedirs(a.out, exist_ok=True)
json.dump({"args": vars(a), "checks": checks, "final_loss": r.final_loss, "train_cpu": time.process_time() - c0 - evs[0]},
          open(os.path.join(a.out, f"{a.name}.json"), "w"))
