#!/usr/bin/env bash
# `make reproduce`: the paper's Table 2 in miniature on the embedded task, two seeds per row.
#   cold starts, per seed: Unseen SFT and Seen SFT (the mixed parallel/sequential traces), sequential SFT
#   RL recipes, per seed:  baseline (sequential), seen, unseen-s1, unseen-s2, scaffold; GRPO_STEPS steps each
#   every checkpoint evaluated on the same held-out problems of each difficulty (same sampling seeds)
# and writes results/results.md (mean ± half-spread over the seeds), results/s1_vs_s2.png (parallel ratio
# and <Parallel> position over steps) and results/curves_<recipe>.png. Two lanes (one per seed) of one
# thread each; step counts bound every run, so the table does not depend on the machine's speed.
set -euo pipefail
cd "$(dirname "$0")/../.."   # scripts/studies/ -> the repository
PY=.venv/bin/python
OUT=${OUT:-runs/reproduce}
GRPO_STEPS=${GRPO_STEPS:-60}
GRPO_LR=${GRPO_LR:-3e-4}    # results/results.md was made at 3e-4, 16 prompts x 8 (the demo: 1.5e-4, 32 x 4, 100 steps)
SEEDS=${SEEDS:-"0 1"}
export OMP_NUM_THREADS=1
mkdir -p "$OUT" results
start=$(date +%s)
latest() { ls -d "$1"/checkpoint-* | sort -V | tail -1; }
run() { echo "[$(date +%H:%M:%S)] $*"; "$@"; }
done_already() {  # $1 = run folder, $2 = its last step: a rerun skips what a previous run finished
  [ -d "$1/checkpoint-$2" ] && echo "[$(date +%H:%M:%S)] skip $1 (checkpoint-$2 exists)"
}
evaluate() {  # $1 = method name, $2 = run folder, $3 = seed
  run $PY eval.py --model="$(latest "$2")" --name="$1" --out_dir="$OUT/eval_$(basename "$2")"
}

lane() {  # $1 = seed
  local s=$1
  done_already $OUT/sft_unseen_seed$s 400 || run $PY sft.py --seed=$s --out_dir=$OUT/sft_unseen_seed$s
  done_already $OUT/sft_seen_seed$s 400 || run $PY sft.py --seed=$s --mode=seen --out_dir=$OUT/sft_seen_seed$s
  done_already $OUT/sft_sequential_seed$s 400 ||
    run $PY sft.py --seed=$s --style=sequential --mode=seen --out_dir=$OUT/sft_sequential_seed$s
  evaluate "SFT (sequential)" $OUT/sft_sequential_seed$s $s
  evaluate "SFT (Seen)" $OUT/sft_seen_seed$s $s
  evaluate "SFT (Unseen)" $OUT/sft_unseen_seed$s $s
  for recipe in baseline seen unseen-s1 unseen-s2 scaffold; do
    case $recipe in baseline) init=sft_sequential ;; seen) init=sft_seen ;; *) init=sft_unseen ;; esac
    done_already $OUT/grpo_${recipe}_seed$s $GRPO_STEPS ||
      run $PY grpo.py --recipe=$recipe --seed=$s --model="$(latest $OUT/${init}_seed$s)" --max_steps=$GRPO_STEPS \
          --lr=$GRPO_LR --batch_size=16 --group_size=8 \
          --eval_data= --out_dir=$OUT/grpo_${recipe}_seed$s
    evaluate "GRPO $recipe" $OUT/grpo_${recipe}_seed$s $s
  done
}

pids=()
for s in $SEEDS; do
  echo "lane for seed $s: $OUT/lane_seed$s.log"
  lane $s > "$OUT/lane_seed$s.log" 2>&1 & pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
[ $status = 0 ] || { echo "a lane failed: see $OUT/lane_seed*.log"; exit 1; }
grep -h "^\[" "$OUT"/lane_seed*.log | sort

order="sft_sequential grpo_baseline sft_seen grpo_seen sft_unseen grpo_unseen-s1 grpo_unseen-s2 grpo_scaffold"
dirs=$(for m in $order; do for s in $SEEDS; do echo "$OUT/eval_${m}_seed$s"; done; done)
$PY scripts/studies/seeds_table.py $dirs --out=results/results.md
$PY scripts/look/plot_s1_s2.py results/s1_vs_s2.png $(for s in $SEEDS; do echo $OUT/grpo_unseen-s1_seed$s $OUT/grpo_unseen-s2_seed$s; done) \
  || echo "(no plot: pip install -r requirements-extra.txt)"
for recipe in baseline seen unseen-s1 unseen-s2 scaffold; do
  $PY scripts/look/plot.py $OUT/grpo_${recipe}_seed0 >/dev/null 2>&1 && cp $OUT/grpo_${recipe}_seed0/curves.png results/curves_$recipe.png || true
done
echo "results/results.md written; reproduce took $(( $(date +%s) - start )) s"
