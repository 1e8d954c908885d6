"""scripts/gpu/memory_plan.py: each formula against what the code really allocates at small shapes
on CPU (within 5%; FSDP2's gradients on 2 gloo ranks exactly), and the command line, whose plan
without flags is the README's table.

Run as a script (`torchrun --nproc_per_node=2 tests/test_memory_plan.py <dir>`) it is the worker
of the 2-rank gradient test."""
import copy
import json
import os
import re
import subprocess
import sys
import types
import weakref

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)                     # also when torchrun runs this file as a script

import pytest
import torch
from conftest import torchrun_two_ranks
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from transformers import Qwen3Config, Qwen3ForCausalLM

import attention
import grpo
import plumbing
import sample
from attention import TagIds
from model import frozen_copy, load_model
from scripts.gpu import memory_plan as mp

TOLERANCE = 0.05              # a formula within 5% of the measured bytes
SMALL = dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, intermediate_size=160,
             max_position_embeddings=512, tie_word_embeddings=True)
TAGS = TagIds(990, 991, 992, 993, 994, 995, (10,), 1)   # ids inside SMALL's vocabulary
PROMPT = 10                   # prompt tokens of each training row


def close(formula: float, measured: float) -> bool:
    return abs(formula - measured) <= TOLERANCE * measured


def small_model(dtype=torch.float32, **changes) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**{**SMALL, **changes}))
    model.set_attn_implementation("sdpa")
    return model.to(dtype).train()


def training_batch(rows: int, length: int, vocab: int) -> types.SimpleNamespace:
    """What attention.token_scores reads of a batch: random ids, no padding, a PROMPT-token
    prompt."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(20, vocab - 20, (rows, length), generator=generator)
    return types.SimpleNamespace(input_ids=ids, attention_mask=torch.ones_like(ids),
                                 prompt_lengths=[PROMPT] * rows)


def loss_positions(batch) -> torch.Tensor:
    """The response's targets, as GRPO's loss mask: every position from the prompt's last."""
    selected = torch.zeros(batch.input_ids.shape[0], batch.input_ids.shape[1] - 1,
                           dtype=torch.bool)
    selected[:, PROMPT - 1:] = True
    return selected


class LiveBytes(TorchDispatchMode):
    """Bytes of the live storages that ops produced and `keep` accepts, and their peak: each
    storage is counted once, from the op that made it until it is freed."""

    def __init__(self, keep):
        super().__init__()
        self.keep = keep
        self.live = {}
        self.now = 0
        self.peak = 0
        self.largest = 0

    def _free(self, pointer: int):
        self.now -= self.live.pop(pointer, 0)

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not (isinstance(t, torch.Tensor) and self.keep(t)):
                continue
            storage = t.untyped_storage()
            pointer = storage.data_ptr()
            if pointer and pointer not in self.live:
                self.live[pointer] = storage.nbytes()
                self.now += storage.nbytes()
                self.largest = max(self.largest, storage.nbytes())
                weakref.finalize(storage, self._free, pointer)
        self.peak = max(self.peak, self.now)
        return out


class HeldBytes(TorchDispatchMode):
    """Bytes held now by the storages of the tensors that ops produced while the mode was on
    (each storage once, at its size now: FSDP2 frees buffers by resizing them to 0)."""

    def __init__(self):
        super().__init__()
        self.tensors = []

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.tensors.append(weakref.ref(t))
        return out

    def held(self) -> int:
        sizes = {}
        for ref in self.tensors:
            t = ref()
            if t is not None:
                storage = t.untyped_storage()
                sizes[storage.data_ptr()] = storage.nbytes()
        return sum(sizes.values())


# ---------------------------------------------------------------------------------------------
# Shapes and the training state


@pytest.mark.parametrize("tied", [True, False])
def test_parameter_count_is_the_models(tied):
    model = small_model(tie_word_embeddings=tied)
    shape = mp.shape_from_config("small", model.config)
    params = list(model.parameters())                       # tied: one tensor
    assert mp.parameter_count(shape) == sum(p.numel() for p in params)
    assert mp.parameter_tensors(shape) == len(params)
    assert mp.weights_bytes(shape) == sum(p.numel() * p.element_size() for p in params)
    assert mp.loaded_weights_bytes(shape) == mp.weights_bytes(shape)   # what load_run loads


