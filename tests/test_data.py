"""data.py: the synthetic generator (determinism, disjoint splits, answers recomputed from the text, traces
that parse), the real files (counts, answer normalisation checked against independent copies, the
Parallel-GSM8K filter), prompts, and the errors bad input gets."""
import json
import os
import re

import pytest
from conftest import SHARED

import data
from data import (WordProblem, build_prompt, canonicalize_trace, classify_failure, gsm8k_answer, load_data, normalize_answer,
                  problem_key, render_trace, synthetic_problems)

DATA = os.path.join(SHARED, "data")
QWEN3 = os.path.join(SHARED, "tokenizers", "qwen3")
needs_data = pytest.mark.skipif(not os.path.isdir(DATA), reason="../shared/data is absent (real data sets)")
needs_qwen = pytest.mark.skipif(not os.path.isdir(QWEN3), reason="../shared/tokenizers/qwen3 is absent")


@pytest.fixture(scope="module")
def tiny():
    from attention import TagIds
    from model import load_model
    tok = load_model("tiny", device="cpu")[1]
    return tok, TagIds.from_tokenizer(tok)


# ----------------------------------------------------------------------------------------------------
# Synthetic task


def numbers_from_text(text: str) -> list[list[tuple[int, int]]]:
    """Independent reading of a problem: per "<Name> has ..." sentence, the (count, size) pairs."""
    people = re.findall(r"[A-Z][a-z]+ has ([^.]*)\.", text)
    return [[(int(c), int(s)) for c, s in re.findall(r"(\d+) [a-z]+ of (\d+) [a-z]+", p)] for p in people]


def test_hand_worked_traces():
    p = WordProblem("Ava has 3 boxes of 7 pens and 4 bags of 6 pens. How many pens in all?", (((3, 7), (4, 6)),))
    assert render_trace(p, "sum-in-summary") == ("<Parallel><Path>3*7=21,4*6=24</Path><Path>4*6=24,3*7=21</Path>"
                                                 "</Parallel>\n<Summary>21+24=45</Summary>\nFinal Answer: 45")
    assert render_trace(p, "sequential") == "3*7=21\n4*6=24\n21+24=45\nFinal Answer: 45"
    assert render_trace(p, "parallel") == ("<Parallel><Path>3*7=21,4*6=24,21+24=45</Path><Path>4*6=24,3*7=21,"
                                           "24+21=45</Path></Parallel>\n<Summary>45</Summary>\nFinal Answer: 45")
    assert render_trace(p, "decompose") == ("<Parallel><Path>3*7=21</Path><Path>4*6=24</Path></Parallel>\n"
                                            "<Summary>21+24=45</Summary>\nFinal Answer: 45")
    two = WordProblem("", (((3, 7), (4, 6)), ((2, 5), (3, 4))))
    assert render_trace(two, "sum-in-summary") == (
        "<Parallel><Path>3*7=21,4*6=24</Path><Path>4*6=24,3*7=21</Path></Parallel>\n<Summary>21+24=45</Summary>\n"
        "<Parallel><Path>2*5=10,3*4=12</Path><Path>3*4=12,2*5=10</Path></Parallel>\n<Summary>10+12=22</Summary>\n"
        "45+22=67\nFinal Answer: 67")
    assert render_trace(two, "sequential") == \
        "3*7=21\n4*6=24\n21+24=45\n2*5=10\n3*4=12\n10+12=22\n45+22=67\nFinal Answer: 67"


def test_generator_is_deterministic():
    a = synthetic_problems("hard", "train", 300, seed=0)
    assert a == synthetic_problems("hard", "train", 300, seed=0)
    assert a[:100] == synthetic_problems("hard", "train", 100, seed=0)     # a prefix of a longer list
    assert [p.text for p in a] != [p.text for p in synthetic_problems("hard", "train", 300, seed=1)]
    recs = load_data("synthetic:easy", limit=50, seed=3)
    assert recs == load_data("synthetic:easy", limit=50, seed=3)


def test_train_and_test_share_nothing():
    train = [p for s in ("easy", "hard") for p in synthetic_problems(s, "train", 3000)]
    test = [p for s in ("easy", "hard") for p in synthetic_problems(s, "test", 1000)]
    assert {problem_key(p.groups) for p in train}.isdisjoint(problem_key(p.groups) for p in test)
    assert {p.text for p in train}.isdisjoint(p.text for p in test)
    # the number patterns read back from the text, order forgotten, are disjoint too
    canon = lambda p: tuple(sorted(tuple(sorted(g)) for g in numbers_from_text(p.text)))
    assert {canon(p) for p in train}.isdisjoint(canon(p) for p in test)
    assert len({canon(p) for p in test}) > 150            # and the test parts are not tiny (213 distinct today)


