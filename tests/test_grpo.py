"""GRPO: advantages, the PPO-clip loss, loss aggregation and KL on hand-worked values; injected
tokens out of the loss; micro-batching, 2 ranks (DDP and FSDP, uneven data) and resume all equal to
one plain run.

Run as a script (`torchrun --nproc_per_node=2 tests/test_grpo.py <dir>`) it is the worker of the
2-rank test."""

import copy
import dataclasses
import itertools
import json
import math
import os
import pickle
import signal
import statistics
import sys
from pathlib import Path

import pytest
import torch
from conftest import torchrun_two_ranks
from test_sample import bans_by_the_rules
from transformers import Qwen3Config, Qwen3ForCausalLM

# for the torchrun worker
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import config
import grpo
import plumbing
import sample
from attention import TagIds, structured_forward, token_logprobs
from grpo import (
    GRPOConfig,
    agg_loss,
    collate_rollouts,
    compute_advantages,
    kl_penalty,
    micro_batch_loss,
    policy_loss,
    ppo_update,
)
from model import add_parallel_tags, build_char_tokenizer
from plumbing import plan_micro_batches, save_checkpoint
from sample import Rollout, generate
from scripts.bench.bench_sample import TagBias


def tiny_run(**fields) -> GRPOConfig:
    """A run's config under the tiny preset (the test models are not the embedded one)."""
    return GRPOConfig(preset="tiny", **fields)


# --------------------------------------------------------------------------------------------------
# Advantages


def test_advantages_hand_made_groups():
    # [1, -1, -1, -1]: mean -0.5, deviations 1.5 / -0.5, unbiased std
    # sqrt((2.25 + 3 * 0.25) / 3) = 1
    adv, var = compute_advantages([1.0, -1.0, -1.0, -1.0], 4)
    assert torch.allclose(adv, torch.tensor([1.5, -0.5, -0.5, -0.5]) / (1 + 1e-6), atol=0,
                          rtol=1e-7)
    assert var.tolist() == [True]
    # the tiered reward of S2: std from the statistics module (n - 1 in the denominator)
    r = [1.2, 1.0, -1.0, -1.0]
    mean, std = sum(r) / 4, statistics.stdev(r)
    adv, _ = compute_advantages(r, 4)
    assert torch.allclose(adv, torch.tensor([(x - mean) / (std + 1e-6) for x in r]), atol=1e-6)
    # Dr. GRPO: no division
    adv, _ = compute_advantages(r, 4, norm_adv_by_std=False)
    assert torch.allclose(adv, torch.tensor([x - mean for x in r]), atol=1e-6)


def test_advantages_equal_groups_are_exactly_zero_never_nan():
    # eight tiered rewards of 1.2: the float32 mean is not exactly 1.2, and the naive formula turns
    # the rounding (1.2e-7) divided by (std + 1e-6) into advantages of ~0.1. The zero must be
    # explicit.
    g = torch.tensor([1.2] * 8)
    assert ((g - g.mean()) / (g.std() + 1e-6)).abs().max() > 0.05
    adv, var = compute_advantages([1.2] * 8 + [1.0, -1.0] * 4, 8)
    assert adv[:8].tolist() == [0.0] * 8 and var.tolist() == [False, True]
    adv, var = compute_advantages([1.0, -1.0, 0.5], 1)               # G = 1: std undefined -> 0
    assert adv.tolist() == [0.0, 0.0, 0.0] and not var.any()
    adv, _ = compute_advantages([-1.0] * 8, 8, norm_adv_by_std=False)
    assert adv.tolist() == [0.0] * 8


# --------------------------------------------------------------------------------------------------
# PPO-clip loss, aggregation, KL


@pytest.mark.parametrize("A, ratio, loss, grad, clipped, dual", [
    (+1.0, 1.10, -1.10, -1.10, False, False),    # inside the range: d(-A r)/d logp = -A r
    (+1.0, 1.50, -1.28, 0.0, True, False),       # clip-higher: the gain stops at 1 + 0.28
    (+2.0, 1.25, -2.50, -2.50, False, False),    # ... and 1.25 is still inside it (0.2/0.2 clips)
    (+1.0, 0.50, -0.50, -0.50, False, False),    # a good token that shrank is pushed up, unclipped
    (-1.0, 0.50, 0.80, 0.0, True, False),        # clipped below at 1 - 0.2
    (-1.0, 2.00, 2.00, 2.00, False, False),      # PPO keeps the larger loss of a bad token grown
    (-1.0, 5.00, 3.00, 0.0, False, True),        # dual clip: at most clip_ratio_c * |A|
    (-0.5, 7.00, 1.50, 0.0, False, True),
])
def test_policy_loss_hand_values(A, ratio, loss, grad, clipped, dual):
    old = torch.tensor([[-1.0]])
    new = (old + math.log(ratio)).requires_grad_(True)
    out, was_clipped, was_dual = policy_loss(new, old, torch.tensor([[A]]), 0.2, 0.28, 3.0)
    out.sum().backward()
    assert out.item() == pytest.approx(loss, abs=1e-6)
    assert new.grad.item() == pytest.approx(grad, abs=1e-6)
    assert was_clipped.item() == clipped and was_dual.item() == dual


def test_policy_loss_clamps_the_log_ratio():
    old = torch.zeros(1, 3)
    new = torch.tensor([[100.0, 100.0, -100.0]])     # exp(100) overflows float32 without the clamp
    out, _, _ = policy_loss(new, old, torch.tensor([[0.0, 1.0, -1.0]]))
    assert torch.isfinite(out).all()
    # A = 0: 0 * e^20, not 0 * inf = NaN; A = +1: the gain stops at 1.2; A = -1: clipped at 0.8
    assert out[0].tolist() == pytest.approx([0.0, -1.2, 0.8], abs=1e-6)


