#!/usr/bin/env bash
# `bash scripts/studies/budget.sh`: where parallel thinking pays (README, "Where parallel thinking pays").
# Two tasks, each method on three seeds, trained under one decode-step budget and evaluated once;
# the curve is read from the evaluation's samples at several caps (scripts/studies/budget_curve.py).
#
# The pair task (synthetic:*, attempts of ~15 tokens), in $OUT (runs/budget):
#   sequential   sft.py --style=sequential --mode=seen  ->  grpo.py --recipe=baseline
#   parallel-2   sft.py (blocks of 2 paths)             ->  grpo.py --recipe=unseen-s1 --num_paths=2
#   parallel-4   sft.py --max_paths=4 (2 to 4 paths)    ->  grpo.py --recipe=unseen-s1 --num_paths=4
#   parallel-4-all  the same, every round of the SFT traces a block (--parallel_fraction=1.0)
# GRPO at $BUDGET decode steps, 100 steps; eval.py on all 500 test problems per difficulty x 4
# at $EVAL_BUDGET steps.
#
# The carry task (carry:*, attempts of ~47 tokens), in $CARRY_OUT (runs/budget-carry), hard only.
# One SFT per seed, on traces of which half open with a block of 4 paths (sft.py --max_paths=4,
# $CARRY_SFT_STEPS steps, in sft-seed<s>), is the start of both methods:
#   sequential   grpo.py --recipe=baseline (blocks masked)
#   parallel-4   grpo.py --recipe=unseen-s1 --num_paths=4 --max_blocks=1
# GRPO on carry:hard:rl at $CARRY_BUDGET decode steps; eval.py on $CARRY_EVAL_LIMIT hard test
# problems x 4 at $CARRY_EVAL_BUDGET steps. The sequential chain trains the SFT; the parallel
# chain of the same seed waits for it.
#
# GRPO runs under the decode-step budget (--budget=steps; for the sequential chain a step is a
# token); budget_curve.py counts a response as right at cap c only if it is right and spent at
# most c tokens (or decode steps): a post-hoc cut, the same for every method.
# Jobs run on $LANES one-thread lanes; a failed chain does not stop the others. A rerun skips every
# step whose output exists, continues a training stopped midway, and refuses a step whose folder
# another command made (scripts/studies/jobs.sh); stopping the script stops its jobs. TASKS (default
# "pair carry") picks the tasks; a task left out keeps its earlier table and curves
# (results/budget-<task>.json). Per task, budget_curve.py writes its curves to
# results/budget-<task>.json when every setting is the default (else to the task's OUT; RESULTS=
# chooses); then results/budget.md holds both tasks' tables and results/budget.png a row per task.
set -euo pipefail
set -f                 # no file-name expansion: TASKS='*' is a setting, not the folder's files
cd "$(dirname "$0")/../.."   # scripts/studies/ -> the repository
PY=${PY:-.venv/bin/python}
JOBS_SCRIPT=budget.sh
source scripts/studies/jobs.sh   # check_python, step (run a command unless its output exists), run_lanes
DEFAULT_TASKS="pair carry"
TASKS=$(echo ${TASKS-$DEFAULT_TASKS})
DEFAULT_SEEDS="0 1 2"
SEEDS=$(echo ${SEEDS-$DEFAULT_SEEDS})      # one space between words
LANES=${LANES:-2}
# The pair task
PAIR_DEFAULTS="OUT=runs/budget BUDGET=48 GRPO_STEPS=100 EVAL_BUDGET=128"
OUT=${OUT:-runs/budget}
BUDGET=${BUDGET:-48}
GRPO_STEPS=${GRPO_STEPS:-100}
EVAL_BUDGET=${EVAL_BUDGET:-128}
KNOWN_METHODS="parallel-4-all parallel-4 parallel-2 sequential"
DEFAULT_METHODS="parallel-4-all parallel-2 sequential"     # longest chains first
METHODS=$(echo ${METHODS-$DEFAULT_METHODS})
DEFAULT_CAPS=32,40,44,48,56,64,80,96,128
CAPS=${CAPS:-$DEFAULT_CAPS}
SFT_STEPS=400          # the tiny preset's SFT steps: its last checkpoint
PAIR_TARGET=5          # issue 27's target lead (points)
# The carry task
CARRY_DEFAULTS="CARRY_OUT=runs/budget-carry CARRY_BUDGET=104 CARRY_GRPO_STEPS=100"
CARRY_DEFAULTS+=" CARRY_EVAL_BUDGET=448 CARRY_EVAL_LIMIT=500"
CARRY_OUT=${CARRY_OUT:-runs/budget-carry}
CARRY_METHODS="sequential parallel-4"                       # the SFT's chain first
CARRY_BUDGET=${CARRY_BUDGET:-104}
CARRY_GRPO_STEPS=${CARRY_GRPO_STEPS:-100}
CARRY_GRPO_BATCH=16    # prompts per GRPO step (the tiny preset's 32 halved: the responses are long)
CARRY_EVAL_BUDGET=${CARRY_EVAL_BUDGET:-448}
CARRY_EVAL_LIMIT=${CARRY_EVAL_LIMIT:-500}
DEFAULT_CARRY_CAPS=64,80,96,104,112,128,160,192,256,320,384,448
CARRY_CAPS=${CARRY_CAPS:-$DEFAULT_CARRY_CAPS}
CARRY_SFT_STEPS=1000   # scripts/studies/carry_sft.sh's (its last checkpoint)
CARRY_TARGET=10        # issue 33's target lead (points)
WAIT_S=30              # how often a parallel carry chain looks for its base
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1

