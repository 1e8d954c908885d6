"""Run folders and bad input: each case either changed something the user did not point at or
explained itself badly (a library traceback naming no flag or file). Each test failed before its
fix."""
import dataclasses
import datetime
import functools
import gzip
import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch

import config
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


def refusal(trainer, argv: list[str]) -> str:
    """The message with which `trainer` (sft or grpo) refuses the command line: a resume that
    changes what the run is fails when the run resolves its config, before any weights load."""
    config_class = grpo.GRPOConfig if trainer is grpo else sft.SFTConfig
    with pytest.raises(ValueError) as refused:
        trainer.train(plumbing.parse_args(config_class, argv))
    return str(refused.value)


def test_settings_json_holds_every_setting_with_its_source(finished_run, small_model):
    """A run folder held no readable config (only trainer_state.pt, overwritten by each resume):
    settings.json now lists every setting in force with where it came from. The 1-step run of
    `sft_config`: its fields are flags; the tiny preset's lr, warm-up, max_time and
    grad_checkpointing; max_length from the model's 512 positions; the rest SFTConfig's
    defaults."""
    flags = dict(model=small_model, preset="tiny", out_dir=str(finished_run), max_steps=1,
                 save_every=0, eval_samples=0, batch_size=4, micro_batch_size=4, limit=8,
                 log_every=0)
    preset = dict(lr=1e-3, warmup_ratio=0.05, max_time=0.0, grad_checkpointing=False)
    expected = {f.name: {"value": f.default, "source": "default"}
                for f in dataclasses.fields(sft.SFTConfig)}
    expected["betas"] = {"value": [0.9, 0.95], "source": "default"}
    expected.update({name: {"value": value, "source": "flag"} for name, value in flags.items()})
    expected.update({name: {"value": value, "source": "preset"} for name, value in preset.items()})
    expected["max_length"] = {"value": 512, "source": "derived"}
    with open(finished_run / "settings.json") as f:
        written = json.load(f)
    assert written == {"resumed_from": None, "step": 0, "settings": expected}
    assert list(written["settings"]) == [f.name for f in dataclasses.fields(sft.SFTConfig)]


def test_grpo_settings_say_which_the_recipe_and_the_preset_set(small_model, capsys):
    """GRPO's sources: the recipe's mode (and its per-step reward and upper clip, None), the
    start model as given, eval_data derived from --data, the preset's sizes; printed by source."""
    cfg = grpo.GRPOConfig(model=small_model, preset="tiny", recipe="unseen-s2",
                          data="carry:hard:rl", seed=3)
    d = plumbing.Dist(0, 1, torch.device("cpu"))
    resolve = functools.partial(grpo.resolve_defaults, find_model=True)
    resolved, record = plumbing.resolve_config(cfg, d, resolve, config.GRPO_PRESETS)
    sources = record["sources"]
    assert record["resume"] is None
    assert (resolved.mode, sources["mode"], sources["reward"], sources["clip_ratio_high"]) == \
        ("unseen", "recipe", "recipe", "recipe")
    assert (sources["recipe"], sources["seed"], sources["model"], sources["data"]) == \
        ("flag",) * 4
    assert (resolved.eval_data, sources["eval_data"]) == ("carry:hard:test", "derived")
    assert (resolved.group_size, resolved.kl_coef, sources["group_size"], sources["kl_coef"]) == \
        (4, 0.3, "preset", "preset")
    assert (sources["temperature"], sources["clip_ratio_low"]) == ("default", "default")
    assert sorted(set(sources.values())) == ["default", "derived", "flag", "preset", "recipe"]


@pytest.fixture(scope="module")
def grpo_checkpoint(small_model, tmp_path_factory):
    """A GRPO checkpoint's trainer state as a run under the tiny preset saves it (its config
    resolved; no weights: a refused resume never loads them)."""
    resolved = grpo.resolve_defaults(grpo.GRPOConfig(model=small_model, preset="tiny"),
                                     find_model=True)
    folder = tmp_path_factory.mktemp("grpo") / "run" / "checkpoint-1"
    folder.mkdir(parents=True)
    torch.save({"config": dataclasses.asdict(resolved)}, folder / "trainer_state.pt")
    return str(folder)


