"""GRPO: reinforcement learning of parallel thinking (PAPER_NOTES §5, §6).

    python grpo.py                                     # tiny model from runs/sft, synthetic:hard, <= 8 min on 2 cores
    python grpo.py --recipe=unseen-s2 --max_steps=50   # any config field: --key=value
    python grpo.py --resume=True                       # continue the latest checkpoint in out_dir, exactly

    # a real model on 8 GPUs (the paper's Unseen S2 run, §5.3: DAPO, 256 prompts x 8, lr 1e-6, 300 steps)
    torchrun --nproc_per_node=8 grpo.py --recipe=unseen-s2 --model=runs/sft_qwen3_4b/checkpoint-230 \\
        --data=dapo --fsdp=True --grad_checkpointing=True --out_dir=runs/grpo_qwen3_4b_s2

One training step:

    prompts      batch_size problems from the data stream (each rank takes its share)
    rollouts     sample.generate(..., group_size=G, mode=<the model's mode>): G responses per prompt,
                 with the log-prob of every sampled token recorded
    rewards      rewards.score_batch (the recipe's reward at this step)
    advantages   per group: A_i = (r_i - mean(r)) / (std(r) + 1e-6), std unbiased (as the official code);
                 a group whose rewards are all equal gets A = 0 (it teaches nothing)
    update       ppo_mini_batches optimizer steps, each on a slice of the rollouts, of the token-level
                 PPO-clip loss below (gradient accumulation over micro-batches)
    log          out_dir/log.jsonl: rewards, advantages, loss, clip fractions, entropy, grad norm, share of
                 groups with reward variance, rollout statistics, seconds of sampling / reward / update

The loss, per response token t of response i (PAPER_NOTES §5.2, the official code's):

    ratio = exp(clamp(logp_new - logp_old, -20, 20))
    l     = max(-A ratio, -A clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high))        PPO clip, clip-higher
    l     = min(l, -A clip_ratio_c)    where A < 0                                         dual clip (3.0)
    loss  = sum_{i,t} w_{i,t} l_{i,t} / D  (+ kl_coef * the same mean of a KL estimate, when kl_coef > 0)

with the weights w and denominator D of `loss_agg_mode` (token-mean: w = 1, D = response tokens), taken
over the *whole* mini-batch: all micro-batches and all ranks (the official code averages per-micro-batch
means, which weighs a token by how its micro-batch happened to be cut).

Where this file differs from the official code, on purpose:
* logp_old is the sampler's own recorded log-prob. The branching sampler computes exactly the training
  forward's quantity (sample.py: same mask, positions and temperature), so the ratio is 1 on-policy and
  the official extra forward over every rollout is saved; `--recompute_logprobs=True` runs it anyway
  and logs the largest difference (about 1e-5 in fp32 on the tiny SFT model).
* Tokens the runtime injected (<Path>, </Parallel>, the newline, <Summary>, an EOS replaced by a
  closing tag: `Rollout.sampled_mask == 0`) are not in the loss: the model did not choose them. The
  official code trains on them (§5.2, §8.2.2); `--train_injected=True` does the same, with their
  logp_old from a forward (the sampler has none for them).
* Loss normalisation is global over micro-batches and ranks (see above).

Recipes (`--recipe`; PAPER_NOTES §2.5, §4, §6):

    recipe      mode        reward (rewards.RewardSchedule)                  clip high   PAPER_NOTES
    seen        seen        parallel_gated on easy data for easy_steps,      0.2         §6.1 stages 2-3, §4.2
                            then accuracy on the training data
    unseen-s1   unseen      accuracy                                         0.2         §6.1 stage 3, §4.1
    unseen-s2   unseen      alternating (steps 1-8 of 10 accuracy, 9-10     0.28        §4.4, §5.2
                            tiered)
    scaffold    unseen      alternating up to scaffold_steps, then accuracy  0.28, 0.2   §6.2
    baseline    sequential  accuracy, sequential prompt, <Parallel> masked   0.2         §7.1 "GRPO (DAPO)"

Each starts from the SFT checkpoint of its mode (`DEFAULT_INIT`; `--model=` overrides): `python sft.py`
writes the Unseen one, `python sft.py --mode=seen --out_dir=runs/sft_seen` the Seen one,
`python sft.py --style=sequential --mode=seen --out_dir=runs/sft_sequential` the baseline's.

Distributed (torchrun): every rank samples, scores and trains on its own share of the prompts; the
advantages need only a rank's own groups. Ranks agree on the number of micro-batches of each mini-batch
(the maximum over ranks; a rank with fewer adds zero-weight micro-batches), so collectives never hang
when one rank's rollouts are longer. DDP by default; `--fsdp=True` shards the model with FSDP2. Under
FSDP the sampler runs on a plain, unsharded copy of the weights that every rank refreshes after each
update with one all-gather (`sync_rollout_model`), as verl refreshes its rollout engine: ranks then
generate independently, with no lock-step over decode steps of different lengths.

The tiny default (`python grpo.py`, from the 400-step `python sft.py` checkpoint), measured on the
project's 2-core CPU (~2.6 s sampling + ~3.9 s update per step when the run has the machine to itself);
GRPO's own held-out evaluation, Mean@8 on 128 hard test problems at T = 1:

    settings                                            steps  Mean@8 at steps 0 / 15 / 30 / end
    the default: lr 3e-4, 10 warm-up optimizer steps,   45     25.5 / 30.3 / 31.3 / 38.5   (+13.0, 380 s)
      cosine to 0 at step 45, k3 KL 0.3
    lr 2e-4, otherwise the default                      45     25.5 / 33.1 / 33.1 / 35.6   (+10.1)
    lr 2e-4 constant (400 s)                            51     25.5 / 29.8 (20) / 40.1 (40) / 33.8: gains,
                                                               then wobbles; cut at 56 steps instead, eval.py
                                                               24.7 -> 38.7
    lr 3e-4 cosine, beside another job (max_time cut)   34     25.5 / 29.7 / 36.4 / 43.0
    lr 2e-4 cosine, --seed=1, beside another job        34     22.5 / 22.8 / 31.2 / 32.2   (+9.7)
    --kl_coef=0 (lr 2e-4 constant)                      20     Mean@4 24.6 -> 12.9: the format drifts
    torchrun --standalone --nproc_per_node=2 grpo.py    76     eval.py 32.5 -> 55.9: one rank per core runs
      (lr 2e-4 constant; an SFT checkpoint of the              ~1.4x the steps of one 2-thread process (the
      same mix drawn with other problems)                      tiny model is latency-bound)

Why these defaults (the README has every run, the error analysis and the history): GRPO gains fast
when the SFT model's failures are a few uncertain positions (here the final two-digit sum and the answer line) and
slowly when they are low-probability characters scattered over every position, as they were with a
shorter SFT on a 60/40 mix; the k3 KL anchor (0.3) keeps the rest of the distribution in place
(without it the format drifts: entropy up, extra blocks), and 10 warm-up optimizer steps keep the first
bias-corrected Adam steps from moving every weight by ~lr at once (lr 3e-4 without warm-up cost 48
points of rollout accuracy in one step).

Checkpoints (`out_dir/checkpoint-<step>`): Hugging Face weights + tokenizer + trainer_state.pt (optimizer,
scheduler, RNG states, data position, step, config with `mode` and `recipe` for eval.py), written
atomically; every step's sampling seed is a function of (seed, step, rank), so `--resume` continues the
same run exactly (tests/test_grpo.py checks 4 steps = 2 + resume + 2 on CPU).
"""

from __future__ import annotations

import copy
import dataclasses
import glob
import json
import math
import os
import shutil
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass

# Idle OpenMP threads sleep instead of spin-waiting (read when torch loads; sft.py has the measurement).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
import torch.distributed as dist

from attention import TagIds, structured_forward
from data import TINY_VOCAB_LIMIT, load_data
from model import load_model
from rewards import RewardSchedule, parallel_positions, score_batch
from sample import Rollout, generate, token_logprobs
from sft import (DistInfo, ShuffledStream, build_optimizer, compute_dtype, encode_prompt, find_latest_checkpoint,
                 grad_sync, load_training_state, parse_config_with_resume, prune_checkpoints,
                 save_training_checkpoint, set_rng_state, setup_distributed, teardown_distributed)

RECIPES = ("seen", "unseen-s1", "unseen-s2", "scaffold", "baseline")
RECIPE_MODE = {"seen": "seen", "unseen-s1": "unseen", "unseen-s2": "unseen", "scaffold": "unseen",
               "baseline": "sequential"}
