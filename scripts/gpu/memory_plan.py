"""Memory plan (issues 28, 34): what one GPU holds for a GRPO or SFT run of this code, line by line.

    python scripts/gpu/memory_plan.py        # the paper's run: Qwen3-4B, 8 x 80 GB, FSDP2 (README)
    python scripts/gpu/memory_plan.py --tokenizer=<Qwen3's>  # ... at --data's longest prompt, read
    python scripts/gpu/memory_plan.py --eval_data= --largest=generate_batch_size  # the largest
                                                                              # that fits, its table
    python scripts/gpu/memory_plan.py --model=qwen3-0.6b --world_size=1 --gpu_gb=24 \\
        --generate_batch_size=2                                    # a student's 24 GB card
    python scripts/gpu/memory_plan.py --model=qwen3-0.6b --trainer=sft --world_size=1 --gpu_gb=24

--model: qwen3-4b or qwen3-0.6b (built-in shapes, offline), a folder with a config.json (a
checkpoint, or `hf download <name> config.json --local-dir <folder>`), a config.json
file, or a hub name already in the local Hugging Face cache. Every other --key=value is a field of
the trainer's config (grpo.GRPOConfig, sft.SFTConfig: see `python grpo.py --help`) over its preset
(--preset=paper or tiny: config.GRPO_PRESETS, config.SFT_PRESETS), resolved by the trainer's own
resolve_defaults. Without flags: 8 ranks of 80 GB (--world_size=8 --gpu_gb=80) and
--fsdp=True, the paper's run as the README plans it. The longest prompt is --prompt_tokens, else
measured on --data (and --eval_data) with --tokenizer (or --model's folder's), else DAPO-17k's
1,442 tokens, said on stderr. Below the GPU's table: the node's host memory at load.

Each line is a small function below that returns bytes; tests/test_memory_plan.py checks them
against what the code allocates at small shapes on CPU. GB = 10^9 bytes. The peak is the largest
of the phases (PyTorch's allocator reuses what one phase frees for the next): setup (the model as
loaded, whole, and the copies made from it), sampling (the KV cache), the in-run evaluation (its
own cache), training (activations, the loss's logits, the gradients), the optimizer step (AdamW's
temporary) and, with FSDP, the rollout copy's refresh and a checkpoint save. `--margin` (default
10%) is left for the CUDA context, allocator fragmentation and what no line counts. Qwen3 (and
Qwen2/Llama-style) dense models only.
"""
import argparse
import dataclasses
import os
import sys
from dataclasses import dataclass

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))   # two folders up
sys.path.insert(0, ROOT)   # the core modules

import config
import grpo
import sft
from eval import prompts_per_call

GB = 1e9
KIB = 1024
FP32 = 4                       # bytes per element
BF16 = 2
INT64 = 8
BOOL = 1
ADAM_MOMENTS = 2               # AdamW's exp_avg and exp_avg_sq, fp32 each
ADAM_STEP_BYTES = 4            # AdamW's `step`: one fp32 scalar tensor per parameter tensor
LOGIT_BUFFERS = 4              # (chunk, vocab) fp32 tensors alive at once in a chunk's backward
DECODE_LOGIT_BYTES = 21        # per query and vocab entry in a decode step (fp32 model output;
                               # 8 of them: draw_tokens' float64 cumulative distribution, on the
                               # host: on CUDA an overestimate)
DECODE_LOGIT_BYTES_CUDA = 15   # ... under autocast: the bf16 output and its fp32 copy
MASK_ALIGNMENT = 8             # CUDA memory-efficient SDPA copies a mask whose rows are not
                               # a multiple of 8 elements long (per call: per layer)
HEAD_GRADIENT_BYTES = {"fp32": 12, "autocast": 8, "bf16": 8}   # per (vocab x hidden) entry
FSDP_PREFETCHED_LAYERS = 2     # unsharded layers at once: the one running and the next
SCRATCH_SLOTS = 1              # sample.Engine.run: the slot of the dummy queries
ASSUMED_PROMPT_TOKENS = 1442   # DAPO-17k's longest prompt (the parallel template in Qwen3's
                               # chat template; median 226), measured with --tokenizer: what the
                               # plan assumes when it cannot read the data's own
DEFAULT_MARGIN = 0.10          # the CUDA context, what no line counts, and fragmentation: small
                               # with expandable segments (plumbing.use_expandable_segments)
HOST_LOAD_FACTOR = 1.5         # host bytes a rank holds while it loads a bf16 checkpoint (a hub
                               # model) in fp32, per fp32 parameter byte: the fp32 copy and the
                               # mapped file (scripts/bench/bench_load.py, 2 gloo ranks: 1.50, 1.52;
                               # an fp32 checkpoint stays mapped, shared by the ranks: 0.05)
DEFAULT_GPU_GB = 80.0
DEFAULT_WORLD_SIZE = 8         # the paper's run: one node of 8 GPUs ...
DEFAULT_FLAGS = ("--fsdp=True",)   # ... sharded by FSDP2 (a trainer flag the plan adds if unset)
RMS_NORMS_PER_LAYER = 2        # input_layernorm, post_attention_layernorm
LINEARS_PER_LAYER = 7          # q, k, v, o, gate, up, down
QK_NORMS = 2                   # Qwen3: q_norm, k_norm (per head)
ATTENTION_CASTS = 3            # autocast: q, k and v projections each cast the norm's output
MLP_CASTS = 2                  # ... and gate, up
MLP_SAVED = 4                  # SiLU's input, its output, up's output, the product (down's input)
SDPA_SAVED = 4                 # query, repeated key, repeated value, output
GATHERED_BYTES = FP32          # FSDP refresh: each parameter gathered whole, in fp32
SINGLE_TENSOR_TEMPORARIES = 2  # AdamW on CPU, per parameter: sqrt(exp_avg_sq), then / bias corr.

