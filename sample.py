"""The branching sampler (NOTES.md §3): one KV-cache row per sample; the paths of a block decode side by side in it.

    rollouts = generate(model, tokenizer, prompts, group_size=8, mode="unseen")
    python sample.py --model=runs/sft/checkpoint-400                 # a few responses, each block laid out

One Unseen sample, and the method of `_Engine` that makes each transition:

    main chain    ... The total is<Parallel>         _advance: sampled until <Parallel>, EOS or the budget
    _open_block   <Path> injected into each of num_paths paths, all at position p+1 (p: <Parallel>'s)
    paths         <Path>3*7=21</Path> | <Path>4*6=24</Path>   _advance: one query per open path and decode step,
                  at the path's own position, sees the shared slots and its own; _end_path: </Path> sampled or forced
    _close_block  the path slots become shared (no copy); </Parallel>\\n<Summary> at p + longest path + 1
    summary       _advance: sampled until </Summary>, then the main chain goes on (more blocks, EOS)
    _finish       EOS or budget: each open path gets its </Path> (its reserved last token)

The response is written in the training layout (path 1, then path 2, ...): attention depends on the mask and the
positions baked into the cached keys, not on the slots' order, so each sampled token has its training context
(`attention.build_mask_and_positions`) and the log-probs equal the training forward's (NOTES.md §8). Seen: the
paths follow one another, causally; "sequential": plain sampling. Finished rows leave once half the batch is done.
"""
import math
import os
import sys
from dataclasses import dataclass, field

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # idle OpenMP threads sleep (see sft.py)

import torch
import torch.nn.functional as F

import config
from attention import Structure, TagIds, build_mask_and_positions, parse_structure
from model import Mode, load_model, mode_from_config, read_checkpoint_config

HIDDEN, SHARED = 0, 1   # slot owners: seen by no query / by every query of its row; path j's slots: 2 + j

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

