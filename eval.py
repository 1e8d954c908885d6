"""Evaluation: Mean@k, Pass@k and the parallel statistics of the paper's Table 2 (NOTES.md §7).

    python eval.py --model=runs/grpo/checkpoint-45     # a tiny checkpoint: the synthetic test sets
    python eval.py --model=runs/grpo/checkpoint-200 --data=aime24,aime25,amc23,math500 --k=16 \\
        --k_overrides=math500=1

k responses per problem from the sampler in the model's mode (--mode, else the checkpoint's),
scored by `rewards.score_batch`. Per benchmark: Mean@k, the unbiased Pass@k (the official code
reports verl's bootstrap, biased low: summary.json keeps it as pass_at_k_verl), Parallel %, blocks,
the relative <Parallel> position (Figure 3), T and D (the critical path); Avg = the mean of the
Mean@ columns. Written to out_dir: results.md (Table 2's layout), samples.jsonl and summary.json;
scripts/studies/table.py joins evaluations.
"""
import dataclasses
import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Literal

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # idle OpenMP threads sleep (see sft.py)

import torch
import torch.distributed as dist
from tqdm import tqdm
from transformers import AutoTokenizer

import config
import plumbing
from attention import autocast
from data import PromptStyle, build_prompt, load_data, prompt_style_of
from model import (
    TAGS,
    Mode,
    check_model_name,
    config_only,
    hub_reachable,
    load_model,
    mode_from_config,
    read_checkpoint_config,
    resolve_preset,
    unreachable,
)
from plumbing import check_out_dir, locked, move_aside
from rewards import FORMAT_FAILURES, format_failure, parallel_positions, score_batch
from sample import Rollout, SamplingConfig, SamplingFlags, generate

# ---------------------------------------------------------------------------------------------
# The metrics


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k): the chance that k of the n responses, drawn without replacement,
    hold a correct one (computed as 1 - prod (n-c-i)/(n-i), no huge binomials). ValueError unless
    1 <= k <= n and 0 <= c <= n: k responses cannot be drawn from fewer."""
    # >>> exercise 7: unbiased pass@k
    if not (1 <= k <= n and 0 <= c <= n):
        raise ValueError(f"pass@k needs 1 <= k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
    if n - c < k:                       # every k-subset holds a correct response
        return 1.0
    miss = 1.0
    for i in range(k):
        miss *= (n - c - i) / (n - i)
    return 1.0 - miss
    # <<< exercise 7


def pass_at_k_verl(n: int, c: int, k: int) -> float:
    """The expectation of verl's bootstrap best@k (k draws with replacement): 1 - (1 - c/n)^k."""
    return 1.0 - (1.0 - c / n) ** k


def mean(xs) -> float | None:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else None


def summarize(samples: list[dict], k: int) -> dict:
    """The metrics of per-response records (as `evaluate` returns them; a problem is its
    (benchmark, id), with >= k responses). A mean over nothing (e.g. the <Parallel> position
    without blocks) is None."""
    groups: dict[tuple, list[dict]] = {}
    for s in samples:
        groups.setdefault((s.get("benchmark"), s["id"]), []).append(s)
    per_problem = []                             # (responses, correct ones)
    for (_, problem), group in groups.items():
        if len(group) < k:
            raise ValueError(f"problem {problem!r} has {len(group)} samples, fewer than k={k}")
        per_problem.append((len(group), sum(bool(s["correct"]) for s in group)))
    parallel = [s for s in samples if s["has_parallel"]]
    # structure_ok: the paper's structural check, no malformed block (a response without tags
    # passes it); answer_found: a stated final answer; blocks_well_formed: of those with blocks
    return {
        "k": k,
        "num_problems": len(per_problem),
        "num_responses": len(samples),
        "mean_at_k": mean(c / n for n, c in per_problem),
        "pass_at_k": mean(pass_at_k(n, c, k) for n, c in per_problem),
        "pass_at_k_verl": mean(pass_at_k_verl(n, c, k) for n, c in per_problem),
        "parallel_ratio": len(parallel) / len(samples),
        "mean_blocks": mean(s["num_blocks"] for s in samples),
        "mean_parallel_position": mean(p for s in samples for p in s["parallel_positions"]),
        "mean_T": mean(s["T"] for s in samples),
        "mean_D": mean(s["D"] for s in samples),
        "structure_ok": mean(bool(s["structure_ok"]) for s in samples),
        "answer_found": mean(bool(s["answer_found"]) for s in samples),
        "blocks_well_formed": mean(bool(s["structure_ok"]) for s in parallel),
    }


# ---------------------------------------------------------------------------------------------
# Sampling and scoring


