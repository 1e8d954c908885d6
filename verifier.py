"""The answer checker behind the accuracy reward: find a response's final answer, and decide
whether it equals the gold answer, bounded in time. rewards.py uses `extract_answer` and
`correct_many`; a reader of the method may skip this file.

    extract_answer(text) -> pred    the last "Final Answer:" line, else the last \\boxed{}, else ...
    verify(pred, gold) -> bool      exact after `normalize_answer`, else numeric, else symbolic

The checks, cheapest first: equal strings after normalisation; numbers and lists of numbers by our
own parser (exact fractions, no eval); math-verify's LaTeX parser in pebble worker processes, each
check under a deadline (its worker is killed and the pair is wrong: math-verify's own signal.alarm
fails off the main thread and cannot stop a power computed in C). Model text is untrusted:
nothing calls eval, exec or sympify on it (nor math-verify's plain-expression extractor, whose
parse_expr evaluates Python). Unlike the official reward the whole response is read, not its last
300 characters, and "0.5" equals "\\frac{1}{2}" (NOTES.md §4, §8). Answers are read as LaTeX or
plain numbers; Python-style math (2*pi*r, sqrt(2), x**2) is rewritten as the LaTeX it means. d and
i are letters like any other (i also the imaginary unit), a logarithm's argument is what is
written with it, decimal coefficients compare within REL_TOL, a symbolic answer that states no
sign is read with positive variables (`symbolic_equal`), and a power is refused only for the size
of what it computes (`power_cost`).
"""
import atexit
import logging
import math
import multiprocessing
import os
import re
import threading
from concurrent.futures import wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import suppress
from fractions import Fraction
from functools import lru_cache
from itertools import accumulate

import pebble

MAX_ANSWER_CHARS = 1000    # a longer extracted answer is wrong without being looked at

# ---------------------------------------------------------------------------------------------
# Extraction

FINAL_ANSWER = re.compile(r"final\s*answer\s*\**\s*:", re.IGNORECASE)   # also **Final Answer:**
BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
# What may stand between two boxes of one list answer: a comma, ";", "and"/"or", "x =".
BOX_SEPARATOR = re.compile(r"[\s$]*(?:,|;|\\text\{\s*(?:and|or)\s*\}|\b(?:and|or)\b)?[\s$]*"
                           r"(?:[a-zA-Z]\s*=\s*)?[\s$]*")
MAX_BOX_GAP = 40           # boxes further apart than this are separate attempts
ANY_MARKER = re.compile(r"\\(?:boxed|fbox)\s*\{|####|final\s*answer\s*\**\s*:", re.IGNORECASE)
# The fallback: a response's last number. Not glued to a word ("Qwen2") nor a coefficient (3x,
# 4\sqrt2, 2\pi, 2^5); "8-4" gives 4; true thousands groups only ("70,000", "9{,}500"); "72 clips,
# in all." and "$29.00." end at the digits.
LAST_NUMBER = re.compile(
    r"(?<![\w.^])(?<!sqrt{)"                         # not glued to a word, a decimal, a power
    r"-?(?:\\[dt]?frac\{\d+\}\{\d+\}"                # \frac{1}{2}
    r"|\d{1,3}(?:(?:,|\{,\})\d{3})+(?!,?\d)"         # 70,000 or 9{,}500
    r"|\d+)"                                         # 42
    r"(?:\.\d+)?(?:/\d+)?"                           # .5, /3
    r"(?![\w/^]|\s*\\(?:sqrt|pi|cdot|times|d?frac))"  # not a coefficient
    r"(?:\s*\\?%)?")                                 # a percent sign
LAST_NUMBER_WINDOW = 300   # characters before the last digit that the fallback reads
BOX_LIST_SEPARATOR = ", "


@lru_cache(maxsize=1)
def markers() -> re.Pattern:
    """The tags, <eos>, <pad> and <|im_end|>-style markers (Qwen): removed before extraction."""
    # not at the top: the checker's workers import this module and need no torch
    from model import EOS, PAD, TAGS
    tags = sorted({*TAGS, EOS, PAD}, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, tags)) + r"|<\|[^|<>\n]{1,40}\|>")


def last_boxed(text: str) -> str | None:
    r"""The content of the last balanced `\boxed{}`/`\fbox{}` (one pass over the braces: O(n)),
    else None; the boxes right before it, apart by ",", "and"/"or" or "x =" only, make one list
    ("\boxed{3}, \boxed{5}" -> "3, 5")."""
    boxes = list(BOX_OPEN.finditer(text))
    opens = [m.end() - 1 for m in boxes]           # the index of each box's "{"
    close = {}                                     # the index of each "{" -> its "}"
    stack = []
    first_open = opens[0] if opens else len(text)
    for brace in re.compile(r"[{}]").finditer(text, first_open):
        if brace[0] == "{":
            stack.append(brace.start())
        elif stack:
            close[stack.pop()] = brace.start()
    closed = [k for k in range(len(opens)) if opens[k] in close]
    if not closed:
        return None
    k = closed[-1]
    parts = [text[opens[k] + 1:close[opens[k]]].strip()]
    while k:                                       # walk back over the boxes of one list
        previous_end = close.get(opens[k - 1], len(text))
        start = boxes[k].start()
        near = previous_end < start <= previous_end + MAX_BOX_GAP
        if not (near and BOX_SEPARATOR.fullmatch(text, previous_end + 1, start)):
            break
        k -= 1
        parts.append(text[opens[k] + 1:close[opens[k]]].strip())
    return BOX_LIST_SEPARATOR.join(dict.fromkeys(reversed(parts)))


def last_line_after(pattern: re.Pattern | str, text: str) -> str | None:
    """The rest of the line after the last match of `pattern` that some text follows."""
    for match in reversed(list(re.finditer(pattern, text, re.IGNORECASE))):
        end = text.find("\n", match.end())
        line = text[match.end():end if end >= 0 else None]
        line = line.strip().strip("*#").strip()
        if line:
            return line
    return None


def extract_answer(text: str) -> str | None:
    r"""The final answer of a response (tags and <eos>/<pad>/<|...|> markers removed), or None: the
    last non-empty `Final Answer:` line (any case, bold allowed; a `\boxed{}` in it: its content),
    else `last_boxed`, else the rest of the line after the last `####` that some text follows; with
    no marker at all (an empty one is no answer) the last number, GSM8K's "flexible" rule. Which
    rule found it: `extract_answer_by_rule`.
        >>> extract_answer(r"\boxed{1} then \boxed{\frac{1}{2}}"), extract_answer("#### 1,234")
        ('\\frac{1}{2}', '1,234')
        >>> extract_answer(r"so \boxed{3}, \boxed{5}"), extract_answer("It is $70,000.")
        ('3, 5', '70,000')
        >>> extract_answer(r"\boxed{} 4"), extract_answer("no")
        (None, None)
    """
    return extract_answer_by_rule(text)[0]


# The rules of extract_answer, in the order it tries them: an answer the response states behind
# a marker (STATED_RULES), else the last-number fallback.
STATED_RULES = ("final_answer", "boxed", "####")
LAST_NUMBER_RULE = "last_number"


