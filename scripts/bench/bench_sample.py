"""Speed of the branching sampler on CPU (the README's table): python scripts/bench/bench_sample.py
(--attention: the second table alone)

One Markdown table: plain sampling (EOS masked) against `transformers` generate() at the same
budget, and Unseen against Seen with blocks forced by a logit bias (`TagBias`), best of 2 runs
each, random weights. A second table: one Unseen decode step (two queries a row, the whole cache
visible) of the same 20M model (grouped-query attention: 6 heads, 2 key/value heads) under the
sampler's folded queries (attention.folded_query_attention), under SDPA's enable_gqa (the
sampler's CPU path before the fold) and under transformers' repeat_kv (its choice under a mask
on CUDA, the sampler's GPU path before), the whole step and one layer's attention call alone,
best of DECODE_REPEATS, interleaved.
"""
import os
import sys
import time
from contextlib import contextmanager
from functools import partial

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))   # two folders up
sys.path.insert(0, ROOT)   # the core modules

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from attention import TagIds, folded_query_attention, folded_query_attention_for_sdpa
from sample import FIRST_PATH_OWNER, SHARED, SlotCache, generate

# The logit bias that forces blocks: <Parallel> likely, paths that run to their budget, summaries
# that end soon.
PARALLEL_BIAS = 2.0
END_PATH_BIAS = -30.0
END_SUMMARY_BIAS = 3.0
PROFILE_TOKENS = 128        # new tokens of the run that times the model's forward alone
DECODE_ROWS = 16            # the decode-step table: rows, queries a row (an Unseen block's paths),
DECODE_QUERIES = 2
DECODE_WIDTHS = (1_153, 3_513)   # cache widths: this bench's longest rows; the paper's 3,513 slots
DECODE_REPEATS = 10
GQA_FLAG = "TRANSFORMERS_SDPA_FORCE_GQA"    # 1: transformers passes enable_gqa; 0: repeat_kv
SHAPE_20M = {"hidden_size": 384, "num_hidden_layers": 12, "num_attention_heads": 6,
             "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 1152,
             "max_position_embeddings": 2048}


class TagBias(torch.nn.Module):
    """Adds a fixed bias to a model's logits: random weights rarely emit tags, so benchmarks and
    tests use it to get many blocks. The training forward sees the same bias, so log-probs stay
    exact."""

    def __init__(self, inner, bias: torch.Tensor):
        super().__init__()
        self.inner = inner
        self.register_buffer("bias", bias)

    def forward(self, **kw):
        out = self.inner(**kw)
        out.logits = out.logits + self.bias
        return out

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()


