"""Evaluation: Mean@k, Pass@k and the parallel-thinking statistics of the paper's Table 2 (PAPER_NOTES §3.5, §7.1).

    python eval.py --model=runs/grpo/checkpoint-200 --data=aime24,aime25,amc23,math500 --k=16
    python eval.py --model=runs/sft/checkpoint-300          # tiny checkpoint: synthetic test sets, k=8
    python eval.py --model=runs/grpo/checkpoint-200 --mode=seen --k_overrides=math500=1
    python eval.py --plot=runs/grpo                         # reward/accuracy/parallel curves -> curves.png

(`--key value` works as well as `--key=value`.) For every benchmark, every problem gets k responses from the
branching sampler (`sample.generate`, in the model's mode), each response is scored with
`rewards.score_batch`, and the run reports

    Mean@k       mean over problems of c/n: the expected accuracy of one response (n = k samples, c correct)
    Pass@k       mean over problems of the unbiased estimator 1 - C(n-c, k) / C(n, k) (`pass_at_k`)
    Parallel %   responses with >= 1 <Parallel> block (the paper's "# Parallel" column)
    blocks, position, T, D   mean blocks per response, mean relative <Parallel> position (Figure 3),
                 mean response tokens T and critical-path length D (decode steps when paths run side by side)
    Avg          mean of the Mean@ columns, as in Table 2 (GRPO: (14.8+18.5+63.6+83.5)/4 = 45.1)

and writes to `--out_dir`: `results.md` (a Markdown table in the layout of Table 2), `samples.jsonl` (every
response with its extracted answer, gold, correctness, reward and structure) and `summary.json`.

Pass@k. The official code reports verl's `best@k/mean`: 1000 bootstrap resamples of k of the n responses
*with replacement*, best of each, averaged. Its expectation is 1 - (1 - c/n)^k, biased low: with one
correct response of 16 it is 1 - (15/16)^16 = 0.644, although one of the 16 drawn responses was right
(the unbiased estimate is 1.0). Which of the two the paper's Pass@16 column is, is unknown (PAPER_NOTES
§3.5); we report the unbiased one and, for comparison, the bootstrap's expectation as `pass_at_k_verl`
in summary.json.

The model's mode. `--mode` (unseen | seen | sequential); by default the mode the checkpoint was trained in,
read from its `trainer_state.pt` config (sft.py and grpo.py save it; a config with style "sequential" means
the sequential baseline) or a `parallel_r1.json` next to the weights, else "unseen". The prompt follows the
mode (sequential -> the baseline prompt of `data.build_prompt`) unless `--prompt_style` or `--prompt_file`
is given; a prompt file the checkpoint was trained with is used again when it still exists (the authors
note the tags appear only with the training prompt, PAPER_NOTES §1.4).

Tags. A checkpoint whose tokenizer lacks the six tags was never trained with them: `load_model` would add
fresh, untrained embeddings, and the parallel modes would sample from them. That is an error in the
parallel modes unless `--allow_untrained_tags=True` (e.g. the base-model row of Table 2); the sequential
mode only prints a note, since it never needs them.

Defaults follow the paper for real models (temperature 1.0, top-p 1.0, a response budget of 3000 tokens
counted over paths and summaries, k = 16, the four benchmarks); the MATH column of Table 2 is Mean@1,
which `--k_overrides=math500=1` reproduces. (The paper's MATH set was probably the 316 integer-answer
problems of MATH-500, PAPER_NOTES §3.5; `math500` here is all 500, LaTeX answers included, checked by
`rewards.verify`; `--verifier=paper` switches to the official string match.) For the tiny model (its
tokenizer has fewer than `data.TINY_VOCAB_LIMIT` entries) the defaults are 256 new tokens, k = 8,
batches of 16 prompts, and the first 64 problems of each synthetic test set.

Context. A problem whose prompt + `max_new_tokens` exceeds the model's context (`max_position_embeddings`:
512 for the tiny model, one token per character) is skipped: the run prints how many per benchmark, the
metrics cover the rest, and summary.json lists the skipped ids under "skipped_too_long" (`--limit` counts
before skipping). It is an error when no problem of a benchmark fits. `--skip_long_prompts=False`
samples them anyway, past the positions the model was trained on (rotary models run; the output is
meaningless). Real models (32k+ contexts) never hit this with the paper's 3000-token budget.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from dataclasses import dataclass

# idle OpenMP threads sleep instead of spinning (read when torch loads; sft.py measured spinning 5x slower
# on shared cores, and an eval beside another job ~100x)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

MODES = ("unseen", "seen", "sequential")

# ----------------------------------------------------------------------------------------------------
# Metrics


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of Pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k).

    The chance that k responses drawn *without* replacement from the n include a correct one. Computed
    as 1 - prod_{i=0}^{k-1} (n-c-i)/(n-i), which never forms the huge binomials.

        >>> pass_at_k(16, 1, 16), pass_at_k(16, 1, 1), pass_at_k(5, 2, 2), pass_at_k(16, 0, 16)
        (1.0, 0.0625, 0.7, 0.0)

    Raises ValueError unless 0 <= c <= n and 1 <= k <= n.
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:                                   # every k-subset holds a correct sample
        return 1.0
    miss = 1.0
    for i in range(k):
        miss *= (n - c - i) / (n - i)
    return 1.0 - miss


def pass_at_k_verl(n: int, c: int, k: int) -> float:
    """Expectation of verl's bootstrap `best@k/mean` (k draws *with* replacement): 1 - (1 - c/n)^k.

    Biased low against `pass_at_k`: pass_at_k_verl(16, 1, 16) = 0.644, pass_at_k(16, 1, 16) = 1.0.
    """
    if not (0 <= c <= n and k >= 1 and n >= 1):
        raise ValueError(f"pass_at_k_verl needs 0 <= c <= n, n >= 1, k >= 1, got n={n}, c={c}, k={k}")
    return 1.0 - (1.0 - c / n) ** k


def _mean(xs) -> float | None:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else None


def summarize(samples: list[dict], k: int) -> dict:
    """The metrics of one benchmark from its per-response records (what `evaluate` returns).

    Each sample needs: "benchmark", "id" (the problem), "correct", "has_parallel", "num_blocks",
    "parallel_positions" (relative position of each block), "format_valid", "T", "D". Samples of a
    problem are grouped by (benchmark, id); every problem must have at least k of them.

    Returns:
        mean_at_k               mean over problems of c/n
        pass_at_k               mean over problems of pass_at_k(n, c, k)
        pass_at_k_verl          mean over problems of pass_at_k_verl(n, c, k) (see the module docstring)
        parallel_ratio          share of responses with >= 1 block
        mean_blocks             blocks per response, over all responses
        mean_parallel_position  mean of block start / T over every block of every response (each block
                                counts once); None when no response has a block
        mean_T, mean_D          response tokens, critical-path length (sample.critical_path_length)
        format_valid            share of all responses whose structure is valid (a response without a
                                block is valid: it has nothing to get wrong)
        format_valid_parallel   the same among responses with >= 1 block; None when there are none
        k, num_problems, num_responses
    Fractions are in [0, 1]. Raises ValueError on no samples or a problem with fewer than k.
    """
    if not samples:
        raise ValueError("summarize: no samples")
    groups: dict[tuple, list[dict]] = {}
    for s in samples:
        groups.setdefault((s.get("benchmark"), s["id"]), []).append(s)
    per_problem = []
    for key, group in groups.items():
        n, c = len(group), sum(bool(s["correct"]) for s in group)
        if n < k:
            raise ValueError(f"problem {key[1]!r} has {n} samples, fewer than k={k}")
        per_problem.append((n, c))
    parallel = [s for s in samples if s["has_parallel"]]
    positions = [p for s in samples for p in s["parallel_positions"]]
    return {
        "k": k,
        "num_problems": len(per_problem),
        "num_responses": len(samples),
        "mean_at_k": _mean(c / n for n, c in per_problem),
        "pass_at_k": _mean(pass_at_k(n, c, k) for n, c in per_problem),
        "pass_at_k_verl": _mean(pass_at_k_verl(n, c, k) for n, c in per_problem),
        "parallel_ratio": len(parallel) / len(samples),
        "mean_blocks": _mean(s["num_blocks"] for s in samples),
        "mean_parallel_position": _mean(positions),
        "mean_T": _mean(s["T"] for s in samples),
        "mean_D": _mean(s["D"] for s in samples),
        "format_valid": _mean(bool(s["format_valid"]) for s in samples),
        "format_valid_parallel": _mean(bool(s["format_valid"]) for s in parallel),
    }


# ----------------------------------------------------------------------------------------------------
# Sampling and scoring


@torch.no_grad()
def evaluate(model, tokenizer, records: list[dict], mode: str, k: int = 1, max_new_tokens: int = 256,
             temperature: float = 1.0, top_p: float = 1.0, seed: int = 0, batch_size: int = 8,
             prompt_style: str | None = None, prompt_file: str | None = None, num_paths: int = 2,
             max_blocks: int = 4, verifier: str = "default", progress=None) -> tuple[dict, list[dict]]:
    """Sample k responses per record with the branching sampler, score them, and summarize.

    Args:
        model, tokenizer: from `model.load_model` (the tokenizer with the six tags). The model is put in
            eval mode for the call and restored after.
        records: `data.load_data` records ({"id", "problem", "answer", "source"}); one benchmark, or
            any list (the metrics pool all of them).
        mode: "unseen", "seen" or "sequential", the sampler's mode (`sample.generate`).
        k: responses per problem (n = k for Pass@k).
        max_new_tokens: response budget per sample, paths and summaries included.
        temperature, top_p: sampling (the paper: 1.0, 1.0).
        seed: the result is a function of (inputs, seed, batch_size): batch b samples with seed + b.
        batch_size: problems per `generate` call; each call samples batch_size * k rows.
        prompt_style: "parallel" or "sequential" prompt (`data.build_prompt`); default follows the mode.
        prompt_file: a template with {problem}, replacing the built-in prompts.
        num_paths, max_blocks: the sampler's block shape (the paper: 2 paths, at most 4 blocks).
        verifier: `rewards.verify`'s "default" (math-aware) or "paper" (the official string match).
        progress: a tqdm bar to advance by one per response (None: no bar).
    Returns:
        (metrics, samples): metrics as in `summarize`; samples one dict per response, problem-major:
        {"benchmark", "id", "sample_index", "prompt", "response" (text with tags, without EOS),
         "extracted_answer", "gold", "correct", "reward" (accuracy reward, ±1, PAPER_NOTES §4.1),
         "has_parallel", "num_blocks", "parallel_positions", "format_valid", "format_reason",
         "T", "D", "finish_reason"}.
    Raises:
        ValueError for an unknown mode, k < 1, batch_size < 1 or no records (and what `sample.generate`,
        `data.build_prompt` and `attention.TagIds.from_tokenizer` raise).

        >>> metrics, samples = evaluate(model, tok, load_data("synthetic:hard:test", limit=4), "unseen", k=8)
        >>> len(samples), metrics["num_problems"], metrics == summarize(samples, k=8)
        (32, 4, True)
    """
    from data import build_prompt
    from rewards import parallel_positions, score_batch
    from sample import generate

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if k < 1 or batch_size < 1:
        raise ValueError(f"k and batch_size must be >= 1, got k={k}, batch_size={batch_size}")
    if not records:
        raise ValueError("evaluate: no records")
    style = prompt_style or ("sequential" if mode == "sequential" else "parallel")
    was_training = model.training
    model.eval()
    samples = []
    try:
        for b, start in enumerate(range(0, len(records), batch_size)):
            batch = records[start:start + batch_size]
            prompts = [build_prompt(tokenizer, r["problem"], style=style, prompt_file=prompt_file) for r in batch]
            prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
            rollouts = generate(model, tokenizer, prompt_ids, group_size=k, mode=mode,
                                max_new_tokens=max_new_tokens, num_paths=num_paths, max_blocks=max_blocks,
                                allow_parallel=mode != "sequential", temperature=temperature, top_p=top_p,
                                seed=seed + b)
            scores = score_batch([r.text for r in rollouts], [batch[r.prompt_index]["answer"] for r in rollouts],
                                 structures=[r.structure for r in rollouts], reward="accuracy", verifier=verifier)
            for j, (r, sc) in enumerate(zip(rollouts, scores)):
                rec = batch[r.prompt_index]
                samples.append({
                    "benchmark": rec.get("source"), "id": rec["id"], "sample_index": j % k,
                    "prompt": prompts[r.prompt_index], "response": r.text,
                    "extracted_answer": sc["pred"], "gold": rec["answer"], "correct": bool(sc["correct"]),
                    "reward": sc["reward"], "has_parallel": sc["has_parallel"], "num_blocks": sc["num_blocks"],
                    "parallel_positions": parallel_positions(r.structure), "format_valid": sc["format_ok"],
                    "format_reason": r.structure.reason, "T": r.num_tokens, "D": r.critical_path,
                    "finish_reason": r.finish_reason})
            if progress is not None:
                progress.update(len(rollouts))
                progress.set_postfix(mean=f"{_mean(s['correct'] for s in samples):.3f}")
    finally:
        model.train(was_training)
    return summarize(samples, k), samples


# ----------------------------------------------------------------------------------------------------
# The table (layout of Table 2, PAPER_NOTES §7.1)

BENCH_LABELS = {"aime24": "AIME24", "aime25": "AIME25", "amc23": "AMC23", "math500": "MATH",
                "gsm8k:test": "GSM8K"}


def average_mean_at_k(benches: dict[str, dict]) -> float | None:
    """Table 2's "Avg": the plain mean of the benchmarks' Mean@ values (not weighted by their sizes)."""
    return _mean(m["mean_at_k"] for m in benches.values())


def format_table(rows: dict[str, dict[str, dict]]) -> str:
    """A Markdown table in the layout of the paper's Table 2, percentages with one decimal.

    rows: {method name: {benchmark: metrics}}, metrics as `summarize` returns (needs "k", "mean_at_k",
    "pass_at_k", "parallel_ratio", "num_responses"). Columns follow the benchmarks in first-seen order;
    a benchmark with k = 1 gets only its Mean@1 column (Pass@1 = Mean@1), like Table 2's MATH.
    "Parallel %" pools every response of the row; "Avg" is the mean of the row's Mean@ columns.
    A benchmark a row lacks shows "-" (and is left out of its Avg).

        >>> print(format_table({"GRPO": {"aime25": {"k": 16, "mean_at_k": 0.148, "pass_at_k": 0.324,
        ...                                          "parallel_ratio": 0.0, "num_responses": 480},
        ...                               "math500": {"k": 1, "mean_at_k": 0.836, "pass_at_k": 0.836,
        ...                                           "parallel_ratio": 0.0, "num_responses": 500}}}))
        | Method | Parallel % | AIME25 Mean@16 | AIME25 Pass@16 | MATH Mean@1 | Avg |
        |---|---|---|---|---|---|
        | GRPO | 0.0 | 14.8 | 32.4 | 83.6 | 49.2 |

    Raises ValueError when two rows evaluated a benchmark with different k.
    """
    ks: dict[str, int] = {}
    for method, benches in rows.items():
        for bench, m in benches.items():
            if ks.setdefault(bench, m["k"]) != m["k"]:
                raise ValueError(f"{method!r} evaluated {bench} with k={m['k']}, another row with k={ks[bench]}")
    header = ["Method", "Parallel %"]
    for bench, k in ks.items():
        label = BENCH_LABELS.get(bench, bench)
        header += [f"{label} Mean@{k}"] + ([f"{label} Pass@{k}"] if k > 1 else [])
    header.append("Avg")
    pct = lambda x: f"{100 * x:.1f}"
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for method, benches in rows.items():
        n = sum(m["num_responses"] for m in benches.values())
        ratio = sum(m["parallel_ratio"] * m["num_responses"] for m in benches.values()) / n if n else None
        cells = [method, pct(ratio) if ratio is not None else "-"]
        for bench, k in ks.items():
            m = benches.get(bench)
            cells += [pct(m["mean_at_k"]) if m else "-"]
            if k > 1:
                cells += [pct(m["pass_at_k"]) if m else "-"]
        avg = average_mean_at_k(benches)
        cells.append(pct(avg) if avg is not None else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------
# What a checkpoint was trained as


def read_checkpoint_config(path: str) -> tuple[dict, str]:
    """The training config saved with a checkpoint folder, and the file it came from.

    Looks for `parallel_r1.json` (a flat JSON dict, or {"config": {...}}), then `trainer_state.pt`
    (its "config" dict, or its top-level "mode"; memory-mapped, so a large optimizer state is not read
    into memory). Returns ({}, "") for a hub name, "tiny", or a folder with neither file.
    """
    if not os.path.isdir(path):
        return {}, ""
    f = os.path.join(path, "parallel_r1.json")
    if os.path.isfile(f):
        with open(f, encoding="utf-8") as fh:
            d = json.load(fh)
        return (d.get("config", d) if isinstance(d, dict) else {}), f
    f = os.path.join(path, "trainer_state.pt")
    if os.path.isfile(f):
        try:
            state = torch.load(f, map_location="cpu", weights_only=False, mmap=True)
        except RuntimeError:                        # an old (non-zip) file cannot be memory-mapped
            state = torch.load(f, map_location="cpu", weights_only=False)
        cfg = dict(state.get("config") or {}) if isinstance(state, dict) else {}
        if isinstance(state, dict) and "mode" in state and "mode" not in cfg:
            cfg["mode"] = state["mode"]
        return cfg, f
    return {}, ""


def mode_from_config(cfg: dict) -> str | None:
    """The sampler mode a saved training config implies: "sequential" for a sequential-style run
    (sft.py's style="sequential" baseline, or mode "sequential"), else its "mode"; None if unknown."""
    if cfg.get("style") == "sequential":
        return "sequential"
    return cfg.get("mode") if cfg.get("mode") in MODES else None


def own_tokenizer(name_or_path: str):
    """The tokenizer a checkpoint or hub model ships with, before `load_model` adds anything (no weights
    are read); None for "tiny". Raises OSError naming the model when it cannot be loaded."""
    if name_or_path == "tiny":
        return None
    from transformers import AutoTokenizer

    from model import check_model_name

    check_model_name(name_or_path, weights=False)
    try:
        return AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as e:
        raise OSError(f"cannot load the tokenizer of --model={name_or_path!r} (a checkpoint folder, a hub name "
                      f"available offline, or tiny): {e}") from None


def check_tags(tokenizer, name: str, mode: str, allow_untrained_tags: bool = False) -> bool:
    """Whether a checkpoint's own tokenizer (`own_tokenizer`) has the six tags; raise where it matters.

    True when all six are there (or `tokenizer` is None: "tiny", a random model for smoke tests).
    Otherwise the model never learned them: raises ValueError in the parallel modes unless
    `allow_untrained_tags` (then prints a warning); in the sequential mode prints a note. Returns False.
    """
    from model import TAGS

    if tokenizer is None:
        return True
    missing = [t for t in TAGS if t not in tokenizer.get_vocab()]
    if not missing:
        return True
    what = (f"{name} has no {', '.join(missing)} in its tokenizer: it was not trained with the parallel "
            "tags, so load_model would add fresh, untrained tag embeddings")
    if mode == "sequential":
        print(f"[eval] note: {what} (fine for the sequential mode)", file=sys.stderr)
    elif allow_untrained_tags:
        print(f"[eval] WARNING: {what}; --allow_untrained_tags=True, evaluating anyway", file=sys.stderr)
    else:
        raise ValueError(f"{what}. Evaluate a checkpoint written by sft.py or grpo.py, use --mode=sequential, "
                         "or pass --allow_untrained_tags=True to sample with untrained tags (e.g. a base model)")
    return False


# ----------------------------------------------------------------------------------------------------
# Training curves (the paper's Figures 3-4)

# Panel title -> the log keys drawn in it (the last "/"-part of a key: "eval/aime25/mean_at_k" -> "mean_at_k").
PANELS = {
    "reward": ("reward_mean", "reward"),
    "accuracy": ("accuracy", "acc", "mean_at_k", "pass_at_k"),
    "parallel ratio": ("parallel_ratio",),
    "relative <Parallel> position": ("parallel_position", "mean_parallel_position"),
}


def _ema(ys: list[float], alpha: float) -> list[float]:
    out, m = [], None
    for y in ys:
        m = y if m is None else alpha * y + (1 - alpha) * m
        out.append(m)
    return out


def plot_curves(run_dir: str, out: str | None = None, smooth: float = 0.1) -> str:
    """Draw reward, accuracy, parallel ratio and relative <Parallel> position against step from a run's
    `log.jsonl` into `run_dir/curves.png` (or `out`). Returns the image path.

    Every line of the log is a JSON dict; "step" is the x axis (the line number when absent). A key is
    drawn in the panel whose names hold its last "/"-part (see `PANELS`): training keys ("accuracy") as a
    faint raw line plus an exponential moving average (weight `smooth` on the newest point), evaluation
    keys ("eval/<bench>/mean_at_k") as markers. Missing keys, None/NaN values and lines that are not
    JSON are skipped; a panel with no data says so.
    Raises FileNotFoundError for a missing log, SystemExit with the install command without matplotlib.
    """
    log = os.path.join(run_dir, "log.jsonl")
    if not os.path.isfile(log):
        raise FileNotFoundError(f"no log.jsonl in {run_dir}: pass the out_dir of a grpo.py or sft.py run")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("plotting needs matplotlib, an optional dependency: "
                         "pip install matplotlib  (or pip install -r requirements-plot.txt)") from None
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
                if key != "step" and isinstance(y, (int, float)) and not isinstance(y, bool) and math.isfinite(y):
                    xs, ys = series.setdefault(key, ([], []))
                    xs.append(x)
                    ys.append(y)
    if not any(k.split("/")[-1] in names for k in series for names in PANELS.values()):
        print(f"[eval] {log} has none of the plotted keys ({', '.join(n for v in PANELS.values() for n in v)}); "
              "curves come from grpo.py runs", file=sys.stderr)
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharex=True)
    for ax, (title, names) in zip(axes.flat, PANELS.items()):
        keys = [k for k in series if k.split("/")[-1] in names]
        for key in sorted(keys, key=lambda k: (k.startswith("eval/"), k)):
            xs, ys = series[key]
            if key.startswith("eval/"):
                ax.plot(xs, ys, marker="o", markersize=3, linewidth=1, label=key)
            else:
                (raw,) = ax.plot(xs, ys, alpha=0.25, linewidth=0.8)
                ax.plot(xs, _ema(ys, smooth), color=raw.get_color(), linewidth=1.6, label=f"{key} (EMA)")
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


