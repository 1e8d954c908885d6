"""Cold-start SFT: teach a model the parallel-thinking format by imitation (PAPER_NOTES §6.1, stage 1).

    python sft.py                                   # tiny model, synthetic:easy traces, ~4 min on 2 CPU cores
    python sft.py --mode=seen --max_steps=100       # any config field: --key=value
    python sft.py --resume=True                     # continue the latest checkpoint in out_dir, exactly

    # a real model on 8 GPUs (the paper's recipe, §5.3: Qwen3-4B-Base, Parallel-GSM8K, Unseen, 5 epochs)
    torchrun --nproc_per_node=8 sft.py --model=Qwen/Qwen3-4B-Base --data=parallel_gsm8k \\
        --fsdp=True --grad_checkpointing=True --out_dir=runs/sft_qwen3_4b
    # the Seen variant: ordinary causal SFT (the paper ran it for 58 steps, about one epoch)
    torchrun --nproc_per_node=8 sft.py --model=Qwen/Qwen3-4B-Base --data=parallel_gsm8k --mode=seen \\
        --epochs=1 --fsdp=True --grad_checkpointing=True --out_dir=runs/sft_qwen3_4b_seen
    # a model too small for FSDP to matter, or a CPU check of the distributed code (gloo, 2 processes)
    torchrun --nproc_per_node=2 sft.py --max_steps=20

What one training example is (PAPER_NOTES §6.1, Appendix A.2):

    prompt ids    = tokenizer(data.build_prompt(tokenizer, problem))          no loss (masked)
    response ids  = tokenizer(solution) + [eos]                               loss on every token

The solution is the canonical trace, `...<Parallel><Path>..</Path><Path>..</Path></Parallel>\\n<Summary>..
</Summary>...Final Answer: 83`; every tag is an ordinary target here, including the ones the sampler will
inject at run time (<Path>, </Parallel>, the newline, <Summary>). The forward is

    Seen    causal mask, positions 0..L-1 (an ordinary SFT forward)
    Unseen  attention.build_mask_and_positions(mode="unseen"): a path sees the prompt, the text before
            its block and itself, never a sibling path; multiverse positions. The prompt is always
            numbered 0..n-1 and never parsed (the official code parsed the instruction's own tags and
            shifted every position, §8.2.1).

Loss = (sum of response-token NLLs) / (number of response tokens), over the *whole global batch*: all
micro-batches of gradient accumulation and all ranks (§8.2.6: the official trainer back-propagated each
micro-batch's own mean before dividing, so its gradients were 16x too large before clipping). To get
exactly that mean, the global token count is all-reduced before the first backward, and each
micro-batch back-propagates  sum(NLL) * world_size / global_tokens  (DDP and FSDP *average* gradients
over ranks, hence the world_size). `tests/test_sft.py` checks that 4 micro-batches of 2 and 2 ranks
both give the gradients of one batch of 8.

Checkpoints (`out_dir/checkpoint-<step>`) are Hugging Face folders (`model.save_checkpoint`, atomic)
plus `trainer_state.pt`: optimizer, scheduler, RNG states, data position, step and config, so
`--resume` continues bit for bit (tested on CPU). `out_dir/log.jsonl` has one line per step.

Pieces grpo.py reuses: `parse_config`/`parse_config_with_resume`, `grad_sync`, `prune_checkpoints`, `setup_distributed`/`teardown_distributed`/`all_reduce`,
`build_optimizer`/`build_scheduler`, `save_training_checkpoint`/`load_training_state`/
`find_latest_checkpoint`, `encode_prompt`, `quick_eval`.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import random
import re
import shutil
import sys
import time
import types
import typing
from contextlib import nullcontext
from dataclasses import dataclass

# On CPU, let idle OpenMP threads sleep instead of spin-waiting (read when torch loads, so it is set
# before the import). Measured on 2 cores with one other busy process: spinning threads made a
# tiny-model step 5x slower than one thread; sleeping threads were as fast or faster than one.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from attention import TagIds, build_mask_and_positions, parse_structure
from data import STYLES, build_prompt, format_response, load_data
from model import load_model, load_trainer_state, save_checkpoint

# ----------------------------------------------------------------------------------------------------
# Config


@dataclass
class SFTConfig:
    """Every knob of a run; override any of them with `--key=value`. `None` means "the default for
    this model", filled in by `resolve_defaults`:

        field           real model (the paper, §5.3)     model == "tiny" (the embedded demo)
        lr              1e-5                             1e-3
        batch_size      128 sequences                    32
        micro_batch_size 1 per GPU                       8 (length-sorted micro-batches pad little)
        warmup_ratio    0.1 (then cosine to 0)           0.05 (then cosine to 0)
        epochs/max_steps 5 epochs (released script)      400 steps (12.8k examples, 2.1M tokens)
        max_time        none                             none: a cut schedule ruins the model (a demo run on
                                                         shared cores stopped at step ~140 had 4% hard accuracy)
        max_length      min(4096, model context)         min(4096, model context) = 512

    The tiny numbers follow the prototype (TASK_NOTES: batch 32, lr 1e-3, 5% warm-up + cosine). The step
    count sets where GRPO starts: synthetic:hard:test Mean@8 at T = 1 (eval.py, 64 problems) after 240 /
    400 steps was 13 / 25%. At 400 steps stray characters are rare (a wrong block total or a garbled
    final line in 17% of the samples, against 41% at 240); most failures are the final two-digit sum,
    which the easy split rarely shows (data.py): a start in the learnable band (20-50%) whose errors sit at
    a few positions that RL can sharpen. 400 steps take about 4 min at ~9k tokens/s on 2 idle CPU cores.
    `--max_time` can still stop a run early (the summary then says so).
    """

    # what to train
    model: str = "tiny"                  # "tiny", a Hugging Face hub name, or a checkpoint folder
    tokenizer: str = ""                  # only with model="tiny": build it on this tokenizer instead
    data: str = "synthetic:easy,synthetic:medium,synthetic:hard"   # a data.load_data spec: parallel_gsm8k, a .jsonl, ...
    data_dir: str = ""                   # folder of the real data sets ("" = data.py's default)
    style: str = "parallel"              # "parallel" or "sequential" (plain CoT): prompt and synthetic traces
    parallel_fraction: float = 0.5       # synthetic traces: the chance that a round is a block, else one attempt
    mode: str = "unseen"                 # "unseen" (structured mask + positions) or "seen" (causal)
    prompt_file: str = ""                # a prompt template for data.build_prompt ("" = its default)
    limit: int = 0                       # use only the first `limit` records (0 = all)
    out_dir: str = "runs/sft"
    # optimisation (AdamW + linear warm-up + cosine decay to 0)
    lr: float | None = None
    batch_size: int | None = None        # global, in sequences, over all ranks and micro-batches
    micro_batch_size: int | None = None  # sequences per forward on one rank
    epochs: float | None = None          # used when max_steps is None
    max_steps: int | None = None
    max_time: float | None = None        # seconds of training in this process; 0 = no limit
    warmup_ratio: float | None = None
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0               # max global grad norm; 0 = no clipping
    max_length: int | None = None        # prompt + response tokens; longer examples are dropped
    seed: int = 0
    # systems
    fsdp: bool = False                   # FSDP2 (fully_shard each decoder layer, then the root)
    grad_checkpointing: bool = False     # recompute activations in the backward pass
    resume: str = ""                     # a checkpoint folder, or "True" = the latest in out_dir
    # logging, checkpoints, the end-of-run check
    log_every: int = 50                  # print a log line every N steps (0 = never); log.jsonl gets all
    save_every: int = 100                # checkpoint every N steps (0 = only at the end)
    keep_last: int = 2                   # checkpoints kept in out_dir (0 = all)
    eval_samples: int = 16               # greedy samples in the end-of-run summary (0 = none)
    eval_data: str = ""                  # "" = "<data>:test" for synthetic data, else the training data


def resolve_defaults(cfg: SFTConfig, world_size: int = 1) -> SFTConfig:
    """Fill the `None` fields of `cfg` for its model (see the table in `SFTConfig`).

    `max_length` stays None here; `train` sets it once the model's context length is known.
    Raises ValueError for an unknown style/mode or a batch that does not split evenly over ranks.
    """
    tiny = cfg.model == "tiny"
    d = dict(lr=1e-3, batch_size=32, warmup_ratio=0.05, max_time=0.0) if tiny else \
        dict(lr=1e-5, batch_size=128, warmup_ratio=0.1, max_time=0.0)
    cfg = dataclasses.replace(cfg, **{k: v for k, v in d.items() if getattr(cfg, k) is None})
    if cfg.max_steps is not None and cfg.max_steps < 1 or cfg.epochs is not None and cfg.epochs <= 0:
        raise ValueError("--max_steps must be >= 1 and --epochs > 0")
    if cfg.max_steps is None and cfg.epochs is None:
        cfg = dataclasses.replace(cfg, **({"max_steps": 700} if tiny else {"epochs": 5.0}))
    if cfg.micro_batch_size is None:
        cfg = dataclasses.replace(cfg, micro_batch_size=8 if tiny else 1)
    if cfg.style not in STYLES:
        raise ValueError(f"--style must be one of {STYLES}, got {cfg.style!r}")
    if cfg.mode not in ("seen", "unseen"):
        raise ValueError(f"--mode must be 'seen' or 'unseen', got {cfg.mode!r}")
    if cfg.batch_size < 1 or cfg.micro_batch_size < 1 or cfg.eval_samples < 0 or cfg.limit < 0:
        raise ValueError("--batch_size and --micro_batch_size must be >= 1, --eval_samples and --limit >= 0")
    if cfg.batch_size % world_size:
        raise ValueError(f"--batch_size={cfg.batch_size} does not split evenly over {world_size} ranks")
    return cfg


def _parse_value(text: str, hint, key: str):
    """Parse one `--key=value` string by the field's type annotation."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):          # e.g. float | None
        if text == "None" and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is not type(None):
                try:
                    return _parse_value(text, a, key)
                except ValueError as e:
                    errors.append(str(e))
        raise ValueError("; ".join(errors))
    if origin is tuple:                                      # e.g. tuple[float, float] <- "0.9,0.95"
        parts = text.strip("()").split(",")
        if len(parts) != len(args):
            raise ValueError(f"--{key} needs {len(args)} comma-separated values, got {text!r}")
        return tuple(_parse_value(p.strip(), a, key) for p, a in zip(parts, args))
    if hint is bool:
        if text.lower() in ("true", "1", "yes"):
            return True
        if text.lower() in ("false", "0", "no"):
            return False
        raise ValueError(f"--{key} must be True or False, got {text!r}")
    try:
        return hint(text)
    except ValueError:
        raise ValueError(f"--{key} must be {hint.__name__}, got {text!r}") from None


