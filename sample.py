"""The branching sampler: parallel paths decoded truly in parallel from a shared KV cache.

    rollouts = generate(model, tokenizer, prompts, group_size=8, mode="unseen")

What happens to one sample in `mode="unseen"` (PAPER_NOTES §1.4, with the fixes of §8.2.3-4):

    main chain   ... The total is<Parallel>                     sampled until <Parallel>, EOS or the budget
    fork         the row's KV cache is copied into num_paths rows; the runtime injects <Path> into each
    paths        <Path>3*7=21</Path>  |  <Path>4*6=24</Path>     decoded side by side in one batch; each path
                                                                sees the prefix and itself only, and its
                                                                tokens sit at positions p+1, p+2, ... (p =
                                                                position of <Parallel>) in every path
    merge        one row again: prefix + path 1 + ... + path N; the cached keys are concatenated (they
                 already carry their rotary positions), nothing is recomputed
    summary      </Parallel>\\n<Summary> injected at position p + longest path + 1, then sampled until </Summary>
    main chain   continues: more blocks, then "Final Answer: 45" and EOS

This is exactly the context that `attention.build_mask_and_positions(mode="unseen")` gives the
training forward, so the log-probs recorded here equal the training forward's (tests/test_sample.py
checks it to 1e-4) -- the official code samples paths with plain causal attention in vLLM and then
trains under a different mask and different positions (§2.4, §8.1.2).

`mode="seen"` builds the same structure, but the paths are generated one after another in the same row
with ordinary causal attention (path 2 sees path 1): the Seen model's training context.
`mode="sequential"` is plain autoregressive sampling (the baseline); `allow_parallel=False` masks
<Parallel> out.

The engine (in the spirit of nanochat's): every live row feeds exactly one token per decode step --
the token it just sampled, or the next *forced* token the runtime injects (<Path>, </Parallel>, the
newline, <Summary>). After a step, rows that forked, merged or finished are re-laid into a new compact
cache with one `attention.gather_cache` call; finished rows leave the batch there. A path that has
closed waits ("parked": fed a dummy token whose slot is hidden) until its siblings close, then the
block merges. Budgets: `max_new_tokens` counts every response token of a sample (paths, summaries and
injected tags included, as in the paper); room for each open path's closing </Path> is reserved so a
truncated response still parses into the same spans it was sampled with.

Run `python sample.py --bench` for the speed table in the README.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # idle OpenMP threads sleep (see sft.py)

import torch

from attention import Structure, TagIds, build_mask_and_positions, gather_cache, parse_structure


@dataclass
class Rollout:
    """One sampled response. All lists are aligned with `response_ids`."""

    prompt_index: int               # index into the `prompts` argument
    prompt_ids: list[int]
    response_ids: list[int]         # canonical serialized layout (what training forwards over)
    sampled_mask: list[int]         # 1 = sampled by the model, 0 = injected by the runtime
    logprobs: list[float]           # log softmax(logits / temperature)[token] for sampled tokens, 0.0 where injected
    structure: Structure            # attention.parse_structure(response_ids)
    num_tokens: int                 # T: tokens in the response (paths, summaries and injected tags included)
    critical_path: int              # D: decode steps a parallel machine needs (paths of a block overlap)
    finish_reason: str              # "eos" or "budget"
    text: str = ""                  # decoded response with the tags, without a final EOS


# ----------------------------------------------------------------------------------------------------
# Sampling a token


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / temperature) at `tokens`.

    logits: (..., V) any float dtype (computed in float32); tokens: (...) long. Returns (...) float32.
    The same function scores the sampler's choices and the training forward's targets, so the two
    agree by construction. `temperature` <= 0 is treated as 1 (greedy decoding has no temperature).
    """
    t = temperature if temperature > 0 else 1.0
    logits = logits.float() / t
    return logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def _choose(logits: torch.Tensor, banned: torch.Tensor, temperature: float, top_p: float, top_k: int,
            greedy: bool, gen: torch.Generator) -> torch.Tensor:
    """Pick one token per row. logits (R, V) float32; banned (R, V) bool (runtime-masked tags).

    Temperature, then top-k, then top-p (nucleus) truncation, then a multinomial draw from `gen`.
    """
    logits = logits.masked_fill(banned, float("-inf"))
    if greedy or temperature <= 0:
        return logits.argmax(-1)
    logits = logits / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) > top_p    # keep the smallest prefix whose mass reaches top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    probs = logits.softmax(-1)
    return torch.multinomial(probs.cpu(), 1, generator=gen).squeeze(-1).to(logits.device)


