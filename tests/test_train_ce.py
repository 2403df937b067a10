"""``crossknn train-ce``: training lowers the loss for every kind and loss, resume is bitwise,
the exported ONNX model scores like the PyTorch one, the folder loads as a crossknn CE, errors.

Everything runs on a tiny randomly initialized BERT with a WordPiece tokenizer built here and a
BEIR folder of a few dozen items written here (topics of made-up words: a query's positives share
its topic words).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from shared_fixtures import lazy_importorskip

torch = lazy_importorskip("torch")
transformers = lazy_importorskip("transformers")

from crossknn.cli import main  # noqa: E402
from shared_fixtures import lazy_module  # noqa: E402

# training imports torch: imported when a test first uses it
ck_train = lazy_module("crossknn.train")
ck_checkpoint = lazy_module("crossknn.train.checkpoint")

TOPICS = 8
WORDS = [f"w{t}x{k}" for t in range(TOPICS) for k in range(6)] + [f"filler{k}" for k in range(10)]
# the export traces with token ids from 1000 up (ce/graphs.py): the vocabulary is padded to 1100
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
VOCAB += [f"[unused{i}]" for i in range(1100 - len(VOCAB))]


def _tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(VOCAB)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
    )
    tok.save(str(path / "tokenizer.json"))


def _base(path: Path) -> Path:
    cfg = transformers.BertConfig(
        vocab_size=len(VOCAB),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    transformers.BertModel(cfg).save_pretrained(str(path))
    _tokenizer(path)
    return path


def _beir(path: Path) -> Path:
    rng = np.random.default_rng(0)
    items, queries, qrels = [], [], []
    for t in range(TOPICS):
        for k in range(5):
            words = rng.choice(6, size=3, replace=False)
            text = " ".join([f"w{t}x{w}" for w in words] + [f"filler{rng.integers(10)}"])
            items.append({"_id": f"d{t}-{k}", "title": "", "text": text})
        for k in range(3):
            queries.append({"_id": f"q{t}-{k}", "text": f"w{t}x{k} w{t}x{k + 3}"})
            for d in range(5):
                if f"w{t}x{k}" in items[t * 5 + d]["text"]:
                    qrels.append(f"q{t}-{k}\td{t}-{d}\t1")
    queries.append({"_id": "lonely", "text": "filler1"})  # in the qrels, but no positive
    qrels.append("lonely\td0-0\t0")
    (path / "qrels").mkdir(parents=True)
    for name, rows in (("corpus", items), ("queries", queries)):
        (path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(qrels))
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from crossknn.ce.export import export_dual_encoder

    root = tmp_path_factory.mktemp("train-ce")
    base = _base(root / "base")
    de = root / "de"
    export_dual_encoder(base, de, max_length=32)
    return {"root": root, "base": base, "de": de, "data": _beir(root / "beir")}


def _cfg(**kw) -> ck_train.TrainConfig:
    d = dict(
        max_steps=24,
        batch_size=4,
        lr=2e-3,
        max_length=32,
        negatives=8,
        group_size=4,
        random_negatives=1,
        dev_fraction=0.2,
        eval_every=8,
        checkpoint_every=8,
        patience=100,
        threads=1,
    )
    d.update(kw)
    return ck_train.TrainConfig(**d)


def _train(setup, out, cfg, **kw):
    """Train with the checkpoints kept in OUT/train (the tests read them)."""
    kw = {"work_dir": out / "train", "keep_checkpoints": True, **kw}
    return ck_train.train_cross_encoder(
        setup["data"],
        out,
        cfg,
        base=setup["base"],
        de=setup["de"],
        progress=False,
        cache_dir=setup["root"] / "cache",
        **kw,
    )


def _teacher_matrix(setup) -> Path:
    """A score matrix over all queries x items: the share of the query's words in the item."""
    from crossknn.data import load_beir
    from crossknn.matrix import make_splits, save_score_matrix

    beir = load_beir(setup["data"])
    s = np.array(
        [[len(set(q.split()) & set(d.split())) for d in beir.item_texts] for q in beir.query_texts],
        dtype=np.float32,
    )
    folder = setup["root"] / "teacher"
    if not (folder / "meta.json").is_file():
        save_score_matrix(
            folder,
            s,
            beir.query_ids,
            beir.item_ids,
            make_splits(len(s), 4, 0),
            {"model": "overlap"},
        )
    return folder