def test_loss_agg_modes_on_a_hand_table():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    # row 3: nothing in the loss
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert agg_loss(loss, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert agg_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx((6 / 3 + 4 / 1) / 2)
    assert agg_loss(loss, mask, "seq-mean-token-sum-norm", max_new_tokens=5).item() == \
        pytest.approx(10 / (2 * 5))


def test_kl_estimators():
    lp, ref = torch.tensor([-1.0, -2.0, 0.0]), torch.tensor([-2.0, -1.0, -50.0])
    assert kl_penalty(lp, ref, "k1").tolist() == pytest.approx([1.0, -1.0, 50.0])
    # k3 = e^d - d - 1 with d = ref - lp: d = -1 -> e^-1; d = +1 -> e - 2; d = -50 -> clamp(-20)
    # -> 19 -> clamp 10
    assert kl_penalty(lp, ref, "k3").tolist() == \
        pytest.approx([math.exp(-1), math.e - 2, 10.0], abs=1e-6)
    assert kl_penalty(lp, lp, "k3").abs().max() == 0


def loss_from_logits(logits, mb, cfg, clip_ratio_high, denominator):
    """micro_batch_loss on the loss tokens' log-probs and entropies taken from given logits
    (B, L, V) (the training forward's head_scores, without the model); the loss weights of
    cfg.loss_agg_mode unless mb has its own."""
    if mb.loss_weights is None:
        mb.loss_weights = grpo.loss_weights(mb.loss_mask, cfg.loss_agg_mode, cfg.max_new_tokens)[0]
    selected = mb.loss_mask.bool()
    z = logits[:, :-1][selected].float() / cfg.temperature
    logprobs = token_logprobs(z, mb.input_ids[:, 1:][selected])
    entropy = torch.logsumexp(z, -1) - (z.softmax(-1) * z).sum(-1)
    return micro_batch_loss(logprobs, entropy.detach(), mb, cfg, clip_ratio_high, denominator)


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_kl_gradient_hand_values(estimator):
    """The KL part of the loss pushes logp towards logp_ref: its gradient is
    kl_coef / D * dkl/dlogp * (onehot - p). Uniform logits over V = 4 (logp = -log 4, p = 1/4);
    d = logp_ref - logp = -1, +1, 3: k1 -> dkl/dlogp = 1; k3 = e^d - d - 1 -> 1 - e^d, and 0 at
    d = 3 (e^3 - 4 > 10: the value is clamped)."""
    a = hand_rollout([0], [1, 2, 3], [1, 1, 1], [-math.log(4)] * 3)
    mb = collate_rollouts([a], [0.5], pad_id=0)
    mb.ref_logprobs = torch.tensor([[-1.0, 1.0, 3.0]]) - math.log(4)
    cfg, grads = GRPOConfig(max_new_tokens=8, kl_estimator=estimator), []
    for kl_coef in (0.0, 0.3):
        logits = torch.zeros(1, 4, 4, requires_grad=True)
        loss, _ = loss_from_logits(logits, mb, dataclasses.replace(cfg, kl_coef=kl_coef), 0.2,
                                   denominator=3.0)
        loss.backward()
        grads.append(logits.grad)
    dkl = [1.0, 1.0, 1.0] if estimator == "k1" else [1 - math.exp(-1), 1 - math.e, 0.0]
    expected = torch.zeros(1, 4, 4)
    for t, (y, g) in enumerate(zip([1, 2, 3], dkl)):
        expected[0, t] = 0.3 / 3 * g * (torch.nn.functional.one_hot(torch.tensor(y), 4) - 0.25)
    assert torch.allclose(grads[1] - grads[0], expected, atol=1e-6)
    assert expected.abs().sum() > 0.1


# --------------------------------------------------------------------------------------------------
# Rollout tables and injected tokens


def hand_rollout(prompt, response, sampled, logprobs):
    return Rollout(prompt_index=0, prompt_ids=prompt, response_ids=response, sampled_mask=sampled,
                   logprobs=logprobs, structure=None, num_tokens=len(response),
                   critical_path=len(response), finish_reason="eos")


def test_collate_is_target_aligned():
    a = hand_rollout([5, 6], [7, 8, 1], [1, 0, 1], [-0.5, 0.0, -0.25])
    b = hand_rollout([5], [9, 1], [1, 1], [-1.0, -2.0])
    mb = collate_rollouts([a, b], [0.5, -1.0], pad_id=0)
    assert mb.input_ids.tolist() == [[5, 6, 7, 8, 1], [5, 9, 1, 0, 0]]
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert mb.response_mask.tolist() == [[0, 1, 1, 1], [1, 1, 0, 0]]
    assert mb.sampled_mask.tolist() == [[0, 1, 0, 1], [1, 1, 0, 0]]
    assert mb.loss_mask.tolist() == mb.sampled_mask.tolist()
    assert mb.old_logprobs.tolist() == [[0.0, -0.5, 0.0, -0.25], [-1.0, -2.0, 0.0, 0.0]]
    assert mb.advantages.tolist() == [[0.5], [-1.0]]
    assert collate_rollouts([a, b], [0.5, -1.0], 0, train_injected=True).loss_mask.tolist() == \
        mb.response_mask.tolist()



def test_collate_names_a_rollout_with_an_empty_prompt():
    a = hand_rollout([5], [9, 1], [1, 1], [-1.0, -2.0])
    b = hand_rollout([], [7, 1], [1, 1], [-1.0, -2.0])
    with pytest.raises(ValueError, match=r"rollout 1 \(prompt_index 0\) has an empty prompt"):
        collate_rollouts([a, b], [0.5, -1.0], pad_id=0)

@pytest.mark.parametrize("train_injected", [False, True])
def test_injected_tokens_get_no_gradient(train_injected):
    # <Path> (102) was injected by the runtime; the loss must not push on its logits
    a = hand_rollout([5, 6], [7, 99, 102, 8, 1], [1, 1, 0, 1, 1], [-4.0, -4.5, 0.0, -4.2, -4.1])
    b = hand_rollout([5], [100, 1], [0, 1], [0.0, -3.0])
    mb = collate_rollouts([a, b], [1.0, -1.0], pad_id=0, train_injected=train_injected)
    torch.manual_seed(0)
    logits = torch.randn(2, 7, 105, requires_grad=True)
    with torch.no_grad():                              # on-policy, so no token is clipped
        mb.old_logprobs = token_logprobs(logits[:, :-1], mb.input_ids[:, 1:]) * mb.response_mask
    cfg = GRPOConfig(max_new_tokens=8)
    loss, stats = loss_from_logits(logits, mb, cfg, 0.28, denominator=float(mb.loss_mask.sum()))
    loss.backward()
    g = logits.grad.abs().sum(-1)                      # (B, L): row t predicts token t + 1
    injected = [(0, 3), (1, 0)]                        # logits predicting 102 and 100
    sampled = [(0, 1), (0, 2), (0, 4), (0, 5), (1, 1)]
    for b, t in injected:
        assert (g[b, t] > 0) == train_injected
    assert all(g[b, t] > 0 for b, t in sampled)
    # prompt-internal and padding
    assert g[0, 0] == 0 and g[0, 6] == 0 and g[1, 2:].abs().sum() == 0
    assert stats["tokens"] == (7 if train_injected else 5)


def test_plan_micro_batches():
    assert plan_micro_batches([5] * 6, 2, 2) == [[[0, 1], [2]], [[3, 4], [5]]]
    assert plan_micro_batches([4, 4, 9, 9], 1, 4, 16) == [[[0, 1], [2], [3]]]
    assert plan_micro_batches([3], 2, 4) == [[], [[0]]]


# --------------------------------------------------------------------------------------------------
# Recipes and defaults


def test_recipes_follow_the_paper():
    def at(recipe, step, **kw):
        return grpo.stage_at(GRPOConfig(recipe=recipe, **kw), step)

    # Seen: parallel-gated reward on easy problems, then accuracy on the training data (§6.1, §4.2)
    s = at("seen", 10, easy_steps=10)
    assert (s.reward.kind_at(10), s.data, s.clip_ratio_high) == ("parallel_gated", "easy", 0.2)
    s = at("seen", 11, easy_steps=10)
    assert (s.reward.kind_at(11), s.data) == ("accuracy", "train")
    # Unseen S1: accuracy, clip 0.2; S2: steps 1-8 of 10 accuracy, 9-10 tiered, clip-higher 0.28
    # (§4.4, §5.2)
    assert at("unseen-s1", 9).reward.kind_at(9) == "accuracy"
    assert at("unseen-s1", 9).clip_ratio_high == 0.2
    s2 = at("unseen-s2", 1)
    assert [s2.reward.kind_at(t) for t in (8, 9, 10, 11)] == \
        ["accuracy", "tiered", "tiered", "accuracy"]
    assert s2.clip_ratio_high == 0.28
    # scaffold: S2 up to step K, then accuracy with clip 0.2 (§6.2)
    assert at("scaffold", 19, scaffold_steps=20).reward.kind_at(19) == "tiered"
    assert at("scaffold", 19, scaffold_steps=20).clip_ratio_high == 0.28
    s = at("scaffold", 29, scaffold_steps=20)
    assert (s.reward.kind_at(29), s.clip_ratio_high) == ("accuracy", 0.2)
    # overrides win at every step
    overridden = at("unseen-s2", 9, reward="accuracy", clip_ratio_high=0.3)
    assert overridden.reward.kind_at(9) == "accuracy"
    assert at("unseen-s2", 9, clip_ratio_high=0.3).clip_ratio_high == 0.3


def test_defaults_and_modes(capsys):
    real = grpo.resolve_defaults(GRPOConfig(recipe="unseen-s2", preset="paper"))
    assert (real.mode, real.group_size, real.batch_size, real.lr, real.max_new_tokens,
            real.ppo_mini_batches) == ("unseen", 8, 256, 1e-6, 3000, 2)
    assert grpo.resolve_defaults(GRPOConfig(recipe="baseline", preset="tiny")).mode == "sequential"
    assert grpo.resolve_defaults(GRPOConfig(recipe="seen", preset="tiny")).mode == "seen"
    with pytest.raises(ValueError, match="split evenly"):
        grpo.resolve_defaults(GRPOConfig(batch_size=5, preset="tiny"), world_size=2)
    for bad in (["--recipe=s3"], ["--loss_agg_mode=sum"], ["--kl_estimator=k2"], ["--mode=causal"],
                ["--reward=x"]):
        # the typed command line refuses them, naming the choices
        with pytest.raises(SystemExit):
            config.parse(GRPOConfig, bad)
        assert "invalid choice" in capsys.readouterr().err
    cfg = config.parse(GRPOConfig, ["--recipe", "scaffold", "--reward=tiered",
                                    "--clip_ratio_high=None", "--eval_data="])
    assert (cfg.recipe, cfg.reward, cfg.clip_ratio_high, cfg.eval_data) == \
        ("scaffold", "tiered", None, "")


def test_real_data_eval_data_default_follows_the_data():
    """--data=<real set> without --eval_data: its own test part, else (tiny preset) none, not the
    preset's synthetic test sets; the paper preset keeps its benchmark; an explicit flag wins."""
    def resolved(**given):
        return grpo.resolve_defaults(GRPOConfig(model="tiny", **given)).eval_data
    assert resolved(data="dapo", preset="tiny") == ""
    assert resolved(data="gsm8k:train", preset="tiny") == "gsm8k:test"
    assert resolved(data="dapo", preset="paper") == "aime25"
    assert resolved(data="dapo", preset="tiny", eval_data="aime24") == "aime24"
    assert resolved(data="synthetic:easy:test", preset="tiny") == \
        "synthetic:easy:test,synthetic:medium:test,synthetic:hard:test"


def test_missing_sft_checkpoint_says_what_to_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError,
                       match="python sft.py --mode=seen --out_dir=runs/sft_seen"):
        plumbing.default_init("seen")
    assert plumbing.default_init("unseen", "some/folder") == "some/folder"


