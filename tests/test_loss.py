"""The losses without the full logits (attention.token_scores): the log-probs, entropies and
gradients equal the full-logits path they replace (the model's (B, L, V) logits, then
log softmax), whatever the chunk size, in both masks, for every loss aggregation, with and without
the KL term, for a tied and an untied LM head and a model that soft-caps its logits; and our LM
head on the last hidden states is the model's."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from transformers import Gemma2Config, Gemma2ForCausalLM, LlamaConfig, LlamaForCausalLM

import grpo
import sft
from attention import TagIds, structured_forward, token_logprobs, token_scores
from data import collate
from grpo import GRPOConfig, collate_rollouts, micro_batch_loss
from model import add_parallel_tags, build_char_tokenizer
from sample import generate

RELATIVE = 1e-6          # the bound on a gradient's relative difference
SMALL_CHUNK = 7          # several chunks per micro-batch, and a last one that is short


def tiny(kind: str = "qwen3", seed: int = 0):
    """A small random model with the six tags: the default Qwen3 (tied head), a Llama with an
    untied head, or a Gemma2 that soft-caps its final logits."""
    tok = build_char_tokenizer()
    torch.manual_seed(seed)
    common = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(tie_word_embeddings=False, **common))
    elif kind == "gemma2":
        model = Gemma2ForCausalLM(Gemma2Config(head_dim=16, final_logit_softcapping=5.0,
                                               query_pre_attn_scalar=16, **common))
    else:
        from model import load_model
        model, tok = load_model("tiny", seed=seed)
        return model.train(), tok
    add_parallel_tags(model, tok, seed=seed)
    model.set_attn_implementation("eager" if kind == "gemma2" else "sdpa")
    return model.train(), tok


def rollouts_of(model, tok, mode: str):
    model.eval()
    prompts = ["Which two of 4 9 5 1 make 9?\n", "Which two of 3 1 2 8 6 make 5?\n"]
    out = generate(model, tok, prompts, group_size=3, mode=mode, max_new_tokens=40, seed=1)
    model.train()
    return out


def full_logits_scores(model, mb, tags, mode, temperature=1.0):
    """The path the chunked forward replaces: the model's full logits, then log softmax."""
    logits = structured_forward(model, mb.input_ids, mb.attention_mask, mb.prompt_lengths, tags,
                                mode)
    selected = mb.loss_mask.bool()
    z = logits[:, :-1][selected].float() / temperature
    logprobs = token_logprobs(z, mb.input_ids[:, 1:][selected])
    entropy = torch.logsumexp(z, -1) - (z.softmax(-1) * z).sum(-1)
    return logprobs, entropy.detach()


def gradient(model, loss) -> torch.Tensor:
    model.zero_grad()
    loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("mode", ["seen", "unseen"])
@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean",
                                           "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_grpo_loss_gradient_equals_the_full_logits_path(mode, loss_agg_mode, kl_coef):
    model, tok = tiny()
    tags = TagIds.from_tokenizer(tok)
    rollouts = rollouts_of(model, tok, mode)
    advantages = torch.linspace(-1.0, 1.0, len(rollouts))
    mb = collate_rollouts(rollouts, advantages, tok.pad_token_id)
    cfg = GRPOConfig(max_new_tokens=40, loss_agg_mode=loss_agg_mode, kl_coef=kl_coef,
                     temperature=0.8, logit_chunk_tokens=SMALL_CHUNK)
    if kl_coef:
        mb.ref_logprobs = mb.old_logprobs - 0.3 * mb.loss_mask     # a reference 0.3 nats away
    mb.loss_weights, denominator = grpo.loss_weights(mb.loss_mask, loss_agg_mode,
                                                     cfg.max_new_tokens)
    reference = full_logits_scores(model, mb, tags, mode, cfg.temperature)
    loss_ref, stats_ref = micro_batch_loss(*reference, mb, cfg, 0.28, denominator)
    grad_ref = gradient(model, loss_ref)
    chunked = token_scores(model, mb, tags, mode, mb.loss_mask.bool(), cfg.temperature,
                         cfg.logit_chunk_tokens)
    loss, stats = micro_batch_loss(*chunked, mb, cfg, 0.28, denominator)
    grad = gradient(model, loss)
    assert int(mb.loss_mask.sum()) > 3 * SMALL_CHUNK              # several chunks
    assert torch.allclose(chunked[0], reference[0], rtol=0, atol=1e-6)
    assert torch.allclose(chunked[1], reference[1], rtol=0, atol=1e-5)
    assert stats["entropy"] == pytest.approx(stats_ref["entropy"], rel=1e-6)
    assert (grad - grad_ref).norm() <= RELATIVE * grad_ref.norm()
    assert grad_ref.norm() > 0


