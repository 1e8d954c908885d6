"""Cold-start SFT: teach a model the parallel format by imitation (NOTES.md §6, stage 1); and the training plumbing
grpo.py builds on (ranks, optimizer and schedule, checkpoints with an exact resume, shuffled data streams).

    python sft.py                                   # tiny model, synthetic traces, ~4 min on 2 CPU cores
    python sft.py --mode=seen --max_steps=100       # any config field: --key=value or --key value
    python sft.py --resume=True                     # continue the latest checkpoint in out_dir, exactly
    torchrun --nproc_per_node=8 sft.py --model=Qwen/Qwen3-4B-Base --data=parallel_gsm8k --fsdp=True \\
        --grad_checkpointing=True --out_dir=runs/sft_qwen3_4b     # the paper's Unseen SFT (NOTES.md §5)

The loss: the summed NLL of the trace + EOS (the tags the sampler will inject included; the prompt is no target)
under the mode's mask and positions (attention.py), over the response tokens of the *whole global batch* (the
official trainer backpropagated each micro-batch's own mean, 16x too large before clipping, NOTES.md §8).
out_dir/checkpoint-<step>: a Hugging Face folder + trainer_state.pt (optimizer, schedule, RNGs, data position).
"""
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
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Literal

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # idle OpenMP threads sleep: spinning ones made a step 5x slower

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_optimizer_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from tqdm import tqdm
from transformers.utils import logging as hf_logging

import config
from attention import TagIds, parse_structure, structured_forward
from data import TINY_VOCAB_LIMIT, Style, build_prompt, format_response, load_data
from eval import evaluate, fit_context, own_tokenizer
from model import checkpoints, load_model, load_trainer_state, move_aside, save_checkpoint

@dataclass
class SFTConfig:
    """python sft.py: cold-start SFT. None = the preset of the model (TINY or PAPER below)."""
    model: str = "tiny"                  # "tiny", a Hugging Face hub name, or a checkpoint folder
    tokenizer: str = ""                  # model "tiny" only: build it on this tokenizer instead of characters
    data: str = "synthetic:easy"         # a data.load_data spec (parallel_gsm8k, a file); the tiny cold start: easy
    data_dir: str = ""                   # folder of the real data sets ("" = data.py's default)
    style: Style = "parallel"            # parallel, or sequential (plain CoT): the prompt and the synthetic traces
    parallel_fraction: float = 0.5       # synthetic traces: the chance that a round is a block, else one attempt
    mode: Literal["unseen", "seen"] = "unseen"   # the Unseen mask and positions, or causal
    prompt_file: str = ""                # a prompt template for data.build_prompt ("" = its default)
    limit: int = 0                       # use only the first `limit` records (0 = all)
    out_dir: str = "runs/sft"
    lr: float | None = None              # AdamW, linear warm-up, cosine to 0
    batch_size: int | None = None        # sequences per step, over all ranks and micro-batches
    micro_batch_size: int | None = None  # sequences per forward on one rank
    epochs: float | None = None          # used when max_steps is None
    max_steps: int | None = None
    max_time: float | None = None        # seconds of training in this process; 0 = no limit
    warmup_ratio: float | None = None
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0               # max global grad norm; 0 = no clipping
    max_length: int | None = None        # prompt + response tokens (longer ones dropped); None = min(4096, context)
    seed: int = 0
    fsdp: bool = False                   # FSDP2 (fully_shard each decoder layer, then the root); under torchrun
    grad_checkpointing: bool = False     # recompute activations in the backward pass
    resume: str = ""                     # a checkpoint folder, or True = the latest in out_dir (False = none)
    log_every: int = 50                  # print a line every N steps (0 = never); log.jsonl gets all
    save_every: int = 100                # checkpoint every N steps (0 = only at the end)
    keep_last: int = 2                   # checkpoints kept in out_dir (0 = all)
    eval_samples: int = 16               # greedy samples in the end-of-run summary (0 = none)
    eval_data: str = ""                  # "" = "<data>:test" for synthetic data, else the training problems
    wandb_project: str = ""              # also log log.jsonl's rows to this Weights & Biases project (needs wandb)

# The tiny model: 400 steps on the easy split (the curriculum: RL meets the longer lists); the paper's: NOTES.md §5.
TINY = dict(lr=1e-3, batch_size=32, micro_batch_size=8, warmup_ratio=0.05, max_time=0.0)
PAPER = dict(lr=1e-5, batch_size=128, micro_batch_size=1, warmup_ratio=0.1, max_time=0.0)

