"""Rewards: find the answer, check it, check the parallel format, and turn both into the paper's rewards.

One response flows through this file as

    text (with the six tags) ──extract_answer──▶ pred ──verify(pred, gold)──▶ correct ─┐
    Structure (attention.parse_structure) ──▶ has_parallel, format_ok, num_blocks ───────┴─▶ reward

and `score_batch` does that for the thousands of responses of one GRPO step:

    >>> from rewards import extract_answer, verify, RewardSchedule
    >>> extract_answer("<Parallel><Path>6*7</Path><Path>7*6</Path></Parallel>\\n<Summary>42</Summary>Final Answer: 42")
    '42'
    >>> verify("\\\\dfrac12", "0.5"), verify("41", "42")
    (True, False)
    >>> RewardSchedule("alternating").kind_at(9)                  # S2: steps 9-10 of every 10 are tiered
    'tiered'

Answer checking (PAPER_NOTES §4.1) has three stages, cheapest first:

1. exact match after normalisation (spaces, $, \\boxed, \\text units, degrees, percent, thousands
   separators, "x =", \\dfrac, \\frac12 shorthand, ...);
2. numeric equality with a relative tolerance, from a small parser of our own (integers, decimals,
   scientific notation, a/b, \\frac{a}{b}): no sympy, no eval;
3. symbolic equality with math-verify (LaTeX parser only) in a pool of worker processes, each check
   under a wall-clock deadline: a worker that misses it is killed and replaced and the item counts as
   wrong. math-verify's own timeout uses signal.alarm, which fails outside the main thread
   (ENV_NOTES §1), so it is switched off and the deadline is ours; it also cannot stop a big-integer
   power computed in C, which a kill can.

Model text is untrusted: nothing here calls eval, exec or sympify on it. math-verify's plain-expression
extractor (`ExprExtractionConfig`) runs sympy's `parse_expr`, which evaluates Python code, so it is
never used; its LaTeX extractor is an ANTLR parser that builds sympy objects without evaluating text.

Deviations from the official code, on purpose:
* The official reward reads only the last 300 characters of a response, so a `Final Answer:` line
  followed by a long tail is never seen (a false negative). `extract_answer` reads the whole response.
* The official reward compares normalised strings only, so "0.5" vs "\\frac{1}{2}" or "27.0" vs "27"
  are wrong there. `verifier="default"` accepts them; `verifier="paper"` keeps the official comparison
  for exact reproduction.

Run `python rewards.py --bench` for the throughput of `score_batch` on a mixed batch of 2,048 items.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing.connection
import os
import re
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Sequence

# ----------------------------------------------------------------------------------------------------
# 1. Extraction

MAX_ANSWER_CHARS = 1000    # a longer extracted answer counts as wrong without being looked at
_FINAL_ANSWER_RE = re.compile(r"final\s*answer\s*\**\s*:", re.IGNORECASE)   # "Final Answer:", "**Final Answer:**"
_GSM8K_RE = re.compile(r"####")
_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_SPECIAL_MARKER_RE = re.compile(r"<\|[^|<>\n]{1,40}\|>")   # <|im_end|>, <|endoftext|>, ... (Qwen-style)


@lru_cache(maxsize=1)
def _markers() -> tuple[str, ...]:
    """The strings `extract_answer` deletes: the six tags and the tiny tokenizer's <eos>/<pad>.
    Imported lazily so that the verifier workers never import torch."""
    from model import EOS, PAD, TAGS
    return tuple(TAGS) + (EOS, PAD)


def _last_boxed(text: str) -> str | None:
    r"""Content of the last `\boxed{...}` (or `\fbox{...}`) whose braces balance, else None.

    One left-to-right pass over the braces, so 10,000 unclosed `\boxed{` cost O(n), not O(n^2).
    `\{` and `\}` (LaTeX set braces) count as braces; they come in pairs in well-formed LaTeX.
    """
    opens = [m.end() - 1 for m in _BOX_RE.finditer(text)]    # index of each box's "{"
    if not opens:
        return None
    wanted, close, stack = set(opens), {}, []
    for m in re.finditer(r"[{}]", text[opens[0]:]):
        i = opens[0] + m.start()
        if text[i] == "{":
            stack.append(i)
        elif stack:
            j = stack.pop()
            if j in wanted:
                close[j] = i
    for j in reversed(opens):
        if j in close:
            return text[j + 1:close[j]]
    return None


def _last_line_after(pattern: re.Pattern, text: str) -> str | None:
    """The rest of the line after the last match of `pattern` that is followed by some text, else None.
    Walks the matches backwards and stops at the first hit, so a 1 MB line repeating the pattern is
    read about once, not once per match."""
    for m in reversed(list(pattern.finditer(text))):
        end = text.find("\n", m.end())
        line = text[m.end():end if end >= 0 else len(text)].strip().strip("*#").strip()
        if line:
            return line
    return None


def extract_answer(text: str) -> str | None:
    r"""The final answer of a response, or None when it gives none.

    Rules, on the text with the structural tags (and <eos>/<pad>/<|...|> markers) removed:
      1. the last non-empty `Final Answer:` line (the paper's format, PAPER_NOTES §1.3; case-insensitive,
         markdown bold allowed); if that line holds a `\boxed{...}`, its content;
      2. else the last `\boxed{...}` whose braces balance (nested braces allowed);
      3. else the last GSM8K-style `#### N` line.
    The whole response is read: no last-300-characters window (see the module docstring).

        >>> extract_answer("so 2+2=4.\nFinal Answer: $4$")
        '$4$'
        >>> extract_answer(r"\boxed{1} then \boxed{\frac{1}{2}}")
        '\\frac{1}{2}'
        >>> extract_answer("#### 1,234"), extract_answer("no answer here")
        ('1,234', None)
    """
    if not isinstance(text, str):
        raise TypeError(f"extract_answer takes the response text (str), got {type(text).__name__}")
    for marker in _markers():
        text = text.replace(marker, "")
    text = _SPECIAL_MARKER_RE.sub("", text)
    line = _last_line_after(_FINAL_ANSWER_RE, text)      # "**" of "**Final Answer:** 42" stripped
    if line is not None:
        boxed = _last_boxed(line)
        return boxed.strip() if boxed is not None and boxed.strip() else line
    boxed = _last_boxed(text)
    if boxed is not None and boxed.strip():
        return boxed.strip()
    return _last_line_after(_GSM8K_RE, text)


# ----------------------------------------------------------------------------------------------------
# 2a. Normalisation and the fast checks (exact, numeric)

REL_TOL = 1e-6             # numeric equality: |a - b| <= REL_TOL * max(|a|, |b|)

_UNICODE = (("\u2212", "-"), ("\u2013", "-"), ("\u00d7", "\\times "), ("\u00b7", "\\cdot "), ("\u00b0", ""),
            ("\u2009", " "), ("\u00a0", " "), ("\u221e", "\\infty "), ("\u03c0", "\\pi "))
_DROP_RE = re.compile(r"\\(?:left|right|displaystyle|quad|qquad)(?![a-zA-Z])|\\[!,;: ]|~|\\\$|\$|\\[()\[\]]")
_DEGREE_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|\\degree")
_PERCENT_RE = re.compile(r"\\?%")
_TEXT_UNIT_RE = re.compile(r"(\d)\s*\\(?:text|mbox|mathrm)\s*\{[^{}]*\}(?:\s*\^\s*\{?\d\}?)?\s*$")  # 5\text{ cm}^2 -> 5
_TEXT_RE = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_SHORT_UNITS = frozenset("cm mm km kg mg ml m g s h ft in mi lb lbs oz hr hrs min sec mph L".split())
_LEADING_NUMBER_RE = re.compile(r"[-+]?\d[\d.,/]*")
_UNIT_WORD_RE = re.compile(r"([a-zA-Z]+)\.?(?:\^\{?\d\}?)?")
_SPACE_RE = re.compile(r"\s+(?![a-zA-Z])|(?<![a-zA-Z])\s+")   # keep one space only between two letters
_LHS_RE = re.compile(r"^[a-zA-Z](?:_\{?\w+\}?)?=(?!.*=)")      # "x=", "x_1=" (a lone variable, one "=")
_FRAC_SHORT_RE = re.compile(r"\\frac(\d)(\d)|\\frac(\d)(?=\{)|\\frac(\{[^{}]*\})(\d)")
_SQRT_SHORT_RE = re.compile(r"\\sqrt(\d)")
_THOUSANDS_RE = re.compile(r"^[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")


def _strip_unit_words(s: str) -> str:
    """"5 apples" / "12 square feet" / "3cm" / "4 m^2" -> the number. A word counts as a unit when it has
    2+ letters and is separated by a space, or is a common short unit (then it may touch the number),
    so "2 x" and "2ab" stay expressions. Splits on spaces, no backtracking regex."""
    m = _LEADING_NUMBER_RE.match(s)
    if not m or m.end() == len(s):
        return s
    tail = s[m.end():]
    words = [_UNIT_WORD_RE.fullmatch(w) for w in tail.split()]
    if not words or not all(words):
        return s
    for k, w in enumerate(words):
        spaced = k > 0 or tail[0].isspace()
        if not ((spaced and len(w[1]) >= 2) or w[1] in _SHORT_UNITS):
            return s
    return m.group(0)


def normalize_answer(answer: str) -> str:
    r"""The canonical string of an answer, for the exact-match stage (and the input of the other two).

        >>> normalize_answer(r"$\boxed{\dfrac12}$.")
        '\\frac{1}{2}'
        >>> normalize_answer(r"x = 1{,}000 \text{ dollars}"), normalize_answer(r"30^\circ"), normalize_answer("50\\%")
        ('1000', '30', '50')

    Drops: $ and \( \) \[ \] delimiters, an outer \boxed, \left/\right and spacing commands, units in
    \text{} after a number and unit words after a number ("5 apples", "3cm"), degree marks, percent
    signs (the numeric stage then also accepts x% = x/100), a trailing period, a lone-variable
    left-hand side ("x = 3" -> "3"), thousands separators. Rewrites \dfrac/\tfrac to \frac and the
    shorthands \frac12 / \sqrt2. Whitespace is removed except one space between two letters.
    """
    s = answer.strip()
    for old, new in _UNICODE:
        s = s.replace(old, new)
    boxed = _last_boxed(s)
    if boxed is not None:
        s = boxed
    s = _DROP_RE.sub(" ", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("{,}", "")
    s = _DEGREE_RE.sub("", s)
    s = _PERCENT_RE.sub("", s)
    s = _TEXT_UNIT_RE.sub(r"\1", s)
    s = _TEXT_RE.sub(r" \1 ", s).strip().rstrip(".").strip()
    s = _strip_unit_words(s)
    s = _SPACE_RE.sub("", s)
    s = _LHS_RE.sub("", s)
    s = _FRAC_SHORT_RE.sub(lambda m: "\\frac{%s}{%s}" % (m[1], m[2]) if m[1] else
                           ("\\frac{%s}" % m[3] if m[3] else "\\frac%s{%s}" % (m[4], m[5])), s)
    s = _SQRT_SHORT_RE.sub(r"\\sqrt{\1}", s)
    s = s.rstrip(".")
    if _THOUSANDS_RE.match(s):
        s = s.replace(",", "")
    return s


_DEC = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)"
_FLOAT_RE = re.compile(_DEC + r"(?:[eE][-+]?\d{1,4})?")
_SCI_RE = re.compile(r"(?:(" + _DEC + r")(?:\\times|\\cdot|\*)|([-+]?))10\^\{?([-+]?\d{1,4})\}?")
_FRAC_RE = re.compile(r"([-+]?)\\frac\{(" + _DEC + r")\}\{(" + _DEC + r")\}")
_SLASH_RE = re.compile(r"(" + _DEC + r")/(" + _DEC + r")")


def parse_number(s: str) -> Fraction | None:
    r"""The exact value of a normalised numeric answer, or None if it is not a plain number.

    Accepts 42, -3, 033, 27.0, .5, 1.5e3, 1.5\times10^{3}, 10^{5}, 3/4, \frac{3}{4}, -\frac{1}{2}.
    Exponents have at most 4 digits, so nothing big is ever computed. No eval: regexes and Fraction.

        >>> parse_number(r"-\frac{1}{2}"), parse_number("1.5e3"), parse_number("x+1")
        (Fraction(-1, 2), Fraction(1500, 1), None)
    """
    if len(s) > 100:
        return None
    if _FLOAT_RE.fullmatch(s):
        return Fraction(s)
    m = _SCI_RE.fullmatch(s)
    if m:
        return Fraction(m[1] or (m[2] or "") + "1") * Fraction(10) ** int(m[3])
    m = _FRAC_RE.fullmatch(s) or _SLASH_RE.fullmatch(s)
    if m:
        num, den = (Fraction(m[2]), Fraction(m[3])) if m.re is _FRAC_RE else (Fraction(m[1]), Fraction(m[2]))
        if den == 0:
            return None
        return (-1 if m.re is _FRAC_RE and m[1] == "-" else 1) * num / den
    return None


def parse_number_list(s: str) -> tuple[str, list[Fraction]] | None:
    r"""A normalised tuple, interval, set or bare list of plain numbers, as (kind, values), else None.

    kind is "set" for \{...\} and for a bare comma list (both unordered), else the two brackets,
    e.g. "()" for a tuple or open interval, "[)" for a half-open interval.

        >>> parse_number_list(r"\{3,1,2\}"), parse_number_list("[1,2)"), parse_number_list("(x,1)")
        (('set', [Fraction(1, 1), Fraction(2, 1), Fraction(3, 1)]), ('[)', [Fraction(1, 1), Fraction(2, 1)]), None)
    """
    if s.startswith("\\{") and s.endswith("\\}"):
        kind, body = "set", s[2:-2]
    elif len(s) > 2 and s[0] in "([" and s[-1] in ")]":
        kind, body = s[0] + s[-1], s[1:-1]
    elif "," in s:
        kind, body = "set", s
    else:
        return None
    values = [parse_number(x) for x in body.split(",")]
    if None in values or (kind != "set" and len(values) < 2):
        return None
    return kind, sorted(values) if kind == "set" else values


def _close(a: Fraction, b: Fraction) -> bool:
    return a == b or abs(a - b) <= REL_TOL * max(abs(a), abs(b))


def _numbers_equal(a: Fraction, b: Fraction, percent: bool) -> bool:
    """Equal within REL_TOL; when either side had a percent sign, x% also equals x/100."""
    return _close(a, b) or (percent and (_close(a * 100, b) or _close(a, b * 100)))


_SAFE_CHARS_RE = re.compile(r"[A-Za-z0-9\s\\{}\[\]()^_+\-*/=<>,.!|:;&']*")
_POWER_RE = re.compile(r"\^")
_ATOM_RE = re.compile(r"[-+]?\d+|\\?[a-zA-Z]+|.")
_COMMAND_RE = re.compile(r"\\[a-zA-Z]+")
MAX_SYMBOLIC_CHARS = 256   # the symbolic stage never sees a longer normalised answer
MAX_BRACE_DEPTH = 12


def _exponent(s: str, i: int) -> str:
    """The exponent that follows the "^" at index i: a brace group's content, or the next atom."""
    j = i + 1
    while j < len(s) and s[j] == " ":
        j += 1
    if j < len(s) and s[j] == "{":
        depth = 0
        for k in range(j, len(s)):
            depth += {"{": 1, "}": -1}.get(s[k], 0)
            if depth == 0:
                return s[j + 1:k]
        return s[j + 1:]
    m = _ATOM_RE.match(s, j)
    return m.group(0) if m else ""


