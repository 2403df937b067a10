"""Recall-vs-cost harness: search methods on a score-matrix folder, Top-k-Recall@B tables, curves.

Top-k-Recall@B (``shared/BENCHMARKS.md``): for a test row, the fraction of the exact top-k items
(by ``scores.npy``) found in the final top-k returned after at most B CE calls; the mean over the
test rows is reported. Anchor/train rows are the ``train`` rows of ``splits.json``; only ``test``
rows are searched. Free parameters (the ANNCUR/ADACUR anchor/retrieve split, the SoftMax
temperature) are chosen per (B, k) on a dev part of the train rows (``crossknn.search.tuning``).
"""

from __future__ import annotations

import errno
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from crossknn.cmc.data import matrix_encoder_id
from crossknn.data import load_beir
from crossknn.fileio import atomic_write_bytes
from crossknn.matrix import ScoreMatrix, load_score_matrix
from crossknn.retrievers import make_retriever
from crossknn.score_map import ScoreMap
from crossknn.scorers import MatrixScorer
from crossknn.search import CurIndex, choose_on_dev, registry
from crossknn.search.auto import IndexCallBudget, build_auto_index
from crossknn.search.methods import DEFAULT_MIX
from crossknn.topk import topk_recall

#: every method eval runs (crossknn.search.registry)
METHODS = registry.names()

__all__ = [
    "METHODS",
    "SPLIT_GRID",
    "EvalConfig",
    "evaluate",
    "format_table",
    "plot_curves",
    "write_json",
]

FIRSTS = ("random", "de", "tfidf", "bm25", "cmc")
SPLIT_GRID = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
# SoftMax temperatures, in units of a query's CE score spread (CurIndex.score_scale)
TEMPERATURE_GRID = (1.0, 0.3, 0.1, 0.03)
GRIDS = {"split": SPLIT_GRID, "temperature": TEMPERATURE_GRID}


@dataclass
class EvalConfig:
    methods: Sequence[str]
    budgets: Sequence[int]
    ks: Sequence[int]
    rounds: Sequence[int] = (5,)
    # auto's rounds (None: its own choice, the index's rounds; see crossknn.search.round_plan)
    auto_rounds: Sequence[int] | None = None
    firsts: Sequence[str] = ("random",)
    seed: int = 0
    split: float | None = None  # None: choose on dev per (B, k); else fixed fraction
    final: str = "all"  # 'retrieved' reproduces the papers' split variants
    temperature: float | None = None  # None: choose on dev per (B, k)
    ridge: float | None = None  # None: the methods' defaults
    mix: float = DEFAULT_MIX
    axn_normalize: bool = True
    item_vectors: np.ndarray | None = None  # AXN item vectors (default: de_items.npy)
    query_vectors: np.ndarray | None = None  # AXN prior query embeddings (default: de_queries)
    score_map: ScoreMap | None = None  # AXN's CE score map; None: fit on train rows
    corpus: str | Path | None = None
    dev_fraction: float = 0.2
    index_calls: int | None = None  # auto's train CE entries; None: 10% of |train| x N
    axn_index_calls: int | None = None  # entries read by a given AXN index (e.g. sparse MF)
    extra: dict = field(default_factory=dict)


