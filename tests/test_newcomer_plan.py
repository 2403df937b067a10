"""The plan reported is the plan that ran: a filter allowing at most B items is scored in one
round, and ``Hits.plan``, the CLI's text and JSON and the server's answer say so (the rounds and
each step's CE calls as spent, per query); a request may ask for the rounds an answer reports
(auto chooses up to 30)."""

from __future__ import annotations

import json

import pytest

import crossknn
from crossknn.data import Corpus
from serve_fixture import QUERIES, index_env, run_cli

pytestmark = [pytest.mark.slow]

N_ITEMS = 80
LANGS = ("en", "de", "fr", "es")
BUDGET = 30  # the filter {"lang": "en"} allows 20 items: at most B


@pytest.fixture(scope="module")
def env(model_env, tmp_path_factory):
    from crossknn.demo_corpus import stdlib_docstrings

    docs = stdlib_docstrings(max_items=N_ITEMS)
    meta = [{"lang": LANGS[i % 4]} for i in range(len(docs))]
    corpus = Corpus(docs.ids, docs.texts, "plan", meta)
    return index_env(tmp_path_factory, "plan", corpus, index_calls=2 * len(docs))


@pytest.fixture(scope="module")
def searcher(env):
    return crossknn.Searcher(env["index"])


def test_a_filter_allowing_at_most_b_items_reports_one_round(searcher):
    planned = searcher.plan_info(budget=BUDGET)
    assert planned["rounds"] > 1 and sum(planned["plan"]) == BUDGET
    small, full = searcher.search(
        [QUERIES[0], QUERIES[0]], k=5, budget=BUDGET, filter=[{"lang": "en"}, None]
    )
    assert small.allowed == 20 and small.ce_calls == 20
    assert small.plan["rounds"] == 1 and small.plan["plan"] == [20]
    d = small.to_dict()
    assert d["rounds"] == 1 and d["round_calls"] == [20]
    # unfiltered: the whole plan ran, its steps add up to the calls spent
    assert full.plan["plan"] == planned["plan"] and full.plan["rounds"] == planned["rounds"]
    assert sum(full.to_dict()["round_calls"]) == full.ce_calls == BUDGET


def test_the_cli_text_and_json_report_what_ran(env):
    base = ["search", str(env["index_dir"]), QUERIES[0], "-k", "5", "--budget", str(BUDGET)]
    base += ["--filter", '{"lang": "en"}']
    text = run_cli(*base)
    assert text.returncode == 0, text.stderr
    assert "auto, 1 round (20 CE calls); CE calls 20;" in text.stdout, text.stdout
    out = run_cli(*base, "--json", "--quiet")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["rounds"] == 1 and got["plan"]["plan"] == [20]
    assert got["hits"][0]["rounds"] == 1 and got["hits"][0]["round_calls"] == [20]


def test_the_server_reports_what_ran_and_accepts_the_rounds_it_reports(env):
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from crossknn.search.round_plan import ROUNDS_GRID
    from serve_fixture import serving

    with serving(env) as server:

        def search(**body):
            body = {"query": QUERIES[0], "k": 5, **body}
            return httpx.post(server.url + "/search", json=body, timeout=120)

        r = search(budget=BUDGET, filter={"lang": "en"})
        assert r.status_code == 200, r.text
        got = r.json()
        assert got["rounds"] == 1 and got["plan"]["plan"] == [20]
        assert got["hits"][0]["rounds"] == 1 and got["hits"][0]["round_calls"] == [20]
        default = search(budget=60)
        assert default.status_code == 200, default.text
        rounds = default.json()["rounds"]
        for asked in sorted({rounds, max(ROUNDS_GRID)}):
            again = search(budget=60, rounds=asked)
            assert again.status_code == 200, (asked, again.text)
            assert again.json()["rounds"] == asked
