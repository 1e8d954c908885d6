"""Sharded and asynchronous checkpoints (--checkpoint=sharded|async, plumbing.Run.save_sharded) on
2 gloo ranks under FSDP2, the small Qwen3 of test_sft: a resume from a sharded checkpoint ends with
the weights of an uninterrupted run, bit for bit, and with those of the same run saving full
checkpoints; an async save is whole, named and loadable when the next save starts and when
training returns, though every write is slowed to outlast a step.

Run as a script (`torchrun --nproc_per_node=2 tests/test_checkpoints.py resume|async <folder>`)
it is the worker of the tests below."""
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)                     # also when run by torchrun as a script

import torch
from conftest import torchrun_two_ranks
from safetensors.torch import load_file
from test_sft import config, make_records, small_model
from torch.distributed.checkpoint import filesystem

import plumbing
import sft
from model import load_model, sharded_checkpoint
from plumbing import save_checkpoint

STEPS = 4
SLOW_WRITE_SECONDS = 2.0     # each rank's shard write in the async run: longer than a step


def weights(folder) -> dict:
    """A checkpoint's weights as model.load_model reads them (full or sharded), as eval.py does."""
    model, _ = load_model(str(folder), device="cpu")
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def losses(folder) -> list[float]:
    with open(os.path.join(folder, "log.jsonl")) as f:
        return [json.loads(line)["loss"] for line in f]


def test_a_sharded_resume_equals_an_uninterrupted_run(tmp_path):
    """FSDP2 on 2 ranks, 4 SFT steps saving sharded checkpoints at steps 2 and 4; --resume from
    checkpoint-2 (a third process group: the shards read back by each rank) to step 4; and the
    same run saving full checkpoints. checkpoint-4's weights are equal bit for bit in all three,
    read by load_model as eval.py reads them; checkpoint-2 holds shards and no model.safetensors,
    and its weights equal the full checkpoint's file."""
    model, tok = small_model()
    init = save_checkpoint(str(tmp_path / "init"), model, tok)
    torchrun_two_ranks(__file__, "resume", str(tmp_path), init)
    sharded = tmp_path / "sharded"
    assert sharded_checkpoint(str(sharded / "checkpoint-2"))
    assert not (sharded / "checkpoint-2" / "model.safetensors").exists()
    full_2 = load_file(tmp_path / "full" / "checkpoint-2" / "model.safetensors")
    sharded_2 = weights(sharded / "checkpoint-2")
    assert all(torch.equal(full_2[k], sharded_2[k]) for k in full_2)
    end = weights(sharded / "checkpoint-4")
    assert same(weights(tmp_path / "resumed" / "checkpoint-4"), end)
    assert same(weights(tmp_path / "full" / "checkpoint-4"), end)
    assert not same(sharded_2, end)                                  # it trained
    assert losses(tmp_path / "resumed") == losses(sharded)[2:]


def test_an_async_save_is_whole_before_the_next_save_and_at_the_end(tmp_path):
    """FSDP2 on 2 ranks, 3 SFT steps with an async checkpoint after each (keep_last=2), every
    shard write slowed by SLOW_WRITE_SECONDS, so that each save is still being written when the
    next step ends: when training returns, checkpoint-2 and checkpoint-3 are there, whole, and
    hold the weights of the same run's synchronous sharded checkpoints bit for bit (so the shards
    were copied before training changed them); checkpoint-1 was pruned, no temporary folder is
    left; and as each save began, the one before it was there under its name. A run whose step
    2 raises while step 1's save is being written leaves checkpoint-1 named when the error
    leaves sft.train (plumbing.distributed waits for it)."""
    model, tok = small_model()
    init = save_checkpoint(str(tmp_path / "init"), model, tok)
    torchrun_two_ranks(__file__, "async", str(tmp_path), init)
    with open(tmp_path / "at_return.json") as f:
        assert json.load(f) == ["checkpoint-2", "checkpoint-3", "log.jsonl", "settings.json"]
    with open(tmp_path / "at_save.json") as f:
        at_save = json.load(f)
    assert at_save == [[1, []], [2, ["checkpoint-1"]], [3, ["checkpoint-1", "checkpoint-2"]]]
    with open(tmp_path / "at_failure.json") as f:
        assert json.load(f) == ["checkpoint-1"]
    for step in (2, 3):
        got = tmp_path / "async" / f"checkpoint-{step}"
        assert sharded_checkpoint(str(got))
        assert same(weights(got), weights(tmp_path / "sync" / f"checkpoint-{step}")), step


