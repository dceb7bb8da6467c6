"""A PyTorch module as a layer graph: built on the meta device (no weights, no GPU), traced with
``torch.fx.symbolic_trace``, shapes propagated (``torch.fx.passes.shape_prop``), and every node
mapped onto the same :class:`~workloads.networks.builder.NetBuilder` layers that the catalog's
builders use, so kernels, parameters and saved bytes follow the same rules.

Scenario syntax::

    model: torchvision:resnet50                    # input: its weights' crop (3x224x224; inception_v3 3x299x299)
    model: {torch: "pkg.module:callable", input_shape: [3, 224, 224], kwargs: {num_classes: 10}}

Leaf modules mapped: Conv2d, ConvTranspose2d (stride = kernel), BatchNorm2d, LayerNorm, ReLU, ReLU6,
GELU/SiLU/Tanh/Sigmoid/Hardswish/Hardsigmoid, MaxPool2d, AvgPool2d, AdaptiveAvgPool2d, Linear, Dropout, Flatten,
Identity, MultiheadAttention (self-attention: the fused scaled-dot-product kernel it calls, or under
``training.attention: standard`` the math path with the scores materialised). Functions: residual adds (tensor + tensor, or a
learned tensor such as position embeddings), ``torch.cat`` (a learned token before a sequence too),
views (flatten, view, reshape, permute, transpose, contiguous, indexing; ``x[:, 0]`` keeps the
whole storage alive), ReLU/GELU/tanh/sigmoid, pooling and dropout in functional form, a feature map
times a per-channel gate (squeeze-and-excitation), torchvision's ``stochastic_depth`` (left out, as
the catalog's MBConv leaves it). Nodes that
make no tensor (``x.shape``, output tuples) are skipped. Anything else — a model that does not
trace, an unknown module kind or operation — is refused with one ConfigError naming the layer.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import math
import operator
from dataclasses import replace
from typing import Any, ClassVar, Literal

from pydantic import Field, PositiveInt

from simulator.errors import ConfigError
from workloads.graph import ShardShape
from workloads.layer_graph import LayerGraph
from workloads.networks.builder import NetBuilder, Tensor
from workloads.networks.spec import NetworkSpec, refuse_split

TORCHVISION_INPUTS = {"inception_v3": [3, 299, 299]}
# No weights are made on the meta device; these models warn that their default initialisation
# will change unless it is named, so it is named.
TORCHVISION_KWARGS = {"inception_v3": {"init_weights": False}, "googlenet": {"init_weights": False}}
DEFAULT_IMAGE = [3, 224, 224]


class TorchModelSpec(NetworkSpec):
    """A PyTorch module from ``torch`` ("pkg.module:callable" or "torchvision:NAME"), called with
    ``kwargs``, fed samples of ``input_shape`` (without the batch dimension)."""

    family: Literal["torch"] = "torch"
    name: str = ""
    torch: str = Field(min_length=1)
    input_shape: tuple[PositiveInt, ...] = Field(min_length=1)   # per sample, no batch dimension (bounded: spec.py)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    sample: ClassVar[str] = "image"

    def model_post_init(self, context: Any) -> None:
        if not self.name:
            object.__setattr__(self, "name", self.torch.split(":")[-1])

    def __hash__(self) -> int:
        """Hashable as the catalog's specs are (the simulator caches by model spec): the pydantic
        hash of a frozen model hashes every field, and ``kwargs`` is a dict, so it goes in as its
        canonical JSON."""
        return hash((self.name, self.torch, self.input_shape, json.dumps(self.kwargs, sort_keys=True, default=repr)))

    @property
    def seq_length(self) -> int | None:
        return None if len(self.input_shape) == 3 else self.input_shape[0]

    def trace_key(self) -> tuple:
        """What the traced module depends on: the callable, its ``kwargs`` and the input shape (not
        the micro-batch: shapes are propagated at batch 2 and mapped at any micro-batch)."""
        return (self.torch, self.input_shape, json.dumps(self.kwargs, sort_keys=True, default=repr))

    def layer_graph(self, shard: ShardShape) -> LayerGraph:
        """The traced module's layers at ``shard``'s micro-batch and activation precision. The module
        is built and traced once per process for each :meth:`trace_key` (:func:`traced_module`), and
        each micro-batch's graph is kept beside it: a search or sweep builds a new spec per layout,
        all with the same key, and its workers fork from the process that traced it (0.18 CPU-s a
        trace of ResNet-50, 7 ms a mapping)."""
        refuse_split(self.name, shard)
        key = (self.trace_key(), self.name, shard.micro_batch, shard.act_bytes, shard.flash_attention)
        graph = _GRAPHS.get(key)
        if graph is None:
            traced = traced_module(self)
            sample = "image" if len(self.input_shape) == 3 else "sequence"
            net = NetBuilder(self.name, shard.micro_batch, shard.act_bytes, sample, self.seq_length, shard)
            _Mapper(net, traced, _torch()).run()
            graph = _GRAPHS[key] = net.output()
        return graph

    def _module(self):
        torch = _torch()
        factory = load_callable(self.torch)
        try:
            try:
                with torch.device("meta"):
                    module = factory(**self.kwargs)
            except NotImplementedError as exc:
                if "meta tensor" not in str(exc):
                    raise
                with _weights_on_meta(torch):  # the constructor computes with tensors (RegNet's widths)
                    module = factory(**self.kwargs)
        except Exception as exc:  # the user's code: any failure is a bad model reference
            # the first line only: torch's C++ errors carry their stack (`kwargs: {width_per_group: 10**30}` printed
            # 60 lines of frames after "Overflow when unpacking long long")
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise ConfigError("model.torch", f"{self.torch}(**kwargs) failed: {type(exc).__name__}: {first}") from None
        if not isinstance(module, torch.nn.Module):
            raise ConfigError("model.torch", f"{self.torch} returned {type(module).__name__}, not a torch.nn.Module")
        return module.train()


@contextlib.contextmanager
def _weights_on_meta(torch):
    """Build a module on the CPU with its parameters and buffers moved to the meta device as they are
    registered (the technique of Hugging Face accelerate's ``init_empty_weights``), for constructors
    that compute with tensors and read their values (torchvision's RegNet derives its stage widths
    with ``torch.arange(...).tolist()``, which the meta device cannot answer). Each weight is
    allocated uninitialised on the CPU for a moment, one at a time; its initialisation runs on meta."""
    module_class = torch.nn.Module
    register_parameter, register_buffer = module_class.register_parameter, module_class.register_buffer

    def parameter_on_meta(self, name, param):
        if param is not None and param.device.type != "meta":
            param = type(param)(param.to("meta"), requires_grad=param.requires_grad)
        register_parameter(self, name, param)

    def buffer_on_meta(self, name, tensor, persistent=True):
        register_buffer(self, name, None if tensor is None else tensor.to("meta"), persistent)

    module_class.register_parameter, module_class.register_buffer = parameter_on_meta, buffer_on_meta
    try:
        yield
    finally:
        module_class.register_parameter, module_class.register_buffer = register_parameter, register_buffer


def torchvision_spec(ref: str) -> TorchModelSpec:
    """``torchvision:NAME`` with torchvision's input size for that model: the crop size of its default
    weights' transforms where torchvision documents one (EfficientNet-B4: 380), else
    :data:`TORCHVISION_INPUTS` or 224 (also where torchvision is missing: the import error comes
    when the graph is built)."""
    name = ref.split(":", 1)[1]
    shape = TORCHVISION_INPUTS.get(name, DEFAULT_IMAGE)
    crop = _torchvision_crop_size(name)
    if crop is not None:
        shape = [3, crop, crop]
    return TorchModelSpec(name=name, torch=ref, input_shape=tuple(shape), kwargs=TORCHVISION_KWARGS.get(name, {}))


def _torchvision_crop_size(name: str) -> int | None:
    """The square crop of torchvision's default weights for model ``name`` (None: not documented)."""
    try:
        transforms = import_torchvision().models.get_model_weights(name).DEFAULT.transforms
        crop = transforms.keywords["crop_size"]
    except Exception:  # noqa: BLE001 - no torchvision, an unknown name, weights without a crop: the default
        return None
    return int(crop) if isinstance(crop, int) else None


def _torch():
    try:
        import torch
        import torch.fx  # noqa: F401
    except ImportError:
        raise ConfigError("model.torch", "importing a PyTorch model needs torch (pip install 'clustersim[torch]')") \
            from None
    return torch


# torchvision 0.28 registers fake (meta) kernels for two of its C++ operators unconditionally
# (``_meta_registrations.py``: ``register_fake("torchvision::nms")`` and ``"torchvision::qnms"``), while
# every other registration waits for ``extension._has_ops()``. Where its C++ extension cannot load --
# the torchvision 0.28 wheel on PyPI is the CUDA build (its ``_C.so`` links ``libc10_cuda.so``) and a
# CPU torch has no CUDA libraries -- ``import torchvision`` then fails, though building a model needs
# none of those operators. Declaring the two schemas lets torchvision import as it does when its
# extension is missing (``_has_ops()`` False: its detection ops raise, the models work).
_TORCHVISION_FAKE_OPS = ("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
                         "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
_torchvision_schemas = None  # the torch.library.Library that declares them, kept alive


def import_torchvision():
    """``import torchvision``, also where its C++ extension does not load (see above)."""
    global _torchvision_schemas
    try:
        return importlib.import_module("torchvision")
    except RuntimeError as exc:
        if "torchvision::" not in str(exc) or _torchvision_schemas is not None:
            raise
    import sys
    torch = _torch()
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]  # the half-imported package, imported again below
    _torchvision_schemas = torch.library.Library("torchvision", "FRAGMENT")
    for schema in _TORCHVISION_FAKE_OPS:
        op_name = schema.split("(", 1)[0]
        if not hasattr(torch.ops.torchvision, op_name):
            _torchvision_schemas.define(schema)
    return importlib.import_module("torchvision")


def load_callable(ref: str):
    """The callable named by "pkg.module:callable" or "torchvision:NAME"."""
    if ref.startswith("torchvision:"):
        module_name, attr = "torchvision.models", ref.split(":", 1)[1]
    elif ":" in ref:
        module_name, attr = ref.split(":", 1)
    else:
        raise ConfigError("model.torch", f"{ref!r}: expected 'pkg.module:callable' or 'torchvision:NAME'")
    try:
        if module_name.split(".")[0] == "torchvision":
            import_torchvision()
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or a broken install raising anything at import
        hint = " (pip install 'clustersim[torch]')" if module_name.startswith("torchvision") else ""
        raise ConfigError("model.torch", f"cannot import {module_name}{hint}: {type(exc).__name__}: {exc}") from None
    target = getattr(module, attr, None)
    if not callable(target):
        raise ConfigError("model.torch", f"{module_name} has no callable {attr!r}")
    return target


#: Traced modules of this process by :meth:`TorchModelSpec.trace_key` (a torch.fx GraphModule on the
#: meta device, its nodes' shapes propagated), and the layer graphs mapped from them by (trace key,
#: name, micro-batch, activation bytes). Values, never changed once stored; a process forked after
#: they were filled (a search's or sweep's workers) shares them.
_TRACED: dict[tuple, Any] = {}
_GRAPHS: dict[tuple, LayerGraph] = {}


def traced_module(spec: TorchModelSpec):
    """``spec``'s module built on the meta device, traced and its shapes propagated, once per process
    for each :meth:`TorchModelSpec.trace_key` (a failure is raised each time, never kept)."""
    key = spec.trace_key()
    traced = _TRACED.get(key)
    if traced is None:
        traced = _TRACED[key] = trace(spec._module(), spec.input_shape, spec.torch)
    return traced


def trace(module, input_shape: tuple[int, ...], ref: str):
    """``module`` traced by torch.fx with every node's shape propagated on the meta device (batch 2)."""
    torch = _torch()
    try:
        traced = torch.fx.symbolic_trace(module)
    except Exception as exc:  # data-dependent control flow, unsupported Python
        raise ConfigError("model.torch", f"{ref}: cannot be traced by torch.fx: {type(exc).__name__}: "
                                         f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    prop = _named_shape_prop(traced)
    try:
        sample = torch.empty(2, *input_shape, device="meta")  # inside: a shape past int64 is the input's fault
        # ShapeProp prints the failing node's traceback to stderr before it raises: keep it off the user's screen
        with contextlib.redirect_stderr(io.StringIO()):
            prop.propagate(sample)
    except Exception as exc:
        cause = exc.__cause__ or exc
        first = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
        at = f" at layer {prop.node}" if prop.node else ""
        raise ConfigError("model.input_shape", f"{ref}: input {list(input_shape)} does not run through the "
                                               f"model{at}: {type(cause).__name__}: {first}") from None
    return traced


def _named_shape_prop(traced):
    """torch.fx's ShapeProp that remembers the node it was running (to name the layer that fails)."""
    from torch.fx.passes.shape_prop import ShapeProp

    class Prop(ShapeProp):
        node = ""

        def run_node(self, n):
            self.node = str(n.target) if n.op == "call_module" else n.name
            return super().run_node(n)

    return Prop(traced)


class _Mapper:
    """Walks the traced graph node by node (see the module docstring)."""

    def __init__(self, net: NetBuilder, traced, torch):
        self.net = net
        self.traced = traced
        self.torch = torch
        self.nn = torch.nn
        self.F = torch.nn.functional
        self.values: dict[str, Any] = {}   # node name -> Tensor, _Param, tuple of those, or None
        self.names: set[str] = set()
        self.parameters = {name for name, _ in traced.named_parameters()}

    def run(self) -> None:
        for node in self.traced.graph.nodes:
            self.values[node.name] = self._visit(node)

    # -- helpers ----------------------------------------------------------------------------------

    def _layer_name(self, node) -> str:
        base = str(node.target) if node.op == "call_module" else node.name
        name = base if base not in self.names else node.name
        self.names.add(name)
        return name

    def _shape(self, node) -> tuple[int, ...] | None:
        meta = node.meta.get("tensor_meta")
        if not hasattr(meta, "shape"):  # no tensor, or a tuple of them
            return None
        return tuple(int(d) for d in meta.shape[1:])

    def _arg(self, value):
        if hasattr(value, "name") and hasattr(value, "op"):  # an fx Node
            return self.values.get(value.name)
        if isinstance(value, (list, tuple)):
            return type(value)(self._arg(v) for v in value)
        return value

    def _tensor(self, node, value, where: str) -> Tensor:
        got = self._arg(value)
        if not isinstance(got, Tensor):
            raise ConfigError(f"model.layers.{where}", f"expects an activation as input, got {type(got).__name__} "
                                                       f"from {value}")
        return got

    def _unknown(self, node, what: str) -> ConfigError:
        return ConfigError(f"model.layers.{node.target if node.op == 'call_module' else node.name}", what)

    # -- nodes ------------------------------------------------------------------------------------

    def _visit(self, node):
        if node.op == "placeholder":
            if self.values:
                raise self._unknown(node, "a second model input; only one input tensor is supported")
            return self.net.input(*self._shape(node))
        if node.op == "get_attr":
            shape = tuple(int(d) for d in node.meta["tensor_meta"].shape)
            learned = node.target in self.parameters
            return _Param(shape, _numel(shape) if learned else 0)
        if node.op == "output":
            return None
        if node.op == "call_module":
            return self._module(node, self.traced.get_submodule(node.target))
        if node.op in ("call_function", "call_method"):
            return self._function(node)
        raise self._unknown(node, f"unsupported graph node {node.op}")

    def _module(self, node, m):
        nn, net = self.nn, self.net
        name = self._layer_name(node)
        x = self._tensor(node, node.args[0], name) if node.args else None
        if isinstance(m, nn.Conv2d):
            if m.stride[0] != m.stride[1] or m.dilation != (1, 1) or m.padding_mode != "zeros" or isinstance(m.padding, str):
                raise self._unknown(node, "Conv2d with unequal strides, dilation, a padding mode or string padding is "
                                          "not supported")
            return net.conv2d(name, x, m.out_channels, m.kernel_size, stride=m.stride[0], padding=m.padding,
                              groups=m.groups, bias=m.bias is not None)
        if isinstance(m, nn.ConvTranspose2d):
            if m.stride != m.kernel_size or m.padding != (0, 0) or m.kernel_size[0] != m.kernel_size[1]:
                raise self._unknown(node, "ConvTranspose2d is supported with stride = square kernel, no padding")
            return net.conv_transpose2d(name, x, m.out_channels, m.kernel_size[0], m.stride[0], m.bias is not None)
        if isinstance(m, nn.BatchNorm2d):
            return net.batchnorm(name, x)
        if isinstance(m, nn.LayerNorm):
            return net.layernorm(name, x)
        if isinstance(m, nn.ReLU):
            return net.relu(name, x, inplace=m.inplace)
        for kind, function in ((nn.GELU, "gelu"), (nn.SiLU, "silu"), (nn.Tanh, "tanh"), (nn.Sigmoid, "sigmoid"),
                               (nn.Hardswish, "hardswish"), (nn.Hardsigmoid, "hardsigmoid"),
                               (nn.ReLU6, "relu6")):  # hardtanh(0, 6) saves its input even in place (autograd)
            if isinstance(m, kind):
                return net.activation(name, x, function)
        if isinstance(m, nn.MaxPool2d):
            return self._pool(node, name, x, "max", m.kernel_size, m.stride, m.padding, m.ceil_mode, m.dilation)
        if isinstance(m, nn.AvgPool2d):
            return self._pool(node, name, x, "avg", m.kernel_size, m.stride, m.padding, m.ceil_mode, 1)
        if isinstance(m, nn.AdaptiveAvgPool2d):
            return self._adaptive(node, name, x, m.output_size)
        if isinstance(m, nn.Linear):
            return net.linear(name, x, m.out_features, bias=m.bias is not None)
        if isinstance(m, nn.Dropout):
            return net.dropout(name, x, m.p)
        if isinstance(m, nn.Flatten):
            return self._view(node, name, x)
        if isinstance(m, nn.Identity):
            return x
        if isinstance(m, nn.MultiheadAttention):
            if not (node.args[0] is node.args[1] is node.args[2]) or not m._qkv_same_embed_dim:
                raise self._unknown(node, "MultiheadAttention is supported as self-attention (query = key = value)")
            if not m.batch_first:
                raise self._unknown(node, "MultiheadAttention is supported with batch_first=True")
            return (net.self_attention(name, x, m.num_heads, dropout=m.dropout), None)
        raise self._unknown(node, f"unknown module kind {type(m).__name__}")

    def _pool(self, node, name, x, kind, kernel, stride, padding, ceil_mode, dilation):
        def one(v):
            if isinstance(v, (tuple, list)):
                if len(set(v)) != 1:
                    raise self._unknown(node, f"{kind} pooling with unequal sizes {v} is not supported")
                return v[0]
            return v
        if one(dilation) != 1:
            raise self._unknown(node, "dilated pooling is not supported")
        kernel, padding = one(kernel), one(padding)
        stride = one(stride) if stride else kernel
        if kind == "max":
            return self.net.maxpool(name, x, kernel, stride, padding, ceil_mode)
        return self.net.avgpool(name, x, kernel, stride, padding, ceil_mode)

    def _adaptive(self, node, name, x, size):
        sizes = size if isinstance(size, (tuple, list)) else (size, size)
        if len(set(sizes)) != 1 or sizes[0] is None:
            raise self._unknown(node, f"adaptive pooling to {size} is not supported (square sizes only)")
        return self.net.adaptive_avgpool(name, x, int(sizes[0]))

    def _view(self, node, name, x):
        shape = self._shape(node)
        if shape == x.shape:
            return x
        out = Tensor(shape, name, x.storage, max(x.storage_numel, x.numel))
        return self.net._layer(name, "flatten", [x], out, [], [], 0.0)

    VIEWS: ClassVar[set[str]] = {"flatten", "view", "reshape", "permute", "transpose", "contiguous", "squeeze",
                                 "unsqueeze", "expand", "__getitem__", "swapaxes"}

    def _function(self, node):
        torch, F = self.torch, self.F
        target = node.target
        shape = self._shape(node)
        label = target if isinstance(target, str) else getattr(target, "__name__", str(target))
        if shape is None:  # makes no tensor (x.shape, sizes, output tuples) or a tuple of views
            if target is operator.getitem and isinstance(self._arg(node.args[0]), tuple):
                return self._arg(node.args[0])[node.args[1]]
            if label in ("chunk", "split", "unbind") and isinstance(self._arg(node.args[0]), Tensor):
                return self._pieces(node, self._arg(node.args[0]))
            return None
        args = [self._arg(a) for a in node.args]
        if target is operator.getitem and isinstance(args[0], tuple):
            return args[0][node.args[1]]
        if label in ("add", "iadd", "add_", "__add__", "__iadd__"):
            return self._add(node, args, inplace=label in ("iadd", "add_", "__iadd__"))
        if label in ("mul", "__mul__") and len(args) == 2 and all(isinstance(a, Tensor) for a in args):
            return self._scale(node, args)
        if label in ("mul", "__mul__") and len(args) == 2 and {type(a) for a in args} == {Tensor, _Param}:
            x, p = args if isinstance(args[0], Tensor) else args[::-1]
            return self.net.scale_parameter(self._layer_name(node), x, p.params)
        if label == "stochastic_depth":  # torchvision.ops: a per-sample scale of a residual branch, left out
            return args[0]               # as the catalog's MBConv leaves it out (workloads/networks/blocks.py)
        if target is torch.cat or label == "cat":
            return self._cat(node, args, node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else 0))
        if label in ("mul", "__mul__", "truediv", "div") and len(args) == 2 and isinstance(args[0], Tensor) \
                and isinstance(args[1], (int, float)):
            return self.net.scale_constant(self._layer_name(node), args[0])
        if label == "einsum":
            return self._einsum(node, args)
        if target is F.softmax or label == "softmax":
            return self.net.softmax(self._layer_name(node), self._tensor(node, node.args[0], node.name))
        if label == "shifted_window_attention":
            return self._window_attention(node, args)
        if label == "_patch_merging_pad":  # Swin's patch merging: 2x2 neighbours gathered into channels
            return self.net.patch_merging(self._layer_name(node), self._tensor(node, node.args[0], node.name), shape)
        if isinstance(args[0], _Param) and all(not isinstance(a, Tensor) for a in args):
            # an operation on learned tensors alone (expand the class token, gather a bias table)
            return _Param(shape, sum(a.params for a in args if isinstance(a, _Param)))
        name = self._layer_name(node)
        x = args[0]
        if not isinstance(x, Tensor):
            raise self._unknown(node, f"unsupported operation {label} on {type(x).__name__}")
        if label in ("reshape", "flatten") and shape != x.shape and not self._reshape_is_view(node):
            return self.net.copy(name, x, shape)   # a strided view copied into a new storage
        if label == "contiguous" and not _is_contiguous(node.args[0], self.net.batch):
            return self.net.copy(name, x, shape)
        if target is F.layer_norm or label == "layer_norm":
            return self._layer_norm(node, name, x, args)
        if label == "mean":
            return self.net.mean(name, x, shape)
        if target is operator.getitem:
            index = node.args[1]
            if isinstance(index, tuple) and len(index) == 2 and index[0] == slice(None) and isinstance(index[1], int):
                return self.net.select_token(name, x, index[1])
            return self._view(node, name, x)
        if target is torch.flatten or label in self.VIEWS:
            return self._view(node, name, x)
        if target in (F.relu, torch.relu) or label in ("relu", "relu_"):
            return self.net.relu(name, x, inplace=bool(node.kwargs.get("inplace", label == "relu_")))
        for function, names in (("gelu", (F.gelu,)), ("silu", (F.silu,)), ("tanh", (torch.tanh,)),
                                ("sigmoid", (torch.sigmoid,))):
            if target in names or label == function:
                return self.net.activation(name, x, function)
        kw = dict(zip(("kernel_size", "stride", "padding"), node.args[1:4], strict=False)) | dict(node.kwargs)
        if target is F.max_pool2d or label in ("max_pool2d", "boolean_dispatch"):
            return self._pool(node, name, x, "max", kw["kernel_size"], kw.get("stride"), kw.get("padding", 0),
                              kw.get("ceil_mode", False), kw.get("dilation", 1))
        if target is F.avg_pool2d or label == "avg_pool2d":
            return self._pool(node, name, x, "avg", kw["kernel_size"], kw.get("stride"), kw.get("padding", 0),
                              kw.get("ceil_mode", False), 1)
        if target is F.adaptive_avg_pool2d or label == "adaptive_avg_pool2d":
            return self._adaptive(node, name, x, node.args[1] if len(node.args) > 1 else node.kwargs["output_size"])
        if target is F.dropout or label == "dropout":
            p = node.kwargs.get("p", node.args[1] if len(node.args) > 1 else 0.5)
            training = node.kwargs.get("training", node.args[2] if len(node.args) > 2 else True)
            return self.net.dropout(name, x, p if training else 0.0)
        raise self._unknown(node, f"unsupported operation {label}")

    def _window_attention(self, node, args) -> Tensor:
        """torchvision's ``shifted_window_attention`` (Swin V1; V2's cosine attention is refused)."""
        names = ("input", "qkv_weight", "proj_weight", "relative_position_bias", "window_size", "num_heads",
                 "shift_size", "attention_dropout", "dropout", "qkv_bias", "proj_bias", "logit_scale", "training")
        kw = dict(zip(names, args, strict=False)) | {k: self._arg(v) for k, v in node.kwargs.items()}
        name = self._layer_name(node)
        x = kw["input"]
        if not isinstance(x, Tensor) or len(x.shape) != 3:
            raise self._unknown(node, "window attention expects a (H, W, C) activation")
        if kw.get("logit_scale") is not None:
            raise self._unknown(node, "Swin V2's cosine window attention (logit_scale) is not supported")
        if kw.get("training", True) and (kw.get("attention_dropout") or kw.get("dropout")):
            raise self._unknown(node, "window attention with dropout is not supported")
        table = kw.get("relative_position_bias")
        return self.net.window_attention(name, x, int(kw["num_heads"]), tuple(kw["window_size"]),
                                         tuple(kw["shift_size"]), isinstance(kw.get("qkv_bias"), _Param),
                                         isinstance(kw.get("proj_bias"), _Param),
                                         table.params if isinstance(table, _Param) else 0)

    def _einsum(self, node, args) -> Tensor:
        """``einsum`` of two activations with a shared batch prefix (attention's "...ID,...JD->...IJ" and
        "...IJ,...JD->...ID"): batched GEMMs; an operand that is not a contiguous (batch, rows, cols)
        block is copied for the GEMM and the copy is saved."""
        equation = args[0].replace(" ", "")
        operands = args[1:] if len(args) > 2 else args[1]
        inputs, output = equation.split("->")
        left, right = inputs.split(",")
        a, b = operands
        if not (isinstance(a, Tensor) and isinstance(b, Tensor)):
            raise self._unknown(node, "einsum is supported on two activations")
        sizes = {**dict(zip(left, (0, *a.shape), strict=True)), **dict(zip(right, (0, *b.shape), strict=True))}
        shared = [c for c in output if c in left and c in right]
        m_dims = [c for c in output if c in left and c not in right]
        n_dims = [c for c in output if c in right and c not in left]
        k_dims = [c for c in left if c in right and c not in output]
        if left[:len(shared)] != "".join(shared) or right[:len(shared)] != "".join(shared) or len(m_dims) != 1 \
                or len(n_dims) != 1 or len(k_dims) != 1:
            raise self._unknown(node, f"einsum {args[0]!r}: supported as a batched matrix product")
        m, n, k = sizes[m_dims[0]], sizes[n_dims[0]], sizes[k_dims[0]]
        batch = math.prod(sizes[c] for c in shared[1:])
        name = self._layer_name(node)
        saved = []
        for arg, operand, letters in ((node.args[1] if len(args) > 2 else node.args[1][0], a, left),
                                      (node.args[2] if len(args) > 2 else node.args[1][1], b, right)):
            if self._batch_dims_merge(arg, [letters.index(c) for c in shared]):
                saved.append(operand)   # the GEMM reads a view: the operand's own storage is saved
            else:
                saved.append(self.net.input(*operand.shape))  # a copy: a storage of its own
        return self.net.batched_matmul(name, a, b, m, n, k, batch, saved[0], saved[1], self._shape(node))

    def _reshape_is_view(self, node) -> bool:
        """Whether ``reshape``/``flatten`` at node returns a view (ATen ``computeStride``, TensorUtils.cpp: each
        run of input dimensions that are contiguous with each other splits or merges freely)."""
        meta, out = node.args[0].meta.get("tensor_meta"), node.meta["tensor_meta"]
        if not hasattr(meta, "stride"):
            return True
        old = [self.net.batch, *(int(d) for d in meta.shape[1:])]
        stride = [int(d) for d in meta.stride]
        new = [self.net.batch, *(int(d) for d in out.shape[1:])]
        view_d, base, tensor_numel, view_numel = len(new) - 1, stride[-1], 1, 1
        for d in reversed(range(len(old))):
            tensor_numel *= old[d]
            if d == 0 or (old[d - 1] != 1 and stride[d - 1] != tensor_numel * base):
                while view_d >= 0 and (view_numel < tensor_numel or new[view_d] == 1):
                    view_numel *= new[view_d]
                    view_d -= 1
                if view_numel != tensor_numel:
                    return False
                if d > 0:
                    base, tensor_numel, view_numel = stride[d - 1], 1, 1
        return view_d == -1

    def _batch_dims_merge(self, arg, dims: list[int]) -> bool:
        """Whether dimensions ``dims`` of fx node ``arg`` (the first the batch, at this graph's micro-batch)
        merge into one as a view (``reshape`` without a copy; dimensions of size 1 ignored)."""
        meta = arg.meta.get("tensor_meta")
        sizes = [self.net.batch, *(int(d) for d in meta.shape[1:])]
        kept = [(sizes[d], int(meta.stride[d])) for d in dims if sizes[d] != 1]
        return all(stride == kept[i + 1][1] * kept[i + 1][0] for i, (_, stride) in enumerate(kept[:-1]))

    def _pieces(self, node, x: Tensor) -> tuple[Tensor, ...]:
        """``chunk``/``split``/``unbind``: views of one storage (whoever saves one keeps it all)."""
        metas = node.meta.get("tensor_meta")
        if not isinstance(metas, (list, tuple)) or not all(hasattr(m, "shape") for m in metas):
            raise self._unknown(node, f"{node.target} does not make tensors")
        total, pieces, base = max(x.storage_numel, x.numel), [], self._layer_name(node)
        for i, meta in enumerate(metas):
            name = f"{base}.{i}"
            out = Tensor(tuple(int(d) for d in meta.shape[1:]), name, x.storage, total)
            pieces.append(self.net._layer(name, "flatten", [x], out, [], [], 0.0))
            self.net.layers[-1] = replace(self.net.layers[-1], piece_of=base)  # one reader of x with its siblings
        return tuple(pieces)

    def _layer_norm(self, node, name: str, x: Tensor, args) -> Tensor:
        """``F.layer_norm(x, (C,), weight, bias)`` over the last dimension, learned scale and shift."""
        kw = dict(zip(("normalized_shape", "weight", "bias"), node.args[1:4], strict=False)) | dict(node.kwargs)
        normalized = tuple(kw.get("normalized_shape") or ())
        weight, bias = self._arg(kw.get("weight")), self._arg(kw.get("bias"))
        if normalized != x.shape[-1:] or not (isinstance(weight, _Param) and isinstance(bias, _Param)):
            raise self._unknown(node, f"layer_norm over {list(normalized)} of {list(x.shape)}: supported over the "
                                      "last dimension with a learned weight and bias")
        return self.net.layernorm(name, x)

    def _add(self, node, args, inplace: bool):
        a, b = args[0], args[1]
        name = self._layer_name(node)
        if isinstance(a, Tensor) and isinstance(b, Tensor):
            return self.net.add(name, a, b, inplace=inplace)
        if isinstance(a, Tensor) and isinstance(b, _Param) or isinstance(b, Tensor) and isinstance(a, _Param):
            x, p = (a, b) if isinstance(a, Tensor) else (b, a)
            return self.net.add_parameter(name, x, params=p.params)
        raise self._unknown(node, "adds something other than activations and learned tensors")

    def _scale(self, node, args):
        """``x * gate`` with a per-channel gate (C, 1, 1), either operand first (squeeze-and-excitation)."""
        a, b = args
        x, gate = (a, b) if b.shape == (a.shape[0], 1, 1) else (b, a)
        if gate.shape != (x.shape[0], 1, 1) or len(x.shape) != 3:
            raise self._unknown(node, f"multiplies {list(a.shape)} by {list(b.shape)}: only a per-channel gate "
                                      "(C, 1, 1) times a feature map is supported")
        return self.net.scale(self._layer_name(node), x, gate)

    def _cat(self, node, args, dim: int):
        parts = args[0]
        name = self._layer_name(node)
        dim = dim - 1 if dim > 0 else dim + len(self._shape(node)) if dim < 0 else None
        if dim is None:
            raise self._unknown(node, "concatenates along the batch dimension")
        tensors = [p for p in parts if isinstance(p, Tensor)]
        learned = [p for p in parts if isinstance(p, _Param)]
        if len(tensors) + len(learned) != len(parts) or not tensors:
            raise self._unknown(node, "concatenates something other than activations and learned tensors")
        if learned:
            if len(parts) != 2 or not isinstance(parts[0], _Param) or dim != 0:
                raise self._unknown(node, "a learned tensor is supported only as a token before a sequence")
            return self.net.prepend_token(name, tensors[0])
        return self.net.concat(name, tensors, dim)


class _Param:
    """A learned tensor met in the graph (``get_attr``), or one computed from learned tensors alone;
    ``params``: the learned elements it comes from (0 for a buffer)."""

    def __init__(self, shape: tuple[int, ...], params: int):
        self.shape = shape
        self.params = params


def _is_contiguous(arg, batch: int) -> bool:
    """Whether the fx node ``arg`` holds a contiguous tensor at micro-batch ``batch`` (size-1 dimensions
    ignored, as ``Tensor.is_contiguous``); True where shape propagation recorded no strides."""
    meta = getattr(arg, "meta", {}).get("tensor_meta")
    if not hasattr(meta, "stride") or meta.stride is None:
        return True
    expected = 1
    sizes = [batch, *(int(d) for d in meta.shape[1:])]
    for size, stride in reversed(list(zip(sizes, meta.stride, strict=True))):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
