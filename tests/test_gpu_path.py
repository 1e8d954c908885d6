"""The CUDA path, checked on the CPU (issue 34): every masked model call (the training forward, its
recompute under gradient checkpointing, the sampler's prefill and decode steps) runs inside
attention.masked_sdpa, which picks SDPA's memory-efficient kernel on CUDA and says what to do when
it refuses; the sampler's attention copies no key or value (attention.folded_query_attention);
grpo.setup's copies compute in the policy's dtype with fp32 rotary frequencies;
scripts/gpu/gpu_check.py --tiny runs."""
import os
import subprocess
import sys
import types
from contextlib import contextmanager

import pytest
import torch
from torch.nn.attention import SDPBackend
from torch.utils._python_dispatch import TorchDispatchMode
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

import attention
import grpo
import plumbing
import sample
from attention import TagIds
from data import Batch
from grpo import GRPOConfig
from model import load_model
from plumbing import save_checkpoint
from scripts.bench.bench_sample import TagBias
from scripts.gpu import gpu_check
from scripts.gpu import memory_plan as mp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUDA = torch.device("cuda")                  # only a name here: nothing is put on it
CPU = torch.device("cpu")
GQA_FLAG = "TRANSFORMERS_SDPA_FORCE_GQA"
PARALLEL_BIAS = 4.0                          # a logit bias that makes <Parallel> likely


def tiny_batch(tok, rows: int = 2):
    """A Batch of the tiny model: `rows` copies of one parallel trace, its response in the loss."""
    text = "<Parallel><Path>1+2=3</Path><Path>4+1=5</Path></Parallel>\n<Summary>5</Summary>"
    prompt = tok.encode("Which two make 5?\n", add_special_tokens=False)
    response = tok.encode(text, add_special_tokens=False)
    ids = torch.tensor([prompt + response] * rows)
    loss_mask = torch.zeros_like(ids)
    loss_mask[:, len(prompt):] = 1
    return Batch(input_ids=ids, attention_mask=torch.ones_like(ids), loss_mask=loss_mask,
                     prompt_lengths=[len(prompt)] * rows)


class MaskedCalls:
    """Records, in order, each attention.masked_sdpa entered (its device; recorded, not run) and
    each attention layer's call of the hooked models (whether it ran inside one)."""

    def __init__(self):
        self.depth = 0
        self.devices = set()
        self.inside = []

    @contextmanager
    def masked_sdpa(self, device):
        self.depth += 1
        self.devices.add(device)
        try:
            yield
        finally:
            self.depth -= 1

    def note(self, module, args, kwargs):
        self.inside.append(self.depth > 0)

    def hook(self, model) -> None:
        for layer in model.model.layers:
            layer.self_attn.register_forward_pre_hook(self.note, with_kwargs=True)


@pytest.fixture
def masked_calls(monkeypatch) -> MaskedCalls:
    calls = MaskedCalls()
    monkeypatch.setattr(attention, "masked_sdpa", calls.masked_sdpa)
    monkeypatch.setattr(sample, "masked_sdpa", calls.masked_sdpa)
    return calls


def test_the_training_forward_and_its_recompute_run_inside_masked_sdpa(masked_calls):
    """attention.token_scores (the loss's forward), and with --grad_checkpointing each layer's
    recompute in the backward: every attention call inside masked_sdpa of the batch's device."""
    model, tok = load_model("tiny", device="cpu")
    masked_calls.hook(model)
    cfg = types.SimpleNamespace(fsdp=False, grad_checkpointing=True)
    run = types.SimpleNamespace(cfg=cfg, dist=plumbing.Dist(0, 1, CPU), model=model,
                                train_model=None)
    plumbing.wrap_model(run)
    batch = tiny_batch(tok)
    tags = TagIds.from_tokenizer(tok)
    logprobs, _ = attention.token_scores(run.train_model, batch, tags, "unseen",
                                         batch.loss_mask[:, 1:].bool())
    logprobs.sum().backward()
    layers = model.config.num_hidden_layers
    assert masked_calls.inside == [True] * (2 * layers)     # the forward, then the recompute
    assert masked_calls.devices == {CPU}


