"""Own error or inherited error? Re-run a suspect API from the device-under-test's own inputs.

For each suspect (an API key of the NPU dump) whose tensors were dumped in full:

1. the call is rebuilt from the dump (``extra["call"]`` + the ``.npy`` inputs of the NPU side;
   the bench dump's own call spec and input dtypes when it has the same call, so that an argument
   that differs between the runs, such as ``.to(torch.bfloat16)``, is judged too);
2. it is run on the bench device (forward; a backward suspect: forward, then ``autograd.grad``
   with the NPU's incoming gradient) -> what the reference computes from *the same inputs*;
3. and, when inputs are floating point, in float64 -> an oracle.

``own_error`` = error of the NPU output against that re-run (max over output tensors of
``max(1 - cosine, relative L2)``, the advisor's measure). ``observed_error`` = the same between the
NPU and bench outputs of the two runs. When the API's own error explains a good part of what was
observed the API itself is imprecise on the device (``Verdict.OWN``); otherwise its output differs
only because its inputs did and it passes that difference on, amplified ``amplification`` times
(``Verdict.INHERITED``). What the numbers mean, and the words, are :mod:`.replay_verdict`'s.

Importing this module does not import torch; running a check does (through ``replay``). The
compare path should call it only when the dumps hold full tensors (``Dump.has_data``)::

    from pytest_ptdbg.judge.replay_check import check_suspects, replay_section
    verdicts = check_suspects(advice, npu_dump, bench_dump, bench_device="cpu")  # dirs or read Dumps
    text = advice.text() + "\n" + replay_section(verdicts)
"""
from __future__ import annotations

import math
import os
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

import numpy as np

from pytest_ptdbg.format import records
from pytest_ptdbg.dump import reader
from pytest_ptdbg.dump.npy import load_npy
from pytest_ptdbg.errors import ReplayRefused
from pytest_ptdbg.judge.replay_verdict import NOISE, ReplayVerdict, Verdict, decide, replay_section, verdict_prose

__all__ = ["ReplayVerdict", "Verdict", "check_suspects", "check_apis", "replay_section"]


# ------------------------------------------------------------------------------------- errors


def _err(a: np.ndarray, b: np.ndarray, a_dtype: str, b_dtype: str) -> float:
    """``max(1 - cosine, rel L2)`` of a pair; inf when NaN/Inf positions differ."""
    from pytest_ptdbg.comparison import metrics

    m = metrics.compare_arrays(a, b, eps=metrics.dtype_eps(b_dtype))
    if m.shape_mismatch or m.nan_mismatch:
        return math.inf
    vals = [v for v in (1.0 - m.cosine if not math.isnan(m.cosine) else math.nan, m.rel_l2) if not math.isnan(v)]
    return max(vals) if vals else 0.0


# ------------------------------------------------------------------------------------- packages


def _api_index(dump: reader.Dump) -> Dict[str, reader.ApiRec]:
    return {a.key: a for a in dump.apis}


def _call_spec(rec: reader.ApiRec) -> Optional[dict]:
    for t in rec.tensors:
        spec = t.extra.get("call") if isinstance(t.extra, dict) else None
        if isinstance(spec, dict) and "args" in spec:
            return spec
    return None


def _package_from_dump(api: str, fwd: reader.ApiRec, bwd: Optional[reader.ApiRec], spec: dict,
                       dtypes: Optional[Dict[str, str]] = None):
    """An in-memory reproduction package whose tensors are the dump's ``.npy`` files."""
    from pytest_ptdbg.judge.package import Package, TensorInfo, tensor_refs

    tensors: Dict[str, TensorInfo] = {}
    missing: List[str] = []

    def add(t: reader.TensorRec, key: str) -> None:
        if not t.data_file:
            missing.append(t.name)
            return
        dt = (dtypes or {}).get(key, t.dtype)
        tensors[key] = TensorInfo(key, os.path.abspath(t.data_file), dt, tuple(t.shape), bool(t.extra.get("rg", False)))

    for t in fwd.tensors:
        add(t, t.slot)
    if bwd is not None:
        for t in bwd.tensors:
            add(t, f"backward_{t.io}.{t.index_str}")
        # gradients were dumped for exactly the inputs that required grad
        for t in bwd.tensors:
            if t.io == "output" and f"input.{t.index_str}" in tensors:
                tensors[f"input.{t.index_str}"].requires_grad = True
    needed = set(tensor_refs(spec))
    lacking = sorted(k for k in needed if k not in tensors)
    if lacking:
        raise LookupError(f"no data for {', '.join(lacking)} of {fwd.key} "
                          f"({'; '.join(missing[:3]) or 'not dumped'}): dump with summary_only=False")
    pkg = Package(path=records.DUMP_DIR_NAME, api=api, call=spec, tensors=tensors, stack=fwd.stack or [])
    if not pkg.expected_keys:
        raise LookupError(f"no saved output of {api} to compare with")
    return pkg


