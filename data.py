"""Data: prompts, the embedded synthetic task (NOTES.md §9), and loaders for the real math sets
(NOTES.md §6).

Every loader returns one dict per problem: {"id", "problem", "answer", "solution" (the SFT target
with the tags as text, no EOS; or None), "source"}, and for the real sets "worked_solution" (the
file's own, GSM8K's or MATH's, or None: shown by show_data.py, trained on only as GSM8K's
sequential traces). `load_data` takes synthetic:easy / :medium / :hard (4, 5, 6 numbers;
":rl", ":val" and ":test": the disjoint parts of RL's, the validation and the held-out test
number patterns; carry:… alike), the real sets of `KNOWN_DATASETS` (read from `data_dir`, else
$PARALLEL_R1_DATA, else ../shared/data, else the hub), a comma list, or a .jsonl/.json/.parquet
file.

    python scripts/look/show_data.py --show=synthetic:hard --n=2 [--style=sequential]
"""
import collections
import contextlib
import dataclasses
import hashlib
import itertools
import json
import math
import os
import random
import re
import sys
from typing import Literal

import torch

from attention import TagIds, parse_structure
from model import hub_reachable, tiny_tokenizer

# ---------------------------------------------------------------------------------------------
# Prompts: our own words for what the paper's prompt asks (its exact text: a file with {problem},
# prompt_file=).

PARALLEL_TEMPLATE = """\
Solve the problem below step by step.
Whenever a step would profit from several independent lines of thought, open a parallel block \
there with <Parallel>.
Inside a block, write at least two reasoning paths, each between <Path> and </Path>. The paths \
are written at the same time and independently of each other, so none of them may mention \
another path or depend on their order.
Close the block with </Parallel> and follow it at once with a short summary of what the paths \
found, between <Summary> and </Summary>.
Use as many blocks as the problem needs, wherever they help, without announcing them.
End with a line of the form "Final Answer: <answer>".

Problem: {problem}"""
SEQUENTIAL_TEMPLATE = """\
{problem}
Think step by step, then give the result on a last line of the form "Final Answer: <answer>"."""
# The tiny preset's model learns the format from SFT, not from an instruction: the bare problem.
BARE_TEMPLATE = "{problem}\n"
TEMPLATES = {"parallel": PARALLEL_TEMPLATE, "sequential": SEQUENTIAL_TEMPLATE,
             "bare": BARE_TEMPLATE}
Style = Literal["parallel", "sequential"]                 # traces: with blocks, or a plain chain
PromptStyle = Literal["parallel", "sequential", "bare"]   # the instruction a prompt holds
PLACEHOLDER = re.compile(r"\{problem\}|\{Problem\}")


def prompt_style_of(preset: str, style: str) -> str:
    """The prompt of a run: "bare" under the tiny preset (the problem alone), else the style's
    instruction ("parallel" or "sequential")."""
    if preset == "tiny":
        return "bare"
    return style


def read_template(prompt_file: str) -> str:
    if os.path.isdir(prompt_file):
        raise FileNotFoundError(f"prompt file {prompt_file} is a folder: name the template file "
                                "in it")
    if not os.path.isfile(prompt_file):
        raise FileNotFoundError(f"prompt file not found: {prompt_file}")
    with open(prompt_file, encoding="utf-8") as f:
        template = f.read()
    if not PLACEHOLDER.search(template):
        raise ValueError(f"prompt file {prompt_file} has no {{problem}} placeholder; write "
                         "{problem} where the problem text goes")
    return template


def build_prompt(tokenizer, problem: str, style: str = "parallel",
                 prompt_file: str | None = None) -> str:
    """The prompt of one problem: `prompt_file`'s template (with {problem}), else the template of
    `style` (a PromptStyle); in the chat template if the tokenizer has one."""
    if prompt_file is not None:
        template = read_template(prompt_file)
    else:
        template = TEMPLATES[style]
    text = PLACEHOLDER.sub(lambda _: problem, template)   # a function: the problem is not re-parsed
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": text}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return text


# ---------------------------------------------------------------------------------------------
# The embedded task, pair search (NOTES.md §9). "Which two of 6 2 5 3 make 8?" A round is one
# attempt in the main chain ("6+3=9 vs 8: no") or, with probability parallel_fraction, a block of
# attempts whose summary keeps the pair that checked ("none" if none did); "Final Answer: 5, 3"
# ends the trace. A checked guess is certain, so N attempts beat one. The teacher guesses right
# with probability guess_accuracy; its last allowed round always does.

