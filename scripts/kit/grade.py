"""The course kit's grade (ASSIGNMENTS.md): every exercise's tests, one line per exercise, a total.

    make grade                         # or: python scripts/kit/grade.py
    python scripts/kit/grade.py 1 9        # exercises 1 and 9 only
    python scripts/kit/grade.py --json=grade.json      # also every test's outcome, as JSON

Exercise k's tests are the ones marked exercise_k (tests/test_exercises.py and the tests that
tests/conftest.py's EXERCISE_TESTS tags); one pytest session runs them all, quietly. An exercise
not done says how many of its tests stop at its own NotImplementedError (not started), at another
exercise's (do that one first), or fail otherwise (the first line of the first). Exit status 0 when
every exercise asked for passes, else 1. The full failure: python -m pytest -m exercise_k -x tests
"""
import argparse
import json
import os
import re
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # scripts/kit/make_student.py
from make_student import BEGIN, tracked_files

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))   # two folders up
MARKER = re.compile(r"exercise_(\d+)")
MISSING_PIECE = re.compile(r"NotImplementedError: Exercise (\d+)")
REASON_CHARS = 110                      # a failure's first line, cut to this many characters
TEXT_CHARS = 3000                       # the end of a failure's report kept in the JSON


class Recorder:
    """A pytest plugin: each test's exercise markers and outcome (its first failure's report)."""

    def __init__(self):
        self.tests = {}                 # nodeid -> {"markers", "outcome", "text"}

    @pytest.hookimpl(trylast=True)      # after conftest.py has added its markers
    def pytest_collection_modifyitems(self, items):
        for item in items:
            markers = sorted(m.name for m in item.iter_markers() if MARKER.fullmatch(m.name))
            self.tests[item.nodeid] = {"markers": markers, "outcome": "passed", "text": ""}

    def pytest_collectreport(self, report):
        if report.failed:               # a test file that does not import: all its tests fail
            self.tests[report.nodeid] = {"markers": [], "outcome": "failed",
                                         "text": report.longreprtext[-TEXT_CHARS:]}

    def pytest_runtest_logreport(self, report):
        test = self.tests.setdefault(report.nodeid,
                                     {"markers": [], "outcome": "passed", "text": ""})
        if report.outcome != "passed" and test["outcome"] == "passed":
            test["outcome"] = report.outcome
            test["text"] = report.longreprtext[-TEXT_CHARS:]


def exercise_names(root: str = ROOT) -> dict[int, str]:
    """{k: "file: what"} of each exercise's first marked body in the code (# >>> exercise k:)."""
    names = {}
    for rel in tracked_files(root):
        if not rel.endswith(".py") or rel.startswith(("tests", "scripts")):
            continue
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            for line in f:
                begin = BEGIN.match(line)
                if begin:
                    names.setdefault(int(begin[2]), f"{rel}: {begin[3]}")
    return names


def first_line_of_failure(text: str) -> str:
    """The first "E   ..." line of a pytest failure report (else its last line), cut short."""
    lines = text.splitlines() or [""]
    errors = [line[1:].strip() for line in lines if line.startswith("E ")]
    line = lines[-1].strip()
    if errors:
        line = errors[0]
    if len(line) > REASON_CHARS:
        line = line[:REASON_CHARS - 3] + "..."
    return line


def failure_summary(k: int, failed: list[dict]) -> str:
    """Why exercise k's failed tests fail: stopped by its own NotImplementedError (not started),
    by another exercise's (which to do first), or by something else (the first such failure)."""
    waiting = {}                                 # exercise j -> tests stopped by its raise
    other = []
    for test in failed:
        stopped_by = MISSING_PIECE.search(test["text"])
        if stopped_by:
            j = int(stopped_by[1])
            waiting[j] = waiting.get(j, 0) + 1
        else:
            other.append(test)
    parts = []
    if k in waiting:
        parts.append(f"{waiting.pop(k)} not started (its NotImplementedError)")
    for j in sorted(waiting):
        parts.append(f"{waiting[j]} wait for exercise {j} (its NotImplementedError: do it first)")
    if other:
        parts.append(f"{len(other)} fail; the first: {first_line_of_failure(other[0]['text'])}")
    return "; ".join(parts)


def grade_lines(tests: dict, names: dict[int, str], exercises: list[int]) -> tuple[list[str], bool]:
    """One line per exercise (its tests that pass, of all; done, or why the others fail:
    failure_summary) and a total; and whether every exercise in `exercises` is done. A skipped
    test does not count against it; an exercise without a test is not done."""
    lines = []
    done = 0
    passed_tests = 0
    total_tests = 0
    for k in exercises:
        mine = [t for t in tests.values() if f"exercise_{k}" in t["markers"]]
        passed = sum(t["outcome"] != "failed" for t in mine)
        failed = [t for t in mine if t["outcome"] == "failed"]
        passed_tests += passed
        total_tests += len(mine)
        head = f"exercise {k}  {names.get(k, '?')}"
        if mine and not failed:
            done += 1
            lines.append(f"{head}\n    {passed}/{len(mine)} tests pass: done")
            continue
        if not mine:
            lines.append(f"{head}\n    no test is marked exercise_{k}")
            continue
        lines.append(f"{head}\n    {passed}/{len(mine)} tests pass; {failure_summary(k, failed)}")
    broken = [n for n, t in tests.items() if not t["markers"] and t["outcome"] == "failed"]
    for nodeid in broken:                        # a test file that failed to import
        lines.append(f"cannot collect {nodeid}: {first_line_of_failure(tests[nodeid]['text'])}")
    lines.append(f"total: {done} of {len(exercises)} exercises done, {passed_tests} of "
                 f"{total_tests} tests pass")
    return lines, done == len(exercises) and not broken


def run_tests(exercises: list[int], root: str = ROOT) -> dict:
    """Run the tests of `exercises` in this process, quietly; returns the Recorder's record."""
    recorder = Recorder()
    markers = " or ".join(f"exercise_{k}" for k in exercises)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.chdir(root)
    pytest.main(["-p", "no:terminal", "-p", "no:cacheprovider", "-m", markers,
                 os.path.join(root, "tests")], plugins=[recorder])
    return recorder.tests


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("exercises", nargs="*", type=int, help="which (default: all)")
    parser.add_argument("--json", default="", help="also write every test's outcome here")
    args = parser.parse_args(argv)
    names = exercise_names()                     # the exercises: the bodies marked in the code
    exercises = sorted(set(args.exercises)) or sorted(names)
    unknown = [k for k in exercises if k not in names]
    if unknown:
        parser.error(f"no exercise {unknown}: the code marks {sorted(names)}")
    json_path = os.path.abspath(args.json) if args.json else ""
    tests = run_tests(exercises)
    if json_path:
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump(tests, f)
    lines, all_done = grade_lines(tests, names, exercises)
    print("\n".join(lines))
    return 0 if all_done else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
