"""Cold-start SFT: teach a model the parallel format by imitation (NOTES.md §6, stage 1).

    python sft.py                                   # tiny model, synthetic traces, ~4 min on 2 CPUs
    python sft.py --mode=seen --max_steps=100       # any config field: --key=value or --key value
    python sft.py --resume=True                     # continue the latest checkpoint in out_dir
    torchrun --nproc_per_node=8 sft.py --model=Qwen/Qwen3-4B-Base --data=parallel_gsm8k \\
        --fsdp=True --grad_checkpointing=True --out_dir=runs/sft_qwen3_4b   # the paper's (§5)

The loss: the summed NLL of the trace + EOS (the tags the sampler will inject included; the prompt
is no target) under the mode's mask and positions (attention.py), divided by the response tokens
of the *whole global batch* (the official trainer backpropagated each micro-batch's own mean, 16x
too large before clipping, NOTES.md §8). The file is the method first (`sft_step`, then what it
calls), then the run. out_dir/checkpoint-<step>: a Hugging Face folder + trainer_state.pt
(optimizer, schedule, RNGs, data position; --checkpoint=sharded|async: the weights and the optimizer
as each rank's shards in dcp/); plumbing.py does the ranks, the checkpoints and the exact resume.
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Annotated, Literal

# Idle OpenMP threads sleep instead of spinning (spinning ones slow a shared CPU down).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch
from transformers.utils import logging as hf_logging

import config
import plumbing
from attention import LOGIT_CHUNK_TOKENS, TagIds, token_scores
from data import (
    Batch,
    Example,
    Style,
    collate,
    embedded_test_parts,
    load_data,
    prompt_style_of,
    tokenize_records,
)
from eval import end_of_run_samples, own_tokenizer
from model import resolve_preset


@dataclass
class SFTConfig(plumbing.RunFlags):
    """python sft.py: cold-start SFT; the run's flags are plumbing.RunFlags'. None = the preset's
    (config.SFT_PRESETS)."""
    model: str = "tiny"                  # "tiny", a Hugging Face hub name, or a checkpoint folder
    preset: config.Preset = "auto"       # tiny, paper, none; auto: tiny for --model=tiny
    tokenizer: str = ""                  # tiny, or a folder of config.json only: its tokenizer
    data: str = "synthetic:easy"         # a data.load_data spec (parallel_gsm8k, a file, ...)
    data_dir: str = ""                   # folder of the real data sets ("" = data.py's default)
    style: Style = "parallel"            # parallel, or sequential (plain CoT): prompt and traces
    parallel_fraction: config.UnitInterval = 0.5   # synthetic traces: the chance a round is a block
    max_paths: Annotated[int, config.Range(low=2)] = 2   # synthetic: a block's width, 2..max_paths
    mode: Literal["unseen", "seen"] = "unseen"   # the Unseen mask and positions, or causal
    prompt_file: str = ""                # a prompt template for data.build_prompt ("" = default)
    limit: config.NonNegativeInt = 0     # use only the first `limit` records (0 = all)
    out_dir: str = "runs/sft"
    lr: config.PositiveFloat | None = None           # AdamW, linear warm-up, cosine to 0
    batch_size: config.PositiveInt | None = None     # sequences per step, all ranks together
    micro_batch_size: config.PositiveInt | None = None   # sequences per forward on one rank
    epochs: config.PositiveFloat | None = None       # used when max_steps is None
    warmup_ratio: config.UnitInterval | None = None  # the share of the steps that warm up
    betas: config.AdamBetas = (0.9, 0.95)
    max_length: config.PositiveInt | None = None     # prompt + response tokens (longer: dropped)
    log_every: config.NonNegativeInt = 50     # print a line every N steps (0 = never)
    save_every: config.NonNegativeInt = 100   # checkpoint every N steps (0 = only at the end)
    eval_samples: config.NonNegativeInt = 16  # greedy samples in the end-of-run summary (0 = none)
    eval_data: str = ""                  # "" = the test part of an embedded task, else the training


# ---------------------------------------------------------------------------------------------
# The method: one SFT step, top to bottom (NOTES.md §6, stage 1)


def sft_step(run: plumbing.Run, examples: list[Example], stream: plumbing.ShuffledStream) -> dict:
    """One optimizer step on the next global batch; the step's row of log.jsonl."""
    cfg = run.cfg
    d = run.dist
    t0 = time.monotonic()
    micro_batches = shard_micro_batches(examples, stream.take(cfg.batch_size), d.rank,
                                        d.world_size, cfg.micro_batch_size,
                                        run.tokenizer.pad_token_id)
    lr = run.optimizer.param_groups[0]["lr"]
    nll, loss_tokens = accumulate_gradients(run.train_model, micro_batches, run.tags, cfg.mode,
                                            d.world_size, d.device, cfg.logit_chunk_tokens)
    grad_norm = plumbing.optimizer_step(run.train_model, run.optimizer, run.scheduler,
                                        cfg.grad_clip)
    local_tokens = sum(mb.attention_mask.sum().item() for mb in micro_batches)
    tokens = plumbing.all_reduce([local_tokens], d.device)[0]
    seconds = time.monotonic() - t0
    return dict(step=run.step, loss=nll / loss_tokens, lr=lr, grad_norm=grad_norm,
                tokens=int(tokens), epoch=stream.epoch, loss_tokens=int(loss_tokens),
                tokens_per_s=tokens / seconds)


