"""A BERT encoder checkpoint (``model.safetensors`` + ``config.json``) written as an ONNX graph with
numpy and ``onnx.helper``: no torch, no transformers.

This is how the embedded models (:mod:`crossknn.ce.models`) are built on first use, so a plain
``pip install crossknn`` runs them. The graphs compute what the traced torch modules of
:mod:`crossknn.ce.graphs` compute (same inputs, outputs and pooling; ``tests/test_embedded_onnx.py``
checks them against each other and against the shared score matrix):

- embeddings: word + absolute position + token type, LayerNorm;
- each layer: eager self-attention (``softmax(q kᵀ / sqrt(d) + (1 - mask) · min_float) v``), output
  dense + residual + LayerNorm, feed-forward with exact (erf) GELU + residual + LayerNorm;
- ``joint-ce``: the query vector is the mean of the last hidden state over ``pool_mask == 1``, the
  item vector over ``pool_mask == 2``, both L2-normalized, the score their dot product (output
  ``scores``, shape (batch,));
- ``dual-encoder``: the mean over ``attention_mask``, L2-normalized (output ``embeddings``);
- ``cls-ce``: a ``BertForSequenceClassification``'s raw logits (output ``logits``, shape
  (batch, num_labels)): the pooler (dense + tanh over the ``[CLS]`` position) and the classifier.

Node names follow the torch export (``/encoder/encoder/layer.N/attention/...``,
``.../intermediate/...``, ``.../output/...``) so that the int8 recipes of
:mod:`crossknn.ce.quantize` group the weight MatMuls the same way.

Needs ``onnx`` and ``safetensors`` (base dependencies), imported inside :func:`build_bert_graph`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["build_bert_graph", "GRAPH_KINDS", "OPSET"]

OPSET = 17
#: the graph kinds this builder writes, with their output name
GRAPH_KINDS = {"joint-ce": "scores", "dual-encoder": "embeddings", "cls-ce": "logits"}


def _check_config(config: dict[str, Any], path: Path) -> None:
    """A BERT encoder this builder can write; ValueError naming what differs otherwise."""
    want = {
        "model_type": ("bert",),
        "hidden_act": ("gelu",),
        "position_embedding_type": ("absolute", None),
    }
    for key, allowed in want.items():
        if config.get(key) not in allowed:
            raise ValueError(
                f"{path}: {key} must be one of {allowed} for the torch-free BERT graph; "
                f"got {config.get(key)!r} (export it with crossknn export instead)"
            )
    if config["hidden_size"] % config["num_attention_heads"]:
        raise ValueError(
            f"{path}: hidden_size {config['hidden_size']} is not a multiple of "
            f"num_attention_heads {config['num_attention_heads']}"
        )


def _weights(path: Path) -> dict[str, np.ndarray]:
    """The checkpoint's tensors as float32 numpy arrays, without a "bert." prefix."""
    # safetensors and onnx: only building the embedded models reads weights and writes graphs
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        raw = load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise ValueError(
            f"{path}: not a readable safetensors file, truncated or corrupt ({exc}); "
            "reinstall the package that ships it"
        ) from None
    out = {}
    for name, arr in raw.items():
        key = name[5:] if name.startswith("bert.") else name
        out[key] = arr.astype(np.float32) if arr.dtype.kind == "f" else arr
    return out


class _Graph:
    """Accumulates nodes and initializers; names nodes like the torch export does."""

    def __init__(self, weights: dict[str, np.ndarray]) -> None:
        from onnx import helper, numpy_helper  # onnx: only a graph build needs it

        self.helper, self.numpy_helper = helper, numpy_helper
        self.w = weights
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self._names: set[str] = set()

    def const(self, name: str, value: np.ndarray) -> str:
        if name not in self._names:
            self.inits.append(self.numpy_helper.from_array(np.asarray(value), name))
            self._names.add(name)
        return name

    def weight(self, key: str, *, transpose: bool = False) -> str:
        """An initializer from the checkpoint (a Linear weight transposed for MatMul)."""
        try:
            arr = self.w[key]
        except KeyError:
            raise ValueError(f"the checkpoint has no weight {key!r}") from None
        if transpose:
            return self.const(f"{key}.T", np.ascontiguousarray(arr.T))
        return self.const(key, arr)

    def op(self, op_type: str, inputs: list[str], scope: str, **attrs: Any) -> str:
        name = f"{scope}/{op_type}"
        n = 1
        while name in self._names:
            name = f"{scope}/{op_type}_{n}"
            n += 1
        self._names.add(name)
        out = f"{name}_output_0"
        self.nodes.append(self.helper.make_node(op_type, inputs, [out], name=name, **attrs))
        return out

    def linear(self, x: str, prefix: str, scope: str) -> str:
        y = self.op("MatMul", [x, self.weight(f"{prefix}.weight", transpose=True)], scope)
        return self.op("Add", [y, self.weight(f"{prefix}.bias")], scope)

    def layer_norm(self, x: str, prefix: str, scope: str, eps: float) -> str:
        return self.op(
            "LayerNormalization",
            [x, self.weight(f"{prefix}.weight"), self.weight(f"{prefix}.bias")],
            scope,
            axis=-1,
            epsilon=eps,
        )