SYNTHETIC_SPLITS = {"easy": 4, "medium": 5, "hard": 6}      # difficulty -> numbers in the list
SYNTHETIC_SIZES = {"train": 20_000, "rl": 20_000, "val": 500, "test": 500}   # records per part
# The part of each of 10 hash buckets. Bucket b keeps the part that bucket b % 5 had when there
# were 5 ("test", "rl", "train", "train", "train"), so the SFT ("train") and RL ("rl") patterns and
# streams are those of every earlier run; the held-out fifth is halved into "val" (bucket 0) and
# "test" (bucket 5). Why carve the held-out fifth rather than keep it whole as "val" and take a
# fresh "test" elsewhere: the pattern space is small (easy: 308 patterns, hard: 298) and the SFT
# (easy) and RL parts read every pattern of theirs, so no unread pattern exists outside the
# held-out fifth; a fresh test would change the SFT or RL stream. The cost: before 2026-12-07
# ":test" was the whole fifth and settings were chosen on it, so the new ":test" holds patterns
# that selection saw (README numbers on the old ":test" are not numbers on the new one; NOTES §9).
SYNTHETIC_PARTS = ("val", "rl", "train", "train", "train", "test", "rl", "train", "train", "train")
HELD_OUT_PARTS = ("val", "test")     # never trained on: choose on "val", report on "test"
PART_SUFFIXES = ("", ":rl", ":val", ":test")    # "" is the SFT part, "train"
SYNTHETIC_NAMES = [f"synthetic:{s}{p}" for s in SYNTHETIC_SPLITS for p in PART_SUFFIXES]
MAX_SUM = 9                    # targets are one digit
GUESS_ACCURACY = 0.5           # the teacher's chance to try the right pair
MAX_ROUNDS = 3                 # a teacher trace has up to three rounds; the last one is right


@dataclasses.dataclass(frozen=True)
class PairProblem:
    numbers: tuple[int, ...]     # the list, in the order of the text (distinct, 1-9)
    target: int                  # the sum of exactly one pair of `numbers` (<= 9)
    pair: tuple[int, int]        # that pair, in list order

    @property
    def text(self) -> str:
        return f"Which two of {' '.join(map(str, self.numbers))} make {self.target}?"

    @property
    def answer(self) -> str:
        return f"{min(self.pair)}, {max(self.pair)}"


def make_problem(rng: random.Random, size: int) -> PairProblem:
    """`size` distinct numbers from 1-9 and a target (<= 9) that exactly one pair of them makes."""
    while True:
        numbers = tuple(rng.sample(range(1, 10), size))
        pairs = [(a, b) for i, a in enumerate(numbers) for b in numbers[i + 1:]]   # list order
        sums = collections.Counter(a + b for a, b in pairs)
        unique = sorted(s for s, count in sums.items() if count == 1 and s <= MAX_SUM)
        if unique:
            target = rng.choice(unique)
            pair = next(pair for pair in pairs if sum(pair) == target)
            return PairProblem(numbers, target, pair)


def problem_part(problem: PairProblem) -> str:
    """The part of a problem's number pattern (the list as a set, the target) by a fixed hash:
    "train" (3 in 5), "rl" (1 in 5), "val" or "test" (1 in 10 each; SYNTHETIC_PARTS says why).
    No two parts share a pattern: RL, validation and test problems are new to the cold start."""
    key = repr((sorted(problem.numbers), problem.target)).encode()
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return SYNTHETIC_PARTS[int.from_bytes(digest, "big") % len(SYNTHETIC_PARTS)]


def synthetic_problems(split: str, part: str = "train", n: int | None = None,
                       seed: int = 0) -> list[PairProblem]:
    """`n` problems of difficulty `split` and `part`, the same on every machine; a shorter list is
    a prefix. At most the part's size (SYNTHETIC_SIZES), as a limit beyond a real set's size gives
    the whole set. Drawn with replacement from the part's patterns: a problem can repeat (an
    i.i.d. sample of the task, as Mean@k assumes)."""
    rng = random.Random(f"synthetic:{split}:{part}:{seed}")
    size = SYNTHETIC_SIZES[part]
    count = size if n is None else min(n, size)
    return draw_in_part(lambda: make_problem(rng, SYNTHETIC_SPLITS[split]), problem_part, part,
                        count)


def draw_in_part(draw, part_of, part: str, count: int) -> list:
    """`count` problems from `draw()` whose number pattern hashes (`part_of`) into `part`."""
    out = []
    while len(out) < count:
        problem = draw()
        if part_of(problem) == part:
            out.append(problem)
    return out


def render_trace(problem: PairProblem, rng: random.Random, parallel_fraction: float = 0.5,
                 guess_accuracy: float = GUESS_ACCURACY, num_paths: int = 2,
                 max_rounds: int = MAX_ROUNDS, max_paths: int | None = None) -> str:
    """The teacher's solution (text with tags, no EOS): rounds of attempts until a pair checks.
    A block has num_paths paths, or, with max_paths > num_paths, a width drawn uniformly from
    num_paths..max_paths per block."""
    p = problem
    wrong = [(a, b) for i, a in enumerate(p.numbers) for b in p.numbers[i + 1:]
             if {a, b} != set(p.pair)]
    lines = []
    found = None
    for r in range(max_rounds):
        block = rng.random() < parallel_fraction
        attempts = 1
        if block:
            attempts = num_paths
        if block and max_paths and max_paths > num_paths:
            attempts = rng.randint(num_paths, max_paths)
        tries = []
        for _ in range(attempts):
            right = rng.random() < guess_accuracy or r == max_rounds - 1
            a, b = p.pair if right else rng.choice(wrong)
            swap = rng.random() >= 0.5                     # either order, equally often
            tries.append((b, a) if swap else (a, b))
        checks = [f"{a}+{b}={a + b} vs {p.target}: {'ok' if a + b == p.target else 'no'}"
                  for a, b in tries]
        found = next((f"{a}, {b}" for a, b in tries if a + b == p.target), None)
        if block:
            paths = "".join(f"<Path>{c}</Path>" for c in checks)
            lines.append(f"<Parallel>{paths}</Parallel>\n<Summary>{found or 'none'}</Summary>")
        else:
            lines.append(checks[0])
        if found:
            break
    return "\n".join(lines) + f"\nFinal Answer: {found}"