def extract_answer_by_rule(text: str) -> tuple[str | None, str | None]:
    """(extract_answer's answer, the rule that found it: one of STATED_RULES or
    LAST_NUMBER_RULE; None with no answer).
        >>> extract_answer_by_rule("Final Answer: 7"), extract_answer_by_rule("it is 7")
        (('7', 'final_answer'), ('7', 'last_number'))
    """
    if not isinstance(text, str):
        raise TypeError(f"extract_answer takes the response text (str), got {type(text).__name__}")
    text = markers().sub("", text)
    line = last_line_after(FINAL_ANSWER.pattern, text)
    if line is not None:
        return last_boxed(line) or line, "final_answer"
    boxed = last_boxed(text)
    if boxed:
        return boxed, "boxed"
    line = last_line_after("####", text)
    if line is not None:
        return line, "####"
    if ANY_MARKER.search(text):                    # a marker with nothing in it: no answer
        return None, None
    last_digit = max(text.rfind(digit) for digit in "0123456789")   # C-speed scans
    window_start = max(0, last_digit - LAST_NUMBER_WINDOW)
    numbers = LAST_NUMBER.findall(text, window_start, last_digit + 8)
    if not numbers:
        return None, None
    return numbers[-1], LAST_NUMBER_RULE


# ---------------------------------------------------------------------------------------------
# Normalisation

UNICODE_TO_LATEX = str.maketrans({"\u2212": "-", "\u2013": "-", "\u00d7": "\\times ",
                                  "\u00b7": "\\cdot ", "\u00b0": "", "\u2009": " ", "\u00a0": " ",
                                  "\u221e": "\\infty ", "\u03c0": "\\pi "})
# Spacing and sizing macros, math delimiters: dropped.
LAYOUT = re.compile(r"\\(?:left|right|displaystyle|quad|qquad)(?![a-zA-Z])"
                    r"|(?<!\\)\\[!,;: ]|~|\\\$|\$|\\[()\[\]]")
DEGREE_OR_PERCENT = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|\\degree|\\?%")
TEXT_UNIT = re.compile(r"(\d)\s*\\(?:text|mbox|mathrm)\s*\{[^{}]*\}(?:\s*\^\s*\{?\d\}?)?\s*$")
TEXT_MACRO = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
SHORT_UNITS = frozenset({"cm", "mm", "km", "kg", "mg", "ml", "m", "g", "s", "h", "ft", "in", "mi",
                         "lb", "lbs", "oz", "hr", "hrs", "min", "sec", "mph", "L"})
