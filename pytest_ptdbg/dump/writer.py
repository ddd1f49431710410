"""Writing a dump: ``{mode}_dump.pkl`` lines and ``{mode}_dump/*.npy`` files of one rank and step.

:class:`RankWriter` owns the files. When a step writes its first record it *replaces an existing
rank directory atomically*: the old directory is renamed aside (``rank0.old-<pid>-<ns>``), a fresh
one is created, then the old one is deleted, so a dump never mixes files of two runs, and a step
this run never records is never touched. This runs on a background thread (directory creation is
slow on some filesystems); lines produced meanwhile wait in memory.
Lines go out whole through one ``os.write`` on an ``O_APPEND`` descriptor, in batches (see
:class:`DumpSink`: every :data:`QUEUE_MAX` records, before every ``Distributed``/``NPU`` call, so a
hang in a collective leaves what came before it on disk, and at ``stop()``/``step()``). A SIGKILL
leaves complete lines and loses at most the batch in memory.
Full-tensor dumps use :class:`AsyncRankWriter`: tensor snapshots and lines are written in order
by one I/O thread, so every line on disk names ``.npy`` files that exist and are whole.
At every ``stop()`` and at the end of the step, once all of it is on disk, the writer writes the
completeness manifest (``format/manifest.py``). A write error never reaches the user's code: the
dump stops, one warning is issued, and the manifest says ``complete: false`` (see RankWriter).

:class:`DumpSink` is the capture sink (``capture/sink.py``) that turns calls into records.
"""
from __future__ import annotations

import collections
import errno
import io
import json
import logging
import os
import shutil
import threading
import time
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

import numpy as np
import torch

from pytest_ptdbg.capture.isolation import isolated
from pytest_ptdbg.capture.sink import ApiCall, Sink, iter_tensors, report_internal_error
from pytest_ptdbg.dump.call_spec import call_json, first_tensor, math_modes, number_sequence, sequence_tensor
from pytest_ptdbg.dump.select import Selector, filtered_out
from pytest_ptdbg.format import manifest, records
from pytest_ptdbg.runtime.environment import arithmetic_environment
from pytest_ptdbg.runtime.reduced_fp32 import FP32_APIS
from pytest_ptdbg.dump.stats import (BATCH_DTYPES, SHARED_CACHE, TensorStats, batch_stat_columns, dtype_name,
                                     scalar_stats, tensor_stats)

if TYPE_CHECKING:  # pragma: no cover
    from pytest_ptdbg.runtime.config import DebugConfig

__all__ = ["RankWriter", "AsyncRankWriter", "DumpSink", "save_npy", "replace_dir"]

_Tensor = torch.Tensor
_NUMPY_DTYPES = frozenset((
    torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128, torch.bool,
    torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
))
_HEADERS: Dict[Tuple[str, Tuple[int, ...], bool], bytes] = {}
_LOG = logging.getLogger("pytest_ptdbg")
#: a call spec as a record carries it: its JSON text (``call_spec.encode_call_json``), a dict, or none
_Spec = Optional[Union[str, Dict[str, Any]]]


_BG: Any = None
_BG_LOCK = threading.Lock()


def _background() -> Any:
    """One background worker per process for directory preparation (slow on some filesystems)."""
    global _BG
    if _BG is None:
        with _BG_LOCK:
            if _BG is None:
                from concurrent.futures import ThreadPoolExecutor

                _BG = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ptdbg-prepare")
    return _BG


#: flags of a directory descriptor (None where ``os.open`` cannot take ``dir_fd``: Windows)
_DIR_FLAGS = (os.O_RDONLY | os.O_DIRECTORY) if (hasattr(os, "O_DIRECTORY") and os.open in os.supports_dir_fd) \
    else None


def replace_dir(path: str) -> None:
    """Make ``path`` a fresh empty directory; an existing one is renamed aside, then deleted
    (deleted even when the new directory cannot be made: old files never pass for new ones).

    A real directory is first marked (``manifest.ASIDE_MARKER``): a run killed before the deletion
    leaves ``rank0.old-<pid>-<ns>``, which the next writer of that rank removes (``lock.py``) and
    ``compare --distributed`` skips, because it carries the mark."""
    if os.path.lexists(path):
        aside = f"{path}.old-{os.getpid()}-{time.monotonic_ns()}"
        if not os.path.islink(path) and os.path.isdir(path):
            try:
                os.close(os.open(os.path.join(path, manifest.ASIDE_MARKER),
                                 os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644))
            except OSError:
                pass  # unmarked: a leftover is then named by compare, never deleted
        os.rename(path, aside)
        try:
            os.makedirs(path)
        finally:
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
    _write_npy_array(path, tensor_to_numpy(t))


_NOT_CLOSED = ("not closed by stop() or step(): the run ended or was killed while the dump was being "
               "written")
#: dump roots (``dump_path``) whose failure was already reported in this process: one warning each
_WARNED: set = set()


def _describe(exc: BaseException, path: Optional[str]) -> str:
    """``write error on <path>: [Errno 28] No space left on device`` (the manifest's ``reason``)."""
    if isinstance(exc, OSError):
        code = errno.errorcode.get(exc.errno or 0, "")
        what = f"[Errno {exc.errno}{' ' + code if code else ''}] {exc.strerror or exc}"
        where = exc.filename or path
    else:
        what = f"{type(exc).__name__}: {exc}"
        where = path
    return f"write error on {where}: {what}" if where else f"write error: {what}"


def _warn_once(root: str, message: str) -> None:
    """One warning per dump path and process; never raises (even under ``-W error``)."""
    if root in _WARNED:
        return
    _WARNED.add(root)
    try:
        warnings.warn(message, RuntimeWarning, stacklevel=2)
    except Exception:
        _LOG.warning(message)


def _write_all(fd: int, data: Union[bytes, memoryview]) -> int:
    """Write ``data`` fully; on an error raise it with ``written`` (bytes that did go out) attached."""
    view = memoryview(data)
    done = 0
    try:
        while done < len(data):
            done += os.write(fd, view[done:])
    except OSError as e:
        e.written = done  # type: ignore[attr-defined]
        raise
    return done


#: (api type, api name) -> the float32 family a backend flag sets the precision of (matmul, conv, rnn)
_FP32_FAMILY = {k: v[0] for k, v in FP32_APIS.items()}

#: records left out that a manifest names (all are counted)
LEFT_OUT_NAMED = 100