def resolve_defaults(cfg: SFTConfig, world_size: int = 1, tiny: bool | None = None) -> SFTConfig:
    """The preset in the None fields: TINY for the tiny model (default: --model=tiny), else PAPER (max_length waits
    for the model's context)."""
    tiny = cfg.model == "tiny" if tiny is None else tiny
    cfg = config.fill(cfg, TINY if tiny else PAPER)
    if cfg.max_steps is None and cfg.epochs is None:
        cfg = dataclasses.replace(cfg, **({"max_steps": 400} if tiny else {"epochs": 5.0}))
    config.at_least(cfg, 1, "batch_size", "micro_batch_size", "max_steps")
    config.at_least(cfg, 0, "limit", "eval_samples", "warmup_ratio", "grad_clip", "max_time", "log_every",
                    "save_every", "keep_last", "weight_decay")
    if cfg.warmup_ratio > 1:
        raise ValueError(f"--warmup_ratio={cfg.warmup_ratio}: the warm-up is a share of the steps, 0 to 1")
    config.at_least(cfg, 0, "lr", "epochs", above=True)
    if cfg.batch_size % world_size:
        raise ValueError(f"--batch_size={cfg.batch_size} does not split evenly over {world_size} ranks")
    return cfg

# Ranks (one process when RANK is not set)

@dataclass
class Dist:
    rank: int
    world_size: int
    device: torch.device
    is_main = property(lambda self: self.rank == 0)

@contextmanager
def distributed():
    """Join torchrun's process group (nccl, one GPU per process; gloo on CPU), reusing one that exists, and tear it
    down at the end if this call made it. Without RANK: one process, the collectives no-ops. Yields a Dist."""
    owns, cuda, local = not dist.is_initialized(), torch.cuda.is_available(), int(os.environ.get("LOCAL_RANK", 0))
    if "RANK" not in os.environ:
        d = Dist(0, 1, torch.device("cuda" if cuda else "cpu"))
    else:
        d = Dist(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), torch.device("cuda", local) if cuda else
                 torch.device("cpu"))
        if owns and cuda:
            torch.cuda.set_device(local)
        if owns:
            dist.init_process_group("nccl" if cuda else "gloo", device_id=d.device if cuda else None)
    try:
        yield d
    finally:
        if owns and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()

def all_reduce(values: list[float], device, op: str = "sum") -> list[float]:
    """Element-wise "sum" or "max" of numbers over ranks, in one collective; the numbers themselves for one process."""
    if not dist.is_initialized():
        return [float(v) for v in values]
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return t.tolist()

def grad_sync(model, enabled: bool):
    """Gradient all-reduce on or off for the next backward: DDP's no_sync(), FSDP2's set_requires_gradient_sync()."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return nullcontext() if enabled else model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(enabled)
    return nullcontext()

def autocast(device: torch.device):
    """bf16 compute on GPUs (the weights and the optimizer stay fp32), nothing on CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()

def forward(model, batch, tags: TagIds, mode: str) -> torch.Tensor:
    """The training forward (B, L, V) of a Batch or grpo.RolloutBatch, each row under its own mask and positions."""
    with autocast(batch.input_ids.device):
        return structured_forward(model, batch.input_ids, batch.attention_mask, batch.prompt_lengths, tags, mode,
                                  dtype=torch.bfloat16 if batch.input_ids.device.type == "cuda" else torch.float32)

# Data: records -> token ids -> padded batches, and the shuffled stream of indices

@dataclass
class Example:
    prompt_ids: list[int]      # the prompt (chat template included); never a target
    response_ids: list[int]    # the solution tokens + [eos]; every one is a target

