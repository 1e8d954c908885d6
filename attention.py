"""The parallel structure: parse_structure, the one parser, and the Seen/Unseen masks and positions (NOTES.md §1-§2).

    main ... <Parallel><Path> p1 </Path><Path> p2 </Path></Parallel>\\n<Summary> s </Summary> main ... Final Answer: 7

* Seen:   causal attention, positions 0..L-1; path 2 reads path 1.
* Unseen: a path's tokens (its <Path> and </Path> included) see the shared prefix and their own path only;
  </Parallel> and everything after it see everything before. "Multiverse" positions: every path of a block
  starts at p+1 (p: the position of <Parallel>), </Parallel> sits at p + longest path + 1, then +1 per token.

The prompt is never parsed and always numbered 0..n-1 (the paper's instruction contains the tags; parsing it
shifted every position in the official SFT code, NOTES.md §8). `python scripts/show_mask.py` prints an example.
"""
from dataclasses import dataclass, field
from typing import Sequence

import torch

from model import TAGS

@dataclass(frozen=True)
class TagIds:
    """Ids of the six tags; `newline`: the ids injected between </Parallel> and <Summary>; `eos`."""
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
        return frozenset((self.parallel, self.end_parallel, self.path, self.end_path, self.summary, self.end_summary))

    @classmethod
    def from_tokenizer(cls, tokenizer) -> "TagIds":
        """Raises ValueError when a tag is not one token (load the model with model.load_model) or there is no EOS."""
        encs = [tokenizer.encode(tag, add_special_tokens=False) for tag in TAGS]
        for tag, enc in zip(TAGS, encs):
            if len(enc) != 1 or enc[0] == getattr(tokenizer, "unk_token_id", None):
                raise ValueError(f"tokenizer does not have {tag!r} as one token (it encodes to {enc}); "
                                 "load the model with model.load_model(), which adds the six parallel tags")
        if tokenizer.eos_token_id is None:
            raise ValueError("tokenizer has no eos_token_id; set one before sampling or training")
        newline = tuple(tokenizer.encode("\n", add_special_tokens=False))
        return cls(*(enc[0] for enc in encs), newline=newline, eos=tokenizer.eos_token_id)

@dataclass
class Block:
    """One parallel block; indices into the response, spans [start, end)."""
    start: int                                                  # index of <Parallel>
    paths: list[tuple[int, int]] = field(default_factory=list)  # each from its <Path> to its </Path> inclusive
    end: int | None = None                                      # index of </Parallel>; None if never closed
    summary: tuple[int, int] | None = None                      # <Summary> ... </Summary>; end = length if unclosed

@dataclass
class Structure:
    blocks: list[Block]
    valid: bool
    reason: str          # "" when valid, else the first problem found (with its token index)
    length: int

def parse_structure(ids: Sequence[int], tags: TagIds) -> Structure:
    """The blocks of one *response* (ids: list or 1-D tensor, no padding) and whether it is well-formed: every
    block closed with >= 2 paths, none empty, only the newline before its <Summary>, every summary closed, no tag
    inside a path or summary, no text between paths, no stray tag in the main chain. Never raises. Recovery (what
    the mask builder uses): a tag out of place is an ordinary token; an unclosed <Path> runs to the end."""
    # >>> exercise 1: the format parser: block, path and summary spans
    ids = ids.tolist() if isinstance(ids, torch.Tensor) else ids
    structural, newline = tags.structural, set(tags.newline)
    blocks: list[Block] = []
    problems: list[str] = []                      # the first one is the reason
    bad = problems.append
    state, path_start = "main", 0
    for i, t in enumerate(ids):
        if state == "after":                      # just closed a block, waiting for <Summary>
            if t == tags.summary:
                state, sum_start = "summary", i
                continue
            if t in newline:
                continue
            bad(f"no <Summary> after </Parallel> (token {i})")
            state = "main"                        # fall through: t is main-chain text
        if state == "main":
            if t == tags.parallel:
                blocks.append(Block(start=i))
                state = "block"
            elif t == tags.summary:
                bad(f"<Summary> without a parallel block (token {i})")
            elif t in structural:
                bad(f"stray structural tag {t} in the main chain (token {i})")
        elif state == "block":
            if t == tags.path:
                state, path_start = "path", i
            elif t == tags.end_parallel:
                blocks[-1].end = i
                if len(blocks[-1].paths) < 2:
                    bad(f"block at token {blocks[-1].start} has {len(blocks[-1].paths)} path(s), needs >= 2")
                state = "after"
            else:
                bad(f"token {i} inside a block but outside every path")
        elif state == "path":
            if t == tags.end_path:
                if i == path_start + 1:
                    bad(f"empty path at token {path_start}")
                blocks[-1].paths.append((path_start, i + 1))
                state = "block"
            elif t in structural:
                bad(f"structural tag {t} inside a path (token {i})")
        elif state == "summary":
            if t == tags.end_summary:
                blocks[-1].summary = (sum_start, i + 1)
                state = "main"
            elif t in structural:
                bad(f"structural tag {t} inside a summary (token {i})")
    n = len(ids)
    if state == "path":
        blocks[-1].paths.append((path_start, n))
        bad(f"unclosed <Path> at token {path_start}")
    if state in ("path", "block"):
        bad(f"unclosed <Parallel> at token {blocks[-1].start}")
    elif state == "after":
        bad("no <Summary> after the last </Parallel>")
    elif state == "summary":
        blocks[-1].summary = (sum_start, n)
        bad(f"unclosed <Summary> at token {sum_start}")
    return Structure(blocks=blocks, valid=not problems, reason=problems[0] if problems else "", length=n)
    # <<< exercise 1

