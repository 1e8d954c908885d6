"""Tests of attention.py: the parser, the Seen/Unseen masks and positions, and cached branching
decode.

The expected values come from outside the code under test: the worked example of NOTES.md §2
(written out literally below), hand-computed positions for malformed responses, and reference runs
of tiny random models (an ordinary causal forward of prefix + one path, and a cached branching
decode that feeds the paths of a block side by side into one `sample.SlotCache` row, the way the
sampler does).

Token ids used throughout (a made-up vocabulary of 120; the tags sit at fixed ids):
    0 pad, 1 eos, 10 newline, 11..98 text, 100 <Parallel>, 101 </Parallel>, 102 <Path>, 103 </Path>,
    104 <Summary>, 105 </Summary>.
"""

import random

import pytest
import torch

from attention import TagIds, build_mask_and_positions, parse_structure, structured_forward

PAD, EOS, NL = 0, 1, 10
P, EP, A, EA, S, ES = 100, 101, 102, 103, 104, 105
TAGS = TagIds(parallel=P, end_parallel=EP, path=A, end_path=EA, summary=S, end_summary=ES,
              newline=(NL,), eos=EOS)
VOCAB = 120
TOL = 1e-5
MIN = torch.finfo(torch.float32).min


# --------------------------------------------------------------------------------------------------
# The worked example of NOTES.md §2


# q0 q1 q2 a <P> <A> x1 x2 </A> <A> y1 </A> </P> \n <S> s1 </S> b eos
EXAMPLE_PROMPT = [21, 22, 23]
EXAMPLE_RESPONSE = [24, P, A, 25, 26, EA, A, 27, EA, EP, NL, S, 28, ES, 29, EOS]
EXAMPLE_POS_UNSEEN = [0, 1, 2, 3, 4, 5, 6, 7, 8, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15]
# The table of NOTES.md §2 ("nl 1 ... (full causal from here on)" written out).
EXAMPLE_UNSEEN_MASK = """
1 . . . . . . . . . . . . . . . . . .
1 1 . . . . . . . . . . . . . . . . .
1 1 1 . . . . . . . . . . . . . . . .
1 1 1 1 . . . . . . . . . . . . . . .
1 1 1 1 1 . . . . . . . . . . . . . .
1 1 1 1 1 1 . . . . . . . . . . . . .
1 1 1 1 1 1 1 . . . . . . . . . . . .
1 1 1 1 1 1 1 1 . . . . . . . . . . .
1 1 1 1 1 1 1 1 1 . . . . . . . . . .
1 1 1 1 1 . . . . 1 . . . . . . . . .
1 1 1 1 1 . . . . 1 1 . . . . . . . .
1 1 1 1 1 . . . . 1 1 1 . . . . . . .
1 1 1 1 1 1 1 1 1 1 1 1 1 . . . . . .
1 1 1 1 1 1 1 1 1 1 1 1 1 1 . . . . .
1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 . . . .
1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 . . .
1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 . .
1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 .
1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1
"""


def grid(text: str) -> torch.Tensor:
    return torch.tensor([[c == "1" for c in line.split()] for line in text.strip().splitlines()])


def test_worked_example_positions_and_mask():
    ids = torch.tensor([EXAMPLE_PROMPT + EXAMPLE_RESPONSE])
    am = torch.ones_like(ids)
    mask, pos = build_mask_and_positions(ids, [3], am, TAGS, "unseen")
    assert mask.shape == (1, 1, 19, 19) and mask.dtype == torch.float32
    assert pos.shape == (1, 19) and pos.dtype == torch.long
    assert pos[0].tolist() == EXAMPLE_POS_UNSEEN
    assert set(mask.unique().tolist()) == {0.0, MIN}         # additive: 0 visible, finfo.min hidden
    assert torch.equal(mask[0, 0] == 0, grid(EXAMPLE_UNSEEN_MASK))

    mask, pos = build_mask_and_positions(ids, [3], am, TAGS, "seen")
    assert pos[0].tolist() == list(range(19))
    assert torch.equal(mask[0, 0] == 0, torch.ones(19, 19, dtype=torch.bool).tril())

    mask16, _ = build_mask_and_positions(ids, [3], am, TAGS, "unseen", dtype=torch.bfloat16)
    assert mask16.dtype == torch.bfloat16 and mask16.min().item() == torch.finfo(torch.bfloat16).min

    s = parse_structure(EXAMPLE_RESPONSE, TAGS)
    assert s.valid and s.reason == "" and s.length == 16
    assert [(b.start, b.paths, b.end, b.summary) for b in s.blocks] == \
        [(1, [(2, 6), (6, 9)], 9, (11, 14))]
    assert parse_structure(torch.tensor(EXAMPLE_RESPONSE), TAGS) == s   # a tensor parses the same


