"""Accuracy against the budget, in tokens (T) and in decode steps (D), from eval.py samples.

    python scripts/studies/budget_curve.py runs/budget [--seeds=0,1,2] [--caps=32,48,64,96,128]
        [--failures_at=48] [--target_lead=5] [--json=results/budget-pair.json]
    python scripts/studies/budget_curve.py --plot=results/budget.png \
        --rows=results/budget-pair.json,results/budget-carry.json

The folder holds what scripts/studies/budget.sh writes for one task (the pair task, data.py's
synthetic:*, or the carry task, carry:*): <method>-seed<s>/eval/samples.jsonl for each method of
METHODS it finds for every seed. Printed: per difficulty and rule, each method's accuracy at each
cap (mean over seeds, then ± half the spread (max - min) / 2); per seed, each parallel method's lead
over the sequential baseline on hard at each decode-step cap, and whether one cap has every seed
ahead by --target_lead; each seed's lead at --failures_at decode steps with a paired bootstrap 95%
interval over the test problems (`paired_bootstrap`); on the carry task, each method's bound at each
cap and the measured accuracy's share of it (scripts/studies/budget_bounds.py); the failure classes
of hard responses at --failures_at decode steps ("over the cap" when the response needs more); the
rule's numbers (`rule_figures`). --json keeps the hard curves and the rule's numbers; --plot draws
hard accuracy per method against the budget, a row per task (--rows: the JSON files of earlier
calls; else this folder's), two panels (tokens, decode steps), error bars = the seeds' min and max.

A response counts as right at cap c when it is right and fits in c: its T (or D) without the final
EOS is at most c. (A sampler with budget c writes those c tokens and has no room for the EOS; the
answer is read from the text.) The budget is not in the prompt, so the model cannot tell its cap:
cutting one evaluation at several caps gives what sampling at each cap would, up to the sampler's
random draws, the same rule for every method. The evaluation's own budget must cut nothing below
the largest cap in either rule: eval.py --budget=steps --max_new_tokens=<largest cap> does, since
D <= T (a response with T <= c also has D <= c, so it was never cut).
"""
import argparse
import collections
import json
import math
import os
import re
import sys

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))   # two folders up
sys.path.insert(0, ROOT)   # scripts.<folder>.<name>
from scripts.look import failures
from scripts.studies import budget_bounds, seeds_table

METHODS = ("sequential", "parallel-2", "parallel-4", "parallel-4-all")
DIFFICULTIES = ("easy", "medium", "hard")
RULES = {"T": "tokens", "D": "decode steps"}
TARGET_LEAD = 5.0        # issue 27's target: points on hard at an equal decode-step budget
TASKS = {"synthetic": "pair task", "carry": "carry task"}   # a benchmark's first word -> its task
TAG = re.compile(r"</?(?:Parallel|Path|Summary)>")           # one token each
BLOCK = re.compile(r"<Parallel>(.*?)</Parallel>\s*<Summary>(.*?)</Summary>", re.DOTALL)
PATH = re.compile(r"<Path>(.*?)</Path>", re.DOTALL)
PATH_TAGS = 2            # <Path> and </Path>: a path's tokens beyond its text
BOOTSTRAP_DRAWS = 2000   # resamples of the problems behind one interval
CONFIDENCE = 0.95        # the intervals' coverage


def load_samples(folder: str) -> list[dict]:
    path = os.path.join(folder, "samples.jsonl")
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def difficulty(sample: dict) -> str:
    for name in DIFFICULTIES:
        if f":{name}:" in sample["benchmark"]:
            return name
    raise ValueError(f"not a synthetic benchmark: {sample['benchmark']!r}")


def cost(sample: dict, rule: str) -> int:
    """T or D without the final EOS (what the response needs before it can stop)."""
    ends_with_eos = sample["finish_reason"] == "eos"
    return sample[rule] - int(ends_with_eos)


def accuracy(samples: list[dict], level: str, cap: int, rule: str) -> float:
    """Mean@k in % over one difficulty's samples (every problem has k of them), right and within
    the cap."""
    mine = [s for s in samples if difficulty(s) == level]
    hits = sum(1 for s in mine if s["correct"] and cost(s, rule) <= cap)
    return 100.0 * hits / len(mine)


def spread_cell(values: list[float]) -> str:
    """Percentages as "mean ±half the spread", as seeds_table writes its cells."""
    return seeds_table.cell(values, scale=1.0)