@pytest.mark.parametrize("kind", ["cls", "emb"])
@pytest.mark.parametrize("loss", ["bce", "listwise", "distill"])
def test_training_lowers_the_loss(setup, tmp_path, kind, loss):
    teacher = _teacher_matrix(setup) if loss == "distill" else None
    cfg = _cfg(kind=kind, loss=loss, max_steps=48, eval_every=16)
    rec = _train(setup, tmp_path / "m", cfg, teacher=teacher)
    losses = ck_checkpoint.load_state(tmp_path / "m" / "train" / "checkpoint.pt")["losses"]
    assert rec["steps"] == 48 and len(losses) == 48
    first, last = np.mean(losses[:8]), np.mean(losses[-8:])
    assert last < 0.9 * first, (first, last)
    assert rec["queries"]["skipped"] == {"no positive in the qrels": 1}
    curve = json.loads((tmp_path / "m" / "dev_curve.json").read_text())
    assert [r["step"] for r in curve] == [0, 16, 32, 48]
    assert rec["selected_step"] in (0, 16, 32, 48)
    assert rec["dev_ndcg@10"] == max(r["ndcg@10"] for r in curve)
    assert 0.0 <= rec["dev_de"]["ndcg@10"] <= 1.0


@pytest.mark.parametrize("kind", ["cls", "emb"])
def test_bf16_training_lowers_the_loss_and_exports_float32(setup, tmp_path, kind):
    import onnx

    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("this CPU has no bfloat16 support")
    cfg = _cfg(kind=kind, loss="listwise", max_steps=48, eval_every=16, bf16=True)
    rec = _train(setup, tmp_path / "m", cfg)
    losses = ck_checkpoint.load_state(tmp_path / "m" / "train" / "checkpoint.pt")["losses"]
    assert np.mean(losses[-8:]) < 0.9 * np.mean(losses[:8])
    assert rec["config"]["bf16"] is True
    # the master weights and the exported graph stay float32
    state = ck_checkpoint.load_state(tmp_path / "m" / "train" / "checkpoint.pt")["model"]
    assert {t.dtype for t in state.values() if t.is_floating_point()} == {torch.float32}
    graph = onnx.load(str(tmp_path / "m" / "model.onnx")).graph
    assert {t.data_type for t in graph.initializer} <= {
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.INT64,
    }
    # mixed precision trains something else: its checkpoint is not resumed as a float32 run
    with pytest.raises(ValueError, match="other training settings"):
        _train(
            setup,
            tmp_path / "m",
            _cfg(kind=kind, loss="listwise", max_steps=48, eval_every=16),
            resume=True,
        )


def test_dev_reference_is_the_de_order():
    from crossknn.train.dev import de_order_metrics

    # mined order 5, 3, 9: the one relevant item sits second
    m = de_order_metrics(np.array([[5, 3, 9], [7, 8, 1]]), [{3: 1}, {7: 2}])
    assert m["rr@10"] == pytest.approx((0.5 + 1.0) / 2)
    assert m["ndcg@10"] == pytest.approx((1 / np.log2(3) + 1.0) / 2)


