"""bench/report.py (the README/docs tables rendered from bench/results JSON) and bench/run.py's
suites: the committed tables match the JSON, drift is caught and named, every maintained bench
script is run by a suite, and the README names only bench files that exist."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
REPORT = BENCH / "report.py"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


report = _module("report")
run = _module("run")


def _report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPORT), *args], cwd=REPO, capture_output=True, text=True
    )


def test_committed_tables_match_the_json():
    """What CI runs (make report-check): every marked block in README.md and docs/ renders to
    exactly the committed text."""
    r = _report("--check")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "match bench/results" in r.stdout


@pytest.mark.parametrize("name", sorted(report.BLOCKS))
def test_every_block_renders_a_table_from_the_committed_json(name):
    text = report.BLOCKS[name].render()
    lines = text.splitlines()
    assert len(lines) >= 3, text  # header, rule, at least one row
    assert all(line.startswith("| ") and line.endswith(" |") for line in lines)
    widths = {line.count(" | ") for line in lines}
    assert len(widths) == 1, f"{name}: rows with different column counts\n{text}"


def test_a_cell_is_the_json_value():
    """The RNR-over-DE cell at k = 10, B = 100 on cisi is the recall in eval_cisi_rnr.json."""
    rows = json.loads((BENCH / "results" / "recall" / "eval_cisi_rnr.json").read_text())["rows"]
    (row,) = [
        r
        for r in rows
        if r["method"] == "rnr" and r["first"] == "de" and r["k"] == 10
        if r["budget"] == 100
    ]
    table = report.BLOCKS["recall-cisi"].render()
    (line,) = [ln for ln in table.splitlines() if ln.startswith("| RNR, DE |")]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[3] == f"{row['recall']:.3f}"  # method, index calls, k10 B50, k10 B100


def test_drift_is_caught_and_named(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Results\n\n<!-- report:overhead -->\n<!-- /report:overhead -->\n\nend\n")
    r = _report("--check", str(page))
    assert r.returncode == 1 and f"{page}:overhead" in r.stderr, r.stderr
    r = _report("--write", str(page))
    assert r.returncode == 0, r.stderr
    written = page.read_text()
    assert written.startswith("# Results\n\n<!-- report:overhead -->\n| B |")
    assert written.endswith("<!-- /report:overhead -->\n\nend\n")
    assert _report("--check", str(page)).returncode == 0
    # a hand-typed number in the table: the check fails and names the block
    edited = re.sub(r"\| 100 \| [0-9.]+ \|", "| 100 | 0.01 |", written, count=1)
    assert edited != written
    page.write_text(edited)
    r = _report("--check", str(page))
    assert r.returncode == 1
    assert f"{page}:overhead" in r.stderr and "0.01" in r.stderr


def test_unknown_and_unclosed_blocks_are_errors(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- report:no-such-table -->\n<!-- /report:no-such-table -->\n")
    r = _report("--check", str(page))
    assert r.returncode == 2 and "no-such-table" in r.stderr, r.stderr
    page.write_text("<!-- report:overhead -->\n| stale |\n")
    r = _report("--check", str(page))
    assert r.returncode == 2 and "<!-- /report:overhead -->" in r.stderr, r.stderr


def test_every_top_level_bench_script_is_run_by_a_suite():
    scripts = {
        f"bench/{p.name}"
        for p in BENCH.glob("*.py")
        if not p.name.startswith("_") and p.name != "run.py"
    }
    missing = scripts - run.scripts_in_suites()
    assert not missing, f"bench scripts no suite of bench/run.py runs: {sorted(missing)}"
    assert len(scripts | {"bench/run.py"}) <= 15, sorted(scripts)


def test_run_dry_run_lists_the_quick_suite():
    r = subprocess.run(
        [sys.executable, str(BENCH / "run.py"), "--suite", "quick", "--dry-run"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert "python bench/report.py --check" in r.stdout
    assert "| quick | tables match the JSON | dry run |" in r.stdout


def test_no_bench_script_lives_outside_the_suites():
    """A script in a folder under bench/ is run by a suite too: a one-question script leaves
    once its answer is written down (docs/design/notes.md), it is not kept beside them."""
    nested = {str(p.relative_to(REPO)) for p in BENCH.rglob("*.py") if p.parent != BENCH}
    missing = nested - run.scripts_in_suites()
    assert not missing, f"bench scripts in folders that no suite runs: {sorted(missing)}"


def test_every_result_file_says_where_when_and_how_it_was_measured():
    """bench/_common.write_json adds ``provenance`` to new results; the committed ones carry it
    too (reconstructed from their own fields and git history where they predate it); a bench may
    also write the four keys at the top level."""
    missing = []
    for path in sorted((BENCH / "results").rglob("*.json")):
        data = json.loads(path.read_text())
        prov = data.get("provenance", data)  # or the four keys at the top level
        if not isinstance(prov, dict) or not {"machine", "date", "commit", "command"} <= set(prov):
            missing.append(str(path.relative_to(REPO)))
        elif not (prov["date"] and prov["commit"] and prov["command"]):
            missing.append(str(path.relative_to(REPO)))
    assert not missing, missing


def test_write_json_records_provenance(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    common = _module("_common")
    out = common.write_json(tmp_path / "r.json", {"rows": [1]})
    prov = json.loads(out.read_text())["provenance"]
    assert prov["commit"] and prov["date"].endswith("Z") and prov["machine"]
    assert prov["command"].startswith("python")


def test_run_adds_provenance_to_a_result_written_without_it(tmp_path):
    bare, has = tmp_path / "bare.json", tmp_path / "has.json"
    bare.write_text('{"rows": [1]}')
    has.write_text('{"rows": [2], "provenance": {"command": "kept"}}')
    for path in (bare, has):
        step = run.Step("x", ("bench/x.py", "--out", str(path)))
        run.add_provenance(step, f"python bench/x.py --out {path}", since=0.0)
    prov = json.loads(bare.read_text())["provenance"]
    assert prov["command"] == f"python bench/x.py --out {bare}" and prov["commit"]
    assert json.loads(bare.read_text())["rows"] == [1]
    assert json.loads(has.read_text())["provenance"] == {"command": "kept"}


def test_readme_names_only_bench_files_that_exist():
    text = (REPO / "README.md").read_text()
    paths = set(re.findall(r"bench/[A-Za-z0-9_./-]+\.(?:py|json|sh|md)", text))
    missing = sorted(p for p in paths if not (REPO / p).exists())
    assert not missing, missing