def test_builtin_shapes_are_the_real_models():
    """Qwen3-4B: 4.02B parameters (tied), 144 KiB of bf16 keys and values per cache slot (the
    issue's figure); Qwen3-0.6B: 0.60B."""
    for name, billions in [("qwen3-4b", 4.02), ("qwen3-0.6b", 0.60)]:
        shape = mp.load_shape(name)
        with torch.device("meta"):
            model = Qwen3ForCausalLM(Qwen3Config(**mp.BUILTIN[name]))
        assert mp.parameter_count(shape) == sum(p.numel() for p in model.parameters())
        assert round(mp.parameter_count(shape) / 1e9, 2) == billions
    four_b = mp.load_shape("qwen3-4b")
    assert mp.kv_cache_bytes(four_b, 1, 1) - mp.INT64 == 144 * 1024


def test_a_config_folder_is_read(tmp_path):
    Qwen3Config(**SMALL).save_pretrained(tmp_path)
    assert mp.load_shape(str(tmp_path)).hidden == SMALL["hidden_size"]
    with pytest.raises(OSError, match="config.json"):
        mp.load_shape(str(tmp_path / "missing"))


def test_adamw_state_after_one_step():
    model = small_model()
    shape = mp.shape_from_config("small", model.config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(input_ids=torch.randint(0, 900, (2, 8))).logits.sum().backward()
    optimizer.step()
    state = sum(t.numel() * t.element_size() for s in optimizer.state.values()
                for t in s.values() if torch.is_tensor(t))
    assert close(mp.adam_state_bytes(shape), state)
    assert mp.adam_state_bytes(shape, world_size=4, fsdp=True) < state / 3


def not_one_of(tensors: list):
    """A LiveBytes filter: a tensor whose storage is none of `tensors`' (in-place ops return
    their input, which a step does not allocate)."""
    pointers = {t.untyped_storage().data_ptr() for t in tensors}

    def keep(t: torch.Tensor) -> bool:
        return t.untyped_storage().data_ptr() not in pointers

    return keep


@pytest.mark.parametrize("foreach", [True, False])
def test_adamw_temporary_is_what_a_step_allocates(foreach):
    """The optimizer step's peak beyond AdamW's state (its second step: the state exists): the
    multi-tensor path (CUDA's default) holds sqrt(exp_avg_sq) of every parameter, the
    single-tensor one (CPU's) two tensors of the largest parameter."""
    model = small_model()
    shape = mp.shape_from_config("small", model.config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=foreach)
    for _ in range(2):
        model(input_ids=torch.randint(0, 900, (2, 8))).logits.sum().backward()
        existing = [*model.parameters(), *(p.grad for p in model.parameters())]
        existing += [t for state in optimizer.state.values() for t in state.values()]
        live = LiveBytes(not_one_of(existing))
        with live:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    assert live.peak == mp.adamw_temporary_bytes(shape, cuda=foreach)
    assert mp.adamw_temporary_bytes(shape, world_size=4, fsdp=True, cuda=foreach) == live.peak // 4


def copy_peak(make_copy, model) -> int:
    """The most bytes alive at once, of those made while `make_copy(model)` runs (views of the
    model's own tensors left out)."""
    live = LiveBytes(not_one_of([*model.parameters(), *model.buffers()]))
    with live:
        make_copy(model)
    return live.peak


def test_the_bf16_copies_never_hold_a_second_fp32_model():
    """Setup: grpo.setup's sampler copy and KL reference (model.frozen_copy) cast each parameter
    as it is copied: their peak is the bf16 copy (rollout_copy_bytes, kl_reference_bytes), not
    the fp32 deepcopy that .to(bf16) then halved. Tied weights stay tied; the rotary frequencies
    stay fp32."""
    model = small_model()
    shape = mp.shape_from_config("small", model.config)
    peak = copy_peak(lambda m: frozen_copy(m, torch.bfloat16), model)
    assert close(mp.rollout_copy_bytes(shape, fsdp=True, cuda=True), peak)
    assert close(mp.kl_reference_bytes(shape, 0.1, fsdp=True, cuda=True), peak)
    assert mp.kl_reference_bytes(shape, 0.1, fsdp=False, cuda=True) == mp.weights_bytes(shape)
    assert mp.kl_reference_bytes(shape, 0.0, fsdp=True) == 0
    old_way = copy_peak(lambda m: copy.deepcopy(m).to(torch.bfloat16), model)
    embedding_in_bf16 = shape.vocab * shape.hidden * mp.BF16     # the fp32 copy, then its
    assert close(mp.weights_bytes(shape) + embedding_in_bf16, old_way)   # largest tensor cast
    copied = frozen_copy(model, torch.bfloat16)
    assert copied.lm_head.weight is copied.model.embed_tokens.weight
    assert copied.model.embed_tokens.weight.dtype == torch.bfloat16
    assert copied.model.rotary_emb.inv_freq.dtype == torch.float32
    assert not copied.training
    assert not any(p.requires_grad for p in copied.parameters())


def test_setup_and_the_optimizer_step_phases():
    """Qwen3-4B, 8 ranks, FSDP on CUDA, kl_coef > 0. Setup: the whole fp32 model each rank loads,
    the bf16 sampler copy and the bf16 reference, below the sampling peak. The optimizer step:
    the sharded weights, AdamW's state and the two copies, the sharded gradients and AdamW's
    temporary (one more sharded fp32 model)."""
    st, _ = mp.make_setting(["--kl_coef=0.1"])
    totals = mp.phase_totals(mp.plan(st))
    n = mp.parameter_count(st.shape)
    shard = n * mp.FP32 // 8
    copies = 2 * n * mp.BF16
    assert totals["setup"] == n * mp.FP32 + copies
    assert totals["setup"] < totals["sampling"]
    adam = 2 * shard + mp.parameter_tensors(st.shape) * mp.ADAM_STEP_BYTES
    assert totals["optimizer step"] == shard + adam + copies + shard + shard


# ---------------------------------------------------------------------------------------------
# FSDP2's gradients while micro-batches accumulate, on 2 gloo ranks


def gradient_worker(folder: str) -> None:
    """Run by torchrun in 2 processes: SMALL wrapped as plumbing.wrap_model wraps it (FSDP2), a
    backward with plumbing.grad_sync off (every micro-batch but the last) and one with it on; the
    gradient bytes each rank holds after each, then after the same two with FSDP2's own no-sync.
    Rank r writes folder/rank<r>.json."""
    with plumbing.distributed() as d:
        model = small_model()
        cfg = types.SimpleNamespace(fsdp=True, grad_checkpointing=False)
        run = types.SimpleNamespace(cfg=cfg, dist=d, model=model, train_model=None)
        plumbing.wrap_model(run)
        wrapped = run.train_model
        generator = torch.Generator().manual_seed(d.rank)
        ids = torch.randint(0, SMALL["vocab_size"], (2, 16), generator=generator)
        held = {}
        for way in ("grad_sync", "fsdp_no_sync"):
            tracker = HeldBytes()
            with tracker:
                for last in (False, True):
                    if way == "fsdp_no_sync":
                        wrapped.set_requires_gradient_sync(last)
                    with plumbing.grad_sync(wrapped, enabled=last):
                        wrapped(input_ids=ids).logits.float().logsumexp(-1).sum().backward()
                    held[f"{way}, last={last}"] = tracker.held()
            wrapped.zero_grad(set_to_none=True)
        with open(os.path.join(folder, f"rank{d.rank}.json"), "w") as f:
            json.dump(held, f)


def test_fsdp_ranks_hold_their_gradient_shard_while_accumulating(tmp_path):
    """plumbing.grad_sync under FSDP2: after a backward with sync off each rank holds its half of
    the fp32 gradients (gradient_bytes), not the whole (FSDP2's no-sync holds every parameter's
    whole fp32 gradient until the synced backward: loaded_weights_bytes, 16.1 GB for Qwen3-4B)."""
    torchrun_two_ranks(__file__, str(tmp_path))
    shape = mp.shape_from_config("small", small_model().config)
    shard = mp.gradient_bytes(shape, world_size=2, fsdp=True)
    whole = mp.loaded_weights_bytes(shape)
    assert shard * 2 == whole == 4 * mp.parameter_count(shape)
    for rank in range(2):
        with open(tmp_path / f"rank{rank}.json") as f:
            held = json.load(f)
        assert held == {"grad_sync, last=False": shard, "grad_sync, last=True": shard,
                        "fsdp_no_sync, last=False": whole, "fsdp_no_sync, last=True": shard}


# ---------------------------------------------------------------------------------------------
# The sampler


@pytest.fixture
def slot_caches(monkeypatch) -> list:
    """Every sample.SlotCache made while the test runs."""
    made = []

    class Recorded(sample.SlotCache):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(sample, "SlotCache", Recorded)
    return made


def cache_bytes(cache) -> int:
    buffers = [*cache.keys, *cache.values, cache.owner_buffer]
    return sum(b.numel() * b.element_size() for b in buffers)


@pytest.mark.parametrize("regime", ["fp32", "autocast", "bf16"])
def test_kv_cache_is_the_slot_cache(slot_caches, regime):
    """rows = prompts x group, capacity = longest prompt + budget + 1; the dtypes of each regime
    (CPU autocast stands in for CUDA's: an fp32 model caches fp32 keys and bf16 values)."""
    model, tok = load_model("tiny", device="cpu")
    if regime == "bf16":
        model.to(torch.bfloat16)
    shape = mp.shape_from_config("tiny", model.config)
    prompts = ["Which two of 1 2 3 make 5?\n", "ab\n"]
    budget = 12
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=regime != "fp32"):
        sample.generate(model, tok, prompts, group_size=3, max_new_tokens=budget, seed=0)
    cache = slot_caches[-1]
    longest = max(len(tok.encode(p, add_special_tokens=False)) for p in prompts)
    capacity = mp.cache_capacity(longest, budget)
    key_bytes, value_bytes = mp.cache_element_bytes(regime)
    assert cache.capacity == capacity
    assert cache.keys[0].element_size() == key_bytes
    assert cache.values[0].element_size() == value_bytes
    assert close(mp.kv_cache_bytes(shape, 6, capacity, key_bytes, value_bytes), cache_bytes(cache))


