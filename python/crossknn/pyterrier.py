"""crossknn in PyTerrier (``pip install 'crossknn[pyterrier]'``)::

    import pyterrier as pt
    from ir_measures import nDCG
    from crossknn.pyterrier import Bm25, CrossknnReranker, CrossknnRetriever

    bm25 = Bm25("INDEX_DIR", num_results=1000)           # bm25s over the index's items, no Java
    crossknn = CrossknnRetriever("INDEX_DIR", budget=100)  # topics -> top-k by exact CE score
    gar = CrossknnReranker(bm25.searcher, method="gar", budget=100)  # BM25 as first stage
    pt.Experiment([bm25 >> gar, crossknn], topics, qrels, [nDCG @ 10], names=["GAR", "auto"])

Every transformer works per ``qid`` and states its columns:

- :class:`CrossknnRetriever`: topics ``qid, query`` -> ``qid, query, docno, score, rank,
  ce_calls`` (``Searcher.search``: the index's default method, ``auto``, or ``method=``);
- :class:`CrossknnReranker`: a ranking ``qid, query, docno`` (ordered by ``rank``, else
  ``score``) -> the same columns as the retriever; the input ranking is the method's first stage
  (``gar``: its initial ranking; ``rnr``: its top B; ``auto`` and the round methods: their first
  items, topped up from the DE when the ranking is shorter), so ``bm25 >> CrossknnReranker(...,
  method=m)`` compares methods at the same CE budget;
- :class:`CrossknnScorer`: ``qid, query, docno`` -> the same rows with ``score`` the index's CE
  score (a scorer for ``pyterrier_adaptive.GAR`` and other PyTerrier rerankers; ``calls`` counts
  its CE calls);
- :class:`Bm25`: topics -> ``qid, query, docno, score, rank`` by BM25 (bm25s) over the index's
  item texts;
- :func:`corpus_graph`: the index's GAR corpus graph as a ``pyterrier_adaptive`` graph.

``filter`` / ``ids`` (retriever and reranker): the items a query may be given
(:meth:`crossknn.Searcher.search`); docnos of the input that the index does not hold are
dropped. ``score`` is the CE's score, ``rank`` starts at 0 (PyTerrier's convention).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from crossknn.index.auto import auto_index_of
from crossknn.retrievers import Bm25Retriever
from crossknn.score_map import ScoreMap
from crossknn.search import registry
from crossknn.search.graph import DEFAULT_GRAPH_K, graph_of_index
from crossknn.search.methods import CurIndex
from crossknn.searcher import Searcher

try:
    import pandas as pd
    import pyterrier as pt
    import pyterrier_adaptive
    from npids import Lookup
except ModuleNotFoundError as exc:  # the extra is not installed: one line naming it
    if (exc.name or "").split(".")[0] in ("pyterrier", "pandas", "pyterrier_adaptive", "npids"):
        raise ImportError(
            "crossknn.pyterrier needs the pyterrier extra: pip install 'crossknn[pyterrier]'"
        ) from None
    raise

__all__ = [
    "Bm25",
    "CrossknnReranker",
    "CrossknnRetriever",
    "CrossknnScorer",
    "corpus_graph",
    "index_graph",
]

OUT_COLUMNS = ["qid", "query", "docno", "score", "rank", "ce_calls"]


def _searcher(where: Any, options: dict | None) -> Searcher:
    if isinstance(where, Searcher):
        return where
    if isinstance(where, (str, os.PathLike)) or hasattr(where, "metadata"):
        return Searcher(where, **dict(options or {}))
    raise TypeError(
        f"expected an index folder, an opened index or a crossknn.Searcher; got "
        f"{type(where).__name__}"
    )


def _need(df: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise KeyError(
            f"{what} needs the columns {list(columns)}; missing {missing} (got {list(df.columns)})"
        )


def _topics(df: pd.DataFrame) -> tuple[list[str], list[str]]:
    """(qids, queries) in order of first appearance, one per qid."""
    first = df.drop_duplicates("qid")
    return [str(q) for q in first.qid], [str(t) for t in first["query"]]


def index_graph(searcher: Searcher, k: int = DEFAULT_GRAPH_K) -> np.ndarray:
    """GAR's corpus graph of the searcher's index: the array ``crossknn build`` wrote while it
    matches the index's items, else made from its DE item vectors
    (:func:`crossknn.search.graph.graph_of_index`)."""
    return graph_of_index(searcher.index, k)


class _Rows:
    """The transformers' output rows, collected per query."""

    def __init__(self) -> None:
        self.cols: dict[str, list] = {c: [] for c in OUT_COLUMNS}

    def add(self, qid: str, query: str, docnos, scores, ce_calls: int) -> None:
        n = len(docnos)
        self.cols["qid"] += [qid] * n
        self.cols["query"] += [query] * n
        self.cols["docno"] += list(docnos)
        self.cols["score"] += [float(s) for s in scores]
        self.cols["rank"] += list(range(n))
        self.cols["ce_calls"] += [int(ce_calls)] * n

    def frame(self) -> pd.DataFrame:
        df = pd.DataFrame(self.cols, columns=OUT_COLUMNS)
        return df.astype({"score": "float64", "rank": "int64", "ce_calls": "int64"})