BUILTIN = {
    "qwen3-4b": dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, intermediate_size=9728,
                     vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=40960),
    "qwen3-0.6b": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, intermediate_size=3072,
                       vocab_size=151936, tie_word_embeddings=True,
                       max_position_embeddings=40960),
}
QK_NORM_MODELS = ("qwen3",)
QKV_BIAS_MODELS = ("qwen2",)


# ---------------------------------------------------------------------------------------------
# The model's shape


@dataclass(frozen=True)
class ModelShape:
    """What the memory depends on: a dense decoder's dimensions."""
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool                  # the LM head is the input embedding
    context: int                # max_position_embeddings
    qk_norm: bool = True        # Qwen3's per-head RMSNorm of queries and keys
    qkv_bias: bool = False      # Qwen2's q, k, v biases

    @property
    def q_width(self) -> int:
        """Features of all query heads (= of the attention output)."""
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Features of all key (or value) heads."""
        return self.kv_heads * self.head_dim


def shape_from_config(name: str, cfg) -> ModelShape:
    """A ModelShape from a transformers config object (its defaults fill what config.json left
    out)."""
    text = getattr(cfg, "text_config", None) or cfg
    heads = text.num_attention_heads
    model_type = getattr(text, "model_type", "")
    return ModelShape(
        name=name, layers=text.num_hidden_layers, hidden=text.hidden_size, heads=heads,
        kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
        intermediate=text.intermediate_size, vocab=text.vocab_size,
        tied=bool(getattr(text, "tie_word_embeddings", False)),
        context=getattr(text, "max_position_embeddings", None) or sft.DEFAULT_MAX_LENGTH,
        qk_norm=model_type in QK_NORM_MODELS,
        qkv_bias=model_type in QKV_BIAS_MODELS or bool(getattr(text, "attention_bias", False)))


def load_config(name: str):
    """The transformers config of a built-in name, a folder with config.json, a config.json, or a
    hub name in the local Hugging Face cache. OSError saying what to pass when there is none."""
    from transformers import AutoConfig, Qwen3Config

    if name in BUILTIN:
        return Qwen3Config(**BUILTIN[name])
    try:
        return AutoConfig.from_pretrained(name, local_files_only=True)
    except Exception:
        raise OSError(f"--model={name!r}: no config.json found (not a built-in name "
                      f"({', '.join(BUILTIN)}), a folder or file, or a hub name in the local "
                      "cache). Fetch only the config: hf download <name> config.json "
                      "--local-dir <folder>, then pass the folder") from None


def load_shape(name: str) -> ModelShape:
    """The shape of what load_config reads."""
    return shape_from_config(name, load_config(name))


def layer_linear_params(s: ModelShape) -> int:
    """Weights of one decoder layer's seven projections (and q/k/v biases), in elements."""
    attention = s.hidden * (s.q_width + 2 * s.kv_width) + s.q_width * s.hidden
    bias = 0
    if s.qkv_bias:
        bias = s.q_width + 2 * s.kv_width
    return attention + bias + 3 * s.hidden * s.intermediate


def layer_params(s: ModelShape) -> int:
    """Parameters of one decoder layer (projections and norms), in elements."""
    norms = RMS_NORMS_PER_LAYER * s.hidden
    if s.qk_norm:
        norms += QK_NORMS * s.head_dim
    return layer_linear_params(s) + norms


def head_params(s: ModelShape) -> int:
    """Parameters outside the layers: the embedding, the final norm, an untied LM head."""
    untied_head = 0
    if not s.tied:
        untied_head = s.vocab * s.hidden
    return s.vocab * s.hidden + s.hidden + untied_head


def parameter_count(s: ModelShape) -> int:
    """Parameters of the whole model, in elements."""
    return s.layers * layer_params(s) + head_params(s)


def parameter_tensors(s: ModelShape) -> int:
    """Parameter tensors of the model (AdamW keeps one `step` scalar per tensor)."""
    per_layer = LINEARS_PER_LAYER + RMS_NORMS_PER_LAYER
    if s.qk_norm:
        per_layer += QK_NORMS
    if s.qkv_bias:
        per_layer += 3
    outside = 2                               # embedding, final norm
    if not s.tied:
        outside += 1
    return s.layers * per_layer + outside


# ---------------------------------------------------------------------------------------------
# Training state: what every phase holds


def weights_bytes(s: ModelShape, world_size: int = 1, fsdp: bool = False) -> int:
    """fp32 master weights on one rank: whole, or 1/world_size under FSDP2, in bytes."""
    shards = world_size if fsdp else 1
    return parameter_count(s) * FP32 // shards


def gradient_bytes(s: ModelShape, world_size: int = 1, fsdp: bool = False) -> int:
    """fp32 gradients on one rank (from the first backward to the optimizer step), in bytes:
    sharded like the weights under FSDP2 also while micro-batches accumulate, since
    plumbing.grad_sync reduce-scatters every micro-batch's (FSDP2's no-sync would hold
    loaded_weights_bytes of them)."""
    return weights_bytes(s, world_size, fsdp)


def loaded_weights_bytes(s: ModelShape) -> int:
    """Setup: every rank loads the whole model in fp32 (plumbing.load_run) before FSDP2 shards
    it, in bytes."""
    return parameter_count(s) * FP32


def host_load_bytes(s: ModelShape, ranks_at_once: int = 1) -> int:
    """A node's host memory while its ranks load the model (plumbing.load_run): each loading
    rank holds the fp32 model and the mapped bf16 file (HOST_LOAD_FACTOR) until the model is on
    its GPU; plumbing.load_in_turns lets one rank of a node load at a time. In bytes."""
    return int(HOST_LOAD_FACTOR * loaded_weights_bytes(s)) * ranks_at_once


