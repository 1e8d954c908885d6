"""The training plumbing sft.py and grpo.py share. A reader of the method may skip this file.

* ranks: `distributed()` joins torchrun's process group (--dist_timeout_minutes, the CUDA
  allocator's expandable segments); `all_reduce`, `grad_sync`;
* the run: `RunFlags` (the flags both trainers have), `resolve_config` (the settings in force and
  their sources; on a resume `check_resume` refuses a changed experiment), `load_run` (seed every
  RNG, load the model, a node's ranks in turn), `prepare` (DDP or FSDP2, AdamW, the lr schedule,
  an exact resume), the loop's bookkeeping (`Run.steps` and `Run.end_step`: log, evaluate, save
  every --save_every steps or --save_every_minutes; stop at --max_time, or on SIGINT/SIGTERM with
  the last completed step saved, `Run.abandon_step` when the trainer stopped the step in flight),
  `Run.save` (checkpoint-<step> with the trainer state: --checkpoint=full, one folder from rank
  0; sharded, each rank's shards; async, the shards written while training goes on, waited for
  by the next save and at the end: `Run.wait_for_save`); GRPO's start checkpoint, each rank's
  places in the batch (`rank_places`), the rollout seeds, the frozen sampler copy and KL
  reference (`frozen_models`) and the FSDP rollout copy's refresh;
* run folders: checkpoint naming, `--resume`, a lock per out_dir, moving an earlier run aside
  (nothing a user made is deleted or overwritten), settings.json and resumes.jsonl
  (`record_settings`);
* the optimizer step, the lr schedule, the micro-batch plan and the shuffled stream of examples.

As nanochat keeps `common.py` and `checkpoint_manager.py` beside `chat_sft.py` and `chat_rl.py`.
"""
import concurrent.futures
import dataclasses
import datetime
import functools
import glob
import itertools
import json
import math
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    get_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from tqdm import tqdm

import attention
import config
from attention import TagIds
from model import (
    SHARDED_FOLDER,
    frozen_copy,
    load_model,
    load_torch_file,
    mode_from_config,
    read_checkpoint_config,
    resolve_preset,
    sharded_checkpoint,
)

TRUE_WORDS = config.TRUE_WORDS
FALSE_WORDS = ("", *config.FALSE_WORDS)

# How long a rank waits at a collective before the run fails. torch's default for nccl is 10
# minutes, which a rank can pass without anything being wrong: ranks finish sampling at different
# times and wait at the next all-reduce, and the others wait at a barrier while rank 0 writes a
# checkpoint (Qwen3-4B: 16 GB of weights and 32 GB of AdamW state, 8 minutes at 100 MB/s), or
# while the node's ranks load the model in turn (load_run). A real hang then costs this long.
DIST_TIMEOUT_MINUTES = 30.0
SECONDS_PER_MINUTE = 60.0

# torch.distributed.checkpoint warns at every save and load of a process without a process group
# that it is "assuming the intent is to save in a single process": a one-process run with
# --checkpoint=sharded|async means that. (A filter for good: an async save warns in its thread.)
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or "
                        "uninitialized, assuming the intent")


@dataclass
class RunFlags:
    """The flags of a training run around its method (steps, seed, ranks, memory, checkpoints,
    logging): sft.SFTConfig and grpo.GRPOConfig inherit them, as their command lines do."""
    max_steps: config.PositiveInt | None = None
    max_time: config.NonNegativeFloat | None = None   # seconds of the training loop; 0 = none
    seed: config.Seed = 0
    weight_decay: config.NonNegativeFloat = 0.01
    grad_clip: config.NonNegativeFloat = 1.0       # max global grad norm; 0 = no clipping
    fsdp: bool = False                   # FSDP2 (each decoder layer, then the root); torchrun
    grad_checkpointing: bool | None = None   # recompute activations in the backward (memory)
    logit_chunk_tokens: config.PositiveInt = attention.LOGIT_CHUNK_TOKENS   # per LM-head chunk
    resume: str = ""                     # a checkpoint folder, or True = the latest in out_dir
    allow_changes: str = ""              # a resume may change these settings: "kl_coef,lr"
    keep_last: config.NonNegativeInt = 2       # checkpoints kept in out_dir (0 = all)
    save_every_minutes: config.NonNegativeFloat = 0.0   # also save once this long since the last
    checkpoint: config.CheckpointKind = "full"   # full (rank 0), sharded, async (Run.save)
    wandb_project: str = ""              # also log log.jsonl's rows to Weights & Biases (wandb)
    dist_timeout_minutes: config.PositiveFloat = DIST_TIMEOUT_MINUTES   # a collective's wait


# ---------------------------------------------------------------------------------------------
# Ranks (one process when RANK is not set)


ALLOC_CONF_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")   # either sets it
EXPANDABLE_SEGMENTS = "expandable_segments:True"


@dataclass
class Dist:
    rank: int
    world_size: int
    device: torch.device
    saves_in_flight: list = field(default_factory=list)   # async saves' Futures (Run.save_sharded)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def use_expandable_segments(cuda: bool) -> None:
    """On CUDA, let the caching allocator grow and shrink its segments (expandable_segments)
    unless the user configured the allocator: GRPO frees the sampler's KV cache (~33 GB at 4B)
    and then allocates training's blocks of other sizes, which fixed segments leave fragmented
    (the memory plan's margin counts on it). Must run before CUDA allocates anything."""
    if not cuda:
        return
    if any(name in os.environ for name in ALLOC_CONF_VARIABLES):
        return
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = EXPANDABLE_SEGMENTS


@contextmanager
def distributed(timeout_minutes: float = DIST_TIMEOUT_MINUTES):
    """Join torchrun's process group (nccl, one GPU per process; gloo on CPU), reusing one that
    exists, and tear it down at the end if this call made it. Without RANK: one process, the
    collectives are no-ops. A collective that waits longer than `timeout_minutes` (--
    dist_timeout_minutes) fails the run. On CUDA, first `use_expandable_segments`. Yields a
    Dist. At the end, also when the run raised, async saves still in flight are waited for."""
    owns_group = not dist.is_initialized()
    cuda = torch.cuda.is_available()
    use_expandable_segments(cuda)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if "RANK" not in os.environ:
        d = Dist(0, 1, torch.device("cuda" if cuda else "cpu"))
    else:
        device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
        d = Dist(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), device)
        if owns_group and cuda:
            torch.cuda.set_device(local_rank)
        if owns_group:
            backend = "nccl" if cuda else "gloo"
            dist.init_process_group(backend, device_id=d.device if cuda else None,
                                    timeout=datetime.timedelta(minutes=timeout_minutes))
    try:
        yield d
    finally:
        # an async save still being written when training raised: let it finish (and be named)
        # before the exception leaves, and before the process groups it talks over are destroyed
        concurrent.futures.wait(d.saves_in_flight)
        if owns_group and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()


def all_reduce(values: list[float], device, op: str = "sum") -> list[float]:
    """Element-wise "sum" or "max" of numbers over ranks, in one collective (one process: the
    numbers themselves)."""
    if not dist.is_initialized():
        return [float(v) for v in values]
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
    reduce_op = dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX
    dist.all_reduce(t, op=reduce_op)
    return t.tolist()