def test_resume_is_bitwise(setup, tmp_path):
    cfg = _cfg(kind="emb", loss="listwise", max_steps=12, checkpoint_every=4, eval_every=4)
    _train(setup, tmp_path / "a", cfg)

    class Killed(Exception):
        pass

    def kill(step, loss):
        if step == 6:  # after the checkpoint at 4: steps 5 and 6 are lost
            raise Killed

    with pytest.raises(Killed):
        _train(setup, tmp_path / "b", cfg, on_step=kill)
    assert ck_checkpoint.load_state(tmp_path / "b" / "train" / "checkpoint.pt")["step"] == 4
    with pytest.raises(FileExistsError, match="--resume"):
        _train(setup, tmp_path / "b", cfg)
    _train(setup, tmp_path / "b", cfg, resume=True)
    a = ck_checkpoint.load_state(tmp_path / "a" / "train" / "checkpoint.pt")
    b = ck_checkpoint.load_state(tmp_path / "b" / "train" / "checkpoint.pt")
    assert a["losses"] == b["losses"] and a["curve"] == b["curve"]
    for name, t in a["model"].items():
        assert torch.equal(t, b["model"][name]), name
    assert (tmp_path / "a" / "model.onnx").read_bytes() == (
        tmp_path / "b" / "model.onnx"
    ).read_bytes()
    with pytest.raises(ValueError, match="other training settings"):
        _train(setup, tmp_path / "b", _cfg(kind="emb", loss="listwise", max_steps=13), resume=True)


def test_resume_goes_past_a_spent_time_budget(setup, tmp_path):
    cfg = _cfg(kind="emb", loss="listwise", max_steps=8, checkpoint_every=4, eval_every=4)
    _train(setup, tmp_path / "a", cfg)
    # the step-0 dev evaluation counts in the budget: one it spends stops the run before the
    # first step (checkpointed); resuming with no budget goes on
    _train(setup, tmp_path / "b", _cfg(**{**cfg.as_dict(), "max_minutes": 1e-9}))
    b1 = json.loads((tmp_path / "b" / "training.json").read_text())
    assert b1["steps"] == 0 and b1["stopped"].startswith("time budget")
    assert "step-0 dev evaluation" in b1["stopped"]
    _train(setup, tmp_path / "b", cfg, resume=True)
    b = ck_checkpoint.load_state(tmp_path / "b" / "train" / "checkpoint.pt")
    a = ck_checkpoint.load_state(tmp_path / "a" / "train" / "checkpoint.pt")
    assert b["step"] == 8 and b["stopped"] is None
    assert a["losses"] == b["losses"]
    for name, t in a["model"].items():
        assert torch.equal(t, b["model"][name]), name


@pytest.mark.parametrize("kind", ["cls", "emb"])
def test_export_matches_torch_and_loads(setup, tmp_path, kind):
    from crossknn.ce import OnnxCrossEncoder
    from crossknn.ce.manifest import read_manifest
    from crossknn.data import load_beir
    from crossknn.train.scorer import PairEncoder, TrainableCE

    out = tmp_path / "m"
    _train(setup, out, _cfg(kind=kind, loss="listwise", max_steps=8, int8=True))
    manifest = read_manifest(out)
    assert manifest["kind"] == ("cls-ce" if kind == "cls" else "joint-ce")
    assert set(manifest["variants"]) == {"fp32", "int8"}
    beir = load_beir(setup["data"])
    ce = OnnxCrossEncoder(out, items=beir.item_texts)
    q = beir.query_texts[:5]
    onnx = np.stack(ce.score_batch(q, [list(range(len(beir.item_texts)))] * len(q)))
    # the same weights in PyTorch: the exported Hugging Face checkpoint, scored by the training code
    model = TrainableCE(out / "train" / "hf", kind, loss="listwise").eval()
    enc = PairEncoder(out / "tokenizer.json", 32, q, beir.item_texts)
    qi = np.repeat(np.arange(len(q)), len(beir.item_texts))
    ii = np.tile(np.arange(len(beir.item_texts)), len(q))
    with torch.no_grad():
        ref = enc.score(model, qi, ii, "cpu", 4096).numpy().reshape(onnx.shape)
    np.testing.assert_allclose(onnx, ref, atol=1e-4)
    assert np.ptp(ref) > 1e-3  # not a constant model
    # the CLI loads it as any exported CE
    rc = main(
        [
            "rank",
            beir.query_texts[0],
            "--corpus",
            str(setup["data"]),
            "--model",
            str(out),
            "--json",
            "--top-k",
            "3",
        ]
    )
    assert rc == 0


