"""Helpers several test modules share (imported like ref_search: tests/ is on sys.path)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import shutil
import types
from pathlib import Path

import numpy as np
import pytest

from crossknn.data import Corpus, load_corpus
from crossknn.demo_corpus import stdlib_docstrings
from crossknn.scorers import MatrixScorer


class _LazyModule(types.ModuleType):
    """A module imported on its first attribute use (see :func:`lazy_importorskip`)."""

    def __getattr__(self, attr: str):
        # what collection asks of every module global (a test? a fixture? a mock? a wrapper?):
        # private names and these dunders are answered without the import
        if (attr.startswith("_") and not attr.startswith("__")) or attr in _PROBED:
            raise AttributeError(attr)
        return getattr(importlib.import_module(self.__name__), attr)


_PROBED = {"__test__", "__bases__", "__wrapped__", "__signature__", "__call__", "pytestmark"}


def lazy_module(name: str) -> types.ModuleType:
    """``name`` (a module of crossknn that imports torch), imported when a test first uses it."""
    return _LazyModule(name)


def lazy_importorskip(name: str, reason: str | None = None) -> types.ModuleType:
    """``pytest.importorskip(name)`` without the import at collection: the test module is skipped
    when ``name`` is not installed, and the module (torch, transformers, ...) is imported when a
    test first uses it, so that collecting the suite imports none of them."""
    if importlib.util.find_spec(name) is None:
        pytest.skip(reason or f"could not import {name!r}: not installed", allow_module_level=True)
    return _LazyModule(name)


def copy_models(cache: Path, into: Path) -> Path:
    """A model cache of one's own at ``into`` holding copies (not links: a test may damage them)
    of the complete entries of ``cache`` (the run's :func:`model_cache`), so that a test module
    that changes its cache exports nothing the run already exported."""
    for entry in sorted((cache / "models").iterdir()):
        if entry.is_dir() and not entry.name.startswith(".") and ".broken" not in entry.name:
            shutil.copytree(entry, into / "models" / entry.name)
    return into


def write_jsonl_corpus(corpus: Corpus, path: Path) -> Corpus:
    """Write ``corpus`` to ``path`` as JSONL (``id``, ``text``) and return it."""
    path.write_text(
        "".join(
            json.dumps({"id": i, "text": t}) + "\n"
            for i, t in zip(corpus.ids, corpus.texts, strict=True)
        ),
        encoding="utf-8",
    )
    return corpus


def made_corpus(n_items: int, path: Path | None = None) -> Corpus:
    """A small real-text corpus every machine can make: ``n_items`` docstrings of the installed
    standard library (:func:`crossknn.demo_corpus.stdlib_docstrings`), written to ``path`` as
    JSONL if given. No test data needed."""
    corpus = stdlib_docstrings(max_items=n_items)
    return corpus if path is None else write_jsonl_corpus(corpus, path)


def made_beir(folder: Path, n_items: int = 12, n_queries: int = 3) -> Path:
    """A tiny BEIR folder (corpus.jsonl, queries.jsonl, qrels/test.tsv) made from
    :func:`made_corpus`; query i is the first words of item i, judged relevant to it."""
    corpus = made_corpus(n_items)
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    (folder / "corpus.jsonl").write_text(
        "".join(
            json.dumps({"_id": i, "title": "", "text": t}) + "\n"
            for i, t in zip(corpus.ids, corpus.texts, strict=True)
        ),
        encoding="utf-8",
    )
    queries = [(f"q{n}", " ".join(corpus.texts[n].split()[:8])) for n in range(n_queries)]
    (folder / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries), encoding="utf-8"
    )
    (folder / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n"
        + "".join(f"q{n}\t{corpus.ids[n]}\t1\n" for n in range(n_queries)),
        encoding="utf-8",
    )
    return folder


def cisi_head(shared_dir: Path, n_items: int, path: Path) -> Corpus:
    """The first ``n_items`` CISI documents as a corpus, also written to ``path`` as JSONL."""
    full = load_corpus(shared_dir / "data" / "cisi")
    corpus = Corpus(full.ids[:n_items], full.texts[:n_items], f"cisi[:{n_items}]")
    return write_jsonl_corpus(corpus, path)


TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
)


def tiny_bert(path: Path, *, num_labels: int = 1, seed: int = 0, head: bool = True) -> Path:
    """A randomly initialised 2-layer, 32-wide BERT saved as a Hugging Face folder at ``path``
    with the embedded model's tokenizer files (what a user's model folder stands for in the
    tests): ``head`` a BertForSequenceClassification with ``num_labels`` labels, else a bare
    BertModel (an encoder). Weights from ``torch.manual_seed(seed)``."""
    import torch
    import transformers

    from crossknn.ce.models import minilm_checkpoint_dir

    cfg = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=512,
        num_labels=num_labels,
    )
    torch.manual_seed(seed)
    model = transformers.BertForSequenceClassification if head else transformers.BertModel
    model(cfg).eval().save_pretrained(str(path))
    for name in TOKENIZER_FILES:
        shutil.copyfile(minilm_checkpoint_dir() / name, path / name)
    return path


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


def admitted_search(svc, query: str, *, k: int, budget: int) -> dict:
    """One ``/search`` of ``query`` through a loaded ``SearchService`` as the HTTP app makes it:
    admitted (asserted), searched in this thread, released."""
    from crossknn.serve.schema import SearchRequest

    req = SearchRequest(query=query, k=k, budget=budget)
    decision = svc.try_admit(req)
    assert decision.admitted, decision
    ctx = svc.new_context()
    try:
        return svc.search(req, ctx)
    finally:
        svc.release(decision.ticket, ctx)


class RecordingScorer:
    """A score-matrix scorer (crossknn.scorers.MatrixScorer) that records every (query, item)
    pair sent to it and counts its batch calls."""

    def __init__(self, scores):
        self.inner = MatrixScorer(scores)
        self.n_items = self.inner.n_items
        self.pairs: list[tuple[int, int]] = []
        self.batches = 0

    def score(self, q, items):
        return self.score_batch([q], [items])[0]

    def score_batch(self, queries, items):
        self.batches += 1
        for q, it in zip(queries, items, strict=True):
            self.pairs += [(int(q), int(i)) for i in np.asarray(it).ravel()]
        return self.inner.score_batch(queries, items)
