"""The tools in scripts/: training curves, the table of several evaluations, the reward benchmark's
batch, the data viewer, the mask example."""
import json
import os
import subprocess
import sys
import time

import pytest

from scripts.bench import bench_rewards
from scripts.look import failures, plot, show_data, summary
from scripts.studies import table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Seconds a script may take to answer --help, all of them at once on a loaded 2-core machine (~30 s
# there unloaded): only a hang should reach it.
HELP_TIMEOUT = 600


def run_script(name, *args):
    """Run scripts/<name> (name as "look/plot.py") from the repository; its stdout."""
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", name), *args],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_every_script_answers_help_and_does_nothing_else(tmp_path):
    """`--help` prints the usage and exits 0 without running: bench_sample.py once ran its 6-minute
    benchmark, summary/failures/seeds_table read "--help" as a path, show_mask/plot_s1_s2 exited 1.
    All run at once, each a sub-folder's (scripts/README.md: none lies loose in scripts/)."""
    scripts = os.path.join(ROOT, "scripts")
    loose = [n for n in os.listdir(scripts) if n.endswith((".py", ".sh"))]
    assert not loose, f"{loose} lie loose in scripts/: move each into its purpose's sub-folder"
    names = sorted(os.path.join(folder, n) for folder in os.listdir(scripts)
                   if os.path.isdir(os.path.join(scripts, folder))
                   for n in os.listdir(os.path.join(scripts, folder))
                   if n.endswith(".py") and n != "__init__.py")
    assert len(names) >= 20, names   # the walk found the sub-folders
    procs = {n: subprocess.Popen([sys.executable, os.path.join(scripts, n), "--help"],
                                 cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
             for n in names}
    try:
        for n, p in procs.items():
            out, err = p.communicate(timeout=HELP_TIMEOUT)
            with open(os.path.join(scripts, n)) as f:
                doc = f.read().split('"""')[1]                           # the module docstring
            assert p.returncode == 0 and out.startswith(("usage:", doc[:40])), (n, out[:200], err)
    finally:
        for p in procs.values():
            p.kill()
    assert os.listdir(tmp_path) == []                 # nothing written


# --------------------------------------------------------------------------------------------------
# Training curves


def _write_log(run_dir):
    rows = [{"step": s, "reward_mean": -1 + s / 5, "accuracy": s / 10, "parallel_ratio": 1 - s / 10,
             "parallel_position": None if s == 2 else s / 12} for s in range(1, 7)]
    rows.append({"step": 6, "eval/synthetic:hard:test/mean_at_k": 0.4,
                 "eval/synthetic:hard:test/parallel_ratio": 0.5})
    with open(os.path.join(run_dir, "log.jsonl"), "w") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")


def test_summary_shows_before_and_after(tmp_path):
    rows = [{"step": 0, "eval/avg_mean_at_k": 0.25, "eval/hard/mean_at_k": 0.25,
             "eval/hard/parallel_ratio": 0.5},
            {"step": 1, "reward_mean": 0.1, "loss": 0.3},
            {"step": 1, "eval/avg_mean_at_k": 0.5, "eval/hard/mean_at_k": 0.5,
             "eval/hard/parallel_ratio": 1.0}]
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = run_script("look/summary.py", str(tmp_path))
    assert "1 steps logged" in out and "hard/mean_at_k" in out and "25.0" in out and "100.0" in out
    (tmp_path / "log.jsonl").write_text(json.dumps({"step": 1, "loss": 2.0}) + "\n"
                                        + json.dumps({"step": 2, "loss": 1.0}) + "\n")
    assert "final loss 1.0000 (the last step's; the mean of the last 2 steps 1.5000)" in \
        summary.summary(str(tmp_path))
    # the demo's GRPO: --eval_data=, no evals
    (tmp_path / "log.jsonl").write_text(json.dumps(rows[1]) + "\n")
    # was silent
    assert "no held-out evaluation before and after in this log" in summary.summary(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no log.jsonl"):
        summary.summary(str(tmp_path / "nope"))
    # a run killed mid-line
    (tmp_path / "log.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo\n')
    with pytest.raises(ValueError, match="log.jsonl line 2 is not JSON"):
        summary.summary(str(tmp_path))


def test_plot_writes_a_png_from_a_partial_log(tmp_path):
    pytest.importorskip("matplotlib", reason="optional: pip install -r requirements-extra.txt")
    _write_log(tmp_path)
    run_script("look/plot.py", str(tmp_path))
    with open(tmp_path / "curves.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    # no plotted key at all
    (tmp_path / "log.jsonl").write_text(json.dumps({"step": 1, "loss": 2.0}) + "\n")
    assert plot.plot_curves(str(tmp_path), out=str(tmp_path / "empty.png")).endswith("empty.png")
    # once a flat line at the first point, and a traceback
    for args, msg in [(["--smooth=0"], "--smooth=0.0: the weight of the newest point"),
                      (["--out=x.txt"], "plot.py: error: Format 'txt' is not supported")]:
        command = [sys.executable, os.path.join(ROOT, "scripts", "look", "plot.py"), str(tmp_path),
                   *args]
        out = subprocess.run(command, capture_output=True, text=True, check=False)
        assert out.returncode != 0 and msg in out.stderr, out.stderr
        assert "Traceback" not in out.stderr, out.stderr


def test_plot_without_matplotlib_says_how_to_install(tmp_path, monkeypatch):
    _write_log(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)          # import matplotlib -> ImportError
    with pytest.raises(SystemExit, match="pip install matplotlib"):
        plot.plot_curves(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no log.jsonl"):
        plot.plot_curves(str(tmp_path / "missing"))


# --------------------------------------------------------------------------------------------------
# The table of several evaluations


def _summary(folder, name, mean):
    os.makedirs(folder)
    bench = {"k": 2, "mean_at_k": mean, "pass_at_k": 0.5, "parallel_ratio": 0.25,
             "num_responses": 8}
    with open(os.path.join(folder, "summary.json"), "w") as f:
        json.dump({"name": name, "benchmarks": {"synthetic:hard:test": bench}}, f)


def test_table_has_a_row_per_evaluation(tmp_path):
    _summary(tmp_path / "a", "SFT", 0.25)
    _summary(tmp_path / "b", "GRPO", 0.5)
    out = run_script("studies/table.py", f"{tmp_path / 'a'},{tmp_path / 'b'}",
                     f"--out_dir={tmp_path / 'res'}")
    lines = out.strip().splitlines()
    assert lines[0] == ("| Method | Parallel % | synthetic:hard:test Mean@2 | synthetic:hard:test "
                        "Pass@2 | Avg |")
    assert lines[2:] == ["| SFT | 25.0 | 25.0 | 50.0 | 25.0 |",
                         "| GRPO | 25.0 | 50.0 | 50.0 | 50.0 |"]
    assert (tmp_path / "res" / "results.md").read_text().strip() == out.strip()
    with pytest.raises(FileNotFoundError, match="run `python eval.py"):
        table.combine_tables([str(tmp_path / "missing")])
    # a second run of one name once replaced the first row silently
    _summary(tmp_path / "c", "SFT", 0.75)
    rows = table.combine_tables([str(tmp_path / "a"), str(tmp_path / "c")]).splitlines()[2:]
    assert rows == ["| SFT | 25.0 | 25.0 | 50.0 | 25.0 |",
                    f"| SFT ({tmp_path / 'c'}) | 25.0 | 75.0 | 50.0 | 75.0 |"]
    with pytest.raises(ValueError, match="is a file: name a folder"):
        table.combine_tables([str(tmp_path / "a")], out_dir=str(tmp_path / "a" / "summary.json"))
    table_py = os.path.join(ROOT, "scripts", "studies", "table.py")
    out = subprocess.run([sys.executable, table_py, ""],
                         capture_output=True, text=True, check=False)
    # once an empty table, exit 0
    assert out.returncode == 2 and "no evaluation folder" in out.stderr


def test_failures_classes_by_hand(tmp_path):
    """One hand-made wrong response per class of "Which two of 6 1 5 3 make 8?" (the pair 5, 3)."""
    p = "Which two of 6 1 5 3 make 8?"
    cases = {"cut by the budget": "6+1=7 vs 8: no\n5+3",
             "false ok": "6+1=7 vs 8: ok\nFinal Answer: 6, 1",
             "missed ok": "5+3=8 vs 8: no\nFinal Answer: 6, 1",
             "wrong sum": "6+1=8 vs 8: no\nFinal Answer: 6, 1",
             "number not in the list": "6+2=8 vs 8: ok\nFinal Answer: 6, 2",
             "answer is not the checked pair": "5+3=8 vs 8: ok\nFinal Answer: 6, 1",
             "other": "5+3=8 vs 8: ok\nFinal Answer: 5, 3</Path>"}  # wrong by the reward: malformed
    assert {k: failures.classify(p, r, False) for k, r in cases.items()} == {k: k for k in cases}
    assert failures.classify(p, "anything", True) == "right"
    rows = [{"benchmark": "synthetic:hard:test", "prompt": p, "response": r, "correct": False}
            for r in cases.values()]
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert failures.table(str(tmp_path)) == [f"{tmp_path / 'samples.jsonl'} synthetic:hard:test "
                                             "(7 samples): "
                                             + ", ".join(f"{k} 14.3%" for k in cases)]
    (tmp_path / "samples.jsonl").write_text("")       # once a blank line
    with pytest.raises(ValueError, match="holds no samples"):
        failures.table(str(tmp_path))


# --------------------------------------------------------------------------------------------------
# The reward benchmark's batch


def test_bench_rewards_batch_is_mixed_and_sized():
    responses, golds = bench_rewards._bench_batch(bench_rewards.BenchConfig(n=200, seed=1))
    assert len(responses) == len(golds) == 200
    assert sum("<Parallel>" in r for r in responses) > 50
    assert sum("__import__" in r for r in responses) > 0
    # groups of 8 share a gold
    assert len(set(golds)) > 10 and all(g == golds[i - i % 8] for i, g in enumerate(golds))


def test_show_data(capsys):
    show_data.main(["--show", "synthetic:hard", "--n=1", "--limit=20"])
    out = capsys.readouterr().out
    assert out.startswith("--- synthetic:hard-0") and "Final Answer:" in out and "20 records" in out
    # the tiny preset's prompt (what the embedded runs train on) is the bare problem
    assert out.split("\n")[1].startswith("Which two of ")
    show_data.main(["--show", "synthetic:hard", "--n=1", "--limit=20", "--preset=paper"])
    assert "Final Answer: <answer>" in capsys.readouterr().out      # the paper's instruction
    for bad in ("--n=-1", "--limit=-1"):
        with pytest.raises(ValueError, match=f"^{bad}: must be at least 0$"):
            show_data.main(["--show", "synthetic:hard", bad])


def test_show_data_shows_a_files_worked_solutions(tmp_path, capsys):
    """GSM8K's and MATH's records showed "(no solution)", though the files hold worked solutions
    (not traces to train on): show_data prints the file's own; DAPO-like rows have none."""
    gsm8k = "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\n#### 9"
    math = "The sum is $1 + 2 = \\boxed{3}$."
    rows = [{"question": "How many eggs does Janet sell?", "answer": gsm8k},
            {"problem": "What is 1 + 2?", "solution": math, "answer": "3"},
            {"problem": "What is 2 + 2?", "answer": "4"}]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    show_data.main(["--show", str(data), "--n=3"])
    out = capsys.readouterr().out
    shown = "(no trace to train on; the file's solution:)"
    assert f"How many eggs does Janet sell?\n{shown}\n{gsm8k}\n" in out
    assert f"What is 1 + 2?\n{shown}\n{math}\n" in out
    assert "What is 2 + 2?\n(no solution in the file)\n" in out


def test_show_mask_prints_the_worked_example():
    out = run_script("look/show_mask.py")
    assert (" unseen positions:    0    1    2    3    4    5    6    7    8    5    6    7    9"
            in out)
    assert "parse_structure: valid=True" in out


# --------------------------------------------------------------------------------------------------
# What RL does with the choice (scripts/studies/dynamics.py)


def _write_run(folder, ratios, accuracies):
    os.makedirs(os.path.join(folder, "grpo"))
    rows = [{"step": s + 1, "parallel_ratio": r, "accuracy": a}
            for s, (r, a) in enumerate(zip(ratios, accuracies))]
    rows.append({"step": len(ratios), "eval/synthetic:hard:test/mean_at_k": 0.4})   # skipped
    with open(os.path.join(folder, "grpo", "log.jsonl"), "w") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + "\n")


def _write_eval(folder, shares, avg):
    os.makedirs(folder)
    parts = {f"part{i}": {"parallel_ratio": share} for i, share in enumerate(shares)}
    with open(os.path.join(folder, "summary.json"), "w") as f:
        json.dump({"benchmarks": parts, "avg_mean_at_k": avg}, f)


def test_dynamics_table_and_targets_by_hand(tmp_path):
    """Seed 0: S1 falls from 80% to 30% held-out (-50), S2 ends at 70% (+40 over S1); S1's training
    accuracy dips to a 10-step mean of 0.3 against a start of 0.8 (0.375: a crash); S2 keeps 0.8.
    Carry, decode steps: 50% -> 60% (+10: under the 15 points); in tokens: not run. The numbers are
    worked out here."""
    from scripts.studies import dynamics
    steps = 20
    s1_ratio = [0.8] * 10 + [0.3] * 10
    s1_accuracy = [0.8] * 10 + [0.3] * 10                # last 10-step mean 0.3, start 0.8
    _write_eval(tmp_path / "pair-seed0" / "eval-sft", [0.7, 0.9], 0.60)    # share 80%, acc 60
    _write_run(tmp_path / "pair-seed0" / "s1", s1_ratio, s1_accuracy)
    _write_eval(tmp_path / "pair-seed0" / "s1" / "eval", [0.2, 0.4], 0.65)  # 30%, 65
    _write_run(tmp_path / "pair-seed0" / "s2", [0.75] * steps, [0.8] * steps)
    _write_eval(tmp_path / "pair-seed0" / "s2" / "eval", [0.7, 0.7], 0.55)  # 70%, 55
    _write_eval(tmp_path / "carry-seed0" / "eval-sft-steps", [0.5], 0.20)
    _write_run(tmp_path / "carry-seed0" / "steps", [0.5] * steps, [0.2] * steps)
    _write_eval(tmp_path / "carry-seed0" / "steps" / "eval", [0.6], 0.25)
    runs = dynamics.collect(str(tmp_path), [0, 1])       # seed 1 has nothing: left out
    assert [len(runs[key]) for key in dynamics.SETTINGS] == [1, 1, 1, 0]
    s1 = runs[("pair", "s1")][0]
    assert s1["sft_share"] == pytest.approx(80.0) and s1["share"] == pytest.approx(30.0)
    assert s1["train_first"] == pytest.approx(80.0) and s1["train_last"] == pytest.approx(30.0)
    assert s1["lowest_accuracy"] == pytest.approx(0.3 / 0.8)
    text = dynamics.report(runs, [0, 1])
    assert "| pair | Unseen S1 (accuracy reward) | 0 | 80.0% | 30.0% | -50.0 | 80.0% -> 30.0% | " \
           "30.0% (20) | 60.0 | 65.0 | 0.37 |" in text
    assert "S1 raises the block share by >= 15 points over its SFT's: seeds none of 0" in text
    assert "S1 ends >= 15 points below its SFT's share: seeds 0 of 0" in text
    assert "S2 ends >= 15 points above S1: seeds 0 of 0" in text
    assert "S1 never crashes (training accuracy never below half its start): seeds none of 0" \
        in text
    assert "S2 never crashes: seeds 0 of 0" in text
    assert "Unseen S2 (alternating, parallel reward): accuracy not below its SFT's: seeds none" \
        in text
    assert "No target (what the token rule does to the choice):\n- carry, S1, budget in tokens: " \
           "accuracy not below its SFT's: not run" in text
    assert "Not finished (no evaluation yet):\n- pair, Unseen S1 (accuracy reward): seeds 1\n" \
        in text
    out = run_script("studies/dynamics.py", str(tmp_path), "--seeds=0,1",
                     f"--md={tmp_path / 't.md'}")
    assert text in out and (tmp_path / "t.md").read_text().endswith(text + "\n")


def test_dynamics_reads_a_run_that_starts_at_zero_and_waits_for_an_empty_log(tmp_path):
    """A run whose training accuracy starts (and stays) at 0 has no crash to report ("-"), and
    one whose log.jsonl is still empty counts as not finished. --tasks=carry reads only carry:
    the pair task is not listed as unfinished."""
    _write_eval(tmp_path / "carry-seed0" / "eval-sft-steps", [0.5], 0.0)
    _write_run(tmp_path / "carry-seed0" / "steps", [0.5] * 12, [0.0] * 12)
    _write_eval(tmp_path / "carry-seed0" / "steps" / "eval", [0.7], 0.0)
    _write_eval(tmp_path / "carry-seed0" / "eval-sft-tokens", [0.5], 0.0)
    _write_run(tmp_path / "carry-seed0" / "tokens", [], [])
    (tmp_path / "carry-seed0" / "tokens" / "grpo" / "log.jsonl").write_text("")
    _write_eval(tmp_path / "carry-seed0" / "tokens" / "eval", [0.4], 0.0)
    out = run_script("studies/dynamics.py", str(tmp_path), "--seeds=0", "--tasks=carry")
    assert "| carry | S1, budget in decode steps | 0 | 50.0% | 70.0% | +20.0 | 50.0% -> 50.0% " \
           "| 50.0% (1) | 0.0 | 0.0 | - (starts at 0) |" in out
    assert "Not finished (no evaluation yet):\n- carry, S1, budget in tokens: seeds 0" in out
    assert "pair, Unseen S1 (accuracy reward): seeds 0" not in out


FAKE_PY = r"""#!/usr/bin/env bash
# A stand-in for python: logs its arguments, makes the output each step is checked by.
echo "$*" >> "$CALLS"
case "$1" in
  -c|scripts/studies/dynamics.py|scripts/studies/budget_curve.py) exit 0 ;;
  scripts/studies/seeds_table.py)          # its folders must exist (a path split at a space)
    for arg in "${@:2}"; do
      [[ $arg == --out=* ]] && echo "| table |" > "${arg#--out=}" && continue
      [ -d "$arg" ] || { echo "stand-in python: no folder $arg" >&2; exit 4; }
    done
    exit 0 ;;
  scripts/look/plot_s1_s2.py|scripts/look/plot.py) exit 0 ;;
  scripts/studies/choice.py) exit 0 ;;
esac
for arg in "$@"; do
  case $arg in
    --out_dir=*) out=${arg#--out_dir=} ;;
    --max_steps=*) steps=${arg#--max_steps=} ;;
  esac
done
if [ -z "$out" ]; then
  echo "stand-in python: no --out_dir in: $*" >&2
  exit 3
elif [ "$1" = eval.py ]; then
  mkdir -p "$out" && echo '{}' > "$out/summary.json"
else
  mkdir -p "$out/checkpoint-$steps" && touch "$out/checkpoint-$steps/trainer_state.pt"
fi
"""


def _stand_in_python(tmp_path):
    """FAKE_PY as tmp_path/python, and the file it logs its calls to."""
    fake = tmp_path / "python"
    fake.write_text(FAKE_PY)
    fake.chmod(0o755)
    return fake, tmp_path / "calls.txt"


def test_dynamics_sh_refuses_a_changed_setting_and_resumes_a_stopped_training(tmp_path):
    """With a stand-in python: a rerun with another CARRY_STEPS into the same OUT is refused (the
    folder keeps the command that made it), not mixed with the earlier run; a training stopped
    at a checkpoint is continued with --resume=True; the job log is appended to, not wiped."""
    fake, calls = _stand_in_python(tmp_path)
    out = tmp_path / "out"
    env = dict(os.environ, PY=str(fake), CALLS=str(calls), OUT=str(out), TASKS="carry",
               SEEDS="0", LANES="1", CARRY_SFT_DIR=str(tmp_path / "sft"))
    script = os.path.join(ROOT, "scripts", "studies", "dynamics.sh")

    def run(**settings):
        return subprocess.run(["bash", script], env=dict(env, **settings), capture_output=True,
                              text=True, timeout=120, check=False)

    first = run()
    assert first.returncode == 0, first.stdout + first.stderr
    grpo_calls = [c for c in calls.read_text().splitlines() if c.startswith("grpo.py")]
    assert len(grpo_calls) == 2 and "--max_new_tokens=104" in grpo_calls[0]
    log = out / "carry-seed0.log"
    first_log = log.read_text()

    changed = run(CARRY_STEPS="128")
    assert changed.returncode == 1
    assert "eval-sft-steps was made by another command" in log.read_text()
    assert log.read_text().startswith(first_log)                      # appended
    assert len([c for c in calls.read_text().splitlines() if c.startswith("grpo.py")]) == 2

    grpo = out / "carry-seed0" / "tokens" / "grpo"
    (grpo / "checkpoint-100" / "trainer_state.pt").unlink()
    (grpo / "checkpoint-100").rmdir()
    (grpo / "checkpoint-50").mkdir()
    (grpo / "checkpoint-50" / "trainer_state.pt").touch()
    (out / "carry-seed0" / "tokens" / "eval" / "summary.json").unlink()
    resumed = run()
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    last = [c for c in calls.read_text().splitlines() if c.startswith(("grpo.py", "eval.py"))]
    assert "--max_new_tokens=256" in last[-2] and last[-2].endswith(" --resume=True")
    assert last[-1].startswith("eval.py") and "--resume" not in last[-1]


def test_budget_sh_refuses_a_changed_setting_and_appends_its_logs(tmp_path):
    """budget.sh runs its steps through the same scripts/studies/jobs.sh: with a stand-in python, a
    rerun with another CARRY_BUDGET into the same CARRY_OUT is refused at the first step it changes
    (the sequential chain's GRPO), and the chain's log keeps the first run's lines."""
    fake, calls = _stand_in_python(tmp_path)
    out = tmp_path / "carry"
    env = dict(os.environ, PY=str(fake), CALLS=str(calls), CARRY_OUT=str(out), TASKS="carry",
               SEEDS="0", LANES="1")
    script = os.path.join(ROOT, "scripts", "studies", "budget.sh")
    first = subprocess.run(["bash", script], env=env, capture_output=True, text=True,
                           timeout=120, check=False)
    assert first.returncode == 0, first.stdout + first.stderr
    trained = [c for c in calls.read_text().splitlines() if c.startswith(("sft.py", "grpo.py"))]
    assert len(trained) == 3                 # the SFT, then each method's GRPO
    log = out / "sequential-seed0.log"
    first_log = log.read_text()
    moved = tmp_path / "bin" / "python"                 # the same python at another path
    moved.parent.mkdir()
    moved.write_text(FAKE_PY)
    moved.chmod(0o755)
    again = subprocess.run(["bash", script], env=dict(env, PY=str(moved)), capture_output=True,
                           text=True, timeout=120, check=False)
    assert again.returncode == 0, again.stdout + again.stderr   # every step found done
    first_log = log.read_text()
    changed = subprocess.run(["bash", script], env=dict(env, CARRY_BUDGET="96"),
                             capture_output=True, text=True, timeout=120, check=False)
    assert changed.returncode == 1
    assert log.read_text().startswith(first_log)
    assert "sequential-seed0/grpo was made by another command" in log.read_text()
    assert len([c for c in calls.read_text().splitlines() if c.startswith("grpo.py")]) == 2
    # moved aside as the message says, the GRPO is trained again and its old evaluation is stale
    aside = tmp_path / "aside"
    aside.mkdir()
    for name in ("grpo", "grpo.command"):
        (out / "sequential-seed0" / name).rename(aside / name)
    moved_aside = subprocess.run(["bash", script], env=dict(env, CARRY_BUDGET="96"),
                                 capture_output=True, text=True, timeout=120, check=False)
    assert moved_aside.returncode == 1
    assert "sequential-seed0/eval is stale" in log.read_text()
    assert len([c for c in calls.read_text().splitlines() if c.startswith("grpo.py")]) == 3


def test_stopping_the_script_stops_its_jobs(tmp_path):
    """Killing dynamics.sh (scripts/studies/jobs.sh's run_lanes) stops the job it started: with
    xargs alone the training would go on, orphaned."""
    import signal
    import time
    fake = tmp_path / "python"
    fake.write_text('#!/usr/bin/env bash\ncase "$1" in -c) exit 0 ;; esac\n'
                    'echo $$ > "$PID_FILE"\nexec sleep 600\n')
    fake.chmod(0o755)
    pid_file = tmp_path / "job.pid"
    env = dict(os.environ, PY=str(fake), PID_FILE=str(pid_file), OUT=str(tmp_path / "out"),
               CARRY_SFT_DIR=str(tmp_path / "sft"), TASKS="carry", SEEDS="0", LANES="1")
    dynamics_sh = os.path.join(ROOT, "scripts", "studies", "dynamics.sh")
    script = subprocess.Popen(["bash", dynamics_sh], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(600):                      # up to 60 s for the job to start
        if pid_file.exists() and pid_file.read_text().strip():
            break
        time.sleep(0.1)
    job = int(pid_file.read_text())
    script.send_signal(signal.SIGTERM)
    _, stderr = script.communicate(timeout=60)
    assert script.returncode == 143 and "stopped; waiting for the jobs to save" in stderr
    for _ in range(300):                      # up to 30 s for the job to go
        if not os.path.exists(f"/proc/{job}"):
            break
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{job}"), "the job outlived the script"


def test_dynamics_signal_means_skip_steps_without_a_gap_and_the_plot_shows_them(tmp_path):
    """moving_mean_present by hand (WINDOW 10): values 1, None, 3 -> 1, 1, 2; all None -> NaN.
    A run whose log holds the signal (mixed_groups, block_accuracy_gap) gets a third panel."""
    import math

    from scripts.studies import dynamics
    assert dynamics.moving_mean_present([1.0, None, 3.0]) == [1.0, 1.0, 2.0]
    assert math.isnan(dynamics.moving_mean_present([None])[0])
    pytest.importorskip("matplotlib")
    _write_eval(tmp_path / "pair-seed0" / "eval-sft", [0.8], 0.6)
    folder = tmp_path / "pair-seed0" / "s1"
    _write_run(folder, [0.5] * 4, [0.5] * 4)
    rows = [{"step": s, "parallel_ratio": 0.5, "accuracy": 0.5, "mixed_groups": 0.25,
             "block_accuracy_gap": None if s == 2 else -0.1} for s in range(1, 5)]
    (folder / "grpo" / "log.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    _write_eval(folder / "eval", [0.3], 0.7)
    runs = dynamics.collect(str(tmp_path), [0], ("pair",))
    assert runs[("pair", "s1")][0]["gap"] == [-0.1, None, -0.1, -0.1]
    import matplotlib.pyplot as plt
    dynamics.plot(runs, str(tmp_path / "d.png"))
    figure = plt.gcf()
    assert len(figure.axes) == 3 and len(figure.axes[2].lines) == 3   # mixed, gap, the zero line


def test_seeds_table_gives_each_cell_its_t_interval_across_seeds(tmp_path):
    """Three seeds of one method, hard Mean@8 0.5 / 0.6 / 0.7: the mean 60.0, the sample standard
    deviation 10, the t quantile 4.303 (2 degrees of freedom): 60.0 -/+ 4.303 * 10 / sqrt(3) =
    24.84, so [35.2, 84.8]. One seed of another method: its value alone."""
    folders = []
    for seed, (accuracy, name) in enumerate([(0.5, "A"), (0.6, "A"), (0.7, "A"), (0.25, "B")]):
        folder = tmp_path / f"eval_{seed}"
        folder.mkdir()
        bench = {"parallel_ratio": 0.5, "mean_at_k": accuracy, "k": 8, "mean_T": 40.0,
                 "mean_D": 30.0}
        summary = {"name": name, "benchmarks": {"hard": bench}, "avg_mean_at_k": accuracy}
        (folder / "summary.json").write_text(json.dumps(summary))
        folders.append(str(folder))
    out = run_script("studies/seeds_table.py", *folders)
    assert "| A | 3 | 50.0 [50.0, 50.0] | 60.0 [35.2, 84.8] | 40.0 [40.0, 40.0] " \
           "| 30.0 [30.0, 30.0] | 60.0 [35.2, 84.8] |" in out
    assert "| B | 1 | 50.0 | 25.0 | 40.0 | 30.0 | 25.0 |" in out


def test_reproduce_sh_trains_each_recipe_from_its_sft_and_refuses_a_changed_setting(tmp_path):
    """make reproduce's script, with a stand-in python, one seed: three SFTs, then five GRPO runs,
    each from its own SFT (baseline: sequential; seen: Seen; the rest: Unseen), every checkpoint
    evaluated on the split asked for; a rerun trains nothing and says so; another GRPO_STEPS into
    the same OUT is refused at the first GRPO step, not mixed with the earlier runs."""
    fake, calls = _stand_in_python(tmp_path)
    out = tmp_path / "an out"                      # a space in it: every path is quoted
    env = dict(os.environ, PY=str(fake), CALLS=str(calls), OUT=str(out), SEEDS="0", LANES="1",
               SPLIT="val")
    script = os.path.join(ROOT, "scripts", "studies", "reproduce.sh")

    def run(**settings):
        return subprocess.run(["bash", script], env=dict(env, **settings), capture_output=True,
                              text=True, timeout=120, check=False)

    first = run()
    assert first.returncode == 0, first.stdout + first.stderr
    lines = calls.read_text().splitlines()
    sft = [c for c in lines if c.startswith("sft.py")]
    assert len(sft) == 3 and "--style=sequential --mode=seen" in sft[2]
    assert all("--eval_data=synthetic:easy:val " in c for c in sft)   # no :test read
    grpo = {c.split()[1]: c for c in lines if c.startswith("grpo.py")}
    expected = {"--recipe=baseline": "sequential", "--recipe=seen": "seen",
                "--recipe=unseen-s1": "unseen", "--recipe=unseen-s2": "unseen",
                "--recipe=scaffold": "unseen"}
    assert sorted(grpo) == sorted(expected)
    for recipe, style in expected.items():
        assert f"--model={out}/sft_{style}_seed0/checkpoint-400 " in grpo[recipe]
    evals = [c for c in lines if c.startswith("eval.py")]
    assert len(evals) == 8
    assert all("--data=synthetic:easy:val,synthetic:medium:val,synthetic:hard:val" in c
               for c in evals)
    table = calls.read_text().splitlines()[-7]                # the table, then its 6 plots
    assert table.startswith("scripts/studies/seeds_table.py ") and table.count("_val ") == 8
    assert (out / "results.md").read_text() == ("make reproduce: seeds 0, 100 GRPO steps (the "
                                                "tiny preset), split val\n\n| table |\n")

    assert "] done grpo unseen-s2 seed 0 in " in first.stdout
    again = run()
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.count(": already made, skipped") == 8 and "] done " not in again.stdout
    trained = ("sft.py", "grpo.py", "eval.py")
    assert not [c for c in calls.read_text().splitlines()[len(lines):] if c.startswith(trained)]
    twice = run(SEEDS="0 1 0")
    assert twice.returncode == 2 and 'SEEDS="0 1 0" names 0 twice' in twice.stderr
    changed = run(GRPO_STEPS="50")
    assert changed.returncode == 1
    assert "was made by another command" in (out / "grpo_baseline_seed0.log").read_text()
    assert not [c for c in calls.read_text().splitlines()[len(lines):] if c.startswith("grpo.py")]
    # a second reproduce.sh in the same OUT while one runs (here: its lock held) trains nothing
    lock = out / ".reproduce.lock"
    holder = subprocess.Popen(["flock", str(lock), "sleep", "60"])
    try:
        for _ in range(50):                  # until the holder has taken the lock
            if subprocess.run(["flock", "-n", str(lock), "true"], check=False).returncode:
                break
            time.sleep(0.1)
        before = len(calls.read_text().splitlines())
        second = run()
        assert second.returncode == 2
        assert f"another reproduce.sh is running in OUT={out}" in second.stderr
        assert not [c for c in calls.read_text().splitlines()[before:] if c.endswith(".py")]
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("script,setting", [
    ("choice.sh", "OUT"), ("dynamics.sh", "OUT"), ("reproduce.sh", "OUT"),
    ("budget.sh", "CARRY_OUT")])
def test_a_study_whose_out_is_a_file_stops_once_naming_it(tmp_path, script, setting):
    """An output folder setting naming a file stops the study before anything runs, with one line
    that names the setting (mkdir once reported it twice, in its own words); the file is kept."""
    taken = tmp_path / "notes.txt"
    taken.write_text("a user's file")
    env = dict(os.environ, **{setting: str(taken)}, PY=sys.executable, TASKS="carry",
               SEEDS="0", RESULTS=str(tmp_path / "results"))
    env.pop("SEED", None)                       # its note (test_a_singular_...) is not this test's
    out = subprocess.run(["bash", os.path.join(ROOT, "scripts", "studies", script)], env=env,
                         capture_output=True, text=True, check=False, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr == f"{script}: {setting}={taken} is a file, not a folder: give a folder\n"
    assert taken.read_text() == "a user's file"


def test_choice_sh_says_which_sfts_it_trains_before_the_arms(tmp_path):
    """choice.sh, carry task, seeds 0 and 1, seed 0's SFT already made: it says that seed 1's SFT
    comes first (a 25-minute training a user did not ask for by name), not seed 0's, and trains
    only seed 1's (with a stand-in python)."""
    fake, calls = _stand_in_python(tmp_path)
    sft_dir = tmp_path / "sft"
    (sft_dir / "sft-seed0" / "checkpoint-1000").mkdir(parents=True)
    env = dict(os.environ, PY=str(fake), CALLS=str(calls), OUT=str(tmp_path / "out"),
               TASKS="carry", SEEDS="0 1", UNITS="tokens", ARMS="chain", SPLITS="test",
               LANES="1", CARRY_SFT_DIR=str(sft_dir), RESULTS=str(tmp_path / "results"))
    out = subprocess.run(["bash", os.path.join(ROOT, "scripts", "studies", "choice.sh")],
                         env=env, capture_output=True, text=True, check=False, timeout=120)
    announced = [line for line in out.stdout.splitlines() if "SFT comes first" in line]
    expected = (f"choice.sh: carry seed 1: its SFT comes first (scripts/studies/carry_sft.sh into"
                f" {sft_dir}, ~25 min on one core)")
    assert announced == [expected], out.stdout
    sft_calls = [c for c in calls.read_text().splitlines() if c.startswith("sft.py")]
    assert len(sft_calls) == 1 and "--seed=1 " in sft_calls[0]


def test_a_singular_setting_gets_a_note_naming_the_plural(tmp_path):
    """SEED=3 (for SEEDS) would be ignored without a word and all five seeds would start: the
    study says so first, on stderr, and names what it goes on with. Here it stops right after,
    at an OUT that is a file, so nothing runs."""
    taken = tmp_path / "notes.txt"
    taken.write_text("")
    env = dict(os.environ, OUT=str(taken), PY=sys.executable, SEED="3", TASK="pair")
    env.pop("SEEDS", None)
    out = subprocess.run(["bash", os.path.join(ROOT, "scripts", "studies", "choice.sh")], env=env,
                         capture_output=True, text=True, check=False, timeout=120)
    seed_note = ('choice.sh: note: SEED=3 is not one of its settings, SEEDS is (SEEDS="3" for'
                 ' that alone); going on with SEEDS="0 1 2 3 4" (Ctrl-C stops it cleanly)')
    task_note = ('choice.sh: note: TASK=pair is not one of its settings, TASKS is (TASKS="pair"'
                 ' for that alone); going on with TASKS="pair carry" (Ctrl-C stops it cleanly)')
    assert out.stderr.splitlines()[:2] == [seed_note, task_note], out.stderr
