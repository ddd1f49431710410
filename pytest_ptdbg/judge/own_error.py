"""Judge one dump by itself: every call's own error, by replay, against a budget.

:func:`judge_dump` replays every call of a dump that holds full tensors from its own recorded
inputs (never chained), on the bench device, twice:

* the **oracle**: floating inputs in float64, floating ``dtype=`` arguments float64, autocast off;
* the **reference**: the call in its *compute dtype*, fixed from the recorded dtypes (the lowest
  precision among its floating outputs: under bf16 autocast a linear's output is bf16, so the
  reference casts its inputs to bf16 and computes in bf16; no device autocast policy is assumed).

A forward call's outputs, and a backward call's produced gradients (autograd on the replayed call,
fed the recorded incoming gradients), are judged by :mod:`.budget`: own error = distance(device,
oracle), budget = FACTOR x distance(reference, oracle), floored at one rounding at the scale of the
call's inputs and at the error any correct kernel of the call's algorithm family may make
(:mod:`.algorithms`: another summation order, split-K, Winograd, a libm within 2 ulp).
Over budget, or a NaN/Inf the replays do not produce, makes the call a root cause.
In-place and 0-d calls (``step_t += 1``, ``addcdiv_``) replay on a copy of their recorded inputs.

Calls that are not a computation or not unique are treated as :mod:`.not_judged`'s table says;
calls that cannot be replayed (not in the allowlist, no call spec, statistics only) are listed,
with the reason, in :attr:`DumpJudgement.not_judged`. Every replay goes through the allowlist
(:mod:`.allowlist`) and the data-only argument decoder (:mod:`.arguments`).

With a ``reference`` dump (the bench's; statistics only is enough) the oracle and the reference
replay use the *bench's* recorded arguments for calls the pairing matched, so a changed argument
(``eps``, ``approximate="tanh"``, a scale) shows up as the device call's own error; arguments that
differ are also listed on the verdict (``changed_args``).
"""
from __future__ import annotations

import functools
import json
import math
import time
from typing import Any, Callable, Collection, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from pytest_ptdbg.comparison.arguments import IGNORED
from pytest_ptdbg.dump import reader
from pytest_ptdbg.dump.validate import call_problem
from pytest_ptdbg.errors import AllocationRefused, NotReplayable, ReplayError, ReplayRefused
from pytest_ptdbg.format import records
from pytest_ptdbg.runtime.gc_pause import paused_gc
from pytest_ptdbg.judge import algorithms as A
from pytest_ptdbg.judge import budget as B
from pytest_ptdbg.judge.arrays import ArrayStore
from pytest_ptdbg.replayer.allowlist import torch_dtype
from pytest_ptdbg.judge.verdicts import CallVerdict, DumpJudgement, Status
from pytest_ptdbg.replayer.modes import MathModes, recorded_modes
from pytest_ptdbg.runtime.reduced_fp32 import FP32_APIS
from pytest_ptdbg.judge import not_judged as NJ

__all__ = ["Status", "CallVerdict", "DumpJudgement", "judge_dump", "judge_call", "IGNORED_ARGUMENTS"]

#: non-tensor arguments that never change values: the compare's one list (compared by nobody)
IGNORED_ARGUMENTS = IGNORED


# ----------------------------------------------------------------------------------- helpers


def _call_spec(rec: Optional[reader.ApiRec]) -> Optional[dict]:
    """The call spec (``extra["call"]``) of a forward record, when it is well formed."""
    if rec is None:
        return None
    for t in rec.tensors:
        spec = t.extra.get("call") if isinstance(t.extra, dict) else None
        if spec is not None and not call_problem(spec):
            return spec
    return None


def _malformed_spec(rec: reader.ApiRec) -> str:
    """``record NAME (line N): why`` of the first malformed call spec of ``rec``, or ``""``."""
    for t in rec.tensors:
        if isinstance(t.extra, dict) and "call" in t.extra:
            why = call_problem(t.extra["call"])
            if why:
                return f"malformed call record {t.name!r}" + (f" (line {t.line})" if t.line else "") + f": {why}"
    return ""


def _tensor_refs(spec: Any) -> List[str]:
    from pytest_ptdbg.replayer.codec import tensor_refs

    return tensor_refs(spec)


def _is_float(dtype: str) -> bool:
    return "float" in dtype or "bfloat" in dtype or "half" in dtype or "double" in dtype


def compute_dtype(dtypes: Sequence[str]) -> Optional[str]:
    """A call's compute dtype from its recorded output dtypes: the lowest floating precision among
    them (None: no floating output)."""
    fl = [d for d in dtypes if _is_float(d) and "complex" not in d]
    return max(fl, key=B.unit_roundoff) if fl else None


def _skip(x: Any) -> bool:
    return isinstance(x, dict) and len(x) == 1 and next(iter(x)) in ("t", "dtype")


def _follows(x: Any, y: Any, seen: Optional[Collection[str]]) -> bool:
    """A ``finfo`` number of the device's precision against the bench's (not a change)."""
    from pytest_ptdbg.replayer.arguments import follows_precision

    return follows_precision(x, y, seen)


