#!/usr/bin/env bash
# `bash scripts/studies/choice.sh`: the choice, controlled (issue 45). Per task and seed, one SFT; from it,
# under one budget number B counted in tokens, then in decode steps (sampler's --budget=tokens |
# steps; nothing else changes between the two units), three GRPO arms:
#   chain   grpo.py --recipe=baseline           forced chain: <Parallel> is masked (trained once
#           a seed: a chain's decode steps are its tokens, so both units give the same run)
#   block   grpo.py --recipe=unseen-s1 --open_block=True   forced block: the runtime opens one
#   free    grpo.py --recipe=unseen-s1          free choice (Unseen S1, accuracy reward)
#   s2      grpo.py --recipe=unseen-s2          free choice under the paper's S2: the alternating
#           reward (its tiered steps pay a bonus for a block) and clip_ratio_high 0.28; from the SFT
#   s2low   S2 from the free arm's end under tokens (its share dropped near 0), trained and
#           evaluated under decode steps only: does a share near 0 come back where S2 pays for
#           blocks? (issue 45, item 4; it waits for that free arm when this run trains it)
#   blocklow  the forced block from that same end, under decode steps: would a block pay there
#           once trained? (the control for s2low: beside it, the chain s2low mostly writes)
# each evaluated on the hard problems of every part of SPLITS ("val": to choose settings; "test":
# read once a reported run) at the run's own unit and B, as it was trained; the SFT too (free, at
# each unit), for S1's block-share change. In $OUT (runs/choice):
#   <task>-seed<s>/sft (pair: sft.py --seed, the demo's SFT; carry: scripts/studies/carry_sft.sh, shared
#   with budget.sh in $CARRY_SFT_DIR), <task>-seed<s>/<unit>/sft-eval-<split>,
#   <task>-seed<s>/<unit>/{block,free,s2}/{grpo,eval-<split>},
#   <task>-seed<s>/steps/{s2low,blocklow}/{grpo,eval-<split>},
#   <task>-seed<s>/chain/{grpo,eval-<split>}
# then scripts/studies/choice.py: results/choice.md (the 2 x 2 table: forced gap, S1's change, seeds that
# agree) and results/choice.png, from the last split of SPLITS.
#
# One setting per task (what is not listed is the tiny preset's): pair: the demo's SFT, GRPO on
# the hard :rl problems (the ones evaluated), KL $PAIR_KL, 32 prompts x 4, $GRPO_STEPS steps,
# B = $PAIR_B; carry: the mixed SFT, hard :rl, 4 paths and one block at most, KL $CARRY_KL,
# 16 prompts x 4, B = $CARRY_B. Every choice and its split:
# results/LOG.md (2026-12-07). Jobs (one arm of one unit of one seed) share $LANES one-thread
# lanes, each seed's SFT first; a job whose SFT another job trains waits for it. A rerun skips
# every step whose output exists, continues a training stopped midway, refuses a step whose folder
# another command made (scripts/studies/jobs.sh); stopping the script stops its jobs. results/ is written
# only when every setting has its default; any other run writes into $OUT (or RESULTS=).
set -euo pipefail
set -f                 # no file-name expansion: TASKS='*' is a setting, not the folder's files
cd "$(dirname "$0")/../.."   # scripts/studies/ -> the repository
PY=${PY:-.venv/bin/python}
JOBS_SCRIPT=choice.sh
source scripts/studies/jobs.sh   # check_python, step (run a command unless its output exists), run_lanes
DEFAULTS="OUT=runs/choice GRPO_STEPS=100 PAIR_B=48 PAIR_KL=0 CARRY_B=160 CARRY_KL=0.3"
DEFAULTS+=" EVAL_LIMIT=500 CARRY_SFT_DIR=runs/budget-carry"
DEFAULT_TASKS="pair carry"
TASKS=$(echo ${TASKS-$DEFAULT_TASKS})
DEFAULT_SEEDS="0 1 2 3 4"
SEEDS=$(echo ${SEEDS-$DEFAULT_SEEDS})      # one space between words
DEFAULT_SPLITS="val test"
SPLITS=$(echo ${SPLITS-$DEFAULT_SPLITS})
DEFAULT_UNITS="tokens steps"
UNITS=$(echo ${UNITS-$DEFAULT_UNITS})
DEFAULT_ARMS="chain block free s2 s2low blocklow"
ARMS=$(echo ${ARMS-$DEFAULT_ARMS})
LANES=${LANES-2}
OUT=${OUT:-runs/choice}
GRPO_STEPS=${GRPO_STEPS:-100}
PAIR_B=${PAIR_B:-48}
PAIR_KL=${PAIR_KL:-0}
CARRY_B=${CARRY_B:-160}
CARRY_KL=${CARRY_KL:-0.3}
EVAL_LIMIT=${EVAL_LIMIT:-500}      # hard problems of a part (all 500), 4 samples each
EVAL_K=4
CARRY_SFT_DIR=${CARRY_SFT_DIR:-runs/budget-carry}   # budget.sh's $CARRY_OUT: one SFT a seed
CARRY_SFT_STEPS=1000              # scripts/studies/carry_sft.sh's (its last checkpoint)
PAIR_SFT_STEPS=400                # the tiny preset's SFT steps (its last checkpoint)
CARRY_BATCH=16                    # prompts per step, as budget.sh and dynamics.sh (long responses)
WAIT_S=30                         # how often a job looks for the SFT another job trains
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1

