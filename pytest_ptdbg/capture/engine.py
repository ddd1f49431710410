"""Capture: see every outermost public PyTorch call and hand it to the sinks.

A :class:`torch.overrides.TorchFunctionMode` sees ``torch.*``, ``F.*``, Tensor methods and
operators (``__getitem__`` of every kind included), ``torch._VF`` and optimizer ops, whatever
reference the caller holds (``from torch import relu``, ``activation=F.relu`` bound before start),
without replacing any attribute, so ``fn is F.gelu`` keeps working. While the mode handles a call
it is popped from the mode stack, so calls made inside that API are not seen (outermost only).
``torch.distributed`` collectives and ``torch_npu`` functions do not pass through
``__torch_function__``: their module attributes are wrapped while capture is started.

Backward taps (see ``sink.py``): gradient arriving at output ``i`` comes from ``out.register_hook``
(``backward_input.i``); for every input that requires grad, the API gets an alias
``x.view_as(x)`` and the hook on the alias sees exactly this API's share (``backward_output.j``).
No alias for in-place ops' first argument, for ``out=`` calls, under no_grad, for sparse/nested
inputs, or for embedding APIs with a True flag (sparse gradients). The aliases'
hooks are registered *before* the API runs: an API that writes into the base of an alias
(``h[0] = h[3]`` passes a view of ``h`` as the value) would otherwise leave the alias a stale view,
and hooking a stale view crashes autograd (SIGSEGV in torch 2.13) or never fires.

Nothing capture or a sink does may break the user's step: every internal step is guarded; an
internal error is warned once and marks the sink ``degraded`` (``sink.report_internal_error``), and
the API runs exactly once, with the user's own arguments when aliasing failed.
"""
from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.hooks import RemovableHandle as _Handle

from pytest_ptdbg.capture import names
from pytest_ptdbg.capture.isolation import NOOP, functorch_active, modes_off, modes_on, outside_modes, unwrap_tree
from pytest_ptdbg.capture.sink import ApiCall, SinkStop, iter_tensors, outputs_of, report_internal_error
from pytest_ptdbg.runtime.gc_pause import freeze_heap, thaw_heap

__all__ = ["CaptureEngine"]

_Tensor = torch.Tensor
_STRIDED = torch.strided
_grad_enabled = torch.is_grad_enabled
_tf_len = torch._C._len_torch_function_stack

#: torch.distributed functions wrapped while started (those that exist in this torch)
DIST_FUNCS = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "broadcast",
    "reduce", "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
    "gather", "scatter", "send", "recv", "isend", "irecv", "broadcast_object_list",
    "_all_gather_base", "_reduce_scatter_base",
)


#: ``torch.compile``: dynamo inlines a mode's ``__torch_function__`` into what it traces, so the
#: mode hands it the bare call (``is_dynamo_compiling`` is True to dynamo, and the rest of the condition
#: is never traced); the flag covers the rest of a compile session (AOTAutograd's tracing, ``export``,
#: as ``torch.compiler.is_compiling`` without its call). Compiled regions then run opaque, unrecorded.
_dynamo_compiling = torch.compiler.is_dynamo_compiling
_compiler = torch.compiler

#: ``plan`` of a call made inside a functorch transform (no taps; the sinks see unwrapped values)
_FUNCTORCH = ("functorch",)

_UNSEEN = object()
#: func -> (Type, name) or None: what names.classify says, remembered per callable
_SEEN: Dict[Any, Any] = {}


class _Mode(TorchFunctionMode):
    def __init__(self, engine: "CaptureEngine") -> None:
        super().__init__()
        self.engine = engine
        self._seen = _SEEN

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if _dynamo_compiling() or _compiler._is_compiling_flag:  # torch.compile: the bare call (see above)
            return func(*args, **kwargs) if kwargs else func(*args)
        eng = self.engine
        if eng.busy or eng.depth:
            return func(*args, **kwargs) if kwargs else func(*args)
        seen = self._seen
        try:
            hit = seen.get(func, _UNSEEN)
        except TypeError:  # unhashable callable
            hit = _classify(func)
        else:
            if hit is _UNSEEN:
                hit = _classify(func)
                if len(seen) < 100000:
                    seen[func] = hit
        if hit is None:
            return func(*args, **kwargs) if kwargs else func(*args)
        if hit is _UNRECORDED_WRITE:
            eng.before_unrecorded_write()
            return func(*args, **kwargs) if kwargs else func(*args)
        return eng.handle(hit, func, args, kwargs or {})