def test_the_sampler_runs_inside_masked_sdpa(masked_calls):
    """sample.generate: the prefill and every decode step."""
    model, tok = load_model("tiny", device="cpu")
    masked_calls.hook(model)
    sample.generate(model, tok, ["Which two of 1 2 3 make 5?\n"], group_size=2, max_new_tokens=8,
                    seed=0)
    layers = model.config.num_hidden_layers
    assert len(masked_calls.inside) >= 2 * layers           # the prefill and a decode step or more
    assert all(masked_calls.inside)


def test_masked_sdpa_picks_the_memory_efficient_kernel_on_cuda_only(monkeypatch):
    chosen = []

    @contextmanager
    def recording(backends):
        chosen.append(list(backends))
        yield

    monkeypatch.setattr(attention, "sdpa_kernel", recording)
    with attention.masked_sdpa(CPU):
        pass
    assert chosen == []                             # CPU: torch's choice, nothing changes
    with attention.masked_sdpa(CUDA):
        pass
    assert chosen == [[SDPBackend.EFFICIENT_ATTENTION]]


def test_no_fused_kernel_is_a_clear_error(monkeypatch):
    """The CPU has no memory-efficient kernel, so a masked forward inside masked_sdpa(cuda) meets
    what a GPU would when the kernel refuses: a ValueError that says what to do (and names a
    TRANSFORMERS_SDPA_FORCE_GQA=1 left in the environment), never the math kernel. Other errors
    pass through."""
    model, tok = load_model("tiny", device="cpu")
    batch = tiny_batch(tok, rows=1)
    tags = TagIds.from_tokenizer(tok)
    mask, positions = attention.build_mask_and_positions(
        batch.input_ids, batch.prompt_lengths, batch.attention_mask, tags, "unseen")
    refused = pytest.raises(ValueError, match="memory-efficient kernel only")
    with refused as error, attention.masked_sdpa(CUDA):
        model(input_ids=batch.input_ids, attention_mask=mask, position_ids=positions)
    assert GQA_FLAG not in str(error.value)
    monkeypatch.setenv(GQA_FLAG, "1")
    refused = pytest.raises(ValueError, match=f"{GQA_FLAG}=1 is set: .* unset it")
    with refused, attention.masked_sdpa(CUDA):
        model(input_ids=batch.input_ids, attention_mask=mask, position_ids=positions)
    with pytest.raises(RuntimeError, match="^something else$"), attention.masked_sdpa(CUDA):
        raise RuntimeError("something else")


def test_folded_query_attention_equals_transformers_sdpa(monkeypatch):
    """attention.folded_query_attention against transformers' own "sdpa" function with its
    repeated keys and values (the CUDA choice under a mask), in fp32: keys and values a slice of
    a wider cache as SlotCache returns them, masks that hide slots, one query and several, a
    mask broadcast over rows; and a mask per head (which the fold cannot take) goes to
    transformers' function."""
    monkeypatch.delenv(GQA_FLAG, raising=False)
    generator = torch.Generator().manual_seed(0)
    rows, heads, kv_heads, head_dim, capacity, width = 3, 6, 2, 16, 40, 29
    module = types.SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True)
    cache = torch.randn(2, rows, kv_heads, capacity, head_dim, generator=generator)
    key = cache[0, :, :, :width]
    value = cache[1, :, :, :width]
    hidden = torch.finfo(torch.float32).min
    for queries, mask_rows, mask_heads in ((1, rows, 1), (3, rows, 1), (3, 1, 1), (3, rows, heads)):
        query = torch.randn(rows, queries, heads, head_dim, generator=generator).transpose(1, 2)
        mask = torch.zeros(mask_rows, mask_heads, queries, width)
        hide = torch.rand(mask.shape, generator=generator) < 0.3
        hide[..., 0] = False                             # every query sees a slot
        mask.masked_fill_(hide, hidden)
        folded, _ = attention.folded_query_attention(module, query, key, value, mask,
                                                     scaling=0.25)
        expected, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
        assert folded.shape == (rows, queries, heads, head_dim)
        assert torch.allclose(folded, expected, atol=1e-6, rtol=0)