# ----------------------------------------------------------------------------------------------------
# Engine state


@dataclass
class _Sample:
    """Bookkeeping of one rollout while it is being generated."""

    prompt_index: int
    prompt_ids: list[int]
    tokens: list[int] = field(default_factory=list)     # serialized response so far
    sampled: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    used: int = 0                   # response tokens counted against the budget (all of its rows)
    open_paths: int = 0             # paths not closed yet: one </Path> each is reserved in the budget
    blocks: int = 0
    done: str = ""                  # "", "eos" or "budget"

    def push(self, tok: int, sampled: int, lp: float):
        self.tokens.append(tok); self.sampled.append(sampled); self.logprobs.append(lp)


@dataclass
class _Block:
    """An Unseen parallel block while its paths are decoded in separate rows."""

    parallel_pos: int               # position id of <Parallel>
    prefix_slots: int               # cache slots the paths share (everything up to <Parallel>)
    rows: list = field(default_factory=list)            # the path rows, in path order
    flushed: bool = False           # paths copied into the sample's serialized tokens


@dataclass
class _Row:
    """One row of the batched KV cache: a sample's main chain, or one path of an Unseen block."""

    sample: _Sample
    kind: str                       # "main" | "path" | "summary" (what the row samples next)
    feed: int                       # the token this row feeds at the next decode step
    pos: int                        # the position id of `feed`
    queue: list[int] = field(default_factory=list)     # forced tokens to feed after `feed`
    after: str = ""                 # "fork" or "park": what happens once `feed` is in the cache
    path_len: int = 0               # tokens of the current path so far (<Path> included)
    block: _Block | None = None     # Unseen path rows: their block ...
    seg: list | None = None         # ... and their own tokens as (token, sampled, logprob)
    closed: bool = False            # Unseen path rows: </Path> appended
    parked: bool = False            # Unseen path rows: closed and waiting for the siblings

    def push(self, tok: int, sampled: int, lp: float):
        if self.seg is not None:
            self.seg.append((tok, sampled, lp))
        else:
            self.sample.push(tok, sampled, lp)
        if self.kind == "path":
            self.path_len += 1