def adamw_temporary_bytes(s: ModelShape, world_size: int = 1, fsdp: bool = False,
                          cuda: bool = True) -> int:
    """AdamW's step beyond its state, in bytes: torch's multi-tensor (foreach) AdamW, the default
    on CUDA, takes the square root of every exp_avg_sq at once (one fp32 tensor per parameter,
    sharded like the weights); on CPU it goes one parameter at a time, holding the square root
    and its quotient by the bias correction of the largest (the embedding)."""
    if cuda:
        return weights_bytes(s, world_size, fsdp)
    shards = world_size if fsdp else 1
    return SINGLE_TENSOR_TEMPORARIES * s.vocab * s.hidden * FP32 // shards


def ddp_bucket_bytes(s: ModelShape, world_size: int = 1, fsdp: bool = False) -> int:
    """DDP's gradient buckets (a flat copy of every gradient; several ranks, no FSDP), in
    bytes."""
    if fsdp or world_size == 1:
        return 0
    return parameter_count(s) * FP32


def adam_state_bytes(s: ModelShape, world_size: int = 1, fsdp: bool = False) -> int:
    """AdamW's exp_avg and exp_avg_sq (fp32, sharded like the weights) and its step scalars, in
    bytes."""
    shards = world_size if fsdp else 1
    moments = ADAM_MOMENTS * parameter_count(s) * FP32 // shards
    return moments + parameter_tensors(s) * ADAM_STEP_BYTES


def rollout_copy_bytes(s: ModelShape, fsdp: bool, cuda: bool = True) -> int:
    """grpo.setup's plain copy of the whole model for the sampler under FSDP (model.frozen_copy:
    bf16 on CUDA, cast parameter by parameter), in bytes; 0 without FSDP (the sampler runs on
    the training model)."""
    if not fsdp:
        return 0
    per_param = FP32
    if cuda:
        per_param = BF16
    return parameter_count(s) * per_param


def kl_reference_bytes(s: ModelShape, kl_coef: float, fsdp: bool = False,
                       cuda: bool = True) -> int:
    """The frozen KL reference (kl_coef > 0): a whole, unsharded copy in the dtype the policy's
    forward computes in (plumbing.compute_dtype: bf16 under FSDP on CUDA, else fp32), in
    bytes."""
    if kl_coef <= 0:
        return 0
    per_param = FP32
    if fsdp and cuda:
        per_param = BF16
    return parameter_count(s) * per_param


def gathered_parameter_bytes(s: ModelShape, fsdp: bool) -> int:
    """FSDP's refresh of the rollout copy (plumbing.sync_rollout_model): every rank gathers one fp32
    parameter at a time and copies it in; a checkpoint save (plumbing.Run.save: full state dicts
    offloaded to the CPU) gathers one parameter or AdamW moment at a time. The largest is the
    embedding's. In bytes (the save's figure not tested: CUDA and FSDP only)."""
    if not fsdp:
        return 0
    return s.vocab * s.hidden * GATHERED_BYTES


# ---------------------------------------------------------------------------------------------
# Sampling: the KV cache and what a decode step adds


def compute_regime(device: str, fsdp: bool) -> str:
    """How the forward computes: "fp32" (CPU), "autocast" (CUDA, fp32 weights under bf16
    autocast: no FSDP) or "bf16" (CUDA, FSDP2's bf16 parameters, or the bf16 rollout copy)."""
    if device != "cuda":
        return "fp32"
    if fsdp:
        return "bf16"
    return "autocast"


def cache_element_bytes(regime: str) -> tuple[int, int]:
    """(bytes per key element, per value element) of the sampler's cache: SlotCache allocates in
    the dtype of the keys and values the model produces. An fp32 model under bf16 autocast
    produces fp32 keys (the fp32 k_norm weight, or fp32 rotary tables, promote them) and bf16
    values."""
    if regime == "fp32":
        return FP32, FP32
    if regime == "autocast":
        return FP32, BF16
    return BF16, BF16


def kv_cache_bytes(s: ModelShape, rows: int, capacity: int, key_bytes: int = BF16,
                   value_bytes: int = BF16) -> int:
    """sample.SlotCache at its size (allocated once per generate call): per layer, keys and values
    (rows, kv_heads, capacity, head_dim), plus the int64 owner table (rows, capacity), in
    bytes."""
    per_slot = s.layers * s.kv_width * (key_bytes + value_bytes)
    return rows * capacity * per_slot + rows * capacity * INT64


def cache_capacity(prompt_tokens: int, max_new_tokens: int) -> int:
    """Slots per row: the longest prompt of the call + the budget + the scratch slot."""
    return prompt_tokens + max_new_tokens + SCRATCH_SLOTS


def sampling_prompts(cfg, world_size: int) -> int:
    """Prompts in one of a rank's GRPO generate calls: generate_batch_size (0 = all), at most the
    rank's batch_size / world_size."""
    per_rank = cfg.batch_size // world_size
    if cfg.generate_batch_size:
        return min(cfg.generate_batch_size, per_rank)
    return per_rank


