"""The check to run on one GPU before renting eight (issues 34, 39): the real model's shapes with
random weights (nothing downloaded), each phase's peak memory beside the memory plan's, the
attention kernel the masked calls ran, whether the gradients are finite, and the sampler's log-prob
gap against the training forward; a few minutes on one 80 GB GPU.

    python scripts/gpu/gpu_check.py                      # Qwen3-4B as one rank of the paper's run
    python scripts/gpu/gpu_check.py --model=qwen3-0.6b --world_size=1 --gpu_gb=24 \\
        --generate_batch_size=2 --prompt_tokens=1400  # a student's 24 GB card
    torchrun --nproc_per_node=2 scripts/gpu/gpu_check.py # two ranks (FSDP2 over both), two GPUs
    python scripts/gpu/gpu_check.py --tiny               # a small Qwen3 on the CPU (make test runs
                                                         # it)

Every flag is scripts/gpu/memory_plan.py's (--model: qwen3-4b, qwen3-0.6b, a folder with a
config.json or a config.json; any GRPO field). First the plan's verdict for the settings asked
(memory_plan.verdict), then what runs (`choose_check`): under torchrun each process is one rank
of the plan, its state split over the processes; alone, the whole state on one GPU when the
plan says one GPU holds it, else one rank of the asked --world_size with FSDP2 (the paper's
Qwen3-4B: 99.65 GB unsharded, 57.42 GB a rank), the other ranks emulated by torch's fake process
group (collectives move no data: the memory is a rank's, the values are not, so the gradient
norm and the gap are not judged); when even the asked plan does not fit, no check runs and the
nearest settings that fit are named:

1. setup: the model built in fp32 from its config, and (FSDP) the sampler's bf16 copy
   (model.frozen_copy, as grpo.setup makes it);
2. training: the model wrapped as plumbing.wrap_model wraps it (FSDP2 over the ranks, so its
   bf16 compute), one micro-batch of micro_batch_size rows of the plan's length (the longest prompt
   + max_new_tokens) holding an Unseen block of num_paths paths, its GRPO loss and backward;
3. optimizer step: AdamW, as plumbing.prepare builds it, on those gradients (its state made by a
   first step, not measured), through plumbing.optimizer_step;
4. sampling: a sample.SlotCache of the plan's size, the prefill of a generate call's prompts and
   one decode step at the cache's full width with num_paths queries a row (an Unseen block's);
5. refresh (FSDP): the sampler's copy refreshed from the shards (plumbing.sync_rollout_model);
6. checkpoint save: plumbing.Run.save into a temporary folder (TMPDIR; at Qwen3-4B about 48 GB of
   disk for the weights and AdamW's state, deleted after);
7. the gap: GAP_PROMPTS x group_size responses of GAP_TOKENS tokens sampled as GRPO samples them
   (grpo.sample_rollouts), and the log-probs the training forward gives the same tokens
   (grpo.response_logprobs): max and mean |difference| over the sampled tokens, and the share of
   them whose ratio lies outside [1 - clip, 1 + clip] (the sampler is the trained model's copy).

Printed by rank 0: per phase, its total peak, torch.cuda.max_memory_allocated (the largest of
any rank's), beside the plan's total for that phase (`judge`: not the phase's increase over its
own lines, which missed the state every phase holds), the SDPA kernels
seen, the gradient norm, the gap. Random weights give flat distributions, so the gap of a trained
model is larger (results/LOG.md: scripts/bench/bf16_gap.py). Exit status 1 when the gradients are
not finite, a masked call on CUDA ran another kernel than the memory-efficient one, or a phase takes
more than the plan's margin above its figure. --tiny: a small Qwen3 on the CPU (nothing measured
there), so the script cannot rot.
"""
import argparse
import ctypes
import dataclasses
import json
import math
import os
import sys
import tempfile
import time
from contextlib import contextmanager

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))   # two folders up
sys.path.insert(0, ROOT)   # the core modules and scripts.<folder>.<name>

import torch
import torch.distributed as dist
import transformers
from transformers import AutoModelForCausalLM, Qwen3Config

import grpo
import plumbing
import sample
from attention import (
    TagIds,
    autocast,
    build_mask_and_positions,
    folded_query_attention_for_sdpa,
    masked_sdpa,
    token_logprobs,
    token_scores,
)
from model import TAGS, frozen_copy
from scripts.gpu import memory_plan as mp

