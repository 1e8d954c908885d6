"""What would stop a first run on a GPU node (issue 39): the process group's timeout, the CUDA
allocator's settings, and the host memory of the ranks loading the model; and what would make its
results depend on the rank count (issue 46). Each test failed with its fix undone.

Run as a script (`torchrun --nproc_per_node=2 tests/test_ranks.py grpo|preempt ...`) it is the
worker of the one_and_two_ranks fixture and of test_sigterm_under_torchrun_...."""
import datetime
import functools
import json
import os
import pickle
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist
from conftest import ROOT, TWO_RANK_TIMEOUT, torchrun_two_ranks

import config
import eval as ev
import grpo
import plumbing
import sample
import sft
from model import load_model

GRPO_SETTINGS = dict(preset="tiny", batch_size=4, group_size=2, ppo_mini_batches=2,
                     micro_batch_size=2, max_new_tokens=12, lr=1e-3, max_steps=3, max_time=0.0,
                     eval_data="", eval_every=0, eval_k=3, save_every=0, log_every=0)
RECORDS = [{"id": str(i), "problem": f"Ava has {i} pens and {i + 2} cups.", "answer": str(i)}
           for i in range(7)]
HELD_OUT = [{"id": f"h{i}", "problem": f"Bo has {i} hats.", "answer": str(i)} for i in range(5)]

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"


def test_both_trainers_take_the_timeout_and_refuse_a_zero():
    """--dist_timeout_minutes is one field of plumbing.RankFlags, in both trainers' configs, with
    its range checked."""
    for config_class in (sft.SFTConfig, grpo.GRPOConfig):
        cfg = config.parse(config_class, ["--dist_timeout_minutes=45"])
        assert cfg.dist_timeout_minutes == 45.0
        assert config.parse(config_class, []).dist_timeout_minutes == 30.0
        with pytest.raises(ValueError, match="--dist_timeout_minutes=0.0: must be above 0"):
            config.parse(config_class, ["--dist_timeout_minutes=0"])


def test_the_process_group_gets_the_timeout(monkeypatch):
    """distributed() hands the timeout to init_process_group (torch's default for nccl is 10
    minutes: a checkpoint of Qwen3-4B can take longer)."""
    calls = []
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **kw: calls.append(kw))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    with plumbing.distributed(45.0):
        pass
    assert calls[0]["timeout"] == datetime.timedelta(minutes=45)
    calls.clear()
    with plumbing.distributed():
        pass
    assert calls[0]["timeout"] == datetime.timedelta(minutes=30)


def test_expandable_segments_on_cuda_unless_the_user_chose(monkeypatch):
    """A CUDA run gets expandable_segments:True before CUDA starts; a setting of the user's is
    kept; a CPU run is left alone."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv(ALLOC_CONF, raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with plumbing.distributed():
        assert ALLOC_CONF not in os.environ
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with plumbing.distributed() as d:          # one process: nothing touches CUDA
        assert d.device.type == "cuda"
        assert os.environ[ALLOC_CONF] == "expandable_segments:True"
    monkeypatch.setenv(ALLOC_CONF, "max_split_size_mb:512")
    with plumbing.distributed():
        assert os.environ[ALLOC_CONF] == "max_split_size_mb:512"
    monkeypatch.delenv(ALLOC_CONF)
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "garbage_collection_threshold:0.8")
    with plumbing.distributed():
        assert ALLOC_CONF not in os.environ


def test_the_ranks_of_a_node_load_in_turns(tmp_path):
    """2 gloo ranks load a checkpoint as plumbing.load_run does (scripts/bench/bench_load.py):
    rank 1 begins after rank 0 has finished, so a node holds one rank's host copy at a time."""
    folder = str(tmp_path / "model")
    model, tok = load_model("tiny", seed=0)
    plumbing.save_checkpoint(folder, model, tok)
    out = str(tmp_path / "load.json")
    bench_load = os.path.join(ROOT, "scripts", "bench", "bench_load.py")
    torchrun_two_ranks(bench_load, f"--model={folder}", f"--out={out}")
    with open(out) as f:
        rows = sorted(json.load(f), key=lambda r: r["rank"])
    assert [r["rank"] for r in rows] == [0, 1]
    assert rows[0]["end"] <= rows[1]["start"]
    params = sum(p.numel() * 4 for p in model.parameters())
    assert [r["param_bytes"] for r in rows] == [params, params]


