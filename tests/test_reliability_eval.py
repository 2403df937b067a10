"""Issue 10 (eval harness): nothing silently wrong: empty runs, non-finite scores, duplicate ids,
out-of-range options and unwritable outputs are one clear line each."""

import json

import numpy as np
import pytest

from crossknn.cli import main
from crossknn.synthetic import write_synthetic_matrix

N_ITEMS = 40


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    return write_synthetic_matrix(tmp_path_factory.mktemp("rel-eval") / "m", 12, N_ITEMS)


def _copy(matrix, tmp_path):
    import shutil

    return shutil.copytree(matrix, tmp_path / "m")


def _eval(m, tmp_path, *extra):
    return [
        "eval",
        str(m),
        "--method",
        "rnr",
        "--json",
        str(tmp_path / "r.json"),
        "--no-plot",
        "--quiet",
        *extra,
    ]


def _err(capsys, argv):
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1
    return err


def test_eval_k_above_every_budget_is_an_error(matrix, tmp_path, capsys):
    err = _err(capsys, _eval(matrix, tmp_path, "--k", "30", "--budget", "20"))
    assert "every k (30) exceeds every budget B (20)" in err
    assert not (tmp_path / "r.json").exists()


def test_eval_nan_anywhere_in_scores_is_an_error(matrix, tmp_path, capsys):
    for bad in (np.nan, np.inf):
        m = _copy(matrix, tmp_path / str(bad))
        S = np.load(m / "scores.npy")
        S[0, N_ITEMS - 1] = bad
        np.save(m / "scores.npy", S)
        err = _err(capsys, _eval(m, tmp_path, "--k", "1", "--budget", "5"))
        assert f"scores.npy: score [0, {N_ITEMS - 1}]" in err and "finite" in err


def test_eval_duplicate_item_ids_is_an_error(matrix, tmp_path, capsys):
    m = _copy(matrix, tmp_path)
    ids = json.loads((m / "item_ids.json").read_text())
    ids[1] = ids[0]
    (m / "item_ids.json").write_text(json.dumps(ids))
    err = _err(capsys, _eval(m, tmp_path, "--k", "1", "--budget", "5"))
    assert "item_ids.json: duplicate id" in err


def test_eval_budget_equal_to_n_items_is_allowed(matrix, tmp_path, capsys):
    assert main(_eval(matrix, tmp_path, "--k", "5", "--budget", str(N_ITEMS))) == 0
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert rows[0]["budget"] == N_ITEMS and rows[0]["recall"] == 1.0
    err = _err(capsys, _eval(matrix, tmp_path, "--k", "5", "--budget", str(N_ITEMS + 1)))
    assert f"must be in [1, {N_ITEMS}]" in err


@pytest.mark.parametrize(
    "opt",
    [
        ["--mix", "-1"],
        ["--mix", "nan"],
        ["--split", "1.5"],
        ["--temperature", "0"],
        ["--ridge", "-1"],
        ["--k", "0"],
        ["--budget", "-3"],
        ["--rounds", "0"],
        ["--seed", "-1"],
    ],
)
def test_eval_option_ranges_are_checked_by_argparse(matrix, tmp_path, capsys, opt):
    base = {"--k": "1", "--budget": "5"}
    base.pop(opt[0], None)
    argv = _eval(matrix, tmp_path, *opt, *[x for kv in base.items() for x in kv])
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and f"argument {opt[0]}" in capsys.readouterr().err


def test_eval_json_to_a_folder_is_one_line_and_leaves_no_tmp(matrix, tmp_path, capsys):
    out = tmp_path / "SOME_DIR"
    out.mkdir()
    argv = [
        "eval",
        str(matrix),
        "--method",
        "rnr",
        "--k",
        "1",
        "--budget",
        "5",
        "--json",
        str(out),
        "--no-plot",
        "--quiet",
    ]
    assert "is a folder" in _err(capsys, argv)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["SOME_DIR"]


def test_eval_write_json_refuses_a_folder(tmp_path):
    from crossknn.eval import write_json

    with pytest.raises(IsADirectoryError):
        write_json([], tmp_path)
    assert list(tmp_path.iterdir()) == []