def model_20m(tok):
    """The tables' 20M Qwen3 (random weights; grouped-query attention: 6 heads, 2 key/value
    heads) for the tiny model's tokenizer."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from model import TINY_CONFIG

    config = Qwen3Config(**{**TINY_CONFIG, **SHAPE_20M}, vocab_size=len(tok),
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    return Qwen3ForCausalLM(config).eval()


def bench(batch: int = 16, repeats: int = 2):
    """Print one Markdown table: plain sampling (EOS masked) vs `transformers` generate() at the
    same budget, and Unseen vs Seen with blocks forced by a logit bias (best of `repeats` runs
    each)."""
    from model import load_model

    torch.manual_seed(0)
    tiny, tok = load_model("tiny", device="cpu")
    big = model_20m(tok)
    tags = TagIds.from_tokenizer(tok)
    prompts = [tok.encode(f"Problem {i}: Ava has {i} boxes of 7 pens.", add_special_tokens=False)
               for i in range(batch)]
    longest = max(map(len, prompts))
    ids = torch.tensor([[tok.pad_token_id] * (longest - len(p)) + p for p in prompts])
    am = (ids != tok.pad_token_id).long()

    def best(fn):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            res = fn()
            times.append(time.perf_counter() - t0)
        return min(times), res

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {batch}, random "
          "weights; blocks: <Parallel> likely, 2 paths that run to the path budget, up to 4 blocks")
    print("| model | new tokens | path budget | ours seq. tok/s | generate() tok/s | ratio "
          "| unseen s | seen s | unseen/seen | D/T |\n|---|---|---|---|---|---|---|---|---|---|")
    rows = (("tiny", tiny, 128, 24), ("20M", big, 128, 24), ("20M", big, 1024, 128))
    for name, m, n, path_budget in rows:
        t_ours, _ = best(partial(generate, m, tok, prompts, mode="sequential", allow_parallel=False,
                                 max_new_tokens=n, min_new_tokens=n, seed=0))
        t_hf, _ = best(partial(m.generate, input_ids=ids, attention_mask=am, do_sample=True,
                               max_new_tokens=n, min_new_tokens=n, pad_token_id=tok.pad_token_id))
        bias = torch.zeros(m.get_output_embeddings().weight.shape[0])
        bias[tags.parallel] = PARALLEL_BIAS
        bias[tags.end_path] = END_PATH_BIAS
        bias[tags.end_summary] = END_SUMMARY_BIAS
        biased = TagBias(m, bias)
        kw = dict(max_new_tokens=n, min_new_tokens=n, max_path_tokens=path_budget, seed=0)
        t_un, ru = best(partial(generate, biased, tok, prompts, mode="unseen", **kw))
        t_se, _ = best(partial(generate, biased, tok, prompts, mode="seen", **kw))
        dt = sum(r.critical_path for r in ru) / sum(r.num_tokens for r in ru)
        ours = batch * n / t_ours
        hf = batch * n / t_hf
        print(f"| {name} | {n} | {path_budget} | {ours:,.0f} | {hf:,.0f} | {ours / hf:.2f}x "
              f"| {t_un:.2f} | {t_se:.2f} | {t_un / t_se:.2f} | {dt:.2f} |", flush=True)
    # Where the time goes: both samplers run the same model forwards, which no sampler design
    # removes, so "ours / generate()" can be at most generate()'s total time over ours' forward
    # time.
    clock = {"start": 0.0, "forward": 0.0}

    def start_forward(*_):
        clock["start"] = time.perf_counter()

    def end_forward(*_):
        clock["forward"] += time.perf_counter() - clock["start"]

    big.register_forward_pre_hook(start_forward)
    big.register_forward_hook(end_forward)
    samplers = {
        "ours": partial(generate, big, tok, prompts, mode="sequential", allow_parallel=False,
                        max_new_tokens=PROFILE_TOKENS, min_new_tokens=PROFILE_TOKENS, seed=0),
        "generate()": partial(big.generate, input_ids=ids, attention_mask=am, do_sample=True,
                              max_new_tokens=PROFILE_TOKENS, min_new_tokens=PROFILE_TOKENS,
                              pad_token_id=tok.pad_token_id),
    }
    for label, fn in samplers.items():
        clock["forward"] = 0.0
        t0 = time.perf_counter()
        fn()
        total = time.perf_counter() - t0
        print(f"20M, {PROFILE_TOKENS} new tokens, {label}: {total:.2f} s, of which the model's "
              f"forward {clock['forward']:.2f} s ({clock['forward'] / total:.0%})", flush=True)
    bench_decode_attention(big)


@contextmanager
def transformers_gqa_flag(value: str):
    """TRANSFORMERS_SDPA_FORCE_GQA set to `value` inside: transformers' "sdpa" attention then
    passes enable_gqa to SDPA ("1") or repeats the key/value heads under a mask ("0")."""
    saved = os.environ.get(GQA_FLAG)
    os.environ[GQA_FLAG] = value
    try:
        yield
    finally:
        del os.environ[GQA_FLAG]
        if saved is not None:
            os.environ[GQA_FLAG] = saved


def decode_step_inputs(model, width: int) -> dict:
    """The keyword arguments of one Unseen decode step's forward: DECODE_ROWS rows of
    DECODE_QUERIES queries (one per path), each seeing the `width` - DECODE_QUERIES shared slots of
    a SlotCache (random keys and values, as a prefill would leave them) and its own."""
    config = model.config
    shape = (DECODE_ROWS, config.num_key_value_heads, width, config.head_dim)
    cache = SlotCache(DECODE_ROWS, width, "cpu")
    generator = torch.Generator().manual_seed(0)
    for _ in range(config.num_hidden_layers):
        cache.keys.append(torch.randn(shape, generator=generator))
        cache.values.append(torch.randn(shape, generator=generator))
    cache.owner.fill_(SHARED)
    cache.slots = torch.arange(width - DECODE_QUERIES, width).expand(DECODE_ROWS, -1)
    cache.attend_to(width)
    codes = FIRST_PATH_OWNER + torch.arange(DECODE_QUERIES).expand(DECODE_ROWS, -1)
    cache.owner[cache.row_ids, cache.slots] = codes
    ids = torch.randint(0, config.vocab_size, (DECODE_ROWS, DECODE_QUERIES), generator=generator)
    positions = torch.full((DECODE_ROWS, DECODE_QUERIES), width - DECODE_QUERIES)
    return dict(input_ids=ids, attention_mask=cache.mask(codes, torch.float32),
                position_ids=positions, cache=cache, use_cache=True)


def attention_call_choices(model, inputs: dict) -> dict:
    """One layer's attention call at the decode step of `inputs` (decode_step_inputs), as a
    function of no arguments per attention choice: the folded queries, and transformers' "sdpa"
    function with enable_gqa or with repeat_kv."""
    layer = model.model.layers[0].self_attn
    config = model.config
    cache = inputs["cache"]
    generator = torch.Generator().manual_seed(1)
    query = torch.randn(DECODE_ROWS, DECODE_QUERIES, config.num_attention_heads, config.head_dim,
                        generator=generator).transpose(1, 2)
    key = cache.keys[0][:, :, :cache.width]
    value = cache.values[0][:, :, :cache.width]
    mask = inputs["attention_mask"]

    def folded():
        folded_query_attention(layer, query, key, value, mask, scaling=layer.scaling)

    def transformers_sdpa(flag: str):
        with transformers_gqa_flag(flag):
            sdpa_attention_forward(layer, query, key, value, mask, scaling=layer.scaling)

    return {"folded": folded, "enable_gqa": partial(transformers_sdpa, "1"),
            "repeat_kv": partial(transformers_sdpa, "0")}


@torch.inference_mode()
def bench_decode_attention(model):
    """Print the decode-step table (module docstring): milliseconds a whole step and
    microseconds one layer's attention call take under each attention choice (best of
    DECODE_REPEATS, the choices interleaved), and the folded queries' time over enable_gqa's."""
    step_choices = {"folded": folded_query_attention_for_sdpa,
                    "enable_gqa": partial(transformers_gqa_flag, "1"),
                    "repeat_kv": partial(transformers_gqa_flag, "0")}
    config = model.config
    print(f"\n20M decode step, {DECODE_ROWS} rows x {DECODE_QUERIES} queries, "
          f"{config.num_attention_heads} heads / {config.num_key_value_heads} key-value heads, "
          f"best of {DECODE_REPEATS}; the step in ms, one layer's attention call in µs; "
          "folded (now) / enable_gqa (the CPU before) / repeat_kv (CUDA before):")
    print("| cache width | step, ms | folded / enable_gqa | attention call, µs "
          "| folded / enable_gqa |\n|---|---|---|---|---|")
    for width in DECODE_WIDTHS:
        inputs = decode_step_inputs(model, width)
        calls = attention_call_choices(model, inputs)
        step = {name: float("inf") for name in step_choices}
        call = {name: float("inf") for name in calls}
        for _ in range(DECODE_REPEATS):
            for name, choice in step_choices.items():
                with choice():
                    t0 = time.perf_counter()
                    model(**inputs)
                    step[name] = min(step[name], time.perf_counter() - t0)
                t0 = time.perf_counter()
                calls[name]()
                call[name] = min(call[name], time.perf_counter() - t0)
        steps = " / ".join(f"{1e3 * step[name]:.1f}" for name in step_choices)
        attention_calls = " / ".join(f"{1e6 * call[name]:.0f}" for name in calls)
        print(f"| {width:,} | {steps} | {step['folded'] / step['enable_gqa']:.2f} "
              f"| {attention_calls} | {call['folded'] / call['enable_gqa']:.2f} |", flush=True)


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        sys.exit(print(__doc__))   # print returns None: exit status 0
    if sys.argv[1:] == ["--attention"]:
        from model import load_model
        torch.manual_seed(0)
        bench_decode_attention(model_20m(load_model("tiny", device="cpu")[1]))
        sys.exit(0)
    if sys.argv[1:]:
        given = " ".join(sys.argv[1:])
        sys.exit(f"bench_sample.py takes no arguments but --attention (got {given}):\n{__doc__}")
    bench()
