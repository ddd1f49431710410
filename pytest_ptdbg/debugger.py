"""``PrecisionDebugger``: the user-facing dump switch, following ptdbg_ascend v4.

::

    debugger = PrecisionDebugger(dump_path="./npu_dump", hook_name="dump", step=[0])
    debugger.configure_hook(mode="api_stack")
    debugger.start(); ...; debugger.stop()      # several segments go into the same step's dump
    debugger.step()                             # next step: call counters start again from 0

Also a context manager (``with debugger: ...``). As in v4, ``PrecisionDebugger.start()`` /
``.stop()`` / ``.step()`` also work on the class (they act on the last debugger created).
Files: ``{dump_path}/ptdbg_dump_v4.0/step{N}/rank{R}/{mode}_dump.pkl`` (+ ``{mode}_dump/*.npy``
and the completeness manifest ``{mode}_dump.manifest.json``, rewritten at every ``stop()`` and at
the end of the step); an existing ``rank{R}`` directory is replaced atomically at the first record
of a step. One writer per dump path, step and rank: ``start()`` takes ``step{N}/rank{R}.lock``
(``dump/lock.py``) and raises :class:`~pytest_ptdbg.dump.lock.DumpPathInUseError` (a RuntimeError)
when another process or debugger holds it; the lock goes when the step's dump is closed.
Nothing else raises into the user's code: a write error stops the dump with one warning.
"""
from __future__ import annotations

import atexit
import logging
import os
import warnings
import weakref
from typing import TYPE_CHECKING, Any, List, Optional, Sequence, Union

from pytest_ptdbg.errors import ConfigError
from pytest_ptdbg.runtime import config as _config
from pytest_ptdbg.format import records

if TYPE_CHECKING:
    from pytest_ptdbg.capture.engine import CaptureEngine
    from pytest_ptdbg.capture.sink import Sink
    from pytest_ptdbg.dump.lock import RankLock

__all__ = ["PrecisionDebugger"]

_LAST: Optional["weakref.ReferenceType[PrecisionDebugger]"] = None
_ALL: "weakref.WeakSet[PrecisionDebugger]" = weakref.WeakSet()


class _hybrid:
    """A method callable on an instance or on the class (then on the last debugger created)."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.__doc__ = fn.__doc__

    def __get__(self, obj: Any, cls: Any) -> Any:
        if obj is None:
            obj = _LAST() if _LAST is not None else None
            if obj is None:
                raise RuntimeError(f"PrecisionDebugger.{self.fn.__name__}(): no PrecisionDebugger has been created")
        return self.fn.__get__(obj, cls)


def current_rank() -> int:
    """Rank from ``torch.distributed`` when it is initialised, else 0 (never guessed from pids)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return 0


