# Sourced by scripts/studies/budget.sh, dynamics.sh and choice.sh: the Python they run, the steps of their
# jobs and how a stop stops them. Not the method: a reader of the study may skip it.

# `check_python`: PY runs and imports what the study needs (matplotlib for its figure), or the
# script stops here, before any training, saying what to do.
check_python() {
  if ! command -v "$PY" > /dev/null; then
    echo "$JOBS_SCRIPT: no Python at PY=$PY: run make test or make demo first (they set up" \
      ".venv), or set PY=" >&2
    exit 2
  fi
  if ! $PY -c "import torch, transformers" 2> /dev/null; then
    echo "$JOBS_SCRIPT: PY=$PY cannot import torch and transformers: run make install (it" \
      "sets up .venv), or point PY= at such a Python" >&2
    exit 2
  fi
  if ! $PY -c "import matplotlib" 2> /dev/null; then
    echo "$JOBS_SCRIPT: PY=$PY cannot import matplotlib (for the study's figure): run" \
      "$PY -m pip install -r requirements-extra.txt (make test and make demo do)" >&2
    exit 2
  fi
}

# `check_list NAME VALUE KNOWN`: the list setting NAME (its VALUE) is not empty and names each
# word once, every word one of KNOWN (empty KNOWN: whole numbers), or the script's `fail` stops it.
check_list() {
  [ -n "${2// /}" ] || fail "$1 must not be empty"
  local word
  for word in $2; do
    if [ -n "$3" ] && [[ " $3 " != *" $word "* ]]; then
      fail "unknown '$word' in $1; known: $3"
    fi
    if [ -z "$3" ] && ! [[ $word =~ ^(0|[1-9][0-9]{0,8})$ ]]; then
      fail "$1 holds '$word': give whole numbers separated by spaces, e.g. $1=\"0 1 2\""
    fi
    if [ "$(echo "$2" | tr ' ' '\n' | grep -cx "$word")" -gt 1 ]; then
      fail "$1=\"$2\" names $word twice: give each once"
    fi
  done
}

# `note_singular NAME...`: a note for each NAME set in the environment whose plural (NAMEs) is the
# setting: SEED=1 would be ignored without a word and the whole study would start.
note_singular() {
  local name
  for name in "$@"; do
    local plural=${name}S
    if [ -n "${!name+set}" ]; then
      echo "$JOBS_SCRIPT: note: $name=${!name} is not one of its settings, $plural is" \
        "($plural=\"${!name}\" for that alone); going on with $plural=\"${!plural}\"" \
        "(Ctrl-C stops it cleanly)" >&2
    fi
  done
}