def _dtypes_of(spec: Mapping[str, Any]) -> List[Tuple[str, str]]:
    """``(where, dtype name)`` of the dtype arguments of a call spec."""
    out = []
    for i, x in enumerate(spec.get("args") or []):
        if isinstance(x, dict) and set(x) == {"dtype"}:
            out.append((f"argument {i}", str(x["dtype"])))
    for k, x in (spec.get("kwargs") or {}).items():
        if isinstance(x, dict) and set(x) == {"dtype"}:
            out.append((k, str(x["dtype"])))
    return out


def lowered_precision(device_spec: Mapping[str, Any], bench_spec: Mapping[str, Any],
                      seen: Collection[str]) -> List[str]:
    """Dtype arguments that make the device's call compute in a lower precision than the bench's,
    given on the device's side only (``mean(x, dtype=torch.bfloat16)`` against ``mean(x)``), or in
    a precision none of the device's earlier calls produced (``seen``): ``"dtype: torch.float16
    vs torch.float32"``. A dtype that follows the data (``x.to(v.dtype)`` under autocast, where
    earlier calls already computed in it) is not a change."""
    bench = dict(_dtypes_of(bench_spec))
    out = []
    for where, dt in _dtypes_of(device_spec):
        other = bench.get(where)
        if other is None:
            other = "torch.float32" if where not in bench else other
        if not _is_float(dt) or B.unit_roundoff(dt) <= B.unit_roundoff(str(other)):
            continue
        if where not in bench:  # a line of code that asks for it: a change, whatever came before
            out.append(f"{where}: {dt} vs not given (a lower precision asked for on one side only)")
        elif dt not in seen:
            out.append(f"{where}: {dt} vs {other} (a precision no earlier call computed in)")
    return out


def changed_arguments(device_spec: Mapping[str, Any], bench_spec: Mapping[str, Any],
                      seen: Optional[Collection[str]] = None) -> List[str]:
    """Non-tensor arguments that differ between two call specs of one API: ``"eps: 1e-05 vs 0.001"``.

    Compared as recorded: the same position or keyword with other values, or a keyword given on
    one side only while both give the same number of positional arguments. Tensors, dtypes (they
    follow the data's dtype under autocast; a precision change is judged by the replay in the
    call's compute dtype) and :data:`IGNORED_ARGUMENTS` are not compared, nor ``finfo`` numbers
    of the device's precision (``seen``: the dtypes it computed in) against the bench's. (The
    compare stage's normalised comparison, when present as the table's ``_arg_changed`` rows, is
    preferred to this.)
    """
    out: List[str] = []
    a, b = device_spec.get("args") or [], bench_spec.get("args") or []
    for i in range(min(len(a), len(b))):
        x, y = a[i], b[i]
        if _skip(x) or _skip(y) or _follows(x, y, seen):
            continue
        if json.dumps(x, sort_keys=True) != json.dumps(y, sort_keys=True):
            out.append(f"argument {i}: {json.dumps(x)} vs {json.dumps(y)}")
    ka, kb = device_spec.get("kwargs") or {}, bench_spec.get("kwargs") or {}
    for k in sorted(set(ka) | set(kb)):
        if k in IGNORED_ARGUMENTS:
            continue
        x, y = ka.get(k, None), kb.get(k, None)
        if _skip(x) or _skip(y) or _follows(x, y, seen):
            continue
        if (k in ka) != (k in kb):
            if len(a) != len(b) or (x is None and y is None):
                continue
        if json.dumps(x, sort_keys=True) != json.dumps(y, sort_keys=True):
            out.append(f"{k}: {json.dumps(x)} vs {json.dumps(y)}")
    return out


# ------------------------------------------------------------------------------------ replay


