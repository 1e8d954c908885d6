"""The choice, controlled: does RL open blocks where a forced block beats a forced chain, and drop
them where it loses? From the runs of scripts/studies/choice.sh (issue 45).

    python scripts/studies/choice.py runs/choice [--seeds=0,1,2,3,4] [--tasks=pair,carry]
        [--split=test] [--md=results/choice.md] [--plot=results/choice.png]
    python scripts/studies/choice.py --sweep CHAIN_EVAL BLOCK_EVAL --caps=32,48,64 [--seed=0]

The folder holds, per task t, seed s and unit u (tokens, steps): t-seed<s>/<u>/sft-eval-<split>
(the SFT, free to open a block), t-seed<s>/<u>/<arm>/eval-<split> for the arms block (forced
block) and free (Unseen S1), and t-seed<s>/chain/eval-<split> (the forced chain, one run for both
units: a chain's decode steps are its tokens), each an eval.py folder (samples.jsonl).

S2 beside S1: per cell and seed, the s2 arm's (Unseen S2, t-seed<s>/<u>/s2/eval-<split>) block
share and Mean@k minus the free arm's, each with its paired bootstrap interval; across seeds, a t
interval and the seeds where S2 leads by S2_LEAD points or more; and both arms' training rollouts
after their share first fell to LOW_SHARE (the after-the-drop table): with few groups holding
both kinds, S2's bonus has little to act on. The s2low arm: S2 under decode steps from the free
arm's end under tokens, where S1 dropped blocks (t-seed<s>/steps/s2low/eval-<split>): its share
against the share it started from; beside it blocklow, the forced block trained from the same
start (its injected `<Parallel>` is not trained: it tests the paths, not the choice to open).

Per cell (task x unit) and seed: the forced gap, Mean@k of the forced block minus the forced
chain, and S1's block-share change, the free arm's share of responses with a block minus the
SFT's, each with a paired bootstrap 95% interval over the problems (both arms answered the same
problems; BOOTSTRAP draws, seeded); across seeds, each one's mean with a t interval (the seed as
the unit; none for one seed). A seed agrees when the sign of S1's change is the sign of its
forced gap (the claim under test, stated before the runs: in every cell they agree).

--sweep reads two evaluations of one model made at a large budget (the forced chain and the
forced block) and prints, at each cap in tokens and in decode steps, the forced gap of the
responses cut there (right only if right and within the cap: a post-hoc cut, the same for both
arms), with its paired bootstrap interval: where the gap may change sign between the units, to
choose B on :val before any training. Needs matplotlib for --plot.
"""
import argparse
import json
import math
import os
import random
import statistics
import sys

UNITS = ("tokens", "steps")
TASKS = ("pair", "carry")
BOOTSTRAP = 2000             # resamples of the problems in a paired bootstrap
BOOTSTRAP_SEED = 0
LOW = 0.025                  # the 95% interval's quantiles
HIGH = 0.975
# Student's t, 97.5% quantile, by degrees of freedom (seeds - 1): a 95% interval across seeds.
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
         9: 2.262, 10: 2.228}
UNIT_COLUMN = {"tokens": "T", "steps": "D"}   # samples.jsonl's count of each unit
WINDOW = 10                  # steps in the figure's moving means (as scripts/studies/dynamics.py)
LOW_SHARE = 5.0              # a block share (%) at or below which an arm has dropped blocks
S2_LEAD = 15.0               # points of block share by which S2 "holds blocks" beside S1 (issue 45)
FREE_ARMS = ("free", "s2")     # S1 and S2, both free to open a block


