"""Where the embedded task's answers go wrong: failure classes of an eval.py samples file.

    python scripts/failures.py runs/demo/eval_sft runs/demo/eval_grpo   # or their samples.jsonl

Each wrong response to a synthetic pair-search problem ("Which two of 6 1 5 3 make 8?") falls in the
first class below that it shows; the right ones count as "right". One line per benchmark
(difficulty) and file.
"""
import collections
import json
import os
import re
import sys

CHECK = re.compile(r"(\d+)\+(\d+)=(\d+) vs (\d+): (ok|no)")
CLASSES = ("right", "cut by the budget", "false ok", "missed ok", "wrong sum",
           "number not in the list", "answer is not the checked pair", "other")


def classify(problem: str, response: str, correct: bool) -> str:
    """The first of CLASSES a response shows (the problem text, or a prompt holding it; the tagged
    response)."""
    if correct:
        return "right"
    m = re.search(r"Which two of ((?:\d )+)make (\d+)\?", problem)
    if not m:
        raise ValueError(f"not a pair-search problem: {problem[:80]!r}")
    numbers = [int(x) for x in m[1].split()]
    target = int(m[2])
    checks = [tuple(map(int, c[:4])) + (c[4],) for c in CHECK.findall(response)]
    answer = re.findall(r"Final Answer: (\d+), (\d+)", response)
    if "Final Answer:" not in response:
        return "cut by the budget"
    if any(v == "ok" and a + b != target for a, b, s, t, v in checks):
        return "false ok"
    if any(v == "no" and a + b == target for a, b, s, t, v in checks):
        return "missed ok"
    if any(a + b != s for a, b, s, t, v in checks):
        return "wrong sum"
    if any(a not in numbers or b not in numbers or a == b for a, b, *_ in checks):
        return "number not in the list"
    checked = [{a, b} for a, b, s, t, v in checks if v == "ok"]
    if not answer or {int(answer[-1][0]), int(answer[-1][1])} not in checked:
        return "answer is not the checked pair"
    return "other"


def table(path: str) -> list[str]:
    """One line per benchmark of an eval.py samples.jsonl (or its folder): the share of each
    class."""
    path = os.path.join(path, "samples.jsonl") if os.path.isdir(path) else path
    counts = collections.defaultdict(collections.Counter)
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                s = json.loads(line)
                counts[s["benchmark"]][classify(s["prompt"], s["response"], s["correct"])] += 1
    if not counts:                                    # not a blank line: say why
        raise ValueError(f"{path} holds no samples")
    return [f"{path} {bench} ({sum(c.values())} samples): "
            + ", ".join(f"{k} {100 * c[k] / sum(c.values()):.1f}%" for k in CLASSES if c[k])
            for bench, c in counts.items()]


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        sys.exit(print(__doc__))   # print returns None: exit status 0
    if not sys.argv[1:]:
        sys.exit(__doc__)
    try:
        for arg in sys.argv[1:]:
            print("\n".join(table(arg)))
    except (OSError, ValueError, KeyError) as e:   # KeyError: JSONL that is not eval.py's samples
        sys.exit(f"failures.py: error: {type(e).__name__}: {e} (pass eval.py output folders or "
                 "their samples.jsonl)")
