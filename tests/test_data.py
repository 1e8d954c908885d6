"""data.py: the synthetic generator (hand-worked traces, determinism, disjoint splits, answers
checked by a brute-force solver, every check recomputed, the parallel fraction, the answer checker),
the real files (counts, answer normalisation checked against independent copies, the Parallel-GSM8K
filter), prompts, and the errors bad input gets."""
import hashlib
import itertools
import json
import os
import re

import pytest
from conftest import SHARED

import data
from data import (
    build_prompt,
    canonicalize_trace,
    gsm8k_answer,
    load_data,
    normalize_answer,
    prompt_style_of,
    synthetic_problems,
)

DATA = os.environ.get(data.DATA_ENV) or os.path.join(SHARED, "data")   # as data.py looks for it
QWEN3 = os.path.join(SHARED, "tokenizers", "qwen3")
needs_data = pytest.mark.skipif(
    not os.path.isdir(DATA), reason=f"{DATA} is absent (the real data sets; set $PARALLEL_R1_DATA)")
needs_qwen = pytest.mark.skipif(not os.path.isdir(QWEN3),
                                reason="../shared/tokenizers/qwen3 is absent")


@pytest.fixture(scope="module")
def tiny():
    from attention import TagIds
    from model import load_model
    tok = load_model("tiny", device="cpu")[1]
    return tok, TagIds.from_tokenizer(tok)


# --------------------------------------------------------------------------------------------------
# Synthetic task


def read_problem(text: str) -> tuple[list[int], int]:
    """Independent reading of a problem text: the list and the target."""
    m = re.fullmatch(r"Which two of ((?:\d )+)make (\d)\?", text)
    return [int(x) for x in m.group(1).split()], int(m.group(2))


def brute_force(numbers: list[int], target: int) -> list[set[int]]:
    """Every pair (as a set) of the list that adds up to the target."""
    return [{a, b} for i, a in enumerate(numbers) for b in numbers[i + 1:] if a + b == target]


class ScriptedRng:
    """A stand-in for random.Random whose draws are given in advance: random() pops `uniforms`,
    choice() pops `picks` (the index to take)."""
    def __init__(self, uniforms, picks=()):
        self.uniforms, self.picks = list(uniforms), list(picks)

    def random(self):
        return self.uniforms.pop(0)

    def choice(self, seq):
        return seq[self.picks.pop(0)]


def test_hand_worked_traces():
    p = data.PairProblem((6, 1, 5, 3), 8, (5, 3))        # wrong pairs in list order: 61 65 63 15 13
    assert p.text == "Which two of 6 1 5 3 make 8?" and p.answer == "3, 5"
    # round 1: one attempt (0.9 >= fraction 0.5), a wrong guess (0.7 >= accuracy 0.5) -> wrong pair
    # #2 = (6, 3), kept in order (0.2 < 0.5); round 2: a block (0.1), path 1 wrong (0.8) -> pair
    # #3 = (1, 5), order kept (0.3); path 2 right (0.4), flipped (0.6) -> 3+5
    rng = ScriptedRng([0.9, 0.7, 0.2, 0.1, 0.8, 0.3, 0.4, 0.6], picks=[2, 3])
    assert data.render_trace(p, rng) == ("6+3=9 vs 8: no\n<Parallel><Path>1+5=6 vs 8: no</Path>"
                                         "<Path>3+5=8 vs 8: ok</Path></Parallel>\n"
                                         "<Summary>3, 5</Summary>\nFinal Answer: 3, 5")
    # the last allowed round always holds the right pair, whatever the guesses
    rng = ScriptedRng([0.9, 0.9, 0.2, 0.9, 0.9, 0.2, 0.9, 0.9, 0.6], picks=[0, 0])
    assert data.render_trace(p, rng, max_rounds=3) == \
        "6+1=7 vs 8: no\n6+1=7 vs 8: no\n3+5=8 vs 8: ok\nFinal Answer: 3, 5"
    # a block with no hit: "none", then the next round
    rng = ScriptedRng([0.1, 0.9, 0.2, 0.9, 0.2, 0.9, 0.3, 0.2], picks=[1, 1])
    assert data.render_trace(p, rng) == ("<Parallel><Path>6+5=11 vs 8: no</Path>"
                                         "<Path>6+5=11 vs 8: no</Path></Parallel>\n"
                                         "<Summary>none</Summary>\n5+3=8 vs 8: ok\n"
                                         "Final Answer: 5, 3")


