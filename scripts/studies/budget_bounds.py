"""The carry task's bound at each budget: how often a reasoner with perfect arithmetic, guessing
among neighbours as the teacher does, is right within the cap (README, "Where parallel thinking
pays"; data.py, "The carry task").

    python scripts/studies/budget_bounds.py [--curves=results/budget-carry.json] [--limit=500]

The reasoner writes what `data.render_carry_trace` writes, every attempt's columns right: a chain,
attempts at the candidates (the neighbouring pairs of the list) in a random order, never twice,
until one checks; or, first, a block of 4 paths, each an independent uniform draw from the
candidates, whose summary copies the checked pair (or says "none"), then single attempts at the
untried candidates. Every such response is right; it counts at cap c when its cost without the EOS,
in tokens (T) or decode steps (D, a block's paths counted as their longest), is at most c: what
scripts/studies/budget_curve.py counts for a model's responses. Sequential answers with a chain;
parallel-4 (whose model may also write a chain) with whichever way fits more often at that cap, per
problem: its bound is the better of the two. The chances are exact: every order and every draw is
enumerated, per problem (6 numbers, 5 candidates: 5! orders; 5^4 draws, then the orders of what is
untried). On hard at 104 decode steps a chain fits one attempt (two take 119-134 tokens), so the
chain's bound is 1/5; a block of four and its answer fit (86-91 steps), so parallel-4's is
1 - (4/5)^4 = 59.04%.

Printed: per method and rule the bound at each cap over the hard test problems the evaluation
reads (eval.py --data=carry:hard:test --limit=<limit>), and with --curves (budget_curve.py --json
of the carry runs) the measured accuracy's share of its bound (mean over seeds / bound).
scripts/studies/budget_curve.py prints the same table for the carry task's own runs.
"""
import argparse
import collections
import itertools
import json
import math
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))   # two folders up
sys.path.insert(0, ROOT)   # data.py and scripts.<folder>.<name>
import data
from scripts.studies import carry_stats

# budget.sh's carry methods -> the ways each may answer (0: a chain; n: a block of n paths first)
METHOD_WAYS = {"sequential": (0,), "parallel-4": (0, 4)}
RULES = {"T": "tokens", "D": "decode steps"}
PATH_TAGS = 2        # <Path> and </Path>: a path's tokens beyond its text
BLOCK_TAGS = 5       # <Parallel>, </Parallel>, the injected newline, <Summary>, </Summary>
NEWLINE = 1          # the newline after every line but the answer
NONE_SUMMARY = "none"
PERCENT = 100.0


def text_tokens(text: str) -> int:
    """The tiny model's tokens of a text without tags: one per character."""
    return len(text)


def response_costs(lengths: tuple[int, ...], right: int, answer: int, found: int, none: int,
                   num_paths: int) -> tuple[collections.Counter, int]:
    """Every response the reasoner can write to one problem, as ({(T, D): count}, denominator):
    count / denominator is the chance of that cost (T and D without the EOS). lengths: each
    candidate's attempt tokens, in list order; right: the index of the checking candidate; answer:
    the tokens of the "Final Answer: a, b" line; found / none: of the summary's text when a path
    checks / when none does; num_paths: 0 for a chain, else the block's paths. The denominator is
    len(lengths) ** num_paths * len(lengths)!, so every count is a whole number."""
    size = len(lengths)
    draws_total = size ** num_paths
    denominator = draws_total * math.factorial(size)
    costs = collections.Counter()
    draws = itertools.product(range(size), repeat=num_paths)   # one empty draw for a chain
    for draw in draws:
        block_tokens = 0
        block_steps = 0
        if num_paths:
            summary = none
            if right in draw:
                summary = found
            texts = [lengths[i] for i in draw]
            block_tokens = sum(texts) + PATH_TAGS * num_paths + BLOCK_TAGS + summary + NEWLINE
            block_steps = max(texts) + PATH_TAGS + BLOCK_TAGS + summary + NEWLINE
        if right in draw:
            costs[(block_tokens + answer, block_steps + answer)] += denominator // draws_total
            continue
        untried = [i for i in range(size) if i not in draw]
        weight = denominator // (draws_total * math.factorial(len(untried)))
        for order in itertools.permutations(untried):
            chain = order[:order.index(right) + 1]       # up to the attempt that checks
            chain_tokens = sum(lengths[i] + NEWLINE for i in chain)
            key = (block_tokens + chain_tokens + answer, block_steps + chain_tokens + answer)
            costs[key] += weight
    return costs, denominator


