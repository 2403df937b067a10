"""The DE in one thread of its own (``crossknn.serve.de_thread``): every encode runs there,
whatever thread asks; the service on a CPU with it on answers as the searcher alone does."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("fastapi")

from crossknn.ce.interface import DualEncoder  # noqa: E402
from crossknn.serve.de_thread import DEThread  # noqa: E402
from crossknn.serve.service import use_de_thread  # noqa: E402


class RecordingDE:
    """A DE that remembers the thread of each encode; vectors from the text's characters."""

    model_id, model_hash, kind, precision, provider, max_length, backend = (
        "rec",
        "h",
        "de",
        "fp32",
        "CUDAExecutionProvider",
        32,
        "onnx",
    )
    dim, source, model_dir, batch_size, max_batch_tokens = 4, None, None, 16, None

    def __init__(self) -> None:
        self.threads: list[str] = []
        self.kwargs: list[dict] = []

    def close(self) -> None:
        pass

    def encode(self, texts, *, batch_size=None, show_progress_bar=None):
        if isinstance(texts, str):
            raise TypeError("encode takes a list of texts, got a str")
        self.threads.append(threading.current_thread().name)
        self.kwargs.append({"batch_size": batch_size})
        if any(t == "boom" for t in texts):
            raise ValueError("the DE refused 'boom'")
        v = np.array([[len(t), ord(t[0]), ord(t[-1]), 1.0] for t in texts], np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)


@pytest.fixture
def threaded():
    """A RecordingDE and its DEThread (closed after the test)."""
    de = RecordingDE()
    dt = DEThread(de)
    yield de, dt
    dt.close()


def test_encodes_from_many_threads_run_in_the_one_de_thread_with_the_des_answers(threaded):
    de, dt = threaded
    texts = [f"query number {i}" for i in range(40)]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda t: dt.encode([t, t + "!"]), texts))
    assert len(set(de.threads)) == 1 and de.threads[0].startswith("crossknn-de")
    assert dt.thread_name == de.threads[0]
    for t, v in zip(texts, got, strict=True):
        np.testing.assert_array_equal(v, RecordingDE().encode([t, t + "!"]))
    dt.encode(["x"], batch_size=3)
    assert de.kwargs[-1] == {"batch_size": 3}


def test_an_encode_error_reaches_the_caller_and_the_thread_goes_on(threaded):
    _, dt = threaded
    with pytest.raises(ValueError, match="refused 'boom'"):
        dt.encode(["ok", "boom"])
    assert dt.encode(["ok"]).shape == (1, 4)


def test_the_wrapper_is_the_des_model_everywhere_else(threaded):
    de, dt = threaded
    assert isinstance(dt, DualEncoder)
    assert (dt.model_id, dt.dim, dt.provider) == ("rec", 4, "CUDAExecutionProvider")
    assert dt.thread_name is None  # nothing encoded yet
    dt.encode(["hello"])
    assert de.threads == [dt.thread_name]
    with pytest.raises(TypeError, match="list of texts"):  # the DE's own check of its input
        dt.encode("hello")
    with pytest.raises(AttributeError):
        _ = dt.no_such_member


@pytest.mark.parametrize(
    "configured, provider, want",
    [
        (None, "CUDAExecutionProvider", True),
        (None, "TensorrtExecutionProvider", True),
        (None, "cuda", True),
        (None, "CPUExecutionProvider", False),
        (None, "cpu", False),
        (None, None, False),
        (True, "CPUExecutionProvider", True),
        (False, "CUDAExecutionProvider", False),
    ],
)
def test_the_de_thread_is_on_by_default_on_a_gpu_only(configured, provider, want):
    assert use_de_thread(configured, provider) is want


@pytest.mark.slow
def test_service_with_the_de_thread_answers_like_the_searcher(model_cache, tmp_path, monkeypatch):
    import crossknn
    from crossknn.demo_corpus import stdlib_docstrings
    from crossknn.serve.service import SearchService, ServeConfig
    from shared_fixtures import admitted_search

    monkeypatch.setenv("CROSSKNN_CACHE", str(model_cache))
    crossknn.build_corpus_index(
        stdlib_docstrings(max_items=80),
        tmp_path / "idx",
        calibration_queries=4,
        calibration_items=16,
        progress=False,
    )
    queries = ["open a file for reading", "sort a list in place", "parse a date string"]
    alone = crossknn.Searcher(tmp_path / "idx")
    want = {q: alone.search([q], k=5, budget=20)[0] for q in queries}

    svc = SearchService(ServeConfig(index=str(tmp_path / "idx"), de_thread=True, admit_within=0))
    svc.load()
    try:
        assert svc.info()["batcher"]["de_thread"] is True
        # the search that measured the service time at load encoded in the DE thread
        assert svc.de_thread.thread_name.startswith("crossknn-de")

        def one(q: str) -> dict:
            return admitted_search(svc, q, k=5, budget=20)

        with ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(one, queries))
        for q, ans in zip(queries, answers, strict=True):
            hit = ans["hits"][0]
            assert [r["id"] for r in hit["results"]] == want[q].ids
            np.testing.assert_allclose(
                [r["score"] for r in hit["results"]], want[q].scores, rtol=1e-6
            )
    finally:
        svc.close()
    # and off by default on the CPU
    assert use_de_thread(ServeConfig(index="x").de_thread, alone.de.provider) is False
