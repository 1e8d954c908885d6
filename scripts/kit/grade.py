"""The course kit's grade (ASSIGNMENTS.md): every exercise's tests, one line per exercise, a total.

    make grade                         # or: python scripts/kit/grade.py
    python scripts/kit/grade.py 1 9        # exercises 1 and 9 only
    python scripts/kit/grade.py --json=grade.json      # also every test's outcome, as JSON

Exercise k's tests are the ones marked exercise_k (tests/test_exercises.py and the tests that
tests/conftest.py's EXERCISE_TESTS tags); one pytest session runs them all, quietly (and those of
the exercises they go through, NEEDS). An exercise not done says how many of its tests stop at its
own NotImplementedError (not started), at another exercise's (do that one first), or fail otherwise
(the first, the kit's own tests first: its message's first line, the expected and actual values,
where the code under test raised it, and the command that shows it whole; and which exercise it
goes through fails its own tests: fix that one first). A student's file that does not parse is
named with its line. Exit status 0 when every exercise asked for passes, else 1.
The full failures: python -m pytest tests/test_exercises.py -m exercise_k (the kit's own first)
"""
import argparse
import ast
import json
import linecache
import os
import re
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # scripts/kit/make_student.py
from make_student import BEGIN, tracked_files

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))   # two folders up
MARKER = re.compile(r"exercise_(\d+)")
MISSING_PIECE = re.compile(r"NotImplementedError: Exercise (\d+)")
REASON_CHARS = 400                      # a failure's first line, cut to this many characters
LINE_CHARS = 100                        # and wrapped at this width
VALUE_CHARS = 160                       # a line that gives an expected/actual value, cut so
VALUE = re.compile(r"^(expected|got)\b.*\S")   # such a line of a message (the kit's way)
FRAME = re.compile(r"^(\S+\.py):(\d+): ")  # a traceback entry's location in a pytest report
TEXT_CHARS = 3000                       # the end of a failure's report kept in the JSON
KIT_TESTS = "tests/test_exercises.py"   # the kit's own tests: their messages are shown first
# Which other exercises an exercise's tests go through (ASSIGNMENTS.md's last column): a failure
# there fails these tests too, so the grade line says to fix that one first.
NEEDS = {3: (1, 2), 8: (1,), 9: (1, 2, 3, 4)}


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
                                         "text": report.longreprtext}

    def pytest_runtest_logreport(self, report):
        test = self.tests.setdefault(report.nodeid,
                                     {"markers": [], "outcome": "passed", "text": ""})
        if report.outcome != "passed" and test["outcome"] == "passed":
            test["outcome"] = report.outcome
            test["text"] = report.longreprtext


def enclosing_function(tree: ast.Module, line: int) -> str:
    """The qualified name (Class.method) of the innermost function around `line`."""
    name = "?"
    todo = [(node, "") for node in tree.body]
    while todo:
        node, prefix = todo.pop()
        if not node.lineno <= line <= node.end_lineno:
            continue
        if isinstance(node, ast.ClassDef):
            todo += [(child, f"{prefix}{node.name}.") for child in node.body]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}{node.name}"
            todo += [(child, f"{name}.") for child in node.body]
    return name


def exercise_names(root: str = ROOT) -> dict[int, str]:
    """{k: "file: function (what), function (what)"} of the bodies marked `# >>> exercise k: what`
    in the code: every function of an exercise, in the order they appear."""
    parts = {}                                   # k -> {file: ["function (what)", ...]}
    for rel in tracked_files(root):
        if not rel.endswith(".py") or rel.startswith(("tests", "scripts")):
            continue
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            text = f.read()
        if "# >>> exercise" not in text:
            continue
        tree = ast.parse(text, filename=rel)     # a SyntaxError names the file: main says so
        for n, line in enumerate(text.splitlines(), 1):
            begin = BEGIN.match(line)
            if begin:
                in_file = parts.setdefault(int(begin[2]), {}).setdefault(rel, [])
                in_file.append(f"{enclosing_function(tree, n)} ({begin[3]})")
    names = {}
    for k, files in parts.items():
        names[k] = "; ".join(f"{rel}: {', '.join(functions)}" for rel, functions in files.items())
    return names