def tokenize_records(records: list[dict], tokenizer, style: str, max_length: int, prompt_file: str | None = None,
                     log=print) -> list[Example]:
    """`Example`s of the records, without (and counting) those longer than max_length (never truncated: a cut
    block would be mis-masked), those parse_structure rejects and those without a solution. ValueError: no tags, no
    solution at all, none left."""
    tags, unsolved = TagIds.from_tokenizer(tokenizer), [r for r in records if not r.get("solution")]
    if unsolved and len(unsolved) == len(records):
        format_response(unsolved[0])                            # raises, saying what SFT data needs
    if unsolved:
        log(f"dropped {len(unsolved)} of {len(records)} records without a solution to train on")
        records = [r for r in records if r.get("solution")]
    prompts = tokenizer([build_prompt(tokenizer, r["problem"], style, prompt_file) for r in records],
                        add_special_tokens=False)["input_ids"]        # batched: the prompt ids the sampler gets
    solutions = tokenizer([format_response(r) for r in records], add_special_tokens=False)["input_ids"]
    examples, too_long, malformed, first_reason = [], 0, 0, ""
    for r, prompt, solution in zip(records, prompts, solutions):
        response, structure = solution + [tags.eos], parse_structure(solution + [tags.eos], tags)
        if len(prompt) + len(response) > max_length:
            too_long += 1
        elif not structure.valid:
            malformed, first_reason = malformed + 1, first_reason or f"{r.get('id', '?')}: {structure.reason}"
        else:
            examples.append(Example(prompt, response))
    if too_long or malformed:
        log(f"dropped {too_long} of {len(records)} examples longer than max_length={max_length} tokens and "
            f"{malformed} with a malformed parallel structure{f' (first: {first_reason})' if malformed else ''}")
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

def collate(examples: list[Example], pad_id: int) -> Batch:
    """Right-pad to the longest: prompt [5, 6] + response [7, 1] -> input_ids [5, 6, 7, 1, pad], loss 0 0 1 1 0.
    Anything with prompt_ids and response_ids will do (grpo.collate_rollouts pads Rollouts with it)."""
    rows, prompt_lengths = [e.prompt_ids + e.response_ids for e in examples], [len(e.prompt_ids) for e in examples]
    L = max(map(len, rows))
    input_ids = torch.tensor([r + [pad_id] * (L - len(r)) for r in rows])
    attention_mask = torch.tensor([[1] * len(r) + [0] * (L - len(r)) for r in rows])
    is_response = torch.arange(L)[None, :] >= torch.tensor(prompt_lengths)[:, None]
    return Batch(input_ids, attention_mask, prompt_lengths, (attention_mask * is_response).float())

def shard_micro_batches(examples: list[Example], batch_indices: list[int], rank: int, world_size: int,
                        micro_batch_size: int, pad_id: int) -> list[Batch]:
    """This rank's contiguous share of a global batch, shortest first (less padding), cut into micro-batches."""
    per_rank = len(batch_indices) // world_size
    mine = sorted(batch_indices[rank * per_rank:(rank + 1) * per_rank],
                  key=lambda i: len(examples[i].prompt_ids) + len(examples[i].response_ids))
    return [collate([examples[i] for i in mine[j:j + micro_batch_size]], pad_id)
            for j in range(0, per_rank, micro_batch_size)]

class ShuffledStream:
    """An endless stream of indices, shuffled each epoch with seed + epoch: (epoch, index) is all a resume needs."""
    def __init__(self, n: int, seed: int, epoch: int = 0, index: int = 0):
        if not 0 <= index <= n:
            raise ValueError(f"data position {index} is outside the {n} examples: resume with the data "
                             "the checkpoint was trained on")
        self.n, self.seed = n, seed
        self.start(epoch, index)

    def start(self, epoch: int, index: int = 0):
        self.epoch, self.index = epoch, index
        self.order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + epoch)).tolist()

    def take(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.index == self.n:
                self.start(self.epoch + 1)
            take = min(k - len(out), self.n - self.index)
            out, self.index = out + self.order[self.index:self.index + take], self.index + take
        return out

    def position(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}

# The loss, one optimizer step, the schedule

def response_nll(model, batch: Batch, tags: TagIds, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed NLL of the response tokens, their count); logits[:, t] predicts input_ids[:, t+1], in sequence order."""
    logits = forward(model, batch, tags, mode)                                                        # (B, L, V)
    targets, weights = batch.input_ids[:, 1:], batch.loss_mask[:, 1:]     # (B, L-1): the target is a response token
    nll = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), targets.flatten(), reduction="none")
    return (nll.view_as(targets) * weights).sum(), weights.sum()

def accumulate_gradients(model, micro_batches: list[Batch], tags: TagIds, mode: str, world_size: int = 1,
                         device=None) -> tuple[float, float]:
    """Backward over this rank's micro-batches so that the gradients (after the ranks' average) are those of
    sum(NLL) / tokens of the global batch; they sync on the last one. Returns (global NLL sum, global tokens)."""
    device = device or micro_batches[0].input_ids.device
    global_tokens = all_reduce([sum(mb.loss_mask[:, 1:].sum().item() for mb in micro_batches)], device)[0]
    nll_total = 0.0
    for i, mb in enumerate(micro_batches):
        with grad_sync(model, enabled=i == len(micro_batches) - 1):
            mb = dataclasses.replace(mb, **{k: v.to(device) for k, v in vars(mb).items() if torch.is_tensor(v)})
            nll_sum, _ = response_nll(model, mb, tags, mode)
            (nll_sum * (world_size / global_tokens)).backward()
        nll_total += nll_sum.item()
    return all_reduce([nll_total], device)[0], global_tokens

def optimizer_step(model, optimizer, scheduler, grad_clip: float) -> float:
    """Clip the global grad norm (0: no clipping), step the optimizer and the schedule; the norm before clipping.
    ValueError, before the step, when the norm is not finite (the loss diverged): the weights stay as they were
    and the checkpoints so far are kept (every rank sees the same all-reduced norm, so all of them stop)."""
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip > 0 else float("inf"))
    grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # FSDP2: a DTensor
    if not torch.isfinite(grad_norm):
        raise ValueError(f"the gradient norm is {grad_norm.item()}: the loss diverged, so training stops before "
                         f"this optimizer step (the checkpoints so far are kept); lower --lr")
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm.item()

def lr_factor(step: int, warmup_steps: int, total_steps: int, schedule: str = "cosine") -> float:
    """The lr multiplier of optimizer step `step` (0-based): linear warm-up, then 1.0 ("constant") or a cosine
    from 1 to 0 at `total_steps`. E.g. warm-up 10, total 100: 0.1 at step 0, 1.0 at step 9, 0.5 at step 55."""
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))))

def sft_schedule(total_steps: int, warmup_ratio: float):
    """SFT's lr multiplier: warm-up over ceil(warmup_ratio * total) steps, then a cosine, 0 at the last step."""
    return lambda step: lr_factor(step, math.ceil(warmup_ratio * total_steps), total_steps - 1)