def accuracy_table(runs: dict, caps: list[int]) -> list[str]:
    """runs[method] = one samples list per seed; the difficulties the first run has."""
    first_run = next(iter(runs.values()))[0]
    levels = [level for level in DIFFICULTIES if any(difficulty(s) == level for s in first_run)]
    header = "| difficulty | budget | method | " + " | ".join(str(c) for c in caps) + " |"
    lines = [header, "|---|---|---|" + "---|" * len(caps)]
    for level in levels:
        for rule, rule_name in RULES.items():
            for method, seeds in runs.items():
                cells = []
                for cap in caps:
                    values = [accuracy(samples, level, cap, rule) for samples in seeds]
                    cells.append(spread_cell(values))
                lines.append(f"| {level} | {rule_name} | {method} | " + " | ".join(cells) + " |")
    return lines


def shape_lines(runs: dict) -> list[str]:
    """How each method spends its budget (on the evaluation's own budget)."""
    lines = []
    for method, seeds in runs.items():
        parallel = [100.0 * sum(s["has_parallel"] for s in r) / len(r) for r in seeds]
        mean_t = [sum(s["T"] for s in r) / len(r) for r in seeds]
        mean_d = [sum(s["D"] for s in r) / len(r) for r in seeds]
        lines.append(f"- {method}: parallel {spread_cell(parallel)}% of responses, "
                     f"mean T {spread_cell(mean_t)}, mean D {spread_cell(mean_d)}")
    return lines


def lead_table(runs: dict, seeds: list[int], caps: list[int],
               target: float = TARGET_LEAD) -> list[str]:
    """Per seed (a row names it: runs hold one samples list per seed of `seeds`, in order), each
    parallel method's hard accuracy minus the sequential baseline's at each decode-step cap, then
    the smallest over the seeds (the target's test: every seed at least `target` ahead at one cap)
    and the mean; none without a baseline."""
    if "sequential" not in runs:
        return []
    header = "| method | seed | " + " | ".join(str(c) for c in caps) + " |"
    lines = [header, "|---|---|" + "---|" * len(caps)]
    target_lead = None          # the largest lead that every seed holds, and where
    target_cap = None
    best_mean_lead = None       # the largest mean lead, and where
    best_cap = None
    for method, per_method in runs.items():
        if method == "sequential":
            continue
        per_seed = []
        for seed, mine, base in zip(seeds, per_method, runs["sequential"]):
            leads = [accuracy(mine, "hard", c, "D") - accuracy(base, "hard", c, "D")
                     for c in caps]
            per_seed.append(leads)
            lines.append(f"| {method} | {seed} | " + " | ".join(f"{x:+.1f}" for x in leads) + " |")
        smallest = [min(column) for column in zip(*per_seed)]
        means = [sum(column) / len(column) for column in zip(*per_seed)]
        lines.append(f"| {method} | min | " + " | ".join(f"{x:+.1f}" for x in smallest) + " |")
        lines.append(f"| {method} | mean | " + " | ".join(f"{x:+.1f}" for x in means) + " |")
        for cap, lead, mean in zip(caps, smallest, means):
            if target_lead is None or lead > target_lead:
                target_lead = lead
                target_cap = cap
            if best_mean_lead is None or mean > best_mean_lead:
                best_mean_lead = mean
                best_cap = cap
    met = target_lead is not None and target_lead >= target
    verdict = "met" if met else "not met"
    lines.append(f"\nTarget (every seed >= {target:+.0f} on hard at one decode-step cap): "
                 f"{verdict}; the largest lead every seed holds is {target_lead:+.1f} "
                 f"(at {target_cap} decode steps); the largest mean lead {best_mean_lead:+.1f} "
                 f"(at {best_cap}).")
    return lines


def per_problem(samples: list[dict], cap: int, rule: str) -> dict:
    """{problem id: % of its hard samples right within the cap} (eval.py's samples: k each)."""
    hits = collections.defaultdict(list)
    for s in samples:
        if difficulty(s) == "hard":
            hits[s["id"]].append(s["correct"] and cost(s, rule) <= cap)
    return {key: 100.0 * sum(values) / len(values) for key, values in hits.items()}


def paired_bootstrap(mine: list[float], base: list[float], draws: int = BOOTSTRAP_DRAWS,
                     seed: int = 0) -> tuple[float, float, float]:
    """The lead mean(mine - base) and its CONFIDENCE percentile interval: `draws` resamples of
    the problems with replacement, each problem's two values drawn together (paired: what makes
    a problem hard for both methods cancels in its difference). mine, base: one value per
    problem, in the same order. Seeded: the same inputs give the same interval. ValueError when
    the lists differ in length or are empty."""
    if len(mine) != len(base) or not mine:
        raise ValueError(f"a paired bootstrap needs one value per problem for both methods, got "
                         f"{len(mine)} and {len(base)}")
    differences = np.asarray(mine, dtype=np.float64) - np.asarray(base, dtype=np.float64)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(differences), size=(draws, len(differences)))
    means = differences[picks].mean(axis=1)
    tail = 100.0 * (1.0 - CONFIDENCE) / 2.0
    low, high = np.percentile(means, [tail, 100.0 - tail])
    return float(differences.mean()), float(low), float(high)


