"""Paired A/B of the control learner iteration (issue 8, 2026-12-04): two asyncrl trees imported side
by side in one process (copied to /tmp/abpkgs as asyncrl_old / asyncrl_new), the same synthetic
HalfCheetah-shaped batch (T 64 x N 32, default config), iterations alternated; CPU seconds per
iteration, the per-pair ratio new/old, and whether the two trees' statistics are equal after all
iterations (the same seed and batch: equal means the same training, bit for bit).

    PRESET=vaco .venv/bin/python learner_ab.py OLD_TREE NEW_TREE 40
"""
import importlib, shutil, sys, time, statistics, torch, numpy as np
trees = {"old": sys.argv[1], "new": sys.argv[2]}
n = int(sys.argv[3]) if len(sys.argv) > 3 else 40
shutil.rmtree("/tmp/abpkgs", ignore_errors=True)
import os; os.makedirs("/tmp/abpkgs")
for name, root in trees.items():
    shutil.copytree(root + "/asyncrl", f"/tmp/abpkgs/asyncrl_{name}")
sys.path.insert(0, "/tmp/abpkgs")
torch.set_num_threads(1)
steps = {}
for name in trees:
    pkg = f"asyncrl_{name}"
    cfgmod = importlib.import_module(pkg + ".config")
    policy_mod = importlib.import_module(pkg + ".policy"); spec_mod = importlib.import_module(pkg + ".spec")
    upd = importlib.import_module(pkg + ".update"); dev = importlib.import_module(pkg + ".device")
    try: GA = importlib.import_module(pkg + ".optim").GuardedAdam
    except ImportError: GA = importlib.import_module(pkg + ".state").GuardedAdam
    cfg = cfgmod.load(None, [f"algo.preset={os.environ.get('PRESET', 'vaco')}"])
    torch.manual_seed(0)
    pol = policy_mod.build_policy(cfg.policy, 17, 6, discrete=False)
    opt = GA(pol.parameters(), lr=cfg.algo.lr, eps=cfg.algo.adam_eps, fused=True)
    sp = spec_mod.RolloutSpec(obs_dim=17, action_dim=6, discrete=False, rollout_length=cfg.env.rollout_length,
                              num_envs=cfg.env.num_envs * cfg.learner.slots_per_batch)
    rng = np.random.default_rng(0); arr = sp.allocate(); T, N = arr["rewards"].shape
    for k in ("obs", "final_obs", "actions"): arr[k][:] = rng.standard_normal(arr[k].shape, dtype=np.float32)
    arr["rewards"][:] = rng.standard_normal((T, N), dtype=np.float32); arr["truncated"][T - 1, ::4] = True
    batch = {k: torch.from_numpy(arr[k].copy()) for k in sp.batch_field_names}
    with torch.no_grad():
        lp = pol.distribution(pol.normalize(batch["obs"][:-1].reshape(T * N, -1))).log_prob(batch["actions"].reshape(T * N, -1))
    batch["behavior_log_prob"] = lp.view(T, N) + 0.01 * torch.from_numpy(rng.standard_normal((T, N), dtype=np.float32))
    gen = torch.Generator().manual_seed(0)
    steps[name] = (lambda pol=pol, opt=opt, batch=batch, gen=gen, upd=upd, cfg=cfg:
                   upd.learner_iteration(pol, opt, batch, cfg=cfg.algo, generator=gen, version=0))
res = {k: [] for k in trees}; outs = {k: [] for k in trees}
for name in trees:
    for _ in range(3): steps[name]()
for i in range(n):
    order = list(trees) if i % 2 == 0 else list(trees)[::-1]
    for name in order:
        c = time.process_time(); s = steps[name](); res[name].append(time.process_time() - c)
        outs[name].append(s)
ratios = [b / a for a, b in zip(res["old"], res["new"])]
for k in trees: print(k, "median %.4f min %.4f" % (statistics.median(res[k]), min(res[k])))
print("new/old per pair: median %.3f  [p25 %.3f, p75 %.3f]" % (statistics.median(ratios), *np.percentile(ratios, [25, 75])))
a, b = outs["old"][-1], outs["new"][-1]
diff = [k for k in a if k != "minibatches" and not (a[k] == b.get(k) or (a[k] != a[k] and b.get(k) != b.get(k)))]
print("stats keys differing in last iteration:", diff, "minibatches equal:", a["minibatches"] == b["minibatches"])