class _Call:
    """One call's recorded tensors, each loaded once (from ``store``: shared with the calls
    around it). The arrays are read only: replays run on copies."""

    def __init__(self, fwd: reader.ApiRec, bwd: Optional[reader.ApiRec], store: Optional[ArrayStore] = None) -> None:
        store = store if store is not None else ArrayStore(0)
        self.store = store
        self.fwd, self.bwd = fwd, bwd
        self.arrays: Dict[str, np.ndarray] = {}
        self.ids: Dict[str, Any] = {}     # key -> the file's ArrayStore.file_id
        self._rms: Dict[str, float] = {}
        self.dtypes: Dict[str, str] = {}
        self.missing: List[str] = []
        self.requires_grad: set = set()
        #: input key -> the strides the device's kernel saw it with (dense, not row-major)
        self.strides: Dict[str, Tuple[int, ...]] = {}
        #: the math modes the device's call ran under (its call spec's ``"modes"``)
        self.modes: MathModes = MathModes()
        #: the product operands of a matmul/convolution/RNN (``runtime/reduced_fp32.py``), or None
        hit = FP32_APIS.get((fwd.api_type, fwd.api_name))
        self.operands: Any = hit[1] if hit is not None else False
        for rec, prefix in ((fwd, ""), (bwd, "backward_")):
            if rec is None:
                continue
            for t in rec.tensors:
                key = f"{prefix}{t.slot}"
                self.dtypes[key] = t.dtype
                if prefix == "" and t.extra.get("rg"):
                    self.requires_grad.add(key)
                if t.data_file:
                    self.arrays[key] = store.load(t.data_file, t.name, t.shape, t.dtype, t.data_inode)
                    self.ids[key] = store.file_id(t.data_file, t.data_inode)
                elif t.dtype.startswith("torch."):
                    self.missing.append(t.name)
        if bwd is not None:  # gradients were produced for exactly the inputs that required grad
            for t in bwd.tensors:
                if t.io == "output":
                    self.requires_grad.add(f"input.{t.index_str}")

    def keys(self, prefix: str) -> List[str]:
        return [k for k in self.arrays if k.startswith(prefix)]

    def rms(self, key: str) -> float:
        """:func:`budget.rms` of one array, computed once (per file, for the whole judgement)."""
        v = self._rms.get(key)
        if v is None:
            fid = self.ids.get(key)
            v = self.store.rms.get(fid) if fid is not None else None
            if v is None:
                v = B.rms(self.arrays[key])
                if fid is not None:
                    self.store.rms[fid] = v
            self._rms[key] = v
        return v

    def rms_upper(self, key: str) -> Optional[float]:
        """A proven upper bound of a positive :meth:`rms` of ``key`` without computing it
        (the exact value when known), or None."""
        v = self._rms.get(key)
        fid = self.ids.get(key)
        if v is None and fid is not None:
            v = self.store.rms.get(fid)
        if v is not None:
            return v if v > 0 else None
        return self.store.rms_upper.get(fid) if fid is not None else None


def _run(func: Callable, api: str, spec: dict, call: _Call, dev: Any, oracle: bool, cast: Any,
         backward: bool, fp32: Optional[str] = None) -> Dict[str, Any]:
    """One replay by the engine (:func:`pytest_ptdbg.replayer.engine.replay_call`): ``{output.i:
    tensor}`` and, with ``backward``, ``{backward_output.j: grad}``; the oracle with ``oracle``,
    else the floating inputs cast to ``cast`` (the compute dtype; None: as recorded) under the
    device's recorded autocast, a matmul's or convolution's float32 operands rounded to the reduced
    format its device allowed (``fp32``, default: the recorded mode; a correct kernel in that mode
    computes so). Both honour a recorded oneDNN switch."""
    from pytest_ptdbg.replayer.engine import replay_call

    modes = call.modes
    autocast = torch_dtype(modes.autocast) if modes.autocast and not oracle else None
    fmt = modes.fp32 if fp32 is None else fp32
    reduced = (fmt, call.operands) if fmt and call.operands is not False and not oracle else None
    return replay_call(func, api, spec, call.arrays, call.dtypes, dev, oracle=oracle, cast=cast,
                       autocast=autocast, mkldnn=modes.mkldnn, backward=backward,
                       requires_grad=call.requires_grad, strides=call.strides, reduced=reduced).tensors


def _np_native(t: Any) -> np.ndarray:
    """A replayed tensor as numpy without a float64 copy: float16/32/64 as they are, other floating
    dtypes (bfloat16, float8) as float32, which holds them exactly (the judge's kernels widen)."""
    import torch

    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.is_floating_point() and t.dtype not in (torch.float16, torch.float32, torch.float64):
        t = t.to(torch.float32)
    return t.resolve_neg().resolve_conj().numpy()


def _np(t: Any) -> np.ndarray:
    import torch

    if t.is_floating_point():
        return t.detach().to("cpu", torch.float64).numpy()
    return t.detach().cpu().numpy()


def _rms_keys(call: _Call, prefixes: Sequence[str]) -> List[str]:
    return [k for k, a in call.arrays.items() if k.startswith(tuple(prefixes))
            and _is_float(call.dtypes.get(k, "")) and a.dtype.kind == "f"]


def _input_rms(call: _Call, prefixes: Sequence[str],
               decided: Optional[Callable[[Optional[float]], bool]] = None) -> float:
    """The smallest positive RMS among the call's floating inputs under ``prefixes`` (0.0: none).

    ``decided(bound)`` (:func:`budget.input_rms_decided` of one output): whether every RMS up to
    ``bound`` gives that output the same budget. Then the smallest upper bound known without
    computing (:meth:`_Call.rms_upper`; the exact RMS of the smaller inputs, computed first, where
    needed) is returned instead of the exact minimum: the same budget, fewer passes over data."""
    keys = _rms_keys(call, prefixes)
    if decided is not None:
        known = [b for b in (call.rms_upper(k) for k in keys) if b is not None]
        bound = min(known) if known else None
        if decided(bound):
            return 0.0 if bound is None else bound
        for k in sorted(keys, key=lambda x: call.arrays[x].size):
            v = call.rms(k)
            if v > 0:
                bound = v if bound is None else min(bound, v)
                if decided(bound):
                    return bound
    vals = [call.rms(k) for k in keys]
    vals = [v for v in vals if v > 0]
    return min(vals) if vals else 0.0


# ----------------------------------------------------------------------------------- judging


