"""Model selection on the dev queries (carved from the train queries): rerank each dev query's DE
top-N with the CE being trained and measure nDCG@10 and RR@10 (ir_measures) against the qrels."""

from __future__ import annotations

import numpy as np
import torch
from tqdm.auto import tqdm

from crossknn.trec import parse_measures, run_metrics

__all__ = ["split_dev", "rerank_metrics", "de_order_metrics"]


def split_dev(n: int, fraction: float, seed: int, cap: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, dev rows): a seeded random ``fraction`` of the rows (at most ``cap``) as dev."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"dev fraction must be in [0, 1); got {fraction}")
    perm = np.random.default_rng([seed, 7]).permutation(n)
    n_dev = int(round(fraction * n))
    if cap is not None:
        n_dev = min(n_dev, cap)
    if fraction > 0 and n - n_dev < 1:
        raise ValueError(f"a dev fraction of {fraction} leaves no training query of {n}")
    return np.sort(perm[n_dev:]), np.sort(perm[:n_dev])


def rerank_metrics(qrels: dict, run: dict) -> dict[str, float]:
    """nDCG@10 and RR@10 of ``run`` ({qid: {docid: score}}) against ``qrels``
    (:func:`crossknn.trec.run_metrics`: equal scores in trec_eval's order)."""
    m = run_metrics(run, qrels, parse_measures("nDCG@10 RR@10"))
    return {"ndcg@10": m["nDCG@10"], "rr@10": m["RR@10"]}


def _run_and_qrels(candidates: np.ndarray, scores: np.ndarray, relevance) -> tuple[dict, dict]:
    run, qrels = {}, {}
    for r in range(candidates.shape[0]):
        qid = str(r)
        run[qid] = {str(int(i)): float(s) for i, s in zip(candidates[r], scores[r], strict=True)}
        qrels[qid] = {str(i): int(v) for i, v in relevance[r].items()}
    return run, qrels


def de_order_metrics(candidates: np.ndarray, relevance) -> dict[str, float]:
    """nDCG@10 and RR@10 of the dev candidates in the DE's order (best first, as mined)."""
    ranks = np.broadcast_to(-np.arange(candidates.shape[1], dtype=np.float64), candidates.shape)
    run, qrels = _run_and_qrels(candidates, ranks, relevance)
    return rerank_metrics(qrels, run)


@torch.no_grad()
def dev_metrics(
    model,
    enc,
    rows,
    relevance,
    candidates,
    device,
    max_tokens: int,
    *,
    progress: bool = False,
    desc: str = "dev",
) -> dict:
    """Rerank ``candidates`` (dev queries x N item indices) with ``model`` (in eval mode);
    ``rows`` are the dev queries' indices in ``enc``, ``relevance`` their qrels. ``progress``:
    a bar by pairs (rate, ETA). The pairs go through the same length-sorted chunks as
    ``enc.score``, so the scores are the same bits with or without the bar."""
    was_training = model.training
    model.eval()
    qi = np.repeat(np.asarray(rows, np.int64), candidates.shape[1])
    ii = candidates.ravel()
    parts, where = [], []
    with tqdm(total=len(qi), desc=desc, unit="pair", disable=not progress, leave=False) as bar:
        for idx in enc.chunks(qi, ii, max_tokens):
            parts.append(model(enc.feeds(qi[idx], ii[idx], device)))
            where.append(idx)
            bar.update(len(idx))
    order = np.argsort(np.concatenate(where)) if where else np.zeros(0, np.int64)
    if parts:
        cat = torch.cat(parts)
        scores = cat[torch.from_numpy(order).to(cat.device)]
    else:
        scores = torch.zeros(0)
    scores = scores.float().cpu().numpy()
    model.train(was_training)
    run, qrels = _run_and_qrels(candidates, scores.reshape(candidates.shape), relevance)
    return rerank_metrics(qrels, run)