def sample_record(record: dict, prompt: str, index: int, rollout, score: dict) -> dict:
    """One line of samples.jsonl: a response, its score and its structure."""
    return {
        "benchmark": record.get("source"), "id": record["id"], "sample_index": index,
        "prompt": prompt, "response": rollout.text, "extracted_answer": score["pred"],
        "gold": record["answer"], "correct": bool(score["correct"]), "reward": score["reward"],
        "has_parallel": score["has_parallel"], "num_blocks": score["num_blocks"],
        "parallel_positions": parallel_positions(rollout.structure),
        "structure_ok": score["format_ok"], "structure_reason": rollout.structure.reason,
        "answer_found": score["answer_found"],
        "T": rollout.num_tokens, "D": rollout.critical_path,
        "finish_reason": rollout.finish_reason,
    }


@torch.no_grad()
def evaluate(model, tokenizer, records: list[dict], mode: str, k: int = 1,
             sampling: SamplingConfig | None = None, batch_size: int = 8,
             prompt_style: str | None = None, prompt_file: str | None = None,
             verifier: str = "default", progress=None, places: list[int] | None = None,
             **settings):
    """(summarize(samples, k), samples): k scored `sample.generate` responses per record, one dict
    each, problem-major. `sampling` (or its fields as keywords, e.g. max_new_tokens=128): batch b
    of `batch_size` problems is sampled with seed + b (seed None: 0); with `places` (each
    record's place in a whole list, e.g. a rank's share's) every batch with the seed, each
    problem's responses seeded by its place (`sample.generate`), so neither batch_size nor the
    share changes them. The mode sets whether <Parallel> may be written. `prompt_style`
    (data.PromptStyle; the tiny preset's is "bare"): None = the mode's instruction; `progress`:
    a tqdm bar. ValueError for k or batch_size < 1, or a place count other than the records'."""
    if k < 1 or batch_size < 1:
        raise ValueError(f"k and batch_size must be >= 1, got k={k}, batch_size={batch_size}")
    if places is not None and len(places) != len(records):
        raise ValueError(f"places: {len(places)} for {len(records)} records; give one a record")
    sampling = dataclasses.replace(sampling or SamplingConfig(), **settings)
    base_seed = sampling.seed if sampling.seed is not None else 0
    if prompt_style is None:
        prompt_style = "sequential" if mode == "sequential" else "parallel"
    was_training = model.training
    model.eval()
    samples = []
    try:
        for b, start in enumerate(range(0, len(records), batch_size)):
            batch = records[start:start + batch_size]
            prompts = [build_prompt(tokenizer, r["problem"], prompt_style, prompt_file)
                       for r in batch]
            ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
            batch_seed = base_seed + b
            batch_places = None
            if places is not None:                   # seeded by place, not by batch
                batch_seed = base_seed
                batch_places = places[start:start + batch_size]
            batch_sampling = dataclasses.replace(sampling, seed=batch_seed,
                                                 allow_parallel=mode != "sequential")
            rollouts = generate(model, tokenizer, ids, group_size=k, mode=mode,
                                sampling=batch_sampling, places=batch_places)
            golds = [batch[r.prompt_index]["answer"] for r in rollouts]
            scores = score_batch([r.text for r in rollouts], golds,
                                 structures=[r.structure for r in rollouts], reward="accuracy",
                                 verifier=verifier)
            for j, (rollout, score) in enumerate(zip(rollouts, scores)):
                i = rollout.prompt_index
                samples.append(sample_record(batch[i], prompts[i], j % k, rollout, score))
            if progress is not None:
                progress.update(len(rollouts))
                progress.set_postfix(mean=f"{mean(s['correct'] for s in samples):.3f}")
    finally:
        model.train(was_training)
    return summarize(samples, k), samples


def quick_eval(model, tokenizer, records: list[dict], mode: str, n: int, *,
               prompt_style: str, prompt_file: str | None = None, max_new_tokens: int = 256,
               seed: int = 0) -> dict:
    """Greedy samples of the first `n` records that fit the model's context (the others are
    counted in the notes): {"n", "structure_ok", "answer_found", "parallel", "accuracy",
    "example" (the first response), "notes"}."""
    out = {"n": 0, "structure_ok": None, "answer_found": None, "parallel": None, "accuracy": None,
           "example": "", "notes": []}
    records = [{**r, "id": i} for i, r in enumerate(records)]
    context = getattr(model.config, "max_position_embeddings", None)
    fit = fit_context(records, tokenizer, prompt_style, prompt_file, max_new_tokens, context,
                      "end-of-run samples", out["notes"].append, required=False)[0][:n]
    if fit:
        metrics, samples = evaluate(model, tokenizer, fit, mode, k=1, seed=seed,
                                    max_new_tokens=max_new_tokens, batch_size=n,
                                    prompt_style=prompt_style, prompt_file=prompt_file,
                                    greedy=True)
        out.update(n=len(samples), structure_ok=metrics["structure_ok"],
                   answer_found=metrics["answer_found"],
                   parallel=metrics["parallel_ratio"], accuracy=metrics["mean_at_k"],
                   example=samples[0]["response"])
    return out


