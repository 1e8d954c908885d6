"""Data: prompts, the embedded synthetic task, and loaders for the real math sets (NOTES.md §6, §9).

Every loader returns the same records, one dict per problem:

    {"id": "synthetic:hard-0",
     "problem": "Which two of 2 8 4 7 1 make 6?",
     "answer": "2, 4",               # gold answer as a string, normalised (see `normalize_answer`)
     "solution": "<Parallel>...Final Answer: 4, 2" or None,   # SFT target, tags as text, no EOS
     "source": "synthetic:hard"}

Names accepted by `load_data` and by every script's data option (`KNOWN_DATASETS`):

    synthetic:easy        the embedded pair search, 3 numbers, train part
    synthetic:medium      ... 4 numbers
    synthetic:hard        ... 5 numbers
    synthetic:easy:rl     ... RL part of each (number patterns the train parts never show)
    synthetic:easy:test   ... test part of each (held-out number patterns: disjoint from train and rl)
    gsm8k:train           GSM8K, 7473 problems (answers from "#### N", commas removed)
    gsm8k:test            GSM8K, 1319 problems
    dapo                  DAPO-Math-17k as deduplicated by the Parallel-R1 authors, 17917 rows
    math500               MATH-500, LaTeX answers kept as LaTeX
    aime24, aime25        AIME 2024 / 2025, 30 each ("025" -> "25")
    amc23                 AMC 2023, 40 (27.0 -> "27")
    parallel_gsm8k        Parallel-GSM8K cold-start traces (NOTES.md §6), canonicalised and filtered
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

# The tiny character model reads one token per character and learns the format from SFT, not from an
# instruction: it gets the bare problem, the same for every style, so nothing in the prompt asks for a
# block and whether to open one is the model's own choice.
SHORT_TEMPLATE = "{problem}\n"

# A tokenizer with fewer entries than this is the tiny character tokenizer of `model.py` (105 entries);
# every real subword tokenizer has tens of thousands.
TINY_VOCAB_LIMIT = 1000

STYLES = ("parallel", "sequential")   # the prompt (and, for the synthetic task, the trace) style
_PLACEHOLDER = re.compile(r"\{problem\}|\{Problem\}")


def build_prompt(tokenizer, problem: str, style: str = "parallel", prompt_file: str | None = None) -> str:
    """The prompt text for one problem, ready to tokenize (the response starts right after it).

    Template: `prompt_file` if given (any text with `{problem}` or `{Problem}` where the problem goes),
    else the bare problem and a newline when the tokenizer is the tiny character one
    (`len(tokenizer) < TINY_VOCAB_LIMIT`, whatever the style), else `PARALLEL_TEMPLATE` /
    `SEQUENTIAL_TEMPLATE` by `style`. When the tokenizer has a chat template, the text is the user message
    and the template is applied with `add_generation_prompt=True` (NOTES.md §6); otherwise the text is
    returned as it is.

    Example (tiny tokenizer): build_prompt(tok, "Which two of 6 2 5 3 make 8?") -> "Which two of 6 2 5 3 make 8?\\n"
    Example (Qwen3 tokenizer): "<|im_start|>user\\nSolve the problem below step by step. ...
        Problem: Which two of ...<|im_end|>\\n<|im_start|>assistant\\n"

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
        template = SHORT_TEMPLATE
    else:
        template = SEQUENTIAL_TEMPLATE if sequential else PARALLEL_TEMPLATE
    text = _PLACEHOLDER.sub(lambda _: problem, template)   # a function: the problem is never re-parsed
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return text


