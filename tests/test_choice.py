"""scripts/studies/choice.py: the forced gap, S1's block-share change, their intervals and the
seeds that agree, on a fabricated run folder whose numbers are worked out by hand; the sweep's
post-hoc cut; scripts/studies/choice.sh's refusals of bad settings."""
import json
import os
import subprocess
import time

import pytest

from scripts.studies import choice

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write_eval(folder, rows):
    """rows: per problem, a list of (correct, has_parallel, T, D) samples."""
    os.makedirs(folder)
    lines = []
    for i, samples in enumerate(rows):
        for correct, block, tokens, steps in samples:
            lines.append(json.dumps({"id": f"p{i}", "correct": correct, "has_parallel": block,
                                     "T": tokens, "D": steps}) + "\n")
    with open(os.path.join(folder, "samples.jsonl"), "w") as fh:
        fh.writelines(lines)


def _seed(root, seed, block_rows, free_rows):
    cell = root / f"pair-seed{seed}" / "tokens"
    _write_eval(cell / "sft-eval-val", [[(0, 1, 9, 9), (0, 0, 9, 9)]] * 2)   # share 50%
    chain_rows = [[(1, 0, 9, 9), (0, 0, 9, 9)], [(0, 0, 9, 9)] * 2]
    _write_eval(root / f"pair-seed{seed}" / "chain" / "eval-val", chain_rows)   # both units'
    _write_eval(cell / "block" / "eval-val", block_rows)
    _write_eval(cell / "free" / "eval-val", free_rows)


def test_choice_table_by_hand(tmp_path):
    """Two problems, two samples each. Chain: 50 and 0 (Mean 25). Seed 0: block 100 and 50, a
    gap of +50 on each problem (so the bootstrap interval is [+50, +50]); the free arm opens no
    block (0% against the SFT's 50%: -50 on each problem): the signs differ, no agreement.
    Seed 1: block 50 and 50, a gap of +0 and +50 (+25); free 100% blocks: +50 on each,
    agrees. Across seeds the gaps +50, +25: mean 37.5, sd 17.678, t(1) 12.706 x 12.5 = 158.825."""
    _seed(tmp_path, 0, [[(1, 1, 9, 9)] * 2, [(1, 1, 9, 9), (0, 1, 9, 9)]],
          [[(1, 0, 9, 9)] * 2, [(0, 0, 9, 9)] * 2])
    _seed(tmp_path, 1, [[(1, 1, 9, 9), (0, 1, 9, 9)], [(1, 1, 9, 9), (0, 1, 9, 9)]],
          [[(1, 1, 9, 9)] * 2, [(1, 1, 9, 9)] * 2])
    cells = choice.collect(str(tmp_path), [0, 1, 2], ("pair",), "val")
    assert [len(cells[("pair", unit)]) for unit in choice.UNITS] == [2, 0]
    seed0, seed1 = cells[("pair", "tokens")]
    assert seed0["gap"] == (50.0, 50.0, 50.0) and seed0["change"] == (-50.0, -50.0, -50.0)
    assert (seed0["chain"], seed0["block"], seed0["free"]) == (25.0, 75.0, 50.0)
    assert not seed0["agrees"]
    assert seed1["gap"][0] == 25.0 and seed1["change"] == (50.0, 50.0, 50.0) and seed1["agrees"]
    assert 0.0 <= seed1["gap"][1] <= 25.0 <= seed1["gap"][2] <= 50.0    # +0 or +50 resampled
    mean, low, high = choice.t_interval([50.0, 25.0])
    assert mean == 37.5 and low == pytest.approx(37.5 - 158.825, abs=1e-3)
    assert high == pytest.approx(37.5 + 158.825, abs=1e-3)
    assert choice.t_interval([3.0]) == (3.0, None, None)
    text = choice.report(cells, [0, 1, 2], "val")
    assert "| pair | tokens | 0, 1 | +37.5 [-121.3, +196.3] (seeds 0, 1) | +0.0 [-635.3, +635.3] " \
           "| 1 of 2 (1) |" in text
    assert "| pair | steps | none finished | | | |" in text
    assert "| pair | tokens | 0 | 25.0 | 75.0 | 50.0 | +50.0 [+50.0, +50.0] | 50.0% | 0.0% | " \
           "-50.0 [-50.0, -50.0] | no |" in text
    assert "Not finished (an evaluation missing):\n- pair, tokens: seeds 2\n- pair, steps: " \
           "seeds 0, 1, 2" in text


