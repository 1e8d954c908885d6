"""One sampled response of a checkpoint as a picture (NOTES.md §1-§3):

    python scripts/look/draw_rollout.py                             # the demo's GRPO checkpoint
    python scripts/look/draw_rollout.py --model=runs/sft/checkpoint-400 --out=rollout.png

Left, against the decode step: the main chain in the top lane, the paths of each block in lanes
of their own side by side (an Unseen block's paths take as many decode steps as the longest), the
summary back in the main lane; grey letters are the tokens the runtime injected. Right: the
Unseen attention mask of the same response (attention.build_mask_and_positions), with the
entries that Unseen hides beyond the causal triangle in red. --model takes a checkpoint folder, a
run folder (its latest checkpoint), a hub name or tiny (random weights); the default,
runs/demo/grpo, is what `make demo` trains. --n responses are drawn and the first with a
well-formed block is shown (else the first). Needs matplotlib (requirements-extra.txt).
"""
import dataclasses
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))   # two folders up
sys.path.insert(0, ROOT)   # the core modules

import torch

import config
from attention import Structure, TagIds, build_mask_and_positions, unseen_positions
from model import load_model, mode_from_config, read_checkpoint_config
from sample import PROBLEMS, Rollout, SampleConfig, generate

DEFAULT_RUN = "runs/demo/grpo"       # what `make demo` trains (relative to the repository)
CHECKPOINT_PREFIX = "checkpoint-"
DEFAULT_PROMPT = PROBLEMS[2] + "\n"  # a six-number problem, in the tiny model's layout
DRAW_BUDGET = 128                    # new tokens when --max_new_tokens is not given (the demo's)

# One glyph per structural token, so that every token fills one cell of the picture.
TAG_GLYPHS = {"parallel": "[", "end_parallel": "]", "path": "(", "end_path": ")",
              "summary": "{", "end_summary": "}"}
NEWLINE_GLYPH = "\u21b5"             # ↵
EOS_GLYPH = "\u25a0"                 # ■
MAX_GLYPH_CHARS = 3                  # a longer token (a hub tokenizer's) is cut, with an ellipsis

# The mask panel's three values (and their colours).
CAUSALLY_HIDDEN = 0                  # a later token: hidden in Seen and in Unseen
VISIBLE = 1
UNSEEN_HIDDEN = 2                    # an earlier sibling path: hidden by Unseen only
MASK_COLOURS = ["#ffffff", "#4c72b0", "#d62728"]

MAIN_COLOUR = "#dddddd"
SUMMARY_COLOUR = "#b5e3b5"
PATH_COLOURS = ["#aec7e8", "#ffbb78", "#c5b0d5", "#f7b6d2", "#dbdb8d", "#9edae5"]
INJECTED_TEXT_COLOUR = "#888888"
CELL_INCHES = 0.11                   # the width of one decode step in the picture
LANE_INCHES = 0.35
MASK_INCHES = 4.0
MIN_TIMELINE_INCHES = 6.0
GLYPH_POINTS = 6.5
LABEL_POINTS = 7                     # block labels, bar labels, the legend
AXIS_POINTS = 8
TITLE_POINTS = 9
MARGIN_INCHES = 1.0                  # room for the lane names and the titles
HALF_CELL = 0.5                      # a cell's centre: one decode step wide, one lane high
BAR_HEIGHT = 0.6                     # the D and T bars under the lanes, in lanes
D_BAR_BELOW = 0.3                    # where the D bar starts below the last lane, in lanes
T_BAR_BELOW = 1.1                    # ... and the T bar
BLOCK_LINE_Y = -0.15                 # a block's span, drawn above the main chain's lane
BLOCK_LABEL_Y = -0.3
TOP_LANES = 1.2                      # room above the main chain for the block labels
DPI = 130


@dataclasses.dataclass
class DrawConfig(SampleConfig):
    """python scripts/look/draw_rollout.py: one sampled response and its Unseen mask, as a PNG."""
    model: str = DEFAULT_RUN               # a checkpoint, a run folder (its latest), hub, or tiny
    prompt: str = DEFAULT_PROMPT           # as the model reads it ("\\n" = newline)
    n: config.PositiveInt = 8              # responses drawn; the first with a block is shown
    out: str = "rollout.png"               # the PNG written


