#!/bin/bash
for r in 1 2 3; do
  for arm in old new; do
    SRC=/work/main; [ $arm = old ] && SRC=/tmp/wt-old
    echo "== $arm r$r $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    (cd $SRC && PYTHONPATH=$SRC /work/main/.venv/bin/python /work/main/bench/throughput.py --runs 1 --seconds 40 2>&1 | grep "^run 0")
  done
done
