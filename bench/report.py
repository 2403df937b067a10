"""The README/docs result tables, rendered from bench/results JSON between markers.

    .venv/bin/python bench/report.py --list     # the blocks: name, source JSON, what
    .venv/bin/python bench/report.py --write    # rewrite every marked block in README.md, docs/
    .venv/bin/python bench/report.py --check    # exit 1 naming FILE:BLOCK where a table drifted
    .venv/bin/python bench/report.py --show recall-cisi   # print one table

A block in any Markdown file is two marker lines; ``--write`` replaces what is between them:

    <!-- report:NAME -->
    <!-- /report:NAME -->

Tables carry numbers only; the prose around them (hardware, date, the command that reproduces
them) is written above the marker. A block may appear in several files. An unknown name, an
unclosed marker or a missing source JSON is an error naming the file and the block. ``make
test`` runs ``--check`` (``make report-check``), so a committed table cannot drift from the JSON:
after a bench run, ``--write`` and commit the JSON and the tables together.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
RECALL = RESULTS / "recall"

MARKER = re.compile(
    r"(?P<open><!-- report:(?P<name>[a-z0-9-]+) -->\n)(?P<body>.*?)"
    r"(?P<close><!-- /report:(?P=name) -->)",
    re.S,
)
OPENING = re.compile(r"<!-- report:([a-z0-9-]+) -->")


class ReportError(Exception):
    """A block that cannot be rendered or found (one line: file, block, what is wrong)."""


def load(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReportError(f"missing result file {path.relative_to(REPO)}") from None


def pick(rows: list[dict], source: str, **want) -> dict:
    """The one row of ``rows`` whose fields equal ``want``."""
    hits = [r for r in rows if all(r.get(k) == v for k, v in want.items())]
    if len(hits) != 1:
        raise ReportError(f"{source}: expected one row with {want}, found {len(hits)}")
    return hits[0]


def table(header: list[str], rows: list[list[str]], align: str) -> str:
    """A Markdown table; ``align`` has one letter per column: l(eft) or r(ight)."""
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = [header, rule, *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines) + "\n"


def f3(x: float) -> str:
    return f"{x:.3f}"


def count(n: int) -> str:
    return f"{n:,}"


def power10(n: int) -> str:
    """``100000`` -> ``10⁵`` (the sizes are powers of ten)."""
    return "10" + str(len(str(n)) - 1).translate(str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹"))


def ms(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:.0f}"


# ---- recall on the shared score matrices (bench/recall_bench.py) --------------------------------


def recall_rows(name: str) -> tuple[list[dict], str]:
    path = RECALL / f"{name}.json"
    return load(path)["rows"], str(path.relative_to(REPO))


def recall_cells(rows, source, cells, **want) -> list[str]:
    return [f3(pick(rows, source, k=k, budget=b, **want)["recall"]) for k, b in cells]


CISI_CELLS = [(10, 50), (10, 100), (10, 200), (10, 500), (100, 100), (100, 200), (100, 500)]


def render_recall_cisi() -> str:
    rnr, s_rnr = recall_rows("eval_cisi_rnr")
    rand, s_rand = recall_rows("eval_cisi")
    de, s_de = recall_rows("eval_cisi_de")
    out = []

    def row(label, rows, source, **want):
        calls = count(pick(rows, source, k=10, budget=100, **want)["index_ce_calls"])
        out.append([label, calls, *recall_cells(rows, source, CISI_CELLS, **want)])

    row("RNR, TF-IDF", rnr, s_rnr, method="rnr", first="tfidf")
    row("RNR, DE", rnr, s_rnr, method="rnr", first="de")
    row("ANNCUR", rand, s_rand, method="anncur", first="random")
    row("ADACUR No-Split, TopK, 5 rounds", rand, s_rand, method="adacur", first="random")
    row("ADACUR No-Split, SoftMax, 5 rounds", rand, s_rand, method="adacur-softmax")
    row("ADACUR No-Split, DE first, 5 rounds", de, s_de, method="adacur", first="de")
    row("AXN (V = DE items, λ = 0.5), DE first", de, s_de, method="axn", first="de")
    for share, label in (("0pct", "no row"), ("10pct", "10% of dense"), ("100pct", "dense")):
        rows, source = recall_rows(f"eval_cisi_auto_{share}")
        row(f"`auto`, DE first, {label}", rows, source, method="auto")
    header = ["method", "index CE calls", "k=10 B=50", "B=100", "B=200", "B=500"]
    header += ["k=100 B=100", "B=200", "B=500"]
    return table(header, out, "lrrrrrrrr")


NF_CELLS = [(10, 50), (10, 100), (10, 200), (50, 50), (50, 100), (50, 200)]
NF_HEADER = ["method", "index CE calls", "k=10 B=50", "B=100", "B=200", "k=50 B=50", "B=100"]
NF_HEADER += ["B=200"]


def auto_label(rows: list[dict], source: str, suffix: str = "") -> str:
    params = pick(rows, source, k=10, budget=100)["auto"]
    n, partial = params.get("rows", 0), params.get("partial_rows", 0)
    what = "no row" if n == 0 else f"{count(n)} rows" + (f" + {partial} partial" if partial else "")
    return f"`auto`, {what}{suffix}"


def render_recall_nfcorpus() -> str:
    base, s_base = recall_rows("eval_nfcorpus_base")
    out = []

    def row(label, rows, source, bold=False, **want):
        calls = count(pick(rows, source, k=10, budget=100, **want)["index_ce_calls"])
        cells = [label, calls, *recall_cells(rows, source, NF_CELLS, **want)]
        out.append([f"**{c}**" for c in cells] if bold else cells)

    row("RNR over the DE top-B", base, s_base, method="rnr")
    row("AXN over DE (`--index-calls 0`)", base, s_base, method="axn")
    for share, suffix in (("0pct", ""), ("1pct", " (1% of dense)"), ("default", "")):
        rows, source = recall_rows(f"eval_nfcorpus_auto_{share}")
        if share == "default":
            suffix = " (the default build)"
        label = auto_label(rows, source, suffix)
        row(label, rows, source, bold=share == "default", method="auto")
    for share, suffix in (("10pct", " (10% of dense)"), ("100pct", " (dense)")):
        rows, source = recall_rows(f"eval_nfcorpus_auto_{share}")
        row(auto_label(rows, source, suffix), rows, source, method="auto")
    row("ADACUR No-Split, dense CUR", base, s_base, method="adacur")
    return table(NF_HEADER, out, "lrrrrrrr")


def render_auto_rounds() -> str:
    """auto on the default build's index at fewer rounds: the recall a latency target trades."""
    rows, source = recall_rows("eval_nfcorpus_auto_rounds_default")
    grid = sorted({r["rounds"] for r in rows}, reverse=True)
    best = pick(rows, source, k=10, budget=100, rounds=max(grid))["recall"]
    out = []
    for n in grid:
        cells = recall_cells(rows, source, NF_CELLS, rounds=n)
        k10 = pick(rows, source, k=10, budget=100, rounds=n)["recall"]
        out.append([str(n), *cells, f"{k10 - best:+.3f}"])
    header = ["rounds", *NF_HEADER[2:], "k=10 B=100 vs most rounds"]
    return table(header, out, "rrrrrrrr")


