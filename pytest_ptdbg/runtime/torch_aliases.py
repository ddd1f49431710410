"""The aliases torch documents, ``{name: the name it is an alias for}``. No torch.

Derived from torch's own docstrings (``torch.divide``: "Alias for :func:`torch.div`"; a Tensor
method's "See :func:`torch.multiply`") by :func:`pytest_ptdbg.runtime.operations.derive_aliases`
for the torch this project pins; ``tests/runtime/test_operations.py`` checks that the installed
torch still says the same. Regenerate with ``python -m pytest_ptdbg.runtime.operations``.
"""
from typing import Dict

ALIASES: Dict[str, str] = {
    'absolute': 'abs',
    'absolute_': 'abs_',
    'arccos': 'acos',
    'arccosh': 'acosh',
    'arcsin': 'asin',
    'arcsinh': 'asinh',
    'arctan': 'atan',
    'arctan2': 'atan2',
    'arctanh': 'atanh',
    'clip': 'clamp',
    'concat': 'cat',
    'concatenate': 'cat',
    'divide': 'div',
    'fix': 'trunc',
    'ger': 'outer',
    'greater': 'gt',
    'greater_equal': 'ge',
    'less': 'lt',
    'less_equal': 'le',
    'moveaxis': 'movedim',
    'multiply': 'mul',
    'negative': 'neg',
    'not_equal': 'ne',
    'row_stack': 'vstack',
    'subtract': 'sub',
    'swapaxes': 'transpose',
    'swapdims': 'transpose',
    'trapz': 'trapezoid',
    'true_divide': 'div',
}
