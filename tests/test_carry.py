"""data.py's carry task (long attempts): hand-worked attempts and traces, determinism, disjoint
parts, answers by brute force and side by side, every column of every trace recomputed, the
summaries, the answer checker, scripts/look/failures.py and scripts/studies/carry_stats.py on
hand-made responses, show_data."""
import collections
import itertools
import re

import pytest

import data
from data import carry_attempt, carry_problems, load_data

# an attempt as the task writes it: a+b, the units column, the carry, the tens column, the sum
ATTEMPT = re.compile(r"(\d+)\+(\d+): (\d)\+(\d)=(\d+) carry (\d), (\d)\+(\d)\+(\d)=(\d+) -> (\d+) "
                     r"vs (\d+): (ok (\d+), (\d+)|no)")


def read_problem(text: str) -> tuple[list[int], int]:
    """Independent reading of a problem text: the list and the target."""
    m = re.fullmatch(r"Which two of ((?:\d\d )+)make (\d+)\?", text)
    return [int(x) for x in m.group(1).split()], int(m.group(2))


def brute_force(numbers: list[int], target: int) -> list[set[int]]:
    """Every pair (as a set) of the list that adds up to the target."""
    return [{a, b} for i, a in enumerate(numbers) for b in numbers[i + 1:] if a + b == target]


def neighbours(numbers: list[int]) -> list[set[int]]:
    """Every pair of numbers side by side in the list."""
    return [{numbers[i], numbers[i + 1]} for i in range(len(numbers) - 1)]


class ScriptedRng:
    """A stand-in for random.Random: random() pops `uniforms`, choice() pops `picks` (an index),
    shuffle() reverses the list."""
    def __init__(self, uniforms, picks=()):
        self.uniforms = list(uniforms)
        self.picks = list(picks)

    def random(self):
        return self.uniforms.pop(0)

    def choice(self, seq):
        return seq[self.picks.pop(0)]

    def shuffle(self, seq):
        seq.reverse()


def test_hand_worked_attempts():
    assert carry_attempt(47, 28, 75) == "47+28: 7+8=15 carry 1, 4+2+1=7 -> 75 vs 75: ok 47, 28"
    assert carry_attempt(94, 41, 85) == "94+41: 4+1=5 carry 0, 9+4+0=13 -> 135 vs 85: no"
    assert carry_attempt(99, 98, 197) == \
        "99+98: 9+8=17 carry 1, 9+9+1=19 -> 197 vs 197: ok 99, 98"


def test_hand_worked_traces():
    # 40+45 = 85, and no other pair makes 85; the neighbours: (94, 40), (40, 45), (45, 41)
    p = data.CarryProblem((94, 40, 45, 41), 85, (40, 45))
    assert p.text == "Which two of 94 40 45 41 make 85?" and p.answer == "40, 45"
    assert p.candidates == [(94, 40), (40, 45), (45, 41)]
    no = "94+40: 4+0=4 carry 0, 9+4+0=13 -> 134 vs 85: no"
    ok = "40+45: 0+5=5 carry 0, 4+4+0=8 -> 85 vs 85: ok 40, 45"
    flipped = "40+94: 0+4=4 carry 0, 4+9+0=13 -> 134 vs 85: no"
    other = "45+41: 5+1=6 carry 0, 4+4+0=8 -> 86 vs 85: no"
    # a block (0.1 < 0.5) of 2 paths: candidates 0 and 1, each kept in order (0.9, 0.7)
    rng = ScriptedRng([0.1, 0.9, 0.7], picks=[0, 1])
    assert data.render_carry_trace(p, rng, 0.5, num_paths=2) == \
        f"<Parallel><Path>{no}</Path><Path>{ok}</Path></Parallel>\n<Summary>40, 45</Summary>\n" \
        "Final Answer: 40, 45"
    # a block of 3 paths that all try (94, 40), the second flipped (0.2): "none", then the two
    # untried candidates in the shuffled (reversed) order, until one checks
    rng = ScriptedRng([0.1, 0.9, 0.2, 0.9, 0.9, 0.8], picks=[0, 0, 0])
    assert data.render_carry_trace(p, rng, 0.5, num_paths=3) == \
        f"<Parallel><Path>{no}</Path><Path>{flipped}</Path><Path>{no}</Path></Parallel>\n" \
        f"<Summary>none</Summary>\n{other}\n{ok}\nFinal Answer: 40, 45"
    # no block (0.6 >= 0.5): the candidates in the shuffled (reversed) order until one checks
    rng = ScriptedRng([0.6, 0.9, 0.9])
    assert data.render_carry_trace(p, rng, 0.5) == f"{other}\n{ok}\nFinal Answer: 40, 45"


