"""Fidelity of a quantized cross-encoder to its fp32 graph, on calibration pairs that matter.

A calibration set is built from real texts: each calibration query is scored in fp32 against a
pool of items, and its pairs are the query's fp32 top ``n_top`` items (the candidates a search
spends its budget on, whose scores lie in a narrow band) plus ``n_random`` other pool items. The
same pairs feed the sensitivity pass and the static calibration of :mod:`crossknn.ce.quantize`
and the fidelity record written into the manifest:

- ``top10_agreement``: mean over queries of |fp32 top-10 ∩ quantized top-10| / 10 among the
  query's calibration pairs;
- ``spearman_top``: mean per-query Spearman correlation on the fp32 top candidates only;
- ``max_abs_diff``: the largest |quantized - fp32| score difference over all pairs;
- ``top_rms``: root mean square of the per-query *centered* deviation on the top candidates (a
  shift common to a query's pairs does not reorder them; what is left does).

Everything runs on plain ONNX Runtime sessions over token-id feeds (no manifest needed), so the
export can check a graph before it writes the manifest.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from crossknn.ce.manifest import read_manifest
from crossknn.ce.model_base import length_batches
from crossknn.ce.spinning import set_spinning
from crossknn.ce.tokenize import IdStore, TokenizerPlan, assemble_pairs, longest_first
from crossknn.demo_corpus import stdlib_docstrings

__all__ = [
    "Calibration",
    "build_calibration",
    "compare",
    "default_calibration_texts",
    "fidelity_record",
    "pair_feeds",
    "score_feeds",
]

_BATCH = 16


@dataclass
class Calibration:
    """Calibration pairs as model feeds: ``feeds[b]`` holds the pairs ``order[b]``.

    ``query`` is the calibration query of each pair, ``top`` marks the pairs among their
    query's fp32 top candidates, ``fp32`` the fp32 scores (pair order).
    """

    feeds: list[dict[str, np.ndarray]]
    order: list[np.ndarray]
    query: np.ndarray
    top: np.ndarray
    fp32: np.ndarray
    info: dict[str, Any] = field(default_factory=dict)
    pad_id: int = 0

    @property
    def n_pairs(self) -> int:
        return len(self.query)


def pair_feeds(
    tokenizer: str | os.PathLike,
    queries: list[str],
    items: list[str],
    qi: np.ndarray,
    ii: np.ndarray,
    *,
    max_length: int,
    batch_size: int = _BATCH,
) -> tuple[list[dict[str, np.ndarray]], list[np.ndarray]]:
    """Feeds of the pairs (queries[qi[r]], items[ii[r]]), assembled as the runtime does.

    Length-sorted batches of at most ``batch_size`` pairs, each padded to its longest pair;
    returns the feeds and the pair positions of each batch.
    """
    plan = TokenizerPlan(Path(tokenizer))
    tpl = plan.pair
    room = int(max_length) - tpl.n_special
    A = IdStore(plan.encode(list(queries)), room)
    B = IdStore(plan.encode(list(items)), room)
    qi = np.asarray(qi, dtype=np.int64)
    ii = np.asarray(ii, dtype=np.int64)
    ta, tb = longest_first(A.lengths[qi], B.lengths[ii], room)
    order = length_batches(ta + tb + tpl.n_special, batch_size, batch_size * int(max_length))
    feeds = [assemble_pairs(tpl, plan.pad_id, A, qi[b], ta[b], B, ii[b], tb[b]) for b in order]
    return feeds, order


def score_feeds(onnx_path: str | os.PathLike, feeds, order, *, threads: int | None = None):
    """First output of the graph (column 0 for a 2-D output) per pair, in pair order."""
    # onnxruntime: loaded only where a model runs (CPU or GPU wheel)
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = int(threads or 0)
    so.log_severity_level = 3
    set_spinning(so)
    sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    n = sum(len(b) for b in order)
    out = np.empty(n, dtype=np.float64)
    for f, b in zip(feeds, order, strict=True):
        res = sess.run(None, {k: v for k, v in f.items() if k in names})[0]
        out[b] = res[:, 0] if res.ndim == 2 else res
    return out


def default_calibration_texts(n_queries: int = 8, n_items: int = 64) -> tuple[list, list]:
    """Real texts every machine has: standard-library docstrings (:mod:`crossknn.demo_corpus`).

    Queries are the first sentences of ``n_queries`` docstrings; the pool is ``n_items`` other
    docstrings (evenly spaced by id, deterministic).
    """
    corpus = stdlib_docstrings(max_items=n_items + n_queries)
    texts = list(corpus.texts)
    step = max(1, len(texts) // n_queries)
    qpos = set(range(0, step * n_queries, step))
    queries = [texts[i].split(". ")[0] for i in sorted(qpos)]
    items = [t for i, t in enumerate(texts) if i not in qpos]
    return queries, items


def build_calibration(
    fp32_onnx: str | os.PathLike,
    tokenizer: str | os.PathLike,
    queries: list[str],
    items: list[str],
    *,
    max_length: int,
    n_top: int = 12,
    n_random: int = 4,
    seed: int = 0,
    threads: int | None = None,
) -> Calibration:
    """Score every query against every pool item in fp32; keep each query's top and some random."""
    queries, items = list(queries), list(items)
    if not queries or len(items) < 2:
        raise ValueError(
            f"a calibration set needs at least 1 query and 2 items; got {len(queries)} queries "
            f"and {len(items)} items"
        )
    nq, ni = len(queries), len(items)
    qi = np.repeat(np.arange(nq), ni)
    ii = np.tile(np.arange(ni), nq)
    feeds, order = pair_feeds(tokenizer, queries, items, qi, ii, max_length=max_length)
    full = score_feeds(fp32_onnx, feeds, order, threads=threads).reshape(nq, ni)
    rng = np.random.default_rng(seed)
    n_top = min(n_top, ni)
    sel_q, sel_i, sel_top = [], [], []
    for q in range(nq):
        ranked = np.argsort(-full[q], kind="stable")
        rest = ranked[n_top:]
        extra = rng.choice(rest, min(n_random, len(rest)), replace=False) if len(rest) else rest
        chosen = np.concatenate([ranked[:n_top], extra])
        sel_q.append(np.full(len(chosen), q))
        sel_i.append(chosen)
        sel_top.append(np.arange(len(chosen)) < n_top)
    qsel, isel = np.concatenate(sel_q), np.concatenate(sel_i)
    feeds, order = pair_feeds(tokenizer, queries, items, qsel, isel, max_length=max_length)
    is_top = np.concatenate(sel_top)
    return Calibration(
        feeds=feeds,
        order=order,
        query=qsel,
        top=is_top,
        fp32=full[qsel, isel],
        pad_id=_pad_id(tokenizer),
        info={
            "queries": nq,
            "pool_items": ni,
            "pairs": len(qsel),
            "top_per_query": n_top,
            "random_per_query": min(n_random, ni - n_top),
            "max_length": int(max_length),
            "seed": int(seed),
        },
    )


