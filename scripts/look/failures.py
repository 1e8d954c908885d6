"""Where the embedded task's answers go wrong: failure classes of an eval.py samples file.

    python scripts/look/failures.py runs/demo/eval_sft runs/demo/eval_grpo  # or samples.jsonl files

Each wrong response to a synthetic pair-search problem ("Which two of 6 1 5 3 make 8?") or a carry
problem ("Which two of 94 41 40 69 45 make 85?", data.py) falls in the first class below that it
shows; the right ones count as "right". One line per benchmark (difficulty) and file.
"""
import collections
import json
import os
import re
import sys

CHECK = re.compile(r"(\d+)\+(\d+)=(\d+) vs (\d+): (ok|no)")
# A carry attempt (data.carry_attempt): "40+45: 0+5=5 carry 0, 4+4+0=8 -> 85 vs 85: ok 40, 45".
CARRY_CHECK = re.compile(r"((\d+)\+(\d+): \d+\+\d+=\d+ carry \d+, \d+\+\d+\+\d+=\d+ -> (\d+)) "
                         r"vs (\d+): (ok|no)(?: \d+, \d+)?")
BASE = 10                      # a carry attempt's columns
PAIR_TASK_LARGEST = 9          # the pair task's numbers are 1-9; the carry task's have two digits
CLASSES = ("right", "cut by the budget", "false ok", "missed ok", "wrong sum",
           "number not in the list", "answer is not the checked pair", "other")


def checks_of(response: str, carry: bool) -> list[tuple]:
    """(a, b, the sum written, the target written, verdict, arithmetic right) of each attempt of
    a response; a carry attempt's arithmetic is right when every column is (`column_sum`)."""
    out = []
    if not carry:
        for c in CHECK.findall(response):
            a, b, s, t = map(int, c[:4])
            out.append((a, b, s, t, c[4], a + b == s))
        return out
    for m in CARRY_CHECK.finditer(response):
        a, b, s, t = (int(x) for x in m.groups()[1:5])
        out.append((a, b, s, t, m.group(6), m.group(1) == column_sum(a, b)))
    return out


def column_sum(a: int, b: int) -> str:
    """The carry task's addition of two two-digit numbers, as its attempts write it (verdict
    aside): column_sum(47, 28) = "47+28: 7+8=15 carry 1, 4+2+1=7 -> 75"."""
    units = a % BASE + b % BASE
    carry = units // BASE
    tens = a // BASE + b // BASE + carry
    return f"{a}+{b}: {a % BASE}+{b % BASE}={units} carry {carry}, " \
        f"{a // BASE}+{b // BASE}+{carry}={tens} -> {a + b}"


def classify(problem: str, response: str, correct: bool) -> str:
    """The first of CLASSES a response shows (the problem text, or a prompt holding it; the tagged
    response)."""
    if correct:
        return "right"
    m = re.search(r"Which two of ((?:\d+ )+)make (\d+)\?", problem)
    if not m:
        raise ValueError(f"not a pair-search problem: {problem[:80]!r}")
    numbers = [int(x) for x in m[1].split()]
    target = int(m[2])
    checks = checks_of(response, carry=max(numbers) > PAIR_TASK_LARGEST)
    answer = re.findall(r"Final Answer: (\d+), (\d+)", response)
    if "Final Answer:" not in response:
        return "cut by the budget"
    if any(v == "ok" and a + b != target for a, b, s, t, v, _ in checks):
        return "false ok"
    if any(v == "no" and a + b == target for a, b, s, t, v, _ in checks):
        return "missed ok"
    if not all(arithmetic_right for *_, arithmetic_right in checks):
        return "wrong sum"
    if any(a not in numbers or b not in numbers or a == b for a, b, *_ in checks):
        return "number not in the list"
    checked = [{a, b} for a, b, s, t, v, _ in checks if v == "ok"]
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
