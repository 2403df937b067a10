"""The settings of one training run (``crossknn train-ce`` arguments) and their checks."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from crossknn.fileio import fingerprint
from crossknn.train.losses import LOSSES
from crossknn.train.scorer import KINDS

__all__ = ["TrainConfig"]

# settings that do not change what is trained: resuming may change them
_FREE = ("threads", "checkpoint_every", "max_minutes", "int8")


@dataclass
class TrainConfig:
    kind: str = "emb"  # "cls" (linear head on [CLS]) or "emb" (joint [EMB] dot product)
    loss: str = "listwise"  # "bce", "listwise" or "distill"
    split: str = "train"  # the qrels split trained on (BEIR)
    negatives: int = 30  # N: hard negatives are the DE top-N minus the positives
    negatives_skip: int = 0  # ...from DE rank M+1 on (unlabelled positives sit at the top)
    group_size: int = 8  # pairs per query and step: 1 positive + negatives
    random_negatives: int = 2  # of the negatives in a group, random corpus items (rest: hard)
    max_steps: int | None = None  # optimizer steps (default: epochs over the train queries)
    epochs: float = 1.0
    batch_size: int = 4  # queries per forward/backward (micro-batch)
    grad_accum: int = 1  # micro-batches per optimizer step
    lr: float = 2e-5
    head_lr: float = 1e-3  # the [CLS] kind's fresh classifier head
    warmup: float = 0.1  # fraction of the steps with a linearly rising learning rate
    weight_decay: float = 0.01
    max_length: int = 128
    max_tokens: int = 4096  # padded tokens per forward chunk (length-sorted)
    dev_fraction: float = 0.1
    dev_queries: int = 100  # at most this many dev queries
    eval_every: int = 50  # steps between dev evaluations
    patience: int = 5  # dev evaluations without improvement before stopping early
    seed: int = 0
    checkpoint_every: int = 50
    max_minutes: float | None = None  # training time budget (stops, then selects the best)
    threads: int | None = None
    int8: bool = False
    bf16: bool = False  # mixed precision: forward/backward under bfloat16 autocast (weights fp32)

    def check(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}; got {self.kind!r}")
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}; got {self.loss!r}")
        for name in (
            "negatives",
            "group_size",
            "batch_size",
            "grad_accum",
            "eval_every",
            "patience",
            "checkpoint_every",
            "max_tokens",
            "dev_queries",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1; got {value!r}")
        if isinstance(self.negatives_skip, bool) or not isinstance(self.negatives_skip, int):
            raise ValueError(f"negatives_skip must be an integer; got {self.negatives_skip!r}")
        if not 0 <= self.negatives_skip < self.negatives:
            raise ValueError(
                f"negatives_skip must be in [0, negatives={self.negatives}); "
                f"got {self.negatives_skip}"
            )
        if self.group_size < 2:
            raise ValueError(
                f"group_size must be >= 2 (a positive and a negative); got {self.group_size}"
            )
        if not 0 <= self.random_negatives <= self.group_size - 1:
            raise ValueError(
                f"random_negatives must be in [0, group_size - 1]; got {self.random_negatives}"
            )
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1; got {self.max_steps}")
        if not self.epochs > 0:
            raise ValueError(f"epochs must be > 0; got {self.epochs}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0; got {self.lr}")
        if not self.head_lr > 0:
            raise ValueError(f"head_lr must be > 0; got {self.head_lr}")
        if not 0 <= self.warmup < 1:
            raise ValueError(f"warmup must be in [0, 1); got {self.warmup}")

    def fingerprint(self, **extra) -> str:
        """What a checkpoint must match to be resumed."""
        d = {k: v for k, v in asdict(self).items() if k not in _FREE}
        return fingerprint({**d, **extra})

    def as_dict(self) -> dict:
        return asdict(self)
