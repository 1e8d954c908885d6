"""GRPO: reinforcement learning of parallel thinking (NOTES.md §5, §6).

    python grpo.py                                     # tiny model from runs/sft: 100 steps, ~9 min on 2 cores
    python grpo.py --recipe=unseen-s2 --max_steps=50   # any config field: --key=value or --key value
    python grpo.py --resume=True                       # continue the latest checkpoint in out_dir, exactly
    torchrun --nproc_per_node=8 grpo.py --recipe=unseen-s2 --model=runs/sft_qwen3_4b/checkpoint-230 --data=dapo \\
        --fsdp=True --grad_checkpointing=True --out_dir=runs/grpo_qwen3_4b_s2      # the paper's S2 run

One step of `train`: draw prompts -> `sample_rollouts` -> `score_batch` (the recipe's reward at this step,
`stage_at`) -> `compute_advantages` -> `ppo_update` (ppo_mini_batches optimizer steps of the PPO-clip loss, plus
kl_coef times a KL estimate against the initial weights) -> log, evaluate, save. Unlike the official code, on purpose
(NOTES.md §8): logp_old is the sampler's own log-prob (the ratio is 1 on-policy and a forward is saved;
--recompute_logprobs=True checks it), injected tokens are not trained (--train_injected=True trains them), the loss
is normalised per mini-batch. Every rank runs as many micro-batches (empty ones pad), so collectives never hang.
"""
import copy
import dataclasses
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Literal

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # idle OpenMP threads sleep (sft.py)

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from tqdm import tqdm

import config
import sft
from attention import TagIds
from data import TINY_VOCAB_LIMIT, load_data
from eval import evaluate, fit_context, own_tokenizer, summarize
from model import Mode, load_model, mode_from_config, read_checkpoint_config
from rewards import RewardSchedule, parallel_positions, score_batch
from sample import Rollout, check_sampling, generate, token_logprobs

RECIPE_MODE = {"seen": "seen", "unseen-s1": "unseen", "unseen-s2": "unseen", "scaffold": "unseen",
               "baseline": "sequential"}
DEFAULT_INIT = {   # where each mode's SFT checkpoint is, and the command that writes it
    "unseen": ("runs/sft", "python sft.py"),
    "seen": ("runs/sft_seen", "python sft.py --mode=seen --out_dir=runs/sft_seen"),
    "sequential": ("runs/sft_sequential", "python sft.py --style=sequential --mode=seen --out_dir=runs/sft_sequential")}

@dataclass
class GRPOConfig:
    """python grpo.py: GRPO of parallel thinking. None = the preset of the model (TINY or PAPER below)."""
    recipe: Literal["seen", "unseen-s1", "unseen-s2", "scaffold", "baseline"] = "unseen-s1"
    model: str = ""                      # "" = the latest SFT checkpoint of the recipe's mode (DEFAULT_INIT)
    mode: Mode | None = None             # None = the recipe's
    data: str | None = None              # a data.load_data spec of training problems
    easy_data: str | None = None         # recipe "seen": the easy-RL stage's problems
    prompt_file: str = ""                # a prompt template for data.build_prompt ("" = its default)
    out_dir: str = "runs/grpo"
    batch_size: int | None = None        # prompts per step, over all ranks
    group_size: int | None = None        # responses per prompt (G)
    max_new_tokens: int | None = None    # response budget per sample, paths and summaries included
    num_paths: int = 2
    max_blocks: int = 4
    temperature: float = 1.0             # sampling and training log-probs (the same T, so the ratio is exact)
    top_p: float = 1.0
    top_k: int = 0
    generate_batch_size: int | None = None  # prompts per sample.generate call (memory), 0 = all at once
    reward: Literal["accuracy", "parallel_gated", "tiered", "alternating", "scaffold"] | None = None  # None: recipe's
    easy_steps: int | None = None        # recipe "seen": steps of the easy-RL stage
    scaffold_steps: int | None = None    # recipe "scaffold": steps of S2 before accuracy only
    norm_adv_by_std: bool = True         # False = Dr. GRPO: A = r - mean(r)
    filter_groups: bool = False          # drop groups whose rewards are all equal (dynamic sampling, no refill)
    clip_ratio_low: float = 0.2
    clip_ratio_high: float | None = None  # None = the recipe's (0.2, or 0.28 for S2)
    clip_ratio_c: float = 3.0            # dual clip for negative advantages
    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "token-mean"
    kl_coef: float | None = None         # > 0 loads a frozen reference model (the initial weights); paper: 0
    kl_estimator: Literal["k1", "k3"] = "k3"   # k1 = log(p/p_ref); k3 = the low-variance, clamped estimator
    train_injected: bool = False         # also train on runtime-injected tokens (the official code)
    recompute_logprobs: bool = False     # debug: recompute logp_old with a forward, log the max difference
    lr: float | None = None
    warmup_steps: int | None = None      # linear warm-up in optimizer steps, then lr_schedule
    lr_schedule: Literal["constant", "cosine"] | None = None   # constant (the paper) or cosine (to 0 at max_steps)
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0               # max global grad norm; 0 = no clipping
    ppo_mini_batches: int = 2            # optimizer steps per training step (the rollouts cut in this many)
    micro_batch_size: int | None = None  # rollouts per forward on one rank
    micro_batch_tokens: int = 0          # also cap a micro-batch at this many padded tokens (0 = no cap)
    max_steps: int | None = None
    max_time: float | None = None        # seconds of training in this process (evals included); 0 = no limit
    seed: int = 0
    fsdp: bool = False                   # FSDP2 (fully_shard each decoder layer, then the root); under torchrun
    grad_checkpointing: bool = False
    resume: str = ""                     # a checkpoint folder, or True = the latest in out_dir
    eval_data: str | None = None         # held-out problems, one benchmark per data source; "" = no evaluation
    eval_every: int | None = None        # steps between evaluations (0 = only before and after)
    eval_samples: int | None = None      # the first this-many problems of each part of eval_data (0 = all)
    eval_k: int | None = None            # responses per problem (Mean@k, Pass@k)
    eval_temperature: float = 1.0        # the paper evaluates at T = 1.0, whatever T the rollouts use
    log_every: int = 10                  # print a line every N steps (log.jsonl gets every step)
    save_every: int = 50                 # checkpoint every N steps (0 = only at the end)
    keep_last: int = 2                   # checkpoints kept in out_dir (0 = all)
    wandb_project: str = ""              # also log log.jsonl's rows to this Weights & Biases project (needs wandb)

