"""The C++ reader and searcher of an index folder (issue 68): ``crossknn::Index::open`` +
``crossknn::Searcher`` (through ``_core.IndexSearcher``) give the same ids, scores and CE calls
as :class:`crossknn.Searcher` on freshly built indexes of every kind, bit for bit."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from crossknn import _core
from crossknn.corpus_folder import open_index
from crossknn.search.engine import query_id_int
from crossknn.searcher import Searcher

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "make_index_fixtures", ROOT / "cpp" / "tests" / "fixtures" / "make_index_fixtures.py"
)
fx = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fx)

KINDS = ("default", "train", "cur", "edited")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Every kind of index, built once for the module."""
    root = tmp_path_factory.mktemp("cpp_index")
    return {kind: fx.build(kind, root / kind) for kind in KINDS}


def _query(index_dir: Path, text: str):
    """(DE vector, CE row over every item) of a query: what the C++ side is given."""
    texts = open_index(index_dir).corpus.texts
    ce = fx.StubCE()
    ce.set_items(texts)
    return (
        fx.StubDE().encode([text])[0],
        ce.score(text, np.arange(len(texts), dtype=np.int64)),
    )


def _python(searcher: Searcher, text: str, **kw):
    h = searcher.search(text, **kw)
    return np.asarray(h.indices, np.int64), np.asarray(h.scores, np.float32), int(h.ce_calls)


def _cpp(cpp, index_dir: Path, text: str, *, method=None, allow=None, target_recall=None, **kw):
    q, S = _query(index_dir, text)
    out = cpp.search(
        q,
        S,
        method=method or "",
        allow=allow,
        query_id=query_id_int(text),
        target_recall=target_recall or 0.0,
        **kw,
    )
    return out["indices"], out["scores"], int(out["ce_calls"])


def _same(a, b) -> None:
    np.testing.assert_array_equal(a[0], b[0])
    assert a[1].dtype == b[1].dtype == np.float32
    assert a[1].tobytes() == b[1].tobytes()  # bit for bit
    assert a[2] == b[2]


@pytest.mark.parametrize("kind", KINDS)
def test_every_method_equals_python_bit_for_bit(built, kind):
    index_dir = built[kind]
    cpp = _core.IndexSearcher(str(index_dir))
    py = Searcher(open_index(index_dir), ce=fx.StubCE(), de=fx.StubDE())
    if kind != "edited":  # every method of the registry the index holds what it needs for
        assert sorted(cpp.methods) == sorted(py.methods)
    else:  # all but gar: the corpus graph predates the added items
        assert sorted(cpp.methods) == sorted(m for m in py.methods if m != "gar")
    assert cpp.default_method == py.method
    expect = {"default": [], "train": [], "cur": ["adacur", "anncur"], "edited": []}[kind]
    assert set(expect) <= set(cpp.methods)
    texts = fx.queries(4, seed=123)
    n = 0
    for method in [None, *cpp.methods]:
        for budget, k, seed in ((100, 10, 0), (30, 5, 7)):
            for text in texts[:2]:
                want = _python(py, text, k=k, budget=budget, method=method, seed=seed)
                got = _cpp(cpp, index_dir, text, method=method, k=k, budget=budget, seed=seed)
                _same(got, want)
                n += 1
    assert n >= 4 * (1 + len(cpp.methods))
    if "adacur" not in cpp.methods:  # refused in one line saying how to build it
        with pytest.raises(ValueError, match=r"needs a CUR index .* --cur"):
            _cpp(cpp, index_dir, texts[0], method="adacur")