TINY_RL_DATA = "synthetic:easy:rl,synthetic:medium:rl,synthetic:hard:rl"


@pytest.mark.parametrize("trainer, flag, old, new", [
    (grpo, "group_size", "4", "8"),
    (grpo, "batch_size", "32", "16"),
    (grpo, "data", f'"{TINY_RL_DATA}"', '"synthetic:hard:rl"'),
    (grpo, "seed", "0", "1"),
    (grpo, "kl_coef", "0.3", "0.0"),
    (grpo, "max_new_tokens", "128", "256"),
    (grpo, "reward", "null", '"accuracy"'),
    (grpo, "recipe", '"unseen-s1"', '"unseen-s2"'),
    (grpo, "lr", "0.00015", "0.001"),
    (grpo, "mode", '"unseen"', '"seen"'),
    (grpo, "model", "<start model>", '"tiny"'),
    (grpo, "preset", '"tiny"', '"paper"'),
    (grpo, "temperature", "1.0", "0.7"),
    (sft, "style", '"parallel"', '"sequential"'),
    (sft, "max_length", "512", "256"),
])
def test_a_resume_that_changes_the_experiment_is_refused(trainer, flag, old, new, grpo_checkpoint,
                                                         finished_run, small_model):
    """--group_size, --batch_size, --seed, --kl_coef, --max_new_tokens, --data on a resume were
    taken without a word and overwrote the checkpoint's config. Now each change to what the run
    learns is refused, naming the setting, old -> new, and the ways on."""
    checkpoint = grpo_checkpoint if trainer is grpo else f"{finished_run}/checkpoint-1"
    old = old.replace("<start model>", json.dumps(os.path.abspath(small_model)))
    value = json.loads(new)
    message = refusal(trainer, [f"--resume={checkpoint}", f"--{flag}={value}"])
    assert f"would change what the run is (the checkpoint's -> this run's):\n    --{flag}: " \
        f"{old} -> {new}\nDrop these flags to go on as the run began; or accept the changes with " \
        f"--allow_changes={flag} " in message
    assert message.endswith(f"--model={checkpoint} without --resume")


def test_a_resume_names_every_change_and_allows_what_is_not_the_experiment(grpo_checkpoint):
    """Two changes: both named, in one refusal; where a run goes on (out_dir, steps, evaluation,
    logging, memory) is no change to the experiment."""
    message = refusal(grpo, [f"--resume={grpo_checkpoint}", "--kl_coef=0", "--seed=2",
                             "--max_steps=500", "--eval_every=5", "--micro_batch_size=2"])
    assert "    --seed: 0 -> 2\n    --kl_coef: 0.3 -> 0.0\n" in message
    assert "--allow_changes=seed,kl_coef " in message and "max_steps" not in message
    assert refusal(grpo, [f"--resume={grpo_checkpoint}", "--allow_changes=seed,klcoef"]) == \
        "--allow_changes=seed,klcoef: klcoef is not a setting of this script (--help lists them)"


def test_an_accepted_change_is_recorded_and_only_for_that_resume(finished_run, tmp_path, capsys):
    """--allow_changes=lr takes the new lr; resumes.jsonl says when, from which checkpoint, what
    changed and what was accepted; settings.json marks lr as a flag's; the next resume does not
    inherit the acceptance."""
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(finished_run), str(copy)], check=True)
    before = time.time()
    sft.train(plumbing.parse_args(sft.SFTConfig, [f"--resume={copy}/checkpoint-1", "--lr=0.002",
                                                  "--max_steps=2", "--allow_changes=lr"]))
    lines = (copy / "resumes.jsonl").read_text().splitlines()
    assert len(lines) == 1
    line = json.loads(lines[0])
    when = datetime.datetime.fromisoformat(line.pop("time")).timestamp()
    assert before - 1 <= when <= time.time()
    assert line == {"step": 1, "checkpoint": f"{copy}/checkpoint-1",
                    "changed": {"max_steps": [1, 2], "out_dir": [str(finished_run), str(copy)],
                                "lr": [0.001, 0.002]},
                    "accepted": ["lr"]}
    settings = json.loads((copy / "settings.json").read_text())
    assert settings["resumed_from"] == f"{copy}/checkpoint-1" and settings["step"] == 1
    assert settings["settings"]["lr"] == {"value": 0.002, "source": "flag"}
    assert settings["settings"]["warmup_ratio"] == {"value": 0.05, "source": "preset"}
    assert settings["settings"]["allow_changes"] == {"value": "lr", "source": "flag"}
    out = capsys.readouterr().out
    assert f"this resume changes: max_steps 1 -> 2, out_dir {finished_run} -> {copy}, lr 0.001 " \
        "-> 0.002 (accepted by --allow_changes: lr)" in out
    message = refusal(sft, [f"--resume={copy}/checkpoint-2", "--lr=0.003"])
    assert "    --lr: 0.002 -> 0.003\n" in message
    assert plumbing.load_trainer_state(f"{copy}/checkpoint-2")["config"]["lr"] == 0.002