# ---- speed on the CPU ----------------------------------------------------------------------------

OVERHEAD = RESULTS / "overhead_bench.xeon2.json"


def overhead_ms(rows, method: str, budget: int, loop: str = "cpp") -> float:
    return pick(rows, "overhead_bench", method=method, budget=budget, loop=loop)["other_ms_p50"]


def render_default_vs_rnr() -> str:
    base, s_base = recall_rows("eval_nfcorpus_base")
    auto, s_auto = recall_rows("eval_nfcorpus_auto_default")
    cells = [(10, 50), (10, 100), (10, 200)]
    out = []
    for label, rows, source, method in (
        ("rerank the DE top-B with the CE (RNR)", base, s_base, "rnr"),
        ("crossknn default (`auto`, default build)", auto, s_auto, "auto"),
    ):
        at100 = pick(rows, source, k=10, budget=100, method=method)
        rec = recall_cells(rows, source, cells, method=method)
        batches = str(at100["rounds"])
        out.append([label, count(at100["index_ce_calls"]), *rec, batches])
    header = ["nfcorpus-minilm-gpu, 323 test queries", "index CE calls"]
    header += ["Top-10-Recall B=50", "B=100", "B=200", "CE batches per query (B=100)"]
    return table(header, out, "lrrrrr")


def render_overhead() -> str:
    rows = load(OVERHEAD)["rows"]
    out = []
    for b in (100, 500):
        cells = [ms(overhead_ms(rows, m, b)) for m in ("auto", "axn", "adacur", "rnr")]
        cells += [ms(overhead_ms(rows, "auto", b, "cpp-consecutive"))]
        out.append([str(b), *cells])
    header = ["B", "auto", "AXN", "ADACUR", "RNR", "auto, queries back to back"]
    return table(header, out, "rrrrrr")


def render_core_engine() -> str:
    d = load(RESULTS / "core_bench.epyc2.json")
    out = []
    for r in d["rows"]:
        if "engine_query_s" not in r:
            continue
        n = power10(r["N"])
        pct = f"{r['topk_float32_GBps']:.0f} ({100 * r['topk_float32_vs_copy']:.0f}%)"
        out.append(
            [
                n,
                str(r["d"]),
                f"{1000 * r['ref_query_s']:.1f}",
                f"{1000 * r['engine_query_s']:.1f}",
                f"{r['speedup_vs_ref']:.1f}x",
                f"{r['speedup_int8_vs_ref']:.1f}x",
                pct,
                f"{r['int8_speedup']:.1f}x",
                f"{r['batch_speedup']:.1f}x",
            ]
        )
    header = ["N", "d", "paper-style round ms / query", "engine ms / query", "x", "int8 engine x"]
    header += ["top-k GB/s (% of copy)", "int8 vs float32 top-k", "batch of 64 vs 64 single"]
    return table(header, out, "rrrrrrrrr")


def render_scale() -> str:
    d = load(RESULTS / "scale_bench.cpu2.json")
    out = []
    for r in d["rows"]:
        kind = r["round_index"]
        if kind == "exact":
            what, width = f"exact {r['storage']}", "–"
        else:
            what = "IVF" if kind == "ivf" else "HNSW"
            widths = sorted(set((r.get("round_widths") or {str(0): r["width"]}).values()))
            span = f"{widths[0]}" if len(widths) == 1 else f"{widths[0]}–{widths[-1]}"
            width = f"{r['width_name']} {span}" + (" per round" if len(widths) > 1 else "")
        side = "–"
        if "side_by_side_ratio" in r:
            side = f"{r['side_by_side_index_ms']:.1f} vs {r['side_by_side_exact_ms']:.0f} ms"
            side += f" = **1/{1 / r['side_by_side_ratio']:.0f}**"
        build = "–"
        if r.get("build_s") is not None:
            build = f"{r['build_s']:.0f} s, {r['build_rss_mb']:.0f} MB RSS, "
            build += f"{r['index_mb']:.0f} MB file"
        out.append(
            [
                power10(r["N"]),
                str(r["d"]),
                what,
                width,
                f"{r['engine_ms_per_query']:.1f}",
                side,
                f3(r["recall"]),
                f"{r['recall_vs_exact']:+.3f}",
                f"{r['peak_rss_mb']:.0f}",
                build,
            ]
        )
    header = ["N", "d", "rounds", "width", "engine ms / query", "vs exact, side by side"]
    header += ["Top-10-Recall@100", "vs exact", "peak RSS MB", "index build"]
    return table(header, out, "rrllrrrrrl")