# `make_folders NAME=FOLDER...`: makes each FOLDER (the setting NAME names it), or stops the
# script, before any training, when one is a file or cannot be made, naming the setting.
make_folders() {
  local pair
  for pair in "$@"; do
    local folder=${pair#*=}
    if [ -e "$folder" ] && [ ! -d "$folder" ]; then
      echo "$JOBS_SCRIPT: ${pair%%=*}=$folder is a file, not a folder: give a folder" >&2
      exit 2
    fi
    if ! mkdir -p "$folder" 2> /dev/null; then
      echo "$JOBS_SCRIPT: cannot make ${pair%%=*}=$folder: give a folder you can write" >&2
      exit 2
    fi
  done
}

# `step OUTPUT COMMAND...` runs COMMAND, timed, unless OUTPUT exists. The command (with $PY
# written as "python") is kept beside OUTPUT's folder (<folder>.command): a rerun whose command
# differs (another setting, the same OUT) is refused rather than mixed with the earlier run. A
# training (OUTPUT a checkpoint-<step>) stopped midway continues from its latest checkpoint
# (--resume=True, exact). Within a job, an output whose command names an output re-made before it
# (an evaluation of a model trained again) is stale: refused too. Returns 1 when the command
# fails or is refused.
REMADE=""     # the outputs this job has made so far, one per line
STEPS_RUN=0   # the commands this job has run (0: every output existed)
step() {
  local output=$1
  shift
  local folder
  folder=$(dirname "$output")
  local command="$*"
  if [ "$1" = "$PY" ]; then
    command="python ${command#"$PY "}"
  fi
  if [ -f "$folder.command" ] && [ "$(cat "$folder.command")" != "$command" ]; then
    echo "$JOBS_SCRIPT: $folder was made by another command:"
    echo "  $(cat "$folder.command")"
    echo "this run's: $command"
    echo "give this run its own output folder (OUT=), or move $folder and $folder.command aside"
    return 1
  fi
  local made
  if [ -e "$output" ]; then
    while IFS= read -r made; do
      if [ -n "$made" ] && [[ " $* " == *"=$made "* ]]; then
        echo "$JOBS_SCRIPT: $folder is stale: $made, which it was made from, was made again;" \
          "move $folder and $folder.command aside"
        return 1
      fi
    done <<< "$REMADE"
    return 0
  fi
  REMADE+="$output"$'\n'
  STEPS_RUN=$((${STEPS_RUN:-0} + 1))
  mkdir -p "$(dirname "$folder")"
  echo "$command" > "$folder.command"
  local resume=""
  if [[ $(basename "$output") == checkpoint-* ]] && [ -d "$folder" ] \
      && find "$folder" -path "$folder/checkpoint-*/trainer_state.pt" | grep -q .; then
    resume="--resume=True"
  fi
  echo "[$(date +%H:%M:%S)] $* $resume"
  local t0
  t0=$(date +%s)
  local status=0
  "$@" $resume || status=$?
  if [ "$status" -ne 0 ]; then
    echo "[$(date +%H:%M:%S)] failed (exit $status): $*"
    return 1
  fi
  echo "[$(date +%H:%M:%S)] done in $(( $(date +%s) - t0 )) s"
}

# `job_done LABEL T0`: a lane's line for a job that succeeded: how long it took, or that it only
# found its outputs made (a rerun's skipped job is not "done in 0 s").
job_done() {
  if [ "${STEPS_RUN:-0}" -eq 0 ]; then
    echo "[$(date +%H:%M:%S)] $1: already made, skipped"
  else
    echo "[$(date +%H:%M:%S)] done $1 in $(( $(date +%s) - $2 )) s"
  fi
}

# The processes below $1, each listed before its children.
descendants() {
  local child
  for child in $(pgrep -P "$1"); do
    echo "$child"
    descendants "$child"
  done
}

# `stop_jobs`: the script was stopped. Pass SIGTERM to every job (once: a training that gets a
# second signal stops without saving), then wait for them to finish their step and save, so that
# a rerun continues them and does not find their folders still locked.
stop_jobs() {
  trap '' INT TERM HUP PIPE    # a second Ctrl-C, or a closed pipe (| tee), must not cut this short
  local jobs
  jobs=$(descendants $$)
  kill $jobs 2> /dev/null
  echo "$JOBS_SCRIPT: stopped; waiting for the jobs to save, then a rerun continues" >&2
  local pid
  for pid in $jobs; do
    while kill -0 "$pid" 2> /dev/null; do
      sleep 1
    done
  done
}

# `run_lanes LANES LANE_SCRIPT JOBS`: each line of JOBS a job, run by `bash -c LANE_SCRIPT` with
# the line's words as $0 $1 ..., LANES at once; call it from the script itself (not in a pipe).
# Returns non-zero when a job failed. The jobs run in a session of their own, so a Ctrl-C reaches
# only the script, which stops them through stop_jobs (xargs alone would leave them running).
run_lanes() {
  trap 'stop_jobs; exit 130' INT
  trap 'stop_jobs; exit 143' TERM
  trap 'stop_jobs; exit 129' HUP
  setsid xargs -P "$1" -L 1 bash -c "$2" < <(printf "%s" "$3") &
  wait $!           # xargs in the background: a signal reaches the trap at once
}
export -f step job_done descendants
