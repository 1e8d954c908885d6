"""One Table-2 style table whose rows pool the seeds of a method: every cell is the mean over seeds
and, in brackets, its 95% t interval across seeds (the seed as the unit: a trained model is one
draw; scripts/studies/choice.py's t_interval). One seed: the value alone.

    python scripts/studies/seeds_table.py runs/table2/eval_*      [--out=results/results.md]

Each argument is an eval.py output folder (it holds summary.json); folders whose summary has the
same "name" are seeds of one method (reproduce.sh names them "<method>" and puts the seed in the
folder). Columns: Parallel %, per benchmark Mean@k, T and D (response tokens, critical path), then
Avg (mean of the Mean@k columns, as in Table 2).
"""
import json
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))   # two folders up
sys.path.insert(0, ROOT)   # scripts.<folder>.<name>
from scripts.studies.choice import t_interval

OUT_FLAG = "--out="


def cell(values: list[float], scale: float = 100.0, digits: int = 1) -> str:
    """'mean ±half-spread' of values x scale, (max - min) / 2 (scripts/studies/budget_curve.py's
    tables); the mean alone for one value."""
    m = sum(values) / len(values)
    spread = (max(values) - min(values)) / 2
    return f"{scale * m:.{digits}f}" + (f" ±{scale * spread:.{digits}f}" if len(values) > 1 else "")


def t_cell(values: list[float], scale: float = 100.0, digits: int = 1) -> str:
    """'mean [low, high]' of values x scale, the 95% t interval across seeds; the mean alone for
    one seed."""
    mean, low, high = t_interval([scale * v for v in values])
    text = f"{mean:.{digits}f}"
    if low is not None:
        text += f" [{low:.{digits}f}, {high:.{digits}f}]"
    return text


def seeds_table(folders: list[str]) -> str:
    rows: dict[str, list[dict]] = {}
    for d in folders:
        with open(os.path.join(d, "summary.json"), encoding="utf-8") as fh:
            s = json.load(fh)
        rows.setdefault(s["name"], []).append(s)
    benches = list(next(iter(rows.values()))[0]["benchmarks"])
    k = next(iter(rows.values()))[0]["benchmarks"][benches[0]]["k"]
    header = ["Method", "seeds", "Parallel %", *[f"{b} Mean@{k}" for b in benches], "T", "D", "Avg"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]

    def bench_mean(run: dict, key: str) -> float:
        return sum(run["benchmarks"][b][key] for b in benches) / len(benches)

    for name, runs in rows.items():
        par = [bench_mean(r, "parallel_ratio") for r in runs]
        cells = [name, str(len(runs)), t_cell(par)]
        cells += [t_cell([r["benchmarks"][b]["mean_at_k"] for r in runs]) for b in benches]
        for key in ("mean_T", "mean_D"):
            cells.append(t_cell([bench_mean(r, key) for r in runs], scale=1.0))
        cells.append(t_cell([r["avg_mean_at_k"] for r in runs]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        sys.exit(print(__doc__))   # print returns None: exit status 0
    args = [a for a in sys.argv[1:] if not a.startswith(OUT_FLAG)]
    out = next((a[len(OUT_FLAG):] for a in sys.argv[1:] if a.startswith(OUT_FLAG)), None)
    if not args:
        sys.exit(__doc__)
    try:
        table = seeds_table(args)
        print(table)
        if out:
            with open(out, "w", encoding="utf-8") as fh:
                fh.write(table + "\n")
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"seeds_table.py: error: {type(e).__name__}: {e} (pass eval.py output folders "
                 "named eval_<run>_seed<s> and an --out in an existing folder)")
