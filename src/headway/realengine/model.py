"""Build the tiny Llama-shaped model that the real-engine tier serves, deterministically.

No model hub is reachable from a test machine, so the model is made here: a Llama
``config.json``, a byte-level BPE tokenizer trained on text every machine has (the licence
texts in ``/usr/share/common-licenses`` and the Python standard library's sources), a chat
template, and no weights (vLLM serves it with ``--load-format dummy``). The same spec and
the same corpus give the same bytes in every file; ``headway-model.json`` records the
spec and the corpus digest, so a built directory is reused only when both match.

vLLM's dummy weights do not depend on ``--seed`` (every tensor is drawn from a generator
seeded 1234), and with weights that small the greedy next token depends on the previous
token's embedding row alone: changing ``rms_norm_eps`` or ``rope_theta`` changes no answer
(tried). So the spec's ``seed`` permutes the tokenizer's ids (the special tokens keep
theirs): the same text becomes other ids, which meet other embedding rows, and two seeds
answer the same prompt with other tokens (a replica serving another model).
"""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sysconfig
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["ModelSpec", "build_model", "corpus_documents", "default_model_dir"]

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
"""Role tag, content, end tag; the generation prompt opens the assistant's turn."""

_BUILDER_VERSION = 1
"""Bump when the files change for the same spec (a built directory is then rebuilt)."""
_MANIFEST = "headway-model.json"
_LICENSES = Path("/usr/share/common-licenses")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """The model's shape and seed (about 22 M parameters at the defaults)."""

    hidden_size: int = 512
    num_hidden_layers: int = 6
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    intermediate_size: int = 1536
    vocab_size: int = 8192
    """The tokenizer's target size; the config takes the size training reached."""
    max_position_embeddings: int = 2048
    seed: int = 0
    """Permutes the tokenizer's ids: another seed, other answers (0: training's ids)."""
    corpus_bytes: int = 2_000_000
    """Text the tokenizer is trained on, at most."""


def corpus_documents(limit_bytes: int) -> list[str]:
    """The training text: licence texts, then standard-library modules, in name order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in _LICENSES.glob("*") if p.is_file())
    files += sorted(stdlib.glob("*.py"))
    docs: list[str] = []
    total = 0
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        if total + len(text) > limit_bytes:
            break
        docs.append(text)
        total += len(text)
    if not docs:
        raise FileNotFoundError(
            f"no text to train the tokenizer on: {_LICENSES} and {stdlib} hold no files"
        )
    return docs


def default_model_dir(spec: ModelSpec) -> Path:
    """``~/.cache/headway/models/tiny-llama-seed{seed}`` (beside the vLLM venv)."""
    from headway.realengine.install import default_venv_path

    return default_venv_path().parent / "models" / f"tiny-llama-seed{spec.seed}"


def _llama_config(spec: ModelSpec, vocab_size: int, bos_id: int, eos_id: int) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.hidden_size // spec.num_attention_heads,
        "intermediate_size": spec.intermediate_size,
        "hidden_act": "silu",
        "vocab_size": vocab_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "float32",
        "initializer_range": 0.02,
    }


def _permute_ids(tokenizer: dict[str, Any], seed: int, *, first: int) -> None:
    """Give the ids from ``first`` on to the same tokens in a seeded order (merges are by
    token text, so they stay valid)."""
    vocab: dict[str, int] = tokenizer["model"]["vocab"]
    movable = sorted(i for i in vocab.values() if i >= first)
    shuffled = movable.copy()
    random.Random(seed).shuffle(shuffled)
    new_id = dict(zip(movable, shuffled, strict=True))
    tokenizer["model"]["vocab"] = {t: new_id.get(i, i) for t, i in vocab.items()}


def _write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def build_model(directory: Path, spec: ModelSpec, *, python: str) -> Path:
    """Build the model into ``directory`` (reused when its manifest matches); returns it.

    ``python`` is an interpreter with the ``tokenizers`` library (the vLLM venv's).
    """
    docs = corpus_documents(spec.corpus_bytes)
    corpus = "\0".join(docs)
    digest = hashlib.sha256(corpus.encode("utf-8")).hexdigest()
    manifest = {"builder": _BUILDER_VERSION, "spec": asdict(spec), "corpus_sha256": digest}
    marker = directory / _MANIFEST
    if marker.is_file() and json.loads(marker.read_text(encoding="utf-8")) == manifest:
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    corpus_file = directory / "corpus.txt"
    corpus_file.write_text(corpus, encoding="utf-8")
    tokenizer_file = directory / "tokenizer.json"
    script = Path(__file__).with_name("train_tokenizer.py")
    args = [python, str(script), str(corpus_file), str(spec.vocab_size), str(tokenizer_file)]
    done = subprocess.run(
        [*args, BOS, EOS, *ROLE_TOKENS], capture_output=True, text=True, check=False
    )
    corpus_file.unlink()
    if done.returncode != 0:
        raise RuntimeError(
            f"training the tokenizer with {python} failed ({done.returncode}): "
            f"{done.stderr.strip()[-2000:]}"
        )
    vocab = json.loads(tokenizer_file.read_text(encoding="utf-8"))
    ids = {t["content"]: t["id"] for t in vocab["added_tokens"]}
    vocab_size = len(vocab["model"]["vocab"])
    if spec.seed:
        _permute_ids(vocab, spec.seed, first=len(ids))
        tokenizer_file.write_text(json.dumps(vocab, separators=(",", ":")), encoding="utf-8")
    _write_json(directory / "config.json", _llama_config(spec, vocab_size, ids[BOS], ids[EOS]))
    _write_json(
        directory / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": BOS,
            "eos_token": EOS,
            "pad_token": EOS,
            "add_bos_token": True,
            "model_max_length": spec.max_position_embeddings,
            "chat_template": CHAT_TEMPLATE,
            "clean_up_tokenization_spaces": False,
        },
    )
    _write_json(
        directory / "generation_config.json",
        {"bos_token_id": ids[BOS], "eos_token_id": ids[EOS]},
    )
    _write_json(marker, manifest)
    return directory
