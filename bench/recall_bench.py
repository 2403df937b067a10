"""Recall-vs-cost on cisi-minilm: every `crossknn eval` run behind docs/search.md, and its figure.

    .venv/bin/python bench/recall_bench.py [--matrix ../shared/matrices/cisi-minilm]

Writes bench/results/recall/eval_cisi*.json (one file per run below; each also prints its table),
docs/img/cisi_recall.png (the headline curves), and the index-cost table (method x index CE calls
x (B, k): ``auto`` at 0, 1, 5, 10 and 100% of dense ADACUR's index calls beside ADACUR, AXN and
RNR, all with the DE first round) as bench/results/recall/recall_index_cost.json and
docs/img/cisi_index_cost.png. Uses the precomputed score matrix only (no model runs); takes
about half an hour on 2 cores (``--only`` runs a part).

``--nfcorpus``: issue 29's table on ../shared/matrices/nfcorpus-minilm-gpu (eval_nfcorpus_*.json;
RNR, AXN and ADACUR over the DE, auto at 0, 0.1, 1, 10 and 100% of dense and at the default
build's 32 rows; B in 50/100/200, k in 10/50): recall_index_cost_nfcorpus.json and
docs/img/nfcorpus_index_cost.png.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from _common import CISI_MATRIX, REPO, RESULTS, SHARED, provenance, write_json
from crossknn.cli import main as crossknn

RECALL = RESULTS / "recall"  # every run's `crossknn eval --json` and the index-cost tables


def repeat(flag: str, *values) -> list[str]:
    """``repeat("--k", 1, 10)`` -> ``["--k", "1", "--k", "10"]``."""
    return [a for v in values for a in (flag, str(v))]


GRID = repeat("--budget", 50, 100, 200, 500) + repeat("--k", 1, 10, 50, 100)


def methods(*names):
    return repeat("--method", *names)


RUNS = {
    # retrieve-and-rerank baselines with every first stage
    "eval_cisi_rnr": methods("rnr") + repeat("--first", "de", "tfidf", "bm25", "random"),
    # the headline: CUR methods with a random first round, 5 rounds
    "eval_cisi": methods("anncur", "adacur", "adacur-split", "adacur-softmax", "axn"),
    # number of rounds
    "eval_cisi_rounds": methods("adacur", "adacur-split", "adacur-softmax", "adacur-random", "axn")
    + repeat("--rounds", 1, 2, 3, 5, 10, 20),
    # first round / anchors from the dual encoder
    "eval_cisi_de": methods("anncur", "adacur", "adacur-split", "axn") + ["--first", "de"],
    # the papers' final ranking (split methods rerank only the retrieved items)
    "eval_cisi_paper": methods("anncur", "adacur-split") + ["--paper"],
    # the papers as published: plain pseudo-inverse (no ridge) and their final ranking
    "eval_cisi_pinv": methods("anncur", "adacur", "adacur-split") + ["--ridge", "0", "--paper"],
    # SoftMax at fixed temperatures (in units of a query's CE score spread) instead of dev-chosen
    "eval_cisi_softmax_t1": methods("adacur-softmax") + ["--temperature", "1"],
    "eval_cisi_softmax_t0.1": methods("adacur-softmax") + ["--temperature", "0.1"],
}
# auto's index calls as a share of dense ADACUR's (|train| x N = 62 x 1,460 = 90,520 on cisi)
INDEX_SHARES = (0.0, 0.01, 0.05, 0.10, 1.0)
for _share in INDEX_SHARES:
    RUNS[f"eval_cisi_auto_{round(100 * _share)}pct"] = methods("auto") + ["--first", "de"]

# --nfcorpus: nfcorpus-minilm-gpu (1,677 train x 3,633 items, 323 test queries), the cells of
# issue 29 only; auto at 0, 0.1, 1, 10, 100% of dense and at the default rule's 32 rows
NF_GRID = repeat("--budget", 50, 100, 200) + repeat("--k", 10, 50)
NF_SHARES = {"0pct": 0.0, "0.1pct": 0.001, "1pct": 0.01, "10pct": 0.10, "100pct": 1.0}
NF_DEFAULT_ROWS = 32  # crossknn.index.auto.MAX_DEFAULT_ROWS: the default build on 3,633 items
NF_RUNS = {"eval_nfcorpus_base": methods("rnr", "axn", "adacur") + ["--first", "de"]}
for _label in [*NF_SHARES, "default"]:
    NF_RUNS[f"eval_nfcorpus_auto_{_label}"] = methods("auto") + ["--first", "de"]
# the default build's index at fewer rounds: what auto's latency target trades (round_plan)
NF_RUNS["eval_nfcorpus_auto_rounds_default"] = (
    methods("auto") + ["--first", "de"] + repeat("--rounds", 4, 5, 6, 8, 10, 12, 20, 30)
)

FIGURE_SERIES = [  # (run, method, first, rounds)
    ("eval_cisi_rnr", "rnr", "de", 1),
    ("eval_cisi_rnr", "rnr", "tfidf", 1),
    ("eval_cisi_rnr", "rnr", "bm25", 1),
    ("eval_cisi", "anncur", "random", 1),
    ("eval_cisi", "adacur", "random", 5),
    ("eval_cisi", "adacur-split", "random", 5),
    ("eval_cisi", "adacur-softmax", "random", 5),
    ("eval_cisi", "axn", "random", 5),
    ("eval_cisi_de", "adacur", "de", 5),
]


def _dense_calls(matrix) -> int:
    from crossknn.matrix import load_score_matrix

    m = load_score_matrix(matrix)
    return int(m.train.size * m.n_items)


def _index_calls(name: str, matrix) -> list[str]:
    if "_auto_" not in name:
        return []
    label = name.rsplit("_", 1)[1]
    if label == "default":  # the default build's rows (eval_nfcorpus_auto_[rounds_]default)
        from crossknn.matrix import load_score_matrix

        return ["--index-calls", str(NF_DEFAULT_ROWS * load_score_matrix(matrix).n_items)]
    share = float(label.removesuffix("pct")) / 100
    return ["--index-calls", str(int(share * _dense_calls(matrix)))]


def cost_table(matrix, tag: str = "cisi") -> None:
    """Method x index CE calls x (B, k), all with the DE first round: auto from its runs, RNR,
    AXN and ADACUR (5 rounds) from eval_cisi_rnr / eval_cisi_de (nfcorpus: eval_nfcorpus_base);
    printed, JSON, figure."""
    rows = []
    base = ["eval_nfcorpus_base"] if tag == "nfcorpus" else ["eval_cisi_rnr", "eval_cisi_de"]
    runs = NF_RUNS if tag == "nfcorpus" else RUNS
    auto_runs = [n for n in runs if n.startswith(f"eval_{tag}_auto_") and "_rounds_" not in n]
    for name in base + auto_runs:
        path = RECALL / f"{name}.json"
        limit = _index_calls(name, matrix)
        if path.is_file():
            rows += [
                {**r, "index_calls_limit": int(limit[1]) if limit else None}
                for r in json.loads(path.read_text())["rows"]
                if r["budget"] <= 200
                and r["first"] == "de"
                and r["method"] in ("auto", "rnr", "axn", "adacur")
            ]
    if not rows:
        return
    dense = _dense_calls(matrix)
    cells = [(b, k) for k in (10, 50) for b in (50, 100, 200)]
    table: dict[tuple, dict] = {}
    for r in rows:
        key = (r["method"], r["index_calls_limit"] or 0, r["index_ce_calls"])
        table.setdefault(key, {})[(r["budget"], r["k"])] = r["recall"]
    head = f"{'method':<8} {'C':>7} {'index calls':>11} {'share':>6}  " + "  ".join(
        f"k{k}B{b}" for b, k in cells
    )
    print("\n" + head + "\n" + "-" * len(head))
    out = []
    for (method, limit, calls), rec in sorted(
        table.items(), key=lambda kv: (kv[0][0] != "auto", kv[0])
    ):
        c_col = f"{limit:>7,}" if method == "auto" else f"{'-':>7}"
        print(
            f"{method:<8} {c_col} {calls:>11,} {calls / dense:>6.1%}  "
            + "  ".join(f"{rec.get(c, float('nan')):6.3f}" for c in cells)
        )
        out.append(
            {
                "method": method,
                "index_calls_limit": limit if method == "auto" else None,
                "index_ce_calls": calls,
                "share_of_dense": calls / dense,
                "recall": {f"k{k}B{b}": rec.get((b, k)) for b, k in cells},
            }
        )
    suffix = "" if tag == "cisi" else f"_{tag}"
    write_json(
        RECALL / f"recall_index_cost{suffix}.json", {"dense_index_calls": dense, "rows": out}
    )
    title = "cisi-minilm" if tag == "cisi" else "nfcorpus-minilm-gpu"
    plot_cost(out, dense, REPO / "docs" / "img" / f"{tag}_index_cost.png", title)


def _x(share: float, floor: float) -> float:
    """A share of dense as the x position (percent), C = 0 drawn at ``floor``."""
    return max(share, floor) * 100


def plot_cost(out, dense, png, title="cisi-minilm") -> None:
    """Recall vs index CE calls (share of dense ADACUR's), one panel per k, a line per B for
    auto and a marker per baseline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    auto = sorted((r for r in out if r["method"] == "auto"), key=lambda r: r["index_calls_limit"])
    # where C = 0 is drawn on the log axis: a tenth of the smallest nonzero share (cisi: 0.1%)
    shares = [r["index_calls_limit"] / dense for r in auto if r["index_calls_limit"]]
    floor = min([1e-2, *shares]) / 10
    colors = {50: "C0", 100: "C1", 200: "C2"}
    marks = {"adacur": "s", "axn": "^", "rnr": "v"}
    for ax, k in zip(axes, (10, 50), strict=True):
        for b in (50, 100, 200):
            x = [_x(r["index_calls_limit"] / dense, floor) for r in auto]
            ax.plot(
                x, [r["recall"][f"k{k}B{b}"] for r in auto], "o-", c=colors[b], label=f"auto B={b}"
            )
            for r in out:
                if r["method"] in marks:
                    ax.plot(
                        _x(r["share_of_dense"], floor),
                        r["recall"][f"k{k}B{b}"],
                        marks[r["method"]],
                        c=colors[b],
                        mfc="none",
                        ms=8,
                        label=f"{r['method']} (DE first) B={b}",
                    )
        ax.set_xscale("log")
        ticks = sorted({_x(r["index_calls_limit"] / dense, floor) for r in auto})
        ax.set_xticks(ticks)
        ax.set_xticklabels(["0" if t == floor * 100 else f"{t:.3g}%" for t in ticks], fontsize=7)
        ax.minorticks_off()
        ax.set_xlabel(f"index CE calls C (share of dense ADACUR's {dense:,})")
        ax.set_title(f"Top-{k}-Recall@B, {title}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("recall")
    h, lab = axes[0].get_legend_handles_labels()
    fig.legend(h, lab, loc="lower center", ncol=4, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=130)
    plt.close(fig)
    print(f"wrote {png}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--matrix", default=str(CISI_MATRIX))
    ap.add_argument("--only", action="append", help="run only these runs (names above)")
    ap.add_argument(
        "--nfcorpus",
        action="store_true",
        help="issue 29's table on nfcorpus-minilm-gpu (eval_nfcorpus_* runs) instead of cisi",
    )
    ap.add_argument("--table-only", action="store_true", help="no runs: table and figure")
    args = ap.parse_args()
    if args.nfcorpus and args.matrix == str(CISI_MATRIX):
        args.matrix = str(SHARED / "matrices" / "nfcorpus-minilm-gpu")
    runs, base_grid = (NF_RUNS, NF_GRID) if args.nfcorpus else (RUNS, GRID)
    timings = {}
    for name, argv in runs.items():
        if (args.only and name not in args.only) or args.table_only:
            continue
        grid = base_grid + _index_calls(name, args.matrix)
        print(f"\n== {name}: crossknn eval MATRIX {' '.join(argv + grid)}")
        t0 = time.perf_counter()
        rc = crossknn(
            [
                "eval",
                args.matrix,
                *argv,
                *grid,
                "--json",
                str(RECALL / f"{name}.json"),
                "--no-plot",
                "--quiet",
            ]
        )
        if rc:
            return rc
        timings[name] = round(time.perf_counter() - t0, 1)
        out = RECALL / f"{name}.json"  # the eval's JSON, with where/when/how (provenance)
        prov = provenance() | {"command": f"python bench/recall_bench.py (run {name})"}
        write_json(out, json.loads(out.read_text()) | {"provenance": prov})
    print("\nseconds per run:", json.dumps(timings))
    if args.nfcorpus:
        cost_table(args.matrix, "nfcorpus")
        return 0
    cost_table(args.matrix)

    from crossknn.eval import plot_curves

    rows = []
    for run, method, first, rounds in FIGURE_SERIES:
        path = RECALL / f"{run}.json"
        if not path.is_file():
            continue
        rows += [
            r
            for r in json.loads(path.read_text())["rows"]
            if (r["method"], r["first"], r["rounds"]) == (method, first, rounds)
        ]
    if rows:
        png = REPO / "docs" / "img" / "cisi_recall.png"
        plot_curves(
            rows,
            png,
            title="cisi-minilm: Top-k-Recall vs CE calls (50 test queries, "
            "1,460 items, 62 train queries)",
        )
        print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["day-one"]:  # the day-one rows: bench/_day_one.py, its own arguments
        from _day_one import main as day_one

        raise SystemExit(day_one(sys.argv[2:]))
    if sys.argv[1:2] == ["stop-early"]:  # the early stop against fixed B (bench/_stop_early.py)
        from _stop_early import main as stop_early

        raise SystemExit(stop_early(sys.argv[2:]))
    if sys.argv[1:2] == ["harness"]:  # RNR vs GAR vs auto (bench/_harness.py), its own arguments
        from _harness import main as harness

        raise SystemExit(harness(sys.argv[2:]))
    raise SystemExit(main())
