"""Writing a dump: ``{mode}_dump.pkl`` lines and ``{mode}_dump/*.npy`` files of one rank and step.

:class:`RankWriter` owns the files. At its first write it *replaces an existing rank directory
atomically*: the old directory is renamed aside (``rank0.old-<pid>-<ns>``), a fresh one is created,
then the old one is deleted, so a dump never mixes files of two runs. Lines go out whole through
one ``os.write`` on an ``O_APPEND`` descriptor (one write per API forward, one per gradient), so a
SIGKILL leaves only complete lines; ``.npy`` files are written before the line naming them.

:class:`DumpSink` is the capture sink (``capture/sink.py``) that turns calls into records.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import threading
import time
import weakref
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from pytest_ptdbg.capture.call_spec import encode_call
from pytest_ptdbg.capture.select import Selector, filtered_out
from pytest_ptdbg.capture.sink import ApiCall, Sink, input_items, iter_tensors, outputs_of
from pytest_ptdbg.dump import records
from pytest_ptdbg.dump.stats import SHARED_CACHE, TensorStats, scalar_stats

__all__ = ["RankWriter", "DumpSink", "save_npy", "replace_dir"]

_Tensor = torch.Tensor
_NUMPY_DTYPES = frozenset((
    torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128, torch.bool,
    torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
))
_HEADERS: Dict[Tuple[str, Tuple[int, ...], bool], bytes] = {}


def replace_dir(path: str) -> None:
    """Make ``path`` a fresh empty directory; an existing one is renamed aside, then deleted."""
    if os.path.lexists(path):
        aside = f"{path}.old-{os.getpid()}-{time.monotonic_ns()}"
        os.rename(path, aside)
        os.makedirs(path)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.makedirs(path)


def _npy_header(arr: np.ndarray) -> bytes:
    key = (arr.dtype.str, arr.shape, bool(arr.flags.f_contiguous and not arr.flags.c_contiguous))
    h = _HEADERS.get(key)
    if h is None:
        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(buf, np.lib.format.header_data_from_array_1_0(arr))
        h = buf.getvalue()
        if len(_HEADERS) < 4096:
            _HEADERS[key] = h
    return h


def tensor_to_numpy(t: torch.Tensor) -> np.ndarray:
    """A C-contiguous CPU array of ``t`` (bf16 and other dtypes numpy lacks become float32)."""
    x = t.detach()
    if x.device.type != "cpu":
        x = x.cpu()
    if x.dtype not in _NUMPY_DTYPES:
        x = x.float() if x.is_floating_point() else x.to(torch.int64)
    if x.is_conj():
        x = x.resolve_conj()
    if x.is_neg():
        x = x.resolve_neg()
    if not x.is_contiguous():
        x = x.contiguous()
    return x.numpy()


def save_npy(path: str, t: torch.Tensor) -> None:
    """Write ``t`` as a ``.npy`` file (header + raw bytes, no pickle)."""
    arr = tensor_to_numpy(t)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, _npy_header(arr))
        mv = memoryview(arr).cast("B") if arr.size else b""
        while len(mv):
            n = os.write(fd, mv)
            mv = mv[n:]
    finally:
        os.close(fd)


class RankWriter:
    """The files of one rank in one step.

    The directory is prepared (an existing one replaced, see :func:`replace_dir`) in a background
    thread started by :meth:`prepare`, so that slow directory creation overlaps the training step;
    the first write waits for it. A step that wrote nothing leaves no directory behind.
    """

    def __init__(self, rank_dir: str, mode: str, with_data: bool) -> None:
        self.rank_dir = rank_dir
        self.pkl_path = os.path.join(rank_dir, records.pkl_name(mode))
        self.data_dir = os.path.join(rank_dir, records.data_dir_name(mode))
        self.with_data = with_data
        self._fd: Optional[int] = None
        self._prep: Optional[threading.Thread] = None
        self._prep_fd: Optional[int] = None
        self._prep_error: Optional[BaseException] = None
        self.bytes = 0
        self.npy_files = 0
        self.npy_bytes = 0
        self._saved: Dict[int, Tuple[Any, int, str]] = {}

    def _make(self) -> int:
        os.makedirs(os.path.dirname(self.rank_dir), exist_ok=True)
        replace_dir(self.rank_dir)
        if self.with_data:
            os.makedirs(self.data_dir, exist_ok=True)
        return os.open(self.pkl_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def _prepare_body(self) -> None:
        try:
            self._prep_fd = self._make()
        except BaseException as e:  # reported at the first write
            self._prep_error = e

    def prepare(self) -> None:
        """Start preparing the directory in the background (idempotent)."""
        if self._prep is None and self._fd is None:
            self._prep = threading.Thread(target=self._prepare_body, name="ptdbg-prepare", daemon=True)
            self._prep.start()

    def _open(self) -> int:
        if self._prep is not None:
            self._prep.join()
            self._prep = None
            if self._prep_error is not None:
                err, self._prep_error = self._prep_error, None
                raise err
            self._fd = self._prep_fd
        if self._fd is None:
            self._fd = self._make()
        return self._fd

    @property
    def opened(self) -> bool:
        return self._fd is not None and self.bytes > 0

    def write(self, text: str) -> None:
        """Append complete lines with a single ``os.write``."""
        fd = self._fd if self._fd is not None else self._open()
        data = text.encode("utf-8")
        n = os.write(fd, data)
        while n < len(data):  # pragma: no cover - regular files write fully
            n += os.write(fd, data[n:])
        self.bytes += len(data)

    def save(self, key: str, t: torch.Tensor, link: bool = True) -> str:
        """Save ``t`` as ``{key}.npy``; an unchanged tensor saved before becomes a hard link
        (unless ``link`` is False: data changed without a version bump)."""
        if self._fd is None:
            self._open()
        name = records.data_file_name(key)
        path = os.path.join(self.data_dir, name)
        e = self._saved.get(id(t)) if link else None
        if e is not None and e[0]() is t and e[1] == t._version:
            try:
                os.link(e[2], path)
                self.npy_files += 1
                return name
            except OSError:
                pass
        save_npy(path, t)
        self.npy_files += 1
        self.npy_bytes += t.numel() * (4 if t.dtype == torch.bfloat16 else t.element_size())
        if len(self._saved) > 4096:
            self._saved.clear()
        try:
            self._saved[id(t)] = (weakref.ref(t), t._version, path)
        except TypeError:
            pass
        return name

    def close(self) -> None:
        """Close the files; a directory prepared but never written to is removed again."""
        if self._prep is not None or self._fd is not None:
            try:
                self._open()
            except OSError:
                pass
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            if self.bytes == 0 and self.npy_files == 0:
                _remove_empty(self.rank_dir, self.pkl_path, self.data_dir)
        self._saved.clear()


def _remove_empty(rank_dir: str, pkl: str, data_dir: str) -> None:
    try:
        if os.path.getsize(pkl) == 0:
            os.unlink(pkl)
        if os.path.isdir(data_dir) and not os.listdir(data_dir):
            os.rmdir(data_dir)
        os.rmdir(rank_dir)
        os.rmdir(os.path.dirname(rank_dir))  # the step directory, when no other rank is there
    except OSError:
        pass


def _num(v: Any) -> str:
    """A number as ``json.dumps`` writes it (NaN/Infinity included)."""
    if v is True:
        return "true"
    if v is False:
        return "false"
    if type(v) is int:
        return str(v)
    if v != v:
        return "NaN"
    if v == _INF:
        return "Infinity"
    if v == -_INF:
        return "-Infinity"
    return repr(float(v))


_INF = float("inf")


def record_line(key: str, st: TensorStats, rg: Optional[bool], ctx: str, npy: Optional[str],
                spec: Optional[dict]) -> str:
    """One tensor record line, identical to ``records.encode_line(records.tensor_record(...))``
    (names, dtypes and file names never need JSON escapes; the call spec goes through json)."""
    parts = [f'"nan": {st.nan}, "inf": {st.inf}']
    if rg is not None:
        parts.append('"rg": true' if rg else '"rg": false')
    if ctx:
        parts.append(f'"ctx": "{ctx}"')
    if npy is not None:
        parts.append(f'"npy": "{npy}"')
    if spec is not None:
        parts.append('"call": ' + json.dumps(spec, separators=(", ", ": ")))
    stats = str(st.stats)  # Python's repr of finite floats and ints is JSON's
    if "n" in stats or "T" in stats or "F" in stats:  # nan, inf, True, False
        stats = "[" + ", ".join([_num(v) for v in st.stats]) + "]"
    return f'["{key}", 0, [], "{st.dtype}", {list(st.shape)}, {stats}, {{{", ".join(parts)}}}]\n'


#: API types whose in-place writes bypass autograd's version counter
_OPAQUE_TYPES = ("Distributed", "NPU")
#: backward lines are written in batches of at most this many (and before any forward line)
_PENDING_MAX = 16


class DumpSink(Sink):
    """Records calls as ptdbg v4 lines (and ``.npy`` files unless ``summary_only``)."""

    def __init__(self, config: Any, rank_dir: str) -> None:
        self.config = config
        self.rank_dir = rank_dir
        self.with_stack = config.with_stack
        self.with_tensors = config.with_tensors
        self.save_data = not config.summary_only and self.with_tensors
        self.filter_on = config.filter_switch == "ON"
        self.selector = Selector(config.mode, config.scope, config.api_list, config.input_output_mode)
        self.writer = RankWriter(rank_dir, config.mode, self.save_data)
        self.cache = SHARED_CACHE
        self.wants_backward = self.with_tensors and (
            self.selector.keep_all_io or bool({"backward", "input", "output"} & set(self.selector.io))
        )
        self.apis_forward = 0
        self.apis_backward = 0
        self._bw_started: set = set()
        self._stack_json: dict = {}
        self._pending: List[str] = []  # backward lines not yet written (see on_backward)
        self.writer.prepare()

    # -- records ---------------------------------------------------------------------------
    def _records(self, api: str, io: str, items: list, ctx: str, lines: list, spec: Optional[dict],
                 fresh: bool = False) -> Optional[dict]:
        """Append the lines of ``items`` (an index-ordered list) to ``lines``; returns the unused spec."""
        save = self.save_data
        filt = self.filter_on
        cache = self.cache
        for idx, v in iter_tensors(items):
            if isinstance(v, _Tensor):
                if filt and filtered_out(v):
                    continue
                st = cache.fresh(v) if fresh else cache.stats(v)
            else:
                if filt:
                    continue
                st = scalar_stats(v)
                if st is None:
                    continue
            key = f"{api}_{io}.{idx[0]}" if len(idx) == 1 else records.tensor_key(api, io, idx)
            is_t = isinstance(v, _Tensor)
            npy = self.writer.save(key, v, not fresh) if save and is_t else None
            lines.append(record_line(key, st, v.requires_grad if is_t else None, ctx, npy, spec))
            spec = None
        return spec

    # -- sink protocol -----------------------------------------------------------------------
    def start_call(self, call: ApiCall) -> bool:
        fwd, bwd = self.selector.directions(call)
        if not (fwd or bwd):
            return False
        call.state[self] = (fwd, bwd, [])
        if fwd and self.with_tensors and self.selector.keep_io("forward", "input"):
            spec = None
            try:
                spec = encode_call(call.args, call.kwargs)
            except Exception as e:  # pragma: no cover - never let the spec break a run
                spec = {"repr": f"unencodable call: {e}"}
            lines: list = call.state[self][2]
            spec = self._records(call.forward_key, "input", input_items(call.args, call.kwargs), call.ctx, lines, spec)
            call.state[self] = (fwd, bwd, lines, spec)
        elif fwd and self.with_tensors:
            try:
                spec = encode_call(call.args, call.kwargs)
            except Exception as e:  # pragma: no cover
                spec = {"repr": f"unencodable call: {e}"}
            call.state[self] = (fwd, bwd, [], spec)
        if fwd and self.with_stack:
            call.stack  # extract now, while the frames are live
        return True

    def end_call(self, call: ApiCall) -> None:
        st = call.state.get(self)
        if st is None:
            return
        fwd = st[0]
        if not fwd:
            if self.with_stack:
                call.stack
            return
        lines = st[2]
        spec = st[3] if len(st) > 3 else None
        api = call.forward_key
        if self.with_tensors and self.selector.keep_io("forward", "output"):
            out = call.output
            fresh = call.api_type in _OPAQUE_TYPES  # they write tensors without a version bump
            if call.inplace and not _has_tensor(out) and call.args:
                out = call.args[0]  # in-place collectives and the like return None/Work
            self._records(api, "output", outputs_of(out), call.ctx, lines, spec, fresh)
        if self.with_stack:
            lines.append(self._stack_line(api, call.stack))
        if lines:
            if self._pending:
                lines[:0] = self._pending
                self._pending = []
            self.writer.write("".join(lines))
            self.apis_forward += 1
        if not st[1]:
            del call.state[self]

    def on_backward(self, call: ApiCall, io: str, index: Tuple[int, ...], grad: Any) -> None:
        st = call.state.get(self)
        if st is None or not st[1] or not self.selector.keep_io("backward", io):
            return
        if self.filter_on and filtered_out(grad):
            return
        api = call.backward_key
        s = self.cache.stats(grad)
        key = records.tensor_key(api, io, index)
        npy = self.writer.save(key, grad) if self.save_data else None
        line = record_line(key, s, None, call.ctx, npy, None)
        first = call.seq not in self._bw_started
        if first:
            self._bw_started.add(call.seq)
            self.apis_backward += 1
            if self.with_stack and call._stack is not None:
                line += self._stack_line(api, call._stack)
        pending = self._pending
        pending.append(line)
        if len(pending) >= _PENDING_MAX:
            self._write_pending()

    def _write_pending(self) -> None:
        if self._pending:
            text = "".join(self._pending)
            self._pending = []
            self.writer.write(text)

    def _stack_line(self, api: str, frames: list) -> str:
        """The stack record line; the frames' JSON is cached (``extract_stack`` shares lists)."""
        enc = self._stack_json.get(id(frames))
        if enc is None or enc[0] is not frames:
            enc = (frames, json.dumps(frames, separators=(", ", ": ")))
            if len(self._stack_json) > 20000:
                self._stack_json.clear()
            self._stack_json[id(frames)] = enc
        return f'["{records.stack_key(api)}", {enc[1]}]\n'

    def flush(self) -> None:
        self._write_pending()

    def close(self) -> None:
        self._write_pending()
        self.writer.close()
        self._bw_started.clear()


def _has_tensor(v: Any) -> bool:
    if isinstance(v, _Tensor):
        return True
    if isinstance(v, (list, tuple)):
        return any(_has_tensor(x) for x in v)
    return False
