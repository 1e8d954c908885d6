"""How long a checkpoint blocks the training loop, each way plumbing.Run.save writes one under
FSDP2 (issue 46): --checkpoint=full (the full state dicts gathered to rank 0, which writes one
Hugging Face folder), sharded (every rank writes its own shards with torch.distributed.checkpoint)
and async (the shards copied to host memory, then written by a background thread).

    torchrun --nproc_per_node=2 scripts/bench/bench_checkpoint.py [--layers=6] [--repeats=2]

A Qwen3 (random weights, hidden 768, --layers decoder layers: ~9M parameters each) sharded as
plumbing.wrap_model shards it, with AdamW's state made by one step: weights and state ~12 bytes a
parameter. Each round saves once each way (after a round that warms up), through Run.save as the
trainers call it, into a temporary folder (keep_last=1). Rank 0 prints, for each way, the best time
Run.save held the loop, the ratio to full, and for async also how long the background write took
after it returned (a later save waits for it: plumbing.Run.wait_for_save). The threads are
OMP_NUM_THREADS's (torchrun sets 1); the writes go to the temporary folder's disk.
"""
import argparse
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))   # two folders up
sys.path.insert(0, ROOT)   # the core modules

import torch
import torch.distributed as dist
from transformers import Qwen3Config, Qwen3ForCausalLM
from transformers.utils import logging as hf_logging

import plumbing
import sft
from model import build_char_tokenizer

MODEL = dict(vocab_size=4096, hidden_size=768, num_attention_heads=12, num_key_value_heads=4,
             head_dim=64, intermediate_size=3072, max_position_embeddings=1024,
             tie_word_embeddings=True)
WAYS = ("full", "sharded", "async")
GRADIENT = 1e-3                 # the made-up gradient of AdamW's one step


def sharded_run(d: plumbing.Dist, layers: int, out_dir: str) -> plumbing.Run:
    """A Run holding the bench's Qwen3 under FSDP2, AdamW with its state, a schedule."""
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**MODEL, num_hidden_layers=layers))
    cfg = sft.SFTConfig(out_dir=out_dir, fsdp=True, keep_last=1, grad_checkpointing=False)
    run = plumbing.Run(cfg, d, model, build_char_tokenizer(), tags=None)
    plumbing.wrap_model(run)
    run.optimizer = torch.optim.AdamW(run.train_model.parameters(), lr=1e-5)
    run.scheduler = torch.optim.lr_scheduler.LambdaLR(run.optimizer, lambda step: 1.0)
    for parameter in run.train_model.parameters():
        parameter.grad = torch.full_like(parameter, GRADIENT)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    return run


def timed_save(run: plumbing.Run, way: str) -> tuple[float, float]:
    """(seconds Run.save held the loop, seconds until the checkpoint was written and named)."""
    run.cfg = sft.SFTConfig(**{**vars(run.cfg), "checkpoint": way})
    run.step += 1
    dist.barrier()
    start = time.perf_counter()
    run.save()
    blocked = time.perf_counter() - start
    run.wait_for_save()
    dist.barrier()
    return blocked, time.perf_counter() - start


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    hf_logging.disable_progress_bar()
    with plumbing.distributed() as d:
        if d.world_size < 2:
            raise ValueError("run it on 2 ranks: torchrun --nproc_per_node=2 "
                             "scripts/bench/bench_checkpoint.py")
        folder = [tempfile.mkdtemp(prefix="bench_checkpoint-") if d.is_main else None]
        dist.broadcast_object_list(folder, src=0)
        try:
            run = sharded_run(d, args.layers, folder[0])
            times = {way: [] for way in WAYS}
            for _ in range(args.repeats + 1):              # the first round warms up
                for way in WAYS:
                    times[way].append(timed_save(run, way))
        finally:
            dist.barrier()
            if d.is_main:
                shutil.rmtree(folder[0], ignore_errors=True)
        params = sum(p.numel() for p in run.model.parameters())
        state_bytes = params * 4 * 3                       # fp32 weights, exp_avg, exp_avg_sq
        if not d.is_main:
            return
        print(f"{params / 1e6:.1f}M parameters, weights + AdamW state {state_bytes / 1e6:.0f} MB, "
              f"{d.world_size} gloo ranks, best of {args.repeats}")
        best = {way: min(blocked for blocked, _ in rounds[1:]) for way, rounds in times.items()}
        written = min(total for _, total in times["async"][1:])
        for way in WAYS:
            print(f"  {way:8s} blocks the loop {best[way]:6.2f} s  "
                  f"({best[way] / best['full']:.2f} x full)")
        print(f"  async's shards written {written:.2f} s after it began, in the background")


if __name__ == "__main__":
    main(sys.argv[1:])