# The tiny preset: RL on the rl parts (number patterns the cold start never saw), 32 prompts x 4 responses a step
# (16 x 8, the same 128 rollouts over half the prompts, drifted 3x further from the SFT model), lr 1.5e-4 with a
# cosine to 0 after 10 warm-up optimizer steps (3e-4 drifted away on one seed of three), the k3 KL anchor keeps the
# format in place. The paper's: NOTES.md §5.
TINY = dict(data="synthetic:easy:rl,synthetic:medium:rl,synthetic:hard:rl",
            eval_data="synthetic:easy:test,synthetic:medium:test,synthetic:hard:test", easy_data="synthetic:easy",
            batch_size=32, group_size=4, max_new_tokens=128, lr=1.5e-4, warmup_steps=10, lr_schedule="cosine",
            kl_coef=0.3, micro_batch_size=16, generate_batch_size=0, max_steps=100, max_time=0.0, eval_every=50,
            eval_samples=64, eval_k=8, easy_steps=10, scaffold_steps=20)
PAPER = dict(data="dapo", eval_data="aime25", easy_data="gsm8k:train", batch_size=256, group_size=8,
             max_new_tokens=3000, lr=1e-6, warmup_steps=0, lr_schedule="constant", kl_coef=0.0, micro_batch_size=2,
             generate_batch_size=64, max_steps=300, max_time=0.0, eval_every=10, eval_samples=0, eval_k=16,
             easy_steps=35, scaffold_steps=200)

def resolve_defaults(cfg: GRPOConfig, tiny: bool, world_size: int = 1) -> GRPOConfig:
    cfg = config.fill(cfg, TINY if tiny else PAPER)
    config.at_least(cfg, 1, "batch_size", "group_size", "ppo_mini_batches", "micro_batch_size", "max_new_tokens",
                    "eval_k", "max_steps", "clip_ratio_c")      # the dual clip bounds a negative advantage's ratio at c
    config.at_least(cfg, 0, "generate_batch_size", "eval_samples", "clip_ratio_low", "clip_ratio_high", "kl_coef",
                    "grad_clip", "max_time", "eval_every", "log_every", "save_every", "keep_last", "micro_batch_tokens",
                    "warmup_steps", "easy_steps", "scaffold_steps", "weight_decay")
    config.at_least(cfg, 0, "lr", above=True)
    check_sampling(num_paths=cfg.num_paths, max_blocks=cfg.max_blocks, temperature=cfg.temperature, top_p=cfg.top_p,
                   top_k=cfg.top_k, eval_temperature=cfg.eval_temperature)
    if cfg.temperature == 0:
        raise ValueError("--temperature=0: GRPO compares the responses of a group, and greedy ones are all the same, "
                         "so every advantage is 0 and nothing is learned; use a temperature above 0 (the paper: 1.0)")
    if cfg.group_size == 1:
        raise ValueError("--group_size=1: a GRPO advantage compares responses to the same prompt, so with one "
                         "every advantage is 0 and nothing is learned; use 2 or more")
    if cfg.batch_size % world_size:
        raise ValueError(f"--batch_size={cfg.batch_size} prompts do not split evenly over {world_size} ranks")
    if cfg.ppo_mini_batches > cfg.batch_size * cfg.group_size // world_size:
        raise ValueError(f"--ppo_mini_batches={cfg.ppo_mini_batches} is more than the "
                         f"{cfg.batch_size * cfg.group_size // world_size} rollouts a rank has per step: some "
                         "optimizer steps would have no data")
    return dataclasses.replace(cfg, mode=cfg.mode or RECIPE_MODE[cfg.recipe])

def default_init(mode: str, model: str = "") -> str:
    """`model`, else the latest SFT checkpoint of the mode. FileNotFoundError names the command that writes it."""
    folder, command = DEFAULT_INIT[mode]
    try:
        return model or sft.find_latest_checkpoint(folder)
    except FileNotFoundError:
        raise FileNotFoundError(f"GRPO starts from an SFT checkpoint and there is none in {folder!r} (mode {mode!r}). "
                                f"Write it first with\n    {command}\n(about 4 minutes on 2 CPU cores for the tiny "
                                "model), or pass --model=<a checkpoint folder or hub name>.") from None

