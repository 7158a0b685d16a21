#!/bin/bash
# prints lag>=2 fraction for the code in $1 (2 runs, 200k steps, seed 101)
SRC=$1; out=""
for r in 1 2; do
  d=/tmp/lagexp/bis-$r; rm -rf $d
  (cd $SRC && PYTHONPATH=$SRC timeout 300 /work/main/.venv/bin/python -m asyncrl.cli run --total-steps 200000 --seed 101 --run-dir $d --set run.log_every_s=1000 >$d.out 2>&1)
  f=$(python3 -c "
import json;s=json.load(open('$d/summary.json'));h=s['lag_histogram'];t=sum(h.values());print(round(sum(v for k,v in h.items() if int(k)>=2)/t,3), round(s['env_steps_per_s']))" 2>/dev/null || echo "ERR")
  out="$out $f"
done
echo "$out"
