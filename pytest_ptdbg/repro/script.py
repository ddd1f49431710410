"""Write a standalone Python script that reproduces a package's API call (for a bug report).

The script needs only torch and numpy: it loads the package's ``.npy`` files
(``allow_pickle=False``), spells the call out literally (``torch.nn.functional.conv2d(input_0, ...)``),
runs it (forward, or forward + ``autograd.grad`` for a backward package) and prints cosine, max
absolute and max relative error against the saved result. Every name written into the code is
a literal or comes from the judge's tables: the callable is the fixed qualified name of its
allowlist entry (``pytest_ptdbg/replayer/allowlist.py``), dtypes the names of its dtype table, strings
only those the (API, parameter) rule allows, written with ``repr``; the API key in the text is
rebuilt from the entry. A package the judge refuses gives no script (ReplayRefused).
"""
from __future__ import annotations

import keyword
import math
import os
import re
from typing import Any, Dict, List, Optional

from pytest_ptdbg.format import records
from pytest_ptdbg.replayer import allowlist
from pytest_ptdbg.replayer.arguments import check_call, family_of
from pytest_ptdbg.errors import ReplayRefused
from pytest_ptdbg.replayer import codec
from pytest_ptdbg.repro import package as pkgmod
from pytest_ptdbg.errors import ReplayError
from pytest_ptdbg.replayer.engine import api_path

_DTYPE = re.compile(r"^(torch|numpy)\.[a-z0-9_]+$")