@pytest.mark.parametrize("name", ["synthetic:easy", "synthetic:hard", "synthetic:easy:test", "synthetic:hard:test"])
def test_answers_and_every_step_recomputed_from_the_text(name):
    split = name.split(":")[1]
    kinds = [d for _, d in data.SYNTHETIC_SPLITS[split]]
    for style in ("parallel", "sequential", "sum-in-summary", "decompose"):
        for r in load_data(name, style=style, limit=1000):
            groups = numbers_from_text(r["problem"])
            assert re.fullmatch(r"\d+", r["answer"]), r
            assert int(r["answer"]) == sum(c * s for g in groups for c, s in g)
            assert any(len(groups) == d.groups and all(len(g) == d.parts and all(d.low <= x <= d.high
                       for pair in g for x in pair) for g in groups) for d in kinds), r["problem"]
            sol = r["solution"]
            assert sol.endswith(f"\nFinal Answer: {r['answer']}")
            for a, b, c in re.findall(r"(\d+)\*(\d+)=(\d+)", sol):
                assert int(a) * int(b) == int(c)
            for terms, total in re.findall(r"(\d+(?:\+\d+)+)=(\d+)", sol):
                assert sum(map(int, terms.split("+"))) == int(total)
            products = sorted(tuple(map(int, m)) for m in re.findall(r"(\d+)\*(\d+)=", sol))
            per_copy = 1 if style in ("sequential", "decompose") else 2    # every path has all products
            assert products == sorted([pair for g in groups for pair in g] * per_copy)


def test_mixture_follows_the_knobs():
    for split, mixture in data.SYNTHETIC_SPLITS.items():
        probs = synthetic_problems(split, "train", 4000)
        for weight, d in mixture:
            share = sum(len(p.groups) == d.groups for p in probs) / len(probs)
            assert abs(share - weight) < 0.03, (split, d, share)


def test_traces_parse_and_sequential_has_no_tags(tiny):
    from attention import parse_structure
    tok, tags = tiny
    for name in ("synthetic:easy", "synthetic:hard"):
        for style in ("parallel", "sum-in-summary", "decompose"):
            for r in load_data(name, style=style, limit=300):
                s = parse_structure(tok.encode(r["solution"], add_special_tokens=False), tags)
                people = len(numbers_from_text(r["problem"]))
                assert s.valid, (r["solution"], s.reason)
                assert len(s.blocks) == people and all(len(b.paths) == 2 for b in s.blocks)
                assert all(b.summary is not None for b in s.blocks)
        for r in load_data(name, style="sequential", limit=300):
            assert not set(tok.encode(r["solution"], add_special_tokens=False)) & tags.structural
            assert "<" not in r["solution"]


def test_bad_knobs_and_styles():
    with pytest.raises(ValueError, match="parts >= 2"):
        data.Difficulty(groups=1, parts=1)
    with pytest.raises(ValueError, match="unknown style"):
        load_data("synthetic:easy", style="zigzag")
    with pytest.raises(ValueError, match="unknown synthetic split"):
        synthetic_problems("medium")


# ----------------------------------------------------------------------------------------------------
# Answers, problems, traces of the real sets


def test_normalisation_cases():
    assert normalize_answer("025") == "25" and normalize_answer("080") == "80"       # AIME zero padding
    assert normalize_answer(27.0) == "27" and normalize_answer(-1.0) == "-1"        # AMC floats
    assert normalize_answer(70) == "70" and normalize_answer("1,450,000") == "1450000"
    assert gsm8k_answer("He pays 1,000 + 450 = <<1000+450=1450>>1,450.\n#### 1,450") == "1450"
    assert normalize_answer("\\left( 3, \\frac{\\pi}{2} \\right)", latex=True) == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert normalize_answer("1,234", latex=True) == "1,234" and normalize_answer("0.15") == "0.15"
    assert data.gsm8k_sequential_solution("She makes 9 * 2 = $<<9*2=18>>18.\n#### 18") == \
        "She makes 9 * 2 = $18.\nFinal Answer: 18"