# Where each mode's SFT checkpoint is, and the command that writes it.
DEFAULT_INIT = {
    "unseen": ("runs/sft", "python sft.py"),
    "seen": ("runs/sft_seen", "python sft.py --mode=seen --out_dir=runs/sft_seen"),
    "sequential": ("runs/sft_sequential", "python sft.py --style=sequential --mode=seen --out_dir=runs/sft_sequential"),
}
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("k1", "k3")

# ----------------------------------------------------------------------------------------------------
# Config


@dataclass
class GRPOConfig:
    """Every knob of a run; override any of them with `--key=value`. `None` = the default for the model,
    filled in by `resolve_defaults` once the model is loaded (tiny = a tokenizer under
    data.TINY_VOCAB_LIMIT entries, i.e. the character tokenizer of the embedded model):

        field               real model (the paper, §5.3)      tiny model (measured: module docstring)
        data                dapo                              synthetic:hard
        eval_data           aime25                            synthetic:hard:test
        easy_data (seen)    gsm8k:train                       synthetic:easy
        batch_size          256 prompts                       16 prompts
        group_size          8                                 8
        max_new_tokens      3000                              160
        lr                  1e-6                              3e-4
        warmup_steps        0                                 10 optimizer steps (5 training steps)
        lr_schedule         constant                          cosine to 0 at max_steps (a constant 2e-4
                                                              wobbled: Mean@8 40 at step 40, 34 at 51)
        kl_coef             0 (no reference model)            0.3 (k3, against the SFT weights)
        micro_batch_size    2 rollouts                        16 rollouts
        generate_batch_size 64 prompts per generate call      all prompts of the step
        max_steps           300                               45 (380 s on 2 idle cores, evals included)
        max_time            none                              none: a cut cosine leaves the lr high (a demo
                                                              on busy cores stopped at step 31: +9 not +13)
        eval_every          10 steps                          15 steps
        eval_samples, eval_k 30 problems x 16 (Mean@16)       128 problems x 8 (Mean@8, ~20 s each: 1,024
                                                              samples, so before/after moves by ~±2 points
                                                              between seeds, not ~±4 as 64 x 4 did)
        easy_steps          35 (the GSM8K stage, §5.3)        10
        scaffold_steps      200 (§6.2)                        20
    Everything else is the paper's for both: T = 1.0, top-p 1, 2 paths, <= 4 blocks, AdamW betas
    (0.9, 0.999), wd 0.01, grad clip 1.0, 2 PPO mini-batches per step, clip 0.2 (0.28 high for S2),
    dual clip 3.0, token-mean.
    """

    # what to train
    recipe: str = "unseen-s1"            # see RECIPES and the module docstring
    model: str = ""                      # "" = the latest SFT checkpoint of the recipe's mode (DEFAULT_INIT)
    mode: str = ""                       # "" = the recipe's: unseen, seen or sequential
    data: str | None = None              # a data.load_data spec of training problems
    easy_data: str | None = None         # recipe "seen": the easy-RL stage's problems
    prompt_file: str = ""                # a prompt template for data.build_prompt ("" = its default)
    out_dir: str = "runs/grpo"
    # rollouts
    batch_size: int | None = None        # prompts per step, global (over all ranks)
    group_size: int | None = None        # responses per prompt (G)
    max_new_tokens: int | None = None    # response budget per sample, paths and summaries included
    num_paths: int = 2
    max_blocks: int = 4
    temperature: float = 1.0             # sampling and training log-probs (the same T, so the ratio is exact)
    top_p: float = 1.0
    top_k: int = 0
    generate_batch_size: int | None = None  # prompts per sample.generate call (memory), 0 = all at once
    # rewards and advantages
    reward: str = ""                     # "" = the recipe's; else a rewards.RewardSchedule name for every step
    easy_steps: int | None = None        # recipe "seen": steps of the easy-RL stage
    scaffold_steps: int | None = None    # recipe "scaffold": steps of S2 before accuracy only
    norm_adv_by_std: bool = True         # False = Dr. GRPO: A = r - mean(r)
    filter_groups: bool = False          # drop groups whose rewards are all equal (dynamic sampling, no refill)
    # loss
    clip_ratio_low: float = 0.2
    clip_ratio_high: float | None = None  # None = the recipe's (0.2, or 0.28 for S2)
    clip_ratio_c: float = 3.0            # dual clip for negative advantages
    loss_agg_mode: str = "token-mean"    # token-mean | seq-mean-token-mean | seq-mean-token-sum-norm
    kl_coef: float | None = None         # > 0 loads a frozen reference model (the initial weights); paper: 0
    kl_estimator: str = "k3"             # k1 = log(p/p_ref); k3 = the low-variance, clamped estimator
    train_injected: bool = False         # True = also train on runtime-injected tokens (the official code)
    recompute_logprobs: bool = False     # debug: recompute logp_old with a forward, log the max difference
    # optimisation
    lr: float | None = None
    warmup_steps: int | None = None      # linear warm-up in optimizer steps, then lr_schedule
    lr_schedule: str | None = None       # "constant" (the paper) or "cosine" (to 0 at max_steps)
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0               # max global grad norm; 0 = no clipping
    ppo_mini_batches: int = 2            # optimizer steps per training step (the rollouts cut in this many)
    micro_batch_size: int | None = None  # rollouts per forward on one rank
    micro_batch_tokens: int = 0          # also cap a micro-batch at this many padded tokens (0 = no cap)
    max_steps: int | None = None
    max_time: float | None = None        # seconds of training in this process (evals included); 0 = no limit
    seed: int = 0
    # systems
    fsdp: bool = False                   # FSDP2 (fully_shard each decoder layer, then the root)
    grad_checkpointing: bool = False
    resume: str = ""                     # a checkpoint folder, or "True" = the latest in out_dir
    # evaluation, logging, checkpoints
    eval_data: str | None = None         # held-out problems; "" = no evaluation
    eval_every: int | None = None        # steps between evaluations (0 = only before and after)
    eval_samples: int | None = None      # the first this-many problems of eval_data (fixed subset; 0 = all)
    eval_k: int | None = None            # responses per problem (Mean@k, Pass@k)
    eval_temperature: float = 1.0        # the paper evaluates at T = 1.0, whatever T the rollouts use
    log_every: int = 10                  # print a line every N steps (log.jsonl gets every step)
    save_every: int = 50                 # checkpoint every N steps (0 = only at the end)
    keep_last: int = 2                   # checkpoints kept in out_dir (0 = all)


TINY_DEFAULTS = dict(data="synthetic:easy:rl,synthetic:medium:rl,synthetic:hard:rl",
                     eval_data="synthetic:easy:test,synthetic:medium:test,synthetic:hard:test", easy_data="synthetic:easy",
                     batch_size=16, group_size=8, max_new_tokens=128, lr=3e-4, warmup_steps=10,
                     lr_schedule="cosine", kl_coef=0.3, micro_batch_size=16, generate_batch_size=0,
                     max_steps=45, max_time=0.0, eval_every=15, eval_samples=64, eval_k=8, easy_steps=10,
                     scaffold_steps=20)
PAPER_DEFAULTS = dict(data="dapo", eval_data="aime25", easy_data="gsm8k:train", batch_size=256, group_size=8,
                      max_new_tokens=3000, lr=1e-6, warmup_steps=0, lr_schedule="constant", kl_coef=0.0,
                      micro_batch_size=2, generate_batch_size=64, max_steps=300, max_time=0.0, eval_every=10,
                      eval_samples=0, eval_k=16, easy_steps=35, scaffold_steps=200)


