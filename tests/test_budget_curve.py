"""scripts/studies/budget_curve.py: accuracy within a cap, in tokens and in decode steps,
by hand."""
import json
import os
import subprocess
import sys

from scripts.studies import budget_curve

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUDIES = os.path.join(ROOT, "scripts", "studies")
BUDGET_CURVE = os.path.join(STUDIES, "budget_curve.py")
HARD = "synthetic:hard:test"
PROMPT = "Which two of 1 2 3 4 make 7?\n"


def sample(correct: bool, T: int, D: int, finish_reason: str) -> dict:
    response = "3+4=7 vs 7: ok\nFinal Answer: 3, 4"
    if not correct:
        response = "1+2=3 vs 7: ok\nFinal Answer: 1, 2"         # a false "ok"
    return {"benchmark": HARD, "id": "synthetic:hard:test-0", "prompt": PROMPT,
            "response": response, "correct": correct, "T": T, "D": D,
            "finish_reason": finish_reason, "has_parallel": T != D}


# cost without the final EOS (T, D): (39, 29), (50, 50), (19, 19), (32, 32)
SAMPLES = [sample(True, 40, 30, "eos"), sample(True, 50, 50, "budget"),
           sample(False, 20, 20, "eos"), sample(True, 33, 33, "eos")]


def test_a_response_counts_when_right_and_within_the_cap_without_its_eos():
    expected = {(32, "T"): 25.0, (32, "D"): 50.0, (39, "T"): 50.0, (28, "D"): 0.0,
                (29, "D"): 25.0, (50, "T"): 75.0, (49, "T"): 50.0, (128, "D"): 75.0}
    for (cap, rule), accuracy in expected.items():
        assert budget_curve.accuracy(SAMPLES, "hard", cap, rule) == accuracy, (cap, rule)


def test_the_command_writes_the_table_the_verdict_and_the_plot(tmp_path):
    """Two methods, seeds 3 and 7 (the rows name them). Within 32 decode steps parallel-4 gets
    50% (seed 3: 2 of 4) and 100% (seed 7: 2 of 2) right, the sequential runs 0% (their right
    response needs 39); within 64, 75% and 100% against 50%."""
    sequential = [sample(True, 40, 40, "eos"), sample(False, 20, 20, "eos")]
    runs = {"sequential": [sequential, sequential],
            "parallel-4": [SAMPLES, SAMPLES[:1] + SAMPLES[3:]]}
    for method, seeds in runs.items():
        for seed, samples in zip([3, 7], seeds):
            folder = tmp_path / f"{method}-seed{seed}" / "eval"
            folder.mkdir(parents=True)
            lines = [json.dumps(s) for s in samples]
            (folder / "samples.jsonl").write_text("\n".join(lines) + "\n")
    plot_path = tmp_path / "budget.png"
    out = subprocess.run([sys.executable, BUDGET_CURVE,
                          str(tmp_path), "--seeds=3,7", "--caps=32,64", f"--plot={plot_path}"],
                         capture_output=True, text=True, check=True).stdout
    assert "| hard | decode steps | parallel-4 | 75.0 ±25.0 | 87.5 ±12.5 |" in out
    assert "| hard | tokens | parallel-4 | 37.5 ±12.5 | 87.5 ±12.5 |" in out
    assert "| hard | decode steps | sequential | 0.0 ±0.0 | 50.0 ±0.0 |" in out
    assert "| parallel-4 | 3 | +50.0 | +25.0 |" in out
    assert "| parallel-4 | 7 | +100.0 | +50.0 |" in out
    assert "| parallel-4 | min | +50.0 | +25.0 |" in out
    assert "Target (every seed >= +5 on hard at one decode-step cap): met" in out
    assert "the largest lead every seed holds is +50.0 (at 32 decode steps)" in out
    # one problem, so each interval is its lead: at 48 steps seed 3 50% - 50%, seed 7 100% - 50%
    assert "- parallel-4: seed 3 +0.0 [+0.0, +0.0]; seed 7 +50.0 [+50.0, +50.0]" in out
    assert plot_path.stat().st_size > 0


