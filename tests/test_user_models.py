"""A user's own models end to end: Hugging Face folders -> export -> build -> search --beir.

Everything is made here, in temporary folders: a WordPiece tokenizer (``tokenizers``), a tiny
randomly initialised ``BertForSequenceClassification`` ([CLS]-CE), a tiny ``BertModel`` ([EMB]-CE,
``--kind emb``), a tiny sentence-transformers-style DE folder, and a small BEIR folder. The run
file must parse as TREC, the metrics must equal ``ir_measures`` on that run, and every returned
score must equal the PyTorch model's output (sigmoid of its logit) to 1e-4.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from shared_fixtures import lazy_importorskip

torch = lazy_importorskip("torch")
transformers = lazy_importorskip("transformers")
ir_measures = pytest.importorskip("ir_measures")

from crossknn.cli import main  # noqa: E402
from shared_fixtures import torch_cls_logits  # noqa: E402

WORDS = (
    "library catalog index citation retrieval query document search ranking relevance paper "
    "journal author abstract title subject classification system user information science data "
    "model text word term vector score evaluation precision recall test collection book reader"
).split()
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
N_DOCS, N_QUERIES = 24, 5
K, BUDGET = 5, 10


def _tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab = {w: i for i, w in enumerate(SPECIAL + sorted(set(WORDS)))}
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    tok.decoder = decoders.WordPiece()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    fast.save_pretrained(str(folder))


def _config(**kw):
    return transformers.BertConfig(
        vocab_size=len(SPECIAL) + len(set(WORDS)),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
        **kw,
    )


def _save(model, folder: Path) -> Path:
    folder.mkdir(parents=True)
    model.eval().save_pretrained(str(folder))
    _tokenizer(folder)
    return folder


def _st_folder(folder: Path) -> Path:
    """A sentence-transformers layout: encoder at the root, 1_Pooling (mean), Normalize."""
    torch.manual_seed(2)
    _save(transformers.BertModel(_config()), folder)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
        {
            "idx": 2,
            "name": "2",
            "path": "2_Normalize",
            "type": "sentence_transformers.models.Normalize",
        },
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    pooling = {"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True}
    pooling |= {"pooling_mode_cls_token": False, "pooling_mode_max_tokens": False}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 64}))
    return folder


def _beir(folder: Path) -> dict:
    rng = np.random.default_rng(0)
    docs = {f"d{i}": " ".join(rng.choice(WORDS, 12)) for i in range(N_DOCS)}
    queries = {f"q{i}": " ".join(rng.choice(WORDS, 3)) for i in range(N_QUERIES + 1)}
    qrels = {
        f"q{i}": {f"d{(3 * i + j) % N_DOCS}": 1 + j % 2 for j in range(3)} for i in range(N_QUERIES)
    }
    (folder / "qrels").mkdir(parents=True)
    with (folder / "corpus.jsonl").open("w") as fh:
        for i, (d, t) in enumerate(docs.items()):
            fh.write(json.dumps({"_id": d, "title": "" if i % 2 else "paper", "text": t}) + "\n")
    with (folder / "queries.jsonl").open("w") as fh:
        for q, t in queries.items():  # the last query has no qrels: not searched
            fh.write(json.dumps({"_id": q, "text": t}) + "\n")
    with (folder / "qrels" / "test.tsv").open("w") as fh:
        fh.write("query-id\tcorpus-id\tscore\n")
        for q, rel in qrels.items():
            for d, g in rel.items():
                fh.write(f"{q}\t{d}\t{g}\n")
    return {"docs": docs, "queries": queries, "qrels": qrels}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("user-models")
    mp = pytest.MonkeyPatch()
    mp.setenv("CROSSKNN_CACHE", str(root / "cache"))
    torch.manual_seed(0)
    ce_hf = _save(transformers.BertForSequenceClassification(_config(num_labels=1)), root / "my-ce")
    torch.manual_seed(1)
    emb_hf = _save(transformers.BertModel(_config()), root / "my-emb")
    de_st = _st_folder(root / "my-de")
    data = _beir(root / "beir")
    yield {"root": root, "ce_hf": ce_hf, "emb_hf": emb_hf, "de_st": de_st, "data": data}
    mp.undo()


@pytest.fixture(scope="module")
def built(world):
    """export (kind inferred) -> build --model --de-model: the user's path, through the CLI."""
    root = world["root"]
    assert main(["export", str(world["ce_hf"]), str(root / "ce-onnx")]) == 0
    manifest = json.loads((root / "ce-onnx" / "crossknn_model.json").read_text())
    assert manifest["kind"] == "cls-ce" and manifest["model_id"] == "my-ce"
    args = ["build", str(root / "beir"), str(root / "index"), "--quiet"]
    args += ["--model", str(root / "ce-onnx"), "--de-model", str(world["de_st"])]
    args += ["--calibration-queries", "4", "--calibration-items", "8"]
    assert main(args) == 0
    return root / "index"


