"""``parse(pkl_path, api_prefix)``: print the stack and statistics of matching records. No torch."""
from __future__ import annotations

import sys
from typing import Any, Dict, List, Optional, TextIO

from pytest_ptdbg.dump import reader


def parse(pkl_path: str, api_prefix: str, file: Optional[TextIO] = None,
          problems: Optional[List[str]] = None) -> List[Dict[str, Any]]:
    """Print, for every API whose key starts with ``api_prefix`` (or tensor record whose name does),
    its stack and ``[name][dtype][shape][max][min][mean]`` per tensor; return those records.

    ``pkl_path`` may be a ``.pkl``, an msprobe ``dump.json`` or a dump folder. Each returned dict has
    ``name, api, dtype, shape, max, min, mean, l2norm, stack``. ``problems``: a list that receives
    the dump's problems (also printed to stderr).
    """
    out = file or sys.stdout
    dump = reader.read_dump(pkl_path, data_dir="")
    for p in dump.problems:
        print(f"[ptdbg parse] problem: {p}", file=sys.stderr)
    if problems is not None:
        problems.extend(dump.problems)
    found: List[Dict[str, Any]] = []
    for api in dump.apis:
        tensors = api.tensors if api.key.startswith(api_prefix) else \
            [t for t in api.tensors if t.name.startswith(api_prefix)]
        if not tensors and not (api.key.startswith(api_prefix) and api.stack):
            continue
        if api.stack:
            print(f"Stack Info of {api.key}:", file=out)
            for fr in api.stack:
                fr = list(fr) + ["", "", "", ""]
                print(f"  File {fr[0]}, line {fr[1]}, in {fr[2]}", file=out)
                if fr[3]:
                    print(f"    {fr[3]}", file=out)
        if tensors:
            print("Statistic Info:", file=out)
        for t in tensors:
            st = list(t.stats) + [None] * 4
            print(f"  [{t.name}][dtype: {t.dtype}][shape: {list(t.shape)}]"
                  f"[max: {st[0]}][min: {st[1]}][mean: {st[2]}]", file=out)
            found.append({"name": t.name, "api": api.key, "dtype": t.dtype, "shape": list(t.shape),
                          "max": st[0], "min": st[1], "mean": st[2], "l2norm": st[3], "stack": api.stack})
    if not found and not any(a.key.startswith(api_prefix) for a in dump.apis):
        print(f"no record of {dump.source} starts with {api_prefix!r}", file=out)
    return found

