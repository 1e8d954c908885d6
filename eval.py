"""Evaluation: Mean@k, Pass@k and the parallel statistics of the paper's Table 2 (NOTES.md §7).

    python eval.py --model=runs/grpo/checkpoint-45              # tiny checkpoint: the synthetic test sets, k = 8
    python eval.py --model=runs/grpo/checkpoint-200 --data=aime24,aime25,amc23,math500 --k=16 --k_overrides=math500=1

k responses per problem from the sampler in the model's mode (--mode, else the checkpoint's), scored by
`rewards.score_batch`. Per benchmark: Mean@k, the unbiased Pass@k (the official code reports verl's bootstrap,
biased low: summary.json keeps it as pass_at_k_verl), Parallel %, blocks, the relative <Parallel> position
(Figure 3), T and D (critical path); Avg = the mean of the Mean@ columns. Written to out_dir: results.md (Table 2's
layout), samples.jsonl and summary.json; scripts/table.py joins evaluations.
"""
import dataclasses
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Literal

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # idle OpenMP threads sleep (spinning slowed a shared CPU)

import torch
from tqdm import tqdm
from transformers import AutoTokenizer

import config
from data import TINY_VOCAB_LIMIT, Style, build_prompt, load_data
from model import TAGS, Mode, check_model_name, load_model, mode_from_config, move_aside, read_checkpoint_config
from rewards import parallel_positions, score_batch
from sample import check_sampling, generate

def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k): the chance that k of the n responses, drawn without replacement, hold a correct one
    (as 1 - prod (n-c-i)/(n-i), no huge binomials)."""
    # >>> exercise 7: unbiased pass@k
    if n - c < k:                                   # every k-subset holds a correct sample
        return 1.0
    miss = 1.0
    for i in range(k):
        miss *= (n - c - i) / (n - i)
    return 1.0 - miss
    # <<< exercise 7

def pass_at_k_verl(n: int, c: int, k: int) -> float:
    """The expectation of verl's bootstrap best@k (k draws with replacement): 1 - (1 - c/n)^k."""
    return 1.0 - (1.0 - c / n) ** k

def _mean(xs) -> float | None:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else None

def summarize(samples: list[dict], k: int) -> dict:
    """The metrics of per-response records (as `evaluate` returns; a problem is its (benchmark, id), with >= k
    responses). A mean over nothing (e.g. the <Parallel> position without blocks) is None."""
    groups: dict[tuple, list[dict]] = {}
    for s in samples:
        groups.setdefault((s.get("benchmark"), s["id"]), []).append(s)
    per_problem = [(len(group), sum(bool(s["correct"]) for s in group)) for group in groups.values()]
    for (_, problem), (n, _) in zip(groups, per_problem):
        if n < k:
            raise ValueError(f"problem {problem!r} has {n} samples, fewer than k={k}")
    parallel = [s for s in samples if s["has_parallel"]]
    return {"k": k, "num_problems": len(per_problem), "num_responses": len(samples),
            "mean_at_k": _mean(c / n for n, c in per_problem),
            "pass_at_k": _mean(pass_at_k(n, c, k) for n, c in per_problem),
            "pass_at_k_verl": _mean(pass_at_k_verl(n, c, k) for n, c in per_problem),
            "parallel_ratio": len(parallel) / len(samples), "mean_blocks": _mean(s["num_blocks"] for s in samples),
            "mean_parallel_position": _mean(p for s in samples for p in s["parallel_positions"]),
            "mean_T": _mean(s["T"] for s in samples), "mean_D": _mean(s["D"] for s in samples),
            "format_valid": _mean(bool(s["format_valid"]) for s in samples),
            "format_valid_parallel": _mean(bool(s["format_valid"]) for s in parallel)}

