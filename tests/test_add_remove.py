"""``crossknn add`` / ``crossknn remove`` (issue 47 item 3): new items get DE vectors, their
entries in every stored row (one CE call per row per item) and their place in the round index,
after build's corpus checks; removed items never appear again (tombstones, then compaction); the
index records its version and history."""

from __future__ import annotations

import json

import numpy as np
import pytest

from crossknn.corpus.edit import add_items, remove_items
from crossknn.corpus.versions import index_version
from crossknn.corpus_folder import open_index
from crossknn.data import Corpus
from crossknn.searcher import Searcher
from lifecycle_stubs import StubCE, StubDE, build, corpus, index_files, queries, write_items


def _search(index_dir, qs, **kw):
    s = Searcher(open_index(index_dir), ce=StubCE(), de=StubDE(), **kw)
    return s.search(qs, k=10, budget=40, exact=True)


def test_add_scores_new_items_against_every_row_and_equals_a_build_with_them(tmp_path):
    full = corpus(140)
    base = Corpus(full.ids[:120], full.texts[:120], "base")
    new = Corpus(full.ids[120:], full.texts[120:], "new")
    idx = tmp_path / "idx"
    build(idx, base, rows=4)
    before = open_index(idx)
    ce = StubCE()
    r = add_items(idx, new, ce=ce, de=StubDE())
    after = open_index(idx)
    assert r["version"] == 2 == index_version(after) and r["added"] == 20
    assert ce.calls == r["ce_calls"] == 4 * 20  # one CE call per row per new item
    assert after.corpus.ids == full.ids and len(after) == 140
    # every stored row is the CE's exact row over all 140 items
    rows = after["auto_rows"]
    assert rows.shape == (4, 140)
    np.testing.assert_array_equal(rows[:, :120], before["auto_rows"])
    full_ce = StubCE()
    full_ce.set_items(full.texts)
    for q, row in zip(after.params["auto"]["row_queries"], rows, strict=True):
        np.testing.assert_allclose(row, full_ce.score(q, np.arange(140)), rtol=1e-6)
    np.testing.assert_allclose(after["de_items"][120:], StubDE().encode(new.texts))
    assert after.params["n_items"] == 140
    assert after.info["history"][-1]["op"] == "add"
    # new items are searched: a query of a new item's words has it first in its exact top-k
    q = " ".join(new.texts[3].split()[:5])
    hits = _search(idx, [q])[0]
    assert hits.exact_ids[0] == new.ids[3] and len(hits.ids) == 10


def test_add_refuses_duplicates_and_empty_texts_leaving_the_index_whole(tmp_path):
    idx = tmp_path / "idx"
    build(idx, rows=3)
    files = index_files(idx)
    c = open_index(idx).corpus
    cases = [
        (Corpus([c.ids[4], "x1"], ["a new text", "another"], "dup"), "already in the index"),
        (Corpus(["x1", "x1"], ["a", "b"], "dup2"), "appears twice"),
        (Corpus(["x1", "x2"], ["fine", "   "], "empty"), "empty text"),
    ]
    for items, msg in cases:
        with pytest.raises(ValueError, match=msg):
            add_items(idx, items, ce=StubCE(), de=StubDE())
        assert index_files(idx) == files


def test_a_rerun_after_a_commit_whose_clean_up_was_killed_removes_the_work(tmp_path):
    # kill -9 between the commit of the new version and the removal of the work folder: the
    # rerun finds the operation applied and leaves no work behind (nor a second version)
    full = corpus(130)
    idx = tmp_path / "idx"
    build(idx, Corpus(full.ids[:120], full.texts[:120], "base"), rows=2)
    new = Corpus(full.ids[120:], full.texts[120:], "new")
    assert add_items(idx, new, ce=StubCE(), de=StubDE())["version"] == 2
    left = idx / ".build" / "lifecycle" / "add"
    left.mkdir(parents=True)
    (left / "row_entries.npy").write_bytes(b"what a killed run left")
    r = add_items(idx, new, ce=StubCE(), de=StubDE())
    assert r["already"] and r["version"] == 2 == index_version(open_index(idx))
    assert not (idx / ".build").exists()


def test_add_with_a_faiss_round_index_adds_to_it(tmp_path):
    full = corpus(160)
    idx = tmp_path / "idx"
    build(idx, Corpus(full.ids[:140], full.texts[:140], "b"), rows=3, round_index="hnsw")
    add_items(idx, Corpus(full.ids[140:], full.texts[140:], "n"), ce=StubCE(), de=StubDE())
    after = open_index(idx)
    from crossknn.search.round_index import faiss_from_array

    fx = faiss_from_array(after["round_index"])
    assert fx.ntotal == 160
    s = Searcher(after, ce=StubCE(), de=StubDE())
    assert s.round_features.__class__.__name__ == "IndexedFeatures"
    q = " ".join(full.texts[150].split()[:5])
    assert s.search(q, k=10, budget=60, exact=True).exact_ids[0] == full.ids[150]