def test_problem_extraction():
    v3 = "Solve the following problem step by step.\n...Final Answer: followed by the result.\n\nProblem: What is 2+2?"
    assert data.extract_problem(v3) == "What is 2+2?"
    base = 'What is 2+2? Let\'s think step by step and output the final answer after "Final Answer: ".'
    assert data.extract_problem(base) == "What is 2+2?"
    dapo = ("Solve the following math problem step by step. The last line of your response should be of the form "
            "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\nWhat is $2+2$?\n\n"
            'Remember to put your answer on its own line after "Answer:"')
    assert data.extract_problem(dapo) == "What is $2+2$?"
    assert data.extract_problem("Find $\x0crac{1}{2}$ of $\triangle ABC$.") == \
        "Find $\\frac{1}{2}$ of $\\triangle ABC$."


def test_canonical_layout():
    raw = "Go.\n<Parallel>\n<Path>\nx\n</Path>\n<Path>y</Path>\n</Parallel>\n\n<Summary>s</Summary>\n\nFinal Answer: 1\n"
    assert canonicalize_trace(raw) == \
        "Go.\n<Parallel><Path>\nx\n</Path><Path>y</Path></Parallel>\n<Summary>s</Summary>\n\nFinal Answer: 1"


@needs_data
def test_real_file_counts():
    counts = {"math500": 500, "aime24": 30, "aime25": 30, "amc23": 40, "gsm8k:test": 1319, "gsm8k:train": 7473,
              "dapo": 17917}
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
                                         ("gsm8k:test", "gsm8k/test"), ("gsm8k:train", "gsm8k/train")])
def test_answers_and_problems_match_the_independent_uniform_copies(name, folder):
    """The *.uniform.jsonl files were normalised separately (SOURCES.md): "025" -> "25", 27.0 -> "27",
    "#### 1,450" -> "1450", MATH-500 LaTeX unchanged, the AIME25 form feeds repaired."""
    recs = load_data(name, data_dir=DATA)
    with open(os.path.join(DATA, folder + ".uniform.jsonl")) as f:
        uniform = [json.loads(line) for line in f]
    assert [r["answer"] for r in recs] == [u["answer"] for u in uniform]
    differ = [(r["problem"], u["problem"]) for r, u in zip(recs, uniform) if r["problem"] != u["problem"].strip()]
    if name == "aime25":   # we also repair the one "\triangle" whose "\t" became a tab; the copy keeps the tab
        assert len(differ) == 1 and differ[0][0] == differ[0][1].replace("\t", "\\t")
    else:
        assert differ == []
    raw = {u["answer_raw"] for u in uniform} - {u["answer"] for u in uniform}
    if name in ("aime24", "amc23", "gsm8k:test", "gsm8k:train"):
        assert raw, "the source has format accidents this test is meant to cover"


@needs_data
def test_gsm8k_sequential_solutions():
    recs = load_data("gsm8k:test", style="sequential", data_dir=DATA, limit=50)
    assert all(r["solution"].endswith(f"Final Answer: {r['answer']}") and "<<" not in r["solution"] for r in recs)
    assert all(r["solution"] is None for r in load_data("gsm8k:test", data_dir=DATA, limit=50))   # no parallel trace


@needs_data
def test_parallel_gsm8k_filter(capfd):
    """Measured on the 341-row v2 sample: 3 traces fail the format check (a stray "First," between
    <Parallel> and <Path>; text between </Parallel> and <Summary>; an unclosed <Summary>), 335 pass,
    3 have no parallel block (kept: the model may choose not to branch)."""
    import pyarrow.parquet as pq
    recs = load_data("parallel_gsm8k", data_dir=DATA)
    err = capfd.readouterr().err
    assert "335 of 338 parallel traces pass" in err and "3 more traces have no parallel block" in err
    assert "1 x unclosed <Summary> at token N" in err
    assert len(recs) == 338
    table = pq.read_table(os.path.join(DATA, "parallel_gsm8k", "train.parquet"))
    rows = {r["extra_info"]["index"]: r for r in table.to_pylist()}
    for r in recs:
        row = rows[int(r["id"].rsplit("-", 1)[1])]
        assert r["problem"] == row["extra_info"]["question"].split("Problem:")[-1].strip()
        assert r["answer"] == row["reward_model"]["ground_truth"]
        assert not re.search(r"<Parallel>\s+<Path>|</Path>\s+<Path>|</Path>\s+</Parallel>", r["solution"])
        assert r["solution"].count("</Parallel>") == r["solution"].count("</Parallel>\n<Summary>")
    with pytest.raises(ValueError, match="parallel traces, not sequential"):
        load_data("parallel_gsm8k", style="sequential", data_dir=DATA)


