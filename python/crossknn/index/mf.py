"""The AXN paper's sparse CE matrix G and its factorization into item embeddings.

G holds CE scores for a few pairs: ``k_d`` items per train query (``per="query"``) or ``k_d``
train queries per item (``per="item"``), chosen as the top-``k_d`` by a cheap retriever (DE or
TF-IDF vectors) or uniformly at random. It costs ``len(G)`` CE calls.

The factorization minimizes the squared error on the observed entries,
``sum_(q,i) in G (u_q . v_i - G_qi)^2``, with AdamW in PyTorch:

- ``mode="transductive"``: U (train queries) and V (all items) are free parameters initialized
  from the DE vectors, trained with a row-sparse ("lazy") AdamW that updates only the rows in
  each batch (a step costs O(batch x d) however many items there are). Items with no entry in G
  keep their DE vector.
- ``mode="inductive"``: U = f_q(DE queries), V = f_i(DE items) with two separate 2-layer MLPs with
  the paper's gated skip connection on frozen DE vectors:
  ``h = b2 + W2 gelu(b1 + W1 x)``, ``out = s h + (1 - s) x``, ``s = sigmoid(w_skip)``, ``w_skip``
  initialized to -5 (so training starts at the DE). Embeds unseen queries and items too.

Optional score normalization (``normalize=True``): CE scores are mapped to the DE score range by
``beta * (s - alpha)`` with ``alpha``, ``beta`` matching the mean and standard deviation of the
DE scores on the same pairs of G. It is monotone, so it does not change any ranking; search must
apply the same map to the CE scores of a test query (recorded in the index).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "sample_g",
    "topk_by_vectors",
    "tfidf_vectors",
    "score_normalization",
    "MFResult",
    "fit_mf",
    "gated_mlp_numpy",
    "build_mf_index",
    "query_embeddings",
    "axn_score_affine",
]


# ----------------------------------------------------------------------------------------------
# choosing the observed entries


def _dense_block(A, B) -> np.ndarray:
    """A @ B.T for dense or scipy-sparse A, B, as a dense float32 array."""
    S = A @ B.T
    if hasattr(S, "toarray"):
        S = S.toarray()
    return np.asarray(S, dtype=np.float32)


def topk_by_vectors(A, B, k: int, *, block: int = 65536) -> np.ndarray:
    """For every row a of A, the indices of the k rows of B with the largest a . b
    (ties to the lower index), computed over blocks of B -> int64 (len(A), k)."""
    n_b = B.shape[0]
    if not 1 <= k <= n_b:
        raise ValueError(f"k must be in [1, {n_b}] (rows of B); got {k}")
    n_a = A.shape[0]
    best_s = np.full((n_a, 0), -np.inf, np.float32)
    best_i = np.empty((n_a, 0), np.int64)
    for s in range(0, n_b, block):
        e = min(s + block, n_b)
        sc = np.concatenate([best_s, _dense_block(A, B[s:e])], axis=1)
        ix = np.concatenate(
            [best_i, np.broadcast_to(np.arange(s, e, dtype=np.int64), (n_a, e - s))], axis=1
        )
        if sc.shape[1] > k:
            part = np.argpartition(-sc, k - 1, axis=1)[:, :k]
            # argpartition breaks ties arbitrarily: redo the boundary with a stable sort
            kth = np.take_along_axis(sc, part, 1).min(axis=1, keepdims=True)
            cand = sc >= kth
            order = np.lexsort((ix, -np.where(cand, sc, -np.inf)), axis=1)[:, :k]
            sc, ix = np.take_along_axis(sc, order, 1), np.take_along_axis(ix, order, 1)
        best_s, best_i = sc, ix
    order = np.lexsort((best_i, -best_s), axis=1)
    return np.take_along_axis(best_i, order, 1)


def tfidf_vectors(query_texts: Sequence[str], item_texts: Sequence[str]):
    """TF-IDF vectors (scipy sparse, L2-normalized rows), fit on the items."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    vec = TfidfVectorizer(sublinear_tf=True, dtype=np.float32)
    items = vec.fit_transform(list(item_texts))
    return vec.transform(list(query_texts)), items