# Checkpoints with trainer state, and the training run both trainers share

def find_latest_checkpoint(out_dir: str) -> str:
    """The checkpoint-<step> folder with a trainer state and the highest step. Raises FileNotFoundError."""
    found = [p for _, p in checkpoints(out_dir) if os.path.isfile(f"{p}/trainer_state.pt")]
    if not found:
        raise FileNotFoundError(f"--resume=True found no checkpoint-<step> folder with a trainer_state.pt "
                                f"in {out_dir!r}; pass --resume=<checkpoint folder> or --out_dir")
    return found[-1]

def resume_path(cfg) -> str:
    """The checkpoint --resume names ("" without --resume). Raises FileNotFoundError when there is none."""
    word, latest = cfg.resume.lower(), cfg.resume.lower() in ("true", "1", "yes")   # config.true_or_false's words
    path = "" if word in ("", "false", "0", "no") else find_latest_checkpoint(cfg.out_dir) if latest else cfg.resume
    if path and not os.path.isfile(os.path.join(path, "trainer_state.pt")):
        raise FileNotFoundError(f"--resume={cfg.resume!r}: {path!r} is not a checkpoint folder with a "
                                "trainer_state.pt (written by sft.py or grpo.py)")
    return path

def parse_args(config_class, argv: list[str]):
    """The command line; with --resume, over the config saved in that checkpoint."""
    cfg = config.parse(config_class, argv)
    if not (path := resume_path(cfg)):
        return dataclasses.replace(cfg, resume="")
    saved = load_trainer_state(path)["config"]
    if ("recipe" in saved) != any(f.name == "recipe" for f in dataclasses.fields(config_class)):  # grpo's config
        raise ValueError(f"--resume: {path!r} was written by {'grpo.py' if 'recipe' in saved else 'sft.py'}, and "
                         f"--resume continues a run of the same script; to start from it, pass --model={path}")
    return config.parse(config_class, argv, base=dict(saved, resume=path))

