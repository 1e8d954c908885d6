#!/usr/bin/env bash
# `make reproduce`: the paper's Table 2 in miniature on the embedded task, three seeds per row.
#   cold starts, per seed: Unseen SFT, Seen SFT (the mixed parallel/sequential traces), sequential SFT
#   RL recipes, per seed: baseline (from the sequential SFT), seen (from the Seen SFT), unseen-s1,
#     unseen-s2 and scaffold (from the Unseen SFT); each the tiny preset's GRPO (the demo's: 32
#     prompts x 4, lr 1.5e-4, KL 0.3, GRPO_STEPS steps)
#   every checkpoint evaluated on the same held-out problems of each difficulty, same sampling
#     seeds, on SPLIT: test (read once a reported run) or val (to choose a setting)
# results/results.md: per row, each cell the mean over the seeds and its 95% t interval across
# seeds (the seed as the unit: scripts/studies/seeds_table.py); results/s1_vs_s2.png and
# results/curves_<recipe>.png (seed 0). Jobs (one training and its evaluation) share $LANES
# one-thread lanes, the SFTs first; a GRPO job waits for the SFT it starts from. A rerun skips what
# exists, continues a training stopped midway, refuses a step whose folder another command made
# (scripts/studies/jobs.sh); stopping the script stops its jobs. results/ is written only with
# every setting at its default; any other run writes into $OUT (or RESULTS=).
set -euo pipefail
set -f                 # no file-name expansion: SEEDS='*' is a setting, not the folder's files
cd "$(dirname "$0")/../.."   # scripts/studies/ -> the repository
PY=${PY:-.venv/bin/python}
JOBS_SCRIPT=reproduce.sh
source scripts/studies/jobs.sh   # check_python, step (run a command unless its output exists), run_lanes
DEFAULTS="OUT=runs/table2 GRPO_STEPS=100 SPLIT=test"   # (runs/reproduce: the two-seed table's)
DEFAULT_SEEDS="0 1 2"
OUT=${OUT:-runs/table2}
SEEDS=$(echo ${SEEDS-$DEFAULT_SEEDS})      # one space between words
GRPO_STEPS=${GRPO_STEPS:-100}
SPLIT=${SPLIT:-test}
LANES=${LANES:-2}
SFT_STEPS=400                     # the tiny preset's SFT steps (its last checkpoint)
WAIT_S=30                         # how often a GRPO job looks for the SFT another job trains
RECIPES="baseline seen unseen-s1 unseen-s2 scaffold"
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1

fail() {
  echo "reproduce.sh: $*" >&2
  exit 2
}
if [ $# -gt 0 ]; then
  fail "takes no arguments; its settings are environment variables, e.g." \
    "SEEDS=\"0 1\" make reproduce (all of them: the comment at its top)"
fi
check_list SEEDS "$SEEDS" ""
for name in LANES GRPO_STEPS; do
  if ! [[ ${!name} =~ ^[1-9][0-9]{0,8}$ ]]; then
    fail "$name=${!name}: give a whole number from 1 to 999999999"
  fi
done
if [ "$SPLIT" != test ] && [ "$SPLIT" != val ]; then
  fail "SPLIT=$SPLIT: give test (to report) or val (to choose a setting)"
fi
check_python
note_singular SEED
RESULTS_DIR=${RESULTS:-results}
if [ "$SEEDS" != "$DEFAULT_SEEDS" ]; then
  RESULTS_DIR=${RESULTS:-$OUT}
fi
for pair in $DEFAULTS; do
  name=${pair%%=*}
  if [ "${!name}" != "${pair#*=}" ]; then
    RESULTS_DIR=${RESULTS:-$OUT}
  fi
done
make_folders OUT="$OUT" RESULTS="$RESULTS_DIR"
# One reproduce.sh at a time in OUT: a second one would train the same runs into the same folders.
# The lock is the open file: it goes when this script and its jobs end, however they end.
exec {lock_fd}> "$OUT/.reproduce.lock"
if ! flock -n "$lock_fd"; then
  fail "another reproduce.sh is running in OUT=$OUT ($OUT/.reproduce.lock is held): wait for" \
    "it, or give this run another OUT"
fi
start=$(date +%s)

# The SFT behind each run: its folder's name (sft_<style>_seed<s>) and sft.py's flags.
sft_flags() {
  case $1 in
    unseen) echo "" ;;
    seen) echo "--mode=seen" ;;
    sequential) echo "--style=sequential --mode=seen" ;;
  esac
}
sft_of_recipe() {
  case $1 in
    baseline) echo sequential ;;
    seen) echo seen ;;
    *) echo unseen ;;
  esac
}
evaluate() {   # $1 = checkpoint, $2 = the table's row name, $3 = the evaluation's folder
  local data="synthetic:easy:$SPLIT,synthetic:medium:$SPLIT,synthetic:hard:$SPLIT"
  step "$3/summary.json" $PY eval.py --model="$1" --data="$data" --name="$2" --out_dir="$3"
}