def unseen_positions(structure: Structure, start: int = 0) -> list[int]:
    """Multiverse position of every response token, the first at `start`: each path of a block counts from p+1
    (p: its <Parallel>'s); block-level tokens continue one past the furthest path so far; then +1."""
    # >>> exercise 2: Unseen position ids
    path_of = {s: (b.start, e) for b in structure.blocks for s, e in b.paths}   # path start -> (<Parallel>, end)
    pos, nxt, i = [0] * structure.length, start, 0
    while i < structure.length:
        if i in path_of:                          # a whole path: p+1, p+2, ...
            bstart, e = path_of[i]
            pos[i:e] = range(pos[bstart] + 1, pos[bstart] + 1 + e - i)
            nxt, i = max(nxt, pos[e - 1] + 1), e  # one past the furthest path of this block
        else:
            pos[i] = nxt
            nxt, i = nxt + 1, i + 1
    return pos
    # <<< exercise 2

def build_mask_and_positions(input_ids: torch.Tensor, prompt_lengths, attention_mask_2d: torch.Tensor,
                             tag_ids: TagIds, mode: str, dtype: torch.dtype = torch.float32):
    """The training forward's attention mask and position ids of a batch of prompt + response rows: input_ids
    (B, L) long, each row [pad*] prompt response [pad*] with its own structure; prompt_lengths (B,);
    attention_mask_2d (B, L) 0/1, one contiguous run of real tokens per row; mode "seen" or "unseen". Returns mask
    (B, 1, L, L) additive in `dtype`, 0 visible, finfo(dtype).min hidden (never bool: eager attention would add a
    bool mask as 0/1; a padding query sees itself, so nothing is NaN), and position_ids (B, L) long (padding at 0).
    ValueError for an unknown mode, a row that is not one run, a prompt longer than its row, never a bad response."""
    # >>> exercise 3: the Seen/Unseen attention mask and positions
    if mode not in ("seen", "unseen"):
        raise ValueError(f"mode must be 'seen' or 'unseen', got {mode!r}")
    (B, L), device = input_ids.shape, input_ids.device
    am, prompt_lengths = attention_mask_2d.bool().cpu(), torch.as_tensor(prompt_lengths).tolist()
    allowed = torch.eye(L, dtype=torch.bool, device=device).repeat(B, 1, 1)   # padding queries see themselves
    positions = torch.zeros(B, L, dtype=torch.long)
    causal = torch.ones(L, L, dtype=torch.bool, device=device).tril()
    for b in range(B):
        real = am[b].nonzero().flatten().tolist()
        n, n_prompt, lo = len(real), prompt_lengths[b], real[0] if real else 0
        if n and real[-1] - lo + 1 != n:
            raise ValueError(f"row {b}: attention_mask_2d is not one contiguous run of real tokens")
        if n_prompt > n:
            raise ValueError(f"row {b}: prompt length {n_prompt} exceeds its {n} real tokens")
        hi, r0 = lo + n, lo + n_prompt            # r0: the response's offset in the row
        allowed[b, lo:hi, lo:hi] = causal[:n, :n]
        positions[b, lo:hi] = torch.arange(n)
        if mode == "unseen":
            structure = parse_structure(input_ids[b, r0:hi], tag_ids)
            positions[b, r0:hi] = torch.tensor(unseen_positions(structure, n_prompt), dtype=torch.long)
            for blk in structure.blocks:
                for s, e in blk.paths:            # a path hides everything of its block before it
                    allowed[b, r0 + s:r0 + e, r0 + blk.start + 1:r0 + s] = False
    mask = torch.zeros(B, 1, L, L, dtype=dtype, device=device).masked_fill_(~allowed[:, None], torch.finfo(dtype).min)
    return mask, positions.to(device)
    # <<< exercise 3

def structured_forward(model, input_ids, attention_mask_2d, prompt_lengths, tag_ids: TagIds, mode: str,
                       dtype: torch.dtype | None = None):
    """One training forward under the mode's mask and positions ("sequential" = "seen"): logits (B, L, V).
    The mask is built in `dtype` (default the model's; pass the autocast dtype under mixed precision)."""
    mode, dtype = "seen" if mode == "sequential" else mode, dtype or next(model.parameters()).dtype
    mask, pos = build_mask_and_positions(input_ids, prompt_lengths, attention_mask_2d, tag_ids, mode, dtype)
    return model(input_ids=input_ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