def parse_config(config_class, argv: list[str], base: dict | None = None):
    """nanoGPT-style command line: each argument is `--key=value` (or `--key value`), parsed by the
    field's type.

        parse_config(SFTConfig, ["--lr=3e-4", "--fsdp=True", "--betas=0.9,0.99"])
        -> SFTConfig(..., lr=0.0003, fsdp=True, betas=(0.9, 0.99), ...)

    Types: int, float, str, bool (True/False/1/0/yes/no), tuples ("0.9,0.95") and `X | None`
    ("None"). `base` (e.g. the config saved in a checkpoint) replaces the class defaults first, so the
    command line overrides it. `--help` prints the keys with their defaults and exits. Raises
    ValueError naming the argument for an unknown key, an argument not of the form --key=value, or a
    value of the wrong type.
    """
    hints = typing.get_type_hints(config_class)
    names = [f.name for f in dataclasses.fields(config_class)]
    if any(a in ("-h", "--help") for a in argv):          # list the keys and their defaults, then stop
        print(config_class.__doc__)
        for f in dataclasses.fields(config_class):
            print(f"  --{f.name}={f.default}")
        raise SystemExit(0)
    values = {k: v for k, v in (base or {}).items() if k in names}
    joined, i = [], 0                                      # `--key value` -> `--key=value`
    while i < len(argv):
        a = argv[i]
        if a.startswith("--") and "=" not in a and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            joined.append(f"{a}={argv[i + 1]}")
            i += 2
        else:
            joined.append(a)
            i += 1
    for arg in joined:
        m = re.fullmatch(r"--([A-Za-z_][A-Za-z0-9_]*)=(.*)", arg, flags=re.S)
        if not m:
            raise ValueError(f"bad argument {arg!r}: write --key=value (keys: {', '.join(names)})")
        key, text = m.groups()
        if key not in names:
            raise ValueError(f"unknown config key --{key} (keys: {', '.join(names)})")
        values[key] = _parse_value(text, hints[key], key)
    if isinstance(values.get("betas"), list):               # a config saved by torch.save keeps tuples,
        values["betas"] = tuple(values["betas"])            # one that went through JSON has lists
    return config_class(**values)


