"""Which callable is which public API: ``func -> (Type, name)`` by identity, and what to skip.

Built once from ``torch.nn.functional`` (Functional; first, because ``F.linear`` is
``torch._C._nn.linear``), the rnn family of ``torch._VF`` (VF), ``torch`` (Torch) and the methods
and operators of ``torch.Tensor`` (Tensor). Calls that do no arithmetic on data (property reads,
``size()``, ``dim()``, ``item()``, ``backward()``, ``torch.autograd.grad``, grad-mode switches,
profiler markers...) are skipped (:func:`classify` returns None).
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F

#: rnn family of torch._VF (named "VF"; everything else in torch is "Torch")
VF_NAMES = (
    "lstm", "gru", "rnn_tanh", "rnn_relu", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "quantized_lstm", "quantized_gru",
)

#: names that do no arithmetic on data (never records), for any Type
SKIP_NAMES = frozenset(
    """
    size dim ndimension nelement numel shape stride storage_offset is_contiguous data_ptr
    element_size item tolist numpy is_floating_point is_complex is_signed is_nonzero is_same_size
    is_set_to get_device backward register_hook register_post_accumulate_grad_hook retain_grad
    requires_grad_ untyped_storage storage _typed_storage __len__ __bool__ __iter__ __hash__ __repr__
    __format__ __reduce_ex__ __deepcopy__ __setstate__ __getstate__ __array__ __array_wrap__
    __dlpack__ __dlpack_device__ __index__ __int__ __float__ __complex__ __contains__ __dir__
    __get__ __set__ __delete__ _is_view is_inference is_pinned is_shared share_memory_
    _set_grad_enabled is_grad_enabled set_grad_enabled is_tensor is_storage _make_subclass
    _make_wrapper_subclass as_subclass dim_order _has_compatible_shallow_copy_type
    _fix_weakref _to_dense _version is_meta is_quantized is_sparse has_names refine_names
    rename _nnz qscheme _autocast_to_reduced_precision _autocast_to_full_precision
    """.split()
)

#: in-place dunders
INPLACE_DUNDERS = frozenset(
    """
    __iadd__ __isub__ __imul__ __itruediv__ __ifloordiv__ __imod__ __ipow__ __imatmul__ __iand__
    __ior__ __ixor__ __ilshift__ __irshift__ __idiv__ __setitem__
    """.split()
)

Table = Dict[Any, Tuple[str, str]]
_TABLE: Optional[Table] = None
#: Functional name -> positional index of its ``inplace`` parameter
_INPLACE_POS: Dict[str, int] = {}


def _add(table: Table, obj: Any, api_type: str, name: str) -> None:
    try:
        if obj not in table:
            table[obj] = (api_type, name)
    except TypeError:  # unhashable
        pass


def build_table() -> Table:
    """``{callable: (Type, name)}`` for every public API known by identity."""
    global _TABLE
    if _TABLE is not None:
        return _TABLE
    table: Table = {}
    for name in dir(F):
        if name.startswith("_"):
            continue
        obj = getattr(F, name)
        if callable(obj) and not inspect.isclass(obj) and not inspect.ismodule(obj):
            _add(table, obj, "Functional", name)
            if inspect.isfunction(obj):
                try:
                    params = list(inspect.signature(obj).parameters)
                except (TypeError, ValueError):
                    params = []
                if "inplace" in params:
                    _INPLACE_POS[name] = params.index("inplace")
    vf = torch._C._VariableFunctions
    for name in VF_NAMES:
        obj = getattr(vf, name, None)
        if obj is not None:
            _add(table, obj, "VF", name)
            _add(table, getattr(torch, name, None), "VF", name)
    for name in dir(torch):
        if name.startswith("__") or (name.startswith("_") and not name.startswith("_foreach")):
            continue
        obj = getattr(torch, name, None)
        if callable(obj) and not inspect.isclass(obj) and not inspect.ismodule(obj):
            _add(table, obj, "Torch", name)
    for cls in (torch.Tensor, torch._C.TensorBase):
        for name, obj in vars(cls).items():
            if name.startswith("_") and not (name.startswith("__") and name.endswith("__")):
                continue
            if callable(obj) and not isinstance(obj, (type, property)):
                _add(table, obj, "Tensor", name)
    _TABLE = table
    return table


def classify(func: Callable) -> Optional[Tuple[str, str]]:
    """``(Type, name)`` of a callable seen by capture, or None when it is not recorded."""
    table = _TABLE if _TABLE is not None else build_table()
    try:
        hit = table.get(func)
    except TypeError:
        hit = None
    if hit is None:
        hit = _guess(func)
        try:
            table[func] = hit if hit is not None else ("", "")
        except TypeError:
            pass
    elif not hit[0]:
        return None
    if hit is None or hit[1] in SKIP_NAMES:
        return None
    return hit


def _guess(func: Callable) -> Optional[Tuple[str, str]]:
    """Name a callable not in the table (e.g. ``torch.nn.init.uniform_``, ``torch.ops.aten.add``)."""
    name = getattr(func, "__name__", None)
    module = getattr(func, "__module__", None) or ""
    if name is None or name in SKIP_NAMES:
        return None
    if isinstance(func, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        ns = getattr(func, "namespace", "") or ""
        if ns != "aten":
            return None
        return ("Aten", str(getattr(func, "_opname", None) or name.split(".")[0]))
    if "profiler" in module or "record_function" in name:
        return None
    if module.startswith("torch.autograd"):
        # autograd's drivers (torch.autograd.grad/backward, forward_ad): no arithmetic of their
        # own, and aliasing their inputs would ask for gradients of tensors outside the graph
        return None
    qual = getattr(func, "__qualname__", "") or ""
    if qual.startswith(("getset_descriptor", "member_descriptor", "property")):
        return None
    if module.startswith(("torch.nn.functional", "torch._C._nn")):
        # torch._C._nn holds torch.nn.functional's C functions (F.linear): named as F names them
        # even when F's attribute was patched while the table was built
        return ("Functional", name)
    if qual.startswith(("Tensor.", "TensorBase.", "_TensorBase.")):
        return ("Tensor", name)
    return ("Torch", name)


_STATIC_INPLACE: Dict[str, bool] = {}


def is_inplace(api_type: str, name: str, args: tuple, kwargs: dict) -> bool:
    """Whether a call modifies one of its inputs (``add_``, ``__iadd__``, ``out=``, ``inplace=True``)."""
    if kwargs and kwargs.get("out") is not None:
        return True
    static = _STATIC_INPLACE.get(name)
    if static is None:
        static = _STATIC_INPLACE[name] = name in INPLACE_DUNDERS or (name.endswith("_") and not name.endswith("__"))
    if static:
        return True
    if api_type == "Functional":
        if kwargs and kwargs.get("inplace"):
            return True
        pos = _INPLACE_POS.get(name)
        if pos is not None and len(args) > pos and args[pos] is True:
            return True
    return False