class LargeCopies(TorchDispatchMode):
    """Counts the new tensors (not a view of an input, not an input written in place) of at least
    `elements` elements that the ops of a model's decode steps produce: every forward of `model`
    but its first (the prefill)."""

    def __init__(self, model, elements: int):
        super().__init__()
        self.elements = elements
        self.count = 0
        self.forwards = 0
        model.register_forward_pre_hook(self.note_forward)

    def note_forward(self, module, args):
        self.forwards += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.forwards > 1 and isinstance(out, torch.Tensor) and out.numel() >= self.elements:
            inputs = [a for a in args if isinstance(a, torch.Tensor)]
            storage = out.untyped_storage().data_ptr()     # reshape may copy or not: compare
            if all(a.untyped_storage().data_ptr() != storage for a in inputs):
                self.count += 1
        return out


def test_a_decode_step_copies_no_key_or_value(monkeypatch):
    """The sampler on the CPU as on CUDA (no enable_gqa: transformers' choice under a mask on
    both), Unseen blocks forced so that decode steps carry two queries a row: no op of a decode
    step makes a tensor as large as one layer's keys at the prompt's width (repeat_kv makes
    twice that, for keys and for values, every layer, every step); the function transformers
    runs for "sdpa" is its own again after."""
    monkeypatch.delenv(GQA_FLAG, raising=False)
    model, tok = load_model("tiny", device="cpu")
    tags = TagIds.from_tokenizer(tok)
    bias = torch.zeros(model.get_output_embeddings().weight.shape[0])
    bias[tags.parallel] = PARALLEL_BIAS
    forced = TagBias(model, bias).eval()
    prompt = "Which two of 1 2 3 make 5?\n"
    group_size = 2
    config = model.config
    head_dim = config.head_dim
    one_layer_keys = group_size * config.num_key_value_heads * len(prompt) * head_dim
    copies = LargeCopies(model, one_layer_keys)
    with copies:
        rollouts = sample.generate(forced, tok, [prompt], group_size=group_size, mode="unseen",
                                   max_new_tokens=24, seed=0)
    assert any(r.structure.blocks for r in rollouts)
    assert copies.count == 0
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is sdpa_attention_forward


def test_grpo_setup_makes_the_reference_in_the_policys_compute_dtype(tmp_path, monkeypatch):
    """kl_coef > 0: the reference is a frozen copy in plumbing.compute_dtype (bf16 stands in for
    FSDP on CUDA here), its rotary frequencies fp32, its weights the model's, rounded."""
    monkeypatch.setattr(plumbing, "compute_dtype", lambda device, fsdp: torch.bfloat16)
    model, tok = load_model("tiny", device="cpu")
    init = save_checkpoint(str(tmp_path / "init"), model, tok)
    records = [{"id": str(i), "problem": f"Ava has {i} pens.", "answer": str(i)} for i in range(2)]
    cfg = GRPOConfig(model=init, preset="tiny", batch_size=2, group_size=2, max_new_tokens=8,
                     max_steps=1, eval_data="", kl_coef=0.1, out_dir=str(tmp_path / "run"))
    run = grpo.setup(cfg, plumbing.Dist(0, 1, CPU), records, None)
    run.close()
    reference = run.ref_model
    assert reference.model.embed_tokens.weight.dtype == torch.bfloat16
    assert reference.model.rotary_emb.inv_freq.dtype == torch.float32
    assert not reference.training and not any(p.requires_grad for p in reference.parameters())
    expected = run.model.model.embed_tokens.weight.detach().to(torch.bfloat16)
    assert torch.equal(reference.model.embed_tokens.weight, expected)
    assert run.rollout_model is run.model                 # no FSDP: the sampler is the model


GPU_CHECK_PHASES = ("setup", "training", "optimizer step", "sampling", "refresh",
                    "checkpoint save")