# ----------------------------------------------------------------------------------------------------
# Distributed setup (one process when RANK is not set)


@dataclass
class DistInfo:
    rank: int                  # global rank, 0..world_size-1
    world_size: int
    local_rank: int            # index of this process's GPU on its node
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup_distributed() -> DistInfo:
    """Join the process group torchrun set up, or run as a single process.

    Under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT in the environment): nccl on
    GPUs (one GPU per process, cuda:LOCAL_RANK), gloo on CPU. Without RANK: world_size 1, device
    cuda if available else cpu, and no process group (every collective helper below is then a no-op).
    A process group that already exists is reused (initialise it once per process: a second
    init after destroy_process_group can deadlock on torchrun's store).
    """
    if "RANK" not in os.environ:
        return DistInfo(0, 1, 0, torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    if dist.is_initialized():
        device = torch.device("cuda", local) if torch.cuda.is_available() else torch.device("cpu")
        return DistInfo(rank, world, local, device)
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return DistInfo(rank, world, local, device)


def teardown_distributed():
    """Leave the process group (no-op for a single process)."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def all_reduce(x: float | int | bool, device: torch.device, op: str = "sum") -> float:
    """`op` ("sum" or "max") of a Python number over all ranks; the number itself for one process."""
    if not dist.is_initialized():
        return float(x)
    t = torch.tensor(float(x), dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return t.item()


# ----------------------------------------------------------------------------------------------------
# Data: records -> token ids -> padded batches


@dataclass
class Example:
    prompt_ids: list[int]      # the prompt (chat template included); never a target
    response_ids: list[int]    # the solution tokens + [eos]; every one is a target


def encode_prompt(tokenizer, problem: str, style: str = "parallel", prompt_file: str | None = None) -> list[int]:
    """Prompt token ids exactly as the sampler sees them: `data.build_prompt` (the chat template when
    the tokenizer has one, which already holds any BOS), tokenized without adding special tokens."""
    text = build_prompt(tokenizer, problem, style=style, prompt_file=prompt_file or None)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def tokenize_records(records: list[dict], tokenizer, style: str, max_length: int,
                     prompt_file: str | None = None, log=print) -> list[Example]:
    """Turn data records into `Example`s, dropping what cannot be trained on correctly.

    Dropped, with a printed count: examples whose prompt + response exceed `max_length` tokens
    (never truncated: a cut would leave an unclosed block, mis-masked), and responses whose parallel
    structure `attention.parse_structure` rejects (the Unseen mask needs well-formed blocks).
    Raises ValueError when the tokenizer lacks the six tags (load it with model.load_model), a record
    has no solution to train on (data.format_response), or nothing is left.
    """
    tags = TagIds.from_tokenizer(tokenizer)
    if not records:
        raise ValueError("no records to train on: check --data")
    prompts = [build_prompt(tokenizer, r["problem"], style=style, prompt_file=prompt_file) for r in records]
    solutions = [format_response(r) for r in records]
    # one batched call each (the Rust tokenizer is much faster that way); the same ids as encode_prompt
    prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    solution_ids = tokenizer(solutions, add_special_tokens=False)["input_ids"]
    examples, too_long, malformed, first_reason = [], 0, 0, ""
    for r, prompt, solution in zip(records, prompt_ids, solution_ids):
        response = solution + [tags.eos]
        if len(prompt) + len(response) > max_length:
            too_long += 1
            continue
        structure = parse_structure(response, tags)
        if not structure.valid:
            malformed += 1
            first_reason = first_reason or f"{r.get('id', '?')}: {structure.reason}"
            continue
        examples.append(Example(prompt, response))
    if too_long:
        log(f"dropped {too_long} of {len(records)} examples longer than max_length={max_length} tokens")
    if malformed:
        log(f"dropped {malformed} of {len(records)} examples with a malformed parallel structure "
            f"(first: {first_reason})")
    if not examples:
        raise ValueError(f"no training examples left out of {len(records)} records "
                         f"({too_long} too long, {malformed} malformed): check --data and --max_length")
    return examples


@dataclass
class Batch:
    input_ids: torch.Tensor        # (B, L) long: prompt, response, right padding
    attention_mask: torch.Tensor   # (B, L) long: 1 on real tokens
    prompt_lengths: list[int]      # (B,)
    loss_mask: torch.Tensor        # (B, L) float: 1 where the token is a response token (a target)

    def to(self, device) -> "Batch":
        return Batch(self.input_ids.to(device), self.attention_mask.to(device), self.prompt_lengths,
                     self.loss_mask.to(device))


def collate(examples: list[Example], pad_id: int) -> Batch:
    """Right-pad a list of examples to the longest one.

        prompt [5, 6], response [7, 1]       ->  input_ids [5, 6, 7, 1, pad]  loss_mask [0, 0, 1, 1, 0]
        prompt [5],    response [8, 9, 4, 1] ->  input_ids [5, 8, 9, 4, 1]    loss_mask [0, 1, 1, 1, 1]
    """
    L = max(len(e.prompt_ids) + len(e.response_ids) for e in examples)
    B = len(examples)
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    attention_mask = torch.zeros(B, L, dtype=torch.long)
    loss_mask = torch.zeros(B, L)
    for b, e in enumerate(examples):
        p, n = len(e.prompt_ids), len(e.prompt_ids) + len(e.response_ids)
        input_ids[b, :n] = torch.tensor(e.prompt_ids + e.response_ids)
        attention_mask[b, :n] = 1
        loss_mask[b, p:n] = 1
    return Batch(input_ids, attention_mask, [len(e.prompt_ids) for e in examples], loss_mask)


def shard_micro_batches(examples: list[Example], batch_indices: list[int], rank: int, world_size: int,
                        micro_batch_size: int, pad_id: int) -> list[Batch]:
    """This rank's share of a global batch, cut into micro-batches.

    Rank r takes the r-th contiguous slice of len(batch_indices) / world_size indices (disjoint
    across ranks, together the whole batch), sorts it by length (shortest first, so each micro-batch
    pads little: 1.6x faster for the tiny model; the loss is a sum over the whole batch, so the grouping
    does not change it), then cuts chunks of `micro_batch_size` (the last may be smaller). E.g. 8
    indices, 2 ranks, micro-batch 3, equal lengths: rank 0 gets [i0 i1 i2] [i3], rank 1 [i4 i5 i6] [i7].
    Every rank gets the same number of micro-batches, which DDP's no_sync() pattern needs.
    """
    per_rank = len(batch_indices) // world_size
    mine = batch_indices[rank * per_rank:(rank + 1) * per_rank]
    mine = sorted(mine, key=lambda i: len(examples[i].prompt_ids) + len(examples[i].response_ids))
    return [collate([examples[i] for i in mine[j:j + micro_batch_size]], pad_id)
            for j in range(0, per_rank, micro_batch_size)]


class ShuffledStream:
    """An endless stream of example indices, freshly shuffled each epoch (seeded by seed + epoch).

    `(epoch, index)` is the position of the next index to hand out: all a resume needs, since the
    order of every epoch is a pure function of the seed. A global batch may span two epochs.
    """

    def __init__(self, n: int, seed: int, epoch: int = 0, index: int = 0):
        if not 0 <= index <= n:
            raise ValueError(f"data position {index} is outside the {n} examples: resume with the data "
                             "the checkpoint was trained on")
        self.n, self.seed, self.epoch, self.index = n, seed, epoch, index
        self._order = self._shuffle(epoch)

    def _shuffle(self, epoch: int) -> list[int]:
        return torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + epoch)).tolist()

    def take(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.index == self.n:
                self.epoch, self.index = self.epoch + 1, 0
                self._order = self._shuffle(self.epoch)
            take = min(k - len(out), self.n - self.index)
            out += self._order[self.index:self.index + take]
            self.index += take
        return out

    def position(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}


# ----------------------------------------------------------------------------------------------------
# Loss and one training step


def compute_dtype(device: torch.device) -> torch.dtype:
    """bf16 compute on GPUs (weights and optimizer stay fp32), fp32 on CPU."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def response_nll(model, batch: Batch, tags: TagIds, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed next-token NLL over the response tokens of a batch, and how many there are.

    One forward with the Seen (causal) or Unseen (structured) mask and positions, built in the compute
    dtype (an additive mask must match the attention's dtype). Targets follow *sequence* order:
    logits[:, t] predicts input_ids[:, t+1], whatever the position ids say (as in the official trainer),
    and only targets that are response tokens count.
    Returns (nll_sum: scalar float32 with grad, n_tokens: scalar float32).
    """
    device = batch.input_ids.device
    dtype = compute_dtype(device)
    mask, position_ids = build_mask_and_positions(batch.input_ids, batch.prompt_lengths, batch.attention_mask,
                                                  tags, mode, dtype=dtype)
    autocast = torch.autocast("cuda", dtype=dtype) if device.type == "cuda" else nullcontext()
    with autocast:
        logits = model(input_ids=batch.input_ids, attention_mask=mask, position_ids=position_ids,
                       use_cache=False).logits                                  # (B, L, V)
    targets = batch.input_ids[:, 1:]                                            # (B, L-1)
    nll = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), targets.flatten(), reduction="none")
    weights = batch.loss_mask[:, 1:]                                            # target is a response token
    return (nll.view_as(targets) * weights).sum(), weights.sum()


def grad_sync(model, enabled: bool):
    """Gradient all-reduce on or off for the next backward: DDP's no_sync(), FSDP2's
    set_requires_gradient_sync(); a no-op for a plain model."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return nullcontext() if enabled else model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(enabled)
    return nullcontext()


def accumulate_gradients(model, micro_batches: list[Batch], tags: TagIds, mode: str, world_size: int = 1,
                         device: torch.device | None = None) -> tuple[float, float]:
    """Forward + backward over this rank's micro-batches so that the gradients (after DDP's or FSDP's
    average over ranks) are those of  sum(all response-token NLLs) / (all response tokens)  of the
    global batch (§8.2.6 done right). Gradients only sync on the last micro-batch.

    Returns (global_nll_sum, global_tokens) as Python floats; their ratio is the step's loss.
    """
    device = device or micro_batches[0].input_ids.device
    local_tokens = sum(mb.loss_mask[:, 1:].sum().item() for mb in micro_batches)
    global_tokens = all_reduce(local_tokens, device)      # known before the first backward
    nll_total = 0.0
    for i, mb in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with grad_sync(model, enabled=last):
            nll_sum, _ = response_nll(model, mb.to(device), tags, mode)
            (nll_sum * (world_size / global_tokens)).backward()
        nll_total += nll_sum.item()
    return all_reduce(nll_total, device), global_tokens


def train_step(model, optimizer, scheduler, micro_batches: list[Batch], tags: TagIds, mode: str,
               grad_clip: float, world_size: int = 1, device: torch.device | None = None) -> dict:
    """One optimizer step on one global batch: accumulate, clip, step, schedule.
    Returns {"loss": token-mean NLL of the global batch, "grad_norm": before clipping,
    "loss_tokens": global response tokens, "lr": the lr this step used}."""
    lr = optimizer.param_groups[0]["lr"]
    nll_sum, n_tokens = accumulate_gradients(model, micro_batches, tags, mode, world_size, device)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip > 0 else float("inf"))
    if hasattr(grad_norm, "full_tensor"):                      # FSDP2: a DTensor
        grad_norm = grad_norm.full_tensor()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return {"loss": nll_sum / n_tokens, "grad_norm": grad_norm.item(), "loss_tokens": n_tokens, "lr": lr}


# ----------------------------------------------------------------------------------------------------
# Optimizer and schedule


def build_optimizer(model, lr: float, weight_decay: float = 0.01, betas=(0.9, 0.95)) -> torch.optim.AdamW:
    """AdamW over all parameters with decay on all of them, as the official FSDP trainers do (§5.3)."""
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, betas=tuple(betas))


