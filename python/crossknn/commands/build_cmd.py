"""``crossknn build CORPUS INDEX_DIR``: index a user's corpus for ``crossknn search``."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import time
from pathlib import Path

from crossknn.ce.folders import open_cross_encoder, open_dual_encoder
from crossknn.commands._common import model_options
from crossknn.commands._printing import say_providers, terminal_safe
from crossknn.corpus.build import (
    build_corpus_index,
    corpus_build_key,
    refuse_living_index,
    settle_up_to_date,
)
from crossknn.corpus.pseudo_shape import check_example_queries
from crossknn.data import load_corpus, read_queries
from crossknn.index.auto import ITEMS_PER_ROW, expected_gain
from crossknn.outputs import check_output_folder as check_not_over

# what an index folder may hold: its own files and work folders (and atomic-write temp files)
_INDEX_FILES = {"index.json", "items.jsonl"}
_INDEX_FOLDERS = {".build", "exact"}


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
    except ValueError:
        return False
    return True


def check_output_folder(index_dir: str | os.PathLike, inputs: list[str]) -> None:
    """Refuse an output folder that is a file, contains an input, or holds files that are not
    an index's own: ``build`` must never overwrite or mix with a user's files."""
    out = Path(index_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} exists and is not a folder; give a new or empty folder")
    for src in inputs:
        p = Path(src)
        if p.exists() and _inside(p, out):
            raise ValueError(
                f"the output folder {out} contains the input {src}; building there would "
                "overwrite it: give another output folder"
            )
    if not out.is_dir():
        return
    entries = list(out.iterdir())
    is_index = any(e.name in ("index.json", ".build") for e in entries)
    for e in entries:
        # atomic-write temp files, and the lock a killed build left (taken over when it runs)
        own = e.name.startswith(".") and e.name.endswith(".tmp") or e.name == ".lock"
        if is_index:
            own = own or (
                e.name in _INDEX_FILES
                or re.fullmatch(r"items\.v\d+\.jsonl", e.name)  # an index version's texts
                or (e.name in _INDEX_FOLDERS or e.name.startswith(".index-stage-"))
                and e.is_dir()
                or e.suffix == ".npy"
                and e.is_file()
            )
        if not own:
            raise ValueError(
                f"the output folder {out} holds {e.name!r}, which is not part of an index; "
                "give a new or empty folder (or an index folder to rebuild or resume)"
            )


def _unchanged(exc: Exception, index_dir) -> Exception:
    """The error of a failed rebuild, saying that the old index is whole and usable (a rebuild
    writes beside it: crossknn.corpus.build)."""
    note = f"the old index in {index_dir} is unchanged and still usable"
    if isinstance(exc, OSError) and exc.strerror:
        return OSError(exc.errno, f"{exc.strerror}; {note}", exc.filename, None, exc.filename2)
    if isinstance(exc, ValueError):
        return ValueError(f"{exc}; {note}")
    return exc


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()

    if args.train_queries and args.example_queries:
        raise ValueError(
            "--example-queries shapes pseudo-queries, and a build with --train-queries makes "
            "none (its rows are the train queries): give one of them"
        )
    inputs = [args.corpus] + [f for f in (args.train_queries, args.example_queries) if f]
    check_output_folder(args.index_dir, inputs)
    named = [("CORPUS", args.corpus), ("--train-queries", args.train_queries)]
    named += [("--example-queries", args.example_queries)]
    named += [("--model", args.model), ("--de-model", args.de_model)]
    check_not_over(args.index_dir, kind="index", inputs=named, foreign=False)
    if not args.force:  # a living index is never replaced by a habitual rebuild
        refuse_living_index(args.index_dir, source=args.corpus)
    corpus = load_corpus(args.corpus)
    if len(corpus) < 2:
        raise ValueError(
            f"{args.corpus}: the corpus has {len(corpus)} item; an index needs at least 2 "
            "(k-NN search over one item needs no index: use crossknn rank)"
        )
    train = read_queries(args.train_queries) if args.train_queries else None
    examples = read_queries(args.example_queries) if args.example_queries else None
    if examples is not None:
        examples = check_example_queries(examples, src=args.example_queries)
    created = not Path(args.index_dir).exists()
    had_index = (Path(args.index_dir) / "index.json").is_file()
    opts = model_options(args)
    # the models first: a wrong folder or provider fails before the output folder is made
    ce = open_cross_encoder(args.model, precision=args.precision, **opts)
    de = open_dual_encoder(
        args.de_model, precision=args.de_precision, **{**opts, "batch_size": None}
    )
    say_providers(args, ce, de)
    settings = {
        "cur": args.cur,
        "calibration_queries": args.calibration_queries,
        "calibration_items": args.calibration_items,
        "seed": args.seed,
        "round_index": args.round_index,
        "index_calls": _index_calls(args),
        "index_minutes": args.index_minutes,
        "tune_rounds": args.tune_rounds,
    }
    key = corpus_build_key(
        corpus, ce, de, train_queries=train, example_queries=examples, **settings
    )
    if not args.force and settle_up_to_date(args.index_dir, key):
        print(
            f"index {terminal_safe(args.index_dir)} is up to date: built from the same "
            f"{len(corpus)} items with the same models and settings (--force rebuilds it)"
        )
        return 0
    try:
        idx = build_corpus_index(
            corpus,
            args.index_dir,
            ce=ce,
            de=de,
            train_queries=train,
            example_queries=examples,
            progress=not args.quiet,
            # up to date or not is decided above; under its lock the build checks again that
            # the folder holds no living index (a refine, add or remove may have run since)
            force=args.force,
            **settings,
        )
    except Exception as exc:
        # a failed build (full disk, unreadable model ...) leaves no half index behind; an
        # interrupted one (Ctrl-C) keeps its work folder and resumes when rerun
        if created:
            shutil.rmtree(args.index_dir, ignore_errors=True)
        elif had_index and (Path(args.index_dir) / "index.json").is_file():
            raise _unchanged(exc, args.index_dir) from None
        raise
    print(
        f"index {idx.path}: {len(corpus)} items, arrays {sorted(idx.arrays)}, "
        f"{idx.ce_calls} CE calls spent, {time.perf_counter() - t0:.1f} s; "
        f"CE {ce.model_id} ({ce.precision}), DE {de.model_id} ({de.precision})"
    )
    print(budget_summary(idx.params.get("budget")))
    print(max_length_line(ce, len(corpus)))
    print(auto_summary(idx.params.get("auto"), len(corpus), idx.params.get("budget")))
    if "pseudo_queries" in idx.params:
        print(pseudo_summary(idx.params["pseudo_queries"]))
    return 0


def pseudo_summary(shape: dict) -> str:
    """The line that says what the auto rows' pseudo-queries were (``params.pseudo_queries``)."""
    kinds = {
        "keywords": "one-word keywords",
        "mix": "keywords, first words and sentences",
        "passage": f"passages of {shape.get('words')} words",
    }
    line = f"pseudo-queries: {shape['count']} {kinds.get(shape['kind'], shape['kind'])}"
    if shape.get("from") == "example queries":
        return line + (
            f", chosen by {shape['examples']} example queries (median "
            f"{shape['median_words']:g} words)"
        )
    return line + " cut from the items (--example-queries shapes them to your queries)"


