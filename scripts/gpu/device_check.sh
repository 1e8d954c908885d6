#!/usr/bin/env bash
# The checks to run when one GPU is lent (issue 46, item 7), in one command of under 10 minutes,
# the most telling first; each step has its own time limit, and what it prints goes to
# ${OUT:-runs/device_check}/<step>.txt. Not run by `make test` (no GPU there).
#
#     bash scripts/gpu/device_check.sh
#
# 1. gpu_check.py on Qwen3-0.6B's shapes (random weights) as a student's one-card run: each
#    phase's total peak against the plan, the SDPA kernel of the masked training calls and of
#    the folded decode attention (the sampling phase), finite gradients, and the bf16 log-prob
#    gap after an optimizer step;
# 2. time per GRPO step, the tiny model on the GPU (3 steps; the log's time_sample/time_update);
# 3. gpu_check.py on Qwen3-4B's shapes as one rank of the paper's 8-rank FSDP2 run (the other
#    ranks emulated: memory and kernels only; its checkpoint save writes ~48 GB to TMPDIR).
# Two ranks on NCCL need two GPUs: `torchrun --nproc_per_node=2 scripts/gpu/gpu_check.py`.
set -u
cd "$(dirname "$0")/../.."
out="${OUT:-runs/device_check}"
py="${PYTHON:-python}"              # a Python with requirements.txt installed
mkdir -p "$out"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

step() {                       # step NAME SECONDS COMMAND...: run, keep its output, go on
    local name="$1" seconds="$2"
    shift 2
    echo "== $name (at most ${seconds}s): $*" | tee "$out/$name.txt"
    local t0=$SECONDS
    timeout -k 20 "$seconds" "$@" >>"$out/$name.txt" 2>&1
    echo "== $name: exit $? after $((SECONDS - t0))s" | tee -a "$out/$name.txt"
    tail -n 25 "$out/$name.txt"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
step check_0.6b 200 "$py" scripts/gpu/gpu_check.py --model=qwen3-0.6b --world_size=1 --gpu_gb=80 \
    --generate_batch_size=2 --prompt_tokens=1400
step grpo_step_time 90 "$py" grpo.py --recipe=unseen-s1 --model=tiny --max_steps=3 --log_every=1 \
    --eval_data= --out_dir="$out/grpo"
step check_4b_one_rank 280 "$py" scripts/gpu/gpu_check.py       # last: its save is the slowest part
