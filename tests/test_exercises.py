"""The course kit's own grading tests (ASSIGNMENTS.md): tiny hand-worked inputs, one group per
exercise, each failure's first line saying what is wrong (the expected and the actual value, or the
first wrong entry), the next ones the input and the NOTES.md section to read. Together with the
existing tests tagged in conftest.py (EXERCISE_TESTS) they grade exercise k: `pytest -m exercise_k`.

Token ids as in test_attention.py: 1 eos, 10 newline, 11..98 text, 100 <Parallel>, 101 </Parallel>,
102 <Path>, 103 </Path>, 104 <Summary>, 105 </Summary>."""

import math

import pytest
import torch

from attention import (
    Block,
    Structure,
    TagIds,
    build_mask_and_positions,
    parse_structure,
    token_logprobs,
    unseen_positions,
)
from eval import pass_at_k
from grpo import agg_loss, compute_advantages, loss_weights, policy_loss
from model import load_model
from rewards import RewardSchedule
from sample import (
    FIRST_PATH_OWNER,
    HIDDEN,
    MAIN,
    PATH,
    SHARED,
    SUMMARY,
    Engine,
    Sample,
    SamplingConfig,
    SlotCache,
    Stream,
)

EOS, NL = 1, 10
P, EP, A, EA, S, ES = 100, 101, 102, 103, 104, 105
TAGS = TagIds(parallel=P, end_parallel=EP, path=A, end_path=EA, summary=S, end_summary=ES,
              newline=(NL,), eos=EOS)
NAMES = {EOS: "eos", NL: r"\n", P: "<P>", EP: "</P>", A: "<A>", EA: "</A>", S: "<S>", ES: "</S>"}

# the worked example of NOTES.md §2: a <P> <A> x1 x2 </A> <A> y1 </A> </P> \n <S> s1 </S> b eos
RESPONSE = [24, P, A, 25, 26, EA, A, 27, EA, EP, NL, S, 28, ES, 29, EOS]
# two blocks, the second with three paths of lengths 3, 4 and 2 (tags included)
TWO_BLOCKS = [31, P, A, 32, EA, A, 33, 34, EA, EP, NL, S, 35, ES, 36,
              P, A, 37, EA, A, 38, 39, EA, A, 41, EA, EP, NL, S, 40, ES, EOS]


def show(ids):
    return " ".join(NAMES.get(t, str(t)) for t in ids)


def spans(s: Structure):
    return [(b.start, b.paths, b.end, b.summary) for b in s.blocks]


def first_difference(got: list, expected: list) -> int:
    """The index of the first element where two lists differ (the shorter length if none)."""
    pairs = zip(got, expected)
    return next((i for i, (g, e) in enumerate(pairs) if g != e), min(len(got), len(expected)))


def item(values: list, i: int):
    """values[i], or "nothing" past the end (a list shorter than expected)."""
    if i < len(values):
        return values[i]
    return "nothing"


def first_wrong(ids, wrongly_hidden, wrongly_seen):
    """The first wrong (query, key) of a mask, in words, the token of each column named."""
    if wrongly_hidden:
        q, k = wrongly_hidden[0]
        return f"the first: query {q} ({show([ids[q]])}) does not see key {k} ({show([ids[k]])})"
    q, k = wrongly_seen[0]
    return f"the first: query {q} ({show([ids[q]])}) sees key {k} ({show([ids[k]])})"


def mask_type(mask, shape) -> str:
    """The message when a mask is not an additive float32 one of `shape`."""
    return (f"expected an additive mask of shape {shape}, dtype torch.float32 (0 visible, "
            f"torch.finfo(dtype).min hidden; never a bool: NOTES.md §2), got shape "
            f"{tuple(mask.shape)}, dtype {mask.dtype}")


# --------------------------------------------------------------------------------------------------
# Exercise 1: parse_structure (NOTES.md §1)

@pytest.mark.exercise_1
@pytest.mark.parametrize("ids, expected", [
    (RESPONSE, [(1, [(2, 6), (6, 9)], 9, (11, 14))]),
    (TWO_BLOCKS, [(1, [(2, 5), (5, 9)], 9, (11, 14)),
                  (15, [(16, 19), (19, 23), (23, 26)], 26, (28, 31))]),
    ([24, 25, EOS], []),
])
def test_ex1_spans_of_well_formed_responses(ids, expected):
    s = parse_structure(ids, TAGS)
    assert s.valid and s.reason == "", \
        (f"expected valid=True, reason '' (well-formed: NOTES.md §1), got valid={s.valid}, "
         f"reason {s.reason!r}\n  response {show(ids)}")
    assert s.length == len(ids)
    assert spans(s) == expected, \
        (f"expected (start, paths, end, summary) = {expected}, got {spans(s)}\n  response "
         f"{show(ids)}\n  (spans [start, end), a path from its <Path> to its </Path> inclusive; "
         f"NOTES.md §1)")