def _pad_id(tokenizer) -> int:
    return TokenizerPlan(Path(tokenizer)).pad_id


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    # scipy: slow to import, only this function needs it
    from scipy.stats import spearmanr

    if len(a) < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(spearmanr(a, b).statistic)


def compare(
    ref: np.ndarray, got: np.ndarray, query: np.ndarray, top: np.ndarray, *, k: int = 10
) -> dict[str, float]:
    """The fidelity record of ``got`` against ``ref`` (see the module docstring)."""
    ref = np.asarray(ref, dtype=np.float64)
    got = np.asarray(got, dtype=np.float64)
    agree, rho, dev = [], [], []
    for q in np.unique(query):
        m = query == q
        r, g = ref[m], got[m]
        kk = min(k, len(r))
        agree.append(
            len(set(np.argsort(-r, kind="stable")[:kk]) & set(np.argsort(-g, kind="stable")[:kk]))
            / kk
        )
        t = top[m]
        rho.append(_spearman(r[t], g[t]))
        d = g[t] - r[t]
        dev.append(d - d.mean())
    return {
        "top10_agreement": float(np.mean(agree)),
        "spearman_top": float(np.nanmean(rho)) if not np.all(np.isnan(rho)) else float("nan"),
        "max_abs_diff": float(np.max(np.abs(got - ref))),
        "top_rms": float(np.sqrt(np.mean(np.concatenate(dev) ** 2))),
    }


def fidelity_record(model_dir: str | os.PathLike, precision: str = "int8") -> dict[str, Any]:
    """What the export recorded for a quantized variant: its recipe, the fp32 groups or
    calibration method, and its ``fidelity`` on the calibration set (see :func:`compare`).

    ValueError if the directory has no such variant or no record (exported before recipes).
    """
    manifest = read_manifest(model_dir)
    record = (manifest.get("quantization") or {}).get(precision)
    if record is None:
        have = sorted(manifest.get("quantization") or {})
        raise ValueError(
            f"{model_dir}: no quantization record for precision {precision!r} (recorded: {have}); "
            "export it with quantize=... to get one"
        )
    return record
