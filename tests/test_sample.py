"""The branching sampler: its recorded log-probs equal one training forward, budgets hold, nothing
crashes."""

import itertools
import os
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

import sample
from attention import TagIds, parse_structure, structured_forward, token_logprobs
from model import add_parallel_tags, build_char_tokenizer, tiny_tokenizer
from sample import generate
from scripts.bench.bench_sample import TagBias

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROMPTS = ["Ava has 3 boxes of 7 pens.", "Hi", "Bob has 12 pens and 5 cups; how many?"]


def tiny(attn="sdpa", seed=0):
    tok = build_char_tokenizer()
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      intermediate_size=128, max_position_embeddings=512, tie_word_embeddings=True,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    model = Qwen3ForCausalLM._from_config(cfg, attn_implementation=attn, dtype=torch.float32)
    add_parallel_tags(model, tok)
    return model.eval(), tok


def biased(model, tok, strength=3.0):
    tags = TagIds.from_tokenizer(tok)
    bias = torch.zeros(model.get_output_embeddings().weight.shape[0])
    bias[[tags.parallel, tags.end_path, tags.end_summary]] = strength
    bias[tags.eos] = strength / 3
    return TagBias(model, bias).eval()


@pytest.fixture(scope="module")
def models():
    model, tok = tiny()
    return model, biased(model, tok), tok


LOGPROB_TOLERANCE = 1e-4     # fp32: the sampler's and the training forward's agree to ~1e-6


def where_in_response(structure, j: int) -> str:
    """Which part of a response token j is in: "path k of block b", "summary of block b", "block
    b (between its paths or its tags)" or "main chain" (blocks and paths counted from 1)."""
    for b, block in enumerate(structure.blocks, 1):
        for k, (start, end) in enumerate(block.paths, 1):
            if start <= j < end:
                return f"path {k} of block {b}"
        if block.summary and block.summary[0] <= j < block.summary[1]:
            return f"summary of block {b}"
        last = block.end
        if last is None:                               # cut off inside the block
            last = max([block.start] + [end - 1 for _, end in block.paths])
        if block.start < j <= last:
            return f"block {b} (between its paths or its tags)"
    return "main chain"


def bans_by_the_rules(r, tags: TagIds, j: int, mode: str, max_blocks: int = 4) -> set[int]:
    """What the runtime masks at the draw of response token j, from the response alone: a path
    may write only its </Path> (not as its first token, nor EOS then), a summary only its
    </Summary>, the main chain only <Parallel> (none after max_blocks blocks); "sequential"
    (generate's default allow_parallel) nothing."""
    if mode == "sequential":
        return set()
    where = where_in_response(r.structure, j)
    if where.startswith("path"):
        banned = tags.structural - {tags.end_path}
        if r.response_ids[j - 1] == tags.path:
            banned = banned | {tags.end_path, tags.eos}
        return banned
    if where.startswith("summary"):
        return tags.structural - {tags.end_summary}
    assert where == "main chain", f"token {j} is sampled {where}: the runtime injects those"
    opened = sum(block.start < j for block in r.structure.blocks)
    if opened >= max_blocks:
        return set(tags.structural)
    return tags.structural - {tags.parallel}


