"""Offline indexes: dense CUR anchor rows and sparse-MF item embeddings, stored as directories."""

from crossknn.index.cur import build_cur_index, score_dense
from crossknn.index.files import (
    FORMAT_VERSION,
    Index,
    IndexFormatError,
    ModelMismatchError,
    load_index,
    model_identity,
    save_index,
)
from crossknn.index.mf import MFResult, build_mf_index, fit_mf, sample_g

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
    "model_identity",
    "sample_g",
    "save_index",
    "score_dense",
]
