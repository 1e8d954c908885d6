"""Tests of rewards.py: extraction, the verifiers, the time bound on untrusted answers, the format
check, the paper's reward schedules and batch scoring.

Every expected value is written out by hand: the verifier table below states, for each pair, whether
a mathematician would call the answers equal (and the paper verifier's official string comparison is
worked through step by step in `test_normalize_paper`); the reward tables of the S2 schedule are the
rule of NOTES.md §4 spelled out step by step; token indices in the format reasons are counted by
hand on the tiny character tokenizer (one character = one token, one tag = one token).
"""

import doctest
import threading
import time
from fractions import Fraction

import pytest

import rewards
import verifier
from rewards import (
    RewardSchedule,
    answer_found,
    check_format,
    extract_answer,
    format_failure,
    has_parallel,
    num_blocks,
    parallel_positions,
    score_batch,
    verify,
)
from verifier import (
    normalize_answer,
    normalize_paper,
    parse_number,
    pool_stats,
    symbolic_equal_many,
)

BOUND = 1.0          # the per-check timeout the security tests use
SLACK = 1.0          # scheduling slack on 2 shared cores


@pytest.fixture(scope="module")
def warm_pool():
    """Start the symbolic workers once (a Python start + math-verify import), so timings below
    measure checks."""
    assert symbolic_equal_many([("\\sqrt{4}", "2")], timeout=30.0) == [True]
    yield


@pytest.fixture(scope="module")
def tok():
    from model import load_model
    return load_model("tiny")[1]


@pytest.fixture(scope="module")
def tags(tok):
    from attention import TagIds
    return TagIds.from_tokenizer(tok)


# --------------------------------------------------------------------------------------------------
# Extraction