def test_cli_trains_both_kinds(setup, tmp_path, capsys):
    for kind in ("cls", "emb"):
        out = tmp_path / kind
        rc = main(
            [
                "train-ce",
                str(setup["data"]),
                str(out),
                "--base",
                str(setup["base"]),
                "--de",
                str(setup["de"]),
                "--cache-dir",
                str(setup["root"] / "cache"),
                "--kind",
                kind,
                "--max-steps",
                "3",
                "--max-length",
                "32",
                "--negatives",
                "5",
                "--group-size",
                "3",
                "--eval-every",
                "3",
                "--threads",
                "1",
                "--no-progress",
            ]
        )
        assert rc == 0
        out_text = capsys.readouterr().out
        assert f"trained {kind} CE: 3 steps" in out_text
        assert json.loads((out / "training.json").read_text())["config"]["kind"] == kind
        # checkpoints went beside the output and were removed once the model was exported
        assert not (tmp_path / f"{kind}.train").exists() and not (out / "train").exists()
        assert sorted(p.name for p in out.iterdir() if p.suffix == ".pt") == []


def _err(capsys) -> str:
    return capsys.readouterr().err.strip()


def test_errors(setup, tmp_path, capsys):
    common = ["--de", str(setup["de"]), "--max-steps", "2", "--no-progress"]
    common += ["--cache-dir", str(setup["root"] / "cache")]
    data, base = str(setup["data"]), str(setup["base"])
    assert (
        main(["train-ce", data, str(tmp_path / "a"), "--base", base, "--split", "test", *common])
        == 2
    )
    err = _err(capsys)
    assert "no qrels for split 'test'" in err and "has ['train']" in err
    empty = tmp_path / "noweights"
    empty.mkdir()
    (empty / "config.json").write_text((setup["base"] / "config.json").read_text())
    assert main(["train-ce", data, str(tmp_path / "b"), "--base", str(empty), *common]) == 2
    assert "the checkpoint has no weights" in _err(capsys)
    gpt = tmp_path / "gpt"
    gpt.mkdir()
    (gpt / "config.json").write_text(
        json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})
    )
    (gpt / "model.safetensors").write_bytes(b"")
    assert main(["train-ce", data, str(tmp_path / "c"), "--base", str(gpt), *common]) == 2
    assert "unsupported architecture" in _err(capsys)
    assert (
        main(["train-ce", data, str(tmp_path / "d"), "--base", base, "--loss", "distill", *common])
        == 2
    )
    assert "needs --teacher" in _err(capsys)
    skip = ["--negatives", "5", "--negatives-skip", "5"]
    assert main(["train-ce", data, str(tmp_path / "f"), "--base", base, *skip, *common]) == 2
    assert "negatives_skip must be in [0, negatives=5); got 5" in _err(capsys)
    nopos = tmp_path / "pairs.jsonl"
    nopos.write_text(json.dumps({"query": "a", "item": "b", "label": 0}) + "\n")
    assert main(["train-ce", str(nopos), str(tmp_path / "e"), "--base", base, *common]) == 2
    assert "no query has a pair with label > 0" in _err(capsys)
    assert not (tmp_path / "a").exists() and not (tmp_path / "e").exists()


def test_jsonl_pairs(setup, tmp_path):
    from crossknn.data import load_beir

    beir = load_beir(setup["data"])
    rows = []
    for t in range(TOPICS):
        q = f"w{t}x0 w{t}x3"
        for k in range(5):
            d = beir.item_texts[t * 5 + k]
            rows.append({"query": q, "item": d, "label": int(f"w{t}x0" in d)})
    rows.append({"query": "orphan", "item": beir.item_texts[0], "label": 0})
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rec = ck_train.train_cross_encoder(
        path,
        tmp_path / "m",
        _cfg(max_steps=4, dev_fraction=0.25),
        base=setup["base"],
        de=setup["de"],
        progress=False,
        cache_dir=setup["root"] / "cache",
    )
    n_with = sum(
        1 for t in range(TOPICS) if any(r["label"] for r in rows if r["query"] == f"w{t}x0 w{t}x3")
    )
    assert rec["queries"]["train"] + rec["queries"]["dev"] == n_with
    assert rec["queries"]["skipped"] == {"no positive pair": 1 + TOPICS - n_with}