def test_grpo_cache_rows_follow_generate_batch_size(slot_caches):
    """A rank's prompts go to generate in calls of generate_batch_size: the largest cache has
    generate_batch_size x group_size rows."""
    model, tok = load_model("tiny", device="cpu")
    cfg = grpo.resolve_defaults(grpo.GRPOConfig(batch_size=4, group_size=3, generate_batch_size=3,
                                                max_new_tokens=8, preset="tiny"))
    prompts = [tok.encode(f"{i} + {i}\n", add_special_tokens=False) for i in range(4)]
    grpo.sample_rollouts(model, tok, prompts, cfg, seed=0)
    rows = [c.owner_buffer.shape[0] for c in slot_caches]
    assert rows == [9, 3]
    assert max(rows) == mp.sampling_prompts(cfg, world_size=1) * cfg.group_size


def test_decode_step_logits(slot_caches):
    """The (queries, vocab) tensors of a decode step at their peak, with the first step's and the
    prefill's logits (sequential mode: one query a row; no row leaves early)."""
    model, tok = load_model("tiny", device="cpu")
    shape = mp.shape_from_config("tiny", model.config)
    group = 6
    budget = 20
    live = LiveBytes(lambda t: t.dim() >= 2 and t.shape[-1] == shape.vocab)
    with live:
        sample.generate(model, tok, ["Which two of 1 2 3 make 5?\n", "ab\n"], group_size=group,
                        mode="sequential", max_new_tokens=budget, min_new_tokens=budget, seed=0)
    assert close(mp.decode_logit_bytes(shape, 2, 2 * group, 1, "fp32"), live.peak)


