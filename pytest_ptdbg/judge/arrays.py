"""The saved tensors of one judgement: each file read once, shared by the calls that use it.

A dump writes a tensor once and hard-links it where the same data is the output of one call and
the input of the next (the reader records each file's inode, ``TensorRec.data_inode``), and the
judge visits the calls in execution order, so the same file is asked for by neighbouring calls.
:class:`ArrayStore` keeps the arrays it has read, keyed by the data folder, the inode and the
record's shape and dtype (a record that names the file with another shape or dtype is read and
checked on its own), bounded in bytes (least recently used first out). Arrays are handed out
shared: callers never write into them (replays run on copies).

:func:`read_npy` reads one ``.npy`` with a single open: :class:`~pytest_ptdbg.dump.npy.NpyStream`
checks that it is a regular file, parses and checks its header against the record (shape, dtype
kind, no object arrays: nothing is ever unpickled) and its size before anything is allocated, then
the data is read straight into the array.
"""
from __future__ import annotations

import math
import os
from collections import OrderedDict
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

from pytest_ptdbg.dump.npy import NpyStream

__all__ = ["ArrayStore", "read_npy", "MAX_BYTES"]

#: arrays kept between calls, in bytes
MAX_BYTES = 512 << 20


def read_npy(path: str, name: str = "", rec_shape: Optional[Sequence[int]] = None,
             rec_dtype: Optional[str] = None) -> np.ndarray:
    """The array of one ``.npy`` (C order), checked against its record; ValueError/OSError naming
    the file and the record when it is not a regular file, not a valid header, not the record's
    shape or dtype kind, an object array, or cut short."""
    with NpyStream(path, name, rec_shape, rec_dtype) as s:
        out = np.empty(s.size, dtype=s.dtype)
        got = s.read_into(out)
        if got != s.size:
            raise ValueError(f"{path}: truncated .npy data for record {name!r} ({got} of {s.size} elements)")
    return out.reshape(s.shape)


class ArrayStore:
    """Arrays of saved tensors, read once per file (see the module docstring)."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._kept: "OrderedDict[Tuple[Any, ...], np.ndarray]" = OrderedDict()
        self._bytes = 0
        self.reads = 0
        self.hits = 0
        #: per file (:meth:`file_id`): its exact ``budget.rms``, and proven upper bounds of it
        self.rms: Dict[Tuple[str, int], float] = {}
        self.rms_upper: Dict[Tuple[str, int], float] = {}

    @staticmethod
    def file_id(path: str, inode: int) -> Optional[Tuple[str, int]]:
        """What identifies a file's data across the records naming it (None: unknown inode)."""
        return (os.path.dirname(path), inode) if inode else None

    def bound(self, fid: Optional[Tuple[str, int]], upper: Optional[float]) -> None:
        """Note an upper bound of the RMS of file ``fid`` (the smallest is kept)."""
        if fid is not None and upper is not None and upper < self.rms_upper.get(fid, math.inf):
            self.rms_upper[fid] = upper

    def load(self, path: str, name: str, shape: Sequence[int], dtype: str, inode: int = 0) -> np.ndarray:
        """The array of ``path`` for record ``name`` (its recorded ``shape`` and ``dtype``);
        ``inode``: the file's (0: unknown, not shared)."""
        key = (os.path.dirname(path), inode, tuple(shape), dtype) if inode else None  # see file_id
        if key is not None:
            hit = self._kept.get(key)
            if hit is not None:
                self._kept.move_to_end(key)
                self.hits += 1
                return hit
        arr = read_npy(path, name, shape, dtype)
        self.reads += 1
        if key is not None and arr.nbytes <= self.max_bytes:
            self._kept[key] = arr
            self._bytes += arr.nbytes
            while self._bytes > self.max_bytes:
                _, old = self._kept.popitem(last=False)
                self._bytes -= old.nbytes
        return arr