TINY = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, intermediate_size=128,
            max_position_embeddings=256, tie_word_embeddings=True)
TINY_FLAGS = ("--device=cpu", "--world_size=1", "--prompt_tokens=24", "--max_new_tokens=40",
              "--generate_batch_size=2", "--group_size=2", "--batch_size=2",
              "--logit_chunk_tokens=16")
RESERVED_IDS = 8               # the vocabulary's last ids: the six tags, a newline and an EOS
GAP_PROMPTS = 4
GAP_PROMPT_TOKENS = 32
GAP_TOKENS = 64                # a response's budget in the gap measurement
SEED = 0
GB = mp.GB
MAX_RANKS = 64                 # the most FSDP2 ranks nearest_fitting tries
TOKENIZER_FILE = "id_tokenizer.json"
SDPA_EVENT = "aten::scaled_dot_product_attention"
CUDA_KERNEL = "_scaled_dot_product_efficient_attention"   # attention.masked_sdpa's choice
# The attention kernels an SDPA call may run (math, flash, memory-efficient, cuDNN, the CPU's)
ATTENTION_KERNEL_PREFIXES = ("_scaled_dot_product_", "_efficient_attention_", "_cudnn_attention_",
                             "_flash_attention_")
STDOUT_FD = 1
STDERR_FD = 2


# ---------------------------------------------------------------------------------------------
# A model with no tokenizer: ids only


class IdTokenizer:
    """What sample.generate and grpo read of a tokenizer, for random weights: the six tags, a
    newline and the EOS are the vocabulary's last RESERVED_IDS ids, and text is ids."""

    def __init__(self, vocab_size: int):
        first = vocab_size - RESERVED_IDS
        names = [*TAGS, "\n", "<eos>"]
        self.ids = {name: first + i for i, name in enumerate(names)}
        self.eos_token_id = self.ids["<eos>"]
        self.pad_token_id = self.eos_token_id
        self.unk_token_id = None
        self.text_ids = first                     # ids below this are ordinary tokens

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [self.ids[text]]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return " ".join(str(i) for i in ids)

    def save_pretrained(self, folder: str) -> None:
        """What a checkpoint save writes of a tokenizer: here its ids, as JSON."""
        with open(os.path.join(folder, TOKENIZER_FILE), "w", encoding="utf-8") as f:
            json.dump(self.ids, f)


def random_ids(tokenizer: IdTokenizer, rows: int, length: int, seed: int) -> torch.Tensor:
    """(rows, length) long: ordinary tokens, no tag."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, tokenizer.text_ids, (rows, length), generator=generator)


def unseen_rows(tokenizer: IdTokenizer, tags: TagIds, rows: int, prompt: int, length: int,
                num_paths: int) -> torch.Tensor:
    """(rows, length) long: a random prompt, then a response that opens an Unseen block of
    num_paths paths of a quarter of the response each, its summary, and ordinary tokens to the
    end."""
    ids = random_ids(tokenizer, rows, length, SEED)
    response = length - prompt
    path_tokens = max(1, response // 4)
    block = [tags.parallel]
    for _ in range(num_paths):
        block += [tags.path] + [0] * path_tokens + [tags.end_path]
    block += [tags.end_parallel, *tags.newline, tags.summary, 0, tags.end_summary]
    if len(block) >= response:
        raise ValueError(f"a {response}-token response cannot hold a block of {num_paths} paths: "
                         "raise --max_new_tokens")
    for position, token in enumerate(block):
        if token:
            ids[:, prompt + position] = token
    return ids


# ---------------------------------------------------------------------------------------------
# What each phase measures


@contextmanager
def peak_total(device: torch.device, measured: dict, phase: str):
    """measured[phase]: the most bytes allocated at once during the phase, what it started with
    included (CUDA; None on the CPU)."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    yield
    measured[phase] = None
    if cuda:
        torch.cuda.synchronize(device)
        measured[phase] = torch.cuda.max_memory_allocated(device)


def attention_kernels(events) -> set[str]:
    """The attention kernels among the children of every scaled_dot_product_attention event in
    `events` (torch's profiler's: each has .name and .cpu_children), their "aten::" prefix
    removed. Only the kernels count: on CUDA the memory-efficient path also calls aten::expand
    on the mask, and aten::pad and aten::slice when the key length is not a multiple of 8 (a
    decode step at 3,513 slots), which the profiler records as children too."""
    seen = set()
    for event in events:
        if event.name != SDPA_EVENT:
            continue
        for child in event.cpu_children:
            name = child.name.removeprefix("aten::")
            if name.startswith(ATTENTION_KERNEL_PREFIXES):
                seen.add(name)
    return seen


