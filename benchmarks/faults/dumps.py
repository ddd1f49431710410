"""Dumping one training step of an architecture, and finding where two dumps first part.

``dump_step`` runs ``archs.train_step`` under ``PrecisionDebugger`` (mode ``api_stack``, full
tensors) for one device setting (:class:`Device`) with at most one planted fault.
``first_divergence`` reads two dumps' ``.pkl`` record lines (the documented text format: one JSON
array per line) in order and names the first tensor record that differs in key, dtype, shape,
statistics or saved data: run on a faulty and a clean dump of the same device setting it names
the API the fault landed on, since both runs are identical up to there.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Tuple

import numpy as np
import torch

from pytest_ptdbg import PrecisionDebugger
from pytest_ptdbg.format import records

from benchmarks.faults import archs, spellings

__all__ = ["Device", "DEVICES", "dump_step", "pkl_path", "data_dir", "read_records",
           "first_divergence", "divergences", "Divergence", "split_key"]


@dataclass(frozen=True)
class Device:
    """A device setting: CPU autocast dtype (None: float32), relative weight noise, and the
    spelling of the device's calls (``""``: the bench's; else a key of ``spellings.SPELLINGS``:
    the same computation, spelled otherwise), and the AdamW's (``""``: one call per parameter
    and operation, as the bench; ``"fused"``, ``"foreach"``: multi-tensor kernels)."""

    name: str
    autocast: Optional[torch.dtype] = None
    noise: float = 0.0
    spelling: str = ""
    optimizer: str = ""


_BASE = [
    Device("fp32", None, 1e-6),     # a device's own rounding, as relative noise on every weight
    Device("bf16", torch.bfloat16),
    Device("fp16", torch.float16),
    Device("same", None, 0.0),      # an identical run
]
#: every base setting also respelled: ``"fp32+kw"`` is fp32 with keyword arguments
DEVICES = {d.name: d for d in _BASE + [Device(f"{b.name}+{sp}", b.autocast, b.noise, sp)
                                        for b in _BASE for sp in spellings.SPELLINGS]}
#: ... and with a fused or foreach AdamW: ``"fp32@fused"``, ``"bf16@foreach"``
DEVICES.update({f"{b.name}@{o}": Device(f"{b.name}@{o}", b.autocast, b.noise, "", o)
                for b in _BASE for o in ("fused", "foreach")})


def pkl_path(dump: str) -> str:
    return records.pkl_path(dump)


def data_dir(dump: str) -> str:
    return records.data_path(dump)


def _add_noise(model: torch.nn.Module, noise: float) -> None:
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1 + noise * torch.randn(p.shape, generator=g))


def dump_step(arch: str, out: str, device: Device, plant: Any = None, summary_only: bool = False) -> None:
    """Dump one training step of ``arch`` on ``device`` into ``out`` (replaced), with ``plant``.

    ``plant`` (or None) has ``layer`` (``"below"``/``"user"``) and ``mode()``, a context manager:
    below-capture modes go under the debugger's, user-code modes over it. A respelled device
    (``device.spelling``) runs under ``spellings.Respell`` between the two: over the debugger's
    mode, under a user-code fault's.
    """
    shutil.rmtree(out, ignore_errors=True)
    model, batch = archs.fresh(arch)
    if device.noise:
        _add_noise(model, device.noise)
    loss_fn = archs.ARCHS[arch].loss
    dbg = PrecisionDebugger(dump_path=out, hook_name="dump", step=[0])
    dbg.configure_hook(mode="api_stack", summary_only=summary_only)
    below = plant.mode if plant is not None and plant.layer == "below" else None
    user = plant.mode if plant is not None and plant.layer == "user" else None
    torch.manual_seed(0)  # same dropout masks on every run
    if below is not None:
        below.__enter__()
    try:
        dbg.start()
        try:
            # the respelling over the debugger's mode, a user-code fault over both
            with (spellings.Respell(device.spelling) if device.spelling else contextlib.nullcontext()):
                if user is not None:
                    with user:
                        archs.train_step(model, batch, loss_fn, device.autocast, device.optimizer)
                else:
                    archs.train_step(model, batch, loss_fn, device.autocast, device.optimizer)
        finally:
            dbg.stop()
            dbg.step()
    finally:
        if below is not None:
            below.__exit__(None, None, None)


_KEY = re.compile(r"^(.*)_(forward|backward)_(input|output)\.(.+)$")


def split_key(key: str) -> Tuple[str, str, str]:
    """``"Functional_linear_1_forward_output.0"`` -> ``("Functional_linear_1", "forward", "output")``."""
    m = _KEY.match(key)
    if not m:
        return key, "", ""
    return m.group(1), m.group(2), m.group(3)


def read_records(dump: str) -> List[list]:
    """The tensor records of a dump's ``.pkl``, in file order (stack records left out)."""
    recs = []
    with open(pkl_path(dump), encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            if isinstance(r, list) and len(r) >= 6 and isinstance(r[0], str) and not r[0].endswith("_stack_info"):
                recs.append(r)
    return recs


def _data(dump: str, rec: list) -> Optional[np.ndarray]:
    extra = rec[6] if len(rec) > 6 and isinstance(rec[6], dict) else {}
    name = extra.get("npy")
    if not name:
        return None
    return np.load(os.path.join(data_dir(dump), name), allow_pickle=False)


def _same(a_dump: str, a: list, b_dump: str, b: list) -> bool:
    if a[0] != b[0] or a[3] != b[3] or list(a[4]) != list(b[4]):
        return False
    if json.dumps(a[5]) != json.dumps(b[5]):
        return False
    x, y = _data(a_dump, a), _data(b_dump, b)
    if x is None or y is None:
        return x is None and y is None
    return x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y, equal_nan=x.dtype.kind == "f")


@dataclass
class Divergence:
    """The first record where a dump parts from another."""

    key: str
    api: str
    direction: str
    io: str
    line: int
    inserted: bool  # the other dump holds a different call (key) at this place: the call sequence changed


def divergences(dump: str, other: str) -> Iterator[Divergence]:
    """Every tensor record of ``dump`` that differs from ``other``'s record at the same place
    (records past the end of ``other`` included), in file order."""
    recs, base = read_records(dump), read_records(other)
    for i, r in enumerate(recs):
        if i < len(base) and _same(dump, r, other, base[i]):
            continue
        api, direction, io = split_key(r[0])
        yield Divergence(r[0], api, direction, io, i, i >= len(base) or base[i][0] != r[0])


def first_divergence(dump: str, other: str) -> Optional[Divergence]:
    """The first tensor record of ``dump`` that differs from ``other``'s record at that place
    (None: the dumps agree record for record, bit for bit, as far as ``dump`` goes)."""
    return next(divergences(dump, other), None)
