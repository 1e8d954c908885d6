"""Run folders and bad input: each case either changed something the user did not point at or
explained itself badly (a library traceback naming no flag or file). Each test failed before its
fix."""
import dataclasses
import gzip
import json
import os
import subprocess
import sys
import time

import pytest
import torch

import eval as ev
import grpo
import plumbing
import sft
from data import load_data
from model import load_model
from plumbing import save_checkpoint


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    """The tiny model saved as a checkpoint folder (no training state)."""
    folder = tmp_path_factory.mktemp("model") / "model"
    model, tok = load_model("tiny", seed=3)
    return save_checkpoint(str(folder), model, tok)


def sft_config(model: str, out_dir, **kw) -> sft.SFTConfig:
    fields = dict(model=model, preset="tiny", out_dir=str(out_dir), max_steps=1, save_every=0,
                  eval_samples=0,
                  batch_size=4, micro_batch_size=4, limit=8, log_every=0)
    fields.update(kw)
    return sft.SFTConfig(**fields)


@pytest.fixture(scope="module")
def finished_run(small_model, tmp_path_factory):
    """A 1-step SFT run: its folder holds checkpoint-1 with a trainer state."""
    out = tmp_path_factory.mktemp("run") / "original"
    sft.train(sft_config(small_model, out))
    return out


def test_a_resume_of_a_copy_writes_into_the_copy(finished_run, tmp_path):
    """--resume=<copy>/checkpoint-1 without --out_dir wrote into the original run's folder (the
    saved config's out_dir) and moved its newer checkpoints aside; the copy was untouched."""
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(finished_run), str(copy)], check=True)
    before = sorted(os.listdir(finished_run))
    cfg = plumbing.parse_args(sft.SFTConfig, [f"--resume={copy}/checkpoint-1", "--max_steps=2"])
    assert os.path.realpath(cfg.out_dir) == os.path.realpath(copy)
    sft.train(cfg)
    assert "checkpoint-2" in os.listdir(copy)
    assert sorted(os.listdir(finished_run)) == before
    elsewhere = tmp_path / "elsewhere"                  # --out_dir still says where, if given
    cfg = plumbing.parse_args(sft.SFTConfig, [f"--resume={copy}/checkpoint-1",
                                              f"--out_dir={elsewhere}"])
    assert cfg.out_dir == str(elsewhere)


def test_a_resume_refuses_another_preset(finished_run):
    """The run trained under the tiny preset (saved with its config): --preset=paper on a resume
    would relabel it and change its settings mid-run, so it is refused; --preset=auto is
    accepted (it resolves to the run's own when the run sets up)."""
    checkpoint = f"--resume={finished_run}/checkpoint-1"
    with pytest.raises(ValueError, match="--preset=paper with --resume=.* that run trains with "
                                         "--preset=tiny"):
        plumbing.parse_args(sft.SFTConfig, [checkpoint, "--preset=paper"])
    assert plumbing.parse_args(sft.SFTConfig, [checkpoint, "--preset=auto"]).resume


def test_a_resume_refuses_another_model(finished_run, small_model):
    """sft.py --resume ignored --model without a word and saved it into the checkpoint's config."""
    checkpoint = f"{finished_run}/checkpoint-1"
    with pytest.raises(ValueError, match="--model=tiny with --resume=.*drop --model"):
        plumbing.parse_args(sft.SFTConfig, [f"--resume={checkpoint}", "--model=tiny"])
    same = plumbing.parse_args(sft.SFTConfig, [f"--resume={checkpoint}", f"--model={small_model}"])
    assert same.model == small_model
    saved_mode = same.mode                      # nor another mode (grpo: recipe), said nothing
    other_mode = "seen" if saved_mode == "unseen" else "unseen"
    with pytest.raises(ValueError, match=f"--mode={other_mode} with --resume=.*drop --mode"):
        plumbing.parse_args(sft.SFTConfig, [f"--resume={checkpoint}", f"--mode={other_mode}"])
    again = plumbing.parse_args(sft.SFTConfig, [f"--resume={checkpoint}", f"--mode={saved_mode}"])
    assert again.mode == saved_mode