# ---------------------------------------------------------------------------------------------
# During training: GRPO's evaluations of the run and the statistics of a step's rollouts; SFT's
# greedy samples at the end of its run


def prompts_per_call(cfg, world_size: int) -> int:
    """Prompts in one of a rank's generate calls: generate_batch_size (0 = all of the rank's)."""
    per_rank = cfg.batch_size // world_size
    if cfg.generate_batch_size:
        return min(cfg.generate_batch_size, per_rank)
    return per_rank


EVAL_KEYS = ("mean_at_k", "pass_at_k", "structure_ok", "answer_found", "blocks_well_formed",
             "parallel_ratio", "mean_blocks", "mean_parallel_position", "mean_T", "mean_D")


def evaluate_run(run, tag: str) -> dict:
    """GRPO's evaluation of a run (grpo.GRPORun) on its held-out problems: every rank samples
    its shard (eval_k at eval_temperature, a fixed seed; FSDP: on the rollout copy, refreshed
    first); every rank gets each benchmark's (data source's) metrics and their Avg, logged. A
    problem's responses are seeded by its place in the held-out list and the samples are
    gathered in its order, so N ranks get the metrics 1 rank gets (up to float rounding)."""
    cfg = run.cfg
    d = run.dist
    t0 = time.monotonic()
    places = list(range(d.rank, len(run.eval_records), d.world_size))
    mine = [run.eval_records[p] for p in places]
    rows = prompts_per_call(cfg, d.world_size) * cfg.group_size   # as many rows as the rollouts'
    batch_size = max(1, rows // cfg.eval_k)
    if cfg.fsdp:
        plumbing.sync_rollout_model(run.rollout_model, run.train_model)
    samples = []
    if mine:
        sampling = dataclasses.replace(cfg.sampling(seed=cfg.seed),     # as eval.py: no top-k
                                       temperature=cfg.eval_temperature, top_k=0)
        with autocast(d.device):
            samples = evaluate(run.rollout_model, run.tokenizer, mine, cfg.mode, k=cfg.eval_k,
                               sampling=sampling, batch_size=batch_size,
                               prompt_style=run.prompt_style,
                               prompt_file=cfg.prompt_file or None, places=places)[1]
    if dist.is_initialized():             # each rank's samples, problem-major, with their places
        shards = [None] * d.world_size
        placed = [(places[j // cfg.eval_k], s) for j, s in enumerate(samples)]
        dist.all_gather_object(shards, placed)
        in_order = sorted((p for shard in shards for p in shard), key=lambda pair: pair[0])
        samples = [s for _, s in in_order]            # a stable sort: each problem's k in order
    by_bench: dict[str, list] = {}
    for s in samples:
        by_bench.setdefault(s["benchmark"] or "held_out", []).append(s)
    metrics = {}
    for bench, bench_samples in by_bench.items():
        summary = summarize(bench_samples, cfg.eval_k)
        metrics[bench] = {k: summary[k] for k in EVAL_KEYS}
    avg = sum(m["mean_at_k"] for m in metrics.values()) / len(metrics)
    for bench, m in metrics.items():
        values = " ".join(f"{k} {v:.3f}" for k, v in m.items() if v is not None)
        run.log(f"[eval {tag}] {bench}, k={cfg.eval_k}: {values}")
    run.log(f"[eval {tag}] Avg Mean@{cfg.eval_k} {100 * avg:.1f}% ({time.monotonic() - t0:.0f}s)")
    row = {"step": run.step, "eval/avg_mean_at_k": avg}
    for bench, m in metrics.items():
        for k, v in m.items():
            row[f"eval/{bench}/{k}"] = v
    run.write(row)
    return {"avg_mean_at_k": avg, "benchmarks": metrics}


def first_evaluation(run) -> dict | None:
    """The "before" evaluation: a resumed run's first one if its settings are today's, else a
    fresh one."""
    cfg = run.cfg
    before = run.state.get("eval_before")
    settings = [cfg.eval_data, cfg.eval_samples, cfg.eval_k, cfg.eval_temperature,
                cfg.max_new_tokens, cfg.budget]
    if before and before.get("settings", settings) != settings:
        run.log(f"note: the run's first evaluation used other settings {before['settings']} than "
                f"now {settings} (eval_data, eval_samples, eval_k, eval_temperature, "
                "max_new_tokens, budget): the end summary shows no before/after table")
        return {}                                  # falsy: neither re-evaluated nor compared
    if before is None and run.eval_records:
        return {**evaluate_run(run, "before"), "settings": settings}
    return before


MEANS = ("accuracy", "structure_ok", "answer_found", "parallel_ratio", "num_blocks", "response_T",
         "response_D", "truncated")
# GRPO's line every log_every steps (grpo.train), then the format failures by reason (fail/...)
LOG_KEYS = ("reward_mean", "accuracy", "structure_ok", "answer_found", "parallel_ratio",
            "groups_with_variance", "loss", "clip_frac", "entropy", "grad_norm", "time_sample",
            "time_reward", "time_update")


def rollout_stats(rollouts: list[Rollout], scores: list[dict], has_variance: torch.Tensor,
                  device) -> dict:
    """Means over every rank's rollouts, the share of groups whose rewards differ (the only
    ones to learn from), of responses with blocks the well-formed share (None without blocks),
    and per rewards.FORMAT_FAILURES name the share of responses failing by it ("fail/<name>").
    The signal RL sees about the choice to open a block (README, "When RL chooses"):
    `block_accuracy_gap`, the accuracy of the responses with a block minus that of those without
    (None when one kind is absent), and `mixed_groups`, the share of groups that hold both kinds:
    only there can the advantages tell the two apart. Rollouts are prompt-major,
    len(has_variance) groups of equal size."""
    positions = [p for r in rollouts for p in parallel_positions(r.structure)]
    structures = [r.structure for r in rollouts]
    rewards = [s["reward"] for s in scores]
    failures = [format_failure(r.structure, s["answer_found"], r.finish_reason == "budget")
                for r, s in zip(rollouts, scores)]
    with_block = [bool(s.blocks) for s in structures]
    right = [bool(s["correct"]) for s in scores]
    group_size = len(rollouts) // max(len(has_variance), 1)
    kinds = [set(with_block[i:i + group_size]) for i in range(0, len(rollouts), group_size)]
    local = {"n": len(rollouts),
             "reward": sum(rewards),
             "reward_sq": sum(r ** 2 for r in rewards),
             "accuracy": sum(bool(s["correct"]) for s in scores),
             "structure_ok": sum(s.valid for s in structures),
             "answer_found": sum(bool(s["answer_found"]) for s in scores),
             "parallel_ratio": sum(bool(s.blocks) for s in structures),
             "blocks_ok": sum(s.valid and bool(s.blocks) for s in structures),
             "num_blocks": sum(len(s.blocks) for s in structures),
             "response_T": sum(r.num_tokens for r in rollouts),
             "response_D": sum(r.critical_path for r in rollouts),
             "truncated": sum(r.finish_reason == "budget" for r in rollouts),
             "varied_groups": int(has_variance.sum()),
             "groups": len(has_variance),
             "position": sum(positions),
             "blocks_seen": len(positions),
             "with_block": sum(with_block),
             "right_with_block": sum(b and c for b, c in zip(with_block, right)),
             "right_without_block": sum(c and not b for b, c in zip(with_block, right)),
             "mixed_groups": sum(len(k) == 2 for k in kinds)}
    for name in FORMAT_FAILURES:
        local[f"fail/{name}"] = failures.count(name)
    g = dict(zip(local, plumbing.all_reduce(list(local.values()), device)))
    n = max(g["n"], 1.0)
    reward_mean = g["reward"] / n
    stats = {"reward_mean": reward_mean,
             "reward_std": math.sqrt(max(g["reward_sq"] / n - reward_mean ** 2, 0.0))}
    for key in MEANS:
        stats[key] = g[key] / n
    stats["groups_with_variance"] = g["varied_groups"] / max(g["groups"], 1.0)
    stats["parallel_position"] = g["position"] / g["blocks_seen"] if g["blocks_seen"] else None
    stats["blocks_well_formed"] = None
    if g["parallel_ratio"]:
        stats["blocks_well_formed"] = g["blocks_ok"] / g["parallel_ratio"]
    for name in FORMAT_FAILURES:
        stats[f"fail/{name}"] = g[f"fail/{name}"] / n
    without_block = g["n"] - g["with_block"]
    stats["block_accuracy_gap"] = None
    if g["with_block"] and without_block:
        stats["block_accuracy_gap"] = (g["right_with_block"] / g["with_block"]
                                       - g["right_without_block"] / without_block)
    stats["mixed_groups"] = g["mixed_groups"] / max(g["groups"], 1.0)
    return stats


def log_line(step: int, row: dict) -> str:
    """GRPO's printed line: LOG_KEYS, then the format failures that occurred, by reason."""
    line = f"step {step}: " + " ".join(f"{k} {row[k]:.3f}" for k in LOG_KEYS)
    failed = [f"{name} {row[f'fail/{name}']:.3f}" for name in FORMAT_FAILURES
              if row.get(f"fail/{name}")]
    if failed:
        line += " | format failures: " + " ".join(failed)
    return line


def end_of_run_samples(run, examples: list, eval_set) -> dict | None:
    """SFT's greedy samples after training, of eval_set (name, records); `examples` are the
    training examples (data.Example), whose lengths set the budget. Rank 0 only (an FSDP model
    would need every rank)."""
    cfg = run.cfg
    if not (run.dist.is_main and cfg.eval_samples) or run.signal_received:   # stopped: exit now
        return None
    if cfg.fsdp:
        return {"notes": ["FSDP run: no greedy samples here; evaluate the checkpoint with eval.py"]}
    eval_name, eval_records = eval_set
    # the budget: twice the longest training response, within max_length (an untrained model
    # rambles)
    longest_prompt = max(len(e.prompt_ids) for e in examples)
    longest_response = max(len(e.response_ids) for e in examples)
    budget = min(cfg.max_length - longest_prompt, 2 * longest_response)
    mode = "sequential" if cfg.style == "sequential" else cfg.mode
    samples = quick_eval(run.model, run.tokenizer, eval_records, mode, cfg.eval_samples,
                         prompt_style=prompt_style_of(cfg.preset, cfg.style),
                         prompt_file=cfg.prompt_file or None, seed=cfg.seed,
                         max_new_tokens=max(1, budget))
    return dict(samples, data=eval_name)


# ---------------------------------------------------------------------------------------------
# Table 2

BENCH_LABELS = {"aime24": "AIME24", "aime25": "AIME25", "amc23": "AMC23", "math500": "MATH",
                "gsm8k:test": "GSM8K"}


def average_mean_at_k(benches: dict[str, dict]) -> float | None:
    """Table 2's "Avg": the plain mean of the benchmarks' Mean@ values (not weighted by size)."""
    return mean(m["mean_at_k"] for m in benches.values())


def percent(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def format_table(rows: dict[str, dict[str, dict]]) -> str:
    """Table 2's Markdown layout from {method: {benchmark: summarize() metrics}}: Mean@k (and
    Pass@k, k > 1) per benchmark, Parallel % pooled over the row, Avg; "-" where a row lacks a
    benchmark. ValueError: two k for one benchmark."""
    ks: dict[str, int] = {}
    for method, benches in rows.items():
        for bench, m in benches.items():
            if ks.setdefault(bench, m["k"]) != m["k"]:
                raise ValueError(f"{method!r} evaluated {bench} with k={m['k']}, another row with "
                                 f"k={ks[bench]}")
    columns = []
    for bench, k in ks.items():
        for what in (["Mean", "Pass"] if k > 1 else ["Mean"]):
            columns.append((bench, what))
    header = ["Method", "Parallel %"]
    header += [f"{BENCH_LABELS.get(b, b)} {what}@{ks[b]}" for b, what in columns]
    header.append("Avg")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for method, benches in rows.items():
        n = sum(m["num_responses"] for m in benches.values())
        parallel = None
        if n:
            parallel = sum(m["parallel_ratio"] * m["num_responses"] for m in benches.values()) / n
        cells = [percent((benches.get(b) or {}).get(f"{what.lower()}_at_k")) for b, what in columns]
        row = [method, percent(parallel), *cells, percent(average_mean_at_k(benches))]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Checks before anything loads


def own_tokenizer(name_or_path: str):
    """The tokenizer a checkpoint or hub model ships with, before load_model adds the tags (None
    for "tiny" and a folder holding only a config.json); OSError naming the model when it cannot
    be loaded."""
    if name_or_path == "tiny" or config_only(name_or_path):
        return None
    check_model_name(name_or_path)               # a model's folder: a tokenizer's alone says so
    local_only = not os.path.isdir(name_or_path) and not hub_reachable()   # the cache only
    try:
        return AutoTokenizer.from_pretrained(name_or_path, local_files_only=local_only)
    except Exception as e:
        if local_only:
            raise unreachable(name_or_path, "--model") from None
        where = "a checkpoint folder, a hub name available offline, or tiny"
        if os.path.isdir(name_or_path):
            where = "its tokenizer.json or tokenizer_config.json may be damaged"
        raise OSError(f"cannot load the tokenizer of --model={name_or_path!r} ({where}): "
                      f"{type(e).__name__}: {e}") from None


def check_tags(tokenizer, name: str, mode: str, allow_untrained_tags: bool = False) -> bool:
    """Whether the checkpoint's own tokenizer has the six tags (None: yes). If not: ValueError in
    the parallel modes unless allow_untrained_tags (then a warning), a note in sequential."""
    if tokenizer is None:
        return True
    missing = [t for t in TAGS if t not in tokenizer.get_vocab()]
    if not missing:
        return True
    what = (f"{name} has no {', '.join(missing)} in its tokenizer: it was not trained with the "
            "parallel tags, so load_model would add fresh, untrained tag embeddings")
    if mode == "sequential":
        print(f"[eval] note: {what} (fine for the sequential mode)", file=sys.stderr)
    elif allow_untrained_tags:
        print(f"[eval] WARNING: {what}; --allow_untrained_tags=True, evaluating anyway",
              file=sys.stderr)
    else:
        raise ValueError(f"{what}. Evaluate a checkpoint written by sft.py or grpo.py, use "
                         "--mode=sequential, or pass --allow_untrained_tags=True to sample with "
                         "untrained tags (e.g. a base model)")
    return False


def split_by_context(prompt_lengths: list[int], max_new_tokens: int,
                     context: int | None) -> tuple[list, list]:
    """(indices that fit, indices that do not): prompt + max_new_tokens <= context (None or 0:
    all fit)."""
    fit = [i for i, n in enumerate(prompt_lengths) if not context or n + max_new_tokens <= context]
    return fit, sorted(set(range(len(prompt_lengths))) - set(fit))


def fit_context(records: list[dict], tokenizer, style: str, prompt_file: str | None,
                max_new_tokens: int, context, name: str, log, required: bool = True,
                keep_long: bool = False, hint: str = "") -> tuple[list, ...]:
    """(records, their prompt ids, the ids left out): without the problems whose prompt +
    max_new_tokens exceed the model's context (positions it never trained), reported through
    `log`; `keep_long` keeps them with a warning. None fitting is a ValueError (ending with
    `hint`) when `required`."""
    prompts = [tokenizer(build_prompt(tokenizer, r["problem"], style, prompt_file),
                         add_special_tokens=False)["input_ids"] for r in records]
    fit, over = split_by_context([len(p) for p in prompts], max_new_tokens, context)
    if over and keep_long:
        log(f"warning: {name}: {len(over)} of {len(records)} problems exceed the model's context "
            f"({context} tokens) with max_new_tokens; sampling them anyway "
            "(--skip_long_prompts=False): those positions were never trained")
    if not over or keep_long:
        return records, prompts, []
    lengths = f"{min(map(len, prompts))}-{max(map(len, prompts))}"
    what = (f"{name}: {len(over)} of {len(records)} problems have a prompt + max_new_tokens "
            f"({max_new_tokens}) longer than the model's context ({context} tokens; prompts are "
            f"{lengths} tokens)")
    if required and not fit:
        raise ValueError(f"{what}, so none is left: lower --max_new_tokens{hint}")
    log(f"{what}: skipped")
    return ([records[i] for i in fit], [prompts[i] for i in fit],
            [records[i].get("id", i) for i in over])


def parse_k_overrides(text: str) -> dict[str, int]:
    """"math500=1,amc23=4" -> {"math500": 1, "amc23": 4}. ValueError on a malformed entry."""
    overrides = {}
    for item in text.split(","):
        bench, eq, k = item.strip().rpartition("=")
        if not item.strip():
            continue
        if not (eq and bench and k.isdigit() and int(k) >= 1):
            raise ValueError(f"--k_overrides entry {bench + eq + k!r}: write benchmark=k, e.g. "
                             "math500=1")
        overrides[bench] = int(k)
    return overrides


def check_device(device: str) -> None:
    """ValueError for a --device this machine does not have, or one that is no device."""
    if device not in ("", "cpu") and not re.fullmatch(r"cuda(:\d+)?|mps", device):
        raise ValueError(f"--device={device}: write cpu, cuda, cuda:<index> or mps (or leave it "
                         "empty)")
    if device == "mps" and not torch.backends.mps.is_available():
        raise ValueError("--device=mps: this machine has no MPS device; leave --device empty or "
                         "pass --device=cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device={device}: this machine has no CUDA device; leave --device "
                         "empty (cuda if available, else cpu) or pass --device=cpu")


# ---------------------------------------------------------------------------------------------
# python eval.py


@dataclass
class EvalConfig(SamplingFlags):
    """python eval.py --model=<checkpoint>: Mean@k, Pass@k, parallel statistics; the sampling
    flags are sample.SamplingFlags'. None = the preset's (config.EVAL_PRESETS)."""
    model: str = ""                    # a checkpoint folder, a hub name, or "tiny" (random weights)
    preset: config.Preset = "auto"     # tiny, paper, none; auto: the checkpoint's run's, else paper
    data: str | None = None            # comma list of data.load_data names, each one benchmark
    k: config.PositiveInt | None = None   # responses per problem
    k_overrides: str = ""              # per-benchmark k, e.g. "math500=1" (Table 2's MATH Mean@1)
    mode: Mode | None = None           # None = the checkpoint's training mode, else unseen
    prompt_style: PromptStyle | None = None   # None = the preset's (tiny: bare), else the mode's
    prompt_file: str = ""              # a template with {problem}; "" = the checkpoint's, else ours
    batch_size: config.PositiveInt | None = None   # problems per generate call (x k rows)
    limit: config.NonNegativeInt | None = None     # problems per benchmark (0 = all)
    verifier: Literal["default", "paper"] = "default"   # math-aware, or the official string match
    seed: config.Seed = 0
    name: str = ""                     # the table's Method cell; "" = from the model path
    out_dir: str = ""                  # "" = runs/eval/<--name, else the model path, / as _>
    data_dir: str = ""                 # local benchmark files (see data.py)
    device: str = ""                   # "" = cuda if available else cpu
    allow_untrained_tags: bool = False  # sample a checkpoint whose tokenizer lacks the tags
    skip_long_prompts: bool = True     # skip a prompt that + max_new_tokens passes the context




def log(message: str) -> None:
    print(f"[eval] {message}", file=sys.stderr)


def resolve(cfg: EvalConfig) -> tuple[EvalConfig, dict]:
    """The config with its preset, after every check that needs no weights; and what the run
    needs besides: the mode (and where it came from), the prompt file, k per benchmark."""
    config.check(cfg)
    if not cfg.model:
        raise ValueError("--model is required: a checkpoint folder, a hub name, or tiny")
    saved, source = read_checkpoint_config(cfg.model)
    saved_mode = mode_from_config(saved)
    mode = cfg.mode or saved_mode or "unseen"
    if cfg.mode:
        mode_source = "--mode"
    elif saved_mode:
        mode_source = f"from {source}"
    else:
        mode_source = "default: no saved mode"
    saved_prompt = saved.get("prompt_file") or ""
    prompt_file = cfg.prompt_file or (saved_prompt if os.path.isfile(saved_prompt) else None)
    if not prompt_file and saved_prompt:
        log(f"the checkpoint's prompt file {saved_prompt!r} is not there: using the built-in "
            "prompt (or --prompt_file)")
    tokenizer = own_tokenizer(cfg.model)
    preset, why = resolve_preset(cfg.preset, cfg.model)
    log(f"preset {preset} ({why})")
    cfg = config.apply_preset(dataclasses.replace(cfg, preset=preset), config.EVAL_PRESETS)
    benches = [b.strip() for b in cfg.data.split(",") if b.strip()]
    if not benches:
        raise ValueError(f"--data={cfg.data!r} names no benchmark: e.g. "
                         "--data=synthetic:hard:test or aime25,math500")
    overrides = parse_k_overrides(cfg.k_overrides)
    unknown = sorted(set(overrides) - set(benches))
    if unknown:
        raise ValueError(f"--k_overrides names {unknown}, not in --data={cfg.data}")
    check_device(cfg.device)
    check_tags(tokenizer, cfg.model, mode, cfg.allow_untrained_tags)
    ks = {b: overrides.get(b, cfg.k) for b in benches}
    return cfg, {"mode": mode, "mode_source": mode_source, "prompt_file": prompt_file, "ks": ks}


def default_out_dir(cfg: EvalConfig) -> str:
    """runs/eval/<--name or the model's whole path with _ for />: two runs' checkpoint-400 do
    not collide."""
    key = cfg.name or os.path.normpath(cfg.model)
    return os.path.join("runs", "eval", key.replace(os.sep, "_").replace("/", "_").strip("._"))


def display_name(cfg: EvalConfig) -> str:
    """The table's Method cell: --name, else a folder's last two parts, else the model name."""
    if cfg.name:
        return cfg.name
    if os.path.isdir(cfg.model):
        return os.path.join(*os.path.normpath(cfg.model).split(os.sep)[-2:])
    return cfg.model


def write_outputs(out_dir: str, partial: str, summary: dict) -> None:
    """Move an earlier evaluation in out_dir aside, then put samples.jsonl, results.md and
    summary.json in place."""
    earlier = []
    for name in ("samples.jsonl", "results.md", "summary.json"):
        path = os.path.join(out_dir, name)
        if os.path.isfile(path):
            earlier.append(path)
    if earlier:
        log(f"moved the earlier evaluation in {out_dir} to {move_aside(out_dir, earlier)}")
    os.replace(partial, os.path.join(out_dir, "samples.jsonl"))
    with open(os.path.join(out_dir, "results.md"), "w", encoding="utf-8") as fh:
        fh.write(summary["table"] + "\n")
    with open(os.path.join(out_dir, "summary.json"), "w", encoding="utf-8") as fh:
        fh.write(json.dumps(summary, indent=2))


def fitting_records(cfg: EvalConfig, benches: list[str], tokenizer, model, style: str,
                    prompt_file: str | None) -> tuple[dict, dict]:
    """({benchmark: its problems that fit the model's context}, {benchmark: ids left out})."""
    context = getattr(model.config, "max_position_embeddings", None)
    records = {}
    skipped = {}
    for bench in benches:
        loaded = load_data(bench, limit=cfg.limit or None, data_dir=cfg.data_dir or None)
        records[bench], _, over = fit_context(
            loaded, tokenizer, style, prompt_file, cfg.max_new_tokens, context, bench, log,
            keep_long=not cfg.skip_long_prompts,
            hint=", or pass --skip_long_prompts=False to sample past the context")
        if over:
            skipped[bench] = over
    return records, skipped


def run(cfg: EvalConfig) -> dict:
    """Evaluate cfg.model on every benchmark of cfg.data; write results.md, samples.jsonl and
    summary.json to out_dir (locked meanwhile: not a folder a live training run writes)."""
    cfg, resolved = resolve(cfg)
    mode = resolved["mode"]
    prompt_file = resolved["prompt_file"]
    ks = resolved["ks"]
    name = display_name(cfg)
    out_dir = cfg.out_dir or default_out_dir(cfg)
    check_out_dir(out_dir)
    mode_style = "sequential" if mode == "sequential" else "parallel"
    style = cfg.prompt_style or prompt_style_of(cfg.preset, mode_style)
    model, tokenizer = load_model(cfg.model, device=cfg.device or None)
    prompt_note = f" from {prompt_file}" if prompt_file else ""
    print(f"[eval] {name}: mode {mode} ({resolved['mode_source']}), {style} prompt{prompt_note}, "
          f"T={cfg.temperature}, max_new_tokens {cfg.max_new_tokens} ({cfg.budget})")
    records, skipped = fitting_records(cfg, list(ks), tokenizer, model, style, prompt_file)
    sampling = cfg.sampling_config(seed=cfg.seed)
    os.makedirs(out_dir, exist_ok=True)
    results = {}
    timings = {}
    partial = os.path.join(out_dir, "samples.jsonl.partial")   # a failed run keeps the old file
    with locked(out_dir):
        with open(partial, "w", encoding="utf-8") as fh:
            for bench, recs in records.items():
                k = ks[bench]
                t0 = time.monotonic()
                with tqdm(total=len(recs) * k, desc=bench, unit="resp") as bar:
                    m, samples = evaluate(model, tokenizer, recs, mode, k=k, sampling=sampling,
                                          batch_size=cfg.batch_size, prompt_style=style,
                                          prompt_file=prompt_file, verifier=cfg.verifier,
                                          progress=bar)
                timings[bench] = time.monotonic() - t0
                results[bench] = m
                lines = [json.dumps(dict(s, benchmark=bench), ensure_ascii=False) for s in samples]
                fh.writelines(line + "\n" for line in lines)
                log(f"{bench}: Mean@{k} {100 * m['mean_at_k']:.1f}  Pass@{k} "
                    f"{100 * m['pass_at_k']:.1f}  parallel {100 * m['parallel_ratio']:.1f}%  "
                    f"a final answer {100 * m['answer_found']:.1f}%  no malformed block "
                    f"{100 * m['structure_ok']:.1f}%  "
                    f"T {m['mean_T']:.0f}  D {m['mean_D']:.0f}  ({m['num_problems']} problems, "
                    f"{timings[bench]:.0f}s)")
        table = format_table({name: results})
        summary = {"model": cfg.model, "name": name, "mode": mode,
                   "mode_source": resolved["mode_source"], "prompt_style": style,
                   "prompt_file": prompt_file, "avg_mean_at_k": average_mean_at_k(results),
                   "benchmarks": results, "skipped_too_long": skipped, "seconds": timings,
                   "table": table, "config": dataclasses.asdict(cfg)}
        write_outputs(out_dir, partial, summary)
    print(f"\n{table}\n\n[eval] wrote {out_dir}/results.md, samples.jsonl, summary.json")
    return summary


if __name__ == "__main__":
    try:
        run(config.parse(EvalConfig, sys.argv[1:]))
    except (OSError, ValueError) as e:              # bad input: the message says what to do
        sys.exit(f"eval.py: error: {e}")
