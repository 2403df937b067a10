"""What the client and framework tests share: one small index with metadata, built with the
embedded models once per test run (the workers of a parallel run wait for it, then reuse it),
and the rule for the framework packages (skipped where absent, a failure with ``CI=true``).

The index: :data:`N_ITEMS` standard-library docstrings, each with ``lang`` (a string: en, de,
fr), ``year`` (a number: 2000..2009) and ``tags`` (a list: none, ["a"] or ["a", "b"]); a test
module serves it with ``served()`` (tests/serve_fixture.py) over its ``env`` fixture.
"""

from __future__ import annotations

import importlib.util
import shutil

import pytest

from conftest import in_ci, run_lock, run_tmp
from serve_fixture import served
from shared_fixtures import lazy_importorskip

N_ITEMS = 40
LANGS = ("en", "de", "fr")
K, BUDGET = 5, 20  # every search of the tests: k and budget (budget < N_ITEMS)


def meta(i: int) -> dict:
    return {"lang": LANGS[i % 3], "year": 2000 + i % 10, "tags": ["a", "b"][: i % 3]}


def framework(module: str, extra: str):
    """``module`` imported on first use; the test module is skipped when the package is not
    installed, and fails instead under ``CI=true`` (make test installs every extra)."""
    if importlib.util.find_spec(module.split(".")[0]) is None and in_ci():
        pytest.fail(f"CI=true and {module} is not installed: pip install 'crossknn[{extra}]'")
    return lazy_importorskip(module)


def shared_index(tmp_path_factory) -> dict:
    """The run's index (built by the first test module that asks; embedded models, the model
    cache of ``$CROSSKNN_CACHE``): ``{"root", "index_dir"}``."""
    import crossknn
    from crossknn.data import Corpus
    from crossknn.demo_corpus import stdlib_docstrings

    root = run_tmp(tmp_path_factory) / "frameworks-index"
    with run_lock(tmp_path_factory, "frameworks-index"):
        if not (root / "idx" / "index.json").is_file():
            shutil.rmtree(root, ignore_errors=True)
            docs = stdlib_docstrings(max_items=N_ITEMS)
            corpus = Corpus(docs.ids, docs.texts, "frameworks", [meta(i) for i in range(N_ITEMS)])
            tmp = root.with_name("frameworks-index.tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            crossknn.build_corpus_index(
                corpus,
                tmp / "idx",
                calibration_queries=2,
                calibration_items=8,
                index_calls=None,
                progress=False,
            )
            tmp.rename(root)
    return {"root": root, "index_dir": root / "idx"}


def allowed_ids(index_dir, spec) -> set[str]:
    """The ids a crossknn filter allows on the index (the engine's own mask)."""
    from crossknn import open_index
    from crossknn.filters import parse_filter

    index = open_index(index_dir)
    mask = parse_filter(spec, index.metadata.fields).mask(index.metadata, index.corpus.ids)
    return {i for i, ok in zip(index.corpus.ids, mask, strict=True) if ok}


def open_source(kind: str, env: dict, server):
    """A :class:`~crossknn.integrations.source.Source` over the index folder (``local``: the
    embedded models) or over ``server`` (``server``)."""
    from crossknn.integrations.source import Source

    return Source(server.url if kind == "server" else env["index_dir"])


def source_fixtures():
    """The module fixtures of a framework test module, bound as
    ``env, server, source = source_fixtures()``: ``env`` (the run's index, :func:`shared_index`),
    ``server`` (``crossknn serve`` over it) and ``source`` (a Source, once ``local``, once over
    ``server``: :func:`open_source`)."""

    @pytest.fixture(scope="module")
    def env(model_env, tmp_path_factory):
        return shared_index(tmp_path_factory)

    @pytest.fixture(scope="module", params=["local", "server"])
    def source(request, env, server):
        src = open_source(request.param, env, server)
        yield src
        src.close()

    return env, served(), source


def direct(source, query: str, **options) -> list[tuple[str, float]]:
    """``(id, score)`` of the same search made directly: ``Searcher.search`` on a local source,
    ``client.search`` on a server (crossknn's own filter language)."""
    from crossknn import client

    if source.url is not None:
        out = client.search(source.url, query, **options)
        return [(r["id"], r["score"]) for r in out["hits"][0]["results"]]
    hits = source.searcher.search(query, **options)
    return [(i, float(s)) for i, s in zip(hits.ids, hits.scores, strict=True)]


def one_line(exc: BaseException) -> str:
    """The message of ``exc``, asserted to be one line."""
    text = str(exc)
    assert text and "\n" not in text, text
    return text
