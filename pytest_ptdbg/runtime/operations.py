"""What a call computes, independent of how the code spelled it: one operation per API, and its signature.

:func:`operation` names the operation of a recorded API (``Type``, ``name``): ``F.softmax``,
``torch.softmax`` and ``Tensor.softmax`` are ``softmax``; ``x + y``, ``torch.add``, ``Tensor.add``,
``Tensor.add_`` and ``__iadd__`` are ``add``; ``@`` and ``torch.matmul`` are ``matmul``; the
aliases torch documents (``torch.divide`` is "Alias for torch.div") are their target. The Python
operator protocol gives the dunders (``__add__``, ``__radd__``...); a reflected operator that does
not commute (``2 ** x``: ``__rpow__``) is the operation with its operands swapped. The recorded
name (what ptdbg prints) stays the display name everywhere; the operation is what pairing and
goldens compare.

:func:`signatures` lists an API's parameters from torch itself, never from a hand-written table:
``inspect.signature`` of a Python function (``torch.nn.functional``, ``torch.functional``,
``Tensor``'s Python methods), else the overloads of its aten schema (``self`` named ``input``, as
torch's Python bindings name it). :func:`bind` binds one call's positional and keyword arguments
to the overload they fit, so a call passing ``weight`` by keyword and one passing it by position
name it the same.

:func:`operation` needs no torch (the aliases are a table derived from torch's docstrings by
:func:`derive_aliases`, checked against the installed torch by the tests); :func:`signatures` and
:func:`bind` import torch on first use (schemas are read from it once per process).
"""
from __future__ import annotations

import ast
import inspect
import json
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from pytest_ptdbg.runtime.torch_aliases import ALIASES

__all__ = ["Operation", "Param", "Signature", "Bound", "NO_DEFAULT", "operation", "signatures", "bind",
           "TYPED_FAMILIES", "COMMUTATIVE", "derive_aliases"]

#: API types whose names are their own namespace (never merged with torch's operations)
TYPED_FAMILIES = frozenset({"Distributed", "NPU"})

#: Python's operator protocol: dunder -> (operation, operands swapped). A reflected operator of a
#: commutative operation (``2 + x``: ``__radd__``) computes the same bits with its operands in the
#: recorded order, so it is not swapped.
DUNDERS: Dict[str, Tuple[str, bool]] = {
    "__add__": ("add", False), "__radd__": ("add", False), "__iadd__": ("add", False),
    "__sub__": ("sub", False), "__rsub__": ("rsub", False), "__isub__": ("sub", False),
    "__mul__": ("mul", False), "__rmul__": ("mul", False), "__imul__": ("mul", False),
    "__truediv__": ("div", False), "__div__": ("div", False), "__rtruediv__": ("div", True),
    "__rdiv__": ("div", True), "__itruediv__": ("div", False), "__idiv__": ("div", False),
    "__floordiv__": ("floor_divide", False), "__rfloordiv__": ("floor_divide", True),
    "__ifloordiv__": ("floor_divide", False),
    "__mod__": ("remainder", False), "__rmod__": ("remainder", True), "__imod__": ("remainder", False),
    "__pow__": ("pow", False), "__rpow__": ("pow", True), "__ipow__": ("pow", False),
    "__matmul__": ("matmul", False), "__rmatmul__": ("matmul", True), "__imatmul__": ("matmul", False),
    "__and__": ("bitwise_and", False), "__rand__": ("bitwise_and", False), "__iand__": ("bitwise_and", False),
    "__or__": ("bitwise_or", False), "__ror__": ("bitwise_or", False), "__ior__": ("bitwise_or", False),
    "__xor__": ("bitwise_xor", False), "__rxor__": ("bitwise_xor", False), "__ixor__": ("bitwise_xor", False),
    "__lshift__": ("bitwise_left_shift", False), "__rlshift__": ("bitwise_left_shift", True),
    "__ilshift__": ("bitwise_left_shift", False),
    "__rshift__": ("bitwise_right_shift", False), "__rrshift__": ("bitwise_right_shift", True),
    "__irshift__": ("bitwise_right_shift", False),
    "__eq__": ("eq", False), "__ne__": ("ne", False), "__lt__": ("lt", False), "__le__": ("le", False),
    "__gt__": ("gt", False), "__ge__": ("ge", False),
    "__neg__": ("neg", False), "__pos__": ("positive", False), "__abs__": ("abs", False),
    "__invert__": ("bitwise_not", False),
}

