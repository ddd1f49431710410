"""A downcast the bench does not make, whose result is computed on in a higher precision.

Under autocast a line such as ``x = x.to(h.dtype) + out(y)`` rounds the residual stream to
bfloat16 on the device, while the bench's ``x.to(float32)`` changes nothing. The cast itself is
right for its inputs (a correct rounding), its dtype argument follows the run's precision, so
neither the replay nor the argument comparison objects; yet everything the residual feeds now
starts from bf16 values where the bench keeps float32.

:func:`downcasts` finds such casts and follows their result through the device's later calls
(by the saved file each input was read from, hard-linked to the output that produced it):

* a call that autocast lowers anyway (replayed under ``torch.autocast`` with the value before
  the cast, its outputs are still the low dtype: a linear, a matmul) loses nothing more: this
  branch is benign (HF attention's ``softmax(...).to(q.dtype)`` before ``matmul``);
* a call whose outputs follow the dtype of its inputs (``add``, ``mul``, a view, dropout): the cast
  made it compute in the low dtype; its outputs are followed in turn;
* a call whose recorded outputs are in a higher precision than the cast's (a layer norm, a loss,
  ``.float()``): the lowered values reach a computation the run does in that higher precision:
  the cast is a root cause.

Calls that cannot be replayed end their branch (no evidence). Only casts that change values,
paired with a bench call that does not lower its input, are examined.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from pytest_ptdbg.dump import reader
from pytest_ptdbg.judge import budget as B
from pytest_ptdbg.judge import not_judged as NJ

__all__ = ["downcasts", "MAX_CALLS"]

#: calls followed from one cast (a residual stream reaches a computation within a few)
MAX_CALLS = 24


def _floating(t: Any) -> bool:
    d = str(t.dtype)
    return d.startswith("torch.") and ("float" in d or "half" in d) and "complex" not in d


def _tensor_records(rec: reader.ApiRec, io: str) -> List[Any]:
    return [t for t in rec.tensors if t.io == io and str(t.dtype).startswith("torch.")]


def _file_key(t: Any) -> Optional[Tuple[str, Any]]:
    if not t.data_file:
        return None
    return ("inode", t.data_inode) if t.data_inode else ("file", t.data_file)


def _cast_of(rec: reader.ApiRec) -> Optional[Tuple[Any, Any]]:
    """``(input record, output record)`` when a forward call rounds its one floating input to a
    lower precision of the same shape, else None."""
    ins = [t for t in _tensor_records(rec, "input") if _floating(t)]
    outs = [t for t in _tensor_records(rec, "output") if _floating(t)]
    if len(ins) != 1 or len(outs) != 1 or list(ins[0].shape) != list(outs[0].shape):
        return None
    i, o = ins[0], outs[0]
    if B.unit_roundoff(str(o.dtype)) <= B.unit_roundoff(str(i.dtype)):
        return None
    return i, o


def _bench_keeps(bench_rec: Optional[reader.ApiRec], low: str) -> Optional[str]:
    """The bench call's output dtype when it keeps a precision above ``low`` without lowering
    its input (``x.to(float32)`` of a float32 value), else None."""
    if bench_rec is None:
        return None
    ins = [t for t in _tensor_records(bench_rec, "input") if _floating(t)]
    outs = [t for t in _tensor_records(bench_rec, "output") if _floating(t)]
    if len(ins) != 1 or len(outs) != 1:
        return None
    b_in, b_out = str(ins[0].dtype), str(outs[0].dtype)
    if B.unit_roundoff(b_out) < B.unit_roundoff(low) and B.unit_roundoff(b_out) <= B.unit_roundoff(b_in):
        return b_out
    return None


def _changes_values(src: np.ndarray, out: np.ndarray) -> bool:
    return src.shape == out.shape and not np.array_equal(np.asarray(src, dtype=np.float64),
                                                        np.asarray(out, dtype=np.float64), equal_nan=True)


def _replay_upcast(consumer: reader.ApiRec, slot: str, value: np.ndarray, value_dtype: str, low: str,
                   dev: Any, store: Any) -> Optional[List[Any]]:
    """The output dtypes of ``consumer`` replayed under autocast to ``low`` with its input
    ``slot`` holding ``value`` (the value before the cast) instead; None when it cannot be
    replayed (not allowlisted, no call spec or data, the call fails)."""
    import torch

    from pytest_ptdbg.errors import NotReplayable, ReplayError, ReplayRefused
    from pytest_ptdbg.judge import own_error as OE
    from pytest_ptdbg.replayer.allowlist import torch_dtype
    from pytest_ptdbg.replayer.engine import replay_call, resolve_api

    spec = OE._call_spec(consumer)
    if spec is None:
        return None
    try:
        call = OE._Call(consumer, None, store)
        func = resolve_api(consumer.api_type, consumer.api_name, consumer.key)
    except (ReplayRefused, NotReplayable, ReplayError, LookupError, ValueError, OSError):
        return None
    if any(k not in call.arrays for k in OE._tensor_refs(spec)):
        return None

    low_dt = torch_dtype(low)
    if low_dt not in (torch.bfloat16, torch.float16):
        return None
    arrays, dtypes = {**call.arrays, slot: value}, {**call.dtypes, slot: value_dtype}
    try:
        out = replay_call(func, consumer.key, spec, arrays, dtypes, dev, autocast=low_dt)
        return [t.dtype for k, t in out.tensors.items() if k.startswith("output.") and t.is_floating_point()]
    except Exception:  # noqa: BLE001 - any failure of a replay is "no evidence", never a verdict
        return None


def _follow(start: Any, after: int, low: str, hi_value: np.ndarray, hi_dtype: str,
            consumers: Mapping[Any, list], dev: Any, store: Any) -> Optional[Tuple[str, str]]:
    """``(API key, dtype)`` of the first call that computes on the lowered values in a precision
    above ``low``, or None (every branch reaches a call autocast lowers anyway, or no evidence)."""
    import torch

    u_low = B.unit_roundoff(low)
    queue: List[Tuple[Any, np.ndarray, str]] = [(start, hi_value, hi_dtype)]
    seen: set = set()
    visited = 0
    while queue and visited < MAX_CALLS:
        rec_key, value, vdt = queue.pop(0)
        for consumer, slot in consumers.get(rec_key, ()):
            if consumer.key in seen or consumer.order <= after:
                continue  # a call before the cast read an earlier tensor of that file
            seen.add(consumer.key)
            visited += 1
            outs = [t for t in _tensor_records(consumer, "output") if _floating(t)]
            if not outs:
                continue
            higher = [str(t.dtype) for t in outs if B.unit_roundoff(str(t.dtype)) < u_low]
            if higher:
                return consumer.key, higher[0]  # the lowered values computed on in a higher precision
            sp = NJ.special_of(consumer.family)
            if sp is not None and sp.treatment == NJ.Treatment.DROPOUT:
                lowered: Optional[List[Any]] = [torch.float32]  # dropout follows its input's dtype: followed through
            else:
                lowered = _replay_upcast(consumer, slot, value, vdt, low, dev, store)
            if lowered is None or all(d in (torch.bfloat16, torch.float16) for d in lowered):
                continue  # no evidence, or autocast computes it in the low dtype anyway
            for t in outs:  # it computed in the low dtype because of the cast: follow its outputs
                k = _file_key(t)
                if k is not None and t.data_file:
                    try:
                        v = store.load(t.data_file, t.name, t.shape, t.dtype, t.data_inode)
                    except (ValueError, OSError):
                        continue
                    queue.append((k, np.asarray(v, dtype=np.float64), hi_dtype))
    return None


def downcasts(dump: reader.Dump, bench: Mapping[str, reader.ApiRec], pairs: Optional[Mapping[str, str]],
              dev: Any, store: Any) -> Dict[str, str]:
    """``{device forward key: what it lowered}`` for every downcast of the device the bench does
    not make whose values a later call computes on in a higher precision (module docstring)."""
    casts = []
    for a in dump.apis:
        if a.direction != "forward":
            continue
        c = _cast_of(a)
        if c is None or not c[0].data_file or not c[1].data_file:
            continue
        kept = _bench_keeps(bench.get((pairs or {}).get(a.key, a.key)), str(c[1].dtype))
        if kept is not None:
            casts.append((a, c, kept))
    if not casts:
        return {}
    consumers: Dict[Any, list] = {}
    for a in dump.apis:
        if a.direction != "forward":
            continue
        for t in _tensor_records(a, "input"):
            k = _file_key(t)
            if k is not None:
                consumers.setdefault(k, []).append((a, t.slot))
    found: Dict[str, str] = {}
    for a, (i, o), kept in casts:
        try:
            src = store.load(i.data_file, i.name, i.shape, i.dtype, i.data_inode)
            out = store.load(o.data_file, o.name, o.shape, o.dtype, o.data_inode)
        except (ValueError, OSError):
            continue
        if not _changes_values(src, out):
            continue  # a lossless cast: nothing is lost
        who = _follow(_file_key(o), a.order, str(o.dtype), np.asarray(src, dtype=np.float64), str(i.dtype),
                      consumers, dev, store)
        if who is not None:
            found[a.key] = (f"output: {o.dtype} vs {kept} (a cast to lower precision the bench does not "
                            f"make; {who[0]} then computes on its values in {who[1]})")
    return found
