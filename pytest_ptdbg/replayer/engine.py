"""The replay engine: one recorded call run again, by :func:`replay_call`, for every replay path.

The judgement (``judge/own_error.py``: the oracle, the reference, the lower-precision replays;
``judge/downcast.py``: a consumer under autocast), ``ptdbg replay PACKAGE`` and the capture
sinks' re-runs (``repro/runner.py``) all run a call here, with one set of rules:

* the API only through the allowlist (:func:`resolve_api`; collectives refused), its arguments
  only as data (:func:`.codec.decode_call`), recorded devices replaced by the replay device
  (:func:`retarget`);
* inputs are fresh tensors of their own memory, in their recorded dtype (:func:`fresh_tensor`),
  laid out as recorded (``strides``); the **oracle** makes its floating inputs (and floating
  ``dtype=`` arguments) float64 before anything else; another replay dtype (``cast``) casts the
  floating inputs when the call gets them (and, with ``cast_args``, the floating ``dtype=``
  arguments);
* **one leaf rule**: with ``backward`` the floating inputs that required grad are autograd leaves,
  passed to the call as they are; only when that call fails (autograd refuses an in-place change
  of a leaf) it runs again on copies of them (the same numbers: a copy's gradient is its leaf's);
* **one autocast rule**: autocast is off, unless ``autocast`` names the dtype to run it in; oneDNN
  as it is, unless ``mkldnn=False`` (the recorded math modes, :mod:`.modes`);
* the result is what the call gave back (:func:`effective_output`: an in-place API's first
  argument when it returns nothing), keyed ``output.i``; with ``backward`` the gradients
  :func:`torch.autograd.grad` produces from the recorded incoming gradients (``backward_input.i``)
  are added as ``backward_output.j``.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, ContextManager, Dict, List, Mapping, Optional, Tuple

import numpy as np

from pytest_ptdbg.errors import NotReplayable, ReplayError, ReplayRefused
from pytest_ptdbg.replayer import codec
from pytest_ptdbg.runtime.reduced_fp32 import Operands, round_mantissa
from pytest_ptdbg.replayer.allowlist import torch_dtype

__all__ = ["api_path", "resolve_api", "parse_dtype", "check_device", "effective_output", "retarget",
           "fresh_tensor", "replay_call", "Replayed"]


def api_path(api_type: str, api_name: str, record: Optional[str] = None) -> Tuple[str, List[str]]:
    """``(module path, [attribute])`` of an allowlisted API, e.g. ``("torch.nn.functional", ["conv2d"])``,
    from the judge's table (``pytest_ptdbg/replayer/allowlist.py``).

    Raises ReplayError for collectives (not replayable alone) and ReplayRefused (a ValueError) for
    an API that is not in the allowlist.
    """
    from pytest_ptdbg.replayer import allowlist

    _no_collective(api_type, api_name)
    root, _, attr = allowlist.qualified_name(api_type, api_name, record).rpartition(".")
    return root, [attr]


def _no_collective(api_type: str, api_name: str) -> None:
    if api_type == "Distributed":
        raise ReplayError(f"Distributed_{api_name}: a collective needs its process group and cannot be replayed alone")


def resolve_api(api_type: str, api_name: str, record: Optional[str] = None) -> Callable:
    """The callable of ``{api_type}_{api_name}`` from the judge's allowlist (``Tensor`` methods
    take ``self`` first). Raises ReplayRefused (a ValueError) naming ``record`` when the API is not
    allowlisted; nothing is looked up by the name itself."""
    from pytest_ptdbg.replayer import allowlist

    _no_collective(api_type, api_name)
    return allowlist.resolve(api_type, api_name, record)


def parse_dtype(dtype: Any) -> Any:
    """``None``, a ``torch.dtype`` or a name like ``"float64"``/``"torch.bfloat16"`` -> dtype."""
    import torch

    from pytest_ptdbg.replayer.allowlist import dtype_of

    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    dt = dtype_of(str(dtype))
    if dt is None or not dt.is_floating_point:
        raise ValueError(f"--dtype must be a floating-point torch dtype such as 'float64', got {dtype!r}")
    return dt


def check_device(device: str) -> Any:
    """A usable ``torch.device`` for ``device`` (``cpu``, ``cuda[:i]``, ``npu[:i]``) or ReplayError."""
    from pytest_ptdbg.runtime.device import DeviceUnavailable, resolve_device

    if str(device).strip().lower() == "auto":
        raise ReplayError("replay needs an explicit device: cpu, cuda[:i] or npu[:i]")
    try:
        return resolve_device(str(device))
    except DeviceUnavailable as exc:
        raise ReplayError(str(exc)) from None


def effective_output(output: Any, args: Any) -> Any:
    """What an API gave back; for an in-place API that returns nothing (``__setitem__``) the
    tensor it modified, its first argument (``_foreach_add_``, ``_fused_adamw_``: the list of
    tensors it modified, its first argument, as capture records it)."""
    import torch

    if not codec.flatten_output(output) and args:
        first = args[0]
        if isinstance(first, torch.Tensor):
            return first
        if isinstance(first, (list, tuple)) and first and all(isinstance(t, torch.Tensor) for t in first):
            return list(first)
    return output


def retarget(args: list, kwargs: dict, dev: Any, dtype: Any) -> Tuple[list, dict]:
    """Replace saved ``torch.device`` arguments (e.g. ``device="npu:0"``) by the replay device and,
    with a ``dtype`` override, floating ``torch.dtype`` arguments by it (an oracle runs in float64)."""
    import torch

    def fix(v: Any) -> Any:
        if isinstance(v, torch.device):
            return dev
        if dtype is not None and isinstance(v, torch.dtype) and v.is_floating_point:
            return dtype
        if isinstance(v, list):
            return [fix(x) for x in v]
        if isinstance(v, tuple):
            return tuple(fix(x) for x in v)
        return v

    return fix(args), {k: fix(v) for k, v in kwargs.items()}


def fresh_tensor(arr: np.ndarray, want: Any, oracle: bool = False) -> Any:
    """A CPU tensor of its own memory holding ``arr`` in its recorded dtype ``want`` (float64 for
    a floating one when ``oracle``); ``arr`` is shared and never written."""
    import torch

    base = torch.from_numpy(arr) if arr.flags.writeable else torch.from_numpy(np.array(arr, copy=True))
    t = base
    if want is not None and t.dtype != want:
        t = t.to(want)
    if oracle and t.is_floating_point():
        t = t.to(torch.float64)
    if t is base:
        t = t.clone()
    return t


@dataclass
class Replayed:
    """What one :func:`replay_call` produced."""

    #: ``output.i`` (detached) and, with ``backward``, ``backward_output.j``
    tensors: Dict[str, Any]
    #: the input keys that were autograd leaves (empty without ``backward``)
    leaves: List[str] = field(default_factory=list)
    #: whether autograd ran: a leaf and an output with a recorded incoming gradient were there
    differentiated: bool = False


def replay_call(func: Callable[..., Any], api: str, spec: Mapping[str, Any], arrays: Mapping[str, np.ndarray],
                dtypes: Mapping[str, str], device: Any, *, oracle: bool = False, cast: Any = None,
                cast_args: bool = False, autocast: Any = None, mkldnn: bool = True, backward: bool = False,
                requires_grad: Collection[str] = (), strides: Optional[Mapping[str, Tuple[int, ...]]] = None,
                draws: Optional[Callable[[], ContextManager[Any]]] = None,
                reduced: Optional[Tuple[str, Operands]] = None) -> Replayed:
    """Run ``func`` (resolved by :func:`resolve_api`) on the call spec ``spec`` of record ``api``
    (the module docstring's rules).

    ``arrays``: the recorded tensors by key (``input.0``, ``backward_input.0``; read only, a lazy
    mapping is fine: only the keys the call names are read); ``dtypes``: their recorded dtype
    names; ``device``: a ``torch.device``; ``oracle``: float64; ``cast``: the floating inputs in this
    dtype (``cast_args``: the floating ``dtype=`` arguments too); ``autocast``: run under autocast
    to this dtype (default: autocast off); ``mkldnn``: False runs it with oneDNN switched off (as the
    call was recorded, :mod:`.modes`); ``backward``: differentiate the inputs in
    ``requires_grad``; ``strides``: an input's recorded layout; ``draws``: a context manager factory
    the call runs in (the recorded random generator state); ``reduced``: ``(format, operands)``, the
    float32 product operands (and the incoming gradients) rounded to a reduced format first, as a
    TF32/HF32 kernel computes (``runtime/reduced_fp32.py``).

    Raises ReplayRefused/NotReplayable (before any call) for what is not data, ReplayError when the
    call or its backward fails.
    """
    red = None if oracle else reduced
    if not backward:
        with _onednn(mkldnn):
            return _replay_once(func, api, spec, arrays, dtypes, device, oracle, cast, cast_args, autocast, False,
                                requires_grad, strides or {}, draws, red, True)
    with _onednn(mkldnn):
        try:
            return _replay_once(func, api, spec, arrays, dtypes, device, oracle, cast, cast_args, autocast, True,
                                requires_grad, strides or {}, draws, red, False)
        except ReplayError:
            return _replay_once(func, api, spec, arrays, dtypes, device, oracle, cast, cast_args, autocast, True,
                                requires_grad, strides or {}, draws, red, True)


@contextlib.contextmanager
def _onednn(enabled: bool) -> Any:
    """oneDNN switched off for the block when ``enabled`` is False (the flag alone:
    ``torch.backends.mkldnn.flags`` also sets oneDNN's TF32 mode and warns about it)."""
    import torch

    was = torch._C._get_mkldnn_enabled()
    if enabled or not was:
        yield
        return
    torch._C._set_mkldnn_enabled(False)
    try:
        yield
    finally:
        torch._C._set_mkldnn_enabled(was)


def _replay_once(func: Callable[..., Any], api: str, spec: Mapping[str, Any], arrays: Mapping[str, np.ndarray],
                 dtypes: Mapping[str, str], dev: Any, oracle: bool, cast: Any, cast_args: bool, autocast: Any,
                 backward: bool, requires_grad: Collection[str], strides: Mapping[str, Tuple[int, ...]],
                 draws: Optional[Callable[[], ContextManager[Any]]],
                 reduced: Optional[Tuple[str, Operands]], copy_leaves: bool) -> Replayed:
    import torch

    leaves: Dict[str, Any] = {}

    def tensor(key: str) -> Any:
        # own memory: in-place calls change only it
        t = fresh_tensor(arrays[key], torch_dtype(dtypes.get(key, "")), oracle)
        st = strides.get(key)
        if st is not None and tuple(t.shape) and len(st) == t.dim():
            t = torch.empty_strided(t.shape, st, dtype=t.dtype).copy_(t)  # the layout it was called with
        if t.is_floating_point():
            if backward and key in requires_grad:
                t.requires_grad_(True)
                leaves[key] = t
            if not oracle and cast is not None and t.dtype != cast:
                t = t.to(cast)
            elif key in leaves and copy_leaves:
                t = t.clone()
        return t.to(dev) if dev.type != "cpu" else t

    try:
        args, kwargs = codec.decode_call(spec, list(arrays), tensor, where=api, device=dev)
    except (ReplayRefused, NotReplayable):
        raise
    except ValueError as exc:
        raise ReplayError(str(exc)) from None
    args, kwargs = retarget(args, kwargs, dev, torch.float64 if oracle else cast if cast_args else None)
    if reduced is not None:
        args, kwargs = _round_operands(args, kwargs, *reduced)
    casting = (torch.autocast(dev.type, dtype=autocast) if autocast is not None
               else torch.autocast(dev.type, enabled=False))
    with casting, torch.set_grad_enabled(backward), (draws() if draws is not None else contextlib.nullcontext()):
        try:
            out = func(*args, **kwargs)
        except Exception as exc:
            raise ReplayError(f"{api}: the call failed on replay: {type(exc).__name__}: {exc}") from exc
        outs = dict(codec.flatten_output(effective_output(out, args)))
        result = Replayed({k: v.detach() for k, v in outs.items()}, list(leaves))
        if not backward or not leaves:
            return result
        pairs = []
        for gkey in [k for k in arrays if k.startswith("backward_input.")]:
            okey = "output" + gkey[len("backward_input"):]
            o = outs.get(okey)
            if o is None or not o.requires_grad:
                continue
            g = fresh_tensor(arrays[gkey], torch_dtype(dtypes.get(gkey, "")), False)
            if tuple(g.shape) != tuple(o.shape):
                raise ReplayError(f"{api}: gradient {gkey} has shape {list(g.shape)}, "
                                  f"but {okey} has shape {list(o.shape)}")
            g = g.to(device=o.device, dtype=o.dtype)
            if reduced is not None:
                g = round_mantissa(g, reduced[0])  # the backward products round it too
            if strides and not o.is_contiguous():
                # inputs laid out as recorded (channels_last): their gradients flow in that layout too
                g = torch.empty_like(o).copy_(g)
            pairs.append((o, g))
        if not pairs:
            return result
        keys = list(leaves)
        try:
            grads = torch.autograd.grad([o for o, _ in pairs], [leaves[k] for k in keys],
                                        [g for _, g in pairs], allow_unused=True)
        except Exception as exc:
            raise ReplayError(f"{api}: backward failed on replay: {type(exc).__name__}: {exc}") from exc
    for k, g in zip(keys, grads):
        if g is not None:
            result.tensors["backward_output" + k[len("input"):]] = g.detach()
    result.differentiated = True
    return result


def _rounded(v: Any, fmt: str) -> Any:
    """``v`` (a float32 tensor) with its values rounded to ``fmt``; a gradient still reaches ``v``
    (the difference is added as a constant: exact, since it is within one rounding of ``v``)."""
    r = round_mantissa(v, fmt)
    return v + (r - v).detach() if v.requires_grad else r


def _round_operands(args: list, kwargs: dict, fmt: str, operands: Operands) -> Tuple[list, dict]:
    """The call's float32 product operands (by position, or keyword, ``operands``; None: every
    floating tensor, one level into lists) rounded to ``fmt``."""
    import torch

    def one(v: Any) -> Any:
        return _rounded(v, fmt) if isinstance(v, torch.Tensor) and v.dtype == torch.float32 else v

    args, kwargs = list(args), dict(kwargs)
    if operands is None:
        def deep(v: Any) -> Any:
            if isinstance(v, (list, tuple)):
                return type(v)(one(x) for x in v)
            return one(v)
        return [deep(v) for v in args], {k: deep(v) for k, v in kwargs.items()}
    for pos, name in operands:
        if pos < len(args):
            args[pos] = one(args[pos])
        elif name in kwargs:
            kwargs[name] = one(kwargs[name])
    return args, kwargs