class PrecisionDebugger:
    """Dump every PyTorch API call (forward and backward) of the selected steps.

    Args:
        dump_path: root directory of the dump (created; must be writable).
        hook_name: ``"dump"`` or ``"overflow_check"``.
        rank: None or [] (every rank), an int or a list of ranks to dump.
        step: list of steps to dump (non-negative ints; None or []: every step). Outside them nothing
            is recorded; past the last one the debugger stays off.
        enable_dataloader, model: accepted for ptdbg compatibility (``enable_dataloader=True`` is
            not supported).
    """

    def __init__(
        self,
        dump_path: Union[str, "os.PathLike[str]"] = "./ptdbg_dump",
        hook_name: str = "dump",
        rank: Union[None, int, Sequence[int]] = None,
        step: Optional[Sequence[int]] = None,
        enable_dataloader: bool = False,
        model: Any = None,
    ) -> None:
        global _LAST
        self.config = _config.DebugConfig(
            dump_path=_config.validate_dump_path(dump_path),
            hook_name=_config.validate_hook_name(hook_name),
            step=_config.validate_steps(step),
            rank=_config.validate_rank(rank),
        )
        if enable_dataloader:
            raise ConfigError("invalid enable_dataloader=True: allowed values are False (not supported)")
        self.current_step = 0
        self._engine: Optional[CaptureEngine] = None
        self._sinks: List[Sink] = []
        self._sink_step: Optional[int] = None
        self._started = False
        self._lock: Optional[RankLock] = None  # the lock of the open step's dump
        self._pid = os.getpid()
        self._warned = False
        #: rank directories this debugger wrote into, in order
        self.rank_dirs: List[str] = []
        _LAST = weakref.ref(self)
        _ALL.add(self)

    # -- configuration --------------------------------------------------------------------------
    def configure_hook(
        self,
        mode: str = "api_stack",
        scope: Optional[List[str]] = None,
        api_list: Optional[List[str]] = None,
        filter_switch: str = "OFF",
        input_output_mode: Optional[List[str]] = None,
        acl_config: Optional[str] = None,
        backward_input: Optional[List[str]] = None,
        summary_only: bool = False,
        overflow_nums: int = 1,
    ) -> "PrecisionDebugger":
        """Choose what is dumped (ptdbg modes ``api_stack``, ``all``, ``list``, ``range``, ``stack``,
        ``api_list``, ``acl``); see ``config.validate_hook`` for the rules. Takes effect from the
        next ``start()``."""
        if self._started:
            raise RuntimeError("configure_hook() while the debugger is started: call stop() first")
        _config.validate_hook(
            self.config, mode=mode, scope=scope, api_list=api_list, filter_switch=filter_switch,
            input_output_mode=input_output_mode, acl_config=acl_config, backward_input=backward_input,
            summary_only=summary_only, overflow_nums=overflow_nums,
        )
        self._close_sinks()
        return self

    # -- state ----------------------------------------------------------------------------------
    def _step_active(self) -> bool:
        steps = self.config.step
        return steps is None or self.current_step in steps

    def _rank_dir(self, rank: int) -> str:
        return records.rank_dir(self.config.dump_path, self.current_step, rank)

    def _make_sinks(self, rank: int) -> List[Sink]:
        cfg = self.config
        rdir = self._rank_dir(rank)
        if cfg.hook_name == "overflow_check":
            cls = _import_sink("pytest_ptdbg.sinks.overflow", "OverflowSink", "hook_name='overflow_check'")
        elif cfg.mode == "acl":
            cls = _import_sink("pytest_ptdbg.sinks.acl", "AclSink", "mode='acl'")
        else:
            from pytest_ptdbg.dump.writer import DumpSink

            cls = DumpSink
        sinks = [cls(config=cfg, rank_dir=rdir)]
        self.rank_dirs.append(rdir)
        return sinks

    @_hybrid
    def start(self) -> None:
        """Start recording (a no-op outside the configured steps and ranks)."""
        if self._started or not self._step_active():
            return
        from pytest_ptdbg.capture.engine import CaptureEngine

        rank = current_rank()
        if self.config.rank is not None and rank not in self.config.rank:
            return
        for other in list(_ALL):
            if other is not self and other._started:
                raise RuntimeError("another PrecisionDebugger is started in this process: stop() it first")
        if self._sink_step != self.current_step or not self._sinks:
            self._close_sinks()
            from pytest_ptdbg.dump.lock import acquire_rank_lock

            self._lock = acquire_rank_lock(self._rank_dir(rank))  # raises when another writer holds it
            try:
                self._sinks = self._make_sinks(rank)
            except BaseException:
                self._release_lock()
                raise
            self._sink_step = self.current_step
        engine = self._engine
        if engine is None:
            engine = self._engine = CaptureEngine()
        engine.sinks = self._sinks
        engine.start()
        self._started = True

    @_hybrid
    def stop(self) -> None:
        """Stop recording; what was recorded is on disk."""
        if not self._started or self._engine is None:  # started implies an engine
            return
        self._engine.stop()
        self._started = False
        for s in self._sinks:
            try:
                s.flush()  # the dump writer writes the manifest here; it never raises
            except Exception as e:  # noqa: BLE001 - never into the user's step
                self._warn(f"pytest-ptdbg: {type(s).__name__}.flush() failed ({type(e).__name__}: {e}); "
                           "the dump of this step may be incomplete")

    @_hybrid
    def step(self) -> None:
        """Advance to the next step: close this step's dump and reset the per-API call counters."""
        if self._started:
            self.stop()
        self._close_sinks()
        self.current_step += 1
        if self._engine is not None:
            self._engine.reset_step()
        # the next step's dump opens at its first start(), and its directory at its first record:
        # a step this run never records is never touched

    def _close_sinks(self) -> None:
        sinks, self._sinks = self._sinks, []
        self._sink_step = None
        try:
            for s in sinks:
                try:
                    s.close()  # the dump writer writes the manifest here; it never raises
                except Exception as e:  # noqa: BLE001 - never into the user's step
                    self._warn(f"pytest-ptdbg: {type(s).__name__}.close() failed ({type(e).__name__}: {e}); "
                               "the dump of this step may be incomplete")
        finally:
            self._release_lock()

    def _release_lock(self) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()

    def _warn(self, message: str) -> None:
        """One warning per debugger, never raised (even under ``-W error``)."""
        if self._warned:
            return
        self._warned = True
        try:
            warnings.warn(message, RuntimeWarning, stacklevel=3)
        except Exception:  # noqa: BLE001
            logging.getLogger("pytest_ptdbg").warning(message)

    def close(self) -> None:
        """Stop and release every file (also done at interpreter exit)."""
        self.stop()
        self._close_sinks()

    @property
    def sinks(self) -> List[Sink]:
        """The sinks of the current step (empty before the first ``start()``)."""
        return list(self._sinks)

    def __enter__(self) -> "PrecisionDebugger":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _import_sink(module: str, name: str, what: str) -> Any:
    import importlib

    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(
            f"{what} needs {module}.{name}, which cannot be imported ({e}); "
            "allowed without it: hook_name='dump' with mode in "
            "'api_stack', 'all', 'list', 'range', 'stack', 'api_list'"
        ) from e


@atexit.register
def _close_all() -> None:  # pragma: no cover - interpreter exit
    for d in list(_ALL):
        if d._pid != os.getpid():  # a forked child's copy: the parent owns the files and the lock
            continue
        try:
            d.close()
        except Exception:
            pass