def max_logprob_diff(model, tok, rollouts, mode, temperature, max_blocks: int = 4,
                     top_k: int = 0, top_p: float = 1.0):
    """Max |recorded - training forward| log-prob over every sampled token of every rollout,
    the forward's softmax without the tokens the runtime masks there (`bans_by_the_rules`; the
    rollout's record of them is checked against the rules too); a difference above
    LOGPROB_TOLERANCE fails the test with where the first one is (sample, token, path / summary
    / main chain, recorded against recomputed: the message's first line) and how many there are.
    top_k, top_p: what the rollouts were sampled with (for the message only)."""
    tags = TagIds.from_tokenizer(tok)
    seqs = [r.prompt_ids + r.response_ids for r in rollouts]
    L = max(map(len, seqs))
    ids = torch.full((len(seqs), L), tok.pad_token_id)
    am = torch.zeros(len(seqs), L, dtype=torch.long)
    for i, s in enumerate(seqs):                       # right padding
        ids[i, :len(s)] = torch.tensor(s)
        am[i, :len(s)] = 1
    with torch.no_grad():
        logits = structured_forward(model, ids, am, [len(r.prompt_ids) for r in rollouts], tags,
                                    mode)
    worst, checked = 0.0, 0
    mismatches = []                                    # (sample, token, recorded, recomputed)
    for i, r in enumerate(rollouts):
        n, R = len(r.prompt_ids), len(r.response_ids)
        row_logits = logits[i, n - 1:n + R - 1].clone()
        for j in range(R):
            if r.sampled_mask[j]:
                banned = bans_by_the_rules(r, tags, j, mode, max_blocks)
                recorded_bans = {t for t, b in zip(tags.maskable, r.banned[j]) if b}
                assert recorded_bans == banned, f"sample {i}, token {j}: masked {recorded_bans}"
                row_logits[j, sorted(banned)] = float("-inf")
        lp = token_logprobs(row_logits, torch.tensor(r.response_ids), temperature)
        for j in range(R):
            if r.sampled_mask[j]:
                recomputed = lp[j].item()
                difference = abs(recomputed - r.logprobs[j])
                worst = max(worst, difference)
                checked += 1
                if difference > LOGPROB_TOLERANCE:
                    mismatches.append((i, j, r.logprobs[j], recomputed))
            else:
                assert r.logprobs[j] == 0.0, \
                    f"sample {i}, token {j}: injected by the runtime, its log-prob must be 0.0"
    assert checked > 0
    if mismatches:
        i, j, recorded, recomputed = mismatches[0]
        r = rollouts[i]
        samples_off = sorted({m[0] for m in mismatches})
        filters = ""
        if top_k or top_p < 1.0:
            filters = f", top_k {top_k}, top_p {top_p}"
        pytest.fail(
            f"sample {i} (prompt {r.prompt_index}), response token {j} "
            f"{tok.decode([r.response_ids[j]])!r} in the {where_in_response(r.structure, j)}: "
            f"recorded log-prob {recorded:.4f}, the training forward's {recomputed:.4f} (the "
            f"first of {len(mismatches)} of {checked} sampled tokens that differ by more than "
            f"{LOGPROB_TOLERANCE}, in samples {samples_off} of 0..{len(rollouts) - 1}; worst "
            f"{worst:.4f}; mode {mode}, T = {temperature}{filters})\n"
            f"Its response: {tok.decode(r.response_ids)!r}\n"
            "Where to look. Exercises 1-4 first: a bug there shows here too, and their own "
            "tests say where (python scripts/kit/grade.py 1 2 3 4). Then: wrong in a path only: "
            "the "
            "decode mask (exercise 9) or the Unseen training mask (exercise 3); after a block "
            "only (summary, main chain): the positions (</Parallel> at p + longest + 1: "
            "exercises 2, 9); in some samples while others match: one row's training mask or "
            "positions built from another row's (exercise 3: each row its own prompt length and "
            "blocks); at every token: token_logprobs (exercise 4), or, under top-k/top-p only, "
            "the log-prob taken after the filters (sample.py records it before them).",
            pytrace=False)
    return worst


@pytest.mark.parametrize("mode", ["unseen", "seen"])
@pytest.mark.parametrize("num_paths", [2, 3])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_recorded_logprobs_equal_training_forward(models, mode, num_paths, temperature):
    _, model, tok = models
    rollouts = generate(model, tok, PROMPTS, group_size=3, mode=mode, max_new_tokens=90,
                        max_path_tokens=12, num_paths=num_paths, temperature=temperature, seed=7)
    # the batch really exercises the structure: several blocks, N paths each, truncations
    blocks = [b for r in rollouts for b in r.structure.blocks]
    assert sum(len(r.structure.blocks) >= 2 for r in rollouts) >= 2
    assert any(len(b.paths) == num_paths and b.summary for b in blocks)
    assert max_logprob_diff(model, tok, rollouts, mode, temperature) <= 1e-4


TOP_P = 0.9
TOP_K = 10


@pytest.mark.parametrize("mode", ["unseen", "seen"])
def test_recorded_logprobs_are_taken_before_top_k_and_top_p(models, mode):
    """Under top-k and top-p the token is drawn from the filtered softmax, but the recorded
    log-prob is the one of the softmax before the filters (tags masked, temperature applied):
    the training forward knows no top-k or top-p, so a log-prob taken after them makes every
    ratio start away from 1. The tiny random model's softmax is flat over ~100 tokens, so top-k
    cuts it at every draw: a log-prob recorded after the filters differs at every token."""
    _, model, tok = models
    temperature = 0.7
    rollouts = generate(model, tok, PROMPTS, group_size=3, mode=mode, max_new_tokens=90,
                        max_path_tokens=12, temperature=temperature, top_p=TOP_P, top_k=TOP_K,
                        seed=7)
    assert sum(len(r.structure.blocks) >= 1 for r in rollouts) >= 2
    worst = max_logprob_diff(model, tok, rollouts, mode, temperature, top_k=TOP_K, top_p=TOP_P)
    assert worst <= LOGPROB_TOLERANCE


@pytest.mark.parametrize("mode", ["unseen", "seen", "sequential"])
def test_same_seed_same_samples(models, mode):
    _, model, tok = models
    a = generate(model, tok, PROMPTS, group_size=2, mode=mode, max_new_tokens=40, seed=3)
    b = generate(model, tok, PROMPTS, group_size=2, mode=mode, max_new_tokens=40, seed=3)
    c = generate(model, tok, PROMPTS, group_size=2, mode=mode, max_new_tokens=40, seed=4)
    assert [r.response_ids for r in a] == [r.response_ids for r in b]
    assert [r.logprobs for r in a] == [r.logprobs for r in b]
    assert [r.response_ids for r in a] != [r.response_ids for r in c]