if [ $# -gt 0 ]; then
  echo "budget.sh takes no arguments; its settings are environment variables, e.g." \
    "SEEDS=\"0\" TASKS=carry bash scripts/studies/budget.sh (all of them: the comment at its top)" >&2
  exit 2
fi
# Check the settings before anything starts.
if [ -z "${SEEDS// /}" ] || [ -z "${METHODS// /}" ] || [ -z "${TASKS// /}" ]; then
  echo "budget.sh: SEEDS, METHODS and TASKS must not be empty (defaults:" \
    "SEEDS=\"$DEFAULT_SEEDS\", METHODS=\"$DEFAULT_METHODS\", TASKS=\"$DEFAULT_TASKS\")" >&2
  exit 2
fi
for task in $TASKS; do
  if [ "$task" != pair ] && [ "$task" != carry ]; then
    echo "budget.sh: unknown task '$task' in TASKS; known: $DEFAULT_TASKS" >&2
    exit 2
  fi
  if [ "$(echo "$TASKS" | tr ' ' '\n' | grep -cx "$task")" -gt 1 ]; then
    echo "budget.sh: TASKS=\"$TASKS\" names $task twice: give each task once" >&2
    exit 2
  fi
done
for seed in $SEEDS; do
  if ! [[ $seed =~ ^(0|[1-9][0-9]*)$ ]]; then
    echo "budget.sh: SEEDS holds '$seed': give whole numbers separated by spaces," \
      "e.g. SEEDS=\"0 1 2\"" >&2
    exit 2
  fi
  if [ "$(echo "$SEEDS" | tr ' ' '\n' | grep -cx "$seed")" -gt 1 ]; then
    echo "budget.sh: SEEDS=\"$SEEDS\" names seed $seed twice: give each seed once" >&2
    exit 2
  fi
done
# A comma list of budgets, each from 1 to the evaluation's: $1 = its setting's name, $2 = the
# list, $3 = the evaluation budget's setting, $4 = its value.
check_caps() {
  if ! [[ $2 =~ ^[0-9]{1,9}(,[0-9]{1,9})*$ ]]; then
    echo "budget.sh: $1=$2: give whole numbers separated by commas, e.g. $1=48,64,128" >&2
    exit 2
  fi
  local cap
  for cap in ${2//,/ }; do
    if [ "$cap" -lt 1 ] || [ "$cap" -gt "$4" ]; then
      echo "budget.sh: $1 holds $cap: give budgets from 1 to $3=$4 (the evaluation cuts" \
        "longer responses itself)" >&2
      exit 2
    fi
  done
}
for name in BUDGET GRPO_STEPS EVAL_BUDGET CARRY_BUDGET CARRY_GRPO_STEPS CARRY_EVAL_BUDGET \
    CARRY_EVAL_LIMIT; do
  if ! [[ ${!name} =~ ^[1-9][0-9]{0,8}$ ]]; then
    echo "budget.sh: $name=${!name}: give a whole number from 1 to 999999999" >&2
    exit 2
  fi
done
check_caps CAPS "$CAPS" EVAL_BUDGET "$EVAL_BUDGET"
check_caps CARRY_CAPS "$CARRY_CAPS" CARRY_EVAL_BUDGET "$CARRY_EVAL_BUDGET"
if ! [[ $LANES =~ ^[1-9][0-9]*$ ]]; then
  echo "budget.sh: LANES=$LANES: give the number of jobs at once, 1 or more (2 on 2 cores)" >&2
  exit 2
fi
for method in $METHODS; do
  if ! [[ " $KNOWN_METHODS " == *" $method "* ]]; then
    echo "budget.sh: unknown method '$method' in METHODS; known: $KNOWN_METHODS" >&2
    exit 2
  fi
  if [ "$(echo "$METHODS" | tr ' ' '\n' | grep -cx "$method")" -gt 1 ]; then
    echo "budget.sh: METHODS=\"$METHODS\" names $method twice: give each method once" >&2
    exit 2
  fi
done
if [ "$OUT" -ef "$CARRY_OUT" ] || [ "$OUT" = "$CARRY_OUT" ]; then
  echo "budget.sh: OUT and CARRY_OUT are one folder ($OUT): give each task its own" >&2
  exit 2
fi
check_python
note_singular SEED TASK
# results/ (the README's tables and figure) is written only by a run with every default setting;
# any other run writes its report into its own OUT folder (or RESULTS=).
# $1 = the task's "NAME=default" list; true if each of those settings has its default.
all_defaults() {
  local pair
  for pair in $1; do
    local name=${pair%%=*}
    if [ "${!name}" != "${pair#*=}" ]; then
      return 1
    fi
  done
  [ "$SEEDS" = "$DEFAULT_SEEDS" ]
}
PAIR_RESULTS=${RESULTS:-$OUT}
if all_defaults "$PAIR_DEFAULTS" && [ "$METHODS" = "$DEFAULT_METHODS" ] \
    && [ "$CAPS" = "$DEFAULT_CAPS" ]; then
  PAIR_RESULTS=${RESULTS:-results}
fi
CARRY_RESULTS=${RESULTS:-$CARRY_OUT}
if all_defaults "$CARRY_DEFAULTS" && [ "$CARRY_CAPS" = "$DEFAULT_CARRY_CAPS" ]; then
  CARRY_RESULTS=${RESULTS:-results}
fi
for task in $TASKS; do
  if [ "$task" = pair ]; then
    make_folders OUT="$OUT" RESULTS="$PAIR_RESULTS"
  else
    make_folders CARRY_OUT="$CARRY_OUT" RESULTS="$CARRY_RESULTS"
  fi
done
start=$(date +%s)

# A pair-task chain: $1 = method, $2 = seed. Writes $OUT/<method>-seed<seed>/{sft,grpo,eval}.
pair_chain() {
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
  step "$dir/sft/checkpoint-$SFT_STEPS" $PY sft.py --seed="$seed" $sft_args \
    --out_dir="$dir/sft" || return 1
  step "$dir/grpo/checkpoint-$GRPO_STEPS" $PY grpo.py $grpo_args --seed="$seed" \
    --model="$dir/sft/checkpoint-$SFT_STEPS" --budget=steps --max_new_tokens="$BUDGET" \
    --max_steps="$GRPO_STEPS" --eval_data= --out_dir="$dir/grpo" || return 1
  step "$dir/eval/summary.json" $PY eval.py --model="$dir/grpo/checkpoint-$GRPO_STEPS" \
    $eval_args --budget=steps --max_new_tokens="$EVAL_BUDGET" --limit=0 --k=4 --name="$method" \
    --out_dir="$dir/eval" || return 1
}

# A carry-task chain: $1 = method, $2 = seed. Writes $CARRY_OUT/<method>-seed<seed>/{grpo,eval};
# the sequential chain first trains the seed's SFT ($CARRY_OUT/sft-seed<seed>), the parallel
# chain waits for it.
carry_chain() {
  local method=$1
  local seed=$2
  local dir=$CARRY_OUT/$method-seed$seed
  local sft=$CARRY_OUT/sft-seed$seed
  local start_model=$sft/checkpoint-$CARRY_SFT_STEPS
  local grpo_args
  local eval_args
  case $method in
    sequential)
      step "$start_model" bash scripts/studies/carry_sft.sh "$seed" "$sft" || return 1
      grpo_args="--recipe=baseline"
      eval_args="" ;;
    parallel-4)
      while [ ! -d "$start_model" ]; do
        if [ -f "$CARRY_OUT/sequential-seed$seed.failed" ]; then
          echo "[$(date +%H:%M:%S)] the SFT of seed $seed failed: see" \
            "$CARRY_OUT/sequential-seed$seed.log"
          return 1
        fi
        sleep "$WAIT_S"
      done
      grpo_args="--recipe=unseen-s1 --num_paths=4 --max_blocks=1"
      eval_args="--num_paths=4 --max_blocks=1" ;;
    *) echo "unknown method $method"; return 2 ;;
  esac
  step "$dir/grpo/checkpoint-$CARRY_GRPO_STEPS" $PY grpo.py $grpo_args --seed="$seed" \
    --model="$start_model" --data=carry:hard:rl --batch_size="$CARRY_GRPO_BATCH" --budget=steps \
    --max_new_tokens="$CARRY_BUDGET" --max_steps="$CARRY_GRPO_STEPS" --eval_data= \
    --out_dir="$dir/grpo" || return 1
  step "$dir/eval/summary.json" $PY eval.py --model="$dir/grpo/checkpoint-$CARRY_GRPO_STEPS" \
    $eval_args --data=carry:hard:test --limit="$CARRY_EVAL_LIMIT" --k=4 --budget=steps \
    --max_new_tokens="$CARRY_EVAL_BUDGET" --name="$method" --out_dir="$dir/eval" || return 1
}
export -f pair_chain carry_chain
export JOBS_SCRIPT PY OUT BUDGET GRPO_STEPS EVAL_BUDGET SFT_STEPS CARRY_OUT CARRY_BUDGET \
  CARRY_GRPO_STEPS CARRY_GRPO_BATCH CARRY_EVAL_BUDGET CARRY_EVAL_LIMIT CARRY_SFT_STEPS WAIT_S