class CrossknnRetriever(pt.Transformer):
    """Topics ``qid, query`` -> ``qid, query, docno, score, rank, ce_calls``: the top ``k`` items
    of each query by exact CE score, at most ``budget`` CE calls each (``Searcher.search``).

    Args:
        index: an index folder, an opened index or a :class:`crossknn.Searcher`.
        budget: CE calls per query (B).
        k: results per query (at most B).
        method: a registry method (default: the index's, ``auto``).
        filter: a crossknn filter (:mod:`crossknn.filters`) for every query.
        ids: an id allow-list for every query.
        query_batch: queries searched together (one CE batch per round for the group).
        searcher_options: keywords of :class:`crossknn.Searcher` for a folder.
    """

    def __init__(
        self,
        index: Any,
        *,
        budget: int = 100,
        k: int = 10,
        method: str | None = None,
        filter: Any = None,
        ids: Sequence[str] | None = None,
        query_batch: int = 8,
        seed: int = 0,
        searcher_options: dict | None = None,
    ) -> None:
        self.searcher = _searcher(index, searcher_options)
        self.budget, self.k, self.method = int(budget), int(k), method
        self.filter, self.ids, self.query_batch, self.seed = filter, ids, query_batch, seed

    def __repr__(self) -> str:
        return f"CrossknnRetriever(method={self.method!r}, budget={self.budget}, k={self.k})"

    def transform(self, topics: pd.DataFrame) -> pd.DataFrame:
        _need(topics, ["qid", "query"], "CrossknnRetriever")
        qids, queries = _topics(topics)
        rows = _Rows()
        if queries:
            hits = self.searcher.search(
                queries,
                k=self.k,
                budget=self.budget,
                method=self.method,
                seed=self.seed,
                query_ids=qids,
                query_batch=self.query_batch,
                return_documents=False,
                filter=self.filter,
                ids=self.ids,
            )
            for qid, q, h in zip(qids, queries, hits, strict=True):
                rows.add(qid, q, h.ids, h.scores, h.ce_calls)
        return rows.frame()


class _Ranking:
    """A first stage that returns each query's input ranking (query texts are unique within a
    call): the items a query's mask allows, in input order, topped up by ``fill`` (the DE) or
    padded with -1."""

    def __init__(self, rankings: dict[str, np.ndarray], n_items: int, fill=None) -> None:
        self.rankings, self.n_items, self.fill = rankings, n_items, fill

    def retrieve(self, queries: Sequence, k: int, *, allow=None) -> np.ndarray:
        out = np.full((len(queries), k), -1, np.int64)
        masks = [None] * len(queries) if allow is None else list(allow)
        for r, (q, m) in enumerate(zip(queries, masks, strict=True)):
            items = self.rankings[q]
            if m is not None:
                items = items[m[items]]
            items = items[:k]
            if items.size < k and self.fill is not None:
                extra = self.fill.retrieve([q], k, **({} if m is None else {"allow": [m]}))[0]
                extra = extra[(extra >= 0) & ~np.isin(extra, items)]
                items = np.concatenate([items, extra[: k - items.size]])
            out[r, : items.size] = items
        return out


