"""``hook_name="overflow_check"``: find the API that first produces NaN/Inf (or saturates).

Every recorded API (forward, and backward through the gradient taps) is checked: an output that
holds NaN/Inf, or whose largest magnitude reaches the float's finite maximum, is an *overflow*,
classified as

``produced``        NaN from inputs without NaN, or Inf from finite inputs: this API made it
                    (the culprit);
``saturated``       finite, but it reached the dtype's maximum while its inputs did not;
``inputs_nonfinite`` its inputs already held the NaN/Inf (look upstream).

Non-tensor arguments count as inputs, so ``masked_fill(mask, float("-inf"))`` (an attention
mask) is no overflow, nor is an Inf merely passed on. ``produced`` and ``saturated`` overflows
are counted; so is the first ``inputs_nonfinite`` one of a rank whose inputs hold NaN when
nothing was counted before it (the NaN came from outside the recorded APIs: data, parameters or
an unrecorded op). Each counted overflow is saved as a reproduction package in
``{rank_dir}/overflow_check/{api key}/`` with its stack, and listed in
``{rank_dir}/overflow_check/overflow.json``. At the ``overflow_nums``-th counted overflow
(``configure_hook(overflow_nums=N)``, default 1; ``-1``: never) an :class:`OverflowDetected`
exception stops the run, naming the API and the package. Each rank counts its own overflows,
across the steps of one debugger.

Backward: the gradient arriving at an API (``backward_input``) and its forward tensors play the
inputs, the gradient it produces (``backward_output``) the output. Forward inputs of calls whose
outputs require grad are kept (by reference; copies for in-place calls) until their backward has
run, so a backward overflow can be packaged with them.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from pytest_ptdbg.capture.sink import ApiCall, Sink
from pytest_ptdbg.errors import OverflowDetected
from pytest_ptdbg.sinks.snapshot import CallSnapshot, base_meta, device_of, index_str

if TYPE_CHECKING:
    import torch

    from pytest_ptdbg.runtime.config import DebugConfig

__all__ = ["OverflowSink", "OverflowDetected", "classify", "tensor_status"]

PRODUCED = "produced"
SATURATED = "saturated"
INPUTS_NONFINITE = "inputs_nonfinite"

KIND_TEXT = {
    PRODUCED: "this API produced NaN/Inf from finite inputs: it is the culprit",
    SATURATED: "this API's result reached the dtype's finite maximum (saturated) while its inputs did not",
    INPUTS_NONFINITE: "its inputs were already NaN/Inf: look upstream (data, parameters or an unrecorded op)",
}

FINITE, SAT, INF, NAN = 0, 1, 2, 3


def tensor_status(t: object) -> int:
    """``FINITE``, ``SAT`` (finite, reaches the dtype's max magnitude), ``INF`` or ``NAN``.

    Tensors that cannot overflow (integer, bool, empty) are FINITE; a Python float argument
    counts too (``masked_fill(mask, float("-inf"))`` puts its infinity in on purpose).
    """
    import torch

    if isinstance(t, float):
        return NAN if math.isnan(t) else INF if math.isinf(t) else FINITE
    if not isinstance(t, torch.Tensor) or not t.dtype.is_floating_point or t.numel() == 0:
        return FINITE
    d = t.detach()
    hi, lo = float(d.amax()), float(d.amin())  # both NaN-propagating, cheaper than abs().max()
    if hi != hi or lo != lo:
        return NAN
    m = max(hi, -lo)
    if m < _max_of(t.dtype):
        return FINITE
    return INF if math.isinf(m) else SAT


_MAX: Dict[torch.dtype, float] = {}


def _max_of(dtype: torch.dtype) -> float:
    m = _MAX.get(dtype)
    if m is None:
        import torch

        m = _MAX[dtype] = float(torch.finfo(dtype).max)
    return m


def classify(inputs_status: int, output_status: int) -> Optional[str]:
    """Kind of overflow for the worst statuses of an API's inputs and outputs; None when none.

    NaN from inputs without NaN, or Inf from finite inputs, is made here (``produced``); NaN/Inf
    that the inputs already had is ``inputs_nonfinite``; a saturated result from unsaturated
    finite inputs is ``saturated``.
    """
    if output_status == FINITE:
        return None
    if output_status == NAN:
        return INPUTS_NONFINITE if inputs_status == NAN else PRODUCED
    if output_status == INF:
        return INPUTS_NONFINITE if inputs_status >= INF else PRODUCED
    return SATURATED if inputs_status == FINITE else None


def _rank_of(rank_dir: Optional[str]) -> int:
    m = re.search(r"rank(\d+)$", os.path.normpath(rank_dir or ""))
    return int(m.group(1)) if m else 0


class OverflowSink(Sink):
    """The overflow checker (see the module docstring)."""

    wants_backward = True

    def __init__(self, config: DebugConfig, rank_dir: str) -> None:
        nums = getattr(config, "overflow_nums", 1)
        if nums is None:
            nums = 1
        if type(nums) is not int or (nums < 1 and nums != -1):
            raise ValueError(f"invalid overflow_nums={nums!r}: allowed values are a positive int or -1 (record all)")
        self.limit = nums
        self.rank_dir = rank_dir
        self.rank = _rank_of(rank_dir)
        self.out_dir = os.path.join(rank_dir, "overflow_check")
        # the count lives on the config so that it carries over the steps of one debugger
        state = vars(config).setdefault("_overflow_state", {"count": 0, "seen_nan": False, "events": []})
        self.state = state
        self.step_events: List[dict] = []
        #: id(tensor) -> (weakref, version, status): an output checked once is not checked again
        #: when the next API takes it as input (unless changed in place)
        self._seen: Dict[int, Tuple[Any, int, int]] = {}

    def _status(self, values: Any) -> int:
        import torch
        import weakref

        worst = FINITE
        seen = self._seen
        for v in values:
            if isinstance(v, torch.Tensor):
                hit = seen.get(id(v))
                if hit is not None and hit[0]() is v and hit[1] == v._version:
                    st = hit[2]
                else:
                    st = tensor_status(v)
                    try:
                        seen[id(v)] = (weakref.ref(v), v._version, st)
                    except TypeError:
                        pass
            else:
                st = tensor_status(v)
            if st > worst:
                worst = st
        if len(seen) > 100000:
            seen.clear()
        return worst

    @property
    def events(self) -> List[dict]:
        """Every counted overflow of this rank so far."""
        return list(self.state["events"])

    # -- forward ------------------------------------------------------------------------------
    def start_call(self, call: ApiCall) -> bool:
        from pytest_ptdbg.capture.sink import input_items, iter_tensors

        status = self._status(t for _, t in iter_tensors(input_items(call.args, call.kwargs)))
        call.state[self] = {"in": status, "snap": CallSnapshot(call)}
        return True

    def end_call(self, call: ApiCall) -> None:
        from pytest_ptdbg.capture.sink import iter_tensors, outputs_of

        st = call.state[self]
        out_status = self._status(t for _, t in iter_tensors(outputs_of(call.output)))
        kind = self._counted(classify(st["in"], out_status), st["in"], out_status)
        if kind is not None:
            self._record(st["snap"], "forward", kind, output=call.output)
        if not _needs_backward(call.output):
            call.state.pop(self, None)  # no backward will come: free the inputs
        else:
            st["bin"] = {}
            # a backward also reads its forward tensors: NaN there is inherited, not made here
            st["bin_status"] = max(st["in"], out_status)
            st["bout"] = {}
            st["done"] = False
            # gradients this call will produce: one per distinct input tensor that requires grad
            st["expect"] = len({id(t) for _, t in _inputs_requiring_grad(call)})

    # -- backward -----------------------------------------------------------------------------
    def on_backward(self, call: ApiCall, io: str, index: Tuple[int, ...], grad: Any) -> None:
        st = call.state.get(self)
        if st is None or "bin" not in st or st["done"]:
            return
        status = tensor_status(grad)
        idx = index_str(index)
        if io == "input":
            st["bin"][idx] = grad.detach()
            st["bin_status"] = max(st["bin_status"], status)
            return
        st["bout"][idx] = grad.detach()
        kind = None
        if status != FINITE:
            kind = self._counted(classify(st["bin_status"], status), st["bin_status"], status)
        if kind is not None:
            st["done"] = True
            self._record(st["snap"], "backward", kind, output=call.output, backward_input=dict(st["bin"]),
                         backward_output=dict(st["bout"]))
        if st["done"] or len(st["bout"]) >= st["expect"]:
            call.state.pop(self, None)  # this call's backward is over: free its inputs and gradients

    def _counted(self, kind: Optional[str], in_status: int, out_status: int) -> Optional[str]:
        """The kind if this overflow is counted: ``inputs_nonfinite`` only for the first NaN of
        the rank, arriving before anything was counted (it came from outside the recorded APIs;
        an Inf passed on, such as an attention mask's -inf, is not an overflow)."""
        seen = self.state["seen_nan"]
        if NAN in (in_status, out_status):
            self.state["seen_nan"] = True
        if kind == INPUTS_NONFINITE and (seen or self.state["count"] or in_status != NAN):
            return None
        return kind

    # -- recording ----------------------------------------------------------------------------
    def _record(self, snap: CallSnapshot, direction: str, kind: str, output: Any = None,
                backward_input: Optional[Dict[str, Any]] = None,
                backward_output: Optional[Dict[str, Any]] = None) -> None:
        if self.limit != -1 and self.state["count"] >= self.limit:
            return
        if not self.step_events and os.path.isdir(self.out_dir):
            shutil.rmtree(self.out_dir, ignore_errors=True)  # a previous run's findings: not mixed in
        self.state["count"] += 1
        n = self.state["count"]
        api = snap.key(direction)
        path = os.path.join(self.out_dir, api)
        meta = base_meta("overflow", device_of(snap))
        meta.update({"overflow_kind": kind, "overflow_number": n, "rank": self.rank,
                     "explanation": KIND_TEXT[kind]})
        error = ""
        try:
            pkg = snap.write(path, direction, output, backward_input=backward_input,
                             backward_output=backward_output, meta=meta)
            path = pkg.path
        except Exception as exc:  # a package that cannot be written must not hide the finding
            error = f"package not written: {exc}"
            path = ""
        event = {"number": n, "rank": self.rank, "api": api, "kind": kind, "explanation": KIND_TEXT[kind],
                 "package": path, "stack": snap.stack[:5]}
        if error:
            event["error"] = error
        self.state["events"].append(event)
        self.step_events.append(event)
        self._write_index()
        limit = "all" if self.limit == -1 else str(self.limit)
        where = f"package: {path}" if path else error
        msg = (f"ptdbg overflow_check rank {self.rank}: overflow {n} of {limit} (each rank counts its own) "
               f"at {api} [{kind}]: {KIND_TEXT[kind]}; {where}")
        frame = snap.stack[0] if snap.stack else None
        if frame:
            msg += f"; called at {frame[0]}:{frame[1]}"
        print(msg, file=sys.stderr)
        if self.limit != -1 and n >= self.limit:
            raise OverflowDetected(
                msg + f"\nreplay it with: ptdbg replay {path}" if path else msg, list(self.state["events"]))

    def _write_index(self) -> None:
        os.makedirs(self.out_dir, exist_ok=True)
        tmp = os.path.join(self.out_dir, ".overflow.json.tmp")
        with open(tmp, "w") as fh:
            json.dump({"rank": self.rank, "overflow_nums": self.limit, "events": self.step_events}, fh, indent=1)
        os.replace(tmp, os.path.join(self.out_dir, "overflow.json"))

    def close(self) -> None:
        self._seen.clear()


def _inputs_requiring_grad(call: ApiCall) -> List[Tuple[Tuple[int, ...], torch.Tensor]]:
    from pytest_ptdbg.capture.sink import input_items, iter_tensors
    import torch

    # capture taps no gradient for the argument an in-place call overwrites
    return [(i, t) for i, t in iter_tensors(input_items(call.args, call.kwargs))
            if isinstance(t, torch.Tensor) and t.requires_grad and not (call.inplace and i[0] == 0)]


def _needs_backward(output: Any) -> bool:
    from pytest_ptdbg.capture.sink import iter_tensors, outputs_of
    import torch

    if not torch.is_grad_enabled():
        return False
    return any(isinstance(t, torch.Tensor) and t.requires_grad for _, t in iter_tensors(outputs_of(output)))
