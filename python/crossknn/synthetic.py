"""Synthetic CE score matrices for tests and scale benchmarks (low rank plus skewed noise)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from crossknn.matrix import save_score_matrix

__all__ = ["synthetic_matrix", "write_synthetic_matrix"]


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