class CrossknnReranker(pt.Transformer):
    """A ranking ``qid, query, docno`` -> ``qid, query, docno, score, rank, ce_calls``: a
    registry method with the input ranking as its first stage, at most ``budget`` CE calls per
    query (``rnr``: the input's top B; ``gar``: GAR over the index's corpus graph; ``auto`` and
    the round methods: their first items from the input, topped up from the DE).

    Args:
        index: an index folder, an opened index or a :class:`crossknn.Searcher`.
        method: a registry method (``rnr``, ``gar``, ``auto``, ...).
        budget: CE calls per query (B); ``rnr`` spends at most the input's length.
        k: results per query (default: every item scored, by CE score).
        filter / ids: the items a query may be given (as :class:`CrossknnRetriever`).
        query_batch: queries reranked together (one CE batch per step for the group).
    """

    def __init__(
        self,
        index: Any,
        *,
        method: str = "rnr",
        budget: int = 100,
        k: int | None = None,
        filter: Any = None,
        ids: Sequence[str] | None = None,
        query_batch: int = 8,
        seed: int = 0,
        searcher_options: dict | None = None,
    ) -> None:
        self.searcher = _searcher(index, searcher_options)
        registry.check_available(method, self.searcher.index_kinds, where="this index")
        self.method, self.budget = method, int(budget)
        self.k = None if k is None else int(k)
        self.filter, self.ids, self.query_batch, self.seed = filter, ids, query_batch, seed
        self._pos: dict[str, int] | None = None

    def __repr__(self) -> str:
        return f"CrossknnReranker(method={self.method!r}, budget={self.budget}, k={self.k})"

    def _positions(self, docnos) -> np.ndarray:
        if self._pos is None:
            self._pos = {d: i for i, d in enumerate(self.searcher.corpus.ids)}
        pos = [self._pos.get(str(d), -1) for d in docnos]
        got = np.asarray(pos, np.int64)
        got = got[got >= 0]
        _, first = np.unique(got, return_index=True)  # a docno twice: its first place
        return got[np.sort(first)]

    def _make(self, first):
        s = self.searcher
        spec = registry.get(self.method)
        return spec.build(
            registry.Resources(
                first=first,
                cur=CurIndex(np.asarray(s.index["R"], np.float32)) if spec.index == "cur" else None,
                auto_index=auto_index_of(s.index) if spec.index == "auto" else None,
                item_vectors=s.round_features,
                prior=s.qvec,
                mix=s.mix,
                score_map=ScoreMap.from_params(s.index.params, what=f"index {s.index.path}"),
                n_items=s.n_items,
                graph=index_graph(s) if self.method == "gar" else None,
            )
        )

    def transform(self, ranking: pd.DataFrame) -> pd.DataFrame:
        _need(ranking, ["qid", "query", "docno"], "CrossknnReranker")
        df = ranking
        if "rank" in df.columns:
            df = df.sort_values(["qid", "rank"], kind="stable")
        elif "score" in df.columns:
            df = df.sort_values(["qid", "score"], ascending=[True, False], kind="stable")
        qids, queries = _topics(ranking)
        docs = {str(q): g.docno.tolist() for q, g in df.groupby("qid", sort=False)}
        items = [self._positions(docs[q]) for q in qids]
        masks = self.searcher.allow_masks(len(qids), filter=self.filter, ids=self.ids)
        n = self.searcher.n_items
        budgets = [min(self.budget, n) for _ in qids]
        if self.method == "rnr":  # RNR scores the input's top B: no more than it holds
            budgets = [
                min(b, int(it.size if m is None else m[it].sum()))
                for b, it, m in zip(budgets, items, masks or [None] * len(qids), strict=True)
            ]
        fill = None if self.method in ("rnr", "gar") else self.searcher.first
        out: dict[int, tuple] = {}
        # groups: one budget, distinct query texts (the first stage looks rankings up by text)
        pending = list(range(len(qids)))
        while pending:
            group, texts, rest = [], set(), []
            for j in pending:
                same = not group or budgets[j] == budgets[group[0]]
                if same and queries[j] not in texts and len(group) < self.query_batch:
                    group.append(j)
                    texts.add(queries[j])
                else:
                    rest.append(j)
            pending = rest
            b = budgets[group[0]]
            if b == 0:
                for j in group:
                    out[j] = ([], [], 0)
                continue
            first = _Ranking({queries[j]: items[j] for j in group}, n, fill=fill)
            k = b if self.k is None else min(self.k, b)
            res = self._make(first).search(
                self.searcher.ce,
                [queries[j] for j in group],
                budget=b,
                k=k,
                seed=self.seed,
                query_ids=[qids[j] for j in group],
                allow=None if masks is None else [masks[j] for j in group],
            )
            for r, j in enumerate(group):
                keep = res.indices[r] >= 0
                ids = [self.searcher.corpus.ids[i] for i in res.indices[r][keep]]
                out[j] = (ids, res.scores[r][keep], int(res.ce_calls[r]))
        rows = _Rows()
        for j, (qid, q) in enumerate(zip(qids, queries, strict=True)):
            rows.add(qid, q, *out[j])
        return rows.frame()


