"""Offline indexes, stored as directories (``files``): dense CUR anchor rows (``cur``) and the
sparse-MF item embeddings of the AXN paper (``mf``: entries, fit, build)."""

from crossknn.index.cur import build_cur_index, score_dense
from crossknn.index.files import (
    FORMAT_VERSION,
    Index,
    IndexFormatError,
    ModelMismatchError,
    load_index,
    save_index,
)
from crossknn.index.mf import build_mf_index, mf_score_map, query_embeddings
from crossknn.index.mf_entries import sample_g
from crossknn.index.mf_fit import MFResult, fit_mf

__all__ = [
    "FORMAT_VERSION",
    "Index",
    "IndexFormatError",
    "MFResult",
    "ModelMismatchError",
    "build_cur_index",
    "build_mf_index",
    "fit_mf",
    "load_index",
    "mf_score_map",
    "query_embeddings",
    "sample_g",
    "save_index",
    "score_dense",
]
