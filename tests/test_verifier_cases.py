"""Verifier cases taken from what people report against public answer checkers (issue 16, part 1).

Every row is `(case class, response or extracted answer, gold, expected, "source: ...")`. The source
is the public bug report, pull request or file where the failure was described; the expected value
is ours: what a careful grader would say about the answer (not necessarily what the reporter or
the cited checker says). Where reasonable graders disagree, a comment states the convention this
project takes and why.

A row's text is run through `rewards.extract_answer` and then `rewards.verify`:
* ANSWER_CASES hold an answer as a model would write it on its final-answer line; the test wraps it
  as "Final Answer: <answer>" (so extraction is exercised too) and also checks `verify` on the bare
  string;
* RESPONSE_CASES hold whole responses (several boxes, markdown, no final-answer line, ...).
All rows together also go through `score_batch` once, which must agree with `verify` row by row.

32 of the 118 rows were wrong at the branch point (c395ae3): the 27 that commit 75113b2 marks, with
the root cause of each, and 5 of the 18 rows added later (a pmatrix with spaces after its row
breaks, four responses without a braced marker). Issue 26 added 30 rows (148 in all): 13 were wrong
at f8f95cd (commit 045d848 marks them, with the root cause of each), and one older row changed its
expected value with the rule for Python-style math (Math-Verify#69, "-1 + exp(16)": now True).
Issue 32 added 7 rows (155 in all) for a braced base with a subscript ("{a}_{n}") and a braced
one-letter subscript ("y_{A}"): 5 were wrong before (normalize_answer unbraces both now; the two
that passed must stay as they are).
Issue 40 added 26 rows (181 in all) for juxtaposition and for terms that cancel: 17 were wrong
before (a symbol before a bracket read as a function call, one-letter words after a number read as
units, a word read as the product of its letters, a lone symbol or a number compared without
simplifying); the 9 that passed (products with spaces, functions applied, partial cancellations)
must stay as they are.
Issue 47 added 39 rows (220 in all) for letters that are also names (d, i, e), powers measured by
what they compute, a logarithm's argument, x^\\frac12, decimal coefficients and identities of
positive quantities: 22 were wrong at 3880914, two of them accepting a wrong answer (\\ln 2 x
against \\ln(2x), \\log_2{8}/3 against \\log_2(8/3)); the 17 that passed guard each rule's other
direction.
Every row passes now.

Conventions this project takes (see the comments at the rows):
* numbers compare exactly when both sides are integers, and within a relative tolerance (1e-6)
  otherwise; never within an absolute one, so 1e-10 and 2e-10 differ;
* x% equals x/100 only when a percent sign is written on one side;
* a lone-variable left-hand side is dropped ("x = 5" is 5); two equations compare as equations;
* a response with no `Final Answer:` line, no `\\boxed{...}` and no `####` line is graded by the
  last number in its text (the "flexible" GSM8K rule), a number never swallowing the punctuation
  after it and never a coefficient (the 4 of 4\\sqrt{2}); a response that writes a marker but leaves
  it empty stays unanswered;
* several boxes in a row at the end of a response ("\\boxed{3}, \\boxed{5}") form one list answer;
  boxes far apart are separate attempts and the last one counts;
* a base subscript ("1011_2") may be dropped by the prediction, but two different bases never
  match, and a numeral in another base is not the decimal gold ("10_8" does not answer "8": it
  restates the question);
* Python-style math is read as the LaTeX it means, by a bounded textual translation before any
  parser (verifier.python_to_latex): "**" is a power, "*" a product, "pi" is π, sqrt(x), exp(x)
  (= e^x), log(x) (natural), abs(x), sin/cos/tan(x); so "2*pi*r" equals "2\\pi r" and "exp(16)"
  equals "e^{16}". Nothing evaluates model text (no eval, sympify or parse_expr). The value still
  decides: "2(3.14)" is not "2\\pi". (Until issue 26 such answers were wrong, though "sqrt(x)" and
  "n*(n+1)/2" already passed through the LaTeX parser's leniency: one rule now, everywhere.)
* TeX's one-token macro arguments are read as TeX reads them: \\frac12 is \\frac{1}{2}, \\frac a b
  is \\frac{a}{b}, \\sqrt[3]8 is \\sqrt[3]{8}, and so \\frac123 is \\frac{1}{2}3;
* a number in \\text{}, \\mathrm{}, \\textbf{} is that number, and a comma in it groups thousands
  ("\\frac{\\mathrm{1,000}}{2}" is 500);
* a brace group holding one letter or one control word before a subscript or a power is that letter
  ("{a}_{n}" is a_n, "{\\alpha}_{1}" is \\alpha_1), unless a control word owns the group
  (\\vec{v}_1); a one-character subscript is the same with or without braces ("y_{A}" is y_A);
* juxtaposition is a product: letters side by side, with or without spaces ("l w h" is hwl, "2 m s"
  is 2ms; a lone unit after a number stays a unit, "2 kg" is 2), and a symbol right before a
  bracket ("x(2)" is 2x, "\\pi(r^2)" is \\pi r^2); f, g, h and \\sin, \\ln, ... before a bracket
  are functions applied ("f(2)" is not 2f);
* an answer that is one word of two or more letters and nothing else ("no", "Evelyn") compares
  with a word as text, case aside: "on" is not "no" (as products of letters they would be equal);
* terms that cancel are gone: "x + 7 - 7" is x, "x - x" is 0, "\\frac{x}{x}" is 1 (the simplified
  value, as sympy gives it, without the excluded point x = 0);
* d is a variable unless the answer writes an integral or a derivative ("ad - da" is 0); each letter
  is one symbol on both sides; i is also tried as the imaginary unit on both sides ("ji^2 + j" is
  0), unless the gold uses i as an index (x_i, a sum);
* a power is refused only for what it computes: more than 2^16 bits of a number, or a constant
  exponent over 9999 on a variable; "2^{10000}" and "e^{-x^2}" are answers;
* a logarithm's argument is its braced group, else what is written together right after it:
  "\\ln 2x" is ln(2x) but "\\ln 2 x" is x ln 2, "\\log_2 8/3" is 1;
* a decimal coefficient equals the exact one within 1e-6 relative ("0.5x" is x/2);
* a symbolic answer that states no sign is read with positive variables where a root, a
  non-integer power or a logarithm is in it ("\\sqrt{a/b}" is \\sqrt a/\\sqrt b); never where an
  absolute value is written. So "x" against "\\sqrt{x^2}" is right (x taken as positive).
"""

import pytest

from rewards import extract_answer, score_batch, verify
from verifier import cancels, symbolic_equal_many


@pytest.fixture(scope="module")
def warm_pool():
    """Start the symbolic workers once, outside the deadline of any check."""
    assert symbolic_equal_many([("\\sqrt{4}", "2")], timeout=30.0) == [True]
    yield


MV = "huggingface/Math-Verify"
LMEVAL = "EleutherAI/lm-evaluation-harness"
QWEN = "QwenLM/Qwen2.5-Math"

# --------------------------------------------------------------------------------------------------
# Extracted answers (the text of a final-answer line)