fail() {
  echo "choice.sh: $*" >&2
  exit 2
}
if [ $# -gt 0 ]; then
  fail "takes no arguments; its settings are environment variables, e.g." \
    "SEEDS=0 TASKS=pair bash scripts/studies/choice.sh (all of them: the comment at its top)"
fi
# Check the settings before anything starts: each list non-empty, known words, none twice.
check_list TASKS "$TASKS" "$DEFAULT_TASKS"
check_list SEEDS "$SEEDS" ""
check_list SPLITS "$SPLITS" "$DEFAULT_SPLITS"
check_list UNITS "$UNITS" "$DEFAULT_UNITS"
check_list ARMS "$ARMS" "$DEFAULT_ARMS"
for arm in s2low blocklow; do
  if [[ " $ARMS " == *" $arm "* ]] && [[ " $UNITS " != *" steps "* ]]; then
    fail "the $arm arm trains under decode steps only: add steps to UNITS or leave $arm out"
  fi
done
for name in LANES GRPO_STEPS PAIR_B CARRY_B EVAL_LIMIT; do
  if ! [[ ${!name} =~ ^[1-9][0-9]{0,8}$ ]]; then
    fail "$name=${!name}: give a whole number from 1 to 999999999"
  fi
done
for name in PAIR_KL CARRY_KL; do
  if ! [[ ${!name} =~ ^[0-9]+(\.[0-9]+)?$ ]]; then
    fail "$name=${!name}: give a number of 0 or more, e.g. 0.3"
  fi
done
check_python
note_singular SEED TASK UNIT ARM SPLIT
RESULTS_DIR=${RESULTS:-$OUT}
all_defaults=1
for pair in $DEFAULTS; do
  name=${pair%%=*}
  if [ "${!name}" != "${pair#*=}" ]; then
    all_defaults=0
  fi
done
if [ $all_defaults = 1 ] && [ "$SEEDS" = "$DEFAULT_SEEDS" ] && [ "$TASKS" = "$DEFAULT_TASKS" ] \
    && [ "$SPLITS" = "$DEFAULT_SPLITS" ] && [ "$UNITS" = "$DEFAULT_UNITS" ] \
    && [ "$ARMS" = "$DEFAULT_ARMS" ]; then
  RESULTS_DIR=${RESULTS:-results}
fi
REPORT_SPLIT=${SPLITS##* }        # the table reads the last split (test, when asked for)
make_folders OUT="$OUT" RESULTS="$RESULTS_DIR"
# One choice.sh at a time per task and seed in OUT: a second one would race for the seed's SFT and
# its refused SFT would fail the first one's waiting jobs. Runs on other seeds or tasks may share
# OUT. The lock is the open file: it goes when this script and its jobs end, however they end.
for task in $TASKS; do
  for seed in $SEEDS; do
    lock=$OUT/.$task-seed$seed.lock
    exec {lock_fd}> "$lock"
    if ! flock -n "$lock_fd"; then
      fail "another choice.sh is running $task seed $seed in OUT=$OUT ($lock is held):" \
        "wait for it, or give this run other SEEDS or another OUT"
    fi
  done
done
start=$(date +%s)

# The SFT of task $1, seed $2: trains it ($3 = train) or waits for the job that does; prints its
# checkpoint (and nothing else on stdout: the training's lines go to stderr).
sft_of() {
  local sft
  if [ "$1" = pair ]; then
    sft=$OUT/pair-seed$2/sft
    local model=$sft/checkpoint-$PAIR_SFT_STEPS
  else
    sft=$CARRY_SFT_DIR/sft-seed$2
    local model=$sft/checkpoint-$CARRY_SFT_STEPS
  fi
  if [ "$3" = train ]; then
    rm -f "$OUT/$1-seed$2.sft-failed"
    if [ "$1" = pair ]; then
      step "$model" $PY sft.py --seed="$2" --out_dir="$sft" >&2 \
        || touch "$OUT/$1-seed$2.sft-failed"
    else
      step "$model" bash scripts/studies/carry_sft.sh "$2" "$sft" >&2 \
        || touch "$OUT/$1-seed$2.sft-failed"
    fi
  fi
  while [ ! -d "$model" ]; do
    if [ -f "$OUT/$1-seed$2.sft-failed" ]; then
      echo "[$(date +%H:%M:%S)] the SFT of $1 seed $2 failed: see its first job's log" >&2
      return 1
    fi
    sleep "$WAIT_S"
  done
  echo "$model"
}

# The free arm's end under tokens for task $1, seed $2 (where s2low and blocklow start): waits
# while this run trains it; fails when that job failed or no job of this run makes it.
dropped_of() {
  local model=$OUT/$1-seed$2/tokens/free/grpo/checkpoint-$GRPO_STEPS
  while [ ! -d "$model" ]; do
    if [ -f "$OUT/$1-seed$2-tokens-free.failed" ]; then
      echo "[$(date +%H:%M:%S)] no $model: the free arm under tokens, where s2low and" \
        "blocklow start, failed: see $OUT/$1-seed$2-tokens-free.log" >&2
      return 1
    fi
    if [ "$DROPPED_MADE" = 0 ]; then
      echo "[$(date +%H:%M:%S)] no $model: s2low and blocklow start from the free arm" \
        "trained under tokens (ARMS with free, UNITS with tokens)" >&2
      return 1
    fi
    sleep "$WAIT_S"
  done
  echo "$model"
}

# One job: task $1, seed $2, unit $3, arm $4; $5 = train when it trains the seed's SFT.
arm_job() {
  local task=$1
  local seed=$2
  local unit=$3
  local arm=$4
  local model
  if [ "$arm" = s2low ] || [ "$arm" = blocklow ]; then
    model=$(dropped_of "$task" "$seed") || return 1
  else
    model=$(sft_of "$task" "$seed" "$5") || return 1
  fi
  local dir=$OUT/$task-seed$seed/$unit
  local b=$PAIR_B
  local kl=$PAIR_KL
  local task_flags=""
  local data="synthetic:hard"
  if [ "$task" = carry ]; then
    b=$CARRY_B
    kl=$CARRY_KL
    task_flags="--num_paths=4 --max_blocks=1"
    data="carry:hard"
  fi
  local grpo_flags="$task_flags --batch_size=$CARRY_BATCH --data=carry:hard:rl"
  if [ "$task" = pair ]; then
    grpo_flags="--data=synthetic:hard:rl"
  fi
  local budget="--budget=$unit --max_new_tokens=$b"
  local arm_dir=$dir/$arm
  if [ "$arm" = chain ]; then          # one run for both units: a chain's steps are its tokens
    arm_dir=$OUT/$task-seed$seed/chain
    budget="--budget=tokens --max_new_tokens=$b"
  fi
  local recipe
  local arm_flags
  case $arm in
    chain) recipe=baseline; arm_flags="" ;;
    block | blocklow) recipe=unseen-s1; arm_flags="--open_block=True" ;;
    free) recipe=unseen-s1; arm_flags="" ;;
    s2 | s2low) recipe=unseen-s2; arm_flags="" ;;
  esac
  local split
  if [ "$arm" = free ]; then          # the SFT's own share at this unit: S1's starting point
    for split in $SPLITS; do
      step "$dir/sft-eval-$split/summary.json" $PY eval.py --model="$model" $task_flags \
        $budget --data="$data:$split" --limit="$EVAL_LIMIT" --k="$EVAL_K" --name=sft \
        --out_dir="$dir/sft-eval-$split" || return 1
    done
  fi
  local checkpoint=$arm_dir/grpo/checkpoint-$GRPO_STEPS
  step "$checkpoint" $PY grpo.py --recipe="$recipe" $arm_flags --seed="$seed" --model="$model" \
    $grpo_flags $budget --kl_coef="$kl" --max_steps="$GRPO_STEPS" --eval_data= \
    --out_dir="$arm_dir/grpo" || return 1
  local eval_mode=""
  if [ "$arm" = chain ]; then
    eval_mode="--mode=sequential"
  fi
  for split in $SPLITS; do
    step "$arm_dir/eval-$split/summary.json" $PY eval.py --model="$checkpoint" $task_flags \
      $arm_flags $eval_mode $budget --data="$data:$split" --limit="$EVAL_LIMIT" --k="$EVAL_K" \
      --name="$arm" --out_dir="$arm_dir/eval-$split" || return 1
  done
}
DROPPED_MADE=0                    # 1: this run trains the free arms under tokens (the drop)
if [[ " $ARMS " == *" free "* ]] && [[ " $UNITS " == *" tokens "* ]]; then
  DROPPED_MADE=1
