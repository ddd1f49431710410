"""What capture hands to its consumers: the :class:`ApiCall` object and the :class:`Sink` protocol.

Capture (``capture/engine.py``) decides *what* was called; a sink decides *what to do* with it.
The dump writer (``dump/writer.py``: ``DumpSink``) is one sink; the overflow checker
(``sinks/overflow.py``: ``OverflowSink``) and the acl packager (``sinks/acl.py``: ``AclSink``)
are others. ``PrecisionDebugger`` builds its sinks with ``Cls(config=<DebugConfig>, rank_dir=<str>)``
(``runtime/config.py``: fields ``dump_path, hook_name, step, rank, mode, scope, api_list, filter_switch,
input_output_mode, summary_only, acl_config, backward_input, overflow_nums``) and attaches them to
the engine. A sink's callbacks run with capture paused (their torch calls are not recorded); an
exception raised in one never reaches the user's code: capture catches it, warns once per kind of
failure (:func:`report_internal_error`) and tells the sink (``lost``: the dump then misses that
call's records and its manifest says incomplete, naming them), and the user's step goes on
unchanged. The one exception is :class:`SinkStop` (``overflow_check`` stopping the run at the N-th overflow, a
:class:`SinkUsageError`): a sink raises it on purpose and capture lets it through.

Life of one recorded API call (only the outermost public PyTorch call is seen; calls made inside
it, and any torch call a sink makes from its callbacks, are not captured)::

    call = ApiCall(...)                       # api_type, api_name, index k, func, args, kwargs
    wanted = [s for s in sinks if s.start_call(call)]   # BEFORE the real function runs
    call.output = func(*args, **kwargs)       # the real call (inputs that require grad are
                                              # passed as aliases, see below)
    for s in wanted: s.end_call(call)         # AFTER it ran; call.output is set
    ... later, during loss.backward():
    s.on_backward(call, "input", (i,), grad)  # gradient arriving at output i  -> backward_input.i
    s.on_backward(call, "output", (j,), grad) # gradient this API produced for its input j
                                              #                              -> backward_output.j
    ... at stop()/step()/end of the debugger:
    s.flush(); s.close()

Sink protocol (duck-typed; subclass :class:`Sink` for the defaults):

``start_call(call) -> bool``
    Called before the API runs, with ``call.args``/``call.kwargs`` holding the user's own
    arguments (tensors are the caller's objects, not aliases). Record inputs here: an in-place op
    changes them. Return True to receive ``end_call`` and ``on_backward`` for this call.
``end_call(call) -> None``
    Called after the API returned; ``call.output`` is what the user receives.
``on_backward(call, io, index, grad) -> None``
    ``io`` is ``"input"`` (gradient arriving at the output with that index) or ``"output"``
    (gradient produced for the input with that index); ``index`` is a tuple like ``(0,)`` or
    ``(1, 0)`` for nested lists (``_input.1.0``); ``grad`` is a tensor. Called from autograd;
    gradients of one API arrive one tensor at a time, possibly interleaved with other APIs.
    ``call.backward_key`` names the backward API. Only sinks whose ``wants_backward`` is True and
    that returned True from ``start_call`` get these.
``before_write() -> None`` (optional)
    Called before a call capture does not record but that may write tensors: an in-place op
    outside its name table (``torch.ops.aten.add_``) or a backward pass (hooks run in it unseen).
    A sink that holds records by reference copies them here.
``flush() -> None``: make everything recorded so far durable (end of a start/stop segment).
``close() -> None``: end of a step (or of the debugger); release files.
``lost(reason) -> None`` (optional) and ``degraded``: an internal error cost the sink's output a
    record (:func:`report_internal_error` calls ``lost`` each time; the default keeps the first
    reason as ``degraded``). The dump writer names each in the manifest, which then says
    incomplete: a dump missing a record never passes a compare.

Indexing of inputs and outputs: inputs are ``list(args) + list(kwargs.values())`` (kwargs in the
order given), one index per position (positions holding no tensor or number get no record but keep
their index); a list/tuple argument adds a level (``input.2.0``). A single tensor output is
``output.0``; a tuple/list output is indexed like inputs. :func:`iter_tensors` walks this.

``ApiCall`` fields:

=================  ==============================================================================
``api_type``       "Torch", "Functional", "Tensor", "VF", "Distributed" or "NPU"
``api_name``       e.g. ``"linear"``, ``"__getitem__"``, ``"add_"``
``index``          k: how many calls of this API came before in this step (from 0)
``func``           the callable that was called (e.g. ``torch.nn.functional.linear``)
``args, kwargs``   the user's arguments (kwargs a dict, never None)
``output``         the return value (None before the call). After ``end_call`` the call holds
                   tensors only weakly (see ``ApiCall.release``): in ``on_backward`` a tensor the
                   user already dropped reads as None
``ctx``            ``""`` or ``"optimizer"`` (made inside ``Optimizer.step``)
``inplace``        True for in-place ops (``add_``, ``__iadd__``, ``__setitem__``, ``out=``,
                   ``inplace=True``)
``seq``            execution order of the call within the step (0, 1, ...)
``forward_key``    ``Functional_linear_0_forward`` (property); ``backward_key`` likewise
``stack``          list of ``[file, line, function, code]`` frames, innermost user frame first
                   (property; only valid inside ``start_call``/``end_call``, cached once read)
``state``          a dict a sink may use for its own per-call data (key by sink)
``input_at(idx)``  the input at a tensor index such as ``(2, 0)`` (None when gone); e.g. in
                   ``on_backward`` to find the parameter a ``backward_output`` belongs to
=================  ==============================================================================

No alias (hence no ``backward_output``) for: the first argument of in-place ops, calls with
``out=``, calls under no_grad, ``Distributed`` calls, sparse and nested inputs, and embedding APIs
called with a True flag (``sparse=True`` gives a sparse gradient, which a view cannot pass on).
The same tensor passed twice to one API gets one alias; its gradient (the sum over both uses) is
reported at its first index. An output that is one of the inputs given back unchanged
(``x.to(x.dtype)``, ``x.contiguous()``) is the caller's own tensor again and gets no
``backward_input`` tap.
"""
from __future__ import annotations