ANSWER_CASES = [
    # --- tuples, intervals, sets, unordered lists -------------------------------------------------
    ("tuple", "(1,4.5)", "(1,\\frac{9}{2})", True,
     f"source: {MV}#2 — a tuple mixing a decimal and a fraction is reported as not equal"),
    ("tuple", "(3, \\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)", True,
     (f"source: {QWEN}#29 — math_equal misses \\left( ... \\right) around a tuple "
      "(MATH500 problem 1)")),
    ("tuple", "1,-2", "1,-3", False,
     f"source: {QWEN}#50 — math_equal('1,-2', '1,-3') returns True"),
    ("tuple", "n=1, 2, 3", "n=2, 3, 4", False,
     f"source: {MV}#14 — an equation whose right-hand sides differ (two lists) verifies True"),
    ("tuple", "D = (0, 1.5)", "D = (0, 1)", False,
     f"source: {MV}#14 — 'D = (0, 1)' vs 'D = (0, 1.5)' verifies True"),
    ("tuple", "1728", "1331, 1728", False,
     f"source: {MV}#47 — a prediction with only one of the two required answers verifies True"),
    ("tuple", "1728, 1331", "1331 \\text{ and } 1728", True,
     f"source: {MV}#47 — 'find all' answers: the full set in another order is right"),
    # The Minerva normaliser (lm-eval minerva_math) rewrites ",\\text{and}" to ","; a list written
    # with "and" is the same unordered list.
    ("tuple", "82, 46, 19", "19, 46, \\text{ and } 82", True,
     f"source: {MV}#14 — '19, 46, \\text{{ and }} 82' as a list; here: the same list reordered"),
    ("tuple", "21, 36, and 82", "19, 46, \\text{ and } 82", False,
     f"source: {MV}#14 — '21, 36, and 82' vs '19, 46, and 82' should be False"),
    ("tuple", "1", "0,1", False,
     (f"source: {LMEVAL}#4039 — the thousands-comma strip fuses the tuple '0,1' "
      "into the number '01'")),
    ("tuple", "357", "3,5,7", False,
     f"source: {LMEVAL}#4039 — gold '3,5,7' becomes '357' after a naive comma strip"),
    ("tuple", "1234", "12,34", False,
     f"source: {LMEVAL}#4039 — malformed grouping '12,34' is not a thousands separator"),
    ("tuple", "7, 3, 5", "3,5,7", True,
     f"source: {LMEVAL}#3785 — is_equiv misses a permutation of a comma-separated answer list"),
    ("tuple", "(3,\\infty)\\cup(-\\infty,-2)", "(-\\infty,-2)\\cup(3,\\infty)", True,
     ("source: open-thoughts/OpenThoughts-Agent#129 — interval unions compared by type; a union in "
      "another order is the same set")),
    ("tuple", "(-\\infty,-2]\\cup(3,\\infty)", "(-\\infty,-2)\\cup(3,\\infty)", False,
     ("source: open-thoughts/OpenThoughts-Agent#129 — unions must not pass when an excluded "
      "endpoint disappears")),
    # Inequality vs interval: Math-Verify accepts it only when the inequality is the gold (to stop a
    # model answering a system with one relation). A one-variable inequality names the same set as
    # the interval, so we accept it when the prediction is the inequality too.
    ("tuple", "0 < x < 12.5", "(0, 12.5)", True,
     f"source: {MV}#10 — the interval (0, 12.5) vs '0 < x < 12.5' verifies False"),
    ("tuple", "m \\geq \\sqrt{2}", "[\\sqrt{2}, \\infty)", True,
     (f"source: {MV}#25 — verify is not symmetric: 'm \\geq \\sqrt{{2}}' vs "
      "'[\\sqrt{2}, +\\infty)'")),
    ("tuple", "x > 3", "[3, \\infty)", False,
     f"source: {MV}#25 — the same question with the endpoint wrongly included/excluded"),
    ("tuple", "x \\le -1 \\text{ or } x \\ge 2", "(-\\infty,-1]\\cup[2,\\infty)", True,
     (f"source: {MV}#10 — a solution set written as inequalities joined by 'or' vs the "
      "union of intervals")),
    # ... but restating the question's relation is no answer (Math-Verify's reason for the
    # asymmetry).
    ("tuple", "x^2 < 4", "(-2, 2)", False,
     (f"source: {MV}#10 — the maintainer: comparing relations with sets both ways lets a "
      "restated problem pass")),

    # --- matrices and vectors, fraction notations -------------------------------------------------
    ("matrix", "\\begin{pmatrix}-7/4&-2\\\\4&0.25\\end{pmatrix}",
     "\\begin{pmatrix}-\\frac{7}{4}&-2\\\\4&\\frac{1}{4}\\end{pmatrix}", True,
     f"source: {MV}#2 — a 2x2 pmatrix with \\frac entries; here written with a/b and a decimal"),
    ("matrix", "\\begin{pmatrix}-\\dfrac{7}{4}&-2\\\\4&\\tfrac14\\end{pmatrix}",
     "\\begin{pmatrix}-\\frac{7}{4}&-2\\\\4&\\frac{1}{4}\\end{pmatrix}", True,
     f"source: {MV}#2 — the same matrix with \\dfrac/\\tfrac and the \\tfrac14 shorthand"),
    ("matrix", "\\begin{pmatrix}-7/4&-2\\\\4&-0.25\\end{pmatrix}",
     "\\begin{pmatrix}-\\frac{7}{4}&-2\\\\4&\\frac{1}{4}\\end{pmatrix}", False,
     f"source: {MV}#2 — one entry's sign differs"),
    ("matrix", "\\begin{pmatrix} -2 \\\\ -14 \\\\ -7 \\end{pmatrix}",
     "\\begin{pmatrix}-2\\\\-14\\\\-7\\end{pmatrix}", True,
     "source: modelscope/evalscope#514 — MATH500 vector answers with and without spaces"),
    ("matrix", "\\begin{pmatrix}-2-14-7\\end{pmatrix}",
     "\\begin{pmatrix}-2\\\\-14\\\\-7\\end{pmatrix}", False,
     "source: modelscope/evalscope#514 — a vector written without \\\\ is the 1x1 matrix (-23)"),
    ("matrix", "\\begin{bmatrix}1\\\\\\frac{1}{2}\\end{bmatrix}",
     "\\begin{pmatrix}1\\\\0.5\\end{pmatrix}", True,
     (f"source: {QWEN} evaluation/grader.py is_matrix_format — pmatrix and bmatrix "
      "are the same matrix")),
    # Rounded entries: the project compares within 1e-6 relative, so a 3-digit rounding is wrong
    # unless the gold itself is rounded the same way (a question asking for decimals gives such
    # golds).
    ("matrix", "\\begin{pmatrix}0.290243531202435\\\\0.196008371385084\\end{pmatrix}",
     "\\begin{pmatrix}0.29\\\\0.196\\end{pmatrix}", False,
     f"source: {MV}#2 — a vector of 15-digit decimals vs its 3-digit rounding"),

    # --- magnitudes far from 1 --------------------------------------------------------------------
    ("magnitude", "\\frac{1}{2^{98}}", "\\frac{1}{2^{99}}", False,
     f"source: {MV}#14 — 1/2^99 vs 1/2^98 verifies True (an absolute tolerance near 0)"),
    ("magnitude", "\\frac{1}{2006!}", "\\frac{1}{2004!}", False,
     f"source: {MV}#14 — 1/2004! vs 1/2006! verifies True"),
    ("magnitude", "\\frac{1}{3 \\cdot 2^{2006}}", "\\frac{2^{2005}+1}{3 \\cdot 2^{2006}}", False,
     f"source: {MV}#14 — (2^2005+1)/(3*2^2006) vs 1/(3*2^2006) verifies True"),
    ("magnitude", "2e-10", "1e-10", False,
     (f"source: {MV}#14 — tiny values a factor of 2 apart must differ (relative, not "
      "absolute, tolerance)")),
    ("magnitude", "1.5 \\times 10^{-8}", "1.5e-8", True,
     f"source: {MV}#14 — tiny values: the same number in two notations"),
    ("magnitude", "6.022 \\times 10^{23}", "6.022e23", True,
     f"source: {MV}#14 — huge values in two notations"),
    ("magnitude", "2 \\times 10^{100}", "10^{100}", False,
     f"source: {MV}#14 — huge values a factor of 2 apart"),
    ("magnitude", "1267650600228229401496703205376", "2^{100}", True,
     f"source: {MV}#14 — a power and its 31-digit value"),
    ("magnitude", "2^{101}", "2^{100}", False,
     f"source: {MV}#14 — huge powers a factor of 2 apart"),
    # Integers compare exactly: a relative tolerance is for decimals that were rounded.
    ("magnitude", "1000001", "1000000", False,
     (f"source: {QWEN} evaluation/grader.py numeric_equal — isclose(rel_tol=1e-4) makes nearby "
      "large integers equal; ours (1e-6) does the same from 10^6 up")),
    ("magnitude", "123456789", "123456790", False,
     f"source: {QWEN} evaluation/grader.py numeric_equal — two 9-digit integers one apart"),
    ("magnitude", "0.0833333333333333", "\\frac{1}{12}", True,
     f"source: {MV}#2 — a 16-digit decimal of 1/12 (well within 1e-6 relative)"),
    # 33.3 is 100/3 rounded to 3 significant digits: equal only for a question that asks for
    # rounding, which the gold then shows; against the exact gold it is wrong.
    ("magnitude", "33.3", "\\frac{100}{3}", False,
     (f"source: {MV}#2 — '\\frac{{100}}{{3}}' vs '33.3' reported as a wrong "
      "verdict; we keep it wrong")),

    # --- percentages, degrees, units, thousands separators, currency ------------------------------
    ("units", "28 percent", "28\\%", True,
     f"source: {MV}#61 — '28 percent' / 'pct' inside \\boxed{{}} is not read as 28%"),
    ("units", "\\boxed{28 pct}", "28\\%", True,
     f"source: {MV}#61 — '\\boxed{{28 pct}}' vs '28\\%'"),
    ("units", "50%", "50\\%", True,
     ("source: hendrycks/math#21 — _strip_string removes '\\%' but not '%', so "
      "is_equiv('50\\%', '50%') is False")),
    # Without a percent sign on either side, 50 and 0.5 are different numbers (Qwen's grader also
    # accepts gold/100 and gold*100 with no sign anywhere).
    ("units", "50", "0.5", False,
     (f"source: {QWEN} evaluation/grader.py is_numerical_equal — include_percentage accepts "
      "ref*100 even when no percent sign was written")),
    ("units", "\\$29.00", "29", True,
     f"source: {LMEVAL}#3214 — flexible-extract keeps '$29.00' and compares it with '29'"),
    ("units", "\\$80,000", "80000", True,
     "source: open-compass/opencompass#2426 — GSM8K money with thousands commas is misread"),
    ("units", "-1,234,567.5", "-1234567.5", True,
     f"source: {LMEVAL}#4039 — true thousands grouping (with sign and decimals) is still stripped"),
    ("units", "12 \\mbox{ inches}", "12", True,
     ("source: hendrycks/math modeling/math_equivalence.py _remove_right_units — only "
      "'\\text{ ' units are removed; \\mbox units stay")),
    ("units", "30 degrees", "30", True,
     (f"source: {LMEVAL} lm_eval/tasks/minerva_math/utils.py normalize_final_answer — 'degrees' is "
      "a removed unit word")),
    ("units", "\\text{13}", "13", True,
     f"source: {MV}#37 — '\\text{{13}}' vs '13' verifies False (fixed upstream in 0.8.0)"),

    # --- \text{} / \mathrm{} wrappers -------------------------------------------------------------
    ("text", "\\text{Evelyn}", "Evelyn", True,
     f"source: {QWEN}#29 — a gold that is a name (strip_string leaves 'Evelyn')"),
    ("text", "\\textbf{42}", "42", True,
     "source: NVIDIA-NeMo/Gym#1844 — wrapped answers (\\text{E}) are scored as no answer"),
    ("text", "1 + \\frac{1}{\\mathrm{e}}", "1 - \\frac{1}{\\mathrm{e}}", False,
     f"source: {MV}#14 — 1 - 1/e vs 1 + 1/e (with \\mathrm{{e}}) verifies True"),
    ("text", "1-e^{-1}", "1 - \\frac{1}{\\mathrm{e}}", True,
     f"source: {MV}#14 — \\mathrm{{e}} is Euler's number, the same as e"),
    # ±2021 names two values; 2021 alone is half of the answer.
    ("text", "2021", "\\pm 2021", False,
     f"source: {MV}#14 — '\\pm 2021' vs '2021' verifies True"),
    ("text", "1:00", "12:00", False,
     f"source: {MV}#14 — times '12:00' vs '1:00' verify True"),
    ("text", "1, 3, 5, \\ldots, 2n-1", "1, 2, \\ldots, n", False,
     f"source: {MV}#14 — two different sequences with \\ldots verify True"),
    ("text", "4\\sqrt(2)", "4", False,
     f"source: {MV}#41 — '4\\sqrt(2)' (parentheses, not braces) verifies equal to 4"),

    # --- equations vs values ----------------------------------------------------------------------
    ("equation", "3x-y+13=0", "3x+4y+14=0", False,
     f"source: {MV}#60 — two different lines verify True"),
    ("equation", "-34x-45y+20z-100=0", "34x+45y-20z+100=0", True,
     f"source: {MV}#2 — the same plane with both sides negated"),
    # Two equations compare as equations: a lone-variable left side is dropped only when the other
    # side is a value.
    ("equation", "y = -\\frac{1}{2}x + \\frac{3}{4}", "2x+4y-3=0", True,
     f"source: {MV}#26 — equivalent line equations in two forms verify False"),
    ("equation", "y = 2x + 3", "2x+3", True,
     ("source: huggingface/open-r1#55 — rewards parse with NormalizationConfig(equations=True): "
      "'y = 2x+3' is graded by its right-hand side")),
    ("equation", "a=1 \\text{ or } a=-2", "-2, 1", True,
     "source: modelscope/ms-swift#4541 — 'a=1 \\text{ or } a=-2' as the answer to an equation"),
    ("equation", "x=2, x=3", "3, 2", True,
     f"source: {MV}#13 — several solutions ('answers are 9 and 10' parsed as a set)"),
    ("equation", "\\frac{x}{7}+\\frac{2}{7}", "\\frac{x+2}{7}", True,
     f"source: {MV}#2 — a sum of fractions timed out and was reported wrong"),
    ("equation", "\\sec^2(y)", "\\tan^2(y)+1", True,
     f"source: {MV}#2 — a trigonometric identity timed out and was reported wrong"),
    # Python-style math is read as the LaTeX it means (see the module docstring; issue 26 changed
    # this row from False): exp(16) is e^{16}.
    ("equation", "-1 + exp(16)", "e^{16} - 1", True,
     (f"source: {MV}#69 — verl's compute_score gives 0 to 'exp(16)', 'pi/2' (a reply there finds "
      "0 right; we do not)")),

    # --- answers in another base ------------------------------------------------------------------
    ("base", "1011", "1011_2", True,
     (f"source: {LMEVAL}#3785 — a prediction that drops the base subscript of the "
      "gold is marked wrong")),
    ("base", "2C", "2C_{16}", True,
     f"source: {LMEVAL}#3785 — the same with a braced subscript and a hexadecimal digit"),
    ("base", "1011_{2}", "1011_2", True,
     f"source: {LMEVAL}#3785 — the same base written with and without braces"),
    ("base", "1011_3", "1011_2", False,
     f"source: {LMEVAL}#3785 — the same digits in two different bases are different numbers"),
    ("base", "8", "10_8", False,
     f"source: {LMEVAL}#3785 — the decimal value of the number is not its base-8 numeral"),
    ("base", "10_8", "8", False,
     (f"source: {LMEVAL}#3652 — base 'x_y' answers or targets: a numeral in base 8 does not "
      "answer a decimal gold")),
    ("base", "8_{10}", "8", True,
     f"source: {LMEVAL}#3652 — the same value with an explicit base-10 subscript"),
    ("tuple", "-2, 1", "1,-2", True,
     (f"source: {LMEVAL}#3652 — 'enter all such integers, separated by commas': the "
      "answers in another order")),

    # --- from RL reward functions and other graders -----------------------------------------------
    ("magnitude", "\\boxed{\\frac{64}{400}}", "\\frac{63}{400}", False,
     ("source: huggingface/open-r1#566 — the accuracy reward gave 1 to '\\boxed{\\frac{64}{400}}' "
      "against '\\frac{63}{400}' (the gold was not parsed)")),
    ("units", "\\boxed{6}", "6", True,
     "source: huggingface/open-r1#566 — a gold that is a plain number ('6') must be read too"),
    ("text", "7", "\\frac{1}{", False,
     "source: huggingface/open-r1#293 — an unparseable gold gave every answer the reward 1.0"),
    ("equation", "\\frac{0.5a}{b}/0.5", "2\\frac{a}{2b}", True,
     ("source: openai/prm800k#19 — the MATH grader's normalisation fails on '\\frac{0.5a}{b}/0.5' "
      "vs '2\\frac{a}{2b}'")),
    ("units", "\\boxed{$9{,}500}", "9500", True,
     "source: open-compass/opencompass#2647 — gsm8k_postprocess reads '\\boxed{$9{,}500}' as 500"),
    ("units", "\\boxed{10,000}", "10000", True,
     "source: open-compass/opencompass#2647 — '\\boxed{10,000}' is read as 000"),

    # --- mixed numbers ----------------------------------------------------------------------------
    # In answers to word problems a digit written right before a fraction is a mixed number.
    ("mixed", "2\\frac{1}{2}", "2.5", True,
     f"source: {MV}#34 — verify('2.5', '$2\\frac{{1}}{{2}}$') is False"),
    ("mixed", "1 1/4", "5/4", True,
     f"source: {MV}#34 — parse('1 1/4') is 1, so '5/4' vs '1 1/4' is False"),
    ("mixed", "1 1/4", "11/4", False,
     f"source: {MV}#34 — '1 1/4' must not become 11/4 when spaces are dropped"),

    # --- issue 26: TeX macro arguments without braces --------------------------------------------
    # TeX reads one token (a digit, a letter, a control word) as a macro argument: \frac12 is
    # \frac{1}{2}, \sqrt[3]8 is \sqrt[3]{8}. So \frac123 is \frac{1}{2}3 and \sqrt12 is \sqrt{1}2,
    # as TeX typesets them, whatever the writer meant.
    ("shorthand", "\\frac12", "\\frac{1}{2}", True,
     f"source: {MV}#35 — '\\frac12' and '\\frac{{1}}{{2}}' are reported as not equal"),
    ("shorthand", "\\frac1{2}", "0.5", True,
     ("source: EvolvingLMMs-Lab/lmms-eval#1507 — '\\frac1{2}' is never normalised (_fix_fracs "
      "gated on 'sqrt'), latex2sympy raises, scored 0")),
    ("shorthand", "\\frac34", "\\frac{3}{5}", False,
     ("source: EvolvingLMMs-Lab/lmms-eval#1507 — the '\\frac34' shorthand; here "
      "against another fraction")),
    ("shorthand", "\\sqrt[3]2", "\\sqrt[3]{2}", True,
     f"source: {LMEVAL}#4036 — gold '\\sqrt[3]{{2}}' vs output '\\sqrt[3]2' is scored wrong"),
    ("shorthand", "\\sqrt[3]8", "2", True,
     f"source: {LMEVAL}#4036 — the sqrt shorthand rule turns '\\sqrt[3]8' into '\\sqrt{{[}}3]8'"),
    ("shorthand", "\\sqrt[3]{8}", "2", True,
     "source: mathllm/MATH-V#11 — _fix_sqrt corrupts '\\sqrt[3]{8}' before it is compared"),
    ("shorthand", "\\sqrt[3]2", "\\sqrt{2}", False,
     ("source: EvolvingLMMs-Lab/lmms-eval#1505 — the root index must survive normalisation: a cube "
      "root is not a square root")),
    ("shorthand", "\\frac a b", "\\frac{a}{b}", True,
     ("source: augustt198/latex2sympy#46 — '\\frac a b' is valid LaTeX but the parser "
      "raises \"missing '{'\"")),
    ("shorthand", "\\frac{a+b}2", "\\frac{a+b}{2}", True,
     ("source: OrangeX4/Latex-Sympy-Calculator#26 — '\\frac12' and '\\frac{a+b}2' "
      "raise in latex2sympy2")),
    ("shorthand", "\\left(-\\infty,-\\frac 12\\right)\\cup\\left(-\\frac 12,\\infty\\right)",
     "(-\\infty,-\\frac{1}{2})\\cup(-\\frac{1}{2},\\infty)", True,
     ("source: huggingface/lighteval#140 — the MATH normaliser fails on '-\\frac 12' "
      "inside an interval union")),

    # --- issue 26: numbers in \text, \mathrm, \textbf inside an expression ------------------------
    # A text macro around a number only sets its font; a comma in it groups thousands.
    ("wrapped", "\\frac{\\mathrm{1,000}}{2}", "500", True,
     ("source: bojieli/ai-agent-book#713 — '\\frac{\\mathrm{1,000}}{2}' fell through and "
      "normalised incorrectly")),
    ("wrapped", "\\frac{\\text{1,000}}{4}", "250", True,
     ("source: bojieli/ai-agent-book#713 — fractions holding formatting macros and "
      "commas failed to parse")),
    ("wrapped", "\\frac{\\mathrm{1,000}}{2}", "\\frac{1}{2}", False,
     "source: bojieli/ai-agent-book#713 — stripping \\mathrm{...} removed the numeric contents"),
    ("wrapped", "\\frac{1,000}{2}", "500", True,
     "source: bojieli/ai-agent-book#713 — a thousands comma inside a fraction (no macro)"),
    ("wrapped", "2\\times\\text{1,000}", "2000", True,
     ("source: iDiagoValeta/localOllamaRAG#209 — a number in a LaTeX style command is not "
      "seen; here in a product")),
    ("wrapped", "N = \\textbf{6}", "6", True,
     "source: iDiagoValeta/localOllamaRAG#209 — '$N = \\textbf{6}$' was scored as a miss"),
    ("wrapped", "\\textbf{1,500} - \\textbf{500}", "1000", True,
     ("source: iDiagoValeta/localOllamaRAG#209 — typographic wrappers stay in; here "
      "two in a difference")),
    ("wrapped", "\\text{12}\\times\\text{3}", "36", True,
     ("source: EvolvingLMMs-Lab/lmms-eval#1509 — '\\text' is deleted but its braces kept; here "
      "numbers in \\text inside a product")),

    # --- issue 26: Python-style math --------------------------------------------------------------
    # Python-style math is read by a bounded textual translation to LaTeX (see the module
    # docstring): 2*pi*r is 2\pi r. A decimal approximation is still not the exact value.
    ("python", "2 * pi * r", "2\\pi r", True,
     "source: Khan/khan-exercises#151867 — '2 * pi * r should evaluate'; it is marked wrong"),
    ("python", "2 * pi * r", "\\pi r^2", False,
     "source: Khan/khan-exercises#151867 — the same answer against the area (a different value)"),
    ("python", "16 pi", "16\\pi", True,
     "source: Khan/khan-exercises#132329 — '16pi' vs '16 pi': one spelling is refused"),
    ("python", "16 pi", "16", False,
     "source: Khan/khan-exercises#132329 — 'pi' after a number is a factor, not a unit word"),
    ("python", "13(pi)", "13\\pi", True,
     "source: Khan/khan-exercises#153179 — '13(pi)' is not an accepted format"),
    ("python", "sqrt(3)/2", "\\frac{\\sqrt{3}}{2}", True,
     "source: Khan/khan-exercises#145564 — 'sqrt(3)/2' is not accepted for √3/2"),
    ("python", "30*sqrt(1/3)", "10\\sqrt{3}", True,
     "source: Khan/khan-exercises#155614 — '30*sqrt(1/3)' was not accepted but '10*sqrt(3)' was"),
    ("python", "2(3.14)", "2\\pi", False,
     "source: Khan/khan-exercises#142410 — '2(3.14)' was refused, '2π' accepted: 3.14 is not π"),
    ("python", "sqrt(3)/3", "\\frac{\\sqrt{3}}{3}", True,
     f"source: {MV}#39 — 'sqrt(3)/3' vs '\\frac{{\\sqrt{{3}}}}{{3}}' verifies False"),
    ("python", "sqrt(17)", "4.123105625617661", True,
     (f"source: {MV}#48 — '\\sqrt{{17}}' vs math.sqrt(17)'s float verifies False; here "
      "written 'sqrt(17)'")),
    # The maintainers there keep a*a apart from a^2 ("differences in notation"); it is the same
    # polynomial, and the project reads Python-style products.
    ("python", "a*a+b*b+2*a*b", "a^2+2ab+b^2", True,
     ("source: open-compass/VLMEvalKit#651 — 'a*a+b*b+2ab' vs 'a^2+b^2+2ab' is "
      "judged not equivalent")),
    ("python", "sqrt(__import__('os').getpid())", "5", False,
     ("source: THUDM/slime#1586 — the math grader's parse_expr runs model text (code execution): "
      "the translation must never evaluate")),
    # --- a braced base with a subscript: {a}_{n} is a_n (issue 32) ------------------------------
    ("braced base", "{a}_{n}=2n-1", "a_n=2n-1", True,
     ("source: sympy/sympy#10048 — sympy's LaTeX printer writes an indexed base in braces, "
      "{a}_{n}; the braces hide the subscript's base from the parser")),
    ("braced base", "2{a}_{1}+{a}_{2}", "2a_1+a_2", True,
     "source: sympy/sympy#10048 — the printer's {base}_{index}, inside an expression"),
    ("braced base", "{x}_{i}+{x}_{j}", "x_i+x_j", True,
     ("source: purdue-tlt/latex2sympy#28 — '{x}_{i,j} for example': a braced base the grammar "
      "must read as a subscripted variable")),
    ("braced base", "{x}_{0}+{x}_{1}", "2x", False,
     ("source: augustt198/latex2sympy#12 — 'x_0 + x_1 shouldn't equal 2x': unbracing the base "
      "must keep its subscript")),
    ("braced base", "\\frac{{\\alpha}_{1}}{2}", "\\frac{\\alpha_1}{2}", True,
     ("source: sympy/sympy#24290 — Greek letters with indices; here in braces, inside a "
      "fraction")),
    ("braced base", "{x}^{2}+1", "x^2+1", True,
     "source: augustt198/latex2sympy#9 — braces around single terms are only for consistency"),
    ("braced base", "y_{A}+1", "y_A+1", True,
     ("source: augustt198/latex2sympy#45 — 'sympy can't parse y_{A}': a one-letter subscript in "
      "braces is the same symbol as without")),

    # --- issue 40: juxtaposition, a product written without an operator ---------------------------
    # A symbol right before a bracket is a product (x(2) is 2x, \pi(r^2) is \pi r^2), not a call;
    # f, g, h and \sin, \ln... before a bracket are functions. One-letter words after a number are
    # variables (2 m s is 2ms), a lone unit stays a unit (5 cm is 5).
    ("juxtaposition", "\\eta\\left(\\sqrt{2-\\eta^2}+\\eta\\right)",
     "\\eta\\sqrt{2-\\eta^2}+\\eta^2", True,
     ("source: sympy/sympy#21676 — parse_latex reads '\\eta \\left(...\\right)' as a function "
      "eta(...), not a product")),
    ("juxtaposition", "\\pi(r^2)", "\\pi r^2", True,
     "source: sympy/sympy#21676 — the same with \\pi before a bracket (read as a call \\pi(r^2))"),
    ("juxtaposition", "2\\pi(3)", "6\\pi", True,
     "source: sympy/sympy#21676 — a Greek constant before a bracketed number"),
    ("juxtaposition", "\\frac{1}{x(y-z)}", "\\frac{1}{xy-xz}", True,
     "source: sympy/sympy#21677 — '\\frac{1}{x(y-z)}' parses as 1/x(y - z), x a function"),
    ("juxtaposition", "x(x)", "x^2", True,
     "source: sympy/sympy#19676 — the LaTeX parser cannot read 'x(x-1)' or 'x(x)' properly"),
    ("juxtaposition", "n(5)", "5n", True,
     "source: sympy/sympy#19676 — a letter before a bracketed number is read as a call n(5)"),
    ("juxtaposition", "x_1(x_2)", "x_1 x_2", True,
     ("source: sympy/sympy#1546 — documented: 'x_2' (underscore) is one symbol; here a "
      "subscripted symbol before a bracket, a product")),
    ("juxtaposition", "2 m s", "2ms", True,
     ("source: sympy/sympy#1546 — documented: letters side by side ('2xy') are a product; "
      "one-letter words after a number were read as units ('2 m s' became 2)")),
    ("juxtaposition", "l w h", "hwl", True,
     ("source: carloskiki/pulldown-latex#45 — the TeXbook reads letters side by side as separate "
      "identifiers (a product); here with spaces, in another order")),
    ("juxtaposition", "2 kg", "2", True,
     ("source: hendrycks/math modeling/math_equivalence.py _remove_right_units — a number followed "
      "by a unit is that number, not a product with k and g")),
    # ... and where it is not a product: a function applied, a word.
    ("juxtaposition", "f(2)", "2f", False,
     ("source: sympy/sympy#20306 — a maintainer: 'a(expr)' is ambiguous between a product and a "
      "call; f before a bracket stays a function value")),
    ("juxtaposition", "\\ln(e^2)", "2", True,
     ("source: sympy/sympy#1871 — a function name before its argument is applied ('sin 2x'), "
      "not a factor")),
    ("juxtaposition", "no", "on", False,
     ("source: sympy/sympy#15624 — the LaTeX converter reads any multi-letter name as a product "
      "of letters (Nu, Re, Ma); a word is not a product, 'on' is not 'no'")),
    ("juxtaposition", "felt", "\\text{left}", False,
     ("source: bor0/gidti#21 — 'apple' in math mode is a product of variables; as an answer it is "
      "a word, and an anagram is another word")),
    ("juxtaposition", "sin", "ins", False,
     ("source: sympy/sympy#20306 — 'sin x' without a backslash binds to s*i*n*x; a bare word is "
      "not the product of its letters")),
    ("juxtaposition", "Evelyn", "\\text{evelyn}", True,
     (f"source: {QWEN}#29 — a gold that is a name; a word compares as text, whatever its case "
      "(as math-verify compares a multi-letter symbol)")),

    # --- issue 40: terms that cancel symbolically -------------------------------------------------
    # An expression equals what remains after its terms cancel (x/x is 1, as sympy simplifies it).
    ("cancel", "x + 7 - 7", "x", True,
     "source: josdejong/mathjs#2461 — simplify('x + 7 - 7 == 12 - 7') stops at 'x + 0 == 5'"),
    ("cancel", "x - x", "0", True,
     "source: josdejong/mathjs#2424 — symbolicEqual must let identical terms cancel: x - x is 0"),
    ("cancel", "a + b - a", "b", True,
     ("source: sicmutils/sicmutils#225 — compare by subtracting the sides and checking for zero; "
      "math-verify compares a lone symbol as text")),
    ("cancel", "\\frac{2x}{2}", "x", True,
     "source: sicmutils/sicmutils#225 — a common factor that cancels, against a lone symbol"),
    ("cancel", "\\frac{x}{x}", "1", True,
     ("source: Khan/khan-exercises#147635 — cancelling x/x drops x != 0; we grade the simplified "
      "value, as sympy does")),
    ("cancel", "\\sin^2 x + \\cos^2 x", "1", True,
     (f"source: {MV}#2 — a trigonometric identity timed out; here one whose terms cancel to a "
      "number")),
    ("cancel", "\\log_2 8 - 3", "0", True,
     ("source: sympy/sympy#11563 — logarithms compare structurally until simplified; here "
      "log_2 8 - 3 is exactly 0, not float noise")),
    ("cancel", "x + y - x", "x", False,
     ("source: josdejong/mathjs#2461 — what remains after cancelling must be the gold, not a "
      "part of it")),
    ("cancel", "x - x + 1", "0", False,
     "source: josdejong/mathjs#2424 — terms that cancel leave a value, here 1, not 0"),
    ("cancel", "\\frac{x^2}{x}", "x^2", False,
     "source: Khan/khan-exercises#147635 — a cancelled factor is gone: x^2/x is x, not x^2"),

    # --- issue 47: letters that are also names (d, i, e) ------------------------------------------
    # Juxtaposed letters are a product whatever the letters: d is a variable unless the answer
    # writes an integral or a derivative; one symbol per name on both sides (the parser gives "i"
    # and "d" different assumptions in different places); i is also tried as the imaginary unit on
    # both sides, unless the gold uses it as an index (a_i, a sum).
    ("letters", "ad - da", "0", True,
     ("source: sympy/sympy#26220 — the LaTeX grammar's DIFFERENTIAL rule reads 'd' before a letter "
      "(even 'd \\cdot 2') as one differential symbol; here 'da' in terms that cancel")),
    ("letters", "a d - d a + b", "b", True,
     ("source: sympy/sympy#25626 — a maintainer: 'It is very common to use d as a variable name'; "
      "here with spaces between the letters")),
    ("letters", "d\\cdot a", "ad", True,
     "source: sympy/sympy#26220 — 'd \\cdot 2' is parsed as the symbol dcdot times 2"),
    ("letters", "da - cb", "ad-bc", True,
     ("source: isaacphysics/isaac-react-app#660 — d, delta, Delta must be usable as single "
      "letters, not differentials; a determinant written in another order")),
    ("letters", "da - bc", "ad-bd", False,
     ("source: isaacphysics/isaac-react-app#660 — a wrong determinant with d as a letter stays "
      "wrong")),
    ("letters", "i j - j i", "0", True,
     ("source: mossadal/math-parser#14 — i reserved as the imaginary unit breaks 'a + i' with i a "
      "variable; here terms in i that cancel")),
    ("letters", "ji^2 + j", "0", True,
     ("source: asciimath/asciimathml#20 — the imaginary unit and a variable i are the same letter; "
      "read as the unit, i^2 = -1 and the terms cancel")),
    ("letters", "i^2 j", "j", False,
     ("source: asciimath/asciimathml#20 — read either way i^2 j is not j (the unit gives -j, a "
      "variable i^2 j)")),
    ("letters", "x_i^2 i^2", "-x_i^2", False,
     ("source: daisy/MathCAT#443 — 'im' read as 'the imaginary part of' where it is i times m: "
      "context decides; a gold with i as an index (x_i) makes i a variable")),
    ("letters", "i^2 j", "ji^2", True,
     ("source: mossadal/math-parser#14 — 'replacing i with any other alphabet seems to fix the "
      "issue': i must behave like other letters (the parser gave the two i's two symbols)")),
    ("letters", "de - ed", "0", True,
     ("source: sympy/sympy#23226 — the variable d and the differential operator d look alike; "
      "here d beside Euler's e, terms that cancel")),
    # --- issue 47: the too-big-to-compute guard measures a power's result -------------------------
    ("power", "2^{10000}", "4^{5000}", True,
     ("source: huggingface/smolagents#2559 — a guard on the exponent blocks cheap powers "
      "(2 ** 20000: 5,000 bytes); the result's bit length is the cost")),
    ("power", "2^{10000}", "2^{10001}", False,
     "source: huggingface/smolagents#2559 — the same power, a factor of 2 apart"),
    ("power", "10^{10000}", "100^{5000}", True,
     ("source: strands-agents/harness-sdk#3657 — the guard bounds the exponent, but the cost is in "
      "the result: it over-blocks ordinary powers")),
    ("power", "10^{10^{10}}", "10^{10^{10}}+1", False,
     ("source: asc-community/AngouriMath#1448 — an exact power with a huge exponent (2^(10^9)) "
      "hangs: still refused")),
    ("power", "2^{x^2}", "2^{x\\cdot x}", True,
     ("source: tmke8/math-core#64 — x^{2^3} (a power inside the braces) is how TeX writes a power "
      "in an exponent; no tower is computed")),
    ("power", "e^{-x^2}", "e^{-x\\cdot x}", True,
     ("source: mathjax/MathJax#1583 — x^{2^2} is the valid TeX for a power in an exponent; here "
      "the Gaussian")),
    ("power", "e^{-x^2}", "e^{x^2}", False,
     ("source: mathjax/MathJax#1583 — a square in an exponent: the sign of the exponent still "
      "counts")),
    # --- issue 47: a logarithm's argument is what is written with it ------------------------------
    # A braced argument is the group; an unbraced one is what is written together right after the
    # name (\ln 2x is ln(2x), as \sin 2x); a space or a "/" ends it (\ln 2 x is x ln 2).
    ("log", "\\ln 2 x", "x\\ln 2", True,
     (f"source: {MV}#32 — \\ln takes the product after it as its argument ('2\\lnx * x^...' parsed "
      "as log(x*x^...))")),
    ("log", "\\ln 2 x", "\\ln(2x)", False,
     f"source: {MV}#32 — the same: x times ln 2 is not ln(2x)"),
    ("log", "\\ln 2x", "\\ln(2x)", True,
     ("source: sympy/sympy#1871 — a function name applies to what is written together after it "
      "('sin 2x')")),
    ("log", "\\log_2 8/3", "1", True,
     ("source: sympy/sympy#28797 — a division is absorbed into an unparenthesised function "
      "argument: '\\log_2{4} / (x + 1)' parsed as log(4/(x + 1), 2)")),
    ("log", "\\log_2{8}/3", "\\log_2(8/3)", False,
     "source: sympy/sympy#28797 — the braced argument is 8: log_2 8 / 3 is 1, not log_2(8/3)"),
    ("log", "\\log_2{8}/3", "1", True,
     ("source: Qalculate/libqalculate#314 — 'log 64 / log 2' parsed as log(64 / log(2)) while "
      "'ln 64 / ln 2' is 6")),
    # --- issue 47: \frac right after ^ is the exponent ------------------------------------------
    ("script", "x^\\frac12", "\\sqrt{x}", True,
     "source: sympy/sympy#23475 — parse_latex(r'x^\\frac{1}{2}') returned x"),
    ("script", "x^\\frac12", "x", False,
     "source: sympy/sympy#23475 — the exponent must not be dropped"),
    ("script", "2^\\frac{3}{2}", "2\\sqrt{2}", True,
     ("source: augustt198/latex2sympy#6 — 'x^b is a valid LaTeX expression' but the parser "
      "required x^{b}")),
    # --- issue 47: decimal coefficients against the exact expression ------------------------------
    # The values at fixed points of the variables compare within 1e-6 relative, as numbers do.
    ("decimal", "0.5x", "\\frac{x}{2}", True,
     "source: cortex-js/compute-engine#155 — '0.5x' is not equal to '\\frac{x}{2}'"),
    ("decimal", "0.3333333333x", "\\frac{x}{3}", True,
     ("source: cortex-js/compute-engine#155 — 'the same problem ... with the other fractions in "
      "decimal notation'; 1e-10 relative, within the tolerance")),
    ("decimal", "0.333x", "\\frac{x}{3}", False,
     ("source: cortex-js/compute-engine#155 — a 3-digit rounding is 1e-3 away: wrong, as 33.3 is "
      "against 100/3")),
    ("decimal", "1.5\\sqrt{2}", "\\frac{3}{\\sqrt{2}}", True,
     "source: grtensor/grtensor#14 — '0.5*g' gave another result than '(1/2)*g'"),
    ("decimal", "1.5\\sqrt{2}x", "\\frac{3\\sqrt{3}}{2}x", False,
     "source: grtensor/grtensor#14 — a decimal coefficient of another root stays wrong"),
    ("decimal", "0.5x^2+1.5x", "\\frac{x^2+3x}{2}", True,
     (f"source: {MV}#48 — '\\sqrt{{17}}' against its decimal 4.123105625617661 verifies False; "
      "here decimal coefficients of a polynomial")),
    # --- issue 47: identities of positive quantities ----------------------------------------------
    # A symbolic answer that states no sign is read with its variables positive (a length, a rate):
    # only with a root, a non-integer power or a logarithm in it, the same variables on both sides,
    # and never where an absolute value (or sign, argument, real or imaginary part) is written.
    ("positive", "\\sqrt{a/b}", "\\frac{\\sqrt{a}}{\\sqrt{b}}", True,
     ("source: sympy/sympy#26101 — sqrt(qx*qy) - sqrt(qx)*sqrt(qy) does not simplify: the identity "
      "needs signs (powsimp force=True assumes them)")),
    ("positive", "\\sqrt{a/b}", "\\frac{\\sqrt{a}}{b}", False,
     "source: sympy/sympy#26101 — a root of a quotient is not the root of the numerator alone"),
    ("positive", "(x^a)^b", "x^{ab}", True,
     ("source: sympy/sympy#21277 — 'How to denest exponents': Pow(x**3, 1/2) becomes x**(3/2) only "
      "with powdenest(force=True)")),
    ("positive", "(x^a)^b", "x^{a+b}", False,
     "source: symengine/symengine#236 — (x^a)^b is x^(ab) (for positive x), never x^(a+b)"),
    ("positive", "x^{\\frac{3}{2}}", "\\left|x\\right|^{\\frac{3}{2}}", False,
     ("source: asc-community/AngouriMath#801 — sqrt(x)*sqrt(y) -> sqrt(x*y) is wrong at "
      "x = y = -1; an absolute value says signs matter, no positive reading")),
    ("positive", "\\sqrt{x^3}", "x\\sqrt{x}", True,
     ("source: Doenet/DoenetML#883 — sqrt(32 x^3) is pulled apart to 4x sqrt(2x) only under the "
      "assumption x >= 0")),
]


