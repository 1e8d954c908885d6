# Sourced by scripts/budget.sh and scripts/dynamics.sh: the steps of their jobs and how a stop
# stops them. Not the method: a reader of the study may skip it.
#
# `step OUTPUT COMMAND...` runs COMMAND, timed, unless OUTPUT exists. The command is kept beside
# OUTPUT's folder (<folder>.command): a rerun whose command differs (another setting, the same
# OUT) is refused rather than mixed with the earlier run. A training (OUTPUT a checkpoint-<step>)
# stopped midway continues from its latest checkpoint (--resume=True, exact). Returns 1 when the
# command fails or is refused.
step() {
  local output=$1
  shift
  local folder
  folder=$(dirname "$output")
  if [ -f "$folder.command" ] && [ "$(cat "$folder.command")" != "$*" ]; then
    echo "$JOBS_SCRIPT: $folder was made by another command:"
    echo "  $(cat "$folder.command")"
    echo "this run's: $*"
    echo "give this run its own output folder (OUT=), or move $folder aside"
    return 1
  fi
  if [ -e "$output" ]; then
    return 0
  fi
  mkdir -p "$(dirname "$folder")"
  echo "$*" > "$folder.command"
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

# The processes below $1, children first listed after their parent.
descendants() {
  local child
  for child in $(pgrep -P "$1"); do
    echo "$child"
    descendants "$child"
  done
}

# `run_lanes LANES LANE_SCRIPT JOBS`: each line of JOBS a job, run by `bash -c LANE_SCRIPT` with
# the line's words as $0 $1 ..., LANES at once; call it from the script itself (not in a pipe).
# Returns non-zero when a job failed. Stopped (Ctrl-C, kill), the script stops the jobs too
# (xargs alone would leave them running; a stopped training saves a checkpoint, and a rerun
# continues it).
run_lanes() {
  trap 'echo "$JOBS_SCRIPT: stopped; a rerun continues" >&2; kill $(descendants $$) 2> /dev/null;
    exit 143' INT TERM
  xargs -P "$1" -L 1 bash -c "$2" < <(printf "%s" "$3") &
  wait $!           # xargs in the background: a signal reaches the trap at once
}
export -f step descendants
