"""Memory and time of one GRPO micro-batch's loss path on CPU: the full logits against the chunked
LM head (issue 28): python scripts/bench/bench_memory.py [--lengths=800,1600] [--chunk_tokens=1024]

A thin Qwen3 (2 layers, hidden 256, Qwen3's vocabulary of 151,936, random weights) and a
micro-batch of 2 rows of L tokens (a 100-token prompt, every response token in the loss), forward
and backward of grpo.micro_batch_loss, two ways, each (path, L) in a subprocess of its own so that
its peak RSS is clean:

* full: the path the chunked head replaced, reproduced here: attention.structured_forward's
  (B, L, V) logits -> the loss tokens' rows -> attention.token_logprobs -> the entropy from a full
  softmax -> grpo.micro_batch_loss -> backward;
* chunked: attention.token_scores (the LM head in chunks of --chunk_tokens, each recomputed in
  the backward)
  -> grpo.micro_batch_loss -> backward.

Printed per L: the peak RSS above the baseline (the model, its batch, the imports) of each path and
their ratio, the best time per micro-batch of --repeats and its ratio. --chunked_only lengths run
the chunked path alone (the full one would not fit). The threads are OMP_NUM_THREADS's.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))   # two folders up
sys.path.insert(0, ROOT)   # the core modules

ROWS = 2                        # a GRPO micro-batch (the paper's micro_batch_size)
PROMPT_TOKENS = 100
THIN = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=64, intermediate_size=768, vocab_size=151936, tie_word_embeddings=True,
            max_position_embeddings=8192)
TAG_IDS = (151669, 151670, 151671, 151672, 151673, 151674)   # past Qwen3's text tokens
NEWLINE_ID = 198
EOS_ID = 151645
KIB = 1024
GB = 1e9
OLD_LOGPROB = -11.9             # about log(1 / 151,936): a ratio near 1 for random weights


def rss_bytes() -> int:
    """The process's resident memory now."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    """The process's largest resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * KIB


def micro_batch(length: int, vocab: int):
    """ROWS rows of `length` random tokens (no tags), a PROMPT_TOKENS prompt, every response token
    sampled and in the loss; advantages +1 and -1."""
    import torch

    import grpo

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, TAG_IDS[0], (ROWS, length), generator=generator)
    mask = torch.zeros(ROWS, length - 1)
    mask[:, PROMPT_TOKENS - 1:] = 1.0
    return grpo.RolloutBatch(input_ids=ids, attention_mask=torch.ones_like(ids),
                             prompt_lengths=[PROMPT_TOKENS] * ROWS, response_mask=mask,
                             sampled_mask=mask.clone(), loss_mask=mask.clone(),
                             old_logprobs=torch.full_like(mask, OLD_LOGPROB),
                             advantages=torch.tensor([[1.0], [-1.0]]))


def full_scores(model, mb, tags, mode: str, temperature: float):
    """The removed path: the whole (B, L, V) logits, then the loss tokens' log-probs and the
    entropy from a full softmax (what grpo.micro_batch_loss computed from logits before)."""
    import torch

    import attention

    logits = attention.structured_forward(model, mb.input_ids, mb.attention_mask,
                                          mb.prompt_lengths, tags, mode, dtype=torch.float32)
    selected = mb.loss_mask.bool()
    chosen = logits[:, :-1][selected]                                       # (N, V)
    targets = mb.input_ids[:, 1:][selected]
    logprobs = attention.token_logprobs(chosen, targets, temperature)
    with torch.no_grad():
        z = (chosen / temperature).float()
        entropy = torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)
    return logprobs, entropy