class _Engine:
    def __init__(self, model, tags: TagIds, vocab_size: int, mode: str, num_paths: int, max_new_tokens: int,
                 max_path_tokens: int, max_blocks: int, allow_parallel: bool, temperature: float, top_p: float,
                 top_k: int, greedy: bool, gen: torch.Generator, pad_id: int, min_new_tokens: int = 0):
        self.model, self.tags, self.mode = model, tags, mode
        self.min_new_tokens = min_new_tokens
        self.num_paths, self.max_new_tokens, self.max_path_tokens = num_paths, max_new_tokens, max_path_tokens
        self.max_blocks = max_blocks
        self.temperature, self.top_p, self.top_k, self.greedy, self.gen = temperature, top_p, top_k, greedy, gen
        self.pad_id = pad_id
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        # Structural tags are the runtime's to inject: each segment may only sample its own closing tag
        # (and the main chain <Parallel>, until max_blocks).
        structural = sorted(tags.structural)
        ban = {k: torch.zeros(vocab_size, dtype=torch.bool) for k in ("main", "main_full", "path", "summary", "free")}
        for k in ("main", "main_full", "path", "summary"):
            ban[k][structural] = True
        ban["main"][tags.parallel] = False
        ban["path"][tags.end_path] = False
        ban["summary"][tags.end_summary] = False
        ban["free"][tags.parallel] = not allow_parallel
        self.ban = {k: v.to(self.device) for k, v in ban.items()}

    # -- budget ------------------------------------------------------------------------------------
    def _append(self, row: _Row, tok: int, sampled: int, lp: float, closing: bool = False) -> bool:
        """Append a response token to `row`; False (and the sample ends) once the budget is spent.

        Each open path holds one reserved slot for its </Path>; a closing </Path> spends it."""
        s = row.sample
        if closing:
            s.open_paths -= 1
        elif self.max_new_tokens - s.used - s.open_paths < 1:
            s.done = "budget"
            return False
        s.used += 1
        row.push(tok, sampled, lp)
        return True

    # -- the decode loop ---------------------------------------------------------------------------
    def run(self, prompts: list[list[int]], group_size: int) -> list[_Sample]:
        P, L = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((P, L), self.pad_id, dtype=torch.long)
        am = torch.zeros(P, L, dtype=torch.long)
        for i, p in enumerate(prompts):                   # left padding: every prompt ends in the last column
            ids[i, L - len(p):] = torch.tensor(p)
            am[i, L - len(p):] = 1
        mask, pos = build_mask_and_positions(ids, [len(p) for p in prompts], am, self.tags, "seen", self.dtype)
        out = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                         position_ids=pos.to(self.device), use_cache=True, logits_to_keep=1)
        # Fork each prompt's cache to its group_size rows: the prompt is computed once.
        src = torch.arange(P).repeat_interleave(group_size)
        index = (src[:, None] * L + torch.arange(L)[None, :]).masked_fill(~am.bool()[src], -1)
        self.cache = gather_cache(out.cache, index)
        self.valid = am.bool()[src].to(self.device)       # (R, S): which cache slots each row may attend to
        samples = [_Sample(i, prompts[i]) for i in src.tolist()]
        self.rows = [_Row(s, "main", feed=-1, pos=len(s.prompt_ids)) for s in samples]
        self._decide(out.logits[:, -1].float()[src.to(self.device)])
        while self.rows:
            self._step()
        return samples

    def _step(self):
        """One decode step: every row feeds one token (parked rows a hidden dummy)."""
        R = len(self.rows)
        live = torch.tensor([not r.parked for r in self.rows], device=self.device)
        inp = torch.tensor([[self.pad_id if r.parked else r.feed] for r in self.rows], device=self.device)
        pos = torch.tensor([[0 if r.parked else r.pos] for r in self.rows], device=self.device)
        vis = torch.cat([self.valid, torch.ones(R, 1, dtype=torch.bool, device=self.device)], dim=1)
        mask = torch.zeros(R, 1, 1, vis.shape[1], dtype=self.dtype, device=self.device)
        mask.masked_fill_(~vis[:, None, None, :], torch.finfo(self.dtype).min)   # (R, 1, 1, S+1) additive
        out = self.model(input_ids=inp, attention_mask=mask, position_ids=pos, cache=self.cache, use_cache=True)
        self.cache = out.cache
        self.valid = torch.cat([self.valid, live[:, None]], dim=1)   # a dummy slot stays hidden forever
        for r in self.rows:
            r.pos += not r.parked
        self._decide(out.logits[:, -1].float())

    def _decide(self, logits: torch.Tensor):
        """Give every live row its next token (forced or sampled) and apply the structural transitions.

        logits: (R, V) float32, the next-token logits of each row."""
        tags = self.tags
        ready = {id(r) for r in self.rows if r.after}     # their fork/park token is in the cache now
        kinds = ["free" if self.mode == "sequential" else
                 ("main_full" if r.sample.blocks >= self.max_blocks else "main") if r.kind == "main" else r.kind
                 for r in self.rows]
        banned = torch.stack([self.ban[k] for k in kinds])
        if self.min_new_tokens:                           # no EOS before min_new_tokens (benchmarks)
            banned[:, tags.eos] |= torch.tensor([r.sample.used < self.min_new_tokens for r in self.rows],
                                                device=banned.device)
        chosen = _choose(logits, banned, self.temperature, self.top_p, self.top_k, self.greedy, self.gen)
        lps = token_logprobs(logits, chosen, self.temperature).tolist()
        chosen = chosen.tolist()
        for i, r in enumerate(self.rows):
            s = r.sample
            if r.parked or s.done or r.after:            # forks and parks happen in _relayout
                continue
            if r.queue:                                   # a forced token: injected, not sampled
                tok = r.queue.pop(0)
                if tok == tags.path:                      # Seen: a new path; reserve its </Path>
                    r.path_len = 0
                    if self.max_new_tokens - s.used - s.open_paths < 2:
                        s.done = "budget"
                        continue
                    s.open_paths += 1
                if self._append(r, tok, 0, 0.0):
                    r.feed = tok
                    if tok == tags.summary:
                        r.kind = "summary"
                continue
            if r.kind == "path" and r.path_len + 1 >= self.max_path_tokens:
                self._end_path(r, tags.end_path, 0, 0.0)  # per-path budget: inject </Path>
                continue
            tok, sampled, lp = chosen[i], 1, lps[i]
            if r.kind == "path" and tok in (tags.end_path, tags.eos):
                if tok == tags.eos:                       # EOS inside a path -> injected </Path>
                    tok, sampled, lp = tags.end_path, 0, 0.0
                self._end_path(r, tok, sampled, lp)
                continue
            if r.kind == "summary" and tok == tags.eos:   # EOS inside a summary -> injected </Summary>
                tok, sampled, lp = tags.end_summary, 0, 0.0
            if not self._append(r, tok, sampled, lp):
                continue
            r.feed = tok
            if tok == tags.eos:
                s.done = "eos"
            elif self.mode == "sequential":
                continue
            elif tok == tags.end_summary:
                r.kind = "main"
            elif tok == tags.parallel:
                s.blocks += 1
                if self.mode == "unseen":
                    r.after = "fork"                      # fork once <Parallel> is in the cache
                else:                                     # Seen: the paths follow in this row
                    r.kind, r.queue = "path", [tags.path]
        self._relayout(ready)

    def _end_path(self, r: _Row, tok: int, sampled: int, lp: float):
        """Append the path's </Path> (it spends the slot reserved when the path opened)."""
        self._append(r, tok, sampled, lp, closing=True)
        r.feed = tok
        if self.mode == "unseen":
            r.closed, r.after = True, "park"              # park once </Path> is in the cache
            return
        s = r.sample                                      # Seen: next path, or the summary, in this row
        last = len(s.tokens) - 1 - s.tokens[::-1].index(self.tags.parallel)
        if s.tokens[last:].count(self.tags.end_path) < self.num_paths:
            r.queue = [self.tags.path]
        else:
            r.kind, r.queue = "summary", [self.tags.end_parallel, *self.tags.newline, self.tags.summary]

    # -- fork / park / merge / drop: one gather of the cache ---------------------------------------
    def _relayout(self, ready: set):
        """Fork, park, merge and drop rows, then gather the cache into the new row order.

        `ready`: ids of rows whose <Parallel> or </Path> was fed in the last step (so is in the cache)."""
        tags, rows = self.tags, self.rows
        S = self.valid.shape[1]
        slots = [self.valid[i].nonzero().flatten() + i * S for i in range(len(rows))]   # flat cache indices
        new_rows, new_slots, changed = [], [], False
        for r in rows:
            if r.after == "park" and id(r) in ready:
                r.parked, r.after = True, ""
        for i, r in enumerate(rows):
            s = r.sample
            forked = r.after == "fork" and id(r) in ready
            if forked and not s.done:                     # Unseen: one row becomes num_paths rows
                r.after, changed = "", True
                N = self.num_paths
                if self.max_new_tokens - s.used - s.open_paths < 2 * N:   # no room for N x <Path></Path>
                    s.done = "budget"
                else:
                    blk = _Block(parallel_pos=r.pos - 1, prefix_slots=len(slots[i]))
                    s.open_paths += N
                    for _ in range(N):
                        child = _Row(s, "path", feed=tags.path, pos=blk.parallel_pos + 1, block=blk, seg=[])
                        self._append(child, tags.path, 0, 0.0)           # inject <Path> into every path
                        blk.rows.append(child)
                        new_rows.append(child)
                        new_slots.append(slots[i])
            if s.done:
                changed = True
                self._end_sample(r)
                continue
            if r.parked:
                blk = r.block
                if not all(c.parked for c in blk.rows):
                    new_rows.append(r)
                    new_slots.append(slots[i])
                    continue
                if r is not blk.rows[-1]:                 # merge once, at the last sibling
                    continue
                changed = True                            # merge: prefix + path 1 + ... + path N
                where = {id(c): j for j, c in enumerate(rows)}
                merged = [slots[where[id(blk.rows[0])]]]
                merged += [slots[where[id(c)]][blk.prefix_slots:] for c in blk.rows[1:]]
                self._flush(blk)
                longest = max(c.path_len for c in blk.rows)
                m = _Row(s, "summary", feed=tags.end_parallel, pos=blk.parallel_pos + longest + 1,
                         queue=[*tags.newline, tags.summary])
                if self._append(m, tags.end_parallel, 0, 0.0):
                    new_rows.append(m)
                    new_slots.append(torch.cat(merged))
                continue
            if not forked:
                new_rows.append(r)
                new_slots.append(slots[i])
        assert changed or len(new_rows) == len(rows), "internal: rows dropped without a re-layout"
        self.rows = new_rows
        if not changed or not new_rows:
            return
        width = max(len(x) for x in new_slots)
        index = torch.full((len(new_rows), width), -1, dtype=torch.long)
        for j, x in enumerate(new_slots):                 # left-pad: every row ends at the last slot
            index[j, width - len(x):] = x.cpu()
        self.cache = gather_cache(self.cache, index)
        self.valid = (index >= 0).to(self.device)

    def _end_sample(self, r: _Row):
        """The sample ended: close what is open so the response parses into the spans it was sampled with."""
        s = r.sample
        if r.block is not None:
            if not r.closed:
                r.closed = True
                self._append(r, self.tags.end_path, 0, 0.0, closing=True)
            if r is r.block.rows[-1]:
                self._flush(r.block)
        elif s.open_paths > 0:                            # Seen, inside a path
            self._append(r, self.tags.end_path, 0, 0.0, closing=True)

    def _flush(self, blk: _Block):
        if not blk.flushed:
            blk.flushed = True
            for c in blk.rows:
                for item in c.seg:
                    c.sample.push(*item)