#: operations whose two operands (``input``, ``other``) can be exchanged without changing a bit of
#: the result (IEEE addition and multiplication commute; ``add`` only with ``alpha`` 1)
COMMUTATIVE = frozenset({
    "add", "mul", "maximum", "minimum", "fmax", "fmin", "hypot", "eq", "ne", "logical_and", "logical_or",
    "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor",
})

_ALIAS_DOC = re.compile(r"Alias (?:for|of) :(?:func|meth):`(?:torch\.(?:nn\.functional\.)?)?([A-Za-z_]\w*)`")
_SEE_DOC = re.compile(r"See :func:`torch\.([A-Za-z_]\w*)`")


@dataclass(frozen=True)
class Operation:
    """The operation an API computes: its name, and whether its first two operands are swapped."""

    name: str
    swapped: bool = False


_OPS: Dict[Tuple[str, str], Operation] = {}


def _torch() -> Any:
    import torch  # deferred: a process that never binds a call never imports torch here

    return torch


def derive_aliases() -> Dict[str, str]:
    """``{name: the name it is an alias for}`` from torch's own docstrings (``torch.divide`` -> ``div``).

    :data:`~pytest_ptdbg.runtime.torch_aliases.ALIASES` holds its result for the torch this
    project pins (a test checks that they agree), so that naming an operation needs no torch."""
    torch = _torch()
    out: Dict[str, str] = {}
    for owner in (torch, torch.Tensor):
        for name in dir(owner):
            if name.startswith("__"):
                continue
            try:
                doc = getattr(getattr(owner, name), "__doc__", None)
            except Exception:  # a lazy attribute that fails to load: no alias of it
                continue
            if not isinstance(doc, str):
                continue
            m = _ALIAS_DOC.search(doc)
            if m is not None:
                target = m.group(1)
                # torch.sigmoid says "alias for torch.special.expit": a documentation redirect to a
                # namespace, not a second name of the operation; only top-level names count
                if target != name and "torch.special." not in m.group(0) and "torch.linalg." not in m.group(0):
                    out.setdefault(name, target)
            elif owner is torch.Tensor:
                m = _SEE_DOC.search(doc)
                if m is not None and m.group(1) not in (name, name.rstrip("_")):
                    out.setdefault(name, m.group(1))
    return dict(sorted(out.items()))


def _resolve(name: str) -> str:
    aliases = ALIASES
    seen = {name}
    while name in aliases and aliases[name] not in seen:
        name = aliases[name]
        seen.add(name)
    return name


def _base_of_inplace(name: str) -> str:
    """``add_`` -> ``add``: an in-place API computes its out-of-place operation's values."""
    if name.endswith("_") and not name.endswith("__") and len(name) > 1 and not name.startswith("_"):
        return name[:-1]
    return name


def operation(api_type: str, api_name: str) -> Operation:
    """The :class:`Operation` of a recorded API (``("Tensor", "__radd__")`` -> ``add``)."""
    key = (api_type, api_name)
    hit = _OPS.get(key)
    if hit is not None:
        return hit
    if api_type in TYPED_FAMILIES or not api_name.isidentifier():
        op = Operation(f"{api_type}_{api_name}")
    elif api_name in DUNDERS:
        name, swapped = DUNDERS[api_name]
        op = Operation(_resolve(name), swapped)
    elif api_name.startswith("__") and api_name.endswith("__"):
        op = Operation(api_name)            # __getitem__, __setitem__: their own operations
    else:
        op = Operation(_resolve(_base_of_inplace(_resolve(api_name))))
    if len(_OPS) < 65536:
        _OPS[key] = op
    return op


# ------------------------------------------------------------------------------ signatures

class _NoDefault:
    def __repr__(self) -> str:
        return "(required)"


