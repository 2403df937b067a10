"""Training CMC on frozen dual-encoder vectors, with checkpoints and exact resume.

Loss (paper eq. 5), per query over its K candidates:
``lambda_ce * CE(y, p) + lambda_kl * KL(p || r)``, ``p = softmax(CMC scores)``,
``r = softmax(DE scores / retriever_temperature)`` and the target ``y``:

- ``ce`` (distillation, crossknn's default): ``softmax(z / target_temperature)`` where ``z`` are
  the CE scores of the candidates standardized per query (mean 0, std 1 over the K candidates);
- ``gold``: uniform over the relevant candidates (qrels); a relevant item is put in every set.

Determinism: the epoch's query order and every query's candidate sample are drawn from
``numpy.random.default_rng([seed, epoch, ...])``; dropout uses torch's generator, whose state is
saved in the checkpoint. An interrupted run resumed from its checkpoint therefore ends with the
same weights as an uninterrupted one.

Files in ``out_dir``: ``checkpoint.pt`` (latest training state: model, optimizer, position,
torch RNG; ``torch.save`` of tensors and plain values, loaded with ``weights_only=True``),
``model.pt`` (final state dict), ``cmc.json`` (model config, encoder id, training config and
summary). No pickle of Python objects.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from crossknn.cmc.data import CmcData, sample_candidates
from crossknn.cmc.model import CmcConfig, CmcModel
from crossknn.cmc.runtime import FORMAT, read_info

__all__ = ["FORMAT", "TrainConfig", "load_model", "read_info", "train"]


@dataclass
class TrainConfig:
    k: int = 64  # candidates per training query (fixed K)
    top_fraction: float = 0.5  # share of the K that are the first stage's top items
    pool: int = 1024  # the rest are sampled from the DE's top `pool`
    sample_temperature: float = 0.05  # softmax temperature of the negative sampling (DE cosines)
    retriever_temperature: float = 0.05  # r = softmax(DE / t) in the KL term
    target_temperature: float = 0.3  # y = softmax(z / t), z = standardized CE scores
    lambda_ce: float = 0.9
    lambda_kl: float = 0.1
    epochs: int = 20
    batch_size: int = 8
    lr: float = 3e-4
    weight_decay: float = 0.01
    warmup: float = 0.1  # fraction of steps with linear warm-up, then linear decay
    seed: int = 0
    checkpoint_every: int = 50  # steps

    def __post_init__(self) -> None:
        if self.k < 1 or self.batch_size < 1 or self.epochs < 1 or self.checkpoint_every < 1:
            raise ValueError("k, batch_size, epochs and checkpoint_every must be >= 1")
        if not 0.0 <= self.top_fraction <= 1.0:
            raise ValueError(f"top_fraction must be in [0, 1]; got {self.top_fraction}")
        if self.lambda_ce < 0 or self.lambda_kl < 0 or self.lambda_ce + self.lambda_kl == 0:
            raise ValueError("lambda_ce and lambda_kl must be >= 0 and not both 0")


def _lr_factor(step: int, total: int, warmup: float) -> float:
    w = max(1, int(round(warmup * total)))
    if step < w:
        return (step + 1) / w
    return max(0.0, (total - step) / max(1, total - w))


def _batch(data: CmcData, rows: np.ndarray, cfg: TrainConfig, epoch: int):
    """Candidates, targets and retriever distribution for a batch of query rows."""
    n_top = int(round(cfg.top_fraction * cfg.k))
    de = data.de_scores(rows)
    cands, ys, rs = [], [], []
    for row, s in zip(rows.tolist(), de, strict=True):
        rng = np.random.default_rng([cfg.seed, epoch, row])
        must = None
        if data.target == "gold":
            must = np.fromiter(data.relevant.get(row, {}), np.int64)
        c = sample_candidates(
            s,
            cfg.k,
            n_top=n_top,
            pool=cfg.pool,
            rng=rng,
            temperature=cfg.sample_temperature,
            must=must,
        )
        if data.target == "ce":
            t = data.scores[row, c].astype(np.float64)
            z = (t - t.mean()) / max(t.std(), 1e-6) / cfg.target_temperature
            y = np.exp(z - z.max())
        else:
            y = np.isin(c, must).astype(np.float64)
        cands.append(c)
        ys.append(y / y.sum())
        rs.append(s[c])
    c = np.stack(cands)
    return (
        torch.from_numpy(data.query_vectors[rows]),
        torch.from_numpy(data.item_vectors[c]),
        torch.tensor(np.stack(ys), dtype=torch.float32),
        torch.log_softmax(torch.tensor(np.stack(rs)) / cfg.retriever_temperature, dim=-1),
    )


def _loss(model: CmcModel, batch, cfg: TrainConfig) -> torch.Tensor:
    q, c, y, log_r = batch
    log_p = torch.log_softmax(model(q, c), dim=-1)
    ce = -(y * log_p).sum(-1)
    kl = (log_p.exp() * (log_p - log_r)).sum(-1)
    return (cfg.lambda_ce * ce + cfg.lambda_kl * kl).mean()


def _save_atomic(obj, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    tmp.replace(path)


def load_model(model_dir) -> tuple[CmcModel, dict]:
    """The trained PyTorch model (eval mode) and its ``cmc.json``."""
    info = read_info(model_dir)
    model = CmcModel(CmcConfig(**info["model"]))
    sd = torch.load(Path(model_dir) / "model.pt", map_location="cpu", weights_only=True)
    model.load_state_dict(sd)
    return model.eval(), info


def _check_resume(ck: dict, meta: dict, path: Path) -> None:
    old = json.loads(ck["meta_json"])
    if old["encoder_id"] != meta["encoder_id"] or old["model"]["dim"] != meta["model"]["dim"]:
        raise ValueError(
            f"{path} was trained on vectors of encoder {old['encoder_id']!r} "
            f"(dim {old['model']['dim']}); these vectors come from {meta['encoder_id']!r} "
            f"(dim {meta['model']['dim']}). Use another --out directory or --no-resume."
        )
    for key in ("model", "train", "data"):
        if old[key] != meta[key]:
            raise ValueError(
                f"{path} was written with another {key} configuration "
                f"({old[key]} vs {meta[key]}); use another --out or --no-resume"
            )


def train(
    data: CmcData,
    out_dir,
    *,
    model_cfg: CmcConfig | None = None,
    cfg: TrainConfig | None = None,
    resume: bool = True,
    progress: bool = True,
    stop_after: int | None = None,
    threads: int | None = None,
) -> dict:
    """Trains CMC on ``data.train`` rows and writes ``out_dir`` (see the module doc).

    ``resume``: continue from ``out_dir/checkpoint.pt`` when it exists (its encoder, model and
    training configuration must match). ``stop_after``: stop (with a checkpoint) after this many
    steps in total, as an interruption would. ``threads``: torch threads while training (restored
    afterwards). Returns the ``cmc.json`` content (``"finished": False`` when stopped early).
    """
    prev = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return _train(
            data,
            out_dir,
            model_cfg=model_cfg,
            cfg=cfg,
            resume=resume,
            progress=progress,
            stop_after=stop_after,
        )
    finally:
        torch.set_num_threads(prev)


def _train(
    data: CmcData,
    out_dir,
    *,
    model_cfg: CmcConfig | None,
    cfg: TrainConfig | None,
    resume: bool,
    progress: bool,
    stop_after: int | None,
) -> dict:
    cfg = cfg or TrainConfig()
    model_cfg = model_cfg or CmcConfig(dim=data.dim, width=min(128, data.dim))
    if model_cfg.dim != data.dim:
        raise ValueError(f"model dim {model_cfg.dim} does not match the vectors' dim {data.dim}")
    if cfg.k > data.n_items:
        raise ValueError(
            f"K={cfg.k} training candidates but the corpus has only {data.n_items} items"
        )
    rows_all = np.asarray(data.train, np.int64)
    if data.target == "gold":
        rows_all = rows_all[[r in data.relevant for r in rows_all.tolist()]]
    if rows_all.size == 0:
        raise ValueError("no training queries (with a target)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "format": FORMAT,
        "encoder_id": data.encoder_id,
        "model": model_cfg.to_dict(),
        "train": asdict(cfg),
        "data": {
            "name": data.name,
            "target": data.target,
            "n_items": data.n_items,
            "n_train_queries": int(rows_all.size),
        },
    }
    torch.manual_seed(cfg.seed)
    model = CmcModel(model_cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    per_epoch = math.ceil(rows_all.size / cfg.batch_size)
    total = per_epoch * cfg.epochs
    step, seconds, losses = 0, 0.0, []
    ck_path = out / "checkpoint.pt"
    if resume and ck_path.is_file():
        ck = torch.load(ck_path, map_location="cpu", weights_only=True)
        _check_resume(ck, meta, ck_path)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optim"])
        step, seconds = int(ck["step"]), float(ck["seconds"])
        losses = [float(x) for x in ck["losses"].tolist()]
        torch.set_rng_state(ck["torch_rng"])

    def save_checkpoint() -> None:
        _save_atomic(
            {
                "model": model.state_dict(),
                "optim": opt.state_dict(),
                "step": step,
                "seconds": seconds + time.perf_counter() - t0,
                "losses": torch.tensor(losses, dtype=torch.float64),
                "torch_rng": torch.get_rng_state(),
                "meta_json": json.dumps(meta),
            },
            ck_path,
        )

    model.train()
    t0 = time.perf_counter()
    bar = tqdm(total=total, initial=step, desc="cmc train", unit="step", disable=not progress)
    stopped = False
    while step < total:
        epoch, b = divmod(step, per_epoch)
        order = np.random.default_rng([cfg.seed, epoch, 1 << 30]).permutation(rows_all)
        rows = order[b * cfg.batch_size : (b + 1) * cfg.batch_size]
        for g in opt.param_groups:
            g["lr"] = cfg.lr * _lr_factor(step, total, cfg.warmup)
        loss = _loss(model, _batch(data, rows, cfg, epoch), cfg)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        step += 1
        bar.update(1)
        if step % per_epoch == 0:
            bar.set_postfix(epoch=epoch + 1, loss=f"{np.mean(losses[-per_epoch:]):.4f}")
        if step % cfg.checkpoint_every == 0 or step == total:
            save_checkpoint()
        if stop_after is not None and step >= stop_after and step < total:
            save_checkpoint()
            stopped = True
            break
    bar.close()
    seconds += time.perf_counter() - t0
    info = dict(
        meta,
        finished=not stopped,
        steps=step,
        train_seconds=round(seconds, 2),
        final_epoch_loss=float(np.mean(losses[-per_epoch:])) if losses else None,
    )
    if stopped:
        return info
    model.eval()
    _save_atomic(model.state_dict(), out / "model.pt")
    (out / "cmc.json").write_text(json.dumps(info, indent=1))
    return info
