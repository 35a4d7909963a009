"""Train the tiny model's byte-level BPE tokenizer: a script run by the vLLM venv's Python.

It needs the ``tokenizers`` library, which vLLM brings, and nothing of headway (headway is
not installed in that venv): ``python train_tokenizer.py CORPUS VOCAB_SIZE OUT_JSON
SPECIAL...``. One thread, so the merges do not depend on the machine's core count.
"""

from __future__ import annotations

import importlib
import os
import sys

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"


def main(argv: list[str]) -> int:
    """Train on the corpus (documents separated by NUL) and write ``tokenizer.json``."""
    lib = importlib.import_module("tokenizers")  # in vLLM's venv, not headway's
    decoders, models, pre_tokenizers = lib.decoders, lib.models, lib.pre_tokenizers
    processors, trainers = lib.processors, lib.trainers

    corpus, vocab_size, out, bos, *special = argv
    with open(corpus, encoding="utf-8") as f:
        docs = f.read().split("\0")
    tok = lib.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=int(vocab_size),
        special_tokens=[bos, *special],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    bos_id = tok.token_to_id(bos)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
    )
    tok.save(out, pretty=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
