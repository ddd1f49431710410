"""Which calls and which of their tensors a dump keeps (``mode``, ``scope``, ``api_list``,
``input_output_mode``, ``filter_switch``), following ptdbg_ascend's rules:

- ``api_stack`` / ``all`` / ``stack``: every call.
- ``list``: a direction of a call is kept when its API key (``Functional_conv2d_1_forward``) starts
  with an entry of ``scope``.
- ``range``: calls from the first whose forward or backward key starts with ``scope[0]`` up to and
  including the one matching ``scope[1]`` (execution order, decided at forward time); both
  directions of those calls are kept.
- ``api_list``: case-insensitive substring of ``{Type}_{api}`` (``"distributed"``: all collectives).
- ``input_output_mode``: a record (direction, io) is kept when ``all``, its direction or its io is
  listed (``"input"`` keeps forward inputs and backward inputs).
"""
from __future__ import annotations

from typing import Any, Tuple

from pytest_ptdbg.capture.sink import ApiCall

__all__ = ["Selector"]


class Selector:
    """Decisions for one debugger configuration (stateful in ``range`` mode: call in order)."""

    def __init__(self, mode: str, scope: list, api_list: list, input_output_mode: list) -> None:
        self.mode = mode
        self.scope = tuple(scope or ())
        self.api_list = tuple(a.lower() for a in (api_list or ()))
        io = set(input_output_mode or ("all",))
        self.keep_all_io = "all" in io
        self.io = io
        self._in_range = False
        self._range_done = False

    def directions(self, call: ApiCall) -> Tuple[bool, bool]:
        """``(forward kept, backward kept)`` for this call."""
        mode = self.mode
        if mode == "list":
            f, b = call.forward_key, call.backward_key
            return f.startswith(self.scope), b.startswith(self.scope)
        if mode == "range":
            if self._range_done:
                return False, False
            f, b = call.forward_key, call.backward_key
            first, last = self.scope
            if not self._in_range and (f.startswith(first) or b.startswith(first)):
                self._in_range = True
            if not self._in_range:
                return False, False
            if f.startswith(last) or b.startswith(last):
                self._range_done = True
            return True, True
        if mode == "api_list":
            fam = f"{call.api_type}_{call.api_name}".lower()
            hit = any(a in fam for a in self.api_list)
            return hit, hit
        return True, True

    def keep_io(self, direction: str, io: str) -> bool:
        """Whether records of (direction, io) are written."""
        return self.keep_all_io or direction in self.io or io in self.io


def filtered_out(value: Any) -> bool:
    """``filter_switch="ON"``: int/bool/empty/0-d tensors and Python scalars are skipped."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.dim() == 0 or value.numel() == 0 or not (value.is_floating_point() or value.is_complex())
    return True