def test_greedy_sequential_equals_plain_greedy_loop(models):
    model, _, tok = models
    budget = 25
    rollouts = generate(model, tok, PROMPTS, mode="sequential", greedy=True, max_new_tokens=budget)
    for r, p in zip(rollouts, PROMPTS):
        ids = tok.encode(p, add_special_tokens=False)
        out = []
        with torch.no_grad():
            while len(out) < budget:                 # no cache, no mask: the textbook loop
                nxt = model(input_ids=torch.tensor([ids + out])).logits[0, -1].argmax().item()
                out.append(nxt)
                if nxt == tok.eos_token_id:
                    break
        assert r.response_ids == out


def test_unseen_paths_share_the_prefix_and_positions(models):
    """Greedy Unseen with identical paths: every path of a block is the same text (same context,
    same positions), and the summary follows at p + longest + 1 -- checked through the training
    forward."""
    _, model, tok = models
    rollouts = generate(model, tok, PROMPTS, mode="unseen", greedy=True, max_new_tokens=80,
                        max_path_tokens=10)
    some = False
    for r in rollouts:
        for b in r.structure.blocks:
            texts = [r.response_ids[s:e] for s, e in b.paths]
            if b.end is not None:
                some = True
                assert all(t == texts[0] for t in texts), \
                    "greedy paths from one prefix must be identical"
    assert some
    assert max_logprob_diff(model, tok, rollouts, "unseen", 1.0) <= 1e-4


@pytest.mark.parametrize("mode", ["unseen", "seen"])
def test_budgets_hold_and_truncated_responses_still_match(models, mode):
    _, model, tok = models
    tags = TagIds.from_tokenizer(tok)
    for budget, path_budget, max_blocks in [(15, 6, 4), (40, 4, 1), (70, 9, 2)]:
        rollouts = generate(model, tok, PROMPTS, group_size=4, mode=mode, max_new_tokens=budget,
                            max_path_tokens=path_budget, max_blocks=max_blocks, seed=budget)
        for r in rollouts:
            assert r.num_tokens == len(r.response_ids) <= budget
            st = parse_structure(r.response_ids, tags)
            assert st.blocks == r.structure.blocks
            assert len(st.blocks) <= max_blocks
            for b in st.blocks:
                assert len(b.paths) <= 2 if b.end is None else len(b.paths) == 2
                assert all(e - s <= path_budget for s, e in b.paths)
            if r.finish_reason == "eos":
                assert r.response_ids[-1] == tags.eos
        assert any(r.finish_reason == "budget" for r in rollouts)
        assert max_logprob_diff(model, tok, rollouts, mode, 1.0, max_blocks) <= 1e-4


def test_max_blocks_masks_parallel_so_the_answer_can_follow(models):
    _, model, tok = models
    rollouts = generate(model, tok, PROMPTS, group_size=4, mode="unseen", max_new_tokens=150,
                        max_path_tokens=6, max_blocks=1, seed=1)
    assert all(len(r.structure.blocks) <= 1 for r in rollouts)
    assert any(len(r.structure.blocks) == 1 and r.structure.blocks[0].summary
               and r.structure.blocks[0].summary[1] < r.num_tokens - 1 for r in rollouts)


@pytest.mark.parametrize("mode,budget", [("unseen", "tokens"), ("unseen", "steps"),
                                         ("seen", "tokens")])
def test_open_block_forces_a_block_the_runtime_injects(models, mode, budget):
    """open_block=True (the forced-block arm of scripts/choice.sh): every response opens with an
    injected <Parallel> (not sampled, log-prob 0.0, so not trained by default), its paths follow,
    and every sampled token still has the training forward's log-prob. The plain tiny model
    (which rarely opens a block itself) without it opens fewer."""
    model, _, tok = models
    tags = TagIds.from_tokenizer(tok)
    settings = dict(group_size=3, mode=mode, max_new_tokens=40, max_path_tokens=8,
                    budget=budget, seed=3)
    rollouts = generate(model, tok, PROMPTS, open_block=True, **settings)
    assert all(r.response_ids[0] == tags.parallel for r in rollouts)
    assert all(r.sampled_mask[0] == 0 and r.logprobs[0] == 0.0 for r in rollouts)
    assert all(r.structure.blocks and r.structure.blocks[0].start == 0 for r in rollouts)
    assert max_logprob_diff(model, tok, rollouts, mode, 1.0) <= LOGPROB_TOLERANCE
    free = generate(model, tok, PROMPTS, **settings)
    assert sum(bool(r.structure.blocks) for r in free) < len(free)
    with pytest.raises(ValueError, match="open_block=True forces a block"):
        generate(model, tok, PROMPTS[:1], max_new_tokens=4, open_block=True, max_blocks=0)