def message_lines(text: str) -> list[str]:
    """The message of a pytest failure report: its first "E ..." line and the E lines indented
    below it (pytest's own explanation, "assert ...", starts back at the first one's indent);
    without E lines, the report's first line (pytest.fail(..., pytrace=False) reports its
    message alone: its first line says where)."""
    lines = [line for line in text.splitlines() if line.strip()] or [""]
    errors = [line[1:] for line in lines if line.startswith("E ")]
    if not errors:
        return [lines[0].strip()]
    indent = len(errors[0]) - len(errors[0].lstrip())
    message = [errors[0].strip()]
    for line in errors[1:]:
        if len(line) - len(line.lstrip()) <= indent:
            break
        message.append(line.strip())
    return message


def cut(text: str, chars: int) -> str:
    """`text` cut to `chars` characters, "..." marking the cut."""
    if len(text) > chars:
        return text[:chars - 3] + "..."
    return text


def failure_reason(text: str, files: tuple[str, ...] = ()) -> str:
    """What a failure report says went wrong, on one line: its message's first line; when that
    gives no expected value, also the message's lines that begin with "expected" or "got" (the
    kit's messages give the values there); and when the error was raised in the code under test,
    not by a test's check, where: the last traceback entry in `files` (the exercise's), with its
    line of code."""
    message = message_lines(text)
    parts = [cut(message[0], REASON_CHARS)]
    if "expected" not in message[0]:
        parts += [cut(line, VALUE_CHARS) for line in message[1:] if VALUE.match(line)]
    reason = "; ".join(parts)
    frames = [FRAME.match(line) for line in text.splitlines()]
    frames = [frame for frame in frames if frame]
    if frames and not frames[-1][1].startswith("tests/"):       # raised outside the tests
        mine = [frame for frame in frames if frame[1] in files]
        if mine:
            path = mine[-1][1]
            line = int(mine[-1][2])
            code = linecache.getline(os.path.join(ROOT, path), line).strip()
            reason += f" (raised at {path}:{line}: {cut(code, VALUE_CHARS)})"
    return reason


def does_not_parse(error: SyntaxError) -> str:
    """The grade's whole output when a student's file does not parse (exercise_names reads the
    marked files): the file, the line and the error, and that it is theirs, not the grader's."""
    code = (error.text or "").rstrip("\n")
    indent = len(code) - len(code.lstrip())
    caret = " " * max((error.offset or 1) - 1 - indent, 0) + "^"
    advice = (f"It is your {error.filename} that does not parse, not the grader: fix that line, "
              f"then grade again (python -c \"import {error.filename.removesuffix('.py')}\" shows "
              f"the same).")
    return (f"{error.filename}, line {error.lineno}, does not parse "
            f"({type(error).__name__}: {error.msg}):\n    {code.strip()}\n    {caret}\n"
            f"{textwrap.fill(advice, LINE_CHARS)}")


def files_of(name: str) -> tuple[str, ...]:
    """The files of an exercise_names entry ("a.py: f (what), g (what); b.py: h (what)")."""
    return tuple(part.split(": ")[0] for part in name.split("; "))


def tests_of(tests: dict, k: int) -> list[dict]:
    """Exercise k's tests (each record with its "nodeid"), the kit's own (KIT_TESTS: hand-worked,
    with a message that says where) first, then the project's tagged ones."""
    mine = [dict(t, nodeid=nodeid) for nodeid, t in tests.items()
            if f"exercise_{k}" in t["markers"]]
    mine.sort(key=lambda t: not t["nodeid"].startswith(KIT_TESTS))
    return mine


def is_done(tests: dict, k: int) -> bool:
    """Whether exercise k has tests in the record and none of them failed."""
    mine = tests_of(tests, k)
    return bool(mine) and all(t["outcome"] != "failed" for t in mine)