def problem_costs(problem: data.CarryProblem, num_paths: int) -> tuple[collections.Counter, int]:
    """`response_costs` of one carry problem, its attempts written by data.carry_attempt."""
    candidates = problem.candidates
    target = problem.target
    lengths = tuple(text_tokens(data.carry_attempt(a, b, target)) for a, b in candidates)
    right = candidates.index(tuple(problem.pair))
    pair = f"{problem.pair[0]}, {problem.pair[1]}"
    answer = text_tokens(f"Final Answer: {pair}")
    return response_costs(lengths, right, answer, text_tokens(pair), text_tokens(NONE_SUMMARY),
                          num_paths)


def bounds(problems: list[data.CarryProblem], ways: tuple[int, ...], caps: list[int]) -> dict:
    """{rule: the bound in % at each cap} of a method that may answer in any of `ways` (0: a
    chain, n: a block of n paths first), choosing per problem: the better way's chance of a response
    within the cap, averaged over the problems (each as often as it appears)."""
    totals = {rule: [0.0] * len(caps) for rule in RULES}
    for problem in problems:
        per_way = [problem_costs(problem, num_paths) for num_paths in ways]
        for index, rule in enumerate(RULES):
            for c, cap in enumerate(caps):
                chances = []
                for costs, denominator in per_way:
                    fits = sum(count for key, count in costs.items() if key[index] <= cap)
                    chances.append(fits / denominator)
                totals[rule][c] += max(chances)
    return {rule: [PERCENT * total / len(problems) for total in per_cap]
            for rule, per_cap in totals.items()}


def problem_of_prompt(prompt: str) -> data.CarryProblem:
    """The carry problem of an eval prompt ("Which two of 65 36 ... make 113?"): its right pair
    is the one pair of neighbours that makes the target. ValueError when the prompt is not a carry
    problem or no pair of neighbours makes its target."""
    numbers, target = carry_stats.read_problem(prompt)
    pairs = [pair for pair in itertools.pairwise(numbers) if sum(pair) == target]
    if len(pairs) != 1:
        raise ValueError(f"{prompt[:80]!r}: {len(pairs)} pairs of neighbours make the target, "
                         "not one")
    return data.CarryProblem(tuple(numbers), target, pairs[0])


def bound_lines(problems: list[data.CarryProblem], caps: list[int],
                measured: dict | None = None) -> list[str]:
    """A markdown table: per method of METHOD_WAYS and rule, the bound at each cap, and with
    `measured` ({method: {rule: one list of % per seed, a value per cap}}, budget_curve's curves)
    the mean over seeds as a share of the bound ("-" where the bound is 0)."""
    lines = ["| method | budget | | " + " | ".join(str(c) for c in caps) + " |",
             "|---|---|---|" + "---|" * len(caps)]
    for method, ways in METHOD_WAYS.items():
        per_rule = bounds(problems, ways, caps)
        for rule, rule_name in RULES.items():
            limits = per_rule[rule]
            cells = " | ".join(f"{b:.1f}" for b in limits)
            lines.append(f"| {method} | {rule_name} | bound | {cells} |")
            if not measured or method not in measured:
                continue
            per_seed = measured[method][rule]
            means = [sum(column) / len(column) for column in zip(*per_seed)]
            shares = []
            for mean, limit in zip(means, limits):
                if limit > 0:
                    shares.append(f"{PERCENT * mean / limit:.0f}%")
                else:
                    shares.append("-")
            lines.append(f"| {method} | {rule_name} | share of the bound | "
                         + " | ".join(shares) + " |")
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--curves", default="",
                        help="budget_curve.py's --json of the carry runs (results/"
                        "budget-carry.json): its caps, and the shares of the bound")
    parser.add_argument("--caps", default="64,80,96,104,112,128,160,192,256,320,384,448",
                        help="the budgets without --curves, comma-separated")
    parser.add_argument("--limit", type=int, default=500,
                        help="the hard test problems the evaluation read (budget.sh's "
                        "CARRY_EVAL_LIMIT)")
    args = parser.parse_args(argv)
    if args.limit < 1:
        parser.error(f"--limit={args.limit}: give the number of problems, 1 or more")
    if args.curves and not os.path.isfile(args.curves):
        parser.error(f"--curves={args.curves} is not a file: give the JSON that budget.sh "
                     "writes (results/budget-carry.json)")
    return args


def main(argv: list[str] | None = None):
    args = parse_args(argv)
    measured = None
    try:
        caps = [int(part) for part in args.caps.split(",")]
    except ValueError:
        raise SystemExit(f"--caps={args.caps}: give whole numbers separated by commas") from None
    if args.curves:
        with open(args.curves, encoding="utf-8") as fh:
            curves = json.load(fh)
        if curves.get("task") != "carry task":
            raise SystemExit(f"--curves={args.curves} holds the {curves.get('task')}'s curves: "
                             "give the carry task's (results/budget-carry.json)")
        caps = curves["caps"]
        measured = curves["methods"]
    problems = data.carry_problems("hard", "test", args.limit)
    print("\n".join(bound_lines(problems, caps, measured)))


if __name__ == "__main__":
    main()