@dataclass
class Run:
    """What a training process holds; sft.train and grpo.train are a loop over steps around one."""
    cfg: object
    dist: Dist
    model: torch.nn.Module                 # plain (FSDP: sharded in place)
    tokenizer: object
    tags: TagIds
    resume: str = ""                       # the checkpoint this run continues ("" for a fresh run)
    train_model: torch.nn.Module = None    # what the loss runs on: DDP-wrapped, FSDP-sharded, or the model
    optimizer: torch.optim.Optimizer = None
    scheduler: object = None
    step: int = 0
    state: dict = field(default_factory=dict)   # the trainer state resumed from
    log_file: object = None
    wandb: object = None                   # the Weights & Biases run (--wandb_project), on rank 0

    def log(self, *args):
        if self.dist.is_main:
            print(*args)

    def write(self, row: dict):
        if self.dist.is_main:
            self.log_file.write(json.dumps(row) + "\n")
            self.log_file.flush()
            if self.wandb:
                self.wandb.log(row, step=row["step"])

    def close(self):
        if self.dist.is_main:
            self.log_file.close()
            os.remove(os.path.join(self.cfg.out_dir, ".lock"))
            if self.wandb:
                self.wandb.finish()

    def log_step(self, row: dict, bar, line: str, **postfix):
        """A step's row into log.jsonl, its `postfix` on the progress bar, and `line` every log_every steps."""
        self.write(row)
        bar.set_postfix(**postfix)
        bar.update(1)
        if self.dist.is_main and self.cfg.log_every and row["step"] % self.cfg.log_every == 0:
            bar.write(line)

    def log_no_steps_left(self, total_steps: int):
        if self.step >= total_steps:              # a resumed run that is already done
            self.log(f"note: {self.resume} is at step {self.step} and this run has {total_steps} steps: nothing is "
                     "left to train (raise --max_steps to go on)")

    def out_of_time(self, t_start: float) -> bool:
        """Every rank takes the same stop decision (any rank's clock), or the next collective would hang."""
        return bool(self.cfg.max_time) and \
            all_reduce([time.time() - t_start > self.cfg.max_time], self.dist.device, "max")[0] > 0

    def save(self, **trainer_state) -> str | None:
        """out_dir/checkpoint-<step> with the optimizer, schedule, RNG and the caller's state; every rank calls (FSDP
        gathers the full state dicts to rank 0 first). Then the keep_last newest stay. The path (on rank 0)."""
        cfg, path = self.cfg, os.path.join(self.cfg.out_dir, f"checkpoint-{self.step}")
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_sd = {"state_dict": get_model_state_dict(self.train_model, options=opts)} if cfg.fsdp else {}
        optim = get_optimizer_state_dict(self.train_model, self.optimizer, options=opts) if cfg.fsdp else \
            self.optimizer.state_dict()
        if self.dist.is_main:
            rng = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state(),
                   "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None}   # this rank's GPU
            state = dict(step=self.step, config=dataclasses.asdict(cfg), **trainer_state, rng=rng,
                         scheduler=self.scheduler.state_dict(), optimizer=optim)
            save_checkpoint(path, self.train_model, self.tokenizer, state, **model_sd)
            for _, p in checkpoints(cfg.out_dir)[:-cfg.keep_last] if cfg.keep_last > 0 else []:
                shutil.rmtree(p, ignore_errors=True)
        if dist.is_initialized():
            dist.barrier()
        return path if self.dist.is_main else None

def load(cfg, d: Dist, name: str, cls=Run, **load_kw) -> Run:
    """Seed every RNG and load the model to train, fp32 master weights: `name`, or the checkpoint of --resume."""
    if cfg.fsdp and not dist.is_initialized():
        raise ValueError("--fsdp=True shards the model over processes: launch with torchrun "
                         "(torchrun --nproc_per_node=<gpus> sft.py --fsdp=True ...)")
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    path = resume_path(cfg)
    model, tok = load_model(path or name, dtype=torch.float32, device=d.device, seed=cfg.seed,
                            **({} if path else load_kw))
    return cls(cfg, d, model, tok, TagIds.from_tokenizer(tok), resume=path)

def start_wandb(cfg):
    """The Weights & Biases run of --wandb_project, its files in out_dir/wandb. ValueError when it cannot start."""
    try:
        import wandb                                # imported only here: an optional requirement
    except ImportError:
        raise ValueError("--wandb_project needs wandb: pip install -r requirements-extra.txt") from None
    try:
        return wandb.init(project=cfg.wandb_project, config=dataclasses.asdict(cfg), dir=cfg.out_dir)
    except wandb.errors.UsageError as e:
        raise ValueError(f"--wandb_project: {e} (WANDB_MODE=offline logs without an account)") from None

