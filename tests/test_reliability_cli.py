"""Issue 10 (CLI): one clear line for every user error, nothing overwritten or half-written, no
raw control characters on the terminal. One small index per module, built with the real models."""

import errno
import json
import re
from pathlib import Path

import numpy as np
import pytest

from crossknn import fileio
from crossknn.cli import main

pytestmark = [pytest.mark.slow]

EVIL_ID = "evil\x1b[2J"
EVIL_TEXT = "evil \x1b]0;title\x07 text \x1b[31mred\x1b[0m document"
RAW_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # newline and tab are layout


def _write_corpus(path, n=12, extra=()):
    lines = [
        json.dumps({"id": f"d{i}", "text": f"document {i} about topic {i % 3}"}) for i in range(n)
    ]
    lines += [json.dumps(r) for r in extra]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def env(model_cache, tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("CROSSKNN_CACHE", str(model_cache))
    root = tmp_path_factory.mktemp("reliability-cli")
    corpus = _write_corpus(root / "c.jsonl", extra=[{"id": EVIL_ID, "text": EVIL_TEXT}])
    idx = root / "idx"
    args = ["--calibration-queries", "2", "--calibration-items", "4", "--quiet"]
    assert main(["build", str(corpus), str(idx), *args]) == 0
    yield {"root": root, "corpus": corpus, "idx": idx, "args": args}
    mp.undo()


def _one_line_error(capsys, argv, rc=2):
    capsys.readouterr()
    assert main(argv) == rc
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    last = err.splitlines()[-1]
    assert not RAW_CONTROL.search(err)
    return last


# -- 4: build never overwrites its input or mixes with other files ------------------------------


def test_build_refuses_output_folder_holding_its_input(env, tmp_path, capsys, monkeypatch):
    (tmp_path / "items.jsonl").write_bytes(env["corpus"].read_bytes())
    before = (tmp_path / "items.jsonl").read_bytes()
    monkeypatch.chdir(tmp_path)
    line = _one_line_error(capsys, ["build", "items.jsonl", ".", *env["args"]])
    assert "contains the input items.jsonl" in line
    assert (tmp_path / "items.jsonl").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["items.jsonl"]


def test_build_refuses_output_folder_with_foreign_files(env, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    line = _one_line_error(capsys, ["build", str(env["corpus"]), str(tmp_path), *env["args"]])
    assert "'notes.txt', which is not part of an index" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_build_refuses_existing_file_as_output(env, tmp_path, capsys):
    f = tmp_path / "EXISTING"
    f.write_text("keep")
    line = _one_line_error(capsys, ["build", str(env["corpus"]), str(f)])
    assert "exists and is not a folder" in line and f.read_text() == "keep"


def test_build_rebuilds_into_its_own_index_folder(env, capsys):
    # an index folder (index.json, items.jsonl, *.npy, exact/) is accepted as the output
    (env["idx"] / "exact").mkdir(exist_ok=True)
    assert main(["build", str(env["corpus"]), str(env["idx"]), *env["args"]]) == 0


# -- 5: no raw control characters from search / rank / demo -------------------------------------


def test_search_output_escapes_control_characters(env, capsys):
    capsys.readouterr()
    assert main(["search", str(env["idx"]), "evil\x1b[2Jred", "-k", "13", "--budget", "13"]) == 0
    out = capsys.readouterr().out
    assert "evil\\x1b[2J" in out and not RAW_CONTROL.search(out)


def test_rank_output_escapes_control_characters(env, capsys):
    capsys.readouterr()
    assert main(["rank", "evil red", "--corpus", str(env["corpus"]), "--top-k", "13"]) == 0
    out = capsys.readouterr().out
    assert "evil\\x1b[2J" in out and "\\x07" in out and not RAW_CONTROL.search(out)


def test_demo_output_escapes_control_characters(env, tmp_path, capsys, monkeypatch):
    from crossknn.commands import demo_cmd
    from crossknn.data import load_corpus

    monkeypatch.setattr(
        demo_cmd, "stdlib_docstrings", lambda max_items=None: load_corpus(env["corpus"])
    )
    capsys.readouterr()
    argv = ["demo", "--query", "evil\x1b]0;x\x07", "-k", "13", "--budget", "13", "--quiet"]
    assert main([*argv, "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "evil\\x1b[2J" in out and not RAW_CONTROL.search(out)


def test_error_messages_escape_control_characters(env, capsys):
    line = _one_line_error(capsys, ["search", str(env["root"] / "no\x1b[2Jindex"), "q"])
    assert "no\\x1b[2Jindex" in line
    with pytest.raises(SystemExit):
        main(["search", str(env["idx"]), "q", "--method", "x\x1b[2J"])
    err = capsys.readouterr().err
    assert "x\\x1b[2J" in err and not RAW_CONTROL.search(err)


# -- 10: OSErrors are one line naming the file; no partial files --------------------------------


def test_build_disk_full_is_one_line_and_leaves_nothing(env, tmp_path, capsys, monkeypatch):
    real = fileio.atomic_write_bytes

    def full(path, data):  # the disk fills up when the index's items are written
        if Path(path).name != "items.jsonl":
            return real(path, data)
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(fileio, "atomic_write_bytes", full)
    import crossknn.corpus.build as ci

    monkeypatch.setattr(ci, "atomic_write_bytes", full)
    out = tmp_path / "new"
    line = _one_line_error(capsys, ["build", str(env["corpus"]), str(out), *env["args"]])
    assert "No space left on device" in line and "items.jsonl" in line
    assert not out.exists()


def test_score_matrix_disk_full_is_one_line(env, tmp_path, capsys, monkeypatch):
    from crossknn.commands import score_matrix_cmd
    from shared_fixtures import made_beir

    def boom(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "m" / "scores.npy"))

    monkeypatch.setattr(score_matrix_cmd, "build_score_matrix", boom)
    line = _one_line_error(
        capsys, ["score-matrix", str(made_beir(tmp_path / "beir")), str(tmp_path / "m")]
    )
    assert line.endswith("scores.npy: No space left on device")


def test_argparse_ranges_are_checked(env, capsys):
    for argv, what in [
        (["build", "c", "o", "--calibration-queries", "-5"], "--calibration-queries"),
        (["build", "c", "o", "--calibration-items", "0"], "--calibration-items"),
        (["search", "i", "q", "--budget", "0"], "--budget"),
        (["search", "i", "q", "--k", "x"], "--k"),
        (["rank", "q", "--corpus", "c", "--top-k", "0"], "--top-k"),
        (["score-matrix", "d", "o", "--n-test", "-1"], "--n-test"),
    ]:
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
        assert what in capsys.readouterr().err


def test_score_matrix_has_overwrite_option():
    from crossknn.cli import build_parser

    args = build_parser().parse_args(["score-matrix", "d", "o", "--overwrite"])
    assert args.overwrite is True


# -- 11: helpful messages ------------------------------------------------------------------------


def test_build_one_item_corpus_is_a_clear_error(env, tmp_path, capsys):
    one = _write_corpus(tmp_path / "one.jsonl", n=1)
    line = _one_line_error(capsys, ["build", str(one), str(tmp_path / "o"), *env["args"]])
    assert "has 1 item; an index needs at least 2" in line
    assert not (tmp_path / "o").exists()


def test_build_lone_surrogate_names_file_and_line(env, tmp_path, capsys):
    bad = tmp_path / "s.jsonl"
    bad.write_text('{"id": "a", "text": "ok"}\n{"id": "b", "text": "x \\ud800 y"}\n')
    line = _one_line_error(capsys, ["build", str(bad), str(tmp_path / "o"), *env["args"]])
    assert f"{bad}:2:" in line and "U+D800" in line
    assert not (tmp_path / "o").exists()


def test_non_utf8_corpus_names_file_and_line(env, tmp_path, capsys):
    bad = tmp_path / "b.jsonl"
    bad.write_bytes(b'{"id": "a", "text": "ok"}\n{"id": "b", "text": "\xff"}\n')
    for argv in (["build", str(bad), str(tmp_path / "o")], ["rank", "q", "--corpus", str(bad)]):
        assert f"{bad}:2: not UTF-8" in _one_line_error(capsys, argv)


def test_build_reads_a_corpus_from_a_pipe(env, tmp_path):
    import os
    import threading

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    data = env["corpus"].read_bytes()

    def feed():
        with open(fifo, "wb") as f:
            f.write(data)

    t = threading.Thread(target=feed)
    t.start()
    assert main(["build", str(fifo), str(tmp_path / "o"), *env["args"]]) == 0
    t.join()
    assert (tmp_path / "o" / "index.json").is_file()


def test_pickled_exact_cache_file_is_rescored(env, capsys):
    exact = env["idx"] / "exact"
    assert main(["search", str(env["idx"]), "topic", "-k", "2", "--budget", "5", "--exact"]) == 0
    files = list(exact.glob("exact-*.npy"))
    assert files
    np.save(files[0], np.array([{"a": 1}], dtype=object), allow_pickle=True)
    capsys.readouterr()
    assert main(["search", str(env["idx"]), "topic", "-k", "2", "--budget", "5", "--exact"]) == 0
    assert np.load(files[0], allow_pickle=False).dtype == np.float32


# -- #28: the second reliability pass ------------------------------------------------------------


def _tiny_hf(path, *, classifier: bool, tokenizer: bool = True):
    """A tiny random BERT checkpoint (classifier or bare encoder), with MiniLM's tokenizer."""
    import shutil

    import torch
    import transformers

    from crossknn.ce.models import minilm_checkpoint_dir

    cfg = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
        num_labels=1,
    )
    torch.manual_seed(0)
    cls = transformers.BertForSequenceClassification if classifier else transformers.BertModel
    cls(cfg).eval().save_pretrained(str(path))
    if tokenizer:
        for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
            shutil.copyfile(minilm_checkpoint_dir() / name, path / name)
    return path


def test_export_without_tokenizer_files_is_refused_naming_them(tmp_path, capsys):
    """#28 item 5: before, rc 0 with a 5-token vocabulary (every word [UNK])."""
    hf = _tiny_hf(tmp_path / "hf", classifier=True, tokenizer=False)
    line = _one_line_error(capsys, ["export", str(hf), str(tmp_path / "out")])
    assert "no tokenizer files" in line and "tokenizer.json" in line and "vocab.txt" in line
    assert not (tmp_path / "out").exists()


def test_export_of_weights_of_another_architecture_is_refused_naming_them(tmp_path, capsys):
    """#28 item 5: a config naming GPT2LMHeadModel over BERT weights; before, rc 0 with
    "newly initialized" weights."""
    hf = _tiny_hf(tmp_path / "hf", classifier=True)
    cfg = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "n_layer": 1,
        "n_embd": 32,
        "n_head": 4,
        "n_positions": 128,
        "vocab_size": 30522,
    }
    (hf / "config.json").write_text(json.dumps(cfg))
    line = _one_line_error(capsys, ["export", str(hf), str(tmp_path / "out"), "--kind", "emb"])
    assert "do not match" in line and "GPT2LMHeadModel" in line
    assert "missing (would be newly initialized)" in line and "unexpected" in line
    assert not (tmp_path / "out").exists()


def test_export_of_a_bare_encoder_as_cls_names_the_new_head(tmp_path, capsys):
    hf = _tiny_hf(tmp_path / "hf", classifier=False)
    line = _one_line_error(capsys, ["export", str(hf), str(tmp_path / "o"), "--kind", "cls"])
    assert "classifier.weight" in line and "newly initialized" in line


def test_truncated_safetensors_is_one_line_from_export_and_build(tmp_path, capsys, model_cache):
    """#28 item 8: before, a SafetensorError traceback."""
    hf = _tiny_hf(tmp_path / "hf", classifier=True)
    weights = hf / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    line = _one_line_error(capsys, ["export", str(hf), str(tmp_path / "out")])
    assert f"{weights}: not a readable safetensors file, truncated or corrupt" in line
    corpus = _write_corpus(tmp_path / "c.jsonl")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CROSSKNN_CACHE", str(tmp_path / "cache"))
        argv = ["build", str(corpus), str(tmp_path / "idx"), "--model", str(hf), "--quiet"]
        line = _one_line_error(capsys, argv)
    assert "model.safetensors: not a readable safetensors file" in line
    assert not (tmp_path / "idx").exists()


def test_export_refusal_names_the_flag_to_cli_users(tmp_path, capsys):
    """#28 item 14: before, the CLI said "pass overwrite=True"."""
    from crossknn.ce.export import export_cross_encoder

    hf = _tiny_hf(tmp_path / "hf", classifier=True)
    out = tmp_path / "out"
    out.mkdir()
    (out / "x").write_text("x")
    line = _one_line_error(capsys, ["export", str(hf), str(out)])
    assert "--overwrite" in line and "overwrite=True" not in line
    with pytest.raises(FileExistsError, match="overwrite=True"):
        export_cross_encoder(hf, out, max_length=64)


def _matrix(folder, de_row0: float):
    from crossknn.matrix import make_splits, save_score_matrix

    rng = np.random.default_rng(0)
    nq, n = 12, 30
    dq = rng.normal(size=(nq, 8)).astype(np.float32)
    dq[0] = de_row0
    save_score_matrix(
        folder,
        rng.normal(size=(nq, n)).astype(np.float32),
        [f"q{i}" for i in range(nq)],
        [f"d{i}" for i in range(n)],
        make_splits(nq, 4, 0),
        {"dataset": "x", "ce": {"model_id": "a", "model_hash": "b"}},
        de_queries=dq,
        de_items=rng.normal(size=(n, 8)).astype(np.float32),
    )
    return folder


def test_eval_with_a_huge_de_row_names_the_overflow(tmp_path, capsys):
    """#28 item 14: before, "CE scores do not depend on the approximate scores"."""
    m = _matrix(tmp_path / "m", 1e38)
    argv = ["eval", str(m), "--method", "axn", "--budget", "10", "--k", "1", "--quiet"]
    line = _one_line_error(capsys, [*argv, "--json", str(tmp_path / "r.json"), "--no-plot"])
    assert "de_queries.npy: row 0 ('q0')" in line and "overflow float32" in line
    assert "do not depend" not in line
    assert not (tmp_path / "r.json").exists()


def test_score_map_fit_says_what_is_wrong():
    from crossknn.score_map import ScoreMap

    y = np.ones((2, 3))
    with pytest.raises(ValueError, match="approximate scores include inf or NaN"):
        ScoreMap.fit(y, np.array([[1.0, 2.0, np.inf], [1.0, 2.0, 3.0]]))
    with pytest.raises(ValueError, match="CE scores include inf or NaN"):
        ScoreMap.fit(np.array([[1.0, np.nan, 0.0], [0.0, 1.0, 2.0]]), y + np.arange(3))
    with pytest.raises(ValueError, match="do not depend"):
        ScoreMap.fit(y, np.arange(6.0).reshape(2, 3))


def test_train_ce_refuses_a_qrels_line_without_its_score(tmp_path, capsys):
    """#28 item 12: before, the line was dropped silently (its query lost a positive)."""
    ds = tmp_path / "ds"
    ds.mkdir()
    (ds / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": f"d{i}", "text": f"doc {i}"}) + "\n" for i in range(20))
    )
    (ds / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": f"q{i}", "text": f"query {i}"}) + "\n" for i in range(4))
    )
    (ds / "qrels").mkdir()
    tsv = ds / "qrels" / "train.tsv"
    tsv.write_text("query-id\tcorpus-id\tscore\nq0\td0\t1\nq1\td1\nq2\td2\t1\n\n")
    line = _one_line_error(capsys, ["train-ce", str(ds), str(tmp_path / "out")])
    assert f"{tsv}:3: expected 3 tab-separated columns (query-id, corpus-id, score)" in line
    assert line.endswith("got 2")
    assert not (tmp_path / "out").exists()