@dataclass(frozen=True)
class Stage:
    reward: RewardSchedule       # asked with the 1-based global step
    data: str                    # "train" or "easy": the prompt stream the step draws from
    clip_ratio_high: float

def stage_at(cfg: GRPOConfig, step: int) -> Stage:
    """The recipe's reward, data and upper clip ratio at 1-based step `step`; --reward and --clip_ratio_high win."""
    schedule, data, high, K = RewardSchedule("accuracy"), "train", 0.2, cfg.scaffold_steps or 0  # s1, baseline
    if cfg.recipe == "seen" and step <= (cfg.easy_steps or 0):
        schedule, data = RewardSchedule("parallel_gated"), "easy"
    elif cfg.recipe == "unseen-s2":
        schedule, high = RewardSchedule("alternating"), 0.28
    elif cfg.recipe == "scaffold":        # then a new S1 run in the official scripts: accuracy, clip 0.2/0.2
        schedule, high = RewardSchedule("scaffold", switch_step=K), 0.28 if step <= K else 0.2
    if cfg.reward:
        schedule = RewardSchedule(cfg.reward, switch_step=K)
    return Stage(schedule, data, cfg.clip_ratio_high if cfg.clip_ratio_high is not None else high)

# Advantages and the loss, token by token

def compute_advantages(rewards, group_size: int, norm_adv_by_std: bool = True, eps: float = 1e-6):
    """Group-relative advantages of prompt-major rewards (n,): (r - mean) / (std + eps) with the unbiased std (as
    the official code), or r - mean (Dr. GRPO). Returns (advantages (n,) float32, has_variance (n // G,) bool);
    a group of equal rewards gets exactly 0, never NaN (also for G = 1)."""
    # >>> exercise 6: group-relative advantages
    g = torch.as_tensor(rewards, dtype=torch.float32).flatten().view(-1, group_size)
    has_variance = g.max(dim=1).values > g.min(dim=1).values
    adv = g - g.mean(dim=1, keepdim=True)
    if norm_adv_by_std and group_size > 1:
        adv = adv / (g.std(dim=1, keepdim=True) + eps)
    return torch.where(has_variance[:, None], adv, torch.zeros_like(adv)).flatten(), has_variance
    # <<< exercise 6

def policy_loss(logprobs, old_logprobs, advantages, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2,
                clip_ratio_c: float = 3.0):
    """The PPO-clip loss per token (B, T): max(-A ratio, -A clip(ratio, 1 - low, 1 + high)), then at most -A c
    where A < 0 (dual clip); ratio = exp(clamp(logp - logp_old, ±20)). Also whether the clipped term was the
    larger (gradient 0) and whether the dual bound applied. advantages: (B, T) or (B, 1)."""
    # >>> exercise 5: the PPO-clip policy loss with clip-higher and dual clip
    ratio = torch.exp((logprobs - old_logprobs).clamp(-20.0, 20.0))   # clamped: a stale token cannot overflow
    advantages = advantages.expand_as(ratio)
    pg1, pg2 = -advantages * ratio, -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    clipped_loss, pg3, negative = torch.maximum(pg1, pg2), -advantages * clip_ratio_c, advantages < 0
    loss = torch.where(negative, torch.minimum(clipped_loss, pg3), clipped_loss)
    return loss, pg2 > pg1, negative & (clipped_loss > pg3)
    # <<< exercise 5

def kl_penalty(logprobs, ref_logprobs, estimator: str = "k3") -> torch.Tensor:
    """KL(pi || pi_ref) per token from samples of pi: k1 = logp - logp_ref (unbiased, may be < 0), or k3 =
    e^d - d - 1 with d = logp_ref - logp (unbiased, >= 0; d clamped to ±20, the value to ±10, as verl's)."""
    if estimator == "k1":
        return logprobs - ref_logprobs
    d = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    return (torch.exp(d) - d - 1.0).clamp(-10.0, 10.0)

def loss_weights(loss_mask: torch.Tensor, loss_agg_mode: str, max_new_tokens: int | None = None):
    """Weights w (B, T) and denominator D, loss = sum(w * l) / D (summed over micro-batches and ranks: the whole
    batch's). n_i = loss tokens of response i, N = responses with n_i > 0. token-mean: w = 1, D = sum n_i;
    seq-mean-token-mean: w = 1/n_i, D = N; seq-mean-token-sum-norm (Dr. GRPO): w = 1, D = N max_new_tokens."""
    # >>> exercise 6: the loss aggregation modes
    n = loss_mask.sum(dim=-1, keepdim=True)
    if loss_agg_mode == "token-mean":
        return loss_mask, float(n.sum())
    if loss_agg_mode == "seq-mean-token-mean":
        return loss_mask / n.clamp(min=1), float((n > 0).sum())
    return loss_mask, float((n > 0).sum()) * max_new_tokens     # seq-mean-token-sum-norm
    # <<< exercise 6

def agg_loss(loss_mat, loss_mask, loss_agg_mode: str = "token-mean", max_new_tokens: int | None = None):
    """sum(w * loss_mat) / D of one table (`loss_weights`); 0 when nothing is in the loss."""
    w, d = loss_weights(loss_mask, loss_agg_mode, max_new_tokens)
    return (w * loss_mat).sum() / max(d, 1e-12)