def render_ce_runtime() -> str:
    rows = load(RESULTS / "ce_bench.epyc2.json")["rows"]
    out = []
    for length in (128, 256):
        for batch in (16, 64):

            def rate(backend, length=length, batch=batch):
                return pick(rows, "ce_bench", max_length=length, batch_size=batch, backend=backend)[
                    "pairs_per_s"
                ]

            torch, fp32, int8 = rate("torch-eager"), rate("ort-fp32"), rate("ort-int8")
            cells = [f"{torch:.1f}", f"{rate('torch-eager-attn'):.1f}", f"{fp32:.1f}"]
            cells += [f"{int8:.1f}", f"{fp32 / torch:.2f}x", f"{int8 / torch:.2f}x"]
            out.append([str(length), str(batch), *cells])
    header = ["max len", "batch", "PyTorch eager (SDPA)", "PyTorch eager attention", "ORT fp32"]
    header += ["ORT int8", "fp32 x", "int8 x"]
    return table(header, out, "rrrrrrrr")


# ---- serving -------------------------------------------------------------------------------------

SERVE = RESULTS / "serve_bench.cpu2.json"


def render_serve_load() -> str:
    d = load(SERVE)
    out = []
    for r in d["rows"]:
        if "batching" not in r:
            continue
        server = "batching on" if r["batching"] else "batching off"
        if r.get("max_queue"):
            server += f", `--max-queue {r['max_queue']}`"
        errors = r.get("errors") or {}
        err = ", ".join(f"{n} x {code}" for code, n in sorted(errors.items())) or "none"
        cells = [str(r["concurrency"]), server, f"{r['qps']:.2f}"]
        cells += [f"{r[k]:.0f}" for k in ("p50_ms", "p95_ms", "p99_ms")]
        cells += [f"{r['mean_batch_pairs']:.0f}", f"{err} ({r['requests']} requests)"]
        out.append(cells)
    header = ["concurrency", "server", "q/s", "p50 ms", "p95 ms", "p99 ms"]
    header += ["mean CE batch (pairs)", "errors"]
    return table(header, out, "rlrrrrrl")


def render_serve_overload() -> str:
    d = load(SERVE)["overload"]
    out = []
    for r in d["rows"]:
        rule = "expected wait within the deadline (default)"
        if r["admission"] != "deadline":
            rule = "queue limit alone (`--admit-within 0`)"
        out.append(
            [
                rule,
                str(r["n_200"]),
                str(r["n_429"]),
                str(r["n_5xx"]),
                str(r["n_late"]),
                f"{r['goodput_over_sustainable']:.2f}",
                f"{r['p50_ms_429']:.1f} ms",
                f"{r['healthz_probes']} probes, {'all 200' if r['healthz_ok'] else 'failures'}",
            ]
        )
    header = ["admission", "200", "429", "5xx", "late", "goodput / sustainable", "429 p50"]
    header += ["`/healthz`"]
    return table(header, out, "lrrrrrrl")


# ---- the goals objects of the reliability and living-index benches ------------------------------

# goal key -> (target as written, test on the value)
API_GOALS = {
    "fuzz_requests": ("≥ 5,000", lambda v: v >= 5000),
    "fuzz_5xx": ("0", lambda v: v == 0),
    "fuzz_schema_violations": ("0", lambda v: v == 0),
    "fuzz_leaks": ("0", lambda v: v == 0),
    "soak_minutes": ("≥ 30", lambda v: v >= 30),
    "soak_5xx": ("0", lambda v: v == 0),
    "soak_p99_ratio": ("≤ 1.2", lambda v: v <= 1.2),
    "soak_rss_growth": ("≤ 0.05", lambda v: v <= 0.05),
    "kill_restarts": ("20", lambda v: v >= 20),
    "kill_max_ready_s": ("≤ 10", lambda v: v <= 10),
    "kill_wrong_answers": ("0", lambda v: v == 0),
}
LIFECYCLE_GOALS = {
    "refine_vs_real_rows": ("≥ −0.005", lambda v: v >= -0.005),
    "refine_vs_pseudo": ("≥ +0.05", lambda v: v >= 0.05),
    "add_vs_rebuild": ("≥ −0.01", lambda v: v >= -0.01),
    "add_time_share": ("≤ 0.15", lambda v: v <= 0.15),
    "remove_leaks": ("0", lambda v: v == 0),
    "swap_non_2xx": ("0", lambda v: v == 0),
}

CHAOS_GOALS = {
    "operations": ("≥ 200", lambda v: v >= 200),
    "kills": ("≥ 30", lambda v: v >= 30),
    "removed_served": ("0", lambda v: v == 0),
    "short_answers": ("0", lambda v: v == 0),
    # None (not measured) below 1,000 sampled entries
    "wrong_row_entries": ("0 of ≥ 1,000 sampled", lambda v: v == 0),
    "log_records_lost": ("0", lambda v: v == 0),
    "non_2xx": ("0 (429 with Retry-After allowed)", lambda v: v == 0),
    "rss_growth": ("≤ 0.05", lambda v: v <= 0.05),
}
DAY_ONE_GOALS = {
    "gap_closed_min": ("≥ 0.5", lambda v: v >= 0.5),
    "worst_vs_keywords": ("≥ −0.005", lambda v: v >= -0.005),
    "reproducible": ("true", lambda v: v is True),
    "calibration_in_budget": ("true", lambda v: v is True),
}


def goals_table(name: str, targets: dict) -> str:
    goals = load(RESULTS / name).get("goals")
    if not isinstance(goals, dict) or set(goals) != set(targets):
        raise ReportError(f"{name}: a goals object with exactly the keys {sorted(targets)}")
    out = []
    for key, (target, ok) in targets.items():
        v = goals[key]
        met = "not measured" if v is None else ("met" if ok(v) else "**missed**")
        shown = "–" if v is None else str(v).lower() if isinstance(v, bool) else f"{v:g}"
        out.append([f"`{key}`", shown, target, met])
    return table(["goal", "measured", "target", ""], out, "lrrl")


def render_api_contract() -> str:
    return goals_table("api_contract.json", API_GOALS)


def render_lifecycle() -> str:
    return goals_table("lifecycle_bench.json", LIFECYCLE_GOALS)


FILTER_GOALS = {
    "leaks": ("0", lambda v: v == 0),
    "recall_drop_worst": ("≥ −0.02", lambda v: v >= -0.02),
    "exact_when_small": ("1.0", lambda v: v == 1.0),
    "overhead_ratio_10": ("≤ 1.2", lambda v: v <= 1.2),
    "scale_1e6_recall_drop_1": ("≥ −0.01", lambda v: v >= -0.01),
    "scale_1e6_ms_1": ("≤ 2× unfiltered", None),
    "tombstone_short_answers": ("0", lambda v: v == 0),
    "tombstone_ce_calls": ("0", lambda v: v == 0),
}


