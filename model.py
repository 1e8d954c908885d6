"""Models: any Hugging Face causal LM (or the tiny embedded default) with the six parallel tags (NOTES.md §1).

    model, tokenizer = load_model("tiny")                      # ~1M-parameter Qwen3, character tokenizer, offline
    model, tokenizer = load_model("Qwen/Qwen3-4B-Base")        # a hub name (needs the hub)
    model, tokenizer = load_model("runs/sft/checkpoint-400")   # a local folder, e.g. one of our checkpoints

The tags become special tokens, one id each, their embeddings the mean of their text's pieces plus small noise
(identical rows make the tags unlearnable). `save_checkpoint` writes Hugging Face format, atomically.
"""
import glob
import itertools
import json
import os
import re
import shutil
import socket
import string
import tempfile
from typing import Literal, get_args

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedTokenizerFast, Qwen3Config,
                          Qwen3ForCausalLM)

TAGS = ("<Parallel>", "</Parallel>", "<Path>", "</Path>", "<Summary>", "</Summary>")
Mode = Literal["unseen", "seen", "sequential"]   # the Seen/Unseen masks (NOTES.md §2), and plain sampling
MODES = get_args(Mode)

# The embedded default: a Qwen3 of ~1.0M parameters (997k with the 105-token character vocabulary). It trains at
# ~5-7k tokens/s on 2 CPU cores, so the curriculum fits in minutes; its traces are < 200 tokens.
TINY_CONFIG = dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,  # GQA
                   head_dim=32, intermediate_size=512, max_position_embeddings=512, rope_theta=10000.0,
                   tie_word_embeddings=True, rms_norm_eps=1e-6)
ALPHABET = string.digits + string.ascii_letters + string.punctuation + " \n"   # the tiny tokenizer's characters
PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"

def build_char_tokenizer():
    """Ids 0-2 <pad>, <eos>, <unk>, then one per character of ALPHABET (others: <unk>); no tags yet."""
    vocab = {PAD: 0, EOS: 1, UNK: 2} | {ch: 3 + i for i, ch in enumerate(ALPHABET)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every character alone
    tok.decoder = decoders.Fuse()                                                      # joined without spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK,
                                   clean_up_tokenization_spaces=False)

def add_parallel_tags(model, tokenizer, seed: int = 0) -> list[int]:
    """Add the tags the tokenizer lacks as special tokens; each new row (input, and output if untied) = mean of
    its pieces' rows + N(0, (0.02 std)^2). Returns the new ids."""
    new = [t for t in TAGS if t not in tokenizer.get_vocab()]
    if not new:
        return []
    pieces = {t: tokenizer.encode(t, add_special_tokens=False) for t in new}   # before the tags exist
    tokenizer.add_special_tokens({"additional_special_tokens": new}, replace_extra_special_tokens=False)
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    gen = torch.Generator().manual_seed(seed)
    emb, out = model.get_input_embeddings().weight, model.get_output_embeddings()
    untied = out is not None and out.weight.data_ptr() != emb.data_ptr()
    new_ids = tokenizer.convert_tokens_to_ids(new)
    with torch.no_grad():
        for t, i in zip(new, new_ids):
            src = [p for p in pieces[t] if p < emb.shape[0]] or list(range(emb.shape[0]))
            for w in [emb] + ([out.weight] if untied else []):
                base = w[src].float().mean(0)
                noise = torch.randn(base.shape, generator=gen) * 0.02 * w.float().std()
                w[i] = (base + noise.to(base.device)).to(w.dtype)
    return new_ids

