"""Data: prompts, the embedded synthetic task, and loaders for the real math sets (PAPER_NOTES §3).

Every loader returns the same records, one dict per problem:

    {"id": "synthetic:hard-0",
     "problem": "Ava has 3 boxes of 7 pens and 4 bags of 6 pens. Ben has ... How many pens in all?",
     "answer": "67",                 # gold answer as a string, normalised (see `normalize_answer`)
     "solution": "<Parallel>...Final Answer: 67" or None,   # SFT target, tags as text, no EOS
     "source": "synthetic:hard"}

Names accepted by `load_data` and by every script's data option (`KNOWN_DATASETS`):

    synthetic:easy        embedded word problems, easy split, train part   (cold-start SFT)
    synthetic:hard        embedded word problems, hard split, train part   (RL)
    synthetic:easy:test   ... test part (evaluation; disjoint from every train part)
    synthetic:hard:test
    gsm8k:train           GSM8K, 7473 problems (answers from "#### N", commas removed)
    gsm8k:test            GSM8K, 1319 problems
    dapo                  DAPO-Math-17k as deduplicated by the Parallel-R1 authors, 17917 rows
    math500               MATH-500, LaTeX answers kept as LaTeX
    aime24, aime25        AIME 2024 / 2025, 30 each ("025" -> "25")
    amc23                 AMC 2023, 40 (27.0 -> "27")
    parallel_gsm8k        Parallel-GSM8K cold-start traces (PAPER_NOTES §3.1), canonicalised and filtered
    a,b,...               a comma list: the records of each, concatenated
    path/to/file.jsonl    any .jsonl / .json / .parquet file with a problem and an answer per row

Where the real sets come from: a local folder laid out like the project's shared data folder
(`gsm8k/test.jsonl`, `math500/test.jsonl`, `parallel_gsm8k/train.parquet`, ... see `KNOWN_DATASETS`),
taken from the `data_dir` argument (`--data_dir=` on the command line), else the environment variable
PARALLEL_R1_DATA, else `../shared/data` next to this repository when that folder exists. A set that has no
local file is fetched with `datasets.load_dataset` from the hub names in `KNOWN_DATASETS`.

Look at any of them:

    python data.py --show synthetic:hard                    # a few problems with their traces, and sizes
    python data.py --show synthetic:easy --style=sequential
    python data.py --show parallel_gsm8k --n=1
    python data.py --failures=runs/eval/x/samples.jsonl   # where hard synthetic answers go wrong
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import random
import re
import sys
from dataclasses import dataclass

# ----------------------------------------------------------------------------------------------------
# Prompts (PAPER_NOTES §3.4)
#
# The paper's exact "v3" text is in PAPER_NOTES §3.4; to reproduce it word for word, save it to a file
# (with `{problem}` or `{Problem}` where the problem goes) and pass `prompt_file=`. The templates below
# ask for the same things in our own words. Tags in a prompt are ordinary prompt tokens: the prompt is
# never parsed for structure (PAPER_NOTES §8.2.1).

PARALLEL_TEMPLATE = """\
Solve the problem below step by step.
Whenever a step would profit from several independent lines of thought, open a parallel block there with <Parallel>.
Inside a block, write at least two reasoning paths, each between <Path> and </Path>. The paths are written at the \
same time and independently of each other, so none of them may mention another path or depend on their order.
Close the block with </Parallel> and follow it at once with a short summary of what the paths found, between \
<Summary> and </Summary>.
Use as many blocks as the problem needs, wherever they help, without announcing them.
End with a line of the form "Final Answer: <answer>".

