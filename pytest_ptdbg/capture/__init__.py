"""Capture: which PyTorch calls happen (``engine.py``, ``names.py``), which are kept (``select.py``), and what their consumers get (``sink.py``)."""