class CrossknnScorer(pt.Transformer):
    """Rows ``qid, query, docno`` -> the same rows with ``score`` the index's CE score of
    (query, item) and ``rank`` by it; ``calls`` counts the CE calls made. A docno the index does
    not hold is refused."""

    def __init__(self, index: Any, *, searcher_options: dict | None = None) -> None:
        self.searcher = _searcher(index, searcher_options)
        self.calls = 0
        self._pos = {d: i for i, d in enumerate(self.searcher.corpus.ids)}

    def transform(self, df: pd.DataFrame) -> pd.DataFrame:
        _need(df, ["qid", "query", "docno"], "CrossknnScorer")
        out = df.copy()
        if out.empty:
            return out.assign(score=pd.Series(dtype="float64"))
        try:
            pos = np.asarray([self._pos[str(d)] for d in out.docno], np.int64)
        except KeyError as exc:
            raise KeyError(f"docno {exc.args[0]!r} is not an item of this index") from None
        groups = list(out.groupby("qid", sort=False).indices.items())
        queries = [str(out["query"].iloc[rows[0]]) for _, rows in groups]
        scores = self.searcher.ce.score_batch(queries, [pos[rows] for _, rows in groups])
        col = np.empty(len(out), np.float64)
        for (_, rows), s in zip(groups, scores, strict=True):
            col[rows] = np.asarray(s, np.float64)
        self.calls += len(out)
        out["score"] = col
        # rank by score within each qid, 0 = best (pt.model.add_ranks' meaning)
        order = out.groupby("qid", sort=False).score.rank(method="first", ascending=False)
        out["rank"] = order.astype("int64") - 1
        return out


class Bm25(pt.Transformer):
    """Topics ``qid, query`` -> ``qid, query, docno, score, rank``: the top ``num_results`` items
    by BM25 (bm25s, :class:`crossknn.retrievers.Bm25Retriever`) over the index's item texts."""

    def __init__(
        self, index: Any, *, num_results: int = 1000, searcher_options: dict | None = None
    ) -> None:
        self.searcher = _searcher(index, searcher_options)
        self.num_results = int(num_results)
        self.bm25 = Bm25Retriever(list(self.searcher.corpus.texts))

    def transform(self, topics: pd.DataFrame) -> pd.DataFrame:
        _need(topics, ["qid", "query"], "Bm25")
        qids, queries = _topics(topics)
        cols: dict[str, list] = {c: [] for c in ("qid", "query", "docno", "score", "rank")}
        k = min(self.num_results, self.searcher.n_items)
        ids = self.searcher.corpus.ids
        for qid, q in zip(qids, queries, strict=True):
            s = self.bm25.scores([q])[0]
            top = np.lexsort((np.arange(s.size), -s))[:k]
            top = top[s[top] > 0]  # items that share no term with the query are not retrieved
            cols["qid"] += [qid] * top.size
            cols["query"] += [q] * top.size
            cols["docno"] += [ids[i] for i in top]
            cols["score"] += s[top].tolist()
            cols["rank"] += list(range(top.size))
        return pd.DataFrame(cols)


def corpus_graph(index: Any, folder: str | os.PathLike, *, k: int = DEFAULT_GRAPH_K):
    """The index's GAR corpus graph (:func:`index_graph`) written to ``folder`` (new) as a
    ``pyterrier_adaptive.NpTopKCorpusGraph`` over the index's item ids, and opened."""
    searcher = _searcher(index, None)
    graph = index_graph(searcher, k)
    folder = Path(folder)
    folder.mkdir(parents=True)
    with Lookup.builder(folder / "docnos.npids") as build:
        for d in searcher.corpus.ids:
            build.add(d)
    (folder / "edges.u32.np").write_bytes(graph.astype(np.uint32).tobytes())
    (folder / "weights.f16.np").write_bytes(np.zeros(graph.shape, np.float16).tobytes())
    meta = {"type": "corpus_graph", "format": "np_topk", "doc_count": searcher.n_items}
    (folder / "pt_meta.json").write_text(json.dumps({**meta, "k": int(graph.shape[1])}))
    return pyterrier_adaptive.NpTopKCorpusGraph(folder)
