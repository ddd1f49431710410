"""Stable call keys for goldens: ``module path/operation#index within that module``.

The dump names a call by its API and its index in the whole step (``Functional_linear_3``), so
one layer added in front renumbers every later call. A golden names it by the module whose
``forward`` made it, the operation it computes (``runtime/operations.py``: ``F.softmax``,
``torch.softmax`` and ``x.softmax`` are all ``softmax``; ``x + y`` and ``torch.add`` are ``add``)
and the index among that module's own calls of that operation
(``model.blocks.1.attn/softmax#0``): an added layer adds keys, it renames none, and another
spelling of the same call keeps its key.
Calls made outside the model (the loss in the step function) are under ``step``, the
optimizer's under ``optimizer``.

:class:`CallKeys` is a capture sink (``capture/sink.py``) that only looks: for every recorded
call it notes the module on top of a stack that global module forward hooks maintain while the
step runs. Imports torch (only the fixture uses it).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import torch
from torch.utils.hooks import RemovableHandle

from pytest_ptdbg.capture.sink import ApiCall, Sink
from pytest_ptdbg.format import records
from pytest_ptdbg.runtime.operations import operation

if TYPE_CHECKING:
    from pytest_ptdbg.debugger import PrecisionDebugger

ROOT = "model"
OUTSIDE = "step"
OPTIMIZER = "optimizer"


def stable_key(path: str, op: str, index: int) -> str:
    """``{module path}/{operation}#{index}``."""
    return f"{path}/{op}#{index}"


class CallKeys(Sink):
    """A sink that maps each recorded API key (``Functional_linear_3``) to its stable key."""

    wants_backward = False

    def __init__(self, model: object) -> None:  # the test's model; any other object: no names
        self.names: Dict[int, str] = {}
        if isinstance(model, torch.nn.Module):
            for name, mod in model.named_modules():
                self.names.setdefault(id(mod), f"{ROOT}.{name}" if name else ROOT)
        self.stack: List[str] = []
        self.keys: Dict[str, str] = {}          # api key -> stable key
        self._counts: Dict[Tuple[str, str], int] = {}
        self._handles: List[RemovableHandle] = []

    # module hooks -------------------------------------------------------------------------
    def _pre(self, module: torch.nn.Module, args: tuple) -> None:
        self.stack.append(self.names.get(id(module), self.stack[-1] if self.stack else OUTSIDE))

    def _post(self, module: torch.nn.Module, args: tuple, output: Any) -> None:
        if self.stack:
            self.stack.pop()

    def __enter__(self) -> "CallKeys":
        from torch.nn.modules import module as nn_module

        self._handles = [nn_module.register_module_forward_pre_hook(self._pre),
                         nn_module.register_module_forward_hook(self._post, always_call=True)]
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self.stack = []

    # sink protocol --------------------------------------------------------------------------
    def start_call(self, call: ApiCall) -> bool:
        if call.ctx == records.OPTIMIZER_CTX:
            path = OPTIMIZER
        else:
            path = self.stack[-1] if self.stack else OUTSIDE
        family = f"{call.api_type}_{call.api_name}"
        op = operation(call.api_type, call.api_name).name
        n = self._counts.get((path, op), 0)
        self._counts[(path, op)] = n + 1
        self.keys[f"{family}_{call.index}"] = stable_key(path, op, n)
        return False


def attach(debugger: PrecisionDebugger, keys: CallKeys) -> bool:
    """Add ``keys`` to the sinks of a started ``PrecisionDebugger``; False when it has no engine
    (then the golden falls back to the dump's own call indices)."""
    engine = getattr(debugger, "_engine", None)
    sinks: Optional[list] = getattr(engine, "sinks", None)
    if sinks is None:
        return False
    sinks.append(keys)
    return True