def _passes_through(call: _Call, outs: Sequence[str], ins: Sequence[str], rounded: bool = False) -> bool:
    """Every floating output among ``outs`` equals, value for value, a same-shaped input among
    ``ins`` (``rounded``: after rounding that input to the output's recorded dtype: the gradient of
    a lossless cast is the incoming gradient in the cast's input dtype)."""
    got = [k for k in outs if k in call.arrays and call.arrays[k].dtype.kind == "f"]
    if not got:
        return False
    cands = [call.arrays[k] for k in ins if k in call.arrays and call.arrays[k].dtype.kind == "f"]
    for k in got:
        o = call.arrays[k]
        want = torch_dtype(call.dtypes.get(k, "")) if rounded else None
        if not any(c.shape == o.shape and _same_values(c, o, want) for c in cands):
            return False
    return True


#: elements compared first, spread over the tensor: most candidates differ there already
_SAMPLE = 64


def _same_values(c: np.ndarray, o: np.ndarray, want: Any = None) -> bool:
    """``c`` (rounded to the torch dtype ``want`` when given) equals ``o`` value for value, NaN
    where NaN (floating arrays of one shape; float16/32/64 widen exactly, so the comparison is in
    the arrays' own dtypes). A strided sample is compared first; only when it agrees, the whole."""
    cf, of = c.reshape(-1), o.reshape(-1)
    if cf.size > 4 * _SAMPLE:
        step = cf.size // _SAMPLE
        if not _equal(cf[::step], of[::step], want):
            return False
    return _equal(cf, of, want)


def _equal(c: np.ndarray, o: np.ndarray, want: Any) -> bool:
    if want is not None:
        import torch

        c = torch.from_numpy(np.ascontiguousarray(c)).to(want).to(torch.float64).numpy()
    if c.dtype != o.dtype:
        c, o = c.astype(np.float64), o.astype(np.float64)
    return bool(np.array_equal(c, o, equal_nan=True))


def _verdict(rec: reader.ApiRec, status: Status, reason: str = "", **kw: Any) -> CallVerdict:
    return CallVerdict(rec.key, rec.direction, rec.order, rec.family, status, reason, ctx=rec.ctx or "", **kw)


def _from_checks(rec: reader.ApiRec, checks: List[B.OutputCheck], compute: str, **kw: Any) -> CallVerdict:
    if not checks:
        return _verdict(rec, Status.NOT_JUDGED, "no recorded output to compare", **kw)
    w = B.worst(checks)
    assert w is not None  # checks is not empty
    over = w.ratio > 1.0
    rel_budget = w.budget / w.scale if w.scale > 0 else math.nan
    reason = w.note or ("over budget" if over else "")
    return _verdict(rec, Status.ROOT_CAUSE if over else Status.WITHIN, reason, ratio=w.ratio,
                    own_error=w.relative, budget=rel_budget, worst=w.key, nonfinite=w.nonfinite_origin,
                    compute_dtype=compute, **kw)


def _dropout(call: _Call, spec: dict, special: NJ.Special, fwd: reader.ApiRec,
             bwd: Optional[reader.ApiRec]) -> List[CallVerdict]:
    p = NJ.probability_arg(special, spec)
    if p is None:
        return [_verdict(r, Status.NOT_JUDGED, "dropout whose p is not a plain number")
                for r in (fwd, bwd) if r is not None]
    if not NJ.training_arg(spec):
        p = 0.0
    out: List[CallVerdict] = []
    dt = call.dtypes.get("output.0", "torch.float32")
    for rec, src, dst in ((fwd, "input.0", "output.0"), (bwd, "backward_input.0", "backward_output.0")):
        if rec is None:
            continue
        if src not in call.arrays or dst not in call.arrays:
            out.append(_verdict(rec, Status.NOT_JUDGED, "statistics only (no saved tensors)"))
            continue
        c = B.check_dropout(dst, call.arrays[dst], call.arrays[src], p, dt)
        v = _verdict(rec, Status.ROOT_CAUSE if c.own > 0 else Status.WITHIN,
                     c.note or "structure checked (0 or x/(1-p))", ratio=math.inf if c.own > 0 else 0.0,
                     own_error=c.own / max(c.scale, 1.0), budget=0.0, worst=dst, compute_dtype=dt)
        out.append(v)
    return out


#: what torch's CPU and CUDA allocators say when an allocation fails (a RuntimeError, not a MemoryError)
_OOM_TEXT = ("can't allocate memory", "not enough memory", "out of memory", "Cannot allocate memory")


