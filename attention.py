"""The parallel-thinking structure: one parser, and the Seen/Unseen masks and positions.

A response in the Parallel-R1 format (PAPER_NOTES §1.3) looks like

    main ... <Parallel><Path> p1 </Path><Path> p2 </Path></Parallel>\\n<Summary> s </Summary> main ... Final Answer: 7<eos>

Everything in this project that needs to know where the blocks, paths and summaries are -- the
training mask, the sampler, the format reward, the SFT data filter -- calls `parse_structure` below,
so there is exactly one definition of the format.

Two model variants (PAPER_NOTES §2):

* Seen   -- ordinary causal attention, positions 0..L-1. Path 2 can read path 1.
* Unseen -- a path's tokens (its <Path> and </Path> included) see the shared prefix and their own path
  only; </Parallel> and everything after it see everything before them. "Multiverse" positions: every
  path of a block starts at p+1 where p is the position of <Parallel>; </Parallel> sits one past the end
  of the longest path; later tokens continue by +1.

Worked example (PAPER_NOTES §2.4; run `python attention.py` to print it):

    idx  tok   pos(Unseen)  pos(Seen)
    0-2  q0-q2   0 1 2       0 1 2      prompt: never parsed, always numbered 0..n-1
    3    a       3           3
    4    <P>     4           4          p = 4
    5    <A>     5           5          path 1 starts at p+1
    6-8  x1 x2 </A>  6 7 8   6 7 8
    9    <A>     5           9          path 2 starts at p+1 again, and cannot see idx 5-8
    10-11 y1 </A>  6 7       10 11
    12   </P>    9           12         p + longest path (4 tokens) + 1
    13.. \\n <S> ...  10 ...    13 ...

The prompt is never parsed (the paper's instruction text itself contains the tags; parsing it shifted
every position in the official SFT code, PAPER_NOTES §8.2.1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

# ----------------------------------------------------------------------------------------------------
# Tag ids


@dataclass(frozen=True)
class TagIds:
    """Token ids of the six structural tags, plus the ids the runtime injects around them.

    `newline` is the token sequence injected between </Parallel> and <Summary> (one id for both the
    tiny character tokenizer and Qwen's "\\n"). `eos` is the tokenizer's end-of-sequence id.
    """

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
        """Look the tags up in `tokenizer`.

        Raises ValueError when a tag is not a single token (the tokenizer was not loaded through
        `model.load_model`, which adds them) or the tokenizer has no EOS token.
        """
        from model import TAGS  # the tag strings live with the code that adds them

        ids = []
        for tag in TAGS:
            enc = tokenizer.encode(tag, add_special_tokens=False)
            if len(enc) != 1 or enc[0] == getattr(tokenizer, "unk_token_id", None):
                raise ValueError(
                    f"tokenizer does not have {tag!r} as one token (it encodes to {enc}); "
                    "load the model with model.load_model(), which adds the six parallel tags")
            ids.append(enc[0])
        if len(set(ids)) != len(ids):
            raise ValueError(f"the six tags do not have distinct ids: {ids}")
        if tokenizer.eos_token_id is None:
            raise ValueError("tokenizer has no eos_token_id; set one before sampling or training")
        newline = tuple(tokenizer.encode("\n", add_special_tokens=False))
        return cls(*ids, newline=newline, eos=tokenizer.eos_token_id)


# ----------------------------------------------------------------------------------------------------
# The parser


@dataclass
class Block:
    """One parallel block. Indices are into the parsed id sequence; spans are [start, end)."""

    start: int                                    # index of <Parallel>
    paths: list[tuple[int, int]] = field(default_factory=list)  # each from its <Path> to its </Path> inclusive
    end: int | None = None                        # index of </Parallel>; None if the block never closed
    summary: tuple[int, int] | None = None        # <Summary> ... </Summary> inclusive; end = len if unclosed


@dataclass
class Structure:
    blocks: list[Block]
    valid: bool
    reason: str          # "" when valid, else the first problem found (with its token index)
    length: int


def parse_structure(ids: Sequence[int], tags: TagIds) -> Structure:
    """Parse the parallel structure of one *response* (never the prompt).

    Args:
        ids: the response token ids (a list, tuple or 1-D tensor); padding must already be removed.
        tags: `TagIds` of the tokenizer.
    Returns:
        `Structure` with the blocks and `valid`/`reason`. Valid means (PAPER_NOTES §4.3, made strict):
        every block closed, >= 2 paths per block, nothing but the newline between </Parallel> and a
        <Summary>, every summary closed, no structural tag inside a path or a summary, no text between
        the paths of a block, no stray tag in the main chain.

    Never raises on malformed model output; the recovery rules (also what the mask builder uses) are:
      * a tag that is out of place (stray </Path>, <Summary> with no block, <Parallel> inside a path,
        </Parallel> inside a summary, ...) is an ordinary token of the segment it sits in;
      * an unclosed <Path> runs to the end of the sequence; an unclosed block ends where its last path ends;
      * tokens inside a block but outside every path are block-level tokens (no path owns them);
      * after </Parallel>, anything other than the newline or <Summary> ends the block without a summary.
    """
    if isinstance(ids, torch.Tensor):
        ids = ids.tolist()
    P, EP, A, EA, S, ES = tags.parallel, tags.end_parallel, tags.path, tags.end_path, tags.summary, tags.end_summary
    structural = tags.structural
    newline = set(tags.newline)
    blocks: list[Block] = []
    reason = ""

    def bad(msg: str):
        nonlocal reason
        if not reason:
            reason = msg

    state, path_start = "main", 0
    for i, t in enumerate(ids):
        if state == "after":                      # just closed a block, waiting for <Summary>
            if t == S:
                state, sum_start = "summary", i
                continue
            if t in newline:
                continue
            bad(f"no <Summary> after </Parallel> (token {i})")
            state = "main"                        # fall through: t is handled as main-chain text
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
                blk = blocks[-1]
                blk.end = i
                if len(blk.paths) < 2:
                    bad(f"block at token {blk.start} has {len(blk.paths)} path(s), needs >= 2")
                state = "after"
            else:
                bad(f"token {i} inside a block but outside every path")
        elif state == "path":
            if t == EA:
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


def unseen_positions(structure: Structure, start: int = 0) -> list[int]:
    """Multiverse position ids of a parsed response whose first token sits at position `start`.

    Rule (PAPER_NOTES §2.3): every path of a block starts at p+1 (p = position of <Parallel>);
    block-level tokens (</Parallel>, or text between paths) continue one past the furthest path so far;
    everything after the block continues by +1. Returns a list of `structure.length` ints.
    """
    pos = [0] * structure.length
    path_of: dict[int, tuple[int, int]] = {}     # path start index -> (block <Parallel> index, path end)
    for b in structure.blocks:
        for s, e in b.paths:
            path_of[s] = (b.start, e)
    nxt, i, block_p = start, 0, {}
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


# ----------------------------------------------------------------------------------------------------
# Masks and positions for a padded batch


def build_mask_and_positions(
    input_ids: torch.Tensor,
    prompt_lengths: torch.Tensor | Sequence[int],
    attention_mask_2d: torch.Tensor,
    tag_ids: TagIds,
    mode: str,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The training-time attention mask and position ids for a batch of prompt+response rows.

    Args:
        input_ids: (B, L) long. Each row is [pad*] prompt response [pad*]: left or right padding,
            a different structure in each row.
        prompt_lengths: (B,) number of real prompt tokens in each row (the prompt is never parsed).
        attention_mask_2d: (B, L) 0/1, the real tokens of each row (one contiguous run).
        tag_ids: `TagIds` of the tokenizer.
        mode: "seen" (causal, positions 0..n-1) or "unseen" (path isolation + multiverse positions).
        dtype: dtype of the additive mask; use the model's compute dtype.
    Returns:
        mask: (B, 1, L, L) `dtype`, additive: 0 where a query (row) may attend to a key (column),
            `torch.finfo(dtype).min` where not. Never bool (eager attention would add a bool mask as
            0/1) and never a fully hidden row: padding queries see themselves only, so no NaN appears
            in logits or gradients under eager or sdpa.
        position_ids: (B, L) long; padding gets position 0.
    Raises:
        ValueError when shapes disagree, the mode is unknown, a row's real tokens are not one
        contiguous run, or a prompt is longer than its row. Malformed *responses* never raise
        (see `parse_structure` for the rules).
    """
    if mode not in ("seen", "unseen"):
        raise ValueError(f"mode must be 'seen' or 'unseen', got {mode!r}")
    if input_ids.dim() != 2 or attention_mask_2d.shape != input_ids.shape:
        raise ValueError(f"input_ids {tuple(input_ids.shape)} and attention_mask_2d "
                         f"{tuple(attention_mask_2d.shape)} must both be (B, L)")
    B, L = input_ids.shape
    prompt_lengths = torch.as_tensor(prompt_lengths).tolist()
    if len(prompt_lengths) != B:
        raise ValueError(f"prompt_lengths has {len(prompt_lengths)} entries for a batch of {B} rows")
    device = input_ids.device
    allowed = torch.zeros(B, L, L, dtype=torch.bool, device=device)
    positions = torch.zeros(B, L, dtype=torch.long)
    causal = torch.ones(L, L, dtype=torch.bool, device=device).tril()
    am = attention_mask_2d.bool().cpu()
    for b in range(B):
        real = am[b].nonzero().flatten().tolist()
        n = len(real)
        lo = real[0] if n else 0
        if n and real[-1] - lo + 1 != n:
            raise ValueError(f"row {b}: attention_mask_2d is not one contiguous run of real tokens")
        if prompt_lengths[b] > n:
            raise ValueError(f"row {b}: prompt length {prompt_lengths[b]} exceeds its {n} real tokens")
        hi = lo + n
        allowed[b].fill_diagonal_(True)           # padding queries see themselves
        allowed[b, lo:hi, lo:hi] = causal[:n, :n]
        n_prompt = prompt_lengths[b]
        if mode == "seen":
            positions[b, lo:hi] = torch.arange(n)
            continue
        structure = parse_structure(input_ids[b, lo + n_prompt:hi], tag_ids)
        positions[b, lo:lo + n_prompt] = torch.arange(n_prompt)
        positions[b, lo + n_prompt:hi] = torch.tensor(unseen_positions(structure, n_prompt), dtype=torch.long)
        r0 = lo + n_prompt                        # response offset inside the row
        for blk in structure.blocks:
            for s, e in blk.paths:                # a path hides everything in its block before it
                allowed[b, r0 + s:r0 + e, r0 + blk.start + 1:r0 + s] = False
    mask = torch.zeros(B, 1, L, L, dtype=dtype, device=device)
    mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)
    return mask, positions.to(device)


