"""Model inputs of a batch built with numpy in bulk: no Python loop over the pairs or texts.

The host-side part of every CE call: from cached token ids (:class:`crossknn.ce.tokenize.IdStore`)
and the kept lengths of each side (``longest_first``), the padded ``input_ids``,
``attention_mask``, ``token_type_ids`` (and ``pool_mask`` for pairs) of one batch. The result is
element for element what :func:`crossknn.ce.tokenize.assemble_pairs` /
:func:`~crossknn.ce.tokenize.assemble_single` (the row-by-row reference) build; the work is a
fixed number of numpy operations on (rows x longest) arrays, plus one per special token of the
template (one to three), whatever the batch size.
"""

from __future__ import annotations

import numpy as np

from crossknn.ce.tokenize import IdStore

__all__ = ["pair_feeds", "single_feeds"]


def _gather(store: IdStore, rows: np.ndarray, start, cols: np.ndarray, inside: np.ndarray):
    """Token ``cols - start`` of text ``rows`` where ``inside`` (else 0), as an (n, L) array."""
    flat = store.flat
    if flat.size == 0:
        return np.zeros(inside.shape, dtype=np.int64)
    src = (store.offsets[rows] - start)[:, None] + cols  # start: a scalar or one per row
    return flat.take(src, mode="clip") * inside


def _place(out: np.ndarray, rows: np.ndarray, at: np.ndarray, values: np.ndarray) -> None:
    """Write the template tokens ``values`` at column ``at[r] + j`` of each row ``r``."""
    if len(values) == 1:
        out[rows, at] = values[0]
        return
    for j, v in enumerate(values.tolist()):
        out[rows, at + j] = v


def pair_feeds(t, pad_id: int, A: IdStore, ia, ta, B: IdStore, ib, tb) -> dict[str, np.ndarray]:
    """Inputs of one batch of pairs: ``A[ia[r]]`` kept to ``ta[r]`` tokens, ``B[ib[r]]`` to
    ``tb[r]``, in the template ``t``, padded to the longest pair. ``pool_mask`` is 1 on the
    first segment's tokens, 2 on the second's, 0 on special tokens and padding."""
    ia = np.asarray(ia, dtype=np.int64)
    ib = np.asarray(ib, dtype=np.int64)
    ta = np.asarray(ta, dtype=np.int64)
    tb = np.asarray(tb, dtype=np.int64)
    n = len(ia)
    p, mid = len(t.prefix), len(t.mid)
    lengths = ta + tb + t.n_special
    if n and (ia == ia[0]).all() and (ta == ta[0]).all():
        return _one_query(t, pad_id, A, int(ia[0]), int(ta[0]), B, ib, tb, lengths)
    cols = np.arange(int(lengths.max()), dtype=np.int64)
    a_end = ta + p  # first segment: [p, a_end)
    b_start = a_end + mid  # second segment: [b_start, b_end)
    b_end = b_start + tb
    in_a = np.less(cols, a_end[:, None])
    in_a[:, :p] = False
    in_b = np.greater_equal(cols, b_start[:, None])
    in_b &= np.less(cols, b_end[:, None])
    mask = np.less(cols, lengths[:, None]).astype(np.int64)
    ids = _gather(A, ia, p, cols, in_a)
    ids += _gather(B, ib, b_start, cols, in_b)
    pool = in_a.astype(np.int64)
    pool += in_b * 2
    if t.type_a == 0 and t.type_b == 1:
        types = in_b.astype(np.int64)
    else:
        types = np.where(in_a, t.type_a, 0) + np.where(in_b, t.type_b, 0)
    rows = np.arange(n)
    ids[:, :p] = t.prefix
    types[:, :p] = t.type_prefix
    _place(ids, rows, a_end, t.mid)
    _place(types, rows, a_end, t.type_mid)
    _place(ids, rows, b_end, t.suffix)
    _place(types, rows, b_end, t.type_suffix)
    if pad_id != 0:
        ids[mask == 0] = pad_id
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types, "pool_mask": pool}


def _one_query(t, pad_id: int, A: IdStore, qa: int, na: int, B: IdStore, ib, tb, lengths):
    """:func:`pair_feeds` where every pair has the same first segment (one query kept to the
    same length: a search round): that segment is one broadcast copy, the second starts at the
    same column in every row."""
    p, mid = len(t.prefix), len(t.mid)
    b0 = p + na + mid  # where the second segment starts
    width = int(lengths.max())
    ids = np.zeros((len(ib), width), dtype=np.int64)
    types = np.zeros_like(ids)
    pool = np.zeros_like(ids)
    ids[:, :p] = t.prefix
    types[:, :p] = t.type_prefix
    ids[:, p : p + na] = A.get(qa, na)
    types[:, p : p + na] = t.type_a
    pool[:, p : p + na] = 1
    ids[:, p + na : b0] = t.mid
    types[:, p + na : b0] = t.type_mid
    wb = width - b0
    cols = np.arange(wb, dtype=np.int64)
    in_b = np.less(cols, tb[:, None])
    if B.flat.size:
        src = B.offsets[ib][:, None] + cols
        ids[:, b0:] = B.flat.take(src, mode="clip") * in_b
    types[:, b0:] = in_b * t.type_b
    pool[:, b0:] = in_b * 2
    rows = np.arange(len(ib))
    b_end = tb + b0
    _place(ids, rows, b_end, t.suffix)
    _place(types, rows, b_end, t.type_suffix)
    mask = np.less(np.arange(width), lengths[:, None]).astype(np.int64)
    if pad_id != 0:
        ids[mask == 0] = pad_id
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types, "pool_mask": pool}


def single_feeds(t, pad_id: int, A: IdStore, ia, ta) -> dict[str, np.ndarray]:
    """Inputs of one batch of single texts (``A[ia[r]]`` kept to ``ta[r]`` tokens)."""
    ia = np.asarray(ia, dtype=np.int64)
    ta = np.asarray(ta, dtype=np.int64)
    n = len(ia)
    p = len(t.prefix)
    lengths = ta + t.n_special
    cols = np.arange(int(lengths.max()), dtype=np.int64)
    a_end = ta + p
    in_a = np.less(cols, a_end[:, None])
    in_a[:, :p] = False
    mask = np.less(cols, lengths[:, None]).astype(np.int64)
    ids = _gather(A, ia, p, cols, in_a)
    types = np.where(in_a, t.type_a, 0).astype(np.int64)
    rows = np.arange(n)
    ids[:, :p] = t.prefix
    types[:, :p] = t.type_prefix
    _place(ids, rows, a_end, t.suffix)
    _place(types, rows, a_end, t.type_suffix)
    if pad_id != 0:
        ids[mask == 0] = pad_id
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