import linecache
import os
import warnings
import weakref
from types import CodeType, FrameType
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from pytest_ptdbg.format import records
from pytest_ptdbg.errors import SinkStop, SinkUsageError  # noqa: F401  (re-exported)

__all__ = ["ApiCall", "Sink", "SinkStop", "SinkUsageError", "iter_tensors", "input_items", "report_internal_error"]

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class ApiCall:
    """One call of a public PyTorch API, as seen by capture (see the module docstring)."""

    __slots__ = (
        "api_type", "api_name", "index", "func", "_args", "_kwargs", "_output", "_weak", "ctx", "inplace",
        "seq", "state", "_frame", "_stack", "_fkey", "_bkey", "__weakref__",
    )

    def __init__(
        self,
        api_type: str,
        api_name: str,
        index: int,
        func: Callable,
        args: tuple,
        kwargs: dict,
        ctx: str = "",
        inplace: bool = False,
        seq: int = 0,
        frame: Optional[FrameType] = None,
    ) -> None:
        self.api_type = api_type
        self.api_name = api_name
        self.index = index
        self.func = func
        self._args = args
        self._kwargs = kwargs
        self._output: Any = None
        self._weak = False
        self.ctx = ctx
        self.inplace = inplace
        self.seq = seq
        self.state: dict = {}
        self._frame = frame
        self._stack: Optional[List[list]] = None
        self._fkey: Optional[str] = None
        self._bkey: Optional[str] = None

    @property
    def forward_key(self) -> str:
        k = self._fkey
        if k is None:
            k = self._fkey = records.api_key(self.api_type, self.api_name, self.index, "forward")
        return k

    @property
    def backward_key(self) -> str:
        k = self._bkey
        if k is None:
            k = self._bkey = records.api_key(self.api_type, self.api_name, self.index, "backward")
        return k

    def key(self, direction: str) -> str:
        return records.api_key(self.api_type, self.api_name, self.index, direction)

    @property
    def stack(self) -> List[list]:
        """``[[file, line, function, code], ...]`` of the user's frames, innermost first."""
        if self._stack is None:
            self._stack = extract_stack(self._frame)
            self._frame = None
        return self._stack

    @property
    def args(self) -> tuple:
        return _strong(self._args) if self._weak else self._args

    @args.setter
    def args(self, value: tuple) -> None:
        self._args = value

    @property
    def kwargs(self) -> dict:
        if self._weak:
            return {k: _strong(v) for k, v in self._kwargs.items()}
        return self._kwargs

    @kwargs.setter
    def kwargs(self, value: dict) -> None:
        self._kwargs = value

    @property
    def output(self) -> Any:
        return _strong(self._output) if self._weak else self._output

    @output.setter
    def output(self, value: Any) -> None:
        self._output = value

    def input_at(self, index: Tuple[int, ...]) -> Any:
        """The input at ``index`` (as in ``input.1.0``), None when it is gone or out of range."""
        items = list(self._args) + list(self._kwargs.values()) if self._kwargs else self._args
        v: Any = items
        try:
            for i in index:
                v = v[i]
        except (IndexError, TypeError):
            return None
        return v() if type(v) is _Weak else v

    def release(self) -> None:
        """After ``end_call``: drop the frame, and hold tensors only weakly from now on.

        Gradient hooks keep the call alive; holding its output strongly would make a reference
        cycle through autograd's C++ graph that Python's collector cannot free (every step's
        activations would leak). In ``on_backward``, ``args``/``kwargs``/``output`` still give the
        tensors that are alive, and None for those already freed.
        """
        self._frame = None
        if not self._weak:
            self._args = _weaken(self._args)
            self._kwargs = {k: _weaken(v) for k, v in self._kwargs.items()} if self._kwargs else {}
            self._output = _weaken(self._output)
            self._weak = True

    def __repr__(self) -> str:
        return f"ApiCall({self.forward_key})"


