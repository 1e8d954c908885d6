"""scripts/budget_curve.py: accuracy within a cap, in tokens and in decode steps, by hand."""
import json
import os
import subprocess
import sys

from scripts import budget_curve

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HARD = "synthetic:hard:test"
PROMPT = "Which two of 1 2 3 4 make 7?\n"


def sample(correct: bool, T: int, D: int, finish_reason: str) -> dict:
    response = "3+4=7 vs 7: ok\nFinal Answer: 3, 4"
    if not correct:
        response = "1+2=3 vs 7: ok\nFinal Answer: 1, 2"         # a false "ok"
    return {"benchmark": HARD, "prompt": PROMPT, "response": response, "correct": correct,
            "T": T, "D": D, "finish_reason": finish_reason, "has_parallel": T != D}


# cost without the final EOS (T, D): (39, 29), (50, 50), (19, 19), (32, 32)
SAMPLES = [sample(True, 40, 30, "eos"), sample(True, 50, 50, "budget"),
           sample(False, 20, 20, "eos"), sample(True, 33, 33, "eos")]


def test_a_response_counts_when_right_and_within_the_cap_without_its_eos():
    expected = {(32, "T"): 25.0, (32, "D"): 50.0, (39, "T"): 50.0, (28, "D"): 0.0,
                (29, "D"): 25.0, (50, "T"): 75.0, (49, "T"): 50.0, (128, "D"): 75.0}
    for (cap, rule), accuracy in expected.items():
        assert budget_curve.accuracy(SAMPLES, "hard", cap, rule) == accuracy, (cap, rule)


def test_the_command_writes_the_table_the_verdict_and_the_plot(tmp_path):
    """Two methods, two seeds. Within 32 decode steps parallel-4 gets 50% (seed 0: 2 of 4) and
    100% (seed 1: 2 of 2) right, the sequential runs 0% (their right response needs 39); within 64,
    75% and 100% against 50%."""
    sequential = [sample(True, 40, 40, "eos"), sample(False, 20, 20, "eos")]
    runs = {"sequential": [sequential, sequential],
            "parallel-4": [SAMPLES, SAMPLES[:1] + SAMPLES[3:]]}
    for method, seeds in runs.items():
        for seed, samples in enumerate(seeds):
            folder = tmp_path / f"{method}-seed{seed}" / "eval"
            folder.mkdir(parents=True)
            lines = [json.dumps(s) for s in samples]
            (folder / "samples.jsonl").write_text("\n".join(lines) + "\n")
    plot_path = tmp_path / "budget.png"
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "budget_curve.py"),
                          str(tmp_path), "--seeds=0,1", "--caps=32,64", f"--plot={plot_path}"],
                         capture_output=True, text=True, check=True).stdout
    assert "| hard | decode steps | parallel-4 | 75.0 ±25.0 | 87.5 ±12.5 |" in out
    assert "| hard | tokens | parallel-4 | 37.5 ±12.5 | 87.5 ±12.5 |" in out
    assert "| hard | decode steps | sequential | 0.0 ±0.0 | 50.0 ±0.0 |" in out
    assert "| parallel-4 | min | +50.0 | +25.0 |" in out
    assert "Target (every seed >= +5 on hard at one decode-step cap): met" in out
    assert "the largest lead every seed holds is +50.0 (at 32 decode steps)" in out
    assert plot_path.stat().st_size > 0
