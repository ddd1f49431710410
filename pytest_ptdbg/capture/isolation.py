"""The debugger's own torch calls run outside the user's modes; functorch's wrapped tensors are read
through to their values.

:func:`isolated` is a context for the debugger's arithmetic (statistics, snapshots, ``.npy``
conversion) that leaves, for its duration, whatever the user entered around the step: autocast (its
casts would change the statistics or make a batched ``torch.cat`` fail), torch function modes and
``__torch_function__`` of subclasses, torch dispatch modes, and functorch's transforms (under
``torch.func.grad``/``vmap`` every op's result is wrapped for the transform's level, and a wrapped
tensor has no storage to read). When none of these is active (the usual case) it is a no-op object.

:func:`unwrap` gives the plain tensor inside functorch's wrappers (``GradTrackingTensor``,
``BatchedTensor``, one level after the other): what capture hands to the sinks while a transform runs,
so that records hold the values (for a vmapped tensor: all lanes, batch dimension included) and the
user's wrapped tensors are never touched.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Optional

import torch

__all__ = [
    "NOOP", "isolated", "outside_modes", "modes_off", "modes_on", "functorch_active",
    "unwrap", "unwrap_tree",
]

_any_autocast = torch._C._is_any_autocast_enabled
_tf_len = torch._C._len_torch_function_stack
_td_len = torch._C._len_torch_dispatch_stack
_DisableAutocast = torch._C._DisableAutocast
_DisableTorchFunction = torch._C.DisableTorchFunction

_ft_level: Callable[[], Optional[int]]
_is_wrapped: Callable[[torch.Tensor], bool]
_get_unwrapped: Callable[[torch.Tensor], torch.Tensor]
try:
    _ft = torch._C._functorch
    _ft_level = _ft.maybe_current_level
    _is_wrapped = _ft.is_functorch_wrapped_tensor
    _get_unwrapped = _ft.get_unwrapped
except AttributeError:  # pragma: no cover - torch without functorch
    def _ft_level() -> Optional[int]:
        return None

    def _is_wrapped(tensor: torch.Tensor) -> bool:
        return False

    def _get_unwrapped(tensor: torch.Tensor) -> torch.Tensor:  # never reached: nothing is wrapped
        return tensor

_Tensor = torch.Tensor
#: what :func:`isolated` gives when nothing is to be left
NOOP = contextlib.nullcontext()


def functorch_active() -> bool:
    """Whether a functorch transform (``torch.func.grad``, ``vmap``, ``jvp``...) is running."""
    return _ft_level() is not None


def isolated() -> ContextManager[object]:
    """A context outside the user's autocast, modes and functorch transforms (see the module
    docstring); the shared no-op context :data:`NOOP` when none is active."""
    if not (_ft_level() is not None or _td_len() or _tf_len() or _any_autocast()):
        return NOOP
    return _Isolated()


def outside_modes() -> ContextManager[object]:
    """:func:`isolated` for capture's per-call path: the same context, but autocast alone (whose
    check costs as much as the other three) does not make it: autocast changes no op the sinks run
    per call (clone, detach, conversions), and the statistics leave it themselves
    (``dump.stats``: :func:`tensor_stats` and :func:`batch_stat_columns`)."""
    if not (_ft_level() is not None or _td_len() or _tf_len()):
        return NOOP
    return _Isolated()


class _Isolated:
    """Leaves each active state on enter, in this order, and restores them in reverse on exit."""

    __slots__ = ("_guards",)

    def __init__(self) -> None:
        self._guards: list = []

    def __enter__(self) -> "_Isolated":
        guards = self._guards
        try:
            if _ft_level() is not None:
                from torch._functorch.pyfunctorch import temporarily_clear_interpreter_stack

                _enter(guards, temporarily_clear_interpreter_stack())
            if _td_len():
                from torch.utils._python_dispatch import _disable_current_modes

                _enter(guards, _disable_current_modes())
            if _tf_len():
                _enter(guards, _DisableTorchFunction())
            if _any_autocast():
                _enter(guards, _DisableAutocast())
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        guards = self._guards
        while guards:
            guards.pop().__exit__(None, None, None)


def _enter(guards: list, cm: Any) -> None:
    cm.__enter__()
    guards.append(cm)


_pop_tf = torch._C._pop_torch_function_stack
_push_tf = torch._C._push_on_torch_function_stack


def modes_off() -> list:
    """Pop every torch function mode (innermost first) and return them, for :func:`modes_on`.
    Unlike ``DisableTorchFunction`` this leaves tensor subclasses' ``__torch_function__`` on
    (capture's aliases of a subclass stay of that subclass)."""
    modes = []
    while _tf_len():
        modes.append(_pop_tf())
    return modes


def modes_on(modes: list) -> None:
    """Push back the modes :func:`modes_off` popped (the list is emptied)."""
    while modes:
        _push_tf(modes.pop())


def unwrap(t: Any) -> Any:
    """The plain tensor inside functorch's wrappers around ``t`` (``t`` itself when not wrapped)."""
    while _is_wrapped(t):
        t = _get_unwrapped(t)
    return t


def unwrap_tree(v: Any) -> Any:
    """:func:`unwrap` of every tensor in ``v`` (lists, tuples, dict values); other objects as they are."""
    if isinstance(v, _Tensor):
        return unwrap(v)
    tv = type(v)
    if tv is list or tv is tuple:
        return tv([unwrap_tree(x) for x in v])
    if isinstance(v, tuple):  # namedtuple / torch.return_types: indexed as a tuple
        return tuple([unwrap_tree(x) for x in v])
    if tv is dict:
        return {k: unwrap_tree(x) for k, x in v.items()}
    return v
