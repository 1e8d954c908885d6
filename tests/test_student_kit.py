"""The course kit cannot rot (ASSIGNMENTS.md): scripts/kit/make_student.py builds the student copy
in tmp_path; there every exercise's tests fail with NotImplementedError, on the reference they all
pass; the copy imports, stops at a missing piece with the exercise's message, and differs from the
reference only inside the marked bodies. `make grade` (scripts/kit/grade.py) runs in both trees, in
subprocesses, and records each test's markers and outcome; its summary is checked by hand too."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import NUM_EXERCISES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts", "kit"))
import grade
import make_student


def run_grade(repo: str, tmp_path, tag: str) -> tuple[dict, subprocess.CompletedProcess]:
    """`python scripts/kit/grade.py --json=...` (what `make grade` runs) in `repo`: every test's
    markers and outcome, and the process (its one line per exercise and total)."""
    report = tmp_path / f"{tag}.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    command = [sys.executable, os.path.join("scripts", "kit", "grade.py"), f"--json={report}"]
    proc = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert report.exists(), \
        f"grade.py in {repo} wrote no report:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(report.read_text()), proc


def by_exercise(record: dict) -> dict[int, list[tuple[str, dict]]]:
    out = {k: [] for k in range(1, NUM_EXERCISES + 1)}
    for nodeid, r in record.items():
        for m in r["markers"]:
            out[int(m.split("_")[1])].append((nodeid, r))
    return out


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    d = tmp_path_factory.mktemp("kit") / "student"
    exercises = make_student.make_student(str(d))
    return d, exercises


def test_every_exercise_is_marked_in_the_code(student):
    _, exercises = student
    assert sorted(exercises) == list(range(1, NUM_EXERCISES + 1)), exercises


def test_copy_differs_only_inside_the_marked_bodies(student):
    d, _ = student
    region = re.compile(r"(# >>> exercise (\d+):[^\n]*\n).*?(\n[ \t]*# <<< exercise \2\n)",
                        re.DOTALL)

    def cut(text: bytes) -> str:
        return region.sub(r"\1\3", text.decode())


    for rel in make_student.tracked_files(ROOT):
        if rel in make_student.LEAVE_OUT:
            assert not (d / rel).exists()
            continue
        with open(os.path.join(ROOT, rel), "rb") as f:
            ref = f.read()
        got = (d / rel).read_bytes()
        if ref != got:
            assert rel.endswith(".py"), rel
            assert cut(ref) == cut(got), f"{rel} differs outside an exercise body"
    assert not (d / ".venv").exists() and not (d / ".git").exists()
    assert not (d / "runs").exists()


def test_copy_imports_and_stops_at_the_missing_piece(student):
    d, _ = student
    code = ("import attention, sample, grpo, eval, rewards, sft, data, model\nimport eval\n"
            "eval.pass_at_k(4, 1, 2)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=d, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode != 0
    assert 'NotImplementedError: Exercise 7: unbiased pass@k; see ASSIGNMENTS.md' in proc.stderr, \
        proc.stderr[-2000:]


def test_exercise_tests_fail_in_the_copy_and_pass_on_the_reference(student, tmp_path):
    """`make grade` (scripts/kit/grade.py) in both trees: 0 of 9 exercises done in the copy, every
    test failing with its NotImplementedError; 9 of 9 on the reference, every test passing."""
    d, _ = student
    copy_record, copy_proc = run_grade(str(d), tmp_path, "student")
    ref_record, ref_proc = run_grade(ROOT, tmp_path, "reference")
    none_done = f"total: 0 of {NUM_EXERCISES} exercises done"
    all_done = f"total: {NUM_EXERCISES} of {NUM_EXERCISES} exercises done"
    assert copy_proc.returncode == 1 and none_done in copy_proc.stdout, copy_proc.stdout[-3000:]
    assert ref_proc.returncode == 0 and all_done in ref_proc.stdout, ref_proc.stdout[-3000:]
    assert ref_proc.stdout.count(": done") == NUM_EXERCISES, ref_proc.stdout
    copy = by_exercise(copy_record)
    ref = by_exercise(ref_record)
    for k in range(1, NUM_EXERCISES + 1):
        assert ref[k], f"exercise {k} has no test on the reference"
        assert sorted(n for n, _ in ref[k]) == sorted(n for n, _ in copy[k]), \
            f"exercise {k}: different tests"
        bad = [(n, r["outcome"], r["text"][-500:]) for n, r in ref[k] if r["outcome"] != "passed"]
        assert not bad, f"exercise {k} fails on the reference: {bad}"
        bad = [(n, r["outcome"], r["text"][-500:]) for n, r in copy[k]
               if r["outcome"] != "failed" or "NotImplementedError" not in r["text"]]
        assert not bad, f"exercise {k}: tests that do not fail with NotImplementedError in the " \
            f"student copy: {bad}"


def test_grade_says_what_to_do_first():
    """grade.grade_lines on a hand-made record: done, not started, waiting for another exercise
    (its NotImplementedError), an ordinary failure, a skip that does not count against it."""
    stopped_by_1 = "E   NotImplementedError: Exercise 1: the format parser; see ASSIGNMENTS.md"
    stopped_by_9 = "E   NotImplementedError: Exercise 9: the sampler; see ASSIGNMENTS.md"
    record = {
        "a": {"markers": ["exercise_7"], "outcome": "passed", "text": ""},
        "b": {"markers": ["exercise_7"], "outcome": "skipped", "text": ""},
        "c": {"markers": ["exercise_9"], "outcome": "failed", "text": stopped_by_9},
        "d": {"markers": ["exercise_9"], "outcome": "failed", "text": "x\n" + stopped_by_1},
        "e": {"markers": ["exercise_9"], "outcome": "passed", "text": ""},
        "tests/test_exercises.py::test_f": {
            "markers": ["exercise_5"], "outcome": "failed",
            "text": ("    assert 1 == 2\nE   AssertionError: A = +1, ratios [1.1]\nE     expected "
                     "loss [-1.1]\nE     got [-1.0]\nE     (NOTES.md)\nE   assert [-1.0] == [-1.1]"
                     "\nE     got [9]")},
    }
    names = {5: "grpo.py: loss", 7: "eval.py: pass@k", 9: "sample.py: the sampler"}
    lines, all_done = grade.grade_lines(record, names, [5, 7, 9])
    assert "\n".join(lines).splitlines() == [
        "exercise 5  grpo.py: loss",
        ("    0/1 tests pass; 1 fail; the first, test_f: AssertionError: A = +1, ratios [1.1]; "
         "expected loss"),
        "      [-1.1]; got [-1.0]",
        "      the whole message: python -m pytest tests/test_exercises.py -m exercise_5",
        "exercise 7  eval.py: pass@k",
        "    2/2 tests pass: done",
        "exercise 9  sample.py: the sampler",
        "    1/3 tests pass; 1 not started (its NotImplementedError); 1 wait for exercise 1 (its",
        "      NotImplementedError: do it first)",
        "total: 1 of 3 exercises done, 3 of 6 tests pass",
    ]
    assert not all_done
    assert grade.grade_lines({"a": record["a"]}, names, [7]) == \
        (["exercise 7  eval.py: pass@k\n    1/1 tests pass: done",
          "total: 1 of 1 exercises done, 1 of 1 tests pass"], True)


# --------------------------------------------------------------------------------------------------
# Bugs a student's solution once carried past the kit, or past a grade line that did not say what
# was wrong (issue 47), planted into a solved copy (the reference bodies are the solutions):
# `python scripts/kit/grade.py k ...` there must fail the exercise and its line must say where and
# what. Each: (what, file, the right code, the bug, the exercises graded,
# {exercise that must fail: (phrases its line must hold, phrases it must not hold)}).
RIGHT_LOGPROB = ('        logprobs = token_logprobs(logits.masked_fill(banned, float("-inf")), '
                 'chosen,\n                                  self.sampling.temperature)')
LOGPROB_AFTER_THE_FILTERS = '''\
        filtered = logits.masked_fill(banned, float("-inf"))
        filtered = filtered / self.sampling.temperature
        if self.sampling.top_k:
            kth = filtered.topk(self.sampling.top_k, dim=-1).values[:, -1:]
            filtered = filtered.masked_fill(filtered < kth, float("-inf"))
        if self.sampling.top_p < 1.0:
            sorted_logits, order = filtered.sort(dim=-1, descending=True)
            probs = sorted_logits.softmax(-1)
            drop = probs.cumsum(-1) - probs > self.sampling.top_p
            filtered = filtered.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
        logprobs = token_logprobs(filtered, chosen)'''
FIX_3_FIRST = "exercise 3 fails its own tests: fix it first"
WHOLE_3 = "the whole message: python -m pytest tests/test_exercises.py -m exercise_3"
PLANTED = [
    ("the hidden block written into every row", "attention.py",
     "allowed[b, r0 + s:r0 + e, hidden] = False", "allowed[:, r0 + s:r0 + e, hidden] = False",
     (3, 9),
     {3: ([("AssertionError: row 0 of a 2-row batch: 12 (query, key) hidden that "
            "this row's blocks do not hide")], []),
      9: ([FIX_3_FIRST, "test_recorded_logprobs_equal_training_forward[", ": sample 0"],
          ["exercise 4"])}),
    ("row 0's prompt length used for every row", "attention.py",
     "n_prompt = prompt_lengths[b]", "n_prompt = prompt_lengths[0]",
     (3, 9),
     {3: ([("AssertionError: row 1 of a 2-row batch: 0 (query, key) hidden that "
            "this row's blocks do not hide, 12 visible that they hide")], []),
      9: ([FIX_3_FIRST], ["exercise 4"])}),
    ("the log-prob recorded after top-k and top-p", "sample.py", RIGHT_LOGPROB,
     LOGPROB_AFTER_THE_FILTERS, (9,),
     {9: (["2 fail; the first, test_recorded_logprobs_are_taken_before_top_k_and_top_p[unseen]",
           ": sample 0", "top_k 10, top_p 0.9)"], ["fix it first"])}),
    ("loss_weights counts a response without loss tokens", "grpo.py",
     "return loss_mask / n.clamp(min=1), float((n > 0).sum())",
     "return loss_mask / n.clamp(min=1), float(n.shape[0])", (6,),
     {6: (["loss_weights (the loss aggregation modes)",
           "the first, test_ex6_weights_and_denominators",
           ("AssertionError: seq-mean-token-mean: expected row-0 weights [0.5, 0.5, 0, 0], "
            "denominator 2; got [0.5, 0.5, 0.0, 0.0], 3.0")], [])}),
    ("pass_at_k without its guard", "eval.py",
     "    if not (1 <= k <= n and 0 <= c <= n):\n", "    if False:\n", (7,),
     {7: (["the first, test_ex7_k_responses_cannot_be_drawn_from_fewer[2-0-5]",
           "pass_at_k(n=2, c=0, k=5): expected a ValueError"], [])}),
    # a student's: the hidden rectangle from the <Parallel> itself (its first line once said only
    # the input; now the count and the first wrong (query, key) in tokens)
    ("the hidden columns start at <Parallel>", "attention.py",
     "hidden = slice(r0 + block.start + 1, r0 + s)", "hidden = slice(r0 + block.start, r0 + s)",
     (3,),
     {3: ([("the first, test_ex3_unseen_mask_hides_exactly_the_sibling_path: AssertionError: 7 "
            "(query, key) hidden that should be seen, 0 seen that should be hidden; the first: "
            "query 5 (<A>) does not see key 4 (<P>)"), WHOLE_3], ["got ["])}),
    ("a bool mask", "attention.py", "    return mask, positions.to(device)\n",
     "    return allowed[:, None], positions.to(device)\n", (3,),
     {3: (["expected an additive mask of shape (1, 1, 19, 19), dtype torch.float32",
           "got shape (1, 1, 19, 19), dtype torch.bool", WHOLE_3], [])}),
    ("a torch error in the student's code", "attention.py",
     "chosen = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)",
     "chosen = logits.gather(-1, tokens)", (4,),
     {4: (["RuntimeError: Index tensor must have the same number of dimensions",
           "(raised at attention.py:", ": chosen = logits.gather(-1, tokens))"], [])}),
]


@pytest.fixture(scope="module")
def solved(tmp_path_factory):
    """A solved student copy: every tracked file as the reference has it (the marked bodies are
    the solutions), without the kit's own test."""
    d = tmp_path_factory.mktemp("kit") / "solved"
    for rel in make_student.tracked_files(ROOT):
        if rel in make_student.LEAVE_OUT or rel.split(os.sep)[0] in make_student.SKIP_DIRS:
            continue
        os.makedirs(d / os.path.dirname(rel), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, rel), d / rel)
    return d