#: ``hit`` of a call that is not recorded but may write tensors the sinks hold records of, unseen:
#: an in-place op outside the name table (``torch.ops.aten.add_``), or a backward pass (user hooks
#: run in it without capture)
_UNRECORDED_WRITE = ("unrecorded write",)
_BACKWARD_NAMES = frozenset(("backward", "grad"))


def _classify(func: Any) -> Any:
    try:
        hit = names.classify(func)
        if hit is None:
            name = str(getattr(func, "__name__", "")).split(".")[0]
            if name in _BACKWARD_NAMES or (name.endswith("_") and not name.endswith("__")
                                           and name != "requires_grad_"):
                return _UNRECORDED_WRITE
        return hit
    except Exception as e:
        report_internal_error("capture classify", e)
        return None


class CaptureEngine:
    """Starts/stops capture and routes each call to the sinks.

    ``node_taps`` (class default True): where a call's input gradients are produced by autograd
    nodes of the call itself, one edge per input (learned per call signature from a first call
    made with aliases), they are read from post hooks on those nodes instead of aliases: the
    same records, without a ``view_as`` and two hooks per input. False: aliases always.

    ``sinks`` is a list of objects following ``sink.py``'s protocol; it may be replaced between
    steps. Call counters (the ``k`` of API names) live here: :meth:`reset_step` zeroes them.
    """

    node_taps = True

    def __init__(self, sinks: Optional[list] = None) -> None:
        self.sinks: list = list(sinks or [])
        self.counters: Dict[Tuple[str, str], int] = {}
        self.seq = 0
        self.busy = False  # a sink is working: its torch calls are not captured
        self.depth = 0  # inside a wrapped (non-mode) API call
        self.opt_depth = 0  # inside Optimizer.step
        self.started = False
        self._mode: Optional[_Mode] = None
        self._hooks: list = []
        self._patched: List[Tuple[Any, str, Any]] = []
        self._wrappers: Optional[List[Tuple[Any, str, Any, Any]]] = None  # built at first start
        self._thread: Optional[int] = None
        #: (func, #args, kwargs names, (index, ndim) of inputs requiring grad) -> whether the
        #: gradients of the inputs can be tapped on the API's own autograd nodes (no aliases)
        self._node_ok: Dict[Any, bool] = {}
        #: node-tap key -> [(edge slot of the output's node, position in the inputs), ...] where every
        #: input's gradient is one edge of the output's own node (verified per call, not walked),
        #: and the slots the node hook reads
        self._direct: Dict[Any, List[Tuple[int, int]]] = {}
        self._direct_slots: Dict[Any, list] = {}
        self._direct_edges: Dict[Any, int] = {}
        self._bw_of: Any = None  # (sinks list, its sinks that want backward)
        self._frozen = False  # the heap as at start() is frozen for the collector (runtime/gc_pause.py)

    # -- start / stop ------------------------------------------------------------------------
    def start(self) -> None:
        if self.started:
            return
        names.build_table()
        self._bw_of = None
        self._thread = threading.get_ident()
        self._mode = _Mode(self)
        self._mode.__enter__()
        self.started = True
        try:
            self._frozen = freeze_heap()
        except Exception as e:  # pragma: no cover - gc calls do not fail
            report_internal_error("capture gc freeze", e)
        self.opt_depth = 0
        self.depth = 0
        try:
            from torch.optim.optimizer import (
                register_optimizer_step_post_hook,
                register_optimizer_step_pre_hook,
            )

            self._hooks.append(register_optimizer_step_pre_hook(self._opt_pre))
            self._hooks.append(register_optimizer_step_post_hook(self._opt_post))
        except ImportError:  # pragma: no cover - torch < 2.0
            pass
        if self._wrappers is None:
            self._wrappers = []
            self._patch_distributed()
            self._patch_npu()
        for owner, attr, orig, wrapper in self._wrappers:
            if getattr(owner, attr, None) is orig:
                setattr(owner, attr, wrapper)
                self._patched.append((owner, attr, orig))

    def stop(self) -> None:
        if not self.started:
            return
        mode = self._mode
        try:
            if mode is not None:  # set whenever started
                mode.__exit__(None, None, None)
        finally:
            self.started = False
            self._mode = None
            for h in self._hooks:
                h.remove()
            self._hooks.clear()
            for owner, attr, orig in reversed(self._patched):
                setattr(owner, attr, orig)
            self._patched.clear()
            frozen, self._frozen = self._frozen, False
            thaw_heap(frozen)

    def reset_step(self) -> None:
        """New step: call counters and the execution order start again from 0."""
        self.counters.clear()
        self.seq = 0

    def _opt_pre(self, opt, args, kwargs) -> None:
        self.opt_depth += 1

    def _opt_post(self, opt, args, kwargs) -> None:
        if self.opt_depth > 0:
            self.opt_depth -= 1

    def before_unrecorded_write(self) -> None:
        """A call that is not recorded may write tensors (see ``_UNRECORDED_WRITE``): sinks that
        hold records by reference (``before_write``) copy them now. Never raises."""
        self.busy = True
        try:
            for s in self.sinks:
                fn = getattr(s, "before_write", None)
                if fn is not None:
                    try:
                        fn()
                    except Exception as e:  # noqa: BLE001 - never into the user's step
                        report_internal_error(f"{type(s).__name__}.before_write", e, s)
        finally:
            self.busy = False

    # -- wrapped module functions ------------------------------------------------------------
    def _wrap(self, owner: Any, attr: str, api_type: str, name: str) -> None:
        orig = getattr(owner, attr, None)
        if orig is None or not callable(orig) or getattr(orig, "_ptdbg_wrapped", False):
            return
        engine = self
        hit = (api_type, name)

        def wrapper(*args, **kwargs):
            if not engine.started or engine.busy or engine.depth or threading.get_ident() != engine._thread:
                return orig(*args, **kwargs)
            return engine.handle(hit, orig, args, kwargs, wrapped=True)

        wrapper._ptdbg_wrapped = True  # type: ignore[attr-defined]
        wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
        wrapper.__name__ = getattr(orig, "__name__", attr)
        wrapper.__doc__ = getattr(orig, "__doc__", None)
        assert self._wrappers is not None  # start() makes the list before it patches
        self._wrappers.append((owner, attr, orig, wrapper))

    def _patch_distributed(self) -> None:
        try:
            import torch.distributed as dist
        except ImportError:  # pragma: no cover
            return
        if not dist.is_available():
            return
        for fname in DIST_FUNCS:
            self._wrap(dist, fname, "Distributed", fname)
            # torch.distributed re-exports from distributed_c10d; patch both spellings
            c10d = getattr(dist, "distributed_c10d", None)
            if c10d is not None:
                self._wrap(c10d, fname, "Distributed", fname)

    def _patch_npu(self) -> None:
        mod = sys.modules.get("torch_npu")
        if mod is None:
            return
        for fname in dir(mod):  # pragma: no cover - needs torch_npu
            if fname.startswith(("npu_", "fast_gelu")):
                obj = getattr(mod, fname, None)
                if callable(obj) and not isinstance(obj, type):
                    self._wrap(mod, fname, "NPU", fname)

    # -- one call ----------------------------------------------------------------------------
    def handle(self, hit: Tuple[str, str], func: Callable, args: tuple, kwargs: dict, wrapped: bool = False) -> Any:
        """Run ``func`` as one recorded API call; ``hit`` is its ``(Type, name)``.

        ``func`` runs exactly once; what capture and the sinks do around it never raises. The
        user's torch function modes (below capture's own, which torch pops while it handles a
        call) see the call itself, never capture's bookkeeping (aliases, hooks, ``grad_fn`` reads)."""
        if _tf_len():
            modes = modes_off()
            try:
                return self._handle(hit, func, args, kwargs, wrapped, modes)
            finally:
                modes_on(modes)
        return self._handle(hit, func, args, kwargs, wrapped, None)

    def _handle(self, hit: Tuple[str, str], func: Callable, args: tuple, kwargs: dict, wrapped: bool,
                modes: Optional[list]) -> Any:
        try:
            prep = self._before(hit, func, args, kwargs, wrapped)
        except SinkStop:
            raise
        except Exception as e:  # pragma: no cover - _before guards its own steps
            self.busy = False
            report_internal_error("capture", e)
            prep = None
        if prep is None:
            if wrapped:
                self.depth += 1
                try:
                    return func(*args, **kwargs) if modes is None else _under(modes, func, args, kwargs)
                finally:
                    self.depth -= 1
            return func(*args, **kwargs) if modes is None else _under(modes, func, args, kwargs)
        call, wanted, bw, cargs, ckwargs, aliases, plan, quiet = prep
        if wrapped:
            self.depth += 1
            try:
                out = func(*cargs, **ckwargs) if modes is None else _under(modes, func, cargs, ckwargs)
            finally:
                self.depth -= 1
        elif modes is None:
            out = func(*cargs, **ckwargs)
        else:
            out = _under(modes, func, cargs, ckwargs)
        if aliases:
            try:
                same: set = set()
                out = _unalias(out, aliases, same)
            except Exception as e:  # pragma: no cover - plain type checks
                report_internal_error("capture unalias", e)
                same = set()
        else:
            same = set()
        call.output = unwrap_tree(out) if plan is _FUNCTORCH else out
        self.busy = True
        if quiet is not NOOP:  # the user's modes, seen at the call's entry: left again
            quiet = outside_modes()
            quiet.__enter__()
        try:
            for s in wanted:
                try:
                    s.end_call(call)
                except SinkStop:
                    raise
                except Exception as e:
                    report_internal_error(f"{type(s).__name__}.end_call {call.forward_key}", e, s)
            if bw and _grad_enabled():
                done = False
                if plan is not None:
                    try:
                        done = self._after_plan(call, bw, out, plan, aliases, same)
                    except Exception as e:
                        self._node_ok[plan[1]] = False
                        for s in bw:
                            report_internal_error(f"capture node taps {call.forward_key}", e, s)
                if not done:
                    try:
                        self._tap_outputs_of(call, bw, out, same)
                    except Exception as e:
                        for s in bw:
                            report_internal_error(f"capture backward tap {call.forward_key}", e, s)
        finally:
            if quiet is not NOOP:
                quiet.__exit__(None, None, None)
            self.busy = False
            try:
                call.release()
            except Exception as e:  # pragma: no cover
                report_internal_error("capture release", e)
        return out

    def _before(self, hit: Tuple[str, str], func: Callable, args: tuple, kwargs: dict, wrapped: bool) -> Any:
        """Count the call, ask the sinks, alias the inputs and hook the aliases: ``(call, wanted
        sinks, backward sinks, args, kwargs, aliases, plan, isolation context)``, or None when no sink
        wants the call."""
        counters = self.counters
        k = counters.get(hit, 0)
        counters[hit] = k + 1
        seq = self.seq
        self.seq = seq + 1
        api_type, name = hit
        try:
            inplace = (wrapped and api_type == "Distributed") or names.is_inplace(api_type, name, args, kwargs)
        except Exception as e:
            report_internal_error("capture is_inplace", e)
            inplace = True  # the safe side: no alias for the first argument
        quiet = outside_modes()  # the sinks work outside the user's autocast, modes and transforms
        ft = quiet is not NOOP and functorch_active()
        if ft:  # the sinks see the values inside functorch's wrappers, never the wrappers
            call = ApiCall(api_type, name, k, func, unwrap_tree(args), unwrap_tree(kwargs),
                           "optimizer" if self.opt_depth else "", inplace, seq, sys._getframe(4))
        else:
            call = ApiCall(api_type, name, k, func, args, kwargs, "optimizer" if self.opt_depth else "",
                           inplace, seq, sys._getframe(4))
        sinks = self.sinks
        self.busy = True
        if quiet is not NOOP:
            quiet.__enter__()
        try:
            wanted = []
            for s in sinks:
                try:
                    if s.start_call(call):
                        wanted.append(s)
                except SinkStop:
                    raise
                except Exception as e:
                    report_internal_error(f"{type(s).__name__}.start_call {call.forward_key}", e, s)
                    try:
                        call.state.pop(s, None)
                    except Exception:  # pragma: no cover
                        pass
        finally:
            if quiet is not NOOP:
                quiet.__exit__(None, None, None)
            self.busy = False
        if not wanted:
            call.release()
            return None
        if ft:
            # inside a transform: no alias and no hook on the user's wrapped tensors (an alias
            # cuts what the transform differentiates); the transform's own backward is not taped
            return call, wanted, (), args, kwargs, [], _FUNCTORCH, quiet
        if len(wanted) == len(sinks):  # every sink (the usual case): one shared list per sinks list
            cached = self._bw_of
            if cached is None or cached[0] is not sinks:
                cached = self._bw_of = (sinks, [s for s in sinks if getattr(s, "wants_backward", True)])
            bw = cached[1]
        else:
            bw = [s for s in wanted if getattr(s, "wants_backward", True)]
        aliases: list = []
        plan = None
        if bw and _grad_enabled() and api_type != "Distributed" and not (kwargs and "out" in kwargs) \
                and not (name in _SPARSE_GRAD_APIS and _any_true(args, kwargs)):
            try:
                inputs = None if inplace else _node_inputs(args, kwargs)
                if inputs is not None:
                    if not inputs:
                        return call, wanted, bw, args, kwargs, aliases, None, quiet  # nothing requires grad
                    # the autograd nodes an API makes depend on its inputs' ranks and on the
                    # options it is given as strings, flags or None (einsum's equation, a
                    # reduction, bias=None): each such signature learns its own answer
                    key = (func, len(args), tuple(kwargs) if kwargs else (),
                           tuple([(i, t.dim()) for i, t in inputs]), _options(args, kwargs))
                    ok = self._node_ok.get(key) if self.node_taps else False
                    if ok:
                        return call, wanted, bw, args, kwargs, aliases, (True, key, inputs), quiet
                    if ok is None:
                        plan = (False, key, inputs)  # learn, from this call's aliases, whether nodes suffice
            except Exception as e:  # pragma: no cover - plain attribute reads
                report_internal_error(f"capture plan {call.forward_key}", e)
                plan = None
            try:
                args, kwargs, aliases = _alias_inputs(args, kwargs, skip_first=inplace)
                self.busy = True
                try:
                    for idx, alias, _orig in aliases:
                        _register_hook(alias, self._make_hook(call, bw, "output", idx))
                finally:
                    self.busy = False
            except Exception as e:
                for s in bw:
                    report_internal_error(f"capture alias {call.forward_key}", e, s)
                args, kwargs, aliases = call.args, call.kwargs, []  # the user's own arguments
                plan = None
        return call, wanted, bw, args, kwargs, aliases, plan, quiet

    def _after_plan(self, call: ApiCall, sinks: list, out: Any, plan: tuple, aliases: list, same: set) -> bool:
        """Node taps (``plan[0]``): hook the autograd nodes that produce each input's gradient,
        and the output's own node for the gradient arriving at it (True: the output is tapped
        too); or learn (from this call's aliases) whether such taps cover the call's inputs."""
        use, key, inputs = plan
        gf = out.grad_fn if type(out) is _Tensor else None
        if not use:
            ok = False
            if gf is not None and aliases and len(aliases) == len(inputs) and not same:
                targets = {}
                for idx, a, _o in aliases:
                    agf = a.grad_fn
                    if agf is None:
                        break
                    targets[(id(agf), a.output_nr)] = idx
                else:
                    found = _walk(gf, targets, {}, len(aliases))
                    ok = found is not None and len(found) == len(aliases)
            if len(self._node_ok) < 20000:
                self._node_ok[key] = ok
            return False
        for _, t in inputs:
            if t is out:
                same.add(id(out))  # an input given back unchanged: no taps, as with aliases
                return False
        if type(out) is not _Tensor:
            self._node_ok[key] = False  # aliases from the next call on
            for s in sinks:
                report_internal_error(f"capture node taps {call.forward_key}",
                                      RuntimeError("an API that returned one tensor returned another kind"), s,
                                      _NO_INPUT_GRADS)
            return False
        if gf is None or not out.requires_grad:
            return False  # the output carries no gradient: there is none to record
        direct = self._direct.get(key)
        if direct is not None and self._direct_hit(gf, direct, inputs, self._direct_edges[key]):
            # learned: every input's gradient is an edge of the output's own node (checked, not walked)
            gf.register_hook(_NodeHook(self, call, sinks, self._direct_slots[key], out.output_nr))
            return True
        nonleaf: Dict[Tuple[int, int], Tuple[int, ...]] = {}
        leaves: Dict[int, Tuple[int, ...]] = {}
        for idx, t in inputs:
            tgf = t.grad_fn
            if tgf is None:
                leaves[id(t)] = idx
            else:
                if tgf is gf:
                    return False  # a view of an input's own node: no input taps, as with aliases
                nonleaf[(id(tgf), t.output_nr)] = idx
        found = _walk(gf, nonleaf, leaves, len(inputs))
        if found is None or len(found) != len(inputs):
            self._node_ok[key] = False  # aliases from the next call on
            for s in sinks:
                report_internal_error(f"capture node taps {call.forward_key}",
                                      RuntimeError("input gradients not found in the API's autograd nodes"), s,
                                      _NO_INPUT_GRADS)
            return False
        by_node: Dict[int, list] = {}
        nodes: Dict[int, Any] = {}
        for idx, (node, slot) in found.items():
            k = id(node)
            nodes[k] = node
            by_node.setdefault(k, []).append((slot, idx))
        top = by_node.pop(id(gf), [])
        top.sort(key=lambda e: e[1])
        if not by_node and len(self._direct) < 20000:  # all on the output's node: checked, not walked, next time
            pos_of = {idx: j for j, (idx, _t) in enumerate(inputs)}
            self._direct[key] = [(slot, pos_of[idx]) for slot, idx in top]
            self._direct_slots[key] = top
            self._direct_edges[key] = len(gf.next_functions)
        gf.register_hook(self._make_node_hook(call, sinks, top, out.output_nr))
        for k, slots in by_node.items():
            slots.sort(key=lambda e: e[1])
            nodes[k].register_hook(self._make_node_hook(call, sinks, slots, -1))
        return True

    @staticmethod
    def _direct_hit(gf: Any, direct: List[Tuple[int, int]], inputs: list, edges: int) -> bool:
        """Whether edge ``slot`` of ``gf`` leads to input ``pos`` for each learned pair (and the node
        has as many edges as when it was learned)."""
        nf = gf.next_functions
        if len(nf) != edges:
            return False
        for slot, pos in direct:
            t = inputs[pos][1]
            nxt, nr = nf[slot]
            tgf = t.grad_fn
            if tgf is None:
                if type(nxt) is not _ACC or nxt.variable is not t:
                    return False
            elif nxt is not tgf or nr != t.output_nr:
                return False
        return True

    def _make_node_hook(self, call: ApiCall, sinks: list, slots: list, out_nr: int) -> Callable:
        """A post hook of an autograd node: the gradient arriving at output ``out_nr`` (when not
        -1: ``backward_input.0``), then the gradients it produced at ``slots`` (``backward_output``)."""
        return _NodeHook(self, call, sinks, slots, out_nr)

    # -- backward ------------------------------------------------------------------------------
    def _tap_outputs_of(self, call: ApiCall, sinks: list, out: Any, same: set) -> None:
        """Hook the outputs (``backward_input``); the aliases were hooked before the call."""
        seen = same  # outputs that are an input given back unchanged get no tap
        if isinstance(out, _Tensor):
            if out.requires_grad and id(out) not in seen:
                _register_hook(out, self._make_hook(call, sinks, "input", (0,)))
        else:
            self._tap_outputs(call, sinks, out, seen)

    def _tap_outputs(self, call: ApiCall, sinks: list, out: Any, seen: set) -> None:
        for idx, t in iter_tensors(outputs_of(out)):
            if isinstance(t, _Tensor) and t.requires_grad and id(t) not in seen:
                seen.add(id(t))
                _register_hook(t, self._make_hook(call, sinks, "input", idx))

    def _make_hook(self, call: ApiCall, sinks: list, io: str, idx: Tuple[int, ...]) -> Callable:
        return _TensorHook(self, call, sinks, io, idx)


