"""pytest plugin entry point (``pytest11: ptdbg``). Filled in by the plugin issue."""
