"""The main job end to end: build an index over a corpus, search it with the real embedded CE."""

import json
import subprocess
import sys

import numpy as np
import pytest

import crossknn.ce
import ref_search as ref
from crossknn.ce import default_cross_encoder, default_dual_encoder
from crossknn.cli import main
from crossknn.corpus.work import encode_resumable
from crossknn.corpus_folder import open_index
from crossknn.index.files import ModelMismatchError
from crossknn.scorers import MatrixScorer
from crossknn.search import DEFAULT_MIX
from crossknn.search.methods import DEFAULT_RIDGE
from crossknn.searcher import Searcher
from shared_fixtures import cisi_head

pytestmark = [pytest.mark.data, pytest.mark.slow]

N_ITEMS = 40
QUERIES = ["the use of computers in libraries", "indexing and classification of documents"]
# the queries of the budgeted-search tests (B << N): their exact CE rows are computed once
TEST_QUERIES = QUERIES + [
    "information needs of scientists and engineers",
    "citation analysis of the scientific literature",
    "evaluation of information retrieval systems",
    "education and training of librarians",
]
B, K = 10, 3  # budget a quarter of the corpus: random items would find B / N = 1/4 of the top-k


@pytest.fixture(scope="module")
def env(model_cache, shared_dir, tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("CROSSKNN_CACHE", str(model_cache))
    root = tmp_path_factory.mktemp("searcher")
    path = root / "corpus.jsonl"
    corpus = cisi_head(shared_dir, N_ITEMS, path)
    ce = default_cross_encoder()
    de = default_dual_encoder()
    yield {"corpus": corpus, "path": path, "root": root, "ce": ce, "de": de}
    mp.undo()


class _RecordingCE:
    """The real CE, recording every (query, items, scores) it is asked for."""

    def __init__(self, ce):
        self.ce, self.calls = ce, []

    def __getattr__(self, name):
        return getattr(self.ce, name)

    def score_batch(self, queries, items):
        out = self.ce.score_batch(queries, items)
        for q, it, sc in zip(queries, items, out, strict=True):
            self.calls.append((q, np.asarray(it).copy(), np.asarray(sc, np.float64).copy()))
        return out


@pytest.fixture(scope="module")
def index_dir(env):
    out = env["root"] / "idx"
    recording = _RecordingCE(env["ce"])
    env["calibration"] = recording.calls
    mp = pytest.MonkeyPatch()
    mp.setattr(crossknn.ce, "default_cross_encoder", lambda *a, **kw: recording)
    rc = main(
        [
            "build",
            str(env["path"]),
            str(out),
            "--calibration-queries",
            "4",
            "--calibration-items",
            "8",
            "--quiet",
        ]
    )
    mp.undo()
    assert rc == 0
    return out


class _ExactCE:
    """The real CE's identity over its exact scores of TEST_QUERIES (a MatrixScorer): a Searcher
    on it runs the same method on the same scores, without running the model."""

    def __init__(self, ce, S):
        self.model_id, self.model_hash = ce.model_id, ce.model_hash
        self.rows = {q: i for i, q in enumerate(TEST_QUERIES)}
        self.matrix = MatrixScorer(S)
        self.n_items = self.matrix.n_items

    def set_items(self, texts):
        assert len(texts) == self.n_items

    def score(self, query, items):
        return self.matrix.score(self.rows[query], items)

    def score_batch(self, queries, items):
        return self.matrix.score_batch([self.rows[q] for q in queries], items)


@pytest.fixture(scope="module")
def exact(env):
    """Exact CE scores of TEST_QUERIES x all items (computed once) and their DE query vectors."""
    ce = env["ce"]
    ce.set_items(env["corpus"].texts)
    S = np.stack([ce.score(q, np.arange(N_ITEMS)) for q in TEST_QUERIES]).astype(np.float32)
    Q = np.asarray(env["de"].encode(TEST_QUERIES), np.float64)
    return {"S": S, "Q": Q, "ce": _ExactCE(ce, S)}


def _reference(method, idx, s_row, qvec, *, budget, k, rounds):
    """tests/ref_search.py's result of ``method`` as the Searcher configures it: first stage =
    the DE top items of the index's vectors, AXN with the DE prior and the index's score map,
    ANNCUR/ADACUR over the index's CUR rows with the default ridge."""
    V = np.asarray(idx["de_items"], np.float64)
    de_ranked = ref.topk(V @ qvec, V.shape[0])
    first = de_ranked[: ref.sizes(budget, rounds)[0]]
    if method == "rnr":
        return ref.rnr(s_row, de_ranked, budget, k)
    if method == "axn":
        smap = tuple(idx.params["score_map"])
        return ref.rounds_search(
            s_row, V, first, budget, k, rounds, prior=qvec, mix=DEFAULT_MIX, affine=smap
        )
    R = np.asarray(idx["R"], np.float64)
    if method == "adacur":
        return ref.rounds_search(s_row, R.T, first, budget, k, rounds, ridge=DEFAULT_RIDGE)
    anchors = de_ranked[: round(0.5 * budget)]  # ANNCUR's default split, anchors = the DE top
    return ref.anncur(s_row, R, anchors, budget, k, DEFAULT_RIDGE)


def _check_small_budget(s, exact, method):
    """``method`` at B << N: the real CE search returns what the same method returns on the
    exact scores and what the numpy reference computes; its recall beats random items."""
    S, idx = exact["S"], s.index
    hits = s.search(TEST_QUERIES, k=K, budget=B, method=method)
    on_exact = Searcher(idx, ce=exact["ce"], de=s.de, method=method).search(
        TEST_QUERIES, k=K, budget=B
    )
    recalls = []
    for i, (h, e) in enumerate(zip(hits, on_exact, strict=True)):
        want = _reference(
            method,
            idx,
            S[i],
            exact["Q"][i],
            budget=B,
            k=K,
            rounds=s.plan_info(method, budget=B)["rounds"],
        )
        assert e.indices.tolist() == want.tolist(), (method, h.query)
        assert h.indices.tolist() == want.tolist(), (method, h.query)
        assert h.ids == [idx.corpus.ids[j] for j in want]
        assert h.ce_calls == e.ce_calls == B
        np.testing.assert_allclose(h.scores, S[i, want], atol=1e-4)
        recalls.append(ref.recall(S[i], h.indices, K))
    # a method that scores B random items finds B / N of the top-k on average
    assert np.mean(recalls) >= B / N_ITEMS + 0.35, (method, recalls)


def test_build_writes_a_complete_index(env, index_dir):
    idx = open_index(index_dir)
    assert len(idx) == N_ITEMS
    assert idx.corpus.ids == env["corpus"].ids
    assert idx["de_items"].shape == (N_ITEMS, env["de"].dim)
    np.testing.assert_allclose(idx["de_items"], env["de"].encode(env["corpus"].texts), atol=1e-5)
    assert idx.ce_calls == 4 * 8
    # the score map is the least-squares line CE ~ scale * DE + offset through the calibration
    # pairs: 4 pseudo-queries x (their DE top 4 + 4 other items), recomputed here with np.polyfit
    calls = env["calibration"]
    assert [len(it) for _, it, _ in calls] == [8] * 4
    V = np.asarray(idx["de_items"], np.float64)  # checked against the DE above
    qv = env["de"].encode([q for q, _, _ in calls]).astype(np.float64)
    de_s, ce_s = [], []
    for (_, items, scores), q in zip(calls, qv, strict=True):
        assert set(ref.topk(V @ q, 4).tolist()) <= set(items.tolist())
        de_s.append(V[items] @ q)
        ce_s.append(scores)
    want = np.polyfit(np.concatenate(de_s), np.concatenate(ce_s), 1)
    np.testing.assert_allclose(idx.params["score_map"], want, rtol=1e-4)
    assert idx.index.models["ce"]["model_hash"] == env["ce"].model_hash
    assert not (index_dir / ".build").exists()


@pytest.mark.parametrize("method", ["axn", "rnr"])
def test_small_budget_matches_the_reference_and_beats_random(env, index_dir, exact, method):
    s = Searcher(index_dir, method=method)
    _check_small_budget(s, exact, method)
    if method != "axn":
        return
    # exact=True reports the exact top-k and the recall of the exact CE rows
    h = s.search(TEST_QUERIES[2], k=K, budget=B, exact=True)
    top = ref.topk(exact["S"][2], K)
    assert h.exact_ids == [s.corpus.ids[j] for j in top]
    assert h.recall == ref.recall(exact["S"][2], h.indices, K)


def test_small_budget_returns_exact_ce_scores_and_honours_budget(env, index_dir):
    s = Searcher(index_dir)
    hits = s.search(QUERIES, k=5, budget=12, rounds=3)
    ce = env["ce"]
    ce.set_items(env["corpus"].texts)
    for h in hits:
        assert h.ce_calls <= 12
        assert len(h.ids) == 5
        assert np.all(np.diff(h.scores) <= 0)
        np.testing.assert_allclose(h.scores, ce.score(h.query, h.indices), atol=1e-5)
        assert h.seconds_ce > 0
    # the same query alone gives the same result as inside the batch
    alone = s.search(QUERIES[1], k=5, budget=12, rounds=3)
    assert alone.ids == hits[1].ids


@pytest.mark.parametrize("method", ["axn", "rnr"])
def test_query_batch_runs_rounds_in_lockstep_with_one_ce_call_per_round(env, index_dir, method):
    """Q queries in lockstep (#30 item 4): one CE call per round for the group, and every
    query's items, scores and CE calls equal a one-at-a-time search."""
    s = Searcher(index_dir, method=method)
    rec = _RecordingCE(s.ce)
    batches = []
    real = rec.score_batch
    rec.score_batch = lambda qs, items: batches.append(len(qs)) or real(qs, items)
    s.ce = rec
    one = s.search(TEST_QUERIES, k=K, budget=B, rounds=3, query_batch=1)
    batches_one = list(batches)
    batches.clear()
    group = s.search(TEST_QUERIES, k=K, budget=B, rounds=3, query_batch=len(TEST_QUERIES))
    steps = 1 if method == "rnr" else 3
    assert batches == [len(TEST_QUERIES)] * steps  # one CE call per round for all the queries
    assert batches_one == [1] * (steps * len(TEST_QUERIES))
    for a, b in zip(one, group, strict=True):
        assert a.ids == b.ids and a.ce_calls == b.ce_calls
        np.testing.assert_array_equal(a.scores, b.scores)
        assert b.seconds_ce > 0


def test_search_errors(env, index_dir):
    s = Searcher(index_dir)
    with pytest.raises(ValueError, match="exceeds the number of items"):
        s.search("q", k=5, budget=N_ITEMS + 1)
    with pytest.raises(ValueError, match="exceeds the budget"):
        s.search("q", k=20, budget=10)
    with pytest.raises(ValueError, match="non-empty strings"):
        s.search(["ok", "  "], k=2, budget=5)
    with pytest.raises(ValueError, match="needs a CUR index"):
        s.search("q", k=2, budget=5, method="adacur")
    int8 = default_cross_encoder(precision="int8")
    with pytest.raises(ModelMismatchError, match="rebuild the index"):
        Searcher(index_dir, ce=int8)


def test_tampered_items_file_is_refused(env, index_dir, tmp_path):
    import shutil

    copy = tmp_path / "idx"
    shutil.copytree(index_dir, copy)
    (copy / "items.jsonl").write_text('{"id": "x", "text": "y"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="does not match the recorded hash"):
        open_index(copy)


def test_cli_search_json_and_stdin(env, index_dir, capsys, monkeypatch):
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO(QUERIES[0] + "\n\n" + QUERIES[1] + "\n"))
    rc = main(["search", str(index_dir), "--queries", "-", "-k", "3", "--budget", "10", "--json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert [h["query"] for h in doc["hits"]] == QUERIES
    for h in doc["hits"]:
        assert len(h["results"]) == 3 and h["ce_calls"] <= 10
    rc = main(["search", str(index_dir), "a query", "-k", "20", "--budget", "10"])
    assert rc == 2
    assert "exceeds the budget" in capsys.readouterr().err


def test_cur_index_enables_adacur(env, exact, tmp_path):
    train = tmp_path / "train.txt"
    train.write_text("library catalogs\ninformation retrieval systems\ncitation analysis\n")
    out = tmp_path / "cur"
    assert (
        main(
            [
                "build",
                str(env["path"]),
                str(out),
                "--train-queries",
                str(train),
                "--cur",
                "--calibration-items",
                "8",
                "--quiet",
            ]
        )
        == 0
    )
    idx = open_index(out)
    assert idx["R"].shape == (3, N_ITEMS)
    ce = env["ce"]
    ce.set_items(env["corpus"].texts)
    np.testing.assert_allclose(
        idx["R"][1], ce.score("information retrieval systems", np.arange(N_ITEMS)), atol=1e-5
    )
    assert idx.ce_calls == 3 * 8 + 3 * N_ITEMS
    s = Searcher(idx, method="adacur")
    for method in ("adacur", "anncur"):
        _check_small_budget(s, exact, method)


def test_build_errors(env, tmp_path):
    empty = tmp_path / "e.jsonl"
    empty.write_text("\n")
    assert main(["build", str(empty), str(tmp_path / "x")]) == 2
    assert main(["build", str(env["path"]), str(tmp_path / "y"), "--cur"]) == 2
    with pytest.raises(FileNotFoundError, match="index.json is missing"):
        open_index(tmp_path)


class _CountingDE:
    def __init__(self, de):
        self.de, self.dim, self.calls = de, de.dim, 0

    def encode(self, texts):
        self.calls += 1
        return self.de.encode(texts)


def test_item_encoding_resumes_after_interruption(env, tmp_path):
    texts = env["corpus"].texts
    de = _CountingDE(env["de"])
    full = encode_resumable(de, texts, tmp_path, chunk=16, progress=False)
    assert de.calls == 3
    chunks = sorted(tmp_path.glob("de_*.npy"))
    chunks[1].unlink()  # as if killed while encoding the second chunk
    (tmp_path / f".{chunks[1].name}.x.tmp").write_bytes(b"half-written")
    de.calls = 0
    again = encode_resumable(de, texts, tmp_path, chunk=16, progress=False)
    assert de.calls == 1
    np.testing.assert_array_equal(full, again)


def test_demo_runs_and_caches(env, tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "crossknn.cli",
        "demo",
        "--max-items",
        "60",
        "--budget",
        "20",
        "-k",
        "5",
        "--exact",
        "--quiet",
        "--cache-dir",
        str(tmp_path),
        "--query",
        "read a file line by line",
    ]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    assert "index: building" in first.stdout
    assert "mean Top-5-Recall@20" in first.stdout
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr
    assert "(cached)" in second.stdout
    recall = [ln for ln in first.stdout.splitlines() if ln.startswith("mean Top-5")]
    assert recall == [ln for ln in second.stdout.splitlines() if ln.startswith("mean Top-5")]


def _untrained_cmc(path, encoder_id):
    """A CMC model whose gate is 0: it ranks exactly like the dual encoder."""
    import torch

    from crossknn.cmc.export import export_onnx
    from crossknn.cmc.model import CmcConfig, CmcModel
    from crossknn.cmc.runtime import FORMAT

    path.mkdir()
    torch.manual_seed(0)
    cfg = CmcConfig(dim=384, width=32, layers=1, heads=2)
    torch.save(CmcModel(cfg).state_dict(), path / "model.pt")
    info = {"format": FORMAT, "encoder_id": encoder_id, "model": cfg.to_dict()}
    (path / "cmc.json").write_text(json.dumps(info))
    export_onnx(path)
    return path


def test_cmc_first_stage(env, index_dir, tmp_path):
    cmc = _untrained_cmc(tmp_path / "cmc", env["de"].model_id)
    plain = Searcher(index_dir).search(QUERIES, k=5, budget=15)
    with_cmc = Searcher(index_dir, cmc_model=cmc, cmc_candidates=20).search(QUERIES, k=5, budget=15)
    for a, b in zip(plain, with_cmc, strict=True):
        assert a.ids == b.ids  # an untrained (gate 0) CMC keeps the DE order
    other = _untrained_cmc(tmp_path / "other", "another-encoder")
    with pytest.raises(ValueError, match="trained on vectors of encoder"):
        Searcher(index_dir, cmc_model=other)