def synthetic_records(split: str, part: str, style: str, limit: int | None, seed: int,
                      parallel_fraction: float, max_paths: int = 2) -> list[dict]:
    """Records with teacher traces (style "sequential": every round one attempt; max_paths: the
    widest block), each trace drawn with its own seed."""
    if not 0 <= parallel_fraction <= 1:
        raise ValueError(f"parallel_fraction must be in [0, 1], got {parallel_fraction}")
    fraction = 0.0 if style == "sequential" else parallel_fraction
    source = f"synthetic:{split}"
    if part != "train":
        source += f":{part}"
    records = []
    for i, p in enumerate(synthetic_problems(split, part, limit, seed)):
        trace = render_trace(p, random.Random(f"{source}:{seed}:{i}"), fraction,
                             max_paths=max_paths)
        records.append({"id": f"{source}-{i}", "problem": p.text, "answer": p.answer,
                        "source": source, "solution": trace})
    return records


# ---------------------------------------------------------------------------------------------
# The carry task (README, "Where parallel thinking pays"): the pair question with two-digit
# numbers, "Which two of 94 41 40 69 45 make 85?", and long attempts. An attempt adds in columns
# with the carry and checks, ~47 tokens against a block's ~13 of tags and summary, so paths
# decoded side by side save decode steps here, where the pair task's (~15 tokens) do not:
#     40+45: 0+5=5 carry 0, 4+4+0=8 -> 85 vs 85: ok 40, 45
# A checked attempt ends with its pair, so a summary (and the answer) copies the last tokens of
# the path that says ok. The right pair stands side by side in the list, and the teacher tries
# neighbours only (the candidates): a rule the model can read off the layout, which says nothing
# about the sums (a rule on the digits, e.g. units that make the target's, taught the model to
# write sums that end like the target). One attempt succeeds with probability 1 / (numbers - 1).
# A sequential trace tries the candidates in a random order, never twice, until one checks: any
# round can fail. A parallel trace opens, with probability parallel_fraction, one block of
# max_paths attempts, each an independent draw from the candidates (Unseen paths cannot see each
# other, so repeats are what a model's block does); its summary copies the checked pair, or says
# "none", after which single attempts try the untried candidates.

CARRY_SPLITS = {"easy": 4, "medium": 5, "hard": 6}   # difficulty -> numbers in the list
CARRY_NAMES = [f"carry:{s}{p}" for s in CARRY_SPLITS for p in PART_SUFFIXES]
CARRY_NUMBERS = range(10, 100)  # two-digit numbers
BASE = 10                       # a column's digit; a column sum of BASE or more carries one
SWAP_CHANCE = 0.5               # an attempt writes its pair in either order, equally often


@dataclasses.dataclass(frozen=True)
class CarryProblem(PairProblem):
    """A pair problem of the carry task: distinct two-digit numbers, a target (21-197) that
    exactly one pair makes, and that pair side by side in the list."""

    @property
    def candidates(self) -> list[tuple[int, int]]:
        """The neighbouring pairs of the list, in list order: what the teacher tries."""
        return list(itertools.pairwise(self.numbers))


def make_carry_problem(rng: random.Random, size: int) -> CarryProblem:
    """`size` distinct two-digit numbers and a target that exactly one pair makes, a pair of
    neighbours (each neighbouring pair equally likely)."""
    while True:
        numbers = tuple(rng.sample(CARRY_NUMBERS, size))
        sums = collections.Counter(a + b for i, a in enumerate(numbers) for b in numbers[i + 1:])
        at = rng.randrange(size - 1)
        pair = (numbers[at], numbers[at + 1])
        if sums[sum(pair)] == 1:
            return CarryProblem(numbers, sum(pair), pair)


def carry_part(problem: CarryProblem) -> str:
    """The part of a carry problem's number pattern (the list as a set, the target), hashed as
    `problem_part` hashes the pair task's: "train" (3 in 5), "rl" (1 in 5), "val" or "test"
    (1 in 10 each)."""
    key = repr(("carry", sorted(problem.numbers), problem.target)).encode()
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return SYNTHETIC_PARTS[int.from_bytes(digest, "big") % len(SYNTHETIC_PARTS)]


def carry_problems(split: str, part: str = "train", n: int | None = None,
                   seed: int = 0) -> list[CarryProblem]:
    """`n` carry problems of difficulty `split` and `part` (at most SYNTHETIC_SIZES[part]), the
    same on every machine; a shorter list is a prefix (as `synthetic_problems`)."""
    rng = random.Random(f"carry:{split}:{part}:{seed}")
    limit = SYNTHETIC_SIZES[part]
    count = limit if n is None else min(n, limit)
    return draw_in_part(lambda: make_carry_problem(rng, CARRY_SPLITS[split]), carry_part, part,
                        count)


def carry_attempt(a: int, b: int, target: int) -> str:
    """One attempt: a + b in columns, the carry, the sum against the target, the verdict (and,
    if it checks, the pair: what the summary and the answer copy)."""
    units = a % BASE + b % BASE
    carry = units // BASE
    tens = a // BASE + b // BASE + carry
    verdict = "no"
    if a + b == target:
        verdict = f"ok {a}, {b}"
    return (f"{a}+{b}: {a % BASE}+{b % BASE}={units} carry {carry}, "
            f"{a // BASE}+{b // BASE}+{carry}={tens} -> {a + b} vs {target}: {verdict}")


