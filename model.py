"""Models: a Hugging Face causal LM, or the tiny default, with the six parallel tags (NOTES.md §1).

    model, tokenizer = load_model("tiny")                     # ~1M-parameter Qwen3, characters
    model, tokenizer = load_model("Qwen/Qwen3-4B-Base")       # a hub name (the hub or its cache)
    model, tokenizer = load_model("runs/sft/checkpoint-400")  # a local folder (or its shards)

The tags become special tokens, one id each. Each new embedding row starts at the mean of the rows
of its text's pieces plus small noise: rows left identical make the tags unlearnable (NOTES.md §1).
`read_checkpoint_config` tells which mode a checkpoint was trained in (the sampler needs it).
"""
import copy
import functools
import glob
import json
import os
import re
import socket
import string
import urllib.parse
import urllib.request
import warnings
from typing import Literal, get_args

import torch
import torch.distributed.checkpoint as dcp
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)

TAGS = ("<Parallel>", "</Parallel>", "<Path>", "</Path>", "<Summary>", "</Summary>")
Mode = Literal["unseen", "seen", "sequential"]   # Seen/Unseen masks (NOTES.md §2), plain sampling
MODES = get_args(Mode)

# The embedded default: a Qwen3 of ~1.0M parameters (997k with the 105-token character vocabulary).
# It trains at ~5-7k tokens/s on 2 CPU cores, so the curriculum fits in minutes.
TINY_CONFIG = dict(
    hidden_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,               # grouped-query attention, as in Qwen3
    head_dim=32,
    intermediate_size=512,
    max_position_embeddings=512,
    rope_theta=10000.0,
    tie_word_embeddings=True,
    rms_norm_eps=1e-6,
)
ALPHABET = string.digits + string.ascii_letters + string.punctuation + " \n"   # tiny's characters
PAD = "<pad>"
EOS = "<eos>"
UNK = "<unk>"
TAG_INIT_NOISE = 0.02          # a new tag row: mean of its pieces + N(0, (0.02 x the rows' std)^2)
HUB_TIMEOUT_S = 2.0            # how long to wait for the hub before reading its cache only
HUB_ENDPOINT = "https://huggingface.co"          # huggingface_hub's, unless HF_ENDPOINT
OFFLINE_VALUES = ("1", "on", "yes", "true")      # what huggingface_hub reads as "offline"
DEFAULT_PORTS = {"http": 80, "https": 443}
STANDARD_CONFIG_FILES = ("tokenizer.json", "tokenizer_config.json")
WEIGHT_FILES = ("*.safetensors", "*.bin")        # what from_pretrained reads weights from
SHARDED_FOLDER = "dcp"          # a sharded checkpoint's model and optimizer (plumbing.Run.save)
TOKENIZER_FOR = "--model=tiny or a folder holding only a config.json"   # where --tokenizer counts


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """Ids 0-2 <pad>, <eos>, <unk>, then one per character of ALPHABET (others: <unk>); no tags."""
    vocab = {PAD: 0, EOS: 1, UNK: 2}
    for i, ch in enumerate(ALPHABET):
        vocab[ch] = 3 + i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    every_character = Regex(r"[\s\S]")
    tok.pre_tokenizer = pre_tokenizers.Split(every_character, behavior="isolated")
    tok.decoder = decoders.Fuse()                      # joined without spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS,
                                   unk_token=UNK, clean_up_tokenization_spaces=False)


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """The tiny model's tokenizer with the six tags, the ids `load_model("tiny")` gives them,
    without building a model (for reading traces)."""
    tokenizer = build_char_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": list(TAGS)},
                                 replace_extra_special_tokens=False)
    return tokenizer