def test_sweep_cuts_each_unit_at_the_cap(tmp_path):
    """A right block response of T = 60 tokens and D = 40 decode steps counts at cap 48 in decode
    steps, not in tokens; the chain's (T = D = 30) at both: the gap is 0 in steps, -100 in
    tokens."""
    _write_eval(tmp_path / "chain", [[(1, 0, 30, 30)]])
    _write_eval(tmp_path / "block", [[(1, 1, 60, 40)]])
    text = choice.sweep(str(tmp_path / "chain"), str(tmp_path / "block"), [48])
    assert "| 48 | tokens | 100.0 | 0.0 | -100.0 [-100.0, -100.0] |" in text
    assert "| 48 | steps | 100.0 | 100.0 | +0.0 [+0.0, +0.0] |" in text


@pytest.mark.parametrize("setting,message", [
    ("UNITS=tokens tokens", "names tokens twice"), ("ARMS=chain forced", "unknown 'forced'"),
    ("PAIR_KL=-1", "PAIR_KL=-1: give a number"), ("SEEDS=", "SEEDS must not be empty"),
    ("SPLITS=train", "unknown 'train' in SPLITS"),
    ("UNITS=tokens", "the s2low arm trains under decode steps only")])
def test_choice_sh_refuses_bad_settings_before_anything_runs(tmp_path, setting, message):
    name, value = setting.split("=", 1)
    env = dict(os.environ, **{name: value}, OUT=str(tmp_path / "out"), PY="false")
    out = subprocess.run(["bash", os.path.join(ROOT, "scripts", "studies", "choice.sh")], env=env,
                         capture_output=True, text=True, check=False)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert not (tmp_path / "out").exists()


def test_s2low_without_its_start_fails_naming_it(tmp_path):
    """ARMS=s2low alone on an empty folder: no job of this run trains the free arm under tokens,
    so the s2low job fails at once (no wait), saying where its start should be."""
    env = dict(os.environ, OUT=str(tmp_path / "out"), SEEDS="0", TASKS="pair", UNITS="steps",
               ARMS="s2low", SPLITS="test", LANES="1", WAIT_S="1")
    out = subprocess.run(["bash", os.path.join(ROOT, "scripts", "studies", "choice.sh")], env=env,
                         capture_output=True, text=True, check=False, timeout=120)
    assert out.returncode == 1 and "FAILED pair seed 0 steps s2low" in out.stdout, out.stdout
    assert "SFT comes first" not in out.stdout          # s2low alone trains no SFT
    log = (tmp_path / "out" / "pair-seed0-steps-s2low.log").read_text()
    assert "no " + str(tmp_path / "out") + "/pair-seed0/tokens/free/grpo/checkpoint-100" in log
    assert (tmp_path / "out" / "pair-seed0-steps-s2low.failed").exists()


def test_a_second_choice_sh_on_a_running_seed_is_refused(tmp_path):
    """While another process holds pair seed 1's lock in OUT, choice.sh for seeds 0 and 1 stops
    before any job (exit 2), naming the seed and the lock; the same run for seed 0 alone starts
    (it fails at once on its missing start instead: ARMS=s2low)."""
    out = tmp_path / "out"
    out.mkdir()
    lock = out / ".pair-seed1.lock"
    holder = subprocess.Popen(["flock", str(lock), "sleep", "60"])
    try:
        for _ in range(50):                  # until the holder has taken the lock
            if lock.exists():
                break
            time.sleep(0.1)
        time.sleep(0.5)
        env = dict(os.environ, OUT=str(out), TASKS="pair", UNITS="steps", ARMS="s2low",
                   SPLITS="test", LANES="1")
        script = os.path.join(ROOT, "scripts", "studies", "choice.sh")
        refused = subprocess.run(["bash", script], env=dict(env, SEEDS="0 1"),
                                 capture_output=True, text=True, check=False, timeout=120)
        assert refused.returncode == 2, refused.stderr
        assert "another choice.sh is running pair seed 1" in refused.stderr
        assert not (out / "pair-seed0-steps-s2low.log").exists()
        alone = subprocess.run(["bash", script], env=dict(env, SEEDS="0"), capture_output=True,
                               text=True, check=False, timeout=120)
        assert alone.returncode == 1 and "FAILED pair seed 0 steps s2low" in alone.stdout
    finally:
        holder.kill()
        holder.wait()