def render_carry_trace(problem: CarryProblem, rng: random.Random, parallel_fraction: float = 0.5,
                       num_paths: int = 4) -> str:
    """The teacher's solution (text with tags, no EOS): an optional first block of `num_paths`
    independent attempts, then single attempts at the untried candidates until one checks."""
    candidates = problem.candidates
    target = problem.target

    def in_some_order(pair):
        a, b = pair
        if rng.random() < SWAP_CHANCE:
            return b, a
        return a, b

    lines = []
    found = None
    tried = set()
    if rng.random() < parallel_fraction:
        draws = [in_some_order(rng.choice(candidates)) for _ in range(num_paths)]
        tried = {frozenset(pair) for pair in draws}
        found = next((f"{a}, {b}" for a, b in draws if a + b == target), None)
        paths = "".join(f"<Path>{carry_attempt(a, b, target)}</Path>" for a, b in draws)
        lines.append(f"<Parallel>{paths}</Parallel>\n<Summary>{found or 'none'}</Summary>")
    untried = [pair for pair in candidates if frozenset(pair) not in tried]
    rng.shuffle(untried)
    for pair in untried:
        if found:
            break
        a, b = in_some_order(pair)
        lines.append(carry_attempt(a, b, target))
        if a + b == target:
            found = f"{a}, {b}"
    return "\n".join(lines) + f"\nFinal Answer: {found}"


def carry_records(split: str, part: str, style: str, limit: int | None, seed: int,
                  parallel_fraction: float, max_paths: int = 2) -> list[dict]:
    """Records of the carry task with teacher traces (style "sequential": no block; else a first
    block of max_paths paths with probability parallel_fraction), each drawn with its own
    seed."""
    if not 0 <= parallel_fraction <= 1:
        raise ValueError(f"parallel_fraction must be in [0, 1], got {parallel_fraction}")
    fraction = 0.0 if style == "sequential" else parallel_fraction
    source = f"carry:{split}"
    if part != "train":
        source += f":{part}"
    records = []
    for i, p in enumerate(carry_problems(split, part, limit, seed)):
        trace = render_carry_trace(p, random.Random(f"{source}:{seed}:{i}"), fraction, max_paths)
        records.append({"id": f"{source}-{i}", "problem": p.text, "answer": p.answer,
                        "source": source, "solution": trace})
    return records


# ---------------------------------------------------------------------------------------------
# Answers, problems and traces of the real sets

THOUSANDS = re.compile(r"[+-]?\d{1,3}(,\d{3})+")            # 1,450,000
INTEGER_WRITTEN_AS_DECIMAL = re.compile(r"[+-]?\d+(\.0*)?")   # 025, 27.0, -1.0


def normalize_answer(value, latex: bool = False) -> str:
    """The gold answer without the source's format accidents: 27.0 -> "27", "025" -> "25",
    "1,450" -> "1450" (with `latex`, MATH-500, a string is only stripped)."""
    if isinstance(value, (bool, int)):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    s = str(value).strip()
    if latex:
        return s
    if THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    if INTEGER_WRITTEN_AS_DECIMAL.fullmatch(s):
        return str(int(s.split(".")[0]))
    return s


def gsm8k_answer(text: str) -> str | None:
    """The answer of a GSM8K solution, from its "#### N" line: "...\\n#### 1,450" -> "1450"."""
    m = re.search(r"####\s*(.+?)\s*$", text)
    return normalize_answer(m.group(1)) if m else None


def gsm8k_sequential_solution(text: str) -> str:
    """A GSM8K worked solution as a sequential SFT target: <<calculator notes>> out,
    "#### N" -> "Final Answer: N"."""
    body = re.sub(r"<<[^>]*>>", "", text)
    return re.sub(r"####\s*(.+?)\s*$",
                  lambda m: f"Final Answer: {normalize_answer(m.group(1))}", body)


BASELINE_SUFFIX = re.compile(
    r"\s*Let's think step by step and output the final answer after \"Final Answer: \"\.\s*$")


def extract_problem(text: str) -> str:
    """The bare problem inside a source's instruction prompt (after the last "Problem:", before
    the baseline's "Let's think step by step", or DAPO's second paragraph); repairs AIME 2025's
    "\\f" and "\\t" escapes."""
    text = re.sub(r"\t(?=riangle)", r"\\t", text.replace("\x0c", "\\f"))
    if "Final Answer" in text and re.search(r"(^|\n)Problem:", text):
        return re.split(r"(?:^|\n)Problem:", text)[-1].strip()
    if BASELINE_SUFFIX.search(text):
        return BASELINE_SUFFIX.sub("", text).strip()
    if text.startswith("Solve the following math problem") and text.count("\n\n") >= 2:
        return text.split("\n\n")[1].strip()
    return text.strip()


# The sampler's text at the junctions of the tags: nothing between them, one "\n" before <Summary>
# (NOTES.md §1).
JUNCTIONS = [("<Parallel>", "", "<Path>"), ("</Path>", "", "<Path>"),
             ("</Path>", "", "</Parallel>"), ("</Parallel>", "\n", "<Summary>")]