def failure_summary(k: int, failed: list[dict], tests: dict,
                    files: tuple[str, ...] = ()) -> tuple[str, str]:
    """Why exercise k's failed tests fail: stopped by its own NotImplementedError (not started),
    by another exercise's (which to do first), or by something else (the first such failure,
    the kit's own first: failure_reason, `files` the exercise's; and, when an exercise these
    tests go through (NEEDS) fails its own tests, that one to fix first). And the command that
    shows that failure whole ("" when none is shown)."""
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
        for j in NEEDS.get(k, ()):
            if j not in waiting and tests_of(tests, j) and not is_done(tests, j):
                parts.append(f"exercise {j} fails its own tests: fix it first (these tests go "
                             "through its code)")
        first = other[0]
        test_name = first["nodeid"].split("::")[-1]
        parts.append(f"{len(other)} fail; the first, {test_name}: "
                     f"{failure_reason(first['text'], files)}")
        command = f"python -m pytest {first['nodeid'].split('::')[0]} -m exercise_{k}"
        return "; ".join(parts), command
    return "; ".join(parts), ""


def grade_lines(tests: dict, names: dict[int, str], exercises: list[int]) -> tuple[list[str], bool]:
    """One line per exercise (its tests that pass, of all; done, or why the others fail:
    failure_summary, then the command that shows it whole), wrapped at LINE_CHARS, and a total;
    and whether every exercise in `exercises` is done. A skipped test does not count against
    it; an exercise without a test is not done. `tests` may hold other exercises' tests too
    (those of NEEDS)."""
    lines = []
    done = 0
    passed_tests = 0
    total_tests = 0
    for k in exercises:
        mine = tests_of(tests, k)
        passed = sum(t["outcome"] != "failed" for t in mine)
        failed = [t for t in mine if t["outcome"] == "failed"]
        passed_tests += passed
        total_tests += len(mine)
        head = f"exercise {k}  {names.get(k, '?')}"
        command = ""
        if mine and not failed:
            done += 1
            status = f"{passed}/{len(mine)} tests pass: done"
        elif not mine:
            status = f"no test is marked exercise_{k}"
        else:
            summary, command = failure_summary(k, failed, tests, files_of(names.get(k, "?")))
            status = f"{passed}/{len(mine)} tests pass; {summary}"
        head = textwrap.fill(head, LINE_CHARS, subsequent_indent=" " * 12,
                             break_on_hyphens=False)
        status = textwrap.fill(status, LINE_CHARS, initial_indent="    ",
                               subsequent_indent="      ", break_on_hyphens=False)
        if command:                              # unwrapped: to copy as it is
            status += f"\n      the whole message: {command}"
        lines.append(f"{head}\n{status}")
    broken = [n for n, t in tests.items() if not t["markers"] and t["outcome"] == "failed"]
    for nodeid in broken:                        # a test file that failed to import
        lines.append(f"cannot collect {nodeid}: {failure_reason(tests[nodeid]['text'])}")
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
    try:
        names = exercise_names()                 # the exercises: the bodies marked in the code
    except SyntaxError as error:
        print(does_not_parse(error))
        return 1
    exercises = sorted(set(args.exercises)) or sorted(names)
    unknown = [k for k in exercises if k not in names]
    if unknown:
        parser.error(f"no exercise {unknown}: the code marks {sorted(names)}")
    json_path = os.path.abspath(args.json) if args.json else ""
    needed = {j for k in exercises for j in NEEDS.get(k, ()) if j in names}
    tests = run_tests(sorted(needed | set(exercises)))     # NEEDS: to say which to fix first
    if json_path:
        ends = {nodeid: dict(test, text=test["text"][-TEXT_CHARS:])
                for nodeid, test in tests.items()}
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump(ends, f)
    lines, all_done = grade_lines(tests, names, exercises)
    print("\n".join(lines))
    return 0 if all_done else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
