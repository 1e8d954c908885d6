"""Tests of sft.py: the loss is the token mean of the global batch however it is split, resume is
exact.

References come from outside the code under test: Hugging Face's own `labels=` loss (which masks the
prompt with -100 and shifts in sequence order, exactly our rule), one un-split batch as the
reference for gradient accumulation and for 2 ranks (DDP and FSDP2, gloo on CPU), and an
uninterrupted 6-step run as the reference for 3 steps + resume + 3 steps. The model is a
~100k-parameter Qwen3 (hidden 64, 2 layers) with the character tokenizer, saved once as a checkpoint
folder so every path loads it with `--model=<folder>`. The records are hand-made in the canonical
layout (2- and 3-path blocks, text before a block, different lengths so micro-batches hold different
numbers of response tokens).

This file is also the worker script of the 2-rank test:
`torchrun --nproc_per_node=2 tests/test_sft.py ...`.
"""

import contextlib
import functools
import glob
import inspect
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)                     # also when run by torchrun as a script

import pytest
import torch
from conftest import torchrun_two_ranks
from safetensors.torch import load_file
from transformers import Qwen3Config, Qwen3ForCausalLM

import eval as ev
import plumbing
import sft
from attention import TagIds
from config import parse
from model import add_parallel_tags, build_char_tokenizer, load_model
from plumbing import save_checkpoint

# Seconds a test waits for another process to reach a state (print a line, exit, write a file): far
# above what it takes on a loaded 2-core machine, so only a hang reaches it. Waits poll the state,
# never sleep a fixed time.
PROCESS_TIMEOUT = 600
POLL_INTERVAL = 0.1


