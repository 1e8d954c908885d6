"""The branching sampler (NOTES.md §3): one KV-cache row per sample; the paths of a block decode
side by side in that row.

    rollouts = generate(model, tokenizer, prompts, group_size=8, mode="unseen")
    python sample.py --model=runs/sft/checkpoint-400      # a few responses, each block laid out

A sample is a main chain (a `Stream`) that may open blocks. Every decode step feeds each stream the
token it holds (`feed`) and gives it its next one: sampled, or forced by the runtime. A stream's
`segment` says what it is writing (main chain, path, summary); its `pending` transition says what
happens once its fed token is in the cache. One Unseen sample, and the method of each transition:

    MAIN ──samples <Parallel>──▶ pending OPEN_BLOCK               _advance, _start_block
      │ <Parallel> is fed; the token drawn from its logits is dropped: <Path> is the runtime's
      ▼ to inject (Seen too)                                      _open_block
    N × PATH, each fed an injected <Path> at position p+1 (p: <Parallel>'s), in its own slots;
      │ a path's first token is drawn from the logits of its <Path>
      │ samples </Path>, or EOS / the path budget (</Path> injected) ▶ pending PATH_DONE   _end_path
      ▼ every path has fed its </Path>                            _close_block
    SUMMARY: path slots become shared (nothing copied); </Parallel> \\n <Summary> injected,
      │      </Parallel> at p + longest path + 1
      │ samples </Summary> (an EOS becomes </Summary>)            _advance
      ▼
    MAIN ... ──samples EOS, or the budget is spent──▶ done: open paths get their </Path>   _finish

Every fed token gets a draw from its logits (the logits of the token just fed). One function
says whether the draw is kept, `Engine._draw_verdict`: KEPT, or why the runtime drops it. After
<Parallel> (BLOCK_OPENS) and after each fed </Path> (PATH_CLOSED: the path waits for its
siblings; Unseen appends </Parallel> itself once all have closed); before a forced token
(FORCED_NEXT: \\n, <Summary>; Seen also <Path> and </Parallel>); at a path's budget (PATH_BUDGET);
an EOS inside a path or a summary (EOS_IN_PATH, EOS_IN_SUMMARY: its closing tag is injected);
a forced block's first draw (FORCED_BLOCK, `open_block=True`: <Parallel> is injected instead);
a token the budget cannot hold (OVER_BUDGET: the sample ends); and every later draw of the same
step of a sample that ended (SAMPLE_ENDED). NOTES.md §3 walks one block through it, step by step.

Seen is the same on the main stream alone: its paths follow one another (<Path> injected after
each </Path>), causally; "sequential" is plain sampling. An Unseen path's query sees the shared
slots and its own; the response is written in the training layout (path 1, then path 2, ...):
attention depends on the mask and on the positions baked into the cached keys, not on the slots'
order, so every sampled token has its training context (`attention.build_mask_and_positions`) and
the recorded log-probs equal the training forward's (NOTES.md §8).

The budget counts every response token (paths, summaries and injected tags; the paper's), or
with budget="steps" the decode steps D (a block spends its longest path, not the sum of its
paths), and keeps one token free for each open path's </Path>: the rule, with its reasons, is
`Engine._fits` and the comment above it. A token it cannot hold ends the whole sample, not only
the stream that drew it: every open path gets its </Path>, and nothing more is written (a block
it cuts gets no </Parallel>, summary or answer). The open paths of an Unseen block are always
equally long (each gets one token a step), and in decode steps a path's token costs a step only
when it makes the block longer than its longest path so far; so under budget="steps" the sample
ends at the step where its longest open path cannot grow: the first open path's draw is refused
(OVER_BUDGET), the others' are SAMPLE_ENDED, and all close at the same length. (Counting tokens,
it ends at the first path, in path order, whose token does not fit: the paths before it got one
token more.) A sample whose budget cannot hold the block it opened ends after its <Parallel>;
one whose budget ends after the paths or in the summary ends there. Such a response is malformed
(a block left open), and only the gated rewards say so (NOTES.md §4): parallel_gated scores it
-1, and tiered -1 too (it has a block), whatever its answer; the accuracy reward (S1, S2's
accuracy steps, evaluation) reads the answer alone (rewards.extract_answer on the tag-free text,
down to its last number): +1 if right. Finished rows leave the cache once half the batch is
done.
"""
import dataclasses
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Literal

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # idle OpenMP threads sleep (see sft.py)

import numpy as np
import torch

import config
from attention import (
    Structure,
    TagIds,
    build_mask_and_positions,
    folded_query_attention_for_sdpa,
    masked_sdpa,
    parse_structure,
    token_logprobs,
)
from model import Mode, load_model, mode_from_config, read_checkpoint_config

# Who may see a cache slot (SlotCache.owner): no query, every query of its row, or path j (2 + j).
HIDDEN = 0
SHARED = 1
FIRST_PATH_OWNER = 2

# A stream's segment, and its pending transitions.
MAIN = "main"
PATH = "path"
SUMMARY = "summary"
OPEN_BLOCK = "open_block"     # Unseen: <Parallel> is fed -> open the block's paths
PATH_DONE = "path_done"       # Unseen: </Path> is fed -> wait for the other paths, then close

# What becomes of the token drawn from a fed token's logits (Engine._draw_verdict): KEPT (it joins
# the response, sampled), or why the runtime drops it, in the order the rule asks.
KEPT = "kept"
SAMPLE_ENDED = "sample_ended"      # an earlier path's draw of this step ended the sample
BLOCK_OPENS = "block_opens"        # <Parallel> was fed: the paths begin with an injected <Path>
PATH_CLOSED = "path_closed"        # </Path> was fed: the path waits for its siblings
FORCED_NEXT = "forced_next"        # the runtime injects the next token (\n, <Summary>; Seen also
                                   # <Path>, </Parallel>)