def symbolic_safe(s: str) -> bool:
    r"""Whether a normalised answer may go to the symbolic stage (a screen for speed, not for safety).

    Refused: longer than MAX_SYMBOLIC_CHARS; characters outside plain math (", `, $, #, @, ...);
    "__" or "**"; unbalanced braces or nesting deeper than MAX_BRACE_DEPTH; a power whose exponent
    holds another power (10^{10^{10}}) or an integer of 5+ digits; a factorial of a 5+ digit number.
    The deadline of the worker pool holds without this screen (tests check both); the screen keeps
    hopeless inputs from costing a worker a full timeout.
    """
    if len(s) > MAX_SYMBOLIC_CHARS or not _SAFE_CHARS_RE.fullmatch(s) or "__" in s or "**" in s:
        return False
    depth = 0
    for ch in s:
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth < 0 or depth > MAX_BRACE_DEPTH:
            return False
    if depth != 0:
        return False
    for m in _POWER_RE.finditer(s):
        e = _exponent(s, m.start())
        if "^" in e or re.search(r"\d{5,}", e):
            return False
    return not re.search(r"\d{5,}\s*!", s)


def _has_free_letters(s: str) -> bool:
    """A letter outside LaTeX command names, other than the constants e and i: a variable, as in "2x"
    or "a+b", but not in "\\sqrt{2}" or "e^2"."""
    return bool(re.search(r"[a-df-hj-zA-Z]", _COMMAND_RE.sub("", s)))


