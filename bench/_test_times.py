"""Where the test suite's time goes: one run of the whole suite, read from its JUnit XML, into
``bench/results/test_times.json`` under a label (``before`` / ``after`` a change), beside the
other labels already there.

    make test TEST_JUNIT=build/junit.xml 2>&1 | tee build/test.log
    .venv/bin/python bench/_test_times.py build/junit*.xml --label after --log build/test.log

Per test file: seconds (setup, call and teardown of its tests, module fixtures included) and
tests; the 50 slowest tests; totals. With ``--log``, the wall times that ``make test`` printed
(``== make test: N s``) and pytest's own (``in N s``) are read from its output. The test
session's conftest orders the files of a parallel run by the newest label's ``per_file``
seconds (tests/conftest.py ``file_seconds``). Not a suite's bench: it reads a run, it runs
nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

from _common import RESULTS, machine, provenance, utc_now, write_json

OUT = RESULTS / "test_times.json"


def read_junit(paths: list[Path]) -> dict:
    """Per-file seconds and counts, the slowest tests and the outcome counts of JUnit XML files
    (one run may write several: ``--junitxml`` of each pytest call)."""
    files: dict[str, dict] = defaultdict(lambda: {"seconds": 0.0, "tests": 0})
    tests, outcomes = [], defaultdict(int)
    cases = [case for path in paths for case in ET.parse(path).getroot().iter("testcase")]
    for case in cases:
        cls, name = case.get("classname", ""), case.get("name", "")
        seconds = float(case.get("time") or 0.0)
        # classname is the module path with dots (tests.test_x or tests.test_x.TestClass)
        parts = cls.split(".")
        module = next((i for i, p in enumerate(parts) if p.startswith("test_")), len(parts) - 1)
        file = "/".join(parts[: module + 1]) + ".py"
        files[file]["seconds"] += seconds
        files[file]["tests"] += 1
        node = "::".join([file, *parts[module + 1 :], name])
        tests.append({"test": node, "seconds": seconds})
        kind = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        outcomes[kind] += 1
    tests.sort(key=lambda t: -t["seconds"])
    per_file = {
        f: {"seconds": round(v["seconds"], 2), "tests": v["tests"]}
        for f, v in sorted(files.items(), key=lambda kv: -kv[1]["seconds"])
    }
    return {
        "tests": len(tests),
        "outcomes": dict(outcomes),
        "test_seconds_total": round(sum(t["seconds"] for t in tests), 1),
        "per_file": per_file,
        "slowest": [{**t, "seconds": round(t["seconds"], 2)} for t in tests[:50]],
    }


def read_log(path: Path) -> dict:
    """The wall times ``make test`` and pytest printed: ``== make test: N s`` (the Makefile's
    line), pytest's closing ``in N.NNs`` and ``collected N items``."""
    text = path.read_text(encoding="utf-8", errors="replace")
    out = {}
    if m := re.findall(r"== make test: (\d+) s", text):
        out["make_test_s"] = int(m[-1])
    if m := re.findall(r"^=+ .*? in ([\d.]+)s", text, flags=re.M):
        out["pytest_s"] = round(sum(float(x) for x in m), 2)  # its phases added up
        out["pytest_phases_s"] = [float(x) for x in m]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("junit", type=Path, nargs="+", help="the run's JUnit XML (make TEST_JUNIT=)")
    ap.add_argument("--label", required=True, help="before / after (other labels are kept)")
    ap.add_argument("--log", type=Path, help="make test's output, for its wall times")
    ap.add_argument("--note", default="", help="how the run was made (machine state, command)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    run = {"date": utc_now(), "machine": machine(), "note": args.note}
    if args.log:
        run.update(read_log(args.log))
    run.update(read_junit(args.junit))
    data = json.loads(args.out.read_text()) if args.out.exists() else {}
    runs = {**data.get("runs", {}), args.label: run}
    write_json(args.out, {"runs": runs, "provenance": provenance()})
    print("| run | make test s | pytest s | tests | test seconds (sum) |")
    print("|---|---:|---:|---:|---:|")
    for label, r in runs.items():
        print(
            f"| {label} | {r.get('make_test_s', '')} | {r.get('pytest_s', '')} | {r['tests']} "
            f"| {r['test_seconds_total']} |"
        )


if __name__ == "__main__":
    main()
