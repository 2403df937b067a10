"""Rounds that do not read every item: a FAISS maximum-inner-product index over the item features.

Every round step asks for the top ``n`` items by ``V u`` among the items not scored yet. The exact
C++ kernel reads all N rows for that; :class:`IndexedFeatures` instead asks a FAISS index for the
top ``oversample * (n + |scored|)`` items by ``V u``, drops the scored ones and re-scores the
candidates exactly from the stored rows (float64 dot products of the C++ core's rows), ties to the
lower id. SoftMax rounds sample (Gumbel-top-k) from a candidate pool of the top
``pool * n + |scored|`` items instead of all N: items outside the pool have a negligible share of
the probability when ``V u / T`` is spread, and none when T is small.

Round indexes (``kind``):

- ``exact``: no index, the C++ kernel (the reference; the default below ``AUTO_EXACT_BELOW`` items);
- ``ivf``: ``IndexIVFScalarQuantizer`` (int8 codes, inner product), lists of about
  ``LIST_SIZE`` items (``N / LIST_SIZE`` lists, kept within ``4 sqrt(N) .. 16 sqrt(N)``); search
  width ``nprobe``;
- ``hnsw``: ``IndexHNSWFlat`` (inner product); search width ``efSearch``.

:class:`IndexedFeatures` is an :class:`crossknn.core.ItemFeatures` (it shares the base's C++
features, so least squares, rows and random sampling are unchanged): pass it wherever features are
taken (``AXN(features)``, ``make_method(item_vectors=...)``) and every round goes through the index.
The least-squares queries ``u`` are not DE queries, so the width is tuned on recorded round queries
of held-out queries (:func:`record_round_queries`, :func:`tune_width`), like the split.
In an index folder the FAISS index is the uint8 array ``round_index`` (FAISS's own serialization,
stored, hashed and validated like every other array) and ``params.round_index`` its settings.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from tqdm.auto import tqdm

from crossknn.core import (
    ItemFeatures,
    allowed_count,
    allowed_items,
    check_float,
    check_k,
    check_seed,
    exclude_csr,
    pack_allow,
)

__all__ = [
    "ARRAY_NAME",
    "AUTO_EXACT_BELOW",
    "ROUND_INDEX_KINDS",
    "IndexedFeatures",
    "build_round_index",
    "default_round_index",
    "faiss_from_array",
    "faiss_to_array",
    "record_round_queries",
    "round_recall",
    "tune_round_widths",
    "tune_width",
]

ROUND_INDEX_KINDS = ("exact", "ivf", "hnsw")
AUTO_EXACT_BELOW = 200_000  # below this, one exact pass is a few ms: no index
ARRAY_NAME = "round_index"
HNSW_QUANTIZER_FROM = 4096  # IVF lists above which the coarse quantizer is an HNSW graph
# Items per IVF list. The least-squares round queries are out of the items' distribution: their
# top items are the tails of many clusters, which coarse lists rank last. On the scale testbed at
# N = 1e6 the share of exact round answers within 2,000 scanned codes is 0.79 with lists of 1,220
# items and 0.99 with lists of 244 or 122 (docs/scale.md): small lists, whatever N.
LIST_SIZE = 256
# the coarse graph over the list centroids (int8 codes; see _compact_coarse_graph)
COARSE_HNSW_M, COARSE_EF_CONSTRUCTION = 32, 200
DEFAULT_WIDTH = {"ivf": 32, "hnsw": 128}
# widths tried when tuning (tune_width / tune_round_widths from an index folder or the bench)
TUNE_CANDIDATES = {
    "ivf": (4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256),
    "hnsw": (16, 32, 64, 128, 256, 512),
}
# tuning: when no width reaches the recall target, the narrowest within this of the best (at
# N = 1e7 nprobe 192 gives 0.980 per-round recall and 256 gives 0.981 for a third more codes)
PLATEAU = 0.002
WIDTH_NAME = {"ivf": "nprobe", "hnsw": "efSearch"}
# allow masks of at most this share of the items: exact rounds over the allowed rows (the core
# reads only them below N / 8) instead of the index with a selector and 1 / selectivity its
# width. bench/filter_bench.py --part scale (10^6 x 128, IVF, 4,096 lists): at 1% the exact
# rounds cost 0.07 of the selector's, at 10% the selector 0.86 of the exact rounds'
EXACT_BELOW = 0.05


def _faiss():
    try:
        # faiss: optional (scale extra)
        import faiss
    except ImportError:  # pragma: no cover - faiss-cpu is a dependency of the 'scale' extra
        raise ImportError(
            "round indexes need FAISS: pip install faiss-cpu (the crossknn[scale] extra)"
        ) from None
    return faiss


def default_round_index(n_items: int) -> str:
    """``exact`` below :data:`AUTO_EXACT_BELOW` items, else ``ivf``."""
    return "exact" if int(n_items) < AUTO_EXACT_BELOW else "ivf"


def default_nlist(n_items: int) -> int:
    """IVF lists for ``n_items``: ``N / LIST_SIZE`` kept within ``[4 sqrt(N), 16 sqrt(N)]`` (the
    usual FAISS range) and at most ``N / 39`` (enough rows per list to train k-means)."""
    n = int(n_items)
    root = math.sqrt(n)
    nlist = min(max(n / LIST_SIZE, 4 * root), 16 * root, n // 39)
    return int(max(1, round(nlist)))


def _check_kind(kind: str) -> str:
    if kind not in ROUND_INDEX_KINDS:
        raise ValueError(f"round index must be one of {ROUND_INDEX_KINDS}; got {kind!r}")
    return kind


def _blocks(features: ItemFeatures, lo: int, hi: int, block: int):
    for b in range(lo, hi, block):
        e = min(hi, b + block)
        yield b, features.rows(np.arange(b, e)).astype(np.float32)


def build_round_index(
    features: ItemFeatures,
    kind: str,
    *,
    nlist: int | None = None,
    hnsw_m: int = 32,
    ef_construction: int = 64,
    train_size: int | None = None,
    seed: int = 0,
    block: int = 1 << 16,
    progress: bool = True,
):
    """A FAISS inner-product index over the rows of ``features`` (``ivf`` or ``hnsw``).

    Rows are read from the stored features in blocks (dequantized for int8 storage), so V is never
    copied whole to float32. ``ivf``: ``nlist`` (default :func:`default_nlist`) k-means lists
    trained on ``train_size`` (default ``64 nlist``, ``20 nlist`` with an HNSW coarse quantizer)
    random rows, int8 scalar-quantized codes.
    """
    faiss = _faiss()
    kind = _check_kind(kind)
    if kind == "exact":
        raise ValueError("the exact round index is the C++ kernel: there is nothing to build")
    n, d = features.n_items, features.dim
    if kind == "ivf":
        if nlist is None:
            nlist = default_nlist(n)
        if not 1 <= nlist <= n:
            raise ValueError(f"nlist must be in [1, {n}] (the number of items); got {nlist}")
        # many lists: an HNSW coarse quantizer assigns the N rows in log time instead of nlist
        big = nlist > HNSW_QUANTIZER_FROM
        quantizer = faiss.IndexHNSWFlat(d, 32, faiss.METRIC_INNER_PRODUCT) if big else None
        if quantizer is None:
            quantizer = faiss.IndexFlatIP(d)
        index = faiss.IndexIVFScalarQuantizer(
            quantizer, d, nlist, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT
        )
        m = int(min(n, train_size or (20 if big else 64) * nlist))
        rng = np.random.default_rng(seed)
        sample = np.sort(rng.choice(n, size=m, replace=False))
        index.cp.seed, index.cp.niter = int(seed), 10
        index.train(features.rows(sample).astype(np.float32))
        if big:
            _compact_coarse_graph(index, quantizer)
    else:
        index = faiss.IndexHNSWFlat(d, int(hnsw_m), faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = int(ef_construction)
    with tqdm(total=n, desc=f"round index ({kind})", unit="item", disable=not progress) as bar:
        for _, X in _blocks(features, 0, n, block):
            index.add(X)
            bar.update(X.shape[0])
    return index


def _compact_coarse_graph(index, trained) -> None:
    """Replaces the HNSW coarse quantizer that k-means trained with a graph over int8 codes of
    the same centroids, built more carefully (efConstruction :data:`COARSE_EF_CONSTRUCTION`).

    A round step's coarse search is one graph search (single-threaded) and was about half of the
    IVF step at N = 1e7; over int8 codes the 39,062 centroids take 5 MB instead of 20 and the same
    lists are found in half the time (docs/scale.md)."""
    faiss = _faiss()
    d, nlist = index.d, index.nlist
    centroids = trained.reconstruct_n(0, nlist)
    graph = faiss.IndexHNSWSQ(
        d, faiss.ScalarQuantizer.QT_8bit, COARSE_HNSW_M, faiss.METRIC_INNER_PRODUCT
    )
    graph.hnsw.efConstruction = COARSE_EF_CONSTRUCTION
    graph.train(centroids)
    graph.add(centroids)
    graph.hnsw.efSearch = 40  # wider than FAISS's 16 when assigning the items to their lists
    graph.this.disown()  # the IVF index owns it from here (freed and serialized with it)
    index.quantizer = graph
    index.own_fields = True
    index.referenced_objects = []  # the trained flat graph: freed once the caller's copy goes


def faiss_to_array(index) -> np.ndarray:
    """FAISS's serialization of ``index`` as a uint8 array (stored like any other index array)."""
    return np.asarray(_faiss().serialize_index(index), np.uint8)