# ----------------------------------------------------------------------------------------------------
# Command line


@dataclass
class EvalConfig:
    """Every knob of an evaluation; override with `--key=value`. `None` = the default for the model:

        field           real model (the paper)                 tiny model
        data            aime24,aime25,amc23,math500            synthetic:easy:test,synthetic:hard:test
        k               16                                     8
        max_new_tokens  3000                                   256
        batch_size      4 problems (x k rows per generate)     16
        limit           all problems                           64 per benchmark
    """

    model: str = ""                    # a checkpoint folder, a hub name, or "tiny" (random weights)
    data: str | None = None            # comma list of data.load_data names, each one benchmark
    k: int | None = None               # responses per problem
    k_overrides: str = ""              # per-benchmark k, e.g. "math500=1" (Table 2's MATH Mean@1)
    mode: str = ""                     # "" = the checkpoint's training mode (see the module docstring)
    prompt_style: str = ""             # "" = follows the mode; "parallel" or "sequential"
    prompt_file: str = ""              # a template with {problem}; "" = the checkpoint's, else built-in
    max_new_tokens: int | None = None  # response budget, paths and summaries included
    temperature: float = 1.0
    top_p: float = 1.0
    num_paths: int = 2
    max_blocks: int = 4
    batch_size: int | None = None      # problems per generate call
    limit: int | None = None           # problems per benchmark (0 = all)
    verifier: str = "default"          # "default" (math-aware) or "paper" (the official string match)
    seed: int = 0
    name: str = ""                     # the table's Method cell; "" = from the model path
    out_dir: str = ""                  # "" = runs/eval/<name>
    data_dir: str = ""                 # local benchmark files (see data.py)
    device: str = ""                   # "" = cuda if available else cpu
    allow_untrained_tags: bool = False
    skip_long_prompts: bool = True     # skip problems whose prompt + max_new_tokens exceed the model's context
    plot: str = ""                     # a run folder: draw its log.jsonl to curves.png and exit
    table: str = ""                    # comma list of eval output folders: one table of their rows, and exit


