"""The parallel structure: `parse_structure`, the one parser, and the Seen/Unseen masks and
positions (NOTES.md §1-§2).

    main <Parallel><Path> p1 </Path><Path> p2 </Path></Parallel>\\n<Summary> s </Summary> main

* Seen:   causal attention, positions 0..L-1; path 2 reads path 1.
* Unseen: a path's tokens (its <Path> and </Path> included) see the shared prefix and their own
  path only; </Parallel> and everything after it see everything before. "Multiverse" positions:
  every path of a block starts at p+1 (p: the position of <Parallel>), </Parallel> sits at
  p + longest path + 1, then +1 per token.

The prompt is never parsed and always numbered 0..n-1 (the paper's instruction contains the tags;
parsing it shifted every position in the official SFT code, NOTES.md §8).
`python scripts/look/show_mask.py` prints an example.
"""
import os
from collections.abc import Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from model import TAGS


@dataclass(frozen=True)
class TagIds:
    """Ids of the six tags; `newline`: the ids injected between </Parallel> and <Summary>."""
    parallel: int
    end_parallel: int
    path: int
    end_path: int
    summary: int
    end_summary: int
    newline: tuple[int, ...]
    eos: int

    @property
    def structural(self) -> frozenset[int]:
        """The six tags' ids."""
        return frozenset((self.parallel, self.end_parallel, self.path, self.end_path,
                          self.summary, self.end_summary))

    @property
    def maskable(self) -> tuple[int, ...]:
        """The tokens a sampler masks at some draws (sample.ban_masks): the six tags and EOS.
        A rollout records which of them each draw masked (sample.Rollout.banned), and the
        training forward scores the token under the same renormalized softmax (`head_scores`)."""
        return (*sorted(self.structural), self.eos)

    @classmethod
    def from_tokenizer(cls, tokenizer) -> "TagIds":
        """ValueError when a tag is not one token (load the model with model.load_model) or the
        tokenizer has no EOS."""
        ids = []
        for tag in TAGS:
            encoded = tokenizer.encode(tag, add_special_tokens=False)
            if len(encoded) != 1 or encoded[0] == getattr(tokenizer, "unk_token_id", None):
                raise ValueError(f"tokenizer does not have {tag!r} as one token (it encodes to "
                                 f"{encoded}); load the model with model.load_model(), which adds "
                                 "the six parallel tags")
            ids.append(encoded[0])
        if tokenizer.eos_token_id is None:
            raise ValueError("tokenizer has no eos_token_id; set one before sampling or training")
        newline = tuple(tokenizer.encode("\n", add_special_tokens=False))
        return cls(*ids, newline=newline, eos=tokenizer.eos_token_id)


@dataclass
class Block:
    """One parallel block; indices into the response, spans [start, end)."""
    start: int                                   # index of <Parallel>
    paths: list[tuple[int, int]] = field(default_factory=list)  # <Path> .. </Path> inclusive
    end: int | None = None                       # index of </Parallel>; None if never closed
    summary: tuple[int, int] | None = None       # <Summary> .. </Summary>; to the end if unclosed


@dataclass
class Structure:
    blocks: list[Block]
    valid: bool
    reason: str          # "" when valid, else the first problem found (with its token index)
    length: int


