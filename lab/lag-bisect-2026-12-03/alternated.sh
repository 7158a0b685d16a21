#!/bin/bash
# alternated: old default (9378646) vaco, HEAD vaco, HEAD ppo; main job, 2 actors, seed 101, 400k steps
cd /tmp/lagexp
PY=/work/main/.venv/bin/python
for r in 1 2 3; do
  for arm in old-vaco new-vaco new-ppo old-ppo; do
    case $arm in
      old-*) SRC=/tmp/wt-old;; new-*) SRC=/work/main;;
    esac
    P=""; [[ $arm == *ppo ]] && P="--preset ppo"
    d=/tmp/lagexp/$arm-r$r
    rm -rf $d
    echo "$(date +%T) $arm r$r load $(cut -d' ' -f1 /proc/loadavg)" >> /tmp/lagexp/log
    (cd $SRC && PYTHONPATH=$SRC timeout 600 $PY -m asyncrl.cli run --total-steps 400000 --seed 101 $P --run-dir $d --set run.log_every_s=1000 > $d.out 2>&1)
    $PY - $d $arm $r >> /tmp/lagexp/results.tsv <<'PYEOF'
import json,sys
s=json.load(open(sys.argv[1]+"/summary.json"))
print(sys.argv[2],sys.argv[3],round(s["env_steps_per_s"]),round(s["wall_time_s"],1),s.get("lag_p50"),s.get("lag_p95"),s.get("lag_seconds_p50"),s.get("lag_seconds_p95"),s.get("learner_iterations"),sep="\t")
PYEOF
  done
done
echo done >> /tmp/lagexp/log
