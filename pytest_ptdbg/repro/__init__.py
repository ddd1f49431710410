"""The single-API reproduction tool: one call saved as a package, run again on its own.

Modules: ``package`` (the package format: write, load), ``runner`` (:func:`replay`: run a
package's call and compare with its saved result), ``script`` (a standalone reproduction script),
``checks`` (the compare stage's metrics for a replayed tensor). Written by the capture sinks
(``mode="acl"``, ``hook_name="overflow_check"``), run by ``ptdbg replay``.

Importing this package does not import torch.
"""
