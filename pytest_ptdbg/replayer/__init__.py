"""The replay engine: what a replay may run, and how one recorded call is run again.

Dumps and reproduction packages travel between people; they are data and never choose what code
runs. Every replay path (compare's judgement, ``ptdbg replay PACKAGE``, ``ptdbg replay
--script``) resolves the API through the hand-written table of :mod:`.allowlist` and rebuilds its
arguments with :mod:`.arguments`, which accepts only data (tensors from the dump, numbers, sizes,
slices, dtypes from a fixed table, strings that a rule per API and parameter allows). Anything
else raises :class:`~pytest_ptdbg.errors.ReplayRefused` before any call.

Modules: ``allowlist`` (the table), ``arguments`` (data-only decoding), ``codec`` (the call spec's
encoder and decoder, tensors keyed as capture keys them), ``allocation`` (what a replayed call may
allocate), ``modes`` (the math modes a recorded call ran under), ``engine``
(:func:`~.engine.replay_call`: one recorded call run again).

Importing this package does not import torch.
"""
