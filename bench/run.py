"""One entry point for the maintained benchmarks: suites of bench scripts, by their commands.

    .venv/bin/python bench/run.py --list                      # the suites and their commands
    .venv/bin/python bench/run.py --suite quick               # smoke runs (minutes), no result kept
    .venv/bin/python bench/run.py --suite recall --suite cpu  # rewrite bench/results/*.json
    .venv/bin/python bench/run.py --suite gpu --dry-run       # print the commands only

Suites:

- ``quick``: every kind of bench at small sizes, results into ``build/bench-quick/`` (never over
  the committed results), then ``bench/report.py --check``. About 10 minutes on a busy 2-core CPU.
- ``recall``: Top-k-Recall on the shared score matrices (``recall_bench``, cisi + nfcorpus), the
  embedded CE's nDCG on BEIR and its maximum length against speed (``beir_bench``,
  ``beir_bench max-length``), CMC quality (``cmc_bench``), the default build's
  pseudo-query rows against keyword and train-query rows (``recall_bench day-one``; SciFact's exact
  scores are computed once, hours on 2 cores), the filter language against an evaluator from
  the docs (``filter_bench fuzz``). No model timing.
- ``cpu``: speed on this CPU: round engine (``core_bench``), non-CE time per query
  (``overhead_bench``), CE runtime and int8 recipes (``ce_bench``), CMC latency, and the living
  index's recall after refine / add / remove (``lifecycle_bench --part recall``), two default
  builds compared bit for bit, one beside busy processes (``recall_bench day-one --part repro``).
- ``gpu``: the GPU path (``gpu_bench``: CE, rounds, search, serve) on the first GPU.
- ``serve``: the HTTP server under load and overload (``serve_bench``), the GPU serving path's
  host side against a stand-in device (``gpu_bench --standin-device``), serving through index
  swaps (``lifecycle_bench --part swap``), the living index under chaos (``lifecycle_bench
  --part chaos``: kill -9 of its commands, log rotation, a full disk), the API contract under
  generated requests and kill -9 (``api_contract_bench``), one tenant's failing request among
  grouped ones and the server's memory per MB of body (``filter_bench tenant``).
- ``scale``: FAISS round indexes from 10^5 to 10^7 items (``scale_bench``; about an hour).
- ``train``: trained cross-encoders (``train_ce_bench``; 45 minutes of training per CE kind).

Each bench prints its table and writes ``bench/results/NAME[.MACHINE].json`` with a
``provenance`` entry (machine, date, commit, command: ``bench/_common.py``). A step whose data
(``../shared``) is missing is skipped with one line; a failing step is reported and the suite goes
on; the exit status is 1 if any step failed. After a run, ``bench/report.py --write`` renders the
README/docs tables from the new JSON (and ``git diff`` shows what moved).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
SHARED = REPO.parent / "shared"
QUICK_OUT = REPO / "build" / "bench-quick"
sys.path.insert(0, str(BENCH))  # _common, also when this file is imported (tests)

from _common import machine_tag, provenance  # noqa: E402

CPU, GPU = machine_tag(), machine_tag(gpu=True)  # the "where" of result names (xeon2, h100, ...)


@dataclass(frozen=True)
class Step:
    """One bench command: ``argv`` after the Python interpreter, run from the repository root."""

    name: str
    argv: tuple[str, ...]
    needs: tuple[Path, ...] = ()  # data that must exist, else the step is skipped
    optional: bool = False  # the script itself may be absent (another bench's owner adds it)
    uses: tuple[str, ...] = ()  # bench scripts the step runs through the first one
    env: dict = field(default_factory=dict)

    @property
    def script(self) -> Path:
        return REPO / self.argv[0]


CISI = SHARED / "matrices" / "cisi-minilm"
NFCORPUS_MATRIX = SHARED / "matrices" / "nfcorpus-minilm-gpu"
SCIFACT = SHARED / "data" / "scifact"
NFCORPUS = SHARED / "data" / "nfcorpus"
CISI_DATA = SHARED / "data" / "cisi"
Q = "build/bench-quick"  # QUICK_OUT, relative to the repository root

SUITES: dict[str, list[Step]] = {
    "quick": [
        Step(
            "core (N <= 1e5)",
            ("bench/core_bench.py", "--quick", "--reps", "1", "--out", f"{Q}/core_bench.json"),
        ),
        Step(
            "overhead (10 queries, B=100)",
            (
                "bench/overhead_bench.py",
                "--queries",
                "10",
                "--budgets",
                "100",
                "--out",
                f"{Q}/overhead_bench.json",
            ),
            needs=(NFCORPUS_MATRIX,),
        ),
        Step(
            "gpu path on the CPU (smoke)",
            (
                "bench/gpu_bench.py",
                "--quick",
                "--provider",
                "cpu",
                "--max-seconds",
                "240",
                "--work",
                f"{Q}/gpu-work",
                "--out",
                f"{Q}/gpu_bench.json",
            ),
            needs=(SCIFACT,),
        ),
        Step(
            "day-one rows (cisi, 200 items, keyword rows)",
            (
                "bench/recall_bench.py",
                "day-one",
                "--part",
                "choose",
                "--corpora",
                "cisi",
                "--items",
                "200",
                "--candidates",
                "keywords",
                "--work",
                f"{Q}/day-one-work",
                "--out",
                f"{Q}/day_one_rows.json",
            ),
            needs=(CISI,),
        ),
        Step("tables match the JSON", ("bench/report.py", "--check")),
    ],
    "recall": [
        Step("recall, cisi-minilm", ("bench/recall_bench.py",), needs=(CISI,)),
        Step(
            "recall, nfcorpus-minilm-gpu",
            ("bench/recall_bench.py", "--nfcorpus"),
            needs=(NFCORPUS_MATRIX,),
        ),
        Step("embedded CE nDCG on BEIR", ("bench/beir_bench.py",), needs=(SCIFACT, NFCORPUS)),
        Step(
            "embedded CE's maximum length: nDCG@10 against speed",
            ("bench/beir_bench.py", "max-length"),
            needs=(SCIFACT, NFCORPUS, CISI_DATA),
        ),
        Step("CMC on cisi", ("bench/cmc_bench.py", "--part", "cisi"), needs=(CISI,)),
        Step("CMC on BEIR", ("bench/cmc_bench.py", "--part", "beir"), needs=(SCIFACT, NFCORPUS)),
        Step("CMC ablation", ("bench/cmc_bench.py", "--part", "ablation"), needs=(CISI,)),
        Step(
            "filtered search on the matrices",
            ("bench/filter_bench.py", "--part", "matrices"),
            needs=(CISI, NFCORPUS_MATRIX),
        ),
        Step(
            "the filter language against an evaluator from the docs (10^5 cases)",
            ("bench/filter_bench.py", "fuzz"),
            uses=("bench/_filter_fuzz.py",),
        ),
        Step(
            "day-one rows: pseudo-query kinds on train splits",
            ("bench/recall_bench.py", "day-one", "--part", "choose"),
            needs=(CISI, NFCORPUS_MATRIX, SCIFACT),
        ),
        Step(
            "day-one rows: default vs keyword vs train-query rows",
            ("bench/recall_bench.py", "day-one", "--part", "final"),
            needs=(CISI, NFCORPUS_MATRIX, SCIFACT),
        ),
        Step(
            "early stop against fixed budgets (target_recall)",
            ("bench/recall_bench.py", "stop-early"),
            needs=(CISI, NFCORPUS_MATRIX),
            uses=("bench/_stop_early.py",),
        ),
        Step(
            "RNR vs GAR vs auto on the matrices; gar against pyterrier-adaptive",
            ("bench/recall_bench.py", "harness", "--part", "matrices", "--part", "reference"),
            needs=(CISI, NFCORPUS_MATRIX),
            uses=("bench/_harness.py",),
        ),
        Step(
            "nDCG@10 through pt.Experiment: BM25 >> RNR / GAR vs auto (cisi, default build)",
            ("bench/recall_bench.py", "harness", "--part", "ndcg", "--ndcg-corpora", "cisi")
            + ("--ndcg-queries", "30"),
            needs=(CISI_DATA,),
            uses=("bench/_harness.py", "bench/_harness_ndcg.py"),
        ),
        Step(
            "nDCG@10 through pt.Experiment: BM25 >> RNR / GAR vs auto (nfcorpus, 2-row index)",
            ("bench/recall_bench.py", "harness", "--part", "ndcg", "--ndcg-corpora", "nfcorpus")
            + ("--ndcg-queries", "30", "--ndcg-index-rows", "2"),
            needs=(NFCORPUS,),
            uses=("bench/_harness.py", "bench/_harness_ndcg.py"),
        ),
    ],
    "cpu": [
        Step("round engine", ("bench/core_bench.py",)),
        Step(
            "non-CE time per query",
            ("bench/overhead_bench.py", "--out", f"bench/results/overhead_bench.{CPU}.json"),
            needs=(NFCORPUS_MATRIX,),
        ),
        Step(
            "C++ searcher of an index folder vs Python's",
            ("bench/overhead_bench.py", "cpp-index"),
            needs=(NFCORPUS_MATRIX,),
            uses=("bench/_cpp_index.py",),
        ),
        Step(
            "LangChain / LlamaIndex / Haystack adapters vs the direct call",
            ("bench/overhead_bench.py", "frameworks"),
            uses=("bench/_frameworks.py",),
        ),
        Step(
            "CE runtime", ("bench/ce_bench.py", "--pairs", "128", "--rounds", "3"), needs=(SCIFACT,)
        ),
        Step("int8 recipes", ("bench/ce_bench.py", "--recipes"), needs=(SCIFACT, NFCORPUS)),
        Step("CMC latency", ("bench/cmc_bench.py", "--part", "latency")),
        Step(
            "living index: refine, add, remove",
            ("bench/lifecycle_bench.py", "--part", "recall"),
            needs=(NFCORPUS_MATRIX,),
            optional=True,
        ),
        Step(
            "day-one rows: two default builds, one under load",
            ("bench/recall_bench.py", "day-one", "--part", "repro"),
            needs=(CISI,),
        ),
    ],
    "gpu": [
        Step(
            "GPU path",
            (
                "bench/gpu_bench.py",
                "--provider",
                "auto",
                "--out",
                f"bench/results/gpu_bench.{GPU}.json",
            ),
            needs=(SCIFACT,),
        ),
    ],
    "serve": [
        Step(
            "HTTP load and overload",
            ("bench/serve_bench.py", "--out", f"bench/results/serve_bench.{CPU}.json"),
        ),
        Step(
            "GPU serving host side, stand-in device",
            (
                "bench/gpu_bench.py",
                "--provider",
                "cpu",
                "--sections",
                "serve",
                "--standin-device",
                "0.5,0.021",
                "--out",
                "bench/results/gpu_bench.standin.json",
            ),
            needs=(SCIFACT,),
            uses=("bench/_standin_device.py",),
        ),
        Step(
            "living index: serve through swaps",
            ("bench/lifecycle_bench.py", "--part", "swap"),
            needs=(NFCORPUS,),
            optional=True,
        ),
        Step(
            "living index: chaos (kill -9, rotation, full disk; about an hour)",
            ("bench/lifecycle_bench.py", "--part", "chaos"),
        ),
        Step(
            "API contract: fuzzed requests",
            ("bench/api_contract_bench.py", "--fuzz"),
            optional=True,
        ),
        Step(
            "API contract: kill -9 under load",
            ("bench/api_contract_bench.py", "--kill", "20"),
            optional=True,
        ),
        Step(
            "one tenant's failing request among grouped ones; peak RSS per MB of body",
            ("bench/filter_bench.py", "tenant"),
            uses=("bench/_tenant.py",),
        ),
    ],
    "scale": [
        Step("FAISS round indexes", ("bench/scale_bench.py",)),
        Step("real-data check on cisi", ("bench/scale_bench.py", "--cisi"), needs=(CISI,)),
        Step("filtered IVF rounds at 10^6", ("bench/filter_bench.py", "--part", "scale")),
    ],
    "train": [
        Step("trained CEs", ("bench/train_ce_bench.py", "--bf16"), needs=(SCIFACT, NFCORPUS)),
    ],
}


def scripts_in_suites() -> set[str]:
    """The bench scripts some suite runs (paths relative to the repository root)."""
    return {a for steps in SUITES.values() for s in steps for a in (s.argv[0], *s.uses)}


def run_step(step: Step, dry_run: bool) -> tuple[str, float]:
    cmd = [sys.executable, *step.argv]
    shown = " ".join(["python", *step.argv])
    if step.optional and not step.script.exists():
        print(f"- skip {step.name}: {step.argv[0]} is not in this checkout", flush=True)
        return "absent", 0.0
    missing = [str(p) for p in step.needs if not p.exists()]
    if missing:
        print(f"- skip {step.name}: needs {', '.join(missing)}", flush=True)
        return "no data", 0.0
    print(f"+ {shown}", flush=True)
    if dry_run:
        return "dry run", 0.0
    t0, t0_utc = time.perf_counter(), time.time()
    rc = subprocess.call(cmd, cwd=REPO, env={**os.environ, **step.env})
    seconds = time.perf_counter() - t0
    if rc == 0:
        add_provenance(step, shown, t0_utc)
    return ("ok" if rc == 0 else f"exit {rc}"), seconds


def add_provenance(step: Step, command: str, since: float) -> None:
    """A result file the step wrote (its ``--out``) without a ``provenance`` entry gets one: the
    machine, date, commit and this command (benches that write through
    ``_common.write_json`` have theirs already)."""
    if "--out" not in step.argv:
        return
    out = REPO / step.argv[step.argv.index("--out") + 1]
    if not out.is_file() or out.stat().st_mtime < since:
        return
    data = json.loads(out.read_text(encoding="utf-8"))
    if isinstance(data, dict) and "provenance" not in data:
        data["provenance"] = provenance() | {"command": command}
        out.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        print(f"provenance added to {out}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", action="append", choices=sorted(SUITES), help="repeatable")
    ap.add_argument("--list", action="store_true", help="print the suites and their commands")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = ap.parse_args(argv)
    if args.list or not args.suite:
        for name, steps in SUITES.items():
            print(f"{name}:")
            for s in steps:
                print(f"  {s.name:<40} python {' '.join(s.argv)}")
        if not args.suite:
            return 0 if args.list else 2
    QUICK_OUT.mkdir(parents=True, exist_ok=True)
    outcomes = []
    for suite in args.suite:
        print(f"== suite {suite}", flush=True)
        for step in SUITES[suite]:
            outcome, seconds = run_step(step, args.dry_run)
            outcomes.append((suite, step.name, outcome, seconds))
    print("\n| suite | step | outcome | seconds |\n|---|---|---|---:|")
    for suite, name, outcome, seconds in outcomes:
        print(f"| {suite} | {name} | {outcome} | {seconds:.0f} |")
    failed = [o for o in outcomes if o[2].startswith("exit")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