def scores_of_the_text(responses, golds, **kw):
    """A reward with variance for any model, without the answer checker's workers."""
    return [{"reward": float(sum(map(ord, t)) % 7), "correct": False, "kind": "accuracy",
             "answer_found": False} for t in responses]


def table_group(printed: str, source: str) -> str:
    """The settings that the printed table (config.settings_table) lists under `source`, joined
    by spaces across its wrapped lines."""
    table = printed.split("by source:\n")[-1].split("\n  default:")[0]
    groups = re.split(r"^  ([a-z ]+):", table, flags=re.MULTILINE)[1:]
    found = dict(zip(groups[::2], groups[1::2]))
    return " ".join(found[source].split())


def test_a_resume_says_which_flags_this_start_gave(small_model, tmp_path, monkeypatch, capsys):
    """A resume showed every value the checkpoint kept as "flag" where the run's first start
    typed it (and out_dir, when the run was resumed from a copy), and its preset line said
    "(--preset=tiny)" for a preset the checkpoint kept. Now only this start's flags say "flag";
    a flag of an earlier start keeps its value as "earlier flag"; the preset line says where the
    preset came from."""
    monkeypatch.setattr(grpo, "score_batch", scores_of_the_text)
    records = [{"id": str(i), "problem": f"Ava has {i} pens.", "answer": str(i)} for i in range(2)]
    out = tmp_path / "run"
    argv = [f"--model={small_model}", "--preset=tiny", f"--out_dir={out}", "--batch_size=2",
            "--group_size=2", "--max_new_tokens=8", "--micro_batch_size=2", "--eval_data=",
            "--max_steps=1", "--kl_coef=0.1"]
    grpo.train(plumbing.parse_args(grpo.GRPOConfig, argv), records=records)
    first = json.loads((out / "settings.json").read_text())["settings"]
    assert (first["kl_coef"], first["lr"]) == ({"value": 0.1, "source": "flag"},
                                               {"value": 0.00015, "source": "preset"})
    capsys.readouterr()
    checkpoint = f"{out}/checkpoint-1"
    grpo.train(plumbing.parse_args(grpo.GRPOConfig, [f"--resume={checkpoint}"]), records=records)
    printed = capsys.readouterr().out
    resumed = json.loads((out / "settings.json").read_text())["settings"]
    assert {name for name, entry in resumed.items() if entry["source"] == "flag"} == {"resume"}
    assert {name for name, entry in resumed.items() if entry["source"] == "earlier flag"} == \
        {name for name, entry in first.items() if entry["source"] == "flag"}
    assert resumed["kl_coef"] == {"value": 0.1, "source": "earlier flag"}
    assert resumed["lr"] == {"value": 0.00015, "source": "preset"}
    assert f"preset tiny (the run's, kept by --resume={checkpoint})\n" in printed
    assert "GRPO done at step 1: 0 steps in " in printed       # was "1 steps in": none ran
    assert table_group(printed, "flag") == f"resume={checkpoint}"
    assert "kl_coef=0.1" in table_group(printed, "earlier flag").split()
    copy = tmp_path / "copy"                          # resumed from a copy: out_dir follows it
    subprocess.run(["cp", "-r", str(out), str(copy)], check=True)
    grpo.train(plumbing.parse_args(grpo.GRPOConfig, [f"--resume={copy}/checkpoint-1",
                                                     "--kl_coef=0.2", "--allow_changes=kl_coef",
                                                     "--preset=tiny"]),
               records=records)
    printed = capsys.readouterr().out
    changed = json.loads((copy / "settings.json").read_text())["settings"]
    assert changed["kl_coef"] == {"value": 0.2, "source": "flag"}
    assert changed["out_dir"] == {"value": str(copy), "source": "derived"}
    assert {name for name, entry in changed.items() if entry["source"] == "flag"} == \
        {"resume", "kl_coef", "allow_changes"}
    assert f"preset tiny (the run's, kept by --resume={copy}/checkpoint-1)\n" in printed
    assert table_group(printed, "flag") == \
        f"resume={copy}/checkpoint-1 allow_changes=kl_coef kl_coef=0.2"