def check_model_name(p: str, weights: bool = True) -> None:
    """FileNotFoundError, saying what to pass, for a path-like name that is no folder, a run folder (naming its
    latest checkpoint), or (with `weights`) a folder without config.json."""
    if not os.path.isdir(p) and (p.startswith((".", "/", "~")) or p.count("/") > 1 or os.sep != "/" and os.sep in p):
        raise FileNotFoundError(f"no folder {p!r}: pass an existing checkpoint folder (e.g. runs/sft/checkpoint-400), "
                                "a hub name like Qwen/Qwen3-4B-Base, or 'tiny'")
    has_tokenizer = any(os.path.isfile(os.path.join(p, f)) for f in ("tokenizer.json", "tokenizer_config.json"))
    if os.path.isdir(p) and not os.path.isfile(os.path.join(p, "config.json")):
        if steps := checkpoints(p):
            raise FileNotFoundError(f"{p!r} is a run folder, not a checkpoint: pass one of its checkpoints, "
                                    f"e.g. {steps[-1][1]!r}")
        if weights or not has_tokenizer:
            raise FileNotFoundError(f"{p!r} has no config.json: pass a checkpoint folder written by "
                                    "save_checkpoint or a Hugging Face model folder")
    if os.path.isdir(p) and not has_tokenizer:      # it loaded as a one-token tokenizer, and training divided by 0
        raise FileNotFoundError(f"{p!r} has no tokenizer (tokenizer.json, tokenizer_config.json): copy them in from "
                                "the model it was trained from, or pass a complete checkpoint")

def _hub_reachable(timeout: float = 2.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    host = os.environ.get("HF_ENDPOINT", "https://huggingface.co").split("://")[-1].split("/")[0]
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False

def load_model(name_or_path: str, dtype: torch.dtype | None = None, device=None, tokenizer: str | None = None,
               attn_implementation: str = "sdpa", seed: int = 0):
    """(model, tokenizer) with the six tags, the model in eval mode on `device` (default cuda if available) in
    `dtype` (default bf16 on CUDA, fp32 on CPU). `tokenizer` (tiny only): build the tiny model on it; `seed`: tiny
    init and tag noise. OSError, saying what to do, when a hub name is not cached and the hub is unreachable."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    if name_or_path == "tiny":
        if tokenizer:
            check_model_name(tokenizer, weights=False)
        tok = AutoTokenizer.from_pretrained(tokenizer) if tokenizer else build_char_tokenizer()
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(Qwen3Config(vocab_size=len(tok), pad_token_id=tok.pad_token_id,
                                             eos_token_id=tok.eos_token_id, bos_token_id=None, **TINY_CONFIG))
        model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    else:
        check_model_name(name_or_path)
        kw = {} if os.path.isdir(name_or_path) or _hub_reachable() else {"local_files_only": True}   # hub cache
        try:
            tok = AutoTokenizer.from_pretrained(name_or_path, **kw)
        except Exception:
            if not kw:
                raise
            raise OSError(f"{name_or_path!r} is not a local folder and the Hugging Face hub cannot be reached "
                          "(offline or HF_HUB_OFFLINE=1). Download the model on a machine with internet (e.g. "
                          "`huggingface-cli download <name> --local-dir <folder>`) and pass the folder, or use "
                          "'tiny' for the embedded default.") from None
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        try:
            model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype,
                                                         attn_implementation=attn_implementation, **kw)
        except Exception as e:                   # e.g. a truncated model.safetensors: the library's error names no file
            if not os.path.isdir(name_or_path):
                raise
            raise OSError(f"cannot load the weights in {name_or_path!r} ({type(e).__name__}: {e}); the folder may "
                          "be damaged: pass another checkpoint") from None
    add_parallel_tags(model, tok, seed=seed)
    model.config.pad_token_id = tok.pad_token_id
    model.set_attn_implementation(attn_implementation)
    return model.to(device=device, dtype=dtype).eval(), tok

def checkpoints(folder: str) -> list[tuple[int, str]]:
    """(step, path) of each folder/checkpoint-<step> (a run's checkpoint), by step; others (checkpoint-best, -010)
    are the user's."""
    return sorted((int(m[1]), p) for p in glob.glob(os.path.join(folder, "checkpoint-*"))
                  if (m := re.fullmatch(r"checkpoint-(0|[1-9]\d*)", os.path.basename(p))) and os.path.isdir(p))

def move_aside(folder: str, paths: list[str]) -> str:
    """Move `paths` (inside `folder`) into a new folder/earlier-<k>, the first k free, and return it: a run or an
    evaluation into a used folder keeps what was there instead of overwriting it."""
    aside = next(a for k in itertools.count(1) if not os.path.exists(a := os.path.join(folder, f"earlier-{k}")))
    os.makedirs(aside)
    for p in paths:
        shutil.move(p, aside)
    return aside

def save_checkpoint(path: str, model, tokenizer, trainer_state: dict | None = None, state_dict: dict | None = None):
    """Write `model`, `tokenizer` (Hugging Face format) and `trainer_state` (trainer_state.pt) to folder `path`
    atomically (a temporary sibling renamed; an old `path` is put back on failure); returns `path`. `state_dict`: the
    gathered weights of an FSDP2 model."""
    path = os.path.abspath(path)
    parent, name = os.path.split(path)
    os.makedirs(parent, exist_ok=True)
    tmp, old = tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=parent), None
    os.chmod(tmp, 0o755)                                   # mkdtemp makes it private; a checkpoint is ordinary output
    try:
        unwrapped = getattr(model, "module", model)
        if state_dict is not None and getattr(unwrapped.config, "tie_word_embeddings", False):
            state_dict = {k: v for k, v in state_dict.items() if k != "lm_head.weight"}
        unwrapped.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict)
        tokenizer.save_pretrained(tmp)
        if trainer_state is not None:
            torch.save(trainer_state, os.path.join(tmp, "trainer_state.pt"))
        if os.path.exists(path):
            old = tempfile.mkdtemp(prefix=f".old-{name}-", dir=parent)
            os.rmdir(old)
            os.replace(path, old)
        os.replace(tmp, path)
        if old:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        if old and os.path.exists(old) and not os.path.exists(path):
            os.replace(old, path)                          # failed between the two renames: put the old one back
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path

