"""GRPO: reinforcement learning of parallel thinking (NOTES.md §5, §6).

    python grpo.py                                     # tiny model from runs/sft: 100 steps, ~9 min
    python grpo.py --recipe=unseen-s2 --max_steps=50   # any config field: --key=value
    python grpo.py --resume=True                       # continue the latest checkpoint in out_dir
    torchrun --nproc_per_node=8 grpo.py --recipe=unseen-s2 --data=dapo --fsdp=True \\
        --model=runs/sft_qwen3_4b/checkpoint-230 --grad_checkpointing=True --out_dir=runs/grpo_s2

One step (`grpo_step`): draw prompts -> `sample_rollouts` -> `score_batch` (the recipe's reward at
this step, `stage_at`) -> `compute_advantages` -> `ppo_update` (ppo_mini_batches optimizer steps of
the PPO-clip loss, plus kl_coef times a KL estimate against the initial weights). The file is its
config, the method (`grpo_step`, then what it calls in the order it calls it), then `setup` and
`train`, a short loop. Around the method, elsewhere: the presets and the settings' checks
(config.py), the evaluations and the rollout statistics (eval.py), the loop's bookkeeping, the
ranks' places in a batch, the frozen model copies, checkpoints and the exact resume (plumbing.py).

Simplified on purpose, unlike the official code (NOTES.md §8): logp_old is the sampler's own
log-prob (in fp32 the ratio starts at 1, in bf16 up to rounding, and a forward is saved; the first
--logprob_check_steps steps measure the gap, --recompute_logprobs=True uses the training
forward's); injected tokens are not trained (--train_injected=True trains them); the loss is
normalised per mini-batch; every rank runs as many micro-batches (empty ones pad), so collectives
never hang.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Annotated, Literal

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # idle OpenMP threads sleep (see sft.py)

import torch
import torch.distributed as dist

import config
import plumbing
from attention import TagIds, autocast, token_scores
from data import held_out_default, is_embedded, load_data, prompt_style_of
from eval import evaluate_run, first_evaluation, fit_context, log_line, own_tokenizer, rollout_stats
from model import Mode, resolve_preset
from rewards import RewardSchedule, score_batch
from sample import Rollout, SamplingConfig, SamplingFlags, Stopped, generate


@dataclass
class GRPOConfig(SamplingFlags, plumbing.RunFlags):
    """python grpo.py: GRPO of parallel thinking; the rollouts' sampling flags are
    sample.SamplingFlags', the run's plumbing.RunFlags'. None = the preset's
    (config.GRPO_PRESETS)."""
    recipe: Literal["seen", "unseen-s1", "unseen-s2", "scaffold", "baseline"] = "unseen-s1"
    model: str = ""                      # "" = the latest SFT checkpoint of the recipe's mode
    preset: config.Preset = "auto"       # tiny, paper, none; auto: the SFT checkpoint's run's
    mode: Mode | None = None             # None = the recipe's
    data: str | None = None              # a data.load_data spec of training problems
    easy_data: str | None = None         # recipe "seen": the easy-RL stage's problems
    prompt_file: str = ""                # a prompt template for data.build_prompt ("" = default)
    out_dir: str = "runs/grpo"
    batch_size: config.PositiveInt | None = None   # prompts per step, all ranks together
    group_size: config.PositiveInt | None = None   # responses per prompt (G)
    generate_batch_size: config.NonNegativeInt | None = None   # prompts per generate call; 0 = all
    reward: Literal["accuracy", "parallel_gated", "tiered", "alternating", "scaffold"] | None = None
    easy_steps: config.NonNegativeInt | None = None       # recipe "seen": the easy-RL stage's steps
    scaffold_steps: config.NonNegativeInt | None = None   # recipe "scaffold": S2 steps, then S1
    norm_adv_by_std: bool = True         # False = Dr. GRPO: A = r - mean(r)
    filter_groups: bool = False          # drop groups whose rewards are all equal (no refill)
    clip_ratio_low: config.NonNegativeFloat = 0.2
    clip_ratio_high: config.NonNegativeFloat | None = None   # None = the recipe's (0.2; S2 0.28)
    clip_ratio_c: Annotated[float, config.Range(low=1)] = 3.0   # dual clip: a negative advantage
    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = \
        "token-mean"
    kl_coef: config.NonNegativeFloat | None = None   # > 0 loads a frozen reference; official: 0
    kl_estimator: Literal["k1", "k3"] = "k3"   # k1 = log(p/p_ref); k3: low-variance, clamped
    train_injected: bool = False         # also train on runtime-injected tokens (the official code)
    recompute_logprobs: bool = False     # logp_old from the training forward (a forward a step)
    logprob_check_steps: config.NonNegativeInt = 5   # the first N steps log the sampler's gap
    lr: config.PositiveFloat | None = None
    warmup_steps: config.NonNegativeInt | None = None   # linear warm-up (optimizer steps)
    lr_schedule: Literal["constant", "cosine"] | None = None   # constant (the paper), or cosine
    betas: config.AdamBetas = (0.9, 0.999)
    ppo_mini_batches: config.PositiveInt = 2       # optimizer steps per training step
    micro_batch_size: config.PositiveInt | None = None   # rollouts per forward on one rank
    micro_batch_tokens: config.NonNegativeInt = 0  # also cap a micro-batch's padded tokens (0 = no)
    eval_data: str | None = None         # held-out problems ("" = none); --data: its test part
    eval_every: config.NonNegativeInt | None = None    # steps between evaluations (0: first, last)
    eval_samples: config.NonNegativeInt | None = None  # first problems of each part (0 = all)
    eval_k: config.PositiveInt | None = None           # responses per problem (Mean@k, Pass@k)
    eval_temperature: config.NonNegativeFloat = 1.0    # the paper evaluates at T = 1.0
    log_every: config.NonNegativeInt = 10      # print a line every N steps (log.jsonl: every)
    save_every: config.NonNegativeInt = 50     # checkpoint every N steps (0 = only at the end)

    def sampling(self, seed: int | None = None) -> SamplingConfig:
        """The rollouts' sampling settings (the loss's log-probs use the same temperature)."""
        return self.sampling_config(seed=seed, allow_parallel=self.mode != "sequential")


# ---------------------------------------------------------------------------------------------
# The method: one GRPO step, top to bottom (NOTES.md §5, §6)


@dataclass
class GRPORun(plumbing.Run):
    rollout_model: torch.nn.Module = None      # what the sampler and the evaluation run on
    ref_model: torch.nn.Module | None = None   # the frozen initial weights of the KL term
    sources: dict = field(default_factory=dict)   # "train" (and "easy", recipe seen): problems,
    prompts: dict = field(default_factory=dict)   # ... their prompt ids,
    streams: dict = field(default_factory=dict)   # ... and the shuffled order they are drawn in
    eval_records: list = field(default_factory=list)
    prompt_style: str = "parallel"               # data.PromptStyle: the tiny preset's is "bare"
    pad_id: int = 0


def grpo_step(run: GRPORun, step: int) -> dict | None:
    """One GRPO step (NOTES.md §5): draw prompts, sample group_size rollouts each, score them
    with this step's reward, turn the rewards into group-relative advantages, update the policy.
    Returns the step's statistics (all ranks'), or None when a signal (a preemption) abandoned
    the step before it changed a weight: each rank stops sampling at its next decode step, and
    the ranks agree after sampling and before each forward up to the first optimizer step
    (after it, the step finishes). A rank samples its places of the global batch
    (`plumbing.rank_places`), each prompt's responses seeded by the step and that place, so N
    ranks sample and train as 1 rank does at the same batch_size."""
    cfg = run.cfg
    d = run.dist
    stage = stage_at(cfg, step)
    clock = plumbing.Stopwatch()
    drawn = run.streams[stage.data].take(cfg.batch_size)
    places = plumbing.rank_places(cfg.batch_size, d.world_size, d.rank, cfg.ppo_mini_batches)
    problems = [run.sources[stage.data][drawn[p]] for p in places]
    prompts = [run.prompts[stage.data][drawn[p]] for p in places]
    if cfg.fsdp:
        plumbing.sync_rollout_model(run.rollout_model, run.train_model)
    rollouts = sample_rollouts(run.rollout_model, run.tokenizer, prompts, cfg,
                               seed=plumbing.rollout_seed(cfg.seed, step), places=places,
                               stop=run.signalled)     # [] when this rank was signalled
    if run.any_rank_signalled():                       # the ranks agree: abandon the step
        return None
    clock.lap("time_sample")
    golds = [problems[r.prompt_index]["answer"] for r in rollouts]
    scores = score_batch([r.text for r in rollouts], golds, reward=stage.reward, step=step,
                         structures=[r.structure for r in rollouts])
    rewards = [s["reward"] for s in scores]
    advantages, has_variance = compute_advantages(rewards, cfg.group_size, cfg.norm_adv_by_std)
    clock.lap("time_reward")
    trained = rollouts
    trained_advantages = advantages
    if cfg.filter_groups:                          # only the groups whose rewards differ
        keep = has_variance.repeat_interleave(cfg.group_size)
        trained = [r for r, k in zip(rollouts, keep.tolist()) if k]
        trained_advantages = advantages[keep]
    lr = run.optimizer.param_groups[0]["lr"]       # the step's first (the update moves it on)
    update = ppo_update(run.train_model, run.optimizer, trained, trained_advantages, cfg,
                        tags=run.tags, pad_id=run.pad_id, scheduler=run.scheduler,
                        ref_model=run.ref_model, clip_ratio_high=stage.clip_ratio_high,
                        check_logprobs=step <= cfg.logprob_check_steps,
                        stop=run.any_rank_signalled)
    if update is None:
        return None
    clock.lap("time_update")
    advantage_sums = [advantages.abs().sum().item(), len(advantages), len(trained)]
    abs_sum, count, trained_count = plumbing.all_reduce(advantage_sums, d.device)
    return {"step": step, "reward_kind": stage.reward.kind_at(step),
            **rollout_stats(rollouts, scores, has_variance, d.device),
            "adv_abs_mean": abs_sum / max(count, 1.0), "rollouts_trained": int(trained_count),
            **update, "lr": lr,
            "clip_ratio_high": stage.clip_ratio_high, **clock.laps}


@dataclass(frozen=True)
class Stage:
    reward: RewardSchedule       # asked with the 1-based global step
    data: str                    # "train" or "easy": the prompt stream the step draws from
    clip_ratio_high: float


def stage_at(cfg: GRPOConfig, step: int) -> Stage:
    """The recipe's reward, data and upper clip ratio at 1-based step `step` (NOTES.md §6);
    --reward and --clip_ratio_high win."""
    scaffold_steps = cfg.scaffold_steps or 0
    schedule = RewardSchedule("accuracy")         # S1 and the baseline
    data = "train"
    high = 0.2
    if cfg.recipe == "seen" and step <= (cfg.easy_steps or 0):
        schedule = RewardSchedule("parallel_gated")
        data = "easy"
    elif cfg.recipe == "unseen-s2":
        schedule = RewardSchedule("alternating")
        high = 0.28
    elif cfg.recipe == "scaffold":   # then a new S1 run in the official scripts: clip 0.2/0.2
        schedule = RewardSchedule("scaffold", switch_step=scaffold_steps)
        high = 0.28 if step <= scaffold_steps else 0.2
    if cfg.reward:
        schedule = RewardSchedule(cfg.reward, switch_step=scaffold_steps)
    if cfg.clip_ratio_high is not None:
        high = cfg.clip_ratio_high
    return Stage(schedule, data, high)


def sample_rollouts(model, tokenizer, prompts: list[list[int]], cfg: GRPOConfig, seed: int,
                    places: list[int] | None = None, stop=None) -> list[Rollout]:
    """group_size rollouts per prompt, prompt-major, in chunks of generate_batch_size prompts;
    prompt i's responses draw from numbers seeded by (seed, places[i]) (`sample.generate`;
    default: i), so the chunking does not change them. `stop`: sample.generate's; [] when it
    stopped the sampling."""
    chunk = cfg.generate_batch_size or len(prompts)          # prompts per call: the memory
    if places is None:
        places = list(range(len(prompts)))
    was_training = model.training
    model.eval()
    rollouts = []
    try:
        for start in range(0, len(prompts), chunk):
            with autocast(next(model.parameters()).device):
                chunk_rollouts = generate(model, tokenizer, prompts[start:start + chunk],
                                          group_size=cfg.group_size, mode=cfg.mode,
                                          sampling=cfg.sampling(seed=seed),
                                          places=places[start:start + chunk], stop=stop)
            for r in chunk_rollouts:
                r.prompt_index += start
            rollouts += chunk_rollouts
    except Stopped:                          # signalled: the caller abandons the step
        return []
    finally:
        model.train(was_training)
    return rollouts


def compute_advantages(rewards, group_size: int, norm_adv_by_std: bool = True, eps: float = 1e-6):
    """Group-relative advantages of prompt-major rewards (n,): (r - mean) / (std + eps) with the
    unbiased std (as the official code), or r - mean (Dr. GRPO). Returns (advantages (n,)
    float32, has_variance (n // G,) bool); a group of equal rewards gets exactly 0, never NaN
    (also for G = 1)."""
    # >>> exercise 6: group-relative advantages
    groups = torch.as_tensor(rewards, dtype=torch.float32).flatten().view(-1, group_size)
    has_variance = groups.max(dim=1).values > groups.min(dim=1).values
    advantages = groups - groups.mean(dim=1, keepdim=True)
    if norm_adv_by_std and group_size > 1:
        advantages = advantages / (groups.std(dim=1, keepdim=True) + eps)
    advantages = torch.where(has_variance[:, None], advantages, torch.zeros_like(advantages))
    return advantages.flatten(), has_variance
    # <<< exercise 6


STAT_SUMS = ("loss", "pg_loss", "kl", "tokens", "clipped", "dual", "entropy", "ratio")


def ppo_update(model, optimizer, rollouts: list[Rollout], advantages, cfg: GRPOConfig, *,
               tags: TagIds, pad_id: int, clip_ratio_high: float, scheduler=None,
               ref_model=None, check_logprobs: bool = False, stop=None) -> dict | None:
    """cfg.ppo_mini_batches optimizer steps of the PPO-clip loss on this rank's rollouts (any
    number, also 0). `cfg` is resolved (`resolve_defaults`: cfg.mode and cfg.kl_coef are in
    force); clip_ratio_high is this step's (`stage_at`); ref_model (kl_coef > 0): the frozen
    initial weights; check_logprobs: measure the sampler's log-probs against the training
    forward's. model: plain, DDP- or FSDP-wrapped. Global statistics: loss and pg_loss (means
    over mini-batches), kl, clip_frac, dual_clip_frac, entropy, ratio_mean (token means),
    counts, and the log-prob gap when measured. `stop`: a question every rank asks at the same
    points (first, then before each forward until the first optimizer step); True abandons the
    update with the weights as they were: None is returned."""
    device = next(model.parameters()).device
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    advantages = torch.as_tensor(advantages, dtype=torch.float32).flatten()
    minis = mini_batches(rollouts, advantages, cfg, pad_id, device)
    if stop is not None and stop():
        return None
    if ref_model is not None:             # the KL term's reference log-probs (kl_coef > 0)
        for mb in (mb for mini in minis for mb in mini.micro_batches):
            if stop is not None and stop():
                return None
            mb.ref_logprobs = response_logprobs(ref_model, mb, cfg, tags)
    gap = {}
    if check_logprobs or cfg.recompute_logprobs or cfg.train_injected:
        gap = recompute_old_logprobs(minis, model, cfg, tags, clip_ratio_high, device, stop)
        if gap is None:
            return None
    model.train()
    sums = dict.fromkeys(STAT_SUMS, 0.0)
    grad_norms = []
    for mini in minis:
        if mini.denominator == 0:              # nothing to learn on any rank: every rank skips
            continue
        for j, mb in enumerate(mini.micro_batches):
            if stop is not None and not grad_norms and stop():   # no optimizer step yet
                optimizer.zero_grad(set_to_none=True)
                return None
            last = j == len(mini.micro_batches) - 1
            with plumbing.grad_sync(model, enabled=last):
                logprobs, entropy = token_scores(model, mb, tags, cfg.mode, mb.loss_mask.bool(),
                                                 cfg.temperature, cfg.logit_chunk_tokens,
                                                 banned=mb.banned)
                loss, stats = micro_batch_loss(logprobs, entropy, mb, cfg, clip_ratio_high,
                                               mini.denominator, world_size)
                loss.backward()
            for key in STAT_SUMS:
                sums[key] += stats[key]
        grad_norms.append(plumbing.optimizer_step(model, optimizer, scheduler, cfg.grad_clip))
    g = dict(zip(STAT_SUMS, plumbing.all_reduce([sums[k] for k in STAT_SUMS], device)))
    tokens = max(g["tokens"], 1.0)
    steps = len(grad_norms)
    return {"loss": g["loss"] / max(steps, 1), "pg_loss": g["pg_loss"] / max(steps, 1),
            "kl": g["kl"] / tokens, "clip_frac": g["clipped"] / tokens,
            "dual_clip_frac": g["dual"] / tokens, "entropy": g["entropy"] / tokens,
            "ratio_mean": g["ratio"] / tokens,
            "grad_norm": sum(grad_norms) / steps if steps else 0.0,
            "loss_tokens": int(g["tokens"]), "optimizer_steps": steps,
            "micro_batches": sum(len(m.micro_batches) for m in minis), **gap}


@dataclass
class MiniBatch:
    """One optimizer step's rollouts on this rank, in micro-batches (a forward and backward
    each), and the loss's denominator D: the whole mini-batch's, over every rank
    (`loss_weights`)."""
    micro_batches: list[RolloutBatch]
    denominator: float


def mini_batches(rollouts: list[Rollout], advantages, cfg: GRPOConfig, pad_id: int,
                 device) -> list[MiniBatch]:
    """This rank's mini-batches on `device`, with their loss weights and denominator; as many
    micro-batches each as the longest rank's (the others add empty ones)."""
    lengths = [len(r.prompt_ids) + len(r.response_ids) for r in rollouts]
    micro_batch_size = cfg.micro_batch_size or max(len(rollouts), 1)
    plan = plumbing.plan_micro_batches(lengths, cfg.ppo_mini_batches, micro_batch_size,
                                       cfg.micro_batch_tokens)
    counts = plumbing.all_reduce([len(m) for m in plan], device, op="max")
    minis = []
    for micro, count in zip(plan, counts):
        batches = [collate_rollouts([rollouts[i] for i in indices], advantages[indices], pad_id,
                                    cfg.train_injected)
                   for indices in micro]
        batches += [empty_micro_batch(pad_id)] * (int(count) - len(micro))
        batches = [b.to(device) for b in batches]
        local_denominator = 0.0
        for b in batches:
            b.loss_weights, part = loss_weights(b.loss_mask, cfg.loss_agg_mode,
                                                cfg.max_new_tokens)
            local_denominator += part
        denominator = plumbing.all_reduce([local_denominator], device)[0]
        minis.append(MiniBatch(batches, denominator))
    return minis


