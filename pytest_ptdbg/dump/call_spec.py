"""The call spec: a JSON description of an API call's arguments (the encode side; the judge decodes it,
as data only, in ``pytest_ptdbg/replayer/arguments.py``).

Format (``docs/DESIGN.md``): ``{"args": [...], "kwargs": {...}}``; a tensor argument is
``{"t": "input.0"}`` (its tensor key suffix, indexed as in ``sink.py``); ``int/float/bool/str/None``
as is; ``{"dtype": "torch.float32"}``, ``{"device": "cpu"}``, ``{"slice": [start, stop, step]}``,
``{"ellipsis": true}``, ``{"tuple": [...]}``, lists as lists, ``{"float": "nan"|"inf"|"-inf"}``,
``{"repr": "..."}`` for anything else (not replayable). Also ``{"size": [...]}`` for torch.Size,
``{"memory_format": "torch.channels_last"}`` and ``{"layout": "torch.strided"}``.

A list or tuple (or a rectangular nest of them) of more than :data:`SEQ_DATA_MIN` Python numbers is
data, not a literal (``torch.tensor(list_of_2M_floats)``): the spec says ``{"list_data": "input.0"}``
(all lists) or ``{"tuple_data": "input.0"}`` (all tuples) and the writer records it once, as a
tensor record of that key (float64, int64 or bool; shape, statistics, ``.npy`` when tensors are
saved; see :func:`number_sequence`). A nest mixing lists and tuples, or ints and floats, is still
recorded as data but its spec is a ``repr`` (not replayable: the judge could not rebuild it exactly).

A tensor input whose memory is dense but not row-major (``channels_last``, a transposed copy)
adds its strides under the optional ``"strides"`` key (``{"input.0": [3072, 1, 192, 12]}``), so a
replay hands the kernel the layout it saw; readers that do not know the key ignore it.

A call made under a math mode that changes what a correct kernel computes adds it under the optional
``"modes"`` key (:func:`math_modes`): ``{"autocast": "torch.bfloat16"}`` when autocast was on for
the device type of the call's first tensor (a composite kernel such as PyTorch's own LSTM then
computes inside in bf16 although its outputs are float32), ``{"mkldnn": false}`` when oneDNN was
switched off, ``{"fp32": "tf32"}`` (or ``"hf32"``, ``"bf16"``) when the call is a float32 matmul,
convolution or RNN that its device's flags allowed to compute in that reduced format
(``runtime/environment.py``: TF32 convolutions are cuDNN's default). The judgement's reference
replay runs under them; an argument comparer ignores them.
"""
from __future__ import annotations

import json
import math
from json.encoder import encode_basestring_ascii as _json_str
from typing import Any, Dict, Mapping, NamedTuple, Optional, Tuple

import torch

from pytest_ptdbg.runtime.environment import fp32_mode

__all__ = ["SEQ_DATA_MIN", "NumberSequence", "dense_strides", "encode_call", "encode_call_json",
           "encode_value", "first_tensor", "math_modes", "number_sequence", "sequence_tensor"]


def _idx(path: Tuple[int, ...]) -> str:
    return "input." + ".".join(str(i) for i in path)


#: a list/tuple argument holding more than this many numbers is recorded as data (one record)
SEQ_DATA_MIN = 64
_NUMBER_TYPES = frozenset((float, int, bool))
_CONTAINERS = frozenset((list, tuple))


class NumberSequence(NamedTuple):
    """What :func:`number_sequence` found: a rectangular nest of Python numbers."""

    shape: Tuple[int, ...]
    dtype: Any          # torch.float64 (some float), torch.int64 (ints) or torch.bool (bools only)
    tag: Optional[str]  # "list_data" / "tuple_data"; None when it cannot be rebuilt exactly (mixed)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