_TEMPLATE = '''#!/usr/bin/env python3
"""Standalone reproduction of {api}{what}.

Written by pytest-ptdbg. Runs the call alone from the saved inputs (autocast off) and compares
the result with the one saved when it was recorded, then judges the saved result as compare's
judgement does: its own error (against a float64 replay, the oracle) within its budget
({factor:g} x the error of a replay in its compute dtype, {compute}, floored at one rounding at the
scale of the result and its inputs, and at least what any correct kernel of its algorithm family
errs, KERNEL_BOUNDS). (``ptdbg replay PACKAGE_DIR``
gives the judgement's exact verdict, with its rules for NaN/Inf and results selected from the
inputs.) Needs only torch and numpy.

    python {script_name} [PACKAGE_DIR] [--device cpu|cuda|npu] [--dtype float64]
"""
import argparse
import os

import numpy as np
import torch

PACKAGE_DIR = {package_dir!r}
DTYPES = {{{dtypes}}}
{stack_comment}

def load(key, dtype, device, cast=None, requires_grad=False):
    """Tensor ``key`` from the package, in its recorded dtype (floating ones cast to ``cast``)."""
    arr = np.load(os.path.join(ARGS.package, key + ".npy"), allow_pickle=False)
    t = torch.from_numpy(np.ascontiguousarray(arr))
    if dtype in DTYPES:
        t = t.to(DTYPES[dtype])
    if cast is not None and t.is_floating_point():
        t = t.to(cast)
    t = t.to(device)
    return t.requires_grad_(True) if requires_grad and t.is_floating_point() else t


RNG = {rng!r}


def set_rng(device):
    """Give a random API (dropout...) the generator state of the original call, on that device type."""
    if RNG and RNG["device"] == device.type:
        state = torch.from_numpy(np.load(os.path.join(ARGS.package, RNG["file"]), allow_pickle=False))
        if device.type == "cpu":
            torch.set_rng_state(state)
        elif device.type == "cuda":
            torch.cuda.set_rng_state(state, device)


def flatten(value, prefix="output"):
    """{{key: tensor}} of a return value, keyed like the dump (output.0, output.1.0, ...)."""
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    out = {{}}
    for i, v in enumerate(items):
        if isinstance(v, (list, tuple)):
            out.update(flatten(v, f"{{prefix}}.{{i}}"))
        elif isinstance(v, torch.Tensor):
            out[f"{{prefix}}.{{i}}"] = v
    return out


def metrics(expected, actual):
    """(cosine, max abs err, max rel err) in float64, NaN/Inf positions excluded."""
    e = np.asarray(expected, dtype=np.float64).ravel()
    a = actual.detach().to("cpu", torch.float64).numpy().ravel()
    if e.shape != a.shape:
        return float("nan"), float("nan"), float("nan")
    ok = np.isfinite(e) & np.isfinite(a)
    e, a = e[ok], a[ok]
    if e.size == 0:
        return float("nan"), 0.0, 0.0
    d = np.abs(e - a)
    ne, na = np.linalg.norm(e), np.linalg.norm(a)
    cos = 1.0 if ne == 0 and na == 0 else float(e @ a / (ne * na)) if ne and na else float("nan")
    rel = d / np.maximum(np.abs(e), np.finfo(np.float32).eps)
    return cos, float(d.max()), float(rel.max())


FACTOR = {factor!r}
FLOOR_UNITS = {floor_units!r}
COMPUTE = {compute!r}
UNIT_ROUNDOFF = {unit!r}
INPUTS = {inputs!r}
SENTINEL = 1e30
#: per result, the error every correct kernel of the call's algorithm family stays within (another
#: summation order, split-K, Winograd, a libm within 2 ulp), computed when this script was written
KERNEL_BOUNDS = {kernel_bounds!r}


def run(device, cast):
    """The call once, its floating inputs cast to ``cast`` (None: as recorded): {{key: tensor}}."""
{body}
    return result


def rms(a):
    """Root mean square of the finite elements below SENTINEL in magnitude (masks are not data)."""
    a = np.asarray(a, dtype=np.float64).ravel()
    a = a[np.isfinite(a) & (np.abs(a) < SENTINEL)]
    return float(np.sqrt(np.mean(a * a))) if a.size else 0.0


def judge(device):
    """Own error and budget of every saved floating result; True when all are within budget."""
    oracle = run(device, torch.float64)
    reference = run(device, DTYPES.get(COMPUTE))
    ins = [np.load(os.path.join(ARGS.package, k + ".npy"), allow_pickle=False) for k in INPUTS]
    s_in = min([r for r in (rms(a) for a in ins if a.dtype.kind == "f") if r > 0], default=0.0)
    within = True
    for key in EXPECTED:
        saved = np.load(os.path.join(ARGS.package, key + ".npy"), allow_pickle=False)
        if saved.dtype.kind != "f" or key not in oracle or key not in reference:
            continue
        d = saved.astype(np.float64).ravel()
        o = oracle[key].detach().to("cpu", torch.float64).numpy().ravel()
        r = reference[key].detach().to("cpu", torch.float64).numpy().ravel()
        if d.shape != o.shape or d.shape != r.shape:
            print(f"  {{key}}: its shape differs from the replay's")
            within = False
            continue
        ok = np.isfinite(d) & np.isfinite(o) & np.isfinite(r)
        own, ref = float(np.linalg.norm(d[ok] - o[ok])), float(np.linalg.norm(r[ok] - o[ok]))
        scale, n = float(np.linalg.norm(o[ok])), int(ok.sum())
        budget = max(FACTOR * ref, FLOOR_UNITS * UNIT_ROUNDOFF * max(scale, s_in * np.sqrt(max(n, 1))),
                     KERNEL_BOUNDS.get(key, 0.0))
        over = own > budget
        within = within and not over
        rel = (lambda x: x / scale if scale > 0 else x)
        print(f"  {{key}}: own error {{rel(own):.3g}}, budget {{rel(budget):.3g}} ({{COMPUTE}}): "
              f"{{'ROOT CAUSE (over budget)' if over else 'within budget'}}")
    return within


def main():
    device = torch.device(ARGS.device)
    cast = DTYPES["torch." + ARGS.dtype.replace("torch.", "")] if ARGS.dtype else None
    result = run(device, cast)
    print(f"{{'tensor':<22}} {{'cosine':>12}} {{'max abs err':>12}} {{'max rel err':>12}}")
    for key, dtype in EXPECTED.items():
        expected = np.load(os.path.join(ARGS.package, key + ".npy"), allow_pickle=False)
        if key not in result:
            print(f"{{key:<22}} not produced by the replay")
            continue
        cos, mae, mre = metrics(expected, result[key])
        print(f"{{key:<22}} {{cos:>12.6g}} {{mae:>12.6g}} {{mre:>12.6g}}")
    print("verdict (own error against its budget, as compare judges):")
    print("  within budget" if judge(device) else "  ROOT CAUSE: over budget")


EXPECTED = {expected!r}

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", nargs="?", default=PACKAGE_DIR)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, help="cast floating inputs, e.g. float64")
    ARGS = parser.parse_args()
    main()
'''


def _var(key: str) -> str:
    return key.replace(".", "_")


def _tag_name(kind: str, v: Any) -> str:
    """The table's own ``torch.<name>`` for a dtype/layout/memory_format tag (checked by the judge)."""
    of = {"dtype": allowlist.dtype_of, "layout": allowlist.layout_of, "memory_format": allowlist.memory_format_of}[kind]
    name = v if isinstance(v, str) and v.startswith("torch.") else f"torch.{v}"
    if of(name) is None or name not in allowlist.tag_names(kind):
        raise ReplayError(f"{kind} {str(v)[:60]!r} is not in the judge's table")
    return name


