"""Seed 301's six replayed cells, run twice (results/replay and results/replay-again): final return and
every metric of every learner iteration equal, but the ones that measure time. Writes
results/replay-again/equality.json (the run directories are not kept in git)."""

import json
from pathlib import Path

HERE = Path(__file__).parent / "results"
TIMED = ("wall_time_s", "lag_seconds_p50", "lag_seconds_p95")


def timed(key: str) -> bool:
    return key in TIMED or (key.startswith("lag_") and key.endswith("_s_mean"))


out = {}
for d in sorted((HERE / "replay-again" / "cells").iterdir()):
    a, b = (
        json.loads((r / "cells" / d.name / "cell.json").read_text()) for r in (HERE / "replay-again", HERE / "replay")
    )
    ma, mb = (
        [json.loads(x) for x in (r / "cells" / d.name / "run" / "metrics.jsonl").open()]
        for r in (HERE / "replay-again", HERE / "replay")
    )
    differ = sorted({k for x, y in zip(ma, mb) for k in x.keys() | y.keys() if x.get(k) != y.get(k)})
    out[d.name] = {
        "cell": f"{a['preset']} | {a['env']} | {a['condition']} | seed {a['seed']}",
        "final_return": [a["final_return"], b["final_return"]],
        "iterations": [len(ma), len(mb)],
        "keys_that_differ": differ,
        "equal_but_time": a["final_return"] == b["final_return"]
        and len(ma) == len(mb)
        and all(timed(k) for k in differ),
    }
(HERE / "replay-again" / "equality.json").write_text(json.dumps(out, indent=1) + "\n")
print(json.dumps({k: v["equal_but_time"] for k, v in out.items()}))
