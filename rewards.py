"""Rewards: find the answer, check it, check the parallel format, and turn both into the paper's rewards (NOTES.md §4).

    text (with the tags) --extract_answer--> pred --verify(pred, gold)--> correct --+
    Structure (attention.parse_structure) --> has_parallel, format_ok -------------+--> reward (RewardSchedule)

Checks, cheapest first: exact after normalisation; numbers and lists of numbers by our own parser; math-verify's LaTeX
parser in pebble workers, each check under a deadline (its worker is killed, the pair wrong: math-verify's signal.alarm
fails off the main thread and cannot stop a power computed in C). Model text is untrusted: nothing calls eval, exec or
sympify on it (nor math-verify's plain-expression extractor: its parse_expr evaluates Python). Unlike the official
reward the whole response is read, not its last 300 characters, and "0.5" equals "\\frac{1}{2}".
"""
import atexit
import logging
import multiprocessing
import os
import re
import sys
import threading
from concurrent.futures import wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import suppress
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from itertools import accumulate

import pebble

MAX_ANSWER_CHARS = 1000    # a longer extracted answer is wrong without being looked at
_FINAL_ANSWER_RE = re.compile(r"final\s*answer\s*\**\s*:", re.IGNORECASE)   # "Final Answer:", "**Final Answer:**"
_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BOX_SEP_RE = re.compile(r"[\s$]*(?:,|;|\\text\{\s*(?:and|or)\s*\}|\b(?:and|or)\b)?[\s$]*(?:[a-zA-Z]\s*=\s*)?[\s$]*")
_MARKER_RE = re.compile(r"\\(?:boxed|fbox)\s*\{|####|final\s*answer\s*\**\s*:", re.IGNORECASE)
# The fallback: a response's last number. Not glued to a word ("Qwen2") nor a coefficient (3x, 4\sqrt2, 2\pi, 2^5);
# "8-4" gives 4; true thousands groups only ("70,000", "9{,}500"); "72 clips, in all." and "$29.00." end at the digits.
_LAST_NUMBER_RE = re.compile(r"(?<![\w.^])(?<!sqrt{)-?(?:\\[dt]?frac\{\d+\}\{\d+\}|\d{1,3}(?:(?:,|\{,\})\d{3})+(?!,?\d)"
                             r"|\d+)(?:\.\d+)?(?:/\d+)?(?![\w/^]|\s*\\(?:sqrt|pi|cdot|times|d?frac))(?:\s*\\?%)?")
@lru_cache(maxsize=1)
def _markers() -> re.Pattern:   # the tags, <eos>, <pad> and <|im_end|>-style markers (Qwen): removed before extraction
    from model import EOS, PAD, TAGS                       # not at the top: the workers need no torch
    tags = sorted({*TAGS, EOS, PAD}, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, tags)) + r"|<\|[^|<>\n]{1,40}\|>")
def _last_boxed(text: str) -> str | None:
    r"""Content of the last balanced `\boxed{}`/`\fbox{}` (one pass over the braces: O(n)), else None; the boxes right
    before it, apart by ",", "and"/"or" or "x =" only, make one list ("\boxed{3}, \boxed{5}" -> "3, 5")."""
    boxes = list(_BOX_RE.finditer(text))
    opens, close, stack = [m.end() - 1 for m in boxes], {}, []     # index of each box's "{", of each "{"'s "}"
    for m in re.compile(r"[{}]").finditer(text, opens[0] if opens else len(text)):
        if m[0] == "{":
            stack.append(m.start())
        elif stack:
            close[stack.pop()] = m.start()
    k = next((k for k in range(len(opens) - 1, -1, -1) if opens[k] in close), None)
    parts = [] if k is None else [text[opens[k] + 1:close[opens[k]]].strip()]
    while k and (e := close.get(opens[k - 1], len(text))) < boxes[k].start() <= e + 40 and \
            _BOX_SEP_RE.fullmatch(text, e + 1, boxes[k].start()):
        k -= 1
        parts.append(text[opens[k] + 1:close[opens[k]]].strip())
    return ", ".join(dict.fromkeys(reversed(parts))) if parts else None
