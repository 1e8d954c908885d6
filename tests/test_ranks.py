"""What would stop a first run on a GPU node (issue 39): the process group's timeout, the CUDA
allocator's settings, and the host memory of the ranks loading the model; and what would make its
results depend on the rank count (issue 46). Each test failed with its fix undone.

Run as a script (`torchrun --nproc_per_node=2 tests/test_ranks.py <dir>`) it is the worker of
test_grpo_on_two_ranks_equals_one_rank."""
import datetime
import json
import os
import pickle
import sys

import pytest
import torch
import torch.distributed as dist
from conftest import ROOT, torchrun_two_ranks

import config
import grpo
import plumbing
import sft
from model import load_model

GRPO_SETTINGS = dict(preset="tiny", batch_size=4, group_size=2, ppo_mini_batches=2,
                     micro_batch_size=2, max_new_tokens=12, lr=1e-3, max_steps=3, max_time=0.0,
                     eval_data="", save_every=0, log_every=0)
RECORDS = [{"id": str(i), "problem": f"Ava has {i} pens and {i + 2} cups.", "answer": str(i)}
           for i in range(7)]

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
    """2 gloo ranks load a checkpoint as plumbing.load_run does (scripts/bench_load.py): rank 1
    begins after rank 0 has finished, so a node holds one rank's host copy at a time."""
    folder = str(tmp_path / "model")
    model, tok = load_model("tiny", seed=0)
    plumbing.save_checkpoint(folder, model, tok)
    out = str(tmp_path / "load.json")
    torchrun_two_ranks(os.path.join(ROOT, "scripts", "bench_load.py"), f"--model={folder}",
                       f"--out={out}")
    with open(out) as f:
        rows = sorted(json.load(f), key=lambda r: r["rank"])
    assert [r["rank"] for r in rows] == [0, 1]
    assert rows[0]["end"] <= rows[1]["start"]
    params = sum(p.numel() * 4 for p in model.parameters())
    assert [r["param_bytes"] for r in rows] == [params, params]


def text_reward(responses, golds, **kw):
    """A reward with variance in every group even for a random model: a function of the text."""
    return [{"reward": float(sum(map(ord, t)) % 7), "correct": False, "kind": "accuracy"}
            for t in responses]


def grpo_recording_rollouts(cfg, folder: str, rank: int) -> None:
    """grpo.train on RECORDS with text_reward; each step's rollouts by their place in the global
    batch (place, response index): token ids and log-probs, into folder/rollouts-<rank>.pkl."""
    grpo.score_batch = text_reward
    real = grpo.sample_rollouts
    seen = []

    def recording(model, tokenizer, prompts, cfg, seed, places=None, stop=None):
        rollouts = real(model, tokenizer, prompts, cfg, seed, places=places, stop=stop)
        for i, r in enumerate(rollouts):
            place = (seed, places[r.prompt_index], i % cfg.group_size)
            seen.append((place, r.response_ids, r.logprobs))
        return rollouts

    grpo.sample_rollouts = recording
    try:
        grpo.train(cfg, records=RECORDS)
    finally:
        grpo.sample_rollouts = real
        grpo.score_batch = real_score_batch
    with open(os.path.join(folder, f"rollouts-{rank}.pkl"), "wb") as f:
        pickle.dump(seen, f)


real_score_batch = grpo.score_batch


def test_grpo_on_two_ranks_equals_one_rank(tmp_path):
    """GRPO on 2 gloo ranks and on 1 process at the same global batch (4 prompts x 2, 2 PPO
    mini-batches, rewards that differ within every group): the same rollouts at every step,
    token for token, with log-probs and, after 3 steps, weights equal to 1e-6. Each prompt's
    responses are seeded by its place in the global batch, and each rank takes its share of both
    mini-batches (grpo.rank_places); seeded by rank (the old plumbing.rollout_seed), step 1's
    rollouts already differ."""
    model, tok = load_model("tiny", seed=1)
    init = plumbing.save_checkpoint(str(tmp_path / "init"), model, tok)
    torchrun_two_ranks(__file__, str(tmp_path), init)
    one = grpo.GRPOConfig(**GRPO_SETTINGS, model=init, out_dir=str(tmp_path / "one"))
    grpo_recording_rollouts(one, str(tmp_path), rank=-1)
    loaded = {}
    for name in ("rollouts--1", "rollouts-0", "rollouts-1"):
        with open(tmp_path / f"{name}.pkl", "rb") as f:
            loaded[name] = pickle.load(f)
    alone = sorted(loaded["rollouts--1"])
    together = sorted(loaded["rollouts-0"] + loaded["rollouts-1"])
    assert len(alone) == len(together) == 3 * 4 * 2
    assert [p for p, _, _ in alone] == [p for p, _, _ in together]
    for (place, ids_a, logprobs_a), (_, ids_b, logprobs_b) in zip(alone, together):
        assert ids_a == ids_b, place
        assert torch.allclose(torch.tensor(logprobs_a), torch.tensor(logprobs_b), atol=1e-6), place
    from safetensors.torch import load_file
    a = load_file(str(tmp_path / "one" / "checkpoint-3" / "model.safetensors"))
    b = load_file(str(tmp_path / "two" / "checkpoint-3" / "model.safetensors"))
    w0 = load_file(os.path.join(init, "model.safetensors"))
    gap = max((a[k] - b[k]).abs().max().item() for k in a)
    assert gap <= 1e-6, f"1 rank and 2 ranks: weights {gap:.2e} apart after 3 steps"
    assert max((a[k] - w0[k]).abs().max().item() for k in a) > 1e-4      # it trained


if __name__ == "__main__":                   # the torchrun worker of test_grpo_on_two_ranks_...
    folder, init = sys.argv[1:]
    two = grpo.GRPOConfig(**GRPO_SETTINGS, model=init, out_dir=os.path.join(folder, "two"))
    grpo_recording_rollouts(two, folder, int(os.environ["RANK"]))