def faiss_from_array(arr: np.ndarray):
    """The FAISS index serialized in ``arr`` (uint8); ValueError naming what is wrong."""
    arr = np.asarray(arr)
    if arr.dtype != np.uint8 or arr.ndim != 1:
        raise ValueError(f"a round index is a 1-D uint8 array; got {arr.dtype} {arr.shape}")
    try:
        return _faiss().deserialize_index(np.ascontiguousarray(arr))
    except RuntimeError as exc:
        raise ValueError(f"the round index cannot be read by FAISS ({exc})") from None


def _index_kind(index) -> str:
    faiss = _faiss()
    if isinstance(index, faiss.IndexHNSW):
        return "hnsw"
    if isinstance(index, faiss.IndexIVF):
        return "ivf"
    raise TypeError(f"round index must be a FAISS IVF or HNSW index; got {type(index).__name__}")


class IndexedFeatures(ItemFeatures):
    """``features`` whose ``top_k`` and ``sample_softmax`` go through a FAISS round index.

    ``width``: ``nprobe`` (IVF) or ``efSearch`` (HNSW); ``oversample`` >= 1: candidates asked of
    the index per needed item (then re-scored exactly); ``pool`` >= 1: the SoftMax candidate pool
    in units of the sample size. Results are sorted like the exact kernel's (score descending,
    ties to the lower id); a query for which the index returns too few unscored candidates is
    answered by the exact kernel, so ``k`` items always come back.
    """

    def __init__(
        self,
        features: ItemFeatures,
        index,
        *,
        width: int | None = None,
        oversample: float = 1.0,
        pool: float = 8.0,
    ) -> None:
        if not isinstance(features, ItemFeatures):
            raise TypeError(f"features must be an ItemFeatures; got {type(features).__name__}")
        if isinstance(features, IndexedFeatures):
            features = features.base
        if index.ntotal != features.n_items or index.d != features.dim:
            raise ValueError(
                f"the round index holds {index.ntotal} x {index.d} vectors but the features are "
                f"{features.n_items} x {features.dim}"
            )
        if not oversample >= 1.0 or not pool >= 1.0:
            raise ValueError(f"oversample and pool must be >= 1; got {oversample}, {pool}")
        self.base, self.index = features, index
        self.kind = _index_kind(index)
        self._f, self._vmax = features._f, features._vmax
        self.storage, self.n_items, self.dim = features.storage, features.n_items, features.dim
        self.width = int(width or DEFAULT_WIDTH[self.kind])
        self.oversample, self.pool = float(oversample), float(pool)
        self.exact_fallbacks = 0  # queries answered by the exact kernel (too few candidates)
        # an allow mask of at most this share of the items is searched exactly over its rows
        # (bench/filter_bench.py: cheaper than the selector there)
        self.exact_below = EXACT_BELOW
        # per-round widths: {scored items at least: width}, set by tune_round_widths; None: width
        self.round_widths: dict[int, int] | None = None
        self._params_cache: dict[int, tuple] = {}

    def width_for(self, scored: int) -> int:
        """The width of a round step whose queries have scored up to ``scored`` items: the
        ``round_widths`` entry with the largest key <= ``scored`` (else ``width``)."""
        if not self.round_widths:
            return self.width
        keys = [k for k in self.round_widths if k <= scored]
        return int(self.round_widths[max(keys)]) if keys else self.width

    def __repr__(self) -> str:
        return (
            f"IndexedFeatures({self.kind}, {WIDTH_NAME[self.kind]}={self.width}, "
            f"n_items={self.n_items}, dim={self.dim}, storage={self.storage!r})"
        )

    def _params(self, scored: int = 0, selectivity: float = 1.0, allowed=None):
        """FAISS search parameters for a step with ``scored`` items (made once per width: building
        them costs as much as a tenth of an IVF step). With an allow mask (``allowed``: its
        packed bytes, ``selectivity``: the share of items it allows) the width grows by
        1 / selectivity, so that as many allowed codes are scanned as unfiltered, and an
        ``IDSelectorBitmap`` keeps the others out of the results."""
        width = self.width_for(scored)
        if allowed is not None:
            width = int(math.ceil(width / max(selectivity, 1e-9)))
            params, keep = self._make_params(width)
            sel = _faiss().IDSelectorBitmap(self.n_items, _faiss().swig_ptr(allowed))
            params.sel = sel
            return params, (keep, sel, allowed)
        if width not in self._params_cache:
            self._params_cache[width] = self._make_params(width)
        return self._params_cache[width]

    def _make_params(self, width: int):
        """(params, objects the params point to: SWIG does not keep them alive)."""
        faiss = _faiss()
        if self.kind == "ivf":
            nprobe = min(width, self.index.nlist)
            q = faiss.downcast_index(self.index.quantizer)
            if isinstance(q, faiss.IndexHNSW):  # the graph must find the nprobe nearest lists
                # efSearch = nprobe keeps the per-round recall of 2 nprobe at N = 1e7 (0.980 vs
                # 0.981 at nprobe 192) for 3/4 of the graph's time (docs/scale.md)
                qp = faiss.SearchParametersHNSW(efSearch=max(64, nprobe))
                return faiss.SearchParametersIVF(nprobe=nprobe, quantizer_params=qp), qp
            return faiss.SearchParametersIVF(nprobe=nprobe), None
        return faiss.SearchParametersHNSW(efSearch=width), None

    def _candidates(self, U: np.ndarray, need: np.ndarray, excludes, mask=None):
        """Per query, the unscored (and allowed) candidates the index returns for ``need`` items,
        and the sorted unique ids each query excludes. FAISS returns distinct ids (an item is in
        one IVF list, a graph result lists a node once), so only -1 padding, excluded ids and
        (with ``mask``, one packed allow mask shared by the queries) disallowed ids are
        dropped."""
        Q = U.shape[0]
        excl = [None if e is None else np.unique(e[e >= 0]) for e in excludes]
        m = max((0 if e is None else e.size) for e in excl) if excl else 0
        allowed, selectivity = None, 1.0
        if mask is not None:
            selectivity = allowed_count(mask, self.n_items) / self.n_items
            allowed = np.ascontiguousarray(mask.astype("<u8").view(np.uint8))  # FAISS's bitmap
        fetch = int(
            min(self.n_items, math.ceil(self.oversample * (int(need.max()) + m) / selectivity))
        )
        Uf = np.ascontiguousarray(U, np.float32)
        if not np.isfinite(Uf).all():  # beyond float32: the direction is what counts
            Uf = np.ascontiguousarray(U / np.abs(U).max(axis=1, keepdims=True), np.float32)
        if self.kind == "ivf":
            # FAISS parallelizes an IVF search over its queries; a round step of one query (the
            # latency case) is parallelized over its probed lists instead (N = 1e7, nprobe 128,
            # 2 threads: 1.75 ms per step instead of 2.38 on one, docs/scale.md)
            self.index.parallel_mode = 1 if Q == 1 else 0
        params, _keep = self._params(m, selectivity, allowed)
        _, ids_k = self.index.search(Uf, fetch, params=params)
        out = []
        for q in range(Q):
            c = ids_k[q]
            c = c[c >= 0]
            if mask is not None:
                c = c[allowed_items(mask, c)]
            e = excl[q]
            if e is not None and e.size and c.size:
                hit = e.take(np.searchsorted(e, c), mode="clip") == c
                c = c[~hit]
            out.append(c)
        return out, excl

    def _exact_scores(self, u: np.ndarray, items: np.ndarray) -> np.ndarray:
        """``V[items] @ u`` in float64 for finite ``u`` and in-range ``items`` (from the index):
        the checks of :meth:`ItemFeatures.scores` without their cost on every round step."""
        if not items.size:
            return np.empty(0)
        return self._scores_of_rows(self._f.rows(items), u)

    def _groups(self, U, exclude, allow, single: bool):
        """The queries in groups of one allow mask: (query rows, packed mask or None, their
        exclusion lists, exact); a mask that allows at most ``exact_below`` N items is answered
        by the exact kernel, which then reads only the allowed rows (``exact`` True). The masks
        stay packed (as the C++ loop hands them over): nothing of N bytes per round step."""
        Q = U.shape[0]
        ids, off = exclude_csr(exclude, 1 if single else Q, self.n_items)
        excludes = [None if ids is None else ids[off[q] : off[q + 1]] for q in range(Q)]
        if allow is None:
            yield np.arange(Q), None, excludes, False
            return
        rows_of = [allow] if single else list(allow)
        if len(rows_of) != Q:
            raise ValueError(f"allow: {len(rows_of)} masks for {Q} queries")
        packed = [
            None if a is None else pack_allow(np.asarray(a), 1, self.n_items) for a in rows_of
        ]
        groups: dict[bytes | None, list[int]] = {}
        for q, w in enumerate(packed):
            groups.setdefault(None if w is None else w.tobytes(), []).append(q)
        for key, rows in groups.items():
            mask = None if key is None else packed[rows[0]]
            exact = mask is not None and (
                allowed_count(mask, self.n_items) <= self.exact_below * self.n_items
            )
            yield np.asarray(rows), mask, [excludes[q] for q in rows], exact

    def top_k(self, u, k: int, *, exclude=None, allow=None):
        k = check_k(k, self.n_items)
        U, single = self._queries(u)
        Q = U.shape[0]
        S = np.empty((Q, k), np.float32)
        ids_k = np.empty((Q, k), np.int64)
        if Q and k:
            for rows, mask, excludes, exact in self._groups(U, exclude, allow, single):
                if exact:  # few allowed items: their rows only, exactly
                    S[rows], ids_k[rows] = self.base.top_k(
                        U[rows], k, exclude=[_ids(e) for e in excludes], allow=mask
                    )
                    continue
                cands, excl = self._candidates(U[rows], np.full(rows.size, k), excludes, mask)
                for j, q in enumerate(rows):
                    c = cands[j]
                    if c.size < k:  # the index found too few: the exact kernel for this query
                        self.exact_fallbacks += 1
                        S[q], ids_k[q] = self.base.top_k(U[q], k, exclude=excl[j], allow=mask)
                        continue
                    s = self._exact_scores(U[q], c)
                    order = np.lexsort((c, -s))[:k]
                    with np.errstate(over="ignore"):
                        S[q], ids_k[q] = s[order].astype(np.float32), c[order]
        return (S[0], ids_k[0]) if single else (S, ids_k)

    def sample_softmax(
        self, u, k: int, *, exclude=None, temperature: float = 1.0, seed: int = 0, allow=None
    ):
        k = check_k(k, self.n_items)
        temperature = check_float(temperature, "temperature", 0.0, np.inf, lo_open=True)
        seed = check_seed(seed)
        U, single = self._queries(u)
        Q = U.shape[0]
        keys = np.empty((Q, k), np.float32)
        ids_k = np.empty((Q, k), np.int64)
        if Q and k:
            for rows, mask, excludes, exact in self._groups(U, exclude, allow, single):
                if exact:
                    for j, q in enumerate(rows):
                        keys[q], ids_k[q] = self.base.sample_softmax(
                            U[q],
                            k,
                            exclude=_ids(excludes[j]),
                            temperature=temperature,
                            seed=seed,
                            allow=mask,
                        )
                    continue
                need = np.full(rows.size, int(math.ceil(self.pool * k)))
                cands, excl = self._candidates(U[rows], need, excludes, mask)
                for j, q in enumerate(rows):
                    c = np.sort(cands[j])  # the Gumbel noise goes to items in id order
                    if c.size < k:
                        self.exact_fallbacks += 1
                        keys[q], ids_k[q] = self.base.sample_softmax(
                            U[q],
                            k,
                            exclude=excl[j],
                            temperature=temperature,
                            seed=seed,
                            allow=mask,
                        )
                        continue
                    g = np.random.default_rng([seed, q]).gumbel(size=c.size)
                    key = self._exact_scores(U[q], c) / temperature + g
                    order = np.lexsort((c, -key))[:k]
                    keys[q], ids_k[q] = key[order].astype(np.float32), c[order]
        return (keys[0], ids_k[0]) if single else (keys, ids_k)