def resolve_defaults(cfg: EvalConfig, tiny: bool) -> EvalConfig:
    """Fill the None fields for a real or the tiny model (table in `EvalConfig`)."""
    d = dict(data="synthetic:easy:test,synthetic:medium:test,synthetic:hard:test", k=8, max_new_tokens=128, batch_size=16, limit=64) \
        if tiny else dict(data="aime24,aime25,amc23,math500", k=16, max_new_tokens=3000, batch_size=4, limit=0)
    return dataclasses.replace(cfg, **{f: v for f, v in d.items() if getattr(cfg, f) is None})


def split_by_context(prompt_lengths: list[int], max_new_tokens: int, context: int | None) -> tuple[list[int], list[int]]:
    """(indices that fit, indices that do not): a prompt fits when prompt + max_new_tokens <= context,
    so no sampled token sits past the model's last trained position. No context (None or 0): all fit.

        >>> split_by_context([100, 256, 257], 256, 512)
        ([0, 1], [2])
    """
    fit = [i for i, n in enumerate(prompt_lengths) if not context or n + max_new_tokens <= context]
    return fit, sorted(set(range(len(prompt_lengths))) - set(fit))


def parse_k_overrides(text: str) -> dict[str, int]:
    """"math500=1,amc23=4" -> {"math500": 1, "amc23": 4}. Raises ValueError on a malformed entry."""
    out = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        bench, eq, k = item.rpartition("=")
        if not eq or not bench or not k.isdigit() or int(k) < 1:
            raise ValueError(f"--k_overrides entry {item!r}: write benchmark=k, e.g. math500=1")
        out[bench] = int(k)
    return out


