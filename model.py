"""Models: load any Hugging Face causal LM (or the tiny embedded default) with the six parallel tags.

    model, tokenizer = load_model("tiny")                      # ~1M-parameter Qwen3, character tokenizer, offline
    model, tokenizer = load_model("Qwen/Qwen3-4B-Base")        # a hub name (needs the hub)
    model, tokenizer = load_model("runs/sft/checkpoint")       # a local folder, e.g. one of our checkpoints
    model, tokenizer = load_model("tiny", tokenizer="path/to/qwen3_tokenizer")  # tiny model, real tokenizer

Every model comes back with the tags of PAPER_NOTES §1.2 registered as special tokens, each one id.
New tag embeddings start at the mean of the embeddings of the tag's own text pieces plus small noise:
rows left identical (as in the official Qwen3-0.6B path) make the tags unlearnable (§8.2.9).

`save_checkpoint` writes Hugging Face format (safetensors, config, generation config, tokenizer) plus an
optional `trainer_state.pt`, atomically: a crash never leaves a half-written checkpoint under the name.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import string
import tempfile

import torch

TAGS = ("<Parallel>", "</Parallel>", "<Path>", "</Path>", "<Summary>", "</Summary>")

# The embedded default: a Qwen3-architecture model of ~1.0M parameters (with the 105-token character
# vocabulary below: 997k). Sized from ENV_NOTES §3: at 2 CPU cores it trains at ~5-7k tokens/s, so the
# whole curriculum fits in minutes. Context 512 tokens: the synthetic task's traces are < 200.
TINY_CONFIG = dict(
    hidden_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,          # GQA, as in the real Qwen3 models
    head_dim=32,
    intermediate_size=512,
    max_position_embeddings=512,
    rope_theta=10000.0,
    tie_word_embeddings=True,
    rms_norm_eps=1e-6,
)

# Character alphabet of the tiny tokenizer: printable ASCII (space included) and newline.
ALPHABET = string.digits + string.ascii_letters + string.punctuation + " \n"
PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"


def build_char_tokenizer():
    """A character-level `PreTrainedTokenizerFast`: ids 0-2 are <pad>, <eos>, <unk>, then one id per
    character of `ALPHABET` (96). Any other character encodes to <unk>, so real datasets still tokenize.
    The six tags are *not* in it yet; `add_parallel_tags` adds them like for any other tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {PAD: 0, EOS: 1, UNK: 2}
    for ch in ALPHABET:
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every char alone
    tok.decoder = decoders.Fuse()                 # join characters without spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK,
                                   clean_up_tokenization_spaces=False)


def add_parallel_tags(model, tokenizer, seed: int = 0) -> list[int]:
    """Register the six tags as special tokens and initialise their embedding rows.

    Each new row = mean of the input embeddings of the pieces the tag's text tokenized to *before* the
    tag existed, plus N(0, (0.02*std)^2) noise; the same for the output rows when they are not tied.
    Tags the tokenizer already has are left alone (so loading our checkpoints adds nothing).
    Returns the ids of the newly added tags (empty if none).
    Raises ValueError if a tag still does not encode to exactly one id afterwards.
    """
    new = [t for t in TAGS if t not in tokenizer.get_vocab()]
    pieces = {t: tokenizer.encode(t, add_special_tokens=False) for t in new}
    if new:
        tokenizer.add_special_tokens({"additional_special_tokens": new}, replace_extra_special_tokens=False)
    ids = [tokenizer.convert_tokens_to_ids(t) for t in TAGS]
    for t, i in zip(TAGS, ids):
        if tokenizer.encode(t, add_special_tokens=False) != [i]:
            raise ValueError(f"tag {t!r} does not encode to one id after adding it")
    if not new:
        return []
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    gen = torch.Generator().manual_seed(seed)
    emb = model.get_input_embeddings().weight
    out = model.get_output_embeddings()
    untied = out is not None and out.weight.data_ptr() != emb.data_ptr()
    new_ids = [tokenizer.convert_tokens_to_ids(t) for t in new]
    with torch.no_grad():
        for t, i in zip(new, new_ids):
            src = [p for p in pieces[t] if p < emb.shape[0]] or list(range(emb.shape[0]))
            for w in ([emb] + ([out.weight] if untied else [])):
                base = w[src].float().mean(0)
                noise = torch.randn(base.shape, generator=gen) * 0.02 * w.float().std()
                w[i] = (base + noise.to(base.device)).to(w.dtype)
    return new_ids


def _tiny_model(vocab_size: int, tokenizer, seed: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=vocab_size, pad_token_id=tokenizer.pad_token_id,
                      eos_token_id=tokenizer.eos_token_id, bos_token_id=None, **TINY_CONFIG)
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(cfg)


def check_model_name(name_or_path: str, weights: bool = True) -> None:
    """Raise FileNotFoundError when `name_or_path` is written like a local path (starts with . / ~, or
    has more than one "/", unlike a hub id "org/name") and no such folder exists; when the folder has no
    config.json but checkpoint-<step> subfolders (a run folder: the message names the latest one); and,
    with `weights` (a model, not just a tokenizer), when it has no config.json."""
    p = name_or_path
    if not os.path.isdir(p) and (p.startswith((".", "/", "~")) or p.count("/") > 1 or os.sep != "/" and os.sep in p):
        raise FileNotFoundError(f"no folder {p!r}: pass an existing checkpoint folder (e.g. runs/sft/checkpoint-400), "
                                "a hub name like Qwen/Qwen3-4B-Base, or 'tiny'")
    if os.path.isdir(p) and not os.path.isfile(os.path.join(p, "config.json")):
        steps = sorted((d for d in os.listdir(p) if re.fullmatch(r"checkpoint-\d+", d)), key=lambda d: int(d[11:]))
        if steps:
            raise FileNotFoundError(f"{p!r} is a run folder, not a checkpoint: pass one of its checkpoints, "
                                    f"e.g. {os.path.join(p, steps[-1])!r}")
        if weights or not any(os.path.isfile(os.path.join(p, f)) for f in ("tokenizer.json", "tokenizer_config.json")):
            raise FileNotFoundError(f"{p!r} has no config.json: pass a checkpoint folder written by "
                                    "save_checkpoint or a Hugging Face model folder")