def number_sequence(v: Any) -> Optional[NumberSequence]:
    """A list/tuple ``v`` that is a rectangular nest of lists/tuples of Python numbers (``float``,
    ``int``, ``bool``, exactly those types) holding more than :data:`SEQ_DATA_MIN` of them; else
    None (small literals, ragged nests, anything holding another object: tensors, None, str...).
    Cost: one ``type()`` per element, in C."""
    tv = type(v)
    if tv not in _CONTAINERS:
        return None
    level = [v]
    shape: list = []
    containers = {tv}
    total = 1
    while True:
        n = len(level[0])
        if n == 0 or any(len(x) != n for x in level):
            return None
        shape.append(n)
        total *= n
        if len(level) == 1:
            kinds = set(map(type, level[0]))
        else:
            kinds = set()
            for x in level:
                kinds.update(map(type, x))
        if kinds <= _NUMBER_TYPES:
            break
        if not kinds <= _CONTAINERS or len(shape) >= 32:
            return None
        containers |= kinds
        level = [y for x in level for y in x]
    if total <= SEQ_DATA_MIN:
        return None
    if float in kinds:
        dtype = torch.float64
    elif int in kinds:
        dtype = torch.int64
    else:
        dtype = torch.bool
    exact = len(kinds) == 1 and len(containers) == 1
    tag = ("list_data" if tv is list else "tuple_data") if exact else None
    return NumberSequence(tuple(shape), dtype, tag)


def sequence_tensor(v: Any, seq: NumberSequence) -> torch.Tensor:
    """The data of a :func:`number_sequence` as a CPU tensor (raises for ints beyond int64)."""
    return torch.tensor(v, dtype=seq.dtype)


def _sequence_spec(seq: NumberSequence, path: Tuple[int, ...]) -> Dict[str, str]:
    key = _idx(path)
    if seq.tag is not None:
        return {seq.tag: key}
    return {"repr": f"a nest of {seq.numel} numbers mixing lists and tuples or ints and floats, "
                    f"recorded as data {key} (not rebuilt for replay)"}


def encode_value(v: Any, path: Tuple[int, ...]) -> Any:
    """One argument as JSON; ``path`` is its input index (used for tensors)."""
    if isinstance(v, torch.Tensor):
        return {"t": _idx(path)}
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        if math.isnan(v):
            return {"float": "nan"}
        if math.isinf(v):
            return {"float": "inf" if v > 0 else "-inf"}
        return v
    if isinstance(v, torch.dtype):
        return {"dtype": str(v)}
    if isinstance(v, torch.device):
        return {"device": str(v)}
    if isinstance(v, torch.Size):
        return {"size": list(v)}
    if isinstance(v, torch.memory_format):
        return {"memory_format": str(v)}
    if isinstance(v, torch.layout):
        return {"layout": str(v)}
    if isinstance(v, slice):
        return {"slice": [encode_value(v.start, path), encode_value(v.stop, path), encode_value(v.step, path)]}
    if v is Ellipsis:
        return {"ellipsis": True}
    if type(v) is list or type(v) is tuple:
        seq = number_sequence(v)
        if seq is not None:
            return _sequence_spec(seq, path)
        if type(v) is list:
            return [encode_value(x, path + (j,)) for j, x in enumerate(v)]
        return {"tuple": [encode_value(x, path + (j,)) for j, x in enumerate(v)]}
    if isinstance(v, complex):
        return {"repr": repr(v)}
    return {"repr": repr(v)[:200]}


def dense_strides(shape: Any, strides: Any) -> bool:
    """Whether ``strides`` lay out a tensor of ``shape`` densely without overlap (a permutation of
    a row-major layout; dimensions of size 1 take any stride): memory ``empty_strided`` can fill."""
    if len(shape) != len(strides):
        return False
    dims = sorted((d for d in range(len(shape)) if shape[d] != 1), key=lambda d: -strides[d])
    expected = 1
    for d in reversed(dims):
        if shape[d] == 0:
            return True
        if strides[d] != expected:
            return False
        expected *= shape[d]
    return True


def _strides_of(v: Any, path: Tuple[int, ...], out: Dict[str, list]) -> None:
    if isinstance(v, _Tensor):
        try:
            if v.layout is _STRIDED and not v.is_contiguous():
                st = list(v.stride())
                if dense_strides(v.shape, st):
                    out[_idx(path)] = st
        except (RuntimeError, NotImplementedError):  # nested, sparse-like subclasses: row-major
            pass
    elif type(v) is list or type(v) is tuple:
        for j, x in enumerate(v):
            _strides_of(x, path + (j,), out)