@pytest.mark.parametrize("text, expected", [
    # the structural tags are removed first; the last Final Answer line counts (here the main
    # chain's)
    (("6*7?<Parallel><Path>Final Answer: 41</Path><Path>42</Path></Parallel>\n"
      "<Summary>42</Summary>Final Answer: 42"),
     "42"),
    ("Final Answer: 7<eos>", "7"),                                   # the tiny tokenizer's EOS text
    ("Final Answer: 6<|im_end|>", "6"),                              # a Qwen end marker
    # last line wins, rest of line only
    ("Final Answer: 3\nwait, no.\nFinal Answer: 5\nDone.", "5"),
    ("final answer: 9", "9"),
    ("**Final Answer:** 12", "12"),
    ("Final Answer: the answer is \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),  # a box inside the line
    ("\\boxed{1}\nFinal Answer: 2", "2"),                           # Final Answer beats a box
    ("so \\boxed{\\frac{1}{\\sqrt{2}}} done", "\\frac{1}{\\sqrt{2}}"),   # nested braces
    ("\\boxed{1} then \\boxed{2}", "2"),                             # several boxes: the last
    ("\\boxed{3} and \\boxed{4", "3"),                              # the last balanced box
    ("Natalia sold 48/2 = 24 clips.\n#### 1,234", "1,234"),          # GSM8K
    ("Final Answer: 8\n" + "x" * 1000, "8"),                 # beyond the official 300-char window
    ("I am not sure.", None),
    # no marker: the last number, not a coefficient of an expression (nor punctuation after the
    # number)
    ("so it is 12, in all.", "12"), ("It is 4\\sqrt{2}.", None), ("about 2\\pi or 3x", None),
    ("2^5 of them", None),
    ("it grew 13.5\\%.", "13.5\\%"), ("2 \\times 3 is 6.", "6"),
    ("", None),
    ("Final Answer:", None),
    ("Final Answer:   \n", None),
    ("\\boxed{" * 10000, None),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_extract_answer_rejects_non_text():
    with pytest.raises(TypeError, match="response text"):
        extract_answer([1, 2, 3])


# --------------------------------------------------------------------------------------------------
# The default verifier: exact, numeric, symbolic

VERIFY_CASES = [
    # fractions
    ("\\frac{1}{2}", "0.5", True),
    ("\\dfrac12", "1/2", True),
    ("1/2", "\\frac{1}{2}", True),
    ("0.5", "\\dfrac{1}{2}", True),
    ("\\tfrac{3}{4}", "0.75", True),
    ("1/2", "1/3", False),
    ("\\frac{1}{3}", "0.33", False),
    # thousands separators
    ("1,000", "1000", True),
    ("1{,}000{,}000", "1000000", True),
    ("12,345.5", "12345.5", True),
    ("1\\,000", "1000", True),
    ("1,000", "100", False),
    # percent vs the number
    ("50\\%", "50", True),
    ("50%", "0.5", True),
    ("0.25", "25\\%", True),
    ("50\\%", "5", False),
    # units and \text around numbers
    ("5\\text{ cm}", "5", True),
    ("5 \\text{cm}^2", "5", True),
    ("\\$18", "18", True),
    ("18 dollars", "18", True),
    ("\\text{12 apples}", "12", True),
    ("3cm", "3", True),
    ("2x", "2", False),
    ("2 x", "2", False),
    # degrees
    ("30^\\circ", "30", True),
    ("30^{\\circ}", "30", True),
    ("30\u00b0", "30", True),
    ("30", "300", False),
    # x = 3 vs 3
    ("x = 3", "3", True),
    ("y=-2", "-2", True),
    ("x = 4", "3", False),
    # tuples and intervals
    ("(1, 2)", "(1,2)", True),
    ("\\left( 1, 2 \\right)", "(1,2)", True),
    ("[1, 2)", "[1,2)", True),
    ("(-\\infty, 3]", "(-\\infty,3]", True),
    ("(1,2)", "(2,1)", False),
    ("[1,2]", "(1,2)", False),
    # sets in another order
    ("\\{3, 1, 2\\}", "\\{1,2,3\\}", True),
    ("3, 1, 2", "1, 2, 3", True),
    ("\\{1,2\\}", "\\{1,2,3\\}", False),
    # \sqrt forms (symbolic)
    ("2\\sqrt{2}", "\\sqrt{8}", True),
    ("\\sqrt2", "\\sqrt{2}", True),
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}", True),
    ("2\\sqrt{3}", "\\sqrt{8}", False),
    # negative numbers
    ("-3", "-3", True),
    ("\u22123", "-3", True),                  # a unicode minus sign
    ("-\\frac{1}{2}", "-0.5", True),
    ("\\frac{-1}{2}", "-0.5", True),
    ("-3", "3", False),
    # scientific notation
    ("1.5e3", "1500", True),
    ("1.5 \\times 10^{3}", "1500", True),
    ("10^{6}", "1000000", True),
    ("1.5e3", "150", False),
    ("10^{7}", "1000000", False),
    ("210^3", "210000", False),               # 210 cubed, not 2 x 10^3
    # zero-padded AIME golds, float golds
    ("33", "033", True),
    ("7", "007", True),
    ("27", "27.0", True),
    ("27.00", "27", True),
    ("27.1", "27", False),
    ("0.5000001", "0.5", True),               # within the relative tolerance 1e-6
    ("0.5001", "0.5", False),
    # boxed and nested braces
    ("\\boxed{42}", "42", True),
    ("\\frac{\\frac{1}{2}}{2}", "0.25", True),
    # expressions
    ("x^2+2x+1", "(x+1)^2", True),
    ("x^2+1", "(x+1)^2", False),
    ("2\\pi", "\\pi+\\pi", True),
    ("41", "42", False),
    # Python-style math, read as the LaTeX it means (issue 26)
    ("x**2 + 2*x + 1", "(x+1)^2", True),
    ("2**10", "1024", True),
    ("exp(1)", "e", True),
    ("log(8)/log(2)", "3", True),
    ("abs(-3)", "3", True),
    ("pi/3", "\\frac{\\pi}{2}", False),
    ("x**3", "x^2", False),
    # math-verify's unit stripping would read a trailing c, h or ab as a unit: it is off
    ("x+2", "x+2c", False),
    ("y+1", "y+1h", False),
    ("a^2+b^2+2ab", "(a+b)^2", True),
    # an empty or missing answer is simply wrong
    ("", "5", False),
    ("   ", "5", False),
    (None, "5", False),
    ("$$", "5", False),
]


@pytest.mark.parametrize("pred, gold, expected", VERIFY_CASES)
def test_verify(warm_pool, pred, gold, expected):
    assert verify(pred, gold) is expected


@pytest.mark.parametrize("pred, gold, expected", [
    ("2", "54x^2+108x", False), ("54x^2+108x", "2", False), ("76", "\\{1,76,78\\}", False),
    ("10", "[7,10)", False), ("(1,2)", "3", False), ("96", "96\\sqrt{2}", None),
    ("2", "\\sqrt{4}", None), ("76", "\\{76\\}", None),
])
def test_fast_check_decides_numbers_against_lists_and_variables(pred, gold, expected):
    """Without a worker: a number is never a list of several numbers nor an expression in a variable
    (either side); against a constant expression only the symbolic stage can tell (None)."""
    assert verifier.fast_check(pred, gold)[0] is expected


def test_verify_case_count():
    assert len(VERIFY_CASES) >= 60
    assert {e for _, _, e in VERIFY_CASES} == {True, False}


@pytest.mark.parametrize("answer, expected", [
    ("$\\boxed{\\dfrac12}$.", "\\frac{1}{2}"),
    ("x = 1{,}000 \\text{ dollars}", "1000"),
    ("\\left[ 1 , 2 \\right)", "[1,2)"),
    ("30^\\circ", "30"),
    ("12 square feet", "12"),
    ("\\pi r^2", "\\pi r^2"),                 # the space between two letters stays
    ("\\frac a b", "\\frac{a}{b}"),           # one-token macro arguments get braces (issue 26)
    ("\\frac\\pi2", "\\frac{\\pi}{2}"),
    ("\\sqrt[3]8", "\\sqrt[3]{8}"),
    ("\\frac{\\frac12}3", "\\frac{\\frac{1}{2}}{3}"),
    ("\\frac123", "\\frac{1}{2}3"),           # as TeX reads it
    ("4\\sqrt(2)", "4\\sqrt(2)"),             # "(" is not a one-token argument
    ("\\frac{\\mathrm{1,000}}{2}", "\\frac{1000}{2}"),   # a number in \mathrm, and in braces,
    ("2\\times\\text{1,000}", "2\\times1000"),          # loses its thousands commas
    ("\\{1,000\\}", "\\{1,000\\}"),                     # a set stays a set
    ("x**2 + 2*x + 1", "x^{2}+2\\cdot x+1"),             # Python-style math as LaTeX
    ("16 pi", "16\\pi"),                                  # pi is no unit word
    ("sqrt(x)/exp(2*x)", "\\sqrt{x}/e^{2\\cdot x}"),
    ("log(abs(x))", "\\ln(\\left|x\\right|)"),             # Python's log is natural
    ("9**9**9", "9**9^{9}"),                              # a tower keeps "**" (screened out)
    ("sqrt(2", "sqrt(2"),                                 # unbalanced: calls stay as written
])
def test_normalize_answer(answer, expected):
    assert normalize_answer(answer) == expected


@pytest.mark.parametrize("s, expected", [
    ("42", "42"), ("-3", "-3"), ("033", "33"), ("27.0", "27"), (".5", "1/2"), ("1.5e3", "1500"),
    ("1.5\\times10^{3}", "1500"), ("10^{-2}", "1/100"), ("-10^{2}", "-100"), ("3/4", "3/4"),
    ("\\frac{3}{4}", "3/4"), ("-\\frac{1}{2}", "-1/2"), ("\\frac{0.5}{2}", "1/4"),
    ("1/0", None), ("x+1", None), ("1e99999", None), ("10^{10^{10}}", None), ("2^{10}", None),
])
def test_parse_number(s, expected):
    assert parse_number(s) == (Fraction(expected) if expected is not None else None)


# --------------------------------------------------------------------------------------------------
# The paper verifier: the official normalised string comparison

@pytest.mark.parametrize("answer, expected", [
    ("x = \\frac12", "\\frac{1}{2}"),         # after the last "=", spaces gone, \fracab expanded
    ("\\$1,000", "1000"),                     # "\$" dropped, comma-grouped integer
    ("$\\boxed{42}$.", "42"),                 # first $...$ span, then the box
    ("5 \\text{cm}", "5"),                    # "cm" removed, then "\text{}"
    ("\\text{5 dollars}", "5"),               # spaces, "dollars", then \text{} unwrapped
    ("30^\\circ", "30"),
    ("\\dfrac12", "\\dfrac{1}{2}"),           # no \dfrac -> \frac in the official code
    ("banana split", "banansplit"),           # "a " is deleted wherever it occurs (official quirk)
    ("1,2", "12"),                            # "1,2".replace(",", "") is all digits
])
def test_normalize_paper(answer, expected):
    assert normalize_paper(answer) == expected


@pytest.mark.parametrize("pred, gold, expected", [
    ("\\frac{1}{2}", "0.5", False),           # default verifier: True
    ("\\dfrac12", "1/2", False),
    ("27", "27.0", False),
    ("033", "33", False),
    ("\\frac12", "\\frac{1}{2}", True),
    ("1,000", "1000", True),
    ("30^\\circ", "30", True),
    ("x = 3", "3", True),
    ("5 \\text{cm}", "5", True),
    ("41", "42", False),
    (None, "42", False),
])
def test_verify_paper(pred, gold, expected):
    assert verify(pred, gold, verifier="paper") is expected


def test_verify_bad_arguments():
    with pytest.raises(ValueError, match="verifier"):
        verify("1", "1", verifier="sympy")
    with pytest.raises(ValueError, match="timeout"):
        verify("1", "1", timeout=0)


# --------------------------------------------------------------------------------------------------
# Security and bounds: untrusted model text

def _adversarial(tmp_path):
    marker = tmp_path / "pwned"
    return marker, [
        f"__import__('os').system('touch {marker}')",
        f"__import__(\"os\").system(\"touch {marker}\")",
        "().__class__.__bases__[0].__subclasses__()",
        "9**9**9**9**9",
        "10^{10^{10^{10}}}",
        "2^{999999999}",
        "99999999!",
        "x" * 1_000_000,
        "{" * 10_000,
        "}" * 10_000 + "{" * 10_000,
        "\\frac{1}{" * 200 + "2" + "}" * 200,
        "\\frac{1}{" * 20 + "2" + "}" * 20,
        "\\sqrt{" * 50 + "2" + "}" * 50,
        "Final Answer: 1 " * 70_000,           # 1.1 MB on one line, the pattern repeated
        f"sqrt(__import__('os').system('touch {marker}'))",   # Python-style: translated, never run
        "2**" * 300 + "2",                     # a Python power tower
        "exp(" * 150 + "1" + ")" * 150,        # nested Python calls
        "pi*" * 300 + "pi",
    ]


@pytest.mark.parametrize("s, expected", [
    ("x^2y^2", True), ("2^{10}", True), ("e^{\\frac{1}{2}}", True), ("\\frac{\\sqrt{2}}{2}", True),
    ("x^{a}+y^{b}", True), ("10^{10^{10}}", False), ("2^3^4", False), ("2^{99999}", False),
    ("2^99999", False), ("99999!", False), ("a__b", False), ("9**9", False), ("}{", False),
    ("{" * 13 + "}" * 13, False), ("{" * 12 + "}" * 12, True), ("x" * 257, False),
    ("x" * 256, True), ("2^{x}#", False),
    # issue 47: a power is measured by what it computes (MAX_POWER_BITS, MAX_SYMBOLIC_EXPONENT)
    ("2^{10000}", True), ("10^{10000}", True), ("2^{x^2}", True), ("e^{-x^2}", True),
    ("9^{9^{9}}", False), ("(x+1)^{20000}", False), ("(x+1)^{9999}", True),
    ("(2^{100})^{1000}", False),
])
def test_symbolic_safe_screen(s, expected):
    """The screen before the symbolic stage (for speed: the deadline bounds a check without it)."""
    assert verifier.symbolic_safe(s) is expected


def test_adversarial_answers_are_wrong_fast_and_harmless(warm_pool, tmp_path):
    marker, answers = _adversarial(tmp_path)
    for answer in answers:
        for pred in (answer, extract_answer("Final Answer: " + answer), extract_answer(answer)):
            t0 = time.perf_counter()
            result = verify(pred, "5", timeout=BOUND)
            assert result is False, answer[:60]
            assert time.perf_counter() - t0 < BOUND + SLACK, answer[:60]
    assert not marker.exists()


def test_adversarial_batch_is_scored(warm_pool, tmp_path):
    marker, answers = _adversarial(tmp_path)
    responses = [f"Final Answer: {a}" for a in answers] + ["\\boxed{" * 10_000, "x" * 1_000_000,
                                                           "Final Answer: 5"]
    t0 = time.perf_counter()
    scores = score_batch(responses, ["5"] * len(responses), timeout=BOUND)
    assert time.perf_counter() - t0 < BOUND + SLACK
    assert [s["correct"] for s in scores] == [False] * (len(responses) - 1) + [True]
    assert [s["reward"] for s in scores] == [-1.0] * (len(responses) - 1) + [1.0]
    assert not marker.exists()


def test_workers_never_evaluate_text(warm_pool, tmp_path):
    """Straight to the workers, without the screen: math-verify's LaTeX parser does not run
    Python."""
    marker, answers = _adversarial(tmp_path)
    pairs = [(a, "0") for a in answers[:3]]
    assert symbolic_equal_many(pairs, timeout=BOUND) == [False, False, False]
    assert not marker.exists()


def test_deadline_kills_a_hung_check_without_stalling_the_rest(warm_pool):
    """10^{10^{10^{10}}} makes sympy compute a huge power in C (no signal can stop it); sent without
    the screen it must still come back False at the deadline, while the other worker answers the
    rest."""
    killed = pool_stats()["killed"]
    pairs = [("10^{10^{10^{10}}}", "5"), ("2\\sqrt{2}", "\\sqrt{8}"), ("\\sqrt{9}", "3"),
             ("x(x+1)", "x^2+x"), ("\\sqrt{2}", "2")]
    t0 = time.perf_counter()
    result = symbolic_equal_many(pairs, timeout=BOUND, workers=2)
    elapsed = time.perf_counter() - t0
    assert result == [False, True, True, True, False]
    assert BOUND * 0.9 < elapsed < BOUND + SLACK
    assert pool_stats()["killed"] == killed + 1


def test_workers_have_a_memory_limit(warm_pool):
    """A worker may map WORKER_MEMORY_LIMIT beyond what it mapped at its start, no more: a runaway
    check gets MemoryError (its pair: not equal) instead of taking the machine's memory. Mappings
    are lazy: nothing is touched."""
    import mmap
    pool = verifier.worker_pool(None)
    with pytest.raises(OSError, match="Cannot allocate memory"):
        pool.schedule(mmap.mmap, args=(-1, verifier.WORKER_MEMORY_LIMIT + (1 << 30)),
                      timeout=10).result()
    with pytest.raises(TypeError, match="pickle"):   # 1 GiB is allowed (and cannot be sent back)
        pool.schedule(mmap.mmap, args=(-1, 1 << 30), timeout=10).result()


def test_close_pool_stops_a_check_in_flight(warm_pool):
    """close_pool (also at exit) stops a worker in the middle of a hung check at once; that pair is
    not equal and the next call starts a new pool."""
    out = []
    hung = [("10^{10^{10^{10}}}", "5")]
    t = threading.Thread(target=lambda: out.append(symbolic_equal_many(hung, timeout=60)),
                         daemon=True)
    t.start()
    time.sleep(0.5)
    t0 = time.perf_counter()
    verifier.close_pool()
    assert time.perf_counter() - t0 < 1.0
    t.join(5)
    assert out == [[False]] and pool_stats()["workers"] == 0
    assert symbolic_equal_many([("\\sqrt{4}", "2")], timeout=30) == [True]


def test_verify_in_threads(warm_pool):
    """math-verify's own signal.alarm timeout fails outside the main thread; ours does not care."""
    out = {}

    def work(i, pred, gold):
        out[i] = verify(pred, gold)

    threads = [threading.Thread(target=work, args=(i, p, g))
               for i, (p, g) in enumerate([("\\sqrt{18}", "3\\sqrt{2}"),
                                           ("\\sqrt{18}", "2\\sqrt{3}"),
                                           ("x^2-1", "(x-1)(x+1)")])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert out == {0: True, 1: False, 2: True}


# --------------------------------------------------------------------------------------------------
# Format check (built on attention.parse_structure) and structure metrics

def _id(tok, tag):
    return tok.convert_tokens_to_ids(tag)


def test_check_format_cases(tok, tags):
    # one character = one token, one tag = one token; indices counted by hand
    valid = ("x<Parallel><Path>p</Path><Path>q</Path></Parallel>\n<Summary>s</Summary>"
             "Final Answer: 1")
    assert check_format(valid, tok) == (True, "")
    assert check_format("no block at all. Final Answer: 1", tok) == (True, "")
    # x0 <Parallel>1 <Path>2 b3 </Path>4 </Parallel>5
    assert check_format("x<Parallel><Path>b</Path></Parallel>\n<Summary>s</Summary>", tok) == \
        (False, "block at token 1 has 1 path(s), needs >= 2")
    # x0 <Parallel>1 <Path>2 p3 </Path>4 <Path>5 q6 (end)
    assert check_format("x<Parallel><Path>p</Path><Path>q", tok) == \
        (False, "unclosed <Path> at token 5")
    # x0 <Parallel>1 <Path>2 p3 <Summary>4
    assert check_format(("x<Parallel><Path>p<Summary></Path><Path>q</Path></Parallel>\n"
                         "<Summary>s</Summary>"), tok) == \
        (False, f"structural tag {_id(tok, '<Summary>')} inside a path (token 4)")
    # ... </Parallel>8 \n9 F10
    assert check_format(("x<Parallel><Path>p</Path><Path>q</Path></Parallel>\n"
                         "Final Answer: 1"), tok) == \
        (False, "no <Summary> after </Parallel> (token 10)")
    # x0 </Path>1
    assert check_format("x</Path>y Final Answer: 1", tok) == \
        (False, f"stray structural tag {_id(tok, '</Path>')} in the main chain (token 1)")
    # <Parallel>0 <Path>1 </Path>2: a path needs a token (NOTES.md §4); one token is enough
    empty = "<Parallel><Path></Path><Path></Path></Parallel>\n<Summary></Summary>Final Answer: 2"
    assert check_format(empty, tok) == (False, "empty path at token 1")
    assert score_batch([empty], ["2"], tokenizer=tok, reward="tiered")[0]["reward"] == -1.0
    one = "<Parallel><Path>a</Path><Path>b</Path></Parallel>\n<Summary></Summary>Final Answer: 2"
    assert check_format(one, tok) == (True, "")
    assert score_batch([one], ["2"], tokenizer=tok, reward="tiered")[0]["reward"] == 1.2
    # ids instead of text give the same answer
    ids = tok.encode("x<Parallel><Path>p</Path><Path>q", add_special_tokens=False)
    assert check_format(ids, tags=tags) == (False, "unclosed <Path> at token 5")
    assert check_format(ids, tokenizer=tok) == (False, "unclosed <Path> at token 5")


def test_check_format_needs_a_tokenizer_for_text(tags):
    with pytest.raises(ValueError, match="tokenizer"):
        check_format("x<Parallel>", tags=tags)
    with pytest.raises(ValueError, match="tags"):
        check_format([1, 2, 3])


def test_structure_metrics(tok, tags):
    from attention import parse_structure

    block = "<Parallel><Path>p</Path><Path>q</Path></Parallel>\n<Summary>s</Summary>"   # 12 tokens
    s = parse_structure(tok.encode("ab" + block + "cd" + block, add_special_tokens=False), tags)
    assert (has_parallel(s), num_blocks(s), s.length) == (True, 2, 28)
    assert parallel_positions(s) == [2 / 28, 16 / 28]
    s = parse_structure(tok.encode("plain text", add_special_tokens=False), tags)
    assert (has_parallel(s), num_blocks(s), parallel_positions(s)) == (False, 0, [])
    # malformed counts
    s = parse_structure(tok.encode("x<Parallel><Path>p", add_special_tokens=False), tags)
    assert (has_parallel(s), num_blocks(s), parallel_positions(s)) == (True, 1, [1 / 4])


# --------------------------------------------------------------------------------------------------
# Rewards and schedules

RESPONSES = {   # gold "42"
    "correct_parallel": ("6*7<Parallel><Path>6*7=42</Path><Path>7*6=42</Path></Parallel>\n"
                         "<Summary>42</Summary>Final Answer: 42"),
    "correct_no_block": "6*7=42\nFinal Answer: 42",
    "correct_malformed": ("6*7<Parallel><Path>6*7=42</Path></Parallel>\n"
                          "<Summary>42</Summary>Final Answer: 42"),
    "wrong": ("6*7<Parallel><Path>6*7=41</Path><Path>7*6=41</Path></Parallel>\n"
              "<Summary>41</Summary>Final Answer: 41"),
}
ACC = (1.0, 1.0, 1.0, -1.0)        # accuracy steps: the structure does not matter
# tiered steps: +1.2 valid block, +1.0 no block, -1 malformed or wrong
TIER = (1.2, 1.0, -1.0, -1.0)
S2_EXPECTED = {step: (TIER if step in (9, 10, 19, 20) else ACC) for step in range(1, 21)}


@pytest.mark.parametrize("step", range(1, 21))
def test_s2_alternating_schedule_every_step(tok, step):
    scores = score_batch(list(RESPONSES.values()), ["42"] * 4, tokenizer=tok, reward="alternating",
                         step=step)
    assert tuple(s["reward"] for s in scores) == S2_EXPECTED[step]
    assert [s["correct"] for s in scores] == [True, True, True, False]
    assert [(s["has_parallel"], s["format_ok"], s["num_blocks"]) for s in scores] == \
        [(True, True, 1), (False, True, 0), (True, False, 1), (True, True, 1)]


@pytest.mark.parametrize("schedule, expected", [
    ("accuracy", (1.0, 1.0, 1.0, -1.0)),
    ("parallel_gated", (1.0, -1.0, -1.0, -1.0)),
    ("tiered", (1.2, 1.0, -1.0, -1.0)),
])
def test_fixed_rewards(tok, tags, schedule, expected):
    ids = [tok.encode(r, add_special_tokens=False) for r in RESPONSES.values()]
    scores = score_batch(list(RESPONSES.values()), ["42"] * 4, response_ids=ids, tags=tags,
                         reward=schedule, step=3)
    assert tuple(s["reward"] for s in scores) == expected
    assert {s["kind"] for s in scores} == {schedule}


def test_schedule_kinds():
    s2 = RewardSchedule("alternating")
    assert [s2.kind_at(t) for t in range(1, 23)] == \
        ["accuracy"] * 8 + ["tiered"] * 2 + ["accuracy"] * 8 + ["tiered"] * 2 + ["accuracy"] * 2
    custom = RewardSchedule("alternating", window=5, accuracy_steps=3)
    assert [custom.kind_at(t) for t in range(1, 11)] == \
        ["accuracy"] * 3 + ["tiered"] * 2 + ["accuracy"] * 3 + ["tiered"] * 2


def test_scaffold_switch():
    scaffold = RewardSchedule("scaffold", switch_step=20)
    assert [scaffold.kind_at(t) for t in (1, 8, 9, 10, 19, 20, 21, 29, 30, 1000)] == \
        ["accuracy", "accuracy", "tiered", "tiered", "tiered", "tiered",
         "accuracy", "accuracy", "accuracy", "accuracy"]
    default = RewardSchedule("scaffold")
    assert [default.kind_at(t) for t in (199, 200, 201, 209, 210)] == \
        ["tiered", "tiered", "accuracy", "accuracy", "accuracy"]
    assert scaffold.reward(20, correct=True, has_parallel=True, format_ok=True) == 1.2
    assert scaffold.reward(21, correct=True, has_parallel=True, format_ok=False) == 1.0


def test_schedule_errors(tok):
    with pytest.raises(ValueError, match="one of"):
        RewardSchedule("parallel")
    with pytest.raises(ValueError, match="accuracy_steps"):
        RewardSchedule("alternating", window=5, accuracy_steps=6)
    with pytest.raises(ValueError, match="step"):        # key words: ASSIGNMENTS.md, exercise 8
        RewardSchedule("alternating").kind_at(0)
    with pytest.raises(ValueError, match="has_parallel"):
        RewardSchedule("tiered").reward(1, correct=True)
    with pytest.raises(ValueError, match="structure"):
        score_batch(["Final Answer: 1"], ["1"], reward="tiered")
    with pytest.raises(ValueError, match="2 golds"):
        score_batch(["Final Answer: 1"], ["1", "2"])


# --------------------------------------------------------------------------------------------------
# Batch scoring

def test_score_batch_fields_and_structures(warm_pool, tok, tags):
    from attention import parse_structure

    texts = list(RESPONSES.values()) + ["so \\boxed{2\\sqrt{2}}", "#### 1,000"]
    golds = ["42"] * 4 + ["\\sqrt{8}", "1000"]
    structures = [parse_structure(tok.encode(t, add_special_tokens=False), tags) for t in texts]
    scores = score_batch(texts, golds, structures=structures, reward="tiered")
    assert [s["pred"] for s in scores] == ["42", "42", "42", "41", "2\\sqrt{2}", "1,000"]
    assert [s["correct"] for s in scores] == [True, True, True, False, True, True]
    assert [s["reward"] for s in scores] == [1.2, 1.0, -1.0, -1.0, 1.0, 1.0]
    assert set(scores[0]) == {"reward", "correct", "pred", "answer_found", "kind",
                              "has_parallel", "format_ok", "num_blocks"}
    assert [s["answer_found"] for s in scores] == [True] * 6
    # accuracy needs no structure; the structure fields are then None
    plain = score_batch(texts, golds)
    assert [s["reward"] for s in plain] == [1.0, 1.0, 1.0, -1.0, 1.0, 1.0]
    assert plain[0]["has_parallel"] is None
    # the paper verifier: string comparison only
    paper = score_batch(texts, golds, verifier="paper")
    assert [s["correct"] for s in paper] == [True, True, True, False, False, True]


def test_score_batch_from_a_thread(warm_pool):
    out = []
    t = threading.Thread(target=lambda: out.append(
        score_batch(["Final Answer: \\sqrt{8}", "Final Answer: 3"], ["2\\sqrt{2}", "4"])))
    t.start()
    t.join(30)
    assert [s["correct"] for s in out[0]] == [True, False]


def test_docstring_examples(warm_pool):
    checked = doctest.testmod(verifier, optionflags=doctest.ELLIPSIS)
    assert checked.attempted >= 9 and checked.failed == 0
    checked = doctest.testmod(rewards, optionflags=doctest.ELLIPSIS)
    assert checked.attempted >= 2 and checked.failed == 0


# --------------------------------------------------------------------------------------------------
# What the logged format statistics read: garbage passes the structural check, not the answer's

# (response text, cut by the budget?) -> the failure's name (rewards.format_failure)
FAILURES = {
    ("mfmfmfmfmf", False): "no_answer",                   # no tag: the structural check passes
    ("mfmf 3 mf", False): "no_answer",                    # a last number is no stated answer
    ("6*7=42, and so on and so", True): "truncated",
    ("x<Parallel><Path>a</Path><Path>b", True): "truncated",
    ("x<Parallel><Path>a</Path><Path>b", False): "unclosed_block",
    ("x<Parallel><Path>a</Path><Path>b</Path></Parallel>\nFinal Answer: 1", False): "no_summary",
    ("x<Parallel><Path>a</Path></Parallel>\n<Summary>s</Summary>Final Answer: 1", False):
        "too_few_paths",
    ("x<Parallel><Path></Path><Path>b</Path></Parallel>\n<Summary>s</Summary>Final Answer: 1",
     False): "empty_path",
    ("x<Parallel><Path>a</Path>y<Path>b</Path></Parallel>\n<Summary>s</Summary>Final Answer: 1",
     False): "text_between_paths",
    ("x</Path> Final Answer: 1", False): "misplaced_tag",
    ("x<Summary>s</Summary> Final Answer: 1", False): "misplaced_tag",
    ("x<Parallel><Path>a</Path><Path>b</Path></Parallel>\n<Summary>s</Summary>Final Answer: 1",
     False): "",
    ("Final Answer: 1", True): "",
}


@pytest.mark.parametrize("text, truncated", list(FAILURES))
def test_format_failure_names_the_reason(tok, tags, text, truncated):
    """Each format failure by its reason, on the structure the parser gives; a response without
    tags and without a stated answer (`mfmfmf`) passes the paper's structural check but fails
    here as "no_answer"; a cut is "truncated" where the cut left the block open or the answer
    out."""
    from attention import parse_structure

    structure = parse_structure(tok.encode(text, add_special_tokens=False), tags)
    found = answer_found(text)
    assert format_failure(structure, found, truncated) == FAILURES[(text, truncated)]
    assert set(FAILURES.values()) - {""} == set(rewards.FORMAT_FAILURES)


def test_answer_found_needs_a_stated_answer():
    """Only an answer behind a marker counts: the last-number fallback and an empty marker do
    not."""
    texts = ["Final Answer: 7", "so \\boxed{7}", "#### 7", "it is 7", "mfmfmf", "Final Answer:"]
    found = [answer_found(t) for t in texts]
    assert found == [True, True, True, False, False, False]


def test_answer_found_is_the_extractors_finding():
    """answer_found (score_batch's, the share eval.py and GRPO log) counted a response whose raw
    text held a marker anywhere, also where the extractor did not use it: a `####` inside a
    removed <|...|> marker, with the answer then taken by the last-number fallback, read as a
    stated answer, and a `####` that only the removal of a tag joins did not. Now it is whether
    extract_answer found the answer by a marker rule; `####` in the middle of a line counts,
    since the extractor takes the rest of that line."""
    texts = ["<|####|> mfmf 42",            # the marker is removed: the last number, 42
             "mf <|Final Answer:|> 3",      # the same
             "##<Parallel>## 5",            # the tag removed: "#### 5"
             "mfmf #### mfmf",              # the extractor's answer: "mfmf"
             "mfmf ####\n7",                # an empty marker: no answer at all
             "Final Answer: 7",
             "it is 7"]
    rules = [verifier.extract_answer_by_rule(t) for t in texts]
    assert rules == [("42", "last_number"), ("3", "last_number"), ("5", "####"),
                     ("mfmf", "####"), (None, None), ("7", "final_answer"), ("7", "last_number")]
    expected = [False, False, True, True, False, True, False]
    assert [answer_found(t) for t in texts] == expected
    scores = score_batch(texts, ["42"] * len(texts))
    assert [s["answer_found"] for s in scores] == expected
    assert [s["pred"] for s in scores] == ["42", "3", "5", "mfmf", None, "7", "7"]
    assert sum(s["answer_found"] for s in scores) / len(scores) == 3 / 7
