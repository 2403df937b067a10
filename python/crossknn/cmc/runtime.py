"""CMC inference on ONNX Runtime: :class:`CmcReranker` and the ``cmc`` first-stage retriever.

``CmcReranker(model_dir).score(query_vectors, candidate_vectors)`` scores K candidates per query
(any K; batched over queries). :class:`CmcRetriever` is BE -> CMC: the dual encoder's top
``candidates`` items per query, reranked by CMC; it has the retriever interface of
:mod:`crossknn.retrievers` (``retrieve(queries, k)``) and is registered there as ``"cmc"``
(resources: ``cmc_model`` (a model directory or a ``CmcReranker``), ``item_vectors``,
``query_vectors``, optional ``encode``, ``cmc_candidates``, ``encoder_id``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from crossknn.ce.spinning import set_spinning
from crossknn.retrievers import DenseRetriever, query_masks

__all__ = ["DEFAULT_CANDIDATES", "FORMAT", "CmcReranker", "CmcRetriever", "read_info"]

DEFAULT_CANDIDATES = 512
FORMAT = "crossknn-cmc/1"


def read_info(model_dir) -> dict:
    p = Path(model_dir) / "cmc.json"
    if not p.is_file():
        raise FileNotFoundError(f"{model_dir} is not a CMC model directory: cmc.json is missing")
    info = json.loads(p.read_text())
    if info.get("format") != FORMAT:
        raise ValueError(f"{p}: format {info.get('format')!r}, expected {FORMAT!r}")
    return info


class CmcReranker:
    """A trained CMC model on ONNX Runtime (``model.onnx`` + ``cmc.json`` in ``model_dir``)."""

    def __init__(
        self, model_dir: str | os.PathLike, *, threads: int | None = None, batch_size: int = 16
    ) -> None:
        # onnxruntime: loaded only where a model runs (CPU or GPU wheel)
        import onnxruntime as ort

        self.model_dir = Path(model_dir)
        self.info = read_info(self.model_dir)
        onnx = self.model_dir / "model.onnx"
        if not onnx.is_file():
            raise FileNotFoundError(f"{onnx} is missing; run `crossknn cmc export {model_dir}`")
        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = int(threads)
        set_spinning(opts)  # CROSSKNN_ORT_SPINNING
        self._sess = ort.InferenceSession(str(onnx), opts, providers=["CPUExecutionProvider"])
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1; got {batch_size}")
        self.batch_size = batch_size
        self.dim = int(self.info["model"]["dim"])
        self.encoder_id = str(self.info["encoder_id"])

    def __repr__(self) -> str:
        m = self.info["model"]
        return (
            f"CmcReranker(encoder_id={self.encoder_id!r}, dim={self.dim}, "
            f"layers={m['layers']}, trained_k={self.info['train']['k']})"
        )

    def check_encoder(self, encoder_id: str | None, dim: int) -> None:
        """Raises when vectors of ``encoder_id``/``dim`` are not what this model was trained on."""
        if dim != self.dim:
            raise ValueError(
                f"this CMC model takes {self.dim}-dim vectors (encoder "
                f"{self.encoder_id!r}); got {dim}-dim vectors"
            )
        if encoder_id is not None and encoder_id != self.encoder_id:
            raise ValueError(
                f"this CMC model was trained on vectors of encoder "
                f"{self.encoder_id!r}; got vectors of {encoder_id!r}"
            )

    def score(self, query_vectors, candidate_vectors) -> np.ndarray:
        """``query_vectors`` (Q, d), ``candidate_vectors`` (Q, K, d) -> scores float32 (Q, K)."""
        q = np.ascontiguousarray(query_vectors, np.float32)
        c = np.ascontiguousarray(candidate_vectors, np.float32)
        if q.ndim != 2 or c.ndim != 3 or q.shape[0] != c.shape[0]:
            raise ValueError(
                f"expected query vectors (Q, d) and candidate vectors (Q, K, d); "
                f"got {q.shape} and {c.shape}"
            )
        if q.shape[1] != self.dim or c.shape[2] != self.dim:
            raise ValueError(
                f"vectors must have dim {self.dim} (encoder {self.encoder_id!r}); "
                f"got query {q.shape} and candidates {c.shape}"
            )
        if not (np.isfinite(q).all() and np.isfinite(c).all()):
            raise ValueError("query/candidate vectors contain NaN or inf")
        out = np.empty(c.shape[:2], np.float32)
        if c.shape[1] == 0:
            return out
        for s in range(0, q.shape[0], self.batch_size):
            e = s + self.batch_size
            out[s:e] = self._sess.run(["scores"], {"query": q[s:e], "candidates": c[s:e]})[0]
        return out


class CmcRetriever:
    """BE -> CMC: DE top-``candidates`` per query, reranked by CMC (best first)."""

    def __init__(
        self,
        reranker: CmcReranker | str | os.PathLike,
        item_vectors,
        *,
        query_vectors=None,
        encode=None,
        candidates: int = DEFAULT_CANDIDATES,
        encoder_id: str | None = None,
    ) -> None:
        self.reranker = reranker if isinstance(reranker, CmcReranker) else CmcReranker(reranker)
        self.dense = DenseRetriever(item_vectors, query_vectors=query_vectors, encode=encode)
        self.reranker.check_encoder(encoder_id, self.dense.dim)
        self.n_items = self.dense.n_items
        candidates = int(candidates)
        if not 1 <= candidates <= self.n_items:
            raise ValueError(
                f"CMC candidates K={candidates} must be between 1 and the number "
                f"of items ({self.n_items})"
            )
        self.candidates = candidates
        self._items = np.asarray(item_vectors, np.float32)

    def __repr__(self) -> str:
        return f"CmcRetriever(n_items={self.n_items}, candidates={self.candidates})"

    def scores(self, queries: Sequence, *, allow=None) -> tuple[np.ndarray, np.ndarray]:
        """(candidate items (Q, K) int64 in DE order, CMC scores (Q, K)); ``allow``: one mask
        per query (all with at least K allowed items), as :meth:`retrieve`."""
        cand = self.dense.retrieve(queries, self.candidates, allow=allow)
        qv = (
            np.stack([self.dense.query_vector(q) for q in queries])
            if len(queries)
            else np.empty((0, self.dense.dim), np.float32)
        )
        return cand, self.reranker.score(qv, self._items[cand])

    def retrieve(self, queries: Sequence, k: int, *, allow=None) -> np.ndarray:
        """The DE's top-K (K = ``candidates``) reranked by CMC, then the DE's next items when
        k > K. ``allow``: one boolean mask (N,) (or None) per query: the DE's top-K among the
        allowed items (K capped by how many a query's mask allows), reranked by CMC."""
        k = int(k)
        if not 0 <= k <= self.n_items:
            raise ValueError(f"cannot retrieve k={k} items from {self.n_items}")
        if len(queries) == 0:
            return np.empty((0, k), np.int64)
        masks = query_masks(allow, len(queries), self.n_items)
        if any(a is not None and int(a.sum()) < max(k, self.candidates) for a in masks):
            return np.stack(
                [self._retrieve_few(q, k, a) for q, a in zip(queries, masks, strict=True)]
            )
        cand, s = self.scores(queries, allow=allow)
        order = np.argsort(-s, axis=1, kind="stable")
        ranked = np.take_along_axis(cand, order, axis=1)
        if k <= self.candidates:
            return ranked[:, :k]
        # more than K asked for: CMC's K first, then the DE's next items in DE order
        more = self.dense.retrieve(queries, k, allow=allow)[:, self.candidates :]
        return np.concatenate([ranked, more], axis=1)

    def _retrieve_few(self, query, k: int, allow) -> np.ndarray:
        """One query whose mask allows fewer than max(k, K) items: the DE's top min(K, allowed)
        among them reranked by CMC, then the DE's next allowed items."""
        allowed = self.n_items if allow is None else int(allow.sum())
        if allowed < k:
            raise ValueError(f"the query's mask allows {allowed} items; k={k} asked")
        m = min(self.candidates, allowed)
        one = None if allow is None else [allow]
        cand = self.dense.retrieve([query], max(m, k), allow=one)[0]
        qv = self.dense.query_vector(query)[None, :]
        s = self.reranker.score(qv, self._items[cand[:m]][None])[0]
        ranked = cand[:m][np.argsort(-s, kind="stable")]
        return np.concatenate([ranked, cand[m:]])[:k]


def _factory(
    *,
    cmc_model=None,
    item_vectors=None,
    query_vectors=None,
    encode=None,
    cmc_candidates: int | None = None,
    encoder_id: str | None = None,
    **_,
) -> CmcRetriever:
    if cmc_model is None:
        raise ValueError("the 'cmc' retriever needs a trained model directory (--cmc-model DIR)")
    if item_vectors is None:
        raise ValueError("the 'cmc' retriever needs the DE item vectors (e.g. de_items.npy)")
    return CmcRetriever(
        cmc_model,
        item_vectors,
        query_vectors=query_vectors,
        encode=encode,
        candidates=cmc_candidates or DEFAULT_CANDIDATES,
        encoder_id=encoder_id,
    )