ANY_TAG = re.compile(r"</?(?:Parallel|Path|Summary)>")


def canonicalize_trace(text: str) -> str:
    """The whitespace between structural tags in the sampler's layout; the model's own text is
    kept."""
    for before, between, after in JUNCTIONS:
        text = re.sub(before + r"\s*" + after, before + between + after, text)
    return text.strip()


def check_trace(solution: str, tokenizer, tags: TagIds) -> str:
    """"" for a usable parallel SFT target (valid, with a Final Answer line), else why not (token
    positions and counts as N, so that reasons group; a bound such as ">= 2" stays)."""
    structure = parse_structure(tokenizer.encode(solution, add_special_tokens=False), tags)
    if not structure.valid:
        return re.sub(r"(?<!>= )\b\d+", "N", structure.reason)
    if re.search(r"Final Answer\s*:\s*\S", solution):
        return ""
    return "no 'Final Answer:' line"


# ---------------------------------------------------------------------------------------------
# Files: local, or the hub

# Known datasets: the file inside the data folder, and the hub candidates (path, config, split)
# tried in order.
KNOWN_DATASETS = {
    "gsm8k:train": ("gsm8k/train.jsonl", [("openai/gsm8k", "main", "train")]),
    "gsm8k:test": ("gsm8k/test.jsonl", [("openai/gsm8k", "main", "test")]),
    "dapo": ("dapo_math_17k/train.parquet", [("Leo-Dai/dapo-math-17k_dedup", None, "train"),
                                             ("BytedTsinghua-SIA/DAPO-Math-17k", None, "train")]),
    "math500": ("math500/test.jsonl", [("HuggingFaceH4/MATH-500", None, "test")]),   # LaTeX
    "aime24": ("aime24/test.jsonl", [("HuggingFaceH4/aime_2024", None, "train")]),
    "aime25": ("aime25/test.jsonl", [("math-ai/aime25", None, "test")]),
    "amc23": ("amc23/test.jsonl", [("math-ai/amc23", None, "test")]),
    "parallel_gsm8k": ("parallel_gsm8k/train.parquet",
                       [("Parallel-R1/Parallel-GSM8K", None, "train")]),
}
DATA_ENV = "PARALLEL_R1_DATA"
DATA_SUFFIXES = (".jsonl", ".json", ".parquet")     # compared in lower case


def default_data_dir() -> str | None:
    """$PARALLEL_R1_DATA if set, else ../shared/data next to this repository if it exists."""
    repository_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    beside = os.path.join(repository_parent, "shared", "data")
    if os.environ.get(DATA_ENV):
        return os.environ[DATA_ENV]
    return beside if os.path.isdir(beside) else None


def read_rows(path: str) -> list[dict]:
    """The rows of a .jsonl, .json (a list of records, or JSON lines) or .parquet file (any case
    of the suffix). ValueError, naming the file, for another kind of file."""
    if not os.path.isfile(path):               # commas separate data specs: name the file
        hint = ""
        if os.path.isdir(path):
            hint = " (a folder: name a .jsonl, .json or .parquet file in it)"
        raise FileNotFoundError(f"data file not found: {path}{hint}")
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in DATA_SUFFIXES:
        raise ValueError(f"data file {path}: read are .jsonl, .json and .parquet files (a "
                         "compressed file: decompress it first, e.g. gunzip)")
    if suffix == ".parquet":
        import pyarrow.parquet as pq
        try:
            return pq.read_table(path).to_pylist()
        except Exception as e:                 # pyarrow's errors name no file
            raise ValueError(f"data file {path} is not a readable parquet file ({e})") from None
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError:
        raise ValueError(f"data file {path} is not UTF-8 text: write JSON lines, a JSON list or "
                         "parquet") from None
    if suffix == ".json" and text.lstrip().startswith(("[", "{")):
        try:
            whole = json.loads(text)
        except json.JSONDecodeError:
            whole = None                       # JSON lines in a .json file: read line by line
        if isinstance(whole, list):
            return whole
        if isinstance(whole, dict):
            raise ValueError(f"data file {path} holds one JSON object, not records: write a list "
                             "of records ([{...}, {...}]) or one record per line")
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}, line {n}: not valid JSON ({e})") from None
    return rows


@contextlib.contextmanager
def hub_cache_only(offline: bool):
    """With `offline`, datasets and huggingface_hub as HF_HUB_OFFLINE=1 at start makes them (the
    attributes they read at each call): the cache only, no network, no retries."""
    import datasets
    from huggingface_hub import constants
    saved = [datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE]
    if offline:
        datasets.config.HF_HUB_OFFLINE = True
        constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE = saved[0]
        constants.HF_HUB_OFFLINE = saved[1]


def load_hub(name: str, local: str | None) -> list[dict]:
    """The rows of a known dataset from the hub, or its cache when the hub cannot be reached
    (model.hub_reachable: without the probe, ~26 s of retries before the error);
    FileNotFoundError saying where to put the file."""
    # datasets is slow to import: only here, where there is no local file
    import datasets
    errors = []
    offline = not hub_reachable()
    if offline:
        errors.append("the hub cannot be reached (no network, or HF_HUB_OFFLINE=1): its cache only")
    for path, hub_config, split in KNOWN_DATASETS[name][1]:
        try:
            with hub_cache_only(offline):
                return [dict(r) for r in datasets.load_dataset(path, hub_config, split=split)]
        except Exception as e:                 # offline, missing, renamed: the next, then explain
            first_line = str(e).splitlines()[0] if str(e) else ""
            errors.append(f"{path}: {type(e).__name__}: {first_line}")
    where = f"no local file {local}" if local else "no local data folder"
    raise FileNotFoundError(f"dataset {name!r}: {where}, and the hub could not give it "
                            f"({'; '.join(errors)}). Point --data_dir or ${DATA_ENV} at a folder "
                            f"holding {KNOWN_DATASETS[name][0]}, or go online.")