# The jobs, longest first; a carry chain's base comes before the parallel chains that wait for it.
jobs=""
for task in $TASKS; do
  if [ "$task" = carry ]; then
    for method in $CARRY_METHODS; do
      for seed in $SEEDS; do
        jobs+="carry $method $seed"$'\n'
      done
    done
  else
    for method in $METHODS; do
      for seed in $SEEDS; do
        jobs+="pair $method $seed"$'\n'
      done
    done
  fi
done
logs=""
for task in $TASKS; do
  if [ "$task" = carry ]; then
    logs+=" $CARRY_OUT/<method>-seed<s>.log"
  else
    logs+=" $OUT/<method>-seed<s>.log"
  fi
done
echo "budget.sh: tasks $TASKS, seeds $SEEDS, $LANES lanes; logs:$logs"
# Each lane: one chain; a failure is reported (and marked for the chains that wait on it), the
# other chains go on (their outputs are kept).
lane='echo "[$(date +%H:%M:%S)] start $0 $1 seed $2"
dir=$OUT
if [ "$0" = carry ]; then
  dir=$CARRY_OUT
fi
rm -f "$dir/$1-seed$2.failed"
echo "== budget.sh, $(date)" >> "$dir/$1-seed$2.log"
t0=$(date +%s)
if "${0}_chain" "$1" "$2" >> "$dir/$1-seed$2.log" 2>&1; then
  job_done "$0 $1 seed $2" "$t0"
