"""Shared fixtures of the test suite, and ``tests/`` on ``sys.path``.

Test files sit in one folder per stage (``tests/format``, ``tests/dump``, ``tests/bad_input``...);
the helper modules here (``dumps``: hand-written ptdbg v4 dumps; ``real_dumps``: dumps of real
example-model steps; ``synthetic``: compare tables for advisor tests; ``locations``) are imported by
name from any of them.
"""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
