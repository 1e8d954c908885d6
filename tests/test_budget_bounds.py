"""scripts/studies/budget_bounds.py: the carry task's bound, on a problem worked by hand, and the
costs it counts against the teacher's own traces; scripts/studies/budget_curve.py's paired bootstrap
by hand."""
import random

import pytest

import data
from attention import TagIds, parse_structure
from model import tiny_tokenizer
from sample import critical_path
from scripts.studies import budget_bounds, budget_curve

# 6 numbers, 5 candidates (neighbours); only 54 + 65 makes 119. Every wrong attempt is 46 tokens:
#   "10+21: 0+1=1 carry 0, 1+2+0=3 -> 31 vs 119: no"
# the right one 55: "54+65: 4+5=9 carry 0, 5+6+0=11 -> 119 vs 119: ok 54, 65"
# and the answer line "Final Answer: 54, 65" 20. Every line but the answer ends with a newline.
PROBLEM = data.CarryProblem((10, 21, 32, 43, 54, 65), 119, (54, 65))
WRONG = 46
RIGHT = 55
ANSWER = 20


def test_the_hand_problems_lines_have_the_lengths_counted_by_hand():
    lengths = [len(data.carry_attempt(a, b, 119)) for a, b in PROBLEM.candidates]
    assert lengths == [WRONG, WRONG, WRONG, WRONG, RIGHT]


def test_a_chain_finds_the_pair_at_each_position_one_time_in_five():
    """The right candidate is k-th in 24 of the 120 orders: (k - 1) wrong lines, the right one,
    the answer: 47 (k - 1) + 76 tokens, as many decode steps."""
    costs, denominator = budget_bounds.problem_costs(PROBLEM, num_paths=0)
    assert denominator == 120
    assert costs == {(76, 76): 24, (123, 123): 24, (170, 170): 24, (217, 217): 24,
                     (264, 264): 24}


def test_the_bounds_by_hand():
    """Block of four first: a path holds the pair in 625 - 4^4 = 369 of the 625 draws; then it
    takes 55 + 2 + 5 + 6 (the summary "54, 65") + 1 + 20 = 89 decode steps. Else the block takes
    46 + 2 + 5 + 4 ("none") + 1 = 58, and the right pair is j-th of the 5 - m untried (m distinct
    wrong pairs drawn: 4, 84, 144, 24 draws for m = 1..4), 58 + 47 (j - 1) + 76 in all: at 134
    steps the draws with j = 1 add 4/4 + 84/3 + 144/2 + 24/1 = 125: 494 / 625; at 233 all but
    m = 1, j = 4 (4 draws x 1/4: 1 in 625) fit, that one needs 275. In tokens a block
    that finds the pair costs 4 x 46 + 9 r + 8 + 5 + 6 + 1 + 20 with r paths right, >= 233; a chain
    of four 217. parallel-4 takes the better way per cap."""
    caps = [75, 76, 89, 134, 233]
    sequential = budget_bounds.bounds([PROBLEM], (0,), caps)
    parallel = budget_bounds.bounds([PROBLEM], (0, 4), caps)
    assert sequential["D"] == [0.0, 20.0, 20.0, 40.0, 80.0]
    assert sequential["T"] == sequential["D"]
    assert parallel["D"] == pytest.approx([0.0, 20.0, 100 * 369 / 625, 100 * 494 / 625,
                                            100 * 624 / 625])
    assert parallel["T"] == [0.0, 20.0, 20.0, 40.0, 80.0]       # the chain is the better way
    block_only = budget_bounds.bounds([PROBLEM], (4,), [232, 233])
    assert block_only["T"] == pytest.approx([0.0, 100 * 4 * 4 ** 3 / 625])   # exactly one right


def test_the_costs_are_those_of_the_teachers_traces_tokenized():
    """Each trace data.render_carry_trace writes (chain, or a block of four first) is one of the
    responses the bound counts, at the T and D the sampler would record (tiny tokenizer,
    critical_path, no EOS); the problem read back from its prompt is the problem."""
    tokenizer = tiny_tokenizer()
    tags = TagIds.from_tokenizer(tokenizer)
    for i, problem in enumerate(data.carry_problems("hard", "test", 6)):
        assert budget_bounds.problem_of_prompt(problem.text) == problem
        for num_paths, fraction in ((0, 0.0), (4, 1.0)):
            costs, _ = budget_bounds.problem_costs(problem, num_paths)
            for seed in range(4):
                trace = data.render_carry_trace(problem, random.Random(f"{i}:{seed}"), fraction)
                ids = tokenizer.encode(trace, add_special_tokens=False)
                structure = parse_structure(ids, tags)
                assert (len(ids), critical_path(structure, "unseen")) in costs, trace


def test_a_prompt_without_one_pair_of_neighbours_is_refused():
    with pytest.raises(ValueError, match="2 pairs of neighbours"):
        budget_bounds.problem_of_prompt("Which two of 10 40 20 30 make 50?")
    with pytest.raises(ValueError, match="not a carry problem"):
        budget_bounds.problem_of_prompt("What is 2 + 2?")


def test_the_paired_bootstrap_by_hand():
    """One problem of two right for one method only: the resampled mean lead is 0, 50 or 100
    with chances 1/4, 1/2, 1/4, so the 2.5% and 97.5% points are 0 and 100. Paired, problems
    both methods get equally right or wrong add nothing to the spread."""
    assert budget_curve.paired_bootstrap([100.0, 0.0], [0.0, 0.0]) == (50.0, 0.0, 100.0)
    assert budget_curve.paired_bootstrap([100.0, 0.0, 100.0, 0.0],
                                         [100.0, 0.0, 100.0, 0.0]) == (0.0, 0.0, 0.0)
    assert budget_curve.paired_bootstrap([75.0, 25.0], [50.0, 0.0]) == (25.0, 25.0, 25.0)
    with pytest.raises(ValueError, match="one value per problem"):
        budget_curve.paired_bootstrap([1.0], [1.0, 2.0])