def render_filter_goals() -> str:
    goals = dict(load(RESULTS / "filter_bench.json").get("goals") or {})
    ratio = goals.pop("scale_1e6_ms_1_vs_unfiltered", None)
    targets = dict(FILTER_GOALS)
    targets["scale_1e6_ms_1"] = ("≤ 2× unfiltered", lambda v: ratio is not None and ratio <= 2)
    if set(goals) != set(targets):
        raise ReportError(f"filter_bench.json: a goals object with the keys {sorted(targets)}")
    out = []
    for key, (target, ok) in targets.items():
        v = goals[key]
        met = "not measured" if v is None else ("met" if ok(v) else "**missed**")
        shown = "–" if v is None else f"{v:g}"
        if key == "scale_1e6_ms_1" and v is not None and ratio is not None:
            shown += f" ({ratio:g}× unfiltered)"
        out.append([f"`{key}`", shown, target, met])
    return table(["goal", "measured", "target", ""], out, "lrrl")


def render_filter_recall() -> str:
    d = load(RESULTS / "filter_bench.json")
    out = []
    for name, m in d.get("matrices", {}).items():
        for kind in ("random", "correlated", "anti"):
            rows = sorted(
                (r for r in m["rows"] if r["kind"] == kind), key=lambda r: -r["selectivity"]
            )
            cells = [f"{f3(r['recall'])} ({r['ce_calls_mean']:.0f})" for r in rows]
            out.append([name, kind, *cells, f3(rows[0]["recall_unfiltered"])])
    sels = ["50%", "10%", "1%", "0.1%"]
    header = ["matrix", "filter", *[f"{s} (CE calls)" for s in sels], "no filter"]
    return table(header, out, "llrrrrr")


def render_filter_scale() -> str:
    sc = load(RESULTS / "filter_bench.json").get("scale")
    if not sc:
        raise ReportError(
            "filter_bench.json has no scale part (bench/filter_bench.py --part scale)"
        )
    out = [["no filter", "–", "–", "–", f"{sc['unfiltered_ivf_ms']:.2f}", "–"]]
    for r in sc["rows"]:
        out.append(
            [
                f"{r['selectivity']:.0%}",
                f"{r['exact_rounds_ms']:.2f} / {f3(r['exact_rounds_recall'])}",
                f"{r['ivf_exact_over_allowed_ms']:.2f} / {f3(r['ivf_exact_over_allowed_recall'])}",
                f"{r['ivf_selector_ms']:.2f} / {f3(r['ivf_selector_recall'])}",
                f"{r['ivf_default_ms']:.2f}",
                r["ivf_default_path"],
            ]
        )
    header = [
        f"filter ({power10(sc['N'])} items)",
        "exact rounds: ms / recall",
        "IVF, exact over allowed",
        "IVF, selector",
        "IVF default ms",
        "default way",
    ]
    return table(header, out, "lrrrrl")


TENANT_GOALS = {
    "mismatches": ("0", lambda v: v == 0),
    "cases": ("≥ 100,000", lambda v: v >= 100_000),
    "max_extra_rss_mb_per_mb_body": ("≤ 20", lambda v: v <= 20),
    "cross_request_failures": ("0", lambda v: v == 0),
}


def render_tenant_goals() -> str:
    return goals_table("filter_fuzz.json", TENANT_GOALS)


# where the suite's time goes: test files by what costs them their time (docs/design/test-times.md)
TEST_TIME_KINDS = {
    "the docs walk (each step a `crossknn` process)": ["test_docs_walk"],
    "the embedded CE: its int8 export, parity": ["test_rescore", "test_ce"],
    "the wheel in a fresh venv": ["test_wheel_install"],
    "tokenizer parity (standard-library texts)": ["test_ce_tokenize", "test_corpus", "test_data"],
    "real servers (`crossknn serve`)": [
        "test_serve",
        "test_serve_reload",
        "test_api_contract",
        "test_serve_filters",
        "test_serve_groups",
        "test_serve_rerank",
        "test_reliability_serve",
        "test_lifecycle_defects",
        "test_tenant_isolation",
    ],
    "index builds and searches with the real CE": [
        "test_auto_build",
        "test_searcher",
        "test_hub_models",
        "test_embedded_onnx",
        "test_demo",
        "test_round_index_cli",
        "test_examples",
    ],
    "kill -9 and rerun (reliability)": ["test_reliability_lifecycle", "test_reliability_build"],
    "Ray clusters": ["test_shards", "test_jobs_ray"],
}


def _test_runs() -> tuple[dict, list[str]]:
    runs = load(RESULTS / "test_times.json").get("runs") or {}
    if "before" not in runs:
        raise ReportError("test_times.json: no 'before' run (bench/_test_times.py --label before)")
    return runs, [label for label in ("before", "after") if label in runs]


def render_test_times() -> str:
    """make test's and pytest's wall times before and after."""
    runs, labels = _test_runs()
    out = []
    for label in labels:
        r = runs[label]
        out.append(
            [
                label,
                r.get("date", "")[:10],
                f"{r.get('make_test_s', '–')}",
                f"{r['pytest_s']:.0f}",
                "–"
                if not r.get("collection_s")
                else f"{min(r['collection_s']):.1f}–{max(r['collection_s']):.1f}",
                f"{r['tests']:,}",
                f"{r['test_seconds_total']:.0f}",
            ]
        )
    head = ["run", "date", "make test s", "pytest s", "collection s", "tests", "test seconds (sum)"]
    return table(head, out, "llrrrrr")


