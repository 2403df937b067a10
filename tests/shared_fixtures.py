"""Helpers several test modules share (imported like ref_search: tests/ is on sys.path)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from crossknn.data import Corpus, load_corpus


def cisi_head(shared_dir: Path, n_items: int, path: Path) -> Corpus:
    """The first ``n_items`` CISI documents as a corpus, also written to ``path`` as JSONL."""
    full = load_corpus(shared_dir / "data" / "cisi")
    corpus = Corpus(full.ids[:n_items], full.texts[:n_items], f"cisi[:{n_items}]")
    path.write_text(
        "".join(
            json.dumps({"id": i, "text": t}) + "\n"
            for i, t in zip(corpus.ids, corpus.texts, strict=True)
        ),
        encoding="utf-8",
    )
    return corpus


def torch_cls_logits(ckpt: Path, pairs, max_length: int) -> np.ndarray:
    """Logits of a Hugging Face sequence-classification checkpoint on (query, item) pairs."""
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(ckpt), local_files_only=True)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        str(ckpt), local_files_only=True, attn_implementation="eager"
    ).eval()
    enc = tok(
        [p[0] for p in pairs],
        [p[1] for p in pairs],
        truncation="longest_first",
        max_length=max_length,
        padding=True,
        return_tensors="pt",
    )
    with torch.no_grad():
        return model(**enc).logits.numpy()
