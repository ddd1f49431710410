"""Capture: which PyTorch calls happen (``engine.py``, ``names.py``), what their consumers get
(``sink.py``), and the debugger's own work kept outside the user's modes (``isolation.py``)."""