def render_test_time_kinds() -> str:
    """The test seconds of each run by what costs them (:data:`TEST_TIME_KINDS`)."""
    runs, labels = _test_runs()
    rows = []
    for kind, files in TEST_TIME_KINDS.items():
        cells = []
        for label in labels:
            per_file = runs[label]["per_file"]
            total = sum(per_file.get(f"tests/{f}.py", {}).get("seconds", 0) for f in files)
            cells.append(f"{total:.0f}")
        rows.append([kind, *cells])
    named = {f"tests/{f}.py" for files in TEST_TIME_KINDS.values() for f in files}
    rest = []
    for label in labels:
        per_file = runs[label]["per_file"]
        rest.append(f"{sum(v['seconds'] for k, v in per_file.items() if k not in named):.0f}")
    rows.append(["every other test file", *rest])
    head = ["where the test seconds go", *[f"{x} s" for x in labels]]
    return table(head, rows, "l" + "r" * len(labels))


def render_lifecycle_chaos() -> str:
    return goals_table("lifecycle_chaos.json", CHAOS_GOALS)


def render_day_one_goals() -> str:
    return goals_table("day_one_rows.json", DAY_ONE_GOALS)


def render_day_one_choice() -> str:
    """Each pseudo-query candidate's Top-10-Recall@B (B = 50 / 100 / 200) on train queries of
    seeded item subsets, beside rows of real train queries."""
    ch = load(RESULTS / "day_one_rows.json").get("choice")
    if not isinstance(ch, dict) or not ch.get("recall"):
        raise ReportError("day_one_rows.json: no 'choice' (recall_bench.py day-one --part choose)")
    rec, setup = ch["recall"], ch["setup"]
    corpora = [c for c in ("cisi", "nfcorpus", "scifact") if c in rec]
    names = list(dict.fromkeys(n for c in corpora for n in rec[c]))
    names.sort(key=lambda n: (n == "real_rows", n != "keywords"))
    out = []
    for n in names:
        cells = []
        for c in corpora:
            r = rec[c].get(n)
            cells.append(
                "–" if r is None else " / ".join(f"{r[b]:.3f}" for b in ("50", "100", "200"))
            )
        out.append([f"`{n}`" if n != "real_rows" else "rows of real train queries", *cells])
    head = [
        f"{c} ({setup[c]['items']} items, {setup[c]['rows']} rows, {setup[c]['queries']} q)"
        for c in corpora
    ]
    return table(["pseudo-queries", *head], out, "l" + "r" * len(corpora))


def render_day_one_final() -> str:
    """Top-10-Recall@B (B = 50 / 100 / 200) on all items and the test queries of each corpus
    ``--part final`` measured: the default build, keyword rows, --example-queries, real rows,
    RNR; and the CE calls each build spent against its budget."""
    fin = load(RESULTS / "day_one_rows.json").get("corpora")
    if not isinstance(fin, dict) or not fin:
        raise ReportError("day_one_rows.json: no 'corpora' (recall_bench.py day-one --part final)")
    corpora = [c for c in ("cisi", "nfcorpus", "scifact") if c in fin]
    names = {
        "default": "default build (`crossknn build`, no flag)",
        "keywords": "keyword pseudo-queries given as train queries",
        "examples": "`--example-queries` (8 train queries)",
        "real_rows": "rows of the train queries (`--train-queries`)",
        "rnr": "RNR (DE top-B reranked)",
    }
    trials = sorted({k for c in corpora for k in fin[c]["recall"]} - set(names))
    for key in trials:  # earlier code and ablations (--final-trials), kept for the record
        names[key] = f"trial `{key}`"
    names["rnr"] = names.pop("rnr")
    out = []
    for key, label in names.items():
        cells = []
        for c in corpora:
            r = fin[c]["recall"].get(key)
            spent = fin[c].get("budget", {}).get(key)
            cell = "–" if r is None else " / ".join(f"{r[b]:.3f}" for b in ("50", "100", "200"))
            if r is not None and spent is not None:
                cell += f" ({spent['ce_calls']:,} calls)"
            cells.append(cell)
        out.append([label, *cells])
    head = [
        f"{c} ({fin[c]['items']:,} items, {fin[c]['rows']} rows, {fin[c]['test_queries']} test q)"
        for c in corpora
    ]
    return table(["index", *head], out, "l" + "r" * len(corpora))


# ---- quality of the embedded CE on BEIR ----------------------------------------------------------


def render_beir_ndcg() -> str:
    d = load(RESULTS / "beir_ndcg.json")
    names = {"nfcorpus": "NFCorpus", "scifact": "SciFact"}
    out = []
    for key, res in d["results"].items():
        rows = res["rows"]

        def cell(prefix, rows=rows):
            (label,) = [k for k in rows if k.startswith(prefix)]
            return f"{rows[label]['nDCG@10']:.3f} ({rows[label]['RR@10']:.3f})"

        corpus = f"{names.get(key, key)} ({count(res['n_items'])})"
        out.append([corpus, cell("DE alone"), cell("CE exact rerank"), cell("RNR"), cell("AXN")])
    header = ["corpus (items)", "DE alone", "CE exact rerank of the DE top-100"]
    header += ["RNR, B=100", "AXN, B=100"]
    return table(header, out, "lrrrr")


def render_max_length() -> str:
    d = load(RESULTS / "max_length.json")
    names = {"scifact": "SciFact", "nfcorpus": "NFCorpus", "cisi": "CISI"}
    res = d["results"]
    header = ["max length"] + [f"{names.get(r['dataset'], r['dataset'])}" for r in res]
    header += ["all queries vs 128 (± se)", "pairs cut", "CPU pairs/s", "GPU pairs/s"]
    de = [f"{r['de']['nDCG@10']:.3f} ({r['de']['R@10']:.3f})" for r in res]
    out = [["DE alone (its top-20)", *de, "", "", "", ""]]
    diff = d["choice"]["nDCG@10_vs_128"]
    for L in d["settings"]["lengths"]:
        rows = [pick(r["rows"], "max_length.json", max_length=L) for r in res]
        cells = [f"{x['nDCG@10']:.3f} ({x['R@10']:.3f})" for x in rows]
        cut = sum(x["truncated_share"] for x in rows) / len(rows)
        speed = sum(x["cpu_pairs_per_s"] for x in rows) / len(rows)
        delta = diff[str(L)]
        mark = "**" if L == d["choice"]["max_length"] else ""
        out.append(
            [f"{mark}{L}{mark}", *cells]
            + [f"{delta['mean_diff_vs_128']:+.3f} ± {delta['se']:.3f}", f"{cut:.0%}"]
            + [f"{speed:.0f}", d["gpu"].get(str(L), "not measured")]
        )
    return table(header, out, "l" + "r" * (len(header) - 1))