def text_reward(responses, golds, **kw):
    """A reward with variance in every group even for a random model: a function of the text."""
    return [{"reward": float(sum(map(ord, t)) % 7), "correct": False, "answer_found": False,
             "kind": "accuracy"}
            for t in responses]


def grpo_recording_rollouts(cfg, folder: str, rank: int) -> None:
    """grpo.train on RECORDS with text_reward, evaluated on HELD_OUT before and after; into
    folder/rollouts-<rank>.pkl: each rollout by (step, prompt, its index in the group), with its
    token ids and log-probs, and each held-out sample list the metrics were taken of (every
    `eval.summarize` call's: (id, sample_index, response) in order)."""
    real_scores = grpo.score_batch
    real_step = grpo.grpo_step
    real_sample = grpo.sample_rollouts
    real_summarize = ev.summarize
    current = {"step": 0}
    seen = []
    evaluated = []

    def counting_step(run, step):
        current["step"] = step
        return real_step(run, step)

    def recording(model, tokenizer, prompts, cfg, seed, **kw):
        rollouts = real_sample(model, tokenizer, prompts, cfg, seed, **kw)
        for i, r in enumerate(rollouts):
            key = (current["step"], tuple(r.prompt_ids), i % cfg.group_size)
            seen.append((key, r.response_ids, r.logprobs))
        return rollouts

    def recording_summary(samples, k):
        evaluated.append(tuple((s["id"], s["sample_index"], s["response"]) for s in samples))
        return real_summarize(samples, k)

    grpo.score_batch = text_reward
    grpo.grpo_step = counting_step
    grpo.sample_rollouts = recording
    ev.summarize = recording_summary
    try:
        grpo.train(cfg, records=RECORDS, eval_records=HELD_OUT)
    finally:
        grpo.score_batch = real_scores
        grpo.grpo_step = real_step
        grpo.sample_rollouts = real_sample
        ev.summarize = real_summarize
    with open(os.path.join(folder, f"rollouts-{rank}.pkl"), "wb") as f:
        pickle.dump({"rollouts": seen, "evaluated": evaluated}, f)


@pytest.fixture(scope="module")
def one_and_two_ranks(tmp_path_factory):
    """GRPO of GRPO_SETTINGS on 2 gloo ranks (folder/two) and on 1 process (folder/one), from the
    same start (folder/init): (folder, what each recorded: "rollouts-1" for 1 process,
    "rollouts-0" and "rollouts-1" for the ranks)."""
    folder = tmp_path_factory.mktemp("ranks")
    model, tok = load_model("tiny", seed=1)
    init = plumbing.save_checkpoint(str(folder / "init"), model, tok)
    torchrun_two_ranks(__file__, "grpo", str(folder), init)
    one = grpo.GRPOConfig(**GRPO_SETTINGS, model=init, out_dir=str(folder / "one"))
    grpo_recording_rollouts(one, str(folder), rank=-1)
    loaded = {}
    for name in ("rollouts--1", "rollouts-0", "rollouts-1"):
        with open(folder / f"{name}.pkl", "rb") as f:
            loaded[name] = pickle.load(f)
    return folder, loaded


