#!/usr/bin/env bash
# `make demo`: the whole curriculum on the embedded default (a ~1M-parameter model, CPU):
#   1. cold-start SFT on synthetic:easy parallel traces (Unseen mask)       ~4 min (400 steps)
#   2. GRPO on synthetic:hard with the Unseen S1 recipe (accuracy reward)    ~7 min (45 steps)
#   3. evaluation of both checkpoints on held-out easy and hard problems     ~2 min
# and a before/after table. Everything lands in runs/demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
OUT=runs/demo
start=$(date +%s)

echo "== 1/3 SFT: python sft.py --out_dir=$OUT/sft"
$PY sft.py --out_dir=$OUT/sft
SFT_CKPT=$(ls -d $OUT/sft/checkpoint-* | sort -V | tail -1)
echo "== 2/3 GRPO: python grpo.py --recipe=unseen-s1 --model=$SFT_CKPT --out_dir=$OUT/grpo"
$PY grpo.py --recipe=unseen-s1 --model=$SFT_CKPT --out_dir=$OUT/grpo
GRPO_CKPT=$(ls -d $OUT/grpo/checkpoint-* | sort -V | tail -1)
echo "== 3/3 eval: the SFT and the GRPO checkpoints, same problems, same seeds"
$PY eval.py --model=$SFT_CKPT --name="Parallel-SFT-Unseen (tiny)" --out_dir=$OUT/eval_sft
$PY eval.py --model=$GRPO_CKPT --name="Parallel-R1-Unseen S1 (tiny)" --out_dir=$OUT/eval_grpo
$PY scripts/plot.py $OUT/grpo || echo "(no plot: pip install -r requirements-plot.txt)"

echo
echo "== Before / after (temperature 1.0, Mean@k and unbiased Pass@k on held-out problems)"
$PY scripts/table.py $OUT/eval_sft $OUT/eval_grpo --out_dir=$OUT
echo
echo "checkpoints: $SFT_CKPT  $GRPO_CKPT"
echo "logs:        $OUT/sft/log.jsonl  $OUT/grpo/log.jsonl   samples: $OUT/eval_*/samples.jsonl"
echo "table:       $OUT/results.md      plot: $OUT/grpo/curves.png (if matplotlib is installed)"
echo "demo took $(( $(date +%s) - start )) s"