def resolve_checkpoint(name: str) -> str:
    """The checkpoint folder `--model` names: a run folder's latest checkpoint-<step>, a folder
    holding a model as it is, "tiny" or a hub name unchanged. FileNotFoundError naming `make
    demo` and --model when the default run is absent or a folder holds no model."""
    path = name
    if name == DEFAULT_RUN:                          # the demo's run, wherever this is called from
        path = os.path.join(ROOT, name)
    if name == DEFAULT_RUN and not os.path.isdir(path):
        raise FileNotFoundError(f"no {DEFAULT_RUN} here: run `make demo` first (it trains it), "
                                "or pass --model=<a checkpoint or run folder> (--model=tiny: "
                                "random weights)")
    if not os.path.isdir(path):
        return name                                  # tiny or a hub name: load_model checks it
    steps = []
    for entry in os.listdir(path):
        suffix = entry[len(CHECKPOINT_PREFIX):]
        if entry.startswith(CHECKPOINT_PREFIX) and suffix.isdigit():
            steps.append(int(suffix))
    if steps:
        return os.path.join(path, f"{CHECKPOINT_PREFIX}{max(steps)}")
    if os.path.isfile(os.path.join(path, "config.json")):
        return path
    raise FileNotFoundError(f"{name} holds no model and no {CHECKPOINT_PREFIX}<step> folder: "
                            "pass --model=<a checkpoint or run folder>, or run `make demo` "
                            f"for {DEFAULT_RUN}")


def decode_steps(structure: Structure, mode: str) -> list[int]:
    """The decode step of every response token (0-based): Unseen, its multiverse position
    (attention.unseen_positions; a block's paths overlap, so the last step is D - 1, the
    critical path); Seen and sequential, its index (D = T)."""
    if mode == "unseen":
        return unseen_positions(structure, 0)
    return list(range(structure.length))


def lanes(structure: Structure) -> list[int]:
    """The picture's lane of every response token: 0 for the main chain (and the summaries and
    the block's tags outside its paths), j + 1 for the tokens of a block's path j."""
    lane = [0] * structure.length
    for block in structure.blocks:
        for j, (start, end) in enumerate(block.paths):
            lane[start:end] = [j + 1] * (end - start)
    return lane


def in_summary(structure: Structure) -> list[bool]:
    """Whether each response token belongs to a <Summary> ... </Summary> span."""
    inside = [False] * structure.length
    for block in structure.blocks:
        if block.summary is not None:
            start, end = block.summary
            inside[start:end] = [True] * (end - start)
    return inside


def glyphs(ids: list[int], tags: TagIds, tokenizer) -> list[str]:
    """One short label per token: a bracket for each tag (TAG_GLYPHS), ↵ for the newline, ■ for
    EOS, else the token's text (cut to MAX_GLYPH_CHARS)."""
    by_id = {getattr(tags, name): glyph for name, glyph in TAG_GLYPHS.items()}
    labels = []
    for token in ids:
        if token in by_id:
            labels.append(by_id[token])
        elif token in tags.newline:
            labels.append(NEWLINE_GLYPH)
        elif token == tags.eos:
            labels.append(EOS_GLYPH)
        else:
            text = tokenizer.decode([token]).replace("\n", NEWLINE_GLYPH)
            if len(text) > MAX_GLYPH_CHARS:
                text = text[:MAX_GLYPH_CHARS - 1] + "\u2026"
            labels.append(text)
    return labels


def mask_picture(rollout: Rollout, tags: TagIds) -> torch.Tensor:
    """(L, L) long, L = prompt + response: VISIBLE where the Unseen mask lets the row's token
    read the column's, UNSEEN_HIDDEN where Unseen hides an earlier token (a sibling path),
    CAUSALLY_HIDDEN above the diagonal."""
    ids = torch.tensor([rollout.prompt_ids + rollout.response_ids])
    mask, _ = build_mask_and_positions(ids, [len(rollout.prompt_ids)], torch.ones_like(ids),
                                       tags, "unseen")
    visible = mask[0, 0] == 0
    length = ids.shape[1]
    earlier = torch.ones(length, length, dtype=torch.bool).tril()
    picture = torch.full((length, length), CAUSALLY_HIDDEN, dtype=torch.long)
    picture[earlier] = UNSEEN_HIDDEN
    picture[visible] = VISIBLE
    return picture