def test_a_sampled_end_path_at_the_path_budget_is_kept_as_sampled(models):
    """max_path_tokens=3 holds <Path>, one token and </Path>: a </Path> the model samples in the
    last place fits (the place was kept free for it), so it is recorded as sampled, with its
    log-prob, and trained; only a path that is still open there gets an injected one."""
    model, _, tok = models
    tags = TagIds.from_tokenizer(tok)
    wants_end_path = biased(model, tok, strength=50.0)      # </Path> whenever it is allowed
    rollouts = generate(wants_end_path, tok, PROMPTS[:2], group_size=2, mode="unseen",
                        max_new_tokens=40, max_path_tokens=3, max_blocks=1, seed=0)
    closings = [(r, end - 1) for r in rollouts for block in r.structure.blocks
                for _, end in block.paths]
    assert closings and all(r.response_ids[i] == tags.end_path for r, i in closings)
    assert all(r.sampled_mask[i] == 1 for r, i in closings)
    others = tuple(t in tags.structural and t != tags.end_path for t in tags.maskable)
    assert all(r.banned[i] == others for r, i in closings)   # drawn with the other tags masked


@pytest.mark.parametrize("kw", [dict(num_paths=1), dict(max_blocks=-1), dict(temperature=-0.5),
                                dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5)])
def test_settings_out_of_range_are_refused(models, kw):
    """Each of these once sampled anyway (top_p=0 greedily, max_blocks=-1 as 0, top_k=-1 as off)."""
    _, model, tok = models
    name, value = next(iter(kw.items()))
    with pytest.raises(ValueError, match=f"{name}={value}"):
        generate(model, tok, PROMPTS[:1], max_new_tokens=4, **kw)


def test_critical_path(models):
    """D = T - sum over blocks of (sum of path lengths - longest path) in Unseen; D = T in Seen."""
    _, model, tok = models
    for mode in ("unseen", "seen"):
        for r in generate(model, tok, PROMPTS, group_size=3, mode=mode, max_new_tokens=80,
                          max_path_tokens=12, seed=5):
            saved = sum(sum(e - s for s, e in b.paths) - max(e - s for s, e in b.paths)
                        for b in r.structure.blocks if b.paths)
            assert r.critical_path == (r.num_tokens - saved if mode == "unseen" else r.num_tokens)


@pytest.mark.parametrize("strength", [0.0, 3.0, 8.0])
def test_fuzz_never_crashes_hangs_or_overruns(strength):
    """Random weights, and logits that favour tags heavily: over many seeds the sampler always
    returns, stays within every budget, and each response parses into exactly the spans it was
    sampled with."""
    model, tok = tiny(seed=1)
    model = biased(model, tok, strength)
    tags = TagIds.from_tokenizer(tok)
    for seed in range(12):
        mode = ("unseen", "seen", "sequential")[seed % 3]
        rollouts = generate(model, tok, PROMPTS[: 1 + seed % 3], group_size=2, mode=mode,
                            max_new_tokens=30, max_path_tokens=5, num_paths=2 + seed % 2,
                            max_blocks=1 + seed % 3,
                            temperature=(1.0, 2.0, 0.5)[seed % 3], top_p=(1.0, 0.9)[seed % 2],
                            top_k=(0, 10)[seed % 2], seed=seed)
        for r in rollouts:
            assert len(r.response_ids) <= 30
            assert len(r.sampled_mask) == len(r.logprobs) == len(r.response_ids)
            if mode != "sequential":
                assert len(r.structure.blocks) <= 1 + seed % 3
                assert all(e - s <= 5 for b in r.structure.blocks for s, e in b.paths)
            assert parse_structure(r.response_ids, tags).blocks == r.structure.blocks


class EndPathAfter(torch.nn.Module):
    """TagBias, plus a strong </Path> right after one trigger token: a path that samples the trigger
    closes at once, the others run to max_path_tokens. The bias depends only on the input token, so
    the training forward sees it too."""

    def __init__(self, inner, tok, trigger):
        super().__init__()
        self.inner = inner
        self.trigger = trigger
        self.end_path = TagIds.from_tokenizer(tok).end_path

    def forward(self, **kw):
        out = self.inner(**kw)
        ids = kw["input_ids"][:, -out.logits.shape[1]:]     # the prefill keeps the last logits only
        out.logits[..., self.end_path] += 40.0 * (ids == self.trigger)
        return out

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()


@pytest.mark.parametrize("mode", ["unseen", "seen"])
def test_three_paths_of_very_different_lengths(models, mode):
    """One path closes after a token or two while a sibling runs to max_path_tokens: each path keeps
    its own positions (p+1, p+2, ...) and its own context, checked through the training forward."""
    model, _, tok = models
    tags = TagIds.from_tokenizer(tok)
    bias = torch.zeros(model.get_output_embeddings().weight.shape[0])
    bias[tags.parallel], bias[tags.end_path], bias[tags.end_summary] = 4.0, -30.0, 3.0
    trigger = tok.convert_tokens_to_ids("e")
    bias[trigger] = 2.5                            # some paths sample the trigger early, some never
    wrapped = EndPathAfter(TagBias(model, bias), tok, trigger).eval()
    rollouts = generate(wrapped, tok, PROMPTS, group_size=4, mode=mode, max_new_tokens=120,
                        max_path_tokens=20, num_paths=3, max_blocks=2, seed=12)
    lens = [[e - s for s, e in b.paths] for r in rollouts for b in r.structure.blocks
            if b.end is not None]
    assert all(len(x) == 3 for x in lens)
    assert any(min(x) <= 4 and max(x) == 20 for x in lens), lens
    # also when the first path is the longest
    assert any(x[0] == 20 and min(x[1:]) <= 4 for x in lens), lens
    assert max_logprob_diff(wrapped, tok, rollouts, mode, 1.0, max_blocks=2) <= 1e-4