@pytest.mark.exercise_1
@pytest.mark.parametrize("ids, phrase", [
    ([24, P, A, 25, EA, EP, NL, S, 28, ES], "1 path(s)"),
    ([24, P, A, 25, EA, A, 26, EA, EP, 29], "no <Summary>"),
    ([24, P, A, 25, EA, A, 26], "unclosed <Path>"),
    ([24, EA, 25], "stray structural tag"),
])
def test_ex1_malformed_responses_say_why(ids, phrase):
    s = parse_structure(ids, TAGS)
    assert not s.valid and phrase in s.reason, \
        (f"expected valid=False with a reason containing {phrase!r}, got valid={s.valid}, "
         f"reason={s.reason!r}\n  response {show(ids)}")


@pytest.mark.exercise_1
@pytest.mark.parametrize("ids, reason", [
    ([24, P, A, 25, EA, EP, NL, S, 28, ES], "block at token 1 has 1 path(s), needs >= 2"),
    ([24, P, A, 25, EA, A, 26], "unclosed <Path> at token 5"),
    ([24, P, A, 25, S, EA, A, 26, EA, EP, NL, S, 28, ES],
     f"structural tag {S} inside a path (token 4)"),
    ([24, P, A, 25, EA, A, 26, EA, EP, 29], "no <Summary> after </Parallel> (token 9)"),
    ([24, EA, 25], f"stray structural tag {EA} in the main chain (token 1)"),
    ([P, A, EA, A, 25, EA, EP, NL, S, ES], "empty path at token 1"),
    ([24, S, 25, ES], "<Summary> without a parallel block (token 1)"),
    ([24, P, A, 25, EA, 26, A, 27, EA, EP, NL, S, ES],
     "token 5 inside a block but outside every path"),
    ([24, P, A, 25, EA, A, 26, EA, EP, NL, S, 28, P, ES],
     f"structural tag {P} inside a summary (token 12)"),
    ([24, P, A, 25, EA, A, 26, EA], "unclosed <Parallel> at token 1"),
    ([24, P, A, 25, EA, A, 26, EA, EP], "no <Summary> after the last </Parallel>"),
    ([24, P, A, 25, EA, A, 26, EA, EP, NL, S, 28], "unclosed <Summary> at token 10"),
])
def test_ex1_reasons_word_for_word(ids, reason):
    """The reason is part of the interface: rewards.check_format returns it, the format reward's
    tests compare it word for word, and a student reading a rollout's reason finds the token.
    The first problem found, with its token index (0-based, in the response)."""
    s = parse_structure(ids, TAGS)
    assert (s.valid, s.reason) == (False, reason), \
        (f"expected reason {reason!r}, got valid={s.valid}, reason={s.reason!r}\n  response "
         f"{show(ids)}\n  (the attention.parse_structure docstring; NOTES.md §1)")


# --------------------------------------------------------------------------------------------------
# Exercise 2: unseen_positions (NOTES.md §2). The structures are written by hand: no parser
# needed.