@dataclass
class RolloutBatch:
    """Right-padded rollouts; the (B, L-1) tables are target-aligned: column t is about
    input_ids[:, t + 1]."""
    input_ids: torch.Tensor        # (B, L) long: prompt + response, right padding
    attention_mask: torch.Tensor   # (B, L) long: 1 on real tokens
    prompt_lengths: list[int]      # (B,)
    response_mask: torch.Tensor    # (B, L-1) float: the target is a response token
    sampled_mask: torch.Tensor     # (B, L-1) float: ... that the model sampled (not injected)
    loss_mask: torch.Tensor        # (B, L-1) float: ... that the loss trains on
    old_logprobs: torch.Tensor     # (B, L-1) float32: logp_old (the sampler's, or a forward's)
    advantages: torch.Tensor       # (B, 1) float32
    banned: torch.Tensor | None = None         # (B, L-1, K) bool: what each draw masked, of
                                               # TagIds.maskable (None: no rollout recorded it)
    ref_logprobs: torch.Tensor | None = None   # (B, L-1) float32 when kl_coef > 0
    loss_weights: torch.Tensor | None = None   # (B, L-1) float32: w of `loss_weights`

    def to(self, device) -> RolloutBatch:
        moved = {k: v.to(device) for k, v in vars(self).items() if torch.is_tensor(v)}
        return dataclasses.replace(self, **moved)