# ----------------------------------------------------------------------------------------------------
# The embedded task (NOTES.md §9): pair search
#
#   "Which two of 6 2 5 3 make 8?"
#
# One attempt picks two numbers and checks their sum against the target in a few tokens ("6+3=9 vs 8: no",
# "5+3=8 vs 8: ok": the target is copied next to the sum, so the check compares neighbouring tokens). The
# tiny model cannot see the answer at a glance (RL and test problems use number patterns the cold start
# never shows), but it can check a guess, and a checked guess is certain: so N attempts beat one. A round
# of the search is one attempt written in the main chain, or a parallel block whose paths are the attempts
# and whose summary keeps the pair that checked ("none" when no path did); rounds go on until a pair
# checks. The target is at most 9, so every check compares two one-digit numbers.
#
#   6+3=9 vs 8: no
#   <Parallel><Path>2+5=7 vs 8: no</Path><Path>5+3=8 vs 8: ok</Path></Parallel>
#   <Summary>5, 3</Summary>
#   Final Answer: 5, 3
#
# The traces come from a teacher that guesses like a student with a fair eye for it: each attempt is the
# right pair with probability `guess_accuracy`, else any other pair of the list, in either order;
# attempts are independent draws (two paths may try the same pair, as two Unseen paths would). The last
# allowed round always holds the right pair, so every trace ends with a checked answer. Each round is a
# block with probability `parallel_fraction` (0 for the sequential style): the cold start mixes both, the
# prompt does not ask for either, and the model's own parallel ratio is what RL moves (NOTES.md §7).
# The answer names the two numbers ("5, 3"); `rewards.verify` compares such a list as a set.

SYNTHETIC_SPLITS = {"easy": 4, "medium": 5, "hard": 6}   # difficulty -> numbers in the list
SYNTHETIC_SIZES = {"train": 20_000, "rl": 20_000, "test": 500}   # records per part when `limit` is not given
SYNTHETIC_PARTS = ("test", "rl", "train", "train", "train")       # part of each of 5 pattern buckets


@dataclass(frozen=True)
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
    """Draw a problem with `size` distinct numbers from 1-9 whose target (<= 9) is the sum of exactly
    one pair of them. Example: make_problem(rng, 4) -> PairProblem((6, 2, 5, 3), 8, (5, 3))."""
    while True:
        numbers = tuple(rng.sample(range(1, 10), size))
        sums = collections.defaultdict(list)
        for i in range(size):
            for j in range(i + 1, size):
                sums[numbers[i] + numbers[j]].append((numbers[i], numbers[j]))
        unique = sorted(s for s, pairs in sums.items() if len(pairs) == 1 and s <= 9)
        if unique:
            target = rng.choice(unique)
            return PairProblem(numbers, target, sums[target][0])