class _Weak(weakref.ref):
    """A weak reference to a tensor of a released call (a subclass, so that a user's own weak
    reference among the arguments is never taken for one of ours)."""

    __slots__ = ()


def _weaken(v: Any) -> Any:
    if isinstance(v, _TENSOR or _tensor_type()):
        try:
            return _Weak(v)
        except TypeError:
            return v
    t = type(v)
    if t is list or t is tuple:
        return t([_weaken(x) for x in v])
    if isinstance(v, tuple) and hasattr(v, "_fields"):  # namedtuple / return_types
        return tuple(_weaken(x) for x in v)
    return v


def _strong(v: Any) -> Any:
    if type(v) is _Weak:
        return v()
    t = type(v)
    if t is list or t is tuple:
        return t([_strong(x) for x in v])
    return v


def _tensor_type() -> Any:
    global _TENSOR
    import torch

    _TENSOR = torch.Tensor
    return _TENSOR


_TENSOR: Any = None
#: (code object, line) -> (file, line, function, source) or () for a frame of this package
_FRAME_CACHE: Dict[Tuple[CodeType, int], Tuple[Any, ...]] = {}
_SKIP_FILES = (os.path.join("torch", "overrides.py"),)


#: chain key (code ids and instruction offsets) -> the encoded stack
_CHAINS: Dict[Tuple[int, ...], List[list]] = {}


def extract_stack(frame: Optional[FrameType], limit: int = 30) -> List[list]:
    """Frames from ``frame`` outwards (innermost first), skipping this package's own frames.

    The same chain of frames gives the same (shared, not to be modified) list object, so sinks can
    cache its encoding by ``id``. The chain is looked up by code object and instruction offset
    (``f_lasti``: cheap to read, unlike ``f_lineno``, which decodes the line table); line numbers
    are computed only for a chain not seen before.
    """
    ids: List[int] = []  # ints hash fast; the code objects stay alive as keys of _FRAME_CACHE
    append = ids.append
    f = frame
    n = 0
    while f is not None and n < limit:
        append(id(f.f_code))
        append(f.f_lasti)
        f = f.f_back
        n += 1
    key = tuple(ids)
    hit = _CHAINS.get(key)
    if hit is not None:
        return hit
    chain: List[Tuple[CodeType, int]] = []
    f = frame
    while f is not None and len(chain) < limit:
        chain.append((f.f_code, f.f_lineno))
        f = f.f_back
    out: List[list] = []
    pkg = _PKG_DIR
    cache = _FRAME_CACHE
    for code, line in chain:
        entry = cache.get((code, line))
        if entry is None:
            fn = code.co_filename
            if fn.startswith(pkg) or fn.endswith(_SKIP_FILES):
                entry = ()
            else:
                entry = (fn, line, code.co_name, linecache.getline(fn, line).strip())
            cache[(code, line)] = entry  # never evicted: it keeps the code objects alive
        if entry:
            out.append(list(entry))
    if len(_CHAINS) < 20000 and len(cache) < 200000:
        _CHAINS[key] = out
    return out


