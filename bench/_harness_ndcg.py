"""The harness's nDCG@10 through ``pt.Experiment`` (part ``ndcg`` of bench/_harness.py).

On each BEIR corpus in ../shared/data: a crossknn index of the corpus built with the embedded CE
(``minilm-l6-joint`` int8; the project ships no trained CE model) and DE (fp32) at the default
index budget, then on the first ``max_queries`` test queries (``qrels/test.tsv`` order), at each
budget B, one ``pt.Experiment`` of: BM25 (bm25s over the index's items, top 1,000), ``bm25 >>``
crossknn's RNR, ``bm25 >>`` crossknn's ``gar``, ``bm25 >> pyterrier_adaptive.GAR`` over the same
CE (``CrossknnScorer``) and corpus graph, and crossknn's own search (``auto``, DE first stage).
CE scores are cached per (query, item) under cache/harness (bench/beir_bench.py's ``CachedCE``),
so the systems share what they both score; the CE calls per query beside each row are what each
system spent (its ``ce_calls`` column, or the reference scorer's count).
"""

from __future__ import annotations

import time

from _common import REPO, SHARED

WORK = REPO / "cache" / "harness"


class _Spent:
    """A transformer that passes its input through and keeps the mean ``ce_calls`` per qid."""

    def __new__(cls, inner):
        import pyterrier as pt

        class Spent(pt.Transformer):
            def __init__(self, inner):
                self.inner, self.ce_calls = inner, None

            def transform(self, df):
                out = self.inner.transform(df)
                if "ce_calls" in out.columns and len(out):
                    self.ce_calls = float(out.groupby("qid").ce_calls.first().mean())
                return out

        return Spent(inner)


def _corpus(name: str, max_queries: int | None):
    import pandas as pd

    from crossknn.data import Corpus, load_beir

    folder = SHARED / "data" / name
    beir = load_beir(folder)
    qrels = beir.qrels["test"]
    qids = list(qrels)[: max_queries or None]
    texts = beir.queries_in_order(qids)
    topics = pd.DataFrame({"qid": qids, "query": texts})
    rows = [(q, d, int(r)) for q in qids for d, r in qrels[q].items()]
    qrels_df = pd.DataFrame(rows, columns=["qid", "docno", "label"])
    return Corpus(beir.item_ids, beir.item_texts, str(folder)), topics, qrels_df, len(qrels)


def run_corpus(name: str, budgets, max_queries: int | None, index_rows: int | None) -> dict:
    import pyterrier as pt
    import pyterrier_adaptive as pta
    from ir_measures import nDCG

    import crossknn
    from beir_bench import CachedCE
    from crossknn.ce import default_cross_encoder, default_dual_encoder
    from crossknn.pyterrier import (
        Bm25,
        CrossknnReranker,
        CrossknnRetriever,
        CrossknnScorer,
        corpus_graph,
    )

    corpus, topics, qrels, n_total = _corpus(name, max_queries)
    work = WORK / name
    work.mkdir(parents=True, exist_ok=True)
    ce = CachedCE(default_cross_encoder(precision="int8"), work / "ce_scores_int8.json")
    de = default_dual_encoder(precision="fp32")
    t0 = time.perf_counter()
    index_dir = work / ("index" if index_rows is None else f"index-{index_rows}rows")
    calls = "default" if index_rows is None else index_rows * len(corpus)
    if (index_dir / "index.json").is_file():
        index = crossknn.open_index(index_dir)
    else:
        index = crossknn.build_corpus_index(corpus, index_dir, ce=ce, de=de, index_calls=calls)
    ce.save()
    build_s = time.perf_counter() - t0
    print(f"{name}: index ready ({build_s:.0f} s, {index.index.ce_calls} CE calls)", flush=True)
    searcher = crossknn.Searcher(index, ce=ce, de=de)
    bm25 = Bm25(searcher, num_results=1000)
    graph = corpus_graph(searcher, work / f"graph-{time.time_ns()}")
    out = {
        "corpus": name,
        "n_items": searcher.n_items,
        "queries": f"the first {len(topics)} of {n_total} test queries in qrels/test.tsv order",
        "index_ce_calls": int(index.index.ce_calls),
        "index_budget": "the default" if index_rows is None else f"{index_rows} rows' worth",
        "ce": "minilm-l6-joint (embedded), int8",
        "de": "minilm-l6-de (embedded), fp32",
        "rows": {},
    }
    auto = "auto (default build" if index_rows is None else f"auto ({index_rows}-row index"
    auto += ", DE first stage)"
    for b in budgets:
        t = time.perf_counter()
        scorer = CrossknnScorer(searcher)
        spent = {
            "BM25 >> RNR": _Spent(CrossknnReranker(searcher, method="rnr", budget=b)),
            "BM25 >> gar": _Spent(CrossknnReranker(searcher, method="gar", budget=b)),
            auto: _Spent(CrossknnRetriever(searcher, budget=b, k=10)),
        }
        systems = {
            "BM25 (bm25s)": bm25,
            "BM25 >> RNR": bm25 >> spent["BM25 >> RNR"],
            "BM25 >> gar": bm25 >> spent["BM25 >> gar"],
            "BM25 >> pyterrier_adaptive.GAR": bm25
            >> pta.GAR(scorer, graph, num_results=b, batch_size=16),
            auto: spent[auto],
        }
        table = pt.Experiment(
            list(systems.values()), topics, qrels, [nDCG @ 10], names=list(systems)
        )
        ce.save()
        for label in systems:
            ndcg = float(table.loc[table.name == label, "nDCG@10"].iloc[0])
            if label in spent:
                calls = spent[label].ce_calls
            elif "pyterrier_adaptive" in label:
                calls = scorer.calls / len(topics)
            else:
                calls = 0.0
            out["rows"].setdefault(label, {})[str(b)] = {
                "nDCG@10": round(ndcg, 4),
                "ce_calls_per_query": None if calls is None else round(float(calls), 2),
            }
            print(f"{name} B={b} {label}: nDCG@10 {ndcg:.3f}, CE calls/q {calls}", flush=True)
        print(f"{name} B={b}: {time.perf_counter() - t:.0f} s", flush=True)
    return out


def part_ndcg(*, budgets, corpora, max_queries, index_rows=None, before=None) -> dict:
    """The ndcg section: ``before``'s corpora with those run now replaced."""
    out = {"what": "nDCG@10 (ir_measures) through pt.Experiment, BEIR test qrels", "corpora": {}}
    if before and before.get("budgets") == list(budgets):
        out["corpora"].update(before.get("corpora", {}))
    for name in corpora:
        out["corpora"][name] = run_corpus(name, budgets, max_queries, index_rows)
    out["budgets"] = list(budgets)
    return out