def _structure(rec: reader.ApiRec) -> Dict[str, tuple]:
    return {t.slot: tuple(t.shape) for t in rec.tensors if t.io == "input"}


# ------------------------------------------------------------------------------------- checking


def check_apis(apis: Sequence[str], npu_dump: Union[str, reader.Dump], bench_dump: Union[str, reader.Dump, None] = None,
               bench_device: str = "cpu", oracle: bool = True,
               observed: Optional[Dict[str, float]] = None, input_errors: Optional[Dict[str, float]] = None,
               bench_names: Optional[Dict[str, str]] = None) -> List[ReplayVerdict]:
    """Re-run each API key in ``apis`` (NPU dump names) and classify it (see the module docstring).

    ``npu_dump``/``bench_dump``: dump folders or files (anything ``dump.reader.read_dump`` takes) or
    read dumps. ``observed``/``input_errors``: the compare stage's errors per API key (computed
    from the bench dump's tensors when missing). ``bench_names``: NPU key -> bench key when the
    pairing renamed a call. An API that cannot be re-run gets ``Verdict.UNKNOWN`` and the reason.
    """
    npu = reader.read_dump(npu_dump) if isinstance(npu_dump, (str, bytes)) or hasattr(npu_dump, "__fspath__") else npu_dump
    bench = None
    if bench_dump is not None:
        bench = reader.read_dump(bench_dump) if not isinstance(bench_dump, reader.Dump) else bench_dump
    n_idx = _api_index(npu)
    b_idx = _api_index(bench) if bench is not None else {}
    out = []
    for api in apis:
        try:
            out.append(_check_one(api, n_idx, b_idx, bench_device, oracle, (observed or {}).get(api),
                                  (input_errors or {}).get(api), (bench_names or {}).get(api, api)))
        except ReplayRefused as exc:  # the judge refused it before any call: the others go on
            out.append(ReplayVerdict(api, Verdict.UNKNOWN, f"not replayed: {exc}", device=bench_device))
        except (LookupError, ValueError, FileNotFoundError, RuntimeError) as exc:
            out.append(ReplayVerdict(api, Verdict.UNKNOWN, f"could not re-run it: {exc}", device=bench_device))
    return out


