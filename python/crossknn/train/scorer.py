"""The CE being trained: a :mod:`crossknn.ce.graphs` wrapper plus the pair inputs it takes.

``kind="cls"``: :class:`~crossknn.ce.graphs.ClsCE` over a sequence classifier with one label (a
linear head on [CLS]); the score is its raw logit. ``kind="emb"``: :class:`~crossknn.ce.graphs.
JointCE` (the [EMB]-CE, the embedded CE's definition): the dot product of the L2-normalized mean
query-segment and item-segment embeddings of one joint pass. The losses see ``scale * score``
for [EMB] (a cosine lies in [-1, 1]); BCE also adds a learned offset (not exported: it does not
change any ranking). Pairs are built with the runtime's own code (:mod:`crossknn.ce.tokenize`),
so training, the exported ONNX model and the runtime see the same token ids.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from crossknn.ce import graphs
from crossknn.ce.export import require_checkpoint
from crossknn.ce.tokenize import IdStore, TokenizerPlan, assemble_pairs, longest_first

__all__ = ["KINDS", "EMB_SCALE", "TrainableCE", "PairEncoder", "check_base"]

KINDS = ("cls", "emb")
EMB_SCALE = 20.0
# encoder families whose bidirectional hidden states the [CLS] head and [EMB] pooling assume
_DECODER_HINTS = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


def check_base(base: Path) -> dict:
    """The base checkpoint's config; clear errors for missing weights or a decoder model."""
    require_checkpoint(base)
    config = json.loads((base / "config.json").read_text(encoding="utf-8"))
    archs = config.get("architectures") or []
    if (
        config.get("is_decoder")
        or config.get("is_encoder_decoder")
        or any(a.endswith(_DECODER_HINTS) for a in archs)
    ):
        raise ValueError(
            f"{base}: unsupported architecture {archs or config.get('model_type')!r}: "
            "train-ce needs a bidirectional encoder (BERT-like)"
        )
    return config


class TrainableCE(torch.nn.Module):
    """A graphs wrapper (exported as is) and the loss-side scale and offset."""

    def __init__(self, base: Path, kind: str, *, loss: str) -> None:
        super().__init__()

        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}; got {kind!r}")
        self.kind = kind
        try:
            if kind == "cls":
                # transformers: optional (export extra), slow to import
                from transformers import AutoModelForSequenceClassification

                hf = AutoModelForSequenceClassification.from_pretrained(
                    str(base), num_labels=1, local_files_only=True, attn_implementation="eager"
                )
                self.wrapper = graphs.ClsCE(hf)
            else:
                hf = graphs.load_model(base, classifier=False)
                self.wrapper = graphs.JointCE(hf, normalize=True)
        except (ValueError, KeyError) as exc:
            raise ValueError(f"{base}: unsupported architecture ({exc})") from None
        self.bias = torch.nn.Parameter(
            torch.zeros(1), requires_grad=kind == "emb" and loss == "bce"
        )

    @property
    def hf_model(self):
        return self.wrapper.hf_model

    def param_groups(self, lr: float, head_lr: float) -> list[dict]:
        """AdamW groups: the [CLS] kind's freshly initialized classifier learns at ``head_lr``
        (at the body's rate it barely leaves uniform scores in hundreds of steps), the rest at
        ``lr``."""
        head, body = [], []
        for name, p in self.named_parameters():
            if p.requires_grad:
                fresh = self.kind == "cls" and ".classifier." in f".{name}"
                (head if fresh else body).append(p)
        groups = [{"params": body, "lr": lr}]
        if head:
            groups.append({"params": head, "lr": head_lr})
        return groups

    def forward(self, feeds: dict[str, torch.Tensor]) -> torch.Tensor:
        """Scores (n,) as the exported model computes them."""
        w = self.wrapper
        args = [feeds["input_ids"], feeds["attention_mask"]]
        if w.uses_token_types:
            args.append(feeds["token_type_ids"])
        if w.takes_pool_mask:
            args.append(feeds["pool_mask"])
        out = w(*args)
        return out[:, 0] if self.kind == "cls" else out

    def logits(self, scores: torch.Tensor) -> torch.Tensor:
        """What the losses see."""
        return scores if self.kind == "cls" else EMB_SCALE * scores + self.bias


class PairEncoder:
    """Token ids of all queries and items (tokenized once), assembled into padded pair batches."""

    def __init__(self, tokenizer: Path, max_length: int, queries, items) -> None:
        self.plan = TokenizerPlan(tokenizer)
        self.tpl = self.plan.pair
        self.room = int(max_length) - self.tpl.n_special
        self.queries = IdStore(self.plan.encode(list(queries)), self.room)
        self.items = IdStore(self.plan.encode(list(items)), self.room)

    def lengths(self, qi: np.ndarray, ii: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return longest_first(self.queries.lengths[qi], self.items.lengths[ii], self.room)

    def chunks(self, qi, ii, max_tokens: int) -> list[np.ndarray]:
        """Pair positions sorted by length (longest first), cut by a padded-token budget."""
        ta, tb = self.lengths(qi, ii)
        total = ta + tb + self.tpl.n_special
        order = np.argsort(-total, kind="stable")
        out, start = [], 0
        for end in range(1, len(order) + 1):
            # padded to the first (longest) pair of the chunk
            if end - start > 1 and (end - start) * total[order[start]] > max_tokens:
                out.append(order[start : end - 1])
                start = end - 1
        if start < len(order):
            out.append(order[start:])
        return out

    def feeds(self, qi, ii, device) -> dict[str, torch.Tensor]:
        qi, ii = np.asarray(qi, np.int64), np.asarray(ii, np.int64)
        ta, tb = self.lengths(qi, ii)
        arrays = assemble_pairs(
            self.tpl, self.plan.pad_id, self.queries, qi, ta, self.items, ii, tb
        )
        return {k: torch.from_numpy(v).to(device) for k, v in arrays.items()}

    def score(self, model: TrainableCE, qi, ii, device, max_tokens: int) -> torch.Tensor:
        """Scores of the pairs (qi[r], ii[r]) in input order, forwarded in length-sorted chunks."""
        qi, ii = np.asarray(qi, np.int64), np.asarray(ii, np.int64)
        parts, where = [], []
        for idx in self.chunks(qi, ii, max_tokens):
            parts.append(model(self.feeds(qi[idx], ii[idx], device)))
            where.append(idx)
        scores = torch.cat(parts)
        inverse = torch.from_numpy(np.argsort(np.concatenate(where))).to(scores.device)
        return scores[inverse]
