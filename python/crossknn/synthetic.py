"""Synthetic CE score matrices for tests and scale benchmarks (low rank plus skewed noise)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from crossknn.matrix import save_score_matrix

__all__ = [
    "NOISE_CLIP",
    "EmbeddingTestbed",
    "pair_noise",
    "synthetic_matrix",
    "write_synthetic_matrix",
]


def synthetic_matrix(
    n_queries: int,
    n_items: int,
    *,
    rank: int = 16,
    noise: float = 0.3,
    skew: float = 1.0,
    de_dim: int = 32,
    de_noise: float = 0.5,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A synthetic CE score matrix: low rank plus skewed noise, and noisy DE vectors.

    ``scores = Q Iᵀ / sqrt(rank) + noise * (lognormal(0, skew) - its mean)`` per entry: a low-rank
    part like [EMB]-style CEs and a right-skewed residual (larger ``noise``/``skew`` is more
    [CLS]-like, harder to factorize). DE vectors are the low-rank factors seen through a random
    projection plus noise, L2-normalized. Returns (scores float32 (nq, ni), de_queries, de_items).
    Built in blocks of items (float32 output), so 10^6 items fit in a few hundred MB.
    """
    if n_queries < 1 or n_items < 1 or rank < 1:
        raise ValueError("n_queries, n_items and rank must be >= 1")
    rng = np.random.default_rng(seed)
    Q = rng.standard_normal((n_queries, rank))
    P = rng.standard_normal((rank, de_dim)) / np.sqrt(rank)
    # mean of lognormal(0, skew) is exp(skew^2 / 2): centre the noise analytically (block-free)
    z_mean = float(np.exp(skew**2 / 2)) if skew > 0 else 0.0

    def de(X):
        Y = X @ P + de_noise * rng.standard_normal((X.shape[0], de_dim))
        return (Y / np.linalg.norm(Y, axis=1, keepdims=True)).astype(np.float32)

    S = np.empty((n_queries, n_items), np.float32)
    de_items = np.empty((n_items, de_dim), np.float32)
    block = max(1, 2**22 // max(n_queries, 1))
    for lo in range(0, n_items, block):
        hi = min(n_items, lo + block)
        It = rng.standard_normal((hi - lo, rank))
        Sb = (Q @ It.T) / np.sqrt(rank)
        if noise > 0:
            shape = Sb.shape
            z = rng.lognormal(0.0, skew, size=shape) if skew > 0 else rng.standard_normal(shape)
            Sb += noise * (z - z_mean)
        S[:, lo:hi] = Sb
        de_items[lo:hi] = de(It)
    return S, de(Q), de_items


def write_synthetic_matrix(
    folder: str | os.PathLike,
    n_queries: int,
    n_items: int,
    *,
    n_train: int | None = None,
    seed: int = 0,
    **kw,
) -> Path:
    """Writes a synthetic score-matrix folder (BENCHMARKS.md format; no texts)."""
    S, dq, di = synthetic_matrix(n_queries, n_items, seed=seed, **kw)
    n_train = n_queries // 2 if n_train is None else n_train
    perm = np.random.default_rng(seed + 1).permutation(n_queries)
    splits = {"train": sorted(perm[:n_train].tolist()), "test": sorted(perm[n_train:].tolist())}
    meta = {
        "dataset": None,
        "synthetic": True,
        "n_queries": n_queries,
        "n_items": n_items,
        "seed": seed,
        **{k: v for k, v in kw.items() if np.isscalar(v)},
    }
    return save_score_matrix(
        folder,
        S,
        [f"q{i}" for i in range(n_queries)],
        [f"d{i}" for i in range(n_items)],
        splits,
        meta,
        de_queries=dq,
        de_items=di,
    )


# ---- an embedding testbed for the scale benchmark (bench/scale_bench.py) ----------------------


NOISE_CLIP = 6.0


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finalizer on uint64 (wrapping arithmetic): a counter-based hash."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def pair_noise(query: int, items: np.ndarray, seed: int = 0) -> np.ndarray:
    """A standard normal per (seed, query, item), the same whatever batch it is drawn in, clipped
    to +-NOISE_CLIP (so exact top-k can skip items whose noiseless score is far below)."""
    items = np.asarray(items, np.uint64)
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps, as the hash wants
        key = _splitmix64(
            np.array([seed], np.uint64) * np.uint64(0x2545F4914F6CDD1D) + np.uint64(query)
        )
        h1 = _splitmix64(items ^ key)
        h2 = _splitmix64(h1 + np.uint64(0x632BE59BD9B4E019))
    u1 = ((h1 >> np.uint64(11)).astype(np.float64) + 0.5) / 2.0**53
    u2 = (h2 >> np.uint64(11)).astype(np.float64) / 2.0**53
    return np.clip(np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2), -NOISE_CLIP, NOISE_CLIP)