#: the default of a parameter that has none
NO_DEFAULT: Any = _NoDefault()


@dataclass(frozen=True)
class Param:
    """One parameter: its name, its default (:data:`NO_DEFAULT`), how it is passed, what it holds."""

    name: str
    default: Any = NO_DEFAULT
    keyword_only: bool = False
    variadic: bool = False         #: ``*args`` (or a list parameter that takes the rest, ``view(2, 3)``)
    tensor: Optional[bool] = None  #: holds tensors (True), never (False), unknown (None)
    listed: bool = False           #: a list type (``int[]``, ``Tensor[]``)


Signature = Tuple[Param, ...]
_SIGS: Dict[Tuple[str, str], Tuple[Signature, ...]] = {}


def _plain(v: Any) -> bool:
    return v is None or isinstance(v, (bool, int, float, str)) or (
        isinstance(v, (tuple, list)) and all(_plain(x) for x in v))


def _python_signature(fn: Any) -> Optional[Signature]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):   # a C builtin: its schema says it
        return None
    out: List[Param] = []
    for k, p in enumerate(sig.parameters.values()):
        if p.kind is p.VAR_KEYWORD:
            continue
        name = "input" if k == 0 and p.name in ("self", "tensor") else p.name
        default = NO_DEFAULT if p.default is p.empty else (p.default if _plain(p.default) else None)
        out.append(Param(name, default, keyword_only=p.kind is p.KEYWORD_ONLY,
                         variadic=p.kind is p.VAR_POSITIONAL))
    return tuple(out)


def _schema_type(t: str) -> Tuple[Optional[bool], bool]:
    listed = "[]" in t or "List[" in t
    if "Tensor" in t:
        return True, listed
    return False, listed


def _schema_signatures(name: str) -> Tuple[Signature, ...]:
    torch = _torch()
    try:
        schemas = torch._C._jit_get_schemas_for_operator(f"aten::{name}")
    except Exception:  # no such operator, or a torch without the binding
        return ()
    out: List[Signature] = []
    for s in schemas:
        args = list(s.arguments)
        if not args or (args[0].name != "self" and not any("Tensor" in str(a.type) for a in args)):
            continue   # TorchScript's scalar overloads (add.int(int a, int b))
        if s.overload_name.endswith("out") or any(a.name == "out" or "!" in str(a.alias_info or "")
                                                     for a in args if a.kwarg_only):
            continue   # out= overloads: the same parameters plus the tensor written to
        params: List[Param] = []
        for a in args:
            tensor, listed = _schema_type(str(a.type))
            default = a.default_value if a.has_default_value() else NO_DEFAULT
            if default is not NO_DEFAULT and not _plain(default):
                default = None
            params.append(Param("input" if a.name == "self" else a.name, default, keyword_only=a.kwarg_only,
                                tensor=tensor, listed=listed))
        out.append(tuple(params))
    return tuple(out)


def _callable(api_type: str, api_name: str) -> Any:
    """The function a recorded name names, looked up statically: a name from a dump never runs a
    module's lazy ``__getattr__`` (an import) or a descriptor."""
    if not api_name.isidentifier():
        return None
    torch = sys.modules.get("torch") or _torch()
    owner: Any = {"Functional": torch.nn.functional, "Tensor": torch.Tensor,
                  "VF": torch._C._VariableFunctions, "Aten": None}.get(api_type, torch)
    if owner is None:
        return None
    found = inspect.getattr_static(owner, api_name, None)
    if isinstance(found, (staticmethod, classmethod)):
        found = found.__func__
    return found if callable(found) else None


def _encode_signatures(sigs: Tuple[Signature, ...]) -> list:
    """``signatures()``'s answer as JSON data (defaults as their ``repr``; see :func:`_decode_signatures`)."""
    return [[[p.name, None if p.default is NO_DEFAULT else repr(p.default), int(p.keyword_only), int(p.variadic),
              -1 if p.tensor is None else int(p.tensor), int(p.listed)] for p in sig] for sig in sigs]