def child(path: str, length: int, chunk_tokens: int, repeats: int) -> dict:
    """One path at one length in this process: {"baseline", "peak", "seconds"} (bytes, bytes
    above the baseline, the best time of `repeats`)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    import attention
    import grpo
    from attention import TagIds

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**THIN))
    model.set_attn_implementation("sdpa")
    model.train()
    tags = TagIds(*TAG_IDS, newline=(NEWLINE_ID,), eos=EOS_ID)
    cfg = grpo.resolve_defaults(grpo.GRPOConfig(max_new_tokens=length - PROMPT_TOKENS,
                                                preset="tiny"))
    mb = micro_batch(length, THIN["vocab_size"])
    mb.loss_weights = mb.loss_mask                     # token-mean: w = 1 on every loss token
    denominator = float(mb.loss_mask.sum())
    high = grpo.stage_at(cfg, 1).clip_ratio_high
    baseline = rss_bytes()
    times = []
    for _ in range(repeats):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        if path == "full":
            logprobs, entropy = full_scores(model, mb, tags, cfg.mode, cfg.temperature)
        else:
            logprobs, entropy = attention.token_scores(model, mb, tags, cfg.mode,
                                                       mb.loss_mask.bool(), cfg.temperature,
                                                       chunk_tokens)
        loss, _ = grpo.micro_batch_loss(logprobs, entropy, mb, cfg, high, denominator)
        loss.backward()
        times.append(time.perf_counter() - t0)
        del logprobs, entropy, loss
    return {"baseline": baseline, "peak": peak_rss_bytes() - baseline, "seconds": min(times)}


def measure(path: str, length: int, chunk_tokens: int, repeats: int) -> dict:
    """`child` in a fresh subprocess (a clean peak RSS)."""
    command = [sys.executable, os.path.abspath(__file__), "--child", path, f"--lengths={length}",
               f"--chunk_tokens={chunk_tokens}", f"--repeats={repeats}"]
    out = subprocess.run(command, check=False, capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr else "failed"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def gb(result: dict, key: str) -> str:
    if "error" in result:
        return "-"
    return f"{result[key] / GB:.2f}"


def ratio(a: dict, b: dict, key: str) -> str:
    if "error" in a or "error" in b:
        return "-"
    return f"{a[key] / b[key]:.2f}x"


def seconds(result: dict) -> str:
    if "error" in result:
        return result["error"][:60]
    return f"{result['seconds']:.2f}"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="800,1600",
                        help="tokens per row, prompt included, comma-separated (both paths)")
    parser.add_argument("--chunked_only", default="",
                        help="lengths for the chunked path alone, comma-separated (e.g. 3300)")
    parser.add_argument("--chunk_tokens", type=int, default=None,
                        help="loss tokens per LM-head chunk (default attention.LOGIT_CHUNK_TOKENS)")
    parser.add_argument("--repeats", type=int, default=2, help="timed micro-batches per run")
    parser.add_argument("--child", choices=("full", "chunked"), default=None,
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.chunk_tokens is None:
        from attention import LOGIT_CHUNK_TOKENS
        args.chunk_tokens = LOGIT_CHUNK_TOKENS
    lengths = [int(x) for x in args.lengths.split(",") if x]
    if args.child:
        print(json.dumps(child(args.child, lengths[0], args.chunk_tokens, args.repeats)))
        return
    print(f"{ROWS} rows x L tokens ({PROMPT_TOKENS}-token prompt), thin Qwen3 {THIN}, chunk "
          f"{args.chunk_tokens} tokens, best of {args.repeats}, OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}")
    print("| L | loss tokens | full peak GB | chunked peak GB | full / chunked | full s | "
          "chunked s | chunked / full time |\n|---|---|---|---|---|---|---|---|")
    for length in lengths:
        full = measure("full", length, args.chunk_tokens, args.repeats)
        chunked = measure("chunked", length, args.chunk_tokens, args.repeats)
        print(f"| {length:,} | {ROWS * (length - PROMPT_TOKENS):,} | {gb(full, 'peak')} | "
              f"{gb(chunked, 'peak')} | {ratio(full, chunked, 'peak')} | {seconds(full)} | "
              f"{seconds(chunked)} | {ratio(chunked, full, 'seconds')} |", flush=True)
    for length in [int(x) for x in args.chunked_only.split(",") if x]:
        chunked = measure("chunked", length, args.chunk_tokens, args.repeats)
        print(f"| {length:,} | {ROWS * (length - PROMPT_TOKENS):,} | (not run) | "
              f"{gb(chunked, 'peak')} | - | - | {seconds(chunked)} | - |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