def interval_lines(runs: dict, seeds: list[int], cap: int) -> list[str]:
    """Per parallel method and seed (of `seeds`, in the runs' order), its lead over the same
    seed's sequential run on hard at a decode-step cap, with the paired bootstrap's interval over
    the test problems; none without a baseline. SystemExit when the two evaluations hold other
    problems."""
    if "sequential" not in runs:
        return []
    lines = []
    for method, per_method in runs.items():
        if method == "sequential":
            continue
        cells = []
        for seed, mine, base in zip(seeds, per_method, runs["sequential"]):
            mine_by_problem = per_problem(mine, cap, "D")
            base_by_problem = per_problem(base, cap, "D")
            if mine_by_problem.keys() != base_by_problem.keys():
                raise SystemExit(f"{method} and sequential (seed {seed}) were evaluated on other "
                                 "problems: a paired interval needs the same ones")
            problems = sorted(mine_by_problem)
            lead, low, high = paired_bootstrap([mine_by_problem[p] for p in problems],
                                               [base_by_problem[p] for p in problems])
            cells.append(f"seed {seed} {lead:+.1f} [{low:+.1f}, {high:+.1f}]")
        lines.append(f"- {method}: " + "; ".join(cells))
    return lines


def failure_lines(runs: dict, cap: int) -> list[str]:
    """Hard responses by failure class at a decode-step cap, pooled over seeds ("over the cap":
    right or not, the response needs more than the cap)."""
    lines = []
    for method, seeds in runs.items():
        counts = collections.Counter()
        for samples in seeds:
            for s in samples:
                if difficulty(s) != "hard":
                    continue
                if cost(s, "D") > cap:
                    counts["over the cap"] += 1
                else:
                    counts[failures.classify(s["prompt"], s["response"], s["correct"])] += 1
        total = sum(counts.values())
        shares = ", ".join(f"{name} {100.0 * n / total:.1f}%" for name, n in counts.most_common())
        lines.append(f"- {method}: {shares}")
    return lines


def task_of(samples: list[dict]) -> str:
    """The task of an evaluation, from its benchmarks' names (TASKS); ValueError for another."""
    first_word = samples[0]["benchmark"].split(":")[0]
    if first_word not in TASKS:
        raise ValueError(f"not a pair or carry task evaluation: {samples[0]['benchmark']!r}")
    return TASKS[first_word]


def tokens(text: str) -> int:
    """The tiny model's tokens of a response text: one per character, one per tag."""
    return len(TAG.sub("#", text))


def rule_figures(samples: list[dict]) -> dict:
    """The rule's numbers on hard responses: the mean attempt length in tokens (a block's path
    texts and the main chain's lines other than the answer), a block's overhead in tokens (its
    tags and summary: its tokens less its path texts) and in decode steps (its steps, the longest
    path counted once, less that path's text), the attempts (paths) per block, and the decode-step
    saving mean T / mean D. None where there is nothing to average."""
    attempts = []
    overhead_tokens = []
    overhead_steps = []
    widths = []
    hard = [s for s in samples if difficulty(s) == "hard"]
    for s in hard:
        for block in BLOCK.finditer(s["response"]):
            paths = [tokens(path) for path in PATH.findall(block.group(1))]
            if not paths:
                continue
            size = tokens(block.group(0))
            overhead_tokens.append(size - sum(paths))
            steps = size - sum(paths) - PATH_TAGS * (len(paths) - 1)
            overhead_steps.append(steps)
            widths.append(len(paths))
            attempts += paths
        main_chain = BLOCK.sub("", s["response"]).split("\n")
        attempts += [tokens(line) for line in main_chain
                     if line.strip() and not line.startswith("Final Answer")]

    def average(values: list) -> float | None:
        return sum(values) / len(values) if values else None

    return {"attempt tokens": average(attempts),
            "block overhead tokens": average(overhead_tokens),
            "block overhead decode steps": average(overhead_steps),
            "attempts per block": average(widths),
            "T / D": sum(s["T"] for s in hard) / sum(s["D"] for s in hard)}


def rule_lines(runs: dict) -> list[str]:
    """rule_figures of each method, seeds pooled."""
    lines = []
    for method, seeds in runs.items():
        figures = rule_figures([s for samples in seeds for s in samples])
        parts = [f"{name} {value:.2f}" for name, value in figures.items() if value is not None]
        lines.append(f"- {method}: " + ", ".join(parts))
    return lines


