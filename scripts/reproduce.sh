#!/usr/bin/env bash
# `make reproduce`: the paper's Table 2 in miniature on the synthetic task (fixed seeds, ~1 hour on 2 cores).
#   three cold starts: Unseen SFT, Seen SFT, and the sequential baseline's SFT (no tags)
#   five RL recipes:   baseline, seen, unseen-s1, unseen-s2, scaffold
#   one evaluation of every checkpoint on the same held-out problems -> results/table.md
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
OUT=runs/reproduce
mkdir -p results
start=$(date +%s)
latest() { ls -d "$1"/checkpoint-* | sort -V | tail -1; }

$PY sft.py --out_dir=$OUT/sft_unseen --seed=0
$PY sft.py --mode=seen --out_dir=$OUT/sft_seen --seed=0
$PY sft.py --style=sequential --mode=seen --out_dir=$OUT/sft_sequential --seed=0

declare -A INIT=([baseline]=sft_sequential [seen]=sft_seen [unseen-s1]=sft_unseen [unseen-s2]=sft_unseen [scaffold]=sft_unseen)
dirs=()
for sft in sft_sequential sft_seen sft_unseen; do
  $PY eval.py --model="$(latest $OUT/$sft)" --name="SFT ($sft)" --out_dir=$OUT/eval_$sft
  dirs+=($OUT/eval_$sft)
done
for recipe in baseline seen unseen-s1 unseen-s2 scaffold; do
  $PY grpo.py --recipe=$recipe --model="$(latest $OUT/${INIT[$recipe]})" --out_dir=$OUT/grpo_$recipe --seed=0
  $PY eval.py --model="$(latest $OUT/grpo_$recipe)" --name="GRPO $recipe" --out_dir=$OUT/eval_$recipe
  $PY eval.py --plot=$OUT/grpo_$recipe || true
  dirs+=($OUT/eval_$recipe)
done
$PY eval.py --table="$(IFS=,; echo "${dirs[*]}")" --out_dir=results
echo "results/results.md written; reproduce took $(( $(date +%s) - start )) s"
