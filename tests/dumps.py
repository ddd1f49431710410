"""Write small synthetic ptdbg v4 dumps for tests (numpy only), with ``dump/records.py``.

``write_dump(dump_path, apis)`` writes ``{dump_path}/ptdbg_dump_v4.0/step0/rank{R}/api_stack_dump.pkl``
and the ``.npy`` files; ``apis`` is a list of :class:`Api` (key, ``{slot: array}``, stack, ctx).
:func:`mlp_apis` builds the API sequence of one forward/backward step of a tiny numpy MLP, with
optional noise and planted faults, so that two dumps of it can be compared.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np

from pytest_ptdbg.format import records
from pytest_ptdbg.format.manifest import write_manifest


@dataclass
class Api:
    key: str
    tensors: Dict[str, np.ndarray]          # slot ("input.0", "output.1.0") -> array
    stack: Optional[list] = None
    ctx: str = ""
    dtypes: Dict[str, str] = field(default_factory=dict)  # slot -> record dtype override


_DT = {"float16": "torch.float16", "float32": "torch.float32", "float64": "torch.float64",
       "int64": "torch.int64", "int32": "torch.int32", "bool": "torch.bool"}


def stats_of(a: np.ndarray) -> list:
    """ptdbg statistics ``[max, min, mean, l2norm]`` (empty for bool/empty tensors)."""
    if a.size == 0 or a.dtype == bool:
        return []
    f = a.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        l2 = float(np.sqrt(np.sum(f * f))) if a.dtype.kind == "f" else "Nan"
        return [float(np.max(f)), float(np.min(f)), float(np.mean(f)), l2]


def record_lines(api: Api, save_data: bool = True) -> List[list]:
    out = []
    for slot, arr in api.tensors.items():
        io, _, idx = slot.partition(".")
        name = records.tensor_key(api.key, io, [int(i) for i in idx.split(".")])
        arr = np.asarray(arr)
        extra = {}
        if arr.dtype.kind == "f":
            n_nan, n_inf = int(np.isnan(arr).sum()), int(np.isinf(arr).sum())
            if n_nan:
                extra["nan"] = n_nan
            if n_inf:
                extra["inf"] = n_inf
        if api.ctx:
            extra["ctx"] = api.ctx
        if save_data:
            extra["npy"] = records.data_file_name(name)
        dtype = api.dtypes.get(slot, _DT.get(arr.dtype.name, "torch." + arr.dtype.name))
        out.append(records.tensor_record(name, dtype, arr.shape, stats_of(arr), extra or None))
    if api.stack is not None:
        out.append(records.stack_record(api.key, api.stack))
    return out


def write_dump(dump_path: str, apis: Sequence[Api], rank: int = 0, step: int = 0, mode: str = "api_stack",
               save_data: bool = True, manifest: bool = True) -> str:
    """Write a dump and (unless ``manifest=False``) its completeness manifest; returns the rank folder."""
    rdir = records.rank_dir(dump_path, step, rank)
    os.makedirs(rdir, exist_ok=True)
    ddir = os.path.join(rdir, records.data_dir_name(mode))
    if save_data:
        os.makedirs(ddir, exist_ok=True)
    n = 0
    pkl = os.path.join(rdir, records.pkl_name(mode))
    with open(pkl, "w") as f:
        for api in apis:
            for rec in record_lines(api, save_data):
                f.write(records.encode_line(rec))
                n += 1
                if save_data and not records.is_stack_record(rec):
                    name = rec[0]
                    np.save(records.safe_data_path(ddir, name), np.asarray(api.tensors[name[len(api.key) + 1:]]))
    if manifest:
        write_manifest(pkl, n)   # as the dump writer does when a step is closed
    return rdir


def frame(line: int, func: str = "forward", file: str = "model.py", code: str = "x = f(x)") -> list:
    return [file, line, func, code]


def mlp_apis(seed: int = 0, noise: float = 0.0, fault: Optional[str] = None, fault_scale: float = 1e-2,
             batch: int = 8, width: int = 16, extra_cast: bool = False) -> List[Api]:
    """One forward + backward step of ``linear -> relu -> linear -> softmax -> mse`` in numpy.

    ``noise``: relative noise on the parameters (every API then differs a little).
    ``fault``: "forward" (the relu output is perturbed), "backward" (the gradient produced by the
    relu backward is perturbed), "nan" (a NaN appears in the second linear's output).
    ``extra_cast``: an extra ``Tensor_to`` call after the first linear (a device-specific cast).
    """
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, width)).astype(np.float32)
    w1 = rng.standard_normal((width, width)).astype(np.float32) / 4
    w2 = rng.standard_normal((width, width)).astype(np.float32) / 4
    tgt = rng.standard_normal((batch, width)).astype(np.float32)
    if noise:
        nz = np.random.default_rng(1000 + seed)
        w1 = (w1 * (1 + noise * nz.standard_normal(w1.shape))).astype(np.float32)
        w2 = (w2 * (1 + noise * nz.standard_normal(w2.shape))).astype(np.float32)
    frng = np.random.default_rng(7)
    h = x @ w1.T
    apis = [Api("Functional_linear_0_forward", {"input.0": x, "input.1": w1, "output.0": h}, [frame(10)])]
    if extra_cast:
        apis.append(Api("Tensor_to_0_forward", {"input.0": h, "output.0": h.copy()}, [frame(11)]))
    r = np.maximum(h, 0)
    if fault == "forward":
        r = (r * (1 + fault_scale * frng.standard_normal(r.shape))).astype(np.float32)
    apis.append(Api("Torch_relu_0_forward", {"input.0": h, "output.0": r}, [frame(12)]))
    y = (r @ w2.T).astype(np.float32)
    if fault == "nan":
        y = y.copy()
        y[0, 0] = np.nan
    apis.append(Api("Functional_linear_1_forward", {"input.0": r, "input.1": w2, "output.0": y}, [frame(13)]))
    e = np.exp(y - np.nanmax(y, axis=1, keepdims=True))
    p = (e / e.sum(axis=1, keepdims=True)).astype(np.float32)
    apis.append(Api("Functional_softmax_0_forward", {"input.0": y, "output.0": p}, [frame(14)]))
    d = (p - tgt).astype(np.float32)
    loss = np.array(np.mean(d * d), dtype=np.float32)
    apis.append(Api("Functional_mse_loss_0_forward", {"input.0": p, "input.1": tgt, "output.0": loss}, [frame(15)]))
    gp = (2 * d / d.size).astype(np.float32)
    apis.append(Api("Functional_mse_loss_0_backward", {"input.0": np.array(1.0, np.float32), "output.0": gp}, [frame(15)]))
    gy = (p * (gp - np.sum(gp * p, axis=1, keepdims=True))).astype(np.float32)
    apis.append(Api("Functional_softmax_0_backward", {"input.0": gp, "output.0": gy}, [frame(14)]))
    gr = (gy @ w2).astype(np.float32)
    gw2 = (gy.T @ r).astype(np.float32)
    apis.append(Api("Functional_linear_1_backward", {"input.0": gy, "output.0": gr, "output.1": gw2}, [frame(13)]))
    gh = (gr * (h > 0)).astype(np.float32)
    if fault == "backward":
        gh = (gh * (1 + fault_scale * frng.standard_normal(gh.shape))).astype(np.float32)
    apis.append(Api("Torch_relu_0_backward", {"input.0": gr, "output.0": gh}, [frame(12)]))
    gw1 = (gh.T @ x).astype(np.float32)
    gx = (gh @ w1).astype(np.float32)
    apis.append(Api("Functional_linear_0_backward", {"input.0": gh, "output.0": gx, "output.1": gw1}, [frame(10)]))
    apis.append(Api("Tensor_sub__0_forward", {"input.0": w1, "input.1": (0.1 * gw1).astype(np.float32),
                                              "output.0": (w1 - 0.1 * gw1).astype(np.float32)},
                    [frame(30, "step", "optim.py")], ctx="optimizer"))
    return apis