LEADING_NUMBER = re.compile(r"[-+]?\d[\d.,/]*")
UNIT_WORD = re.compile(r"([a-zA-Z]+)\.?(?:\^\{?\d\}?)?")
SPACE_NOT_BETWEEN_LETTERS = re.compile(r"\s+(?![a-zA-Z])|(?<![a-zA-Z])\s+")
LONE_VARIABLE_LHS = re.compile(r"^[a-zA-Z](?:_\{?\w+\}?)?=(?!.*=)")   # "x=", "x_1=" (one "=")
ONE_VARIABLE_LIST = re.compile(r"([a-zA-Z])=[^=,]+(?:,\1=[^=,]+)+")   # "x=2,x=3"
LIST_WORD = re.compile(r"\s*,?\s*\b(?:and|or)\b\s*")                 # "19, 46, and 82", "1 or -2"
MIXED_NUMBER_TEXT = re.compile(r"(?<![\w.,/^])(\d{1,12})\s+(\d{1,12})/(\d{1,12})(?![\w.,/])")
THOUSANDS = re.compile(r"^[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
BRACED_THOUSANDS = re.compile(r"(?<!\\)\{([-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?)\}")   # {1,000}, not \{
# "{a}_{n}", "{\\alpha}^{2}": braces around a one-letter (or one control word) base, as sympy's
# printer writes an indexed base. Not after a letter (\vec{v}_1 would become \vecv_1), a literal
# \{, or a subscript's own group (x_{a}_{b}); a \frac or \sqrt argument may lose its braces
# (\frac{a}{b}_1 is \frac{a}b_1 to TeX), brace_tex_arguments puts them back.
BRACED_BASE = re.compile(r"(?<![\\A-Za-z_^])\{([A-Za-z]|\\[A-Za-z]+)\}(?=[_^])")
BRACED_SUBSCRIPT = re.compile(r"_\{([A-Za-z0-9])\}")   # x_{i} is x_i to TeX, not to the parser


def strip_unit_words(s: str) -> str:
    """"5 apples", "12 square feet", "3cm" -> the number: words of 2+ letters after a space, or
    short units; but not several one-letter words ("2 m s" is the product 2ms)."""
    number = LEADING_NUMBER.match(s)
    if not number:
        return s
    words = [UNIT_WORD.fullmatch(w) for w in s[number.end():].split()]
    if not words or not all(words):
        return s
    if len(words) > 1 and all(len(word[1]) == 1 for word in words):
        return s                                 # "2 m s": letters side by side, a product
    apart = s[number.end()].isspace()
    for k, word in enumerate(words):
        long_word = (k or apart) and len(word[1]) >= 2
        if not (long_word or word[1] in SHORT_UNITS):
            return s
    return number[0]


def unwrap_text(match: re.Match) -> str:
    r"""The content of a \text-like macro (TEXT_MACRO), spaced apart. A number in it loses its
    thousands commas: inside an expression (\frac{\text{1,000}}{2}) "1,000" would read as 1, 000."""
    inner = match[1]
    if THOUSANDS.match(inner.strip()):
        inner = inner.replace(",", "")
    return f" {inner} "


def drop_braced_thousands(match: re.Match) -> str:
    """A braced group holding one thousands-grouped number, without the commas: a fraction's
    numerator or denominator is one number, never a list ({1,000} -> {1000})."""
    return "{" + match[1].replace(",", "") + "}"


# TeX macro arguments without braces: \frac12 is \frac{1}{2} (TeX reads one token as an argument)
TEX_TOKEN = re.compile(r"\\[a-zA-Z]+|\\.|\s+|.", re.DOTALL)   # control word or symbol, spaces, char
TEX_ATOM = re.compile(r"[A-Za-z0-9]|\\[a-zA-Z]+")      # a token that may be a whole argument
TEX_ARGUMENTS = {"\\frac": 2, "\\sqrt": 1}            # \dfrac and \tfrac are \frac by then


def matching_braces(tokens: list[str]) -> dict[int, int] | None:
    """The index of each "{" token -> the index of its "}"; None when the braces do not balance."""
    closing = {}
    opened = []
    for i, token in enumerate(tokens):
        if token == "{":
            opened.append(i)
        elif token == "}" and not opened:
            return None
        elif token == "}":
            closing[opened.pop()] = i
    return None if opened else closing


def skip_spaces(tokens: list[str], i: int) -> int:
    """The first token index from i on that is not spaces (TeX skips them before an argument)."""
    while i < len(tokens) and tokens[i].isspace():
        i += 1
    return i


def root_index_end(tokens: list[str], i: int) -> int:
    """For a \\sqrt before token i: the index past its root index "[3]", else i (no index)."""
    j = skip_spaces(tokens, i)
    if j == len(tokens) or tokens[j] != "[" or "]" not in tokens[j:]:
        return i
    return tokens.index("]", j) + 1


def brace_tex_arguments(s: str) -> str:
    r"""Braces around the one-token arguments of \frac and \sqrt, as TeX reads them: \frac12 ->
    \frac{1}{2}, \frac1{12} -> \frac{1}{12}, \frac{1}2 -> \frac{1}{2}, \frac a b -> \frac{a}{b},
    \frac\pi2 -> \frac{\pi}{2}, \sqrt2 -> \sqrt{2}, \sqrt[3]8 -> \sqrt[3]{8}; and so \frac123 ->
    \frac{1}{2}3. math-verify's parser needs the braces. An argument is one digit, letter or
    control word (never "(": \sqrt(2) stays as written). A \frac or \sqrt right after "^" or "_" is
    that script's one argument, as TeX reads it: x^\frac12 -> x^{\frac{1}{2}}. One pass over the TeX
    tokens; text whose braces do not balance comes back unchanged.
        >>> brace_tex_arguments(r"\frac a b+\sqrt[3]8"), brace_tex_arguments(r"\frac{\frac12}3")
        ('\\frac{a}{b}+\\sqrt[3]{8}', '\\frac{\\frac{1}{2}}{3}')
    """
    if "\\frac" not in s and "\\sqrt" not in s:
        return s
    tokens = TEX_TOKEN.findall(s)
    closing = matching_braces(tokens)
    if closing is None:
        return s
    out = []
    # the index of a "}" -> (the arguments its macro still wants after it, whether a "}" closes
    # the group of a macro written right after "^" or "_", once its last argument is in)
    wanted_after = {}
    grouped = set()          # the index of each macro right after "^" or "_"
    i = 0
    while i < len(tokens):
        token = tokens[i]
        out.append(token)
        wanted, close_group = wanted_after.pop(i, (0, False))
        if token in TEX_ARGUMENTS:
            wanted = TEX_ARGUMENTS[token]
            close_group = i in grouped
        i += 1
        if token in ("^", "_"):                    # x^\frac12: the macro with its arguments is
            j = skip_spaces(tokens, i)             # the script's one argument, a group
            if j < len(tokens) and tokens[j] in TEX_ARGUMENTS:
                out.append("{")
                grouped.add(j)
        if token == "\\sqrt":
            end = root_index_end(tokens, i)
            out.extend(tokens[i:end])              # the root index, as it is
            i = end
        while wanted:
            j = skip_spaces(tokens, i)
            if j < len(tokens) and tokens[j] == "{":        # a braced argument: its "}" goes on
                wanted_after[closing[j]] = (wanted - 1, close_group)
                close_group = False
                break
            if j == len(tokens) or not TEX_ATOM.fullmatch(tokens[j]):
                break
            out.append("{" + tokens[j] + "}")
            i = j + 1
            wanted -= 1
        if close_group:
            out.append("}")
    return "".join(out)


# Python-style math, read as the LaTeX it means by rewriting text only (never evaluated)
PYTHON_NAMES = r"(?<![\\A-Za-z])(?:sqrt|exp|abs|log|ln|sin|cos|tan|pi)(?![A-Za-z])"   # not \pi
PYTHON_HINT = re.compile(r"\*|" + PYTHON_NAMES)
PYTHON_GROUP = r"\((?:[^()]|\([^()]*\))*\)"          # (...) holding at most one level of (...)
PYTHON_OPERAND = r"-?(?:\d+(?:\.\d+)?|[A-Za-z]\w*(?:" + PYTHON_GROUP + r")?|" + PYTHON_GROUP + ")"
# x**2, 2**(n+1), 2**sqrt(2); not a tower 2**3**4 (its "**" stays, so the screen refuses it)
PYTHON_POWER = re.compile(r"\*\*\s*(" + PYTHON_OPERAND + r")(?![\w.(]|\s*\*\*)")
PYTHON_CALL_OR_PARENTHESIS = re.compile(
    r"(?<![\\A-Za-z])(sqrt|exp|abs|log|ln|sin|cos|tan)\s*\(|[()]")
PYTHON_CALLS = {                                   # function -> its LaTeX opening and closing
    "sqrt": ("\\sqrt{", "}"),
    "exp": ("e^{", "}"),
    "abs": ("\\left|", "\\right|"),
    "log": ("\\ln(", ")"),                         # Python's log is natural, LaTeX's \log is not
    "ln": ("\\ln(", ")"),
    "sin": ("\\sin(", ")"),
    "cos": ("\\cos(", ")"),
    "tan": ("\\tan(", ")"),
}
PYTHON_PI = re.compile(r"(?<![\\A-Za-z])pi(?![A-Za-z])")
PYTHON_TIMES = re.compile(r"\s*(?<!\*)\*(?!\*)\s*")   # one "*" (not a "**" left over), its spaces


def python_calls(s: str) -> str:
    """sqrt(...), exp(...), abs(...), log(...), ... as LaTeX, each closed at its own ")": one
    pass with a stack of closings. Parentheses that do not balance leave s as it is."""
    out = []
    closings = []
    position = 0
    for m in PYTHON_CALL_OR_PARENTHESIS.finditer(s):
        out.append(s[position:m.start()])
        position = m.end()
        if m[0] == ")":
            if not closings:
                return s
            out.append(closings.pop())
            continue
        if m[1]:
            opening, closing = PYTHON_CALLS[m[1]]
        else:
            opening, closing = "(", ")"
        out.append(opening)
        closings.append(closing)
    out.append(s[position:])
    return s if closings else "".join(out)


def python_to_latex(s: str) -> str:
    r"""Python-style math as LaTeX, so that it is judged like the LaTeX it means: x**2 -> x^{2},
    2*pi*r -> 2\cdot \pi\cdot r, sqrt(x) -> \sqrt{x}, exp(x) -> e^{x}, log(x) -> \ln(x), abs(x)
    -> \left|x\right|, sin(x) -> \sin(x). Text rewriting only (regexes and one pass with a stack,
    on at most MAX_ANSWER_CHARS): no eval, sympify or parse_expr ever sees model text. A name
    counts only as a whole word that does not follow a backslash (\pi, \sqrt(2) stay).
        >>> python_to_latex("2*pi*r"), python_to_latex("-1 + exp(16)"), python_to_latex("x**2")
        ('2\\cdot \\pi\\cdot r', '-1 + e^{16}', 'x^{2}')
    """
    if not PYTHON_HINT.search(s):
        return s
    s = PYTHON_POWER.sub(r"^{\1}", s)
    if "(" in s:
        s = python_calls(s)
    s = PYTHON_PI.sub(r"\\pi", s)                  # no space: no letter follows (PYTHON_PI)
    return PYTHON_TIMES.sub(r"\\cdot ", s)


# A logarithm and its argument: \ln, \log, \lg, a base (\log_2, \log_{10}), then a braced argument
# or an unbraced one: a number and/or letters written together, with a power (2x, x^2, 10).
LOG_ARGUMENT = re.compile(
    r"(\\(?:ln|log|lg)(?![A-Za-z])(?:\s*_\s*(?:\{[^{}]*\}|[A-Za-z0-9]))?)\s*"
    r"(?:\{([^{}]*)\}|((?:\d+(?:\.\d+)?[A-Za-z]*|[A-Za-z]+)(?:\^(?:\{[^{}]*\}|[A-Za-z0-9]))?))")


def parenthesised_argument(match: re.Match) -> str:
    """A LOG_ARGUMENT match as the logarithm (with its base) and its argument in parentheses."""
    argument = match[2]                        # braced
    if argument is None:
        argument = match[3]                    # written together after the name
    return f"{match[1]}({argument})"


def bind_log_arguments(s: str) -> str:
    r"""Each logarithm's argument in parentheses, so that the parser cannot stretch it over the
    product or quotient that follows: a braced argument is the group (\log_2{8}/3 -> \log_2(8)/3),
    an unbraced one is what is written together right after it (\ln 2x -> \ln(2x) as \sin 2x,
    but \ln 2 x -> \ln(2) x, x times \ln 2; \log_2 8/3 -> \log_2(8)/3: a quotient is not the
    argument). One linear regex pass: bounded in time.
        >>> bind_log_arguments(r"\ln 2 x"), bind_log_arguments(r"\log_{2}{8}/3")
        ('\\ln(2) x', '\\log_{2}(8)/3')
    """
    return LOG_ARGUMENT.sub(parenthesised_argument, s)


def normalize_answer(answer: str, keep_lhs: bool = False) -> str:
    r"""The canonical string of an answer: without $ \( \) \[ \], an outer \boxed, \left/\right,
    units after a number, degree and percent signs, a trailing period, thousands separators, a
    lone "x =" (also "x=2, x=3" -> "2,3"; kept with keep_lhs), spaces but between two letters;
    \dfrac12 -> \frac{1}{2}, \sqrt2 -> \sqrt{2}, "1 1/4" -> 1\frac{1}{4}, "and"/"or" -> ",",
    {a}_{n} -> a_n; \log_2 8/3 -> \log_2(8)/3 (bind_log_arguments);
    \text{1,000} -> 1000 anywhere; Python-style math as LaTeX (2*pi -> 2\cdot \pi).
        >>> normalize_answer(r"$\boxed{\dfrac12}$."), normalize_answer(r"x = 1{,}000 \text{ km}")
        ('\\frac{1}{2}', '1000')
    """
    s = answer.strip().translate(UNICODE_TO_LATEX)
    s = last_boxed(s) or s
    s = LAYOUT.sub(" ", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("{,}", "")
    s = DEGREE_OR_PERCENT.sub("", s)
    s = TEXT_UNIT.sub(r"\1", s)
    s = TEXT_MACRO.sub(unwrap_text, s)
    s = s.strip().rstrip(".").strip()
    s = python_to_latex(s)
    if "\\l" in s:
        s = bind_log_arguments(s)
    if "and" in s or "or" in s:
        s = LIST_WORD.sub(",", s)
    s = strip_unit_words(s)
    if "/" in s:
        s = MIXED_NUMBER_TEXT.sub(r"\1\\frac{\2}{\3}", s)
    s = SPACE_NOT_BETWEEN_LETTERS.sub("", s)
    s = BRACED_BASE.sub(r"\1", s)
    s = BRACED_SUBSCRIPT.sub(r"_\1", s)
    if not keep_lhs:
        s = LONE_VARIABLE_LHS.sub("", s)
        if "=" in s and ONE_VARIABLE_LIST.fullmatch(s):
            s = re.sub(r"(^|,)[a-zA-Z]=", r"\1", s)
    if "," in s:
        s = BRACED_THOUSANDS.sub(drop_braced_thousands, s)
    s = brace_tex_arguments(s).rstrip(".")
    if THOUSANDS.match(s):
        s = s.replace(",", "")
    return s


# ---------------------------------------------------------------------------------------------
# The fast checks: numbers, lists of numbers, numerals in other bases

REL_TOL = 1e-6             # numeric equality: |a - b| <= REL_TOL * max(|a|, |b|)
MAX_NUMBER_CHARS = 100     # a longer string is not read as a number
DECIMAL = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)"
FLOAT = re.compile(DECIMAL + r"(?:[eE][-+]?\d{1,4})?")
SCIENTIFIC = re.compile(r"(?:(" + DECIMAL + r")(?:\\times|\\cdot|\*)|([-+]?))"   # 1.5\times or -
                        r"10\^\{?([-+]?\d{1,4})\}?")
FRAC = re.compile(r"([-+]?)\\frac\{(" + DECIMAL + r")\}\{(" + DECIMAL + r")\}")
SLASH = re.compile(r"()(" + DECIMAL + r")/(" + DECIMAL + r")")
MIXED_NUMBER = re.compile(r"([-+]?)(\d{1,12})\\frac\{(\d{1,12})\}\{(\d{1,12})\}")   # 2\frac{1}{2}


def parse_number(s: str) -> Fraction | None:
    r"""The exact value of a normalised plain number (42, 27.0, .5, 1.5e3, 1.5\times10^{3}, 3/4,
    \frac{3}{4}, the mixed number 2\frac{1}{2}), else None. Exponents have at most 4 digits, so
    nothing big is computed; no eval.
        >>> parse_number(r"-\frac{1}{2}"), parse_number("1.5e3"), parse_number("x+1")
        (Fraction(-1, 2), Fraction(1500, 1), None)
    """
    if len(s) > MAX_NUMBER_CHARS:
        return None
    if FLOAT.fullmatch(s):
        return Fraction(s)
    m = SCIENTIFIC.fullmatch(s)
    if m:
        mantissa = m[1] or (m[2] or "") + "1"
        return Fraction(mantissa) * Fraction(10) ** int(m[3])
    m = FRAC.fullmatch(s) or SLASH.fullmatch(s)
    if m and Fraction(m[3]):
        sign = -1 if m[1] == "-" else 1
        return sign * Fraction(m[2]) / Fraction(m[3])
    m = MIXED_NUMBER.fullmatch(s)
    if m and int(m[4]):
        sign = -1 if m[1] == "-" else 1
        return sign * (int(m[2]) + Fraction(int(m[3]), int(m[4])))
    return None


def parse_number_list(s: str) -> tuple[str, list[Fraction]] | None:
    r"""(kind, values) of a tuple, interval, set or bare list of plain numbers, else None: kind
    "set" (\{...\} or a bare comma list, unordered: sorted) or the two brackets ("()", "[)", ...).
        >>> parse_number_list(r"\{3,1,2\}"), parse_number_list("(x,1)")
        (('set', [Fraction(1, 1), Fraction(2, 1), Fraction(3, 1)]), None)
    """
    braces = s.startswith("\\{") and s.endswith("\\}")
    brackets = len(s) > 2 and s[0] in "([" and s[-1] in ")]"
    if braces:
        kind = "set"
        body = s[2:-2]
    elif brackets:
        kind = s[0] + s[-1]
        body = s[1:-1]
    elif "," in s:
        kind = "set"
        body = s
    else:
        return None
    values = [parse_number(x) for x in body.split(",")]
    if None in values:
        return None
    if kind == "set":
        return kind, sorted(values)
    if len(values) < 2:                            # "(3)" is a number in parentheses
        return None
    return kind, values


def close(a: Fraction, b: Fraction) -> bool:
    """Within REL_TOL, relative (1e-10 and 2e-10 differ); two integers only when equal (1000000
    is not 1000001)."""
    if a == b:
        return True
    if a.denominator == 1 and b.denominator == 1:
        return False
    return abs(a - b) <= REL_TOL * max(abs(a), abs(b))


BASE_NUMERAL = re.compile(r"([0-9A-Za-z]{0,64}[0-9][0-9A-Za-z]{0,64})_\{?(\d{1,2})\}?")   # 1011_2
MAX_BASE = 36


def numeral(s: str) -> tuple[str, int] | None:
    """(digits, base) of a valid numeral with a base subscript ("2C_{16}"), else None."""
    m = BASE_NUMERAL.fullmatch(s)
    if not m:
        return None
    base = int(m[2])
    if not 2 <= base <= MAX_BASE or any(int(c, MAX_BASE) >= base for c in m[1]):
        return None
    return m[1].upper().lstrip("0") or "0", base


def base_check(p: str, g: str) -> bool | None:
    """Answers in another base: None unless a side has a base subscript. Two bases never match; a
    prediction may drop the gold's subscript ("1011" for 1011_2); a decimal gold takes only base
    10 ("10_8" restates, not answers, "8")."""
    pred = numeral(p)
    gold = numeral(g)
    if gold:
        return (numeral(f"{p}_{gold[1]}") or pred) == gold
    if pred:
        return g.isdigit() and pred[1] == 10 and int(pred[0]) == int(g)
    return None


MAX_SYMBOLIC_CHARS = 256   # the symbolic stage never sees a longer normalised answer ...
MAX_BRACE_DEPTH = 12       # ... nor a deeper one
SAFE_CHARACTERS = re.compile(r"[A-Za-z0-9\s\\{}\[\]()^_+\-*/=<>,.!|:;&']*")
# "__", "**", a double superscript (2^3^4: no TeX), big factorials: never an answer. Powers are
# measured by power_cost.
EXPRESSION_BOMB = re.compile(r"__|\*\*|\^\s*(?:[-+]?\d+|\\?[a-zA-Z]+)\^|\d{5}\s*!")
MAX_POWER_BITS = 1 << 16     # a power of numbers whose value may need more bits is refused ...
MAX_SYMBOLIC_EXPONENT = 9999  # ... and a constant exponent over this on a variable (an expansion)
POWER_TOKEN = re.compile(r"\d+(?:\.\d+)?|\\[a-zA-Z]+|.", re.DOTALL)
NEUTRAL_WORDS = frozenset({"\\frac", "\\sqrt", "\\cdot", "\\times", "\\div"})   # no value of own
MAX_LOG2_EXPONENT = 60       # an exponent bound beyond 2^60 is infinite here
VARIABLE_LETTER = re.compile(r"[a-df-hj-zA-Z]")    # a letter that is no e or i
WORD = re.compile(r"[A-Za-z]{2,}")                  # "no", "left", "Evelyn": a word, not a product
CONTROL_WORD = re.compile(r"\\[a-zA-Z]+")
MAY_CANCEL = re.compile(r"[-/\\]")                  # a minus, a division, a control word (\frac)


def matching_groups(tokens: list[str]) -> dict[int, int]:
    """The index of each "{" or "(" token -> the index of its closing one (unmatched: none)."""
    closing = {}
    opened = {"{": [], "(": []}
    for i, token in enumerate(tokens):
        if token in opened:
            opened[token].append(i)
        elif token == "}" and opened["{"]:
            closing[opened["{"].pop()] = i
        elif token == ")" and opened["("]:
            closing[opened["("].pop()] = i
    return closing


def power_cost(s: str) -> tuple[float, float]:
    r"""(the most bits the value of a power of numbers in s may need, the largest constant exponent
    on a variable or constant like \pi): what a power really costs sympy. A bound from the written
    numbers, never computed: a group's value is bounded by the product of its numbers (each at
    least 2), b^E needs E * bits(b) bits. 2^{10000}: 10,000 bits; 10^{10^{10}}: 3.3e10 bits;
    2^{x^2}, e^{-x^2}: an exponent in a variable costs nothing; (x+1)^{20000}: exponent 20,000.
        >>> power_cost("2^{1024}"), power_cost("e^{-x^2}")
        ((1024.0, 0.0), (0.0, 2.0))
    """
    tokens = POWER_TOKEN.findall(s)
    closing = matching_groups(tokens)
    worst = [0.0, 0.0]

    def bound(start: int, stop: int) -> tuple[float, bool]:
        """(log2 bound of the value of tokens[start:stop], whether a variable is in it)."""
        total = 0.0
        symbolic = False
        last = None                            # the last factor: (log2 bound, symbolic)
        i = start
        while i < stop:
            token = tokens[i]
            if token in ("^", "_"):            # a script: its group, or one token
                j = i + 1
                while j < stop and tokens[j].isspace():
                    j += 1
                if j in closing:
                    script = bound(j + 1, closing[j])
                    i = closing[j] + 1
                else:
                    script = bound(j, min(j + 1, stop))
                    i = j + 1
                if token == "^" and last is not None:
                    last = power(last, script)
                continue
            if last is not None:               # the factor before is complete
                total += last[0]
                symbolic = symbolic or last[1]
                last = None
            if token[0].isdigit():             # 1.05 bounds as 105: an exact rational's bits
                digits = int(token.replace(".", ""))
                last = (max(1.0, math.log2(max(digits, 2))), False)
            elif i in closing:
                last = bound(i + 1, closing[i])
                i = closing[i]
            elif token[0].isalpha() or (token.startswith("\\") and token not in NEUTRAL_WORDS):
                last = (1.0, True)
            i += 1
        if last is not None:
            total += last[0]
            symbolic = symbolic or last[1]
        return total, symbolic

    def power(base: tuple[float, bool], exponent: tuple[float, bool]) -> tuple[float, bool]:
        if exponent[1]:                        # b^x: nothing to compute
            return base[0], True
        size = math.inf
        if exponent[0] <= MAX_LOG2_EXPONENT:
            size = 2.0 ** exponent[0]
        if base[1]:                            # x^E, \pi^E, (x+1)^E
            worst[1] = max(worst[1], size)
            return base[0], True
        bits = size * base[0]
        worst[0] = max(worst[0], bits)
        return bits, False

    bound(0, len(tokens))
    return worst[0], worst[1]


def symbolic_safe(s: str) -> bool:
    """Whether a normalised answer may go to the symbolic stage (a screen for speed: the deadline
    holds without it): not too long, plain math characters, balanced braces, no "__", "**",
    power towers, 5-digit exponents or n!."""
    if len(s) > MAX_SYMBOLIC_CHARS or not SAFE_CHARACTERS.fullmatch(s) or EXPRESSION_BOMB.search(s):
        return False
    depths = list(accumulate({"{": 1, "}": -1}.get(c, 0) for c in s)) or [0]
    if not (depths[-1] == 0 and min(depths) >= 0 and max(depths) <= MAX_BRACE_DEPTH):
        return False
    if "^" not in s:
        return True
    number_bits, symbolic_exponent = power_cost(s)
    return number_bits <= MAX_POWER_BITS and symbolic_exponent <= MAX_SYMBOLIC_EXPONENT


normalize_gold = lru_cache(maxsize=65536)(normalize_answer)   # golds repeat group_size times


def depends_on_a_variable(s: str) -> bool:
    """Whether a normalised answer surely depends on a variable (so it is no number): it holds a
    variable letter (not e or i, outside control words) and either has no minus, division or
    control word or i (a sum of products with plus signs only: 54x^2+108x), or some variable
    letter in it occurs once. Terms may cancel otherwise (x - x, \\frac{x}{x}, \\sin^2x+\\cos^2x,
    ji^2+j with i^2 = -1): such an answer may equal a number, and the symbolic stage decides."""
    without_words = CONTROL_WORD.sub("", s)
    letters = VARIABLE_LETTER.findall(without_words)
    if not letters:
        return False
    if not (MAY_CANCEL.search(s) or "i" in without_words):
        return True
    return any(letters.count(letter) == 1 for letter in set(letters))


def fast_check(pred: str | None, gold: str) -> tuple[bool | None, str, str]:
    """(equal? or None: only the symbolic stage can tell; normalised pred; normalised gold)."""
    if pred is None or len(pred) > MAX_ANSWER_CHARS:
        return False, "", ""
    gold = str(gold)
    p = normalize_answer(pred)
    g = normalize_gold(gold)
    if p and g and ("=" in p) != ("=" in g):      # an equation against "y = 2x + 3": keep "y ="
        if "=" in g:
            p = normalize_answer(pred, True)
        else:
            g = normalize_gold(gold, True)
    if not p or not g or p == g:
        return bool(p and p == g), p, g
    if WORD.fullmatch(p) and WORD.fullmatch(g):   # two words: "on" is not "no" (a product would be)
        return p.lower() == g.lower(), p, g
    if "_" in p + g:
        in_base = base_check(p, g)
        if in_base is not None:
            return in_base, p, g
    a = parse_number(p)
    b = parse_number(g)
    if a is not None and b is not None:           # x% also equals x/100
        percent = "%" in pred + gold
        equal = close(a, b) or (percent and (close(a * 100, b) or close(a, b * 100)))
        return equal, p, g
    pred_list = parse_number_list(p)
    gold_list = parse_number_list(g)
    if pred_list and gold_list:                   # tuples, intervals, sets of plain numbers
        same_kind = pred_list[0] == gold_list[0] and len(pred_list[1]) == len(gold_list[1])
        return same_kind and all(map(close, pred_list[1], gold_list[1])), p, g
    if (a is None) != (b is None):        # a number is not several numbers, nor an expression
        other, items = (p, pred_list) if a is None else (g, gold_list)     # in a variable
        several = items and len(items[1]) > 1
        if several or depends_on_a_variable(other):
            return False, p, g
    if symbolic_safe(p) and symbolic_safe(g):
        return None, p, g
    return False, p, g


# ---------------------------------------------------------------------------------------------
# The official (Minerva-style) string comparison, verifier="paper"

PAPER_REPLACE = (("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""),
                 ("mbox", "text"), (",\\text{and}", ","), ("\\text{and}", ","),
                 ("\\text{m}", "\\text{}"))
PAPER_REMOVE = ("square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units",
                "\\ldots", "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm",
                "gm", "pounds", "meters", "meals", "edges", "students", "childrentickets",
                "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3",
                "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;", ",\\!",
                "{,}", '"', "\\dots")


def paper_line(line: str) -> str:
    """One line of `normalize_paper`: its first $...$ span, \\text{} \\textbf{} \\overline{} and
    \\boxed{} unwrapped."""
    i = line.find("$")
    j = line.find("$", i + 1) if i >= 0 else -1
    if j >= 0:
        line = line[i:j + 1]
    for command in ("text", "textbf", "overline"):
        line = re.sub(r"\\" + command + r"\{([^}\n]*)\}", r"\1", line)
    i = line.find("\\boxed{")
    j = line.rfind("}")                            # \boxed{ ... up to the line's last "}"
    if i >= 0 and j >= i + len("\\boxed{"):
        return line[:i] + line[i + len("\\boxed{"):j] + line[j + 1:]
    return line


def normalize_paper(answer: str) -> str:
    r"""The official (Minerva-style) normaliser: after the last "=", the replacements and removed
    words; per line the first $...$ span, \text{} \textbf{} \overline{} \boxed{} unwrapped;
    \fracab \sqrta expanded; no "$", integer commas.
        >>> normalize_paper(r"x = \frac12"), normalize_paper(r"\$1,000")
        ('\\frac{1}{2}', '1000')
        >>> normalize_paper(r"$\boxed{42}$.")
        '42'
    """
    s = answer.split("=")[-1]
    for old, new in PAPER_REPLACE + tuple((word, "") for word in PAPER_REMOVE):
        s = s.replace(old, new)
    s = "\n".join(paper_line(line) for line in s.split("\n"))
    s = re.sub(r"(frac)([^{])(.)", r"frac{\2}{\3}", s)
    s = re.sub(r"(sqrt)([^{])", r"sqrt{\2}", s).replace("$", "")
    if s.replace(",", "").isdigit():
        s = s.replace(",", "")
    return s.strip()


# ---------------------------------------------------------------------------------------------
# The symbolic stage: math-verify in pebble worker processes, each check under a deadline

WORKER_MEMORY_LIMIT = 4 << 30   # bytes a worker may map beyond its start (Linux): else MemoryError
MAX_WORKERS = 8
WARMUP_PAIRS = (("\\frac{1}{2}", "0.5"), ("x(x+1)", "x^2+x"), ("\\sqrt{8}", "2\\sqrt{2}"),
                ("\\{1,2\\}", "\\{2,1\\}"), ("[1,2)", "(1,2]"), ("x^{\\frac{1}{2}}", "\\sqrt{x}"),
                ("(x^a)^b", "x^{ab}"), ("\\ln(2)x", "x\\ln(2)"))
POLL_SECONDS = 0.5              # how often a batch's waiter checks that its pool still runs


# A symbol right before a bracket: one letter (with its subscript) or a Greek letter. The parser
# reads x(2), \pi(r^2) and x_1(x_2) as function calls (a letter before a bracketed expression as a
# product: inconsistent); f, g and h before a bracket stay function names.
GREEK = ("alpha|beta|gamma|delta|epsilon|varepsilon|zeta|eta|theta|vartheta|iota|kappa|lambda|mu|"
         "nu|xi|pi|varpi|rho|sigma|tau|upsilon|phi|varphi|chi|psi|omega|Gamma|Delta|Theta|Lambda|"
         "Xi|Pi|Sigma|Phi|Psi|Omega")
SYMBOL_BEFORE_BRACKET = re.compile(
    r"((?<![\\A-Za-z])[a-eij-zA-Z](?:_(?:\{[A-Za-z0-9]{1,8}\}|[A-Za-z0-9]))?"
    r"|\\(?:" + GREEK + r")(?![A-Za-z]))\s*(?=[(\[])")


# cancels: the precision a difference of two constants is evaluated at, and the gap above which
# it is no float noise (1 - sin^2 - cos^2 of pi/7 evaluates to ~1e-166)
CANCEL_DIGITS = 30
CANCEL_GAP = 1e-20


# The parser reads "d" before a letter or a control word as a differential, one symbol: da, db,
# even dcdot (d\cdot a). Outside calculus notation an answer's d is a variable like any letter.
D_BEFORE_NAME = re.compile(r"(\\[A-Za-z]+)|d(?=\s?[A-Za-z\\])")   # control words: kept whole
CALCULUS = re.compile(r"\\(?:int|oint|iint|partial)(?![A-Za-z])|\\frac\{d|\\mathrm\{d\}")


def d_as_variable(match: re.Match) -> str:
    """A control word as it is; a d before a name braced, so that the parser reads a product."""
    return match[1] or "{d}"


def explicit_products(s: str) -> str:
    r"""A normalised answer with "\cdot" between a symbol and the bracket right after it:
    x(2) -> x\cdot(2), \pi(r^2) -> \pi\cdot(r^2) (SYMBOL_BEFORE_BRACKET; f(x), \sin(x) unchanged);
    and, unless the answer writes an integral or a derivative (CALCULUS), a d before a letter as a
    variable: ad-da -> ad-{d}a, which cancels (the parser read "da" as one differential symbol).
    Linear regex passes: bounded in time."""
    s = SYMBOL_BEFORE_BRACKET.sub(r"\1\\cdot ", s)
    if "d" in s and not CALCULUS.search(s):
        s = D_BEFORE_NAME.sub(d_as_variable, s)
    return s


def cancels(gold, pred) -> bool:
    """Whether two parsed expressions, one of them a lone symbol or number, differ by something
    that simplifies to 0 once their unevaluated parts are evaluated (doit): x + y - y is x,
    \\log_2 8 - 3 is 0. math-verify compares a lone symbol as text (x + y - y is not x to it) and
    simplifies without doit; two compound expressions it simplifies itself. Plain expressions
    only: not sets, relations or matrices (math-verify's rules decide those)."""
    from sympy import Expr, simplify

    for e in (gold, pred):
        if not isinstance(e, Expr) or getattr(e, "is_Matrix", False):
            return False
    if not (gold.is_Atom or pred.is_Atom):
        return False
    difference = gold.doit() - pred.doit()
    if not difference.free_symbols:              # two constants: a clear gap needs no simplify
        with suppress(TypeError):                # a gap sympy cannot order (complex): simplify
            if abs(difference.evalf(CANCEL_DIGITS)) > CANCEL_GAP:
                return False
    return simplify(difference).is_zero is True


# decimal_equal: the points its variables take (each variable its own positive, non-integer value)
SAMPLE_POINTS = 3
# equal_with_imaginary_unit: a gold that uses i as an index (a_i, a_{i+1}, a sum) makes i a variable
I_AS_INDEX = re.compile(r"_\{?i(?![A-Za-z])|\\(?:sum|prod)(?![A-Za-z])")


def plain_expression(e) -> bool:
    """A sympy expression that is no set, relation, tuple or matrix."""
    from sympy import Expr
    return isinstance(e, Expr) and not getattr(e, "is_Matrix", False)


def one_symbol_per_name(g: list, p: list) -> tuple[list, list]:
    """The parsed gold and prediction with one symbol per name: the parser gives the i of "ij" and
    the i of "i^2 j" (or the d of "a{d}" and of "{d}a") different assumptions, two symbols that
    never cancel. The real one is kept where there is one."""
    from sympy import Basic
    parsed = [e for e in (g[0], p[0]) if isinstance(e, Basic)]
    symbols = set().union(*(e.free_symbols for e in parsed))
    kept = {}
    for symbol in sorted(symbols, key=lambda x: (x.name, x.is_real is not True)):
        kept.setdefault(symbol.name, symbol)
    renamed = {x: kept[x.name] for x in symbols if kept[x.name] != x}
    if not renamed:
        return g, p

    def rename(parsed_list: list) -> list:
        return [e.xreplace(renamed) if isinstance(e, Basic) else e for e in parsed_list]

    return rename(g), rename(p)


def equal_with_imaginary_unit(gold, pred, gold_text: str) -> bool:
    """Whether the two are equal with i read as the imaginary unit on both sides (i^2 j = -j, as
    the parser reads i as a variable); not where the gold uses i as an index (I_AS_INDEX)."""
    from sympy import I, simplify
    if not (plain_expression(gold) and plain_expression(pred)) or I_AS_INDEX.search(gold_text):
        return False
    unit = {x: I for x in gold.free_symbols | pred.free_symbols if x.name == "i"}
    if not unit:
        return False
    return simplify(gold.xreplace(unit).doit() - pred.xreplace(unit).doit()).is_zero is True


def sample_value(variable: int, point: int):
    """The value of the variable-th variable at the point-th sample point: positive, not whole."""
    from sympy import Rational
    return Rational(11 + 4 * variable + 7 * point, 7 + 3 * point)


def decimal_equal(gold, pred) -> bool:
    """With a decimal in either (0.5x against \\frac{x}{2}, 0.3333333333x against \\frac{x}{3}):
    whether their values are within REL_TOL, relative, at SAMPLE_POINTS fixed points of their
    variables (the same ones on both sides), as two numbers are (`close`); math-verify compares a
    decimal coefficient with a fraction exactly."""
    import cmath

    from sympy import Float
    if not (plain_expression(gold) and plain_expression(pred)):
        return False
    if not (gold.has(Float) or pred.has(Float)) or gold.free_symbols != pred.free_symbols:
        return False
    symbols = sorted(gold.free_symbols, key=str)
    for point in range(SAMPLE_POINTS if symbols else 1):
        values = {x: sample_value(k, point) for k, x in enumerate(symbols)}
        try:
            a = complex(gold.xreplace(values).doit().evalf(CANCEL_DIGITS))
            b = complex(pred.xreplace(values).doit().evalf(CANCEL_DIGITS))
        except (TypeError, ValueError):          # not a number there (a function left unapplied)
            return False
        if not (cmath.isfinite(a) and cmath.isfinite(b)):
            return False
        if abs(a - b) > REL_TOL * max(abs(a), abs(b)):
            return False
    return True


def sign_sensitive(e) -> bool:
    """Whether an expression holds a logarithm or a power whose exponent is not surely an integer
    (a root): where (x^a)^b = x^{ab} and \\sqrt{a/b} = \\sqrt{a}/\\sqrt{b} need positive values."""
    from sympy import Pow, log
    return e.has(log) or any(power.exp.is_integer is not True for power in e.atoms(Pow))


def equal_for_positive(gold, pred) -> bool:
    """Whether the two are equal when every variable is positive (a length, a rate, a count): the
    conservative reading of a symbolic answer that states no sign. Only where both have the same
    variables, at least one, no i, and a logarithm or root in either (`sign_sensitive`); never
    where an absolute value, sign, argument, or real or imaginary part says signs matter."""
    from sympy import Abs, Symbol, arg, im, re, sign, simplify
    if not (plain_expression(gold) and plain_expression(pred)):
        return False
    symbols = gold.free_symbols
    if not symbols or symbols != pred.free_symbols or any(x.name == "i" for x in symbols):
        return False
    if gold.has(Abs, sign, arg, re, im) or pred.has(Abs, sign, arg, re, im):
        return False
    if not (sign_sensitive(gold) or sign_sensitive(pred)):
        return False
    positive = {x: Symbol(x.name, positive=True) for x in symbols}
    difference = gold.xreplace(positive).doit() - pred.xreplace(positive).doit()
    return simplify(difference).is_zero is True


def symbolic_equal(pred: str, gold: str) -> bool:
    """math-verify (LaTeX extraction only, its timeouts off: ours is the kill), one symbol per
    name; then what it misses: terms that cancel, i as the imaginary unit, decimal coefficients
    within REL_TOL, identities of positive quantities (`cancels`, `equal_with_imaginary_unit`,
    `decimal_equal`, `equal_for_positive`). It compares a relation with a set only when the gold
    is the relation; a solved one-variable inequality ("0 < x < 12.5") names a set, which may be
    the gold."""
    # imported in the workers only
    from latex2sympy2_extended.math_normalization import NormalizationConfig
    from math_verify import LatexExtractionConfig, parse
    from math_verify import verify as math_verify
    from sympy import FiniteSet, Or

    # Never ExprExtractionConfig (it evals). math-verify's own unit stripping is off: it reads a
    # trailing "c", "h" or "ab" as a unit (x+2c = x+2); our normaliser has removed real units.
    normalization = NormalizationConfig(basic_latex=True, units=False, malformed_operators=True,
                                        nits=True, boxed="all", equations=False)
    latex_only = [LatexExtractionConfig(normalization_config=normalization)]
    g = parse(f"${explicit_products(gold)}$", extraction_config=latex_only, parsing_timeout=None)
    p = parse(f"${explicit_products(pred)}$", extraction_config=latex_only, parsing_timeout=None)
    if not (g and p):
        return False
    g, p = one_symbol_per_name(g, p)
    if equal_for_positive(g[0], p[0]):   # first: math-verify's simplify of (x^a)^b - x^{ab} may
        return True                      # outlast the deadline (~2 s), positive symbols do not
    if math_verify(g, p, timeout_seconds=None) and not far_apart(g[0], p[0]):
        return True
    if cancels(g[0], p[0]):                      # also where far_apart saw float noise near 0
        return True
    if equal_with_imaginary_unit(g[0], p[0], gold) or decimal_equal(g[0], p[0]):
        return True
    several = isinstance(p[0], FiniteSet) and len(p[0]) > 1
    several = several and all(map(solved_inequality, p[0].args))
    relation = Or(*p[0].args) if several else p[0]   # "x <= -1 or x >= 2": a set of relations
    if not solved_inequality(relation):
        return False
    return bool(math_verify(g, [relation.as_set()], timeout_seconds=None))


def far_apart(a, b) -> bool:
    """Two sympy constants more than REL_TOL apart, relative (math-verify's check is absolute:
    1/2^98 = 1/2^99)."""
    try:
        if a == b or not (a.is_number and b.is_number):
            return False
        x = a.evalf(30)
        y = b.evalf(30)
        if x == y or not (x.is_real and y.is_real):
            return False
        return bool(abs(x - y) > REL_TOL * max(abs(x), abs(y)))
    except Exception:                          # not sympy expressions (strings, matrices, ...)
        return False


def solved_inequality(e) -> bool:
    """x > 3, 0 < x < 12.5, x <= -1 or x >= 2: inequalities between one variable and constants
    (not x^2 < 4)."""
    from sympy import And, Eq, Ne, Or, Rel, Symbol
    if isinstance(e, (And, Or)):
        return len(e.free_symbols) == 1 and all(map(solved_inequality, e.args))
    if not isinstance(e, Rel) or isinstance(e, (Eq, Ne)) or len(e.free_symbols) != 1:
        return False
    has_variable = any(isinstance(x, Symbol) for x in e.args)
    has_constant = any(not x.free_symbols for x in e.args)
    return has_variable and has_constant


def init_worker() -> None:
    """Before a worker's first job (on no deadline): the memory limit, then checks that warm
    math-verify up (~2 s)."""
    with suppress(ImportError, ValueError, OSError):   # Linux only
        import resource
        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        limit = mapped + WORKER_MEMORY_LIMIT
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    logging.getLogger("math_verify").setLevel(logging.ERROR)   # "timeout is disabled": we know
    for pred, gold in WARMUP_PAIRS:            # builds the parser, imports sympy's simplifier
        symbolic_equal(pred, gold)


def default_workers() -> int:
    """The CPUs this process may run on, at most MAX_WORKERS."""
    if hasattr(os, "sched_getaffinity"):
        cpus = len(os.sched_getaffinity(0))
    else:
        cpus = os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, cpus))


