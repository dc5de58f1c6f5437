"""A tiny random Llama model (and a word-level tokenizer) for real SGLang servers.

`make_model(dir)` writes a HF-format model directory SGLang's `launch_server
--model-path` loads without a hub: LlamaConfig (hidden 128, 2 layers, 4 heads,
2 KV heads, head_dim 32, vocab 256, bf16), random weights from a fixed seed,
and a `tokenizers` WordLevel vocabulary of exactly the vocabulary size.

Deterministic: the files are byte-identical run to run (same transformers,
tokenizers and torch). Cached: a directory whose marker holds the same content
hash (of the config, this file's generator version and the library versions)
is reused untouched. Built in a temporary sibling and renamed into place, so a
half-written model is never seen, and two builders racing do no harm.

Run by the serving venv's python:  python serving/model.py [DIR]
"""

import hashlib
import json
import os
import shutil
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

DEFAULT_DIR = os.environ.get("KVXFER_SERVING_MODEL", "/opt/kvxfer-serving/model")
MARKER = ".kvxfer-model.json"
GENERATOR = 1  # bump when the way the files are made changes

SPECIAL = ["<unk>", "<s>", "</s>", "<pad>"]  # ids 0..3
UNK_ID, BOS_ID, EOS_ID, PAD_ID = 0, 1, 2, 3

CONFIG = dict(
    vocab_size=256,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    initializer_range=0.08,  # large enough that greedy argmax does not tie
    tie_word_embeddings=False,
    bos_token_id=BOS_ID,
    eos_token_id=EOS_ID,
    pad_token_id=PAD_ID,
    dtype="bfloat16",
)
SEED = 20261203
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)


def vocabulary(size=CONFIG["vocab_size"]):
    """token -> id, exactly `size` entries: the specials, then w4 .. w{size-1}."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL)}
    for i in range(len(SPECIAL), size):
        vocab[f"w{i}"] = i
    assert len(vocab) == size
    return vocab


def content_hash():
    """Of what the model is, not of the library versions that wrote it: one
    directory serves every release's venv (the files carry both the old and
    the new spelling of the keys transformers 4 and 5 read, see _compat)."""
    blob = json.dumps(
        {
            "config": CONFIG,
            "seed": SEED,
            "generator": GENERATOR,
            "chat_template": CHAT_TEMPLATE,
            "special": SPECIAL,
        },
        sort_keys=True,
    ).encode()
    return hashlib.sha256(blob).hexdigest()


def _cached(path, digest):
    try:
        with open(os.path.join(path, MARKER)) as f:
            return json.load(f).get("hash") == digest
    except (OSError, ValueError):
        return False


def _write(out):
    import torch
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    cfg = dict(CONFIG)
    dtype = cfg.pop("dtype")
    config = LlamaConfig(**cfg)
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)  # _init_weights: normal(0, initializer_range)
    # Deterministic regardless of transformers' init order: redraw every
    # parameter from one generator, in name order (norm weights stay 1).
    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * CONFIG["initializer_range"])
    model = model.to(getattr(torch, dtype))
    model.config.dtype = dtype
    model.save_pretrained(out, safe_serialization=True)

    tok = Tokenizer(WordLevel(vocab=vocabulary(), unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=CONFIG["max_position_embeddings"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    _compat(out)


def _edit_json(path, fn):
    with open(path) as f:
        d = json.load(f)
    fn(d)
    with open(path, "w") as f:
        json.dump(d, f, indent=2, sort_keys=True)
        f.write("\n")


def _compat(out):
    """Make the files readable by transformers 4.x and 5.x alike (SGLang
    releases pin different ones): 5.x writes `rope_parameters`, `dtype` and
    tokenizer_class `TokenizersBackend`, which 4.x does not know."""

    def cfg(d):
        d.setdefault("rope_theta", CONFIG["rope_theta"])
        d.setdefault("rope_scaling", None)
        d["torch_dtype"] = d["dtype"] = CONFIG["dtype"]

    def tok(d):
        d["tokenizer_class"] = "PreTrainedTokenizerFast"
        d.setdefault("chat_template", CHAT_TEMPLATE)

    _edit_json(os.path.join(out, "config.json"), cfg)
    _edit_json(os.path.join(out, "tokenizer_config.json"), tok)
    for name in os.listdir(out):
        os.chmod(os.path.join(out, name), 0o644)
    os.chmod(out, 0o755)


def make_model(path=DEFAULT_DIR, force=False):
    """Create (or reuse) the tiny model at `path`; returns the path."""
    path = os.path.abspath(path)
    digest = content_hash()
    if not force and _cached(path, digest):
        return path
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".model-", dir=parent)
    try:
        _write(tmp)
        with open(os.path.join(tmp, MARKER), "w") as f:
            json.dump({"hash": digest, "config": CONFIG, "seed": SEED}, f, sort_keys=True, indent=1)
        if _cached(path, digest) and not force:  # someone else finished first
            return path
        if os.path.exists(path):
            old = tempfile.mkdtemp(prefix=".model-old-", dir=parent)
            os.rename(path, os.path.join(old, "m"))
            os.rename(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, path)
        tmp = None
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def file_digests(path):
    """name -> sha256 of every file in the model dir (to check byte-identity)."""
    out = {}
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if os.path.isfile(full):
            with open(full, "rb") as f:
                out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", nargs="?", default=DEFAULT_DIR)
    ap.add_argument("--force", action="store_true", help="rebuild even if cached")
    ap.add_argument("--digests", action="store_true", help="print each file's sha256")
    a = ap.parse_args()
    p = make_model(a.dir, force=a.force)
    print(p)
    if a.digests:
        for k, v in file_digests(p).items():
            print(f"{v}  {k}")
    sys.exit(0)
