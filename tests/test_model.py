"""Tests of model.py: the tiny default, the character tokenizer, the six tags and their embedding
initialisation, offline errors, atomic checkpoints, and the tags on the real Qwen3 tokenizer."""

import hashlib
import json
import os
import shutil
import socket
import string
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import SHARED

import model
from attention import TagIds
from model import (
    TAGS,
    TINY_CONFIG,
    build_char_tokenizer,
    check_model_name,
    load_model,
    read_checkpoint_config,
)
from plumbing import load_trainer_state, save_checkpoint

QWEN3_TOKENIZER = os.path.join(SHARED, "tokenizers", "qwen3")
# printable ASCII and newline (string.printable minus tab, carriage return, vertical tab, form feed)
HUB_SECONDS = 5.0      # the probe's 2 s and the failure, on 2 shared cores (the retries: 24-58 s)
PRINTABLE = "".join(ch for ch in string.printable if ch not in "\t\r\x0b\x0c")


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny")


def tiny_param_count(vocab: int) -> int:
    """Parameters of a Qwen3 decoder with TINY_CONFIG, counted from the architecture (no biases,
    RMSNorm weights, q/k norms per head_dim, SwiGLU MLP, tied embeddings)."""
    h, hd = TINY_CONFIG["hidden_size"], TINY_CONFIG["head_dim"]
    ffn = TINY_CONFIG["intermediate_size"]
    q, kv = TINY_CONFIG["num_attention_heads"] * hd, TINY_CONFIG["num_key_value_heads"] * hd
    layer = h * q + 2 * h * kv + q * h + 2 * hd + 3 * h * ffn + 2 * h
    return vocab * h + TINY_CONFIG["num_hidden_layers"] * layer + h


def test_tiny_model_size_and_vocabulary(tiny):
    model, tok = tiny
    vocab = 3 + len(PRINTABLE) + len(TAGS)             # <pad> <eos> <unk>, 96 characters, 6 tags
    assert len(tok) == vocab == 105
    assert model.get_input_embeddings().weight.shape == (vocab, TINY_CONFIG["hidden_size"])
    n = sum(p.numel() for p in model.parameters())
    assert n == tiny_param_count(vocab)
    # "~1M" (the README and model.py say so); exactly 997,888
    assert 0.95e6 < n < 2e6
    assert type(model).__name__ == "Qwen3ForCausalLM" and not model.training
    assert next(model.parameters()).dtype == torch.float32
    assert model.get_output_embeddings().weight.data_ptr() == \
        model.get_input_embeddings().weight.data_ptr()


def test_char_tokenizer(tiny):
    _, tok = tiny
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2)
    assert [tok.convert_tokens_to_ids(t) for t in TAGS] == [99, 100, 101, 102, 103, 104]
    ids = tok.encode(PRINTABLE, add_special_tokens=False)
    assert len(ids) == len(PRINTABLE) and sorted(ids) == list(range(3, 99))   # one id per character
    text = "Sam has 3 pens; 4 * 3?\n  {x: [1, 2]} ~`'\"\\ end\n"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert tok.decode(tok.encode(PRINTABLE, add_special_tokens=False)) == PRINTABLE
    # anything else is <unk>, one id per character
    a = tok.encode("a", add_special_tokens=False)[0]
    b = tok.encode("b", add_special_tokens=False)[0]
    assert tok.encode("aéb\t€", add_special_tokens=False) == [a, 2, b, 2, 2]
    # each tag is one id, also inside text; skip_special_tokens removes exactly the tags
    for t, i in zip(TAGS, range(99, 105)):
        assert tok.encode(t, add_special_tokens=False) == [i]
        assert tok.encode(f"a{t}b", add_special_tokens=False) == [a, i, b]
    s = "x<Parallel><Path>1</Path><Path>2</Path></Parallel>\n<Summary>3</Summary>y"
    ids = tok.encode(s, add_special_tokens=False)
    assert len(ids) == 14 and tok.decode(ids) == s
    assert tok.decode(ids, skip_special_tokens=True) == "x12\n3y"
    tags = TagIds.from_tokenizer(tok)
    assert (tags.parallel, tags.end_summary, tags.newline, tags.eos) == \
        (99, 104, (tok.encode("\n")[0],), 1)