def _ids(e) -> np.ndarray:
    return np.empty(0, np.int64) if e is None else np.asarray(e, np.int64)


class RecordingFeatures(ItemFeatures):
    """Exact features that record every top-k round query ``(u, exclude, k)``."""

    def __init__(self, features: ItemFeatures) -> None:
        self.base = features
        self._f, self._vmax = features._f, features._vmax
        self.storage, self.n_items, self.dim = features.storage, features.n_items, features.dim
        self.records: list[tuple[np.ndarray, list[np.ndarray], int]] = []

    def top_k(self, u, k, *, exclude=None, allow=None):
        U = np.atleast_2d(np.asarray(u, np.float64))
        if exclude is None:
            ex = [np.empty(0, np.int64)] * U.shape[0]
        elif U.shape[0] == 1 and np.ndim(u) == 1:
            ex = [np.asarray(exclude, np.int64)]
        else:
            ex = [np.asarray(e, np.int64) for e in exclude]
        self.records.append((U.copy(), ex, int(k)))
        return self.base.top_k(u, k, exclude=exclude, allow=allow)


def record_round_queries(
    make_method: Callable[[ItemFeatures], object],
    features: ItemFeatures,
    scorer,
    queries: Sequence,
    *,
    budget: int,
    k: int,
    seed: int = 0,
) -> list[tuple[np.ndarray, list[np.ndarray], int]]:
    """The top-k round queries ``(U, excludes, n)`` of exact rounds on ``queries`` (held-out
    train/dev queries): ``make_method(features)`` builds the method over the given features."""
    rec = RecordingFeatures(features)
    make_method(rec).search(scorer, list(queries), budget=budget, k=k, seed=seed)
    return rec.records