PATH_BUDGET = "path_budget"        # the path is at max_path_tokens: </Path> injected
EOS_IN_PATH = "eos_in_path"        # </Path> injected
EOS_IN_SUMMARY = "eos_in_summary"  # </Summary> injected (if the budget holds it)
FORCED_BLOCK = "forced_block"      # open_block=True, the response's first token: <Parallel> instead
OVER_BUDGET = "over_budget"        # the budget cannot hold it: the sample ends (`_fits`)


class Stopped(Exception):
    """`generate`'s `stop` said so between two decode steps: no rollouts (a preemption)."""


DEFAULT_MAX_NEW_TOKENS = 256   # a response's budget when neither the caller nor a preset sets one


@dataclass
class SamplingFlags:
    """The sampling settings a user chooses: how a token is drawn, and the budget and shape of a
    response. Declared once, here: grpo.py's, eval.py's and sample.py's command lines inherit
    these fields."""
    temperature: config.NonNegativeFloat = 1.0   # 0 = greedy
    top_p: Annotated[float, config.Range(low=0, high=1, low_open=True)] = 1.0   # nucleus sampling
    top_k: config.NonNegativeInt = 0             # 0 = off
    max_new_tokens: config.NonNegativeInt | None = None   # a response's budget, tags included
    budget: Literal["tokens", "steps"] = "tokens"   # what max_new_tokens bounds: T, or D
    num_paths: Annotated[int, config.Range(low=2)] = 2  # paths per Unseen block (Seen: per block)
    max_blocks: config.NonNegativeInt = 4        # then <Parallel> is masked (NOTES.md §8)
    open_block: bool = False      # a forced block: the runtime writes <Parallel> first (injected)

    def sampling_config(self, **settings) -> "SamplingConfig":
        """These flags as the SamplingConfig of a `generate` call, with its other `settings`."""
        flags = {f.name: getattr(self, f.name) for f in dataclasses.fields(SamplingFlags)}
        return SamplingConfig(**flags, **settings)


@dataclass
class SamplingConfig(SamplingFlags):
    """How `generate` samples: the flags (max_new_tokens None: DEFAULT_MAX_NEW_TOKENS), and what
    a caller sets for one call."""
    greedy: bool = False
    seed: int | None = None                      # None: fresh entropy (the global RNG untouched)
    max_path_tokens: config.PositiveInt | None = None   # a path's tokens, both tags included
    allow_parallel: bool = True                  # "sequential" mode: may it write <Parallel>?
    min_new_tokens: config.NonNegativeInt = 0    # no EOS before this many tokens (benchmarks)

    def __post_init__(self):
        if self.max_new_tokens is None:
            self.max_new_tokens = DEFAULT_MAX_NEW_TOKENS
        config.check(self)
        if self.open_block and (not self.allow_parallel or self.max_blocks == 0):
            raise ValueError("open_block=True forces a block, but this sampling bans blocks "
                             "(the sequential mode, or max_blocks=0): drop one of the two")


@dataclass
class Rollout:
    """One sampled response. All lists are aligned with `response_ids`."""
    prompt_index: int               # index into the `prompts` argument
    prompt_ids: list[int]
    response_ids: list[int]         # the training layout (what the training forward reads)
    sampled_mask: list[int]         # 1 = sampled by the model, 0 = injected by the runtime
    logprobs: list[float]           # log softmax(logits / T)[token] if sampled, 0.0 if injected,
                                    # the softmax over what the draw allowed (`banned`)
    structure: Structure            # attention.parse_structure(response_ids)
    num_tokens: int                 # T: tokens in the response (paths, summaries, tags included)
    critical_path: int              # D: decode steps a parallel machine needs (paths overlap)
    finish_reason: str              # "eos" or "budget"
    text: str = ""                  # the decoded response with its tags, without a final EOS
    banned: list[tuple[bool, ...]] = field(default_factory=list)   # which of TagIds.maskable
                                    # each draw masked (all False if injected); [] = none recorded


