"""Index directories: byte-identical round trip, memmap, and clear errors for every damage."""

from __future__ import annotations

import json

import numpy as np
import pytest

from crossknn.identity import model_identity
from crossknn.index import IndexFormatError, ModelMismatchError, load_index, save_index

CE = {"model_id": "ce-a", "model_hash": "a" * 64}
DE = {"model_id": "de-a", "model_hash": "d" * 64}


def _save(path, **kw):
    rng = np.random.default_rng(0)
    arrays = {
        "items": rng.standard_normal((7, 3)).astype(np.float32),
        "g_items": np.arange(5, dtype=np.int64),
        "scale": np.float16([0.5, 2.0]),
    }
    args = dict(
        ce=CE,
        de=DE,
        params={"k_d": 3, "lr": 0.005, "mode": "inductive"},
        ce_calls=21,
        info={"loss_curve": [0.1, 0.01]},
    )
    args.update(kw)
    return save_index(path, "mf", arrays, **args), arrays


def _files(path):
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def test_save_load_save_is_byte_identical(tmp_path):
    p, arrays = _save(tmp_path / "a")
    idx = load_index(p, kind="mf", ce=CE, de=DE)
    assert isinstance(idx["items"], np.memmap)
    for k, v in arrays.items():
        assert idx[k].dtype == v.dtype
        np.testing.assert_array_equal(idx[k], v)
    assert (
        idx.ce_calls == 21 and idx.params["lr"] == 0.005 and idx.info["loss_curve"] == [0.1, 0.01]
    )
    idx.save(tmp_path / "b")
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    # saving over the directory it was memory-mapped from is safe too
    idx.save(p)
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    assert not isinstance(load_index(p, mmap=False)["items"], np.memmap)


def test_missing_and_wrong_kind(tmp_path):
    with pytest.raises(FileNotFoundError, match="no index directory"):
        load_index(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="index.json is missing"):
        load_index(tmp_path / "empty")
    p, _ = _save(tmp_path / "a")
    with pytest.raises(IndexFormatError, match="is a 'mf' index; expected a 'cur'"):
        load_index(p, kind="cur")
    (p / "g_items.npy").unlink()
    with pytest.raises(FileNotFoundError, match="g_items.npy is missing"):
        load_index(p)


def _edit_json(p, fn):
    doc = json.loads((p / "index.json").read_text())
    fn(doc)
    (p / "index.json").write_text(json.dumps(doc))


def test_wrong_version_and_shape(tmp_path):
    p, _ = _save(tmp_path / "a")
    _edit_json(p, lambda d: d.update(format_version=99))
    with pytest.raises(IndexFormatError, match="format_version 99 is not supported"):
        load_index(p)
    p, _ = _save(tmp_path / "b")
    _edit_json(p, lambda d: d["arrays"]["items"].update(shape=[7, 4]))
    with pytest.raises(
        IndexFormatError, match=r"items.npy has dtype <f4 shape \[7, 3\].*shape \[7, 4\]"
    ):
        load_index(p)
    p, _ = _save(tmp_path / "c")
    np.save(p / "items.npy", np.zeros((7, 3), np.float64))
    with pytest.raises(IndexFormatError, match="dtype <f8"):
        load_index(p)
    (p / "index.json").write_text("{not json")
    with pytest.raises(IndexFormatError, match="not valid JSON"):
        load_index(p)


def test_corrupt_and_truncated_arrays(tmp_path):
    p, _ = _save(tmp_path / "a")
    raw = bytearray((p / "items.npy").read_bytes())
    raw[-1] ^= 0xFF
    (p / "items.npy").write_bytes(bytes(raw))
    with pytest.raises(IndexFormatError, match="items.npy is corrupt"):
        load_index(p)
    load_index(p, verify=False)  # hash check is what caught it
    (p / "items.npy").write_bytes(bytes(raw[:-10]))
    with pytest.raises(IndexFormatError, match="corrupt or truncated"):
        load_index(p, verify=False)


def test_model_mismatch(tmp_path):
    p, _ = _save(tmp_path / "a")

    class OtherCE:
        model_id, model_hash = "ce-b", "b" * 64

    with pytest.raises(ModelMismatchError, match="built with CE 'ce-a'.*search uses 'ce-b'"):
        load_index(p, ce=OtherCE())
    with pytest.raises(ModelMismatchError, match="DE 'de-a'"):
        load_index(p, ce=CE, de={"model_id": "de-a-finetuned", "model_hash": "e" * 64})
    p2, _ = _save(tmp_path / "b", de=None)
    with pytest.raises(ModelMismatchError, match="records no DE"):
        load_index(p2, de=DE)
    with pytest.raises(ValueError, match="needs a content hash"):
        model_identity({"model_id": "x"})


def test_refuses_bad_arrays(tmp_path):
    with pytest.raises(ValueError, match="only numeric dtypes"):
        save_index(tmp_path, "cur", {"R": np.array(["a"], object)}, ce=CE)
    with pytest.raises(ValueError, match="array name"):
        save_index(tmp_path, "cur", {"../R": np.zeros(2)}, ce=CE)