def _fast_check(pred: str | None, gold: str) -> tuple[bool | None, str, str]:
    """Stages 1-2 of `verify` plus the screen: (decision, normalised pred, normalised gold), where the
    decision is True/False, or None when only the symbolic stage can tell."""
    gold = str(gold)
    if pred is None or len(pred) > MAX_ANSWER_CHARS:
        return False, "", ""
    p, g = normalize_answer(pred), _normalize_gold(gold)
    if not p or not g:
        return False, p, g
    if p == g:
        return True, p, g
    a, b = parse_number(p), parse_number(g)
    if a is not None and b is not None:
        return _numbers_equal(a, b, "%" in pred or "%" in gold), p, g
    la, lb = parse_number_list(p), parse_number_list(g)
    if la is not None and lb is not None:         # tuples, intervals, sets of plain numbers
        return la[0] == lb[0] and len(la[1]) == len(lb[1]) and all(map(_close, la[1], lb[1])), p, g
    if b is not None and _has_free_letters(p):
        return False, p, g                        # a number never equals an expression in a variable
    if not (symbolic_safe(p) and symbolic_safe(g)):
        return False, p, g
    return None, p, g


@lru_cache(maxsize=65536)
def _normalize_gold(gold: str) -> str:
    return normalize_answer(gold)             # golds repeat group_size times per step