def _check_one(api: str, n_idx: Dict[str, reader.ApiRec], b_idx: Dict[str, reader.ApiRec], device: str,
               oracle: bool, observed: Optional[float], input_error: Optional[float], bench_api: str) -> ReplayVerdict:
    from pytest_ptdbg.judge.runner import run_package
    from pytest_ptdbg.judge.package import to_numpy

    p = records.parse_name(api)
    fkey = records.api_key(p.api_type, p.api_name, p.call_index, "forward")
    fwd = n_idx.get(fkey)
    if fwd is None:
        raise LookupError(f"{fkey} is not in the NPU dump (its inputs are needed)")
    spec = _call_spec(fwd)
    if spec is None:
        raise LookupError(f"{fkey} has no call spec in the NPU dump (written by an older dumper?)")
    bwd = n_idx.get(api) if p.direction == "backward" else None
    if p.direction == "backward" and bwd is None:
        raise LookupError(f"{api} is not in the NPU dump")
    npu_pkg = _package_from_dump(api, fwd, bwd, spec)

    # the bench's own call (arguments, input dtypes) when it made the same call
    bp = records.parse_name(bench_api)
    bfwd = b_idx.get(records.api_key(bp.api_type, bp.api_name, bp.call_index, "forward"))
    bbwd = b_idx.get(bench_api) if p.direction == "backward" else None
    run_pkg, used_bench = npu_pkg, False
    bspec = _call_spec(bfwd) if bfwd is not None else None
    if bspec is not None and _structure(bfwd) == _structure(fwd) and (bfwd.api_type, bfwd.api_name) == (p.api_type, p.api_name):
        dtypes = {t.slot: t.dtype for t in bfwd.tensors if t.io == "input"}
        run_pkg = _package_from_dump(api, fwd, bwd, bspec, dtypes)
        used_bench = True

    keys = npu_pkg.expected_keys
    saved = {k: npu_pkg.load_array(k) for k in keys}
    sdt = {k: npu_pkg.tensors[k].dtype for k in keys}
    rerun = {k: v for k, v in run_package(run_pkg, device).items() if k in saved}
    per: Dict[str, Dict[str, float]] = {}
    own = 0.0
    for k in keys:
        if k not in rerun:
            raise LookupError(f"the re-run of {api} did not produce {k}")
        e = _err(saved[k], to_numpy(rerun[k]), sdt[k], str(rerun[k].dtype))
        per.setdefault(k, {})["own"] = e
        own = max(own, e)
    o_err = bo_err = math.nan
    floating = any(npu_pkg.tensors[k].dtype.startswith("torch.") and "float" in npu_pkg.tensors[k].dtype
                   for k in npu_pkg.tensors if k.startswith("input."))
    if oracle and floating:
        orc = run_package(run_pkg, device, dtype="float64")
        o_err = bo_err = 0.0
        for k in keys:
            if k in orc:
                ref = to_numpy(orc[k])
                e1 = _err(saved[k], ref, sdt[k], "torch.float64")
                e2 = _err(to_numpy(rerun[k]), ref, str(rerun[k].dtype), "torch.float64")
                per[k]["oracle"], per[k]["bench_oracle"] = e1, e2
                o_err, bo_err = max(o_err, e1), max(bo_err, e2)

    # what was observed between the two runs, and what came in
    b_rec = {}
    if bfwd is not None:
        for rec in (bfwd, bbwd):
            for t in (rec.tensors if rec is not None else []):
                b_rec[t.slot if rec is bfwd else f"backward_{t.io}.{t.index_str}"] = t
    if observed is None or (isinstance(observed, float) and math.isnan(observed)):
        observed = _pair_error(npu_pkg, b_rec, keys)
    if input_error is None or (isinstance(input_error, float) and math.isnan(input_error)):
        ins = [k for k in npu_pkg.tensors if k.startswith(("input.", "backward_input."))]
        input_error = _pair_error(npu_pkg, b_rec, ins)
    amp = observed / max(input_error, NOISE) if not math.isnan(observed) and not math.isnan(input_error) else math.nan

    v = ReplayVerdict(api, Verdict.UNKNOWN, "", own, observed, input_error, o_err, bo_err, amp, device,
                      used_bench, per)
    v.verdict = decide(v)
    v.reason = verdict_prose(v)
    return v


def _pair_error(npu_pkg: Any, b_rec: Dict[str, reader.TensorRec], keys: Iterable[str]) -> float:
    worst = math.nan
    for k in keys:
        t = b_rec.get(k)
        if t is None or not t.data_file or k not in npu_pkg.tensors:
            continue
        b = load_npy(t.data_file, t.name, t.shape, t.dtype)   # regular file, header and size checked
        e = _err(npu_pkg.load_array(k), b, npu_pkg.tensors[k].dtype, t.dtype)
        worst = e if math.isnan(worst) else max(worst, e)
    return worst


def check_suspects(advice: Any, npu_dump_dir: Union[str, reader.Dump], bench_dump_dir: Union[str, reader.Dump, None] = None,
                   bench_device: str = "cpu", top: int = 3, oracle: bool = True) -> List[ReplayVerdict]:
    """Replay check of the advisor's top suspects (``Advice.suspects``, kinds own/nonfinite/inherited).

    Uses each suspect's ``output_error``/``input_error`` as the observed errors. Unpaired suspects
    are skipped.
    """
    sus = [s for s in getattr(advice, "suspects", advice) if getattr(s, "kind", "") != "unpaired"][:top]
    apis = [s.api for s in sus]
    observed = {s.api: float(s.output_error) for s in sus if s.output_error is not None}
    inputs = {s.api: float(s.input_error) for s in sus if s.input_error is not None}
    return check_apis(apis, npu_dump_dir, bench_dump_dir, bench_device, oracle, observed, inputs)