@contextmanager
def quiet_file_descriptors():
    """stdout and stderr sent to /dev/null below Python: torch's profiler library (kineto) writes
    a line to them, from C++, each time a profile starts and stops, which would drown the
    table. Only around the start and the stop, so that torch's warnings (why a kernel refused)
    still show."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(STDOUT_FD), os.dup(STDERR_FD)]
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), STDOUT_FD)
        os.dup2(devnull.fileno(), STDERR_FD)
    try:
        yield
    finally:
        ctypes.CDLL(None).fflush(None)          # C's buffered stdout, before it is put back
        os.dup2(saved[0], STDOUT_FD)
        os.dup2(saved[1], STDERR_FD)
        os.close(saved[0])
        os.close(saved[1])


@contextmanager
def sdpa_kernels(seen: set):
    """Adds to `seen` the kernel each scaled_dot_product_attention call inside ran (the op torch's
    profiler records under it: _scaled_dot_product_efficient_attention, ..._attention_math for the
    math kernel; `attention_kernels`). A profiler, not a dispatch mode: a Python dispatch mode
    changes the choice."""
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    with quiet_file_descriptors():
        profiler.start()
    try:
        yield
    finally:
        with quiet_file_descriptors():
            profiler.stop()
    seen.update(attention_kernels(profiler.events()))


# ---------------------------------------------------------------------------------------------
# The phases


def checked_setting(st: mp.Setting, ranks: int) -> mp.Setting:
    """The plan of what this check runs: `ranks` ranks (1: one GPU, its state unsharded; under
    torchrun, the processes), each generate call as large as one of `st`'s ranks makes it."""
    cfg = dataclasses.replace(st.cfg, generate_batch_size=mp.sampling_prompts(st.cfg,
                                                                              st.world_size))
    return dataclasses.replace(st, cfg=cfg, world_size=ranks)


def nearest_fitting(st: mp.Setting) -> list[str]:
    """The flags of the nearest settings whose plan fits: more FSDP2 ranks (doubling, up to
    MAX_RANKS), or a smaller value of one of memory_plan.SEARCHABLE's fields."""
    found = []
    ranks = st.world_size
    while ranks < MAX_RANKS:
        ranks *= 2
        sharded = dataclasses.replace(st, world_size=ranks,
                                      cfg=dataclasses.replace(st.cfg, fsdp=True))
        if mp.fits(sharded):
            found.append(f"--world_size={ranks} --fsdp=True")
            break
    for field in mp.SEARCHABLE:
        best = mp.largest_fitting(st, field)
        if best is not None:
            found.append(f"--{field}={best}")
    return found


def choose_check(st: mp.Setting, processes: int) -> tuple[mp.Setting | None, int, str]:
    """(the plan of what this check runs, or None when nothing fits; the ranks to emulate in
    this one process, 0 for none; what it runs, in words). `processes`: torchrun's WORLD_SIZE."""
    if processes > 1:
        return checked_setting(st, processes), 0, (
            f"{processes} rank(s), one GPU each, run it")
    alone = checked_setting(st, 1)
    if mp.fits(alone):
        return alone, 0, "1 rank(s), one GPU each, run it (the whole state on this GPU)"
    sharded = checked_setting(st, st.world_size)
    peak = max(mp.phase_totals(mp.plan(alone)).values()) / GB
    if st.cfg.fsdp and st.world_size > 1 and mp.fits(sharded):
        return sharded, st.world_size, (
            f"one GPU cannot hold the unsharded state ({peak:.2f} GB): this GPU runs what one "
            f"rank of the {st.world_size}-rank FSDP2 run holds, the other ranks emulated (torch's "
            "fake process group: their data is not moved, so the values are not judged)")
    nearest = "; ".join(nearest_fitting(st)) or "none found"
    return None, 0, (f"the plan does not fit one GPU ({peak:.2f} GB alone, no sharded run of "
                     f"the asked ranks fits either): no check runs. Nearest settings that fit: "
                     f"{nearest}")