def _under(modes: list, func: Callable, args: tuple, kwargs: dict) -> Any:
    """``func(*args, **kwargs)`` with the torch function modes ``modes_off`` took put back."""
    modes_on(modes)
    try:
        return func(*args, **kwargs)
    finally:
        modes[:] = modes_off()


def _deliver(engine: "CaptureEngine", call: ApiCall, sinks: list, io: str, idx: Tuple[int, ...], grad: Any) -> None:
    quiet = outside_modes()  # (backward() passes through capture's mode: it is popped while hooks run)
    if quiet is not NOOP:
        quiet.__enter__()
    try:
        for s in sinks:
            try:
                s.on_backward(call, io, idx, grad)
            except SinkStop:
                raise
            except Exception as e:
                report_internal_error(f"{type(s).__name__}.on_backward {call.backward_key}", e, s)
    finally:
        if quiet is not NOOP:
            quiet.__exit__(None, None, None)


class _TensorHook:
    """A tensor's gradient hook: the gradient at this tensor goes to the sinks as ``(io, idx)``.
    (An object with slots, not a closure: fewer objects for the garbage collector to track.)"""

    __slots__ = ("engine", "call", "sinks", "io", "idx")

    def __init__(self, engine: "CaptureEngine", call: ApiCall, sinks: list, io: str, idx: Tuple[int, ...]) -> None:
        self.engine = engine
        self.call = call
        self.sinks = sinks
        self.io = io
        self.idx = idx

    def __call__(self, grad: Any) -> None:
        if grad is None:
            return None
        engine = self.engine
        prev = engine.busy
        engine.busy = True
        try:
            _deliver(engine, self.call, self.sinks, self.io, self.idx, grad)
        finally:
            engine.busy = prev
        return None