def parse_structure(ids: Sequence[int], tags: TagIds) -> Structure:
    """The blocks of one *response* (ids: a list or a 1-D tensor, no padding) and whether it is
    well-formed: every block closed with >= 2 paths, none empty, only the newline before its
    <Summary>, every summary closed, no tag inside a path or a summary, no text between paths, no
    stray tag in the main chain. Never raises. Recovery (what the mask builder uses): a tag out
    of place is an ordinary token; an unclosed <Path> or <Summary> runs to the end."""
    # >>> exercise 1: the format parser: block, path and summary spans
    if isinstance(ids, torch.Tensor):
        ids = ids.tolist()
    blocks: list[Block] = []
    problems: list[str] = []                     # the first one is the reason
    state = "main"        # main, block (between paths), path, after (</Parallel> seen), summary
    start = 0                                    # where the open path or summary began
    for i, t in enumerate(ids):
        if state == "after":                     # a block just closed: waiting for <Summary>
            if t == tags.summary:
                state = "summary"
                start = i
            if t == tags.summary or t in tags.newline:
                continue
            problems.append(f"no <Summary> after </Parallel> (token {i})")
            state = "main"                       # fall through: t is main-chain text
        if state == "main":
            if t == tags.parallel:
                blocks.append(Block(start=i))
                state = "block"
            elif t == tags.summary:
                problems.append(f"<Summary> without a parallel block (token {i})")
            elif t in tags.structural:
                problems.append(f"stray structural tag {t} in the main chain (token {i})")
        elif state == "block":
            if t == tags.path:
                state = "path"
                start = i
            elif t == tags.end_parallel:
                block = blocks[-1]
                block.end = i
                if len(block.paths) < 2:
                    problems.append(f"block at token {block.start} has {len(block.paths)} "
                                    "path(s), needs >= 2")
                state = "after"
            else:
                problems.append(f"token {i} inside a block but outside every path")
        elif state == "path":
            if t == tags.end_path:
                if i == start + 1:
                    problems.append(f"empty path at token {start}")
                blocks[-1].paths.append((start, i + 1))
                state = "block"
            elif t in tags.structural:
                problems.append(f"structural tag {t} inside a path (token {i})")
        elif state == "summary":
            if t == tags.end_summary:
                blocks[-1].summary = (start, i + 1)
                state = "main"
            elif t in tags.structural:
                problems.append(f"structural tag {t} inside a summary (token {i})")
    n = len(ids)
    if state == "path":
        blocks[-1].paths.append((start, n))
        problems.append(f"unclosed <Path> at token {start}")
    if state in ("path", "block"):
        problems.append(f"unclosed <Parallel> at token {blocks[-1].start}")
    elif state == "after":
        problems.append("no <Summary> after the last </Parallel>")
    elif state == "summary":
        blocks[-1].summary = (start, n)
        problems.append(f"unclosed <Summary> at token {start}")
    reason = problems[0] if problems else ""
    return Structure(blocks=blocks, valid=not problems, reason=reason, length=n)
    # <<< exercise 1


def unseen_positions(structure: Structure, start: int = 0) -> list[int]:
    """The multiverse position of every response token, the first at `start`: each path of a
    block counts from p+1 (p: its <Parallel>'s position), its <Path> at p+1; every token outside a
    path (the main chain, </Parallel>, the summary) takes one past the furthest position so far,
    so </Parallel> sits at p + longest path + 1. (Text between two paths, in a malformed block,
    follows the first; the next path still starts at p+1.)"""
    # >>> exercise 2: Unseen position ids
    block_of_path = {}                           # a path's first index -> (<Parallel>'s index, end)
    for block in structure.blocks:
        for path_start, path_end in block.paths:
            block_of_path[path_start] = (block.start, path_end)
    positions = [0] * structure.length
    next_position = start
    i = 0
    while i < structure.length:
        if i in block_of_path:                   # a whole path: p+1, p+2, ...
            block_start, path_end = block_of_path[i]
            first = positions[block_start] + 1
            positions[i:path_end] = range(first, first + path_end - i)
            next_position = max(next_position, positions[path_end - 1] + 1)
            i = path_end
        else:
            positions[i] = next_position
            next_position += 1
            i += 1
    return positions
    # <<< exercise 2