_SEQ = (list, tuple)


def layout_strides(args: tuple, kwargs: Mapping[str, Any]) -> Dict[str, list]:
    """``{"input.0": strides}`` of the tensor inputs laid out densely but not row-major."""
    out: Dict[str, list] = {}
    i = 0
    for v in args:
        tv = type(v)
        # the common case first: a plain row-major tensor, or no tensor at all
        if not ((tv in _SEQ) or (isinstance(v, _Tensor) and not _contiguous(v))):
            i += 1
            continue
        _strides_of(v, (i,), out)
        i += 1
    if kwargs:
        for v in kwargs.values():
            _strides_of(v, (i,), out)
            i += 1
    return out


def _contiguous(t: Any) -> bool:
    try:
        return t.is_contiguous()
    except (RuntimeError, NotImplementedError):
        return True


def encode_call(args: tuple, kwargs: Mapping[str, Any], modes: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The call spec of ``func(*args, **kwargs)``: inputs are indexed args first, then kwargs;
    ``modes`` (:func:`math_modes`) when the call ran under any."""
    n = len(args)
    spec = {
        "args": [encode_value(a, (i,)) for i, a in enumerate(args)],
        "kwargs": {k: encode_value(v, (n + j,)) for j, (k, v) in enumerate(kwargs.items())},
    }
    st = layout_strides(args, kwargs)
    if st:
        spec["strides"] = st
    if modes:
        spec["modes"] = dict(modes)
    return spec


#: ``json.dumps(obj, separators=(", ", ": "))`` without building an encoder per call
_ENCODE = json.JSONEncoder(separators=(", ", ": ")).encode
_Tensor = torch.Tensor
_STRIDED = torch.strided
_float_repr = float.__repr__
_int_repr = int.__repr__


def _value_json(v: Any, path: Tuple[int, ...]) -> str:
    """``_ENCODE(encode_value(v, path))``, written directly for the common argument types."""
    if isinstance(v, _Tensor):
        if len(path) == 1:
            return '{"t": "input.%d"}' % path[0]
        return '{"t": "' + _idx(path) + '"}'
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    tv = type(v)
    if tv is int:
        return _int_repr(v)
    if tv is float and v - v == 0.0:  # finite
        return _float_repr(v)
    if tv is str:
        return _json_str(v)
    if tv is list or tv is tuple:
        seq = number_sequence(v)
        if seq is not None:
            return _ENCODE(_sequence_spec(seq, path))
    if tv is list:
        return "[" + ", ".join([_value_json(x, path + (j,)) for j, x in enumerate(v)]) + "]"
    if tv is tuple:
        return '{"tuple": [' + ", ".join([_value_json(x, path + (j,)) for j, x in enumerate(v)]) + "]}"
    return _ENCODE(encode_value(v, path))


def encode_call_json(args: tuple, kwargs: Mapping[str, Any], modes: Optional[Dict[str, Any]] = None) -> str:
    """The call spec of ``func(*args, **kwargs)`` as JSON text: exactly
    ``json.dumps(encode_call(args, kwargs, modes), separators=(", ", ": "))``, built without the dict."""
    n = len(args)
    a = ", ".join([_value_json(v, (i,)) for i, v in enumerate(args)])
    if kwargs:
        kw = ", ".join([_json_str(k) + ": " + _value_json(v, (n + j,)) for j, (k, v) in enumerate(kwargs.items())])
    else:
        kw = ""
    st = layout_strides(args, kwargs)
    text = '{"args": [' + a + '], "kwargs": {' + kw + "}"
    if st:
        text += ', "strides": ' + _ENCODE(st)
    if modes:
        text += ', "modes": ' + _ENCODE(modes)
    return text + "}"


#: a call's argument structure (see :func:`_call_key`) -> its call spec text, for calls without modes
_SPEC_TEXT: Dict[tuple, str] = {}
_SPEC_TEXT_MAX = 4096
#: what a plain row-major tensor argument contributes to a call key (its spec names only its position)
_TENSOR_KEY = ("tensor",)
_Param = torch.nn.Parameter
_KEYED_SCALARS = (int, bool, str, type(None))


def _value_key(v: Any) -> Any:
    """The part of a call key for argument ``v``, or None when its spec text is not cached: a plain
    contiguous tensor (its spec names only its position), or a number, flag, string or None by type
    and value. A float zero (whose sign the key would lose), NaN, Inf, lists and anything else are
    not cached."""
    tv = type(v)
    if tv is _Tensor or tv is _Param:
        return _TENSOR_KEY if v.layout is _STRIDED and v.is_contiguous() else None
    if tv is float:
        return (tv, v) if v != 0.0 and v - v == 0.0 else None
    if tv in _KEYED_SCALARS:
        return (tv, v)
    return None


def _call_key(args: tuple, kwargs: Mapping[str, Any]) -> Optional[tuple]:
    """What :func:`encode_call_json` of ``args``/``kwargs`` depends on, as a dict key, or None."""
    parts = []
    for v in args:
        k = _value_key(v)
        if k is None:
            return None
        parts.append(k)
    if kwargs:
        parts.append(tuple(kwargs))
        for v in kwargs.values():
            k = _value_key(v)
            if k is None:
                return None
            parts.append(k)
    return tuple(parts)


def call_json(args: tuple, kwargs: Mapping[str, Any], modes: Optional[Dict[str, Any]] = None) -> str:
    """:func:`encode_call_json`, remembered per argument structure for calls without math modes
    whose arguments are plain tensors and scalars (the same text: a call repeated in a loop
    encodes once)."""
    if modes is None:
        try:
            key = _call_key(args, kwargs)
        except Exception:  # noqa: BLE001 - a tensor kind without a layout or strides: not cached
            key = None
        if key is not None:
            text = _SPEC_TEXT.get(key)
            if text is None:
                text = encode_call_json(args, kwargs, None)
                if len(_SPEC_TEXT) >= _SPEC_TEXT_MAX:
                    _SPEC_TEXT.clear()
                _SPEC_TEXT[key] = text
            return text
    return encode_call_json(args, kwargs, modes)


_autocast_on = torch._C._is_any_autocast_enabled
_mkldnn_on = torch._C._get_mkldnn_enabled


def math_modes(args: tuple, kwargs: Mapping[str, Any], fp32_family: Optional[str] = None) -> Optional[Dict[str, Any]]:
    """The math modes the call runs under that change what a correct kernel computes (see the module
    docstring), or None when there are none (the common case: two C calls). ``fp32_family``: the
    call is a matmul, convolution or RNN (``runtime/reduced_fp32.py``) whose float32 precision a
    backend flag may reduce (TF32, HF32, BF16): the reduced format allowed now is recorded."""
    out: Dict[str, Any] = {}
    if not _mkldnn_on():
        out["mkldnn"] = False
    autocast = False
    if _autocast_on():
        device = _first_device(args, kwargs)
        if device is not None:
            try:
                if torch.is_autocast_enabled(device):
                    out["autocast"] = str(torch.get_autocast_dtype(device))
                    autocast = True
            except (RuntimeError, ValueError, TypeError):  # a device type autocast does not know
                pass
    if fp32_family is not None and not autocast:
        t = first_tensor(args, kwargs)
        if t is not None and t.dtype is _F32:
            fmt = fp32_mode(fp32_family, t.device.type)
            if fmt:
                out["fp32"] = fmt
    return out or None


_F32 = torch.float32


def first_tensor(args: tuple, kwargs: Mapping[str, Any]) -> Any:
    """The call's first tensor (looking one level into lists), or None."""
    for v in (*args, *kwargs.values()):
        if isinstance(v, _Tensor):
            return v
        if type(v) in _SEQ:
            for x in v:
                if isinstance(x, _Tensor):
                    return x
    return None


def _first_device(args: tuple, kwargs: Mapping[str, Any]) -> Optional[str]:
    """The device type of the call's first tensor (looking one level into lists), or None."""
    for v in (*args, *kwargs.values()):
        if isinstance(v, _Tensor):
            return v.device.type
        if type(v) in _SEQ:
            for x in v:
                if isinstance(x, _Tensor):
                    return x.device.type
    return None