@torch.no_grad()
def evaluate(model, tokenizer, records: list[dict], mode: str, k: int = 1, max_new_tokens: int = 256,
             temperature: float = 1.0, top_p: float = 1.0, seed: int = 0, batch_size: int = 8,
             prompt_style: str | None = None, prompt_file: str | None = None, num_paths: int = 2,
             max_blocks: int = 4, verifier: str = "default", progress=None, greedy: bool = False):
    """(summarize(samples, k), samples): k scored `sample.generate` responses per record, one dict each, problem-major
    (batch b of `batch_size` problems: seed + b; prompt style: the mode's unless given; `progress`: a tqdm bar)."""
    if k < 1 or batch_size < 1:
        raise ValueError(f"k and batch_size must be >= 1, got k={k}, batch_size={batch_size}")
    style = prompt_style or ("sequential" if mode == "sequential" else "parallel")
    was_training, samples = model.training, []
    model.eval()
    try:
        for b, start in enumerate(range(0, len(records), batch_size)):
            batch = records[start:start + batch_size]
            prompts = [build_prompt(tokenizer, r["problem"], style=style, prompt_file=prompt_file) for r in batch]
            ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
            rollouts = generate(model, tokenizer, ids, group_size=k, mode=mode, max_new_tokens=max_new_tokens,
                                num_paths=num_paths, max_blocks=max_blocks, allow_parallel=mode != "sequential",
                                temperature=temperature, top_p=top_p, greedy=greedy, seed=seed + b)
            scores = score_batch([r.text for r in rollouts], [batch[r.prompt_index]["answer"] for r in rollouts],
                                 structures=[r.structure for r in rollouts], reward="accuracy", verifier=verifier)
            for j, (r, sc) in enumerate(zip(rollouts, scores)):
                rec = batch[r.prompt_index]
                samples.append({
                    "benchmark": rec.get("source"), "id": rec["id"], "sample_index": j % k,
                    "prompt": prompts[r.prompt_index], "response": r.text, "extracted_answer": sc["pred"],
                    "gold": rec["answer"], "correct": bool(sc["correct"]), "reward": sc["reward"],
                    "has_parallel": sc["has_parallel"], "num_blocks": sc["num_blocks"],
                    "parallel_positions": parallel_positions(r.structure), "format_valid": sc["format_ok"],
                    "format_reason": r.structure.reason, "T": r.num_tokens, "D": r.critical_path,
                    "finish_reason": r.finish_reason})
            if progress is not None:
                progress.update(len(rollouts))
                progress.set_postfix(mean=f"{_mean(s['correct'] for s in samples):.3f}")
    finally:
        model.train(was_training)
    return summarize(samples, k), samples

BENCH_LABELS = {"aime24": "AIME24", "aime25": "AIME25", "amc23": "AMC23", "math500": "MATH", "gsm8k:test": "GSM8K"}

def average_mean_at_k(benches: dict[str, dict]) -> float | None:
    """Table 2's "Avg": the plain mean of the benchmarks' Mean@ values (not weighted by their sizes)."""
    return _mean(m["mean_at_k"] for m in benches.values())

def format_table(rows: dict[str, dict[str, dict]]) -> str:
    """Table 2's Markdown layout from {method: {benchmark: summarize() metrics}}: Mean@k (and Pass@k, k > 1) per
    benchmark, Parallel % pooled over the row, Avg; "-" where a row lacks a benchmark; ValueError: two k of one."""
    ks: dict[str, int] = {}
    for method, benches in rows.items():
        for bench, m in benches.items():
            if ks.setdefault(bench, m["k"]) != m["k"]:
                raise ValueError(f"{method!r} evaluated {bench} with k={m['k']}, another row with k={ks[bench]}")
    columns = [(bench, what) for bench, k in ks.items() for what in (["Mean", "Pass"] if k > 1 else ["Mean"])]
    header = ["Method", "Parallel %"] + [f"{BENCH_LABELS.get(b, b)} {what}@{ks[b]}" for b, what in columns] + ["Avg"]
    pct = lambda x: "-" if x is None else f"{100 * x:.1f}"   # noqa: E731
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for method, benches in rows.items():
        n = sum(m["num_responses"] for m in benches.values())
        parallel = sum(m["parallel_ratio"] * m["num_responses"] for m in benches.values()) / n if n else None
        cells = [pct((benches.get(b) or {}).get(f"{what.lower()}_at_k")) for b, what in columns]
        lines.append("| " + " | ".join([method, pct(parallel), *cells, pct(average_mean_at_k(benches))]) + " |")
    return "\n".join(lines)