def make_records(n: int, seed: int = 0) -> list[dict]:
    """n word problems with canonical parallel traces of varying length (2 or 3 paths)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        parts = [(rng.randint(2, 9), rng.randint(2, 9)) for _ in range(2 + i % 2)]
        products = [a * b for a, b in parts]
        paths = "".join(f"<Path>{a}*{b}={a * b}</Path>" for a, b in parts)
        lead = "Split it.\n" * (i % 3)
        solution = (f"{lead}<Parallel>{paths}</Parallel>\n<Summary>{'+'.join(map(str, products))}="
                    f"{sum(products)}</Summary>Final Answer: {sum(products)}")
        problem = "What is " + " + ".join(f"{a}*{b}" for a, b in parts) + "?"
        out.append({"id": f"t{i}", "problem": problem, "answer": str(sum(products)),
                    "solution": solution, "source": "test"})
    return out


def small_model(seed: int = 0):
    tok = build_char_tokenizer()
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                      intermediate_size=128, max_position_embeddings=256, tie_word_embeddings=True,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                      bos_token_id=None)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    add_parallel_tags(model, tok)
    return model, tok


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The models here are tiny: one intra-op thread is as fast, and on a shared 2-core machine two
    spinning threads made each step 50x slower."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("small") / "model")
    model, tok = small_model()
    save_checkpoint(path, model, tok)
    return path


def grads(model) -> dict:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def config(model_dir, out_dir, **kw) -> sft.SFTConfig:
    base = dict(model=model_dir, preset="tiny", out_dir=str(out_dir), lr=1e-3, batch_size=8,
                micro_batch_size=4,
                max_steps=6, warmup_ratio=0.2, max_length=256, max_time=0.0, save_every=3,
                keep_last=0, eval_samples=0, log_every=0)
    return sft.SFTConfig(**{**base, **kw})


# --------------------------------------------------------------------------------------------------
# Hand-worked pieces


def test_collate_worked_example():
    b = sft.collate([sft.Example([5, 6], [7, 1]), sft.Example([5], [8, 9, 4, 1])], pad_id=0)
    assert b.input_ids.tolist() == [[5, 6, 7, 1, 0], [5, 8, 9, 4, 1]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert b.loss_mask.tolist() == [[0, 0, 1, 1, 0], [0, 1, 1, 1, 1]]
    assert b.prompt_lengths == [2, 1]


def test_shards_are_disjoint_and_cover_the_batch():
    # example i: prompt [i + 3], response of length `lengths[i]`
    lengths = [1, 1, 1, 1, 3, 1, 2, 1]
    ex = [sft.Example([i + 3], [1] * n) for i, n in enumerate(lengths)]
    shards = [sft.shard_micro_batches(ex, list(range(8)), r, 2, 3, pad_id=0) for r in range(2)]
    firsts = [[mb.input_ids[:, 0].tolist() for mb in s] for s in shards]
    # rank 0: i0-i3 (equal lengths, order kept); rank 1: i4-i7 sorted by length: i5 i7 i6 | i4
    assert firsts == [[[3, 4, 5], [6]], [[8, 10, 9], [7]]]
    assert [mb.input_ids.shape[1] for mb in shards[1]] == [3, 4]      # padded to 3, alone at 4


def test_schedule_warmup_then_cosine():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    # 2 warm-up steps, 8 cosine steps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, sft.sft_schedule(10, 0.2))
    lrs = []
    for _ in range(10):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    # warm-up 1/2, 2/2; then 0.5 * (1 + cos(pi * k / 7)) for k = 0..7
    expected = [0.5, 1.0, 1.0, 0.9504844, 0.8117449, 0.6112605, 0.3887395, 0.1882551, 0.0495156,
                0.0]
    assert lrs == pytest.approx(expected, abs=1e-6)


def test_stream_position_resumes_the_same_order():
    a = plumbing.ShuffledStream(5, seed=3)
    first = a.take(4) + a.take(4)                      # spans epochs 0 and 1
    assert sorted(first[:5]) == [0, 1, 2, 3, 4] and a.position() == {"epoch": 1, "index": 3}
    b = plumbing.ShuffledStream(5, seed=3, **a.position())
    assert b.take(6) == a.take(6)


def test_parse_config(capsys):
    # --key=value and --key value
    cfg = parse(sft.SFTConfig, ["--lr=3e-4", "--fsdp=True", "--betas=0.9,0.99", "--max_steps=None",
                                "--mode", "seen", "--batch_size=64"])
    assert (cfg.lr, cfg.fsdp, cfg.betas, cfg.max_steps, cfg.mode, cfg.batch_size) == \
        (3e-4, True, (0.9, 0.99), None, "seen", 64)
    assert parse(sft.SFTConfig, ["--lr=1"], base={"lr": 5.0, "seed": 7}).seed == 7
    for bad, msg in [(["--lr"], "expected one argument"),
                     (["--learning_rate=1"], "unrecognized arguments"),
                     (["--fsdp=maybe"], "invalid true_or_false value"),
                     (["--batch_size=1.5"], "invalid int or None"),
                     (["--mode=causal"], "invalid choice: 'causal'"),
                     (["--betas=0.9"], "invalid 2-tuple value")]:
        with pytest.raises(SystemExit):
            parse(sft.SFTConfig, bad)
        assert msg in capsys.readouterr().err
    with pytest.raises(SystemExit):                   # --help lists every field with its comment
        parse(sft.SFTConfig, ["--help"])
    assert "the Unseen mask and positions, or causal" in capsys.readouterr().out


def test_tiny_and_real_defaults():
    tiny = sft.resolve_defaults(sft.SFTConfig())
    assert (tiny.lr, tiny.batch_size, tiny.micro_batch_size, tiny.warmup_ratio, tiny.max_steps) == \
        (1e-3, 32, 8, 0.05, 400)
    real = sft.resolve_defaults(sft.SFTConfig(model="Qwen/Qwen3-4B-Base"), world_size=8)
    assert (real.lr, real.batch_size, real.micro_batch_size, real.warmup_ratio, real.epochs,
            real.betas, real.weight_decay, real.grad_clip) == \
        (1e-5, 128, 1, 0.1, 5.0, (0.9, 0.95), 0.01, 1.0)


# --------------------------------------------------------------------------------------------------
# The loss


def test_loss_equals_hf_labels_loss():
    """Our masked, padded Seen loss = HF's own loss (labels=-100 on the prompt), example by example,
    combined as a token mean: sum_i loss_i * n_i / sum_i n_i."""
    model, tok = small_model()
    tags = TagIds.from_tokenizer(tok)
    ex = sft.tokenize_records(make_records(4), tok, "bare", 256)
    nll_sum, n = sft.response_nll(model, sft.collate(ex, tok.pad_token_id), tags, "seen")
    ref_sum, ref_n = 0.0, 0
    for e in ex:
        ids = torch.tensor([e.prompt_ids + e.response_ids])
        labels = torch.tensor([[-100] * len(e.prompt_ids) + e.response_ids])
        loss = model(input_ids=ids, labels=labels).loss
        ref_sum, ref_n = ref_sum + loss.item() * len(e.response_ids), ref_n + len(e.response_ids)
    assert n.item() == ref_n
    assert nll_sum.item() / n.item() == pytest.approx(ref_sum / ref_n, rel=1e-6)


@pytest.mark.parametrize("grad_checkpointing", [False, True])
def test_accumulation_equals_one_batch(grad_checkpointing):
    """4 micro-batches of 2 give the gradients of one batch of 8 (Unseen, padded). The micro-batches
    hold different numbers of response tokens, so averaging per micro-batch (§8.2.6) would not."""
    model, tok = small_model()
    if grad_checkpointing:
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    tags = TagIds.from_tokenizer(tok)
    ex = sft.tokenize_records(make_records(8), tok, "bare", 256)
    one = sft.shard_micro_batches(ex, list(range(8)), 0, 1, 8, tok.pad_token_id)
    four = sft.shard_micro_batches(ex, list(range(8)), 0, 1, 2, tok.pad_token_id)
    counts = [mb.loss_mask[:, 1:].sum().item() for mb in four]
    assert len(set(counts)) > 1
    nll_1, n_1 = sft.accumulate_gradients(model, one, tags, "unseen")
    g1 = grads(model)
    model.zero_grad()
    nll_4, n_4 = sft.accumulate_gradients(model, four, tags, "unseen")
    assert n_1 == n_4 == sum(counts)
    assert nll_4 == pytest.approx(nll_1, rel=1e-6)
    assert max_diff(grads(model), g1) < 1e-6
    assert max(g.abs().max().item() for g in g1.values()) > 1e-2     # the gradients are not all ~0


# --------------------------------------------------------------------------------------------------
# 2 ranks (DDP and FSDP2 over gloo) = one process


def _worker(model_dir: str, out_dir: str):
    """Run by torchrun in 2 processes: gradients of an 8-sequence batch under DDP and under FSDP2
    (micro-batches of 2, so 2 per rank), then a 2-step DDP `train` run."""
    with plumbing.distributed() as info:
        records = make_records(16)
        for kind in ("ddp", "fsdp"):
            model, tok = load_model(model_dir, device="cpu")
            model.train()
            if kind == "ddp":
                wrapped = torch.nn.parallel.DistributedDataParallel(model)
            else:
                from torch.distributed.fsdp import fully_shard
                for layer in model.model.layers:
                    fully_shard(layer)
                wrapped = fully_shard(model)
            ex = sft.tokenize_records(records[:8], tok, "bare", 256)
            mbs = sft.shard_micro_batches(ex, list(range(8)), info.rank, info.world_size, 2,
                                          tok.pad_token_id)
            nll, n = sft.accumulate_gradients(wrapped, mbs, TagIds.from_tokenizer(tok), "unseen",
                                              info.world_size, info.device)
            g = {k: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
                 for k, p in model.named_parameters()}
            if info.is_main:
                torch.save({"grads": g, "nll": nll, "n": n}, os.path.join(out_dir, f"{kind}.pt"))
        sft.train(config(model_dir, os.path.join(out_dir, "ddp_run"), max_steps=2, save_every=0),
                  records=records)
        if FSDP_CAN_SAVE:
            fsdp_run = os.path.join(out_dir, "fsdp_run")
            sft.train(config(model_dir, fsdp_run, max_steps=2, save_every=0, fsdp=True),
                      records=records)


# Saving an FSDP2 model needs model.save_checkpoint(..., state_dict=<gathered full state dict>).
FSDP_CAN_SAVE = "state_dict" in inspect.signature(save_checkpoint).parameters


def wait_until(condition, what: str, timeout: float = PROCESS_TIMEOUT) -> None:
    """Poll `condition()` until it is true; fail after `timeout` seconds, saying `what` it waited
    for."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout} s for {what}")
        time.sleep(POLL_INTERVAL)