# Rollouts -> padded, target-aligned tables, and the loss of one micro-batch

@dataclass
class RolloutBatch:
    """Right-padded rollouts; the (B, L-1) tables are target-aligned: column t is about input_ids[:, t + 1]."""
    input_ids: torch.Tensor        # (B, L) long: prompt + response, right padding
    attention_mask: torch.Tensor   # (B, L) long: 1 on real tokens
    prompt_lengths: list[int]      # (B,)
    response_mask: torch.Tensor    # (B, L-1) float: the target is a response token
    sampled_mask: torch.Tensor     # (B, L-1) float: ... that the model sampled (not injected)
    loss_mask: torch.Tensor        # (B, L-1) float: ... that the loss trains on
    old_logprobs: torch.Tensor     # (B, L-1) float32: logp_old (the sampler's, or a forward's)
    advantages: torch.Tensor       # (B, 1) float32
    ref_logprobs: torch.Tensor | None = None   # (B, L-1) float32 when kl_coef > 0

def collate_rollouts(rollouts: list[Rollout], advantages, pad_id: int, train_injected: bool = False) -> RolloutBatch:
    """prompt [5, 6] + response [7, 8, 1], sampled [1, 0, 1] -> input_ids [5, 6, 7, 8, 1], response_mask
    [0, 1, 1, 1], sampled_mask [0, 1, 0, 1]; loss_mask = sampled_mask, or response_mask with train_injected."""
    padded = sft.collate(rollouts, pad_id)                # SFT's padding; its loss_mask[:, 1:]: response targets
    response_mask = padded.loss_mask[:, 1:].contiguous()
    sampled_mask, old_logprobs = torch.zeros_like(response_mask), torch.zeros_like(response_mask)
    for b, r in enumerate(rollouts):
        if not r.prompt_ids:   # its first response token would be predicted from nothing
            raise ValueError(f"rollout {b} (prompt_index {r.prompt_index}) has an empty prompt: it needs >= 1 token")
        p, n = len(r.prompt_ids), len(r.prompt_ids) + len(r.response_ids)
        sampled_mask[b, p - 1:n - 1] = torch.tensor(r.sampled_mask, dtype=torch.float32)
        old_logprobs[b, p - 1:n - 1] = torch.tensor(r.logprobs, dtype=torch.float32)
    return RolloutBatch(padded.input_ids, padded.attention_mask, padded.prompt_lengths, response_mask, sampled_mask,
                        (response_mask if train_injected else sampled_mask).clone(), old_logprobs,
                        torch.as_tensor(advantages, dtype=torch.float32).view(len(rollouts), 1))

def plan_micro_batches(lengths: list[int], ppo_mini_batches: int, micro_batch_size: int, micro_batch_tokens: int = 0):
    """Rollout indices in ppo_mini_batches contiguous near-equal mini-batches (whole groups when the sizes divide),
    each filled greedily into micro-batches of <= micro_batch_size rollouts and, with micro_batch_tokens, <= that
    many padded tokens (rows x longest): plan_micro_batches([4, 4, 9, 9], 1, 4, 16) -> [[[0, 1], [2], [3]]]."""
    bounds, plan = [round(i * len(lengths) / ppo_mini_batches) for i in range(ppo_mini_batches + 1)], []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        micro, cur, longest = [], [], 0
        for i in range(lo, hi):
            L = max(longest, lengths[i])
            if cur and (len(cur) == micro_batch_size or micro_batch_tokens and (len(cur) + 1) * L > micro_batch_tokens):
                micro, cur, L = micro + [cur], [], lengths[i]
            cur, longest = cur + [i], L
        plan.append(micro + [cur] if cur else micro)
    return plan

def micro_batch_loss(logits, mb: RolloutBatch, cfg: GRPOConfig, clip_ratio_high: float, denominator: float,
                     world_size: int = 1) -> tuple[torch.Tensor, dict]:
    """This micro-batch's part of the mini-batch loss, sum(w * l) * world_size / D (D over every micro-batch of
    every rank; the ranks' gradients are averaged), and the sums to all-reduce for the step's statistics."""
    sel = mb.loss_mask.bool()                                                       # (B, L-1)
    w = loss_weights(mb.loss_mask, cfg.loss_agg_mode, cfg.max_new_tokens)[0][sel]   # (N,)
    logits = logits[:, :-1][sel]                                                    # (N, V)
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
        z = (logits / (cfg.temperature if cfg.temperature > 0 else 1.0)).float()
        stats = {"loss": part.item(), "pg_loss": ((w * pg).sum() / d).item(), "tokens": float(sel.sum()),
                 "kl": 0.0 if kl is None else kl.sum().item(), "clipped": clipped.sum().item(),
                 "dual": dual.sum().item(),
                 "entropy": (torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)).sum().item(),
                 "ratio": torch.exp((logprobs - old).clamp(-20, 20)).sum().item()}
    return part * world_size, stats

# One policy update on a given list of rollouts

