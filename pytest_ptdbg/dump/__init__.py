"""Dump: which calls a dump keeps (``select.py``), writing (``stats.py``, ``call_spec.py``,
``writer.py``, ``lock.py``), reading (``reader.py``, ``npy.py``; no torch) and each record's own
consistency (``validate.py``); the on-disk vocabulary is ``format/records.py``."""
