"""Trained cross-encoders vs the DE and the embedded zero-shot CE: ``train_ce.MACHINE.json``.

Part 1, ranking quality (issue 12): on SciFact and NFCorpus (``../shared/data``), train a [CLS]
and an [EMB] CE on the train split (``crossknn train-ce``, listwise loss, DE-mined negatives, a
``--train-minutes`` budget per dataset and kind), then rerank the DE top-100 of the test queries
(all of them, or a fixed seeded subset of ``--test-queries``) with each model and measure
nDCG@10, RR@10 and R@100 with ir_measures. Rows: ``{dataset, model, kind, loss, steps,
train_s, ndcg@10, rr@10, r@100}`` with ``model`` de | embedded | trained.

Part 2, approximability (``--part 2``): for each trained CE, a score matrix over a sub-corpus
(``--sub-items`` NFCorpus items: the test queries' DE top items filled with random ones;
``--anchor-queries`` train queries as anchor rows and ``--sub-test`` test queries), built with
``crossknn score-matrix``'s library code; reports its singular-value decay (ranks holding 90% /
99% of the energy) and Top-10-Recall@B of ANNCUR, ADACUR, AXN and ``auto`` (10% index) at
B = 50, 100, 200 with ``crossknn eval``. Rows add ``method``, ``budget``, ``recall``.

Everything is resumable: the training runs continue from their checkpoints (``--work``, outside
the repository), rerank scores and rows are cached there, and a rerun only does what is missing.
A run with less than 45 minutes of training per dataset and kind, or a test-query cap, is marked
``"reduced": true`` in the JSON. Example (the reduced run in ``train_ce_cpu_reduced.json``)::

    nice -n 5 .venv/bin/python bench/train_ce_bench.py --work /tmp/train-ce-bench \\
        --train-minutes 8 --test-queries 20 --max-steps 60
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from _common import SHARED, machine, result_path, utc_now, write_json
from crossknn.fileio import atomic_save_npy, atomic_write_json, read_json
from crossknn.trec import parse_measures, run_metrics

DATASETS = ("scifact", "nfcorpus")
KINDS = ("cls", "emb")
FULL_MINUTES = 45
# the training settings a row carries (they differ per dataset: see docs/train.md)
_CONFIG_KEYS = (
    "lr",
    "head_lr",
    "negatives",
    "negatives_skip",
    "random_negatives",
    "threads",
    "max_minutes",
    "bf16",
    "max_steps",
)


def _metrics(qrels: dict, run: dict) -> dict:
    m = run_metrics(run, qrels, parse_measures("nDCG@10 RR@10 R@100"))
    return {
        "ndcg@10": round(m["nDCG@10"], 4),
        "rr@10": round(m["RR@10"], 4),
        "r@100": round(m["R@100"], 4),
    }


class Dataset:
    """A BEIR folder's test queries (a fixed subset), their qrels and DE top-100 (cached)."""

    def __init__(self, name: str, work: Path, n_queries: int | None, de) -> None:
        from crossknn.data import load_beir
        from crossknn.topk import topk_by_vectors
        from crossknn.train.negatives import item_vectors

        self.name, self.folder = name, SHARED / "data" / name
        beir = load_beir(self.folder)
        self.item_ids, self.item_texts = beir.item_ids, beir.item_texts
        test = {q: r for q, r in beir.qrels["test"].items() if any(v > 0 for v in r.values())}
        qids = sorted(q for q in test if q in set(beir.query_ids))
        if n_queries is not None and n_queries < len(qids):
            rng = np.random.default_rng(0)
            qids = sorted(rng.choice(qids, size=n_queries, replace=False).tolist())
        self.qids = qids
        self.qtexts = beir.queries_in_order(qids)
        self.qrels = {q: {d: int(v) for d, v in test[q].items()} for q in qids}
        d = work / name
        d.mkdir(parents=True, exist_ok=True)
        vecs = item_vectors(de, self.item_texts)  # cached: train-ce's mining reads the same
        qv = de.encode(self.qtexts)
        self.vecs = vecs
        self.top = topk_by_vectors(qv, vecs, 100)
        self.de_scores = np.take_along_axis(qv @ vecs.T, self.top, 1)
        self.work = d

    def run(self, scores: np.ndarray) -> dict:
        return {
            q: {self.item_ids[i]: float(s) for i, s in zip(self.top[r], scores[r], strict=True)}
            for r, q in enumerate(self.qids)
        }

    def vs_de(self, key: str) -> dict:
        """Per-query nDCG@10 of the cached rerank ``key`` minus the DE's on the same queries:
        mean, a seeded bootstrap 95% interval, and better / same / worse query counts."""
        import ir_measures
        from ir_measures import nDCG

        def per_query(scores):
            run = self.run(scores)
            got = {m.query_id: m.value for m in ir_measures.iter_calc([nDCG @ 10], self.qrels, run)}
            return np.array([got.get(q, 0.0) for q in self.qids])

        path = self.work / f"rerank-{key}-{len(self.qids)}.npy"
        d = per_query(np.load(path)) - per_query(self.de_scores)
        rng = np.random.default_rng(0)
        boot = [rng.choice(d, len(d)).mean() for _ in range(5000)]
        return {
            "mean": round(float(d.mean()), 4),
            "ci95": [round(float(np.percentile(boot, q)), 4) for q in (2.5, 97.5)],
            "better_same_worse": [
                int((d > 1e-9).sum()),
                int((abs(d) <= 1e-9).sum()),
                int((d < -1e-9).sum()),
            ],
        }

    def rerank(self, ce, key: str) -> np.ndarray:
        """CE scores of every (test query, DE top-100 item), cached under ``key``."""
        path = self.work / f"rerank-{key}-{len(self.qids)}.npy"
        if path.is_file():
            return np.load(path)
        ce.set_items(self.item_texts)
        scores = np.stack(ce.score_batch(self.qtexts, [row.tolist() for row in self.top]))
        atomic_save_npy(path, scores)
        return scores