def rank_places(batch_size: int, world_size: int, rank: int, ppo_mini_batches: int) -> list[int]:
    """GRPO: the places in the step's global batch (0 .. batch_size - 1) of the prompts that
    `rank` samples and trains. grpo.ppo_update splits a rank's rollouts into ppo_mini_batches
    contiguous parts, so a rank takes its share of each of the global batch's ppo_mini_batches
    parts: the ranks' k-th mini-batches together are 1 rank's k-th (rank_places(8, 2, 1, 2) ->
    [2, 3, 6, 7]). When ppo_mini_batches x world_size does not divide batch_size: contiguous
    shares (the mini-batches then differ from 1 rank's; config.grpo_notes says so)."""
    per_rank = batch_size // world_size
    if batch_size % (ppo_mini_batches * world_size):
        return list(range(rank * per_rank, (rank + 1) * per_rank))
    share = per_rank // ppo_mini_batches           # prompts of one mini-batch on one rank
    places = []
    for k in range(ppo_mini_batches):
        first = k * (batch_size // ppo_mini_batches) + rank * share
        places += range(first, first + share)
    return places


def grad_sync(model, enabled: bool):
    """Gradient all-reduce on or off for the next backward (off: the micro-batches of a step add
    up locally, and the last one syncs): DDP's no_sync(). FSDP2 syncs after every backward
    whatever `enabled` says: each micro-batch's gradients are reduce-scattered at once, so a rank
    holds only its shard (FSDP2's set_requires_gradient_sync(False) would keep every parameter's
    whole fp32 gradient on every rank until the last backward: 16.1 GB for Qwen3-4B), at the cost
    of a reduce-scatter a micro-batch that overlaps the backward (README, "The paper's run on
    paper: memory")."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel) and not enabled:
        return model.no_sync()
    return nullcontext()


@torch.no_grad()
def sync_rollout_model(rollout_model, train_model):
    """FSDP: the full (all-gathered) weights into the sampler's plain copy, one parameter at a
    time (a whole fp32 state dict beside the shards and the copy would hold the model three
    times); every rank calls it."""
    rollout_parameters = dict(rollout_model.named_parameters())
    for name, parameter in train_model.named_parameters():
        full = parameter.full_tensor() if hasattr(parameter, "full_tensor") else parameter
        rollout_parameters[name].copy_(full)


def compute_dtype(device: torch.device, fsdp: bool) -> torch.dtype:
    """The dtype of the parameters the training forward computes with: bf16 under FSDP2 on CUDA
    (wrap_model's MixedPrecisionPolicy gathers the fp32 shards in bf16), else the fp32 master
    weights themselves (on CUDA under bf16 autocast). GRPO's sampler copy and KL reference are
    made in it (`frozen_models`), so that they compute as the policy does."""
    if device.type == "cuda" and fsdp:
        return torch.bfloat16
    return torch.float32


# ---------------------------------------------------------------------------------------------
# Checkpoints: a Hugging Face folder + trainer_state.pt, written atomically


def checkpoint_step(folder_name: str) -> int | None:
    """The step of a folder named checkpoint-<step>, else None. Only names without leading zeros
    are ours: checkpoint-010 and checkpoint-best are the user's, never pruned or moved."""
    match = re.fullmatch(r"checkpoint-(0|[1-9]\d*)", folder_name)
    return int(match[1]) if match else None


def checkpoints(folder: str) -> list[tuple[int, str]]:
    """(step, path) of each of a run folder's checkpoint-<step> folders, by step."""
    found = []
    for path in glob.glob(os.path.join(folder, "checkpoint-*")):
        step = checkpoint_step(os.path.basename(path))
        if step is not None and os.path.isdir(path):
            found.append((step, path))
    return sorted(found)


def new_folder_beside(path: str) -> str:
    """A new empty folder beside `path` (.tmp-<name>-<random>) to write a checkpoint into before
    `publish` gives it its name."""
    parent, name = os.path.split(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=parent)
    os.chmod(tmp, 0o755)                           # mkdtemp makes it private; a checkpoint is not
    return tmp


def publish(tmp: str, path: str) -> None:
    """Give the written folder `tmp` its name `path` (a sibling) by a rename: a reader sees the
    whole checkpoint or none. An old `path` is moved aside first, put back if the second rename
    fails, and deleted after it."""
    parent, name = os.path.split(os.path.abspath(path))
    old = None
    try:
        if os.path.exists(path):
            old = tempfile.mkdtemp(prefix=f".old-{name}-", dir=parent)
            os.rmdir(old)
            os.replace(path, old)
        os.replace(tmp, path)
    except BaseException:
        if old and os.path.exists(old) and not os.path.exists(path):
            os.replace(old, path)                  # failed between the two renames: put it back
        raise
    if old:
        shutil.rmtree(old, ignore_errors=True)


def save_checkpoint(path: str, model, tokenizer, trainer_state: dict | None = None,
                    state_dict: dict | None = None) -> str:
    """Write `model`, `tokenizer` (Hugging Face format) and `trainer_state` (trainer_state.pt) to
    folder `path` atomically: a temporary sibling is renamed (`publish`). `state_dict`: the
    gathered weights of an FSDP2 model. Returns `path`."""
    path = os.path.abspath(path)
    tmp = new_folder_beside(path)
    try:
        unwrapped = getattr(model, "module", model)
        tied = getattr(unwrapped.config, "tie_word_embeddings", False)
        if state_dict is not None and tied:
            state_dict = {k: v for k, v in state_dict.items() if k != "lm_head.weight"}
        unwrapped.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict)
        tokenizer.save_pretrained(tmp)
        if trainer_state is not None:
            torch.save(trainer_state, os.path.join(tmp, "trainer_state.pt"))
        publish(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def load_trainer_state(path: str) -> dict:
    """The `trainer_state.pt` of a checkpoint. FileNotFoundError naming the path."""
    state_file = os.path.join(path, "trainer_state.pt")
    if not os.path.isfile(state_file):
        raise FileNotFoundError(f"no trainer state at {state_file}: --resume needs a checkpoint "
                                "written by sft.py or grpo.py")
    return load_torch_file(state_file)


def find_latest_checkpoint(out_dir: str) -> str:
    """The checkpoint-<step> folder with a trainer state and the highest step.
    FileNotFoundError when there is none."""
    found = [p for _, p in checkpoints(out_dir) if os.path.isfile(f"{p}/trainer_state.pt")]
    if not found:
        aside = sorted(glob.glob(os.path.join(out_dir, "earlier-*", "checkpoint-*")))
        hint = ""
        if aside:                                  # a run started without --resume moved them
            hint = f" (an earlier run's, moved aside: {', '.join(aside)})"
        raise FileNotFoundError(f"--resume=True found no checkpoint-<step> folder with a "
                                f"trainer_state.pt in {out_dir!r}; pass --resume=<checkpoint "
                                f"folder>{hint} or --out_dir")
    return found[-1]


def resume_path(cfg) -> str:
    """The checkpoint that --resume names ("" without --resume; True: the latest in out_dir).
    FileNotFoundError when there is none."""
    word = cfg.resume.lower()
    if word in FALSE_WORDS:
        return ""
    path = find_latest_checkpoint(cfg.out_dir) if word in TRUE_WORDS else cfg.resume
    if not os.path.isfile(os.path.join(path, "trainer_state.pt")):
        raise FileNotFoundError(f"--resume={cfg.resume!r}: {path!r} is not a checkpoint folder "
                                "with a trainer_state.pt (written by sft.py or grpo.py)")
    return path


# The settings a resume may change: how long, where and on what hardware a run goes on, how it
# logs, saves and evaluates; the rest is what the run learns, and a change is refused unless
# --allow_changes names it (check_resume). --max_steps (--epochs) may grow: the lr schedule's end
# moves with it (`restore` says so). Memory settings change the sums' order, not the expectation;
# generate_batch_size not even a sample (per-prompt seeding: measured, only logp_old's rounding).
FREE_ON_RESUME = frozenset({
    "max_steps", "epochs", "max_time", "out_dir", "resume", "allow_changes", "keep_last",
    "save_every", "log_every", "wandb_project", "dist_timeout_minutes", "checkpoint",
    "fsdp", "grad_checkpointing", "logit_chunk_tokens", "micro_batch_size", "micro_batch_tokens",
    "generate_batch_size",
    "eval_data", "eval_every", "eval_samples", "eval_k", "eval_temperature", "logprob_check_steps"})
NOT_COMPARED = ("resume", "allow_changes")        # about this start, not about the run


def same_place(a, b) -> bool:
    """Two settings name the same thing: equal, or the same file or folder by two paths."""
    if isinstance(a, str) and isinstance(b, str) and os.path.exists(a) and os.path.exists(b):
        return os.path.realpath(a) == os.path.realpath(b)
    return a == b


def moved_away(model: str | None) -> bool:
    """A saved start model that was a local folder and is not there now (moved, or a relative path
    read from another working folder). A hub name or "tiny" never is."""
    if not model or model == "tiny":
        return False
    looks_local = os.path.isabs(model) or model.startswith(".") or "checkpoint-" in model
    return looks_local and not os.path.isdir(model)


def parse_args(config_class, argv: list[str]):
    """The command line; with --resume, over the config saved in that checkpoint (what differs
    from it is checked when the run resolves its config: `check_resume`). A resumed run writes
    into the folder of the checkpoint it continues (unless --out_dir says otherwise)."""
    cfg = config.parse(config_class, argv)
    path = resume_path(cfg)
    if not path:
        return dataclasses.replace(cfg, resume="")
    saved = load_trainer_state(path)["config"]
    saved_by_grpo = "recipe" in saved
    parsing_grpo = any(f.name == "recipe" for f in dataclasses.fields(config_class))
    if saved_by_grpo != parsing_grpo:
        writer = "grpo.py" if saved_by_grpo else "sft.py"
        raise ValueError(f"--resume: {path!r} was written by {writer}, and --resume continues a "
                         f"run of the same script; to start from it, pass --model={path}")
    given = config.flags_given(argv)
    base = dict(saved, resume=path, allow_changes="")      # each resume names its own changes
    if saved_by_grpo and "model" not in given and moved_away(saved.get("model")):
        raise ValueError(f"--resume={cfg.resume}: the run started from {saved.get('model')}, "
                         "which is not there now (moved, or a path relative to another folder): "
                         "pass --model=<where it is now> with --resume")
    if "out_dir" not in given:                     # where the checkpoint is, not where it was made
        base["out_dir"] = os.path.dirname(os.path.abspath(path))
    return config.parse(config_class, argv, base=base)


DEFAULT_INIT = {   # where each mode's SFT checkpoint is, and the command that writes it
    "unseen": ("runs/sft", "python sft.py"),
    "seen": ("runs/sft_seen", "python sft.py --mode=seen --out_dir=runs/sft_seen"),
    "sequential": ("runs/sft_sequential",
                   "python sft.py --style=sequential --mode=seen --out_dir=runs/sft_sequential")}


def default_init(mode: str, model: str = "") -> str:
    """GRPO's starting model: `model`, else the latest SFT checkpoint of the mode; a folder as an
    absolute path (saved with the run: a resume from elsewhere finds it). FileNotFoundError names
    the command that writes it."""
    if model == "tiny":
        print("warning: --model=tiny is the embedded model with random weights: GRPO starts from "
              "an SFT checkpoint (e.g. python sft.py, then --model=runs/sft/checkpoint-400)",
              file=sys.stderr)
    if model:
        return os.path.abspath(model) if os.path.isdir(model) else model
    folder, command = DEFAULT_INIT[mode]
    try:
        return os.path.abspath(find_latest_checkpoint(folder))
    except FileNotFoundError:
        raise FileNotFoundError(f"GRPO starts from an SFT checkpoint and there is none in "
                                f"{folder!r} (mode {mode!r}). Write it first with\n    {command}\n"
                                "(about 4 minutes on 2 CPU cores for the tiny model), or pass "
                                "--model=<a checkpoint folder or hub name>.") from None


# ---------------------------------------------------------------------------------------------
# Run folders: a lock, and earlier runs moved aside


def move_aside(folder: str, paths: list[str]) -> str:
    """Move `paths` (inside `folder`) into a new folder/earlier-<k>, the first k free, and return
    it: a run or an evaluation into a used folder keeps what was there."""
    for k in itertools.count(1):
        aside = os.path.join(folder, f"earlier-{k}")
        if not os.path.exists(aside):
            break
    os.makedirs(aside)
    for p in paths:
        shutil.move(p, aside)
    return aside


def check_out_dir(out_dir: str) -> None:
    """ValueError when --out_dir names something that is not a folder."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f"--out_dir={out_dir} is a file, not a folder: pass a folder (it is made "
                         "if missing)")


def lock_out_dir(out_dir: str) -> None:
    """out_dir/.lock holds this process's pid until Run.close: a run into a folder that another
    live process writes is refused (two runs would interleave one log.jsonl). The lock of a
    process that is gone, or of this one (a run that raised), is taken over. ValueError names the
    other process."""
    path = os.path.join(out_dir, ".lock")
    try:
        with open(path) as f:
            other = int(f.read())
        os.kill(other, 0)                          # ProcessLookupError when it is gone
        alive = other != os.getpid()
    except (OSError, ValueError):                  # no lock, a dead process's, not a pid
        alive = False
    if alive:
        raise ValueError(f"--out_dir={out_dir} is being written by another run (pid {other}): "
                         f"wait for it or pass another --out_dir (if no such run is alive, "
                         f"remove {path})")
    with open(path, "w") as f:
        f.write(str(os.getpid()))


@contextmanager
def locked(out_dir: str):
    """out_dir locked (lock_out_dir) for the duration of the block: eval.py's outputs."""
    lock_out_dir(out_dir)
    try:
        yield
    finally:
        os.remove(os.path.join(out_dir, ".lock"))


def is_inside(path: str, folder: str) -> bool:
    """Whether `path` lies inside `folder` (links followed)."""
    return os.path.realpath(path).startswith(os.path.realpath(folder) + os.sep)


def start_wandb(cfg):
    """The Weights & Biases run of --wandb_project, its files in out_dir/wandb. ValueError when it
    cannot start."""
    # wandb is an optional requirement, imported only here
    try:
        import wandb
    except ImportError:
        raise ValueError("--wandb_project needs wandb: pip install -r "
                         "requirements-extra.txt") from None
    try:
        return wandb.init(project=cfg.wandb_project, config=dataclasses.asdict(cfg),
                          dir=cfg.out_dir)
    except wandb.errors.UsageError as e:
        raise ValueError(f"--wandb_project: {e} (WANDB_MODE=offline logs without an "
                         "account)") from None


# ---------------------------------------------------------------------------------------------
# The optimizer step, the schedule, the stream of examples


RUN_SEED_STRIDE = 1_000_003    # rollout seeds: a prime above any step count


def rollout_seed(seed: int, step: int) -> int:
    """A sampling seed of its own for every (run seed, step), the same on every rank: a prompt's
    responses are told apart by its place in the global batch (`sample.response_draws`), so a
    run's rollouts do not depend on the rank count."""
    return seed * RUN_SEED_STRIDE + step


def plan_micro_batches(lengths: list[int], ppo_mini_batches: int, micro_batch_size: int,
                       micro_batch_tokens: int = 0):
    """Rollout indices in ppo_mini_batches contiguous near-equal mini-batches (whole groups when
    the sizes divide), each filled greedily into micro-batches of <= micro_batch_size rollouts
    and, with micro_batch_tokens, <= that many padded tokens (rows x longest):
    plan_micro_batches([4, 4, 9, 9], 1, 4, 16) -> [[[0, 1], [2], [3]]]."""
    n = len(lengths)
    bounds = [round(i * n / ppo_mini_batches) for i in range(ppo_mini_batches + 1)]
    plan = []
    for lo, hi in itertools.pairwise(bounds):
        micro = []
        current = []
        longest = 0
        for i in range(lo, hi):
            longest_with_i = max(longest, lengths[i])
            full = len(current) == micro_batch_size
            padded_tokens = (len(current) + 1) * longest_with_i
            too_many_tokens = micro_batch_tokens and padded_tokens > micro_batch_tokens
            if current and (full or too_many_tokens):
                micro.append(current)
                current = []
                longest_with_i = lengths[i]
            current.append(i)
            longest = longest_with_i
        if current:
            micro.append(current)
        plan.append(micro)
    return plan


def optimizer_step(model, optimizer, scheduler, grad_clip: float) -> float:
    """Clip the global grad norm (0: no clipping), step the optimizer and the schedule; returns
    the norm before clipping. ValueError, before the step, when the norm is not finite (the loss
    diverged): the weights stay as they were and the checkpoints so far are kept (every rank sees
    the same all-reduced norm, so all of them stop)."""
    max_norm = grad_clip if grad_clip > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if hasattr(grad_norm, "full_tensor"):          # FSDP2: a DTensor
        grad_norm = grad_norm.full_tensor()
    if not torch.isfinite(grad_norm):
        raise ValueError(f"the gradient norm is {grad_norm.item()}: the loss diverged, so training "
                         "stops before this optimizer step (the checkpoints so far are kept); "
                         "lower --lr")
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm.item()


def lr_factor(step: int, warmup_steps: int, total_steps: int, schedule: str = "cosine") -> float:
    """The lr multiplier of optimizer step `step` (0-based): a linear warm-up, then 1.0
    ("constant") or a cosine from 1 to 0 at `total_steps`. E.g. warm-up 10, total 100: 0.1 at
    step 0, 1.0 at step 9, 0.5 at step 55."""
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


class ShuffledStream:
    """An endless stream of indices into n examples, shuffled each epoch with seed + epoch:
    (epoch, index) is all a resume needs."""

    def __init__(self, n: int, seed: int, epoch: int = 0, index: int = 0):
        if not 0 <= index <= n:
            raise ValueError(f"data position {index} is outside the {n} examples: resume with the "
                             "data the checkpoint was trained on")
        self.n = n
        self.seed = seed
        self.start(epoch, index)

    def start(self, epoch: int, index: int = 0):
        self.epoch = epoch
        self.index = index
        generator = torch.Generator().manual_seed(self.seed + epoch)
        self.order = torch.randperm(self.n, generator=generator).tolist()

    def take(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.index == self.n:
                self.start(self.epoch + 1)
            count = min(k - len(out), self.n - self.index)
            out += self.order[self.index:self.index + count]
            self.index += count
        return out

    def position(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}


def shuffled_streams(sources: dict, seed: int, state: dict) -> dict:
    """A ShuffledStream over each named source (name -> its examples), the i-th seeded seed + i,
    at the position a resumed trainer state saved (state["data_position"]: name -> `position()`;
    none: the start)."""
    positions = state.get("data_position", {})
    return {name: ShuffledStream(len(source), seed + i, **positions.get(name, {}))
            for i, (name, source) in enumerate(sources.items())}


# ---------------------------------------------------------------------------------------------
# The run both trainers hold


@dataclass
class Run:
    """What a training process holds; sft.train and grpo.train are a loop over steps around one."""
    cfg: object
    dist: Dist
    model: torch.nn.Module                 # plain (FSDP: sharded in place)
    tokenizer: object
    tags: TagIds
    resume: str = ""                       # the checkpoint this run continues ("" if fresh)
    settings: dict = field(default_factory=dict)   # sources and resume changes (resolve_config)
    train_model: torch.nn.Module = None    # what the loss runs on: DDP, FSDP, or the model
    optimizer: torch.optim.Optimizer = None
    scheduler: object = None
    step: int = 0
    state: dict = field(default_factory=dict)   # the trainer state resumed from
    log_file: object = None
    wandb: object = None                   # the Weights & Biases run (--wandb_project), rank 0
    checkpoint: str | None = None          # the latest checkpoint written (or resumed from)
    total_steps: int = 0                   # the loop's (`steps`)
    stopped_by: str = ""                   # why the loop ended early: "--max_time=<s>", a signal
    signal_received: str = ""              # SIGINT or SIGTERM, caught by `steps`
    step_rng: dict | None = None           # the RNGs as the step in flight began (`abandon_step`)
    saved_step: int | None = None          # the step of the latest checkpoint (every rank's)
    t_start: float = 0.0                   # when this process's loop began
    elapsed_before: float = 0.0            # training seconds before it (a resumed run's earlier)
    elapsed: float = 0.0                   # training seconds up to the last completed step
    t_saved: float = 0.0                   # when the last checkpoint was written (or the start)
    bar: object = None
    pending_save: concurrent.futures.Future | None = None   # --checkpoint=async: the save in
    save_group: object = None              # flight; the gloo group it talks over (`save_sharded`)

    def log(self, *args):
        if self.dist.is_main:
            print(*args)

    def write(self, row: dict):
        """One row into out_dir/log.jsonl (and Weights & Biases)."""
        if not self.dist.is_main:
            return
        self.log_file.write(json.dumps(row) + "\n")
        self.log_file.flush()
        if self.wandb:
            self.wandb.log(row, step=row["step"])

    def close(self):
        """End the run: wait for an async save in flight (`wait_for_save`), drop the rank wrapper,
        then (rank 0) close the log, the lock, wandb. DDP's reducer must not hold the process
        group's last reference when `distributed()` destroys it: its destructor, run holding the
        GIL, waits for gloo's threads, and one of those may wait for the GIL (a hang at exit, seen
        under load: pytorch #56297)."""
        self.wait_for_save()
        self.train_model = None
        if not self.dist.is_main:
            return
        self.log_file.close()
        os.remove(os.path.join(self.cfg.out_dir, ".lock"))
        if self.wandb:
            self.wandb.finish()

    def steps(self, total_steps: int, desc: str):
        """The training loop's step numbers: from the resumed step + 1 to total_steps, with a
        progress bar. The caller ends each step with `end_step`, or with `abandon_step` when a
        signal stopped it part-way; either may end the loop early. SIGINT (Ctrl-C) and SIGTERM
        (a cluster's preemption) are caught meanwhile (`catch_signals`): the trainer abandons
        the step in flight at its next safe point, or finishes it, and the last completed step
        is saved; --resume=True continues it exactly."""
        self.total_steps = total_steps
        self.checkpoint = self.resume or None
        if self.step >= total_steps:              # a resumed run that is already done
            self.log(f"note: {self.resume} is at step {self.step} and this run has {total_steps} "
                     "steps: nothing is left to train (raise --max_steps to go on)")
        self.t_start = time.monotonic()
        self.t_saved = self.t_start
        self.saved_step = self.step if self.resume else None
        self.bar = tqdm(total=total_steps, initial=self.step, disable=not self.dist.is_main,
                        dynamic_ncols=True, desc=desc)
        with catch_signals(self):
            while self.step < total_steps and not self.stopped_by:
                self.step_rng = rng_state()
                self.step += 1
                yield self.step
        self.bar.close()
        if self.signal_received:
            self.log(f"stopped by {self.signal_received} after step {self.step}: saved "
                     f"{self.checkpoint} (--resume=True continues it)")

    def end_step(self, row: dict, line: str, postfix: dict, evaluate=None, **trainer_state):
        """After a step: its row into log.jsonl (and the progress bar; `line` printed every
        log_every steps), `evaluate(tag)` every eval_every steps but the last, and a checkpoint
        with `trainer_state` every save_every steps and at the last: the total, --max_time, or
        a caught signal (every rank decides alike, or the next collective would hang)."""
        cfg = self.cfg
        self.elapsed = self.elapsed_before + time.monotonic() - self.t_start
        row["elapsed"] = self.elapsed             # across resumes: the run's, not this process's
        self.write(row)
        self.bar.set_postfix(**postfix)
        self.bar.update(1)
        if self.dist.is_main and cfg.log_every and row["step"] % cfg.log_every == 0:
            self.bar.write(line)
        stop = self.stop_early()
        last = self.step == self.total_steps or bool(stop)
        if evaluate and cfg.eval_every and self.step % cfg.eval_every == 0 and not last:
            evaluate(f"step {self.step}")
        by_steps = cfg.save_every and self.step % cfg.save_every == 0
        if last or by_steps or self.save_is_due():
            self.checkpoint = self.save(**trainer_state)
        self.stopped_by = stop

    def save_is_due(self) -> bool:
        """Whether --save_every_minutes have passed since the last checkpoint (on any rank: every
        rank decides alike)."""
        minutes = self.cfg.save_every_minutes
        if not minutes:
            return False
        due = time.monotonic() - self.t_saved >= minutes * SECONDS_PER_MINUTE
        return bool(all_reduce([due], self.dist.device, "max")[0])

    def signalled(self) -> bool:
        """Whether this rank caught a signal (no collective: the sampler asks every decode
        step)."""
        return bool(self.signal_received)

    def any_rank_signalled(self) -> bool:
        """Whether any rank caught a signal, on every rank (one collective: every rank must ask
        at the same point of the step)."""
        return bool(all_reduce([self.signalled()], self.dist.device, "max")[0])

    def abandon_step(self, **trainer_state):
        """End the loop on a signal that stopped the step in flight before it changed any weight
        (the trainer's safe points: grpo.grpo_step): nothing of it is kept. The last completed
        step (step - 1) is saved with `trainer_state` (the caller's as that step ended, e.g. the
        data position) and the RNGs as this step began, unless its checkpoint exists (saved by
        the schedule, or resumed from): --resume=True then runs this step again, as an
        uninterrupted run would. Every rank calls it."""
        self.step -= 1
        self.stopped_by = self.signal_received or "a signal (on another rank)"
        if self.saved_step != self.step:
            self.checkpoint = self.save(rng=self.step_rng, **trainer_state)

    def stop_early(self) -> str:
        """Why the loop ends before its last step: "--max_time=<seconds>" once they have passed,
        a signal's name once one was caught, else "" (any rank's reason, on every rank)."""
        elapsed = time.monotonic() - self.t_start
        over_time = bool(self.cfg.max_time) and elapsed > self.cfg.max_time
        reasons = [over_time, bool(self.signal_received)]
        over_time, signalled = all_reduce(reasons, self.dist.device, "max")
        if signalled:
            return self.signal_received or "a signal (on another rank)"
        if over_time:
            return f"--max_time={self.cfg.max_time:g}"
        return ""

    def save(self, rng: dict | None = None, **trainer_state) -> str | None:
        """out_dir/checkpoint-<step> with the optimizer, schedule, RNGs (`rng`, else as they are
        now) and the caller's state, as --checkpoint says: full (`save_full`: rank 0 writes one
        Hugging Face folder), sharded or async (`save_sharded`: each rank its shards). An async
        save still in flight is waited for first. Every rank calls it. Then the keep_last newest
        stay. Returns the path (on rank 0; an async save's appears there once written)."""
        self.wait_for_save()
        cfg = self.cfg
        path = os.path.join(cfg.out_dir, f"checkpoint-{self.step}")
        state = dict(step=self.step, config=dataclasses.asdict(cfg), **trainer_state,
                     rng=rng or rng_state(), scheduler=self.scheduler.state_dict(),
                     elapsed=self.elapsed)
        if cfg.checkpoint == "full":
            self.save_full(path, state)
        else:
            self.save_sharded(path, state)
        self.t_saved = time.monotonic()
        self.saved_step = self.step
        return path if self.dist.is_main else None

    def save_full(self, path: str, state: dict) -> None:
        """One Hugging Face folder written by rank 0, the optimizer in trainer_state.pt: FSDP
        gathers the full state dicts to rank 0's host memory first (Qwen3-4B: 48 GB through one
        process); the other ranks wait at a barrier."""
        cfg = self.cfg
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        if cfg.fsdp:
            model_state = {"state_dict": get_model_state_dict(self.train_model, options=options)}
            optimizer_state = get_optimizer_state_dict(self.train_model, self.optimizer,
                                                       options=options)
        else:
            model_state = {}
            optimizer_state = self.optimizer.state_dict()
        if self.dist.is_main:
            state["optimizer"] = optimizer_state
            save_checkpoint(path, self.train_model, self.tokenizer, state, **model_state)
            self.prune()
        if dist.is_initialized():
            dist.barrier()

    def save_sharded(self, path: str, state: dict) -> None:
        """--checkpoint=sharded|async: every rank writes its own shards of the weights and the
        AdamW state (torch.distributed.checkpoint, `get_state_dict`) into path/dcp, one file a
        rank, no gather; rank 0 the architecture, the tokenizer and trainer_state.pt (no optimizer
        in it). The folder takes its name once every shard is written (`publish`): a reader sees
        the whole checkpoint or the previous one. model.load_model reads it as it reads a full
        one (eval.py --model=<it>); `restore` resumes from it exactly. async: dcp.async_save
        copies the shards to host memory here and writes them in a background thread while
        training goes on, talking over a gloo group of its own (NCCL cannot carry it, and the
        training's group must not be used from two threads); `wait_for_save` ends it."""
        tmp = [new_folder_beside(path) if self.dist.is_main else None]
        if dist.is_initialized():
            dist.broadcast_object_list(tmp, src=0)         # every rank writes into rank 0's
        tmp = tmp[0]
        model_state, optimizer_state = get_state_dict(self.train_model, self.optimizer)
        shards = {"model": model_state, "optimizer": optimizer_state}
        if self.dist.is_main:
            self.model.config.save_pretrained(tmp)
            self.tokenizer.save_pretrained(tmp)
            torch.save(state, os.path.join(tmp, "trainer_state.pt"))
        target = os.path.join(tmp, SHARDED_FOLDER)
        if self.cfg.checkpoint == "sharded":
            dcp.save(shards, checkpoint_id=target)
            if self.dist.is_main:
                publish(tmp, path)
                self.prune()
            if dist.is_initialized():
                dist.barrier()
            return
        if self.save_group is None and dist.is_initialized():
            self.save_group = dist.new_group(backend="gloo")
        written = dcp.async_save(shards, checkpoint_id=target, process_group=self.save_group)
        self.pending_save = written
        if self.dist.is_main:                      # rank 0's is done once the folder is named
            self.pending_save = concurrent.futures.Future()
            threading.Thread(target=publish_when_written,
                             args=(written, self.pending_save, tmp, path, self.prune)).start()
        self.dist.saves_in_flight.append(self.pending_save)

    def wait_for_save(self) -> None:
        """Wait for the async save in flight, if any, to be written and (rank 0) named: before the
        next save, at the end of the run (Run.close), and so before a signal's save. Raises what
        the writing raised."""
        if self.pending_save is None:
            return
        saving = self.pending_save
        self.pending_save = None
        self.dist.saves_in_flight.remove(saving)
        saving.result()

    def prune(self) -> None:
        """Rank 0: delete all but the keep_last newest checkpoints (0: keep all)."""
        keep_last = self.cfg.keep_last
        if keep_last > 0:
            for _, old in checkpoints(self.cfg.out_dir)[:-keep_last]:
                shutil.rmtree(old, ignore_errors=True)


def publish_when_written(written, named: concurrent.futures.Future, tmp: str, path: str,
                         prune) -> None:
    """Rank 0's thread beside an async save: once `written` (dcp.async_save's Future: done after
    every rank's shards and the metadata are on disk) is done, name the folder (`publish`),
    `prune()`, and end the Future `named` with the path, or with what failed."""
    try:
        written.result()
        publish(tmp, path)
        prune()
    except BaseException as e:
        named.set_exception(e)
        return
    named.set_result(path)


def rng_state() -> dict:
    """Every RNG a run draws from (this rank's GPU's too)."""
    cuda = torch.cuda.get_rng_state() if torch.cuda.is_available() else None
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "numpy": np.random.get_state(), "cuda": cuda}


def set_rng_state(rng: dict) -> None:
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    if rng.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])


