"""``crossknn remove INDEX_DIR --ids FILE``: remove items from an index without a rebuild."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from crossknn.commands._printing import plural
from crossknn.corpus.edit import remove_items


def read_ids(path: str) -> list[str]:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"--ids {p}: no such file")
    out = []
    for no, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
        s = line.strip()
        if not s:
            continue
        if s.startswith("{"):
            try:
                rec = json.loads(s)
                s = str(rec.get("id", rec.get("_id")))
            except ValueError:
                raise ValueError(f"--ids {p}:{no}: expected an id or a JSON object") from None
            if s == "None":
                raise ValueError(f"--ids {p}:{no}: the JSON object has no 'id' or '_id'")
        out.append(s)
    return out


def run(args: argparse.Namespace) -> int:
    r = remove_items(args.index_dir, read_ids(args.ids), compact_at=args.compact_at)
    if r["already"]:
        print(f"index {args.index_dir}: these items were removed already (version {r['version']})")
        return 0
    dead = plural(r["dead"], "removed item")
    how = "compacted" if r["compacted"] else f"tombstoned ({dead} in all)"
    removed = plural(r["removed"], "item")
    print(f"index {args.index_dir}: version {r['version']}: {removed} removed, {how}")
    return 0
