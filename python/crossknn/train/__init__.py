"""Fine-tuning cross-encoders ([CLS] and [EMB]) for crossknn: ``crossknn train-ce``.

``examples`` (training data), ``negatives`` (DE-mined hard negatives), ``groups`` (the pairs of a
step), ``losses``, ``scorer`` (the torch model: :mod:`crossknn.ce.graphs` wrappers), ``teacher``
(distillation targets), ``dev`` (model selection), ``checkpoint``, ``config`` and ``loop``
(:func:`train_cross_encoder`). Needs torch and transformers (the ``export`` extra).
"""

from crossknn.train.config import TrainConfig
from crossknn.train.loop import train_cross_encoder

__all__ = ["TrainConfig", "train_cross_encoder"]
