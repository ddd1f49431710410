"""Worker processes that the caller never sees: :func:`run_parallel`.

Each worker is a fresh interpreter started as ``python -c <bootstrap>`` that imports this package and
nothing of the caller: never the caller's ``__main__`` (``multiprocessing``'s spawn and forkserver
re-run a guard-less script, a ``python -c`` or stdin program cannot be re-imported at all), never the
caller's stdin, never a file of the caller's working folder shadowing a module (the bootstrap puts this
package's root first on ``sys.path`` and drops the script folder entry). No fork: torch's threads
may hold locks when a compare starts. The parent sends ``(module, function, item)`` frames down
the child's stdin and reads ``("ok", result)`` frames from its stdout (pickled: these are our own
processes talking over private pipes, never a file); what the child prints goes to stderr.

Every failure to start or run a worker (processes forbidden, a child that dies, hangs at start,
cannot unpickle or raises) leaves its items to this process, which computes them with the same
function: the same results as one worker, never a crash of the pool and never an item missing. An
exception of the function itself is raised here, from the in-process call, as without workers.
Inside a worker, or an item computed here, :func:`run_parallel` computes inline (no nested pools).
"""
from __future__ import annotations

import importlib
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

__all__ = ["run_parallel", "map_unordered", "chunk_ranges", "default_workers", "in_worker", "LAST_RUN"]

#: seconds a new worker may take to start and import this package before it is given up
START_TIMEOUT_S = 60.0
_HEAD = struct.Struct(">Q")
_IN_WORKER = False
_HERE = threading.local()   # depth: items of a run_parallel being computed by this thread
#: what the last :func:`run_parallel` of this process did (diagnostics, for tests and benchmarks):
#: ``started`` worker processes, items computed ``by_workers`` and ``here`` (inline or fallback)
LAST_RUN = {"started": 0, "by_workers": 0, "here": 0}
#: this process takes items too (False: it computes only what the workers leave; for tests that
#: must see the workers deliver)
CALLER_SHARE = True
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_PKG_FILE = os.path.realpath(os.path.join(_ROOT, "pytest_ptdbg", "__init__.py"))
_BOOT = ("import sys\n"
         "if sys.path and sys.path[0] == '':\n"
         "    del sys.path[0]\n"
         "sys.path.insert(0, sys.argv[1])\n"
         "from pytest_ptdbg.runtime import pool\n"
         "pool._serve()\n")


class _Lost(Exception):
    """A worker that can no longer be used (dead, hung at start, garbled pipe)."""


def in_worker() -> bool:
    """True inside a worker process of :func:`run_parallel`."""
    return _IN_WORKER