fi
export -f sft_of dropped_of arm_job
export JOBS_SCRIPT PY OUT GRPO_STEPS PAIR_B PAIR_KL CARRY_B CARRY_KL EVAL_LIMIT EVAL_K SPLITS \
  CARRY_SFT_DIR CARRY_SFT_STEPS PAIR_SFT_STEPS CARRY_BATCH WAIT_S DROPPED_MADE

# The jobs: each seed's SFT-training job first (the first unit and arm), then the others, then
# s2low and blocklow (they wait for a free arm).
first_unit=${UNITS%% *}
first_arm=${ARMS/s2low/}
first_arm=${first_arm/blocklow/}
first_arm=$(echo $first_arm)
first_arm=${first_arm%% *}
jobs=""
rest=""
last=""
for task in $TASKS; do
  for seed in $SEEDS; do
    for unit in $UNITS; do
      for arm in $ARMS; do
        if [ "$arm" = chain ] && [ "$unit" != "$first_unit" ]; then
          continue                     # the chain is trained once a seed (above)
        fi
        if [ "$arm" = s2low ] || [ "$arm" = blocklow ]; then
          if [ "$unit" = steps ]; then
            last+="$task $seed $unit $arm wait"$'\n'
          fi
          continue
        fi
        if [ "$unit" = "$first_unit" ] && [ "$arm" = "$first_arm" ]; then
          jobs+="$task $seed $unit $arm train"$'\n'
        else
          rest+="$task $seed $unit $arm wait"$'\n'
        fi
      done
    done
  done