class _NodeHook:
    """A post hook of an autograd node (see ``CaptureEngine._make_node_hook``)."""

    __slots__ = ("engine", "call", "sinks", "slots", "out_nr")

    def __init__(self, engine: "CaptureEngine", call: ApiCall, sinks: list, slots: list, out_nr: int) -> None:
        self.engine = engine
        self.call = call
        self.sinks = sinks
        self.slots = slots
        self.out_nr = out_nr

    def __call__(self, grad_inputs: Any, grad_outputs: Any) -> None:
        engine = self.engine
        prev = engine.busy
        engine.busy = True
        try:
            call, sinks, out_nr = self.call, self.sinks, self.out_nr
            if out_nr >= 0:
                g = grad_outputs[out_nr] if out_nr < len(grad_outputs) else None
                if g is not None:
                    _deliver(engine, call, sinks, "input", (0,), g)
            for slot, idx in self.slots:
                g = grad_inputs[slot]
                if g is not None:
                    _deliver(engine, call, sinks, "output", idx, g)
        finally:
            engine.busy = prev
        return None


def _register_hook(t: Any, hook: Callable) -> None:
    """``t.register_hook(hook)`` (which requires grad) minus the handle object, which capture
    never uses: its taps live as long as the graph. Same dict, same ids, same order as
    ``Tensor.register_hook``; tensor subclasses go through their own ``register_hook``."""
    # read grad_fn first: for a view whose base was changed in place since, this regenerates its
    # grad_fn (and drops hooks of the old one); hooking a stale view crashes autograd (SIGSEGV)
    gf = t.grad_fn
    if type(t) is not _Tensor:
        t.register_hook(hook)
        return
    d = t._backward_hooks
    if d is None:
        t._backward_hooks = OrderedDict()
        if gf is not None:
            gf._register_hook_dict(t)
        d = t._backward_hooks
    hid = _Handle.next_id
    _Handle.next_id = hid + 1
    d[hid] = hook