def exercise_block(stdout: str, k: int) -> str:
    """Exercise k's lines of grade.py's output, the wrapping undone (one space between words)."""
    blocks = re.split(r"^(?=exercise \d+ |total: )", stdout, flags=re.MULTILINE)
    mine = [b for b in blocks if b.startswith(f"exercise {k} ")]
    assert len(mine) == 1, stdout
    return " ".join(mine[0].split())


def grade_planted(solved, rel: str, right: str, bug: str, graded) -> subprocess.CompletedProcess:
    """`python scripts/kit/grade.py graded...` in the solved copy with `right` in `rel` replaced
    by `bug` (restored after)."""
    path = solved / rel
    original = path.read_text()
    assert original.count(right) == 1, f"{rel} no longer holds {right!r}: update the test"
    path.write_text(original.replace(right, bug))
    try:
        command = [sys.executable, os.path.join("scripts", "kit", "grade.py"), *map(str, graded)]
        return subprocess.run(command, cwd=solved, env=dict(os.environ, OMP_NUM_THREADS="1"),
                              capture_output=True, text=True, timeout=600, check=False)
    finally:
        path.write_text(original)


@pytest.mark.parametrize("what, rel, right, bug, graded, checks", PLANTED,
                         ids=[p[0] for p in PLANTED])
