#!/usr/bin/env bash
# `bash scripts/budget.sh`: where parallel thinking pays (README, "Accuracy against the budget").
# Three methods, three seeds, each trained under one budget and evaluated once; the curve is read
# from the evaluation's samples at several caps (scripts/budget_curve.py):
#   sequential   sft.py --style=sequential --mode=seen  ->  grpo.py --recipe=baseline
#   parallel-2   sft.py (blocks of 2 paths)             ->  grpo.py --recipe=unseen-s1 --num_paths=2
#   parallel-4   sft.py --max_paths=4 (2 to 4 paths)    ->  grpo.py --recipe=unseen-s1 --num_paths=4
#   parallel-4-all  the same, every round of the SFT traces a block (--parallel_fraction=1.0)
# GRPO runs under the decode-step budget (--budget=steps --max_new_tokens=$BUDGET; for the
# sequential chain a step is a token). Each GRPO checkpoint is evaluated once, under a step budget
# of $EVAL_BUDGET, on all 500 test problems per difficulty, 4 samples each; budget_curve.py then
# counts a response as right at cap c only if it is right and spent at most c tokens (or decode
# steps): a post-hoc cut, the same for every method.
# Jobs run on $LANES one-thread lanes, longest first (~50 min on 2 cores); a failed chain does not
# stop the others, and a rerun skips every step whose output exists. The runs land in $OUT. The
# table (budget.md) and the plot (budget.png) go to results/ for the default SEEDS and METHODS,
# else to $OUT (set RESULTS= to choose).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/budget}
DEFAULT_SEEDS="0 1 2"
SEEDS=$(echo ${SEEDS-$DEFAULT_SEEDS})      # one space between words
LANES=${LANES:-2}
BUDGET=${BUDGET:-48}
GRPO_STEPS=${GRPO_STEPS:-100}
EVAL_BUDGET=${EVAL_BUDGET:-128}
KNOWN_METHODS="parallel-4-all parallel-4 parallel-2 sequential"
DEFAULT_METHODS="parallel-4-all parallel-2 sequential"     # longest chains first
METHODS=$(echo ${METHODS-$DEFAULT_METHODS})
CAPS=${CAPS:-32,40,44,48,56,64,80,96,128}
SFT_STEPS=400          # the tiny preset's SFT steps: its last checkpoint
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1

# Check the settings before anything starts.
if [ -z "${SEEDS// /}" ] || [ -z "${METHODS// /}" ]; then
  echo "budget.sh: SEEDS and METHODS must not be empty (defaults: SEEDS=\"$DEFAULT_SEEDS\"," \
    "METHODS=\"$DEFAULT_METHODS\")" >&2
  exit 2
fi
for seed in $SEEDS; do
  if ! [[ $seed =~ ^[0-9]+$ ]]; then
    echo "budget.sh: SEEDS holds '$seed': give whole numbers, e.g. SEEDS=\"0 1 2\"" >&2
    exit 2
  fi
done
if ! [[ $LANES =~ ^[1-9][0-9]*$ ]]; then
  echo "budget.sh: LANES=$LANES: give the number of jobs at once, 1 or more (2 on 2 cores)" >&2
  exit 2
fi
for method in $METHODS; do
  if ! [[ " $KNOWN_METHODS " == *" $method "* ]]; then
    echo "budget.sh: unknown method '$method' in METHODS; known: $KNOWN_METHODS" >&2
    exit 2
  fi
done
if [ "$SEEDS" = "$DEFAULT_SEEDS" ] && [ "$METHODS" = "$DEFAULT_METHODS" ]; then
  RESULTS=${RESULTS:-results}
else
  RESULTS=${RESULTS:-$OUT}
fi
mkdir -p "$OUT" "$RESULTS"
start=$(date +%s)

# One chain: $1 = method, $2 = seed. Writes $OUT/<method>-seed<seed>/{sft,grpo,eval}.
chain() {
  local method=$1
  local seed=$2
  local dir=$OUT/$method-seed$seed
  local sft_args
  local grpo_args
  local eval_args
  case $method in
    sequential)
      sft_args="--style=sequential --mode=seen"
      grpo_args="--recipe=baseline"
      eval_args="" ;;
    parallel-2)
      sft_args=""
      grpo_args="--recipe=unseen-s1 --num_paths=2"
      eval_args="--num_paths=2" ;;
    parallel-4)
      sft_args="--max_paths=4"
      grpo_args="--recipe=unseen-s1 --num_paths=4"
      eval_args="--num_paths=4" ;;
    parallel-4-all)
      sft_args="--max_paths=4 --parallel_fraction=1.0"
      grpo_args="--recipe=unseen-s1 --num_paths=4"
      eval_args="--num_paths=4" ;;
    *) echo "unknown method $method"; return 2 ;;
  esac
  step() {
    echo "[$(date +%H:%M:%S)] $*"
    local t0
    t0=$(date +%s)
    local status=0
    "$@" || status=$?
    if [ "$status" -ne 0 ]; then
      echo "[$(date +%H:%M:%S)] failed (exit $status): $*"
      return 1
    fi
    echo "[$(date +%H:%M:%S)] done in $(( $(date +%s) - t0 )) s"
  }
  if [ ! -d "$dir/sft/checkpoint-$SFT_STEPS" ]; then
    step $PY sft.py --seed="$seed" $sft_args --out_dir="$dir/sft" || return 1
  fi
  if [ ! -d "$dir/grpo/checkpoint-$GRPO_STEPS" ]; then
    step $PY grpo.py $grpo_args --seed="$seed" --model="$dir/sft/checkpoint-$SFT_STEPS" \
      --budget=steps --max_new_tokens="$BUDGET" --max_steps="$GRPO_STEPS" --eval_data= \
      --out_dir="$dir/grpo" || return 1
  fi
  if [ ! -f "$dir/eval/summary.json" ]; then
    step $PY eval.py --model="$dir/grpo/checkpoint-$GRPO_STEPS" $eval_args --budget=steps \
      --max_new_tokens="$EVAL_BUDGET" --limit=0 --k=4 --name="$method" --out_dir="$dir/eval" || return 1
  fi
}
export -f chain
export PY OUT BUDGET GRPO_STEPS EVAL_BUDGET SFT_STEPS

jobs=""
for method in $METHODS; do
  for seed in $SEEDS; do
    jobs+="$method $seed"$'\n'
  done
done
echo "budget.sh: methods $METHODS, seeds $SEEDS, $LANES lanes; logs: $OUT/<method>-seed<s>.log"
# Each lane: one chain; a failure is reported, the other chains go on (their outputs are kept).
lane='echo "[$(date +%H:%M:%S)] start $0 seed $1"
if chain "$0" "$1" > "$OUT/$0-seed$1.log" 2>&1; then
  echo "[$(date +%H:%M:%S)] done $0 seed $1"
else
  echo "[$(date +%H:%M:%S)] FAILED $0 seed $1: see $OUT/$0-seed$1.log"
  exit 1
fi'
if ! printf "%s" "$jobs" | xargs -P "$LANES" -L 1 bash -c "$lane"; then
  echo "budget.sh: a chain failed (above); fix it and run again: finished steps are skipped" >&2
  exit 1
fi

$PY scripts/budget_curve.py "$OUT" --seeds="${SEEDS// /,}" --caps="$CAPS" \
  --failures_at="$BUDGET" --eval_budget="$EVAL_BUDGET" --plot="$RESULTS/budget.png" \
  | tee "$RESULTS/budget.md"
echo "budget.sh took $(( $(date +%s) - start )) s; table: $RESULTS/budget.md," \
  "plot: $RESULTS/budget.png"