class PoolState:
    """The module's worker pool (pebble), its size, and the checks killed at their deadline."""
    pool: pebble.ProcessPool | None = None
    workers: int = 0
    killed: int = 0
    lock = threading.Lock()


def worker_pool(workers: int | None) -> pebble.ProcessPool:
    """The module's pool (at first use, after close_pool; another `workers` restarts it). Its
    workers fork from the forkserver, a fresh process importing the main script once (grpo.py:
    torch, ~8 s on 2 busy cores): scripts need the `if __name__` guard. A daemonic process cannot
    start it (daemonic processes may not have children)."""
    with PoolState.lock:
        stale = PoolState.pool is None or not PoolState.pool.active
        resized = workers and workers != PoolState.workers
        if stale or resized:
            if PoolState.pool is not None:
                PoolState.pool.stop()
            n = workers or default_workers()
            context = multiprocessing.get_context("forkserver")
            PoolState.pool = pebble.ProcessPool(n, initializer=init_worker, context=context)
            PoolState.workers = n
        return PoolState.pool


def close_pool() -> None:
    """Stop the module's workers at once, also those checking (their pairs: not equal); the
    next check restarts them."""
    with PoolState.lock:
        pool = PoolState.pool
        PoolState.pool = None
        PoolState.workers = 0
    if pool is not None:
        pool.stop()
        pool.join()


