"""The CMC model (Song et al., "Comparing Neighbors Together Makes it Easy", sec. 3.1).

Input: one query vector and K candidate vectors from a frozen dual encoder (precomputed). The
sequence ``[q; c_1 .. c_K]`` goes through a few transformer encoder layers with **no positional
encoding and no attention mask**, so the model is permutation-equivariant over candidates and
runs for any K. An extra skip connection around the whole stack (paper app. C) is gated:
``h = x + g * Attn(x)`` with a learned per-dimension gate ``g`` that starts at 0, so an untrained
model ranks exactly like the dual encoder. Scores are ``scale * <h_q, h_c_j>``. ``width`` (an
addition for CPU training) runs the attention layers at a smaller width between two linear maps.

The encoder layers are written out (pre-norm multi-head self-attention + GELU feed-forward)
rather than taken from ``nn.TransformerEncoderLayer``, whose inference fast path does not export
to ONNX the same way it runs; the math is the standard one.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import nn

__all__ = ["CmcConfig", "CmcModel"]


@dataclass
class CmcConfig:
    dim: int  # the dual encoder's vector size
    width: int = 0  # attention width; 0: dim (else linear maps dim -> width -> dim around it)
    layers: int = 2
    heads: int = 4
    ff_mult: int = 2
    dropout: float = 0.1
    init_scale: float = 20.0  # initial score scale (DE vectors are unit-norm cosines)

    def __post_init__(self) -> None:
        for name in ("dim", "layers", "heads", "ff_mult"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"CmcConfig.{name} must be a positive int; got {v!r}")
        if not isinstance(self.width, int) or self.width < 0:
            raise ValueError(f"CmcConfig.width must be an int >= 0; got {self.width!r}")
        if self.model_width % self.heads:
            raise ValueError(f"width={self.model_width} must be divisible by heads={self.heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1); got {self.dropout}")
        if self.init_scale <= 0:
            raise ValueError(f"init_scale must be > 0; got {self.init_scale}")

    @property
    def model_width(self) -> int:
        return self.width or self.dim

    def to_dict(self) -> dict:
        return asdict(self)


class _Layer(nn.Module):
    def __init__(self, cfg: CmcConfig) -> None:
        super().__init__()
        d = cfg.model_width
        self.heads = cfg.heads
        self.norm1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d)
        self.ff = nn.Sequential(
            nn.Linear(d, cfg.ff_mult * d),
            nn.GELU(),
            nn.Dropout(cfg.dropout),
            nn.Linear(cfg.ff_mult * d, d),
        )
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, L, d)
        b, n, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.norm1(x)).reshape(b, n, 3, h, d // h).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // h), dim=-1)
        y = (self.drop(att) @ v).transpose(1, 2).reshape(b, n, d)
        x = x + self.drop(self.out(y))
        return x + self.drop(self.ff(self.norm2(x)))


class CmcModel(nn.Module):
    """``forward(query (B, d), candidates (B, K, d)) -> scores (B, K)``, any K >= 1."""

    def __init__(self, cfg: CmcConfig) -> None:
        super().__init__()
        self.cfg = cfg
        w = cfg.model_width
        self.proj_in = nn.Linear(cfg.dim, w) if w != cfg.dim else nn.Identity()
        self.layers = nn.ModuleList(_Layer(cfg) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(w)
        self.proj_out = nn.Linear(w, cfg.dim) if w != cfg.dim else nn.Identity()
        self.gate = nn.Parameter(torch.zeros(cfg.dim))
        self.log_scale = nn.Parameter(torch.tensor(math.log(cfg.init_scale)))

    def contextualize(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj_in(x)
        for layer in self.layers:
            h = layer(h)
        return x + self.gate * self.proj_out(self.norm(h))  # the extra (gated) skip connection

    def forward(self, query: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        if query.dim() != 2 or candidates.dim() != 3:
            raise ValueError(
                f"expected query (B, d) and candidates (B, K, d); got "
                f"{tuple(query.shape)} and {tuple(candidates.shape)}"
            )
        d = self.cfg.dim
        if query.shape[1] != d or candidates.shape[2] != d:
            raise ValueError(
                f"vectors must have dim {d} (this model's encoder); got query "
                f"{tuple(query.shape)} and candidates {tuple(candidates.shape)}"
            )
        if query.shape[0] != candidates.shape[0]:
            raise ValueError(f"{query.shape[0]} queries but {candidates.shape[0]} candidate sets")
        h = self.contextualize(torch.cat([query.unsqueeze(1), candidates], dim=1))
        hq, hc = h[:, :1], h[:, 1:]
        return (hc @ hq.transpose(1, 2)).squeeze(-1) * self.log_scale.exp()
