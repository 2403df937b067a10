"""The training losses over groups of scores (one row per query: positive first, then negatives).

- ``bce``: pointwise binary cross-entropy, label 1 for the positive and 0 for each negative.
- ``listwise``: softmax cross-entropy over the group, the positive as the target.
- ``distill``: KL divergence from the teacher's softmax over the group to the student's; the
  teacher's scores are standardized per group first (mean 0, std 1), so the loss does not
  depend on the teacher's score scale.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["LOSSES", "group_loss"]

LOSSES = ("bce", "listwise", "distill")


def group_loss(name: str, logits: torch.Tensor, teacher: torch.Tensor | None = None):
    """The mean loss of ``logits`` (queries x group)."""
    if name == "bce":
        target = torch.zeros_like(logits)
        target[:, 0] = 1.0
        return F.binary_cross_entropy_with_logits(logits, target)
    if name == "listwise":
        target = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
        return F.cross_entropy(logits, target)
    if name == "distill":
        if teacher is None:
            raise ValueError("the distill loss needs teacher scores")
        t = teacher.to(logits.dtype)
        t = (t - t.mean(1, keepdim=True)) / t.std(1, keepdim=True).clamp(min=1e-6)
        return F.kl_div(
            F.log_softmax(logits, 1), F.log_softmax(t, 1), log_target=True, reduction="batchmean"
        )
    raise ValueError(f"loss must be one of {LOSSES}; got {name!r}")