# --------------------------------------------------------------------------------------------------
# Whole responses (extraction matters)

RESPONSE_CASES = [
    # --- no Final Answer / \boxed / #### line: the last number in the text ------------------------
    ("fallback", "So the total is 72 clips, altogether.", "72", True,
     "source: jundot/omlx#3484 — the last-number regex '[\\d,]+' returns the comma after '72'"),
    ("fallback", "Rory's delivery order costs a total of $29.00.", "29", True,
     f"source: {LMEVAL}#3214 — flexible-extract returns '$29.00' (with the sentence's period)"),
    ("fallback", "So he made a profit of $200,000-$130,000 = $70,000.", "70000", True,
     ("source: open-compass/opencompass#2426 — the GSM8K postprocess regex reads "
      "'$70,000' as '000'")),
    ("fallback", "so, the answer is 18.", "18", True,
     f"source: {LMEVAL}#1159 — 'so, the answer is {{number}}' should count (the loose filter)"),
    ("fallback", "The difference is 8-4 = 4.\n\n**Answer:** 4.", "4", True,
     f"source: {LMEVAL}#3643 — '**Answer:** 4.' is rated wrong"),
    ("fallback", "The final value is 13.20%", "13.2", True,
     "source: mbzuai-nlp/finchain#3 — the answer regex fails on '13.20%'"),
    ("fallback", "We get 1,234, which is the count.", "1234", True,
     "source: jundot/omlx#3484 — thousands separators still match, a trailing comma does not"),
    ("fallback", "The temperature falls to -3.", "-3", True,
     ("source: open-compass/opencompass#1818 — the GSM8K postprocess takes the "
      "last '-?\\d+' number")),
    ("fallback", "So the probability is $\\frac{3}{4}$.", "\\frac{3}{4}", True,
     ("source: jundot/omlx#3484 — the last-number fallback; a LaTeX fraction in the last sentence "
      "is one number, not its denominator")),
    # The last number is the rule; a hedge ending in another number is simply that number.
    ("fallback", "It is either 5 or 6.", "5", False,
     ("source: asuzukosi/post-training-experiments#49 — two numbers that disagree must not be "
      "read as the right one")),
    ("fallback", "I am not sure about 7", "8", False,
     "source: jundot/omlx#3484 — fallback on a wrong last number"),
    # A marker that is present but empty is an unanswered question, not a cue to guess.
    ("fallback", "2+2=4 and \\boxed{}", "4", False,
     ("source: marin-community/marin#9163 — an empty final \\boxed{} must not "
      "recover an earlier answer")),
    ("fallback", "2+2=4\nFinal Answer:", "4", False,
     ("source: PrimeIntellect-ai/verifiers#1028 — without the answer format the whole text must "
      "not be searched for the number")),

    # --- several boxed answers --------------------------------------------------------------------
    ("boxes", "The solutions are \\boxed{3}, \\boxed{5}, \\boxed{7}", "3, 5, 7", True,
     (f"source: {LMEVAL}#3644 — separate boxed answers "
      "'\\boxed{3}, \\boxed{5}, \\boxed{7}' form '3, 5, 7'")),
    ("boxes", "x = \\boxed{2} or x = \\boxed{-1}.", "-1, 2", True,
     f"source: {LMEVAL}#3644 — multi-boxed answers joined (here with 'or')"),
    ("boxes", "Final Answer: \\boxed{2} and \\boxed{3}", "2, 3", True,
     f"source: {LMEVAL}#3644 — several boxes on the final-answer line itself"),
    ("boxes",
     ("I think the answer is \\boxed{1}. Yeah so the reason why the answer is \\boxed{1} is "
      "because of the symmetry."),
     "1", True,
     f"source: {MV}#57 — the same answer boxed twice must not become the list {{1,1}}"),
    ("boxes", "\\boxed{35 cm} ++++++ \\boxed{4}", "4", True,
     f"source: {MV}#57 — two boxes: the last one is the answer"),
    ("boxes", "First guess \\boxed{C}; after checking the options again, \\boxed{E}", "E", True,
     "source: NVIDIA-NeMo/Gym#1844 — an intermediate box must not shadow the final one"),
    ("boxes", "so the answer is \\boxed{\\text{E}}", "E", True,
     "source: NVIDIA-NeMo/Gym#1844 — '\\boxed{\\text{E}}' is scored as no answer"),
    ("boxes", "Hence \\fbox{42}.", "42", True,
     "source: OpenRLHF/OpenRLHF#1285 — \\fbox{} answers are found but not unwrapped"),
    ("boxes", "The domain is \\boxed{[2,5)}.", "[2,5)", True,
     f"source: {LMEVAL}#3643 — the boxed interval is never extracted from the response"),

    # --- equations on the final-answer line -------------------------------------------------------
    ("equation", "Therefore $x = 5$.\nFinal Answer: $x = 5$.", "5", True,
     (f"source: {QWEN} evaluation/grader.py is_simple_equation — 'x = 10' vs '10' compares "
      "the right-hand side")),

    # --- markdown around the answer ---------------------------------------------------------------
    ("markdown", "Consistent!\n\n---\n\n✅ Final Answer: **73**", "73", True,
     f"source: {MV}#76 — the parsed answer is '73**' (bold markers kept)"),
    ("markdown", "#### 1,234 apples", "1234", True,
     "source: bojieli/ai-agent-book#699 — the answer after the last #### marker"),

    # --- from RL reward functions and other graders -----------------------------------------------
    ("window",
     "2+40=42\n#### 42\n" + " and the reasoning above confirms this result is consistent." * 8,
     "42", True,
     ("source: verl-project/verl#7274 — a '#### 42' followed by 300+ characters falls out of the "
      "300-character window and scores 0")),
    ("window",
     ("The matrix is\n\\[\\boxed{\\begin{pmatrix} 1 & 2 & 3 \\\\ 4 & 5 & 6 \\\\ 7 & 8 & 9 "
      "\\\\ 10 & 11 & 12 \\end{pmatrix}}\\]") + " We check each entry once more." * 6,
     "\\begin{pmatrix}1&2&3\\\\4&5&6\\\\7&8&9\\\\10&11&12\\end{pmatrix}", True,
     ("source: verl-project/verl#7440 — a second 100-character slice cuts "
      "'\\boxed{' off a long answer")),
    ("fallback", "I don't know.", "0", False,
     ("source: NVIDIA-NeMo/RL#3635 — math-verify parses nothing in 'I don't know.'; the "
      "sample got two scores")),
    ("fallback", "Final Answer: 137", "1", False,
     ("source: NVIDIA-NeMo/RL#3635 — the extracted answer '137' was recorded as its "
      "first character '1'")),
    ("fallback", "Either way our answer is $\\boxed 2$.", "2", True,
     ("source: hendrycks/math#23 — MATH solutions with '\\boxed 2' (no braces); no braced "
      "box: the last number")),
    ("fallback", "So the answer is $9{,}500.", "9500", True,
     "source: open-compass/opencompass#2647 — 'The answer is $9{,}500.' is read as 500"),
    ("fallback", "Altogether they raised 100,000.", "100000", True,
     "source: zjunlp/TRICE#2 — the answer regex '-?[1-9]\\d*' reads 100,000 as 100"),
    ("fallback", "Each one weighs 0.5 kg.", "0.5", True,
     ("source: zjunlp/TRICE#2 — the prediction is cast to int, so a decimal answer "
      "can never be right")),
    ("boxes", "Thus the answer is \\[ \\boxed{42} \\]", "42", True,
     (f"source: {LMEVAL}#3741 — an answer in display math \\[...\\] is not "
      "extracted (hendrycks_math)")),
]