def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / temperature) at `tokens`: logits (..., V), tokens (...) long -> (...) float32; the
    sampler's and the training forward's log-probs both come from here. `temperature` <= 0 counts as 1."""
    # >>> exercise 4: token log-probs
    t = temperature if temperature > 0 else 1.0
    logits = logits.float() / t
    return logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    # <<< exercise 4

def _choose(logits, banned, temperature: float, top_p: float, top_k: int, greedy: bool, gen) -> torch.Tensor:
    """One token per row of logits (n, V) float32 (greedy, or drawn from `gen` after temperature, top-k, top-p);
    banned (n, V) bool: the runtime's masked tags."""
    logits = logits.masked_fill(banned, float("-inf"))
    if greedy or temperature <= 0:
        return logits.argmax(-1)
    logits = logits / temperature
    if top_k and top_k < logits.shape[-1]:
        logits = logits.masked_fill(logits < logits.topk(top_k, dim=-1).values[:, -1:], float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs > top_p          # keep the smallest prefix whose mass reaches top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return torch.multinomial(logits.softmax(-1).cpu(), 1, generator=gen).squeeze(-1).to(logits.device)

class SlotCache:
    """A KV cache written in place for decoding under a custom mask: `update(key, value, layer_idx)` is what the
    attention layers call. Per layer keys and values (R, kv_heads, capacity, head_dim), zero-filled (a hidden slot
    must be finite: 0 * NaN is NaN). Before a forward the caller sets `slots` (R, q) long, where each row's q new
    keys go, and calls `reserve(width)`. `owner` (R, capacity): who sees a slot (HIDDEN, SHARED, 2 + j: path j)."""

    def __init__(self, rows: int, capacity: int, device):
        self.keys, self.values, self.slots, self.width = [], [], None, 0
        self.owner = torch.zeros(rows, capacity, dtype=torch.long, device=device)
        self.row_ids = torch.arange(rows, device=device)[:, None]

    def update(self, key, value, layer_idx: int, *args, **kwargs):
        if layer_idx == len(self.keys):
            shape = (key.shape[0], key.shape[1], self.owner.shape[1], key.shape[3])
            self.keys.append(key.new_zeros(shape))
            self.values.append(value.new_zeros(shape))
        k, v = self.keys[layer_idx], self.values[layer_idx]
        k[self.row_ids, :, self.slots] = key.transpose(1, 2)        # (R, q, kv_heads, head_dim), in place
        v[self.row_ids, :, self.slots] = value.transpose(1, 2)
        return k[:, :, :self.width], v[:, :, :self.width]

    def reserve(self, width: int):
        """Attend over slots [0, width); the capacity doubles when short, so growing is O(1) per token."""
        cap = self.owner.shape[1]
        if width > cap:                                              # zeros appended along the slot dim
            more = max(width, 2 * cap) - cap
            self.keys, self.values = ([F.pad(t, (0, 0, 0, more)) for t in ts] for ts in (self.keys, self.values))
            self.owner = F.pad(self.owner, (0, more))
        self.width = width

    def select(self, rows: torch.Tensor):
        """New row i = old row rows[i] (long, on the cache's device): fans prompts out, drops finished rows."""
        self.keys, self.values = ([t.index_select(0, rows) for t in ts] for ts in (self.keys, self.values))
        self.owner = self.owner.index_select(0, rows)
        self.row_ids = torch.arange(len(rows), device=rows.device)[:, None]

    def mask(self, codes: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """(R, 1, q, width) additive: query (r, i) sees slot s iff owner[r, s] is SHARED or codes[r, i]."""
        own = self.owner[:, None, :self.width]
        hide = (own != SHARED) & (own != codes[:, :, None])
        mask = torch.zeros(hide.shape, dtype=dtype, device=hide.device)
        return mask.masked_fill_(hide, torch.finfo(dtype).min)[:, None]

@dataclass
class _Stream:
    """What feeds one query per step: a sample's main chain (Seen paths, summaries), or an Unseen path."""
    kind: str                       # "main", "path", "summary"; "fork": open a block; "closed": </Path> given
    pos: int                        # position id of `feed`
    code: int = SHARED              # owner of its slots
    feed: int | None = None         # the token to feed at the next step (None: nothing to feed)
    queue: list = field(default_factory=list)   # forced tokens to give after `feed`
    path_len: int = 0               # tokens of its current path (<Path> included)
    toks: list = field(default_factory=list)    # (token, sampled, logprob); the main chain's is the response

@dataclass(eq=False)
class _Sample:
    prompt_index: int
    prompt_ids: list[int]
    main: _Stream
    paths: list = field(default_factory=list)   # the open Unseen block's streams, in path order
    used: int = 0                   # response tokens counted against the budget
    open_paths: int = 0             # paths not closed yet: one </Path> each is reserved in the budget
    closed_paths: int = 0           # Seen: paths of the current block closed so far
    blocks: int = 0
    done: str = ""                  # "", "eos" or "budget"

_BANS = ("main", "path", "summary", "main_full", "free")   # rows of _Engine.ban

class _Engine:
    def __init__(self, model, tags: TagIds, mode: str, num_paths: int, max_new_tokens: int, max_path_tokens: int,
                 max_blocks: int, allow_parallel: bool, sampling: tuple, pad_id: int, min_new_tokens: int):
        self.model, self.tags, self.mode, self.num_paths, self.max_blocks = model, tags, mode, num_paths, max_blocks
        self.max_new_tokens, self.max_path_tokens, self.min_new_tokens = max_new_tokens, max_path_tokens, min_new_tokens
        self.sampling, self.pad_id = sampling, pad_id
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        # Structural tags are the runtime's to inject: a segment samples only its own closing tag (the main
        # chain <Parallel>, until max_blocks); "free" (sequential mode) bans <Parallel> if not allow_parallel.
        ban = torch.zeros(len(_BANS), model.get_output_embeddings().weight.shape[0], dtype=torch.bool)
        ban[:4, sorted(tags.structural)] = True
        ban[0, tags.parallel] = ban[1, tags.end_path] = ban[2, tags.end_summary] = False
        ban[4, tags.parallel] = not allow_parallel
        self.ban = ban.to(self.device)

    def run(self, prompts: list[list[int]], group_size: int) -> list[_Sample]:
        """Prefill every prompt once (left-padded), fan it out to group_size rows, decode until all are done."""
        P, L = len(prompts), max(map(len, prompts))
        ids = torch.tensor([[self.pad_id] * (L - len(p)) + p for p in prompts])
        am = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])
        mask, pos = build_mask_and_positions(ids, [len(p) for p in prompts], am, self.tags, "seen", self.dtype)
        self.cache = c = SlotCache(P, L + min(self.max_new_tokens, 256) + 1, self.device)
        c.owner[:, :L] = am.to(self.device)                          # padding slots HIDDEN, prompts SHARED
        c.slots = torch.arange(L, device=self.device).expand(P, L)
        c.reserve(L)
        out = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                         position_ids=pos.to(self.device), cache=c, use_cache=True, logits_to_keep=1)
        src = torch.arange(P, device=self.device).repeat_interleave(group_size)
        c.select(src)
        samples = [_Sample(i, prompts[i], _Stream("main", pos=len(prompts[i]))) for i in src.tolist()]
        self.rows, self.used = list(samples), [L] * len(samples)
        self._decide(out.logits[:, -1].float()[src], [(s, s.main) for s in samples])
        while self.rows:
            self._step()
        return samples

    def _step(self):
        """One decode step: each row feeds its streams' tokens, then hidden dummies up to q, in one forward."""
        feeds = [[] if s.done else [st for st in (s.paths or [s.main]) if st.feed is not None] for s in self.rows]
        q = max(1, max(map(len, feeds)))
        dummies = [q - len(f) for f in feeds]                       # hidden, per row; they share one scratch slot
        ids = [[st.feed for st in f] + [self.pad_id] * d for f, d in zip(feeds, dummies)]
        pos = [[st.pos for st in f] + [0] * d for f, d in zip(feeds, dummies)]
        codes = [[st.code for st in f] + [HIDDEN] * d for f, d in zip(feeds, dummies)]
        slots = [list(range(u, u + len(f))) + [u + len(f)] * d for u, f, d in zip(self.used, feeds, dummies)]
        self.used = [u + len(f) for u, f in zip(self.used, feeds)]
        c, dev = self.cache, self.device
        c.slots, codes = torch.tensor(slots, device=dev), torch.tensor(codes, device=dev)
        c.reserve(max(row[-1] for row in slots) + 1)
        c.owner[c.row_ids, c.slots] = codes
        out = self.model(input_ids=torch.tensor(ids, device=dev), attention_mask=c.mask(codes, self.dtype),
                         position_ids=torch.tensor(pos, device=dev), cache=c, use_cache=True)
        fed = [(s, st) for s, f in zip(self.rows, feeds) for st in f]
        for _, st in fed:
            st.pos += 1
        logits = out.logits.flatten(0, 1).float()                    # (R * q, V): keep the real queries'
        if len(fed) < len(logits):
            logits = logits[torch.tensor([r * q + i for r, f in enumerate(feeds) for i in range(len(f))], device=dev)]
        self._decide(logits, fed)

    def _decide(self, logits: torch.Tensor, fed: list):
        """Sample a token for every stream that fed (logits (n, V) float32, in `fed` order), give each its next token
        in that order (a sample spends its budget in path order); drop the done rows once they are half the batch."""
        kinds = ["free" if self.mode == "sequential" else "main_full" if st.kind == "main" and
                 s.blocks >= self.max_blocks else st.kind for s, st in fed]
        banned = self.ban[[_BANS.index(k) if k in _BANS else 0 for k in kinds]]
        if self.min_new_tokens:                                      # no EOS before min_new_tokens (benchmarks)
            banned[:, self.tags.eos] |= torch.tensor([s.used < self.min_new_tokens for s, _ in fed], device=self.device)
        first = torch.tensor([st.kind == "path" and st.path_len == 1 for _, st in fed], device=self.device)
        banned[:, [self.tags.end_path, self.tags.eos]] |= first[:, None]   # no empty path (NOTES.md §4)
        chosen = _choose(logits, banned, *self.sampling)   # (temperature, top_p, top_k, greedy, gen)
        for (s, st), tok, lp in zip(fed, chosen.tolist(), token_logprobs(logits, chosen, self.sampling[0]).tolist()):
            if not s.done:
                self._advance(s, st, tok, lp)
                if s.done:
                    self._finish(s)
        live = [r for r, s in enumerate(self.rows) if not s.done]
        if 2 * len(live) <= len(self.rows):
            self.cache.select(torch.tensor(live, dtype=torch.long, device=self.device))
            self.rows, self.used = [self.rows[r] for r in live], [self.used[r] for r in live]

    def _append(self, s: _Sample, st: _Stream, tok: int, sampled: int, lp: float, closing: bool = False) -> bool:
        """Append a response token to a stream; False (and the sample ends) once the budget is spent.
        Each open path holds one reserved token for its </Path>; a closing </Path> spends it."""
        if closing:
            s.open_paths -= 1
        elif self.max_new_tokens - s.used - s.open_paths < 1:
            s.done = "budget"
            return False
        s.used += 1
        st.toks.append((tok, sampled, lp))
        st.path_len += st.kind == "path"
        return True

    def _advance(self, s: _Sample, st: _Stream, tok: int, lp: float):
        """The stream's `feed` is in the cache: give it its next token, forced or `tok` (sampled, log-prob lp)."""
        T = self.tags
        if st.kind == "fork":
            return self._open_block(s)
        if st.kind == "closed":                                      # its </Path> is in the cache
            st.feed = None
            if all(p.feed is None for p in s.paths):
                self._close_block(s)
            return
        if st.queue:                                                 # a forced token: injected, not sampled
            tok = st.queue.pop(0)
            if tok == T.path:                                        # Seen: a new path; reserve its </Path>
                if self.max_new_tokens - s.used - s.open_paths < 2:
                    s.done = "budget"
                    return
                s.open_paths, st.path_len = s.open_paths + 1, 0
            if self._append(s, st, tok, 0, 0.0):
                st.feed = tok                                        # (a queue with <Summary>: kind is "summary")
            return
        if st.kind == "path":
            if st.path_len + 1 >= self.max_path_tokens or tok == T.eos:   # path budget; EOS -> injected </Path>
                return self._end_path(s, st, 0, 0.0)
            if tok == T.end_path:
                return self._end_path(s, st, 1, lp)
        sampled = 1
        if st.kind == "summary" and tok == T.eos:                    # EOS inside a summary -> injected </Summary>
            tok, sampled, lp = T.end_summary, 0, 0.0
        if not self._append(s, st, tok, sampled, lp):
            return
        st.feed = tok
        if tok == T.eos:
            s.done = "eos"
        elif self.mode != "sequential" and tok == T.end_summary:
            st.kind = "main"
        elif self.mode != "sequential" and tok == T.parallel:
            s.blocks, s.closed_paths = s.blocks + 1, 0
            st.kind, st.queue = ("fork", []) if self.mode == "unseen" else ("path", [T.path])

    def _open_block(self, s: _Sample):
        """Unseen, <Parallel> is in the cache: num_paths paths start at p+1, each with an injected <Path>."""
        s.main.feed, N = None, self.num_paths
        if self.max_new_tokens - s.used - s.open_paths < 2 * N:     # no room for N x <Path></Path>
            s.done = "budget"
            return
        s.open_paths += N
        s.paths = [_Stream("path", pos=s.main.pos, code=2 + j, feed=self.tags.path) for j in range(N)]
        for p in s.paths:
            self._append(s, p, self.tags.path, 0, 0.0)

    def _end_path(self, s: _Sample, st: _Stream, sampled: int, lp: float):
        """Append the path's </Path> (it spends the reserved token); Seen: then the next path or the summary."""
        T = self.tags
        self._append(s, st, T.end_path, sampled, lp, closing=True)
        st.feed = T.end_path
        if self.mode == "unseen":
            st.kind = "closed"
        elif s.closed_paths + 1 < self.num_paths:
            s.closed_paths, st.queue = s.closed_paths + 1, [T.path]
        else:
            st.kind, st.queue = "summary", [T.end_parallel, *T.newline, T.summary]

    def _close_block(self, s: _Sample):
        """Every path fed its </Path>: they join the response in path order, their slots become shared, and
        </Parallel> goes at p + longest path + 1 (the main chain's position is still p + 1)."""
        m, T, owner = s.main, self.tags, self.cache.owner[self.rows.index(s)]
        owner.masked_fill_(owner > SHARED, SHARED)
        m.toks += [t for p in s.paths for t in p.toks]
        m.pos += max(p.path_len for p in s.paths)
        s.paths = []
        if self._append(s, m, T.end_parallel, 0, 0.0):
            m.feed, m.kind, m.queue = T.end_parallel, "summary", [*T.newline, T.summary]

    def _finish(self, s: _Sample):
        """The sample ended: close what is open, so the response parses into the spans it was sampled with."""
        for st in s.paths or [s.main]:                               # Unseen: every open path; Seen: the main chain
            if st.kind == "path" and s.open_paths:
                self._append(s, st, self.tags.end_path, 0, 0.0, closing=True)
        s.main.toks += [t for p in s.paths for t in p.toks]
        s.paths = []