def own_tokenizer(name_or_path: str):
    """The tokenizer a checkpoint or hub model ships with, before load_model adds the tags (None for "tiny"); OSError
    naming the model when it cannot be loaded."""
    if name_or_path == "tiny":
        return None
    check_model_name(name_or_path, weights=False)
    try:
        return AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as e:
        raise OSError(f"cannot load the tokenizer of --model={name_or_path!r} (a checkpoint folder, a hub name "
                      f"available offline, or tiny): {e}") from None

def check_tags(tokenizer, name: str, mode: str, allow_untrained_tags: bool = False) -> bool:
    """Whether the checkpoint's own tokenizer has the six tags (None: yes). If not: ValueError in the parallel
    modes unless allow_untrained_tags (a warning then), a note in sequential."""
    missing = [t for t in TAGS if tokenizer is not None and t not in tokenizer.get_vocab()]
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

def split_by_context(prompt_lengths: list[int], max_new_tokens: int, context: int | None) -> tuple[list, list]:
    """(indices that fit, indices that do not): prompt + max_new_tokens <= context (None or 0: all fit)."""
    fit = [i for i, n in enumerate(prompt_lengths) if not context or n + max_new_tokens <= context]
    return fit, sorted(set(range(len(prompt_lengths))) - set(fit))

def fit_context(records: list[dict], tokenizer, style: str, prompt_file: str | None, max_new_tokens: int, context,
                name: str, log, required: bool = True, keep_long: bool = False, hint: str = "") -> tuple[list, ...]:
    """(records, their prompt ids, the ids left out): without the problems whose prompt + max_new_tokens exceed
    the model's context (positions it never trained), reported through `log`; `keep_long` keeps them with a
    warning. None fitting is a ValueError (ending with `hint`) when `required`."""
    prompts = [tokenizer(build_prompt(tokenizer, r["problem"], style, prompt_file),
                         add_special_tokens=False)["input_ids"] for r in records]
    fit, over = split_by_context([len(p) for p in prompts], max_new_tokens, context)
    if over and keep_long:
        log(f"warning: {name}: {len(over)} of {len(records)} problems exceed the model's context ({context} tokens) "
            "with max_new_tokens; sampling them anyway (--skip_long_prompts=False): those positions were never trained")
    if not over or keep_long:
        return records, prompts, []
    what = (f"{name}: {len(over)} of {len(records)} problems have a prompt + max_new_tokens ({max_new_tokens}) longer "
            f"than the model's context ({context} tokens; prompts are {min(map(len, prompts))}-"
            f"{max(map(len, prompts))} tokens)")
    if required and not fit:
        raise ValueError(f"{what}, so none is left: lower --max_new_tokens{hint}")
    log(f"{what}: skipped")
    return [records[i] for i in fit], [prompts[i] for i in fit], [records[i].get("id", i) for i in over]

def parse_k_overrides(text: str) -> dict[str, int]:
    """"math500=1,amc23=4" -> {"math500": 1, "amc23": 4}. Raises ValueError on a malformed entry."""
    items = [item.strip().rpartition("=") for item in text.split(",") if item.strip()]
    for bench, eq, k in items:
        if not (eq and bench and k.isdigit() and int(k) >= 1):
            raise ValueError(f"--k_overrides entry {bench + eq + k!r}: write benchmark=k, e.g. math500=1")
    return {bench: int(k) for bench, _, k in items}

