"""Planted-fault cases for ``benchmarks/bench_diagnosis.py``: does the judgement name the culprit?

Modules: ``archs`` (tiny deterministic models and the training step), ``planting`` (the
below-capture and user-code fault modes), ``rewrites`` (user-code changes), ``registry`` (the
faults and clean pairs), ``dumps`` (dumping a step, first divergence of two dumps) and
``runner`` (one case end to end).
"""