# ---------------------------------------------------------------------------------------------
# Training: activations, the loss's logits, the LM head's gradient


def saved_for_backward(model, batch, regime: str, checkpointing: bool) -> tuple[int, int]:
    """(activation bytes, bf16 weight-copy bytes) alive when the backward starts: the tensors
    autograd saved during one training forward, and what gradient checkpointing keeps (the layers'
    inputs and keyword arguments), each storage once, parameters left out."""
    if checkpointing:
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False})
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    param_shapes = {tuple(p.shape) for p in model.parameters()}
    param_shapes |= {tuple(reversed(shape)) for shape in param_shapes}
    held = []

    def pack(t):
        held.append(weakref.ref(t))
        return t

    def layer_inputs(module, args, kwargs):
        for t in tree_flatten((args, kwargs))[0]:
            if torch.is_tensor(t):
                held.append(weakref.ref(t))

    hooks = [layer.register_forward_pre_hook(layer_inputs, with_kwargs=True)
             for layer in model.model.layers]
    selected = loss_positions(batch)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if regime == "fp32":
            logprobs, _ = attention.token_scores(model, batch, TAGS, "unseen", selected)
        else:                       # what attention.token_scores does on CUDA, with CPU autocast
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logprobs, _ = attention.token_scores(model, batch, TAGS, "unseen", selected,
                                                      dtype=torch.bfloat16)
    for hook in hooks:
        hook.remove()
    storages = {}
    for ref in held:
        t = ref()
        if t is None or t.untyped_storage().data_ptr() in params:
            continue
        copy_of_weight = t.dtype == torch.bfloat16 and tuple(t.shape) in param_shapes
        storages[t.untyped_storage().data_ptr()] = (t.untyped_storage().nbytes(), copy_of_weight)
    activations = sum(n for n, weight in storages.values() if not weight)
    weights = sum(n for n, weight in storages.values() if weight)
    logprobs.sum().backward()          # the graph is whole: the backward runs
    return activations, weights


