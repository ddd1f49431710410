"""Capture sinks besides the dump writer: the overflow checker and the ``mode="acl"`` packager."""
