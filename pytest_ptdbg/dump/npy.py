"""Safe reading of saved tensors (``.npy``; msprobe's ``.pt`` lazily) for the compare path.

No pickle is ever executed: ``.npy`` files are read with ``allow_pickle=False`` (object arrays are
refused) and ``.pt`` files with ``torch.load(weights_only=True)``; torch is imported only for ``.pt``.
Paths are built with :func:`records.safe_data_path`, so a record name cannot leave the data directory.

:class:`NpyStream` reads an ``.npy`` file chunk by chunk into a caller's buffer, so that comparing two
tensors never needs them whole in memory (the metric kernels consume chunks).
"""
from __future__ import annotations

import io
import math
import os
import re
import stat
from typing import IO, Any, Optional, Sequence, Tuple

import numpy as np

from pytest_ptdbg.format import records

#: dtype kinds a record dtype may be stored as (bf16 is saved as float32; the record is authoritative)
_KINDS = {"f": "fc", "c": "c", "i": "iu", "u": "iu", "b": "b"}


def record_dtype_kind(dtype: str) -> str:
    """numpy kind letter (``"f"``, ``"i"``, ``"u"``, ``"b"``, ``"c"``) for a record dtype such as
    ``"torch.bfloat16"``."""
    d = (dtype or "").replace("torch.", "")
    if d.startswith("<class '") and d.endswith("'>"):   # ptdbg v4's Python scalars: "<class 'int'>"
        d = d[len("<class '"):-2]
    if d == "int":
        return "i"
    if d in ("bool",):
        return "b"
    if d.startswith("complex"):
        return "c"
    if d.startswith("uint"):
        return "u"
    if d.startswith("int") or d == "long" or d == "short":
        return "i"
    return "f"


def data_path(data_dir: str, key_or_file: str) -> str:
    """Path of a tensor's data file inside ``data_dir`` (``key`` or ``key.npy``); never outside it."""
    key = key_or_file[:-4] if key_or_file.endswith(".npy") else key_or_file
    return records.safe_data_path(data_dir, key)


def open_regular(path: str, name: str = "") -> io.BufferedReader:
    """Open a data file for binary reading only when it is a regular file.

    Opened non-blocking and checked with ``fstat``, so a FIFO in place of a file is refused at once
    instead of hanging; raises FileNotFoundError / ValueError naming the file and the record.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: data file of record {name!r} not found") from None
    except OSError as e:
        raise ValueError(f"{path}: cannot open data file of record {name!r} ({e.strerror})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path}: data file of record {name!r} is not a regular file (FIFO, device "
                             "or socket): not read")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _check(path: str, name: str, shape: Sequence[int], kind: str, rec_shape: Optional[Sequence[int]],
           rec_dtype: Optional[str]) -> None:
    if rec_shape is not None and tuple(int(s) for s in rec_shape) != tuple(shape):
        raise ValueError(
            f"{path}: shape {list(shape)} does not match record {name!r} shape {list(rec_shape)}"
        )
    if rec_dtype:
        want = record_dtype_kind(rec_dtype)
        if kind not in _KINDS.get(want, want):
            raise ValueError(f"{path}: dtype kind {kind!r} does not match record {name!r} dtype {rec_dtype}")


_HEADER = re.compile(
    r"^\{'descr': '(?P<descr>[<>|=]?[a-zA-Z]\d*)', 'fortran_order': (?P<fo>True|False), "
    r"'shape': \((?P<shape>[\d, ]*)\), \}\s*$")


def _read_header(f: IO[bytes], path: str) -> Tuple[Tuple[int, ...], bool, np.dtype]:
    """(shape, fortran_order, dtype) of an open ``.npy``; numpy's own parser for unusual headers."""
    head = f.read(12)
    if len(head) >= 10 and head[:6] == b"\x93NUMPY" and head[6] in (1, 2, 3):
        if head[6] == 1:
            hlen, start = int.from_bytes(head[8:10], "little"), 10
        else:
            hlen, start = int.from_bytes(head[8:12], "little"), 12
        text = (head[start:] + f.read(hlen - (len(head) - start))).decode("latin1")
        m = _HEADER.match(text)
        if m:
            shape = tuple(int(v) for v in m.group("shape").replace(" ", "").split(",") if v)
            return shape, m.group("fo") == "True", np.dtype(m.group("descr"))
    f.seek(0)
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(f)
    if version in ((2, 0), (3, 0)):
        return np.lib.format.read_array_header_2_0(f)
    raise ValueError(f"unsupported .npy version {version}")  # pragma: no cover


