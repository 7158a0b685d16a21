"""Warm-up experiments of lab/llm-gsm-tiny/warmup.md: prepare (cached under runs/exp/models), warm up, evaluate snapshots and
the final model with or without the calculator, error breakdown; JSON to runs/exp/results/NAME.json.
Run from the repo root: PYTHONPATH=. nice -n 19 python lab/llm-gsm-tiny/scripts/llm_warmup_exp.py NAME --steps 300 --calc-mask 1 --eval calc"""
import argparse, json, os, re, sys, time, collections
import torch
os.environ["HF_HUB_OFFLINE"] = "1"; os.environ["TOKENIZERS_PARALLELISM"] = "false"
from asyncrl.tasks.llm import gsm, model as m, sampling, warmup as w

ap = argparse.ArgumentParser()
ap.add_argument("name"); ap.add_argument("--config", default="configs/llm/tiny-qwen2.json")
ap.add_argument("--seed", type=int, default=0); ap.add_argument("--steps", type=int, default=300)
ap.add_argument("--bs", type=int, default=32); ap.add_argument("--lr", type=float, default=3e-3)
ap.add_argument("--wsteps", type=int, default=30); ap.add_argument("--calc-mask", type=int, default=0)
ap.add_argument("--eval", default="calc,nocalc"); ap.add_argument("--n-train", type=int, default=20000)
ap.add_argument("--threads", type=int, default=2); ap.add_argument("--heldout", type=int, default=500)
ap.add_argument("--max-new", type=int, default=160); ap.add_argument("--ebs", type=int, default=64)
ap.add_argument("--load", default=None); ap.add_argument("--snap", type=int, default=100); ap.add_argument("--snap-n", type=int, default=200)
a = ap.parse_args()
torch.set_num_threads(a.threads)
cfgname = os.path.basename(a.config).replace(".json", "")
mdir, _ = m.prepare(f"runs/exp/models/{cfgname}-s{a.seed}", seed=a.seed, config_path=a.config)
lm, tok = m.load(a.load or mdir)
splits = gsm.make_splits(seed=a.seed, n_train=a.n_train, n_heldout=a.heldout)
res = {"args": vars(a), "params": m.num_parameters(lm), "load_start": os.getloadavg()}
snaps = {}
import copy
def logf(s, l):
    print(f"step {s} loss {l:.3f} cpu {time.process_time():.0f} wall {time.perf_counter():.0f}", file=sys.stderr, flush=True)
    if 0 < s < a.steps - 1: snaps[s] = copy.deepcopy(lm.state_dict())
if not a.load:
    t0, c0 = time.perf_counter(), time.process_time()
    r = w.warmup(lm, tok, splits.train, steps=a.steps, seed=a.seed, batch_size=a.bs, lr=a.lr, warmup_steps=a.wsteps,
                 calculator_mask=bool(a.calc_mask), log=logf, log_every=a.snap)
    res.update(train_wall=time.perf_counter() - t0, train_cpu=time.process_time() - c0, final_loss=r.final_loss, tokens=r.tokens)
    res["load_after_train"] = os.getloadavg()
    m.save(lm, tok, f"runs/exp/ckpt/{a.name}")

ANN = re.compile(r"<<([^<>=]*)=([^<>=]*)>>")

def analyse(problems, texts):
    first = collections.Counter(); by_steps = collections.defaultdict(lambda: [0, 0])
    op_err = collections.defaultdict(lambda: [0, 0]); kinds = collections.Counter()
    for p, t in zip(problems, texts):
        ref = ANN.findall(p.answer); got = ANN.findall(t)
        ok = gsm.reward(t, p.target) == 1.0
        by_steps[len(ref)][0] += ok; by_steps[len(ref)][1] += 1
        cat = None
        for k, (re_, rr) in enumerate(ref):
            op = re.search(r"[-+*/]", re_).group(0)
            op_err[op][1] += 1
            if k >= len(got):
                cat = "stopped early"; op_err[op][0] += 1; break
            ge, gr = got[k]
            if ge != re_:
                ra, rb = re.split(r"[-+*/]", re_); mm = re.fullmatch(r"(\d+)([-+*/])(\d+)", ge)
                if not mm: cat = "setup: malformed"
                elif mm.group(2) != op: cat = "setup: wrong op"
                elif mm.group(1) != ra: cat = "setup: wrong first operand (carry)"
                else: cat = "setup: wrong second operand (copy)"
                op_err[op][0] += 1; kinds[(cat, op)] += 1; break
            if gr != rr:
                cat = "arithmetic"; op_err[op][0] += 1; kinds[(cat, op)] += 1; break
        if cat is None and len(got) > len(ref): cat = "extra steps"
        if cat is None and not ok: cat = "final answer copy"
        first[cat or "correct"] += 1
    return {"first_error": dict(first.most_common()),
            "acc_by_steps": {k: round(v[0] / v[1], 3) for k, v in sorted(by_steps.items())},
            "n_by_steps": {k: v[1] for k, v in sorted(by_steps.items())},
            "step_error_by_op": {k: f"{v[0]}/{v[1]}={v[0]/max(1,v[1]):.3f}" for k, v in sorted(op_err.items())},
            "kinds": {f"{c}|{o}": n for (c, o), n in kinds.most_common()}}

final_state = copy.deepcopy(lm.state_dict())
calc0 = sampling.calculator_for(tok)
for s_, st in sorted(snaps.items()):
    lm.load_state_dict(st); t0 = time.perf_counter()
    acc = sampling.evaluate(lm, tok, splits.heldout[:a.snap_n], max_new_tokens=a.max_new, batch_size=a.ebs)
    res[f"snap{s_}"] = acc; print(f"snapshot {s_}: acc {acc:.3f} on {a.snap_n} ({time.perf_counter()-t0:.0f} s)", file=sys.stderr, flush=True)
lm.load_state_dict(final_state)
for mode in a.eval.split(","):
    if not mode: continue
    calc = sampling.calculator_for(tok) if mode == "calc" else None
    t0, c0 = time.perf_counter(), time.process_time(); texts = []
    for i in range(0, len(splits.heldout), a.ebs):
        chunk = splits.heldout[i:i + a.ebs]
        ids, mask = sampling.encode_prompts(tok, [gsm.format_prompt(p) for p in chunk])
        out = sampling.sample(lm, ids, mask, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, max_new_tokens=a.max_new, greedy=True, calculator=calc)
        texts += sampling.decode_completions(tok, out)
    acc = sum(gsm.reward(t, p.target) for t, p in zip(texts, splits.heldout)) / len(texts)
    res[mode] = {"acc": acc, "eval_wall": time.perf_counter() - t0, "eval_cpu": time.process_time() - c0,
                 "load": os.getloadavg(), **analyse(splits.heldout, texts), "example": texts[:2]}
json.dump(res, open(f"runs/exp/results/{a.name}.json", "w"), indent=1, default=str)
print(json.dumps({k: v for k, v in res.items()}, indent=1, default=str))