def draw_tokens(logits: torch.Tensor, banned: torch.Tensor, sampling: SamplingConfig,
                uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row of logits (n, V) float32: greedy, or drawn after the temperature, top-k
    and top-p by inverting the cumulative distribution at the row's number of `uniforms` (n,)
    float32 in [0, 1) (`response_draws`). banned (n, V) bool: the tags the runtime masks."""
    logits = logits.masked_fill(banned, float("-inf"))
    if sampling.greedy or sampling.temperature <= 0:
        return logits.argmax(-1)
    logits = logits / sampling.temperature
    if sampling.top_k and sampling.top_k < logits.shape[-1]:
        kth_largest = logits.topk(sampling.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs > sampling.top_p   # keep the smallest prefix reaching top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    cumulative = logits.softmax(-1).cpu().cumsum(-1, dtype=torch.float64)     # (n, V)
    # the first token whose cumulative probability passes u x total: token i with probability
    # p_i. In float64, u x total (u < 1 has 24 bits) stays below the total, so a token of
    # probability 0 (banned, or cut by top-k or top-p) adds nothing and is never the first
    threshold = uniforms.cpu().double()[:, None] * cumulative[:, -1:]
    chosen = torch.searchsorted(cumulative, threshold, right=True).squeeze(-1)
    return chosen.to(logits.device)


def response_draws(seed: int, places: list[int], group_size: int, width: int) -> torch.Tensor:
    """(len(places) x group_size, width) float32 uniform in [0, 1): the numbers the responses of
    each prompt draw their tokens with, prompt-major, `width` per response (its k-th draw takes
    number k). Prompt i's group takes them from a generator of its own, seeded by (seed,
    places[i]) (numpy's SeedSequence mixes the two): a response depends on the seed and its
    prompt's place, not on which other prompts share the call, so GRPO, which passes each
    prompt's place in the global batch, samples alike on any number of ranks and in any
    generate_batch_size chunks. One generator a prompt and one draw of its numbers: a decode
    step's draw stays one vectorised inversion (`draw_tokens`), not a call per row."""
    rows = []
    for place in places:
        mixed = np.random.SeedSequence([seed, place]).generate_state(1, np.uint64)[0]
        generator = torch.Generator().manual_seed(int(mixed))
        rows.append(torch.rand(group_size, width, generator=generator))
    return torch.cat(rows)


class SlotCache:
    """A KV cache written in place, for decoding under a custom mask. Per layer, keys and values
    of shape (rows, kv_heads, capacity, head_dim), allocated once at their full size on the first
    update and zero-filled (a hidden slot must be finite: 0 x NaN is NaN).

    What it relies on in transformers (5.24, pinned in requirements.txt; tests/test_sample.py
    ::test_the_contract_with_transformers_that_slot_cache_relies_on pins it): the model's forward
    takes this object as `cache=`, a 4D additive `attention_mask` (rows, 1, q, width) that it
    passes to attention untouched, explicit `position_ids` (so the cache is never asked for its
    length) and `logits_to_keep`; every attention layer calls `update(key, value, layer_idx)`
    once per forward, in layer order, with its new keys after RoPE (rows, kv_heads, q, head_dim),
    and attends over the keys and values it returns. Nothing else of the cache is read.

    Before a forward the caller sets `slots` (active rows, q) long, where each row's q new keys
    go, and calls `attend_to(width)`: the queries attend over slots [0, width). `owner`
    (rows, capacity) says who sees a slot: HIDDEN, SHARED, or FIRST_PATH_OWNER + j (path j).
    `fan_out` and `keep_rows` rearrange rows in place: the cache never holds two copies."""

    def __init__(self, rows: int, capacity: int, device, active_rows: int | None = None):
        self.capacity = capacity
        self.keys = []
        self.values = []
        self.slots = None
        self.width = 0
        self.owner_buffer = torch.zeros(rows, capacity, dtype=torch.long, device=device)
        self.set_active_rows(rows if active_rows is None else active_rows)

    def set_active_rows(self, n: int):
        """Rows [0, n) take part in the next forwards."""
        self.active_rows = n
        self.owner = self.owner_buffer[:n]
        self.row_ids = torch.arange(n, device=self.owner_buffer.device)[:, None]

    def update(self, key, value, layer_idx: int, *args, **kwargs):
        if layer_idx == len(self.keys):            # the first forward: allocate this layer
            rows = self.owner_buffer.shape[0]
            shape = (rows, key.shape[1], self.capacity, key.shape[3])
            self.keys.append(key.new_zeros(shape))
            self.values.append(value.new_zeros(shape))
        n = self.active_rows
        keys = self.keys[layer_idx][:n]
        values = self.values[layer_idx][:n]
        keys[self.row_ids, :, self.slots] = key.transpose(1, 2)      # (n, q, kv_heads, head_dim)
        values[self.row_ids, :, self.slots] = value.transpose(1, 2)
        return keys[:, :, :self.width], values[:, :, :self.width]

    def attend_to(self, width: int):
        if width > self.capacity:
            raise ValueError(f"{width} cache slots asked for, the capacity is {self.capacity}")
        self.width = width

    def fan_out(self, group_size: int):
        """Row i becomes rows i*G .. i*G+G-1 (G = group_size), in place. Rows are filled from the
        last prompt down, so no row is overwritten before it is copied."""
        prompts = self.active_rows
        buffers = [*self.keys, *self.values, self.owner_buffer]
        for i in reversed(range(prompts)):
            first = i * group_size
            for buffer in buffers:
                if first != i:
                    buffer[first] = buffer[i]
                buffer[first + 1:first + group_size] = buffer[first]
        self.set_active_rows(prompts * group_size)

    def keep_rows(self, rows: list[int]):
        """New row i = old row rows[i], in place (`rows` ascending): drops finished rows."""
        buffers = [*self.keys, *self.values, self.owner_buffer]
        for new, old in enumerate(rows):
            if new != old:
                for buffer in buffers:
                    buffer[new] = buffer[old]
        self.set_active_rows(len(rows))

    def mask(self, codes: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The attention mask of one decode step, from the slots' owners: codes (rows, q) long,
        the owner code of each query (SHARED for a main chain or a summary, FIRST_PATH_OWNER + j
        for path j of an open Unseen block, HIDDEN for a dummy); returns (rows, 1, q, width)
        additive in `dtype`, 0 where query (r, i) sees slot s, finfo(dtype).min where it does
        not. A query sees slot s (s < width) iff owner[r, s] is SHARED or equals codes[r, i]: a
        path sees the prefix and itself, never another path of its block (NOTES.md §2-§3). (A
        dummy sees the HIDDEN slots: padding and its scratch slot; its logits are never used.)"""
        # >>> exercise 9: the sampler: one decode step's mask from the slots' owners
        owner = self.owner[:, None, :self.width]
        hide = (owner != SHARED) & (owner != codes[:, :, None])
        mask = torch.zeros(hide.shape, dtype=dtype, device=hide.device)
        return mask.masked_fill_(hide, torch.finfo(dtype).min)[:, None]
        # <<< exercise 9


@dataclass(eq=False)
class Stream:
    """What feeds one query per decode step: a sample's main chain (and, in Seen, its paths and
    summaries), or one path of an open Unseen block."""
    segment: str                    # MAIN, PATH or SUMMARY: what it is writing
    position: int                   # the position id of `feed`; +1 as soon as it is fed, so
                                    # after <Parallel> (at p) is fed, the main chain's is p + 1
    owner: int = SHARED             # its slots' owner, and its queries' code (SlotCache.mask)
    feed: int | None = None         # the token to feed at the next step (None: nothing)
    forced: list = field(default_factory=list)   # tokens the runtime injects after `feed`
    pending: str | None = None      # OPEN_BLOCK or PATH_DONE: what happens once `feed` is in
    path_len: int = 0               # tokens of its current path, <Path> included
    tokens: list = field(default_factory=list)   # (token, sampled, logprob, banned); main's: the
                                                 # response


@dataclass(eq=False)
class Sample:
    prompt_index: int
    prompt_ids: list[int]
    main: Stream
    paths: list = field(default_factory=list)   # the open Unseen block's streams, in path order
    tokens_spent: int = 0           # response tokens so far (T)
    steps_spent: int = 0            # decode steps so far (D) outside an open Unseen block
    open_paths: int = 0             # paths not closed yet: one </Path> each is kept free
    closed_paths: int = 0           # Seen: the current block's paths closed so far
    blocks: int = 0
    done: str = ""                  # "", "eos" or "budget"
    number: int = 0                 # its row of Engine.uniforms (its place among the call's)
    draws: int = 0                  # tokens drawn for it so far (dropped draws too)


def ban_masks(tags: TagIds, vocab_size: int, allow_parallel: bool, device) -> dict:
    """The tags the runtime masks, by what a stream is writing: structural tags are the
    runtime's to inject, and a segment samples only its own closing tag (the main chain opens
    blocks until max_blocks). "sequential": plain sampling (<Parallel> masked if not allowed)."""
    structural = sorted(tags.structural)

    def ban_all_tags_but(*allowed: int) -> torch.Tensor:
        banned = torch.zeros(vocab_size, dtype=torch.bool)
        banned[structural] = True
        banned[list(allowed)] = False
        return banned.to(device)

    sequential = torch.zeros(vocab_size, dtype=torch.bool)
    sequential[tags.parallel] = not allow_parallel
    return {MAIN: ban_all_tags_but(tags.parallel),
            "main_after_max_blocks": ban_all_tags_but(),
            PATH: ban_all_tags_but(tags.end_path),
            SUMMARY: ban_all_tags_but(tags.end_summary),
            "sequential": sequential.to(device)}


class Engine:
    """The decode loop over the rows of one `generate` call (see the module docstring)."""

    def __init__(self, model, tags: TagIds, mode: str, sampling: SamplingConfig, pad_id: int,
                 seed: int = 0, stop: Callable[[], bool] | None = None):
        self.model = model
        self.tags = tags
        self.mode = mode
        self.sampling = sampling
        self.pad_id = pad_id
        self.seed = seed
        self.stop = stop
        self.uniforms = None               # run(): `response_draws`, a row per sample
        self.max_path_tokens = sampling.max_path_tokens or sampling.max_new_tokens
        weight = next(model.parameters())
        self.device = weight.device
        self.dtype = weight.dtype
        vocab_size = model.get_output_embeddings().weight.shape[0]
        self.bans = ban_masks(tags, vocab_size, sampling.allow_parallel, self.device)

    def response_capacity(self) -> int:
        """The most tokens a response can hold: the budget, or, when it counts decode steps,
        every step of an Unseen block writing a token on each of its paths."""
        if self.sampling.budget == "steps" and self.mode == "unseen":
            return self.sampling.max_new_tokens * self.sampling.num_paths
        return self.sampling.max_new_tokens

    # ---- the decode loop

    def run(self, prompts: list[list[int]], group_size: int,
            places: list[int] | None = None) -> list[Sample]:
        """Prefill every prompt once (left-padded), fan it out to group_size rows, decode until
        every row is done. `places`: each prompt's seed place (`response_draws`; None: its
        index)."""
        P = len(prompts)
        L = max(map(len, prompts))
        ids = torch.tensor([[self.pad_id] * (L - len(p)) + p for p in prompts])
        real = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])
        mask, positions = build_mask_and_positions(ids, [len(p) for p in prompts], real,
                                                   self.tags, "seen", self.dtype)
        # every response token is fed once, but the last; +1: the scratch slot of dummy queries
        capacity = L + self.response_capacity() + 1
        self.cache = cache = SlotCache(P * group_size, capacity, self.device, active_rows=P)
        cache.owner[:, :L] = real.to(self.device)                    # padding HIDDEN, prompt SHARED
        cache.slots = torch.arange(L, device=self.device).expand(P, L)
        cache.attend_to(L)
        with masked_sdpa(self.device):
            out = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                             position_ids=positions.to(self.device), cache=cache, use_cache=True,
                             logits_to_keep=1)
        cache.fan_out(group_size)
        # every fed token gets a draw, and so does the prompt's last: at most a response's tokens
        # plus one a sample
        self.uniforms = response_draws(self.seed, places or list(range(P)), group_size,
                                       self.response_capacity() + 1)
        samples = []
        for i in range(P):
            for _ in range(group_size):
                samples.append(Sample(i, prompts[i], Stream(MAIN, position=len(prompts[i])),
                                      number=len(samples)))
        self.rows = list(samples)
        self.slots_filled = [L] * len(samples)                       # per row
        last_logits = out.logits[:, -1].float().repeat_interleave(group_size, dim=0)
        self._choose_and_advance(last_logits, [(s, s.main) for s in samples])
        while self.rows:
            if self.stop is not None and self.stop():
                raise Stopped("generate() was stopped before its rollouts were done")
            self._step()
        return samples

    def _step(self):
        """One decode step: each row feeds its streams' tokens, then hidden dummy queries up to
        q (the most any row feeds), in one forward."""
        feeds = []
        for s in self.rows:
            streams = s.paths or [s.main]
            feeds.append([] if s.done else [st for st in streams if st.feed is not None])
        q = max(1, max(map(len, feeds)))
        ids = []                                   # per row: q tokens, their positions,
        positions = []
        codes = []                                 # ... who may see them,
        slots = []                                 # ... and the cache slots they go to
        for filled, fed in zip(self.slots_filled, feeds):
            dummies = q - len(fed)                 # hidden; they share one scratch slot
            ids.append([st.feed for st in fed] + [self.pad_id] * dummies)
            positions.append([st.position for st in fed] + [0] * dummies)
            codes.append([st.owner for st in fed] + [HIDDEN] * dummies)
            # the real queries' keys go to the row's next free slots (an Unseen block's paths
            # interleave there); every dummy writes the one slot after them, which the row's next
            # real token overwrites
            slots.append(list(range(filled, filled + len(fed))) + [filled + len(fed)] * dummies)
        self.slots_filled = [filled + len(fed) for filled, fed in zip(self.slots_filled, feeds)]
        cache = self.cache
        cache.slots = torch.tensor(slots, device=self.device)
        codes = torch.tensor(codes, device=self.device)
        cache.attend_to(max(row[-1] for row in slots) + 1)
        cache.owner[cache.row_ids, cache.slots] = codes   # before the forward: a query sees its
                                                           # own new key
        with masked_sdpa(self.device):
            out = self.model(input_ids=torch.tensor(ids, device=self.device),
                             attention_mask=cache.mask(codes, self.dtype),
                             position_ids=torch.tensor(positions, device=self.device),
                             cache=cache, use_cache=True)
        fed = [(s, st) for s, row in zip(self.rows, feeds) for st in row]
        for _, st in fed:
            st.position += 1
        logits = out.logits.flatten(0, 1).float()                   # (rows * q, V)
        if len(fed) < len(logits):                                  # keep the real queries'
            real = [r * q + i for r, row in enumerate(feeds) for i in range(len(row))]
            logits = logits[torch.tensor(real, device=self.device)]
        self._choose_and_advance(logits, fed)

    def _choose_and_advance(self, logits: torch.Tensor, fed: list):
        """Draw a token for every stream that fed (logits (n, V) float32, in `fed` order), give
        each stream its next token in that order (a sample spends its budget in path order), then
        drop the finished rows once they are half the batch."""
        banned = torch.stack([self.bans[self._ban_key(s, st)] for s, st in fed])
        eos = self.tags.eos
        if self.sampling.min_new_tokens:
            too_early = [s.tokens_spent < self.sampling.min_new_tokens for s, _ in fed]
            banned[:, eos] |= torch.tensor(too_early, device=self.device)
        first_of_path = [st.segment == PATH and st.path_len == 1 for _, st in fed]
        first_of_path = torch.tensor(first_of_path, device=self.device)[:, None]
        banned[:, [self.tags.end_path, eos]] |= first_of_path        # no empty path (NOTES.md §4)
        numbers = []                  # where each draw's number is in the flattened uniforms
        width = self.uniforms.shape[1]
        for s, _ in fed:
            numbers.append(s.number * width + s.draws)
            s.draws += 1
        uniforms = self.uniforms.view(-1)[torch.tensor(numbers)]
        chosen = draw_tokens(logits, banned, self.sampling, uniforms)
        # the log-prob under the softmax the token was drawn from: the banned tokens left out.
        # The rollout records what was banned, and the training forward leaves the same tokens
        # out, so the ratio compares like with like. Under the full softmax, a loss with a
        # negative advantage would push mass onto banned tags, which are never drawn and so
        # never pushed back (NOTES.md §8)
        logprobs = token_logprobs(logits.masked_fill(banned, float("-inf")), chosen,
                                  self.sampling.temperature)
        bans = banned[:, list(self.tags.maskable)].tolist()         # (n, K): Rollout.banned
        for (s, st), token, logprob, ban in zip(fed, chosen.tolist(), logprobs.tolist(), bans):
            verdict = self._draw_verdict(s, st, token)
            if verdict == SAMPLE_ENDED:
                continue
            self._advance(s, st, token, logprob, tuple(ban), verdict)
            if s.done:
                self._finish(s)
        live = [r for r, s in enumerate(self.rows) if not s.done]
        if 2 * len(live) <= len(self.rows):
            self.cache.keep_rows(live)
            self.rows = [self.rows[r] for r in live]
            self.slots_filled = [self.slots_filled[r] for r in live]

    def _ban_key(self, s: Sample, st: Stream) -> str:
        if self.mode == "sequential":
            return "sequential"
        if st.segment == MAIN and s.blocks >= self.sampling.max_blocks:
            return "main_after_max_blocks"
        return st.segment

    # ---- the budget: max_new_tokens bounds T (every response token), or D (decode steps)
    #
    # What a token costs: 1. In decode steps (budget="steps") the paths of an Unseen block decode
    # side by side, so a path's token costs only what it adds to the block's longest path; Seen
    # writes one token a step, so there D = T. What a path reserves: its </Path>, kept free from
    # its <Path> on, so that a path the budget cuts still closes (the path budget,
    # max_path_tokens, closes it the same way): an unclosed path would, under the parser's
    # recovery, run to the end of the response and take its sibling paths in, and the training
    # mask would no longer be the one the tokens were sampled under. Nothing is reserved for
    # </Parallel> or the summary: a response cut there is malformed, and parses as sampled.
    # So opening paths needs room for every new path's <Path> and </Path>, 2 tokens a path; in
    # decode steps an Unseen block's paths open side by side: 2 steps for all of them. Whatever
    # does not fit ends the sample ("budget"): a drawn token that does not fit is dropped
    # (OVER_BUDGET, `_draw_verdict`), an injected one is not written (`_append`).

    def _committed(self, s: Sample, growing: Stream | None = None) -> int:
        """What the sample has spent and reserved: T (or D) plus a </Path> for every open path;
        in decode steps, an open Unseen block counts as its longest path, an open path with its
        </Path>. `growing`: with one more token of that stream."""
        if self.sampling.budget == "steps" and s.paths:
            return s.steps_spent + self._block_steps(s, growing)
        spent = s.tokens_spent
        if self.sampling.budget == "steps":
            spent = s.steps_spent
        return spent + s.open_paths + (growing is not None)

    def _block_steps(self, s: Sample, growing: Stream | None = None) -> int:
        """The decode steps the open Unseen block takes at least: its longest path, an open path
        counted with its </Path> (`growing`: with one more token)."""
        steps = 0
        for path in s.paths:
            length = path.path_len + (path.pending != PATH_DONE) + (path is growing)
            steps = max(steps, length)
        return steps

    def _fits(self, s: Sample, growing: Stream | None = None, new_paths: int = 0) -> bool:
        """Whether the budget holds one more token of `growing`, or the opening of `new_paths`
        paths (each <Path> with its </Path>; see above)."""
        committed = self._committed(s, growing)
        if new_paths and self.sampling.budget == "steps" and self.mode == "unseen":
            committed += 2
        elif new_paths:
            committed += 2 * new_paths
        return committed <= self.sampling.max_new_tokens

    def _append(self, s: Sample, st: Stream, token: int, sampled: int, logprob: float,
                closing: bool = False, banned: tuple[bool, ...] | None = None) -> bool:
        """Append a response token to a stream; False (and the sample is done) once the budget is
        spent. A closing </Path> spends the token kept free for it. banned: what its draw masked
        (None: injected, nothing drawn)."""
        if closing:
            s.open_paths -= 1
        elif not self._fits(s, growing=st):        # the sample ends; this token is dropped
            s.done = "budget"
            return False
        s.tokens_spent += 1
        if st.owner == SHARED:                     # paths of an Unseen block count at its close
            s.steps_spent += 1
        if banned is None:
            banned = (False,) * len(self.tags.maskable)
        st.tokens.append((token, sampled, logprob, banned))
        if st.segment == PATH:
            st.path_len += 1
        return True

    # ---- the transitions

    def _draw_verdict(self, s: Sample, st: Stream, token: int) -> str:
        """What becomes of `token`, drawn from the logits of the stream's fed token: KEPT, or the
        reason the runtime drops it (the constants above; the first that holds). Kept: the token
        joins the response as sampled. Dropped: it leaves no trace, and `_advance` does what the
        reason says. Pure: it reads the sample, changes nothing."""
        if s.done:
            return SAMPLE_ENDED
        if st.pending == OPEN_BLOCK:
            return BLOCK_OPENS
        if st.pending == PATH_DONE:
            return PATH_CLOSED
        if st.forced:
            return FORCED_NEXT
        in_path = st.segment == PATH
        if in_path and token == self.tags.end_path:   # even at the path budget: kept free for it
            return KEPT
        if in_path and st.path_len + 1 >= self.max_path_tokens:
            return PATH_BUDGET
        if in_path and token == self.tags.eos:
            return EOS_IN_PATH
        if st.segment == SUMMARY and token == self.tags.eos:
            return EOS_IN_SUMMARY
        if self.sampling.open_block and st.segment == MAIN and not st.tokens:
            return FORCED_BLOCK
        if not self._fits(s, growing=st):
            return OVER_BUDGET
        return KEPT

    def _advance(self, s: Sample, st: Stream, token: int, logprob: float,
                 banned: tuple[bool, ...], verdict: str):
        """The stream's `feed` is in the cache and `token` was drawn from its logits (`logprob`;
        `banned`: what the draw masked); `verdict`: `_draw_verdict`'s, not SAMPLE_ENDED. Make the
        stream's pending transition, or give it its next token: `token` if kept, else what the
        runtime writes instead."""
        if verdict == BLOCK_OPENS:
            st.pending = None
            return self._open_block(s)
        if verdict == PATH_CLOSED:
            st.feed = None
            if all(p.feed is None for p in s.paths):
                self._close_block(s)
            return
        if verdict == FORCED_NEXT:
            return self._inject(s, st)
        if verdict in (PATH_BUDGET, EOS_IN_PATH):
            return self._end_path(s, st, sampled=0, logprob=0.0)
        if verdict == OVER_BUDGET:
            s.done = "budget"
            return
        if st.segment == PATH and token == self.tags.end_path:
            return self._end_path(s, st, sampled=1, logprob=logprob, banned=banned)
        sampled = 1
        if verdict == FORCED_BLOCK:
            token = self.tags.parallel
        if verdict == EOS_IN_SUMMARY:
            token = self.tags.end_summary
        if verdict in (FORCED_BLOCK, EOS_IN_SUMMARY):   # dropped: the runtime's token instead
            sampled = 0
            logprob = 0.0
            banned = None
        if not self._append(s, st, token, sampled, logprob, banned=banned):
            return
        st.feed = token
        if token == self.tags.eos:
            s.done = "eos"
        elif self.mode == "sequential":
            return
        elif token == self.tags.end_summary:
            st.segment = MAIN
        elif token == self.tags.parallel:
            self._start_block(s, st)

    def _inject(self, s: Sample, st: Stream):
        """Give the stream its next forced token (injected, not sampled)."""
        token = st.forced.pop(0)
        if token == self.tags.path:                # Seen: a new path; keep its </Path> free
            if not self._fits(s, new_paths=1):
                s.done = "budget"
                return
            s.open_paths += 1
            st.path_len = 0
        if self._append(s, st, token, 0, 0.0):
            st.feed = token

    def _start_block(self, s: Sample, st: Stream):
        """The main chain sampled <Parallel>: Unseen opens the paths once it is fed; Seen goes
        on in this stream with an injected <Path>."""
        s.blocks += 1
        s.closed_paths = 0
        if self.mode == "unseen":
            st.pending = OPEN_BLOCK
        else:
            st.segment = PATH
            st.forced = [self.tags.path]

    def _open_block(self, s: Sample):
        """Unseen, <Parallel> is in the cache: num_paths paths start at p+1, each with an
        injected <Path>, each writing slots only it sees."""
        s.main.feed = None
        num_paths = self.sampling.num_paths
        if not self._fits(s, new_paths=num_paths):   # a malformed response: <Parallel> unclosed
            s.done = "budget"
            return
        s.open_paths += num_paths
        s.paths = [Stream(PATH, position=s.main.position, owner=FIRST_PATH_OWNER + j,
                          feed=self.tags.path)
                   for j in range(num_paths)]
        for path in s.paths:
            self._append(s, path, self.tags.path, 0, 0.0)

    def _end_path(self, s: Sample, st: Stream, sampled: int, logprob: float,
                  banned: tuple[bool, ...] | None = None):
        """Append the path's </Path> (it spends the token kept free for it). Unseen: the path
        waits; Seen: the next path, or the summary."""
        self._append(s, st, self.tags.end_path, sampled, logprob, closing=True, banned=banned)
        st.feed = self.tags.end_path
        if self.mode == "unseen":
            st.pending = PATH_DONE
        elif s.closed_paths + 1 < self.sampling.num_paths:
            s.closed_paths += 1
            st.forced = [self.tags.path]
        else:
            st.segment = SUMMARY
            st.forced = [self.tags.end_parallel, *self.tags.newline, self.tags.summary]

    def _close_block(self, s: Sample):
        """Every path of the sample's open Unseen block has fed its </Path>: close the block.
        1. The paths' slots in the sample's cache row (row i of the cache is self.rows[i]: both
           drop finished rows together; owner above SHARED) become SHARED: what follows sees
           every path, and nothing is copied.
        2. The paths' tokens join the main chain's, path 1 first (the training layout).
        3. The main chain's position is still p + 1 (p: <Parallel>'s); it moves on by the longest
           path's length (`path_len`, <Path> and </Path> included), so that </Parallel> sits at
           p + longest + 1, and the block spends that many decode steps (`steps_spent`).
        4. `s.paths` empties; then </Parallel> is appended to the main chain (`_append`, injected:
           sampled 0, log-prob 0.0). If the budget lets it in, the main chain feeds it next,
           writes the SUMMARY segment, and the newline and <Summary> are forced after it."""
        # >>> exercise 9: the sampler: closing an Unseen block
        owner = self.cache.owner[self.rows.index(s)]
        owner.masked_fill_(owner > SHARED, SHARED)
        main = s.main
        for path in s.paths:
            main.tokens += path.tokens
        longest = max(path.path_len for path in s.paths)
        main.position += longest
        s.steps_spent += longest
        s.paths = []
        if self._append(s, main, self.tags.end_parallel, 0, 0.0):
            main.feed = self.tags.end_parallel
            main.segment = SUMMARY
            main.forced = [*self.tags.newline, self.tags.summary]
        # <<< exercise 9

    def _finish(self, s: Sample):
        """The sample is done: close what is open, so that the response parses into the spans it
        was sampled with."""
        for st in s.paths or [s.main]:             # Unseen: every open path; Seen: the main chain
            path_open = st.segment == PATH and st.pending != PATH_DONE
            if path_open and s.open_paths:
                self._append(s, st, self.tags.end_path, 0, 0.0, closing=True)
        for path in s.paths:
            s.main.tokens += path.tokens
        s.paths = []


def critical_path(structure: Structure, mode: str) -> int:
    """D: decode steps a machine needs that decodes the paths of an Unseen block side by side:
    every token counts, but a block's paths count as their longest (Seen, sequential: D = T)."""
    steps = structure.length
    if mode != "unseen":
        return steps
    for block in structure.blocks:
        lengths = [end - start for start, end in block.paths]
        steps -= sum(lengths) - max(lengths, default=0)
    return steps