def lock_out_dir(out_dir: str):
    """out_dir/.lock holds this process's pid until Run.close: a run into a folder that another live process is
    writing is refused (two runs once interleaved one log.jsonl). The lock of a process that is gone, or of this
    one (a run that raised), is taken over. ValueError names the other process."""
    path = os.path.join(out_dir, ".lock")
    try:
        other = int(open(path).read())
        os.kill(other, 0)                           # ProcessLookupError when that process is gone
        alive = other != os.getpid()
    except (OSError, ValueError):                   # no lock, a dead process's, or not a pid: nothing to respect
        alive = False
    if alive:
        raise ValueError(f"--out_dir={out_dir} is being written by another run (pid {other}): wait for it or pass "
                         f"another --out_dir (if no such run is alive, remove {path})")
    with open(path, "w") as f:
        f.write(str(os.getpid()))

def prepare(run: Run, lr_lambda) -> Run:
    """Wrap the model for the ranks (DDP, or FSDP2 per decoder layer then the root), build AdamW (decay on every
    parameter, as the official trainers) and the schedule, restore both on --resume, open out_dir's log."""
    cfg, d, model = run.cfg, run.dist, run.model
    if cfg.grad_checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    run.train_model, cuda = model, d.device.type == "cuda"
    if cfg.fsdp:
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if cuda else \
            MixedPrecisionPolicy()
        for module in [*model.model.layers, model]:  # one all-gather per decoder layer, then one for the rest
            fully_shard(module, mp_policy=mp)
    elif d.world_size > 1:
        run.train_model = torch.nn.parallel.DistributedDataParallel(model, [d.device.index] if cuda else None)
    run.optimizer = torch.optim.AdamW(run.train_model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                                      betas=tuple(cfg.betas))
    run.scheduler = torch.optim.lr_scheduler.LambdaLR(run.optimizer, lr_lambda)
    if run.resume:
        run.state = load_trainer_state(run.resume)
        if cfg.fsdp:
            set_optimizer_state_dict(run.train_model, run.optimizer, run.state["optimizer"],
                                     options=StateDictOptions(full_state_dict=True))
        else:
            run.optimizer.load_state_dict(run.state["optimizer"])
        run.scheduler.load_state_dict(run.state["scheduler"])
        stored, step = run.optimizer.param_groups[0]["lr"], run.scheduler.last_epoch   # the checkpoint's next lr
        run.scheduler.base_lrs = [cfg.lr] * len(run.optimizer.param_groups)     # this run's --lr and schedule ...
        for g in run.optimizer.param_groups:                                     # ... from the next step on
            g["lr"] = cfg.lr * lr_lambda(step)
        if run.optimizer.param_groups[0]["lr"] != stored:
            run.log(f"note: with this run's settings (lr, steps, schedule) the next step trains at lr "
                    f"{run.optimizer.param_groups[0]['lr']:.3g}, not the checkpoint's {stored:.3g}")
        run.step, rng = run.state["step"], run.state["rng"]        # the RNGs as they were at the checkpoint
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        if rng.get("cuda") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])
        run.log(f"resumed from {run.resume} at step {run.step}")
    inside = os.path.isdir(cfg.model) and os.path.realpath(cfg.model).startswith(os.path.realpath(cfg.out_dir) + os.sep)
    if d.is_main and inside and (not run.resume or getattr(run, "ref_model", None) is not None):   # grpo's KL ref
        raise ValueError(f"--model={cfg.model} is inside --out_dir={cfg.out_dir}, and a fresh run moves an earlier "
                         "run's checkpoints aside (the one it starts from too): pass another --out_dir")
    if d.is_main:                                   # a fresh run moves an earlier run aside: nothing is deleted
        fresh_dir = not os.path.isdir(cfg.out_dir)
        os.makedirs(cfg.out_dir, exist_ok=True)
        lock_out_dir(cfg.out_dir)
        try:                                        # first, so that a failed start changes nothing
            run.wandb = start_wandb(cfg) if cfg.wandb_project else None
        except ValueError:
            os.remove(os.path.join(cfg.out_dir, ".lock"))
            if fresh_dir:
                shutil.rmtree(cfg.out_dir, ignore_errors=True)
            raise
        log_path = os.path.join(cfg.out_dir, "log.jsonl")
        ckpts = checkpoints(cfg.out_dir)                # a resume from an older one: the newer ones belong to the
        old = [p for step, p in ckpts if step > run.step] if run.resume \
            else [p for _, p in ckpts] + glob.glob(log_path)   # run it abandons, and --resume=True would pick them
        if old:
            aside = move_aside(cfg.out_dir, old)
            if run.resume and os.path.isfile(log_path):   # the abandoned steps' log lines go with their checkpoints
                shutil.copy(log_path, aside)
            run.log(f"moved {'the checkpoints after step ' + str(run.step) if run.resume else 'an earlier run'} in "
                    f"{cfg.out_dir} to {aside}" + ("" if run.resume else " (--resume=True continues a run instead)"))
        kept = [line for line in open(log_path) if json.loads(line)["step"] <= run.step] \
            if run.resume and os.path.isfile(log_path) else []   # a resumed log: the lines up to its step
        run.log_file = open(log_path, "w")
        run.log_file.writelines(kept)
    return run