def check_tag_rows(model, tok, base_tok):
    """Each new tag row = mean of the rows of the pieces `base_tok` (the tokenizer before the tags)
    splits the tag into, plus noise of 0.02 x the weight's std; the six rows differ pairwise."""
    emb = model.get_input_embeddings().weight.detach().float()
    n_old = len(base_tok)
    scale = emb[:n_old].std().item()
    rows = []
    for t in TAGS:
        i = tok.convert_tokens_to_ids(t)
        assert i >= n_old                                   # a new row, not a reused one
        pieces = base_tok.encode(t, add_special_tokens=False)
        assert len(pieces) > 1
        noise = emb[i] - emb[pieces].mean(0)
        assert noise.abs().max().item() < 6 * 0.02 * scale   # within the noise scale ...
        assert 0.01 * scale < noise.std().item() < 0.04 * scale   # ... and the noise is there
        rows.append(emb[i])
    rows = torch.stack(rows)
    d = torch.cdist(rows, rows) + torch.eye(len(TAGS)) * 1e9
    assert d.min().item() > 0.02 * scale                    # pairwise different


def test_tag_embedding_init(tiny):
    model, tok = tiny
    check_tag_rows(model, tok, build_char_tokenizer())
    out = model.get_output_embeddings().weight
    assert torch.equal(out[99:105], model.get_input_embeddings().weight[99:105])   # tied