@pytest.mark.parametrize("kind", ["qwen3", "llama", "gemma2"])
@pytest.mark.parametrize("mode", ["seen", "unseen"])
def test_sft_nll_and_gradient_equal_the_full_logits_path(kind, mode):
    """Tied (Qwen3) and untied (Llama) heads, and Gemma2's soft-capped logits."""
    model, tok = tiny(kind)
    tags = TagIds.from_tokenizer(tok)
    rollouts = rollouts_of(model, tok, mode)
    batch = collate(rollouts, tok.pad_token_id)
    logits = structured_forward(model, batch.input_ids, batch.attention_mask,
                                batch.prompt_lengths, tags, mode)
    targets = batch.input_ids[:, 1:]
    nll = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), targets.flatten(),
                          reduction="none")
    nll_ref = (nll.view_as(targets) * batch.loss_mask[:, 1:]).sum()
    grad_ref = gradient(model, nll_ref)
    nll_sum, count = sft.response_nll(model, batch, tags, mode, chunk_tokens=SMALL_CHUNK)
    grad = gradient(model, nll_sum)
    assert count == batch.loss_mask[:, 1:].sum()
    assert nll_sum.item() == pytest.approx(nll_ref.item(), rel=1e-6)
    assert (grad - grad_ref).norm() <= RELATIVE * grad_ref.norm()


def test_no_loss_token_still_reaches_every_parameter():
    """An empty micro-batch (a rank with fewer rollouts pads with them) has a loss of 0 whose
    backward runs and gives every parameter a zero gradient: DDP waits for all of them."""
    model, tok = tiny()
    tags = TagIds.from_tokenizer(tok)
    mb = grpo.empty_micro_batch(tok.pad_token_id)
    mb.loss_weights = mb.loss_mask
    logprobs, entropy = token_scores(model, mb, tags, "unseen", mb.loss_mask.bool())
    loss, stats = micro_batch_loss(logprobs, entropy, mb, GRPOConfig(max_new_tokens=8), 0.2, 0.0)
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and g.abs().sum() == 0 for g in grads)
    assert stats["tokens"] == 0.0 and logprobs.shape == (0,)


@pytest.mark.parametrize("kind", ["qwen3", "llama", "gemma2"])
def test_our_lm_head_on_the_last_hidden_states_is_the_models(kind):
    """The training forward takes the last of the model's hidden states and applies the LM head
    itself (attention.chunked_head_scores): for a tied head, an untied one and soft-capped logits
    that equals the model's own logits at every position (checked here once, not in every
    forward)."""
    from attention import final_logit_transform
    model, tok = tiny(kind)
    ids = torch.tensor([tok.encode("Which two of 1 2 make 3?\n3+1")])
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
        head = model.get_output_embeddings()
        ours = final_logit_transform(model.config)(
            F.linear(out.hidden_states[-1], head.weight, head.bias).float())
    assert torch.allclose(ours, out.logits.float(), atol=1e-5, rtol=1e-5)


def test_the_chunk_setting_is_checked():
    with pytest.raises(ValueError, match="--logit_chunk_tokens=0: must be at least 1"):
        grpo.resolve_defaults(GRPOConfig(logit_chunk_tokens=0, preset="tiny"))
    cfg = dataclasses.replace(sft.SFTConfig(), logit_chunk_tokens=0)
    with pytest.raises(ValueError, match="--logit_chunk_tokens=0: must be at least 1"):
        sft.resolve_defaults(cfg)