def test_a_resume_whose_start_model_moved_takes_its_new_place(small_model, tmp_path):
    """A checkpoint whose start model is no longer where it was saved (moved, or a relative path
    read from another folder) could not resume: the start model was not found, and --model was
    refused ("drop --model"). Now --model names its new place; while it is still there, another
    --model is refused as before, and the same folder by another path is accepted."""
    start = tmp_path / "start"
    subprocess.run(["cp", "-r", small_model, str(start)], check=True)
    run = tmp_path / "run"
    sft.train(sft_config(str(start), run))
    checkpoint = f"{run}/checkpoint-1"
    with pytest.raises(ValueError, match="drop --model"):
        plumbing.parse_args(sft.SFTConfig, [f"--resume={checkpoint}", f"--model={small_model}"])
    relative = os.path.relpath(start)
    same = plumbing.parse_args(sft.SFTConfig, [f"--resume={checkpoint}", f"--model={relative}"])
    assert os.path.realpath(same.model) == os.path.realpath(start)
    moved = tmp_path / "moved"
    os.rename(start, moved)
    cfg = plumbing.parse_args(sft.SFTConfig, [f"--resume={checkpoint}", f"--model={moved}"])
    assert cfg.model == str(moved)


def test_eval_refuses_a_folder_a_live_run_writes(small_model, tmp_path):
    """eval.py wrote its samples into a folder whose training run was still writing it."""
    out = tmp_path / "busy"
    out.mkdir()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (out / ".lock").write_text(str(other.pid))
        with pytest.raises(ValueError, match=f"--out_dir={out} is being written by another run"):
            ev.run(ev.EvalConfig(model=small_model, preset="tiny", out_dir=str(out), limit=1, k=1))
        assert sorted(os.listdir(out)) == [".lock"]
    finally:
        other.kill()
        other.wait()
    ev.run(ev.EvalConfig(model=small_model, preset="tiny", out_dir=str(out), limit=1, k=1,
                         data="synthetic:easy:test", max_new_tokens=8))
    assert ".lock" not in os.listdir(out) and "summary.json" in os.listdir(out)


def test_grpo_from_the_untrained_tiny_model_says_so(capsys):
    assert plumbing.default_init("unseen", "tiny") == "tiny"
    assert "--model=tiny is the embedded model with random weights" in capsys.readouterr().err


def test_an_out_dir_that_is_a_file_is_named(small_model, tmp_path):
    """It failed with "[Errno 17] File exists" after the weights loaded."""
    not_a_folder = tmp_path / "notes.txt"
    not_a_folder.write_text("mine")
    with pytest.raises(ValueError, match=f"--out_dir={not_a_folder} is a file, not a folder"):
        sft.train(sft_config(small_model, not_a_folder))
    with pytest.raises(ValueError, match=f"--out_dir={not_a_folder} is a file, not a folder"):
        ev.run(ev.EvalConfig(model=small_model, preset="tiny", out_dir=str(not_a_folder), limit=1,
                             k=1))
    assert not_a_folder.read_text() == "mine"


@pytest.mark.parametrize("script", [sft.SFTConfig, grpo.GRPOConfig])
@pytest.mark.parametrize("flag, message", [
    ("--seed=-1", "--seed=-1: must be at least 0 and at most 4294967295"),
    (f"--seed={2**32}", f"--seed={2**32}: must be at least 0 and at most 4294967295"),
    ("--betas=0.9,1.5", r"--betas=\(0.9, 1.5\): must be at least 0 and below 1"),
    ("--weight_decay=inf", "--weight_decay=inf: must be a finite number, at least 0"),
])
def test_settings_out_of_range_are_named_at_parse_time(script, flag, message):
    """A library traceback named no flag; an infinite weight decay was reported as a diverged
    loss."""
    with pytest.raises(ValueError, match=message):
        plumbing.parse_args(script, [flag])


def test_max_length_zero_is_refused():
    """--max_length=0 meant the model's context without a word."""
    with pytest.raises(ValueError, match="--max_length=0: must be at least 1"):
        plumbing.parse_args(sft.SFTConfig, ["--max_length=0"])


def test_a_damaged_tokenizer_is_named(small_model, tmp_path):
    """A damaged tokenizer.json gave JSON's own error, naming no file."""
    damaged = tmp_path / "damaged"
    subprocess.run(["cp", "-r", small_model, str(damaged)], check=True)
    (damaged / "tokenizer.json").write_text('{"broken": ')
    with pytest.raises(OSError, match="tokenizer.json or tokenizer_config.json may be damaged"):
        ev.own_tokenizer(str(damaged))
    with pytest.raises(OSError, match=f"cannot read the tokenizer in '{damaged}'"):
        load_model(str(damaged))


def test_a_bad_tokenizer_flag_is_named(tmp_path):
    """--tokenizer=<no such tokenizer> ended in the hub client's connection error."""
    with pytest.raises(OSError, match="--tokenizer=no-such-tokenizer: not a local folder, not in "
                       "the Hugging Face cache.* pass --tokenizer=<folder>"):
        load_model("tiny", tokenizer="no-such-tokenizer")