def shard_micro_batches(examples: list[Example], batch_indices: list[int], rank: int,
                        world_size: int, micro_batch_size: int, pad_id: int) -> list[Batch]:
    """This rank's contiguous share of a global batch, shortest first (less padding), cut into
    micro-batches."""
    per_rank = len(batch_indices) // world_size
    mine = batch_indices[rank * per_rank:(rank + 1) * per_rank]
    mine = sorted(mine, key=lambda i: len(examples[i].prompt_ids) + len(examples[i].response_ids))
    return [collate([examples[i] for i in mine[j:j + micro_batch_size]], pad_id)
            for j in range(0, per_rank, micro_batch_size)]


def accumulate_gradients(model, micro_batches: list[Batch], tags: TagIds, mode: str,
                         world_size: int = 1, device=None,
                         chunk_tokens: int = LOGIT_CHUNK_TOKENS) -> tuple[float, float]:
    """Backward over this rank's micro-batches so that the gradients (after the ranks' average)
    are those of sum(NLL) / tokens of the global batch; they sync on the last one. Returns (the
    global NLL sum, the global token count)."""
    device = device or micro_batches[0].input_ids.device
    local_tokens = sum(mb.loss_mask[:, 1:].sum().item() for mb in micro_batches)
    global_tokens = plumbing.all_reduce([local_tokens], device)[0]
    nll_total = 0.0
    for i, mb in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with plumbing.grad_sync(model, enabled=last):
            nll_sum, _ = response_nll(model, mb.to(device), tags, mode, chunk_tokens)
            (nll_sum * (world_size / global_tokens)).backward()
        nll_total += nll_sum.item()
    return plumbing.all_reduce([nll_total], device)[0], global_tokens


def response_nll(model, batch: Batch, tags: TagIds, mode: str,
                 chunk_tokens: int = LOGIT_CHUNK_TOKENS) -> tuple[torch.Tensor, torch.Tensor]:
    """(the summed NLL of the response tokens, their count): position t predicts input_ids[:, t+1]
    (in sequence order), and the targets are the response tokens."""
    targets = batch.loss_mask[:, 1:].bool()                            # (B, L-1)
    logprobs, _ = token_scores(model, batch, tags, mode, targets, chunk_tokens=chunk_tokens)
    return -logprobs.sum(), targets.sum()


# ---------------------------------------------------------------------------------------------
# The run: presets, setup, the loop, the end-of-run samples (a reader of the method may stop
# here)


DEFAULT_MAX_LENGTH = 4096       # when the model states no context
LOSS_WINDOW = 10                # the end-of-run mean loss: over this many last steps
GIVEN_RECORDS = "the given records"     # the data's name when train's `records` replace cfg.data


