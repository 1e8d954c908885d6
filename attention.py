"""The parallel structure: one parser, and the Seen/Unseen attention masks and positions (NOTES.md §1-§2).

    main ... <Parallel><Path> p1 </Path><Path> p2 </Path></Parallel>\\n<Summary> s </Summary> main ... Final Answer: 7

Everything that needs to know where blocks, paths and summaries are calls `parse_structure`: one definition.

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
        ids = []
        for tag in TAGS:
            enc = tokenizer.encode(tag, add_special_tokens=False)
            if len(enc) != 1 or enc[0] == getattr(tokenizer, "unk_token_id", None):
                raise ValueError(f"tokenizer does not have {tag!r} as one token (it encodes to {enc}); "
                                 "load the model with model.load_model(), which adds the six parallel tags")
            ids.append(enc[0])
        if tokenizer.eos_token_id is None:
            raise ValueError("tokenizer has no eos_token_id; set one before sampling or training")
        return cls(*ids, newline=tuple(tokenizer.encode("\n", add_special_tokens=False)), eos=tokenizer.eos_token_id)

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
    if isinstance(ids, torch.Tensor):
        ids = ids.tolist()
    P, EP, A, EA, S, ES = tags.parallel, tags.end_parallel, tags.path, tags.end_path, tags.summary, tags.end_summary
    structural, newline = tags.structural, set(tags.newline)
    blocks: list[Block] = []
    reason = ""

    def bad(msg: str):
        nonlocal reason
        reason = reason or msg

    state, path_start = "main", 0
    for i, t in enumerate(ids):
        if state == "after":                      # just closed a block, waiting for <Summary>
            if t == S:
                state, sum_start = "summary", i
                continue
            if t in newline:
                continue
            bad(f"no <Summary> after </Parallel> (token {i})")
            state = "main"                        # fall through: t is main-chain text
        if state == "main":
            if t == P:
                blocks.append(Block(start=i))
                state = "block"
            elif t == S:
                bad(f"<Summary> without a parallel block (token {i})")
            elif t in structural:
                bad(f"stray structural tag {t} in the main chain (token {i})")
        elif state == "block":
            if t == A:
                state, path_start = "path", i
            elif t == EP:
                blocks[-1].end = i
                if len(blocks[-1].paths) < 2:
                    bad(f"block at token {blocks[-1].start} has {len(blocks[-1].paths)} path(s), needs >= 2")
                state = "after"
            else:
                bad(f"token {i} inside a block but outside every path")
        elif state == "path":
            if t == EA:
                if i == path_start + 1:
                    bad(f"empty path at token {path_start}")
                blocks[-1].paths.append((path_start, i + 1))
                state = "block"
            elif t in structural:
                bad(f"structural tag {t} inside a path (token {i})")
        elif state == "summary":
            if t == ES:
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
    return Structure(blocks=blocks, valid=not reason, reason=reason, length=n)
    # <<< exercise 1

def unseen_positions(structure: Structure, start: int = 0) -> list[int]:
    """Multiverse position of every response token, the first at `start`: each path of a block counts from p+1
    (p: its <Parallel>'s); block-level tokens continue one past the furthest path so far; then +1."""
    # >>> exercise 2: Unseen position ids
    pos = [0] * structure.length
    path_of = {s: (b.start, e) for b in structure.blocks for s, e in b.paths}   # path start -> (<Parallel>, end)
    nxt, i = start, 0
    while i < structure.length:
        if i in path_of:                          # a whole path: p+1, p+2, ...
            bstart, e = path_of[i]
            p = pos[bstart]
            for j in range(i, e):
                pos[j] = p + 1 + (j - i)
            nxt = max(nxt, p + 1 + (e - i))       # one past the furthest path of this block
            i = e
            continue
        pos[i] = nxt
        nxt += 1
        i += 1
    return pos
    # <<< exercise 2

def build_mask_and_positions(input_ids: torch.Tensor, prompt_lengths, attention_mask_2d: torch.Tensor,
                             tag_ids: TagIds, mode: str, dtype: torch.dtype = torch.float32):
    """The training forward's attention mask and position ids of a batch of prompt + response rows.
    input_ids (B, L) long: each row [pad*] prompt response [pad*], its own structure; prompt_lengths (B,);
    attention_mask_2d (B, L) 0/1 (one contiguous run of real tokens per row); mode "seen" or "unseen".
    Returns mask (B, 1, L, L) additive in `dtype`, 0 visible and finfo(dtype).min hidden (never bool: eager
    attention in transformers would silently add a bool mask as 0/1; a padding query sees itself, so no row is
    all hidden and nothing is NaN), and position_ids (B, L) long (padding at 0). ValueError for an unknown mode,
    a row that is not one run, a prompt longer than its row; never for a bad response."""
    # >>> exercise 3: the Seen/Unseen attention mask and positions
    if mode not in ("seen", "unseen"):
        raise ValueError(f"mode must be 'seen' or 'unseen', got {mode!r}")
    B, L = input_ids.shape
    prompt_lengths = torch.as_tensor(prompt_lengths).tolist()
    device = input_ids.device
    allowed = torch.zeros(B, L, L, dtype=torch.bool, device=device)
    positions = torch.zeros(B, L, dtype=torch.long)
    causal = torch.ones(L, L, dtype=torch.bool, device=device).tril()
    am = attention_mask_2d.bool().cpu()
    for b in range(B):
        real = am[b].nonzero().flatten().tolist()
        n, n_prompt = len(real), prompt_lengths[b]
        lo = real[0] if n else 0
        if n and real[-1] - lo + 1 != n:
            raise ValueError(f"row {b}: attention_mask_2d is not one contiguous run of real tokens")
        if n_prompt > n:
            raise ValueError(f"row {b}: prompt length {n_prompt} exceeds its {n} real tokens")
        hi = lo + n
        allowed[b].fill_diagonal_(True)           # padding queries see themselves
        allowed[b, lo:hi, lo:hi] = causal[:n, :n]
        if mode == "seen":
            positions[b, lo:hi] = torch.arange(n)
            continue
        r0 = lo + n_prompt                        # the response's offset in the row
        structure = parse_structure(input_ids[b, r0:hi], tag_ids)
        positions[b, lo:r0] = torch.arange(n_prompt)
        positions[b, r0:hi] = torch.tensor(unseen_positions(structure, n_prompt), dtype=torch.long)
        for blk in structure.blocks:
            for s, e in blk.paths:                # a path hides everything of its block before it
                allowed[b, r0 + s:r0 + e, r0 + blk.start + 1:r0 + s] = False
    mask = torch.zeros(B, 1, L, L, dtype=dtype, device=device)
    mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)
    return mask, positions.to(device)
    # <<< exercise 3

def structured_forward(model, input_ids, attention_mask_2d, prompt_lengths, tag_ids: TagIds, mode: str,
                       dtype: torch.dtype | None = None):
    """One training forward under the mode's mask and positions ("sequential" = "seen"): logits (B, L, V).
    The mask is built in `dtype` (default the model's; pass the autocast dtype under mixed precision)."""
    mask, pos = build_mask_and_positions(input_ids, prompt_lengths, attention_mask_2d, tag_ids,
                                         "seen" if mode == "sequential" else mode,
                                         dtype=dtype or next(model.parameters()).dtype)
    return model(input_ids=input_ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
