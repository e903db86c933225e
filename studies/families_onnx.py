"""ONNX Runtime as a library family: each PyTorch API of the calibration dumps as a small
ONNX graph (onnx.helper, opset 21) run by ONNX Runtime's CPU kernels, for
studies/library_families.py. Forward only (ONNX Runtime's inference build does not
differentiate).

Why: ONNX Runtime's CPU kernels (MLAS, Eigen) are a third real library, the one exported
models run on. Each entry receives the API's arguments under torch's parameter names (tensors
as float32 numpy arrays: the harness raises 16-bit inputs and rounds the result once) and
returns the output of the graph it builds, written as torch.onnx exports the op (rsqrt as
Reciprocal(Sqrt), silu as x * Sigmoid(x)). An API missing here keeps its dumped output.
Needs `onnx` and `onnxruntime` (imported with this module).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime
from onnx import helper, numpy_helper

OPSET = 21


class Graph:
    """One ONNX graph under construction: inputs fed from arrays, constants as initializers."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.feeds: dict[str, np.ndarray] = {}

    def _name(self, stem: str) -> str:
        return f"{stem}{len(self.nodes) + len(self.inputs) + len(self.initializers)}"

    def input(self, array: np.ndarray) -> str:
        name = self._name("in")
        array = np.asarray(array)
        self.inputs.append(
            helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape)
        )
        self.feeds[name] = array
        return name

    def const(self, value: Any, dtype: Any = np.float32) -> str:
        name = self._name("c")
        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def op(self, op_type: str, *inputs: str, **attributes: Any) -> str:
        name = self._name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [name], **attributes))
        return name

    def run(self, output: str) -> np.ndarray:
        graph = helper.make_graph(
            self.nodes, "call", self.inputs, [helper.make_empty_tensor_value_info(output)], self.initializers
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return session.run([output], self.feeds)[0]


def operand(graph: Graph, value: Any) -> str:
    """A tensor argument as a graph input, a Python scalar as a float32 constant."""
    return graph.input(value) if isinstance(value, np.ndarray) else graph.const(value)


def node(op_type: str, **attributes: Any) -> Callable[..., np.ndarray]:
    """An API that is one ONNX op of its tensor arguments (torch's extra flags ignored)."""

    def call(*args: Any, **kwargs: Any) -> np.ndarray:
        graph = Graph()
        return graph.run(
            graph.op(
                op_type,
                *(
                    operand(graph, a)
                    for a in args
                    if isinstance(a, (np.ndarray, float, int)) and not isinstance(a, bool)
                ),
                **attributes,
            )
        )

    return call


def unary(op_type: str, **attributes: Any) -> Callable[..., np.ndarray]:
    def call(input: np.ndarray, *_: Any, **__: Any) -> np.ndarray:
        graph = Graph()
        return graph.run(graph.op(op_type, graph.input(input), **attributes))

    return call


def gelu(input: np.ndarray, approximate: str = "none") -> np.ndarray:
    graph = Graph()
    return graph.run(graph.op("Gelu", graph.input(input), approximate=approximate))


def silu(input: np.ndarray, inplace: bool = False) -> np.ndarray:
    graph = Graph()
    x = graph.input(input)
    return graph.run(graph.op("Mul", x, graph.op("Sigmoid", x)))


def rsqrt(input: np.ndarray) -> np.ndarray:
    graph = Graph()
    return graph.run(graph.op("Reciprocal", graph.op("Sqrt", graph.input(input))))


def softplus(input: np.ndarray, beta: float = 1.0, threshold: float = 20.0) -> np.ndarray:
    if beta != 1:
        raise NotImplementedError(f"softplus beta={beta}")
    graph = Graph()
    x = graph.input(input)
    return graph.run(graph.op("Where", graph.op("Greater", x, graph.const(threshold)), x, graph.op("Softplus", x)))


def binary(op_type: str, swap: bool = False) -> Callable[..., np.ndarray]:
    def call(input: Any, other: Any, alpha: float = 1) -> np.ndarray:
        if alpha != 1:
            raise NotImplementedError("alpha")
        graph = Graph()
        a, b = operand(graph, input), operand(graph, other)
        return graph.run(graph.op(op_type, *((b, a) if swap else (a, b))))

    return call


def softmax(op_type: str) -> Callable[..., np.ndarray]:
    def call(input: np.ndarray, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None) -> np.ndarray:
        graph = Graph()
        return graph.run(graph.op(op_type, graph.input(input), axis=-1 if dim is None else dim))

    return call


def layer_norm(
    input: np.ndarray, normalized_shape: Sequence[int], weight: Any = None, bias: Any = None, eps: float = 1e-5
) -> np.ndarray:
    graph = Graph()
    shape = tuple(normalized_shape)
    scale = graph.input(weight) if weight is not None else graph.const(np.ones(shape))
    inputs = [graph.input(input), scale] + ([graph.input(bias)] if bias is not None else [])
    return graph.run(graph.op("LayerNormalization", *inputs, axis=-len(shape), epsilon=eps))


def reduce(op_type: str) -> Callable[..., np.ndarray]:
    def call(input: np.ndarray, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> np.ndarray:
        graph = Graph()
        axes = [] if dim is None else [dim] if isinstance(dim, int) else list(dim)
        inputs = [graph.input(input)] + ([graph.const(axes, np.int64)] if axes else [])
        return graph.run(graph.op(op_type, *inputs, keepdims=int(keepdim)))

    return call


def linear(input: np.ndarray, weight: np.ndarray, bias: Any = None) -> np.ndarray:
    graph = Graph()
    product = graph.op("MatMul", graph.input(input), graph.op("Transpose", graph.input(weight), perm=[1, 0]))
    return graph.run(product if bias is None else graph.op("Add", product, graph.input(bias)))


def conv(
    input: np.ndarray,
    weight: np.ndarray,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> np.ndarray:
    spatial = input.ndim - 2
    if isinstance(padding, str):
        raise NotImplementedError(f"padding={padding!r}")

    def pair(v: Any) -> list[int]:
        return list(v) if isinstance(v, (list, tuple)) else [v] * spatial

    graph = Graph()
    inputs = [graph.input(input), graph.input(weight)] + ([graph.input(bias)] if bias is not None else [])
    return graph.run(
        graph.op("Conv", *inputs, strides=pair(stride), pads=pair(padding) * 2, dilations=pair(dilation), group=groups)
    )


def pool(op_type: str) -> Callable[..., np.ndarray]:
    def call(
        input: np.ndarray, kernel_size: Any, stride: Any = None, padding: Any = 0, *rest: Any, **options: Any
    ) -> np.ndarray:
        spatial = input.ndim - 2

        def pair(v: Any) -> list[int]:
            return list(v) if isinstance(v, (list, tuple)) else [v] * spatial

        if any(pair(padding)) or any(rest) or options.get("ceil_mode"):
            raise NotImplementedError("pooling with padding or ceil_mode")
        graph = Graph()
        strides = pair(stride if stride not in (None, []) else kernel_size)
        return graph.run(graph.op(op_type, graph.input(input), kernel_shape=pair(kernel_size), strides=strides))

    return call


def masked_fill(input: np.ndarray, mask: np.ndarray, value: float) -> np.ndarray:
    graph = Graph()
    return graph.run(graph.op("Where", graph.input(mask), graph.const(value), graph.input(input)))


def where(condition: np.ndarray, input: Any, other: Any) -> np.ndarray:
    graph = Graph()
    return graph.run(graph.op("Where", graph.input(condition), operand(graph, input), operand(graph, other)))


def cumsum(input: np.ndarray, dim: int, dtype: Any = None) -> np.ndarray:
    graph = Graph()
    return graph.run(graph.op("CumSum", graph.input(input), graph.const(dim, np.int64)))


def embedding(input: np.ndarray, weight: np.ndarray, *_: Any, **__: Any) -> np.ndarray:
    graph = Graph()
    return graph.run(graph.op("Gather", graph.input(weight), graph.input(input), axis=0))


#: API (as dump.json names it, without its call index) -> its ONNX Runtime equivalent
TABLE: dict[str, Callable[..., np.ndarray]] = {
    "Functional.gelu": gelu,
    "Functional.silu": silu,
    "Functional.relu": unary("Relu"),
    "Functional.elu": unary("Elu"),
    "Functional.mish": unary("Mish"),
    "Functional.softplus": softplus,
    "Functional.hardswish": unary("HardSwish"),
    "Functional.hardsigmoid": unary("HardSigmoid", alpha=1 / 6),
    "Torch.tanh": unary("Tanh"),
    "Torch.sigmoid": unary("Sigmoid"),
    "Torch.exp": unary("Exp"),
    "Tensor.exp": unary("Exp"),
    "Torch.erf": unary("Erf"),
    "Torch.sin": unary("Sin"),
    "Torch.cos": unary("Cos"),
    "Torch.rsqrt": rsqrt,
    "Tensor.abs": unary("Abs"),
    "Torch.pow": binary("Pow"),
    "Tensor.pow": binary("Pow"),
    "Tensor.__add__": binary("Add"),
    "Tensor.__radd__": binary("Add", swap=True),
    "Tensor.__sub__": binary("Sub"),
    "Tensor.__mul__": binary("Mul"),
    "Tensor.__truediv__": binary("Div"),
    "Tensor.masked_fill": masked_fill,
    "Torch.where": where,
    "Tensor.sum": reduce("ReduceSum"),
    "Tensor.mean": reduce("ReduceMean"),
    "Tensor.amax": reduce("ReduceMax"),
    "Torch.logsumexp": reduce("ReduceLogSumExp"),
    "Torch.cumsum": cumsum,
    "Functional.softmax": softmax("Softmax"),
    "Tensor.softmax": softmax("Softmax"),
    "Functional.log_softmax": softmax("LogSoftmax"),
    "Functional.layer_norm": layer_norm,
    "Functional.linear": linear,
    "Torch.matmul": node("MatMul"),
    "Tensor.__matmul__": node("MatMul"),
    "Torch.bmm": node("MatMul"),
    "Functional.conv1d": conv,
    "Functional.conv2d": conv,
    "Functional.avg_pool1d": pool("AveragePool"),
    "Functional.avg_pool2d": pool("AveragePool"),
    "Functional.max_pool1d": pool("MaxPool"),
    "Functional.max_pool2d": pool("MaxPool"),
    "Functional.embedding": embedding,
}


def forward(api: str, args: list[Any], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """The output of api on numpy arguments (float64 tensors too run as float32 graphs'
    inputs would not: those raise)."""
    if any(isinstance(a, np.ndarray) and a.dtype == np.float64 for a in args):
        raise NotImplementedError("float64")
    return (TABLE[api](*args, **kwargs),)
