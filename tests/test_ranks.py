"""What would stop a first run on a GPU node (issue 39): the process group's timeout, the CUDA
allocator's settings, and the host memory of the ranks loading the model. Each test failed with its
fix undone."""
import datetime
import json
import os

import pytest
import torch
import torch.distributed as dist
from conftest import ROOT, torchrun_two_ranks

import config
import grpo
import plumbing
import sft
from model import load_model

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
