"""S2 started from points along S1's drop: does where S2 starts decide whether it keeps blocks?
(issue 45, item 4: S2's absorbing state, shown with the signal RL sees.)

    python scripts/studies/s2_starts.py runs/choice runs/choice-hyst [--seeds=0,3,4]
        [--starts=4,6,8] [--md=FILE]

Pair task, under decode steps (B = 48), KL 0: every run is choice.sh's s2 arm (Unseen S2) with
only its start changed. Start 0 is the SFT (choice's <task>-seed<s>/steps/s2); start 100 is S1's
end under tokens (steps/s2low); start k between is the checkpoint after step k of the same S1 run
(the free arm under tokens, re-run with a checkpoint every step: its log matches the reported
run's at every step), in STARTS_ROOT/pair-seed<s>/s1tok/grpo/checkpoint-<k>, and S2 from it in
STARTS_ROOT/pair-seed<s>/s2from<k>/grpo. The commands are in results/LOG.md (2026-12-08).

Per seed and start, from the runs' log.jsonl (training rollouts, 32 prompts x 4 a step): the
block share S1 drew from that start (the reported S1 run's next step); S2's share over its
first FIRST steps, at step BEFORE_BONUS (before its first bonus) and over its last LAST steps;
the share of groups holding both kinds and the accuracy with a block minus without (over the
steps where both occur), over the first EARLY steps and over the rest; beside it the control,
S1 (choice's free arm under decode steps) from the same start (STARTS_ROOT/pair-seed<s>/
s1from<k>/grpo; from the SFT, choice's steps/free).
Everything in %.
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from scripts.studies.choice import parse_numbers, training_curves

FIRST = 5          # steps that give the share S2 starts at
LAST = 10          # steps that give the share S2 ends at
EARLY = 20         # steps of the early signal; the rest are the late one
HELD = 50.0        # a share (%) over the last steps at or above which S2 kept blocks
BEFORE_BONUS = 8   # S2's last step before its first tiered (bonus) step, 9 (8 accuracy steps in 10)
SFT_START = 0      # the start that is the SFT itself
END_START = 100    # the start that is S1's end (choice's s2low arm)


def s2_folder(choice_root: str, starts_root: str, seed: int, start: int) -> str:
    """The grpo folder of S2 started at `start` (see the module docstring)."""
    seed_dir = f"pair-seed{seed}"
    if start == SFT_START:
        return os.path.join(choice_root, seed_dir, "steps", "s2", "grpo")
    if start == END_START:
        return os.path.join(choice_root, seed_dir, "steps", "s2low", "grpo")
    return os.path.join(starts_root, seed_dir, f"s2from{start}", "grpo")


def s1_folder(choice_root: str, starts_root: str, seed: int, start: int) -> str | None:
    """The grpo folder of S1 (the free arm) under decode steps from the same start, the control:
    S1 without S2's bonus and clip-higher. None for S1's end (not run)."""
    seed_dir = f"pair-seed{seed}"
    if start == SFT_START:
        return os.path.join(choice_root, seed_dir, "steps", "free", "grpo")
    if start == END_START:
        return None
    return os.path.join(starts_root, seed_dir, f"s1from{start}", "grpo")


def start_share(choice_root: str, seed: int, start: int) -> float | None:
    """The block share (%) the start's policy drew: in the reported S1 run under tokens, the
    rollouts of step start + 1 (the SFT's: step 1's), sampled by the checkpoint after step start;
    S1's end: its last step's. None where that log is missing or short."""
    s1 = training_curves(os.path.join(choice_root, f"pair-seed{seed}", "tokens", "free", "grpo"))
    index = min(start, END_START - 1)           # 0-based: step start + 1
    if len(s1["share"]) <= index:
        return None
    return s1["share"][index]


def mean_of(values: list) -> float | None:
    """The mean of the values that are not None; None when there are none."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    return statistics.mean(present)


def row(choice_root: str, starts_root: str, seed: int, start: int, steps: int) -> dict | None:
    """One S2 run's numbers (the module docstring); None while it has not run all its steps."""
    curves = training_curves(s2_folder(choice_root, starts_root, seed, start))
    if len(curves["share"]) < steps:
        return None
    share = curves["share"]
    s1_first = None
    s1_last = None
    folder = s1_folder(choice_root, starts_root, seed, start)
    if folder is not None:
        s1 = training_curves(folder)["share"]
        if len(s1) >= steps:
            s1_first = statistics.mean(s1[:FIRST])
            s1_last = statistics.mean(s1[-LAST:])
    return {"seed": seed, "start": start,
            "before_bonus": share[BEFORE_BONUS - 1], "s1_first": s1_first, "s1_last": s1_last,
            "s1_share": start_share(choice_root, seed, start),
            "first": statistics.mean(share[:FIRST]), "last": statistics.mean(share[-LAST:]),
            "mixed_early": statistics.mean(curves["mixed"][:EARLY]),
            "gap_early": mean_of(curves["gap"][:EARLY]),
            "mixed_late": statistics.mean(curves["mixed"][EARLY:]),
            "gap_late": mean_of(curves["gap"][EARLY:])}


