"""What RL does with the choice to think in parallel: the block share of the training rollouts
against the GRPO step, and where it ends, from the runs of scripts/studies/dynamics.sh.

    python scripts/studies/dynamics.py runs/dynamics [--seeds=0,1,2] [--md=results/dynamics.md]
        [--plot=results/dynamics.png]

The folder holds, per seed s:
  pair-seed<s>/eval-sft, pair-seed<s>/{s1,s2}/{grpo,eval}     the pair task at equal tokens
  carry-seed<s>/eval-sft-{steps,tokens}, carry-seed<s>/{steps,tokens}/{grpo,eval}
                                                              the carry task, S1 under each budget
grpo/log.jsonl gives the training rollouts' block share (`parallel_ratio`) and accuracy at every
step; eval/summary.json the held-out block share (mean over the task's test parts) and accuracy
(Mean@k). A setting with no folder for some seed is left out (say which seeds ran).

Printed (and written to --md): per setting and seed, the held-out block share and accuracy of the
SFT and after GRPO; the training share over the first and last WINDOW steps; the lowest training
accuracy over any WINDOW steps against the first WINDOW's (a crash: below half); then the issue's
targets, each with the seeds that meet it. --plot: block share against the step (a WINDOW-step
moving mean; a line per seed, the band their min and max), a column per task, training accuracy
beneath, and, where the logs hold it, the signal RL sees about the choice (eval.rollout_stats): the
share of groups holding responses with and without a block (only there do the advantages tell
the two apart) and the accuracy with a block minus without (both in %, WINDOW-step means of the
steps that have it). Needs matplotlib for --plot (pip install -r requirements-extra.txt).
"""
import argparse
import json
import os
import statistics
import sys

WINDOW = 10                  # steps in a moving mean (the curves) and in "first" and "last"
RATIO_DROP = 15.0            # points: S1 below its SFT's share (pair), above it (carry, steps)
S2_OVER_S1 = 15.0            # points: S2's final share over S1's (the paper: 63.0 vs 13.6)
CRASH = 0.5                  # training accuracy below this share of its start is a crash
# (task, setting): its folder under <task>-seed<s>, the SFT evaluation it is compared with, the
# label in the table and the figure.
SETTINGS = {
    ("pair", "s1"): ("s1", "eval-sft", "Unseen S1 (accuracy reward)"),
    ("pair", "s2"): ("s2", "eval-sft", "Unseen S2 (alternating, parallel reward)"),
    ("carry", "steps"): ("steps", "eval-sft-steps", "S1, budget in decode steps"),
    ("carry", "tokens"): ("tokens", "eval-sft-tokens", "S1, budget in tokens"),
}
TASKS = ("pair", "carry")
SHOWN_ONLY = ("carry", "tokens")   # shown beside the study, with no target
PAPER = "the paper (Qwen3-4B, AIME25 etc.): S1 ends at 13.6% parallel, S2 at 63.0%"


