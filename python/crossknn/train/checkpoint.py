"""Training checkpoints: one file, written atomically (a SIGKILL leaves the previous one).

A checkpoint holds everything the next step depends on: the model and optimizer states, the
scheduler, torch's RNG state (dropout), the step, the loss log, the dev curve and the early-stopping
state; the data order and the negatives of a step are functions of (seed, step). ``config`` is the
fingerprint of the settings that shape training: resuming with other settings is refused.
"""

from __future__ import annotations

import io
from pathlib import Path

import torch

from crossknn.fileio import atomic_write_bytes

__all__ = ["save_checkpoint", "load_checkpoint", "save_state", "load_state"]

CHECKPOINT = "checkpoint.pt"


def save_state(path: Path, obj) -> None:
    buf = io.BytesIO()
    torch.save(obj, buf)
    atomic_write_bytes(path, buf.getvalue())


def load_state(path: Path):
    return torch.load(path, map_location="cpu", weights_only=False)


def save_checkpoint(folder: Path, *, model, optimizer, scheduler, step: int, state: dict) -> None:
    save_state(
        folder / CHECKPOINT,
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "step": int(step),
            **state,
        },
    )


def load_checkpoint(folder: Path, *, model, optimizer, scheduler, config: str) -> dict | None:
    """Restore the last checkpoint into the objects; returns its extra state (None: none yet)."""
    path = folder / CHECKPOINT
    if not path.is_file():
        return None
    ck = load_state(path)
    if ck.get("config") != config:
        raise ValueError(
            f"{path} was written with other training settings; resume with the same arguments "
            "or start in an empty folder"
        )
    model.load_state_dict(ck["model"])
    optimizer.load_state_dict(ck["optimizer"])
    scheduler.load_state_dict(ck["scheduler"])
    torch.set_rng_state(ck["torch_rng"])
    if ck.get("cuda_rng") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(ck["cuda_rng"])
    return ck