@pytest.mark.exercise_2
@pytest.mark.parametrize("structure, start, expected", [
    (Structure([Block(1, [(2, 6), (6, 9)], 9, (11, 14))], True, "", 16), 3,    # NOTES.md §2's table
     [3, 4, 5, 6, 7, 8, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15]),
    (Structure([], True, "", 4), 7, [7, 8, 9, 10]),                          # no block: sequential
    # a 2-token prompt; text between the paths is block-level: one past the furthest path so far
    (Structure([Block(1, [(2, 5), (6, 9)], 9, None)], False,
               "token 5 inside a block but outside every path", 10), 2,
     [2, 3, 4, 5, 6, 7, 4, 5, 6, 8]),
    # no </Parallel> (the response ends inside the block) and a path cut off by the budget
    (Structure([Block(1, [(2, 6), (6, 8)], None, None)], False, "unclosed <Path> at token 6", 8), 2,
     [2, 3, 4, 5, 6, 7, 4, 5]),
    (Structure([Block(1, [(2, 5), (5, 9)], 9, (11, 14)),
                Block(15, [(16, 19), (19, 23), (23, 25)], 25, (27, 30))],
               True, "", 31), 0,
     [0, 1, 2, 3, 4, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 13, 14, 15, 16, 13, 14, 17, 18,
      19, 20, 21, 22]),
])
def test_ex2_positions_by_hand(structure, start, expected):
    got = unseen_positions(structure, start)
    i = first_difference(got, expected)
    assert got == expected, (f"expected {len(expected)} positions, got {len(got)}; at index "
                             f"{i} expected {item(expected, i)}, got {item(got, i)}\n  blocks "
                             f"{spans(structure)}, first position {start}\n  expected "
                             f"{expected}\n  got      {got}"
                             f"\n  (every path counts from p+1, p the position of its <Parallel>; "
                             f"</Parallel> one past the longest path; NOTES.md §2)")


# --------------------------------------------------------------------------------------------------
# Exercise 3: build_mask_and_positions (NOTES.md §2)

@pytest.mark.exercise_3
def test_ex3_unseen_mask_hides_exactly_the_sibling_path():
    prompt = [21, 22, 23]
    ids = torch.tensor([prompt + RESPONSE])
    mask, _ = build_mask_and_positions(ids, [3], torch.ones_like(ids), TAGS, "unseen")
    assert mask.shape == (1, 1, 19, 19) and mask.dtype == torch.float32, \
        mask_type(mask, (1, 1, 19, 19))
    hidden = (mask[0, 0] != 0).nonzero().tolist()
    future = [[i, j] for i in range(19) for j in range(i + 1, 19)]
    extra = sorted(set(map(tuple, hidden)) - set(map(tuple, future)))
    expected = [(i, j) for i in (9, 10, 11) for j in (5, 6, 7, 8)]
    wrongly_hidden = sorted(set(extra) - set(expected))
    wrongly_seen = sorted(set(expected) - set(extra))
    assert extra == expected, \
        (f"{len(wrongly_hidden)} (query, key) hidden that should be seen, {len(wrongly_seen)} "
         f"seen that should be hidden; {first_wrong(ids[0].tolist(), wrongly_hidden, wrongly_seen)}"
         f"\n  prompt {prompt}, response {show(RESPONSE)} (row index = token "
         f"index)\n  hidden beyond the causal mask, (query, key) expected\n  {expected}\n  "
         f"got\n  {extra}\n"
         f"  (path 2 = rows 9-11 must not see path 1 = columns 5-8; NOTES.md §2)")
    assert set(mask.unique().tolist()) == {0.0, torch.finfo(torch.float32).min}, \
        "additive mask: 0 visible, torch.finfo(dtype).min hidden, never a bool (NOTES.md §2)"


@pytest.mark.exercise_3
def test_ex3_padding_sees_itself_and_positions_start_at_zero():
    ids = torch.tensor([[0, 0, 21, 22, 24, 25]])
    am = torch.tensor([[0, 0, 1, 1, 1, 1]])
    mask, pos = build_mask_and_positions(ids, [2], am, TAGS, "seen")
    vis = (mask[0, 0] == 0).int().tolist()
    expected = [[1, 0, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0], [0, 0, 1, 0, 0, 0], [0, 0, 1, 1, 0, 0],
                [0, 0, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]]
    q = first_difference(vis, expected)
    assert vis == expected, \
        (f"left-padded row {ids[0].tolist()}: query {q} expected to see (1) {item(expected, q)}, "
         f"got {item(vis, q)}\n  expected\n  {expected}\n  got\n  {vis}\n  (a padding "
         f"query sees only itself; NOTES.md §2)")
    assert pos[0].tolist() == [0, 0, 0, 1, 2, 3], \
        f"positions: expected [0, 0, 0, 1, 2, 3] (padding 0, real tokens from 0), got " \
        f"{pos[0].tolist()}"