def _torch_ce(ckpt: Path, pairs) -> np.ndarray:
    logits = torch_cls_logits(ckpt, pairs, 128)[:, 0].astype(np.float64)
    return 1.0 / (1.0 + np.exp(-logits))


def test_export_build_search_beir_run_metrics_and_scores(world, built, capsys):
    from crossknn.data import load_corpus

    root, data = world["root"], world["data"]
    run, first, metrics = root / "run.trec", root / "de.trec", root / "metrics.json"
    args = ["search", str(built), "--beir", str(root / "beir"), "--run", str(run)]
    args += ["--first-stage-run", str(first), "--metrics", str(metrics)]
    args += ["-k", str(K), "--budget", str(BUDGET), "--json", "--quiet"]
    capsys.readouterr()
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    # queries of the test split, ids kept (q5 has no qrels)
    assert [h["qid"] for h in out["hits"]] == list(data["qrels"])
    assert out["models"]["ce"]["model_id"] == "my-ce" and out["precision"] == "fp32"
    assert out["models"]["de"]["model_id"] == "my-de" and out["method"] == "axn"
    # the run file: 6 columns, ranks 1..k, tag = method + budget, the same ids as the JSON
    lines = [line.split() for line in run.read_text().splitlines()]
    assert all(len(c) == 6 and c[1] == "Q0" and c[5] == f"crossknn-axn-B{BUDGET}" for c in lines)
    for h in out["hits"]:
        mine = [c for c in lines if c[0] == h["qid"]]
        assert [int(c[3]) for c in mine] == list(range(1, K + 1))
        assert [c[2] for c in mine] == [r["id"] for r in h["results"]]
        assert h["ce_calls"] <= BUDGET and h["ce_s"] > 0 and h["other_s"] >= 0
    # metrics = ir_measures on the run file, independently read
    from ir_measures import RR, nDCG

    qrels = list(ir_measures.util.QrelsConverter(data["qrels"]).as_namedtuple_iter())
    want = ir_measures.calc_aggregate(
        [nDCG @ 10, RR @ 10], qrels, ir_measures.read_trec_run(str(run))
    )
    got = json.loads(metrics.read_text())
    assert got["run"]["nDCG@10"] == pytest.approx(want[nDCG @ 10], abs=1e-9)
    assert got["run"]["RR@10"] == pytest.approx(want[RR @ 10], abs=1e-9)
    assert "R@100" not in got["run"]  # k < 100
    want_de = ir_measures.calc_aggregate([nDCG @ 10], qrels, ir_measures.read_trec_run(str(first)))
    assert got["first_stage"]["nDCG@10"] == pytest.approx(want_de[nDCG @ 10], abs=1e-9)
    assert got["run"]["ce_calls_per_query"] == np.mean([h["ce_calls"] for h in out["hits"]])
    # the scores are the PyTorch model's (sigmoid of the logit) on (query, item text)
    corpus = load_corpus(root / "beir")
    text = dict(zip(corpus.ids, corpus.texts, strict=True))
    pairs, scores = [], []
    for h in out["hits"]:
        for r in h["results"]:
            pairs.append((data["queries"][h["qid"]], text[r["id"]]))
            scores.append(r["score"])
    np.testing.assert_allclose(scores, _torch_ce(world["ce_hf"], pairs), atol=1e-4, rtol=0)
    # crossknn evaluate gives the same numbers for both runs
    capsys.readouterr()
    qrels_file = str(root / "beir" / "qrels" / "test.tsv")
    assert main(["evaluate", str(run), str(first), "--qrels", qrels_file, "--json"]) == 0
    ev = json.loads(capsys.readouterr().out)["runs"]
    assert ev[str(run)]["nDCG@10"] == pytest.approx(got["run"]["nDCG@10"], abs=1e-12)
    assert ev[str(first)]["nDCG@10"] == pytest.approx(got["first_stage"]["nDCG@10"], abs=1e-12)


