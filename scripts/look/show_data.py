"""Problems, prompts and traces of a data spec, and their lengths:

    python scripts/look/show_data.py --show=synthetic:hard --n=2
    python scripts/look/show_data.py --show=synthetic:easy --style=sequential
    python scripts/look/show_data.py --show=carry:hard --max_paths=4 --parallel_fraction=1.0
    python scripts/look/show_data.py --show=parallel_gsm8k --n=1 --preset=paper
"""
import os
import sys
from dataclasses import dataclass
from typing import Annotated, Literal

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))   # two folders up
sys.path.insert(0, ROOT)   # the core modules

import config
from data import Style, build_prompt, load_data, prompt_style_of
from model import TAGS, build_char_tokenizer

SYNTHETIC_STATS_LIMIT = 2000     # synthetic records counted for the lengths when --limit=0


@dataclass
class ShowConfig:
    """show_data.py --show=synthetic:hard --n=2: problems, prompts, traces, lengths."""
    show: str = "synthetic:easy"       # a load_data spec
    style: Style = "parallel"
    preset: Literal["tiny", "paper"] = "tiny"   # whose prompt: tiny's is the bare problem
    parallel_fraction: config.UnitInterval = 0.5   # synthetic traces: the chance of a block
    max_paths: Annotated[int, config.Range(low=2)] = 2   # synthetic: the widest block
    n: config.NonNegativeInt = 3       # records printed
    seed: config.Seed = 0
    limit: config.NonNegativeInt = 0   # records for the length statistics (0: all; synthetic: 2000)
    data_dir: str = ""


def tiny_tokens(text: str) -> int:
    """The length of `text` in the character tokenizer's tokens (each tag is one)."""
    return len(text) - sum(text.count(t) * (len(t) - 1) for t in TAGS)


def main(argv: list[str]) -> None:
    cfg = config.parse(ShowConfig, argv)                    # refuses --n=-1 (NonNegativeInt)
    tok = build_char_tokenizer()
    synthetic = all(n.strip().startswith(("synthetic:", "carry:")) for n in cfg.show.split(","))
    default_limit = SYNTHETIC_STATS_LIMIT if synthetic else None
    records = load_data(cfg.show, style=cfg.style, limit=cfg.limit or default_limit, seed=cfg.seed,
                        data_dir=cfg.data_dir or None, parallel_fraction=cfg.parallel_fraction,
                        max_paths=cfg.max_paths)
    prompt_style = prompt_style_of(cfg.preset, cfg.style)
    for r in records[:cfg.n]:
        prompt = build_prompt(tok, r["problem"], prompt_style)
        solution = r["solution"]
        if not solution and r.get("worked_solution"):
            solution = f"(no trace to train on; the file's solution:)\n{r['worked_solution']}"
        if not solution:
            solution = "(no solution in the file)"
        separator = "" if prompt.endswith("\n") else "\n"      # the paper's template ends bare
        print(f"--- {r['id']}  (answer {r['answer']})\n{prompt}{separator}{solution}")
    solved = [r for r in records if r["solution"]]
    resp = [tiny_tokens(r["solution"]) for r in solved]
    full = [tiny_tokens(build_prompt(tok, r["problem"], prompt_style) + r["solution"])
            for r in solved]
    lengths = ""
    if resp:
        lengths = (f"; tiny-tokenizer tokens per response mean {sum(resp) / len(resp):.1f} max "
                   f"{max(resp)}, prompt+response mean {sum(full) / len(full):.1f} max {max(full)}")
    print(f"--- {len(records)} records{lengths}")


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except BrokenPipeError:                   # e.g. `python scripts/look/show_data.py ... | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError) as e:
        sys.exit(f"show_data.py: error: {e}")