def build_scheduler(optimizer, total_steps: int, warmup_ratio: float = 0.0, min_lr_ratio: float = 0.0):
    """Linear warm-up over ceil(warmup_ratio * total_steps) steps, then cosine decay to
    min_lr_ratio * lr at the last step. Multiplier of step s (0-based) with W warm-up steps:

        s < W:  (s + 1) / W                  e.g. W=2: 0.5, 1.0, ...
        else:   m + (1 - m) * 0.5 * (1 + cos(pi * (s - W) / max(1, total - W - 1)))

    `warmup_ratio=0` with `total_steps=1` gives a constant lr (GRPO's default in the paper).
    """
    warmup = math.ceil(warmup_ratio * total_steps)

    def multiplier(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup - 1))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, multiplier)


# ----------------------------------------------------------------------------------------------------
# Checkpoints with trainer state


def rng_state() -> dict:
    """The RNG states a bit-exact resume restores: torch (CPU and CUDA), Python `random`, numpy."""
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state(),
            "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None}   # this rank's GPU


def set_rng_state(state: dict):
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def find_latest_checkpoint(out_dir: str) -> str:
    """The `checkpoint-<step>` folder with the highest step in `out_dir` that has a trainer state.
    Raises FileNotFoundError naming out_dir when there is none."""
    found = []
    for path in glob.glob(os.path.join(out_dir, "checkpoint-*")):
        m = re.fullmatch(r"checkpoint-(\d+)", os.path.basename(path))
        if m and os.path.isfile(os.path.join(path, "trainer_state.pt")):
            found.append((int(m.group(1)), path))
    if not found:
        raise FileNotFoundError(f"--resume=True found no checkpoint-<step> folder with a trainer_state.pt "
                                f"in {out_dir!r}; pass --resume=<checkpoint folder> or --out_dir")
    return max(found)[1]