def max_length_line(ce, n_items: int) -> str:
    """The CE's maximum pair length and how many items it cuts (scorers without a tokenizer,
    such as test stand-ins, have no such line)."""
    length = getattr(ce, "max_length", None)
    if length is None:
        return "CE maximum length: not known for this CE"
    cut = ce.items_cut() if hasattr(ce, "items_cut") else None
    how = "" if cut is None else f"; {cut:,} of {n_items:,} items are longer and cut in every pair"
    return (
        f"CE maximum length: {length} tokens per (query, item) pair, truncated longest first"
        f"{how} (a model folder's manifest sets it)"
    )


def _index_calls(args: argparse.Namespace) -> int | str:
    """``--index-calls``: absent -> the default rule; C -> at most C CE calls (0: none)."""
    if args.index_calls is None:
        return "default"
    if args.index_minutes is not None:
        raise ValueError("--index-minutes caps the default index budget; drop --index-calls")
    return args.index_calls


def budget_summary(budget: dict | None) -> str:
    """The line that says how the index budget was spent (``params.budget``)."""
    if not budget:
        return "index budget: not recorded (an index built before it)"
    spent = budget["spent"]
    parts = [f"calibration {spent.get('calibration', 0):,}"]
    parts.append(f"auto rows {spent.get('auto_rows', 0):,}")
    if spent.get("auto_partial_rows"):
        parts.append(f"partial rows {spent['auto_partial_rows']:,}")
    for key, what in (("cur_rows", "--cur rows"), ("tune_rounds", "--tune-rounds")):
        if key in spent:
            parts.append(f"{what} {spent[key]:,} (of {budget['extra'][key]:,} stated)")
    line = (
        f"index budget: {budget['index_calls']:,} CE calls ({budget['rule']}); spent "
        f"{budget['ce_calls']:,}: " + ", ".join(parts)
    )
    cap = budget.get("time_cap")
    if cap:
        line += f"; time cap {cap['minutes']:g} min: " + (
            f"cut at {cap['rows_read']} of {cap['rows_planned']} rows"
            if cap["cut"]
            else f"not reached ({cap['rows_read']} rows)"
        )
    return line


def auto_summary(auto: dict | None, n_items: int, budget: dict | None = None) -> str:
    """The summary line of auto's index: CE calls spent and what they are expected to buy."""
    if auto is None:
        why = f"fewer than {ITEMS_PER_ROW} items" if n_items < ITEMS_PER_ROW else "none asked"
        if (budget or {}).get("time_cap"):
            why = "the time cap read no row"
        return f"auto index: none ({why}); crossknn search uses axn over the DE vectors"
    part = int(auto.get("partial_rows", 0))
    rows = f"{auto['rows']} complete rows" + (f" + {part} partial rows" if part else "")
    return (
        f"auto index: {auto['index_calls']:,} CE calls for {rows}; "
        f"{expected_gain(int(auto['index_calls']), n_items)}; crossknn search uses auto"
    )
