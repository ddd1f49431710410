"""Bound what a replayed call may allocate by what its record says it produced.

A call spec is data, but data can still ask for memory: ``zeros([1100000000])``, ``x.repeat(5000,
5000)``, an einsum outer product or a broadcast ``add`` of an ``[N, 1]`` and a ``[1, M]`` tensor.
The record knows how big the call's outputs were, so before a replay runs the call for real,
:func:`check_allocation` runs it once on the **meta device** (tensors with a shape and no data:
torch computes the output shapes without allocating) under a dispatch mode that

* moves every aten factory (``zeros``, ``full``, ``arange``, ``empty``...) to the meta device,
  so nothing reaches real memory whatever the arguments say;
* refuses any single aten op whose output exceeds :data:`INTERMEDIATE_CAP` elements (the
  intermediates of composite calls: an attention matrix, a decomposition);

and then compares the elements of the call's outputs with the recorded outputs' elements x
:data:`MARGIN` (plus :data:`FLOOR` elements). Elements, not bytes: the float64 oracle widens
every floating tensor, the margin is the same for every dtype. A call over its bound raises
:class:`AllocationRefused` (``pytest_ptdbg.errors``; a ReplayRefused) naming the record and
the sizes, before anything is allocated. A call that torch cannot run on the meta device (an op
whose output size depends on the data, such as ``nonzero`` or ``masked_select``) is allowed when
its outputs are bounded by its inputs (:data:`_DATA_DEPENDENT`); one whose sizes come from
values (``item()``, ``repeat_interleave`` by a tensor) or that has no meta kernel is refused; a
shape error on the meta device is left to the real call, which fails the same way.

The meta pre-run costs a few hundred microseconds a call (and about a second, once per process,
when torch first loads its meta kernels), so it runs only where needed: :func:`static_bound`
first bounds the outputs from the API's family and its tensors' shapes alone (element-wise APIs
by their broadcast shape; reductions, normalisations, views and casts by their inputs; factories,
``repeat``, ``expand``, ``new_*``, matmul, linear, conv, pools, embedding, RNNs from their
arguments), a few microseconds; only a call whose bound is unknown or over the budget goes to the
meta device. Limits: the static path bounds outputs, not a kernel's internal workspace (a
convolution's columns); the meta path bounds every aten op's output, not workspace either.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable, List, Mapping, Optional, Sequence, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pytest_ptdbg.errors import AllocationRefused

__all__ = ["AllocationRefused", "guard_call", "guard_arrays", "check_allocation", "static_bound", "budget_of",
           "MARGIN", "FLOOR", "INTERMEDIATE_CAP"]

#: a call may produce this many times the elements of its recorded outputs ...
MARGIN = 4
#: ... plus this many elements (8 MiB in float64: small calls are never refused for rounding)
FLOOR = 1 << 20
#: no single aten op of a replayed call may produce more elements than this (1 GiB in float64),
#: or than the call's own bound when that is larger
INTERMEDIATE_CAP = 1 << 27

#: ops whose output size depends on the data (not computable on meta), each bounded by its
#: inputs' elements; a call that meets one on the meta device runs for real, its outputs bounded
_DATA_DEPENDENT = frozenset({
    "aten::nonzero", "aten::masked_select", "aten::index.Tensor", "aten::argwhere", "aten::nonzero_numpy",
    "aten::unique2", "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive",
    "aten::is_nonzero", "aten::equal", "aten::allclose",
})


def budget_of(recorded: Iterable[Sequence[int]]) -> int:
    """Elements a call with recorded outputs of these shapes may produce: MARGIN x theirs + FLOOR."""
    return MARGIN * sum(_numel(s) for s in recorded) + FLOOR


def _numel(shape: Iterable[int]) -> int:
    return math.prod(int(s) for s in shape)


class _Meta(TorchDispatchMode):
    """Every aten op on the meta device; an op with too large an output is refused."""

    def __init__(self, record: str, cap: int) -> None:
        super().__init__()
        self.record, self.cap = record, cap
        self.data_dependent: Optional[str] = None

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = dict(kwargs or {})
        if "device" in kwargs or _is_factory(func):
            kwargs["device"] = torch.device("meta")
        name = str(func._schema.name) + ("." + func._overloadname if func._overloadname != "default" else "")
        try:
            out = func(*args, **kwargs)
        except NotImplementedError as exc:  # no meta kernel: data-dependent, or unknown
            if name in _DATA_DEPENDENT or str(func._schema.name) in _DATA_DEPENDENT:
                self.data_dependent = name
            raise _MetaFailed(name, exc) from None
        except RuntimeError as exc:
            if "meta" in str(exc).lower() or "scalar" in str(exc).lower():  # item(), sizes from values
                raise _MetaFailed(name, exc) from None
            raise  # a shape check: the real call fails the same way
        n = _elements(out)
        if n > self.cap:
            raise AllocationRefused(self.record, f"{name} would make {n:,} elements ({_gib(n)}), more than "
                                                 f"{self.cap:,} a replayed call may allocate at once")
        return out


class _MetaFailed(Exception):
    def __init__(self, op: str, exc: BaseException) -> None:
        super().__init__(f"{op}: {type(exc).__name__}: {exc}")
        self.op = op


def _is_factory(func: Any) -> bool:
    return any(a.name == "device" for a in func._schema.arguments)


def _elements(out: Any) -> int:
    if isinstance(out, torch.Tensor):
        return out.numel()
    if isinstance(out, (list, tuple)):
        return sum(_elements(x) for x in out)
    return 0


def _gib(n: int) -> str:
    return f"{n * 8 / 2 ** 30:.3g} GiB in float64"


def guard_call(func: Callable[..., Any], record: str, spec: Mapping[str, Any],
               shapes: Mapping[str, Tuple[int, ...]], dtype: Callable[[str], Any], outputs: Iterable[Sequence[int]],
               value: Optional[Callable[[str], Any]] = None) -> None:
    """Refuse (:class:`AllocationRefused`) the call of ``spec`` before it runs when it would make
    more than its recorded ``outputs`` (shapes) allow; ``shapes`` maps the spec's tensor keys to
    their shapes, ``dtype(key)`` gives a key's torch dtype (asked only for a meta pre-run).

    First the cheap bound of :func:`static_bound` (from the API's family and its tensors' shapes,
    no decoding); only when that does not fit the budget is the spec decoded by the judge's
    data-only decoder onto the meta device and run there (:func:`check_allocation`). Nothing is
    read, copied or allocated."""
    from pytest_ptdbg.replayer.arguments import decode_call, family_of

    budget = budget_of(outputs)
    try:
        bound = static_bound(family_of(record) or "", spec, shapes, value)
    except AllocationRefused as exc:
        raise AllocationRefused(record, exc.reason) from None
    if bound is not None and bound <= budget:
        return

    class _Lazy(Mapping):
        def __contains__(self, key: object) -> bool:
            return key in shapes

        def __getitem__(self, key: str) -> Any:
            return torch.empty(tuple(int(n) for n in shapes[key]), dtype=dtype(key), device="meta")

        def __iter__(self):
            return iter(shapes)

        def __len__(self) -> int:
            return len(shapes)

    args, kwargs = decode_call(spec, _Lazy(), record, torch.device("meta"))
    check_allocation(func, record, args, kwargs, budget)


def _names(*groups: str) -> frozenset:
    return frozenset(n for g in groups for n in g.split())


#: element-wise APIs (in-place ones too): one output of the broadcast shape of their tensors
_ELEMENTWISE = _names(
    "add sub subtract mul multiply div divide true_divide floor_divide remainder fmod neg abs sign pow",
    "square exp exp2 expm1 log log2 log10 log1p sqrt rsqrt reciprocal sin cos tan atan2 sinh cosh erf",
    "erfc floor ceil round trunc clamp clip clamp_min clamp_max maximum minimum lerp addcmul addcdiv",
    "where masked_fill nan_to_num isnan isinf isfinite logical_and logical_or logical_not eq ne lt le",
    "gt ge relu relu6 leaky_relu elu selu silu mish hardswish hardsigmoid hardtanh sigmoid tanh",
    "softplus logsigmoid gelu cosine_similarity masked_select kl_div",
    "add_ sub_ mul_ div_ pow_ sqrt_ exp_ neg_ abs_ clamp_ clamp_min_ clamp_max_ lerp_ addcmul_ addcdiv_",
    "masked_fill_ relu_ sigmoid_ tanh_ zero_ fill_ copy_",
    "__add__ __radd__ __iadd__ __sub__ __rsub__ __isub__ __mul__ __rmul__ __imul__ __truediv__",
    "__rtruediv__ __itruediv__ __floordiv__ __rfloordiv__ __ifloordiv__ __mod__ __rmod__ __pow__",
    "__rpow__ __ipow__ __neg__ __pos__ __abs__ __invert__ __and__ __or__ __xor__ __eq__ __ne__",
    "__lt__ __le__ __gt__ __ge__",
    "mse_loss l1_loss smooth_l1_loss huber_loss binary_cross_entropy binary_cross_entropy_with_logits",
)
#: APIs whose outputs hold at most twice the elements of their tensor arguments together, whatever
#: their other arguments (reductions, normalisations, views and casts that keep the element count,
#: concatenation, ordering, scatter/gather by a recorded index, in-place updates of ``self``)
_BOUNDED = _names(
    "softmax log_softmax softmin normalize layer_norm group_norm batch_norm instance_norm rms_norm",
    "dropout dropout1d dropout2d sum mean prod max min amax amin argmax argmin var std var_mean",
    "std_mean norm logsumexp all any cumsum cumprod sort argsort topk searchsorted",
    "cat concat concatenate stack split chunk unbind flatten unflatten reshape reshape_as view_as",
    "squeeze unsqueeze transpose permute t flip roll tril triu clone detach contiguous narrow select",
    "float double half bfloat16 int long bool type type_as to gather scatter scatter_add scatter_",
    "scatter_add_ index_add_ unsqueeze_ squeeze_ transpose_ t_ __setitem__",
    "zeros_like ones_like full_like expand_as pixel_shuffle cross_entropy nll_loss",
    "lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell",
)


def static_bound(family: str, spec: Mapping[str, Any], shapes: Mapping[str, Tuple[int, ...]],
                 value: Optional[Callable[[str], Any]] = None) -> Optional[int]:
    """An upper bound on the elements of a call's outputs from its API family and the shapes of
    its tensor arguments alone, or None when the family has no such bound (factories, repeat,
    matmul, index_select... computed from their size-like arguments; einsum, conv, pad...: the meta
    device decides). ``value(key)``: the data of a small tensor argument (``repeat_interleave``'s
    repeats, ``one_hot``'s classes), or None. Raises AllocationRefused for a
    ``tensor_split`` into more pieces than its tensor has elements (empty tensors cost memory too)."""
    from pytest_ptdbg.replayer.codec import tensor_refs

    _, _, name = family.partition("_")
    refs = [r for r in tensor_refs(spec) if r in shapes]
    if name in _ELEMENTWISE:
        try:
            return _numel(_broadcast([shapes[r] for r in refs])) if refs else None
        except ValueError:
            return None  # not broadcastable (a loss of [N, C] and [N]...): the meta device decides
    if name == "view":
        if any(isinstance(v, dict) and "dtype" in v for v in _leaves(spec)):
            return None  # a view as another dtype changes the element count
        name = "view_as"
    if name == "tensor_split":
        pieces = (spec.get("args") or [None, None])[1:2]
        total = sum(_numel(shapes[r]) for r in refs)
        if pieces and type(pieces[0]) is int and pieces[0] > total + 1:
            raise AllocationRefused(family, f"tensor_split into {pieces[0]:,} pieces of {total:,} elements")
        name = "split"
    if name in _BOUNDED:
        return 2 * sum(_numel(shapes[r]) for r in refs)
    if name.startswith("_fused_"):
        # the fused optimizer kernels (_fused_adamw_, _fused_sgd_...) update their lists in place
        # and return nothing: nothing beyond their inputs (some have no meta kernel to ask)
        return sum(_numel(shapes[r]) for r in refs) if refs else None
    if name.startswith("_foreach_"):
        return _foreach_bound(list(spec.get("args") or []) + list((spec.get("kwargs") or {}).values()), shapes)
    if name == "linear" and len(refs) >= 2:
        x, w = shapes[refs[0]], shapes[refs[1]]
        if len(x) >= 1 and len(w) in (1, 2):
            return _numel(x[:-1]) * (w[0] if len(w) == 2 else 1)
    args, kwargs = list(spec.get("args") or []), dict(spec.get("kwargs") or {})
    try:
        return _sized(family, name, args, kwargs, refs, shapes, value)
    except (TypeError, ValueError, IndexError, KeyError, OverflowError, RuntimeError):
        return None  # not the usual form: the meta device decides


def _foreach_bound(args: Sequence[Any], shapes: Mapping[str, Tuple[int, ...]]) -> Optional[int]:
    """``torch._foreach_*``: the i-th outputs are the broadcast of the i-th tensors of every list
    argument (and of any single tensor argument); their elements summed. None: not that form."""
    def ref(v: Any) -> Optional[str]:
        return v["t"] if isinstance(v, Mapping) and len(v) == 1 and v.get("t") in shapes else None

    lists = [[ref(x) for x in a] for a in args if isinstance(a, list) and a and all(ref(x) for x in a)]
    single = [shapes[k] for k in (ref(a) for a in args) if k]
    if not lists or len({len(x) for x in lists}) != 1:
        return None
    try:
        return sum(_numel(_broadcast([shapes[k] for k in ks] + single)) for ks in zip(*lists))
    except ValueError:
        return None


def _broadcast(shapes: Sequence[Tuple[int, ...]]) -> Tuple[int, ...]:
    """The broadcast shape of ``shapes`` (torch's rule; ValueError when they do not broadcast).
    Plain Python: ``torch.broadcast_shapes`` costs tens of microseconds a call."""
    ndim = max((len(x) for x in shapes), default=0)
    out = [1] * ndim
    for x in shapes:
        for i, n in enumerate(x, ndim - len(x)):
            if n != 1:
                if out[i] not in (1, n):
                    raise ValueError(f"shapes {list(shapes)} do not broadcast")
                out[i] = n
    return tuple(out)


def _ints(v: Any) -> Optional[List[int]]:
    """The integers of a size-like argument (``3``, ``[2, 3]``, ``{"size": [2, 3]}``, a tuple tag)."""
    if type(v) is int:
        return [v]
    if isinstance(v, Mapping) and len(v) == 1 and next(iter(v)) in ("size", "tuple"):
        v = next(iter(v.values()))
    if isinstance(v, list) and all(type(x) is int for x in v):
        return list(v)
    return None


def _size_args(args: Sequence[Any], kwargs: Mapping[str, Any]) -> Optional[List[int]]:
    """The size of a factory/repeat/expand call: ``f(2, 3)``, ``f([2, 3])`` or ``f(size=[2, 3])``."""
    if "size" in kwargs:
        return _ints(kwargs["size"])
    if len(args) == 1:
        return _ints(args[0])
    out: List[int] = []
    for a in args:
        got = _ints(a) if type(a) is int else None
        if got is None:
            return None
        out += got
    return out


def _count_leaves(v: Any) -> int:
    return sum(_count_leaves(x) for x in v) if isinstance(v, list) else 1


def _sized(family: str, name: str, args: list, kwargs: dict, refs: List[str],
           shapes: Mapping[str, Tuple[int, ...]], value: Optional[Callable[[str], Any]]) -> Optional[int]:
    """:func:`static_bound` of the APIs whose size comes from their arguments."""
    api_type = family.partition("_")[0]
    shape = lambda i: shapes[refs[i]]  # noqa: E731
    if api_type == "Torch" and name in ("zeros", "ones"):
        size = _size_args(args, kwargs)
        return _numel(size) if size is not None and min(size, default=0) >= 0 else None
    if api_type == "Torch" and name == "full":
        size = _ints(kwargs["size"] if "size" in kwargs else args[0])
        return _numel(size) if size is not None and min(size, default=0) >= 0 else None
    if api_type == "Tensor" and name in ("new_zeros", "new_ones", "new_full"):
        rest = args[1:] if name != "new_full" else args[1:2]
        size = _size_args(rest, kwargs)
        return _numel(size) if size is not None and min(size, default=0) >= 0 else None
    if api_type == "Torch" and name == "eye":
        n = args[0] if args else kwargs["n"]
        m = args[1] if len(args) > 1 and type(args[1]) is int else kwargs.get("m", n)
        return n * m if type(n) is int and type(m) is int and n >= 0 and m >= 0 else None
    if api_type == "Torch" and name == "arange":
        nums = [a for a in args if type(a) in (int, float)]
        start, end, step = (0, nums[0], 1) if len(nums) == 1 else (nums + [1])[:3]
        start, end, step = kwargs.get("start", start), kwargs.get("end", end), kwargs.get("step", step)
        if not all(type(x) in (int, float) and math.isfinite(x) for x in (start, end, step)) or step == 0:
            return None
        return max(0, math.ceil((end - start) / step))
    if api_type == "Torch" and name == "linspace":
        steps = args[2] if len(args) > 2 else kwargs["steps"]
        return steps if type(steps) is int and steps >= 0 else None
    if api_type == "Torch" and name == "tensor":
        return _count_leaves(args[0] if args else kwargs["data"])
    if name == "repeat" and refs:
        reps = _size_args(args[1:], kwargs)
        return _numel(shape(0)) * _numel(reps) if reps and min(reps) >= 0 else None
    if name == "expand" and refs:
        size = _size_args(args[1:], kwargs)
        if size is None:
            return None
        own = list(shape(0))
        own = [1] * (len(size) - len(own)) + own
        return _numel(max(int(s), int(o)) for s, o in zip(size, own)) if len(own) == len(size) else None
    if name == "embedding" and len(refs) >= 2:
        a, b = shape(0), shape(1)
        return max(_numel(a) * (b[-1] if b else 1), _numel(b) * (a[-1] if a else 1))
    if name == "index_select" and len(refs) >= 2:
        return _numel(shape(0)) * _numel(shape(1))
    if name in ("matmul", "mm", "bmm", "__matmul__", "__rmatmul__") and len(refs) >= 2:
        a, b = (shape(0), shape(1)) if name != "__rmatmul__" else (shape(1), shape(0))
        if len(a) == 1 or len(b) == 1:
            return max(_numel(a), _numel(b))
        return _numel(_broadcast([a[:-2], b[:-2]])) * a[-2] * b[-1]
    if name == "__getitem__" and refs and args and isinstance(args[0], Mapping) and args[0].get("t") == refs[0]:
        index = args[1] if len(args) > 1 else None
        pieces = index if isinstance(index, list) else list(index.get("tuple", [index])) \
            if isinstance(index, Mapping) else [index]
        plain = all(p is None or type(p) in (int, bool) or (isinstance(p, Mapping) and next(iter(p), "") in
                                                             ("slice", "ellipsis")) for p in pieces)
        return _numel(shape(0)) if plain and not isinstance(index, list) else None
    if name in ("lstm", "gru", "rnn_tanh", "rnn_relu") and len(refs) >= 2 and len(shape(0)) >= 2:
        x, h = shape(0), shape(1)
        if not x[-1] or len(h) != 3:
            return None
        return 2 * (_numel(x) // x[-1] * h[0] * h[-1] + sum(_numel(shapes[r]) for r in refs))
    if name == "repeat_interleave" and refs and value is not None:
        x = shape(0)
        dim = args[2] if len(args) > 2 else kwargs.get("dim")
        reps = args[1] if len(args) > 1 else kwargs.get("repeats")
        along = _numel(x) if dim is None else x[dim]
        if type(reps) is int:
            total = reps * along
        elif isinstance(reps, Mapping) and reps.get("t") in shapes and value(reps["t"]) is not None:
            r = value(reps["t"]).reshape(-1)  # summed in float64: no int64 wrap-around
            total = math.ceil(float(r.sum(dtype="float64"))) if r.size > 1 else \
                int(r[0]) * along if r.size else 0
        else:
            return None
        return max(0, total) * (_numel(x) // along if along else 0)
    if name in ("conv1d", "conv2d", "conv3d") and len(refs) >= 2:
        x, w = shape(0), shape(1)
        nd = len(w) - 2
        pad = args[4] if len(args) > 4 else kwargs.get("padding", 0)
        pads = [0] * nd if isinstance(pad, str) else _ints(pad)
        pads = pads * nd if pads is not None and len(pads) == 1 else pads
        if nd < 1 or pads is None or len(pads) != nd or len(x) not in (nd + 1, nd + 2) or min(pads) < 0:
            return None
        return _numel(x[:-nd - 1]) * w[0] * _numel(i + 2 * p for i, p in zip(x[-nd:], pads))
    if name in ("avg_pool1d", "avg_pool2d", "max_pool1d", "max_pool2d") and refs:
        x, nd = shape(0), int(name[-2])
        pad = args[3] if len(args) > 3 else kwargs.get("padding", 0)
        pads = _ints(pad)
        pads = pads * nd if pads is not None and len(pads) == 1 else pads
        if pads is None or len(pads) != nd or len(x) < nd or min(pads) < 0:
            return None
        return 2 * _numel(x[:-nd]) * _numel(i + 2 * p + 1 for i, p in zip(x[-nd:], pads))
    if name in ("adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_max_pool2d") and refs:
        x, nd = shape(0), int(name[-2])
        size = _ints(args[1] if len(args) > 1 else kwargs["output_size"])
        size = size * nd if size is not None and len(size) == 1 else size
        if size is None or len(size) != nd or len(x) < nd or min(size) < 0:
            return None
        return 2 * _numel(x[:-nd]) * _numel(size)
    if name == "one_hot" and refs:
        classes = args[1] if len(args) > 1 else kwargs.get("num_classes", -1)
        if classes == -1 and value is not None and value(refs[0]) is not None:
            v = value(refs[0])
            classes = int(v.max()) + 1 if v.size else 0
        return _numel(shape(0)) * classes if type(classes) is int and classes >= 0 else None
    return None


def _leaves(v: Any) -> Iterable[Any]:
    if isinstance(v, Mapping) and not (len(v) == 1 and next(iter(v)) in ("t", "dtype")):
        for x in v.values():
            yield from _leaves(x)
    elif isinstance(v, list):
        for x in v:
            yield from _leaves(x)
    else:
        yield v


def check_allocation(func: Callable[..., Any], record: str, args: Sequence[Any], kwargs: Mapping[str, Any],
                     budget: int) -> None:
    """Refuse (:class:`AllocationRefused`) a call whose outputs would exceed ``budget`` elements,
    or one of whose aten ops would exceed ``max(budget, INTERMEDIATE_CAP)``: the call runs on the
    meta device first (``args``/``kwargs``: meta tensors, :func:`meta_args`). Nothing is allocated.
    A call that fails on the meta device for another reason is left to fail (or not) for real."""
    mode = _Meta(record, max(budget, INTERMEDIATE_CAP))
    try:
        with torch.no_grad(), mode:
            out = func(*args, **kwargs)
    except AllocationRefused:
        raise
    except _MetaFailed as exc:
        if mode.data_dependent is not None:
            return  # bounded by the inputs, which are the record's own
        raise AllocationRefused(record, f"its output size cannot be bounded before it runs ({exc})"[:400]) from None
    except Exception:  # noqa: BLE001 - bad arguments (a shape check): the real call reports them
        return
    n = _elements(out)
    if out is None and args and isinstance(args[0], torch.Tensor):
        n = args[0].numel()  # an in-place API that returns nothing (__setitem__)
    if n > budget:
        raise AllocationRefused(record, f"its arguments would make outputs of {n:,} elements ({_gib(n)}), "
                                        f"more than its recorded outputs allow ({budget:,} elements: "
                                        f"{MARGIN} x theirs + {FLOOR:,})")


def guard_arrays(func: Callable[..., Any], record: str, spec: Mapping[str, Any], arrays: Mapping[str, Any],
                 dtypes: Mapping[str, str]) -> None:
    """:func:`guard_call` for a call whose tensors are loaded arrays (``{"input.0": ndarray}``,
    recorded dtypes by key): the outputs are ``output.*`` of ``arrays``, their real shapes."""
    from pytest_ptdbg.replayer.allowlist import dtype_of

    def dtype(key: str) -> Any:
        name = str(dtypes.get(key, ""))
        dt = dtype_of(name.split(".", 1)[1] if name.startswith(("torch.", "numpy.")) else name)
        return dt if dt is not None else _numpy_dtype(arrays[key])

    guard_call(func, record, spec, {k: a.shape for k, a in arrays.items()}, dtype,
               [a.shape for k, a in arrays.items() if k.startswith("output.")],
               lambda k: arrays[k] if k in arrays and arrays[k].size <= FLOOR else None)


def _numpy_dtype(a: Any) -> Any:
    return torch.from_numpy(a.reshape(-1)[:0].copy()).dtype