# ---- trained cross-encoders (bench/train_ce_bench.py) ------------------------------------------


def render_train_ce() -> str:
    runs = [
        ("CPU 45 min", load(RESULTS / "train_ce.xeon2.json")["rows"]),
        ("GPU", load(RESULTS / "train_ce.h100.json")["rows"]),
    ]
    names = {"scifact": "SciFact", "nfcorpus": "NFCorpus"}
    out = []
    for dataset in ("scifact", "nfcorpus"):
        cpu = [r for r in runs[0][1] if r["dataset"] == dataset and "method" not in r]
        de = pick(cpu, "train_ce", model="de")["ndcg@10"]
        cells = [f3(de), f3(pick(cpu, "train_ce", model="embedded")["ndcg@10"])]
        for _, rows in runs:
            rows = [r for r in rows if r["dataset"] == dataset and "method" not in r]
            own_de = pick(rows, "train_ce", model="de")["ndcg@10"]  # each run's own DE row
            for kind in ("cls", "emb"):
                hits = [r for r in rows if r["model"] == "trained" and r["kind"] == kind]
                if len(hits) > 1:
                    raise ReportError(f"train_ce: {len(hits)} trained {kind} rows for {dataset}")
                ndcg = hits[0]["ndcg@10"] if hits else None
                cells.append("not run" if ndcg is None else f"{ndcg:.3f} ({ndcg - own_de:+.3f})")
        n_queries = {"scifact": 300, "nfcorpus": 323}[dataset]
        out.append([f"{names[dataset]} ({n_queries})", *cells])
    header = ["nDCG@10, all test queries", "DE", "embedded CE"]
    header += [f"[{k.upper()}], {run}" for run, _ in runs for k in ("cls", "emb")]
    return table(header, out, "lrrrrrr")


# ---- GPU -----------------------------------------------------------------------------------------

GPU = RESULTS / "gpu_bench.h200.json"


def gpu_name(row: dict) -> str:
    m = re.search(r"(H100|H200|A100|L40S|L4|T4)", row.get("device", ""))
    return m.group(1) if m else row.get("device", "?")


def render_gpu() -> str:
    d = load(GPU)
    src = "gpu_bench"
    ce = pick(d["ce"], src, precision="fp16", batch=1024)
    ce256 = pick(d["ce"], src, precision="fp16", batch=256)
    rnd = pick(d["round"], src, precision="fp16", graph="fused", cuda_graph=True)
    search = pick(d["search"], src, precision="fp16", concurrency=1, cuda_graph=True)
    out = [
        [
            "CE pairs/s through the item token cache, fp16, batch 1,024",
            gpu_name(ce),
            count(round(ce["score_pairs_per_s"])),
        ],
        [
            "CE pairs/s, texts tokenized per call, fp16, batch 256",
            gpu_name(ce256),
            count(round(ce256["pairs_per_s"])),
        ],
        [
            "fp16 top-10 agreement with fp32",
            gpu_name(ce),
            f3(ce["top10_agreement_vs_fp32"]),
        ],
        ["one round's 20-pair CE call, fp16, p50", gpu_name(rnd), f"{rnd['call_ms_p50']:.2f} ms"],
        [
            "`Searcher.search`, one query at a time, fp16, p50 / p99",
            gpu_name(search),
            f"{search['p50_ms']:.2f} / {search['p99_ms']:.2f} ms",
        ],
    ]
    serve = [r for r in d["serve"] if r.get("variant") == "bp256+cew2"]
    for r in sorted(serve, key=lambda r: r["concurrency"]):
        out.append(
            [
                f"`serve --precision fp16`, concurrency {r['concurrency']}: q/s, p50, p99",
                gpu_name(r),
                f"{r['queries_per_s']:.0f} q/s, {r['p50_ms']:.0f} / {r['p99_ms']:.0f} ms",
            ]
        )
    return table(["what", "GPU", "measured"], out, "llr")


# ---- the harness: RNR vs GAR vs auto (bench/_harness.py) ------------------------------------

HARNESS_GOALS = {
    "gar_equals_reference": ("1.0", lambda v: v == 1.0),
    "auto_vs_gar_min": ("≥ 0.05", lambda v: v >= 0.05),
    "calls_to_match_gar_200": ("≤ 0.4", lambda v: v <= 0.4),
}


def render_harness() -> str:
    d = load(RESULTS / "harness.json")
    out = []
    for v in d["matrices"].values():
        rec, calls = v["recall"], v["ce_calls_max"]
        for b in ("50", "100", "200"):
            used = max(calls[m][b] for m in ("rnr", "gar", "auto"))
            cells = [f3(rec[m][b]) for m in ("rnr", "gar", "auto")]
            out.append([f"{v['matrix']} ({v['n_test']} test queries)", b, *cells, str(used)])
    header = ["score matrix", "B", "RNR (DE top-B)", "GAR (DE graph k=16, b=16)"]
    header += ["auto (default build)", "CE calls per query (max)"]
    return table(header, out, "lrrrrr")


def render_harness_goals() -> str:
    return goals_table("harness.json", HARNESS_GOALS)


def render_harness_ndcg() -> str:
    d = load(RESULTS / "harness.json")
    if "ndcg" not in d:
        raise ReportError("harness.json: no ndcg section (recall_bench.py harness --part ndcg)")
    budgets = [str(b) for b in d["ndcg"]["budgets"]]
    out = []
    for c in d["ndcg"]["corpora"].values():
        where = f"{c['corpus']} ({c['n_items']:,} items)"
        for label, by_b in c["rows"].items():
            cells = []
            for b in budgets:
                calls = by_b[b]["ce_calls_per_query"]
                cells += [f3(by_b[b]["nDCG@10"]), "–" if calls is None else f"{calls:g}"]
            out.append([where, label, *cells])
    header = ["corpus", "system"]
    for b in budgets:
        header += [f"nDCG@10 B={b}", "CE calls/query"]
    return table(header, out, "ll" + "rr" * len(budgets))


