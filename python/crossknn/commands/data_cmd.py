"""``crossknn data [NAME|DIR ...]``: which BEIR datasets crossknn finds, and what they hold.

A name is looked up in ``$CROSSKNN_DATA`` (``ROOT/NAME`` or ``ROOT/data/NAME``); a path is checked
as it is. Without arguments, every BEIR folder under ``$CROSSKNN_DATA`` is listed. The layout and
where the public datasets come from: docs/data.md.
"""

from __future__ import annotations

import argparse
import json
import sys

from crossknn.commands._printing import terminal_safe
from crossknn.data import BEIR_SOURCE, DATA_ENV, data_roots, describe_beir, list_beir


def run(args: argparse.Namespace) -> int:
    folders = args.names or list_beir()
    if not folders:
        roots = ", ".join(str(r) for r in data_roots()) or "unset"
        print(
            f"no BEIR dataset found (${DATA_ENV}: {roots}); set {DATA_ENV} to the folder that "
            f"holds NAME/corpus.jsonl, NAME/queries.jsonl, NAME/qrels/test.tsv; {BEIR_SOURCE}",
            file=sys.stderr,
        )
        return 1
    rows = [describe_beir(f) for f in folders]
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
        return 0
    for r in rows:
        splits = ", ".join(
            f"{s} {v['queries']} queries/{v['judgments']} judgments" for s, v in r["qrels"].items()
        )
        print(
            terminal_safe(
                f"{r['path']}: {r['items']} items, {r['queries']} queries; qrels: "
                f"{splits or 'none'}"
            )
        )
    return 0