def run_parallel(func: Callable[[Any], Any], items: Sequence[Any], workers: int, *,
                 pure: bool = False) -> Iterator[Tuple[int, Any]]:
    """Yield ``(index, func(items[index]))`` for every item, in the order they finish.

    ``func`` must be a module-level function of this package (it is looked up by name in the
    workers). With ``workers`` > 1, ``workers - 1`` worker processes and this process
    (:data:`CALLER_SHARE`) take items one at a time, so the workers' start-up is never waited
    for; what the workers do not deliver (see the module docstring) is computed here, so every
    index is yielded exactly once and every value is what ``func`` returns in this process.
    ``pure``: ``func`` only computes (writes no file), so once every item is taken this process
    also computes those the workers still hold and keeps the first answer: a slow or starved
    worker never makes the caller wait (its late answer is dropped, the worker killed).
    """
    mod, name = getattr(func, "__module__", ""), getattr(func, "__qualname__", "")
    if not (mod == "pytest_ptdbg" or mod.startswith("pytest_ptdbg.")) or "." in name or \
            getattr(importlib.import_module(mod), name, None) is not func:
        raise ValueError(f"run_parallel needs a module-level function of pytest_ptdbg, not {func!r}")
    n = len(items)
    stats = {"started": 0, "by_workers": 0, "here": 0}
    procs: List[subprocess.Popen] = []
    if not _IN_WORKER and not getattr(_HERE, "depth", 0):
        for _ in range(min(int(workers), n) - 1):
            p = _start()
            if p is not None:
                procs.append(p)
    stats["started"] = len(procs)
    lock = threading.Lock()
    state = {"next": 0, "stop": False}
    held: Dict[int, int] = {}   # item -> the worker that has it (until its answer is queued)
    results: "queue.Queue[Tuple[str, int, Any]]" = queue.Queue()

    def take(worker: Optional[int]) -> Optional[int]:
        with lock:
            if state["stop"] or state["next"] >= n:
                return None
            state["next"] += 1
            if worker is not None:
                held[state["next"] - 1] = worker
            return state["next"] - 1

    def report(kind: str, i: int, value: Any = None) -> None:   # an item delivered or left, or "end"
        results.put((kind, i, value))
        if kind != "end":
            with lock:
                held.pop(i, None)

    ready: Set[int] = set()   # the workers that said they run this copy of the package
    threads = [threading.Thread(target=_drive, args=(p, w, mod, name, items, take, report, ready), daemon=True,
                                name="ptdbg-pool") for w, p in enumerate(procs)]
    yielded = bytearray(n)
    count = 0
    mine: List[int] = []   # items a worker took and did not deliver: computed here
    running = len(threads)
    try:
        for t in threads:
            t.start()
        while count < n:
            try:   # what the workers finished first
                msg = results.get_nowait()
            except queue.Empty:
                while mine and yielded[mine[0]]:
                    mine.pop(0)
                i = mine.pop(0) if mine else (take(None) if CALLER_SHARE or not running else None)
                if i is None and pure and CALLER_SHARE:
                    with lock:
                        spare = [j for j in held if not yielded[j]]
                    i = min(spare) if spare else None
                if i is not None:
                    value = _here(func, items[i])
                    stats["here"] += 1
                    yielded[i], count = 1, count + 1
                    yield i, value
                    continue
                msg = results.get()   # the rest is with the workers: each item held is answered
            kind, i, value = msg
            if kind == "ok" and not yielded[i]:
                stats["by_workers"] += 1
                yielded[i], count = 1, count + 1
                yield i, value
            elif kind == "left" and not yielded[i]:
                mine.append(i)
            elif kind == "end":
                running -= 1
    finally:   # idle workers end on their own (their threads close them); busy or starting ones are killed
        with lock:
            state["stop"] = True
            busy = set(held.values())
        for w, p in enumerate(procs):
            if w in busy or w not in ready:
                _kill(p)
        LAST_RUN.clear()   # after any nested run of the items computed here
        LAST_RUN.update(stats)


def default_workers(limit: int = 8) -> int:
    """The default number of workers: the CPU count, at most ``limit``."""
    return min(os.cpu_count() or 1, limit)


def map_unordered(func: Callable[[Any], Any], items: Sequence[Any], workers: int) -> Iterator[Tuple[int, Any]]:
    """:func:`run_parallel` with ``workers`` > 1 and more than one item; else ``(i, func(item))``
    one by one in this process, in order."""
    if workers <= 1 or len(items) <= 1:
        for i, item in enumerate(items):
            yield i, func(item)
        return
    yield from run_parallel(func, items, workers)


