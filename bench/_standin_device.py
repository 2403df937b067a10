"""A stand-in GPU: crossknn's GPU serving path on a machine without one, the device a sleep.

Every ONNX session crossknn opens says it runs on ``CUDAExecutionProvider`` (so ``serve`` takes
its GPU defaults: two CE workers, merged batches of 256 pairs, the DE in its own thread, the
load-time warm-up in each CE worker) and its session run is replaced by a sleep of
``a + b * rows`` ms (the CE's and the DE's own ``a, b``), one batch at a time as on the device,
releasing the interpreter lock as a GPU session run does. Everything around the session is
real: tokenizing, the pair inputs, the engine, the batcher, the query groups, HTTP. Outputs are
a fixed function of each row's token ids (the same pair gives the same score in any batch), not
a model's: the searches do the real amount of work, their results mean nothing.

The default timings are an H100's, from ``bench/results/gpu_serve_timing.h100.json``
(serve, fp16, SciFact, one CE worker, so that no batch's time includes another's): merged CE
batches of 20 / 78 / 272 pairs ran 0.74 / 2.40 / 6.23 ms in the session, about 0.5 + 0.021 ms a
pair up to the 256-pair batches of today's default (with two workers a batch's session time
includes waiting for the other's). The DE's query batches are not measured there; 0.5 + 0.02 ms
a query is assumed.

    python bench/gpu_bench.py --provider cpu --sections serve --standin-device 0.5,0.021
    python bench/_standin_device.py 0.5,0.021,0.5,0.02 serve INDEX [serve options]   # a server

Not with ``serve --workers`` (the worker processes would not have the stand-in).

What it cannot show: anything of the device itself (CUDA graph captures, per-thread provider
contexts, memory growth), so not the first-wave tail seen on the H100 (docs/serve.md).
"""

from __future__ import annotations

import sys
import threading
import time

import numpy as np

__all__ = ["DEFAULT", "install", "parse"]

#: (CE a, CE b, DE a, DE b): ms = a + b * rows
DEFAULT = (0.5, 0.021, 0.5, 0.02)

_DEVICE = threading.Lock()  # the device runs one batch at a time
_WIDTH = 4096  # token positions the output function weighs (longer inputs: cut)


def parse(spec: str) -> tuple[float, float, float, float]:
    """``"a,b"`` (the CE's; the DE's default) or ``"a,b,c,d"`` (CE a, b, DE a, b) in ms."""
    parts = [float(x) for x in spec.split(",") if x.strip()]
    if len(parts) == 2:
        parts += list(DEFAULT[2:])
    if len(parts) != 4 or any(p < 0 for p in parts):
        raise ValueError(f"stand-in device timings: 'a,b' or 'a,b,c,d' ms >= 0; got {spec!r}")
    return parts[0], parts[1], parts[2], parts[3]


def install(timings: tuple[float, float, float, float] = DEFAULT) -> None:
    """From now on every crossknn ONNX session of this process is the stand-in device."""
    from crossknn.ce import runtime

    if getattr(runtime._Session, "standin", None) is not None:
        runtime._Session.standin = timings
        return
    real_init = runtime._Session.__init__
    weights = np.random.default_rng(0).uniform(0.5, 1.5, _WIDTH)

    def init(self, *args, **kwargs) -> None:
        real_init(self, *args, **kwargs)
        self.provider = "CUDAExecutionProvider"
        self._gpu = True

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        ce_a, ce_b, de_a, de_b = runtime._Session.standin
        ids = feeds["input_ids"]
        n, width = ids.shape
        kind = self.manifest["kind"]
        a, b = (de_a, de_b) if kind == "dual-encoder" else (ce_a, ce_b)
        with _DEVICE:
            time.sleep((a + b * n) / 1000.0)
        # padding ids are 0 and weigh nothing: a row's value does not depend on its batch
        x = ids[:, :_WIDTH].astype(np.float64) @ weights[: min(width, _WIDTH)] / 997.0
        if kind == "dual-encoder":
            dim = int(self.manifest["dim"])
            v = np.sin(np.outer(x, np.arange(1, dim + 1)))
            return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)
        labels = int(self.manifest.get("num_labels") or 1)
        scores = np.sin(x).astype(np.float32)
        return scores if kind == "joint-ce" else np.repeat(scores[:, None], labels, axis=1)

    runtime._Session.__init__ = init
    runtime._Session._run = run
    runtime._Session.standin = timings


def main(argv: list[str]) -> int:
    """``_standin_device.py TIMINGS CROSSKNN-ARGS...``: the crossknn CLI on the stand-in."""
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        print("usage: _standin_device.py A,B[,C,D] serve INDEX [options]", file=sys.stderr)
        return 2
    install(parse(argv[0]))
    from crossknn.cli import main as cli

    return cli(argv[1:])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