def eval_prompts(cfg, world_size: int) -> int:
    """Problems in one of the in-run evaluation's generate calls: as many rows as a rollout call
    (eval.prompts_per_call x group_size) // eval_k, at least 1; each gets eval_k rows."""
    rows = prompts_per_call(cfg, world_size) * cfg.group_size
    return max(1, rows // cfg.eval_k)


def decode_queries(mode: str, num_paths: int) -> int:
    """Queries per row in a decode step at most: one per open path in an Unseen block."""
    if mode == "unseen":
        return num_paths
    return 1


def decode_attention_copy_bytes(s: ModelShape, rows: int, capacity: int, queries: int,
                                regime: str) -> int:
    """On CUDA, what one layer's attention copies at a decode step at the full width, in bytes:
    the mask folded for the query groups of grouped-query attention (rows x heads/kv_heads x
    queries x width, attention.folded_query_attention; no key or value is repeated) and the
    memory-efficient kernel's aligned copy of it (mask_copy_bytes), plus autocast's bf16 copy
    of fp32 keys. Not tested (CPU SDPA copies neither; the fold is: tests/test_gpu_path.py)."""
    if regime == "fp32":
        return 0
    groups = s.heads // s.kv_heads
    mask_bytes = FP32                    # the mask in the sampler's dtype: the fp32 model's
    if regime == "bf16":
        mask_bytes = BF16
    folded_mask = rows * groups * queries * capacity * mask_bytes
    cast = 0
    if regime == "autocast":
        cast = rows * s.kv_width * capacity * BF16
    return 2 * folded_mask + cast


def decode_logit_bytes(s: ModelShape, prompts: int, rows: int, queries: int,
                       regime: str) -> int:
    """The (queries, vocab) tensors of one decode step at their peak (the model's logits, the ban
    mask, the masked and the temperature-divided logits), the first step's (rows, vocab) logits
    and the prefill's (prompts, vocab), which live through the whole call, in bytes."""
    per_entry = DECODE_LOGIT_BYTES
    held = FP32
    if regime != "fp32":
        per_entry = DECODE_LOGIT_BYTES_CUDA
        held = BF16
    return s.vocab * (rows * queries * per_entry + rows * FP32 + prompts * held)


def prefill_bytes(s: ModelShape, prompts: int, prompt_tokens: int, regime: str) -> int:
    """The prompts' forward without gradients, one layer at a time (an estimate, not tested): the
    residual stream, q (and its folded copy), k, v and the attention's output, the MLP's three
    intermediates, the (prompts, 1, L, L) mask and its copy folded for the query groups
    (attention.folded_query_attention), in bytes."""
    act = BF16
    if regime == "fp32":
        act = FP32
    tokens = prompts * prompt_tokens
    attention = (3 * s.q_width + 2 * s.kv_width) * act
    mlp = 3 * s.intermediate * act
    groups = s.heads // s.kv_heads
    mask = (1 + groups) * prompts * prompt_tokens * prompt_tokens * act
    return tokens * (2 * s.hidden * FP32 + attention + mlp) + mask


def autocast_weight_cache_bytes(s: ModelShape, regime: str) -> int:
    """Autocast keeps a bf16 copy of every fp32 weight a matmul reads for as long as its context
    lasts (a whole generate call): the layers' projections and the LM head, in bytes; only for
    an fp32 model under autocast."""
    if regime != "autocast":
        return 0
    return (s.layers * layer_linear_params(s) + s.vocab * s.hidden) * BF16


# ---------------------------------------------------------------------------------------------
# Training: activations, the loss's logits, the LM head's gradient, FSDP's buffers


def layer_activation_bytes(s: ModelShape, tokens: int, regime: str) -> int:
    """What autograd saves for the backward in one decoder layer (no checkpointing), for `tokens`
    = rows x length, in bytes: per RMSNorm its input, the normalised input and what the
    projections read (autocast: one bf16 cast per projection), q and k before and after their
    norms, SDPA's query, repeated key and value, output and log-sum-exp, the MLP's four
    intermediates, the norms' reciprocal RMS."""
    if regime == "fp32":
        norms = RMS_NORMS_PER_LAYER * 3 * s.hidden * FP32
        qk_norm = 2 * (s.q_width + s.kv_width) * FP32
        sdpa = SDPA_SAVED * s.q_width * FP32
        mlp = MLP_SAVED * s.intermediate * FP32
    elif regime == "autocast":
        norms = (RMS_NORMS_PER_LAYER * 2 * s.hidden * FP32
                 + (ATTENTION_CASTS + MLP_CASTS) * s.hidden * BF16)
        qk_norm = (s.q_width + s.kv_width) * (FP32 + BF16)
        sdpa = SDPA_SAVED * s.q_width * BF16
        mlp = MLP_SAVED * s.intermediate * BF16
    else:
        norms = RMS_NORMS_PER_LAYER * s.hidden * (FP32 + 2 * BF16)
        qk_norm = (s.q_width + s.kv_width) * (FP32 + BF16)
        sdpa = SDPA_SAVED * s.q_width * BF16
        mlp = MLP_SAVED * s.intermediate * BF16
    rsqrt = RMS_NORMS_PER_LAYER
    if s.qk_norm:
        rsqrt += s.heads + s.kv_heads
    else:
        qk_norm = 0
    logsumexp = s.heads * FP32
    return tokens * (norms + qk_norm + sdpa + mlp + rsqrt * FP32 + logsumexp)


def layer_input_bytes(s: ModelShape, tokens: int, regime: str) -> int:
    """Under gradient checkpointing, what a decoder layer keeps until its backward: its input
    hidden states (fp32 unless the parameters are bf16), in bytes."""
    per_value = FP32
    if regime == "bf16":
        per_value = BF16
    return tokens * s.hidden * per_value


def outside_activation_bytes(s: ModelShape, rows: int, length: int, loss_tokens: int,
                             regime: str) -> int:
    """What the training forward saves outside the layers, in bytes: the (rows, 1, L, L) additive
    mask, the rotary cos and sin, the final norm's input and normalised input, the loss tokens'
    hidden states (what the LM-head chunks recompute from), the token ids and targets."""
    tokens = rows * length
    mask_bytes = FP32
    hidden_bytes = FP32
    rotary_bytes = FP32
    final_norm = 2 * s.hidden * FP32
    if regime != "fp32":
        mask_bytes = BF16
    if regime == "bf16":
        hidden_bytes = BF16
        rotary_bytes = BF16
        final_norm = s.hidden * (FP32 + BF16)
    mask = rows * length * length * mask_bytes
    rotary = 2 * tokens * s.head_dim * rotary_bytes
    norm = tokens * (final_norm + FP32)
    selected = loss_tokens * (s.hidden * hidden_bytes + INT64)
    ids = tokens * INT64 + rows * (length - 1) * BOOL
    return mask + rotary + norm + selected + ids


def mask_copy_bytes(s: ModelShape, rows: int, length: int, regime: str) -> int:
    """On CUDA, memory-efficient SDPA pads a mask whose rows are not a multiple of 8 long (torch's
    preprocess_mask) and saves the copy for the backward: per layer, in bytes (not tested: CPU
    SDPA does not copy)."""
    if regime == "fp32" or length % MASK_ALIGNMENT == 0:
        return 0
    padded = length + MASK_ALIGNMENT - length % MASK_ALIGNMENT
    return rows * length * padded * BF16


def activation_bytes(s: ModelShape, rows: int, length: int, loss_tokens: int, regime: str,
                     checkpointing: bool) -> int:
    """The training forward's activations of one micro-batch (rows x length tokens) at the start
    of its backward, in bytes. With gradient checkpointing: every layer's input (and the position
    ids), plus one layer's activations recomputed in the backward (the recompute window)."""
    tokens = rows * length
    one_layer = layer_activation_bytes(s, tokens, regime) + mask_copy_bytes(s, rows, length,
                                                                           regime)
    outside = outside_activation_bytes(s, rows, length, loss_tokens, regime)
    if checkpointing:                 # the layers' keyword arguments also keep the position ids
        kept = s.layers * layer_input_bytes(s, tokens, regime) + tokens * INT64
        return kept + one_layer + outside
    return s.layers * one_layer + outside


def autocast_weight_copy_bytes(s: ModelShape, regime: str) -> int:
    """fp32 weights under autocast: the bf16 copies of the layers' projections (saved by their
    matmuls for the backward, and held by autocast's cache to the end of the forward also under
    checkpointing) and the LM head's (in a chunk's recompute), in bytes."""
    if regime != "autocast":
        return 0
    return (s.layers * layer_linear_params(s) + s.vocab * s.hidden) * BF16


def logit_chunk_bytes(chunk_tokens: int, vocab: int) -> int:
    """The loss's logits: one chunk's (chunk, vocab) fp32 tensors at their peak, in the chunk's
    backward (LOGIT_BUFFERS of them, as tests/test_memory_plan.py counts what attention.head_scores
    holds: the recomputed logits, token_logprobs' scaled copy, and the gradients of logsumexp and
    the gather), in bytes."""
    return LOGIT_BUFFERS * chunk_tokens * vocab * FP32


def head_gradient_bytes(s: ModelShape, regime: str) -> int:
    """The tied LM head's and embedding's weight gradients beyond the fp32 .grad (counted with the
    gradients), at their peak in the backward, in bytes: each chunk's (vocab, hidden) gradient,
    the embedding's dense one and the sums that add them up (fp32: three; autocast: a bf16 one,
    its fp32 copy and a sum; bf16 parameters, FSDP's: four bf16, the unsharded .grad
    included)."""
    return s.vocab * s.hidden * HEAD_GRADIENT_BYTES[regime]


def fsdp_buffer_bytes(s: ModelShape, regime: str) -> int:
    """FSDP2 with bf16 compute (an estimate, not tested): the root's unsharded bf16 parameters
    (embedding, norm, untied head: kept from the forward to the backward), two layers' unsharded
    bf16 parameters (the running one and the prefetched one) and one layer's unsharded gradient
    (bf16, then fp32 for the reduce-scatter), in bytes."""
    if regime != "bf16":
        return 0
    layers = FSDP_PREFETCHED_LAYERS * layer_params(s) * BF16
    gradient = layer_params(s) * (BF16 + FP32)
    return head_params(s) * BF16 + layers + gradient


# ---------------------------------------------------------------------------------------------
# The plan


@dataclass
class Setting:
    """A run to plan: the trainer, its resolved config, the machine."""
    shape: ModelShape
    trainer: str                     # "grpo" or "sft"
    cfg: object                      # grpo.GRPOConfig or sft.SFTConfig, presets filled
    world_size: int = 1
    device: str = "cuda"
    gpu_gb: float = DEFAULT_GPU_GB
    margin: float = DEFAULT_MARGIN
    prompt_tokens: int = ASSUMED_PROMPT_TOKENS
    prompt_source: str = "given"     # how prompt_tokens was found (longest_prompt)


PHASES = ("setup", "sampling", "evaluation", "training", "optimizer step", "refresh",
          "checkpoint save")
ALWAYS = PHASES
AFTER_SETUP = PHASES[1:]               # what setup leaves: the sharded state
GRADIENT_PHASES = ("training", "optimizer step")   # from the first backward to the step
NOT_COUNTED = ()


@dataclass
class Line:
    """One line of the plan: bytes on one GPU, and the phases that hold them."""
    what: str
    phases: tuple                    # of PHASES; () = shown, not counted
    how: str                         # the numbers behind it
    bytes: int

    @property
    def phase(self) -> str:
        """The phases in words: "always", "after setup", "not counted", or their names."""
        if self.phases == ALWAYS:
            return "always"
        if self.phases == AFTER_SETUP:
            return "after setup"
        if self.phases == NOT_COUNTED:
            return "not counted"
        return ", ".join(self.phases)


def training_shape(st: Setting) -> tuple[int, int, int]:
    """(rows, length, loss tokens) of the largest training micro-batch: micro_batch_size rows
    (fewer under micro_batch_tokens) of the longest prompt + the budget (GRPO) or max_length
    (SFT); every response token in the loss."""
    cfg = st.cfg
    if st.trainer == "grpo":
        length = st.prompt_tokens + cfg.max_new_tokens
    else:
        length = cfg.max_length or min(sft.DEFAULT_MAX_LENGTH, st.shape.context)
    rows = cfg.micro_batch_size
    if getattr(cfg, "micro_batch_tokens", 0):
        rows = max(1, min(rows, cfg.micro_batch_tokens // length))
    loss_tokens = rows * max(1, length - st.prompt_tokens)
    return rows, length, loss_tokens


def sampler_lines(st: Setting, regime: str, phase: str, prompts: int, group: int) -> list[Line]:
    """The KV cache, the decode step's and the prefill's transients of generate calls of
    `prompts` prompts x `group` rows each."""
    s = st.shape
    cfg = st.cfg
    rows = prompts * group
    capacity = cache_capacity(st.prompt_tokens, cfg.max_new_tokens)
    key_bytes, value_bytes = cache_element_bytes(regime)
    per_slot = s.layers * s.kv_width * (key_bytes + value_bytes)
    queries = decode_queries(cfg.mode, cfg.num_paths)
    decode = (decode_attention_copy_bytes(s, rows, capacity, queries, regime)
              + decode_logit_bytes(s, prompts, rows, queries, regime))
    prefill = prefill_bytes(s, prompts, st.prompt_tokens, regime)
    return [
        Line(f"KV cache ({phase})", (phase,),
             f"{prompts} prompts x {group} = {rows} rows x {capacity:,} slots x "
             f"{per_slot / KIB:.0f} KiB", kv_cache_bytes(s, rows, capacity, key_bytes,
                                                         value_bytes)),
        Line(f"decode step or prefill ({phase})", (phase,),
             f"max(decode {decode / GB:.2f}, prefill {prefill / GB:.2f}); {queries} "
             "query/row", max(decode, prefill)),
    ]


def plan(st: Setting) -> list[Line]:
    """Every line of the setting's memory on one GPU."""
    s = st.shape
    cfg = st.cfg
    ws = st.world_size
    fsdp = cfg.fsdp
    cuda = st.device == "cuda"
    regime = compute_regime(st.device, fsdp)
    n = parameter_count(s)
    share = "whole"
    if fsdp:
        share = f"1/{ws}"
    copy_dtype = "fp32"
    if regime == "bf16":
        copy_dtype = "bf16"
    adam_how = "every parameter at once"
    if not cuda:
        adam_how = "the largest parameter, twice"
    lines = [
        Line("the model as loaded (fp32)", ("setup",), f"{n / 1e9:.3f}B x 4 B, whole, each rank",
             loaded_weights_bytes(s)),
        Line("weights (fp32)", AFTER_SETUP, f"{n / 1e9:.3f}B x 4 B, {share}",
             weights_bytes(s, ws, fsdp)),
        Line("AdamW exp_avg, exp_avg_sq (fp32)", AFTER_SETUP, f"2 x 4 B x params, {share}",
             adam_state_bytes(s, ws, fsdp)),
        Line("gradients (fp32)", GRADIENT_PHASES, f"4 B x params, {share}",
             gradient_bytes(s, ws, fsdp)),
        Line("DDP gradient buckets", AFTER_SETUP, "4 B x params (several ranks, no FSDP)",
             ddp_bucket_bytes(s, ws, fsdp)),
        Line("AdamW's temporary (optimizer step)", ("optimizer step",),
             f"sqrt(exp_avg_sq), {adam_how}, {share}", adamw_temporary_bytes(s, ws, fsdp, cuda)),
    ]
    if st.trainer == "grpo":
        lines.append(Line("rollout copy (FSDP)", ALWAYS, f"the whole model, {copy_dtype}",
                          rollout_copy_bytes(s, fsdp, cuda)))
        lines.append(Line("KL reference", ALWAYS,
                          f"kl_coef {cfg.kl_coef:g}: whole, {copy_dtype}",
                          kl_reference_bytes(s, cfg.kl_coef, fsdp, cuda)))
        lines += sampler_lines(st, regime, "sampling", sampling_prompts(cfg, ws), cfg.group_size)
        if cfg.eval_data:
            lines += sampler_lines(st, regime, "evaluation", eval_prompts(cfg, ws), cfg.eval_k)
        lines.append(Line("autocast's bf16 weights (sampling)", ("sampling", "evaluation"),
                          "fp32 model under autocast", autocast_weight_cache_bytes(s, regime)))
        lines.append(Line("one gathered parameter (FSDP refresh)", ("refresh",),
                          "the largest, the embedding, in fp32",
                          gathered_parameter_bytes(s, fsdp)))
    lines.append(Line("one gathered tensor (FSDP checkpoint save)", ("checkpoint save",),
                      "the largest, the embedding or its AdamW moment, in fp32",
                      gathered_parameter_bytes(s, fsdp)))
    rows, length, loss_tokens = training_shape(st)
    ckpt = cfg.grad_checkpointing
    chunk = min(cfg.logit_chunk_tokens, loss_tokens)
    for on in (False, True):
        phases = NOT_COUNTED
        if on == ckpt:
            phases = ("training",)
        label = "with" if on else "without"
        lines.append(Line(f"activations, {label} grad checkpointing", phases,
                          f"{rows} rows x {length:,} tokens, {regime}",
                          activation_bytes(s, rows, length, loss_tokens, regime, on)))
    lines += [
        Line("autocast's bf16 weight copies (training)", ("training",),
             "saved by the matmuls (no FSDP)", autocast_weight_copy_bytes(s, regime)),
        Line("loss logits (one chunk)", ("training",),
             f"{LOGIT_BUFFERS} x {chunk:,} x {s.vocab:,} x 4 B", logit_chunk_bytes(chunk, s.vocab)),
        Line("LM-head and embedding gradients", ("training",),
             f"{s.vocab:,} x {s.hidden:,}, transient", head_gradient_bytes(s, regime)),
        Line("FSDP unsharded buffers", ("training",), "root + 2 layers bf16, 1 layer's grads",
             fsdp_buffer_bytes(s, regime)),
    ]
    return [line for line in lines if line.bytes or line.phases == NOT_COUNTED]


def phase_totals(lines: list[Line]) -> dict:
    """Bytes per phase: the lines that hold memory in it. A phase is shown when a line of its
    own (not one held after setup, or always) is in the plan."""
    totals = {}
    for phase in PHASES:
        held = [line for line in lines if phase in line.phases]
        own = [line for line in held if not set(AFTER_SETUP) <= set(line.phases)]
        if own:
            totals[phase] = sum(line.bytes for line in held)
    return totals


def budget_bytes(st: Setting) -> float:
    """What the plan may use: the GPU's GB less the margin, in bytes."""
    return st.gpu_gb * GB * (1 - st.margin)


def fits(st: Setting) -> bool:
    """Whether the plan's peak phase is within the budget."""
    return max(phase_totals(plan(st)).values()) <= budget_bytes(st)


def verdict(st: Setting) -> str:
    """The plan's answer in one line: its peak phase, and whether it fits the budget."""
    totals = phase_totals(plan(st))
    peak_phase = max(totals, key=totals.get)
    peak = totals[peak_phase]
    budget = budget_bytes(st)
    answer = "fits"
    if peak > budget:
        answer = "does NOT fit"
    return (f"peak {peak / GB:.2f} GB ({peak_phase}): {answer} in {budget / GB:.2f} GB "
            f"({st.gpu_gb:g} GB less a {st.margin:.0%} margin for the CUDA context, buffers "
            "and fragmentation, which expandable_segments keeps small: plumbing sets it)")


def describe(st: Setting) -> str:
    """The setting in one line."""
    s = st.shape
    cfg = st.cfg
    regime = compute_regime(st.device, cfg.fsdp)
    sharding = "no FSDP"
    if cfg.fsdp:
        sharding = "FSDP2"
    parts = [f"{s.name} ({parameter_count(s) / 1e9:.2f}B parameters)", f"{st.trainer}",
             f"{st.world_size} rank(s), {st.device}, {sharding} ({regime})",
             f"grad_checkpointing={cfg.grad_checkpointing}",
             f"micro_batch_size={cfg.micro_batch_size}",
             f"logit_chunk_tokens={cfg.logit_chunk_tokens}"]
    if st.trainer == "grpo":
        parts += [f"{cfg.batch_size} prompts x {cfg.group_size}",
                  f"generate_batch_size={cfg.generate_batch_size}",
                  f"max_new_tokens={cfg.max_new_tokens}", f"mode={cfg.mode}",
                  f"longest prompt {st.prompt_tokens} ({st.prompt_source})"]
    return ", ".join(parts)


def table(st: Setting) -> str:
    """The plan as two Markdown tables, its lines and what each phase holds, and whether it
    fits."""
    lines = plan(st)
    out = [describe(st), "", "| what | phase | how | GB |", "|---|---|---|---|"]
    for line in lines:
        out.append(f"| {line.what} | {line.phase} | {line.how} | {line.bytes / GB:.2f} |")
    totals = phase_totals(lines)
    out += ["", "| phase | per GPU, GB |", "|---|---|"]
    for phase, total in totals.items():
        out.append(f"| {phase} | {total / GB:.2f} |")
    out.append(f"| budget: {st.gpu_gb:g} GB less {st.margin:.0%} | {budget_bytes(st) / GB:.2f} |")
    out.append("")
    out.append(verdict(st))
    if st.device == "cuda":
        out.append(f"host memory at load: {host_load_bytes(st.shape) / GB:.2f} GB on the node "
                   f"(its ranks load in turn; {st.world_size} at once: "
                   f"{host_load_bytes(st.shape, st.world_size) / GB:.2f} GB)")
    return "\n".join(out)


SEARCHABLE = ("generate_batch_size", "micro_batch_size", "logit_chunk_tokens", "batch_size")


def search_limit(st: Setting, field: str) -> int:
    """The largest value worth trying for `field`."""
    cfg = st.cfg
    if field == "generate_batch_size":
        return cfg.batch_size // st.world_size
    if field == "micro_batch_size":
        return cfg.batch_size * getattr(cfg, "group_size", 1) // st.world_size
    if field == "logit_chunk_tokens":
        return training_shape(st)[2]
    return cfg.batch_size


def largest_fitting(st: Setting, field: str) -> int | None:
    """The largest value of an integer config field (SEARCHABLE) with which the plan fits, or
    None."""
    best = None
    for value in range(1, search_limit(st, field) + 1):
        if field == "batch_size" and value % st.world_size:
            continue
        trial = dataclasses.replace(st, cfg=dataclasses.replace(st.cfg, **{field: value}))
        if fits(trial):
            best = value
    return best


# ---------------------------------------------------------------------------------------------
# The command line


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memory_plan.py", description=__doc__.split("\n\n")[0],
        epilog="Any other --key=value is a field of the trainer's config (python grpo.py --help, "
               "python sft.py --help), e.g. --grad_checkpointing=True --generate_batch_size=8 "
               "--micro_batch_size=2 --logit_chunk_tokens=1024; --fsdp=True unless given "
               "(--fsdp=False plans DDP or one process).")
    parser.add_argument("--model", default="qwen3-4b",
                        help=f"{', '.join(BUILTIN)}, a folder with config.json, a config.json, or "
                             "a cached hub name (default: qwen3-4b)")
    parser.add_argument("--trainer", choices=("grpo", "sft"), default="grpo")
    parser.add_argument("--preset", choices=("paper", "tiny"), default="paper",
                        help="the trainer's preset for the fields left unset (default: paper)")
    parser.add_argument("--world_size", type=int, default=DEFAULT_WORLD_SIZE,
                        help=f"ranks (GPUs) (default: {DEFAULT_WORLD_SIZE}, the paper's run)")
    parser.add_argument("--gpu_gb", type=float, default=DEFAULT_GPU_GB,
                        help="one GPU's memory, GB of 10^9 bytes (default: 80)")
    parser.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
                        help="share of the GPU left free (default: 0.1)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--prompt_tokens", type=int, default=None,
                        help="the longest prompt of a generate call or micro-batch (default: the "
                             "longest prompt of the trainer's --data and --eval_data in "
                             "--tokenizer's tokens; without a tokenizer "
                             f"{ASSUMED_PROMPT_TOKENS}, DAPO-17k's, said loudly)")
    parser.add_argument("--tokenizer", default="",
                        help="a tokenizer folder or cached hub name to measure the data's "
                             "prompts with (default: --model's, when it is a folder holding one)")
    parser.add_argument("--largest", choices=SEARCHABLE, default=None,
                        help="also find the largest value of this field that fits, and print "
                             "the plan at it")
    return parser


def assumed_prompt_tokens(why: str) -> tuple[int, str]:
    """(ASSUMED_PROMPT_TOKENS, its source), said on stderr with `why` it was not measured."""
    print(f"memory_plan.py: ASSUMED longest prompt: {ASSUMED_PROMPT_TOKENS} tokens (DAPO-17k's; "
          f"{why}); pass --tokenizer=<folder or hub name> to measure --data's, or "
          "--prompt_tokens=<n>", file=sys.stderr)
    return ASSUMED_PROMPT_TOKENS, "ASSUMED: DAPO-17k's"


def longest_prompt(cfg, trainer: str, preset: str, tokenizer_name: str) -> tuple[int, str]:
    """(the longest prompt of the run's data in tokens, how it was found): the prompts of the
    trainer's --data (and GRPO's --eval_data) as the trainer builds them, in `tokenizer_name`'s
    tokens; without a tokenizer, or data it can read, assumed_prompt_tokens (the KV cache and
    the training rows grow with it: DAPO's 1,442 against 512 is +10 GB at 4B)."""
    if not tokenizer_name:
        return assumed_prompt_tokens("no tokenizer to measure with")
    from transformers import AutoTokenizer

    from data import build_prompt, load_data, prompt_style_of
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_name,
                                              local_files_only=not os.path.isdir(tokenizer_name))
    style = "parallel"
    if getattr(cfg, "style", None) == "sequential" or getattr(cfg, "mode", None) == "sequential":
        style = "sequential"
    specs = [cfg.data]
    if trainer == "grpo" and cfg.eval_data:
        specs.append(cfg.eval_data)
    try:
        records = [record for spec in specs for record in load_data(spec, style=style)]
    except (OSError, ValueError) as e:
        return assumed_prompt_tokens(f"the data cannot be read: {e}")
    longest = 0
    for record in records:
        prompt = build_prompt(tokenizer, record["problem"], prompt_style_of(preset, style),
                              cfg.prompt_file or None)
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        longest = max(longest, len(ids))
    return longest, f"measured: {' + '.join(specs)}"