def out_of_memory(exc: Optional[BaseException]) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is a failed allocation: numpy's
    MemoryError, torch's OutOfMemoryError, or torch's allocator's RuntimeError."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
            return True
        if isinstance(exc, (RuntimeError, ReplayError)) and any(t in str(exc) for t in _OOM_TEXT):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _judge_call(fwd: reader.ApiRec, bwd: Optional[reader.ApiRec], bench_fwd: Optional[reader.ApiRec],
                dev: Any, factor: float, seen: Collection[str] = (),
                store: Optional[ArrayStore] = None) -> List[CallVerdict]:
    """The verdicts of one call (forward, and backward when recorded); never raises for the call.
    ``passes_through`` comes from the recorded data alone, so it is set even when not replayed."""
    recs = [r for r in (fwd, bwd) if r is not None]

    def failed(why: str) -> List[CallVerdict]:  # could not be judged: fails, named (CallVerdict.unusable)
        return [_verdict(r, Status.NOT_JUDGED, why[:300], unusable=True) for r in recs]

    bad = _malformed_spec(fwd)
    if bad:
        return failed(bad)
    try:
        call: Optional[_Call] = _Call(fwd, bwd, store)
    except (ValueError, OSError) as exc:  # the table names the file and fails its row
        call = None
        vs = [_verdict(r, Status.NOT_JUDGED, f"could not read its data: {exc}"[:300]) for r in recs]
    except MemoryError as exc:
        return failed(f"out of memory reading its data (MemoryError: {exc})")
    except Exception as exc:  # noqa: BLE001 - one call's failure never switches the others off
        return failed(f"could not read its data: {type(exc).__name__}: {exc}")
    if call is not None:
        try:
            vs = _replay_call(call, fwd, bwd, bench_fwd, dev, factor, seen)
        except AllocationRefused as exc:  # a record that asks for more memory than it made: unusable
            vs = [_verdict(r, Status.NOT_JUDGED, f"not replayed: {exc}", unusable=True) for r in recs]
        except ReplayRefused as exc:
            vs = [_verdict(r, Status.NOT_JUDGED, f"not replayed: {exc}") for r in recs]
        except (ReplayError, NotReplayable, LookupError, ValueError, OSError, RuntimeError, TypeError,
                MemoryError) as exc:
            if out_of_memory(exc):  # torch's allocator raises RuntimeError; the replay wraps it
                return failed(f"out of memory in its replay ({type(exc).__name__}: {exc})")
            vs = [_verdict(r, Status.NOT_JUDGED, f"could not replay: {exc}"[:300]) for r in recs]
        except Exception as exc:  # noqa: BLE001 - as above
            return failed(f"its replay failed: {type(exc).__name__}: {exc}")
        try:
            for v in vs:
                if v.direction == "forward":
                    v.passes_through = _passes_through(call, call.keys("output."), call.keys("input."))
                else:
                    v.passes_through = _passes_through(call, call.keys("backward_output."),
                                                       call.keys("backward_input."), rounded=True)
        except MemoryError:  # passes_through stays False: the call counts as value-changing
            pass
    return vs


def _same_tensor_slots(fwd: reader.ApiRec, bench_fwd: reader.ApiRec) -> bool:
    """Each input record slot holds the same parameter on both sides (``F.linear(x, w, b)`` against
    ``F.linear(x, bias=b, weight=w)``: ``input.1`` is ``weight`` on one side, ``bias`` on the other),
    so the bench's call spec can take the device's tensors slot for slot."""
    mine = {t.slot: t.param for t in fwd.tensors if t.io == "input" and t.param}
    return all(mine.get(t.slot, t.param) == t.param for t in bench_fwd.tensors if t.io == "input" and t.param)


