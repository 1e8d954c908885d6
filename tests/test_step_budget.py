"""The budget on the critical path (SamplingConfig(budget="steps")): max_new_tokens bounds D, the
decode steps a machine needs that decodes the paths of an Unseen block side by side, instead of T.
A block spends its longest path plus its tags; the log-probs stay the training forward's; a
response cut by the step budget still parses and trains."""
import hashlib

import torch
from test_sample import PROMPTS, max_logprob_diff, tiny  # the sampler's fixtures

from attention import TagIds, parse_structure
from grpo import GRPOConfig, ppo_update
from sample import SamplingConfig, critical_path, generate
from scripts.bench.bench_sample import TagBias


def tags_biased(model, tok, parallel=6.0, end_path=0.0, eos=-30.0, end_summary=0.0):
    tags = TagIds.from_tokenizer(tok)
    bias = torch.zeros(model.get_output_embeddings().weight.shape[0])
    bias[tags.parallel] = parallel
    bias[tags.end_path] = end_path
    bias[tags.eos] = eos
    bias[tags.end_summary] = end_summary
    return TagBias(model, bias).eval()


def test_critical_path_by_hand():
    """<P>, paths of 5, 3 and 4 tokens (their tags included), </P> \n <S> x </S> x <eos>:
    T = 1 + 12 + 3 + 2 + 2 = 20 tokens, D = 1 + 5 + 3 + 2 + 2 = 13 decode steps."""
    _, tok = tiny()
    t = TagIds.from_tokenizer(tok)
    x = tok.encode("x", add_special_tokens=False)[0]
    response = [t.parallel,
                t.path, x, x, x, t.end_path,
                t.path, x, t.end_path,
                t.path, x, x, t.end_path,
                t.end_parallel, *t.newline, t.summary, x, t.end_summary, x, t.eos]
    structure = parse_structure(response, t)
    assert structure.valid and [e - s for s, e in structure.blocks[0].paths] == [5, 3, 4]
    assert critical_path(structure, "unseen") == 13 and len(response) == 20
    assert critical_path(structure, "seen") == 20


def test_the_sampler_spends_a_block_as_its_longest_path_by_hand():
    """Greedy, with logits that open a block at once, never close a path (each runs to
    max_path_tokens = 5: <Path>, 3 tokens, an injected </Path>) and close the summary at once.
    A block is <P> + 3 paths of 5 + </P> \n <S> + </S>: 20 tokens, 1 + 5 + 3 + 1 = 10 steps.
    - A budget of 25 steps: two blocks (D = 20, T = 40), then <P> (D = 21) and a third block whose
      paths stop at <Path> + 2 tokens, when one more would need step 26; each gets its </Path>:
      D = 21 + 4 = 25, T = 41 + 3 x 4 = 53.
    - A budget of 25 tokens: the first block (T = 20, D = 10), then <P> (T = 21) and no room for
      3 x <Path></Path>: the response ends at <P>, T = 21 and D = 11."""
    model, tok = tiny()
    t = TagIds.from_tokenizer(tok)
    wrapped = tags_biased(model, tok, parallel=30.0, end_path=-30.0, eos=-30.0, end_summary=30.0)
    settings = dict(mode="unseen", max_new_tokens=25, max_path_tokens=5, num_paths=3,
                    greedy=True)
    [steps] = generate(wrapped, tok, PROMPTS[:1], budget="steps", **settings)
    assert steps.finish_reason == "budget"
    assert (steps.num_tokens, steps.critical_path) == (53, 25)
    blocks = steps.structure.blocks
    assert len(blocks) == 3 and blocks[-1].end is None
    assert [[e - s for s, e in b.paths] for b in blocks] == [[5, 5, 5], [5, 5, 5], [4, 4, 4]]
    assert all(steps.response_ids[e - 1] == t.end_path for _, e in blocks[-1].paths)
    [tokens] = generate(wrapped, tok, PROMPTS[:1], budget="tokens", **settings)
    assert (tokens.num_tokens, tokens.critical_path) == (21, 21 - 10)
    assert tokens.response_ids[-1] == t.parallel