@pytest.mark.parametrize("mode", ["unseen", "seen"])
def test_block_cut_by_the_budget_parses_into_its_spans(models, mode):
    """The budget runs out while N paths are open: each gets its reserved </Path> injected, the
    response has exactly max_new_tokens tokens and parses into the spans it was sampled with;
    log-probs exact."""
    model, _, tok = models
    tags = TagIds.from_tokenizer(tok)
    bias = torch.zeros(model.get_output_embeddings().weight.shape[0])
    bias[tags.parallel], bias[tags.end_path], bias[tags.eos] = 6.0, -30.0, -30.0
    wrapped = TagBias(model, bias).eval()
    # 9: often no room to open the block
    for budget, n, min_cut in [(25, 3, 3), (32, 2, 3), (9, 3, 0)]:
        rollouts = generate(wrapped, tok, PROMPTS, group_size=2, mode=mode, max_new_tokens=budget,
                            num_paths=n, seed=budget)
        cut = 0
        for r in rollouts:
            last = r.structure.blocks[-1]
            assert r.finish_reason == "budget"
            assert parse_structure(r.response_ids, tags).blocks == r.structure.blocks
            # no room for N x <Path></Path>: it ends at <Parallel>
            if not last.paths:
                assert r.response_ids[-1] == tags.parallel
                assert budget - r.num_tokens < 2 * (n if mode == "unseen" else 1)
                continue
            assert r.num_tokens == budget
            if last.end is None:                       # cut inside the block
                cut += 1
                _, e = last.paths[-1]
                assert e == budget and r.response_ids[e - 1] == tags.end_path
                assert r.sampled_mask[e - 1] == 0
                if mode == "unseen":         # every path was open: each ends in an injected </Path>
                    assert len(last.paths) == n
                    assert all(r.response_ids[e - 1] == tags.end_path and r.sampled_mask[e - 1] == 0
                               for s, e in last.paths)
        assert cut >= min_cut
        assert max_logprob_diff(wrapped, tok, rollouts, mode, 1.0) <= 1e-4


@pytest.mark.parametrize("mode", ["unseen", "seen", "sequential"])
def test_finished_rows_leave_the_batch_and_the_rest_stay_exact(models, mode, monkeypatch):
    """Responses of very different lengths in one batch: once half the rows are done the cache
    drops them (SlotCache.keep_rows), and the rows that go on decoding stay exact."""
    import sample

    model, _, tok = models
    tags = TagIds.from_tokenizer(tok)
    bias = torch.zeros(model.get_output_embeddings().weight.shape[0])
    bias[tags.parallel] = 2.0
    bias[tags.end_path] = 1.0
    bias[tags.end_summary] = 3.0
    bias[tags.eos] = 1.5
    wrapped = TagBias(model, bias).eval()
    sizes, keep_rows = [], sample.SlotCache.keep_rows

    def spy(self, rows):
        sizes.append(len(rows))
        return keep_rows(self, rows)

    monkeypatch.setattr(sample.SlotCache, "keep_rows", spy)
    rollouts = generate(wrapped, tok, PROMPTS, group_size=4, mode=mode, max_new_tokens=100,
                        max_path_tokens=8, seed=2)
    lengths = sorted(r.num_tokens for r in rollouts)
    assert len(sizes) >= 2 and sizes[0] <= 6, sizes               # at least two compactions
    assert all(b < a for a, b in itertools.pairwise(sizes))
    assert lengths[0] * 4 < lengths[-1], lengths
    assert max_logprob_diff(wrapped, tok, rollouts, mode, 1.0) <= 1e-4


@pytest.mark.parametrize("mode", ["unseen", "seen", "sequential"])
def test_samples_done_at_the_first_token(models, mode):
    """Budgets of 0 and 1 token, and an EOS first: every row is done before the first decode
    step."""
    model, _, tok = models
    assert all(r.response_ids == [] and r.finish_reason == "budget"
               for r in generate(model, tok, PROMPTS, group_size=2, mode=mode, max_new_tokens=0,
                                 seed=0))
    assert all(r.num_tokens == 1
               for r in generate(model, tok, PROMPTS, group_size=2, mode=mode, max_new_tokens=1))
    bias = torch.zeros(model.get_output_embeddings().weight.shape[0])
    bias[tok.eos_token_id] = 50.0
    assert all(r.response_ids == [tok.eos_token_id] and r.finish_reason == "eos"
               for r in generate(TagBias(model, bias), tok, PROMPTS, mode=mode, max_new_tokens=10,
                                 seed=0))


