"""One Table-2 style table of several evaluations:

    python scripts/studies/table.py runs/eval_a runs/eval_b [--out_dir=results]

Each folder holds the summary.json of an `eval.py` run; the table (eval.format_table) is printed
and, with --out_dir, written to <out_dir>/results.md.
"""
import argparse
import json
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))   # two folders up
sys.path.insert(0, ROOT)   # the core modules

from eval import format_table


def combine_tables(eval_dirs: list[str], out_dir: str | None = None) -> str:
    """One table with a row per evaluation folder; also written to out_dir/results.md when given.
    Raises FileNotFoundError naming a missing summary."""
    rows = {}
    for d in eval_dirs:
        path = os.path.join(d, "summary.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no {path}: run `python eval.py --model=... --out_dir={d}` "
                                    "first")
        with open(path, encoding="utf-8") as fh:
            s = json.load(fh)
        name = s["name"]
        if name in rows:                     # two runs of one name: both rows
            name = f"{name} ({d})"
        rows[name] = s["benchmarks"]
    table = format_table(rows)
    if out_dir and os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f"--out_dir={out_dir} is a file: name a folder (results.md is written "
                         "inside it)")
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "results.md"), "w", encoding="utf-8") as fh:
            fh.write(table + "\n")
    return table


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("eval_dirs", nargs="+", help="eval.py output folders (a comma list works too)")
    p.add_argument("--out_dir", default=None, help="write <out_dir>/results.md")
    args = p.parse_args()
    dirs = [d for a in args.eval_dirs for d in a.split(",") if d.strip()]
    if not dirs:                                      # table.py "": not a table with no row
        p.error(f"no evaluation folder in {args.eval_dirs}: pass eval.py output folders")
    try:
        print(combine_tables(dirs, args.out_dir))
    except (OSError, ValueError) as e:
        sys.exit(f"table.py: error: {e}")