def test_training_curves_in_percent_and_their_means_skip_missing_gaps(tmp_path):
    """Two training rows and an evaluation row (skipped): shares 50 and 25%, mixed groups 75 and
    0%, gaps -10 and None (one kind absent). The WINDOW-step mean of 1, None, 3: 1, 1, 2."""
    rows = [{"step": 1, "parallel_ratio": 0.5, "mixed_groups": 0.75, "block_accuracy_gap": -0.1},
            {"step": 2, "parallel_ratio": 0.25, "mixed_groups": 0.0, "block_accuracy_gap": None},
            {"step": 2, "eval/synthetic:hard:val/mean_at_k": 0.4}]
    (tmp_path / "log.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    curves = choice.training_curves(str(tmp_path))
    assert curves == {"share": [50.0, 25.0], "mixed": [75.0, 0.0], "gap": [-10.0, None]}
    assert choice.moving_mean([1.0, None, 3.0]) == [1.0, 1.0, 2.0]
    assert choice.training_curves(str(tmp_path / "absent")) == {"share": [], "mixed": [], "gap": []}


def test_after_the_drop_by_hand():
    """Shares 50, 4, 10, 0 (%), mixed groups 50, 10, 30, 0, gaps -80, -60, None, +20: the first
    step at or below 5% is step 2; from it on 3 steps, mean share 14/3, mixed 40/3, the gap
    measured on 2 (-60, +20: mean -20), favouring blocks on 1, one step back above 5%."""
    curves = {"share": [50.0, 4.0, 10.0, 0.0], "mixed": [50.0, 10.0, 30.0, 0.0],
              "gap": [-80.0, -60.0, None, 20.0]}
    held = choice.after_the_drop(curves)
    assert held == {"first_step": 2, "steps": 3, "share": pytest.approx(14 / 3),
                    "mixed": pytest.approx(40 / 3), "measured": 2,
                    "gap": -20.0, "favoured": 1, "back_above": 1}
    assert choice.after_the_drop({"share": [50.0, 6.0], "mixed": [0.0, 0.0],
                                  "gap": [0.0, 0.0]}) is None


def test_s2_beside_s1_by_hand(tmp_path):
    """Two problems, two samples each, in seed 0's steps cell. S1 (free): blocks 1 of 2 and 0 of
    2 (25%), right 2 and 0 (50); S2: blocks on all 4 (100%), right 1 and 1 (50). S2 - S1: share
    +50 and +100 (mean +75, interval [+50, +100]), Mean@4 -50 and +50 (mean 0). One seed: no
    across-seed interval, and +75 >= 15: S2 leads on 1 of 1. S2's training share 0.5% from its
    step 1 (mixed groups 2%): the after-the-drop row names the arm."""
    cell = tmp_path / "pair-seed0" / "steps"
    _write_eval(cell / "free" / "eval-test", [[(1, 1, 9, 9), (1, 0, 9, 9)], [(0, 0, 9, 9)] * 2])
    _write_eval(cell / "s2" / "eval-test", [[(1, 1, 9, 9), (0, 1, 9, 9)]] * 2)
    (cell / "s2" / "grpo").mkdir()
    row = {"parallel_ratio": 0.005, "mixed_groups": 0.02, "block_accuracy_gap": None}
    (cell / "s2" / "grpo" / "log.jsonl").write_text(json.dumps(row) + "\n")
    cells = choice.collect(str(tmp_path), [0, 1], ("pair",), "test", row_of=choice.s2_row)
    assert cells[("pair", "tokens")] == []
    (seed0,) = cells[("pair", "steps")]
    assert (seed0["s1_share"], seed0["s2_share"]) == (25.0, 100.0)
    assert (seed0["s1_accuracy"], seed0["s2_accuracy"]) == (50.0, 50.0)
    assert seed0["lead"][0] == 75.0 and 50.0 <= seed0["lead"][1] <= seed0["lead"][2] <= 100.0
    assert seed0["accuracy"][0] == 0.0
    text = "\n".join(choice.s2_lines(cells))
    assert "| pair | steps | 0 | +75.0 | +0.0 | 1 of 1 (0) |" in text
    assert "| pair | steps | 0 | 25.0% | 100.0% | +75.0 [" in text
    report = choice.report({("pair", "steps"): []}, [0], "test", cells)
    assert "| pair | steps | S2 | 0 | 1 | 1 | 0.50% | 2.0% | 0 | - | 0 | 0 |" in report
    pytest.importorskip("matplotlib")
    choice.plot({("pair", "steps"): []}, str(tmp_path / "choice.png"), cells)
    assert (tmp_path / "choice.png").stat().st_size > 0


def test_a_dropped_share_and_where_s2_took_it(tmp_path):
    """Seed 0: S1's end under tokens opened a block on 1 of 4 samples (25%); S2 from it (s2low,
    steps cell) on 4 of 4 (100%, right 2 and 1 of 2: 75): it came back (above 5%); the forced
    block from the same start (blocklow) right 1 and 0 of 2 (25): a gap of -50 on each problem,
    [-50, -50]. Seed 1: only its start exists: no row. Seed 2: no blocklow: its gap not run."""
    seed_dir = tmp_path / "pair-seed0"
    _write_eval(seed_dir / "tokens" / "free" / "eval-test", [[(1, 1, 9, 9), (1, 0, 9, 9)],
                                                             [(0, 0, 9, 9)] * 2])
    _write_eval(seed_dir / "steps" / "s2low" / "eval-test", [[(1, 1, 9, 9)] * 2,
                                                             [(1, 1, 9, 9), (0, 1, 9, 9)]])
    _write_eval(seed_dir / "steps" / "blocklow" / "eval-test", [[(1, 1, 9, 9), (0, 1, 9, 9)],
                                                                [(0, 1, 9, 9)] * 2])
    _write_eval(tmp_path / "pair-seed1" / "tokens" / "free" / "eval-test", [[(1, 0, 9, 9)]])
    for part in ("tokens/free", "steps/s2low"):
        _write_eval(tmp_path / "pair-seed2" / part / "eval-test", [[(1, 0, 9, 9)]])
    row = choice.return_row(str(tmp_path), "pair", 0, "test")
    assert (row["start_share"], row["share"], row["accuracy"]) == (25.0, 100.0, 75.0)
    assert row["block"] == 25.0 and row["gap"] == (-50.0, -50.0, -50.0)
    assert choice.return_row(str(tmp_path), "pair", 1, "test") is None
    seed2 = choice.return_row(str(tmp_path), "pair", 2, "test")
    assert (seed2["share"], seed2["block"], seed2["gap"]) == (0.0, None, None)
    text = "\n".join(choice.return_lines({"pair": [row, seed2]}))
    assert "| pair | 0 | 25.0% | 100.0% | 75.0 | 25.0 | -50.0 [-50.0, -50.0] |" in text
    assert "| pair | 2 | 0.0% | 0.0% | 100.0 | not run | not run |" in text
    assert "| pair | across seeds | came back on 1 of 2 (0) | | | | -50.0 |" in text


def test_the_unit_effect_is_steps_minus_tokens_per_seed():
    """Seed 0: gaps -10 (tokens) and +5 (steps), changes -80 and +20: +15 and +100. Seed 1:
    gaps -20 and +10, changes -60 and -10: +30 and +50. Across seeds: 22.5 with half-width
    12.706 x sd(15, 30) / sqrt 2 = 12.706 x 7.5 = 95.295; 75 +- 12.706 x 25 = 317.65 (-242.65
    and 392.65 print as -242.6 and +392.6)."""
    def row(seed, gap, change):
        return {"seed": seed, "gap": (gap, gap, gap), "change": (change, change, change),
                "chain": 0.0, "block": 0.0, "free": 0.0, "sft_share": 0.0, "free_share": 0.0,
                "agrees": True, "curves": {"share": [], "mixed": [], "gap": []}}
    cells = {("pair", "tokens"): [row(0, -10.0, -80.0), row(1, -20.0, -60.0)],
             ("pair", "steps"): [row(0, 5.0, 20.0), row(1, 10.0, -10.0)]}
    text = choice.report(cells, [0, 1], "test")
    assert ("| pair | 0, 1 | +15.0 / +30.0; +22.5 [-72.8, +117.8] (seeds 0, 1) | "
            "+100.0 / +50.0; +75.0 [-242.6, +392.6] |") in text


def test_a_seed_without_its_forced_arms_counts_for_s1_only(tmp_path):
    """Seed 0 complete (the by-hand seed 0 above: gap +50, change -50); seed 1 has only its SFT
    and free arm (change +50 on each problem): S1's change is read over both seeds (mean 0),
    the forced gap over seed 0 alone, and seed 1's row says its forced arms did not run."""
    _seed(tmp_path, 0, [[(1, 1, 9, 9)] * 2, [(1, 1, 9, 9), (0, 1, 9, 9)]],
          [[(1, 0, 9, 9)] * 2, [(0, 0, 9, 9)] * 2])
    cell = tmp_path / "pair-seed1" / "tokens"
    _write_eval(cell / "sft-eval-val", [[(0, 1, 9, 9), (0, 0, 9, 9)]] * 2)
    _write_eval(cell / "free" / "eval-val", [[(1, 1, 9, 9)] * 2] * 2)
    cells = choice.collect(str(tmp_path), [0, 1], ("pair",), "val")
    seed1 = cells[("pair", "tokens")][1]
    assert (seed1["gap"], seed1["chain"], seed1["block"], seed1["agrees"]) == (None,) * 4
    text = choice.report(cells, [0, 1], "val")
    assert "| pair | tokens | 0, 1 | +50.0 (seeds 0) | +0.0 [-635.3, +635.3] | 0 of 1 (none) |" \
        in text
    assert "| pair | tokens | 1 | not run | not run | 100.0 | not run | 50.0% | 100.0% | " \
           "+50.0 [+50.0, +50.0] | - |" in text


def test_the_table_states_the_budget_its_free_arms_were_evaluated_at(tmp_path):
    """B is read from each free arm's summary.json (eval.py's config): one B a task is stated;
    two (a rerun with another PAIR_B into the same OUT) are stated with a warning. A fresh user
    once saw a refused PAIR_B=64 run rewrite the B = 48 table with no word of B."""
    free_rows = [[(1, 0, 9, 9)] * 2, [(0, 0, 9, 9)] * 2]
    block_rows = [[(1, 1, 9, 9)] * 2] * 2
    for seed, budget in ((0, 48), (1, 48)):
        _seed(tmp_path, seed, block_rows, free_rows)
        summary = {"config": {"max_new_tokens": budget}}
        free = tmp_path / f"pair-seed{seed}" / "tokens" / "free" / "eval-val"
        (free / "summary.json").write_text(json.dumps(summary))
    cells = choice.collect(str(tmp_path), [0, 1], ("pair",), "val")
    assert "\nBudget B, as the free arms were evaluated: pair 48.\n" in choice.report(cells, [0, 1],
                                                                                     "val")
    summary = {"config": {"max_new_tokens": 64}}
    free = tmp_path / "pair-seed1" / "tokens" / "free" / "eval-val"
    (free / "summary.json").write_text(json.dumps(summary))
    cells = choice.collect(str(tmp_path), [0, 1], ("pair",), "val")
    assert "\nBudget B, as the free arms were evaluated: pair 48, 64 (runs of different budgets " \
           "are mixed here!).\n" in choice.report(cells, [0, 1], "val")


def _write_log(folder, shares, mixed=0.5, gaps=None):
    """A training log.jsonl: per step a share (0-1), `mixed` and a gap (0-1 or None)."""
    os.makedirs(folder)
    rows = []
    for i, share in enumerate(shares):
        gap = None if gaps is None else gaps[i]
        rows.append({"step": i + 1, "parallel_ratio": share, "mixed_groups": mixed,
                     "block_accuracy_gap": gap})
    (folder / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_s2_starts_by_hand(tmp_path, capsys):
    """scripts/studies/s2_starts.py, one seed, 30-step S2 runs from the SFT (kept: share 0.6 for 5
    steps, then 0.9; its first 20 gaps -0.1, then +0.3) and from S1's step 2 (dropped: 0.2, then
    0.01; gaps -0.4 throughout, None on one late step); S1's run drew 80, 40, 10% at steps 1-3 (from
    the SFT: step 1's; from the checkpoint after step 2: step 3's). First 5 steps
    60.0 / 20.0, at step 8 90.0 / 1.0, last 10 90.0 / 1.0; late gaps +30.0 and -40.0 (the None left
    out). The control, S1 from the SFT: 0.5 for 5 steps, then 0.3 (first 5: 50.0, last 10: 30.0,
    so it did not keep them); from step 2 not run ("-"). S1's end (start 100) has not run: it is
    named, the rest reported."""
    from scripts.studies import s2_starts
    choice_root = tmp_path / "choice"
    starts_root = tmp_path / "starts"
    _write_log(choice_root / "pair-seed0" / "steps" / "s2" / "grpo", [0.6] * 5 + [0.9] * 25,
               gaps=[-0.1] * 20 + [0.3] * 10)
    _write_log(choice_root / "pair-seed0" / "tokens" / "free" / "grpo", [0.8, 0.4, 0.1])
    _write_log(choice_root / "pair-seed0" / "steps" / "free" / "grpo", [0.5] * 5 + [0.3] * 25)
    _write_log(starts_root / "pair-seed0" / "s2from2" / "grpo", [0.2] * 5 + [0.01] * 25,
               mixed=0.25, gaps=[-0.4] * 29 + [None])
    s2_starts.main([str(choice_root), str(starts_root), "--seeds=0", "--starts=2", "--steps=30"])
    out, err = capsys.readouterr()
    assert ("| 0 | the SFT | 80.0 | 60.0 → 90.0 → 90.0 | 50.0 / 50.0 | -10.0 / +30.0 | yes "
            "| 50.0 → 30.0 |") in out
    assert "| 0 | step 2 | 10.0 | 20.0 → 1.0 → 1.0 | 25.0 / 25.0 | -40.0 / -40.0 | no | - |" in out
    assert "start 0: S2 kept blocks (last 10 steps ≥ 50%) on 1 of 1 seeds; S1 on 0 of 1" in out
    assert "start 2: S2 kept blocks (last 10 steps ≥ 50%) on 0 of 1 seeds" in out
    assert "runs that kept blocks: block − chain accuracy after step 20: +30.0" in out
    assert "runs that dropped them: block − chain accuracy after step 20: -40.0" in out
    assert err == f"not yet run (30 steps): {choice_root}/pair-seed0/steps/s2low/grpo\n"


def test_s2_starts_refuses_a_cut_log_and_too_few_steps(tmp_path):
    """A log.jsonl cut mid-line (a run read while it writes) stops s2_starts.py with one line that
    names the run; --steps below the step-8 column, or a start it always shows, is refused."""
    from scripts.studies import s2_starts
    folder = tmp_path / "pair-seed0" / "steps" / "s2" / "grpo"
    folder.mkdir(parents=True)
    (folder / "log.jsonl").write_text('{"step": 1, "parall')
    with pytest.raises(SystemExit) as cut:
        s2_starts.main([str(tmp_path), str(tmp_path), "--seeds=0"])
    assert str(cut.value).startswith("s2_starts.py: seed 0, start 0: a log.jsonl line is not")
    for flags in (["--steps=5"], ["--starts=0,4"]):
        with pytest.raises(SystemExit) as refused:
            s2_starts.main([str(tmp_path), str(tmp_path), *flags])
        assert refused.value.code == 2