def save_training_checkpoint(path: str, model, tokenizer, optimizer, scheduler, trainer_state: dict,
                             dist_info: DistInfo, fsdp: bool = False) -> str | None:
    """Write `path` (HF weights + tokenizer + trainer_state.pt) from rank 0; every rank must call it.

    `trainer_state` holds the caller's fields (step, data position, config, ...); the optimizer,
    scheduler and RNG states are added here (rank 0's RNG: every rank is seeded and draws alike).
    Under FSDP the full (unsharded) model and optimizer state dicts are gathered to rank 0's CPU
    first (a collective). Returns `path` on rank 0, None elsewhere.
    """
    state_dict = optim_state = None
    if fsdp:
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                             get_optimizer_state_dict)
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state_dict = get_model_state_dict(model, options=opts)
        optim_state = get_optimizer_state_dict(model, optimizer, options=opts)
    if dist_info.is_main:
        full = dict(trainer_state, optimizer=optim_state if fsdp else optimizer.state_dict(),
                    scheduler=scheduler.state_dict(), rng=rng_state())
        kw = {"state_dict": state_dict} if fsdp else {}
        save_checkpoint(path, model, tokenizer, trainer_state=full, **kw)
    if dist.is_initialized():
        dist.barrier()
    return path if dist_info.is_main else None


