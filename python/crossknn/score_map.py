"""The map between CE scores and approximate scores: ``ce ≈ scale * approx + offset``.

AXN's least squares fits ``V[A] u ≈ a``; when ``V`` holds DE (or MF) item vectors, the CE scores
``a`` live on another scale than the inner products ``V u``, so they are mapped first:
``a' = to_approx(a) = (a - offset) / scale``. The map is monotone (``scale > 0`` in practice), so it
never changes a ranking; it is fitted offline on train pairs and recorded in the index.

Two ways to fit it, both giving the same type:

- :meth:`ScoreMap.fit` — least squares of CE on approx scores (the corpus index's calibration);
- :meth:`ScoreMap.match_moments` — the map whose inverse gives CE scores the mean and standard
  deviation of the approx scores on the same pairs (the sparse-MF index's normalization).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

__all__ = ["ScoreMap"]


@dataclass(frozen=True)
class ScoreMap:
    """``ce ≈ scale * approx + offset``."""

    scale: float = 1.0
    offset: float = 0.0

    def __post_init__(self) -> None:
        scale, offset = float(self.scale), float(self.offset)
        if not (np.isfinite(scale) and np.isfinite(offset)):
            raise ValueError(f"a score map needs finite scale and offset; got {scale}, {offset}")
        if abs(scale) < 1e-12 or abs(scale) > 1e12 or abs(offset) > 1e12:
            raise ValueError(
                f"score map out of range: scale must be non-zero and |scale|, |offset| <= 1e12; "
                f"got scale={scale}, offset={offset}"
            )
        object.__setattr__(self, "scale", scale)
        object.__setattr__(self, "offset", offset)

    def to_approx(self, ce_scores) -> np.ndarray:
        """CE scores on the scale of the approximate scores (float64)."""
        return (np.asarray(ce_scores, np.float64) - self.offset) / self.scale

    def to_ce(self, approx_scores) -> np.ndarray:
        return np.asarray(approx_scores, np.float64) * self.scale + self.offset

    def to_list(self) -> list[float]:
        return [self.scale, self.offset]

    @classmethod
    def from_list(cls, value, *, what: str = "score map") -> ScoreMap:
        """From ``[scale, offset]`` (as recorded in ``index.json``), with a clear error."""
        if (
            not isinstance(value, (list, tuple))
            or len(value) != 2
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        ):
            raise ValueError(f"{what} must be [scale, offset] (two numbers); got {value!r}")
        try:
            return cls(float(value[0]), float(value[1]))
        except ValueError as exc:
            raise ValueError(f"{what}: {exc}") from None

    @classmethod
    def from_params(cls, params: Mapping, *, what: str = "index") -> ScoreMap | None:
        """The map an index recorded in its params (``score_map``), or ``None`` if it has none.

        Indexes written before ``score_map`` existed are read too: a corpus index's
        ``score_affine`` ([scale, offset]) and an MF index's ``alpha``/``beta`` (the map
        ``beta * (ce - alpha)``, recorded when ``normalize`` was on)."""
        if params.get("score_map") is not None:
            return cls.from_list(params["score_map"], what=f"{what}: params.score_map")
        if params.get("score_affine") is not None:
            return cls.from_list(params["score_affine"], what=f"{what}: params.score_affine")
        if params.get("normalize") and "alpha" in params and "beta" in params:
            alpha, beta = params["alpha"], params["beta"]
            if not isinstance(beta, (int, float)) or isinstance(beta, bool) or beta == 0:
                raise ValueError(f"{what}: params.beta must be a non-zero number; got {beta!r}")
            return cls.from_list([1.0 / float(beta), alpha], what=f"{what}: params.alpha/beta")
        return None

    @classmethod
    def fit(cls, ce_scores, approx_scores) -> ScoreMap:
        """Least squares ``ce ≈ scale * approx + offset``. Accumulates row by row in float64, so
        (train queries x 10^6 items) inputs need no big temporaries."""
        x_all = np.asarray(approx_scores)
        y_all = np.asarray(ce_scores)
        if x_all.shape != y_all.shape or x_all.size < 2:
            raise ValueError(
                "fitting the CE score map needs the same number (>= 2) of CE and approximate "
                f"scores; got {x_all.shape} and {y_all.shape}"
            )
        x_rows = x_all.reshape(-1, x_all.shape[-1]) if x_all.ndim > 1 else x_all[None]
        y_rows = y_all.reshape(-1, y_all.shape[-1]) if y_all.ndim > 1 else y_all[None]
        n = sx = sy = 0.0
        for x, y in zip(x_rows, y_rows, strict=True):
            n += x.size
            sx += float(x.sum(dtype=np.float64))
            sy += float(y.sum(dtype=np.float64))
        for what, total in (("approximate", sx), ("CE", sy)):
            if not np.isfinite(total):
                raise ValueError(
                    f"the {what} scores include inf or NaN (or overflow: vectors so large that "
                    "their dot products exceed float32); the CE score map cannot be fitted"
                )
        mx, my = sx / n, sy / n
        sxx = sxy = 0.0
        for x, y in zip(x_rows, y_rows, strict=True):
            dx = x.astype(np.float64) - mx
            sxx += float(dx @ dx)
            sxy += float(dx @ (y.astype(np.float64) - my))
        if not (np.isfinite(sxx) and np.isfinite(sxy)):
            raise ValueError(
                "the approximate scores are too large to fit the CE score map (their squares "
                "overflow float64)"
            )
        if sxx <= 1e-300 or abs(sxy / sxx) < 1e-12:
            raise ValueError("CE scores do not depend on the approximate scores (scale ~ 0)")
        scale = sxy / sxx
        return cls(scale, my - scale * mx)

    @classmethod
    def match_moments(cls, ce_scores, approx_scores) -> ScoreMap:
        """The map with ``to_approx(ce)`` having the mean and std of ``approx_scores``; the
        identity when either spread is zero."""
        ce = np.asarray(ce_scores, np.float64)
        ap = np.asarray(approx_scores, np.float64)
        sd_ce, sd_ap = ce.std(), ap.std()
        if not (sd_ce > 0 and sd_ap > 0):
            return cls()
        scale = sd_ce / sd_ap
        return cls(scale, ce.mean() - ap.mean() * scale)
