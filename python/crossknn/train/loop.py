"""``train_cross_encoder``: fine-tune a [CLS] or [EMB] cross-encoder and export it.

The run lives in ``OUT_DIR/train/`` (tokenizer and Hugging Face checkpoint, the mined DE top-N,
``checkpoint.pt`` every ``checkpoint_every`` steps, ``best.pt`` the best weights on the dev
queries); ``resume=True`` continues from the last checkpoint bitwise as the uninterrupted run
would have. At the end the best weights (by dev nDCG@10; the last ones without a dev split) are
exported to ``OUT_DIR`` as a crossknn model (:func:`crossknn.ce.export.export_cross_encoder`),
with ``training.json`` (settings, data counts, outcome) and ``dev_curve.json``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm
from tqdm.auto import tqdm as _tqdm

from crossknn.ce.export import export_cross_encoder, write_tokenizer
from crossknn.ce.models import default_dual_encoder, minilm_checkpoint_dir
from crossknn.ce.runtime import OnnxDualEncoder
from crossknn.fileio import atomic_save_npy, atomic_write_json, read_json
from crossknn.train.checkpoint import load_checkpoint, load_state, save_checkpoint, save_state
from crossknn.train.config import TrainConfig
from crossknn.train.dev import de_order_metrics, dev_metrics, split_dev
from crossknn.train.examples import load_examples
from crossknn.train.groups import StepPlan
from crossknn.train.losses import group_loss
from crossknn.train.negatives import de_top_n, hard_negatives, item_vectors
from crossknn.train.scorer import PairEncoder, TrainableCE, check_base
from crossknn.train.teacher import open_teacher

__all__ = ["train_cross_encoder"]

log = logging.getLogger("crossknn.train")

WORK = "train"


def default_work_dir(out: Path) -> Path:
    """Where checkpoints go by default: beside the output folder, ``OUT_DIR.train``."""
    return out.with_name(out.name + "." + WORK)


def _prepare_out(out: Path, resume: bool, work: Path) -> Path:
    """Check the output and work folders (each empty or new, unless ``resume`` finds the work
    folder, which holds the checkpoints) and make the work folder."""
    if not (resume and work.is_dir()):
        for folder in (out, work):
            if folder.exists() and any(folder.iterdir()):
                hint = "" if resume else " (pass --resume to continue a run in it)"
                raise FileExistsError(f"{folder} exists and is not empty{hint}")
    (work / "hf").mkdir(parents=True, exist_ok=True)
    return work


def _mine(work: Path, de, ex, pool: np.ndarray, n: int, key: str, cache_dir) -> np.ndarray:
    """The DE top-N of every query (item indices), cached in the work folder."""
    path, meta = work / "de_top_n.npy", work / "de_top_n.json"
    if path.is_file() and meta.is_file() and read_json(meta).get("key") == key:
        return np.load(path)
    log.info("mining hard negatives: DE over %d items, %d queries", len(pool), len(ex))
    vecs = item_vectors(de, ex.item_texts, cache_dir)[pool]
    top = pool[de_top_n(de, ex.query_texts, vecs, n)]
    atomic_save_npy(path, top)
    atomic_write_json(meta, {"key": key})
    return top


def _autocast(torch, device, bf16: bool):
    """A context factory: bfloat16 autocast on ``device`` when ``bf16`` (the master weights,
    optimizer state, losses and the export stay float32), else a no-op. Refused where neither the
    GPU nor oneDNN on the CPU supports bfloat16; on CPUs without AVX512-BF16 / AMX units oneDNN
    may still accept it but runs it slower than float32."""
    if not bf16:
        return contextlib.nullcontext
    if device.type == "cuda":
        if not torch.cuda.is_bf16_supported():
            raise ValueError("--bf16: this GPU has no bfloat16 support; train without --bf16")
    elif (
        not torch.backends.mkldnn.is_available() or not torch.ops.mkldnn._is_mkldnn_bf16_supported()
    ):
        raise ValueError("--bf16: this CPU has no bfloat16 support (oneDNN); train without --bf16")
    return lambda: torch.autocast(device.type, dtype=torch.bfloat16)


_TIME_STOP = "time budget of"


def _time_stop_lifted(st: dict, max_minutes: float | None) -> bool:
    """A run that stopped on its time budget goes on when resumed with a larger one (or none);
    early stopping on the dev split is kept."""
    stopped = st["stopped"] or ""
    return stopped.startswith(_TIME_STOP) and (
        max_minutes is None or st["train_s"] < 60 * max_minutes
    )


def train_cross_encoder(
    data: str | os.PathLike,
    out_dir: str | os.PathLike,
    config: TrainConfig | None = None,
    *,
    base: str | os.PathLike | None = None,
    de: str | os.PathLike | None = None,
    teacher: str | os.PathLike | None = None,
    resume: bool = False,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = True,
    on_step: Callable[[int, float], None] | None = None,
    work_dir: str | os.PathLike | None = None,
    keep_checkpoints: bool = False,
) -> dict:
    """Train, select on dev, export; returns the ``training.json`` record.

    ``base``: a Hugging Face encoder folder (default: the embedded all-MiniLM-L6-v2 weights);
    ``de``: an exported dual-encoder folder that mines the hard negatives (default: the embedded
    minilm-l6-de); ``teacher``: a score-matrix or CE folder (the distill loss);
    ``on_step(step, loss)`` is called after every optimizer step (tests use it to interrupt);
    ``work_dir``: the checkpoints, mined negatives and the trained Hugging Face weights (default
    ``OUT_DIR.train`` beside the output), removed when the run ends with its model exported
    unless ``keep_checkpoints`` (an interrupted run, or one stopped on its time budget, keeps
    it, for ``resume``).
    """
    # torch: optional (export extra), about 1 s to import
    import torch

    cfg = config or TrainConfig()
    cfg.check()
    if (cfg.loss == "distill") != (teacher is not None):
        raise ValueError("the distill loss needs --teacher, and --teacher needs --loss distill")
    base = Path(base) if base is not None else minilm_checkpoint_dir()
    check_base(base)
    out = Path(out_dir)
    ex = load_examples(data, cfg.split)
    tch = open_teacher(teacher, cfg.threads) if teacher is not None else None
    if tch is not None:
        ex = tch.restrict(ex)
    pool = tch.item_pool if tch is not None and tch.item_pool is not None else None
    pool = np.arange(len(ex.item_ids)) if pool is None else pool
    most_pos = max(len(p) for p in ex.positives)
    if len(pool) - most_pos < cfg.group_size - 1:
        raise ValueError(
            f"{len(pool)} items are too few for groups of {cfg.group_size} (a query has "
            f"{most_pos} positives)"
        )
    work = _prepare_out(out, resume, Path(work_dir) if work_dir else default_work_dir(out))

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    amp = _autocast(torch, device, cfg.bf16)
    de_model = (
        OnnxDualEncoder(de, threads=cfg.threads)
        if de is not None
        else default_dual_encoder(cache_dir=cache_dir, threads=cfg.threads)
    )
    key = cfg.fingerprint(data=str(data), de=de_model.model_hash, n=len(ex), pool=len(pool))
    top = _mine(work, de_model, ex, pool, cfg.negatives, key, cache_dir)
    train_rows, dev_rows = split_dev(len(ex), cfg.dev_fraction, cfg.seed, cfg.dev_queries)
    train_ex, dev_ex = ex.subset(train_rows), ex.subset(dev_rows)
    hard = hard_negatives(
        top[train_rows, cfg.negatives_skip :], train_ex.positives, train_ex.negatives
    )
    dev_cand = top[dev_rows]

    write_tokenizer(base, work / "hf")
    enc = PairEncoder(work / "hf" / "tokenizer.json", cfg.max_length, ex.query_texts, ex.item_texts)
    torch.manual_seed(cfg.seed)
    model = TrainableCE(base, cfg.kind, loss=cfg.loss).to(device)
    model.train()
    optimizer = torch.optim.AdamW(
        model.param_groups(cfg.lr, cfg.head_lr), lr=cfg.lr, weight_decay=cfg.weight_decay
    )
    plan = StepPlan(len(train_ex), cfg.batch_size * cfg.grad_accum, cfg.seed)
    total = cfg.max_steps or max(1, math.ceil(cfg.epochs * plan.steps_per_epoch))
    warm = max(1, int(cfg.warmup * total))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warm, max(0.0, (total - s) / max(1, total - warm)))
    )
    ck = None
    if resume:
        ck = load_checkpoint(
            work, model=model, optimizer=optimizer, scheduler=scheduler, config=key
        )
    st = {
        "config": key,
        "losses": [],
        "curve": [],
        "best": None,
        "best_step": None,
        "bad_evals": 0,
        "train_s": 0.0,
        "stopped": None,
    }
    if ck is not None:
        st.update({k: ck[k] for k in st})
        log.info("resuming at step %d of %d", ck["step"], total)
        if _time_stop_lifted(st, cfg.max_minutes):
            log.info("%s: the new --max-minutes lets it go on", st["stopped"])
            st["stopped"] = None
    step = ck["step"] if ck is not None else 0

    def evaluate(at: int) -> None:
        if not len(dev_ex):
            return
        with amp():
            m = dev_metrics(
                model,
                enc,
                dev_rows,
                dev_ex.relevance,
                dev_cand,
                device,
                cfg.max_tokens,
                progress=progress,
                desc=f"dev at step {at}",
            )
        recent = st["losses"][-cfg.eval_every :]
        row = {"step": at, "train_loss": float(np.mean(recent)) if recent else None, **m}
        st["curve"].append(row)
        if st["best"] is None or m["ndcg@10"] > st["best"]:
            st["best"], st["best_step"], st["bad_evals"] = m["ndcg@10"], at, 0
            save_state(work / "best.pt", model.state_dict())
        else:
            st["bad_evals"] += 1
        log.info("dev at step %d: nDCG@10 %.4f RR@10 %.4f", at, m["ndcg@10"], m["rr@10"])
        if progress:  # the dev curve as training goes
            best = " (best)" if st["best_step"] == at else ""
            _tqdm.write(
                f"dev at step {at}: nDCG@10 {m['ndcg@10']:.4f}  RR@10 {m['rr@10']:.4f}{best}"
            )

    # the time budget counts from here: the step-0 dev evaluation is inside it
    t_start = time.perf_counter() - st["train_s"]
    if step == 0 and not st["curve"]:
        evaluate(0)
        st["train_s"] = time.perf_counter() - t_start
        if cfg.max_minutes is not None and st["train_s"] >= 60 * cfg.max_minutes:
            st["stopped"] = (
                f"{_TIME_STOP} {cfg.max_minutes} min (spent by the step-0 dev evaluation)"
            )
            save_checkpoint(
                work, model=model, optimizer=optimizer, scheduler=scheduler, step=step, state=st
            )

    bar = tqdm(total=total, initial=step, desc=f"train-ce {cfg.kind}", disable=not progress)
    per_q = cfg.group_size
    while step < total and st["stopped"] is None:
        rows = plan.queries(step)
        groups = plan.groups(
            step, rows, train_ex.positives, hard, pool, cfg.group_size, cfg.random_negatives
        )
        optimizer.zero_grad(set_to_none=True)
        step_loss = 0.0
        for part in np.array_split(np.arange(len(rows)), math.ceil(len(rows) / cfg.batch_size)):
            q = train_rows[rows[part]]  # rows of ex (the encoder's query index)
            qi = np.repeat(q, per_q)
            ii = groups[part].ravel()
            with amp():
                scores = enc.score(model, qi, ii, device, cfg.max_tokens)
            logits = model.logits(scores.float()).view(len(part), per_q)
            t = None
            if tch is not None:
                t = torch.from_numpy(tch.scores(qi, ii, ex)).to(device)
                t = t.view(len(part), per_q)
            loss = group_loss(cfg.loss, logits, t) * (len(part) / len(rows))
            loss.backward()
            step_loss += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        step += 1
        st["losses"].append(step_loss)
        st["train_s"] = time.perf_counter() - t_start
        bar.update(1)
        bar.set_postfix(loss=f"{np.mean(st['losses'][-20:]):.4f}")
        if step % cfg.eval_every == 0 or step == total:
            evaluate(step)
            if st["bad_evals"] >= cfg.patience:
                st["stopped"] = f"early stop: no dev gain in {cfg.patience} evaluations"
        if cfg.max_minutes is not None and st["train_s"] >= 60 * cfg.max_minutes:
            if step % cfg.eval_every and step != total:
                evaluate(step)
            st["stopped"] = f"{_TIME_STOP} {cfg.max_minutes} min"
        if step % cfg.checkpoint_every == 0 or step == total or st["stopped"]:
            save_checkpoint(
                work, model=model, optimizer=optimizer, scheduler=scheduler, step=step, state=st
            )
        if on_step is not None:
            on_step(step, step_loss)
    bar.close()
    record = _finish(
        work,
        out,
        base,
        cfg,
        model,
        ex,
        dev_ex,
        step,
        total,
        st,
        data,
        export_cross_encoder,
        load_state,
        tch,
        # the DE's own order of the same dev candidates: what the CE has to beat
        de_order_metrics(dev_cand, dev_ex.relevance) if len(dev_ex) else None,
    )
    # the model is exported: the checkpoints are no longer needed, unless kept or the run
    # stopped on its time budget (a resume with a larger one goes on from them)
    if not keep_checkpoints and not (st["stopped"] or "").startswith(_TIME_STOP):
        shutil.rmtree(work, ignore_errors=True)
    return record


def _finish(
    work, out, base, cfg, model, ex, dev_ex, step, total, st, data, export, load_state, tch, dev_de
) -> dict:
    if (work / "best.pt").is_file() and st["best"] is not None:
        model.load_state_dict(load_state(work / "best.pt"))
    model.cpu().eval()
    model.hf_model.save_pretrained(str(work / "hf"), safe_serialization=True)
    export(
        work / "hf",
        out,
        kind="cls" if cfg.kind == "cls" else "joint",
        max_length=cfg.max_length,
        activation="none",
        model_id=out.name,
        quantize=cfg.int8,
        overwrite=True,
    )
    record = {
        "config": cfg.as_dict(),
        "data": str(data),
        "base": str(base),
        "teacher": getattr(tch, "name", None),
        "queries": {"train": len(ex) - len(dev_ex), "dev": len(dev_ex), "skipped": ex.skipped},
        "items": len(ex.item_ids),
        "steps": step,
        "planned_steps": total,
        "train_s": round(st["train_s"], 2),
        "stopped": st["stopped"] or "all steps done",
        "selected_step": st["best_step"] if st["best"] is not None else step,
        "dev_ndcg@10": st["best"],
        "dev_de": dev_de,
    }
    atomic_write_json(out / "dev_curve.json", st["curve"])
    atomic_write_json(out / "training.json", record)
    return record