@torch.inference_mode()
def generate(model, tokenizer, prompts, group_size: int = 1, mode: str = "unseen",
             sampling: SamplingConfig | None = None, places: list[int] | None = None,
             stop: Callable[[], bool] | None = None, **settings) -> list[Rollout]:
    """`group_size` responses per prompt (strings or id lists), prompt-major, from a Hugging Face
    causal LM in eval mode. `sampling` (default SamplingConfig()), with any of its fields given
    as keywords instead (`generate(..., temperature=0.7, max_new_tokens=128)`). The same seed
    and inputs give the same rollouts; a prompt's responses draw from numbers seeded by the seed
    and the prompt's place, `places[i]` (default: its index; `response_draws`), so they do not
    depend on the other prompts of the call (up to float rounding of the batched forward).
    `Rollout.logprobs`: of each sampled token under the tag masks (`Rollout.banned`) but before
    top-p and top-k, the training forward's quantity. `stop`: asked before every decode step; once
    it returns True, `Stopped` is raised (a preemption abandons the step). ValueError for a
    setting out of range."""
    sampling = dataclasses.replace(sampling or SamplingConfig(), **settings)
    encoded = []
    for p in prompts:
        if isinstance(p, str):
            encoded.append(tokenizer.encode(p, add_special_tokens=False))
        else:
            encoded.append(list(p))
    if places is not None and len(places) != len(encoded):
        raise ValueError(f"places: {len(places)} for {len(encoded)} prompts; give one a prompt")
    tags = TagIds.from_tokenizer(tokenizer)
    seed = sampling.seed
    if seed is None:
        seed = np.random.SeedSequence().entropy            # fresh, the global RNGs untouched
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tags.eos
    engine = Engine(model, tags, mode, sampling, pad_id, seed, stop)
    with folded_query_attention_for_sdpa():     # no copy of the cache's keys and values
        samples = engine.run(encoded, group_size, places)
    rollouts = []
    for s in samples:
        ids = [token for token, _, _, _ in s.main.tokens]
        structure = parse_structure(ids, tags)
        shown = ids[:-1] if ids[-1:] == [tags.eos] else ids
        text = tokenizer.decode(shown, skip_special_tokens=False)
        rollouts.append(Rollout(
            prompt_index=s.prompt_index,
            prompt_ids=s.prompt_ids,
            response_ids=ids,
            sampled_mask=[sampled for _, sampled, _, _ in s.main.tokens],
            logprobs=[logprob for _, _, logprob, _ in s.main.tokens],
            banned=[banned for _, _, _, banned in s.main.tokens],
            structure=structure,
            num_tokens=len(ids),
            critical_path=critical_path(structure, mode),
            finish_reason=s.done or "budget",
            text=text))
    return rollouts