def sample_g(
    n_train: int,
    n_items: int,
    k_d: int,
    *,
    per: str = "query",
    strategy: str = "topk",
    vectors=None,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """The observed entries of G as ``(query_pos, items)`` int64 arrays, sorted by query then item.

    ``per="query"``: k_d items per train query; ``per="item"``: k_d train queries per item.
    ``strategy="topk"`` ranks by ``vectors = (query_vectors, item_vectors)`` (DE or TF-IDF; dense
    or scipy sparse); ``strategy="uniform"`` draws uniformly with ``seed``.
    """
    if per not in ("query", "item"):
        raise ValueError(f"per must be 'query' or 'item'; got {per!r}")
    if strategy not in ("topk", "uniform"):
        raise ValueError(f"strategy must be 'topk' or 'uniform'; got {strategy!r}")
    n_from, n_to = (n_train, n_items) if per == "query" else (n_items, n_train)
    if not 1 <= k_d <= n_to:
        other = "items" if per == "query" else "train queries"
        raise ValueError(f"k_d must be in [1, {n_to}] ({other} available); got {k_d}")
    if strategy == "topk":
        if vectors is None or len(vectors) != 2:
            raise ValueError("strategy='topk' needs vectors=(query_vectors, item_vectors)")
        qv, iv = vectors
        if qv.shape[0] != n_train or iv.shape[0] != n_items or qv.shape[1] != iv.shape[1]:
            raise ValueError(
                f"vectors: expected shapes ({n_train}, d) and ({n_items}, d); "
                f"got {qv.shape} and {iv.shape}"
            )
        A, B = (qv, iv) if per == "query" else (iv, qv)
        chosen = topk_by_vectors(A, B, k_d)
    else:
        rng = np.random.default_rng(seed)
        chosen = np.stack([rng.choice(n_to, size=k_d, replace=False) for _ in range(n_from)])
    src = np.repeat(np.arange(n_from, dtype=np.int64), k_d)
    dst = chosen.astype(np.int64).ravel()
    qpos, items = (src, dst) if per == "query" else (dst, src)
    order = np.lexsort((items, qpos))
    return qpos[order], items[order]


def score_normalization(ce_scores: np.ndarray, de_scores: np.ndarray) -> tuple[float, float]:
    """(alpha, beta) with ``beta * (ce - alpha)`` matching the mean and std of ``de_scores``."""
    ce = np.asarray(ce_scores, np.float64)
    de = np.asarray(de_scores, np.float64)
    sd_ce, sd_de = ce.std(), de.std()
    if not (sd_ce > 0 and sd_de > 0):
        return 0.0, 1.0
    beta = sd_de / sd_ce
    alpha = ce.mean() - de.mean() / beta
    return float(alpha), float(beta)


# ----------------------------------------------------------------------------------------------
# the factorization


def gated_mlp_numpy(x: np.ndarray, W1, b1, W2, b2, w_skip) -> np.ndarray:
    """The inductive MF encoder applied in numpy (same maths as the torch module)."""
    x = np.asarray(x, np.float32)
    h = x @ np.asarray(W1).T + b1
    h = 0.5 * h * (1.0 + _erf(h / np.sqrt(2.0)))
    h = h @ np.asarray(W2).T + b2
    s = 1.0 / (1.0 + np.exp(-float(np.asarray(w_skip).reshape(-1)[0])))
    return (s * h + (1.0 - s) * x).astype(np.float32)


def _erf(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf

    return erf(x)


@dataclass
class MFResult:
    mode: str
    item_embeddings: np.ndarray  # (N, d) float32
    query_embeddings: np.ndarray  # (n_train, d) float32
    loss_curve: list[float]  # mean squared error on G after init and after every epoch
    alpha: float = 0.0
    beta: float = 1.0
    mlp: dict[str, np.ndarray] = field(default_factory=dict)  # inductive weights, "q_W1", ...
    seconds: float = 0.0
    params: dict = field(default_factory=dict)


def _make_mlp(d: int):
    import torch
    from torch import nn

    class GatedSkipMLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l1 = nn.Linear(d, 2 * d)
            self.l2 = nn.Linear(2 * d, d)
            self.w_skip = nn.Parameter(torch.tensor([-5.0]))

        def forward(self, x):
            h = self.l2(nn.functional.gelu(self.l1(x)))
            s = torch.sigmoid(self.w_skip)
            return s * h + (1 - s) * x

    return GatedSkipMLP()


class _LazyAdamW:
    """AdamW on row subsets (like TF's LazyAdam): each step updates only the given rows of each
    parameter matrix, with their first/second moments; bias correction uses the global step.
    Rows not in a batch are left untouched (no weight decay, no stale momentum)."""

    def __init__(
        self, params, *, lr: float, weight_decay: float, betas=(0.9, 0.999), eps: float = 1e-8
    ) -> None:
        import torch

        self.params = params
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]
        self.lr, self.wd, self.b1, self.b2, self.eps = lr, weight_decay, *betas, eps
        self.t = 0

    def step(self, row_grads) -> None:
        import torch

        self.t += 1
        c1, c2 = 1 - self.b1**self.t, 1 - self.b2**self.t
        with torch.no_grad():
            for p, m, v, (rows, g) in zip(self.params, self.m, self.v, row_grads, strict=True):
                mr = m[rows].mul_(self.b1).add_(g, alpha=1 - self.b1)
                vr = v[rows].mul_(self.b2).addcmul_(g, g, value=1 - self.b2)
                m[rows], v[rows] = mr, vr
                pr = p[rows]
                if self.wd:
                    pr.mul_(1 - self.lr * self.wd)
                pr.sub_(self.lr * (mr / c1) / ((vr / c2).sqrt() + self.eps))
                p[rows] = pr


def fit_mf(
    query_pos,
    items,
    values,
    *,
    de_queries: np.ndarray,
    de_items: np.ndarray,
    mode: str = "transductive",
    epochs: int = 20,
    lr: float = 0.005,
    batch_size: int = 1024,
    weight_decay: float = 0.0,
    normalize: bool = False,
    seed: int = 0,
    threads: int | None = 1,
    progress: bool = False,
) -> MFResult:
    """Fit U, V on the observed entries ``values[p] = CE(query_pos[p], items[p])`` of G.

    ``de_queries`` (n_train, d) and ``de_items`` (N, d): DE vectors (init for transductive, frozen
    inputs for inductive). Returns an :class:`MFResult` with the loss curve (MSE on G, in the
    normalized scale when ``normalize``; entry 0 is before training). ``threads``: torch intra-op
    threads during the fit (default 1: the per-batch ops are small, and on a shared machine more
    threads slow them down by up to 10x; ``None`` keeps torch's setting).
    """
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is in the dev environment
        raise ImportError(
            "fitting an MF index needs PyTorch: install the CPU build pinned in constraints.txt, "
            "e.g. pip install -c constraints.txt 'crossknn[export]'"
        ) from exc

    if mode not in ("transductive", "inductive"):
        raise ValueError(f"mode must be 'transductive' or 'inductive'; got {mode!r}")
    qp = np.asarray(query_pos, np.int64).ravel()
    it = np.asarray(items, np.int64).ravel()
    y = np.asarray(values, np.float32).ravel()
    if not (qp.shape == it.shape == y.shape) or qp.size == 0:
        raise ValueError(
            f"query_pos, items, values must be non-empty and equally long; "
            f"got {qp.shape}, {it.shape}, {y.shape}"
        )
    if not np.all(np.isfinite(y)):
        raise ValueError("values (CE scores of G) contain NaN or inf")
    DQ = np.ascontiguousarray(de_queries, np.float32)
    DI = np.ascontiguousarray(de_items, np.float32)
    if DQ.ndim != 2 or DI.ndim != 2 or DQ.shape[1] != DI.shape[1]:
        raise ValueError(
            f"de_queries (n_train, d) and de_items (N, d) must share d; got {DQ.shape}, {DI.shape}"
        )
    if qp.min() < 0 or qp.max() >= DQ.shape[0] or it.min() < 0 or it.max() >= DI.shape[0]:
        raise ValueError(
            f"G refers to query rows up to {qp.max()} and items up to {it.max()}; "
            f"de_queries has {DQ.shape[0]} rows, de_items {DI.shape[0]}"
        )
    if epochs < 0 or lr <= 0 or batch_size < 1:
        raise ValueError(
            f"need epochs >= 0, lr > 0, batch_size >= 1; got {epochs}, {lr}, {batch_size}"
        )

    alpha, beta = 0.0, 1.0
    if normalize:
        alpha, beta = score_normalization(y, np.einsum("ij,ij->i", DQ[qp], DI[it]))
        y = (beta * (y - alpha)).astype(np.float32)

    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    try:
        gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)  # default init of the MLP layers
        tq, ti, ty = torch.from_numpy(qp), torch.from_numpy(it), torch.from_numpy(y)
        dq, di = torch.from_numpy(DQ), torch.from_numpy(DI)
        if mode == "transductive":
            # U, V are free; a row-sparse ("lazy") AdamW touches only the rows of the batch, so a
            # step costs O(batch * d), not O(N * d): V may hold millions of items.
            U, V = dq.clone(), di.clone()
            opt = _LazyAdamW([U, V], lr=lr, weight_decay=weight_decay)

            def predict(bq, bi):
                return (U[bq] * V[bi]).sum(1)

            def step(bq, bi, by):
                rq, iq = torch.unique(bq, return_inverse=True)
                ri, ii = torch.unique(bi, return_inverse=True)
                uq = U[rq].requires_grad_(True)
                vi = V[ri].requires_grad_(True)
                loss = (((uq[iq] * vi[ii]).sum(1) - by) ** 2).mean()
                loss.backward()
                opt.step([(rq, uq.grad), (ri, vi.grad)])
        else:
            fq, fi = _make_mlp(DQ.shape[1]), _make_mlp(DQ.shape[1])
            params = list(fq.parameters()) + list(fi.parameters())
            adamw = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)

            def predict(bq, bi):
                # each distinct query/item goes through its MLP once (a batch repeats them)
                rq, iq = torch.unique(bq, return_inverse=True)
                ri, ii = torch.unique(bi, return_inverse=True)
                return (fq(dq[rq])[iq] * fi(di[ri])[ii]).sum(1)

            def step(bq, bi, by):
                adamw.zero_grad(set_to_none=True)
                loss = ((predict(bq, bi) - by) ** 2).mean()
                loss.backward()
                adamw.step()

        def full_loss() -> float:
            with torch.no_grad():
                tot = 0.0
                for s in range(0, len(ty), 1 << 20):
                    d = (
                        predict(tq[s : s + (1 << 20)], ti[s : s + (1 << 20)])
                        - ty[s : s + (1 << 20)]
                    )
                    tot += float((d * d).sum())
                return tot / len(ty)

        curve = [full_loss()]
        from tqdm.auto import tqdm

        n = len(ty)
        steps = math.ceil(n / batch_size)
        bar = tqdm(total=epochs * steps, desc=f"fit {mode}", unit="step", disable=not progress)
        for _ in range(epochs):
            perm = torch.randperm(n, generator=gen)
            for s in range(0, n, batch_size):
                b = perm[s : s + batch_size]
                step(tq[b], ti[b], ty[b])
                bar.update(1)
            curve.append(full_loss())
            bar.set_postfix(loss=f"{curve[-1]:.4g}")
        bar.close()

        mlp: dict[str, np.ndarray] = {}
        with torch.no_grad():
            if mode == "transductive":
                Uo, Vo = U.numpy(), V.numpy()
            else:
                Uo = fq(dq).numpy()
                Vo = np.empty_like(DI)
                for s in range(0, DI.shape[0], 65536):
                    Vo[s : s + 65536] = fi(di[s : s + 65536]).numpy()
                for tag, f in (("q", fq), ("i", fi)):
                    mlp[f"{tag}_W1"] = f.l1.weight.detach().numpy().copy()
                    mlp[f"{tag}_b1"] = f.l1.bias.detach().numpy().copy()
                    mlp[f"{tag}_W2"] = f.l2.weight.detach().numpy().copy()
                    mlp[f"{tag}_b2"] = f.l2.bias.detach().numpy().copy()
                    mlp[f"{tag}_w_skip"] = f.w_skip.detach().numpy().copy()
    finally:
        torch.set_num_threads(old_threads)
    return MFResult(
        mode=mode,
        item_embeddings=np.ascontiguousarray(Vo, np.float32),
        query_embeddings=np.ascontiguousarray(Uo, np.float32),
        loss_curve=curve,
        alpha=alpha,
        beta=beta,
        mlp=mlp,
        seconds=time.perf_counter() - t0,
        params={
            "mode": mode,
            "epochs": epochs,
            "lr": lr,
            "batch_size": batch_size,
            "weight_decay": weight_decay,
            "normalize": normalize,
            "seed": seed,
        },
    )


