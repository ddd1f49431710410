"""Validated configuration of a :class:`~pytest_ptdbg.debugger.PrecisionDebugger`.

Every bad value raises ``ConfigError`` (a ``ValueError``) naming the parameter and the allowed values.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import Any, List, Optional

from pytest_ptdbg.errors import ConfigError

HOOK_NAMES = ("dump", "overflow_check")
MODES = ("api_stack", "all", "list", "range", "stack", "api_list", "acl")
IO_MODES = ("all", "forward", "backward", "input", "output")
SWITCHES = ("ON", "OFF")

__all__ = ["DebugConfig", "HOOK_NAMES", "MODES", "IO_MODES", "validate_steps", "validate_dump_path"]


@dataclass
class DebugConfig:
    """Everything the debugger and its sinks need to know (see ``configure_hook``)."""

    dump_path: str = "./ptdbg_dump"
    hook_name: str = "dump"
    step: Optional[List[int]] = None  # None: every step
    rank: Optional[List[int]] = None  # None: every rank
    mode: str = "api_stack"
    scope: List[str] = field(default_factory=list)
    api_list: List[str] = field(default_factory=list)
    filter_switch: str = "OFF"
    input_output_mode: List[str] = field(default_factory=lambda: ["all"])
    summary_only: bool = False
    acl_config: Optional[str] = None
    backward_input: List[str] = field(default_factory=list)
    overflow_nums: int = 1  # overflow_check: stop after this many overflows (-1: never)

    @property
    def with_stack(self) -> bool:
        """Whether stack records are written."""
        return self.mode in ("api_stack", "stack", "list", "range", "api_list")

    @property
    def with_tensors(self) -> bool:
        """Whether tensor records are written (``stack`` mode writes stack records only)."""
        return self.mode != "stack"


def _bad(param: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"invalid {param}={value!r}: allowed values are {allowed}")


def validate_hook_name(hook_name: Any) -> str:
    if hook_name not in HOOK_NAMES:
        raise _bad("hook_name", hook_name, " or ".join(repr(h) for h in HOOK_NAMES))
    return hook_name


def validate_steps(step: Any, param: str = "step") -> Optional[List[int]]:
    """None (every step) or a list of distinct non-negative ints; ``[]`` means every step, as in ptdbg."""
    if step is None or (isinstance(step, (list, tuple)) and len(step) == 0):
        return None
    if isinstance(step, (list, tuple)) and all(type(s) is int and s >= 0 for s in step):
        return sorted(set(step))
    raise _bad(param, step, "a list of non-negative ints, e.g. [0] or [0, 2], or None for every step")


def validate_rank(rank: Any) -> Optional[List[int]]:
    """None (every rank) or a list of distinct non-negative ints; ``[]`` means every rank, as ``step=[]``."""
    if rank is None or (isinstance(rank, (list, tuple)) and len(rank) == 0):
        return None
    if type(rank) is int and rank >= 0:
        return [rank]
    if isinstance(rank, (list, tuple)) and all(type(r) is int and r >= 0 for r in rank):
        return sorted(set(rank))
    raise _bad("rank", rank, "None (every rank), a non-negative int, or a list of them")


def validate_dump_path(dump_path: Any) -> str:
    """The dump path, created if missing; refuses a path that cannot be written."""
    if not isinstance(dump_path, (str, os.PathLike)) or not str(dump_path):
        raise _bad("dump_path", dump_path, "a writable directory path (str or os.PathLike)")
    path = os.path.abspath(os.fspath(dump_path))
    if os.path.exists(path) and not os.path.isdir(path):
        raise _bad("dump_path", dump_path, "a writable directory path (this one is a file)")
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".ptdbg_probe_", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ConfigError(
            f"invalid dump_path={dump_path!r}: allowed values are a writable directory path ({e.strerror})"
        ) from None
    return path


def _str_list(param: str, value: Any, allowed: str) -> List[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise _bad(param, value, allowed)
    return list(value)


def validate_hook(
    cfg: DebugConfig,
    mode: Any = "api_stack",
    scope: Any = None,
    api_list: Any = None,
    filter_switch: Any = "OFF",
    input_output_mode: Any = None,
    acl_config: Any = None,
    backward_input: Any = None,
    summary_only: Any = False,
    overflow_nums: Any = 1,
) -> DebugConfig:
    """Check ``configure_hook``'s arguments and store them in ``cfg`` (returned)."""
    if mode not in MODES:
        raise _bad("mode", mode, ", ".join(repr(m) for m in MODES))
    scope = _str_list("scope", scope, "a list of API names, e.g. ['Functional_conv2d_1_forward']")
    api_list = _str_list("api_list", api_list, "a list of API name parts, e.g. ['conv2d', 'distributed']")
    if filter_switch not in SWITCHES:
        raise _bad("filter_switch", filter_switch, "'ON' or 'OFF'")
    io = _str_list("input_output_mode", input_output_mode or ["all"], f"a non-empty subset of {list(IO_MODES)}")
    if not io or any(v not in IO_MODES for v in io):
        raise _bad("input_output_mode", input_output_mode, f"a non-empty subset of {list(IO_MODES)}")
    if not isinstance(summary_only, bool):
        raise _bad("summary_only", summary_only, "True or False")
    if type(overflow_nums) is not int or not (overflow_nums == -1 or overflow_nums >= 1):
        raise _bad("overflow_nums", overflow_nums, "a positive int, or -1 for no limit")
    backward_input = _str_list("backward_input", backward_input, "a list of .npy paths of saved gradients")
    if mode == "list" and not scope:
        raise ConfigError(
            "invalid scope=[] for mode='list': allowed values are a non-empty list of API name prefixes, "
            "e.g. scope=['Functional_conv2d_1_forward']"
        )
    if mode == "range" and len(scope) != 2:
        raise ConfigError(
            f"invalid scope={scope!r} for mode='range': allowed values are exactly two API names "
            "[first, last], e.g. ['Functional_conv2d_1_forward', 'Functional_relu_3_forward']"
        )
    if mode == "api_list" and not api_list:
        raise ConfigError(
            "invalid api_list=[] for mode='api_list': allowed values are a non-empty list of API name parts, "
            "e.g. api_list=['conv2d', 'distributed']"
        )
    if mode == "acl":
        if len(scope) != 1:
            raise ConfigError(
                f"invalid scope={scope!r} for mode='acl': allowed values are exactly one API name, "
                "e.g. ['Tensor_permute_1_forward']"
            )
        if not acl_config or not isinstance(acl_config, (str, os.PathLike)):
            raise _bad("acl_config", acl_config, "the path of the acl dump config file (required with mode='acl')")
        if scope[0].endswith("_backward") and not backward_input:
            raise ConfigError(
                f"invalid backward_input={backward_input!r} for mode='acl' with backward scope {scope[0]!r}: "
                "allowed values are a non-empty list of .npy paths of the saved backward_input gradients"
            )
    elif acl_config is not None:
        raise _bad("acl_config", acl_config, "None unless mode='acl'")
    cfg.mode = mode
    cfg.scope = scope
    cfg.api_list = api_list
    cfg.filter_switch = filter_switch
    cfg.input_output_mode = io
    cfg.acl_config = os.fspath(acl_config) if acl_config is not None else None
    cfg.backward_input = backward_input
    cfg.summary_only = summary_only
    cfg.overflow_nums = overflow_nums
    return cfg
