#!/usr/bin/env bash
# `make demo [SEED=1]`: the whole curriculum on the embedded default (a ~1M-parameter model, CPU):
#   1. cold-start SFT on easy pair searches (4 numbers), half its rounds written as parallel blocks (Unseen mask)
#   2. 100 GRPO steps on held-out patterns of all three difficulties (4, 5, 6 numbers) with the Unseen S1 recipe
#      (accuracy reward only: the most accurate recipe on this task; S2 holds the parallel ratio, see README)
#   3. both checkpoints evaluated on held-out problems of each difficulty, same seeds
# then a before/after table (results.md) and one problem answered before and after RL.
# Everything lands in runs/demo (runs/demo-seed<N> for another seed).
set -euo pipefail
cd "$(dirname "$0")/../.."   # scripts/studies/ -> the repository
PY=.venv/bin/python
SEED=${SEED:-0}
OUT=${OUT:-runs/demo$([ "$SEED" = 0 ] || echo "-seed$SEED")}
start=$(date +%s)
latest() { ls -d "$1"/checkpoint-* | sort -V | tail -1; }

echo "== 1/3 SFT: python sft.py --seed=$SEED --out_dir=$OUT/sft"
$PY sft.py --seed="$SEED" --out_dir="$OUT/sft"
SFT_CKPT=$(latest "$OUT/sft")
# --eval_data= : no evaluation inside GRPO (step 3 evaluates both checkpoints; training is the same either way)
echo "== 2/3 GRPO: python grpo.py --recipe=unseen-s1 --seed=$SEED --model=$SFT_CKPT --eval_data= --out_dir=$OUT/grpo"
$PY grpo.py --recipe=unseen-s1 --seed="$SEED" --model="$SFT_CKPT" --eval_data= --out_dir="$OUT/grpo"
GRPO_CKPT=$(latest "$OUT/grpo")
echo "== 3/3 eval: the SFT and the GRPO checkpoints, same problems, same sampling seeds"
$PY eval.py --model="$SFT_CKPT" --name="Parallel-SFT-Unseen (tiny)" --out_dir="$OUT/eval_sft"
$PY eval.py --model="$GRPO_CKPT" --name="Parallel-R1-Unseen S1 (tiny)" --out_dir="$OUT/eval_grpo"
$PY scripts/look/plot.py "$OUT/grpo"

echo
echo "== Before / after RL (held-out problems, T = 1, Mean@k and unbiased Pass@k)"
$PY scripts/studies/table.py "$OUT/eval_sft" "$OUT/eval_grpo" --out_dir="$OUT"
echo
echo "== The same problem before and after RL (first sample of the first hard test problem)"
$PY - "$OUT" <<'EOF'
import json, sys
for name in ("eval_sft", "eval_grpo"):
    with open(f"{sys.argv[1]}/{name}/samples.jsonl") as f:
        s = next(r for r in map(json.loads, f) if r["benchmark"].startswith("synthetic:hard"))
    print(f"--- {name}: {s['prompt'].strip()}  ->  {'right' if s['correct'] else 'wrong'}\n{s['response']}")
EOF
echo
echo "checkpoints: $SFT_CKPT  $GRPO_CKPT"
echo "logs:        $OUT/sft/log.jsonl  $OUT/grpo/log.jsonl   samples: $OUT/eval_*/samples.jsonl"
echo "table:       $OUT/results.md      curves: $OUT/grpo/curves.png (reward, accuracy, parallel ratio, ...)"
echo "demo took $(( $(date +%s) - start )) s"