def test_layout_puts_each_path_on_its_own_line():
    from sample import Rollout, layout
    _, tok = tiny()
    text = ("6+3=9\n<Parallel><Path>2+5=7\nno</Path><Path>5+3=8</Path></Parallel>\n"
            "<Summary>5, 3</Summary>\nFinal Answer: 5, 3")
    ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
    st = parse_structure(ids, TagIds.from_tokenizer(tok))
    r = Rollout(0, [], ids, [1] * len(ids), [0.0] * len(ids), st, len(ids), len(ids), "eos")
    assert layout(r, tok) == ("6+3=9\n<Parallel>\n    <Path> 2+5=7\\nno\n    <Path> 5+3=8\n"
                              "<Summary> 5, 3\nFinal Answer: 5, 3")
    # cut inside the block
    cut = tok.encode("a<Parallel><Path>x</Path><Path>y", add_special_tokens=False)
    r = Rollout(0, [], cut, [1] * len(cut), [0.0] * len(cut),
                parse_structure(cut, TagIds.from_tokenizer(tok)), len(cut), len(cut), "budget")
    assert layout(r, tok) == "a\n<Parallel>\n    <Path> x\n    <Path> y"


def test_sample_cli_prints_the_responses(capsys):
    import sample
    sample.main(["--model=tiny", "--n=2", "--max_new_tokens=12", "--mode=unseen"])
    out = capsys.readouterr().out
    assert out.count("=== ") == 3 and out.count("--- sample ") == 6 and "mode unseen" in out
    # once sampled past it silently
    too_long = "^a 4-token prompt \\+ --max_new_tokens=1000 is more than the model's"
    with pytest.raises(ValueError, match=too_long):
        sample.main(["--model=tiny", "--prompt=9999", "--max_new_tokens=1000"])
    with pytest.raises(ValueError, match="^--n=0: must be at least 1$"):
        sample.main(["--model=tiny", "--n=0"])
    # --mode=sequential sampled <Parallel> blocks (eval.py masks them)
    calls = []
    real = sample.generate

    def recording_generate(*a, **kw):
        calls.append(kw)
        return real(*a, **kw)

    sample.generate = recording_generate
    try:
        sample.main(["--model=tiny", "--n=1", "--max_new_tokens=4", "--mode=sequential"])
    finally:
        sample.generate = real
    assert calls[0]["sampling"].allow_parallel is False


@pytest.mark.parametrize("mode", ["unseen", "seen"])
def test_no_empty_path_even_when_the_logits_want_one(models, mode):
    """</Path> (and EOS, which would inject it) is banned as a path's first token (NOTES.md §4):
    with logits that favour </Path> strongly every path still holds a token; the recorded log-probs
    are those of the softmax it was drawn from (the masked tokens left out)."""
    model, _, tok = models
    tags = TagIds.from_tokenizer(tok)
    bias = torch.zeros(model.get_output_embeddings().weight.shape[0])
    bias[tags.parallel] = 6.0
    bias[tags.end_path] = 30.0
    bias[tags.end_summary] = 3.0
    bias[tags.eos] = 1.0
    wrapped = TagBias(model, bias).eval()
    rollouts = generate(wrapped, tok, PROMPTS, group_size=3, mode=mode, max_new_tokens=150,
                        num_paths=3, seed=3)
    spans = [e - s for r in rollouts for b in r.structure.blocks for s, e in b.paths]
    assert len(spans) >= 9 and min(spans) == 3            # <Path> x </Path>: one token, never zero
    assert all("empty" not in r.structure.reason for r in rollouts)
    assert max_logprob_diff(wrapped, tok, rollouts, mode, 1.0) <= 1e-4


def test_the_contract_with_transformers_that_slot_cache_relies_on(models):
    """SlotCache works because the model (transformers as pinned in requirements.txt) takes
    `cache=`, a 4D additive mask as it is, explicit position_ids and logits_to_keep, and each
    attention layer calls cache.update(key, value, layer_idx) once per forward, in layer order,
    with its new keys (rows, kv_heads, q, head_dim); nothing else of the cache is read. An upgrade
    that changes this fails here, by name, before the log-prob tests fail without one."""
    model, _, _ = models
    with open(os.path.join(ROOT, "requirements.txt")) as f:
        assert "transformers==5.24.0" in f.read().split()     # the version this was checked on
    updates = []
    read_from_outside = []

    class Spy(sample.SlotCache):
        inside = True                                    # our own set-up is not the model's

        def __getattribute__(self, name):
            if not object.__getattribute__(self, "inside"):
                read_from_outside.append(name)
            return object.__getattribute__(self, name)

        def update(self, key, value, layer_idx, *args, **kwargs):
            updates.append((layer_idx, tuple(key.shape)))
            object.__setattr__(self, "inside", True)
            try:
                return super().update(key, value, layer_idx, *args, **kwargs)
            finally:
                object.__setattr__(self, "inside", False)

    rows = 2
    prompt = 5
    cache = Spy(rows, capacity=16, device="cpu")
    cache.owner[:, :prompt] = sample.SHARED
    cache.slots = torch.arange(prompt).expand(rows, prompt)
    cache.attend_to(prompt)
    object.__setattr__(cache, "inside", False)
    ids = torch.randint(3, 60, (rows, prompt))
    mask = torch.zeros(rows, 1, prompt, prompt).masked_fill(
        ~torch.ones(prompt, prompt, dtype=torch.bool).tril(), torch.finfo(torch.float32).min)
    out = model(input_ids=ids, attention_mask=mask, position_ids=torch.arange(prompt)[None],
                cache=cache, use_cache=True, logits_to_keep=1)
    config = model.config
    new_keys = (rows, config.num_key_value_heads, prompt, config.head_dim)
    assert updates == [(layer, new_keys) for layer in range(config.num_hidden_layers)]
    assert set(read_from_outside) <= {"update", "__class__"}, read_from_outside
    full = model(input_ids=ids, attention_mask=mask, position_ids=torch.arange(prompt)[None],
                 use_cache=False).logits
    torch.testing.assert_close(out.logits[:, -1], full[:, -1], rtol=0, atol=1e-5)