def _hub_reachable(timeout: float = 2.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    host = os.environ.get("HF_ENDPOINT", "https://huggingface.co").split("://")[-1].split("/")[0]
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def load_model(name_or_path: str, dtype: torch.dtype | None = None, device: str | torch.device | None = None,
               tokenizer: str | None = None, attn_implementation: str = "sdpa", seed: int = 0):
    """Load a causal LM and its tokenizer, with the six parallel tags added.

    Args:
        name_or_path: "tiny" (the embedded default, built offline), a local folder (a Hugging Face
            checkpoint, e.g. one written by `save_checkpoint`), or a hub name (Qwen2/2.5, Qwen3, Llama, ...).
        dtype: parameter dtype; default bfloat16 on CUDA, float32 on CPU.
        device: default "cuda" if available else "cpu".
        tokenizer: only with "tiny": a tokenizer folder or hub name to build the tiny model on instead
            of the character tokenizer (e.g. the real Qwen3 tokenizer).
        attn_implementation: "sdpa" (default) or "eager"; both take our 4-D additive masks.
        seed: initialisation seed of the tiny model and of the tag-embedding noise.
    Returns:
        (model, tokenizer); the model is in eval mode, on `device`, in `dtype`.
    Raises:
        OSError with what to do when the name is neither "tiny" nor a folder and the hub cannot be
        reached (instead of a long retry loop).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    if name_or_path == "tiny":
        if tokenizer:
            check_model_name(tokenizer, weights=False)
        tok = AutoTokenizer.from_pretrained(tokenizer) if tokenizer else build_char_tokenizer()
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        base_len = len(tok)
        model = _tiny_model(base_len, tok, seed)
        model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    else:
        if tokenizer is not None:
            raise ValueError("tokenizer= is only for load_model('tiny', tokenizer=...)")
        check_model_name(name_or_path)
        local = os.path.isdir(name_or_path)
        if not local and not _hub_reachable():
            try:  # maybe it is in the local hub cache
                AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)
            except Exception:
                raise OSError(
                    f"{name_or_path!r} is not a local folder and the Hugging Face hub cannot be reached "
                    "(offline or HF_HUB_OFFLINE=1). Download the model on a machine with internet "
                    "(e.g. `huggingface-cli download <name> --local-dir <folder>`) and pass the folder, "
                    "or use 'tiny' for the embedded default.") from None
        kw = {} if local or _hub_reachable() else {"local_files_only": True}
        tok = AutoTokenizer.from_pretrained(name_or_path, **kw)
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype,
                                                     attn_implementation=attn_implementation, **kw)
    add_parallel_tags(model, tok, seed=seed)
    model.config.pad_token_id = tok.pad_token_id
    model.set_attn_implementation(attn_implementation)
    return model.to(device=device, dtype=dtype).eval(), tok


def save_checkpoint(path: str, model, tokenizer, trainer_state: dict | None = None,
                    state_dict: dict | None = None) -> str:
    """Write `model` and `tokenizer` in Hugging Face format to folder `path`, atomically.

    Everything is written to a temporary sibling folder first; only a complete folder is renamed to
    `path` (an existing `path` is moved aside first and deleted after; put back if the second rename
    fails). `trainer_state` (optimizer,
    scheduler, RNG, data position, step, ...) goes to `path/trainer_state.pt`. `state_dict`: the full
    (gathered) weights when the model is sharded with FSDP2; a tied output matrix is dropped from it.
    `transformers` loads the result directly: `AutoModelForCausalLM.from_pretrained(path)`. Returns `path`.
    """
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-" + os.path.basename(path) + "-", dir=parent)
    os.chmod(tmp, 0o755)                          # mkdtemp makes it private; a checkpoint is ordinary output
    old = None
    try:
        unwrapped = getattr(model, "module", model)
        if state_dict is not None and getattr(unwrapped.config, "tie_word_embeddings", False):
            state_dict = {k: v for k, v in state_dict.items() if k != "lm_head.weight"}
        unwrapped.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict)
        tokenizer.save_pretrained(tmp)
        if trainer_state is not None:
            torch.save(trainer_state, os.path.join(tmp, "trainer_state.pt"))
        if os.path.exists(path):                  # replacing: move the old one aside, rename, then delete it
            old = tempfile.mkdtemp(prefix=".old-" + os.path.basename(path) + "-", dir=parent)
            os.rmdir(old)
            os.replace(path, old)
        os.replace(tmp, path)
        if old:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        if old and os.path.exists(old) and not os.path.exists(path):
            os.replace(old, path)                 # failed between the two renames: put the old one back
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def load_trainer_state(path: str) -> dict:
    """The `trainer_state.pt` saved next to a checkpoint. Raises FileNotFoundError naming the path."""
    f = os.path.join(path, "trainer_state.pt")
    if not os.path.isfile(f):
        raise FileNotFoundError(f"no trainer state at {f}: --resume needs a checkpoint written by this project's trainers")
    return torch.load(f, map_location="cpu", weights_only=False)


if __name__ == "__main__":
    m, t = load_model("tiny")
    n = sum(p.numel() for p in m.parameters())
    print(f"tiny model: {n:,} parameters, vocab {len(t)}, tags {[t.convert_tokens_to_ids(x) for x in TAGS]}")