def add_parallel_tags(model, tokenizer, seed: int = 0) -> list[int]:
    """Add the tags the tokenizer lacks as special tokens and give each new embedding row (input,
    and output if untied) the mean of its pieces' rows plus noise. Returns the new ids."""
    new = [t for t in TAGS if t not in tokenizer.get_vocab()]
    if not new:
        return []
    pieces = {t: tokenizer.encode(t, add_special_tokens=False) for t in new}   # before they exist
    tokenizer.add_special_tokens({"additional_special_tokens": new},
                                 replace_extra_special_tokens=False)
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    generator = torch.Generator().manual_seed(seed)
    emb = model.get_input_embeddings().weight
    out = model.get_output_embeddings()
    tables = [emb]
    if out is not None and out.weight.data_ptr() != emb.data_ptr():      # an untied LM head
        tables.append(out.weight)
    new_ids = tokenizer.convert_tokens_to_ids(new)
    with torch.no_grad():
        for tag, i in zip(new, new_ids):
            rows = [p for p in pieces[tag] if p < emb.shape[0]] or list(range(emb.shape[0]))
            for table in tables:
                base = table[rows].float().mean(0)
                noise = torch.randn(base.shape, generator=generator)
                noise = noise * TAG_INIT_NOISE * table.float().std()
                table[i] = (base + noise.to(base.device)).to(table.dtype)
    return new_ids


def looks_like_a_path(name: str) -> bool:
    """A name that can only be a local path (a hub name is "owner/model"; "runs/sfft", whose first
    part is a folder here, is a mistyped path, not a hub model of owner "runs")."""
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        return True
    if "/" in name and os.path.isdir(name.split("/")[0]):
        return True
    return os.sep != "/" and os.sep in name


def sharded_checkpoint(name: str) -> bool:
    """Whether `name` is a checkpoint folder whose weights are torch.distributed.checkpoint
    shards (--checkpoint=sharded|async: name/dcp, one file a rank, and its .metadata)."""
    return os.path.isfile(os.path.join(name, SHARDED_FOLDER, ".metadata"))


def config_only(name: str) -> bool:
    """Whether `name` is a folder holding a config.json and no weights: an architecture, which
    load_model builds with random weights (on --tokenizer's tokenizer if the folder has none).
    A sharded checkpoint has weights (`sharded_checkpoint`)."""
    if not os.path.isfile(os.path.join(name, "config.json")):
        return False
    if sharded_checkpoint(name):
        return False
    return not any(glob.glob(os.path.join(name, pattern)) for pattern in WEIGHT_FILES)


def check_model_name(name: str, weights: bool = True, flag: str = "--model") -> None:
    """FileNotFoundError, saying what to pass, for a file, a path-like name that is no folder, a
    run folder (naming a checkpoint in it), or (with `weights`) a folder without config.json.
    With flag "--tokenizer" the advice is a tokenizer's."""
    if flag == "--tokenizer" and not os.path.isdir(name) and looks_like_a_path(name):
        raise FileNotFoundError(f"--tokenizer={name}: no such folder; pass a folder holding a "
                                "tokenizer.json (e.g. a downloaded model's) or a hub name like "
                                "Qwen/Qwen3-4B-Base")
    if os.path.isfile(name):
        raise FileNotFoundError(f"{flag}={name} is a file: give a checkpoint folder (e.g. "
                                "runs/demo/grpo/checkpoint-100), a hub name, or tiny")
    if not os.path.isdir(name) and looks_like_a_path(name):
        raise FileNotFoundError(f"no folder {name!r}: pass an existing checkpoint folder (e.g. "
                                "runs/sft/checkpoint-400), a hub name like Qwen/Qwen3-4B-Base, "
                                "or 'tiny'")
    if not os.path.isdir(name):
        return
    has_tokenizer = any(os.path.isfile(os.path.join(name, f)) for f in STANDARD_CONFIG_FILES)
    if not os.path.isfile(os.path.join(name, "config.json")):
        inside = [p for p in glob.glob(os.path.join(name, "checkpoint-*"))
                  if os.path.isdir(p) and re.fullmatch(r"checkpoint-\d+", os.path.basename(p))]
        inside.sort()                                      # by name, then by length: checkpoint-50
        inside.sort(key=len)                               # before checkpoint-100
        if inside:
            example = inside[-1]
            raise FileNotFoundError(f"{name!r} is a run folder, not a checkpoint: pass one of its "
                                    f"checkpoints, e.g. {example!r}")
        if weights and has_tokenizer:                  # a tokenizer's folder, not a model's
            raise FileNotFoundError(f"{name!r} has no config.json: it holds a tokenizer, not a "
                                    f"model; give {flag} a checkpoint or Hugging Face model "
                                    "folder, or train the tiny model on this tokenizer: sft.py "
                                    f"--model=tiny --tokenizer={name}")
        if weights or not has_tokenizer:
            raise FileNotFoundError(f"{name!r} has no config.json: pass a checkpoint folder "
                                    "written by sft.py or grpo.py, or a Hugging Face model "
                                    "folder")
    if not has_tokenizer and config_only(name):         # random weights: --tokenizer's
        return
    if not has_tokenizer:        # it would load as a one-token tokenizer (a division by 0)
        raise FileNotFoundError(f"{name!r} has no tokenizer (tokenizer.json, "
                                "tokenizer_config.json): copy them in from the model it was "
                                "trained from, or pass a complete checkpoint")