AXN_BUDGET = 100
MODELS = ("de", "embedded", "trained")
REDUCED_NOTE = (
    "REDUCED run: less training time than the issue's 45 min per dataset and kind and/or a "
    "subset of the test queries and/or a part-2 matrix of fewer than 100 anchor x 50 test rows; "
    "not the issue's measurement."
)
_METRIC_KEYS = ("ndcg@10", "rr@10", "r@100", "ndcg@10_vs_de")


class _KnownItemsDE:
    """The DE, answering ``encode`` of corpus texts from the cached item vectors (the index of
    each model would otherwise encode the same corpus again); anything else goes to the DE."""

    def __init__(self, de, texts: list[str], vecs: np.ndarray) -> None:
        self._de = de
        self._rows = {t: i for i, t in enumerate(texts)}
        self._vecs = vecs

    def __getattr__(self, name):
        return getattr(self._de, name)

    def encode(self, texts, **kw) -> np.ndarray:
        rows = [self._rows.get(t) for t in texts]
        if all(r is not None for r in rows):
            return self._vecs[np.asarray(rows, dtype=np.int64)]
        return self._de.encode(texts, **kw)


def _axn_row(ds, ce, key: str, de, base: dict) -> dict:
    """The budgeted search (AXN, B = 100 CE calls per query over the whole corpus) with ``ce``.

    Its CE calls reuse the rerank's pairs (``beir_bench.CachedCE``, seeded with them); the index
    (DE item vectors, calibrated with this CE) is built once per model under the work folder."""
    import crossknn
    from beir_bench import CachedCE
    from crossknn.data import Corpus

    cached = CachedCE(ce, ds.work / f"ce-pairs-{key}-{len(ds.qids)}.json")
    for q, top, sc in zip(ds.qtexts, ds.top, ds.rerank(ce, key), strict=True):
        cached.cache.setdefault(q, {}).update(zip(top.tolist(), map(float, sc), strict=True))
    index_dir = ds.work / f"index-{key}"
    if (index_dir / "index.json").is_file():
        index = crossknn.open_index(index_dir)
    else:
        corpus = Corpus(ds.item_ids, ds.item_texts, str(ds.folder))
        known = _KnownItemsDE(de, ds.item_texts, ds.vecs)
        index = crossknn.build_corpus_index(corpus, index_dir, ce=cached, de=known)
    hits = crossknn.Searcher(index, ce=cached, de=de).search(
        ds.qtexts, k=AXN_BUDGET, budget=AXN_BUDGET, method="axn"
    )
    cached.save()
    run = {
        q: dict(zip(h.ids, map(float, h.scores), strict=True))
        for q, h in zip(ds.qids, hits, strict=True)
    }
    calls = float(np.mean([h.ce_calls for h in hits]))
    return {
        **base,
        **_metrics(ds.qrels, run),
        "method": "axn",
        "budget": AXN_BUDGET,
        "ce_calls_per_query": calls,
    }