def mini_batches(rollouts: list[Rollout], advantages, cfg: GRPOConfig, pad_id: int, device) -> list[list[RolloutBatch]]:
    """This rank's mini-batches of micro-batches, each as long as the longest rank's (the others add one-row
    micro-batches with nothing in the loss), so every rank runs the same forwards and backwards."""
    plan = plan_micro_batches([len(r.prompt_ids) + len(r.response_ids) for r in rollouts], cfg.ppo_mini_batches,
                              cfg.micro_batch_size or max(len(rollouts), 1), cfg.micro_batch_tokens)
    z, minis = torch.zeros(1, 1), []
    empty = RolloutBatch(torch.full((1, 2), pad_id, dtype=torch.long), torch.ones(1, 2, dtype=torch.long), [1],
                         z, z.clone(), z.clone(), z.clone(), torch.zeros(1, 1))
    for micro, count in zip(plan, sft.all_reduce([len(m) for m in plan], device, op="max")):
        batches = [collate_rollouts([rollouts[i] for i in idx], advantages[idx], pad_id, cfg.train_injected)
                   for idx in micro] + [empty] * (int(count) - len(micro))
        minis.append([RolloutBatch(*(v.to(device) if torch.is_tensor(v) else v for v in vars(b).values()))
                      for b in batches])
    return minis

@torch.no_grad()
def recompute_logprobs(minis, model, ref_model, cfg: GRPOConfig, tags: TagIds, mode: str, device) -> float | None:
    """Before the first optimizer step: logp_old of the injected tokens (train_injected) and the largest difference
    to the sampler's (recompute_logprobs) from a forward; the reference log-probs (kl_coef > 0)."""
    want_ref = ref_model is not None and (cfg.kl_coef or 0) > 0
    if not (cfg.train_injected or cfg.recompute_logprobs or want_ref):
        return None
    max_diff = 0.0
    for mb in (mb for mini in minis for mb in mini):
        if cfg.train_injected or cfg.recompute_logprobs:
            lp = token_logprobs(sft.forward(model, mb, tags, mode)[:, :-1], mb.input_ids[:, 1:], cfg.temperature)
            diff = ((lp - mb.old_logprobs).abs() * mb.sampled_mask).max().item() if lp.numel() else 0.0
            max_diff = max(max_diff, diff)
            mb.old_logprobs = torch.where((mb.response_mask - mb.sampled_mask).bool(), lp, mb.old_logprobs)
        if want_ref:
            mb.ref_logprobs = token_logprobs(sft.forward(ref_model, mb, tags, mode)[:, :-1], mb.input_ids[:, 1:],
                                             cfg.temperature)
    return sft.all_reduce([max_diff], device, op="max")[0]

def ppo_update(model, optimizer, rollouts: list[Rollout], advantages, cfg: GRPOConfig, *, tags: TagIds, pad_id: int,
               scheduler=None, ref_model=None, clip_ratio_high: float | None = None, world_size: int = 1,
               device=None) -> dict:
    """cfg.ppo_mini_batches optimizer steps of the PPO-clip loss on this rank's rollouts (any number, also 0); model:
    plain, DDP- or FSDP-wrapped; clip_ratio_high: this step's (default cfg's, else 0.2). Global statistics: loss and
    pg_loss (means over mini-batches), kl, clip_frac, dual_clip_frac, entropy, ratio_mean (token means), counts."""
    device = device or next(model.parameters()).device
    mode = cfg.mode or RECIPE_MODE[cfg.recipe]            # also for a config that skipped resolve_defaults
    high = next(x for x in (clip_ratio_high, cfg.clip_ratio_high, 0.2) if x is not None)
    advantages = torch.as_tensor(advantages, dtype=torch.float32).flatten()
    minis = mini_batches(rollouts, advantages, cfg, pad_id, device)
    max_diff = recompute_logprobs(minis, model, ref_model, cfg, tags, mode, device)
    model.train()
    sums, grad_norms = dict.fromkeys(("loss", "pg_loss", "kl", "tokens", "clipped", "dual", "entropy", "ratio"), 0.), []
    for mini in minis:
        denominator = sft.all_reduce([sum(loss_weights(mb.loss_mask, cfg.loss_agg_mode, cfg.max_new_tokens)[1]
                                          for mb in mini)], device)[0]
        if denominator == 0:                       # nothing to learn from on any rank: every rank skips
            continue
        for j, mb in enumerate(mini):
            with sft.grad_sync(model, enabled=j == len(mini) - 1):
                loss, st = micro_batch_loss(sft.forward(model, mb, tags, mode), mb, cfg, high, denominator, world_size)
                loss.backward()
            sums = {k: v + st[k] for k, v in sums.items()}
        grad_norms.append(sft.optimizer_step(model, optimizer, scheduler, cfg.grad_clip))
    g = dict(zip(sums, sft.all_reduce(list(sums.values()), device)))
    tokens, steps = max(g["tokens"], 1.0), len(grad_norms)
    return {"loss": g["loss"] / max(steps, 1), "pg_loss": g["pg_loss"] / max(steps, 1), "kl": g["kl"] / tokens,
            "clip_frac": g["clipped"] / tokens, "dual_clip_frac": g["dual"] / tokens, "entropy": g["entropy"] / tokens,
            "ratio_mean": g["ratio"] / tokens, "grad_norm": sum(grad_norms) / steps if steps else 0.0,
            "loss_tokens": int(g["tokens"]), "optimizer_steps": steps, "micro_batches": sum(len(m) for m in minis),
            **({"logprob_max_diff": max_diff} if max_diff is not None else {})}