def load_trainer_state(path: str) -> dict:
    """The `trainer_state.pt` of a checkpoint. Raises FileNotFoundError naming the path."""
    f = os.path.join(path, "trainer_state.pt")
    if not os.path.isfile(f):
        raise FileNotFoundError(f"no trainer state at {f}: --resume needs a checkpoint written by sft.py or grpo.py")
    return _torch_load(f)

def _torch_load(f: str, **kw):
    try:
        return torch.load(f, map_location="cpu", weights_only=False, **kw)
    except Exception as e:                       # truncated or not a torch file: name it
        raise OSError(f"cannot read {f} ({type(e).__name__}: {e}): the checkpoint is damaged; pass another") from None

def read_checkpoint_config(path: str) -> tuple[dict, str]:
    """(training config saved with a checkpoint folder, the file): `parallel_r1.json` (flat or {"config": ...}),
    else trainer_state.pt's "config" (memory-mapped: the optimizer state is not read). ({}, "") if neither."""
    f = os.path.join(path, "parallel_r1.json")
    if os.path.isfile(f):
        with open(f, encoding="utf-8") as fh:
            d = json.load(fh)
        return (d.get("config", d) if isinstance(d, dict) else {}), f
    f = os.path.join(path, "trainer_state.pt")
    if not os.path.isfile(f):
        return {}, ""
    state = _torch_load(f, mmap=True)
    cfg = dict(state.get("config") or {}) if isinstance(state, dict) else {}
    if isinstance(state, dict) and "mode" in state:              # grpo.py saves its mode next to the config
        cfg.setdefault("mode", state["mode"])
    return cfg, f

def mode_from_config(cfg: dict) -> str | None:
    """The sampler mode a saved config implies: "sequential" for style "sequential", else its mode (or None)."""
    return "sequential" if cfg.get("style") == "sequential" else cfg["mode"] if cfg.get("mode") in MODES else None