def test_planted_bugs_are_caught_where_they_are(solved, what, rel, right, bug, graded, checks):
    proc = grade_planted(solved, rel, right, bug, graded)
    assert proc.returncode == 1, \
        f"{what}: grade.py exits {proc.returncode}\n{proc.stdout}\n{proc.stderr[-2000:]}"
    for k, (says, never) in checks.items():
        line = exercise_block(proc.stdout, k)
        assert "tests pass: done" not in line, f"{what}: exercise {k} says done\n{proc.stdout}"
        for phrase in says:
            assert phrase in line, f"{what}: exercise {k}'s line lacks {phrase!r}:\n{line}"
        for phrase in never:
            assert phrase not in line, f"{what}: exercise {k}'s line says {phrase!r}:\n{line}"


def test_a_file_that_does_not_parse_is_named_with_its_line(solved):
    """A student's syntax error: grade.py names the file and the line and says it is theirs (it
    once showed a traceback inside grade.py, File "<unknown>")."""
    right = "    return mask, positions.to(device)\n    # <<< exercise 3"
    line = (solved / "attention.py").read_text().split(right)[0].count("\n") + 1
    proc = grade_planted(solved, "attention.py", right, right.replace("mask,", "mask"), [3])
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr, \
        f"{proc.stdout}\n{proc.stderr}"
    assert proc.stdout.splitlines()[:3] == [
        f"attention.py, line {line}, does not parse (SyntaxError: invalid syntax):",
        "    return mask positions.to(device)",
        "                ^",
    ], proc.stdout
    assert "It is your attention.py that does not parse, not the grader" in proc.stdout