def test_generator_is_deterministic_and_parts_are_disjoint():
    a = carry_problems("hard", "train", 300, seed=0)
    assert a == carry_problems("hard", "train", 300, seed=0)
    assert a[:100] == carry_problems("hard", "train", 100, seed=0)
    assert a != carry_problems("hard", "train", 300, seed=1)
    assert len(load_data("carry:easy:test", limit=100_000)) == 500
    recs = load_data("carry:medium", limit=50, seed=3)
    assert recs == load_data("carry:medium", limit=50, seed=3)
    seq = load_data("carry:medium", limit=50, seed=3, style="sequential")
    assert [r["problem"] for r in seq] == [r["problem"] for r in recs] and seq != recs

    def pattern(p):
        numbers, target = read_problem(p.text)
        return tuple(sorted(numbers)), target

    sizes = (("train", 3000), ("rl", 3000), ("val", 500), ("test", 500))
    parts = {part: {pattern(p) for s in data.CARRY_SPLITS for p in carry_problems(s, part, n)}
             for part, n in sizes}
    for (a, _), (b, _) in itertools.combinations(sizes, 2):
        assert parts[a].isdisjoint(parts[b]), (a, b)
    assert min(len(p) for p in parts.values()) >= 1000
    records = load_data("carry:easy,carry:easy:rl,carry:easy:val,carry:easy:test", limit=2)
    assert [r["source"] for r in records] == ["carry:easy"] * 2 + ["carry:easy:rl"] * 2 + \
        ["carry:easy:val"] * 2 + ["carry:easy:test"] * 2