def render_value(value: Any, names: Dict[str, str], family: Optional[str] = None,
                 position: Optional[int] = None, keyword: Optional[str] = None) -> str:
    """Python source for one encoded argument (tensor refs become their variable names).

    ``family``/``position``/``keyword`` locate a top-level argument for the string rules; a value
    the judge has not accepted (``check_call``) raises ReplayError."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if type(value) is int:
        return repr(value)
    if type(value) is float:
        return repr(value) if math.isfinite(value) else f"float({str(value)!r})"  # inf, -inf, nan
    if isinstance(value, str):
        rule = allowlist.string_rule(family, position, keyword) if family else None
        if rule is None or not rule.allows(value):
            raise ReplayError(f"string argument {value[:60]!r} is not allowed here")
        return "device" if rule.device else repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(render_value(v, names) for v in value) + "]"
    if not isinstance(value, dict) or len(value) != 1:
        raise ReplayError(f"cannot write encoded value {str(value)[:80]!r} as code")
    (tag, v), = value.items()
    if tag == "t":
        if v not in names:
            raise ReplayError(f"call refers to unknown tensor {str(v)[:40]!r}")
        return names[v]
    if tag == "tuple" and isinstance(v, list):
        inner = [render_value(x, names) for x in v]
        return "(" + ", ".join(inner) + ("," if len(inner) == 1 else "") + ")"
    if tag == "float" and v in ("nan", "inf", "-inf"):
        return f"float({v!r})"
    if tag in ("dtype", "memory_format", "layout"):
        return _tag_name(tag, v)
    if tag == "size" and isinstance(v, list) and all(type(x) is int for x in v):
        return f"torch.Size({v!r})"
    if tag == "device":
        return "device"
    if tag == "slice" and isinstance(v, list) and len(v) == 3:
        return "slice(" + ", ".join(render_value(x, names) for x in v) + ")"
    if tag == "ellipsis" and v is True:
        return "..."
    if tag == "repr":
        raise ReplayError(f"argument {str(v)[:200]!r} was saved only as text; the call cannot be written out")
    raise ReplayError(f"cannot write encoded value {str(value)[:80]!r} as code")


def script_text(pkg: pkgmod.Package, script_name: str = "replay.py") -> str:
    """The standalone script for a loaded package."""
    p = pkg.parsed
    root, parts = api_path(p.api_type, p.api_name, pkg.api)  # ReplayRefused unless allowlisted
    try:
        check_call(pkg.call, pkg.api)  # arguments are data, before anything is written
    except ReplayRefused:
        raise
    except ValueError as exc:
        raise ReplayError(str(exc)) from None
    func = ".".join([root] + parts)  # the table's fixed qualified name
    entry = allowlist.entry(p.api_type, p.api_name, pkg.api)
    api = records.api_key(entry.api_type, entry.api_name, int(p.call_index), p.direction)
    family = family_of(pkg.api)
    backward = p.direction == "backward"
    names: Dict[str, str] = {}
    body: List[str] = []
    for key in codec.tensor_refs(pkg.call):
        if not (isinstance(key, str) and re.fullmatch(r"input(\.[0-9]+)+", key)):
            raise ReplayError(f"{api}: tensor key {str(key)[:60]!r} is not of the form input.N")
        info = pkg.tensors[key]
        if not _DTYPE.match(info.dtype) or allowlist.dtype_of(info.dtype.split(".", 1)[1]) is None:
            raise ReplayError(f"{api}: tensor {key!r} has an unexpected dtype {info.dtype!r}")
        var = _var(key)
        if backward and info.requires_grad:
            body.append(f"    {var}_leaf = load({key!r}, {info.dtype!r}, device, cast, requires_grad=True)")
            body.append(f"    {var} = {var}_leaf.clone()")
            names[key] = var
        else:
            body.append(f"    {var} = load({key!r}, {info.dtype!r}, device, cast)")
            names[key] = var
    args = [render_value(v, names, family, position=i) for i, v in enumerate(pkg.call.get("args", []))]
    for k, v in (pkg.call.get("kwargs") or {}).items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) or k.startswith("__") or keyword.iskeyword(k):
            raise ReplayError(f"{api}: keyword {k[:40]!r} is not an identifier")
        args.append(f"{k}={render_value(v, names, family, keyword=k)}")
    call = f"{func}({', '.join(args)})"
    body.append("    set_rng(device)")
    if not backward:
        body.append("    with torch.no_grad(), torch.autocast(device.type, enabled=False):")
        body.append(f"        output = {call}")
        first = pkg.call.get("args", [None])[0] if pkg.call.get("args") else None
        if isinstance(first, dict) and set(first) == {"t"}:
            # an in-place API that returns nothing (__setitem__): its result is what it changed
            body.append(f"    result = flatten(output) or flatten({names[first['t']]})")
        else:
            body.append("    result = flatten(output)")
    else:
        leaves = [k for k in codec.tensor_refs(pkg.call) if pkg.tensors[k].requires_grad]
        if not leaves:
            raise ReplayError(f"{api}: no input requires grad; nothing to differentiate")
        body.append("    with torch.autocast(device.type, enabled=False):")
        body.append(f"        output = {call}")
        body.append("    outs = flatten(output)")
        body.append("    grads = {")
        for gkey in pkg.keys("backward_input"):
            info = pkg.tensors[gkey]
            body.append(f"        {('output' + gkey[len('backward_input'):])!r}: "
                        f"load({gkey!r}, {info.dtype!r}, device, cast),")
        body.append("    }")
        body.append("    pairs = [(outs[k], g.to(outs[k].dtype)) for k, g in grads.items() "
                    "if k in outs and outs[k].requires_grad]")
        body.append(f"    leaves = [{', '.join(_var(k) + '_leaf' for k in leaves)}]")
        body.append("    produced = torch.autograd.grad([o for o, _ in pairs], leaves, [g for _, g in pairs], "
                    "allow_unused=True)")
        body.append("    result = {k: v.detach() for k, v in outs.items()}")
        body.append(f"    for key, g in zip({[ 'backward_output' + k[len('input'):] for k in leaves]!r}, produced):")
        body.append("        if g is not None:")
        body.append("            result[key] = g")
    what = f" ({pkg.meta['reason']})" if isinstance(pkg.meta.get("reason"), str) and \
        re.fullmatch(r"[\w -]+", pkg.meta["reason"]) else ""
    stack = ""
    frames = [f for f in pkg.stack[:5] if isinstance(f, list) and len(f) >= 3]
    if frames:
        stack = "# recorded at (innermost first):\n" + "\n".join(
            "#   " + re.sub(r"[\x00-\x1f\x7f\u2028\u2029\x85\x0c]", " ", " ".join(str(x) for x in f[:3]))[:160]
            for f in frames) + "\n"
    from pytest_ptdbg.judge import budget as B
    from pytest_ptdbg.judge.own_error import compute_dtype

    compute = compute_dtype([pkg.tensors[k].dtype for k in pkg.keys("output")])
    inputs = pkg.keys("input") + (pkg.keys("backward_input") if backward else [])
    return _TEMPLATE.format(
        kernel_bounds=_kernel_bounds(pkg, p.api_name, compute or "torch.float32"),
        factor=B.FACTOR, floor_units=B.FLOOR_UNITS, compute=compute, unit=B.unit_roundoff(compute or "float32"),
        inputs=[k for k in inputs if re.fullmatch(r"(backward_)?input(\.[0-9]+)+", k)],
        api=api, what=what, script_name=re.sub(r"[^\w.-]", "_", script_name),
        dtypes=", ".join(f"{n!r}: {n}" for n in allowlist.dtype_names()), package_dir=pkg.path, stack_comment=stack,
        body="\n".join(body), expected={k: pkg.tensors[k].dtype for k in pkg.expected_keys},
        rng={"device": str(pkg.rng.get("device")), "file": pkgmod.RNG_FILE} if pkg.rng else None,
    )


def _kernel_bounds(pkg: pkgmod.Package, api_name: str, compute: str) -> Dict[str, float]:
    """``{result key: bound}`` of ``judge/algorithms.kernel_bound`` for the package's floating results,
    at the scale of the saved result (the oracle's, within the result's own error)."""
    import numpy as np

    from pytest_ptdbg.judge.algorithms import kernel_bound

    arrays: Dict[str, Any] = {}
    for k in pkg.tensors:
        try:
            arrays[k] = pkg.load_array(k)
        except (OSError, ValueError):
            continue

    def norm(k: str) -> float:
        a = arrays.get(k)
        if a is None or a.dtype.kind != "f":
            return 0.0
        a = a.astype(np.float64).ravel()
        return float(np.linalg.norm(a[np.isfinite(a) & (np.abs(a) < 1e30)]))

    out: Dict[str, float] = {}
    for key in pkg.expected_keys:
        if key in arrays and arrays[key].dtype.kind == "f":
            bound = kernel_bound(api_name, pkg.call, arrays, norm, key, norm(key), compute)
            if bound > 0 and math.isfinite(bound):
                out[key] = float(bound)
    return out


def write_script(package_dir: str, out_path: str) -> str:
    """Write the standalone script of the package in ``package_dir`` to ``out_path``, a path that
    must not exist yet (FileExistsError for a file or a symlink there); returns the path."""
    pkg = pkgmod.load_package(package_dir)
    text = script_text(pkg, os.path.basename(out_path))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:  # a new file only: never through a symlink, never over an existing file
        fd = os.open(out_path, flags, 0o644)
    except FileExistsError:
        kind = "a symbolic link" if os.path.islink(out_path) else "an existing file"
        raise FileExistsError(f"{out_path}: {kind}; the script is written only to a new path") from None
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    return out_path