# Sampling, statistics, evaluation

def sync_rollout_model(rollout_model, train_model):
    """FSDP: the full (all-gathered) weights into the sampler's plain copy; every rank calls it."""
    rollout_model.load_state_dict(get_model_state_dict(train_model, options=StateDictOptions(full_state_dict=True)))

def sample_rollouts(model, tokenizer, prompts: list[list[int]], cfg: GRPOConfig, seed: int) -> list[Rollout]:
    """group_size rollouts per prompt, prompt-major, in chunks of generate_batch_size prompts (chunk c: seed + c)."""
    chunk, out, was_training = cfg.generate_batch_size or len(prompts), [], model.training
    model.eval()
    for c, start in enumerate(range(0, len(prompts), chunk)):
        with sft.autocast(next(model.parameters()).device):
            rs = generate(model, tokenizer, prompts[start:start + chunk], group_size=cfg.group_size, mode=cfg.mode,
                          max_new_tokens=cfg.max_new_tokens, num_paths=cfg.num_paths, max_blocks=cfg.max_blocks,
                          allow_parallel=cfg.mode != "sequential", temperature=cfg.temperature, top_p=cfg.top_p,
                          top_k=cfg.top_k, seed=seed + c)
        for r in rs:
            r.prompt_index += start
        out += rs
    model.train(was_training)
    return out

MEANS = ("accuracy", "format_valid", "parallel_ratio", "num_blocks", "response_T", "response_D", "truncated")

def rollout_stats(rollouts: list[Rollout], scores: list[dict], has_variance: torch.Tensor, device) -> dict:
    """Means over every rank's rollouts, and the share of groups whose rewards differ (the only ones to learn from)."""
    positions, st = [p for r in rollouts for p in parallel_positions(r.structure)], [r.structure for r in rollouts]
    rewards = [s["reward"] for s in scores]
    local = {"n": len(rollouts), "reward": sum(rewards), "reward_sq": sum(r ** 2 for r in rewards),
             "accuracy": sum(bool(s["correct"]) for s in scores), "format_valid": sum(s.valid for s in st),
             "parallel_ratio": sum(bool(s.blocks) for s in st), "num_blocks": sum(len(s.blocks) for s in st),
             "response_T": sum(r.num_tokens for r in rollouts), "response_D": sum(r.critical_path for r in rollouts),
             "truncated": sum(r.finish_reason == "budget" for r in rollouts), "varied_groups": int(has_variance.sum()),
             "groups": len(has_variance), "position": sum(positions), "blocks_seen": len(positions)}
    g = dict(zip(local, sft.all_reduce(list(local.values()), device)))
    n, mean = max(g["n"], 1.0), g["reward"] / max(g["n"], 1.0)
    return {"reward_mean": mean, "reward_std": math.sqrt(max(g["reward_sq"] / n - mean ** 2, 0.0)),
            **{k: g[k] / n for k in MEANS}, "groups_with_variance": g["varied_groups"] / max(g["groups"], 1.0),
            "parallel_position": g["position"] / g["blocks_seen"] if g["blocks_seen"] else None}

EVAL_KEYS = ("mean_at_k", "pass_at_k", "format_valid", "parallel_ratio", "mean_blocks", "mean_parallel_position",
             "mean_T", "mean_D")