# ----------------------------------------------------------------------------------------------
# scoring G and saving the index


def build_mf_index(
    out_dir,
    scorer,
    queries: Sequence,
    *,
    de_queries: np.ndarray,
    de_items: np.ndarray,
    k_d: int,
    per: str = "query",
    strategy: str = "topk",
    vectors=None,
    mode: str = "transductive",
    epochs: int = 20,
    lr: float = 0.005,
    batch_size: int = 1024,
    weight_decay: float = 0.0,
    normalize: bool = False,
    seed: int = 0,
    ce=None,
    de=None,
    query_ids: Sequence[str] | None = None,
    job_dir=None,
    shard_pairs: int = 4096,
    backend: str = "local",
    progress: bool = True,
    ray_workers: int | None = None,
    ray_gpus_per_worker: float = 0.0,
    info: dict | None = None,
    keep_job: bool = False,
):
    """Choose G, score it with ``scorer`` (resumable sharded job), fit MF, save a ``kind="mf"``
    index. ``queries`` are the train queries (scorer query objects) aligned with ``de_queries``;
    ``vectors`` ranks for ``strategy="topk"`` (default: the DE vectors).
    Returns ``(Index, MFResult)``."""
    from pathlib import Path

    from crossknn.index.files import load_index, model_identity, save_index
    from crossknn.jobs import ScoreJob, SparsePairs

    out_dir = Path(out_dir)
    n_train, n_items = len(queries), int(scorer.n_items)
    if de_queries.shape[0] != n_train or de_items.shape[0] != n_items:
        raise ValueError(
            f"de_queries must have one row per train query ({n_train}) and de_items one per item "
            f"({n_items}); got {de_queries.shape} and {de_items.shape}"
        )
    if strategy == "topk" and vectors is None:
        vectors = (de_queries, de_items)
    qpos, items = sample_g(
        n_train, n_items, k_d, per=per, strategy=strategy, vectors=vectors, seed=seed
    )
    own_job = job_dir is None
    job_dir = Path(job_dir) if job_dir is not None else out_dir / ".job"
    job = ScoreJob(
        job_dir,
        scorer,
        queries,
        SparsePairs(qpos, items),
        shard_pairs=shard_pairs,
        extra={"ce": model_identity(ce if ce is not None else scorer)},
    )
    job.run(
        backend=backend,
        progress=progress,
        ray_workers=ray_workers,
        ray_gpus_per_worker=ray_gpus_per_worker,
        desc="scoring G",
    )
    g = job.result()
    res = fit_mf(
        qpos,
        items,
        g,
        de_queries=de_queries,
        de_items=de_items,
        mode=mode,
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
        weight_decay=weight_decay,
        normalize=normalize,
        seed=seed,
        progress=progress,
    )
    arrays = {
        "items": res.item_embeddings,
        "train_queries": res.query_embeddings,
        "g_query_pos": qpos,
        "g_items": items,
        "g_scores": g,
        **res.mlp,
    }
    params = {
        **res.params,
        "k_d": int(k_d),
        "per": per,
        "strategy": strategy,
        "n_train": n_train,
        "n_items": n_items,
        "dim": int(res.item_embeddings.shape[1]),
        "alpha": res.alpha,
        "beta": res.beta,
    }
    ids = [str(q) for q in (query_ids if query_ids is not None else queries)]
    doc_info = {
        "loss_curve": [float(x) for x in res.loss_curve],
        "fit_seconds": round(res.seconds, 3),
        "train_query_ids": ids,
        **(info or {}),
    }
    save_index(
        out_dir,
        "mf",
        arrays,
        ce=ce if ce is not None else scorer,
        de=de,
        params=params,
        ce_calls=int(g.size),
        info=doc_info,
    )
    if own_job and not keep_job:
        import shutil

        shutil.rmtree(job_dir)  # G is now in g_scores.npy
    return load_index(out_dir, kind="mf"), res


def query_embeddings(index, de_queries: np.ndarray) -> np.ndarray:
    """Prior embeddings for (test) queries from their DE vectors: the inductive query MLP of an
    MF index, or the DE vectors themselves for a transductive one (its embedding space)."""
    if index.params.get("mode") == "inductive":
        a = index.arrays
        return gated_mlp_numpy(
            de_queries, a["q_W1"], a["q_b1"], a["q_W2"], a["q_b2"], a["q_w_skip"]
        )
    return np.asarray(de_queries, np.float32)


def axn_score_affine(index) -> tuple[float, float] | None:
    """The MF index's CE score normalization in the form ``crossknn.search.AXN(score_affine=...)``
    takes (``(a - beta') / alpha'`` with ``alpha' = 1 / beta``, ``beta' = alpha``), or ``None`` when
    the index was fit without normalization."""
    p = index.params
    if not p.get("normalize"):
        return None
    return 1.0 / float(p["beta"]), float(p["alpha"])
