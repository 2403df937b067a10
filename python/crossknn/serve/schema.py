"""The ``POST /search`` request: its schema (pydantic, shown in ``/docs``) and its checks.

Everything a client can get wrong is answered with ``422`` and a FastAPI-style ``detail`` list
naming the field: malformed JSON, a wrong type, an unknown field, and the checks that need the
index (``k > budget``, ``budget > N``, an empty query, an unknown method or one the index cannot
run, ``rounds > budget``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from crossknn.ce.tokenize import check_encodable
from crossknn.filters import FilterError, parse_filter
from crossknn.search import registry
from crossknn.search.round_plan import ROUNDS_GRID
from crossknn.text import is_blank  # one rule for queries, rerank texts and added items

__all__ = [
    "METHODS",
    "MAX_QUERY_CHARS",
    "MAX_RERANK_TEXTS",
    "RequestError",
    "RerankRequest",
    "SearchRequest",
    "is_blank",
    "parse_rerank_request",
    "parse_search_request",
]

METHODS = registry.names()  # every method `crossknn search` runs (crossknn.search.registry)
NEEDS_CUR = tuple(n for n, s in registry.REGISTRY.items() if s.index == "cur")
MAX_QUERIES = 64  # queries in one request
# the most rounds a request may ask for: the most auto chooses (round_plan.ROUNDS_GRID), so that
# a request may ask for the rounds an answer reports
MAX_ROUNDS = max(ROUNDS_GRID)
MAX_RERANK_TEXTS = 1000  # texts in one /rerank request (serve --max-rerank-texts)
# characters in one query (serve --max-query-chars): the CE reads at most its max_length tokens of
# a pair (128 for the embedded CE; 512 tokens are about 2,000 characters of English), so a longer
# query only costs memory and log space
MAX_QUERY_CHARS = 4096
MAX_IDS = 100_000  # ids in one request's id allow-list


class SearchRequest(BaseModel):
    """One search: ``query`` (one text) or ``queries`` (a list), as ``crossknn search``."""

    model_config = ConfigDict(extra="forbid")

    # json_schema_extra: bounds the server enforces (422 otherwise), shown in /openapi.json
    query: StrictStr | None = Field(
        None,
        description="one query text (or use 'queries'); at most the server's --max-query-chars "
        f"characters ({MAX_QUERY_CHARS:,} by default)",
        json_schema_extra={"minLength": 1},
    )
    queries: list[StrictStr] | None = Field(
        None,
        description=f"several query texts, searched together (at most {MAX_QUERIES})",
        json_schema_extra={"minItems": 1, "maxItems": MAX_QUERIES},
    )
    k: StrictInt = Field(
        10, description="results per query; 1 <= k <= budget", json_schema_extra={"minimum": 1}
    )
    budget: StrictInt = Field(
        100,
        description="CE calls per query; k <= budget <= items",
        json_schema_extra={"minimum": 1},
    )
    method: StrictStr | None = Field(
        None,
        description=f"one of {', '.join(METHODS)} (default: the server's --method); /info "
        "lists those this index runs",
    )
    rounds: StrictInt | None = Field(
        None,
        description="rounds of adaptive methods (default: the method's own: 5 for axn; auto: "
        f"its index's, or those its latency target allows); at most {MAX_ROUNDS} and the budget",
    )
    exact: StrictBool = Field(
        False, description="also score every item (N CE calls per query) and report the recall"
    )
    target_recall: float | None = Field(
        None,
        description="the early stop: a query stops once another round is unlikely to change its "
        "top-k, keeping on average this share of what the whole budget finds (calibrated on the "
        "index's rows; the budget stays the ceiling; each hit's 'stopped' says why it ended); "
        "default: the server's --target-recall (none: off)",
        json_schema_extra={"exclusiveMinimum": 0, "maximum": 1},
    )
    seed: StrictInt = Field(
        0,
        description="seed of the random choices (same seed, same result)",
        json_schema_extra={"minimum": 0},
    )
    return_documents: StrictBool = Field(
        False, description="each result also carries its item's text ('text')"
    )
    return_metadata: StrictBool = Field(
        False, description="each result also carries its item's metadata fields ('metadata')"
    )
    filter: dict[str, Any] | None = Field(
        None,
        description="only items whose metadata match it may be returned (and scored): a JSON "
        'filter such as {"lang": "en", "year": {"$gte": 2020}}, with $eq $ne $in $nin $gt $gte '
        "$lt $lte $exists $and $or $not and the field id, or the same in Qdrant's form "
        '({"must": [{"key": "lang", "match": {"value": "en"}}]}; docs: Filtered search); '
        "applies to every query of the request",
        examples=[
            {"lang": "en"},
            {"year": {"$gte": 2020, "$lt": 2024}, "tags": {"$in": ["email", "csv"]}},
            {"$or": [{"lang": "de"}, {"published": {"$gte": "2024-05-01"}}]},
            {"$not": {"open": True}},
            {"id": {"$in": ["d1", "d2", "d3"]}},
        ],
    )
    ids: list[StrictStr] | None = Field(
        None,
        description=f"an id allow-list: only these items may be returned (at most {MAX_IDS})",
        examples=[["d1", "d2", "d7"]],
        json_schema_extra={"maxItems": MAX_IDS},
    )

    def texts(self) -> list[str]:
        return [self.query] if self.query is not None else list(self.queries or [])

    # ``filter`` and ``ids`` reach the searcher as they came (two allow masks, combined there):
    # the limits checked here at parse time are the limits of what runs; nothing is rewritten


class RequestError(Exception):
    """A request the server refuses; ``detail`` is FastAPI's list of ``{loc, msg, type}``."""

    def __init__(self, detail: list[dict[str, Any]], status: int = 422) -> None:
        super().__init__(detail[0]["msg"] if detail else "bad request")
        self.detail = detail
        self.status = status


