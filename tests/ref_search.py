"""Independent numpy reference implementations of the search methods (for the tests only).

Written straight from the papers' algorithms with plain numpy (argsort, lstsq, solve), one query
at a time, without the engine or the round loop of ``crossknn.search``. Random choices are inputs
(the first round's items, the anchors), so the references are deterministic.
"""

from __future__ import annotations

import numpy as np


def topk(values, k, exclude=()):
    """Indices of the k largest values, best first, ties to the lower index, skipping exclude."""
    v = np.asarray(values, np.float64).copy()
    v[list(exclude)] = -np.inf
    return np.lexsort((np.arange(v.size), -v))[:k]


def final_topk(items, ce_row, k):
    items = np.asarray(items)
    s = ce_row[items]
    order = np.lexsort((items, -s))[:k]
    return items[order]


def lstsq(X, a, ridge):
    """ridge > 0: (XᵀX + ridge I)⁻¹ Xᵀ a; ridge = 0: the min-norm solution pinv(X) a."""
    X = np.asarray(X, np.float64)
    a = np.asarray(a, np.float64)
    if ridge > 0:
        return np.linalg.solve(X.T @ X + ridge * np.eye(X.shape[1]), X.T @ a)
    return np.linalg.lstsq(X, a, rcond=None)[0]


def sizes(n, parts):
    parts = min(parts, n)
    return [n // parts + (1 if r < n % parts else 0) for r in range(parts)]


def rnr(ce_row, first_ranked, budget, k):
    return final_topk(first_ranked[:budget], ce_row, k)


def anncur(ce_row, R, anchors, budget, k, ridge, final="all"):
    """ANNCUR with fixed anchors: E = (CᵀC + ridge I)⁻¹ Cᵀ R, approx = e_q E, retrieve, rerank."""
    R = np.asarray(R, np.float64)
    C = R[:, anchors]
    E = np.linalg.solve(C.T @ C + ridge * np.eye(C.shape[1]), C.T @ R)
    approx = ce_row[anchors].astype(np.float64) @ E
    retrieved = topk(approx, budget - len(anchors), exclude=anchors)
    if final == "retrieved":  # the top approximate items: new ones plus anchors ranked among them
        cand = np.concatenate([retrieved, anchors[approx[anchors] >= approx[retrieved].min()]])
    else:
        cand = np.concatenate([anchors, retrieved])
    return final_topk(cand, ce_row, k)


def rounds_search(
    ce_row,
    V,
    first_items,
    budget,
    k,
    rounds,
    *,
    split=None,
    ridge=0.0,
    prior=None,
    mix=0.0,
    affine=None,
    final="all",
):
    """ADACUR (V = Rᵀ) / AXN (V = item embeddings) with TopK rounds, Split or No-Split."""
    V = np.asarray(V, np.float64)
    n_round = budget if split is None else int(min(budget, max(1, round(split * budget))))
    sz = sizes(n_round, rounds)
    assert len(first_items) == sz[0]
    A = list(first_items)

    def target(items):
        a = ce_row[items].astype(np.float64)
        return a if affine is None else (a - affine[1]) / affine[0]

    def embed():
        u = lstsq(V[A], target(A), ridge)
        return u if prior is None else (1 - mix) * u + mix * prior

    for n in sz[1:]:
        A += topk(V @ embed(), n, exclude=A).tolist()
    if split is None or budget == n_round:
        return final_topk(A, ce_row, k)
    approx = V @ embed()
    retrieved = topk(approx, budget - n_round, exclude=A)
    if final == "retrieved":
        floor = approx[retrieved].min()
        anchors = np.array(A)
        cand = np.concatenate([retrieved, anchors[approx[anchors] >= floor]])
    else:
        cand = np.concatenate([A, retrieved])
    return final_topk(cand, ce_row, k)


def recall(ce_row, returned, k):
    exact = topk(ce_row, k)
    return len(set(exact.tolist()) & set(np.asarray(returned)[:k].tolist())) / k
