"""A /rerank client: send a query and texts to a running `crossknn serve`, print them by CE score.

    crossknn serve INDEX_DIR --port 8080 [--api-key-file key.txt]     # in another terminal
    python examples/rerank_client.py http://127.0.0.1:8080 [--api-key-file key.txt]

The request has the Text Embeddings Inference fields (``query``, ``texts``, ``top_n``,
``return_documents``); Cohere's (``documents``) work too. The server scores the pairs with the
index's cross-encoder, batched with the searches in flight. Uses httpx (the ``serve`` extra).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import httpx

QUERY = "how do I read a JSON file?"
TEXTS = [
    "time.sleep(secs): suspend execution of the calling thread for the given seconds.",
    "json.load(fp): deserialize fp, a text file holding a JSON document, to a Python object.",
    "shutil.copyfile(src, dst): copy the contents of the file src to a file dst.",
    "json.dumps(obj): serialize obj to a JSON formatted str.",
]


def rerank(url: str, query: str, texts: list[str], *, api_key: str | None = None, top_n=None):
    """The server's answer: ``[{"index": i, "score": s, "text": t}, ...]``, best first."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = {"query": query, "texts": texts, "return_documents": True}
    if top_n is not None:
        body["top_n"] = top_n
    resp = httpx.post(f"{url.rstrip('/')}/rerank", json=body, headers=headers, timeout=60.0)
    if resp.status_code != 200:  # errors are JSON with a "detail" naming the field
        sys.exit(f"/rerank answered {resp.status_code}: {resp.text}")
    return resp.json()


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url", help="the server, e.g. http://127.0.0.1:8080")
    ap.add_argument("--api-key-file", type=Path, help="the server's --api-key-file")
    ap.add_argument("--top-n", type=int, default=None)
    args = ap.parse_args(argv)
    key = args.api_key_file.read_text().strip() if args.api_key_file else None
    ranked = rerank(args.url, QUERY, TEXTS, api_key=key, top_n=args.top_n)
    print(f"query: {QUERY}")
    for rank, hit in enumerate(ranked, 1):
        print(f"{rank}. [{hit['index']}] {hit['score']:8.3f}  {hit['text']}")
    return ranked


if __name__ == "__main__":
    main()