# ----------------------------------------------------------------------------------------------------
# 2b. The official comparison (verifier="paper")

# PAPER_NOTES §4.1: the official reward normalises both strings Minerva-style and compares them.
# The replacement pairs and the removed words below are the official ones (facts), applied in order.
_PAPER_REPLACE = (("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
                  (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"))
_PAPER_REMOVE = ("square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
                 "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
                 "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
                 "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;",
                 ",\\!", "{,}", '"', "\\dots")


def _paper_line(line: str) -> str:
    """Per line: keep the first $...$ span (dollars included), unwrap \\text{}, \\textbf{}, \\overline{}
    (up to the first "}"), then \\boxed{ ... up to the line's last "}"."""
    i = line.find("$")
    j = line.find("$", i + 1) if i >= 0 else -1
    if j >= 0:
        line = line[i:j + 1]
    for cmd in ("text", "textbf", "overline"):
        line = re.sub(r"\\" + cmd + r"\{([^}\n]*)\}", r"\1", line)
    i, j = line.find("\\boxed{"), line.rfind("}")
    if i >= 0 and j >= i + len("\\boxed{"):
        line = line[:i] + line[i + len("\\boxed{"):j] + line[j + 1:]
    return line


def normalize_paper(answer: str) -> str:
    r"""The official (Minerva-style) normaliser, for `verify(..., verifier="paper")`.

    In order: keep the text after the last "="; apply the replacement pairs (which also delete every
    space and the words "a"/"an"); delete the unit words and LaTeX leftovers; on each line keep the
    first $...$ span and unwrap \text{}, \textbf{}, \overline{} and \boxed{}; expand \fracab to
    \frac{a}{b} and \sqrta to \sqrt{a}; drop "$"; drop the commas of a comma-grouped integer.

        >>> normalize_paper(r"x = \frac12"), normalize_paper(r"\$1,000"), normalize_paper(r"$\boxed{42}$.")
        ('\\frac{1}{2}', '1000', '42')
    """
    s = answer.split("=")[-1]
    for old, new in _PAPER_REPLACE:
        s = s.replace(old, new)
    for word in _PAPER_REMOVE:
        s = s.replace(word, "")
    s = "\n".join(_paper_line(line) for line in s.split("\n"))
    s = re.sub(r"(frac)([^{])(.)", r"frac{\2}{\3}", s)
    s = re.sub(r"(sqrt)([^{])", r"sqrt{\2}", s)
    s = s.replace("$", "")
    if s.replace(",", "").isdigit():
        s = s.replace(",", "")
    return s.strip()


# ----------------------------------------------------------------------------------------------------
# 2c. The symbolic stage: math-verify in worker processes, each check under a deadline

STARTUP_TIMEOUT = 120.0    # seconds a fresh worker may take to import sympy/math-verify before we give up
WORKER_MEMORY_LIMIT = 4 << 30   # bytes of address space per worker (Linux): a runaway check gets MemoryError


def _symbolic_equal(pred: str, gold: str) -> bool:
    """math-verify on two normalised answers, LaTeX extraction only, its own timeouts off (ours is the kill)."""
    from math_verify import LatexExtractionConfig, parse
    from math_verify import verify as mv_verify

    config = [LatexExtractionConfig()]        # never ExprExtractionConfig: it evals through parse_expr
    g = parse(f"${gold}$", extraction_config=config, parsing_timeout=None)
    p = parse(f"${pred}$", extraction_config=config, parsing_timeout=None)
    return bool(g) and bool(p) and bool(mv_verify(g, p, timeout_seconds=None))


_WARMUP = (("\\frac{1}{2}", "0.5"), ("x(x+1)", "x^2+x"), ("\\sqrt{8}", "2\\sqrt{2}"), ("\\{1,2\\}", "\\{2,1\\}"),
           ("[1,2)", "(1,2]"))


def _worker_main() -> None:
    """`python rewards.py --worker`: read JSON [pred, gold] lines on stdin, answer "1"/"0" lines.

    The protocol uses a private copy of stdout; anything a library prints goes to stderr instead.
    Exits at end of input (also when the parent dies, since its end of the pipe closes).
    """
    import json
    import signal

    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    signal.signal(signal.SIGINT, signal.SIG_IGN)          # Ctrl-C is the parent's business
    try:
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_LIMIT, WORKER_MEMORY_LIMIT))
    except (ImportError, ValueError, OSError):
        pass
    logging.getLogger("math_verify").setLevel(logging.ERROR)   # "timeout is disabled" warnings: we know
    for pred, gold in _WARMUP:                     # first uses build the LaTeX parser and import sympy's
        _symbolic_equal(pred, gold)                # simplifier (~2 s): not on anyone's deadline
    out.write(b"ready\n")
    for line in sys.stdin.buffer:
        try:
            pred, gold = json.loads(line)
            ok = _symbolic_equal(str(pred), str(gold))
        except Exception:                          # parse errors, RecursionError, MemoryError, ...
            ok = False
        out.write(b"1\n" if ok else b"0\n")


def default_workers() -> int:
    """Symbolic workers to use: the CPUs this process may run on, at most 8."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:
        n = os.cpu_count() or 1
    return max(1, min(8, n))


class _Worker:
    """One `python rewards.py --worker` process (a fresh interpreter: no state, threads or torch of the caller)."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.ready, self.job, self.deadline = False, None, 0.0
        self.started = time.monotonic()

    def send(self, job: tuple[str, str]):
        import json
        self.proc.stdin.write((json.dumps(job) + "\n").encode())
        self.proc.stdin.flush()

    def kill(self):
        self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


class SymbolicPool:
    """Worker processes that each answer one symbolic check at a time, under a per-check deadline.

    `run(jobs, timeout)` hands jobs to idle workers and waits on all of them at once; a worker that
    has not answered `timeout` seconds after it got its job is killed (SIGKILL) and replaced, and its
    job counts as not equal. So one hung check costs one worker `timeout` seconds while the others
    keep going. Safe to call from any thread (calls are serialised by a lock) and from any process:
    workers are plain subprocesses (`python rewards.py --worker`), so neither the caller's main
    module nor its threads matter and a daemonic process may use it too. Workers start lazily (about
    a second: a Python interpreter plus math-verify) and are reused across calls; `close()` stops them
    (registered with atexit for the module pool).
    """

    def __init__(self, workers: int):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.size, self.workers, self.killed, self.started = workers, [], 0, 0
        self.lock = threading.Lock()

    def _start(self):
        self.workers.append(_Worker())
        self.started += 1

    def _replace(self, w: _Worker, killed: bool):
        w.kill()
        self.workers.remove(w)
        self.killed += killed
        self._start()

    def run(self, jobs: Sequence[tuple[str, str]], timeout: float) -> list[bool]:
        """[equal?] for each (pred, gold) job; False for a job past its deadline."""
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        results = [False] * len(jobs)
        if not jobs:
            return results
        with self.lock:
            while len(self.workers) > self.size:
                self.workers.pop().kill()
            while len(self.workers) < self.size:
                self._start()
            todo = deque(range(len(jobs)))
            while True:
                now = time.monotonic()
                for w in list(self.workers):
                    if w.ready and w.job is None and todo:
                        job = todo.popleft()
                        try:
                            w.send(jobs[job])
                        except OSError:               # died while idle: retry the job on a new worker
                            todo.appendleft(job)
                            self._replace(w, killed=False)
                            continue
                        w.job, w.deadline = job, now + timeout
                busy = [w for w in self.workers if w.job is not None]
                if not busy and not todo:
                    return results
                starting = [w for w in self.workers if not w.ready]
                if not busy and all(now - w.started > STARTUP_TIMEOUT for w in starting):
                    raise RuntimeError(f"symbolic verifier workers did not start within {STARTUP_TIMEOUT:.0f} s")
                wake = min([w.deadline for w in busy] + [now + 1.0])
                ready = multiprocessing.connection.wait([w.proc.stdout for w in busy + starting],
                                                        timeout=max(0.0, wake - now))
                for w in [w for w in busy + starting if w.proc.stdout in ready]:
                    line = w.proc.stdout.readline()
                    if not line:                      # the worker died (crash, OOM kill)
                        if not w.ready:
                            raise RuntimeError(f"a symbolic verifier worker exited while starting (exit code "
                                               f"{w.proc.wait()}; its error is on stderr)")
                        w.job = None                  # its result stays False
                        self._replace(w, killed=False)
                    elif not w.ready:
                        w.ready = line == b"ready\n"
                    else:
                        results[w.job], w.job = line == b"1\n", None
                now = time.monotonic()
                for w in [w for w in busy if w.job is not None and now >= w.deadline]:
                    self._replace(w, killed=True)     # its job stays False

    def close(self):
        with self.lock:
            for w in self.workers:
                w.kill()
            self.workers = []


_POOL: SymbolicPool | None = None
_POOL_LOCK = threading.Lock()


def _pool(workers: int | None) -> SymbolicPool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = SymbolicPool(workers or default_workers())
        elif workers:
            _POOL.size = workers
        return _POOL


def close_pool() -> None:
    """Stop the module's symbolic workers (the next check starts new ones)."""
    global _POOL
    with _POOL_LOCK:
        pool, _POOL = _POOL, None
    if pool is not None:
        pool.close()


atexit.register(close_pool)


def pool_stats() -> dict:
    """{"workers": live workers, "started": workers started so far, "killed": workers killed at a deadline}."""
    p = _POOL
    return {"workers": len(p.workers), "started": p.started, "killed": p.killed} if p else \
        {"workers": 0, "started": 0, "killed": 0}


def symbolic_equal_many(pairs: Sequence[tuple[str, str]], timeout: float = 1.0,
                        workers: int | None = None) -> list[bool]:
    """math-verify equality of each (pred, gold) pair in the module's worker pool, each under `timeout` s.

    No screening here (`verify` screens with `symbolic_safe` first): the bound holds for any input,
    and a check past its deadline is False.
    """
    return _pool(workers).run([(str(p), str(g)) for p, g in pairs], timeout)


# ----------------------------------------------------------------------------------------------------
# 2d. verify

def verify(pred: str | None, gold: str, verifier: str = "default", timeout: float = 1.0) -> bool:
    r"""Whether the predicted answer `pred` (from `extract_answer`) equals the reference `gold`.

    verifier="default": exact match after `normalize_answer`; else numeric equality within REL_TOL
        (`parse_number`; x% also equals x/100); else symbolic equality (math-verify) in a worker
        process under a deadline of `timeout` seconds (a check past it is False; the first call of a
        process also waits for the pool to start, ~1-3 s once).
    verifier="paper": the official comparison, `normalize_paper(pred) == normalize_paper(gold)`.

    None, empty or over-long (> MAX_ANSWER_CHARS) predictions are simply wrong. Never raises on
    model output; raises ValueError for an unknown verifier or a timeout <= 0.

        >>> [verify(p, g) for p, g in [("\\dfrac12", "0.5"), ("27", "27.0"), ("x = 3", "3"), ("1/2", "1/3")]]
        [True, True, True, False]
        >>> verify("0.5", "\\frac{1}{2}", verifier="paper")
        False
    """
    if verifier not in ("default", "paper"):
        raise ValueError(f"verifier must be 'default' or 'paper', got {verifier!r}")
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    if verifier == "paper":
        return (pred is not None and len(pred) <= MAX_ANSWER_CHARS
                and normalize_paper(pred) == normalize_paper(str(gold)))
    decided, p, g = _fast_check(pred, gold)
    if decided is not None:
        return decided
    return symbolic_equal_many([(p, g)], timeout)[0]


# ----------------------------------------------------------------------------------------------------
# 3. Format check and structure metrics (Figure 3)

def _tag_ids(tags, tokenizer):
    if tags is not None:
        return tags
    if tokenizer is None:
        raise ValueError("pass tags= (attention.TagIds) or tokenizer= so the tag ids are known")
    from attention import TagIds
    return TagIds.from_tokenizer(tokenizer)


def _structure(response, tokenizer=None, tags=None):
    from attention import parse_structure

    if isinstance(response, str):
        if tokenizer is None:
            raise ValueError("a response given as text needs tokenizer= to find its tags; "
                             "or pass the response token ids")
        response = tokenizer.encode(response, add_special_tokens=False)
    return parse_structure(response, _tag_ids(tags, tokenizer))


def check_format(response, tokenizer=None, tags=None) -> tuple[bool, str]:
    """(ok, reason) of one response's parallel structure (PAPER_NOTES §4.3, made strict).

    `response` is the response text (then `tokenizer` is required: text -> ids by
    `tokenizer.encode(text, add_special_tokens=False)`) or its token ids (list or 1-D tensor; then
    `tags` or `tokenizer`). The rules are `attention.parse_structure`'s, not repeated here: every block
    closed, >= 2 paths per block, a <Summary>...</Summary> right after each </Parallel>, no structural
    tag inside a path or summary, nothing left open. A response without any block is well-formed.
    `reason` is "" when ok, else the parser's first problem, e.g. "unclosed <Path> at token 12".
    """
    s = _structure(response, tokenizer, tags)
    return s.valid, s.reason


def has_parallel(structure) -> bool:
    """At least one <Parallel> block (well-formed or not): the paper's "# Parallel" ratio counts these."""
    return len(structure.blocks) > 0


def num_blocks(structure) -> int:
    """Number of <Parallel> blocks opened in the response."""
    return len(structure.blocks)


def parallel_positions(structure) -> list[float]:
    """Relative position of each block: token index of its <Parallel> / response length, in [0, 1).

    The quantity of the paper's Figure 3 (PAPER_NOTES §7.5), which rises over RL as blocks move from
    early exploration to late verification. Empty when there is no block.
        e.g. a 200-token response with <Parallel> at tokens 30 and 150 -> [0.15, 0.75]
    """
    n = structure.length
    return [b.start / n for b in structure.blocks] if n else []


# ----------------------------------------------------------------------------------------------------
# 4. Rewards (PAPER_NOTES §4) and the schedule that picks one per training step

def accuracy_reward(correct: bool, has_parallel: bool | None = None, format_ok: bool | None = None) -> float:
    """+1 if the answer is correct, -1 otherwise (PAPER_NOTES §4.1; S1, eval, accuracy steps of S2)."""
    return 1.0 if correct else -1.0


def parallel_gated_reward(correct: bool, has_parallel: bool, format_ok: bool) -> float:
    """+1 iff correct AND at least one block AND the format is valid, else -1 (PAPER_NOTES §4.2:
    the Seen model's RL stage on GSM8K, R = R_parallel AND R_acc; the code's {0, 1} form gives the
    same GRPO advantages)."""
    return 1.0 if correct and has_parallel and format_ok else -1.0


def tiered_reward(correct: bool, has_parallel: bool, format_ok: bool) -> float:
    """+1.2 correct with a valid parallel block, +1.0 correct without a block, -1 otherwise (PAPER_NOTES
    §4.4). A correct answer with a malformed block gets -1, as in the official code (§8.1.7)."""
    if not correct:
        return -1.0
    if not has_parallel:
        return 1.0
    return 1.2 if format_ok else -1.0


REWARDS = {"accuracy": accuracy_reward, "parallel_gated": parallel_gated_reward, "tiered": tiered_reward}
SCHEDULES = ("accuracy", "parallel_gated", "tiered", "alternating", "scaffold")


@dataclass(frozen=True)
class RewardSchedule:
    """Which reward a (1-based) training step uses. The trainer holds one and asks `kind_at(step)`.

    name:
      "accuracy"       every step accuracy (Seen and Unseen S1 on DAPO)
      "parallel_gated" every step parallel AND correct (Seen's GSM8K RL stage)
      "tiered"         every step tiered (the "Parallel" row of Table 4)
      "alternating"    Unseen S2 (PAPER_NOTES §4.4): in each window of `window` steps, the first
                       `accuracy_steps` use accuracy, the rest tiered. Default 10 / 8: steps 1-8
                       accuracy, 9-10 tiered, 11-18 accuracy, 19-20 tiered, ...
      "scaffold"       the mid-training scaffold (§6.2): "alternating" up to and including step
                       `switch_step` (default 200), accuracy after.

        >>> s = RewardSchedule("scaffold", switch_step=20)
        >>> [s.kind_at(t) for t in (8, 9, 20, 21, 29)]
        ['accuracy', 'tiered', 'tiered', 'accuracy', 'accuracy']
        >>> s.reward(9, correct=True, has_parallel=True, format_ok=True)
        1.2
    """

    name: str = "accuracy"
    window: int = 10
    accuracy_steps: int = 8
    switch_step: int = 200

    def __post_init__(self):
        if self.name not in SCHEDULES:
            raise ValueError(f"reward schedule must be one of {SCHEDULES}, got {self.name!r}")
        if self.window < 1 or not 0 <= self.accuracy_steps <= self.window:
            raise ValueError(f"need window >= 1 and 0 <= accuracy_steps <= window, got window={self.window}, "
                             f"accuracy_steps={self.accuracy_steps}")
        if self.switch_step < 0:
            raise ValueError(f"switch_step must be >= 0, got {self.switch_step}")

    def kind_at(self, step: int) -> str:
        """"accuracy", "parallel_gated" or "tiered" at training step `step` (1-based, as verl's global_steps)."""
        if step < 1:
            raise ValueError(f"training steps count from 1, got step={step}")
        if self.name in REWARDS:
            return self.name
        if self.name == "scaffold" and step > self.switch_step:
            return "accuracy"
        return "accuracy" if (step - 1) % self.window < self.accuracy_steps else "tiered"

    def needs_structure(self) -> bool:
        """Whether some step of this schedule needs has_parallel/format_ok."""
        return self.name != "accuracy"

    def reward(self, step: int, correct: bool, has_parallel: bool | None = None,
               format_ok: bool | None = None) -> float:
        kind = self.kind_at(step)
        if kind != "accuracy" and (has_parallel is None or format_ok is None):
            raise ValueError(f"the {kind!r} reward (step {step}) needs has_parallel and format_ok")
        return REWARDS[kind](correct, has_parallel, format_ok)


# ----------------------------------------------------------------------------------------------------
# 5. Scoring a batch

def score_batch(responses: Sequence[str], golds: Sequence[str], *, structures=None, response_ids=None,
                tags=None, tokenizer=None, reward: str | RewardSchedule = "accuracy", step: int = 1,
                verifier: str = "default", timeout: float = 1.0, workers: int | None = None) -> list[dict]:
    """Score one GRPO step's responses. Returns one dict per response:

        {"reward": float, "correct": bool, "pred": str | None, "kind": "accuracy" | "parallel_gated" | "tiered",
         "has_parallel": bool | None, "format_ok": bool | None, "num_blocks": int | None}

    Args:
        responses: response texts WITH the structural tags (B strings); the answer is read from them.
        golds: reference answers (B strings).
        structures: the sampler's `attention.Structure` per response (preferred: nothing is re-parsed);
            or response_ids (B id sequences) with tags (`attention.TagIds`) or tokenizer;
            or only tokenizer (the texts are encoded). With none of these the structure fields are
            None, which only the "accuracy" schedule accepts.
        reward: a schedule name (see `RewardSchedule`) or a `RewardSchedule`; step: the 1-based
            training step it is evaluated at.
        verifier, timeout: as in `verify`; workers: symbolic worker processes (default `default_workers()`).

    Fast checks run first in this process; only undecided items go to the worker pool, once per
    distinct (pred, gold) pair (a GRPO group often repeats its answer), each under `timeout` seconds.
    A hung check costs one worker its timeout, never the batch: the worker is killed and replaced and
    the item counts as wrong. Raises ValueError on mismatched lengths or a missing structure source.
    """
    n = len(responses)
    if len(golds) != n:
        raise ValueError(f"score_batch got {n} responses but {len(golds)} golds")
    schedule = reward if isinstance(reward, RewardSchedule) else RewardSchedule(reward)
    kind = schedule.kind_at(step)
    if verifier not in ("default", "paper"):
        raise ValueError(f"verifier must be 'default' or 'paper', got {verifier!r}")

    if structures is None and response_ids is not None:
        tag_ids = _tag_ids(tags, tokenizer)
        from attention import parse_structure
        structures = [parse_structure(ids, tag_ids) for ids in response_ids]
    elif structures is None and tokenizer is not None:
        from attention import parse_structure
        tag_ids = _tag_ids(tags, tokenizer)
        structures = [parse_structure(ids, tag_ids)
                      for ids in tokenizer(list(responses), add_special_tokens=False)["input_ids"]]
    if structures is not None and len(structures) != n:
        raise ValueError(f"score_batch got {n} responses but {len(structures)} structures/response_ids")
    if structures is None and kind != "accuracy":
        raise ValueError(f"the {kind!r} reward needs the responses' structure: pass structures= (from the "
                         "sampler), response_ids= with tags=, or tokenizer=")

    preds = [extract_answer(r) for r in responses]
    correct: list[bool | None] = [None] * n
    undecided: dict[tuple[str, str], list[int]] = {}
    for i, (pred, gold) in enumerate(zip(preds, golds)):
        if verifier == "paper":
            correct[i] = verify(pred, gold, verifier="paper")
            continue
        decided, p, g = _fast_check(pred, gold)
        if decided is None:
            undecided.setdefault((p, g), []).append(i)
        else:
            correct[i] = decided
    if undecided:
        pairs = list(undecided)
        for pair, ok in zip(pairs, symbolic_equal_many(pairs, timeout, workers)):
            for i in undecided[pair]:
                correct[i] = ok

    out = []
    for i in range(n):
        s = structures[i] if structures is not None else None
        par, fmt, nb = (has_parallel(s), s.valid, num_blocks(s)) if s is not None else (None, None, None)
        out.append({"reward": REWARDS[kind](correct[i], par, fmt), "correct": correct[i], "pred": preds[i],
                    "kind": kind, "has_parallel": par, "format_ok": fmt, "num_blocks": nb})
    return out


# ----------------------------------------------------------------------------------------------------
# `python rewards.py --bench`: throughput on a realistic mixed batch


@dataclass
class BenchConfig:
    n: int = 2048              # items in the batch (GRPO: prompts x group_size)
    group_size: int = 8        # responses per prompt (they share a gold)
    workers: int = 0           # symbolic workers; 0 = default_workers()
    timeout: float = 1.0       # per symbolic check, seconds
    reward: str = "tiered"
    seed: int = 0


def _bench_batch(cfg: BenchConfig):
    """Responses in the canonical layout with golds of mixed kinds, ~10% adversarial."""
    import random

    rng = random.Random(cfg.seed)
    kinds = [  # (gold, correct forms that need numbers/LaTeX/symbolic, wrong forms)
        lambda k: (str(k), [str(k), f"{k}.0", f"\\boxed{{{k}}}", f"{k} apples"], [str(k + 1), str(k * 2)]),
        lambda k: (f"\\frac{{{k}}}{{{k + 1}}}", [f"\\dfrac{{{k}}}{{{k + 1}}}", f"{k}/{k + 1}"],
                   [f"\\frac{{{k + 1}}}{{{k}}}"]),
        lambda k: (f"{k}\\sqrt{{2}}", [f"\\sqrt{{{2 * k * k}}}", f"{k}\\sqrt2"], [f"{k}\\sqrt{{3}}", f"\\sqrt{{{k}}}"]),
        lambda k: (f"\\{{1,{k},{k + 2}\\}}", [f"\\{{{k + 2},1,{k}\\}}"], [f"\\{{1,{k}\\}}"]),
        lambda k: (f"[{k}, {k + 3})", [f"[{k},{k + 3})", f"\\left[{k}, {k + 3}\\right)"], [f"({k},{k + 3})"]),
        lambda k: (f"{k}x^2+{2 * k}x", [f"{k}x(x+2)", f"{k}x^2+{2 * k}x"], [f"{k}x^2+{k}x"]),
        lambda k: (f"{k * 10}\\%", [f"{k * 10}", f"{k * 10}\\%"], [f"{k}"]),
    ]
    weights = [10, 2, 1, 1, 1, 1, 1]
    adversarial = ["__import__('os').system('echo pwned')", "().__class__.__bases__[0].__subclasses__()",
                   "9**9**9**9**9", "10^{10^{10^{10}}}", "{" * 10000, "\\frac{1}{" * 400 + "2" + "}" * 400,
                   "1" * 5000, "2^{999999}"]
    responses, gold_list = [], []
    while len(responses) < cfg.n:
        gold, right, wrong = rng.choices(kinds, weights)[0](rng.randint(2, 99))
        for _ in range(cfg.group_size):
            u = rng.random()
            ans = (rng.choice(adversarial) if u < 0.1 else rng.choice(right) if u < 0.6 else
                   rng.choice(wrong) if u < 0.9 else None)
            body = "Let me think." + (" step" * rng.randint(20, 120))
            if rng.random() < 0.6:
                body += ("<Parallel><Path> one way </Path><Path> another way </Path></Parallel>\n"
                         "<Summary> both agree </Summary>")
            responses.append(body + (f"\nFinal Answer: {ans}" if ans is not None else " I am not sure."))
            gold_list.append(gold)
    return responses[:cfg.n], gold_list[:cfg.n]


def bench(cfg: BenchConfig) -> None:
    from attention import TagIds
    from model import load_model

    _, tok = load_model("tiny")
    tags = TagIds.from_tokenizer(tok)
    responses, golds = _bench_batch(cfg)
    ids = tok(responses, add_special_tokens=False)["input_ids"]
    workers = cfg.workers or default_workers()
    print(f"batch: {len(responses)} responses, {len(set(golds))} distinct golds, {workers} symbolic workers, "
          f"timeout {cfg.timeout} s, {os.cpu_count()} CPUs")
    for label in ("cold (starts the pool)", "warm (a new batch)"):
        if label.startswith("warm"):                  # fresh answers: no cache of the first run helps
            responses, golds = _bench_batch(BenchConfig(**{**vars(cfg), "seed": cfg.seed + 1}))
            ids = tok(responses, add_special_tokens=False)["input_ids"]
        t0 = time.perf_counter()
        scores = score_batch(responses, golds, response_ids=ids, tags=tags, reward=cfg.reward, step=9,
                             timeout=cfg.timeout, workers=workers)
        dt = time.perf_counter() - t0
        acc = sum(s["correct"] for s in scores) / len(scores)
        print(f"{label:>24}: {dt:6.2f} s  {len(scores) / dt:8.0f} items/s   accuracy {acc:.3f}  "
              f"mean reward {sum(s['reward'] for s in scores) / len(scores):+.3f}  pool {pool_stats()}")


if __name__ == "__main__":
    args = sys.argv[1:]
    if args == ["--worker"]:
        _worker_main()
    elif "--bench" in args:
        from sft import parse_config
        try:
            cfg = parse_config(BenchConfig, [a for a in args if a != "--bench"])
            if cfg.n < 1 or cfg.workers < 0:
                raise ValueError("--n must be >= 1 and --workers >= 0")
        except ValueError as e:
            sys.exit(f"rewards.py: error: {e}")
        bench(cfg)
    elif len(args) == 2:
        print(verify(extract_answer(args[0]) or args[0], args[1]))
    else:
        sys.exit("usage: python rewards.py --bench [--n=2048 --workers=0 --timeout=1.0 ...]\n"
                 "       python rewards.py RESPONSE_OR_ANSWER GOLD      # prints whether they match")