def collate_rollouts(rollouts: list[Rollout], advantages, pad_id: int,
                     train_injected: bool = False) -> RolloutBatch:
    """Right-padded to the longest: prompt [5, 6] + response [7, 8, 1], sampled [1, 0, 1] ->
    input_ids [5, 6, 7, 8, 1], response_mask [0, 1, 1, 1], sampled_mask [0, 1, 0, 1]; loss_mask =
    sampled_mask, or response_mask with train_injected. ValueError for an empty prompt."""
    rows = [r.prompt_ids + r.response_ids for r in rollouts]
    longest = max(map(len, rows))
    input_ids = torch.tensor([row + [pad_id] * (longest - len(row)) for row in rows])
    attention_mask = torch.tensor([[1] * len(row) + [0] * (longest - len(row)) for row in rows])
    response_mask = torch.zeros(len(rows), longest - 1)
    sampled_mask = torch.zeros_like(response_mask)
    old_logprobs = torch.zeros_like(response_mask)
    for b, r in enumerate(rollouts):
        if not r.prompt_ids:   # its first response token would be predicted from nothing
            raise ValueError(f"rollout {b} (prompt_index {r.prompt_index}) has an empty prompt: "
                             "it needs >= 1 token")
        first = len(r.prompt_ids) - 1           # the column that predicts the first response token
        last = len(r.prompt_ids) + len(r.response_ids) - 1
        response_mask[b, first:last] = 1.0
        sampled_mask[b, first:last] = torch.tensor(r.sampled_mask, dtype=torch.float32)
        old_logprobs[b, first:last] = torch.tensor(r.logprobs, dtype=torch.float32)
    loss_mask = (response_mask if train_injected else sampled_mask).clone()
    advantages = torch.as_tensor(advantages, dtype=torch.float32).view(len(rollouts), 1)
    prompt_lengths = [len(r.prompt_ids) for r in rollouts]
    return RolloutBatch(input_ids, attention_mask, prompt_lengths, response_mask, sampled_mask,
                        loss_mask, old_logprobs, advantages, collate_bans(rollouts, longest))