def test_grpo_on_two_ranks_equals_one_rank(one_and_two_ranks):
    """GRPO on 2 gloo ranks and on 1 process at the same global batch (4 prompts x 2, 2 PPO
    mini-batches, rewards that differ within every group): the same rollouts at every step,
    token for token, with log-probs and, after 3 steps, weights equal to 1e-6. Each prompt's
    responses are seeded by its place in the global batch, and each rank takes its share of both
    mini-batches (plumbing.rank_places); seeded by rank (the old plumbing.rollout_seed), step 1's
    rollouts already differ."""
    tmp_path, loaded = one_and_two_ranks
    alone = sorted(loaded["rollouts--1"]["rollouts"])
    together = sorted(loaded["rollouts-0"]["rollouts"] + loaded["rollouts-1"]["rollouts"])
    assert len(alone) == len(together) == 3 * 4 * 2
    assert [p for p, _, _ in alone] == [p for p, _, _ in together]
    for (key, ids_a, logprobs_a), (_, ids_b, logprobs_b) in zip(alone, together):
        assert ids_a == ids_b, f"step {key[0]}: other rollouts on 2 ranks"
        assert torch.allclose(torch.tensor(logprobs_a), torch.tensor(logprobs_b), atol=1e-6), key
    from safetensors.torch import load_file
    a = load_file(str(tmp_path / "one" / "checkpoint-3" / "model.safetensors"))
    b = load_file(str(tmp_path / "two" / "checkpoint-3" / "model.safetensors"))
    w0 = load_file(str(tmp_path / "init" / "model.safetensors"))
    gap = max((a[k] - b[k]).abs().max().item() for k in a)
    assert gap <= 1e-6, f"1 rank and 2 ranks: weights {gap:.2e} apart after 3 steps"
    assert max((a[k] - w0[k]).abs().max().item() for k in a) > 1e-4      # it trained


def test_the_held_out_evaluation_on_two_ranks_equals_one_rank(one_and_two_ranks):
    """The same run's evaluations on HELD_OUT (5 problems x 3 responses, before and after):
    each rank samples every other problem (eval.evaluate_run), yet the samples the metrics are
    taken of are 1 rank's, response for response and in its order, and the logged metrics are
    equal. Each problem is seeded by its place in the held-out list; seeded by batch within a
    rank's share (eval.evaluate's default), 2 of the 5 problems got other responses on 2 ranks,
    and gathered rank after rank, the problems came in another order."""
    folder, loaded = one_and_two_ranks
    k = GRPO_SETTINGS["eval_k"]
    whole = len(HELD_OUT) * k

    def metric_inputs(name):            # the summarize calls over every held-out problem
        return {calls for calls in loaded[name]["evaluated"] if len(calls) == whole}

    alone = metric_inputs("rollouts--1")
    assert len(alone) in (1, 2)                             # before, after (maybe the same)
    assert [i for i, _, _ in next(iter(alone))] == [r["id"] for r in HELD_OUT for _ in range(k)]
    assert metric_inputs("rollouts-0") == alone
    assert metric_inputs("rollouts-1") == alone

    def eval_rows(run):                 # the step and the metrics (not the clock)
        rows = [json.loads(line) for line in (folder / run / "log.jsonl").read_text().splitlines()]
        return [{key: value for key, value in row.items() if key == "step" or "eval/" in key}
                for row in rows if "eval/avg_mean_at_k" in row]

    assert [row["step"] for row in eval_rows("one")] == [0, 3]
    assert eval_rows("two") == eval_rows("one")


# The preemption test: the launcher's grace time between SIGTERM and SIGKILL (torchrun's and
# Slurm's: 30 s) made short, and a step made much slower than it by a pause at every decode step.
WINDOW_SECONDS = 6.0
SLOW_DECODE_SECONDS = 1.5      # x up to 12 decode steps: step 2 samples for up to 18 s
SLOW_FROM_STEP = "SLOW_FROM_STEP"    # the worker's variable: pause from this step on
POLL_SECONDS = 0.2