def build_mask_and_positions(input_ids: torch.Tensor, prompt_lengths,
                             attention_mask_2d: torch.Tensor, tag_ids: TagIds, mode: str,
                             dtype: torch.dtype = torch.float32):
    """The training forward's attention mask and position ids for a batch of prompt + response
    rows: input_ids (B, L) long, each row [pad*] prompt response [pad*] with its own structure;
    prompt_lengths (B,); attention_mask_2d (B, L) 0/1, one contiguous run of real tokens per row;
    mode "seen" or "unseen".

    Returns mask (B, 1, L, L) additive in `dtype`: 0 visible, finfo(dtype).min hidden (never bool:
    eager attention adds a bool mask as 0/1; a padding query sees itself, so nothing is NaN), and
    position_ids (B, L) long (padding at 0). ValueError for an unknown mode, a row that is not one
    run, a prompt longer than its row; never for a malformed response."""
    # >>> exercise 3: the Seen/Unseen attention mask and positions
    if mode not in ("seen", "unseen"):
        raise ValueError(f"mode must be 'seen' or 'unseen', got {mode!r}")
    B, L = input_ids.shape
    device = input_ids.device
    real = attention_mask_2d.bool().cpu()
    prompt_lengths = torch.as_tensor(prompt_lengths).tolist()
    allowed = torch.eye(L, dtype=torch.bool, device=device).repeat(B, 1, 1)   # padding: itself
    positions = torch.zeros(B, L, dtype=torch.long)
    causal = torch.ones(L, L, dtype=torch.bool, device=device).tril()
    for b in range(B):
        columns = real[b].nonzero().flatten().tolist()
        n = len(columns)
        lo = columns[0] if columns else 0        # the row's first real token
        if n and columns[-1] - lo + 1 != n:
            raise ValueError(f"row {b}: attention_mask_2d is not one contiguous run of real tokens")
        n_prompt = prompt_lengths[b]
        if n_prompt > n:
            raise ValueError(f"row {b}: prompt length {n_prompt} exceeds its {n} real tokens")
        hi = lo + n
        r0 = lo + n_prompt                       # where the response starts in the row
        allowed[b, lo:hi, lo:hi] = causal[:n, :n]
        positions[b, lo:hi] = torch.arange(n)
        if mode == "unseen":
            structure = parse_structure(input_ids[b, r0:hi], tag_ids)
            unseen = unseen_positions(structure, n_prompt)
            positions[b, r0:hi] = torch.tensor(unseen, dtype=torch.long)
            # The one rule beyond causal: a path's rows do not see the columns from just after its
            # block's <Parallel> up to its own <Path> (the block's earlier paths; later ones are
            # in the future anyway). Earlier blocks, and everything after </Parallel>, stay seen.
            for block in structure.blocks:
                for s, e in block.paths:
                    hidden = slice(r0 + block.start + 1, r0 + s)
                    allowed[b, r0 + s:r0 + e, hidden] = False
    mask = torch.zeros(B, 1, L, L, dtype=dtype, device=device)
    mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)
    return mask, positions.to(device)
    # <<< exercise 3


# ---------------------------------------------------------------------------------------------
# The attention kernel under our masks

MASKED_SDPA_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION]   # CUDA, under a mask: the only one
NO_KERNEL_MESSAGES = ("No available kernel", "No viable backend")   # SDPA's, when all refuse
SDPA = "sdpa"                  # transformers' name of its SDPA attention implementation