def collate_bans(rollouts: list[Rollout], longest: int) -> torch.Tensor | None:
    """(B, longest-1, K) bool, aligned like `collate_rollouts`' tables: which of
    TagIds.maskable the sampler masked at each response token's draw (False elsewhere); None
    when no rollout recorded it (hand-made rollouts)."""
    recorded = [r.banned for r in rollouts if r.banned]
    if not recorded:
        return None
    banned = torch.zeros(len(rollouts), longest - 1, len(recorded[0][0]), dtype=torch.bool)
    for b, r in enumerate(rollouts):
        if r.banned:
            first = len(r.prompt_ids) - 1
            banned[b, first:first + len(r.banned)] = torch.tensor(r.banned, dtype=torch.bool)
    return banned


def empty_micro_batch(pad_id: int) -> RolloutBatch:
    """One row with nothing in the loss: a rank with fewer micro-batches runs these, so that
    every rank runs the same forwards and backwards."""
    zero = torch.zeros(1, 1)
    return RolloutBatch(torch.full((1, 2), pad_id, dtype=torch.long),
                        torch.ones(1, 2, dtype=torch.long), [1], zero, zero.clone(),
                        zero.clone(), zero.clone(), torch.zeros(1, 1))


@torch.no_grad()
def recompute_old_logprobs(minis: list[MiniBatch], model, cfg: GRPOConfig, tags: TagIds,
                           clip_ratio_high: float, device, stop=None) -> dict | None:
    """The policy's log-probs of every response token from the training forward, before the
    first optimizer step. They become logp_old of the injected tokens, which the sampler did not
    draw (--train_injected), and of every token with --recompute_logprobs (verl's way: one more
    forward a step). Returns the gap to the sampler's over the sampled tokens, all ranks': mean
    and max |difference|, and the share of tokens whose ratio starts outside the clip range
    (NOTES.md §8: in fp32 the gap is rounding; bf16 kernels widen it); None: `stop` said so."""
    differences = [torch.zeros(0)]
    for mini in minis:
        for mb in mini.micro_batches:
            if stop is not None and stop():
                return None
            logprobs = response_logprobs(model, mb, cfg, tags)
            differences.append((logprobs - mb.old_logprobs)[mb.sampled_mask.bool()].cpu())
            replaced = (mb.response_mask - mb.sampled_mask).bool()       # the injected tokens
            if cfg.recompute_logprobs:
                replaced = mb.response_mask.bool()
            mb.old_logprobs = torch.where(replaced, logprobs, mb.old_logprobs)
    difference = torch.cat(differences)                   # (n,): this rank's sampled tokens
    ratio = torch.exp(difference.clamp(-20.0, 20.0))
    outside = (ratio < 1.0 - cfg.clip_ratio_low) | (ratio > 1.0 + clip_ratio_high)
    gap = difference.abs()
    sums = plumbing.all_reduce([gap.sum().item(), outside.sum().item(), len(gap)], device)
    largest = plumbing.all_reduce([max(gap.tolist(), default=0.0)], device, op="max")[0]
    return {"logprob_gap_mean": sums[0] / max(sums[2], 1.0), "logprob_gap_max": largest,
            "logprob_gap_outside_clip": sums[1] / max(sums[2], 1.0)}