#: APIs whose gradient for a dense input is sparse with ``sparse=True`` (nn.Embedding(sparse=True)):
#: an alias's view backward cannot reshape a sparse gradient, so their inputs get no alias
_SPARSE_GRAD_APIS = frozenset(("embedding", "embedding_bag", "_embedding_bag"))


def _any_true(args: tuple, kwargs: dict) -> bool:
    """Whether some flag of the call is True (``sparse=True`` given by position or keyword)."""
    return any(v is True for v in args) or any(v is True for v in kwargs.values())


#: what a node-tap failure costs (the call ran without aliases, nothing else can see its share)
_NO_INPUT_GRADS = ("the dump misses this call's backward_output records (later calls of this API and "
                   "signature are tapped through aliases)")
_OPTION_TYPES = (str, bool, type(None))


def _options(args: tuple, kwargs: dict) -> Any:
    """Part of the node-tap key: a leading string argument (einsum's equation) and the string, bool
    and None keyword arguments (``reduction=``, ``mode=``, ``approximate=``, ``bias=None``), by value.
    (Cheap on the per-call path: other positional arguments are not scanned.)"""
    first = args[0] if args and type(args[0]) is str else None
    if kwargs:
        return first, tuple([v for v in kwargs.values() if type(v) in _OPTION_TYPES])
    return first