# --------------------------------------------------------------------------------------------------
# Tiny random models and sampled rollouts


def tiny(seed=0):
    tok = build_char_tokenizer()
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      intermediate_size=128, max_position_embeddings=512, tie_word_embeddings=True,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    model = Qwen3ForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    add_parallel_tags(model, tok)
    return model.eval(), tok


def tag_biased(model, tok):
    """Logits pushed towards the tags, so random weights sample blocks (and injected tokens)."""
    tags = TagIds.from_tokenizer(tok)
    bias = torch.zeros(model.get_output_embeddings().weight.shape[0])
    bias[[tags.parallel, tags.end_path, tags.end_summary]] = 3.0
    bias[tags.eos] = 1.0
    return TagBias(model, bias)


def sampled_rollouts(model, tok, prompts, group_size, max_new_tokens, seed, mode="unseen"):
    return generate(tag_biased(model, tok), tok, prompts, group_size=group_size, mode=mode,
                    max_new_tokens=max_new_tokens, seed=seed)


def flat_params(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def run_update(model, rollouts, advantages, cfg, tok, lr=0.5, optimizer="sgd", ref_model=None):
    """ppo_update with a fresh optimizer; returns (flat weights after, stats). The equivalence tests
    use SGD: the weights then differ exactly by the accumulated gradients' rounding, where AdamW's
    m / sqrt(v) would blow the rounding of a near-zero gradient up to ~lr."""
    tags = TagIds.from_tokenizer(tok)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01) if optimizer == "adamw" \
        else torch.optim.SGD(model.parameters(), lr=lr)
    cfg = resolved(cfg)
    stats = ppo_update(model, opt, rollouts, advantages, cfg, tags=tags, pad_id=tok.pad_token_id,
                       clip_ratio_high=grpo.stage_at(cfg, 1).clip_ratio_high, ref_model=ref_model)
    return flat_params(model), stats


def resolved(cfg: GRPOConfig) -> GRPOConfig:
    """What ppo_update takes: a config whose mode is set (grpo.resolve_defaults sets it from the
    recipe; these tests call the update directly)."""
    return dataclasses.replace(cfg, mode=cfg.mode or config.RECIPE_MODE[cfg.recipe])


@pytest.fixture(scope="module")
def setting():
    model, tok = tiny()
    prompts = ["Ava has 3 boxes.", "Hi", "Bob has 12 pens and 5 cups; how many?"]
    rollouts = sampled_rollouts(model, tok, prompts, group_size=2, max_new_tokens=24, seed=1)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])
    return model, tok, rollouts, advantages


def drawn_logprobs(model, r, tags: TagIds) -> torch.Tensor:
    """(R,): an independent forward's log-prob of each response token of an Unseen rollout,
    under the softmax the sampler drew it from (the runtime's masks by their rules)."""
    ids = torch.tensor([r.prompt_ids + r.response_ids])
    p = len(r.prompt_ids)
    logits = structured_forward(model, ids, torch.ones_like(ids), [p], tags, "unseen")
    logits = logits[0, p - 1:-1]
    masked = torch.zeros_like(logits, dtype=torch.bool)
    for j, sampled in enumerate(r.sampled_mask):
        if sampled:
            masked[j, sorted(bans_by_the_rules(r, tags, j, "unseen"))] = True
    return token_logprobs(logits.masked_fill(masked, float("-inf")), ids[0, p:], 1.0)


def test_on_policy_update_is_the_policy_gradient(setting):
    """On-policy (ratio 1) the token-mean loss's gradient is -sum(A * grad logp) / N, logp under
    the softmax each token was drawn from (the runtime's masks by their rules). Checked against
    an independent forward: SGD with lr 1 moves the weights by exactly minus that gradient."""
    model, tok, _, _ = setting
    tags = TagIds.from_tokenizer(tok)
    rollouts = generate(model, tok, ["Ava has 3 boxes.", "Hi"], group_size=2, mode="unseen",
                        max_new_tokens=20, seed=3)
    adv = [1.0, -0.5, 0.25, -2.0]
    m = copy.deepcopy(model)
    total, n = 0.0, 0
    for r, a in zip(rollouts, adv):
        lp = drawn_logprobs(m, r, tags)
        keep = torch.tensor(r.sampled_mask, dtype=torch.bool)
        total = total - a * lp[keep].sum()
        n += int(keep.sum())
    (total / n).backward()
    expected = flat_params(m) - torch.cat([p.grad.flatten() for p in m.parameters()])
    w0 = flat_params(model)
    cfg = GRPOConfig(max_new_tokens=20, ppo_mini_batches=1, micro_batch_size=3, grad_clip=0.0)
    got, stats = run_update(copy.deepcopy(model), rollouts, adv, cfg, tok, lr=1.0, optimizer="sgd")
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-5) and stats["clip_frac"] == 0
    assert (got - w0).abs().max() > 1e-3                      # it moved ...
    assert (got - expected).abs().max() < 1e-6               # ... by exactly the policy gradient