def check_attempt(m: re.Match, numbers: list[int], target: int, right: set[int]) -> tuple:
    """Every column of one attempt recomputed by hand; (a, b, ok)."""
    a, b, ua, ub, units, carry, ta, tb, carried, tens, total, t = (int(x) for x in m.groups()[:12])
    assert a in numbers and b in numbers and a != b
    assert {a, b} in neighbours(numbers)                             # the teacher tries candidates
    assert (ua, ub) == (a % 10, b % 10) and units == ua + ub and carry == int(units >= 10)
    assert (ta, tb, carried) == (a // 10, b // 10, carry) and tens == ta + tb + carry
    assert total == a + b == tens * 10 + units % 10 and t == target
    ok = m.group(13).startswith("ok")
    assert ok == ({a, b} == right)
    if ok:
        assert (int(m.group(14)), int(m.group(15))) == (a, b)        # the pair, as written
    return a, b, ok


@pytest.mark.parametrize("name", ["carry:easy", "carry:medium", "carry:hard:rl",
                                  "carry:hard:test"])
def test_answers_candidates_and_every_column_recomputed(name):
    size = data.CARRY_SPLITS[name.split(":")[1]]
    for style in ("parallel", "sequential"):
        for r in load_data(name, style=style, limit=300, parallel_fraction=0.5, max_paths=4):
            numbers, target = read_problem(r["problem"])
            assert len(numbers) == len(set(numbers)) == size and all(10 <= x <= 99 for x in numbers)
            solutions = brute_force(numbers, target)
            assert len(solutions) == 1, r["problem"]            # exactly one pair makes the target
            right = solutions[0]
            assert right in neighbours(numbers)                 # the pair stands side by side
            assert r["answer"] == ", ".join(map(str, sorted(right)))
            sol = r["solution"]
            attempts = list(ATTEMPT.finditer(sol))
            assert len(attempts) == sol.count(": ok ") + sol.count(": no")
            checked = [check_attempt(m, numbers, target, right) for m in attempts]
            final = re.fullmatch(r"(?s).*\nFinal Answer: (\d+), (\d+)", sol)
            assert final and {int(final[1]), int(final[2])} == right
            block = re.fullmatch(r"(?s)<Parallel>(.*)</Parallel>\n<Summary>(.*?)</Summary>\n(.*)",
                                 sol)
            main_chain = sol
            if block:
                assert style == "parallel" and block.group(1).count("<Path>") == 4
                paths = [(a, b, ok) for a, b, ok in checked[:4]]
                hits = [f"{a}, {b}" for a, b, ok in paths if ok]
                assert block.group(2) == (hits[0] if hits else "none")
                main_chain = block.group(3)
                tried = [{a, b} for a, b, _ in paths]
            else:
                tried = []
            assert "<" not in main_chain
            chain = [{a, b} for a, b, _ in checked[4 if block else 0:]]
            # the main chain never repeats a pair, nor one a block tried, and stops at a hit
            assert all(pair not in tried and pair not in chain[:i] for i, pair in enumerate(chain))
            assert [ok for *_, ok in checked[4 if block else 0:]] in ([], [False] * (
                len(chain) - 1) + [True])


def test_share_of_blocks_and_the_first_attempt_chance(tiny_tokenizer):
    from attention import TagIds, parse_structure
    tags = TagIds.from_tokenizer(tiny_tokenizer)
    for fraction in (0.0, 1.0):
        records = load_data("carry:hard", limit=400, parallel_fraction=fraction, max_paths=4)
        blocks = 0
        for r in records:
            ids = tiny_tokenizer.encode(r["problem"] + "\n" + r["solution"],
                                        add_special_tokens=False)
            assert len(ids) < 512                                    # the tiny model's context
            s = parse_structure(tiny_tokenizer.encode(r["solution"], add_special_tokens=False),
                                tags)
            assert s.valid and all(len(b.paths) == 4 for b in s.blocks)
            blocks += len(s.blocks)
        assert blocks == fraction * len(records)
    # five neighbouring pairs on hard: the first attempt is right a fifth of the time, and the
    # right pair is each of the five equally often
    seq = load_data("carry:hard", style="sequential", limit=3000)
    first_right = sum(" ok " in r["solution"].split("\n")[0] for r in seq) / len(seq)
    assert abs(first_right - 1 / 5) < 0.025, first_right
    slots = collections.Counter()
    for r in seq:
        numbers, target = read_problem(r["problem"])
        slots[next(i for i in range(5) if numbers[i] + numbers[i + 1] == target)] += 1
    assert max(abs(n / len(seq) - 1 / 5) for n in slots.values()) < 0.025, slots


@pytest.fixture(scope="module")
def tiny_tokenizer():
    from model import load_model
    return load_model("tiny", device="cpu")[1]


def test_the_checker_accepts_exactly_the_right_answers():
    from rewards import extract_answer, verify
    for r in load_data("carry:hard:test", limit=20):
        numbers, target = read_problem(r["problem"])
        right = brute_force(numbers, target)[0]
        for a in numbers:
            for b in numbers:
                assert verify(extract_answer(f"Final Answer: {a}, {b}"), r["answer"]) == \
                    ({a, b} == right and a != b)
        a, b = sorted(right)
        for wrong in (str(target), f"{a}+{b}", f"{a}", f"{a}, {b}, {a}", f"{a}, {b + 1}", "none"):
            assert not verify(wrong, r["answer"]), wrong


def test_bad_names_and_knobs():
    with pytest.raises(ValueError, match="unknown dataset 'carry:huge'.*carry:hard:test"):
        load_data("carry:huge")
    with pytest.raises(ValueError, match="parallel_fraction"):
        load_data("carry:easy", parallel_fraction=-0.1)


PROMPT = "Which two of 94 41 40 45 69 make 85?\n"
NO = "94+41: 4+1=5 carry 0, 9+4+0=13 -> 135 vs 85: no"
OK = "45+40: 5+0=5 carry 0, 4+4+0=8 -> 85 vs 85: ok 45, 40"


def test_failure_classes_of_carry_responses():
    from scripts.look import failures
    cases = {"cut by the budget": f"{NO}\n45+40: 5+0=5 ca",
             "false ok": f"{NO.replace(': no', ': ok 94, 41')}\nFinal Answer: 94, 41",
             "missed ok": f"{OK.replace(': ok 45, 40', ': no')}\nFinal Answer: 94, 41",
             "wrong sum": "94+41: 4+1=5 carry 0, 9+4+0=12 -> 125 vs 85: no\nFinal Answer: 94, 41",
             "number not in the list": "44+41: 4+1=5 carry 0, 4+4+0=8 -> 85 vs 85: ok 44, 41\n"
                                       "Final Answer: 44, 41",
             "answer is not the checked pair": f"{OK}\nFinal Answer: 94, 41"}
    assert {k: failures.classify(PROMPT, r, False) for k, r in cases.items()} == \
        {k: k for k in cases}
    assert failures.classify(PROMPT, f"{OK}\nFinal Answer: 45, 40", True) == "right"


def test_carry_stats_by_hand():
    from scripts.studies import carry_stats

    def sample(response, correct):
        return {"prompt": PROMPT, "gold": "40, 45", "response": response, "correct": correct}

    block = f"<Parallel><Path>{NO}</Path><Path>{OK}</Path><Path>{NO}</Path><Path>{OK}</Path>" \
        "</Parallel>\n<Summary>{}</Summary>\n"
    none = f"<Parallel><Path>{NO}</Path><Path>{NO}</Path></Parallel>\n<Summary>none</Summary>\n"
    samples = [sample(block.format("45, 40") + "Final Answer: 45, 40", True),
               sample(block.format("94, 41") + "Final Answer: 94, 41", False),
               sample(none + f"{OK}\nFinal Answer: 45, 40", True),
               sample(f"{NO}\n{OK}\nFinal Answer: 45, 40", True)]
    figures = carry_stats.stats(samples)
    # first-round attempts: 4 + 4 + 2 paths + 1 main-chain attempt = 11, of which 4 right
    assert figures["first-round attempts"] == 11
    assert figures["right pair %"] == pytest.approx(100 * 4 / 11)
    assert figures["candidate %"] == figures["columns right %"] == 100.0
    assert figures["blocks %"] == 75.0
    assert figures["distinct pairs per block"] == pytest.approx(5 / 3)
    assert figures["block holds the pair %"] == pytest.approx(200 / 3)
    assert figures["summary names it %"] == 50.0
    assert figures["right after none %"] == 100.0


def test_show_data_shows_the_carry_task(capsys):
    from scripts.look import show_data
    show_data.main(["--show", "carry:hard", "--n=1", "--limit=20", "--max_paths=4",
                    "--parallel_fraction=1.0"])
    out = capsys.readouterr().out
    # each path of the trace closes into the next path or the end of its block
    assert out.startswith("--- carry:hard-0") and out.count("</Path><") == 4
    assert " carry " in out and "20 records" in out


def test_a_run_on_an_embedded_task_is_evaluated_on_its_test_part():
    import grpo
    from data import embedded_test_parts
    assert embedded_test_parts("carry:hard:rl") == "carry:hard:test"
    assert embedded_test_parts("synthetic:easy, carry:medium:rl") == \
        "synthetic:easy:test,carry:medium:test"
    assert embedded_test_parts("carry:hard:test") is None     # already held out
    assert embedded_test_parts("carry:hard:val") is None
    assert embedded_test_parts("gsm8k:train") is None
    tiny = dict(model="tiny", preset="tiny")
    assert grpo.resolve_defaults(grpo.GRPOConfig(data="carry:hard:rl", **tiny)).eval_data == \
        "carry:hard:test"
    assert grpo.resolve_defaults(grpo.GRPOConfig(**tiny)).eval_data == \
        "synthetic:easy:test,synthetic:medium:test,synthetic:hard:test"
    given = grpo.GRPOConfig(data="carry:hard:rl", eval_data="", **tiny)
    assert grpo.resolve_defaults(given).eval_data == ""