def judge(checked: mp.Setting, measured: dict) -> list[tuple[str, object, object, bool]]:
    """(phase, measured total peak or None, the plan's total for the phase or None, within the
    plan's margin) per measured phase. Totals on both sides: the phase's increase against its
    own lines alone (the earlier check) passed a phase that held more state than planned."""
    in_plan = mp.phase_totals(mp.plan(checked))
    rows = []
    for phase, value in measured.items():
        plan_bytes = in_plan.get(phase)
        ok = value is None or plan_bytes is None or value <= plan_bytes * (1 + checked.margin)
        rows.append((phase, value, plan_bytes, ok))
    return rows


def build_models(model_config, st: mp.Setting, device: torch.device):
    """Setup as grpo.setup does it: the model in fp32 (random weights) and, under FSDP, the
    sampler's copy (and with kl_coef > 0 the reference) in the policy's compute dtype. Returns
    (model, sampler model, reference or None)."""
    torch.manual_seed(SEED)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(model_config, dtype=torch.float32)
    model.set_attn_implementation("sdpa")
    dtype = plumbing.compute_dtype(device, st.cfg.fsdp)
    reference = None
    if st.cfg.kl_coef > 0:
        reference = frozen_copy(model, dtype)
    sampler = model
    if st.cfg.fsdp:
        sampler = frozen_copy(model, dtype)
    return model, sampler, reference


def prepared_run(model, tokenizer, tags: TagIds, st: mp.Setting, d: plumbing.Dist,
                 out_dir: str) -> plumbing.Run:
    """This rank's plumbing.Run as plumbing.prepare makes it: the model wrapped
    (plumbing.wrap_model: FSDP2, DDP over several ranks, or itself), AdamW and a constant
    schedule; checkpoints go to `out_dir`."""
    cfg = dataclasses.replace(st.cfg, out_dir=out_dir)
    run = plumbing.Run(cfg=cfg, dist=d, model=model, tokenizer=tokenizer, tags=tags)
    plumbing.wrap_model(run)
    run.optimizer = torch.optim.AdamW(run.train_model.parameters(), lr=cfg.lr,
                                      weight_decay=cfg.weight_decay, betas=tuple(cfg.betas))
    run.scheduler = torch.optim.lr_scheduler.LambdaLR(run.optimizer, lambda step: 1.0)
    return run


def training_step(train_model, tokenizer: IdTokenizer, tags: TagIds, st: mp.Setting,
                  device: torch.device) -> float:
    """One micro-batch of the plan's largest shape through GRPO's loss and backward; the global
    gradient norm (inf or nan when a gradient is not finite). The gradients stay for the
    optimizer step."""
    cfg = st.cfg
    rows, length, _ = mp.training_shape(st)
    ids = unseen_rows(tokenizer, tags, rows, st.prompt_tokens, length, cfg.num_paths)
    response = torch.zeros(rows, length - 1)
    response[:, st.prompt_tokens - 1:] = 1.0
    batch = grpo.RolloutBatch(input_ids=ids, attention_mask=torch.ones_like(ids),
                              prompt_lengths=[st.prompt_tokens] * rows, response_mask=response,
                              sampled_mask=response.clone(), loss_mask=response.clone(),
                              old_logprobs=torch.zeros(rows, length - 1),
                              advantages=torch.ones(rows, 1)).to(device)
    batch.loss_weights, denominator = grpo.loss_weights(batch.loss_mask, cfg.loss_agg_mode,
                                                        cfg.max_new_tokens)
    logprobs, entropy = token_scores(train_model, batch, tags, cfg.mode, batch.loss_mask.bool(),
                                     cfg.temperature, cfg.logit_chunk_tokens)
    clip_ratio_high = grpo.stage_at(cfg, 1).clip_ratio_high
    loss, _ = grpo.micro_batch_loss(logprobs, entropy, batch, cfg, clip_ratio_high, denominator)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(train_model.parameters(), float("inf"))
    if hasattr(norm, "full_tensor"):            # FSDP2: a DTensor
        norm = norm.full_tensor()
    return norm.item()


def optimizer_step(run: plumbing.Run, measured: dict) -> None:
    """AdamW's step on the training phase's gradients. A first step, not measured, makes AdamW's
    state (a run holds it from its first step on, and the plan counts it from setup); the
    measured one is plumbing.optimizer_step's (the norm, the clip, the step, the gradients
    freed). Gradients that are not finite leave this to the report."""
    run.optimizer.step()
    with peak_total(run.dist.device, measured, "optimizer step"):
        plumbing.optimizer_step(run.train_model, run.optimizer, run.scheduler, run.cfg.grad_clip)


