"""Compare two dumps: pairing, metrics, verdict, the compare table, ``compare``/``compare_distributed``.

The public functions live in :mod:`pytest_ptdbg.api` and are exported as
``pytest_ptdbg.compare`` and ``pytest_ptdbg.compare_distributed``. Nothing heavy is imported here.
"""