def curves(runs: dict, caps: list[int], task: str, figures: dict) -> dict:
    """What --json keeps: the task, the caps, per method and rule the hard accuracy of each seed
    at each cap, and each method's rule_figures."""
    out = {"task": task, "caps": caps, "methods": {}, "rule": figures}
    for method, seeds in runs.items():
        out["methods"][method] = {rule: [[accuracy(samples, "hard", c, rule) for c in caps]
                                         for samples in seeds] for rule in RULES}
    return out


def plot(rows: list[dict], path: str):
    """A row per task (a `curves` dict): hard accuracy per method against the budget in tokens
    and in decode steps, the mean over seeds with the seeds' min and max as error bars."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(rows), 2, figsize=(10, 4 * len(rows)), squeeze=False)
    for row, task_axes in zip(rows, axes):
        caps = row["caps"]
        for ax, (rule, rule_name) in zip(task_axes, RULES.items()):
            for method, per_rule in row["methods"].items():
                per_cap = list(zip(*per_rule[rule]))              # cap -> the seeds' values
                means = [sum(v) / len(v) for v in per_cap]
                below = [max(0.0, m - min(v)) for m, v in zip(means, per_cap)]   # >= 0 despite
                above = [max(0.0, max(v) - m) for m, v in zip(means, per_cap)]   # rounding
                ax.errorbar(caps, means, yerr=[below, above], marker="o", capsize=3,
                            label=method)
            ax.set_xlabel(f"budget ({rule_name})")
            ax.set_title(f"{row['task']}: hard, budget in {rule_name}")
            ax.set_ylim(0, 100)
            ax.grid(alpha=0.3)
        task_axes[0].set_ylabel("accuracy within the budget (%)")
        task_axes[0].legend()
    seeds = len(rows[0]["seeds"])
    fig.suptitle(f"Mean@4 on hard test problems within the budget, {seeds} seeds (error bars: min "
                 "and max)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def number_list(text: str) -> list[int]:
    """'32,48,64' -> [32, 48, 64], distinct whole numbers >= 0 (caps: >= 1 is checked in main)."""
    try:
        numbers = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers separated by commas, "
                                         "e.g. 0,1,2") from None
    if min(numbers) < 0 or len(set(numbers)) != len(numbers):
        raise argparse.ArgumentTypeError(f"{text!r}: give distinct numbers, 0 or more")
    return numbers


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", nargs="?", default="",
                        help="what scripts/studies/budget.sh wrote for one task (runs/budget)")
    parser.add_argument("--seeds", type=number_list, default="0,1,2",
                        help="the seeds to pool, comma-separated")
    parser.add_argument("--caps", type=number_list, default="32,40,44,48,56,64,80,96,128",
                        help="the budgets to cut at, comma-separated (at most --eval_budget)")
    parser.add_argument("--eval_budget", type=int, default=128,
                        help="the decode-step budget the evaluations ran with")
    parser.add_argument("--failures_at", type=int, default=48,
                        help="the decode-step cap of the failure classes and of the bootstrap "
                        "intervals (budget.sh's GRPO budget)")
    parser.add_argument("--target_lead", type=float, default=TARGET_LEAD,
                        help="the lead (points) every seed must hold at one decode-step cap")
    parser.add_argument("--json", default="", help="where to keep the hard curves (.json)")
    parser.add_argument("--plot", default="", help="where to draw the plot (.png); '' = none")
    parser.add_argument("--rows", default="",
                        help="the plot's rows: --json files of earlier calls, comma-separated "
                        "('' = this folder's)")
    args = parser.parse_args(argv)
    if not args.folder and not (args.plot and args.rows):
        parser.error("give a folder of scripts/studies/budget.sh runs, or --plot with --rows")
    if args.folder and not os.path.isdir(args.folder):
        parser.error(f"{args.folder} is not a folder: give the OUT folder of "
                     "scripts/studies/budget.sh")
    if args.failures_at < 1:
        parser.error(f"--failures_at={args.failures_at}: give a decode-step cap, 1 or more")
    if not math.isfinite(args.target_lead):
        parser.error(f"--target_lead={args.target_lead}: give a number of points, e.g. 5")
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        folder = os.path.dirname(path) or "."
        if path and not os.path.isdir(folder):
            parser.error(f"{flag}={path}: the folder {folder} does not exist; create it or name "
                         "another")
    for path in filter(None, args.rows.split(",")):
        if not os.path.isfile(path):
            parser.error(f"--rows names {path}, which is not a file: give the --json files of "
                         "earlier calls (scripts/studies/budget.sh writes "
                         "results/budget-<task>.json)")
    if max(args.caps) > args.eval_budget or min(args.caps) < 1:
        caps = ",".join(str(c) for c in args.caps)
        parser.error(f"--caps={caps}: give caps from 1 to --eval_budget={args.eval_budget} (the "
                     "evaluation cut longer responses itself; pass --eval_budget if it ran with "
                     "another)")
    return args


def load_runs(folder: str, seeds: list[int]) -> dict:
    """{method: one samples list per seed} of the methods with an evaluation for every seed."""
    runs = {}
    for method in METHODS:
        folders = [os.path.join(folder, f"{method}-seed{s}", "eval") for s in seeds]
        found = [f for f in folders if os.path.exists(os.path.join(f, "samples.jsonl"))]
        if len(found) == len(folders):
            runs[method] = [load_samples(f) for f in folders]
        elif found:
            print(f"(left out: {method}, whose runs lack seeds of {seeds}: "
                  f"{len(found)} of {len(folders)} found)")
    if not runs:
        listed = ",".join(str(seed) for seed in seeds)
        raise SystemExit(f"no method under {folder} has <method>-seed<s>/eval/samples.jsonl "
                         f"for every seed of --seeds={listed}: run scripts/studies/budget.sh "
                         "first, or pass the seeds it ran")
    for method, per_seed in runs.items():
        for samples in per_seed:
            if not any(difficulty(s) == "hard" for s in samples):
                raise SystemExit(f"{method}: an evaluation without hard test samples; budget.sh "
                                 "evaluates hard problems")
    return runs


def report(runs: dict, args: argparse.Namespace) -> dict:
    """The task's tables (printed, and kept as the curves' "report"); returns its `curves`."""
    task = task_of(next(iter(runs.values()))[0])
    title = f"{task[0].upper()}{task[1:]}: accuracy within the budget (%)"
    lines = [f"## {title}, {len(args.seeds)} seeds: mean ±half the spread", ""]
    lines += accuracy_table(runs, args.caps)
    lines += ["", f"On the evaluation's own budget ({args.eval_budget} decode steps):"]
    lines += shape_lines(runs)
    leads = lead_table(runs, args.seeds, args.caps, args.target_lead)
    if leads:
        title = f"{task}: lead over the sequential baseline, hard, at equal decode steps (points)"
        lines += ["", f"## {title}", ""] + leads
    intervals = interval_lines(runs, args.seeds, args.failures_at)
    if intervals:
        title = (f"{task}: lead at {args.failures_at} decode steps, hard, with a paired bootstrap "
                 f"{CONFIDENCE:.0%} interval over the problems ({BOOTSTRAP_DRAWS} resamples)")
        lines += ["", f"## {title}", ""] + intervals
    if task == "carry task":
        title = (f"{task}: each method's bound (a reasoner with perfect arithmetic that guesses "
                 "as the teacher does, scripts/studies/budget_bounds.py), hard, % of problems")
        prompts = {s["id"]: s["prompt"] for s in next(iter(runs.values()))[0]
                   if difficulty(s) == "hard"}
        problems = [budget_bounds.problem_of_prompt(prompt) for prompt in prompts.values()]
        measured = curves(runs, args.caps, task, {})["methods"]
        lines += ["", f"## {title}", ""]
        lines += budget_bounds.bound_lines(problems, args.caps, measured)
    title = f"{task}: hard responses at {args.failures_at} decode steps, by failure class"
    lines += ["", f"## {title} (seeds pooled)", ""]
    lines += failure_lines(runs, args.failures_at)
    title = f"{task}: the rule's numbers (hard, seeds pooled, {args.eval_budget} decode steps)"
    lines += ["", f"## {title}", ""]
    lines += rule_lines(runs)
    text = "\n".join(lines)
    print(text)
    figures = {m: rule_figures([s for per_seed in seeds for s in per_seed])
               for m, seeds in runs.items()}
    return dict(curves(runs, args.caps, task, figures), report=text, seeds=args.seeds)


def main(argv: list[str] | None = None):
    args = parse_args(argv)
    rows = []
    if args.folder:
        rows = [report(load_runs(args.folder, args.seeds), args)]
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rows[0], fh, indent=1)
            fh.write("\n")
    if args.rows:
        rows = []
        for path in args.rows.split(","):
            with open(path, encoding="utf-8") as fh:
                rows.append(json.load(fh))
        print("\n\n".join(row["report"] for row in rows))
    if args.plot:
        plot(rows, args.plot)
        print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