def read_samples(folder: str) -> list[dict]:
    """The rows of an eval.py folder's samples.jsonl."""
    with open(os.path.join(folder, "samples.jsonl"), encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def read_budget(folder: str) -> int | None:
    """The budget B (max_new_tokens) an eval.py folder was made at, from its summary.json; None
    when it has none."""
    path = os.path.join(folder, "summary.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)["config"]["max_new_tokens"]


def per_problem(samples: list[dict], key: str, unit: str | None = None,
                cap: int | None = None) -> dict:
    """{problem id: the mean over its samples of `key` ("correct" or "has_parallel")}, in %;
    with a cap, a sample counts only if it spent at most `cap` of `unit` (a post-hoc cut)."""
    values = {}
    for row in samples:
        value = bool(row[key])
        if cap is not None:
            value = value and row[UNIT_COLUMN[unit]] <= cap
        values.setdefault(row["id"], []).append(100.0 * value)
    return {problem: statistics.mean(v) for problem, v in values.items()}


def paired_bootstrap(base: dict, other: dict, seed: int = BOOTSTRAP_SEED) -> tuple:
    """(mean of other - base over the problems both hold, 2.5% and 97.5% quantiles of that mean
    over BOOTSTRAP resamples of those problems). ValueError when they share no problem."""
    shared = sorted(set(base) & set(other))
    if not shared:
        raise ValueError("the two evaluations share no problem: were they made on one split?")
    differences = [other[p] - base[p] for p in shared]
    rng = random.Random(seed)
    n = len(differences)
    means = sorted(sum(rng.choices(differences, k=n)) / n for _ in range(BOOTSTRAP))
    low = means[int(LOW * BOOTSTRAP)]
    high = means[math.ceil(HIGH * BOOTSTRAP) - 1]       # as far from the top as low is from 0
    return statistics.mean(differences), low, high


def t_interval(values: list[float]) -> tuple:
    """(mean, low, high): the 95% t interval across seeds; low and high None for one seed."""
    mean = statistics.mean(values)
    if len(values) < 2:
        return mean, None, None
    quantile = T_975[min(len(values) - 1, max(T_975))]
    half = quantile * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def sign(value: float) -> int:
    return (value > 0) - (value < 0)


def training_curves(grpo_folder: str) -> dict:
    """A free-choice arm's training rows (log.jsonl): per step, the block share, the share of groups
    holding both kinds and the accuracy with a block minus without (None: one kind absent), %."""
    path = os.path.join(grpo_folder, "log.jsonl")
    curves = {"share": [], "mixed": [], "gap": []}
    if not os.path.exists(path):
        return curves
    with open(path, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    for row in rows:
        if "parallel_ratio" not in row:           # an evaluation's row
            continue
        curves["share"].append(100 * row["parallel_ratio"])
        curves["mixed"].append(100 * row["mixed_groups"])
        gap = row["block_accuracy_gap"]
        curves["gap"].append(None if gap is None else 100 * gap)
    return curves


def moving_mean(values: list) -> list[float]:
    """The mean of each value and the WINDOW - 1 before it, None values left out; NaN where a
    window holds none (a gap in the line)."""
    out = []
    for i in range(len(values)):
        recent = [v for v in values[max(0, i - WINDOW + 1):i + 1] if v is not None]
        out.append(sum(recent) / len(recent) if recent else float("nan"))
    return out


def seed_row(root: str, task: str, unit: str, seed: int, split: str) -> dict | None:
    """One seed's forced gap and S1's change in a cell; None when the SFT's or the free arm's
    evaluation is missing. Without both forced arms the row has S1's change only: its gap,
    chain, block and agrees are None (a seed whose forced arms are still to run)."""
    cell = os.path.join(root, f"{task}-seed{seed}", unit)
    folders = {"sft": os.path.join(cell, f"sft-eval-{split}"),
               "chain": os.path.join(root, f"{task}-seed{seed}", "chain", f"eval-{split}"),
               "block": os.path.join(cell, "block", f"eval-{split}"),
               "free": os.path.join(cell, "free", f"eval-{split}")}
    found = {name: os.path.exists(os.path.join(folder, "samples.jsonl"))
             for name, folder in folders.items()}
    if not (found["sft"] and found["free"]):
        return None
    samples = {name: read_samples(folder) for name, folder in folders.items() if found[name]}
    accuracy = {arm: per_problem(samples[arm], "correct") for arm in samples if arm != "sft"}
    share = {name: per_problem(samples[name], "has_parallel") for name in ("sft", "free")}
    change = paired_bootstrap(share["sft"], share["free"])
    row = {"seed": seed, "gap": None, "change": change, "chain": None, "block": None,
           "free": statistics.mean(accuracy["free"].values()),
           "sft_share": statistics.mean(share["sft"].values()),
           "free_share": statistics.mean(share["free"].values()), "agrees": None,
           "budget": read_budget(folders["free"]),
           "curves": training_curves(os.path.join(cell, "free", "grpo"))}
    if found["chain"] and found["block"]:
        gap = paired_bootstrap(accuracy["chain"], accuracy["block"])
        row["gap"] = gap
        row["chain"] = statistics.mean(accuracy["chain"].values())
        row["block"] = statistics.mean(accuracy["block"].values())
        row["agrees"] = sign(gap[0]) != 0 and sign(gap[0]) == sign(change[0])
    return row


def s2_row(root: str, task: str, unit: str, seed: int, split: str) -> dict | None:
    """One seed's S2 beside S1 in a cell: each arm's block share and Mean@k, S2 minus S1 of each
    with its paired bootstrap interval, and S2's training curves; None when either evaluation is
    missing."""
    cell = os.path.join(root, f"{task}-seed{seed}", unit)
    folders = {arm: os.path.join(cell, arm, f"eval-{split}") for arm in FREE_ARMS}
    if not all(os.path.exists(os.path.join(f, "samples.jsonl")) for f in folders.values()):
        return None
    samples = {arm: read_samples(folder) for arm, folder in folders.items()}
    share = {arm: per_problem(samples[arm], "has_parallel") for arm in FREE_ARMS}
    accuracy = {arm: per_problem(samples[arm], "correct") for arm in FREE_ARMS}
    return {"seed": seed,
            "s1_share": statistics.mean(share["free"].values()),
            "s2_share": statistics.mean(share["s2"].values()),
            "lead": paired_bootstrap(share["free"], share["s2"]),
            "s1_accuracy": statistics.mean(accuracy["free"].values()),
            "s2_accuracy": statistics.mean(accuracy["s2"].values()),
            "accuracy": paired_bootstrap(accuracy["free"], accuracy["s2"]),
            "curves": training_curves(os.path.join(cell, "s2", "grpo"))}


def return_row(root: str, task: str, seed: int, split: str) -> dict | None:
    """One seed's s2low arm: the share it started from (the free arm's end under tokens), its own
    share and Mean@k at the end, and its training curves; None when either evaluation is missing.
    With the blocklow arm (the forced block from the same start) also its Mean@k and the gap
    blocklow - s2low with its paired bootstrap interval (s2low writes chains nearly always: the
    forced gap from the drop); None without it."""
    seed_dir = os.path.join(root, f"{task}-seed{seed}")
    folders = {"start": os.path.join(seed_dir, "tokens", "free", f"eval-{split}"),
               "end": os.path.join(seed_dir, "steps", "s2low", f"eval-{split}"),
               "block": os.path.join(seed_dir, "steps", "blocklow", f"eval-{split}")}
    found = {name: os.path.exists(os.path.join(folder, "samples.jsonl"))
             for name, folder in folders.items()}
    if not (found["start"] and found["end"]):
        return None
    samples = {name: read_samples(folder) for name, folder in folders.items() if found[name]}
    share = {name: per_problem(samples[name], "has_parallel") for name in ("start", "end")}
    accuracy = {name: per_problem(samples[name], "correct") for name in samples if name != "start"}
    row = {"seed": seed, "start_share": statistics.mean(share["start"].values()),
           "share": statistics.mean(share["end"].values()),
           "accuracy": statistics.mean(accuracy["end"].values()), "block": None, "gap": None,
           "curves": training_curves(os.path.join(seed_dir, "steps", "s2low", "grpo"))}
    if found["block"]:
        row["block"] = statistics.mean(accuracy["block"].values())
        row["gap"] = paired_bootstrap(accuracy["end"], accuracy["block"])
    return row


def with_gap(rows: list[dict]) -> list[dict]:
    """The rows whose forced arms both finished."""
    return [r for r in rows if r["gap"] is not None]


def number_text(value: float | None) -> str:
    if value is None:
        return "not run"
    return f"{value:.1f}"


def after_the_drop(curves: dict) -> dict | None:
    """What an arm's rollouts said about blocks once it had dropped them: from the first step at
    or below LOW_SHARE on, the steps, the mean block share, the mean share of groups holding both
    kinds (the only groups where a block's reward can move the advantages), the steps whose
    rollouts held a block
    beside a response without one (the gap measured), the mean accuracy gap (with a block minus
    without, points) over those, how many of them favoured blocks, and the steps whose share
    climbed back above LOW_SHARE. A share that stays down while the gap is against blocks is
    RL following its signal; an absorbing share would stay down while the gap favours them.
    None when the share never fell that low."""
    shares = curves["share"]
    low = [i for i, share in enumerate(shares) if share <= LOW_SHARE]
    if not low:
        return None
    after = range(low[0], len(shares))
    gaps = [curves["gap"][i] for i in after if curves["gap"][i] is not None]
    return {"first_step": low[0] + 1, "steps": len(after),
            "share": statistics.mean(shares[i] for i in after),
            "mixed": statistics.mean(curves["mixed"][i] for i in after),
            "measured": len(gaps), "gap": statistics.mean(gaps) if gaps else None,
            "favoured": sum(1 for gap in gaps if gap > 0),
            "back_above": sum(1 for i in after if shares[i] > LOW_SHARE)}


def collect(root: str, seeds: list[int], tasks: tuple, split: str, row_of=seed_row) -> dict:
    """{(task, unit): [row_of(...) of each seed that finished]} (seed_row, or s2_row)."""
    cells = {}
    for task in tasks:
        for unit in UNITS:
            rows = [row_of(root, task, unit, seed, split) for seed in seeds]
            cells[(task, unit)] = [row for row in rows if row is not None]
    return cells


def interval_text(value: float, low, high) -> str:
    if low is None:
        return f"{value:+.1f}"
    return f"{value:+.1f} [{low:+.1f}, {high:+.1f}]"


def return_lines(returns: dict) -> list[str]:
    """The s2low table: per task and seed, the share S2 started from, its share and Mean@4 at the
    end, and beside it the forced block trained from the same start (blocklow): would a block
    pay there once trained?"""
    title = ("Does a dropped share come back? S2 under decode steps, started from S1's end under "
             f"tokens (it came back where its share ends above {LOW_SHARE:g}%); beside it the "
             "forced block trained from the same start (blocklow), Mean@4 minus S2's:")
    header = ("| task | seed | blocks at the start | blocks at the end | Mean@4 | forced block "
              "from the start | its gap [95%] |")
    lines = ["", title, "", header, "|---|---|---|---|---|---|---|"]
    for task, rows in returns.items():
        for r in rows:
            gap_text = "not run"
            if r["gap"] is not None:
                gap_text = interval_text(*r["gap"])
            lines.append(f"| {task} | {r['seed']} | {r['start_share']:.1f}% | {r['share']:.1f}% | "
                         f"{r['accuracy']:.1f} | {number_text(r['block'])} | {gap_text} |")
        if not rows:
            continue
        back = [str(r["seed"]) for r in rows if r["share"] > LOW_SHARE]
        gaps = [r["gap"][0] for r in rows if r["gap"] is not None]
        gap_text = "not run"
        if gaps:
            gap_text = interval_text(*t_interval(gaps))
        lines.append(f"| {task} | across seeds | came back on {len(back)} of {len(rows)} "
                     f"({', '.join(back) or 'none'}) | | | | {gap_text} |")
    return lines


def s2_lines(s2_cells: dict) -> list[str]:
    """The S2-beside-S1 tables: across seeds per cell, then per seed."""
    title = ("S2 beside S1 (the same SFT, cell and seed; S2 as the paper's: the alternating reward "
             f"and clip_ratio_high 0.28): S2 minus S1 in points, t 95% across seeds; S2 holds "
             f"blocks where it leads by {S2_LEAD:g} or more:")
    header = ("| task | unit | seeds | block share, S2 - S1 | Mean@4, S2 - S1 | "
              f"seeds where S2 leads by >= {S2_LEAD:g} |")
    lines = ["", title, "", header, "|---|---|---|---|---|---|"]
    for (task, unit), rows in s2_cells.items():
        if not rows:
            continue
        lead = t_interval([r["lead"][0] for r in rows])
        accuracy = t_interval([r["accuracy"][0] for r in rows])
        held = [str(r["seed"]) for r in rows if r["lead"][0] >= S2_LEAD]
        lines.append(f"| {task} | {unit} | {', '.join(str(r['seed']) for r in rows)} | "
                     f"{interval_text(*lead)} | {interval_text(*accuracy)} | "
                     f"{len(held)} of {len(rows)} ({', '.join(held) or 'none'}) |")
    header = ("| task | unit | seed | S1 share | S2 share | S2 - S1 | S1 Mean@4 | S2 Mean@4 | "
              "S2 - S1 |")
    lines += ["", header, "|---|---|---|---|---|---|---|---|---|"]
    for (task, unit), rows in s2_cells.items():
        for r in rows:
            lines.append(f"| {task} | {unit} | {r['seed']} | {r['s1_share']:.1f}% | "
                         f"{r['s2_share']:.1f}% | {interval_text(*r['lead'])} | "
                         f"{r['s1_accuracy']:.1f} | {r['s2_accuracy']:.1f} | "
                         f"{interval_text(*r['accuracy'])} |")
    return lines


def report(cells: dict, seeds: list[int], split: str, s2_cells: dict | None = None,
           returns: dict | None = None) -> str:
    legend = (f"Hard `:{split}` problems, at each run's own unit and budget. Forced gap: Mean@4 "
              "of the forced block minus the forced chain; S1's change: the free arm's share of "
              "responses with a block minus its SFT's (points). Per seed: paired bootstrap 95% "
              "interval over the problems; across seeds: mean and t 95% interval (seed the unit).")
    header = ("| task | unit | seeds | forced gap, across seeds | S1's change, across seeds | "
              "seeds that agree (sign of change = sign of gap) |")
    lines = [legend, ""]
    budgets = {}                                 # task -> the B its free arms were evaluated at
    for (task, _), rows in cells.items():
        budgets.setdefault(task, set()).update(r["budget"] for r in rows if r.get("budget"))
    known = [f"{task} {', '.join(map(str, sorted(b)))}" for task, b in budgets.items() if b]
    if known:
        mixed = any(len(b) > 1 for b in budgets.values())
        warning = " (runs of different budgets are mixed here!)" if mixed else ""
        lines += [f"Budget B, as the free arms were evaluated: {'; '.join(known)}{warning}.", ""]
    lines += [header, "|---|---|---|---|---|---|"]
    for (task, unit), rows in cells.items():
        if not rows:
            lines.append(f"| {task} | {unit} | none finished | | | |")
            continue
        change = t_interval([r["change"][0] for r in rows])
        forced = with_gap(rows)
        gap_text = "not run"
        if forced:
            gap_text = interval_text(*t_interval([r["gap"][0] for r in forced]))
        agree = [str(r["seed"]) for r in forced if r["agrees"]]
        ran = ", ".join(str(r["seed"]) for r in rows)
        lines.append(f"| {task} | {unit} | {ran} | {gap_text} (seeds "
                     f"{', '.join(str(r['seed']) for r in forced) or 'none'}) | "
                     f"{interval_text(*change)} | {len(agree)} of {len(forced)} "
                     f"({', '.join(agree) or 'none'}) |")
    title = ("Only the unit changes: steps minus tokens, per seed (both cells finished) and "
             "across seeds (t 95%), in points:")
    lines += ["", title, "",
              "| task | seeds | forced gap, steps - tokens | S1's change, steps - tokens |",
              "|---|---|---|---|"]
    for task in dict.fromkeys(task for task, _ in cells):
        by_seed = {unit: {r["seed"]: r for r in cells.get((task, unit), [])} for unit in UNITS}
        both = sorted(set(by_seed["tokens"]) & set(by_seed["steps"]))
        if not both:
            continue
        changes = [by_seed["steps"][s]["change"][0] - by_seed["tokens"][s]["change"][0]
                   for s in both]
        gap_seeds = [s for s in both
                     if by_seed["steps"][s]["gap"] is not None
                     and by_seed["tokens"][s]["gap"] is not None]
        gaps = [by_seed["steps"][s]["gap"][0] - by_seed["tokens"][s]["gap"][0]
                for s in gap_seeds]
        gap_text = "not run"
        if gaps:
            per_seed_gaps = " / ".join(f"{g:+.1f}" for g in gaps)
            gap_text = (f"{per_seed_gaps}; {interval_text(*t_interval(gaps))} (seeds "
                        f"{', '.join(map(str, gap_seeds))})")
        per_seed_changes = " / ".join(f"{c:+.1f}" for c in changes)
        lines.append(f"| {task} | {', '.join(map(str, both))} | {gap_text} | "
                     f"{per_seed_changes}; {interval_text(*t_interval(changes))} |")
    header = ("| task | unit | seed | chain | block | free | forced gap | SFT share | S1 share | "
              "S1's change | agrees |")
    lines += ["", "Per seed:", "", header, "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (task, unit), rows in cells.items():
        for r in rows:
            gap_text = "not run"
            agrees = "-"
            if r["gap"] is not None:
                gap_text = interval_text(*r["gap"])
                agrees = "yes" if r["agrees"] else "no"
            lines.append(f"| {task} | {unit} | {r['seed']} | {number_text(r['chain'])} | "
                         f"{number_text(r['block'])} | {r['free']:.1f} | {gap_text} | "
                         f"{r['sft_share']:.1f}% | {r['free_share']:.1f}% | "
                         f"{interval_text(*r['change'])} | {agrees} |")
    if s2_cells and any(s2_cells.values()):
        lines += s2_lines(s2_cells)
    if returns and any(returns.values()):
        lines += return_lines(returns)
    header = (f"| task | unit | arm | seed | first step at <= {LOW_SHARE:g}% | steps from it | "
              "blocks | groups with both kinds | steps with the gap measured | its mean | "
              f"steps it favoured blocks | steps back above {LOW_SHARE:g}% |")
    arms = [("S1", cells)]
    if s2_cells:
        arms.append(("S2", s2_cells))
    if returns:
        arms.append(("S2 from S1's end", {(task, "steps"): rows for task, rows in returns.items()}))
    dropped = []
    for arm, arm_cells in arms:
        for (task, unit), rows in arm_cells.items():
            for r in rows:
                held = after_the_drop(r["curves"])
                if held is None:
                    continue
                gap_text = "-"
                if held["gap"] is not None:
                    gap_text = f"{held['gap']:+.1f}"
                dropped.append(f"| {task} | {unit} | {arm} | {r['seed']} | "
                               f"{held['first_step']} | {held['steps']} | {held['share']:.2f}% | "
                               f"{held['mixed']:.1f}% | {held['measured']} | {gap_text} | "
                               f"{held['favoured']} | {held['back_above']} |")
    if not dropped:
        lines += ["", f"After the drop: no arm's training share fell to {LOW_SHARE:g}% or below."]
    if dropped:
        title = ("After the drop (an arm's training rollouts, from the first step at or below "
                 f"{LOW_SHARE:g}% blocks on; the gap: accuracy with a block minus without, "
                 "points, on the steps that held both kinds):")
        lines += ["", title, "", header, "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        lines += dropped
    missing = []
    for (task, unit), rows in cells.items():
        done = {r["seed"] for r in rows}
        lacking = [str(seed) for seed in seeds if seed not in done]
        if lacking:
            missing.append(f"{task}, {unit}: seeds {', '.join(lacking)}")
    if missing:
        lines += ["", "Not finished (an evaluation missing):"] + [f"- {m}" for m in missing]
    return "\n".join(lines)


def plot(cells: dict, out: str, s2_cells: dict | None = None, returns: dict | None = None):
    """Left: per cell, the forced gap against S1's change: a point per seed, the across-seed mean
    with its t intervals as crossed bars; the claim holds in the quadrants of equal signs. Middle:
    S1's training rollouts against the step (WINDOW-step means, a line per seed): the block share
    (solid) and the signal RL sees, the share of groups holding both kinds (dotted) and the
    accuracy with a block minus without (dashed). Right (when S2 ran): the same block share and
    groups holding both kinds for S2 from the SFT (a color a cell) and from S1's drop (black)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s2_runs = []
    for index, rows in enumerate((s2_cells or {}).values()):
        s2_runs += [(f"C{index}", r["curves"]) for r in rows]
    for rows in (returns or {}).values():
        s2_runs += [("black", r["curves"]) for r in rows]
    panels = 2 + bool(s2_runs)
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 5))
    ax = axes[0]
    curves_ax = axes[1]
    for index, ((task, unit), rows) in enumerate(cells.items()):
        color = f"C{index}"                   # matplotlib's color cycle: one color a cell
        forced = with_gap(rows)
        gaps = [r["gap"][0] for r in forced]
        changes = [r["change"][0] for r in forced]
        ax.scatter(gaps, changes, s=18, alpha=0.6, color=color)
        for r in rows:
            for key, style in (("share", "-"), ("mixed", ":"), ("gap", "--")):
                values = moving_mean(r["curves"][key])
                curves_ax.plot(range(1, len(values) + 1), values, color=color, linestyle=style,
                               linewidth=1)
        if not forced:
            continue
        gap, gap_low, gap_high = t_interval(gaps)
        change, change_low, change_high = t_interval(changes)
        xerr = None if gap_low is None else [[gap - gap_low], [gap_high - gap]]
        yerr = None if change_low is None else [[change - change_low], [change_high - change]]
        ax.errorbar([gap], [change], xerr=xerr, yerr=yerr, color=color, marker="s",
                    capsize=3, label=f"{task}, budget in {unit} ({len(forced)} seeds)")
    ax.axhline(0, color="grey", linewidth=0.5)
    ax.axvline(0, color="grey", linewidth=0.5)
    ax.set_xlabel("forced gap: forced block - forced chain (Mean@4, points)")
    ax.set_ylabel("S1's block-share change (points)")
    ax.set_title("Does RL follow the forced gap? (scripts/studies/choice.sh)", fontsize=10)
    handles, _ = ax.get_legend_handles_labels()
    if handles:                               # none when no cell has its forced arms yet
        ax.legend(fontsize=8)
    curves_ax.axhline(0, color="grey", linewidth=0.5)
    curves_ax.set_xlabel("GRPO step (free choice, Unseen S1)")
    curves_ax.set_ylabel("blocks (solid), groups with both kinds (dotted),\n"
                         "acc. with - without a block (dashed), %")
    curves_ax.set_title(f"What S1 sees and does ({WINDOW}-step means, a line per seed)",
                        fontsize=10)
    if s2_runs:
        s2_ax = axes[2]
        for color, curves in s2_runs:
            for key, style in (("share", "-"), ("mixed", ":")):
                values = moving_mean(curves[key])
                s2_ax.plot(range(1, len(values) + 1), values, color=color, linestyle=style,
                           linewidth=1)
        s2_ax.set_xlabel("GRPO step (Unseen S2)")
        s2_ax.set_ylabel("blocks (solid), groups with both kinds (dotted), %")
        s2_ax.set_title("S2 from the SFT (colors as left) and from S1's drop (black)",
                        fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def sweep(chain_folder: str, block_folder: str, caps: list[int]) -> str:
    """The forced gap of two evaluations of one model cut at each cap, in each unit."""
    chain = read_samples(chain_folder)
    block = read_samples(block_folder)
    lines = ["| cap | unit | chain | block | forced gap [95%] |", "|---|---|---|---|---|"]
    for cap in caps:
        for unit in UNITS:
            base = per_problem(chain, "correct", unit, cap)
            other = per_problem(block, "correct", unit, cap)
            gap = paired_bootstrap(base, other)
            lines.append(f"| {cap} | {unit} | {statistics.mean(base.values()):.1f} | "
                         f"{statistics.mean(other.values()):.1f} | {interval_text(*gap)} |")
    return "\n".join(lines)


def parse_numbers(text: str) -> list[int]:
    try:
        numbers = [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers separated by commas, "
                                         "e.g. 0,1,2") from None
    if len(set(numbers)) < len(numbers) or min(numbers) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give each number once, none below 0")
    return numbers


def parse_tasks(text: str) -> tuple:
    tasks = tuple(text.split(","))
    if not tasks or any(task not in TASKS for task in tasks):
        raise argparse.ArgumentTypeError(f"{text!r}: give tasks of {','.join(TASKS)}, "
                                         "comma-separated")
    return tasks


def main(argv: list[str] | None = None):
    first_paragraph = __doc__.split("\n\n")[0]
    parser = argparse.ArgumentParser(description=first_paragraph.replace("\n", " "))
    parser.add_argument("folders", nargs="+", help="the folder choice.sh wrote (runs/choice); "
                        "with --sweep, the forced chain's and the forced block's eval folders")
    parser.add_argument("--seeds", type=parse_numbers, default=[0, 1, 2, 3, 4],
                        help="the seeds to read, comma-separated")
    parser.add_argument("--tasks", type=parse_tasks, default=TASKS,
                        help=f"the tasks to read, comma-separated, of {','.join(TASKS)}")
    parser.add_argument("--split", choices=("val", "test"), default="test",
                        help="the evaluations to read (eval-<split>)")
    parser.add_argument("--md", default="", help="also write the table here")
    parser.add_argument("--plot", default="", help="draw the figure here (a .png)")
    parser.add_argument("--sweep", action="store_true", help="print the forced gap of two "
                        "evaluations cut at each of --caps, in tokens and in decode steps")
    parser.add_argument("--caps", type=parse_numbers, default=[32, 48, 64, 96, 128],
                        help="with --sweep: the budgets to cut at, comma-separated")
    args = parser.parse_args(argv)
    for folder in args.folders:
        if not os.path.isdir(folder):
            parser.error(f"{folder}: not a folder")
    if args.sweep:
        if len(args.folders) != 2:
            parser.error("--sweep reads two eval folders: the forced chain's, the forced block's")
        print(sweep(*args.folders, args.caps))
        return 0
    if len(args.folders) != 1:
        parser.error("give one folder: the one choice.sh wrote (runs/choice)")
    cells = collect(args.folders[0], args.seeds, args.tasks, args.split)
    if not any(cells.values()):
        parser.error(f"{args.folders[0]}: no seed with every evaluation of a cell "
                     f"(<task>-seed<s>/<unit>/sft-eval-{args.split} and <arm>/eval-{args.split})")
    s2_cells = collect(args.folders[0], args.seeds, args.tasks, args.split, row_of=s2_row)
    returns = {}
    for task in args.tasks:
        rows = [return_row(args.folders[0], task, seed, args.split) for seed in args.seeds]
        returns[task] = [row for row in rows if row is not None]
    for out in (args.md, args.plot):
        folder = os.path.dirname(out)
        if folder and not os.path.isdir(folder):
            parser.error(f"{out}: its folder {folder} does not exist")
    text = report(cells, args.seeds, args.split, s2_cells, returns)
    print(text)
    if args.md:
        with open(args.md, "w", encoding="utf-8") as fh:
            fh.write("# The choice, controlled (scripts/studies/choice.sh)\n\n" + text + "\n")
    if args.plot:
        plot(cells, args.plot, s2_cells, returns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