# ---- python sample.py --model=<checkpoint>: a few responses, each block laid out

PROBLEMS = ("Which two of 4 9 5 1 make 9?", "Which two of 3 1 2 8 6 make 5?",
            "Which two of 4 6 8 3 5 9 make 8?")


@dataclass
class SampleConfig(SamplingFlags):
    """python sample.py --model=<checkpoint>: sample a few responses and print their paths."""
    model: str = "tiny"                    # a checkpoint folder, a hub name, or tiny (random)
    prompt: str = ""                       # as the model reads it ("\\n" = newline)
    n: config.PositiveInt = 3              # responses per prompt
    mode: Mode | None = None               # None = the checkpoint's training mode, else unseen
    seed: config.Seed = 0


def layout(rollout: Rollout, tokenizer) -> str:
    """A response laid out: main-chain text as written, each block's paths indented one per line,
    then its summary (tags and EOS dropped; a newline inside a path or a summary shows as \\n)."""
    ids = rollout.response_ids

    def text(a: int, b: int) -> str:
        return tokenizer.decode(ids[a:b], skip_special_tokens=True)

    def one_line(a: int, b: int) -> str:
        return text(a, b).replace("\n", "\\n")

    lines = []
    i = 0                                          # where the text not yet shown starts
    for block in rollout.structure.blocks:
        lines += [text(i, block.start).strip("\n"), "<Parallel>"]
        lines += [f"    <Path> {one_line(s, e)}" for s, e in block.paths]
        if block.summary:
            lines.append(f"<Summary> {one_line(*block.summary)}")
            i = block.summary[1]
        elif block.end is not None:
            i = block.end + 1
        else:
            i = max([block.start + 1] + [e for _, e in block.paths])
    lines.append(text(i, len(ids)).strip("\n"))
    return "\n".join(line for line in lines if line)


