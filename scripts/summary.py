"""The end-of-run report of a training run, from its log.jsonl: SFT's final loss, or GRPO's held-out metrics
before (the first evaluation) and after (the last) training, per benchmark.

    python scripts/summary.py runs/grpo          # or runs/sft
"""
import json
import os
import sys


def summary(run_dir: str) -> str:
    path = os.path.join(run_dir, "log.jsonl")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no log.jsonl in {run_dir!r}: pass the out_dir of sft.py or grpo.py")
    rows = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                raise ValueError(f"{path} line {n} is not JSON: {line.strip()[:60]!r}") from None
    steps = [r for r in rows if "eval/avg_mean_at_k" not in r]
    lines = [f"{run_dir}: {len(steps)} steps logged"]
    losses = [r["loss"] for r in steps if "reward_mean" not in r and "loss" in r]
    if losses:
        tail = losses[-10:]
        lines.append(f"final loss (mean of the last {len(tail)} steps): {sum(tail) / len(tail):.4f}")
    evals = [r for r in rows if "eval/avg_mean_at_k" in r]
    if len(evals) >= 2:
        b, a, f = evals[0], evals[-1], lambda v: "n/a" if v is None else f"{100 * v:.1f}"
        lines.append(f"held-out metrics, %: {'':10}{'before':>10}{'after':>10}")
        for key in [k for k in a if k.endswith(("/mean_at_k", "/parallel_ratio"))]:
            lines.append(f"  {key[5:]:38}{f(b.get(key)):>10}{f(a[key]):>10}")
        lines.append(f"  {'Avg Mean@k':38}{f(b['eval/avg_mean_at_k']):>10}{f(a['eval/avg_mean_at_k']):>10}")
    elif any("reward_mean" in r for r in steps):     # a GRPO run with --eval_data= (the demo's): nothing to compare
        lines.append("no held-out evaluation before and after in this log (the run had --eval_data= or stopped "
                     "early); compare checkpoints with eval.py and scripts/table.py")
    return "\n".join(lines)


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        sys.exit(print(__doc__))   # print returns None: exit status 0
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    try:
        print(summary(sys.argv[1]))
    except (OSError, ValueError) as e:
        sys.exit(f"summary.py: error: {e}")