def test_the_rule_numbers_of_a_block_by_hand():
    """A block of 3 paths (texts of 14, 14 and 16 tokens) and the summary "3, 4": tags 1 + 6 + 1,
    the newline, <Summary>, 4 summary tokens, </Summary> = 15 tokens of overhead; in decode steps
    the longest path's tags only: 15 - 4 = 11. The main chain's answer line is not an attempt."""
    paths = ["1+2=3 vs 7: no", "2+5=7 vs 7: ok", "3+4=7 vs 7: ok 7"]
    response = ("<Parallel>" + "".join(f"<Path>{p}</Path>" for p in paths) + "</Parallel>\n"
                "<Summary>3, 4</Summary>\nFinal Answer: 3, 4")
    parallel = dict(sample(True, 80, 40, "eos"), response=response)
    figures = budget_curve.rule_figures([parallel, sample(True, 31, 31, "eos")])
    # attempts: the three paths and the sequential sample's "3+4=7 vs 7: ok" (14)
    assert figures == {"attempt tokens": (14 + 14 + 16 + 14) / 4, "block overhead tokens": 15,
                       "block overhead decode steps": 11, "attempts per block": 3,
                       "T / D": (80 + 31) / (40 + 31)}
    assert budget_curve.tokens("<Parallel><Path>ab</Path>") == 5


