#!/usr/bin/env bash
# `bash scripts/studies/carry_sft.sh SEED DIR [sft.py flags]`: the carry task's mixed SFT of one seed, in
# DIR (skipped when DIR/checkpoint-1000 exists; a flag such as --resume=True goes to sft.py). Half its traces open with a block of 4 paths, so the model may
# open one or not: the start of both scripts/studies/budget.sh's carry methods and scripts/studies/dynamics.sh's
# carry runs. 1,000 steps at 2e-3 (the tiny preset's 1e-3 learned the columns, not the neighbours).
# Its end-of-training evaluation reads :val (settings are chosen there; :test only reports).
set -euo pipefail
cd "$(dirname "$0")/../.."   # scripts/studies/ -> the repository
PY=${PY:-.venv/bin/python}
CARRY_SFT_STEPS=1000
CARRY_SFT_LR=2e-3
CARRY_PARALLEL_FRACTION=0.5   # the SFT traces that open with a block
if [ $# -lt 2 ] || ! [[ $1 =~ ^[0-9]+$ ]]; then
  echo "usage: bash scripts/studies/carry_sft.sh SEED DIR [sft.py flags] (SEED a whole number)" >&2
  exit 2
fi
if [ ! -d "$2/checkpoint-$CARRY_SFT_STEPS" ]; then
  $PY sft.py --seed="$1" --data=carry:hard --max_paths=4 \
    --parallel_fraction="$CARRY_PARALLEL_FRACTION" --lr="$CARRY_SFT_LR" \
    --max_steps="$CARRY_SFT_STEPS" --eval_data=carry:hard:val --out_dir="$2" "${@:3}"
fi