def _encoder(g: _Graph, config: dict[str, Any]) -> str:
    """Embeddings and the encoder layers; returns the last hidden state (batch, seq, hidden)."""
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    head = hidden // heads
    eps = float(config.get("layer_norm_eps", 1e-12))
    s = "/encoder/embeddings"
    one = g.const("const_one_i64", np.array(1, dtype=np.int64))
    zero = g.const("const_zero_i64", np.array(0, dtype=np.int64))
    shape = g.op("Shape", ["input_ids"], "/encoder")
    seq = g.op("Gather", [shape, one], "/encoder", axis=0)
    positions = g.op("Range", [zero, seq, one], s)
    x = g.op("Gather", [g.weight("embeddings.word_embeddings.weight"), "input_ids"], s, axis=0)
    pos = g.op("Gather", [g.weight("embeddings.position_embeddings.weight"), positions], s, axis=0)
    typ = g.op(
        "Gather", [g.weight("embeddings.token_type_embeddings.weight"), "token_type_ids"], s, axis=0
    )
    x = g.op("Add", [x, typ], s)
    x = g.op("Add", [x, pos], s)
    x = g.layer_norm(x, "embeddings.LayerNorm", f"{s}/LayerNorm", eps)

    # the additive attention mask (batch, 1, 1, seq): 0 where attended, the float32 minimum else
    s = "/encoder"
    m = g.op("Cast", ["attention_mask"], s, to=1)
    inv = g.op("Sub", [g.const("const_one_f32", np.array(1.0, dtype=np.float32)), m], s)
    neg = g.op("Mul", [inv, g.const("const_min_f32", np.array(np.finfo(np.float32).min))], s)
    mask = g.op("Unsqueeze", [neg, g.const("const_axes_1_2", np.array([1, 2], np.int64))], s)

    split = g.const("const_split_heads", np.array([0, 0, heads, head], dtype=np.int64))
    merge = g.const("const_merge_heads", np.array([0, 0, hidden], dtype=np.int64))
    scale = g.const("const_scale", np.array(1.0 / np.sqrt(head), dtype=np.float32))
    for i in range(int(config["num_hidden_layers"])):
        p = f"encoder.layer.{i}"
        s = f"/encoder/encoder/layer.{i}"
        a = f"{s}/attention/self"

        def heads_of(name: str, perm: list[int], x=x, p=p, a=a) -> str:
            y = g.linear(x, f"{p}.attention.self.{name}", f"{a}/{name}")
            y = g.op("Reshape", [y, split], f"{a}/{name}")
            return g.op("Transpose", [y], f"{a}/{name}", perm=perm)

        q = heads_of("query", [0, 2, 1, 3])
        k = heads_of("key", [0, 2, 3, 1])
        v = heads_of("value", [0, 2, 1, 3])
        scores = g.op("MatMul", [q, k], a)
        scores = g.op("Mul", [scores, scale], a)
        scores = g.op("Add", [scores, mask], a)
        probs = g.op("Softmax", [scores], a, axis=-1)
        ctx = g.op("MatMul", [probs, v], a)
        ctx = g.op("Transpose", [ctx], a, perm=[0, 2, 1, 3])
        ctx = g.op("Reshape", [ctx, merge], a)
        o = f"{s}/attention/output"
        y = g.linear(ctx, f"{p}.attention.output.dense", f"{o}/dense")
        y = g.op("Add", [y, x], o)
        x = g.layer_norm(y, f"{p}.attention.output.LayerNorm", f"{o}/LayerNorm", eps)
        f = f"{s}/intermediate"
        y = g.linear(x, f"{p}.intermediate.dense", f"{f}/dense")
        # exact GELU: 0.5 x (1 + erf(x / sqrt 2))
        e = g.op("Div", [y, g.const("const_sqrt2", np.array(np.sqrt(2.0), np.float32))], f)
        e = g.op("Erf", [e], f)
        e = g.op("Add", [e, g.const("const_one_f32", np.array(1.0, np.float32))], f)
        y = g.op("Mul", [y, e], f)
        y = g.op("Mul", [y, g.const("const_half", np.array(0.5, np.float32))], f)
        o = f"{s}/output"
        y = g.linear(y, f"{p}.output.dense", f"{o}/dense")
        y = g.op("Add", [y, x], o)
        x = g.layer_norm(y, f"{p}.output.LayerNorm", f"{o}/LayerNorm", eps)
    return x