@contextmanager
def masked_sdpa(device: torch.device):
    """The SDPA kernel of every masked model call (the training forward, the sampler's prefill
    and decode steps): on CUDA the memory-efficient kernel and no other, chosen on purpose; on
    CPU, torch's own choice (nothing changes). Left to torch, CUDA SDPA under a mask tries cuDNN
    first on H100/H200, whose backward gives NaN gradients when the length is 64 mod 128 at the
    pinned torch 2.13 (pytorch issue #196678), and falls back silently to the math kernel, whose
    (B, heads, L, L) fp32 scores take 3.2 GB a layer at 3,512 tokens for Qwen3-4B; flash attention
    takes no mask. Gradient checkpointing's recompute enters it again (plumbing.wrap_model).

    ValueError, saying what to do, when the memory-efficient kernel refuses the inputs (torch's
    warnings just before it say why)."""
    if device.type != "cuda":
        yield
        return
    try:
        with sdpa_kernel(MASKED_SDPA_BACKENDS):
            yield
    except RuntimeError as e:
        if not any(message in str(e) for message in NO_KERNEL_MESSAGES):
            raise
        hint = ""
        if os.environ.get("TRANSFORMERS_SDPA_FORCE_GQA") == "1":
            hint = (" TRANSFORMERS_SDPA_FORCE_GQA=1 is set: it passes enable_gqa, which this "
                    "kernel does not take at torch 2.13; unset it.")
        raise ValueError(f"masked attention on CUDA runs on SDPA's memory-efficient kernel only "
                         f"(attention.masked_sdpa), and it refused these inputs ({e}); torch's "
                         "warnings above say why: it needs q, k and v in fp32, fp16 or bf16 "
                         "with a head_dim that is a multiple of 8 and the same number of heads "
                         f"(no enable_gqa).{hint}") from e


def folded_query_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: torch.Tensor | None, dropout: float = 0.0,
                           scaling: float | None = None, **kwargs):
    """transformers' "sdpa" attention function (same arguments, same result) for grouped-query
    attention under a mask, without a copy of the keys or values. transformers repeats every
    key/value head for its group of query heads (repeat_kv) whenever a mask is given and
    q > 1: at a decode step of the paper's run (an Unseen block: num_paths queries a row) that
    copies the whole cache, every layer, every step; CUDA's memory-efficient kernel takes no
    enable_gqa at torch 2.13, and a mask refuses the kernels that do.

    The fold: query head h reads key/value head h // groups (groups = heads / kv_heads), so each
    key/value head's group of query heads becomes more queries of that head:

        query (B, heads, q, d) -> (B, kv_heads, groups x q, d)    row g x q + i: the group's
                                                                   head g, query i
        mask  (B, 1, q, k)     -> (B, 1, groups x q, k)           the same q rows, groups times
        key, value (B, kv_heads, k, d): as they are

    Exact because our masks (build_mask_and_positions, SlotCache.mask) are the same for every
    head of a row; the mask is copied groups times instead (queries x keys, no head_dim: at a
    decode step about 1/1000 of what repeat_kv copies; with one query, a view). Returns
    (B, q, heads, d) and None, as transformers' attention functions do. Any other call (no
    GQA, no mask, a mask per head, dropout, a position bias) goes to transformers' function
    unchanged. Used by the sampler (`folded_query_attention_for_sdpa`), not by the training
    forward: at 3,512 tokens the mask folded four times (Qwen3-4B) outweighs the keys and
    values repeated. NOTES.md §2-§3."""
    groups = getattr(module, "num_key_value_groups", 1)
    plain = (groups == 1 or attention_mask is None or attention_mask.dim() != 4
             or attention_mask.shape[1] != 1 or dropout > 0
             or kwargs.get("position_bias") is not None)
    if plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    batch, heads, queries, head_dim = query.shape
    kv_heads = key.shape[1]
    mask_rows = attention_mask.shape[0]                  # 1 when the mask is broadcast over rows
    width = attention_mask.shape[-1]
    folded_query = query.reshape(batch, kv_heads, groups * queries, head_dim)
    folded_mask = attention_mask.expand(mask_rows, groups, queries, width)
    folded_mask = folded_mask.reshape(mask_rows, 1, groups * queries, width)
    output = F.scaled_dot_product_attention(folded_query, key, value, attn_mask=folded_mask,
                                            scale=scaling)
    output = output.reshape(batch, heads, queries, head_dim)
    return output.transpose(1, 2).contiguous(), None


@contextmanager
def folded_query_attention_for_sdpa():
    """Inside, every model whose attention implementation is "sdpa" runs
    `folded_query_attention` (transformers' documented local override: an entry in the shared
    AttentionInterface instance, ALL_ATTENTION_FUNCTIONS, the models look up at each call); the
    previous entry comes back after. The sampler's generate call runs inside."""
    functions = ALL_ATTENTION_FUNCTIONS
    previous = functions[SDPA]
    functions[SDPA] = folded_query_attention
    try:
        yield
    finally:
        functions[SDPA] = previous


