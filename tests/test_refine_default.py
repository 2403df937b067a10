"""``crossknn refine`` with no budget on an index of one row (a default build of 100-199
items): its default budget is the two complete rows refine needs, not an error about an
``--index-calls`` the user never gave."""

from __future__ import annotations

from crossknn.corpus.query_log import QueryLog
from crossknn.corpus.refine import refine_index
from crossknn.corpus_folder import open_index
from crossknn.searcher import Searcher
from lifecycle_stubs import StubCE, StubDE, build, queries


def test_refine_of_a_one_row_index_spends_the_two_rows_it_needs(tmp_path):
    idx = tmp_path / "idx"
    build(idx, rows=1)
    n = len(open_index(idx))
    assert open_index(idx).params["auto"]["rows"] == 1
    s = Searcher(open_index(idx), ce=StubCE(), de=StubDE())
    s.record_paid = True
    hits = s.search(queries(6), k=5, budget=20)
    with QueryLog(tmp_path / "q.log") as log:
        log.append_hits(
            hits, s.corpus.ids, s.corpus.texts, index_version=1, ce_model_hash=StubCE.model_hash
        )
    r = refine_index(idx, tmp_path / "q.log", ce=StubCE(), de=StubDE(), quiet=True)
    assert r.version == 2 and r.index_calls == 2 * n
    assert open_index(idx).params["auto"]["rows"] == 2