done
jobs+=$rest$last
echo "choice.sh: tasks $TASKS, seeds $SEEDS, units $UNITS, arms $ARMS, splits $SPLITS," \
  "$LANES lanes; logs: $OUT/<task>-seed<s>-<unit>-<arm>.log"
for seed in $SEEDS; do     # say what comes before the arms: the SFTs this run still has to train
  if [ -n "$first_arm" ] && [[ " $TASKS " == *" pair "* ]] \
      && [ ! -d "$OUT/pair-seed$seed/sft/checkpoint-$PAIR_SFT_STEPS" ]; then
    echo "choice.sh: pair seed $seed: its SFT comes first (sft.py, ~4 min on one core)"
  fi
  if [ -n "$first_arm" ] && [[ " $TASKS " == *" carry "* ]] \
      && [ ! -d "$CARRY_SFT_DIR/sft-seed$seed/checkpoint-$CARRY_SFT_STEPS" ]; then
    echo "choice.sh: carry seed $seed: its SFT comes first (scripts/studies/carry_sft.sh into" \
      "$CARRY_SFT_DIR, ~25 min on one core)"
  fi
done
lane='log=$OUT/$0-seed$1-$2-$3.log
echo "[$(date +%H:%M:%S)] start $0 seed $1 $2 $3"
echo "== choice.sh, $(date)" >> "$log"
t0=$(date +%s)
rm -f "$OUT/$0-seed$1-$2-$3.failed"
if arm_job "$0" "$1" "$2" "$3" "$4" >> "$log" 2>&1; then
  job_done "$0 seed $1 $2 $3" "$t0"
else
  touch "$OUT/$0-seed$1-$2-$3.failed"
  echo "[$(date +%H:%M:%S)] FAILED $0 seed $1 $2 $3: see $log"
  exit 1
fi'
failed=""
if ! run_lanes "$LANES" "$lane" "$jobs"; then
  failed="a job failed (its FAILED line above names its log)"
  RESULTS_DIR=${RESULTS:-$OUT}
fi
if $PY scripts/studies/choice.py "$OUT" --seeds="${SEEDS// /,}" --tasks="${TASKS// /,}" \
    --split="$REPORT_SPLIT" --md="$RESULTS_DIR/choice.md" --plot="$RESULTS_DIR/choice.png"; then
  if [ -n "$failed" ]; then
    echo "choice.sh: the table above holds only what finished, earlier runs' included"
  fi
  echo "choice.sh took $(( $(date +%s) - start )) s; table: $RESULTS_DIR/choice.md," \
    "figure: $RESULTS_DIR/choice.png"
elif [ -z "$failed" ]; then
  failed="every job finished, but no cell has a seed with its SFT's and free arm's evaluations"
  failed+=" yet (the table's needs: choice.py's line above)"
fi
if [ -n "$failed" ]; then
  echo "choice.sh: $failed; run it again when fixed: finished steps are skipped" >&2
  exit 1
fi