Problem: {problem}"""

SEQUENTIAL_TEMPLATE = """\
{problem}
Think step by step, then give the result on a last line of the form "Final Answer: <answer>"."""

# The tiny character model reads one token per character and has a short context, so it gets one line
# of instruction (it learns the format from SFT, not from the instruction).
SHORT_PARALLEL_TEMPLATE = "Use parallel paths.\n{problem}\n"
SHORT_SEQUENTIAL_TEMPLATE = "Think step by step.\n{problem}\n"

# A tokenizer with fewer entries than this is the tiny character tokenizer of `model.py` (105 entries);
# every real subword tokenizer has tens of thousands.
TINY_VOCAB_LIMIT = 1000

STYLES = ("parallel", "sequential", "sum-in-summary", "decompose")   # trace styles, see `render_trace`
_PLACEHOLDER = re.compile(r"\{problem\}|\{Problem\}")


def build_prompt(tokenizer, problem: str, style: str = "parallel", prompt_file: str | None = None) -> str:
    """The prompt text for one problem, ready to tokenize (the response starts right after it).

    Template: `prompt_file` if given (any text with `{problem}` or `{Problem}` where the problem goes),
    else the short one-line variant when the tokenizer is the tiny character one
    (`len(tokenizer) < TINY_VOCAB_LIMIT`), else `PARALLEL_TEMPLATE` / `SEQUENTIAL_TEMPLATE`.
    `style` "sequential" picks the sequential prompt; "parallel" and the other parallel trace styles
    ("sum-in-summary", "decompose") pick the parallel one. When the tokenizer has a chat template, the text is the
    user message and the template is applied with `add_generation_prompt=True` (PAPER_NOTES §3.4);
    otherwise the text is returned as it is.

    Example (tiny tokenizer): build_prompt(tok, "Ava has 3 boxes of 7 pens ... in all?")
        -> "Use parallel paths.\\nAva has 3 boxes of 7 pens ... in all?\\n"
    Example (Qwen3 tokenizer): "<|im_start|>user\\nSolve the problem below step by step. ...
        Problem: Ava has ...<|im_end|>\\n<|im_start|>assistant\\n"

    Raises ValueError for an unknown style or a prompt file without a placeholder,
    FileNotFoundError for a missing prompt file.
    """
    if style not in STYLES:
        raise ValueError(f"unknown style {style!r}; use one of {STYLES}")
    sequential = style == "sequential"
    if prompt_file is not None:
        if not os.path.isfile(prompt_file):
            raise FileNotFoundError(f"prompt file not found: {prompt_file}")
        with open(prompt_file, encoding="utf-8") as f:
            template = f.read()
        if not _PLACEHOLDER.search(template):
            raise ValueError(f"prompt file {prompt_file} has no {{problem}} placeholder; "
                             "write {problem} where the problem text goes")
    elif len(tokenizer) < TINY_VOCAB_LIMIT:
        template = SHORT_SEQUENTIAL_TEMPLATE if sequential else SHORT_PARALLEL_TEMPLATE
    else:
        template = SEQUENTIAL_TEMPLATE if sequential else PARALLEL_TEMPLATE
    text = _PLACEHOLDER.sub(lambda _: problem, template)   # a function: the problem is never re-parsed
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return text


# ----------------------------------------------------------------------------------------------------
# The embedded synthetic task
#
# GSM8K-style word problems with small numbers whose work splits into independent sub-computations:
#
#   "Ava has 3 boxes of 7 pens and 4 bags of 6 pens. Ben has 2 jars of 5 pens and 3 cups of 4 pens.
#    How many pens in all?"
#
# Each person ("group") gets one parallel block. Both paths of a block work out that person's products,
# each in its own order; the summary adds them; the main chain adds the group totals:
#
#   <Parallel><Path>3*7=21,4*6=24</Path><Path>4*6=24,3*7=21</Path></Parallel>
#   <Summary>21+24=45</Summary>
#   <Parallel><Path>2*5=10,3*4=12</Path><Path>3*4=12,2*5=10</Path></Parallel>
#   <Summary>10+12=22</Summary>
#   45+22=67
#   Final Answer: 67
#
# (every line break shown is a "\n" of the text; the one after </Parallel> is the canonical one of
# PAPER_NOTES §1.3, the others are main-chain text.)
#
# Why not one path per product? The sampler draws every path of a block from the same context (the
# prefix plus <Path>, at the same positions; PAPER_NOTES §1.4), so two paths are two independent draws
# from one distribution: nothing tells path 2 that it is the second. If each path had to do a different
# product, the two draws would pick the same product about half the time at T=1, and always under greedy
# decoding, and the summary would miss a number. So here every path carries the whole sub-step; the
# paths differ in order only. That style is still available as "decompose" for comparison.
#
# What makes it hard (TASK_NOTES): the multiplications are easy for the tiny model; the additions are not
# (two-term sums are learnable, three-term sums are not). So every addition here has two terms, and the
# hard split is the easy skills recombined: two blocks of two paths, a two-term sum in each summary, and
# one more two-term sum in the main chain. The easy split is 93% one-block problems and 7% two-block
# ones, so the hard format is seen in SFT but its one new skill is rare there: the final sum of two
# person totals, the only addition whose result can reach two digits (6+8=14). After SFT that sum is
# where a hard problem fails most (a third of the samples at T = 1, off by one: 13 for 6+7), a few
# positions whose distribution RL can sharpen; see README "The synthetic task" for the numbers.

NAMES = ("Ava", "Ben", "Cal", "Dan", "Eli", "Fay", "Gus", "Ida", "Jo", "Kim",
         "Leo", "Max", "Mia", "Ned", "Pam", "Ray", "Sam", "Tom", "Una", "Zoe")
ITEMS = ("pens", "beads", "cards", "coins", "rocks", "shells", "stamps", "marbles")
CONTAINERS = ("boxes", "bags", "jars", "packs", "cups", "bins", "tins", "trays")


@dataclass(frozen=True)
class Difficulty:
    """One kind of synthetic problem.

    groups: people in the problem = parallel blocks in the trace (a sum of group totals ends the
        main chain when there are 2 or more).
    parts: container kinds per person = products per path = terms of the summary's sum (>= 2).
    low, high: range of every count and every container size, inclusive (products <= high**2).
    max_total: redraw a person's numbers until their total is <= max_total (0 = no limit); with 9,
        every sum in a summary is a one-digit addition fact.
    """

    groups: int = 1
    parts: int = 2
    low: int = 2
    high: int = 9
    max_total: int = 0              # each person's total stays <= this (0 = no limit)

    def __post_init__(self):
        if self.groups < 1 or self.parts < 2 or not 1 <= self.low <= self.high:
            raise ValueError(f"bad Difficulty {self}: need groups >= 1, parts >= 2, 1 <= low <= high")
        if self.groups > len(NAMES) or self.parts > len(CONTAINERS):
            raise ValueError(f"bad Difficulty {self}: at most {len(NAMES)} groups and {len(CONTAINERS)} parts")


# All knobs of the synthetic task, in one place. A split is a mixture of difficulties (weight, kind).
# Chosen so that every sum has two terms and stays small (TASK_NOTES); tune here.
SYNTHETIC_SPLITS: dict[str, tuple[tuple[float, Difficulty], ...]] = {
    "easy": ((0.93, Difficulty(groups=1, parts=2, low=1, high=4, max_total=9)),   # one block
             (0.07, Difficulty(groups=2, parts=2, low=1, high=4, max_total=9))),  # the hard format
    "hard": ((1.00, Difficulty(groups=2, parts=2, low=1, high=4, max_total=9)),),  # two blocks + final sum <= 18
}
# Measured with the tiny model (README, "The synthetic task"): products are learnt almost at once;
# the two-term additions in the summaries are what limits accuracy, so operands stay small.
SYNTHETIC_TEST_BUCKETS = 5         # 1 in 5 number patterns belongs to the test parts, the rest to train
SYNTHETIC_SIZES = {"train": 20_000, "test": 500}   # records per part when `limit` is not given


@dataclass(frozen=True)
class WordProblem:
    """A generated problem. `groups[g]` = ((count, size), ...) of person g, in the order of the text."""

    text: str
    groups: tuple[tuple[tuple[int, int], ...], ...]

    @property
    def group_totals(self) -> list[int]:
        return [sum(c * s for c, s in parts) for parts in self.groups]

    @property
    def answer(self) -> int:
        return sum(self.group_totals)


def _singular(noun: str) -> str:
    """boxes -> box, pens -> pen (enough for the nouns of this task)."""
    return noun[:-2] if noun.endswith("xes") else noun[:-1]


def make_problem(rng: random.Random, difficulty: Difficulty) -> WordProblem:
    """Draw one problem of the given difficulty with `rng`.

    Example: Difficulty(groups=1, parts=2) ->
        WordProblem(text="Ava has 3 boxes of 7 pens and 4 bags of 6 pens. How many pens in all?",
                    groups=(((3, 7), (4, 6)),))
    """
    d = difficulty
    item = rng.choice(ITEMS)
    names = rng.sample(NAMES, d.groups)
    sentences, groups = [], []
    for name in names:
        while True:
            parts = tuple((rng.randint(d.low, d.high), rng.randint(d.low, d.high)) for _ in range(d.parts))
            if not d.max_total or sum(c * s for c, s in parts) <= d.max_total:
                break
        phrases = [f"{c} {_singular(box) if c == 1 else box} of {s} {_singular(item) if s == 1 else item}"
                   for (c, s), box in zip(parts, rng.sample(CONTAINERS, d.parts))]
        listed = ", ".join(phrases[:-1]) + " and " + phrases[-1]
        sentences.append(f"{name} has {listed}.")
        groups.append(parts)
    sentences.append(f"How many {item} in all?")
    return WordProblem(text=" ".join(sentences), groups=tuple(groups))


def problem_key(groups) -> tuple:
    """The numbers of a problem with the order of the text forgotten (parts within a person, and the
    people, sorted). Two problems with the same key have the same sub-computations."""
    return tuple(sorted(tuple(sorted(tuple(p) for p in parts)) for parts in groups))


def is_test_problem(groups) -> bool:
    """Whether a problem's numbers belong to the test parts: a fixed hash of `problem_key`, so the
    train parts of every split and the test parts of every split never share a problem."""
    digest = hashlib.blake2b(repr(problem_key(groups)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % SYNTHETIC_TEST_BUCKETS == 0


def synthetic_problems(split: str, part: str = "train", n: int | None = None, seed: int = 0) -> list[WordProblem]:
    """`n` problems of split "easy"/"hard" (see `SYNTHETIC_SPLITS`), part "train" or "test".

    Deterministic: the same (split, part, n, seed) gives the same list on every machine (the random
    generator is seeded with a string, which Python hashes with SHA-512), and the first k problems of a
    longer list are the k problems of a shorter one. Number patterns repeat (the easy space is small);
    train and test never share one (`is_test_problem`).
    Raises ValueError for an unknown split or part.
    """
    if split not in SYNTHETIC_SPLITS:
        raise ValueError(f"unknown synthetic split {split!r}; known: {sorted(SYNTHETIC_SPLITS)}")
    if part not in SYNTHETIC_SIZES:
        raise ValueError(f"unknown synthetic part {part!r}; use 'train' or 'test'")
    n = SYNTHETIC_SIZES[part] if n is None else n
    mixture = SYNTHETIC_SPLITS[split]
    weights, kinds = [w for w, _ in mixture], [d for _, d in mixture]
    rng = random.Random(f"synthetic:{split}:{part}:{seed}")
    out, tries = [], 0
    while len(out) < n:
        tries += 1
        if tries > 100 * n + 10_000:
            raise ValueError(f"synthetic:{split}:{part}: the number space of {kinds} has too few "
                             f"{part} patterns; widen low/high")
        p = make_problem(rng, rng.choices(kinds, weights)[0])
        if is_test_problem(p.groups) == (part == "test"):
            out.append(p)
    return out


def _products(parts) -> list[str]:
    return [f"{c}*{s}={c * s}" for c, s in parts]


def _sum(values) -> str:
    return "+".join(str(v) for v in values) + f"={sum(values)}"


def _block(paths: list[str], summary: str) -> str:
    """One parallel block in the canonical layout the sampler produces (PAPER_NOTES §1.3)."""
    return "<Parallel>" + "".join(f"<Path>{p}</Path>" for p in paths) + f"</Parallel>\n<Summary>{summary}</Summary>"


def render_trace(problem: WordProblem, style: str = "parallel") -> str:
    """The target response of a synthetic problem, as text with tags and without EOS.

    Styles, for the problem "Ava has 3 boxes of 7 pens and 4 bags of 6 pens. How many pens in all?":
      parallel:   <Parallel><Path>3*7=21,4*6=24,21+24=45</Path><Path>4*6=24,3*7=21,24+21=45</Path></Parallel>
                  <Summary>45</Summary>\nFinal Answer: 45
                  (each path solves the person's whole sub-problem, in its own order -- the paper's
                  "verification" use; the summary states the agreed total)
      sequential: 3*7=21\n4*6=24\n21+24=45\nFinal Answer: 45      (the same steps, one chain, no tags)
      sum-in-summary: <Parallel><Path>3*7=21,4*6=24</Path><Path>4*6=24,3*7=21</Path></Parallel>
                  <Summary>21+24=45</Summary>\nFinal Answer: 45
                  (the paths only multiply, the summary adds. Under Unseen multiverse positions the two
                  paths' products sit at the *same* positions in swapped order, so the summary cannot tell
                  which operand it copies: measured, half of its sums used one product twice. Kept to
                  show that effect; see README "The synthetic task")
      decompose:  <Parallel><Path>3*7=21</Path><Path>4*6=24</Path></Parallel>
                  <Summary>21+24=45</Summary>\nFinal Answer: 45
                  (one path per product: needs paths that know their index, which the paper's
                  sampler does not give; see the note above `NAMES`)
    (one line break, the canonical "\\n" between </Parallel> and <Summary>, is shown as a new line.)
    With two or more people there is one block per person, "\\n" between blocks, and the line
    "45+22=67" (sum of the person totals) before the final line. Raises ValueError for an unknown style.
    """
    if style not in STYLES:
        raise ValueError(f"unknown style {style!r}; use one of {STYLES}")
    totals = problem.group_totals
    steps = []                                    # one entry per person: a block, or lines of work
    for parts, total in zip(problem.groups, totals):
        prods, values = _products(parts), [c * s for c, s in parts]
        if style == "sequential":
            steps.append("\n".join(prods + [_sum(values)]))
        elif style == "parallel":
            steps.append(_block([",".join(prods + [_sum(values)]),
                                 ",".join(prods[::-1] + [_sum(values[::-1])])], str(total)))
        elif style == "sum-in-summary":
            steps.append(_block([",".join(prods), ",".join(prods[::-1])], _sum(values)))
        else:  # decompose
            steps.append(_block(prods, _sum(values)))
    lines = ["\n".join(steps)]
    if len(totals) > 1:
        lines.append(_sum(totals))
    lines.append(f"Final Answer: {problem.answer}")
    return "\n".join(lines)



FAILURE_CLASSES = ("block total or count", "garbled final line", "final sum", "answer line", "other")
_PERSON_PARTS = re.compile(r"(\d+) \w+ of (\d+)")
_FINAL_LINES = re.compile(r"</Summary>\n(\d+)\+(\d+)=(\d+)\nFinal Answer: (\d+)$")


def classify_failure(problem: str, response: str) -> str:
    """Where a *wrong* response to a two-person synthetic problem went wrong, for error analysis
    (README, "Where RL starts"). Checks in order, the first that fails names the class:

      "block total or count"  not one <Summary> per person, or a summary that is not the person's total
      "garbled final line"    the text after the last summary is not "a+b=c\nFinal Answer: d"
      "final sum"             that line adds the wrong numbers or gets the sum wrong (13 for 6+7)
      "answer line"           the sum is right but the answer line says another number
      "other"                 none of these (e.g. a right answer the verifier did not accept)

    `problem` is the problem text (a prompt that contains it works too). Pure text matching, bounded
    by the response length; raises nothing.
    Example: classify_failure("Ava has 1 box of 4 pens and 1 bag of 2 pens. Ben has ... in all?",
                              "<Parallel>...<Summary>6</Summary>\n6+8=13\nFinal Answer: 13") -> "final sum"
    """
    persons = [s for s in problem.split(".") if " has " in s]
    totals = [sum(int(c) * int(n) for c, n in _PERSON_PARTS.findall(s)) for s in persons]
    summaries = [x.strip() for x in re.findall(r"<Summary>(.*?)</Summary>", response, flags=re.S)]
    if summaries != [str(t) for t in totals]:
        return "block total or count"
    m = _FINAL_LINES.search(response.strip())
    if not m:
        return "garbled final line"
    a, b, c, d = map(int, m.groups())
    if [a, b] != totals or c != a + b:
        return "final sum"
    return "answer line" if d != c else "other"

# ----------------------------------------------------------------------------------------------------
# Answers and problem texts of the real sets


def normalize_answer(value, latex: bool = False) -> str:
    """The gold answer as a plain string, with accidents of the source's format removed.

    Numbers: 27.0 -> "27" (AMC stores floats), "025" -> "25" (AIME zero-pads), "1,450" -> "1450"
    (GSM8K thousands separators), 70 -> "70". With `latex=True` (MATH-500) a string is only stripped of
    surrounding spaces: "\\frac{\\pi}{2}", "1,-2" and "0.15" stay as they are. Other strings are kept.
    """
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    s = str(value).strip()
    if latex:
        return s
    if re.fullmatch(r"[+-]?\d{1,3}(,\d{3})+", s):          # 1,450,000
        s = s.replace(",", "")
    if re.fullmatch(r"[+-]?\d+(\.0*)?", s):                 # 025, 27.0, -1.0
        return str(int(s.split(".")[0]))
    return s


def gsm8k_answer(text: str) -> str | None:
    """The final answer of a GSM8K solution, from its "#### N" line: "...\\n#### 1,450" -> "1450"."""
    m = re.search(r"####\s*(.+?)\s*$", text)
    return normalize_answer(m.group(1)) if m else None


def gsm8k_sequential_solution(text: str) -> str:
    """A GSM8K worked solution as a sequential SFT target: calculator notes dropped, the "#### N" line
    turned into "Final Answer: N".
    "She makes 9 * 2 = $<<9*2=18>>18.\\n#### 18" -> "She makes 9 * 2 = $18.\\nFinal Answer: 18"
    """
    body = re.sub(r"<<[^>]*>>", "", text)
    return re.sub(r"####\s*(.+?)\s*$", lambda m: f"Final Answer: {normalize_answer(m.group(1))}", body)


_BASELINE_SUFFIX = re.compile(r"\s*Let's think step by step and output the final answer after \"Final Answer: \"\.\s*$")


def extract_problem(text: str) -> str:
    """The bare problem inside an instruction prompt, or the text itself when there is no instruction.

    Handles the prompts of the sources we read (PAPER_NOTES §3.3-3.4):
      * Parallel-R1 v2/v3 instruction ... "Problem: <problem>"          -> the text after the last "Problem:"
      * "<problem> Let's think step by step and output the final answer after "Final Answer: "."
                                                                        -> the text before that sentence
      * DAPO's original "Solve the following math problem ... Answer: $Answer ...\\n\\n<problem>\\n\\nRemember ..."
                                                                        -> the paragraph between the first
                                                                           two blank lines
    Also repairs two JSON-escape accidents seen in AIME 2025: a form feed where "\\f" of "\\frac" was meant,
    and a tab where "\\t" of "\\triangle" was meant.
    """
    text = text.replace("\x0c", "\\f")
    text = re.sub(r"\t(?=riangle)", r"\\t", text)
    if "Final Answer" in text and re.search(r"(^|\n)Problem:", text):
        return re.split(r"(?:^|\n)Problem:", text)[-1].strip()
    if _BASELINE_SUFFIX.search(text):
        return _BASELINE_SUFFIX.sub("", text).strip()
    if text.startswith("Solve the following math problem") and text.count("\n\n") >= 2:
        return text.split("\n\n")[1].strip()
    return text.strip()


# ----------------------------------------------------------------------------------------------------
# Parallel traces from outside: canonical layout and validity (PAPER_NOTES §1.3, §3.1)

# The places where the sampler, not the model, writes the text: nothing between <Parallel> and the first
# <Path>, between paths, or after the last path; exactly one "\n" between </Parallel> and <Summary>.
_JUNCTIONS = ((re.compile(r"<Parallel>\s*<Path>"), "<Parallel><Path>"),
              (re.compile(r"</Path>\s*<Path>"), "</Path><Path>"),
              (re.compile(r"</Path>\s*</Parallel>"), "</Path></Parallel>"),
              (re.compile(r"</Parallel>\s*<Summary>"), "</Parallel>\n<Summary>"))
_TAG = re.compile(r"</?(?:Parallel|Path|Summary)>")


def canonicalize_trace(text: str) -> str:
    """Put the whitespace between structural tags in the sampler's layout; text inside paths, summaries
    and the main chain is the model's own and is kept, as in the official SFT targets
    (`extra_info.answer` of the Parallel-GSM8K parquet).

    "<Parallel>\\n<Path>\\nx\\n</Path>\\n<Path>y</Path>\\n</Parallel>\\n\\n<Summary>s</Summary>"
      -> "<Parallel><Path>\\nx\\n</Path><Path>y</Path></Parallel>\\n<Summary>s</Summary>"
    """
    for pattern, repl in _JUNCTIONS:
        text = pattern.sub(repl, text)
    return text.strip()


_TINY_TOKENIZER = None


def tiny_tokenizer():
    """The tokenizer of `load_model("tiny")` (characters plus the six tags): the default for checking
    traces. Built once (it builds the ~1M-parameter model too, about a second)."""
    global _TINY_TOKENIZER
    if _TINY_TOKENIZER is None:
        from model import load_model
        _TINY_TOKENIZER = load_model("tiny", device="cpu")[1]
    return _TINY_TOKENIZER


def check_trace(solution: str, tokenizer, tags) -> str:
    """"" when `solution` is a usable parallel SFT target, else why not: it must parse as a valid
    structure under `tokenizer` (`attention.parse_structure`, the one definition of the format) and end
    with a "Final Answer:" line. `tags`: `attention.TagIds` of the tokenizer. Token indices and tag ids
    in the reason are replaced by N, so that reasons group: "unclosed <Summary> at token N"."""
    from attention import parse_structure
    structure = parse_structure(tokenizer.encode(solution, add_special_tokens=False), tags)
    if not structure.valid:
        return re.sub(r"\d+", "N", structure.reason)
    if not re.search(r"Final Answer\s*:\s*\S", solution):
        return "no 'Final Answer:' line"
    return ""


# ----------------------------------------------------------------------------------------------------
# Known datasets: local file (relative to the data folder) and hub fallbacks (path, config, split)


@dataclass(frozen=True)
class Source:
    local: str | None                              # path inside the data folder (None: generated here)
    hub: tuple[tuple[str, str | None, str], ...]   # `datasets.load_dataset` candidates, tried in order
    latex_answers: bool = False                   # keep answers as LaTeX (no number clean-up)
    description: str = ""


KNOWN_DATASETS: dict[str, Source] = {
    "synthetic:easy": Source(None, (), description="embedded word problems, easy split, train part (cold-start SFT)"),
    "synthetic:hard": Source(None, (), description="embedded word problems, hard split, train part (RL)"),
    "synthetic:easy:test": Source(None, (), description="embedded word problems, easy split, test part"),
    "synthetic:hard:test": Source(None, (), description="embedded word problems, hard split, test part"),
    "gsm8k:train": Source("gsm8k/train.jsonl", (("openai/gsm8k", "main", "train"),), description="GSM8K train, 7473"),
    "gsm8k:test": Source("gsm8k/test.jsonl", (("openai/gsm8k", "main", "test"),), description="GSM8K test, 1319"),
    "dapo": Source("dapo_math_17k/train.parquet", (("Leo-Dai/dapo-math-17k_dedup", None, "train"),
                                                   ("BytedTsinghua-SIA/DAPO-Math-17k", None, "train")),
                   description="DAPO-Math-17k (Parallel-R1 dedup), 17917"),
    "math500": Source("math500/test.jsonl", (("HuggingFaceH4/MATH-500", None, "test"),), latex_answers=True,
                      description="MATH-500, 500, LaTeX answers"),
    "aime24": Source("aime24/test.jsonl", (("HuggingFaceH4/aime_2024", None, "train"),), description="AIME 2024, 30"),
    "aime25": Source("aime25/test.jsonl", (("math-ai/aime25", None, "test"),), description="AIME 2025, 30"),
    "amc23": Source("amc23/test.jsonl", (("math-ai/amc23", None, "test"),), description="AMC 2023, 40"),
    "parallel_gsm8k": Source("parallel_gsm8k/train.parquet", (("Parallel-R1/Parallel-GSM8K", None, "train"),),
                             description="Parallel-GSM8K cold-start traces"),
}
DATA_ENV = "PARALLEL_R1_DATA"


def default_data_dir() -> str | None:
    """$PARALLEL_R1_DATA if set, else ../shared/data next to this repository if it exists, else None."""
    env = os.environ.get(DATA_ENV)
    if env:
        return env
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "shared", "data")
    return here if os.path.isdir(here) else None


def _read_rows(path: str) -> list[dict]:
    """Rows of a .jsonl, .json (a list of objects, or JSON lines) or .parquet file."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"data file not found: {path}")
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq
        return pq.read_table(path).to_pylist()
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.endswith(".json") and text.lstrip().startswith("["):
        return json.loads(text)
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}, line {n}: not valid JSON ({e})") from None
    return rows


