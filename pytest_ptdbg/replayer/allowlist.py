"""The reviewed table of replayable APIs, and the tables that turn tags into torch values.

Each entry maps an API family as dumps name it (``Functional_softmax``, ``Tensor_add_``,
``Torch__foreach_mul_``, ``VF_lstm``) to a resolver written out by hand (``lambda: F.softmax``):
nothing here is computed from ``dir(torch)``, from capture's name table or from a file. An API
that is not in the table is not replayed. What is deliberately absent: I/O (``save``, ``load``,
``from_file``), library loading, global-state setters (``manual_seed``, ``set_default_dtype``,
``set_grad_enabled``, ``use_deterministic_algorithms``...), ``compile``, random generators and
``empty*`` (their values cannot be replayed; dropout replays with the saved generator state),
methods that do anything but math (``apply_``, ``map_``, ``register_hook``, ``backward``,
``numpy``, ``tolist``, ``storage``, ``data_ptr``, ``share_memory_``, ``pin_memory``, device
moves such as ``cuda``), collectives, ``torch.ops`` (Aten) and ``torch_npu`` calls.

To add an API: one line in the table of its type, the callable written out explicitly; if it
takes a string parameter, a rule in :data:`STRING_RULES`. ``tests/bad_input/test_replay_safety.py``
checks that every entry resolves and that its qualified name names the same callable.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, FrozenSet, Mapping, Optional, Tuple

import torch
import torch.nn.functional as F

from pytest_ptdbg.errors import ReplayRefused

__all__ = ["Entry", "entry", "resolve", "qualified_name", "StringRule", "string_rule", "DEVICE",
           "dtype_of", "layout_of", "memory_format_of", "dtype_names", "REPLAYABLE"]

Resolver = Callable[[], Callable[..., Any]]

# ------------------------------------------------------------------------------------------ APIs

#: Torch_<name>: functions of the ``torch`` namespace
_TORCH: Dict[str, Resolver] = {
    # linear algebra
    "matmul": lambda: torch.matmul,
    "mm": lambda: torch.mm,
    "bmm": lambda: torch.bmm,
    "mv": lambda: torch.mv,
    "dot": lambda: torch.dot,
    "outer": lambda: torch.outer,
    "addmm": lambda: torch.addmm,
    "addmv": lambda: torch.addmv,
    "addbmm": lambda: torch.addbmm,
    "baddbmm": lambda: torch.baddbmm,
    "einsum": lambda: torch.einsum,
    "tensordot": lambda: torch.tensordot,
    # convolution, normalisation, activations
    "conv1d": lambda: torch.conv1d,
    "conv2d": lambda: torch.conv2d,
    "conv3d": lambda: torch.conv3d,
    "conv_transpose1d": lambda: torch.conv_transpose1d,
    "conv_transpose2d": lambda: torch.conv_transpose2d,
    "batch_norm": lambda: torch.batch_norm,
    "layer_norm": lambda: torch.layer_norm,
    "group_norm": lambda: torch.group_norm,
    "rms_norm": lambda: torch.rms_norm,
    "embedding": lambda: torch.embedding,
    "dropout": lambda: torch.dropout,
    "softmax": lambda: torch.softmax,
    "log_softmax": lambda: torch.log_softmax,
    "relu": lambda: torch.relu,
    "sigmoid": lambda: torch.sigmoid,
    "tanh": lambda: torch.tanh,
    # element-wise arithmetic
    "add": lambda: torch.add,
    "sub": lambda: torch.sub,
    "subtract": lambda: torch.subtract,
    "mul": lambda: torch.mul,
    "multiply": lambda: torch.multiply,
    "div": lambda: torch.div,
    "divide": lambda: torch.divide,
    "true_divide": lambda: torch.true_divide,
    "floor_divide": lambda: torch.floor_divide,
    "remainder": lambda: torch.remainder,
    "fmod": lambda: torch.fmod,
    "neg": lambda: torch.neg,
    "abs": lambda: torch.abs,
    "sign": lambda: torch.sign,
    "pow": lambda: torch.pow,
    "square": lambda: torch.square,
    "exp": lambda: torch.exp,
    "exp2": lambda: torch.exp2,
    "expm1": lambda: torch.expm1,
    "log": lambda: torch.log,
    "log2": lambda: torch.log2,
    "log10": lambda: torch.log10,
    "log1p": lambda: torch.log1p,
    "sqrt": lambda: torch.sqrt,
    "rsqrt": lambda: torch.rsqrt,
    "reciprocal": lambda: torch.reciprocal,
    "sin": lambda: torch.sin,
    "cos": lambda: torch.cos,
    "tan": lambda: torch.tan,
    "atan2": lambda: torch.atan2,
    "sinh": lambda: torch.sinh,
    "cosh": lambda: torch.cosh,
    "erf": lambda: torch.erf,
    "erfc": lambda: torch.erfc,
    "floor": lambda: torch.floor,
    "ceil": lambda: torch.ceil,
    "round": lambda: torch.round,
    "trunc": lambda: torch.trunc,
    "clamp": lambda: torch.clamp,
    "clip": lambda: torch.clip,
    "clamp_min": lambda: torch.clamp_min,
    "clamp_max": lambda: torch.clamp_max,
    "maximum": lambda: torch.maximum,
    "minimum": lambda: torch.minimum,
    "lerp": lambda: torch.lerp,
    "addcmul": lambda: torch.addcmul,
    "addcdiv": lambda: torch.addcdiv,
    "where": lambda: torch.where,
    "masked_fill": lambda: torch.masked_fill,
    "nan_to_num": lambda: torch.nan_to_num,
    "isnan": lambda: torch.isnan,
    "isinf": lambda: torch.isinf,
    "isfinite": lambda: torch.isfinite,
    "logical_and": lambda: torch.logical_and,
    "logical_or": lambda: torch.logical_or,
    "logical_not": lambda: torch.logical_not,
    "eq": lambda: torch.eq,
    "ne": lambda: torch.ne,
    "lt": lambda: torch.lt,
    "le": lambda: torch.le,
    "gt": lambda: torch.gt,
    "ge": lambda: torch.ge,
    # reductions, scans, ordering
    "sum": lambda: torch.sum,
    "mean": lambda: torch.mean,
    "prod": lambda: torch.prod,
    "max": lambda: torch.max,
    "min": lambda: torch.min,
    "amax": lambda: torch.amax,
    "amin": lambda: torch.amin,
    "argmax": lambda: torch.argmax,
    "argmin": lambda: torch.argmin,
    "var": lambda: torch.var,
    "std": lambda: torch.std,
    "var_mean": lambda: torch.var_mean,
    "std_mean": lambda: torch.std_mean,
    "norm": lambda: torch.norm,
    "logsumexp": lambda: torch.logsumexp,
    "cumsum": lambda: torch.cumsum,
    "cumprod": lambda: torch.cumprod,
    "all": lambda: torch.all,
    "any": lambda: torch.any,
    "topk": lambda: torch.topk,
    "sort": lambda: torch.sort,
    "argsort": lambda: torch.argsort,
    "searchsorted": lambda: torch.searchsorted,
    # shapes and indexing
    "cat": lambda: torch.cat,
    "concat": lambda: torch.concat,
    "concatenate": lambda: torch.concatenate,
    "stack": lambda: torch.stack,
    "split": lambda: torch.split,
    "chunk": lambda: torch.chunk,
    "tensor_split": lambda: torch.tensor_split,
    "unbind": lambda: torch.unbind,
    "narrow": lambda: torch.narrow,
    "flatten": lambda: torch.flatten,
    "reshape": lambda: torch.reshape,
    "squeeze": lambda: torch.squeeze,
    "unsqueeze": lambda: torch.unsqueeze,
    "transpose": lambda: torch.transpose,
    "permute": lambda: torch.permute,
    "t": lambda: torch.t,
    "flip": lambda: torch.flip,
    "roll": lambda: torch.roll,
    "gather": lambda: torch.gather,
    "scatter": lambda: torch.scatter,
    "scatter_add": lambda: torch.scatter_add,
    "index_select": lambda: torch.index_select,
    "masked_select": lambda: torch.masked_select,
    "repeat_interleave": lambda: torch.repeat_interleave,
    "tril": lambda: torch.tril,
    "triu": lambda: torch.triu,
    "meshgrid": lambda: torch.meshgrid,
    "clone": lambda: torch.clone,
    "detach": lambda: torch.detach,
    # deterministic factories (their device is the replay device)
    "zeros": lambda: torch.zeros,
    "ones": lambda: torch.ones,
    "full": lambda: torch.full,
    "zeros_like": lambda: torch.zeros_like,
    "ones_like": lambda: torch.ones_like,
    "full_like": lambda: torch.full_like,
    "arange": lambda: torch.arange,
    "linspace": lambda: torch.linspace,
    "eye": lambda: torch.eye,
    "tensor": lambda: torch.tensor,
    # optimizer helpers (AdamW/SGD with foreach=True); private, so each one listed here by hand
    "_foreach_add": lambda: torch._foreach_add,
    "_foreach_add_": lambda: torch._foreach_add_,
    "_foreach_sub": lambda: torch._foreach_sub,
    "_foreach_sub_": lambda: torch._foreach_sub_,
    "_foreach_mul": lambda: torch._foreach_mul,
    "_foreach_mul_": lambda: torch._foreach_mul_,
    "_foreach_div": lambda: torch._foreach_div,
    "_foreach_div_": lambda: torch._foreach_div_,
    "_foreach_addcmul": lambda: torch._foreach_addcmul,
    "_foreach_addcmul_": lambda: torch._foreach_addcmul_,
    "_foreach_addcdiv": lambda: torch._foreach_addcdiv,
    "_foreach_addcdiv_": lambda: torch._foreach_addcdiv_,
    "_foreach_lerp": lambda: torch._foreach_lerp,
    "_foreach_lerp_": lambda: torch._foreach_lerp_,
    "_foreach_sqrt": lambda: torch._foreach_sqrt,
    "_foreach_sqrt_": lambda: torch._foreach_sqrt_,
    "_foreach_neg": lambda: torch._foreach_neg,
    "_foreach_neg_": lambda: torch._foreach_neg_,
    "_foreach_maximum": lambda: torch._foreach_maximum,
    "_foreach_maximum_": lambda: torch._foreach_maximum_,
    "_foreach_pow": lambda: torch._foreach_pow,
    "_foreach_reciprocal_": lambda: torch._foreach_reciprocal_,
    "_foreach_norm": lambda: torch._foreach_norm,
    "_foreach_copy_": lambda: torch._foreach_copy_,
    "_foreach_zero_": lambda: torch._foreach_zero_,
    # fused optimizer kernels (AdamW/Adam/SGD with fused=True): in place on their lists (params,
    # grads, moments, step counters: data, copied for each replay); the updated params are their
    # outputs. grad_scale/found_inf are tensors or None: data too
    "_fused_adamw_": lambda: torch._fused_adamw_,
    "_fused_adam_": lambda: torch._fused_adam_,
    "_fused_sgd_": lambda: torch._fused_sgd_,
}

#: Functional_<name>: ``torch.nn.functional``
_FUNCTIONAL: Dict[str, Resolver] = {
    "linear": lambda: F.linear,
    "bilinear": lambda: F.bilinear,
    "conv1d": lambda: F.conv1d,
    "conv2d": lambda: F.conv2d,
    "conv3d": lambda: F.conv3d,
    "conv_transpose1d": lambda: F.conv_transpose1d,
    "conv_transpose2d": lambda: F.conv_transpose2d,
    "avg_pool1d": lambda: F.avg_pool1d,
    "avg_pool2d": lambda: F.avg_pool2d,
    "max_pool1d": lambda: F.max_pool1d,
    "max_pool2d": lambda: F.max_pool2d,
    "adaptive_avg_pool1d": lambda: F.adaptive_avg_pool1d,
    "adaptive_avg_pool2d": lambda: F.adaptive_avg_pool2d,
    "adaptive_max_pool2d": lambda: F.adaptive_max_pool2d,
    "batch_norm": lambda: F.batch_norm,
    "layer_norm": lambda: F.layer_norm,
    "group_norm": lambda: F.group_norm,
    "instance_norm": lambda: F.instance_norm,
    "rms_norm": lambda: F.rms_norm,
    "normalize": lambda: F.normalize,
    "softmax": lambda: F.softmax,
    "log_softmax": lambda: F.log_softmax,
    "softmin": lambda: F.softmin,
    "gelu": lambda: F.gelu,
    "relu": lambda: F.relu,
    "relu6": lambda: F.relu6,
    "leaky_relu": lambda: F.leaky_relu,
    "elu": lambda: F.elu,
    "selu": lambda: F.selu,
    "silu": lambda: F.silu,
    "mish": lambda: F.mish,
    "hardswish": lambda: F.hardswish,
    "hardsigmoid": lambda: F.hardsigmoid,
    "hardtanh": lambda: F.hardtanh,
    "sigmoid": lambda: F.sigmoid,
    "tanh": lambda: F.tanh,
    "softplus": lambda: F.softplus,
    "logsigmoid": lambda: F.logsigmoid,
    "glu": lambda: F.glu,
    "dropout": lambda: F.dropout,
    "dropout1d": lambda: F.dropout1d,
    "dropout2d": lambda: F.dropout2d,
    "embedding": lambda: F.embedding,
    "one_hot": lambda: F.one_hot,
    "pad": lambda: F.pad,
    "interpolate": lambda: F.interpolate,
    "grid_sample": lambda: F.grid_sample,
    "pixel_shuffle": lambda: F.pixel_shuffle,
    "unfold": lambda: F.unfold,
    "cosine_similarity": lambda: F.cosine_similarity,
    "scaled_dot_product_attention": lambda: F.scaled_dot_product_attention,
    "multi_head_attention_forward": lambda: F.multi_head_attention_forward,
    "cross_entropy": lambda: F.cross_entropy,
    "nll_loss": lambda: F.nll_loss,
    "mse_loss": lambda: F.mse_loss,
    "l1_loss": lambda: F.l1_loss,
    "smooth_l1_loss": lambda: F.smooth_l1_loss,
    "huber_loss": lambda: F.huber_loss,
    "binary_cross_entropy": lambda: F.binary_cross_entropy,
    "binary_cross_entropy_with_logits": lambda: F.binary_cross_entropy_with_logits,
    "kl_div": lambda: F.kl_div,
}

#: Tensor_<name>: methods and operators of ``torch.Tensor`` (``self`` first)
_TENSOR: Dict[str, Resolver] = {
    # arithmetic
    "add": lambda: torch.Tensor.add,
    "sub": lambda: torch.Tensor.sub,
    "mul": lambda: torch.Tensor.mul,
    "div": lambda: torch.Tensor.div,
    "true_divide": lambda: torch.Tensor.true_divide,
    "floor_divide": lambda: torch.Tensor.floor_divide,
    "remainder": lambda: torch.Tensor.remainder,
    "neg": lambda: torch.Tensor.neg,
    "abs": lambda: torch.Tensor.abs,
    "pow": lambda: torch.Tensor.pow,
    "square": lambda: torch.Tensor.square,
    "exp": lambda: torch.Tensor.exp,
    "log": lambda: torch.Tensor.log,
    "log1p": lambda: torch.Tensor.log1p,
    "sqrt": lambda: torch.Tensor.sqrt,
    "rsqrt": lambda: torch.Tensor.rsqrt,
    "reciprocal": lambda: torch.Tensor.reciprocal,
    "sin": lambda: torch.Tensor.sin,
    "cos": lambda: torch.Tensor.cos,
    "tanh": lambda: torch.Tensor.tanh,
    "sigmoid": lambda: torch.Tensor.sigmoid,
    "relu": lambda: torch.Tensor.relu,
    "softmax": lambda: torch.Tensor.softmax,
    "log_softmax": lambda: torch.Tensor.log_softmax,
    "clamp": lambda: torch.Tensor.clamp,
    "clip": lambda: torch.Tensor.clip,
    "clamp_min": lambda: torch.Tensor.clamp_min,
    "clamp_max": lambda: torch.Tensor.clamp_max,
    "maximum": lambda: torch.Tensor.maximum,
    "minimum": lambda: torch.Tensor.minimum,
    "lerp": lambda: torch.Tensor.lerp,
    "addcmul": lambda: torch.Tensor.addcmul,
    "addcdiv": lambda: torch.Tensor.addcdiv,
    "where": lambda: torch.Tensor.where,
    "masked_fill": lambda: torch.Tensor.masked_fill,
    "nan_to_num": lambda: torch.Tensor.nan_to_num,
    "isnan": lambda: torch.Tensor.isnan,
    "isinf": lambda: torch.Tensor.isinf,
    "eq": lambda: torch.Tensor.eq,
    "ne": lambda: torch.Tensor.ne,
    "lt": lambda: torch.Tensor.lt,
    "le": lambda: torch.Tensor.le,
    "gt": lambda: torch.Tensor.gt,
    "ge": lambda: torch.Tensor.ge,
    "matmul": lambda: torch.Tensor.matmul,
    "mm": lambda: torch.Tensor.mm,
    "bmm": lambda: torch.Tensor.bmm,
    "mv": lambda: torch.Tensor.mv,
    "dot": lambda: torch.Tensor.dot,
    "addmm": lambda: torch.Tensor.addmm,
    "baddbmm": lambda: torch.Tensor.baddbmm,
    # reductions, scans, ordering
    "sum": lambda: torch.Tensor.sum,
    "mean": lambda: torch.Tensor.mean,
    "prod": lambda: torch.Tensor.prod,
    "max": lambda: torch.Tensor.max,
    "min": lambda: torch.Tensor.min,
    "amax": lambda: torch.Tensor.amax,
    "amin": lambda: torch.Tensor.amin,
    "argmax": lambda: torch.Tensor.argmax,
    "argmin": lambda: torch.Tensor.argmin,
    "var": lambda: torch.Tensor.var,
    "std": lambda: torch.Tensor.std,
    "norm": lambda: torch.Tensor.norm,
    "logsumexp": lambda: torch.Tensor.logsumexp,
    "cumsum": lambda: torch.Tensor.cumsum,
    "all": lambda: torch.Tensor.all,
    "any": lambda: torch.Tensor.any,
    "topk": lambda: torch.Tensor.topk,
    "sort": lambda: torch.Tensor.sort,
    "argsort": lambda: torch.Tensor.argsort,
    # shapes, views, indexing, conversions
    "view": lambda: torch.Tensor.view,
    "view_as": lambda: torch.Tensor.view_as,
    "reshape": lambda: torch.Tensor.reshape,
    "reshape_as": lambda: torch.Tensor.reshape_as,
    "permute": lambda: torch.Tensor.permute,
    "transpose": lambda: torch.Tensor.transpose,
    "t": lambda: torch.Tensor.t,
    "contiguous": lambda: torch.Tensor.contiguous,
    "flatten": lambda: torch.Tensor.flatten,
    "unflatten": lambda: torch.Tensor.unflatten,
    "squeeze": lambda: torch.Tensor.squeeze,
    "unsqueeze": lambda: torch.Tensor.unsqueeze,
    "expand": lambda: torch.Tensor.expand,
    "expand_as": lambda: torch.Tensor.expand_as,
    "repeat": lambda: torch.Tensor.repeat,
    "repeat_interleave": lambda: torch.Tensor.repeat_interleave,
    "narrow": lambda: torch.Tensor.narrow,
    "split": lambda: torch.Tensor.split,
    "chunk": lambda: torch.Tensor.chunk,
    "unbind": lambda: torch.Tensor.unbind,
    "flip": lambda: torch.Tensor.flip,
    "roll": lambda: torch.Tensor.roll,
    "gather": lambda: torch.Tensor.gather,
    "scatter": lambda: torch.Tensor.scatter,
    "scatter_add": lambda: torch.Tensor.scatter_add,
    "index_select": lambda: torch.Tensor.index_select,
    "masked_select": lambda: torch.Tensor.masked_select,
    "select": lambda: torch.Tensor.select,
    "tril": lambda: torch.Tensor.tril,
    "triu": lambda: torch.Tensor.triu,
    "clone": lambda: torch.Tensor.clone,
    "detach": lambda: torch.Tensor.detach,
    "type": lambda: torch.Tensor.type,
    "type_as": lambda: torch.Tensor.type_as,
    "float": lambda: torch.Tensor.float,
    "double": lambda: torch.Tensor.double,
    "half": lambda: torch.Tensor.half,
    "bfloat16": lambda: torch.Tensor.bfloat16,
    "int": lambda: torch.Tensor.int,
    "long": lambda: torch.Tensor.long,
    "bool": lambda: torch.Tensor.bool,
    "to": lambda: torch.Tensor.to,
    "new_zeros": lambda: torch.Tensor.new_zeros,
    "new_ones": lambda: torch.Tensor.new_ones,
    "new_full": lambda: torch.Tensor.new_full,
    # in-place variants (optimizer updates, masking, initialisation to constants)
    "add_": lambda: torch.Tensor.add_,
    "sub_": lambda: torch.Tensor.sub_,
    "mul_": lambda: torch.Tensor.mul_,
    "div_": lambda: torch.Tensor.div_,
    "pow_": lambda: torch.Tensor.pow_,
    "sqrt_": lambda: torch.Tensor.sqrt_,
    "exp_": lambda: torch.Tensor.exp_,
    "neg_": lambda: torch.Tensor.neg_,
    "abs_": lambda: torch.Tensor.abs_,
    "clamp_": lambda: torch.Tensor.clamp_,
    "clamp_min_": lambda: torch.Tensor.clamp_min_,
    "clamp_max_": lambda: torch.Tensor.clamp_max_,
    "lerp_": lambda: torch.Tensor.lerp_,
    "addcmul_": lambda: torch.Tensor.addcmul_,
    "addcdiv_": lambda: torch.Tensor.addcdiv_,
    "addmm_": lambda: torch.Tensor.addmm_,
    "masked_fill_": lambda: torch.Tensor.masked_fill_,
    "relu_": lambda: torch.Tensor.relu_,
    "sigmoid_": lambda: torch.Tensor.sigmoid_,
    "tanh_": lambda: torch.Tensor.tanh_,
    "zero_": lambda: torch.Tensor.zero_,
    "fill_": lambda: torch.Tensor.fill_,
    "copy_": lambda: torch.Tensor.copy_,
    "scatter_": lambda: torch.Tensor.scatter_,
    "scatter_add_": lambda: torch.Tensor.scatter_add_,
    "index_add_": lambda: torch.Tensor.index_add_,
    "unsqueeze_": lambda: torch.Tensor.unsqueeze_,
    "squeeze_": lambda: torch.Tensor.squeeze_,
    "transpose_": lambda: torch.Tensor.transpose_,
    "t_": lambda: torch.Tensor.t_,
    # operators
    "__add__": lambda: torch.Tensor.__add__,
    "__radd__": lambda: torch.Tensor.__radd__,
    "__iadd__": lambda: torch.Tensor.__iadd__,
    "__sub__": lambda: torch.Tensor.__sub__,
    "__rsub__": lambda: torch.Tensor.__rsub__,
    "__isub__": lambda: torch.Tensor.__isub__,
    "__mul__": lambda: torch.Tensor.__mul__,
    "__rmul__": lambda: torch.Tensor.__rmul__,
    "__imul__": lambda: torch.Tensor.__imul__,
    "__truediv__": lambda: torch.Tensor.__truediv__,
    "__rtruediv__": lambda: torch.Tensor.__rtruediv__,
    "__itruediv__": lambda: torch.Tensor.__itruediv__,
    "__floordiv__": lambda: torch.Tensor.__floordiv__,
    "__rfloordiv__": lambda: torch.Tensor.__rfloordiv__,
    "__ifloordiv__": lambda: torch.Tensor.__ifloordiv__,
    "__mod__": lambda: torch.Tensor.__mod__,
    "__rmod__": lambda: torch.Tensor.__rmod__,
    "__pow__": lambda: torch.Tensor.__pow__,
    "__rpow__": lambda: torch.Tensor.__rpow__,
    "__ipow__": lambda: torch.Tensor.__ipow__,
    "__matmul__": lambda: torch.Tensor.__matmul__,
    "__rmatmul__": lambda: torch.Tensor.__rmatmul__,
    "__neg__": lambda: torch.Tensor.__neg__,
    "__pos__": lambda: torch.Tensor.__pos__,
    "__abs__": lambda: torch.Tensor.__abs__,
    "__invert__": lambda: torch.Tensor.__invert__,
    "__and__": lambda: torch.Tensor.__and__,
    "__or__": lambda: torch.Tensor.__or__,
    "__xor__": lambda: torch.Tensor.__xor__,
    "__eq__": lambda: torch.Tensor.__eq__,
    "__ne__": lambda: torch.Tensor.__ne__,
    "__lt__": lambda: torch.Tensor.__lt__,
    "__le__": lambda: torch.Tensor.__le__,
    "__gt__": lambda: torch.Tensor.__gt__,
    "__ge__": lambda: torch.Tensor.__ge__,
    "__getitem__": lambda: torch.Tensor.__getitem__,
    "__setitem__": lambda: torch.Tensor.__setitem__,
}

#: VF_<name>: the recurrent kernels of ``torch._VF``
_VF: Dict[str, Resolver] = {
    "lstm": lambda: torch._VF.lstm,
    "gru": lambda: torch._VF.gru,
    "rnn_tanh": lambda: torch._VF.rnn_tanh,
    "rnn_relu": lambda: torch._VF.rnn_relu,
    "lstm_cell": lambda: torch._VF.lstm_cell,
    "gru_cell": lambda: torch._VF.gru_cell,
    "rnn_tanh_cell": lambda: torch._VF.rnn_tanh_cell,
    "rnn_relu_cell": lambda: torch._VF.rnn_relu_cell,
}

#: API type -> (its table, the module path written in qualified names and scripts)
_TYPES: Dict[str, Tuple[Dict[str, Resolver], str]] = {
    "Torch": (_TORCH, "torch"),
    "Functional": (_FUNCTIONAL, "torch.nn.functional"),
    "Tensor": (_TENSOR, "torch.Tensor"),
    "VF": (_VF, "torch._VF"),
}


@dataclass(frozen=True)
class Entry:
    """One replayable API: its family key, fixed qualified name and resolver (from the table)."""

    family: str
    api_type: str
    api_name: str
    qualname: str
    resolve: Resolver


def _entries() -> Dict[str, Entry]:
    out: Dict[str, Entry] = {}
    for api_type, (table, root) in _TYPES.items():
        for name, resolver in table.items():
            out[f"{api_type}_{name}"] = Entry(f"{api_type}_{name}", api_type, name, f"{root}.{name}", resolver)
    return out


#: family -> :class:`Entry`; the only APIs a replay may call
REPLAYABLE: Mapping[str, Entry] = _entries()

_NOT_ALONE = {
    "Distributed": "a collective needs its process group and cannot be replayed alone",
    "Aten": "torch.ops calls are not replayed (only the public API that made them)",
    "NPU": "torch_npu calls are not in the replay allowlist",
}


def entry(api_type: str, api_name: str, record: Optional[str] = None) -> Entry:
    """The allowlist entry of ``{api_type}_{api_name}``; ReplayRefused naming ``record`` when none.

    The lookup is an exact key match in the table: the names from a file are only compared, never
    used to reach an attribute.
    """
    record = record or f"{api_type}_{api_name}"
    if not isinstance(api_type, str) or not isinstance(api_name, str):
        raise ReplayRefused(str(record), "the API name is not a string")
    hit = REPLAYABLE.get(f"{api_type}_{api_name}")
    if hit is None or hit.api_type != api_type or hit.api_name != api_name:
        why = _NOT_ALONE.get(api_type, "")
        shown = f"{api_type}_{api_name}"[:120]
        raise ReplayRefused(record, f"API {shown!r} is not in the replay allowlist" + (f" ({why})" if why else ""))
    return hit


def resolve(api_type: str, api_name: str, record: Optional[str] = None) -> Callable[..., Any]:
    """The callable of an allowlisted API (``Tensor`` methods take ``self`` first)."""
    e = entry(api_type, api_name, record)
    try:
        func = e.resolve()
    except AttributeError:
        raise ReplayRefused(record or e.family, f"{e.qualname} does not exist in torch {torch.__version__}") from None
    return func


def qualified_name(api_type: str, api_name: str, record: Optional[str] = None) -> str:
    """The fixed qualified name of an allowlisted API, as the table writes it (for scripts)."""
    return entry(api_type, api_name, record).qualname


# --------------------------------------------------------------------------------- string rules


@dataclass(frozen=True)
class StringRule:
    """What a string parameter may hold: one of ``choices``, or text matching ``pattern``
    (``max_len`` characters at most). ``device=True``: a device, replaced by the replay device."""

    what: str
    choices: FrozenSet[str] = frozenset()
    pattern: Optional["re.Pattern[str]"] = None
    max_len: int = 64
    device: bool = False

    def allows(self, s: str) -> bool:
        if self.device:
            return len(s) <= self.max_len
        if len(s) > self.max_len:
            return False
        if self.pattern is not None:
            return self.pattern.fullmatch(s) is not None
        return s in self.choices

    def describe(self) -> str:
        if self.device:
            return "a device"
        if self.pattern is not None:
            return f"{self.what} ({self.max_len} characters at most)"
        return f"one of {', '.join(repr(c) for c in sorted(self.choices))}"


DEVICE = StringRule("device", device=True)
_REDUCTION = StringRule("reduction", frozenset({"none", "mean", "sum"}))
_KL_REDUCTION = StringRule("reduction", frozenset({"none", "mean", "sum", "batchmean"}))
_APPROXIMATE = StringRule("approximate", frozenset({"none", "tanh"}))
_CONV_PADDING = StringRule("padding", frozenset({"same", "valid"}))
_PAD_MODE = StringRule("mode", frozenset({"constant", "reflect", "replicate", "circular"}))
_INTERP_MODE = StringRule("mode", frozenset({"nearest", "linear", "bilinear", "bicubic", "trilinear",
                                               "area", "nearest-exact"}))
_GRID_MODE = StringRule("mode", frozenset({"bilinear", "nearest", "bicubic"}))
_GRID_PADDING = StringRule("padding_mode", frozenset({"zeros", "border", "reflection"}))
_ROUNDING = StringRule("rounding_mode", frozenset({"trunc", "floor"}))
_INDEXING = StringRule("indexing", frozenset({"ij", "xy"}))
_SIDE = StringRule("side", frozenset({"left", "right"}))
_NORM_P = StringRule("p", frozenset({"fro", "nuc"}))
#: an einsum equation: letters, commas, "->", "...", spaces
_EINSUM = StringRule("an einsum equation (letters, commas, '->', '...', spaces)",
                     pattern=re.compile(r"(?:[A-Za-z ,]|->|\.\.\.)*"), max_len=256)

#: family -> {parameter name: (its position or None when keyword-only, rule)}
STRING_RULES: Dict[str, Dict[str, Tuple[Optional[int], StringRule]]] = {
    "Functional_cross_entropy": {"reduction": (6, _REDUCTION)},
    "Functional_nll_loss": {"reduction": (6, _REDUCTION)},
    "Functional_mse_loss": {"reduction": (4, _REDUCTION)},
    "Functional_l1_loss": {"reduction": (4, _REDUCTION)},
    "Functional_smooth_l1_loss": {"reduction": (4, _REDUCTION)},
    "Functional_huber_loss": {"reduction": (2, _REDUCTION)},
    "Functional_binary_cross_entropy": {"reduction": (5, _REDUCTION)},
    "Functional_binary_cross_entropy_with_logits": {"reduction": (5, _REDUCTION)},
    "Functional_kl_div": {"reduction": (4, _KL_REDUCTION)},
    "Functional_gelu": {"approximate": (1, _APPROXIMATE)},
    "Functional_conv1d": {"padding": (4, _CONV_PADDING)},
    "Functional_conv2d": {"padding": (4, _CONV_PADDING)},
    "Functional_conv3d": {"padding": (4, _CONV_PADDING)},
    "Torch_conv1d": {"padding": (4, _CONV_PADDING)},
    "Torch_conv2d": {"padding": (4, _CONV_PADDING)},
    "Torch_conv3d": {"padding": (4, _CONV_PADDING)},
    "Functional_pad": {"mode": (2, _PAD_MODE)},
    "Functional_interpolate": {"mode": (3, _INTERP_MODE)},
    "Functional_grid_sample": {"mode": (2, _GRID_MODE), "padding_mode": (3, _GRID_PADDING)},
    "Torch_div": {"rounding_mode": (None, _ROUNDING)},
    "Torch_divide": {"rounding_mode": (None, _ROUNDING)},
    "Tensor_div": {"rounding_mode": (None, _ROUNDING)},
    "Tensor_div_": {"rounding_mode": (None, _ROUNDING)},
    "Torch_meshgrid": {"indexing": (None, _INDEXING)},
    "Torch_searchsorted": {"side": (None, _SIDE)},
    "Torch_norm": {"p": (1, _NORM_P)},
    "Tensor_norm": {"p": (1, _NORM_P)},
    "Torch_einsum": {"equation": (0, _EINSUM)},
    # Tensor.to(device, dtype, ...): a device string is replaced by the replay device
    "Tensor_to": {"device": (1, DEVICE)},
}


def string_rule(family: str, position: Optional[int], keyword: Optional[str]) -> Optional[StringRule]:
    """The rule for a string passed to ``family`` at ``position`` or as ``keyword``; None: refused.

    The keyword ``device`` of any allowlisted API is a device (replaced by the replay device).
    """
    rules = STRING_RULES.get(family, {})
    if keyword is not None:
        if keyword == "device":
            return DEVICE
        hit = rules.get(keyword)
        return hit[1] if hit else None
    for pos, rule in rules.values():
        if pos is not None and pos == position:
            return rule
    return None


# ------------------------------------------------------------------------------ dtypes and tags

#: dtype names a dump or package may name (``torch.<name>``); each checked to be a torch.dtype
_DTYPE_NAMES = (
    "float16", "float32", "float64", "bfloat16", "half", "float", "double",
    "complex32", "complex64", "complex128", "cfloat", "cdouble",
    "uint8", "int8", "int16", "int32", "int64", "short", "int", "long", "bool",
    "uint16", "uint32", "uint64",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
)


def _named(names: Tuple[str, ...], kind: type) -> Dict[str, Any]:
    out = {}
    for n in names:
        v = vars(torch).get(n)  # the module's own namespace: no lazy import, no __getattr__
        if isinstance(v, kind):
            out["torch." + n] = v
    return out


_DTYPES: Dict[str, Any] = _named(_DTYPE_NAMES, torch.dtype)
_LAYOUTS: Dict[str, Any] = {"torch.strided": torch.strided, "torch.sparse_coo": torch.sparse_coo}
_MEMORY_FORMATS: Dict[str, Any] = {
    "torch.contiguous_format": torch.contiguous_format,
    "torch.channels_last": torch.channels_last,
    "torch.channels_last_3d": torch.channels_last_3d,
    "torch.preserve_format": torch.preserve_format,
}


def _lookup(table: Dict[str, Any], name: Any) -> Any:
    if not isinstance(name, str):
        return None
    return table.get(name if name.startswith("torch.") else "torch." + name)


def dtype_of(name: Any) -> Optional[Any]:
    """The ``torch.dtype`` a name such as ``"torch.float32"``/``"float32"`` stands for, or None."""
    return _lookup(_DTYPES, name)


@functools.lru_cache(maxsize=256)  # a handful of dtype names, asked for every tensor
def torch_dtype(name: str) -> Optional[Any]:
    """The ``torch.dtype`` of a recorded dtype name (``"torch.bfloat16"``, ``"numpy.float32"``,
    ``"float32"``), or None: the one lookup every replay uses for a record's dtype."""
    n = name.split(".", 1)[1] if isinstance(name, str) and name.startswith(("torch.", "numpy.")) else name
    return dtype_of(n)


def layout_of(name: Any) -> Optional[Any]:
    """The ``torch.layout`` of ``"torch.strided"``/``"torch.sparse_coo"``, or None."""
    return _lookup(_LAYOUTS, name)


def memory_format_of(name: Any) -> Optional[Any]:
    """The ``torch.memory_format`` of e.g. ``"torch.channels_last"``, or None."""
    return _lookup(_MEMORY_FORMATS, name)


def dtype_names() -> Tuple[str, ...]:
    """Every ``torch.<dtype>`` name of the dtype table (for scripts)."""
    return tuple(_DTYPES)


def tag_names(kind: str) -> Tuple[str, ...]:
    """The names of the ``layout`` or ``memory_format`` table."""
    return tuple({"layout": _LAYOUTS, "memory_format": _MEMORY_FORMATS, "dtype": _DTYPES}[kind])

