"""The end-of-run report of a training run, from its log.jsonl: SFT's final loss, or GRPO's held-out
metrics before (the first evaluation) and after (the last) training, per benchmark.

    python scripts/look/summary.py runs/grpo          # or runs/sft
"""
import json
import os
import sys

LAST_STEPS = 10          # SFT's mean loss beside the final one: over this many last steps
EVAL_PREFIX = "eval/"
NAME_WIDTH = 38          # the table's columns: the metric's name, then before and after
NUMBER_WIDTH = 10


def percent(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.1f}"


def summary(run_dir: str) -> str:
    path = os.path.join(run_dir, "log.jsonl")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no log.jsonl in {run_dir!r}: pass the out_dir of sft.py or "
                                "grpo.py")
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
        tail = losses[-LAST_STEPS:]
        lines.append(f"final loss {losses[-1]:.4f} (the last step's; the mean of the last "
                     f"{len(tail)} steps {sum(tail) / len(tail):.4f})")
    evals = [r for r in rows if "eval/avg_mean_at_k" in r]
    if len(evals) >= 2:
        before = evals[0]
        after = evals[-1]
        lines.append(f"held-out metrics, %: {'':{NUMBER_WIDTH}}{'before':>{NUMBER_WIDTH}}"
                     f"{'after':>{NUMBER_WIDTH}}")
        rows_shown = [(k[len(EVAL_PREFIX):], k) for k in after
                      if k.endswith(("/mean_at_k", "/parallel_ratio"))]
        rows_shown.append(("Avg Mean@k", "eval/avg_mean_at_k"))
        for name, key in rows_shown:
            lines.append(f"  {name:{NAME_WIDTH}}{percent(before.get(key)):>{NUMBER_WIDTH}}"
                         f"{percent(after[key]):>{NUMBER_WIDTH}}")
    elif any("reward_mean" in r for r in steps):     # GRPO with --eval_data= (the demo's): no table
        lines.append("no held-out evaluation before and after in this log (the run had "
                     "--eval_data= or stopped early); compare checkpoints with eval.py and "
                     "scripts/studies/table.py")
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