STOP_GOALS = {
    "calls_ratio_100": ("≤ 0.85", lambda v: v <= 0.85),
    "calls_ratio_200": ("≤ 0.65", lambda v: v <= 0.65),
    "recall_drop_worst": ("≥ -0.005", lambda v: v >= -0.005),
    "over_ceiling": ("0", lambda v: v == 0),
    "calibrated_from_index": ("true", lambda v: v is True),
}


def render_stop_early() -> str:
    d = load(RESULTS / "stop_early.json")
    out = []
    for v in d["corpora"].values():
        for b, c in v["ceilings"].items():
            out.append(
                [
                    f"{v['matrix']} ({v['test_queries']} test queries, {v['index_rows']} rows)",
                    b,
                    f3(c["fixed_recall"]),
                    f3(c["stop_recall"]),
                    f"{c['recall_change']:+.4f}",
                    f"{c['stop_calls']:.1f}",
                    f"{c['calls_ratio']:.3f}",
                ]
            )
    header = ["score matrix", "B (ceiling)", "recall, fixed B", "recall, early stop"]
    header += ["change", "CE calls per query", "calls ÷ B"]
    return table(header, out, "lrrrrrr")


def render_stop_targets() -> str:
    d = load(RESULTS / "stop_early.json")
    targets = sorted(
        {t for v in d["corpora"].values() for c in v["ceilings"].values() for t in c["by_target"]},
        key=float,
    )
    out = []
    for v in d["corpora"].values():
        for b, c in v["ceilings"].items():
            row = [v["matrix"], b]
            for t in targets:
                r = c["by_target"].get(t)
                row.append(
                    "" if r is None else f"{r['calls_ratio']:.3f} ({r['recall_change']:+.4f})"
                )
            out.append(row)
    header = ["score matrix", "B (ceiling)", *(f"target {t}" for t in targets)]
    return table(header, out, "lr" + "r" * len(targets))


def render_stop_goals() -> str:
    return goals_table("stop_early.json", STOP_GOALS)


CPP_INDEX_GOALS = {
    "cpp_vs_python_other_p50": ("≤ 0.5", lambda v: v <= 0.5),
    "equal_answer_share": ("1.0", lambda v: v == 1.0),
}


def render_cpp_index() -> str:
    d = load(RESULTS / "cpp_index.json")
    ix = d["index"]
    where = f"{d['matrix']} ({ix['n_items']} items, {ix['rows']} + {ix['partial_rows']} part rows)"
    out = [
        [
            r["door"],
            where,
            f"{r['method']}, B = {r['budget']}, k = {r['k']}",
            str(r["queries"]),
            f"{r['other_ms_p50']:.3f}",
            f"{r['other_ms_p99']:.3f}",
        ]
        for r in d["rows"]
    ]
    header = ["searcher", "index", "search", "queries", "non-CE ms p50", "p99"]
    return table(header, out, "lllrrr")


def render_cpp_index_goals() -> str:
    return goals_table("cpp_index.json", CPP_INDEX_GOALS)


def render_frameworks() -> str:
    d = load(RESULTS / "frameworks.json")
    names = {"langchain": "LangChain", "llamaindex": "LlamaIndex", "haystack": "Haystack"}
    where = {"local": "local (Searcher.search)", "http": "HTTP (client.search)"}
    out = [
        [
            names[r["framework"]],
            where[r["source"]],
            f"{r['added_ms_p50']:.3f}",
            f"{r['ratio_p50']:.3f}",
            f"{r['direct_ms_p50']:.3f}",
            f"{r['adapter_ms_p50']:.3f}",
            f"{r['same_answers']} / {r['calls']}",
            r["goal"],
            "yes" if r["met"] else "no",
        ]
        for r in d["rows"]
    ]
    header = ["framework", "source", "added ms, p50", "× direct, p50", "direct ms, p50"]
    header += ["adapter ms, p50", "same ids and scores", "goal", "met"]
    return table(header, out, "llrrrrrll")


@dataclass(frozen=True)
class Block:
    render: Callable[[], str]
    sources: str
    what: str


