"""The host memory of loading the model on several ranks (issue 39): when each rank's turn of
plumbing.load_in_turns began and ended, and each rank's resident memory (RSS) before and at its
peak.

    torchrun --nproc_per_node=2 scripts/bench/bench_load.py           # a Qwen3 of ~110M parameters
    torchrun --nproc_per_node=2 scripts/bench/bench_load.py --model=<checkpoint folder> \
        [--out=x.json]

Without --model, rank 0 first writes a random Qwen3 (hidden 1024, 8 layers, the tiny model's
character tokenizer) in bf16, as hub models are stored, to a temporary folder. Every rank then
loads it as plumbing.load_run does (fp32, on its device: here the CPU, where the model stays; on
a GPU node a rank's host copy is freed when it moves to its GPU, before the next rank's turn).
Rank 0 prints one line per rank and, with --out, writes them as JSON.
"""
import argparse
import json
import os
import resource
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))   # two folders up
sys.path.insert(0, ROOT)   # the core modules

import torch
import torch.distributed as dist
from transformers import Qwen3Config, Qwen3ForCausalLM

import plumbing
from model import build_char_tokenizer, load_model

BENCH_MODEL = dict(hidden_size=1024, num_hidden_layers=8, num_attention_heads=16,
                   num_key_value_heads=8, head_dim=64, intermediate_size=3072,
                   max_position_embeddings=2048, tie_word_embeddings=True)
KIB = 1024
MB = 1e6


def write_bench_model(folder: str) -> str:
    """A random Qwen3 of BENCH_MODEL's shape with the character tokenizer, saved in bf16."""
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    model_config = Qwen3Config(vocab_size=len(tok), pad_token_id=tok.pad_token_id,
                               eos_token_id=tok.eos_token_id, **BENCH_MODEL)
    model = Qwen3ForCausalLM(model_config).to(torch.bfloat16)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def rss_bytes() -> int:
    """This process's resident memory now (Linux), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * KIB
    raise OSError("no VmRSS in /proc/self/status (Linux only)")


def peak_rss_bytes() -> int:
    """This process's largest resident memory so far (ru_maxrss, KiB on Linux), in bytes."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * KIB


def timed_load(folder: str, device: torch.device) -> dict:
    """load_model as plumbing.load_run calls it, with the times (seconds since the epoch) the
    load began and ended and the parameters' bytes."""
    start = time.time()
    model, _ = load_model(folder, dtype=torch.float32, device=device)
    end = time.time()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"start": start, "end": end, "param_bytes": params, "model": model}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="", help="a checkpoint folder (default: write one)")
    parser.add_argument("--out", default="", help="also write the ranks' lines to this JSON file")
    args = parser.parse_args(argv)
    with plumbing.distributed() as d, tempfile.TemporaryDirectory() as tmp:
        folder = args.model
        if not folder:
            folder = os.path.join(tmp, "bench-model")       # rank 0's temporary folder
            if d.is_main:
                write_bench_model(folder)
            names = [folder]
            dist.broadcast_object_list(names, src=0)
            folder = names[0]
        dist.barrier()
        before = rss_bytes()
        peak_before = peak_rss_bytes()
        loaded = plumbing.load_in_turns(lambda: timed_load(folder, d.device))
        row = {"rank": d.rank, "start": loaded["start"], "end": loaded["end"],
               "param_bytes": loaded["param_bytes"], "rss_before": before,
               "peak_rss": peak_rss_bytes(), "peak_before": peak_before, "rss_after": rss_bytes()}
        rows = [None] * d.world_size
        dist.all_gather_object(rows, row)
        dist.barrier()                       # rank 0's temporary folder outlives every load
        if not d.is_main:
            return
        first = min(r["start"] for r in rows)
        for r in rows:
            growth = r["peak_rss"] - r["rss_before"]
            print(f"rank {r['rank']}: loaded {r['start'] - first:6.2f} s to "
                  f"{r['end'] - first:6.2f} s; parameters {r['param_bytes'] / MB:.0f} MB fp32; "
                  f"RSS {r['rss_before'] / MB:.0f} MB before, peak {r['peak_rss'] / MB:.0f} MB "
                  f"(+{growth / MB:.0f} MB, {growth / r['param_bytes']:.2f} x the parameters), "
                  f"{r['rss_after'] / MB:.0f} MB after")
        if args.out:
            with open(args.out, "w") as f:
                json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