def test_json_rows_make_one_plot_row_per_task_and_print_both_reports(tmp_path):
    for task, benchmark in (("pair", HARD), ("carry", "carry:hard:test")):
        for method in ("sequential", "parallel-4-all"):
            folder = tmp_path / task / f"{method}-seed0" / "eval"
            folder.mkdir(parents=True)
            rows = [dict(s, benchmark=benchmark) for s in SAMPLES]
            (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        budget_curve.main([str(tmp_path / task), "--seeds=0", "--caps=32,64",
                           f"--json={tmp_path / task}.json"])
    saved = json.loads((tmp_path / "carry.json").read_text())
    assert saved["task"] == "carry task" and saved["caps"] == [32, 64] and saved["seeds"] == [0]
    assert saved["methods"]["sequential"]["D"] == [[50.0, 75.0]]       # as by hand above
    assert saved["report"].startswith("## Carry task: accuracy within the budget")
    assert "## carry task: each method's bound" in saved["report"]
    pair_report = json.loads((tmp_path / "pair.json").read_text())["report"]
    assert "bound" not in pair_report and "paired bootstrap" in pair_report
    out = subprocess.run([sys.executable, BUDGET_CURVE,
                          f"--rows={tmp_path / 'pair.json'},{tmp_path / 'carry.json'}",
                          f"--plot={tmp_path / 'budget.png'}"],
                         capture_output=True, text=True, check=True).stdout
    assert out.index("## Pair task: accuracy") < out.index("## Carry task: accuracy")
    assert (tmp_path / "budget.png").stat().st_size > 0


def test_budget_sh_refuses_bad_settings_before_it_trains(tmp_path):
    """Every setting is checked before the first job (hours of training) starts; PY=false makes a
    job that did start fail at once, and OUT is a scratch folder."""
    no_matplotlib = tmp_path / "bin" / "python"       # imports all but matplotlib (make install's)
    no_matplotlib.parent.mkdir()
    no_matplotlib.write_text('#!/usr/bin/env bash\n[[ "$*" != *matplotlib* ]]\n')
    no_matplotlib.chmod(0o755)
    cases = {(("TASKS", "*"),): "unknown task '*' in TASKS",
             (("SEEDS", "0,1,2"),): "give whole numbers separated by spaces",
             (("SEEDS", "0 1 0"),): 'SEEDS="0 1 0" names seed 0 twice',
             (("CAPS", "foo"),): "CAPS=foo: give whole numbers separated by commas",
             (("EVAL_BUDGET", "64"),): "CAPS holds 80: give budgets from 1 to EVAL_BUDGET=64",
             (("CARRY_CAPS", "0,64"),): "CARRY_CAPS holds 0: give budgets from 1 to",
             (("LANES", "0"),): "LANES=0: give the number of jobs at once",
             (("PY", "/no/such/python"),): "no Python at PY=/no/such/python: run make test",
             (): "cannot import torch and transformers: run make install",   # PY=false
             (("PY", str(no_matplotlib)),): "cannot import matplotlib (for the study's figure)",
             (("METHODS", "sequential sequential"),): 'names sequential twice',
             (("TASKS", "pair pair"),): 'TASKS="pair pair" names pair twice',
             (("SEEDS", "007"),): "SEEDS holds '007'",
             (("GRPO_STEPS", "0"),): "GRPO_STEPS=0: give a whole number from 1",
             (("CARRY_BUDGET", "abc"),): "CARRY_BUDGET=abc: give a whole number",
             (("CARRY_OUT", str(tmp_path / "pair")),): "OUT and CARRY_OUT are one folder"}
    for settings, message in cases.items():
        env = dict(os.environ, PY="false", OUT=str(tmp_path / "pair"),
                   CARRY_OUT=str(tmp_path / "carry"))
        env.update(dict(settings))
        out = subprocess.run(["bash", os.path.join(STUDIES, "budget.sh")], env=env,
                             capture_output=True, text=True, timeout=60, check=False)
        assert out.returncode == 2 and message in out.stderr, (settings, out.stderr)
    for script in ("budget.sh", "dynamics.sh"):       # --help would otherwise start the study
        out = subprocess.run(["bash", os.path.join(STUDIES, script), "--help"],
                             env=dict(os.environ, PY="false", OUT=str(tmp_path / "x")),
                             capture_output=True, text=True, timeout=60, check=False)
        assert out.returncode == 2 and "takes no arguments" in out.stderr, out.stderr
    assert os.listdir(tmp_path) == ["bin"]           # nothing was started or created


def test_dynamics_sh_refuses_bad_settings_before_it_trains(tmp_path):
    """scripts/studies/dynamics.sh checks its settings, PAIR_FLAGS with grpo.py's own parser, before
    the first job starts (PY=false would fail a job that did start)."""
    cases = {(("TASKS", "*"),): "unknown task '*' in TASKS",
             (("SEEDS", "0,1"),): "give whole numbers separated by spaces",
             (("SEEDS", "2 2"),): 'SEEDS="2 2" names seed 2 twice',
             (("SEEDS", "1 01"),): "SEEDS holds '01'",
             (("TASKS", "pair pair"),): 'TASKS="pair pair" names pair twice',
             (("LANES", "0"),): "LANES=0: give a whole number from 1",
             (("LANES", ""),): "LANES=: give a whole number from 1",
             (("PAIR_FLAGS", "--seed=3"),): "PAIR_FLAGS sets --seed, which the script sets",
             (("CARRY_TOKENS", "many"),): "CARRY_TOKENS=many: give a whole number",
             (("PAIR_FLAGS", "--kl_coef=x"), ("PY", sys.executable)): "is not a set of grpo.py",
             (("PAIR_FLAGS", "--no_such_flag=1"), ("PY", sys.executable)):
                 "unrecognized arguments: --no_such_flag=1",
             (("PY", "/no/such/python"),): "no Python at PY=/no/such/python: run make test"}
    for settings, message in cases.items():
        env = dict(os.environ, PY="false", OUT=str(tmp_path / "out"))
        env.update(dict(settings))
        out = subprocess.run(["bash", os.path.join(STUDIES, "dynamics.sh")], env=env,
                             capture_output=True, text=True, timeout=120, check=False)
        assert out.returncode == 2 and message in out.stderr, (settings, out.stderr[-500:])
    assert not os.listdir(tmp_path)                   # nothing was started or created