def _load_hub(name: str, source: Source, local_path: str | None) -> list[dict]:
    import datasets
    errors = []
    for path, config, split in source.hub:
        try:
            return [dict(r) for r in datasets.load_dataset(path, config, split=split)]
        except Exception as e:  # offline, missing, renamed: try the next candidate, then explain
            errors.append(f"{path}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    where = f"no local file {local_path}" if local_path else "no local data folder"
    raise FileNotFoundError(
        f"dataset {name!r}: {where}, and the hub could not give it ({'; '.join(errors)}). "
        f"Point --data_dir or ${DATA_ENV} at a folder holding {source.local}, or go online.")


def _first(row: dict, *keys):
    """The first non-empty value among `keys` ("a.b" reads row["a"]["b"])."""
    for key in keys:
        v = row
        for k in key.split("."):
            v = v.get(k) if isinstance(v, dict) else None
        if v is not None and v != "" and not (isinstance(v, float) and v != v):
            return v
    return None


def _row_record(row: dict, latex: bool, style: str) -> tuple[str | None, str | None, str | None]:
    """(problem, answer, solution) of one row, whatever the source's field names. A GSM8K worked
    solution becomes the solution only for the sequential style (it has no parallel blocks)."""
    prompt = _first(row, "problem", "question", "extra_info.question", "prompt")
    if isinstance(prompt, (list, tuple)):                 # chat messages: the last user turn
        users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        prompt = users[-1] if users else None
    problem = extract_problem(prompt) if isinstance(prompt, str) else None
    trace = _first(row, "extra_info.answer", "solution", "text")
    solution = trace if isinstance(trace, str) and re.search(r"Final Answer\s*:", trace) else None
    raw = _first(row, "reward_model.ground_truth", "ground_truth", "final_answer", "answer")
    answer = None
    if isinstance(raw, str) and re.search(r"Final Answer\s*:", raw):   # the "answer" field is a whole trace
        solution, raw = solution or raw, None
    if isinstance(raw, str) and "####" in raw:              # GSM8K: worked solution + "#### N"
        answer = gsm8k_answer(raw)
        if style == "sequential":
            solution = solution or gsm8k_sequential_solution(raw)
    elif raw is not None:
        answer = normalize_answer(raw, latex=latex)
    if answer is None and solution is not None:            # a trace without a separate gold answer
        found = re.findall(r"Final Answer\s*:\s*(.+)", solution)
        answer = normalize_answer(found[-1]) if found else None
    return problem, answer or None, solution


def _row_id(row: dict, label: str, i: int) -> str:
    """The row's own id prefixed with the dataset label ("aime24-60"), or the row number ("gsm8k:test-0")."""
    rid = _first(row, "unique_id", "id", "extra_info.index", "index")
    if rid is None:
        return f"{label}-{i}"
    return str(rid) if str(rid).startswith(label) else f"{label}-{rid}"


def _records_from_rows(rows, name: str, style: str, strict: bool, latex: bool, where: str, tokenizer) -> list[dict]:
    """Records of one dataset's rows: skip (or, strict, reject) incomplete rows, check parallel traces."""
    label = name if name in KNOWN_DATASETS else os.path.splitext(os.path.basename(name))[0]
    records, skipped = [], 0
    for i, row in enumerate(rows):
        problem, answer, solution = _row_record(row, latex, style)
        if not problem or not answer:
            if strict:
                raise ValueError(f"{where}, row {i}: no {'problem' if not problem else 'answer'} "
                                 f"(fields: {sorted(row)})")
            skipped += 1
            continue
        records.append({"id": _row_id(row, label, i), "problem": problem, "answer": answer,
                        "solution": solution, "source": name})
    if skipped:
        print(f"[data] {where}: skipped {skipped} of {len(rows)} rows without a problem or an answer", file=sys.stderr)
    tagged = any(r["solution"] and _TAG.search(r["solution"]) for r in records)
    if tagged and style == "sequential":
        raise ValueError(f"{where} holds parallel traces, not sequential ones; for a sequential SFT set use "
                         "e.g. gsm8k:train with style='sequential'")
    return _filter_parallel(records, where, tokenizer) if tagged else records


def _filter_parallel(records: list[dict], where: str, tokenizer) -> list[dict]:
    """Canonicalise every parallel trace, drop the ones `check_trace` rejects, print the counts."""
    from attention import TagIds
    tok = tokenizer if tokenizer is not None else tiny_tokenizer()
    tags = TagIds.from_tokenizer(tok)
    kept, reasons, traces, blockless = [], collections.Counter(), 0, 0
    for r in records:
        if r["solution"] and _TAG.search(r["solution"]):
            traces += 1
            r = dict(r, solution=canonicalize_trace(r["solution"]))
            why = check_trace(r["solution"], tok, tags)
            if why:
                reasons[why] += 1
                continue
        elif r["solution"]:
            blockless += 1
        kept.append(r)
    dropped = "; ".join(f"{n} x {why}" for why, n in reasons.most_common()) or "none"
    print(f"[data] {where}: {traces - sum(reasons.values())} of {traces} parallel traces pass the format "
          f"check, {blockless} more traces have no parallel block; dropped: {dropped}", file=sys.stderr)
    return kept


def _load_one(name: str, style: str, strict: bool, limit: int | None, seed: int,
              data_dir: str | None, tokenizer) -> list[dict]:
    name = name.strip()
    m = re.fullmatch(r"synthetic:(\w+)(?::(train|test))?", name)
    if m:
        split, part = m.group(1), m.group(2) or "train"
        if split not in SYNTHETIC_SPLITS:
            raise ValueError(f"unknown dataset {name!r}; known: {', '.join(KNOWN_DATASETS)}")
        problems = synthetic_problems(split, part, limit, seed)
        source = f"synthetic:{split}" + (":test" if part == "test" else "")
        return [{"id": f"{source}-{i}", "problem": p.text, "answer": str(p.answer),
                 "solution": render_trace(p, style), "source": source} for i, p in enumerate(problems)]
    if name in KNOWN_DATASETS:
        source = KNOWN_DATASETS[name]
        folder = data_dir or default_data_dir()
        if folder and not os.path.isdir(folder):      # only a folder named by the user can be missing
            raise FileNotFoundError(f"data folder not found: {folder} (from --data_dir or ${DATA_ENV})")
        local = os.path.join(folder, source.local) if folder else None
        if local and os.path.isfile(local):
            rows, where = _read_rows(local), local
        else:
            rows, where = _load_hub(name, source, local), f"{name} (hub)"
        latex = source.latex_answers
    elif name.endswith((".jsonl", ".json", ".parquet")) or os.sep in name or os.path.exists(name):
        rows, where, latex = _read_rows(name), name, False
    else:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(KNOWN_DATASETS)}, or a path to a "
                         ".jsonl/.json/.parquet file")
    records = _records_from_rows(rows, name, style, strict, latex, where, tokenizer)
    return records[:limit] if limit is not None else records


