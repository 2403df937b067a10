"""crossknn's own training loop vs sentence-transformers' CE training: ``trainer_compare.json``.

The same [CLS] cross-encoder (the embedded all-MiniLM-L6-v2 weights with a new one-logit head, as
``crossknn train-ce --kind cls`` starts it), the same small SciFact slice (a BEIR folder written by
this script: train queries of the train split, dev queries of the test split, their positives and
random items), the same groups (1 positive + hard and random negatives, drawn by crossknn's
``StepPlan`` for each step, so both trainers see the same pairs in the same order), the same loss
(softmax cross-entropy over each group with the positive as target), learning rates (body ``--lr``,
head ``--head-lr``), batch, warm-up share, gradient clipping and number of optimizer steps:

- ``crossknn``: ``crossknn train-ce SLICE OUT --kind cls`` (a subprocess), then the same command
  killed with SIGKILL after the checkpoint of step ``--kill-at`` and resumed with ``--resume``:
  are the exported ONNX bytes, the trained weights and the loss log those of the uninterrupted run?
- ``sentence-transformers`` stand-in (the default run): ST's ``CrossEncoder`` model and its
  ``ListNetLoss`` (one-hot targets: the same loss as crossknn's listwise) in a plain torch loop
  doing what the Trainer's step does (AdamW with the Trainer's weight-decay groups and
  ``learning_rate_mapping``, linear warm-up/decay, clip at 1.0); it needs neither ``accelerate``
  nor ``datasets``. Its checkpoint is the file set the Trainer writes, written by this script.
- ``--st-trainer``: sentence-transformers' own ``CrossEncoderTrainer`` (on HF ``Trainer``; needs
  the ``trainers`` extra: ``accelerate``, ``datasets``) with the same model and ``ListNetLoss``,
  ``learning_rate_mapping={"classifier": head_lr}``, a ``datasets.Dataset`` holding crossknn's
  step groups in step order and a batch sampler that reads it in order; its own checkpoint
  folders every ``--kill-at`` steps. Then the same Trainer run killed (SIGKILL) after step
  ``--kill-at`` + 1 and resumed with ``resume_from_checkpoint=checkpoint-<kill-at>``: the same
  final weights, exported ONNX bytes and per-step losses (float32, exact) as the uninterrupted
  run? Beside it ``crossknn train-ce`` for the same steps (one after the other, not side by side:
  the Trainer's loop cannot be stepped in turn with another one). Merged into ``--out`` as
  ``crossknn_vs_st_trainer``.

Measured per row: seconds per optimizer step (training only), the process' wall time and peak RSS
(``wait4``), dev nDCG@10 / RR@10 (``crossknn.trec.run_metrics``) of the trained model exported
with crossknn's exporter and reranking each dev query's DE top-``--dev-candidates`` of the slice,
and the checkpoint size on disk. Two parity checks (eval mode, no dropout): the same start point
and the same step-0 loss in both; and whether the [EMB] kind (crossknn's joint CE: the cosine of
the mean query-segment and item-segment token vectors of one joint pass) can be expressed as an
ST ``CrossEncoder`` (a custom module after ST's ``Transformer``): its scores against crossknn's
embedded [EMB] CE, and its ListNet loss against crossknn's listwise loss on the same group.

Example (the run in docs/train.md)::

    nice -n 5 .venv/bin/python bench/trainer_compare.py --work /tmp/tc --threads 1
    nice -n 5 .venv/bin/python bench/trainer_compare.py --st-trainer --steps 12 --kill-at 6 \
        --threads 1 --work /tmp/tct
    .venv/bin/python bench/trainer_compare.py --quick --work /tmp/tcq   # smoke, < 30 s
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, SHARED, machine, utc_now, write_json  # noqa: E402

BENCH = Path(__file__).resolve()


# ---------------------------------------------------------------- data: the slice


def find_data(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    env = os.environ.get("CROSSKNN_DATA")
    return (Path(env) if env else SHARED / "data") / "scifact"


def build_slice(src: Path, dst: Path, n_train: int, n_dev: int, n_items: int, seed: int) -> dict:
    """A BEIR folder: ``n_train`` queries of the train split (qrels/train.tsv), ``n_dev`` of the
    test split (qrels/test.tsv), and ``n_items`` items: their positives, then random ones."""
    from crossknn.data import load_beir, read_jsonl

    beir = load_beir(src)
    have = set(beir.item_ids)
    rng = np.random.default_rng([seed, 31])

    def pick(split: str, n: int) -> list[str]:
        qids = sorted(
            q
            for q, rels in beir.qrels[split].items()
            if q in set(beir.query_ids) and any(r > 0 and d in have for d, r in rels.items())
        )
        return [
            qids[i] for i in sorted(rng.choice(len(qids), size=min(n, len(qids)), replace=False))
        ]

    train, dev = pick("train", n_train), pick("test", n_dev)
    keep = {d for s, qs in (("train", train), ("test", dev)) for q in qs for d in beir.qrels[s][q]}
    keep &= have
    rest = sorted(have - keep)
    fill = max(0, n_items - len(keep))
    keep |= {rest[i] for i in rng.choice(len(rest), size=min(fill, len(rest)), replace=False)}
    (dst / "qrels").mkdir(parents=True, exist_ok=True)
    with open(dst / "corpus.jsonl", "w", encoding="utf-8") as f:
        for _, rec in read_jsonl(src / "corpus.jsonl"):
            if str(rec.get("_id")) in keep:
                f.write(json.dumps(rec) + "\n")
    wanted = set(train) | set(dev)
    with open(dst / "queries.jsonl", "w", encoding="utf-8") as f:
        for _, rec in read_jsonl(src / "queries.jsonl"):
            if str(rec.get("_id")) in wanted:
                f.write(json.dumps(rec) + "\n")
    for split, qs in (("train", train), ("test", dev)):
        with open(dst / "qrels" / f"{split}.tsv", "w", encoding="utf-8") as f:
            f.write("query-id\tcorpus-id\tscore\n")
            for q in qs:
                for d, r in beir.qrels[split][q].items():
                    if d in keep:
                        f.write(f"{q}\t{d}\t{r}\n")
    return {"train_queries": len(train), "dev_queries": len(dev), "items": len(keep)}


# ---------------------------------------------------------------- processes and files


def run_measured(cmd: list[str], env: dict, *, kill_when=None, log: Path) -> dict:
    """Run ``cmd``; its wall time, peak RSS (MiB, ``wait4``) and exit status. ``kill_when()``
    (polled every 0.2 s) returning True sends SIGKILL."""
    t0 = time.perf_counter()
    with open(log, "w") as out:
        p = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        killed = False
        while True:  # wait4, not poll(): poll() would reap the child and lose its rusage
            pid, status, usage = os.wait4(p.pid, os.WNOHANG if kill_when else 0)
            if pid:
                break
            if not killed and kill_when():
                p.send_signal(signal.SIGKILL)
                killed = True
            time.sleep(0.2)
        p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if p.returncode != 0 and not killed:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{' '.join(cmd[:3])} ... exited {p.returncode}:\n{tail}")
    return {
        "wall_s": round(wall, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        "killed": killed,
    }


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def size_mb(path: Path) -> float:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return round(sum(p.stat().st_size for p in files) / 2**20, 1)


def crossknn_cli() -> list[str]:
    exe = shutil.which("crossknn", path=str(Path(sys.executable).parent))
    return (
        [exe]
        if exe
        else [sys.executable, "-c", "import sys; from crossknn.cli import main; sys.exit(main())"]
    )


# ---------------------------------------------------------------- (a) crossknn train-ce


def train_ce_args(a, slice_dir: Path, out: Path, work: Path, ckpt_every: int) -> list[str]:
    return [
        "train-ce", str(slice_dir), str(out), "--kind", "cls", "--loss", "listwise",
        "--max-steps", str(a.steps), "--batch-size", str(a.batch_size),
        "--group-size", str(a.group_size), "--negatives", str(a.negatives),
        "--random-negatives", str(a.random_negatives), "--lr", str(a.lr),
        "--head-lr", str(a.head_lr), "--max-length", str(a.max_length), "--dev-fraction", "0",
        "--seed", str(a.seed), "--checkpoint-every", str(ckpt_every), "--threads", str(a.threads),
        "--work-dir", str(work), "--keep-checkpoints", "--no-progress",
    ]  # fmt: skip


def crossknn_row(a, slice_dir: Path, root: Path, env: dict) -> tuple[dict, Path, Path]:
    out, work = root / "crossknn" / "model", root / "crossknn" / "work"
    args = train_ce_args(a, slice_dir, out, work, a.steps)
    m = run_measured(crossknn_cli() + args, env, log=root / "crossknn.log")
    rec = json.loads((out / "training.json").read_text())
    row = {
        "trainer": "crossknn train-ce",
        "mode": "own loop",
        "kind": "cls",
        "command": "crossknn " + " ".join(args),
        "steps": rec["steps"],
        "train_s": rec["train_s"],
        "s_per_step": round(rec["train_s"] / rec["steps"], 3),
        **m,
        "checkpoint_mb": size_mb(work / "checkpoint.pt"),
        "checkpoint_files": ["checkpoint.pt"],
        "work_dir_mb": size_mb(work),
        "model_dir_mb": size_mb(out),
    }
    return row, out, work


def crossknn_resume(
    a, slice_dir: Path, root: Path, env: dict, ref_out: Path, ref_work: Path
) -> dict:
    """Kill ``train-ce`` (SIGKILL) between checkpoints after step ``--kill-at``, resume it, and
    compare with the uninterrupted run."""
    import torch

    out, work = root / "crossknn-resume" / "model", root / "crossknn-resume" / "work"
    every = a.checkpoint_every
    args = train_ce_args(a, slice_dir, out, work, every)
    ck = work / "checkpoint.pt"
    seen = {"mtime": None, "writes": 0, "at": None}

    def kill_when() -> bool:
        if ck.is_file():
            mt = ck.stat().st_mtime_ns
            if mt != seen["mtime"]:
                seen["mtime"], seen["writes"] = mt, seen["writes"] + 1
                if seen["writes"] * every >= a.kill_at and seen["at"] is None:
                    seen["at"] = time.perf_counter()
        # half a step after the checkpoint: killed between two checkpoints
        return seen["at"] is not None and time.perf_counter() - seen["at"] >= a.kill_delay

    first = run_measured(crossknn_cli() + args, env, kill_when=kill_when, log=root / "kill.log")
    step_at_kill = int(torch.load(ck, map_location="cpu", weights_only=False)["step"])
    resumed = run_measured(crossknn_cli() + args + ["--resume"], env, log=root / "resume.log")
    ref_ck = torch.load(ref_work / "checkpoint.pt", map_location="cpu", weights_only=False)
    new_ck = torch.load(ck, map_location="cpu", weights_only=False)
    same_weights = all(
        torch.equal(ref_ck["model"][k], new_ck["model"][k]) for k in ref_ck["model"]
    ) and set(ref_ck["model"]) == set(new_ck["model"])
    return {
        "command": "crossknn " + " ".join(args) + "  (SIGKILL, then again with --resume)",
        "killed": first["killed"],
        "checkpoint_step_at_kill": step_at_kill,
        "kill_wall_s": first["wall_s"],
        "resume_wall_s": resumed["wall_s"],
        "same_onnx_bytes": sha256(ref_out / "model.onnx") == sha256(out / "model.onnx"),
        "same_weights": bool(same_weights),
        "same_losses": ref_ck["losses"] == new_ck["losses"],
        "resume_bitwise": None,  # filled below
    }


# ---------------------------------------------------------------- (b) sentence-transformers


def st_status() -> dict:
    """Versions, and whether CrossEncoderTrainer / HF Trainer can be built here."""
    out = {}
    for dist in ("sentence-transformers", "transformers", "accelerate", "datasets", "torch"):
        from importlib import metadata

        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    try:
        from sentence_transformers.cross_encoder import CrossEncoderTrainingArguments

        with tempfile.TemporaryDirectory() as tmp:
            CrossEncoderTrainingArguments(output_dir=tmp, report_to=[])
        out["trainer_builds"] = True
        out["trainer_error"] = None
    except Exception as exc:  # ImportError: accelerate missing, or no sentence-transformers
        out["trainer_builds"] = False
        out["trainer_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return out


def step_groups(slice_dir: Path, top_n: Path, a) -> tuple[list, list]:
    """The (query, [items]) groups of every step as ``train-ce`` draws them (--dev-fraction 0)."""
    from crossknn.train.dev import split_dev
    from crossknn.train.examples import load_examples
    from crossknn.train.groups import StepPlan
    from crossknn.train.negatives import hard_negatives

    ex = load_examples(slice_dir, "train")
    train_rows, _ = split_dev(len(ex), 0.0, a.seed, None)
    tr = ex.subset(train_rows)
    hard = hard_negatives(np.load(top_n)[train_rows], tr.positives, tr.negatives)
    pool = np.arange(len(ex.item_ids))
    plan = StepPlan(len(tr), a.batch_size, a.seed)
    steps = []
    for s in range(a.steps):
        rows = plan.queries(s)
        g = plan.groups(s, rows, tr.positives, hard, pool, a.group_size, a.random_negatives)
        steps.append((train_rows[rows], g))
    return ex, steps


def st_model(base: str, kind: str, a):
    import torch
    from sentence_transformers.cross_encoder import CrossEncoder

    eager = {"attn_implementation": "eager"}  # as train-ce loads it
    if kind == "cls":
        return CrossEncoder(
            base, num_labels=1, max_length=a.max_length, local_files_only=True, device="cpu",
            model_kwargs=eager, activation_fn=torch.nn.Identity(),
        )  # fmt: skip
    from sentence_transformers.base.modules import Transformer

    tr = Transformer(
        base, transformer_task="feature-extraction", max_seq_length=a.max_length,
        config_kwargs={"num_labels": 1}, model_kwargs=eager,
    )  # fmt: skip
    return CrossEncoder(
        modules=[tr, _segment_cosine_module()], device="cpu", activation_fn=torch.nn.Identity()
    )


def _segment_cosine_module():
    """crossknn's [EMB] score as an ST module after ``Transformer``: the cosine of the mean
    query-segment and item-segment token vectors (special tokens and padding left out)."""
    import torch
    from sentence_transformers.base.modules import Module

    class SegmentCosine(Module):
        config_keys: list[str] = []

        def __init__(self, special_ids=(101, 102)) -> None:
            super().__init__()
            self.special_ids = special_ids

        def forward(self, features, **kwargs):
            h, ids = features["token_embeddings"], features["input_ids"]
            live = features["attention_mask"].bool()
            for sid in self.special_ids:
                live &= ids != sid
            types = features["token_type_ids"]
            vecs = []
            for seg in (0, 1):
                w = (live & (types == seg)).to(h.dtype).unsqueeze(-1)
                v = (h * w).sum(1) / w.sum(1).clamp(min=1.0)
                vecs.append(torch.nn.functional.normalize(v, dim=-1))
            features["scores"] = (vecs[0] * vecs[1]).sum(-1, keepdim=True)
            return features

        def save(self, output_path, *args, **kwargs) -> None:
            self.save_config(output_path)

    return SegmentCosine()


def _listnet(model, scale: float, mini_batch_size: int | None = None):
    import torch
    from sentence_transformers.cross_encoder.losses import ListNetLoss

    class Scale(torch.nn.Module):
        def forward(self, x):
            return scale * x

    act = Scale() if scale != 1.0 else torch.nn.Identity()
    return ListNetLoss(model, activation_fn=act, mini_batch_size=mini_batch_size)


def _batch(ex, q_rows, groups):
    """ListNet inputs: queries, their item texts, one-hot targets as labels (0 for the positive,
    -inf for each negative: softmax(labels) is then [1, 0, ...], the listwise target)."""
    import torch

    queries = [ex.query_texts[int(q)] for q in q_rows]
    docs = [[ex.item_texts[int(i)] for i in g] for g in groups]
    lab = torch.full((groups.shape[1],), float("-inf"))
    lab[0] = 0.0
    return [queries, docs], [lab.clone() for _ in q_rows]


def st_param_groups(loss_fn, a) -> list[dict]:
    """The Trainer's AdamW groups (``BaseTrainer.get_optimizer_cls_and_kwargs``): weight decay
    0.01 except on biases and LayerNorms, then ``learning_rate_mapping={"classifier": head_lr}``."""
    import torch
    from transformers.trainer_pt_utils import get_parameter_names

    forbidden = [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]
    decay = set(get_parameter_names(loss_fn, [torch.nn.LayerNorm], forbidden))
    groups = []
    for head in (False, True):
        for dec in (True, False):
            ps = [
                p
                for n, p in loss_fn.named_parameters()
                if p.requires_grad and ("classifier" in n) == head and (n in decay) == dec
            ]
            if ps:
                lr = a.head_lr if head else a.lr
                groups.append({"params": ps, "lr": lr, "weight_decay": 0.01 if dec else 0.0})
    return groups


def worker_st(cfg: dict) -> None:
    """Train the [CLS] CE with ST's model and loss; write the model, a Trainer-layout checkpoint
    and the timings (JSON)."""
    import torch
    from transformers import get_linear_schedule_with_warmup

    from crossknn.ce.export import export_cross_encoder

    a = argparse.Namespace(**cfg["args"])
    torch.set_num_threads(a.threads)
    root = Path(cfg["root"])
    ex, steps = step_groups(Path(cfg["slice"]), Path(cfg["top_n"]), a)
    torch.manual_seed(a.seed)
    model = st_model(cfg["base"], "cls", a)
    loss_fn = _listnet(model, 1.0, cfg["mini_batch"])
    groups = st_param_groups(loss_fn, a)
    opt = torch.optim.AdamW(groups, lr=a.lr)
    sched = get_linear_schedule_with_warmup(opt, math.ceil(0.1 * a.steps), a.steps)
    model.train()
    losses = []
    t0 = time.perf_counter()
    for q_rows, g in steps:
        inputs, labels = _batch(ex, q_rows, g)
        loss = loss_fn(inputs, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    train_s = time.perf_counter() - t0
    # what Trainer._save_checkpoint writes (here by this script: no Trainer runs)
    here = root / cfg["name"]
    ck = here / "checkpoint"
    model.save(str(ck))
    torch.save(opt.state_dict(), ck / "optimizer.pt")
    torch.save(sched.state_dict(), ck / "scheduler.pt")
    torch.save(
        {
            "python": None,
            "numpy": np.random.get_state(),  # noqa: NPY002 (the Trainer saves it)
            "cpu": torch.get_rng_state(),
        },
        ck / "rng_state.pth",
    )
    (ck / "trainer_state.json").write_text(
        json.dumps({"global_step": len(losses), "log_history": losses})
    )
    files = sorted(p.name for p in ck.iterdir())
    model.eval()
    hf = here / "hf"
    model.model.save_pretrained(str(hf), safe_serialization=True)
    model.tokenizer.save_pretrained(str(hf))
    export_cross_encoder(
        hf,
        here / "model",
        kind="cls",
        max_length=a.max_length,
        activation="none",
        model_id="st-cls",
        overwrite=True,
    )
    res = {
        "train_s": round(train_s, 2),
        "steps": len(losses),
        "losses": losses,
        "checkpoint_files": files,
    }
    (here / "result.json").write_text(json.dumps(res))


def trainer_dataset(ex, steps):
    """The rows of every step, in step order, as a ``datasets.Dataset`` for ListNetLoss: the query,
    its group's item texts and the one-hot targets (0 for the positive, -inf for the negatives)."""
    from datasets import Dataset

    rows = {"query": [], "docs": [], "label": []}
    for q_rows, g in steps:
        inputs, labels = _batch(ex, q_rows, g)
        rows["query"] += inputs[0]
        rows["docs"] += inputs[1]
        rows["label"] += [lab.tolist() for lab in labels]
    return Dataset.from_dict(rows)