SAMPLING_RANGES = {   # setting -> (in range?, the rule as the error states it)
    "num_paths": (lambda v: v >= 2, "num_paths >= 2"), "max_blocks": (lambda v: v >= 0, "max_blocks >= 0"),
    "temperature": (lambda v: 0 <= v < math.inf, "0 <= temperature < inf"),
    "eval_temperature": (lambda v: 0 <= v < math.inf, "0 <= eval_temperature < inf"),
    "top_k": (lambda v: v >= 0, "top_k >= 0 (0 = off)"), "top_p": (lambda v: 0 < v <= 1, "0 < top_p <= 1")}

def check_sampling(**settings):
    """ValueError naming each sampling setting out of range as --key=value (NaN is out of every range): the sampler,
    eval.py and grpo.py call it before anything is loaded or moved. Keys: those of SAMPLING_RANGES."""
    bad = [(f"--{k}={v}", SAMPLING_RANGES[k][1]) for k, v in settings.items() if not SAMPLING_RANGES[k][0](v)]
    if bad:
        raise ValueError(f"{', '.join(b for b, _ in bad)}: out of range; use {', '.join(r for _, r in bad)}")

@torch.inference_mode()
def generate(model, tokenizer, prompts, group_size: int = 1, mode: str = "unseen", max_new_tokens: int = 256,
             max_path_tokens: int | None = None, num_paths: int = 2, max_blocks: int = 4,
             allow_parallel: bool = True, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
             greedy: bool = False, seed: int | None = None, min_new_tokens: int = 0) -> list[Rollout]:
    """`group_size` responses per prompt (strings or id lists), prompt-major, from a Hugging Face causal LM in eval
    mode. max_new_tokens: a response's budget, injected tags included; max_path_tokens: a path's (then </Path> is
    injected); max_blocks: then <Parallel> is masked out (the official code ends the episode, NOTES.md §8); the
    same seed and inputs give the same rollouts; no EOS before min_new_tokens. `Rollout.logprobs`: of each sampled
    token before truncation and tag masking, the training forward's quantity. ValueError for a setting out of range."""
    check_sampling(num_paths=num_paths, max_blocks=max_blocks, temperature=temperature, top_k=top_k, top_p=top_p)
    prompts = [tokenizer.encode(p, add_special_tokens=False) if isinstance(p, str) else list(p) for p in prompts]
    tags = TagIds.from_tokenizer(tokenizer)
    gen = torch.Generator()
    gen.seed() if seed is None else gen.manual_seed(seed)   # no seed: fresh entropy, the global RNG untouched
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tags.eos
    engine = _Engine(model, tags, mode, num_paths, max_new_tokens, max_path_tokens or max_new_tokens, max_blocks,
                     allow_parallel, (temperature, top_p, top_k, greedy, gen), pad_id, min_new_tokens)
    # Several masked queries per row (an Unseen block) make transformers copy every layer's cached keys and
    # values at every step (repeat_kv, for grouped-query attention) unless SDPA shares the key/value heads
    # itself, which on CPU it does without a copy (on CUDA, under a mask, it would take a slower kernel).
    key, saved = "TRANSFORMERS_SDPA_FORCE_GQA", os.environ.get("TRANSFORMERS_SDPA_FORCE_GQA")
    os.environ[key] = "1" if engine.device.type == "cpu" else saved or "0"
    try:
        samples = engine.run(prompts, group_size)
    finally:
        del os.environ[key]
        if saved is not None:
            os.environ[key] = saved
    out = []
    for s in samples:
        ids, sampled, lps = (list(x) for x in zip(*s.main.toks)) if s.main.toks else ([], [], [])
        st = parse_structure(ids, tags)
        lengths = [[e - a for a, e in b.paths] for b in st.blocks] if mode == "unseen" else []   # Seen: D = T
        D = len(ids) - sum(sum(n) - max(n, default=0) for n in lengths)     # a block costs its longest path
        text = tokenizer.decode(ids[:-1] if ids[-1:] == [tags.eos] else ids, skip_special_tokens=False)
        out.append(Rollout(s.prompt_index, s.prompt_ids, ids, sampled, lps, st, len(ids), D, s.done or "budget", text))
    return out

