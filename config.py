"""The command line of every script, made from its config dataclass (a typed nanoGPT configurator).

    cfg = config.parse(SFTConfig, ["--lr=3e-4", "--mode", "seen"])     # --key=value or --key value

A field's annotation is its type: int, float, str, bool (true/false), `X | None` ("None"),
tuple[float, float] ("0.9,0.95"), Literal[...] (the allowed values); the comment after the field
is its --help. A field's range is part of its type, declared once with the field:

    lr: PositiveFloat | None = None        # checked by `check` (called by `parse` and the trainers)

`base` (a checkpoint's config, for --resume) replaces the defaults; `fill` applies a preset to the
None fields; `sources` says where each resolved value came from (settings.json, printed by
`settings_table`). The presets of sft.py, grpo.py and eval.py, GRPO's recipes' modes and the
checks and notes on GRPO's resolved settings (`check_grpo`, `grpo_notes`) are at the end of this
file.
"""
import argparse
import dataclasses
import inspect
import math
import re
import textwrap
import types
import typing
from typing import Annotated, Literal

TRUE_WORDS = ("true", "1", "yes")
FALSE_WORDS = ("false", "0", "no")


@dataclasses.dataclass(frozen=True)
class Range:
    """The values a number (or each number of a tuple) may take: finite, never NaN, >= low
    (> low when `low_open`) and <= high (< high when `high_open`)."""
    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False

    def holds(self, value: float) -> bool:
        if not math.isfinite(value):            # NaN and infinities fail every range
            return False
        if self.low_open and value <= self.low:
            return False
        if value < self.low:
            return False
        if self.high_open and value >= self.high:
            return False
        return value <= self.high

    def rule(self) -> str:
        """The range in words, as an error message states it."""
        low = f"{'above' if self.low_open else 'at least'} {number(self.low)}"
        high = f"{'below' if self.high_open else 'at most'} {number(self.high)}"
        if math.isinf(self.high):
            return low
        if math.isinf(self.low):
            return high
        return f"{low} and {high}"


def number(x: float) -> str:
    """1 for 1.0, 4294967295 for 2**32 - 1, 0.5 for 0.5."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


# The ranges the configs use, named once.
PositiveInt = Annotated[int, Range(low=1)]                   # a count: 1, 2, ...
NonNegativeInt = Annotated[int, Range(low=0)]                # 0 usually means "off" or "all"
NonNegativeFloat = Annotated[float, Range(low=0)]
PositiveFloat = Annotated[float, Range(low=0, low_open=True)]
UnitInterval = Annotated[float, Range(low=0, high=1)]        # a share or a probability
Seed = Annotated[int, Range(low=0, high=2**32 - 1)]          # what numpy and torch seeding accept
AdamBetas = Annotated[tuple[float, float], Range(low=0, high=1, high_open=True)]
# How a trainer writes a checkpoint (plumbing.Run.save): full = rank 0 gathers one Hugging Face
# folder; sharded = every rank writes its own shards (torch.distributed.checkpoint); async = the
# shards are copied to host memory and written while training goes on.
CheckpointKind = Literal["full", "sharded", "async"]


def true_or_false(text: str) -> bool:
    if text.lower() not in TRUE_WORDS + FALSE_WORDS:
        raise ValueError(text)
    return text.lower() in TRUE_WORDS


def optional(convert):
    """A converter that reads "None" as None and anything else with `convert`."""
    def convert_optional(text: str):
        if text == "None":
            return None
        return convert(text)
    convert_optional.__name__ = f"{convert.__name__} or None"
    return convert_optional


def tuple_of(types_: tuple):
    """A converter of "0.9,0.95" (or "(0.9, 0.95)") into a tuple of the given element types."""
    def convert_tuple(text: str) -> tuple:
        parts = text.strip("()").split(",")
        return tuple(t(p) for t, p in zip(types_, parts, strict=True))
    convert_tuple.__name__ = f"{len(types_)}-tuple"
    return convert_tuple


def converter(hint):
    """(the function that parses a value of this annotation, the allowed values or None)."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is Annotated:
        return converter(args[0])
    if origin in (typing.Union, types.UnionType):                 # X | None
        inner_hint = next(a for a in args if a is not type(None))
        inner, choices = converter(inner_hint)
        if choices:
            choices = [*choices, None]
        return optional(inner), choices
    if origin is typing.Literal:
        return str, list(args)
    if origin is tuple:
        return tuple_of(args), None
    if hint is bool:
        return true_or_false, None
    return hint, None