def draw_timeline(axes, rollout: Rollout, labels: list[str], mode: str, title: str):
    """On `axes`: each response token as a cell at (its decode step, its lane), coloured by what
    it belongs to, its glyph grey where the runtime injected it; each block's span and sizes; D
    against T as two bars."""
    from matplotlib.patches import Rectangle

    structure = rollout.structure
    steps = decode_steps(structure, mode)
    lane_of = lanes(structure)
    summary = in_summary(structure)
    num_lanes = 1 + max(lane_of, default=0)
    total_tokens = structure.length
    for i in range(total_tokens):
        lane = lane_of[i]
        if lane > 0:
            colour = PATH_COLOURS[(lane - 1) % len(PATH_COLOURS)]
        elif summary[i]:
            colour = SUMMARY_COLOUR
        else:
            colour = MAIN_COLOUR
        axes.add_patch(Rectangle((steps[i], lane), 1, 1, facecolor=colour, edgecolor="white",
                                 linewidth=0.3))
        if rollout.sampled_mask[i]:
            text_colour = "black"
        else:
            text_colour = INJECTED_TEXT_COLOUR
        axes.text(steps[i] + HALF_CELL, lane + HALF_CELL, labels[i], ha="center", va="center",
                  fontsize=GLYPH_POINTS, family="monospace", color=text_colour)
    # D, the decode steps this response took, against T, what one token after another takes.
    decode_steps_used = max(steps, default=-1) + 1
    parallel_lane = num_lanes + D_BAR_BELOW
    sequential_lane = num_lanes + T_BAR_BELOW
    bars = ((parallel_lane, decode_steps_used, "#4c72b0", f"D = {decode_steps_used} decode steps"),
            (sequential_lane, total_tokens, "#999999",
             f"T = {total_tokens} tokens one after another: {total_tokens} steps"))
    for y, length, colour, label in bars:
        axes.add_patch(Rectangle((0, y), length, BAR_HEIGHT, facecolor=colour))
        axes.text(HALF_CELL, y + BAR_HEIGHT / 2, label, va="center", fontsize=LABEL_POINTS,
                  color="white")
    for k, block in enumerate(structure.blocks):
        lengths = [end - start for start, end in block.paths]
        if not lengths:
            continue
        first = steps[block.paths[0][0]]
        axes.plot([first, first + max(lengths)], [BLOCK_LINE_Y, BLOCK_LINE_Y], color="#666666",
                  linewidth=1)
        axes.text(first, BLOCK_LABEL_Y, f"block {k + 1}: {len(lengths)} paths, {sum(lengths)} "
                  f"tokens in {max(lengths)} steps", fontsize=LABEL_POINTS)
    lane_names = ["main chain"] + [f"path {j}" for j in range(1, num_lanes)]
    ticks = [lane + HALF_CELL for lane in range(num_lanes)]
    ticks += [parallel_lane + BAR_HEIGHT / 2, sequential_lane + BAR_HEIGHT / 2]
    axes.set_yticks(ticks, lane_names + [mode, "sequential"])
    axes.set_xlim(0, total_tokens + 1)
    axes.set_ylim(sequential_lane + 1, -TOP_LANES)
    axes.set_xlabel("decode step", fontsize=AXIS_POINTS)
    title += (f"\ngrey: injected by the runtime; [ ] <Parallel>, ( ) <Path>, {{ }} <Summary>, "
              f"{NEWLINE_GLYPH} newline, {EOS_GLYPH} EOS")
    axes.set_title(title, fontsize=TITLE_POINTS, loc="left")
    for side in ("top", "right", "left"):
        axes.spines[side].set_visible(False)