def load_in_turns(load):
    """`load()` in each process, the ranks of a node one after another: a rank reads the whole
    model in fp32 on the host before moving it to its GPU (Qwen3-4B: 16 GB), so 8 ranks at once
    would hold 129 GB of a node's memory, one at a time 16 GB (the memory plan's host line).
    Ranks of the same local rank on different nodes load together. One process: `load()`."""
    if not dist.is_initialized():
        return load()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    loaded = None
    for turn in range(local_world_size):
        if turn == local_rank:
            loaded = load()
        dist.barrier()                   # the next rank reads once this one's copy is on its GPU
    return loaded


def resolve_config(cfg, d: Dist, resolve_defaults, presets: dict) -> tuple[object, dict]:
    """(the config a run trains with, its record for Run.settings): `resolve_defaults(cfg,
    world_size)` fills the unset settings (the preset of `presets` that --preset names, auto: the
    model's, `model.resolve_preset`, which rank 0 prints with why); the record holds each
    setting's source (config.SOURCES; on a resume `resumed_source`) and, on a resume, what it
    changes (`check_resume`). On a resume a setting left unset (None, --preset=auto) is the
    checkpoint's."""
    given = cfg
    path = resume_path(cfg)
    saved = {}
    if path:
        saved, _ = read_checkpoint_config(path)
        names = {f.name for f in dataclasses.fields(cfg)}
        unset = {name: value for name, value in saved.items()
                 if name in names and getattr(cfg, name) is None}
        if cfg.preset == "auto" and "preset" in saved:
            unset["preset"] = saved["preset"]
        cfg = dataclasses.replace(cfg, **unset)
    asked = cfg.preset
    cfg = resolve_defaults(cfg, d.world_size)
    _, why = resolve_preset(asked, cfg.model)
    if path and cfg.preset == saved.get("preset"):
        why = f"the run's, kept by --resume={path}"
    if d.is_main:
        print(f"preset {cfg.preset} ({why})")
    start_mode = mode_from_config(read_checkpoint_config(cfg.model)[0])
    mode = mode_from_config(dataclasses.asdict(cfg))
    if start_mode and start_mode != mode and d.is_main:
        print(f"warning: {cfg.model} was trained in mode {start_mode!r}, this run samples and "
              f"trains in {mode!r}")
    found = config.sources(given, cfg, presets.get(cfg.preset, {}))
    if not path:
        return cfg, {"sources": found, "resume": None}
    record = check_resume(cfg, saved, path)
    earlier = recorded_sources(path, saved)
    for name in saved:
        if name in found and name not in NOT_COMPARED:
            found[name] = resumed_source(name, record["changed"], earlier, cfg.out_dir, path)
    return cfg, {"sources": found, "resume": record}


