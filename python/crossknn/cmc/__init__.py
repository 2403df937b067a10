"""CMC (comparing multiple candidates): a trained intermediate reranker over DE vectors.

- :mod:`crossknn.cmc.model` the PyTorch model, :mod:`crossknn.cmc.train` training (checkpoints,
  resume), :mod:`crossknn.cmc.export` ONNX export (torch is needed for these three);
- :class:`CmcReranker` / :class:`CmcRetriever` inference on ONNX Runtime (no torch). Importing
  this package registers the ``"cmc"`` first-stage retriever in :mod:`crossknn.retrievers`.
"""

from crossknn.cmc.runtime import DEFAULT_CANDIDATES, CmcReranker, CmcRetriever, _factory
from crossknn.retrievers import register_retriever

register_retriever("cmc", _factory)

__all__ = ["DEFAULT_CANDIDATES", "CmcReranker", "CmcRetriever"]