def read_log(folder: str) -> list[dict]:
    """The training steps' records of a grpo.py run (log.jsonl), in step order."""
    with open(os.path.join(folder, "log.jsonl"), encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return [r for r in rows if "parallel_ratio" in r and "accuracy" in r]


def read_eval(folder: str) -> tuple[float, float]:
    """(block share, Mean@k) of an eval.py run, each the mean over its test parts, in %."""
    with open(os.path.join(folder, "summary.json"), encoding="utf-8") as fh:
        summary = json.load(fh)
    parts = summary["benchmarks"].values()
    share = statistics.mean(part["parallel_ratio"] for part in parts)
    return 100 * share, 100 * summary["avg_mean_at_k"]


def moving_mean(values: list[float], window: int = WINDOW) -> list[float]:
    """The mean of each value and the window - 1 before it (fewer at the start)."""
    out = []
    for i in range(len(values)):
        recent = values[max(0, i - window + 1):i + 1]
        out.append(sum(recent) / len(recent))
    return out


def moving_mean_present(values: list) -> list[float]:
    """moving_mean over the values that are not None (a step without both kinds has no gap);
    NaN where a window holds none (a gap in the plotted line)."""
    out = []
    for i in range(len(values)):
        recent = [v for v in values[max(0, i - WINDOW + 1):i + 1] if v is not None]
        out.append(sum(recent) / len(recent) if recent else float("nan"))
    return out


def run_row(root: str, task: str, setting: str, seed: int) -> dict | None:
    """One run's numbers, or None when it has not finished (no eval summary)."""
    folder, sft_eval, _ = SETTINGS[(task, setting)]
    seed_dir = os.path.join(root, f"{task}-seed{seed}")
    run_dir = os.path.join(seed_dir, folder)
    needed = [os.path.join(run_dir, "eval", "summary.json"),
              os.path.join(seed_dir, sft_eval, "summary.json"),
              os.path.join(run_dir, "grpo", "log.jsonl")]
    if not all(os.path.exists(path) for path in needed):
        return None
    log = read_log(os.path.join(run_dir, "grpo"))
    if not log:                                   # stopped before its first step was logged
        return None
    ratio = [100 * r["parallel_ratio"] for r in log]
    accuracy = [r["accuracy"] for r in log]
    smoothed = moving_mean(accuracy)[WINDOW - 1:] or [statistics.mean(accuracy)]
    sft_share, sft_accuracy = read_eval(os.path.join(seed_dir, sft_eval))
    share, final_accuracy = read_eval(os.path.join(run_dir, "eval"))
    start_accuracy = statistics.mean(accuracy[:WINDOW])
    smoothed_ratio = moving_mean(ratio)
    lowest_step = min(range(len(smoothed_ratio)), key=lambda i: smoothed_ratio[i])
    lowest_accuracy = None                        # a start at 0 cannot crash
    if start_accuracy > 0:
        lowest_accuracy = min(smoothed) / start_accuracy
    mixed = [r.get("mixed_groups") for r in log]             # None in logs made before them
    gap = [r.get("block_accuracy_gap") for r in log]
    return {"seed": seed, "steps": len(log), "ratio": ratio, "accuracy": accuracy,
            "mixed": mixed, "gap": gap,
            "sft_share": sft_share, "share": share,
            "sft_accuracy": sft_accuracy, "final_accuracy": final_accuracy,
            "train_first": statistics.mean(ratio[:WINDOW]),
            "train_last": statistics.mean(ratio[-WINDOW:]),
            "lowest_share": smoothed_ratio[lowest_step], "lowest_share_step": lowest_step + 1,
            "lowest_accuracy": lowest_accuracy}


def collect(root: str, seeds: list[int], tasks: tuple[str, ...] = TASKS) -> dict:
    """{(task, setting): [run_row per seed that finished]}; a task not in `tasks` has none."""
    runs = {}
    for key in SETTINGS:
        rows = []
        if key[0] in tasks:
            rows = [run_row(root, *key, seed) for seed in seeds]
        runs[key] = [row for row in rows if row is not None]
    return runs


def unfinished(runs: dict, seeds: list[int], tasks: tuple[str, ...] = TASKS) -> list[str]:
    """"carry, S1, budget in tokens: seeds 1, 2" for each setting of `tasks` some asked-for seed
    lacks."""
    lines = []
    for key, rows in runs.items():
        if key[0] not in tasks:
            continue
        done = {r["seed"] for r in rows}
        missing = [str(seed) for seed in seeds if seed not in done]
        if missing:
            lines.append(f"{key[0]}, {SETTINGS[key][2]}: seeds {', '.join(missing)}")
    return lines


def seeds_meeting(rows: list[dict], test) -> str:
    """"seeds 0, 2 of 0, 1, 2" for the rows whose numbers pass `test`."""
    held = [str(r["seed"]) for r in rows if test(r)]
    ran = [str(r["seed"]) for r in rows]
    if not ran:
        return "not run"
    return f"seeds {', '.join(held) or 'none'} of {', '.join(ran)}"


def no_crash(row: dict) -> bool:
    """Training accuracy never fell below CRASH of its start (true of a start at 0)."""
    return row["lowest_accuracy"] is None or row["lowest_accuracy"] >= CRASH


def report(runs: dict, seeds: list[int], tasks: tuple[str, ...] = TASKS) -> str:
    header = ("| task | setting | seed | SFT blocks | final blocks | change | training share "
              f"(first {WINDOW} -> last {WINDOW} steps) | lowest training share ({WINDOW}-step "
              "mean, at step) | SFT acc | final acc | lowest training acc / start |")
    lines = [header, "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (task, setting), rows in runs.items():
        label = SETTINGS[(task, setting)][2]
        for r in rows:
            lowest = "- (starts at 0)"
            if r["lowest_accuracy"] is not None:
                lowest = f"{r['lowest_accuracy']:.2f}"
            lines.append(
                f"| {task} | {label} | {r['seed']} | {r['sft_share']:.1f}% | {r['share']:.1f}% | "
                f"{r['share'] - r['sft_share']:+.1f} | {r['train_first']:.1f}% -> "
                f"{r['train_last']:.1f}% | {r['lowest_share']:.1f}% ({r['lowest_share_step']}) | "
                f"{r['sft_accuracy']:.1f} | {r['final_accuracy']:.1f} | "
                f"{lowest} |")
    legend = ("Blocks: responses that open a block, held-out (mean over the test parts); acc: "
              "Mean@k within the run's budget; lowest training acc: the lowest "
              f"{WINDOW}-step mean over the first {WINDOW} steps' (a crash: below {CRASH}).")
    lines += ["", legend, f"For comparison, {PAPER}.", "", "Targets (every seed):"]
    s1 = {r["seed"]: r for r in runs[("pair", "s1")]}
    s2 = {r["seed"]: r for r in runs[("pair", "s2")]}
    both = [r for seed, r in s2.items() if seed in s1]
    targets = [
        ("carry, decode steps: S1 raises the block share by >= 15 points over its SFT's",
         runs[("carry", "steps")], lambda r: r["share"] - r["sft_share"] >= RATIO_DROP),
        ("pair: S1 ends >= 15 points below its SFT's share", runs[("pair", "s1")],
         lambda r: r["sft_share"] - r["share"] >= RATIO_DROP),
        ("pair: S2 ends >= 15 points above S1", both,
         lambda r: r["share"] - s1[r["seed"]]["share"] >= S2_OVER_S1),
        ("pair: S1 never crashes (training accuracy never below half its start)",
         runs[("pair", "s1")], no_crash),
        ("pair: S2 never crashes", runs[("pair", "s2")], no_crash)]
    for key in SETTINGS:
        if key != SHOWN_ONLY:
            targets.append((f"{key[0]}, {SETTINGS[key][2]}: accuracy not below its SFT's",
                            runs[key], lambda r: r["final_accuracy"] >= r["sft_accuracy"]))
    for text, rows, test in targets:
        lines.append(f"- {text}: {seeds_meeting(rows, test)}")
    label = f"{SHOWN_ONLY[0]}, {SETTINGS[SHOWN_ONLY][2]}: accuracy not below its SFT's"
    held = seeds_meeting(runs[SHOWN_ONLY], lambda r: r["final_accuracy"] >= r["sft_accuracy"])
    lines += ["", "No target (what the token rule does to the choice):", f"- {label}: {held}"]
    missing = unfinished(runs, seeds, tasks)
    if missing:
        lines += ["", "Not finished (no evaluation yet):"] + [f"- {line}" for line in missing]
    return "\n".join(lines)


def plot(runs: dict, out: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = [task for task in ("pair", "carry")
             if any(rows for key, rows in runs.items() if key[0] == task)]
    signal = any(r["mixed"] and r["mixed"][0] is not None for rows in runs.values() for r in rows)
    panels = 2 + signal
    fig, axes = plt.subplots(panels, len(tasks), figsize=(5.5 * len(tasks), 3.25 * panels),
                             sharex=True, squeeze=False)
    titles = {"pair": "pair task, equal tokens", "carry": "carry task, S1 under two budgets"}
    for column, task in enumerate(tasks):
        for (key_task, setting), rows in runs.items():
            if key_task != task or not rows:
                continue
            label = SETTINGS[(key_task, setting)][2]
            steps = min(r["steps"] for r in rows)
            x = list(range(1, steps + 1))
            color = None
            for row, key, scale in ((0, "ratio", 1.0), (1, "accuracy", 100.0)):
                curves = [moving_mean([v * scale for v in r[key][:steps]]) for r in rows]
                low = [min(values) for values in zip(*curves)]
                high = [max(values) for values in zip(*curves)]
                seeds = ",".join(str(r["seed"]) for r in rows)
                for i, curve in enumerate(curves):          # each seed: S2's may part ways
                    name = f"{label} (seeds {seeds})" if i == 0 and row == 0 else None
                    line, = axes[row][column].plot(x, curve, color=color, linewidth=1, label=name)
                    color = line.get_color()
                axes[row][column].fill_between(x, low, high, alpha=0.15, color=color)
            for r in rows if signal else []:
                mixed = [None if v is None else 100 * v for v in r["mixed"][:steps]]
                gap = [None if v is None else 100 * v for v in r["gap"][:steps]]
                axes[2][column].plot(x, moving_mean_present(mixed), color=color, linewidth=1)
                axes[2][column].plot(x, moving_mean_present(gap), color=color, linewidth=1,
                                     linestyle="--")
        axes[0][column].set_title(titles[task])
        axes[0][column].set_ylabel("responses with a block (%)")
        axes[1][column].set_ylabel("training accuracy (%)")
        axes[-1][column].set_xlabel("GRPO step")
        if signal:
            axes[2][column].set_ylabel("groups with both kinds (solid),\n"
                                       "acc. with - without a block (dashed) (%)", fontsize=8)
            axes[2][column].axhline(0, color="grey", linewidth=0.5)
        axes[0][column].set_ylim(0, 100)
        if axes[0][column].lines:
            axes[0][column].legend(fontsize=8, loc="center right")   # between 0 and 100%
    fig.suptitle(f"What RL does with the choice: training rollouts\n{WINDOW}-step moving mean, "
                 "a line per seed, band = the seeds' min-max", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers separated by commas, "
                                         "e.g. 0,1,2") from None
    if len(set(seeds)) < len(seeds):
        raise argparse.ArgumentTypeError(f"{text!r} names a seed twice: give each seed once")
    return seeds


def parse_tasks(text: str) -> tuple[str, ...]:
    tasks = tuple(text.split(","))
    unknown = [task for task in tasks if task not in TASKS]
    if unknown or not tasks:
        raise argparse.ArgumentTypeError(f"{text!r}: give tasks of {','.join(TASKS)}, "
                                         "comma-separated")
    return tasks


def check_output(parser, flag: str, path: str, suffix: str):
    """parser.error unless `path` can be written: its folder exists, it is not a folder."""
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder) or os.path.isdir(path) or not path.endswith(suffix):
        parser.error(f"{flag}={path}: give a {suffix} file in an existing folder")


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("root", help="the folder scripts/studies/dynamics.sh wrote (runs/dynamics)")
    parser.add_argument("--seeds", type=parse_seeds, default=[0, 1, 2],
                        help="the seeds to read, comma-separated (default 0,1,2)")
    parser.add_argument("--tasks", type=parse_tasks, default=TASKS,
                        help="the tasks to read, comma-separated (default pair,carry)")
    parser.add_argument("--md", default="", help="also write the table here")
    parser.add_argument("--plot", default="", help="draw the curves here (a .png)")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.root):
        parser.error(f"{args.root}: no such folder; run scripts/studies/dynamics.sh first")
    if args.md:
        check_output(parser, "--md", args.md, ".md")
    if args.plot:
        check_output(parser, "--plot", args.plot, ".png")
    runs = collect(args.root, args.seeds, args.tasks)
    if not any(runs.values()):
        parser.error(f"{args.root}: no finished run (a <task>-seed<s>/<setting>/eval/summary.json"
                     " beside its SFT's evaluation)")
    text = report(runs, args.seeds, args.tasks)
    print(text)
    if args.md:
        with open(args.md, "w", encoding="utf-8") as fh:
            heading = "# When RL chooses parallel thinking (scripts/studies/dynamics.sh)"
            fh.write(heading + "\n\n" + text + "\n")
    if args.plot:
        plot(runs, args.plot)


if __name__ == "__main__":
    sys.exit(main())