def test_index_records_models_and_search_reopens_them(world, built, capsys):
    import crossknn
    from crossknn.ce.export import checkpoint_hash

    idx = crossknn.open_index(built)
    ce, de = idx.info["models"]["ce"], idx.info["models"]["de"]
    assert ce["precision"] == "fp32" and ce["kind"] == "cls-ce" and not ce["embedded"]
    assert Path(ce["path"]) == (world["root"] / "ce-onnx").resolve()
    assert ce["source"] == str(world["ce_hf"])
    assert de["kind"] == "dual-encoder" and de["model_id"] == "my-de"
    # the DE was exported from the sentence-transformers folder into the cache, keyed by a hash
    assert Path(de["path"]).parent == world["root"] / "cache" / "models"
    assert checkpoint_hash(world["de_st"])[:4]  # the DE folder is a checkpoint
    # search without --model reopens both; the text output has the ids, aligned
    capsys.readouterr()
    q = ["--queries", str(world["root"] / "beir" / "queries.jsonl")]
    assert main(["search", str(built), *q, "-k", "3", "--budget", "6", "--quiet"]) == 0
    assert main(["search", str(built), "library search", "-k", "3", "--budget", "6"]) == 0
    text = capsys.readouterr().out
    assert "query [1] library search" in text and " d" in text