def test_unknown_name_offline_fails_fast(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    t0 = time.monotonic()
    with pytest.raises(OSError, match="local folder"):
        load_model("no-such-org/no-such-model-7b")
    assert time.monotonic() - t0 < 5


# Every way a hub name comes in, with no network: the model, a tokenizer, eval.py's (and grpo.py's)
# first look at --model's tokenizer, a known dataset without its local file
NO_NETWORK_CALLS = """
import json, sys, time
import data, eval, model
name = "Qwen/Qwen3-0.6B"
calls = {"--model": lambda: model.load_model(name),
         "--tokenizer": lambda: model.load_model("tiny", tokenizer=name),
         "eval --model": lambda: eval.own_tokenizer(name),
         "--data": lambda: data.load_data("gsm8k:test", data_dir=sys.argv[1])}
out = {}
for what, call in calls.items():
    t = time.monotonic()
    try:
        call()
        out[what] = ["loaded", 0.0]
    except Exception as e:
        out[what] = [f"{type(e).__name__}: {e}", time.monotonic() - t]
print(json.dumps(out))
"""


def test_a_hub_name_without_network_fails_in_seconds_saying_what_to_do(tmp_path):
    """Outside `make` (no HF_HUB_OFFLINE), a hub name with no network spent 24-58 s in
    huggingface_hub's retries (5 a file) before its error. Now each way a hub name comes in fails
    in seconds and names the fix: a local folder and its flag. The hub here: a closed port."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
           and not k.lower().endswith("_proxy")}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf"),
               PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    empty = tmp_path / "data"
    empty.mkdir()
    out = subprocess.run([sys.executable, "-c", NO_NETWORK_CALLS, str(empty)], env=env,
                         capture_output=True, text=True, timeout=600, check=True)
    results = json.loads(out.stdout.splitlines()[-1])
    fixes = {"--model": "pass --model=<folder>", "--tokenizer": "pass --tokenizer=<folder>",
             "eval --model": "pass --model=<folder>", "--data": "Point --data_dir"}
    for what, fix in fixes.items():
        message, seconds = results[what]
        assert fix in message and "cannot be reached" in message, (what, message)
        assert seconds < HUB_SECONDS, (what, seconds, message)


def test_the_hub_probe_reads_the_endpoint_and_the_offline_flags(monkeypatch):
    """hub_reachable connects to HF_ENDPOINT's host and port (a listening socket here: yes; a
    closed port: no) and never with HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE set."""
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "http_proxy", "HTTP_PROXY"):
        monkeypatch.delenv(variable, raising=False)
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
        assert model.hub_reachable()
        monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
        assert not model.hub_reachable()
        monkeypatch.delenv("TRANSFORMERS_OFFLINE")
        monkeypatch.setenv("HF_HUB_OFFLINE", "true")
        assert not model.hub_reachable()
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    assert not model.hub_reachable()


def digest(folder):
    return {f: hashlib.sha256(Path(folder, f).read_bytes()).hexdigest()
            for f in sorted(os.listdir(folder))}


def test_save_checkpoint_is_atomic_and_reloads(tmp_path, monkeypatch):
    model, tok = load_model("tiny")
    ids = torch.tensor([tok.encode("12+3=<Parallel><Path>", add_special_tokens=False)])
    with torch.no_grad():
        ref = model(ids).logits
    path = str(tmp_path / "ckpt")
    assert save_checkpoint(path, model, tok, trainer_state={"step": 3}) == path
    before = digest(path)
    assert {"config.json", "model.safetensors", "tokenizer.json", "trainer_state.pt"} <= set(before)

    # a crash half-way through the next save leaves the previous checkpoint and no temp folder
    with torch.no_grad():
        model.model.norm.weight += 1.0
    def crash(*args, **kwargs):
        raise RuntimeError("simulated crash while writing the tokenizer")
    monkeypatch.setattr(tok, "save_pretrained", crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        save_checkpoint(path, model, tok, trainer_state={"step": 4})
    assert os.listdir(tmp_path) == ["ckpt"]
    assert digest(path) == before
    assert load_trainer_state(path) == {"step": 3}

    # the intact checkpoint reloads to the same tokenizer (nothing added) and the same logits
    m2, t2 = load_model(path)
    assert len(t2) == len(tok) and t2.get_vocab() == tok.get_vocab()
    with torch.no_grad():
        assert torch.equal(m2(ids).logits, ref)

    # a crash between moving the old folder aside and renaming the new one puts the old one back
    monkeypatch.undo()
    real_replace, calls = os.replace, []
    def replace_then_crash(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:
            raise OSError("simulated crash between the renames")
        real_replace(src, dst)
    monkeypatch.setattr(os, "replace", replace_then_crash)
    with pytest.raises(OSError, match="between the renames"):
        save_checkpoint(path, model, tok, trainer_state={"step": 4})
    assert calls[0][0] == path and calls[1][1] == path     # it did get as far as the second rename
    assert os.listdir(tmp_path) == ["ckpt"]
    assert digest(path) == before

    # a successful save replaces it, again without leftovers
    monkeypatch.undo()
    save_checkpoint(path, model, tok, trainer_state={"step": 4})
    assert os.listdir(tmp_path) == ["ckpt"] and load_trainer_state(path) == {"step": 4}
    with pytest.raises(FileNotFoundError, match="trainer_state.pt"):
        load_trainer_state(str(tmp_path))

    # a checkpoint without its tokenizer loaded as a one-token tokenizer, and training divided by
    # zero
    bare = tmp_path / "bare"
    shutil.copytree(path, bare)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        os.remove(bare / f)
    with pytest.raises(FileNotFoundError, match="has no tokenizer"):
        load_model(str(bare))
    shutil.rmtree(bare)

    # damaged files (a disk that filled up): errors that name them; the library's named neither
    for name in ("model.safetensors", "trainer_state.pt"):
        f = os.path.join(path, name)
        with open(f, "r+b") as fh:
            fh.truncate(os.path.getsize(f) // 2)
    with pytest.raises(OSError, match=f"cannot load the weights in '{path}' .*damaged"):
        load_model(path)
    for read in (load_trainer_state, read_checkpoint_config):
        with pytest.raises(OSError, match=f"cannot read {path}/trainer_state.pt .*damaged"):
            read(path)


def test_real_qwen3_tokenizer(tmp_path):
    if not os.path.isfile(os.path.join(QWEN3_TOKENIZER, "tokenizer.json")):
        pytest.skip("the real Qwen3 tokenizer is not at ../shared/tokenizers/qwen3 (shared folder "
                    "absent)")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    raw = AutoTokenizer.from_pretrained(QWEN3_TOKENIZER)
    model, tok = load_model("tiny", tokenizer=QWEN3_TOKENIZER)
    ids = [tok.convert_tokens_to_ids(t) for t in TAGS]
    # six single, distinct ids, new (distinct from every token the tokenizer had), the rest
    # unchanged
    assert len(tok) == len(raw) + 6 and sorted(ids) == list(range(len(raw), len(raw) + 6))
    assert not set(TAGS) & set(raw.get_vocab())
    for t, i in zip(TAGS, ids):
        assert tok.encode(t, add_special_tokens=False) == [i]
    text = "Let x = 2.<Parallel><Path>x+1</Path></Parallel>\n<Summary>3</Summary>"
    expected = []
    for piece in ("Let x = 2.", "<Parallel>", "<Path>", "x+1", "</Path>", "</Parallel>", "\n",
                  "<Summary>", "3", "</Summary>"):
        if piece in TAGS:
            expected += [ids[TAGS.index(piece)]]
        else:
            expected += raw.encode(piece, add_special_tokens=False)
    assert tok.encode(text, add_special_tokens=False) == expected
    assert tok.decode(expected, skip_special_tokens=True) == "Let x = 2.x+1\n3"
    check_tag_rows(model, tok, raw)

    # the chat template still applies, with the tags as single tokens
    msgs = [{"role": "user", "content": "Begin the block with <Parallel>."}]
    chat = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert chat == raw.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert chat.endswith("<|im_start|>assistant\n")
    assert tok.encode(chat, add_special_tokens=False).count(ids[0]) == 1

    # save + reload adds nothing and gives identical logits; plain transformers loads the folder
    path = save_checkpoint(str(tmp_path / "qwen3-tiny"), model, tok)
    m2, t2 = load_model(path)
    assert len(t2) == len(tok) and t2.get_vocab() == tok.get_vocab()
    assert m2.get_input_embeddings().weight.shape[0] == len(tok)
    x = torch.tensor([expected])
    with torch.no_grad():
        ref = model(x).logits
        assert torch.equal(m2(x).logits, ref)
        hf = AutoModelForCausalLM.from_pretrained(path)
        assert torch.equal(hf(x).logits, ref)
    tags = TagIds.from_tokenizer(t2)
    assert (tags.parallel, tags.newline, tags.eos) == \
        (ids[0], tuple(raw.encode("\n")), raw.eos_token_id)


def test_a_run_folder_is_refused_with_its_latest_checkpoint(tmp_path):
    """--model=<run folder> (a common slip) names the checkpoint to pass instead of failing in the
    tokenizer."""
    for step in (2, 10):
        (tmp_path / "run" / f"checkpoint-{step}").mkdir(parents=True)
    with pytest.raises(FileNotFoundError,
                       match=r"is a run folder, not a checkpoint: .*checkpoint-10'"):
        load_model(str(tmp_path / "run"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        load_model(str(tmp_path / "empty"))
    # also where only a tokenizer is read
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        check_model_name(str(tmp_path / "empty"), weights=False)


def test_a_folder_of_config_json_only_is_an_architecture_with_random_weights(tmp_path):
    """A folder holding only a config.json loads with random weights (seeded) on --tokenizer's
    tokenizer; without one it asks for --tokenizer; --tokenizer beside a model that brings its own
    tokenizer is refused, not ignored; a mistyped --tokenizer gets a tokenizer's advice."""
    from transformers import Qwen3Config

    import eval as ev
    tok_folder = str(tmp_path / "tok")
    build_char_tokenizer().save_pretrained(tok_folder)
    arch = tmp_path / "arch"
    arch.mkdir()
    characters = len(build_char_tokenizer())
    architecture = dict(TINY_CONFIG, hidden_size=64, intermediate_size=96, vocab_size=characters)
    Qwen3Config(**architecture).to_json_file(str(arch / "config.json"))
    with pytest.raises(OSError, match="no weights .* and no tokenizer: pass --tokenizer="):
        load_model(str(arch))
    assert ev.own_tokenizer(str(arch)) is None
    model, tok = load_model(str(arch), tokenizer=tok_folder, seed=1)
    again, _ = load_model(str(arch), tokenizer=tok_folder, seed=1)
    other, _ = load_model(str(arch), tokenizer=tok_folder, seed=2)
    assert model.config.hidden_size == 64 and model.config.intermediate_size == 96
    assert len(tok) == characters + len(TAGS)
    assert model.get_input_embeddings().weight.shape == (len(tok), 64)
    weights = model.model.layers[0].mlp.up_proj.weight
    assert torch.equal(weights, again.model.layers[0].mlp.up_proj.weight)
    assert not torch.equal(weights, other.model.layers[0].mlp.up_proj.weight)
    checkpoint = save_checkpoint(str(tmp_path / "ckpt"), model, tok)
    with pytest.raises(ValueError, match="brings its own tokenizer; --tokenizer is for "
                                         "--model=tiny or a folder holding only a config.json"):
        load_model(checkpoint, tokenizer=tok_folder)
    with pytest.raises(FileNotFoundError, match=r"--tokenizer=\./no/such: no such folder; pass a "
                                                "folder holding a tokenizer.json"):
        load_model("tiny", tokenizer="./no/such")


def test_a_mistyped_two_part_path_is_a_path_not_a_hub_name(tmp_path, monkeypatch):
    """"runs/sfft" looks like a hub name ("owner/model"), but its first part is a folder here:
    the user mistyped a path, and hears so at once (not a failed hub download). A name whose
    first part is no folder here stays a hub name."""
    from model import check_model_name, looks_like_a_path
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    assert looks_like_a_path("runs/sfft") and not looks_like_a_path("Qwen/Qwen3-4B-Base")
    with pytest.raises(FileNotFoundError, match="no folder 'runs/sfft'"):
        check_model_name("runs/sfft")