# Two rows that differ in everything a row may own: row 0 is left-padded, has a 3-token prompt and
# NOTES.md §2's response; row 1 is right-padded, has a 2-token prompt and a response whose block
# starts at its first token and whose second path is longer. Columns are row coordinates.
ROW_1_RESPONSE = [P, A, 25, EA, A, 26, 27, EA, EP, NL, S, 28, ES, EOS]
TWO_ROWS = [
    # (padding before, prompt, response, padding after)
    (2, [21, 22, 23], RESPONSE, 0),
    (0, [21, 22], ROW_1_RESPONSE, 5),
]
# worked by hand from each row's own prompt length: row 0's response starts at column 2 + 3 = 5,
# its path 2 (response 6..8) is columns 11-13 and may not see path 1 (response 2..5): columns 7-10.
# Row 1's response starts at column 0 + 2 = 2; its path 2 (response 4..7) is columns 6-9 and may
# not see path 1 (response 1..3): columns 3-5.
TWO_ROWS_HIDDEN = [
    [(q, k) for q in (11, 12, 13) for k in (7, 8, 9, 10)],
    [(q, k) for q in (6, 7, 8, 9) for k in (3, 4, 5)],
]
TWO_ROWS_POSITIONS = [
    [0, 0] + [0, 1, 2] + [3, 4, 5, 6, 7, 8, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15],
    [0, 1] + [2, 3, 4, 5, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12] + [0] * 5,
]


def two_row_batch():
    """input_ids, prompt_lengths and attention_mask_2d of TWO_ROWS (pad id 0)."""
    rows = []
    masks = []
    for before, prompt, response, after in TWO_ROWS:
        rows.append([0] * before + prompt + response + [0] * after)
        masks.append([0] * before + [1] * (len(prompt) + len(response)) + [0] * after)
    prompt_lengths = [len(prompt) for _, prompt, _, _ in TWO_ROWS]
    return torch.tensor(rows), prompt_lengths, torch.tensor(masks)


@pytest.mark.exercise_3
def test_ex3_each_row_of_a_batch_has_its_own_prompt_padding_and_blocks():
    """Each row's mask and positions come from that row alone: its padding, its prompt length
    (prompt_lengths[b]) and its own parsed response. A hidden rectangle written into every row
    (allowed[:, ...] instead of allowed[b, ...]) or row 0's prompt length used for every row
    passes every one-row test and fails here."""
    ids, prompt_lengths, am = two_row_batch()
    mask, pos = build_mask_and_positions(ids, prompt_lengths, am, TAGS, "unseen")
    L = ids.shape[1]
    assert mask.shape == (2, 1, L, L) and pos.shape == (2, L), \
        (f"expected mask shape (2, 1, {L}, {L}) and positions (2, {L}), got "
         f"{tuple(mask.shape)} and {tuple(pos.shape)}")
    for b, (before, prompt, response, after) in enumerate(TWO_ROWS):
        real = range(before, L - after)
        hidden = (mask[b, 0] != 0).nonzero().tolist()
        extra = sorted((q, k) for q, k in hidden if q in real and k in real and k <= q)
        where = (f"the row: {before} padding before, prompt {prompt} "
                 f"(prompt_lengths[{b}] = {len(prompt)}), response {show(response)}, {after} "
                 f"padding after")
        wrongly_hidden = sorted(set(extra) - set(TWO_ROWS_HIDDEN[b]))
        wrongly_seen = sorted(set(TWO_ROWS_HIDDEN[b]) - set(extra))
        assert extra == TWO_ROWS_HIDDEN[b], \
            (f"row {b} of a 2-row batch: {len(wrongly_hidden)} (query, key) hidden that this "
             f"row's blocks do not hide, {len(wrongly_seen)} visible that they hide; "
             f"{first_wrong(ids[b].tolist(), wrongly_hidden, wrongly_seen)}\n  {where}"
             f"\n  hidden beyond the causal mask, in row coordinates, expected\n  "
             f"{TWO_ROWS_HIDDEN[b]}\n  got\n  {extra}\n  hidden but should be seen: "
             f"{wrongly_hidden}\n  seen but should be hidden: {wrongly_seen}\n  (each row's "
             f"hidden rectangles come from its own blocks and go into that row only, its response "
             f"starting at its own padding + prompt_lengths[b]; NOTES.md §2)")
        got_positions = pos[b].tolist()
        differ = [i for i, (g, e) in enumerate(zip(got_positions, TWO_ROWS_POSITIONS[b])) if g != e]
        assert got_positions == TWO_ROWS_POSITIONS[b], \
            (f"row {b} of a 2-row batch: position ids differ at columns {differ}\n  {where}\n  "
             f"expected\n  {TWO_ROWS_POSITIONS[b]}\n  got\n  {got_positions}\n  (the prompt "
             f"0..n-1 with n = prompt_lengths[{b}], the response from exercise 2 starting at n, "
             f"padding 0; NOTES.md §2)")
        for q in set(range(L)) - set(real):
            seen = (mask[b, 0, q] == 0).nonzero().flatten().tolist()
            assert seen == [q], f"{where}\n  padding query {q} sees {seen}, expected only itself"