# One job: $1 = sft or grpo, $2 = seed, $3 = the SFT's style or the GRPO recipe.
job() {
  local kind=$1
  local seed=$2
  local what=$3
  if [ "$kind" = sft ]; then
    local run=sft_${what}_seed$seed
    local name
    case $what in
      unseen) name="SFT (Unseen)" ;;
      seen) name="SFT (Seen)" ;;
      sequential) name="SFT (sequential)" ;;
    esac
    local sft_eval=""          # a val run reads no :test, not even the SFT's closing samples
    if [ "$SPLIT" = val ]; then
      sft_eval="--eval_data=synthetic:easy:val"
    fi
    step "$OUT/$run/checkpoint-$SFT_STEPS" $PY sft.py --seed="$seed" $(sft_flags "$what") \
      --max_steps="$SFT_STEPS" $sft_eval --out_dir="$OUT/$run" || return 1
    evaluate "$OUT/$run/checkpoint-$SFT_STEPS" "$name" "$OUT/eval_${run}_$SPLIT"
    return
  fi
  local sft=sft_$(sft_of_recipe "$what")_seed$seed
  local model=$OUT/$sft/checkpoint-$SFT_STEPS
  while [ ! -d "$model" ]; do
    if [ -f "$OUT/$sft.failed" ]; then
      echo "[$(date +%H:%M:%S)] $model: the SFT failed: see $OUT/$sft.log"
      return 1
    fi
    sleep "$WAIT_S"
  done
  local run=grpo_${what}_seed$seed
  step "$OUT/$run/checkpoint-$GRPO_STEPS" $PY grpo.py --recipe="$what" --seed="$seed" \
    --model="$model" --max_steps="$GRPO_STEPS" --eval_data= --out_dir="$OUT/$run" || return 1
  evaluate "$OUT/$run/checkpoint-$GRPO_STEPS" "GRPO $what" "$OUT/eval_${run}_$SPLIT"
}
export -f sft_flags sft_of_recipe evaluate job
export JOBS_SCRIPT PY OUT GRPO_STEPS SPLIT SFT_STEPS WAIT_S

jobs=""
for seed in $SEEDS; do
  for style in unseen seen sequential; do
    jobs+="sft $seed $style"$'\n'
  done
done
for seed in $SEEDS; do
  for recipe in $RECIPES; do
    jobs+="grpo $seed $recipe"$'\n'
  done
done
echo "reproduce.sh: seeds $SEEDS, $GRPO_STEPS GRPO steps, split $SPLIT, $LANES lanes;" \
  "logs: $OUT/<run>.log"
lane='run=$0_$2_seed$1
log=$OUT/$run.log
echo "[$(date +%H:%M:%S)] start $0 $2 seed $1"
echo "== reproduce.sh, $(date)" >> "$log"
t0=$(date +%s)
rm -f "$OUT/$run.failed"
if job "$0" "$1" "$2" >> "$log" 2>&1; then
  job_done "$0 $2 seed $1" "$t0"
else
  touch "$OUT/$run.failed"
  echo "[$(date +%H:%M:%S)] FAILED $0 $2 seed $1: see $log"
  exit 1
fi'
if ! run_lanes "$LANES" "$lane" "$jobs"; then
  echo "reproduce.sh: a job failed or was refused (its FAILED line above names its log, which" \
    "says why); run it again once that is fixed: finished steps are skipped" >&2
  exit 1
fi

order="sft_sequential grpo_baseline sft_seen grpo_seen sft_unseen grpo_unseen-s1 grpo_unseen-s2"
order+=" grpo_scaffold"
folders=()
for run in $order; do
  for seed in $SEEDS; do
    folders+=("$OUT/eval_${run}_seed${seed}_$SPLIT")
  done
done
table=$RESULTS_DIR/results.md
$PY scripts/studies/seeds_table.py "${folders[@]}" --out="$table"
heading="make reproduce: seeds $SEEDS, $GRPO_STEPS GRPO steps (the tiny preset), split $SPLIT"
printf "%s\n\n%s\n" "$heading" "$(cat "$table")" > "$table"
curves=()
for seed in $SEEDS; do
  curves+=("$OUT/grpo_unseen-s1_seed$seed" "$OUT/grpo_unseen-s2_seed$seed")
done
$PY scripts/look/plot_s1_s2.py "$RESULTS_DIR/s1_vs_s2.png" "${curves[@]}" \
  || echo "(no plot: pip install -r requirements-extra.txt)"
first_seed=${SEEDS%% *}
for recipe in $RECIPES; do
  curve=$OUT/grpo_${recipe}_seed$first_seed/curves.png
  if $PY scripts/look/plot.py "$(dirname "$curve")" > /dev/null 2>&1 && [ -f "$curve" ]; then
    cp "$curve" "$RESULTS_DIR/curves_$recipe.png"
  fi
done
echo "reproduce.sh took $(( $(date +%s) - start )) s; table: $RESULTS_DIR/results.md"
