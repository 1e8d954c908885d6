"""Training curves of a run (the paper's Figures 3-4):

    python scripts/look/plot.py runs/grpo [--out=curves.png]

Reward, accuracy, parallel ratio and the relative <Parallel> position against step, from the run's
log.jsonl (grpo.py or sft.py), into <run>/curves.png. Needs matplotlib (pip install -r
requirements-extra.txt).
"""
import argparse
import json
import math
import os
import sys

# Panel title -> the log keys drawn in it (the last "/"-part of a key: "eval/aime25/mean_at_k" ->
# "mean_at_k").
PANELS = {
    "reward": ("reward_mean", "reward"),
    "accuracy": ("accuracy", "acc", "mean_at_k", "pass_at_k"),
    "parallel ratio": ("parallel_ratio",),
    "relative <Parallel> position": ("parallel_position", "mean_parallel_position"),
}


def _ema(ys: list[float], alpha: float) -> list[float]:
    out = []
    m = None
    for y in ys:
        m = y if m is None else alpha * y + (1 - alpha) * m
        out.append(m)
    return out


def plot_curves(run_dir: str, out: str | None = None, smooth: float = 0.1) -> str:
    """Draw reward, accuracy, parallel ratio and relative <Parallel> position against step from a
    run's `log.jsonl` into `run_dir/curves.png` (or `out`). Returns the image path.

    Every line of the log is a JSON dict; "step" is the x axis (the line number when absent). A key
    is drawn in the panel whose names hold its last "/"-part (see `PANELS`): training keys
    ("accuracy") as a faint raw line plus an exponential moving average (weight `smooth` on the
    newest point), evaluation keys ("eval/<bench>/mean_at_k") as markers. Missing keys, None/NaN
    values and lines that are not JSON are skipped; a panel with no data says so.
    Raises FileNotFoundError for a missing log, SystemExit with the install command without
    matplotlib.
    """
    log = os.path.join(run_dir, "log.jsonl")
    if not os.path.isfile(log):
        raise FileNotFoundError(f"no log.jsonl in {run_dir}: pass the out_dir of a grpo.py or "
                                "sft.py run")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("plotting needs matplotlib, an optional dependency: pip install "
                         "matplotlib  (or pip install -r requirements-extra.txt)") from None
    series: dict[str, tuple[list, list]] = {}
    with open(log, encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(row, dict):
                continue
            x = row.get("step", i + 1)
            for key, y in row.items():
                number = isinstance(y, (int, float)) and not isinstance(y, bool)
                if key != "step" and number and math.isfinite(y):
                    xs, ys = series.setdefault(key, ([], []))
                    xs.append(x)
                    ys.append(y)
    if not any(k.split("/")[-1] in names for k in series for names in PANELS.values()):
        plotted = ", ".join(n for v in PANELS.values() for n in v)
        print(f"[plot] {log} has none of the plotted keys ({plotted}); curves come from grpo.py "
              "runs", file=sys.stderr)
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharex=True)
    for ax, (title, names) in zip(axes.flat, PANELS.items()):
        keys = [k for k in series if k.split("/")[-1] in names]
        for key in sorted(keys, key=lambda k: (k.startswith("eval/"), k)):
            xs, ys = series[key]
            if key.startswith("eval/"):
                ax.plot(xs, ys, marker="o", markersize=3, linewidth=1, label=key)
            else:
                (raw,) = ax.plot(xs, ys, alpha=0.25, linewidth=0.8)
                ax.plot(xs, _ema(ys, smooth), color=raw.get_color(), linewidth=1.6,
                        label=f"{key} (EMA)")
        if keys:
            ax.legend(fontsize=7, loc="best")
        else:
            ax.text(0.5, 0.5, f"no {' / '.join(names)} in the log", ha="center", va="center",
                    transform=ax.transAxes, color="gray")
        if title != "reward":                       # fractions: the same scale in every run
            ax.set_ylim(-0.02, 1.02)
        ax.set_title(title)
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("step")
    fig.suptitle(os.path.basename(os.path.abspath(run_dir)))
    fig.tight_layout()
    out = out or os.path.join(run_dir, "curves.png")
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", help="the out_dir of a grpo.py or sft.py run")
    p.add_argument("--out", default=None, help="the image (default <run_dir>/curves.png)")
    p.add_argument("--smooth", type=float, default=0.1, help="EMA weight of the newest point")
    args = p.parse_args()
    if not 0 < args.smooth <= 1:
        p.error(f"--smooth={args.smooth}: the weight of the newest point must be in (0, 1] "
                "(1 = no smoothing)")
    try:
        print(f"[plot] wrote {plot_curves(args.run_dir, args.out, args.smooth)}")
    except (OSError, ValueError) as e:     # ValueError: an --out format matplotlib cannot write
        sys.exit(f"plot.py: error: {e}")