class _Context:
    """Lazily built resources shared by the runs: scorer, retrievers, CUR indexes."""

    def __init__(self, matrix: ScoreMatrix, cfg: EvalConfig) -> None:
        self.m, self.cfg = matrix, cfg
        self.scorer = MatrixScorer(matrix.scores)
        self._retrievers: dict[str, object] = {}
        self._indexes: dict[tuple, CurIndex] = {}
        self._texts: tuple[list[str], list[str]] | None = None
        self._auto = None

    def auto_index(self):
        """``auto``'s index, built once from at most C train entries through a counting scorer
        over the train rows only (it refuses test rows and entry C + 1)."""
        if self._auto is None:
            m = self.m
            if m.de_items is None or m.de_queries is None:
                raise FileNotFoundError(f"{m.path} has no de_items.npy/de_queries.npy")
            reader = IndexCallBudget(self.scorer, m.train.tolist(), auto_index_calls(self.cfg, m))
            self._auto = build_auto_index(
                reader,
                m.train.tolist(),
                m.de_items,
                m.de_queries[m.train],
                index_calls=reader.limit,
                seed=self.cfg.seed,
            )
        return self._auto

    def index_ce_calls(self, name: str) -> int:
        """Train CE entries read to build ``name``'s index (0 when it reads none)."""
        m, cfg = self.m, self.cfg
        kind = registry.get(name).index
        if kind == "auto":
            return int(self.auto_index().index_calls)
        if kind == "none":
            return 0
        if kind == "vectors" and cfg.axn_index_calls is not None:
            return int(cfg.axn_index_calls)
        if kind == "vectors":  # the CE->DE score map is fitted on every train row
            fitted = cfg.score_map is None and cfg.axn_normalize and m.de_queries is not None
            return int(m.train.size * m.n_items) if fitted else 0
        return int(m.train.size * m.n_items)  # dense CUR index of every train row

    def texts(self):
        if self._texts is None:
            corpus = load_beir(self.m.corpus_dir(self.cfg.corpus))
            self._texts = (
                corpus.items_in_order(self.m.item_ids),
                corpus.queries_in_order(self.m.query_ids),
            )
        return self._texts

    def first(self, name: str):
        if name == "random":
            return "random"
        if name not in self._retrievers:
            if name == "de":
                if self.m.de_items is None or self.m.de_queries is None:
                    raise FileNotFoundError(f"{self.m.path} has no de_items.npy/de_queries.npy")
                self._retrievers[name] = make_retriever(
                    "de", item_vectors=self.m.de_items, query_vectors=self.m.de_queries
                )
            elif name == "cmc":  # BE -> CMC; cfg.extra: cmc_model (dir), cmc_candidates (K)
                if self.m.de_items is None or self.m.de_queries is None:
                    raise FileNotFoundError(f"{self.m.path} has no de_items.npy/de_queries.npy")
                self._retrievers[name] = make_retriever(
                    "cmc",
                    item_vectors=self.m.de_items,
                    query_vectors=self.m.de_queries,
                    encoder_id=matrix_encoder_id(self.m.meta),
                    **self.cfg.extra,
                )
            else:
                items, queries = self.texts()
                self._retrievers[name] = make_retriever(name, item_texts=items, query_texts=queries)
        return self._retrievers[name]

    def index(self, rows) -> CurIndex:
        key = tuple(np.asarray(rows).tolist())
        if key not in self._indexes:
            self._indexes[key] = CurIndex.from_matrix(self.m.scores, rows, test_rows=self.m.test)
        return self._indexes[key]

    def vectors(self):
        """(item vectors, prior query vectors, CE score map) of ``vectors`` methods (AXN)."""
        cfg = self.cfg
        V = self.m.de_items if cfg.item_vectors is None else cfg.item_vectors
        if V is None:
            raise FileNotFoundError(f"{self.m.path} has no de_items.npy; pass item vectors")
        P = cfg.query_vectors  # query embeddings in V's space (the λ prior)
        if P is None and self.m.de_queries is not None:
            if V.shape[1] == self.m.de_queries.shape[1]:
                P = self.m.de_queries
        smap = cfg.score_map
        if smap is None and cfg.axn_normalize and P is not None:
            tr = self.m.train  # fit CE ~ scale * <p_q, v_i> + offset on the train rows only
            smap = ScoreMap.fit(self.m.scores[tr], P[tr] @ V.T)
        return V, P, smap

    def make(self, name: str, *, first: str, rounds: int, rows, split=None, temperature=None):
        cfg = self.cfg
        spec = registry.get(name)
        res = registry.Resources(
            first=self.first(spec.first or first),
            rounds=rounds,
            split=split,
            temperature=temperature,
            ridge=cfg.ridge,
            final=cfg.final,
            anchor_seed=cfg.seed,
            n_items=self.m.n_items,
        )
        if spec.index == "auto":
            res.auto_index, res.prior = self.auto_index(), self.m.de_queries
        elif spec.index == "vectors":
            res.item_vectors, res.prior, res.score_map = self.vectors()
            res.mix = cfg.mix
        elif spec.index == "cur":
            res.cur = self.index(rows)
        if (
            spec.name == "gar"
        ):  # its corpus graph from the DE item vectors, whatever the first stage
            res.item_vectors = self.m.de_items
        return spec.build(res)


def _tasks(cfg: EvalConfig, n_items: int):
    for name in cfg.methods:
        spec = registry.get(name)
        # a method with its own first stage (auto: the DE's top items, part of the method as in
        # its CV): --first does not apply to it
        for first in (spec.first,) if spec.first else cfg.firsts:
            if spec.index == "auto":
                grid = cfg.auto_rounds or (None,)
            else:
                grid = cfg.rounds if spec.rounds else (1,)
            for rounds in grid:
                for budget in cfg.budgets:
                    yield name, first, rounds, budget


def auto_index_calls(cfg: EvalConfig, m: ScoreMatrix) -> int:
    """C for ``auto``: ``cfg.index_calls``, or 10% of the dense index (|train| x N)."""
    if cfg.index_calls is None:
        return int(0.1 * m.train.size * m.n_items)
    return int(cfg.index_calls)