@torch.inference_mode()
def decode_step(sampler, tokenizer: IdTokenizer, tags: TagIds, st: mp.Setting,
                device: torch.device) -> None:
    """What sample.Engine does at its largest: the prefill of a generate call's prompts into a
    SlotCache of the plan's size, the fan-out to group_size rows, then one decode step at the
    cache's full width with num_paths queries a row (every slot visible), its logits drawn from
    as Engine._choose_and_advance draws them."""
    cfg = st.cfg
    prompts = mp.sampling_prompts(cfg, st.world_size)
    rows = prompts * cfg.group_size
    capacity = mp.cache_capacity(st.prompt_tokens, cfg.max_new_tokens)
    queries = mp.decode_queries(cfg.mode, cfg.num_paths)
    dtype = next(sampler.parameters()).dtype
    ids = random_ids(tokenizer, prompts, st.prompt_tokens, SEED)
    real = torch.ones_like(ids)
    mask, positions = build_mask_and_positions(ids, [st.prompt_tokens] * prompts, real, tags,
                                               "seen", dtype)
    cache = sample.SlotCache(rows, capacity, device, active_rows=prompts)
    cache.owner[:, :st.prompt_tokens] = sample.SHARED
    cache.slots = torch.arange(st.prompt_tokens, device=device).expand(prompts, -1)
    cache.attend_to(st.prompt_tokens)
    was_training = sampler.training              # without FSDP the sampler is the training model
    sampler.eval()
    with folded_query_attention_for_sdpa(), autocast(device), masked_sdpa(device):
        out = sampler(input_ids=ids.to(device), attention_mask=mask.to(device),
                      position_ids=positions.to(device), cache=cache, use_cache=True,
                      logits_to_keep=1)
        cache.fan_out(cfg.group_size)
        first_logits = out.logits[:, -1].float().repeat_interleave(cfg.group_size, dim=0)  # kept,
        # as Engine.run keeps them, through the step
        cache.owner_buffer.fill_(sample.SHARED)
        cache.slots = torch.arange(capacity - queries, capacity, device=device).expand(rows, -1)
        cache.attend_to(capacity)
        codes = sample.FIRST_PATH_OWNER + torch.arange(queries, device=device).expand(rows, -1)
        cache.owner[cache.row_ids, cache.slots] = codes
        step_ids = random_ids(tokenizer, rows, queries, SEED + 1).to(device)
        step_positions = torch.full((rows, queries), capacity - queries, device=device)
        out = sampler(input_ids=step_ids, attention_mask=cache.mask(codes, dtype),
                      position_ids=step_positions, cache=cache, use_cache=True)
    logits = out.logits.flatten(0, 1).float()
    bans = sample.ban_masks(tags, logits.shape[-1], True, device)
    banned = bans[sample.PATH].expand(logits.shape[0], -1)
    uniforms = torch.rand(logits.shape[0], generator=torch.Generator().manual_seed(SEED))
    chosen = sample.draw_tokens(logits, banned, cfg.sampling(), uniforms)
    token_logprobs(logits, chosen, cfg.temperature)
    sampler.train(was_training)
    del first_logits


def logprob_gap(sampler, train_model, tokenizer, tags: TagIds, cfg, prompts: list[list[int]],
                device: torch.device) -> dict:
    """The sampler's recorded log-probs against the training forward's for the same tokens, over
    every sampled token of group_size responses to each prompt, sampled as GRPO samples them and
    scored as grpo.response_logprobs scores them (--recompute_logprobs): "tokens", "max" and
    "mean" |difference|, and "outside_clip", the share of tokens whose ratio
    exp(training - sampler) lies outside [1 - clip_ratio_low, 1 + clip_ratio_low]."""
    rollouts = grpo.sample_rollouts(sampler, tokenizer, prompts, cfg, seed=SEED)
    zeros = torch.zeros(len(rollouts))
    batch = grpo.collate_rollouts(rollouts, zeros, tokenizer.pad_token_id).to(device)
    recomputed = grpo.response_logprobs(train_model, batch, cfg, tags)
    sampled = batch.sampled_mask.bool()
    difference = (recomputed - batch.old_logprobs)[sampled].float()
    ratio = difference.exp()
    low = 1.0 - cfg.clip_ratio_low
    high = 1.0 + cfg.clip_ratio_low
    outside = (ratio < low) | (ratio > high)
    return {"tokens": int(sampled.sum()), "max": difference.abs().max().item(),
            "mean": difference.abs().mean().item(), "outside_clip": outside.float().mean().item()}