@torch.no_grad()
def response_logprobs(model, mb: RolloutBatch, cfg: GRPOConfig, tags: TagIds) -> torch.Tensor:
    """(B, L-1) float32: the model's log-prob of each response token of the micro-batch (the
    training forward, no gradient), 0 at the prompt and the padding."""
    response = mb.response_mask.bool()
    table = torch.zeros_like(mb.old_logprobs)
    table[response] = token_scores(model, mb, tags, cfg.mode, response, cfg.temperature,
                                   cfg.logit_chunk_tokens, banned=mb.banned)[0]
    return table


def micro_batch_loss(logprobs, entropy, mb: RolloutBatch, cfg: GRPOConfig,
                     clip_ratio_high: float, denominator: float,
                     world_size: int = 1) -> tuple[torch.Tensor, dict]:
    """This micro-batch's part of the mini-batch loss, sum(w * l) / D with w = mb.loss_weights
    and D over every micro-batch of every rank (`MiniBatch`), and the sums to all-reduce for the
    step's statistics. logprobs, entropy (N,) float32: of the loss tokens (mb.loss_mask), in
    row-major order, from the training forward (attention.token_scores)."""
    selected = mb.loss_mask.bool()                                          # (B, L-1)
    weights = mb.loss_weights[selected]
    old = mb.old_logprobs[selected]                                         # (N,)
    advantages = mb.advantages.expand_as(mb.loss_mask)[selected]
    pg, clipped, dual = policy_loss(logprobs, old, advantages, cfg.clip_ratio_low, clip_ratio_high,
                                    cfg.clip_ratio_c)
    token_loss = pg
    kl = None
    if mb.ref_logprobs is not None:                                         # kl_coef > 0
        kl = kl_penalty(logprobs, mb.ref_logprobs[selected], cfg.kl_estimator)
        token_loss = pg + cfg.kl_coef * kl
    d = max(denominator, 1e-12)
    part = (weights * token_loss).sum() / d
    with torch.no_grad():
        stats = {"loss": part.item(), "pg_loss": ((weights * pg).sum() / d).item(),
                 "tokens": float(selected.sum()), "kl": 0.0 if kl is None else kl.sum().item(),
                 "clipped": clipped.sum().item(), "dual": dual.sum().item(),
                 "entropy": entropy.sum().item(),
                 "ratio": torch.exp((logprobs - old).clamp(-20, 20)).sum().item()}
    # DDP and FSDP average the ranks' gradients; D already counts every rank's tokens, so each
    # rank's part is scaled by world_size to make that average the whole batch's sum(w * l) / D
    return part * world_size, stats