def load_data(spec: str, style: str = "parallel", strict: bool = False, limit: int | None = None,
              seed: int = 0, data_dir: str | None = None, tokenizer=None) -> list[dict]:
    """Load the records named by `spec` (see the module docstring for the names).

    Args:
        spec: a known name, a comma list of names, or a path to a .jsonl/.json/.parquet file.
        style: trace style of `solution` (`STYLES`). Synthetic sets render every style; real sets give a
            solution only where they have one in that style (GSM8K: "sequential", from its worked
            solutions; Parallel-GSM8K: "parallel"), else `solution` is None.
        strict: raise on a row without a problem or an answer instead of skipping (and counting) it.
        limit: at most this many records from each part of a comma list (the first ones, in file order;
            synthetic: that many generated).
        seed: synthetic sets only: the generator seed.
        data_dir: folder of local files (else $PARALLEL_R1_DATA, else ../shared/data next to the repo).
        tokenizer: for the format check of parallel traces from files (default: the tiny tokenizer).
    Returns:
        list of {"id", "problem", "answer", "solution", "source"} dicts.
    Raises:
        ValueError: unknown name (the message lists the known ones), unknown style, empty result, a
            sequential style asked of a parallel-trace set, or (strict) a bad row.
        FileNotFoundError: a file or data folder that does not exist (named), or a known set with neither a
            local file nor hub access.
    """
    if style not in STYLES:
        raise ValueError(f"unknown style {style!r}; use one of {STYLES}")
    records = []
    for name in spec.split(","):
        if name.strip():
            records += _load_one(name, style, strict, limit, seed, data_dir, tokenizer)
    if not records:
        raise ValueError(f"{spec!r} gave no records")
    return records


