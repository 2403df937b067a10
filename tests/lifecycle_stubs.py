"""Cheap deterministic stand-in models and a small auto index for the lifecycle tests (refine,
add, remove, versions, kills): the CE score of (query, item) is a fixed function of their texts,
the DE vector a hash of the text, so every run gives the same index."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import numpy as np

from crossknn.corpus.build import build_corpus_index
from crossknn.data import Corpus

WORDS = [f"w{i}" for i in range(24)]


def _vec(text: str, dim: int) -> np.ndarray:
    h = hashlib.sha256(text.encode()).digest()
    v = np.frombuffer(h, np.uint8)[:dim].astype(np.float32) - 127.5
    return v / np.linalg.norm(v)


class StubDE:
    model_id, model_hash, max_length, precision, dim = "stub-de", "de-hash-1", 64, "fp32", 8

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay

    def encode(self, texts, **_):
        time.sleep(self.delay)
        return np.stack([_vec(t, self.dim) for t in texts]).astype(np.float32)


class StubCE:
    """Word overlap plus a small hash term: items sharing words with the query score high."""

    model_id, model_hash, max_length, precision = "stub-ce", "ce-hash-1", 64, "fp32"

    def __init__(self, delay: float = 0.0) -> None:
        self.delay, self.items = delay, []
        self.calls = 0

    def set_items(self, texts) -> None:
        self.items = list(texts)

    @property
    def n_items(self) -> int:
        return len(self.items)

    def score(self, query, items):
        return self.score_batch([query], [items])[0]

    def score_batch(self, queries, items_list):
        time.sleep(self.delay)
        out = []
        for q, its in zip(queries, items_list, strict=True):
            qw = set(q.split())
            row = []
            for i in np.asarray(its).ravel().tolist():
                t = self.items[int(i)]
                row.append(len(qw & set(t.split())) + 0.1 * _vec(q + "|" + t, 2)[0])
            self.calls += len(row)
            out.append(np.asarray(row, np.float32))
        return out


def corpus(n: int = 120, *, prefix: str = "d", seed: int = 0) -> Corpus:
    rng = np.random.default_rng(seed)
    ids = [f"{prefix}{i}" for i in range(n)]
    texts = [
        " ".join(rng.choice(WORDS, 5, replace=False).tolist()) + f" {prefix}{i}" for i in range(n)
    ]
    return Corpus(ids, texts, f"stub:{prefix}{n}")


def queries(n: int, *, seed: int = 1) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, 3, replace=False).tolist()) for _ in range(n)]


def build(out, c: Corpus | None = None, *, rows: int = 4, delay: float = 0.0, **kw):
    c = c or corpus()
    return build_corpus_index(
        c,
        out,
        ce=StubCE(delay),
        de=StubDE(delay),
        calibration_items=6,
        progress=False,
        index_calls=rows * len(c),
        **kw,
    )


def write_items(path: Path, c: Corpus) -> Path:
    path.write_text(
        "".join(
            json.dumps({"id": i, "text": t}) + "\n" for i, t in zip(c.ids, c.texts, strict=True)
        ),
        encoding="utf-8",
    )
    return path


def index_files(out: Path) -> dict:
    """The index's own files (not its work folder or lock), index.json without timing fields."""
    snap = {}
    for p in sorted(out.iterdir()):
        if p.name.startswith("."):
            continue
        if p.name == "index.json":
            snap[p.name] = json.loads(p.read_text())
        else:
            snap[p.name] = p.read_bytes() if p.is_file() else "dir"
    return snap