def first_value(row: dict, *keys):
    """The first non-empty value among `keys` ("a.b" reads row["a"]["b"])."""
    for key in keys:
        value = row
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        is_nan = isinstance(value, float) and math.isnan(value)
        if value is not None and value != "" and not is_nan:
            return value
    return None


def has_final_answer(text) -> bool:
    return isinstance(text, str) and re.search(r"Final Answer\s*:", text) is not None


# The field names a row's problem, worked solution and answer are read from, first found first
# ("a.b": row["a"]["b"]; a chat-message prompt: its last user turn)
PROBLEM_FIELDS = ("problem", "question", "extra_info.question", "prompt")
SOLUTION_FIELDS = ("extra_info.answer", "solution", "text")
ANSWER_FIELDS = ("reward_model.ground_truth", "ground_truth", "final_answer", "answer")


def row_record(row: dict, latex: bool, style: str) -> tuple[str | None, str | None, str | None]:
    """(problem, answer, solution) of one row, whatever the source's field names (the *_FIELDS
    above; a GSM8K worked solution is a solution only for the sequential style)."""
    prompt = first_value(row, *PROBLEM_FIELDS)
    if isinstance(prompt, (list, tuple)):                  # chat messages: the last user turn
        users = [m.get("content") for m in prompt
                 if isinstance(m, dict) and m.get("role") == "user"]
        prompt = users[-1] if users else None
    problem = extract_problem(prompt) if isinstance(prompt, str) else None
    trace = first_value(row, *SOLUTION_FIELDS)
    solution = trace if has_final_answer(trace) else None
    raw = first_value(row, *ANSWER_FIELDS)
    answer = None
    if has_final_answer(raw):                              # the "answer" field is a whole trace
        solution = solution or raw
        raw = None
    if isinstance(raw, str) and "####" in raw:             # GSM8K: worked solution + "#### N"
        answer = gsm8k_answer(raw)
        if style == "sequential":
            solution = solution or gsm8k_sequential_solution(raw)
    elif raw is not None:
        answer = normalize_answer(raw, latex=latex)
    if answer is None and solution is not None:            # a trace without a separate answer
        found = re.findall(r"Final Answer\s*:\s*(.+)", solution)
        answer = normalize_answer(found[-1]) if found else None
    return problem, answer or None, solution


def worked_solution(row: dict) -> str | None:
    """The file's own worked solution of a row (MATH's "solution", GSM8K's "answer" with its
    "#### N" line), or None (DAPO has none)."""
    text = first_value(row, "solution")
    if isinstance(text, str):
        return text
    text = first_value(row, "answer")
    if isinstance(text, str) and "####" in text:
        return text
    return None


def record_id(row: dict, label: str, index: int) -> str:
    rid = first_value(row, "unique_id", "id", "extra_info.index", "index")
    if rid is None:
        return f"{label}-{index}"
    if str(rid).startswith(label):
        return str(rid)
    return f"{label}-{rid}"


def check_parallel_traces(records: list[dict], parallel: list[bool], where: str,
                          tokenizer) -> list[dict]:
    """The records without the parallel traces that fail `check_trace` (canonicalised first);
    the counts are printed."""
    if tokenizer is None:                      # the tags are one token in every tokenizer we use
        tokenizer = tiny_tokenizer()
    tags = TagIds.from_tokenizer(tokenizer)
    kept = []
    reasons = collections.Counter()
    for record, is_parallel in zip(records, parallel):
        if not is_parallel:
            kept.append(record)
            continue
        record = dict(record, solution=canonicalize_trace(record["solution"]))
        why = check_trace(record["solution"], tokenizer, tags)
        if why:
            reasons[why] += 1
        else:
            kept.append(record)
    traces = sum(parallel)
    blockless = sum(bool(r["solution"]) for r in records) - traces
    dropped = "; ".join(f"{n} x {why}" for why, n in reasons.most_common()) or "none"
    print(f"[data] {where}: kept {len(kept)} of {len(records)} records: "
          f"{traces - sum(reasons.values())} of {traces} parallel traces pass the format check "
          f"(dropped: {dropped}), {blockless} traces have no parallel block (kept)",
          file=sys.stderr)
    return kept