def hub_reachable() -> bool:
    """Whether the Hugging Face hub (HF_ENDPOINT, or the proxy in front of it) takes a connection
    within HUB_TIMEOUT_S; never with HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE set. Every hub name
    is loaded behind this probe, from the cache only when it says no: without it, with no
    network huggingface_hub retries each file 5 times (1 + 2 + 4 + 8 + 8 s) before it fails,
    24-58 s for a model (README "Running on the paper's data")."""
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(variable, "").strip().lower() in OFFLINE_VALUES:
            return False
    endpoint = urllib.parse.urlsplit(os.environ.get("HF_ENDPOINT") or HUB_ENDPOINT)
    target = endpoint
    proxy = urllib.request.getproxies().get(endpoint.scheme)
    if proxy and not urllib.request.proxy_bypass(endpoint.hostname or ""):
        target = urllib.parse.urlsplit(proxy)
    try:
        port = target.port or DEFAULT_PORTS.get(target.scheme, DEFAULT_PORTS["https"])
    except ValueError:                                 # a port that is no number
        return False
    return probe(target.hostname or "", port)


@functools.cache
def probe(host: str, port: int) -> bool:
    """Whether host:port accepts a TCP connection within HUB_TIMEOUT_S (once a process)."""
    try:
        socket.create_connection((host, port), timeout=HUB_TIMEOUT_S).close()
        return True
    except OSError:
        return False


def unreachable(name: str, flag: str) -> OSError:
    """The error for a hub name that is not cached while the hub cannot be reached."""
    instead = "--model=tiny for the embedded default"
    if flag == "--tokenizer":
        instead = "no --tokenizer for tiny's own characters"
    return OSError(f"{flag}={name}: not a local folder, not in the Hugging Face cache, and the "
                   "hub cannot be reached (no network, or HF_HUB_OFFLINE=1). Download it where "
                   f"there is a network (`hf download {name} --local-dir <folder>`) "
                   f"and pass {flag}=<folder>; or {instead}")


def load_tokenizer_only(name: str):
    """The tokenizer of --tokenizer (a folder or a cached hub name), for the tiny model. OSError
    naming the flag when there is none."""
    check_model_name(name, weights=False, flag="--tokenizer")
    local_only = not os.path.isdir(name) and not hub_reachable()      # then the hub's cache only
    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=local_only)
    except Exception as e:
        if local_only:
            raise unreachable(name, "--tokenizer") from None
        raise OSError(f"--tokenizer={name}: cannot load a tokenizer from it ({type(e).__name__}: "
                      f"{str(e).splitlines()[0] if str(e) else ''}); pass a folder holding "
                      "tokenizer.json, or a hub name the hub or its cache can give") from None