# ---- the draw rule (sample.Engine._draw_verdict), traced step by step: NOTES.md §3's table


class HandSetModel(torch.nn.Module):
    """A model whose next token depends on the fed token alone: `rules` maps a fed token to the
    tokens it may draw, each with equal probability; any other fed token draws "." (char
    tokenizer with the tags). It ignores the context, the positions and the cache: what the
    sampler does with its draws is all there is to see."""

    def __init__(self, tok, rules: dict[str, tuple[str, ...]]):
        super().__init__()
        vocab_size = len(tok)
        table = torch.full((vocab_size, vocab_size), float("-inf"))   # row: the fed token
        table[:, tok.convert_tokens_to_ids(".")] = 0.0
        for fed, drawn in rules.items():
            row = tok.convert_tokens_to_ids(fed)
            table[row] = float("-inf")
            table[row, tok.convert_tokens_to_ids(list(drawn))] = 0.0
        self.head = torch.nn.Embedding.from_pretrained(table)

    def forward(self, input_ids, **unused):
        return SimpleNamespace(logits=self.head(input_ids))

    def get_output_embeddings(self):
        return self.head


# One Unseen block: path 1 writes x and closes itself, path 2 writes y z and then an EOS, which
# becomes </Path>; the summary's EOS becomes </Summary>. Which path writes x is the seed's draw.
BLOCK_RULES = {"\n": ("a",), "a": ("<Parallel>",), "<Path>": ("x", "y"), "x": ("</Path>",),
               "y": ("z",), "z": ("<eos>",), "<Summary>": ("s",), "s": ("<eos>",),
               "</Summary>": ("b",), "b": ("<eos>",)}
BLOCK_PROMPT = "Hi\n"
BLOCK_SEED = 3          # path 1 draws x, path 2 draws y


def trace_draws(model, tok, prompt: str, **settings):
    """generate() on one prompt, with every draw recorded as the sampler decides it: per draw
    (step, stream, fed, drawn, verdict, written, T, D), where step 0 draws from the prompt's
    logits, `written` lists the (stream, token) the sample appended in response, and T and D are
    the sample's tokens and decode steps after it (its counters, an open block counted as its
    longest path; once it is done, the response's). Returns (the draws, the rollout)."""
    engine = sample.Engine
    tags = TagIds.from_tokenizer(tok)
    draws = []
    steps = []

    def stream_name(st):
        if st.owner >= sample.FIRST_PATH_OWNER:
            return f"path {st.owner - sample.FIRST_PATH_OWNER + 1}"
        return st.segment

    def spent(s):
        if s.done:                                 # its open paths closed and joined the response
            ids = [token for token, _, _, _ in s.main.tokens]
            return len(ids), sample.critical_path(parse_structure(ids, tags), settings["mode"])
        longest = max((p.path_len for p in s.paths), default=0)
        return s.tokens_spent, s.steps_spent + longest

    def close_last_draw():
        if draws and "T" not in draws[-1]:
            draws[-1]["T"], draws[-1]["D"] = spent(draws[-1]["sample"])

    def choose_and_advance(self, logits, fed):
        steps.append(len(steps))
        choose_and_advance.original(self, logits, fed)
        close_last_draw()

    def draw_verdict(self, s, st, token):
        close_last_draw()
        verdict = draw_verdict.original(self, s, st, token)
        draws.append({"step": steps[-1], "stream": stream_name(st), "fed": st.feed,
                      "drawn": token, "verdict": verdict, "written": [], "sample": s})
        return verdict

    def append(self, s, st, token, *args, **kwargs):
        appended = append.original(self, s, st, token, *args, **kwargs)
        if appended:
            draws[-1]["written"].append((stream_name(st), token))
        return appended

    choose_and_advance.original = engine._choose_and_advance
    draw_verdict.original = engine._draw_verdict
    append.original = engine._append
    with (mock.patch.object(engine, "_choose_and_advance", choose_and_advance),
          mock.patch.object(engine, "_draw_verdict", draw_verdict),
          mock.patch.object(engine, "_append", append)):
        [rollout] = generate(model, tok, [prompt], **settings)
    return draws, rollout