# --------------------------------------------------------------------------------------------------
# Exercise 4: token_logprobs

@pytest.mark.exercise_4
def test_ex4_logprobs_by_hand():
    logits = torch.tensor([[[0.0, math.log(3.0)], [2.0, 2.0]]])          # (1, 2, V=2)
    tokens = torch.tensor([[1, 0]])
    got = token_logprobs(logits, tokens)
    expected = [math.log(3 / 4), math.log(1 / 2)]
    assert got.shape == (1, 2) and got.dtype == torch.float32, \
        f"expected shape (1, 2), dtype torch.float32, got {tuple(got.shape)}, {got.dtype}"
    assert got[0].tolist() == pytest.approx(expected, abs=1e-6), \
        (f"expected log-probs {expected}, got {got[0].tolist()}\n  logits {logits.tolist()}, "
         f"tokens {tokens.tolist()}")
    # logits / 0.5: softmax(0, 2 log 3) = 1/10, 9/10
    got_t = token_logprobs(logits, tokens, temperature=0.5)
    assert got_t[0].tolist() == pytest.approx([math.log(9 / 10), math.log(1 / 2)], abs=1e-6), \
        f"temperature 0.5 divides the logits before the log-softmax; got {got_t.tolist()}"
    assert token_logprobs(logits, tokens, temperature=0.0).tolist() == got.tolist(), \
        "temperature <= 0 counts as 1"
    half = token_logprobs(logits.to(torch.bfloat16), tokens)
    assert half.dtype == torch.float32, \
        f"bf16 logits give float32 log-probs (computed in float32), got {half.dtype}"


# --------------------------------------------------------------------------------------------------
# Exercise 5: policy_loss (NOTES.md §5)

@pytest.mark.exercise_5
def test_ex5_one_table_of_tokens():
    old = torch.zeros(1, 4)
    ratio = torch.tensor([[1.1, 1.5, 0.5, 5.0]])
    adv = torch.tensor([[1.0], ])                        # (B, 1): broadcast over the tokens
    loss, clipped, dual = policy_loss(ratio.log(), old, adv, 0.2, 0.28, 3.0)
    exp = [-1.1, -1.28, -0.5, -1.28]
    assert loss[0].tolist() == pytest.approx(exp, abs=1e-6), \
        (f"A = +1: expected loss {exp}, got {loss.tolist()}\n  ratios {ratio.tolist()}, "
         f"clip 0.2/0.28 (NOTES.md §5)")
    assert clipped[0].tolist() == [False, True, False, True] and not dual.any(), \
        (f"A = +1, ratios {ratio.tolist()}: expected clipped [False, True, False, True] and no "
         f"dual clip, got clipped {clipped.tolist()}, dual {dual.tolist()}")
    loss, clipped, dual = policy_loss(ratio.log(), old, -adv, 0.2, 0.28, 3.0)
    exp = [1.1, 1.5, 0.8, 3.0]
    assert loss[0].tolist() == pytest.approx(exp, abs=1e-6), \
        (f"A = -1: expected loss {exp}, got {loss.tolist()}\n  ratios {ratio.tolist()}: "
         f"clipped below at 0.8, dual clip at c|A| = 3 (NOTES.md §5)")
    assert clipped[0].tolist() == [False, False, True, False] and \
        dual[0].tolist() == [False, False, False, True], \
        (f"A = -1: expected clipped [False, False, True, False], dual [False, False, False, "
         f"True], got clipped {clipped.tolist()}, dual {dual.tolist()}")


# --------------------------------------------------------------------------------------------------
# Exercise 6: compute_advantages and loss_weights (NOTES.md §5)

@pytest.mark.exercise_6
def test_ex6_two_groups():
    adv, var = compute_advantages([1.0, -1.0, 1.0, 1.0], 2)
    exp = [1 / (math.sqrt(2) + 1e-6), -1 / (math.sqrt(2) + 1e-6), 0.0, 0.0]
    assert adv.tolist() == pytest.approx(exp, abs=1e-6), \
        (f"rewards [1, -1 | 1, 1], G = 2: expected advantages {exp}, got {adv.tolist()}\n  "
         f"(r - mean) / (unbiased std + 1e-6), equal groups exactly 0 (NOTES.md §5)")
    assert var.tolist() == [True, False] and adv.dtype == torch.float32, \
        (f"rewards [1, -1 | 1, 1], G = 2: expected has-variance [True, False] and float32 "
         f"advantages, got {var.tolist()}, {adv.dtype}")


