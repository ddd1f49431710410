"""Dump: the on-disk vocabulary (``records.py``), writing (``stats.py``, ``writer.py``) and reading (``reader.py``, ``npy.py``; no torch)."""