def draw_mask(axes, rollout: Rollout, tags: TagIds):
    """On `axes`: the Unseen mask of prompt + response (mask_picture), the prompt marked off."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    picture = mask_picture(rollout, tags)
    axes.imshow(picture.numpy(), cmap=ListedColormap(MASK_COLOURS), vmin=0,
                vmax=len(MASK_COLOURS) - 1, interpolation="nearest")
    prompt_length = len(rollout.prompt_ids)
    axes.axhline(prompt_length - HALF_CELL, color="#666666", linewidth=0.5)
    axes.axvline(prompt_length - HALF_CELL, color="#666666", linewidth=0.5)
    axes.set_title("Unseen mask (row: query, column: key)", fontsize=TITLE_POINTS)
    axes.set_xlabel(f"prompt: tokens 0-{prompt_length - 1}, then the response",
                    fontsize=AXIS_POINTS)
    axes.legend(handles=[Patch(color=MASK_COLOURS[VISIBLE], label="visible"),
                         Patch(color=MASK_COLOURS[UNSEEN_HIDDEN],
                               label="hidden by Unseen (a sibling path)")],
                fontsize=LABEL_POINTS, loc="upper right")


def draw(rollout: Rollout, tokenizer, mode: str, title: str, out: str) -> str:
    """Draw `rollout` (its response against the decode step, and its Unseen mask) into the PNG
    `out`; returns `out`. SystemExit with the install command without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("drawing needs matplotlib, an optional dependency: pip install "
                         "matplotlib  (or pip install -r requirements-extra.txt)") from None
    tags = TagIds.from_tokenizer(tokenizer)
    labels = glyphs(rollout.response_ids, tags, tokenizer)
    num_lanes = 1 + max(lanes(rollout.structure), default=0)
    timeline_inches = max(MIN_TIMELINE_INCHES, CELL_INCHES * (rollout.structure.length + 2))
    height = max(MASK_INCHES, LANE_INCHES * (num_lanes + 3)) + MARGIN_INCHES
    width = timeline_inches + MASK_INCHES + MARGIN_INCHES
    figure, axes = plt.subplots(1, 2, figsize=(width, height),
                                gridspec_kw={"width_ratios": [timeline_inches, MASK_INCHES]})
    draw_timeline(axes[0], rollout, labels, mode, title)
    draw_mask(axes[1], rollout, tags)
    figure.tight_layout()
    figure.savefig(out, dpi=DPI)
    plt.close(figure)
    return out


def first_with_a_block(rollouts: list[Rollout]) -> int:
    """The index of the first well-formed rollout with a parallel block, else 0."""
    for i, rollout in enumerate(rollouts):
        if rollout.structure.valid and rollout.structure.blocks:
            return i
    return 0


def main(argv: list[str]) -> str:
    """Sample, pick, draw; returns the PNG's path."""
    cfg = config.parse(DrawConfig, argv)
    checkpoint = resolve_checkpoint(cfg.model)
    saved_mode = None
    if os.path.isdir(checkpoint):
        saved_mode = mode_from_config(read_checkpoint_config(checkpoint)[0])
    mode = cfg.mode or saved_mode or "unseen"
    model, tokenizer = load_model(checkpoint)
    if cfg.max_new_tokens is None:
        cfg = dataclasses.replace(cfg, max_new_tokens=DRAW_BUDGET)
    sampling = cfg.sampling_config(seed=cfg.seed, allow_parallel=mode != "sequential")
    prompt = cfg.prompt.replace("\\n", "\n")
    rollouts = generate(model, tokenizer, [prompt], group_size=cfg.n, mode=mode,
                        sampling=sampling)
    chosen = first_with_a_block(rollouts)
    shown_model = os.path.relpath(checkpoint, ROOT) if os.path.isdir(checkpoint) else checkpoint
    title = (f"{prompt.strip()!r}   {shown_model}, {mode}, sample {chosen + 1} of {cfg.n} "
             f"(seed {cfg.seed}, T = {sampling.temperature}), {rollouts[chosen].finish_reason}")
    return draw(rollouts[chosen], tokenizer, mode, title, cfg.out)


if __name__ == "__main__":
    try:
        print(main(sys.argv[1:]))
    except (OSError, ValueError) as e:              # bad input: the message says what to do
        sys.exit(f"draw_rollout.py: error: {e}")