@pytest.mark.exercise_6
def test_ex6_weights_and_denominators():
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    for mode, w_row0, d in [("token-mean", [1, 1, 0, 0], 6),
                            ("seq-mean-token-mean", [0.5, 0.5, 0, 0], 2),
                            ("seq-mean-token-sum-norm", [1, 1, 0, 0], 2 * 8)]:
        w, den = loss_weights(mask, mode, max_new_tokens=8)
        assert w[0].tolist() == pytest.approx(w_row0) and den == pytest.approx(d), \
            (f"{mode}: expected row-0 weights {w_row0}, denominator {d}; got {w[0].tolist()}, "
             f"{den}\n  loss mask {mask.tolist()}, max_new_tokens 8 (NOTES.md §5; a response "
             f"with no loss token is not counted)")
    assert agg_loss(torch.ones(3, 4), mask, "seq-mean-token-mean").item() == pytest.approx(1.0)


# --------------------------------------------------------------------------------------------------
# Exercise 7: pass_at_k (NOTES.md §7)

@pytest.mark.exercise_7
@pytest.mark.parametrize("n, c, k", [(4, 1, 2), (5, 2, 2), (16, 0, 4), (16, 16, 1), (3, 2, 2),
                                     (2000, 3, 1000)])
def test_ex7_against_the_binomials(n, c, k):
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)
    got = pass_at_k(n, c, k)
    assert got == pytest.approx(exact, abs=1e-12), \
        (f"n={n} responses, c={c} correct, k={k}: expected 1 - C(n-c, k) / "
         f"C(n, k) = {exact!r}, got {got!r} (NOTES.md §7)")


@pytest.mark.exercise_7
@pytest.mark.parametrize("n, c, k", [(2, 0, 5), (2, 2, 3), (4, 5, 2), (4, -1, 2), (4, 1, 0)])
def test_ex7_k_responses_cannot_be_drawn_from_fewer(n, c, k):
    """Pass@k draws k of the n responses without replacement: k > n (or c outside 0..n, or k < 1)
    has no value. The shortcut "n - c < k means 1.0" once said pass@5 = 100% for two responses
    that were both wrong."""
    call = f"pass_at_k(n={n}, c={c}, k={k})"
    try:
        got = pass_at_k(n, c, k)
    except ValueError as error:
        assert "pass@k" in str(error), \
            f"{call}: a ValueError whose message contains 'pass@k' (ASSIGNMENTS.md), got {error!r}"
        return
    pytest.fail(f"{call}: expected a ValueError (1 <= k <= n and 0 <= c <= n: NOTES.md §7), "
                f"got {got!r}", pytrace=False)


# --------------------------------------------------------------------------------------------------
# Exercise 8: RewardSchedule.kind_at and .reward (NOTES.md §4)

@pytest.mark.exercise_8
def test_ex8_s2_window_by_hand():
    got = [RewardSchedule("alternating").kind_at(t) for t in range(1, 13)]
    exp = ["accuracy"] * 8 + ["tiered"] * 2 + ["accuracy"] * 2
    i = first_difference(got, exp)
    assert got == exp, \
        f"S2 (window 10, 8 accuracy steps): step {i + 1} expected {item(exp, i)!r}, got " \
        f"{item(got, i)!r}\n  steps 1..12 expected {exp}\n  got {got} (NOTES.md §4)"
    r = [RewardSchedule("alternating").reward(9, correct=c, has_parallel=p, format_ok=f)
         for c, p, f in [(True, True, True), (True, False, True), (True, True, False),
                         (False, True, True)]]
    assert r == [1.2, 1.0, -1.0, -1.0], \
        f"tiered rewards at step 9 (correct/parallel/format): expected " \
        f"[1.2, 1.0, -1.0, -1.0], got {r} (NOTES.md §4)"


# --------------------------------------------------------------------------------------------------
# Exercise 9: the sampler: SlotCache.mask and Engine._close_block (NOTES.md §2-§3)