def _train_config(config: dict, defaults) -> dict:
    """The settings a row reports; records older than a setting get the value it then had (the
    [CLS] head learned at ``lr`` before ``head_lr`` existed)."""
    old = {"head_lr": config["lr"]}
    return {k: config.get(k, old.get(k, getattr(defaults, k))) for k in _CONFIG_KEYS}


def _row(ds, model, kind, loss, steps, train_s, metrics, **extra) -> dict:
    return {
        "dataset": ds,
        "model": model,
        "kind": kind,
        "loss": loss,
        "steps": steps,
        "train_s": train_s,
        **metrics,
        **extra,
    }


def _cached(path: Path, make):
    if path.is_file():
        return read_json(path)
    row = make()
    atomic_write_json(path, row)
    return row


def part1(args, work: Path, de) -> list[dict]:
    from crossknn.ce import OnnxCrossEncoder, default_cross_encoder
    from crossknn.train import TrainConfig, train_cross_encoder

    rows = []
    defaults = TrainConfig()  # for settings older training records do not carry
    for name in args.datasets:
        ds = Dataset(name, work, args.test_queries, de)
        print(f"{name}: {len(ds.qids)} test queries, {len(ds.item_ids)} items")
        if "de" in args.models:
            rows.append(
                _cached(
                    ds.work / f"row-de-{len(ds.qids)}.json",
                    lambda ds=ds: _row(
                        ds.name, "de", None, None, 0, 0.0, _metrics(ds.qrels, ds.run(ds.de_scores))
                    ),
                )
            )
            print(rows[-1])

        if "embedded" in args.models:

            def embedded(ds=ds):
                ce = default_cross_encoder(threads=args.threads)
                s = ds.rerank(ce, "embedded")
                return _row(ds.name, "embedded", "emb", None, 0, 0.0, _metrics(ds.qrels, ds.run(s)))

            rows.append(_cached(ds.work / f"row-embedded-{len(ds.qids)}.json", embedded))
            rows[-1] = {**rows[-1], "ndcg@10_vs_de": ds.vs_de("embedded")}
            print(rows[-1])
            base = {k: v for k, v in rows[-1].items() if k not in _METRIC_KEYS}
            rows.append(
                _cached(
                    ds.work / f"row-embedded-axn-{len(ds.qids)}.json",
                    lambda ds=ds, base=base: _axn_row(
                        ds, default_cross_encoder(threads=args.threads), "embedded", de, base
                    ),
                )
            )
            print(rows[-1])
        for kind in args.kinds if "trained" in args.models else []:
            out = ds.work / f"{kind}-{args.loss}"
            cfg = TrainConfig(
                kind=kind,
                loss=args.loss,
                max_steps=args.max_steps,
                max_minutes=args.train_minutes,
                batch_size=args.batch_size,
                grad_accum=args.grad_accum,
                lr=args.lr,
                head_lr=args.head_lr,
                dev_queries=args.dev_queries,
                eval_every=args.eval_every,
                checkpoint_every=args.eval_every,
                threads=args.threads,
                patience=args.patience,
                negatives=args.negatives,
                negatives_skip=args.negatives_skip,
                random_negatives=args.random_negatives,
                bf16=args.bf16,
            )
            if not (out / "training.json").is_file():
                work = out / "train"  # the bench's layout: its work folder inside, kept
                train_cross_encoder(
                    ds.folder, out, cfg, resume=work.is_dir(), work_dir=work, keep_checkpoints=True
                )
            rec = read_json(out / "training.json")

            def trained(ds=ds, out=out, kind=kind, rec=rec):
                ce = OnnxCrossEncoder(out, threads=args.threads)
                s = ds.rerank(ce, f"{kind}-{args.loss}")
                return _row(
                    ds.name,
                    "trained",
                    kind,
                    args.loss,
                    rec["steps"],
                    rec["train_s"],
                    _metrics(ds.qrels, ds.run(s)),
                    selected_step=rec["selected_step"],
                    stopped=rec.get("stopped"),
                    train_config=_train_config(rec["config"], defaults),
                    dev_curve=read_json(out / "dev_curve.json"),
                )

            key = f"{kind}-{args.loss}"
            rows.append(_cached(ds.work / f"row-{key}-{len(ds.qids)}.json", trained))
            rows[-1] = {**rows[-1], "ndcg@10_vs_de": ds.vs_de(key)}
            print({k: v for k, v in rows[-1].items() if k != "dev_curve"})
            base = {k: v for k, v in rows[-1].items() if k not in _METRIC_KEYS}
            base.pop("dev_curve", None)
            rows.append(
                _cached(
                    ds.work / f"row-{key}-axn-{len(ds.qids)}.json",
                    lambda ds=ds, out=out, key=key, base=base: _axn_row(
                        ds, OnnxCrossEncoder(out, threads=args.threads), key, de, base
                    ),
                )
            )
            print(rows[-1])
    return rows