def problem_part(problem: PairProblem) -> str:
    """The part a problem's number pattern (the list as a set, and the target) belongs to, by a fixed hash:
    "train" (the cold start's problems, 3 in 5 patterns), "rl" (RL's, 1 in 5) or "test" (1 in 5). No two
    parts of any splits share a pattern, so RL trains on problems the cold start never saw (as the paper's
    RL data, DAPO, is not its SFT data, GSM8K) and the test problems are new to both."""
    key = repr((sorted(problem.numbers), problem.target)).encode()
    return SYNTHETIC_PARTS[int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") % len(SYNTHETIC_PARTS)]


def synthetic_problems(split: str, part: str = "train", n: int | None = None, seed: int = 0) -> list[PairProblem]:
    """`n` problems of difficulty `split` ("easy", "medium", "hard"), part "train", "rl" or "test".

    Deterministic: the same (split, part, n, seed) gives the same list on every machine (the generator is
    seeded with a string, hashed with SHA-512), and a shorter list is a prefix of a longer one. Patterns
    repeat (the space is small); no two parts share one (`problem_part`).
    Raises ValueError for an unknown split or part.
    """
    if split not in SYNTHETIC_SPLITS or part not in SYNTHETIC_SIZES:
        raise ValueError(f"unknown synthetic set {split}:{part}; splits {sorted(SYNTHETIC_SPLITS)}, parts {sorted(SYNTHETIC_SIZES)}")
    rng, out = random.Random(f"synthetic:{split}:{part}:{seed}"), []
    while len(out) < (SYNTHETIC_SIZES[part] if n is None else n):
        p = make_problem(rng, SYNTHETIC_SPLITS[split])
        if problem_part(p) == part:
            out.append(p)
    return out


def render_trace(problem: PairProblem, rng: random.Random, parallel_fraction: float = 0.5,
                 guess_accuracy: float = 0.5, num_paths: int = 2, max_rounds: int = 3) -> str:
    """A teacher's solution of `problem` (text with tags, no EOS): rounds of attempts until a pair checks.

    Each round is a parallel block of `num_paths` attempts with probability `parallel_fraction`, else one
    attempt in the main chain; each attempt is the right pair with probability `guess_accuracy`, else
    another pair (either order); round `max_rounds` always holds the right pair. Example (rng-dependent):
        "6+3=9 vs 8: no\n<Parallel><Path>2+5=7 vs 8: no</Path><Path>5+3=8 vs 8: ok</Path></Parallel>\n<Summary>5, 3</Summary>\n..."
    """
    p = problem
    wrong = [(a, b) for i, a in enumerate(p.numbers) for b in p.numbers[i + 1:] if {a, b} != set(p.pair)]
    lines, found = [], None
    for r in range(max_rounds):
        block = rng.random() < parallel_fraction
        tries = []
        for _ in range(num_paths if block else 1):
            a, b = p.pair if rng.random() < guess_accuracy or r == max_rounds - 1 else rng.choice(wrong)
            tries.append((a, b) if rng.random() < 0.5 else (b, a))
        checks = [f"{a}+{b}={a + b} vs {p.target}: {'ok' if a + b == p.target else 'no'}" for a, b in tries]
        found = next((f"{a}, {b}" for a, b in tries if a + b == p.target), None)
        if block:
            lines.append("<Parallel>" + "".join(f"<Path>{c}</Path>" for c in checks)
                         + f"</Parallel>\n<Summary>{found or 'none'}</Summary>")
        else:
            lines.append(checks[0])
        if found:
            break
    return "\n".join(lines) + f"\nFinal Answer: {found}"


def synthetic_records(name: str, style: str, limit: int | None, seed: int, parallel_fraction: float) -> list[dict]:
    """Records of "synthetic:<split>[:test]" with teacher traces (`render_trace`; style "sequential"
    writes every round as one attempt). Trace randomness is per record, so the problems do not depend on
    the style. Raises ValueError for an unknown split or a parallel_fraction outside [0, 1]."""
    m = re.fullmatch(r"synthetic:(\w+)(?::(rl|test))?", name)
    split, part = (m.group(1), m.group(2) or "train") if m else ("", "")
    if not 0 <= parallel_fraction <= 1:
        raise ValueError(f"parallel_fraction must be in [0, 1], got {parallel_fraction}")
    fraction = 0.0 if style == "sequential" else parallel_fraction
    source = f"synthetic:{split}" + (f":{part}" if part != "train" else "")
    return [{"id": f"{source}-{i}", "problem": p.text, "answer": p.answer, "source": source,
             "solution": render_trace(p, random.Random(f"{source}:{seed}:{i}"), fraction)}
            for i, p in enumerate(synthetic_problems(split, part, limit, seed))]

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
              data_dir: str | None, tokenizer, parallel_fraction: float) -> list[dict]:
    name = name.strip()
    m = re.fullmatch(r"synthetic:(\w+)(?::(rl|test))?", name)
    if m:
        if m.group(1) not in SYNTHETIC_SPLITS:
            raise ValueError(f"unknown dataset {name!r}; known: {', '.join(KNOWN_DATASETS)}")
        return synthetic_records(name, style, limit, seed, parallel_fraction)
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
              seed: int = 0, data_dir: str | None = None, tokenizer=None, parallel_fraction: float = 0.5) -> list[dict]:
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
        parallel_fraction: synthetic sets, parallel style: the chance that a round of a teacher trace is a
            parallel block rather than one attempt (`render_trace`).
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
            records += _load_one(name, style, strict, limit, seed, data_dir, tokenizer, parallel_fraction)
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


@dataclass
class ShowConfig:
    """python data.py --show=synthetic:hard --n=2: print problems, prompts and traces of a data spec."""
    show: str = "synthetic:easy"
    style: str = "parallel"
    n: int = 3                 # records printed
    seed: int = 0
    limit: int = 0             # records loaded for the size statistics (0: all; synthetic: 2000)
    data_dir: str = ""


def tiny_token_count(text: str) -> int:
    """Tokens of `text` under the tiny tokenizer: one per character, one per tag."""
    return len(_TAG.sub("#", text))


def main(argv: list[str]) -> None:
    from sft import parse_config
    cfg = parse_config(ShowConfig, argv)
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