_WARNED: set = set()


#: what an internal error costs unless its caller says otherwise
LOST_RECORD = "the dump misses this record"


def report_internal_error(where: str, error: BaseException, sink: Optional[Sink] = None,
                          effect: str = LOST_RECORD) -> None:
    """An internal error of the debugger inside the user's step: never raised, warned once per
    ``(where, exception type)``, and handed to ``sink.lost(reason)`` (every time, not once: the
    dump writer names it in the manifest, which then says incomplete). ``effect`` says, truly,
    what it cost (default: a record is missing); with no sink, nothing recorded was lost."""
    reason = f"{where}: {type(error).__name__}: {error}".splitlines()[0][:300]
    if sink is not None:
        try:
            lost = getattr(sink, "lost", None)
            if callable(lost):
                lost(reason)
            elif getattr(sink, "degraded", None) is None:
                sink.degraded = reason
        except Exception:
            pass
    key = (where.split(" ", 1)[0], type(error).__name__)
    if key in _WARNED:
        return
    _WARNED.add(key)
    try:
        warnings.warn(f"pytest-ptdbg: internal error ({reason}); the step goes on unchanged, {effect} "
                      "(further errors of this kind are not reported)",
                      RuntimeWarning, stacklevel=2)
    except Exception:  # warnings turned into errors (-W error): still never raise into user code
        pass


class Sink:
    """Base class with no-op defaults; see the module docstring for the protocol."""

    #: whether this sink wants ``on_backward`` calls (capture places gradient taps only then)
    wants_backward: bool = True
    #: None, or why the sink's output misses records (see :func:`report_internal_error`)
    degraded: Optional[str] = None

    def lost(self, reason: str) -> None:
        """An internal error cost this sink's output a record (:func:`report_internal_error`):
        the first reason is kept as ``degraded``. A sink that writes a dump must say so in it."""
        if self.degraded is None:
            self.degraded = reason

    def start_call(self, call: ApiCall) -> bool:  # pragma: no cover - protocol default
        return False

    def end_call(self, call: ApiCall) -> None:  # pragma: no cover - protocol default
        pass

    def on_backward(self, call: ApiCall, io: str, index: Tuple[int, ...], grad: Any) -> None:  # pragma: no cover
        pass

    def flush(self) -> None:  # pragma: no cover - protocol default
        pass

    def close(self) -> None:  # pragma: no cover - protocol default
        pass


def input_items(args: tuple, kwargs: dict) -> list:
    """The inputs of a call in index order: ``list(args) + list(kwargs.values())``."""
    if kwargs:
        return list(args) + list(kwargs.values())
    return list(args)


def iter_tensors(value: Any, prefix: Tuple[int, ...] = ()) -> Iterator[Tuple[Tuple[int, ...], Any]]:
    """``(index, leaf)`` for every leaf of ``value`` (a list of inputs, or an output).

    Lists and tuples add an index level; every other object is a leaf (tensor, number, None...).
    For an output that is not a list/tuple call ``iter_tensors([output])``.
    """
    for i, v in enumerate(value):
        idx = prefix + (i,)
        if type(v) in (list, tuple) or (isinstance(v, tuple) and not hasattr(v, "shape")):
            yield from iter_tensors(v, idx)
        else:
            yield idx, v


def outputs_of(output: Any) -> list:
    """The output as an index-ordered list (a single value becomes ``[value]``)."""
    if isinstance(output, (list, tuple)) and not hasattr(output, "shape"):
        return list(output)
    return [output]