def resumed_source(name: str, changed: dict, earlier: dict, out_dir: str, checkpoint: str) -> str:
    """The source (config.SOURCES) of setting `name` on a resume from `checkpoint`: a value other
    than the checkpoint's (`changed`, check_resume's) is this start's flag, but an out_dir that is
    the checkpoint's folder is derived (parse_args puts a resume there); the checkpoint's value
    keeps the source settings.json recorded for it (`earlier`, recorded_sources), a flag of an
    earlier start as "earlier flag" (only this start's flags say "flag"), else "checkpoint"."""
    if name in changed:
        if name == "out_dir" and same_place(out_dir, os.path.dirname(os.path.abspath(checkpoint))):
            return "derived"
        return "flag"
    recorded = earlier.get(name, "checkpoint")
    if recorded == "flag":
        return "earlier flag"
    return recorded


def check_resume(cfg, saved: dict, path: str) -> dict:
    """What a resume from checkpoint `path` (its config `saved`) changes, as resumes.jsonl keeps
    it: {"checkpoint", "changed": {name: [old, new]}, "accepted": the changes --allow_changes
    named}. A change to a setting outside FREE_ON_RESUME that --allow_changes does not name is
    refused: ValueError naming each (old -> new) and the ways on. A --model naming the same folder
    by another path, or the start model's new place (`moved_away`), is no change."""
    allowed = [name for name in cfg.allow_changes.split(",") if name]
    names = [f.name for f in dataclasses.fields(cfg)]
    unknown = [name for name in allowed if name not in names]
    if unknown:
        raise ValueError(f"--allow_changes={cfg.allow_changes}: {', '.join(unknown)} is not a "
                         "setting of this script (--help lists them)")
    changed = config.changes(saved, cfg, NOT_COMPARED)
    for name in [name for name, (old, new) in changed.items() if same_place(old, new)]:
        changed.pop(name)
    free = set(FREE_ON_RESUME)
    if "model" in changed and moved_away(saved["model"]):      # --model: its new place
        free.add("model")
    refused = [name for name in changed if name not in free and name not in allowed]
    if refused:
        lines = [f"    --{name}: {json.dumps(changed[name][0])} -> {json.dumps(changed[name][1])}"
                 for name in refused]
        raise ValueError(f"--resume={path} would change what the run is (the checkpoint's -> this "
                         "run's):\n" + "\n".join(lines) + "\nDrop these flags to go on as the run "
                         f"began; or accept the changes with --allow_changes={','.join(refused)} "
                         "(each resume's changes are recorded in resumes.jsonl); or start a new "
                         f"run from the checkpoint: --model={path} without --resume")
    accepted = [name for name in changed if name not in free]
    return {"checkpoint": path, "changed": {name: list(change) for name, change in changed.items()},
            "accepted": accepted}


