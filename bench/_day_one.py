"""Day-one rows (issue 55): the default build's pseudo-query rows against keyword rows and real
rows, its budget, and whether two builds are the same index.

    .venv/bin/python bench/recall_bench.py day-one --part choose # candidates, train splits
    .venv/bin/python bench/recall_bench.py day-one --part final  # three corpora, test queries
    .venv/bin/python bench/recall_bench.py day-one --part repro  # two builds, one under load

The corpora: CISI (``../shared/matrices/cisi-minilm``, 1,460 items), NFCorpus
(``nfcorpus-minilm-gpu``, 3,633 items; its matrix was scored with the CE's weight matrices
rounded through per-row int8 as ``../shared/tools/gpu-bundle/pack.sh`` writes them, so every new
row here is scored by that checkpoint, exported as the embedded CE and run on the CPU in fp32)
and SciFact (5,183 items; no shared matrix: the exact scores of its 300 test queries are computed
once by the project's resumable ``crossknn score-matrix`` into ``--work``/scifact-test). A query
that is a row of a matrix is looked up there (the same CE's exact scores); every other pair
(pseudo-queries, SciFact's train queries) is scored by the CE and kept in a cache on disk (a rerun
resumes). The DE is the embedded DE (vectors cached on disk).

``choose`` (train splits only): each candidate pseudo-query generator's rows at the default budget
of seeded item subsets (``--items``, CISI whole), Top-10-Recall@B of ``auto`` (B = 50, 100, 200)
on train queries (half of the train queries are searched, the other half give the real-row
reference). ``final``: on all items of each corpus, the default build (``crossknn build`` with no
flag), the same budget on today's keyword rows and on rows of the train queries
(``--train-queries``), and RNR (the DE's top-B reranked), searched with the test queries against
the exact top-10; ``--final-trials`` adds choose candidates on all items (under their names) and
two ablations of the real rows: ``real/rows-only`` (the real build's row queries alone) and
``real/nolp`` (every train query, no partial rows). ``repro``: two default builds of CISI with
the real CE, the second while ``--load`` busy processes run, compared array by array, bit for
bit; every build's CE calls against its stated index budget.

Writes ``bench/results/day_one_rows.json`` (``goals``: the issue's four keys).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_json  # noqa: E402
from lifecycle_bench import HybridCE  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
MATRICES = SHARED / "matrices"
DATA = SHARED / "data"
OUT = REPO / "bench" / "results" / "day_one_rows.json"
WORK = REPO / "build" / "day_one_bench"
K = 10
BUDGETS = (50, 100, 200)
CORPORA = ("cisi", "nfcorpus", "scifact")


# ---- models ----------------------------------------------------------------------------------


class DiskDE:
    """The embedded DE, each text encoded once and kept on disk (``vectors.npy`` + ``keys.json``
    in ``folder``): the same vectors, fewer passes over a shared CPU."""

    def __init__(self, de, folder: Path) -> None:
        self.de, self.folder = de, Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.cache: dict[str, np.ndarray] = {}
        keys, vecs = self.folder / "keys.json", self.folder / "vectors.npy"
        if keys.is_file() and vecs.is_file():
            k, v = json.loads(keys.read_text()), np.load(vecs)
            if len(k) == len(v):
                self.cache = dict(zip(k, v, strict=True))

    def __getattr__(self, name):
        if name.startswith("__") or name in ("de", "cache", "folder"):
            raise AttributeError(name)
        return getattr(self.de, name)

    @staticmethod
    def _key(text: str) -> str:
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]

    def encode(self, texts, **kw):
        texts = list(texts)
        keys = [self._key(t) for t in texts]
        todo = {k: t for k, t in zip(keys, texts, strict=True) if k not in self.cache}
        if todo:
            got = np.asarray(self.de.encode(list(todo.values()), **kw), np.float32)
            self.cache.update(zip(todo, got, strict=True))
            order = list(self.cache)
            tmp = self.folder / ".vectors.tmp.npy"
            np.save(tmp, np.stack([self.cache[k] for k in order]))
            os.replace(tmp, self.folder / "vectors.npy")
            (self.folder / "keys.json").write_text(json.dumps(order))
        if not texts:
            return np.empty((0, self.dim), np.float32)
        return np.stack([self.cache[k] for k in keys])


def rounded_ce(work: Path):
    """The embedded CE with its weight matrices rounded through per-row int8, as pack.sh writes
    them and unpack.sh restores them (2-D weights of at least 100,000 entries: scale = max |row|
    / 127, q = clip(round(w / scale), -127, 127), w' = q * scale in float32), exported by the
    embedded model's own recipe into ``work``/minilm-int8-rounded and run in fp32 on the CPU."""
    from safetensors.numpy import load_file, save_file

    from crossknn.ce import OnnxCrossEncoder
    from crossknn.ce.models import DEFAULT_CE, _build, cached_export, minilm_checkpoint_dir

    src = minilm_checkpoint_dir()
    ck = work / "minilm-int8-rounded-checkpoint"
    if not (ck / "model.safetensors").is_file():
        tmp = work / ".rounded-tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp)
        w = {}
        for k, v in load_file(str(src / "model.safetensors")).items():
            if v.ndim == 2 and v.size >= 100_000:
                s = np.abs(v).max(axis=1, keepdims=True) / 127.0
                s[s == 0] = 1
                q = np.clip(np.round(v / s), -127, 127).astype(np.int8)
                w[k] = q.astype(np.float32) * s.astype(np.float32)
            else:
                w[k] = v.astype(np.float32)
        save_file(w, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        shutil.rmtree(ck, ignore_errors=True)
        os.replace(tmp, ck)
    path = cached_export(
        work / "minilm-int8-rounded",
        lambda out: _build(DEFAULT_CE, "fp32", ck, out),
        what="int8-rounded MiniLM CE",
    )
    return OnnxCrossEncoder(path)


# ---- corpora ---------------------------------------------------------------------------------


class Setup:
    """One corpus as the bench uses it: its items (all, or a seeded subset), the exact scores of
    the matrix queries over them, the train and test queries, and the CE for everything else
    (matrix rows looked up, other pairs scored once and cached)."""

    def __init__(self, name: str, n_items: int, seed: int, work: Path) -> None:
        from crossknn.data import Corpus, load_beir

        self.name, self.seed, self.work = name, seed, work
        beir = load_beir(DATA / name)
        self.matrix = self._matrix(name, work)
        if self.matrix is not None:
            ids = list(self.matrix.item_ids)
            texts = beir.items_in_order(ids)
        else:
            ids, texts = list(beir.item_ids), list(beir.item_texts)
        rng = np.random.default_rng(seed)
        cols = np.arange(len(ids))
        if 0 < n_items < len(ids):
            cols = np.sort(rng.choice(len(ids), n_items, replace=False))
        self.cols = cols
        self.corpus = Corpus([ids[c] for c in cols], [texts[c] for c in cols], name)
        self.full = cols.size == len(ids)
        col_of_text: dict[str, int] = {}
        for j, t in enumerate(self.corpus.texts):
            col_of_text.setdefault(t, j)
        self.col_of_text = col_of_text
        # the matrix's queries: one row per distinct text
        self.qrow: dict[str, int] = {}
        self.S = None
        self.test: list[str] = []
        self.test_rows: list[int] = []
        if self.matrix is not None:
            qtexts = beir.queries_in_order(list(self.matrix.query_ids))
            for r, t in enumerate(qtexts):
                self.qrow.setdefault(t, r)
            self.S = np.ascontiguousarray(np.asarray(self.matrix.scores)[:, cols], np.float32)
            test = self.matrix.test if name != "scifact" else range(len(qtexts))
            self.test_rows = [int(r) for r in test if self.qrow[qtexts[r]] == r]
            self.test = [qtexts[r] for r in self.test_rows]
        # train queries: the matrix's train rows, or (SciFact) the BEIR train split
        if self.matrix is not None and name != "scifact":
            qtexts = beir.queries_in_order(list(self.matrix.query_ids))
            self.train = list(dict.fromkeys(qtexts[r] for r in self.matrix.train))
        else:
            by_id = dict(zip(beir.query_ids, beir.query_texts, strict=True))
            self.train = list(dict.fromkeys(by_id[q] for q in beir.qrels["train"]))
        self._ce = None

    @staticmethod
    def _matrix(name: str, work: Path):
        from crossknn.matrix import load_score_matrix

        path = {
            "cisi": MATRICES / "cisi-minilm",
            "nfcorpus": MATRICES / "nfcorpus-minilm-gpu",
            "scifact": work / "scifact-test",
        }[name]
        return load_score_matrix(path, mmap=True) if (path / "meta.json").is_file() else None

    @property
    def n(self) -> int:
        return len(self.corpus)

    def ce(self) -> HybridCE:
        """The CE of this corpus: matrix rows looked up, the rest scored and cached on disk."""
        if self._ce is None:
            import crossknn.ce

            real = rounded_ce(self.work) if self.name == "nfcorpus" else None
            real = real or crossknn.ce.default_cross_encoder()
            cache = self.work / "ce" / f"{self.name}-{self.n}-{self.seed}.jsonl"
            cache.parent.mkdir(parents=True, exist_ok=True)
            self._ce = HybridCE(real, self.S, self.qrow, self.col_of_text, cache=cache)
        return self._ce

    def exact_rows(self, queries: list[str]) -> np.ndarray:
        """(len(queries), N) exact CE scores: matrix rows, else complete rows scored (cached)."""
        ce = self.ce()
        ce.set_items(self.corpus.texts)
        out = np.empty((len(queries), self.n), np.float32)
        every = np.arange(self.n, dtype=np.int64)
        for lo in range(0, len(queries), 4):
            batch = queries[lo : lo + 4]
            for j, row in enumerate(ce.score_batch(batch, [every] * len(batch))):
                out[lo + j] = row
            if lo % 40 == 0 and lo:
                print(f"  {self.name}: exact rows {lo}/{len(queries)}", flush=True)
        return out


def exact_top_ids(setup: Setup, rows: np.ndarray) -> list[set]:
    from crossknn.topk import exact_top_k

    ids = setup.corpus.ids
    return [{ids[j] for j in exact_top_k(r.astype(np.float64), K).tolist()} for r in rows]


def recall_of(index_dir: Path, setup: Setup, de, queries, exact) -> dict[int, float]:
    """Mean Top-10-Recall@B of the index's default method over ``queries``, per B."""
    from crossknn.corpus_folder import open_index
    from crossknn.searcher import Searcher

    s = Searcher(open_index(index_dir), ce=setup.ce(), de=de)
    out = {}
    for b in BUDGETS:
        hits = s.search(queries, k=K, budget=b)
        out[b] = round(
            float(np.mean([len(set(h.ids) & ex) / K for h, ex in zip(hits, exact, strict=True)])),
            4,
        )
    return out


def rnr_recall(setup: Setup, de, queries, exact) -> dict[int, float]:
    """RNR: the DE's top-B items reranked by the CE (what a user would otherwise run)."""
    ce = setup.ce()
    ce.set_items(setup.corpus.texts)
    V = np.asarray(de.encode(setup.corpus.texts), np.float32)
    Q = np.asarray(de.encode(queries), np.float32)
    ids = setup.corpus.ids
    out = {}
    for b in BUDGETS:
        rec = []
        for q, v, ex in zip(queries, Q, exact, strict=True):
            top = np.argsort(-(V @ v), kind="stable")[:b]
            sc = ce.score_batch([q], [top])[0]
            got = {ids[int(top[j])] for j in np.argsort(-sc, kind="stable")[:K]}
            rec.append(len(got & ex) / K)
        out[b] = round(float(np.mean(rec)), 4)
    return out


def build(setup: Setup, de, out: Path, **kw) -> Path:
    """A corpus index of the setup's items with the setup's CE (``build_corpus_index``)."""
    from crossknn.corpus.build import build_corpus_index

    ce = setup.ce()
    if not (out / "index.json").is_file():
        shutil.rmtree(out, ignore_errors=True)
        build_corpus_index(setup.corpus, out, ce=ce, de=de, progress=False, **kw)
    return out


# ---- choose: candidate pseudo-query generators on train splits -------------------------------


def gen_keywords(corpus, n, seed):
    """Today's rows: one-word keyword queries, filled up with first-words queries."""
    from crossknn.corpus.pseudo import auto_pseudo_queries

    return auto_pseudo_queries(corpus, n, seed=seed, kind="keywords")


def _kind(kind: str):
    def gen(corpus, n, seed):
        from crossknn.corpus.pseudo import pseudo_queries

        return pseudo_queries(corpus, n, seed=seed, kind=kind)

    return gen


def pool_small(m: int) -> int:
    return max(16, m)  # today's count: the calibration's 16 or one a row


def pool_large(m: int) -> int:
    return 4 * m


def gen_lengths(corpus, n, seed, lengths):
    """As long as each example in turn: one word -> a keyword query, L words -> a passage of L
    words (at most PASSAGE_MAX_WORDS), interleaved in the examples' order."""
    from crossknn.corpus.pseudo import auto_pseudo_queries, pseudo_queries
    from crossknn.corpus.pseudo_shape import PASSAGE_MAX_WORDS

    want = [min(int(lengths[j % len(lengths)]), PASSAGE_MAX_WORDS) for j in range(n)]
    made = {
        L: iter(
            auto_pseudo_queries(corpus, want.count(L), seed=seed)
            if L <= 1
            else pseudo_queries(corpus, want.count(L), seed=seed + L, kind="passage", words=L)
        )
        for L in set(want)
    }
    return list(dict.fromkeys(q for q in (next(made[L], None) for L in want) if q))


# name -> (generator, pool size by rows m, auto's build options); the kinds are
# crossknn.corpus.pseudo's; "/nolp": no learned prior (no partial rows: its 4% of C back to rows)
NOLP = {"partial_items": 0}
CANDIDATES = {
    "keywords": (gen_keywords, pool_small, {}),
    "first": (_kind("first"), pool_small, {}),
    "sentence": (_kind("sentence"), pool_small, {}),
    "mix+pool": (_kind("mix"), pool_large, {}),
    "sentence+pool": (_kind("sentence"), pool_large, {}),
    "keywords+pool": (gen_keywords, pool_large, {}),
    "spans+pool": (_kind("spans"), pool_large, {}),
    "keywords/nolp": (gen_keywords, pool_small, NOLP),
    "mix+pool/nolp": (_kind("mix"), pool_large, NOLP),
    "sentence+pool/nolp": (_kind("sentence"), pool_large, NOLP),
    "spans+pool/nolp": (_kind("spans"), pool_large, NOLP),
    "keywords+pool/nolp": (gen_keywords, pool_large, NOLP),
    # as long as each of the EXAMPLES example queries in turn (needs them: see part_choose)
    "lengths+pool/nolp": (gen_lengths, pool_large, NOLP),
}


EVAL_TRAIN = {"cisi": 0, "nfcorpus": 400, "scifact": 40}  # train queries searched (0: all)


# results of --example-queries builds: "examples" (today's code); trials under "examples/...":
# "examples/length" (a keyword/first-words/sentence mix picked by the examples' length),
# "examples/near-mix" (that mix cut four times over, kept nearest the examples in the DE space;
# code at commit dc6b4d0), "examples/lengths" (the lengths+pool/nolp candidate on all items)
EXAMPLES = 8  # example queries a user gives --example-queries: a seeded handful of train queries


def example_queries(setup: Setup, seed: int) -> list[str]:
    """The ``--example-queries`` of the bench: :data:`EXAMPLES` seeded train queries."""
    rng = np.random.default_rng([seed, 8])
    return [setup.train[i] for i in np.sort(rng.choice(len(setup.train), EXAMPLES, replace=False))]


def _sample(queries: list[str], n: int, seed: int) -> list[str]:
    if not 0 < n < len(queries):
        return list(queries)
    rng = np.random.default_rng([seed, 5])
    return [queries[i] for i in np.sort(rng.choice(len(queries), n, replace=False))]


def part_choose(args, res: dict) -> None:
    """Each candidate's rows at the default budget of the setup's items, searched with train
    queries; the real-row reference from the other train queries (two folds)."""
    import crossknn.ce
    from crossknn.index.auto import default_index_rows

    de = DiskDE(crossknn.ce.default_dual_encoder(show_progress_bar=False), args.work / "de")
    ch = res.setdefault("choice", {})
    ch["what"] = (
        "Top-10-Recall@B of auto on train queries; rows of each candidate's pseudo-queries at "
        "the default budget (m = N // 100 complete rows, C = m x N) of the items; real_rows: "
        "rows of the other train queries (two folds)"
    )
    recall = ch.setdefault("recall", {})
    setups = ch.setdefault("setup", {})
    for name in args.corpora:
        setup = Setup(name, args.items, args.seed, args.work)
        m = default_index_rows(setup.n)
        C = m * setup.n
        queries = _sample(setup.train, EVAL_TRAIN[name], args.seed)
        print(f"{name}: {setup.n} items, {m} rows (C = {C:,}), {len(queries)} train queries")
        exact = exact_top_ids(setup, setup.exact_rows(queries))
        setups[name] = {"items": setup.n, "rows": m, "index_calls": C, "queries": len(queries)}
        root = args.work / "choose" / f"{name}-{setup.n}-{args.seed}"
        for cand in args.candidates:
            if cand in recall.get(name, {}) and not args.again:
                continue
            gen, pool, opts = CANDIDATES[cand]
            if gen is gen_lengths:
                lengths = [len(q.split()) for q in example_queries(setup, args.seed)]
                qs = gen(setup.corpus, pool(m), args.seed, lengths)
            else:
                qs = gen(setup.corpus, pool(m), args.seed)
            t = time.perf_counter()
            d = build(
                setup,
                de,
                root / cand.replace("/", "-"),
                train_queries=qs,
                index_calls=C,
                auto_options=opts,
            )
            rec = recall_of(d, setup, de, queries, exact)
            recall.setdefault(name, {})[cand] = rec
            took = time.perf_counter() - t
            print(f"  {cand:<16} {len(qs):>4} pseudo-queries  {rec}  ({took:.0f} s)")
            write_json(args.out, res)
        if "examples" not in recall.get(name, {}) or args.again:
            # what crossknn build --example-queries makes of a handful of train queries
            ex = example_queries(setup, args.seed)
            d = build(setup, de, root / "examples", example_queries=ex, index_calls=C)
            recall.setdefault(name, {})["examples"] = rec = recall_of(d, setup, de, queries, exact)
            kind = json.loads((d / "index.json").read_text())["params"]["pseudo_queries"]["kind"]
            print(f"  {'examples':<16} ({kind}) {rec}")
            write_json(args.out, res)
        if "real_rows" not in recall.get(name, {}) or args.again:
            folds = [queries[0::2], queries[1::2]]
            num = {b: 0.0 for b in BUDGETS}
            for f, fold in enumerate(folds):
                held = set(fold)
                train = [q for q in setup.train if q not in held]
                d = build(setup, de, root / f"real_rows_{f}", train_queries=train, index_calls=C)
                ex = [e for q, e in zip(queries, exact, strict=True) if q in held]
                r = recall_of(d, setup, de, fold, ex)
                for b in BUDGETS:
                    num[b] += r[b] * len(fold)
            rec = {b: round(num[b] / len(queries), 4) for b in BUDGETS}
            recall.setdefault(name, {})["real_rows"] = rec
            print(f"  {'real_rows':<16} {rec}")
            write_json(args.out, res)


def _budget_row(index_dir: Path) -> dict:
    """What an index's build spent against its stated budget (``params.budget``)."""
    from crossknn.corpus_folder import open_index

    idx = open_index(index_dir)
    b = idx.params["budget"]
    limit = int(b["index_calls"]) + sum(int(v) for v in b.get("extra", {}).values())
    return {
        "index_calls": int(b["index_calls"]),
        "rule": b["rule"],
        "spent": b["spent"],
        "ce_calls": int(idx.ce_calls),
        "within": int(idx.ce_calls) <= limit,
        "rows": int((idx.params.get("auto") or {}).get("rows", 0)),
        "partial_rows": int((idx.params.get("auto") or {}).get("partial_rows", 0)),
    }


def part_final(args, res: dict) -> None:
    """All items of each corpus, its test queries: the default build against today's keyword rows
    and the rows of the train queries at the same budget, and RNR."""
    import crossknn.ce
    from crossknn.index.auto import default_index_rows

    de = DiskDE(crossknn.ce.default_dual_encoder(show_progress_bar=False), args.work / "de")
    fin = res.setdefault("corpora", {})
    for name in args.corpora:
        setup = Setup(name, 0, args.seed, args.work)
        if name == "scifact" and setup.matrix is None:
            _scifact_matrix(args.work)
            setup = Setup(name, 0, args.seed, args.work)
        m = default_index_rows(setup.n)
        C = m * setup.n
        queries = setup.test
        print(f"{name}: {setup.n} items, {m} rows (C = {C:,}), {len(queries)} test queries")
        exact = exact_top_ids(setup, setup.S[setup.test_rows])
        root = args.work / "final" / name
        row = fin.setdefault(name, {})
        row.update(
            {
                "items": setup.n,
                "test_queries": len(queries),
                "train_queries": len(setup.train),
                "rows": m,
                "index_calls": C,
                "k": K,
            }
        )
        recall = row.setdefault("recall", {})
        budgets = row.setdefault("budget", {})
        kinds = {
            # today's default build: keyword pseudo-queries (max(16, m), filled up with
            # first-words queries), m medoid rows of them
            "keywords": {"train_queries": gen_keywords(setup.corpus, max(16, m), args.seed)},
            "default": {},  # crossknn build, no flag
            "real_rows": {"train_queries": setup.train},  # crossknn build --train-queries
            # crossknn build --example-queries FILE (a handful of train queries)
            "examples": {"example_queries": example_queries(setup, args.seed)},
        }
        if "lengths+pool/nolp" in args.final_trials:  # a choose candidate on all items
            lengths = [len(q.split()) for q in example_queries(setup, args.seed)]
            qs = gen_lengths(setup.corpus, 4 * m, args.seed, lengths)
            kinds["examples/lengths"] = {"train_queries": qs, "auto_options": NOLP}
        for cand in args.final_trials:  # other choose candidates on all items, under their names
            if cand in CANDIDATES and CANDIDATES[cand][0] is not gen_lengths:
                gen, pool, opts = CANDIDATES[cand]
                kinds[cand] = {"train_queries": gen(setup.corpus, pool(m), args.seed)}
                kinds[cand]["auto_options"] = opts
        if "real/rows-only" in args.final_trials:  # the real build's row queries, nothing more
            done = root / "real_rows" / "index.json"
            if not done.is_file():
                raise SystemExit("real/rows-only needs the real_rows build first")
            rows = json.loads(done.read_text())["params"]["auto"]["row_queries"]
            kinds["real/rows-only"] = {"train_queries": rows}
        if "real/nolp" in args.final_trials:  # every train query, no partial rows
            kinds["real/nolp"] = {"train_queries": setup.train, "auto_options": NOLP}
        for kind, kw in kinds.items():
            if kind in recall and not args.again:
                continue
            t = time.perf_counter()
            calls = C if "train_queries" in kw else "default"
            d = build(setup, de, root / kind.replace("/", "-"), index_calls=calls, **kw)
            budgets[kind] = _budget_row(d)
            recall[kind] = recall_of(d, setup, de, queries, exact)
            print(f"  {kind:<10} {recall[kind]}  ({time.perf_counter() - t:.0f} s)")
            write_json(args.out, res)
        if "rnr" not in recall or args.again:
            recall["rnr"] = rnr_recall(setup, de, queries, exact)
            print(f"  {'rnr':<10} {recall['rnr']}")
        # CE pairs scored for this corpus (not looked up in a matrix or the cache), over reruns
        row["real_ce_pairs"] = int(row.get("real_ce_pairs", 0)) + int(setup.ce().real_pairs)
        write_json(args.out, res)


def _scifact_matrix(work: Path) -> None:
    """SciFact's exact CE scores of its 300 test queries x 5,183 items, computed once by the
    project's resumable score-matrix job (rerun to resume)."""
    from crossknn.jobs import JobOptions
    from crossknn.score_matrix_job import build_score_matrix

    print("scifact: exact scores of the test queries (resumable; several hours on 2 cores)")
    build_score_matrix(
        DATA / "scifact", work / "scifact-test", split="test", n_test=150, options=JobOptions()
    )


def _busy(n: int) -> list:
    """``n`` processes that keep a CPU core busy each (at this process's niceness)."""
    import subprocess

    code = "while True: pass"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]


def part_repro(args, res: dict) -> None:
    """Two default builds of one corpus with the real CE and DE (nothing cached), the second
    beside ``--load`` busy processes: every array and index.json compared byte for byte."""
    import crossknn.ce
    from crossknn.corpus.build import build_corpus_index

    setup = Setup("cisi", args.repro_items, args.seed, args.work)
    root = args.work / "repro"
    shutil.rmtree(root, ignore_errors=True)
    runs = []
    for j, load in enumerate((0, args.load)):
        ce = crossknn.ce.default_cross_encoder()
        de = crossknn.ce.default_dual_encoder(show_progress_bar=False)
        procs = _busy(load)
        t = time.perf_counter()
        try:
            build_corpus_index(setup.corpus, root / f"build{j}", ce=ce, de=de, progress=False)
        finally:
            for p in procs:
                p.kill()
                p.wait()
        took = time.perf_counter() - t
        b = _budget_row(root / f"build{j}")
        runs.append({"busy_processes": load, "seconds": round(took, 1), **b})
        runs[-1]["pairs_per_s"] = round(b["ce_calls"] / took, 1)
        print(f"  build {j + 1} ({load} busy processes): {took:.0f} s, {b['ce_calls']:,} CE calls")
    files = [sorted(p.name for p in (root / f"build{j}").iterdir() if p.is_file()) for j in (0, 1)]
    same = files[0] == files[1]
    differ = []
    for name in files[0]:
        a, b = (root / "build0" / name).read_bytes(), (root / "build1" / name).read_bytes()
        if a != b:
            differ.append(name)
    res["repro"] = {
        "corpus": f"cisi, {setup.n} items" + ("" if setup.full else f" (seed {args.seed})"),
        "builds": runs,
        "files": files[0],
        "differ": differ,
        "bitwise_equal": same and not differ,
    }
    print(f"  bitwise equal: {res['repro']['bitwise_equal']} (differ: {differ or 'none'})")


def goals(res: dict) -> dict:
    g = {
        "gap_closed_min": None,
        "worst_vs_keywords": None,
        "reproducible": None,
        "calibration_in_budget": None,
    }
    fin = res.get("corpora") or {}
    done = [
        n
        for n in CORPORA
        if {"keywords", "default", "real_rows"} <= set(fin.get(n, {}).get("recall", {}))
    ]
    if len(done) == len(CORPORA):
        gaps, worst = [], []
        for n in CORPORA:
            r = fin[n]["recall"]
            kw, new, real = (_at(r[x], 100) for x in ("keywords", "default", "real_rows"))
            gaps.append((new - kw) / (real - kw) if real > kw else float("inf"))
            worst += [_at(r["default"], b) - _at(r["keywords"], b) for b in BUDGETS]
        g["gap_closed_min"] = round(min(gaps), 4)
        g["worst_vs_keywords"] = round(min(worst), 4)
    if "repro" in res:
        g["reproducible"] = bool(res["repro"]["bitwise_equal"])
    rows = [b for n in fin.values() for b in n.get("budget", {}).values()]
    rows += list((res.get("repro") or {}).get("builds", []))
    if rows:
        g["calibration_in_budget"] = all(b["within"] for b in rows)
    return g


def final_summary(res: dict) -> dict:
    """Per corpus measured by ``final`` and per new kind (the default build, --example-queries):
    the gap to real rows it closes at B = 100 and its worst change against keyword rows at
    B = 50, 100 and 200 (the goals' formulas, before all three corpora are in)."""
    out = {}
    for n, row in (res.get("corpora") or {}).items():
        r = row.get("recall", {})
        if not {"keywords", "real_rows"} <= set(r):
            continue
        kw, real = _at(r["keywords"], 100), _at(r["real_rows"], 100)
        for kind in ("default", *sorted(k for k in r if k.startswith("examples"))):
            if kind in r:
                new = _at(r[kind], 100)
                out.setdefault(n, {})[kind] = {
                    "gap_closed_at_100": round((new - kw) / (real - kw), 4) if real > kw else None,
                    "worst_vs_keywords": round(
                        min(_at(r[kind], b) - _at(r["keywords"], b) for b in BUDGETS), 4
                    ),
                }
    return out


def _at(rec: dict, b: int) -> float:
    return float(rec[str(b)] if str(b) in rec else rec[b])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("choose", "final", "repro", "goals"), required=True)
    ap.add_argument("--corpora", nargs="+", choices=CORPORA, default=list(CORPORA))
    ap.add_argument("--candidates", nargs="+", choices=list(CANDIDATES), default=list(CANDIDATES))
    ap.add_argument(
        "--final-trials",
        nargs="*",
        choices=[*CANDIDATES, "real/rows-only", "real/nolp"],
        default=[],
        help="final: choose candidates also built on all items (trials)",
    )
    ap.add_argument("--items", type=int, default=800, help="choose: a seeded subset (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--again", action="store_true", help="measure again what the JSON has")
    ap.add_argument("--load", type=int, default=4, help="repro: busy processes beside build 2")
    ap.add_argument("--repro-items", type=int, default=0, help="repro: CISI items (0: all)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--work", type=Path, default=WORK, help="caches and indexes (resumable)")
    args = ap.parse_args(argv)
    missing = [n for n in args.corpora if not (DATA / n).is_dir()]
    if missing:
        print(f"skipped: {', '.join(str(DATA / n) for n in missing)} missing")
        return 0
    res = json.loads(args.out.read_text()) if args.out.exists() else {}
    res.pop("provenance", None)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.part == "choose":
        part_choose(args, res)
    elif args.part == "final":
        part_final(args, res)
    elif args.part == "repro":
        part_repro(args, res)
    res["goals"] = goals(res)
    res["final_summary"] = final_summary(res)
    print(json.dumps(res["goals"], indent=1))
    write_json(args.out, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