def build_tiny_model(tokenizer, seed: int) -> Qwen3ForCausalLM:
    """The embedded default, randomly initialised with `seed`, for `tokenizer`'s vocabulary."""
    torch.manual_seed(seed)
    tiny_config = Qwen3Config(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                              eos_token_id=tokenizer.eos_token_id, bos_token_id=None, **TINY_CONFIG)
    model = Qwen3ForCausalLM(tiny_config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    return model


def build_random_model(folder: str, tokenizer: str | None, seed: int, attn_implementation: str):
    """(model, tokenizer) of a folder holding a config.json and no weights (config_only): the
    architecture with random weights (`seed`), the folder's tokenizer or else `tokenizer`'s. For
    checking an architecture's shapes and speed; it knows nothing. OSError when there is no
    tokenizer."""
    from transformers import AutoConfig

    has_tokenizer = any(os.path.isfile(os.path.join(folder, f)) for f in STANDARD_CONFIG_FILES)
    if tokenizer:
        tok = load_tokenizer_only(tokenizer)
    elif has_tokenizer:
        tok = load_tokenizer_only(folder)
    else:
        raise OSError(f"{folder!r} holds a config.json and no weights (random weights) and no "
                      "tokenizer: pass --tokenizer=<a folder holding tokenizer.json, or a hub "
                      "name>")
    architecture = AutoConfig.from_pretrained(folder)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(architecture, attn_implementation=attn_implementation)
    return model, tok


def load_sharded(folder: str, attn_implementation: str):
    """(model, tokenizer) of a sharded checkpoint (`sharded_checkpoint`), in fp32: the folder's
    architecture, then its shards read whole by this process alone (no collective: under torchrun
    the ranks load in turns, plumbing.load_in_turns), as DCP reshards them into full tensors.
    OSError naming the folder when the shards cannot be read."""
    from transformers import AutoConfig

    check_model_name(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    architecture = AutoConfig.from_pretrained(folder)
    model = AutoModelForCausalLM.from_config(architecture, attn_implementation=attn_implementation,
                                             dtype=torch.float32)
    state = {"model": model.state_dict()}                # its tensors are filled in place
    try:
        with warnings.catch_warnings():        # "assuming the intent is to load in a single
            warnings.simplefilter("ignore")    # process": it is
            dcp.load(state, checkpoint_id=os.path.join(folder, SHARDED_FOLDER), no_dist=True)
    except Exception as e:        # a shard missing or truncated: DCP's error names no folder
        raise OSError(f"cannot load the sharded weights in {folder!r} ({type(e).__name__}: {e}); "
                      "the checkpoint may be damaged (or still being written): pass another "
                      "checkpoint") from None
    return model, tokenizer


def load_pretrained(name: str, dtype: torch.dtype, attn_implementation: str):
    """(model, tokenizer) of a folder or a hub name, with errors that say what to do."""
    check_model_name(name)
    local_only = not os.path.isdir(name) and not hub_reachable()      # then the hub's cache only
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=local_only)
    except Exception as e:
        if os.path.isdir(name):                  # the library's error names no file
            raise OSError(f"cannot read the tokenizer in {name!r} ({type(e).__name__}: {e}): its "
                          "tokenizer.json or tokenizer_config.json may be damaged; copy them in "
                          "again from the model it was trained from") from None
        if not local_only:
            raise
        raise unreachable(name, "--model") from None
    try:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, local_files_only=local_only,
                                                     attn_implementation=attn_implementation)
    except Exception as e:        # e.g. a truncated model.safetensors: the library names no file
        if not os.path.isdir(name):
            raise
        raise OSError(f"cannot load the weights in {name!r} ({type(e).__name__}: {e}); the folder "
                      "may be damaged: pass another checkpoint") from None
    return model, tokenizer