def _err(field: str | None, msg: str, kind: str = "value_error") -> RequestError:
    loc = ["body"] if field is None else ["body", field]
    return RequestError([{"loc": loc, "msg": msg, "type": kind}])


def _check_length(text: str, loc: list, max_chars: int) -> None:
    """422 for a query over ``max_chars`` characters."""
    if len(text) > max_chars:
        msg = (
            f"the query is {len(text):,} characters long; at most {max_chars:,} "
            "(the server's --max-query-chars)"
        )
        raise RequestError([{"loc": loc, "msg": msg, "type": "string_too_long"}])


def _check_text(text: str, loc: list) -> None:
    """422 for a text the tokenizer cannot take (a lone surrogate such as ``"\\ud800"``)."""
    try:
        check_encodable([text], "".join(f"[{x}]" if isinstance(x, int) else x for x in loc[1:]))
    except ValueError as exc:
        raise RequestError([{"loc": loc, "msg": str(exc), "type": "string_unicode"}]) from None


class RerankRequest(BaseModel):
    """One reranking (TEI / Infinity / Cohere field names): one query against ``texts`` (or
    Cohere's ``documents``), each scored by the CE."""

    model_config = ConfigDict(extra="forbid")

    query: StrictStr = Field(..., description="the query text", json_schema_extra={"minLength": 1})
    texts: list[StrictStr] | None = Field(
        None,
        description="the texts to rerank (TEI)",
        json_schema_extra={"minItems": 1, "maxItems": MAX_RERANK_TEXTS},
    )
    documents: list[StrictStr] | None = Field(
        None,
        description="the texts to rerank (Cohere; the answer is then Cohere-shaped)",
        json_schema_extra={"minItems": 1, "maxItems": MAX_RERANK_TEXTS},
    )
    top_n: StrictInt | None = Field(
        None, description="keep the best top_n (Cohere)", json_schema_extra={"minimum": 0}
    )
    top_k: StrictInt | None = Field(
        None, description="keep the best top_k (alias of top_n)", json_schema_extra={"minimum": 0}
    )
    return_documents: StrictBool | None = Field(
        None, description="results also carry their text (default false)"
    )
    return_text: StrictBool | None = Field(None, description="TEI's name of return_documents")
    raw_scores: StrictBool = Field(
        False, description="accepted and ignored: scores are the CE's, its activation applied"
    )
    truncate: StrictBool | None = Field(None, description="accepted (TEI); pairs are truncated")
    model: StrictStr | None = Field(None, description="accepted (Cohere); the server has one CE")

    @property
    def cohere(self) -> bool:
        return self.documents is not None

    def all_texts(self) -> list[str]:
        return list(self.texts if self.texts is not None else self.documents or [])

    def keep(self) -> int:
        n = len(self.all_texts())
        top = self.top_n if self.top_n is not None else self.top_k
        return n if top is None else min(top, n)

    def with_text(self) -> bool:
        return bool(self.return_documents or self.return_text)


class RerankResult(BaseModel):
    """One text of a ``/rerank`` answer (TEI's shape), best first."""

    index: int = Field(..., description="position of the text in the request")
    score: float = Field(..., description="the CE's score (its activation applied)")
    text: str | None = Field(None, description="the text, with return_documents / return_text")


class CohereDocument(BaseModel):
    text: str


class CohereResult(BaseModel):
    index: int
    relevance_score: float
    document: CohereDocument | None = None


class CohereRerankResponse(BaseModel):
    """The ``/rerank`` answer when the request used Cohere's ``documents``."""

    results: list[CohereResult]


class SearchResult(BaseModel):
    rank: int
    id: str
    score: float
    title: str | None = None
    text: str | None = Field(None, description="the item's text, with return_documents")
    metadata: dict[str, Any] | None = Field(
        None, description="the item's metadata fields, with return_metadata"
    )