@pytest.mark.parametrize("regime", ["fp32", "autocast", "bf16"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_activations_are_what_autograd_saves(regime, checkpointing):
    """Without checkpointing: every layer's saved tensors and those outside the layers. With it:
    what stays until the backward (the layers' inputs, the mask, the rotary tables); the recompute
    window (one layer's activations again, during its backward) is in activation_bytes but alive
    only later, so it is taken out here. autocast: fp32 weights under bf16 autocast (no FSDP);
    bf16: bf16 parameters (FSDP2's compute dtype)."""
    rows = 2
    length = 40
    dtype = torch.bfloat16 if regime == "bf16" else torch.float32
    model = small_model(dtype)
    shape = mp.shape_from_config("small", model.config)
    batch = training_batch(rows, length, shape.vocab)
    loss_tokens = int(loss_positions(batch).sum())
    activations, weight_copies = saved_for_backward(model, batch, regime, checkpointing)
    formula = mp.activation_bytes(shape, rows, length, loss_tokens, regime, checkpointing)
    if checkpointing:
        formula -= mp.layer_activation_bytes(shape, rows * length, regime)
    assert close(formula, activations), (formula, activations)
    if regime == "autocast" and not checkpointing:     # the head's copy lives in its chunks
        copies = mp.autocast_weight_copy_bytes(shape, regime)
        assert close(copies - shape.vocab * shape.hidden * mp.BF16, weight_copies)


def test_checkpointing_keeps_far_less_at_paper_scale():
    shape = mp.load_shape("qwen3-4b")
    full = mp.activation_bytes(shape, 2, 3512, 6000, "bf16", checkpointing=False)
    kept = mp.activation_bytes(shape, 2, 3512, 6000, "bf16", checkpointing=True)
    assert 10 * kept < full


@pytest.mark.parametrize("regime", ["fp32", "autocast", "bf16"])
def test_loss_logits_are_one_chunk(regime):
    """The (chunk, vocab) tensors of the loss during one forward and backward: never more than
    LOGIT_BUFFERS of one chunk at a time, none larger than one chunk. The LM head's (vocab,
    hidden) gradients at their peak: .grad (fp32 parameters) and head_gradient_bytes."""
    vocab = 5000
    chunk = 48                        # != hidden, so the head's (hidden, vocab) views are not
    dtype = torch.bfloat16 if regime == "bf16" else torch.float32
    model = small_model(dtype, vocab_size=vocab)
    shape = mp.shape_from_config("small", model.config)
    batch = training_batch(2, 120, vocab)
    selected = loss_positions(batch)                          # 222 tokens: 5 chunks
    head = model.get_output_embeddings().weight
    head_shapes = {tuple(head.shape), tuple(reversed(head.shape))}

    def is_chunk_logits(t):
        return t.dim() == 2 and t.shape[1] == vocab and t.shape[0] <= chunk

    def is_head_gradient(t):
        return tuple(t.shape) in head_shapes and t is not head

    logits = LiveBytes(is_chunk_logits)
    gradients = LiveBytes(is_head_gradient)
    with logits, gradients:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=regime != "fp32"):
            logprobs, _ = attention.token_scores(model, batch, TAGS, "seen", selected,
                                                  chunk_tokens=chunk, dtype=dtype)
        logprobs.sum().backward()
    assert logits.largest == chunk * vocab * mp.FP32
    assert close(mp.logit_chunk_bytes(chunk, vocab), logits.peak)
    grad = 0
    if regime != "bf16":
        grad = shape.vocab * shape.hidden * mp.FP32
    assert close(grad + mp.head_gradient_bytes(shape, regime), gradients.peak)


# ---------------------------------------------------------------------------------------------
# The command line


def run_plan(*args) -> str:
    script = os.path.join(ROOT, "scripts", "gpu", "memory_plan.py")
    out = subprocess.run([sys.executable, script, *args], check=False, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_help_and_a_qwen3_4b_paper_plan():
    """Without flags: the paper's run (Qwen3-4B, 8 ranks of 80 GB, FSDP2), which fits; all of a
    rank's 32 prompts in one call would not."""
    assert run_plan("--help").startswith("usage:")
    out = run_plan()
    assert out == run_plan("--model=qwen3-4b", "--world_size=8", "--gpu_gb=80", "--fsdp=True")
    cache = "| KV cache (sampling) | sampling | 8 prompts x 8 = 64 rows x 4,443 slots x 144 KiB"
    assert cache in out
    assert "| weights (fp32) | after setup | 4.022B x 4 B, 1/8 | 2.01 |" in out
    assert "| the model as loaded (fp32) | setup | 4.022B x 4 B, whole, each rank | 16.09 |" in out
    assert "fits in 72.00 GB" in out
    out = run_plan("--generate_batch_size=32")
    assert "32 prompts x 8 = 256 rows x 4,443 slots x 144 KiB" in out
    assert "does NOT fit" in out                      # 133 GB of cache
    assert "no FSDP" in run_plan("--fsdp=False", "--world_size=1")


def test_the_plan_reads_the_longest_prompt_or_says_it_assumed(tmp_path, capsys):
    """Without a tokenizer the plan assumes DAPO-17k's longest prompt (1,442 tokens, not 512) and
    says so; with one, it measures the trainer's --data as the trainer builds its prompts."""
    st, _ = mp.make_setting([])
    assert st.prompt_tokens == 1442
    assert "ASSUMED" in st.prompt_source
    assert "ASSUMED longest prompt: 1442 tokens" in capsys.readouterr().err
    assert "longest prompt 1442 (ASSUMED: DAPO-17k's)" in mp.describe(st)
    from data import SEQUENTIAL_TEMPLATE
    from model import build_char_tokenizer
    build_char_tokenizer().save_pretrained(str(tmp_path / "tok"))
    problems = ["What is 2+3?", "A train leaves at 9 and arrives at 11; how long is the trip?"]
    data = tmp_path / "problems.jsonl"
    data.write_text("".join(json.dumps({"problem": p, "answer": "2"}) + "\n" for p in problems))
    st, _ = mp.make_setting(["--trainer=sft", f"--tokenizer={tmp_path / 'tok'}",
                             "--style=sequential", f"--data={data}", "--world_size=1"])
    characters = len(SEQUENTIAL_TEMPLATE) - len("{problem}") + len(problems[1])
    assert st.prompt_tokens == characters
    assert st.prompt_source == f"measured: {data}"
    st, _ = mp.make_setting(["--trainer=sft", f"--tokenizer={tmp_path / 'tok'}",
                             f"--data={tmp_path / 'missing.jsonl'}", "--world_size=1"])
    assert (st.prompt_tokens, st.prompt_source) == (1442, "ASSUMED: DAPO-17k's")
    assert "the data cannot be read" in capsys.readouterr().err
    st, _ = mp.make_setting(["--prompt_tokens=700"])
    assert (st.prompt_tokens, st.prompt_source) == (700, "given")


def test_the_host_memory_line():
    """A node's host memory at load: one rank's fp32 model and mapped bf16 file (1.5 x 16.09 GB
    for Qwen3-4B), the ranks in turn; at once, 8 times that."""
    shape = mp.load_shape("qwen3-4b")
    params = 4_022_468_096
    assert mp.parameter_count(shape) == params
    assert mp.host_load_bytes(shape) == params * 4 * 3 // 2
    assert mp.host_load_bytes(shape, 8) == params * 4 * 3 // 2 * 8
    out = mp.table(mp.make_setting(["--prompt_tokens=512"])[0])
    assert "host memory at load: 24.13 GB on the node (its ranks load in turn; 8 at once: " \
           "193.08 GB)" in out


def phase_table(text: str) -> list[str]:
    """The lines of the first "| phase | per GPU, GB |" table in `text`."""
    lines = text.splitlines()
    table = []
    for line in lines[lines.index("| phase | per GPU, GB |"):]:
        if not line.startswith("|"):
            break
        table.append(line)
    return table


MEMORY_HEADING = re.compile(r"^## The paper's run on paper: memory \(`python "
                            r"scripts/gpu/memory_plan\.py([^`]*)`\)$", re.MULTILINE)


def test_the_readme_table_is_what_its_command_prints():
    """The README's memory section shows its command in the heading and, below, the table of
    phases that command prints, line for line, and its peak."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    heading = MEMORY_HEADING.search(readme)
    assert heading, "the README's memory heading names no memory_plan.py command"
    out = run_plan(*heading[1].split())
    assert phase_table(readme[heading.end():]) == phase_table(out)
    peak = re.search(r"^peak ([0-9.]+ GB \(\w+\))", out, re.MULTILINE)[1]
    assert f"peak {peak}" in readme[heading.end():]


def test_a_search_and_an_sft_plan():
    """--largest finds a value that fits and prints the plan at it; SFT has no sampler lines."""
    st, _ = mp.make_setting(["--model=qwen3-4b", "--world_size=8", "--fsdp=True",
                             "--eval_data="])
    best = mp.largest_fitting(st, "generate_batch_size")
    assert best is not None
    bigger = mp.dataclasses.replace(st, cfg=mp.dataclasses.replace(st.cfg,
                                                                   generate_batch_size=best + 1))
    assert not mp.fits(bigger)
    st, _ = mp.make_setting(["--model=qwen3-0.6b", "--trainer=sft", "--gpu_gb=24"])
    out = mp.table(st)
    assert "KV cache" not in out and "activations, without grad checkpointing" in out
    with pytest.raises(ValueError):
        mp.make_setting(["--world_size=0"])


if __name__ == "__main__":           # torchrun worker of the 2-rank gradient test
    gradient_worker(sys.argv[1])