def test_check_trace_reasons_group_by_position_but_keep_bounds():
    """A one-path block once read "block at token N has N path(s), needs >= N": the bound was
    replaced too."""
    from attention import TagIds
    from model import load_model
    tok = load_model("tiny")[1]                          # the character tokenizer with the six tags
    tags = TagIds.from_tokenizer(tok)
    one_path = ("<Parallel><Path>2+3=5 vs 5: ok</Path></Parallel>\n<Summary>2, 3</Summary>\n"
                "Final Answer: 2, 3")
    assert data.check_trace(one_path, tok, tags) == "block at token N has N path(s), needs >= 2"
    assert data.check_trace("2+3=5 vs 5: ok", tok, tags) == "no 'Final Answer:' line"


def test_generator_is_deterministic():
    a = synthetic_problems("hard", "train", 300, seed=0)
    assert a == synthetic_problems("hard", "train", 300, seed=0)
    assert a[:100] == synthetic_problems("hard", "train", 100, seed=0)   # a prefix of a longer list
    # a limit beyond the part's 500 problems once generated more (eval.py --limit=100000: 800,000
    # samples)
    assert len(load_data("synthetic:easy:test", limit=100_000)) == \
        len(load_data("synthetic:easy:test")) == 500
    assert [p.text for p in a] != [p.text for p in synthetic_problems("hard", "train", 300, seed=1)]
    recs = load_data("synthetic:easy", limit=50, seed=3)
    assert recs == load_data("synthetic:easy", limit=50, seed=3)
    # the problems do not depend on the trace style or the parallel fraction, the traces do
    seq = load_data("synthetic:easy", limit=50, seed=3, style="sequential")
    assert [r["problem"] for r in seq] == [r["problem"] for r in recs] and seq != recs


def test_train_rl_val_and_test_share_nothing():
    splits = list(data.SYNTHETIC_SPLITS)
    def pattern(p):
        return tuple(sorted(read_problem(p.text)[0])), read_problem(p.text)[1]

    sizes = (("train", 3000), ("rl", 3000), ("val", 500), ("test", 500))
    parts = {part: {pattern(p) for s in splits for p in synthetic_problems(s, part, n)}
             for part, n in sizes}
    for (a, _), (b, _) in itertools.combinations(sizes, 2):
        assert parts[a].isdisjoint(parts[b]), (a, b)
    # and no part is tiny (the held-out fifth: 197 patterns, 108 in val, 89 in test today)
    assert min(len(p) for p in parts.values()) >= 85
    records = load_data("synthetic:easy,synthetic:easy:rl,synthetic:easy:val,synthetic:easy:test",
                        limit=2)
    assert {r["source"] for r in records} == \
        {"synthetic:easy", "synthetic:easy:rl", "synthetic:easy:val", "synthetic:easy:test"}


# The first 300 records (problem | trace) of the SFT and RL parts, sha256 of their texts joined by
# newlines, first 16 hex digits, computed by the code before ":val" was carved out of the
# held-out fifth (2026-12-07): the SFT data and the RL stream of every earlier run are unchanged.
TRAIN_AND_RL_STREAMS = {
    "synthetic:easy": "345cbb42655f3e92", "synthetic:easy:rl": "74c06a9214c2723d",
    "synthetic:medium": "db07c9da2bf72287", "synthetic:medium:rl": "fdddc95422cc1cc4",
    "synthetic:hard": "a4c5025d9632ec19", "synthetic:hard:rl": "de4075f22150799c",
    "carry:easy": "2ddd83cc12143ad0", "carry:easy:rl": "3391b247035818ed",
    "carry:medium": "5de90aef16df8e82", "carry:medium:rl": "01b32ac8850d98f8",
    "carry:hard": "7bf74784b44f375b", "carry:hard:rl": "02198cee0f696ba8",
}


@pytest.mark.parametrize("name", sorted(TRAIN_AND_RL_STREAMS))
def test_sft_and_rl_streams_are_those_before_the_validation_part(name):
    records = load_data(name, limit=300)
    text = "\n".join(r["problem"] + "|" + r["solution"] for r in records)
    assert hashlib.sha256(text.encode()).hexdigest()[:16] == TRAIN_AND_RL_STREAMS[name]


@pytest.mark.parametrize("name", ["synthetic:easy", "synthetic:medium", "synthetic:hard:rl",
                                  "synthetic:hard:val", "synthetic:hard:test"])
