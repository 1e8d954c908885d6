"""A few responses of a checkpoint, each block laid out: main-chain text as written, each path on its own line.

    python scripts/show_samples.py --model=runs/sft/checkpoint-400 [--prompt="Which two of 4 9 5 1 make 9?\\n"] [--n=3]
"""
import os
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the core modules

import config  # noqa: E402
from model import Mode, load_model, mode_from_config, read_checkpoint_config  # noqa: E402
from sample import Rollout, generate  # noqa: E402


PROBLEMS = ("Which two of 4 9 5 1 make 9?", "Which two of 3 1 2 8 6 make 5?", "Which two of 4 6 8 3 5 9 make 8?")

@dataclass
class SampleConfig:
    """python scripts/show_samples.py --model=<checkpoint>: sample a few responses and print their paths."""
    model: str = "tiny"                    # a checkpoint folder, a hub name, or tiny (random weights)
    prompt: str = ""                       # the prompt text as the model reads it; "" = three synthetic problems
    n: int = 3                             # responses per prompt
    mode: Mode | None = None               # None = the checkpoint's training mode, else unseen
    max_new_tokens: int = 128
    temperature: float = 1.0
    seed: int = 0

def layout(rollout: Rollout, tokenizer) -> str:
    """A response laid out: main-chain text as written, each block's paths indented one per line, its summary
    (tags and EOS dropped; a newline inside a path or a summary shows as \\n)."""
    ids = rollout.response_ids
    text = lambda a, b: tokenizer.decode(ids[a:b], skip_special_tokens=True)  # noqa: E731
    line = lambda a, b: text(a, b).replace("\n", "\\n")  # noqa: E731
    out, i = [], 0
    for b in rollout.structure.blocks:
        out += [text(i, b.start).strip("\n"), "<Parallel>"] + [f"    <Path> {line(s, e)}" for s, e in b.paths]
        out += [f"<Summary> {line(*b.summary)}"] if b.summary else []
        i = b.summary[1] if b.summary else b.end + 1 if b.end is not None else \
            max([b.start + 1] + [e for _, e in b.paths])
    return "\n".join(x for x in out + [text(i, len(ids)).strip("\n")] if x)

def main(argv: list[str]) -> None:
    cfg = config.parse(SampleConfig, argv)
    mode = cfg.mode or mode_from_config(read_checkpoint_config(cfg.model)[0]) or "unseen"
    model, tokenizer = load_model(cfg.model)
    prompts = [cfg.prompt] if cfg.prompt else [p + "\n" for p in PROBLEMS]   # the tiny model's prompt layout
    rollouts = generate(model, tokenizer, prompts, group_size=cfg.n, mode=mode, max_new_tokens=cfg.max_new_tokens,
                        temperature=cfg.temperature, seed=cfg.seed)
    for j, r in enumerate(rollouts):
        if j % cfg.n == 0:
            print(f"=== {prompts[r.prompt_index]!r} ({cfg.model}, mode {mode})")
        print(f"--- sample {j % cfg.n + 1}: {r.finish_reason}, {r.num_tokens} tokens, critical path {r.critical_path}, "
              f"{len(r.structure.blocks)} block(s){'' if r.structure.valid else ', malformed: ' + r.structure.reason}")
        print(layout(r, tokenizer))

if __name__ == "__main__":
    main(sys.argv[1:])