def _exact_answers(indexed: IndexedFeatures, records) -> list[np.ndarray]:
    """The exact top-n of every record; records of one n share one batch pass over V."""
    out: list = [None] * len(records)
    for n in {r[2] for r in records}:
        which = [i for i, r in enumerate(records) if r[2] == n]
        U = np.concatenate([records[i][0] for i in which])
        ex = [e for i in which for e in records[i][1]]
        ids = indexed.base.top_k(U, n, exclude=ex)[1]
        row = 0
        for i in which:
            q = records[i][0].shape[0]
            out[i] = ids[row : row + q]
            row += q
    return out


def round_recall(indexed: IndexedFeatures, records, exact=None) -> np.ndarray:
    """Per recorded round step, the mean recall of the exact top-n (among unscored items) in the
    index's top-n (``exact``: those exact answers, if already computed)."""
    exact = _exact_answers(indexed, records) if exact is None else exact
    out = []
    for (U, ex, n), want in zip(records, exact, strict=True):
        got = indexed.top_k(U, n, exclude=ex)[1]
        out.append(np.mean([np.intersect1d(a, b).size / n for a, b in zip(want, got, strict=True)]))
    return np.asarray(out)


def _plateau_width(table: dict[int, float], plateau: float) -> int:
    """The narrowest width whose recall is within ``plateau`` of the best in ``table`` (when no
    width reaches the target: past the plateau, wider lists buy little recall for their cost)."""
    top = max(table.values())
    return min(w for w, r in table.items() if r >= top - plateau)