# ---------------------------------------------------------------------------------------------
# The training forward: the log-prob of every loss token under its row's mask (NOTES.md §3, §8)

LOGIT_CHUNK_TOKENS = 256       # loss tokens per chunk through the LM head (memory: chunk x vocab)


def autocast(device: torch.device):
    """bf16 compute on GPUs (the weights and the optimizer stay fp32), nothing on CPU: the
    precision of every forward, in training and in sampling."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor,
                   temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / temperature) at `tokens`: logits (..., V), tokens (...) long ->
    (...) float32. The one log-prob function: the sampler records it for every token it draws,
    and the training forward (`head_scores`) computes it again, so PPO's ratio starts at 1.
    `temperature` <= 0 counts as 1."""
    # >>> exercise 4: token log-probs
    t = temperature if temperature > 0 else 1.0
    logits = logits.float() / t
    chosen = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return chosen - torch.logsumexp(logits, dim=-1)
    # <<< exercise 4


def structured_forward(model, input_ids, attention_mask_2d, prompt_lengths, tag_ids: TagIds,
                       mode: str, dtype: torch.dtype | None = None):
    """One forward under the mode's mask and positions ("sequential" = "seen"): logits (B, L, V).
    The mask is built in `dtype` (default the model's; pass the autocast dtype under mixed
    precision). For tests and tools: the losses use `token_scores`, which never holds these full
    logits."""
    if mode == "sequential":
        mode = "seen"
    if dtype is None:
        dtype = next(model.parameters()).dtype
    mask, positions = build_mask_and_positions(input_ids, prompt_lengths, attention_mask_2d,
                                               tag_ids, mode, dtype)
    with masked_sdpa(input_ids.device):
        return model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                     use_cache=False).logits


def final_logit_transform(config):
    """What a model does to its logits after the LM head (Gemma's soft-capping, Cohere's scale,
    Granite's scaling), as a function of float32 logits; most models do nothing."""
    cap = getattr(config, "final_logit_softcapping", None)
    scale = getattr(config, "logit_scale", None)
    scaling = getattr(config, "logits_scaling", None)

    def transform(logits: torch.Tensor) -> torch.Tensor:
        if scale is not None:
            logits = logits * scale
        if scaling is not None:
            logits = logits / scaling
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    return transform


def head_scores(hidden, weight, bias, targets, temperature: float, transform,
                banned=None, maskable=None):
    """One chunk through the LM head: (`token_logprobs` of `targets` under temperature T, the
    entropy of softmax(logits / T), no gradient). hidden (C, H), targets (C,) long -> (C,), (C,)
    float32. The logits are divided by T once, here (the entropy needs them too), so
    `token_logprobs` takes them at T = 1. banned (C, K) bool, maskable (K,) long: the tokens each
    position's draw masked (the sampler's bans); they leave the softmax, as they left the draw."""
    logits = transform(F.linear(hidden, weight, bias).float()) / temperature       # (C, V)
    if banned is not None:
        masked = torch.zeros_like(logits, dtype=torch.bool)
        masked[:, maskable] = banned
        logits = logits.masked_fill(masked, float("-inf"))
    logprobs = token_logprobs(logits, targets)
    with torch.no_grad():
        normalizer = torch.logsumexp(logits, dim=-1)
        finite = logits.masked_fill(logits.isinf(), 0.0)        # p = 0 there: 0 * -inf is nan
        entropy = normalizer - (torch.softmax(logits, dim=-1) * finite).sum(dim=-1)
    return logprobs, entropy


