"""Quickstart: index a few texts, then search them with the cross-encoder on a budget of CE calls.

    python examples/quickstart.py [WORK_DIR]

Uses the embedded models (all-MiniLM-L6-v2 as the DE and as a zero-shot CE, exported to ONNX
into ~/.cache/crossknn or $CROSSKNN_CACHE on first use, about 10 s). The index goes to
WORK_DIR/index (a temporary folder by default). The same lines are in README.md.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import crossknn
from crossknn.data import Corpus

TEXTS = {
    "strptime": "time.strptime(string, format): parse a string to a time according to a format.",
    "fromisoformat": "datetime.fromisoformat(date_string): a datetime from an ISO 8601 string.",
    "loads": "json.loads(s): deserialize a str containing a JSON document to a Python object.",
    "dumps": "json.dumps(obj): serialize obj to a JSON formatted str.",
    "sleep": "time.sleep(secs): suspend execution of the calling thread for the given seconds.",
    "sort": "list.sort(key=None, reverse=False): sort the list in place, stable.",
    "sorted": "sorted(iterable, key=None): return a new sorted list from the items in iterable.",
    "urlopen": "urllib.request.urlopen(url): open the URL url, a string or a Request object.",
    "compile": "re.compile(pattern): compile a regular expression pattern into a pattern object.",
    "glob": "glob.glob(pathname): a list of path names that match pathname, a shell pattern.",
    "copyfile": "shutil.copyfile(src, dst): copy the contents of the file src to a file dst.",
    "mean": "statistics.mean(data): the sample arithmetic mean of data, a sequence or iterable.",
}


def main(work: Path) -> crossknn.Hits:
    corpus = Corpus(ids=list(TEXTS), texts=list(TEXTS.values()))  # or load_corpus("corpus.jsonl")
    crossknn.build_corpus_index(corpus, work / "index", progress=False)  # embedded DE and CE
    searcher = crossknn.Searcher(crossknn.open_index(work / "index"))
    hits = searcher.search("how do I parse a date?", k=3, budget=6)
    for rank, (item, score) in enumerate(zip(hits.ids, hits.scores, strict=True), 1):
        print(f"{rank}. {item:<14} CE score {score:.3f}")
    print(f"CE calls: {hits.ce_calls} of {len(corpus)} items")
    return hits


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp))
