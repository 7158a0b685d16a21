"""vaco_no_realign at age-32 (diagnose-no-realign-age32) against the quick profile's vaco and ppo age-32 cells (serial,
bit-reproducible; vaco from the cells of fingerprint 1dd1b88b, the default's arithmetic since 2cbeb42).

    .venv/bin/python bench/age32_no_realign.py
"""
import json, glob, collections
from asyncrl import stats
def load(d, cond="age-32", fingerprint=None):
    out = collections.defaultdict(lambda: collections.defaultdict(dict))
    for f in glob.glob(f"{d}/cells/*/cell.json"):
        c = json.load(open(f))
        if fingerprint and c["preset"] == "vaco" and c["code_fingerprint"] != fingerprint:
            continue   # the quick study holds cells of older training code; 1dd1b88b: the default's arithmetic now
        if c.get("condition") == cond and c.get("final_return") is not None:
            out[c["label"]][c["env"]][c["seed"]] = c["final_return"]
    return out
q = load("bench/results/studies/quick", fingerprint="1dd1b88b3c4266c3"); n = load("bench/results/studies/diagnose-no-realign-age32")
arms = {"vaco": q["vaco"], "ppo": q["ppo"], "vaco_no_realign": n["vaco_no_realign"]}
for env in ["HalfCheetah-v5", "Hopper-v5", "Walker2d-v5"]:
    for a, d in arms.items():
        v = d[env]; iv = stats.aggregate({env: [v[s] for s in sorted(v)]})
        print(f"{env:15s} {a:16s} IQM {iv.value:6.0f} [{iv.low:.0f}, {iv.high:.0f}]  " + " ".join(f"{v[s]:.0f}" for s in sorted(v)))
    for x, y in [("vaco_no_realign", "ppo"), ("vaco_no_realign", "vaco"), ("vaco", "ppo")]:
        p = stats.probability_of_improvement({env: list(arms[x][env].values())}, {env: list(arms[y][env].values())})
        print(f"   P({x} > {y}) = {p.value:.2f} [{p.low:.2f}, {p.high:.2f}]")
for x, y in [("vaco_no_realign", "ppo"), ("vaco_no_realign", "vaco")]:
    p = stats.probability_of_improvement({e: list(arms[x][e].values()) for e in arms[x]}, {e: list(arms[y][e].values()) for e in arms[y]})
    print(f"all envs P({x} > {y}) = {p.value:.2f} [{p.low:.2f}, {p.high:.2f}]")