def test_a_resume_keeps_the_runs_preset_for_auto(finished_run, small_model, tmp_path):
    """--preset=auto on a resume is the run's preset (the start model alone would say paper, and
    the resumed run then trained with another prompt style); --model naming the same folder by
    another path is the same model."""
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(finished_run), str(copy)], check=True)
    relative = os.path.relpath(small_model)
    cfg = plumbing.parse_args(sft.SFTConfig, [f"--resume={copy}/checkpoint-1", "--preset=auto",
                                              f"--model={relative}", "--max_steps=2"])
    sft.train(cfg)
    line = json.loads((copy / "resumes.jsonl").read_text())
    assert line["changed"] == {"max_steps": [1, 2], "out_dir": [str(finished_run), str(copy)]}
    assert line["accepted"] == []


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
    assert f"    --model: {json.dumps(str(start))} -> {json.dumps(small_model)}\n" in \
        refusal(sft, [f"--resume={checkpoint}", f"--model={small_model}"])
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


def test_a_signal_stop_is_told_by_rank_0_only(monkeypatch, tmp_path):
    """Under torchrun only rank 0 knows the checkpoint's path (Run.save): rank 1 said "continues
    from None"; it exits with status 1 and says nothing."""
    path = str(tmp_path / "checkpoint-4")

    def stopped(cfg):
        checkpoint = path if os.environ["RANK"] == "0" else None
        return {"stopped_by": "SIGINT", "steps": 4, "checkpoint": checkpoint}
    told = f"sft.py: stopped by SIGINT after step 4; --resume=True continues from {path}"
    for rank, said in (("0", told), ("1", 1)):
        monkeypatch.setenv("RANK", rank)
        with pytest.raises(SystemExit) as stop:
            plumbing.run_script("sft.py", sft.SFTConfig, stopped, [])
        assert stop.value.code == said


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


def test_the_settings_print_by_source_listing_all_but_the_defaults():
    """What each trainer prints at its start (rank 0): the settings grouped by source, the
    defaults counted; an empty string shows as "", a recipe's None says what it means."""
    values = {"lr": 0.00015, "seed": 3, "mode": "unseen", "reward": None, "eval_data": "",
              "top_k": 0, "max_length": 512}
    sources = {"lr": "preset", "seed": "flag", "mode": "recipe", "reward": "recipe",
               "eval_data": "flag", "top_k": "default", "max_length": "derived"}
    assert config.settings_table(values, sources) == (
        '  flag:    seed=3 eval_data=""\n'
        "  preset:  lr=0.00015\n"
        "  recipe:  mode=unseen reward=None (None: the recipe's at each step, grpo.stage_at)\n"
        "  derived: max_length=512\n"
        "  default: 1 other settings")


def test_resume_names_the_checkpoints_an_earlier_run_moved_aside(tmp_path):
    """A run started without --resume moves the checkpoints aside; --resume=True then finds none
    in out_dir and names the moved ones (a fresh user's finding)."""
    moved = tmp_path / "earlier-1" / "checkpoint-2"
    moved.mkdir(parents=True)
    (moved / "trainer_state.pt").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"moved aside: .*earlier-1/checkpoint-2"):
        plumbing.find_latest_checkpoint(str(tmp_path))