SETTINGS_FILE = "settings.json"     # in every run folder: the settings in force, with sources
RESUMES_FILE = "resumes.jsonl"      # ... and one line per resume: when, what changed


def recorded_sources(checkpoint: str, saved: dict) -> dict[str, str]:
    """The sources settings.json beside `checkpoint` records for the values the checkpoint's
    config `saved` holds ({} without one, or with one that is not ours; a value since changed has
    none)."""
    path = os.path.join(os.path.dirname(os.path.abspath(checkpoint)), SETTINGS_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            recorded = json.load(f)["settings"]
    except (OSError, ValueError, KeyError, TypeError):     # none, or edited by hand
        return {}
    return {name: entry["source"] for name, entry in recorded.items()
            if name in saved and entry["value"] == config.plain(saved[name])}


def record_settings(run: Run) -> None:
    """Rank 0, in the taken out_dir: settings.json (every setting in force: its value and source,
    `resolve_config`), on a resume a line appended to resumes.jsonl (when, from which checkpoint,
    what changed, what --allow_changes accepted), and the settings printed by source."""
    cfg = run.cfg
    values = {f.name: config.plain(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    sources = dict(run.settings["sources"])
    for f in dataclasses.fields(cfg):          # set after resolution: SFT's max_length
        if sources[f.name] == "default" and values[f.name] != config.plain(f.default):
            sources[f.name] = "derived"
    entries = [f"  {json.dumps(name)}: {json.dumps({'value': value, 'source': sources[name]})}"
               for name, value in values.items()]
    lines = [f'{{"resumed_from": {json.dumps(run.resume or None)}, "step": {run.step},',
             '"settings": {', ",\n".join(entries), "}}"]     # JSON, one setting a line
    with open(os.path.join(cfg.out_dir, SETTINGS_FILE), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    run.log(f"settings in force ({os.path.join(cfg.out_dir, SETTINGS_FILE)}), by source:\n"
            + config.settings_table(values, sources))
    record = run.settings["resume"]
    if record is None:
        return
    line = {"time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "step": run.step, **record}
    with open(os.path.join(cfg.out_dir, RESUMES_FILE), "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
    changed = ", ".join(f"{name} {old} -> {new}" for name, (old, new) in record["changed"].items())
    accepted = ""
    if record["accepted"]:
        accepted = f" (accepted by --allow_changes: {','.join(record['accepted'])})"
    run.log(f"this resume changes: {changed or 'nothing'}{accepted}")


def load_run(cfg, d: Dist, name: str, settings: dict, cls=Run, **load_kw) -> Run:
    """Seed every RNG and load the model to train in fp32 (the master weights): `name`, or the
    checkpoint of --resume (then `load_kw` is not used). `settings`: resolve_config's record."""
    if cfg.fsdp and not dist.is_initialized():
        raise ValueError("--fsdp=True shards the model over processes: launch with torchrun "
                         "(torchrun --nproc_per_node=<gpus> sft.py --fsdp=True ...)")
    check_out_dir(cfg.out_dir)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    path = resume_path(cfg)
    if path:
        load_kw = {}
    model, tok = load_in_turns(functools.partial(load_model, path or name, dtype=torch.float32,
                                                 device=d.device, seed=cfg.seed, **load_kw))
    return cls(cfg, d, model, tok, TagIds.from_tokenizer(tok), resume=path, settings=settings)


def frozen_models(run: Run, reference: bool) -> tuple:
    """GRPO's frozen models, before `prepare` wraps run.model: (the KL term's reference when
    `reference` (kl_coef > 0), else None; the sampler's model). The reference holds the initial
    weights, cfg.model's also on a resume; the sampler runs on run.model, or on a plain copy
    under FSDP, which shards run.model (`sync_rollout_model` refreshes it). Both compute in the
    policy forward's dtype (`compute_dtype`)."""
    cfg = run.cfg
    dtype = compute_dtype(run.dist.device, cfg.fsdp)   # the policy's forward: bf16 under FSDP
    ref_model = None
    if reference:
        initial = run.model
        if run.resume:           # the initial weights, not the checkpoint's (on the CPU first)
            initial = load_model(cfg.model, dtype=torch.float32, device="cpu")[0]
        ref_model = frozen_copy(initial, dtype, run.dist.device)
    rollout_model = run.model
    if cfg.fsdp:
        rollout_model = frozen_copy(run.model, dtype)
    return ref_model, rollout_model


def checkpoint_contexts(device: torch.device):
    """Gradient checkpointing's contexts (torch.utils.checkpoint's context_fn): nothing around a
    layer's forward, attention.masked_sdpa around its recompute in the backward, which runs
    outside the forward's `with` (the checkpoint does not restore the SDPA kernel choice)."""
    return nullcontext(), attention.masked_sdpa(device)


def wrap_model(run: Run) -> None:
    """run.train_model: FSDP2 (each decoder layer, then the root: one all-gather per layer), DDP
    over several ranks, or the model itself."""
    cfg = run.cfg
    model = run.model
    device = run.dist.device
    cuda = device.type == "cuda"
    if cfg.grad_checkpointing:
        contexts = functools.partial(checkpoint_contexts, device)
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False, "context_fn": contexts})
    model.train()
    run.train_model = model
    if cfg.fsdp:
        if cuda:
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        else:
            policy = MixedPrecisionPolicy()
        for module in [*model.model.layers, model]:
            fully_shard(module, mp_policy=policy)
    elif run.dist.world_size > 1:
        device_ids = [run.dist.device.index] if cuda else None
        run.train_model = torch.nn.parallel.DistributedDataParallel(model, device_ids)


def restore(run: Run, lr_lambda) -> None:
    """--resume: the optimizer, the schedule, the step and the RNGs as the checkpoint left them;
    the lr of the next step is this run's --lr and schedule."""
    cfg = run.cfg
    run.state = load_trainer_state(run.resume)
    if sharded_checkpoint(run.resume):
        load_shards(run)
    elif cfg.fsdp:
        set_optimizer_state_dict(run.train_model, run.optimizer, run.state["optimizer"],
                                 options=StateDictOptions(full_state_dict=True))
    else:
        run.optimizer.load_state_dict(run.state["optimizer"])
    run.scheduler.load_state_dict(run.state["scheduler"])
    stored_lr = run.optimizer.param_groups[0]["lr"]           # the checkpoint's next lr
    next_step = run.scheduler.last_epoch
    run.scheduler.base_lrs = [cfg.lr] * len(run.optimizer.param_groups)
    for group in run.optimizer.param_groups:
        group["lr"] = cfg.lr * lr_lambda(next_step)
    new_lr = run.optimizer.param_groups[0]["lr"]
    if new_lr != stored_lr:
        run.log(f"note: with this run's settings (lr, steps, schedule) the next step trains at lr "
                f"{new_lr:.3g}, not the checkpoint's {stored_lr:.3g}")
    run.step = run.state["step"]
    run.elapsed_before = run.state.get("elapsed", 0.0)   # older checkpoints lack it
    run.elapsed = run.elapsed_before
    set_rng_state(run.state["rng"])


def load_shards(run: Run) -> None:
    """The weights and the AdamW state of a sharded checkpoint (Run.save_sharded) into
    run.train_model and run.optimizer: each rank reads the parts its own shards hold (DCP
    reshards when the rank count changed). The values are those saved, bit for bit."""
    model_state, optimizer_state = get_state_dict(run.train_model, run.optimizer)
    shards = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(shards, checkpoint_id=os.path.join(run.resume, SHARDED_FOLDER))
    set_state_dict(run.train_model, run.optimizer, model_state_dict=shards["model"],
                   optim_state_dict=shards["optimizer"])


def open_out_dir(run: Run, reads_model_again: bool) -> None:
    """Rank 0 takes out_dir: refuses a --model inside it, locks it, moves an earlier run (or, on
    a resume from an older checkpoint, the abandoned newer ones) aside, opens log.jsonl.
    `reads_model_again`: the run loads --model again on a resume (GRPO's KL reference)."""
    cfg = run.cfg
    if not run.dist.is_main:
        return
    model_inside = os.path.isdir(cfg.model) and is_inside(cfg.model, cfg.out_dir)
    if model_inside and (not run.resume or reads_model_again):
        raise ValueError(f"--model={cfg.model} is inside --out_dir={cfg.out_dir}, and a fresh run "
                         "moves an earlier run's checkpoints aside (the one it starts from too): "
                         "pass another --out_dir")
    fresh_dir = not os.path.isdir(cfg.out_dir)
    os.makedirs(cfg.out_dir, exist_ok=True)
    lock_out_dir(cfg.out_dir)
    try:                                           # first, so that a failed start changes nothing
        run.wandb = start_wandb(cfg) if cfg.wandb_project else None
    except ValueError:
        os.remove(os.path.join(cfg.out_dir, ".lock"))
        if fresh_dir:
            shutil.rmtree(cfg.out_dir, ignore_errors=True)
        raise
    log_path = os.path.join(cfg.out_dir, "log.jsonl")
    found = checkpoints(cfg.out_dir)
    if run.resume:      # the newer checkpoints belong to the run it abandons: --resume=True
        old = [p for step, p in found if step > run.step]              # would pick them
    else:
        records = [os.path.join(cfg.out_dir, name) for name in (SETTINGS_FILE, RESUMES_FILE)]
        records = [p for p in records if os.path.isfile(p)]
        old = [p for _, p in found] + glob.glob(log_path) + records
    if old:
        aside = move_aside(cfg.out_dir, old)
        if run.resume and os.path.isfile(log_path):   # the abandoned steps' lines go with them
            shutil.copy(log_path, aside)
        if run.resume:
            what = f"the checkpoints after step {run.step}"
            hint = ""
        else:
            what = "an earlier run"
            hint = " (--resume=True continues a run instead)"
        run.log(f"moved {what} in {cfg.out_dir} to {aside}{hint}")
    kept = []
    if run.resume and os.path.isfile(log_path):       # a resumed log: the lines up to its step
        with open(log_path) as f:
            kept = [line for line in f if json.loads(line)["step"] <= run.step]
    # open for the whole run; Run.close closes it
    run.log_file = open(log_path, "w")   # noqa: SIM115
    run.log_file.writelines(kept)
    record_settings(run)


def prepare(run: Run, lr_lambda, reads_model_again: bool = False) -> Run:
    """Wrap the model for the ranks, build AdamW (decay on every parameter, as the official
    trainers) and the schedule, restore both on --resume, and open out_dir's log."""
    cfg = run.cfg
    wrap_model(run)
    run.optimizer = torch.optim.AdamW(run.train_model.parameters(), lr=cfg.lr,
                                      weight_decay=cfg.weight_decay, betas=tuple(cfg.betas))
    run.scheduler = torch.optim.lr_scheduler.LambdaLR(run.optimizer, lr_lambda)
    if run.resume:
        restore(run, lr_lambda)
    open_out_dir(run, reads_model_again)
    if run.resume:
        run.log(f"resumed from {run.resume} at step {run.step}")
    return run


CAUGHT_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def catch_signals(run: Run):
    """Inside: the first SIGINT or SIGTERM only sets run.signal_received (the trainer abandons or
    finishes the step in flight, saves the last completed one and stops) and restores SIGINT's
    handler, so that a second Ctrl-C acts at once (KeyboardInterrupt). A second SIGTERM changes
    nothing: under Slurm a worker gets the cluster's and then torchrun's, and the launcher's
    SIGKILL ends the grace time anyway. Only the main thread may set handlers: elsewhere nothing
    is caught."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {number: signal.getsignal(number) for number in CAUGHT_SIGNALS}

    def restore():
        for number, handler in previous.items():
            signal.signal(number, handler)

    def note(number, frame):
        if not run.signal_received:
            run.signal_received = signal.Signals(number).name
        signal.signal(signal.SIGINT, previous[signal.SIGINT])

    for number in CAUGHT_SIGNALS:
        signal.signal(number, note)
    try:
        yield
    finally:
        restore()


class Stopwatch:
    """Seconds between laps: `lap("time_sample")` records the time since the previous lap."""

    def __init__(self):
        self.laps = {}
        self.last = time.monotonic()

    def lap(self, name: str):
        now = time.monotonic()
        self.laps[name] = now - self.last
        self.last = now


def interrupted(script: str, out_dir: str | None) -> str:
    """The line a Ctrl-C ends a training script with: what is kept, and how to go on."""
    kept = checkpoints(out_dir) if out_dir and os.path.isdir(out_dir) else []
    if not kept:
        return f"{script}: interrupted before its first checkpoint: nothing to resume from"
    return (f"{script}: interrupted; the checkpoints in out_dir are kept (--resume=True continues "
            f"the latest, {kept[-1][1]})")


def run_script(script: str, config_class, train, argv: list[str]) -> None:
    """`python sft.py|grpo.py ...`: parse the command line and train. Bad input, Ctrl-C and
    SIGTERM end in one line that says what to do (no traceback), with exit status 1; a signal
    caught in the loop (`Run.steps`) saves the step first."""
    cfg = None
    try:
        cfg = parse_args(config_class, argv)
        summary = train(cfg)
    except (OSError, ValueError) as e:             # bad input: the message says what to do
        sys.exit(f"{script}: error: {e}")
    except KeyboardInterrupt:
        sys.exit(interrupted(script, cfg.out_dir if cfg else None))
    if summary["stopped_by"].startswith(("SIG", "a signal")):
        if int(os.environ.get("RANK", "0")) != 0:
            sys.exit(1)                            # rank 0 says where the checkpoint is
        sys.exit(f"{script}: stopped by {summary['stopped_by']} after step {summary['steps']}; "
                 f"--resume=True continues from {summary['checkpoint']}")