# ---- python sample.py --model=<checkpoint>: a few responses, each block laid out (what a student looks at first)
PROBLEMS = ("Which two of 4 9 5 1 make 9?", "Which two of 3 1 2 8 6 make 5?", "Which two of 4 6 8 3 5 9 make 8?")

@dataclass
class SampleConfig:
    """python sample.py --model=<checkpoint>: sample a few responses and print their paths."""
    model: str = "tiny"                    # a checkpoint folder, a hub name, or tiny (random weights)
    prompt: str = ""                       # as the model reads it ("\\n" = newline, the tiny model's last char)
    n: int = 3                             # responses per prompt
    mode: Mode | None = None               # None = the checkpoint's training mode, else unseen
    max_new_tokens: int = 128
    temperature: float = 1.0
    seed: int = 0

def layout(rollout: Rollout, tokenizer) -> str:
    """A response laid out: main-chain text as written, each block's paths indented one per line, its summary
    (tags and EOS dropped; a newline inside a path or a summary shows as \\n)."""
    ids = rollout.response_ids
    text = lambda a, b: tokenizer.decode(ids[a:b], skip_special_tokens=True)  # noqa: E731
    line = lambda a, b: text(a, b).replace("\n", "\\n")  # noqa: E731
    out, i = [], 0
    for b in rollout.structure.blocks:
        out += [text(i, b.start).strip("\n"), "<Parallel>"] + [f"    <Path> {line(s, e)}" for s, e in b.paths]
        out += [f"<Summary> {line(*b.summary)}"] if b.summary else []
        i = b.summary[1] if b.summary else b.end + 1 if b.end is not None else \
            max([b.start + 1] + [e for _, e in b.paths])
    return "\n".join(x for x in out + [text(i, len(ids)).strip("\n")] if x)