@pytest.mark.exercise_9
def test_ex9_decode_mask_from_the_slot_owners_by_hand():
    """One row: slots 0-1 the prompt (shared), 2 and 4 path 1's, 3 path 2's, 5 hidden; three
    queries: path 1's, path 2's and a main-chain one."""
    cache = SlotCache(rows=1, capacity=8, device="cpu")
    path_1 = FIRST_PATH_OWNER
    path_2 = FIRST_PATH_OWNER + 1
    cache.owner[0, :6] = torch.tensor([SHARED, SHARED, path_1, path_2, path_1, HIDDEN])
    cache.attend_to(6)
    codes = torch.tensor([[path_1, path_2, SHARED]])
    mask = cache.mask(codes, torch.float32)
    assert mask.shape == (1, 1, 3, 6) and mask.dtype == torch.float32, \
        mask_type(mask, (1, 1, 3, 6))
    low = torch.finfo(torch.float32).min
    assert set(mask.unique().tolist()) <= {0.0, low}, \
        "additive: 0 where visible, finfo(dtype).min where hidden (never -inf, never bool)"
    seen = (mask[0, 0] == 0).int().tolist()
    expected = [[1, 1, 1, 0, 1, 0],       # path 1: the prompt and its own slots
                [1, 1, 0, 1, 0, 0],       # path 2: the prompt and its own slot
                [1, 1, 0, 0, 0, 0]]       # the main chain: the shared slots only
    q = first_difference(seen, expected)
    assert seen == expected, \
        f"query {q} expected to see (1) {item(expected, q)}, got {item(seen, q)}\n  " \
        f"owners {cache.owner[0, :6].tolist()}, query codes " \
        f"{codes[0].tolist()}: visible (1) expected\n  {expected}\n  got\n  {seen} " \
        f"(NOTES.md §2-§3)"
    assert (cache.mask(codes, torch.bfloat16) == torch.finfo(torch.bfloat16).min).any(), \
        "the hidden value is finfo(dtype).min of the dtype asked for"


@pytest.mark.exercise_9
def test_ex9_decode_mask_reads_each_rows_own_owners():
    """Two rows (two samples) whose slots have different owners: each query reads its own row.
    Row 0: slot 2 is path 1's, slot 3 path 2's; row 1: the other way round."""
    cache = SlotCache(rows=2, capacity=6, device="cpu")
    path_1 = FIRST_PATH_OWNER
    path_2 = FIRST_PATH_OWNER + 1
    cache.owner[0, :4] = torch.tensor([SHARED, SHARED, path_1, path_2])
    cache.owner[1, :4] = torch.tensor([SHARED, SHARED, path_2, path_1])
    cache.attend_to(4)
    codes = torch.tensor([[path_1, SHARED], [path_1, SHARED]])
    seen = (cache.mask(codes, torch.float32)[:, 0] == 0).int().tolist()
    expected = [[[1, 1, 1, 0], [1, 1, 0, 0]],          # row 0: path 1 owns slot 2
                [[1, 1, 0, 1], [1, 1, 0, 0]]]          # row 1: path 1 owns slot 3
    row = first_difference(seen, expected)
    assert seen == expected, \
        f"row {row}: expected visible (1) {item(expected, row)}, got {item(seen, row)}\n  " \
        f"owners {cache.owner[:, :4].tolist()}, query codes {codes.tolist()}: visible (1) " \
        f"expected per row\n  {expected}\n  got\n  {seen} (each row's queries read that row's " \
        f"owners; NOTES.md §2-§3)"


def tiny_engine(rows: int):
    """An Unseen engine on the tiny model with an empty `rows`-row cache, and its tokenizer."""
    model, tok = load_model("tiny", seed=0)
    tags = TagIds.from_tokenizer(tok)
    engine = Engine(model, tags, "unseen", SamplingConfig(max_new_tokens=40), tok.pad_token_id)
    engine.cache = SlotCache(rows=rows, capacity=16, device="cpu")
    return engine, tok