def make_setting(argv: list[str]) -> tuple[Setting, str | None]:
    """(the setting the command line describes, the field to search or None)."""
    ours, rest = arguments().parse_known_args(argv)
    if ours.world_size < 1 or not 0 <= ours.margin < 1 or ours.gpu_gb <= 0:
        raise ValueError("--world_size must be >= 1, --gpu_gb > 0 and --margin in [0, 1)")
    shape = load_shape(ours.model)
    given = config.flags_given(rest)
    rest = [*rest, *(flag for flag in DEFAULT_FLAGS if flag[2:].split("=")[0] not in given)]
    if ours.trainer == "grpo":
        cfg = config.parse(grpo.GRPOConfig, [*rest, f"--preset={ours.preset}"])
        cfg = grpo.resolve_defaults(cfg, ours.world_size)
    else:
        cfg = config.parse(sft.SFTConfig, [*rest, f"--preset={ours.preset}"])
        cfg = sft.resolve_defaults(cfg, ours.world_size)
    if ours.prompt_tokens is not None:
        prompt_tokens = ours.prompt_tokens
        source = "given"
    else:
        tokenizer_name = ours.tokenizer
        if not tokenizer_name and os.path.isfile(os.path.join(ours.model, "tokenizer.json")):
            tokenizer_name = ours.model
        prompt_tokens, source = longest_prompt(cfg, ours.trainer, ours.preset, tokenizer_name)
    st = Setting(shape, ours.trainer, cfg, ours.world_size, ours.device, ours.gpu_gb,
                 ours.margin, prompt_tokens, source)
    return st, ours.largest


def main(argv: list[str]) -> None:
    st, field = make_setting(argv)
    if field is None:
        print(table(st))
        return
    best = largest_fitting(st, field)
    if best is None:
        print(f"no {field} from 1 to {search_limit(st, field)} fits; the plan at the given "
              "setting:\n")
        print(table(st))
        return
    print(f"largest {field} that fits: {best}\n")
    print(table(dataclasses.replace(st, cfg=dataclasses.replace(st.cfg, **{field: best}))))


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (OSError, ValueError) as e:
        sys.exit(f"memory_plan.py: error: {e}")
