"""One compare of two dumps for tests, and ptdbg's ``input_param`` dict for it (no torch).

``run_compare(npu, bench, out, **options)`` is the one place the test helpers call the compare;
``input_param_for(npu, bench)`` builds the ``input_param`` dict of ptdbg's ``compare()`` signature.
The ``compare_pair`` fixture of ``tests/conftest.py`` wraps ``run_compare``; use the functions
themselves where a fixture does not fit (module-scoped fixtures, subprocess scripts). Tests of the
public signature call ``pytest_ptdbg.compare`` with ``input_param_for``'s dict (or a literal one,
where the dict's shape is what is tested). When ``compare()`` gets an internal typed entry point,
only ``run_compare``'s body changes.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Dict, Optional, Union

if TYPE_CHECKING:
    from pytest_ptdbg.api import CompareResult

#: a side of a compare: a path ``compare()`` takes (``.pkl``, rank folder, dump root), or a dump
#: object with ``pkl`` (or ``pkl_path``) and ``data_dir`` (``real_dumps.StepDump``, a plugin run)
Side = Union[str, "os.PathLike[str]", Any]


def _pkl(side: Side) -> str:
    for attr in ("pkl", "pkl_path"):
        if hasattr(side, attr):
            return str(getattr(side, attr))
    return str(side)


def input_param_for(npu: Side, bench: Side, *, with_data: bool = True, npu_data: Optional[str] = None,
                    bench_data: Optional[str] = None) -> Dict[str, Any]:
    """``compare()``'s ``input_param`` with ``npu`` as the device side, the compare log off.

    A dump object's data folder is named unless ``with_data=False``; a path names none (``compare``
    finds it). ``npu_data`` / ``bench_data`` name a side's data folder explicitly (``""``: none).
    """
    p: Dict[str, Any] = {"npu_pkl_path": _pkl(npu), "bench_pkl_path": _pkl(bench), "is_print_compare_log": False}
    for key, side, given in (("npu_dump_data_dir", npu, npu_data), ("bench_dump_data_dir", bench, bench_data)):
        if given is not None:
            p[key] = str(given)
        elif with_data and hasattr(side, "data_dir"):
            p[key] = "" if side.data_dir is None else str(side.data_dir)   # None: a statistics-only side
    return p


def run_compare(npu: Side, bench: Side, out: Union[str, "os.PathLike[str]"], *, with_data: bool = True,
                npu_data: Optional[str] = None, bench_data: Optional[str] = None,
                **options: Any) -> "CompareResult":
    """Compare ``npu`` against ``bench`` into the folder ``out``; ``options`` are ``compare()``'s
    keyword arguments (``stack_mode``, ``rule``, ``replay_check``, ``summary_compare``...)."""
    from pytest_ptdbg import compare

    param = input_param_for(npu, bench, with_data=with_data, npu_data=npu_data, bench_data=bench_data)
    return compare(param, str(out), **options)