def two_path_block(tok, tags):
    """The cache owners and a Sample of test_ex9_closing_a_block_by_hand: prompt and <Parallel>
    in slots 0-3 (p = 3), path 1 (<A> 7 </A>) in slots 4-6, path 2 (<A> 8 9 </A>) in 7-10."""
    path_1 = FIRST_PATH_OWNER
    path_2 = FIRST_PATH_OWNER + 1
    owners = [SHARED] * 4 + [path_1] * 3 + [path_2] * 4
    seven, eight, nine = (tok.convert_tokens_to_ids(c) for c in "789")
    none = (False,) * len(tags.maskable)     # a token's record: (token, sampled, logprob, banned)
    first = [(tags.path, 0, 0.0, none), (seven, 1, -1.0, none), (tags.end_path, 1, -0.25, none)]
    second = [(tags.path, 0, 0.0, none), (eight, 1, -2.0, none), (nine, 1, -0.5, none),
              (tags.end_path, 1, -0.75, none)]
    main = Stream(MAIN, position=4, tokens=[(tags.parallel, 1, -0.5, none)])   # <Parallel> fed
    paths = [Stream(PATH, position=7, owner=path_1, tokens=list(first), path_len=3),
             Stream(PATH, position=8, owner=path_2, tokens=list(second), path_len=4)]
    return owners, Sample(0, [11, 12, 13], main, paths=paths, tokens_spent=8, steps_spent=1)


@pytest.mark.exercise_9
def test_ex9_closing_a_block_changes_only_its_own_cache_row():
    """Two samples, each in the middle of a block, in rows 0 and 1: closing the block of the
    sample in row 1 shares row 1's path slots and leaves row 0's owners as they were (its paths
    are still open: they must not see each other)."""
    engine, tok = tiny_engine(rows=2)
    owners, other = two_path_block(tok, engine.tags)
    owners_1, s = two_path_block(tok, engine.tags)
    engine.cache.owner[0, :11] = torch.tensor(owners)
    engine.cache.owner[1, :11] = torch.tensor(owners_1)
    engine.rows = [other, s]
    engine._close_block(s)
    got = engine.cache.owner[:, :11].tolist()
    expected = [owners, [SHARED] * 11]
    row = first_difference(got, expected)
    assert got == expected, \
        f"after closing the block of the sample in row 1 (self.rows.index(s)): row {row}'s " \
        f"owners expected {item(expected, row)}, got {item(got, row)}\n  expected " \
        f"{expected}\n  got      {got}"


@pytest.mark.exercise_9
def test_ex9_closing_a_block_by_hand():
    """A sample whose prompt and <Parallel> fill slots 0-3 (p = 3), then path 1 (<A> 7 </A>,
    slots 4-6) and path 2 (<A> 8 9 </A>, slots 7-10); both have fed their </Path>."""
    engine, tok = tiny_engine(rows=1)
    tags = engine.tags
    owners, s = two_path_block(tok, tags)
    engine.cache.owner[0, :11] = torch.tensor(owners)
    main = s.main
    parallel = main.tokens[0]
    first = list(s.paths[0].tokens)
    second = list(s.paths[1].tokens)
    engine.rows = [s]
    engine._close_block(s)
    assert engine.cache.owner[0, :12].tolist() == [SHARED] * 11 + [HIDDEN], \
        f"owners: expected {[SHARED] * 11 + [HIDDEN]} (every path slot becomes SHARED, " \
        f"nothing else changes), got {engine.cache.owner[0, :12].tolist()}"
    expected = [parallel, *first, *second, (tags.end_parallel, 0, 0.0,
                                                 (False,) * len(tags.maskable))]
    assert main.tokens == expected, \
        f"the response: expected <Parallel>, path 1, path 2, then an injected </Parallel> " \
        f"({len(expected)} tokens), got {len(main.tokens)} tokens\n  expected " \
        f"{expected}\n  got {main.tokens}"
    assert main.position == 4 + 4, \
        f"the main chain's position: expected 8 (</Parallel> sits at p + longest + 1 = 3 + 4 + " \
        f"1), got {main.position}"
    assert (s.steps_spent, s.tokens_spent) == (1 + 4 + 1, 8 + 1), \
        f"(steps_spent, tokens_spent): expected (6, 9) (decode steps: 1 + the longest path " \
        f"(4) + </Parallel>; tokens: 8 + 1), got {(s.steps_spent, s.tokens_spent)}"
    assert s.paths == [] and main.feed == tags.end_parallel and main.segment == SUMMARY, \
        (f"expected no open paths, the main chain feeding </Parallel> ({tags.end_parallel}) in "
         f"segment {SUMMARY!r}, got {len(s.paths)} paths, feed {main.feed}, segment "
         f"{main.segment!r}")
    assert main.forced == [*tags.newline, tags.summary], \
        f"forced: expected {[*tags.newline, tags.summary]} (after </Parallel> the runtime " \
        f"forces the newline and <Summary>), got {main.forced}"