def test_search_refuses_another_model_naming_the_field(world, built, capsys):
    root = world["root"]
    # another model (id differs)
    assert main(["export", str(world["emb_hf"]), str(root / "emb-onnx")]) == 0
    manifest = json.loads((root / "emb-onnx" / "crossknn_model.json").read_text())
    assert manifest["kind"] == "joint-ce"  # a bare encoder: [EMB] CE, inferred
    capsys.readouterr()
    assert (
        main(
            [
                "search",
                str(built),
                "q",
                "--model",
                str(root / "emb-onnx"),
                "--budget",
                "5",
                "-k",
                "3",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "CE model 'my-ce'" in err and "model 'my-emb'" in err
    # the same checkpoint exported differently: the hash differs
    assert main(["export", str(world["ce_hf"]), str(root / "ce-opt"), "--optimize"]) == 0
    assert (
        main(
            ["search", str(built), "q", "--model", str(root / "ce-opt"), "--budget", "5", "-k", "3"]
        )
        == 2
    )
    assert "CE hash" in capsys.readouterr().err
    # another precision
    assert main(["search", str(built), "q", "--precision", "int8", "--budget", "5", "-k", "3"]) == 2
    err = capsys.readouterr().err
    assert "precision 'fp32'" in err and "precision 'int8'" in err
    # the Hugging Face folder itself is accepted as --model (exported into the cache: the same
    # export, so the same hash)
    assert (
        main(
            ["search", str(built), "q", "--model", str(world["ce_hf"]), "--budget", "5", "-k", "3"]
        )
        == 0
    )


def test_int8_index_from_a_hugging_face_folder(world, capsys):
    root = world["root"]
    idx = root / "index-int8"
    args = ["build", str(root / "beir"), str(idx), "--quiet", "--precision", "int8"]
    args += ["--model", str(world["ce_hf"]), "--de-model", str(world["de_st"])]
    args += ["--calibration-queries", "2", "--calibration-items", "4", "--batch-size", "4"]
    assert main(args) == 0
    capsys.readouterr()
    args = ["search", str(idx), "library", "-k", "3", "--budget", "6", "--json", "--threads", "1"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["precision"] == "int8" and out["models"]["ce"]["precision"] == "int8"
    assert out["models"]["ce"]["source"] == str(world["ce_hf"])
    assert main(["search", str(idx), "library", "--precision", "fp32", "--budget", "6"]) == 2
    assert "precision 'int8'" in capsys.readouterr().err


def test_exact_reports_scores_and_missed_ids(world, built, capsys):
    args = ["search", str(built), "library search", "-k", "3", "--budget", "6", "--exact"]
    args += ["--rounds", "2"]
    assert main([*args, "--json", "--quiet"]) == 0
    h = json.loads(capsys.readouterr().out)["hits"][0]
    ex = h["exact"]
    assert len(ex["ids"]) == 3 and len(ex["scores"]) == 3
    assert ex["scores"] == sorted(ex["scores"], reverse=True)
    assert ex["missed_ids"] == [i for i in ex["ids"] if i not in [r["id"] for r in h["results"]]]
    assert ex["recall"] == pytest.approx(1 - len(ex["missed_ids"]) / 3)


def test_sentence_transformers_compatible_api(world, built):
    from crossknn.ce import OnnxCrossEncoder, OnnxDualEncoder
    from crossknn.ce.folders import resolve_model

    ce = OnnxCrossEncoder(world["root"] / "ce-onnx")
    pairs = [("library search", "a paper about search"), ("data", "vector model")]
    many = ce.predict(pairs, batch_size=1, show_progress_bar=False)
    one = ce.predict(pairs[0])
    assert np.ndim(one) == 0 and one == pytest.approx(many[0], abs=1e-6)
    np.testing.assert_allclose(many, _torch_ce(world["ce_hf"], pairs), atol=1e-4, rtol=0)
    docs = ["vector model", "a paper about search", "book reader"]
    ranked = ce.rank("library search", docs, doc_ids=["a", "b", "c"], return_documents=True)
    assert {r["id"] for r in ranked} == {"a", "b", "c"}
    assert all(docs[r["corpus_id"]] == r["text"] for r in ranked)
    with pytest.raises(ValueError, match="differ in length"):
        ce.rank("q", docs, doc_ids=["a"])
    # the DE of the sentence-transformers folder = mean pooling + L2 normalization in PyTorch
    de = OnnxDualEncoder(resolve_model(world["de_st"], role="de"))
    texts = ["library catalog", "the relevance of a document to a query in a test collection"]
    tok = transformers.AutoTokenizer.from_pretrained(str(world["de_st"]), local_files_only=True)
    model = transformers.AutoModel.from_pretrained(str(world["de_st"]), local_files_only=True)
    enc = tok(texts, padding=True, truncation=True, max_length=64, return_tensors="pt")
    with torch.no_grad():
        h = model.eval()(**enc).last_hidden_state
    m = enc["attention_mask"].unsqueeze(-1).float()
    v = (h * m).sum(1) / m.sum(1)
    v = (v / v.norm(dim=-1, keepdim=True)).numpy()
    np.testing.assert_allclose(de.encode(texts), v, atol=1e-4, rtol=0)
    assert de.max_length == 64  # from sentence_bert_config.json
    # Searcher.search takes batch_size and show_progress_bar; query ids pass through
    import crossknn

    s = crossknn.Searcher(built)
    hits = s.search(
        ["library", "data"],
        k=2,
        budget=6,
        rounds=2,
        batch_size=2,
        show_progress_bar=False,
        query_ids=["x", "y"],
    )
    assert [h.qid for h in hits] == ["x", "y"]


def test_user_errors_are_one_line(world, tmp_path, capsys, monkeypatch):
    root = world["root"]
    # missing model folder
    assert main(["export", str(tmp_path / "nope"), str(tmp_path / "o")]) == 2
    assert "not found" in capsys.readouterr().err
    corpus = str(root / "beir")
    assert main(["rank", "q", "--corpus", corpus, "--model", str(tmp_path / "nope")]) == 2
    assert "CE model folder not found" in capsys.readouterr().err
    # a folder with a config but no weights
    empty = tmp_path / "no-weights"
    empty.mkdir()
    (empty / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    assert main(["export", str(empty), str(tmp_path / "o")]) == 2
    assert "no weights" in capsys.readouterr().err
    assert main(["rank", "q", "--corpus", corpus, "--model", str(empty)]) == 2
    assert "no weights" in capsys.readouterr().err
    # neither a crossknn nor a Hugging Face folder
    assert main(["rank", "q", "--corpus", corpus, "--model", str(tmp_path)]) == 2
    assert "neither" in capsys.readouterr().err
    # an unsupported architecture
    lm = tmp_path / "lm"
    torch.manual_seed(0)
    _save(transformers.BertForMaskedLM(_config()), lm)
    assert main(["export", str(lm), str(tmp_path / "o")]) == 2
    assert "unsupported architecture ['BertForMaskedLM']" in capsys.readouterr().err
    assert main(["rank", "q", "--corpus", corpus, "--model", str(lm)]) == 2
    assert "unsupported architecture" in capsys.readouterr().err
    # a provider this onnxruntime does not offer: said so, with the ones it has
    from crossknn.ce import runtime

    monkeypatch.setattr(runtime, "available_providers", lambda: ["CPUExecutionProvider"])
    args = ["rank", "q", "--corpus", corpus, "--model", str(root / "ce-onnx")]
    assert main([*args, "--provider", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "CUDAExecutionProvider" in err and "only ['CPUExecutionProvider']" in err
    assert "crossknn[gpu]" in err
    # an int8 precision the folder was not exported with
    assert main([*args, "--precision", "int8"]) == 2
    assert "no 'int8' variant" in capsys.readouterr().err
    # --metrics without qrels
    assert main(["search", "idx", "q", "--metrics", str(tmp_path / "m.json")]) == 2
    assert "needs relevance judgments" in capsys.readouterr().err


def test_rank_with_an_emb_kind_and_a_hugging_face_folder(world, capsys):
    root = world["root"]
    corpus = str(root / "beir")
    assert (
        main(["rank", "library", "--corpus", corpus, "--model", str(world["emb_hf"]), "--json"])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["model_id"] == "my-emb" and len(out["results"]) == 10
    assert all(r["id"].startswith("d") for r in out["results"])
    # --kind emb on a classifier checkpoint: its encoder as an [EMB] CE
    assert main(["export", str(world["ce_hf"]), str(root / "ce-as-emb"), "--kind", "emb"]) == 0
    manifest = json.loads((root / "ce-as-emb" / "crossknn_model.json").read_text())
    assert manifest["kind"] == "joint-ce"


def test_searcher_takes_sentence_transformers_names(built):
    """top_k for k, return_documents, one query string -> one Hits (a list -> a list)."""
    import crossknn

    s = crossknn.Searcher(built)
    one = s.search("library", top_k=3, budget=6, rounds=2)
    assert isinstance(one, crossknn.Hits) and len(one.ids) == 3 and len(one.texts) == 3
    same = s.search(["library"], k=3, budget=6, rounds=2)
    assert isinstance(same, list) and same[0].ids == one.ids
    bare = s.search(["library", "data"], top_k=2, budget=6, rounds=2, return_documents=False)
    assert [len(h.ids) for h in bare] == [2, 2] and all(h.texts == [] for h in bare)
    ten = s.search("library", budget=12, rounds=2)  # default k: 10, as with k=10
    assert len(ten.ids) == 10 and ten.ids == s.search("library", k=10, budget=12, rounds=2).ids
    with pytest.raises(ValueError, match="k=3 and top_k=4 disagree"):
        s.search("library", k=3, top_k=4, budget=6)
