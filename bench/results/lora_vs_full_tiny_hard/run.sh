#!/bin/bash
cd /tmp/wt
export PYTHONPATH=/tmp/wt
OUT=/tmp/lorarun/res
mkdir -p $OUT
for seed in 1 2 3; do
  for v in full lora; do
    if [ $v = lora ]; then extra="train.lora.rank=8 train.lr=1e-3"; else extra=""; fi
    echo "== $v seed $seed $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/log.txt
    .venv/bin/python -m bench.peer --config configs/tiny_hard.yaml --systems rollflow --seconds 600 --seeds $seed \
      --sync-seconds 0 --snapshot-every 30 --snapshot-steps 250 500 1000 1500 --out $OUT/${v}_s$seed $extra > $OUT/${v}_s$seed.txt 2>&1
    echo "   done $(date +%T) rc $? load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/log.txt
  done
done