def _last_line_after(pattern: str, text: str) -> str | None:
    """The rest of the line after the last match of `pattern` that some text follows (walked backwards)."""
    ends = ((m.end(), text.find("\n", m.end())) for m in reversed(list(re.finditer(pattern, text, re.IGNORECASE))))
    return next(filter(None, (text[a:b if b >= 0 else None].strip().strip("*#").strip() for a, b in ends)), None)
def extract_answer(text: str) -> str | None:
    r"""The final answer of a response (tags and <eos>/<pad>/<|...|> markers removed), or None: the last non-empty
    `Final Answer:` line (any case, bold allowed; a `\boxed{}` in it: its content), else `_last_boxed`, else the last
    `#### N` line; with no marker at all (an empty one is no answer) the last number, GSM8K's "flexible" rule.
        >>> extract_answer(r"\boxed{1} then \boxed{\frac{1}{2}}"), extract_answer("#### 1,234"), extract_answer("no")
        ('\\frac{1}{2}', '1,234', None)
        >>> extract_answer(r"so \boxed{3}, \boxed{5}"), extract_answer("It is $70,000."), extract_answer(r"\boxed{} 4")
        ('3, 5', '70,000', None)
    """
    if not isinstance(text, str):
        raise TypeError(f"extract_answer takes the response text (str), got {type(text).__name__}")
    text = _markers().sub("", text)
    if (line := _last_line_after(_FINAL_ANSWER_RE.pattern, text)) is not None:
        return _last_boxed(line) or line
    if (boxed := _last_boxed(text)) or (line := _last_line_after("####", text)) is not None or _MARKER_RE.search(text):
        return boxed or line
    end = max(map(text.rfind, "0123456789"))    # C-speed scans; the regex reads 300 characters at most
    return next(reversed(_LAST_NUMBER_RE.findall(text, max(0, end - 300), end + 8)), None)

# Normalisation and the fast checks (exact, numeric)
REL_TOL = 1e-6             # numeric equality: |a - b| <= REL_TOL * max(|a|, |b|)
_UNICODE = str.maketrans({"\u2212": "-", "\u2013": "-", "\u00d7": "\\times ", "\u00b7": "\\cdot ", "\u00b0": "",
                          "\u2009": " ", "\u00a0": " ", "\u221e": "\\infty ", "\u03c0": "\\pi "})
