"""How much probability a policy puts on the tags the runtime masks (NOTES.md §8.10): sample
responses, then, at every sampled token, the full softmax's mass on what that draw masked.

    python scripts/look/masked_mass.py runs/demo/sft/checkpoint-400 runs/demo/grpo/checkpoint-100 \\
        [--data=synthetic:hard:test] [--limit=32] [--k=4] [--seed=0]

(the checkpoints of `make demo`; any grpo.py or sft.py checkpoint). Prompts are written as the
tiny preset writes them (the problem alone).

The sampler never draws a masked tag, so a masked tag's probability is never pushed down by the
loss. Scored under the full softmax, a negative advantage lifts it (it lowers the drawn token and
lifts all others); scored under the masked softmax, as grpo.py does, it gets no gradient at all.
A policy trained the first way drifts: this mass grows over training (results/LOG.md, 2026-12-06:
0.23% after SFT, 29.2% after 100 steps; 0.12-0.19% when trained the second way).
Printed per checkpoint: the mean mass over every sampled token, and over those in a path, a
summary and the main chain.
"""
import argparse
import os
import statistics
import sys

import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))   # two folders up
sys.path.insert(0, ROOT)   # the core modules
from attention import TagIds, structured_forward
from data import build_prompt, load_data
from model import load_model, mode_from_config, read_checkpoint_config
from sample import generate


def segment_of(structure, j: int) -> str:
    """"path", "summary" or "main": where response token j was sampled."""
    for block in structure.blocks:
        if any(start <= j < end for start, end in block.paths):
            return "path"
        if block.summary and block.summary[0] <= j < block.summary[1]:
            return "summary"
    return "main"


def masked_mass(model, tokenizer, prompts: list[str], k: int, mode: str, seed: int) -> dict:
    """{segment: [mass at each sampled token]} for k responses to each prompt."""
    tags = TagIds.from_tokenizer(tokenizer)
    rollouts = generate(model, tokenizer, prompts, group_size=k, mode=mode, seed=seed,
                        max_new_tokens=128)
    maskable = torch.tensor(tags.maskable)
    masses = {"path": [], "summary": [], "main": []}
    for r in rollouts:
        ids = torch.tensor([r.prompt_ids + r.response_ids])
        start = len(r.prompt_ids)
        with torch.no_grad():
            logits = structured_forward(model, ids, torch.ones_like(ids), [start], tags, mode)
        probs = logits[0, start - 1:-1].float().softmax(-1)[:, maskable]        # (R, K)
        for j, sampled in enumerate(r.sampled_mask):
            if sampled:
                banned = torch.tensor(r.banned[j])
                masses[segment_of(r.structure, j)].append(probs[j][banned].sum().item())
    return masses


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoints", nargs="+")
    parser.add_argument("--data", default="synthetic:hard:test")
    parser.add_argument("--limit", type=int, default=32, help="problems")
    parser.add_argument("--k", type=int, default=4, help="responses per problem")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    records = load_data(args.data, limit=args.limit)
    for checkpoint in args.checkpoints:
        model, tokenizer = load_model(checkpoint, device="cpu")
        mode = mode_from_config(read_checkpoint_config(checkpoint)[0]) or "unseen"
        prompts = [build_prompt(tokenizer, r["problem"], "bare") for r in records]
        masses = masked_mass(model, tokenizer, prompts, args.k, mode, args.seed)
        every = [m for values in masses.values() for m in values]
        parts = ", ".join(f"{name} {100 * statistics.mean(values):.2f}% ({len(values)})"
                          for name, values in masses.items() if values)
        print(f"{checkpoint}: masked mass {100 * statistics.mean(every):.2f}% over {len(every)} "
              f"sampled tokens; {parts}")


if __name__ == "__main__":
    sys.exit(main())