def resolve_defaults(cfg: SFTConfig, world_size: int = 1) -> SFTConfig:
    """The preset (--preset; auto: `model.resolve_preset`) in the None fields (max_length waits
    for the model's context). The preset's step count only when neither max_steps nor epochs is
    given."""
    config.check(cfg)
    preset, _ = resolve_preset(cfg.preset, cfg.model)
    presets = {name: dict(values) for name, values in config.SFT_PRESETS.items()}
    if cfg.max_steps is not None or cfg.epochs is not None:
        for values in presets.values():
            values.pop("max_steps", None)
            values.pop("epochs", None)
    cfg = config.apply_preset(dataclasses.replace(cfg, preset=preset), presets)
    if cfg.max_steps is None and cfg.epochs is None:
        raise ValueError("--preset=none: give --max_steps or --epochs")
    if cfg.batch_size % world_size:
        raise ValueError(f"--batch_size={cfg.batch_size} does not split evenly over {world_size} "
                         "ranks")
    return cfg


def sft_schedule(total_steps: int, warmup_ratio: float):
    """SFT's lr multiplier: a warm-up over ceil(warmup_ratio * total) steps, then a cosine that
    reaches 0 at the last step."""
    warmup_steps = math.ceil(warmup_ratio * total_steps)
    return lambda step: plumbing.lr_factor(step, warmup_steps, total_steps - 1)


def setup(cfg: SFTConfig, d: plumbing.Dist, records: list[dict] | None):
    """(the run, its examples, the end-of-run problems and their name): the resolved config, the
    model, the tokenized data. Everything that can fail on input fails before the weights load."""
    own_tokenizer(cfg.model)                     # a --model that cannot load fails here
    cfg, settings = plumbing.resolve_config(cfg, d, resolve_defaults, config.SFT_PRESETS)
    load_kw = {}
    if cfg.tokenizer:                            # model.load_model refuses it where it is moot
        load_kw["tokenizer"] = cfg.tokenizer or None
    run = plumbing.load_run(cfg, d, cfg.model, settings, **load_kw)
    context = getattr(run.model.config, "max_position_embeddings", None) or DEFAULT_MAX_LENGTH
    max_length = cfg.max_length or min(DEFAULT_MAX_LENGTH, context)
    run.cfg = cfg = dataclasses.replace(cfg, max_length=max_length)
    data_name = cfg.data if records is None else GIVEN_RECORDS
    test_parts = None
    if records is None:
        test_parts = embedded_test_parts(cfg.data)
    if records is None:
        records = load_data(cfg.data, style=cfg.style, limit=cfg.limit or None, seed=cfg.seed,
                            data_dir=cfg.data_dir or None, tokenizer=run.tokenizer,
                            parallel_fraction=cfg.parallel_fraction, max_paths=cfg.max_paths)
    if cfg.limit:
        records = records[:cfg.limit]
    prompt = prompt_style_of(cfg.preset, cfg.style)
    examples = tokenize_records(records, run.tokenizer, prompt, cfg.max_length,
                                cfg.prompt_file or None, run.log)
    # the end-of-run samples: of cfg.eval_data, else an embedded task's test part, else the training
    eval_name = f"{data_name} (training problems)"
    eval_records = records
    if cfg.eval_samples and (cfg.eval_data or test_parts):
        eval_name = cfg.eval_data or test_parts
        eval_records = load_data(eval_name, style=cfg.style, limit=cfg.eval_samples,
                                 data_dir=cfg.data_dir or None,
                                 tokenizer=run.tokenizer if cfg.eval_data else None)
    return run, examples, (eval_name, eval_records)