def load_training_state(path: str, model, optimizer, scheduler, fsdp: bool = False) -> dict:
    """Restore optimizer and scheduler from `path/trainer_state.pt` (the weights were already loaded
    from `path` by load_model) and return the whole trainer state (step, data position, config, rng).
    The RNG states are *not* set here: call `set_rng_state(state["rng"])` right before training."""
    state = load_trainer_state(path)
    if fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
        set_optimizer_state_dict(model, optimizer, state["optimizer"],
                                 options=StateDictOptions(full_state_dict=True))
    else:
        optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return state


def prune_checkpoints(out_dir: str, keep_last: int):
    if keep_last <= 0:
        return
    paths = sorted(glob.glob(os.path.join(out_dir, "checkpoint-*")),
                   key=lambda p: int(re.sub(r"\D", "", os.path.basename(p)) or -1))
    for p in paths[:-keep_last]:
        shutil.rmtree(p, ignore_errors=True)


# ----------------------------------------------------------------------------------------------------
# End-of-run check: a few greedy samples


def quick_eval(model, tokenizer, records: list[dict], mode: str, n: int, *, prompt_file: str | None = None,
               max_new_tokens: int = 256, seed: int = 0) -> dict:
    """Greedy-sample the first `n` records with the branching sampler; measure format and accuracy.
    Records whose prompt + max_new_tokens exceed the model's context are skipped (and counted in notes).

    Args:
        mode: the sampler's mode: "unseen", "seen" or "sequential" (sequential = the plain-CoT prompt).
    Returns:
        {"n": samples, "format_valid": fraction whose response passes rewards.check_format (or
        parse_structure without rewards.py), "parallel": fraction with >= 1 parallel block,
        "accuracy": fraction with rewards.verify(extract_answer(text), answer) (None without
        rewards.py), "example": the first response text, "notes": what was skipped and why}.
        Nothing is sampled (all None) when sample.py is not there yet.
    """
    out = {"n": 0, "format_valid": None, "parallel": None, "accuracy": None, "example": "", "notes": []}
    try:
        from sample import generate
    except ModuleNotFoundError as e:
        if e.name != "sample":
            raise
        out["notes"].append("sample.py is not available: greedy samples skipped")
        return out
    try:
        import rewards
    except ModuleNotFoundError as e:
        if e.name != "rewards":
            raise
        rewards = None
        out["notes"].append("rewards.py is not available: accuracy skipped, format = parse_structure")
    style = "sequential" if mode == "sequential" else "parallel"
    from eval import split_by_context

    context = getattr(model.config, "max_position_embeddings", None)
    prompts = [encode_prompt(tokenizer, r["problem"], style, prompt_file) for r in records]
    fit, over = split_by_context([len(p) for p in prompts], max_new_tokens, context)
    if over:
        out["notes"].append(f"skipped {len(over)} problems whose prompt + {max_new_tokens} new tokens exceed the "
                            f"model's context of {context}")
    records, prompts = [records[i] for i in fit[:n]], [prompts[i] for i in fit[:n]]
    if not records:
        return out
    was_training = model.training
    model.eval()
    rollouts = generate(model, tokenizer, prompts, group_size=1, mode=mode, max_new_tokens=max_new_tokens,
                        greedy=True, seed=seed)
    model.train(was_training)
    if rewards is not None:
        valid = [rewards.check_format(r.response_ids, tokenizer=tokenizer)[0] for r in rollouts]
        correct = [rewards.verify(rewards.extract_answer(r.text), rec["answer"]) for r, rec in zip(rollouts, records)]
        out["accuracy"] = sum(correct) / len(correct)
    else:
        valid = [r.structure.valid for r in rollouts]
    out.update(n=len(rollouts), format_valid=sum(valid) / len(valid),
               parallel=sum(bool(r.structure.blocks) for r in rollouts) / len(rollouts), example=rollouts[0].text)
    return out


# ----------------------------------------------------------------------------------------------------
# The training run


def train(cfg: SFTConfig, records: list[dict] | None = None) -> dict:
    """Run SFT as configured (one process, or one rank under torchrun) and return a summary dict:
    {"checkpoint", "steps", "final_loss", "seconds", "tokens_per_s", "eval"} (eval on rank 0 only).

    `records` (data.load_data-style dicts) replace `cfg.data` when given (tests, notebooks).
    Raises FileNotFoundError for a missing --resume checkpoint, OSError (from load_model) for a
    missing --model, ValueError for an empty dataset or a tokenizer without the tags.
    """
    owns_group = not dist.is_initialized()           # a caller's process group stays up
    dist_info = setup_distributed()
    try:
        return _train(cfg, records, dist_info)
    finally:
        if owns_group:
            teardown_distributed()