def main(argv: list[str]) -> None:
    cfg = config.parse(SampleConfig, argv)
    mode = cfg.mode or mode_from_config(read_checkpoint_config(cfg.model)[0]) or "unseen"
    model, tokenizer = load_model(cfg.model)
    if cfg.prompt:
        prompts = [cfg.prompt.replace("\\n", "\n")]
    else:
        prompts = [p + "\n" for p in PROBLEMS]     # the tiny model's layout
    sampling = cfg.sampling_config(seed=cfg.seed, allow_parallel=mode != "sequential")
    context = getattr(model.config, "max_position_embeddings", None)
    longest = max(len(tokenizer.encode(p, add_special_tokens=False)) for p in prompts)
    if context and longest + sampling.max_new_tokens > context:   # positions it never learned
        raise ValueError(f"a {longest}-token prompt + --max_new_tokens={sampling.max_new_tokens} "
                         f"is more than the model's context of {context} positions: lower "
                         "--max_new_tokens or shorten --prompt")
    rollouts = generate(model, tokenizer, prompts, group_size=cfg.n, mode=mode, sampling=sampling)
    for j, r in enumerate(rollouts):
        if j % cfg.n == 0:
            print(f"=== {prompts[r.prompt_index]!r} ({cfg.model}, mode {mode})")
        malformed = "" if r.structure.valid else f", malformed: {r.structure.reason}"
        print(f"--- sample {j % cfg.n + 1}: {r.finish_reason}, {r.num_tokens} tokens, critical "
              f"path {r.critical_path}, {len(r.structure.blocks)} block(s){malformed}")
        print(layout(r, tokenizer))


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (OSError, ValueError) as e:              # bad input: the message says what to do
        sys.exit(f"sample.py: error: {e}")