def tiny_gpu_gb_between(alone_ranks: int, sharded_ranks: int) -> float:
    """A --gpu_gb at which the tiny check's plan fits `sharded_ranks` FSDP2 ranks but not one GPU
    holding the whole state."""
    peaks = []
    for ranks in (alone_ranks, sharded_ranks):
        st, _ = gpu_check.make_setting(["--tiny", f"--world_size={ranks}"])
        peaks.append(max(mp.phase_totals(mp.plan(gpu_check.checked_setting(st, ranks))).values()))
    assert peaks[1] < peaks[0]
    return (peaks[0] + peaks[1]) / 2 / (1 - mp.DEFAULT_MARGIN) / mp.GB


@pytest.mark.parametrize("ranks", ["alone", "torchrun 2", "one of 2 emulated"])
def test_gpu_check_tiny_runs_every_phase(ranks):
    """scripts/gpu/gpu_check.py --tiny, alone, under torchrun with 2 ranks (gloo), and alone on a
    "GPU" too small for the whole state (one rank of 2, the other emulated): setup, one FSDP2
    micro-batch with gradient checkpointing, AdamW's step, a full-size decode step, the rollout
    copy's refresh, a checkpoint save and the log-prob gap, on the CPU; fp32 there, so the gap
    is rounding. The plan's verdict comes first. The profiler's own lines stay out."""
    script = os.path.join(ROOT, "scripts", "gpu", "gpu_check.py")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    command = [sys.executable, script, "--tiny"]
    expected = "1 rank(s), one GPU each, run it"
    if ranks == "torchrun 2":
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                   script, "--tiny"]
        expected = "2 rank(s), one GPU each, run it"
    if ranks == "one of 2 emulated":
        command += ["--world_size=2", f"--gpu_gb={tiny_gpu_gb_between(1, 2)}"]
        expected = "this GPU runs what one rank of the 2-rank FSDP2 run holds"
    out = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env,
                         check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "profiler_st" not in out.stdout + out.stderr      # kineto's start and stop lines
    lines = out.stdout.splitlines()
    assert lines[0].startswith("tiny (")
    assert lines[1].startswith("the plan (scripts/gpu/memory_plan.py)")
    assert f"{expected}" in out.stdout
    for phase in GPU_CHECK_PHASES:
        assert f"| {phase} | n/a (CPU) | 0.00 |" in lines
    for phase in ("training", "sampling"):       # the CPU's own choice: nothing is forced there
        kernel = "_scaled_dot_product_flash_attention_for_cpu"
        assert f"SDPA kernel under the masks, {phase} (rank 0): {kernel}" in lines
    gap = [line for line in lines if line.startswith("log-prob gap")]
    if ranks == "one of 2 emulated":            # the other rank's data is not real: not judged
        assert not gap and any(line.startswith("gradients and log-prob gap: not judged")
                               for line in lines)
    else:
        largest = float(gap[0].split("max ")[1].split(",")[0])
        assert largest < 1e-4
    assert lines[-1].startswith("passed in")


def test_gpu_check_runs_one_rank_of_the_sharded_run_when_one_card_cannot_hold_it():
    """Plain gpu_check.py (the paper's Qwen3-4B, 8 x 80 GB with FSDP2) alone on one GPU: the
    whole state needs 99.65 GB, more than 72; the check runs what one rank of the 8 holds
    (57.42 GB, it fits). A student's 0.6B fits one card: the whole state. Under torchrun: the
    processes. A plan that fits no way asked: no check, the nearest settings that fit named."""
    st, _ = gpu_check.make_setting([])
    checked, emulated, how = gpu_check.choose_check(st, 1)
    assert (checked.world_size, emulated) == (8, 8) and checked.cfg.fsdp
    assert "one GPU cannot hold the unsharded state (99.65 GB)" in how
    assert mp.fits(checked) and not mp.fits(gpu_check.checked_setting(st, 1))
    student, _ = gpu_check.make_setting(["--model=qwen3-0.6b", "--world_size=1", "--gpu_gb=24",
                                         "--generate_batch_size=2", "--prompt_tokens=1400"])
    checked, emulated, how = gpu_check.choose_check(student, 1)
    assert (checked.world_size, emulated) == (1, 0) and "the whole state" in how
    assert gpu_check.choose_check(st, 2)[:2] == (gpu_check.checked_setting(st, 2), 0)
    small, _ = gpu_check.make_setting(["--gpu_gb=60"])
    checked, emulated, how = gpu_check.choose_check(small, 1)
    assert checked is None and "no check runs" in how
    for flags in gpu_check.nearest_fitting(small):
        fitting, _ = gpu_check.make_setting(["--gpu_gb=60", *flags.split()])
        assert mp.fits(fitting), flags


