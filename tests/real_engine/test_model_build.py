"""The tiny model builds deterministically, and its seed changes the tokenizer's ids."""

from __future__ import annotations

import json
from pathlib import Path

from headway.realengine.install import VllmVenv
from headway.realengine.model import ModelSpec, build_model

_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


def _files(directory: Path) -> dict[str, bytes]:
    return {name: (directory / name).read_bytes() for name in _FILES}


def test_same_spec_builds_identical_files(vllm_venv: VllmVenv, tmp_path: Path) -> None:
    """Two builds of one spec are byte-identical; another seed permutes the ids only."""
    spec = ModelSpec(corpus_bytes=300_000)
    a = _files(build_model(tmp_path / "a", spec, python=vllm_venv.python))
    b = _files(build_model(tmp_path / "b", spec, python=vllm_venv.python))
    assert a == b
    other = build_model(
        tmp_path / "c", ModelSpec(corpus_bytes=300_000, seed=1), python=vllm_venv.python
    )
    c = _files(other)
    assert c["config.json"] == a["config.json"]
    vocab_a = json.loads(a["tokenizer.json"])["model"]["vocab"]
    vocab_c = json.loads(c["tokenizer.json"])["model"]["vocab"]
    assert vocab_a.keys() == vocab_c.keys() and vocab_a != vocab_c
    config = json.loads(a["config.json"])
    assert config["vocab_size"] == len(vocab_a) <= spec.vocab_size
    assert config["bos_token_id"] == vocab_a["<|begin_of_text|>"]
    assert "<|assistant|>" in json.loads(a["tokenizer_config.json"])["chat_template"]


def test_a_built_directory_is_reused(vllm_venv: VllmVenv, tmp_path: Path) -> None:
    """A directory whose manifest matches the spec is not rebuilt."""
    spec = ModelSpec(corpus_bytes=100_000)
    path = build_model(tmp_path / "m", spec, python=vllm_venv.python)
    stamp = (path / "tokenizer.json").stat().st_mtime_ns
    assert build_model(path, spec, python="/nonexistent/python") == path
    assert (path / "tokenizer.json").stat().st_mtime_ns == stamp