def test_answers_and_every_check_recomputed_from_the_text(name):
    size = data.SYNTHETIC_SPLITS[name.split(":")[1]]
    for style in ("parallel", "sequential"):
        for r in load_data(name, style=style, limit=500):
            numbers, target = read_problem(r["problem"])
            assert len(numbers) == len(set(numbers)) == size and all(1 <= x <= 9 for x in numbers)
            solutions = brute_force(numbers, target)
            assert len(solutions) == 1, r["problem"]           # exactly one pair makes the target
            assert set(map(int, r["answer"].split(", "))) == solutions[0] and r["answer"] == \
                ", ".join(map(str, sorted(solutions[0])))
            sol = r["solution"]
            checks = re.findall(r"(\d)\+(\d)=(\d+) vs (\d): (ok|no)", sol)
            assert checks and len(checks) == sol.count(" ok") + sol.count(" no")
            for a, b, s, t, verdict in checks:                          # every check is right
                assert int(a) in numbers and int(b) in numbers and a != b
                assert int(a) + int(b) == int(s)
                assert int(t) == target
                assert (verdict == "ok") == (int(s) == target)
            final = re.fullmatch(r"(?s).*\nFinal Answer: (\d), (\d)", sol)
            assert final and {int(final[1]), int(final[2])} == solutions[0]
            # the search stops at a hit
            assert sol.count(" ok") >= 1 and not re.search(r" ok.*\n\d\+", sol)
            for summary in re.findall(r"<Summary>(.*?)</Summary>", sol):
                assert summary == "none" or set(map(int, summary.split(", "))) == solutions[0]


def test_parallel_fraction_sets_the_share_of_blocks(tiny):
    from attention import parse_structure
    tok, tags = tiny
    for fraction in (0.0, 0.5, 1.0):
        rounds = blocks = 0
        for r in load_data("synthetic:medium", limit=600, parallel_fraction=fraction):
            s = parse_structure(tok.encode(r["solution"], add_special_tokens=False), tags)
            assert s.valid and all(len(b.paths) == 2 and b.summary for b in s.blocks), \
                (r["solution"], s.reason)
            # attempt lines + blocks
            rounds += r["solution"].count("\n") - 2 * len(s.blocks) + len(s.blocks)
            blocks += len(s.blocks)
        share = blocks / rounds
        assert abs(share - fraction) < 0.04, (fraction, share)
    for r in load_data("synthetic:hard", style="sequential", limit=300):
        assert "<" not in r["solution"]


def test_the_checker_accepts_exactly_the_right_answers():
    from rewards import extract_answer, verify
    for r in load_data("synthetic:medium:test", limit=40):
        numbers, target = read_problem(r["problem"])
        right = brute_force(numbers, target)[0]
        for a in numbers:
            for b in numbers:
                for text in (f"Final Answer: {a}, {b}", f"Final Answer: {a},{b}."):
                    assert verify(extract_answer(text), r["answer"]) == \
                        ({a, b} == right and a != b), text
        a, b = sorted(right)
        for wrong in (str(target), f"{a}+{b}", f"{a}", f"{a}, {b}, {a}", f"{a}, {b + 10}", "none",
                      ""):
            assert not verify(wrong, r["answer"]), wrong


def test_bad_knobs_and_styles():
    with pytest.raises(ValueError, match="parallel_fraction"):
        load_data("synthetic:easy", parallel_fraction=1.5)
    with pytest.raises(ValueError, match="unknown dataset"):
        load_data("synthetic:huge")


# --------------------------------------------------------------------------------------------------
# Answers, problems, traces of the real sets


def test_normalisation_cases():
    assert normalize_answer("025") == "25" and normalize_answer("080") == "80"   # AIME zero padding
    assert normalize_answer(27.0) == "27" and normalize_answer(-1.0) == "-1"    # AMC floats
    assert normalize_answer(70) == "70" and normalize_answer("1,450,000") == "1450000"
    assert gsm8k_answer("He pays 1,000 + 450 = <<1000+450=1450>>1,450.\n#### 1,450") == "1450"
    assert normalize_answer("\\left( 3, \\frac{\\pi}{2} \\right)", latex=True) == \
        "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert normalize_answer("1,234", latex=True) == "1,234" and normalize_answer("0.15") == "0.15"
    assert data.gsm8k_sequential_solution("She makes 9 * 2 = $<<9*2=18>>18.\n#### 18") == \
        "She makes 9 * 2 = $18.\nFinal Answer: 18"


def test_problem_extraction():
    v3 = ("Solve the following problem step by step.\n...Final Answer: followed by the result.\n\n"
          "Problem: What is 2+2?")
    assert data.extract_problem(v3) == "What is 2+2?"
    base = ('What is 2+2? Let\'s think step by step and output the final answer after '
            '"Final Answer: ".')
    assert data.extract_problem(base) == "What is 2+2?"
    dapo = ("Solve the following math problem step by step. The last line of your response should "
            "be of the form Answer: $Answer (without quotes) where $Answer is the answer to the "
            "problem.\n\nWhat is $2+2$?\n\n"
            'Remember to put your answer on its own line after "Answer:"')
    assert data.extract_problem(dapo) == "What is $2+2$?"
    assert data.extract_problem("Find $\x0crac{1}{2}$ of $\triangle ABC$.") == \
        "Find $\\frac{1}{2}$ of $\\triangle ABC$."