def _params(cases, prefix):
    return [pytest.param(text, gold, expected, source, id=f"{prefix}{i:02d}-{cls}")
            for i, (cls, text, gold, expected, source) in enumerate(cases)]


@pytest.mark.parametrize("answer, gold, expected, source", _params(ANSWER_CASES, "a"))
def test_answer_case(warm_pool, answer, gold, expected, source):
    pred = extract_answer("Final Answer: " + answer)
    assert verify(pred, gold) is expected, (pred, source)
    assert verify(answer, gold) is expected, source


@pytest.mark.parametrize("response, gold, expected, source", _params(RESPONSE_CASES, "r"))
def test_response_case(warm_pool, response, gold, expected, source):
    pred = extract_answer(response)
    assert verify(pred, gold) is expected, (pred, source)


def test_case_table():
    cases = ANSWER_CASES + RESPONSE_CASES
    assert len(cases) >= 60
    assert all(len(c) == 5 and isinstance(c[3], bool) and c[4].startswith("source: ")
               for c in cases)
    assert {c[3] for c in cases} == {True, False}
    assert len({(c[1], c[2]) for c in cases}) == len(cases), "duplicate rows"


def test_score_batch_agrees_with_verify(warm_pool):
    """One batch of every row: score_batch decides each like extract_answer + verify, and as
    expected."""
    cases = ANSWER_CASES + RESPONSE_CASES
    texts = ["Final Answer: " + c[1] for c in ANSWER_CASES] + [c[1] for c in RESPONSE_CASES]
    golds = [c[2] for c in cases]
    scores = score_batch(texts, golds)
    single = [verify(extract_answer(t), g) for t, g in zip(texts, golds)]
    assert [s["correct"] for s in scores] == single
    assert [s["reward"] for s in scores] == [1.0 if c else -1.0 for c in single]
    assert single == [c[3] for c in cases]


