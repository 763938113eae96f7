#!/usr/bin/env bash
# Curriculum probability sweep: 4 arms x 5 seeds, 600 optimizer steps each, rollflow only, one warm start.
# Run from the repository root (it ran from a frozen copy of the tree at 00f8072):
#   MODEL=<a warm-started add_gap model directory, e.g. runs/peer/tiny_hard-*/model> bench/results/curriculum_sweep/sweep.sh
set -u
cd "$(dirname "$0")/../../.."
mkdir -p runs
export PYTHONPATH=$PWD OMP_WAIT_POLICY=PASSIVE HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false MLFLOW_DISABLE_TELEMETRY=true DO_NOT_TRACK=true
MODEL=${MODEL:?set MODEL to the warm-started add_gap model directory (bench.peer writes one under runs/peer/)}
declare -A P=([A]="0.9 0.5" [B]="0.97 0.8" [C]="0.75 0.25" [D]="0.97 0.5")
ARMS=(A B C D)
for seed in 1 2 3 4 5; do
  for i in 0 1 2 3; do
    arm=${ARMS[$(( (i + seed - 1) % 4 ))]}
    set -- ${P[$arm]}
    echo "$(date +%T) seed $seed arm $arm ($1 / $2)"
    .venv/bin/python -m bench.peer --config configs/tiny_hard.yaml --systems rollflow --seeds $seed \
      --seconds 400 --max-steps 600 --sync-seconds 0 --snapshot-steps 150 300 450 600 \
      --out bench/results/curriculum_sweep/$arm-s$seed \
      model.bootstrap_tiny=false model.path=$MODEL rollout.skip_solved_prob=$1 rollout.skip_unsolved_prob=$2 \
      > runs/sweep-$arm-s$seed.log 2>&1 || echo "FAILED $arm $seed"
    grep -E "acc_at_step_600 |completions_per_s " runs/sweep-$arm-s$seed.log
  done
done
echo "$(date +%T) done"