def tune_width(
    indexed: IndexedFeatures,
    records,
    *,
    candidates: Sequence[int],
    target: float = 0.995,
    plateau: float = PLATEAU,
) -> tuple[int, dict[int, float]]:
    """The smallest width whose mean per-round recall on ``records`` reaches ``target``, else the
    smallest within ``plateau`` of the best recall; returns it and ``{width: mean recall}``. Sets
    ``indexed.width``."""
    if not candidates:
        raise ValueError("no candidate widths to choose from")
    exact = _exact_answers(indexed, records)
    table: dict[int, float] = {}
    best = None
    for w in sorted(int(c) for c in candidates):
        indexed.width = w
        table[w] = float(round_recall(indexed, records, exact).mean())
        if table[w] >= target:
            best = w
            break
    if best is None:
        best = _plateau_width(table, plateau)
    indexed.width = best
    return best, table


def tune_round_widths(
    indexed: IndexedFeatures,
    records,
    *,
    candidates: Sequence[int],
    target: float = 0.995,
    plateau: float = PLATEAU,
) -> tuple[dict[int, int], dict[int, dict[int, float]]]:
    """Per round step (records grouped by how many items their queries have scored: later
    rounds score more), the smallest width whose mean recall of the exact top-n on that step's
    records reaches ``target`` (else the smallest within ``plateau`` of the best). Returns
    ``{scored: width}`` and the recall table ``{scored: {width: recall}}``; sets
    ``indexed.round_widths``."""
    if not candidates:
        raise ValueError("no candidate widths to choose from")
    exact = _exact_answers(indexed, records)
    steps: dict[int, list[int]] = {}
    for i, (_, ex, _) in enumerate(records):
        steps.setdefault(max((np.unique(e).size for e in ex), default=0), []).append(i)
    indexed.round_widths = None
    schedule: dict[int, int] = {}
    tables: dict[int, dict[int, float]] = {}
    for scored, which in sorted(steps.items()):
        sub = [records[i] for i in which]
        sub_exact = [exact[i] for i in which]
        table: dict[int, float] = {}
        for w in sorted(int(c) for c in candidates):
            indexed.width = w
            table[w] = float(round_recall(indexed, sub, sub_exact).mean())
            if table[w] >= target:
                break
        reached = [w for w, r in table.items() if r >= target]
        schedule[scored] = min(reached) if reached else _plateau_width(table, plateau)
        tables[scored] = table
    indexed.width = max(schedule.values())  # for steps beyond the recorded ones
    indexed.round_widths = schedule
    return schedule, tables


