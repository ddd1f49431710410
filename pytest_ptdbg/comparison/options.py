"""What a compare is asked to do: :class:`CompareOptions`, and where each dump is: :class:`DumpInput`.

``compare()``'s keyword arguments (and ``compare_distributed``'s, and the plugin's and the CLI's)
become one frozen :class:`CompareOptions`, validated once by :meth:`CompareOptions.build`; the
compare stage (``api.compare_dumps``) reads only that. ptdbg's ``input_param`` dict becomes two
:class:`DumpInput` (:func:`inputs_from_param`). No torch.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from pytest_ptdbg.comparison.rule import Rule, parse_rule
from pytest_ptdbg.comparison.verdict import Thresholds

__all__ = ["CompareOptions", "DumpInput", "inputs_from_param", "param_from_inputs"]


@dataclass(frozen=True)
class CompareOptions:
    """How two dumps are compared and reported (see ``api.compare`` for each field's meaning).

    ``rule``: the gate (``Rule.JUDGE``: the default judgement; ``Rule.PTDBG``/``Rule.DTYPE``: the
    per-tensor rule decides ``passed``); the CSV's verdict column is filled by ``rule.row_rule``.
    ``summary_compare``: force (True) or forbid (False) a statistics-only table, None: when a side
    has no saved tensors. ``workers``: threads/processes comparing tensor pairs (None:
    ``comparison.table.WORKERS`` when the table is built). ``log``: ptdbg's
    ``is_print_compare_log``. ``tag``/``report_stem``: the report files' names (one rank of
    ``compare_distributed``).
    """

    stack_mode: bool = False
    auto_analyze: bool = True
    fuzzy_match: bool = False
    rule: Rule = Rule.JUDGE
    thresholds: Optional[Thresholds] = None
    summary_compare: Optional[bool] = None
    replay_check: bool = True
    replay_device: str = "cpu"
    workers: Optional[int] = None
    log: bool = True
    tag: str = ""
    report_stem: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "rule", parse_rule(self.rule))
        if self.thresholds is not None and not isinstance(self.thresholds, Thresholds):
            raise TypeError(f"compare: thresholds must be a comparison.verdict.Thresholds, "
                            f"not {type(self.thresholds).__name__}")
        if self.summary_compare not in (None, True, False):
            raise TypeError(f"compare: summary_compare must be True, False or None, not {self.summary_compare!r}")
        if self.workers is not None and (type(self.workers) is not int or self.workers < 1):
            raise ValueError(f"compare: workers must be a positive int or None, not {self.workers!r}")

    @classmethod
    def build(cls, rule: Union[Rule, str, None] = None, **kwargs: Any) -> "CompareOptions":
        """Options from ``compare()``-style keywords (``rule=None``: ``Rule.JUDGE``; unknown
        keywords: TypeError, as for a function)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"compare: unexpected keyword argument(s) {', '.join(map(repr, unknown))}")
        return cls(rule=parse_rule(rule), **kwargs)

    @property
    def row_rule(self) -> Rule:
        """The per-tensor rule that fills the table's verdicts (ptdbg's under the judgement)."""
        return self.rule.row_rule

    def replace(self, **changes: Any) -> "CompareOptions":
        """A copy with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class DumpInput:
    """One side of a compare: ``path`` (a ``.pkl``, ``dump.json`` or dump folder) and its data
    folder: a path, ``""`` (statistics only, by choice) or None (found inside the folder, or beside
    the ``.pkl``)."""

    path: str
    data_dir: Optional[str] = None


def inputs_from_param(input_param: Mapping[str, Any]) -> Tuple[DumpInput, DumpInput]:
    """ptdbg's ``input_param`` dict as ``(npu, bench)`` inputs. A data key absent while the path
    names a ``.pkl``: statistics only (ptdbg's summary compare); given as None: found beside it."""
    out = []
    for side in ("npu", "bench"):
        key = f"{side}_pkl_path"
        path = input_param.get(key)
        if not path:
            raise ValueError(f"compare: input_param lacks {key!r} (the {side.upper()} dump's .pkl or folder)")
        dkey = f"{side}_dump_data_dir"
        if dkey in input_param and input_param[dkey] is not None:
            data_dir: Optional[str] = input_param[dkey] or ""
        elif dkey in input_param or os.path.isdir(path) or str(path).endswith(".json"):
            data_dir = None
        else:
            data_dir = ""
        out.append(DumpInput(path, data_dir))
    return out[0], out[1]


def param_from_inputs(npu: DumpInput, bench: DumpInput, log: bool = True) -> Dict[str, Any]:
    """The ``input_param`` dict that :func:`inputs_from_param` reads back as ``npu``, ``bench``."""
    return {"npu_pkl_path": npu.path, "bench_pkl_path": bench.path, "npu_dump_data_dir": npu.data_dir,
            "bench_dump_data_dir": bench.data_dir, "is_print_compare_log": log}