@pytest.mark.parametrize("loss_agg_mode",
                         ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batches_equal_one_batch(setting, loss_agg_mode):
    """Gradient accumulation changes nothing: 1 micro-batch of 6, 6 of 1, and a token cap that
    cuts them unevenly give the same weights after 2 PPO mini-batches, and the same logged loss
    and gradient norm (before clipping: AdamW's step hides a gradient scaled alike everywhere)."""
    model, tok, rollouts, adv = setting
    results = []
    for mbs, cap in ((6, 0), (1, 0), (3, 60)):
        cfg = GRPOConfig(max_new_tokens=24, ppo_mini_batches=2, micro_batch_size=mbs,
                         micro_batch_tokens=cap, loss_agg_mode=loss_agg_mode, clip_ratio_high=0.28)
        w, stats = run_update(copy.deepcopy(model), rollouts, adv, cfg, tok)
        results.append((w, stats))
    assert results[1][1]["micro_batches"] == 6 and results[2][1]["micro_batches"] > 2
    for w, stats in results[1:]:
        assert (w - results[0][0]).abs().max() < 1e-6
        for key in ("loss", "pg_loss", "grad_norm", "clip_frac", "entropy"):
            assert stats[key] == pytest.approx(results[0][1][key], rel=1e-5, abs=1e-7), key
    assert (results[0][0] - flat_params(model)).abs().max() > 1e-4
    assert results[0][1]["loss"] != 0 and results[0][1]["grad_norm"] > 0


def test_recompute_logprobs_matches_the_sampler(setting):
    model, tok, _, _ = setting
    rollouts = generate(model, tok, ["Ava has 3 boxes.", "Bob"], group_size=2, mode="unseen",
                        max_new_tokens=24, seed=5, temperature=0.7)
    cfg = GRPOConfig(max_new_tokens=24, recompute_logprobs=True, temperature=0.7,
                     micro_batch_size=4)
    _, stats = run_update(copy.deepcopy(model), rollouts, [1.0, -1.0, 1.0, -1.0], cfg, tok)
    assert stats["logprob_gap_max"] < 1e-5


@pytest.mark.parametrize("shift, outside", [(0.1, 0.0), (0.25, 1.0)])
def test_the_logprob_gap_against_a_shifted_sampler(setting, shift, outside):
    """Sampler log-probs `shift` nats above the training forward's: every ratio is exp(-shift),
    0.905 (inside the clip range [0.8, 1.2]) or 0.779 (outside); the gap is `shift` on every
    sampled token. The injected tokens' logp_old become the forward's; the sampled keep theirs
    (without --recompute_logprobs)."""
    model, tok, rollouts, adv = setting
    tags = TagIds.from_tokenizer(tok)
    cfg = resolved(GRPOConfig(max_new_tokens=24, micro_batch_size=2))
    minis = grpo.mini_batches(rollouts, adv, cfg, tok.pad_token_id, torch.device("cpu"))
    recorded = []
    for mb in (mb for mini in minis for mb in mini.micro_batches):
        exact = grpo.response_logprobs(model, mb, cfg, tags)
        mb.old_logprobs = (exact + shift) * mb.response_mask
        recorded.append((mb, exact, mb.old_logprobs.clone()))
    gap = grpo.recompute_old_logprobs(minis, model, cfg, tags, 0.2, torch.device("cpu"))
    assert gap["logprob_gap_mean"] == pytest.approx(shift, abs=1e-5)
    assert gap["logprob_gap_max"] == pytest.approx(shift, abs=1e-5)
    assert gap["logprob_gap_outside_clip"] == outside
    for mb, exact, before in recorded:
        injected = (mb.response_mask - mb.sampled_mask).bool()
        assert torch.equal(mb.old_logprobs[injected], exact[injected])
        assert torch.equal(mb.old_logprobs[mb.sampled_mask.bool()],
                           before[mb.sampled_mask.bool()])


def test_kl_term_against_a_reference_model(setting):
    """The logged KL is the mean k3 over the loss tokens, from an independent forward of both
    models; against itself (ratio 1, KL 0 with zero gradient) the update equals the KL-free one."""
    model, tok, rollouts, adv = setting
    tags = TagIds.from_tokenizer(tok)
    ref, _ = tiny(seed=2)
    expected, n = 0.0, 0
    with torch.no_grad():
        for r in rollouts:
            keep = torch.tensor(r.sampled_mask, dtype=torch.bool)
            lp = drawn_logprobs(model, r, tags)[keep]
            lr = drawn_logprobs(ref, r, tags)[keep]
            expected += (torch.exp(lr - lp) - (lr - lp) - 1).sum().item()
            n += int(keep.sum())
    cfg = GRPOConfig(max_new_tokens=24, ppo_mini_batches=1, micro_batch_size=2, kl_coef=0.1)
    m = copy.deepcopy(model)
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    stats = ppo_update(m, opt, rollouts, adv, resolved(cfg), tags=tags, pad_id=tok.pad_token_id,
                       clip_ratio_high=0.2, ref_model=ref)
    assert stats["kl"] == pytest.approx(expected / n, rel=1e-5) and stats["kl"] > 0.01
    w_self, _ = run_update(copy.deepcopy(model), rollouts, adv, cfg, tok,
                           ref_model=copy.deepcopy(model))
    w_none, _ = run_update(copy.deepcopy(model), rollouts, adv,
                           dataclasses.replace(cfg, kl_coef=0.0), tok)
    assert (w_self - w_none).abs().max() < 1e-6


# the passes between sampling and the update: (GRPOConfig's flags, ppo_update's check_logprobs,
# the pass whose first forward makes `stop` say True, the forwards (the reference's, the
# policy's) run when stopped, and when never stopped)
STOP_PASSES = {
    "reference": (dict(kl_coef=0.1), False, "reference", (1, 0), (4, 0)),
    "old_logprobs": (dict(kl_coef=0.1, recompute_logprobs=True), False, "policy", (4, 1), (4, 4)),
    "logprob_check": (dict(kl_coef=0.0), True, "policy", (0, 1), (0, 4)),
}


@pytest.mark.parametrize("where", STOP_PASSES)
def test_a_stop_in_the_logprob_passes_ends_them_at_the_next_forward(setting, monkeypatch, where):
    """6 rollouts in 2 mini-batches of 2 micro-batches (2 rollouts at most): the KL reference's
    log-prob pass and the policy's (old log-probs recomputed, or the sampler's gap measured) run
    a forward a micro-batch, 4 each. `stop` turns True once the named pass ran one: that pass
    runs no other forward, no later pass starts, and the update returns None with the weights
    and their gradients untouched (a preemption must not wait for whole passes: a large
    model's pass can outlast the launcher's grace time)."""
    model, tok, rollouts, adv = setting
    flags, check, stopping, stopped, unstopped = STOP_PASSES[where]
    cfg = resolved(GRPOConfig(max_new_tokens=24, micro_batch_size=2, **flags))
    ref = None
    if cfg.kl_coef > 0:
        ref = copy.deepcopy(model)
    real = grpo.response_logprobs
    forwards = {"reference": 0, "policy": 0}

    def counting(m, *args):
        forwards["reference" if m is ref else "policy"] += 1
        return real(m, *args)

    def update(stop):
        forwards.update(reference=0, policy=0)
        policy = copy.deepcopy(model)
        out = ppo_update(policy, torch.optim.SGD(policy.parameters(), lr=0.5), rollouts, adv, cfg,
                         tags=TagIds.from_tokenizer(tok), pad_id=tok.pad_token_id,
                         clip_ratio_high=0.2, ref_model=ref, check_logprobs=check, stop=stop)
        return out, policy

    monkeypatch.setattr(grpo, "response_logprobs", counting)
    out, policy = update(lambda: forwards[stopping] >= 1)
    assert out is None
    assert (forwards["reference"], forwards["policy"]) == stopped
    assert torch.equal(flat_params(policy), flat_params(model))
    assert all(p.grad is None for p in policy.parameters())
    out, policy = update(lambda: False)
    assert out["micro_batches"] == 4 and out["optimizer_steps"] == 2
    assert (forwards["reference"], forwards["policy"]) == unstopped
    assert not torch.equal(flat_params(policy), flat_params(model))


def test_filter_groups_trains_only_on_groups_with_variance(tmp_path, monkeypatch):
    def scores(responses, golds, **kw):          # prompt "0": all equal; prompt "1": by the text
        return [{"reward": 0.0 if g == "0" else float(sum(map(ord, t)) % 7), "correct": False,
                 "kind": "accuracy", "answer_found": False}
                for t, g in zip(responses, golds)]
    monkeypatch.setattr(grpo, "score_batch", scores)
    model, tok = tiny(seed=1)
    init = save_checkpoint(str(tmp_path / "init"), model, tok)
    records = [{"id": str(i), "problem": f"Ava has {i} pens.", "answer": str(i)} for i in range(2)]
    out = grpo.train(tiny_run(model=init, batch_size=2, group_size=3, max_new_tokens=12,
                                max_steps=1, max_time=0.0, eval_data="", log_every=0,
                                filter_groups=True, out_dir=str(tmp_path / "run")),
                     records=records)
    row = out["last_step"]
    assert row["groups_with_variance"] == 0.5 and row["rollouts_trained"] == 3
    assert row["optimizer_steps"] == 2


def test_max_time_stops_after_a_step_and_says_so(tmp_path, monkeypatch, capsys):
    """--max_time ends the run after the step that crosses it, with a checkpoint; the last line once
    read as if every step had run. Without evaluations it does not suggest summary.py (it has
    nothing to show)."""
    monkeypatch.setattr(grpo, "score_batch", fake_scores)
    model, tok = tiny(seed=1)
    init = save_checkpoint(str(tmp_path / "init"), model, tok)
    records = [{"id": str(i), "problem": f"Ava has {i} pens.", "answer": str(i)} for i in range(2)]
    out = grpo.train(tiny_run(model=init, batch_size=2, group_size=2, max_new_tokens=12,
                                max_steps=3, max_time=1e-9, eval_data="", log_every=0,
                                out_dir=str(tmp_path / "run")),
                     records=records)
    printed = capsys.readouterr().out
    assert out["steps"] == 1 and out["checkpoint"] == str(tmp_path / "run" / "checkpoint-1")
    assert "GRPO done at step 1 of 3 (stopped by --max_time=1e-09): 1 steps in " in printed
    assert "summary.py" not in printed


def test_each_row_logs_the_lr_its_step_trained_at(tmp_path, monkeypatch):
    """Warm-up 2 optimizer steps, constant after, lr 1e-3, 2 mini-batches (2 optimizer steps) a
    GRPO step: steps 1-3 begin at optimizer steps 0, 2, 4, at lr 0.5e-3, 1e-3, 1e-3 (lr_factor:
    (step + 1) / 2 while step < 2). A row logs its step's first lr; it once read the lr after the
    update had moved the schedule on (1e-3 at step 1)."""
    monkeypatch.setattr(grpo, "score_batch", fake_scores)
    model, tok = tiny(seed=1)
    init = save_checkpoint(str(tmp_path / "init"), model, tok)
    records = [{"id": str(i), "problem": f"Ava has {i} pens.", "answer": str(i)} for i in range(2)]
    grpo.train(tiny_run(model=init, batch_size=2, group_size=2, max_new_tokens=8, max_steps=3,
                        lr=1e-3, warmup_steps=2, lr_schedule="constant", eval_data="",
                        log_every=0, out_dir=str(tmp_path / "run")),
               records=records)
    rows = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [row["lr"] for row in rows] == [0.5e-3, 1e-3, 1e-3]


# --------------------------------------------------------------------------------------------------
# Resume: 4 steps = 2 steps + resume + 2 steps


def test_same_seed_same_run_bit_for_bit(tmp_path, monkeypatch):
    """Two fresh runs with the same seed and thread count (KL anchor on): equal weights and log
    rows, but for the wall-clock fields; a third that also evaluates after every step trains the
    same (the demo turns it off)."""
    monkeypatch.setattr(grpo, "score_batch", fake_scores)
    model, tok = tiny(seed=1)
    init = save_checkpoint(str(tmp_path / "init"), model, tok)
    records = [{"id": str(i), "problem": f"Ava has {i} pens.", "answer": str(i)} for i in range(5)]
    base = dict(model=init, batch_size=2, group_size=2, max_new_tokens=12, micro_batch_size=2,
                lr=1e-3, kl_coef=0.1, max_steps=2, max_time=0.0, eval_data="", save_every=0,
                log_every=0, recipe="unseen-s2")
    runs = [grpo.train(tiny_run(**base, out_dir=str(tmp_path / d)), records=records)
            for d in "ab"]
    runs.append(grpo.train(tiny_run(**base, out_dir=str(tmp_path / "c"), eval_every=1, eval_k=1),
                           records=records, eval_records=records[:2]))
    from safetensors.torch import load_file
    wa, wb, wc = (load_file(os.path.join(r["checkpoint"], "model.safetensors")) for r in runs)
    assert wa.keys() == wb.keys() == wc.keys()
    assert all(torch.equal(wa[k], wb[k]) and torch.equal(wa[k], wc[k]) for k in wa)
    rows = [[{k: v for k, v in json.loads(line).items()
              if k != "elapsed" and not k.startswith("time_")}
             for line in Path(r["log"]).read_text().splitlines()]
            for r in runs]
    evals = [r for r in rows[2] if "eval/avg_mean_at_k" in r]
    assert len(rows[0]) == 2 and rows[0] == rows[1] == [r for r in rows[2] if r not in evals]
    assert len(evals) == 3


def fake_scores(responses, golds, *, structures=None, reward=None, step=1, **kw):
    """A reward with variance even for a random model: a deterministic function of the text."""
    return [{"reward": float(sum(map(ord, t)) % 7), "correct": False, "kind": "accuracy",
             "answer_found": False}
            for t in responses]


def test_resume_continues_exactly(tmp_path, monkeypatch):
    monkeypatch.setattr(grpo, "score_batch", fake_scores)
    model, tok = tiny(seed=1)
    init = save_checkpoint(str(tmp_path / "init"), model, tok)
    records = [{"id": str(i), "problem": f"Ava has {i} pens.", "answer": str(i)} for i in range(5)]
    base = dict(model=init, batch_size=2, group_size=2, max_new_tokens=12, micro_batch_size=2,
                lr=1e-3, max_time=0.0, eval_data="", save_every=2, log_every=0, recipe="unseen-s2")
    full = grpo.train(tiny_run(**base, max_steps=4, out_dir=str(tmp_path / "a")), records=records)
    grpo.train(tiny_run(**base, max_steps=2, out_dir=str(tmp_path / "b")), records=records)
    resumed = grpo.train(tiny_run(**base, max_steps=4, out_dir=str(tmp_path / "b"),
                                    resume="True"),
                         records=records)
    assert full["steps"] == resumed["steps"] == 4
    from safetensors.torch import load_file
    a = load_file(os.path.join(full["checkpoint"], "model.safetensors"))
    b = load_file(os.path.join(resumed["checkpoint"], "model.safetensors"))
    w0 = load_file(os.path.join(init, "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], w0[k]) for k in a)          # training changed the weights
    state = torch.load(os.path.join(resumed["checkpoint"], "trainer_state.pt"), weights_only=False)
    assert state["config"]["mode"] == "unseen" and state["config"]["recipe"] == "unseen-s2"
    # 4 steps x 2 of 5 problems
    assert state["data_position"]["train"] == {"epoch": 1, "index": 3}


def test_the_first_steps_check_the_samplers_logprobs(tmp_path, monkeypatch):
    """The first --logprob_check_steps steps recompute logp_old with the training forward and
    log the gap to the sampler's (in fp32: rounding, no token outside the clip range); later
    steps do not spend that forward."""
    monkeypatch.setattr(grpo, "score_batch", fake_scores)
    model, tok = tiny(seed=1)
    records = [{"id": str(i), "problem": f"Ava has {i} pens.", "answer": str(i)} for i in range(4)]
    out = grpo.train(tiny_run(model=save_checkpoint(str(tmp_path / "init"), model, tok),
                              batch_size=2, group_size=2, max_new_tokens=12, max_steps=2,
                              max_time=0.0, eval_data="", log_every=0, logprob_check_steps=1,
                              out_dir=str(tmp_path / "run")), records=records)
    with open(out["log"]) as f:
        first, second = [json.loads(line) for line in f]
    assert first["logprob_gap_max"] < 1e-5 and first["logprob_gap_outside_clip"] == 0.0
    assert 0.0 <= first["logprob_gap_mean"] <= first["logprob_gap_max"]
    assert not any(key.startswith("logprob_gap") for key in second)


def test_save_every_minutes_saves_on_a_clock(tmp_path, monkeypatch):
    """--save_every_minutes (here a nanosecond: every step is past it) saves after every step
    though --save_every=0; without it only the last step is saved."""
    monkeypatch.setattr(grpo, "score_batch", fake_scores)
    model, tok = tiny(seed=1)
    init = save_checkpoint(str(tmp_path / "init"), model, tok)
    records = [{"id": str(i), "problem": f"Ava has {i} pens.", "answer": str(i)} for i in range(3)]
    base = dict(model=init, batch_size=2, group_size=2, max_new_tokens=6, max_steps=3,
                max_time=0.0, eval_data="", save_every=0, log_every=0, keep_last=0)
    for minutes, saved in ((1e-12, [1, 2, 3]), (0.0, [3])):
        out = tmp_path / f"run-{minutes}"
        grpo.train(tiny_run(**base, save_every_minutes=minutes, out_dir=str(out)),
                   records=records)
        assert [step for step, _ in plumbing.checkpoints(str(out))] == saved


# where SIGTERM arrives in step 2: (what it patches, which call of it sends the signal), the
# step the run is saved at: before the first optimizer step the step is abandoned (checkpoint-1),
# after it the step finishes (checkpoint-2), and the calls of it step 2 makes in all
SIGNAL_POINTS = {"sampling": ((sample.Engine, "_step"), 3, 1, 3),
                 "update": ((grpo, "ppo_update"), 1, 1, 1),
                 "reference_pass": ((grpo, "response_logprobs"), 1, 1, 1),
                 "after_optimizer_step": ((plumbing, "optimizer_step"), 1, 2, 2)}


@pytest.mark.parametrize("where", SIGNAL_POINTS)
def test_a_signal_mid_step_saves_the_last_completed_step_and_the_resume_is_exact(tmp_path,
                                                                               monkeypatch, where):
    """SIGTERM (a cluster's preemption) arrives while step 2 runs (--save_every=0: nothing saved
    by the schedule). In its sampling (at the 3rd decode step), its KL reference's log-prob pass
    (no forward after the signal's) or its update before the first optimizer step, the step is
    abandoned and step 1 is saved, with the data position and RNGs as step 2 began; after the
    first optimizer step, step 2 finishes and is saved. The run stops; --resume=True then gives
    the weights of an uninterrupted run, bit for bit. The reward draws from the global RNG, so
    the RNGs saved must be those of step 2's start, not its abandon. KL on: the reference's
    pass runs every step."""
    def scores_with_global_noise(responses, golds, **kw):
        rows = fake_scores(responses, golds, **kw)
        for row in rows:
            row["reward"] += torch.rand(()).item()
        return rows

    monkeypatch.setattr(grpo, "score_batch", scores_with_global_noise)
    model, tok = tiny(seed=1)
    init = save_checkpoint(str(tmp_path / "init"), model, tok)
    records = [{"id": str(i), "problem": f"Ava has {i} pens.", "answer": str(i)} for i in range(5)]
    base = dict(model=init, batch_size=2, group_size=2, max_new_tokens=12, micro_batch_size=2,
                lr=1e-3, max_time=0.0, eval_data="", save_every=0, log_every=0, max_steps=4,
                kl_coef=0.1)
    full = grpo.train(tiny_run(**base, out_dir=str(tmp_path / "a")), records=records)
    (owner, name), nth_call, saved_step, step_calls = SIGNAL_POINTS[where]
    real = getattr(owner, name)
    real_step = grpo.grpo_step
    calls = []
    current = {"step": 0}

    def signalling(*args, **kwargs):
        calls.append(1)
        if current["step"] == 2 and len(calls) == nth_call:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    def counting_step(run, step):
        current["step"] = step
        calls.clear()
        return real_step(run, step)

    monkeypatch.setattr(grpo, "grpo_step", counting_step)
    monkeypatch.setattr(owner, name, signalling)
    stopped = grpo.train(tiny_run(**base, out_dir=str(tmp_path / "b")), records=records)
    assert stopped["stopped_by"] == "SIGTERM" and stopped["steps"] == saved_step
    assert len(calls) == step_calls
    assert stopped["checkpoint"] == str(tmp_path / "b" / f"checkpoint-{saved_step}")
    assert [p.name for p in (tmp_path / "b").glob("checkpoint-*")] == [f"checkpoint-{saved_step}"]
    assert len((tmp_path / "b" / "log.jsonl").read_text().splitlines()) == saved_step
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL     # the handler is restored
    monkeypatch.setattr(grpo, "grpo_step", real_step)
    monkeypatch.setattr(owner, name, real)
    resumed = grpo.train(tiny_run(**base, out_dir=str(tmp_path / "b"), resume="True"),
                         records=records)
    from safetensors.torch import load_file
    a = load_file(os.path.join(full["checkpoint"], "model.safetensors"))
    b = load_file(os.path.join(resumed["checkpoint"], "model.safetensors"))
    assert resumed["steps"] == 4 and all(torch.equal(a[k], b[k]) for k in a)
    rows = [{k: v for k, v in json.loads(line).items() if k != "elapsed" and "time" not in k}
            for line in Path(full["log"]).read_text().splitlines()]
    resumed_rows = [{k: v for k, v in json.loads(line).items()
                     if k != "elapsed" and "time" not in k}
                    for line in Path(resumed["log"]).read_text().splitlines()]
    assert resumed_rows == rows                          # the same rollouts and statistics


# --------------------------------------------------------------------------------------------------
# 2 ranks (gloo) = 1 process on the union of their rollouts

# Seconds the 2-rank run may take (~20 s on an idle 2-core machine): only a deadlock reaches it.


def union_for_one_process(per_rank: list[list], advs: list[list], ppo_mini_batches: int):
    """Mini-batch k of the 1-process run = every rank's k-th slice (ppo_update slices each rank's
    rollouts into ppo_mini_batches contiguous parts)."""
    rollouts, adv = [], []
    for k in range(ppo_mini_batches):
        for rs, ad in zip(per_rank, advs):
            lo, hi = (round(i * len(rs) / ppo_mini_batches) for i in (k, k + 1))
            rollouts += rs[lo:hi]
            adv += ad[lo:hi]
    return rollouts, adv


# name: (rank 0 rollout indices, rank 1 rollout indices, config); the pool: 4 short, 4 long rollouts
SCENARIOS = {
    "ddp_uneven": ([0, 1], [4, 5, 6, 7], dict(micro_batch_size=1, micro_batch_tokens=0)),
    "ddp_empty_rank_injected": ([], [4, 5, 2, 3], dict(micro_batch_size=1,
                                                      loss_agg_mode="seq-mean-token-mean",
                                                      train_injected=True)),
    "fsdp_uneven": ([0, 1, 2, 3], [4, 5, 6, 7], dict(micro_batch_size=2, micro_batch_tokens=70,
                                                     fsdp=True)),
}


def _scenario_cfg(extra: dict) -> GRPOConfig:
    return GRPOConfig(max_new_tokens=48, ppo_mini_batches=2, clip_ratio_high=0.28,
                      **{k: v for k, v in extra.items() if k != "fsdp"})


def _worker(folder: str):
    """One rank of the 2-rank test: for each scenario, ppo_update on this rank's share, then rank 0
    writes the full weights."""
    from plumbing import distributed
    with distributed() as info:
        _scenarios(folder, info)


def _scenarios(folder: str, info):
    import torch.distributed as dist

    with open(os.path.join(folder, "data.pkl"), "rb") as f:
        pool, advs = pickle.load(f)
    _, tok = tiny()
    tags = TagIds.from_tokenizer(tok)
    for name, (r0, r1, extra) in SCENARIOS.items():
        model, _ = tiny()
        model.load_state_dict(torch.load(os.path.join(folder, "init.pt")))
        mine = (r0, r1)[info.rank]
        cfg = _scenario_cfg(extra)
        plain = None
        if extra.get("fsdp"):
            from torch.distributed.fsdp import fully_shard
            plain = copy.deepcopy(model)
            for layer in model.model.layers:
                fully_shard(layer)
            fully_shard(model)
            train_model = model
        else:
            train_model = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(train_model.parameters(), lr=0.5)
        stats = ppo_update(train_model, opt, [pool[i] for i in mine], [advs[i] for i in mine],
                           resolved(cfg), tags=tags, pad_id=tok.pad_token_id,
                           clip_ratio_high=cfg.clip_ratio_high)
        if plain is not None:
            plumbing.sync_rollout_model(plain, train_model)       # the sampler's copy under FSDP
            model = plain
        if info.rank == 0:
            torch.save({"weights": flat_params(model), "stats": stats},
                       os.path.join(folder, f"{name}.pt"))
        dist.barrier()


def test_two_ranks_equal_one_process(tmp_path):
    model, tok = tiny()
    short = sampled_rollouts(model, tok, ["Hi", "Ann"], 2, max_new_tokens=10, seed=11)
    long = sampled_rollouts(model, tok, ["Ava has 3 boxes of 7 pens.", "Bob has 12 pens"], 2,
                            max_new_tokens=48, seed=12)
    pool = short + long
    assert max(len(r.response_ids) for r in short) < min(len(r.response_ids) for r in long[:2])
    advs = [1.0, -1.0, 0.5, -0.5, 1.5, -0.5, -1.0, 2.0]
    torch.save(model.state_dict(), tmp_path / "init.pt")
    with open(tmp_path / "data.pkl", "wb") as f:
        pickle.dump((pool, advs), f)
    torchrun_two_ranks(__file__, str(tmp_path))
    for name, (r0, r1, extra) in SCENARIOS.items():
        rollouts, adv = union_for_one_process([[pool[i] for i in r0], [pool[i] for i in r1]],
                                              [[advs[i] for i in r0], [advs[i] for i in r1]], 2)
        m = copy.deepcopy(model)
        m.load_state_dict(torch.load(tmp_path / "init.pt"))
        w, stats = run_update(m, rollouts, adv, _scenario_cfg(extra), tok)
        got = torch.load(tmp_path / f"{name}.pt")
        assert (got["weights"] - w).abs().max() <= 1e-6, name
        assert (w - flat_params(model)).abs().max() > 1e-4, name
        assert got["stats"]["loss_tokens"] == stats["loss_tokens"], name
        assert got["stats"]["loss"] == pytest.approx(stats["loss"], abs=1e-6), name


def test_problems_longer_than_the_context_are_dropped(tmp_path, monkeypatch, capsys):
    """A prompt with no room for max_new_tokens inside the context is dropped with a count; none
    fitting is an error."""
    monkeypatch.setattr(grpo, "score_batch", fake_scores)
    model, tok = tiny(seed=1)                                   # max_position_embeddings = 512
    init = save_checkpoint(str(tmp_path / "init"), model, tok)
    short = [{"id": str(i), "problem": f"Ava has {i} pens.", "answer": str(i)} for i in range(2)]
    long = [{"id": "long", "problem": "x" * 500, "answer": "1"}]   # ~520 prompt tokens: 520 + 12
    base = dict(model=init, batch_size=2, group_size=2, max_new_tokens=12, max_steps=1,
                max_time=0.0, log_every=0, eval_k=1, eval_every=0)
    out = grpo.train(tiny_run(**base, out_dir=str(tmp_path / "run")), records=short + long,
                     eval_records=short + long)
    printed = capsys.readouterr().out
    assert "train data: 1 of 3 problems have a prompt" in printed
    assert "eval data: 1 of 3 problems have" in printed
    assert "2 problems of the given records" in printed and out["steps"] == 1
    with pytest.raises(ValueError,
                       match=r"train data: 1 of 1 problems .* context \(512 tokens.* none is left"):
        grpo.train(tiny_run(**base, out_dir=str(tmp_path / "run2")), records=long,
                   eval_records=short)


def test_lr_factor_warms_up_linearly_then_follows_the_schedule():
    # warm-up 4 of 12 optimizer steps: 1/4, 2/4, 3/4, 4/4; then cosine over the 8 left, by hand:
    # step 4 -> progress 0 -> 1.0; step 8 -> progress 1/2 -> 0.5; step 12 -> 0.0; step 6 ->
    # (1 + cos(pi/4)) / 2
    f = [plumbing.lr_factor(s, 4, 12, "cosine") for s in range(13)]
    assert f[:5] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert f[8] == pytest.approx(0.5) and f[12] == pytest.approx(0.0)
    assert f[6] == pytest.approx((1 + 2 ** -0.5) / 2)
    assert all(a >= b for a, b in itertools.pairwise(f[3:]))     # never rises after the warm-up
    assert [plumbing.lr_factor(s, 0, 12, "constant") for s in (0, 5, 12)] == [1.0, 1.0, 1.0]
    assert plumbing.lr_factor(20, 4, 12, "cosine") == pytest.approx(0.0)   # past the end: stays 0


def test_resume_with_other_eval_settings_shows_no_before_after(tmp_path, monkeypatch, capsys):
    """The "before" numbers of a resumed run are the first run's: compared with an evaluation under
    other settings they would fake a change, so the summary drops them and says why."""
    monkeypatch.setattr(grpo, "score_batch", fake_scores)
    model, tok = tiny(seed=1)
    init = save_checkpoint(str(tmp_path / "init"), model, tok)
    records = [{"id": str(i), "problem": f"Ava has {i} pens.", "answer": str(i)} for i in range(2)]
    base = dict(model=init, batch_size=2, group_size=2, max_new_tokens=12, max_time=0.0,
                log_every=0, eval_every=0, out_dir=str(tmp_path / "run"))
    first = grpo.train(tiny_run(**base, max_steps=1, eval_k=1), records=records,
                       eval_records=records)
    assert first["eval_before"]["settings"][2] == 1 and first["eval_after"]
    same = grpo.train(tiny_run(**base, max_steps=2, eval_k=1, resume="True"), records=records,
                      eval_records=records)
    assert same["eval_before"] == first["eval_before"]                    # kept: same settings
    other = grpo.train(tiny_run(**base, max_steps=3, eval_k=2, resume="True"), records=records,
                       eval_records=records)
    assert other["eval_before"] == {} and "shows no before/after table" in capsys.readouterr().out


def test_wandb_gets_the_rows_of_log_jsonl(tmp_path, monkeypatch, wandb_rows):
    monkeypatch.setattr(grpo, "score_batch", fake_scores)
    model, tok = tiny(seed=1)
    records = [{"id": str(i), "problem": f"Ava has {i} pens.", "answer": str(i)} for i in range(3)]
    out = grpo.train(tiny_run(model=save_checkpoint(str(tmp_path / "init"), model, tok),
                                batch_size=2, group_size=2, max_new_tokens=12, max_steps=2,
                                max_time=0.0, eval_data="", log_every=0,
                                out_dir=str(tmp_path / "run"), wandb_project="test"),
                     records=records)
    logged = [json.loads(line) for line in Path(out["log"]).read_text().splitlines()]
    assert wandb_rows == logged and len(wandb_rows) == 2
    assert {"step", "reward_mean", "loss", "kl", "time_sample"} <= wandb_rows[0].keys()


def test_resuming_a_finished_run_names_its_checkpoint_and_adds_no_row(tmp_path, monkeypatch,
                                                                      capsys):
    """It used to print "checkpoint: None (python eval.py --model=None)" and log the final
    evaluation again; now it also says why nothing trains. --resume takes the command line's bool
    words ("yes" was a path)."""
    monkeypatch.setattr(grpo, "score_batch", fake_scores)
    model, tok = tiny(seed=1)
    init = save_checkpoint(str(tmp_path / "init"), model, tok)
    records = [{"id": str(i), "problem": f"Ava has {i} pens.", "answer": str(i)} for i in range(2)]
    base = dict(model=init, batch_size=2, group_size=2, max_new_tokens=12, max_time=0.0,
                log_every=0, eval_k=1, eval_every=0, max_steps=1, out_dir=str(tmp_path / "run"))
    first = grpo.train(tiny_run(**base), records=records, eval_records=records)
    rows = Path(first["log"]).read_text()
    capsys.readouterr()
    again = grpo.train(tiny_run(**base, resume="yes"), records=records, eval_records=records)
    assert again["checkpoint"] == first["checkpoint"] and again["eval_after"] is None
    assert Path(first["log"]).read_text() == rows
    assert f"note: {first['checkpoint']} is at step 1 and this run has 1 steps: nothing is left " \
        "to train (raise --max_steps to go on)" in capsys.readouterr().out


def test_a_diverging_grpo_run_stops_before_the_bad_step_and_keeps_its_checkpoints(tmp_path,
                                                                                  monkeypatch):
    """The shared optimizer step refuses a non-finite gradient norm; here through ppo_update: step
    2's loss is NaN."""
    monkeypatch.setattr(grpo, "score_batch", fake_scores)
    real, calls = grpo.micro_batch_loss, []
    def nan_at_step_2(*args, **kw):
        loss, stats = real(*args, **kw)
        calls.append(1)
        return (loss * float("nan") if len(calls) > 2 else loss), stats   # 2 micro-batches a step
    monkeypatch.setattr(grpo, "micro_batch_loss", nan_at_step_2)
    model, tok = tiny(seed=1)
    records = [{"id": str(i), "problem": f"Ava has {i} pens.", "answer": str(i)} for i in range(2)]
    with pytest.raises(ValueError, match="the gradient norm is nan: the loss diverged"):
        grpo.train(tiny_run(model=save_checkpoint(str(tmp_path / "init"), model, tok),
                              batch_size=2, group_size=2, max_new_tokens=12, max_steps=3,
                              max_time=0.0, eval_data="", log_every=0, save_every=1,
                              ppo_mini_batches=1, micro_batch_size=2,
                              out_dir=str(tmp_path / "run")),
                   records=records)
    assert sorted(p for p in os.listdir(tmp_path / "run") if p.startswith("checkpoint")) == \
        ["checkpoint-1"]
    assert len(calls) == 4


def test_a_resume_refuses_a_kl_reference_inside_out_dir(tmp_path, monkeypatch):
    """Resumed with --model=<its own checkpoint-1>, a run pruned that reference and could not be
    resumed again."""
    monkeypatch.setattr(grpo, "score_batch", fake_scores)
    model, tok = tiny(seed=1)
    records = [{"id": str(i), "problem": f"Ava has {i} pens.", "answer": str(i)} for i in range(2)]
    base = dict(batch_size=2, group_size=2, max_new_tokens=12, max_time=0.0, eval_data="",
                log_every=0, save_every=1, out_dir=str(tmp_path / "run"))
    grpo.train(tiny_run(model=save_checkpoint(str(tmp_path / "init"), model, tok), max_steps=2,
                          **base),
               records=records)
    with pytest.raises(ValueError, match="--model: .* -> .*run/checkpoint-1"):   # another model
        grpo.train(tiny_run(model=str(tmp_path / "run" / "checkpoint-1"), max_steps=4,
                              resume="True", **base),
                   records=records)
    with pytest.raises(ValueError, match="is inside --out_dir"):
        grpo.train(tiny_run(model=str(tmp_path / "run" / "checkpoint-1"), max_steps=4,
                              resume="True", allow_changes="model", **base),
                   records=records)
    assert sorted(os.listdir(tmp_path / "run")) == ["checkpoint-1", "checkpoint-2", "log.jsonl",
                                                    "settings.json"]


def test_a_seen_run_that_never_leaves_the_easy_stage_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(grpo, "score_batch", fake_scores)
    model, tok = tiny(seed=1)
    records = [{"id": str(i), "problem": f"Ava has {i} pens.", "answer": str(i)} for i in range(2)]
    grpo.train(tiny_run(model=save_checkpoint(str(tmp_path / "init"), model, tok), recipe="seen",
                          easy_steps=2, easy_data="synthetic:easy:test", batch_size=2,
                          group_size=2, max_new_tokens=12, max_steps=2, max_time=0.0,
                          eval_data="", log_every=0, save_every=0,
                          out_dir=str(tmp_path / "run")),
               records=records)
    assert "note: --easy_steps=2 >= --max_steps=2: the run never leaves the easy-RL stage" in \
        capsys.readouterr().out


def test_a_bad_batch_flag_stops_before_an_earlier_run_is_moved(tmp_path, monkeypatch):
    """... and before the weights load (a range error used to wait for a large model to load)."""
    model, tok = tiny(seed=1)
    init = save_checkpoint(str(tmp_path / "init"), model, tok)
    monkeypatch.setattr(plumbing, "load_model",
                        lambda *a, **k: pytest.fail("the weights loaded before the range check"))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "log.jsonl").write_text('{"step": 1}\n')
    for flag in ("batch_size", "group_size", "ppo_mini_batches", "micro_batch_size", "max_steps"):
        with pytest.raises(ValueError, match=f"--{flag}=0: must be at least 1"):
            grpo.train(tiny_run(model=init, out_dir=str(tmp_path / "run"), **{flag: 0}),
                       records=[])
    for flag in ("generate_batch_size", "eval_samples"):
        with pytest.raises(ValueError, match=f"--{flag}=-1: must be at least 0"):
            grpo.train(tiny_run(model=init, out_dir=str(tmp_path / "run"), **{flag: -1}),
                       records=[])
    # the sampler's own settings: a bad --top_k once failed only after the earlier run moved and
    # the first evaluation
    for flag, value in [("temperature", -1.0), ("eval_temperature", float("nan")),
                        ("temperature", float("inf")), ("top_k", -1), ("top_p", 0.0),
                        ("max_blocks", -1), ("num_paths", 1)]:
        with pytest.raises(ValueError, match=f"--{flag}={value}: must be "):
            grpo.train(tiny_run(model=init, out_dir=str(tmp_path / "run"), **{flag: value}),
                       records=[])
    for flag, value, least in [("clip_ratio_low", -0.1, 0), ("kl_coef", -1.0, 0),
                               ("grad_clip", -1.0, 0), ("clip_ratio_low", float("nan"), 0),
                               ("kl_coef", float("nan"), 0), ("warmup_steps", -5, 0),
                               ("easy_steps", -3, 0),
                               ("save_every", -1, 0), ("keep_last", -1, 0),
                               ("clip_ratio_c", 0.5, 1)]:
        finite = "" if math.isfinite(value) else "a finite number, "
        with pytest.raises(ValueError, match=f"--{flag}={value}: must be {finite}at least {least}"):
            grpo.train(tiny_run(model=init, out_dir=str(tmp_path / "run"), **{flag: value}),
                       records=[])
    # learned nothing
    with pytest.raises(ValueError, match="--temperature=0: GRPO compares the responses of a group"):
        grpo.train(tiny_run(model=init, out_dir=str(tmp_path / "run"), temperature=0.0),
                   records=[])
    with pytest.raises(ValueError, match="^--lr=inf: must be a finite number, above 0"):
        grpo.train(tiny_run(model=init, out_dir=str(tmp_path / "run"), lr=float("inf")),
                   records=[])
    # empty optimizer steps
    with pytest.raises(ValueError, match="--ppo_mini_batches=9 is more than the 8 rollouts"):
        grpo.train(tiny_run(model=init, out_dir=str(tmp_path / "run"), batch_size=2, group_size=4,
                              ppo_mini_batches=9), records=[])
    # it trained on zeros
    with pytest.raises(ValueError, match="--group_size=1: .* every advantage is 0"):
        grpo.train(tiny_run(model=init, out_dir=str(tmp_path / "run"), group_size=1), records=[])
    assert os.listdir(tmp_path / "run") == ["log.jsonl"]


if __name__ == "__main__":                   # torchrun worker of test_two_ranks_equal_one_process
    _worker(sys.argv[1])