class NpyStream:
    """Sequential reader of a C-ordered ``.npy`` file; checks the header against the record.

    ``read_into(buf)`` fills ``buf`` (same dtype as the file) with the next elements and returns
    how many were read. Fortran-ordered files are loaded whole and served from memory.
    """

    def __init__(self, path: str, name: str = "", rec_shape: Optional[Sequence[int]] = None,
                 rec_dtype: Optional[str] = None) -> None:
        self.path = path
        self._arr: Optional[np.ndarray] = None   # the data, read at once (Fortran order)
        f = open_regular(path, name)
        try:
            shape, fortran, dtype = _read_header(f, path)
        except (ValueError, TypeError, SyntaxError, MemoryError, OverflowError) as e:
            f.close()
            raise ValueError(f"{path}: not a valid .npy file for record {name!r} ({e})") from None
        except Exception:
            f.close()
            raise
        if dtype.hasobject:
            f.close()
            raise ValueError(f"{path}: object arrays are refused (record {name!r}); data files are never unpickled")
        self.dtype = dtype
        self.shape = tuple(shape)
        self.size = math.prod(int(v) for v in self.shape)   # Python ints: (2**32, 2**32) is not 0
        try:
            _check(path, name, self.shape, dtype.kind, rec_shape, rec_dtype)
        except ValueError:
            f.close()
            raise
        self._f: Optional[io.BufferedReader] = f
        self._pos = 0
        start = f.tell()
        end = os.fstat(f.fileno()).st_size
        want = self.size * dtype.itemsize
        if end - start != want:   # checked before anything is allocated
            f.close()
            raise ValueError(
                f"{path}: {'truncated' if end - start < want else 'unreadable'} .npy for record {name!r} "
                f"({end - start} bytes of data, its header's shape {list(self.shape)} of {dtype.str} "
                f"is {want} bytes)")
        if fortran and len(self.shape) > 1:
            try:
                f.seek(start)
                flat = np.fromfile(f, dtype=dtype, count=self.size)
                self._arr = np.ascontiguousarray(flat.reshape(self.shape[::-1]).T).reshape(-1)
            finally:
                f.close()
                self._f = None

    def read_into(self, buf: np.ndarray) -> int:
        """Fill ``buf`` (1-D, dtype == self.dtype) with the next elements; returns the count."""
        k = min(len(buf), self.size - self._pos)
        if k <= 0:
            return 0
        if self._arr is not None:
            buf[:k] = self._arr[self._pos:self._pos + k]
        else:
            assert self._f is not None, f"{self.path}: read after close"
            mv = buf[:k].data.cast("B")
            got = self._f.readinto(mv)
            if got != k * self.dtype.itemsize:
                raise ValueError(f"{self.path}: truncated .npy data")
        self._pos += k
        return k

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def __enter__(self) -> "NpyStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def load_npy(path: str, name: str = "", rec_shape: Optional[Sequence[int]] = None, rec_dtype: Optional[str] = None,
             mmap: bool = False) -> np.ndarray:
    """Load a whole ``.npy`` safely (no pickle), optionally memory-mapped, checked against the record."""
    with NpyStream(path, name, rec_shape, rec_dtype):   # regular file, header and size checked first
        pass
    try:
        arr = np.load(path, allow_pickle=False, mmap_mode="r" if mmap else None)
    except (ValueError, OSError, MemoryError) as e:
        raise ValueError(f"{path}: cannot read data of record {name!r} ({e})") from None
    _check(path, name, arr.shape, arr.dtype.kind, rec_shape, rec_dtype)
    return arr


def load_pt(path: str, name: str = "", rec_shape: Optional[Sequence[int]] = None,
            rec_dtype: Optional[str] = None) -> np.ndarray:
    """Load an msprobe ``.pt`` tensor (``torch.load(weights_only=True)``, torch imported here only)."""
    open_regular(path, name).close()
    import torch  # deferred: only msprobe tensor dumps need it

    try:
        t = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - report any unreadable file by name
        raise ValueError(f"{path}: cannot read data of record {name!r} ({type(e).__name__}: {e})") from None
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{path}: record {name!r} holds {type(t).__name__}, not a tensor")
    t = t.detach().cpu()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.float()
    arr = t.numpy()
    _check(path, name, arr.shape, arr.dtype.kind, rec_shape, rec_dtype)
    return arr