def field_range(hint) -> Range | None:
    """The Range declared in a field's annotation (inside `X | None` too), or None."""
    if typing.get_origin(hint) is Annotated:
        return next((a for a in typing.get_args(hint)[1:] if isinstance(a, Range)), None)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        for arg in typing.get_args(hint):
            found = field_range(arg)
            if found is not None:
                return found
    return None


def check(cfg) -> None:
    """ValueError naming every field of a config dataclass whose value is outside its declared
    range, as --name=value (None, the preset's placeholder, is never checked)."""
    hints = typing.get_type_hints(type(cfg), include_extras=True)
    bad = []
    for f in dataclasses.fields(cfg):
        allowed = field_range(hints[f.name])
        value = getattr(cfg, f.name)
        if allowed is None or value is None:
            continue
        values = value if isinstance(value, tuple) else (value,)
        if not all(allowed.holds(v) for v in values):
            rule = allowed.rule()
            if not all(math.isfinite(v) for v in values):     # inf is "at least 0", yet refused
                rule = f"a finite number, {rule}"
            bad.append(f"--{f.name}={value}: must be {rule}")
    if bad:
        raise ValueError("; ".join(bad))


def parse(cls, argv: list[str], base: dict | None = None):
    """The `cls` the command line describes, range-checked. argparse exits with the usage and the
    reason on a bad argument; a value out of its range is a ValueError naming it."""
    helps = {}
    for klass in reversed(cls.__mro__):          # a field's comment, also an inherited field's
        if dataclasses.is_dataclass(klass):
            source = inspect.getsource(klass)
            helps.update(re.findall(r"^\s+(\w+):[^#\n]*#\s*(.*)$", source, re.MULTILINE))
    hints = typing.get_type_hints(cls, include_extras=True)
    base = base or {}
    parser = argparse.ArgumentParser(description=cls.__doc__, allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    own = inspect.get_annotations(cls)
    inherited_last = sorted(dataclasses.fields(cls), key=lambda f: f.name not in own)   # --help
    for f in inherited_last:
        convert, choices = converter(hints[f.name])
        default = base.get(f.name, f.default)
        allowed = field_range(hints[f.name])
        in_range = f"; {allowed.rule()}" if allowed else ""
        parser.add_argument(f"--{f.name}", type=convert, choices=choices, default=default,
                            help=f"{helps.get(f.name, '')} (default: {default!r}{in_range})")
    values = vars(parser.parse_args(argv))
    for name, value in values.items():
        if isinstance(value, list):                  # a saved config's tuples come back as lists
            values[name] = tuple(value)
    cfg = cls(**values)
    check(cfg)
    return cfg


def flags_given(argv: list[str]) -> set[str]:
    """The names of the --flags on a command line ("--lr=3e-4" and "--lr 3e-4" both give lr)."""
    return {arg[2:].split("=")[0] for arg in argv if arg.startswith("--")}


def plain(value):
    """A setting as JSON keeps it: a tuple as a list (a saved config may hold either)."""
    if isinstance(value, tuple | list):
        return [plain(v) for v in value]
    return value


# Where a setting's value comes from (settings.json in every run folder; printed at the start):
# given on the command line (or by the caller of train) at this start, given so at an earlier
# start of the run (a resume keeps the checkpoint's value: plumbing.resolve_config), the
# preset's, the recipe's (GRPO: the mode, and None = decided per step by grpo.stage_at), the
# field's default, derived from other settings (--preset=auto from the model, GRPO's start model
# and eval_data, SFT's max_length from the model's context, a resume's out_dir from --resume),
# or a checkpoint's whose source is not recorded.
SOURCES = ("flag", "earlier flag", "preset", "recipe", "default", "derived", "checkpoint")


def sources(given, resolved, preset: dict) -> dict[str, str]:
    """Each field's source (SOURCES) in `resolved`, the config that `given` resolved to under
    `preset` (its values): a value other than the field's default in `given` is a flag's; an
    unset (None) RECIPE_FIELDS field is the recipe's."""
    found = {}
    for f in dataclasses.fields(resolved):
        before = getattr(given, f.name)
        after = getattr(resolved, f.name)
        if plain(before) != plain(f.default):
            found[f.name] = "flag"
        elif f.name in RECIPE_FIELDS and f.default is None:
            found[f.name] = "recipe"
        elif plain(after) == plain(before):
            found[f.name] = "default"
        elif f.name in preset and plain(after) == plain(preset[f.name]):
            found[f.name] = "preset"
        else:
            found[f.name] = "derived"
    return found


def changes(saved: dict, cfg, ignored: tuple = ()) -> dict[str, tuple]:
    """{name: (saved value, value in cfg)} of the fields of `cfg` whose value differs from the
    saved config's (a field the saved config lacks, or one in `ignored`, is not compared)."""
    changed = {}
    for f in dataclasses.fields(cfg):
        if f.name in ignored or f.name not in saved:
            continue
        old = plain(saved[f.name])
        new = plain(getattr(cfg, f.name))
        if old != new:
            changed[f.name] = (old, new)
    return changed


def settings_table(values: dict, sources_: dict[str, str]) -> str:
    """The settings in force, grouped by source, `name=value`, wrapped at 100 characters; the
    fields at their default are counted, not listed (settings.json lists every field)."""
    groups = {source: [] for source in SOURCES}
    for name, value in values.items():
        shown = '""' if value == "" else value
        groups[sources_[name]].append(f"{name}={shown}")
    if any(f"{name}=None" in groups["recipe"] for name in RECIPE_FIELDS):
        groups["recipe"].append("(None: the recipe's at each step, grpo.stage_at)")
    listed = [source for source in SOURCES if source != "default" and groups[source]]
    label_width = max(len(source) + 2 for source in [*listed, "default"])   # "default: " at least
    lines = []
    for source in listed:
        lines.append(textwrap.fill(" ".join(groups[source]), width=100,
                                   initial_indent=f"  {source + ':':{label_width}}",
                                   subsequent_indent=" " * (label_width + 2),
                                   break_long_words=False, break_on_hyphens=False))
    lines.append(f"  {'default:':{label_width}}{len(groups['default'])} other settings")
    return "\n".join(lines)


def fill(cfg, preset: dict):
    """`cfg` with the preset's value in every field that is None (the tiny or the paper's)."""
    unset = {name: value for name, value in preset.items() if getattr(cfg, name) is None}
    return dataclasses.replace(cfg, **unset)


# A trainer's settings come from a named preset: the tiny model's (the embedded task on a CPU),
# the paper's (NOTES.md §5), or none (every setting on the command line); "auto" picks tiny for
# the embedded model and its checkpoints, else paper (model.resolve_preset).
Preset = Literal["auto", "tiny", "paper", "none"]


def apply_preset(cfg, presets: dict[str, dict]):
    """`cfg` (its `preset` field resolved, not "auto") with that preset in its None fields.
    Under --preset=none a field that both presets set must be given: ValueError naming them."""
    if cfg.preset == "none":
        needed = set(presets["tiny"]) & set(presets["paper"])
        missing = sorted(name for name in needed if getattr(cfg, name) is None)
        if missing:
            flags = ", ".join(f"--{name}" for name in missing)
            raise ValueError(f"--preset=none sets nothing: give {flags} (or --preset=tiny|paper)")
        return cfg
    return fill(cfg, presets[cfg.preset])


# ---------------------------------------------------------------------------------------------
# The presets: each trainer's and eval.py's settings for the tiny model (the embedded task on 2 CPU
# cores) and for the paper's run (NOTES.md §5); `apply_preset` fills them into the None fields.

# SFT, tiny: 400 steps on the easy split (the curriculum: RL meets the longer lists).
SFT_PRESETS = {
    "tiny": dict(lr=1e-3, batch_size=32, micro_batch_size=8, warmup_ratio=0.05, max_time=0.0,
                 max_steps=400, grad_checkpointing=False),
    "paper": dict(lr=1e-5, batch_size=128, micro_batch_size=1, warmup_ratio=0.1, max_time=0.0,
                  epochs=5.0, grad_checkpointing=True)}

# GRPO, tiny (the tuning runs: results/LOG.md): RL on the rl parts (number patterns the cold start
# never saw), 32 prompts x 4 responses a step, lr 1.5e-4 with a cosine to 0 after 10 warm-up
# optimizer steps; the k3 KL anchor keeps the format in place. The paper's memory settings
# (generate_batch_size, grad_checkpointing) are what scripts/gpu/memory_plan.py finds fits Qwen3-4B
# on 8 x 80 GB (README, "The paper's run").
GRPO_PRESETS = {
    "tiny": dict(data="synthetic:easy:rl,synthetic:medium:rl,synthetic:hard:rl",
                 eval_data="synthetic:easy:test,synthetic:medium:test,synthetic:hard:test",
                 easy_data="synthetic:easy", batch_size=32, group_size=4, max_new_tokens=128,
                 lr=1.5e-4, warmup_steps=10, lr_schedule="cosine", kl_coef=0.3,
                 micro_batch_size=16, generate_batch_size=0, max_steps=100, max_time=0.0,
                 eval_every=50, eval_samples=64, eval_k=8, easy_steps=10, scaffold_steps=20,
                 grad_checkpointing=False),
    "paper": dict(data="dapo", eval_data="aime25", easy_data="gsm8k:train", batch_size=256,
                  group_size=8, max_new_tokens=3000, lr=1e-6, warmup_steps=0,
                  lr_schedule="constant", kl_coef=0.0, micro_batch_size=2, generate_batch_size=8,
                  max_steps=300, max_time=0.0, eval_every=10, eval_samples=0, eval_k=16,
                  easy_steps=35, scaffold_steps=200, grad_checkpointing=True)}

# GRPO's recipes (NOTES.md §6): the mode each samples and trains in (--mode=None: the recipe's);
# the reward and the upper clip ratio are the recipe's at each step (grpo.stage_at) unless given.
RECIPE_MODE = {"seen": "seen", "unseen-s1": "unseen", "unseen-s2": "unseen", "scaffold": "unseen",
               "baseline": "sequential"}
RECIPE_FIELDS = ("mode", "reward", "clip_ratio_high")


def check_grpo(cfg, world_size: int) -> None:
    """The resolved GRPO settings that cannot learn or cannot run on `world_size` ranks
    (grpo.resolve_defaults): ValueError naming the flag and what to use instead."""
    if cfg.temperature == 0:
        raise ValueError("--temperature=0: GRPO compares the responses of a group, and greedy ones "
                         "are all the same, so every advantage is 0 and nothing is learned; use a "
                         "temperature above 0 (the paper: 1.0)")
    if cfg.group_size == 1:
        raise ValueError("--group_size=1: a GRPO advantage compares responses to the same prompt, "
                         "so with one every advantage is 0 and nothing is learned; use 2 or more")
    if cfg.batch_size % world_size:
        raise ValueError(f"--batch_size={cfg.batch_size} prompts do not split evenly over "
                         f"{world_size} ranks")
    rollouts_per_rank = cfg.batch_size * cfg.group_size // world_size
    if cfg.ppo_mini_batches > rollouts_per_rank:
        raise ValueError(f"--ppo_mini_batches={cfg.ppo_mini_batches} is more than the "
                         f"{rollouts_per_rank} rollouts a rank has per step: some optimizer steps "
                         "would have no data")


def grpo_notes(cfg, world_size: int) -> list[str]:
    """The resolved GRPO settings that run but may not do what was meant, in words (grpo.setup
    prints them)."""
    notes = []
    if cfg.recipe == "seen" and cfg.easy_steps >= cfg.max_steps:
        notes.append(f"--easy_steps={cfg.easy_steps} >= --max_steps={cfg.max_steps}: the run "
                     "never leaves the easy-RL stage (recipe seen)")
    if world_size > 1 and cfg.batch_size % (cfg.ppo_mini_batches * world_size):
        notes.append(f"--batch_size={cfg.batch_size} is not a multiple of --ppo_mini_batches x "
                     f"ranks ({cfg.ppo_mini_batches} x {world_size}): the mini-batches, and so the "
                     "run, differ from a 1-rank run's (plumbing.rank_places)")
    return notes


# eval.py: the embedded task's three test parts, or the paper's four benchmarks (NOTES.md §7).
EVAL_PRESETS = {
    "tiny": dict(data="synthetic:easy:test,synthetic:medium:test,synthetic:hard:test", k=8,
                 max_new_tokens=128, batch_size=16, limit=64),
    "paper": dict(data="aime24,aime25,amc23,math500", k=16, max_new_tokens=3000, batch_size=4,
                  limit=0)}