def records_from_rows(rows, name: str, style: str, strict: bool, where: str,
                      tokenizer) -> list[dict]:
    """The records of one file's rows: incomplete rows skipped (or, strict, refused); parallel
    traces canonicalised and checked (`check_trace`), with the counts printed. ValueError naming
    the fields read and the accepted ones when no row gives a record."""
    if name in KNOWN_DATASETS:
        label = name
    else:
        label = os.path.splitext(os.path.basename(name))[0]
    records = []
    skipped = 0
    for i, row in enumerate(rows):
        problem, answer, solution = row_record(row, latex=name == "math500", style=style)
        if not problem or not answer:
            if strict:
                missing = "answer" if problem else "problem"
                raise ValueError(f"{where}, row {i}: no {missing} (fields: {sorted(row)})")
            skipped += 1
            continue
        records.append({"id": record_id(row, label, i), "problem": problem, "answer": answer,
                        "solution": solution, "source": name,
                        "worked_solution": worked_solution(row)})
    if skipped and not records:
        fields = sorted({key for row in rows for key in row})
        raise ValueError(f"{where}: none of its {len(rows)} rows has both a problem and an "
                         f"answer; its fields are {fields}. A problem is read from the first of "
                         f"{list(PROBLEM_FIELDS)}, an answer from {list(ANSWER_FIELDS)} (or a "
                         f"'Final Answer:' line in {list(SOLUTION_FIELDS)}): rename the fields")
    if skipped:
        print(f"[data] {where}: skipped {skipped} of {len(rows)} rows without a problem or answer",
              file=sys.stderr)
    parallel = [bool(r["solution"] and ANY_TAG.search(r["solution"])) for r in records]
    if not any(parallel):
        return records
    if style == "sequential":
        raise ValueError(f"{where} holds parallel traces, not sequential ones; for a sequential "
                         "SFT set use e.g. gsm8k:train with style='sequential'")
    return check_parallel_traces(records, parallel, where, tokenizer)


def load_one(name: str, style: str, strict: bool, limit: int | None, seed: int,
             data_dir: str | None, tokenizer, parallel_fraction: float,
             max_paths: int) -> list[dict]:
    """The records of one data name (see `load_data`)."""
    synthetic = re.fullmatch(r"synthetic:(\w+)(?::(rl|val|test))?", name)
    if synthetic and synthetic.group(1) in SYNTHETIC_SPLITS:
        part = synthetic.group(2) or "train"
        return synthetic_records(synthetic.group(1), part, style, limit, seed, parallel_fraction,
                                 max_paths)
    carry = re.fullmatch(r"carry:(\w+)(?::(rl|val|test))?", name)
    if carry and carry.group(1) in CARRY_SPLITS:
        return carry_records(carry.group(1), carry.group(2) or "train", style, limit, seed,
                             parallel_fraction, max_paths)
    if name in KNOWN_DATASETS:
        folder = data_dir or default_data_dir()
        if folder and not os.path.isdir(folder):           # only a folder the user named
            raise FileNotFoundError(f"data folder not found: {folder} (from --data_dir or "
                                    f"${DATA_ENV})")
        local = os.path.join(folder, KNOWN_DATASETS[name][0]) if folder else None
        if local and os.path.isfile(local):
            rows = read_rows(local)
            where = local
        else:
            rows = load_hub(name, local)
            where = f"{name} (hub)"
    elif not synthetic and (name.lower().endswith(DATA_SUFFIXES) or os.sep in name
                            or os.path.exists(name)):
        rows = read_rows(name)
        where = name
    else:
        known = ", ".join(SYNTHETIC_NAMES + CARRY_NAMES + list(KNOWN_DATASETS))
        raise ValueError(f"unknown dataset {name!r}; known: {known}, or a path to a "
                         ".jsonl/.json/.parquet file")
    records = records_from_rows(rows, name, style, strict, where, tokenizer)
    return records[:limit] if limit is not None else records


def embedded_test_parts(spec: str) -> str | None:
    """The held-out test parts of a spec of embedded problems ("carry:hard:rl,carry:easy" ->
    "carry:hard:test,carry:easy:test"): where a run on them is evaluated. None if some name of
    the spec is not one of the embedded tasks' training or RL parts."""
    names = [name.strip() for name in spec.split(",") if name.strip()]
    trainable = [n for n in SYNTHETIC_NAMES + CARRY_NAMES
                 if not n.endswith((":val", ":test"))]
    if not names or any(name not in trainable for name in names):
        return None
    return ",".join(name.removesuffix(":rl") + ":test" for name in names)


# A real training set's own held-out part: where grpo.py evaluates a run on it by default.
REAL_TEST_PARTS = {"gsm8k:train": "gsm8k:test"}


def own_test_parts(spec: str) -> str | None:
    """The held-out parts of `spec`: an embedded spec's (embedded_test_parts), a real set's
    (REAL_TEST_PARTS: "gsm8k:train" -> "gsm8k:test"); None if some name of it has none."""
    names = [name.strip() for name in spec.split(",") if name.strip()]
    if names and all(name in REAL_TEST_PARTS for name in names):
        return ",".join(REAL_TEST_PARTS[name] for name in names)
    return embedded_test_parts(spec)


def held_out_default(spec: str, preset: str) -> str | None:
    """GRPO's held-out problems when --eval_data is not given: the given problems' own test part
    (carry:hard:rl -> carry:hard:test, gsm8k:train -> gsm8k:test), not the preset's; for real
    data without one (dapo) none ("") unless the paper preset names its benchmark (None: the
    preset's), as the tiny preset's synthetic test sets say nothing of real data."""
    held_out = own_test_parts(spec)
    if held_out is None and not is_embedded(spec) and preset != "paper":
        return ""
    return held_out


def is_embedded(spec: str) -> bool:
    """Whether every name of `spec` is one of the embedded tasks' (synthetic:*, carry:*)."""
    names = [name.strip() for name in spec.split(",") if name.strip()]
    return all(name in SYNTHETIC_NAMES + CARRY_NAMES for name in names)