def test_grade_shows_the_kits_message_first_and_what_to_fix_first():
    """grade.grade_lines on a hand-made record: the kit's own failure (tests/test_exercises.py)
    before a project test's bare assert, whatever the order; a pytrace=False failure (the
    sampler's end-to-end test) by its first line; an exercise whose tests go through a failing
    one (grade.NEEDS) says to fix that first."""
    sampler = ("sample 0 (prompt 0), response token 3 'x' in the main chain: recorded log-prob "
               "-1.0, the training forward's -2.0\nIts response: 'x'\nWhere to look. ...")
    record = {
        "tests/test_attention.py::test_a": {"markers": ["exercise_3"], "outcome": "failed",
                                            "text": "    assert x\nE   assert False"},
        "tests/test_exercises.py::test_ex3": {"markers": ["exercise_3"], "outcome": "failed",
                                              "text": "E   AssertionError: row 1 of a 2-row batch"},
        "tests/test_sample.py::test_b[unseen]": {"markers": ["exercise_9"], "outcome": "failed",
                                                 "text": sampler},
    }
    names = {3: "attention.py: the mask", 9: "sample.py: the sampler"}
    lines, all_done = grade.grade_lines(record, names, [3, 9])
    assert "\n".join(lines).splitlines() == [
        "exercise 3  attention.py: the mask",
        "    0/2 tests pass; 2 fail; the first, test_ex3: AssertionError: row 1 of a 2-row batch",
        "      the whole message: python -m pytest tests/test_exercises.py -m exercise_3",
        "exercise 9  sample.py: the sampler",
        ("    0/1 tests pass; exercise 3 fails its own tests: fix it first (these tests go through "
         "its code);"),
        ("      1 fail; the first, test_b[unseen]: sample 0 (prompt 0), response token 3 'x' in "
         "the main"),
        "      chain: recorded log-prob -1.0, the training forward's -2.0",
        "      the whole message: python -m pytest tests/test_sample.py -m exercise_9",
        "total: 0 of 2 exercises done, 0 of 3 tests pass",
    ]
    assert not all_done


def test_grade_names_every_function_of_an_exercise():
    names = grade.exercise_names()
    assert names[6] == ("grpo.py: compute_advantages (group-relative advantages), loss_weights "
                        "(the loss aggregation modes)")
    assert names[9].startswith("sample.py: SlotCache.mask (")
    assert "Engine._close_block (" in names[9]
    assert names[3] == ("attention.py: build_mask_and_positions (the Seen/Unseen attention mask "
                        "and positions)")