# ---------------------------------------------------------------------------------------------
# The command line


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__.split("\n\n")[0],
                                     epilog="Any other flag is scripts/gpu/memory_plan.py's.")
    parser.add_argument("--tiny", action="store_true",
                        help="a small Qwen3 on the CPU: runs every step, measures nothing")
    return parser


def make_setting(argv: list[str]):
    """(the plan's setting, the transformers config of the model) of the command line."""
    ours, rest = arguments().parse_known_args(argv)
    if ours.tiny:
        rest = [*TINY_FLAGS, *rest]
        model_config = Qwen3Config(**TINY)
    st, _ = mp.make_setting(rest)
    if not ours.tiny:
        return st, mp.load_config(st.shape.name)
    return dataclasses.replace(st, shape=mp.shape_from_config("tiny", model_config)), model_config


def gb(value) -> str:
    if value is None:
        return "n/a (CPU)"
    return f"{value / GB:.2f}"


def report(st: mp.Setting, checked: mp.Setting, measured: dict, kernels: dict, norm: float,
           gap: dict | None, seconds: float, how: str) -> bool:
    """Print the check's table and lines (`checked`: the plan of what ran, `how`: in words);
    whether every check passed (on CUDA also: every masked call ran the memory-efficient
    kernel). A phase the plan has no line for (a checkpoint save without FSDP) is shown, not
    judged; an emulated run (gap None) judges memory and kernels only."""
    cuda = st.device == "cuda"
    ranks = checked.world_size
    print(f"\n{how}.\n{checked.cfg.generate_batch_size} prompt(s) a generate call, the model's "
          f"state split over {ranks}; each phase's peak is the largest of any rank's:\n")
    print("| phase | measured total peak, GB | plan's total, GB |")
    print("|---|---|---|")
    passed = True
    for phase, value, plan_bytes, ok in judge(checked, measured):
        if plan_bytes is None:
            print(f"| {phase} | {gb(value)} | not in the plan |")
            continue
        print(f"| {phase} | {gb(value)} | {gb(plan_bytes)} |")
        if not ok:
            passed = False
            print(f"  {phase}: more than the plan's {st.margin:.0%} margin above its total")
    for phase, seen in kernels.items():
        print(f"SDPA kernel under the masks, {phase} (rank 0): {', '.join(sorted(seen))}")
        if cuda and seen != {CUDA_KERNEL}:
            passed = False
            print(f"  {phase}: a masked call ran another kernel than {CUDA_KERNEL}")
    if gap is None:
        print("gradients and log-prob gap: not judged (emulated ranks: their values are not "
              "real); run under torchrun on the GPUs for them")
    else:
        verdict = "finite"
        if not math.isfinite(norm):
            verdict = "NOT FINITE (no optimizer step)"
            passed = False
        print(f"gradients: norm {norm:.4g}, {verdict}")
        print(f"log-prob gap (rank 0), sampler vs training forward, {gap['tokens']} sampled "
              f"tokens: max {gap['max']:.3g}, mean {gap['mean']:.3g}, outside the "
              f"{st.cfg.clip_ratio_low:g} clip at ratio 1: {100 * gap['outside_clip']:.2f}%")
    outcome = "passed"
    if not passed:
        outcome = "FAILED"
    print(f"{outcome} in {seconds:.0f} s")
    return passed


def largest_over_ranks(measured: dict, device: torch.device) -> dict:
    """Each measured phase's peak, the largest over the ranks (one collective); None stays None
    (the CPU measures nothing)."""
    phases = [phase for phase, value in measured.items() if value is not None]
    if not phases:
        return measured
    values = plumbing.all_reduce([measured[phase] for phase in phases], device, "max")
    largest = dict(measured)
    for phase, value in zip(phases, values):
        largest[phase] = int(value)
    return largest


