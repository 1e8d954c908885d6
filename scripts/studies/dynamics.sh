#!/usr/bin/env bash
# `bash scripts/studies/dynamics.sh`: what RL does with the choice to think in parallel (README, "When RL
# chooses parallel thinking"). Every run starts from an SFT model that may open a block or not;
# GRPO then decides. Two tasks, each on SEEDS, in $OUT (runs/dynamics):
#
# The pair task at equal tokens (the paper's setting: the budget counts every token), per seed:
#   sft          sft.py --seed (the demo's SFT: blocks in about half the traces)
#   s1, s2       grpo.py --recipe=unseen-s1 / unseen-s2 $PAIR_FLAGS, $GRPO_STEPS steps
#   eval-sft, s1/eval, s2/eval   eval.py as the demo evaluates (64 test problems a part x 8)
# The carry task (hard), per seed:
#   sft          scripts/studies/carry_sft.sh (half the traces open with a block of 4 paths), shared with
#                scripts/studies/budget.sh (runs/budget-carry/sft-seed<s>)
#   steps        grpo.py --recipe=unseen-s1 --num_paths=4 --max_blocks=1, free to open the block or
#                not, at $CARRY_STEPS decode steps (a block costs its longest path)
#   tokens       the same at $CARRY_TOKENS tokens (a block costs all four paths; one still fits)
#   eval-sft-steps, eval-sft-tokens, steps/eval, tokens/eval   $CARRY_EVAL_LIMIT hard test problems
#                x 4, each at its run's budget
# then scripts/studies/dynamics.py: the table (results/dynamics.md) and the figure (results/dynamics.png).
#
# Jobs (a task and a seed: its SFT, then its runs in order) share $LANES one-thread lanes, the
# carry jobs first (their SFT takes longest); a failed job does not stop the others. A rerun skips
# every step whose output exists, continues a training stopped midway from its last checkpoint
# (--resume=True, exact), and refuses a step whose folder another command made (another setting:
# give it its own OUT). Stopping the script (Ctrl-C, kill) stops its jobs. results/ is written
# only when every setting has its default; any other run writes its table and figure into $OUT
# (or RESULTS=).
set -euo pipefail
set -f                 # no file-name expansion: TASKS='*' is a setting, not the folder's files
cd "$(dirname "$0")/../.."   # scripts/studies/ -> the repository
PY=${PY:-.venv/bin/python}
JOBS_SCRIPT=dynamics.sh
source scripts/studies/jobs.sh   # check_python, step (run a command unless its output exists), run_lanes
DEFAULTS="OUT=runs/dynamics GRPO_STEPS=100 CARRY_STEPS=104 CARRY_TOKENS=256 CARRY_EVAL_LIMIT=200"
DEFAULT_TASKS="carry pair"
TASKS=$(echo ${TASKS-$DEFAULT_TASKS})
DEFAULT_SEEDS="0 1 2"
SEEDS=$(echo ${SEEDS-$DEFAULT_SEEDS})      # one space between words
LANES=${LANES-2}
OUT=${OUT:-runs/dynamics}
GRPO_STEPS=${GRPO_STEPS:-100}
DEFAULT_PAIR_FLAGS="--kl_coef=0"   # the paper's: no KL anchor (README, "When RL chooses ...")
PAIR_FLAGS=${PAIR_FLAGS-$DEFAULT_PAIR_FLAGS}
CARRY_STEPS=${CARRY_STEPS:-104}
CARRY_TOKENS=${CARRY_TOKENS:-256}
CARRY_EVAL_LIMIT=${CARRY_EVAL_LIMIT:-200}
CARRY_SFT_DIR=${CARRY_SFT_DIR:-runs/budget-carry}   # budget.sh's $CARRY_OUT: one SFT a seed
CARRY_SFT_STEPS=1000              # scripts/studies/carry_sft.sh's (its last checkpoint)
CARRY_GRPO_BATCH=16               # prompts per step, as scripts/studies/budget.sh (long responses)
PAIR_SFT_STEPS=400                # the tiny preset's SFT steps (its last checkpoint)
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1