def _node_inputs(args: tuple, kwargs: dict) -> Optional[list]:
    """``[(index, tensor), ...]`` of the top-level inputs that require grad, when capture may tap
    their gradients on autograd nodes instead of aliases: plain strided tensors, each object once,
    none inside a list/tuple argument. None: aliases are needed."""
    out: list = []
    items = list(args) + list(kwargs.values()) if kwargs else args
    for i, v in enumerate(items):
        if isinstance(v, _Tensor):
            if v.requires_grad:
                if type(v) is not _Tensor and type(v) is not _Param:
                    return None
                if v.layout is not _STRIDED or v.is_nested:
                    return None
                for _, o in out:
                    if o is v:
                        return None
                out.append(((i,), v))
        else:
            tv = type(v)
            if (tv is list or tv is tuple) and _has_grad(v):
                return None
    return out


def _has_grad(v: Any) -> bool:
    for x in v:
        if isinstance(x, _Tensor):
            if x.requires_grad:
                return True
        elif type(x) is list or type(x) is tuple:
            if _has_grad(x):
                return True
    return False


#: autograd nodes visited at most, from the output's node, to find where each input's gradient is made
_WALK_BUDGET = 8


def _walk(root: Any, nonleaf: dict, leaves: dict, want: int) -> Optional[dict]:
    """``{index: (node, slot)}``: for each target input, the one edge inside the API's nodes that
    leads to it (``nonleaf``: ``(id(grad_fn), output_nr) -> index``; ``leaves``: ``id(leaf) -> index``,
    found through their AccumulateGrad node). None when an input is reached by more than one edge
    (its gradient is a sum over several edges) or the walk runs out of budget before all are found."""
    found: dict = {}
    stack = [root]
    seen = set()
    budget = _WALK_BUDGET
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        budget -= 1
        if budget < 0:
            return None
        for slot, (nxt, nr) in enumerate(node.next_functions):
            if nxt is None:
                continue
            idx = nonleaf.get((id(nxt), nr)) if nonleaf else None
            if idx is None and leaves and type(nxt) is _ACC:
                idx = leaves.get(id(nxt.variable))
            if idx is not None:
                if idx in found:
                    return None
                found[idx] = (node, slot)
                continue
            if type(nxt) is _ACC:
                continue
            stack.append(nxt)
        if len(found) == want and not stack:
            break
    return found