else
  touch "$dir/$1-seed$2.failed"
  echo "[$(date +%H:%M:%S)] FAILED $0 $1 seed $2: see $dir/$1-seed$2.log"
  exit 1
fi'
if ! run_lanes "$LANES" "$lane" "$jobs"; then
  echo "budget.sh: a chain failed (above); fix it and run again: finished steps are skipped" >&2
  exit 1
fi

# The tables and the curves of each task that ran; then both tasks' tables and the plot.
for task in $TASKS; do
  if [ "$task" = carry ]; then
    $PY scripts/studies/budget_curve.py "$CARRY_OUT" --seeds="${SEEDS// /,}" --caps="$CARRY_CAPS" \
      --failures_at="$CARRY_BUDGET" --eval_budget="$CARRY_EVAL_BUDGET" \
      --target_lead="$CARRY_TARGET" --json="$CARRY_RESULTS/budget-carry.json"
  else
    $PY scripts/studies/budget_curve.py "$OUT" --seeds="${SEEDS// /,}" --caps="$CAPS" \
      --failures_at="$BUDGET" --eval_budget="$EVAL_BUDGET" --target_lead="$PAIR_TARGET" \
      --json="$PAIR_RESULTS/budget-pair.json"
  fi
done
rows="$PAIR_RESULTS/budget-pair.json,$CARRY_RESULTS/budget-carry.json"
RESULTS_DIR=$CARRY_RESULTS
if [ "$TASKS" = pair ]; then
  RESULTS_DIR=$PAIR_RESULTS
fi
if [ -f "$PAIR_RESULTS/budget-pair.json" ] && [ -f "$CARRY_RESULTS/budget-carry.json" ]; then
  $PY scripts/studies/budget_curve.py --rows="$rows" --plot="$RESULTS_DIR/budget.png" \
    > "$RESULTS_DIR/budget.md"
  echo "budget.sh took $(( $(date +%s) - start )) s; tables: $RESULTS_DIR/budget.md," \
    "plot: $RESULTS_DIR/budget.png"
else
  echo "budget.sh took $(( $(date +%s) - start )) s; one task's curves are missing" \
    "($rows): run TASKS=\"$DEFAULT_TASKS\" for both tables and the plot"
fi