@dataclass
class EvalConfig:
    """python eval.py --model=<checkpoint>: Mean@k, Pass@k, parallel statistics. None = the preset (TINY, PAPER)."""
    model: str = ""                    # a checkpoint folder, a hub name, or "tiny" (random weights)
    data: str | None = None            # comma list of data.load_data names, each one benchmark
    k: int | None = None               # responses per problem
    k_overrides: str = ""              # per-benchmark k, e.g. "math500=1" (Table 2's MATH Mean@1)
    mode: Mode | None = None           # None = the checkpoint's training mode, else unseen
    prompt_style: Style | None = None  # None = follows the mode
    prompt_file: str = ""              # a template with {problem}; "" = the checkpoint's (if it exists), else built-in
    max_new_tokens: int | None = None  # response budget, paths and summaries included
    temperature: float = 1.0
    top_p: float = 1.0
    num_paths: int = 2
    max_blocks: int = 4
    batch_size: int | None = None      # problems per generate call (x k rows)
    limit: int | None = None           # problems per benchmark (0 = all)
    verifier: Literal["default", "paper"] = "default"   # math-aware, or the official string match
    seed: int = 0
    name: str = ""                     # the table's Method cell; "" = from the model path
    out_dir: str = ""                  # "" = runs/eval/<--name, else the model path with _ for />
    data_dir: str = ""                 # local benchmark files (see data.py)
    device: str = ""                   # "" = cuda if available else cpu
    allow_untrained_tags: bool = False  # sample a checkpoint whose tokenizer lacks the tags (untrained embeddings)
    skip_long_prompts: bool = True     # skip problems whose prompt + max_new_tokens exceed the model's context

TINY = dict(data="synthetic:easy:test,synthetic:medium:test,synthetic:hard:test", k=8, max_new_tokens=128,
            batch_size=16, limit=64)
PAPER = dict(data="aime24,aime25,amc23,math500", k=16, max_new_tokens=3000, batch_size=4, limit=0)   # NOTES.md §7