def format_response(record: dict) -> str:
    """The SFT target of a record (its `solution`). SFT appends EOS itself.
    Raises ValueError when the record has none (e.g. an evaluation set)."""
    if not record.get("solution"):
        raise ValueError(f"record {record.get('id')!r} has no solution to train on; SFT needs "
                         "synthetic:*, parallel_gsm8k, or gsm8k:train with style='sequential'")
    return record["solution"]


# ----------------------------------------------------------------------------------------------------
# Command line: python data.py --show synthetic:hard [--style=sequential] [--n=3] [--seed=0] [--data_dir=...]
#               python data.py --failures=runs/eval_x/samples.jsonl


@dataclass
class ShowConfig:
    """python data.py --show=synthetic:hard --n=2: print problems, prompts and traces of a data spec.
    python data.py --failures=runs/eval/x: where an eval.py run's hard synthetic answers go wrong."""
    show: str = "synthetic:easy"
    style: str = "parallel"
    n: int = 3                 # records printed
    seed: int = 0
    limit: int = 0             # records loaded for the size statistics (0: all; synthetic: 2000)
    data_dir: str = ""
    failures: str = ""         # an eval.py samples.jsonl or its folder: count `classify_failure` classes


def failure_table(samples_path: str) -> str:
    """`python data.py --failures=runs/eval_x/samples.jsonl` (or the folder): per synthetic benchmark of
    an eval.py samples file, the share of samples right and of each `classify_failure` class, one line each.
    Raises FileNotFoundError for a missing file, ValueError when it has no synthetic two-person samples."""
    if os.path.isdir(samples_path):                # an eval.py output folder
        samples_path = os.path.join(samples_path, "samples.jsonl")
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    with open(samples_path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{samples_path}, line {number}: not JSON ({e.msg}); pass an eval.py "
                                 "samples.jsonl or its folder") from None
            if not (isinstance(r, dict) and isinstance(r.get("correct"), bool)
                    and all(isinstance(r.get(k), str) for k in ("benchmark", "prompt", "response"))):
                raise ValueError(f"{samples_path}, line {number}: not an eval.py sample (needs benchmark, "
                                 "prompt, response and correct); pass an eval.py samples.jsonl or its folder")
            if r["benchmark"].startswith("synthetic:") and r["prompt"].count(" has ") == 2:
                cls = "right" if r["correct"] else classify_failure(r["prompt"], r["response"])
                counts[r["benchmark"]][cls] += 1
    if not counts:
        raise ValueError(f"{samples_path} has no samples of two-person synthetic problems (synthetic:hard:test)")
    lines = []
    for bench, c in counts.items():
        n = sum(c.values())
        parts = ", ".join(f"{k} {100 * c[k] / n:.1f}%" for k in ("right",) + FAILURE_CLASSES)
        lines.append(f"{bench} ({n} samples): {parts}")
    return "\n".join(lines)


