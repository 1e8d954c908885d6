"""The sampler's log-prob gap in bf16 against the training forward, measured on the CPU (issue 34):
what a GPU computes, emulated under CPU bf16 autocast, through the code GRPO runs
(scripts/gpu/gpu_check.logprob_gap: grpo.sample_rollouts, then grpo.response_logprobs).

    python scripts/bench/bf16_gap.py [--model=runs/sft/checkpoint-400] [--seed=0]

Rows, each the sampler's recorded log-probs against the training forward's for the same sampled
tokens:
* fp32: the CPU run (sampler = training model, fp32);
* FSDP (a GPU): the sampler's bf16 copy (model.frozen_copy) against the forward with bf16
  parameters that FSDP2's MixedPrecisionPolicy computes with (a second frozen_copy stands in);
* no FSDP (a GPU): the fp32 model under bf16 autocast, both;
* FSDP, copy by Module.to: the sampler's copy made as grpo.setup made it before issue 34
  (copy.deepcopy, then .to(bf16): the rotary frequencies rounded to bf16 too).
For two models: --model (the tiny SFT checkpoint by default: peaked, trained distributions) on the
tiny task's prompts, and a random Qwen3 with Qwen3's rotary base (10^6) and peaked logits (init std
LONG_INIT_STD) decoding at positions past LONG_PROMPT_TOKENS, where the frequencies' rounding
shows. Columns: sampled tokens, max and mean |difference|, and the share of tokens whose ratio
exp(training - sampler) lies outside [0.8, 1.2], PPO's clip, before any update.
"""
import argparse
import copy
import os
import sys
from contextlib import nullcontext

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))   # two folders up
sys.path.insert(0, ROOT)   # the core modules and scripts.<folder>.<name>

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

import grpo
from attention import TagIds
from model import frozen_copy, load_model
from scripts.gpu.gpu_check import logprob_gap

DEFAULT_MODEL = "runs/sft/checkpoint-400"
PROMPTS = ("Which two of 4 9 5 1 make 9?\n", "Which two of 3 1 2 8 6 make 5?\n",
           "Which two of 4 6 8 3 5 9 make 8?\n", "Which two of 1 2 7 make 8?\n")
RESPONSES = 8                  # per prompt
BUDGET = 128
LONG = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            head_dim=64, intermediate_size=512, max_position_embeddings=4096, rope_theta=1e6,
            tie_word_embeddings=True)
LONG_INIT_STD = 0.1            # peaked logits (0.02, the default, gives near-uniform ones)
LONG_PROMPTS = 2
LONG_PROMPT_TOKENS = 3000      # about the paper's longest prompt + budget
LONG_RESPONSES = 4
LONG_BUDGET = 48
ALPHABET_IDS = (3, 100)        # the tiny tokenizer's ordinary characters


def bf16_autocast():
    return torch.autocast("cpu", dtype=torch.bfloat16)


def rows(model) -> list[tuple[str, object, object, object]]:
    """(name, sampler, training model, precision context) of each row."""
    bf16_sampler = frozen_copy(model, torch.bfloat16)
    fsdp_forward = frozen_copy(model, torch.bfloat16)
    old_copy = copy.deepcopy(model).to(torch.bfloat16).eval()
    return [("fp32 (the CPU)", model, model, nullcontext),
            ("FSDP (a GPU)", bf16_sampler, fsdp_forward, bf16_autocast),
            ("no FSDP (a GPU)", model, model, bf16_autocast),
            ("FSDP, copy by Module.to", old_copy, fsdp_forward, bf16_autocast)]


def measure(name: str, model, tokenizer, prompts: list[list[int]], responses: int,
            budget: int, seed: int) -> list[str]:
    """The table rows of one model."""
    tags = TagIds.from_tokenizer(tokenizer)
    cfg = grpo.resolve_defaults(grpo.GRPOConfig(preset="tiny", batch_size=len(prompts),
                                                group_size=responses, max_new_tokens=budget,
                                                generate_batch_size=0, seed=seed))
    out = []
    for row, sampler, trainer, precision in rows(model):
        torch.manual_seed(seed)
        with precision():
            gap = logprob_gap(sampler, trainer, tokenizer, tags, cfg, prompts, torch.device("cpu"))
        out.append(f"| {name} | {row} | {gap['tokens']} | {gap['max']:.3g} | {gap['mean']:.3g} "
                   f"| {100 * gap['outside_clip']:.2f}% |")
    return out


def long_context_model(vocab_size: int, seed: int):
    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=vocab_size, initializer_range=LONG_INIT_STD, **LONG)
    model = Qwen3ForCausalLM(config)
    model.set_attn_implementation("sdpa")
    return model.eval()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help=f"a trained checkpoint (default {DEFAULT_MODEL}: python sft.py)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not os.path.isdir(args.model):
        raise ValueError(f"--model={args.model} is not a folder: train the tiny model first "
                         "(python sft.py, ~4 min on 2 cores) or pass a checkpoint")
    model, tokenizer = load_model(args.model, device="cpu")
    prompts = [tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]
    print("| model | sampler / training forward | tokens | max abs | mean abs | outside clip |")
    print("|---|---|---|---|---|---|")
    for line in measure(args.model, model, tokenizer, prompts, RESPONSES, BUDGET, args.seed):
        print(line, flush=True)
    long_model = long_context_model(len(tokenizer), args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    long_prompts = torch.randint(*ALPHABET_IDS, (LONG_PROMPTS, LONG_PROMPT_TOKENS),
                                 generator=generator).tolist()
    name = f"random Qwen3, positions {LONG_PROMPT_TOKENS}+"
    for line in measure(name, long_model, tokenizer, long_prompts, LONG_RESPONSES, LONG_BUDGET,
                        args.seed):
        print(line, flush=True)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (OSError, ValueError) as e:
        sys.exit(f"bf16_gap.py: error: {e}")