def _replay_call(call: _Call, fwd: reader.ApiRec, bwd: Optional[reader.ApiRec], bench_fwd: Optional[reader.ApiRec],
                 dev: Any, factor: float, seen: Collection[str] = ()) -> List[CallVerdict]:
    from pytest_ptdbg.replayer.allocation import guard_arrays
    from pytest_ptdbg.replayer.engine import resolve_api

    recs = [r for r in (fwd, bwd) if r is not None]
    spec = _call_spec(fwd)
    if spec is None:
        return [_verdict(r, Status.NOT_JUDGED, "no recorded call (arguments)") for r in recs]
    special = NJ.special_of(fwd.family)
    if special is not None and special.treatment in (NJ.Treatment.UNINITIALISED, NJ.Treatment.RANDOM):
        return [_verdict(r, Status.NOT_JUDGED, str(special.treatment)) for r in recs]
    if special is not None and special.treatment == NJ.Treatment.RANDOM_WITH_P:
        p = NJ.probability_arg(special, spec)
        if p is None or p != 0.0:
            return [_verdict(r, Status.NOT_JUDGED, f"random (dropout_p={p}) without a recorded generator state")
                    for r in recs]
    if special is not None and special.treatment == NJ.Treatment.DROPOUT:
        return _dropout(call, spec, special, fwd, bwd)
    needed = _tensor_refs(spec)
    if any(k not in call.arrays for k in needed) or not call.keys("output."):
        return [_verdict(r, Status.NOT_JUDGED, "statistics only (no saved tensors)") for r in recs]
    call.strides = _recorded_strides(spec, call, fwd.key)
    call.modes = recorded_modes(spec, fwd.key)

    # the bench's arguments, when the pairing matched this call to the same API with the same tensors
    use, changed, lowered, from_bench = spec, [], [], False
    bspec = _call_spec(bench_fwd)
    if (bspec is not None and bench_fwd is not None and bench_fwd.family == fwd.family
            and set(_tensor_refs(bspec)) <= set(call.arrays) and _same_tensor_slots(fwd, bench_fwd)):
        from pytest_ptdbg.replayer.arguments import with_own_precision

        lowered = lowered_precision(spec, bspec, seen)
        changed = changed_arguments(spec, bspec, seen) + lowered
        use, from_bench = with_own_precision(spec, bspec, seen), True
    extra = {"bench_arguments": from_bench, "changed_args": changed, "lowered_precision": lowered}
    if special is not None and special.treatment == NJ.Treatment.DUPLICATES:
        dim = NJ.dim_arg(special, spec)
        idx = [call.arrays[k] for k in needed if call.arrays[k].dtype.kind in "iu"]
        if dim is None or not idx or any(B.has_duplicates(i, dim) for i in idx):
            return [_verdict(r, Status.NOT_JUDGED, str(special.treatment), **extra) for r in recs]

    func = resolve_api(fwd.api_type, fwd.api_name, fwd.key)  # ReplayRefused unless allowlisted
    guard_arrays(func, fwd.key, use, call.arrays, call.dtypes)  # AllocationRefused: over its outputs' size
    out_dtypes = [call.dtypes[k] for k in call.keys("output.")]
    compute = compute_dtype(out_dtypes)
    cast = torch_dtype(compute) if compute else None
    backward = bwd is not None and bool(call.keys("backward_input.")) and bool(call.keys("backward_output."))
    orc = _run(func, fwd.key, use, call, dev, True, None, backward)
    try:
        ref = _run(func, fwd.key, use, call, dev, False, cast, backward)
    except ReplayError as exc:
        if cast is None or out_of_memory(exc):
            raise
        ref = _run(func, fwd.key, use, call, dev, False, None, backward)  # no kernel in that dtype here
    dim = NJ.dim_arg(special, spec) if special is not None and special.treatment == NJ.Treatment.TIES else None

    def norm(k: str) -> float:
        return call.rms(k) * math.sqrt(call.arrays[k].size) if k in call.arrays else 0.0

    def kernels(k: str, dt: str, scale: float) -> float:
        """The error every correct kernel of the call's algorithm family stays within (algorithms.py)."""
        return A.kernel_bound(fwd.api_name, use, call.arrays, norm, k, scale, dt)

    def checks(prefix: str, rms_from: Sequence[str]) -> List[B.OutputCheck]:
        res = []
        for k in call.keys(prefix):
            if k not in orc or k not in ref:
                continue
            d = call.arrays[k]
            floating = d.dtype.kind == "f" and _is_float(call.dtypes.get(k, "float"))
            # floating: the kernels widen to float64 themselves (no float64 copies here)
            o, r = (_np_native(orc[k]), _np_native(ref[k])) if floating else (_np(orc[k]), _np(ref[k]))
            if o.shape != d.shape or r.shape != d.shape:
                res.append(B.OutputCheck(k, math.inf, 0.0, 0.0, 0.0, note=f"replay gives shape {list(o.shape)}, "
                                                                          f"recorded {list(d.shape)}"))
                continue
            if floating:
                dt = compute or call.dtypes.get(k, "torch.float32")
                norms = B.finite_norms(d, o, r)
                if norms is None:  # NaN/Inf somewhere: the element-wise check, with the exact input RMS
                    res.append(B.check_output(k, d, o, r, dt, _input_rms(call, rms_from), factor,
                                              rounds=functools.partial(_rounds, call, o, r, d, rms_from, use),
                                              kernels=functools.partial(kernels, k, dt)))
                    continue
                own, rerr, scale, n = norms
                # an exact reference is no licence for a budget of 0 unless the result is selected
                rounds = rerr == 0 and own > 0 and _rounds(call, o, r, d, rms_from, use)

                def decided(bound: Optional[float], rerr: float = rerr, scale: float = scale, n: int = n,
                            dt: str = dt, rounds: bool = rounds) -> bool:
                    return B.input_rms_decided(bound, rerr, scale, n, dt, factor, rounds=rounds)

                res.append(B.judged(k, own, rerr, scale, n, dt, _input_rms(call, rms_from, decided), factor,
                                    rounds=rounds, kernels=kernels(k, dt, scale)))
                call.store.bound(call.ids.get(k), B.rms_bound(own, scale, n))
            elif special is not None and special.treatment == NJ.Treatment.TIES and "input.0" in call.arrays:
                res.append(B.check_indices(k, d, o, call.arrays["input.0"], dim))
            else:
                res.append(B.check_exact(k, d, o, r, factor))
        return res

    out = [_from_checks(fwd, checks("output.", ("input.",)), compute or "", **extra)]
    if bwd is not None and backward:
        out.append(_from_checks(bwd, checks("backward_output.", ("input.", "backward_input.")),
                                compute or "", **extra))
    for v in out:
        if v.status == Status.ROOT_CAUSE and not v.nonfinite and compute in ("torch.float32", "torch.float64"):
            v.matches_dtype = _matching_precision(func, fwd.key, use, call, dev, backward, orc, v.worst)
    if bwd is not None:
        if not backward:
            out.append(_verdict(bwd, Status.NOT_JUDGED, "no recorded incoming or produced gradient", **extra))
    return out