def test_canonical_layout():
    raw = ("Go.\n<Parallel>\n<Path>\nx\n</Path>\n<Path>y</Path>\n</Parallel>\n\n"
           "<Summary>s</Summary>\n\nFinal Answer: 1\n")
    assert canonicalize_trace(raw) == ("Go.\n<Parallel><Path>\nx\n</Path><Path>y</Path>"
                                       "</Parallel>\n<Summary>s</Summary>\n\nFinal Answer: 1")


@needs_data
def test_real_file_counts():
    counts = {"math500": 500, "aime24": 30, "aime25": 30, "amc23": 40, "gsm8k:test": 1319,
              "gsm8k:train": 7473, "dapo": 17917}
    for name, n in counts.items():
        recs = load_data(name, data_dir=DATA)
        assert len(recs) == n, name
        assert all(r["problem"] and r["answer"] and r["source"] == name for r in recs)
        assert len({r["id"] for r in recs}) == n, name
    both = load_data("aime24,aime25", data_dir=DATA)
    assert len(both) == 60 and [r["source"] for r in both] == ["aime24"] * 30 + ["aime25"] * 30
    assert len(load_data("gsm8k:test,math500", limit=7, data_dir=DATA)) == 14


@needs_data
@pytest.mark.parametrize("name,folder", [("math500", "math500/test"), ("aime24", "aime24/test"),
                                         ("aime25", "aime25/test"), ("amc23", "amc23/test"),
                                         ("gsm8k:test", "gsm8k/test"),
                                         ("gsm8k:train", "gsm8k/train")])
def test_answers_and_problems_match_the_independent_uniform_copies(name, folder):
    """The *.uniform.jsonl files were normalised separately (SOURCES.md): "025" -> "25", 27.0 ->
    "27", "#### 1,450" -> "1450", MATH-500 LaTeX unchanged, the AIME25 form feeds repaired."""
    recs = load_data(name, data_dir=DATA)
    with open(os.path.join(DATA, folder + ".uniform.jsonl")) as f:
        uniform = [json.loads(line) for line in f]
    assert [r["answer"] for r in recs] == [u["answer"] for u in uniform]
    differ = [(r["problem"], u["problem"]) for r, u in zip(recs, uniform)
              if r["problem"] != u["problem"].strip()]
    # we also repair the one "\triangle" whose "\t" became a tab; the copy keeps the tab
    if name == "aime25":
        assert len(differ) == 1 and differ[0][0] == differ[0][1].replace("\t", "\\t")
    else:
        assert differ == []
    raw = {u["answer_raw"] for u in uniform} - {u["answer"] for u in uniform}
    if name in ("aime24", "amc23", "gsm8k:test", "gsm8k:train"):
        assert raw, "the source has format accidents this test is meant to cover"


@needs_data
def test_gsm8k_sequential_solutions():
    recs = load_data("gsm8k:test", style="sequential", data_dir=DATA, limit=50)
    assert all(r["solution"].endswith(f"Final Answer: {r['answer']}") and "<<" not in r["solution"]
               for r in recs)
    # no parallel trace
    assert all(r["solution"] is None for r in load_data("gsm8k:test", data_dir=DATA, limit=50))


@needs_data
def test_parallel_gsm8k_filter(capfd):
    """Measured on the 341-row v2 sample: 3 traces fail the format check (a stray "First," between
    <Parallel> and <Path>; text between </Parallel> and <Summary>; an unclosed <Summary>), 335 pass,
    3 have no parallel block (kept: the model may choose not to branch)."""
    import pyarrow.parquet as pq
    recs = load_data("parallel_gsm8k", data_dir=DATA)
    err = capfd.readouterr().err
    assert "kept 338 of 341 records: 335 of 338 parallel traces pass the format check" in err
    assert "3 traces have no parallel block (kept)" in err
    assert "1 x unclosed <Summary> at token N" in err
    assert len(recs) == 338
    table = pq.read_table(os.path.join(DATA, "parallel_gsm8k", "train.parquet"))
    rows = {r["extra_info"]["index"]: r for r in table.to_pylist()}
    for r in recs:
        row = rows[int(r["id"].rsplit("-", 1)[1])]
        assert r["problem"] == row["extra_info"]["question"].split("Problem:")[-1].strip()
        assert r["answer"] == row["reward_model"]["ground_truth"]
        assert not re.search(r"<Parallel>\s+<Path>|</Path>\s+<Path>|</Path>\s+</Parallel>",
                             r["solution"])
        assert r["solution"].count("</Parallel>") == r["solution"].count("</Parallel>\n<Summary>")
    with pytest.raises(ValueError, match="parallel traces, not sequential"):
        load_data("parallel_gsm8k", style="sequential", data_dir=DATA)