atexit.register(close_pool)


def pool_stats() -> dict:
    """{"workers": the pool's size (0: none), "killed": checks stopped at their deadline}."""
    return {"workers": PoolState.workers, "killed": PoolState.killed}


def symbolic_equal_many(pairs: list[tuple[str, str]], timeout: float = 1.0,
                        workers: int | None = None) -> list[bool]:
    """math-verify equality of each (pred, gold) in the pool (no screen), each under `timeout`
    seconds from its start: past it the worker is killed and the pair is not equal, as when the
    check raised, its worker died or close_pool ran."""
    pool = worker_pool(workers)
    futures = [pool.schedule(symbolic_equal, args=(str(p), str(g)), timeout=timeout)
               for p, g in pairs]

    def pool_alive() -> bool:                  # close_pool may leave futures unresolved
        return PoolState.pool is pool

    pending = set(futures)
    while pending and pool_alive():
        pending = wait(pending, timeout=POLL_SECONDS).not_done

    def outcome(future) -> bool:
        try:
            return future.done() and bool(future.result())
        except BrokenProcessPool as e:        # stopped (close_pool, a resize): not equal;
            if pool_alive():                   # broken by itself: every worker died in set-up
                raise RuntimeError("symbolic verifier workers could not start (their error is "
                                   "on stderr)") from e
        except TimeoutError:                   # past the deadline: the worker was killed
            PoolState.killed += 1
        except Exception:                      # noqa: S110 (parse errors, MemoryError: unequal)
            pass
        return False

    return [outcome(f) for f in futures]