def run_check(st: mp.Setting, checked: mp.Setting, model_config, d: plumbing.Dist, how: str,
              emulated: bool = False) -> bool:
    """The phases (module docstring) on this rank; whether every check passed, the same answer
    on every rank (rank 0 prints the report). `emulated`: the other ranks are a fake process
    group's (their values are not real: non-finite gradients are zeroed so that the optimizer
    step runs, and no gap is measured)."""
    t0 = time.monotonic()
    device = d.device
    tokenizer = IdTokenizer(st.shape.vocab)
    tags = TagIds.from_tokenizer(tokenizer)
    measured = {}
    kernels = {"training": set(), "sampling": set()}
    with peak_total(device, measured, "setup"):
        model, sampler, _ = build_models(model_config, st, device)
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as out_dir:
        run = prepared_run(model, tokenizer, tags, st, d, out_dir)
        with peak_total(device, measured, "training"), sdpa_kernels(kernels["training"]):
            norm = training_step(run.train_model, tokenizer, tags, st, device)
        if emulated:
            for parameter in run.train_model.parameters():
                if parameter.grad is not None:
                    torch.nan_to_num_(parameter.grad, 0.0, 0.0, 0.0)
        if emulated or math.isfinite(norm):
            optimizer_step(run, measured)
        with peak_total(device, measured, "sampling"), sdpa_kernels(kernels["sampling"]):
            decode_step(sampler, tokenizer, tags, st, device)
        if st.cfg.fsdp:
            with peak_total(device, measured, "refresh"):
                plumbing.sync_rollout_model(sampler, run.train_model)
        with peak_total(device, measured, "checkpoint save"):
            run.save()
    gap = None
    if not emulated:
        gap_cfg = dataclasses.replace(st.cfg, max_new_tokens=GAP_TOKENS, generate_batch_size=0)
        prompts = random_ids(tokenizer, GAP_PROMPTS, GAP_PROMPT_TOKENS, SEED + 2).tolist()
        gap = logprob_gap(sampler, run.train_model, tokenizer, tags, gap_cfg, prompts, device)
    measured = largest_over_ranks(measured, device)
    passed = True
    if d.is_main:
        passed = report(st, checked, measured, kernels, norm, gap, time.monotonic() - t0, how)
    failed = plumbing.all_reduce([not passed], device, "max")[0]
    return failed == 0


@contextmanager
def process_group(st: mp.Setting, emulated_ranks: int = 0):
    """This process's plumbing.Dist, in a process group torn down at the end. Under torchrun
    (RANK in the environment): its rank of WORLD_SIZE, on GPU LOCAL_RANK (nccl) or the CPU
    (gloo). Alone: rank 0 of 1, in a group of this one process when FSDP2 needs one; with
    `emulated_ranks`, rank 0 of that many in torch's fake process group (one process)."""
    cuda = st.device == "cuda"
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", emulated_ranks or "1"))
    device = torch.device("cpu")
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    d = plumbing.Dist(rank, world_size, device)
    if dist.is_initialized() or (world_size == 1 and not st.cfg.fsdp):
        yield d
        return
    backend = "gloo"
    device_id = None
    if cuda:
        backend = "nccl"
        device_id = device
    if emulated_ranks:          # torch's own tool for one rank's memory (torchtitan, DTensor tests)
        from torch.testing._internal.distributed.fake_pg import FakeStore
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    elif "RANK" in os.environ:
        dist.init_process_group(backend, device_id=device_id)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                device_id=device_id)
    try:
        yield d
    finally:
        dist.barrier()          # no rank tears the group down while another still uses it
        dist.destroy_process_group()


def main(argv: list[str]) -> int:
    transformers.utils.logging.disable_progress_bar()     # the checkpoint save's, in the table
    st, model_config = make_setting(argv)
    print(mp.describe(st))
    print(f"the plan (scripts/gpu/memory_plan.py): {mp.verdict(st)}")
    checked, emulated_ranks, how = choose_check(st, int(os.environ.get("WORLD_SIZE", "1")))
    if checked is None:
        print(how)
        return 1
    if st.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("no CUDA device here: run it on the GPU, or pass --tiny for the CPU check")
    with process_group(st, emulated_ranks) as d:
        passed = run_check(st, checked, model_config, d, how, emulated=emulated_ranks > 0)
    if passed:
        return 0
    return 1


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (OSError, ValueError) as e:
        sys.exit(f"gpu_check.py: error: {e}")
