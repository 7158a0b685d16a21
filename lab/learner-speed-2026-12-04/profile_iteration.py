"""cProfile (or CPU time) of the control learner iteration on bench/learner_speed.py's batch, for one tree.

    .venv/bin/python profile_iteration.py TREE 30                 # CPU s per iteration: p10, median, min
    .venv/bin/python profile_iteration.py TREE prof cumulative    # cProfile of 10 iterations
"""
import cProfile, pstats, sys, time, torch
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[1] + "/bench")
import learner_speed as ls
from asyncrl.core.device import check_device, forward_context
dev = check_device("cpu", "fp32"); fwd = forward_context(dev, "fp32")
cfg = ls.read_config(None)
step, _ = ls.control_case(cfg, dev, fwd)
torch.set_num_threads(1)
for _ in range(3): step()
if len(sys.argv) > 2 and sys.argv[2] == "prof":
    pr = cProfile.Profile(); pr.enable()
    for _ in range(10): step()
    pr.disable(); pstats.Stats(pr).sort_stats(sys.argv[3] if len(sys.argv)>3 else "tottime").print_stats(45)
else:
    ts = []
    for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 15):
        c = time.process_time(); step(); ts.append(time.process_time() - c)
    ts.sort(); print(f"cpu s/iter p10 {ts[len(ts)//10]:.4f} median {ts[len(ts)//2]:.4f} min {ts[0]:.4f}")