def correct_many(preds: list, golds: list, verifier: str = "default", timeout: float = 1.0,
                 workers: int | None = None) -> list[bool]:
    """`verify` of each (pred, gold); the symbolic stage checks each distinct undecided pair once,
    all in parallel."""
    if verifier == "paper":
        return [p is not None and len(p) <= MAX_ANSWER_CHARS
                and normalize_paper(p) == normalize_paper(str(g))
                for p, g in zip(preds, golds)]
    fast = [fast_check(pred, gold) for pred, gold in zip(preds, golds)]
    undecided = list(dict.fromkeys((p, g) for equal, p, g in fast if equal is None))
    symbolic = {}
    if undecided:
        symbolic = dict(zip(undecided, symbolic_equal_many(undecided, timeout, workers)))
    return [symbolic[p, g] if equal is None else equal for equal, p, g in fast]


def check_verifier_settings(verifier: str, timeout: float) -> None:
    if verifier not in ("default", "paper") or not timeout > 0:
        raise ValueError(f"need verifier 'default' or 'paper' and timeout > 0 s, got "
                         f"verifier={verifier!r}, {timeout=}")


def verify(pred: str | None, gold: str, verifier: str = "default", timeout: float = 1.0) -> bool:
    r"""Whether `pred` (from `extract_answer`) equals `gold`. "default": exact after
    `normalize_answer`, else numeric within REL_TOL (x% also equals x/100), else symbolic in a
    worker under `timeout` s (past it: False); "paper": the official string comparison. A missing
    or over-long `pred` is wrong. ValueError for a bad argument.
        >>> [verify(p, g) for p, g in [("\\dfrac12", "0.5"), ("27", "27.0"), ("x = 3", "3")]]
        [True, True, True]
        >>> verify("1/2", "1/3"), verify("0.5", "\\frac{1}{2}", verifier="paper")
        (False, False)
    """
    check_verifier_settings(verifier, timeout)
    return correct_many([pred], [gold], verifier, timeout)[0]
