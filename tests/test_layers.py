"""The package's floors, read from the source (nothing is imported): files and subpackages as
rooms, top-level imports as arrows. A subpackage is one room (``crossknn.index`` holds
``files``, ``cur``, ``mf``, ...), a top-level module another; no arrow may run back up a floor,
so the rooms' graph has no circle, and the corpus index's life (``crossknn.corpus``) sits above
the index files and math of ``crossknn.index``, which knows nothing of corpora.
"""

from __future__ import annotations

from test_imports import GRAPH, MODULES, _cycles

CORPUS = "crossknn.corpus"
INDEX = "crossknn.index"


def room(module: str) -> str:
    """``crossknn.index.files`` -> ``crossknn.index``; ``crossknn.searcher`` -> itself."""
    parts = module.split(".")
    if len(parts) >= 3 or (len(parts) == 2 and MODULES[module][1]):
        return ".".join(parts[:2])
    return module


def _rooms() -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        here = room(module)
        rooms.setdefault(here, set())
        for t in targets:
            if t in MODULES and t != "crossknn" and room(t) != here:
                rooms[here].add(room(t))
    return rooms


ROOMS = _rooms()


def _floors(rooms: dict[str, set[str]]) -> dict[str, int]:
    """A room's floor: one above the highest room it imports (0 for none)."""
    floors: dict[str, int] = {}

    def floor(r: str) -> int:
        if r not in floors:
            floors[r] = -1  # on the stack: a circle reads as floor 0 here, the cycle test fails
            floors[r] = 1 + max(
                (floor(t) for t in rooms.get(r, ()) if floors.get(t) != -1), default=-1
            )
        return floors[r]

    for r in sorted(rooms):
        floor(r)
    return floors


def test_the_rooms_are_read():
    assert (
        room("crossknn.index.files") == INDEX and room("crossknn.searcher") == "crossknn.searcher"
    )
    assert room("crossknn.corpus") == CORPUS and room("crossknn.corpus.refine") == CORPUS
    assert {INDEX, CORPUS, "crossknn.serve", "crossknn.corpus_folder"} <= set(ROOMS)
    assert _cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b"]]


def test_no_import_runs_back_up_a_floor():
    """Rooms with a circle between them are rooms where some import runs up a floor."""
    cycles = _cycles(ROOMS)
    arrows = [
        f"{m} -> {t}"
        for c in cycles
        for m, targets in GRAPH.items()
        if room(m) in c
        for t in targets
        if t in MODULES and room(t) in c and room(t) != room(m)
    ]
    assert not cycles, (
        "rooms in a circle: "
        + "; ".join(" <-> ".join(c) for c in cycles)
        + ("\n" + "\n".join(sorted(arrows)))
    )


def test_the_corpus_life_stands_above_the_index_files_and_the_searcher():
    floors = _floors(ROOMS)
    assert floors[CORPUS] > floors["crossknn.searcher"] > floors["crossknn.corpus_folder"]
    assert floors["crossknn.corpus_folder"] > floors[INDEX]
    for above in ("crossknn.serve", "crossknn.commands", "crossknn.cli"):
        assert floors[above] > floors[CORPUS], above


def test_index_knows_nothing_of_corpora():
    corpus_rooms = {CORPUS, "crossknn.corpus_folder", "crossknn.searcher"}
    bad = sorted(
        f"{m} -> {t}"
        for m, targets in GRAPH.items()
        if room(m) == INDEX
        for t in targets
        if t in MODULES and room(t) in corpus_rooms
    )
    assert not bad, "crossknn.index imports corpus modules:\n" + "\n".join(bad)


def test_only_the_corpus_package_knows_both_corpus_folders_and_index_files():
    """A module that opens corpus index folders and writes index files runs the index's life:
    it belongs in crossknn.corpus (corpus_folder, the folder reader, is the one below it)."""
    both = sorted(
        m
        for m, targets in GRAPH.items()
        if "crossknn.corpus_folder" in targets and "crossknn.index.files" in targets
    )
    assert both, "the scan found no module that writes a corpus index"
    outside = [m for m in both if room(m) != CORPUS]
    assert not outside, f"modules outside {CORPUS} that know both: {outside}"