def resolve_defaults(cfg: GRPOConfig, tiny: bool, world_size: int = 1, warn: bool = True) -> GRPOConfig:
    """Fill the `None` fields (table in `GRPOConfig`) and the recipe's mode; check the values.

    Raises ValueError naming the field for an unknown recipe, mode, loss_agg_mode or KL estimator, a
    batch that does not split over ranks, or a group size / mini-batch count below 1.
    """
    if cfg.recipe not in RECIPES:
        raise ValueError(f"--recipe must be one of {RECIPES}, got {cfg.recipe!r}")
    d = TINY_DEFAULTS if tiny else PAPER_DEFAULTS
    cfg = dataclasses.replace(cfg, **{k: v for k, v in d.items() if getattr(cfg, k) is None})
    if not cfg.mode:
        cfg = dataclasses.replace(cfg, mode=RECIPE_MODE[cfg.recipe])
    if cfg.mode not in ("unseen", "seen", "sequential"):
        raise ValueError(f"--mode must be unseen, seen or sequential, got {cfg.mode!r}")
    if cfg.loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"--loss_agg_mode must be one of {LOSS_AGG_MODES}, got {cfg.loss_agg_mode!r}")
    if cfg.lr_schedule not in ("constant", "cosine"):
        raise ValueError(f"--lr_schedule must be 'constant' or 'cosine', got {cfg.lr_schedule!r}")
    if cfg.kl_estimator not in KL_ESTIMATORS:
        raise ValueError(f"--kl_estimator must be one of {KL_ESTIMATORS}, got {cfg.kl_estimator!r}")
    if cfg.reward:
        RewardSchedule(cfg.reward)                       # raises for an unknown name
    if min(cfg.batch_size, cfg.group_size, cfg.ppo_mini_batches, cfg.micro_batch_size, cfg.max_steps,
           cfg.max_new_tokens, cfg.eval_k) < 1:
        raise ValueError("--batch_size, --group_size, --ppo_mini_batches, --micro_batch_size, --max_steps, "
                         "--max_new_tokens and --eval_k must be >= 1")
    if not 0 < cfg.top_p <= 1:
        raise ValueError(f"--top_p must be in (0, 1], got {cfg.top_p}")
    if cfg.group_size == 1 and warn:
        print("warning: --group_size=1: every group has one response, so every advantage is 0 and nothing is "
              "learned", file=sys.stderr)
    if cfg.eval_samples < 0 or cfg.max_time < 0 or cfg.warmup_steps < 0 or cfg.max_blocks < 0:
        raise ValueError("--eval_samples, --max_time, --warmup_steps and --max_blocks must be >= 0")
    if cfg.top_k < 0:
        raise ValueError(f"--top_k must be >= 0 (0 = off), got {cfg.top_k}")
    if not cfg.temperature > 0:                          # also NaN
        raise ValueError(f"--temperature must be > 0, got {cfg.temperature}: GRPO needs sampled groups "
                         "(greedy responses of one prompt are all equal and teach nothing)")
    if cfg.batch_size % world_size:
        raise ValueError(f"--batch_size={cfg.batch_size} prompts do not split evenly over {world_size} ranks")
    return cfg


def lr_factor(opt_step: int, warmup_steps: int, total_steps: int, schedule: str) -> float:
    """The lr multiplier of optimizer step `opt_step` (0-based): linear warm-up over `warmup_steps`
    optimizer steps, then 1.0 ("constant", the paper's) or a cosine from 1 down to 0 at `total_steps`
    ("cosine"). Example: warmup 10, total 100, cosine -> 0.1 at step 0, 1.0 at step 9, 0.5 at step 55.
    """
    if warmup_steps and opt_step < warmup_steps:
        return (opt_step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (opt_step - warmup_steps) / max(1, total_steps - warmup_steps))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def default_init(mode: str, model: str = "") -> str:
    """The checkpoint a run starts from: `model` when given, else the latest SFT checkpoint of `mode`.
    Raises FileNotFoundError with the command that writes it when there is none."""
    if model:
        return model
    folder, command = DEFAULT_INIT[mode]
    try:
        return find_latest_checkpoint(folder)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"GRPO starts from an SFT checkpoint and there is none in {folder!r} (for mode {mode!r}). "
            f"Write it first with\n    {command}\n(about 4 minutes on 2 CPU cores for the tiny model), "
            "or pass --model=<a checkpoint folder or hub name>.") from None


# ----------------------------------------------------------------------------------------------------
# Recipes: which reward, data and clip range a step uses


@dataclass(frozen=True)
class Stage:
    reward: RewardSchedule       # asked with the 1-based global step
    data: str                    # "train" or "easy": which prompt stream the step draws from
    clip_ratio_high: float


def stage_at(cfg: GRPOConfig, step: int) -> Stage:
    """The recipe's reward, data and upper clip ratio at 1-based training step `step`.

        stage_at(GRPOConfig(recipe="seen", easy_steps=10), 10)  -> parallel_gated, "easy", 0.2
        stage_at(GRPOConfig(recipe="seen", easy_steps=10), 11)  -> accuracy, "train", 0.2
        stage_at(GRPOConfig(recipe="scaffold", scaffold_steps=20), 20) -> scaffold (tiered at 19-20), 0.28
        stage_at(GRPOConfig(recipe="scaffold", scaffold_steps=20), 21) -> scaffold (accuracy from 21), 0.2

    `--reward` and `--clip_ratio_high` replace the recipe's at every step.
    """
    r, data, high = cfg.recipe, "train", 0.2
    if r == "seen":
        easy = step <= (cfg.easy_steps or 0)
        reward, data = ("parallel_gated", "easy") if easy else ("accuracy", "train")
        schedule = RewardSchedule(reward)
    elif r == "unseen-s2":
        schedule, high = RewardSchedule("alternating"), 0.28
    elif r == "scaffold":
        K = cfg.scaffold_steps or 0
        # The scaffold's exploitation phase is a new S1 run in the official code (mid_training_exp.sh):
        # accuracy reward and clip 0.2/0.2.
        schedule, high = RewardSchedule("scaffold", switch_step=K), (0.28 if step <= K else 0.2)
    else:                                                  # unseen-s1, baseline
        schedule = RewardSchedule("accuracy")
    if cfg.reward:
        schedule = RewardSchedule(cfg.reward, switch_step=cfg.scaffold_steps or 0)
    return Stage(schedule, data, cfg.clip_ratio_high if cfg.clip_ratio_high is not None else high)


# ----------------------------------------------------------------------------------------------------
# Advantages