if [ $# -gt 0 ]; then
  echo "dynamics.sh takes no arguments; its settings are environment variables, e.g." \
    "SEEDS=1 TASKS=carry bash scripts/studies/dynamics.sh (all of them: the comment at its top)" >&2
  exit 2
fi
# Check the settings before anything starts.
for task in $TASKS; do
  if [ "$task" != pair ] && [ "$task" != carry ]; then
    echo "dynamics.sh: unknown task '$task' in TASKS; known: $DEFAULT_TASKS" >&2
    exit 2
  fi
  if [ "$(echo "$TASKS" | tr ' ' '\n' | grep -cx "$task")" -gt 1 ]; then
    echo "dynamics.sh: TASKS=\"$TASKS\" names $task twice: give each task once" >&2
    exit 2
  fi
done
if [ -z "${SEEDS// /}" ] || [ -z "${TASKS// /}" ]; then
  echo "dynamics.sh: SEEDS and TASKS must not be empty (defaults: SEEDS=\"$DEFAULT_SEEDS\"," \
    "TASKS=\"$DEFAULT_TASKS\")" >&2
  exit 2
fi
for seed in $SEEDS; do
  if ! [[ $seed =~ ^(0|[1-9][0-9]*)$ ]]; then
    echo "dynamics.sh: SEEDS holds '$seed': give whole numbers separated by spaces," \
      "e.g. SEEDS=\"0 1 2\"" >&2
    exit 2
  fi
  if [ "$(echo "$SEEDS" | tr ' ' '\n' | grep -cx "$seed")" -gt 1 ]; then
    echo "dynamics.sh: SEEDS=\"$SEEDS\" names seed $seed twice: give each seed once" >&2
    exit 2
  fi
done
for name in LANES GRPO_STEPS CARRY_STEPS CARRY_TOKENS CARRY_EVAL_LIMIT; do
  if ! [[ ${!name} =~ ^[1-9][0-9]{0,8}$ ]]; then
    echo "dynamics.sh: $name=${!name}: give a whole number from 1 to 999999999" >&2
    exit 2
  fi
done
# PAIR_FLAGS may not set what the script sets (each run's seed, recipe, model, folder, steps), and
# GRPO's own parser checks the rest now, not after an SFT.
for flag in $PAIR_FLAGS; do
  case ${flag%%=*} in
    --seed|--recipe|--model|--out_dir|--max_steps|--eval_data|--resume)
      echo "dynamics.sh: PAIR_FLAGS sets ${flag%%=*}, which the script sets for each run" \
        "(use SEEDS, GRPO_STEPS, OUT)" >&2
      exit 2 ;;
  esac
done
check_python
note_singular SEED TASK
if ! problem=$($PY -c 'import sys, config, grpo; config.parse(grpo.GRPOConfig, sys.argv[1:])' \
    $PAIR_FLAGS 2>&1 > /dev/null); then
  echo "dynamics.sh: PAIR_FLAGS=\"$PAIR_FLAGS\" is not a set of grpo.py flags:" \
    "$(echo "$problem" | tail -n 1)" >&2
  exit 2
fi
RESULTS_DIR=${RESULTS:-$OUT}
all_defaults=1
for pair in $DEFAULTS; do
  name=${pair%%=*}
  if [ "${!name}" != "${pair#*=}" ]; then
    all_defaults=0
  fi
done
if [ $all_defaults = 1 ] && [ "$SEEDS" = "$DEFAULT_SEEDS" ] && [ "$TASKS" = "$DEFAULT_TASKS" ] \
    && [ "$PAIR_FLAGS" = "$DEFAULT_PAIR_FLAGS" ]; then
  RESULTS_DIR=${RESULTS:-results}
fi
make_folders OUT="$OUT" RESULTS="$RESULTS_DIR"
start=$(date +%s)

# The pair task, seed $1: the demo's SFT, then S1 and S2 from it, each evaluated as the demo does.
pair_job() {
  local dir=$OUT/pair-seed$1
  local sft=$dir/sft/checkpoint-$PAIR_SFT_STEPS
  step "$sft" $PY sft.py --seed="$1" --out_dir="$dir/sft" || return 1
  step "$dir/eval-sft/summary.json" $PY eval.py --model="$sft" --out_dir="$dir/eval-sft" || return 1
  local recipe
  for recipe in s1 s2; do
    step "$dir/$recipe/grpo/checkpoint-$GRPO_STEPS" $PY grpo.py --recipe="unseen-$recipe" \
      --seed="$1" --model="$sft" --max_steps="$GRPO_STEPS" --eval_data= $PAIR_FLAGS \
      --out_dir="$dir/$recipe/grpo" || return 1
    step "$dir/$recipe/eval/summary.json" $PY eval.py \
      --model="$dir/$recipe/grpo/checkpoint-$GRPO_STEPS" --out_dir="$dir/$recipe/eval" || return 1
  done
}

