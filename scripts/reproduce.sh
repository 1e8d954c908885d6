#!/usr/bin/env bash
# `make reproduce`: the paper's Table 2 in miniature on the synthetic task (fixed seeds and step counts).
#   three cold starts: Unseen SFT, Seen SFT, and the sequential baseline's SFT (no tags)
#   five RL recipes:   baseline, seen, unseen-s1, unseen-s2, scaffold -- each GRPO_STEPS steps
#   one evaluation of every checkpoint on the same held-out problems -> results/results.md
# Two lanes run side by side, one thread each (about 35 minutes on 2 cores; 40 GRPO steps = what the
# default 400-s `python grpo.py` gets on 2 cores):
#   lane A  Unseen SFT -> unseen-s1, unseen-s2, scaffold
#   lane B  Seen SFT, sequential SFT -> seen, baseline
# Step counts, not wall time, bound every run, so the table does not depend on the machine's speed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
OUT=${OUT:-runs/reproduce}
GRPO_STEPS=${GRPO_STEPS:-40}
export OMP_NUM_THREADS=1
mkdir -p "$OUT" results
start=$(date +%s)
latest() { ls -d "$1"/checkpoint-* | sort -V | tail -1; }
run() { echo "[$(date +%H:%M:%S)] $*"; "$@"; }

sft_and_eval() {   # $1 = name, then sft.py arguments
  local name=$1; shift
  run $PY sft.py --out_dir=$OUT/$name --seed=0 "$@"
  run $PY eval.py --model="$(latest $OUT/$name)" --name="SFT ($name)" --out_dir=$OUT/eval_$name
}
grpo_and_eval() {  # $1 = recipe, $2 = its SFT run
  run $PY grpo.py --recipe=$1 --model="$(latest $OUT/$2)" --out_dir=$OUT/grpo_$1 --seed=0 \
      --max_steps=$GRPO_STEPS --max_time=0
  run $PY eval.py --model="$(latest $OUT/grpo_$1)" --name="GRPO $1" --out_dir=$OUT/eval_$1
  if $PY scripts/plot.py $OUT/grpo_$1; then cp $OUT/grpo_$1/curves.png results/curves_$1.png
  else echo "(no plot for $1: pip install -r requirements-plot.txt)"; fi
}
lane_a() {
  sft_and_eval sft_unseen
  for recipe in unseen-s1 unseen-s2 scaffold; do grpo_and_eval $recipe sft_unseen; done
}
lane_b() {
  sft_and_eval sft_seen --mode=seen
  sft_and_eval sft_sequential --style=sequential --mode=seen
  for recipe in seen baseline; do grpo_and_eval $recipe sft_$([ $recipe = seen ] && echo seen || echo sequential); done
}

echo "lane A log: $OUT/lane_a.log    lane B log: $OUT/lane_b.log"
lane_a > $OUT/lane_a.log 2>&1 & a=$!
lane_b > $OUT/lane_b.log 2>&1 & b=$!
status=0
wait $a || { echo "lane A failed: see $OUT/lane_a.log"; status=1; }
wait $b || { echo "lane B failed: see $OUT/lane_b.log"; status=1; }
[ $status = 0 ] || exit 1
grep -h "^\[" $OUT/lane_a.log $OUT/lane_b.log | sort

dirs=$OUT/eval_sft_sequential,$OUT/eval_baseline,$OUT/eval_sft_seen,$OUT/eval_seen,$OUT/eval_sft_unseen
dirs=$dirs,$OUT/eval_unseen-s1,$OUT/eval_unseen-s2,$OUT/eval_scaffold
$PY scripts/table.py $dirs --out_dir=results
echo "results/results.md written; reproduce took $(( $(date +%s) - start )) s"