# ----------------------------------------------------------------------------------------------------
# Public entry point


def critical_path_length(structure: Structure, mode: str) -> int:
    """D: decode steps a machine that runs the paths of a block side by side needs for this response.

    Unseen: T minus, for each block, (sum of its path lengths - its longest path). Seen and sequential
    decode everything in one chain: D = T.
    """
    if mode != "unseen":
        return structure.length
    saved = sum(sum(e - s for s, e in b.paths) - max((e - s for s, e in b.paths), default=0) for b in structure.blocks)
    return structure.length - saved


@torch.no_grad()
def generate(model, tokenizer, prompts, group_size: int = 1, mode: str = "unseen", max_new_tokens: int = 256,
             max_path_tokens: int | None = None, num_paths: int = 2, max_blocks: int = 4,
             allow_parallel: bool = True, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
             greedy: bool = False, seed: int | None = None, min_new_tokens: int = 0) -> list[Rollout]:
    """Sample `group_size` responses for each prompt with the branching runtime.

    Args:
        model: a causal LM from `model.load_model` (any device/dtype). Put in eval mode by the caller.
        tokenizer: its tokenizer (with the six tags).
        prompts: list of prompt strings (tokenized without special tokens) or of token-id lists.
        group_size: samples per prompt (GRPO's G). The prompt is prefilled once and its cache forked.
        mode: "unseen" (paths in parallel, isolated, multiverse positions), "seen" (paths one after
            another, causal), or "sequential" (plain sampling, no injection).
        max_new_tokens: response budget per sample, counted over all tokens incl. paths, summaries
            and injected tags (the paper's 3000 for real models).
        max_path_tokens: budget of one path including its <Path> and </Path>; default max_new_tokens.
            A path that reaches it is closed with an injected </Path>.
        num_paths: paths per block, N >= 2 (the paper: 2).
        max_blocks: once a sample has this many blocks <Parallel> is masked out, so the model goes on
            to an answer (the official code instead ends the episode with no answer, §8.2.3).
        allow_parallel: sequential mode only: False masks <Parallel> out.
        temperature, top_p, top_k, greedy: sampling; top_k=0 and top_p=1 disable truncation.
        seed: seeds the sampling generator: the same seed and inputs give the same rollouts.
        min_new_tokens: EOS is masked out until a sample has this many tokens (as in HF generate).
    Returns:
        `len(prompts) * group_size` `Rollout`s, prompt-major (prompt 0's group first).
        `Rollout.logprobs` is log softmax(logits / temperature) of each *sampled* token, taken before
        top-p/top-k truncation and before the runtime's tag masking -- the quantity the training
        forward computes with `token_logprobs`, so the PPO ratio is exactly 1 on-policy.
    Raises:
        ValueError for an unknown mode, num_paths < 2, an empty prompt list or an empty prompt.
    """
    if mode not in ("unseen", "seen", "sequential"):
        raise ValueError(f"mode must be 'unseen', 'seen' or 'sequential', got {mode!r}")
    if num_paths < 2:
        raise ValueError(f"num_paths must be >= 2 (a block needs at least two paths), got {num_paths}")
    if not prompts:
        raise ValueError("prompts is empty")
    prompts = [tokenizer.encode(p, add_special_tokens=False) if isinstance(p, str) else list(p) for p in prompts]
    if any(len(p) == 0 for p in prompts):
        raise ValueError("a prompt has no tokens")
    tags = TagIds.from_tokenizer(tokenizer)
    gen = torch.Generator()
    if seed is None:
        gen.seed()                                   # fresh entropy, without touching the global RNG
    else:
        gen.manual_seed(seed)
    vocab = model.get_output_embeddings().weight.shape[0]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tags.eos
    engine = _Engine(model, tags, vocab, mode, num_paths, max_new_tokens, max_path_tokens or max_new_tokens,
                     max_blocks, allow_parallel, temperature, top_p, top_k, greedy, gen, pad_id, min_new_tokens)
    samples = engine.run(prompts, group_size)
    out = []
    for s in samples:
        st = parse_structure(s.tokens, tags)
        body = s.tokens[:-1] if s.tokens and s.tokens[-1] == tags.eos else s.tokens
        out.append(Rollout(prompt_index=s.prompt_index, prompt_ids=s.prompt_ids, response_ids=s.tokens,
                           sampled_mask=s.sampled, logprobs=s.logprobs, structure=st, num_tokens=len(s.tokens),
                           critical_path=critical_path_length(st, mode), finish_reason=s.done or "budget",
                           text=tokenizer.decode(body, skip_special_tokens=False)))
    return out


