"""The advisor: which API is the root cause of the differences in a compare table (no torch)."""
