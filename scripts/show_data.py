"""Problems, prompts and traces of a data spec, and their lengths: python scripts/show_data.py --show=synthetic:hard --n=2

    python scripts/show_data.py --show=synthetic:easy --style=sequential
    python scripts/show_data.py --show=parallel_gsm8k --n=1
"""
import os
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the core modules

import config  # noqa: E402
from data import Style, build_prompt, load_data  # noqa: E402
from model import TAGS, build_char_tokenizer  # noqa: E402

@dataclass
class ShowConfig:
    """python scripts/show_data.py --show=synthetic:hard --n=2: problems, prompts, traces, lengths."""
    show: str = "synthetic:easy"       # a load_data spec
    style: Style = "parallel"
    n: config.NonNegativeInt = 3       # records printed
    seed: config.Seed = 0
    limit: config.NonNegativeInt = 0   # records for the length statistics (0: all; synthetic: 2000)
    data_dir: str = ""

def main(argv: list[str]) -> None:
    cfg = config.parse(ShowConfig, argv)                    # --n=-1 once printed all records
    tok = build_char_tokenizer()
    synthetic = all(n.strip().startswith("synthetic:") for n in cfg.show.split(","))
    records = load_data(cfg.show, style=cfg.style, limit=cfg.limit or (2000 if synthetic else None), seed=cfg.seed,
                        data_dir=cfg.data_dir or None)
    for r in records[:cfg.n]:
        print(f"--- {r['id']}  (answer {r['answer']})\n{build_prompt(tok, r['problem'], cfg.style)}"
              + (r["solution"] or "(no solution)"))
    tokens = lambda text: len(text) - sum(text.count(t) * (len(t) - 1) for t in TAGS)  # noqa: E731  (tiny tokens)
    resp = [tokens(r["solution"]) for r in records if r["solution"]]
    full = [tokens(build_prompt(tok, r["problem"], cfg.style) + r["solution"]) for r in records if r["solution"]]
    print(f"--- {len(records)} records" + (f"; tiny-tokenizer tokens per response mean {sum(resp) / len(resp):.1f} max "
                                            f"{max(resp)}, prompt+response mean {sum(full) / len(full):.1f} max "
                                            f"{max(full)}" if resp else ""))

if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except BrokenPipeError:                        # e.g. `python scripts/show_data.py ... | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError) as e:
        sys.exit(f"show_data.py: error: {e}")
