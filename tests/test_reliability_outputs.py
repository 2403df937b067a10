"""#28 items 1-3: no command writes over a file of an index, score-matrix or model folder, or over
one of its own inputs. Every output path (``--json``, ``--run``, ``--first-stage-run``,
``--metrics``, ``--plot``) and every output folder (``score-matrix``, ``index cur|mf``,
``export``, ``train-ce``, ``cmc train``, ``build``) is pointed at each input of its command and
at each file of each kind of folder: one line naming the path, rc 2, and every byte of every
folder unchanged. Tiny folders made with stand-in models keep it fast."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

import crossknn.ce
import crossknn.score_matrix_job as smj
from crossknn.cli import main
from crossknn.jobs import JobOptions
from test_reliability_build import StubCE, StubDE, build
from test_reliability_jobs import beir


def _stub_scorers(mp: pytest.MonkeyPatch) -> None:
    def scorer(item_texts, **_):
        ce = StubCE()
        ce.set_items(item_texts)
        return ce

    mp.setattr(smj, "embedded_ce_scorer", scorer)
    mp.setattr(crossknn.ce, "default_dual_encoder", lambda **_: StubDE())


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """An index, a score matrix, a crossknn model, a CMC model, a Hugging Face checkpoint, a
    BEIR folder and loose input files."""
    root = tmp_path_factory.mktemp("outputs")
    build("C", root / "idx")
    with pytest.MonkeyPatch.context() as mp:
        _stub_scorers(mp)
        ds = beir(root / "ds")
        (ds / "qrels").mkdir()
        (ds / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td1\t1\n")
        smj.build_score_matrix(ds, root / "mat", options=JobOptions(progress=False), n_test=1)
    model = root / "model"
    model.mkdir()
    (model / "crossknn_model.json").write_text('{"kind": "joint-ce"}\n')
    (model / "tokenizer.json").write_text("{}\n")
    (model / "model.onnx").write_bytes(b"onnx")
    cmc = root / "cmc"
    cmc.mkdir()
    (cmc / "cmc.json").write_text("{}\n")
    (cmc / "model.pt").write_bytes(b"pt")
    hf = root / "hf"
    hf.mkdir()
    (hf / "config.json").write_text('{"model_type": "bert"}\n')
    (hf / "model.safetensors").write_bytes(b"weights")
    (hf / "vocab.txt").write_text("[PAD]\n")
    (root / "queries.txt").write_text("topic one\ntopic two\n")
    (root / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\n1\td1\t1\n")
    np.save(root / "V.npy", np.ones((6, 8), np.float32))
    (root / "corpus.jsonl").write_text(
        "".join(json.dumps({"id": f"d{i}", "text": f"text {i}"}) + "\n" for i in range(4))
    )
    return root


def tree_hash(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (and the target of every symlink)."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = Path(dirpath, f)
            key = str(p.relative_to(root))
            out[key] = (
                "link:" + os.readlink(p)
                if p.is_symlink()
                else hashlib.sha256(p.read_bytes()).hexdigest()
            )
    return out


def folder_files(world: Path) -> list[Path]:
    """Every file of the index, matrix and model folders."""
    files = []
    for name in ("idx", "mat", "model", "cmc", "hf"):
        files += sorted(p for p in (world / name).rglob("*") if p.is_file())
    return files


def refused(capsys, argv: list[str], *, names: str) -> str:
    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, f"{argv}: rc {rc}, stderr {err!r}"
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith(f"crossknn {argv[0]}: error: ") and names in err, err
    return err


def _search(w: Path, opt: str, target) -> list[str]:
    return [
        "search",
        str(w / "idx"),
        "q",
        "--queries",
        str(w / "queries.txt"),
        "--qrels",
        str(w / "qrels.tsv"),
        "--model",
        str(w / "model"),
        "--cmc-model",
        str(w / "cmc"),
        opt,
        str(target),
    ]


def _eval(w: Path, opt: str, target) -> list[str]:
    argv = ["eval", str(w / "mat"), "--method", "axn", "--budget", "4", "--k", "1"]
    argv += ["--item-vectors", str(w / "V.npy"), "--corpus", str(w / "ds"), "--quiet"]
    if opt == "--plot":
        argv += ["--json", str(w / "out.json")]
    return [*argv, opt, str(target)]


def _cmc_eval(w: Path, opt: str, target) -> list[str]:
    return ["cmc", "eval", str(w / "cmc"), "--matrix", str(w / "mat"), opt, str(target)]


FILE_OUTPUTS = [
    (_search, "--run", ["queries.txt", "qrels.tsv", "model/model.onnx"]),
    (_search, "--first-stage-run", ["queries.txt", "qrels.tsv"]),
    (_search, "--metrics", ["queries.txt", "qrels.tsv"]),
    (_eval, "--json", ["V.npy", "ds/corpus.jsonl", "ds/qrels/test.tsv"]),
    (_eval, "--plot", ["V.npy", "ds/queries.jsonl", "out.json"]),
    (_cmc_eval, "--json", ["cmc/cmc.json", "mat/scores.npy"]),
]


@pytest.mark.parametrize(("argv", "opt", "inputs"), FILE_OUTPUTS)
def test_output_file_never_replaces_an_input_or_a_folder_file(world, capsys, argv, opt, inputs):
    before = tree_hash(world)
    targets = [world / i for i in inputs] + folder_files(world)
    for target in targets:
        refused(capsys, argv(world, opt, target), names=f"{opt} {target}")
    assert tree_hash(world) == before


@pytest.mark.parametrize(("argv", "opt", "_"), FILE_OUTPUTS[:4])
def test_output_file_through_a_symlink_or_hard_link_is_refused(
    world, tmp_path, capsys, argv, opt, _
):
    before = tree_hash(world)
    link = tmp_path / "link.out"
    link.symlink_to(world / "idx" / "index.json")
    refused(capsys, argv(world, opt, link), names="index.json of the index folder")
    hard = tmp_path / "hard.out"  # a hard link of an input: the same file
    src = world / ("V.npy" if argv is _eval else "queries.txt")
    os.link(src, hard)
    refused(capsys, argv(world, opt, hard), names="is the input --")
    assert tree_hash(world) == before


def test_output_file_is_refused_as_a_folder_or_a_new_file_in_an_index(world, capsys):
    before = tree_hash(world)
    refused(capsys, _search(world, "--run", world / "idx"), names="is a folder")
    new = world / "idx" / "run.trec"  # an index folder holds only the index's files
    refused(capsys, _search(world, "--run", new), names="would put run.trec into the index")
    new_npy = world / "mat" / "extra.npy"
    refused(capsys, _eval(world, "--json", new_npy), names="into the score-matrix folder")
    assert tree_hash(world) == before


def test_two_outputs_of_one_command_are_two_files(world, tmp_path, capsys):
    argv = _search(world, "--run", tmp_path / "x") + ["--metrics", str(tmp_path / "x")]
    refused(capsys, argv, names="is also the output --run")
    argv = _eval(world, "--plot", tmp_path / "out.json")
    argv[argv.index("--json") + 1] = str(tmp_path / "out.json")
    refused(capsys, argv, names="is also the output --json")


def _folder_targets(world: Path, skip: tuple) -> list[tuple[Path, str]]:
    """(output folder, what the refusal names): the other kinds of folder, a file of each."""
    out = []
    kinds = {"idx": "index", "mat": "score-matrix", "model": "model", "cmc": "CMC model"}
    kinds["hf"] = "Hugging Face checkpoint"
    for name, kind in kinds.items():
        if name not in skip:
            out.append((world / name, f"is {'an' if kind == 'index' else 'a'} {kind} folder"))
        out.append((world / name / "sub", f"lies inside the {kind} folder"))
    for f in folder_files(world)[::3]:
        out.append((f, "exists and is not a folder"))
    return out


FOLDER_OUTPUTS = [
    ("score-matrix", lambda w, o: ["score-matrix", str(w / "ds"), str(o), "--quiet"], "mat", "ds"),
    ("index-cur", lambda w, o: ["index", "cur", str(w / "mat"), str(o), "--quiet"], "idx", "mat"),
    (
        "index-mf",
        lambda w, o: ["index", "mf", str(w / "mat"), str(o), "--k-d", "2", "--quiet"],
        "idx",
        "mat",
    ),
    ("export", lambda w, o: ["export", str(w / "hf"), str(o), "--overwrite"], "model", "hf"),
    ("train-ce", lambda w, o: ["train-ce", str(w / "ds"), str(o), "--resume"], "model", "ds"),
    (
        "cmc",
        lambda w, o: ["cmc", "train", "--matrix", str(w / "mat"), "--out", str(o)],
        "cmc",
        "mat",
    ),
    ("build", lambda w, o: ["build", str(w / "corpus.jsonl"), str(o), "--quiet"], "idx", None),
]


@pytest.mark.parametrize(("name", "argv", "own", "source"), FOLDER_OUTPUTS)
def test_output_folder_is_never_another_kind_of_folder_or_an_input(
    world, capsys, name, argv, own, source
):
    before = tree_hash(world)
    targets = _folder_targets(world, (own, source))
    if source is not None:  # its own input folder
        targets.append((world / source, "the input"))
    for out, names in targets:
        if name == "build" and out.is_dir() and "is a" in names:
            names = "which is not part of an index"  # build's own foreign-folder check
        if name == "build" and out.name == "sub" and out.parent.name == "idx":
            continue  # an index folder's own sub-folder is its business (build checks inputs)
        refused(capsys, argv(world, out), names=names)
    assert tree_hash(world) == before


@pytest.mark.parametrize("cmd", ["score-matrix", "index-cur"])
def test_output_folder_with_foreign_files_is_refused(world, tmp_path, capsys, cmd):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    argv = dict((n, a) for n, a, _, _ in FOLDER_OUTPUTS)[cmd]
    refused(capsys, argv(world, mine), names="holds 'notes.txt', which is not part of a")
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_score_matrix_resumes_and_index_rebuilds_in_their_own_folders(world, tmp_path, capsys):
    with pytest.MonkeyPatch.context() as mp:
        _stub_scorers(mp)
        out = tmp_path / "m"
        assert main(["score-matrix", str(world / "ds"), str(out), "--n-test", "1", "--quiet"]) == 0
        first = tree_hash(out)
        (out / ".lock").write_text("999999999\n")  # what a killed run leaves
        assert main(["score-matrix", str(world / "ds"), str(out), "--n-test", "1", "--quiet"]) == 0
        assert tree_hash(out) == first
    idx = tmp_path / "cur"
    for _ in range(2):
        assert main(["index", "cur", str(world / "mat"), str(idx), "--quiet"]) == 0
    assert (idx / "index.json").is_file()
