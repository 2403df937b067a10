"""The PyTorch modules traced to ONNX by :mod:`crossknn.ce.export`, and the tracing itself.

Each module wraps a Hugging Face model and takes ``(input_ids, attention_mask[, token_type_ids]
[, pool_mask])``; :class:`Wrapper` holds the shared prelude (the encoder pass), the subclasses only
what they compute from it. This module imports torch and transformers at the top: only the export
functions import it, so the runtime never needs them.
"""

from __future__ import annotations

import inspect
import warnings
from pathlib import Path

import torch
from transformers import AutoModel, AutoModelForSequenceClassification

__all__ = ["Wrapper", "ClsCE", "JointCE", "DualEncoder", "load_model"]


def load_model(hf_dir: Path, *, classifier: bool) -> torch.nn.Module:
    """The checkpoint as a sequence classifier or as a bare encoder (eager attention, eval)."""
    load = AutoModelForSequenceClassification if classifier else AutoModel
    model = load.from_pretrained(str(hf_dir), local_files_only=True, attn_implementation="eager")
    return model.eval()


def _weights(mask: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """A 0/1 mask (batch, sequence) as weights (batch, sequence, 1) in the dtype of ``h``."""
    return mask.to(h.dtype).unsqueeze(-1)


def _mean(h: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Mean of ``h`` over the positions weighted 1 by ``m`` (the zero vector if none)."""
    return (h * m).sum(1) / m.sum(1).clamp(min=1.0)


def _l2(v: torch.Tensor) -> torch.Tensor:
    return v / v.norm(dim=-1, keepdim=True).clamp(min=1e-12)


class Wrapper(torch.nn.Module):
    """A Hugging Face model with the ONNX inputs; ``output`` names the graph's one output."""

    output = ""
    takes_pool_mask = False  # whether the graph takes a pool_mask input (after the model's)
    # the attribute holding the model: it prefixes the ONNX initializer names, so it stays what
    # export recipe 2 used (exported files are byte-identical to those of earlier releases)
    submodule = "encoder"

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.add_module(self.submodule, model)
        self.uses_token_types = "token_type_ids" in inspect.signature(model.forward).parameters

    @property
    def hf_model(self) -> torch.nn.Module:
        return getattr(self, self.submodule)

    def first_output(self, input_ids, attention_mask, rest):
        """The model's first output (logits or last hidden state); ``rest[0]`` is token types."""
        kw = {"token_type_ids": rest[0]} if self.uses_token_types else {}
        return self.hf_model(input_ids=input_ids, attention_mask=attention_mask, **kw)[0]

    def export(self, path: Path, *, opset: int) -> list[str]:
        """Trace to ``path`` with dynamic batch and sequence axes; returns the input names."""
        args, names = self._dummy_inputs()
        axes = {name: {0: "batch", 1: "sequence"} for name in names}
        axes[self.output] = {0: "batch"}
        self.eval()
        with torch.no_grad(), warnings.catch_warnings():
            # tracer notes about shape-dependent Python branches in transformers' mask helpers: the
            # branch taken is the same for every (batch, sequence) shape; parity tests check it
            warnings.simplefilter("ignore")
            torch.onnx.export(
                self,
                args,
                str(path),
                input_names=names,
                output_names=[self.output],
                dynamic_axes=axes,
                opset_version=opset,
                do_constant_folding=True,
                dynamo=False,
            )
        return names

    def _dummy_inputs(self) -> tuple[tuple[torch.Tensor, ...], list[str]]:
        vocab_size = int(self.hf_model.config.vocab_size)
        g = torch.Generator().manual_seed(0)
        batch, seq = 2, 12
        # ordinary token ids (above the special ones); a tiny vocabulary: any id but 0
        low = 1000 if vocab_size > 1001 else 1
        ids = torch.randint(low, min(vocab_size, 5000), (batch, seq), generator=g)
        mask = torch.ones(batch, seq, dtype=torch.int64)
        mask[1, 8:] = 0  # second row padded: the mask path is traced, not folded away
        args = [ids, mask]
        names = ["input_ids", "attention_mask"]
        if self.uses_token_types:
            tt = torch.zeros(batch, seq, dtype=torch.int64)
            tt[:, 5:] = 1
            tt[1, 8:] = 0
            args.append(tt)
            names.append("token_type_ids")
        if self.takes_pool_mask:
            pool = torch.zeros(batch, seq, dtype=torch.int64)
            pool[:, 1:4] = 1
            pool[0, 6:11] = 2
            pool[1, 6:7] = 2
            args.append(pool)
            names.append("pool_mask")
        return tuple(args), names


class ClsCE(Wrapper):
    """[CLS]-CE: the sequence classifier's raw logits (batch, num_labels)."""

    output = "logits"
    submodule = "model"

    def forward(self, input_ids, attention_mask, *rest):
        return self.first_output(input_ids, attention_mask, rest)


class _Pooled(Wrapper):
    """A wrapper that pools hidden states into vectors, L2-normalized if ``normalize``."""

    def __init__(self, model: torch.nn.Module, *, normalize: bool) -> None:
        super().__init__(model)
        self.normalize = normalize


class JointCE(_Pooled):
    """[EMB]-CE: mean of the query segment (pool_mask 1) . mean of the item segment (2)."""

    output = "scores"
    takes_pool_mask = True

    def forward(self, input_ids, attention_mask, *rest):
        h = self.first_output(input_ids, attention_mask, rest)
        pool_mask = rest[-1]
        mq, md = _weights(pool_mask == 1, h), _weights(pool_mask == 2, h)
        q, d = _mean(h, mq), _mean(h, md)
        if self.normalize:
            q, d = _l2(q), _l2(d)
        return (q * d).sum(-1)


class DualEncoder(_Pooled):
    """Dual encoder: mean over all non-padding tokens (special tokens included)."""

    output = "embeddings"

    def forward(self, input_ids, attention_mask, *rest):
        h = self.first_output(input_ids, attention_mask, rest)
        v = _mean(h, _weights(attention_mask, h))
        return _l2(v) if self.normalize else v