def load_model(name_or_path: str, dtype: torch.dtype | None = None, device=None,
               tokenizer: str | None = None, attn_implementation: str = "sdpa", seed: int = 0):
    """(model, tokenizer) with the six tags, the model in eval mode on `device` (default cuda if
    available) in `dtype` (default bf16 on CUDA, fp32 on CPU). `tokenizer` (a folder or hub name;
    tiny, or a folder holding only a config.json: build_random_model): the tokenizer to build the
    model on (tiny's default: characters); `seed`: a random init and the tags' noise. OSError,
    saying what to do, when a hub name is not cached and the hub is unreachable; ValueError for a
    `tokenizer` with a model that brings its own."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if name_or_path == "tiny":
        if tokenizer:
            tok = load_tokenizer_only(tokenizer)
        else:
            tok = build_char_tokenizer()
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        model = build_tiny_model(tok, seed)
    elif config_only(name_or_path):
        model, tok = build_random_model(name_or_path, tokenizer, seed, attn_implementation)
    elif tokenizer:
        raise ValueError(f"--tokenizer={tokenizer}: --model={name_or_path} brings its own "
                         f"tokenizer; --tokenizer is for {TOKENIZER_FOR}")
    elif sharded_checkpoint(name_or_path):
        model, tok = load_sharded(name_or_path, attn_implementation)
    else:
        model, tok = load_pretrained(name_or_path, dtype, attn_implementation)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    add_parallel_tags(model, tok, seed=seed)
    model.config.pad_token_id = tok.pad_token_id
    model.set_attn_implementation(attn_implementation)
    return model.to(device=device, dtype=dtype).eval(), tok


def frozen_copy(model: torch.nn.Module, dtype: torch.dtype, device=None) -> torch.nn.Module:
    """A copy of `model` that only runs forwards (eval mode, no gradients), on `device` (default
    the model's): each parameter is cast to `dtype` as it is copied, so a bf16 copy of an fp32
    model never holds a second fp32 model (copy.deepcopy, then .to(bf16), held one: 16 GB more
    per GPU for Qwen3-4B), and tied parameters stay tied. Buffers are copied as they are: the
    rotary inverse frequencies stay fp32, as in the model and in FSDP2's bf16 forward (which casts
    parameters only); Module.to(bf16) rounds them too, and at position 3,000 that turns Qwen3's
    rotations by up to ~0.5 rad. GRPO's sampler copy and its KL reference
    (plumbing.frozen_models)."""
    copies = {}
    for parameter in model.parameters():
        target = device if device is not None else parameter.device
        weights = parameter.detach().to(device=target, dtype=dtype, copy=True)
        copies[id(parameter)] = torch.nn.Parameter(weights, requires_grad=False)
    copied = copy.deepcopy(model, memo=copies)      # deepcopy takes the parameters from `copies`
    if device is not None:
        copied.to(device)                           # the buffers; no dtype: they stay as they are
    return copied.eval()


def load_torch_file(path: str, mmap: bool = False):
    """torch.load of a file we wrote (CPU); OSError naming the file when it is damaged."""
    try:
        return torch.load(path, map_location="cpu", weights_only=False, mmap=mmap)
    except Exception as e:                       # truncated, or not a torch file: name it
        raise OSError(f"cannot read {path} ({type(e).__name__}: {e}): the checkpoint is damaged; "
                      "pass another") from None


def read_checkpoint_config(path: str) -> tuple[dict, str]:
    """(the training config saved with a checkpoint folder, the file it came from):
    `parallel_r1.json` (flat or {"config": ...}), else trainer_state.pt's "config" (memory-mapped:
    the optimizer state is not read). ({}, "") if there is neither."""
    json_file = os.path.join(path, "parallel_r1.json")
    if os.path.isfile(json_file):
        with open(json_file, encoding="utf-8") as fh:
            saved = json.load(fh)
        if not isinstance(saved, dict):
            return {}, json_file
        return saved.get("config", saved), json_file
    state_file = os.path.join(path, "trainer_state.pt")
    if not os.path.isfile(state_file):
        return {}, ""
    state = load_torch_file(state_file, mmap=True)
    if not isinstance(state, dict):
        return {}, state_file
    cfg = dict(state.get("config") or {})
    if "mode" in state:                                  # grpo.py saves its mode beside the config
        cfg.setdefault("mode", state["mode"])
    return cfg, state_file


def resolve_preset(requested: str, name_or_path: str) -> tuple[str, str]:
    """(the preset a run uses, why): --preset, or for "auto" "tiny" when the model is the
    embedded one or a checkpoint of a run under the tiny preset (its saved config says so), else
    "paper". Never guessed from the vocabulary: a small custom tokenizer is not the tiny model."""
    if requested != "auto":
        return requested, f"--preset={requested}"
    if name_or_path == "tiny":
        return "tiny", "auto: --model=tiny, the embedded model"
    saved = {}
    if os.path.isdir(name_or_path):                      # not a hub name
        saved, source = read_checkpoint_config(name_or_path)
    if saved.get("preset") == "tiny":
        return "tiny", f"auto: the run that wrote {source} used it"
    return "paper", "auto: not the embedded model; --preset=tiny|paper|none chooses"


def mode_from_config(cfg: dict) -> str | None:
    """The sampler mode a saved config implies: "sequential" for the sequential style, else its
    mode (or None)."""
    if cfg.get("style") == "sequential":
        return "sequential"
    if cfg.get("mode") in MODES:
        return cfg["mode"]
    return None

