"""ONNX Runtime's spin-waiting, as the environment asks (``CROSSKNN_ORT_SPINNING``).

Between two runs of a session, ONNX Runtime's intra-op threads spin (busy-wait) for a while
before they sleep: a short wait for the next batch is then cheap. When more threads want the
cores than there are cores (several processes each running a model on a small machine, a test
suite on two workers), the spinning threads take CPU time the others need.
``CROSSKNN_ORT_SPINNING=0`` makes the CPU sessions crossknn opens sleep instead; ``1`` or unset
keeps ONNX Runtime's default. Scores do not depend on it.
"""

from __future__ import annotations

import os

__all__ = ["ENV", "set_spinning"]

ENV = "CROSSKNN_ORT_SPINNING"


def set_spinning(options) -> None:
    """Apply ``$CROSSKNN_ORT_SPINNING`` (``0`` or ``1``; unset: ONNX Runtime's default) to an
    ``onnxruntime.SessionOptions``."""
    value = os.environ.get(ENV, "").strip()
    if not value:
        return
    if value not in ("0", "1"):
        raise ValueError(f"{ENV} must be 0 or 1; got {value!r}")
    options.add_session_config_entry("session.intra_op.allow_spinning", value)
