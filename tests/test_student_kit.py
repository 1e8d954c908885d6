"""The course kit cannot rot (ASSIGNMENTS.md): scripts/make_student.py builds the student copy in
tmp_path; there every exercise's tests fail with NotImplementedError, on the reference they all
pass; the copy imports, stops at a missing piece with the exercise's message, and differs from the
reference only inside the marked bodies. Two pytest subprocesses (the copy, the reference) with all
exercise markers; a small plugin records each test's markers and outcome."""

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import EXERCISE_TESTS, NUM_EXERCISES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import make_student

PLUGIN = '''
import json, os
import pytest
RECORD = {}
@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        markers = [m.name for m in item.iter_markers() if m.name.startswith("exercise_")]
        RECORD[item.nodeid] = {"markers": sorted(markers), "outcome": "passed", "text": ""}
def pytest_runtest_logreport(report):
    r = RECORD.setdefault(report.nodeid, {"markers": [], "outcome": "passed", "text": ""})
    if report.outcome != "passed" and r["outcome"] == "passed":
        r["outcome"], r["text"] = report.outcome, report.longreprtext[-3000:]
def pytest_sessionfinish(session):
    with open(os.environ["KIT_REPORT"], "w") as f:
        json.dump(RECORD, f)
'''
ALL = " or ".join(f"exercise_{k}" for k in range(1, NUM_EXERCISES + 1))
FILES = sorted(f"tests/{f}" for f in EXERCISE_TESTS) + ["tests/test_exercises.py"]


def run_exercise_tests(repo: str, tmp_path, tag: str) -> dict:
    (tmp_path / "plugin").mkdir(exist_ok=True)
    (tmp_path / "plugin" / "kitreport.py").write_text(PLUGIN)
    report = tmp_path / f"{tag}.json"
    env = dict(os.environ, KIT_REPORT=str(report), PYTHONPATH=str(tmp_path / "plugin"),
               OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "kitreport", "-p",
                           "no:cacheprovider", "-m", ALL, *FILES],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert report.exists(), \
        f"pytest in {repo} wrote no report:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(report.read_text())


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
    d, _ = student
    copy, ref = by_exercise(run_exercise_tests(str(d), tmp_path, "student")), \
        by_exercise(run_exercise_tests(ROOT, tmp_path, "reference"))
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