def test_one_process_saves_async_and_resumes_from_its_shards(tmp_path):
    """Without torchrun (no process group: DCP writes and reads alone), 4 steps with an async
    checkpoint at steps 2 and 4, and a resume from checkpoint-2: equal bit for bit."""
    model, tok = small_model()
    init = save_checkpoint(str(tmp_path / "init"), model, tok)
    records = make_records(16)
    settings = dict(max_steps=STEPS, keep_last=0, save_every=2, checkpoint="async")
    sft.train(config(init, tmp_path / "a", **settings), records=records)
    sft.train(config(init, tmp_path / "b", resume=str(tmp_path / "a" / "checkpoint-2"),
                     **settings), records=records)
    assert sharded_checkpoint(str(tmp_path / "a" / "checkpoint-2"))
    assert same(weights(tmp_path / "a" / "checkpoint-4"), weights(tmp_path / "b" / "checkpoint-4"))
    assert losses(tmp_path / "b") == losses(tmp_path / "a")[2:]


def slow_writes() -> None:
    """Every shard write (in the async save's thread) first sleeps SLOW_WRITE_SECONDS."""
    real = filesystem._FileSystemWriter.write_data

    def slow(self, *args, **kwargs):
        time.sleep(SLOW_WRITE_SECONDS)
        return real(self, *args, **kwargs)

    filesystem._FileSystemWriter.write_data = slow


def worker(mode: str, folder: str, init: str) -> None:
    records = make_records(16)
    settings = dict(max_steps=STEPS, fsdp=True, keep_last=0, save_every=2)
    if mode == "resume":
        sft.train(config(init, os.path.join(folder, "full"), **settings), records=records)
        sharded = os.path.join(folder, "sharded")
        sft.train(config(init, sharded, checkpoint="sharded", **settings), records=records)
        sft.train(config(init, os.path.join(folder, "resumed"), checkpoint="sharded",
                         resume=os.path.join(sharded, "checkpoint-2"), **settings),
                  records=records)
        return
    settings.update(max_steps=3, save_every=1, keep_last=2)
    sft.train(config(init, os.path.join(folder, "sync"), checkpoint="sharded", **settings),
              records=records)
    slow_writes()
    out_dir = os.path.join(folder, "async")
    at_save = []
    real_save = plumbing.Run.save_sharded

    def recording_save(run, path, state):      # the checkpoints there as each save begins
        names = [os.path.basename(p) for _, p in plumbing.checkpoints(out_dir)]
        at_save.append([run.step, names])
        return real_save(run, path, state)

    plumbing.Run.save_sharded = recording_save
    sft.train(config(init, out_dir, checkpoint="async", **settings), records=records)
    if int(os.environ["RANK"]) == 0:      # what is there the moment training returns
        with open(os.path.join(folder, "at_return.json"), "w") as f:
            json.dump(sorted(os.listdir(out_dir)), f)
        with open(os.path.join(folder, "at_save.json"), "w") as f:
            json.dump(at_save, f)
    plumbing.Run.save_sharded = real_save
    real_step = sft.sft_step

    def failing_step(run, examples, stream):
        if run.step == 2:
            raise ValueError("step 2 fails")
        return real_step(run, examples, stream)

    sft.sft_step = failing_step
    failing = os.path.join(folder, "failing")
    try:
        sft.train(config(init, failing, checkpoint="async", **settings), records=records)
    except ValueError:
        names = [os.path.basename(p) for _, p in plumbing.checkpoints(failing)]
    else:
        raise AssertionError("step 2 did not fail")
    if int(os.environ["RANK"]) == 0:      # what is there the moment the error leaves train
        with open(os.path.join(folder, "at_failure.json"), "w") as f:
            json.dump(names, f)


if __name__ == "__main__":                   # the torchrun worker of the tests above
    torch.set_num_threads(1)
    # one process group for all the runs (each run's own would be torn down and made again, and a
    # gloo group made again under the same name can meet the last one's addresses: a hang)
    with plumbing.distributed():
        worker(*sys.argv[1:])