def _sub_corpus(args, work: Path, de):
    """NFCorpus sub-corpus: ids of anchor (train) queries, test queries and items, fixed by seed."""
    from crossknn.data import load_beir
    from crossknn.topk import topk_by_vectors
    from crossknn.train.negatives import item_vectors

    beir = load_beir(SHARED / "data" / "nfcorpus")
    rng = np.random.default_rng(0)
    qset = set(beir.query_ids)

    def with_pos(split):
        return sorted(q for q, r in beir.qrels[split].items() if q in qset and max(r.values()) > 0)

    anchors = sorted(rng.choice(with_pos("train"), args.anchor_queries, replace=False).tolist())
    tests = sorted(rng.choice(with_pos("test"), args.sub_test, replace=False).tolist())
    vecs = item_vectors(de, beir.item_texts)
    qv = de.encode(beir.queries_in_order(tests))
    per = max(1, args.sub_items // (2 * len(tests)))
    near = np.unique(topk_by_vectors(qv, vecs, per).ravel())  # half: the test queries' DE top
    rest = np.setdiff1d(np.arange(len(beir.item_ids)), near)
    fill = rng.choice(rest, max(0, args.sub_items - len(near)), replace=False)
    items = np.sort(np.concatenate([near, fill]))[: args.sub_items]
    return beir, anchors, tests, items, vecs


def _matrix(folder: Path, rows_dir: Path, ce, beir, qids, items, vecs, de, n_train) -> Path:
    """The score-matrix folder of ``ce`` over ``qids`` x ``items`` (rows cached in ``rows_dir``
    by query id: resumable)."""
    from crossknn.matrix import save_score_matrix

    if (folder / "meta.json").is_file():
        return folder
    rows_dir.mkdir(parents=True, exist_ok=True)
    texts = beir.queries_in_order(qids)
    ce.set_items([beir.item_texts[i] for i in items])
    out = []
    for qid, q in zip(qids, tqdm(texts, desc=f"matrix {folder.name}"), strict=True):
        f = rows_dir / f"q-{qid}.npy"  # by query id: a matrix of fewer anchors reuses the rows
        if not f.is_file():
            atomic_save_npy(f, ce.score(q, list(range(len(items)))))
        out.append(np.load(f))
    splits = {"train": list(range(n_train)), "test": list(range(n_train, len(qids)))}
    save_score_matrix(
        folder,
        np.stack(out),
        qids,
        [beir.item_ids[i] for i in items],
        splits,
        {"dataset": "nfcorpus", "model": str(ce.model_id), "built_by": "train_ce_bench"},
        de_queries=de.encode(texts),
        de_items=vecs[items],
    )
    return folder


def _energy_ranks(scores: np.ndarray) -> dict:
    """Ranks holding 90% / 99% of the squared singular values, of the matrix as is and of the
    matrix minus its mean (a constant offset alone is one dominant singular value)."""
    out = {}
    for name, a in (("", scores), ("centered_", scores - scores.mean())):
        s = np.linalg.svd(a.astype(np.float64), compute_uv=False)
        e = np.cumsum(s**2) / np.sum(s**2)
        out[f"{name}rank_90"] = int(np.searchsorted(e, 0.90) + 1)
        out[f"{name}rank_99"] = int(np.searchsorted(e, 0.99) + 1)
        out[f"{name}singular_values"] = [round(float(x), 4) for x in s[:50]]
    return out


def _sub_quality(m, beir) -> dict:
    """nDCG@10 / RR@10 of the CE's and of the DE's ranking of the sub-corpus for its test rows
    (qrels restricted to the sub-corpus): are the two CEs of comparable ranking quality?"""
    qrels_all = beir.qrels["test"]
    keep = set(m.item_ids)
    qrels = {
        m.query_ids[r]: {d: int(v) for d, v in qrels_all[m.query_ids[r]].items() if d in keep}
        for r in m.test
    }
    qrels = {q: r for q, r in qrels.items() if any(v > 0 for v in r.values())}
    out = {"sub_test_queries_with_relevant": len(qrels)}
    for who, scores in (("ce", m.scores[m.test]), ("de", m.de_queries[m.test] @ m.de_items.T)):
        run = {
            m.query_ids[r]: {m.item_ids[i]: float(s[i]) for i in np.argsort(-s)[:100]}
            for r, s in zip(m.test, scores, strict=True)
            if m.query_ids[r] in qrels
        }
        q = _metrics(qrels, run)
        out[f"{who}_ndcg@10"], out[f"{who}_rr@10"] = q["ndcg@10"], q["rr@10"]
    return out


def part2(args, work: Path, de) -> tuple[list[dict], dict]:
    """Approximability of the trained CEs' score matrices (see the module docstring)."""
    from crossknn.ce import OnnxCrossEncoder
    from crossknn.eval import EvalConfig, evaluate

    beir, anchors, tests, items, vecs = _sub_corpus(args, work, de)
    anchors = anchors[: args.matrix_anchors]  # the first M of the seeded draws (default all)
    tests = tests[: args.matrix_tests]
    name = f"nfcorpus-sub{len(items)}"
    rows, decay = [], {}
    for kind in args.kinds:
        model = work / args.part2_models / f"{kind}-{args.loss}"
        rec = read_json(model / "training.json")
        ce = OnnxCrossEncoder(model, threads=args.threads)
        folder = _matrix(
            work / name / f"{args.part2_models}-{kind}-a{len(anchors)}t{len(tests)}",
            work / name / "rows" / f"{args.part2_models}-{kind}",
            ce,
            beir,
            anchors + tests,
            items,
            vecs,
            de,
            len(anchors),
        )
        from crossknn.matrix import load_score_matrix

        m = load_score_matrix(folder)
        decay[kind] = {
            "trained_on": args.part2_models,
            **_energy_ranks(m.scores),
            **_sub_quality(m, beir),
        }
        # auto: crossknn's default method, its index from 10% of the anchor rows' entries
        cfg = EvalConfig(methods=["anncur", "adacur", "axn", "auto"], budgets=args.budgets, ks=[10])
        for r in evaluate(m, cfg, progress=False):
            rows.append(
                _row(
                    name,
                    "trained",
                    kind,
                    args.loss,
                    rec["steps"],
                    rec["train_s"],
                    {"ndcg@10": None, "rr@10": None, "r@100": None},
                    method=r["method"],
                    budget=r["budget"],
                    recall=r["recall"],
                    index_ce_calls=r.get("index_ce_calls"),
                    trained_on=args.part2_models,
                )
            )
        print(name, kind, {k: v for k, v in decay[kind].items() if "singular" not in k}, flush=True)
    return rows, decay


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True, help="folder for models and caches (not the repo)")
    ap.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=DATASETS)
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    ap.add_argument(
        "--models",
        nargs="+",
        default=list(MODELS),
        choices=MODELS,
        help="part 1 rows to compute (separate processes can fill the caches in parallel)",
    )
    ap.add_argument("--loss", default="listwise", choices=["bce", "listwise"])
    ap.add_argument("--train-minutes", type=float, default=FULL_MINUTES)
    ap.add_argument("--max-steps", type=int, default=None, help="default: one epoch")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--grad-accum", type=int, default=1)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--head-lr", type=float, default=1e-3, help="[CLS] head learning rate")
    ap.add_argument("--dev-queries", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--patience", type=int, default=5)
    ap.add_argument("--test-queries", type=int, default=None, help="a fixed subset (default all)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--bf16", action="store_true", help="train with bfloat16 autocast")
    ap.add_argument("--negatives", type=int, default=30, help="hard negatives: DE top-N")
    ap.add_argument("--negatives-skip", type=int, default=0, help="...minus its first M ranks")
    ap.add_argument("--random-negatives", type=int, default=2, help="random items per group")
    ap.add_argument("--part", nargs="+", type=int, default=[1, 2], choices=[1, 2])
    ap.add_argument("--sub-items", type=int, default=1000, help="part 2: NFCorpus items")
    ap.add_argument("--anchor-queries", type=int, default=100, help="part 2: train rows")
    ap.add_argument("--sub-test", type=int, default=50, help="part 2: test rows")
    ap.add_argument("--budgets", nargs="+", type=int, default=[50, 100, 200], help="part 2")
    ap.add_argument(
        "--matrix-anchors",
        type=int,
        default=None,
        help="part 2: use only the first M of the --anchor-queries drawn (default all)",
    )
    ap.add_argument(
        "--matrix-tests",
        type=int,
        default=None,
        help="part 2: use only the first T of the --sub-test queries drawn (default all)",
    )
    ap.add_argument(
        "--part2-models",
        default="nfcorpus",
        choices=DATASETS,
        help="part 2: score the NFCorpus sub-corpus with the CEs trained on this dataset",
    )
    ap.add_argument("--out", default=str(result_path("train_ce", gpu=True)))
    args = ap.parse_args()

    from crossknn.ce import default_dual_encoder

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    de = default_dual_encoder(threads=args.threads)
    rows = part1(args, work, de) if 1 in args.part else []
    decay = {}
    if 2 in args.part:
        rows2, decay = part2(args, work, de)
        rows += rows2
    reduced = (
        args.train_minutes < FULL_MINUTES
        or args.test_queries is not None
        or (2 in args.part and (args.matrix_anchors or args.anchor_queries) < 100)
        or (2 in args.part and (args.matrix_tests or args.sub_test) < 50)
    )
    write_json(
        args.out,
        {
            "benchmark": "train_ce",
            "date": utc_now(),
            "reduced": reduced,
            "note": (
                (REDUCED_NOTE + " " if reduced else "")
                + "Settings are this invocation's; rows already cached under --work are read, not "
                "recomputed, and each trained row's train_config is the recipe its model was "
                "trained with."
            ),
            "settings": {k: v for k, v in vars(args).items() if k not in ("out", "work")},
            "wall_s": round(time.perf_counter() - t0, 1),
            "machine": machine("torch", "onnxruntime", "ir_measures"),
            "rows": rows,
            "approximability": decay,
        },
    )
    print(
        f"{'dataset':9} {'model':13} {'kind':5} {'steps':>6} {'train_s':>8} "
        f"{'nDCG@10':>8} {'RR@10':>7} {'R@100':>7}"
    )
    for r in rows:
        if "recall" in r:
            print(
                f"{r['dataset']:9} {r['kind']:5} {r['method']:7} B={r['budget']:<4} "
                f"Top-10-Recall {r['recall']:.3f}"
            )
            continue
        model = r["model"] + (f"+{r['method']}" if "method" in r else "")
        print(
            f"{r['dataset']:9} {model:13} {r['kind'] or '-':5} {r['steps']:>6} "
            f"{r['train_s']:>8.0f} {r['ndcg@10']:>8.4f} {r['rr@10']:>7.4f} {r['r@100']:>7.4f}"
        )


if __name__ == "__main__":
    main()