def run(cfg: EvalConfig) -> dict:
    """Evaluate cfg.model on every benchmark of cfg.data; write results.md, samples.jsonl and summary.json."""
    if not cfg.model:
        raise ValueError("--model is required: a checkpoint folder, a hub name, or tiny")
    log = lambda m: print(f"[eval] {m}", file=sys.stderr)   # noqa: E731
    saved, source = read_checkpoint_config(cfg.model)
    mode = cfg.mode or mode_from_config(saved) or "unseen"
    why = "--mode" if cfg.mode else (f"from {source}" if mode_from_config(saved) else "default: no saved mode")
    saved_prompt = saved.get("prompt_file") or ""
    prompt_file = cfg.prompt_file or (saved_prompt if os.path.isfile(saved_prompt) else None)
    if not prompt_file and saved_prompt:
        log(f"the checkpoint's prompt file {saved_prompt!r} is not there: using the built-in prompt (or --prompt_file)")
    tok = own_tokenizer(cfg.model)                # everything that can fail is checked before the weights load
    cfg = config.fill(cfg, TINY if tok is None or len(tok) < TINY_VOCAB_LIMIT else PAPER)
    overrides, benches = parse_k_overrides(cfg.k_overrides), [b.strip() for b in cfg.data.split(",") if b.strip()]
    if set(overrides) - set(benches):
        raise ValueError(f"--k_overrides names {sorted(set(overrides) - set(benches))}, not in --data={cfg.data}")
    check_sampling(num_paths=cfg.num_paths, max_blocks=cfg.max_blocks, temperature=cfg.temperature, top_p=cfg.top_p)
    if not benches:
        raise ValueError(f"--data={cfg.data!r} names no benchmark: e.g. --data=synthetic:hard:test or aime25,math500")
    config.at_least(cfg, 0, "limit")                # 0 = every problem
    config.at_least(cfg, 1, "k", "batch_size", "max_new_tokens")
    if cfg.device not in ("", "cpu") and not re.fullmatch(r"cuda(:\d+)?|mps", cfg.device):
        raise ValueError(f"--device={cfg.device}: write cpu, cuda, cuda:<index> or mps (or leave it empty)")
    if cfg.device == "mps" and not torch.backends.mps.is_available():
        raise ValueError("--device=mps: this machine has no MPS device; leave --device empty or pass --device=cpu")
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device={cfg.device}: this machine has no CUDA device; leave --device empty (cuda if "
                         "available, else cpu) or pass --device=cpu")
    records = {b: load_data(b, limit=cfg.limit or None, data_dir=cfg.data_dir or None) for b in benches}
    check_tags(tok, cfg.model, mode, cfg.allow_untrained_tags)
    model, tokenizer = load_model(cfg.model, device=cfg.device or None)
    name = cfg.name or (os.path.join(*os.path.normpath(cfg.model).split(os.sep)[-2:]) if os.path.isdir(cfg.model)
                        else cfg.model)
    key = cfg.name or os.path.normpath(cfg.model)    # the whole path: two runs' checkpoint-400 do not collide
    out_dir = cfg.out_dir or os.path.join("runs", "eval", key.replace(os.sep, "_").replace("/", "_").strip("._"))
    style = cfg.prompt_style or ("sequential" if mode == "sequential" else "parallel")
    print(f"[eval] {name}: mode {mode} ({why}), {style} prompt{f' from {prompt_file}' if prompt_file else ''}, "
          f"T={cfg.temperature}, max_new_tokens {cfg.max_new_tokens}")
    skipped = {}
    for b, recs in records.items():
        records[b], _, over = fit_context(recs, tokenizer, style, prompt_file, cfg.max_new_tokens,
                                          getattr(model.config, "max_position_embeddings", None), b, log,
                                          keep_long=not cfg.skip_long_prompts,
                                          hint=", or pass --skip_long_prompts=False to sample past the context")
        skipped.update({b: over} if over else {})
    os.makedirs(out_dir, exist_ok=True)
    results, timings = {}, {}
    partial = os.path.join(out_dir, "samples.jsonl.partial")   # renamed at the end: a failed run keeps the old file
    with open(partial, "w", encoding="utf-8") as fh, \
            tqdm(total=sum(len(r) * overrides.get(b, cfg.k) for b, r in records.items()), desc="eval", unit="resp",
                 dynamic_ncols=True) as bar:
        for bench, recs in records.items():
            k, t0 = overrides.get(bench, cfg.k), time.time()
            bar.set_description(bench)
            m, samples = evaluate(model, tokenizer, recs, mode, k=k, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed,
                                  temperature=cfg.temperature, top_p=cfg.top_p, batch_size=cfg.batch_size,
                                  prompt_style=style, prompt_file=prompt_file, num_paths=cfg.num_paths,
                                  max_blocks=cfg.max_blocks, verifier=cfg.verifier, progress=bar)
            timings[bench], results[bench] = time.time() - t0, m
            fh.writelines(json.dumps(dict(s, benchmark=bench), ensure_ascii=False) + "\n" for s in samples)
            bar.write(f"{bench}: Mean@{k} {100 * m['mean_at_k']:.1f}  Pass@{k} {100 * m['pass_at_k']:.1f}  parallel "
                      f"{100 * m['parallel_ratio']:.1f}%  T {m['mean_T']:.0f}  D {m['mean_D']:.0f}  "
                      f"({m['num_problems']} problems, {timings[bench]:.0f}s)")
    if earlier := [p for f in ("samples.jsonl", "results.md", "summary.json") if os.path.isfile(p := f"{out_dir}/{f}")]:
        log(f"moved the earlier evaluation in {out_dir} to {move_aside(out_dir, earlier)}")   # not overwritten
    os.replace(partial, os.path.join(out_dir, "samples.jsonl"))
    table = format_table({name: results})
    summary = {"model": cfg.model, "name": name, "mode": mode, "mode_source": why, "prompt_style": style,
               "prompt_file": prompt_file, "avg_mean_at_k": average_mean_at_k(results),
               "benchmarks": results, "skipped_too_long": skipped, "seconds": timings, "table": table,
               "config": dataclasses.asdict(cfg)}
    for file, text in (("results.md", table + "\n"), ("summary.json", json.dumps(summary, indent=2))):
        with open(os.path.join(out_dir, file), "w", encoding="utf-8") as fh:
            fh.write(text)
    print(f"\n{table}\n\n[eval] wrote {out_dir}/results.md, samples.jsonl, summary.json")
    return summary

if __name__ == "__main__":
    try:
        run(config.parse(EvalConfig, sys.argv[1:]))
    except (OSError, ValueError) as e:              # bad input: the message says what to do
        sys.exit(f"eval.py: error: {e}")