def chunk_ranges(weights: Sequence[int], workers: int, per_worker: int = 8,
                 max_items: int = 2048) -> List[Tuple[int, int]]:
    """``[(start, stop), ...]`` cutting items of these ``weights`` (bytes, say) into about
    ``per_worker`` chunks per worker of equal weight, at most ``max_items`` items each."""
    target = max(1, sum(weights) // (per_worker * workers))
    out, a, acc = [], 0, 0
    for i, w in enumerate(weights):
        acc += w
        if acc >= target or i + 1 - a >= max_items:
            out.append((a, i + 1))
            a, acc = i + 1, 0
    if a < len(weights):
        out.append((a, len(weights)))
    return out


def _here(func: Callable[[Any], Any], item: Any) -> Any:
    """``func(item)`` in this process, its own :func:`run_parallel` calls inline (no nested pools)."""
    _HERE.depth = getattr(_HERE, "depth", 0) + 1
    try:
        return func(item)
    finally:
        _HERE.depth -= 1


def _command() -> List[str]:
    flags: List[str] = getattr(subprocess, "_args_from_interpreter_flags", list)()
    return [sys.executable] + flags + ["-c", _BOOT, _ROOT]


def _start() -> Optional[subprocess.Popen]:
    """A new worker process, or None where processes cannot be started here."""
    if not sys.executable:
        return None
    # numpy's OpenBLAS threads cost ~0.1 s of CPU at import; the compare's dot products are sliced
    # below OpenBLAS's threading threshold, so one thread computes them as in this process
    env = dict(os.environ)
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        return subprocess.Popen(_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True, env=env)
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def _kill(p: subprocess.Popen) -> None:
    try:
        p.kill()
    except OSError:
        pass


def _close(p: subprocess.Popen) -> None:
    """End a worker (from its thread): EOF on its stdin, killed if not gone after 5 s, reaped."""
    try:
        if p.stdin is not None:   # a pipe (_start)
            p.stdin.close()
    except OSError:
        pass
    try:
        p.wait(timeout=5)
    except subprocess.TimeoutExpired:
        _kill(p)
        p.wait()
    try:
        if p.stdout is not None:   # a pipe (_start)
            p.stdout.close()
    except OSError:
        pass


def _drive(p: subprocess.Popen, worker: int, mod: str, name: str, items: Sequence[Any],
           take: Callable[[Optional[int]], Optional[int]], report: Callable[..., None], ready: Set[int]) -> None:
    """Feed one worker items until none are left or it fails; report each item it took. ``worker``
    is added to ``ready`` once the process said it runs this copy of the package."""
    i = None

    def give(kind: str, value: Any = None) -> None:
        nonlocal i
        held, i = i, None
        report(kind, held, value)

    try:
        try:
            hello = _read(p.stdout, START_TIMEOUT_S)
        except _Lost:
            hello = None
        if hello != ("ready", _PKG_FILE):   # dead, hung, another interpreter or copy of the package
            _kill(p)
            return
        ready.add(worker)
        while True:
            i = take(worker)
            if i is None:
                return
            try:
                frame = pickle.dumps((mod, name, items[i]), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:   # not picklable: this item is computed in the caller's process
                give("left")
                continue
            try:
                _write(p.stdin, frame)
                reply = _read(p.stdout)
            except _Lost:
                give("left")
                return
            if isinstance(reply, tuple) and len(reply) == 2 and reply[0] == "ok":
                give("ok", reply[1])
            else:   # the function raised there: here it raises (or not) as without workers
                give("left")
    except BaseException:   # never let a pool thread die with an item unreported
        if i is not None:
            give("left")
    finally:
        report("end", -1)
        _close(p)


def _write(f, frame: bytes) -> None:
    try:
        f.write(_HEAD.pack(len(frame)))
        f.write(frame)
        f.flush()
    except (OSError, ValueError) as e:
        raise _Lost(str(e)) from e


def _read_exact(f, n: int) -> bytes:
    """``n`` bytes, read 1 MiB at a time (a garbled length never allocates more than was sent)."""
    parts, got = [], 0
    while got < n:
        try:
            chunk = f.read(min(n - got, 1 << 20))
        except (OSError, ValueError) as e:
            raise _Lost(str(e)) from e
        if not chunk:
            raise _Lost("the worker's pipe closed")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _read(f, timeout: Optional[float] = None) -> Any:
    if timeout is not None and os.name == "posix":
        import select

        try:
            ready, _, _ = select.select([f], [], [], timeout)
        except (OSError, ValueError) as e:
            raise _Lost(str(e)) from e
        if not ready:
            raise _Lost(f"no answer in {timeout} s")
    (size,) = _HEAD.unpack(_read_exact(f, _HEAD.size))
    try:
        return pickle.loads(_read_exact(f, size))
    except _Lost:
        raise
    except Exception as e:   # a garbled frame: this worker is not used again
        raise _Lost(f"unreadable frame: {e}") from e


def _serve() -> None:
    """A worker's main loop (run by the bootstrap): answer frames until the parent closes stdin."""
    global _IN_WORKER
    import signal

    _IN_WORKER = True
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the parent's to handle
    except (ValueError, OSError):
        pass
    inp = os.fdopen(os.dup(0), "rb")
    out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)   # what the work prints goes to stderr, never into the result frames
    import pytest_ptdbg

    _write(out, pickle.dumps(("ready", os.path.realpath(pytest_ptdbg.__file__))))
    while True:
        try:
            mod, name, item = _read(inp)
        except _Lost:
            return
        try:
            if not (mod == "pytest_ptdbg" or mod.startswith("pytest_ptdbg.")):
                raise ValueError(f"not a module of pytest_ptdbg: {mod!r}")
            func = getattr(importlib.import_module(mod), name)
            reply = pickle.dumps(("ok", func(item)), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            reply = pickle.dumps(("error", f"{type(e).__name__}: {e}"))
        try:
            _write(out, reply)
        except _Lost:
            return