BLOCKS: dict[str, Block] = {
    "default-vs-rnr": Block(
        render_default_vs_rnr,
        "recall/eval_nfcorpus_base.json, recall/eval_nfcorpus_auto_default.json",
        "the default path vs reranking the DE top-B: recall and CE batches",
    ),
    "recall-cisi": Block(
        render_recall_cisi, "recall/eval_cisi*.json", "Top-k-Recall@B on cisi-minilm"
    ),
    "recall-nfcorpus": Block(
        render_recall_nfcorpus,
        "recall/eval_nfcorpus_*.json",
        "Top-k-Recall@B on nfcorpus-minilm-gpu",
    ),
    "auto-rounds": Block(
        render_auto_rounds,
        "recall/eval_nfcorpus_auto_rounds_default.json",
        "auto at fewer rounds on the default build's index (nfcorpus-minilm-gpu)",
    ),
    "overhead": Block(render_overhead, "overhead_bench.xeon2.json", "non-CE ms per query, p50"),
    "core-engine": Block(
        render_core_engine, "core_bench.epyc2.json", "round engine vs paper-style rounds"
    ),
    "scale": Block(render_scale, "scale_bench.cpu2.json", "FAISS round indexes, 1e5..1e7 items"),
    "ce-runtime": Block(render_ce_runtime, "ce_bench.epyc2.json", "CE pairs/s on the CPU"),
    "serve-load": Block(render_serve_load, "serve_bench.cpu2.json", "HTTP load test"),
    "serve-overload": Block(
        render_serve_overload, "serve_bench.cpu2.json", "4x overload, admission rules"
    ),
    "beir-ndcg": Block(
        render_beir_ndcg, "beir_ndcg.json", "nDCG@10 (RR@10) of the embedded CE on BEIR"
    ),
    "max-length": Block(
        render_max_length,
        "max_length.json",
        "the embedded CE's maximum length: nDCG@10 (R@10) against speed",
    ),
    "train-ce": Block(
        render_train_ce,
        "train_ce.xeon2.json, train_ce.h100.json",
        "nDCG@10 of trained CEs reranking the DE top-100 (difference to the DE)",
    ),
    "gpu": Block(render_gpu, "gpu_bench.h200.json", "the GPU path: CE, rounds, search, serve"),
    "api-contract": Block(
        render_api_contract, "api_contract.json", "the HTTP API's contract: fuzz, soak, kill -9"
    ),
    "lifecycle": Block(
        render_lifecycle, "lifecycle_bench.json", "the living index: refine, add, remove, swaps"
    ),
    "filter-recall": Block(
        render_filter_recall, "filter_bench.json", "filtered search: recall by selectivity"
    ),
    "filter-scale": Block(
        render_filter_scale, "filter_bench.json", "filtered IVF rounds on 10^6 items"
    ),
    "filter-goals": Block(render_filter_goals, "filter_bench.json", "filtered search: goals"),
    "tenant-goals": Block(
        render_tenant_goals,
        "filter_fuzz.json",
        "one tenant never hurts another: the filter fuzz and the grouped server's goals",
    ),
    "test-times": Block(render_test_times, "test_times.json", "make test's time before and after"),
    "test-time-kinds": Block(
        render_test_time_kinds, "test_times.json", "the test seconds by what costs them"
    ),
    "lifecycle-chaos": Block(
        render_lifecycle_chaos,
        "lifecycle_chaos.json",
        "the living index under chaos: kill -9, rotation, a full disk",
    ),
    "day-one-goals": Block(
        render_day_one_goals, "day_one_rows.json", "day-one rows: the default build's goals"
    ),
    "day-one-final": Block(
        render_day_one_final,
        "day_one_rows.json",
        "day-one rows: all items, test queries (B = 50 / 100 / 200)",
    ),
    "day-one-choice": Block(
        render_day_one_choice,
        "day_one_rows.json",
        "day-one rows: pseudo-query candidates on train queries (B = 50 / 100 / 200)",
    ),
    "harness": Block(
        render_harness, "harness.json", "Top-10-Recall: RNR vs GAR vs auto at equal CE calls"
    ),
    "harness-goals": Block(render_harness_goals, "harness.json", "GAR and the harness: goals"),
    "harness-ndcg": Block(
        render_harness_ndcg, "harness.json", "nDCG@10 through pt.Experiment: RNR, GAR, auto"
    ),
    "stop-early": Block(
        render_stop_early, "stop_early.json", "the early stop against fixed B (target_recall)"
    ),
    "stop-early-targets": Block(
        render_stop_targets,
        "stop_early.json",
        "the early stop: calls ÷ B (recall change) by target",
    ),
    "stop-early-goals": Block(render_stop_goals, "stop_early.json", "the early stop: goals"),
    "cpp-index": Block(
        render_cpp_index, "cpp_index.json", "non-CE ms per query: the C++ searcher vs Python's"
    ),
    "cpp-index-goals": Block(
        render_cpp_index_goals, "cpp_index.json", "the C++ searcher of an index folder: goals"
    ),
    "frameworks": Block(
        render_frameworks, "frameworks.json", "what a LangChain/LlamaIndex/Haystack adapter adds"
    ),
}


def markdown_files() -> list[Path]:
    files = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    return [f for f in files if f.is_file()]


def render(name: str, cache: dict[str, str]) -> str:
    if name not in cache:
        if name not in BLOCKS:
            raise ReportError(f"unknown block {name!r} (bench/report.py --list names them)")
        cache[name] = BLOCKS[name].render()
    return cache[name]


def rewrite(text: str, where: str, cache: dict[str, str]) -> tuple[str, list[str]]:
    """``text`` with every marked block rendered, and the names of the blocks that changed."""
    closed = {m.start() for m in MARKER.finditer(text)}
    for m in OPENING.finditer(text):
        if m.start() not in closed:
            raise ReportError(f"{where}: block {m.group(1)!r} has no <!-- /report:{m.group(1)} -->")
    changed = []

    def sub(m: re.Match) -> str:
        name = m.group("name")
        try:
            body = render(name, cache)
        except ReportError as e:
            raise ReportError(f"{where}: block {name!r}: {e}") from None
        if body != m.group("body"):
            changed.append(name)
        return m.group("open") + body + m.group("close")

    return MARKER.sub(sub, text), changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 where a table drifted")
    mode.add_argument("--write", action="store_true", help="rewrite the marked blocks")
    mode.add_argument("--list", action="store_true", help="the blocks and their JSON")
    mode.add_argument("--show", metavar="NAME", help="print one block's table")
    ap.add_argument("files", nargs="*", type=Path, help="Markdown files (default: README, docs/)")
    args = ap.parse_args(argv)
    if args.list:
        for name, b in BLOCKS.items():
            print(f"{name:<16} {b.what}  [bench/results/{b.sources}]")
        return 0
    cache: dict[str, str] = {}
    try:
        if args.show:
            print(render(args.show, cache), end="")
            return 0
        drifted, found = [], 0
        for path in args.files or markdown_files():
            where = str(path)
            if path.resolve().is_relative_to(REPO):
                where = str(path.resolve().relative_to(REPO))
            text = path.read_text(encoding="utf-8")
            new, changed = rewrite(text, where, cache)
            found += len(MARKER.findall(text))
            if not changed:
                continue
            if args.write:
                path.write_text(new, encoding="utf-8")
                print(f"wrote {where}: {', '.join(changed)}")
            else:
                for name in changed:
                    drifted.append(f"{where}:{name}")
                diff = difflib.unified_diff(
                    text.splitlines(),
                    new.splitlines(),
                    where,
                    "rendered from JSON",
                    n=0,
                    lineterm="",
                )
                print("\n".join(list(diff)[:40]), file=sys.stderr)
    except ReportError as e:
        print(f"bench/report.py: {e}", file=sys.stderr)
        return 2
    if drifted:
        print(
            f"bench/report.py: {len(drifted)} table(s) differ from bench/results: "
            f"{', '.join(drifted)} (run bench/report.py --write)",
            file=sys.stderr,
        )
        return 1
    if args.check:
        print(f"bench/report.py: {found} marked table(s) match bench/results")
    return 0


if __name__ == "__main__":
    sys.exit(main())
