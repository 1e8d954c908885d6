"""NOTES.md §2's worked example: its Seen and Unseen positions and the Unseen mask, from
attention.py.

    python scripts/look/show_mask.py
"""
import os
import sys

if {"-h", "--help"} & set(sys.argv[1:]):
    sys.exit(print(__doc__))   # print returns None: exit status 0
if sys.argv[1:]:
    given = " ".join(sys.argv[1:])
    sys.exit(f"show_mask.py takes no arguments (got {given}):\n{__doc__}")
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))   # two folders up
sys.path.insert(0, ROOT)   # the core modules

import torch

from attention import TagIds, build_mask_and_positions, parse_structure

tags = TagIds(100, 101, 102, 103, 104, 105, newline=(106,), eos=107)
response = [4, 100, 102, 5, 6, 103, 102, 7, 103, 101, 106, 104, 8, 105, 9, 107]
labels = ["q0", "q1", "q2", "a", "<P>", "<A>", "x1", "x2", "</A>", "<A>", "y1", "</A>", "</P>",
          "\\n", "<S>", "s1", "</S>", "b", "eos"]
ids = torch.tensor([[1, 2, 3] + response])
for mode in ("seen", "unseen"):
    mask, pos = build_mask_and_positions(ids, [3], torch.ones_like(ids), tags, mode)
    print(f"{mode:>7} positions: " + " ".join(f"{p:>4}" for p in pos[0].tolist()))
print("         tokens:    " + " ".join(f"{t:>4}" for t in labels))
print("\nUnseen mask ('1': the row's token attends to the column's; Seen is the full lower "
      "triangle):")
print("      " + "".join(f"{t:>5}" for t in labels))
for i, t in enumerate(labels):
    marks = ["1" if mask[0, 0, i, j] == 0 else "." for j in range(len(labels))]
    print(f"{t:>5} " + "".join(f"{m:>5}" for m in marks))
s = parse_structure(response, tags)
blocks = [(b.start, b.paths, b.end, b.summary) for b in s.blocks]
print(f"\nparse_structure: valid={s.valid}, blocks={blocks}")
