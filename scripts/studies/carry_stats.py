"""How a model's attempts at the carry task go (data.py, "The carry task"): per evaluation folder.

    python scripts/studies/carry_stats.py runs/budget-carry/sequential-seed0/eval [more folders]

Per difficulty of an eval.py samples file: the share of first-round attempts that try the right
pair (a sequential response's first attempt; every path of a first block), that try a candidate
(two neighbours of the list, what the teacher tries) and whose columns are right; per block,
the distinct pairs its paths try, how often a path holds the right pair, and how often the summary
then names it; the share right after a "none" summary. A first-round attempt's success is what a
block multiplies: with p per attempt, N independent paths hold the pair with 1 - (1 - p)^N.
"""
import collections
import itertools
import json
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))   # two folders up
sys.path.insert(0, ROOT)   # scripts.<folder>.<name>
from scripts.look import failures

BLOCK = re.compile(r"<Parallel>(.*?)</Parallel>\s*<Summary>(.*?)</Summary>", re.DOTALL)
PATH = re.compile(r"<Path>(.*?)</Path>", re.DOTALL)
PROBLEM = re.compile(r"Which two of ((?:\d+ )+)make (\d+)\?")
PERCENT = 100.0


def read_problem(prompt: str) -> tuple[list[int], int]:
    """The list and the target of a carry prompt. ValueError for another prompt."""
    m = PROBLEM.search(prompt)
    if not m:
        raise ValueError(f"not a carry problem: {prompt[:80]!r}")
    return [int(x) for x in m.group(1).split()], int(m.group(2))


def pair_set(text: str) -> frozenset | None:
    """{a, b} of "a, b" (a summary or an answer), else None."""
    m = re.fullmatch(r"\s*(\d+), (\d+)\s*", text)
    if not m:
        return None
    return frozenset((int(m.group(1)), int(m.group(2))))


def first_round(response: str) -> tuple[list[tuple], dict | None]:
    """(the first-round attempts, the first block or None): a response that opens with a block
    has its paths' attempts; otherwise its first main-chain attempt. A block is {"pairs": one
    (a, b) per path that holds an attempt, "paths": its path count, "summary": its text}."""
    blocks = list(BLOCK.finditer(response))
    if blocks and not failures.checks_of(response[:blocks[0].start()], carry=True):
        paths = PATH.findall(blocks[0].group(1))
        attempts = [c for path in paths for c in failures.checks_of(path, carry=True)[:1]]
        block = {"pairs": [(a, b) for a, b, *_ in attempts], "paths": len(paths),
                 "summary": blocks[0].group(2)}
        return attempts, block
    return failures.checks_of(response, carry=True)[:1], None


def stats(samples: list[dict]) -> dict:
    """The first-round and block figures of one difficulty's samples, in % (see the module
    docstring); None where nothing was counted."""
    counts = collections.Counter()
    for s in samples:
        numbers, _ = read_problem(s["prompt"])
        right = frozenset(int(x) for x in s["gold"].split(","))
        attempts, block = first_round(s["response"])
        for a, b, _, _, _, arithmetic_right in attempts:
            counts["attempts"] += 1
            counts["right pair"] += frozenset((a, b)) == right
            neighbours = {frozenset(pair) for pair in itertools.pairwise(numbers)}
            counts["candidate"] += frozenset((a, b)) in neighbours
            counts["columns right"] += arithmetic_right
        if block is None:
            continue
        counts["blocks"] += 1
        counts["distinct pairs"] += len({frozenset(p) for p in block["pairs"]})
        holds_right = any(frozenset(p) == right for p in block["pairs"])
        counts["block holds the pair"] += holds_right
        if holds_right:
            counts["summary names it"] += pair_set(block["summary"]) == right
        if block["summary"].strip() == "none":
            counts["after none"] += 1
            counts["right after none"] += bool(s["correct"])

    def share(part: str, whole: str) -> float | None:
        if not counts[whole]:
            return None
        return PERCENT * counts[part] / counts[whole]

    return {"responses": len(samples), "first-round attempts": counts["attempts"],
            "right pair %": share("right pair", "attempts"),
            "candidate %": share("candidate", "attempts"),
            "columns right %": share("columns right", "attempts"),
            "blocks %": PERCENT * counts["blocks"] / max(1, len(samples)),
            "distinct pairs per block": counts["distinct pairs"] / counts["blocks"]
            if counts["blocks"] else None,
            "block holds the pair %": share("block holds the pair", "blocks"),
            "summary names it %": share("summary names it", "block holds the pair"),
            "right after none %": share("right after none", "after none")}


def lines_of(path: str) -> list[str]:
    """One line per carry benchmark of an eval.py samples.jsonl (or its folder)."""
    path = os.path.join(path, "samples.jsonl") if os.path.isdir(path) else path
    by_bench = collections.defaultdict(list)
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                sample = json.loads(line)
                by_bench[sample["benchmark"]].append(sample)
    out = []
    for bench, samples in by_bench.items():
        if not bench.startswith("carry:"):
            continue
        figures = []
        for name, value in stats(samples).items():
            if value is None:
                continue
            if isinstance(value, float):
                value = f"{value:.1f}"
            figures.append(f"{name} {value}")
        out.append(f"{path} {bench}: " + ", ".join(figures))
    if not out:
        raise ValueError(f"{path} holds no carry samples")
    return out


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        sys.exit(print(__doc__))
    options = [arg for arg in sys.argv[1:] if arg.startswith("-")]
    if options:
        sys.exit(f"carry_stats.py: error: {' '.join(options)}: it takes no options, only eval.py "
                 "output folders")
    if not sys.argv[1:]:
        print(__doc__, file=sys.stderr)
        sys.exit("carry_stats.py: error: give eval.py output folders")
    try:
        for arg in sys.argv[1:]:
            print("\n".join(lines_of(arg)))
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"carry_stats.py: error: {type(e).__name__}: {e} (pass eval.py output folders "
                 "of carry runs, or their samples.jsonl)")