def has_written(proc: subprocess.Popen, path: Path, stderr: Path) -> bool:
    """Whether `proc` has written `path` (a file or folder); fails when `proc` ended without it
    (its stderr goes to the file `stderr`)."""
    ended = proc.poll() is not None              # first: a process that ended wrote all it will
    if path.exists():
        return True
    assert not ended, f"{proc.args[1]} ended before it wrote {path}: {stderr.read_text()[-2000:]}"
    return False


@contextlib.contextmanager
def sigint_reaches_children():
    """SIGINT as in a terminal for the processes started inside: a background job (`make test &`)
    inherits SIGINT ignored, and Python keeps an ignored SIGINT so, while a handled one is reset to
    the default at exec and the child's Python turns it into KeyboardInterrupt. (Not preexec_fn:
    it is unsafe in a process with threads, and pytest's has some once the wandb, tqdm and reward
    worker tests ran.)"""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def has_logged_a_step(proc: subprocess.Popen, log: Path, stderr: Path) -> bool:
    """Whether `proc` has written a row into its log.jsonl (which exists from the start)."""
    return has_written(proc, log, stderr) and log.read_text().strip() != ""


def test_a_signal_saves_the_step_in_hand_and_says_how_to_go_on(model_dir, tmp_path):
    """SIGINT (Ctrl-C) to sft.py and SIGTERM (a cluster's preemption) to grpo.py, both at once,
    once each has logged a step (--save_every=1000: no checkpoint by the schedule; neither can
    be done, --max_steps=100000): the step in hand finishes and is saved, and the run ends in
    one line that names the checkpoint to resume from, exit status 1, no traceback, no
    end-of-run samples."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cmds = {"sft.py": (signal.SIGINT, [f"--model={model_dir}", "--preset=tiny",
                                       "--max_steps=100000", "--log_every=1",
                                       "--save_every=1000"]),
            "grpo.py": (signal.SIGTERM, [f"--model={model_dir}", "--preset=tiny", "--batch_size=2",
                                         "--group_size=2", "--eval_data=", "--max_steps=100000",
                                         "--log_every=1", "--save_every=1000"])}
    procs = {}
    with sigint_reaches_children():
        for n, (_, args) in cmds.items():
            # a file, not a pipe: a child never blocks on a full pipe that the test is not reading
            with open(tmp_path / f"{n}.stdout", "w") as out, \
                    open(tmp_path / f"{n}.stderr", "w") as err:
                procs[n] = subprocess.Popen([sys.executable, os.path.join(root, n),
                                             f"--out_dir={tmp_path / n}", *args],
                                            env=env, stdout=out, stderr=err)
    try:
        for name, p in procs.items():
            stderr = tmp_path / f"{name}.stderr"
            log = tmp_path / name / "log.jsonl"
            wait_until(functools.partial(has_logged_a_step, p, log, stderr), f"{name}'s first step")
            p.send_signal(cmds[name][0])
            p.wait(timeout=PROCESS_TIMEOUT)
            err = stderr.read_text()
            assert p.returncode == 1, err[-2000:]
            steps = len(log.read_text().splitlines())
            checkpoint = tmp_path / name / f"checkpoint-{steps}"
            said = (f"{name}: stopped by {cmds[name][0].name} after step {steps}; "
                    f"--resume=True continues from {checkpoint}")
            assert said in err, err[-2000:]
            assert checkpoint.is_dir() and "Traceback" not in err, err[-2000:]
            out = (tmp_path / f"{name}.stdout").read_text()
            assert "greedy samples" not in out                 # a stopped run exits at once
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def test_two_ranks_equal_one_process(model_dir, tmp_path):
    torchrun_two_ranks(__file__, model_dir, str(tmp_path))

    model, tok = load_model(model_dir, device="cpu")
    model.train()
    ex = sft.tokenize_records(make_records(8), tok, "bare", 256)
    mbs = sft.shard_micro_batches(ex, list(range(8)), 0, 1, 2, tok.pad_token_id)
    nll, n = sft.accumulate_gradients(model, mbs, TagIds.from_tokenizer(tok), "unseen")
    ref = grads(model)
    for kind in ("ddp", "fsdp"):
        got = torch.load(tmp_path / f"{kind}.pt")
        assert got["n"] == n and got["nll"] == pytest.approx(nll, rel=1e-6), kind
        assert max_diff(got["grads"], ref) < 1e-6, kind

    # the whole training loop: same losses, gradient norms and weights as one process
    one = sft.train(config(model_dir, tmp_path / "single", max_steps=2, save_every=0),
                    records=make_records(16))
    ref_log = [json.loads(line)
               for line in (tmp_path / "single" / "log.jsonl").read_text().splitlines()]
    ref_w = load_file(tmp_path / "single" / "checkpoint-2" / "model.safetensors")
    assert [r["step"] for r in ref_log] == [1, 2] and one["checkpoint"].endswith("checkpoint-2")
    for run in ["ddp_run"] + ["fsdp_run"] * FSDP_CAN_SAVE:
        log = [json.loads(line) for line in (tmp_path / run / "log.jsonl").read_text().splitlines()]
        assert [r["tokens"] for r in log] == [r["tokens"] for r in ref_log], run
        for a, b in zip(log, ref_log):
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-6), run
            assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5), run
        w = load_file(tmp_path / run / "checkpoint-2" / "model.safetensors")
        assert max((w[k] - ref_w[k]).abs().max().item() for k in ref_w) < 1e-6, run


# --------------------------------------------------------------------------------------------------
# Checkpoints and resume


def test_resume_is_bit_exact(model_dir, tmp_path, capsys):
    """6 steps in one go = 3 steps, stop, resume from checkpoint-3, 3 more steps: equal bit for bit.
    Batches of 8 over 13 examples, so the data position crosses epochs at odd places. Everything
    goes through the command line: the data from a .jsonl file, the config of the resumed run from
    the checkpoint; then --resume=True continues the latest checkpoint with a command-line override
    and greedy-samples the model for the end-of-run summary."""
    data = tmp_path / "train.jsonl"
    with open(data, "w") as f:
        for r in make_records(13):
            row = {"problem": r["problem"], "answer": r["answer"], "solution": r["solution"]}
            f.write(json.dumps(row) + "\n")
    a, b = tmp_path / "a", tmp_path / "b"
    args = [f"--model={model_dir}", f"--data={data}", f"--out_dir={a}", "--lr=1e-3",
            "--batch_size=8", "--micro_batch_size=4", "--max_steps=6", "--warmup_ratio=0.2",
            "--max_length=256", "--max_time=0", "--save_every=3", "--keep_last=0",
            "--eval_samples=0", "--log_every=0", "--preset=tiny"]
    full = sft.main(args)
    assert sorted(os.listdir(a)) == ["checkpoint-3", "checkpoint-6", "log.jsonl", "settings.json"]
    state = torch.load(a / "checkpoint-3" / "trainer_state.pt", weights_only=False)
    # 24 = 13 + 11
    assert state["step"] == 3 and state["data_position"] == {"epoch": 1, "index": 11}
    assert {"optimizer", "scheduler", "rng", "config"} <= state.keys()

    resumed = sft.main([f"--resume={a / 'checkpoint-3'}", f"--out_dir={b}"])
    wa, wb = (load_file(d / "checkpoint-6" / "model.safetensors") for d in (a, b))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    log_a = [json.loads(line)["loss"] for line in (a / "log.jsonl").read_text().splitlines()]
    log_b = [json.loads(line)["loss"] for line in (b / "log.jsonl").read_text().splitlines()]
    assert len(log_a) == 6 and log_b == log_a[3:]
    assert full["steps"] == resumed["steps"] == 6
    start = load_file(os.path.join(model_dir, "model.safetensors"))
    up_proj = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(start[up_proj], wa[up_proj])

    capsys.readouterr()
    more = sft.main([f"--out_dir={b}", "--resume=True", "--max_steps=8", "--eval_samples=2"])
    assert more["steps"] == 8 and more["checkpoint"] == str(b / "checkpoint-8")
    assert more["eval"]["n"] == 2 and 0.0 <= more["eval"]["structure_ok"] <= 1.0
    out = capsys.readouterr().out
    assert f"checkpoint: {b / 'checkpoint-8'}" in out
    assert "next step trains at lr 9.55e-05, not the checkpoint's 0" in out
    rows = [json.loads(line) for line in (b / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [4, 5, 6, 7, 8]
    # step 7 follows the 8-step schedule (warm-up 2, cosine to 0 at optimizer step 7), not the
    # 6-step run's final lr 0
    assert rows[3]["lr"] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 4 / 5)))
    assert rows[4]["lr"] == 0.0

    # a fresh run into a used folder moves the earlier run aside instead of deleting it
    again = sft.main(args[:6] + ["--max_steps=3"] + args[7:])
    assert again["steps"] == 3
    assert sorted(os.listdir(a)) == ["checkpoint-3", "earlier-1", "log.jsonl", "settings.json"]
    assert sorted(os.listdir(a / "earlier-1")) == ["checkpoint-3", "checkpoint-6", "log.jsonl",
                                                   "settings.json"]
    wa_old = load_file(a / "earlier-1" / "checkpoint-6" / "model.safetensors")
    assert all(torch.equal(wa[k], wa_old[k]) for k in wa)


# --------------------------------------------------------------------------------------------------
# Bad input


def test_bad_input_is_dropped_or_refused(model_dir, tmp_path):
    _, tok = load_model(model_dir, device="cpu")
    records = make_records(4)
    records[1]["solution"] = ("<Parallel><Path>2*3=6</Path></Parallel>\n<Summary>6</Summary>"
                              "Final Answer: 6")                                      # 1 path
    records[2]["solution"] = "x" * 300                                                # too long
    printed = []
    ex = sft.tokenize_records(records, tok, "bare", 256, log=printed.append)
    assert len(ex) == 2
    assert printed == [("2 examples from 4 records with a solution: dropped 1 longer than "
                        "max_length=256 tokens and 1 with a malformed parallel structure (first: "
                        "t1: block at token 0 has 1 path(s), needs >= 2)")]
    with pytest.raises(ValueError, match="no training examples left out of 1 records"):
        sft.tokenize_records(records[2:3], tok, "bare", 256, log=lambda *a: None)
    with pytest.raises(ValueError, match="does not have '<Parallel>' as one token"):
        sft.tokenize_records(records, build_char_tokenizer(), "bare", 256)
    with pytest.raises(ValueError, match="no solution"):
        sft.tokenize_records([dict(records[0], solution=None)], tok, "bare", 256)
    printed = []                              # one record without a solution aborted its whole file
    assert len(sft.tokenize_records([dict(records[0], solution=None), records[3]], tok, "bare",
                                    256, log=printed.append)) == 1
    assert printed == ["dropped 1 of 2 records without a solution to train on"]
    # a bool word, not a folder
    assert plumbing.resume_path(config(model_dir, tmp_path, resume="False")) == ""
    with pytest.raises(FileNotFoundError, match="not a checkpoint folder"):
        sft.train(config(model_dir, tmp_path, resume=str(tmp_path / "nope")), records=records)
    with pytest.raises(FileNotFoundError, match="found no checkpoint"):
        sft.train(config(model_dir, tmp_path, resume="True"), records=records)
    with pytest.raises(FileNotFoundError, match="no folder"):              # a path, not a hub name
        sft.train(config(str(tmp_path / "no_model"), tmp_path), records=records)
    with pytest.raises(ValueError, match="launch with torchrun"):
        sft.train(config(model_dir, tmp_path, fsdp=True), records=records)
    with pytest.raises(ValueError, match="does not split evenly over 3 ranks"):
        sft.resolve_defaults(sft.SFTConfig(batch_size=8), world_size=3)
    # --resume of a grpo.py checkpoint: a clear error that says to pass it as --model
    grpo_ckpt = tmp_path / "grpo_run" / "checkpoint-3"
    grpo_ckpt.mkdir(parents=True)
    torch.save({"config": {"recipe": "unseen-s1", "lr": 5e-5}}, grpo_ckpt / "trainer_state.pt")
    with pytest.raises(ValueError, match="was written by grpo.py.*pass --model="):
        plumbing.parse_args(sft.SFTConfig, [f"--resume={grpo_ckpt}"])


def test_a_run_keeps_the_users_folders_and_its_own_start(model_dir, tmp_path):
    """checkpoint-best and checkpoint-3-backup were deleted by the pruning or moved by a resume; a
    --model inside out_dir was moved aside by the fresh run that started from it (a later resume
    then found no model)."""
    run = tmp_path / "run"
    sft.train(config(model_dir, run, max_steps=3, save_every=1, keep_last=1),
              records=make_records(8))
    for name in ("checkpoint-best", "checkpoint-3-backup", "checkpoint-03"):
        shutil.copytree(run / "checkpoint-3", run / name)
    sft.train(config(model_dir, run, max_steps=5, save_every=1, keep_last=1, resume="True"),
              records=make_records(8))
    kept = ["checkpoint-03", "checkpoint-3-backup", "checkpoint-5", "checkpoint-best", "log.jsonl",
            "resumes.jsonl", "settings.json"]
    assert sorted(os.listdir(run)) == kept
    with pytest.raises(ValueError, match="is inside --out_dir=.*pass another --out_dir"):
        sft.train(config(str(run / "checkpoint-5"), run, max_steps=1), records=make_records(8))
    os.symlink(run, tmp_path / "link")                   # the same folder by another name
    with pytest.raises(ValueError, match="is inside --out_dir"):
        sft.train(config(str(tmp_path / "link" / "checkpoint-5"), run, max_steps=1),
                  records=make_records(8))
    assert sorted(os.listdir(run)) == kept


def test_the_preset_is_chosen_by_name_never_by_the_vocabulary(model_dir, tmp_path, monkeypatch,
                                                               capsys):
    """--preset=auto gives tiny for --model=tiny and for a checkpoint of a tiny-preset run; a model
    with a small tokenizer of its own and no such run gets the paper's, and the run says which (a
    vocabulary under 1,000 entries chose tiny before, silently); --preset names one; --preset=none
    asks for what a preset would set."""
    class Resolved(Exception):
        pass

    def load(cfg, *args, **kw):
        raise Resolved(cfg)

    monkeypatch.setattr(plumbing, "load_run", load)

    def resolved(**fields) -> sft.SFTConfig:
        with pytest.raises(Resolved) as e:
            sft.train(sft.SFTConfig(**fields), records=make_records(4))
        return e.value.args[0]

    cfg = resolved(model=model_dir)
    assert (cfg.preset, cfg.lr, cfg.batch_size, cfg.epochs) == ("paper", 1e-5, 128, 5.0)
    assert "preset paper (auto: not the embedded model" in capsys.readouterr().out
    cfg = resolved(model=model_dir, preset="tiny")
    assert (cfg.preset, cfg.lr, cfg.batch_size, cfg.max_steps) == ("tiny", 1e-3, 32, 400)
    assert "preset tiny (--preset=tiny)" in capsys.readouterr().out
    model, tok = small_model()
    trained = save_checkpoint(str(tmp_path / "ckpt"), model, tok,
                              trainer_state={"config": {"preset": "tiny"}})
    assert resolved(model=trained).preset == "tiny"
    assert "preset tiny (auto: the run that wrote" in capsys.readouterr().out
    assert resolved(model="tiny").lr == 1e-3
    with pytest.raises(ValueError, match="--preset=none sets nothing: give --batch_size, "
                                         "--grad_checkpointing, --lr, --max_time, "
                                         "--micro_batch_size, --warmup_ratio"):
        sft.resolve_defaults(sft.SFTConfig(preset="none", max_steps=3))
    with pytest.raises(ValueError, match="--preset=none: give --max_steps or --epochs"):
        sft.resolve_defaults(sft.SFTConfig(preset="none", lr=1e-3, batch_size=8,
                                           micro_batch_size=8, warmup_ratio=0.0, max_time=0.0,
                                           grad_checkpointing=False))


def test_quick_eval_skips_problems_longer_than_the_context():
    """The end-of-run greedy check samples only problems whose prompt + budget fit the 512-token
    context."""
    model, tok = load_model("tiny", seed=0)
    records = [{"problem": "x" * 500, "answer": "1"}, {"problem": "Ava has 2 pens.", "answer": "2"},
               {"problem": "y" * 496, "answer": "3"}, {"problem": "Ben has 3 pens.", "answer": "3"}]
    # prompts: 500 + 1 = 501 and 496 + 1 = 497 tokens; with 16 new tokens only the two short ones
    # fit
    out = ev.quick_eval(model, tok, records, "unseen", n=2, max_new_tokens=16,
                         prompt_style="bare")
    assert out["n"] == 2
    assert len(out["notes"]) == 1 and "2 of 4 problems have a prompt + max_new_tokens (16) " \
        "longer than the model's context (512 tokens" in out["notes"][0]


WALL_CLOCK = ("elapsed", "tokens_per_s")        # log fields that measure time, not the run


def test_same_seed_same_run_bit_for_bit(model_dir, tmp_path):
    """Two fresh runs with the same seed and thread count: equal weights and log rows (wall-clock
    fields aside)."""
    runs = [sft.train(config(model_dir, tmp_path / d, max_steps=3, save_every=0),
                      records=make_records(10))
            for d in "ab"]
    wa, wb = (load_file(os.path.join(r["checkpoint"], "model.safetensors")) for r in runs)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    rows = [[{k: v for k, v in json.loads(line).items() if k not in WALL_CLOCK}
             for line in (tmp_path / d / "log.jsonl").read_text().splitlines()]
            for d in "ab"]
    assert len(rows[0]) == 3 and rows[0] == rows[1]


def test_wandb_gets_the_rows_of_log_jsonl(model_dir, tmp_path, wandb_rows):
    logged = wandb_rows
    sft.train(config(model_dir, tmp_path / "run", max_steps=2, save_every=0, wandb_project="test"),
              records=make_records(10))
    rows = (tmp_path / "run" / "log.jsonl").read_text().splitlines()
    assert logged == [json.loads(line) for line in rows] and len(logged) == 2
    assert {"step", "loss", "lr", "grad_norm"} <= logged[0].keys()
    # the offline run, finished, and the keys in it: wandb's service may still be writing it under
    # load
    pattern = str(tmp_path / "run" / "wandb" / "offline-run-*" / "run-*.wandb")
    wait_until(lambda: glob.glob(pattern), "wandb's offline run file")
    runs = glob.glob(pattern)
    assert len(runs) == 1
    run_file = Path(runs[0])
    wait_until(lambda: all(k.encode() in run_file.read_bytes() for k in logged[0]),
               "the logged keys in wandb's run file")
    assert all(k.encode() in run_file.read_bytes() for k in logged[0])


def test_a_wandb_start_that_fails_changes_nothing(model_dir, tmp_path, monkeypatch):
    """A missing login is one ValueError, and neither a new out_dir nor an earlier run in a used one
    is touched (the start once came after the earlier run was moved aside and the log opened)."""
    wandb = pytest.importorskip("wandb", reason="optional: pip install -r requirements-extra.txt")

    def no_login(**kw):
        raise wandb.errors.UsageError("api_key not configured (no-tty)")
    monkeypatch.setattr(wandb, "init", no_login)
    records = make_records(10)
    with pytest.raises(ValueError, match="WANDB_MODE=offline"):
        sft.train(config(model_dir, tmp_path / "new", max_steps=1, wandb_project="p"),
                  records=records)
    assert not (tmp_path / "new").exists()
    sft.train(config(model_dir, tmp_path / "used", max_steps=1, save_every=0), records=records)
    before = sorted(os.listdir(tmp_path / "used"))
    with pytest.raises(ValueError, match="WANDB_MODE=offline"):
        sft.train(config(model_dir, tmp_path / "used", max_steps=1, wandb_project="p"),
                  records=records)
    assert sorted(os.listdir(tmp_path / "used")) == before == ["checkpoint-1", "log.jsonl",
                                                               "settings.json"]


def test_a_diverged_loss_stops_before_the_step_and_keeps_the_checkpoints(model_dir, tmp_path):
    """--lr=1e3 once ran to the end, saved a NaN checkpoint and reported "format valid 100%" for
    <pad> samples; eval.py and sample.py then crashed on it. Now the first non-finite gradient norm
    stops the run."""
    records, run = make_records(10), tmp_path / "run"
    sft.train(config(model_dir, run, max_steps=2, save_every=2), records=records)
    with pytest.raises(ValueError, match="the gradient norm is (nan|inf): the loss diverged"):
        sft.train(config(model_dir, run, resume=str(run / "checkpoint-2"), max_steps=12, lr=1e3,
                         save_every=0, allow_changes="lr"),
                  records=records)
    state = load_file(run / "checkpoint-2" / "model.safetensors")
    listing = [".lock", "checkpoint-2", "log.jsonl", "resumes.jsonl", "settings.json"]
    assert sorted(os.listdir(run)) == listing and \
        all(torch.isfinite(v).all() for v in state.values())


def test_resuming_an_older_checkpoint_moves_the_abandoned_newer_ones_aside(model_dir, tmp_path,
                                                                           capsys):
    """Resuming checkpoint-2 of a run that reached checkpoint-4 once left checkpoint-4 in place, and
    a later --resume=True continued it: the abandoned run, not the one just trained."""
    records, run = make_records(10), tmp_path / "run"
    sft.train(config(model_dir, run, max_steps=4, save_every=2), records=records)
    sft.train(config(model_dir, run, resume=str(run / "checkpoint-2"), max_steps=3, save_every=0),
              records=records)
    assert sorted(os.listdir(run)) == ["checkpoint-2", "checkpoint-3", "earlier-1", "log.jsonl",
                                       "resumes.jsonl", "settings.json"]
    assert sorted(os.listdir(run / "earlier-1")) == ["checkpoint-4", "log.jsonl"] and \
        "moved the checkpoints after step 2" in capsys.readouterr().out
    earlier_log = (run / "earlier-1" / "log.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in earlier_log] == [1, 2, 3, 4]   # once lost
    assert plumbing.find_latest_checkpoint(str(run)) == str(run / "checkpoint-3")


def test_a_folder_that_a_live_run_writes_is_refused(model_dir, tmp_path):
    """Two runs into one out_dir once interleaved their log.jsonl lines. A live process's lock
    refuses the second run before anything moves; a lock whose process is gone is taken over, and a
    finished run leaves none."""
    records, run = make_records(10), tmp_path / "run"
    sft.train(config(model_dir, run, max_steps=1, save_every=0), records=records)
    # the other process lives until it is killed (or its stdin closes), however slow the run is
    other_command = [sys.executable, "-c", "import sys; sys.stdin.read()"]
    with subprocess.Popen(other_command, stdin=subprocess.PIPE) as other:
        (run / ".lock").write_text(str(other.pid))
        with pytest.raises(ValueError, match=f"being written by another run \\(pid {other.pid}\\)"):
            sft.train(config(model_dir, run, max_steps=1, save_every=0), records=records)
        assert sorted(os.listdir(run)) == [".lock", "checkpoint-1", "log.jsonl", "settings.json"]
        other.kill()
    # that process is gone (leaving the with-block waited for it)
    sft.train(config(model_dir, run, max_steps=1, save_every=0), records=records)
    assert sorted(os.listdir(run)) == ["checkpoint-1", "earlier-1", "log.jsonl", "settings.json"]


def test_a_bad_batch_flag_stops_before_an_earlier_run_is_moved(model_dir, tmp_path):
    """--micro_batch_size=0 used to move the finished run aside and then fail (range() arg 3 must
    not be zero)."""
    records = make_records(10)
    sft.train(config(model_dir, tmp_path / "run", max_steps=1, save_every=0), records=records)
    for flag, value in (("batch_size", 0), ("micro_batch_size", 0), ("max_steps", 0),
                        ("max_steps", -3)):
        with pytest.raises(ValueError, match=f"--{flag}={value}: must be at least 1"):
            sft.train(config(model_dir, tmp_path / "run", **{"max_steps": 1, flag: value}),
                      records=records)
    for flag in ("limit", "eval_samples", "warmup_ratio", "grad_clip", "max_time", "log_every",
                 "save_every", "keep_last"):
        with pytest.raises(ValueError, match=f"--{flag}=-1: must be at least 0"):
            sft.train(config(model_dir, tmp_path / "run", **{"max_steps": 1, flag: -1}),
                      records=records)
    for flag in ("warmup_ratio", "grad_clip", "weight_decay"):     # NaN passed every "< 0" check
        with pytest.raises(ValueError, match=f"--{flag}=nan: must be a finite number, at least 0"):
            sft.train(config(model_dir, tmp_path / "run", **{"max_steps": 1, flag: float("nan")}),
                      records=records)
    for kw, msg in [(dict(warmup_ratio=1.5),
                     "--warmup_ratio=1.5: must be at least 0 and at most 1$"),
                    # moved the run, saved nothing
                    (dict(max_steps=None, epochs=0.0), "^--epochs=0.0: must be above 0"),
                    (dict(lr=float("inf")), "^--lr=inf: must be a finite number, above 0")]:
        with pytest.raises(ValueError, match=msg):
            sft.train(config(model_dir, tmp_path / "run", **{"max_steps": 1, **kw}),
                      records=records)
    assert sorted(os.listdir(tmp_path / "run")) == ["checkpoint-1", "log.jsonl", "settings.json"]


if __name__ == "__main__":                   # torchrun worker of test_two_ranks_equal_one_process
    _worker(*sys.argv[1:3])


def test_the_final_loss_is_the_last_steps(model_dir, tmp_path, monkeypatch, capsys):
    """The end-of-run "final loss" was the mean of the last 10 steps; now it is the last step's
    loss, and the mean over the last LOSS_WINDOW steps is printed beside it under its own name."""
    monkeypatch.setattr(sft, "LOSS_WINDOW", 2)
    summary = sft.train(config(model_dir, tmp_path / "run", max_steps=3, save_every=0),
                        records=make_records(10))
    logged = [json.loads(line)["loss"]
              for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert len(logged) == 3 and len(set(logged)) == 3
    last_two = (logged[1] + logged[2]) / 2
    assert summary["final_loss"] == logged[2]
    assert (summary["mean_loss_last_steps"], summary["loss_window"]) == (last_two, 2)
    out = capsys.readouterr().out
    assert "SFT done at step 3 of 3: 3 steps in " in out
    assert " examples of the given records, mode=" in out     # said --data's default
    assert f"s, final loss {logged[2]:.4f} (the last step's; the mean of the last 2 steps " \
        f"{last_two:.4f})\n" in out
    # a resume: the line said "5 steps in <the seconds of the 2 this start trained>"
    resumed = sft.train(config(model_dir, tmp_path / "run", max_steps=5, save_every=0,
                               resume=str(tmp_path / "run" / "checkpoint-3")),
                        records=make_records(10))
    logged = [json.loads(line)["loss"]
              for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert (resumed["steps"], resumed["trained_steps"], resumed["final_loss"]) == (5, 2, logged[4])
    assert "SFT done at step 5 of 5: 2 steps in " in capsys.readouterr().out


def test_elapsed_counts_on_across_a_resume(model_dir, tmp_path):
    """A checkpoint keeps the run's training seconds (the last logged row's "elapsed"); a resumed
    run's rows count on from them, not from 0 (they once restarted in every new process). The
    checkpoint's value is set to 1000 s here, so the resumed rows must read 1000 s and more."""
    records = make_records(10)
    sft.train(config(model_dir, tmp_path / "run", max_steps=2, save_every=0), records=records)
    rows = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    state_file = tmp_path / "run" / "checkpoint-2" / "trainer_state.pt"
    state = torch.load(state_file, weights_only=False)
    assert state["elapsed"] == rows[-1]["elapsed"]
    state["elapsed"] = 1000.0
    torch.save(state, state_file)
    sft.train(config(model_dir, tmp_path / "run", max_steps=4, save_every=0, resume="True"),
              records=records)
    rows = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows[-2:]] == [3, 4]
    assert 1000.0 < rows[-2]["elapsed"] < rows[-1]["elapsed"] < 1000.0 + 600.0
