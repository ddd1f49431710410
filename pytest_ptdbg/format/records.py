"""The on-disk vocabulary shared by the dump writer and the compare reader.

No torch here: the compare path imports this module.

Names (ptdbg v4)::

    API key     {Type}_{api}_{k}_{forward|backward}          Functional_conv2d_1_forward
    tensor key  {API key}_{input|output}.{i}[.{j}...]         Functional_conv2d_1_backward_input.0
    stack key   {API key}_stack_info

msprobe's dotted spelling (``Tensor.__getitem__.0.forward.input.0``) is accepted on input.
Names are parsed from the right because API names may contain underscores.

Lines of ``{mode}_dump.pkl`` (text, one JSON array per line)::

    tensor record  [tensor key, 0, [], dtype, shape, [max, min, mean, l2norm], extra]
    stack record   [stack key, [[file, line, function, code], ...]]

``extra`` (a dict, the 7th element; absent in dumps written by ptdbg) holds what ptdbg had no
column for: ``nan`` and ``inf`` counts, ``ctx`` ("optimizer" for calls made inside
``Optimizer.step``; absent otherwise), ``npy`` (file name of the saved tensor, when saved) and
``note`` (how a special tensor kind was summarised: sparse, quantized, nested, meta).
Readers index the first six elements only and treat ``extra`` as optional.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple

FORWARD, BACKWARD = "forward", "backward"
#: an API key's last part: the call, or its gradients' computation
DIRECTIONS = (FORWARD, BACKWARD)
STACK_SUFFIX = "_stack_info"
DUMP_DIR_NAME = "ptdbg_dump_v4.0"
OPTIMIZER_CTX = "optimizer"

_UNDERSCORE = re.compile(
    r"^(?P<type>[A-Za-z]+)_(?P<api>.+)_(?P<k>\d+)_(?P<dir>forward|backward)"
    r"(?:_(?P<io>input|output)(?P<idx>(?:\.\d+)+)?)?$"
)
_DOTTED = re.compile(
    r"^(?P<type>[A-Za-z]+)\.(?P<api>.+)\.(?P<k>\d+)\.(?P<dir>forward|backward)"
    r"(?:\.(?P<io>input|output)(?P<idx>(?:\.\d+)+)?)?$"
)


@dataclass(frozen=True)
class ParsedName:
    """The parts of an API key or tensor key (``io`` and ``index`` are None for an API key)."""

    api_type: str
    api_name: str
    call_index: int
    direction: str
    io: Optional[str] = None
    index: Optional[Tuple[int, ...]] = None

    @property
    def api_key(self) -> str:
        return api_key(self.api_type, self.api_name, self.call_index, self.direction)

    @property
    def api_family(self) -> str:
        """``{Type}_{api}``: the API without call index and direction."""
        return f"{self.api_type}_{self.api_name}"

    @property
    def key(self) -> str:
        if self.io is None:
            return self.api_key
        return tensor_key(self.api_key, self.io, self.index or ())


def api_key(api_type: str, api_name: str, call_index: int, direction: str) -> str:
    """``Functional_conv2d_1_forward``."""
    return f"{api_type}_{api_name}_{call_index}_{direction}"


def tensor_key(api: str, io: str, index: Sequence[int]) -> str:
    """``{api}_{io}.{i}[.{j}...]``."""
    return f"{api}_{io}." + ".".join(str(i) for i in index)


def stack_key(api: str) -> str:
    return api + STACK_SUFFIX


def parse_name(name: str) -> ParsedName:
    """Parse an API key or tensor key, in ptdbg's underscore or msprobe's dotted spelling.

    A tensor key without an index (``Functional_conv2d_0_forward_output``, as ptdbg v4 writes a
    single output) gets index ``(0,)``. Raises ValueError naming the string when it is neither.
    """
    m = _UNDERSCORE.match(name) or _DOTTED.match(name)
    if m is None:
        raise ValueError(
            f"not a ptdbg API or tensor name: {name!r} "
            "(expected e.g. 'Functional_conv2d_1_forward_input.0' or 'Tensor.add.0.forward.output.0')"
        )
    idx = m.group("idx")
    return ParsedName(
        api_type=m.group("type"),
        api_name=m.group("api"),
        call_index=int(m.group("k")),
        direction=m.group("dir"),
        io=m.group("io"),
        index=tuple(int(p) for p in idx.strip(".").split(".")) if idx else ((0,) if m.group("io") else None),
    )


def is_stack_record(record: Sequence[Any]) -> bool:
    return bool(record) and isinstance(record[0], str) and record[0].endswith(STACK_SUFFIX)


def tensor_record(
    name: str, dtype: str, shape: Sequence[int], stats: Sequence[Any], extra: Optional[dict] = None
) -> list:
    """A tensor record as written to the ``.pkl``."""
    rec = [name, 0, [], dtype, list(shape), list(stats)]
    if extra:
        rec.append(extra)
    return rec


def stack_record(api: str, frames: Sequence[Sequence[Any]]) -> list:
    return [stack_key(api), [list(f) for f in frames]]


def encode_line(record: Sequence[Any]) -> str:
    """One ``.pkl`` line. NaN/Inf statistics are written as JSON's NaN/Infinity (as ptdbg did)."""
    return json.dumps(record, separators=(", ", ": ")) + "\n"


def data_file_name(key: str) -> str:
    """File name of a tensor's ``.npy``; refuses names that could leave the data directory."""
    if not key or "/" in key or "\\" in key or key in (".", "..") or "\x00" in key or os.sep in key:
        raise ValueError(f"unsafe tensor name for a data file: {key!r}")
    return key + ".npy"


def safe_data_path(data_dir: str, key: str) -> str:
    """Path of ``key``'s ``.npy`` inside ``data_dir``; never outside it."""
    path = os.path.join(data_dir, data_file_name(key))
    root = os.path.realpath(data_dir)
    if os.path.commonpath([root, os.path.realpath(path)]) != root:
        raise ValueError(f"tensor name {key!r} points outside the data directory {data_dir!r}")
    return path


def step_dir(dump_path: str, step: int = 0) -> str:
    """``{dump_path}/ptdbg_dump_v4.0/step{step}``."""
    return os.path.join(dump_path, DUMP_DIR_NAME, f"step{step}")


def rank_dir(dump_path: str, step: int = 0, rank: int = 0) -> str:
    """``{dump_path}/ptdbg_dump_v4.0/step{step}/rank{rank}``."""
    return os.path.join(step_dir(dump_path, step), f"rank{rank}")


def pkl_name(mode: str) -> str:
    """``{mode}_dump.pkl``."""
    return f"{mode}_dump.pkl"


def data_dir_name(mode: str) -> str:
    """``{mode}_dump`` (the folder of the ``.npy`` files)."""
    return f"{mode}_dump"


def pkl_path(dump_path: str, step: int = 0, rank: int = 0, mode: str = "api_stack") -> str:
    """``{rank_dir}/{mode}_dump.pkl`` of one step and rank of a dump_path."""
    return os.path.join(rank_dir(dump_path, step, rank), pkl_name(mode))


def data_path(dump_path: str, step: int = 0, rank: int = 0, mode: str = "api_stack") -> str:
    """``{rank_dir}/{mode}_dump``: the ``.npy`` folder of one step and rank of a dump_path."""
    return os.path.join(rank_dir(dump_path, step, rank), data_dir_name(mode))