# --------------------------------------------------------------------------------------------------
# Malformed responses: never raise, valid=False with a reason, a defined mask from the recovery
# rules
#
# Each case: response (a, b, ... are text), a phrase of the reason, the hand-computed Unseen
# positions with a 2-token prompt (so the response starts at position 2), and the hidden
# (rows, cols) rectangles in response coordinates (everything else is plain causal).
a, b, c, x, y, z, w, s_, t_ = 31, 32, 33, 34, 35, 36, 37, 38, 39

MALFORMED = {
    # no </Parallel>: the block ends where its last path ends
    "unclosed_parallel": ([a, P, A, x, EA, A, y, EA], "unclosed <Parallel>",
                          [2, 3, 4, 5, 6, 4, 5, 6], [((5, 8), (2, 5))]),
    # truncated in the middle of path 2: the open path runs to the end
    "truncated_mid_path": ([a, P, A, x, y, EA, A, z], "unclosed <Path>",
                           [2, 3, 4, 5, 6, 7, 4, 5], [((6, 8), (2, 6))]),
    # a stray </Path> in the main chain is ordinary main text
    "stray_end_path": ([a, EA, b, P, A, x, EA, A, y, w, EA, EP, NL, S, s_, ES, c],
                       "stray structural tag",
                       [2, 3, 4, 5, 6, 7, 8, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
                       [((7, 11), (4, 7))]),
    # <Summary> with no block is ordinary main text: plain causal, sequential
    "summary_without_block": ([a, S, s_, ES, b], "<Summary> without a parallel block",
                              [2, 3, 4, 5, 6], []),
    # <Parallel> inside a path is an ordinary token of that path (no nested block)
    "parallel_inside_path": ([a, P, A, x, P, y, EA, A, z, EA, EP, NL, S, s_, ES],
                             "inside a path", [2, 3, 4, 5, 6, 7, 8, 4, 5, 6, 9, 10, 11, 12, 13],
                             [((7, 10), (2, 7))]),
    # a block with one path: nothing to hide, positions sequential
    "one_path_block": ([a, P, A, x, EA, EP, NL, S, s_, ES, b], "1 path(s)",
                       list(range(2, 13)), []),
    # text between two paths is block-level: one past the furthest path so far, hidden from later
    # paths
    "text_between_paths": ([a, P, A, x, EA, t_, A, y, EA, EP], "outside every path",
                           [2, 3, 4, 5, 6, 7, 4, 5, 6, 8], [((6, 9), (2, 6))]),
    # no <Summary> after </Parallel>
    "no_summary": ([a, P, A, x, EA, A, y, EA, EP, b], "no <Summary>",
                   [2, 3, 4, 5, 6, 4, 5, 6, 7, 8], [((5, 8), (2, 5))]),
    # summary cut off
    "unclosed_summary": ([a, P, A, x, EA, A, y, EA, EP, NL, S, s_], "unclosed <Summary>",
                         [2, 3, 4, 5, 6, 4, 5, 6, 7, 8, 9, 10], [((5, 8), (2, 5))]),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_response_recovery(name):
    response, reason, expected_pos, hidden = MALFORMED[name]
    s = parse_structure(response, TAGS)
    assert not s.valid and reason in s.reason, s.reason
    ids = torch.tensor([[41, 42] + response])
    mask, pos = build_mask_and_positions(ids, [2], torch.ones_like(ids), TAGS, "unseen")
    assert pos[0].tolist() == [0, 1] + expected_pos
    L = ids.shape[1]
    expected = torch.ones(L, L, dtype=torch.bool).tril()
    for (r0, r1), (c0, c1) in hidden:
        expected[2 + r0:2 + r1, 2 + c0:2 + c1] = False
    assert torch.equal(mask[0, 0] == 0, expected)
    assert torch.isfinite(mask).all()


def test_malformed_structures_recorded():
    s = parse_structure(MALFORMED["truncated_mid_path"][0], TAGS)
    assert [(bl.start, bl.paths, bl.end, bl.summary) for bl in s.blocks] == \
        [(1, [(2, 6), (6, 8)], None, None)]
    s = parse_structure(MALFORMED["unclosed_summary"][0], TAGS)
    assert [(bl.start, bl.paths, bl.end, bl.summary) for bl in s.blocks] == \
        [(1, [(2, 5), (5, 8)], 8, (10, 12))]
    s = parse_structure(MALFORMED["parallel_inside_path"][0], TAGS)
    assert [(bl.start, bl.paths) for bl in s.blocks] == [(1, [(2, 7), (7, 10)])]
    assert parse_structure([], TAGS).valid             # an empty response has nothing wrong with it


def test_random_tag_soup_never_raises_and_stays_causal():
    """Any mix of tags and text: no exception, every query sees itself, nothing sees the future or
    the padding, positions never go below the prompt's."""
    rng = random.Random(0)
    alphabet = [P, EP, A, EA, S, ES, NL, 50, 51, 52]
    for _ in range(200):
        resp = [rng.choice(alphabet) for _ in range(rng.randint(0, 30))]
        s = parse_structure(resp, TAGS)
        assert isinstance(s.valid, bool) and (s.valid or s.reason)
        n = 2 + len(resp)
        ids = torch.tensor([[PAD] * 3 + [41, 42] + resp])
        am = torch.tensor([[0] * 3 + [1] * n])
        mask, pos = build_mask_and_positions(ids, [2], am, TAGS, "unseen")
        vis = mask[0, 0] == 0
        assert vis.diagonal().all()
        assert not vis.triu(1).any()
        assert not vis[3:, :3].any()
        assert (pos[0, 5:] >= 2).all() and pos[0, :3].eq(0).all()


def test_bad_shapes_raise_value_error():
    ids = torch.tensor([[41, 42, 43]])
    am = torch.ones_like(ids)
    with pytest.raises(ValueError, match="mode"):
        build_mask_and_positions(ids, [1], am, TAGS, "causal")
    with pytest.raises(ValueError, match="prompt"):      # key words: ASSIGNMENTS.md, exercise 3
        build_mask_and_positions(ids, [4], am, TAGS, "unseen")
    with pytest.raises(ValueError, match="contiguous"):
        build_mask_and_positions(ids, [1], torch.tensor([[1, 0, 1]]), TAGS, "seen")


# --------------------------------------------------------------------------------------------------
# Tiny random models


def tiny_model(arch: str, impl: str):
    """A ~90k-parameter random model. initializer_range 0.05 (not 0.02) so that attention is far
    from uniform and a wrong mask or position moves the logits by much more than the tolerance."""
    import transformers as tf

    common = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256,
                  initializer_range=0.05, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=None)
    cfg, cls = {
        "qwen3": (lambda: tf.Qwen3Config(head_dim=16, **common), tf.Qwen3ForCausalLM),
        "qwen2": (lambda: tf.Qwen2Config(**common), tf.Qwen2ForCausalLM),
        "llama": (lambda: tf.LlamaConfig(**common), tf.LlamaForCausalLM),
    }[arch]
    torch.manual_seed(0)
    model = cls._from_config(cfg(), attn_implementation=impl, dtype=torch.float32).eval()
    assert sum(p.numel() for p in model.parameters()) < 200_000
    return model


def text(rng, n):
    return [rng.randint(11, 98) for _ in range(n)]


def make_response(rng, blocks, main_len=3, summary_len=2, tail_len=3):
    """A canonical response (NOTES.md §1) with len(blocks) parallel blocks; blocks[i] = the body
    lengths of block i's paths. Returns (response ids, [(index of <Parallel>, [(s, e) per path incl.
    tags])]), spans in response coordinates, recorded while building (independent of
    parse_structure)."""
    resp, layout = [], []
    for path_lens in blocks:
        resp += text(rng, main_len) + [P]
        p, spans = len(resp) - 1, []
        for n in path_lens:
            spans.append((len(resp), len(resp) + n + 2))
            resp += [A] + text(rng, n) + [EA]
        resp += [EP, NL, S] + text(rng, summary_len) + [ES]
        layout.append((p, spans))
    resp += text(rng, tail_len) + [EOS]
    return resp, layout


ARCHS = ["qwen3", "qwen2", "llama"]
IMPLS = ["eager", "sdpa"]
# body lengths of the paths of each of the two blocks; the longest path is not always the last one
BLOCKS = {2: [[3, 1], [1, 4]], 3: [[2, 4, 1], [3, 1, 2]]}


def causal_chunk_mask(past: int, q: int, rows: int = 1) -> torch.Tensor:
    """(rows, 1, q, past+q) additive: new tokens see the whole cache and the new tokens before
    them."""
    vis = torch.ones(q, past + q, dtype=torch.bool).tril(past)
    return torch.zeros(rows, 1, q, past + q).masked_fill(~vis, MIN)


@torch.no_grad()
def cached_branching_logits(model, prompt, response, layout):
    """Decode `prompt + response` the way the branching sampler does, returning logits (L, V)
    aligned with the full sequence: one `sample.SlotCache` row; prefill up to <Parallel>; then every
    step feeds the N paths' next tokens as N queries of that row (path k at position p+1+t, seeing
    the shared slots and its own; a finished path feeds a hidden dummy); then the path slots become
    shared and </Parallel>, the newline, <Summary>, the summary and the main text follow one token
    at a time."""
    from sample import HIDDEN, SHARED, SlotCache

    ids = prompt + response
    n0 = len(prompt)
    out = torch.full((len(ids), VOCAB), float("nan"))
    cache = SlotCache(1, len(ids) + 1, "cpu")          # every token and one scratch slot

    def step(tokens, positions, codes, mask=None):
        """Feed one row of queries; real ones take the next slots, dummies (HIDDEN) one scratch
        slot."""
        used = int((cache.owner[0] != HIDDEN).sum())   # every slot so far is real: no padding here
        n = sum(c != HIDDEN for c in codes)
        slots = [used + i for i in range(n)] + [used + n] * (len(codes) - n)
        cache.attend_to(max(slots) + 1)
        cache.slots, codes_t = torch.tensor([slots]), torch.tensor([codes])
        cache.owner[0, slots] = codes_t[0]
        o = model(input_ids=torch.tensor([tokens]), position_ids=torch.tensor([positions]),
                  cache=cache,
                  attention_mask=cache.mask(codes_t, torch.float32) if mask is None else mask,
                  use_cache=True)
        return o.logits[0]

    cur = pos_next = 0
    for p, spans in layout:
        p_abs = n0 + p
        if cur == 0:                          # prefill prompt + main text + <Parallel> in one chunk
            q = p_abs + 1
            out[:q] = step(ids[:q], list(range(q)), [SHARED] * q, causal_chunk_mask(0, q))
            pos_next = q
        else:                                 # main text after the previous block, token by token
            for i in range(cur, p_abs + 1):
                out[i] = step([ids[i]], [pos_next], [SHARED])[0]
                pos_next += 1
        pos_p = pos_next - 1
        lens = [e - s for s, e in spans]
        for t in range(max(lens)):            # live paths first (the sampler's order), then dummies
            live = [k for k, ln in enumerate(lens) if t < ln]
            dummies = len(lens) - len(live)
            logits = step([ids[n0 + spans[k][0] + t] for k in live] + [EOS] * dummies,
                          [pos_p + 1 + t] * len(live) + [0] * dummies,
                          [2 + k for k in live] + [HIDDEN] * dummies)
            for i, k in enumerate(live):
                out[n0 + spans[k][0] + t] = logits[i]
        # the block closes: nothing is copied
        cache.owner.masked_fill_(cache.owner > SHARED, SHARED)
        cur = p_abs + 1 + sum(lens)                    # index of </Parallel>
        pos_next = pos_p + 1 + max(lens)
    for i in range(cur, len(ids)):                     # </Parallel> \n <Summary> ... tail
        out[i] = step([ids[i]], [pos_next], [SHARED])[0]
        pos_next += 1
    return out


def test_slot_cache_writes_in_place_fans_out_and_keeps_rows():
    """Slot bookkeeping on keys that name themselves (value = 100*row + slot): writes land in any
    slot order, fan_out copies each prompt's row to its group in place, keep_rows compacts."""
    from sample import HIDDEN, SHARED, SlotCache

    cache = SlotCache(6, 6, "cpu", active_rows=2)

    def write(slots, label):
        rows = len(slots)
        cache.slots = torch.tensor(slots)
        cache.attend_to(max(max(r) for r in slots) + 1)
        k = torch.tensor([[[float(label(r, s))] * 3 for s in row] for r, row in enumerate(slots)])
        k = k[:, None].expand(rows, 2, -1, 3)                  # (rows, kv_heads=2, q, head_dim=3)
        return cache.update(k, -k, 0)

    write([[0, 1, 2], [0, 1, 2]], lambda r, s: 100 * r + s)
    keys, values = write([[3, 4], [4, 3]], lambda r, s: 100 * r + s)   # any slot order
    assert cache.keys[0].shape == (6, 2, 6, 3) and keys.shape == (2, 2, 5, 3)
    assert keys[:, 0, :, 0].tolist() == [[0, 1, 2, 3, 4], [100, 101, 102, 103, 104]]
    assert torch.equal(values, -keys)
    cache.owner[0, :5] = torch.tensor([SHARED, HIDDEN, 2, 3, SHARED])
    vis = cache.mask(torch.tensor([[2, 3], [SHARED, SHARED]]), torch.float32)[0, 0] == 0
    assert vis.tolist() == [[True, False, True, False, True], [True, False, False, True, True]]
    storage = cache.keys[0].data_ptr()
    cache.fan_out(3)                                           # rows 0, 0, 0, 1, 1, 1
    assert cache.active_rows == 6 and cache.keys[0].data_ptr() == storage   # no copy of the cache
    assert cache.keys[0][:, 0, :5, 0].tolist() == \
        [[0, 1, 2, 3, 4]] * 3 + [[100, 101, 102, 103, 104]] * 3
    assert cache.owner[:, :5].tolist() == [[SHARED, HIDDEN, 2, 3, SHARED]] * 3 + [[0] * 5] * 3
    cache.keys[0][0] += 7                                      # the rows are copies, not views
    assert cache.keys[0][1, 0, 0, 0] == 0
    cache.keep_rows([1, 4])
    assert cache.active_rows == 2 and cache.owner.shape == (2, 6)
    assert cache.keys[0][:2, 0, :5, 0].tolist() == [[0, 1, 2, 3, 4], [100, 101, 102, 103, 104]]
    with pytest.raises(ValueError, match="7 cache slots asked for, the capacity is 6"):
        cache.attend_to(7)


@pytest.mark.parametrize("n_paths", [2, 3])
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("arch", ARCHS)
def test_unseen_equals_independent_paths_and_cached_branching(arch, impl, n_paths):
    rng = random.Random(n_paths)
    model = tiny_model(arch, impl)
    prompt = text(rng, 5)
    response, layout = make_response(rng, BLOCKS[n_paths])
    n0 = len(prompt)
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        full = structured_forward(model, ids, torch.ones_like(ids), [n0], TAGS, "unseen")[0]
        seen = structured_forward(model, ids, torch.ones_like(ids), [n0], TAGS, "seen")[0]
    diffs = []

    # (1) every path of the first block = prefix + that path alone, as an ordinary causal sequence
    p, spans = layout[0]
    for s, e in spans:
        alone = torch.tensor([prompt + response[:p + 1] + response[s:e]])
        with torch.no_grad():
            ref = model(alone).logits[0]             # no mask, default positions 0..n-1
        q = n0 + p + 1
        diffs.append((full[:q] - ref[:q]).abs().max().item())
        diffs.append((full[n0 + s:n0 + e] - ref[q:]).abs().max().item())

    # (2) every token (paths of both blocks, summaries, main text) = the cached branching decode
    cached = cached_branching_logits(model, prompt, response, layout)
    assert not cached.isnan().any()
    diffs.append((full - cached).abs().max().item())
    print(f"\n{arch}/{impl}/{n_paths} paths: max |unseen - reference| = {max(diffs):.2e}")
    assert max(diffs) <= TOL

    # the test can fail: Seen differs from Unseen on the later paths (they see earlier siblings)
    s2, e2 = layout[0][1][1]
    assert (full[n0 + s2:n0 + e2] - seen[n0 + s2:n0 + e2]).abs().max() > 100 * TOL


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("arch", ARCHS)
def test_seen_equals_plain_causal_forward(arch, impl):
    rng = random.Random(7)
    model = tiny_model(arch, impl)
    prompt = text(rng, 4)
    response, _ = make_response(rng, BLOCKS[3])
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        ref = model(ids).logits                       # no mask argument, default positions
        for mode in ("seen", "sequential"):
            got = structured_forward(model, ids, torch.ones_like(ids), [len(prompt)], TAGS, mode)
            assert (got - ref).abs().max().item() <= TOL


def test_structured_forward_rejects_unknown_mode():
    model = tiny_model("qwen3", "sdpa")
    ids = torch.tensor([[41, 42, 43]])
    with pytest.raises(ValueError, match="mode"):
        structured_forward(model, ids, torch.ones_like(ids), [1], TAGS, "Unseen")


# --------------------------------------------------------------------------------------------------
# A padded batch equals its rows run one at a time, with finite logits and gradients


def padded_batch(rng):
    """Rows: left-padded canonical 2-path block; right-padded response truncated mid-path (3 paths);
    an all-padding row (prompt length 0); an unpadded two-block response. Returns ids, mask, prompt
    lengths and the (start, end) of each row's real tokens."""
    rows = [
        (text(rng, 4), make_response(rng, [[2, 3]])[0], "left"),
        (text(rng, 6), make_response(rng, [[1, 2, 3]])[0][:-12], "right"),
        ([], [], "left"),
        (text(rng, 3), make_response(rng, [[3, 1], [2, 2, 1]])[0], "none"),
    ]
    L = max(len(pr) + len(re) for pr, re, _ in rows)
    ids, am, spans = [], [], []
    for pr, re, side in rows:
        real = pr + re
        pad = [PAD] * (L - len(real))
        lo = len(pad) if side == "left" else 0
        ids.append(pad + real if side == "left" else real + pad)
        am.append([1 if lo <= i < lo + len(real) else 0 for i in range(L)])
        spans.append((lo, lo + len(real)))
    return torch.tensor(ids), torch.tensor(am), [len(pr) for pr, _, _ in rows], spans


def token_loss(logits, ids, lo, hi):
    """Sum of next-token cross-entropies over a row's real tokens [lo, hi)."""
    if hi - lo < 2:
        return logits.sum() * 0
    return torch.nn.functional.cross_entropy(logits[lo:hi - 1], ids[lo + 1:hi], reduction="sum")


@pytest.mark.parametrize("mode", ["seen", "unseen"])
@pytest.mark.parametrize("impl", IMPLS)
def test_padded_batch_equals_rows(impl, mode):
    rng = random.Random(3)
    model = tiny_model("qwen3", impl)
    ids, am, prompt_lengths, spans = padded_batch(rng)
    assert am[2].sum() == 0 and am[0, 0] == 0 and am[1, -1] == 0

    model.zero_grad()
    logits = structured_forward(model, ids, am, prompt_lengths, TAGS, mode)
    assert torch.isfinite(logits).all()
    loss = sum(token_loss(logits[r], ids[r], lo, hi) for r, (lo, hi) in enumerate(spans))
    loss.backward()
    batch_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    for n, g in batch_grads.items():
        assert torch.isfinite(g).all(), n
    assert any(g.abs().max() > 0 for g in batch_grads.values())

    model.zero_grad()
    row_loss = 0
    for r, (lo, hi) in enumerate(spans):
        if hi == lo:
            continue
        one = ids[r:r + 1, lo:hi]
        ref = structured_forward(model, one, torch.ones_like(one), [prompt_lengths[r]], TAGS,
                                 mode)[0]
        assert (logits[r, lo:hi] - ref).abs().max().item() <= TOL
        row_loss = row_loss + token_loss(ref, one[0], 0, hi - lo)
    row_loss.backward()
    assert abs(loss.item() - row_loss.item()) <= 1e-4 * abs(row_loss.item())
    for n, p in model.named_parameters():
        torch.testing.assert_close(batch_grads[n], p.grad, rtol=1e-4, atol=1e-5, msg=n)
