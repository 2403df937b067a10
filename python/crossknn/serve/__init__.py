"""``crossknn serve``: the search service over HTTP (FastAPI + uvicorn, Ray Serve replicas).

- :func:`create_app` (:mod:`crossknn.serve.app`): the FastAPI app and its endpoints;
- :class:`SearchService`, :class:`ServeConfig` (:mod:`crossknn.serve.service`): models, index,
  admission and request threads;
- :class:`Batcher` (:mod:`crossknn.serve.batcher`): merges the CE calls of concurrent requests;
- :class:`BatchedCE` (:mod:`crossknn.serve.proxy`): the CE stand-in a shared ``Searcher`` calls;
- :class:`DEThread` (:mod:`crossknn.serve.de_thread`): on a GPU, the DE's queries encoded in one
  thread of their own;
- :class:`Metrics` (:mod:`crossknn.serve.metrics`): Prometheus metrics;
- :mod:`crossknn.serve.ray_app`: the same app as a Ray Serve deployment.

Needs the ``serve`` extra: ``pip install 'crossknn[serve]'``. See docs/serving.md.
"""

from __future__ import annotations

from crossknn.serve.app import create_app
from crossknn.serve.batcher import Batcher, Cancelled
from crossknn.serve.metrics import Metrics
from crossknn.serve.proxy import BatchedCE, RequestContext
from crossknn.serve.service import SearchService, ServeConfig

__all__ = [
    "BatchedCE",
    "Batcher",
    "Cancelled",
    "Metrics",
    "RequestContext",
    "SearchService",
    "ServeConfig",
    "create_app",
]