def structured_forward(model, input_ids, attention_mask_2d, prompt_lengths, tag_ids: TagIds, mode: str,
                       dtype: torch.dtype | None = None):
    """One training forward under the Seen/Unseen structure. Returns logits (B, L, V).

    `mode="sequential"` is treated like "seen" (a plain causal forward). The mask is built in the
    model's dtype and passed as a 4-D tensor together with explicit `position_ids`.
    Raises ValueError for any other mode (a typo must not silently train Seen).
    """
    if mode not in ("seen", "unseen", "sequential"):
        raise ValueError(f"mode must be 'seen', 'unseen' or 'sequential', got {mode!r}")
    dtype = dtype or next(model.parameters()).dtype    # pass the autocast dtype under mixed precision
    mask, pos = build_mask_and_positions(input_ids, prompt_lengths, attention_mask_2d, tag_ids,
                                         "unseen" if mode == "unseen" else "seen", dtype=dtype)
    return model(input_ids=input_ids, attention_mask=mask, position_ids=pos, use_cache=False).logits


# ----------------------------------------------------------------------------------------------------
# `python attention.py`: print the worked example


def _demo():
    tags = TagIds(parallel=100, end_parallel=101, path=102, end_path=103, summary=104, end_summary=105,
                  newline=(106,), eos=107)
    names = {100: "<P>", 101: "</P>", 102: "<A>", 103: "</A>", 104: "<S>", 105: "</S>", 106: "\\n", 107: "eos"}
    prompt = [1, 2, 3]
    response = [4, 100, 102, 5, 6, 103, 102, 7, 103, 101, 106, 104, 8, 105, 9, 107]
    labels = ["q0", "q1", "q2", "a", "<P>", "<A>", "x1", "x2", "</A>", "<A>", "y1", "</A>", "</P>", "\\n",
              "<S>", "s1", "</S>", "b", "eos"]
    ids = torch.tensor([prompt + response])
    am = torch.ones_like(ids)
    print("Parallel-R1 structure, worked example (PAPER_NOTES §2.4). '1' = the row token may attend to the column token.\n")
    for mode in ("seen", "unseen"):
        mask, pos = build_mask_and_positions(ids, [3], am, tags, mode)
        print(f"{mode:>7} positions: " + " ".join(f"{p:>4}" for p in pos[0].tolist()))
    print("         tokens:    " + " ".join(f"{t:>4}" for t in labels))
    mask, _ = build_mask_and_positions(ids, [3], am, tags, "unseen")
    vis = (mask[0, 0] == 0)
    print("\nUnseen mask (Seen is the full lower triangle):")
    print("      " + "".join(f"{t:>5}" for t in labels))
    for i, t in enumerate(labels):
        print(f"{t:>5} " + "".join(f"{'1' if vis[i, j] else '.':>5}" for j in range(len(labels))))
    s = parse_structure(response, tags)
    print(f"\nparse_structure(response): valid={s.valid}, blocks={[(b.start, b.paths, b.end, b.summary) for b in s.blocks]}")


if __name__ == "__main__":
    _demo()