@pytest.mark.parametrize("n_items", [150, 60])
def test_small_builds_one_row_and_no_auto_index(tmp_path, n_items):
    """150 items: one complete row (the first share's plan); 60: no auto index (axn with the
    score map is the default)."""
    index_dir = fx.build("default", tmp_path / "small", n_items=n_items)
    cpp = _core.IndexSearcher(str(index_dir))
    py = Searcher(open_index(index_dir), ce=fx.StubCE(), de=fx.StubDE())
    assert cpp.default_method == py.method == ("auto" if n_items >= 100 else "axn")
    if n_items >= 100:
        assert py.index.params["auto"]["first_share"] is not None
        assert cpp.plan("auto", 40) == py.plan_info("auto", budget=40)["plan"]
    for method in cpp.methods:
        for text in fx.queries(2, seed=17):
            want = _python(py, text, k=5, budget=40, method=method)
            _same(_cpp(cpp, index_dir, text, method=method, k=5, budget=40), want)


def test_tombstones_and_versions_after_add_remove_refine(built):
    index_dir = built["edited"]
    cpp = _core.IndexSearcher(str(index_dir))
    idx = open_index(index_dir)
    assert cpp.version == idx.info["version"] == 4
    assert cpp.n_removed == 30 and cpp.n_items == len(idx.corpus) == 1040
    assert cpp.ids == list(idx.corpus.ids)
    py = Searcher(idx, ce=fx.StubCE(), de=fx.StubDE())
    removed = {f"d{i}" for i in range(0, 300, 10)}
    for text in fx.queries(3, seed=5):
        got = _cpp(cpp, index_dir, text, k=10, budget=100)
        _same(got, _python(py, text, k=10, budget=100))
        assert not removed & {idx.corpus.ids[i] for i in got[0]}
    # the corpus graph predates the added items: gar is refused, not answered differently
    assert "gar" not in cpp.methods
    with pytest.raises(ValueError, match="gar needs the index's corpus graph"):
        _cpp(cpp, index_dir, "w1 w2 w3", method="gar")


@pytest.mark.parametrize("kind", ["default", "edited"])
def test_a_filters_mask_equals_python(built, kind):
    index_dir = built[kind]
    cpp = _core.IndexSearcher(str(index_dir))
    py = Searcher(open_index(index_dir), ce=fx.StubCE(), de=fx.StubDE())
    flt = fx.filter_of(kind)
    mask = py.filter_mask(flt)
    for budget in (50, 100):
        for text in fx.queries(2, seed=9):
            want = _python(py, text, k=10, budget=budget, filter=flt)
            got = _cpp(cpp, index_dir, text, k=10, budget=budget, allow=mask)
            _same(got, want)
            assert mask[got[0]].all()
    # a mask of at most B items: all of them scored, the exact top-k among them
    few = np.zeros(cpp.n_items, bool)
    few[[3, 41, 77, 121, 123]] = True  # none of them removed
    text = fx.queries(1, seed=2)[0]
    got = _cpp(cpp, index_dir, text, k=10, budget=30, allow=few)
    assert got[2] == 5 and set(got[0].tolist()) <= set(np.flatnonzero(few).tolist())


def test_the_early_stop_the_index_records(built):
    index_dir = built["train"]
    cpp = _core.IndexSearcher(str(index_dir))
    py = Searcher(open_index(index_dir), ce=fx.StubCE(), de=fx.StubDE())
    calls = []
    for text in fx.queries(4, seed=21):
        want = _python(py, text, k=10, budget=200, target_recall=0.9)
        got = _cpp(cpp, index_dir, text, k=10, budget=200, target_recall=0.9)
        _same(got, want)
        calls.append(got[2])
    with pytest.raises(ValueError, match="target_recall needs a method"):
        _cpp(cpp, index_dir, "w1 w2", method="axn", target_recall=0.9)