def main(argv: list[str]) -> None:
    cfg = config.parse(SampleConfig, argv)
    config.at_least(cfg, 1, "n", "max_new_tokens")
    check_sampling(temperature=cfg.temperature)
    mode = cfg.mode or mode_from_config(read_checkpoint_config(cfg.model)[0]) or "unseen"
    model, tokenizer = load_model(cfg.model)
    prompts = [cfg.prompt.replace("\\n", "\n")] if cfg.prompt else [p + "\n" for p in PROBLEMS]   # tiny layout
    context = getattr(model.config, "max_position_embeddings", None)
    longest = max(len(tokenizer.encode(p, add_special_tokens=False)) for p in prompts)
    if context and longest + cfg.max_new_tokens > context:      # past it the positions are ones it never learned
        raise ValueError(f"a {longest}-token prompt + --max_new_tokens={cfg.max_new_tokens} is more than the model's "
                         f"context of {context} positions: lower --max_new_tokens or shorten --prompt")
    rollouts = generate(model, tokenizer, prompts, group_size=cfg.n, mode=mode, max_new_tokens=cfg.max_new_tokens,
                        allow_parallel=mode != "sequential", temperature=cfg.temperature, seed=cfg.seed)
    for j, r in enumerate(rollouts):
        if j % cfg.n == 0:
            print(f"=== {prompts[r.prompt_index]!r} ({cfg.model}, mode {mode})")
        print(f"--- sample {j % cfg.n + 1}: {r.finish_reason}, {r.num_tokens} tokens, critical path {r.critical_path}, "
              f"{len(r.structure.blocks)} block(s){'' if r.structure.valid else ', malformed: ' + r.structure.reason}")
        print(layout(r, tokenizer))

if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (OSError, ValueError) as e:              # bad input: the message says what to do
        sys.exit(f"sample.py: error: {e}")
