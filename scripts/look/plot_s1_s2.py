"""The paper's Finding 1 and Finding 2 in miniature: parallel ratio and relative <Parallel> position
of the training rollouts over GRPO steps, one line per run (moving average), S1 runs solid, S2 runs
dashed.

    python scripts/look/plot_s1_s2.py results/s1_vs_s2.png runs/reproduce/grpo_unseen-s1_seed0 \\
        runs/reproduce/grpo_unseen-s2_seed0 ...

Each run folder holds grpo.py's log.jsonl. Needs matplotlib (pip install -r requirements-extra.txt).
"""
import json
import os
import sys


def ema(ys, alpha=0.2):
    out = []
    m = None
    for y in ys:
        m = y if m is None else alpha * y + (1 - alpha) * m
        out.append(m)
    return out


def main(out: str, runs: list[str]):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for run in runs:
        with open(os.path.join(run, "log.jsonl")) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        rows = [r for r in rows if "parallel_ratio" in r]
        name = os.path.basename(os.path.normpath(run))
        style = "--" if "s2" in name else "-"
        for ax, key in zip(axes, ("parallel_ratio", "parallel_position")):
            pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            if pts:
                ax.plot([p[0] for p in pts], ema([p[1] for p in pts]), style, label=name)
    titles = ("parallel ratio (responses with a block)", "<Parallel> position (start / length)")
    for ax, title in zip(axes, titles):
        ax.set_title(title)
        ax.set_xlabel("GRPO step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        sys.exit(print(__doc__))   # print returns None: exit status 0
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    try:
        main(sys.argv[1], sys.argv[2:])
    # OSError: a run folder without log.jsonl; ValueError: an --out matplotlib cannot write
    except (OSError, ValueError) as e:
        sys.exit(f"plot_s1_s2.py: error: {e} (pass the image path, then grpo.py out_dirs)")