def _masked_mean(g: _Graph, h: str, mask01: str, scope: str) -> str:
    """Mean of ``h`` over the positions where ``mask01`` (batch, seq, float) is 1; zero if none."""
    axis1 = g.const("const_axis_1", np.array([1], np.int64))
    w = g.op("Unsqueeze", [mask01, g.const("const_axis_neg1", np.array([-1], np.int64))], scope)
    total = g.op("ReduceSum", [g.op("Mul", [h, w], scope), axis1], scope, keepdims=0)
    count = g.op("ReduceSum", [w, axis1], scope, keepdims=0)
    count = g.op("Max", [count, g.const("const_one_f32", np.array(1.0, np.float32))], scope)
    return g.op("Div", [total, count], scope)


def _l2(g: _Graph, v: str, scope: str) -> str:
    axis = g.const("const_axis_neg1", np.array([-1], np.int64))
    sq = g.op("ReduceSum", [g.op("Mul", [v, v], scope), axis], scope, keepdims=1)
    norm = g.op("Sqrt", [sq], scope)
    norm = g.op("Max", [norm, g.const("const_eps_l2", np.array(1e-12, np.float32))], scope)
    return g.op("Div", [v, norm], scope)


def build_bert_graph(hf_dir: str | Path, out: str | Path, *, kind: str, normalize: bool = True):
    """Write the ``kind`` graph ("joint-ce", "dual-encoder" or "cls-ce") of the BERT checkpoint
    in ``hf_dir`` to ``out``; returns the manifest entries ``{"output", "inputs"}``."""
    # onnx: only a graph build needs it
    import onnx
    from onnx import TensorProto, helper

    if kind not in GRAPH_KINDS:
        raise ValueError(f"kind must be one of {tuple(GRAPH_KINDS)}; got {kind!r}")
    hf_dir = Path(hf_dir)
    config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    _check_config(config, hf_dir / "config.json")
    g = _Graph(_weights(hf_dir / "model.safetensors"))
    h = _encoder(g, config)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    if kind == "joint-ce":
        names.append("pool_mask")
        s = "/pool"
        pm = "pool_mask"
        masks = []
        for seg in (1, 2):
            eq = g.op("Equal", [pm, g.const(f"const_seg_{seg}", np.array(seg, np.int64))], s)
            masks.append(g.op("Cast", [eq], s, to=TensorProto.FLOAT))
        q, d = (_masked_mean(g, h, m, s) for m in masks)
        if normalize:
            q, d = _l2(g, q, s), _l2(g, d, s)
        prod = g.op("Mul", [q, d], s)
        axis = g.const("const_axis_neg1", np.array([-1], np.int64))
        result = g.op("ReduceSum", [prod, axis], s, keepdims=0)
    elif kind == "cls-ce":
        zero = g.const("const_zero_i64", np.array(0, dtype=np.int64))
        first = g.op("Gather", [h, zero], "/pooler", axis=1)  # the [CLS] position
        pooled = g.op("Tanh", [g.linear(first, "pooler.dense", "/pooler/dense")], "/pooler")
        result = g.linear(pooled, "classifier", "/classifier")
    else:
        s = "/pool"
        m = g.op("Cast", ["attention_mask"], s, to=TensorProto.FLOAT)
        result = _masked_mean(g, h, m, s)
        if normalize:
            result = _l2(g, result, s)
    output = GRAPH_KINDS[kind]
    g.nodes.append(helper.make_node("Identity", [result], [output], name="/output/Identity"))
    inputs = [
        helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"]) for n in names
    ]
    if kind == "joint-ce":
        dims = ["batch"]
    elif kind == "dual-encoder":
        dims = ["batch", int(config["hidden_size"])]
    else:  # the classifier's labels
        dims = ["batch", int(g.w["classifier.weight"].shape[0])]
    outputs = [helper.make_tensor_value_info(output, TensorProto.FLOAT, dims)]
    graph = helper.make_graph(g.nodes, "crossknn_bert", inputs, outputs, initializer=g.inits)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="crossknn.ce.bert_onnx",
    )
    model.ir_version = 8  # opset 17: readable by every onnxruntime >= 1.14
    onnx.checker.check_model(model)
    onnx.save(model, str(out))
    entries: dict[str, Any] = {"output": output, "inputs": names}
    if kind == "cls-ce":
        entries["num_labels"] = dims[1]
    return entries