# ----------------------------------------------------------------------------------------------------
# `python sample.py --bench`: speed of the engine on CPU (numbers go into the README)


class TagBias(torch.nn.Module):
    """Adds a fixed bias to a model's logits: random weights rarely emit tags, so benchmarks and tests
    use it to get many blocks. The training forward sees the same bias, so log-probs stay exact."""

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


def bench(batch: int = 16, new_tokens: int = 128, repeats: int = 2):
    """Print tokens/s of plain sampling vs `transformers` generate(), and Unseen vs Seen blocks."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from model import TINY_CONFIG, add_parallel_tags, build_char_tokenizer, load_model

    torch.manual_seed(0)
    tiny, tok = load_model("tiny", device="cpu")
    cfg20 = Qwen3Config(**{**TINY_CONFIG, "hidden_size": 384, "num_hidden_layers": 12, "num_attention_heads": 6,
                           "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 1152},
                        vocab_size=len(tok), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    big = Qwen3ForCausalLM(cfg20).eval()
    tags = TagIds.from_tokenizer(tok)
    prompts = [tok.encode(f"Problem {i}: Ava has {i} boxes of 7 pens.", add_special_tokens=False) for i in range(batch)]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {batch}, {new_tokens} new tokens")
    print("| model | params | ours seq. tok/s | generate() tok/s | ratio | unseen s | seen s | unseen/seen | D/T |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, m in (("tiny", tiny), ("20M", big)):
        n_params = sum(p.numel() for p in m.parameters())

        def timed(fn):
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                res = fn()
                best = min(best, time.perf_counter() - t0)
            return best, res

        t_ours, rs = timed(lambda: generate(m, tok, prompts, mode="sequential", allow_parallel=False,
                                             max_new_tokens=new_tokens, min_new_tokens=new_tokens, seed=0))
        n_ours = sum(r.num_tokens for r in rs)
        L = max(map(len, prompts))
        ids = torch.tensor([[tok.pad_token_id] * (L - len(p)) + p for p in prompts])
        am = (torch.arange(L)[None] >= torch.tensor([L - len(p) for p in prompts])[:, None]).long()
        t_hf, _ = timed(lambda: m.generate(input_ids=ids, attention_mask=am, do_sample=True, max_new_tokens=new_tokens,
                                           min_new_tokens=new_tokens, pad_token_id=tok.pad_token_id))
        n_hf = batch * new_tokens
        # Blocks of 2 paths: <Parallel> likely in the main chain, paths run to their budget, short summaries.
        bias = torch.zeros(m.get_output_embeddings().weight.shape[0])
        bias[tags.parallel], bias[tags.end_path], bias[tags.end_summary] = 2.0, -30.0, 3.0
        biased = TagBias(m, bias).eval()
        kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, max_path_tokens=24, seed=0)
        t_un, ru = timed(lambda: generate(biased, tok, prompts, mode="unseen", **kw))
        t_se, rse = timed(lambda: generate(biased, tok, prompts, mode="seen", **kw))
        dt = sum(r.critical_path for r in ru) / sum(r.num_tokens for r in ru)
        print(f"| {name} | {n_params / 1e6:.1f}M | {n_ours / t_ours:,.0f} | {n_hf / t_hf:,.0f} | "
              f"{(n_ours / t_ours) / (n_hf / t_hf):.2f}x | {t_un:.2f} | {t_se:.2f} | {t_un / t_se:.2f} | {dt:.2f} |")


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--bench"]:
        bench()
    else:
        sys.exit("usage: python sample.py --bench")