def _check_config(cfg: EvalConfig, m: ScoreMatrix) -> None:
    if not cfg.methods or not cfg.budgets or not cfg.ks:
        raise ValueError("give at least one --method, one --budget and one --k")
    for f in cfg.firsts:
        if f not in FIRSTS:
            raise ValueError(f"--first must be one of {FIRSTS}; got {f!r}")
    for b in cfg.budgets:
        if not 1 <= b <= m.n_items:
            raise ValueError(f"budget B={b} must be in [1, {m.n_items}] (the number of items)")
    for k in cfg.ks:
        if not 1 <= k <= m.n_items:
            raise ValueError(f"k must be in [1, {m.n_items}] (the number of items); got {k}")
    if min(cfg.ks) > max(cfg.budgets):
        raise ValueError(
            f"nothing to evaluate: every k ({', '.join(map(str, cfg.ks))}) exceeds every budget "
            f"B ({', '.join(map(str, cfg.budgets))}); Top-k-Recall@B needs k <= B"
        )
    for r in (*cfg.rounds, *(cfg.auto_rounds or ())):
        if r < 1:
            raise ValueError(f"rounds must be >= 1; got {r}")
    if not 0.0 <= cfg.mix <= 1.0:
        raise ValueError(f"mix (lambda) must be in [0, 1]; got {cfg.mix}")
    if cfg.split is not None and not 0.0 < cfg.split < 1.0:
        raise ValueError(f"split must be in (0, 1); got {cfg.split}")
    if cfg.temperature is not None and not cfg.temperature > 0:
        raise ValueError(f"temperature must be > 0; got {cfg.temperature}")
    if cfg.ridge is not None and not cfg.ridge >= 0:
        raise ValueError(f"ridge must be >= 0; got {cfg.ridge}")
    if m.test.size == 0:
        raise ValueError(f"{m.path}/splits.json has no test rows")
    if cfg.index_calls is not None and cfg.index_calls < 0:
        raise ValueError(f"--index-calls must be >= 0; got {cfg.index_calls}")
    check_matrix(m)


def check_matrix(m: ScoreMatrix, *, chunk: int = 1 << 22) -> None:
    """Refuse a score matrix the recall would silently be wrong on: a NaN or infinite score
    (anywhere: the ground truth is every row's exact top-k) or a repeated query or item id."""
    for what, ids in (("item_ids.json", m.item_ids), ("query_ids.json", m.query_ids)):
        if len(set(ids)) != len(ids):
            seen: set[str] = set()
            dup = next(i for i in ids if i in seen or seen.add(i))
            raise ValueError(f"{m.path}/{what}: duplicate id {dup!r}")
    flat = np.asarray(m.scores).reshape(-1)
    for lo in range(0, flat.size, chunk):
        block = flat[lo : lo + chunk]
        bad = np.flatnonzero(~np.isfinite(block))
        if bad.size:
            row, col = divmod(lo + int(bad[0]), m.n_items)
            n_bad = int((~np.isfinite(flat)).sum())
            raise ValueError(
                f"{m.path}/scores.npy: score [{row}, {col}] is {float(block[bad[0]])} "
                f"({n_bad} non-finite scores); every score must be a finite number"
            )


def evaluate(
    matrix: ScoreMatrix | str | Path, cfg: EvalConfig, *, progress: bool = True
) -> list[dict]:
    """Runs every (method, first, rounds, budget) and returns one row per k (k <= B)."""
    m = matrix if isinstance(matrix, ScoreMatrix) else load_score_matrix(matrix)
    _check_config(cfg, m)
    ctx = _Context(m, cfg)
    test = m.test.tolist()
    tasks = list(_tasks(cfg, m.n_items))
    rows: list[dict] = []
    bar = tqdm(tasks, desc="eval", unit="run", disable=not progress, leave=False)
    for name, first, rounds, budget in bar:
        bar.set_postfix_str(f"{name} first={first} R={rounds} B={budget}")
        ks = sorted(k for k in cfg.ks if k <= budget)
        if not ks:
            continue
        spec = registry.get(name)
        param = spec.dev_param
        fixed = {"split": cfg.split, "temperature": cfg.temperature}.get(param)
        groups: list[tuple[list[int], object, dict | None]] = []
        if param is not None and fixed is None:  # choose the parameter per k on dev rows
            for k in ks:
                best, table = choose_on_dev(
                    lambda v, idx_rows, name=name, first=first, rounds=rounds, param=param: (
                        ctx.make(name, first=first, rounds=rounds, rows=idx_rows, **{param: v})
                    ),
                    GRIDS[param],
                    m.scores,
                    m.train,
                    budget=budget,
                    k=k,
                    seed=cfg.seed,
                    dev_fraction=cfg.dev_fraction,
                )
                groups.append(([k], best, table))
        else:
            groups.append((ks, fixed, None))
        for group_ks, value, table in groups:
            kw = {param: value} if param is not None else {}
            method = ctx.make(name, first=first, rounds=rounds, rows=m.train, **kw)
            t0 = time.perf_counter()
            res = method.search(ctx.scorer, test, budget=budget, k=max(group_ks), seed=cfg.seed)
            secs = time.perf_counter() - t0
            calls_max = int(res.ce_calls.max())
            if calls_max > budget:  # the scorer wrapper makes this impossible; keep the check
                raise RuntimeError(f"{name} used {calls_max} CE calls with budget {budget}")
            for k in group_ks:
                row = {
                    "method": name,
                    "budget": budget,
                    "k": k,
                    "rounds": rounds
                    if spec.rounds and rounds is not None
                    else getattr(method, "rounds", 1),
                    "first": first,
                    "recall": float(topk_recall(m.scores, m.test, res.indices, k).mean()),
                    "n_test": len(test),
                    "ce_calls_max": calls_max,
                    "seconds": round(secs, 3),
                    "index_ce_calls": ctx.index_ce_calls(name),
                }
                if spec.index == "auto":
                    row["auto"] = ctx.auto_index().meta()
                if param is not None:
                    row[param] = value
                    if table is not None:
                        row["dev_recall"] = {str(v): round(r, 4) for v, r in table.items()}
                rows.append(row)
    return rows