def load_data(spec: str, style: str = "parallel", strict: bool = False, limit: int | None = None,
              seed: int = 0, data_dir: str | None = None, tokenizer=None,
              parallel_fraction: float = 0.5, max_paths: int = 2) -> list[dict]:
    """The records of `spec` (a name, a comma list, or a file, also one with a comma in its
    name), solutions in `style` (None where a real set has none). `strict`: refuse a row without
    a problem or an answer. `limit`: the first this-many of each part. `parallel_fraction`,
    `max_paths`: the synthetic traces' share of block rounds and widest block.
    ValueError: an unknown name (listing the known ones), nothing loaded; FileNotFoundError: a
    missing file or folder, or a set with neither a local file nor the hub."""
    names = [spec] if os.path.isfile(spec) else spec.split(",")
    records = []
    for name in names:
        name = name.strip()
        if name:
            records += load_one(name, style, strict, limit, seed, data_dir, tokenizer,
                                parallel_fraction, max_paths)
    if not records:
        raise ValueError(f"{spec!r} gave no records")
    return records


def format_response(record: dict) -> str:
    """The SFT target of a record (SFT appends EOS). ValueError for a record without one."""
    if not record.get("solution"):
        raise ValueError(f"record {record.get('id')!r} has no solution to train on; SFT needs "
                         "synthetic:*, parallel_gsm8k, or gsm8k:train with style='sequential'")
    return record["solution"]


# ---------------------------------------------------------------------------------------------
# Token ids and padded batches: SFT's examples (grpo.py pads its rollouts the same way)


@dataclasses.dataclass
class Example:
    prompt_ids: list[int]      # the prompt (chat template included); never a target
    response_ids: list[int]    # the solution tokens + [eos]; every one is a target


def tokenize_records(records: list[dict], tokenizer, style: str, max_length: int,
                     prompt_file: str | None = None, log=print) -> list[Example]:
    """The `Example`s of the records, their prompts in `style` (a PromptStyle), without (and
    counting) those longer than max_length (never truncated: a cut block would be mis-masked),
    those parse_structure rejects and those without a solution. ValueError: no tags, no solution
    at all, none left."""
    tags = TagIds.from_tokenizer(tokenizer)
    unsolved = [r for r in records if not r.get("solution")]
    if unsolved and len(unsolved) == len(records):
        format_response(unsolved[0])                     # raises, saying what SFT data needs
    if unsolved:
        log(f"dropped {len(unsolved)} of {len(records)} records without a solution to train on")
        records = [r for r in records if r.get("solution")]
    prompt_texts = [build_prompt(tokenizer, r["problem"], style, prompt_file) for r in records]
    prompts = tokenizer(prompt_texts, add_special_tokens=False)["input_ids"]   # the sampler's ids
    solution_texts = [format_response(r) for r in records]
    solutions = tokenizer(solution_texts, add_special_tokens=False)["input_ids"]
    examples = []
    too_long = 0
    malformed = 0
    first_reason = ""
    for r, prompt, solution in zip(records, prompts, solutions):
        response = solution + [tags.eos]
        structure = parse_structure(response, tags)
        if len(prompt) + len(response) > max_length:
            too_long += 1
        elif not structure.valid:
            malformed += 1
            first_reason = first_reason or f"{r.get('id', '?')}: {structure.reason}"
        else:
            examples.append(Example(prompt, response))
    if too_long or malformed:
        first = f" (first: {first_reason})" if malformed else ""
        log(f"{len(examples)} examples from {len(records)} records with a solution: dropped "
            f"{too_long} longer than max_length={max_length} tokens and {malformed} with a "
            f"malformed parallel structure{first}")
    if not examples:
        raise ValueError(f"no training examples left out of {len(records)} records ({too_long} "
                         f"too long, {malformed} malformed): check --data and --max_length")
    return examples


@dataclasses.dataclass
class Batch:
    input_ids: torch.Tensor        # (B, L) long: prompt, response, right padding
    attention_mask: torch.Tensor   # (B, L) long: 1 on real tokens
    prompt_lengths: list[int]      # (B,)
    loss_mask: torch.Tensor        # (B, L) float: 1 where the token is a response token (a target)

    def to(self, device) -> "Batch":
        moved = {k: v.to(device) for k, v in vars(self).items() if torch.is_tensor(v)}
        return dataclasses.replace(self, **moved)


def collate(examples: list[Example], pad_id: int) -> Batch:
    """Right-pad to the longest: prompt [5, 6] + response [7, 1] -> input_ids [5, 6, 7, 1, pad],
    loss mask 0 0 1 1 0. Anything with prompt_ids and response_ids will do (grpo pads Rollouts
    with it)."""
    rows = [e.prompt_ids + e.response_ids for e in examples]
    prompt_lengths = [len(e.prompt_ids) for e in examples]
    L = max(map(len, rows))
    input_ids = torch.tensor([r + [pad_id] * (L - len(r)) for r in rows])
    attention_mask = torch.tensor([[1] * len(r) + [0] * (L - len(r)) for r in rows])
    is_response = torch.arange(L)[None, :] >= torch.tensor(prompt_lengths)[:, None]
    return Batch(input_ids, attention_mask, prompt_lengths, (attention_mask * is_response).float())