# The SFT run

def quick_eval(model, tokenizer, records: list[dict], mode: str, n: int, *, prompt_file: str | None = None,
               max_new_tokens: int = 256, seed: int = 0) -> dict:
    """Greedy samples of the first `n` records that fit the model's context (the others are counted in notes):
    {"n", "format_valid", "parallel", "accuracy", "example" (the first response), "notes"}."""
    out = {"n": 0, "format_valid": None, "parallel": None, "accuracy": None, "example": "", "notes": []}
    records = [{**r, "id": i} for i, r in enumerate(records)]
    fit = fit_context(records, tokenizer, "sequential" if mode == "sequential" else "parallel", prompt_file,
                      max_new_tokens, getattr(model.config, "max_position_embeddings", None), "end-of-run samples",
                      out["notes"].append, required=False)[0][:n]
    if fit:
        m, samples = evaluate(model, tokenizer, fit, mode, k=1, seed=seed, max_new_tokens=max_new_tokens,
                              batch_size=n, prompt_file=prompt_file, greedy=True)
        out.update(n=len(samples), format_valid=m["format_valid"], parallel=m["parallel_ratio"],
                   accuracy=m["mean_at_k"], example=samples[0]["response"])
    return out

def train(cfg: SFTConfig, records: list[dict] | None = None) -> dict:
    """Run SFT (one process, or one rank under torchrun); `records` replace cfg.data (tests, notebooks). Returns
    {"checkpoint", "steps", "total_steps", "stopped_early", "final_loss", "seconds", "tokens_per_s", "eval"}."""
    with distributed() as d:
        tok = own_tokenizer(resume_path(cfg) or cfg.model)      # a tiny checkpoint gets the tiny preset too
        cfg = resolve_defaults(cfg, d.world_size, tiny=tok is None or len(tok) < TINY_VOCAB_LIMIT)
        run = load(cfg, d, cfg.model, **({"tokenizer": cfg.tokenizer or None} if cfg.model == "tiny" else {}))
        context = getattr(run.model.config, "max_position_embeddings", None) or 4096
        run.cfg = cfg = dataclasses.replace(cfg, max_length=cfg.max_length or min(4096, context))
        synthetic = records is None and all(re.fullmatch(r"synthetic:\w+", n.strip()) for n in cfg.data.split(","))
        if records is None:
            records = load_data(cfg.data, style=cfg.style, limit=cfg.limit or None, seed=cfg.seed,
                                data_dir=cfg.data_dir or None, tokenizer=run.tokenizer,
                                parallel_fraction=cfg.parallel_fraction)
        records = records[:cfg.limit] if cfg.limit else records
        examples = tokenize_records(records, run.tokenizer, cfg.style, cfg.max_length, cfg.prompt_file or None, run.log)
        # the end-of-run samples: of cfg.eval_data, else the test part of synthetic data, else the training problems
        eval_name, eval_records = f"{cfg.data} (training problems)", records
        if cfg.eval_samples and (cfg.eval_data or synthetic):
            eval_name = cfg.eval_data or ",".join(n.strip() + ":test" for n in cfg.data.split(","))
            eval_records = load_data(eval_name, style=cfg.style, limit=cfg.eval_samples, data_dir=cfg.data_dir or None,
                                     tokenizer=run.tokenizer if cfg.eval_data else None)
        total_steps = cfg.max_steps or math.ceil(cfg.epochs * len(examples) / cfg.batch_size)
        prepare(run, sft_schedule(total_steps, cfg.warmup_ratio))
        run.log_no_steps_left(total_steps)
        stream = ShuffledStream(len(examples), cfg.seed, **run.state.get("data_position", {}))
        run.log(f"SFT {cfg.model} ({sum(p.numel() for p in run.model.parameters()) / 1e6:.2f}M params) on "
                f"{len(examples)} examples of {cfg.data}, mode={cfg.mode}, style={cfg.style}, {d.world_size} rank(s) "
                f"on {d.device.type}, batch {cfg.batch_size}, lr {cfg.lr}, {total_steps} steps")
        bar = tqdm(total=total_steps, initial=run.step, disable=not d.is_main, dynamic_ncols=True, desc="sft")
        t_start, losses, tokens_seen, ckpt = time.time(), [], 0, run.resume or None
        while run.step < total_steps:
            t0 = time.time()
            micro_batches = shard_micro_batches(examples, stream.take(cfg.batch_size), d.rank, d.world_size,
                                                cfg.micro_batch_size, run.tokenizer.pad_token_id)
            lr = run.optimizer.param_groups[0]["lr"]
            nll, loss_tokens = accumulate_gradients(run.train_model, micro_batches, run.tags, cfg.mode, d.world_size,
                                                    d.device)
            grad_norm = optimizer_step(run.train_model, run.optimizer, run.scheduler, cfg.grad_clip)
            run.step += 1
            tokens = all_reduce([sum(mb.attention_mask.sum().item() for mb in micro_batches)], d.device)[0]
            dt, loss, tokens_seen = time.time() - t0, nll / loss_tokens, tokens_seen + tokens
            losses.append(loss)
            row = dict(step=run.step, loss=loss, lr=lr, grad_norm=grad_norm, tokens=int(tokens), epoch=stream.epoch,
                       loss_tokens=int(loss_tokens), tokens_per_s=tokens / dt, elapsed=time.time() - t_start)
            run.log_step(row, bar, f"step {run.step}: loss {loss:.4f}, lr {lr:.2e}, grad_norm {grad_norm:.3f}, "
                         f"{tokens / dt:,.0f} tok/s", loss=f"{loss:.4f}", tok_s=f"{tokens / dt:,.0f}")
            last = run.step == total_steps or run.out_of_time(t_start)
            if last or (cfg.save_every and run.step % cfg.save_every == 0):
                ckpt = run.save(data_position=stream.position())
            if last:
                break
        bar.close()
        seconds, stopped_early = time.time() - t_start, run.step < total_steps       # stopped early: by max_time
        summary = {"checkpoint": ckpt, "steps": run.step, "total_steps": total_steps, "stopped_early": stopped_early,
                   "final_loss": float(np.mean(losses[-10:])) if losses else None, "seconds": seconds,
                   "tokens_per_s": tokens_seen / seconds if seconds > 0 else 0.0, "eval": None}
        if d.is_main and cfg.eval_samples and not cfg.fsdp:     # a sharded model would need every rank
            # budget: twice the longest training response, within max_length (an untrained model rambles)
            budget = min(cfg.max_length - max(len(e.prompt_ids) for e in examples),
                         2 * max(len(e.response_ids) for e in examples))
            mode = "sequential" if cfg.style == "sequential" else cfg.mode
            summary["eval"] = dict(quick_eval(run.model, run.tokenizer, eval_records, mode, cfg.eval_samples,
                                              prompt_file=cfg.prompt_file or None, seed=cfg.seed,
                                              max_new_tokens=max(1, budget)), data=eval_name)
        elif d.is_main and cfg.fsdp:
            summary["eval"] = {"notes": ["FSDP run: no greedy samples here; evaluate the checkpoint with eval.py"]}
        run.close()
        e = summary["eval"] or {}
        run.log(f"SFT done: {run.step} steps{' (stopped by max_time)' if stopped_early else ''} in {seconds:.0f}s, "
                + (f"final loss {summary['final_loss']:.4f}" if losses else "no step left to train")
                + f"\ncheckpoint: {ckpt}\n"
                f"log: {os.path.join(cfg.out_dir, 'log.jsonl')}"
                + (f"\ngreedy samples on {e['n']} problems of {e['data']}: format valid {e['format_valid']:.0%}, "
                   f"parallel {e['parallel']:.0%}, accuracy {e['accuracy']:.0%}; first: {e['example'][:300]!r}"
                   if e.get("n") else "")
                + "".join(f"\nnote: {n}" for n in e.get("notes", [])))
        return summary

def main(argv: list[str]) -> dict:
    hf_logging.disable_progress_bar()                     # our own bar is enough
    return train(parse_args(SFTConfig, argv))

if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (OSError, ValueError) as e:                    # bad input: the message says what to do
        sys.exit(f"sft.py: error: {e}")
    except KeyboardInterrupt:
        sys.exit("sft.py: interrupted; the checkpoints in out_dir are kept (--resume=True continues the latest)")