def token_scores(model, batch, tag_ids: TagIds, mode: str, selected: torch.Tensor,
                 temperature: float = 1.0, chunk_tokens: int = LOGIT_CHUNK_TOKENS,
                 dtype: torch.dtype | None = None, banned: torch.Tensor | None = None):
    """The training forward of SFT's and GRPO's losses. `batch`: right-padded rows (anything with
    input_ids (B, L) long, attention_mask (B, L) 0/1 and prompt_lengths (B,): data.Batch,
    grpo.RolloutBatch), each under its own mask and positions; selected (B, L-1) bool, position t
    predicting input_ids[:, t+1]. Returns, for every selected position in row-major order, the
    log-prob of the next token under temperature T (`token_logprobs`) and the entropy (no
    gradient): (N,) and (N,) float32. banned (B, L-1, K) bool (GRPO's rollouts): which of
    `tag_ids.maskable` the sampler masked at each draw; the softmax leaves them out too, so the
    log-prob is that of the distribution the token was drawn from (NOTES.md §8).

    On a GPU the forward runs under bf16 autocast (`autocast`) with the mask in bf16 (`dtype`:
    another mask dtype). The forward stops at the last hidden states; the selected positions go
    through the LM head in chunks of `chunk_tokens`, each recomputed in the backward
    (torch.utils.checkpoint), so no (N, V) logits tensor outlives one chunk. `model` may be
    wrapped in DDP or sharded by FSDP2: everything runs inside its own forward and backward."""
    if mode == "sequential":
        mode = "seen"
    device = batch.input_ids.device
    if dtype is None and device.type == "cuda":
        dtype = torch.bfloat16                                  # autocast's dtype
    if dtype is None:
        dtype = next(model.parameters()).dtype
    with autocast(device):
        mask, positions = build_mask_and_positions(batch.input_ids, batch.prompt_lengths,
                                                   batch.attention_mask, tag_ids, mode, dtype)
        if banned is not None:
            banned = banned[selected]                                       # (N, K)
        maskable = torch.tensor(tag_ids.maskable, device=device)
        return chunked_head_scores(model, batch.input_ids, mask, positions, selected,
                                   temperature, chunk_tokens, banned, maskable)


def chunked_head_scores(model, input_ids, mask, positions, selected, temperature: float,
                        chunk_tokens: int, banned=None, maskable=None):
    """`token_scores` after the mask: the decoder's forward, then the LM head chunk by chunk.

    The forward goes through `model` itself, not its decoder (`model.model`): DDP syncs the
    gradients and FSDP2 gathers the root's weights (embeddings, norm, head) only in the wrapped
    model's forward. It returns the last hidden states (after the final norm) as the last of
    `hidden_states`, and runs only the last position through the model's own head. That our head
    (`final_logit_transform`) is the model's is checked in tests/test_attention.py, and in every
    run by the first steps' log-prob check (grpo.py, --logprob_check_steps)."""
    inner = getattr(model, "module", model)                  # DDP's wrapped model
    with masked_sdpa(input_ids.device):
        out = model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                    use_cache=False, logits_to_keep=1, output_hidden_states=True)
    hidden = out.hidden_states[-1]                           # (B, L, H), after the final norm
    head = inner.get_output_embeddings()
    transform = final_logit_transform(inner.config)
    t = temperature if temperature > 0 else 1.0
    hidden = hidden[:, :-1][selected]                                      # (N, H)
    targets = input_ids[:, 1:][selected]                                   # (N,)
    logprobs = []
    entropy = []
    for start in range(0, max(1, len(targets)), chunk_tokens):   # one chunk, also for none:
        chunk = slice(start, start + chunk_tokens)                 # the backward still reaches
        chunk_banned = None                                        # every parameter (DDP)
        if banned is not None:
            chunk_banned = banned[chunk]
        chunk_logprobs, chunk_entropy = checkpoint(head_scores, hidden[chunk], head.weight,
                                                   head.bias, targets[chunk], t, transform,
                                                   chunk_banned, maskable, use_reentrant=False)
        logprobs.append(chunk_logprobs)
        entropy.append(chunk_entropy)
    return torch.cat(logprobs), torch.cat(entropy)