class EmbeddingTestbed:
    """Item vectors that look like real embeddings, and a CE-like score with known structure.

    Items: ``n_clusters`` cluster centres; a row is ``centre + spread * z * sqrt(spectrum)``
    (anisotropic: the spectrum decays like ``1 / (1 + j)``, in a random rotation), L2-normalized.
    Rows are drawn block by block from per-block seeds, so any block can be made alone.

    CE-like score of query q and item i::

        s(q, i) = softplus(beta * (v_i . w_q - c)) + (P y_q) . v_i + noise * n(q, i)

    a nonlinear function of the DE similarity ``v . w_q`` (w_q: a noisy copy of an item vector),
    a low-rank linear part that the DE does not know (``P``: d x rank, ``y_q``: per query) and
    counter-based Gaussian noise ``n(q, i)``. Least squares on V can learn the linear part and a
    local linearization of the softplus, which is what adaptive rounds are for.
    """

    def __init__(
        self,
        n_items: int,
        dim: int,
        *,
        n_clusters: int = 1000,
        spread: float = 0.6,
        beta: float = 8.0,
        offset: float = 0.5,
        rank: int = 8,
        low_rank_scale: float = 0.5,
        noise: float = 0.1,
        query_noise: float = 0.3,
        seed: int = 0,
        block: int = 1 << 16,
    ) -> None:
        self.n_items, self.dim, self.seed, self.block = int(n_items), int(dim), int(seed), block
        self.beta, self.offset, self.noise, self.query_noise = beta, offset, noise, query_noise
        rng = np.random.default_rng([seed, 1])
        C = rng.standard_normal((n_clusters, dim))
        self.centres = C / np.linalg.norm(C, axis=1, keepdims=True)
        rot, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
        spectrum = 1.0 / (1.0 + np.arange(dim))
        self.shape = (rot * np.sqrt(spectrum / spectrum.mean())).T * spread / np.sqrt(dim)
        P = rng.standard_normal((dim, rank))
        self.P = P / np.linalg.norm(P, axis=0) * low_rank_scale

    def items(self, lo: int, hi: int) -> np.ndarray:
        """Rows ``lo:hi`` of V (float32), made from the seeds of the blocks they fall in."""
        out = np.empty((hi - lo, self.dim), np.float32)
        for b in range(lo // self.block, (hi - 1) // self.block + 1 if hi > lo else 0):
            b0, b1 = b * self.block, min(self.n_items, (b + 1) * self.block)
            rng = np.random.default_rng([self.seed, 2, b])
            cl = rng.integers(0, self.centres.shape[0], size=b1 - b0)
            X = self.centres[cl] + rng.standard_normal((b1 - b0, self.dim)) @ self.shape
            X /= np.linalg.norm(X, axis=1, keepdims=True)
            s0, s1 = max(lo, b0), min(hi, b1)
            out[s0 - lo : s1 - lo] = X[s0 - b0 : s1 - b0]
        return out

    def queries(self, n: int, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """``n`` queries: (W DE query vectors (n, d), Y low-rank factors (n, rank))."""
        rng = np.random.default_rng([self.seed, 3, seed])
        src = rng.integers(0, self.n_items, size=n)
        W = np.stack([self.items(int(i), int(i) + 1)[0] for i in src]).astype(np.float64)
        W += self.query_noise * rng.standard_normal(W.shape) / np.sqrt(self.dim)
        W /= np.linalg.norm(W, axis=1, keepdims=True)
        return W, rng.standard_normal((n, self.P.shape[1]))

    def noiseless(self, W: np.ndarray, Y: np.ndarray, V: np.ndarray) -> np.ndarray:
        """The scores without the noise term, (rows of V) x (queries)."""
        V = np.asarray(V, np.float64)
        return np.logaddexp(0.0, self.beta * (V @ W.T - self.offset)) + V @ (self.P @ Y.T)

    def score(self, q: int, w: np.ndarray, y: np.ndarray, V: np.ndarray, items) -> np.ndarray:
        """CE-like scores of query ``q`` (DE vector ``w``, factor ``y``) for rows ``V`` of
        ``items``."""
        s = self.noiseless(w[None, :], y[None, :], V)[:, 0]
        return s + self.noise * pair_noise(q, items, self.seed)
