"""Issue 10 (index files): a malformed or hand-edited index.json is one clear line naming the file
and what was expected; parameters are validated and covered by the recorded hash."""

import json
import shutil

import numpy as np
import pytest

from crossknn.index.files import HASH_KEY, IndexFormatError, load_index, save_index

CE = {"model_id": "ce-test", "model_hash": "c" * 64}
DE = {"model_id": "de-test", "model_hash": "d" * 64}


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    p = tmp_path_factory.mktemp("rel-index") / "idx"
    arrays = {"de_items": np.arange(12, dtype=np.float32).reshape(4, 3)}
    params = {"n_items": 4, "dim": 3, "score_map": [0.5, 1.0]}
    return save_index(p, "corpus", arrays, ce=CE, de=DE, params=params, info={"items_file": "x"})


def _edited(index_dir, tmp_path, fn, *, legacy=False):
    p = shutil.copytree(index_dir, tmp_path / "idx")
    doc = json.loads((p / "index.json").read_text())
    if legacy:
        doc.pop(HASH_KEY)
    fn(doc)
    (p / "index.json").write_text(json.dumps(doc))
    return p


def test_index_json_records_a_hash_and_loads(index_dir):
    doc = json.loads((index_dir / "index.json").read_text())
    assert len(doc[HASH_KEY]) == 64
    assert load_index(index_dir).params["score_map"] == [0.5, 1.0]


@pytest.mark.parametrize("key", ["score_map", "n_items"])
def test_hand_edited_params_are_refused_as_modified(index_dir, tmp_path, key):
    p = _edited(index_dir, tmp_path, lambda d: d["params"].update({key: [1e308, 1e308]}))
    with pytest.raises(IndexFormatError, match="index.json was modified"):
        load_index(p)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["params"].update(score_map=[1e308, 1e308]), "score map out of range"),
        (lambda d: d["params"].update(score_affine=[1e308, 1e308], score_map=None), "out of range"),
        (lambda d: d["params"].update(score_map=[0.5, 1.0, 2.0]), r"\[scale, offset\]"),
        (lambda d: d["params"].update(n_items=-3), "params.n_items must be a non-negative"),
        (lambda d: d["params"].update(extra=[1, 1e400]), "Infinity is not a JSON number"),
    ],
)
def test_legacy_index_params_are_validated_on_load(index_dir, tmp_path, edit, message):
    p = _edited(index_dir, tmp_path, edit, legacy=True)
    with pytest.raises(IndexFormatError, match=message):
        load_index(p)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.update(arrays=[]), "'arrays' must be a non-empty object"),
        (lambda d: d["arrays"].update(de_items="x"), "arrays.de_items must be an object"),
        (lambda d: d["arrays"]["de_items"].update(file=3), "arrays.de_items.file must be"),
        (lambda d: d["arrays"]["de_items"].pop("file"), "arrays.de_items.file must be"),
        (lambda d: d["arrays"]["de_items"].update(shape="ab"), "shape must be a list"),
        (lambda d: d.update(models="x"), "'models' must be an object"),
        (lambda d: d["models"]["ce"].pop("model_hash"), "models.ce must be"),
        (lambda d: d.update(ce_calls="abc"), "'ce_calls' must be a non-negative integer"),
        (lambda d: d.update(params=[]), "'params' must be an object"),
        (lambda d: d["info"].update(items_file=5), "info.items_file must be a plain file name"),
    ],
)
def test_malformed_index_json_is_a_clear_format_error(index_dir, tmp_path, edit, message):
    p = _edited(index_dir, tmp_path, edit, legacy=True)
    with pytest.raises(IndexFormatError, match=message) as e:
        load_index(p)
    assert "index.json" in str(e.value)


def test_npz_renamed_to_npy_is_a_clear_format_error(index_dir, tmp_path):
    p = shutil.copytree(index_dir, tmp_path / "idx")
    np.savez(tmp_path / "a.npz", a=np.zeros(3))
    shutil.move(tmp_path / "a.npz", p / "de_items.npy")
    with pytest.raises(IndexFormatError, match="de_items.npy is not a .npy array file"):
        load_index(p)


def test_nan_constant_in_index_json_is_refused(index_dir, tmp_path):
    p = shutil.copytree(index_dir, tmp_path / "idx")
    text = (p / "index.json").read_text().replace("0.5", "NaN")
    (p / "index.json").write_text(text)
    with pytest.raises(IndexFormatError, match="not valid JSON"):
        load_index(p)


def test_malformed_index_is_one_line_from_the_cli(index_dir, tmp_path, capsys):
    from crossknn.cli import main

    p = _edited(index_dir, tmp_path, lambda d: d["arrays"].update(de_items="x"))
    assert main(["search", str(p), "query"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "index.json: arrays.de_items must be an object" in err