# The carry task, seed $1: the mixed SFT, then S1 (4 paths, one block at most) under each budget.
carry_job() {
  local dir=$OUT/carry-seed$1
  local sft=$CARRY_SFT_DIR/sft-seed$1
  local model=$sft/checkpoint-$CARRY_SFT_STEPS
  step "$model" bash scripts/studies/carry_sft.sh "$1" "$sft" || return 1
  local budget
  local cap
  for budget in steps tokens; do
    cap=$CARRY_STEPS
    if [ $budget = tokens ]; then
      cap=$CARRY_TOKENS
    fi
    local evaluate="--data=carry:hard:test --limit=$CARRY_EVAL_LIMIT --k=4 --num_paths=4"
    evaluate+=" --max_blocks=1 --budget=$budget --max_new_tokens=$cap"
    step "$dir/eval-sft-$budget/summary.json" $PY eval.py --model="$model" $evaluate \
      --out_dir="$dir/eval-sft-$budget" || return 1
    step "$dir/$budget/grpo/checkpoint-$GRPO_STEPS" $PY grpo.py --recipe=unseen-s1 \
      --num_paths=4 --max_blocks=1 --seed="$1" --model="$model" --data=carry:hard:rl \
      --batch_size="$CARRY_GRPO_BATCH" --budget="$budget" --max_new_tokens="$cap" \
      --max_steps="$GRPO_STEPS" --eval_data= --out_dir="$dir/$budget/grpo" || return 1
    step "$dir/$budget/eval/summary.json" $PY eval.py \
      --model="$dir/$budget/grpo/checkpoint-$GRPO_STEPS" $evaluate \
      --out_dir="$dir/$budget/eval" || return 1
  done
}
export -f pair_job carry_job
export JOBS_SCRIPT PY OUT GRPO_STEPS PAIR_FLAGS CARRY_STEPS CARRY_TOKENS CARRY_EVAL_LIMIT \
  CARRY_SFT_DIR CARRY_SFT_STEPS CARRY_GRPO_BATCH PAIR_SFT_STEPS

jobs=""
for task in $TASKS; do
  for seed in $SEEDS; do
    jobs+="$task $seed"$'\n'
  done
done
echo "dynamics.sh: tasks $TASKS, seeds $SEEDS, $LANES lanes; logs: $OUT/<task>-seed<s>.log"
lane='echo "[$(date +%H:%M:%S)] start $0 seed $1"
echo "== dynamics.sh, $(date)" >> "$OUT/$0-seed$1.log"
if "${0}_job" "$1" >> "$OUT/$0-seed$1.log" 2>&1; then
  echo "[$(date +%H:%M:%S)] done $0 seed $1"
else
  echo "[$(date +%H:%M:%S)] FAILED $0 seed $1: see $OUT/$0-seed$1.log"
  exit 1
fi'
# The table and the figure of what finished; results/ only when every job did (a partial table
# goes to $OUT, and none when nothing finished).
failed=0
if ! run_lanes "$LANES" "$lane" "$jobs"; then
  failed=1
  RESULTS_DIR=${RESULTS:-$OUT}
fi
if $PY scripts/studies/dynamics.py "$OUT" --seeds="${SEEDS// /,}" --tasks="${TASKS// /,}" \
    --md="$RESULTS_DIR/dynamics.md" --plot="$RESULTS_DIR/dynamics.png"; then
  echo "dynamics.sh took $(( $(date +%s) - start )) s; table: $RESULTS_DIR/dynamics.md," \
    "figure: $RESULTS_DIR/dynamics.png"
else
  failed=1
fi
if [ $failed = 1 ]; then
  echo "dynamics.sh: a job failed (above); fix it and run again: finished steps are skipped" >&2
  exit 1
fi