def test_the_step_budget_bounds_d_not_t():
    """Unseen, 3 paths, blocks opened eagerly: with a step budget of 40 every response's D is at
    most 40 while its T passes 40; the same budget in tokens bounds T."""
    model, tok = tiny()
    wrapped = tags_biased(model, tok, parallel=4.0, end_path=-1.0)
    cap = 40
    steps = generate(wrapped, tok, PROMPTS, group_size=4, mode="unseen", max_new_tokens=cap,
                     num_paths=3, budget="steps", seed=3)
    tokens = generate(wrapped, tok, PROMPTS, group_size=4, mode="unseen", max_new_tokens=cap,
                      num_paths=3, budget="tokens", seed=3)
    assert all(r.critical_path <= cap for r in steps)
    assert all(r.num_tokens <= cap for r in tokens)
    assert max(r.num_tokens for r in steps) > cap                 # the paths overlap in D
    cut = [r for r in steps if r.finish_reason == "budget"]
    assert cut and all(r.critical_path >= cap - 1 for r in cut), [r.critical_path for r in cut]
    assert max_logprob_diff(wrapped, tok, steps, "unseen", 1.0) <= 1e-4


def test_seen_and_sequential_spend_steps_as_tokens():
    """Seen paths follow one another and sequential has no block: D = T, so both rules agree."""
    model, tok = tiny()
    wrapped = tags_biased(model, tok, parallel=4.0, end_path=-1.0)
    for mode in ("seen", "sequential"):
        a = generate(wrapped, tok, PROMPTS, group_size=2, mode=mode, max_new_tokens=30,
                     budget="steps", seed=5)
        b = generate(wrapped, tok, PROMPTS, group_size=2, mode=mode, max_new_tokens=30,
                     budget="tokens", seed=5)
        assert [r.response_ids for r in a] == [r.response_ids for r in b]


def test_a_response_cut_by_the_step_budget_parses_and_trains():
    """Cut inside a block (every open path gets its </Path>): it parses into the spans it was
    sampled with, and one PPO update on it runs with the exact log-probs."""
    model, tok = tiny()
    tags = TagIds.from_tokenizer(tok)
    wrapped = tags_biased(model, tok, parallel=6.0, end_path=-30.0)
    sampling = SamplingConfig(max_new_tokens=24, num_paths=3, budget="steps", seed=7)
    rollouts = generate(wrapped, tok, PROMPTS[:2], group_size=2, mode="unseen", sampling=sampling)
    cut_in_block = [r for r in rollouts
                    if r.structure.blocks and r.structure.blocks[-1].end is None]
    assert cut_in_block
    for r in cut_in_block:
        assert parse_structure(r.response_ids, tags).blocks == r.structure.blocks
        assert r.critical_path <= 24 < r.num_tokens
        paths = r.structure.blocks[-1].paths
        assert len(paths) == 3 and all(r.response_ids[e - 1] == tags.end_path for _, e in paths)
    assert max_logprob_diff(wrapped, tok, rollouts, "unseen", 1.0) <= 1e-4
    cfg = GRPOConfig(max_new_tokens=24, ppo_mini_batches=1, micro_batch_size=2,
                     recompute_logprobs=True, mode="unseen")
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    advantages = torch.linspace(-1.0, 1.0, len(rollouts))
    stats = ppo_update(model, optimizer, rollouts, advantages, cfg, tags=tags,
                       pad_id=tok.pad_token_id, clip_ratio_high=0.2)
    assert stats["optimizer_steps"] == 1 and stats["loss_tokens"] > 0
    model.eval()


# sha256 of the first 50 synthetic:hard traces, joined by newlines, before max_paths existed
TRACES_BEFORE_THE_KNOB = "7abc1916a303562aff7524780a681542a3362ea594cd4a4c382ff2ff1f10ef15"


def test_sft_traces_with_mixed_block_widths():
    """max_paths=4: each block's width is drawn from 2..4 (every width occurs, no other); the
    default (2) draws nothing more, so the traces it writes are those it always wrote."""
    from collections import Counter

    from data import load_data
    _, tok = tiny()
    tags = TagIds.from_tokenizer(tok)
    widths = Counter()
    for r in load_data("synthetic:hard", limit=300, max_paths=4):
        structure = parse_structure(tok.encode(r["solution"], add_special_tokens=False), tags)
        assert structure.valid
        widths.update(len(b.paths) for b in structure.blocks)
    assert set(widths) == {2, 3, 4} and min(widths.values()) > 30, widths
    default = "\n".join(r["solution"] for r in load_data("synthetic:hard", limit=50))
    assert hashlib.sha256(default.encode()).hexdigest() == TRACES_BEFORE_THE_KNOB