class RankWriter:
    """The files of one rank in one step.

    Nothing on disk is touched before the first record: the first :meth:`write` or :meth:`save`
    replaces an existing rank directory (see :func:`replace_dir`) in a background thread (slow on
    some filesystems; lines wait in memory meanwhile), so a step that records nothing leaves an
    earlier run's files alone. :meth:`flush` (``stop()``) and :meth:`close` (end of the step) write
    the completeness manifest (``format/manifest.py``) once every line and file is on disk.

    No method raises: the first write error (full disk, permission, vanished directory, anything
    else) stops this step's dump, removes a stale manifest, truncates a half-written line, warns
    once per dump path and process, and the manifest then says ``complete: false`` with the reason.
    ``failure`` holds that reason (None while all is well).
    """

    def __init__(self, rank_dir: str, mode: str, with_data: bool) -> None:
        self.rank_dir = rank_dir
        self.pkl_path = os.path.join(rank_dir, records.pkl_name(mode))
        self.data_dir = os.path.join(rank_dir, records.data_dir_name(mode))
        self.with_data = with_data
        self._fd: Optional[int] = None
        self._prep: Any = None  # a Future of the pkl's file descriptor
        self._early: List[str] = []
        self.bytes = 0  # bytes of the .pkl on disk (the file starts empty)
        self.lines = 0  # complete lines of the .pkl on disk
        self.npy_files = 0
        self.npy_bytes = 0
        self._saved: Dict[int, Tuple[Any, int, str]] = {}
        self.failure: Optional[str] = None
        self._active = False  # the rank directory is (being) replaced: this step writes into it
        self._reported = False
        self._manifest_state: Any = None  # (lines, reason) the manifest on disk says
        #: records the sink had to leave out while the dump went on (``record name: why``, the
        #: first :data:`LEFT_OUT_NAMED`; ``left_out_count`` counts all): the manifest then says
        #: incomplete, naming them, so compare never passes without them
        self.left_out: List[str] = []
        self.left_out_count = 0
        #: the run's arithmetic environment, written into the manifest (``runtime/environment.py``)
        self.environment: Optional[Dict[str, Any]] = None
        #: the rank directory, held open: the manifest is written into it wherever it is now
        self._dir_fd: Optional[int] = None
        #: (st_dev, st_ino) of the rank directory, the data directory and the .pkl as made
        self._idents: List[Tuple[str, str, Tuple[int, int]]] = []

    # -- failures ---------------------------------------------------------------------------
    def leave_out(self, what: str) -> None:
        """A record the dump goes on without (``name: why``): the manifest will say incomplete."""
        self.left_out_count += 1
        if len(self.left_out) < LEFT_OUT_NAMED:
            self.left_out.append(what)

    def _fail(self, exc: BaseException, path: Optional[str] = None) -> None:
        """Stop the dump (any thread). The manifest says so at once, rewritten in place (a full
        disk has no room for a new file, but the truncated old one frees its own); if even that
        fails it is deleted, so that no earlier ``complete: true`` vouches for what is on disk."""
        if self.failure is not None:
            return
        self._stop_with(_describe(exc, path))

    def _stop_with(self, reason: str) -> None:
        """:meth:`_fail` with the manifest's ``reason`` given (written through the directory
        descriptor when there is one: into the dump's folder, even a moved one)."""
        if self.failure is not None:
            return
        self.failure = reason
        mpath = manifest.manifest_path(self.pkl_path)
        dfd = self._dir_fd
        name = os.path.basename(mpath) if dfd is not None else mpath
        text = manifest.manifest_text(os.path.basename(self.pkl_path), self.lines, False, self.failure,
                                      self.environment)
        try:
            fd = os.open(name, os.O_WRONLY | os.O_TRUNC, dir_fd=dfd)  # only the existing one
            try:
                _write_all(fd, text.encode())
            finally:
                os.close(fd)
        except OSError:
            try:
                os.unlink(name, dir_fd=dfd)
            except OSError:
                pass

    def _moved(self) -> Optional[str]:
        """Why the files are no longer where the dump says (its rank directory, data directory or
        ``.pkl`` moved, renamed or removed since they were made), or None."""
        for what, path, ident in self._idents:
            try:
                st = os.stat(path)
                now = (st.st_dev, st.st_ino)
            except OSError:
                now = None
            if now != ident:
                return (f"the dump's {what} {path} was moved, renamed or removed while the dump was being "
                        "written: records written after that are not where the dump says")
        return None

    def _report(self) -> None:
        """Warn (in the caller's thread) about a failure, once."""
        if self.failure is not None and not self._reported:
            self._reported = True
            root = os.path.dirname(os.path.dirname(os.path.dirname(self.rank_dir)))
            _warn_once(root, (
                f"pytest-ptdbg: the dump stopped: {self.failure}. Training goes on; this step's dump "
                f"({self.rank_dir}) is marked incomplete and compare will fail it"))

    @property
    def failed(self) -> bool:
        """True once the dump stopped on an error."""
        return self.failure is not None

    # -- files ------------------------------------------------------------------------------
    def _close_dir(self) -> None:
        dfd, self._dir_fd = self._dir_fd, None
        if dfd is not None:
            try:
                os.close(dfd)
            except OSError:
                pass

    def _make(self) -> int:
        os.makedirs(os.path.dirname(self.rank_dir), exist_ok=True)
        replace_dir(self.rank_dir)
        idents = []
        if _DIR_FLAGS is not None:
            dfd = os.open(self.rank_dir, _DIR_FLAGS)
            self._dir_fd = dfd
            st = os.fstat(dfd)
            idents.append(("folder", self.rank_dir, (st.st_dev, st.st_ino)))
        if self.with_data:
            os.makedirs(self.data_dir, exist_ok=True)
            st = os.stat(self.data_dir)
            idents.append(("data folder", self.data_dir, (st.st_dev, st.st_ino)))
        # until the first stop() the manifest says "not closed"; it also reserves the manifest's
        # room, so that a disk filled later can still be told the dump stopped (see _fail)
        manifest.write_manifest(self.pkl_path, 0, False, _NOT_CLOSED, dir_fd=self._dir_fd,
                                environment=self.environment)
        fd = os.open(self.pkl_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        st = os.fstat(fd)
        idents.append(("record file", self.pkl_path, (st.st_dev, st.st_ino)))
        self._idents = idents
        return fd

    def prepare(self) -> None:
        """Kept for callers: nothing happens before the first record (see the class docstring)."""

    def _activate(self) -> None:
        if not self._active:
            self._active = True
            try:
                self._prep = _background().submit(self._make)
            except RuntimeError:  # interpreter shutdown: ``_open`` prepares it here and now
                self._prep = None

    def _open(self) -> int:
        if self._prep is not None:
            prep, self._prep = self._prep, None
            self._fd = prep.result()  # re-raises what went wrong while preparing
        if self._fd is None:
            self._fd = self._make()
        return self._fd

    def _append(self, fd: int, data: bytes) -> None:
        """Append whole lines; a line cut by an error is truncated away (when the disk allows)."""
        try:
            _write_all(fd, data)
        except OSError as e:
            done = getattr(e, "written", 0)
            if done:
                try:
                    os.ftruncate(fd, self.bytes)
                except OSError:
                    self.bytes += done
                    self.lines += data.count(b"\n", 0, done)
            raise
        self.bytes += len(data)
        self.lines += data.count(b"\n")

    def flush(self) -> None:
        """Write what waits, then the manifest (``stop()``: the dump so far is complete)."""
        if self._active and self.failure is None and self._fd is None:
            try:
                self._open()  # waits for the directory
            except Exception as e:  # noqa: BLE001 - never into the user's step
                self._early = []
                self._fail(e, self.rank_dir)
        if self._early:
            self.write("")
        self._write_manifest()

    def _write_manifest(self) -> None:
        if not self._active:
            return
        if self.failure is None and self._idents:
            moved = self._moved()  # complete only where every record is where the dump says
            if moved is not None:
                self._stop_with(moved)
        reason = self.failure
        if reason is None and self.left_out_count:
            n = self.left_out_count
            reason = (f"{n} record(s) left out (" + "; ".join(self.left_out[:3])
                      + ("; ..." if n > 3 else "") + ")")
        state = (self.lines, reason)
        if state == self._manifest_state:
            self._report()
            return  # the manifest on disk says this already (stop() then step())
        dfd = self._dir_fd
        try:
            try:  # the manifest _make wrote, updated in place (no rename: see rewrite_manifest)
                manifest.rewrite_manifest(self.pkl_path, self.lines, reason is None, reason, dir_fd=dfd,
                                          environment=self.environment)
            except FileNotFoundError:
                manifest.write_manifest(self.pkl_path, self.lines, reason is None, reason, dir_fd=dfd,
                                        environment=self.environment)
            self._manifest_state = state
        except Exception as e:  # noqa: BLE001 - a missing manifest already makes compare fail
            self._fail(e, manifest.manifest_path(self.pkl_path))
        self._report()

    def write(self, text: str) -> None:
        """Append complete lines with a single ``os.write`` (held in memory, briefly, while the
        directory is still being prepared in the background)."""
        if self.failure is not None:
            return
        try:
            fd = self._fd
            if fd is None:
                self._activate()
                prep = self._prep
                if prep is not None and not prep.done():
                    self._early.append(text)
                    return
                fd = self._open()
            if self._early:
                text = "".join(self._early) + text
                self._early = []
            if text:
                self._append(fd, text.encode("utf-8"))
        except Exception as e:  # noqa: BLE001 - never into the user's step
            self._early = []
            self._fail(e, self.pkl_path)
            self._report()

    def save(self, key: str, t: torch.Tensor, link: bool = True) -> str:
        """Save ``t`` as ``{key}.npy``; an unchanged tensor saved before becomes a hard link
        (unless ``link`` is False: data changed without a version bump)."""
        name = records.data_file_name(key)
        if self.failure is not None:
            return name  # the line naming it is never written
        path = os.path.join(self.data_dir, name)
        try:
            if self._fd is None:
                self._activate()
                self._open()
            e = self._saved.get(id(t)) if link else None
            if e is not None and e[0]() is t and e[1] == t._version:
                try:
                    os.link(e[2], path)
                    self.npy_files += 1
                    return name
                except OSError:
                    pass
            save_npy(path, t)
        except Exception as exc:  # noqa: BLE001 - never into the user's step
            self._fail(exc, path)
            self._report()
            return name
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
        """Write what waits and the manifest, close the files; a directory prepared but never
        written to is removed again."""
        self.flush()
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None
            if self.bytes == 0 and self.npy_files == 0 and self.failure is None:
                _remove_empty(self.rank_dir, self.pkl_path, self.data_dir)
        self._close_dir()
        self._saved.clear()


#: full-tensor dumps: at most this many bytes of tensor copies wait for the I/O thread
ASYNC_LIMIT_BYTES = 256 << 20
#: tensors of at least this many bytes are written by the caller's thread from their own memory
SYNC_WRITE_BYTES = 1 << 20


class _Done:
    """A future that is already done."""

    @staticmethod
    def result() -> None:
        return None


_DONE = _Done()
#: file operations are handed to the I/O thread in batches of this many, or this many bytes
IO_BATCH = 256
IO_BATCH_BYTES = 8 << 20


def _data_key(t: torch.Tensor) -> Any:
    """What identifies a tensor's data (any view object over the same memory), see StatsCache."""
    return (t.data_ptr(), t.dtype, t.shape, t.stride(), t.device)


def _write_npy_array(path: str, arr: np.ndarray) -> None:
    """Header + raw bytes of a C-contiguous array, through plain ``os.write`` calls; a file cut
    short by an error is deleted (no half-written ``.npy`` stays behind)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, _npy_header(arr))
        if arr.size:
            _write_all(fd, arr.data.cast("B"))
    except BaseException:
        os.close(fd)
        try:
            os.unlink(path)
        except OSError:
            pass
        raise
    os.close(fd)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        try:
            shutil.copyfile(src, dst)
        except BaseException:
            try:
                os.unlink(dst)
            except OSError:
                pass
            raise


class AsyncRankWriter(RankWriter):
    """Full-tensor dumps: every file operation runs, in order, on the process's one I/O thread.

    ``save`` hands over a copy of the tensor (so later in-place changes cannot leak into the file)
    and returns at once (a tensor of :data:`SYNC_WRITE_BYTES` or more is written at once instead,
    from its own memory, by the caller's thread: one copy of its bytes instead of two); ``.pkl``
    lines are queued behind the ``.npy`` files they name, so what is on disk is always consistent:
    complete lines, each naming files that exist and are whole. A SIGKILL loses only what was still
    queued. At most :data:`ASYNC_LIMIT_BYTES` of copies wait;
    beyond that ``save`` waits for the thread. ``flush``/``close`` wait for everything.
    An error on the thread stops the dump: every later task (the lines naming a file that failed
    among them) is skipped; the caller's thread reports it (see :class:`RankWriter`).
    """

    def __init__(self, rank_dir: str, mode: str, with_data: bool) -> None:
        super().__init__(rank_dir, mode, with_data)
        self._tasks: Any = collections.deque()
        self._pending = 0
        self._wfd: Optional[int] = None
        self._recent: Any = collections.deque(maxlen=4)
        self._batch: list = []  # file operations not yet handed to the I/O thread
        self._batch_bytes = 0
        self._made: Any = _DONE  # the future of the directory's preparation

    def _make_async(self) -> None:
        self._wfd = self._make()

    def _activate(self) -> None:
        if not self._active:
            self._active = True
            self._submit(0, self._make_async, self.rank_dir)
            self._send()  # the directory is prepared while the step goes on
            self._made = self._tasks[-1][0] if self._tasks else _DONE

    def _run(self, fn: Any, path: Optional[str], *args: Any) -> None:
        """One task on the I/O thread: skipped after a failure, never raises."""
        if self.failure is not None:
            return
        try:
            fn(*args)
        except BaseException as e:  # noqa: BLE001
            self._fail(e, path)

    def _submit(self, nbytes: int, fn: Any, path: Optional[str], *args: Any) -> None:
        """Queue one file operation; they go to the I/O thread in batches (one hand-over per
        :data:`IO_BATCH` operations or :data:`IO_BATCH_BYTES` bytes, and at every ``.pkl`` write)."""
        self._batch.append((fn, path, args))
        self._batch_bytes += nbytes
        if len(self._batch) >= IO_BATCH or self._batch_bytes >= IO_BATCH_BYTES:
            self._send()

    def _run_batch(self, batch: list) -> None:
        for fn, path, args in batch:
            self._run(fn, path, *args)

    def _send(self) -> None:
        """Hand the queued operations to the I/O thread (in order); wait while too many bytes of
        snapshots are on their way."""
        batch = self._batch
        nbytes = self._batch_bytes
        if batch:
            self._batch = []
            self._batch_bytes = 0
            try:
                self._tasks.append((_background().submit(self._run_batch, batch), nbytes))
            except RuntimeError:  # interpreter shutdown (the thread is gone, its queue done): here
                self._run_batch(batch)
                nbytes = 0
            self._pending += nbytes
        tasks = self._tasks
        while tasks and (tasks[0][0].done() or self._pending > ASYNC_LIMIT_BYTES):
            fut, nb = tasks.popleft()
            self._pending -= nb
            fut.result()
        if self.failure is not None:
            self._report()

    def _write_task(self, data: bytes) -> None:
        fd = self._wfd
        assert fd is not None  # the first task (_make_async) opened it; after its failure no task runs
        self._append(fd, data)

    def write(self, text: str) -> None:
        if self.failure is not None or not text:
            return
        self._activate()
        self._submit(len(text), self._write_task, self.pkl_path, text.encode("utf-8"))
        self._send()

    def save(self, key: str, t: torch.Tensor, link: bool = True) -> str:
        name = records.data_file_name(key)
        if self.failure is not None:
            return name  # the line naming it is never written
        self._activate()
        path = os.path.join(self.data_dir, name)
        try:
            skey = _data_key(t)
            e = self._saved.get(skey) if link else None
            self.npy_files += 1
            if e is not None and e[0]() is not None and e[1] == t._version:
                self._submit(0, _link_or_copy, path, e[2], path)
                return name
            arr = tensor_to_numpy(t)
            queued: Optional[np.ndarray] = arr  # what the I/O thread writes; None: written here
            if arr.nbytes >= SYNC_WRITE_BYTES:
                # a large tensor is written here and now, straight from its memory: one copy
                # (into the page cache) instead of a snapshot copy and a write of the copy
                self._made.result()  # the directory (its errors are the I/O thread's: failure)
                if self.failure is not None:
                    return name
                _write_npy_array(path, arr)
                queued = None
                del arr  # its memory (a converted copy) is not held any longer
            elif t.device.type == "cpu" and arr.size and arr.__array_interface__["data"][0] == t.data_ptr():
                queued = arr.copy()  # a snapshot: the tensor may change before the thread writes it
        except Exception as exc:  # noqa: BLE001 - never into the user's step
            self._fail(exc, path)
            self._report()
            return name
        if queued is None:
            self.npy_bytes += t.numel() * (4 if t.dtype == torch.bfloat16 else t.element_size())
        else:
            self.npy_bytes += queued.nbytes
            self._submit(queued.nbytes, _write_npy_array, path, path, queued)
        if len(self._saved) > 4096:
            self._saved.clear()
        try:
            self._saved[skey] = (weakref.ref(t), t._version, path)
        except TypeError:
            pass
        self._recent.append(t)  # see StatsCache: the next hook sees this memory as a new view
        return name

    def _wait(self) -> None:
        self._send()
        tasks = self._tasks
        while tasks:
            fut, nb = tasks.popleft()
            self._pending -= nb
            fut.result()

    def flush(self) -> None:
        """Wait until everything queued is on disk, then write the manifest."""
        self._wait()
        self._write_manifest()

    def close(self) -> None:
        self.flush()
        if self._wfd is not None:
            try:
                os.close(self._wfd)
            except OSError:
                pass
            self._wfd = None
            if self.bytes == 0 and self.npy_files == 0 and self.failure is None:
                _remove_empty(self.rank_dir, self.pkl_path, self.data_dir)
        self._close_dir()
        self._saved.clear()
        self._recent.clear()


def _remove_empty(rank_dir: str, pkl: str, data_dir: str) -> None:
    try:
        if os.path.getsize(pkl) == 0:
            os.unlink(pkl)
        if os.path.isdir(data_dir) and not os.listdir(data_dir):
            os.rmdir(data_dir)
        try:
            os.unlink(manifest.manifest_path(pkl))
        except FileNotFoundError:
            pass
        os.rmdir(rank_dir)
        os.rmdir(os.path.dirname(rank_dir))  # the step directory, when no other rank is there
    except OSError:
        pass


def _json_number(v: Any) -> str:
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


#: ``json.dumps(obj, separators=(", ", ": "))`` without building an encoder per call
_ENCODE = json.JSONEncoder(separators=(", ", ": ")).encode
#: id(frames) -> (frames, JSON text) for the shared frame lists of ``capture.sink.extract_stack``
_STACK_JSON: Dict[int, Tuple[list, str]] = {}
_BODIES: Dict[int, Tuple[TensorStats, str]] = {}


def _body(st: TensorStats) -> str:
    """``"dtype", [shape], [stats], {"nan": n, "inf": m`` of a record, cached per statistics object
    (a tensor measured once and recorded as one API's output and the next one's input)."""
    e = _BODIES.get(id(st))
    if e is not None and e[0] is st:
        return e[1]
    vals = st.stats
    stats = str(vals)  # Python's repr of finite floats and ints is JSON's
    if "n" in stats or "T" in stats or "F" in stats:  # nan, inf, True, False
        stats = "[" + ", ".join([_json_number(v) for v in vals]) + "]"
    body = f'"{st.dtype}", {list(st.shape)}, {stats}, {{"nan": {st.nan}, "inf": {st.inf}'
    if st.note:
        body += ', "note": ' + json.dumps(st.note)
    if len(_BODIES) >= 4096:
        _BODIES.clear()
    _BODIES[id(st)] = (st, body)  # holding ``st`` keeps its id from being reused
    return body


#: shape -> its JSON text (``[4, 64]``): shapes repeat call after call
_SHAPE_JSON: Dict[Tuple[int, ...], str] = {}


def _measured_body(dname: str, shape: Tuple[int, ...], mx: float, mn: float, mean: float, l2: float,
                   finite: bool, nan: int, inf: int) -> str:
    """:func:`_body` of batched statistics (``stats.batch_stat_columns``), without a
    ``TensorStats`` or the cache: the same text."""
    sj = _SHAPE_JSON.get(shape)
    if sj is None:
        sj = str(list(shape))
        if len(_SHAPE_JSON) < 4096:
            _SHAPE_JSON[shape] = sj
    if finite:
        vals = "[%r, %r, %r, %r]" % (mx, mn, mean, l2)
    else:
        vals = "[" + ", ".join([_json_number(v) for v in (mx, mn, mean, l2)]) + "]"
    return '"%s", %s, %s, {"nan": %d, "inf": %d' % (dname, sj, vals, nan, inf)


def record_line(key: str, st: TensorStats, rg: Optional[bool], ctx: str, npy: Optional[str],
                spec: _Spec) -> str:
    """One tensor record line, identical to ``records.encode_line(records.tensor_record(...))``
    (names, dtypes and file names never need JSON escapes; the call spec, a dict or its JSON text
    from ``call_spec.encode_call_json``, goes in as JSON)."""
    return body_line(key, _body(st), rg, ctx, npy, spec)


def body_line(key: str, body: str, rg: Optional[bool], ctx: str, npy: Optional[str], spec: _Spec) -> str:
    """:func:`record_line` from the record's body text (:func:`_body`)."""
    if rg is not None:
        body += ', "rg": true' if rg else ', "rg": false'
    if ctx:
        body += f', "ctx": "{ctx}"'
    if npy is not None:
        body += f', "npy": "{npy}"'
    if spec is not None:
        body += ', "call": ' + (spec if type(spec) is str else _ENCODE(spec))
    return f'["{key}", 0, [], {body}}}]\n'


#: API types whose in-place writes bypass autograd's version counter
_OPAQUE_TYPES = ("Distributed", "NPU")
#: APIs whose kernels write tensors among their inputs without a version bump (BatchNorm's
#: running statistics; the fused optimizers' parameters, moments and step counters: torch 2.13's
#: ``_fused_adamw_`` leaves every ``_version`` at 0, unlike the ``_foreach_*_`` kernels; GradScaler's
#: unscaling of the gradients and its growth tracker): after the
#: call, cached statistics and saved files of their inputs are stale
_WRITES_INPUTS = frozenset((
    ("Torch", "_fused_adamw_"), ("Torch", "_fused_adam_"), ("Torch", "_fused_sgd_"),
    ("Torch", "_fused_adagrad_"), ("Torch", "_amp_foreach_non_finite_check_and_unscale_"),
    ("Torch", "_amp_update_scale_"),
    ("Functional", "batch_norm"), ("Functional", "instance_norm"), ("Torch", "batch_norm"),
    ("Torch", "instance_norm"), ("Torch", "native_batch_norm"), ("Torch", "_native_batch_norm_legit"),
    ("Torch", "_native_batch_norm_legit_no_training"), ("Torch", "cudnn_batch_norm"),
    ("Torch", "miopen_batch_norm"), ("Torch", "_batch_norm_impl_index"), ("Torch", "batch_norm_update_stats"),
    ("Torch", "_batch_norm_with_update"), ("Functional", "sync_batch_norm"),
))
_STRIDED = torch.strided
_Param = torch.nn.Parameter


def _no_storage(t: torch.Tensor) -> bool:
    """Whether ``t`` (of a tensor subclass) has no data of its own to save (a wrapper subclass)."""
    try:
        return t.numel() > 0 and t.data_ptr() == 0
    except Exception:  # noqa: BLE001 - no data pointer at all
        return True
#: why a pending record was dropped at the flush (see DumpSink._measure)
_STALE = ("its tensor was written before its statistics were read, by a write capture does not see "
          "(no recorded in-place call; e.g. through numpy or a compiled region)")
#: the state of a call whose forward is done and whose backward is awaited
_BWD_ONLY = (True, True, None, None)
#: records wait in memory (their statistics measured together, see DumpSink) until this many
#: are queued, or :data:`SNAP_MAX_ELEMS` elements of snapshots are held
QUEUE_MAX = 1024
SNAP_MAX_ELEMS = 1 << 20
#: tensors of at most this many elements are snapshotted and measured in a batch; larger ones
#: at once (their statistics cost passes over the data, not Python overhead)
SNAP_NUMEL = 8192
_ref = weakref.ref


class DumpSink(Sink):
    """Records calls as ptdbg v4 lines (and ``.npy`` files unless ``summary_only``).

    Records: every tensor and Python int/float among the inputs and outputs (bool flags such as
    ``inplace=False`` are only in the call spec), one stack record per API and direction in the
    modes that have stacks, and one line per gradient.

    Deferred, batched statistics: a small dense floating CPU tensor (at most :data:`SNAP_NUMEL`
    elements) is *referenced* when it is recorded (an input at the call's entry, an output at its
    return, a gradient when autograd hands it over), with its version counter and data pointer,
    and the statistics of all waiting records are computed together (``stats.batch_stat_columns``)
    when the queue is written: at :data:`QUEUE_MAX` records or :data:`SNAP_MAX_ELEMS` elements,
    before every ``Distributed``/``NPU`` call, and at ``stop()``/``step()``. No copy is made unless
    a write may come before the flush: a call that writes its inputs (in place, ``out=``, BatchNorm's
    running statistics, collectives) first copies every referenced record (:meth:`_materialize`),
    and its own inputs are copied once recorded; a gradient is copied when autograd hands it over
    (a user's gradient hook may change it in place, which capture does not see). Records are
    therefore true as at entry/return;
    one whose tensor was still changed unseen before the flush (another version or memory) is
    dropped with a warning and named in the manifest, which then says incomplete (so no compare
    passes without it), never written with numbers it did not have. Records go to the
    ``.pkl`` in their order, in whole lines. The same tensor at the same version recorded again
    in one batch (one call's output as the next one's input) shares its holder; a tensor of at
    least ``cache.min_numel`` elements is also looked up in :class:`stats.StatsCache`, which
    receives the results.
    """

    def __init__(self, config: DebugConfig, rank_dir: str) -> None:
        self.config = config
        self.rank_dir = rank_dir
        self.with_stack = config.with_stack
        self.with_tensors = config.with_tensors
        self.save_data = not config.summary_only and self.with_tensors
        self.filter_on = config.filter_switch == "ON"
        self.selector = Selector(config.mode, config.scope, config.api_list, config.input_output_mode)
        self.writer = (AsyncRankWriter if self.save_data else RankWriter)(rank_dir, config.mode, self.save_data)
        self.cache = SHARED_CACHE
        self.wants_backward = self.with_tensors and (
            self.selector.keep_all_io or bool({"backward", "input", "output"} & set(self.selector.io))
        )
        self.apis_forward = 0
        self.apis_backward = 0
        self._bw_started: set = set()
        self._stack_json = _STACK_JSON  # shared by every step's sink: stacks repeat step after step
        # records not yet written: finished lines (str) and tensor records waiting for their
        # statistics, ``(key, statistics or snapshot holder, rg, ctx, npy, spec)``
        self._pending: list = []
        self._snaps: list = []  # snapshot holders not yet measured
        self._snap_elems = 0
        #: id(tensor) -> the holder of its pending record (``holder[9]`` is the tensor), until the
        #: holder is copied for a write or measured
        self._ids: dict = {}
        self._live: list = []  # holders that reference the recorded tensor itself (no copy yet)
        self._keyed: dict = {}  # cache key -> the holders offered to the cache at the flush
        sel = self.selector
        # decisions that do not depend on the call, made once
        self._every_call = sel.mode not in ("list", "range", "api_list")
        self._keep_fwd_in = self.with_tensors and sel.keep_io("forward", "input")
        self._keep_fwd_out = self.with_tensors and sel.keep_io("forward", "output")
        self._keep_bwd = {"input": sel.keep_io("backward", "input"), "output": sel.keep_io("backward", "output")}
        #: dataflow (the call spec's ``"src"``): id(tensor) -> (weak reference, ``[forward key, output
        #: slot]`` as JSON) of each output of the step's recorded calls; the weak reference guards
        #: against id reuse
        self._made_by: Dict[int, Tuple[Any, str]] = {}
        try:
            self.writer.environment = arithmetic_environment()
        except Exception as e:  # noqa: BLE001 - flags read safely; never let the record stop a dump
            report_internal_error("arithmetic environment", e, None, "the manifest does not record it")
        self.writer.prepare()

    # -- records ---------------------------------------------------------------------------
    def _tensor(self, key: str, v: Any, ctx: str, lines: list, spec: _Spec, fresh: bool,
                leaf: Any = None, grad: bool = False) -> None:
        """Append the record of tensor ``v`` (its statistics now or, for a small tensor, a
        reference to be measured with the batch) to ``lines``. ``grad``: ``v`` is a gradient
        autograd handed over; ``leaf``: ``(call, input index)`` it is produced for (a leaf there is
        looked up only when needed: see ``StatsCache.grad_stats``)."""
        if self.filter_on and filtered_out(v):
            return
        if not fresh:
            # the same tensor, unchanged, already waiting in this batch (one call's output is the
            # next one's input): its holder, without the checks below (it passed them)
            h = self._ids.get(id(v))
            if h is not None and h[9] is v and h[5] == v._version and h[8] == v.data_ptr():
                npy = self._save(key, v, True) if self.save_data else None
                lines.append((key, h, v.requires_grad, ctx, npy, spec))
                return
        cache = self.cache
        tv = type(v)
        if not fresh and (tv is _Tensor or tv is _Param) and v.dtype in BATCH_DTYPES and v.is_cpu \
                and v.layout is _STRIDED and not v.is_nested and not v.is_inference():
            n = v.numel()
            if 0 < n <= SNAP_NUMEL:
                ver = v._version
                link = False
                h = cache.peek(v) if n >= cache.min_numel else None  # an earlier batch or step
                if h is not None:
                    link = True
                else:
                    # a forward tensor: a reference (a detached alias: its memory even if
                    # ``.data`` is reassigned), read at the flush unless a recorded call may
                    # write it first (_materialize); a gradient: a copy now (a user's gradient
                    # hook may change it in place, unseen). Only tensors of cache.min_numel or
                    # more are offered to the cache.
                    big = n >= cache.min_numel
                    dk = cache.data_key(v) if big else None
                    held = v
                    if grad:
                        data = v.detach().clone() if v.requires_grad else v.clone()
                        if leaf is not None and _leaf_of(*leaf) is not None:
                            # a parameter's gradient, on its way to AccumulateGrad: not held (a
                            # reference it does not expect makes it copy instead of take it) and
                            # recorded once (no later call receives it)
                            held = None
                    else:
                        data = v.detach()
                    h = [data, None, None, dk, _ref(v) if big else None, ver, None, None if grad else v,
                         v.data_ptr(), held]
                    if held is not None:
                        self._ids[id(v)] = h
                    if big:
                        self._keyed.setdefault(dk, []).append(h)
                    self._snaps.append(h)
                    if not grad:
                        self._live.append(h)
                    self._snap_elems += n
                npy = self._save(key, v, link) if self.save_data else None
                lines.append((key, h, v.requires_grad, ctx, npy, spec))
                return
        if fresh:
            st = cache.fresh(v)
        elif leaf is not None:
            st = cache.grad_stats(v, _leaf_of(*leaf))
        else:
            st = cache.stats(v)
        # a file saved earlier is reused only for data the cache vouches for
        npy = self._save(key, v, cache.last_hit) if self.save_data else None
        lines.append(record_line(key, st, v.requires_grad, ctx, npy, spec))

    def _records(self, api: str, io: str, items: Any, ctx: str, lines: list, spec: _Spec,
                 fresh: bool = False) -> _Spec:
        """Append the records of ``items`` (an index-ordered list) to ``lines``; returns the unused spec."""
        filt = self.filter_on
        prefix = f"{api}_{io}."
        for i, v in enumerate(items):
            tv = type(v)
            if tv is list or tv is tuple:
                seq = number_sequence(v)
                if seq is not None:  # data, not a literal (see call_spec.number_sequence)
                    if self._sequence(prefix + str(i), v, seq, ctx, lines, spec):
                        spec = None
                    continue
                spec = self._nested(prefix, (i,), v, ctx, lines, spec, fresh)
                continue
            if isinstance(v, _Tensor):
                n0 = len(lines)
                try:
                    self._tensor(prefix + str(i), v, ctx, lines, spec, fresh)
                except Exception as e:
                    del lines[n0:]
                    report_internal_error(f"record {prefix}{i}", e, self)
                    continue
                if len(lines) == n0:
                    continue  # filtered out
            else:
                if filt or tv is bool:  # flags (inplace=False, ...) live in the call spec only
                    continue
                st = scalar_stats(v)
                if st is None:
                    continue
                lines.append(record_line(prefix + str(i), st, None, ctx, None, spec))
            spec = None
        return spec

    def _sequence(self, key: str, v: Any, seq: Any, ctx: str, lines: list, spec: _Spec) -> bool:
        """Record a long list/tuple of numbers as one tensor-like record of its data (float64,
        int64 or bool; saved as ``.npy`` like a tensor input); whether a record was added."""
        n0 = len(lines)
        try:
            data = sequence_tensor(v, seq)
            if self.filter_on and filtered_out(data):
                return False
            st = tensor_stats(data)
            kind = "list" if type(v) is list else "tuple"
            st = st._replace(note=f"a Python {kind} of {seq.numel} numbers, recorded as data")
            npy = self._save(key, data, False) if self.save_data else None
            lines.append(record_line(key, st, False, ctx, npy, spec))
        except Exception as e:  # noqa: BLE001 - ints beyond int64, ...: that record only is lost
            del lines[n0:]
            report_internal_error(f"record {key}", e, self)
            return False
        return True

    def _nested(self, prefix: str, base: Tuple[int, ...], value: Any, ctx: str, lines: list,
                spec: _Spec, fresh: bool) -> _Spec:
        for idx, v in _leaves(value, base):
            key = prefix + ".".join([str(i) for i in idx])
            n0 = len(lines)
            if type(v) is _Seq:
                if self._sequence(key, v[0], v[1], ctx, lines, spec):
                    spec = None
                continue
            try:
                if isinstance(v, _Tensor):
                    self._tensor(key, v, ctx, lines, spec, fresh)
                    if len(lines) == n0:
                        continue
                else:
                    if self.filter_on or type(v) is bool:
                        continue
                    st = scalar_stats(v)
                    if st is None:
                        continue
                    lines.append(record_line(key, st, None, ctx, None, spec))
            except Exception as e:
                del lines[n0:]
                report_internal_error(f"record {key}", e, self)
                continue
            spec = None
        return spec

    def _save(self, key: str, t: torch.Tensor, link: bool) -> Optional[str]:
        """Save ``t`` (a snapshot of it as it is now) as ``{key}.npy``; returns the file name or
        None. Sparse tensors are saved dense, quantized ones dequantized, inference tensors as a
        normal copy; meta and nested tensors have no file. ``link``: a file saved earlier for the
        same data may be reused. A tensor subclass without storage of its own (a wrapper subclass)
        has no file: its record keeps what its statistics could tell."""
        tt = type(t)
        if tt is not _Tensor and tt is not _Param and _no_storage(t):
            return None
        if t.layout is not _STRIDED or t.is_quantized or t.is_meta or t.is_nested or t.is_inference():
            plain = _saveable(t)
            if plain is None:
                return None
            t, link = plain, False
        return self.writer.save(key, t, link)

    # -- sink protocol -----------------------------------------------------------------------
    def start_call(self, call: ApiCall) -> bool:
        if self.writer.failure is not None:
            return False  # the dump stopped on a write error (reported once by the writer)
        if self._pending and call.api_type in _OPAQUE_TYPES:
            self._write_pending()  # a collective may hang: what came before it is on disk
        # the call may write data whose pending records are not read yet: they are copied once its
        # own inputs are recorded (which may share them), before it runs
        writes = call.inplace or call.api_type in _OPAQUE_TYPES or (call.api_type, call.api_name) in _WRITES_INPUTS
        if self._every_call:
            fwd = bwd = True
        else:
            fwd, bwd = self.selector.directions(call)
            if not (fwd or bwd):
                if writes and self._live:
                    self._materialize()
                if (call.api_type, call.api_name) in _WRITES_INPUTS or call.api_type in _OPAQUE_TYPES:
                    self._forget_inputs(call)  # nothing caches them before the kernel runs
                return False
        lines: list = []
        spec: _Spec = None
        if fwd:
            if self.with_tensors:
                args, kwargs = call.args, call.kwargs
                try:
                    fam = _FP32_FAMILY.get((call.api_type, call.api_name))
                    spec = call_json(args, kwargs, math_modes(args, kwargs, fam))
                    if fam is not None:
                        self._computed_on(args, kwargs)
                except Exception as e:  # pragma: no cover - never let the spec break a run
                    spec = {"repr": f"unencodable call: {e}"}
                items = list(args) + list(kwargs.values()) if kwargs else args
                if self._made_by and type(spec) is str:
                    try:
                        src = _sources(self._made_by, items)
                        if src:
                            spec = spec[:-1] + ', "src": {' + src + "}}"
                    except Exception as e:  # pragma: no cover - dict look-ups; a hint only
                        report_internal_error("record sources", e, None, "this call's dataflow is not recorded")
                if self._keep_fwd_in:
                    spec = self._records(call.forward_key, "input", items, call.ctx, lines, spec)
            if self.with_stack:
                call.stack  # noqa: B018 - reading the property extracts the stack, while the frames are live
        if writes and self._live:
            self._materialize()
        call.state[self] = (fwd, bwd, lines, spec)
        return True

    def end_call(self, call: ApiCall) -> None:
        st = call.state.get(self)
        if st is None:
            return
        fwd, bwd, lines, spec = st
        fresh = call.api_type in _OPAQUE_TYPES  # they write tensors without a version bump
        if fresh or (call.api_type, call.api_name) in _WRITES_INPUTS:
            self._forget_inputs(call)
        if not fwd:
            if self.with_stack:
                call.stack  # noqa: B018 - reading the property extracts the stack, while the frames are live
            return
        api = call.forward_key
        out = call.output
        if call.inplace and not _has_tensor(out) and call.args:
            out = call.args[0]  # in-place collectives and the like return None/Work
        items = list(out) if isinstance(out, (list, tuple)) and not hasattr(out, "shape") else (out,)
        if self.with_tensors:
            try:
                _made(self._made_by, api, items)
            except Exception as e:  # pragma: no cover - weak references of tensors; a hint only
                report_internal_error("record sources", e, None, "later calls' dataflow may be missing")
        if self._keep_fwd_out:
            self._records(api, "output", items, call.ctx, lines, spec, fresh)
        if self.with_stack:
            lines.append(self._stack_line(api, call.stack))
        if lines:
            self._pending += lines
            self.apis_forward += 1
            if fresh or len(self._pending) >= QUEUE_MAX or self._snap_elems >= SNAP_MAX_ELEMS:
                self._write_pending()
        if bwd:
            call.state[self] = _BWD_ONLY
        else:
            del call.state[self]

    def _forget_inputs(self, call: ApiCall) -> None:
        """The call's kernel may have written its inputs without a version bump: their cached
        statistics (and files saved for them, which the cache vouches for) are stale."""
        items = list(call.args) + list(call.kwargs.values()) if call.kwargs else call.args
        keyed = self._keyed
        for _, v in iter_tensors(items):
            if isinstance(v, _Tensor):
                self.cache.forget(v)
                if keyed:
                    try:
                        hs = keyed.pop(self.cache.data_key(v), ())
                    except Exception:  # pragma: no cover - a tensor kind without data_ptr
                        hs = ()
                    for h in hs:
                        h[3] = None  # its statistics are true for its record, never reused

    def _computed_on(self, args: tuple, kwargs: dict) -> None:
        """Note the device type a matmul/convolution ran on (the environment's ``computed_on``)."""
        env = self.writer.environment
        t = first_tensor(args, kwargs)
        if env is not None and t is not None:
            on = env.setdefault("computed_on", [])
            kind = t.device.type
            if kind not in on:
                on.append(kind)

    def lost(self, reason: str) -> None:
        """A record this dump goes on without (an internal error, a tensor written unseen): named in
        the manifest, which then says incomplete, so no compare passes without it."""
        super().lost(reason)
        self.writer.leave_out(reason)

    def before_write(self) -> None:
        """Capture's notice that a call it does not record may write tensors (an in-place op outside
        its name table, a backward pass whose hooks it does not see): pending references are copied."""
        if self._live:
            self._materialize()

    def _materialize(self) -> None:
        """Copy the data of every pending record that still references its tensor (a write may
        come before the flush reads it); a holder copied is no longer shared by later records."""
        live, self._live = self._live, []
        ids = self._ids
        with isolated(), torch.no_grad():
            for h in live:
                v = h[7]
                if v is None:
                    continue
                h[7] = h[9] = None
                if ids.get(id(v)) is h:
                    del ids[id(v)]
                t = h[0]
                if t._version != h[5] or t.data_ptr() != h[8]:
                    h[0] = None  # written since it was recorded, unseen: _measure drops the record
                    continue
                h[0] = t.detach().clone()

    def on_backward(self, call: ApiCall, io: str, index: Tuple[int, ...], grad: Any) -> None:
        st = call.state.get(self)
        if st is None or not st[1] or not self._keep_bwd[io]:
            return
        api = call.backward_key
        key = f"{api}_{io}.{index[0]}" if len(index) == 1 else records.tensor_key(api, io, index)
        lines: list = []
        try:
            self._tensor(key, grad, call.ctx, lines, None, False, (call, index) if io == "output" else None, True)
        except Exception as e:
            report_internal_error(f"record {key}", e, self)
            return
        if not lines:
            return  # filtered out
        seq = call.seq
        if seq not in self._bw_started:
            self._bw_started.add(seq)
            self.apis_backward += 1
            if self.with_stack and call._stack is not None:
                lines.append(self._stack_line(api, call._stack))
        pending = self._pending
        pending += lines
        if len(pending) >= QUEUE_MAX or self._snap_elems >= SNAP_MAX_ELEMS:
            self._write_pending()

    def _measure(self) -> None:
        """Statistics of every waiting snapshot, in one batch; the cache learns those it may reuse.

        A holder that still references its tensor (no copy was needed) is read now, if the tensor
        is as it was recorded (same version, same memory); otherwise its record is dropped (see
        :meth:`_write_pending`), never written with numbers it did not have."""
        snaps, self._snaps = self._snaps, []
        self._snap_elems = 0
        self._live = []
        self._ids = {}
        self._keyed = {}
        if not snaps:
            return
        cache = self.cache
        tensors: list = []
        kept: list = []
        # outside the user's autocast and modes (a flush may run inside them); the recorded
        # tensors themselves may require grad
        with isolated():
            for h in snaps:
                h[9] = None
                if h[7] is not None:  # not copied: still as recorded?
                    h[7] = None
                    t = h[0]
                    if t._version != h[5] or t.data_ptr() != h[8]:
                        h[0] = None
                t = h[0]
                if t is None:
                    continue  # written unseen since it was recorded: h[6] stays None
                h[1] = dtype_name(t.dtype)
                h[2] = tuple(t.shape)
                tensors.append(t)
                kept.append(h)
        try:
            with isolated(), torch.no_grad():
                mx, mn, mean, l2, nan, inf, ok = batch_stat_columns(tensors)
        except Exception as e:  # noqa: BLE001 - one by one instead: the same numbers, nothing lost
            report_internal_error("batch statistics", e, None,
                                  "these records are measured one by one instead, none is missing")
            with isolated(), torch.no_grad():
                for h in kept:
                    st = _one_stats(h[0], h[1], h[2])
                    h[6] = _body(st)
                    h[0] = None
                    if h[3] is not None:
                        cache.put(h[3], h[4], h[5], st)
            return
        for j, h in enumerate(kept):
            h[0] = None  # the snapshot's memory (or the reference) goes
            try:
                h[6] = _measured_body(h[1], h[2], mx[j], mn[j], mean[j], l2[j], ok[j], nan[j], inf[j])
                if h[3] is not None:
                    cache.put(h[3], h[4], h[5], TensorStats(h[1], h[2], [mx[j], mn[j], mean[j], l2[j]],
                                                            nan[j], inf[j]))
            except Exception as e:  # noqa: BLE001 - its record is dropped when written (h[6] None)
                report_internal_error("batch statistics record", e, self)

    def _write_pending(self) -> None:
        if self.writer.failure is not None:  # the dump stopped (reported once): nothing more is written
            self._pending, self._snaps, self._live, self._ids, self._keyed = [], [], [], {}, {}
            self._snap_elems = 0
            return
        if self._snaps:
            self._measure()
        pending = self._pending
        if pending:
            self._pending = []
            out: List[str] = []
            append = out.append
            for e in pending:
                if type(e) is str:
                    append(e)
                    continue
                try:
                    h = e[1]
                    # a holder measured in this batch, or the statistics the cache had
                    body = h[6] if type(h) is list else _body(h)
                    if body is None:
                        report_internal_error(f"record {e[0]}", RuntimeError(_STALE), None,
                                              "this record is left out and the manifest says incomplete")
                        self.lost(f"{e[0]}: {_STALE}")
                        continue
                    append(body_line(e[0], body, e[2], e[3], e[4], e[5]))
                except Exception as exc:  # noqa: BLE001 - a snapshot measured nowhere: drop it
                    report_internal_error(f"record {e[0]}", exc, self)
            self.writer.write("".join(out))

    def _stack_line(self, api: str, frames: list) -> str:
        """The stack record line; the frames' JSON is cached (``extract_stack`` shares lists)."""
        enc = self._stack_json.get(id(frames))
        if enc is None or enc[0] is not frames:
            enc = (frames, _ENCODE(frames))
            if len(self._stack_json) > 20000:
                self._stack_json.clear()
            self._stack_json[id(frames)] = enc
        return f'["{records.stack_key(api)}", {enc[1]}]\n'

    def flush(self) -> None:
        self._write_pending()
        self.writer.flush()

    def close(self) -> None:
        self._write_pending()
        self.writer.close()
        self._bw_started.clear()
        self._made_by.clear()


#: at most this many outputs are remembered for the dataflow per step (then it starts again)
MADE_BY_MAX = 1 << 20


def _made(made_by: Dict[int, Tuple[Any, str]], api: str, items: Any, prefix: str = "output.") -> None:
    """Remember ``api`` (a forward key) and the slot as the producer of each tensor in ``items``
    (as the JSON text of ``[api, slot]``, written as it is into the consumers' call specs)."""
    if len(made_by) >= MADE_BY_MAX:
        made_by.clear()
    if '"' in api or "\\" in api:  # pragma: no cover - API names are identifiers
        head = _ENCODE(api)[:-1]
    else:
        head = '["' + api
    for i, v in enumerate(items):
        tv = type(v)
        if tv is _Tensor or tv is _Param or isinstance(v, _Tensor):
            try:
                made_by[id(v)] = (_ref(v), f'{head}", "{prefix}{i}"]')
            except TypeError:  # pragma: no cover - a tensor kind without weak references
                pass
        elif tv is list or tv is tuple:
            _made(made_by, api, v, f"{prefix}{i}.")


def _sources(made_by: Dict[int, Tuple[Any, str]], items: Any, prefix: str = "input.") -> str:
    """The call spec's ``"src"`` entries as JSON text (``"input.0": [forward key, "output.0"], ...``;
    ``""``: none): which recorded call made each tensor input (the same object it returned, still
    alive; inputs made elsewhere are left out)."""
    out = ""
    get = made_by.get
    for i, v in enumerate(items):
        tv = type(v)
        if tv is list or tv is tuple:
            if v and len(v) <= 4096:
                sub = _sources(made_by, v, f"{prefix}{i}.")
                if sub:
                    out = f"{out}, {sub}" if out else sub
            continue
        e = get(id(v))
        if e is not None and e[0]() is v:
            one = f'"{prefix}{i}": {e[1]}'
            out = f"{out}, {one}" if out else one
    return out


def _leaf_of(call: ApiCall, index: Tuple[int, ...]) -> Any:
    """The leaf tensor (a parameter) at input ``index`` of ``call``, or None."""
    v = call.input_at(index)
    return v if v is not None and getattr(v, "is_leaf", False) else None


def _one_stats(t: torch.Tensor, dname: str, shape: Tuple[int, ...]) -> TensorStats:
    """A snapshot's statistics alone, computed as the batch computes them (the same numbers);
    ``tensor_stats`` (which never raises) when even that fails."""
    try:
        mx, mn, mean, l2, nan, inf, _ = batch_stat_columns([t])
        return TensorStats(dname, shape, [mx[0], mn[0], mean[0], l2[0]], nan[0], inf[0])
    except Exception:  # noqa: BLE001
        return tensor_stats(t)


def _saveable(t: torch.Tensor) -> Optional[torch.Tensor]:
    """A strided tensor holding ``t``'s values for a ``.npy`` file, or None (no data: meta, nested)."""
    x = t.detach()
    if x.is_meta or x.is_nested:
        return None
    if x.layout is not _STRIDED:
        x = x.to_dense()
    if x.is_quantized:
        x = x.dequantize()
    if x.is_inference():
        with torch.inference_mode(False):
            x = x.clone()  # a normal tensor: inference tensors have no version counter
    return x


class _Seq(tuple):
    """``(value, NumberSequence)``: a long list of numbers met among an argument's leaves."""


def _leaves(value: Any, prefix: Tuple[int, ...]) -> Any:
    """``iter_tensors``, except that a nested list/tuple of many numbers (``number_sequence``) is
    one leaf, a :class:`_Seq`, as the call spec encodes it."""
    for i, v in enumerate(value):
        idx = prefix + (i,)
        tv = type(v)
        if tv is list or tv is tuple:
            seq = number_sequence(v)
            if seq is not None:
                yield idx, _Seq((v, seq))
            else:
                yield from _leaves(v, idx)
        elif isinstance(v, tuple) and not hasattr(v, "shape"):
            yield from _leaves(v, idx)
        else:
            yield idx, v


def _has_tensor(v: Any) -> bool:
    if isinstance(v, _Tensor):
        return True
    if isinstance(v, (list, tuple)):
        return any(_has_tensor(x) for x in v)
    return False