def test_cls_head_has_its_own_learning_rate(setup):
    from crossknn.train.scorer import TrainableCE

    cls = TrainableCE(setup["base"], "cls", loss="listwise")
    body, head = cls.param_groups(1e-5, 1e-3)
    names = {id(p): n for n, p in cls.named_parameters()}
    assert head["lr"] == 1e-3 and body["lr"] == 1e-5
    assert sorted(names[id(p)].rsplit(".", 1)[1] for p in head["params"]) == ["bias", "weight"]
    assert all("classifier" in names[id(p)] for p in head["params"])
    assert not any("classifier" in names[id(p)] for p in body["params"])
    emb = TrainableCE(setup["base"], "emb", loss="listwise")
    assert len(emb.param_groups(1e-5, 1e-3)) == 1
    with pytest.raises(ValueError, match="head_lr must be > 0"):
        _cfg(head_lr=0.0).check()


def test_dev_evaluation_shows_a_bar_by_pairs_with_the_same_scores(setup, tmp_path, capsys):
    """The dev evaluation (at step 0 it ran for minutes with no output) has a bar by pairs;
    the bar changes nothing: the metrics equal those of the scorer's own chunked pass."""
    from crossknn.ce.export import write_tokenizer
    from crossknn.train.dev import _run_and_qrels, dev_metrics, rerank_metrics
    from crossknn.train.examples import load_examples
    from crossknn.train.scorer import PairEncoder, TrainableCE

    ex = load_examples(setup["data"], "train")
    tok = tmp_path / "hf"
    tok.mkdir()
    write_tokenizer(setup["base"], tok)
    enc = PairEncoder(tok / "tokenizer.json", 32, ex.query_texts, ex.item_texts)
    torch.manual_seed(0)
    model = TrainableCE(setup["base"], "emb", loss="listwise").eval()
    rows = np.arange(min(4, len(ex)))
    rng = np.random.default_rng(0)
    cand = rng.integers(0, len(ex.item_ids), size=(len(rows), 6))
    rel = ex.subset(rows).relevance
    with torch.no_grad():
        ref = enc.score(model, np.repeat(rows, 6), cand.ravel(), torch.device("cpu"), 512)
    want = rerank_metrics(*reversed(_run_and_qrels(cand, ref.numpy().reshape(cand.shape), rel)))
    capsys.readouterr()
    got = dev_metrics(model, enc, rows, rel, cand, torch.device("cpu"), 512, progress=True)
    assert got == want
    err = capsys.readouterr().err
    assert "dev" in err and f"0/{len(rows) * 6}" in err and "pair/s" in err  # a bar by pairs


def test_checkpoints_go_beside_the_output_and_are_removed_on_success(setup, tmp_path):
    """The model folder holds the model only; the work folder (OUT.train by default) survives an
    interruption (for --resume) and is removed once the model is exported, unless kept."""
    cfg = _cfg(kind="emb", loss="listwise", max_steps=4, checkpoint_every=2, eval_every=2)
    plain = {"work_dir": None, "keep_checkpoints": False}

    class Killed(Exception):
        pass

    def kill(step, loss):
        if step == 3:
            raise Killed

    out = tmp_path / "m"
    with pytest.raises(Killed):
        _train(setup, out, cfg, on_step=kill, **plain)
    work = tmp_path / "m.train"
    assert ck_checkpoint.load_state(work / "checkpoint.pt")["step"] == 2
    with pytest.raises(FileExistsError, match=r"m.train exists and is not empty \(pass --resume"):
        _train(setup, out, cfg, **plain)
    rec = _train(setup, out, cfg, resume=True, **plain)
    assert rec["steps"] == 4 and not work.exists()
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["crossknn_model.json", "dev_curve.json", "model.onnx", "tokenizer.json", "training.json"]
    )
    kept = tmp_path / "k"
    _train(setup, kept, cfg, work_dir=tmp_path / "w", keep_checkpoints=True)
    assert (tmp_path / "w" / "checkpoint.pt").is_file() and not (kept / "train").exists()