def policy_loss(logprobs, old_logprobs, advantages, clip_ratio_low: float = 0.2,
                clip_ratio_high: float = 0.2, clip_ratio_c: float = 3.0):
    """The PPO-clip loss per token: max(-A ratio, -A clip(ratio, 1 - low, 1 + high)), then at
    most -A c where A < 0 (dual clip); ratio = exp(clamp(logp - logp_old, ±20)). Also whether
    the clipped term was the larger (gradient 0) and whether the dual bound applied. logprobs,
    old_logprobs: any shape, e.g. (B, T), or (N,) as micro_batch_loss passes the loss tokens;
    advantages: the same shape, or one that broadcasts to it ((B, 1) for (B, T))."""
    # >>> exercise 5: the PPO-clip policy loss with clip-higher and dual clip
    ratio = torch.exp((logprobs - old_logprobs).clamp(-20.0, 20.0))   # a stale token: no overflow
    advantages = advantages.expand_as(ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    clipped_loss = torch.maximum(unclipped, clipped)
    dual_bound = -advantages * clip_ratio_c
    negative = advantages < 0
    loss = torch.where(negative, torch.minimum(clipped_loss, dual_bound), clipped_loss)
    return loss, clipped > unclipped, negative & (clipped_loss > dual_bound)
    # <<< exercise 5


def kl_penalty(logprobs, ref_logprobs, estimator: str = "k3") -> torch.Tensor:
    """KL(pi || pi_ref) per token from samples of pi: k1 = logp - logp_ref (unbiased, may be < 0),
    or k3 = e^d - d - 1 with d = logp_ref - logp (unbiased, >= 0; d clamped to ±20, the value to
    ±10, as verl's)."""
    if estimator == "k1":
        return logprobs - ref_logprobs
    d = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    return (torch.exp(d) - d - 1.0).clamp(-10.0, 10.0)


def loss_weights(loss_mask: torch.Tensor, loss_agg_mode: str, max_new_tokens: int | None = None):
    """Weights w (B, T) and denominator D, loss = sum(w * l) / D (summed over micro-batches and
    ranks: the whole batch's, zero-advantage groups too, as verl's). m = loss_mask, n_i = sum of
    row i of m, N = rows with n_i > 0. token-mean: w = m, D = sum n_i; seq-mean-token-mean:
    w = m / max(n_i, 1), D = N; seq-mean-token-sum-norm (Dr. GRPO): w = m, D = N max_new_tokens."""
    # >>> exercise 6: the loss aggregation modes
    n = loss_mask.sum(dim=-1, keepdim=True)
    if loss_agg_mode == "token-mean":
        return loss_mask, float(n.sum())
    if loss_agg_mode == "seq-mean-token-mean":
        return loss_mask / n.clamp(min=1), float((n > 0).sum())
    return loss_mask, float((n > 0).sum()) * max_new_tokens     # seq-mean-token-sum-norm
    # <<< exercise 6


def agg_loss(loss_mat, loss_mask, loss_agg_mode: str = "token-mean",
             max_new_tokens: int | None = None):
    """sum(w * loss_mat) / D of one table (`loss_weights`); 0 when nothing is in the loss."""
    w, d = loss_weights(loss_mask, loss_agg_mode, max_new_tokens)
    return (w * loss_mat).sum() / max(d, 1e-12)


# ---------------------------------------------------------------------------------------------
# The run: presets, setup, evaluation during training, statistics, the loop (a reader of the
# method may stop here)


def resolve_defaults(cfg: GRPOConfig, world_size: int = 1, find_model: bool = False):
    """The recipe's mode (config.RECIPE_MODE), with find_model the start model
    (`plumbing.default_init`: --model, else the mode's latest SFT checkpoint), the preset (--preset;
    auto: `model.resolve_preset`) in the None fields; the checks that teach."""
    config.check(cfg)
    cfg = dataclasses.replace(cfg, mode=cfg.mode or config.RECIPE_MODE[cfg.recipe])
    if find_model:
        cfg = dataclasses.replace(cfg, model=plumbing.default_init(cfg.mode, cfg.model))
    preset, _ = resolve_preset(cfg.preset, cfg.model)
    if cfg.data is not None and cfg.eval_data is None:
        cfg = dataclasses.replace(cfg, eval_data=held_out_default(cfg.data, preset))
    cfg = config.apply_preset(dataclasses.replace(cfg, preset=preset), config.GRPO_PRESETS)
    config.check_grpo(cfg, world_size)
    return cfg


def setup(cfg: GRPOConfig, d: plumbing.Dist, records, eval_records) -> GRPORun:
    """The run: the resolved config, the prompt streams and held-out problems, the model copies,
    the optimizer and the schedule. The config's checks come before the weights load."""
    resolve = functools.partial(resolve_defaults, find_model=True)
    cfg, settings = plumbing.resolve_config(cfg, d, resolve, config.GRPO_PRESETS)
    own_tokenizer(cfg.model)                     # a --model that cannot load fails here
    run = plumbing.load_run(cfg, d, cfg.model, settings, cls=GRPORun)
    for note in config.grpo_notes(cfg, d.world_size):
        run.log(f"note: {note}")
    if eval_records is None and not cfg.eval_data and not is_embedded(cfg.data):
        run.log(f"note: no held-out evaluation (--data={cfg.data} has no test part): give "
                "--eval_data=aime25 (or another benchmark)")
    style = "sequential" if cfg.mode == "sequential" else "parallel"
    run.prompt_style = prompt_style_of(cfg.preset, style)
    data_name = "the given records" if records is not None else cfg.data
    if records is None:
        records = load_data(cfg.data, style=style, seed=cfg.seed)
    sources = {"train": records}
    if cfg.recipe == "seen" and (cfg.easy_steps or 0) > 0:
        sources["easy"] = load_data(cfg.easy_data, style=style, seed=cfg.seed)
    if eval_records is None and cfg.eval_data:
        eval_records = load_data(cfg.eval_data, style=style, limit=cfg.eval_samples or None,
                                 seed=cfg.seed + 1)
    context = getattr(run.model.config, "max_position_embeddings", None)
    for name, recs in [*sources.items(), ("eval", eval_records or [])]:
        run.sources[name], run.prompts[name], _ = fit_context(
            recs, run.tokenizer, run.prompt_style, cfg.prompt_file or None, cfg.max_new_tokens,
            context, f"{name} data", run.log, required=name != "eval")
    run.eval_records = run.sources.pop("eval")
    run.prompts.pop("eval")
    # the KL term's frozen initial weights (kl_coef > 0), the sampler's model (FSDP: a plain copy)
    run.ref_model, run.rollout_model = plumbing.frozen_models(run, reference=cfg.kl_coef > 0)
    run.pad_id = run.tokenizer.pad_token_id
    if run.pad_id is None:
        run.pad_id = run.tags.eos
    total_optimizer_steps = cfg.max_steps * cfg.ppo_mini_batches
    plumbing.prepare(run, lambda s: plumbing.lr_factor(s, cfg.warmup_steps, total_optimizer_steps,
                                                        cfg.lr_schedule),
                     reads_model_again=run.ref_model is not None)
    run.streams = plumbing.shuffled_streams(run.sources, cfg.seed, run.state)
    run.log(f"GRPO recipe {cfg.recipe} from {cfg.model}: {len(run.sources['train'])} problems of "
            f"{data_name} on {d.world_size} rank(s) ({d.device.type})")
    return run


def train(cfg: GRPOConfig, records: list[dict] | None = None,
          eval_records: list[dict] | None = None) -> dict:
    """Run GRPO (one process, or one rank under torchrun); `records` / `eval_records` replace
    cfg.data / eval_data. Returns {"checkpoint", "steps", "stopped_by", "seconds",
    "eval_before", "eval_after", "last_step", "log"}."""
    with plumbing.distributed(cfg.dist_timeout_minutes) as d:
        run = setup(cfg, d, records, eval_records)
        cfg = run.cfg
        first_step = run.step                     # a finished run resumed: no new evaluation
        eval_before = first_evaluation(run)
        evaluate = functools.partial(evaluate_run, run) if run.eval_records else None
        row = {}
        kept = {"mode": cfg.mode, "recipe": cfg.recipe, "eval_before": eval_before}
        for step in run.steps(cfg.max_steps, "grpo"):
            positions = {name: s.position() for name, s in run.streams.items()}
            stats = grpo_step(run, step)
            if stats is None:           # abandoned on a signal: the step before it is saved
                run.abandon_step(data_position=positions, **kept)
                continue
            row = stats
            line = log_line(step, row)
            postfix = {"reward": f"{row['reward_mean']:+.2f}", "acc": f"{row['accuracy']:.2f}",
                       "var": f"{row['groups_with_variance']:.2f}"}
            positions = {name: s.position() for name, s in run.streams.items()}
            run.end_step(row, line, postfix, evaluate, data_position=positions, **kept)
        eval_after = None
        if evaluate and run.step > first_step and not run.signal_received:
            eval_after = evaluate("after")
        summary = {"checkpoint": run.checkpoint, "steps": run.step, "stopped_by": run.stopped_by,
                   "eval_before": eval_before, "last_step": row, "eval_after": eval_after,
                   "log": os.path.join(cfg.out_dir, "log.jsonl"),
                   "seconds": time.monotonic() - run.t_start}
        run.close()
        stopped = f" of {cfg.max_steps} (stopped by {run.stopped_by})" if run.stopped_by else ""
        compare = ""
        if run.eval_records:
            compare = f" (before/after: python scripts/look/summary.py {cfg.out_dir})"
        run.log(f"GRPO done at step {run.step}{stopped}: {run.step - first_step} steps in "
                f"{summary['seconds']:.0f}s. checkpoint: {run.checkpoint} (python eval.py "
                f"--model={run.checkpoint}); log: {summary['log']}{compare}")
        return summary


if __name__ == "__main__":
    plumbing.run_script("grpo.py", GRPOConfig, train, sys.argv[1:])
