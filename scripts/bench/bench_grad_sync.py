"""The time FSDP2's gradient accumulation costs on 2 gloo ranks (issue 34): a reduce-scatter after
every micro-batch (what plumbing.grad_sync does under FSDP) against FSDP2's no-sync
(set_requires_gradient_sync(False) on every micro-batch but the last, which keeps every
parameter's whole fp32 gradient on every rank until the last backward).

    torchrun --nproc_per_node=2 scripts/bench/bench_grad_sync.py [--micro_batches=8] [--repeats=3]

A Qwen3 of ~5M parameters (random weights) sharded as plumbing.wrap_model shards it, and one
mini-batch of --micro_batches micro-batches of 2 rows x 256 tokens, each through the training
loss's forward (attention.token_scores under the Unseen mask) and backward. Rank 0 prints the best
time of a mini-batch each way over --repeats (the two ways alternate, after one warm-up each), and
their ratio. The threads are OMP_NUM_THREADS's (torchrun sets 1).
"""
import argparse
import os
import sys
import time
import types

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))   # two folders up
sys.path.insert(0, ROOT)   # the core modules

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

import plumbing
from attention import TagIds, token_scores

MODEL = dict(vocab_size=4096, hidden_size=256, num_hidden_layers=6, num_attention_heads=4,
             num_key_value_heads=2, head_dim=64, intermediate_size=768,
             max_position_embeddings=1024, tie_word_embeddings=True)
ROWS = 2                        # a micro-batch (the paper's micro_batch_size)
LENGTH = 256
PROMPT_TOKENS = 16
FIRST_TAG = MODEL["vocab_size"] - 8     # six tag ids, a newline and an EOS at the vocabulary's end
TAGS = TagIds(*range(FIRST_TAG, FIRST_TAG + 6), newline=(FIRST_TAG + 6,), eos=FIRST_TAG + 7)


def sharded_model(d: plumbing.Dist):
    """The bench's Qwen3, wrapped by plumbing.wrap_model (FSDP2, no gradient checkpointing)."""
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**MODEL))
    model.set_attn_implementation("sdpa")
    cfg = types.SimpleNamespace(fsdp=True, grad_checkpointing=False)
    run = types.SimpleNamespace(cfg=cfg, dist=d, model=model, train_model=None)
    plumbing.wrap_model(run)
    return run.train_model


def mini_batch(seconds_per_way: dict, model, ids, way: str, micro_batches: int) -> None:
    """Forward and backward of `micro_batches` micro-batches; `way` "sync" reduce-scatters after
    each, "no_sync" after the last only. Adds the seconds to seconds_per_way[way]'s list."""
    real = torch.ones_like(ids)
    selected = torch.zeros(ROWS, LENGTH - 1, dtype=torch.bool)
    selected[:, PROMPT_TOKENS - 1:] = True
    start = time.perf_counter()
    for j in range(micro_batches):
        last = j == micro_batches - 1
        model.set_requires_gradient_sync(way == "sync" or last)
        logprobs, _ = token_scores(model, ids, real, [PROMPT_TOKENS] * ROWS, TAGS, "unseen",
                                   selected)
        (-logprobs.mean()).backward()
    seconds_per_way[way].append(time.perf_counter() - start)
    model.zero_grad(set_to_none=True)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--micro_batches", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    with plumbing.distributed() as d:
        if d.world_size < 2:
            raise ValueError("run it on 2 ranks: torchrun --nproc_per_node=2 "
                             "scripts/bench/bench_grad_sync.py")
        model = sharded_model(d)
        generator = torch.Generator().manual_seed(d.rank)
        ids = torch.randint(0, FIRST_TAG, (ROWS, LENGTH), generator=generator)
        seconds = {"sync": [], "no_sync": []}
        for _ in range(args.repeats + 1):                  # the first round warms up
            for way in seconds:
                mini_batch(seconds, model, ids, way, args.micro_batches)
        best = {way: min(times[1:]) for way, times in seconds.items()}
        params = sum(p.numel() for p in model.parameters())
        if d.is_main:
            print(f"{params / 1e6:.2f}M parameters, {d.world_size} gloo ranks, "
                  f"{args.micro_batches} micro-batches of {ROWS} x {LENGTH} tokens, best of "
                  f"{args.repeats}")
            for way, value in best.items():
                print(f"  {way:8s} {value:.3f} s a mini-batch "
                      f"({value / args.micro_batches * 1e3:.0f} ms a micro-batch)")
            print(f"  sync / no_sync = {best['sync'] / best['no_sync']:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