def _numbers(v: Any, out: List[float]) -> List[float]:
    if type(v) in (int, float):
        out.append(float(v))
    elif isinstance(v, list):
        for x in v:
            _numbers(x, out)
    elif isinstance(v, dict) and len(v) == 1 and next(iter(v)) in ("tuple", "float"):
        x = next(iter(v.values()))
        _numbers(x if not isinstance(x, str) else float(x), out)
    return out


def _rounds(call: _Call, oracle: np.ndarray, reference: np.ndarray, device: np.ndarray,
            prefixes: Sequence[str], spec: Mapping[str, Any]) -> bool:
    """Whether an output whose reference may reproduce its oracle exactly is still a value a
    kernel rounds (a sum, a product): not every value selected from the call's inputs and scalar
    arguments (:func:`budget.selects_inputs`). Asked only when the device differs from an exact
    reference, so an exact call passes over its data once more only when it is wrong."""
    if not np.array_equal(np.asarray(oracle, dtype=np.float64), np.asarray(reference, dtype=np.float64),
                          equal_nan=True):
        return True
    ins = [a for k, a in call.arrays.items() if k.startswith(tuple(prefixes))]
    nums = _numbers(list(spec.get("args") or []) + list((spec.get("kwargs") or {}).values()), [])
    return not B.selects_inputs(oracle, ins, nums)


def _recorded_strides(spec: Mapping[str, Any], call: _Call, api: str) -> Dict[str, Tuple[int, ...]]:
    """The device's recorded layouts of its inputs (the call spec's optional ``"strides"``), each
    checked to be dense and of its array's rank (a crafted layout is refused, not replayed)."""
    from pytest_ptdbg.dump.call_spec import dense_strides

    raw = spec.get("strides")
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ReplayRefused(api, "'strides' of the call spec is not an object", "strides")
    out: Dict[str, Tuple[int, ...]] = {}
    for k, st in raw.items():
        arr = call.arrays.get(k) if isinstance(k, str) else None
        if arr is None:
            continue  # no such input: nothing to lay out
        ok = (isinstance(st, list) and all(type(i) is int and 0 <= i < 2 ** 62 for i in st)
              and dense_strides(arr.shape, st))
        if not ok:
            raise ReplayRefused(api, f"strides {str(st)[:60]} are not a dense layout of {k!s:.40}", "strides")
        out[k] = tuple(st)
    return out


def _matching_precision(func: Callable, api: str, spec: dict, call: _Call, dev: Any, backward: bool,
                        orc: Dict[str, Any], key: str) -> str:
    """The lower precision (bfloat16, float16) whose replay, or whose rounding of the oracle's
    result, reproduces the device's ``key`` at least twice as closely as the oracle does, or ""."""
    import torch

    if key not in call.arrays or key not in orc:
        return ""
    d, o = call.arrays[key], orc[key]
    to_orc = _distance(d, o)
    if call.operands is not False and not call.modes.fp32:
        # a float32 matmul/convolution computed in TF32 or HF32 although strict float32 was asked for
        for fmt in ("tf32", "hf32"):
            try:
                r = _run(func, api, spec, call, dev, False, None, backward, fp32=fmt)
            except (ReplayError, RuntimeError, ValueError, TypeError):
                break
            if key in r and r[key].numel() == d.size and _distance(d, r[key], also=(o,)) < 0.5 * to_orc:
                return fmt
    for low in (torch.bfloat16, torch.float16):
        rounded = _distance(d, o, low=low if o.is_floating_point() else None, also=(o,))
        if rounded < 0.5 * to_orc:
            return str(low)
        try:
            r = _run(func, api, spec, call, dev, False, low, backward)
        except (ReplayError, RuntimeError, ValueError, TypeError):
            continue
        if key not in r or r[key].numel() != d.size:
            continue
        if _distance(d, r[key], also=(o,)) < 0.5 * to_orc:
            return str(low)
    return ""


#: elements per chunk of :func:`_distance` (8 MiB of float64 per operand)
_DIST_CHUNK = 1 << 20


def _flat(a: Any) -> Any:
    """A flat view (a copy only when a tensor is not contiguous) of an array or a tensor."""
    return a.reshape(-1) if isinstance(a, np.ndarray) else a.detach().reshape(-1)


def _chunk64(a: Any, i: int, j: int, low: Any = None) -> np.ndarray:
    """Elements ``i:j`` of a flat array or tensor in float64 (a tensor rounded to ``low`` first)."""
    import torch

    if isinstance(a, np.ndarray):
        return a[i:j].astype(np.float64)
    t = a[i:j]
    if low is not None:
        t = t.to(low)
    return t.to("cpu", torch.float64).numpy()


def _distance(d: Any, x: Any, low: Any = None, also: Sequence[Any] = ()) -> float:
    """‖d − x‖₂ over the elements where ``d``, ``x`` (rounded to the torch dtype ``low`` when
    given) and every array of ``also`` are finite: float64 chunk by chunk (:data:`_DIST_CHUNK`),
    so no whole-tensor float64 copy is made. ``d``, ``x``, ``also``: arrays or tensors of one size."""
    df, xf, af = _flat(d), _flat(x), [_flat(a) for a in also]
    n = int(df.shape[0])
    total = 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        for i in range(0, n, _DIST_CHUNK):
            j = min(n, i + _DIST_CHUNK)
            dc, xc = _chunk64(df, i, j), _chunk64(xf, i, j, low)
            ok = np.isfinite(dc) & np.isfinite(xc)
            for a in af:
                ok &= np.isfinite(_chunk64(a, i, j))
            diff = (dc - xc)[ok]
            total += float(np.dot(diff, diff))
    return math.sqrt(total)