def _train(cfg: SFTConfig, records: list[dict] | None, dist_info: DistInfo) -> dict:
    log = print if dist_info.is_main else (lambda *a, **k: None)
    device, world = dist_info.device, dist_info.world_size
    cfg = resolve_defaults(cfg, world)
    if cfg.fsdp and not dist.is_initialized():
        raise ValueError("--fsdp=True shards the model over processes: launch with torchrun "
                         "(torchrun --nproc_per_node=<gpus> sft.py --fsdp=True ...)")
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)

    # --- model: fresh, or the weights of the checkpoint we resume from. fp32 master weights always.
    resume_path = ""
    if cfg.resume:
        resume_path = find_latest_checkpoint(cfg.out_dir) if cfg.resume.lower() == "true" else cfg.resume
        if not os.path.isfile(os.path.join(resume_path, "trainer_state.pt")):
            raise FileNotFoundError(f"--resume={cfg.resume!r}: {resume_path!r} is not a checkpoint folder "
                                    "with a trainer_state.pt (written by sft.py)")
    model, tokenizer = load_model(resume_path or cfg.model, dtype=torch.float32, device=device,
                                  tokenizer=(cfg.tokenizer or None) if not resume_path and cfg.model == "tiny" else None,
                                  seed=cfg.seed)
    context = getattr(model.config, "max_position_embeddings", None) or 4096
    if cfg.max_length is None:
        cfg = dataclasses.replace(cfg, max_length=min(4096, context))
    tags = TagIds.from_tokenizer(tokenizer)

    # --- data
    records_given = records is not None
    if records is None:
        records = load_data(cfg.data, style=cfg.style, limit=cfg.limit or None, seed=cfg.seed,
                            data_dir=cfg.data_dir or None, tokenizer=tokenizer, parallel_fraction=cfg.parallel_fraction)
    elif cfg.limit:
        records = records[:cfg.limit]
    examples = tokenize_records(records, tokenizer, cfg.style, cfg.max_length, cfg.prompt_file or None, log=log)
    total_steps = cfg.max_steps or math.ceil(cfg.epochs * len(examples) / cfg.batch_size)
    per_rank = cfg.batch_size // world                    # sequences per rank per step

    # --- parallel wrappers, optimizer, schedule
    if cfg.grad_checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    if cfg.fsdp:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
            if device.type == "cuda" else MixedPrecisionPolicy()
        for layer in model.model.layers:                  # one all-gather per decoder layer ...
            fully_shard(layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)                  # ... and one for embeddings, norm, lm_head
        train_model = model
    elif world > 1:
        train_model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    else:
        train_model = model
    optimizer = build_optimizer(train_model, cfg.lr, cfg.weight_decay, cfg.betas)
    scheduler = build_scheduler(optimizer, total_steps, cfg.warmup_ratio)

    step, position, rng = 0, {"epoch": 0, "index": 0}, None
    if resume_path:
        state = load_training_state(resume_path, train_model, optimizer, scheduler, fsdp=cfg.fsdp)
        step, position, rng = state["step"], state["data_position"], state["rng"]
        log(f"resumed from {resume_path} at step {step} (epoch {position['epoch']}, index {position['index']})")
    stream = ShuffledStream(len(examples), cfg.seed, **position)

    # --- output folder: a fresh run replaces an earlier run's checkpoints and log
    if dist_info.is_main:
        os.makedirs(cfg.out_dir, exist_ok=True)
        if not resume_path:
            old = glob.glob(os.path.join(cfg.out_dir, "checkpoint-*"))
            for p in old:
                shutil.rmtree(p, ignore_errors=True)
            if old:
                log(f"removed {len(old)} checkpoint(s) of an earlier run in {cfg.out_dir} (--resume=True continues one)")
        log_path, kept = os.path.join(cfg.out_dir, "log.jsonl"), []
        if resume_path and os.path.isfile(log_path):       # keep the log lines up to the resumed step
            kept = [line for line in open(log_path) if json.loads(line)["step"] <= step]
        log_file = open(log_path, "w")
        log_file.writelines(kept)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"SFT {cfg.model} ({n_params / 1e6:.2f}M params) on {len(examples)} examples of {cfg.data}, "
        f"mode={cfg.mode}, style={cfg.style} | {world} rank(s) on {device.type}, "
        f"batch {cfg.batch_size} = {world} x {math.ceil(per_rank / cfg.micro_batch_size)} micro-batch(es) "
        f"of <= {cfg.micro_batch_size} | lr {cfg.lr}, {total_steps} steps"
        + (f", max_time {cfg.max_time:.0f}s" if cfg.max_time else ""))

    # --- the loop
    bar = tqdm(total=total_steps, initial=step, disable=not dist_info.is_main, dynamic_ncols=True, desc="sft")
    if rng is not None:
        set_rng_state(rng)
    t_start = time.time()
    losses, tokens_seen, ckpt = [], 0, resume_path or None
    stopped_early = False
    while step < total_steps:
        t0 = time.time()
        micro_batches = shard_micro_batches(examples, stream.take(cfg.batch_size), dist_info.rank, world,
                                            cfg.micro_batch_size, tokenizer.pad_token_id)
        stats = train_step(train_model, optimizer, scheduler, micro_batches, tags, cfg.mode, cfg.grad_clip,
                           world, device)
        step += 1
        tokens = all_reduce(sum(mb.attention_mask.sum().item() for mb in micro_batches), device)
        dt = time.time() - t0
        tokens_seen += tokens
        losses.append(stats["loss"])
        elapsed = time.time() - t_start
        if dist_info.is_main:
            row = dict(step=step, loss=stats["loss"], lr=stats["lr"], grad_norm=stats["grad_norm"],
                       tokens=int(tokens), loss_tokens=int(stats["loss_tokens"]), tokens_per_s=tokens / dt,
                       elapsed=elapsed, epoch=stream.epoch)
            log_file.write(json.dumps(row) + "\n")
            log_file.flush()
            bar.set_postfix(loss=f"{stats['loss']:.4f}", tok_s=f"{tokens / dt:,.0f}")
            bar.update(1)
            if cfg.log_every and step % cfg.log_every == 0:
                bar.write(f"step {step}: loss {stats['loss']:.4f}, lr {stats['lr']:.2e}, "
                          f"grad_norm {stats['grad_norm']:.3f}, {tokens / dt:,.0f} tok/s")
        # all ranks stop together (when any rank's clock runs out), or the next collective would hang
        out_of_time = bool(cfg.max_time) and all_reduce(elapsed > cfg.max_time, device, "max") > 0
        last = step == total_steps or out_of_time
        if last or (cfg.save_every and step % cfg.save_every == 0):
            state = {"step": step, "data_position": stream.position(), "config": dataclasses.asdict(cfg)}
            ckpt = save_training_checkpoint(os.path.join(cfg.out_dir, f"checkpoint-{step}"), train_model,
                                            tokenizer, optimizer, scheduler, state, dist_info, fsdp=cfg.fsdp)
            if dist_info.is_main:
                prune_checkpoints(cfg.out_dir, cfg.keep_last)
        if out_of_time and step < total_steps:
            stopped_early = True
            break
    bar.close()
    seconds = time.time() - t_start
    if dist_info.is_main:
        log_file.close()

    summary = {"checkpoint": ckpt, "steps": step, "total_steps": total_steps, "stopped_early": stopped_early,
               "final_loss": float(np.mean(losses[-10:])) if losses else None, "seconds": seconds,
               "tokens_per_s": tokens_seen / seconds if seconds > 0 else 0.0, "eval": None}
    # --- the end-of-run check: a few greedy samples on rank 0 (a sharded FSDP model would need every rank)
    if dist_info.is_main and cfg.eval_samples and not cfg.fsdp:
        if cfg.eval_data:
            eval_name, eval_records = cfg.eval_data, load_data(cfg.eval_data, style=cfg.style, limit=cfg.eval_samples,
                                                               data_dir=cfg.data_dir or None, tokenizer=tokenizer)
        elif records_given or not all(re.fullmatch(r"synthetic:\w+", n.strip()) for n in cfg.data.split(",")):
            eval_name, eval_records = f"{cfg.data} (training problems)", records
        else:                                             # held-out problems of the synthetic task
            eval_name = ",".join(n.strip() + ":test" for n in cfg.data.split(","))
            eval_records = load_data(eval_name, style=cfg.style, limit=cfg.eval_samples, data_dir=cfg.data_dir or None)
        sample_mode = "sequential" if cfg.style == "sequential" else cfg.mode
        # budget: twice the longest training response, within max_length (an untrained model rambles)
        budget = min(cfg.max_length - max(len(e.prompt_ids) for e in examples),
                     2 * max(len(e.response_ids) for e in examples))
        summary["eval"] = quick_eval(model, tokenizer, eval_records, sample_mode, cfg.eval_samples,
                                     prompt_file=cfg.prompt_file or None, seed=cfg.seed, max_new_tokens=max(1, budget))
        summary["eval"]["data"] = eval_name
    elif dist_info.is_main and cfg.fsdp:
        summary["eval"] = {"notes": ["FSDP run: no greedy samples here; evaluate the checkpoint with eval.py"]}
    if dist_info.is_main:
        print_summary(summary, cfg)
    return summary