# --------------------------------------------------------------------------------------------------
# Bad input


def test_errors(tmp_path, capfd):
    with pytest.raises(ValueError, match="unknown dataset 'gsm9k'") as e:
        load_data("gsm9k")
    assert all(name in str(e.value) for name in data.KNOWN_DATASETS)
    missing = str(tmp_path / "nope.jsonl")
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_data(missing)
    with pytest.raises(FileNotFoundError,
                       match="a folder: name a .jsonl, .json or .parquet file in it"):
        load_data(str(tmp_path))                        # once "not found" for a folder that exists
    with pytest.raises(FileNotFoundError, match="no_such_folder"):
        load_data("aime24", data_dir=str(tmp_path / "no_such_folder"))
    with pytest.raises(FileNotFoundError,
                       match="no local file .*aime24/test.jsonl.*HuggingFaceH4/aime_2024"):
        load_data("aime24", data_dir=str(tmp_path))        # offline (conftest): the hub cannot help
    f = tmp_path / "mixed.jsonl"
    f.write_text('{"question": "What is 1+1?", "answer": 2.0}\n{"question": "No answer here."}\n'
                 '{"problem": "", "answer": "3"}\n'
                 '{"prompt": [{"role": "user", "content": "What is 0+7?"}], '
                 '"reward_model": {"ground_truth": "007"}}\n')
    recs = load_data(str(f))
    assert [(r["problem"], r["answer"]) for r in recs] == \
        [("What is 1+1?", "2"), ("What is 0+7?", "7")]
    assert "skipped 2 of 4 rows" in capfd.readouterr().err
    with pytest.raises(ValueError, match="row 1: no answer"):
        load_data(str(f), strict=True)
    comma = tmp_path / "gsm8k,mine.jsonl"        # a comma in a file's name: one file, not two specs
    comma.write_text(f.read_text())
    assert load_data(str(comma)) == [dict(r, id=r["id"].replace("mixed", "gsm8k,mine"),
                                          source=str(comma)) for r in recs]
    empty = tmp_path / "empty.json"
    empty.write_text('[{"question": "Only a question."}]')
    with pytest.raises(ValueError, match=r"none of its 1 rows .* fields are \['question'\]"):
        load_data(str(empty))
    with pytest.raises(ValueError, match="has no solution"):
        data.format_response({"id": "x", "solution": None})


# --------------------------------------------------------------------------------------------------
# Prompts


def test_tiny_prompt_is_short_plain_text(tiny, tmp_path):
    tok, _ = tiny
    problem = synthetic_problems("hard", "test", 1)[0].text
    # the tiny preset's prompt asks for nothing; no tokenizer makes it so by itself
    assert build_prompt(tok, problem, "bare") == problem + "\n"
    assert prompt_style_of("tiny", "parallel") == prompt_style_of("tiny", "sequential") == "bare"
    assert prompt_style_of("paper", "sequential") == "sequential"
    assert build_prompt(tok, problem).startswith("Solve the problem below step by step.")
    f = tmp_path / "paper.txt"
    f.write_text("Solve it.\nProblem: {Problem}")
    tricky = "Is {problem} a set? $\\frac{1}{2}$"
    assert build_prompt(tok, tricky, prompt_file=str(f)) == "Solve it.\nProblem: " + tricky
    (tmp_path / "bad.txt").write_text("no placeholder")
    with pytest.raises(ValueError, match="placeholder"):
        build_prompt(tok, problem, prompt_file=str(tmp_path / "bad.txt"))
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        build_prompt(tok, problem, prompt_file=str(tmp_path / "missing.txt"))


@needs_qwen
def test_qwen3_prompt_uses_the_chat_template():
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(QWEN3)
    problem = "Ava has 3 boxes of 7 pens. How many pens in all?"
    text = build_prompt(tok, problem)
    assert text.startswith("<|im_start|>user\n")
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert "Problem: " + problem + "<|im_end|>" in text and "<Parallel>" in text
    assert "Final Answer:" in text
    seq = build_prompt(tok, problem, "sequential")
    assert seq.startswith("<|im_start|>user\n" + problem + "\n") and "<Parallel>" not in seq