def test_an_old_searcher_finishes_on_its_version_across_a_commit(built, tmp_path):
    from crossknn.corpus.edit import add_items

    index_dir = tmp_path / "live"
    shutil.copytree(built["default"], index_dir)
    text = fx.queries(1, seed=31)[0]
    old = _core.IndexSearcher(str(index_dir))
    before = _cpp(old, index_dir, text, k=10, budget=100)
    q, S = _query(index_dir, text)
    add_items(index_dir, fx.corpus(25, prefix="n", seed=8), ce=fx.StubCE(), de=fx.StubDE())
    again = old.search(q, S, k=10, budget=100)  # the old version's maps: the old answer
    _same((again["indices"], again["scores"], again["ce_calls"]), before)
    new = _core.IndexSearcher(str(index_dir))
    assert (old.version, new.version) == (1, 2) and new.n_items == old.n_items + 25
    py = Searcher(open_index(index_dir), ce=fx.StubCE(), de=fx.StubDE())
    _same(_cpp(new, index_dir, text, k=10, budget=100), _python(py, text, k=10, budget=100))


def test_damaged_folders_are_refused_naming_the_file(built, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(built["train"], bad)
    raw = bytearray((bad / "auto_prior_deltas.npy").read_bytes())
    raw[-1] ^= 1
    (bad / "auto_prior_deltas.npy").write_bytes(bytes(raw))
    with pytest.raises(RuntimeError, match=r"auto_prior_deltas\.npy is corrupt"):
        _core.IndexSearcher(str(bad))
    (bad / "auto_rows.npy").unlink()
    with pytest.raises(RuntimeError, match=r"auto_rows\.npy is missing"):
        _core.IndexSearcher(str(bad), verify=False)


def _example() -> Path | None:
    """The search_index example of a C++ build of this checkout, when one exists."""
    for p in sorted((ROOT / "build").glob("*/cpp/search_index")):
        if os.access(p, os.X_OK):
            return p
    return None


def test_the_example_prints_pythons_answer(built, tmp_path):
    exe = _example()
    if exe is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no C++ build of examples/search_index (cmake -DCROSSKNN_BUILD_TESTS=ON)")
        pytest.skip("no C++ build of examples/search_index here")
    index_dir = built["train"]
    text = fx.queries(1, seed=41)[0]
    q, S = _query(index_dir, text)
    np.save(tmp_path / "q.npy", q)
    np.save(tmp_path / "s.npy", S)
    py = Searcher(open_index(index_dir), ce=fx.StubCE(), de=fx.StubDE())
    h = py.search(text, k=10, budget=100)
    out = subprocess.run(
        [
            exe,
            str(index_dir),
            "--query-vector",
            str(tmp_path / "q.npy"),
            "--scores",
            str(tmp_path / "s.npy"),
            "-k",
            "10",
            "--budget",
            "100",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.splitlines()
    assert out == fx.output_lines(h.ids, h.scores, h.ce_calls)


def test_unicode_ids_and_metadata_read_as_python_wrote_them(tmp_path):
    """index.json's canonical text (ASCII escapes, surrogate pairs) is rebuilt for its hash."""
    from crossknn.corpus.build import build_corpus_index
    from crossknn.data import Corpus

    c = fx.corpus(120)
    kinds = ["français", "日本語", 'emoji 😀 "q" \\ \t']
    meta = [dict(m, lang=kinds[i % 3], **{"ключ": i}) for i, m in enumerate(c.metadata)]
    index_dir = tmp_path / "uni"
    build_corpus_index(
        Corpus([f"é{i}" for i in range(120)], c.texts, "uni", metadata=meta),
        index_dir,
        ce=fx.StubCE(),
        de=fx.StubDE(),
        calibration_items=8,
        progress=False,
    )
    cpp = _core.IndexSearcher(str(index_dir))
    assert cpp.ids == [f"é{i}" for i in range(120)]
    py = Searcher(open_index(index_dir), ce=fx.StubCE(), de=fx.StubDE())
    flt = {"lang": "日本語"}
    text = fx.queries(1, seed=3)[0]
    want = _python(py, text, k=5, budget=30, filter=flt)
    _same(_cpp(cpp, index_dir, text, k=5, budget=30, allow=py.filter_mask(flt)), want)