def print_summary(summary: dict, cfg: SFTConfig):
    """The end-of-run report: where the checkpoint is, the loss, speed and the greedy-sample check."""
    s = summary
    print("\n" + "=" * 78)
    how = (f"stopped by max_time={cfg.max_time:.0f}s at step {s['steps']} of {s['total_steps']} "
           "(the cosine schedule did not finish)") if s["stopped_early"] else f"{s['steps']} steps"
    print(f"SFT done: {how} in {s['seconds']:.0f}s, {s['tokens_per_s']:,.0f} tokens/s")
    print(f"final loss (mean of the last 10 steps): {s['final_loss']:.4f}" if s["final_loss"] is not None else "")
    print(f"checkpoint: {s['checkpoint']}    (load: model.load_model(path); continue: --resume=True)")
    print(f"log: {os.path.join(cfg.out_dir, 'log.jsonl')}")
    e = s.get("eval") or {}
    if e.get("n"):
        pct = lambda x: "n/a" if x is None else f"{100 * x:.0f}%"
        print(f"greedy samples on {e['n']} problems of {e.get('data')}: format valid {pct(e['format_valid'])}, "
              f"with a parallel block {pct(e['parallel'])}, accuracy {pct(e['accuracy'])}")
        print("first sample: " + e["example"][:300].replace("\n", "\\n"))
    for note in e.get("notes", []):
        print(f"note: {note}")
    print("=" * 78)


def main(argv: list[str] | None = None) -> dict:
    """Parse `--key=value` arguments and train. With --resume, the config saved in the checkpoint is
    the base and the command line overrides it (e.g. --max_steps to train further)."""
    argv = sys.argv[1:] if argv is None else argv
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()                      # our own bar is enough
    return train(parse_config_with_resume(SFTConfig, argv))


def parse_config_with_resume(config_class, argv: list[str]):
    """`parse_config`, except that with --resume the config saved in that checkpoint is the base and the
    command line overrides it (e.g. --max_steps to train further). Used by sft.py and grpo.py."""
    cfg = parse_config(config_class, argv)
    if cfg.resume:
        path = find_latest_checkpoint(cfg.out_dir) if cfg.resume.lower() == "true" else cfg.resume
        saved = load_trainer_state(path)["config"]
        fields = {f.name for f in dataclasses.fields(config_class)}
        if ("recipe" in saved) != ("recipe" in fields):  # only grpo.py's config has a recipe
            script = "grpo.py" if "recipe" in saved else "sft.py"
            raise ValueError(f"--resume: {path!r} was written by {script}, and --resume continues a run of the "
                             "same script; to start from it, pass --model=" + path)
        cfg = parse_config(config_class, argv, base=dict(saved, resume=path))
    return cfg


if __name__ == "__main__":
    try:
        main()
    except (OSError, ValueError) as e:                # bad input: the message says what to do
        sys.exit(f"sft.py: error: {e}")
