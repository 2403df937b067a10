"""Factorizing the sparse CE matrix G into query and item embeddings (the AXN paper's index).

The fit minimizes the squared error on the observed entries,
``sum_(q,i) in G (u_q . v_i - G_qi)^2``, with AdamW in PyTorch:

- ``mode="transductive"`` (:class:`_Transductive`): U (train queries) and V (all items) are free
  parameters initialized from the DE vectors, trained with a row-sparse ("lazy") AdamW that
  updates only the rows in each batch (a step costs O(batch x d) however many items there are).
  Items with no entry in G keep their DE vector.
- ``mode="inductive"`` (:class:`_Inductive`): U = f_q(DE queries), V = f_i(DE items) with two
  separate 2-layer MLPs with the paper's gated skip connection on frozen DE vectors:
  ``h = b2 + W2 gelu(b1 + W1 x)``, ``out = s h + (1 - s) x``, ``s = sigmoid(w_skip)``, ``w_skip``
  initialized to -5 (so training starts at the DE). Embeds unseen queries and items too.

Optional score normalization (``normalize=True``): CE scores are mapped to the DE score range by
``ScoreMap.match_moments`` on the pairs of G before the fit. It is monotone, so it does not change
any ranking; search applies the same map to a test query's CE scores (recorded in the index).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
from tqdm.auto import tqdm

from crossknn.score_map import ScoreMap

__all__ = ["MFResult", "fit_mf", "gated_mlp_numpy"]

_CHUNK = 1 << 20  # pairs per block when computing the full loss
_ROWS = 65536  # items per block through the item MLP


def gated_mlp_numpy(x: np.ndarray, W1, b1, W2, b2, w_skip) -> np.ndarray:
    """The inductive MF encoder applied in numpy (same maths as the torch module)."""
    # scipy: slow to import, only this function needs it
    from scipy.special import erf

    x = np.asarray(x, np.float32)
    h = x @ np.asarray(W1).T + b1
    h = 0.5 * h * (1.0 + erf(h / np.sqrt(2.0)))
    h = h @ np.asarray(W2).T + b2
    s = 1.0 / (1.0 + np.exp(-float(np.asarray(w_skip).reshape(-1)[0])))
    return (s * h + (1.0 - s) * x).astype(np.float32)


@dataclass
class MFResult:
    mode: str
    item_embeddings: np.ndarray  # (N, d) float32
    query_embeddings: np.ndarray  # (n_train, d) float32
    loss_curve: list[float]  # mean squared error on G after init and after every epoch
    score_map: ScoreMap | None = None  # the CE score map applied before the fit (normalize)
    mlp: dict[str, np.ndarray] = field(default_factory=dict)  # inductive weights, "q_W1", ...
    seconds: float = 0.0
    params: dict = field(default_factory=dict)


def _gated_skip_mlp(d: int):
    # torch: optional (export extra), about 1 s to import
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
        # torch: optional (export extra), about 1 s to import
        import torch

        self.params = params
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]
        self.lr, self.wd, self.b1, self.b2, self.eps = lr, weight_decay, *betas, eps
        self.t = 0

    def step(self, row_grads) -> None:
        # torch: optional (export extra), about 1 s to import
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


class _Transductive:
    """Free U, V initialized from the DE vectors; row-sparse AdamW."""

    def __init__(self, dq, di, *, lr: float, weight_decay: float) -> None:
        self.U, self.V = dq.clone(), di.clone()
        self.opt = _LazyAdamW([self.U, self.V], lr=lr, weight_decay=weight_decay)

    def predict(self, bq, bi):
        return (self.U[bq] * self.V[bi]).sum(1)

    def step(self, bq, bi, by) -> None:
        # torch: optional (export extra), about 1 s to import
        import torch

        rq, iq = torch.unique(bq, return_inverse=True)
        ri, ii = torch.unique(bi, return_inverse=True)
        uq = self.U[rq].requires_grad_(True)
        vi = self.V[ri].requires_grad_(True)
        loss = (((uq[iq] * vi[ii]).sum(1) - by) ** 2).mean()
        loss.backward()
        self.opt.step([(rq, uq.grad), (ri, vi.grad)])

    def export(self, dq, di) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        return self.U.numpy(), self.V.numpy(), {}


class _Inductive:
    """Two gated-skip MLPs over the frozen DE vectors; plain AdamW."""

    def __init__(self, dq, di, *, lr: float, weight_decay: float) -> None:
        # torch: optional (export extra), about 1 s to import
        import torch

        self.dq, self.di = dq, di
        self.fq, self.fi = _gated_skip_mlp(dq.shape[1]), _gated_skip_mlp(dq.shape[1])
        params = list(self.fq.parameters()) + list(self.fi.parameters())
        self.opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)

    def predict(self, bq, bi):
        # torch: optional (export extra), about 1 s to import
        import torch

        # each distinct query/item goes through its MLP once (a batch repeats them)
        rq, iq = torch.unique(bq, return_inverse=True)
        ri, ii = torch.unique(bi, return_inverse=True)
        return (self.fq(self.dq[rq])[iq] * self.fi(self.di[ri])[ii]).sum(1)

    def step(self, bq, bi, by) -> None:
        self.opt.zero_grad(set_to_none=True)
        loss = ((self.predict(bq, bi) - by) ** 2).mean()
        loss.backward()
        self.opt.step()

    def export(self, dq, di) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        U = self.fq(dq).numpy()
        V = np.empty(tuple(di.shape), np.float32)
        for s in range(0, di.shape[0], _ROWS):
            V[s : s + _ROWS] = self.fi(di[s : s + _ROWS]).numpy()
        mlp: dict[str, np.ndarray] = {}
        for tag, f in (("q", self.fq), ("i", self.fi)):
            mlp[f"{tag}_W1"] = f.l1.weight.detach().numpy().copy()
            mlp[f"{tag}_b1"] = f.l1.bias.detach().numpy().copy()
            mlp[f"{tag}_W2"] = f.l2.weight.detach().numpy().copy()
            mlp[f"{tag}_b2"] = f.l2.bias.detach().numpy().copy()
            mlp[f"{tag}_w_skip"] = f.w_skip.detach().numpy().copy()
        return U, V, mlp


_MODES = {"transductive": _Transductive, "inductive": _Inductive}


def _check_inputs(qp, it, y, DQ, DI, epochs, lr, batch_size) -> None:
    if not (qp.shape == it.shape == y.shape) or qp.size == 0:
        raise ValueError(
            f"query_pos, items, values must be non-empty and equally long; "
            f"got {qp.shape}, {it.shape}, {y.shape}"
        )
    if not np.all(np.isfinite(y)):
        raise ValueError("values (CE scores of G) contain NaN or inf")
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
        # torch: optional (export extra), about 1 s to import
        import torch
    except ImportError as exc:  # pragma: no cover - torch is in the dev environment
        raise ImportError(
            "fitting an MF index needs PyTorch: install the CPU build pinned in constraints.txt, "
            "e.g. pip install -c constraints.txt 'crossknn[export]'"
        ) from exc

    if mode not in _MODES:
        raise ValueError(f"mode must be 'transductive' or 'inductive'; got {mode!r}")
    qp = np.asarray(query_pos, np.int64).ravel()
    it = np.asarray(items, np.int64).ravel()
    y = np.asarray(values, np.float32).ravel()
    DQ = np.ascontiguousarray(de_queries, np.float32)
    DI = np.ascontiguousarray(de_items, np.float32)
    _check_inputs(qp, it, y, DQ, DI, epochs, lr, batch_size)

    smap = None
    if normalize:
        smap = ScoreMap.match_moments(y, np.einsum("ij,ij->i", DQ[qp], DI[it]))
        y = smap.to_approx(y).astype(np.float32)

    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    try:
        gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)  # default init of the MLP layers
        tq, ti, ty = torch.from_numpy(qp), torch.from_numpy(it), torch.from_numpy(y)
        dq, di = torch.from_numpy(DQ), torch.from_numpy(DI)
        model = _MODES[mode](dq, di, lr=lr, weight_decay=weight_decay)

        def full_loss() -> float:
            with torch.no_grad():
                tot = 0.0
                for s in range(0, len(ty), _CHUNK):
                    d = model.predict(tq[s : s + _CHUNK], ti[s : s + _CHUNK]) - ty[s : s + _CHUNK]
                    tot += float((d * d).sum())
                return tot / len(ty)

        curve = [full_loss()]
        n = len(ty)
        steps = math.ceil(n / batch_size)
        with tqdm(
            total=epochs * steps, desc=f"fit {mode}", unit="step", disable=not progress
        ) as bar:
            for _ in range(epochs):
                perm = torch.randperm(n, generator=gen)
                for s in range(0, n, batch_size):
                    b = perm[s : s + batch_size]
                    model.step(tq[b], ti[b], ty[b])
                    bar.update(1)
                curve.append(full_loss())
                bar.set_postfix(loss=f"{curve[-1]:.4g}")
        with torch.no_grad():
            Uo, Vo, mlp = model.export(dq, di)
    finally:
        torch.set_num_threads(old_threads)
    return MFResult(
        mode=mode,
        item_embeddings=np.ascontiguousarray(Vo, np.float32),
        query_embeddings=np.ascontiguousarray(Uo, np.float32),
        loss_curve=curve,
        score_map=smap,
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