def _label(row: dict) -> str:
    lab = row["method"]
    spec = registry.REGISTRY.get(row["method"])
    reranks = spec is not None and spec.index == "none"  # the first stage is the method's input
    if reranks or row["first"] != "random":
        lab += f" ({row['first']})"
    if spec is not None and spec.rounds:
        lab += f" R={row['rounds']}"
    return lab


def format_table(rows: list[dict]) -> str:
    """Recall table: one line per (method, first, rounds, budget), one column per k."""
    ks = sorted({r["k"] for r in rows})
    keyed: dict[tuple, dict[int, dict]] = {}
    for r in rows:
        keyed.setdefault((_label(r), r["budget"]), {})[r["k"]] = r
    width = max([len("method")] + [len(lab) for lab, _ in keyed])
    head = f"{'method':<{width}}  {'B':>4}  " + "  ".join(f"{'k=' + str(k):>6}" for k in ks)
    head += "  calls"
    lines = [head, "-" * len(head)]
    for (lab, b), byk in keyed.items():
        cells = "  ".join(f"{byk[k]['recall']:6.3f}" if k in byk else f"{'-':>6}" for k in ks)
        calls = max(r["ce_calls_max"] for r in byk.values())
        lines.append(f"{lab:<{width}}  {b:>4}  {cells}  {calls:>5}")
    return "\n".join(lines)


def write_json(rows: list[dict], path: str | Path, *, meta: dict | None = None) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir():
        raise IsADirectoryError(
            errno.EISDIR, "is a folder; give a file name for the JSON", str(path)
        )
    doc = {"rows": rows}
    if meta:
        doc["meta"] = meta
    atomic_write_bytes(path, (json.dumps(doc, indent=1) + "\n").encode("utf-8"))


def plot_curves(rows: list[dict], path: str | Path, *, title: str | None = None) -> None:
    """Top-k-Recall vs CE calls (B), one panel per k, one line per method (papers' style)."""
    # matplotlib: slow to import, only plots need it
    import matplotlib

    matplotlib.use("Agg")
    # matplotlib: slow to import, only plots need it
    import matplotlib.pyplot as plt

    ks = sorted({r["k"] for r in rows})
    if not ks:
        raise ValueError("no rows to plot")
    labels = list(dict.fromkeys(_label(r) for r in rows))
    ncols = len(ks) if len(ks) <= 3 else 2
    nrows = -(-len(ks) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.3 * nrows + 0.8), squeeze=False)
    flat = axes.ravel()
    for ax in flat[len(ks) :]:
        ax.set_visible(False)
    markers = "osD^v<>p*hX"
    for ax, k in zip(flat, ks, strict=False):
        for n, lab in enumerate(labels):
            pts = sorted(
                (r["budget"], r["recall"]) for r in rows if r["k"] == k and _label(r) == lab
            )
            if pts:
                x, y = zip(*pts, strict=True)
                ax.plot(x, y, marker=markers[n % len(markers)], ms=4, lw=1.4, label=lab)
        ax.set_title(f"Top-{k}-Recall")
        ax.set_xlabel("CE calls (B)")
        ax.set_xscale("log")
        budgets = sorted({r["budget"] for r in rows})
        ax.set_xticks(budgets)
        ax.set_xticklabels([str(b) for b in budgets])
        ax.minorticks_off()
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    for row in axes:
        row[0].set_ylabel("recall")
    handles, labs = flat[0].get_legend_handles_labels()
    legend_rows = -(-len(labs) // 3)
    fig.legend(handles, labs, loc="lower center", ncol=min(len(labs), 3), fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.035 * legend_rows / nrows + 0.02, 1, 1))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