def _literal(text: str) -> Any:
    """A default written by :func:`_encode_signatures` (a Python literal; ``inf``/``nan`` as floats)."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        if text in ("inf", "-inf", "nan"):
            return float(text)
        raise


def _decode_signatures(data: list) -> Tuple[Signature, ...]:
    return tuple(tuple(Param(name, NO_DEFAULT if default is None else _literal(default), keyword_only=bool(kw),
                             variadic=bool(var), tensor=None if tensor < 0 else bool(tensor), listed=bool(listed))
                       for name, default, kw, var, tensor, listed in sig) for sig in data)


_STATIC: Optional[Dict[str, list]] = None


def _installed_torch() -> str:
    """The installed torch's version without importing it (``2.13.0``, local build tags left out)."""
    try:
        from importlib.metadata import version

        return version("torch").split("+")[0]
    except Exception:  # noqa: BLE001 - no metadata: the table is not used
        return ""


def _static_signatures(api_type: str, api_name: str) -> Optional[Tuple[Signature, ...]]:
    """The answer of ``runtime/torch_signatures.py`` (derived from the same torch version as the one
    installed, checked by the tests), so binding a recorded call needs no torch import; None when
    the table has no entry or was made for another torch."""
    global _STATIC
    if _STATIC is None:
        _STATIC = {}
        try:
            from pytest_ptdbg.runtime import torch_signatures as T

            if T.TORCH_VERSION == _installed_torch():
                _STATIC = json.loads(T.SIGNATURES_JSON)
        except Exception:  # noqa: BLE001 - a missing or broken table: torch answers
            _STATIC = {}
    data = _STATIC.get(f"{api_type}.{api_name}")
    return None if data is None else _decode_signatures(data)


def signatures(api_type: str, api_name: str) -> Tuple[Signature, ...]:
    """The parameter lists a call of this API can bind to (overloads in torch's order); () when unknown.

    A dunder binds to its operation's signature (``__add__`` as ``add(input, other, *, alpha=1)``);
    an in-place API to its own schema, else to its operation's. Answered from a table derived from
    the installed torch version where it has the API (no torch import), else from torch."""
    key = (api_type, api_name)
    hit = _SIGS.get(key)
    if hit is not None:
        return hit
    static = _static_signatures(api_type, api_name)
    if static is not None:
        if len(_SIGS) < 65536:
            _SIGS[key] = static
        return static
    return _torch_signatures(api_type, api_name)


def _torch_signatures(api_type: str, api_name: str) -> Tuple[Signature, ...]:
    """:func:`signatures` read from torch itself (imported here)."""
    key = (api_type, api_name)
    found: Tuple[Signature, ...] = ()
    if api_type not in TYPED_FAMILIES:
        if api_name in DUNDERS:
            found = _schema_signatures(DUNDERS[api_name][0])
        else:
            fn = _callable(api_type, api_name)
            py = _python_signature(fn) if fn is not None and api_type != "Aten" else None
            if py is not None and not any(p.variadic and p.name == "args" for p in py):
                found = (py,)
            else:
                found = _schema_signatures(api_name) or _schema_signatures(operation(api_type, api_name).name)
    if len(_SIGS) < 65536:
        _SIGS[key] = found
    return found


# ------------------------------------------------------------------------------ binding

@dataclass
class Bound:
    """A call's arguments by parameter: ``values[name]`` and where each came from.

    ``source[name]`` is the argument's position in the recorded call (``0``, ``1`` ... for
    positional arguments, the keyword for a keyword argument); ``given`` holds the parameters the call
    passed (the others have the signature's default). ``packed`` names a list parameter that took
    the remaining positional arguments (``x.view(2, 3)``: ``size``)."""

    values: Dict[str, Any]
    source: Dict[str, Any]
    given: List[str]
    packed: str = ""