def block_table(tok) -> str:
    """NOTES.md §3's table, from the sampler: one Unseen block of BLOCK_RULES, traced."""
    model = HandSetModel(tok, BLOCK_RULES)
    draws, _ = trace_draws(model, tok, BLOCK_PROMPT, mode="unseen", num_paths=2, seed=BLOCK_SEED)

    def shown(token: int) -> str:
        return "`" + tok.convert_ids_to_tokens(token).replace("\n", "\\n") + "`"

    header = "| step | stream | token fed | token drawn | kept, or dropped: why | written | T | D |"
    lines = [header,
             "|---|---|---|---|---|---|---|---|"]
    for d in draws:
        fed = "the prompt" if d["fed"] is None else shown(d["fed"])
        verdict = d["verdict"] if d["verdict"] == sample.KEPT else f"dropped: {d['verdict']}"
        written = []
        for stream, token in d["written"]:
            where = "" if stream == d["stream"] else f"{stream}: "
            written.append(where + shown(token))
        lines.append(f"| {d['step']} | {d['stream']} | {fed} | {shown(d['drawn'])} | {verdict} | "
                     f"{', '.join(written)} | {d['T']} | {d['D']} |")
    return "\n".join(lines)


def test_notes_block_table_is_what_the_sampler_does():
    """NOTES.md §3's step-by-step table of one Unseen block is this trace of the sampler, row for
    row; and the trace ends at the rollout's T and D, with the response it describes."""
    tok = tiny_tokenizer()
    table = block_table(tok)
    print(table)
    with open(os.path.join(ROOT, "NOTES.md")) as f:
        notes = f.read()
    assert table in notes, f"NOTES.md §3's table is stale; the sampler's is:\n{table}"
    draws, rollout = trace_draws(HandSetModel(tok, BLOCK_RULES), tok, BLOCK_PROMPT,
                                 mode="unseen", num_paths=2, seed=BLOCK_SEED)
    assert (draws[-1]["T"], draws[-1]["D"]) == (rollout.num_tokens, rollout.critical_path)
    assert (rollout.num_tokens, rollout.critical_path) == (16, 16 - 3)   # paths of 3 and 4
    assert tok.decode(rollout.response_ids) == ("a<Parallel><Path>x</Path><Path>yz</Path>"
                                                "</Parallel>\n<Summary>s</Summary>b<eos>")
    assert rollout.structure.valid and rollout.finish_reason == "eos"
    sampled = [tok.convert_ids_to_tokens(t) for t, m in zip(rollout.response_ids,
                                                            rollout.sampled_mask) if m]
    assert sampled == ["a", "<Parallel>", "x", "</Path>", "y", "z", "s", "b", "<eos>"]


def verdicts_of(draws, step: int) -> list[tuple[str, str]]:
    return [(d["stream"], d["verdict"]) for d in draws if d["step"] == step]


@pytest.mark.parametrize("budget", ["steps", "tokens"])
def test_the_budget_ends_the_whole_sample(budget):
    """Paths that never close, 3 of them, under a budget of 12: the first draw the budget cannot
    hold is dropped (over_budget) and the sample ends; the draws after it in the same step are
    sample_ended; every open path gets its </Path>, and no </Parallel> or summary follows.
    Decode steps: a <Parallel> (D = 2), then 2 steps kept for <Path></Path>: the paths grow
    together (one token a step) until a path's token with its </Path> would make D 13, so path 1's
    draw is refused at <Path> + 8 tokens (D = 2 + 1 + 8 + 1 = 12) and paths 2 and 3 end with it.
    Tokens: a <Parallel> (T = 2), 3 x <Path> (T = 5, with the 3 </Path> kept free 8); then every
    path token costs 1: the 3 paths get x (T = 8), path 1 another (T = 9), and path 2's would make
    9 + 1 + 3 = 13: dropped; the 3 </Path> make T = 12."""
    tok = tiny_tokenizer()
    rules = {"\n": ("a",), "a": ("<Parallel>",), "<Path>": ("x",), "x": ("x",)}
    draws, rollout = trace_draws(HandSetModel(tok, rules), tok, BLOCK_PROMPT, mode="unseen",
                                 num_paths=3, max_new_tokens=12, budget=budget, seed=0)
    verdicts = verdicts_of(draws, draws[-1]["step"])          # the last step's draws
    paths = rollout.structure.blocks[0].paths
    lengths = [end - start for start, end in paths]
    assert rollout.finish_reason == "budget"
    assert rollout.structure.blocks[0].end is None and not rollout.structure.valid
    assert all(rollout.response_ids[end - 1] == tok.convert_tokens_to_ids("</Path>")
               for _, end in paths)
    if budget == "steps":
        assert verdicts == [("path 1", "over_budget"), ("path 2", "sample_ended"),
                            ("path 3", "sample_ended")]
        assert lengths == [10, 10, 10] and rollout.critical_path == 12
    else:
        assert verdicts == [("path 1", "kept"), ("path 2", "over_budget"),
                            ("path 3", "sample_ended")]
        assert lengths == [4, 3, 3] and rollout.num_tokens == 12
