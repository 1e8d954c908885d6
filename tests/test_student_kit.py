"""The course kit cannot rot (ASSIGNMENTS.md): scripts/kit/make_student.py builds the student copy
in tmp_path; there every exercise's tests fail with NotImplementedError, on the reference they all
pass; the copy imports, stops at a missing piece with the exercise's message, and differs from the
reference only inside the marked bodies. `make grade` (scripts/kit/grade.py) runs in both trees, in
subprocesses, and records each test's markers and outcome; its summary is checked by hand too."""

import json
import os
import re
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
        "f": {"markers": ["exercise_5"], "outcome": "failed",
              "text": "    assert 1 == 2\nE   AssertionError: A = +1, ratios [1.1]\nE   more"},
    }
    names = {5: "grpo.py: loss", 7: "eval.py: pass@k", 9: "sample.py: the sampler"}
    lines, all_done = grade.grade_lines(record, names, [5, 7, 9])
    assert "\n".join(lines).splitlines() == [
        "exercise 5  grpo.py: loss",
        "    0/1 tests pass; 1 fail; the first: AssertionError: A = +1, ratios [1.1]",
        "exercise 7  eval.py: pass@k",
        "    2/2 tests pass: done",
        "exercise 9  sample.py: the sampler",
        ("    1/3 tests pass; 1 not started (its NotImplementedError); 1 wait for exercise 1 (its "
         "NotImplementedError: do it first)"),
        "total: 1 of 3 exercises done, 3 of 6 tests pass",
    ]
    assert not all_done
    assert grade.grade_lines({"a": record["a"]}, names, [7]) == \
        (["exercise 7  eval.py: pass@k\n    1/1 tests pass: done",
          "total: 1 of 1 exercises done, 1 of 1 tests pass"], True)