class SearchHits(BaseModel):
    """One query's answer (``crossknn search --json``'s; more fields may follow)."""

    model_config = ConfigDict(extra="allow")

    qid: str | None = None
    query: str
    results: list[SearchResult]
    ce_calls: int
    allowed: int | None = Field(
        None,
        description="with a filter or ids (or removed items): how many items the query could be "
        "given; fewer than k: every one of them is in results",
    )
    unknown_ids: int = Field(
        0,
        description="how many distinct ids of the request's 'ids' the index does not hold "
        "(never added, or removed); 0 without ids",
    )
    rounds: int | None = Field(None, description="the rounds this query ran")
    stopped: str = Field(
        "budget",
        description="why the search ended: budget (its whole plan ran), found (the early stop "
        "of target_recall), allowed (its filter allowed at most budget items, all scored)",
    )
    round_calls: list[int] | None = Field(
        None, description="the CE calls each step of this query spent, in order"
    )


class SearchResponse(BaseModel):
    """The ``/search`` answer."""

    method: str
    k: int
    budget: int
    rounds: int | None = Field(
        None,
        description="the rounds that ran (the first hit's: a filter allowing at most B items "
        "runs one round, an early stop fewer; each hit has its own rounds and round_calls)",
    )
    plan: dict[str, Any] | None = Field(
        None,
        description="what ran: method, rounds, new items per step, and auto's round choice "
        "(rounds asked for, the index's, or chosen under the latency target)",
    )
    hits: list[SearchHits]


def _load_object(body: bytes, what: str) -> dict:
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _err(None, f"malformed JSON: {exc}", "json_invalid") from None
    except RecursionError:
        raise _err(None, f"malformed JSON: nested too deeply (a {what} is 2 levels deep)") from None
    if not isinstance(data, dict):
        raise _err(None, "the body must be a JSON object", "model_attributes_type")
    return data


def _validate(model, data: dict):
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        detail = [
            {"loc": ["body", *[str(x) for x in e["loc"]]], "msg": e["msg"], "type": e["type"]}
            for e in exc.errors(include_url=False)
        ]
        raise RequestError(detail) from None


def parse_rerank_request(
    body: bytes, *, max_texts: int = MAX_RERANK_TEXTS, max_query_chars: int = MAX_QUERY_CHARS
) -> RerankRequest:
    """Parse and check a ``/rerank`` body: a non-empty query of at most ``max_query_chars``
    characters, 1..max_texts non-empty texts, all valid Unicode, top_n / top_k >= 0."""
    req = _validate(RerankRequest, _load_object(body, "rerank request"))
    if req.texts is not None and req.documents is not None:
        raise _err("documents", "give texts (TEI) or documents (Cohere), not both")
    field = "texts" if req.documents is None else "documents"
    texts = req.all_texts()
    if req.texts is None and req.documents is None:
        raise _err("texts", "texts (or documents) is required", "missing")
    if not 1 <= len(texts) <= max_texts:
        raise _err(field, f"{field} must hold 1 to {max_texts} texts; got {len(texts)}")
    if is_blank(req.query):
        raise _err("query", "the query is empty")
    _check_length(req.query, ["body", "query"], max_query_chars)
    _check_text(req.query, ["body", "query"])
    for i, t in enumerate(texts):
        if is_blank(t):
            msg = f"{field}[{i}] is empty"
            raise RequestError([{"loc": ["body", field, i], "msg": msg, "type": "value_error"}])
        _check_text(t, ["body", field, i])
    for name in ("top_n", "top_k"):
        v = getattr(req, name)
        if v is not None and v < 0:
            raise _err(name, f"{name} must be >= 0; got {v}")
    return req