def preemptible_grpo(argv: list[str]) -> None:
    """grpo.py's command line on RECORDS with text_reward (plumbing.run_script: its signal
    handling, its exit); with SLOW_FROM_STEP=k in the environment every decode step of step k
    and later first sleeps SLOW_DECODE_SECONDS."""
    slow_from = int(os.environ.get(SLOW_FROM_STEP, "0"))
    real_step = grpo.grpo_step
    real_decode = sample.Engine._step
    current = {"step": 0}

    def counting_step(run, step):
        current["step"] = step
        return real_step(run, step)

    def slow_decode(engine):
        if slow_from and current["step"] >= slow_from:
            time.sleep(SLOW_DECODE_SECONDS)
        return real_decode(engine)

    grpo.grpo_step = counting_step
    sample.Engine._step = slow_decode
    grpo.score_batch = text_reward
    plumbing.run_script("grpo.py", grpo.GRPOConfig,
                        functools.partial(grpo.train, records=RECORDS), argv)


def log_rows(path) -> int:
    return len(path.read_text().splitlines()) if path.is_file() else 0


def test_sigterm_under_torchrun_leaves_a_checkpoint_within_the_window(tmp_path):
    """2 gloo ranks under torchrun; SIGTERM to torchrun (which passes it to its workers) a second
    into step 2, whose sampling takes up to 18 s, and SIGKILL to everything WINDOW_SECONDS later,
    as a launcher does: the ranks abandon step 2 at their next decode step and save step 1 within
    the window, and --resume=True from it ends with the weights of an uninterrupted run, bit for
    bit. Finishing the step in flight (the old way) is killed with no checkpoint."""
    model, tok = load_model("tiny", seed=1)
    init = plumbing.save_checkpoint(str(tmp_path / "init"), model, tok)
    flags = [f"--model={init}", "--preset=tiny", "--batch_size=4", "--group_size=2",
             "--max_new_tokens=12", "--lr=1e-3", "--max_steps=3", "--eval_data=",
             "--save_every=0", "--log_every=1"]
    full = tmp_path / "full"
    torchrun_two_ranks(__file__, "preempt", *flags, f"--out_dir={full}")
    stopped = tmp_path / "stopped"
    env = dict(os.environ, OMP_NUM_THREADS="1", **{SLOW_FROM_STEP: "2"})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           os.path.abspath(__file__), "preempt", *flags, f"--out_dir={stopped}"]
    with open(tmp_path / "stopped.out", "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + TWO_RANK_TIMEOUT
        while log_rows(stopped / "log.jsonl") < 1:
            assert proc.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "stopped.out").read_text()[-3000:]
            time.sleep(POLL_SECONDS)
        time.sleep(1.0)                                 # into step 2's sampling
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=WINDOW_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)        # the launcher's SIGKILL
            proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    output = (tmp_path / "stopped.out").read_text()
    saved = stopped / "checkpoint-1" / "trainer_state.pt"
    assert saved.is_file(), f"no checkpoint within {WINDOW_SECONDS} s of SIGTERM:\n{output[-3000:]}"
    assert "grpo.py: stopped by SIGTERM after step 1" in output, output[-3000:]
    assert log_rows(stopped / "log.jsonl") == 1
    torchrun_two_ranks(__file__, "preempt", *flags, f"--out_dir={stopped}", "--resume=True")
    from safetensors.torch import load_file
    a = load_file(str(full / "checkpoint-3" / "model.safetensors"))
    b = load_file(str(stopped / "checkpoint-3" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


if __name__ == "__main__":                   # the torchrun worker of the tests above
    if sys.argv[1] == "grpo":
        folder, init = sys.argv[2:]
        two = grpo.GRPOConfig(**GRPO_SETTINGS, model=init, out_dir=os.path.join(folder, "two"))
        grpo_recording_rollouts(two, folder, int(os.environ["RANK"]))
    else:
        preemptible_grpo(sys.argv[2:])