# ---- in an index folder ------------------------------------------------------------------------


def round_index_arrays(
    features: ItemFeatures, kind: str, *, width: int | None = None, progress: bool = True, **kw
) -> tuple[dict[str, np.ndarray], dict]:
    """What an index folder stores for a round index of ``kind`` (``auto`` picks by N): the
    arrays (``{}`` for ``exact``) and ``params.round_index``."""
    if kind == "auto":
        kind = default_round_index(features.n_items)
    kind = _check_kind(kind)
    if kind == "exact":
        return {}, {"kind": "exact"}
    index = build_round_index(features, kind, progress=progress, **kw)
    width = int(width or DEFAULT_WIDTH[kind])
    meta = {"kind": kind, WIDTH_NAME[kind]: width, "array": ARRAY_NAME}
    if kind == "ivf":
        meta["nlist"] = int(index.nlist)
    return {ARRAY_NAME: faiss_to_array(index)}, meta


def open_round_features(
    arrays, params: dict, features: ItemFeatures, mode: str = "auto", *, where: str = "index"
) -> ItemFeatures:
    """The features a search's rounds use: ``features`` themselves (``exact``, or an index
    without a round index), or :class:`IndexedFeatures` over the stored FAISS index (``auto``:
    whatever the index has; ``ivf``/``hnsw``: must be the stored kind)."""
    if mode not in ("auto", *ROUND_INDEX_KINDS):
        raise ValueError(f"round index must be auto, exact, ivf or hnsw; got {mode!r}")
    meta = params.get("round_index") or {"kind": "exact"}
    stored = meta.get("kind", "exact")
    if mode == "exact" or (mode == "auto" and stored == "exact"):
        return features
    if mode != "auto" and mode != stored:
        raise ValueError(
            f"{where} has round index {stored!r}, not {mode!r}; use --round-index exact or "
            f"rebuild with --round-index {mode}"
        )
    if ARRAY_NAME not in arrays:
        raise ValueError(f"{where}: params.round_index says {stored!r} but the array is missing")
    index = faiss_from_array(arrays[ARRAY_NAME])
    feats = IndexedFeatures(features, index, width=meta.get(WIDTH_NAME[stored]))
    feats.round_widths = _stored_round_widths(meta.get("round_widths"), where)
    return feats


def _stored_round_widths(raw, where: str) -> dict[int, int] | None:
    """``params.round_index.round_widths`` (``{"scored": width}``, JSON keys are strings) as
    ``{scored: width}``; None when absent; ValueError naming what is wrong."""
    if raw is None:
        return None
    bad = ValueError(
        f"{where}: params.round_index.round_widths must map items scored (>= 0) to widths "
        f"(>= 1); got {raw!r}"
    )
    if not isinstance(raw, dict) or not raw:
        raise bad
    out = {}
    for k, v in raw.items():
        try:
            key = int(k)
        except (TypeError, ValueError):
            raise bad from None
        if key < 0 or isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise bad
        out[key] = v
    return out


def round_widths_meta(schedule: dict[int, int]) -> dict[str, int]:
    """``{scored: width}`` as stored in ``params.round_index.round_widths`` (JSON keys)."""
    return {str(int(k)): int(v) for k, v in sorted(schedule.items())}