def _acc_type() -> Any:
    x = torch.zeros(1, requires_grad=True)
    gf = (x * 1).grad_fn
    assert gf is not None  # x requires grad
    return type(gf.next_functions[0][0])


_ACC = _acc_type()
_Param = torch.nn.Parameter


def _alias_inputs(args: tuple, kwargs: dict, skip_first: bool) -> Tuple[tuple, dict, list]:
    """Replace each input tensor that requires grad by ``x.view_as(x)``.

    The same tensor object passed twice gets one alias (identity checks such as ``query is key``
    inside the API keep their answer); its gradient is recorded at its first index.
    Returns new args, kwargs and ``[(index, alias, original), ...]``.
    """
    aliases: list = []
    memo: Dict[int, Any] = {}
    n = len(args)
    new_args = None
    for i in range(1 if skip_first else 0, n):
        v = args[i]
        if isinstance(v, _Tensor):
            if not v.requires_grad:
                continue
            a = _alias_one(v, (i,), memo, aliases)
        else:
            tv = type(v)
            if tv is not list and tv is not tuple:
                continue
            a = _alias_seq(v, (i,), memo, aliases)
        if a is not v:
            if new_args is None:
                new_args = list(args)
            new_args[i] = a
    new_kwargs = kwargs
    if kwargs:
        for j, (kk, v) in enumerate(kwargs.items()):
            if skip_first and n == 0 and j == 0:
                continue
            a = _alias_value(v, (n + j,), memo, aliases)
            if a is not v:
                if new_kwargs is kwargs:
                    new_kwargs = dict(kwargs)
                new_kwargs[kk] = a
    if not aliases:
        return args, kwargs, aliases
    return (tuple(new_args) if new_args is not None else args), new_kwargs, aliases