def _fits(sig: Signature, args: Sequence[Any], kwargs: Mapping[str, Any],
          is_tensor: Callable[[Any], Optional[bool]]) -> Optional[Bound]:
    positional = [p for p in sig if not p.keyword_only and not p.variadic]
    var = next((p for p in sig if p.variadic), None)
    names = {p.name for p in sig}
    values: Dict[str, Any] = {}
    source: Dict[str, Any] = {}
    packed = ""
    n = len(args)
    if n > len(positional) and var is None:
        last = positional[-1] if positional else None
        # x.view(2, 3), x.permute(0, 2, 1): the last list parameter takes the rest
        if last is None or not last.listed or last.tensor:
            return None
        n_fixed = len(positional) - 1
        for i, (p, a) in enumerate(zip(positional[:n_fixed], args[:n_fixed])):
            values[p.name], source[p.name] = a, i
        values[last.name], source[last.name] = tuple(args[n_fixed:]), n_fixed
        packed = last.name
    else:
        for i, a in enumerate(args):
            if i < len(positional):
                p = positional[i]
                values[p.name], source[p.name] = a, i
            else:
                assert var is not None
                values.setdefault(var.name, ())
                values[var.name] = values[var.name] + (a,)
                source.setdefault(var.name, i)
                packed = var.name
    for k, v in kwargs.items():
        if k not in names or k in values:
            return None
        values[k], source[k] = v, k
    given = list(values)
    for p in sig:
        if p.name in values:
            continue
        if p.variadic:
            continue
        if p.default is NO_DEFAULT:
            return None
        values[p.name] = p.default
    # a tensor where the overload takes none (or a number where it takes a tensor) is another overload
    for p in sig:
        if p.tensor is None or p.name not in given or p.name == packed:
            continue
        kind = is_tensor(values[p.name])
        if kind is not None and values[p.name] is not None and kind != p.tensor:
            return None
    return Bound(values, source, given, packed)


def bind(api_type: str, api_name: str, args: Sequence[Any], kwargs: Mapping[str, Any],
         is_tensor: Callable[[Any], Optional[bool]] = lambda v: None) -> Optional[Bound]:
    """Bind one call's arguments to the first overload of its API they fit; None when none fits.

    ``is_tensor(value)`` says whether an argument value is a tensor (None: unknown), to choose among
    overloads that differ only in it (``max(input, other)`` vs ``max(input, dim)``). A reflected
    operator that does not commute binds its operands swapped (``2 ** x``: ``pow(input=2, exponent=x)``)."""
    swapped = operation(api_type, api_name).swapped and len(args) >= 2
    if swapped:
        args = (args[1], args[0]) + tuple(args[2:])
    for sig in signatures(api_type, api_name):
        b = _fits(sig, args, kwargs, is_tensor)
        if b is not None:
            if swapped:   # where each argument was in the recorded call
                b.source = {k: (1 - v if v in (0, 1) and not isinstance(v, bool) else v) if isinstance(v, int) else v
                            for k, v in b.source.items()}
            return b
    return None


def derive_signatures(keys: Sequence[Tuple[str, str]]) -> Dict[str, list]:
    """``{"Type.name": encoded signatures}`` of the APIs ``keys`` (``(Type, name)``), read from the
    installed torch (the content of ``runtime/torch_signatures.py`` for every API capture can record:
    ``python -m pytest_ptdbg.capture.signature_table``)."""
    return {f"{t}.{n}": _encode_signatures(_torch_signatures(t, n)) for t, n in sorted(set(keys))}


def signature_table_text(keys: Sequence[Tuple[str, str]]) -> str:
    """The text of ``runtime/torch_signatures.py`` for the APIs ``keys`` and the installed torch."""
    data = json.dumps(derive_signatures(keys), separators=(",", ":"), sort_keys=True)
    return ('"""The parameters of every API capture can record, as torch %s gives them (generated by\n'
            '``python -m pytest_ptdbg.capture.signature_table``; the tests check it against the\n'
            'installed torch). Read by ``operations.signatures`` when that torch is installed, so that\n'
            'binding a recorded call imports no torch."""\n# ruff: noqa: E501\n\n'
            "TORCH_VERSION = %r\nSIGNATURES_JSON = %r\n") % (_installed_torch(), _installed_torch(), data)


if __name__ == "__main__":   # regenerate runtime/torch_aliases.py's table from the installed torch
    print("ALIASES: Dict[str, str] = {")
    for _k, _v in derive_aliases().items():
        print(f"    {_k!r}: {_v!r},")
    print("}")
