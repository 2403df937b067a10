"""What every backend's scorers share (crossknn.ce.backends: ONNX Runtime, PyTorch).

A backend brings a *session* (``self._s``): an object with ``manifest``, ``model_dir``,
``model_hash``, ``provider``, ``precision``, ``source``, ``run(feeds) -> np.ndarray`` (what the
exported graph outputs for one batch of assembled inputs) and ``close()``. Everything around the
session is here, once: the model folder's tokenizer and options, the identity of
:class:`crossknn.ce.interface.ModelInfo`, the item store and the query cache, pairs truncated
``longest_first`` and cut into length-sorted batches under a token budget, the scorer protocol of
:mod:`crossknn.search` (``score``, ``score_batch``) and :class:`DualEncoderBase`'s ``encode``.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from crossknn.ce import token_cache
from crossknn.ce.tokenize import IdStore, TokenizerPlan, check_texts, longest_first

__all__ = ["CrossEncoderBase", "DualEncoderBase", "ModelBase", "length_batches", "pair_indices"]

log = logging.getLogger("crossknn.ce")

_ENCODE_CHUNK = 8192  # texts per tokenizer call (a progress step on a large corpus)
# distinct documents per slice (at least; a batch's pairs if larger) of an uncached call whose
# tokenizing overlaps the device's work (CrossEncoderBase._score_pairs): a full batch, work for
# the tokenizer's threads, and short enough that little of the first slice is left unoverlapped
OVERLAP_DOCS = 256


def on_cpu(provider: str | None) -> bool:
    """Whether a model runs on the CPU: ONNX Runtime's CPU provider, the torch backend's
    ``"cpu"``, or not known (``None``)."""
    return provider in (None, "CPUExecutionProvider", "cpu")


def check_positive(name: str, value: Any, *, allow_none: bool = False) -> None:
    if allow_none and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int; got {value!r}")


def progress_bar(iterable, enabled: bool, desc: str, total: int):
    return tqdm(iterable, desc=desc, total=total, unit="batch") if enabled else iterable


def length_batches(lengths: np.ndarray, batch_size: int, max_batch_tokens: int) -> list[np.ndarray]:
    """Indices sorted by length (longest first), cut into batches of at most ``batch_size``
    sequences and ``max_batch_tokens`` padded tokens (a batch's longest times its size); a
    sequence longer than the token budget gets a batch of its own."""
    order = np.argsort(-lengths, kind="stable")
    batches, start, n = [], 0, len(order)
    while start < n:
        longest = int(lengths[order[start]])
        size = max(1, min(batch_size, max_batch_tokens // max(longest, 1)))
        batches.append(order[start : start + size])
        start += size
    return batches


def pair_indices(pairs) -> tuple[list[str], list[str], np.ndarray, np.ndarray, bool]:
    """``(queries, documents, ia, ib, single)`` of ``(query, document)`` string pairs: the distinct
    texts in first-seen order and each pair's index into them; ``single``: one pair was given
    (not a list of them). A string or a malformed pair is a ``TypeError`` naming its position."""
    if isinstance(pairs, (str, bytes)):
        raise TypeError("pairs must be a list of (query, document) string pairs, got a string")
    single = (
        isinstance(pairs, (tuple, list))
        and len(pairs) == 2
        and isinstance(pairs[0], str)
        and isinstance(pairs[1], str)
    )
    pairs = [tuple(pairs)] if single else list(pairs)
    qs: dict[str, int] = {}
    ds: dict[str, int] = {}
    ia = np.empty(len(pairs), dtype=np.int64)
    ib = np.empty(len(pairs), dtype=np.int64)
    for i, pair in enumerate(pairs):
        if (
            isinstance(pair, (str, bytes))
            or len(pair) != 2
            or not isinstance(pair[0], str)
            or not isinstance(pair[1], str)
        ):
            raise TypeError(
                "pairs must be a list of (query, document) string pairs; "
                f"got {type(pair).__name__} {pair!r:.60} at position {i}"
            )
        ia[i] = qs.setdefault(pair[0], len(qs))
        ib[i] = ds.setdefault(pair[1], len(ds))
    return list(qs), list(ds), ia, ib, single


def check_rank_args(query, documents, top_k, doc_ids, num_labels: int):
    """The checked ``(documents, doc_ids)`` of a ``rank`` call (sentence-transformers' meaning:
    ``top_k`` None for all, 0 for none)."""
    if not isinstance(query, str):
        raise TypeError(f"query must be a string; got {type(query).__name__}")
    if isinstance(top_k, (list, tuple, np.ndarray)):
        raise TypeError(
            "rank's third argument is top_k, an int, as in sentence-transformers' "
            "CrossEncoder.rank(query, documents, top_k, return_documents, ...); pass "
            f"document ids as doc_ids=[...]; got a {type(top_k).__name__}"
        )
    documents = check_texts(documents, "documents")
    if doc_ids is not None:
        doc_ids = list(doc_ids)
        if len(doc_ids) != len(documents):
            raise ValueError(
                f"doc_ids and documents differ in length: {len(doc_ids)} vs {len(documents)}"
            )
    if top_k is not None and (
        isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 0
    ):
        raise ValueError(f"top_k must be None or an int >= 0; got {top_k!r}")
    if num_labels != 1:
        raise ValueError(f"rank needs a one-score model; this one has {num_labels} labels")
    return documents, doc_ids


def ranked(scores: np.ndarray, top_k, documents, doc_ids, return_documents) -> list[dict]:
    """``rank``'s rows: best first, ties by the lower ``corpus_id``."""
    out = []
    for i in np.argsort(-scores, kind="stable")[:top_k]:
        row: dict[str, Any] = {"corpus_id": int(i), "score": float(scores[i])}
        if doc_ids is not None:
            row["id"] = doc_ids[i]
        if return_documents:
            row["text"] = documents[i]
        out.append(row)
    return out


class ModelBase:
    """The tokenizer, the options and the identity around a backend's session ``self._s``.

    Subclasses set ``backend`` (its name in crossknn.ce.backends), ``_kinds`` (the manifest
    kinds they load), ``_template`` ("pair" or "single": the TokenizerPlan template of the
    inputs), ``_pair_feeds`` / ``_single_feeds`` (how a batch's arrays are assembled from cached
    ids) and the batch defaults, then call :meth:`_setup` once their session is open.
    """

    backend = ""
    _kinds: tuple[str, ...] = ()
    _template = "pair"
    _batch_size = 16
    _max_batch_tokens = 2048
    _names = ("DualEncoder", "CrossEncoder")  # the class names an error about the kind suggests
    _s: Any

    def _setup(
        self,
        *,
        max_length: int | None,
        batch_size: int,
        max_batch_tokens: int,
        show_progress_bar: bool,
    ) -> None:
        m = self._s.manifest
        if m["kind"] not in self._kinds:
            other = self._names[0] if m["kind"] == "dual-encoder" else self._names[1]
            raise ValueError(f"{self._s.model_dir} holds a {m['kind']} model; load it with {other}")
        self._plan = TokenizerPlan(Path(self._s.model_dir) / "tokenizer.json")
        limit = int(m.get("max_positions", 512))
        if max_length is not None and (
            isinstance(max_length, bool)
            or not isinstance(max_length, (int, np.integer))
            or not 8 <= max_length <= limit
        ):
            raise ValueError(f"max_length must be an int in [8, {limit}]; got {max_length!r}")
        self.max_length = int(m["max_length"] if max_length is None else max_length)
        check_positive("batch_size", batch_size)
        check_positive("max_batch_tokens", max_batch_tokens)
        self.batch_size = int(batch_size)
        self.max_batch_tokens = int(max_batch_tokens)
        self.show_progress_bar = bool(show_progress_bar)
        self._tpl = getattr(self._plan, self._template)
        self._room = self.max_length - self._tpl.n_special  # tokens left for the text(s)
        self._lock = threading.Lock()
        self._warned = False

    # -- identity (crossknn.ce.interface.ModelInfo) -------------------------------------------
    @property
    def model_id(self) -> str:
        return str(self._s.manifest["model_id"])

    @property
    def model_hash(self) -> str:
        """sha256 of the model folder's ONNX file that identifies it (the fp32 one for torch)."""
        return str(self._s.model_hash)

    @property
    def provider(self) -> str:
        """What actually runs the model: an ONNX Runtime execution provider (with "auto": the
        first whose session opened) or a torch device."""
        return self._s.provider

    @property
    def precision(self) -> str:
        return self._s.precision

    @property
    def model_dir(self) -> Path:
        """The exported model directory this scorer runs."""
        return self._s.model_dir

    @property
    def source(self) -> str | None:
        """The Hugging Face folder the model was exported from (per its manifest), if known."""
        return self._s.source

    @property
    def kind(self) -> str:
        return str(self._s.manifest["kind"])

    def close(self) -> None:
        """Drop the session; the scorer is unusable afterwards."""
        self._s.close()

    # -- text -> cached ids ---------------------------------------------------------------------
    def _warn_truncated(self, n: int) -> None:
        with self._lock:
            if self._warned:
                return
            self._warned = True
        log.warning(
            "crossknn.ce: %d input(s) longer than max_length=%d were truncated (longest_first for "
            "pairs); this warning is shown once per scorer",
            n,
            self.max_length,
        )

    def _encode_store(
        self, texts: list[str], progress: bool = False, longer_than: int | None = None
    ) -> IdStore:
        """``longer_than``: the texts are truncated (and compared) only against this bound or
        less here, so a long text is tokenized up to a word past it (TokenizerPlan.encode)."""
        ids: list[list[int]] = []
        chunks = range(0, len(texts), _ENCODE_CHUNK)
        bar = progress and len(texts) > _ENCODE_CHUNK
        need = None if longer_than is None else int(longer_than) + 1
        for start in progress_bar(chunks, bar, "tokenize", len(chunks)):
            ids.extend(self._plan.encode(texts[start : start + _ENCODE_CHUNK], need))
        return IdStore(ids, self._room)

    def _item_store(self, texts: list[str]) -> IdStore:
        """The items' ids: from the token cache when this tokenizer stored these texts before
        (crossknn.ce.token_cache: a restarted server skips the tokenizing), else tokenized and
        stored."""
        cached = token_cache.enabled() and len(texts) >= token_cache.MIN_TEXTS
        if cached:
            key = token_cache.store_key(self._plan.digest, self._room, texts)
            store = token_cache.load_store(key, len(texts), self._room)
            if store is not None:
                return store
        store = self._encode_store(texts, self.show_progress_bar)
        if cached:
            token_cache.save_store(key, store)
        return store

    def pin_graphs(self) -> None:
        """On a GPU with CUDA graphs: from now on only the threads that called :meth:`warmup`
        replay graphs; any other thread runs its batches without one instead of capturing its
        own (onnxruntime keeps graphs per thread). ``crossknn serve`` warms each CE worker thread
        up and pins the CE (its ONNX DE has no graphs), so that request threads never capture.
        A no-op elsewhere."""
        pin = getattr(self._s, "pin_graphs", None)
        if pin is not None:
            pin()


# the most bytes of query texts and token ids the CE's query cache keeps
QUERY_CACHE_BYTES = 32 << 20


def _query_bytes(query: str, store: IdStore) -> int:
    return len(query) + int(store.flat.nbytes) + 64


class CrossEncoderBase(ModelBase):
    """Pairs from cached ids through the session: the item store, the query LRU cache and the
    scorer protocol of :mod:`crossknn.search` (``score``, ``score_batch``)."""

    _kinds = ("cls-ce", "joint-ce")
    _template = "pair"

    def _setup_items(self, items: list[str] | None, query_cache_size: int) -> None:
        m = self._s.manifest
        self._joint = m["kind"] == "joint-ce"
        self.num_labels = 1 if self._joint else int(m["num_labels"])
        self.activation = "none" if self._joint else str(m["activation"])
        self._items: IdStore | None = None
        self._qcache: OrderedDict[str, IdStore] = OrderedDict()
        self._qcache_size = int(query_cache_size)
        self._qcache_bytes = 0  # of its query texts and token ids (at most QUERY_CACHE_BYTES)
        if items is not None:
            self.set_items(items)

    # -- items ------------------------------------------------------------------------------
    @property
    def n_items(self) -> int:
        store = self._items
        return 0 if store is None else len(store)

    def set_items(self, texts: list[str]) -> None:
        """Tokenize the item texts once; :meth:`score` then takes item indices into this list."""
        store = self._item_store(check_texts(texts, "items"))
        with self._lock:
            self._items = store

    def items_cut(self) -> int:
        """How many of the items set (:meth:`set_items`) are longer than ``max_length`` allows
        an item next to the shortest query (one token): their pairs are always truncated."""
        store = self._store()
        return int(np.count_nonzero(store.lengths > self._room - 1))

    def _store(self) -> IdStore:
        store = self._items
        if store is None:
            raise ValueError("no items set: pass items=[...] or call set_items(texts) first")
        return store

    # -- scoring core -----------------------------------------------------------------------
    def _query_store(self, query: str) -> IdStore:
        return self._query_stores([query])[0]

    def _query_stores(self, queries: list[str]) -> list[IdStore]:
        """One store per query from the LRU cache; the queries not in it are tokenized in one
        call (a search asks for the same query in every round, a serve batch for a few)."""
        got: dict[str, IdStore] = {}
        with self._lock:
            for q in queries:
                store = self._qcache.get(q)
                if store is not None:
                    self._qcache.move_to_end(q)
                    got[q] = store
        new = list(dict.fromkeys(q for q in queries if q not in got))
        if new:
            for q, ids in zip(new, self._plan.encode(new), strict=True):
                got[q] = IdStore([ids], self._room)
            with self._lock:
                for q in new:
                    if q not in self._qcache:
                        self._qcache_bytes += _query_bytes(q, got[q])
                    self._qcache[q] = got[q]
                # the oldest go beyond the count or the bytes (a few very long queries)
                while len(self._qcache) > 1 and (
                    len(self._qcache) > self._qcache_size or self._qcache_bytes > QUERY_CACHE_BYTES
                ):
                    q, store = self._qcache.popitem(last=False)
                    self._qcache_bytes -= _query_bytes(q, store)
        return [got[q] for q in queries]

    def _run_pairs(
        self,
        A: IdStore,
        ia: np.ndarray,
        B: IdStore,
        ib: np.ndarray,
        *,
        batch_size: int | None = None,
        apply_activation: bool = True,
        show_progress_bar: bool | None = None,
        truncated: list[int] | None = None,
    ) -> np.ndarray:
        """Scores of the pairs ``(A[ia[i]], B[ib[i]])``: truncated longest-first, batched by
        length under the token budget, each batch one ``self._s.run``. ``truncated``: the
        count of truncated pairs is appended there instead of warned about (a caller running
        one call in parts warns once for all of them)."""
        n = len(ia)
        shape = (n,) if self.num_labels == 1 else (n, self.num_labels)
        out = np.empty(shape, dtype=np.float32)
        if n == 0:
            return out
        bs = self.batch_size if batch_size is None else batch_size
        check_positive("batch_size", bs)
        la, lb = A.lengths[ia], B.lengths[ib]
        ta, tb = longest_first(la, lb, self._room)
        n_cut = int(np.count_nonzero((ta < la) | (tb < lb)))
        if truncated is not None:
            truncated.append(n_cut)
        elif n_cut:
            self._warn_truncated(n_cut)
        batches = length_batches(ta + tb + self._tpl.n_special, bs, self.max_batch_tokens)
        progress = self.show_progress_bar if show_progress_bar is None else show_progress_bar
        for idx in progress_bar(batches, progress, "CE", len(batches)):
            feeds = self._pair_feeds(
                self._tpl, self._plan.pad_id, A, ia[idx], ta[idx], B, ib[idx], tb[idx]
            )
            res = self._s.run(feeds)
            if self._joint:
                out[idx] = res
            elif self.num_labels == 1:
                out[idx] = res[:, 0]
            else:
                out[idx] = res
        if apply_activation and self.activation == "sigmoid":
            out = (1.0 / (1.0 + np.exp(-out.astype(np.float64)))).astype(np.float32)
        return out

    def warmup(self, max_pairs: int | None = None) -> dict[str, Any]:
        """Pay a GPU's first-use costs of batch shapes (CUDA graph captures, memory growth) for
        batches of up to ``max_pairs`` pairs (default ``batch_size``) of up to
        ``max_length`` tokens before the first request, in the calling thread (onnxruntime keeps
        CUDA graphs per thread: ``crossknn serve`` calls it in each CE worker thread); nothing
        on the CPU.
        ``{"buckets": graphs captured, "seconds": ...}``."""
        rows = self.batch_size if max_pairs is None else max_pairs
        check_positive("max_pairs", rows)
        rows = max(1, min(int(rows), self.max_batch_tokens // self.max_length))
        return self._s.warmup(rows, self.max_length)

    #: tokenize the next documents while the device runs the pairs of the ones before
    #: (``None``: on a GPU provider only; see :meth:`_score_pairs`)
    overlap_tokenize: bool | None = None

    def _score_pairs(self, pairs, **kw) -> tuple[np.ndarray, bool]:
        """Scores of ``(query, document)`` string pairs in input order, and whether one pair
        (not a list) was given.

        On a GPU the host's tokenizing of the documents, not the device, is most of an
        uncached call (H200, fp16, 6,000 SciFact pairs: 14,859 pairs/s through ``predict``,
        63,721 from cached tokens). So there (:attr:`overlap_tokenize`) the distinct documents
        are cut into slices of :data:`OVERLAP_DOCS` (a batch's pairs if more); a second thread
        tokenizes slice k + 1 (the tokenizer releases the interpreter lock) while this one runs
        the pairs of slice k, sorted and batched by length within the slice. Scores equal the
        one-pass path's, up to the float rounding of different batch paddings."""
        qs, ds, ia, ib, single = pair_indices(pairs)
        return self._run_documents(self._encode_store(qs), ia, ds, ib, **kw), single

    def _run_documents(self, A: IdStore, ia, ds: list[str], ib, **kw) -> np.ndarray:
        """Scores of the pairs ``(A[ia[i]], ds[ib[i]])``, the documents tokenized here: in one
        pass, or slice by slice overlapping the device (see :meth:`_score_pairs`)."""
        overlap = self.overlap_tokenize
        if overlap is None:
            overlap = not on_cpu(self.provider)
        if overlap and len(ds) > OVERLAP_DOCS:
            bs = self.batch_size if kw.get("batch_size") is None else kw["batch_size"]
            check_positive("batch_size", bs)
            size = max(OVERLAP_DOCS, bs)
            if len(ds) > size:
                return self._run_overlapped(A, ia, ds, ib, size, **kw)
        return self._run_pairs(A, ia, self._documents_store(ds, A), ib, **kw)

    def _run_overlapped(self, A: IdStore, ia, ds: list[str], ib, size: int, **kw) -> np.ndarray:
        """:meth:`_run_pairs` slice by slice of ``size`` documents, the next slice tokenized in
        a second thread meanwhile (see :meth:`_score_pairs`)."""
        starts = range(0, len(ds), size)
        which = ib // size  # the slice of each pair's document
        order = np.argsort(which, kind="stable")
        bounds = np.searchsorted(which[order], np.arange(len(starts) + 1))
        progress = kw.pop("show_progress_bar", None)
        progress = self.show_progress_bar if progress is None else progress
        out: np.ndarray | None = None
        cut: list[int] = []
        with ThreadPoolExecutor(1, thread_name_prefix="crossknn-tokenize") as pool:

            def tokenize(k: int):
                return pool.submit(self._documents_store, ds[starts[k] : starts[k] + size], A)

            ahead = tokenize(0)
            for k in progress_bar(range(len(starts)), progress, "CE", len(starts)):
                B = ahead.result()
                if k + 1 < len(starts):
                    ahead = tokenize(k + 1)
                sel = order[bounds[k] : bounds[k + 1]]
                got = self._run_pairs(
                    A, ia[sel], B, ib[sel] - starts[k], show_progress_bar=False, truncated=cut, **kw
                )
                if out is None:
                    out = np.empty((len(ia), *got.shape[1:]), dtype=got.dtype)
                out[sel] = got
        assert out is not None  # more than one slice of documents: pairs in each
        if sum(cut):
            self._warn_truncated(sum(cut))
        return out

    def _documents_store(self, documents: list[str], queries: IdStore) -> IdStore:
        """The documents' ids for pairs with these queries only. ``longest_first`` compares a
        document's length with the room and with its query's length; a length above both
        decides as the full one, so a long document is tokenized only that far."""
        bound = max(self._room, int(queries.lengths.max()) if len(queries) else 0)
        return self._encode_store(documents, longer_than=bound)

    def _rank(
        self,
        query,
        documents,
        top_k,
        doc_ids,
        return_documents: bool,
        then=None,
        **kw,
    ) -> list[dict[str, Any]]:
        """``rank``'s checks, scores (``then``: applied to them, e.g. an ST activation_fn) and
        rows, for either backend's signature."""
        documents, doc_ids = check_rank_args(query, documents, top_k, doc_ids, self.num_labels)
        if top_k == 0:
            return []
        scores = self._run_documents(
            self._query_store(query),
            np.zeros(len(documents), dtype=np.int64),
            documents,
            np.arange(len(documents), dtype=np.int64),
            **kw,
        )
        if then is not None:
            scores = then(scores)
        return ranked(scores, top_k, documents, doc_ids, return_documents)

    # -- the scorer protocol of crossknn.search -------------------------------------------------
    @staticmethod
    def _item_indices(items, n: int) -> np.ndarray:
        arr = np.asarray(items)
        if arr.size == 0:
            return np.zeros(0, dtype=np.int64)
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(
                f"items must be a 1-D integer array of item indices; got {arr.dtype} {arr.shape}"
            )
        arr = arr.astype(np.int64, copy=False)
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= n:
            raise IndexError(f"item index {lo if lo < 0 else hi} out of range for {n} items")
        return arr

    def score(self, query: str, items) -> np.ndarray:
        """CE scores of one query text against item indices (into the item texts), float32."""
        if not isinstance(query, str):
            raise TypeError(
                f"query must be a string (this is a text CE); got {type(query).__name__}"
            )
        store = self._store()
        idx = self._item_indices(items, len(store))
        return self._run_pairs(
            self._query_store(query), np.zeros(len(idx), dtype=np.int64), store, idx
        )

    def score_batch(self, queries: list[str], items: list) -> list[np.ndarray]:
        """Many queries, each against its own item indices, in one length-sorted batch run."""
        queries = check_texts(queries, "queries")
        items = list(items)
        if len(queries) != len(items):
            raise ValueError(f"queries and items differ in length: {len(queries)} vs {len(items)}")
        if not queries:
            return []
        store = self._store()
        arrs = [np.asarray(x) for x in items]
        for arr in arrs:  # each query's ids: 1-D integers (checked per array, ranged at once)
            if arr.size and (arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer)):
                self._item_indices(arr, len(store))  # raises its TypeError
        sizes = np.fromiter((a.size for a in arrs), dtype=np.int64, count=len(arrs))
        # an empty list (float64 to numpy) adds nothing and must not turn the ids into floats
        ib = (
            self._item_indices(np.concatenate([a.reshape(-1) for a in arrs if a.size]), len(store))
            if sizes.any()
            else np.zeros(0, np.int64)
        )
        A = IdStore.concat(self._query_stores(queries))
        ia = np.repeat(np.arange(len(queries), dtype=np.int64), sizes)
        flat = self._run_pairs(A, ia, store, ib)
        return list(np.split(flat, np.cumsum(sizes)[:-1]))


class DualEncoderBase(ModelBase):
    """``encode(texts)`` -> float32 (n, ``dim``), L2-normalized, through the session."""

    _kinds = ("dual-encoder",)
    _template = "single"
    _batch_size = 32
    _max_batch_tokens = 4096

    @property
    def dim(self) -> int:
        """Length of the embedding vectors."""
        return int(self._s.manifest["dim"])

    def encode(
        self,
        texts: list[str],
        *,
        batch_size: int | None = None,
        show_progress_bar: bool | None = None,
    ) -> np.ndarray:
        texts = check_texts(texts, "texts")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        bs = self.batch_size if batch_size is None else batch_size
        check_positive("batch_size", bs)
        progress = self.show_progress_bar if show_progress_bar is None else show_progress_bar
        store = self._encode_store(texts, progress, longer_than=self._room)
        kept = np.minimum(store.lengths, self._room)
        n_cut = int(np.count_nonzero(kept < store.lengths))
        if n_cut:
            self._warn_truncated(n_cut)
        batches = length_batches(kept + self._tpl.n_special, bs, self.max_batch_tokens)
        for idx in progress_bar(batches, progress, "encode", len(batches)):
            feeds = self._single_feeds(self._tpl, self._plan.pad_id, store, idx, kept[idx])
            out[idx] = self._s.run(feeds)
        return out