def _alias_one(v: Any, idx: Tuple[int, ...], memo: Dict[int, Any], aliases: list) -> Any:
    a = memo.get(id(v))
    if a is None:
        if v.layout is not _STRIDED or v.is_nested:
            return v  # sparse/nested: a view's backward cannot reshape their gradient; no tap
        try:
            a = v.view_as(v)
        except Exception:  # a tensor kind without views: no per-input tap
            return v
        memo[id(v)] = a
        aliases.append((idx, a, v))
    return a


def _alias_seq(v: Any, idx: Tuple[int, ...], memo: Dict[int, Any], aliases: list) -> Any:
    new = [_alias_value(x, idx + (j,), memo, aliases) for j, x in enumerate(v)]
    if any(n is not o for n, o in zip(new, v)):
        return type(v)(new)
    return v


def _alias_value(v: Any, idx: Tuple[int, ...], memo: Dict[int, Any], aliases: list) -> Any:
    if isinstance(v, _Tensor):
        return _alias_one(v, idx, memo, aliases) if v.requires_grad else v
    tv = type(v)
    if tv is list or tv is tuple:
        return _alias_seq(v, idx, memo, aliases)
    return v


def _unalias(out: Any, aliases: list, same: set) -> Any:
    """Give back the caller's own tensor where the API returned one of our aliases unchanged."""
    if isinstance(out, _Tensor):
        for _, a, o in aliases:
            if out is a:
                same.add(id(o))
                return o
        return out
    t = type(out)
    if t is tuple or t is list:
        new = [_unalias(x, aliases, same) for x in out]
        if any(n is not o for n, o in zip(new, out)):
            return t(new)
    return out