def text(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:+.1f}"


def report(rows: list[dict]) -> list[str]:
    """The table, a line per run, and each start's count of seeds that kept blocks."""
    header = (f"| seed | start (S1's step) | S1's share from there | S2's share, first {FIRST} "
              f"→ step {BEFORE_BONUS} → last {LAST} steps | mixed groups, steps 1-{EARLY} / after "
              f"| block − chain accuracy, steps 1-{EARLY} / after | kept blocks "
              f"| control: S1 from there, first {FIRST} → last {LAST} |")
    lines = [header, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        start = "the SFT" if r["start"] == SFT_START else f"step {r['start']}"
        s1_share = "-" if r["s1_share"] is None else f"{r['s1_share']:.1f}"
        kept = "yes" if r["last"] >= HELD else "no"
        control = "-"
        if r["s1_last"] is not None:
            control = f"{r['s1_first']:.1f} → {r['s1_last']:.1f}"
        lines.append(f"| {r['seed']} | {start} | {s1_share} | {r['first']:.1f} → "
                     f"{r['before_bonus']:.1f} → {r['last']:.1f} "
                     f"| {r['mixed_early']:.1f} / {r['mixed_late']:.1f} "
                     f"| {text(r['gap_early'])} / {text(r['gap_late'])} | {kept} | {control} |")
    lines.append("")
    starts = sorted({r["start"] for r in rows})
    for start in starts:
        of_start = [r for r in rows if r["start"] == start]
        kept = sum(r["last"] >= HELD for r in of_start)
        line = (f"start {start}: S2 kept blocks (last {LAST} steps ≥ {HELD:.0f}%) on {kept} of "
                f"{len(of_start)} seeds")
        controls = [r["s1_last"] for r in of_start if r["s1_last"] is not None]
        if controls:
            s1_kept = sum(share >= HELD for share in controls)
            line += f"; S1 on {s1_kept} of {len(controls)}"
        lines.append(line)
    for kept_blocks in (True, False):
        late = [r["gap_late"] for r in rows
                if (r["last"] >= HELD) == kept_blocks and r["gap_late"] is not None]
        if late:
            name = "kept blocks" if kept_blocks else "dropped them"
            values = ", ".join(f"{g:+.1f}" for g in late)
            lines.append(f"runs that {name}: block − chain accuracy after step {EARLY}: {values}")
    return lines


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("choice_root", help="the folder choice.sh wrote (runs/choice)")
    parser.add_argument("starts_root", help="the folder of the S1 re-run and S2's runs from it")
    parser.add_argument("--seeds", type=parse_numbers, default=[0, 3, 4],
                        help="seeds (default 0,3,4: those where S2 kept blocks from the SFT)")
    parser.add_argument("--starts", type=parse_numbers, default=[4, 6, 8],
                        help="S1's steps S2 starts from, beside the SFT and S1's end")
    parser.add_argument("--steps", type=int, default=100, help="S2's training steps")
    parser.add_argument("--md", default="", help="also write the table here")
    args = parser.parse_args(argv)
    if args.steps < max(BEFORE_BONUS, LAST, FIRST):
        parser.error(f"--steps={args.steps}: give at least {max(BEFORE_BONUS, LAST, FIRST)}")
    if SFT_START in args.starts or END_START in args.starts:
        parser.error(f"--starts: {SFT_START} (the SFT) and {END_START} (S1's end) are always "
                     "shown; name only the steps between")
    for folder in (args.choice_root, args.starts_root):
        if not os.path.isdir(folder):
            sys.exit(f"s2_starts.py: {folder} is not a folder: give the choice.sh folder and "
                     "the folder of the S2 runs from S1's steps")
    rows = []
    missing = []
    for seed in args.seeds:
        for start in [SFT_START, *args.starts, END_START]:
            try:
                found = row(args.choice_root, args.starts_root, seed, start, args.steps)
            except (ValueError, KeyError) as error:      # a cut or foreign log.jsonl line
                sys.exit(f"s2_starts.py: seed {seed}, start {start}: a log.jsonl line is not a "
                         f"GRPO step's row ({error!r}): let the run finish, or move that log aside")
            if found is None:
                missing.append(s2_folder(args.choice_root, args.starts_root, seed, start))
            else:
                rows.append(found)
    lines = report(rows)
    print("\n".join(lines))
    for folder in missing:
        print(f"not yet run ({args.steps} steps): {folder}", file=sys.stderr)
    if args.md:
        with open(args.md, "w", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