@pytest.mark.parametrize("text", [
    # 1.25 MB of thousands groups, no marker: the fallback path
    "1,000" * 250_000 + "1",
    "1" * 1_000_000,                          # a 1 MB number
    "so it is " + "x " * 500_000 + "5",       # the last number after 1 MB of words
    "\\boxed{1}, " * 100_000,                 # a run of 100,000 boxes
    "\\boxed{1} and " * 50_000 + "\\boxed{" * 10_000,
    "Final Answer: 1 or 2 and " * 40_000,     # list words on a 1 MB final-answer line
    # a 1,000-character answer: list words after a long space
    "Final Answer: 1" + " " * 990 + "and 2",
    ("\\boxed{1}" + " " * 30) * 30_000,        # a run of boxes 30 spaces apart
    "Final Answer: " + "ab" * 499,             # a 998-letter word (the word rule)
    "Final Answer: " + "x-" * 499 + "x",       # terms that may cancel, too long to simplify
    "Final Answer: " + "\\pi(" * 240,          # symbols before brackets
    "Final Answer: \\ln" + " " * 980 + "_2x",   # a logarithm's argument after long spaces
    "Final Answer: " + "\\log_2 " * 120,       # logarithms of logarithms
    "Final Answer: " + "(" * 120 + "2^{9}" + ")" * 120,   # powers measured in deep parentheses
    "Final Answer: " + "d\\cdot " * 140,      # d before names
    # the last number inside 300 characters of digits and commas
    "word " * 200_000 + "1,000" * 60,
])
def test_new_paths_stay_bounded(warm_pool, text):
    """Extraction paths a fix may add (fallback number, box runs, list words) stay fast on huge
    input."""
    import time
    # its first call imports the tag list (model.py, torch): not timed
    extract_answer("")
    t0 = time.perf_counter()
    verify(extract_answer(text), "5", timeout=1.0)
    assert time.perf_counter() - t0 < 2.0


def test_cancels_reads_float_noise_as_zero():
    """verifier.cancels, in this process: a difference of constants that evaluates to float noise
    (1 - (sin^2 + cos^2) of pi/7 is -1e-166 at 30 digits) is simplified, a clear gap is not; an
    unevaluated sum cancels to its symbol; sets are left to math-verify."""
    from sympy import Add, FiniteSet, Integer, Symbol, cos, pi, sin, sqrt

    assert cancels(Integer(1), sin(pi / 7) ** 2 + cos(pi / 7) ** 2)
    assert not cancels(Integer(2), sqrt(3))
    x = Symbol("x")
    assert cancels(x, Add(x, Integer(7), Integer(-7), evaluate=False))
    assert not cancels(x, Add(x, Integer(7), evaluate=False))
    assert not cancels(FiniteSet(1), Integer(1))