def test_gpu_check_prints_the_verdict_first_and_stops_when_nothing_fits(capsys):
    """The plan's verdict for the settings asked is the check's first word; a tiny plan on a
    "GPU" of 1 kB fits no way: exit status 1 before anything is built."""
    assert gpu_check.main(["--tiny", "--gpu_gb=1e-6"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("tiny (")
    assert lines[1].startswith("the plan (scripts/gpu/memory_plan.py): peak ")
    assert "does NOT fit in 0.00 GB" in lines[1]
    assert lines[2].startswith("the plan does not fit one GPU") and "no check runs" in lines[2]


def test_gpu_check_judges_each_phase_by_its_total_peak(monkeypatch):
    """Each phase's total peak (what it started with included: not the increase) against the
    plan's total for that phase, at the paper's plan as one rank of 8: a phase at its total
    passes, one 11% over fails (the margin is 10%). The measurement is the CUDA allocator's peak
    itself, not the peak less the phase's start."""
    st, _ = gpu_check.make_setting([])
    checked = gpu_check.choose_check(st, 1)[0]
    totals = mp.phase_totals(mp.plan(checked))
    measured = {phase: totals[phase] for phase in GPU_CHECK_PHASES}
    assert all(ok for *_, ok in gpu_check.judge(checked, measured))
    over = {phase: int(value * 1.11) for phase, value in measured.items()}
    assert not any(ok for *_, ok in gpu_check.judge(checked, over))
    held = mp.weights_bytes(checked.shape, 8, True)            # state every phase holds
    assert totals["optimizer step"] > held + mp.adamw_temporary_bytes(checked.shape, 8, True)
    for name, value in (("synchronize", None), ("reset_peak_memory_stats", None),
                        ("memory_allocated", 10), ("max_memory_allocated", 25)):
        monkeypatch.setattr(torch.cuda, name, lambda device=None, value=value: value)
    peaks = {}
    with gpu_check.peak_total(torch.device("cuda", 0), peaks, "training"):
        pass
    assert peaks == {"training": 25}


def profiled(name: str, children=()) -> types.SimpleNamespace:
    """One event as torch's profiler records it: a name and the events it called."""
    return types.SimpleNamespace(name=name, cpu_children=list(children))


def test_gpu_check_counts_only_the_attention_kernels():
    """A masked SDPA call on CUDA, as the profiler records it at a decode step of 3,513 slots:
    the mask's expand, pad and slice beside the kernel. Only the kernel counts; a math fallback
    still shows; events outside an SDPA call are not read."""
    efficient = profiled("aten::scaled_dot_product_attention", [
        profiled("aten::expand"), profiled("aten::pad"), profiled("aten::slice"),
        profiled("aten::_scaled_dot_product_efficient_attention",
                 [profiled("aten::_efficient_attention_forward")])])
    math = profiled("aten::scaled_dot_product_attention", [
        profiled("aten::expand"), profiled("aten::_scaled_dot_product_attention_math")])
    elsewhere = profiled("aten::mm", [profiled("aten::_scaled_dot_product_attention_math")])
    assert gpu_check.attention_kernels([efficient, elsewhere]) == {gpu_check.CUDA_KERNEL}
    assert gpu_check.attention_kernels([efficient, math]) == {
        gpu_check.CUDA_KERNEL, "_scaled_dot_product_attention_math"}