def run(cfg: EvalConfig) -> dict:
    """Evaluate `cfg.model` on every benchmark of `cfg.data`; write results.md, samples.jsonl and
    summary.json to the output folder; return the summary dict."""
    from tqdm import tqdm

    from data import TINY_VOCAB_LIMIT, build_prompt, load_data
    from model import load_model

    if not cfg.model:
        raise ValueError("--model is required: a checkpoint folder, a hub name, or tiny")
    saved, source = read_checkpoint_config(cfg.model)
    mode = cfg.mode or mode_from_config(saved) or "unseen"
    if mode not in MODES:
        raise ValueError(f"--mode must be one of {MODES}, got {mode!r}")
    why = "--mode" if cfg.mode else (f"from {source}" if mode_from_config(saved) else "default: no saved mode")
    prompt_file = cfg.prompt_file
    if not prompt_file and saved.get("prompt_file"):
        if os.path.isfile(saved["prompt_file"]):
            prompt_file = saved["prompt_file"]
        else:
            print(f"[eval] the checkpoint was trained with prompt file {saved['prompt_file']!r}, which is not "
                  "there; using the built-in prompt (pass --prompt_file)", file=sys.stderr)
    tok = own_tokenizer(cfg.model)                # everything that can fail is checked before the weights load
    cfg = resolve_defaults(cfg, tiny=tok is None or len(tok) < TINY_VOCAB_LIMIT)
    if cfg.limit < 0 or cfg.max_new_tokens < 1 or cfg.k < 1 or cfg.batch_size < 1:
        raise ValueError("--limit must be >= 0 (0 = all problems), --max_new_tokens, --k and --batch_size >= 1")
    overrides = parse_k_overrides(cfg.k_overrides)
    benches = [b.strip() for b in cfg.data.split(",") if b.strip()]
    unknown = set(overrides) - set(benches)
    if unknown:
        raise ValueError(f"--k_overrides names {sorted(unknown)}, which are not in --data={cfg.data}")
    records = {b: load_data(b, limit=cfg.limit or None, data_dir=cfg.data_dir or None) for b in benches}
    check_tags(tok, cfg.model, mode, cfg.allow_untrained_tags)
    model, tokenizer = load_model(cfg.model, device=cfg.device or None)
    name = cfg.name or (os.path.join(*os.path.normpath(cfg.model).split(os.sep)[-2:]) if os.path.isdir(cfg.model)
                        else cfg.model)
    out_dir = cfg.out_dir or os.path.join("runs", "eval", name.replace(os.sep, "_").replace("/", "_"))
    style = cfg.prompt_style or ("sequential" if mode == "sequential" else "parallel")
    print(f"[eval] {name}: mode {mode} ({why}), {style} prompt{f' from {prompt_file}' if prompt_file else ''}, "
          f"T={cfg.temperature}, max_new_tokens {cfg.max_new_tokens}")
    context = getattr(model.config, "max_position_embeddings", None)
    skipped = {}
    for bench, recs in records.items():
        lengths = [len(tokenizer(build_prompt(tokenizer, r["problem"], style, prompt_file or None),
                                 add_special_tokens=False)["input_ids"]) for r in recs]
        fit, over = split_by_context(lengths, cfg.max_new_tokens, context)
        if not over:
            continue
        what = (f"{bench}: {len(over)} of {len(recs)} problems have a prompt + max_new_tokens ({cfg.max_new_tokens}) "
                f"longer than the model's context ({context} tokens; prompts are {min(lengths)}-{max(lengths)} tokens)")
        if not cfg.skip_long_prompts:
            print(f"[eval] warning: {what}; sampling them anyway (--skip_long_prompts=False): "
                  "positions past the context were never trained", file=sys.stderr)
        elif not fit:
            raise ValueError(f"{what}, so none is left to evaluate: lower --max_new_tokens, or pass "
                             "--skip_long_prompts=False to sample past the context")
        else:
            print(f"[eval] {what}: skipped, ids in summary.json (a lower --max_new_tokens keeps more; "
                  "--skip_long_prompts=False samples them past the context)", file=sys.stderr)
            skipped[bench] = [recs[i]["id"] for i in over]
            records[bench] = [recs[i] for i in fit]
    os.makedirs(out_dir, exist_ok=True)
    total = sum(len(r) * overrides.get(b, cfg.k) for b, r in records.items())
    results, timings = {}, {}
    with open(os.path.join(out_dir, "samples.jsonl"), "w", encoding="utf-8") as fh, \
            tqdm(total=total, desc="eval", unit="resp", dynamic_ncols=True) as bar:
        for bench, recs in records.items():
            k = overrides.get(bench, cfg.k)
            bar.set_description(bench)
            t0 = time.time()
            metrics, samples = evaluate(model, tokenizer, recs, mode, k=k, max_new_tokens=cfg.max_new_tokens,
                                        temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed,
                                        batch_size=cfg.batch_size, prompt_style=style,
                                        prompt_file=prompt_file or None, num_paths=cfg.num_paths,
                                        max_blocks=cfg.max_blocks, verifier=cfg.verifier, progress=bar)
            timings[bench] = time.time() - t0
            for s in samples:
                s["benchmark"] = bench
                fh.write(json.dumps(s, ensure_ascii=False) + "\n")
            results[bench] = metrics
            over = sum(s["finish_reason"] == "budget" for s in samples)
            left_out = f", {len(skipped[bench])} too long skipped" if bench in skipped else ""
            bar.write(f"{bench}: Mean@{k} {100 * metrics['mean_at_k']:.1f}  Pass@{k} {100 * metrics['pass_at_k']:.1f}"
                      f"  parallel {100 * metrics['parallel_ratio']:.1f}%  T {metrics['mean_T']:.0f}  "
                      f"D {metrics['mean_D']:.0f}  hit the budget {over}/{len(samples)}  "
                      f"({metrics['num_problems']} problems{left_out}, "
                      f"{timings[bench]:.0f}s)")

    table = format_table({name: results})
    summary = {"model": cfg.model, "name": name, "mode": mode, "mode_source": why, "prompt_style": style,
               "prompt_file": prompt_file or None, "avg_mean_at_k": average_mean_at_k(results),
               "benchmarks": results, "skipped_too_long": skipped, "seconds": timings, "table": table,
               "config": dataclasses.asdict(cfg)}
    with open(os.path.join(out_dir, "results.md"), "w", encoding="utf-8") as fh:
        fh.write(table + "\n")
    with open(os.path.join(out_dir, "summary.json"), "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=2)
    print("\n" + table + "\n")
    print(f"[eval] wrote {out_dir}/results.md, samples.jsonl, summary.json")
    return summary


def main(argv: list[str]) -> None:
    from sft import parse_config

    cfg = parse_config(EvalConfig, argv)
    if cfg.plot:
        print(f"[eval] wrote {plot_curves(cfg.plot)}")
        return
    if cfg.table:
        print(combine_tables(cfg.table.split(","), cfg.out_dir or None))
        return
    run(cfg)


def combine_tables(eval_dirs: list[str], out_dir: str | None = None) -> str:
    """One Table-2 style table with a row per evaluation (each folder holds a `summary.json` of `run`);
    also written to `out_dir/results.md` when given. Raises FileNotFoundError naming a missing summary."""
    rows = {}
    for d in eval_dirs:
        path = os.path.join(d, "summary.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no {path}: run `python eval.py --model=... --out_dir={d}` first")
        with open(path, encoding="utf-8") as fh:
            s = json.load(fh)
        rows[s["name"]] = s["benchmarks"]
    table = format_table(rows)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "results.md"), "w", encoding="utf-8") as fh:
            fh.write(table + "\n")
    return table


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (OSError, ValueError) as e:              # bad input: the message says what to do
        sys.exit(f"eval.py: error: {e}")