def compute_advantages(rewards, group_size: int, norm_adv_by_std: bool = True,
                       eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-relative advantages (PAPER_NOTES §5.1-5.2).

    Args:
        rewards: (n,) floats, prompt-major: responses [g*G, (g+1)*G) answer the same prompt.
        group_size: G. n must be a multiple of it.
        norm_adv_by_std: True: (r - mean) / (std + eps) with the unbiased std (torch.std, as the
            official code); False: r - mean (Dr. GRPO, no division).
    Returns:
        (advantages (n,) float32, has_variance (n // G,) bool). A group whose rewards are all equal
        has no variance and gets exactly 0 (never NaN, also for G = 1).

        >>> compute_advantages([1., -1., -1., -1.], 4)[0]     # mean -0.5, unbiased std 1
        tensor([ 1.5000, -0.5000, -0.5000, -0.5000])           # (divided by 1 + 1e-6)
        >>> compute_advantages([1., 1., -1., -1.], 4)[0]      # mean 0, unbiased std sqrt(4/3)
        tensor([ 0.8660,  0.8660, -0.8660, -0.8660])
        >>> compute_advantages([1., 1., -1., -1.], 4, norm_adv_by_std=False)[0]
        tensor([ 1.,  1., -1., -1.])
        >>> compute_advantages([1., 1., -1., -1.], 2)          # two groups, each all equal
        (tensor([0., 0., 0., 0.]), tensor([False, False]))

    Raises ValueError when n is not a multiple of G.
    """
    r = torch.as_tensor(rewards, dtype=torch.float32).flatten()
    if group_size < 1 or r.numel() % group_size:
        raise ValueError(f"{r.numel()} rewards do not form groups of {group_size}")
    g = r.view(-1, group_size)
    has_variance = g.max(dim=1).values > g.min(dim=1).values
    adv = g - g.mean(dim=1, keepdim=True)
    if norm_adv_by_std and group_size > 1:
        adv = adv / (g.std(dim=1, keepdim=True) + eps)
    adv = torch.where(has_variance[:, None], adv, torch.zeros_like(adv))
    return adv.flatten(), has_variance


# ----------------------------------------------------------------------------------------------------
# The loss, token by token


def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2,
                clip_ratio_c: float = 3.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token-level PPO-clip loss with clip-higher and dual clip (to be minimised; PAPER_NOTES §5.2).

    Args:
        logprobs: (B, T) float, the current policy's log-probs of the response tokens (with grad).
        old_logprobs: (B, T) float, the sampling policy's.
        advantages: (B, T), or (B, 1) broadcast over the tokens.
    Returns:
        loss (B, T); clipped (B, T) bool: the clipped PPO term was the larger one (its gradient is 0);
        dual (B, T) bool: the dual-clip bound -A * clip_ratio_c applied (A < 0; gradient 0).

    Worked examples (clip 0.2 low / 0.28 high, c = 3):
        A = +1, ratio 1.1  -> -1.1    (inside the range: gradient -A * ratio)
        A = +1, ratio 1.5  -> -1.28   (clip-higher: the gain stops at 1 + 0.28)
        A = -1, ratio 0.5  -> 0.8     (clipped below at 1 - 0.2)
        A = -1, ratio 2.0  -> 2.0     (PPO keeps the larger loss for a bad token that grew)
        A = -1, ratio 5.0  -> 3.0     (dual clip: a negative advantage's loss is at most 3 |A|)
    The log-ratio is clamped to [-20, 20] before exp so a stale token cannot overflow.
    """
    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    advantages = advantages.expand_as(ratio)
    pg1 = -advantages * ratio
    pg2 = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    clipped_loss = torch.maximum(pg1, pg2)
    pg3 = -advantages * clip_ratio_c
    negative = advantages < 0
    loss = torch.where(negative, torch.minimum(clipped_loss, pg3), clipped_loss)
    return loss, pg2 > pg1, negative & (clipped_loss > pg3)


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman's k1 / k3).

        k1 = logp - logp_ref                                    unbiased, high variance, can be < 0
        k3 = exp(logp_ref - logp) - (logp_ref - logp) - 1       unbiased, >= 0, low variance
    k3's exponent is clamped to [-20, 20] and its value to [-10, 10], as verl's "low_var_kl".
    e.g. logp = -1, logp_ref = -2: k1 = 1, k3 = e^-1 + 1 - 1 = 0.3679.
    """
    if estimator == "k1":
        return logprobs - ref_logprobs
    if estimator == "k3":
        d = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
        return (torch.exp(d) - d - 1.0).clamp(-10.0, 10.0)
    raise ValueError(f"kl estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")


def loss_weights(loss_mask: torch.Tensor, loss_agg_mode: str,
                 max_new_tokens: int | None = None) -> tuple[torch.Tensor, float]:
    """Per-token weights w (B, T) and a denominator D such that loss = sum(w * loss_mat) / D.

    loss_mask: (B, T) 0/1, the tokens in the loss. The modes (n_i = tokens of response i in the loss,
    N = responses with n_i > 0):
        token-mean               w = 1,        D = sum n_i           every token counts the same
        seq-mean-token-mean      w = 1 / n_i,  D = N                 every response counts the same
        seq-mean-token-sum-norm  w = 1,        D = N * max_new_tokens  Dr. GRPO: a constant per response,
                                                                      so length does not rescale a token
    Summing w * loss and D separately over micro-batches and ranks gives the loss of the whole batch.
    Raises ValueError for an unknown mode or seq-mean-token-sum-norm without max_new_tokens.
    """
    n = loss_mask.sum(dim=-1, keepdim=True)
    seqs = float((n > 0).sum())
    if loss_agg_mode == "token-mean":
        return loss_mask, float(n.sum())
    if loss_agg_mode == "seq-mean-token-mean":
        return loss_mask / n.clamp(min=1), seqs
    if loss_agg_mode == "seq-mean-token-sum-norm":
        if not max_new_tokens:
            raise ValueError("seq-mean-token-sum-norm needs max_new_tokens (the constant normaliser)")
        return loss_mask, seqs * max_new_tokens
    raise ValueError(f"loss_agg_mode must be one of {LOSS_AGG_MODES}, got {loss_agg_mode!r}")


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str = "token-mean",
             max_new_tokens: int | None = None) -> torch.Tensor:
    """sum(w * loss_mat) / D of one table (see `loss_weights`); 0 when nothing is in the loss.

        loss_mat = [[1, 2, 3], [4, 0, 0]], loss_mask = [[1, 1, 1], [1, 0, 0]]
        token-mean: 10 / 4 = 2.5;  seq-mean-token-mean: (2 + 4) / 2 = 3;
        seq-mean-token-sum-norm with max_new_tokens 5: 10 / (2 * 5) = 1
    """
    w, d = loss_weights(loss_mask, loss_agg_mode, max_new_tokens)
    return (w * loss_mat).sum() / max(d, 1e-12)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) along the last axis: logsumexp(z) - sum softmax(z) * z. (...) float32."""
    z = logits.float()
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)


# ----------------------------------------------------------------------------------------------------
# Rollouts -> padded token tables


@dataclass
class RolloutBatch:
    """A micro-batch of rollouts, right-padded. Token tables are *target-aligned*: column t holds the
    quantity of token input_ids[:, t + 1], which logits[:, t] predicts (so they are L - 1 wide)."""

    input_ids: torch.Tensor        # (B, L) long: prompt + response, right padding
    attention_mask: torch.Tensor   # (B, L) long: 1 on real tokens
    prompt_lengths: list[int]      # (B,)
    response_mask: torch.Tensor    # (B, L-1) float: the target is a response token
    sampled_mask: torch.Tensor     # (B, L-1) float: ... that the model sampled (not injected)
    loss_mask: torch.Tensor        # (B, L-1) float: ... that the loss trains on
    old_logprobs: torch.Tensor     # (B, L-1) float32: logp_old (the sampler's, or a forward's)
    advantages: torch.Tensor       # (B, 1) float32
    ref_logprobs: torch.Tensor | None = None   # (B, L-1) float32 when kl_coef > 0

    def to(self, device) -> "RolloutBatch":
        f = lambda t: None if t is None else t.to(device)
        return RolloutBatch(f(self.input_ids), f(self.attention_mask), self.prompt_lengths, f(self.response_mask),
                            f(self.sampled_mask), f(self.loss_mask), f(self.old_logprobs), f(self.advantages),
                            f(self.ref_logprobs))


def collate_rollouts(rollouts: list[Rollout], advantages, pad_id: int, train_injected: bool = False) -> RolloutBatch:
    """Pad rollouts into one `RolloutBatch`.

        prompt [5, 6], response [7, 8, 1] with sampled_mask [1, 0, 1], logprobs [-.5, 0, -.2]
        -> input_ids     [5, 6, 7, 8, 1]
           response_mask [0, 1, 1, 1]       (targets 6, 7, 8, 1)
           sampled_mask  [0, 1, 0, 1]
           old_logprobs  [0, -.5, 0, -.2]
           loss_mask = sampled_mask, or response_mask with train_injected
    `advantages`: one per rollout. Raises ValueError on a length mismatch.
    """
    if len(advantages) != len(rollouts):
        raise ValueError(f"{len(rollouts)} rollouts but {len(advantages)} advantages")
    B = len(rollouts)
    L = max(len(r.prompt_ids) + len(r.response_ids) for r in rollouts)
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    attention_mask = torch.zeros(B, L, dtype=torch.long)
    response_mask = torch.zeros(B, L - 1)
    sampled_mask = torch.zeros(B, L - 1)
    old_logprobs = torch.zeros(B, L - 1)
    for b, r in enumerate(rollouts):
        p, n = len(r.prompt_ids), len(r.prompt_ids) + len(r.response_ids)
        input_ids[b, :n] = torch.tensor(r.prompt_ids + r.response_ids)
        attention_mask[b, :n] = 1
        response_mask[b, p - 1:n - 1] = 1
        sampled_mask[b, p - 1:n - 1] = torch.tensor(r.sampled_mask, dtype=torch.float32)
        old_logprobs[b, p - 1:n - 1] = torch.tensor(r.logprobs, dtype=torch.float32)
    adv = torch.as_tensor(advantages, dtype=torch.float32).view(B, 1)
    loss_mask = response_mask if train_injected else sampled_mask
    return RolloutBatch(input_ids, attention_mask, [len(r.prompt_ids) for r in rollouts], response_mask,
                        sampled_mask, loss_mask.clone(), old_logprobs, adv)


def _empty_batch(pad_id: int) -> RolloutBatch:
    """A one-row micro-batch with nothing in the loss: what a rank runs when it has fewer micro-batches
    than another, so that every rank runs the same forwards and backwards (collectives stay paired)."""
    z = torch.zeros(1, 1)
    return RolloutBatch(torch.full((1, 2), pad_id, dtype=torch.long), torch.ones(1, 2, dtype=torch.long), [1],
                        z, z.clone(), z.clone(), z.clone(), torch.zeros(1, 1))


def plan_micro_batches(lengths: list[int], ppo_mini_batches: int, micro_batch_size: int,
                       micro_batch_tokens: int = 0) -> list[list[list[int]]]:
    """Cut this rank's rollouts (by index) into mini-batches, and each mini-batch into micro-batches.

    Mini-batches are `ppo_mini_batches` contiguous, near-equal slices (rollouts are prompt-major, so a
    slice holds whole groups when the sizes divide). Micro-batches fill greedily in order, up to
    `micro_batch_size` rollouts and, when `micro_batch_tokens` > 0, up to that many padded tokens
    (rows x longest row), so long rollouts get smaller micro-batches.

        plan_micro_batches([5, 5, 5, 5, 5, 5], 2, 2)   -> [[[0, 1], [2]], [[3, 4], [5]]]
        plan_micro_batches([4, 4, 9, 9], 1, 4, 16)     -> [[[0, 1], [2], [3]]]
    (the second: adding rollout 2 would make 3 rows x 9 tokens = 27 > 16, and 2 rows x 9 = 18 > 16 too,
    so 2 and 3 go alone). lengths: prompt + response tokens of each rollout.
    """
    n = len(lengths)
    bounds = [round(i * n / ppo_mini_batches) for i in range(ppo_mini_batches + 1)]
    plan = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        micro, cur, longest = [], [], 0
        for i in range(lo, hi):
            L = max(longest, lengths[i])
            if cur and (len(cur) == micro_batch_size or (micro_batch_tokens and (len(cur) + 1) * L > micro_batch_tokens)):
                micro.append(cur)
                cur, L = [], lengths[i]
            cur.append(i)
            longest = L
        if cur:
            micro.append(cur)
        plan.append(micro)
    return plan


# ----------------------------------------------------------------------------------------------------
# Forward and loss of one micro-batch


def autocast(device: torch.device):
    """bf16 autocast on GPUs (the weights and the optimizer stay fp32; sft.compute_dtype), nothing on CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


def policy_logits(model, mb: RolloutBatch, tags: TagIds, mode: str) -> torch.Tensor:
    """The training forward: `attention.structured_forward` (the Seen or Unseen mask and positions of
    every row's own structure; "sequential" = causal) over prompt + response. Returns (B, L, V)."""
    device = mb.input_ids.device
    with autocast(device):
        return structured_forward(model, mb.input_ids, mb.attention_mask, mb.prompt_lengths, tags, mode,
                                  dtype=compute_dtype(device))


def micro_batch_loss(logits: torch.Tensor, mb: RolloutBatch, cfg: GRPOConfig, clip_ratio_high: float,
                     denominator: float, world_size: int = 1) -> tuple[torch.Tensor, dict]:
    """The part of the mini-batch loss one micro-batch contributes, ready for backward.

    Args:
        logits: (B, L, V) the training forward's logits over `mb.input_ids`.
        denominator: D of `loss_weights`, summed over every micro-batch of the mini-batch on every rank.
        world_size: DDP and FSDP *average* gradients over ranks, so each rank's part is scaled by it.
    Returns:
        (loss: scalar with grad = sum(w * l) * world_size / D, stats: sums to all-reduce: "loss" (this
        part of the mini-batch loss, without the world_size factor), "pg_loss", "kl", "tokens",
        "clipped", "dual", "entropy", "ratio" (token sums over the loss tokens)).
    Only the N tokens of `mb.loss_mask` are scored (a (N, V) slice of the logits: no float32 copy of
    the prompt's logits); everything else -- prompt, padding, and the injected tokens unless
    train_injected -- gets no gradient.
    """
    sel = mb.loss_mask.bool()                                        # (B, L-1)
    w = loss_weights(mb.loss_mask, cfg.loss_agg_mode, cfg.max_new_tokens)[0][sel]   # (N,)
    logits = logits[:, :-1][sel]                                     # (N, V)
    logprobs = token_logprobs(logits, mb.input_ids[:, 1:][sel], cfg.temperature)
    old, adv = mb.old_logprobs[sel], mb.advantages.expand_as(mb.loss_mask)[sel]
    pg, clipped, dual = policy_loss(logprobs, old, adv, cfg.clip_ratio_low, clip_ratio_high, cfg.clip_ratio_c)
    loss_tok, kl = pg, None
    if mb.ref_logprobs is not None and (cfg.kl_coef or 0) > 0:
        kl = kl_penalty(logprobs, mb.ref_logprobs[sel], cfg.kl_estimator)
        loss_tok = pg + cfg.kl_coef * kl
    d = max(denominator, 1e-12)
    part = (w * loss_tok).sum() / d
    with torch.no_grad():
        t = cfg.temperature if cfg.temperature > 0 else 1.0
        stats = {"loss": part.item(), "pg_loss": ((w * pg).sum() / d).item(),
                 "kl": 0.0 if kl is None else kl.sum().item(), "tokens": float(sel.sum()),
                 "clipped": clipped.sum().item(), "dual": dual.sum().item(),
                 "entropy": entropy_from_logits(logits / t).sum().item(),
                 "ratio": torch.exp((logprobs - old).clamp(-20, 20)).sum().item()}
    return part * world_size, stats


# ----------------------------------------------------------------------------------------------------
# One policy update on a given list of rollouts


def _all_reduce(values: list[float], device, op: str = "sum") -> list[float]:
    """Element-wise "sum" or "max" of a list of numbers over ranks, in one collective (sft.all_reduce
    does one number); the list itself for one process."""
    if not dist.is_initialized():
        return [float(v) for v in values]
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return t.tolist()


def ppo_update(model, optimizer, rollouts: list[Rollout], advantages, cfg: GRPOConfig, *, tags: TagIds,
               pad_id: int, scheduler=None, ref_model=None, clip_ratio_high: float | None = None,
               world_size: int = 1, device: torch.device | None = None) -> dict:
    """`cfg.ppo_mini_batches` optimizer steps of the PPO-clip loss on this rank's `rollouts`.

    Args:
        model: the training model: plain, DDP- or FSDP-wrapped (every rank calls with its own rollouts).
        optimizer, scheduler: stepped once per mini-batch (scheduler optional).
        rollouts: this rank's `sample.Rollout`s (any number, also 0); advantages: one per rollout.
        cfg: uses ppo_mini_batches, micro_batch_size, micro_batch_tokens, temperature, clip ratios,
            loss_agg_mode, max_new_tokens, kl_coef/kl_estimator, train_injected, recompute_logprobs,
            grad_clip, mode.
        tags, pad_id: of the tokenizer.
        ref_model: frozen reference for the KL term (only used when cfg.kl_coef > 0).
        clip_ratio_high: this step's (the recipe's stage); default cfg.clip_ratio_high or 0.2.
    Returns:
        global statistics: loss (mean over mini-batches), pg_loss, kl, clip_frac, dual_clip_frac,
        entropy, ratio_mean (token means), grad_norm (mean over mini-batches, before clipping),
        loss_tokens, optimizer_steps, micro_batches (per rank, incl. padding), and
        logprob_max_diff when logp_old was recomputed.

    Every rank runs the same number of forwards and backwards: the micro-batch count of each
    mini-batch is the maximum over ranks, and a rank with fewer pads with empty micro-batches.
    The 1-process run on the union of the ranks' rollouts (mini-batch k = the union of every rank's
    k-th slice) gives the same weights (tests/test_grpo.py).
    """
    device = device or next(model.parameters()).device
    mode = cfg.mode or RECIPE_MODE[cfg.recipe]            # also for a config that skipped resolve_defaults
    high = next(x for x in (clip_ratio_high, cfg.clip_ratio_high, 0.2) if x is not None)
    advantages = torch.as_tensor(advantages, dtype=torch.float32).flatten()
    if len(advantages) != len(rollouts):
        raise ValueError(f"{len(rollouts)} rollouts but {len(advantages)} advantages")
    lengths = [len(r.prompt_ids) + len(r.response_ids) for r in rollouts]
    plan = plan_micro_batches(lengths, cfg.ppo_mini_batches, cfg.micro_batch_size or max(len(rollouts), 1),
                              cfg.micro_batch_tokens)
    counts = _all_reduce([float(len(m)) for m in plan], device, op="max")
    minis = []
    for micro, count in zip(plan, counts):
        batches = [collate_rollouts([rollouts[i] for i in idx], advantages[idx], pad_id, cfg.train_injected)
                   for idx in micro]
        batches += [_empty_batch(pad_id) for _ in range(int(count) - len(micro))]
        minis.append([b.to(device) for b in batches])

    # logp_old of injected tokens (train_injected), the debug check, and the reference: one forward
    # without grad over everything, before the first optimizer step changes the weights.
    max_diff = None
    want_ref = ref_model is not None and (cfg.kl_coef or 0) > 0
    if cfg.train_injected or cfg.recompute_logprobs or want_ref:
        max_diff = 0.0
        with torch.no_grad():
            for mb in (mb for mini in minis for mb in mini):
                if cfg.train_injected or cfg.recompute_logprobs:
                    lp = token_logprobs(policy_logits(model, mb, tags, mode)[:, :-1], mb.input_ids[:, 1:],
                                        cfg.temperature)
                    diff = ((lp - mb.old_logprobs).abs() * mb.sampled_mask).max().item() if lp.numel() else 0.0
                    max_diff = max(max_diff, diff)
                    injected = (mb.response_mask - mb.sampled_mask).bool()
                    mb.old_logprobs = torch.where(injected, lp, mb.old_logprobs)
                if want_ref:
                    mb.ref_logprobs = token_logprobs(policy_logits(ref_model, mb, tags, mode)[:, :-1],
                                                     mb.input_ids[:, 1:], cfg.temperature)
        max_diff = _all_reduce([max_diff], device, op="max")[0]

    model.train()
    sums = dict.fromkeys(("loss", "pg_loss", "kl", "tokens", "clipped", "dual", "entropy", "ratio"), 0.0)
    grad_norms, steps = [], 0
    for mini in minis:
        local_d = sum(loss_weights(mb.loss_mask, cfg.loss_agg_mode, cfg.max_new_tokens)[1] for mb in mini)
        denominator = _all_reduce([local_d], device)[0]
        if denominator == 0:                       # nothing to learn from on any rank: every rank skips
            continue
        for j, mb in enumerate(mini):
            with grad_sync(model, enabled=j == len(mini) - 1):
                logits = policy_logits(model, mb, tags, mode)
                loss, st = micro_batch_loss(logits, mb, cfg, high, denominator, world_size)
                loss.backward()
            for k in sums:
                sums[k] += st[k]
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(),
                                                   cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
        if hasattr(grad_norm, "full_tensor"):      # FSDP2: a DTensor
            grad_norm = grad_norm.full_tensor()
        grad_norms.append(grad_norm.item())
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        steps += 1
    g = dict(zip(sums, _all_reduce(list(sums.values()), device)))
    tokens = max(g["tokens"], 1.0)
    return {"loss": g["loss"] / max(steps, 1), "pg_loss": g["pg_loss"] / max(steps, 1),
            "kl": g["kl"] / tokens, "clip_frac": g["clipped"] / tokens, "dual_clip_frac": g["dual"] / tokens,
            "entropy": g["entropy"] / tokens, "ratio_mean": g["ratio"] / tokens,
            "grad_norm": sum(grad_norms) / len(grad_norms) if grad_norms else 0.0,
            "loss_tokens": int(g["tokens"]), "optimizer_steps": steps,
            "micro_batches": sum(len(m) for m in minis),
            **({"logprob_max_diff": max_diff} if max_diff is not None else {})}


# ----------------------------------------------------------------------------------------------------
# Sampling and scoring one step


def sync_rollout_model(rollout_model, train_model):
    """FSDP: copy the full (all-gathered) weights of the sharded training model into the plain copy the
    sampler runs on. Every rank must call it (one all-gather per parameter)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    full = get_model_state_dict(train_model, options=StateDictOptions(full_state_dict=True))
    rollout_model.load_state_dict(full)


def sample_rollouts(model, tokenizer, prompts: list[list[int]], cfg: GRPOConfig, seed: int) -> list[Rollout]:
    """`cfg.group_size` rollouts per prompt in the model's mode, prompt-major, in chunks of
    `cfg.generate_batch_size` prompts (chunk c sampled with seed + c)."""
    chunk = cfg.generate_batch_size or len(prompts)
    out = []
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    for c, start in enumerate(range(0, len(prompts), chunk)):
        with autocast(device):
            rs = generate(model, tokenizer, prompts[start:start + chunk], group_size=cfg.group_size, mode=cfg.mode,
                          max_new_tokens=cfg.max_new_tokens, num_paths=cfg.num_paths, max_blocks=cfg.max_blocks,
                          allow_parallel=cfg.mode != "sequential", temperature=cfg.temperature, top_p=cfg.top_p,
                          top_k=cfg.top_k, seed=seed + c)
        for r in rs:
            r.prompt_index += start
        out += rs
    model.train(was_training)
    return out


def rollout_stats(rollouts: list[Rollout], scores: list[dict], has_variance: torch.Tensor, device) -> dict:
    """Global (all-reduced) means of the step's rollouts: reward, accuracy, format, parallel behaviour,
    lengths, and the share of groups whose rewards differ (the only ones with a gradient)."""
    positions = [p for r in rollouts for p in parallel_positions(r.structure)]
    local = {"n": len(rollouts), "reward": sum(s["reward"] for s in scores),
             "reward_sq": sum(s["reward"] ** 2 for s in scores), "correct": sum(bool(s["correct"]) for s in scores),
             "valid": sum(r.structure.valid for r in rollouts), "parallel": sum(bool(r.structure.blocks) for r in rollouts),
             "blocks": sum(len(r.structure.blocks) for r in rollouts), "T": sum(r.num_tokens for r in rollouts),
             "D": sum(r.critical_path for r in rollouts), "truncated": sum(r.finish_reason == "budget" for r in rollouts),
             "varied_groups": int(has_variance.sum()), "groups": len(has_variance),
             "position": sum(positions), "blocks_seen": len(positions)}
    g = dict(zip(local, _all_reduce([float(v) for v in local.values()], device)))
    n = max(g["n"], 1.0)
    mean = g["reward"] / n
    return {"reward_mean": mean, "reward_std": math.sqrt(max(g["reward_sq"] / n - mean ** 2, 0.0)),
            "accuracy": g["correct"] / n, "format_valid": g["valid"] / n, "parallel_ratio": g["parallel"] / n,
            "num_blocks": g["blocks"] / n, "response_T": g["T"] / n, "response_D": g["D"] / n,
            "truncated": g["truncated"] / n, "groups_with_variance": g["varied_groups"] / max(g["groups"], 1.0),
            "parallel_position": g["position"] / g["blocks_seen"] if g["blocks_seen"] else None}


# ----------------------------------------------------------------------------------------------------
# The training run


def _eval_samples(model, tokenizer, records, cfg: GRPOConfig) -> list[dict]:
    """eval.evaluate's per-response samples on `records` (k = cfg.eval_k each, T = cfg.eval_temperature,
    seed fixed), for the held-out curve; [] for no records."""
    from eval import evaluate
    if not records:
        return []
    with autocast(next(model.parameters()).device):
        _, samples = evaluate(model, tokenizer, records, cfg.mode, k=cfg.eval_k, max_new_tokens=cfg.max_new_tokens,
                              temperature=cfg.eval_temperature, top_p=cfg.top_p, seed=cfg.seed,
                              batch_size=max(1, 128 // cfg.eval_k),
                              prompt_style="sequential" if cfg.mode == "sequential" else "parallel",
                              prompt_file=cfg.prompt_file or None, num_paths=cfg.num_paths, max_blocks=cfg.max_blocks)
    return samples


EVAL_KEYS = ("mean_at_k", "pass_at_k", "format_valid", "parallel_ratio", "mean_blocks", "mean_parallel_position",
             "mean_T", "mean_D")


def train(cfg: GRPOConfig, records: list[dict] | None = None, eval_records: list[dict] | None = None) -> dict:
    """Run GRPO as configured (one process, or one rank under torchrun); return a summary dict
    {"checkpoint", "steps", "seconds", "eval_before", "eval_after", "log"} (evals on rank 0 only).

    `records` / `eval_records` (data.load_data-style dicts) replace cfg.data / cfg.eval_data when
    given (tests, notebooks). Raises FileNotFoundError when there is no checkpoint to start from or to
    resume (with the command that writes one), ValueError for a bad config.
    """
    dist_info = setup_distributed()
    try:
        return _train(cfg, records, eval_records, dist_info)
    finally:
        teardown_distributed()


def _train(cfg: GRPOConfig, records, eval_records, dist_info: DistInfo) -> dict:
    from tqdm import tqdm

    log = print if dist_info.is_main else (lambda *a, **k: None)
    device, world, rank = dist_info.device, dist_info.world_size, dist_info.rank
    torch.manual_seed(cfg.seed)
    resolve_defaults(cfg, tiny=True, world_size=world, warn=False)   # bad values fail before any file is read

    # --- model: the starting checkpoint, or the one we resume from. fp32 master weights always.
    resume_path = ""
    if cfg.resume:
        resume_path = find_latest_checkpoint(cfg.out_dir) if cfg.resume.lower() == "true" else cfg.resume
        if not os.path.isfile(os.path.join(resume_path, "trainer_state.pt")):
            raise FileNotFoundError(f"--resume={cfg.resume!r}: {resume_path!r} is not a checkpoint folder with a "
                                    "trainer_state.pt (written by grpo.py)")
    init = default_init(cfg.mode or RECIPE_MODE.get(cfg.recipe, "unseen"), cfg.model)
    model, tokenizer = load_model(resume_path or init, dtype=torch.float32, device=device, seed=cfg.seed)
    cfg = resolve_defaults(dataclasses.replace(cfg, model=init), tiny=len(tokenizer) < TINY_VOCAB_LIMIT,
                           world_size=world)
    tags = TagIds.from_tokenizer(tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tags.eos
    style = "sequential" if cfg.mode == "sequential" else "parallel"
    from eval import mode_from_config, read_checkpoint_config, split_by_context
    init_mode = mode_from_config(read_checkpoint_config(init)[0])
    if init_mode and init_mode != cfg.mode:
        log(f"warning: {init} was trained in mode {init_mode!r}, this run samples and trains in {cfg.mode!r}")

    # --- data: one prompt stream per data source the recipe uses
    data_given = records
    if records is None:
        records = load_data(cfg.data, style=style, seed=cfg.seed)
    sources = {"train": records}
    if cfg.recipe == "seen" and (cfg.easy_steps or 0) > 0:
        sources["easy"] = load_data(cfg.easy_data, style=style, seed=cfg.seed)
    prompts = {k: [encode_prompt(tokenizer, r["problem"], style, cfg.prompt_file or None) for r in v]
               for k, v in sources.items()}
    if eval_records is None and cfg.eval_data:       # every rank: each evaluates a shard
        eval_records = load_data(cfg.eval_data, style=style, limit=cfg.eval_samples or None, seed=cfg.seed + 1)
    # a prompt that leaves no room for max_new_tokens inside the model's context would be sampled past
    # the last position the model was trained on: those problems are dropped, and counted
    context = getattr(model.config, "max_position_embeddings", None)
    for k in list(sources):
        fit, long = split_by_context([len(p) for p in prompts[k]], cfg.max_new_tokens, context)
        if long:
            log(f"{k} data: dropped {len(long)} of {len(fit) + len(long)} problems whose prompt + --max_new_tokens="
                f"{cfg.max_new_tokens} exceed the model's context of {context} tokens")
        if not fit:
            raise ValueError(f"no {k} problem fits the model's context of {context} tokens with --max_new_tokens="
                             f"{cfg.max_new_tokens}: lower --max_new_tokens or use a model with a longer context")
        sources[k], prompts[k] = [sources[k][i] for i in fit], [prompts[k][i] for i in fit]
    eval_records = eval_records or []
    eval_lengths = [len(encode_prompt(tokenizer, r["problem"], style, cfg.prompt_file or None)) for r in eval_records]
    fit, long = split_by_context(eval_lengths, cfg.max_new_tokens, context)
    if long:
        log(f"eval data: dropped {len(long)} of {len(eval_records)} problems that do not fit the context")
    eval_records = [eval_records[i] for i in fit]                # eval_samples: per part of the spec

    # --- reference model (KL), wrappers, optimizer
    ref_model = copy.deepcopy(model).eval().requires_grad_(False) if cfg.kl_coef > 0 else None
    if ref_model is not None and resume_path:
        ref_model, _ = load_model(init, dtype=torch.float32, device=device)
        ref_model.requires_grad_(False)
    if cfg.grad_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    rollout_model = model                              # what the sampler and the evaluation run on
    if cfg.fsdp:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        rollout_model = copy.deepcopy(model).eval()
        if device.type == "cuda":
            rollout_model.to(torch.bfloat16)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
            if device.type == "cuda" else MixedPrecisionPolicy()
        for layer in model.model.layers:
            fully_shard(layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        train_model = model
    elif world > 1:
        train_model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    else:
        train_model = model
    optimizer = build_optimizer(train_model, cfg.lr, cfg.weight_decay, cfg.betas)
    total = cfg.max_steps * cfg.ppo_mini_batches           # optimizer steps of the whole run
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, cfg.warmup_steps, total, cfg.lr_schedule))

    step, positions, rng, eval_before = 0, {}, None, None
    if resume_path:
        state = load_training_state(resume_path, train_model, optimizer, scheduler, fsdp=cfg.fsdp)
        step, positions, rng, eval_before = state["step"], state["data_position"], state["rng"], state.get("eval_before")
        log(f"resumed from {resume_path} at step {step}")
        saved_max = state.get("config", {}).get("max_steps", cfg.max_steps)
        if cfg.lr_schedule == "cosine" and saved_max != cfg.max_steps:
            log(f"note: the cosine lr schedule now ends at step {cfg.max_steps}, not {saved_max}: the lr "
                f"jumps from the old curve to the new one (use --lr_schedule=constant to train further flat)")
    streams = {k: ShuffledStream(len(v), cfg.seed + i, **positions.get(k, {}))
               for i, (k, v) in enumerate(sources.items())}

    if dist_info.is_main:
        os.makedirs(cfg.out_dir, exist_ok=True)
        if not resume_path:
            for p in glob.glob(os.path.join(cfg.out_dir, "checkpoint-*")):
                shutil.rmtree(p, ignore_errors=True)
        log_file = open(os.path.join(cfg.out_dir, "log.jsonl"), "a" if resume_path else "w")
    per_rank = cfg.batch_size // world
    log(f"GRPO recipe {cfg.recipe} (mode {cfg.mode}) from {init}: {len(sources['train'])} problems of "
        f"{cfg.data if data_given is None else 'the given records'}, "
        f"{cfg.batch_size} prompts x {cfg.group_size} per step on {world} rank(s) ({device.type}), "
        f"lr {cfg.lr}, {cfg.ppo_mini_batches} mini-batch(es), max_new_tokens {cfg.max_new_tokens}"
        + (f", max_time {cfg.max_time:.0f}s" if cfg.max_time else ""))

    def evaluate_now(tag: str) -> dict:
        """Every rank samples its shard of the held-out problems (FSDP: on the full rollout copy);
        rank 0 pools the samples and summarises them. The same metrics come back on every rank."""
        t0 = time.time()
        samples = _eval_samples(rollout_model, tokenizer, eval_records[rank::world], cfg)
        if dist.is_initialized():
            shards = [None] * world
            dist.all_gather_object(shards, samples)
            samples = [s for shard in shards for s in shard]
        from eval import summarize
        by_bench: dict[str, list] = {}
        for s in samples:                                # one benchmark per data source (difficulty)
            by_bench.setdefault(s["benchmark"] or "held_out", []).append(s)
        metrics = {b: {k: summarize(ss, cfg.eval_k).get(k) for k in EVAL_KEYS} for b, ss in by_bench.items()}
        avg = sum(m["mean_at_k"] for m in metrics.values()) / len(metrics)
        for b, m in metrics.items():
            log(f"[eval {tag}] {b}: " + _format_eval(m, cfg.eval_k))
        log(f"[eval {tag}] Avg Mean@{cfg.eval_k} {100 * avg:.1f}% ({time.time() - t0:.0f}s)")
        write({"step": step, "eval/avg_mean_at_k": avg,
               **{f"eval/{b}/{k}": v for b, m in metrics.items() for k, v in m.items()}})
        return {"avg_mean_at_k": avg, "benchmarks": metrics}

    def write(row: dict):
        if dist_info.is_main:
            log_file.write(json.dumps(row) + "\n")
            log_file.flush()

    t_start = time.time()
    eval_settings = [cfg.eval_data, cfg.eval_samples, cfg.eval_k, cfg.eval_temperature, cfg.max_new_tokens]
    if eval_before and eval_before.get("settings", eval_settings) != eval_settings:
        log(f"note: the run's first evaluation used other settings {eval_before['settings']} (eval_data, "
            f"eval_samples, eval_k, eval_temperature, max_new_tokens) than now {eval_settings}: the end "
            "summary shows no before/after table")
        eval_before = {}                                 # falsy: neither re-evaluated nor compared
    if eval_before is None and eval_records:
        eval_before = {**evaluate_now("before"), "settings": eval_settings}
    if rng is not None:
        set_rng_state(rng)
    bar = tqdm(total=cfg.max_steps, initial=step, disable=not dist_info.is_main, dynamic_ncols=True, desc="grpo")
    ckpt, eval_last, last_row = None, None, {}
    while step < cfg.max_steps:
        step += 1
        stage = stage_at(cfg, step)
        t0 = time.time()
        # --- sample: this rank's share of the step's prompts
        idx = streams[stage.data].take(cfg.batch_size)[rank * per_rank:(rank + 1) * per_rank]
        recs = [sources[stage.data][i] for i in idx]
        if cfg.fsdp:
            sync_rollout_model(rollout_model, train_model)
        seed = (cfg.seed * 1_000_003 + step) * 4096 + rank
        rollouts = sample_rollouts(rollout_model, tokenizer, [prompts[stage.data][i] for i in idx], cfg, seed)
        t1 = time.time()
        # --- rewards and advantages
        scores = score_batch([r.text for r in rollouts], [recs[r.prompt_index]["answer"] for r in rollouts],
                             structures=[r.structure for r in rollouts], reward=stage.reward, step=step)
        rewards = [s["reward"] for s in scores]
        advantages, has_variance = compute_advantages(rewards, cfg.group_size, cfg.norm_adv_by_std)
        t2 = time.time()
        train_rollouts, train_adv = rollouts, advantages
        if cfg.filter_groups:
            keep = has_variance.repeat_interleave(cfg.group_size)
            train_rollouts = [r for r, k in zip(rollouts, keep.tolist()) if k]
            train_adv = advantages[keep]
        # --- update
        upd = ppo_update(train_model, optimizer, train_rollouts, train_adv, cfg, tags=tags, pad_id=pad_id,
                         scheduler=scheduler, ref_model=ref_model, clip_ratio_high=stage.clip_ratio_high,
                         world_size=world, device=device)
        t3 = time.time()
        adv_abs = _all_reduce([advantages.abs().sum().item(), float(len(advantages)), float(len(train_rollouts))], device)
        row = {"step": step, "reward_kind": scores[0]["kind"] if scores else stage.reward.kind_at(step),
               **rollout_stats(rollouts, scores, has_variance, device),
               "adv_abs_mean": adv_abs[0] / max(adv_abs[1], 1.0), "rollouts_trained": int(adv_abs[2]), **upd,
               "lr": optimizer.param_groups[0]["lr"], "clip_ratio_high": stage.clip_ratio_high,
               "time_sample": t1 - t0, "time_reward": t2 - t1, "time_update": t3 - t2,
               "elapsed": time.time() - t_start}
        last_row = row
        write(row)
        if dist_info.is_main:
            bar.update(1)
            bar.set_postfix(reward=f"{row['reward_mean']:+.2f}", acc=f"{row['accuracy']:.2f}",
                            var=f"{row['groups_with_variance']:.2f}")
            if cfg.log_every and step % cfg.log_every == 0:
                bar.write(f"step {step}: reward {row['reward_mean']:+.3f} acc {row['accuracy']:.3f} "
                          f"format {row['format_valid']:.2f} parallel {row['parallel_ratio']:.2f} "
                          f"groups w/ variance {row['groups_with_variance']:.2f} loss {row['loss']:+.4f} "
                          f"clip {row['clip_frac']:.3f} entropy {row['entropy']:.3f} grad {row['grad_norm']:.3f} "
                          f"| {row['time_sample']:.1f}s sample, {row['time_reward']:.1f}s reward, "
                          f"{row['time_update']:.1f}s update")
        # every rank takes the same stop decision (rank 0's clock) or the collectives would hang
        elapsed = time.time() - t_start
        out_of_time = bool(cfg.max_time) and _all_reduce([float(elapsed > cfg.max_time)], device, op="max")[0] > 0
        last = step == cfg.max_steps or out_of_time
        if eval_records and cfg.eval_every and step % cfg.eval_every == 0 and not last:
            if cfg.fsdp:
                sync_rollout_model(rollout_model, train_model)
            evaluate_now(f"step {step}")
        if last or (cfg.save_every and step % cfg.save_every == 0):
            state = {"step": step, "data_position": {k: s.position() for k, s in streams.items()},
                     "config": dataclasses.asdict(cfg), "mode": cfg.mode, "recipe": cfg.recipe,
                     "eval_before": eval_before}
            ckpt = save_training_checkpoint(os.path.join(cfg.out_dir, f"checkpoint-{step}"), train_model,
                                            tokenizer, optimizer, scheduler, state, dist_info, fsdp=cfg.fsdp)
            if dist_info.is_main:
                prune_checkpoints(cfg.out_dir, cfg.keep_last)
        if last:
            break
    bar.close()
    if eval_records:
        if cfg.fsdp:
            sync_rollout_model(rollout_model, train_model)
        eval_last = evaluate_now("after")
    seconds = time.time() - t_start
    summary = {"checkpoint": ckpt, "steps": step, "seconds": seconds, "eval_before": eval_before,
               "eval_after": eval_last, "last_step": last_row, "log": os.path.join(cfg.out_dir, "log.jsonl")}
    if dist_info.is_main:
        log_file.close()
        print_summary(summary, cfg)
    return summary


def _format_eval(m: dict, k: int) -> str:
    pct = lambda x: "n/a" if x is None else f"{100 * x:.1f}%"
    num = lambda x: "n/a" if x is None else f"{x:.2f}"
    return (f"Mean@{k} {pct(m['mean_at_k'])}  Pass@{k} {pct(m['pass_at_k'])}  format valid {pct(m['format_valid'])}"
            f"  parallel {pct(m['parallel_ratio'])}  blocks {num(m['mean_blocks'])}  "
            f"<Parallel> at {num(m['mean_parallel_position'])}  T {num(m['mean_T'])}  D {num(m['mean_D'])}")


def print_summary(summary: dict, cfg: GRPOConfig):
    """The end-of-run report: the held-out metrics before and after training, where things are."""
    s = summary
    print("\n" + "=" * 78)
    stop = (f"stopped by --max_time={cfg.max_time:.0f}s before --max_steps={cfg.max_steps}"
            if cfg.max_time and s["steps"] < cfg.max_steps else f"--max_steps={cfg.max_steps}")
    print(f"GRPO done: {s['steps']} steps in {s['seconds']:.0f}s, {stop} (recipe {cfg.recipe}, mode {cfg.mode})")
    b, a = s.get("eval_before"), s.get("eval_after")
    if b and a:
        k = cfg.eval_k
        print(f"held-out {cfg.eval_data}, {cfg.eval_samples or 'all'} problems each x {k} samples at "
              f"T={cfg.eval_temperature} (Mean@{k} and parallel ratio, %):")
        print(f"  {'':28}{'before':>10}{'after':>10}")
        for bench in a["benchmarks"]:
            for key, label in (("mean_at_k", f"Mean@{k}"), ("parallel_ratio", "parallel")):
                x, y = b["benchmarks"].get(bench, {}).get(key), a["benchmarks"][bench][key]
                f = lambda v: "n/a" if v is None else f"{100 * v:.1f}"
                print(f"  {bench + ' ' + label:28}{f(x):>10}{f(y):>10}")
        print(f"  {'Avg Mean@' + str(k):28}{100 * b['avg_mean_at_k']:>10.1f}{100 * a['avg_mean_at_k']:>10.1f}")
    print(f"checkpoint: {s['checkpoint']}    (eval: python eval.py --model={s['checkpoint']})")
    print(f"log: {s['log']}    (curves: python eval.py --plot={cfg.out_dir})")
    print("=" * 78)


def main(argv: list[str] | None = None) -> dict:
    """Parse `--key=value` arguments and train. With --resume, the config saved in the checkpoint is
    the base and the command line overrides it (e.g. --max_steps to train further)."""
    argv = sys.argv[1:] if argv is None else argv
    return train(parse_config_with_resume(GRPOConfig, argv))


if __name__ == "__main__":
    try:
        main()
    except (OSError, ValueError) as e:                # bad input: the message says what to do
        sys.exit(f"grpo.py: error: {e}")