def in_order_batch_sampler(dataset, batch_size, drop_last, **kwargs):
    """The Trainer's ``batch_sampler``: ST's ``DefaultBatchSampler`` over the rows in order (no
    shuffling), so that the Trainer's step ``s`` sees the groups of crossknn's step ``s``. A
    module-level function: the Trainer pickles its arguments into each checkpoint."""
    from sentence_transformers.base.sampler import DefaultBatchSampler
    from torch.utils.data import SequentialSampler

    return DefaultBatchSampler(SequentialSampler(dataset), batch_size, drop_last, **kwargs)


def worker_trainer(cfg: dict) -> None:
    """Train the [CLS] CE with sentence-transformers' ``CrossEncoderTrainer`` (HF ``Trainer``):
    ListNetLoss, AdamW with ``learning_rate_mapping`` for the head, linear warm-up/decay, clip 1.0,
    a checkpoint folder every ``save_steps``; ``resume`` (a checkpoint folder) resumes with
    ``resume_from_checkpoint``. Each step's exact loss (float32 repr) and duration go to
    ``losses.jsonl`` as they are computed, so a killed run leaves its losses."""
    import torch
    from sentence_transformers.cross_encoder import (
        CrossEncoderTrainer,
        CrossEncoderTrainingArguments,
    )
    from transformers import TrainerCallback

    a = argparse.Namespace(**cfg["args"])
    torch.set_num_threads(a.threads)
    here = Path(cfg["here"])
    ex, steps = step_groups(Path(cfg["slice"]), Path(cfg["top_n"]), a)
    data = trainer_dataset(ex, steps)
    torch.manual_seed(a.seed)  # the new head: the same start point as crossknn's (parity row)
    model = st_model(cfg["base"], "cls", a)
    loss_fn = _listnet(model, 1.0, cfg.get("mini_batch"))
    log = open(here / cfg.get("loss_log", "losses.jsonl"), "a", encoding="utf-8")  # noqa: SIM115

    class Recorder(CrossEncoderTrainer):
        def compute_loss(self, *args, **kwargs):
            out = super().compute_loss(*args, **kwargs)
            loss = out[0] if isinstance(out, tuple) else out
            self._last_loss = repr(float(loss.detach()))
            return out

    class StepTimes(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            rec = {"step": state.global_step, "loss": trainer._last_loss}
            rec["s"] = round(time.perf_counter() - self.t0, 4)
            log.write(json.dumps(rec) + "\n")
            log.flush()

    args = CrossEncoderTrainingArguments(
        output_dir=str(here / "out"),
        max_steps=a.steps,
        per_device_train_batch_size=a.batch_size,
        learning_rate=a.lr,
        learning_rate_mapping={r"classifier": a.head_lr},
        weight_decay=0.01,
        lr_scheduler_type="linear",
        warmup_steps=math.ceil(0.1 * a.steps),
        max_grad_norm=1.0,
        seed=a.seed,
        batch_sampler=in_order_batch_sampler,
        save_strategy="steps",
        save_steps=cfg["save_steps"],
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = Recorder(model=model, args=args, train_dataset=data, loss=loss_fn)
    trainer._last_loss = None
    trainer.add_callback(StepTimes())
    t0 = time.perf_counter()
    trainer.train(resume_from_checkpoint=cfg.get("resume"))
    train_s = time.perf_counter() - t0
    log.close()
    res = {"train_s": round(train_s, 2), "global_step": trainer.state.global_step}
    if cfg.get("export"):
        from crossknn.ce.export import export_cross_encoder

        model.eval()
        hf = here / "hf"
        model.model.save_pretrained(str(hf), safe_serialization=True)
        model.tokenizer.save_pretrained(str(hf))
        export_cross_encoder(
            hf, here / "model", kind="cls", max_length=a.max_length, activation="none",
            model_id="st-trainer-cls", overwrite=True,
        )  # fmt: skip
    (here / "result.json").write_text(json.dumps(res))


def worker_parity(cfg: dict) -> None:
    """Eval-mode checks (no dropout): the same start point and step-0 loss in ST and crossknn for
    [CLS]; for [EMB], an ST CrossEncoder with a custom module vs crossknn's joint CE."""
    import torch

    from crossknn.ce.models import default_cross_encoder
    from crossknn.train.losses import group_loss
    from crossknn.train.scorer import PairEncoder, TrainableCE

    a = argparse.Namespace(**cfg["args"])
    torch.set_num_threads(a.threads)
    ex, steps = step_groups(Path(cfg["slice"]), Path(cfg["top_n"]), a)
    base = Path(cfg["base"])
    enc = PairEncoder(base / "tokenizer.json", a.max_length, ex.query_texts, ex.item_texts)
    q_rows, g = steps[0]
    qi, ii = np.repeat(q_rows, g.shape[1]), g.ravel()
    out = {}
    for kind in ("cls", "emb"):
        torch.manual_seed(a.seed)
        cx = TrainableCE(base, kind, loss="listwise").eval()
        torch.manual_seed(a.seed)
        st = st_model(str(base), kind, a).eval()
        with torch.no_grad():
            scores = enc.score(cx, qi, ii, torch.device("cpu"), 4096)
            cx_loss = float(group_loss("listwise", cx.logits(scores).view(len(q_rows), -1)))
            inputs, labels = _batch(ex, q_rows, g)
            st_loss = float(_listnet(st, 1.0 if kind == "cls" else 20.0)(inputs, labels))
            pairs = [
                (ex.query_texts[int(q)], ex.item_texts[int(i)]) for q, i in zip(qi, ii, strict=True)
            ]
            st_scores = st.predict(pairs, batch_size=32, convert_to_numpy=True)
        row = {
            "step0_loss_crossknn": cx_loss,
            "step0_loss_st": st_loss,
            "step0_loss_abs_diff": abs(cx_loss - st_loss),
            "max_abs_score_diff_torch": float(np.abs(st_scores - scores.numpy()).max()),
            "pairs": len(pairs),
        }
        if kind == "cls":
            hx = cx.hf_model.classifier.weight
            row["same_start_head"] = bool(torch.equal(hx, st.model.classifier.weight))
        else:
            # the embedded [EMB] CE (ONNX), at the same pair length
            ce = default_cross_encoder(threads=a.threads, max_length=a.max_length)
            ref = np.asarray(ce.predict(pairs), dtype=np.float64)
            row["max_abs_score_diff_vs_embedded_onnx_ce"] = float(np.abs(st_scores - ref).max())
        out[kind] = row
    Path(cfg["out"]).write_text(json.dumps(out))


def worker_interleave(cfg: dict) -> None:
    """Seconds per step side by side in one process: a crossknn step (``train-ce``'s: length-sorted
    chunks, its AdamW groups, listwise loss) and an ST step (ListNetLoss, ST's default
    mini-batches and all pairs at once), taken in turn on the same groups, so that the load of a
    shared machine slows all alike. The median of each, after one warm-up step each."""
    import torch

    from crossknn.train.losses import group_loss
    from crossknn.train.scorer import PairEncoder, TrainableCE

    a = argparse.Namespace(**cfg["args"])
    torch.set_num_threads(a.threads)
    ex, steps = step_groups(Path(cfg["slice"]), Path(cfg["top_n"]), a)
    base = Path(cfg["base"])
    enc = PairEncoder(base / "tokenizer.json", a.max_length, ex.query_texts, ex.item_texts)
    torch.manual_seed(a.seed)
    cx = TrainableCE(base, "cls", loss="listwise").train()
    cx_opt = torch.optim.AdamW(cx.param_groups(a.lr, a.head_lr), lr=a.lr, weight_decay=0.01)
    torch.manual_seed(a.seed)
    st = st_model(str(base), "cls", a).train()
    st_losses = {
        "st": _listnet(st, 1.0, None),
        "st-mb": _listnet(st, 1.0, a.batch_size * a.group_size),
    }
    st_opt = torch.optim.AdamW(st_param_groups(st_losses["st"], a), lr=a.lr)
    cpu = torch.device("cpu")

    def cx_step(q_rows, g):
        qi, ii = np.repeat(q_rows, g.shape[1]), g.ravel()
        scores = enc.score(cx, qi, ii, cpu, 4096)
        loss = group_loss("listwise", cx.logits(scores.float()).view(len(q_rows), -1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(cx.parameters(), 1.0)
        cx_opt.step()
        cx_opt.zero_grad(set_to_none=True)

    def st_step(name):
        def step(q_rows, g):
            inputs, labels = _batch(ex, q_rows, g)
            st_losses[name](inputs, labels).backward()
            torch.nn.utils.clip_grad_norm_(st.parameters(), 1.0)
            st_opt.step()
            st_opt.zero_grad(set_to_none=True)

        return step

    fns = {"crossknn": cx_step, "st": st_step("st"), "st-mb": st_step("st-mb")}
    times = {k: [] for k in fns}
    for s in range(cfg["n"] + 1):
        q_rows, g = steps[s % len(steps)]
        names = list(fns)[s % 3 :] + list(fns)[: s % 3]  # rotate who goes first
        for name in names:
            t0 = time.perf_counter()
            fns[name](q_rows, g)
            if s:  # step 0 is the warm-up
                times[name].append(time.perf_counter() - t0)
    Path(cfg["out"]).write_text(json.dumps(times))


def st_row(
    a, slice_dir: Path, top_n: Path, root: Path, env: dict, status: dict, name: str, mini_batch
) -> dict:
    """One ST training run (``name``: its folder; ``mini_batch``: ListNetLoss' mini_batch_size,
    None = ST's default, the number of queries per step)."""
    from crossknn.ce.models import minilm_checkpoint_dir

    here = root / name
    here.mkdir(parents=True, exist_ok=True)
    cfg = {
        "args": vars(a), "root": str(root), "name": name, "mini_batch": mini_batch,
        "slice": str(slice_dir), "top_n": str(top_n), "base": str(minilm_checkpoint_dir()),
    }  # fmt: skip
    cfg_path = here / "cfg.json"
    cfg_path.write_text(json.dumps(cfg))
    cmd = [sys.executable, str(BENCH), "--worker", "st", str(cfg_path)]
    m = run_measured(cmd, env, log=root / f"{name}.log")
    res = json.loads((here / "result.json").read_text())
    # the plain-loop stand-in; the CrossEncoderTrainer itself runs with --st-trainer
    loop = "ST CrossEncoder + ListNetLoss in a plain torch loop"
    chunks = (
        "ST default: forwards of as many pairs as queries per step"
        if mini_batch is None
        else f"{mini_batch} pairs per forward"
    )
    return {
        "trainer": "sentence-transformers",
        "mode": f"{loop} (ListNetLoss mini_batch_size={mini_batch}: {chunks})",
        "kind": "cls",
        "command": f"python bench/trainer_compare.py --worker st {name}/cfg.json",
        "steps": res["steps"],
        "train_s": res["train_s"],
        "s_per_step": round(res["train_s"] / res["steps"], 3),
        **m,
        "checkpoint_mb": size_mb(here / "checkpoint"),
        "checkpoint_files": res["checkpoint_files"],
        "checkpoint_written_by": "this script, in Trainer._save_checkpoint's layout",
        "model_dir_mb": size_mb(here / "model"),
        "first_losses": [round(x, 4) for x in res["losses"][:3]],
        "last_loss": round(res["losses"][-1], 4),
        "_model": str(here / "model"),
    }


def read_losses(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def trainer_row(a, slice_dir: Path, top_n: Path, root: Path, env: dict) -> tuple[dict, dict]:
    """``CrossEncoderTrainer``: one uninterrupted run (a checkpoint every ``--kill-at`` steps), then
    the same run killed (SIGKILL) once step ``--kill-at`` + 1 has ended (so during the step after:
    between two checkpoints) and resumed with ``resume_from_checkpoint`` from checkpoint
    ``--kill-at``: the same final weights, exported ONNX bytes and per-step losses?"""
    import torch
    from safetensors.torch import load_file

    from crossknn.ce.models import minilm_checkpoint_dir

    def cfg_for(name: str, **extra) -> tuple[Path, list[str]]:
        here = root / name
        here.mkdir(parents=True, exist_ok=True)
        cfg = {
            "args": vars(a), "here": str(here), "slice": str(slice_dir), "top_n": str(top_n),
            "base": str(minilm_checkpoint_dir()), "save_steps": a.kill_at, "export": True, **extra,
        }  # fmt: skip
        path = here / f"cfg{'-resume' if 'resume' in extra else ''}.json"
        path.write_text(json.dumps(cfg))
        return here, [sys.executable, str(BENCH), "--worker", "trainer", str(path)]

    load0 = os.getloadavg()
    ref, cmd = cfg_for("st-trainer")
    m = run_measured(cmd, env, log=root / "st-trainer.log")
    load1 = os.getloadavg()
    res = json.loads((ref / "result.json").read_text())
    ref_log = read_losses(ref / "losses.jsonl")
    ck = ref / "out" / f"checkpoint-{a.kill_at}"
    row = {
        "trainer": "sentence-transformers CrossEncoderTrainer",
        "mode": "CrossEncoderTrainer (HF Trainer) + ListNetLoss (mini_batch_size=None), "
        "a datasets.Dataset of crossknn's step groups read in order (SequentialSampler)",
        "kind": "cls",
        "command": "python bench/trainer_compare.py --worker trainer st-trainer/cfg.json",
        "steps": res["global_step"],
        "train_s": res["train_s"],
        "s_per_step": round(res["train_s"] / res["global_step"], 3),
        "median_step_s": round(float(np.median([r["s"] for r in ref_log])), 3),
        **m,
        "load_average_before_after": [round(x, 2) for x in (*load0, *load1)],
        "checkpoint_mb": size_mb(ck),
        "checkpoint_files": sorted(p.name for p in ck.iterdir()),
        "checkpoints_kept": sorted(p.name for p in (ref / "out").iterdir()),
        "output_dir_mb": size_mb(ref / "out"),
        "first_losses": [round(float(r["loss"]), 4) for r in ref_log[:3]],
        "last_loss": round(float(ref_log[-1]["loss"]), 4),
        "_model": str(ref / "model"),
    }
    # killed after step kill_at + 1 ended (checkpoint kill_at is then complete), resumed
    run, cmd = cfg_for("st-trainer-resume")
    log = run / "losses.jsonl"

    def kill_when() -> bool:
        return any(r["step"] > a.kill_at for r in read_losses(log))

    first = run_measured(cmd, env, kill_when=kill_when, log=root / "st-trainer-kill.log")
    killed_log = read_losses(log)
    kept = sorted(p.name for p in (run / "out").iterdir())
    resume_from = run / "out" / f"checkpoint-{a.kill_at}"
    _, cmd_r = cfg_for(
        "st-trainer-resume", resume=str(resume_from), loss_log="losses-resumed.jsonl"
    )
    second = run_measured(cmd_r, env, log=root / "st-trainer-resumed.log")
    resumed_log = read_losses(run / "losses-resumed.jsonl")
    last = f"checkpoint-{a.steps}"
    w_ref = load_file(str(ref / "out" / last / "model.safetensors"))
    w_new = load_file(str(run / "out" / last / "model.safetensors"))
    same_w = set(w_ref) == set(w_new) and all(torch.equal(w_ref[k], w_new[k]) for k in w_ref)
    max_diff = max(float((w_ref[k].float() - w_new[k].float()).abs().max()) for k in w_ref)
    ref_losses = [r["loss"] for r in ref_log]
    new_losses = [r["loss"] for r in killed_log if r["step"] <= a.kill_at] + [
        r["loss"] for r in resumed_log
    ]
    first_diff = next(
        (i + 1 for i, (x, y) in enumerate(zip(ref_losses, new_losses, strict=False)) if x != y),
        None,
    )
    resume = {
        "command": "python bench/trainer_compare.py --worker trainer st-trainer-resume/cfg.json  "
        f"(SIGKILL after step {a.kill_at + 1} ended), then --worker trainer "
        f"st-trainer-resume/cfg-resume.json (resume_from_checkpoint=checkpoint-{a.kill_at})",
        "killed": first["killed"],
        "steps_logged_before_kill": [r["step"] for r in killed_log],
        "checkpoints_at_kill": kept,
        "resumed_from": f"checkpoint-{a.kill_at}",
        "resumed_steps": [r["step"] for r in resumed_log],
        "kill_wall_s": first["wall_s"],
        "resume_wall_s": second["wall_s"],
        "resume_peak_rss_mb": second["peak_rss_mb"],
        "same_weights": bool(same_w),
        "max_abs_weight_diff": max_diff,
        "same_model_safetensors_bytes": sha256(ref / "out" / last / "model.safetensors")
        == sha256(run / "out" / last / "model.safetensors"),
        "same_onnx_bytes": sha256(ref / "model" / "model.onnx")
        == sha256(run / "model" / "model.onnx"),
        "same_losses": ref_losses == new_losses,
        "first_step_with_different_loss": first_diff,
        "losses_uninterrupted": ref_losses,
        "losses_killed_then_resumed": new_losses,
    }
    resume["resume_bitwise"] = bool(
        resume["same_weights"] and resume["same_onnx_bytes"] and resume["same_losses"]
    )
    row["resume_bitwise"] = resume["resume_bitwise"]
    return row, resume


# ---------------------------------------------------------------- dev metric


def dev_metrics(slice_dir: Path, models: dict[str, Path], n_cand: int, threads: int) -> dict:
    """Each model reranks the dev queries' DE top-``n_cand`` of the slice: nDCG@10 / RR@10."""
    from crossknn.ce import OnnxCrossEncoder
    from crossknn.ce.models import default_dual_encoder
    from crossknn.data import load_beir
    from crossknn.train.negatives import de_top_n, item_vectors
    from crossknn.trec import run_metrics

    beir = load_beir(slice_dir)
    qrels = beir.qrels["test"]
    qids = [q for q in beir.query_ids if q in qrels]
    qtexts = beir.queries_in_order(qids)
    de = default_dual_encoder(threads=threads)
    top = de_top_n(de, qtexts, item_vectors(de, beir.item_texts), n_cand)
    out = {}
    de_run = {
        q: {beir.item_ids[i]: float(-r) for r, i in enumerate(row)}
        for q, row in zip(qids, top, strict=True)
    }
    out["DE order"] = run_metrics(de_run, qrels)
    for name, path in models.items():
        ce = OnnxCrossEncoder(path, items=beir.item_texts, threads=threads)
        scores = ce.score_batch(qtexts, [list(map(int, row)) for row in top])
        run = {
            q: {beir.item_ids[int(i)]: float(s) for i, s in zip(row, sc, strict=True)}
            for q, row, sc in zip(qids, top, scores, strict=True)
        }
        out[name] = run_metrics(run, qrels)
    return out


# ---------------------------------------------------------------- main


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--data",
        help="the SciFact BEIR folder (default $CROSSKNN_DATA/scifact or ../shared/data/scifact)",
    )
    ap.add_argument("--work", help="scratch folder (default: a temporary one, removed)")
    ap.add_argument("--out", default=str(RESULTS / "trainer_compare.json"))
    ap.add_argument(
        "--quick", action="store_true", help="a smoke run: tiny slice, 2 steps, no resume test"
    )
    ap.add_argument("--train-queries", type=int, default=120)
    ap.add_argument("--dev-queries", type=int, default=60)
    ap.add_argument("--items", type=int, default=1000, help="items in the slice's corpus")
    ap.add_argument("--dev-candidates", type=int, default=30)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=4, help="queries per step")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--negatives", type=int, default=30)
    ap.add_argument("--random-negatives", type=int, default=2)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--head-lr", type=float, default=1e-3)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint-every", type=int, default=10, help="of the killed crossknn run")
    ap.add_argument(
        "--kill-at", type=int, default=20, help="kill after the checkpoint of this step"
    )
    ap.add_argument("--kill-delay", type=float, default=1.0, help="seconds after that checkpoint")
    ap.add_argument("--no-resume-test", action="store_true")
    ap.add_argument(
        "--st-trainer",
        action="store_true",
        help="run crossknn train-ce vs CrossEncoderTrainer (needs accelerate, datasets) and its "
        "kill-and-resume test; merged into --out as 'crossknn_vs_st_trainer'",
    )
    ap.add_argument(
        "--alternate",
        type=int,
        default=0,
        help="with --st-trainer: only N pairs of crossknn / Trainer runs in turn (timing), "
        "merged into crossknn_vs_st_trainer.alternating",
    )
    ap.add_argument(
        "--interleave-steps",
        type=int,
        default=8,
        help="steps of each trainer timed in turn in one process (0: none)",
    )
    ap.add_argument("--worker", nargs=2, metavar=("KIND", "CFG"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.quick:
        a.train_queries, a.dev_queries, a.items, a.dev_candidates = 8, 4, 60, 10
        a.steps, a.batch_size, a.group_size, a.negatives, a.random_negatives = 2, 2, 4, 10, 1
        a.max_length, a.no_resume_test, a.interleave_steps = 48, True, 1
        a.kill_at = a.checkpoint_every = 1
        if a.out == str(RESULTS / "trainer_compare.json"):
            a.out = None
    return a


def main(argv=None) -> int:
    a = parse(argv)
    if a.worker:
        cfg = json.loads(Path(a.worker[1]).read_text())
        {
            "st": worker_st,
            "trainer": worker_trainer,
            "parity": worker_parity,
            "interleave": worker_interleave,
        }[a.worker[0]](cfg)
        return 0
    src = find_data(a.data)
    if not (src / "corpus.jsonl").is_file():
        print(
            f"SciFact not found at {src} (a BEIR folder: corpus.jsonl, queries.jsonl, "
            "qrels/); pass --data or set CROSSKNN_DATA"
        )
        return 2
    status = st_status()
    if status["sentence-transformers"] is None:
        print("sentence-transformers is not installed: nothing to compare against")
        return 2
    tmp = None
    if a.work:
        root = Path(a.work)
        if root.exists() and any(root.iterdir()):
            print(f"--work {root} exists and is not empty: pass a new or empty folder")
            return 2
    else:
        tmp = tempfile.mkdtemp(prefix="trainer-compare-")
        root = Path(tmp)
    root.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "TOKENIZERS_PARALLELISM": "false"}
    try:
        slice_dir = root / "slice"
        stats = build_slice(src, slice_dir, a.train_queries, a.dev_queries, a.items, a.seed)
        print(
            f"slice: {stats}; ST trainer builds: {status['trainer_builds']} "
            f"({status['trainer_error']})"
        )
        if a.st_trainer:
            if not status["trainer_builds"]:
                print(f"CrossEncoderTrainer cannot be built: {status['trainer_error']}")
                return 2
            if a.alternate:
                alt = run_alternating(a, slice_dir, root, env)
                alt["command"] = "python bench/trainer_compare.py " + " ".join(
                    sys.argv[1:] if argv is None else argv
                )
                alt["machine"] = machine("torch", "transformers", "sentence-transformers")
                print(json.dumps(alt, indent=1))
                if a.out:
                    old = json.loads(Path(a.out).read_text())
                    old.setdefault("crossknn_vs_st_trainer", {})["alternating"] = alt
                    write_json(a.out, old)
                return 0
            block = run_st_trainer(a, slice_dir, stats, status, root, env)
            block["command"] = "python bench/trainer_compare.py " + " ".join(
                sys.argv[1:] if argv is None else argv
            )
            block["machine"] = machine(
                "torch", "transformers", "sentence-transformers", "accelerate", "datasets"
            )
            print_table({**block, "parity": {}})
            if a.out:
                old = json.loads(Path(a.out).read_text()) if Path(a.out).is_file() else {}
                write_json(a.out, {**old, "crossknn_vs_st_trainer": block})
            return 0
        cx, cx_out, cx_work = crossknn_row(a, slice_dir, root, env)
        print(f"crossknn: {cx['s_per_step']} s/step, peak RSS {cx['peak_rss_mb']} MiB")
        top_n = cx_work / "de_top_n.npy"
        # ST's default (forwards of batch-size pairs); all pairs at once: timed side by side
        sts = [st_row(a, slice_dir, top_n, root, env, status, "st", None)]
        print(
            f"{sts[0]['mode']}: {sts[0]['s_per_step']} s/step, peak RSS {sts[0]['peak_rss_mb']} MiB"
        )
        pcfg = root / "parity.json"
        pcfg.write_text(
            json.dumps(
                {
                    **json.loads((root / "st" / "cfg.json").read_text()),
                    "out": str(root / "parity-out.json"),
                }
            )
        )
        run_measured(
            [sys.executable, str(BENCH), "--worker", "parity", str(pcfg)],
            env,
            log=root / "parity.log",
        )
        parity = json.loads((root / "parity-out.json").read_text())
        side = None
        if a.interleave_steps:
            icfg = root / "interleave.json"
            base_cfg = json.loads((root / "st" / "cfg.json").read_text())
            out = root / "interleave-out.json"
            icfg.write_text(json.dumps({**base_cfg, "out": str(out), "n": a.interleave_steps}))
            cmd = [sys.executable, str(BENCH), "--worker", "interleave", str(icfg)]
            run_measured(cmd, env, log=root / "interleave.log")
            t = json.loads(out.read_text())
            med = {k: float(np.median(v)) for k, v in t.items()}
            side = {
                "command": "python bench/trainer_compare.py --worker interleave CFG",
                "steps_each": a.interleave_steps,
                "median_s_per_step": {k: round(v, 3) for k, v in med.items()},
                "ratio_to_crossknn": {k: round(v / med["crossknn"], 2) for k, v in med.items()},
                "all_s": {k: [round(x, 3) for x in v] for k, v in t.items()},
            }
            print(f"side by side, median s/step: {side['median_s_per_step']}")
        resume = None
        if not a.no_resume_test:
            resume = crossknn_resume(a, slice_dir, root, env, cx_out, cx_work)
            resume["resume_bitwise"] = bool(
                resume["same_onnx_bytes"] and resume["same_weights"] and resume["same_losses"]
            )
            print(f"crossknn resume: {resume}")
        cx["resume_bitwise"] = None if resume is None else resume["resume_bitwise"]
        models = {"crossknn": cx_out}
        for n, st in enumerate(sts):
            st["resume_bitwise"] = None  # resume_from_checkpoint needs the Trainer
            st["resume_note"] = "not measured: the Trainer's resume_from_checkpoint needs the " + (
                "Trainer, not built here: " + status["trainer_error"]
                if not status["trainer_builds"]
                else "Trainer: see --st-trainer (crossknn_vs_st_trainer.st_trainer_resume)"
            )
            models[f"st{n}"] = Path(st.pop("_model"))
        dev = dev_metrics(slice_dir, models, a.dev_candidates, a.threads)
        for name, row in zip(models, [cx, *sts], strict=True):
            row.update({"dev_ndcg@10": dev[name]["nDCG@10"], "dev_rr@10": dev[name]["RR@10"]})
        result = {
            "created": utc_now(),
            "command": "python bench/trainer_compare.py "
            + " ".join(sys.argv[1:] if argv is None else argv),
            "machine": machine(
                "torch", "transformers", "sentence-transformers", "accelerate", "datasets"
            ),
            "settings": {k: v for k, v in vars(a).items() if k not in ("worker", "work", "out")},
            "slice": stats,
            "st_status": status,
            "dev_de_order": dev["DE order"],
            "rows": [cx, *sts],
            "crossknn_resume": resume,
            "parity": parity,
            "side_by_side_s_per_step": side,
        }
        print_table(result)
        if a.out:
            write_json(a.out, result)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


def run_st_trainer(a, slice_dir: Path, stats: dict, status: dict, root: Path, env: dict) -> dict:
    """``--st-trainer``: ``crossknn train-ce`` and ``CrossEncoderTrainer`` one after the other on
    the same slice, steps and groups, then the Trainer's kill-and-resume test; dev metrics of
    both. Returns the ``crossknn_vs_st_trainer`` block of the JSON."""
    load0 = os.getloadavg()
    cx, cx_out, cx_work = crossknn_row(a, slice_dir, root, env)
    cx["load_average_before_after"] = [round(x, 2) for x in (*load0, *os.getloadavg())]
    cx["resume_bitwise"] = None  # measured by the default (40-step) run: crossknn_resume
    print(f"crossknn: {cx['s_per_step']} s/step, peak RSS {cx['peak_rss_mb']} MiB")
    tr, resume = trainer_row(a, slice_dir, cx_work / "de_top_n.npy", root, env)
    print(f"CrossEncoderTrainer: {tr['s_per_step']} s/step, peak RSS {tr['peak_rss_mb']} MiB")
    short = {k: v for k, v in resume.items() if not k.startswith("losses_")}
    print(f"CrossEncoderTrainer resume: {short}")
    dev = dev_metrics(
        slice_dir, {"crossknn": cx_out, "trainer": Path(tr.pop("_model"))}, a.dev_candidates,
        a.threads,
    )  # fmt: skip
    for name, row in (("crossknn", cx), ("trainer", tr)):
        row.update({"dev_ndcg@10": dev[name]["nDCG@10"], "dev_rr@10": dev[name]["RR@10"]})
    return {
        "created": utc_now(),
        "what": "crossknn train-ce and sentence-transformers' CrossEncoderTrainer, run one after "
        "the other (not side by side: the Trainer's loop cannot be stepped in turn with another), "
        "the same slice, groups in the same order, steps, lr, batch and listwise loss",
        "settings": {k: v for k, v in vars(a).items() if k not in ("worker", "work", "out")},
        "slice": stats,
        "st_status": status,
        "dev_de_order": dev["DE order"],
        "rows": [cx, tr],
        "st_trainer_resume": resume,
    }


def run_alternating(a, slice_dir: Path, root: Path, env: dict) -> dict:
    """``--alternate N``: N pairs of runs, ``crossknn train-ce`` then ``CrossEncoderTrainer``, in
    turn (each with one checkpoint, at its last step, and no export), so that a shared machine's
    load falls on both alike; seconds per step of each run and the load average around it."""
    from crossknn.ce.models import minilm_checkpoint_dir

    runs = []
    top_n = None
    for n in range(a.alternate):
        (root / f"alt{n}").mkdir()
        load0 = os.getloadavg()
        cx, _, cx_work = crossknn_row(a, slice_dir, root / f"alt{n}", env)
        top_n = top_n or cx_work / "de_top_n.npy"
        runs.append(
            {
                "trainer": "crossknn train-ce",
                "s_per_step": cx["s_per_step"],
                "load_average_before_after": [round(x, 2) for x in (*load0, *os.getloadavg())],
            }
        )
        here = root / f"alt{n}" / "st-trainer"
        here.mkdir(parents=True)
        cfg = {
            "args": vars(a), "here": str(here), "slice": str(slice_dir), "top_n": str(top_n),
            "base": str(minilm_checkpoint_dir()), "save_steps": a.steps, "export": False,
        }  # fmt: skip
        (here / "cfg.json").write_text(json.dumps(cfg))
        load0 = os.getloadavg()
        cmd = [sys.executable, str(BENCH), "--worker", "trainer", str(here / "cfg.json")]
        run_measured(cmd, env, log=here / "run.log")
        res = json.loads((here / "result.json").read_text())
        steps = read_losses(here / "losses.jsonl")
        runs.append(
            {
                "trainer": "sentence-transformers CrossEncoderTrainer",
                "s_per_step": round(res["train_s"] / res["global_step"], 3),
                "median_step_s": round(float(np.median([r["s"] for r in steps])), 3),
                "load_average_before_after": [round(x, 2) for x in (*load0, *os.getloadavg())],
            }
        )
        print(f"pair {n}: {runs[-2]['s_per_step']} vs {runs[-1]['s_per_step']} s/step")
    mean = {
        t: round(float(np.mean([r["s_per_step"] for r in runs if r["trainer"] == t])), 3)
        for t in ("crossknn train-ce", "sentence-transformers CrossEncoderTrainer")
    }
    return {
        "what": "runs in turn: crossknn train-ce, CrossEncoderTrainer, crossknn train-ce, ...; "
        "s_per_step = training seconds / steps, one checkpoint (the last step) each",
        "runs": runs,
        "mean_s_per_step": mean,
        "ratio_trainer_to_crossknn": round(
            mean["sentence-transformers CrossEncoderTrainer"] / mean["crossknn train-ce"], 2
        ),
    }


def print_table(r: dict) -> None:
    cols = [
        "trainer",
        "s_per_step",
        "wall_s",
        "peak_rss_mb",
        "dev_ndcg@10",
        "dev_rr@10",
        "checkpoint_mb",
        "resume_bitwise",
    ]
    print(" | ".join(cols))
    for row in r["rows"]:
        print(
            " | ".join(str(round(row[c], 4) if isinstance(row[c], float) else row[c]) for c in cols)
        )
    d = r["dev_de_order"]
    print(f"DE order of the same candidates: nDCG@10 {d['nDCG@10']:.4f} RR@10 {d['RR@10']:.4f}")
    for kind, p in r["parity"].items():
        print(f"parity {kind}: {p}")


if __name__ == "__main__":
    sys.exit(main())
