#!/bin/bash
res=$(/tmp/lagexp/frac.sh /tmp/wt-bis)
echo "$(git -C /tmp/wt-bis rev-parse --short HEAD) $res" >> /tmp/lagexp/bisect.log
case "$res" in *ERR*) exit 125;; esac
set -- $res
python3 -c "
import sys;a,b=float('$1'),float('$3')
sys.exit(0 if min(a,b)>=0.04 else 1 if max(a,b)<0.03 else 125)"