def evaluate_now(run, tag: str) -> dict:
    """Every rank samples its shard of the held-out problems (eval_k at eval_temperature, a fixed seed; FSDP: on the
    rollout copy, refreshed first); every rank gets each benchmark's (data source's) metrics and their Avg, logged."""
    cfg, d, t0, samples, mine = run.cfg, run.dist, time.time(), [], run.eval_records[run.dist.rank::run.dist.world_size]
    if cfg.fsdp:
        sync_rollout_model(run.rollout_model, run.train_model)
    if mine:
        with sft.autocast(d.device):
            samples = evaluate(run.rollout_model, run.tokenizer, mine, cfg.mode, k=cfg.eval_k, seed=cfg.seed,
                               max_new_tokens=cfg.max_new_tokens, temperature=cfg.eval_temperature, top_p=cfg.top_p,
                               batch_size=max(1, 128 // cfg.eval_k), prompt_file=cfg.prompt_file or None,
                               num_paths=cfg.num_paths, max_blocks=cfg.max_blocks)[1]   # prompt style: the mode's
    if dist.is_initialized():
        shards = [None] * d.world_size
        dist.all_gather_object(shards, samples)
        samples = [s for shard in shards for s in shard]
    by_bench: dict[str, list] = {}
    for s in samples:
        by_bench.setdefault(s["benchmark"] or "held_out", []).append(s)
    metrics = {b: {k: m[k] for k in EVAL_KEYS} for b, ss in by_bench.items() for m in [summarize(ss, cfg.eval_k)]}
    avg = sum(m["mean_at_k"] for m in metrics.values()) / len(metrics)
    for b, m in metrics.items():
        run.log(f"[eval {tag}] {b}, k={cfg.eval_k}: " + " ".join(f"{k} {v:.3f}" for k, v in m.items() if v is not None))
    run.log(f"[eval {tag}] Avg Mean@{cfg.eval_k} {100 * avg:.1f}% ({time.time() - t0:.0f}s)")
    run.write({"step": run.step, "eval/avg_mean_at_k": avg,
               **{f"eval/{b}/{k}": v for b, m in metrics.items() for k, v in m.items()}})
    return {"avg_mean_at_k": avg, "benchmarks": metrics}

# The training run

LOG_KEYS = ("reward_mean", "accuracy", "format_valid", "parallel_ratio", "groups_with_variance", "loss", "clip_frac",
            "entropy", "grad_norm", "time_sample", "time_reward", "time_update")      # the line every log_every steps

@dataclass
class GRPORun(sft.Run):
    rollout_model: torch.nn.Module = None               # what the sampler and the evaluation run on
    ref_model: torch.nn.Module | None = None            # the frozen initial weights of the KL term
    sources: dict = field(default_factory=dict)         # "train" (and "easy" for recipe seen): problems ...
    prompts: dict = field(default_factory=dict)         # ... their prompt ids ...
    streams: dict = field(default_factory=dict)         # ... and the shuffled order they are drawn in
    eval_records: list = field(default_factory=list)

def setup(cfg: GRPOConfig, d, records, eval_records) -> GRPORun:
    """The run: the resolved config, prompt streams and held-out problems, model copies, optimizer, schedule."""
    init = default_init(cfg.mode or RECIPE_MODE[cfg.recipe], cfg.model)
    tok = own_tokenizer(sft.resume_path(cfg) or init)        # the preset and its checks come before the weights load
    cfg = resolve_defaults(dataclasses.replace(cfg, model=init), tok is None or len(tok) < TINY_VOCAB_LIMIT,
                           d.world_size)
    run = sft.load(cfg, d, init, cls=GRPORun)
    if cfg.recipe == "seen" and cfg.easy_steps >= cfg.max_steps:
        run.log(f"note: --easy_steps={cfg.easy_steps} >= --max_steps={cfg.max_steps}: the run never leaves the "
                "easy-RL stage (recipe seen)")
    style = "sequential" if cfg.mode == "sequential" else "parallel"
    if (init_mode := mode_from_config(read_checkpoint_config(init)[0])) and init_mode != cfg.mode:
        run.log(f"warning: {init} was trained in mode {init_mode!r}, this run samples and trains in {cfg.mode!r}")
    sources = {"train": records if records is not None else load_data(cfg.data, style=style, seed=cfg.seed)}
    if cfg.recipe == "seen" and (cfg.easy_steps or 0) > 0:
        sources["easy"] = load_data(cfg.easy_data, style=style, seed=cfg.seed)
    if eval_records is None and cfg.eval_data:
        eval_records = load_data(cfg.eval_data, style=style, limit=cfg.eval_samples or None, seed=cfg.seed + 1)
    context = getattr(run.model.config, "max_position_embeddings", None)
    for k, recs in [*sources.items(), ("eval", eval_records or [])]:
        run.sources[k], run.prompts[k], _ = fit_context(recs, run.tokenizer, style, cfg.prompt_file or None,
                                                        cfg.max_new_tokens, context, f"{k} data", run.log,
                                                        required=k != "eval")
    run.eval_records, _ = run.sources.pop("eval"), run.prompts.pop("eval")
    if cfg.kl_coef > 0:
        run.ref_model = (load_model(init, dtype=torch.float32, device=d.device)[0] if run.resume
                         else copy.deepcopy(run.model)).eval().requires_grad_(False)
    run.rollout_model = copy.deepcopy(run.model).eval() if cfg.fsdp else run.model   # FSDP: a plain copy
    if cfg.fsdp and d.device.type == "cuda":
        run.rollout_model.to(torch.bfloat16)
    total = cfg.max_steps * cfg.ppo_mini_batches           # optimizer steps of the whole run
    sft.prepare(run, lambda s: sft.lr_factor(s, cfg.warmup_steps, total, cfg.lr_schedule))
    run.streams = {k: sft.ShuffledStream(len(v), cfg.seed + i, **run.state.get("data_position", {}).get(k, {}))
                   for i, (k, v) in enumerate(run.sources.items())}
    run.log(f"GRPO recipe {cfg.recipe} (mode {cfg.mode}) from {init}: {len(run.sources['train'])} problems of "
            f"{cfg.data if records is None else 'the given records'}, {cfg.batch_size} prompts x {cfg.group_size} per "
            f"step on {d.world_size} rank(s) ({d.device.type}), lr {cfg.lr}, max_new_tokens {cfg.max_new_tokens}")
    return run

def first_evaluation(run) -> dict | None:
    """The "before" evaluation: a resumed run's first one if its settings are today's, else a fresh one."""
    cfg, before = run.cfg, run.state.get("eval_before")
    settings = [cfg.eval_data, cfg.eval_samples, cfg.eval_k, cfg.eval_temperature, cfg.max_new_tokens]
    if before and before.get("settings", settings) != settings:
        run.log(f"note: the run's first evaluation used other settings {before['settings']} than now {settings} "
                "(eval_data, eval_samples, eval_k, eval_temperature, max_new_tokens): the end summary shows no "
                "before/after table")
        return {}                                    # falsy: neither re-evaluated nor compared
    return {**evaluate_now(run, "before"), "settings": settings} if before is None and run.eval_records else before

def train(cfg: GRPOConfig, records: list[dict] | None = None, eval_records: list[dict] | None = None) -> dict:
    """Run GRPO (one process, or one rank under torchrun); `records` / `eval_records` replace cfg.data / eval_data.
    Returns {"checkpoint", "steps", "seconds", "eval_before", "eval_after", "last_step", "log"}."""
    with sft.distributed() as d:
        run = setup(cfg, d, records, eval_records)
        cfg, per_rank, t_start, row = run.cfg, run.cfg.batch_size // d.world_size, time.time(), {}
        ckpt, first_step = run.resume or None, run.step      # a finished run resumed: no step, no new evaluation
        pad_id = run.tokenizer.pad_token_id if run.tokenizer.pad_token_id is not None else run.tags.eos
        run.log_no_steps_left(cfg.max_steps)
        eval_before = first_evaluation(run)
        bar = tqdm(total=cfg.max_steps, initial=run.step, disable=not d.is_main, dynamic_ncols=True, desc="grpo")
        while run.step < cfg.max_steps:
            run.step += 1
            step, stage, t0 = run.step, stage_at(cfg, run.step), time.time()
            idx = run.streams[stage.data].take(cfg.batch_size)[d.rank * per_rank:(d.rank + 1) * per_rank]  # mine
            problems = [run.sources[stage.data][i] for i in idx]
            if cfg.fsdp:
                sync_rollout_model(run.rollout_model, run.train_model)
            rollouts = sample_rollouts(run.rollout_model, run.tokenizer, [run.prompts[stage.data][i] for i in idx],
                                       cfg, seed=(cfg.seed * 1_000_003 + step) * 4096 + d.rank)
            t1 = time.time()
            scores = score_batch([r.text for r in rollouts], [problems[r.prompt_index]["answer"] for r in rollouts],
                                 structures=[r.structure for r in rollouts], reward=stage.reward, step=step)
            advantages, has_variance = compute_advantages([s["reward"] for s in scores], cfg.group_size,
                                                          cfg.norm_adv_by_std)
            t2 = time.time()
            trained, trained_adv = rollouts, advantages
            if cfg.filter_groups:                      # only the groups whose rewards differ
                keep = has_variance.repeat_interleave(cfg.group_size)
                trained, trained_adv = [r for r, k in zip(rollouts, keep.tolist()) if k], advantages[keep]
            update = ppo_update(run.train_model, run.optimizer, trained, trained_adv, cfg, tags=run.tags,
                                pad_id=pad_id, scheduler=run.scheduler, ref_model=run.ref_model,
                                clip_ratio_high=stage.clip_ratio_high, world_size=d.world_size, device=d.device)
            t3 = time.time()
            adv_abs = sft.all_reduce([advantages.abs().sum().item(), len(advantages), len(trained)], d.device)
            row = {"step": step, "reward_kind": scores[0]["kind"] if scores else stage.reward.kind_at(step),
                   **rollout_stats(rollouts, scores, has_variance, d.device),
                   "adv_abs_mean": adv_abs[0] / max(adv_abs[1], 1.0), "rollouts_trained": int(adv_abs[2]), **update,
                   "lr": run.optimizer.param_groups[0]["lr"], "clip_ratio_high": stage.clip_ratio_high,
                   "time_sample": t1 - t0, "time_reward": t2 - t1, "time_update": t3 - t2,
                   "elapsed": time.time() - t_start}
            run.log_step(row, bar, f"step {step}: " + " ".join(f"{k} {row[k]:.3f}" for k in LOG_KEYS),
                         reward=f"{row['reward_mean']:+.2f}", acc=f"{row['accuracy']:.2f}",
                         var=f"{row['groups_with_variance']:.2f}")
            last = step == cfg.max_steps or run.out_of_time(t_start)
            if run.eval_records and cfg.eval_every and step % cfg.eval_every == 0 and not last:
                evaluate_now(run, f"step {step}")
            if last or (cfg.save_every and step % cfg.save_every == 0):
                ckpt = run.save(data_position={k: s.position() for k, s in run.streams.items()}, mode=cfg.mode,
                                recipe=cfg.recipe, eval_before=eval_before)
            if last:
                break
        bar.close()
        summary = {"checkpoint": ckpt, "steps": run.step, "eval_before": eval_before, "last_step": row,
                   "eval_after": evaluate_now(run, "after") if run.eval_records and run.step > first_step else None,
                   "log": os.path.join(cfg.out_dir, "log.jsonl"), "seconds": time.time() - t_start}
        run.close()
        stopped = f" (stopped by --max_time={cfg.max_time:g} of {cfg.max_steps})" if run.step < cfg.max_steps else ""
        run.log(f"GRPO done: {run.step} steps{stopped} in {summary['seconds']:.0f}s. checkpoint: {ckpt} (python "
                f"eval.py --model={ckpt}); log: {summary['log']}"
                + (f" (before/after: python scripts/summary.py {cfg.out_dir})" if run.eval_records else ""))
        return summary

if __name__ == "__main__":
    try:
        train(sft.parse_args(GRPOConfig, sys.argv[1:]))
    except (OSError, ValueError) as e:                # bad input: the message says what to do
        sys.exit(f"grpo.py: error: {e}")
    except KeyboardInterrupt:
        sys.exit("grpo.py: interrupted; the checkpoints in out_dir are kept (--resume=True continues the latest)")