def report(run: plumbing.Run, summary: dict) -> None:
    """The run's last lines: steps, loss, checkpoint, log, the greedy samples."""
    cfg = run.cfg
    loss = "no step left to train"
    if summary["final_loss"] is not None:
        loss = (f"final loss {summary['final_loss']:.4f} (the last step's; the mean of the last "
                f"{summary['loss_window']} steps {summary['mean_loss_last_steps']:.4f})")
    stopped = f" (stopped by {summary['stopped_by']})" if summary["stopped_by"] else ""
    done = (f"SFT done at step {run.step} of {summary['total_steps']}{stopped}: "
            f"{summary['trained_steps']} steps in {summary['seconds']:.0f}s, {loss}")
    lines = [done,
             f"checkpoint: {summary['checkpoint']}",
             f"log: {os.path.join(cfg.out_dir, 'log.jsonl')}"]
    e = summary["eval"] or {}
    if e.get("n"):
        lines.append(f"greedy samples on {e['n']} problems of {e['data']}: no malformed block "
                     f"{e['structure_ok']:.0%}, a final answer {e['answer_found']:.0%}, parallel "
                     f"{e['parallel']:.0%}, accuracy {e['accuracy']:.0%}; first: "
                     f"{e['example'][:300]!r}")
    lines += [f"note: {note}" for note in e.get("notes", [])]
    run.log("\n".join(lines))


def train(cfg: SFTConfig, records: list[dict] | None = None) -> dict:
    """Run SFT (one process, or one rank under torchrun); `records` replace cfg.data (tests,
    notebooks). Returns {"checkpoint", "steps" (the step reached), "total_steps",
    "trained_steps" (by this start: fewer after a resume), "stopped_by" ("" or why the loop
    ended early), "final_loss" (the last step's), "mean_loss_last_steps" (over the last
    "loss_window" steps of this process, at most LOSS_WINDOW), "seconds", "tokens_per_s",
    "eval"}; the losses are None (the window 0) when no step was left to train."""
    with plumbing.distributed(cfg.dist_timeout_minutes) as d:
        run, examples, eval_set = setup(cfg, d, records)
        cfg = run.cfg
        if cfg.max_steps:
            total_steps = cfg.max_steps
        else:
            total_steps = math.ceil(cfg.epochs * len(examples) / cfg.batch_size)
        plumbing.prepare(run, sft_schedule(total_steps, cfg.warmup_ratio))
        position = run.state.get("data_position", {})
        stream = plumbing.ShuffledStream(len(examples), cfg.seed, **position)
        params = sum(p.numel() for p in run.model.parameters()) / 1e6
        data_name = cfg.data if records is None else GIVEN_RECORDS
        run.log(f"SFT {cfg.model} ({params:.2f}M params) on {len(examples)} examples of "
                f"{data_name}, mode={cfg.mode}, style={cfg.style}, {d.world_size} rank(s) on "
                f"{d.device.type}, batch {cfg.batch_size}, lr {cfg.lr}, {total_steps} steps")
        losses = []
        tokens_seen = 0
        for step in run.steps(total_steps, "sft"):
            row = sft_step(run, examples, stream)
            losses.append(row["loss"])
            tokens_seen += row["tokens"]
            line = (f"step {step}: loss {row['loss']:.4f}, lr {row['lr']:.2e}, grad_norm "
                    f"{row['grad_norm']:.3f}, {row['tokens_per_s']:,.0f} tok/s")
            postfix = {"loss": f"{row['loss']:.4f}", "tok_s": f"{row['tokens_per_s']:,.0f}"}
            run.end_step(row, line, postfix, data_position=stream.position())
        seconds = time.monotonic() - run.t_start
        window = losses[-LOSS_WINDOW:]
        summary = {"checkpoint": run.checkpoint, "steps": run.step, "total_steps": total_steps,
                   "trained_steps": len(losses),
                   "stopped_by": run.stopped_by,
                   "final_loss": losses[-1] if losses else None,
                   "mean_loss_last_steps": float(np.mean(window)) if window else None,
                   "loss_window": len(window),
                   "seconds": seconds,
                   "tokens_per_s": tokens_seen / seconds if seconds > 0 else 0.0}
        summary["eval"] = end_of_run_samples(run, examples, eval_set)
        run.close()
        report(run, summary)
        return summary


def main(argv: list[str]) -> dict:
    hf_logging.disable_progress_bar()                     # our own bar is enough
    return train(plumbing.parse_args(SFTConfig, argv))


if __name__ == "__main__":
    hf_logging.disable_progress_bar()
    plumbing.run_script("sft.py", SFTConfig, train, sys.argv[1:])