def test_removed_items_are_in_no_result_with_tombstones_then_compaction(tmp_path):
    idx = tmp_path / "idx"
    build(idx, corpus(150), rows=4)
    qs = queries(30, seed=7)
    before = _search(idx, qs)
    # remove items that were in the results
    top = [h.ids[0] for h in before[:8]]
    gone = sorted(set(top))
    r = remove_items(idx, gone, compact_at=0.5)
    assert not r["compacted"] and r["version"] == 2
    after = open_index(idx)
    assert len(after) == 150 and int(np.asarray(after["tombstones"]).sum()) == len(gone)
    hits = _search(idx, qs)
    assert all(not set(gone) & set(h.ids) for h in hits)
    assert all(not set(gone) & set(h.exact_ids) for h in hits)  # nor the exact top-k
    assert all(len(h.ids) == 10 for h in hits)
    rec_before = np.mean([h.recall for h in before])
    rec_after = np.mean([h.recall for h in hits])
    assert rec_after >= rec_before - 0.1
    # past the threshold: compacted, the removed items' rows, vectors and texts are gone
    more = [i for i in open_index(idx).corpus.ids if i not in gone][:70]
    r = remove_items(idx, more, compact_at=0.5)
    assert r["compacted"] and r["version"] == 3
    after = open_index(idx)
    dead = set(gone) | set(more)
    assert len(after) == 150 - len(dead) and not dead & set(after.corpus.ids)
    assert "tombstones" not in after.arrays and after["auto_rows"].shape[1] == len(after)
    hits = _search(idx, qs)
    assert all(not dead & set(h.ids) for h in hits)
    hist = [h["op"] for h in after.info["history"]]
    assert hist == ["remove", "remove"] and after.info["version"] == 3


def test_remove_refuses_unknown_ids_and_a_rerun_does_nothing(tmp_path):
    idx = tmp_path / "idx"
    build(idx, rows=3)
    with pytest.raises(ValueError, match="not in the index"):
        remove_items(idx, ["d1", "nope"])
    remove_items(idx, ["d1", "d2"])
    files = index_files(idx)
    r = remove_items(idx, ["d2", "d1"])
    assert r["already"] and index_files(idx) == files


def test_cli_add_and_remove(tmp_path, monkeypatch, capsys):
    from crossknn.cli import main
    from crossknn.commands import _common  # index_models opens the index's CE and DE

    idx = tmp_path / "idx"
    build(idx, rows=3)
    monkeypatch.setattr(_common, "open_index_models", lambda *a, **k: (StubCE(), StubDE()))
    items = write_items(tmp_path / "new.jsonl", corpus(5, prefix="n", seed=3))
    assert main(["add", str(idx), str(items), "--quiet"]) == 0
    assert "version 2: 5 items added, 15 CE calls" in capsys.readouterr().out
    assert main(["add", str(idx), str(items), "--quiet"]) == 0
    assert "added already" in capsys.readouterr().out
    ids = tmp_path / "ids.jsonl"
    ids.write_text(json.dumps({"id": "n1"}) + "\n" + json.dumps({"_id": "d7"}) + "\n")
    assert main(["remove", str(idx), "--ids", str(ids)]) == 0
    assert "version 3: 2 items removed, tombstoned" in capsys.readouterr().out
    ids.write_text("d8\nnot-there\n")
    assert main(["remove", str(idx), "--ids", str(ids)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'not-there'" in err[0]
    assert [h["op"] for h in open_index(idx).info["history"]] == ["add", "remove"]


@pytest.mark.parametrize("op", ["add", "remove"])
def test_a_rerun_after_a_kill_between_commit_and_collect_removes_the_old_files(
    tmp_path, monkeypatch, op
):
    """kill -9 right after the commit (index.json renamed) and before the previous version's
    files are removed: the rerun finds the operation applied and removes them, so the folder
    equals that of an uninterrupted run (seen in CI: tests/test_reliability_lifecycle.py)."""
    import crossknn.corpus.versions as versions

    full = corpus(130)
    base = Corpus(full.ids[:120], full.texts[:120], "base")
    new = Corpus(full.ids[120:], full.texts[120:], "new")

    def run(idx):
        if op == "add":
            return add_items(idx, new, ce=StubCE(), de=StubDE())
        return remove_items(idx, ["d3", "d7"], compact_at=0.0)

    clean, killed = tmp_path / "clean", tmp_path / "killed"
    for d in (clean, killed):
        build(d, base, rows=2)
    run(clean)

    class Killed(BaseException):
        pass

    def killed_collect(*_):
        raise Killed

    with monkeypatch.context() as m:
        m.setattr(versions, "_collect", killed_collect)
        with pytest.raises(Killed):
            run(killed)

    def files(d):  # every file of the index, index.json by the arrays it lists
        snap = index_files(d)
        snap["index.json"] = snap["index.json"]["arrays"]
        return snap

    assert index_version(open_index(killed)) == 2  # committed, the old files still there
    assert files(killed) != files(clean)
    r = run(killed)
    assert r["already"] and r["version"] == 2
    assert files(killed) == files(clean)