def test_data_files_that_are_not_data_are_named(tmp_path):
    """A .jsonl.gz gave a UnicodeDecodeError, a .json holding one object "not valid JSON", an
    upper-case .PARQUET "unknown dataset"."""
    packed = tmp_path / "train.jsonl.gz"
    with gzip.open(packed, "wt") as f:
        f.write('{"problem": "1+1", "answer": "2"}\n')
    with pytest.raises(ValueError, match=f"data file {packed}: read are .jsonl, .json and"):
        load_data(str(packed))
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"problem": "caf\xe9", "answer": "2"}\n')
    with pytest.raises(ValueError, match=f"data file {latin} is not UTF-8 text"):
        load_data(str(latin))
    one_object = tmp_path / "one.json"
    one_object.write_text(json.dumps({"problem": "1+1", "answer": "2"}, indent=2))
    with pytest.raises(ValueError, match="holds one JSON object, not records"):
        load_data(str(one_object))
    upper = tmp_path / "train.PARQUET"
    upper.write_bytes(b"not parquet")
    with pytest.raises(ValueError, match=f"data file {upper} is not a readable parquet file"):
        load_data(str(upper))
    as_list = tmp_path / "list.json"
    as_list.write_text(json.dumps([{"problem": "1+1", "answer": "2"}], indent=2))
    assert load_data(str(as_list))[0]["answer"] == "2"


def test_a_prompt_file_that_is_a_folder_is_named(tmp_path):
    from data import build_prompt
    tok = load_model("tiny")[1]
    with pytest.raises(FileNotFoundError, match="is a folder: name the template file in it"):
        build_prompt(tok, "1+1", prompt_file=str(tmp_path))


def test_ctrl_c_says_what_was_kept(tmp_path):
    """Before the first save it said the checkpoints were kept."""
    assert plumbing.interrupted("sft.py", str(tmp_path)) == \
        "sft.py: interrupted before its first checkpoint: nothing to resume from"
    assert plumbing.interrupted("sft.py", None).endswith("nothing to resume from")
    (tmp_path / "checkpoint-3").mkdir()
    assert plumbing.interrupted("grpo.py", str(tmp_path)) == (
        "grpo.py: interrupted; the checkpoints in out_dir are kept (--resume=True continues the "
        f"latest, {tmp_path}/checkpoint-3)")


def test_a_resume_into_a_locked_folder_refuses_before_it_says_resumed(finished_run, tmp_path,
                                                                       capsys):
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(finished_run), str(copy)], check=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (copy / ".lock").write_text(str(other.pid))
        time.sleep(0.1)
        with pytest.raises(ValueError, match="is being written by another run"):
            sft.train(plumbing.parse_args(sft.SFTConfig, [f"--resume={copy}/checkpoint-1",
                                                          "--max_steps=2"]))
    finally:
        other.kill()
        other.wait()
    assert "resumed from" not in capsys.readouterr().out


def test_a_model_that_is_a_file_is_named(tmp_path):
    """--model=README.md gave transformers' "config file ... is not a valid JSON file"."""
    not_a_model = tmp_path / "README.md"
    not_a_model.write_text("# notes")
    with pytest.raises(OSError, match=f"--model={not_a_model} is a file: give a checkpoint"):
        ev.own_tokenizer(str(not_a_model))


def test_a_grpo_resume_whose_start_model_is_gone_says_to_name_it(tmp_path):
    """The start model of a GRPO run (its KL reference) was moved: the resume failed on a path the
    user never typed ("no folder .../checkpoint-2: pass an existing checkpoint folder")."""
    checkpoint = tmp_path / "run" / "checkpoint-1"
    checkpoint.mkdir(parents=True)
    gone = str(tmp_path / "sft" / "checkpoint-2")
    config = dataclasses.asdict(grpo.GRPOConfig(model=gone, recipe="baseline"))
    torch.save({"config": config}, checkpoint / "trainer_state.pt")
    with pytest.raises(ValueError, match=f"started from {gone}, which is not there now.*"
                                         r"pass --model=<where it is now> with --resume"):
        plumbing.parse_args(grpo.GRPOConfig, [f"--resume={checkpoint}"])


def test_sft_refuses_a_tokenizer_beside_a_model_with_its_own(small_model, tmp_path):
    """sft.py --tokenizer with a checkpoint was silently ignored (only tiny read it): now an error
    that says where --tokenizer counts, before anything is written."""
    tokenizer = str(tmp_path / "tok")
    load_model("tiny")[1].save_pretrained(tokenizer)
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="brings its own tokenizer; --tokenizer is for "):
        sft.train(sft_config(small_model, out, tokenizer=tokenizer))
    assert not out.exists()