def judge_dump(dump: Union[str, reader.Dump], reference: Union[str, reader.Dump, None] = None, *,
               device: str = "cpu", pairs: Optional[Mapping[str, str]] = None, factor: float = B.FACTOR,
               progress: Optional[Callable[[str], None]] = None) -> DumpJudgement:
    """Judge every call of ``dump`` by replay from its own recorded inputs (module docstring).

    ``dump``: a dump folder or file (anything ``dump.reader.read_dump`` takes) or a read ``Dump``
    with full tensors (statistics-only calls are listed as not judged). ``reference``: the bench
    dump (optional; statistics-only is enough): its recorded arguments are used for paired calls.
    ``pairs``: device API key -> bench API key (forward keys; default: the same key). ``device``:
    where to replay (the bench device). Returns a :class:`DumpJudgement`; raises ImportError
    without torch. Nothing raises for one call, and no call's failure stops the others: a call
    that cannot be replayed is not judged (its statistics judge it, ``judge/step.py``), one whose
    record is malformed or whose replay ran out of memory or failed unexpectedly could not be
    judged (``CallVerdict.unusable``: it fails the judgement, named with the reason).
    """
    with paused_gc():  # as compare() runs it: the calls make many small objects and no cycles
        return _judge_dump(dump, reference, device, pairs, factor, progress)


def _judge_dump(dump: Union[str, reader.Dump], reference: Union[str, reader.Dump, None], device: str,
                pairs: Optional[Mapping[str, str]], factor: float,
                progress: Optional[Callable[[str], None]]) -> DumpJudgement:
    import torch

    from pytest_ptdbg.replayer.engine import check_device

    t0 = time.perf_counter()
    d = dump if isinstance(dump, reader.Dump) else reader.read_dump(dump)
    b = reference if isinstance(reference, reader.Dump) or reference is None else reader.read_dump(reference)
    dev = check_device(device) if not isinstance(device, torch.device) else device
    index = {a.key: a for a in d.apis}
    bench = {a.key: a for a in b.apis} if b is not None else {}
    out = DumpJudgement(d.source, str(dev), factor=factor)
    store = ArrayStore()  # each saved file read once, shared by neighbouring calls
    seen = set()
    produced: set = set()  # floating dtypes the device's calls produced so far
    for a in d.apis:
        if a.key in seen:
            continue
        if a.direction == "forward":
            bkey = records.api_key(a.api_type, a.api_name, a.call_index, "backward")
            bwd = index.get(bkey)
            bench_fwd = bench.get((pairs or {}).get(a.key, a.key)) if bench else None
            recs = [a] + ([bwd] if bwd is not None else [])
            vs = _judge_call(a, bwd, bench_fwd, dev, factor, produced, store)
            for r in recs:
                seen.add(r.key)
            produced.update(t.dtype for t in a.tensors if t.io == "output" and _is_float(t.dtype))
            out.verdicts.extend(vs)
        else:
            fkey = records.api_key(a.api_type, a.api_name, a.call_index, "forward")
            if fkey not in index:
                seen.add(a.key)
                out.verdicts.append(_verdict(a, Status.NOT_JUDGED, "its forward call was not recorded"))
    if bench:  # a downcast the bench does not make, computed on in a higher precision later
        from pytest_ptdbg.judge.downcast import downcasts

        lowered = downcasts(d, bench, pairs, dev, store)
        for v in out.verdicts:
            if v.api in lowered:
                v.changed_args = list(v.changed_args) + [lowered[v.api]]
                v.lowered_precision = list(v.lowered_precision) + [lowered[v.api]]
    order = {a.key: (a.order, i) for i, a in enumerate(d.apis)}
    out.verdicts.sort(key=lambda v: order.get(v.api, (v.order, 0)))
    out.seconds = time.perf_counter() - t0
    if progress is not None:
        progress(out.summary())
    return out


def judge_call(fwd: reader.ApiRec, bwd: Optional[reader.ApiRec] = None, *, device: Any = "cpu",
               factor: float = B.FACTOR) -> List[CallVerdict]:
    """The verdicts of one recorded call by itself, as :func:`judge_dump` judges each call of a
    dump: its forward (``fwd``, with its call spec and saved tensors) and, with ``bwd``, its
    backward, each by its own error against its budget. ``ptdbg replay PACKAGE`` judges a
    reproduction package by this (``repro/runner.py``). Never raises for the call."""
    import torch

    from pytest_ptdbg.replayer.engine import check_device

    dev = device if isinstance(device, torch.device) else check_device(str(device))
    return _judge_call(fwd, bwd, None, dev, factor, (), ArrayStore())