_DROP_RE = re.compile(r"\\(?:left|right|displaystyle|quad|qquad)(?![a-zA-Z])|(?<!\\)\\[!,;: ]|~|\\\$|\$|\\[()\[\]]")
_DEGREE_PERCENT_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|\\degree|\\?%")
_TEXT_UNIT_RE = re.compile(r"(\d)\s*\\(?:text|mbox|mathrm)\s*\{[^{}]*\}(?:\s*\^\s*\{?\d\}?)?\s*$")  # 5\text{ cm}^2 -> 5
_TEXT_RE = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_SHORT_UNITS = frozenset("cm mm km kg mg ml m g s h ft in mi lb lbs oz hr hrs min sec mph L".split())
_LEADING_NUMBER_RE = re.compile(r"[-+]?\d[\d.,/]*")
_UNIT_WORD_RE = re.compile(r"([a-zA-Z]+)\.?(?:\^\{?\d\}?)?")
_SPACE_RE = re.compile(r"\s+(?![a-zA-Z])|(?<![a-zA-Z])\s+")   # keep one space only between two letters
_LHS_RE = re.compile(r"^[a-zA-Z](?:_\{?\w+\}?)?=(?!.*=)")      # "x=", "x_1=" (a lone variable, one "=")
_VAR_LIST_RE = re.compile(r"([a-zA-Z])=[^=,]+(?:,\1=[^=,]+)+")     # "x=2,x=3": one variable's values
_LIST_WORD_RE = re.compile(r"\s*,?\s*\b(?:and|or)\b\s*")           # "19, 46, and 82", "1 or -2": commas
_MIXED_TEXT_RE = re.compile(r"(?<![\w.,/^])(\d{1,12})\s+(\d{1,12})/(\d{1,12})(?![\w.,/])")   # "1 1/4"
_FRAC_SHORT_RE = re.compile(r"\\frac(\d)(\d)|\\frac(\d)(?=\{)|\\frac(\{[^{}]*\})(\d)")
_THOUSANDS_RE = re.compile(r"^[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
def _strip_unit_words(s: str) -> str:
    """"5 apples", "12 square feet", "3cm" -> the number: words of 2+ letters after a space, or short units."""
    m = _LEADING_NUMBER_RE.match(s)
    words = [_UNIT_WORD_RE.fullmatch(w) for w in s[m.end():].split()] if m else []
    if not words or not all(words):
        return s
    apart = s[m.end()].isspace()
    return m[0] if all(((k or apart) and len(w[1]) >= 2) or w[1] in _SHORT_UNITS for k, w in enumerate(words)) else s
def normalize_answer(answer: str, keep_lhs: bool = False) -> str:
    r"""The canonical string of an answer: without $ \( \) \[ \], an outer \boxed, \left/\right, units after a number,
    degree and percent signs, a trailing period, thousands separators, a lone "x =" (also "x=2, x=3" -> "2,3"; kept
    with keep_lhs), spaces but between two letters; \dfrac12 -> \frac{1}{2}, \sqrt2 -> \sqrt{2}, "1 1/4" ->
    1\frac{1}{4}, "and"/"or" -> ",".
        >>> normalize_answer(r"$\boxed{\dfrac12}$."), normalize_answer(r"x = 1{,}000 \text{ dollars}")
        ('\\frac{1}{2}', '1000')
    """
    s = answer.strip().translate(_UNICODE)
    s = _DROP_RE.sub(" ", _last_boxed(s) or s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("{,}", "")
    s = _TEXT_RE.sub(r" \1 ", _TEXT_UNIT_RE.sub(r"\1", _DEGREE_PERCENT_RE.sub("", s))).strip().rstrip(".").strip()
    s = _strip_unit_words(_LIST_WORD_RE.sub(",", s) if "and" in s or "or" in s else s)
    s = _SPACE_RE.sub("", _MIXED_TEXT_RE.sub(r"\1\\frac{\2}{\3}", s) if "/" in s else s)
    if not keep_lhs:
        s = _LHS_RE.sub("", s)
        s = re.sub(r"(^|,)[a-zA-Z]=", r"\1", s) if "=" in s and _VAR_LIST_RE.fullmatch(s) else s
    s = _FRAC_SHORT_RE.sub(lambda m: "\\frac{%s}{%s}" % (m[1], m[2]) if m[1] else
                           ("\\frac{%s}" % m[3] if m[3] else "\\frac%s{%s}" % (m[4], m[5])), s)
    s = re.sub(r"\\sqrt(\d)", r"\\sqrt{\1}", s).rstrip(".")
    return s.replace(",", "") if _THOUSANDS_RE.match(s) else s
_DEC = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)"
_FLOAT_RE = re.compile(_DEC + r"(?:[eE][-+]?\d{1,4})?")
_SCI_RE = re.compile(r"(?:(" + _DEC + r")(?:\\times|\\cdot|\*)|([-+]?))10\^\{?([-+]?\d{1,4})\}?")
_FRAC_RE = re.compile(r"([-+]?)\\frac\{(" + _DEC + r")\}\{(" + _DEC + r")\}")
_SLASH_RE = re.compile(r"()(" + _DEC + r")/(" + _DEC + r")")
_MIXED_RE = re.compile(r"([-+]?)(\d{1,12})\\frac\{(\d{1,12})\}\{(\d{1,12})\}")   # 2\frac{1}{2} = 5/2
def parse_number(s: str) -> Fraction | None:
    r"""The exact value of a normalised plain number (42, 27.0, .5, 1.5e3, 1.5\times10^{3}, 3/4, \frac{3}{4}, the mixed
    number 2\frac{1}{2}), else None. Exponents have at most 4 digits, so nothing big is computed; no eval.
        >>> parse_number(r"-\frac{1}{2}"), parse_number("1.5e3"), parse_number("x+1")
        (Fraction(-1, 2), Fraction(1500, 1), None)
    """
    if len(s) > 100:
        return None
    if _FLOAT_RE.fullmatch(s):
        return Fraction(s)
    if m := _SCI_RE.fullmatch(s):
        return Fraction(m[1] or (m[2] or "") + "1") * Fraction(10) ** int(m[3])
    if (m := _FRAC_RE.fullmatch(s) or _SLASH_RE.fullmatch(s)) and Fraction(m[3]):
        return (-1 if m[1] == "-" else 1) * Fraction(m[2]) / Fraction(m[3])
    if (m := _MIXED_RE.fullmatch(s)) and int(m[4]):
        return (-1 if m[1] == "-" else 1) * (int(m[2]) + Fraction(int(m[3]), int(m[4])))
    return None
def parse_number_list(s: str) -> tuple[str, list[Fraction]] | None:
    r"""(kind, values) of a tuple, interval, set or bare list of plain numbers, else None: kind "set" (\{...\} or a
    bare comma list, unordered: sorted) or the two brackets ("()", "[)", ...).
        >>> parse_number_list(r"\{3,1,2\}"), parse_number_list("(x,1)")
        (('set', [Fraction(1, 1), Fraction(2, 1), Fraction(3, 1)]), None)
    """
    braces, brackets = s.startswith("\\{") and s.endswith("\\}"), len(s) > 2 and s[0] in "([" and s[-1] in ")]"
    if not (braces or brackets or "," in s):
        return None
    kind, body = ("set", s[2:-2]) if braces else (s[0] + s[-1], s[1:-1]) if brackets else ("set", s)
    values = [parse_number(x) for x in body.split(",")]
    return None if None in values or (kind != "set" and len(values) < 2) else \
        (kind, sorted(values) if kind == "set" else values)
def _close(a: Fraction, b: Fraction) -> bool:
    """Within REL_TOL, relative (1e-10 and 2e-10 differ); two integers only when equal (1000000 is not 1000001)."""
    return a == b or (a.denominator > 1 or b.denominator > 1) and abs(a - b) <= REL_TOL * max(abs(a), abs(b))
_BASE_RE = re.compile(r"([0-9A-Za-z]{0,64}[0-9][0-9A-Za-z]{0,64})_\{?(\d{1,2})\}?")   # 1011_2, 2C_{16}
def _numeral(s: str) -> tuple[str, int] | None:   # (digits, base) of a valid numeral with a base subscript
    m = _BASE_RE.fullmatch(s)
    ok = m and 2 <= int(m[2]) <= 36 and all(int(c, 36) < int(m[2]) for c in m[1])
    return (m[1].upper().lstrip("0") or "0", int(m[2])) if ok else None
def _base_check(p: str, g: str) -> bool | None:
    """Answers in another base: None unless a side has a base subscript. Two bases never match; a prediction may drop
    the gold's subscript ("1011" for 1011_2); a decimal gold takes only base 10 ("10_8" restates, not answers, "8")."""
    bp, bg = _numeral(p), _numeral(g)
    return (_numeral(f"{p}_{bg[1]}") or bp) == bg if bg else \
        (g.isdigit() and bp[1] == 10 and int(bp[0]) == int(g)) if bp else None
MAX_SYMBOLIC_CHARS, MAX_BRACE_DEPTH = 256, 12   # the symbolic stage never sees a longer or deeper normalised answer
_SAFE_CHARS_RE = re.compile(r"[A-Za-z0-9\s\\{}\[\]()^_+\-*/=<>,.!|:;&']*")
_BOMB_RE = re.compile(r"__|\*\*|\^\s*(?:\{[^}]*(?:\^|\d{5})|[-+]?\d{5}|(?:[-+]?\d+|\\?[a-zA-Z]+)\^)|\d{5}\s*!")
def symbolic_safe(s: str) -> bool:
    """Whether a normalised answer may go to the symbolic stage (a screen for speed: the deadline holds without it):
    not too long, plain math characters, balanced braces, no "__", "**", power towers, 5-digit exponents or n!."""
    if len(s) > MAX_SYMBOLIC_CHARS or not _SAFE_CHARS_RE.fullmatch(s) or _BOMB_RE.search(s):
        return False
    depths = list(accumulate({"{": 1, "}": -1}.get(c, 0) for c in s)) or [0]
    return depths[-1] == 0 and min(depths) >= 0 and max(depths) <= MAX_BRACE_DEPTH
_normalize_gold = lru_cache(maxsize=65536)(normalize_answer)   # golds repeat group_size times per step
def _fast_check(pred: str | None, gold: str) -> tuple[bool | None, str, str]:
    """(equal?, or None: only the symbolic stage can tell; normalised pred; normalised gold)."""
    if pred is None or len(pred) > MAX_ANSWER_CHARS:
        return False, "", ""
    p, g = normalize_answer(pred), _normalize_gold(gold := str(gold))
    if p and g and ("=" in p) != ("=" in g):                # an equation against "y = 2x + 3": keep "y ="
        p, g = (normalize_answer(pred, True), g) if "=" in g else (p, _normalize_gold(gold, True))
    if not p or not g or p == g:
        return bool(p and p == g), p, g
    if "_" in p + g and (base := _base_check(p, g)) is not None:
        return base, p, g
    a, b = parse_number(p), parse_number(g)
    if a is not None and b is not None:                     # x% also equals x/100
        return _close(a, b) or ("%" in pred + gold and (_close(a * 100, b) or _close(a, b * 100))), p, g
    la, lb = parse_number_list(p), parse_number_list(g)
    if la and lb:                                           # tuples, intervals, sets of plain numbers
        return la[0] == lb[0] and len(la[1]) == len(lb[1]) and all(map(_close, la[1], lb[1])), p, g
    if (a is None) != (b is None):                          # a number is not several numbers, nor an expression in
        other, items = (p, la) if a is None else (g, lb)    # a variable
        if items and len(items[1]) > 1 or re.search(r"[a-df-hj-zA-Z]", re.sub(r"\\[a-zA-Z]+", "", other)):
            return False, p, g
    return (None if symbolic_safe(p) and symbolic_safe(g) else False), p, g

_PAPER_REPLACE = (("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
                  (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"))
_PAPER_REMOVE = ("square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
                 "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
                 "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
                 "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;",
                 ",\\!", "{,}", '"', "\\dots")
def _paper_line(line: str) -> str:
    i = line.find("$")                                      # the first $...$ span
    if (j := line.find("$", i + 1) if i >= 0 else -1) >= 0:
        line = line[i:j + 1]
    for cmd in ("text", "textbf", "overline"):
        line = re.sub(r"\\" + cmd + r"\{([^}\n]*)\}", r"\1", line)
    i, j = line.find("\\boxed{"), line.rfind("}")          # \boxed{ ... up to the line's last "}"
    return line[:i] + line[i + len("\\boxed{"):j] + line[j + 1:] if i >= 0 and j >= i + len("\\boxed{") else line
def normalize_paper(answer: str) -> str:
    r"""The official (Minerva-style) normaliser: after the last "=", the replacements and removed words; per line the
    first $...$ span, \text{} \textbf{} \overline{} \boxed{} unwrapped; \fracab \sqrta expanded; no "$", integer commas.
        >>> normalize_paper(r"x = \frac12"), normalize_paper(r"\$1,000"), normalize_paper(r"$\boxed{42}$.")
        ('\\frac{1}{2}', '1000', '42')
    """
    s = answer.split("=")[-1]
    for old, new in _PAPER_REPLACE + tuple((word, "") for word in _PAPER_REMOVE):
        s = s.replace(old, new)
    s = "\n".join(_paper_line(line) for line in s.split("\n"))
    s = re.sub(r"(sqrt)([^{])", r"sqrt{\2}", re.sub(r"(frac)([^{])(.)", r"frac{\2}{\3}", s)).replace("$", "")
    return (s.replace(",", "") if s.replace(",", "").isdigit() else s).strip()

# The symbolic stage: math-verify in pebble worker processes, each check under a deadline
WORKER_MEMORY_LIMIT = 4 << 30   # bytes a worker may map beyond what it maps at start (Linux): else MemoryError
_WARMUP = (("\\frac{1}{2}", "0.5"), ("x(x+1)", "x^2+x"), ("\\sqrt{8}", "2\\sqrt{2}"), ("\\{1,2\\}", "\\{2,1\\}"),
           ("[1,2)", "(1,2]"))
def _symbolic_equal(pred: str, gold: str) -> bool:
    """math-verify (LaTeX extraction, its timeouts off: ours is the kill). It compares a relation with a set only when
    the gold is the relation; a solved one-variable inequality ("0 < x < 12.5") names a set, which may be the gold."""
    from math_verify import LatexExtractionConfig, parse, verify as mv_verify   # in the workers only
    from sympy import FiniteSet, Or
    config = [LatexExtractionConfig()]        # never ExprExtractionConfig: it evals through parse_expr
    g, p = (parse(f"${s}$", extraction_config=config, parsing_timeout=None) for s in (gold, pred))
    if not (g and p):
        return False
    if mv_verify(g, p, timeout_seconds=None):
        return not _far_apart(g[0], p[0])
    several = isinstance(p[0], FiniteSet) and len(p[0]) > 1 and all(map(_solved_inequality, p[0].args))
    rel = Or(*p[0].args) if several else p[0]          # "x <= -1 or x >= 2" parses as a set of two relations
    return _solved_inequality(rel) and bool(mv_verify(g, [rel.as_set()], timeout_seconds=None))
def _far_apart(a, b) -> bool:
    """Two sympy constants more than REL_TOL apart, relative (math-verify's check is absolute: 1/2^98 = 1/2^99)."""
    try:
        x, y = (a.evalf(30), b.evalf(30)) if a != b and a.is_number and b.is_number else (0, 0)
        return bool(x != y and x.is_real and y.is_real and abs(x - y) > REL_TOL * max(abs(x), abs(y)))
    except Exception:                          # not sympy expressions (strings, matrices, ...)
        return False
def _solved_inequality(e) -> bool:
    """x > 3, 0 < x < 12.5, x <= -1 or x >= 2: inequalities between one variable and constants (not x^2 < 4)."""
    from sympy import And, Eq, Ne, Or, Rel, Symbol
    if isinstance(e, (And, Or)):
        return len(e.free_symbols) == 1 and all(map(_solved_inequality, e.args))
    return (isinstance(e, Rel) and not isinstance(e, (Eq, Ne)) and len(e.free_symbols) == 1
            and any(isinstance(x, Symbol) for x in e.args) and any(not x.free_symbols for x in e.args))
def _init_worker() -> None:
    """Before a worker's first job (on no deadline): the memory limit, then checks that warm math-verify up (~2 s)."""
    with suppress(ImportError, ValueError, OSError):   # Linux only
        import resource
        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (mapped + WORKER_MEMORY_LIMIT,) * 2)
    logging.getLogger("math_verify").setLevel(logging.ERROR)   # "timeout is disabled" warnings: we know
    list(map(_symbolic_equal, *zip(*_WARMUP)))   # builds the parser, imports sympy's simplifier: not on a deadline
def default_workers() -> int:                  # the CPUs this process may run on, at most 8
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))
_POOL, _POOL_LOCK, _KILLED = None, threading.Lock(), [0]    # (pebble pool, its size); checks killed at a deadline
def _pool(workers: int | None) -> pebble.ProcessPool:
    """The module's pool (at first use, after close_pool; another `workers` restarts it). Its workers fork from the
    forkserver, a fresh process importing the main script once (grpo.py: torch, ~8 s on 2 busy cores): scripts need
    the `if __name__` guard. A daemonic process cannot start it (daemonic processes may not have children)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or not _POOL[0].active or (workers and workers != _POOL[1]):
            if _POOL is not None:
                _POOL[0].stop()
            n, context = workers or default_workers(), multiprocessing.get_context("forkserver")
            _POOL = (pebble.ProcessPool(n, initializer=_init_worker, context=context), n)
        return _POOL[0]
def close_pool() -> None:
    """Stop the module's workers at once, also those checking (their pairs: not equal); the next check restarts."""
    global _POOL
    with _POOL_LOCK:
        pool, _POOL = _POOL, None
    if pool is not None:
        pool[0].stop()
        pool[0].join()
atexit.register(close_pool)
def pool_stats() -> dict:                      # {workers: the pool's size (0: none), killed: checks past a deadline}
    return {"workers": _POOL[1] if _POOL else 0, "killed": _KILLED[0]}
def symbolic_equal_many(pairs: list[tuple[str, str]], timeout: float = 1.0, workers: int | None = None) -> list[bool]:
    """math-verify equality of each (pred, gold) in the pool (no screen), each under `timeout` s from its start: past
    it the worker is killed and the pair is not equal, as when the check raised, its worker died or close_pool ran."""
    pool = _pool(workers)
    futures = [pool.schedule(_symbolic_equal, args=(str(p), str(g)), timeout=timeout) for p, g in pairs]
    pending, live = set(futures), lambda: _POOL is not None and _POOL[0] is pool
    while pending and live():                  # a pool stopped by close_pool may leave futures unresolved
        pending = wait(pending, timeout=0.5).not_done
    def outcome(f) -> bool:
        try:
            return f.done() and bool(f.result())
        except BrokenProcessPool as e:        # stopped (close_pool, a resize): not equal; broken by itself: every
            if live():                         # worker died in its set-up
                raise RuntimeError("symbolic verifier workers could not start (their error is on stderr)") from e
        except Exception as e:                 # past the deadline (TimeoutError), parse errors, MemoryError, ...
            _KILLED[0] += isinstance(e, TimeoutError)
        return False
    return [outcome(f) for f in futures]
def _correct(preds: list, golds: list, verifier: str, timeout: float, workers: int | None = None) -> list[bool]:
    """`verify` of each (pred, gold); the symbolic stage checks each distinct undecided pair once, all in parallel."""
    if verifier == "paper":
        return [p is not None and len(p) <= MAX_ANSWER_CHARS and normalize_paper(p) == normalize_paper(str(g))
                for p, g in zip(preds, golds)]
    fast = [_fast_check(pred, gold) for pred, gold in zip(preds, golds)]
    pairs = list(dict.fromkeys((p, g) for ok, p, g in fast if ok is None))
    symbolic = dict(zip(pairs, symbolic_equal_many(pairs, timeout, workers) if pairs else []))
    return [symbolic[p, g] if ok is None else ok for ok, p, g in fast]
def verify(pred: str | None, gold: str, verifier: str = "default", timeout: float = 1.0) -> bool:
    r"""Whether `pred` (from `extract_answer`) equals `gold`. "default": exact after `normalize_answer`, else numeric
    within REL_TOL (x% also equals x/100), else symbolic in a worker under `timeout` s (past it: False); "paper":
    the official string comparison. A missing or over-long `pred` is wrong. Raises ValueError for a bad argument.
        >>> [verify(p, g) for p, g in [("\\dfrac12", "0.5"), ("27", "27.0"), ("x = 3", "3"), ("1/2", "1/3")]]
        [True, True, True, False]
        >>> verify("0.5", "\\frac{1}{2}", verifier="paper")
        False
    """
    if verifier not in ("default", "paper") or timeout <= 0:
        raise ValueError(f"need verifier 'default' or 'paper' and timeout > 0 s, got verifier={verifier!r}, {timeout=}")
    return _correct([pred], [gold], verifier, timeout)[0]

# The format, the paper's rewards and the schedule that picks one per training step
def _structures(responses, tokenizer=None, tags=None) -> list:
    """parse_structure of each response, given as text (needs tokenizer) or as ids (needs tags or tokenizer)."""
    from attention import TagIds, parse_structure          # not at the top: the workers need no torch
    if tags is None and tokenizer is None:
        raise ValueError("pass tags= (attention.TagIds) or tokenizer= so the tag ids are known")
    if any(isinstance(r, str) for r in responses):
        if tokenizer is None:
            raise ValueError("a response given as text needs tokenizer= to find its tags; or pass its token ids")
        responses = tokenizer(list(responses), add_special_tokens=False)["input_ids"]
    tags = tags or TagIds.from_tokenizer(tokenizer)
    return [parse_structure(r, tags) for r in responses]
def check_format(response, tokenizer=None, tags=None) -> tuple[bool, str]:
    """(ok, reason) of a response's structure under `attention.parse_structure`'s rules; text needs `tokenizer`."""
    return (s := _structures([response], tokenizer, tags)[0]).valid, s.reason
def has_parallel(structure) -> bool:
    return len(structure.blocks) > 0          # at least one block, well-formed or not (the paper's "# Parallel")
def num_blocks(structure) -> int:
    return len(structure.blocks)
def parallel_positions(structure) -> list[float]:
    """Each block's <Parallel> index / response length (Figure 3: blocks move later over RL)."""
    return [b.start / structure.length for b in structure.blocks] if structure.length else []
REWARDS = {   # (correct, has_parallel, format_ok) -> the reward of one response (NOTES.md §4)
    "accuracy": lambda correct, par=None, fmt=None: 1.0 if correct else -1.0,   # S1, evaluation, S2's accuracy steps
    "parallel_gated": lambda correct, par, fmt: 1.0 if correct and par and fmt else -1.0,   # Seen's easy-RL stage
    "tiered": lambda correct, par, fmt: -1.0 if not correct else 1.0 if not par else 1.2 if fmt else -1.0}
SCHEDULES = ("accuracy", "parallel_gated", "tiered", "alternating", "scaffold")
@dataclass(frozen=True)
class RewardSchedule:
    """The reward of a (1-based) training step: "accuracy", "parallel_gated" or "tiered" at every step; "alternating"
    (Unseen S2): per window of `window` steps the first `accuracy_steps` accuracy, the rest tiered; "scaffold":
    alternating up to and including `switch_step`, accuracy after.
        >>> [RewardSchedule("scaffold", switch_step=20).kind_at(t) for t in (8, 9, 20, 21)]
        ['accuracy', 'tiered', 'tiered', 'accuracy']
        >>> RewardSchedule("alternating").reward(9, correct=True, has_parallel=True, format_ok=True)
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
            raise ValueError(f"need 0 <= accuracy_steps <= window, got {self.accuracy_steps=}, {self.window=}")
    def kind_at(self, step: int) -> str:
        # >>> exercise 8: the S2 alternating reward schedule
        if step < 1:
            raise ValueError(f"training steps count from 1, got step={step}")
        if self.name in REWARDS:
            return self.name
        after_switch = self.name == "scaffold" and step > self.switch_step
        return "accuracy" if after_switch or (step - 1) % self.window < self.accuracy_steps else "tiered"
        # <<< exercise 8
    def reward(self, step: int, correct: bool, has_parallel: bool | None = None,
               format_ok: bool | None = None) -> float:
        # >>> exercise 8: the reward of one response at a step
        kind = self.kind_at(step)
        if kind != "accuracy" and (has_parallel is None or format_ok is None):
            raise ValueError(f"the {kind!r} reward (step {step}) needs has_parallel and format_ok")
        return REWARDS[kind](correct, has_parallel, format_ok)
        # <<< exercise 8
def score_batch(responses: list[str], golds: list[str], *, structures=None, response_ids=None, tags=None,
                tokenizer=None, reward: str | RewardSchedule = "accuracy", step: int = 1, verifier: str = "default",
                timeout: float = 1.0, workers: int | None = None) -> list[dict]:
    """Score one step's responses (texts with the tags): per response {"reward", "correct", "pred", "kind",
    "has_parallel", "format_ok", "num_blocks"}. The structure: `structures` (the sampler's), else `response_ids` with
    `tags` or `tokenizer`, else the texts encoded by `tokenizer`, else None (only "accuracy" allows that)."""
    n = len(responses)
    if len(golds) != n:
        raise ValueError(f"score_batch got {n} responses but {len(golds)} golds")
    kind = (reward if isinstance(reward, RewardSchedule) else RewardSchedule(reward)).kind_at(step)
    verify(None, "", verifier, timeout)       # checks the arguments
    if structures is None and (response_ids is not None or tokenizer is not None):
        structures = _structures(response_ids if response_ids is not None else list(responses), tokenizer, tags)
    if structures is not None and len(structures) != n:
        raise ValueError(f"score_batch got {n} responses but {len(structures)} structures/response_ids")
    if structures is None and kind != "accuracy":
        raise ValueError(f"the {kind!r} reward needs the structure: structures=, response_ids= with tags=, tokenizer=")
    preds = [extract_answer(r) for r in responses]
    correct = _correct(preds, golds, verifier, timeout, workers)
    fields = [(has_parallel(s), s.valid, num_blocks(s)) if s is not None else (None,) * 3
              for s in structures or [None] * n]
    return [{"reward": REWARDS[kind](ok, par, fmt), "correct": ok, "pred": pred, "kind": kind, "has_parallel": par,
             "format_ok": fmt, "num_blocks": nb} for ok, pred, (par, fmt, nb) in zip(correct, preds, fields)]

if __name__ == "__main__":                     # python rewards.py RESPONSE_OR_ANSWER GOLD: do they match?
    print(verify(extract_answer(sys.argv[1]) or sys.argv[1], sys.argv[2])) if len(sys.argv) == 3 else \
        sys.exit("usage: python rewards.py RESPONSE_OR_ANSWER GOLD      # prints whether they match")