def tiny_token_count(text: str) -> int:
    """Tokens of `text` under the tiny tokenizer: one per character, one per tag."""
    return len(_TAG.sub("#", text))


def main(argv: list[str]) -> None:
    from sft import parse_config
    cfg = parse_config(ShowConfig, argv)
    if cfg.failures:
        print(failure_table(cfg.failures))
        return
    if cfg.n < 0 or cfg.limit < 0:
        raise ValueError("--n and --limit must be >= 0")
    from model import build_char_tokenizer
    char_tok = build_char_tokenizer()
    synthetic = all(n.strip().startswith("synthetic:") for n in cfg.show.split(","))
    limit = cfg.limit or (2000 if synthetic else None)
    records = load_data(cfg.show, style=cfg.style, limit=limit, seed=cfg.seed, data_dir=cfg.data_dir or None)
    for r in records[:cfg.n]:
        print(f"--- {r['id']}  (answer {r['answer']})")
        print(build_prompt(char_tok, r["problem"], cfg.style), end="")
        print(r["solution"] if r["solution"] else "(no solution)")
    with_sol = [r for r in records if r["solution"]]
    full = [tiny_token_count(build_prompt(char_tok, r["problem"], cfg.style) + r["solution"]) for r in with_sol]
    resp = [tiny_token_count(r["solution"]) for r in with_sol]
    print(f"--- {len(records)} records", end="")
    if with_sol:
        print(f"; tiny-tokenizer tokens per response mean {sum(resp) / len(resp):.1f} max {max(resp)}, "
              f"prompt+response mean {sum(full) / len(full):.1f} max {max(full)}")
    else:
        print()


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except BrokenPipeError:                        # e.g. `python data.py --show=... | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError) as e:
        sys.exit(f"data.py: error: {e}")