# ----------------------------------------------------------------------------------------------------
# Bad input


def test_errors(tmp_path, capfd):
    with pytest.raises(ValueError, match="unknown dataset 'gsm9k'") as e:
        load_data("gsm9k")
    assert all(name in str(e.value) for name in data.KNOWN_DATASETS)
    missing = str(tmp_path / "nope.jsonl")
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_data(missing)
    with pytest.raises(FileNotFoundError, match="no_such_folder"):
        load_data("aime24", data_dir=str(tmp_path / "no_such_folder"))
    with pytest.raises(FileNotFoundError, match="no local file .*aime24/test.jsonl.*HuggingFaceH4/aime_2024"):
        load_data("aime24", data_dir=str(tmp_path))              # offline (conftest): the hub cannot help
    f = tmp_path / "mixed.jsonl"
    f.write_text('{"question": "What is 1+1?", "answer": 2.0}\n{"question": "No answer here."}\n'
                 '{"problem": "", "answer": "3"}\n{"prompt": [{"role": "user", "content": "What is 0+7?"}], '
                 '"reward_model": {"ground_truth": "007"}}\n')
    recs = load_data(str(f))
    assert [(r["problem"], r["answer"]) for r in recs] == [("What is 1+1?", "2"), ("What is 0+7?", "7")]
    assert "skipped 2 of 4 rows" in capfd.readouterr().err
    with pytest.raises(ValueError, match="row 1: no answer"):
        load_data(str(f), strict=True)
    empty = tmp_path / "empty.json"
    empty.write_text('[{"question": "Only a question."}]')
    with pytest.raises(ValueError, match="gave no records"):
        load_data(str(empty))
    with pytest.raises(ValueError, match="has no solution"):
        data.format_response({"id": "x", "solution": None})


# ----------------------------------------------------------------------------------------------------
# Prompts


def test_tiny_prompt_is_short_plain_text(tiny, tmp_path):
    tok, _ = tiny
    problem = synthetic_problems("hard", "test", 1)[0].text
    assert build_prompt(tok, problem) == "Use parallel paths.\n" + problem + "\n"
    assert build_prompt(tok, problem, "sequential") == "Think step by step.\n" + problem + "\n"
    assert build_prompt(tok, problem, "sum-in-summary") == build_prompt(tok, problem)
    assert len(build_prompt(tok, problem)) < 160
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
    assert text.startswith("<|im_start|>user\n") and text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert "Problem: " + problem + "<|im_end|>" in text and "<Parallel>" in text and "Final Answer:" in text
    seq = build_prompt(tok, problem, "sequential")
    assert seq.startswith("<|im_start|>user\n" + problem + "\n") and "<Parallel>" not in seq


def test_show_cli(capsys):
    data.main(["--show", "synthetic:hard", "--n=1", "--limit=20"])
    out = capsys.readouterr().out
    assert "Use parallel paths." in out and "</Summary>\n" in out and "Final Answer:" in out and "20 records" in out


def test_classify_failure_names_the_first_wrong_step():
    # a hand-made two-person problem: totals 1*4+1*2 = 6 and 2*1+2*3 = 8, answer 14
    problem = ("Kim has 1 box of 4 beads and 1 bin of 2 beads. Fay has 2 packs of 1 bead and 2 jars of 3 beads. "
               "How many beads in all?")
    p = WordProblem(problem, (((1, 4), (1, 2)), ((2, 1), (2, 3))))
    right = render_trace(p)
    assert right.endswith("<Summary>8</Summary>\n6+8=14\nFinal Answer: 14")
    assert classify_failure(problem, right) == "other"                    # nothing wrong in the worked steps
    assert classify_failure(problem, right.replace("<Summary>8<", "<Summary>9<")) == "block total or count"
    assert classify_failure(problem, right.split("\n<Parallel>")[0] + "\n6\nFinal Answer: 6") == "block total or count"
    assert classify_failure(problem, right.replace("6+8=14\n", "6+8=14\nFinswer: ")) == "garbled final line"
    assert classify_failure(problem, right.replace("6+8=14\nFinal Answer: 14", "6+8=13\nFinal Answer: 13")) == "final sum"
    assert classify_failure(problem, right.replace("6+8=14", "6+6=12")) == "final sum"
    assert classify_failure(problem, right.replace("Final Answer: 14", "Final Answer: 13")) == "answer line"