def parse_search_request(
    body: bytes,
    *,
    n_items: int,
    has_cur: bool,
    max_queries: int = MAX_QUERIES,
    max_rounds: int = MAX_ROUNDS,
    indexes: Sequence[str] | None = None,
    max_query_chars: int = MAX_QUERY_CHARS,
    fields: Mapping[str, str] | None = None,
) -> SearchRequest:
    """Parse and check a request body against an index of ``n_items`` items holding the method
    indexes ``indexes`` (kinds of crossknn.search.registry; default: ``cur`` when ``has_cur``)
    and the metadata ``fields`` (name -> kind) a ``filter`` may name; a query is at most
    ``max_query_chars`` characters."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _err(None, f"malformed JSON: {exc}", "json_invalid") from None
    except RecursionError:  # e.g. 100,000 nested '[': a request is at most 2 levels deep
        raise _err(
            None, "malformed JSON: nested too deeply (a search request is 2 levels deep)"
        ) from None
    if not isinstance(data, dict):
        raise _err(None, "the body must be a JSON object", "model_attributes_type")
    try:
        req = SearchRequest.model_validate(data)
    except ValidationError as exc:
        detail = [
            {"loc": ["body", *[str(x) for x in e["loc"]]], "msg": e["msg"], "type": e["type"]}
            for e in exc.errors(include_url=False)
        ]
        raise RequestError(detail) from None
    if (req.query is None) == (req.queries is None):
        raise _err("query", "give exactly one of 'query' (a text) or 'queries' (a list)", "missing")
    if req.query is not None and is_blank(req.query):
        raise _err("query", "the query is empty")
    if req.query is not None:
        _check_length(req.query, ["body", "query"], max_query_chars)
        _check_text(req.query, ["body", "query"])
    if req.queries is not None:
        if not req.queries:
            raise _err("queries", "the list of queries is empty")
        if len(req.queries) > max_queries:
            n = len(req.queries)
            raise _err("queries", f"at most {max_queries} queries per request; got {n}")
        for i, q in enumerate(req.queries):
            if is_blank(q):
                loc = ["body", "queries", i]
                raise RequestError(
                    [{"loc": loc, "msg": "the query is empty", "type": "value_error"}]
                )
            _check_length(q, ["body", "queries", i], max_query_chars)
            _check_text(q, ["body", "queries", i])
    if indexes is None:
        indexes = ("cur",) if has_cur else ()
    if req.method is not None:
        try:
            registry.check_available(req.method, indexes)
        except ValueError as exc:
            raise _err("method", str(exc)) from None
    if req.k < 1:
        raise _err("k", f"k must be >= 1; got {req.k}")
    if req.budget < 1:
        raise _err("budget", f"budget must be >= 1; got {req.budget}")
    if req.k > req.budget:
        raise _err(
            "k", f"k={req.k} exceeds the budget {req.budget} (at most budget items are ranked)"
        )
    if req.budget > n_items:
        raise _err("budget", f"budget={req.budget} exceeds the number of items ({n_items})")
    if req.rounds is not None and not 1 <= req.rounds <= min(req.budget, max_rounds):
        raise _err(
            "rounds",
            f"rounds must be in [1, min(budget, {max_rounds})] = "
            f"[1, {min(req.budget, max_rounds)}]; got {req.rounds}",
        )
    if req.seed < 0:
        raise _err("seed", f"seed must be >= 0; got {req.seed}")
    if req.target_recall is not None and not 0 < req.target_recall <= 1:
        raise _err("target_recall", f"target_recall must be in (0, 1]; got {req.target_recall}")
    if req.ids is not None and len(req.ids) > MAX_IDS:
        raise _err("ids", f"at most {MAX_IDS} ids per request; got {len(req.ids)}")
    if req.filter is not None:
        try:
            parse_filter(req.filter, fields or {}, where="filter")
        except FilterError as exc:
            loc, msg = filter_error_loc(str(exc), req.filter)
            raise RequestError([{"loc": loc, "msg": msg, "type": "value_error"}]) from None
    return req


def filter_error_loc(text: str, spec: Any) -> tuple[list, str]:
    """``(loc, msg)`` of a :class:`~crossknn.filters.FilterError` ``"filter.a.$gte: msg"`` on
    the filter ``spec``: the path is read against the filter itself, so a field name holding
    ``": "``, ``"."`` or ``"["`` stays one element (the message is split after the longest
    prefix that is a path into ``spec``; a path that matches nothing: split at the first
    ``": "``)."""
    start = 0
    best = None
    while True:
        cut = text.find(": ", start)
        if cut < 0:
            break
        where = text[:cut]
        if where.startswith("filter"):
            path = _path_in(spec, where[len("filter") :])
            if path is not None:
                best = (["body", "filter", *path], text[cut + 2 :])
        start = cut + 1
    if best is not None:
        return best
    where, _, msg = text.partition(": ")
    return ["body", *where.replace("[", ".").replace("]", "").split(".")], msg


def _path_in(node: Any, rest: str) -> list | None:
    """The keys and list positions of ``rest`` (``".a[2].b"``) walked from ``node``; None when
    it is not a path of ``node``."""
    if not rest:
        return []
    if rest.startswith(".") and isinstance(node, Mapping):
        for key in sorted((k for k in node if isinstance(k, str)), key=len, reverse=True):
            if rest[1:].startswith(key):
                tail = _path_in(node[key], rest[1 + len(key) :])
                if tail is not None:
                    return [key, *tail]
        return None
    if rest.startswith("[") and isinstance(node, list):
        end = rest.find("]")
        num = rest[1:end] if end > 0 else ""
        if num.isdigit() and int(num) < len(node):
            tail = _path_in(node[int(num)], rest[end + 1 :])
            if tail is not None:
                return [int(num), *tail]
    return None
